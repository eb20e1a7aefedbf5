//! The Delta sink: a BigQuery subscription's rows (docs/contract.md §4), committed to a Delta Lake
//! table. A file is one open batch of rows ([`RowBuilder`], the destination-independent mapping
//! core in [`crate::table`]); it closes on the same three limits as a storage file (duration, bytes,
//! messages) and is made durable as one Parquet file committed to the table as one log version.
//!
//! A message that cannot become a row fails alone ([`crate::table::RowError`]) and is never part of a batch.
//!
//! Rows do not wait in memory for the batch to close: every [`CHUNK_ROWS`](super::chunk::CHUNK_ROWS) rows or
//! [`CHUNK_BYTES`] message bytes they go as one record batch to the open file's [`ParquetEncoder`],
//! which encodes them on its own thread while the next rows convert. What an open batch holds is
//! its compressed Parquet pages, at most [`CHUNK_BYTES`] of rows not yet handed over, and the
//! encoder's short queue; closing a batch only encodes its last chunk.
//!
//! Bytes of a batch are counted as message bytes: payload plus attribute keys and values, known
//! before conversion; the Parquet file is smaller (zstd).
//!
//! ## `--exactly-once` with a positioned source ([`DeltaSettings::streams`])
//! Every commit carries, in the same log version as its data, one `txn` action per stream
//! partition whose records it holds: application id [`crate::position::StreamKey::app_id`] (reader, stream,
//! partition), version = the partition's last offset in the commit. A restart reads those versions
//! back ([`DeltaDurableStreams`], through [`TxnVersions`]) and skips what the
//! table holds. So that a version never passes a record that is not in the table:
//! * a partition's commits land in offset order: a commit waits for the previous commit of each
//!   of its partitions, and fails when one of those failed (or was given up);
//! * once a record of a partition is refused (it cannot be a row), every later record of that
//!   partition is refused in this run (its partition stops);
//! * a commit is refused when the table's version for one of its partitions already reaches the
//!   partition's first offset in it (another reader of the stream wrote those records after a
//!   rebalance: [`crate::sink::delta::DeltaTable::commit_with`]).
//!
//! ## Everything Delta, one folder
//! Each table operation in one place (as delta-rs's `operations::{write, merge, optimize}`):
//!
//! | file | what it holds |
//! |---|---|
//! | [`table`] | [`DeltaTable`]: open or create a table, commit files (write) with their `txn` actions |
//! | [`merge`] | change data capture: the last change per key, tombstones, one MERGE per commit |
//! | [`compact`] | OPTIMIZE on the table's quiet part, the compactions' lease (`subsink compact`) |
//! | [`vacuum`] | VACUUM of the table and its tombstone table (`subsink vacuum`) |
//! | [`partition`] | rows split by partition, Delta's value serialization and escaping |
//! | [`form`] | record batches in the Delta form (Arrow → Delta types) |
//! | [`stats`] | a data file's `add` action and its statistics |
//! | [`files`] | a table read without changing it (`inspect`, `serve`) |
//! | [`evolve`] | a Delta table's columns against what is written; Delta columns back to BigQuery fields |
//! | `existing` | an existing table checked at startup |
//! | `schema` | [`DeltaSchemaWatch`]: the table's schema while running |
//! | `commit` | a closed batch's commit: appended files or one MERGE, held while the table does not fit |
//! | `out` | where an open batch's rows go: one Parquet file, the changes of a MERGE, a file per partition |
//! | `encoder` | [`ParquetEncoder`]: a Parquet file in the Delta form encoded on its own thread |
//! | `data_file`, `txn`, `txn_versions`, `error` | [`DataFile`], [`AppTxn`], [`TxnVersions`], [`DeltaError`] |

mod commit;
pub mod compact;
mod data_file;
mod encoder;
pub mod error;
pub mod evolve;
mod existing;
pub mod files;
pub mod form;
pub mod merge;
mod out;
pub mod partition;
pub mod register;
mod schema;
pub mod stats;
pub mod table;
mod txn;
mod txn_versions;
pub mod vacuum;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use parquet::file::properties::WriterProperties;
use tokio::sync::Mutex;

