//! Compaction of a Delta table while writers append to it: the small files of the table's older
//! versions are bin-packed into files of a target size by deltalake's own OPTIMIZE
//! (`deltalake_core::operations::optimize`, no rewriter of subsink's), in one commit of `remove`
//! actions (`dataChange: false`) for the small files and `add` actions for the packed ones.
//!
//! * **What is compacted.** The snapshot `quiet_versions` commits before the newest
//!   ([`CompactOptions::quiet_versions`]; `0`: the newest): files added by the last commits are left
//!   alone, so the files writers are still adding to a time range are not rewritten again and again.
//!   OPTIMIZE filters only by partition values, so "the last commits" is how an unpartitioned
//!   table's time ranges still being written are told apart from the older ones. In a partitioned
//!   table, a partition that received a file in those commits is left out as a whole (it is still
//!   being written); every other partition with at least [`CompactOptions::min_files`] small files
//!   is compacted, one OPTIMIZE per partition (partition filters `col = value`), or one for the
//!   whole table when every partition qualifies.
//! * **Concurrent appends.** OPTIMIZE commits with the conflict checker of deltalake: a commit that
//!   only adds files never conflicts with one that removes other files, so a compaction and any
//!   number of appending workers go on together, and a compaction that lost its log version is
//!   tried on the next one.
//! * **Concurrent removals.** deltalake 1.1's checker does not count a `remove` with
//!   `dataChange: false` — another compaction's — as a conflict, so two compactions of the same
//!   files would both commit and every row of those files would be in the table twice. subsink's
//!   compactions of one table therefore take turns: each holds the lease object
//!   `_subsink_compaction.lease` at the table root (put-if-absent; it names its owner and an expiry
//!   [`CompactOptions::lease`] ahead; a compaction is abandoned before its lease expires, and an
//!   expired lease is taken over). Compactions by other tools (Spark, the `deltalake` package) do
//!   not know the lease: do not run them on a table subsink compacts. The snapshot planned on
//!   must also hold no file another commit removed since: while one of the last commits removed
//!   files, the compaction waits ([`quiet_base`]).
//! * **Old files** are only removed from the log: they stay on the store for readers of older
//!   versions until a VACUUM deletes them after the table's `delta.deletedFileRetentionDuration`
//!   (7 days unless the table says otherwise): `subsink vacuum` ([`super::vacuum`]); a
//!   compaction never deletes a file itself.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::num::NonZeroU64;
use std::time::Duration;

use bytes::Bytes;
use deltalake_core::kernel::transaction::TransactionError;
use deltalake_core::logstore::LogStoreRef;
use deltalake_core::operations::optimize::Metrics;
use deltalake_core::{DeltaTableError, FilterLiteral, FilterOp, FilterValue};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::table::log_store;
use crate::upload::Destination;

/// The lease object of compactions, at the table root (readers and VACUUM skip `_` names).
pub const LEASE_NAME: &str = "_subsink_compaction.lease";

/// deltalake's target file size when the table sets no `delta.targetFileSize`: 100 MiB.
pub const DEFAULT_TARGET_SIZE: u64 = 100 * 1024 * 1024;

/// What a compaction does.
#[derive(Debug, Clone)]
pub struct CompactOptions {
    /// Size of the packed files, and the size under which a file counts as small (OPTIMIZE
    /// leaves larger ones alone). `None`: the table's `delta.targetFileSize`, else
    /// [`DEFAULT_TARGET_SIZE`].
    pub target_size: Option<NonZeroU64>,
    /// A partition (an unpartitioned table: the table) is compacted only when it holds at least
    /// this many small files. At least 2: one file cannot be packed with anything.
    pub min_files: usize,
    /// Nothing is done unless the partitions to compact hold at least this many small files in
    /// all (the background task's trigger, `--compact-after`; `0`: no such floor).
    pub min_total: usize,
    /// Only these partitions (`column = value`, every pair must hold); empty: all.
    pub partitions: Vec<(String, String)>,
    /// Leave the files of the last this many commits alone (see the module docs); `0`: compact
    /// the newest version.
    pub quiet_versions: u64,
    /// How long the lease is held at most; the compaction is abandoned (nothing committed) when it
    /// would take longer.
    pub lease: Duration,
    /// Files rewritten at once (OPTIMIZE's concurrent tasks); `0`: one per core.
    pub tasks: usize,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            target_size: None,
            min_files: 2,
            min_total: 0,
            partitions: Vec::new(),
            quiet_versions: 0,
            lease: Duration::from_secs(3600),
            tasks: 0,
        }
    }
}

