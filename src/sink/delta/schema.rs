//! The Delta sink's [`DeltaSchemaWatch`] (docs/destinations.md, "Schema changes while running";
//! docs/decisions.md, "Schema changes decisions (issue 36)"): the generic watch of
//! `sink/schema_watch.rs` over Delta's columns ([`DeltaColumns`]).
//!
//! * the watch's task reads the log's new commits (their `metaData` action: the table's schema)
//!   every `--table-schema-refresh`, without a table handle of its own; a commit reports the
//!   schema of every snapshot it lands on or reloads ([`DeltaSchemaWatch::observe`]);
//! * a change the written files no longer fit holds commits (`commit.rs`, through
//!   [`crate::sink::schema_watch::SchemaWatch::hold`]) until the table fits again.

use std::sync::{Arc, Weak};
use std::time::Duration;

use arrow_schema::SchemaRef;
use deltalake_core::kernel::engine::arrow_conversion::TryFromArrow;
use deltalake_core::kernel::{StructField, StructType};
use object_store::ObjectStoreExt;

use super::evolve::fit;
use crate::sink::schema_watch::{SchemaWatch, WatchedColumns, MIN_REFRESH};
use crate::table::evolve::Fit;
use crate::upload::Destination;

/// `--table-schema-refresh`'s default: how often a running Delta sink reads its table's schema.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(10);

/// What the Delta sink, its commits and the refresh task know of the table's schema.
pub type DeltaSchemaWatch = SchemaWatch<DeltaColumns>;

/// The columns the Delta sink's new batches are written with (Delta's form), compared with the
/// table's by [`fit`].
pub struct DeltaColumns {
    writes: StructType,
}

impl WatchedColumns for DeltaColumns {
    type Column = StructField;
    type Table = StructType;
    type Source = ();
    const KIND: &'static str = "Delta table";
    const HELD: &'static str = "committed";
    const WRITES: &'static str = "commits";

    fn fit(&mut self, table: &StructType, _added: &[StructField]) -> Option<Fit<StructField>> {
        Some(fit(&self.writes, table))
    }

    fn take_up(&mut self, added: &[StructField]) {
        let mut fields: Vec<StructField> = self.writes.fields().cloned().collect();
        fields.extend(added.iter().cloned());
        if let Ok(w) = StructType::try_new(fields) {
            self.writes = w;
        }
    }

    fn name(column: &StructField) -> &str {
        column.name()
    }
}

impl SchemaWatch<DeltaColumns> {
    /// A watch of the table at `url`, whose new batches are written as `writes`.
    pub fn new(url: &str, writes: &SchemaRef, refresh: Duration) -> Arc<DeltaSchemaWatch> {
        let columns = DeltaColumns {
            writes: struct_of(writes),
        };
        Arc::new(SchemaWatch::watching(url.to_string(), columns, (), refresh))
    }

    /// The table's schema at `version` is `table`: compared with what the sink writes (a version
    /// older than one already seen is ignored).
    pub fn observe(&self, version: i64, table: &StructType) {
        self.observe_at(Some(version), table);
    }

    /// A commit found its files no longer fit the table at `version`: `why`.
    pub fn mismatch(&self, version: i64, why: String) {
        self.mismatch_at(Some(version), why);
    }

    /// The sink's new batches are written as `writes` from now on.
    pub fn set_writes(&self, writes: &SchemaRef) {
        self.with_columns(|c| c.writes = struct_of(writes));
    }

    /// Every refresh interval, read the log versions after `version` (the table's version when
    /// the sink opened it) until the watch is dropped (the sink and its commits are gone). Only
    /// the new commit files are read, one GET each (one answered 404 when nothing is new), and
    /// only their `metaData` action is kept: no snapshot of the table's files is held beside
    /// the sink's own (a table of many files would double that memory), and no commit's lock is
    /// waited for.
    pub async fn run(
        watch: Weak<DeltaSchemaWatch>,
        dest: Destination,
        refresh: Duration,
        version: i64,
    ) {
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
                        tracing::debug!(table = %w.table(), version = next, error = %e, "reading the Delta log failed");
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
        let w = DeltaSchemaWatch::new("file:///t", &writes, DEFAULT_REFRESH);
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
