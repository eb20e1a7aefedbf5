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
//! 3. The same for a BigQuery table (the emulator, `tables.get` read by subsink every refresh):
//!    a column added is written from the next batch; a column dropped holds every append and
//!    ack with `/readyz` saying why, 30 s with an ack deadline of 10 s (the leases are extended:
//!    nothing delivered again); the column back, everything lands once and is acked.
//! 4. The same for change data capture into a Delta table (one MERGE per batch): a column added
//!    is upserted from the next batch on; a column retyped holds every MERGE, `/readyz` says
//!    why; restored, the held changes apply.
//! 5. A column added to a table on SeaweedFS (S3) and on Azurite is written from the next batch:
//!    the log is read through the store.

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

/// What the worker logs when its table has new NULLABLE columns (its next batch writes them).
const ADDED: &str = "new NULLABLE columns in the table";

/// Creates the table with the Python package, as subsink would write it (`argv[1]`).
const CREATE: &str = r#"
import os, sys, pyarrow as pa
from deltalake import write_deltalake
schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
write_deltalake(sys.argv[1], schema.empty_table())
sys.stdout.flush()
os._exit(0)  # deltalake's runtime can abort at interpreter exit
"#;

/// `argv[2]` on the table `argv[1]`: `add` (a NULLABLE string column `extra`; `add:NAME`: named
/// NAME), `retype` (`name`
/// becomes a long), `drop` (`name` removed) — both an overwrite with schema_mode="overwrite" —,
/// `restore:V` (deltalake's RESTORE to version V). Prints the table's version after it.
const ALTER: &str = r#"
import os, sys, pyarrow as pa
from deltalake import DeltaTable, Field, write_deltalake
path, what = sys.argv[1], sys.argv[2]
if what == "add":
    DeltaTable(path).alter.add_columns([Field("extra", "string", nullable=True)])
elif what.startswith("add:"):
    DeltaTable(path).alter.add_columns([Field(what[4:], "string", nullable=True)])
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

/// Publish the payloads `from..to` to `topic` on the emulator.
fn publish_payloads(env: &util::pubsub::PubsubEnv, topic: &str, from: u64, to: u64) {
    let msgs: Vec<Message> = (from..to)
        .map(|i| Message {
            data: payload(i).to_string().into_bytes().into(),
            ..Default::default()
        })
        .collect();
    assert_eq!(env.publish(topic, &msgs).len() as u64, to - from);
}