use super::chunk::{message_bytes, CHUNK_ROWS};
use super::commit_at_close::{ClosedBatch, CommitAtClose};
use super::order::{self, Chained, Parts, StreamOrder};
use super::{Durable, PushError, Sink, SinkError, SinkFile, Unstaged};
use crate::batch::Limits;
use crate::config::BigQuerySettings;
use crate::message::Received;
use crate::position::{DurableStreams, Position, Streams};
use crate::receipt::{Refusal, Refused};
use crate::table::cdc::{PrimaryKey, CHANGE_TYPE};
use crate::table::partition::PartitionBy;
use crate::table::RowBuilder;
use crate::upload::Destination;
use commit::{append, merge, CommitError, ExactCommit, Fits};
pub use data_file::{new_data_file_name, DataFile};
pub use encoder::{encode_into, ParquetEncodeError, ParquetEncoder};
pub use error::DeltaError;
use evolve::table_fields;
pub use form::{delta_arrow_schema, to_delta_batch};
use out::{finish_partitions, ChangeSpec, Out, PartSpec};
use partition::Partitioning;
pub use schema::{DeltaColumns, DeltaSchemaWatch, DEFAULT_REFRESH};
pub use table::DeltaTable;
pub use txn::AppTxn;
pub use txn_versions::TxnVersions;

/// Rows of a partitioned table split into partition files at a time (at most): bounds the files
/// one hand-over can open before the memory budget sees them (at most this many ×
/// `PART_FILE_OVERHEAD`).
pub const PARTITIONED_CHUNK_ROWS: usize = 512;
/// Message bytes handed to the encoder at a time (at most, give or take one message): bounds the
/// rows in memory when messages are large.
pub const CHUNK_BYTES: u64 = 4 << 20;

/// Where and how rows are written (besides the subscription's `bigqueryConfig`).
pub struct DeltaSettings {
    /// The table's root.
    pub dest: Destination,
    /// The row mapping, checked against the table schema at startup.
    pub rows: RowBuilder,
    /// Parquet writer settings (compression); see [`crate::table::default_writer_properties`].
    pub parquet: WriterProperties,
    /// `--exactly-once` with a positioned source: its streams. Every commit carries a `txn`
    /// action per stream partition (see the module docs).
    pub streams: Option<Streams>,
    /// Change data capture: the table's primary key; each commit is a MERGE
    /// ([`crate::sink::delta::merge`]). `None`: rows are appended.
    pub key: Option<PrimaryKey>,
    /// The partitioning a table this run creates gets (`--table-partition-by`, the table
    /// resource's `timePartitioning`), which an existing table must have. Empty: an existing
    /// table's own partition columns, a new table unpartitioned.
    pub partition_by: Vec<PartitionBy>,
    /// `--table-schema-refresh`: how often the table's schema is read again while running
    /// ([`DeltaSchemaWatch`]).
    pub schema_refresh: Duration,
    /// `--table-delete-retention`: how long a tombstone keeps older changes of its key out
    /// ([`crate::sink::delta::merge`]).
    pub delete_retention: Duration,
}

/// `--exactly-once`: how far a Delta table holds each stream partition, from its `txn` versions.
pub struct DeltaDurableStreams {
    versions: Mutex<TxnVersions>,
}

impl DeltaDurableStreams {
    /// The positions the table at `dest` holds.
    pub fn new(dest: &Destination) -> DeltaDurableStreams {
        DeltaDurableStreams {
            versions: Mutex::new(TxnVersions::new(dest)),
        }
    }
}

#[async_trait::async_trait]
impl DurableStreams for DeltaDurableStreams {
    fn lookup(&self, at: &Position, _publish_time_micros: i64) -> String {
        at.key.app_id()
    }

    async fn held_through(
        &self,
        at: &Position,
        _publish_time_micros: i64,
    ) -> Result<Option<i64>, String> {
        match self.versions.lock().await.version(&at.key.app_id()).await {
            Ok(v) => Ok(v.filter(|v| *v >= at.offset)),
            Err(e) => Err(e.to_string()),
        }
    }

    fn held_in(&self, last: i64) -> String {
        format!("in the Delta table already (txn version {last})")
    }
}

/// Rows committed to a Delta table: one open batch at a time.
pub struct DeltaSink {
    rows: RowBuilder,
    limits: Limits,
    table: Arc<Mutex<DeltaTable>>,
    /// The table's Parquet schema, fixed at start (so opening a file never waits for a commit's
    /// lock on the table).
    schema: SchemaRef,
    props: WriterProperties,
    exact: Option<StreamOrder>,
    /// `--exactly-once`: how far the table holds each stream partition.
    durable_streams: Option<Arc<dyn DurableStreams>>,
    /// Change data capture: commits are MERGEs.
    changes: Option<Arc<ChangeSpec>>,
    /// A partitioned table: rows are split by partition, one file each.
    partitions: Option<Arc<PartSpec>>,
    /// The table's schema while running: new NULLABLE columns to take up, SCHEMA_MISMATCH
    /// (`None` only in unit tests that build a sink by hand).
    watch: Option<Arc<DeltaSchemaWatch>>,
    /// What a message is checked against before the pipeline takes it (a push endpoint): the
    /// current row mapping, new columns included.
    check: Arc<super::RowCheck>,
}

