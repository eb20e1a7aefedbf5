//! Schema changes while the writer runs (issue 36, point 3; docs/destinations.md, "Schema changes
//! while running"): the real binary writes a Delta table that the `deltalake` Python package
//! alters under it.
//!
//! 1. A NULLABLE column added while a paced stream is written (stdin) is written from the next
//!    batch on: rows before the change hold NULL, rows after the documented bound
//!    (`--table-schema-refresh` + maxDuration) hold the message field of its name; every id once.
//! 2. A column retyped, then a column dropped, while Pub/Sub messages come in (the emulator):
//!    `/readyz` fails with SCHEMA_MISMATCH naming the column, no version is committed and no
//!    message acked while the table is broken; the table restored (deltalake's RESTORE),
//!    everything arrives exactly once and is acked, nothing is delivered again.

mod util;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use util::*;

/// The table's columns as subsink is told them (`--table-schema`).
const SCHEMA: &str = r#"[
  {"name": "id", "type": "INTEGER", "mode": "REQUIRED"},
  {"name": "name", "type": "STRING"}
]"#;

/// Creates the table with the Python package, as subsink would write it (`argv[1]`).
const CREATE: &str = r#"
import os, sys, pyarrow as pa
from deltalake import write_deltalake
schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
write_deltalake(sys.argv[1], schema.empty_table())
sys.stdout.flush()
os._exit(0)  # deltalake's runtime can abort at interpreter exit
"#;

/// `argv[2]` on the table `argv[1]`: `add` (a NULLABLE string column `extra`), `retype` (`name`
/// becomes a long), `drop` (`name` removed) — both an overwrite with schema_mode="overwrite" —,
/// `restore:V` (deltalake's RESTORE to version V). Prints the table's version after it.
const ALTER: &str = r#"
import os, sys, pyarrow as pa
from deltalake import DeltaTable, Field, write_deltalake
path, what = sys.argv[1], sys.argv[2]
if what == "add":
    DeltaTable(path).alter.add_columns([Field("extra", "string", nullable=True)])
elif what == "retype":
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.int64())])
    write_deltalake(path, schema.empty_table(), mode="overwrite", schema_mode="overwrite")
elif what == "drop":
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    write_deltalake(path, schema.empty_table(), mode="overwrite", schema_mode="overwrite")
elif what.startswith("restore:"):
    DeltaTable(path).restore(int(what.split(":")[1]))
print(DeltaTable(path).version())
sys.stdout.flush()
os._exit(0)
"#;

/// The table's version, columns and rows (sorted by id).
const READ: &str = r#"
import os, sys, json
from deltalake import DeltaTable
dt = DeltaTable(sys.argv[1])
t = dt.to_pyarrow_table()
rows = sorted(t.to_pylist(), key=lambda r: r["id"])
print(json.dumps({"version": dt.version(), "columns": t.schema.names, "rows": rows}))
sys.stdout.flush()
os._exit(0)
"#;

fn alter(table: &Path, what: &str) -> i64 {
    venv_python(["-c", ALTER, &table.display().to_string(), what], &[])
        .trim()
        .parse()
        .unwrap()
}

fn read(table: &Path) -> Value {
    python_json(READ, &table.display().to_string(), &[])
}

fn create(dir: &Path) -> std::path::PathBuf {
    let table = dir.join("t");
    venv_python(["-c", CREATE, &table.display().to_string()], &[]);
    table
}

fn subscription(dir: &Path, name: &str, topic: &str) -> std::path::PathBuf {
    let cfg = json!({
        "name": name,
        "topic": topic,
        "ackDeadlineSeconds": 60,
        // Messages carry `extra` before the table has it: dropped until then.
        "bigqueryConfig": {"table": "proj.d.t", "useTableSchema": true, "dropUnknownFields": true},
        "subsink": {"table": {"maxDuration": "1s"}},
    });
    let p = dir.join("sub.json");
    std::fs::write(&p, cfg.to_string()).unwrap();
    p
}

fn payload(i: u64) -> Value {
    json!({"id": i, "name": format!("n{i}"), "extra": format!("x{i}")})
}

/// `GET path` on the worker's telemetry endpoint (bare HTTP/1.0): status and body.
fn get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    if c.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .is_err()
    {
        return (0, String::new());
    }
    let mut page = String::new();
    let _ = c.read_to_string(&mut page);
    let status = page
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = page
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

