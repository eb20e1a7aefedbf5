//! Record batches → one Parquet file in memory, zstd-compressed by default.
//!
//! The file is built whole in memory and uploaded with a single put by the table committer
//! ([`super::delta`]): a batch is bounded by the batching limits, and a single put is atomic, so no
//! reader ever sees half a file. A streamed file ([`ParquetStream`]) is kept as a list of 1 MiB
//! chunks, never one buffer grown by doubling, and its row groups are flushed every
//! [`ROW_GROUP_BYTES`]: finishing it copies at most one row group, not the whole file (issue 26).

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use bytes::Bytes;
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::basic::{Compression, Encoding, Type as PhysicalType, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};

/// A finished Parquet file and what a table log needs to know about it.
#[derive(Debug, Clone)]
pub struct ParquetFile {
    /// The file's bytes, as chunks (what a put takes as it is).
    pub payload: object_store::PutPayload,
    /// Rows in the file (Delta `numRecords`).
    pub num_records: u64,
    /// The file's footer as written: its column chunks' statistics become Delta's per-column
    /// statistics ([`super::stats`]).
    pub metadata: Option<Arc<ParquetMetaData>>,
}

impl ParquetFile {
    /// Size in bytes (Delta `size`).
    pub fn size(&self) -> u64 {
        self.payload.content_length() as u64
    }

    /// The file as one buffer (a copy unless it is one chunk: readers in tests).
    pub fn bytes(&self) -> Bytes {
        Bytes::from(self.payload.clone())
    }
}

/// A streamed file's row groups are flushed once their pages pass this estimate, so finishing
/// the file copies at most this much (the pages of the last row group into the file's chunks).
pub const ROW_GROUP_BYTES: usize = 8 << 20;

/// Byte-array columns whose sampled values average more than this (payloads, documents) get no
/// dictionary and no min/max statistics: a dictionary of large distinct values only copies them
/// once more, and min/max of a blob copies two whole values into the footer for nothing.
const LARGE_VALUE: usize = 1024;

/// The sink of a streamed file: 1 MiB chunks, so the file never sits in one buffer grown by
/// doubling (which holds up to twice the file, three times while it moves).
struct Chunks(object_store::PutPayloadMut);

impl std::io::Write for Chunks {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The writer settings subsink uses: zstd level 1 (parquet's default level), Parquet format 2 pages, 1 Mi rows per row
/// group at most (a batch is one row group in practice).
pub fn default_writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_max_row_group_row_count(Some(1 << 20))
        .build()
}

/// [`default_writer_properties`] with another compression: `zstd` (level 1), `zstd(N)`, `snappy`,
/// `gzip`, `gzip(N)`, `uncompressed` (Parquet's names, either case).
pub fn writer_properties_with(compression: &str) -> Result<WriterProperties, String> {
    let c: Compression = match compression.to_ascii_lowercase().as_str() {
        "zstd" => Compression::ZSTD(ZstdLevel::default()),
        "gzip" => Compression::GZIP(Default::default()),
        other => other.parse().map_err(|e| format!("{compression:?}: {e}"))?,
    };
    match c {
        Compression::ZSTD(_)
        | Compression::SNAPPY
        | Compression::GZIP(_)
        | Compression::UNCOMPRESSED => {}
        other => {
            return Err(format!(
                "{other}: not built in; use zstd, snappy, gzip or uncompressed"
            ))
        }
    }
    Ok(WriterProperties::builder()
        .set_compression(c)
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_max_row_group_row_count(Some(1 << 20))
        .build())
}

/// Write `batches` (all of `schema`) as one Parquet file. `props` defaults to
/// [`default_writer_properties`]; either way dictionary encoding is then turned off for the
/// columns where it cannot pay ([`without_useless_dictionaries`]).
pub fn write_parquet(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    props: Option<WriterProperties>,
) -> Result<ParquetFile, ParquetError> {
    let props = props.unwrap_or_else(default_writer_properties);
    let props = without_useless_dictionaries(props, schema, batches)?;
    let mut buf = Vec::with_capacity(
        batches
            .iter()
            .map(|b| b.get_array_memory_size() / 4)
            .sum::<usize>()
            .max(4096),
    );
    let mut writer = ArrowWriter::try_new(&mut buf, schema.clone(), Some(props))?;
    let mut num_records = 0u64;
    for b in batches {
        writer.write(b)?;
        num_records += b.num_rows() as u64;
    }
    let metadata = writer.close()?;
    Ok(ParquetFile {
        payload: buf.into(),
        num_records,
        metadata: Some(Arc::new(metadata)),
    })
}

/// A Parquet file written as its rows come: each batch is encoded and compressed at once, so
/// memory holds the file's compressed pages rather than its rows (one row group, like
/// [`write_parquet`], up to the writer's row-group limit). The first batch decides which columns
/// get a dictionary ([`without_useless_dictionaries`]).
pub struct ParquetStream {
    schema: SchemaRef,
    /// The settings until the first batch, then the writer.
    state: StreamState,
    num_records: u64,
}

enum StreamState {
    Pending(Box<WriterProperties>),
    Writing(Box<ArrowWriter<Chunks>>),
}

impl ParquetStream {
    /// A file of `schema`; `props` defaults to [`default_writer_properties`].
    pub fn new(schema: SchemaRef, props: Option<WriterProperties>) -> ParquetStream {
        ParquetStream {
            schema,
            state: StreamState::Pending(Box::new(props.unwrap_or_else(default_writer_properties))),
            num_records: 0,
        }
    }

