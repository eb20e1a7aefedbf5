//! Partitioned object paths (issue 36, `subsink.paths`, docs/contract.md §7): the real binary
//! writes Hive-style `k=v/` directories into a local bucket, SeaweedFS (S3) and Azurite; the
//! objects' exact names, the messages of each path (fastavro), a Hive-partitioned read of the
//! tree (pyarrow.dataset), archive replay of the partitioned export, a checkpoint resume after
//! kills, many paths under a small `--memory-limit`, and paths by an event time (issue 44).

#[path = "memory/sized.rs"]
mod sized;
mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use subsink::message::Message;
use util::servers::{shared_azurite, shared_seaweedfs, unique_bucket};
use util::*;

/// Messages of [`messages`].
const N: usize = 240;
/// 2026-12-05T22:30:00Z: publish times run over midnight into 2026-12-06.
const BASE_MICROS: i64 = 1_796_509_800_000_000;
const HOUR_MICROS: i64 = 3_600_000_000;

/// The `region` attribute of message `i` (`None`: absent), its directory value as subsink must
/// write it (escaped as Hive does; empty and absent are NULL), and what a Hive reader decodes.
fn region(i: usize) -> (Option<&'static str>, &'static str, Option<&'static str>) {
    match i % 6 {
        0 => (Some("eu-west"), "eu-west", Some("eu-west")),
        1 => (Some("us/east"), "us%2Feast", Some("us/east")),
        2 => (Some("a=b%"), "a%3Db%25", Some("a=b%")),
        3 => (Some(""), "__HIVE_DEFAULT_PARTITION__", None),
        4 => (None, "__HIVE_DEFAULT_PARTITION__", None),
        _ => (Some("ünï code"), "ünï code", Some("ünï code")),
    }
}

/// The payload's `type` of message `i` (`None`: absent), its directory value, what a Hive reader
/// decodes.
fn kind(i: usize) -> (Option<Value>, &'static str, Option<&'static str>) {
    match i % 5 {
        0 => (Some(json!("click")), "click", Some("click")),
        1 => (Some(json!("view:full")), "view%3Afull", Some("view:full")),
        2 => (Some(json!(7)), "7", Some("7")),
        3 => (Some(Value::Null), "__HIVE_DEFAULT_PARTITION__", None),
        _ => (None, "__HIVE_DEFAULT_PARTITION__", None),
    }
}

fn publish_micros(i: usize) -> i64 {
    BASE_MICROS + (i % 4) as i64 * HOUR_MICROS + i as i64 * 1_000_003
}

fn messages() -> Vec<Message> {
    (0..N)
        .map(|i| {
            let mut payload = json!({"i": i, "note": format!("message {i}")});
            if let Some(k) = kind(i).0 {
                payload["type"] = k;
            }
            let mut attributes: Vec<(String, String)> = vec![("i".into(), i.to_string())];
            if let Some(r) = region(i).0 {
                attributes.push(("region".into(), r.into()));
            }
            Message {
                data: payload.to_string().into_bytes().into(),
                attributes: attributes.into_iter().collect::<BTreeMap<_, _>>().into(),
                message_id: format!("m-{i}"),
                publish_time_micros: publish_micros(i),
                ordering_key: String::new(),
            }
        })
        .collect()
}

/// `(dt, hour)` of message `i`, rendered independently of subsink.
fn dt_hour(i: usize) -> (String, String) {
    let t = DateTime::<Utc>::from_timestamp_micros(publish_micros(i)).unwrap();
    (t.format("%Y-%m-%d").to_string(), t.format("%H").to_string())
}

/// The partition directory of message `i`.
fn dir_of(i: usize) -> String {
    let (dt, hour) = dt_hour(i);
    format!(
        "dt={dt}/hour={hour}/region={}/kind={}/",
        region(i).1,
        kind(i).1
    )
}

fn partitions() -> Value {
    json!([
        {"name": "dt", "publishTime": "YYYY-MM-DD"},
        {"name": "hour", "publishTime": "hh"},
        {"name": "region", "attribute": "region"},
        {"name": "kind", "field": "type"}
    ])
}

/// A subscription config in `dir` (`subsink.paths` when `partitioned`); its path.
fn config(dir: &Path, tag: &str, storage: Value, partitioned: bool) -> PathBuf {
    let mut sub = json!({
        "name": format!("projects/proj/subscriptions/{tag}"),
        "topic": "projects/proj/topics/top",
        "cloudStorageConfig": storage,
        "subsink": {"limits": "extended"}
    });
    if partitioned {
        sub["subsink"]["paths"] = json!({"partitions": partitions()});
    }
    let p = dir.join(format!("{tag}.json"));
    std::fs::write(&p, sub.to_string()).unwrap();
    p
}

/// Avro with metadata, prefix `exports/data-`, suffix `.avro`.
fn avro_storage() -> Value {
    json!({"bucket": "bkt", "filenamePrefix": "exports/data-", "filenameSuffix": ".avro",
           "avroConfig": {"writeMetadata": true}, "maxDuration": "3600s"})
}

/// `subsink run` of the config `sub` from `src` into `url`.
fn run_cmd(sub: &Path, src: &Path, url: &str) -> Command {
    let mut c = subsink();
    c.args(["run", "--subscription"])
        .arg(sub)
        .arg("--source")
        .arg(src)
        .args(["--bucket-url", url]);
    c
}

