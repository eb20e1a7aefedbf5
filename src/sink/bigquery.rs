//! The BigQuery sink: a BigQuery subscription's rows (docs/contract.md §4) appended to a BigQuery
//! table through the Storage Write API (`AppendRows`, Arrow rows), as Pub/Sub's own BigQuery
//! subscription writes them. A keyed table (change data capture, with the `_CHANGE_TYPE` and
//! `_CHANGE_SEQUENCE_NUMBER` pseudo-columns) takes protobuf rows instead ([`proto`]): BigQuery's
//! CDC does not take Arrow rows.
//!
//! Rows are made by the destination-independent mapping core ([`RowBuilder`], the same as for
//! Delta tables): a file is one batch of Arrow rows, closed on the subscription's table limits, and
//! made durable by appending it — in requests below BigQuery's 10 MB request limit — and, only
//! then, settled.
//!
//! | mode | stream | guarantee |
//! |---|---|---|
//! | default | the table's `_default` stream | at least once: rows are visible once their append is acknowledged; a file that fails after some of its requests landed, or whose settling is lost in a crash, is written again |
//! | `--exactly-once` | one PENDING stream per file, appended with offsets, finalized and committed with `BatchCommitWriteStreams` | a file's rows become visible together or not at all; a retried request is deduplicated by its offset; after a crash the checkpoint (file source) asks BigQuery whether the file's stream was committed, so resuming writes no row twice |
//!
//! ## `--exactly-once` with a positioned source ([`positions`])
//! The same PENDING streams, with `writeMetadata` (every row's `message_id` is its position,
//! `STREAM/PART/OFFSET`), so that the table itself says how far each stream partition is written:
//! * a partition's commits land in offset order, and once a record of a partition is refused no
//!   later one is written in the run ([`super::order`], as for a Delta table); a batch with a row
//!   BigQuery rejected is not committed at all (a later row of its partition would pass it);
//! * before a partition's first record (after every assignment) the source asks the table for the
//!   partition's highest offset ([`positions::BigQueryDurableStreams`], one query) and skips what it
//!   holds;
//! * right before its `BatchCommitWriteStreams` a batch asks again, and is not committed when the
//!   table holds one of its partitions at or past the batch's first offset of it (another reader
//!   of the stream wrote those records: a rebalance while this batch was in flight). BigQuery has
//!   no conditional commit, so two workers that both ask before either commits both commit: a
//!   window the source's documentation states.
//!
//! Rows BigQuery rejects fail alone ([`Written::rejected`]): its `row_errors` name them and the
//! request is sent again without them; a request refused as a whole (`INVALID_ARGUMENT` without
//! row errors, as the emulator answers) is split in halves until the bad rows stand alone.

mod append;
pub mod client;
pub mod positions;
pub mod proto;
pub mod register;
pub mod schema;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_ipc::writer::{
    write_message, DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions,
};
use bytes::Bytes;

pub use append::RETRY_FOR;
use append::{split_on_row_errors, Appender};
pub use client::{BigQueryClient, BigQueryError, TableRef};
pub use positions::StreamRows;
use positions::{BigQueryDurableStreams, Exact, ExactBatch};
pub use schema::BigQuerySchemaWatch;

use super::chunk::{message_bytes, CHUNK_ROWS};
use super::commit_at_close::{ClosedBatch, CommitAtClose};
use super::order::{self, Parts, StreamOrder};
use super::{Durable, PushError, Sink, SinkError, SinkFile, Unstaged};
use crate::batch::Limits;
use crate::config::BigQuerySettings;
use crate::message::Received;
use crate::position::{DurableStreams, Position, Streams};
use crate::receipt::{Refusal, Refused, Rejected, Written};
use crate::table::RowBuilder;

/// Largest `AppendRows` request sent (as estimated: rows, writer schema, stream name and 64
/// bytes): 9.5 MiB, below BigQuery's 10 MB (10,000,000 bytes) limit with 38 KB of room for the
/// request's framing. A message of 9 MiB (Pub/Sub allows 10 MB) fits with its metadata columns;
/// one of 9.5 MiB or more does not (its row fails alone).
pub const MAX_REQUEST_BYTES: usize = 19 << 19;

