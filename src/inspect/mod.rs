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
//! (`<prefix><datetime>_<uuid><suffix>`, with the partition directories of `subsink.paths`, see
//! [`crate::paths::check_storage_name`]).
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
//!
//! | file | what it holds |
//! |---|---|
//! | `inspect/mod.rs` | [`inspect`]: where the input is, what it is (sniffed), which reader reads it, the name check |
//! | `inspect/error.rs` | [`InspectError`], the summary type and one line written |
//! | `inspect/listing.rs` | a folder, bucket or prefix listed |
//! | `inspect/readers.rs` | Avro, Text, Parquet and Delta read as NDJSON |
//! | `inspect/values.rs` | values as JSON |

use std::io::{Read, Write};
use std::path::PathBuf;

use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt;
use serde_json::{json, Value};

use crate::config::StorageSettings;
use crate::paths::check_storage_name;
use crate::upload::Destination;
use error::Summary;

mod error;
mod listing;
mod readers;
mod values;

pub use error::InspectError;
pub use values::{batch_rows, bytes_json};

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
    let (format, summary) = match &loc {
        Location::Local(path) => read_local(input, path, opts, out).await?,
        Location::Remote {
            url,
            bucket,
            root,
            key,
            prefix,
        } => {
            let at = (url.as_str(), bucket, root.as_str(), key.as_str(), *prefix);
            read_remote(input, at, opts, out).await?
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
                check_storage_name(&name, storage),
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
            mismatch: Box::new(mismatch),
        });
    }
    Ok(())
}

/// Read the local file or folder `path` (`input` as given): a folder is listed unless it is a
/// Delta table, a file is read as its first bytes say.
async fn read_local(
    input: &str,
    path: &std::path::Path,
    opts: &InspectOptions,
    out: &mut dyn Write,
) -> Result<(Format, Summary), InspectError> {
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
    Ok(match () {
        _ if path.is_dir() && !path.join("_delta_log").is_dir() => {
            if opts.naming.is_some() {
                return Err(listing_name_check());
            }
            let entries = listing::local_entries(path).map_err(io)?;
            let base = input.trim_end_matches('/');
            let url = |name: &str| format!("{base}/{name}");
            (
                Format::Listing,
                listing::listing(input, entries, &url, opts.summary, out)?,
            )
        }
        _ if path.is_dir() => {
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
            (
                Format::Delta,
                readers::delta(input, &dest, opts.summary, out).await?,
            )
        }
        _ => {
            let mut f = std::fs::File::open(path).map_err(io)?;
            let mut magic = [0u8; 4];
            let n = read_up_to(&mut f, &mut magic).map_err(io)?;
            let f = std::fs::File::open(path).map_err(io)?;
            match sniff(&magic[..n]) {
                Format::Avro => (
                    Format::Avro,
                    readers::avro(input, std::io::BufReader::new(f), opts.summary, out)?,
                ),
                Format::Parquet => (
                    Format::Parquet,
                    readers::parquet(input, f, opts.summary, out)?,
                ),
                _ => (
                    Format::Text,
                    readers::text(input, std::io::BufReader::new(f), opts.summary, out)?,
                ),
            }
        }
    })
}

/// Read the object, prefix, bucket or Delta table at `url` (`input` as given; `root`, `bucket`
/// and `key` as [`Location::Remote`] holds them): a table or one object is read, anything else
/// listed.
async fn read_remote(
    input: &str,
    (url, bucket, root, key, prefix): (&str, &Destination, &str, &str, bool),
    opts: &InspectOptions,
    out: &mut dyn Write,
) -> Result<(Format, Summary), InspectError> {
    let listing_name_check = || InspectError::Unsupported {
        what: input.into(),
        reason: "a folder, bucket or prefix is listed, not read; --subscription checks the name \
                 of one object"
            .into(),
    };
    let table = Destination::from_url(url).map_err(|e| InspectError::Store {
        what: input.into(),
        reason: e.to_string(),
    })?;
    Ok(if has_delta_log(&table).await {
        (
            Format::Delta,
            readers::delta(input, &table, opts.summary, out).await?,
        )
    } else if prefix || key.is_empty() || !is_object(bucket, key, input).await? {
        if opts.naming.is_some() {
            return Err(listing_name_check());
        }
        let entries = listing::remote_entries(bucket, key, input).await?;
        let url = |name: &str| match key.is_empty() {
            true => format!("{root}{name}"),
            false => format!("{root}{key}/{name}"),
        };
        (
            Format::Listing,
            listing::listing(input, entries, &url, opts.summary, out)?,
        )
    } else {
        let bytes = readers::get(bucket, key, input).await?;
        match sniff(&bytes) {
            Format::Avro => (
                Format::Avro,
                readers::avro(input, &bytes[..], opts.summary, out)?,
            ),
            Format::Parquet => (
                Format::Parquet,
                readers::parquet(input, bytes, opts.summary, out)?,
            ),
            _ => (
                Format::Text,
                readers::text(input, &bytes[..], opts.summary, out)?,
            ),
        }
    })
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