/// Does `s` have the shape of `pattern` (`d`: a digit, anything else: itself)?
fn shaped(s: &str, pattern: &str) -> bool {
    s.len() == pattern.len()
        && s.bytes().zip(pattern.bytes()).all(|(c, p)| match p {
            b'd' => c.is_ascii_digit(),
            _ => c == p,
        })
}

/// Checks `name` is `exports/<dir>data-<default datetime>_<uuid>.avro` for a directory of the
/// input, and returns the directory.
fn dir_of_name(name: &str, dirs: &BTreeSet<String>) -> String {
    let rest = name
        .strip_prefix("exports/")
        .unwrap_or_else(|| panic!("{name}"));
    let dir = dirs
        .iter()
        .find(|d| rest.starts_with(d.as_str()))
        .unwrap_or_else(|| panic!("{name}: not under a directory of the input"));
    let file = &rest[dir.len()..];
    let file = file
        .strip_prefix("data-")
        .and_then(|f| f.strip_suffix(".avro"))
        .unwrap_or_else(|| panic!("{name}"));
    let (datetime, uuid) = file.split_at(25);
    assert!(shaped(datetime, "dddd-dd-ddTdd:dd:dd+00:00"), "{name}");
    let uuid = uuid.strip_prefix('_').unwrap_or_else(|| panic!("{name}"));
    assert_eq!(
        uuid::Uuid::try_parse(uuid).unwrap().get_version_num(),
        4,
        "{name}"
    );
    dir.clone()
}

/// The metadata record subsink writes for message `m` of subscription `sub`.
fn record(sub: &str, m: &Message) -> Value {
    json!({
        "subscription_name": sub,
        "message_id": m.message_id,
        "publish_time": m.publish_time_micros,
        "attributes": m.attributes.to_map(),
        "data": b64(&m.data),
    })
}

/// The input's messages of each directory, as records of `sub`, sorted by message id.
fn expected_by_dir(sub: &str) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (i, m) in messages().iter().enumerate() {
        out.entry(dir_of(i)).or_default().push(record(sub, m));
    }
    for v in out.values_mut() {
        v.sort_by(|a, b| a["message_id"].as_str().cmp(&b["message_id"].as_str()));
    }
    out
}

/// The records of `files` (local copies, each with its object name), by directory, sorted by
/// message id; every object must be named as a partitioned object.
fn records_by_dir(files: &[(String, PathBuf)]) -> BTreeMap<String, Vec<Value>> {
    let dirs: BTreeSet<String> = (0..N).map(dir_of).collect();
    let paths: Vec<PathBuf> = files.iter().map(|(_, p)| p.clone()).collect();
    let dumps = fastavro_dump(&paths);
    assert_eq!(dumps.len(), files.len());
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for ((name, _), dump) in files.iter().zip(&dumps) {
        let dir = dir_of_name(name, &dirs);
        out.entry(dir)
            .or_default()
            .extend(dump["records"].as_array().unwrap().iter().cloned());
    }
    for v in out.values_mut() {
        v.sort_by(|a, b| a["message_id"].as_str().cmp(&b["message_id"].as_str()));
    }
    out
}

/// Every object of a local bucket folder, as (object name, path).
fn local_objects(bucket: &Path) -> Vec<(String, PathBuf)> {
    files_below(bucket)
        .into_iter()
        .map(|f| (f.clone(), bucket.join(f)))
        .collect()
}

/// The multiset of (message id, publish time, attributes, data) of records.
fn message_multiset(records: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = records
        .iter()
        .map(|r| {
            json!([
                r["message_id"],
                r["publish_time"],
                r["attributes"],
                r["data"]
            ])
            .to_string()
        })
        .collect();
    v.sort();
    v
}

#[test]
fn local_bucket_one_object_per_path_named_exactly_with_its_messages() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    write_lines(&src, &messages());
    let sub = config(work.path(), "parts", avro_storage(), true);
    let bucket = work.path().join("bucket");
    let s = summary(&run_ok(&mut run_cmd(
        &sub,
        &src,
        &format!("file://{}", bucket.display()),
    )));
    assert_eq!(s["messages_written"], N as u64, "{s}");
    let expected = expected_by_dir("projects/proj/subscriptions/parts");
    // Both days, every hour, the escaped and the NULL values: the directories as Hive writes them.
    for (i, d) in [
        (0, "dt=2026-12-05/hour=22/region=eu-west/kind=click/"),
        (1, "dt=2026-12-05/hour=23/region=us%2Feast/kind=view%3Afull/"),
        (2, "dt=2026-12-06/hour=00/region=a%3Db%25/kind=7/"),
        (
            3,
            "dt=2026-12-06/hour=01/region=__HIVE_DEFAULT_PARTITION__/kind=__HIVE_DEFAULT_PARTITION__/",
        ),
        (
            4,
            "dt=2026-12-05/hour=22/region=__HIVE_DEFAULT_PARTITION__/kind=__HIVE_DEFAULT_PARTITION__/",
        ),
        (5, "dt=2026-12-05/hour=23/region=ünï code/kind=click/"),
    ] {
        assert_eq!(dir_of(i), d);
    }
    let objects = local_objects(&bucket);
    // One open file per path: each path's messages are in one object.
    assert_eq!(objects.len(), expected.len(), "{objects:?}");
    let got = records_by_dir(&objects);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (dir, want) in &expected {
        assert_eq!(&got[dir], want, "records of {dir}");
    }
    // The summary names the same objects.
    let mut listed = summary_objects(&s);
    listed.sort();
    let mut names: Vec<String> = objects.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    let listed: Vec<String> = listed
        .iter()
        .map(|o| {
            o.rsplit_once("/bucket/")
                .map_or(o.clone(), |(_, n)| n.to_string())
        })
        .collect();
    assert_eq!(listed, names);
}