/// Message bytes gathered into one record batch, i.e. one `AppendRows` request: close to the
/// request limit, so a file takes few round trips; a batch that encodes past
/// [`MAX_REQUEST_BYTES`] is split in halves.
pub const CHUNK_BYTES: u64 = 8 << 20;

/// How rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// The `_default` stream: at least once.
    #[default]
    AtLeastOnce,
    /// A PENDING stream per file with offsets, committed with `BatchCommitWriteStreams`.
    ExactlyOnce,
}

/// Where and how rows are written (besides the subscription's `bigqueryConfig`).
pub struct BigQueryOutput {
    pub table: TableRef,
    /// REST endpoint (`None`: Google's), for `tables.get`.
    pub rest: Option<String>,
    /// Storage Write API endpoint (`None`: Google's).
    pub storage: Option<String>,
    /// The row mapping, checked against the table's schema at startup.
    pub rows: RowBuilder,
    pub mode: WriteMode,
    /// `--exactly-once` with a positioned source (with [`WriteMode::ExactlyOnce`]): where the
    /// rows of each stream partition are found again.
    pub positions: Option<StreamRows>,
    /// Change data capture (a keyed table): rows go as protobuf rows ([`proto`]), which
    /// BigQuery's CDC requires, instead of Arrow rows.
    pub cdc: bool,
    /// `--table-schema-refresh`: how often the table's schema is read again while running
    /// ([`BigQuerySchemaWatch`]); `None`: never.
    pub schema_refresh: Option<Duration>,
    /// The table's columns as `tables.get` gave them at startup (`None`: the schema came from a
    /// file; the watch reads the table first).
    pub table_columns: Option<Vec<crate::table::TableField>>,
}

impl BigQueryOutput {
    /// `--exactly-once` with a positioned source (`streams`): PENDING streams, and rows found
    /// again by position among those of `subscription` (the table's `subscription_name`).
    pub fn hold_positions(&mut self, streams: &Streams, subscription: &str) {
        self.mode = WriteMode::ExactlyOnce;
        self.positions = Some(StreamRows {
            table: self.table.clone(),
            subscription: subscription.to_string(),
            streams: streams.clone(),
        });
    }
}

/// The columns Pub/Sub requires a BigQuery table to have for `opts` and that `schema` lacks: `data`
/// in no-schema mode, the four metadata columns with `write_metadata` (a Delta table is extended
/// with them instead; a BigQuery table is not altered).
pub fn missing_columns(
    schema: &crate::table::TableSchema,
    opts: &crate::table::RowOptions,
) -> Vec<&'static str> {
    let mut need = Vec::new();
    if opts.mode == crate::table::SchemaMode::NoSchema {
        need.push("data");
    }
    if opts.write_metadata {
        need.extend([
            "subscription_name",
            "message_id",
            "publish_time",
            "attributes",
        ]);
    }
    need.retain(|c| schema.field(c).is_none());
    need
}

/// The Arrow IPC schema message of `schema`, as `ArrowSchema.serialized_schema`.
pub fn ipc_schema(schema: &arrow_schema::Schema) -> Bytes {
    let opts = IpcWriteOptions::default();
    let data = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(
        schema,
        &mut DictionaryTracker::new(false),
        &opts,
    );
    let mut out = Vec::new();
    write_message(&mut out, data, &opts).expect("writing to memory");
    out.into()
}

/// The Arrow IPC record batch message of `batch`, as `ArrowRecordBatch.serialized_record_batch`.
pub fn ipc_batch(batch: &RecordBatch) -> Result<Bytes, arrow_schema::ArrowError> {
    let opts = IpcWriteOptions::default();
    let (_, data) = IpcDataGenerator::default().encode(
        batch,
        &mut DictionaryTracker::new(false),
        &opts,
        &mut IpcWriteContext::default(),
    )?;
    // Sized once (prefix, header and its padding, body): a buffer grown by doubling would hold
    // up to twice a large row's bytes while it is sent (issue 26).
    let mut out = Vec::with_capacity(16 + data.ipc_message.len() + data.arrow_data.len());
    write_message(&mut out, data, &opts)?;
    Ok(out.into())
}

