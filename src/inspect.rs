//! `subsink inspect URL|PATH`: look inside what subsink (or Pub/Sub) wrote — an Avro object, a
//! Parquet file, a Delta table, or a Text object — as NDJSON, one record per line.
//!
//! Values as JSON: bytes (the `data` field, BYTES columns) as a string when they are valid UTF-8,
//! else `{"base64": "…"}` (standard alphabet, padded), so text payloads read as text and nothing
//! is lost; timestamps as RFC 3339 UTC with microseconds (`2023-09-25T04:10:00.000000Z`; a
//! zone-less one — Delta's `timestamp_ntz`, BigQuery's DATETIME — without the `Z`); dates
//! `YYYY-MM-DD`; decimals as exact decimal text; maps and records as objects; Avro unions as
//! their value. Field names are the file's own (the metadata fields `subscription_name`,
//! `message_id`, `publish_time`, `attributes` included). A Text object prints `{"data": …}` per
//! line.
//!
//! `--summary` prints one JSON object instead: the format, the schema and the counts. With a
//! subscription, the object's name is also checked against its naming rule
//! (`<prefix><datetime>_<uuid><suffix>`, see [`crate::naming::check_object_name`]).
//!
//! What is read: a path or `file://` URL is read from disk (Avro and Text stream; Parquet is read
//! through the file); a cloud URL (`s3://bucket/key`, `gs://…`, `az://…`) is fetched whole into
//! memory first. A directory (or URL prefix) holding `_delta_log/` is a Delta table: the data
//! files of its newest version, in log order.
//!
//! A folder that is not a Delta table, a bucket (`s3://bucket/`) or a prefix (`s3://bucket/dir`,
//! `s3://bucket/dir/`) is listed instead, one NDJSON line per object or table below it, in name
//! order (names relative to what was given; `url` is what to inspect next):
//! `{"object": "dir/a.avro", "size": 1234, "last_modified": "…Z", "url": "s3://bucket/dir/a.avro"}`,
//! and for each Delta table (a folder holding `_delta_log/`), one line for all its files:
//! `{"table": "lake/t", "format": "delta", "objects": 7, "size": 5678, "url": "s3://bucket/lake/t"}`.
//! `--summary` prints `{"format": "listing", "objects": …, "tables": …, "size": …}`. A local
//! bucket's staging folder (`.subsink-staging/`) is not listed. A name that is neither an object
//! nor a prefix (or folder) holding objects is an error ([`InspectError::Nothing`]). A cloud URL
//! is an object when the store has that key (`HEAD`); a URL ending in `/` is always a prefix.

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use base64::Engine as _;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt;
use serde_json::{json, Map, Value};

use crate::config::StorageSettings;
use crate::naming::{check_object_name, NameMismatch};
use crate::upload::Destination;

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {reason}")]
    Store { what: String, reason: String },
    #[error("{what}: not an Avro object: {reason}")]
    Avro { what: String, reason: String },
    #[error("{what}: not a Parquet file: {reason}")]
    Parquet { what: String, reason: String },
    #[error("{what}: Delta table: {reason}")]
    Delta { what: String, reason: String },
    #[error("{what}: {reason}")]
    Unsupported { what: String, reason: String },
    /// Neither an object nor a prefix (or folder) with objects below it.
    #[error(
        "{what}: neither an object nor a prefix (or folder) holding objects: nothing to inspect"
    )]
    Nothing { what: String },
    #[error("{name}: does not follow the naming rule of {subscription}: {mismatch}")]
    Name {
        name: String,
        subscription: String,
        #[source]
        mismatch: NameMismatch,
    },
}

/// What `inspect` prints.
#[derive(Debug, Clone, Default)]
pub struct InspectOptions {
    /// The schema and counts instead of the records.
    pub summary: bool,
    /// Check the object's name against this subscription's naming rule: `(subscription name,
    /// its Cloud Storage settings)`.
    pub naming: Option<(String, StorageSettings)>,
}

/// The kind of thing inspected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Avro,
    Parquet,
    Delta,
    Text,
    /// A folder, bucket or prefix: its objects and tables, one line each.
    Listing,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Avro => "avro",
            Format::Parquet => "parquet",
            Format::Delta => "delta",
            Format::Text => "text",
            Format::Listing => "listing",
        }
    }
}