impl DeltaSink {
    /// Open the table at `settings.dest` (created with the row builder's schema when absent).
    pub async fn open(
        bq: &BigQuerySettings,
        settings: DeltaSettings,
    ) -> Result<DeltaSink, Box<DeltaError>> {
        let rows_schema = settings.rows.schema();
        let partition_error = |reason: String| {
            Box::new(DeltaError::Partitioning {
                url: settings.dest.url.clone(),
                reason,
            })
        };
        let configured = Partitioning::new(settings.partition_by.clone(), &rows_schema)
            .map_err(|e| partition_error(e.0))?;
        // Change data capture: the table keeps each row's sequence number, not its change type;
        // time partitions add their derived column.
        let mut table_fields: Vec<_> = rows_schema
            .fields()
            .iter()
            .filter(|f| settings.key.is_none() || f.name() != CHANGE_TYPE)
            .cloned()
            .collect();
        table_fields.extend(configured.derived_fields().into_iter().map(Arc::new));
        let partition_by = settings
            .partition_by
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        // An existing table must have the configured partitioning, and take the columns.
        let mut table = DeltaTable::open_or_create_partitioned(
            &settings.dest,
            &Schema::new(table_fields),
            &configured.columns(),
            &partition_by,
            &[],
        )
        .await
        .map_err(Box::new)?;
        table.set_delete_retention(settings.delete_retention);
        let has = table.partition_columns().to_vec();
        let partitioning = if configured.is_empty() {
            // The table's own partition columns: columns of the rows.
            let by = has.iter().cloned().map(PartitionBy::Column).collect();
            Partitioning::new(by, &rows_schema).map_err(|e| {
                partition_error(format!(
                    "the table is partitioned by {}: {e}",
                    has.join(", ")
                ))
            })?
        } else {
            configured
        };
        let limits = Limits {
            max_duration: bq.max_duration,
            max_bytes: bq.max_bytes,
            max_messages: bq.max_messages,
        };
        let changes = settings.key.map(|key| {
            let mut fields: Vec<_> = rows_schema.fields().iter().cloned().collect();
            fields.extend(partitioning.derived_fields().into_iter().map(Arc::new));
            Arc::new(ChangeSpec {
                key,
                rows: Arc::new(Schema::new(fields)),
                props: settings.parquet.clone(),
                arrival: Default::default(),
            })
        });
        let partitions = (!partitioning.is_empty()).then(|| {
            Arc::new(PartSpec {
                file_schema: partitioning.file_schema(table.schema()),
                partitioning,
                props: settings.parquet.clone(),
            })
        });
        let mut sink = DeltaSink::new(settings.rows, limits, table, settings.parquet);
        sink.changes = changes;
        sink.partitions = partitions;
        if let Some(streams) = settings.streams {
            sink.exact = Some(StreamOrder::new(streams));
            sink.durable_streams = Some(Arc::new(DeltaDurableStreams::new(&settings.dest)));
        }
        {
            let refresh = settings.schema_refresh;
            let watch = DeltaSchemaWatch::new(&settings.dest.url, &sink.schema, refresh);
            let version = {
                let t = sink.table.lock().await;
                watch.observe(t.version(), &*t.columns().map_err(Box::new)?);
                t.version()
            };
            tokio::spawn(DeltaSchemaWatch::run(
                Arc::downgrade(&watch),
                settings.dest.clone(),
                refresh,
                version,
            ));
            sink.watch = Some(watch);
            // An existing table's own NULLABLE columns the schema lacks: written from the start.
            sink.take_up();
        }
        Ok(sink)
    }