/// Rows appended to a BigQuery table.
pub struct BigQuerySink {
    rows: RowBuilder,
    limits: Limits,
    shared: Arc<Shared>,
    mode: WriteMode,
    files: u64,
    exact: Option<Exact>,
    /// The check the pipeline runs on every message, replaced when new columns are taken up.
    check: Arc<super::RowCheck>,
    /// The run's shutdown grace: creating a PENDING stream in [`Sink::open`] gives up when it
    /// ends.
    grace: crate::shutdown::Grace,
}

/// What every file of a sink shares (a batch keeps the one it was opened with).
struct Shared {
    table: TableRef,
    client: BigQueryClient,
    format: Format,
    /// The table's schema while running: appends wait while it does not fit.
    watch: Option<Arc<BigQuerySchemaWatch>>,
}

/// How the rows go on the wire.
enum Format {
    /// Arrow rows: the IPC schema message of the rows.
    Arrow(Bytes),
    /// Protobuf rows (change data capture): their descriptor, and an upper estimate of its size.
    Proto(Box<prost_types::DescriptorProto>, usize),
}

impl Format {
    /// The rows of `b` as one request's, and its estimated size without the stream name.
    fn encode(&self, b: &RecordBatch) -> Result<(client::AppendRows, usize), String> {
        match self {
            Format::Arrow(schema) => {
                let batch = ipc_batch(b).map_err(|e| e.to_string())?;
                let size = batch.len() + schema.len() + 64;
                Ok((client::AppendRows::arrow(schema.clone(), batch), size))
            }
            Format::Proto(descriptor, d) => {
                proto::check_change_types(b)?;
                let (rows, bytes) = proto::encode_rows(b)?;
                // Each row's tag and length: at most 5 bytes below the request limit.
                let size = bytes + 5 * rows.len() + d + 64;
                Ok((
                    client::AppendRows::proto((**descriptor).clone(), rows),
                    size,
                ))
            }
        }
    }
}

impl Format {
    /// How rows of `rows` go on the wire: protobuf rows for change data capture, else Arrow.
    fn of(rows: &RowBuilder, cdc: bool, table: &TableRef) -> Result<Format, BigQueryError> {
        if !cdc {
            return Ok(Format::Arrow(ipc_schema(&rows.schema())));
        }
        let d = proto::descriptor(&rows.schema()).map_err(|reason| BigQueryError::Schema {
            table: table.to_string(),
            reason,
        })?;
        let size = proto::descriptor_size(&d);
        Ok(Format::Proto(Box::new(d), size))
    }
}

impl BigQuerySink {
    /// The sink of `out` (inside the runtime: the gRPC channel starts its worker there, and so
    /// does the schema watch's task).
    pub fn new(bq: &BigQuerySettings, out: BigQueryOutput) -> Result<BigQuerySink, BigQueryError> {
        let client = BigQueryClient::new(out.rest.as_deref(), out.storage.as_deref())?;
        let watch = out.schema_refresh.map(|refresh| {
            let w = BigQuerySchemaWatch::new(
                out.table.clone(),
                client.clone(),
                out.rows.columns(),
                refresh,
            );
            let read_first = match &out.table_columns {
                Some(columns) => {
                    w.observe(columns);
                    false
                }
                None => true,
            };
            tokio::spawn(BigQuerySchemaWatch::run(Arc::downgrade(&w), read_first));
            w
        });
        Ok(BigQuerySink {
            limits: Limits {
                max_duration: bq.max_duration,
                max_bytes: bq.max_bytes,
                max_messages: bq.max_messages,
            },
            shared: Arc::new(Shared {
                format: Format::of(&out.rows, out.cdc, &out.table)?,
                table: out.table,
                client,
                watch,
            }),
            check: Arc::new(super::RowCheck::new(&out.rows)),
            rows: out.rows,
            mode: out.mode,
            grace: crate::shutdown::Grace::never(),
            files: 0,
            exact: out.positions.map(|rows| Exact {
                order: StreamOrder::new(rows.streams.clone()),
                rows,
            }),
        })
    }