    /// Encode `batch` (of the stream's schema).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), ParquetError> {
        if let StreamState::Pending(props) = &self.state {
            let props = without_useless_dictionaries(
                WriterProperties::clone(props),
                &self.schema,
                std::slice::from_ref(batch),
            )?;
            let sink = Chunks(object_store::PutPayloadMut::new().with_block_size(1 << 20));
            let writer = ArrowWriter::try_new(sink, self.schema.clone(), Some(props))?;
            self.state = StreamState::Writing(Box::new(writer));
        }
        let StreamState::Writing(writer) = &mut self.state else {
            unreachable!("a writer after the first batch")
        };
        writer.write(batch)?;
        if writer.in_progress_size() >= ROW_GROUP_BYTES {
            writer.flush()?;
        }
        self.num_records += batch.num_rows() as u64;
        Ok(())
    }

    /// Bytes the file holds in memory: its encoded row groups and the pages (and values) of the
    /// one in progress.
    pub fn memory(&self) -> u64 {
        match &self.state {
            StreamState::Writing(w) => (w.memory_size() + w.bytes_written()) as u64,
            StreamState::Pending(_) => 0,
        }
    }

    /// Rows written so far.
    pub fn num_records(&self) -> u64 {
        self.num_records
    }

    /// The finished file.
    pub fn finish(self) -> Result<ParquetFile, ParquetError> {
        let (payload, metadata) = match self.state {
            StreamState::Writing(mut writer) => {
                // `finish` writes the footer and flushes every buffer into the chunks.
                let metadata = writer.finish()?;
                let chunks = std::mem::replace(
                    writer.inner_mut(),
                    Chunks(object_store::PutPayloadMut::new()),
                );
                (chunks.0.freeze(), metadata)
            }
            StreamState::Pending(props) => {
                let mut buf = Vec::new();
                let metadata =
                    ArrowWriter::try_new(&mut buf, self.schema, Some(*props))?.close()?;
                (buf.into(), metadata)
            }
        };
        Ok(ParquetFile {
            payload,
            num_records: self.num_records,
            metadata: Some(Arc::new(metadata)),
        })
    }
}

/// Values of a column looked at to decide on its dictionary.
const DICTIONARY_SAMPLE: usize = 4096;

