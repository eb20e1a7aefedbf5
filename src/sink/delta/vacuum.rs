//! VACUUM of a Delta table: the data files its log removed (a compaction's, a MERGE's) longer
//! ago than a retention are deleted from the store, by deltalake's own VACUUM
//! (`deltalake_core::operations::vacuum`, no deleter of subsink's). What is still in the table,
//! and what was removed within the retention (readers of older versions, a scan in progress and
//! a compaction planned on an older version may still read it), is kept.
//!
//! * **Retention**: by default the table's `delta.deletedFileRetentionDuration` (7 days unless
//!   the table says otherwise). A shorter one is refused ([`VacuumError::TooShort`]) unless
//!   forced, as deltalake refuses it — checked here first, so the refusal names both durations
//!   in the flags' own form (`1h`, `7d`) rather than deltalake's whole hours.
//! * **Lite** (default) deletes the files the log's `remove` actions name; **full** also deletes
//!   files under the table that no commit names (an upload whose commit never came: a writer
//!   killed between the two, a compaction abandoned), once older than the retention by their
//!   store modification time. Names starting with `_` or `.` are never deleted: the log, the
//!   compaction lease, a change data capture table's `_subsink_tombstones/` — vacuumed after the
//!   table as a table of its own, with the same options, as `subsink compact` compacts it.
//! * **Dry run**: the files that would be deleted, nothing deleted and nothing committed.
//!   Otherwise deltalake records the VACUUM in the log (two commits without data actions: start
//!   and end), which no writer's append conflicts with.

use std::collections::HashSet;
use std::time::Duration;

use deltalake_core::operations::vacuum::VacuumMode;
use deltalake_core::table::config::TablePropertiesExt;
use deltalake_core::DeltaTableError;

use super::table::log_store;
use super::table::DeltaTable;
use crate::upload::Destination;

/// What a VACUUM does.
#[derive(Debug, Clone, Default)]
pub struct VacuumOptions {
    /// Delete files removed longer ago than this; `None`: the table's retention.
    pub retention: Option<Duration>,
    /// Allow a retention shorter than the table's.
    pub force: bool,
    /// List what would be deleted; delete nothing.
    pub dry_run: bool,
    /// Also delete files no commit names ([`VacuumMode::Full`]).
    pub full: bool,
}

/// What a VACUUM did, as `subsink vacuum` prints it (one JSON object).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct VacuumReport {
    pub table: String,
    /// The table's version the VACUUM planned on.
    pub version: i64,
    /// `lite` or `full`.
    pub mode: String,
    pub dry_run: bool,
    /// The retention applied, and the table's own, in seconds.
    pub retention_seconds: u64,
    pub table_retention_seconds: u64,
    /// How many files were deleted (with `dry_run`: would be).
    pub file_count: usize,
    /// Those files, relative to the table root, in name order.
    pub files: Vec<String>,
    /// A change data capture table's tombstone table, vacuumed after the table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tombstones: Option<Box<VacuumReport>>,
}

/// Why a VACUUM did not happen.
#[derive(Debug, thiserror::Error)]
pub enum VacuumError {
    #[error("{url}: no Delta table there (no _delta_log/)")]
    NotATable { url: String },
    /// A retention shorter than the table's, not forced (exit 2 for the command).
    #[error("--retention {given} is shorter than the table's delta.deletedFileRetentionDuration ({table}{how}): readers of versions up to {table} old (time travel, a scan in progress) and a compaction planned on one may still need the files it would delete; give --retention {table} or more, or add --force when nothing uses the older versions")]
    TooShort {
        given: String,
        table: String,
        /// `, the default` when the table does not set it.
        how: String,
    },
    #[error("Delta table at {url}: {source}")]
    Delta {
        url: String,
        #[source]
        source: DeltaTableError,
    },
}

/// VACUUM the Delta table at the root of `dest`, then its tombstone table if it has one.
pub async fn vacuum(dest: &Destination, opts: &VacuumOptions) -> Result<VacuumReport, VacuumError> {
    let mut report = vacuum_one(dest, opts).await?;
    let tomb = super::merge::folder(dest, super::merge::TOMBSTONES);
    if DeltaTable::has_log(&tomb).await {
        report.tombstones = Some(Box::new(vacuum_one(&tomb, opts).await?));
    }
    Ok(report)
}