/// What a compaction did, as `subsink compact` prints it (one JSON object).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CompactReport {
    pub table: String,
    /// The newest version when the compaction started.
    pub latest_version: i64,
    /// The version planned on (files added after it were left alone).
    pub read_version: i64,
    /// The version of the compaction's last commit; `None`: nothing committed.
    pub version: Option<i64>,
    /// Commits made (one per partition compacted alone).
    pub commits: u64,
    /// The table's data files and their bytes at `latest_version`.
    pub files_before: u64,
    pub bytes_before: u64,
    pub files_removed: u64,
    pub bytes_removed: u64,
    pub files_added: u64,
    pub bytes_added: u64,
    /// The partitions compacted (`col=value/…`; an unpartitioned table: `""`).
    pub partitions: Vec<String>,
    /// Why nothing was committed, when nothing was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// A change data capture table's tombstone table (`_subsink_tombstones/`, a Delta table of
    /// its own: [`crate::sink::delta::merge`]), compacted after the table, at its newest version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tombstones: Option<Box<CompactReport>>,
}

/// Why a compaction did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error("{url}: no Delta table there (no _delta_log/)")]
    NotATable { url: String },
    /// A bad option (exit 2 for the command).
    #[error("{0}")]
    Usage(String),
    /// Another compaction holds the lease.
    #[error("Delta table at {url}: another compaction is running (lease {LEASE_NAME} held until {until}); try again later")]
    Busy { url: String, until: String },
    #[error("Delta table at {url}: the compaction would take longer than its lease ({lease:?}); nothing was committed")]
    LeaseExpired { url: String, lease: Duration },
    #[error("Delta table at {url}: stopped; nothing more was committed")]
    Stopped { url: String },
    #[error("Delta table at {url}: {source}")]
    Delta {
        url: String,
        #[source]
        source: DeltaTableError,
    },
    #[error("Delta table at {url}: lease {LEASE_NAME}: {source}")]
    Lease {
        url: String,
        #[source]
        source: object_store::Error,
    },
}

impl CompactError {
    /// Another writer's commit conflicted with the compaction's (or won every version it tried):
    /// nothing was committed, and a later try plans on the newer table.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            CompactError::Delta {
                source: DeltaTableError::Transaction {
                    source: TransactionError::CommitConflict(_)
                        | TransactionError::MaxCommitAttempts(_)
                },
                ..
            }
        )
    }
}

/// Compact the Delta table at the root of `dest` (see the module docs).
pub async fn compact(
    dest: &Destination,
    opts: &CompactOptions,
) -> Result<CompactReport, CompactError> {
    compact_until(dest, opts, std::future::pending()).await
}

/// [`compact`], abandoned when `stop` resolves (the lease is given back; a commit already made
/// stays). A change data capture table's tombstone table is compacted after the table (its own
/// lease, its newest version: the writer's MERGEs into it conflict with a compaction that read
/// what they rewrote, and the loser runs again), also when the table's compaction failed. A
/// failed compaction of the tombstone table does not fail the table's: the report says why
/// (`tombstones.skipped`), and the next compaction tries again.
pub async fn compact_until(
    dest: &Destination,
    opts: &CompactOptions,
    stop: impl Future<Output = ()> + Send,
) -> Result<CompactReport, CompactError> {
    use futures::FutureExt;
    let stop = stop.boxed().shared();
    let table = compact_one(dest, opts, stop.clone()).await;
    let tomb = super::merge::folder(dest, super::merge::TOMBSTONES);
    let tombstones = if has_log(&tomb).await && !matches!(table, Err(CompactError::Stopped { .. }))
    {
        let o = CompactOptions {
            quiet_versions: 0,
            partitions: Vec::new(),
            ..opts.clone()
        };
        Some(compact_one(&tomb, &o, stop).await)
    } else {
        None
    };
    match (table, tombstones) {
        (Ok(mut r), Some(t)) => {
            // The table's compaction stands; the tombstone table's is tried again next time.
            r.tombstones = Some(Box::new(t.unwrap_or_else(|e| CompactReport {
                table: tomb.url.clone(),
                skipped: Some(format!("failed: {e}")),
                ..CompactReport::default()
            })));
            Ok(r)
        }
        (Ok(r), None) => Ok(r),
        (Err(e), t) => {
            if let Some(Err(te)) = t {
                tracing::warn!(table = %dest.url, "compacting the tombstone table failed too: {te}");
            }
            Err(e)
        }
    }
}