/// The sum of a counter's samples on `/metrics`.
fn counter(port: u16, name: &str) -> u64 {
    get(port, "/metrics")
        .1
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Every id of `rows` once, and exactly `0..n`.
fn assert_each_once(rows: &[Value], n: u64) {
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for r in rows {
        *seen.entry(r["id"].as_u64().unwrap()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(twice.is_empty(), "ids written more than once: {twice:?}");
    let missing: Vec<u64> = (0..n).filter(|i| !seen.contains_key(i)).collect();
    assert!(missing.is_empty(), "ids not written: {missing:?}");
    assert_eq!(rows.len() as u64, n);
    for r in rows {
        let i = r["id"].as_u64().unwrap();
        assert_eq!(r["name"], json!(format!("n{i}")), "{r}");
    }
}

// --- 1. a column added while running ---------------------------------------------------------

#[test]
fn a_column_added_while_running_is_written_within_refresh_plus_max_duration() {
    let start = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let table = create(dir.path());
    let sub = subscription(
        dir.path(),
        "projects/proj/subscriptions/added-column",
        "projects/proj/topics/added-column",
    );
    let schema = dir.path().join("schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    let refresh = Duration::from_secs(1);
    let max_duration = Duration::from_secs(1);
    let mut child = spawn_draining(
        subsink()
            .env("SUBSINK_LOG", "subsink=info")
            .args(["run", "--subscription"])
            .arg(&sub)
            .args(["--table-url", &format!("file://{}", table.display())])
            .arg("--table-schema")
            .arg(&schema)
            .args(["--table-schema-refresh", "1s"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    let mut stdin = child.stdin.take().unwrap();
    // A paced stream: 25 messages a second; the column is added after 3 s, with the stream
    // paused during the call, so every message sent before it was read before the table had
    // the column.
    let every = Duration::from_millis(40);
    let mut sent_at: Vec<Instant> = Vec::new();
    // Owns stdin: dropping it ends the input.
    let mut send = move |i: u64, sent_at: &mut Vec<Instant>| {
        let m = Message {
            data: payload(i).to_string().into_bytes().into(),
            message_id: format!("m{i}"),
            publish_time_micros: 1_796_428_800_000_000 + i as i64,
            ..Default::default()
        };
        writeln!(stdin, "{}", m.to_json_line()).unwrap();
        stdin.flush().unwrap();
        sent_at.push(Instant::now());
        std::thread::sleep(every);
    };
    let (before, total) = (75u64, 300u64);
    for i in 0..before {
        send(i, &mut sent_at);
    }
    let version_before = read(&table)["version"].as_i64().unwrap();
    assert!(version_before >= 1, "subsink committed before the change");
    let added_version = alter(&table, "add");
    let added_at = Instant::now();
    for i in before..total {
        send(i, &mut sent_at);
    }
    drop(send);
    let out = output(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let t = read(&table);
    assert_eq!(t["columns"], json!(["id", "name", "extra"]));
    let rows = t["rows"].as_array().unwrap();
    assert_each_once(rows, total);
    // Before the change: NULL. After it: NULL or the field, and the field for every message
    // sent later than the bound.
    // The documented bound, plus what it leaves out: reading the log, a commit, the pipe.
    let bound = refresh + max_duration;
    let slack = Duration::from_millis(500);
    let mut first_written: Option<u64> = None;
    for r in rows {
        let i = r["id"].as_u64().unwrap();
        let extra = &r["extra"];
        if i < before {
            assert_eq!(extra, &Value::Null, "row {i}, sent before the change");
            continue;
        }
        assert!(
            extra.is_null() || extra == &json!(format!("x{i}")),
            "row {i}: {extra}"
        );
        if !extra.is_null() {
            first_written = Some(first_written.map_or(i, |f| f.min(i)));
        }
        let after = sent_at[i as usize].duration_since(added_at);
        if after > bound + slack {
            assert_eq!(
                extra,
                &json!(format!("x{i}")),
                "row {i}, sent {after:?} after the column was added (bound {bound:?})"
            );
        }
    }
    let first = first_written.expect("the new column was written");
    // Every row from the first one with the column on has it (a later batch never goes back).
    for r in rows.iter().filter(|r| r["id"].as_u64().unwrap() >= first) {
        assert_eq!(r["extra"], json!(format!("x{}", r["id"])), "{r}");
    }
    let latency = sent_at[first as usize].saturating_duration_since(added_at);
    let nulls_after = (before..first).count();
    eprintln!(
        "column added at version {added_version}: first row with it sent {latency:?} after the change ({nulls_after} rows after the change without it; bound {bound:?}); {} versions; {:?}",
        t["version"],
        start.elapsed()
    );
    assert!(
        err.contains("new NULLABLE columns in the table"),
        "no log line for the new column: {err}"
    );
}

// --- 2. a column retyped, then dropped, while running: SCHEMA_MISMATCH until restored ------------------------

#[test]
fn a_retyped_or_dropped_column_is_schema_mismatch_nothing_committed_or_acked_until_restored() {
    use subsink::pubsub::SubscriptionSpec;
    let start = Instant::now();
    const SUB: &str = "projects/proj/subscriptions/schema-change";
    const TOPIC: &str = "projects/proj/topics/schema-change";
    let env = util::pubsub::PubsubEnv::start();
    let mut spec = SubscriptionSpec::new(SUB, TOPIC);
    spec.ack_deadline_seconds = 60;
    env.topic_and_sub(spec);
    let dir = tempfile::tempdir().unwrap();
    let table = create(dir.path());
    let sub = subscription(dir.path(), SUB, TOPIC);
    let schema = dir.path().join("schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    let port = free_port();
    let child = spawn_draining(
        subsink()
            .env("PUBSUB_EMULATOR_HOST", env.emu.host())
            .args(["run", "--source", "pubsub", "--metrics-addr"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--subscription")
            .arg(&sub)
            .args(["--table-url", &format!("file://{}", table.display())])
            .arg("--table-schema")
            .arg(&schema)
            .args(["--table-schema-refresh", "1s"])
            .stdout(Stdio::piped()),
    );
    let publish = |from: u64, to: u64| {
        let msgs: Vec<Message> = (from..to)
            .map(|i| Message {
                data: payload(i).to_string().into_bytes().into(),
                ..Default::default()
            })
            .collect();
        assert_eq!(env.publish(TOPIC, &msgs).len() as u64, to - from);
    };
    let acked = || counter(port, "subsink_messages_acked_total");
    let wait = |what: &str, limit: Duration, mut ok: Box<dyn FnMut() -> bool + '_>| {
        let t = Instant::now();
        while !ok() {
            assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
        t.elapsed()
    };
    // Phase 1: the table fits.
    publish(0, 100);
    wait(
        "100 acked",
        Duration::from_secs(60),
        Box::new(|| acked() == 100),
    );
    wait(
        "ready",
        Duration::from_secs(10),
        Box::new(|| get(port, "/readyz").0 == 200),
    );
    let good = read(&table)["version"].as_i64().unwrap();

    // Two changes, each while 100 more messages come, each undone with deltalake's RESTORE.
    let changes = [
        (
            "retype",
            "column `name` is long in the table, subsink writes string (retyped)",
        ),
        ("drop", "column `name` is not in the table any more"),
    ];
    let (mut good, mut n) = (good, 100u64);
    for (what, says) in changes {
        let broken = alter(&table, what);
        assert_eq!(broken, good + 1);
        publish(n, n + 100);
        let noticed = wait(
            "/readyz says SCHEMA_MISMATCH",
            Duration::from_secs(30),
            Box::new(|| {
                let (status, body) = get(port, "/readyz");
                status == 503 && body.contains("SCHEMA_MISMATCH")
            }),
        );
        let (_, body) = get(port, "/readyz");
        assert!(body.contains(says), "{what}: {body}");
        assert!(
            body.contains(&format!(
                "SCHEMA_MISMATCH: Delta table file://{}",
                table.display()
            )),
            "{body}"
        );
        // Several refresh intervals and batch durations: still nothing committed, nothing acked;
        // the worker has received the messages (they are held, not dropped).
        std::thread::sleep(Duration::from_secs(5));
        let t = read(&table);
        assert_eq!(
            t["version"],
            json!(broken),
            "{what}: a version committed while broken"
        );
        assert_eq!(t["rows"], json!([]));
        assert_eq!(
            acked(),
            n,
            "{what}: messages acked while the table was broken"
        );
        let received = counter(port, "subsink_messages_received_total");
        assert!(received >= n + 100, "received {received}");
        assert_eq!(get(port, "/readyz").0, 503);

        // Restored to the version before the change: everything lands once, is acked.
        let restored = alter(&table, &format!("restore:{good}"));
        let recovered = wait(
            "every message acked after the restore",
            Duration::from_secs(60),
            Box::new(|| acked() == n + 100),
        );
        wait(
            "ready again",
            Duration::from_secs(10),
            Box::new(|| get(port, "/readyz").0 == 200),
        );
        let t = read(&table);
        assert_each_once(t["rows"].as_array().unwrap(), n + 100);
        assert!(t["version"].as_i64().unwrap() > restored);
        eprintln!(
            "{what}: SCHEMA_MISMATCH on /readyz {noticed:?} after the publish; after the restore (version {restored}) all {} acked within {recovered:?}; table at version {}",
            n + 100,
            t["version"],
        );
        good = t["version"].as_i64().unwrap();
        n += 100;
    }
    let (_, err) = sigterm_ok(child);
    let warns = err.matches("SCHEMA_MISMATCH: Delta table").count();
    assert_eq!(warns, 2, "one warning per change: {err}");
    let again = env.drain(SUB, Duration::from_secs(3));
    assert!(again.is_empty(), "{} messages delivered again", again.len());
    eprintln!("{:?}", start.elapsed());
}
