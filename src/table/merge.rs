//! Change data capture into a Delta table (docs/contract.md §4.9): each commit applies its batch of
//! changes as one MERGE by the primary key, through deltalake's own MERGE (DataFusion).
//!
//! 1. **Last change per key** ([`last_changes`]): within the batch, for each key, the change with
//!    the highest `_CHANGE_SEQUENCE_NUMBER` wins; without numbers (or on a tie) the later one.
//! 2. **Tombstones**: a DELETE removes the row, and with it the number it held; so that a change
//!    older than the delete, arriving in a later batch, does not bring the row back, the key and
//!    the delete's number are kept in a second Delta table, `_subsink_tombstones/` under the
//!    table's root (a folder Delta readers and VACUUM skip). Changes older than a key's
//!    tombstone are dropped before the MERGE; the tombstones are updated first (a DELETE adds or
//!    raises one, a newer UPSERT removes it), then the table.
//! 3. **MERGE** on the key: a matched row is deleted by a DELETE and replaced by an UPSERT, unless
//!    its own number is higher than the change's; an unmatched UPSERT is inserted; an unmatched
//!    DELETE does nothing.
//!
//! With sequence numbers the result is a function of the set of changes: replaying a batch (after
//! a crash, or a redelivery) or applying batches cut differently gives the same table. Without
//! them a change is newer than every change before it: replaying a suffix of the stream in order
//! gives the same table, replaying an older batch after a newer one does not.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{Field, Schema, SchemaRef};
use deltalake_core::arrow::compute::{concat_batches, take_record_batch};
use deltalake_core::arrow::row::{RowConverter, SortField};
use deltalake_core::datafusion::common::{Column, JoinType};
use deltalake_core::datafusion::prelude::{lit, Expr, SessionContext};
use deltalake_core::kernel::transaction::CommitProperties;
use deltalake_core::kernel::transaction::TransactionError;
use deltalake_core::operations::merge::{MergeBuilder, MergeMetrics};
use deltalake_core::DeltaTableError;
use parquet::file::properties::WriterProperties;

use super::cdc::{PrimaryKey, CHANGE_SEQUENCE_NUMBER, CHANGE_TYPE};
use super::delta::{to_delta_batch, AppTxn, DeltaError, DeltaTable};
use crate::upload::Destination;

/// The folder, under the table's root, of the tombstone table.
pub const TOMBSTONES: &str = "_subsink_tombstones";
/// How many times a MERGE runs again after another writer's commit conflicted with it.
const MAX_MERGE_ATTEMPTS: usize = 50;

const SOURCE: &str = "source";
const TARGET: &str = "target";

/// A column of a side of the MERGE, its name kept as is (DataFusion's `col("a.B")` lowercases).
fn column(side: &str, name: &str) -> Expr {
    Expr::Column(Column::new(Some(side), name))
}

fn plain(name: &str) -> Column {
    Column::new_unqualified(name)
}

/// What a commit of changes did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeCounts {
    /// Changes in the batch, and the ones left after the last-change-per-key rule and the
    /// tombstones.
    pub changes: usize,
    pub applied: usize,
    pub inserted: usize,
    pub updated: usize,
    pub deleted: usize,
}

/// The last change per key of `batches` (the row builder's batches: the table's columns and
/// the two pseudo-columns, sequence numbers normalized), in arrival order.
pub fn last_changes(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    key: &PrimaryKey,
) -> Result<RecordBatch, DeltaError> {
    let batch = concat_batches(schema, batches)?;
    let index = |name: &str| {
        schema.index_of(name).map_err(|_| DeltaError::Schema {
            column: name.to_string(),
            reason: "not a column of the change rows".into(),
        })
    };
    let key_columns: Vec<ArrayRef> = key
        .columns
        .iter()
        .map(|k| index(k).map(|i| batch.column(i).clone()))
        .collect::<Result<_, _>>()?;
    let seq = batch
        .column(index(CHANGE_SEQUENCE_NUMBER)?)
        .as_string::<i32>();
    let converter = RowConverter::new(
        key_columns
            .iter()
            .map(|c| SortField::new(c.data_type().clone()))
            .collect(),
    )?;
    let rows = converter.convert_columns(&key_columns)?;
    let mut winner: HashMap<_, u32> = HashMap::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        match winner.entry(rows.row(i)) {
            Entry::Vacant(v) => {
                v.insert(i as u32);
            }
            Entry::Occupied(mut o) => {
                let w = *o.get() as usize;
                let older = seq.is_valid(i) && seq.is_valid(w) && seq.value(i) < seq.value(w);
                if !older {
                    o.insert(i as u32);
                }
            }
        }
    }
    let mut keep: Vec<u32> = winner.into_values().collect();
    keep.sort_unstable();
    Ok(take_record_batch(&batch, &UInt32Array::from(keep))?)
}