/// Where the input is.
enum Location {
    Local(PathBuf),
    /// A store rooted at the bucket, and the key inside it (empty for the bucket root).
    Remote {
        url: String,
        bucket: Destination,
        /// The bucket's own URL, ending in `/`.
        root: String,
        key: String,
        /// The URL ends in `/`: a prefix, never an object.
        prefix: bool,
    },
}

fn locate(input: &str) -> Result<Location, InspectError> {
    if !input.contains("://") {
        return Ok(Location::Local(PathBuf::from(input)));
    }
    let url = url::Url::parse(input).map_err(|e| InspectError::Store {
        what: input.into(),
        reason: e.to_string(),
    })?;
    if url.scheme() == "file" {
        let p = url.to_file_path().map_err(|_| InspectError::Store {
            what: input.into(),
            reason: "not an absolute local path".into(),
        })?;
        return Ok(Location::Local(p));
    }
    let mut root = url.clone();
    root.set_path("/");
    let bucket = Destination::from_url(root.as_str()).map_err(|e| InspectError::Store {
        what: input.into(),
        reason: e.to_string(),
    })?;
    Ok(Location::Remote {
        url: input.into(),
        bucket,
        root: root.to_string(),
        key: url.path().trim_matches('/').to_string(),
        prefix: url.path().ends_with('/'),
    })
}

