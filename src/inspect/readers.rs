//! The readers, one per format: an Avro object, a Text object, a Parquet file, a Delta table's
//! newest version — each as NDJSON records, or its summary.

use std::io::{BufRead, Read, Write};

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt;
use serde_json::{json, Map, Value};

use super::error::{write_line, InspectError, Summary};
use super::values::{avro_json_with, batch_rows, bytes_json};
use crate::upload::Destination;

// Avro

pub(super) fn avro(
    what: &str,
    r: impl Read,
    summary: bool,
    out: &mut dyn Write,
) -> Result<Summary, InspectError> {
    let bad = |e: apache_avro::Error| InspectError::Avro {
        what: what.into(),
        reason: e.to_string(),
    };
    let reader = apache_avro::Reader::new(r).map_err(bad)?;
    // The schema as written (logical types included; the canonical form drops them).
    let schema = serde_json::to_value(reader.writer_schema()).unwrap_or(Value::Null);
    let metadata: Map<String, Value> = reader
        .user_metadata()
        .iter()
        .map(|(k, v)| (k.clone(), bytes_json(v)))
        .collect();
    let writer_schema = reader.writer_schema().clone();
    let resolved = apache_avro::schema::ResolvedSchema::try_from(&writer_schema).map_err(bad)?;
    let names = resolved.get_names();
    let mut records = 0u64;
    for v in reader {
        let v = v.map_err(bad)?;
        records += 1;
        if !summary {
            write_line(out, what, &avro_json_with(&v, &writer_schema, names))?;
        }
    }
    Ok(summary.then(|| {
        let mut m = Map::new();
        m.insert("schema".into(), schema);
        m.insert("records".into(), json!(records));
        if !metadata.is_empty() {
            m.insert("metadata".into(), Value::Object(metadata));
        }
        m
    }))
}

// Text

pub(super) fn text(
    what: &str,
    r: impl Read,
    summary: bool,
    out: &mut dyn Write,
) -> Result<Summary, InspectError> {
    let mut r = std::io::BufReader::new(r);
    let mut line = Vec::new();
    let (mut records, mut bytes) = (0u64, 0u64);
    loop {
        line.clear();
        let n = r
            .read_until(b'\n', &mut line)
            .map_err(|source| InspectError::Io {
                what: what.into(),
                source,
            })?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
        records += 1;
        if !summary {
            let data = line.strip_suffix(b"\n").unwrap_or(&line);
            write_line(out, what, &json!({"data": bytes_json(data)}))?;
        }
    }
    Ok(summary.then(|| {
        let mut m = Map::new();
        m.insert("records".into(), json!(records));
        m.insert("bytes".into(), json!(bytes));
        m
    }))
}

// Parquet and Delta

pub(super) fn parquet<R: parquet::file::reader::ChunkReader + 'static>(
    what: &str,
    r: R,
    summary: bool,
    out: &mut dyn Write,
) -> Result<Summary, InspectError> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let bad = |e: &dyn std::fmt::Display| InspectError::Parquet {
        what: what.into(),
        reason: e.to_string(),
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(r).map_err(|e| bad(&e))?;
    let meta = builder.metadata().clone();
    let schema = builder.schema().clone();
    let rows: i64 = meta.row_groups().iter().map(|g| g.num_rows()).sum();
    if summary {
        let mut m = Map::new();
        m.insert("schema".into(), arrow_schema_json(&schema));
        m.insert("rows".into(), json!(rows));
        m.insert("row_groups".into(), json!(meta.num_row_groups()));
        if let Some(c) = meta.row_groups().first().and_then(|g| g.columns().first()) {
            m.insert(
                "compression".into(),
                json!(format!("{:?}", c.compression())),
            );
        }
        return Ok(Some(m));
    }
    let reader = builder.build().map_err(|e| bad(&e))?;
    for batch in reader {
        let batch = batch.map_err(|e| bad(&e))?;
        for v in batch_rows(&batch) {
            write_line(out, what, &v)?;
        }
    }
    Ok(None)
}

fn arrow_schema_json(schema: &arrow_schema::Schema) -> Value {
    Value::Array(
        schema
            .fields()
            .iter()
            .map(|f| json!({"name": f.name(), "type": f.data_type().to_string(), "nullable": f.is_nullable()}))
            .collect(),
    )
}

pub(super) async fn delta(
    what: &str,
    dest: &Destination,
    summary: bool,
    out: &mut dyn Write,
) -> Result<Summary, InspectError> {
    let table = crate::sink::delta::files::read_table_files(dest)
        .await
        .map_err(|e| InspectError::Delta {
            what: what.into(),
            reason: e.to_string(),
        })?;
    let mut rows = 0u64;
    for file in &table.files {
        let bytes = get(dest, file, &format!("{what}: data file {file}")).await?;
        let file_what = format!("{what}/{file}");
        if summary {
            use parquet::file::reader::FileReader;
            let r = parquet::file::reader::SerializedFileReader::new(bytes).map_err(|e| {
                InspectError::Parquet {
                    what: file_what.clone(),
                    reason: e.to_string(),
                }
            })?;
            rows += r.metadata().file_metadata().num_rows() as u64;
        } else {
            parquet(&file_what, bytes, false, out)?;
        }
    }
    Ok(summary.then(|| {
        let mut m = Map::new();
        m.insert("schema".into(), table.schema.clone());
        m.insert("version".into(), json!(table.version));
        m.insert("files".into(), json!(table.files.len()));
        m.insert("rows".into(), json!(rows));
        m
    }))
}

/// The object at `key`, whole.
pub(super) async fn get(store: &Destination, key: &str, what: &str) -> Result<Bytes, InspectError> {
    let path = ObjectPath::parse(key).map_err(|e| InspectError::Store {
        what: what.into(),
        reason: e.to_string(),
    })?;
    let got = store
        .store
        .get(&path)
        .await
        .map_err(|e| InspectError::Store {
            what: what.into(),
            reason: e.to_string(),
        })?;
    got.bytes().await.map_err(|e| InspectError::Store {
        what: what.into(),
        reason: e.to_string(),
    })
}
