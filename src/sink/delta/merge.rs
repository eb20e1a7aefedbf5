//! Change data capture into a Delta table (docs/contract.md §4.9): each batch of changes is
//! applied by deltalake's own MERGE (DataFusion) by the primary key, in two commits: the
//! tombstone table's (when tombstones change), then the table's.
//!
//! **The rule** (one order of changes per key, whatever the batches): a change's number is its
//! `_CHANGE_SEQUENCE_NUMBER`, or 0 without one; a change applies when its number is at least the
//! number its key holds (a row's, or a tombstone's still in force), so on equal numbers (`FF` and
//! `FF/0` are equal) the later arrival wins. The table is then the last arrival among each key's
//! changes of the highest number, for any cut of the stream into batches.
//!
//! 1. **Last change per key** ([`last_changes`]): within the batch, by that rule.
//! 2. **Changes that lose are dropped** ([`DeltaTable::live_changes`]): older than their key's
//!    tombstone in force, and DELETEs older than their key's row. Both tables are read for the
//!    batch's key range only (a `min ≤ key ≤ max` predicate, which skips the files and row groups
//!    of other keys), and the tombstone table for tombstones in force only.
//! 3. **Tombstones**: a DELETE removes the row, and with it the number it held; so that an older
//!    change arriving later does not bring the row back, a winning DELETE numbered above 0 keeps
//!    its key, number and commit time (`_subsink_deleted_at`, the writer's clock) in a second
//!    Delta table, `_subsink_tombstones/` under the table's root (a folder Delta readers and
//!    VACUUM skip). A winning UPSERT (or DELETE numbered 0) removes its key's tombstone. A
//!    tombstone counts for the retention window (`--table-delete-retention`, two days by default,
//!    BigQuery's delete retention window) from its commit; after it, an older change of the key
//!    is applied, and the writer removes expired tombstones (at most every eighth of the window).
//!    So the tombstone table holds the keys whose winning change is a numbered DELETE inside the
//!    window (plus expired ones not yet removed); it is compacted with the table
//!    ([`super::compact`]).
//! 4. **MERGE** on the key: a DELETE deletes the matched row, an UPSERT replaces it or is
//!    inserted, each only while its number is at least the row's (another writer's commit in
//!    between).
//!
//! Replaying a batch (after a crash between the two commits, or a redelivery) gives the same
//! table; a change older than a tombstone that expired is applied, as BigQuery applies it after
//! its window.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use std::ops::Not;
use std::time::Duration;