    /// New NULLABLE columns of the table, found by the schema watch: the next batch and every
    /// later one writes them, mapped as at startup (use_table_schema and use_topic_schema fill
    /// them from the message field of their name; no-schema mode writes NULL).
    fn take_up(&mut self) {
        let Some(watch) = self.shared.watch.clone() else {
            return;
        };
        let added = watch.take_added();
        if added.is_empty() {
            return;
        }
        let cdc = matches!(self.shared.format, Format::Proto(..));
        let taken = self.rows.with_columns(&added).and_then(|rows| {
            let format = Format::of(&rows, cdc, &self.shared.table).map_err(|e| e.to_string())?;
            Ok((rows, format))
        });
        match taken {
            Ok((rows, format)) => {
                tracing::info!(
                    table = %self.shared.table,
                    columns = ?added.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
                    "new columns written from this batch on"
                );
                self.check.replace(&rows);
                watch.set_writes(rows.columns());
                self.rows = rows;
                self.shared = Arc::new(Shared {
                    table: self.shared.table.clone(),
                    client: self.shared.client.clone(),
                    format,
                    watch: Some(watch),
                });
            }
            // Rows without the columns still fit the table (NULL there).
            Err(why) => tracing::warn!(
                columns = ?added.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
                "new table columns are not written: {why}"
            ),
        }
    }
}

impl Sink for BigQuerySink {
    type File = BigQueryFile;

    fn limits(&self) -> Limits {
        self.limits
    }

    fn refusal(&self) -> Refusal {
        Refusal::FailsAlone
    }

    fn check(&self) -> Option<std::sync::Arc<dyn crate::receipt::MessageCheck>> {
        Some(self.check.clone())
    }

    fn rejects_rows(&self) -> bool {
        true
    }

    fn problem(&self) -> Option<String> {
        self.shared.watch.as_ref().and_then(|w| w.problem())
    }

    fn durable_streams(&self) -> Option<Arc<dyn DurableStreams>> {
        let exact = self.exact.as_ref()?;
        Some(Arc::new(BigQueryDurableStreams {
            rows: exact.rows.clone(),
            client: self.shared.client.clone(),
        }))
    }

    fn bounded_by(&mut self, grace: &crate::shutdown::Grace) {
        self.grace = grace.clone();
    }

    /// Exactly once: the file's PENDING stream is created here, so its name is the file's name,
    /// recorded (by the checkpoint) before any row is appended. Needs the multi-threaded runtime
    /// (the binary's): the call waits in place.
    fn open(&mut self, _group: Option<&str>) -> Result<BigQueryFile, PushError> {
        self.take_up();
        self.files += 1;
        let stream = match self.mode {
            WriteMode::AtLeastOnce => None,
            WriteMode::ExactlyOnce => {
                let (s, grace) = (self.shared.clone(), self.grace.clone());
                let created = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(async move {
                        grace.bound(s.client.create_pending_stream(&s.table)).await
                    })
                });
                let Some(created) = created else {
                    // The grace ended while BigQuery did not answer: no file is opened.
                    return Err(SinkError::GaveUp {
                        name: self.shared.table.to_string(),
                    }
                    .into());
                };
                Some(created.map_err(|e| SinkError::Commit {
                    name: self.shared.table.to_string(),
                    retryable: e.retryable(),
                    source: Box::new(e),
                })?)
            }
        };
        let name = stream.clone().unwrap_or_else(|| {
            format!(
                "{}/append-{}-{}",
                self.shared.table.default_stream(),
                std::process::id(),
                self.files
            )
        });
        Ok(BigQueryFile {
            name,
            stream,
            rows: self.rows.fresh(),
            chunks: Vec::new(),
            ids: Vec::new(),
            unsent_bytes: 0,
            held_bytes: 0,
            staged: (0, String::new()),
            shared: self.shared.clone(),
            exact: self.exact.clone(),
            parts: Parts::new(),
            staged_at: None,
        })
    }

    async fn is_durable(&self, name: &str) -> Result<bool, SinkError> {
        if name.contains("/streams/_default/") {
            // A default-stream append: what landed of it cannot be told (at least once).
            return Ok(false);
        }
        self.shared
            .client
            .is_committed(name)
            .await
            .map_err(|e| SinkError::Commit {
                name: name.to_string(),
                retryable: e.retryable(),
                source: Box::new(e),
            })
    }
}

