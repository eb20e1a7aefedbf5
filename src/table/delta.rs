//! Committing Parquet files as a Delta Lake table on any object store, through the `deltalake-core`
//! crate (only its `rustls` feature: no datafusion, no cloud credential stack of its own).
//!
//! A commit uploads its Parquet files first (single puts: whole objects or nothing, and invisible to
//! readers, who only see files an `add` action in `_delta_log` names), then writes the next log
//! version with put-if-not-exists (`PutMode::Create`). When another writer took that version,
//! deltalake reloads the log, checks the two transactions for conflicts (blind appends never
//! conflict) and tries the next version, so concurrent writers never lose a commit. After a commit
//! deltalake writes a checkpoint every `delta.checkpointInterval` versions (100 unless the table
//! says otherwise); a failure there does not fail the commit, which has already landed.
//!
//! The table lives at the root of the [`Destination`]'s store (a `file://` directory, an
//! `s3://bucket/prefix`, …); deltalake is handed that store directly, so credentials and endpoints
//! come from the same place as every other subsink write.
//!
//! Arrow → Delta types (decisions where Delta has no equivalent of a BigQuery type):
//!
//! | Arrow (from [`super::schema`]) | Delta |
//! |---|---|
//! | `Utf8`, `Binary`, `Int64`, `Float64`, `Boolean`, `Date32` | `string`, `binary`, `long`, `double`, `boolean`, `date` |
//! | `Decimal128(38, 9)` (NUMERIC) | `decimal(38,9)` |
//! | `Decimal256(76, 38)` (BIGNUMERIC) | `string`: the exact decimal text with all 38 fraction digits, `-1.50000000000000000000000000000000000000`, over BigQuery's whole range ±5.789…×10^38 (Delta decimals stop at precision 38, and a BIGNUMERIC needs up to 77 digits) |
//! | `Time64(µs)` (TIME) | `string` `HH:MM:SS`, `HH:MM:SS.fff` or `HH:MM:SS.ffffff` (Arrow's cast; Delta has no time-of-day type) |
//! | `Timestamp(µs, UTC)` (TIMESTAMP) | `timestamp` |
//! | `Timestamp(µs)` (DATETIME) | `timestamp_ntz` (reader 3 / writer 7, feature `timestampNtz`) |
//! | `Utf8` + `arrow.json` extension (JSON) | `string` (the extension metadata is dropped) |
//! | `Struct` / `List` | `struct` / `array` |

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Fields, Schema, SchemaRef, TimeUnit};
use deltalake_core::kernel::engine::arrow_conversion::TryFromArrow;
use deltalake_core::kernel::transaction::{
    CommitBuilder, CommitConflictError, CommitProperties, TransactionError,
};
use deltalake_core::kernel::{Action, StructType, Transaction};
use deltalake_core::logstore::{default_logstore, LogStoreRef, StorageConfig};
use deltalake_core::operations::create::CreateBuilder;
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::DeltaTableError;
use object_store::path::Path;
use object_store::ObjectStoreExt;

use super::parquet::ParquetFile;
use super::stats::{add_action, StatsColumns};
use crate::upload::Destination;

/// Errors of the Delta committer.
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    /// A column whose type cannot be a Delta column.
    #[error("Delta table: column `{column}`: {reason}")]
    Schema { column: String, reason: String },
    /// The table exists with another schema.
    #[error("Delta table at {url}: its schema differs from what subsink would write: {diff}")]
    SchemaMismatch { url: String, diff: String },
    /// While running: another writer changed the table's metadata (its schema) after the
    /// snapshot a commit built on; the handle has reloaded the log, nothing was committed.
    #[error("Delta table at {url}: its metadata (schema) changed under the commit; reloaded")]
    MetadataChanged { url: String },
    /// The table's partition columns do not fit the configuration or the rows.
    #[error("Delta table at {url}: partitions: {reason}")]
    Partitioning { url: String, reason: String },
    #[error("Delta table at {url}: {source}")]
    Delta {
        url: String,
        #[source]
        source: DeltaTableError,
    },
    #[error("Delta table at {url}: data file {path:?} not uploaded: {source}")]
    Upload {
        url: String,
        path: String,
        #[source]
        source: object_store::Error,
    },
    /// The store cannot do atomic put-if-absent, on which concurrent commits depend.
    #[error("Delta table at {url}: the store cannot be used for tables: {reason}; Delta commits need an atomic put-if-absent so that two writers never both take one log version (for S3-compatible servers: one that honours `If-None-Match: *`, with AWS_CONDITIONAL_PUT unset or `etag`)")]
    NoPutIfAbsent { url: String, reason: String },
    #[error("Delta table: batch does not fit the table schema: {0}")]
    Arrow(#[from] ArrowError),
    /// Change data capture: planning or running the MERGE's reads.
    #[error("Delta table: MERGE of changes: {0}")]
    Merge(#[from] deltalake_core::datafusion::error::DataFusionError),
    /// `--exactly-once` with a positioned source: the table already holds a stream partition's
    /// records from this commit's first offset on (another worker wrote them: a rebalance), so
    /// this commit would write them twice.
    #[error("Delta table at {url}: txn {app_id:?} is at version {table}, and this commit starts at offset {first}: its records are in the table already (written by another worker of the group); not committed")]
    TxnAhead {
        url: String,
        app_id: String,
        table: i64,
        first: i64,
    },
}

/// One `txn` action of a commit: the stream partition `app_id`
/// ([`crate::position::StreamKey::app_id`]) is in the table up to
/// offset `version` (its last record in the commit). The commit holds the partition's records
/// from offset `first` on, and is refused ([`DeltaError::TxnAhead`]) when the table's version for
/// `app_id` is `first` or more already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppTxn {
    pub app_id: String,
    pub version: i64,
    pub first: i64,
}