    /// New NULLABLE columns of the table, found by the schema watch: the next batch and every
    /// later one writes them, mapped as at startup (use_table_schema and use_topic_schema fill
    /// them from the message field of their name; no-schema mode writes NULL).
    fn take_up(&mut self) {
        let Some(watch) = self.watch.clone() else {
            return;
        };
        let added = watch.take_added();
        if added.is_empty() {
            return;
        }
        let changes = self.changes.is_some();
        let taken = table_fields(&added)
            .and_then(|fields| self.rows.with_columns(&fields))
            .and_then(|rows| {
                let rows_schema = rows.schema();
                let partitioning = match &self.partitions {
                    Some(p) => Some(p.partitioning.rebind(&rows_schema).map_err(|e| e.0)?),
                    None => None,
                };
                let mut fields: Vec<_> = rows_schema.fields().iter().cloned().collect();
                if let Some(p) = &partitioning {
                    fields.extend(p.derived_fields().into_iter().map(Arc::new));
                }
                // Change data capture: the rows carry the change type, the table does not.
                let table: Vec<_> = fields
                    .iter()
                    .filter(|f| !changes || f.name() != CHANGE_TYPE)
                    .cloned()
                    .collect();
                let schema = delta_arrow_schema(&Schema::new(table)).map_err(|e| e.to_string())?;
                Ok((rows, partitioning, schema, Arc::new(Schema::new(fields))))
            });
        match taken {
            Ok((rows, partitioning, schema, change_rows)) => {
                self.check.replace(&rows);
                self.rows = rows;
                self.schema = schema.clone();
                if let Some(spec) = &self.changes {
                    self.changes = Some(Arc::new(ChangeSpec {
                        key: spec.key.clone(),
                        rows: change_rows,
                        props: spec.props.clone(),
                        // The same order: the batches before the new columns land first.
                        arrival: spec.arrival.clone(),
                    }));
                }
                if let Some(partitioning) = partitioning {
                    self.partitions = Some(Arc::new(PartSpec {
                        file_schema: partitioning.file_schema(&schema),
                        partitioning,
                        props: self.props.clone(),
                    }));
                }
                watch.set_writes(&schema);
            }
            // Files without the columns still fit the table (NULL there).
            Err(why) => tracing::warn!(
                columns = ?added.iter().map(|f| f.name().as_str()).collect::<Vec<_>>(),
                "new table columns are not written: {why}"
            ),
        }
    }

    /// A sink over an open table. `props`: the Parquet writer settings.
    pub fn new(
        rows: RowBuilder,
        limits: Limits,
        table: DeltaTable,
        props: WriterProperties,
    ) -> DeltaSink {
        DeltaSink {
            limits,
            schema: table.schema().clone(),
            table: Arc::new(Mutex::new(table)),
            props,
            exact: None,
            durable_streams: None,
            changes: None,
            partitions: None,
            watch: None,
            check: Arc::new(super::RowCheck::new(&rows)),
            rows,
        }
    }

    /// The table, shared with the commits in flight.
    pub fn table(&self) -> Arc<Mutex<DeltaTable>> {
        self.table.clone()
    }
}

impl Sink for DeltaSink {
    type File = DeltaFile;

    fn limits(&self) -> Limits {
        self.limits
    }

    fn refusal(&self) -> Refusal {
        Refusal::FailsAlone
    }

    fn check(&self) -> Option<std::sync::Arc<dyn crate::receipt::MessageCheck>> {
        Some(self.check.clone())
    }

    fn durable_streams(&self) -> Option<Arc<dyn DurableStreams>> {
        self.durable_streams.clone()
    }

    fn problem(&self) -> Option<String> {
        self.watch.as_ref().and_then(|w| w.problem())
    }

    fn open(&mut self, _group: Option<&str>) -> Result<DeltaFile, PushError> {
        self.take_up();
        Ok(DeltaFile {
            fits: self.watch.clone().map(|watch| Fits {
                writes: self.schema.clone(),
                watch,
            }),
            name: new_data_file_name(),
            rows: self.rows.fresh(),
            out: match (&self.changes, &self.partitions) {
                (Some(spec), _) => Out::Changes {
                    spec: spec.clone(),
                    chunks: Vec::new(),
                    memory: 0,
                },
                (None, None) => Out::Parquet(ParquetEncoder::start(
                    self.schema.clone(),
                    Some(self.props.clone()),
                )),
                (None, Some(spec)) => Out::Partitioned {
                    spec: spec.clone(),
                    files: Vec::new(),
                },
            },
            partitions: self.partitions.clone(),
            publish: Vec::new(),
            unsent_bytes: 0,
            staged: 0,
            table: self.table.clone(),
            exact: self.exact.clone(),
            parts: Parts::new(),
            staged_at: None,
        })
    }

    async fn is_durable(&self, name: &str) -> Result<bool, SinkError> {
        let mut t = self.table.lock().await;
        Ok(t.contains_file(name).await.map_err(Box::new)?)
    }
}

/// One open batch of rows.
pub struct DeltaFile {
    /// Data file path, relative to the table root.
    name: String,
    rows: RowBuilder,
    /// Where its rows go: a Parquet file, or changes to merge.
    out: Out,
    /// Message bytes of the rows in the builder, not yet handed to the encoder.
    unsent_bytes: u64,
    /// Message bytes of the staged row.
    staged: u64,
    table: Arc<Mutex<DeltaTable>>,
    exact: Option<StreamOrder>,
    /// `--exactly-once`: per partition, the first and last offset of its records in the batch.
    parts: Parts,
    /// `--exactly-once`: the position of the staged row.
    staged_at: Option<Position>,
    /// A partitioned table's partitioning.
    partitions: Option<Arc<PartSpec>>,
    /// Ingestion-time partitions: the publish time of each row in the builder.
    publish: Vec<i64>,
    /// What the batch's commit checks against the table's schema.
    fits: Option<Fits>,
}