/// One open batch of rows.
pub struct BigQueryFile {
    /// The PENDING stream's name (exactly once), or a name for the log (default stream).
    name: String,
    stream: Option<String>,
    rows: RowBuilder,
    /// Rows finished into record batches, in order.
    chunks: Vec<RecordBatch>,
    /// Message id of every row, in order (for the errors of rejected rows).
    ids: Vec<String>,
    unsent_bytes: u64,
    /// Message bytes of every row of the file.
    held_bytes: u64,
    /// Bytes and message id of the staged row.
    staged: (u64, String),
    shared: Arc<Shared>,
    exact: Option<Exact>,
    /// `--exactly-once`: per stream partition, the first and last offset of its rows.
    parts: Parts,
    /// `--exactly-once`: the position of the staged row.
    staged_at: Option<Position>,
}

impl SinkFile for BigQueryFile {
    type Closed = BigQueryAppend;

    fn name(&self) -> &str {
        &self.name
    }

    fn header_bytes(&self) -> u64 {
        0
    }

    fn stage(&mut self, r: &Received) -> Result<u64, Refused> {
        let msg = &r.msg;
        match &self.exact {
            Some(exact) => {
                let rows = &mut self.rows;
                self.staged_at = exact.order.stage(r, || rows.append(msg))?;
            }
            None => self.rows.append(msg)?,
        }
        self.staged = (message_bytes(msg), msg.message_id.clone());
        Ok(self.staged.0)
    }

    fn commit(&mut self) {
        order::count(&mut self.parts, self.staged_at.take());
        self.unsent_bytes += self.staged.0;
        self.held_bytes += self.staged.0;
        self.ids.push(std::mem::take(&mut self.staged.1));
        if self.rows.len() >= CHUNK_ROWS || self.unsent_bytes >= CHUNK_BYTES {
            self.unsent_bytes = 0;
            self.chunks.push(self.rows.finish());
        }
    }

    /// Every row of the file waits in memory for its append (the memory budget sees them all),
    /// and appending holds one request twice more: its Arrow IPC message and the gRPC frame
    /// it is encoded into (each up to [`MAX_REQUEST_BYTES`]), counted from the start so the
    /// budget finalizes files early enough for them (issue 26).
    fn buffered(&self) -> u64 {
        self.held_bytes + 2 * self.held_bytes.min(MAX_REQUEST_BYTES as u64)
    }

    fn unstage(&mut self, _carry: &mut Vec<u8>) -> Unstaged {
        self.rows.pop_row();
        self.staged_at = None;
        Unstaged::Restage
    }

    fn close(mut self) -> BigQueryAppend {
        if !self.rows.is_empty() {
            self.chunks.push(self.rows.finish());
        }
        let exact = self.exact.map(|e| ExactBatch {
            order: e.order.chain(self.parts.keys()),
            rows: e.rows,
            parts: self.parts,
        });
        let batch = Batch {
            name: self.name,
            stream: self.stream,
            chunks: self.chunks,
            ids: self.ids,
            shared: self.shared,
        };
        let name = batch.name.clone();
        // Under way on a task of its own from now on (as a Delta commit under
        // `--exactly-once`): a batch waiting for the previous commit of one of its partitions
        // never holds a slot that commit needs, and its rows are appended meanwhile.
        let chained = exact.is_some();
        let work = CommitAtClose::new(Closed { batch, exact }, chained);
        BigQueryAppend { name, work }
    }
}