/// Wait until `ok`, polling every 200 ms, failing after `limit`; how long it took.
fn wait_until(what: &str, limit: Duration, mut ok: Box<dyn FnMut() -> bool + '_>) -> Duration {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    t.elapsed()
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
    assert!(err.contains(ADDED), "no log line for the new column: {err}");
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
    let publish = |from: u64, to: u64| publish_payloads(&env, TOPIC, from, to);
    let acked = || counter(port, "subsink_messages_acked_total");
    // Phase 1: the table fits.
    publish(0, 100);
    wait_until(
        "100 acked",
        Duration::from_secs(60),
        Box::new(|| acked() == 100),
    );
    wait_until(
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
        let noticed = wait_until(
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
        let recovered = wait_until(
            "every message acked after the restore",
            Duration::from_secs(60),
            Box::new(|| acked() == n + 100),
        );
        wait_until(
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

// --- 3. the same for a BigQuery table ---------------------------------------------------------

/// A BigQuery table (the emulator) changed under a running worker fed by Pub/Sub: a NULLABLE
/// column added (`ALTER TABLE … ADD COLUMN` and `tables.patch`: the emulator needs both) is
/// written for every message published once the worker has logged it; a column dropped holds
/// every append and every ack, `/readyz` says SCHEMA_MISMATCH naming the column, for 30 s —
/// three times the ack deadline of 10 s: the worker extends the leases, nothing is delivered
/// again — and once the column is back every held message lands once and is acked, none
/// delivered again.
#[test]
fn a_bigquery_table_changed_while_running_adds_columns_and_holds_on_a_mismatch() {
    use subsink::pubsub::SubscriptionSpec;
    use util::bigquery::{shared_bq, BQ_PROJECT};
    let _serial = util::bigquery::serial();
    // How long the mismatch holds the messages: three times their ack deadline (10 s).
    const HOLD: Duration = Duration::from_secs(30);
    let start = Instant::now();
    const SUB: &str = "projects/proj/subscriptions/bq-schema-change";
    const TOPIC: &str = "projects/proj/topics/bq-schema-change";
    let bq = shared_bq();
    let (ds, tbl) = ("schema_change", "t");
    let id = json!({"name": "id", "type": "INTEGER", "mode": "REQUIRED"});
    let name = json!({"name": "name", "type": "STRING"});
    let extra = json!({"name": "extra", "type": "STRING"});
    bq.table(ds, tbl, json!([id, name]));
    let env = util::pubsub::PubsubEnv::start();
    let mut spec = SubscriptionSpec::new(SUB, TOPIC);
    spec.ack_deadline_seconds = 10;
    env.topic_and_sub(spec);
    let dir = tempfile::tempdir().unwrap();
    let cfg = json!({
        "name": SUB,
        "topic": TOPIC,
        "ackDeadlineSeconds": 10,
        "bigqueryConfig": {
            "table": format!("{BQ_PROJECT}.{ds}.{tbl}"),
            "useTableSchema": true,
            "dropUnknownFields": true,
        },
        "subsink": {"table": {"maxDuration": "1s"}},
    });
    let sub = dir.path().join("sub.json");
    std::fs::write(&sub, cfg.to_string()).unwrap();
    let port = free_port();
    let mut child = spawn_draining(
        subsink()
            .env("PUBSUB_EMULATOR_HOST", env.emu.host())
            .env("SUBSINK_LOG", "subsink=info")
            .args(["run", "--source", "pubsub", "--metrics-addr"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--subscription")
            .arg(&sub)
            .args(["--table-url", &bq.url(ds, tbl)])
            .args(bq.flags())
            // The leases are 10 s too (StreamingPull's own deadline; 60 s by default).
            .args(["--table-schema-refresh", "1s", "--ack-lease", "10s"])
            .stdout(Stdio::piped()),
    );
    let publish = |from: u64, to: u64| publish_payloads(&env, TOPIC, from, to);
    let acked = || counter(port, "subsink_messages_acked_total");
    let received = || counter(port, "subsink_messages_received_total");
    let rows = || bq.rows(ds, tbl, "id");
    // 1. The table as at startup: `extra` is not a column (dropped as unknown).
    publish(0, 50);
    wait_until(
        "50 acked",
        Duration::from_secs(60),
        Box::new(|| acked() == 50),
    );
    assert_eq!(rows().len(), 50);

    // 2. `extra` added: written for every message published once the worker has seen it.
    let alter = format!("ALTER TABLE `{BQ_PROJECT}.{ds}.{tbl}`");
    bq.change_columns(
        ds,
        tbl,
        &format!("{alter} ADD COLUMN extra STRING"),
        json!([id, name, extra]),
    );
    // Seen by the worker (within the refresh); nothing is in flight, so the next batch takes
    // the column up.
    let seen = wait_for_stderr(&mut child, ADDED, Duration::from_secs(30));
    publish(50, 100);
    wait_until(
        "100 acked",
        Duration::from_secs(60),
        Box::new(|| acked() == 100),
    );
    let got = rows();
    assert_eq!(got.len(), 100);
    for r in &got {
        let i: u64 = r["id"].as_str().unwrap().parse().unwrap();
        assert_eq!(r["name"], json!(format!("n{i}")), "{r}");
        let want = if i < 50 {
            Value::Null
        } else {
            json!(format!("x{i}"))
        };
        assert_eq!(r["extra"], want, "row {i}");
    }

    // 3. `name` dropped: SCHEMA_MISMATCH, nothing appended or acked.
    bq.change_columns(
        ds,
        tbl,
        &format!("{alter} DROP COLUMN name"),
        json!([id, extra]),
    );
    publish(100, 150);
    let noticed = wait_until(
        "/readyz says SCHEMA_MISMATCH",
        Duration::from_secs(30),
        Box::new(|| {
            let (status, body) = get(port, "/readyz");
            status == 503 && body.contains("SCHEMA_MISMATCH")
        }),
    );
    let (_, body) = get(port, "/readyz");
    assert!(
        body.contains(&format!(
            "SCHEMA_MISMATCH: BigQuery table {BQ_PROJECT}.{ds}.{tbl}: column `name` is not in the table any more"
        )),
        "{body}"
    );
    // Held three times the ack deadline: the worker extends the leases of what it holds, so
    // nothing is delivered again (a redelivery would count as received once more); nothing is
    // appended or acked meanwhile.
    wait_until(
        "150 received",
        Duration::from_secs(30),
        Box::new(|| received() >= 150),
    );
    let held = Instant::now();
    while held.elapsed() < HOLD {
        assert_eq!(acked(), 100, "messages acked while the table was broken");
        assert_eq!(
            received(),
            150,
            "held {:?} with a 10 s ack deadline: messages delivered again (leases not extended)",
            held.elapsed()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        rows().len(),
        100,
        "rows appended while the table was broken"
    );
    assert_eq!(get(port, "/readyz").0, 503);

    // 4. `name` back (after `extra`, as ADD COLUMN puts it; the rows before hold NULL there):
    // every held message lands once and is acked.
    bq.change_columns(
        ds,
        tbl,
        &format!("{alter} ADD COLUMN name STRING"),
        json!([id, extra, name]),
    );
    let recovered = wait_until(
        "every message acked after the fix",
        Duration::from_secs(60),
        Box::new(|| acked() == 150),
    );
    wait_until(
        "ready again",
        Duration::from_secs(10),
        Box::new(|| get(port, "/readyz").0 == 200),
    );
    let got = rows();
    let ids: Vec<u64> = got
        .iter()
        .map(|r| r["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, (0..150).collect::<Vec<_>>(), "every id once");
    assert_eq!(received(), 150, "messages delivered again");
    for r in got.iter().skip(100) {
        let i = r["id"].as_str().unwrap();
        assert_eq!(r["name"], json!(format!("n{i}")), "{r}");
        assert_eq!(r["extra"], json!(format!("x{i}")), "{r}");
    }
    let (_, err) = sigterm_ok(child);
    assert!(err.contains(ADDED), "no log line for the new column: {err}");
    assert_eq!(
        err.matches("SCHEMA_MISMATCH: BigQuery table").count(),
        1,
        "one warning for the change: {err}"
    );
    let again = env.drain(SUB, Duration::from_secs(3));
    assert!(again.is_empty(), "{} messages delivered again", again.len());
    eprintln!(
        "BigQuery: the added column seen {seen:?} after the change; SCHEMA_MISMATCH on /readyz {noticed:?} after the publish; held {HOLD:?}; all acked {recovered:?} after the fix; {:?}",
        start.elapsed()
    );
}

// --- 4. change data capture into a Delta table -------------------------------------------------

/// A keyed Delta table (change data capture: one MERGE per batch) changed under a running worker
/// fed on stdin: `extra` added is upserted for every change sent once the worker has logged the
/// new column (rows changed before keep NULL there); `name` retyped holds every MERGE (no version,
/// `/readyz` 503 naming the column) until the table is restored, then the held UPSERTs and
/// DELETEs apply.
#[test]
fn a_keyed_delta_table_changed_while_running_adds_columns_and_holds_merges_on_a_mismatch() {
    let start = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let sub = subscription(
        dir.path(),
        "projects/proj/subscriptions/cdc-schema-change",
        "projects/proj/topics/cdc-schema-change",
    );
    let schema = dir.path().join("schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    let port = free_port();
    let mut child = spawn_draining(
        subsink()
            .env("SUBSINK_LOG", "subsink=info")
            .args(["run", "--subscription"])
            .arg(&sub)
            .args(["--table-url", &format!("file://{}", table.display())])
            .arg("--table-schema")
            .arg(&schema)
            .args(["--table-primary-key", "id", "--table-schema-refresh", "1s"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    let mut stdin = child.stdin.take().unwrap();
    let mut n = 0u64;
    // Owns stdin: dropping it ends the input.
    let mut send = move |change: Value| {
        n += 1;
        let m = Message {
            data: change.to_string().into_bytes().into(),
            message_id: format!("m{n}"),
            publish_time_micros: 1_796_428_800_000_000 + n as i64,
            ..Default::default()
        };
        writeln!(stdin, "{}", m.to_json_line()).unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(10));
    };
    let upsert = |i: u64, tag: &str| json!({"id": i, "name": format!("{tag}{i}"), "extra": format!("e{tag}{i}"), "_CHANGE_TYPE": "UPSERT"});
    let rows_of = |t: &Value| -> BTreeMap<u64, Value> {
        t["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["id"].as_u64().unwrap(), r.clone()))
            .collect()
    };
    let wait_rows = |what: &str, ok: &dyn Fn(&BTreeMap<u64, Value>) -> bool| {
        let t = Instant::now();
        loop {
            if table.join("_delta_log").exists() {
                let got = read(&table);
                if ok(&rows_of(&got)) {
                    return got;
                }
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{what}: not within 60 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // A. ids 0..40 upserted while the table has no `extra`.
    for i in 0..40 {
        send(upsert(i, "a"));
    }
    wait_rows("40 rows", &|r| r.len() == 40);
    // B. `extra` added; once the worker has seen it (nothing is in flight: its next batch
    // takes the column up), ids 20..60 upserted with it.
    alter(&table, "add");
    let seen = wait_for_stderr(&mut child, ADDED, Duration::from_secs(30));
    for i in 20..60 {
        send(upsert(i, "b"));
    }
    let t = wait_rows("ids 20..60 upserted", &|r| {
        r.len() == 60 && r[&59]["name"] == json!("b59")
    });
    let good = t["version"].as_i64().unwrap();
    for (i, r) in rows_of(&t) {
        let (name, extra) = if i < 20 {
            (json!(format!("a{i}")), Value::Null)
        } else {
            (json!(format!("b{i}")), json!(format!("eb{i}")))
        };
        assert_eq!((&r["name"], &r["extra"]), (&name, &extra), "row {i}: {r}");
    }
    // C. `name` retyped: the next MERGEs wait.
    let broken = alter(&table, "retype");
    for i in 0..10 {
        send(json!({"id": i, "_CHANGE_TYPE": "DELETE"}));
    }
    for i in 60..70 {
        send(upsert(i, "c"));
    }
    let t0 = Instant::now();
    loop {
        let (status, body) = get(port, "/readyz");
        if status == 503 && body.contains("SCHEMA_MISMATCH") {
            assert!(
                body.contains("column `name` is long in the table, subsink writes string"),
                "{body}"
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no SCHEMA_MISMATCH: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        read(&table)["version"],
        json!(broken),
        "a MERGE while broken"
    );
    // D. Restored: the held changes apply.
    alter(&table, &format!("restore:{good}"));
    let t = wait_rows("the held changes applied", &|r| {
        r.len() == 60 && !r.contains_key(&0) && r.contains_key(&69)
    });
    drop(send);
    let out = output(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let rows = rows_of(&t);
    assert_eq!(
        rows.keys().copied().collect::<Vec<_>>(),
        (10..70).collect::<Vec<_>>()
    );
    for (i, r) in rows {
        let tag = match i {
            0..=19 => "a",
            20..=59 => "b",
            _ => "c",
        };
        assert_eq!(r["name"], json!(format!("{tag}{i}")), "{r}");
        let extra = if tag == "a" {
            Value::Null
        } else {
            json!(format!("e{tag}{i}"))
        };
        assert_eq!(r["extra"], extra, "{r}");
    }
    assert!(err.contains(ADDED), "{err}");
    assert_eq!(
        err.matches("SCHEMA_MISMATCH: Delta table").count(),
        1,
        "{err}"
    );
    eprintln!(
        "change data capture: the added column seen {seen:?} after the change; {:?}",
        start.elapsed()
    );
}

// --- 5. on S3 and Azure ---------------------------------------------------------------------

/// `argv[1]`'s table (on a store: options as JSON in `STORE_OPTIONS`): `add` a NULLABLE string
/// column `extra`, or `read` its columns and rows.
const ON_STORE: &str = r#"
import json, os, sys
from deltalake import DeltaTable, Field
opts = json.loads(os.environ.get("STORE_OPTIONS", "{}"))
dt = DeltaTable(sys.argv[1], storage_options=opts)
if sys.argv[2] == "add":
    dt.alter.add_columns([Field("extra", "string", nullable=True)])
    print(json.dumps({"version": DeltaTable(sys.argv[1], storage_options=opts).version()}))
else:
    t = dt.to_pyarrow_table()
    print(json.dumps({"version": dt.version(), "columns": t.schema.names,
                      "rows": sorted(t.to_pylist(), key=lambda r: r["id"])}))
sys.stdout.flush()
os._exit(0)
"#;

/// A column added to a table subsink writes on SeaweedFS (S3) and on Azurite, with the
/// `deltalake` package against the same store, is written for every message sent once the
/// worker has logged the new column: the schema watch reads the log through the store's own
/// client.
#[test]
fn a_column_added_on_s3_and_azure_is_written_from_the_next_batch() {
    use util::servers::{Azurite, AZURITE_ACCOUNT, AZURITE_KEY};
    let dir = tempfile::tempdir().unwrap();
    let sub = subscription(
        dir.path(),
        "projects/proj/subscriptions/stores",
        "projects/proj/topics/stores",
    );
    let schema = dir.path().join("schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    let s3 = S3Server::start();
    s3.create_bucket("lake");
    let az = Azurite::start();
    az.create_container("lake");
    let az_python = json!({
        "azure_storage_account_name": AZURITE_ACCOUNT,
        "azure_storage_account_key": AZURITE_KEY,
        "azure_storage_use_emulator": "true",
        "azure_allow_http": "true",
    });
    let stores = [
        ("s3://lake/t", s3.env(), json!({})),
        ("az://lake/t", az.env(), az_python),
    ];
    for (url, env, python) in stores {
        let mut py_env = env.clone();
        py_env.push(("STORE_OPTIONS", python.to_string()));
        // `None` while the table is not there yet.
        let try_store = |what: &str| -> Option<Value> {
            let out = std::process::Command::new(venv_bin("python"))
                .args(["-c", ON_STORE, url, what])
                .envs(py_env.iter().map(|(k, v)| (*k, v.as_str())))
                .output()
                .unwrap();
            out.status
                .success()
                .then(|| serde_json::from_slice(&out.stdout).unwrap())
        };
        let on_store = |what: &str| try_store(what).unwrap_or_else(|| panic!("{url}: {what}"));
        let mut child = spawn_draining(
            subsink()
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .env("SUBSINK_LOG", "subsink=info")
                .args(["run", "--subscription"])
                .arg(&sub)
                .args(["--table-url", url, "--table-schema"])
                .arg(&schema)
                .args(["--table-schema-refresh", "1s"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped()),
        );
        let mut stdin = child.stdin.take().unwrap();
        let mut send = move |from: u64, to: u64| {
            for i in from..to {
                let m = Message {
                    data: payload(i).to_string().into_bytes().into(),
                    message_id: format!("m{i}"),
                    ..Default::default()
                };
                writeln!(stdin, "{}", m.to_json_line()).unwrap();
            }
            stdin.flush().unwrap();
        };
        send(0, 20);
        let t = Instant::now();
        let has_20 = |t: Value| t["rows"].as_array().is_some_and(|r| r.len() == 20);
        while !try_store("read").is_some_and(has_20) {
            assert!(t.elapsed() < Duration::from_secs(60), "{url}: 20 rows");
            std::thread::sleep(Duration::from_millis(300));
        }
        on_store("add");
        // Seen by the worker (within the refresh); nothing is in flight, so the next batch
        // takes the column up.
        let seen = wait_for_stderr(&mut child, ADDED, Duration::from_secs(30));
        send(20, 40);
        drop(send);
        let out = output(child);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{url}: {err}");
        let got = on_store("read");
        assert_eq!(got["columns"], json!(["id", "name", "extra"]), "{url}");
        let rows = got["rows"].as_array().unwrap();
        assert_each_once(rows, 40);
        for r in rows {
            let i = r["id"].as_u64().unwrap();
            let want = if i < 20 {
                Value::Null
            } else {
                json!(format!("x{i}"))
            };
            assert_eq!(r["extra"], want, "{url}: row {i}");
        }
        assert!(err.contains(ADDED), "{url}: {err}");
        eprintln!("{url}: the added column seen {seen:?} after the change");
    }
}

// --- 6. two writers and a schema change: no ERROR line for what subsink handles --------------

/// Feed the payloads `ids` to `child`'s stdin, 10 a time with a pause of 200 ms; the input ends
/// after the last one.
fn feed_paced(
    child: &mut std::process::Child,
    ids: std::ops::Range<u64>,
) -> std::thread::JoinHandle<()> {
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let ids: Vec<u64> = ids.collect();
        for chunk in ids.chunks(10) {
            let mut buf = Vec::new();
            for &i in chunk {
                let m = Message {
                    data: payload(i).to_string().into_bytes().into(),
                    message_id: format!("m{i}"),
                    ..Default::default()
                };
                buf.extend_from_slice(m.to_json_line().as_bytes());
                buf.push(b'\n');
            }
            stdin.write_all(&buf).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

/// Two writers append to one table (6 s each) while two columns are added under them: every
/// commit of either builds on a snapshot the other writer's commits (and the new columns) have
/// passed, so deltalake's conflict check runs and refuses the commits that find the schema
/// changed (it logged `conflict detected, aborting transaction` at ERROR) — which subsink
/// handles (it checks the new schema and commits again). With the default log filter, neither
/// worker's log holds an ERROR line, and every row is in the table once (issue 44, point 7).
#[test]
fn two_writers_and_a_schema_change_log_no_error_and_write_every_row_once() {
    let dir = tempfile::tempdir().unwrap();
    let table = create(dir.path());
    let sub = subscription(
        dir.path(),
        "projects/proj/subscriptions/two-writers",
        "projects/proj/topics/two-writers",
    );
    let schema = dir.path().join("schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    let per_writer = 300u64;
    let mut feeders = Vec::new();
    let writers: Vec<std::process::Child> = (0..2u64)
        .map(|w| {
            let mut c = spawn_draining(
                subsink()
                    // The operator's default filter (subsink at info, the rest at warn).
                    .env_remove("SUBSINK_LOG")
                    .args(["run", "--subscription"])
                    .arg(&sub)
                    .args(["--table-url", &format!("file://{}", table.display())])
                    .arg("--table-schema")
                    .arg(&schema)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped()),
            );
            feeders.push(feed_paced(&mut c, w * per_writer..(w + 1) * per_writer));
            c
        })
        .collect();
    // Both have committed before the column comes.
    wait_until(
        "both writers committed",
        Duration::from_secs(60),
        Box::new(|| read(&table)["version"].as_i64().unwrap() >= 3),
    );
    let added = alter(&table, "add");
    // And another once both have committed on the first.
    wait_until(
        "both writers committed after the first column",
        Duration::from_secs(60),
        Box::new(|| read(&table)["version"].as_i64().unwrap() >= added + 2),
    );
    alter(&table, "add:more");
    for f in feeders {
        f.join().unwrap();
    }
    let mut conflicts = 0;
    for (w, c) in writers.into_iter().enumerate() {
        let out = output(c);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "writer {w}: {err}");
        assert_eq!(summary(&out)["messages_written"], per_writer, "writer {w}");
        let errors: Vec<&str> = err.lines().filter(|l| l.contains("ERROR")).collect();
        assert!(
            errors.is_empty(),
            "writer {w} logged ERROR lines: {errors:#?}"
        );
        conflicts += err.matches("checking for conflicts").count();
    }
    assert!(
        conflicts > 0,
        "no commit met another's: the test proves nothing"
    );
    let t = read(&table);
    assert_eq!(t["columns"], json!(["id", "name", "extra", "more"]));
    assert_each_once(t["rows"].as_array().unwrap(), 2 * per_writer);
}
