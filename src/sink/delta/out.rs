//! Where an open batch's rows go ([`Out`]): one Parquet file, the changes of a MERGE, or one file
//! per partition of a partitioned table, each with its encoder ([`PartEncoder`]).

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::file::properties::WriterProperties;

use super::data_file::DataFile;
use super::encoder::{encode_into, ParquetEncodeError, ParquetEncoder};
use super::partition::{PartitionValues, Partitioning};
use crate::table::cdc::PrimaryKey;
use crate::table::{ParquetFile, ParquetStream};

/// Change data capture: what a commit of changes needs besides its rows.
pub(super) struct ChangeSpec {
    pub(super) key: PrimaryKey,
    /// The row builder's schema (the table's columns and the two pseudo-columns), then the
    /// derived partition columns.
    pub(super) rows: SchemaRef,
    pub(super) props: WriterProperties,
    /// Without `--exactly-once`: the order the MERGEs land in, the batches' (arrival) order.
    pub(super) arrival: crate::sink::order::ArrivalOrder,
}

/// A partitioned table: how rows are split, and the schema of its files (the table's columns
/// without the partition columns).
pub(super) struct PartSpec {
    pub(super) partitioning: Partitioning,
    pub(super) file_schema: SchemaRef,
    pub(super) props: WriterProperties,
}

/// Where a batch's rows go.
pub(super) enum Out {
    /// The file's encoder, or why it could not be started (the batch's commit then fails, and its
    /// messages are not done).
    Parquet(std::io::Result<ParquetEncoder>),
    /// Change data capture: the rows, merged when the batch is committed.
    Changes {
        spec: Arc<ChangeSpec>,
        chunks: Vec<RecordBatch>,
        /// Bytes the chunks hold.
        memory: u64,
    },
    /// A partitioned table: one file per partition the batch's rows fall in, each with its
    /// encoder.
    Partitioned {
        spec: Arc<PartSpec>,
        files: Vec<(PartitionValues, PartEncoder)>,
    },
    /// Rows could not be split into partitions: the batch's commit fails with this.
    Broken(String),
}

impl Out {
    /// Hand a chunk of rows over.
    pub(super) fn write(&mut self, rows: RecordBatch) {
        match self {
            // Blocks while the encoder is a few chunks behind: backpressure. An error means it
            // stopped; the batch's commit reports why.
            Out::Parquet(Ok(enc)) => {
                let _ = enc.write(rows);
            }
            Out::Parquet(Err(_)) => {}
            Out::Changes { chunks, memory, .. } => {
                *memory += rows.get_array_memory_size() as u64;
                chunks.push(rows);
            }
            Out::Partitioned { spec, files } => {
                let parts = match spec.partitioning.split(&rows) {
                    Ok(parts) => parts,
                    Err(e) => {
                        *self = Out::Broken(e.to_string());
                        return;
                    }
                };
                for (values, part) in parts {
                    let i = match files.iter().position(|(v, _)| v.dir == values.dir) {
                        Some(i) => i,
                        None => {
                            let enc = PartEncoder::start(spec, files.len());
                            files.push((values, enc));
                            files.len() - 1
                        }
                    };
                    files[i].1.write(part);
                }
            }
            Out::Broken(_) => {}
        }
    }

    pub(super) fn memory(&self) -> u64 {
        match self {
            Out::Parquet(enc) => enc.as_ref().map_or(0, ParquetEncoder::memory),
            Out::Changes { memory, .. } => *memory,
            Out::Partitioned { files, .. } => files.iter().map(|(_, e)| e.memory()).sum(),
            Out::Broken(_) => 0,
        }
    }
}

/// A partitioned batch's files, finished (on a blocking thread: zstd is CPU work): each
/// `<partition folder>/<name>`.
pub(super) async fn finish_partitions(
    name: &str,
    files: Vec<(PartitionValues, PartEncoder)>,
) -> Result<Vec<DataFile>, PartError> {
    let name = name.to_string();
    tokio::task::spawn_blocking(move || {
        files
            .into_iter()
            .map(|(values, enc)| {
                Ok(DataFile {
                    path: format!("{}/{name}", values.dir),
                    file: enc.finish()?,
                    partition_values: values.values,
                })
            })
            .collect::<Result<Vec<_>, PartError>>()
    })
    .await
    .map_err(PartError::Panicked)?
}

/// Partitions of one batch whose files are encoded on threads of their own; the batch's further
/// partitions are encoded on the writer's thread as their rows come, so a batch spread over
/// many partitions does not start a thread each.
const THREADED_PARTITIONS: usize = 4;

/// What an open partition file holds besides its pages, counted against the memory budget:
/// Parquet's writers per column (buffers, dictionaries, statistics) and the allocator's share.
/// Measured: a batch over 50, 500 and 2,000 partitions of three columns (debug build, 32 MiB
/// limit) peaked at 134, 172 and 269 MiB, about 70 KiB more per open partition file.
const PART_FILE_OVERHEAD: u64 = 96 << 10;

/// The encoder of one partition's file.
pub(super) enum PartEncoder {
    /// On its own thread ([`ParquetEncoder`]), or why it could not start.
    Threaded(std::io::Result<ParquetEncoder>),
    /// On the caller's thread; the first error stops it.
    Inline {
        file: ParquetStream,
        schema: SchemaRef,
        error: Option<ParquetEncodeError>,
    },
}

/// Why a partition's file could not be made.
pub(super) enum PartError {
    Thread(std::io::Error),
    Encode(ParquetEncodeError),
    Panicked(tokio::task::JoinError),
}

impl PartEncoder {
    /// The encoder of a batch's `nth` partition (from 0).
    fn start(spec: &PartSpec, nth: usize) -> PartEncoder {
        if nth < THREADED_PARTITIONS {
            PartEncoder::Threaded(ParquetEncoder::start(
                spec.file_schema.clone(),
                Some(spec.props.clone()),
            ))
        } else {
            PartEncoder::Inline {
                file: ParquetStream::new(spec.file_schema.clone(), Some(spec.props.clone())),
                schema: spec.file_schema.clone(),
                error: None,
            }
        }
    }

    /// Hand over rows (an error stops the encoder; [`PartEncoder::finish`] says why).
    fn write(&mut self, rows: RecordBatch) {
        match self {
            PartEncoder::Threaded(Ok(enc)) => {
                let _ = enc.write(rows);
            }
            PartEncoder::Threaded(Err(_)) => {}
            PartEncoder::Inline {
                file,
                schema,
                error,
            } => {
                if error.is_some() {
                    return;
                }
                let written = encode_into(file, rows, schema);
                if let Err(e) = written {
                    *error = Some(e);
                }
            }
        }
    }

    /// What the file holds, plus [`PART_FILE_OVERHEAD`].
    fn memory(&self) -> u64 {
        PART_FILE_OVERHEAD
            + match self {
                PartEncoder::Threaded(enc) => enc.as_ref().map_or(0, ParquetEncoder::memory),
                PartEncoder::Inline { file, .. } => file.memory(),
            }
    }

    /// The finished file. Blocking.
    fn finish(self) -> Result<ParquetFile, PartError> {
        match self {
            PartEncoder::Threaded(enc) => enc
                .map_err(PartError::Thread)?
                .finish()
                .map_err(PartError::Encode),
            PartEncoder::Inline { error: Some(e), .. } => Err(PartError::Encode(e)),
            PartEncoder::Inline { file, .. } => file
                .finish()
                .map_err(|e| PartError::Encode(ParquetEncodeError::from(e))),
        }
    }
}
