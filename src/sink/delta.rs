//! The Delta sink: a BigQuery subscription's rows (docs/contract.md §4), committed to a Delta Lake
//! table. A file is one open batch of rows ([`RowBuilder`], the destination-independent mapping
//! core in [`crate::table`]); it closes on the same three limits as a storage file (duration, bytes,
//! messages) and is made durable as one Parquet file committed to the table as one log version.
//!
//! A message that cannot become a row fails alone ([`crate::table::RowError`]) and is never part of a batch.
//!
//! Rows do not wait in memory for the batch to close: every [`CHUNK_ROWS`] rows or
//! [`CHUNK_BYTES`] message bytes they go as one record batch to the open file's [`ParquetEncoder`],
//! which encodes them on its own thread while the next rows convert. What an open batch holds is
//! its compressed Parquet pages, at most [`CHUNK_BYTES`] of rows not yet handed over, and the
//! encoder's short queue; closing a batch only encodes its last chunk.
//!
//! Bytes of a batch are counted as message bytes: payload plus attribute keys and values, known
//! before conversion; the Parquet file is smaller (zstd).

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::file::properties::WriterProperties;
use tokio::sync::Mutex;

use super::{Durable, PushError, Refusal, Refused, Sink, SinkError, SinkFile, Unstaged};
use crate::batch::Limits;
use crate::config::BigQuerySettings;
use crate::message::Message;
use crate::table::delta::{new_data_file_name, DataFile, DeltaTable};
use crate::table::encoder::{ParquetEncodeError, ParquetEncoder};
use crate::table::{DeltaError, RowBuilder};
use crate::upload::Destination;

/// Rows handed to the encoder at a time (at most).
pub const CHUNK_ROWS: usize = 8192;
/// Message bytes handed to the encoder at a time (at most, give or take one message): bounds the
/// rows in memory when messages are large.
pub const CHUNK_BYTES: u64 = 4 << 20;

/// Message bytes as the batch limits count them: payload plus attribute keys and values.
pub fn message_bytes(m: &Message) -> u64 {
    (m.data.len() + m.attributes.text_len()) as u64
}

/// Where and how rows are written (besides the subscription's `bigqueryConfig`).
pub struct DeltaSettings {
    /// The table's root.
    pub dest: Destination,
    /// The row mapping, checked against the table schema at startup.
    pub rows: RowBuilder,
    /// Parquet writer settings (compression); see [`crate::table::default_writer_properties`].
    pub parquet: WriterProperties,
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
}

impl DeltaSink {
    /// Open the table at `settings.dest` (created with the row builder's schema when absent).
    pub async fn open(
        bq: &BigQuerySettings,
        settings: DeltaSettings,
    ) -> Result<DeltaSink, Box<DeltaError>> {
        let table = DeltaTable::open_or_create(&settings.dest, &settings.rows.schema())
            .await
            .map_err(Box::new)?;
        let limits = Limits {
            max_duration: bq.max_duration,
            max_bytes: bq.max_bytes,
            max_messages: bq.max_messages,
        };
        Ok(DeltaSink::new(
            settings.rows,
            limits,
            table,
            settings.parquet,
        ))
    }

