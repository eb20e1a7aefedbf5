//! The table writer stage: messages → rows of one open batch ([`RowBuilder`]); a batch closes on
//! the same three limits as a storage file (duration, bytes, messages) and becomes a
//! [`TableCommit`]: one Parquet file written and committed to the Delta table as one log version.
//!
//! Like a storage file, a batch is made durable by the upload stage (`app`), and only then are its
//! messages settled (acked, or passed by the checkpoint). A message that cannot become a row fails
//! alone ([`RowError`]) and is never part of a batch.
//!
//! Rows do not wait in memory for the batch to close: every [`CHUNK_ROWS`] rows or
//! [`CHUNK_BYTES`] message bytes they go as one record batch to the open file's [`FileEncoder`],
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
use tokio::time::Instant;

use super::batch::{RowBuilder, RowError};
use super::delta::{new_data_file_name, DataFile, DeltaTable};
use super::encoder::FileEncoder;
use crate::batch::{Admit, FileStats, FlushReason, Limits};
use crate::checkpoint::Span;
use crate::message::Received;
use crate::upload::UploadError;
use crate::writer::{AckRef, FileContents, FileSink, FinalizedFile};

/// Rows handed to the encoder at a time (at most).
pub const CHUNK_ROWS: usize = 8192;
/// Message bytes handed to the encoder at a time (at most, give or take one message): bounds the
/// rows in memory when messages are large.
pub const CHUNK_BYTES: u64 = 4 << 20;

/// A closed batch: a Parquet file still being encoded, to finish and commit.
pub struct TableCommit {
    /// Data file path, relative to the table root.
    name: String,
    /// The file's encoder with every row but `rest`, or why it could not be started.
    encoder: Result<FileEncoder, String>,
    /// The batch's last rows, not yet handed over.
    rest: Option<RecordBatch>,
    table: Arc<Mutex<DeltaTable>>,
}

impl TableCommit {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Encode the Parquet file (on a blocking thread: zstd is CPU work), upload it and commit it.
    /// Returns the file's size. On error nothing is in the table.
    pub async fn finish(self) -> Result<u64, UploadError> {
        let name = self.name.clone();
        let err = |reason: String| UploadError::Commit {
            name: name.clone(),
            reason,
        };
        let encoder = self.encoder.map_err(|e| err(e.clone()))?;
        let rest = self.rest;
        let file = tokio::task::spawn_blocking(move || {
            if let Some(rows) = rest {
                // An error here means the encoder stopped; finish() says why.
                let _ = encoder.write(rows);
            }
            encoder.finish()
        })
        .await
        .map_err(|e| err(format!("Parquet encoder panicked: {e}")))?
        .map_err(|e| err(e.to_string()))?;
        let size = file.size();
        let mut table = self.table.lock().await;
        let version = table
            .commit(vec![DataFile {
                path: self.name.clone(),
                file,
            }])
            .await
            .map_err(|e| err(e.to_string()))?;
        tracing::debug!(file = %self.name, version, "committed");
        Ok(size)
    }
}

struct OpenBatch {
    id: u64,
    stats: FileStats,
    opened_at: Instant,
    contents: FileContents,
    /// The file's encoder, or why it could not be started (the batch's commit then fails, and its
    /// messages are not done).
    encoder: Result<FileEncoder, String>,
    /// Message bytes of the rows in the builder, not yet handed to the encoder.
    unsent_bytes: u64,
}

/// The table writer stage: one open batch at a time.
pub struct TableWriter {
    builder: RowBuilder,
    limits: Limits,
    table: Arc<Mutex<DeltaTable>>,
    open: Option<OpenBatch>,
    next_id: u64,
    schema: SchemaRef,
    props: WriterProperties,
}

/// Message bytes as the batch limits count them: payload plus attribute keys and values.
pub fn message_bytes(r: &Received) -> u64 {
    let m = &r.msg;
    (m.data.len()
        + m.attributes
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()) as u64
}

impl TableWriter {
    /// `props`: the Parquet writer settings (compression); see
    /// [`super::parquet::default_writer_properties`].
    pub fn new(
        builder: RowBuilder,
        limits: Limits,
        table: DeltaTable,
        props: WriterProperties,
    ) -> TableWriter {
        TableWriter {
            schema: table.schema().clone(),
            builder,
            limits,
            table: Arc::new(Mutex::new(table)),
            open: None,
            next_id: 0,
            props,
        }
    }