async fn vacuum_one(dest: &Destination, opts: &VacuumOptions) -> Result<VacuumReport, VacuumError> {
    let url = dest.url.clone();
    let delta = |source| VacuumError::Delta {
        url: url.clone(),
        source,
    };
    if !DeltaTable::has_log(dest).await {
        return Err(VacuumError::NotATable { url });
    }
    let mut table = deltalake_core::DeltaTable::new(log_store(dest));
    table.load().await.map_err(delta)?;
    let snapshot = table.snapshot().map_err(delta)?;
    let own = snapshot.table_config().deleted_file_retention_duration();
    let set = snapshot
        .metadata()
        .configuration()
        .contains_key("delta.deletedFileRetentionDuration");
    let retention = opts.retention.unwrap_or(own);
    if retention < own && !opts.force {
        return Err(VacuumError::TooShort {
            given: show(retention),
            table: show(own),
            how: if set { "" } else { ", the default" }.to_string(),
        });
    }
    let version = table.version().map(|v| v as i64).unwrap_or(-1);
    let chrono_retention = chrono::Duration::from_std(retention)
        .map_err(|e| delta(DeltaTableError::Generic(format!("retention: {e}"))))?;
    let run = |dry_run: bool| {
        table
            .clone()
            .vacuum()
            .with_retention_period(chrono_retention)
            .with_enforce_retention_duration(!opts.force)
            .with_mode(if opts.full {
                VacuumMode::Full
            } else {
                VacuumMode::Lite
            })
            .with_dry_run(dry_run)
    };
    // deltalake lists a removed file again at every VACUUM until its tombstone leaves the log,
    // deleted or not: what is gone already is not reported as deleted.
    let (_, plan) = run(true).await.map_err(delta)?;
    let gone = gone(dest, &plan.files_deleted).await;
    let listed = match opts.dry_run {
        true => plan.files_deleted,
        false => run(false).await.map_err(delta)?.1.files_deleted,
    };
    let mut files: Vec<String> = listed
        .iter()
        .map(|f| relative(dest, f))
        .filter(|f| !gone.contains(f))
        .collect();
    files.sort();
    files.dedup();
    Ok(VacuumReport {
        table: url,
        version,
        mode: if opts.full { "full" } else { "lite" }.to_string(),
        dry_run: opts.dry_run,
        retention_seconds: retention.as_secs(),
        table_retention_seconds: own.as_secs(),
        file_count: files.len(),
        files,
        tombstones: None,
    })
}

/// `name` relative to the table root (deltalake gives some as absolute paths).
fn relative(dest: &Destination, name: &str) -> String {
    let root = url::Url::parse(&dest.url)
        .map(|u| u.path().trim_matches('/').to_string())
        .unwrap_or_default();
    let name = name.trim_start_matches('/');
    match name.strip_prefix(&root) {
        Some(rest) if !root.is_empty() && rest.starts_with('/') => rest[1..].to_string(),
        _ => name.to_string(),
    }
}

/// Which of `names` (files of the table, as deltalake lists them) are not on the store.
async fn gone(dest: &Destination, names: &[String]) -> HashSet<String> {
    use futures::StreamExt;
    use object_store::ObjectStoreExt;
    futures::stream::iter(names.iter().map(|n| relative(dest, n)))
        .map(|name| async move {
            let path = object_store::path::Path::from(name.as_str());
            match dest.store.head(&path).await {
                Err(object_store::Error::NotFound { .. }) => Some(name),
                _ => None,
            }
        })
        .buffer_unordered(16)
        .filter_map(|n| async move { n })
        .collect()
        .await
}

/// A duration in the flags' form: the largest of `d`, `h`, `m`, `s` that divides it (`7d`,
/// `36h`, `90s`).
fn show(d: Duration) -> String {
    let s = d.as_secs();
    for (unit, n) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if s > 0 && s.is_multiple_of(n) && d.subsec_nanos() == 0 {
            return format!("{}{unit}", s / n);
        }
    }
    match d.subsec_nanos() {
        0 => format!("{s}s"),
        _ => format!("{:?}", d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_flags_are_written() {
        assert_eq!(show(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(show(Duration::from_secs(36 * 3_600)), "36h");
        assert_eq!(show(Duration::from_secs(90)), "90s");
        assert_eq!(show(Duration::from_secs(120)), "2m");
        assert_eq!(show(Duration::ZERO), "0s");
        assert_eq!(show(Duration::from_millis(1500)), "1.5s");
    }
}
