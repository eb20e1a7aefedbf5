//! The Delta sink's view of its table's schema while it runs (docs/destinations.md, "Schema
//! changes while running"; docs/decisions.md, "Schema changes decisions (issue 36)").
//!
//! A [`SchemaWatch`] is shared by the sink, its commits and a task of its own:
//! * the task reads the log's new commits (their `metaData` action: the table's schema) every
//!   `--table-schema-refresh`, without a table handle of its own; a commit reports the schema of
//!   every snapshot it lands on or reloads ([`SchemaWatch::observe`]);
//! * new NULLABLE columns wait in the watch until the sink opens its next batch, which takes them
//!   up ([`SchemaWatch::take_added`]): a batch already open is committed with the columns it was
//!   opened with (a file without a nullable column fits the table; readers fill it with NULL);
//! * a change the written files no longer fit (a column removed or retyped, a new REQUIRED
//!   column) is the subscription's `SCHEMA_MISMATCH`: readiness says why
//!   ([`SchemaWatch::problem`]), a warning is logged once per change, and commits wait
//!   (`commit_fitting` in `commit.rs`) — nothing committed, nothing settled — re-checking every
//!   refresh interval, until the table fits again.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arrow_schema::SchemaRef;
use deltalake_core::kernel::engine::arrow_conversion::TryFromArrow;
use deltalake_core::kernel::{StructField, StructType};
use object_store::ObjectStoreExt;

use crate::table::evolve::{fit, Fit};
use crate::upload::Destination;

/// `--table-schema-refresh`'s default: how often a running Delta sink reads its table's schema.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(10);

/// The shortest refresh interval: a log read each time.
const MIN_REFRESH: Duration = Duration::from_millis(100);

/// What the sink, its commits and the refresh task know of the table's schema.
pub struct SchemaWatch {
    url: String,
    /// How often the table is read again (`--table-schema-refresh`).
    pub refresh: Duration,
    state: Mutex<State>,
}

struct State {
    /// The columns the sink's new batches are written with (Delta's form).
    writes: StructType,
    /// The table version whose schema was last compared.
    version: i64,
    /// New NULLABLE columns of the table not yet taken up by the sink.
    added: Vec<StructField>,
    /// SCHEMA_MISMATCH: why the written files no longer fit the table.
    problem: Option<String>,
}

impl SchemaWatch {
    /// A watch of the table at `url`, whose new batches are written as `writes`.
    pub fn new(url: &str, writes: &SchemaRef, refresh: Duration) -> Arc<SchemaWatch> {
        Arc::new(SchemaWatch {
            url: url.to_string(),
            refresh: refresh.max(MIN_REFRESH),
            state: Mutex::new(State {
                writes: struct_of(writes),
                version: -1,
                added: Vec::new(),
                problem: None,
            }),
        })
    }

    /// The table's schema at `version` is `table`: compared with what the sink writes (a version
    /// older than one already seen is ignored).
    pub fn observe(&self, version: i64, table: &StructType) {
        let mut s = self.state.lock().expect("schema watch");
        if version < s.version {
            return;
        }
        s.version = version;
        match fit(&s.writes, table) {
            Fit::Same => {
                s.added.clear();
                self.clear(&mut s, version);
            }
            Fit::Added(added) => {
                if s.added != added {
                    let names: Vec<&str> = added.iter().map(|f| f.name().as_str()).collect();
                    tracing::info!(
                        table = %self.url,
                        version,
                        columns = ?names,
                        "new NULLABLE columns in the table: written from the next batch on"
                    );
                }
                s.added = added;
                self.clear(&mut s, version);
            }
            Fit::Mismatch(why) => self.mismatch_locked(&mut s, version, why),
        }
    }

    /// A commit found its files no longer fit the table at `version`: `why`.
    pub fn mismatch(&self, version: i64, why: String) {
        let mut s = self.state.lock().expect("schema watch");
        self.mismatch_locked(&mut s, version, why);
    }

    fn mismatch_locked(&self, s: &mut State, version: i64, why: String) {
        let problem = format!("SCHEMA_MISMATCH: Delta table {}: {why}", self.url);
        if s.problem.as_ref() != Some(&problem) {
            // Once per change: the refresh finds the same problem again every interval.
            tracing::warn!(
                table = %self.url,
                version,
                "{problem}; nothing is committed and no message settled until the table fits again (re-checked every {:?})",
                self.refresh
            );
            s.problem = Some(problem);
        }
    }

    fn clear(&self, s: &mut State, version: i64) {
        if s.problem.take().is_some() {
            tracing::warn!(
                table = %self.url,
                version,
                "the table's schema fits again: commits go on"
            );
        }
    }

    /// Why the table does not fit (SCHEMA_MISMATCH), for readiness.
    pub fn problem(&self) -> Option<String> {
        self.state.lock().expect("schema watch").problem.clone()
    }

    /// New NULLABLE columns the sink has not taken up yet (and forget them): the sink's next
    /// batch writes them, so from now on they are part of what it writes.
    pub fn take_added(&self) -> Vec<StructField> {
        let mut s = self.state.lock().expect("schema watch");
        let added = std::mem::take(&mut s.added);
        if !added.is_empty() {
            let mut fields: Vec<StructField> = s.writes.fields().cloned().collect();
            fields.extend(added.iter().cloned());
            if let Ok(w) = StructType::try_new(fields) {
                s.writes = w;
            }
        }
        added
    }