    /// The table, shared with the commits in flight.
    pub fn table(&self) -> Arc<Mutex<DeltaTable>> {
        self.table.clone()
    }

    /// Byte offset and line of the first message of the open batch (checkpoint watermark).
    pub fn open_starts(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.open
            .iter()
            .map(|b| (b.contents.span.first, b.contents.first_line))
    }

    /// Append one message as a row. A message that cannot be a row fails alone: the batch is
    /// unchanged. Batches the limits close are pushed to `done`.
    pub fn push(
        &mut self,
        r: &Received,
        ack: Option<AckRef>,
        done: &mut Vec<FinalizedFile>,
    ) -> Result<(), RowError> {
        let len = message_bytes(r);
        if let Some(b) = &self.open {
            if let Admit::FinalizeFirst(reason) = self.limits.admit(b.stats, len) {
                self.close(reason, done);
            }
        }
        self.builder.append(&r.msg)?;
        let b = self.open.get_or_insert_with(|| {
            self.next_id += 1;
            let encoder = FileEncoder::start(self.schema.clone(), Some(self.props.clone()))
                .map_err(|e| format!("cannot start the Parquet encoder thread: {e}"));
            OpenBatch {
                encoder,
                unsent_bytes: 0,
                id: self.next_id,
                stats: FileStats::default(),
                opened_at: Instant::now(),
                contents: FileContents {
                    span: Span {
                        group: None,
                        first: r.receipt.start,
                        last: r.receipt.start,
                    },
                    first_line: r.receipt.line,
                    last_line: r.receipt.line,
                    first_message_id: r.msg.message_id.clone(),
                    last_message_id: String::new(),
                    messages: 0,
                    acks: Vec::new(),
                },
            }
        });
        b.stats.bytes += len;
        b.stats.messages += 1;
        b.unsent_bytes += len;
        if self.builder.len() >= CHUNK_ROWS || b.unsent_bytes >= CHUNK_BYTES {
            b.unsent_bytes = 0;
            let rows = self.builder.finish();
            if let Ok(enc) = &b.encoder {
                // Blocks while the encoder is a few chunks behind: backpressure. An error means it
                // stopped; the batch's commit reports why.
                let _ = enc.write(rows);
            }
        }
        let c = &mut b.contents;
        c.span.last = r.receipt.start;
        c.last_line = r.receipt.line;
        c.last_message_id.clone_from(&r.msg.message_id);
        c.messages += 1;
        if let Some(ack) = ack {
            c.acks.push(ack);
        }
        if let Some(reason) = self.limits.full(b.stats) {
            self.close(reason, done);
        }
        Ok(())
    }

    /// Ack ids of the messages in the open batch (their leases must be kept alive).
    pub fn open_ack_ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.open
            .iter()
            .flat_map(|b| b.contents.acks.iter().map(|a| a.ack_id.as_str()))
    }

    /// When the open batch reaches `max_duration`.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.open
            .as_ref()
            .map(|b| b.opened_at + self.limits.max_duration)
    }

    /// Close the open batch if its `max_duration` has passed at `now`.
    pub fn expire(&mut self, now: Instant, done: &mut Vec<FinalizedFile>) {
        if self.next_deadline().is_some_and(|d| d <= now) {
            self.close(FlushReason::MaxDuration, done);
        }
    }

    /// Close the open batch (end of input, shutdown).
    pub fn finalize_all(&mut self, reason: FlushReason, done: &mut Vec<FinalizedFile>) {
        self.close(reason, done);
    }

    fn close(&mut self, reason: FlushReason, done: &mut Vec<FinalizedFile>) {
        let Some(b) = self.open.take() else { return };
        let rest = (!self.builder.is_empty()).then(|| self.builder.finish());
        done.push(FinalizedFile {
            sink: FileSink::Table(Box::new(TableCommit {
                name: new_data_file_name(),
                encoder: b.encoder,
                rest,
                table: self.table.clone(),
            })),
            contents: b.contents,
            reason,
            id: b.id,
        });
    }
}