    /// A sink over an open table. `props`: the Parquet writer settings.
    pub fn new(
        rows: RowBuilder,
        limits: Limits,
        table: DeltaTable,
        props: WriterProperties,
    ) -> DeltaSink {
        DeltaSink {
            rows,
            limits,
            schema: table.schema().clone(),
            table: Arc::new(Mutex::new(table)),
            props,
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

    fn check(&self) -> Option<std::sync::Arc<dyn super::MessageCheck>> {
        Some(std::sync::Arc::new(super::RowCheck::new(&self.rows)))
    }

    fn open(&mut self, _group: Option<&str>) -> Result<DeltaFile, PushError> {
        Ok(DeltaFile {
            name: new_data_file_name(),
            rows: self.rows.fresh(),
            encoder: ParquetEncoder::start(self.schema.clone(), Some(self.props.clone())),
            unsent_bytes: 0,
            staged: 0,
            table: self.table.clone(),
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
    /// The file's encoder, or why it could not be started (the batch's commit then fails, and its
    /// messages are not done).
    encoder: std::io::Result<ParquetEncoder>,
    /// Message bytes of the rows in the builder, not yet handed to the encoder.
    unsent_bytes: u64,
    /// Message bytes of the staged row.
    staged: u64,
    table: Arc<Mutex<DeltaTable>>,
}

impl SinkFile for DeltaFile {
    type Closed = DeltaCommit;

    fn name(&self) -> &str {
        &self.name
    }

    fn header_bytes(&self) -> u64 {
        0
    }

    fn stage(&mut self, msg: &Message) -> Result<u64, Refused> {
        self.rows.append(msg)?;
        self.staged = message_bytes(msg);
        Ok(self.staged)
    }

    fn commit(&mut self) {
        self.unsent_bytes += self.staged;
        if self.rows.len() >= CHUNK_ROWS || self.unsent_bytes >= CHUNK_BYTES {
            self.unsent_bytes = 0;
            let rows = self.rows.finish();
            if let Ok(enc) = &self.encoder {
                // Blocks while the encoder is a few chunks behind: backpressure. An error means it
                // stopped; the batch's commit reports why.
                let _ = enc.write(rows);
            }
        }
    }

    fn buffered(&self) -> u64 {
        // Rows not yet handed over, and what the encoder holds: batches queued, encoded pages.
        self.unsent_bytes + self.encoder.as_ref().map_or(0, ParquetEncoder::memory)
    }

    fn unstage(&mut self, _carry: &mut Vec<u8>) -> Unstaged {
        self.rows.pop_row();
        Unstaged::Restage
    }

    fn close(mut self) -> DeltaCommit {
        let rest = (!self.rows.is_empty()).then(|| self.rows.finish());
        DeltaCommit {
            name: self.name,
            encoder: self.encoder,
            rest,
            table: self.table,
        }
    }
}

/// A closed batch: a Parquet file still being encoded, to finish and commit.
pub struct DeltaCommit {
    name: String,
    encoder: std::io::Result<ParquetEncoder>,
    /// The batch's last rows, not yet handed over.
    rest: Option<RecordBatch>,
    table: Arc<Mutex<DeltaTable>>,
}

/// Why a data file was not committed.
#[derive(Debug, thiserror::Error)]
enum CommitError {
    #[error("cannot start the Parquet encoder thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the Parquet encoder panicked: {0}")]
    Panicked(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Encode(#[from] ParquetEncodeError),
    #[error(transparent)]
    Delta(#[from] DeltaError),
}

impl DeltaCommit {
    fn failed(&self, e: CommitError) -> SinkError {
        // The object store or the log may pass (a race with another writer, a network fault);
        // an encoder fault does not.
        let retryable = matches!(
            e,
            CommitError::Delta(DeltaError::Delta { .. } | DeltaError::Upload { .. })
        );
        SinkError::Commit {
            name: self.name.clone(),
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

    /// Encode the Parquet file (on a blocking thread: zstd is CPU work), upload it and commit it.
    /// Returns the file's size. On error nothing is in the table.
    async fn make_durable(mut self: Box<Self>) -> Result<super::Written, SinkError> {
        let encoder =
            match std::mem::replace(&mut self.encoder, Err(std::io::ErrorKind::Other.into())) {
                Ok(e) => e,
                Err(e) => return Err(self.failed(CommitError::Thread(e))),
            };
        let rest = self.rest.take();
        let file = tokio::task::spawn_blocking(move || {
            if let Some(rows) = rest {
                // An error here means the encoder stopped; finish() says why.
                let _ = encoder.write(rows);
            }
            encoder.finish()
        })
        .await;
        let file = match file {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Err(self.failed(e.into())),
            Err(e) => return Err(self.failed(CommitError::Panicked(e))),
        };
        let size = file.size();
        let committed = {
            let mut table = self.table.lock().await;
            table
                .commit(vec![DataFile {
                    path: self.name.clone(),
                    file,
                }])
                .await
        };
        match committed {
            Ok(version) => {
                tracing::debug!(file = %self.name, version, "committed");
                Ok(size.into())
            }
            Err(e) => Err(self.failed(e.into())),
        }
    }

    async fn abort(self: Box<Self>) {}
}
