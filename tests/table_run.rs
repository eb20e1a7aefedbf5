//! The table writer end to end: the real binary (`subsink run` with a `bigqueryConfig`) writing a
//! Delta table, read back by readers nobody here wrote (the `deltalake` Python package, DuckDB over
//! the Parquet files the log lists, pyarrow), with bad messages, dead letters, kill -9 and resume,
//! and Pub/Sub (Google's emulator) as the source.

mod util;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use util::*;

const SUB: &str = "projects/proj/subscriptions/events-to-table";

/// Reads a Delta table with the `deltalake` package and, separately, with DuckDB over the Parquet
/// files of the table's current version; prints both as JSON rows sorted by `message_id`.
const READER: &str = r#"
import json, os, sys, datetime, decimal, base64
import deltalake, duckdb
dt = deltalake.DeltaTable(sys.argv[1])
def plain(v):
    if isinstance(v, dict): return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)): return [plain(x) for x in v]
    if isinstance(v, (bytes, bytearray)): return base64.b64encode(v).decode()
    if isinstance(v, decimal.Decimal): return format(v, "f")
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None: v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return v.strftime("%Y-%m-%dT%H:%M:%S.%f")
    if isinstance(v, (datetime.date, datetime.time)): return v.isoformat()
    return v
rows = dt.to_pyarrow_table().to_pylist()
key = lambda r: r.get("message_id") or ""
rows.sort(key=key)
files = dt.file_uris()
con = duckdb.connect()
con.execute("SET TimeZone='UTC'")
# A query past ~2 s would print DuckDB's progress bar into the JSON on stdout.
con.execute("SET enable_progress_bar = false")
duck = []
if sys.argv[1].startswith("s3://"):  # DuckDB's S3 support is an extension it would download
    duck = rows
elif files:
    rel = con.execute("SELECT * FROM read_parquet(?)", [files])
    names = [d[0] for d in rel.description]
    duck = [dict(zip(names, r)) for r in rel.fetchall()]
duck.sort(key=key)
print(json.dumps({"version": dt.version(), "files": len(files),
                  "deltalake": plain(rows), "duckdb": plain(duck)}))
# deltalake's object-store threads can abort the interpreter's teardown on an S3 table
# ("terminate called without an active exception", seen in a clean CI run): the answer is
# printed, so leave without the teardown.
sys.stdout.flush()
os._exit(0)
"#;

fn read_table(dir: &Path) -> Value {
    read_table_at(&dir.display().to_string(), &[])
}

/// Read the table at a path or URL; `env` configures the readers' object store.
fn read_table_at(location: &str, env: &[(&str, String)]) -> Value {
    python_json(READER, location, env)
}

/// The rows both readers agree on (they must).
fn rows(dir: &Path) -> Vec<Value> {
    let t = read_table(dir);
    assert_eq!(t["deltalake"], t["duckdb"], "deltalake and DuckDB disagree");
    t["deltalake"].as_array().unwrap().clone()
}

const SCHEMA: &str = r#"[
  {"name": "id", "type": "INTEGER", "mode": "REQUIRED"},
  {"name": "name", "type": "STRING"},
  {"name": "score", "type": "FLOAT64"},
  {"name": "ok", "type": "BOOLEAN"},
  {"name": "amount", "type": "NUMERIC"},
  {"name": "at", "type": "TIMESTAMP"},
  {"name": "day", "type": "DATE"},
  {"name": "tags", "type": "STRING", "mode": "REPEATED"},
  {"name": "user", "type": "RECORD", "fields": [
    {"name": "uid", "type": "INT64", "mode": "REQUIRED"},
    {"name": "email", "type": "STRING"}
  ]},
  {"name": "note", "type": "STRING"}
]"#;