/// Inspect `input` and write NDJSON records (or the summary) to `out`. Name checks that fail are
/// errors, returned after the output (the summary still prints).
pub async fn inspect(
    input: &str,
    opts: &InspectOptions,
    out: &mut dyn Write,
) -> Result<(), InspectError> {
    let loc = locate(input)?;
    let io = |source| InspectError::Io {
        what: input.into(),
        source,
    };
    let listing_name_check = || InspectError::Unsupported {
        what: input.into(),
        reason: "a folder, bucket or prefix is listed, not read; --subscription checks the name \
                 of one object"
            .into(),
    };
    let (format, summary) = match &loc {
        Location::Local(path) if path.is_dir() && !path.join("_delta_log").is_dir() => {
            if opts.naming.is_some() {
                return Err(listing_name_check());
            }
            let entries = local_entries(path).map_err(io)?;
            let base = input.trim_end_matches('/');
            let url = |name: &str| format!("{base}/{name}");
            (
                Format::Listing,
                listing(input, entries, &url, opts.summary, out)?,
            )
        }
        Location::Local(path) if path.is_dir() => {
            let canon = std::fs::canonicalize(path).map_err(io)?;
            let url = url::Url::from_directory_path(&canon)
                .map_err(|_| InspectError::Store {
                    what: input.into(),
                    reason: "cannot make a file:// URL of it".into(),
                })?
                .to_string();
            let dest = Destination::from_url(&url).map_err(|e| InspectError::Store {
                what: input.into(),
                reason: e.to_string(),
            })?;
            (Format::Delta, delta(input, &dest, opts.summary, out).await?)
        }
        Location::Local(path) => {
            let mut f = std::fs::File::open(path).map_err(io)?;
            let mut magic = [0u8; 4];
            let n = read_up_to(&mut f, &mut magic).map_err(io)?;
            let f = std::fs::File::open(path).map_err(io)?;
            match sniff(&magic[..n]) {
                Format::Avro => (
                    Format::Avro,
                    avro(input, std::io::BufReader::new(f), opts.summary, out)?,
                ),
                Format::Parquet => (Format::Parquet, parquet(input, f, opts.summary, out)?),
                _ => (
                    Format::Text,
                    text(input, std::io::BufReader::new(f), opts.summary, out)?,
                ),
            }
        }
        Location::Remote {
            url,
            bucket,
            root,
            key,
            prefix,
        } => {
            let table = Destination::from_url(url).map_err(|e| InspectError::Store {
                what: input.into(),
                reason: e.to_string(),
            })?;
            if has_delta_log(&table).await {
                (
                    Format::Delta,
                    delta(input, &table, opts.summary, out).await?,
                )
            } else if *prefix || key.is_empty() || !is_object(bucket, key, input).await? {
                if opts.naming.is_some() {
                    return Err(listing_name_check());
                }
                let entries = remote_entries(bucket, key, input).await?;
                let url = |name: &str| match key.is_empty() {
                    true => format!("{root}{name}"),
                    false => format!("{root}{key}/{name}"),
                };
                (
                    Format::Listing,
                    listing(input, entries, &url, opts.summary, out)?,
                )
            } else {
                let bytes = get(bucket, key, input).await?;
                match sniff(&bytes) {
                    Format::Avro => (Format::Avro, avro(input, &bytes[..], opts.summary, out)?),
                    Format::Parquet => (Format::Parquet, parquet(input, bytes, opts.summary, out)?),
                    _ => (Format::Text, text(input, &bytes[..], opts.summary, out)?),
                }
            }
        }
    };
    let naming = match &opts.naming {
        Some((sub, storage)) => {
            if format == Format::Delta {
                return Err(InspectError::Unsupported {
                    what: input.into(),
                    reason: "a Delta table has no object naming rule; --subscription applies to \
                             Cloud Storage objects"
                        .into(),
                });
            }
            let name = match &loc {
                Location::Local(p) => p.to_string_lossy().into_owned(),
                Location::Remote { key, .. } => key.clone(),
            };
            Some((
                name.clone(),
                sub.clone(),
                check_object_name(
                    &name,
                    &storage.filename_prefix,
                    &storage.datetime_format,
                    &storage.filename_suffix,
                ),
            ))
        }
        None => None,
    };
    if let Some(mut summary) = summary {
        summary.insert("format".into(), json!(format.as_str()));
        if let Some((_, sub, check)) = &naming {
            summary.insert(
                "name_check".into(),
                match check {
                    Ok(parts) => json!({
                        "subscription": sub,
                        "ok": true,
                        "datetime": parts.datetime.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        "uuid": parts.uuid.to_string(),
                    }),
                    Err(e) => json!({"subscription": sub, "ok": false, "problem": e.to_string()}),
                },
            );
        }
        writeln!(out, "{}", Value::Object(summary)).map_err(io)?;
    }
    if let Some((name, subscription, Err(mismatch))) = naming {
        return Err(InspectError::Name {
            name,
            subscription,
            mismatch,
        });
    }
    Ok(())
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn sniff(head: &[u8]) -> Format {
    if head.starts_with(b"Obj\x01") {
        Format::Avro
    } else if head.starts_with(b"PAR1") {
        Format::Parquet
    } else {
        Format::Text
    }
}

async fn get(store: &Destination, key: &str, what: &str) -> Result<Bytes, InspectError> {
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

/// Whether the store has an object at `key` (`HEAD`); a store that cannot answer is an error.
async fn is_object(store: &Destination, key: &str, what: &str) -> Result<bool, InspectError> {
    let path = ObjectPath::parse(key).map_err(|e| InspectError::Store {
        what: what.into(),
        reason: e.to_string(),
    })?;
    match store.store.head(&path).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(InspectError::Store {
            what: what.into(),
            reason: e.to_string(),
        }),
    }
}

async fn has_delta_log(dest: &Destination) -> bool {
    use futures::StreamExt;
    let prefix = ObjectPath::from("_delta_log");
    let mut list = dest.store.list(Some(&prefix));
    matches!(list.next().await, Some(Ok(_)))
}

type Summary = Option<Map<String, Value>>;

fn write_line(out: &mut dyn Write, what: &str, v: &Value) -> Result<(), InspectError> {
    writeln!(out, "{v}").map_err(|source| InspectError::Io {
        what: what.into(),
        source,
    })
}

// ------------------------------------------------------------------------------------------------
// Listing a folder, bucket or prefix

/// An object below what is listed: its name relative to it, size and modification time.
struct Entry {
    name: String,
    size: u64,
    modified: Option<DateTime<Utc>>,
}

/// A local bucket's staging folder (never an object; see `crate::upload::local`).
const STAGING: &str = ".subsink-staging";

/// Every file below the folder `dir` but those of staging folders.
fn local_entries(dir: &std::path::Path) -> std::io::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let meta = e.metadata()?;
            if meta.is_dir() {
                if e.file_name() != STAGING {
                    todo.push(e.path());
                }
                continue;
            }
            let Ok(rel) = e.path().strip_prefix(dir).map(|r| r.to_path_buf()) else {
                continue;
            };
            entries.push(Entry {
                name: rel.to_string_lossy().into_owned(),
                size: meta.len(),
                modified: meta.modified().ok().map(DateTime::<Utc>::from),
            });
        }
    }
    Ok(entries)
}

