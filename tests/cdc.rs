//! Change data capture into a Delta table (issue 35), end to end: the real binary applying
//! streams of UPSERTs and DELETEs with `_CHANGE_SEQUENCE_NUMBER`s (out of order, duplicated,
//! multi-section), read back by the `deltalake` Python package (and DuckDB over the Parquet files
//! its log lists), and compared row for row with a reference model written apart from the code
//! (tests/py/cdc_model.py). Sources: a file (one run; kill -9 and resume; two writers at once) and
//! Pub/Sub (Google's emulator). Bad changes and startup refusals as well.

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use util::*;

const SUB: &str = "projects/proj/subscriptions/changes-to-table";
const TOPIC: &str = "projects/proj/topics/changes";

/// The table's columns (the key `id` is NULLABLE, so that a NULL key is the change data capture
/// rule's to refuse, not REQUIRED's).
const FIELDS: &str = r#"[
  {"name": "id", "type": "INTEGER"},
  {"name": "region", "type": "STRING"},
  {"name": "name", "type": "STRING"},
  {"name": "qty", "type": "INT64"},
  {"name": "score", "type": "FLOAT64"},
  {"name": "ok", "type": "BOOL"}
]"#;

/// The columns of the Delta table subsink makes: the schema's and the normalized number.
const TABLE_COLUMNS: [&str; 7] = [
    "id",
    "region",
    "name",
    "qty",
    "score",
    "ok",
    "_CHANGE_SEQUENCE_NUMBER",
];

/// The generated changes of tests/py/cdc_model.py and the rows its model expects.
struct Stream {
    key: Vec<String>,
    changes: Vec<Value>,
    expected: Vec<Value>,
    /// The tombstones the table keeps: the keys whose winner is a numbered DELETE.
    tombstones: u64,
    stats: Value,
}

fn model_script() -> PathBuf {
    root().join("tests/py/cdc_model.py")
}

/// `cdc_model.py generate`.
fn generate(seed: u64, changes: usize, keys: usize, key: &str, numbered: bool) -> Stream {
    generate_with(
        seed,
        changes,
        keys,
        key,
        if numbered { &[] } else { &["--no-sequence"] },
    )
}