/// Turn dictionary encoding off for every leaf column whose first [`DICTIONARY_SAMPLE`] values
/// hold more than half as many distinct values: ids, timestamps, measurements. The Parquet writer
/// would intern each of them into a dictionary until it outgrows its page limit and then fall
/// back to plain pages anyway, which takes a third of the encoding time and makes the file
/// larger (the bench's events: 9.0 MB with a dictionary for every column, 6.8 MB without one for
/// its high-cardinality columns, in 55% of the time). Columns of few distinct values (dates,
/// enums, tags, metadata) keep theirs.
fn without_useless_dictionaries(
    props: WriterProperties,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<WriterProperties, ParquetError> {
    let descr = ArrowSchemaConverter::new().convert(schema)?;
    let mut leaves: Vec<Vec<ArrayRef>> = vec![Vec::new(); descr.num_columns()];
    for b in batches {
        let mut i = 0;
        for col in b.columns() {
            collect_leaves(col, &mut leaves, &mut i);
        }
        debug_assert_eq!(i, descr.num_columns(), "one array per Parquet leaf");
    }
    let version_2 = props.writer_version() == WriterVersion::PARQUET_2_0;
    let mut builder = props.into_builder();
    let props_now = builder.clone().build();
    for (arrays, col) in leaves.iter().zip(descr.columns()) {
        if !props_now.dictionary_enabled(col.path()) {
            continue;
        }
        let sample = Sample::of(arrays);
        let large = col.physical_type() == PhysicalType::BYTE_ARRAY
            && sample.values > 0
            && sample.bytes / sample.values > LARGE_VALUE;
        if large {
            builder = builder
                .set_column_dictionary_enabled(col.path().clone(), false)
                .set_column_statistics_enabled(col.path().clone(), EnabledStatistics::None);
            // PLAIN, whatever the page format: its page is the value buffer itself, where
            // DELTA_LENGTH_BYTE_ARRAY copies the values once more into the page and keeps the
            // first buffer's capacity for the rest of the file (two more copies of a 9 MiB
            // payload, issue 26); for values this large the lengths weigh nothing either way.
            builder = builder.set_column_encoding(col.path().clone(), Encoding::PLAIN);
            continue;
        }
        if sample.values >= 64 && sample.distinct > sample.values / 2 {
            builder = builder.set_column_dictionary_enabled(col.path().clone(), false);
            if version_2 && col.physical_type() == PhysicalType::BYTE_ARRAY {
                builder =
                    builder.set_column_encoding(col.path().clone(), sample.byte_array_encoding());
            }
        }
    }
    Ok(builder.build())
}

/// The leaf arrays of `a` in Parquet's column order (depth first; a list's values stand for it).
fn collect_leaves(a: &ArrayRef, leaves: &mut [Vec<ArrayRef>], i: &mut usize) {
    match a.data_type() {
        DataType::Struct(_) => {
            for c in a.as_struct().columns() {
                collect_leaves(c, leaves, i);
            }
        }
        DataType::List(_) => collect_leaves(a.as_list::<i32>().values(), leaves, i),
        _ => {
            if let Some(l) = leaves.get_mut(*i) {
                l.push(a.clone());
            }
            *i += 1;
        }
    }
}

/// What the first [`DICTIONARY_SAMPLE`] non-null values of a column hold. Only strings, bytes and
/// fixed-width primitives are looked at; anything else (booleans) samples nothing.
struct Sample {
    /// Values looked at.
    values: usize,
    /// Distinct ones among them (hashes stand for values: a collision only undercounts by one).
    distinct: usize,
    /// Bytes each value shares as a prefix with the one before, summed.
    shared: usize,
    /// Bytes of the values, summed.
    bytes: usize,
}

impl Sample {
    fn of(arrays: &[ArrayRef]) -> Sample {
        let hasher = RandomState::new();
        let mut seen: HashSet<u64> = HashSet::new();
        let (mut values, mut shared, mut bytes) = (0, 0, 0);
        let mut prev: &[u8] = &[];
        for a in arrays {
            let data = a.to_data();
            // `prev` is the value before `v` (empty for fixed-width values: prefixes do not count).
            let mut add = |v: &[u8], prev: &[u8]| -> bool {
                seen.insert(hasher.hash_one(v));
                shared += prev.iter().zip(v).take_while(|(a, b)| a == b).count();
                bytes += v.len();
                values += 1;
                values < DICTIONARY_SAMPLE
            };
            match a.data_type() {
                DataType::Utf8 => {
                    for v in a.as_string::<i32>().iter().flatten() {
                        if !add(v.as_bytes(), prev) {
                            break;
                        }
                        prev = v.as_bytes();
                    }
                }
                DataType::Binary => {
                    for v in a.as_binary::<i32>().iter().flatten() {
                        if !add(v, prev) {
                            break;
                        }
                        prev = v;
                    }
                }
                dt => {
                    let Some(width) = dt.primitive_width() else {
                        continue;
                    };
                    let buf = &data.buffers()[0].as_slice()[data.offset() * width..];
                    for i in 0..a.len() {
                        if a.is_valid(i) && !add(&buf[i * width..(i + 1) * width], &[]) {
                            break;
                        }
                    }
                }
            }
            if values >= DICTIONARY_SAMPLE {
                break;
            }
        }
        Sample {
            values,
            distinct: seen.len(),
            shared,
            bytes,
        }
    }

    /// The encoding of a byte-array column without a dictionary (format 2 pages): the writer's
    /// default, DELTA_BYTE_ARRAY, stores each value's prefix shared with the one before — worth
    /// it when values share much (sequential ids), wasted work otherwise (the bench's events:
    /// random ids, names, times). So DELTA_BYTE_ARRAY when the sampled values share at least a
    /// quarter of their bytes with their predecessor, DELTA_LENGTH_BYTE_ARRAY (lengths, then the
    /// bytes as they are) otherwise. On the bench's 100k events DELTA_LENGTH_BYTE_ARRAY for the
    /// columns sharing little made their files 3% smaller and took 1.3% fewer instructions in
    /// all; `message_id` (sequential) stays DELTA_BYTE_ARRAY, 5× smaller that way.
    fn byte_array_encoding(&self) -> Encoding {
        if self.shared * 4 >= self.bytes {
            Encoding::DELTA_BYTE_ARRAY
        } else {
            Encoding::DELTA_LENGTH_BYTE_ARRAY
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    use super::*;

    #[test]
    fn writes_zstd_parquet_that_reads_back() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = |ids: Vec<i64>| {
            let strings: Vec<Option<String>> = ids
                .iter()
                .map(|i| (i % 2 == 0).then(|| format!("s{i}")))
                .collect();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(StringArray::from(strings)),
                ],
            )
            .unwrap()
        };
        let file = write_parquet(&schema, &[batch(vec![1, 2]), batch(vec![3])], None).unwrap();
        assert_eq!(file.num_records, 3);
        assert_eq!(file.size(), file.bytes().len() as u64);

        let reader = SerializedFileReader::new(file.bytes()).unwrap();
        let meta = reader.metadata();
        assert_eq!(meta.file_metadata().num_rows(), 3);
        for rg in meta.row_groups() {
            for col in rg.columns() {
                assert!(matches!(col.compression(), Compression::ZSTD(_)));
            }
        }
        let batches: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file.bytes())
            .unwrap()
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(batches, vec![batch(vec![1, 2, 3])]);
    }

    #[test]
    fn byte_arrays_without_a_dictionary_get_the_delta_encoding_that_fits_them() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("sequential", DataType::Utf8, false),
            Field::new("random", DataType::Utf8, false),
            Field::new("few", DataType::Utf8, false),
        ]));
        let n = 5000u64;
        let sequential: Vec<String> = (0..n).map(|i| (10_000_000_000 + i).to_string()).collect();
        let random: Vec<String> = (0..n)
            .map(|i| format!("{:016x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        let few: Vec<String> = (0..n).map(|i| format!("tenant-{}", i % 7)).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(sequential)),
                Arc::new(StringArray::from(random)),
                Arc::new(StringArray::from(few)),
            ],
        )
        .unwrap();
        let file = write_parquet(&schema, std::slice::from_ref(&batch), None).unwrap();
        let reader = SerializedFileReader::new(file.bytes()).unwrap();
        let rg = reader.metadata().row_group(0);
        let encodings = |i: usize| rg.column(i).encodings().collect::<Vec<_>>();
        assert!(
            encodings(0).contains(&Encoding::DELTA_BYTE_ARRAY),
            "{:?}",
            encodings(0)
        );
        assert!(
            encodings(1).contains(&Encoding::DELTA_LENGTH_BYTE_ARRAY),
            "{:?}",
            encodings(1)
        );
        assert!(
            encodings(2).contains(&Encoding::RLE_DICTIONARY),
            "{:?}",
            encodings(2)
        );
        let back: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file.bytes())
            .unwrap()
            .with_batch_size(n as usize)
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back, vec![batch]);
    }

    #[test]
    fn compression_can_be_chosen_and_reads_back() {
        let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(StringArray::from(vec!["a"; 100]))],
        )
        .unwrap();
        for (name, want) in [
            // A file records the codec, not its level.
            ("zstd", "ZSTD"),
            ("ZSTD(7)", "ZSTD"),
            ("snappy", "SNAPPY"),
            ("gzip", "GZIP"),
            ("uncompressed", "UNCOMPRESSED"),
        ] {
            let props = writer_properties_with(name).unwrap();
            let file = write_parquet(&schema, std::slice::from_ref(&batch), Some(props)).unwrap();
            let reader = SerializedFileReader::new(file.bytes()).unwrap();
            let c = reader.metadata().row_group(0).column(0).compression();
            let codec = format!("{c:?}");
            assert_eq!(codec.split('(').next().unwrap(), want, "{name}");
            let back: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file.bytes())
                .unwrap()
                .build()
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(back, vec![batch.clone()]);
        }
        for bad in ["lz4", "brotli(3)", "zip", "zstd(99)"] {
            assert!(writer_properties_with(bad).is_err(), "{bad}");
        }
    }
}