impl DeltaTable {
    /// Apply `batches` of changes (see the module docs) in one MERGE commit, with `txns` in the
    /// same log version. Returns the version and what was done. A MERGE that conflicts with
    /// another writer's commit runs again on the new snapshot.
    pub async fn merge_changes(
        &mut self,
        rows_schema: &SchemaRef,
        batches: &[RecordBatch],
        key: &PrimaryKey,
        txns: &[AppTxn],
        props: &WriterProperties,
    ) -> Result<(i64, MergeCounts), DeltaError> {
        let winners = last_changes(rows_schema, batches, key)?;
        let mut counts = MergeCounts {
            changes: batches.iter().map(RecordBatch::num_rows).sum(),
            ..Default::default()
        };
        let numbered = winners
            .column_by_name(CHANGE_SEQUENCE_NUMBER)
            .is_some_and(|c| c.null_count() < c.len());
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = async {
                let live = if numbered || self.tombstones.is_some() {
                    let tombstones = self.tombstones(key).await?;
                    let live = tombstones.drop_stale(&winners, key).await?;
                    tombstones.record_deletes(&live, key, props).await?;
                    live
                } else {
                    winners.clone()
                };
                let applied = live.num_rows();
                let (version, m) = self.merge_into(live, key, txns, props).await?;
                Ok::<_, DeltaError>((version, applied, m))
            }
            .await;
            match result {
                Ok((version, applied, m)) => {
                    counts.applied = applied;
                    counts.inserted = m.num_target_rows_inserted;
                    counts.updated = m.num_target_rows_updated;
                    counts.deleted = m.num_target_rows_deleted;
                    return Ok((version, counts));
                }
                Err(e) if attempt < MAX_MERGE_ATTEMPTS && is_conflict(&e) => {
                    tracing::debug!(table = %self.url, attempt, error = %e, "MERGE conflicted with another writer; running it again");
                    crate::telemetry::retried(crate::telemetry::RetryKind::Commit);
                    self.reload().await?;
                    if let Some(t) = &mut self.tombstones {
                        t.reload().await?;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The tombstone table of this table, opened (created when absent) on first use.
    async fn tombstones(&mut self, key: &PrimaryKey) -> Result<&mut DeltaTable, DeltaError> {
        if self.tombstones.is_none() {
            let dest = child(&self.dest, TOMBSTONES)?;
            let fields: Vec<Field> = key
                .columns
                .iter()
                .chain(std::iter::once(&CHANGE_SEQUENCE_NUMBER.to_string()))
                .map(|c| {
                    self.schema
                        .field_with_name(c)
                        .map(|f| f.as_ref().clone())
                        .map_err(|_| DeltaError::Schema {
                            column: c.clone(),
                            reason: "not a column of the table".into(),
                        })
                })
                .collect::<Result<_, _>>()?;
            let t = DeltaTable::open_or_create(&dest, &Schema::new(fields)).await?;
            self.tombstones = Some(Box::new(t));
        }
        Ok(self.tombstones.as_mut().expect("just opened"))
    }

    /// `winners` without the changes older than their key's tombstone.
    async fn drop_stale(
        &mut self,
        winners: &RecordBatch,
        key: &PrimaryKey,
    ) -> Result<RecordBatch, DeltaError> {
        if self.version() == 0 {
            return Ok(winners.clone()); // no tombstone yet
        }
        let err = |e| self.delta_err(e);
        let ctx = SessionContext::new();
        self.table
            .update_datafusion_session(&ctx.state())
            .map_err(err)?;
        let provider = self
            .table
            .table_provider()
            .await
            .map_err(|e| self.delta_err(e.into()))?;
        let alias = |c: &str| format!("__tombstone_{c}");
        let t = ctx.read_table(provider)?.select(
            key.columns
                .iter()
                .chain(std::iter::once(&CHANGE_SEQUENCE_NUMBER.to_string()))
                .map(|c| Expr::Column(plain(c)).alias(alias(c)))
                .collect::<Vec<_>>(),
        )?;
        let left: Vec<&str> = key.columns.iter().map(String::as_str).collect();
        let right_names: Vec<String> = key.columns.iter().map(|c| alias(c)).collect();
        let right: Vec<&str> = right_names.iter().map(String::as_str).collect();
        let seq = Expr::Column(plain(CHANGE_SEQUENCE_NUMBER));
        let dead = Expr::Column(plain(&alias(CHANGE_SEQUENCE_NUMBER)));
        let live = ctx
            .read_batch(winners.clone())?
            .join(t, JoinType::Left, &left, &right, None)?
            .filter(
                dead.clone()
                    .is_null()
                    .or(seq.clone().is_null())
                    .or(seq.gt_eq(dead)),
            )?
            .select(
                winners
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| Expr::Column(plain(f.name())))
                    .collect::<Vec<_>>(),
            )?
            .collect()
            .await?;
        Ok(concat_batches(&winners.schema(), &live)?)
    }

    /// Tombstones: a numbered DELETE adds its key or raises its number; a numbered UPSERT at
    /// least as new removes it.
    async fn record_deletes(
        &mut self,
        live: &RecordBatch,
        key: &PrimaryKey,
        props: &WriterProperties,
    ) -> Result<(), DeltaError> {
        let ct = live
            .column_by_name(CHANGE_TYPE)
            .expect("a change batch")
            .as_string::<i32>();
        let seq = live
            .column_by_name(CHANGE_SEQUENCE_NUMBER)
            .expect("a change batch")
            .as_string::<i32>();
        let deletes = (0..live.num_rows()).any(|i| seq.is_valid(i) && ct.value(i) == "DELETE");
        if !deletes && self.version() == 0 {
            return Ok(()); // nothing to add, nothing to remove
        }
        let numbered = deltalake_core::arrow::compute::is_not_null(seq)?;
        let source = deltalake_core::arrow::compute::filter_record_batch(live, &numbered)?;
        let names: Vec<&str> = key
            .columns
            .iter()
            .map(String::as_str)
            .chain([CHANGE_SEQUENCE_NUMBER, CHANGE_TYPE])
            .collect();
        let source = source.project(
            &names
                .iter()
                .map(|n| source.schema().index_of(n))
                .collect::<Result<Vec<_>, _>>()?,
        )?;
        let s = |c: &str| column(SOURCE, c);
        let t = |c: &str| column(TARGET, c);
        let newer = s(CHANGE_SEQUENCE_NUMBER).gt_eq(t(CHANGE_SEQUENCE_NUMBER));
        let stored: Vec<&str> = names[..names.len() - 1].to_vec();
        let (table, _) = self
            .merge_builder(source, key, props)?
            .when_matched_delete(|d| {
                d.predicate(s(CHANGE_TYPE).eq(lit("UPSERT")).and(newer.clone()))
            })
            .and_then(|m| {
                m.when_matched_update(|u| {
                    u.predicate(s(CHANGE_TYPE).eq(lit("DELETE")).and(newer.clone()))
                        .update(plain(CHANGE_SEQUENCE_NUMBER), s(CHANGE_SEQUENCE_NUMBER))
                })
            })
            .and_then(|m| {
                m.when_not_matched_insert(|i| {
                    stored
                        .iter()
                        .fold(i.predicate(s(CHANGE_TYPE).eq(lit("DELETE"))), |i, c| {
                            i.set(plain(c), s(c))
                        })
                })
            })
            .map_err(|e| self.delta_err(e))?
            .await
            .map_err(|e| self.delta_err(e))?;
        self.table = table;
        Ok(())
    }

    /// The MERGE into the table itself.
    async fn merge_into(
        &mut self,
        live: RecordBatch,
        key: &PrimaryKey,
        txns: &[AppTxn],
        props: &WriterProperties,
    ) -> Result<(i64, MergeMetrics), DeltaError> {
        self.txns_behind(txns).await?;
        // The table's columns in their Delta form, then the change type.
        let ct_index = live.schema().index_of(CHANGE_TYPE)?;
        let mut rest = live.clone();
        rest.remove_column(ct_index);
        // The batch's own columns (a batch opened before columns were taken up has fewer than
        // the table: the MERGE leaves those alone on update and NULL on insert).
        let target = super::delta::delta_arrow_schema(&rest.schema())?;
        let table_rows = to_delta_batch(&rest, &target)?;
        let mut fields: Vec<Arc<Field>> = table_rows.schema().fields().iter().cloned().collect();
        fields.push(live.schema().field(ct_index).clone().into());
        let mut columns = table_rows.columns().to_vec();
        columns.push(live.column(ct_index).clone());
        let source = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
        let s = |c: &str| column(SOURCE, c);
        let t = |c: &str| column(TARGET, c);
        let newer = s(CHANGE_SEQUENCE_NUMBER)
            .is_null()
            .or(t(CHANGE_SEQUENCE_NUMBER).is_null())
            .or(s(CHANGE_SEQUENCE_NUMBER).gt_eq(t(CHANGE_SEQUENCE_NUMBER)));
        let names: Vec<String> = target.fields().iter().map(|f| f.name().clone()).collect();
        let now = chrono::Utc::now().timestamp_millis();
        let commit = CommitProperties::default()
            .with_max_retries(super::delta::MAX_COMMIT_RETRIES)
            .with_application_transactions(AppTxn::actions(txns, now));
        let (table, metrics) = self
            .merge_builder(source, key, props)?
            .with_commit_properties(commit)
            .when_matched_delete(|d| {
                d.predicate(s(CHANGE_TYPE).eq(lit("DELETE")).and(newer.clone()))
            })
            .and_then(|m| {
                m.when_matched_update(|u| {
                    names.iter().fold(
                        u.predicate(s(CHANGE_TYPE).eq(lit("UPSERT")).and(newer.clone())),
                        |u, c| u.update(plain(c), s(c)),
                    )
                })
            })
            .and_then(|m| {
                m.when_not_matched_insert(|i| {
                    names
                        .iter()
                        .fold(i.predicate(s(CHANGE_TYPE).eq(lit("UPSERT"))), |i, c| {
                            i.set(plain(c), s(c))
                        })
                })
            })
            .map_err(|e| self.delta_err(e))?
            .await
            .map_err(|e| self.delta_err(e))?;
        self.table = table;
        Ok((self.version(), metrics))
    }
}

impl DeltaTable {
    /// A MERGE of `source` into this table on `key`: `source.` and `target.` as the sides' names,
    /// `props` for the files it writes; the clauses are the caller's.
    fn merge_builder(
        &self,
        source: RecordBatch,
        key: &PrimaryKey,
        props: &WriterProperties,
    ) -> Result<MergeBuilder, DeltaError> {
        let df = SessionContext::new().read_batch(source)?;
        Ok(self
            .table
            .clone()
            .merge(df, on(key))
            .with_source_alias(SOURCE)
            .with_target_alias(TARGET)
            .with_writer_properties(props.clone()))
    }
}

/// The MERGE's join: every key column equal.
fn on(key: &PrimaryKey) -> Expr {
    key.columns
        .iter()
        .map(|c| column(TARGET, c).eq(column(SOURCE, c)))
        .reduce(Expr::and)
        .expect("a key has a column")
}

/// Whether `e` is another writer's commit conflicting with this one (worth running again).
fn is_conflict(e: &DeltaError) -> bool {
    matches!(
        e,
        DeltaError::Delta {
            source: DeltaTableError::Transaction {
                source: TransactionError::CommitConflict(_)
                    | TransactionError::MaxCommitAttempts(_),
            },
            ..
        }
    )
}

/// The folder `name` under `dest`'s root, as a destination of its own.
fn child(dest: &Destination, name: &str) -> Result<Destination, DeltaError> {
    let url = format!("{}/{name}", dest.url.trim_end_matches('/'));
    if let Some(dir) = url::Url::parse(&url)
        .ok()
        .filter(|u| u.scheme() == "file")
        .and_then(|u| u.to_file_path().ok())
    {
        std::fs::create_dir_all(&dir).map_err(|e| DeltaError::Upload {
            url: url.clone(),
            path: name.to_string(),
            source: object_store::Error::Generic {
                store: "local",
                source: Box::new(e),
            },
        })?;
    }
    Ok(Destination {
        store: Arc::new(object_store::prefix::PrefixStore::new(
            dest.store.clone(),
            name,
        )),
        url,
        supports_attributes: dest.supports_attributes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use crate::table::cdc::with_change_columns;
    use crate::table::{RowBuilder, RowOptions, SchemaMode, TableSchema};
    use arrow_array::Int64Array;

    /// A row builder for `id INT64, name STRING` keyed by `id`, with the pseudo-columns.
    fn builder() -> (RowBuilder, PrimaryKey) {
        let schema = TableSchema::from_json(
            r#"[{"name":"id","type":"INT64","mode":"REQUIRED"},{"name":"name","type":"STRING"}]"#,
        )
        .unwrap();
        let key = PrimaryKey::new(&["id".to_string()], &schema).unwrap();
        let opts = RowOptions {
            mode: SchemaMode::UseTableSchema,
            ..Default::default()
        };
        let mut rows = RowBuilder::new(&with_change_columns(&schema).unwrap(), opts).unwrap();
        rows.check_changes(&key).unwrap();
        (rows, key)
    }

    fn batch(rows: &mut RowBuilder, changes: &[&str]) -> RecordBatch {
        for (i, c) in changes.iter().enumerate() {
            let m = Message {
                data: c.as_bytes().to_vec().into(),
                message_id: i.to_string(),
                ..Default::default()
            };
            rows.append(&m).unwrap_or_else(|e| panic!("{c}: {e}"));
        }
        rows.finish()
    }

    /// `(id, name, first section of the number)` of every row, by id.
    async fn table_rows(t: &DeltaTable) -> Vec<(i64, Option<String>, Option<String>)> {
        let ctx = SessionContext::new();
        t.table.update_datafusion_session(&ctx.state()).unwrap();
        let provider = t.table.table_provider().await.unwrap();
        let got = ctx.read_table(provider).unwrap().collect().await.unwrap();
        let mut out = Vec::new();
        for b in got {
            let id = b
                .column_by_name("id")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            // DataFusion reads strings as views: cast them back.
            let text = |c: &str| {
                arrow_cast::cast(b.column_by_name(c).unwrap(), &arrow_schema::DataType::Utf8)
                    .unwrap()
            };
            let (name, seq) = (text("name"), text(CHANGE_SEQUENCE_NUMBER));
            let (name, seq) = (name.as_string::<i32>(), seq.as_string::<i32>());
            for i in 0..b.num_rows() {
                out.push((
                    id.value(i),
                    name.is_valid(i).then(|| name.value(i).to_string()),
                    seq.is_valid(i)
                        .then(|| seq.value(i)[..16].trim_start_matches('0').to_string()),
                ));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn the_last_change_per_key_wins_by_number_then_arrival() {
        let (mut rows, key) = builder();
        let b = batch(
            &mut rows,
            &[
                r#"{"id":1,"name":"a","_CHANGE_SEQUENCE_NUMBER":"5"}"#,
                r#"{"id":1,"name":"older","_CHANGE_SEQUENCE_NUMBER":"4"}"#,
                r#"{"id":2,"name":"b"}"#,
                r#"{"id":2,"name":"b2"}"#,
                r#"{"id":3,"name":"c","_CHANGE_SEQUENCE_NUMBER":"1/0"}"#,
                r#"{"id":3,"_CHANGE_TYPE":"DELETE","_CHANGE_SEQUENCE_NUMBER":"1"}"#,
                r#"{"id":4,"name":"d","_CHANGE_SEQUENCE_NUMBER":"A"}"#,
                r#"{"id":4,"name":"d-unnumbered"}"#,
            ],
        );
        let w = last_changes(&rows.schema(), &[b], &key).unwrap();
        let names = w.column_by_name("name").unwrap().as_string::<i32>();
        let types = w.column_by_name(CHANGE_TYPE).unwrap().as_string::<i32>();
        let got: Vec<_> = (0..w.num_rows())
            .map(|i| (types.value(i), names.is_valid(i).then(|| names.value(i))))
            .collect();
        // Arrival order kept; an equal number ("1/0" = "1"): the later one; no number: the later.
        assert_eq!(
            got,
            [
                ("UPSERT", Some("a")),
                ("UPSERT", Some("b2")),
                ("DELETE", None),
                ("UPSERT", Some("d-unnumbered")),
            ]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn merges_apply_numbers_and_tombstones_across_batches() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let dest = Destination::from_url(&url).unwrap();
        let (mut rows, key) = builder();
        let rows_schema = rows.schema();
        let table_schema = Schema::new(
            rows_schema
                .fields()
                .iter()
                .filter(|f| f.name() != CHANGE_TYPE)
                .cloned()
                .collect::<Vec<_>>(),
        );
        let mut t = DeltaTable::open_or_create(&dest, &table_schema)
            .await
            .unwrap();
        let props = crate::table::default_writer_properties();
        let first = batch(
            &mut rows,
            &[
                r#"{"id":1,"name":"a","_CHANGE_SEQUENCE_NUMBER":"3"}"#,
                r#"{"id":2,"name":"b","_CHANGE_SEQUENCE_NUMBER":"1"}"#,
                r#"{"id":2,"_CHANGE_TYPE":"DELETE","_CHANGE_SEQUENCE_NUMBER":"5"}"#,
                r#"{"id":3,"name":"c"}"#,
                r#"{"id":9,"_CHANGE_TYPE":"DELETE"}"#,
            ],
        );
        let (_, c) = t
            .merge_changes(&rows_schema, &[first], &key, &[], &props)
            .await
            .unwrap();
        assert_eq!((c.changes, c.applied, c.inserted, c.deleted), (5, 4, 2, 0));
        assert_eq!(
            table_rows(&t).await,
            [
                (1, Some("a".into()), Some("3".into())),
                (3, Some("c".into()), None)
            ]
        );
        // Older than the row (1), older than the tombstone (2), a number on an unnumbered row (3).
        let second = batch(
            &mut rows,
            &[
                r#"{"id":1,"name":"stale","_CHANGE_SEQUENCE_NUMBER":"2"}"#,
                r#"{"id":2,"name":"zombie","_CHANGE_SEQUENCE_NUMBER":"4"}"#,
                r#"{"id":3,"name":"c2","_CHANGE_SEQUENCE_NUMBER":"1"}"#,
            ],
        );
        t.merge_changes(
            &rows_schema,
            std::slice::from_ref(&second),
            &key,
            &[],
            &props,
        )
        .await
        .unwrap();
        let want = [
            (1, Some("a".into()), Some("3".into())),
            (3, Some("c2".into()), Some("1".into())),
        ];
        assert_eq!(table_rows(&t).await, want);
        // A replayed batch changes nothing.
        t.merge_changes(&rows_schema, &[second], &key, &[], &props)
            .await
            .unwrap();
        assert_eq!(table_rows(&t).await, want);
        let third = batch(
            &mut rows,
            &[
                r#"{"id":2,"name":"back","_CHANGE_SEQUENCE_NUMBER":"6"}"#,
                r#"{"id":1,"_CHANGE_TYPE":"DELETE","_CHANGE_SEQUENCE_NUMBER":"3"}"#,
            ],
        );
        t.merge_changes(&rows_schema, &[third], &key, &[], &props)
            .await
            .unwrap();
        assert_eq!(
            table_rows(&t).await,
            [
                (2, Some("back".into()), Some("6".into())),
                (3, Some("c2".into()), Some("1".into())),
            ]
        );
        // The tombstones: 1 (deleted at 3); 2's was removed by its re-insert.
        let tomb = t.tombstones.as_ref().unwrap();
        let ctx = SessionContext::new();
        tomb.table.update_datafusion_session(&ctx.state()).unwrap();
        let got = ctx
            .read_table(tomb.table.table_provider().await.unwrap())
            .unwrap()
            .collect()
            .await
            .unwrap();
        let ids: Vec<i64> = got
            .iter()
            .flat_map(|b| {
                b.column_by_name("id")
                    .unwrap()
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(ids, [1]);
    }
}