/// Every object below `key` (the whole bucket when empty), names relative to it.
async fn remote_entries(
    bucket: &Destination,
    key: &str,
    what: &str,
) -> Result<Vec<Entry>, InspectError> {
    use futures::StreamExt;
    let prefix = match key {
        "" => None,
        k => Some(ObjectPath::parse(k).map_err(|e| InspectError::Store {
            what: what.into(),
            reason: e.to_string(),
        })?),
    };
    let mut list = bucket.store.list(prefix.as_ref());
    let mut entries = Vec::new();
    while let Some(meta) = list.next().await {
        let meta = meta.map_err(|e| InspectError::Store {
            what: what.into(),
            reason: e.to_string(),
        })?;
        let full = meta.location.as_ref();
        let name = match key {
            "" => full,
            k => full
                .strip_prefix(k)
                .and_then(|r| r.strip_prefix('/'))
                .unwrap_or(full),
        };
        if name.split('/').any(|c| c == STAGING) {
            continue;
        }
        entries.push(Entry {
            name: name.to_string(),
            size: meta.size,
            modified: Some(meta.last_modified),
        });
    }
    Ok(entries)
}

/// One line per object, and one per Delta table (a folder holding `_delta_log/`) for all its
/// files, in name order; `url` makes an entry's name a location to inspect. Nothing below: an
/// error.
fn listing(
    what: &str,
    mut entries: Vec<Entry>,
    url: &dyn Fn(&str) -> String,
    summary: bool,
    out: &mut dyn Write,
) -> Result<Summary, InspectError> {
    if entries.is_empty() {
        return Err(InspectError::Nothing { what: what.into() });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    // Table roots: the folder above each `_delta_log` folder.
    let mut roots: Vec<String> = entries
        .iter()
        .filter_map(|e| {
            let parts: Vec<&str> = e.name.split('/').collect();
            let at = parts.iter().position(|c| *c == "_delta_log")?;
            (at + 1 < parts.len()).then(|| parts[..at].join("/"))
        })
        .collect();
    roots.sort();
    roots.dedup();
    let table_of = |name: &str| -> Option<usize> {
        roots.iter().position(|r| {
            r.is_empty()
                || name
                    .strip_prefix(r.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    };
    // (objects, bytes) per table, and the lines in name order (a table where its first file is).
    let mut tables = vec![(0u64, 0u64); roots.len()];
    let mut lines: Vec<(String, Option<usize>, Option<&Entry>)> = Vec::new();
    for e in &entries {
        match table_of(&e.name) {
            Some(t) => {
                if tables[t].0 == 0 {
                    lines.push((roots[t].clone(), Some(t), None));
                }
                tables[t].0 += 1;
                tables[t].1 += e.size;
            }
            None => lines.push((e.name.clone(), None, Some(e))),
        }
    }
    lines.sort_by(|a, b| a.0.cmp(&b.0));
    let (mut objects, mut bytes) = (0u64, 0u64);
    for (name, table, entry) in &lines {
        let v = match (table, entry) {
            (Some(t), _) => json!({
                "table": name,
                "format": "delta",
                "objects": tables[*t].0,
                "size": tables[*t].1,
                "url": url(name).trim_end_matches('/'),
            }),
            (None, Some(e)) => {
                objects += 1;
                bytes += e.size;
                let mut m = Map::new();
                m.insert("object".into(), json!(name));
                m.insert("size".into(), json!(e.size));
                if let Some(t) = e.modified {
                    m.insert(
                        "last_modified".into(),
                        json!(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                    );
                }
                m.insert("url".into(), json!(url(name)));
                Value::Object(m)
            }
            (None, None) => continue,
        };
        if !summary {
            write_line(out, what, &v)?;
        }
    }
    Ok(summary.then(|| {
        let mut m = Map::new();
        m.insert("objects".into(), json!(objects));
        m.insert("tables".into(), json!(roots.len()));
        m.insert(
            "size".into(),
            json!(bytes + tables.iter().map(|t| t.1).sum::<u64>()),
        );
        m
    }))
}

// ------------------------------------------------------------------------------------------------
// Avro

fn avro(
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

/// Bytes as text when valid UTF-8, else `{"base64": …}`.
pub fn bytes_json(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => json!({"base64": base64::engine::general_purpose::STANDARD.encode(b)}),
    }
}

fn micros_rfc3339(us: i64) -> Value {
    match DateTime::<Utc>::from_timestamp_micros(us) {
        Some(t) => json!(t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        None => json!(us),
    }
}

/// A zone-less timestamp: wall-clock time, no `Z`.
fn naive_micros_json(us: i64) -> Value {
    match DateTime::<Utc>::from_timestamp_micros(us) {
        Some(t) => json!(t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.6f").to_string()),
        None => json!(us),
    }
}

fn date_json(days: i32) -> Value {
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("valid date");
    match epoch.checked_add_signed(chrono::Duration::days(days.into())) {
        Some(d) => json!(d.format("%Y-%m-%d").to_string()),
        None => json!(days),
    }
}

fn time_micros_json(us: i64) -> Value {
    let secs = us.div_euclid(1_000_000);
    let frac = us.rem_euclid(1_000_000);
    json!(format!(
        "{:02}:{:02}:{:02}.{frac:06}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    ))
}

fn float_json(f: f64) -> Value {
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or_else(|| json!(f.to_string()))
}

/// [`avro_json`] with the writer schema at hand, for what the value alone cannot say: a decimal's
/// scale (decimals become exact decimal text).
fn avro_json_with(
    v: &apache_avro::types::Value,
    schema: &apache_avro::Schema,
    names: &apache_avro::schema::NamesRef<'_>,
) -> Value {
    use apache_avro::types::Value as A;
    use apache_avro::Schema as S;
    match (v, schema) {
        (_, S::Ref { name }) => match names.get(name) {
            Some(s) => avro_json_with(v, s, names),
            None => avro_json(v),
        },
        (A::Decimal(d), S::Decimal(ds)) => match Vec::<u8>::try_from(d) {
            Ok(bytes) if bytes.len() <= 16 => {
                // Big-endian two's complement, sign-extended to 128 bits.
                let fill = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
                    0xff
                } else {
                    0
                };
                let mut buf = [fill; 16];
                buf[16 - bytes.len()..].copy_from_slice(&bytes);
                json!(decimal_text(
                    i128::from_be_bytes(buf),
                    ds.scale.min(127) as i8
                ))
            }
            Ok(bytes) => bytes_json(&bytes),
            Err(_) => avro_json(v),
        },
        (A::Record(fields), S::Record(rs)) => Value::Object(
            fields
                .iter()
                .map(|(k, fv)| {
                    let j = match rs.lookup.get(k).and_then(|&i| rs.fields.get(i)) {
                        Some(f) => avro_json_with(fv, &f.schema, names),
                        None => avro_json(fv),
                    };
                    (k.clone(), j)
                })
                .collect(),
        ),
        (A::Union(i, inner), S::Union(us)) => match us.variants().get(*i as usize) {
            Some(s) => avro_json_with(inner, s, names),
            None => avro_json(inner),
        },
        (A::Array(items), S::Array(a)) => Value::Array(
            items
                .iter()
                .map(|x| avro_json_with(x, &a.items, names))
                .collect(),
        ),
        (A::Map(m), S::Map(ms)) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), avro_json_with(x, &ms.types, names)))
                .collect(),
        ),
        _ => avro_json(v),
    }
}

fn avro_json(v: &apache_avro::types::Value) -> Value {
    use apache_avro::types::Value as A;
    match v {
        A::Null => Value::Null,
        A::Boolean(b) => json!(b),
        A::Int(i) => json!(i),
        A::Long(i) => json!(i),
        A::Float(f) => float_json(f64::from(*f)),
        A::Double(f) => float_json(*f),
        A::Bytes(b) | A::Fixed(_, b) => bytes_json(b),
        A::String(s) | A::Enum(_, s) => json!(s),
        A::Union(_, inner) => avro_json(inner),
        A::Array(items) => Value::Array(items.iter().map(avro_json).collect()),
        A::Map(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), avro_json(v))).collect()),
        A::Record(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), avro_json(v)))
                .collect(),
        ),
        A::Date(d) => date_json(*d),
        A::TimeMillis(ms) => time_micros_json(i64::from(*ms) * 1000),
        A::TimeMicros(us) => time_micros_json(*us),
        A::TimestampMillis(ms) => micros_rfc3339(ms.saturating_mul(1000)),
        A::TimestampMicros(us) => micros_rfc3339(*us),
        A::TimestampNanos(ns) => micros_rfc3339(ns.div_euclid(1000)),
        A::BigDecimal(d) => json!(d.to_string()),
        A::Uuid(u) => json!(u.to_string()),
        A::LocalTimestampMillis(ms) => naive_micros_json(ms.saturating_mul(1000)),
        A::LocalTimestampMicros(us) => naive_micros_json(*us),
        A::LocalTimestampNanos(ns) => naive_micros_json(ns.div_euclid(1000)),
        // Durations (and decimals outside a schema walk): their debug form.
        other => json!(format!("{other:?}")),
    }
}

