//! Listing a folder, bucket or prefix: one NDJSON line per object below it, one per Delta table.

use std::io::Write;

use chrono::{DateTime, Utc};
use object_store::path::Path as ObjectPath;
use serde_json::{json, Map, Value};

use super::error::{write_line, InspectError, Summary};
use crate::upload::Destination;

/// An object below what is listed: its name relative to it, size and modification time.
pub(super) struct Entry {
    name: String,
    size: u64,
    modified: Option<DateTime<Utc>>,
}

/// A local bucket's staging folder (never an object; see `crate::upload::local`).
const STAGING: &str = ".subsink-staging";

/// Every file below the folder `dir` but those of staging folders.
pub(super) fn local_entries(dir: &std::path::Path) -> std::io::Result<Vec<Entry>> {
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
pub(super) async fn remote_entries(
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
pub(super) fn listing(
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