#[test]
fn text_objects_read_back_with_pyarrow_hive_partitioning() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    write_lines(&src, &messages());
    let storage = json!({"bucket": "bkt", "filenamePrefix": "text/part-", "filenameSuffix": ".json",
                         "maxDuration": "3600s", "maxMessages": "7"});
    let sub = config(work.path(), "text", storage, true);
    let bucket = work.path().join("bucket");
    let s = summary(&run_ok(&mut run_cmd(
        &sub,
        &src,
        &format!("file://{}", bucket.display()),
    )));
    assert_eq!(s["messages_written"], N as u64, "{s}");
    // maxMessages 7 holds in each path's own file: a path of n messages has ceil(n / 7) objects.
    let mut per_dir: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..N {
        *per_dir.entry(dir_of(i)).or_default() += 1;
    }
    let want_objects: usize = per_dir.values().map(|n| n.div_ceil(7)).sum();
    assert_eq!(files_below(&bucket.join("text")).len(), want_objects);
    assert!(want_objects > per_dir.len(), "some path must roll over");

    let script = r#"
import json, sys
import pyarrow as pa, pyarrow.dataset as ds, pyarrow.json as pj
keys = pa.schema([("dt", pa.string()), ("hour", pa.string()),
                  ("region", pa.string()), ("kind", pa.string())])
part = ds.partitioning(keys, flavor="hive")
# Only `i` of the payload: its `type` is a string in some rows and a number in others.
payload = pa.schema([("i", pa.int64())])
fmt = ds.JsonFileFormat(parse_options=pj.ParseOptions(
    explicit_schema=payload, unexpected_field_behavior="ignore"))
schema = pa.unify_schemas([payload, keys])
t = ds.dataset(sys.argv[1], schema=schema, format=fmt, partitioning=part).to_table()
print(json.dumps(sorted(t.to_pylist(), key=lambda r: r["i"])))
"#;
    let rows = python_json(script, bucket.join("text").to_str().unwrap(), &[]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), N);
    for (i, row) in rows.iter().enumerate() {
        let (dt, hour) = dt_hour(i);
        assert_eq!(
            row,
            &json!({"i": i, "dt": dt, "hour": hour, "region": region(i).2, "kind": kind(i).2}),
            "row {i}"
        );
    }
}