/// Payload of event `i` and the row both readers must return for it (metadata columns included).
fn event(i: u64) -> (Value, Value) {
    let payload = json!({
        "id": i,
        "name": format!("name-{i}"),
        "score": i as f64 / 4.0,
        "ok": i.is_multiple_of(2),
        "amount": format!("{}.{:03}", i, i % 1000),
        "at": format!("2024-03-{:02} 10:{:02}:{:02}.25+00", 1 + i % 28, i % 60, (i / 60) % 60),
        "day": 19000 + i,
        "tags": (0..i % 3).map(|t| format!("t{t}")).collect::<Vec<_>>(),
        "user": {"uid": i * 10, "email": if i.is_multiple_of(5) { Value::Null } else { json!(format!("u{i}@x")) }},
    });
    let day = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap()
        + chrono::Duration::days(19000 + i as i64);
    // The readers return the payload's columns as stored, and the metadata columns.
    let mut row = payload.clone();
    row["amount"] = json!(format!("{}.{:03}000000", i, i % 1000));
    row["at"] = json!(format!(
        "2024-03-{:02}T10:{:02}:{:02}.250000",
        1 + i % 28,
        i % 60,
        (i / 60) % 60
    ));
    row["day"] = json!(day.to_string());
    let more = json!({
        "note": null,
        "subscription_name": SUB,
        "message_id": message_id(i),
        "publish_time": format!("2024-05-01T00:00:{:02}.{:06}", i % 60, i % 1000),
        "attributes": format!(r#"{{"i":"{i}"}}"#),
    });
    for (k, v) in more.as_object().unwrap() {
        row[k] = v.clone();
    }
    (payload, row)
}

fn message_id(i: u64) -> String {
    format!("{:08}", 10_000_000 + i)
}

fn message(i: u64, payload: &Value) -> Message {
    Message {
        data: payload.to_string().into_bytes().into(),
        attributes: [("i".to_string(), i.to_string())].into(),
        message_id: message_id(i),
        publish_time_micros: 1_714_521_600_000_000
            + (i % 60) as i64 * 1_000_000
            + (i % 1000) as i64,
        ordering_key: String::new(),
    }
}

/// `msgs` as NDJSON in `dir/in.ndjson`; its path.
fn input_file(dir: &Path, msgs: &[Message]) -> PathBuf {
    let src = dir.join("in.ndjson");
    write_lines(&src, msgs);
    src
}

fn subscription(dir: &Path, bq: Value, extra: Value) -> PathBuf {
    let mut cfg = json!({
        "name": SUB,
        "topic": "projects/proj/topics/events",
        "bigqueryConfig": {"table": "proj.analytics.events"},
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

/// [`subscription`] with `useTableSchema` and `writeMetadata`.
fn table_schema_subscription(dir: &Path, extra: Value) -> PathBuf {
    subscription(
        dir,
        json!({"useTableSchema": true, "writeMetadata": true}),
        extra,
    )
}

/// The [`SCHEMA`] file and the table folder `events`, in `dir`.
fn schema_and_table(dir: &Path) -> (PathBuf, PathBuf) {
    (schema_file(dir, SCHEMA), dir.join("events"))
}

fn schema_file(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("schema.json");
    std::fs::write(&p, text).unwrap();
    p
}

fn table_cmd(sub: &Path, src: &Path, table: &Path, schema: Option<&Path>) -> Command {
    let mut c = subsink();
    c.args(["run", "--subscription"])
        .arg(sub)
        .arg("--source")
        .arg(src)
        .arg("--table-url")
        .arg(format!("file://{}", table.display()));
    if let Some(s) = schema {
        c.arg("--table-schema").arg(s);
    }
    c
}

/// [`table_cmd`] with a table schema and the checkpoint `cp`.
fn checkpointed(sub: &Path, src: &Path, table: &Path, schema: &Path, cp: &Path) -> Command {
    let mut c = table_cmd(sub, src, table, Some(schema));
    c.arg("--checkpoint").arg(cp);
    c
}

fn ids_of(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|r| r["message_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn table_schema_rows_with_metadata_read_back_by_deltalake_and_duckdb() {
    let dir = tempfile::tempdir().unwrap();
    let n = 2_000;
    let (msgs, want): (Vec<Message>, Vec<Value>) = (0..n)
        .map(|i| {
            let (p, r) = event(i);
            (message(i, &p), r)
        })
        .unzip();
    let src = input_file(dir.path(), &msgs);
    let sub = table_schema_subscription(
        dir.path(),
        json!({"subsink": {"table": {"maxMessages": "500"}}}),
    );
    let (schema, table) = schema_and_table(dir.path());
    let s = summary(&run_ok(&mut table_cmd(&sub, &src, &table, Some(&schema))));
    assert_eq!(s["messages_written"], n);
    assert_eq!(s["objects"].as_array().unwrap().len(), 4, "{s}");
    let t = read_table(&table);
    // Version 0 creates the table; one commit per file of 500 rows.
    assert_eq!(
        (t["version"].as_i64(), t["files"].as_i64()),
        (Some(4), Some(4))
    );
    let got = rows(&table);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w);
    }
    // The same job again appends a second copy (a new run of a file source without a checkpoint
    // is a new delivery), as new versions.
    run_ok(&mut table_cmd(&sub, &src, &table, Some(&schema)));
    assert_eq!(rows(&table).len(), 2 * n as usize);
}

/// Three messages that each break one rule of docs/contract.md §4.6 among good ones.
fn mixed_input(dir: &Path) -> (PathBuf, Vec<String>, Vec<(u64, &'static str)>) {
    let mut msgs = Vec::new();
    let mut good = Vec::new();
    let bad = vec![
        (3, "unknown field"),
        (7, "REQUIRED column is missing"),
        (11, "INT64 cannot take a string"),
    ];
    for i in 0..15 {
        let (mut p, _) = event(i);
        match i {
            3 => p["colour"] = json!("red"),
            7 => {
                p.as_object_mut().unwrap().remove("id");
            }
            11 => p["id"] = json!("eleven"),
            _ => good.push(message_id(i)),
        }
        msgs.push(message(i, &p));
    }
    (input_file(dir, &msgs), good, bad)
}

#[test]
fn bad_messages_fail_alone_stay_not_done_then_go_to_the_dead_letter_file() {
    let dir = tempfile::tempdir().unwrap();
    let (src, good, bad) = mixed_input(dir.path());
    let sub = table_schema_subscription(
        dir.path(),
        json!({"subsink": {"table": {"maxMessages": "4"}},
               "deadLetterPolicy": {"deadLetterTopic": "projects/proj/topics/dead", "maxDeliveryAttempts": 5}}),
    );
    let (schema, table) = schema_and_table(dir.path());
    let cp = dir.path().join("cp.json");

    // Run 1: no dead-letter file. The rest of each batch is written; the three are not done:
    // exit 1, each named with its line, id, field and rule; the checkpoint keeps them.
    let out = checkpointed(&sub, &src, &table, &schema, &cp)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = summary(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(s["messages_written"], 12);
    assert_eq!(s["messages_failed"], 3);
    for ((i, rule), f) in bad.iter().zip(s["failed_messages"].as_array().unwrap()) {
        assert_eq!(f["line"], i + 1);
        assert_eq!(f["message_id"], message_id(*i));
        assert_eq!(f["attempts"], 1);
        let e = f["error"].as_str().unwrap();
        assert!(e.contains(rule), "{e}");
        assert!(
            err.contains(&format!("line {}: message \"{}\"", i + 1, message_id(*i))),
            "{err}"
        );
    }
    assert!(s["failed_messages"][0]["error"]
        .as_str()
        .unwrap()
        .contains("`colour`"));
    assert!(s["failed_messages"][1]["error"]
        .as_str()
        .unwrap()
        .contains("`id`"));
    assert_eq!(ids_of(&rows(&table)), good);
    let saved: Value = serde_json::from_slice(&std::fs::read(&cp).unwrap()).unwrap();
    assert_eq!(
        saved["line"], 4,
        "watermark stops at the first failed message"
    );
    assert_eq!(saved["failed"].as_array().unwrap().len(), 3);

    // Run 2: same, a second delivery; nothing written twice.
    let out = checkpointed(&sub, &src, &table, &schema, &cp)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = summary(&out);
    assert_eq!(s["messages_written"], 0);
    // Lines 1–3 lie before the watermark; the 9 good ones after it are in committed files.
    assert_eq!(s["messages_already_written"], 9);
    assert_eq!(s["failed_messages"][2]["attempts"], 2);

    // Run 3 with a dead-letter file: redelivered up to maxDeliveryAttempts (5), then
    // dead-lettered with the five attributes; exit 0, the checkpoint is clean.
    let dl = dir.path().join("dead.ndjson");
    let out = run_ok(
        checkpointed(&sub, &src, &table, &schema, &cp)
            .arg("--dead-letter")
            .arg(&dl),
    );
    let s = summary(&out);
    assert_eq!(s["messages_dead_lettered"], 3);
    assert_eq!(s["messages_failed"], 0);
    let dead: Vec<Value> = std::fs::read_to_string(&dl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dead.len(), 3);
    let msgs: Vec<Message> = std::fs::read_to_string(&src)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| {
            let mut m = Message::default();
            use base64::Engine as _;
            m.data = base64::engine::general_purpose::STANDARD
                .decode(v["data"].as_str().unwrap())
                .unwrap()
                .into();
            m.message_id = v["messageId"].as_str().unwrap().into();
            m
        })
        .collect();
    for ((i, rule), d) in bad.iter().zip(&dead) {
        assert_eq!(d["messageId"], message_id(*i));
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD
            .decode(d["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(data, msgs[*i as usize].data, "the payload as published");
        let a = &d["attributes"];
        assert_eq!(a["i"], i.to_string());
        assert_eq!(a["CloudPubSubDeadLetterSourceDeliveryCount"], "5");
        assert_eq!(
            a["CloudPubSubDeadLetterSourceSubscription"],
            "events-to-table"
        );
        assert_eq!(a["CloudPubSubDeadLetterSourceSubscriptionProject"], "proj");
        assert_eq!(
            a["CloudPubSubDeadLetterSourceTopicPublishTime"],
            format!(
                "2024-05-01T00:00:{:02}.{:03}+00:00",
                i % 60,
                (i % 1000) / 1000
            )
        );
        let e = a["CloudPubSubDeadLetterSourceDeliveryErrorMessage"]
            .as_str()
            .unwrap();
        assert!(e.contains(rule) && e.contains(&message_id(*i)), "{e}");
    }
    let saved: Value = serde_json::from_slice(&std::fs::read(&cp).unwrap()).unwrap();
    assert!(saved.get("failed").is_none(), "{saved}");
    assert_eq!(saved["line"], 16);
    assert_eq!(ids_of(&rows(&table)), good, "nothing written twice");
}

#[test]
fn a_fixed_schema_writes_failed_messages_on_the_next_run_once() {
    // A user fixes the cause (here: turns on dropUnknownFields): the next run writes the
    // message that failed, and a third run writes nothing.
    let dir = tempfile::tempdir().unwrap();
    let (src, good, _) = mixed_input(dir.path());
    let (schema, table) = schema_and_table(dir.path());
    let cp = dir.path().join("cp.json");
    let strict = table_schema_subscription(
        dir.path(),
        json!({"subsink": {"table": {"maxMessages": "4"}}}),
    );
    let out = checkpointed(&strict, &src, &table, &schema, &cp)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let relaxed = subscription(
        dir.path(),
        json!({"useTableSchema": true, "writeMetadata": true, "dropUnknownFields": true}),
        json!({"subsink": {"table": {"maxMessages": "4"}}}),
    );
    let out = checkpointed(&relaxed, &src, &table, &schema, &cp)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "two still fail");
    let s = summary(&out);
    assert_eq!(s["messages_written"], 1);
    assert_eq!(s["messages_failed"], 2);
    let mut want = good.clone();
    want.push(message_id(3));
    want.sort();
    assert_eq!(ids_of(&rows(&table)), want);
    let row3 = rows(&table)
        .into_iter()
        .find(|r| r["message_id"] == message_id(3))
        .unwrap();
    assert_eq!(
        row3["id"], 3,
        "the unknown field was dropped, the rest kept"
    );
    let out = checkpointed(&relaxed, &src, &table, &schema, &cp)
        .output()
        .unwrap();
    let s = summary(&out);
    assert_eq!(s["messages_written"], 0);
    assert_eq!(ids_of(&rows(&table)), want, "nothing written twice");
}

#[test]
fn gcloud_flags_no_schema_mode_and_startup_errors() {
    let dir = tempfile::tempdir().unwrap();
    let msgs: Vec<Message> = ["{\"a\":1}", "not json", "[1,2]"]
        .iter()
        .enumerate()
        .map(|(i, d)| Message {
            data: d.as_bytes().to_vec().into(),
            message_id: format!("m{i}"),
            publish_time_micros: 1_714_521_600_000_000,
            ordering_key: if i == 2 { "k".into() } else { String::new() },
            ..Default::default()
        })
        .collect();
    let src = input_file(dir.path(), &msgs);
    let schema = schema_file(
        dir.path(),
        r#"[{"name": "data", "type": "JSON"}, {"name": "attributes", "type": "JSON"}]"#,
    );
    let table = dir.path().join("raw");
    let gcloud = |c: &mut Command| {
        c.args([
            "run",
            "--subscription-name",
            "projects/proj/subscriptions/raw-sub",
            "--topic",
            "raw",
            "--bigquery-table",
            "proj:analytics.raw",
            "--write-metadata",
            "--table-max-messages",
            "1",
            "--parquet-compression",
            "snappy",
            "--source",
        ])
        .arg(&src)
        .arg("--table-url")
        .arg(format!("file://{}", table.display()))
        .arg("--table-schema")
        .arg(&schema);
    };
    let mut c = subsink();
    gcloud(&mut c);
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = summary(&out);
    assert_eq!(s["messages_written"], 2);
    assert_eq!(
        s["objects"].as_array().unwrap().len(),
        2,
        "one file per message"
    );
    let e = s["failed_messages"][0]["error"].as_str().unwrap();
    assert!(e.contains("`data`") && e.contains("JSON"), "{e}");
    let got = rows(&table);
    assert_eq!(
        got,
        vec![
            json!({"data": "{\"a\":1}", "attributes": "{}", "subscription_name": "projects/proj/subscriptions/raw-sub",
                   "message_id": "m0", "publish_time": "2024-05-01T00:00:00.000000"}),
            json!({"data": "[1,2]", "attributes": "{\"ordering_key\":\"k\"}", "subscription_name": "projects/proj/subscriptions/raw-sub",
                   "message_id": "m2", "publish_time": "2024-05-01T00:00:00.000000"}),
        ]
    );

    // Startup errors: exit 2 before anything is read, naming the place and the rule.
    let bad_schema = dir.path().join("bad.json");
    std::fs::write(&bad_schema, r#"[{"name": "id", "type": "INTEGR"}]"#).unwrap();
    // `subsink run` of `src` for the raw subscription into `proj.analytics.raw`, table schema on.
    let raw_run = |flags: &[&str]| {
        let mut c = subsink();
        c.args([
            "run",
            "--subscription-name",
            "projects/proj/subscriptions/raw-sub",
            "--bigquery-table",
            "proj.analytics.raw",
            "--use-table-schema",
        ])
        .args(flags)
        .arg("--source")
        .arg(&src);
        c
    };
    let out = raw_run(&["--use-topic-schema"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mutually exclusive"));
    let out = raw_run(&[])
        .arg("--table-schema")
        .arg(&bad_schema)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.json") && err.contains("INTEGR"), "{err}");
    // An existing table with other columns is refused, not appended to (exit 2: the table or
    // the configuration must change, as for a bad flag).
    let out = table_cmd(
        &subscription(dir.path(), json!({"useTableSchema": true}), json!({})),
        &src,
        &table,
        Some(&schema_file(dir.path(), SCHEMA)),
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("schema differs"), "{err}");
}

#[test]
fn checkpoint_resume_after_kill_writes_every_row_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let n = 30_000;
    let msgs: Vec<Message> = (0..n).map(|i| message(i, &event(i).0)).collect();
    let src = input_file(dir.path(), &msgs);
    let sub = table_schema_subscription(
        dir.path(),
        json!({"subsink": {"table": {"maxMessages": "1000"}}}),
    );
    let (schema, table) = schema_and_table(dir.path());
    let cp = dir.path().join("cp.json");
    let cmd = || checkpointed(&sub, &src, &table, &schema, &cp);
    // Kill -9 at several moments while rows are being committed. Each kill waits until the run
    // has committed something of its own (its checkpoint watermark moved), then lands a random
    // moment later, and must find the run still working: on any machine every round is a crash
    // in the middle of the input, never a plain run to the end.
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
    let resumed = s["messages_written"].as_u64().unwrap();
    assert!(
        resumed < n,
        "the last run resumed: it wrote {resumed} of {n}"
    );
    let got = ids_of(&rows(&table));
    let want: Vec<String> = (0..n).map(message_id).collect();
    assert_eq!(got.len(), want.len(), "duplicates or losses");
    assert_eq!(got, want);
    let s = summary(&run_ok(&mut cmd()));
    assert_eq!(s["messages_written"], 0);
}

#[test]
fn pubsub_into_a_table_acks_after_commit_and_dead_letters_bad_rows() {
    use subsink::pubsub::SubscriptionSpec;
    let env = util::pubsub::PubsubEnv::start();
    let (topic, dlq) = ("projects/proj/topics/events", "projects/proj/topics/dead");
    let mut spec = SubscriptionSpec::new(SUB, topic);
    spec.ack_deadline_seconds = 10;
    spec.dead_letter = Some((dlq.into(), 5));
    env.topic_and_sub(spec);
    env.subscribe("projects/proj/subscriptions/dead-sub", dlq);
    let n = 300u64;
    let mut msgs: Vec<Message> = (0..n).map(|i| message(i, &event(i).0)).collect();
    msgs.push(message(n, &json!({"id": "x"})));
    msgs.push(message(n + 1, &json!({"id": 1, "extra": true})));
    let ids = env.publish(topic, &msgs);

    let dir = tempfile::tempdir().unwrap();
    let sub = table_schema_subscription(
        dir.path(),
        json!({"ackDeadlineSeconds": 10,
               "deadLetterPolicy": {"deadLetterTopic": dlq, "maxDeliveryAttempts": 5},
               "retryPolicy": {"minimumBackoff": "10s", "maximumBackoff": "20s"},
               "subsink": {"table": {"maxMessages": "100", "maxDuration": "2s"}}}),
    );
    let (schema, table) = schema_and_table(dir.path());
    let child = spawn_draining(
        subsink()
            .env("PUBSUB_EMULATOR_HOST", env.emu.host())
            .env("SUBSINK_LOG", "info")
            .args(["run", "--source", "pubsub", "--subscription"])
            .arg(&sub)
            .arg("--table-url")
            .arg(format!("file://{}", table.display()))
            .arg("--table-schema")
            .arg(&schema)
            .stdout(Stdio::piped()),
    );

    let start = Instant::now();
    let mut dead = Vec::new();
    while dead.len() < 2 {
        dead.extend(env.drain(
            "projects/proj/subscriptions/dead-sub",
            Duration::from_secs(2),
        ));
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "dead letters: {}",
            dead.len()
        );
    }
    // docs/contract.md §4.1: rows that do not fit the schema are not backed off when a dead-letter topic is
    // attached (the retry policy would make it at least 4 × 8 s).
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "dead-lettered after {:?}",
        start.elapsed()
    );
    // Every good row is in the table before the worker stops.
    let want: Vec<String> = ids[..n as usize].to_vec();
    loop {
        let got: HashSet<String> = rows(&table)
            .iter()
            .map(|r| r["message_id"].as_str().unwrap().to_string())
            .collect();
        if want.iter().all(|i| got.contains(i)) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{} rows",
            got.len()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let (out, err) = sigterm_ok(child);
    assert!(err.contains("acked after durable"), "{err}");
    let s = summary(&out);
    assert_eq!(s["messages_dead_lettered"], 2, "{err}");
    dead.sort_by_key(|m| m.attributes["i"].parse::<u64>().unwrap());
    assert_eq!(dead[0].attributes["i"], n.to_string());
    assert_eq!(dead[1].attributes["i"], (n + 1).to_string());
    for (d, rule) in dead
        .iter()
        .zip(["INT64 cannot take a string", "unknown field"])
    {
        assert_eq!(
            &d.attributes["CloudPubSubDeadLetterSourceDeliveryCount"],
            "5"
        );
        let e = &d.attributes["CloudPubSubDeadLetterSourceDeliveryErrorMessage"];
        assert!(e.contains(rule), "{e}");
    }
    // Rows carry the ids Pub/Sub assigned; no row twice.
    let got = rows(&table);
    let got_ids: Vec<String> = ids_of(&got);
    let unique: HashSet<&String> = got_ids.iter().collect();
    assert_eq!(unique.len(), got_ids.len(), "a row written twice");
    assert_eq!(got_ids.len(), n as usize);
    // Everything was acked: nothing is redelivered.
    assert!(env.drain(SUB, Duration::from_secs(12)).is_empty());
}

#[test]
fn two_workers_commit_to_one_table_on_s3_and_lose_nothing() {
    let s3 = S3Server::start();
    s3.create_bucket("lake");
    let dir = tempfile::tempdir().unwrap();
    let sub = table_schema_subscription(
        dir.path(),
        json!({"subsink": {"table": {"maxMessages": "100"}}}),
    );
    let schema = schema_file(dir.path(), SCHEMA);
    // Two inputs with disjoint ids, written at the same moment by two processes: 2 × 15 commits
    // race for the same log versions.
    let n = 1_500u64;
    let inputs: Vec<PathBuf> = (0..2u64)
        .map(|w| {
            let msgs: Vec<Message> = (w * n..(w + 1) * n)
                .map(|i| message(i, &event(i).0))
                .collect();
            let p = dir.path().join(format!("in{w}.ndjson"));
            write_lines(&p, &msgs);
            p
        })
        .collect();
    let url = "s3://lake/warehouse/events";
    let children: Vec<_> = inputs
        .iter()
        .map(|src| {
            let mut c = subsink();
            c.args(["run", "--subscription"])
                .arg(&sub)
                .arg("--source")
                .arg(src)
                .args(["--table-url", url, "--table-schema"])
                .arg(&schema)
                .envs(s3.env())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(summary(&out)["messages_written"], n);
    }
    let t = read_table_at(url, &s3.env());
    assert_eq!(t["version"], 30, "version 0 creates, then 30 commits");
    let got: Vec<Value> = t["deltalake"].as_array().unwrap().clone();
    let want: Vec<Value> = (0..2 * n).map(|i| event(i).1).collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w);
    }
    let keys: Vec<String> = s3.list("lake").into_iter().map(|(k, _)| k).collect();
    assert!(
        keys.iter().all(|k| k.starts_with("warehouse/events/")),
        "{keys:?}"
    );
}

#[test]
fn topic_schema_mode_json_and_binary_messages_and_the_startup_diff() {
    let dir = tempfile::tempdir().unwrap();
    let avsc = root().join("fixtures/input/event.avsc");
    let sub = subscription(
        dir.path(),
        json!({"useTopicSchema": true, "writeMetadata": true}),
        json!({}),
    );
    let schema = schema_file(
        dir.path(),
        r#"[{"name": "id", "type": "INT64", "mode": "REQUIRED"},
            {"name": "name", "type": "STRING"},
            {"name": "tags", "type": "STRING", "mode": "REPEATED"},
            {"name": "amount", "type": "FLOAT64"},
            {"name": "kind", "type": "INTEGER"},
            {"name": "ok", "type": "BOOL"}]"#,
    );
    let table = dir.path().join("events");
    let src = root().join("fixtures/input/topic-messages.ndjson");
    let out = run_ok(
        table_cmd(&sub, &src, &table, Some(&schema))
            .arg("--topic-schema")
            .arg(&avsc),
    );
    assert_eq!(summary(&out)["messages_written"], 6);
    let attrs = |enc: &str, key: bool| {
        format!(
            r#"{{"googclient_schemaencoding":"{enc}","googclient_schemaname":"projects/p/schemas/event","googclient_schemarevisionid":"3afd3cc8"{}}}"#,
            if key { r#","ordering_key":"k""# } else { "" }
        )
    };
    let row = |id: &str, enc: &str, key: bool, v: Value| {
        let mut r = v;
        r["subscription_name"] = json!(SUB);
        r["message_id"] = json!(id);
        r["publish_time"] = json!("2023-09-25T04:10:00.123456");
        r["attributes"] = json!(attrs(enc, key));
        r
    };
    let first =
        json!({"id": 1, "name": "first", "tags": ["a", "b"], "amount": 1.5, "kind": 0, "ok": true});
    let second =
        json!({"id": -2, "name": "café", "tags": [], "amount": null, "kind": 1, "ok": false});
    let third = json!({"id": 1099511627776i64, "name": "", "tags": ["x"], "amount": -0.25, "kind": 0, "ok": true});
    assert_eq!(
        rows(&table),
        vec![
            row("1000", "JSON", true, first.clone()),
            row("1001", "JSON", false, second.clone()),
            row("1002", "JSON", false, third.clone()),
            row("1010", "BINARY", false, first),
            row("1011", "BINARY", false, second),
            row("1012", "BINARY", false, third),
        ]
    );

    // A message that does not match the topic schema fails alone.
    let bad = root().join("fixtures/input/topic-bad.ndjson");
    let out = table_cmd(&sub, &bad, &dir.path().join("t2"), Some(&schema))
        .arg("--topic-schema")
        .arg(&avsc)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = summary(&out);
    assert_eq!(s["messages_written"], 2);
    assert_eq!(s["failed_messages"][0]["message_id"], "1020");
    assert!(
        s["failed_messages"][0]["error"]
            .as_str()
            .unwrap()
            .contains("id"),
        "{s}"
    );

    // Incompatible table: a startup error (exit 2) listing every field and rule, nothing read.
    let wrong = dir.path().join("wrong.json");
    std::fs::write(
        &wrong,
        r#"[{"name": "id", "type": "STRING", "mode": "REQUIRED"},
            {"name": "amount", "type": "FLOAT64", "mode": "REQUIRED"},
            {"name": "extra", "type": "STRING", "mode": "REQUIRED"},
            {"name": "message_id", "type": "STRING"}]"#,
    )
    .unwrap();
    let out = table_cmd(&sub, &src, &dir.path().join("t3"), Some(&wrong))
        .arg("--topic-schema")
        .arg(&avsc)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "id",
        "expected STRING",
        "amount",
        "extra",
        "name",
        "tags",
        "kind",
        "ok",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    assert!(
        !dir.path().join("t3").exists(),
        "no table made on a startup error"
    );
}

/// Issue 13: BIGNUMERIC takes BigQuery's whole range, ±5.789…×10^38 with 38 fraction digits, and
/// both independent readers see every digit (the column is exact decimal text); one step beyond
/// the range fails that message alone.
#[test]
fn bignumeric_full_range_is_stored_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let max = "578960446186580977117854925043439539266.34992332820282019728792003956564819967";
    let min = "-578960446186580977117854925043439539266.34992332820282019728792003956564819968";
    let cases: [(Value, &str); 6] = [
        (json!(max), max),
        (json!(min), min),
        (json!(format!("-{max}")), &format!("-{max}")),
        (
            json!("1e38"),
            "100000000000000000000000000000000000000.00000000000000000000000000000000000000",
        ),
        (
            json!(1e38),
            "100000000000000000000000000000000000000.00000000000000000000000000000000000000",
        ),
        (json!("-1.5"), "-1.50000000000000000000000000000000000000"),
    ]
    .map(|(v, s)| (v, Box::leak(s.to_string().into_boxed_str()) as &str));
    let mut msgs: Vec<Message> = cases
        .iter()
        .enumerate()
        .map(|(i, (v, _))| message(i as u64, &json!({"bn": v, "r": {"bn": v}})))
        .collect();
    // One past the top: fails alone, the rest is written.
    let beyond = "578960446186580977117854925043439539266.34992332820282019728792003956564819968";
    msgs.push(message(99, &json!({"bn": beyond, "r": {"bn": "0"}})));
    let src = input_file(dir.path(), &msgs);
    let sub = subscription(dir.path(), json!({"useTableSchema": true}), json!({}));
    let schema = schema_file(
        dir.path(),
        r#"[{"name": "bn", "type": "BIGNUMERIC"},
            {"name": "r", "type": "RECORD", "fields": [{"name": "bn", "type": "BIGDECIMAL"}]}]"#,
    );
    let table = dir.path().join("t");
    let out = table_cmd(&sub, &src, &table, Some(&schema))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("BIGNUMERIC: {beyond:?} is out of range")),
        "{stderr}"
    );
    assert_eq!(summary(&out)["messages_written"], cases.len());
    // No metadata columns: both readers' rows, in the table's order, compared as sets.
    let t = read_table(&table);
    assert_eq!(t["deltalake"].as_array().unwrap().len(), cases.len());
    for reader in ["deltalake", "duckdb"] {
        let mut got: Vec<(String, String)> = t[reader]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["bn"].as_str().unwrap().to_string(),
                    r["r"]["bn"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        got.sort();
        let mut want: Vec<(String, String)> = cases
            .iter()
            .map(|(_, s)| (s.to_string(), s.to_string()))
            .collect();
        want.sort();
        assert_eq!(got, want, "{reader}");
    }
}

/// Issue 13, decisions that stay: a no-schema subscription without `--table-schema` writes a
/// table of `data` and the metadata columns (a BigQuery subscription would be refused), and
/// `dropUnknownFields`, a no-op there, warns. Issue 44: the columns added are said in one INFO
/// line naming them all, not a WARN line per column on every run.
#[test]
fn no_schema_table_is_extended_and_says_so_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let msgs: Vec<Message> = (0..3).map(|i| message(i, &json!({"i": i}))).collect();
    let src = input_file(dir.path(), &msgs);
    let sub = subscription(
        dir.path(),
        json!({"writeMetadata": true, "dropUnknownFields": true}),
        json!({}),
    );
    let table = dir.path().join("t");
    let out = run_ok(table_cmd(&sub, &src, &table, None).env("SUBSINK_LOG", "subsink=info"));
    let err = String::from_utf8_lossy(&out.stderr);
    let added: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("lacks columns subsink writes"))
        .collect();
    assert_eq!(added.len(), 1, "{err}");
    assert!(added[0].contains(" INFO "), "{}", added[0]);
    for column in [
        "data",
        "subscription_name",
        "message_id",
        "publish_time",
        "attributes",
    ] {
        assert!(added[0].contains(&format!("`{column}`")), "{column}: {err}");
    }
    assert!(!err.contains("the table schema has no"), "{err}");
    assert!(err.contains("dropUnknownFields has no effect"), "{err}");
    assert_eq!(summary(&out)["messages_written"], 3);
    let got = rows(&table);
    assert_eq!(
        ids_of(&got),
        msgs.iter()
            .map(|m| m.message_id.clone())
            .collect::<Vec<_>>()
    );
    let data = got[0]["data"].as_str().unwrap();
    use base64::Engine as _;
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
        msgs[0].data.to_vec()
    );
}