impl SinkFile for DeltaFile {
    type Closed = DeltaCommit;

    fn name(&self) -> &str {
        &self.name
    }

    fn header_bytes(&self) -> u64 {
        0
    }

    fn stage(&mut self, r: &Received) -> Result<u64, Refused> {
        let msg = &r.msg;
        let staged = match &self.exact {
            Some(exact) => self.stage_exact(exact.clone(), r),
            None => {
                self.rows.append(msg)?;
                self.staged = message_bytes(msg);
                Ok(self.staged)
            }
        }?;
        if self
            .partitions
            .as_ref()
            .is_some_and(|p| p.partitioning.needs_publish_time())
        {
            self.publish.push(msg.publish_time_micros);
        }
        Ok(staged)
    }

    fn commit(&mut self) {
        order::count(&mut self.parts, self.staged_at.take());
        self.unsent_bytes += self.staged;
        // A partitioned table's rows go in smaller chunks: each chunk can open a file per row,
        // and the budget sees the files a chunk opened only once it is handed over.
        let rows = if self.partitions.is_some() {
            PARTITIONED_CHUNK_ROWS
        } else {
            CHUNK_ROWS
        };
        if self.rows.len() >= rows || self.unsent_bytes >= CHUNK_BYTES {
            self.unsent_bytes = 0;
            self.hand_over();
        }
    }

    fn buffered(&self) -> u64 {
        // Rows not yet handed over, and what the encoder holds: batches queued, encoded pages.
        self.unsent_bytes + self.out.memory()
    }

    fn unstage(&mut self, _carry: &mut Vec<u8>) -> Unstaged {
        self.rows.pop_row();
        self.publish.truncate(self.rows.len());
        self.staged_at = None;
        Unstaged::Restage
    }

    fn close(mut self) -> DeltaCommit {
        // A partitioned table's last rows are split now; an unpartitioned file's last chunk is
        // encoded on a blocking thread by the commit.
        if self.partitions.is_some() && !self.rows.is_empty() {
            self.hand_over();
        }
        let rest = (!self.rows.is_empty()).then(|| self.rows.finish());
        // Change data capture: MERGEs land in the order the batches closed (under
        // `--exactly-once`, a partition's offset order).
        let arrival = match (&self.out, &self.exact) {
            (Out::Changes { spec, .. }, None) => Some(spec.arrival.chain()),
            _ => None,
        };
        let exact = self.exact.map(|exact| {
            let order = exact.chain(self.parts.keys());
            let txns = self
                .parts
                .iter()
                .map(|(key, (first, last))| AppTxn {
                    app_id: key.app_id(),
                    version: *last,
                    first: *first,
                })
                .collect();
            ExactCommit {
                txns,
                order,
                source: exact.streams().name.clone(),
            }
        });
        DeltaCommit::new(Batch {
            name: self.name,
            out: self.out,
            rest,
            table: self.table,
            exact,
            arrival,
            fits: self.fits,
        })
    }
}

impl DeltaFile {
    /// Hand the builder's rows to the batch's output: with their derived partition columns for a
    /// partitioned table.
    fn hand_over(&mut self) {
        let rows = self.rows.finish();
        let rows = match &self.partitions {
            None => rows,
            Some(p) => {
                let derived = p.partitioning.derive(rows, &self.publish);
                self.publish.clear();
                match derived {
                    Ok(rows) => rows,
                    Err(e) => {
                        self.out = Out::Broken(e.to_string());
                        return;
                    }
                }
            }
        };
        self.out.write(rows);
    }

    /// [`SinkFile::stage`] under `--exactly-once`: a record of a partition that had a record
    /// refused before it in this run is refused too (a commit's `txn` version must not pass a
    /// record that is not in the table).
    fn stage_exact(&mut self, exact: StreamOrder, r: &Received) -> Result<u64, Refused> {
        let rows = &mut self.rows;
        self.staged_at = exact.stage(r, || rows.append(&r.msg))?;
        self.staged = message_bytes(&r.msg);
        Ok(self.staged)
    }
}

/// A closed batch: a Parquet file still being encoded, to finish and commit.
pub struct DeltaCommit {
    name: String,
    /// `--exactly-once`, or change data capture: already under way on a task of its own since
    /// the batch closed ([`CommitAtClose`]), so that a commit never waits for a slot held by a
    /// later commit waiting for it (a partition's commits land in offset order; MERGEs in the
    /// batches' order).
    work: CommitAtClose<Batch>,
}