/// Export the input partitioned into `url` (`env` for the store), then replay the archive into a
/// local export without partitions: every message back exactly once, with its publish time and
/// attributes. Returns the object names the export wrote (its summary).
fn export_then_replay(work: &Path, url: &str, env: &[(&'static str, String)]) -> Vec<String> {
    let src = work.join("in.ndjson");
    write_lines(&src, &messages());
    let sub = config(work, "parts", avro_storage(), true);
    let s = summary(&run_ok(run_cmd(&sub, &src, url).envs(env.iter().cloned())));
    assert_eq!(s["messages_written"], N as u64, "{s}");
    let objects = summary_objects(&s);
    let flat = config(
        work,
        "flat",
        json!({"bucket": "bkt", "avroConfig": {"writeMetadata": true}, "maxDuration": "3600s"}),
        false,
    );
    let out = work.join("replayed");
    for (rule, exact) in [("--archive-subscription", true), ("", false)] {
        let _ = std::fs::remove_dir_all(&out);
        let mut c = subsink();
        c.args(["run", "--subscription"])
            .arg(&flat)
            .args(["--source", &format!("{}/", url.trim_end_matches('/'))])
            .args(["--bucket-url", &format!("file://{}", out.display())])
            .envs(env.iter().cloned());
        if exact {
            c.arg(rule).arg(&sub);
        }
        let r = summary(&run_ok(&mut c));
        assert_eq!(r["messages_written"], N as u64, "exact rule {exact}: {r}");
        assert_eq!(r["archive"]["objects_read"], objects.len() as u64, "{r}");
        assert_eq!(r["archive"]["objects_skipped"], 0, "{r}");
        let recs = records_of(&fastavro_dump(&paths_below(&out)));
        let want: Vec<Value> = messages()
            .iter()
            .map(|m| record("projects/proj/subscriptions/flat", m))
            .collect();
        assert_eq!(
            message_multiset(&recs),
            message_multiset(&want),
            "exact rule {exact}"
        );
    }
    objects
}

#[test]
fn local_archive_of_a_partitioned_export_replays_every_message_once() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    let url = format!("file://{}", bucket.display());
    let objects = export_then_replay(work.path(), &url, &[]);
    assert_eq!(objects.len(), expected_by_dir("x").len());
    // A file without the partition directories is not this subscription's: skipped by the exact
    // rule, named in the summary's count.
    let stray = bucket
        .join("exports/data-2026-12-05T22:30:00+00:00_0b6c2a4e-2f35-4a8e-9d61-1c1f1d2b3c4d.avro");
    std::fs::copy(&local_objects(&bucket)[0].1, &stray).unwrap();
    let flat = config(
        work.path(),
        "flat2",
        json!({"bucket": "bkt", "avroConfig": {"writeMetadata": true}, "maxDuration": "3600s"}),
        false,
    );
    let out = work.path().join("again");
    let mut c = subsink();
    c.args(["run", "--subscription"])
        .arg(&flat)
        .args(["--source", &format!("{url}/")])
        .args(["--bucket-url", &format!("file://{}", out.display())])
        .arg("--archive-subscription")
        .arg(work.path().join("parts.json"));
    let r = summary(&run_ok(&mut c));
    assert_eq!(r["messages_written"], N as u64, "{r}");
    assert_eq!(r["archive"]["objects_skipped"], 1, "{r}");
}

#[test]
fn seaweedfs_names_records_and_replay() {
    let s3 = shared_seaweedfs().api();
    let bucket = unique_bucket("paths");
    s3.create_bucket(&bucket);
    let work = tempfile::tempdir().unwrap();
    let objects = export_then_replay(work.path(), &format!("s3://{bucket}"), &s3.env());
    let files: Vec<(String, PathBuf)> = s3
        .download_all(&bucket, &work.path().join("down"))
        .into_iter()
        .map(|(k, p, _)| (k, p))
        .collect();
    let mut names: Vec<String> = files.iter().map(|(k, _)| k.clone()).collect();
    names.sort();
    let mut summarized: Vec<String> = objects
        .iter()
        .map(|o| {
            o.strip_prefix(&format!("s3://{bucket}/"))
                .unwrap_or(o)
                .to_string()
        })
        .collect();
    summarized.sort();
    assert_eq!(names, summarized);
    let expected = expected_by_dir("projects/proj/subscriptions/parts");
    let got = records_by_dir(&files);
    assert_eq!(got, expected);
    assert_eq!(s3.open_multipart_uploads(&bucket), 0);
}

#[test]
fn azurite_names_records_and_replay() {
    let az = shared_azurite();
    let container = unique_bucket("paths");
    az.create_container(&container);
    let work = tempfile::tempdir().unwrap();
    let objects = export_then_replay(work.path(), &format!("az://{container}"), &az.env());
    let dirs: BTreeSet<String> = (0..N).map(dir_of).collect();
    let listed = az.list(&container);
    assert_eq!(listed.len(), dirs.len(), "{listed:?}");
    let got: BTreeSet<String> = listed
        .iter()
        .map(|(name, size)| {
            assert!(*size > 0, "{name}");
            dir_of_name(name, &dirs)
        })
        .collect();
    assert_eq!(got, dirs);
    assert_eq!(objects.len(), listed.len());
    assert_eq!(az.uncommitted(&container), 0);
    // Each path's records, read from the blobs with fastavro.
    let down = work.path().join("down");
    std::fs::create_dir_all(&down).unwrap();
    let files: Vec<(String, PathBuf)> = listed
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.clone(), down.join(format!("{i:04}.avro"))))
        .collect();
    let pairs: Vec<(String, String)> = files
        .iter()
        .map(|(n, p)| (n.clone(), p.display().to_string()))
        .collect();
    az.python(&format!(
        "c = svc.get_container_client({container:?})\n\
         for name, path in json.loads({:?}):\n    open(path, 'wb').write(c.download_blob(name).readall())",
        serde_json::to_string(&pairs).unwrap()
    ));
    assert_eq!(
        records_by_dir(&files),
        expected_by_dir("projects/proj/subscriptions/parts")
    );
}

/// Messages of [`resume_after_kills_writes_every_message_once_under_its_path`]: `region`
/// attribute `r{i % 8}`.
fn regional(n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let mut m = numbered_message(i, 200);
            m.attributes.insert("region".into(), format!("r{}", i % 8));
            m.message_id = format!("m-{i}");
            m
        })
        .collect()
}

/// Every object of a local bucket must be `region=rK/...` and hold only messages of rK; returns
/// the message ids of every record, sorted.
fn ids_under_their_region(bucket: &Path) -> Vec<String> {
    let objects = local_objects(bucket);
    let paths: Vec<PathBuf> = objects.iter().map(|(_, p)| p.clone()).collect();
    let mut ids = Vec::new();
    for ((name, _), dump) in objects.iter().zip(fastavro_dump(&paths)) {
        let dir = name.split('/').next().unwrap();
        for r in dump["records"].as_array().unwrap() {
            let i = attr_i(r);
            assert_eq!(dir, format!("region=r{}", i % 8), "{name}");
            ids.push(r["message_id"].as_str().unwrap().to_string());
        }
    }
    ids.sort();
    ids
}