/// A closed batch of rows, to append (and commit).
pub struct BigQueryAppend {
    name: String,
    /// `--exactly-once` with a positioned source: under way since the batch closed
    /// ([`CommitAtClose`]); cancelled before its commit by [`Durable::abort`].
    work: CommitAtClose<Closed>,
}

/// What making a closed batch durable takes: its rows, and under `--exactly-once` its place in
/// its partitions' order.
struct Closed {
    batch: Batch,
    exact: Option<ExactBatch>,
}

impl ClosedBatch for Closed {
    type Error = SinkError;

    fn write(
        self,
        cancelled: &AtomicBool,
    ) -> impl std::future::Future<Output = Result<Written, SinkError>> + Send + '_ {
        self.batch.write(self.exact.map(|e| (e, cancelled)))
    }
}

/// A closed batch's rows.
struct Batch {
    name: String,
    stream: Option<String>,
    chunks: Vec<RecordBatch>,
    ids: Vec<String>,
    shared: Arc<Shared>,
}

impl Batch {
    fn failed(&self, e: BigQueryError) -> SinkError {
        SinkError::Commit {
            name: self.name.clone(),
            retryable: e.retryable(),
            source: Box::new(e),
        }
    }

    fn reject(&self, index: usize, why: &str) -> Rejected {
        let id = self.ids.get(index).map(String::as_str).unwrap_or("?");
        Rejected {
            index,
            error: format!(
                "message {id:?}: BigQuery rejected its row in {}: {why}",
                self.shared.table
            ),
        }
    }
}

impl Batch {
    /// Append every row (split below the request limit; rejected rows left out and reported),
    /// then — exactly once — finalize and commit the batch's stream (under `--exactly-once` with
    /// a positioned source: after the previous commits of its partitions, and only when the table
    /// does not hold them past its first offsets already, [`positions::commit_exact`]).
    async fn write(
        mut self,
        exact: Option<(ExactBatch, &AtomicBool)>,
    ) -> Result<Written, SinkError> {
        let shared = self.shared.clone();
        let mut app = Appender {
            client: shared.client.clone(),
            stream: self
                .stream
                .clone()
                .unwrap_or_else(|| shared.table.default_stream()),
            call: None,
            offset: self.stream.as_ref().map(|_| 0),
            first_failure: None,
            backoff: Duration::from_millis(500),
        };
        let (bytes, rows, rejected) = self.append_all(&mut app).await?;
        self.commit_stream(exact, &rejected).await?;
        tracing::debug!(file = %self.name, rows, rejected = rejected.len(), "appended");
        Ok(Written {
            bytes,
            rejected,
            committed: None,
        })
    }

