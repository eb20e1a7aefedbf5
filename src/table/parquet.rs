//! Record batches → one Parquet file in memory, zstd-compressed by default.
//!
//! The file is built whole in memory and uploaded with a single put by the table committer
//! ([`super::delta`]): a batch is bounded by the batching limits, and a single put is atomic, so no
//! reader ever sees half a file.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::{WriterProperties, WriterVersion};

/// A finished Parquet file and what a table log needs to know about it.
#[derive(Debug, Clone)]
pub struct ParquetFile {
    pub bytes: Bytes,
    /// Rows in the file (Delta `numRecords`).
    pub num_records: u64,
}

impl ParquetFile {
    /// Size in bytes (Delta `size`).
    pub fn size(&self) -> u64 {
        self.bytes.len() as u64
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
/// [`default_writer_properties`].
pub fn write_parquet(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    props: Option<WriterProperties>,
) -> Result<ParquetFile, ParquetError> {
    let props = props.unwrap_or_else(default_writer_properties);
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
    writer.close()?;
    Ok(ParquetFile {
        bytes: Bytes::from(buf),
        num_records,
    })
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
        assert_eq!(file.size(), file.bytes.len() as u64);

        let reader = SerializedFileReader::new(file.bytes.clone()).unwrap();
        let meta = reader.metadata();
        assert_eq!(meta.file_metadata().num_rows(), 3);
        for rg in meta.row_groups() {
            for col in rg.columns() {
                assert!(matches!(col.compression(), Compression::ZSTD(_)));
            }
        }
        let batches: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file.bytes)
            .unwrap()
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(batches, vec![batch(vec![1, 2, 3])]);
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
            let reader = SerializedFileReader::new(file.bytes.clone()).unwrap();
            let c = reader.metadata().row_group(0).column(0).compression();
            let codec = format!("{c:?}");
            assert_eq!(codec.split('(').next().unwrap(), want, "{name}");
            let back: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file.bytes)
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