#[test]
fn resume_after_kills_writes_every_message_once_under_its_path() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let msgs = regional(60_000);
    write_lines(&src, &msgs);
    let mut sub: Value = json!({
        "name": "projects/proj/subscriptions/resume",
        "topic": "projects/proj/topics/top",
        "cloudStorageConfig": {"bucket": "bkt", "avroConfig": {"writeMetadata": true},
                               "maxDuration": "3600s", "maxMessages": "300"},
        "subsink": {"limits": "extended",
                    "paths": {"partitions": [{"name": "region", "attribute": "region"}]}}
    });
    let cfg = work.path().join("resume.json");
    std::fs::write(&cfg, sub.take().to_string()).unwrap();
    let bucket = work.path().join("bucket");
    let cp = work.path().join("cp.json");
    let cmd = || {
        let mut c = run_cmd(&cfg, &src, &format!("file://{}", bucket.display()));
        c.arg("--checkpoint").arg(&cp);
        c
    };
    let size = std::fs::metadata(&src).unwrap().len();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    kill_rounds(4, &cp, size, &mut seed, || {
        cmd()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    });
    let s = summary(&run_ok(&mut cmd()));
    assert!(s["messages_written"].as_u64().unwrap() < 60_000, "{s}");
    let everything = files_below(&bucket);
    assert!(
        everything
            .iter()
            .all(|f| !f.contains('#') && !f.starts_with('.')),
        "staging debris: {everything:?}"
    );
    let mut want: Vec<String> = msgs.iter().map(|m| m.message_id.clone()).collect();
    want.sort();
    assert_eq!(
        ids_under_their_region(&bucket),
        want,
        "duplicates or losses"
    );
    // A further run finds nothing left to do.
    assert_eq!(summary(&run_ok(&mut cmd()))["messages_written"], 0);
}

/// Paths of [`many_paths_stay_within_a_small_memory_budget`], and its input.
const MANY_PATHS: usize = 250;
const MANY_MESSAGES: usize = 25_000;
const MANY_BYTES: usize = 4000;
const MANY_LIMIT_MIB: u64 = 16;

#[test]
fn many_paths_stay_within_a_small_memory_budget() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&src).unwrap());
        for i in 0..MANY_MESSAGES {
            let m = Message {
                data: format!("{i:08}{}", "x".repeat(MANY_BYTES - 8))
                    .into_bytes()
                    .into(),
                attributes: [("region", format!("r{:03}", i % MANY_PATHS))].into(),
                message_id: format!("{i}"),
                publish_time_micros: BASE_MICROS + i as i64,
                ordering_key: String::new(),
            };
            writeln!(f, "{}", m.to_json_line()).unwrap();
        }
    }
    let storage = json!({"bucket": "bkt", "filenamePrefix": "many/", "maxDuration": "3600s",
                         "maxBytes": "10000000000"});
    let mut sub = json!({
        "name": "projects/proj/subscriptions/many",
        "topic": "projects/proj/topics/top",
        "cloudStorageConfig": storage,
        "subsink": {"limits": "extended",
                    "paths": {"partitions": [{"name": "region", "attribute": "region"}]}}
    });
    let cfg = work.path().join("many.json");
    std::fs::write(&cfg, sub.take().to_string()).unwrap();
    let bucket = work.path().join("bucket");
    let log_path = work.path().join("log");
    let out_path = work.path().join("out");
    // Reaped by `wait_rusage` (wait4).
    #[allow(clippy::zombie_processes)]
    let child = run_cmd(&cfg, &src, &format!("file://{}", bucket.display()))
        .args(["--memory-limit", &format!("{MANY_LIMIT_MIB}MiB")])
        .env("SUBSINK_LOG", "info")
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let (code, _) = sized::wait_rusage(child.id());
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(code, 0, "{log}");
    let out = std::fs::read_to_string(&out_path).unwrap();
    let s: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(s["messages_written"], MANY_MESSAGES as u64, "{s}");
    let early = log
        .lines()
        .filter(|l| l.contains("file written") && l.contains("reason=\"memory\""))
        .count();
    assert!(early > 0, "no file finalized for memory");
    // Every message once, in its own path's objects.
    let objects = files_below(&bucket);
    assert!(objects.len() > MANY_PATHS, "{} objects", objects.len());
    let mut seen = vec![0u32; MANY_MESSAGES];
    for name in &objects {
        let dir = name
            .strip_prefix("many/region=r")
            .and_then(|n| n.split_once('/'))
            .unwrap_or_else(|| panic!("{name}"))
            .0;
        let text = std::fs::read_to_string(bucket.join(name)).unwrap();
        for line in text.lines() {
            let i: usize = line[..8].parse().unwrap();
            assert_eq!(dir, format!("{:03}", i % MANY_PATHS), "{name}");
            assert_eq!(line.len(), MANY_BYTES);
            seen[i] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == 1), "duplicates or losses");
    // The documented bound (docs/operating.md): the limit, the process at rest and its dynamic
    // part, and about 128 KiB per open file.
    // The worker's own peak, from its summary (`wait4`'s starts at this test process's peak,
    // which the other tests of this binary raise).
    let peak_mib = s["peak_rss_bytes"].as_f64().expect("peak_rss_bytes") / (1 << 20) as f64;
    let bound =
        sized::fixed_bound(MANY_LIMIT_MIB, sized::Writer::Storage) + MANY_PATHS as f64 * 0.125;
    eprintln!(
        "{MANY_PATHS} paths, {} objects ({early} finalized for memory): peak RSS {peak_mib:.1} MiB, bound {bound:.1} MiB",
        objects.len()
    );
    assert!(
        peak_mib < bound,
        "peak RSS {peak_mib:.1} MiB over {bound:.1} MiB"
    );
}