// ------------------------------------------------------------------------------------------------
// Text

fn text(
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

// ------------------------------------------------------------------------------------------------
// Parquet and Delta

fn parquet<R: parquet::file::reader::ChunkReader + 'static>(
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

async fn delta(
    what: &str,
    dest: &Destination,
    summary: bool,
    out: &mut dyn Write,
) -> Result<Summary, InspectError> {
    let table = crate::table::delta::read_table_files(dest)
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

/// Every row of `batch` as a JSON object, columns in schema order.
pub fn batch_rows(batch: &RecordBatch) -> Vec<Value> {
    let schema = batch.schema();
    (0..batch.num_rows())
        .map(|row| {
            Value::Object(
                schema
                    .fields()
                    .iter()
                    .zip(batch.columns())
                    .map(|(f, col)| (f.name().clone(), cell(col.as_ref(), row)))
                    .collect(),
            )
        })
        .collect()
}

fn decimal_text(unscaled: i128, scale: i8) -> String {
    if scale <= 0 {
        return (unscaled * 10i128.pow(u32::from(scale.unsigned_abs()))).to_string();
    }
    let neg = unscaled < 0;
    let digits = unscaled.unsigned_abs().to_string();
    let s = scale as usize;
    let padded = format!("{digits:0>width$}", width = s + 1);
    let (whole, frac) = padded.split_at(padded.len() - s);
    format!("{}{whole}.{frac}", if neg { "-" } else { "" })
}

/// One cell as JSON (see the module docs for the forms).
fn cell(col: &dyn Array, row: usize) -> Value {
    if col.is_null(row) {
        return Value::Null;
    }
    match col.data_type() {
        DataType::Null => Value::Null,
        DataType::Boolean => json!(col.as_boolean().value(row)),
        DataType::Int8 => json!(col.as_primitive::<Int8Type>().value(row)),
        DataType::Int16 => json!(col.as_primitive::<Int16Type>().value(row)),
        DataType::Int32 => json!(col.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => json!(col.as_primitive::<Int64Type>().value(row)),
        DataType::UInt8 => json!(col.as_primitive::<UInt8Type>().value(row)),
        DataType::UInt16 => json!(col.as_primitive::<UInt16Type>().value(row)),
        DataType::UInt32 => json!(col.as_primitive::<UInt32Type>().value(row)),
        DataType::UInt64 => json!(col.as_primitive::<UInt64Type>().value(row)),
        DataType::Float32 => float_json(f64::from(col.as_primitive::<Float32Type>().value(row))),
        DataType::Float64 => float_json(col.as_primitive::<Float64Type>().value(row)),
        DataType::Utf8 => json!(col.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => json!(col.as_string::<i64>().value(row)),
        DataType::Utf8View => json!(col.as_string_view().value(row)),
        DataType::Binary => bytes_json(col.as_binary::<i32>().value(row)),
        DataType::LargeBinary => bytes_json(col.as_binary::<i64>().value(row)),
        DataType::BinaryView => bytes_json(col.as_binary_view().value(row)),
        DataType::FixedSizeBinary(_) => bytes_json(col.as_fixed_size_binary().value(row)),
        DataType::Date32 => date_json(col.as_primitive::<Date32Type>().value(row)),
        DataType::Timestamp(unit, tz) => {
            let v = match unit {
                TimeUnit::Second => col
                    .as_primitive::<TimestampSecondType>()
                    .value(row)
                    .saturating_mul(1_000_000),
                TimeUnit::Millisecond => col
                    .as_primitive::<TimestampMillisecondType>()
                    .value(row)
                    .saturating_mul(1000),
                TimeUnit::Microsecond => col.as_primitive::<TimestampMicrosecondType>().value(row),
                TimeUnit::Nanosecond => col
                    .as_primitive::<TimestampNanosecondType>()
                    .value(row)
                    .div_euclid(1000),
            };
            match tz {
                Some(_) => micros_rfc3339(v),
                // No zone (Delta's timestamp_ntz, BigQuery's DATETIME): a wall-clock time.
                None => naive_micros_json(v),
            }
        }
        DataType::Decimal128(_, scale) => json!(decimal_text(
            col.as_primitive::<Decimal128Type>().value(row),
            *scale
        )),
        DataType::List(_) => {
            let l = col.as_list::<i32>().value(row);
            Value::Array((0..l.len()).map(|i| cell(l.as_ref(), i)).collect())
        }
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>().value(row);
            Value::Array((0..l.len()).map(|i| cell(l.as_ref(), i)).collect())
        }
        DataType::Struct(fields) => {
            let s = col.as_struct();
            Value::Object(
                fields
                    .iter()
                    .zip(s.columns())
                    .map(|(f, c)| (f.name().clone(), cell(c.as_ref(), row)))
                    .collect(),
            )
        }
        DataType::Map(_, _) => {
            let m = col.as_map();
            let entries = m.value(row);
            let (keys, values) = (entries.column(0), entries.column(1));
            Value::Object(
                (0..entries.len())
                    .map(|i| {
                        let k = match cell(keys.as_ref(), i) {
                            Value::String(s) => s,
                            other => other.to_string(),
                        };
                        (k, cell(values.as_ref(), i))
                    })
                    .collect(),
            )
        }
        _ => {
            let fmt = arrow_cast::display::ArrayFormatter::try_new(
                col,
                &arrow_cast::display::FormatOptions::default(),
            );
            match fmt {
                Ok(f) => json!(f.value(row).to_string()),
                Err(e) => json!(format!("<{e}>")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_text_when_they_can_be() {
        assert_eq!(bytes_json(b"hello"), json!("hello"));
        assert_eq!(bytes_json(&[0xff, 0x00]), json!({"base64": "/wA="}));
    }

    #[test]
    fn decimals_keep_every_digit() {
        assert_eq!(decimal_text(123_456_000_000, 9), "123.456000000");
        assert_eq!(decimal_text(-5, 9), "-0.000000005");
        assert_eq!(decimal_text(7, 0), "7");
        assert_eq!(decimal_text(7, -2), "700");
    }

    #[test]
    fn avro_decimals_use_their_schema_scale() {
        use apache_avro::types::Value as A;
        let schema = apache_avro::Schema::parse_str(
            r#"{"type": "record", "name": "R", "fields": [
                {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
                {"name": "opt", "type": ["null", {"type": "fixed", "name": "F", "size": 4, "logicalType": "decimal", "precision": 8, "scale": 3}]},
                {"name": "again", "type": ["null", "F"]}
            ]}"#,
        )
        .unwrap();
        let resolved = apache_avro::schema::ResolvedSchema::try_from(&schema).unwrap();
        let v = A::Record(vec![
            (
                "price".into(),
                A::Decimal(apache_avro::Decimal::from(vec![0xfb, 0x2e])),
            ), // -1234
            (
                "opt".into(),
                A::Union(
                    1,
                    Box::new(A::Decimal(apache_avro::Decimal::from(vec![
                        0, 0, 0x30, 0x39,
                    ]))),
                ),
            ), // 12345
            (
                "again".into(),
                A::Union(
                    1,
                    Box::new(A::Decimal(apache_avro::Decimal::from(vec![0, 0, 0, 5]))),
                ),
            ),
        ]);
        assert_eq!(
            avro_json_with(&v, &schema, resolved.get_names()),
            json!({"price": "-12.34", "opt": "12.345", "again": "0.005"})
        );
    }

    #[test]
    fn times_render_like_rfc3339() {
        assert_eq!(
            micros_rfc3339(1_695_615_000_123_456),
            json!("2023-09-25T04:10:00.123456Z")
        );
        assert_eq!(date_json(19_625), json!("2023-09-25"));
        assert_eq!(time_micros_json(3_723_000_004), json!("01:02:03.000004"));
    }
}