/// [`compact_until`] of one Delta table.
async fn compact_one(
    dest: &Destination,
    opts: &CompactOptions,
    stop: impl Future<Output = ()>,
) -> Result<CompactReport, CompactError> {
    let url = dest.url.clone();
    if opts.min_files < 2 {
        return Err(CompactError::Usage(format!(
            "--min-files {}: at least 2 (one small file cannot be packed with anything)",
            opts.min_files
        )));
    }
    let store = log_store(dest);
    if !has_log(dest).await {
        return Err(CompactError::NotATable { url });
    }
    // Planned under the lease: a plan made before another compaction committed would hold the
    // files that compaction removed.
    let lease = Lease::take(dest, opts.lease).await?;
    let work = async {
        let plan = plan(dest, &store, opts).await?;
        run(plan, opts).await
    };
    let work = tokio::time::timeout(opts.lease.saturating_sub(opts.lease / 10), work);
    let result = tokio::select! {
        r = work => r.unwrap_or_else(|_| Err(CompactError::LeaseExpired { url: url.clone(), lease: opts.lease })),
        () = stop => Err(CompactError::Stopped { url: url.clone() }),
    };
    // Given back whatever happened (within 2 s: a shutdown waits 3 s for the background task); a
    // lease left behind (a crash, a store down) expires on its own.
    match tokio::time::timeout(Duration::from_secs(2), lease.give_back(dest)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(table = %url, "compaction lease not given back ({e}): it expires in {:?}", opts.lease)
        }
        Err(_) => {
            tracing::warn!(table = %url, "compaction lease not given back in 2 s: it expires in {:?}", opts.lease)
        }
    }
    result
}

/// A partition's values, by column (`None`: null), in the table's partition column order.
type PartitionValues = Vec<(String, Option<String>)>;

/// One data file of a snapshot: path, size, partition values (`None`: null).
struct FileEntry {
    path: String,
    size: u64,
    partition: PartitionValues,
}

fn files_of(
    table: &deltalake_core::DeltaTable,
    columns: &[String],
) -> Result<Vec<FileEntry>, DeltaTableError> {
    let snapshot = table.snapshot()?;
    Ok(snapshot
        .log_data()
        .into_iter()
        .map(|f| {
            let values = f.partition_values_map();
            FileEntry {
                path: f.object_store_path().to_string(),
                size: f.size().max(0) as u64,
                partition: columns
                    .iter()
                    .map(|c| (c.clone(), values.get(c).cloned().flatten()))
                    .collect(),
            }
        })
        .collect())
}