#[test]
fn example_config_runs_and_what_cannot_hold_paths_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    let s = summary(&run_ok(&mut run_cmd(
        &root().join("examples/storage-partitioned.json"),
        &root().join("fixtures/input/messages.ndjson"),
        &format!("file://{}", bucket.display()),
    )));
    let msgs = messages_of(&root().join("fixtures/input/messages.ndjson"));
    assert_eq!(s["messages_written"], msgs.len() as u64);
    // Every message has its own path's file: the fixture's regions, the rest NULL.
    let mut want: BTreeMap<String, usize> = BTreeMap::new();
    for m in &msgs {
        let t = DateTime::<Utc>::from_timestamp_micros(m.publish_time_micros).unwrap();
        let region = match m.attributes.get("region") {
            None | Some("") => "__HIVE_DEFAULT_PARTITION__".to_string(),
            Some(r) => r
                .replace('%', "%25")
                .replace('/', "%2F")
                .replace(':', "%3A"),
        };
        let dir = format!(
            "events/{}/region={region}/",
            t.format("dt=%Y-%m-%d/hour=%H")
        );
        *want.entry(dir).or_default() += 1;
    }
    let mut got: BTreeMap<String, usize> = BTreeMap::new();
    for f in files_below(&bucket) {
        let (dir, file) = f.rsplit_once('/').unwrap();
        assert!(file.starts_with("part-") && file.ends_with(".avro"), "{f}");
        let n = records_of(&fastavro_dump(&[bucket.join(&f)])).len();
        *got.entry(format!("{dir}/")).or_default() += n;
    }
    assert_eq!(got, want);

    // inspect --subscription checks the name with its directories; the same subscription without
    // subsink.paths does not take it (exit 1).
    let example = root().join("examples/storage-partitioned.json");
    let mut flat: Value =
        serde_json::from_str(&std::fs::read_to_string(&example).unwrap()).unwrap();
    flat.as_object_mut().unwrap().remove("subsink");
    let flat_cfg = work.path().join("flat.json");
    std::fs::write(&flat_cfg, flat.to_string()).unwrap();
    for f in files_below(&bucket) {
        let object = bucket.join(&f);
        let out = run_ok(
            subsink()
                .arg("inspect")
                .arg(&object)
                .args(["--summary", "--subscription"])
                .arg(&example),
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["name_check"]["ok"], true, "{f}: {v}");
        let out = subsink()
            .arg("inspect")
            .arg(&object)
            .args(["--summary", "--subscription"])
            .arg(&flat_cfg)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{f}");
    }

    // --exactly-once from a positioned source (Kafka) names files after a partition's offsets,
    // file after file: refused at start (exit 2), before any broker is asked.
    let out = subsink()
        .args(["run", "--subscription"])
        .arg(&example)
        .args([
            "--source",
            "kafka://127.0.0.1:1",
            "--kafka-topic",
            "t",
            "--exactly-once",
        ])
        .args([
            "--bucket-url",
            &format!("file://{}", work.path().join("eo").display()),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--exactly-once with Kafka: subsink.paths splits a partition's records"),
        "{err}"
    );

    // Partitioned paths are for objects: a BigQuery subscription with them is refused (exit 2),
    // naming the field and why.
    let mut sub: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("examples/storage-partitioned.json")).unwrap(),
    )
    .unwrap();
    sub.as_object_mut().unwrap().remove("cloudStorageConfig");
    sub["bigqueryConfig"] = json!({"table": "p.d.t"});
    let cfg = work.path().join("bq.json");
    std::fs::write(&cfg, sub.to_string()).unwrap();
    let out = subsink()
        .args(["validate", "--subscription"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("subsink.paths") && err.contains("a BigQuery subscription writes rows"),
        "{err}"
    );
}

/// A value too long for a path segment (255 bytes, `name=value` escaped) is a bad message: it is
/// refused by `--on-bad-input` (skipped and counted, or stopping the run), never written under
/// another path.
#[test]
fn a_value_too_long_for_a_path_is_a_bad_message() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let mut msgs = regional(6);
    // `region=` + 249 bytes.
    msgs[3].attributes.insert("region".into(), "x".repeat(249));
    write_lines(&src, &msgs);
    let mut sub = json!({
        "name": "projects/proj/subscriptions/long",
        "topic": "projects/proj/topics/top",
        "cloudStorageConfig": {"bucket": "bkt", "avroConfig": {"writeMetadata": true}},
        "subsink": {"paths": {"partitions": [{"name": "region", "attribute": "region"}]}}
    });
    let cfg = work.path().join("long.json");
    std::fs::write(&cfg, sub.take().to_string()).unwrap();
    let bucket = work.path().join("skip");
    let out = run_ok(
        run_cmd(&cfg, &src, &format!("file://{}", bucket.display()))
            .args(["--on-bad-input", "skip"]),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("in.ndjson:4: the value of partition region is 249 bytes escaped"),
        "{err}"
    );
    let s = summary(&out);
    assert_eq!(s["messages_written"], 5, "{s}");
    let mut want: Vec<String> = msgs
        .iter()
        .filter(|m| m.message_id != "m-3")
        .map(|m| m.message_id.clone())
        .collect();
    want.sort();
    assert_eq!(ids_under_their_region(&bucket), want);
    // Under the default (`fail`) the run stops there, exit 1.
    let out = run_cmd(
        &cfg,
        &src,
        &format!("file://{}", work.path().join("fail").display()),
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the value of partition region"));
}

