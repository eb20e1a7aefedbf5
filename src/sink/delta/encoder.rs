//! One Parquet file encoded on its own thread while its rows are still being converted.
//!
//! The row builder hands over a record batch every few thousand rows; the encoder thread casts it
//! to the Delta form ([`to_delta_batch`]) and encodes it into the open file at once
//! ([`ParquetStream`]). Conversion and encoding then run side by side on two cores, and a file's
//! rows never wait in memory as Arrow arrays: what the file holds until it is finished is its
//! compressed pages (in the bench, peak RSS halves: 64 MiB batches of rows no longer sit whole
//! in memory, one open and two encoding).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;

use super::error::DeltaError;
use super::form::to_delta_batch;
use crate::table::parquet::{ParquetFile, ParquetStream};

/// Batches waiting for the encoder before [`ParquetEncoder::write`] blocks: enough to ride out a
/// slow page, few enough to bound memory.
const QUEUE: usize = 4;
/// Bytes of batches waiting for the encoder before [`ParquetEncoder::write`] blocks (one batch
/// always goes, whatever its size): with large messages, 4 batches are 4 large messages.
const QUEUE_BYTES: u64 = 16 << 20;

/// Why a file could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum ParquetEncodeError {
    /// A batch that does not fit the table (boxed: it is large, and rare).
    #[error(transparent)]
    Delta(Box<DeltaError>),
    #[error("Parquet: {0}")]
    Parquet(#[from] ParquetError),
    #[error("the Parquet encoder thread stopped: {0}")]
    Stopped(String),
}

/// The encoder of one Parquet file, running on its own thread.
pub struct ParquetEncoder {
    /// Batches to the thread; dropped by [`ParquetEncoder::finish`] to tell it the file is complete.
    tx: SyncSender<RecordBatch>,
    thread: JoinHandle<Result<ParquetFile, ParquetEncodeError>>,
    memory: Arc<Memory>,
}

/// What an encoder holds in memory, as its thread reports it.
#[derive(Default)]
struct Memory {
    /// Bytes of the batches handed over and not yet encoded.
    queued: Mutex<u64>,
    /// Signalled when a batch has been encoded.
    taken: Condvar,
    /// The file's encoded bytes and pages ([`ParquetStream::memory`]).
    encoded: AtomicU64,
}

impl ParquetEncoder {
    /// Start encoding a file whose rows come as batches of the row builder's schema and are
    /// written in the Delta form `delta_schema` (see [`super::delta_arrow_schema`]). `props`
    /// defaults to [`crate::table::default_writer_properties`].
    pub fn start(
        delta_schema: SchemaRef,
        props: Option<WriterProperties>,
    ) -> std::io::Result<ParquetEncoder> {
        let (tx, rx) = sync_channel::<RecordBatch>(QUEUE);
        let memory = Arc::new(Memory::default());
        let mem = memory.clone();
        let thread = std::thread::Builder::new()
            .name("subsink-parquet".into())
            .spawn(move || {
                let mut file = ParquetStream::new(delta_schema.clone(), props);
                for batch in rx {
                    let size = batch_bytes(&batch);
                    encode_into(&mut file, batch, &delta_schema)?;
                    mem.encoded.store(file.memory(), Ordering::Relaxed);
                    *mem.queued.lock().expect("queue lock") -= size;
                    mem.taken.notify_all();
                }
                Ok(file.finish()?)
            })?;
        Ok(ParquetEncoder { tx, thread, memory })
    }

    /// Bytes this file holds in memory: batches waiting to be encoded, its encoded row groups and
    /// the pages of the one in progress. Reported to the memory budget.
    pub fn memory(&self) -> u64 {
        *self.memory.queued.lock().expect("queue lock")
            + self.memory.encoded.load(Ordering::Relaxed)
    }

