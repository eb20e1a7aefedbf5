//! Reading back what subsink wrote, with readers nobody here wrote (fastavro), and the small
//! extractions the tests make from the records.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{root, venv_python};

/// Read Avro files with fastavro; one JSON object per file (see tests/py/avro_dump.py).
pub fn fastavro_dump(files: &[PathBuf]) -> Vec<Value> {
    let script = root().join("tests/py/avro_dump.py");
    let args = std::iter::once(script.as_path()).chain(files.iter().map(PathBuf::as_path));
    venv_python(args, &[])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The records of fastavro dumps, in order, all files together.
pub fn records_of(dumps: &[Value]) -> Vec<Value> {
    dumps
        .iter()
        .flat_map(|d| d["records"].as_array().unwrap().clone())
        .collect()
}

/// Every record of the Avro `files`, in order (none for no files).
pub fn avro_records(files: &[PathBuf]) -> Vec<Value> {
    if files.is_empty() {
        return Vec::new();
    }
    records_of(&fastavro_dump(files))
}

/// The records of each Avro file, `(file, records)`, in the order given.
pub fn avro_records_by_file(files: Vec<PathBuf>) -> Vec<(PathBuf, Vec<Value>)> {
    if files.is_empty() {
        return Vec::new();
    }
    let dumps = fastavro_dump(&files);
    files
        .into_iter()
        .zip(dumps)
        .map(|(f, d)| (f, d["records"].as_array().unwrap().clone()))
        .collect()
}

/// The `message_id` of each record, in order.
pub fn message_ids(records: &[Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["message_id"].as_str().unwrap().to_string())
        .collect()
}

/// The `i` attribute of a metadata record.
pub fn attr_i(r: &Value) -> usize {
    r["attributes"]["i"].as_str().unwrap().parse().unwrap()
}

/// How often each `i` (attr_i) was written, over records read per object.
pub fn counts(recs: &[(PathBuf, Vec<Value>)]) -> std::collections::HashMap<usize, usize> {
    let mut c = std::collections::HashMap::new();
    for (_, r) in recs {
        for x in r {
            *c.entry(attr_i(x)).or_default() += 1;
        }
    }
    c
}

/// Every file below `dir`, joined to it, in name order.
pub fn paths_below(dir: &Path) -> Vec<PathBuf> {
    super::files_below(dir)
        .iter()
        .map(|f| dir.join(f))
        .collect()
}

/// The watermark of a checkpoint file (`None` before the first one is written).
/// The objects of a local bucket folder: every file below it but the writer's staging files
/// (`.subsink-staging/`, a hidden folder that readers of the bucket skip, renamed away at any time).
pub fn objects_below(bucket: &Path) -> Vec<PathBuf> {
    super::files_below(bucket)
        .into_iter()
        .filter(|f| !f.starts_with(".subsink-staging/"))
        .map(|f| bucket.join(f))
        .collect()
}

/// Files left in the staging folders (`.subsink-staging/`, where the file store writes each
/// object before renaming it into place) of a local bucket, or of every bucket below `dir`,
/// relative to `dir`. [`objects_below`] leaves them out, so a test that reads objects alone never
/// sees them.
pub fn staging_leftovers(dir: &Path) -> Vec<String> {
    super::files_below(dir)
        .into_iter()
        .filter(|f| f.split('/').any(|c| c == ".subsink-staging"))
        .collect()
}

/// A staging file as a writer killed mid-write leaves it (`.subsink-staging/<pid>.<n>`, the pid of
/// a process that has exited), so a crash test sees the sweep at work whether or not its kills hit
/// a write; its path.
pub fn plant_dead_writers_staging(bucket: &Path) -> std::path::PathBuf {
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    let dir = bucket.join(".subsink-staging");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join(format!("{pid}.1"));
    std::fs::write(&f, b"half an object").unwrap();
    f
}

/// No staging file is left in the local bucket `bucket` (or in any bucket below it): a worker
/// that finished cleanly leaves none, and one started after a crash sweeps the dead writer's.
pub fn assert_no_staging(bucket: &Path) {
    let left = staging_leftovers(bucket);
    assert!(
        left.is_empty(),
        "staging files left in {}: {left:?}",
        bucket.display()
    );
}

pub fn checkpoint_offset(cp: &Path) -> Option<u64> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(cp).ok()?).ok()?;
    v["offset"].as_u64()
}

/// How often each value occurs.
pub fn tally<T: Ord + Clone>(
    items: impl IntoIterator<Item = T>,
) -> std::collections::BTreeMap<T, usize> {
    let mut m = std::collections::BTreeMap::new();
    for i in items {
        *m.entry(i).or_insert(0) += 1;
    }
    m
}

/// Poll `read` every `every` until its records carry every `i` attribute in `0..n`, within
/// `limit`; the records of that read.
pub fn wait_for_every_i<K>(
    n: usize,
    limit: std::time::Duration,
    every: std::time::Duration,
    mut read: impl FnMut() -> Vec<(K, Vec<Value>)>,
) -> Vec<(K, Vec<Value>)> {
    super::poll(limit, every, || {
        let recs = read();
        let seen: std::collections::HashSet<usize> = recs
            .iter()
            .flat_map(|(_, r)| r.iter().map(attr_i))
            .collect();
        if seen.len() >= n {
            Ok(recs)
        } else {
            Err(format!(
                "only {} of {n} messages written after {limit:?}",
                seen.len()
            ))
        }
    })
}