    /// Append every row through `app`: split below the request limit, held while the table does
    /// not fit (SCHEMA_MISMATCH), rows BigQuery rejects left out. Returns the bytes appended,
    /// the rows of the batch and the rejected rows, in order.
    async fn append_all(
        &mut self,
        app: &mut Appender,
    ) -> Result<(u64, usize, Vec<Rejected>), SinkError> {
        let shared = self.shared.clone();
        let mut rejected = Vec::new();
        let mut bytes = 0u64;
        let mut rechecked = false;
        // Pieces still to send: (rows, index of their first row in the file), sent from the back.
        // (Taken out of the file: a chunk's rows are freed once appended.)
        let mut work: Vec<(RecordBatch, usize)> = Vec::new();
        let mut base = 0;
        for c in std::mem::take(&mut self.chunks) {
            let n = c.num_rows();
            work.push((c, base));
            base += n;
        }
        work.reverse();
        while let Some((b, at)) = work.pop() {
            let n = b.num_rows();
            if n == 0 {
                continue;
            }
            let (request, size) = shared.format.encode(&b).map_err(|e| SinkError::Commit {
                name: self.name.clone(),
                retryable: false,
                source: e.into(),
            })?;
            let size = size + app.stream.len();
            if size > MAX_REQUEST_BYTES {
                if n == 1 {
                    rejected.push(self.reject(
                        at,
                        &format!("the row alone is a {size}-byte request, past the Storage Write API's 10 MB request limit"),
                    ));
                } else {
                    tracing::debug!(
                        rows = n,
                        bytes = size,
                        "request past the limit: split in halves"
                    );
                    let half = n / 2;
                    work.push((b.slice(half, n - half), at + half));
                    work.push((b.slice(0, half), at));
                }
                continue;
            }
            // SCHEMA_MISMATCH: nothing is appended until the table fits again.
            if let Some(w) = &shared.watch {
                w.wait_fits().await;
            }
            let answer = app.append(&request, n).await;
            // Refused: a schema change since the last read holds the request (sent again once
            // the table fits) instead of failing its rows. Read at once, once per batch.
            if let (Some(w), Ok(client::Appended::RowErrors(_) | client::Appended::Refused(_))) =
                (&shared.watch, &answer)
            {
                if !rechecked {
                    rechecked = true;
                    if !w.recheck().await {
                        rechecked = false;
                        work.push((b, at));
                        continue;
                    }
                }
            }
            match answer {
                Ok(client::Appended::Done) | Ok(client::Appended::AlreadyExists) => {
                    bytes += size as u64;
                }
                Ok(client::Appended::RowErrors(errs)) => {
                    // Nothing of the request is in: the rows it names are rejected, the runs
                    // of rows between them are sent again.
                    let split = split_on_row_errors(n, &errs);
                    // Each row is in one piece at a time and a rejected row is not sent again,
                    // so the split's rows (each once) are new to `rejected`.
                    for (i, why) in split.bad {
                        rejected.push(self.reject(at + i, why));
                    }
                    work.extend(
                        split
                            .again
                            .into_iter()
                            .rev()
                            .map(|(start, len)| (b.slice(start, len), at + start)),
                    );
                }
                Ok(client::Appended::Refused(why)) => {
                    if n == 1 {
                        rejected.push(self.reject(at, &why));
                    } else {
                        // Refused whole without naming rows: halve until the bad rows stand
                        // alone.
                        let half = n / 2;
                        work.push((b.slice(half, n - half), at + half));
                        work.push((b.slice(0, half), at));
                    }
                }
                Err(e) => return Err(self.failed(e)),
            }
        }
        rejected.sort_by_key(|r| r.index);
        Ok((bytes, base, rejected))
    }

    /// Exactly once: finalize the batch's stream and commit it (under `--exactly-once` with a
    /// positioned source: in its partitions' order, [`positions::commit_exact`]). Nothing to do
    /// on the default stream.
    async fn commit_stream(
        &self,
        exact: Option<(ExactBatch, &AtomicBool)>,
        rejected: &[Rejected],
    ) -> Result<(), SinkError> {
        let shared = &self.shared;
        if let Some(stream) = &self.stream {
            shared
                .client
                .finalize(stream)
                .await
                .map_err(|e| self.failed(e))?;
            match exact {
                None => shared
                    .client
                    .batch_commit(&shared.table, std::slice::from_ref(stream))
                    .await
                    .map_err(|e| self.failed(e))?,
                Some((exact, cancelled)) => {
                    let client = &shared.client;
                    positions::commit_exact(client, &self.name, stream, exact, rejected, cancelled)
                        .await?
                }
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Durable for BigQueryAppend {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> crate::telemetry::DurableKind {
        crate::telemetry::DurableKind::Commit
    }

    /// Append every row, then — exactly once — finalize and commit ([`Batch::write`]).
    async fn make_durable(self: Box<Self>) -> Result<Written, SinkError> {
        let BigQueryAppend { name, work } = *self;
        work.finish().await.unwrap_or_else(|e| {
            Err(SinkError::Commit {
                name,
                retryable: false,
                source: Box::new(e),
            })
        })
    }

    async fn abort(self: Box<Self>) {
        self.work.abort();
    }
}