use arrow_array::{
    Array, ArrayRef, BooleanArray, RecordBatch, TimestampMicrosecondArray, UInt32Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake_core::arrow::compute::{concat_batches, take_record_batch};
use deltalake_core::arrow::row::{RowConverter, SortField};
use deltalake_core::datafusion::common::{Column, JoinType, ScalarValue};
use deltalake_core::datafusion::logical_expr::when;
use deltalake_core::datafusion::prelude::{lit, DataFrame, Expr, SessionContext};
use deltalake_core::kernel::transaction::CommitProperties;
use deltalake_core::kernel::transaction::TransactionError;
use deltalake_core::operations::merge::{MergeBuilder, MergeMetrics};
use deltalake_core::DeltaTableError;
use parquet::file::properties::WriterProperties;

use super::error::DeltaError;
use super::form::to_delta_batch;
use super::table::DeltaTable;
use super::txn::AppTxn;
use crate::table::cdc::{PrimaryKey, CHANGE_SEQUENCE_NUMBER, CHANGE_TYPE};
use crate::upload::Destination;

/// The folder, under the table's root, of the tombstone table.
pub const TOMBSTONES: &str = "_subsink_tombstones";
/// The tombstone table's column of the time a tombstone was written (its commit's, by the
/// writer's clock): the retention window counts from it.
pub const DELETED_AT: &str = "_subsink_deleted_at";
/// A column of [`DeltaTable::live_changes`]' join: the key holds a tombstone.
const HAD_TOMBSTONE: &str = "__had_tombstone";
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeCounts {
    /// The data files the MERGE's commit added (paths below the table, as stored); empty when
    /// it added none (deletes only, or nothing to change: no commit).
    pub files: Vec<String>,
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
                // No number counts as 0; on equal numbers the later arrival wins.
                let number = |j: usize| {
                    if seq.is_valid(j) {
                        seq.value(j)
                    } else {
                        crate::table::cdc::ZERO
                    }
                };
                let older = number(i) < number(w);
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
    /// same log version (and, before it, a commit of the tombstone table when tombstones change).
    /// Returns the version and what was done. A MERGE that conflicts with another writer's
    /// commit runs again on the new snapshot.
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
        let numbered_deletes = numbered_deletes(&winners);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = async {
                let now = chrono::Utc::now().timestamp_micros();
                if self.tombstones.is_none()
                    && (numbered_deletes > 0
                        || DeltaTable::has_log(&folder(&self.dest, TOMBSTONES)).await)
                {
                    self.tombstones(key).await?;
                }
                let (live, had_tombstone) = self
                    .live_changes(&winners, key, numbered_deletes > 0, now)
                    .await?;
                let applied = live.num_rows();
                if let Some(t) = self.tombstones.as_mut() {
                    t.record_deletes(&live, &had_tombstone, key, props, now)
                        .await?;
                }
                let before = self.version();
                let (version, m) = self.merge_into(live, key, txns, props).await?;
                let files = match version > before {
                    true => self.added_files(version).await,
                    false => Vec::new(),
                };
                Ok::<_, DeltaError>((version, applied, m, files))
            }
            .await;
            match result {
                Ok((version, applied, m, files)) => {
                    counts.files = files;
                    counts.applied = applied;
                    counts.inserted = m.num_target_rows_inserted;
                    counts.updated = m.num_target_rows_updated;
                    counts.deleted = m.num_target_rows_deleted;
                    self.expire_tombstones().await;
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

    /// The data files log version `version` added (paths below the table, decoded as stored).
    /// A log entry that cannot be read back names none (the commit stands).
    async fn added_files(&self, version: i64) -> Vec<String> {
        let commit = match self
            .table
            .log_store()
            .read_commit_entry(version as u64)
            .await
        {
            Ok(Some(c)) => c,
            Ok(None) => return Vec::new(),
            Err(e) => {
                tracing::warn!(table = %self.url, version, error = %e, "reading back the files of a MERGE commit failed");
                return Vec::new();
            }
        };
        let add_path = |line: &[u8]| {
            let v: serde_json::Value = serde_json::from_slice(line).ok()?;
            let path = v.get("add")?.get("path")?.as_str()?;
            Some(
                percent_encoding::percent_decode_str(path)
                    .decode_utf8_lossy()
                    .into_owned(),
            )
        };
        commit.split(|b| *b == b'\n').filter_map(add_path).collect()
    }

    /// How long a tombstone keeps older changes of its key out (`--table-delete-retention`);
    /// see the module docs.
    pub fn set_delete_retention(&mut self, retention: Duration) {
        self.delete_retention = retention;
    }

    /// The tombstone table of this table, opened (created when absent) on first use. A table
    /// made before tombstones carried their time is opened as it is: its tombstones never
    /// expire, and the first MERGE into it adds the time column.
    async fn tombstones(&mut self, key: &PrimaryKey) -> Result<&mut DeltaTable, DeltaError> {
        if self.tombstones.is_none() {
            let dest = child(&self.dest, TOMBSTONES)?;
            let mut fields: Vec<Field> = key
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
            let legacy = Schema::new(fields.clone());
            fields.push(Field::new(
                DELETED_AT,
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ));
            let t = match DeltaTable::open_or_create(&dest, &Schema::new(fields)).await {
                Err(DeltaError::SchemaMismatch { .. }) => {
                    DeltaTable::open_or_create(&dest, &legacy).await?
                }
                r => r?,
            };
            self.tombstones = Some(Box::new(t));
        }
        Ok(self.tombstones.as_mut().expect("just opened"))
    }

    /// Whether this (tombstone) table has the time column yet.
    fn has_deleted_at(&self) -> bool {
        self.table
            .snapshot()
            .is_ok_and(|s| s.schema().field(DELETED_AT).is_some())
    }

    /// The oldest time (µs since the epoch) of a tombstone still in force at `now`.
    fn cutoff(&self, now: i64) -> i64 {
        now.saturating_sub(i64::try_from(self.delete_retention.as_micros()).unwrap_or(i64::MAX))
    }

    /// The rows of this table within `range` (a predicate on its columns), as `columns` (each
    /// an expression over the table's columns, with its alias), read in `ctx`.
    async fn read_keys(
        &self,
        ctx: &SessionContext,
        range: &Expr,
        columns: Vec<Expr>,
    ) -> Result<DataFrame, DeltaError> {
        self.table
            .update_datafusion_session(&ctx.state())
            .map_err(|e| self.delta_err(e))?;
        let provider = self
            .table
            .table_provider()
            .await
            .map_err(|e| self.delta_err(e.into()))?;
        Ok(ctx
            .read_table(provider)?
            .filter(range.clone())?
            .select(columns)?)
    }

    /// `winners` without the changes that lose (see the module docs): older than their key's
    /// tombstone still in force, and DELETEs older than their key's row (only read when the
    /// batch has numbered DELETEs: the others cannot leave a tombstone, and the MERGE itself
    /// decides them against the row). Both tables are read for the batch's key range only.
    /// Also returns, per live change, whether its key holds a tombstone (in force or not).
    async fn live_changes(
        &self,
        winners: &RecordBatch,
        key: &PrimaryKey,
        numbered_deletes: bool,
        now: i64,
    ) -> Result<(RecordBatch, BooleanArray), DeltaError> {
        let tombstones = self.tombstones.as_ref().filter(|t| t.version() > 0);
        let rows = numbered_deletes && self.version() > 0;
        if winners.num_rows() == 0 || (tombstones.is_none() && !rows) {
            let none = BooleanArray::from(vec![false; winners.num_rows()]);
            return Ok((winners.clone(), none));
        }
        let ctx = SessionContext::new();
        let range = key_range(&ctx, winners, key).await?;
        let seq = Expr::Column(plain(CHANGE_SEQUENCE_NUMBER));
        let alias = |side: &str, c: &str| format!("__{side}_{c}");
        let key_of = |side: &str| -> Vec<Expr> {
            key.columns
                .iter()
                .map(|c| Expr::Column(plain(c)).alias(alias(side, c)))
                .collect()
        };
        let left: Vec<&str> = key.columns.iter().map(String::as_str).collect();
        let mut df = ctx.read_batch(winners.clone())?;
        let mut keep = lit(true);
        let mut had = lit(false);
        if let Some(t) = tombstones {
            // Every tombstone of the range, with whether it is still in force.
            let in_force = if t.has_deleted_at() {
                let at = Expr::Column(plain(DELETED_AT));
                at.clone()
                    .is_null()
                    .or(at.gt_eq(timestamp(self.cutoff(now))))
            } else {
                lit(true)
            };
            let mut columns = key_of("tomb");
            columns.push(seq.clone().alias(alias("tomb", "seq")));
            columns.push(in_force.alias(alias("tomb", "in_force")));
            let found = t.read_keys(&ctx, &range, columns).await?;
            let right_names: Vec<String> = key.columns.iter().map(|c| alias("tomb", c)).collect();
            let right: Vec<&str> = right_names.iter().map(String::as_str).collect();
            df = df.join(found, JoinType::Left, &left, &right, None)?;
            let dead = Expr::Column(plain(&alias("tomb", "seq")));
            let in_force = Expr::Column(plain(&alias("tomb", "in_force")));
            keep = keep.and(
                dead.clone()
                    .is_null()
                    .or(in_force.not())
                    .or(or_zero(seq.clone()).gt_eq(dead.clone())),
            );
            had = dead.is_not_null();
        }
        if rows {
            let mut columns = key_of("row");
            columns.push(or_zero(seq.clone()).alias(alias("row", "seq")));
            let found = self.read_keys(&ctx, &range, columns).await?;
            let right_names: Vec<String> = key.columns.iter().map(|c| alias("row", c)).collect();
            let right: Vec<&str> = right_names.iter().map(String::as_str).collect();
            df = df.join(found, JoinType::Left, &left, &right, None)?;
            let row = Expr::Column(plain(&alias("row", "seq")));
            keep = keep.and(
                row.clone()
                    .is_null()
                    .or(Expr::Column(plain(CHANGE_TYPE)).eq(lit("UPSERT")))
                    .or(or_zero(seq.clone()).gt_eq(row)),
            );
        }
        let mut columns: Vec<Expr> = winners
            .schema()
            .fields()
            .iter()
            .map(|f| Expr::Column(plain(f.name())))
            .collect();
        columns.push(had.alias(HAD_TOMBSTONE));
        let got = df.filter(keep)?.select(columns)?.collect().await?;
        let mut fields: Vec<Arc<Field>> = winners.schema().fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(HAD_TOMBSTONE, DataType::Boolean, true)));
        let mut all = concat_batches(&Arc::new(Schema::new(fields)), &got)?;
        let had = all
            .remove_column(all.num_columns() - 1)
            .as_boolean()
            .clone();
        Ok((all, had))
    }

    /// Tombstones (on the tombstone table): a live DELETE with a number above 0 adds its key or
    /// sets its number and time; any other live change of a key that holds one removes it (an
    /// UPSERT brings the row back; a DELETE numbered 0 needs none: no number is below it).
    async fn record_deletes(
        &mut self,
        live: &RecordBatch,
        had_tombstone: &BooleanArray,
        key: &PrimaryKey,
        props: &WriterProperties,
        now: i64,
    ) -> Result<(), DeltaError> {
        let ct = live
            .column_by_name(CHANGE_TYPE)
            .expect("a change batch")
            .as_string::<i32>();
        let seq = live
            .column_by_name(CHANGE_SEQUENCE_NUMBER)
            .expect("a change batch")
            .as_string::<i32>();
        let tombstone = |i: usize| {
            ct.value(i) == "DELETE" && seq.is_valid(i) && seq.value(i) > crate::table::cdc::ZERO
        };
        let touched = BooleanArray::from(
            (0..live.num_rows())
                .map(|i| tombstone(i) || had_tombstone.value(i))
                .collect::<Vec<_>>(),
        );
        if touched.true_count() == 0 {
            return Ok(());
        }
        let source = deltalake_core::arrow::compute::filter_record_batch(live, &touched)?;
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
        let mut fields: Vec<Arc<Field>> = source.schema().fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(
            DELETED_AT,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        )));
        let mut columns = source.columns().to_vec();
        columns.push(Arc::new(
            TimestampMicrosecondArray::from(vec![now; source.num_rows()]).with_timezone("UTC"),
        ));
        let source = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
        let s = |c: &str| column(SOURCE, c);
        let numbered = s(CHANGE_SEQUENCE_NUMBER)
            .is_not_null()
            .and(s(CHANGE_SEQUENCE_NUMBER).gt(lit(crate::table::cdc::ZERO)));
        let delete = s(CHANGE_TYPE).eq(lit("DELETE")).and(numbered);
        let legacy = !self.has_deleted_at();
        let (table, _) = self
            .merge_builder(source, key, props)?
            .with_merge_schema(legacy)
            .when_matched_update(|u| {
                u.predicate(delete.clone())
                    .update(plain(CHANGE_SEQUENCE_NUMBER), s(CHANGE_SEQUENCE_NUMBER))
                    .update(plain(DELETED_AT), s(DELETED_AT))
            })
            .and_then(|m| m.when_matched_delete(|d| d.predicate(delete.clone().not())))
            .and_then(|m| {
                m.when_not_matched_insert(|i| {
                    key.columns
                        .iter()
                        .map(String::as_str)
                        .chain([CHANGE_SEQUENCE_NUMBER, DELETED_AT])
                        .fold(i.predicate(delete.clone()), |i, c| i.set(plain(c), s(c)))
                })
            })
            .map_err(|e| self.delta_err(e))?
            .await
            .map_err(|e| self.delta_err(e))?;
        self.table = table;
        Ok(())
    }

    /// Remove the tombstones past the retention window from the tombstone table (they stopped
    /// counting at once: [`DeltaTable::live_changes`] reads only the ones in force), at most
    /// every eighth of the window. Housekeeping: a failure is logged and tried again later.
    async fn expire_tombstones(&mut self) {
        let every = (self.delete_retention / 8).max(Duration::from_millis(100));
        let Some(t) = self.tombstones.as_mut() else {
            return;
        };
        if t.version() == 0
            || !t.has_deleted_at()
            || t.expired_at.is_some_and(|at| at.elapsed() < every)
        {
            return;
        }
        t.expired_at = Some(std::time::Instant::now());
        t.delete_retention = self.delete_retention;
        let cutoff = t.cutoff(chrono::Utc::now().timestamp_micros());
        let at = Expr::Column(plain(DELETED_AT));
        match t
            .table
            .clone()
            .delete()
            .with_predicate(at.lt(timestamp(cutoff)))
            .await
        {
            Ok((table, m)) => {
                t.table = table;
                if let Some(n) = m.num_deleted_rows.filter(|n| *n > 0) {
                    tracing::debug!(table = %self.url, expired = n, "tombstones past the retention window removed");
                }
            }
            Err(e) => {
                tracing::warn!(table = %self.url, error = %e, "expiring tombstones failed; tried again later");
                let _ = t.reload().await;
            }
        }
    }

    /// The tombstone table's rows: all of them, and the ones in force (inside the retention
    /// window). `None` when the table has no tombstone table (yet).
    pub async fn tombstone_rows(
        &mut self,
        key: &PrimaryKey,
    ) -> Result<Option<(usize, usize)>, DeltaError> {
        if self.tombstones.is_none() && !DeltaTable::has_log(&folder(&self.dest, TOMBSTONES)).await
        {
            return Ok(None);
        }
        let retention = self.delete_retention;
        let t = self.tombstones(key).await?;
        t.reload().await?;
        t.delete_retention = retention;
        let cutoff = t.cutoff(chrono::Utc::now().timestamp_micros());
        let in_force = if t.has_deleted_at() {
            let at = Expr::Column(plain(DELETED_AT));
            at.clone().is_null().or(at.gt_eq(timestamp(cutoff)))
        } else {
            lit(true)
        };
        let got = t
            .read_keys(
                &SessionContext::new(),
                &lit(true),
                vec![in_force.alias("in_force")],
            )
            .await?
            .collect()
            .await?;
        let all = got.iter().map(RecordBatch::num_rows).sum();
        let live = got
            .iter()
            .map(|b| b.column(0).as_boolean().true_count())
            .sum();
        Ok(Some((all, live)))
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
        let target = super::form::delta_arrow_schema(&rest.schema())?;
        let table_rows = to_delta_batch(&rest, &target)?;
        let mut fields: Vec<Arc<Field>> = table_rows.schema().fields().iter().cloned().collect();
        fields.push(live.schema().field(ct_index).clone().into());
        let mut columns = table_rows.columns().to_vec();
        columns.push(live.column(ct_index).clone());
        let source = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
        let s = |c: &str| column(SOURCE, c);
        let t = |c: &str| column(TARGET, c);
        // The changes left are the winners; the number guards against a newer row committed
        // meanwhile (no number counts as 0).
        let newer = or_zero(s(CHANGE_SEQUENCE_NUMBER)).gt_eq(or_zero(t(CHANGE_SEQUENCE_NUMBER)));
        let names: Vec<String> = target.fields().iter().map(|f| f.name().clone()).collect();
        let now = chrono::Utc::now().timestamp_millis();
        let commit = CommitProperties::default()
            .with_max_retries(super::table::MAX_COMMIT_RETRIES)
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

/// `e`, or the number 0 where it is NULL (a change or row without a number).
fn or_zero(e: Expr) -> Expr {
    when(e.clone().is_null(), lit(crate::table::cdc::ZERO))
        .otherwise(e)
        .expect("a CASE with one branch")
}

/// A UTC timestamp literal of `micros` since the epoch.
fn timestamp(micros: i64) -> Expr {
    lit(ScalarValue::TimestampMicrosecond(
        Some(micros),
        Some("UTC".into()),
    ))
}

/// The DELETEs of `winners` with a number above 0 (the ones that leave a tombstone when they
/// win).
fn numbered_deletes(winners: &RecordBatch) -> usize {
    let (Some(ct), Some(seq)) = (
        winners.column_by_name(CHANGE_TYPE),
        winners.column_by_name(CHANGE_SEQUENCE_NUMBER),
    ) else {
        return 0;
    };
    let (ct, seq) = (ct.as_string::<i32>(), seq.as_string::<i32>());
    (0..winners.num_rows())
        .filter(|&i| {
            ct.value(i) == "DELETE" && seq.is_valid(i) && seq.value(i) > crate::table::cdc::ZERO
        })
        .count()
}

/// `min(k) <= k <= max(k)` for every key column `k`, the bounds from `winners`: a predicate
/// that skips the files (and row groups) of a table that hold none of the batch's keys.
async fn key_range(
    ctx: &SessionContext,
    winners: &RecordBatch,
    key: &PrimaryKey,
) -> Result<Expr, DeltaError> {
    use deltalake_core::datafusion::functions_aggregate::expr_fn::{max, min};
    let aggs: Vec<Expr> = key
        .columns
        .iter()
        .flat_map(|c| {
            let e = Expr::Column(plain(c));
            [min(e.clone()), max(e)]
        })
        .collect();
    let got = ctx
        .read_batch(winners.clone())?
        .aggregate(vec![], aggs)?
        .collect()
        .await?;
    let row = got.first().filter(|b| b.num_rows() == 1);
    let mut range = lit(true);
    for (i, c) in key.columns.iter().enumerate() {
        let bound = |j: usize| {
            row.map(|b| ScalarValue::try_from_array(b.column(j), 0))
                .transpose()
        };
        if let (Some(lo), Some(hi)) = (bound(2 * i)?, bound(2 * i + 1)?) {
            if lo.is_null() || hi.is_null() {
                continue;
            }
            let e = Expr::Column(plain(c));
            range = range.and(e.clone().gt_eq(lit(lo))).and(e.lt_eq(lit(hi)));
        }
    }
    Ok(range)
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

/// The folder `name` under `dest`'s root, as a destination of its own (a local folder is made).
fn child(dest: &Destination, name: &str) -> Result<Destination, DeltaError> {
    let sub = folder(dest, name);
    if let Some(dir) = url::Url::parse(&sub.url)
        .ok()
        .filter(|u| u.scheme() == "file")
        .and_then(|u| u.to_file_path().ok())
    {
        std::fs::create_dir_all(&dir).map_err(|e| DeltaError::Upload {
            url: sub.url.clone(),
            path: name.to_string(),
            source: object_store::Error::Generic {
                store: "local",
                source: Box::new(e),
            },
        })?;
    }
    Ok(sub)
}

/// The folder `name` under `dest`'s root, as a destination of its own, as it is (a local folder
/// is not made).
pub(super) fn folder(dest: &Destination, name: &str) -> Destination {
    Destination {
        store: Arc::new(object_store::prefix::PrefixStore::new(
            dest.store.clone(),
            name,
        )),
        url: format!("{}/{name}", dest.url.trim_end_matches('/')),
        supports_attributes: dest.supports_attributes,
    }
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
                r#"{"id":1,"name":"a","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"5"}"#,
                r#"{"id":1,"name":"older","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"4"}"#,
                r#"{"id":2,"name":"b","_CHANGE_TYPE":"UPSERT"}"#,
                r#"{"id":2,"name":"b2","_CHANGE_TYPE":"UPSERT"}"#,
                r#"{"id":3,"name":"c","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"1/0"}"#,
                r#"{"id":3,"_CHANGE_TYPE":"DELETE","_CHANGE_SEQUENCE_NUMBER":"1"}"#,
                r#"{"id":4,"name":"d","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"A"}"#,
                r#"{"id":4,"name":"d-unnumbered","_CHANGE_TYPE":"UPSERT"}"#,
                r#"{"id":5,"name":"zero","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"0"}"#,
                r#"{"id":5,"name":"e-unnumbered","_CHANGE_TYPE":"UPSERT"}"#,
            ],
        );
        let w = last_changes(&rows.schema(), &[b], &key).unwrap();
        let names = w.column_by_name("name").unwrap().as_string::<i32>();
        let types = w.column_by_name(CHANGE_TYPE).unwrap().as_string::<i32>();
        let got: Vec<_> = (0..w.num_rows())
            .map(|i| (types.value(i), names.is_valid(i).then(|| names.value(i))))
            .collect();
        // Arrival order kept; an equal number ("1/0" = "1"): the later one; no number is 0: the
        // later of two without, never over a number above 0, over an equal "0".
        assert_eq!(
            got,
            [
                ("UPSERT", Some("a")),
                ("UPSERT", Some("b2")),
                ("DELETE", None),
                ("UPSERT", Some("d")),
                ("UPSERT", Some("e-unnumbered")),
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
                r#"{"id":1,"name":"a","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"3"}"#,
                r#"{"id":2,"name":"b","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"1"}"#,
                r#"{"id":2,"_CHANGE_TYPE":"DELETE","_CHANGE_SEQUENCE_NUMBER":"5"}"#,
                r#"{"id":3,"name":"c","_CHANGE_TYPE":"UPSERT"}"#,
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
                r#"{"id":1,"name":"stale","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"2"}"#,
                r#"{"id":2,"name":"zombie","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"4"}"#,
                r#"{"id":3,"name":"c2","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"1"}"#,
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
                r#"{"id":2,"name":"back","_CHANGE_TYPE":"UPSERT","_CHANGE_SEQUENCE_NUMBER":"6"}"#,
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