/// Topic-schema revisions have a file each (docs/contract.md §3.7), and so does each path: the
/// file group holds both, so each (path, revision) has its own object, every record in the right
/// one. The payload's `kind` field is the partition.
#[test]
fn topic_schema_revisions_and_paths_each_get_a_file() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let kinds = ["CLICK", "VIEW"];
    let msgs: Vec<Message> = (0..60usize)
        .map(|i| {
            let payload = json!({"id": i, "name": format!("n{i}"), "tags": [], "amount": null,
                                 "kind": kinds[i % 2], "ok": true});
            Message {
                data: payload.to_string().into_bytes().into(),
                attributes: [
                    ("googclient_schemaencoding", "JSON".to_string()),
                    (
                        "googclient_schemaname",
                        "projects/p/schemas/event".to_string(),
                    ),
                    ("googclient_schemarevisionid", format!("r{}", i % 3)),
                ]
                .into(),
                message_id: format!("m-{i}"),
                publish_time_micros: BASE_MICROS + i as i64,
                ordering_key: String::new(),
            }
        })
        .collect();
    write_lines(&src, &msgs);
    let storage = json!({"bucket": "bkt", "filenamePrefix": "ev/", "filenameSuffix": ".avro",
                         "avroConfig": {"useTopicSchema": true}});
    let mut sub = json!({
        "name": "projects/proj/subscriptions/topic",
        "topic": "projects/proj/topics/top",
        "cloudStorageConfig": storage,
        "subsink": {"paths": {"partitions": [{"name": "kind", "field": "kind"}]}}
    });
    let cfg = work.path().join("topic.json");
    std::fs::write(&cfg, sub.take().to_string()).unwrap();
    let bucket = work.path().join("bucket");
    let s = summary(&run_ok(
        run_cmd(&cfg, &src, &format!("file://{}", bucket.display()))
            .arg("--topic-schema")
            .arg(root().join("fixtures/input/event.avsc")),
    ));
    assert_eq!(s["messages_written"], 60, "{s}");
    let objects = local_objects(&bucket);
    assert_eq!(objects.len(), 6, "{objects:?}");
    let paths: Vec<PathBuf> = objects.iter().map(|(_, p)| p.clone()).collect();
    let mut seen = BTreeSet::new();
    for ((name, _), dump) in objects.iter().zip(fastavro_dump(&paths)) {
        let kind = name
            .strip_prefix("ev/kind=")
            .and_then(|n| n.split_once('/'))
            .unwrap_or_else(|| panic!("{name}"))
            .0;
        let ids: Vec<u64> = dump["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids.len(), 10, "{name}");
        let revision = ids[0] % 3;
        for id in &ids {
            assert_eq!(kinds[*id as usize % 2], kind, "{name}: {id}");
            assert_eq!(id % 3, revision, "{name}: {id}");
            assert!(seen.insert(*id), "{id} twice");
        }
    }
    assert_eq!(seen.len(), 60);
}

/// The event time of message `i` of [`event_messages`]: 2026-12-05T22:30Z plus `i` × 47 minutes
/// (so the days and hours vary; the publish times do not).
fn event_instant(i: usize) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_micros(BASE_MICROS + i as i64 * 47 * 60_000_000).unwrap()
}

/// Messages with an event time in the payload's `ts` (RFC 3339 with several offsets, or epoch
/// milliseconds as a number) and in attribute `sent_at` (RFC 3339, or epoch milliseconds as
/// text), all published at one instant. Messages 7, 13 and 21 have no usable time: `ts` missing,
/// `ts` unparseable, `sent_at` missing.
fn event_messages(n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let t = event_instant(i);
            let ts = match i % 3 {
                0 => json!(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
                1 => json!(t
                    .with_timezone(&chrono::FixedOffset::east_opt(5 * 3600 + 1800).unwrap())
                    .to_rfc3339()),
                _ => json!(t.timestamp_millis()),
            };
            let mut payload = json!({"i": i, "ts": ts});
            let mut attributes: BTreeMap<String, String> =
                [("i".to_string(), i.to_string())].into();
            let sent = if i % 2 == 0 {
                t.with_timezone(&chrono::FixedOffset::west_opt(3 * 3600).unwrap())
                    .to_rfc3339()
            } else {
                t.timestamp_millis().to_string()
            };
            attributes.insert("sent_at".into(), sent);
            match i {
                7 => drop(payload.as_object_mut().unwrap().remove("ts")),
                13 => payload["ts"] = json!("yesterday"),
                21 => drop(attributes.remove("sent_at")),
                _ => {}
            }
            Message {
                data: payload.to_string().into_bytes().into(),
                attributes: attributes.into(),
                message_id: format!("m-{i}"),
                publish_time_micros: BASE_MICROS,
                ordering_key: String::new(),
            }
        })
        .collect()
}