impl AppTxn {
    /// The `txn` actions of `txns`, stamped `now` (milliseconds since the epoch).
    pub(super) fn actions(txns: &[AppTxn], now: i64) -> Vec<Transaction> {
        txns.iter()
            .map(|t| Transaction::new_with_last_update(&t.app_id, t.version, Some(now)))
            .collect()
    }
}

/// A Parquet file to commit: its path relative to the table root, and the file itself.
#[derive(Debug, Clone)]
pub struct DataFile {
    pub path: String,
    pub file: ParquetFile,
    /// A partitioned table's partition values of the file (Delta's serialization, NULL as
    /// `None`; [`super::partition`]); empty for an unpartitioned table.
    pub partition_values: HashMap<String, Option<String>>,
}

impl DataFile {
    /// A data file with a fresh unique name at the table root
    /// (`part-00000-<uuid>-c000.zstd.parquet`, Spark's naming).
    pub fn new(file: ParquetFile) -> DataFile {
        DataFile {
            path: new_data_file_name(),
            file,
            partition_values: HashMap::new(),
        }
    }
}

/// A fresh, unique data file name at the table root.
pub fn new_data_file_name() -> String {
    format!("part-00000-{}-c000.zstd.parquet", uuid::Uuid::new_v4())
}

/// The Arrow schema of the Parquet files of a Delta table holding rows of `schema` (see the module
/// table): BIGNUMERIC and TIME become strings, JSON extension metadata is dropped.
pub fn delta_arrow_schema(schema: &Schema) -> Result<SchemaRef, DeltaError> {
    let fields = schema
        .fields()
        .iter()
        .map(|f| delta_field(f, &f.name().to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

fn delta_field(f: &Field, path: &str) -> Result<Field, DeltaError> {
    Ok(Field::new(
        f.name(),
        delta_type(f.data_type(), path)?,
        f.is_nullable(),
    ))
}

fn delta_type(ty: &DataType, path: &str) -> Result<DataType, DeltaError> {
    Ok(match ty {
        DataType::Utf8
        | DataType::Binary
        | DataType::Int64
        | DataType::Float64
        | DataType::Boolean
        | DataType::Date32 => ty.clone(),
        DataType::Decimal128(p, s) if *p <= 38 => DataType::Decimal128(*p, *s),
        DataType::Decimal256(..) | DataType::Time64(TimeUnit::Microsecond) => DataType::Utf8,
        DataType::Timestamp(TimeUnit::Microsecond, None) => ty.clone(),
        DataType::Timestamp(TimeUnit::Microsecond, Some(tz)) if tz.as_ref() == "UTC" => ty.clone(),
        DataType::Struct(fields) => DataType::Struct(Fields::from(
            fields
                .iter()
                .map(|f| delta_field(f, &format!("{path}.{}", f.name())))
                .collect::<Result<Vec<_>, _>>()?,
        )),
        DataType::List(item) => DataType::List(FieldRef::new(delta_field(item, path)?)),
        other => {
            return Err(DeltaError::Schema {
                column: path.to_string(),
                reason: format!("Arrow type {other} has no Delta equivalent"),
            })
        }
    })
}

/// Cast a batch of the mapping core's schema to `delta_schema` (from [`delta_arrow_schema`]).
pub fn to_delta_batch(
    batch: &RecordBatch,
    delta_schema: &SchemaRef,
) -> Result<RecordBatch, DeltaError> {
    let columns = batch
        .columns()
        .iter()
        .zip(delta_schema.fields().iter())
        .map(|(col, f)| to_delta_array(col, f.data_type()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(delta_schema.clone(), columns)?)
}

/// One column in its Delta type, RECORD fields and REPEATED items included.
///
/// * BIGNUMERIC as text by hand: arrow's decimal formatting keeps at most the type's 76 digits,
///   and BigQuery's range needs 77 at its bounds (±5.789…×10^38).
/// * TIME as text by hand: arrow's cast formats every value through chrono's `Debug` (3% of a
///   run's CPU); the same text, checked against it in a test.
/// * Everything else through arrow's cast.
fn to_delta_array(col: &ArrayRef, to: &DataType) -> Result<ArrayRef, ArrowError> {
    use arrow_array::{Array, ListArray, StructArray};
    if col.data_type() == to {
        return Ok(col.clone());
    }
    let any = col.as_any();
    match to {
        DataType::Utf8 => {
            if let Some(d) = any.downcast_ref::<arrow_array::Decimal256Array>() {
                return Ok(Arc::new(bignumeric_text(d)));
            }
            if let Some(t) = any.downcast_ref::<arrow_array::Time64MicrosecondArray>() {
                if let Some(text) = time_text(t) {
                    return Ok(Arc::new(text));
                }
            }
        }
        DataType::Struct(fields) => {
            if let Some(st) = any.downcast_ref::<StructArray>() {
                let children = st
                    .columns()
                    .iter()
                    .zip(fields.iter())
                    .map(|(c, f)| to_delta_array(c, f.data_type()))
                    .collect::<Result<Vec<_>, _>>()?;
                return Ok(Arc::new(StructArray::try_new(
                    fields.clone(),
                    children,
                    st.nulls().cloned(),
                )?));
            }
        }
        DataType::List(item) => {
            if let Some(l) = any.downcast_ref::<ListArray>() {
                let values = to_delta_array(l.values(), item.data_type())?;
                return Ok(Arc::new(ListArray::try_new(
                    item.clone(),
                    l.offsets().clone(),
                    values,
                    l.nulls().cloned(),
                )?));
            }
        }
        _ => {}
    }
    arrow_cast::cast(col, to)
}

/// BIGNUMERIC (unscaled at scale 38) as its exact decimal text with all 38 fraction digits,
/// `-1.50000000000000000000000000000000000000`, for any 256-bit value.
fn bignumeric_text(a: &arrow_array::Decimal256Array) -> arrow_array::StringArray {
    use arrow_array::Array;
    use std::fmt::Write as _;
    let scale = match a.data_type() {
        DataType::Decimal256(_, s) => (*s).max(0) as usize,
        _ => 38,
    };
    let mut out = arrow_array::builder::StringBuilder::with_capacity(a.len(), a.len() * 41);
    let mut digits = String::with_capacity(80);
    let mut text = String::with_capacity(82);
    for i in 0..a.len() {
        if a.is_null(i) {
            out.append_null();
            continue;
        }
        digits.clear();
        let _ = write!(digits, "{}", a.value(i));
        let (sign, abs) = match digits.strip_prefix('-') {
            Some(d) => ("-", d),
            None => ("", digits.as_str()),
        };
        text.clear();
        text.push_str(sign);
        if abs.len() <= scale {
            text.push('0');
            if scale > 0 {
                text.push('.');
                text.extend(std::iter::repeat_n('0', scale - abs.len()));
                text.push_str(abs);
            }
        } else {
            let (int, frac) = abs.split_at(abs.len() - scale);
            text.push_str(int);
            if scale > 0 {
                text.push('.');
                text.push_str(frac);
            }
        }
        out.append_value(&text);
    }
    out.finish()
}

/// TIME (µs since midnight) as the text arrow's cast gives it (chrono's `NaiveTime` form):
/// `HH:MM:SS`, then `.mmm` when the value has whole milliseconds, else `.uuuuuu`. `None` when a
/// value is not a time of day (the cast then decides).
fn time_text(a: &arrow_array::Time64MicrosecondArray) -> Option<arrow_array::StringArray> {
    use arrow_array::Array;
    const DAY: i64 = 86_400_000_000;
    let mut out = arrow_array::builder::StringBuilder::with_capacity(a.len(), a.len() * 15);
    let mut buf = [0u8; 15];
    let digits = |buf: &mut [u8], mut v: i64| {
        for b in buf.iter_mut().rev() {
            *b = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    for i in 0..a.len() {
        if a.is_null(i) {
            out.append_null();
            continue;
        }
        let v = a.value(i);
        if !(0..DAY).contains(&v) {
            return None;
        }
        let (secs, micros) = (v / 1_000_000, v % 1_000_000);
        digits(&mut buf[0..2], secs / 3600);
        buf[2] = b':';
        digits(&mut buf[3..5], secs / 60 % 60);
        buf[5] = b':';
        digits(&mut buf[6..8], secs % 60);
        let len = if micros == 0 {
            8
        } else if micros % 1000 == 0 {
            buf[8] = b'.';
            digits(&mut buf[9..12], micros / 1000);
            12
        } else {
            buf[8] = b'.';
            digits(&mut buf[9..15], micros);
            15
        };
        // ASCII digits and separators only.
        out.append_value(std::str::from_utf8(&buf[..len]).expect("ASCII"));
    }
    Some(out.finish())
}

/// How many times a commit tries the next log version after other writers took it. Appends never
/// conflict, so this only bounds how long a commit can be starved by faster writers.
pub const MAX_COMMIT_RETRIES: usize = 1000;

/// Reloads of the log after a listed but unreadable version (see [`DeltaTable::commit`]).
const MAX_RELOADS: usize = 20;

/// A handle on one Delta table: its log store and the last snapshot this writer saw.
pub struct DeltaTable {
    pub(super) url: String,
    pub(super) dest: Destination,
    pub(super) table: deltalake_core::DeltaTable,
    pub(super) schema: SchemaRef,
    /// The table's partition columns (its metadata's), in order.
    pub(super) partition_columns: Vec<String>,
    /// Change data capture: the tombstone table, once opened ([`super::merge`]).
    pub(super) tombstones: Option<Box<DeltaTable>>,
    /// How long a tombstone keeps older changes of its key out (`--table-delete-retention`).
    pub(super) delete_retention: std::time::Duration,
    /// On a tombstone table: when its expired tombstones were last removed.
    pub(super) expired_at: Option<std::time::Instant>,
}

impl std::fmt::Debug for DeltaTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaTable")
            .field("url", &self.url)
            .field("version", &self.version())
            .finish()
    }
}

pub(crate) fn log_store(dest: &Destination) -> LogStoreRef {
    // deltalake reads the log through `dest.store` (rooted at the table) and hands its kernel a
    // "root" store that it addresses with full URLs. A local directory gets its real `file://` URL
    // and a store rooted at `/`: the kernel sorts local listings only for `file` URLs. Every other
    // store is addressed as the root of `memory:///`, the name deltalake sees for `dest.store`;
    // their listings are lexicographic already (S3, GCS, Azure, in-memory).
    if dest.url.starts_with("file:") {
        if let Some(dir) = url::Url::parse(&dest.url)
            .ok()
            .and_then(|u| u.to_file_path().ok())
            .and_then(|p| std::fs::canonicalize(p).ok())
        {
            if let Ok(location) = url::Url::from_directory_path(&dir) {
                return default_logstore(
                    dest.store.clone(),
                    Arc::new(object_store::local::LocalFileSystem::new()),
                    &location,
                    &StorageConfig::default(),
                );
            }
        }
    }
    let location = url::Url::parse("memory:///").expect("a valid URL");
    default_logstore(
        dest.store.clone(),
        dest.store.clone(),
        &location,
        &StorageConfig::default(),
    )
}

impl DeltaTable {
    /// Open the Delta table at the root of `dest`, or create it (version 0: protocol and
    /// metadata) with the Delta form of `schema` (the mapping core's Arrow schema). An existing
    /// table must have the same columns and types.
    pub async fn open_or_create(
        dest: &Destination,
        schema: &Schema,
    ) -> Result<DeltaTable, DeltaError> {
        Self::open_or_create_with_properties(dest, schema, &[]).await
    }

    /// [`DeltaTable::open_or_create`], setting Delta table properties (`delta.checkpointInterval`,
    /// `delta.appendOnly`, `delta.logRetentionDuration`, …) when this call creates the table; an
    /// existing table keeps its own.
    pub async fn open_or_create_with_properties(
        dest: &Destination,
        schema: &Schema,
        properties: &[(&str, &str)],
    ) -> Result<DeltaTable, DeltaError> {
        Self::open_or_create_partitioned(dest, schema, &[], "", properties).await
    }

    /// [`DeltaTable::open_or_create_with_properties`], creating a table partitioned by
    /// `partition_columns` (columns of `schema`; made by the configured `partition_by`) when this
    /// call creates it. An existing table keeps its own partition columns, which must be those
    /// when any are given; its columns must take `schema` ([`super::existing`]).
    pub async fn open_or_create_partitioned(
        dest: &Destination,
        schema: &Schema,
        partition_columns: &[String],
        partition_by: &str,
        properties: &[(&str, &str)],
    ) -> Result<DeltaTable, DeltaError> {
        let url = dest.url.clone();
        let delta_schema = delta_arrow_schema(schema)?;
        let struct_type =
            StructType::try_from_arrow(delta_schema.as_ref()).map_err(|e| DeltaError::Schema {
                column: "$".into(),
                reason: e.to_string(),
            })?;
        let delta_err = |source| DeltaError::Delta {
            url: url.clone(),
            source,
        };
        crate::upload::check_put_if_absent(dest)
            .await
            .map_err(|reason| DeltaError::NoPutIfAbsent {
                url: url.clone(),
                reason,
            })?;
        let store = log_store(dest);
        let mut table = deltalake_core::DeltaTable::new(store.clone());
        // No log yet: create without a load, which would log an error for the missing log.
        let loaded = if Self::has_log(dest).await {
            table.load().await
        } else {
            Err(DeltaTableError::NotATable("no _delta_log".into()))
        };
        match loaded {
            Ok(()) => {}
            Err(DeltaTableError::NotATable(_)) => {
                let created = CreateBuilder::new()
                    .with_log_store(store.clone())
                    .with_columns(struct_type.fields().cloned())
                    .with_partition_columns(partition_columns.to_vec())
                    .with_save_mode(SaveMode::Ignore)
                    .with_configuration(properties.iter().map(|(k, v)| (*k, Some(*v))))
                    // No retry: when another writer creates the table first, deltalake would
                    // retry the create as version 1 (a second protocol + metadata commit); use
                    // theirs instead.
                    .with_commit_properties(CommitProperties::default().with_max_retries(0))
                    .await;
                match created {
                    Ok(t) => table = t,
                    // Another writer created it at the same moment: use theirs.
                    Err(_) if Self::exists(&store).await => {
                        table = deltalake_core::DeltaTable::new(store.clone());
                        table.load().await.map_err(delta_err)?;
                    }
                    Err(e) => return Err(delta_err(e)),
                }
            }
            Err(e) => return Err(delta_err(e)),
        }
        let snapshot = table.snapshot().map_err(delta_err)?;
        let writes = super::existing::Writes {
            columns: &struct_type,
            partition_columns,
            partition_by,
        };
        let partitioned_by = snapshot.metadata().partition_columns();
        use super::existing::{check, Misfit};
        check(&snapshot.schema(), partitioned_by, &writes).map_err(|m| match m {
            Misfit::Partitions(reason) => DeltaError::Partitioning {
                url: url.clone(),
                reason,
            },
            Misfit::Columns(diff) => DeltaError::SchemaMismatch {
                url: url.clone(),
                diff,
            },
        })?;
        let partition_columns = snapshot.metadata().partition_columns().to_vec();
        Ok(DeltaTable {
            url,
            dest: dest.clone(),
            table,
            schema: delta_schema,
            partition_columns,
            tombstones: None,
            delete_retention: super::cdc::DEFAULT_DELETE_RETENTION,
            expired_at: None,
        })
    }

    /// Does the table root hold any `_delta_log/` entry?
    pub(super) async fn has_log(dest: &Destination) -> bool {
        use futures::StreamExt;
        let prefix = Path::from("_delta_log");
        let mut list = dest.store.list(Some(&prefix));
        // A listing error means "cannot tell": let the load report it.
        list.next().await.is_some()
    }

    async fn exists(store: &LogStoreRef) -> bool {
        let mut t = deltalake_core::DeltaTable::new(store.clone());
        t.load().await.is_ok()
    }

    /// Is the data file `path` (relative to the table root) in the table's newest version? Used
    /// when resuming: a file the previous run uploaded but never committed is not.
    pub async fn contains_file(&mut self, path: &str) -> Result<bool, DeltaError> {
        let delta_err = |source| DeltaError::Delta {
            url: self.url.clone(),
            source,
        };
        self.table.update_state().await.map_err(delta_err)?;
        let snapshot = self.table.snapshot().map_err(delta_err)?;
        // A partitioned table's batch is one file per partition, each `<folder>/<path>`.
        let nested = format!("/{path}");
        let found = snapshot.log_data().into_iter().any(|f| {
            let p = f.object_store_path();
            p.as_ref() == path || p.as_ref().ends_with(&nested)
        });
        Ok(found)
    }

    /// The Arrow schema of this table's columns (its Parquet files' columns, and the partition
    /// columns); see [`to_delta_batch`].
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The table's partition columns, in order (empty: unpartitioned).
    pub fn partition_columns(&self) -> &[String] {
        &self.partition_columns
    }

    /// The table's columns (Delta's form) in the snapshot this handle holds.
    pub fn columns(&self) -> Result<Arc<StructType>, DeltaError> {
        Ok(self
            .table
            .snapshot()
            .map_err(|e| self.delta_err(e))?
            .schema())
    }

    /// The last version this handle committed or loaded.
    pub fn version(&self) -> i64 {
        self.table.version().map(|v| v as i64).unwrap_or(-1)
    }

    /// `txns`' compare-and-set ([`DeltaTable::commit_with`]): the snapshot holds each
    /// partition below the commit's first offset of it.
    pub(super) async fn txns_behind(&self, txns: &[AppTxn]) -> Result<(), DeltaError> {
        let snapshot = self.table.snapshot().map_err(|e| self.delta_err(e))?;
        for t in txns {
            let known = snapshot
                .transaction_version(self.table.log_store().as_ref(), &t.app_id)
                .await
                .map_err(|e| self.delta_err(e))?;
            if let Some(v) = known.filter(|v| *v >= t.first) {
                return Err(DeltaError::TxnAhead {
                    url: self.url.clone(),
                    app_id: t.app_id.clone(),
                    table: v,
                    first: t.first,
                });
            }
        }
        Ok(())
    }

    pub(super) fn delta_err(&self, source: DeltaTableError) -> DeltaError {
        DeltaError::Delta {
            url: self.url.clone(),
            source,
        }
    }

    /// Catch up with the log (other writers' commits).
    pub async fn reload(&mut self) -> Result<(), DeltaError> {
        self.table
            .update_state()
            .await
            .map_err(|e| self.delta_err(e))
    }

    /// Upload `files` (each with a single put), then commit one log version adding all of them.
    /// Returns the committed version. On error nothing was committed: uploaded files stay
    /// unreferenced, invisible to readers (a later `VACUUM` removes them).
    pub async fn commit(&mut self, files: Vec<DataFile>) -> Result<i64, DeltaError> {
        self.commit_with(files, &[]).await
    }

    /// [`DeltaTable::commit`], with one `txn` action per entry of `txns` in the same log version
    /// (atomic with the data). Compare-and-set per application id: the snapshot the commit builds
    /// on must hold a version below each [`AppTxn::first`] (else [`DeltaError::TxnAhead`]), and
    /// deltalake's conflict check fails the commit (`ConcurrentTransaction`) when a version
    /// written after that snapshot carries a `txn` of one of the ids.
    pub async fn commit_with(
        &mut self,
        files: Vec<DataFile>,
        txns: &[AppTxn],
    ) -> Result<i64, DeltaError> {
        let now = chrono::Utc::now().timestamp_millis();
        let columns = StatsColumns::of_table(&self.table);
        let mut actions = Vec::with_capacity(files.len());
        for f in files {
            let path = Path::parse(&f.path).map_err(|e| DeltaError::Upload {
                url: self.url.clone(),
                path: f.path.clone(),
                source: e.into(),
            })?;
            let size = f.file.size() as i64;
            self.dest
                .store
                .put(&path, f.file.payload.clone())
                .await
                .map_err(|source| DeltaError::Upload {
                    url: self.url.clone(),
                    path: f.path.clone(),
                    source,
                })?;
            let add = add_action(
                f.path,
                f.partition_values,
                &f.file,
                (size, now),
                &columns,
                &self.partition_columns,
            );
            actions.push(Action::Add(add));
        }
        let delta_err = |source| DeltaError::Delta {
            url: self.url.clone(),
            source,
        };
        let operation = DeltaOperation::Write {
            mode: SaveMode::Append,
            partition_by: (!self.partition_columns.is_empty())
                .then(|| self.partition_columns.clone()),
            predicate: None,
        };
        // `From<CommitProperties>` turns on the post-commit hook: a checkpoint every
        // `delta.checkpointInterval` versions (100 by default) and expired-log cleanup per the
        // table's properties, so log replay stays short for readers and writers.
        // Two steps, so a failing post-commit hook (a checkpoint that could not be written) is not
        // mistaken for a failed commit: once the log version is written the files are in the
        // table, and reporting an error would make the caller write the rows a second time.
        let app_txns = AppTxn::actions(txns, now);
        let mut reloads = 0;
        let post = loop {
            self.txns_behind(txns).await?;
            let snapshot = self.table.snapshot().map_err(delta_err)?;
            let attempt = CommitBuilder::from(
                CommitProperties::default()
                    .with_max_retries(MAX_COMMIT_RETRIES)
                    .with_application_transactions(app_txns.clone()),
            )
            .with_actions(actions.clone())
            .build(Some(snapshot), self.table.log_store(), operation.clone())
            .into_prepared_commit_future()
            .await;
            let attempt = match attempt {
                Ok(prepared) => prepared.await,
                Err(e) => Err(e),
            };
            match attempt {
                Ok(post) => break post,
                // Another writer's version is listed but not readable yet (a store whose
                // listing runs ahead of its reads): reload the log and commit again. (Azurite's
                // InvalidVersion came from listings that ignored their offset: upload::offset.)
                Err(DeltaTableError::InvalidVersion(v)) if reloads < MAX_RELOADS => {
                    reloads += 1;
                    tracing::warn!(table = %self.url, version = v, "Delta log version not readable yet; reloading and committing again");
                    crate::telemetry::retried(crate::telemetry::RetryKind::Commit);
                    tokio::time::sleep(std::time::Duration::from_millis(100 * reloads as u64))
                        .await;
                    self.table.update_state().await.map_err(delta_err)?;
                }
                // Another writer changed the schema: the caller checks the new one.
                Err(DeltaTableError::Transaction {
                    source: TransactionError::CommitConflict(CommitConflictError::MetadataChanged),
                }) => {
                    self.table.update_state().await.map_err(delta_err)?;
                    return Err(DeltaError::MetadataChanged {
                        url: self.url.clone(),
                    });
                }
                Err(e) => return Err(delta_err(e)),
            }
        };
        let version = post.version;
        match post.await {
            Ok(finalized) => self.table.state = Some(finalized.snapshot()),
            Err(e) => {
                tracing::warn!(
                    table = %self.url,
                    version,
                    error = %e,
                    "Delta commit landed but its post-commit hook (checkpoint, log cleanup) failed"
                );
                // Catch up with the log instead; failing that, the next commit's conflict
                // handling does.
                if let Err(e) = self.table.update_state().await {
                    tracing::warn!(table = %self.url, error = %e, "reloading the Delta log failed");
                }
            }
        }
        Ok(version as i64)
    }
}

/// Reads the `txn` versions of a table as they are now (`--exactly-once` with a positioned
/// source: where a stream partition's records in the table end). One handle, brought up to date before every read.
pub struct TxnVersions {
    dest: Destination,
    table: Option<deltalake_core::DeltaTable>,
}

impl TxnVersions {
    pub fn new(dest: &Destination) -> TxnVersions {
        TxnVersions {
            dest: dest.clone(),
            table: None,
        }
    }

    /// The newest version of `app_id` in the table; `None` when no commit carried it (or there
    /// is no table yet).
    pub async fn version(&mut self, app_id: &str) -> Result<Option<i64>, DeltaError> {
        let delta_err = |source| DeltaError::Delta {
            url: self.dest.url.clone(),
            source,
        };
        match &mut self.table {
            Some(t) => t.update_state().await.map_err(delta_err)?,
            None => {
                if !DeltaTable::has_log(&self.dest).await {
                    return Ok(None);
                }
                let mut t = deltalake_core::DeltaTable::new(log_store(&self.dest));
                t.load().await.map_err(delta_err)?;
                self.table = Some(t);
            }
        }
        let t = self.table.as_ref().expect("loaded above");
        t.snapshot()
            .map_err(delta_err)?
            .transaction_version(t.log_store().as_ref(), app_id)
            .await
            .map_err(delta_err)
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{
        Array, Decimal256Array, Int64Array, ListArray, StringArray, StructArray,
        Time64MicrosecondArray,
    };
    use arrow_buffer::i256;
    use futures::StreamExt;

    use super::*;
    use crate::table::parquet::write_parquet;

    use proptest::prelude::*;

    proptest::proptest! {
        /// TIME as text by hand is exactly arrow's cast, nulls included; a value that is not a
        /// time of day is left to the cast.
        #[test]
        fn time_text_is_arrows_cast(
            values in proptest::collection::vec(proptest::option::of(proptest::prop_oneof![
                0i64..86_400_000_000,
                (0i64..86_400).prop_map(|s| s * 1_000_000),
                (0i64..86_400_000).prop_map(|ms| ms * 1000),
                proptest::prelude::Just(86_399_999_999i64),
            ]), 0..50),
        ) {
            let a = arrow_array::Time64MicrosecondArray::from(values);
            let ours = time_text(&a).unwrap();
            let theirs = arrow_cast::cast(&a, &DataType::Utf8).unwrap();
            prop_assert_eq!(&ours as &dyn arrow_array::Array, theirs.as_ref());
        }

        /// BIGNUMERIC text by hand is arrow's cast wherever the cast is exact (76 digits or
        /// fewer), nulls included.
        #[test]
        fn bignumeric_text_is_arrows_cast_within_76_digits(
            values in proptest::collection::vec(proptest::option::of(
                (proptest::prelude::any::<[u8; 32]>(), 0u32..77).prop_map(|(le, digits)| {
                    let v = i256::from_le_bytes(le);
                    let m = i256::from_i128(10).wrapping_pow(digits);
                    if digits == 0 { i256::ZERO } else { v.wrapping_rem(m) }
                })
            ), 0..30),
        ) {
            let a = arrow_array::Decimal256Array::from(values)
                .with_precision_and_scale(76, 38)
                .unwrap();
            let ours = bignumeric_text(&a);
            let theirs = arrow_cast::cast(&a, &DataType::Utf8).unwrap();
            prop_assert_eq!(&ours as &dyn arrow_array::Array, theirs.as_ref());
        }
    }

    #[test]
    fn time_text_leaves_other_values_to_the_cast() {
        for v in [-1, 86_400_000_000] {
            let a = arrow_array::Time64MicrosecondArray::from(vec![v]);
            assert!(time_text(&a).is_none());
        }
    }

    fn mapped(ty: DataType) -> Result<DataType, DeltaError> {
        delta_arrow_schema(&Schema::new(vec![Field::new("c", ty, true)]))
            .map(|s| s.field(0).data_type().clone())
    }

    #[test]
    fn arrow_types_map_to_delta_types() {
        let same = [
            DataType::Utf8,
            DataType::Binary,
            DataType::Int64,
            DataType::Float64,
            DataType::Boolean,
            DataType::Date32,
            DataType::Decimal128(38, 9),
            DataType::Timestamp(TimeUnit::Microsecond, None),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        ];
        for ty in same {
            assert_eq!(mapped(ty.clone()).unwrap(), ty);
        }
        assert_eq!(
            mapped(DataType::Decimal256(76, 38)).unwrap(),
            DataType::Utf8
        );
        assert_eq!(
            mapped(DataType::Time64(TimeUnit::Microsecond)).unwrap(),
            DataType::Utf8
        );
        // Nested: TIME inside a list of structs becomes a string there too.
        let inner = Fields::from(vec![Field::new(
            "t",
            DataType::Time64(TimeUnit::Microsecond),
            true,
        )]);
        let list = DataType::List(Arc::new(Field::new(
            "element",
            DataType::Struct(inner),
            false,
        )));
        let want = DataType::List(Arc::new(Field::new(
            "element",
            DataType::Struct(Fields::from(vec![Field::new("t", DataType::Utf8, true)])),
            false,
        )));
        assert_eq!(mapped(list).unwrap(), want);
        // JSON's extension metadata is dropped.
        let json = Field::new("j", DataType::Utf8, true).with_metadata(HashMap::from([(
            "ARROW:extension:name".to_string(),
            "arrow.json".to_string(),
        )]));
        let s = delta_arrow_schema(&Schema::new(vec![json])).unwrap();
        assert!(s.field(0).metadata().is_empty());
        // Types the mapping core never produces are refused with the column's path.
        let err = mapped(DataType::Struct(Fields::from(vec![Field::new(
            "u",
            DataType::UInt8,
            true,
        )])))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Delta table: column `c.u`: Arrow type UInt8 has no Delta equivalent"
        );
        assert!(mapped(DataType::Timestamp(TimeUnit::Millisecond, None)).is_err());
    }

    #[test]
    fn bignumeric_text_is_exact_over_bigquerys_whole_range() {
        // The in-memory column is arrow's 256-bit decimal at scale 38, whose unscaled i256 holds
        // BIGNUMERIC's whole range; arrow labels it precision 76 but never checks values against
        // it. Delta gets every digit, at the top level, in a RECORD and in a REPEATED column.
        let ty = DataType::Decimal256(76, 38);
        let ten = i256::from_i128(10);
        let bn: ArrayRef = Arc::new(
            Decimal256Array::from(vec![
                i256::MAX,
                i256::MIN,
                ten.wrapping_pow(76),
                -ten.wrapping_pow(76) + i256::ONE,
                i256::ONE,
            ])
            .with_precision_and_scale(76, 38)
            .unwrap(),
        );
        let record: ArrayRef = Arc::new(StructArray::from(vec![(
            Arc::new(Field::new("x", ty.clone(), true)),
            bn.clone(),
        )]));
        // Row i holds the list [bn[i]].
        let list: ArrayRef = Arc::new(
            ListArray::try_new(
                Arc::new(Field::new("element", ty.clone(), false)),
                arrow_buffer::OffsetBuffer::from_lengths([1; 5]),
                bn.clone(),
                None,
            )
            .unwrap(),
        );
        let schema = Schema::new(vec![
            Field::new("bn", ty.clone(), true),
            Field::new("r", record.data_type().clone(), true),
            Field::new("l", list.data_type().clone(), true),
        ]);
        let delta = delta_arrow_schema(&schema).unwrap();
        let batch = RecordBatch::try_new(Arc::new(schema), vec![bn, record, list]).unwrap();
        let out = to_delta_batch(&batch, &delta).unwrap();
        let text = |a: &dyn Array| {
            let s = a.as_any().downcast_ref::<StringArray>().unwrap();
            (0..s.len())
                .map(|i| s.value(i).to_string())
                .collect::<Vec<_>>()
        };
        let want = [
            "578960446186580977117854925043439539266.34992332820282019728792003956564819967",
            "-578960446186580977117854925043439539266.34992332820282019728792003956564819968",
            "100000000000000000000000000000000000000.00000000000000000000000000000000000000",
            "-99999999999999999999999999999999999999.99999999999999999999999999999999999999",
            "0.00000000000000000000000000000000000001",
        ];
        assert_eq!(text(out.column(0)), want);
        let nested = out
            .column(1)
            .as_any()
            .downcast_ref::<StructArray>()
            .unwrap();
        assert_eq!(text(nested.column(0).as_ref()), want);
        let items = out.column(2).as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(text(items.values().as_ref()), want);
    }

    #[test]
    fn batches_are_cast_to_the_delta_form() {
        let time = DataType::Time64(TimeUnit::Microsecond);
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("t", time.clone(), true),
            Field::new("bn", DataType::Decimal256(76, 38), true),
            Field::new(
                "l",
                DataType::List(Arc::new(Field::new("element", time.clone(), false))),
                false,
            ),
        ]);
        let delta = delta_arrow_schema(&schema).unwrap();
        let times = Time64MicrosecondArray::from(vec![4 * 3_600_000_000 + 500_000, 1]);
        let list = ListArray::try_new(
            Arc::new(Field::new("element", time, false)),
            arrow_buffer::OffsetBuffer::from_lengths([2, 0]),
            Arc::new(times.clone()),
            None,
        )
        .unwrap();
        let bn = Decimal256Array::from(vec![
            Some(i256::from_i128(-15) * i256::from_i128(10i128.pow(37))),
            None,
        ])
        .with_precision_and_scale(76, 38)
        .unwrap();
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(times),
                Arc::new(bn),
                Arc::new(list),
            ],
        )
        .unwrap();
        let out = to_delta_batch(&batch, &delta).unwrap();
        let strings = |a: &dyn Array| {
            let s = a.as_any().downcast_ref::<StringArray>().unwrap();
            (0..s.len())
                .map(|i| s.is_valid(i).then(|| s.value(i).to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            strings(out.column(1)),
            vec![Some("04:00:00.500".into()), Some("00:00:00.000001".into())]
        );
        assert_eq!(
            strings(out.column(2)),
            vec![
                Some("-1.50000000000000000000000000000000000000".into()),
                None
            ]
        );
        let l = out.column(3).as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(
            strings(l.values().as_ref()),
            vec![Some("04:00:00.500".into()), Some("00:00:00.000001".into())]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_on_an_in_memory_store() {
        let dest = Destination::from_url("memory://").unwrap();
        let fields = Fields::from(vec![Field::new("x", DataType::Int64, true)]);
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("rec", DataType::Struct(fields.clone()), true),
        ]);
        let mut a = DeltaTable::open_or_create_with_properties(
            &dest,
            &schema,
            &[("delta.checkpointInterval", "2")],
        )
        .await
        .unwrap();
        let mut b = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
        assert_eq!((a.version(), b.version()), (0, 0));
        let file = |ids: Vec<i64>| {
            let n = ids.len();
            let rec = StructArray::new(
                fields.clone(),
                vec![Arc::new(Int64Array::from(vec![Some(1); n]))],
                None,
            );
            let batch = RecordBatch::try_new(
                a.schema().clone(),
                vec![Arc::new(Int64Array::from(ids)), Arc::new(rec)],
            )
            .unwrap();
            DataFile::new(write_parquet(a.schema(), &[batch], None).unwrap())
        };
        let (f1, f2, f3) = (file(vec![1, 2]), file(vec![3]), file(vec![4]));
        assert_eq!(a.commit(vec![f1]).await.unwrap(), 1);
        // b still holds version 0: its commit conflicts on version 1 and lands as 2.
        assert_eq!(b.commit(vec![f2]).await.unwrap(), 2);
        assert_eq!(a.commit(vec![f3]).await.unwrap(), 3);
        let mut log: Vec<String> = dest
            .store
            .list(Some(&Path::from("_delta_log")))
            .map(|m| m.unwrap().location.to_string())
            .collect()
            .await;
        log.sort();
        let mut want: Vec<String> = (0..4).map(|v| format!("_delta_log/{v:020}.json")).collect();
        // deltalake checkpoints after every version v with (v + 1) % interval == 0.
        want.push(format!("_delta_log/{:020}.checkpoint.parquet", 1));
        want.push(format!("_delta_log/{:020}.checkpoint.parquet", 3));
        want.push("_delta_log/_last_checkpoint".into());
        want.sort();
        assert_eq!(log, want);
        let reopened = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
        assert_eq!(reopened.version(), 3);
        let files = reopened.table.snapshot().unwrap().log_data().num_files();
        assert_eq!(files, 3);
    }

    /// `txn` actions land with the data and are read back; a commit whose partition the table
    /// already holds from its first offset on is refused, and so is one that races a commit of
    /// the same application id (deltalake's conflict check).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn txn_versions_are_committed_with_the_data_and_compared_before() {
        let dest = Destination::from_url("memory://").unwrap();
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let mut versions = TxnVersions::new(&dest);
        let app_id = |p: i32| format!("subsink-x/g/x/t/{p}");
        let (p0, p1) = (app_id(0), app_id(1));
        assert_eq!(versions.version(&p0).await.unwrap(), None, "no table yet");
        let mut a = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
        let mut b = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
        let file = |t: &DeltaTable| {
            let batch = RecordBatch::try_new(
                t.schema().clone(),
                vec![Arc::new(Int64Array::from(vec![1]))],
            )
            .unwrap();
            DataFile::new(write_parquet(t.schema(), &[batch], None).unwrap())
        };
        let txn = |app_id: &str, first, version| AppTxn {
            app_id: app_id.to_string(),
            version,
            first,
        };
        let f = file(&a);
        a.commit_with(vec![f], &[txn(&p0, 0, 9), txn(&p1, 0, 4)])
            .await
            .unwrap();
        assert_eq!(versions.version(&p0).await.unwrap(), Some(9));
        assert_eq!(versions.version(&p1).await.unwrap(), Some(4));
        // The table holds p0 up to 9: a commit from 5 on is refused, nothing lands.
        let f = file(&a);
        let err = a
            .commit_with(vec![f], &[txn(&p0, 5, 12)])
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                DeltaError::TxnAhead {
                    table: 9,
                    first: 5,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(a.version(), 1);
        // b built on version 0 (it never saw p0 at 9): deltalake's conflict check refuses it.
        let f = file(&b);
        let err = b.commit_with(vec![f], &[txn(&p0, 0, 3)]).await.unwrap_err();
        assert!(err.to_string().contains("Concurrent transaction"), "{err}");
        // A partition no later version touched goes on from the same stale snapshot.
        let p2 = app_id(2);
        let f = file(&b);
        assert_eq!(b.commit_with(vec![f], &[txn(&p2, 0, 7)]).await.unwrap(), 2);
        let f = file(&a);
        assert_eq!(
            a.commit_with(vec![f], &[txn(&p0, 10, 11)]).await.unwrap(),
            3
        );
        assert_eq!(versions.version(&p0).await.unwrap(), Some(11));
        assert_eq!(versions.version(&p1).await.unwrap(), Some(4));
        assert_eq!(versions.version(&p2).await.unwrap(), Some(7));
    }
}