/// A partition's name as Hive writes it (`day=2024-01-01/kind=a`; `""` unpartitioned).
fn partition_name(p: &[(String, Option<String>)]) -> String {
    p.iter()
        .map(|(c, v)| {
            format!(
                "{c}={}",
                v.as_deref().unwrap_or("__HIVE_DEFAULT_PARTITION__")
            )
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// What to compact, decided under the lease.
struct Plan {
    report: CompactReport,
    /// The table at the version planned on.
    base: Option<deltalake_core::DeltaTable>,
    target: NonZeroU64,
    /// The partitions to compact (their values), or `None`: the whole table in one OPTIMIZE.
    partitions: Option<Vec<PartitionValues>>,
}

async fn plan(
    dest: &Destination,
    store: &LogStoreRef,
    opts: &CompactOptions,
) -> Result<Plan, CompactError> {
    let url = dest.url.clone();
    let delta = |source| CompactError::Delta {
        url: url.clone(),
        source,
    };
    let mut latest = deltalake_core::DeltaTable::new(store.clone());
    latest.load().await.map_err(delta)?;
    let latest_version = latest.version().map(|v| v as i64).unwrap_or(-1);
    let snapshot = latest.snapshot().map_err(delta)?;
    let columns: Vec<String> = snapshot.metadata().partition_columns().to_vec();
    check_partition_filters(opts, &columns, &url)?;
    let target = match opts.target_size {
        Some(t) => t,
        None => snapshot
            .metadata()
            .configuration()
            .get("delta.targetFileSize")
            .and_then(|v| v.parse::<u64>().ok())
            .and_then(NonZeroU64::new)
            .unwrap_or(NonZeroU64::new(DEFAULT_TARGET_SIZE).expect("non-zero")),
    };
    let latest_files = files_of(&latest, &columns).map_err(delta)?;
    let mut report = CompactReport {
        table: url.clone(),
        latest_version,
        read_version: latest_version,
        files_before: latest_files.len() as u64,
        bytes_before: latest_files.iter().map(|f| f.size).sum(),
        ..CompactReport::default()
    };
    let skip = |mut report: CompactReport, why: String| {
        report.skipped = Some(why);
        Ok(Plan {
            report,
            base: None,
            target,
            partitions: None,
        })
    };
    let base_version = quiet_base(store, latest_version, opts.quiet_versions)
        .await
        .map_err(delta)?;
    let base_version = match base_version {
        Quiet::At(v) => v,
        Quiet::TooNew => {
            return skip(
                report,
                format!(
                    "the table has {latest_version} commits, all within the last {} left alone",
                    opts.quiet_versions
                ),
            )
        }
        Quiet::Removed(v) => {
            return skip(
                report,
                format!(
                    "version {v}, within the last {} commits, removed files (a compaction, a MERGE): the older part is planned on once {} more commits have come",
                    opts.quiet_versions,
                    v - (latest_version - opts.quiet_versions as i64)
                ),
            )
        }
    };
    report.read_version = base_version;
    let base = if base_version == latest_version {
        latest
    } else {
        let mut t = deltalake_core::DeltaTable::new(store.clone());
        t.load_version(base_version as u64).await.map_err(delta)?;
        t
    };
    let base_files = files_of(&base, &columns).map_err(delta)?;
    let (small, all_partitions) = small_files(
        &base_files,
        &latest_files,
        !columns.is_empty(),
        opts,
        target.get(),
    );
    let total: usize = small.values().map(|(_, n)| n).sum();
    if small.is_empty() || total < opts.min_total.max(1) {
        return skip(
            report,
            format!(
                "{total} small files (under {} bytes) in partitions with at least {} of them, below the {} asked for",
                target,
                opts.min_files,
                opts.min_total.max(opts.min_files)
            ),
        );
    }
    report.partitions = small.keys().cloned().collect();
    // One OPTIMIZE for the whole table when every partition takes part; else one per partition.
    let whole = columns.is_empty() || small.len() == all_partitions;
    let partitions = (!whole).then(|| small.into_values().map(|(p, _)| p).collect());
    Ok(Plan {
        report,
        base: Some(base),
        target,
        partitions,
    })
}

/// `--partition` filters name partition columns of the table (`columns`, at `url`).
fn check_partition_filters(
    opts: &CompactOptions,
    columns: &[String],
    url: &str,
) -> Result<(), CompactError> {
    for (c, _) in &opts.partitions {
        if !columns.contains(c) {
            return Err(CompactError::Usage(format!(
                "--partition {c}=…: {c} is not a partition column of {url} (its partition columns: {})",
                if columns.is_empty() { "none".to_string() } else { columns.join(", ") }
            )));
        }
    }
    Ok(())
}

/// The small files (at most `target` bytes) of the version planned on (`base_files`) to compact,
/// counted per partition (by name, so sorted): only partitions the `--partition` filters want,
/// with no file newer than that version (`latest_files`: still being written), and with at least
/// `--min-files` of them. Also how many partitions the version has.
fn small_files(
    base_files: &[FileEntry],
    latest_files: &[FileEntry],
    partitioned: bool,
    opts: &CompactOptions,
    target: u64,
) -> (BTreeMap<String, (PartitionValues, usize)>, usize) {
    // Partitions that received a file after the version planned on are still being written.
    let in_base: HashSet<&str> = base_files.iter().map(|f| f.path.as_str()).collect();
    let hot: HashSet<String> = if !partitioned {
        HashSet::new()
    } else {
        latest_files
            .iter()
            .filter(|f| !in_base.contains(f.path.as_str()))
            .map(|f| partition_name(&f.partition))
            .collect()
    };
    let wanted = |f: &FileEntry| {
        opts.partitions.iter().all(|(c, v)| {
            f.partition
                .iter()
                .any(|(pc, pv)| pc == c && pv.as_deref() == Some(v.as_str()))
        })
    };
    // Small files per partition (the name sorts them).
    let mut small: BTreeMap<String, (PartitionValues, usize)> = BTreeMap::new();
    let mut all_partitions = HashSet::new();
    for f in base_files {
        let name = partition_name(&f.partition);
        all_partitions.insert(name.clone());
        if !wanted(f) || hot.contains(&name) || f.size > target {
            continue;
        }
        small
            .entry(name)
            .or_insert_with(|| (f.partition.clone(), 0))
            .1 += 1;
    }
    small.retain(|_, (_, n)| *n >= opts.min_files);
    small.retain(|_, (_, n)| *n >= opts.min_files);
    (small, all_partitions.len())
}

/// The version to plan on: `quiet` commits before `latest`. A snapshot must not hold a file
/// that a later commit removed (deltalake would not see the conflict when a compaction removed
/// it), so a commit after it that removed files means: not yet, `Quiet::Removed(version)` — once
/// `quiet` more commits have come, the version planned on is past it. `Quiet::TooNew`: the table
/// has no version old enough.
async fn quiet_base(
    store: &LogStoreRef,
    latest: i64,
    quiet: u64,
) -> Result<Quiet, DeltaTableError> {
    let base = latest - quiet as i64;
    if quiet == 0 {
        return Ok(Quiet::At(latest));
    }
    if base < 1 {
        // Version 0 creates the table; nothing older than the quiet commits to compact.
        return Ok(Quiet::TooNew);
    }
    for v in (base + 1..=latest).rev() {
        if let Some(commit) = store.read_commit_entry(v as u64).await? {
            if removes_files(&commit) {
                return Ok(Quiet::Removed(v));
            }
        }
    }
    Ok(Quiet::At(base))
}

/// What [`quiet_base`] found.
enum Quiet {
    At(i64),
    TooNew,
    Removed(i64),
}

/// Does this commit (newline-delimited actions) hold a `remove` action?
fn removes_files(commit: &Bytes) -> bool {
    commit.split(|b| *b == b'\n').any(|line| {
        serde_json::from_slice::<serde_json::Value>(line)
            .map(|a| a.get("remove").is_some())
            .unwrap_or(false)
    })
}

async fn run(plan: Plan, opts: &CompactOptions) -> Result<CompactReport, CompactError> {
    let mut report = plan.report;
    let base = match plan.base {
        Some(base) if report.skipped.is_none() => base,
        _ => return Ok(report),
    };
    let url = report.table.clone();
    let delta = |source| CompactError::Delta {
        url: url.clone(),
        source,
    };
    let groups: Vec<PartitionValues> = match plan.partitions {
        None => vec![Vec::new()],
        Some(p) => p,
    };
    for group in &groups {
        let filters: Vec<FilterLiteral<'_>> = group
            .iter()
            .map(|(c, v)| {
                (
                    c.as_str(),
                    FilterOp::Eq,
                    // An empty value is the null partition to deltalake's filters.
                    FilterValue::Scalar(v.as_deref().unwrap_or("")),
                )
            })
            .collect();
        let mut builder = base
            .clone()
            .optimize()
            .with_target_size(plan.target)
            .with_filters(&filters);
        if opts.tasks > 0 {
            builder = builder.with_max_concurrent_tasks(opts.tasks);
        }
        let (table, metrics): (_, Metrics) = builder.await.map_err(delta)?;
        if metrics.num_files_removed > 0 {
            report.commits += 1;
            report.version = table.version().map(|v| v as i64);
        }
        report.files_removed += metrics.num_files_removed;
        report.files_added += metrics.num_files_added;
        report.bytes_removed += metrics.files_removed.total_size.max(0) as u64;
        report.bytes_added += metrics.files_added.total_size.max(0) as u64;
    }
    if report.commits == 0 {
        report.skipped = Some("OPTIMIZE found no two adjacent small files to pack".into());
    }
    Ok(report)
}

/// Does the table root hold any `_delta_log/` entry?
async fn has_log(dest: &Destination) -> bool {
    use futures::StreamExt;
    let prefix = Path::from("_delta_log");
    let mut list = dest.store.list(Some(&prefix));
    matches!(list.next().await, Some(Ok(_)))
}

/// The compactions' lease on one table: an object put if absent, naming its owner and expiry.
struct Lease {
    owner: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct LeaseBody {
    owner: String,
    /// Milliseconds since the epoch.
    until_ms: i64,
}

impl Lease {
    async fn take(dest: &Destination, hold: Duration) -> Result<Lease, CompactError> {
        let path = Path::from(LEASE_NAME);
        let owner = uuid::Uuid::new_v4().to_string();
        let lease_err = |source| CompactError::Lease {
            url: dest.url.clone(),
            source,
        };
        for attempt in 0..2 {
            let body = LeaseBody {
                owner: owner.clone(),
                until_ms: chrono::Utc::now().timestamp_millis() + hold.as_millis() as i64,
            };
            let payload = PutPayload::from(serde_json::to_vec(&body).expect("serializable"));
            let put = dest
                .store
                .put_opts(
                    &path,
                    payload,
                    PutOptions {
                        mode: PutMode::Create,
                        ..PutOptions::default()
                    },
                )
                .await;
            match put {
                Ok(_) => return Ok(Lease { owner }),
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => return Err(lease_err(e)),
            }
            let held = match dest.store.get(&path).await {
                Ok(g) => g.bytes().await.map_err(lease_err)?,
                // Given back in between: try again.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(lease_err(e)),
            };
            let until = serde_json::from_slice::<LeaseBody>(&held)
                .map(|b| b.until_ms)
                .unwrap_or(0);
            let now = chrono::Utc::now().timestamp_millis();
            if until > now || attempt == 1 {
                return Err(CompactError::Busy {
                    url: dest.url.clone(),
                    until: chrono::DateTime::from_timestamp_millis(until)
                        .map(|t| t.to_rfc3339())
                        .unwrap_or_else(|| until.to_string()),
                });
            }
            // Expired: its holder is gone (a compaction stops before its lease ends).
            tracing::warn!(table = %dest.url, "compaction lease expired {} ms ago: taken over", now - until);
            match dest.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(lease_err(e)),
            }
        }
        Err(CompactError::Busy {
            url: dest.url.clone(),
            until: "now".into(),
        })
    }

    /// Delete the lease if it is still this one's.
    async fn give_back(self, dest: &Destination) -> Result<(), object_store::Error> {
        let path = Path::from(LEASE_NAME);
        let held = match dest.store.get(&path).await {
            Ok(g) => g.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        match serde_json::from_slice::<LeaseBody>(&held) {
            Ok(b) if b.owner == self.owner => match dest.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            },
            _ => Ok(()),
        }
    }
}

/// The background compaction of `subsink run --compact-after N`: every `interval`, compact the
/// table when its quiet part holds at least N small files (`opts.min_total`). Never fails the
/// writer: a failed or conflicting compaction is logged (warn) and tried again at the next
/// interval. Ends when `stop` turns true (a compaction in progress is abandoned).
pub async fn background(
    dest: Destination,
    opts: CompactOptions,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let mut stopped = stop.clone();
        let until = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        match compact_until(&dest, &opts, until).await {
            Ok(r) if r.tombstones.as_ref().is_some_and(|t| t.commits > 0) && r.commits == 0 => {
                let t = r.tombstones.as_ref().expect("checked");
                tracing::info!(table = %dest.url, files_removed = t.files_removed, files_added = t.files_added, "tombstone table: packed {} files into {}", t.files_removed, t.files_added)
            }
            Ok(r) if r.commits > 0 => tracing::info!(
                table = %dest.url,
                version = r.version.unwrap_or(-1),
                files_removed = r.files_removed,
                files_added = r.files_added,
                bytes_removed = r.bytes_removed,
                bytes_added = r.bytes_added,
                "compacted {} files into {}",
                r.files_removed,
                r.files_added
            ),
            Ok(r) => {
                tracing::debug!(table = %dest.url, "compaction: nothing to do: {}", r.skipped.unwrap_or_default())
            }
            Err(CompactError::Stopped { .. }) => return,
            // The table is created by the writer's first commit.
            Err(CompactError::NotATable { .. }) => {}
            Err(e @ CompactError::Busy { .. }) => {
                tracing::info!(table = %dest.url, "compaction skipped: {e}")
            }
            Err(e) if e.is_conflict() => {
                tracing::warn!(table = %dest.url, "compaction conflicted with another commit; tried again in {interval:?}: {e}")
            }
            Err(e) => {
                tracing::warn!(table = %dest.url, "compaction failed; tried again in {interval:?}: {e}")
            }
        }
    }
}