/// Issue 44, point 9: partitions from an event time in a JSON field and in an attribute, as
/// Kafka Connect's time-based partitioner does: each object under its messages' event-time
/// directories (read back with fastavro), a message without a usable time a bad message named by
/// its id, and every broken rule of the configuration named by `validate`.
#[test]
fn event_time_partitions_from_a_field_and_an_attribute() {
    const EN: usize = 60;
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("events.ndjson");
    write_lines(&src, &event_messages(EN));
    let mut sub = json!({
        "name": "projects/proj/subscriptions/events",
        "topic": "projects/proj/topics/top",
        "cloudStorageConfig": {"bucket": "bkt", "filenamePrefix": "events/",
                               "avroConfig": {"writeMetadata": true}},
        "subsink": {"paths": {"partitions": [
            {"name": "dt", "eventTime": {"field": "ts", "format": "YYYY-MM-DD"}},
            {"name": "hour", "eventTime": {"field": "ts", "format": "hh"}},
            {"name": "sent", "eventTime": {"attribute": "sent_at", "format": "hh:mm"}}
        ]}}
    });
    let cfg = work.path().join("events.json");
    std::fs::write(&cfg, sub.to_string()).unwrap();
    let bucket = work.path().join("bucket");
    let out = run_ok(
        run_cmd(&cfg, &src, &format!("file://{}", bucket.display()))
            .args(["--on-bad-input", "skip"]),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let rule = "an event time is RFC 3339 text (2026-12-05T22:30:00Z, any offset) or an integer \
                of epoch milliseconds, in the years 0000 to 9999";
    for bad in [
        "events.ndjson:8: message m-7: partition dt takes its event time from field `ts`, which \
         it does not have (missing, null, an object or an array, or the payload is not a JSON \
         object); "
            .to_string(),
        "events.ndjson:14: message m-13: partition dt takes its event time from field `ts`, \
         which is \"yesterday\"; "
            .to_string(),
        "events.ndjson:22: message m-21: partition sent takes its event time from attribute \
         `sent_at`, which it does not have; "
            .to_string(),
    ] {
        assert!(err.contains(&format!("{bad}{rule}")), "{bad}\n{err}");
    }
    let s = summary(&out);
    assert_eq!(s["messages_written"], EN as u64 - 3, "{s}");
    assert_eq!(s["bad_messages"], 3, "{s}");
    // Each record under its own event time's directories, computed here with chrono.
    let objects = local_objects(&bucket);
    let paths: Vec<PathBuf> = objects.iter().map(|(_, p)| p.clone()).collect();
    let mut seen = Vec::new();
    let mut dirs = BTreeSet::new();
    for ((name, _), dump) in objects.iter().zip(fastavro_dump(&paths)) {
        let (dir, _) = name.rsplit_once('/').unwrap();
        dirs.insert(dir.to_string());
        for r in dump["records"].as_array().unwrap() {
            let i = attr_i(r);
            let t = event_instant(i);
            let want = format!(
                "events/dt={}/hour={}/sent={}",
                t.format("%Y-%m-%d"),
                t.format("%H"),
                t.format("%H%%3A%M")
            );
            assert_eq!(dir, want, "message {i}");
            assert_eq!(r["publish_time"], BASE_MICROS, "{r}");
            seen.push(i);
        }
    }
    seen.sort();
    let want: Vec<usize> = (0..EN).filter(|i| ![7, 13, 21].contains(i)).collect();
    assert_eq!(seen, want);
    // One object per path: 57 messages 47 minutes apart are 57 distinct minutes.
    assert_eq!(dirs.len(), EN - 3);
    assert_eq!(objects.len(), EN - 3);

    // The rules of eventTime, each named by its field (exit 2, nothing written).
    sub["subsink"]["paths"]["partitions"] = json!([
        {"name": "a", "eventTime": {"field": "ts"}},
        {"name": "b", "eventTime": {"format": "YYYY"}},
        {"name": "c", "eventTime": {"field": "ts", "attribute": "t", "format": "YYYY"}},
        {"name": "d", "eventTime": {"attribute": "t", "format": "YYYY/MM"}},
        {"name": "e", "eventTime": {"field": "ts", "format": "hh"}, "publishTime": "hh"},
        {"name": "f", "eventTime": {"field": "a..b", "format": "hh"}}
    ]);
    std::fs::write(&cfg, sub.to_string()).unwrap();
    let out = subsink()
        .args(["validate", "--subscription"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for line in [
        "subsink.paths.partitions[0].eventTime.format: required: how the event time is written, \
         in the publishTime grammar (YYYY-MM-DD)",
        "subsink.paths.partitions[1].eventTime: one of field or attribute is required: where \
         the message's event time is",
        "subsink.paths.partitions[2].eventTime: field and attribute are exclusive",
        "subsink.paths.partitions[3].eventTime.format: ",
        "subsink.paths.partitions[4]: publishTime, attribute, field and eventTime are \
         exclusive; found publishTime and eventTime",
        "subsink.paths.partitions[5].eventTime.field: must be a key of the JSON payload",
    ] {
        assert!(err.contains(line), "{line}\n{err}");
    }
    // An unknown key inside eventTime is refused, not ignored.
    sub["subsink"]["paths"]["partitions"] =
        json!([{"name": "a", "eventTime": {"field": "ts", "format": "hh", "unit": "seconds"}}]);
    std::fs::write(&cfg, sub.to_string()).unwrap();
    let out = subsink()
        .args(["validate", "--subscription"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown field `unit`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