/// `cdc_model.py generate` with `extra` arguments (`--no-sequence`, `--mixed`).
fn generate_with(seed: u64, changes: usize, keys: usize, key: &str, extra: &[&str]) -> Stream {
    let mut args = vec![
        model_script().display().to_string(),
        "generate".into(),
        "--seed".into(),
        seed.to_string(),
        "--changes".into(),
        changes.to_string(),
        "--keys".into(),
        keys.to_string(),
        "--key".into(),
        key.into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let v: Value = serde_json::from_str(&venv_python(&args, &[])).unwrap();
    let list = |k: &str| v[k].as_array().unwrap().clone();
    Stream {
        key: v["key"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect(),
        changes: list("changes"),
        expected: list("expected"),
        tombstones: v["tombstones"].as_u64().unwrap(),
        stats: v["stats"].clone(),
    }
}

/// `cdc_model.py model`: the expected rows of `changes` alone.
fn model_of(changes: &[Value], key: &str) -> Vec<Value> {
    let input = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(input.path(), serde_json::to_vec(changes).unwrap()).unwrap();
    let out = Command::new(venv_bin("python"))
        .arg(model_script())
        .args(["model", "--key", key])
        .stdin(std::fs::File::open(input.path()).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The 100k changes over 5k keys of tests 2 and 5 (generated once per test binary).
fn big_stream() -> &'static Stream {
    static S: OnceLock<Stream> = OnceLock::new();
    S.get_or_init(|| {
        let s = generate(35, 100_000, 5_000, "id", true);
        assert_interesting(&s, 100_000);
        s
    })
}

/// The stream has what the test is about: deletes, re-inserts, changes delivered behind a
/// higher number of their key, duplicates, multi-section and 16-digit numbers.
fn assert_interesting(s: &Stream, n: u64) {
    let st = &s.stats;
    let at_least = |k: &str, min: u64| {
        let v = st[k].as_u64().unwrap();
        assert!(v >= min, "generator: {k} = {v} < {min}: {st}");
    };
    at_least("deletes", n / 5);
    at_least("reinserts", n / 10);
    at_least("deletes_of_absent", n / 50);
    at_least("inversions", n / 20);
    at_least("duplicates", n / 40);
    at_least("multi_section", n / 5);
    at_least("sixteen_digit_section", n / 20);
    assert_eq!(st["changes"].as_u64().unwrap(), s.changes.len() as u64);
    assert!(!s.expected.is_empty() && s.expected.len() < s.changes.len());
}

/// Message `i` of a stream: the change as its payload, an id of its own (duplicates included).
fn change_message(prefix: &str, i: usize, change: &Value) -> Message {
    Message {
        data: serde_json::to_vec(change).unwrap().into(),
        attributes: Default::default(),
        message_id: format!("{prefix}{i:07}"),
        publish_time_micros: 1_714_521_600_000_000 + i as i64,
        ordering_key: String::new(),
    }
}

fn messages(prefix: &str, changes: &[Value]) -> Vec<Message> {
    changes
        .iter()
        .enumerate()
        .map(|(i, c)| change_message(prefix, i, c))
        .collect()
}

/// A table resource (as `bq show --format=prettyjson` prints one) with primary key `id`.
fn table_resource(dir: &Path) -> PathBuf {
    resource_with_key(dir, "table.json", &["id"])
}

/// A table resource of [`FIELDS`] with primary key `key`, in `dir/name`.
fn resource_with_key(dir: &Path, name: &str, key: &[&str]) -> PathBuf {
    let p = dir.join(name);
    let fields: Value = serde_json::from_str(FIELDS).unwrap();
    let resource = json!({
        "kind": "bigquery#table",
        "tableReference": {"projectId": "proj", "datasetId": "analytics", "tableId": "changes"},
        "schema": {"fields": fields},
        "tableConstraints": {"primaryKey": {"columns": key}},
    });
    std::fs::write(&p, serde_json::to_string_pretty(&resource).unwrap()).unwrap();
    p
}

/// The plain schema (an array of fields: no key of its own).
fn plain_schema(dir: &Path) -> PathBuf {
    let p = dir.join("fields.json");
    std::fs::write(&p, FIELDS).unwrap();
    p
}

/// A subscription with `bigqueryConfig` `bq` (useTableSchema unless it says otherwise) and
/// `extra` at the top level.
fn subscription(dir: &Path, bq: Value, extra: Value) -> PathBuf {
    let mut cfg = json!({
        "name": SUB,
        "topic": TOPIC,
        "bigqueryConfig": {"table": "proj.analytics.changes", "useTableSchema": true},
    });
    for (k, v) in bq.as_object().unwrap() {
        cfg["bigqueryConfig"][k] = v.clone();
    }
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    let p = dir.join("sub.json");
    std::fs::write(&p, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    p
}

/// A subscription writing at most `max` messages per commit.
fn batched(dir: &Path, max: u64) -> PathBuf {
    subscription(
        dir,
        json!({}),
        json!({"subsink": {"table": {"maxMessages": max.to_string()}}}),
    )
}

/// `subsink run` of the file `src` into the local Delta table `table`, the table's columns (and
/// key) from `schema`.
fn run_cmd(sub: &Path, src: &Path, table: &Path, schema: &Path) -> Command {
    let mut c = subsink();
    c.args(["run", "--subscription"])
        .arg(sub)
        .arg("--source")
        .arg(src)
        .arg("--table-url")
        .arg(format!("file://{}", table.display()))
        .arg("--table-schema")
        .arg(schema);
    c
}

/// Reads the Delta table with `deltalake` (and, separately, DuckDB over the Parquet files of the
/// table's current version); prints its version, columns, their types, and both readers' rows,
/// and whether the tombstone table is there (as a Delta table of its own).
const READER: &str = r#"
import json, os, sys
import deltalake, duckdb
path = sys.argv[1]
dt = deltalake.DeltaTable(path)
t = dt.to_pyarrow_table()
rows = t.to_pylist()
files = dt.file_uris()
duck = []
if files:
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    rel = con.execute("SELECT * FROM read_parquet(?)", [files])
    names = [d[0] for d in rel.description]
    duck = [dict(zip(names, r)) for r in rel.fetchall()]
tomb = os.path.join(path, "_subsink_tombstones")
tombstones = None
if deltalake.DeltaTable.is_deltatable(tomb):
    tombstones = deltalake.DeltaTable(tomb).to_pyarrow_table().num_rows
print(json.dumps({"version": dt.version(), "columns": t.schema.names,
                  "types": [str(f.type) for f in t.schema], "files": len(files),
                  "deltalake": rows, "duckdb": duck, "tombstones": tombstones}, ensure_ascii=False))
sys.stdout.flush()
os._exit(0)
"#;

struct Table {
    version: i64,
    tombstones: Option<u64>,
    /// Rows by their key (the key's values as JSON text).
    rows: BTreeMap<String, Value>,
}

fn key_text(row: &Value, key: &[String]) -> String {
    Value::Array(key.iter().map(|k| row[k].clone()).collect()).to_string()
}

/// Rows by key; a key twice is a failure.
fn by_key(rows: &[Value], key: &[String], what: &str) -> BTreeMap<String, Value> {
    let mut m = BTreeMap::new();
    for r in rows {
        if let Some(old) = m.insert(key_text(r, key), r.clone()) {
            panic!("{what}: key {} twice: {old} and {r}", key_text(r, key));
        }
    }
    m
}

/// The table read back; both readers must agree, its columns must be [`TABLE_COLUMNS`] with the
/// number as a string, and no key may be there twice.
fn read_table(table: &Path, key: &[String]) -> Table {
    let v: Value = python_json(READER, &table.display().to_string(), &[]);
    let cols: Vec<&str> = v["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(cols, TABLE_COLUMNS, "the table's columns");
    assert!(
        matches!(v["types"][6].as_str(), Some("string" | "large_string")),
        "_CHANGE_SEQUENCE_NUMBER is {}",
        v["types"][6]
    );
    let rows = by_key(v["deltalake"].as_array().unwrap(), key, "deltalake");
    let duck = by_key(v["duckdb"].as_array().unwrap(), key, "duckdb");
    assert!(
        rows == duck,
        "deltalake and DuckDB (over the log's Parquet files) disagree: {} and {} rows",
        rows.len(),
        duck.len()
    );
    Table {
        version: v["version"].as_i64().unwrap(),
        tombstones: v["tombstones"].as_u64(),
        rows,
    }
}

/// The table must hold exactly `want` (the model's rows). On a difference: how many rows are
/// missing, extra and different, the first few of each, and the delivered changes of the first
/// key that differs.
fn assert_table(label: &str, got: &Table, want: &[Value], stream: &[Value], key: &[String]) {
    let want = by_key(want, key, "model");
    if got.rows == want {
        return;
    }
    let missing: Vec<&String> = want.keys().filter(|k| !got.rows.contains_key(*k)).collect();
    let extra: Vec<&String> = got.rows.keys().filter(|k| !want.contains_key(*k)).collect();
    let differ: Vec<&String> = want
        .keys()
        .filter(|k| got.rows.get(*k).is_some_and(|g| g != &want[*k]))
        .collect();
    let mut report = format!(
        "{label}: the table differs from the model: {} rows, model {}; {} missing, {} extra, {} different\n",
        got.rows.len(),
        want.len(),
        missing.len(),
        extra.len(),
        differ.len()
    );
    for k in missing.iter().take(3) {
        report += &format!("  missing {k}: model {}\n", want[*k]);
    }
    for k in extra.iter().take(3) {
        report += &format!("  extra {k}: table {}\n", got.rows[*k]);
    }
    for k in differ.iter().take(3) {
        report += &format!(
            "  different {k}:\n    table {}\n    model {}\n",
            got.rows[*k], want[*k]
        );
    }
    if let Some(k) = missing.first().or(extra.first()).or(differ.first()) {
        report += &format!("  changes of key {k}, in delivery order:\n");
        for (i, c) in stream.iter().enumerate() {
            if &key_text(c, key) == *k {
                report += &format!("    #{i}: {c}\n");
            }
        }
    }
    panic!("{report}");
}

/// The run exited 0; its summary.
fn ok_summary(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "subsink failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    summary(out)
}

fn elapsed(label: &str, start: Instant) {
    eprintln!("[cdc] {label}: {:.1} s", start.elapsed().as_secs_f64());
}

// --- 2. one run from a file ----------------------------------------------------------------------

#[test]
fn file_source_100k_changes_over_5k_keys_equal_the_model() {
    let start = Instant::now();
    let s = big_stream();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("changes.ndjson");
    write_lines(&src, &messages("c", &s.changes));
    let sub = batched(dir.path(), 2_000);
    let schema = table_resource(dir.path());
    let table = dir.path().join("t");
    let run = Instant::now();
    let sum = ok_summary(&run_cmd(&sub, &src, &table, &schema).output().unwrap());
    elapsed("100k changes, one run", run);
    assert_eq!(sum["messages_written"], s.changes.len(), "{sum}");
    assert_eq!(sum["messages_failed"], 0, "{sum}");
    let t = read_table(&table, &s.key);
    // Version 0 creates the table; then one MERGE per batch of at most 2,000 changes.
    let batches = s.changes.len().div_ceil(2_000) as i64;
    assert!(
        t.version >= batches,
        "{} versions for {batches} batches",
        t.version
    );
    // Exactly the keys whose winner is a numbered DELETE: no tombstone for a DELETE that lost
    // to a newer row.
    assert!(s.tombstones > 0);
    assert_eq!(
        t.tombstones,
        Some(s.tombstones),
        "the tombstone table's rows"
    );
    assert_table("file source", &t, &s.expected, &s.changes, &s.key);
    elapsed("test 2 (file, 100k/5k)", start);
}

// --- 3. kill -9 and resume -----------------------------------------------------------------------

#[test]
fn kill_9_three_times_then_resume_from_the_checkpoint_equals_the_model() {
    let start = Instant::now();
    let n = env_or("CDC_KILL_CHANGES", 30_000);
    let s = generate(3535, n, n / 20, "id", true);
    assert_interesting(&s, n as u64);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("changes.ndjson");
    write_lines(&src, &messages("k", &s.changes));
    let sub = batched(dir.path(), 1_000);
    let schema = table_resource(dir.path());
    let table = dir.path().join("t");
    let cp = dir.path().join("cp.json");
    let cmd = || {
        let mut c = run_cmd(&sub, &src, &table, &schema);
        c.arg("--checkpoint").arg(&cp);
        c
    };
    // Each kill waits until the run has moved its watermark (committed something of its own),
    // then lands at a random moment up to 40 ms later, with the run still working.
    let size = std::fs::metadata(&src).unwrap().len();
    let mut seed = 0x35C0_FFEE_u64;
    let last = kill_rounds(3, &cp, size, &mut seed, || {
        cmd()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    });
    eprintln!("[cdc] killed 3 times; watermark at byte {last} of {size}");
    let sum = ok_summary(&cmd().output().unwrap());
    let resumed = sum["messages_written"].as_u64().unwrap();
    assert!(
        resumed < s.changes.len() as u64,
        "the last run resumed: it wrote {resumed} of {}",
        s.changes.len()
    );
    let t = read_table(&table, &s.key);
    assert_table(
        "after 3 kills and a resume",
        &t,
        &s.expected,
        &s.changes,
        &s.key,
    );
    // A run after the end has nothing left to do and changes nothing.
    let sum = ok_summary(&cmd().output().unwrap());
    assert_eq!(sum["messages_written"], 0, "{sum}");
    let again = read_table(&table, &s.key);
    assert_table(
        "a run after the end",
        &again,
        &s.expected,
        &s.changes,
        &s.key,
    );
    elapsed(&format!("test 3 (kill -9 ×3 + resume, {n} changes)"), start);
}

// --- 4. two writers at once, split by key --------------------------------------------------------

/// Which of two writers takes key `id`: a hash of it, mod 2.
fn writer_of(id: i64) -> usize {
    let mut h = id as u64 ^ 0x9E37_79B9_7F4A_7C15;
    (xorshift(&mut h) % 2) as usize
}

#[test]
fn two_writers_at_once_with_disjoint_keys_equal_the_model() {
    let start = Instant::now();
    let n = env_or("CDC_TWO_WRITER_CHANGES", 40_000);
    let s = generate(7, n, n / 20, "id", true);
    assert_interesting(&s, n as u64);
    let dir = tempfile::tempdir().unwrap();
    let sub = batched(dir.path(), 1_000);
    let schema = table_resource(dir.path());
    let table = dir.path().join("t");
    let mut parts: [Vec<Value>; 2] = [Vec::new(), Vec::new()];
    for c in &s.changes {
        parts[writer_of(c["id"].as_i64().unwrap())].push(c.clone());
    }
    for p in &parts {
        assert!(
            p.len() > n / 3,
            "a fair split: {} and {}",
            parts[0].len(),
            parts[1].len()
        );
    }
    let inputs: Vec<PathBuf> = parts
        .iter()
        .enumerate()
        .map(|(w, p)| {
            let src = dir.path().join(format!("in{w}.ndjson"));
            write_lines(&src, &messages(&format!("w{w}-"), p));
            src
        })
        .collect();
    let children: Vec<_> = inputs
        .iter()
        .map(|src| {
            spawn_draining(
                run_cmd(&sub, src, &table, &schema)
                    .env("SUBSINK_LOG", "warn,subsink=debug")
                    .stdout(Stdio::piped()),
            )
        })
        .collect();
    let mut retried_total = 0;
    for (w, c) in children.into_iter().enumerate() {
        let out = output(c);
        let sum = ok_summary(&out);
        assert_eq!(sum["messages_written"], parts[w].len(), "writer {w}: {sum}");
        let err = String::from_utf8_lossy(&out.stderr);
        let retried = err.matches("MERGE conflicted with another writer").count();
        eprintln!("[cdc] writer {w}: {retried} MERGEs ran again after a conflict");
        retried_total += retried;
    }
    // Two writers committing 1,000-change MERGEs over one key range at once conflict: the test
    // is about those conflicts being run again, so some must have happened.
    assert!(
        retried_total > 0,
        "no MERGE conflicted and ran again: the two writers did not overlap"
    );
    let t = read_table(&table, &s.key);
    assert_table("two writers", &t, &s.expected, &s.changes, &s.key);
    elapsed(&format!("test 4 (two writers, {n} changes)"), start);
}

// --- 5. from Pub/Sub -----------------------------------------------------------------------------

#[test]
fn pubsub_100k_changes_over_5k_keys_equal_the_model() {
    use subsink::pubsub::SubscriptionSpec;
    let start = Instant::now();
    let s = big_stream();
    let env = util::pubsub::PubsubEnv::start();
    let mut spec = SubscriptionSpec::new(SUB, TOPIC);
    spec.ack_deadline_seconds = 60;
    env.topic_and_sub(spec);
    let publish = Instant::now();
    // Published in slices, so the emulator is not handed 100k messages in one call.
    for (i, chunk) in s.changes.chunks(10_000).enumerate() {
        let msgs: Vec<Message> = chunk
            .iter()
            .enumerate()
            .map(|(j, c)| {
                let mut m = change_message("", i * 10_000 + j, c);
                m.message_id.clear(); // the server assigns them
                m
            })
            .collect();
        let ids = env.publish(TOPIC, &msgs);
        assert_eq!(ids.len(), chunk.len());
    }
    elapsed("published 100k changes", publish);

    let dir = tempfile::tempdir().unwrap();
    let sub = subscription(
        dir.path(),
        json!({}),
        json!({"ackDeadlineSeconds": 60,
               "subsink": {"table": {"maxMessages": "2000", "maxDuration": "2s"}}}),
    );
    let schema = table_resource(dir.path());
    let table = dir.path().join("t");
    let port = free_port();
    let child = spawn_draining(
        subsink()
            .env("PUBSUB_EMULATOR_HOST", env.emu.host())
            .args(["run", "--source", "pubsub", "--metrics-addr"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--subscription")
            .arg(&sub)
            .arg("--table-url")
            .arg(format!("file://{}", table.display()))
            .arg("--table-schema")
            .arg(&schema)
            .stdout(Stdio::piped()),
    );
    // Until every change is acked (after its commit) and the table equals the model, within the
    // limit. The acks are counted on /metrics (read with a bare HTTP/1.0 GET: cheap enough to
    // poll every second); the table is read once they are all in, and then every 5 s.
    let limit = Duration::from_secs(env_or("CDC_PUBSUB_LIMIT_S", 300) as u64);
    let want = by_key(&s.expected, &s.key, "model");
    let run = Instant::now();
    let mut last_read: Option<Instant> = None;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let acked = acked_total(port);
        let due = last_read.is_none_or(|t| t.elapsed() >= Duration::from_secs(5));
        if acked >= s.changes.len() as u64 && due {
            last_read = Some(Instant::now());
            let t = read_table(&table, &s.key);
            if t.rows == want {
                break;
            }
            if run.elapsed() > limit {
                assert_table("Pub/Sub (timed out)", &t, &s.expected, &s.changes, &s.key);
            }
        }
        assert!(
            run.elapsed() <= limit,
            "{acked} of {} changes acked after {limit:?}",
            s.changes.len()
        );
    }
    elapsed("Pub/Sub: table equal to the model", run);
    let (out, err) = sigterm_ok(child);
    let sum = summary(&out);
    assert!(
        sum["messages_written"].as_u64().unwrap() >= s.changes.len() as u64,
        "{sum}\n{err}"
    );
    assert_eq!(sum["messages_failed"], 0, "{sum}");
    // Still equal after the worker stopped (nothing half-applied at the end), and everything was
    // acked: nothing is delivered again.
    let t = read_table(&table, &s.key);
    assert_table(
        "Pub/Sub, after SIGTERM",
        &t,
        &s.expected,
        &s.changes,
        &s.key,
    );
    let left = env.drain(SUB, Duration::from_secs(5));
    assert!(left.is_empty(), "{} messages delivered again", left.len());
    elapsed("test 5 (Pub/Sub, 100k/5k)", start);
}

/// `subsink_messages_acked_total` on the worker's /metrics (0 while it does not answer yet).
fn acked_total(port: u16) -> u64 {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    if c.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return 0;
    }
    let mut page = String::new();
    let _ = c.read_to_string(&mut page);
    page.lines()
        .filter(|l| l.starts_with("subsink_messages_acked_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

// --- 6. no sequence numbers: arrival order -------------------------------------------------------

#[test]
fn without_sequence_numbers_the_last_arrival_wins_composite_key() {
    let start = Instant::now();
    let n = 20_000;
    let s = generate(66, n, 1_000, "region,id", false);
    assert!(
        s.stats["deletes"].as_u64().unwrap() > n as u64 / 5,
        "{}",
        s.stats
    );
    assert!(
        s.stats["reinserts"].as_u64().unwrap() > n as u64 / 10,
        "{}",
        s.stats
    );
    assert!(s
        .changes
        .iter()
        .all(|c| c.get("_CHANGE_SEQUENCE_NUMBER").is_none_or(Value::is_null)));
    assert!(s
        .expected
        .iter()
        .all(|r| r["_CHANGE_SEQUENCE_NUMBER"].is_null()));
    // Keyed on `id` alone the model is different: the composite key matters.
    let by_id = model_of(&s.changes, "id");
    assert_ne!(by_id.len(), s.expected.len());
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("changes.ndjson");
    write_lines(&src, &messages("n", &s.changes));
    let sub = batched(dir.path(), 1_000);
    let schema = plain_schema(dir.path());
    let table = dir.path().join("t");
    let sum = ok_summary(
        &run_cmd(&sub, &src, &table, &schema)
            .args(["--table-primary-key", "region,id"])
            .output()
            .unwrap(),
    );
    assert_eq!(sum["messages_written"], s.changes.len(), "{sum}");
    let t = read_table(&table, &s.key);
    assert!(
        t.version >= (s.changes.len() / 1_000) as i64,
        "{} versions",
        t.version
    );
    assert_table("no sequence numbers", &t, &s.expected, &s.changes, &s.key);
    elapsed("test 6 (no numbers, 20k/1k, key region,id)", start);
}

// --- 7. startup refusals, bad changes ------------------------------------------------------------

/// `cmd` exits 2 before making the table, its stderr containing every one of `needles`.
fn refused(label: &str, cmd: &mut Command, table: &Path, needles: &[&str]) {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{label}: {err}");
    for n in needles {
        assert!(err.contains(n), "{label}: {n:?} not in: {err}");
    }
    assert!(!table.exists(), "{label}: a table was made");
}

#[test]
fn startup_refusals_exit_2_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("one.ndjson");
    write_lines(
        &src,
        &messages("r", &[json!({"id": 1, "_CHANGE_TYPE": "UPSERT"})]),
    );
    let resource = table_resource(dir.path());
    let plain = plain_schema(dir.path());
    let table = dir.path().join("t");
    let table_url = format!("file://{}", table.display());

    // No schema mode: rows are the payload in `data`, with no key.
    let no_schema = subscription(dir.path(), json!({"useTableSchema": false}), json!({}));
    refused(
        "key in no-schema mode",
        &mut run_cmd(&no_schema, &src, &table, &resource),
        &table,
        &["primary key id", "useTableSchema or useTopicSchema"],
    );
    let sub = subscription(dir.path(), json!({}), json!({}));
    // A key column the table does not have, from the flag and from the resource.
    refused(
        "--table-primary-key nope",
        run_cmd(&sub, &src, &table, &plain).args(["--table-primary-key", "id,nope"]),
        &table,
        &[
            "primary key column `nope` is not a column of the table",
            "id, region, name",
        ],
    );
    let bad_resource = resource_with_key(dir.path(), "bad-key.json", &["ident"]);
    refused(
        "resource key ident",
        &mut run_cmd(&sub, &src, &table, &bad_resource),
        &table,
        &["`ident` is not a column of the table", "bad-key.json"],
    );
    // BigQuery applies changes from its default stream only: no --exactly-once with a key (the
    // schema file given, so no BigQuery is contacted).
    let out = subsink()
        .args(["run", "--subscription"])
        .arg(&sub)
        .arg("--source")
        .arg(&src)
        .args([
            "--table-url",
            "bigquery://proj/analytics/changes",
            "--exactly-once",
        ])
        .arg("--table-schema")
        .arg(&plain)
        .args(["--table-primary-key", "id"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--exactly-once")
            && err.contains("primary key id")
            && err.contains("default stream"),
        "{err}"
    );
    // A key needs the table's columns: no --table-primary-key without --table-schema.
    let out = subsink()
        .args(["run", "--subscription"])
        .arg(&sub)
        .arg("--source")
        .arg(&src)
        .args(["--table-url", &table_url, "--table-primary-key", "id"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--table-primary-key id") && err.contains("--table-schema"),
        "{err}"
    );
    assert!(!table.exists());
    // With a key, the pseudo-columns cannot be columns of the table.
    let reserved = dir.path().join("reserved.json");
    std::fs::write(
        &reserved,
        r#"[{"name": "id", "type": "INT64"}, {"name": "_change_sequence_number", "type": "STRING"}]"#,
    )
    .unwrap();
    refused(
        "a column named like the pseudo-column",
        run_cmd(&sub, &src, &table, &reserved).args(["--table-primary-key", "id"]),
        &table,
        &["pseudo-column"],
    );
    // Without a key, a table with the same columns appends, and `_CHANGE_TYPE` is an unknown
    // field (no change data capture).
    let out = run_cmd(&sub, &src, &table, &plain).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sum = summary(&out);
    assert!(
        sum["failed_messages"][0]["error"]
            .as_str()
            .unwrap()
            .contains("_CHANGE_TYPE"),
        "{sum}"
    );
}

/// Bad changes, each breaking one rule, and the field its error must name. Each targets a key
/// of the stream with a number above every other, so that applying it would show.
fn bad_changes(keys: &[i64]) -> Vec<(Value, &'static str)> {
    let top = "FFFFFFFFFFFFFFFF/FFFF";
    let k = |i: usize| keys[i % keys.len()];
    let upsert = |i: usize| {
        json!({"id": k(i), "region": "xx", "name": "bad", "qty": 0, "ok": true,
               "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": top})
    };
    let with = |i: usize, field: &str, v: Value| {
        let mut c = upsert(i);
        c[field] = v;
        c
    };
    let ct = "_CHANGE_TYPE";
    let sn = "_CHANGE_SEQUENCE_NUMBER";
    let mut id_absent = upsert(11);
    id_absent.as_object_mut().unwrap().remove("id");
    // `_CHANGE_TYPE` is required (it used to be taken for UPSERT).
    let mut ct_absent = upsert(14);
    ct_absent.as_object_mut().unwrap().remove(ct);
    vec![
        (with(0, ct, json!("upsert")), ct),
        (with(1, ct, json!("delete")), ct),
        (with(2, ct, json!("INSERT")), ct),
        (with(3, ct, json!("")), ct),
        (with(4, ct, json!("DELETE ")), ct),
        (with(5, sn, json!("G1")), sn),
        (with(6, sn, json!("1/2/3/4/5")), sn),
        (with(7, sn, json!("11111111111111111")), sn),
        (with(8, sn, json!("")), sn),
        (with(9, sn, json!("1//2")), sn),
        (with(10, sn, json!("-1")), sn),
        (with(12, sn, json!("0x1F")), sn),
        (with(13, "id", Value::Null), "id"),
        (id_absent, "id"),
        (ct_absent, ct),
        (with(15, ct, Value::Null), ct),
    ]
}

#[test]
fn bad_changes_fail_alone_and_go_to_the_dead_letter_file() {
    let start = Instant::now();
    let good = generate(77, 3_000, 300, "id", true);
    let keys: Vec<i64> = good
        .expected
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    let bad = bad_changes(&keys);
    // The bad ones among the good, at fixed places; ids `bad-NN`.
    let mut msgs = messages("g", &good.changes);
    let mut bad_ids = BTreeMap::new();
    for (j, (c, field)) in bad.iter().enumerate() {
        let mut m = change_message("bad-", j, c);
        m.message_id = format!("bad-{j:02}");
        bad_ids.insert(m.message_id.clone(), (*field, m.data.clone()));
        msgs.insert(100 + j * 200, m);
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("changes.ndjson");
    write_lines(&src, &msgs);
    let sub = subscription(
        dir.path(),
        json!({}),
        json!({"subsink": {"table": {"maxMessages": "500"}},
               "deadLetterPolicy": {"deadLetterTopic": "projects/proj/topics/dead", "maxDeliveryAttempts": 5}}),
    );
    let schema = table_resource(dir.path());
    let table = dir.path().join("t");

    // Without a dead-letter file: the good changes are applied, the bad ones fail alone (exit 1),
    // each named with its id and field.
    let out = run_cmd(&sub, &src, &table, &schema).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let sum = summary(&out);
    assert_eq!(sum["messages_written"], good.changes.len(), "{sum}");
    assert_eq!(sum["messages_failed"], bad.len(), "{sum}");
    let failed = sum["failed_messages"].as_array().unwrap();
    let failed_ids: BTreeSet<String> = failed
        .iter()
        .map(|f| f["message_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(failed_ids, bad_ids.keys().cloned().collect::<BTreeSet<_>>());
    for f in failed {
        let id = f["message_id"].as_str().unwrap();
        let e = f["error"].as_str().unwrap();
        let field = bad_ids[id].0;
        assert!(
            e.contains(&format!("message \"{id}\": field `{field}`: ")),
            "{id}: {e}"
        );
        assert!(
            err.contains(&format!("message \"{id}\"")),
            "{id} not named in stderr: {err}"
        );
    }
    let t = read_table(&table, &good.key);
    assert_table(
        "bad changes not applied",
        &t,
        &good.expected,
        &good.changes,
        &good.key,
    );

    // With a dead-letter file (a second delivery of everything): exit 0, the file holds exactly
    // the bad changes, as they came; the table still equals the model of the good ones.
    let dl = dir.path().join("dead.ndjson");
    let out = run_cmd(&sub, &src, &table, &schema)
        .arg("--dead-letter")
        .arg(&dl)
        .output()
        .unwrap();
    let sum = ok_summary(&out);
    assert_eq!(sum["messages_dead_lettered"], bad.len(), "{sum}");
    let dead: Vec<Value> = std::fs::read_to_string(&dl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let dead_ids: Vec<String> = dead
        .iter()
        .map(|d| d["messageId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        dead_ids.iter().cloned().collect::<BTreeSet<_>>(),
        bad_ids.keys().cloned().collect::<BTreeSet<_>>(),
        "the dead letters"
    );
    assert_eq!(dead_ids.len(), bad.len(), "each once: {dead_ids:?}");
    use base64::Engine as _;
    for d in &dead {
        let id = d["messageId"].as_str().unwrap();
        let data = base64::engine::general_purpose::STANDARD
            .decode(d["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(data, bad_ids[id].1.to_vec(), "{id}: the payload as it came");
        let e = d["attributes"]["CloudPubSubDeadLetterSourceDeliveryErrorMessage"]
            .as_str()
            .unwrap();
        let field = bad_ids[id].0;
        assert!(
            e.contains(&format!("message \"{id}\": field `{field}`: ")),
            "{id}: {e}"
        );
    }
    let t = read_table(&table, &good.key);
    assert_table(
        "after the dead-letter run",
        &t,
        &good.expected,
        &good.changes,
        &good.key,
    );
    elapsed("test 7 (bad changes)", start);
}

/// useTopicSchema: the topic schema's `_CHANGE_TYPE` / `_CHANGE_SEQUENCE_NUMBER` fields are the
/// pseudo-columns (JSON-encoded messages; a late update ignored, a delete of an absent key).
#[test]
fn topic_schema_fields_are_the_pseudo_columns() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let avsc = d.join("topic.avsc");
    std::fs::write(
        &avsc,
        r#"{"type":"record","name":"Customer","fields":[{"name":"id","type":"long"},
            {"name":"name","type":["null","string"],"default":null},
            {"name":"_CHANGE_TYPE","type":"string"},
            {"name":"_CHANGE_SEQUENCE_NUMBER","type":["null","string"],"default":null}]}"#,
    )
    .unwrap();
    let datums = [
        json!({"id": 1, "name": {"string": "a"}, "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": {"string": "2"}}),
        json!({"id": 1, "name": {"string": "late"}, "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": {"string": "1"}}),
        json!({"id": 2, "name": {"string": "b"}, "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": null}),
        json!({"id": 3, "name": null, "_CHANGE_TYPE": "DELETE", "_CHANGE_SEQUENCE_NUMBER": {"string": "9"}}),
    ];
    let msgs: Vec<Message> = datums
        .iter()
        .enumerate()
        .map(|(i, v)| Message {
            data: v.to_string().into_bytes().into(),
            attributes: [("googclient_schemaencoding".to_string(), "JSON".to_string())].into(),
            message_id: format!("t{i}"),
            ..Default::default()
        })
        .collect();
    let src = d.join("in.ndjson");
    write_lines(&src, &msgs);
    let schema = d.join("schema.json");
    std::fs::write(
        &schema,
        r#"[{"name":"id","type":"INT64","mode":"REQUIRED"},{"name":"name","type":"STRING"}]"#,
    )
    .unwrap();
    let sub = subscription(
        d,
        json!({"useTableSchema": false, "useTopicSchema": true}),
        json!({}),
    );
    let table = d.join("t");
    let out = run_ok(
        run_cmd(&sub, &src, &table, &schema)
            .args(["--table-primary-key", "id", "--topic-schema"])
            .arg(&avsc),
    );
    assert_eq!(summary(&out)["messages_written"], 4);
    let rows = python_json(
        "import json, os, sys, deltalake\n\
         rows = deltalake.DeltaTable(sys.argv[1]).to_pyarrow_table().to_pylist()\n\
         print(json.dumps(sorted(rows, key=lambda r: r['id'])))\n\
         sys.stdout.flush()\n\
         os._exit(0)",
        &table.display().to_string(),
        &[],
    );
    let n2 = format!("{:0>16}/{z}/{z}/{z}", "2", z = "0".repeat(16));
    assert_eq!(
        rows,
        json!([
            {"id": 1, "name": "a", "_CHANGE_SEQUENCE_NUMBER": n2},
            {"id": 2, "name": "b", "_CHANGE_SEQUENCE_NUMBER": null},
        ])
    );
}

// --- 8. one rule for any cut (issue 43) ----------------------------------------------------------

/// `changes` applied by one run at most `max` per commit into a new table under `dir/name`; the
/// table read back.
fn run_cut(
    dir: &Path,
    name: &str,
    changes: &[Value],
    key: &[String],
    max: u64,
) -> (Table, PathBuf) {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let src = d.join("changes.ndjson");
    write_lines(&src, &messages("m", changes));
    let sub = batched(&d, max);
    let schema = table_resource(&d);
    let table = d.join("t");
    let sum = ok_summary(&run_cmd(&sub, &src, &table, &schema).output().unwrap());
    assert_eq!(sum["messages_written"], changes.len(), "{name}: {sum}");
    (read_table(&table, key), table)
}

/// The cases the rule decides, one key each, end to end at 1 and 1,000 changes per commit: the
/// model's table both times, and the decisions spelled out.
#[test]
fn decided_cases_give_one_table_for_any_cut() {
    let c = |id: i64, ct: &str, seq: Option<&str>, name: &str| {
        let mut v = json!({"id": id, "region": "eu", "name": name, "_CHANGE_TYPE": ct});
        if let Some(s) = seq {
            v["_CHANGE_SEQUENCE_NUMBER"] = json!(s);
        }
        v
    };
    let changes = vec![
        // The issue's case: a DELETE at 5, an unnumbered UPSERT (number 0), an UPSERT at 3.
        c(1, "DELETE", Some("5"), "d"),
        c(1, "UPSERT", None, "a"),
        c(1, "UPSERT", Some("3"), "b"),
        // Equal numbers, spelled differently: the later arrival wins.
        c(2, "UPSERT", Some("FF"), "x"),
        c(2, "UPSERT", Some("ff/0"), "y"),
        c(3, "UPSERT", Some("FF/0"), "x"),
        c(3, "UPSERT", Some("0FF"), "y"),
        // A DELETE older than the row loses and leaves no tombstone.
        c(4, "UPSERT", Some("7"), "kept"),
        c(4, "DELETE", Some("3"), "d"),
        // A DELETE of an absent key leaves one.
        c(5, "DELETE", Some("9"), "d"),
        // No numbers: arrival order; an unnumbered change equals number 0.
        c(6, "UPSERT", None, "u1"),
        c(6, "UPSERT", None, "u2"),
        c(7, "UPSERT", Some("0"), "z0"),
        c(7, "UPSERT", None, "z1"),
        c(8, "UPSERT", Some("2"), "n"),
        c(8, "UPSERT", None, "late-unnumbered"),
        // A DELETE numbered 0 needs no tombstone.
        c(9, "UPSERT", None, "gone"),
        c(9, "DELETE", None, "d"),
    ];
    let key = vec!["id".to_string()];
    let want = model_of(&changes, "id");
    let names: BTreeMap<i64, Option<String>> = want
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["name"].as_str().map(String::from),
            )
        })
        .collect();
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        names,
        BTreeMap::from([
            (2, s("y")),
            (3, s("y")),
            (4, s("kept")),
            (6, s("u2")),
            (7, s("z1")),
            (8, s("n")),
        ]),
        "the model's decisions"
    );
    let dir = tempfile::tempdir().unwrap();
    for max in [1, 1_000] {
        let (t, _) = run_cut(dir.path(), &format!("max{max}"), &changes, &key, max);
        assert_table(&format!("{max} per commit"), &t, &want, &changes, &key);
        // Keys 1 and 5: their winner is a numbered DELETE.
        assert_eq!(t.tombstones, Some(2), "{max} per commit: tombstones");
    }
}

/// A generated stream mixing numbered and unnumbered changes, equal numbers with other content,
/// `FF` against `FF/0`, late and duplicated changes: 1, 7 (twice) and 1,000 changes per commit
/// give the model's table, and as many tombstones as the model's keys whose winner is a
/// numbered DELETE.
#[test]
fn a_mixed_stream_gives_one_table_at_1_7_and_1000_per_commit() {
    let start = Instant::now();
    let s = generate_with(4343, 250, 25, "id", &["--mixed"]);
    let st = &s.stats;
    for (k, min) in [
        ("unnumbered", 20),
        ("equal_numbers", 8),
        ("deletes_of_absent", 5),
        ("inversions", 20),
        ("duplicates", 5),
        ("multi_section", 20),
    ] {
        assert!(st[k].as_u64().unwrap() >= min, "generator: {k}: {st}");
    }
    assert!(s.tombstones > 0, "{st}");
    let dir = tempfile::tempdir().unwrap();
    for (max, run) in [(1, 0), (7, 0), (7, 1), (1_000, 0)] {
        let label = format!("{max} per commit, run {run}");
        let (t, _) = run_cut(
            dir.path(),
            &format!("m{max}-{run}"),
            &s.changes,
            &s.key,
            max,
        );
        assert_table(&label, &t, &s.expected, &s.changes, &s.key);
        assert_eq!(t.tombstones, Some(s.tombstones), "{label}: tombstones");
        elapsed(&label, start);
    }
}

/// Unnumbered changes decided by arrival across batches, 4 changes per commit: 8 keys, each an
/// UPSERT, a later UPSERT and (even keys) a DELETE, interleaved 8 ways. A batch's MERGE must land
/// after the batch before it. Before each MERGE waited for the one before, the commits of closed
/// batches ran side by side and landed in any order: 4 of 14 such runs kept an earlier UPSERT or
/// a deleted key, 6 of 14 in a second try.
#[test]
fn unnumbered_changes_land_in_arrival_order_across_batches() {
    const KEYS: usize = 8;
    let key = vec!["id".to_string()];
    let dir = tempfile::tempdir().unwrap();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for run in 0..8 {
        let mut per_key: Vec<std::collections::VecDeque<Value>> = (0..KEYS as i64)
            .map(|k| {
                let change = |name: String, ct: &str| {
                    json!({"id": k, "region": "eu", "name": name, "_CHANGE_TYPE": ct})
                };
                let mut v = vec![
                    change(format!("a{k}"), "UPSERT"),
                    change(format!("b{k}"), "UPSERT"),
                ];
                if k % 2 == 0 {
                    v.push(change("d".into(), "DELETE"));
                }
                v.into()
            })
            .collect();
        // Interleaved (xorshift), each key's changes in their order.
        let mut changes = Vec::new();
        while per_key.iter().any(|q| !q.is_empty()) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if let Some(c) = per_key[(seed % KEYS as u64) as usize].pop_front() {
                changes.push(c);
            }
        }
        let want = model_of(&changes, "id");
        assert_eq!(want.len(), KEYS / 2, "the model keeps the odd keys");
        assert!(want
            .iter()
            .all(|r| r["name"].as_str().unwrap().starts_with('b')));
        let (t, _) = run_cut(dir.path(), &format!("run{run}"), &changes, &key, 4);
        assert_table(
            &format!("4 per commit, run {run}"),
            &t,
            &want,
            &changes,
            &key,
        );
    }
}

// --- 9. tombstones: retention window, compaction (issue 43) -------------------------------------

#[test]
fn tombstones_expire_after_the_retention_window() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sub = batched(d, 100);
    let schema = table_resource(d);
    let table = d.join("t");
    let key = vec!["id".to_string()];
    let run = |name: &str, changes: &[Value]| {
        let src = d.join(format!("{name}.ndjson"));
        write_lines(&src, &messages(name, changes));
        let out = run_cmd(&sub, &src, &table, &schema)
            .args(["--table-delete-retention", "3s"])
            .output()
            .unwrap();
        ok_summary(&out);
        read_table(&table, &key)
    };
    let up = |id: i64, seq: &str, name: &str| json!({"id": id, "name": name, "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": seq});
    let del = |id: i64, seq: &str| json!({"id": id, "_CHANGE_TYPE": "DELETE", "_CHANGE_SEQUENCE_NUMBER": seq});
    let t = run("a", &[up(1, "1", "one"), del(1, "5"), del(2, "5")]);
    assert!(t.rows.is_empty());
    assert_eq!(t.tombstones, Some(2));
    // Inside the window: an older change stays out.
    let t = run("b", &[up(1, "3", "late")]);
    assert!(t.rows.is_empty(), "{:?}", t.rows);
    assert_eq!(t.tombstones, Some(2));
    std::thread::sleep(Duration::from_secs(4));
    // After it: applied, as BigQuery applies it after its window; and the expired tombstones
    // are gone (2's by expiry, 1's by its UPSERT).
    let t = run("c", &[up(1, "3", "after the window")]);
    assert_eq!(
        t.rows
            .values()
            .map(|r| r["name"].clone())
            .collect::<Vec<_>>(),
        [json!("after the window")]
    );
    assert_eq!(t.tombstones, Some(0), "tombstones after the window");
    // A window below 1s is refused at startup.
    let src = d.join("a.ndjson");
    let out = run_cmd(&sub, &src, &table, &schema)
        .args(["--table-delete-retention", "0s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--table-delete-retention") && err.contains("at least 1s"),
        "{err}"
    );
}

#[test]
fn the_compact_command_compacts_the_tombstone_table_too() {
    // Ten commits of 20 numbered DELETEs of absent keys, each batch a key range of its own: each
    // adds a tombstone file (the MERGE leaves the other ranges' files alone).
    let changes: Vec<Value> = (0..200)
        .map(|i| json!({"id": i / 20 * 1_000 + i % 20, "_CHANGE_TYPE": "DELETE", "_CHANGE_SEQUENCE_NUMBER": "9"}))
        .collect();
    let key = vec!["id".to_string()];
    let dir = tempfile::tempdir().unwrap();
    let (before, table) = run_cut(dir.path(), "c", &changes, &key, 20);
    assert_eq!(before.tombstones, Some(200));
    let tomb_files = || {
        python_json(
            "import json, os, sys, deltalake\n\
             dt = deltalake.DeltaTable(os.path.join(sys.argv[1], '_subsink_tombstones'))\n\
             print(json.dumps(len(dt.file_uris())))\n\
             sys.stdout.flush()\n\
             os._exit(0)",
            &table.display().to_string(),
            &[],
        )
    };
    assert_eq!(tomb_files(), json!(10), "a tombstone file per commit");
    let out = run_ok(
        subsink()
            .args(["compact", "--table-url"])
            .arg(format!("file://{}", table.display())),
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &report["tombstones"];
    assert_eq!(
        (t["files_removed"].as_u64(), t["files_added"].as_u64()),
        (Some(10), Some(1)),
        "{report}"
    );
    assert_eq!(tomb_files(), json!(1));
    let after = read_table(&table, &key);
    assert_eq!(after.tombstones, Some(200));
    // The packed tombstones still keep older changes out, and let newer ones in.
    let mut more = changes.clone();
    more.push(
        json!({"id": 3, "name": "older", "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": "8"}),
    );
    more.push(json!({"id": 1_004, "name": "newer", "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": "A"}));
    let d = dir.path().join("c");
    let src = d.join("more.ndjson");
    write_lines(&src, &messages("more", &more[200..]));
    ok_summary(
        &run_cmd(&batched(&d, 20), &src, &table, &table_resource(&d))
            .output()
            .unwrap(),
    );
    let t = read_table(&table, &key);
    assert_table("after compaction", &t, &model_of(&more, "id"), &more, &key);
    assert_eq!(t.tombstones, Some(199));
}

// --- 11. the summary and the log name the files the commits added ---------------------------------

/// Every `add` path the table's log ever held (an unpartitioned table's: file names, nothing
/// to decode).
fn logged_adds(table: &Path) -> BTreeSet<String> {
    let mut adds = BTreeSet::new();
    for e in std::fs::read_dir(table.join("_delta_log")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            for line in std::fs::read_to_string(&p).unwrap().lines() {
                let v: Value = serde_json::from_str(line).unwrap();
                if let Some(path) = v["add"]["path"].as_str() {
                    adds.insert(path.to_string());
                }
            }
        }
    }
    adds
}

/// A MERGE rewrites the files holding the keys it changes and writes files of its own: what a
/// run names (the summary's `objects`, each `file written` line's `name`) is what its commits
/// added — every name a file the table's log lists and the folder holds; a batch that deletes
/// the last row adds no file and names none (issue 44, point 8).
#[test]
fn a_cdc_run_names_the_files_its_merges_added() {
    let dir = tempfile::tempdir().unwrap();
    // Numbered in arrival order: the table ends empty whatever order the MERGEs land in.
    let change = |(n, (id, kind)): (usize, &(i64, &str))| {
        json!({"id": id, "region": "eu", "name": format!("n{id}"), "_CHANGE_TYPE": kind,
               "_CHANGE_SEQUENCE_NUMBER": format!("{:X}", n + 1)})
    };
    let changes: Vec<Value> = [
        (1, "UPSERT"),
        (2, "UPSERT"),
        (3, "UPSERT"),
        (4, "UPSERT"),
        // Rewrites the file of 1..4: 1 updated, 2 deleted, 5 and 6 inserted.
        (1, "UPSERT"),
        (2, "DELETE"),
        (5, "UPSERT"),
        (6, "UPSERT"),
        (3, "DELETE"),
        (4, "DELETE"),
        (5, "DELETE"),
        (6, "DELETE"),
        // Deletes only the last row: no file added.
        (1, "DELETE"),
    ]
    .iter()
    .enumerate()
    .map(change)
    .collect();
    let src = dir.path().join("changes.ndjson");
    write_lines(&src, &messages("f", &changes));
    let sub = batched(dir.path(), 4);
    let schema = table_resource(dir.path());
    let table = dir.path().join("t");
    let out = run_cmd(&sub, &src, &table, &schema)
        .env("SUBSINK_LOG", "info")
        .output()
        .unwrap();
    let sum = ok_summary(&out);
    assert_eq!(sum["messages_written"], changes.len(), "{sum}");
    let t = read_table(&table, &["id".to_string()]);
    assert!(t.rows.is_empty(), "every key deleted: {:?}", t.rows);
    let adds = logged_adds(&table);
    let named = summary_objects(&sum);
    for name in &named {
        assert!(
            adds.contains(name),
            "{name} is not in the table's log: {adds:?}"
        );
        assert!(
            table.join(name).is_file(),
            "{name} is not in the table's folder"
        );
    }
    // In arrival order three MERGEs add a file each and the last one none (the MERGEs of a
    // run may land in another order: at most three).
    assert!((1..=3).contains(&named.len()), "{sum}");
    let err = String::from_utf8_lossy(&out.stderr);
    let logged: Vec<String> = err
        .lines()
        .filter(|l| l.contains("file written"))
        .map(|l| {
            let name = l.split(" name=").nth(1).unwrap().split(' ').next().unwrap();
            name.trim_matches('"').to_string()
        })
        .collect();
    assert_eq!(logged.len(), 4, "one line per commit: {err}");
    let logged_names: Vec<String> = logged
        .iter()
        .flat_map(|l| l.split(',').filter(|n| !n.is_empty()).map(String::from))
        .collect();
    // The log in the order the commits landed, the summary in the order the batches opened.
    let sorted = |v: &[String]| v.iter().cloned().collect::<BTreeSet<String>>();
    assert_eq!(
        sorted(&logged_names),
        sorted(&named),
        "the log names what the summary names"
    );
    assert_eq!(logged_names.len(), named.len());
}