/// A closed batch's parts.
struct Batch {
    name: String,
    out: Out,
    /// The batch's last rows, not yet handed over.
    rest: Option<RecordBatch>,
    table: Arc<Mutex<DeltaTable>>,
    exact: Option<ExactCommit>,
    /// Change data capture without `--exactly-once`: its place in the batches' order.
    arrival: Option<Chained>,
    fits: Option<Fits>,
}

impl Batch {
    /// Encode the Parquet file (on a blocking thread: zstd is CPU work), then — after the
    /// previous commits of its partitions, under `--exactly-once` — upload it and commit it.
    /// Returns the file's size. On error nothing is in the table.
    async fn commit(
        self,
        cancelled: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<crate::receipt::Written, CommitError> {
        let Batch {
            name,
            out,
            rest,
            table,
            exact,
            arrival,
            fits,
        } = self;
        let encoder = match out {
            Out::Parquet(encoder) => encoder.map_err(CommitError::Thread)?,
            Out::Changes {
                spec, mut chunks, ..
            } => {
                chunks.extend(rest);
                if let Some(a) = &arrival {
                    a.wait_ended().await;
                }
                let merged = merge(name, spec, chunks, table, exact, fits, cancelled).await;
                if let Some(a) = arrival {
                    a.done(merged.is_ok());
                }
                return merged;
            }
            Out::Partitioned { files, .. } => {
                let files = finish_partitions(&name, files).await?;
                return append(name, files, table, exact, fits, cancelled).await;
            }
            Out::Broken(e) => return Err(CommitError::Partition(e)),
        };
        let file = tokio::task::spawn_blocking(move || {
            if let Some(rows) = rest {
                // An error here means the encoder stopped; finish() says why.
                let _ = encoder.write(rows);
            }
            encoder.finish()
        })
        .await
        .map_err(CommitError::Panicked)??;
        let file = DataFile {
            path: name.clone(),
            file,
            partition_values: Default::default(),
        };
        append(name, vec![file], table, exact, fits, cancelled).await
    }
}

impl ClosedBatch for Batch {
    type Error = CommitError;

    fn write(
        self,
        cancelled: &AtomicBool,
    ) -> impl std::future::Future<Output = Result<super::Written, CommitError>> + Send + '_ {
        self.commit(Some(cancelled))
    }
}

impl DeltaCommit {
    fn new(batch: Batch) -> DeltaCommit {
        let name = batch.name.clone();
        let chained = batch.exact.is_some() || batch.arrival.is_some();
        DeltaCommit {
            name,
            work: CommitAtClose::new(batch, chained),
        }
    }

    fn failed(name: String, e: CommitError) -> SinkError {
        // The object store or the log may pass (a race with another writer, a network fault);
        // an encoder fault does not.
        let retryable = matches!(
            e,
            CommitError::Delta(DeltaError::Delta { .. } | DeltaError::Upload { .. })
        );
        SinkError::Commit {
            name,
            source: Box::new(e),
            retryable,
        }
    }
}

#[async_trait::async_trait]
impl Durable for DeltaCommit {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> crate::telemetry::DurableKind {
        crate::telemetry::DurableKind::Commit
    }

    /// Encode the Parquet file, upload it and commit it ([`Batch::commit`]). Returns the file's
    /// size and the data files the commit added. On error nothing is in the table.
    async fn make_durable(self: Box<Self>) -> Result<crate::receipt::Written, SinkError> {
        let DeltaCommit { name, work } = *self;
        let result = match work.finish().await {
            Ok(r) => r,
            Err(e) => Err(CommitError::Panicked(e)),
        };
        match result {
            Ok(written) => Ok(written),
            Err(e) => Err(DeltaCommit::failed(name, e)),
        }
    }