/// Compares each data file's `add` statistics (as the `deltalake` package reads them,
/// `get_add_actions(flatten=True)`) with the file's data read by pyarrow, and asks the dataset
/// deltalake makes for the fragments (files) a predicate leaves: `id == argv[2]` and
/// `day == date(argv[3])`. Prints JSON.
const STATS_READER: &str = r#"
import json, os, sys, datetime, decimal
import pyarrow as pa, pyarrow.compute as pc, pyarrow.dataset as ds, pyarrow.parquet as pq
from deltalake import DeltaTable
path = sys.argv[1]
dt = DeltaTable(path)
adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
def norm(v):
    if isinstance(v, datetime.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=datetime.timezone.utc)).timestamp()
    if isinstance(v, decimal.Decimal): return float(v)
    if isinstance(v, datetime.date): return v.isoformat()
    return v
files, problems, with_range = [], [], set()
for a in adds:
    t = pq.read_table(os.path.join(path, a["path"])).flatten()
    stats = {}
    for name in t.column_names:
        col = t.column(name)
        if pa.types.is_list(col.type): continue
        nulls = a.get("null_count." + name)
        lo, hi = a.get("min." + name), a.get("max." + name)
        stats[name] = {"null_count": nulls, "min": norm(lo) is not None}
        if nulls is not None and nulls != col.null_count:
            problems.append(f"{a['path']} {name}: null_count {nulls}, the data has {col.null_count}")
        if lo is None and hi is None: continue
        with_range.add(name)
        mm = pc.min_max(col)
        want_lo, want_hi = norm(mm["min"].as_py()), norm(mm["max"].as_py())
        lo, hi = norm(lo), norm(hi)
        # Timestamps: to the millisecond, min down and max up; everything else exact.
        if pa.types.is_timestamp(col.type):
            ok = lo <= want_lo and want_lo - lo < 0.001 and hi >= want_hi and hi - want_hi < 0.001
        else:
            ok = lo == want_lo and hi == want_hi
        if not ok:
            problems.append(f"{a['path']} {name}: [{lo}, {hi}], the data [{want_lo}, {want_hi}]")
    files.append({"records": a["num_records"], "rows": t.num_rows})