    /// The sink's new batches are written as `writes` from now on.
    pub fn set_writes(&self, writes: &SchemaRef) {
        self.state.lock().expect("schema watch").writes = struct_of(writes);
    }

    /// Every refresh interval, read the log versions after `version` (the table's version when
    /// the sink opened it) until the watch is dropped (the sink and its commits are gone). Only
    /// the new commit files are read, one GET each (one answered 404 when nothing is new), and
    /// only their `metaData` action is kept: no snapshot of the table's files is held beside
    /// the sink's own (a table of many files would double that memory), and no commit's lock is
    /// waited for.
    pub async fn run(watch: Weak<SchemaWatch>, dest: Destination, refresh: Duration, version: i64) {
        let mut version = version;
        loop {
            tokio::time::sleep(refresh.max(MIN_REFRESH)).await;
            let Some(w) = watch.upgrade() else { return };
            loop {
                let next = version + 1;
                let path = object_store::path::Path::from(format!("_delta_log/{next:020}.json"));
                let read = match dest.store.get(&path).await {
                    Ok(r) => r.bytes().await,
                    Err(e) => Err(e),
                };
                match read {
                    Ok(commit) => {
                        if let Some(schema) = metadata_schema(&commit) {
                            w.observe(next, &schema);
                        }
                        version = next;
                    }
                    Err(object_store::Error::NotFound { .. }) => break,
                    // The store may be down: the commits report that; read again next time.
                    Err(e) => {
                        tracing::debug!(table = %w.url, version = next, error = %e, "reading the Delta log failed");
                        break;
                    }
                }
            }
        }
    }
}

/// The table schema a commit file sets (its `metaData` action's `schemaString`), if it sets one.
fn metadata_schema(commit: &[u8]) -> Option<StructType> {
    commit
        .split(|b| *b == b'\n')
        .filter(|line| line.windows(10).any(|w| w == b"\"metaData\""))
        .find_map(|line| {
            let action: serde_json::Value = serde_json::from_slice(line).ok()?;
            let text = action.get("metaData")?.get("schemaString")?.as_str()?;
            serde_json::from_str(text).ok()
        })
}

/// An Arrow schema of files in Delta's form (it came from a Delta schema, so it converts).
fn struct_of(schema: &SchemaRef) -> StructType {
    StructType::try_from_arrow(schema.as_ref()).unwrap_or_else(|_| {
        StructType::try_new(Vec::<StructField>::new()).expect("an empty struct")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::{DataType, Field, Schema};
    use deltalake_core::kernel::{DataType as D, PrimitiveType};

    #[test]
    fn a_commit_file_sets_a_schema_only_with_a_metadata_action() {
        let add = br#"{"add":{"path":"metaData.parquet","size":1}}"#;
        assert!(metadata_schema(add).is_none());
        let meta = br#"{"commitInfo":{"operation":"ADD COLUMN"}}
{"metaData":{"id":"x","format":{"provider":"parquet","options":{}},"schemaString":"{\"type\":\"struct\",\"fields\":[{\"name\":\"id\",\"type\":\"long\",\"nullable\":false,\"metadata\":{}}]}","partitionColumns":[],"configuration":{}}}
"#;
        let schema = metadata_schema(meta).unwrap();
        assert_eq!(
            schema
                .fields()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>(),
            ["id"]
        );
    }

    #[test]
    fn added_columns_wait_for_the_next_batch_a_mismatch_is_said_until_it_passes() {
        let writes = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let w = SchemaWatch::new("file:///t", &writes, DEFAULT_REFRESH);
        let same = struct_of(&writes);
        w.observe(0, &same);
        assert!(w.problem().is_none() && w.take_added().is_empty());
        let extra = StructField::new("extra", D::Primitive(PrimitiveType::String), true);
        let mut f: Vec<StructField> = same.fields().cloned().collect();
        f.push(extra.clone());
        let wider = StructType::try_new(f).unwrap();
        w.observe(1, &wider);
        assert_eq!(w.take_added(), vec![extra]);
        assert!(w.take_added().is_empty(), "taken up once");
        w.observe(1, &wider);
        assert!(w.take_added().is_empty(), "part of what is written now");
        // Retyped: SCHEMA_MISMATCH naming the column, until the table fits again.
        let retyped = StructType::try_new(vec![
            StructField::new("id", D::Primitive(PrimitiveType::Long), false),
            StructField::new("name", D::Primitive(PrimitiveType::Long), true),
            StructField::new("extra", D::Primitive(PrimitiveType::String), true),
        ])
        .unwrap();
        w.observe(2, &retyped);
        let p = w.problem().unwrap();
        assert!(
            p.starts_with("SCHEMA_MISMATCH: Delta table file:///t: column `name`"),
            "{p}"
        );
        w.observe(1, &wider);
        assert!(w.problem().is_some(), "an older version does not clear it");
        w.observe(3, &wider);
        assert!(w.problem().is_none());
    }
}