    async fn abort(self: Box<Self>) {
        self.work.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::TxnVersions;
    use super::*;
    use crate::message::Message;
    use crate::table::{RowOptions, SchemaMode, TableSchema};

    fn message(tp: &str, offset: i64, id: Option<i64>) -> Message {
        let data = match id {
            Some(id) => serde_json::json!({ "id": id }),
            None => serde_json::json!({ "nope": 1 }),
        };
        Message {
            data: data.to_string().into_bytes().into(),
            attributes: Default::default(),
            message_id: format!("{tp}/{offset}"),
            publish_time_micros: 1_714_521_600_000_000,
            ordering_key: String::new(),
        }
    }

    /// Under `--exactly-once` a commit carries each partition's last offset as its `txn`
    /// version; once a record of a partition is refused, no later record of it is written (so no
    /// version passes it); a commit whose partition's previous commit failed fails too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exact_commits_carry_txn_versions_and_never_pass_a_refused_record() {
        let dest = Destination::from_url("memory://").unwrap();
        let schema =
            TableSchema::from_json(r#"[{"name": "id", "type": "INTEGER", "mode": "REQUIRED"}]"#)
                .unwrap();
        let rows = RowBuilder::new(
            &schema,
            RowOptions {
                mode: SchemaMode::UseTableSchema,
                write_metadata: false,
                drop_unknown_fields: false,
                subscription_name: "projects/p/subscriptions/s".into(),
            },
        )
        .unwrap();
        let table = DeltaTable::open_or_create(&dest, &rows.schema())
            .await
            .unwrap();
        let limits = Limits {
            max_duration: std::time::Duration::from_secs(60),
            max_bytes: None,
            max_messages: None,
        };
        let mut sink = DeltaSink::new(
            rows,
            limits,
            table,
            crate::table::default_writer_properties(),
        );
        let streams = Streams {
            name: "X".into(),
            scheme: "subsink-x".into(),
            reader: "g".into(),
        };
        sink.exact = Some(StreamOrder::new(streams.clone()));
        let push = |f: &mut DeltaFile, m: &Message| match f.stage(&positioned(&streams, m)) {
            Ok(_) => {
                f.commit();
                true
            }
            Err(_) => false,
        };
        let mut f = sink.open(None).unwrap();
        for o in 10..15 {
            assert!(push(&mut f, &message("t/0", o, Some(o))));
        }
        assert!(push(&mut f, &message("t/1", 3, Some(3))));
        // t/1's record 4 cannot be a row: record 5 and later are refused too, t/0 goes on.
        assert!(!push(&mut f, &message("t/1", 4, None)));
        assert!(!push(&mut f, &message("t/1", 5, Some(5))));
        assert!(push(&mut f, &message("t/0", 15, Some(15))));
        Box::new(f.close()).make_durable().await.unwrap();
        let mut versions = TxnVersions::new(&dest);
        let v = |p: i32| streams.key("t", p).app_id();
        assert_eq!(versions.version(&v(0)).await.unwrap(), Some(15));
        assert_eq!(versions.version(&v(1)).await.unwrap(), Some(3));
        let mut f = sink.open(None).unwrap();
        assert!(!push(&mut f, &message("t/1", 6, Some(6))));
        assert!(
            push(&mut f, &message("t/1", 2, Some(2))),
            "below the refused record"
        );
        // A commit of t/0 that the table refuses (it holds t/0 up to 15 already) ...
        assert!(push(&mut f, &message("t/0", 12, Some(12))));
        let failed = Box::new(f.close());
        // ... fails the next commit of t/0, though that one alone would land.
        let mut g = sink.open(None).unwrap();
        assert!(push(&mut g, &message("t/0", 16, Some(16))));
        let next = Box::new(g.close());
        let err = failed.make_durable().await.unwrap_err().to_string();
        assert!(
            err.contains("its records are in the table already"),
            "{err}"
        );
        let err = next.make_durable().await.unwrap_err().to_string();
        assert!(err.contains("an earlier commit"), "{err}");
        assert_eq!(versions.version(&v(0)).await.unwrap(), Some(15));
        assert_eq!(sink.table.lock().await.version(), 1);
    }

    /// The data files of the table at `dir`: per file, its columns and its `extra` values.
    fn data_files(dir: &std::path::Path) -> Vec<(Vec<String>, Vec<Option<String>>)> {
        use arrow_array::Array;
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_none_or(|x| x != "parquet") {
                continue;
            }
            let f = std::fs::File::open(&p).unwrap();
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
                .unwrap()
                .build()
                .unwrap();
            let mut cols = Vec::new();
            let mut extra = Vec::new();
            for b in reader {
                let b = b.unwrap();
                cols = b
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect();
                if let Some(c) = b.column_by_name("extra") {
                    let c = c
                        .as_any()
                        .downcast_ref::<arrow_array::StringArray>()
                        .unwrap();
                    extra.extend(
                        (0..c.len()).map(|i| c.is_valid(i).then(|| c.value(i).to_string())),
                    );
                }
            }
            out.push((cols, extra));
        }
        out.sort();
        out
    }

    /// `msg` as a positioned source hands it over: its position on its receipt.
    fn positioned(streams: &Streams, msg: &Message) -> Received {
        Received {
            msg: msg.clone(),
            receipt: crate::message::Receipt {
                position: streams.position_of(&msg.message_id).map(Arc::new),
                ..Default::default()
            },
        }
    }

    fn row(json: serde_json::Value) -> Message {
        Message {
            data: json.to_string().into_bytes().into(),
            ..Default::default()
        }
    }