d = dt.to_pyarrow_dataset()
def scan(expr):
    return {"fragments": len(list(d.get_fragments(filter=expr))), "rows": d.to_table(filter=expr).num_rows}
day = datetime.date.fromisoformat(sys.argv[3])
print(json.dumps({
    "files": files, "problems": problems, "with_range": sorted(with_range),
    "fragments": len(list(d.get_fragments())),
    "id": scan(ds.field("id") == int(sys.argv[2])),
    "day": scan(ds.field("day") == day),
    "config": dt.metadata().configuration,
}))
sys.stdout.flush()
os._exit(0)
"#;

fn read_stats(table: &Path, id: u64, day: &str) -> Value {
    let out = venv_python(
        [
            "-c",
            STATS_READER,
            &table.display().to_string(),
            &id.to_string(),
            day,
        ],
        &[],
    );
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{out}: {e}"))
}

/// Sets `delta.dataSkippingNumIndexedCols` on the table `argv[1]` to `argv[2]`.
const SET_INDEXED: &str = r#"
import os, sys
from deltalake import DeltaTable
DeltaTable(sys.argv[1]).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": sys.argv[2]})
os._exit(0)
"#;

/// Issue 44, point 6: every `add` carries Delta's per-column statistics, so the `deltalake`
/// package reads only the files a selective predicate can match — 1 of 4 here — and the
/// statistics agree with the data (pyarrow over each file). `delta.dataSkippingNumIndexedCols`
/// set on the table limits the next files' statistics to its first columns.
#[test]
fn delta_stats_let_deltalake_skip_files_and_match_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let n = 2_000u64;
    let msgs: Vec<Message> = (0..n)
        .map(|i| {
            let (p, _) = event(i);
            message(i, &p)
        })
        .collect();
    let src = input_file(dir.path(), &msgs);
    let sub = table_schema_subscription(
        dir.path(),
        json!({"subsink": {"table": {"maxMessages": "500"}}}),
    );
    let (schema, table) = schema_and_table(dir.path());
    run_ok(&mut table_cmd(&sub, &src, &table, Some(&schema)));
    // Event 1234: id 1234, day 19000 + 1234 days, in the third file of 500.
    let day = (chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap()
        + chrono::Duration::days(19_000 + 1_234))
    .to_string();
    let s = read_stats(&table, 1_234, &day);
    assert_eq!(s["problems"], json!([]), "{s}");
    assert_eq!(s["files"].as_array().unwrap().len(), 4, "{s}");
    for f in s["files"].as_array().unwrap() {
        assert_eq!(f["records"], f["rows"], "{s}");
    }
    // Every column but the list (`tags`) and the all-NULL `note` has a range.
    assert_eq!(
        s["with_range"],
        json!([
            "amount",
            "at",
            "attributes",
            "day",
            "id",
            "message_id",
            "name",
            "ok",
            "publish_time",
            "score",
            "subscription_name",
            "user.email",
            "user.uid"
        ]),
        "{s}"
    );
    assert_eq!(s["fragments"], 4, "{s}");
    assert_eq!(s["id"], json!({"fragments": 1, "rows": 1}), "{s}");
    assert_eq!(s["day"], json!({"fragments": 1, "rows": 1}), "{s}");

    // The table asks for its first two columns only: the next run's files (versions 6 to 9)
    // have `id` and `name` statistics and nothing else (the log as written).
    venv_python(["-c", SET_INDEXED, &table.display().to_string(), "2"], &[]);
    run_ok(&mut table_cmd(&sub, &src, &table, Some(&schema)));
    for version in 6..=9 {
        let log = table.join(format!("_delta_log/{version:020}.json"));
        let text = std::fs::read_to_string(&log).unwrap();
        let adds: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter_map(|a| a.get("add").cloned())
            .collect();
        assert_eq!(adds.len(), 1, "{text}");
        let stats: Value = serde_json::from_str(adds[0]["stats"].as_str().unwrap()).unwrap();
        assert_eq!(stats["numRecords"], 500);
        for key in ["minValues", "maxValues", "nullCount"] {
            let names: Vec<&String> = stats[key].as_object().unwrap().keys().collect();
            assert_eq!(names, ["id", "name"], "version {version}: {stats}");
        }
    }
    // deltalake reads statistics per the table's properties too: `id` still skips (both copies
    // of event 1234 are read, from 2 of 8 files), `day` no longer does.
    let s = read_stats(&table, 1_234, &day);
    assert_eq!(s["problems"], json!([]), "{s}");
    assert_eq!(s["config"]["delta.dataSkippingNumIndexedCols"], "2", "{s}");
    assert_eq!(s["with_range"], json!(["id", "name"]), "{s}");
    assert_eq!(s["fragments"], 8, "{s}");
    assert_eq!(s["id"], json!({"fragments": 2, "rows": 2}), "{s}");
    assert_eq!(s["day"], json!({"fragments": 8, "rows": 2}), "{s}");
}