    /// Hand over rows of the file. Blocks while the encoder is [`QUEUE`] batches behind. An error
    /// means the encoder has stopped; [`ParquetEncoder::finish`] says why.
    pub fn write(&self, batch: RecordBatch) -> Result<(), ParquetEncodeError> {
        let size = batch_bytes(&batch);
        let mut queued = self.memory.queued.lock().expect("queue lock");
        // Wait while the queue holds QUEUE_BYTES (one batch always goes); the thread may have
        // stopped (an error): then the send below says so.
        while *queued > 0 && *queued + size > QUEUE_BYTES && !self.thread.is_finished() {
            queued = self
                .memory
                .taken
                .wait_timeout(queued, Duration::from_millis(50))
                .expect("queue lock")
                .0;
        }
        *queued += size;
        drop(queued);
        self.tx
            .send(batch)
            .map_err(|_| ParquetEncodeError::Stopped("it failed; finish() has its error".into()))
    }

    /// Every row handed over: wait for the finished file. Blocking (from async code, call it in
    /// `spawn_blocking`).
    pub fn finish(self) -> Result<ParquetFile, ParquetEncodeError> {
        drop(self.tx);
        self.thread
            .join()
            .map_err(|_| ParquetEncodeError::Stopped("it panicked".into()))?
    }
}

/// Write rows of the row builder's schema into `file` in the Delta form `delta_schema`,
/// dropping each form once it is written (on the encoder's thread, or inline by a caller that
/// encodes on its own thread).
pub fn encode_into(
    file: &mut ParquetStream,
    batch: RecordBatch,
    delta_schema: &SchemaRef,
) -> Result<(), ParquetEncodeError> {
    let delta =
        to_delta_batch(&batch, delta_schema).map_err(|e| ParquetEncodeError::Delta(Box::new(e)))?;
    drop(batch);
    file.write(&delta)?;
    Ok(())
}

/// Bytes a batch holds (its buffers as allocated).
fn batch_bytes(batch: &RecordBatch) -> u64 {
    batch.get_array_memory_size() as u64
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, Time64MicrosecondArray};
    use arrow_schema::{DataType, Field, Schema, TimeUnit};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;
    use crate::sink::delta::form::delta_arrow_schema;

    #[test]
    fn batches_become_one_file_in_the_delta_form() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("t", DataType::Time64(TimeUnit::Microsecond), true),
        ]));
        let delta = delta_arrow_schema(&schema).unwrap();
        let batch = |ids: std::ops::Range<i64>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(ids.clone())),
                    Arc::new(Time64MicrosecondArray::from_iter_values(
                        ids.map(|i| i * 1_000_000),
                    )),
                ],
            )
            .unwrap()
        };
        let enc = ParquetEncoder::start(delta.clone(), None).unwrap();
        for k in 0..10 {
            enc.write(batch(k * 100..(k + 1) * 100)).unwrap();
        }
        let file = enc.finish().unwrap();
        assert_eq!(file.num_records, 1000);
        let back: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file.bytes())
            .unwrap()
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let rows: usize = back.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 1000);
        assert_eq!(back[0].schema().field(1).data_type(), &DataType::Utf8);
        let ids = back[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(ids.value(0), 0);
    }

    #[test]
    fn an_empty_file_is_a_valid_file() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let file = ParquetEncoder::start(schema, None)
            .unwrap()
            .finish()
            .unwrap();
        assert_eq!(file.num_records, 0);
        assert!(ParquetRecordBatchReaderBuilder::try_new(file.bytes()).is_ok());
    }

    #[test]
    fn a_batch_of_another_schema_fails_the_file() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let other = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, false)]));
        let enc = ParquetEncoder::start(schema, None).unwrap();
        let bad = RecordBatch::try_new(
            other,
            vec![Arc::new(arrow_array::StringArray::from(vec!["x"]))],
        )
        .unwrap();
        let _ = enc.write(bad);
        assert!(enc.finish().is_err());
    }
}