    /// Schema changes while running (docs/destinations.md): a NULLABLE column another writer
    /// adds lands under an open batch (its commit still fits: committed without the column) and
    /// is written from the next batch on; a retyped column holds the next commit — nothing
    /// committed, the sink's problem says SCHEMA_MISMATCH naming the column — until the table
    /// fits again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn added_columns_are_taken_up_and_a_retyped_column_holds_commits_until_fixed() {
        use deltalake_core::kernel::{DataType as D, PrimitiveType, StructField};
        let dir = tempfile::tempdir().unwrap();
        let dest = Destination::from_url(&format!("file://{}", dir.path().display())).unwrap();
        let schema = TableSchema::from_json(
            r#"[{"name": "id", "type": "INTEGER", "mode": "REQUIRED"},
                {"name": "name", "type": "STRING"}]"#,
        )
        .unwrap();
        let rows = RowBuilder::new(
            &schema,
            RowOptions {
                mode: SchemaMode::UseTableSchema,
                write_metadata: false,
                drop_unknown_fields: true,
                subscription_name: "projects/p/subscriptions/s".into(),
            },
        )
        .unwrap();
        let table = DeltaTable::open_or_create(&dest, &rows.schema())
            .await
            .unwrap();
        let limits = Limits {
            max_duration: Duration::from_secs(60),
            max_bytes: None,
            max_messages: None,
        };
        let props = crate::table::default_writer_properties();
        let mut sink = DeltaSink::new(rows, limits, table, props);
        let refresh = Duration::from_millis(100);
        sink.watch = Some(DeltaSchemaWatch::new(&dest.url, &sink.schema, refresh));
        let push = |f: &mut DeltaFile, id: i64| {
            f.stage(&Received {
                msg: row(serde_json::json!({"id": id, "name": "n", "extra": format!("x{id}")})),
                receipt: Default::default(),
            })
            .unwrap();
            f.commit();
        };
        let mut open = sink.open(None).unwrap();
        push(&mut open, 1);
        // Another writer adds a NULLABLE column under the open batch.
        let other = || async {
            let mut t = deltalake_core::DeltaTable::new(super::table::log_store(&dest));
            t.load().await.unwrap();
            t
        };
        other()
            .await
            .add_columns()
            .with_fields([StructField::new(
                "extra",
                D::Primitive(PrimitiveType::String),
                true,
            )])
            .await
            .unwrap();
        Box::new(open.close()).make_durable().await.unwrap();
        let mut next = sink.open(None).unwrap();
        push(&mut next, 2);
        Box::new(next.close()).make_durable().await.unwrap();
        assert_eq!(
            data_files(dir.path()),
            [
                (vec!["id".to_string(), "name".into()], vec![]),
                (
                    vec!["id".to_string(), "name".into(), "extra".into()],
                    vec![Some("x2".to_string())]
                ),
            ]
        );
        assert!(sink.problem().is_none());
        let version = sink.table.lock().await.version();
        assert_eq!(version, 3);

        // `name` retyped (the table replaced with another schema): the next commit waits.
        let retyped = |ty: PrimitiveType| {
            vec![
                StructField::new("id", D::Primitive(PrimitiveType::Long), false),
                StructField::new("name", D::Primitive(ty), true),
                StructField::new("extra", D::Primitive(PrimitiveType::String), true),
            ]
        };
        let replace = |fields: Vec<StructField>| async {
            deltalake_core::operations::create::CreateBuilder::new()
                .with_log_store(super::table::log_store(&dest))
                .with_columns(fields)
                .with_save_mode(deltalake_core::protocol::SaveMode::Overwrite)
                .await
                .unwrap()
                .version()
                .unwrap() as i64
        };
        let broken = replace(retyped(PrimitiveType::Long)).await;
        let mut held = sink.open(None).unwrap();
        push(&mut held, 3);
        let commit = tokio::spawn(Box::new(held.close()).make_durable());
        tokio::time::sleep(refresh * 5).await;
        assert!(
            !commit.is_finished(),
            "committed into a table it does not fit"
        );
        let problem = sink.problem().unwrap_or_default();
        assert!(
            problem.starts_with("SCHEMA_MISMATCH: Delta table file://")
                && problem.contains("column `name` is long in the table, subsink writes string"),
            "{problem}"
        );
        assert_eq!(other().await.version().unwrap() as i64, broken);
        // Fixed: the held commit lands within a refresh interval or so.
        let fixed = replace(retyped(PrimitiveType::String)).await;
        tokio::time::timeout(refresh * 20, commit)
            .await
            .expect("held after the fix")
            .unwrap()
            .unwrap();
        assert_eq!(other().await.version().unwrap() as i64, fixed + 1);
        assert!(sink.problem().is_none());
    }
}
