//! BigQuery as the destination, against a real server: `bqemulator` 1.4.0 (PyPI) through
//! `tests/py/bqemulator_launcher.py`, one per test binary. Tables are made with its REST API,
//! subsink writes through the Storage Write API (`AppendRows`, Arrow rows), and the rows are read
//! back with its query API and compared value by value.
//!
//! The emulator's query answers differ from BigQuery's in form: NUMERIC comes back with all 9
//! fraction digits (`123.456000000`) and TIMESTAMP as microseconds since the epoch
//! (`1695615000500000`) where BigQuery gives seconds; the expected values below are written in
//! the emulator's form. It does not support BIGNUMERIC (DuckDB decimals stop at width 38),
//! GEOGRAPHY (the spatial extension cannot be downloaded here), INTERVAL and RANGE (subsink refuses
//! those columns anyway); a RECORD column needs the launcher's patch (see the launcher).

mod util;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use util::bigquery::{shared_bq, BQ_PROJECT};
use util::*;

const SUB_NAME: &str = "projects/subsink-bq/subscriptions/rows";

fn b64(s: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A subscription config into `ds.table` with `bq` merged into its `bigqueryConfig`.
fn config(dir: &Path, table: &str, bq: Value, extra: Value) -> std::path::PathBuf {
    let mut cfg = json!({
        "name": SUB_NAME,
        "topic": "projects/subsink-bq/topics/events",
        "subsink": {"limits": "extended"},
        "bigqueryConfig": {"table": table},
    });
    for (k, v) in bq.as_object().unwrap() {
        cfg["bigqueryConfig"][k] = v.clone();
    }
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    let p = dir.join("sub.json");
    std::fs::write(&p, cfg.to_string()).unwrap();
    p
}

/// An NDJSON input line: `payload` as data, id `id`.
fn line(id: &str, payload: &[u8], attrs: Value) -> String {
    json!({"data": b64(payload), "messageId": id, "publishTime": "2023-09-25T04:10:00.250Z",
           "attributes": attrs})
    .to_string()
}

fn write_input(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// `subsink run` from a file into `url`, with the emulator's endpoints.
fn run_file(cfg: &Path, input: &Path, url: &str, extra: &[&str]) -> Output {
    subsink()
        .args(["run", "--subscription"])
        .arg(cfg)
        .arg("--source")
        .arg(input)
        .args(["--table-url", url])
        .args(shared_bq().flags())
        .args(extra)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A table of every column type the emulator supports, with REQUIRED, REPEATED and RECORD
/// columns and the metadata columns.
fn every_type_fields() -> Value {
    let fields = json!([
        {"name": "s", "type": "STRING", "mode": "REQUIRED"},
        {"name": "b", "type": "BYTES"},
        {"name": "i", "type": "INT64"},
        {"name": "f", "type": "FLOAT64"},
        {"name": "n", "type": "NUMERIC"},
        {"name": "bo", "type": "BOOL"},
        {"name": "d", "type": "DATE"},
        {"name": "t", "type": "TIME"},
        {"name": "dt", "type": "DATETIME"},
        {"name": "ts", "type": "TIMESTAMP"},
        {"name": "j", "type": "JSON"},
        {"name": "r", "type": "INT64", "mode": "REPEATED"},
        {"name": "rec", "type": "RECORD", "fields": [
            {"name": "x", "type": "STRING"}, {"name": "y", "type": "INT64", "mode": "REQUIRED"}]},
        {"name": "recs", "type": "RECORD", "mode": "REPEATED", "fields": [
            {"name": "x", "type": "STRING"}, {"name": "z", "type": "FLOAT64"}]}
    ]);
    with_metadata(fields, "JSON")
}

/// `fields` and the four metadata columns (`attributes` of type `attributes`).
fn with_metadata(mut fields: Value, attributes: &str) -> Value {
    let a = fields.as_array_mut().unwrap();
    a.push(json!({"name": "subscription_name", "type": "STRING"}));
    a.push(json!({"name": "message_id", "type": "STRING"}));
    a.push(json!({"name": "publish_time", "type": "TIMESTAMP"}));
    a.push(json!({"name": "attributes", "type": attributes}));
    fields
}

/// A message that becomes a row: id, payload, the row expected back (without metadata).
type Good = (String, Value, Value);
/// A message that cannot become a row: id, payload.
type Bad = (String, Value);

/// Messages of every type and messages that fail.
fn every_type_messages() -> (Vec<Good>, Vec<Bad>) {
    let good = vec![
        (
            "a".to_string(),
            json!({"s": "hello", "b": b64(&[0, 255, 10]), "i": 42, "f": 1.5, "n": "123.456",
                   "bo": true, "d": "2024-02-29", "t": "12:34:56.789", "dt": "2024-01-02T03:04:05.123456",
                   "ts": "2023-09-25T04:10:00.5Z", "j": "{\"a\":[1,2]}", "r": [1, 2, 3],
                   "rec": {"x": "in", "y": 7}, "recs": [{"x": "a", "z": 0.5}, {"x": "b"}]}),
            json!({"s": "hello", "b": b64(&[0, 255, 10]), "i": "42", "f": "1.5", "n": "123.456000000",
                   "bo": "true", "d": "2024-02-29", "t": "12:34:56.789000",
                   "dt": "2024-01-02T03:04:05.123456", "ts": "1695615000500000", "j": "{\"a\":[1,2]}",
                   "r": ["1", "2", "3"], "rec": {"x": "in", "y": "7"},
                   "recs": [{"x": "a", "z": "0.5"}, {"x": "b", "z": null}]}),
        ),
        (
            // Only the REQUIRED column: NULLs, empty arrays.
            "b".to_string(),
            json!({"s": "žluťoučký kůň 🐴"}),
            json!({"s": "žluťoučký kůň 🐴", "b": null, "i": null, "f": null, "n": null, "bo": null,
                   "d": null, "t": null, "dt": null, "ts": null, "j": null, "r": [], "rec": null,
                   "recs": []}),
        ),
        (
            // Extremes and the other accepted forms: integer timestamps (µs), numeric strings.
            "c".to_string(),
            json!({"s": "", "b": "", "i": -9223372036854775807_i64, "f": -0.25,
                   "n": "-99999999999999999999999999999.999999999", "bo": false, "d": "0001-01-01",
                   "t": "23:59:59.999999", "dt": "9999-12-31T23:59:59.999999", "ts": 0,
                   "j": "\"text\"", "r": [], "rec": {"y": -1}, "recs": []}),
            json!({"s": "", "b": "", "i": "-9223372036854775807", "f": "-0.25",
                   "n": "-99999999999999999999999999999.999999999", "bo": "false", "d": "0001-01-01",
                   "t": "23:59:59.999999", "dt": "9999-12-31T23:59:59.999999", "ts": "0",
                   "j": "\"text\"", "r": [], "rec": {"x": null, "y": "-1"}, "recs": []}),
        ),
    ];
    let bad = vec![
        ("no-required".to_string(), json!({"i": 1})),
        ("unknown-field".to_string(), json!({"s": "x", "zzz": 1})),
        (
            "bad-int".to_string(),
            json!({"s": "x", "i": "not a number"}),
        ),
        (
            "record-missing-required".to_string(),
            json!({"s": "x", "rec": {"x": "no y"}}),
        ),
    ];
    (good, bad)
}

#[test]
fn file_source_writes_every_type_and_failures_are_dead_lettered() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    bq.table("types", "every", every_type_fields());
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        &format!("{BQ_PROJECT}.types.every"),
        json!({"useTableSchema": true, "writeMetadata": true}),
        json!({}),
    );
    let (good, bad) = every_type_messages();
    let mut lines = Vec::new();
    for (id, payload, _) in &good {
        lines.push(line(id, payload.to_string().as_bytes(), json!({"k": id})));
    }
    for (id, payload) in &bad {
        lines.push(line(id, payload.to_string().as_bytes(), json!({})));
    }
    let input = dir.path().join("in.ndjson");
    write_input(&input, &lines);
    let dl = dir.path().join("dead.ndjson");
    // `bigquery` alone: the table bigqueryConfig.table names; its schema from tables.get.
    let out = run_file(
        &cfg,
        &input,
        "bigquery",
        &["--dead-letter", dl.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let s = summary(&out);
    assert_eq!(s["messages_written"], 3, "{s}");
    assert_eq!(s["messages_dead_lettered"], 4, "{s}");

    let rows = bq.rows("types", "every", "message_id");
    assert_eq!(rows.len(), 3, "{rows:?}");
    for ((id, _, want), got) in good.iter().zip(&rows) {
        let mut want = want.clone();
        want["subscription_name"] = json!(SUB_NAME);
        want["message_id"] = json!(id);
        want["publish_time"] = json!("1695615000250000");
        want["attributes"] = json!(format!("{{\"k\":\"{id}\"}}"));
        assert_eq!(got, &want, "row of message {id}");
    }
    // The four that cannot be rows: dead-lettered after the subscription's 5 attempts (the
    // default without a policy), with the field and the rule.
    let dead: Vec<Value> = std::fs::read_to_string(&dl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut ids: Vec<&str> = dead
        .iter()
        .map(|d| d["messageId"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "bad-int",
            "no-required",
            "record-missing-required",
            "unknown-field"
        ]
    );
    for d in &dead {
        let a = &d["attributes"];
        assert_eq!(a["CloudPubSubDeadLetterSourceDeliveryCount"], "5", "{d}");
        assert!(
            a["CloudPubSubDeadLetterSourceDeliveryErrorMessage"]
                .as_str()
                .unwrap()
                .contains("field `"),
            "{d}"
        );
    }
}

/// Every column type through the protobuf rows of a keyed table (change data capture, issue 35):
/// the every-type messages into a table keyed on its REQUIRED STRING column `s` (each given
/// `_CHANGE_TYPE` UPSERT). The emulator stores every change as a row, so
/// it must hold the same values as the Arrow path stores (the test above); the requests must be
/// protobuf rows with the descriptor of the Storage Write API's type mapping.
#[test]
fn every_type_through_protobuf_rows_of_a_keyed_table() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    bq.table("types", "every_keyed", every_type_fields());
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "x.y.z",
        json!({"useTableSchema": true, "writeMetadata": true}),
        json!({}),
    );
    let (good, bad) = every_type_messages();
    // Each an UPSERT: a keyed table's change requires its `_CHANGE_TYPE` (issue 43).
    let upsert = |p: &Value| {
        let mut p = p.clone();
        p["_CHANGE_TYPE"] = json!("UPSERT");
        p
    };
    let mut lines = Vec::new();
    for (id, payload, _) in &good {
        lines.push(line(
            id,
            upsert(payload).to_string().as_bytes(),
            json!({"k": id}),
        ));
    }
    for (id, payload) in &bad {
        lines.push(line(id, upsert(payload).to_string().as_bytes(), json!({})));
    }
    let input = dir.path().join("in.ndjson");
    write_input(&input, &lines);
    let dl = dir.path().join("dead.ndjson");
    let proxy = util::record::RecordProxy::start(bq.grpc_port);
    let out = subsink()
        .args(["run", "--subscription"])
        .arg(&cfg)
        .arg("--source")
        .arg(&input)
        .args(["--table-url", &bq.url("types", "every_keyed")])
        .arg("--dead-letter")
        .arg(&dl)
        .args(["--bigquery-endpoint", &bq.rest()])
        .args(["--bigquery-storage-endpoint", &proxy.endpoint()])
        .args(["--table-primary-key", "s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let s = summary(&out);
    assert_eq!(s["messages_written"], 3, "{s}");
    assert_eq!(s["messages_dead_lettered"], 4, "{s}");

    let stream =
        format!("projects/{BQ_PROJECT}/datasets/types/tables/every_keyed/streams/_default");
    let (decoded, _) = sent_proto_rows(&proxy.requests(), &stream, dir.path());
    let f = |name: &str, n: u32, ty: &str, label: &str, tn: &str| json!([name, n, ty, label, tn]);
    let opt = "LABEL_OPTIONAL";
    let want_fields = json!([
        f("s", 1, "TYPE_STRING", opt, ""),
        f("b", 2, "TYPE_BYTES", opt, ""),
        f("i", 3, "TYPE_INT64", opt, ""),
        f("f", 4, "TYPE_DOUBLE", opt, ""),
        f("n", 5, "TYPE_STRING", opt, ""),
        f("bo", 6, "TYPE_BOOL", opt, ""),
        f("d", 7, "TYPE_INT32", opt, ""),
        f("t", 8, "TYPE_STRING", opt, ""),
        f("dt", 9, "TYPE_STRING", opt, ""),
        f("ts", 10, "TYPE_INT64", opt, ""),
        f("j", 11, "TYPE_STRING", opt, ""),
        f("r", 12, "TYPE_INT64", "LABEL_REPEATED", ""),
        f("rec", 13, "TYPE_MESSAGE", opt, "__ROOT__1"),
        f("recs", 14, "TYPE_MESSAGE", "LABEL_REPEATED", "__ROOT__2"),
        f("subscription_name", 15, "TYPE_STRING", opt, ""),
        f("message_id", 16, "TYPE_STRING", opt, ""),
        f("publish_time", 17, "TYPE_INT64", opt, ""),
        f("attributes", 18, "TYPE_STRING", opt, ""),
        f("_CHANGE_TYPE", 19, "TYPE_STRING", opt, ""),
        f("_CHANGE_SEQUENCE_NUMBER", 20, "TYPE_STRING", opt, ""),
    ]);
    let want_nested = json!([
        [
            "__ROOT__1",
            [
                f("x", 1, "TYPE_STRING", opt, ""),
                f("y", 2, "TYPE_INT64", opt, "")
            ]
        ],
        [
            "__ROOT__2",
            [
                f("x", 1, "TYPE_STRING", opt, ""),
                f("z", 2, "TYPE_DOUBLE", opt, "")
            ]
        ],
    ]);
    // The values as the Storage Write API's mapping has them: NUMERIC exact text, DATE days,
    // TIME and DATETIME text, TIMESTAMP µs; NULLs and empty lists absent.
    let meta = |id: &str| {
        json!({"subscription_name": SUB_NAME, "message_id": id,
               "publish_time": 1695615000250000_i64, "attributes": format!("{{\"k\":\"{id}\"}}"),
               "_CHANGE_TYPE": "UPSERT"})
    };
    let mut want_rows = vec![
        json!({"s": "hello", "b": b64(&[0, 255, 10]), "i": 42, "f": 1.5, "n": "123.456",
               "bo": true, "d": 19782, "t": "12:34:56.789000", "dt": "2024-01-02 03:04:05.123456",
               "ts": 1695615000500000_i64, "j": "{\"a\":[1,2]}", "r": [1, 2, 3],
               "rec": {"x": "in", "y": 7}, "recs": [{"x": "a", "z": 0.5}, {"x": "b"}]}),
        json!({"s": "žluťoučký kůň 🐴"}),
        json!({"s": "", "b": "", "i": -9223372036854775807_i64, "f": -0.25,
               "n": "-99999999999999999999999999999.999999999", "bo": false, "d": -719162,
               "t": "23:59:59.999999", "dt": "9999-12-31 23:59:59.999999", "ts": 0,
               "j": "\"text\"", "rec": {"y": -1}}),
    ];
    for (r, id) in want_rows.iter_mut().zip(["a", "b", "c"]) {
        for (k, v) in meta(id).as_object().unwrap() {
            r[k] = v.clone();
        }
    }
    let mut sent = Vec::new();
    for d in &decoded {
        assert_eq!(d["name"], "Row", "{d}");
        assert_eq!(d["fields"], want_fields, "{d}");
        assert_eq!(d["nested"], want_nested, "{d}");
        sent.extend(d["rows"].as_array().unwrap().iter().cloned());
    }
    assert_eq!(sent, want_rows, "the rows sent, in order");

    // What the emulator stored: the same values as through Arrow rows.
    let rows = bq.rows("types", "every_keyed", "message_id");
    assert_eq!(rows.len(), 3, "{rows:?}");
    for ((id, _, want), got) in good.iter().zip(&rows) {
        let mut want = want.clone();
        want["subscription_name"] = json!(SUB_NAME);
        want["message_id"] = json!(id);
        want["publish_time"] = json!("1695615000250000");
        want["attributes"] = json!(format!("{{\"k\":\"{id}\"}}"));
        assert_eq!(got, &want, "row of message {id}");
    }
}

/// Protobuf rows (a keyed table) are split like Arrow rows: three rows of 3.5 MiB gather into one
/// batch (8 MiB of message bytes close it) whose request would be past 9.5 MiB, so it goes as two
/// requests, of 1 and 2 rows; every row lands once.
#[test]
fn protobuf_rows_past_the_request_limit_are_split() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    bq.dataset("cdcsplit");
    bq.table(
        "cdcsplit",
        "big",
        json!([{"name": "id", "type": "INT64", "mode": "REQUIRED"}, {"name": "v", "type": "STRING"}]),
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "x.y.z",
        json!({"useTableSchema": true}),
        json!({}),
    );
    let big = "x".repeat(7 << 19);
    let lines: Vec<String> = (1..=3)
        .map(|i| {
            let payload = json!({"id": i, "v": big, "_CHANGE_TYPE": "UPSERT"}).to_string();
            line(&format!("m{i}"), payload.as_bytes(), json!({}))
        })
        .collect();
    let input = dir.path().join("in.ndjson");
    write_input(&input, &lines);
    let proxy = util::record::RecordProxy::start(bq.grpc_port);
    let out = subsink()
        .args(["run", "--subscription"])
        .arg(&cfg)
        .arg("--source")
        .arg(&input)
        .args(["--table-url", &bq.url("cdcsplit", "big")])
        .args(["--bigquery-endpoint", &bq.rest()])
        .args(["--bigquery-storage-endpoint", &proxy.endpoint()])
        .args(["--table-primary-key", "id"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(summary(&out)["messages_written"], 3);
    use util::record::{proto_field, proto_fields, proto_numbers};
    let counts: Vec<usize> = proxy
        .requests()
        .iter()
        .map(|req| {
            assert_eq!(proto_numbers(req), [1, 4], "protobuf rows only");
            let data = proto_field(req, 4).unwrap().bytes();
            proto_fields(proto_field(data, 2).unwrap().bytes()).len()
        })
        .collect();
    assert_eq!(counts, [1, 2], "rows per request");
    let ids: Vec<Value> = bq
        .rows("cdcsplit", "big", "id")
        .iter()
        .map(|r| {
            assert_eq!(r["v"].as_str().map(str::len), Some(big.len()));
            r["id"].clone()
        })
        .collect();
    assert_eq!(ids, [json!("1"), json!("2"), json!("3")]);
}

#[test]
fn no_schema_data_column_and_metadata() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    bq.table(
        "plain",
        "data_bytes",
        with_metadata(json!([{"name": "data", "type": "BYTES"}]), "STRING"),
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "unused.ds.t",
        json!({"writeMetadata": true}),
        json!({}),
    );
    let input = dir.path().join("in.ndjson");
    let payloads: Vec<Vec<u8>> = vec![b"plain text".to_vec(), vec![0, 1, 2, 255], b"{}".to_vec()];
    let lines: Vec<String> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            json!({"data": b64(p), "messageId": format!("m{i}"), "publishTime": "2023-09-25T04:10:00Z",
                   "orderingKey": if i == 1 { "key" } else { "" }, "attributes": {"n": i.to_string()}})
            .to_string()
        })
        .collect();
    write_input(&input, &lines);
    let out = run_file(&cfg, &input, &bq.url("plain", "data_bytes"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows = bq.rows("plain", "data_bytes", "message_id");
    assert_eq!(rows.len(), 3);
    for (i, (p, r)) in payloads.iter().zip(&rows).enumerate() {
        assert_eq!(r["data"], json!(b64(p)), "{r}");
        assert_eq!(r["message_id"], json!(format!("m{i}")));
        assert_eq!(r["publish_time"], "1695615000000000");
        assert_eq!(r["subscription_name"], SUB_NAME);
        let attrs = if i == 1 {
            "{\"n\":\"1\",\"ordering_key\":\"key\"}".to_string()
        } else {
            format!("{{\"n\":\"{i}\"}}")
        };
        assert_eq!(r["attributes"], json!(attrs));
    }
}

#[test]
fn startup_checks_run_against_the_table_from_tables_get() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    bq.table(
        "checks",
        "events",
        json!([{"name": "id", "type": "INT64", "mode": "REQUIRED"}, {"name": "name", "type": "STRING"},
               {"name": "message_id", "type": "STRING"}]),
    );
    let dir = tempfile::tempdir().unwrap();
    let url = bq.url("checks", "events");
    let input = dir.path().join("in.ndjson");
    write_input(&input, &[line("1", b"x", json!({}))]);

    // No-schema mode and writeMetadata: a BigQuery table is not extended with `data` or the
    // metadata columns, as a Delta table is; Pub/Sub refuses such a subscription.
    let cfg = config(
        dir.path(),
        "x.y.z",
        json!({"writeMetadata": true}),
        json!({}),
    );
    let out = run_file(&cfg, &input, &url, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    for col in [
        "`data`",
        "`subscription_name`",
        "`publish_time`",
        "`attributes`",
    ] {
        assert!(err.contains(col), "{err}");
    }
    assert!(!err.contains("`message_id`"), "{err}");

    // use_topic_schema: every incompatibility of the topic schema with the table read by
    // tables.get is listed.
    let avsc = dir.path().join("topic.avsc");
    std::fs::write(
        &avsc,
        json!({"type": "record", "name": "E", "fields": [
            {"name": "id", "type": ["null", "long"]},
            {"name": "name", "type": "boolean"}]})
        .to_string(),
    )
    .unwrap();
    let cfg = config(
        dir.path(),
        "x.y.z",
        json!({"useTopicSchema": true}),
        json!({}),
    );
    let out = run_file(
        &cfg,
        &input,
        &url,
        &["--topic-schema", avsc.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("id") && err.contains("name"), "{err}");
    assert!(err.contains("REQUIRED") && err.contains("boolean"), "{err}");

    // A table that does not exist.
    let out = run_file(
        &cfg,
        &input,
        &bq.url("checks", "absent"),
        &["--topic-schema", avsc.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
}

#[test]
fn rows_the_server_rejects_fail_alone_and_large_requests_are_split() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    // The table says INT64; the schema given to subsink says STRING (drift): the server rejects
    // the rows whose text is not a number, and only those.
    bq.table(
        "rejects",
        "t",
        json!([{"name": "id", "type": "STRING"}, {"name": "n", "type": "INT64"},
               {"name": "payload", "type": "STRING"}]),
    );
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        json!([{"name": "id", "type": "STRING"}, {"name": "n", "type": "STRING"},
               {"name": "payload", "type": "STRING"}])
        .to_string(),
    )
    .unwrap();
    let cfg = config(
        dir.path(),
        "x.y.z",
        json!({"useTableSchema": true}),
        json!({}),
    );
    // 12 rows of 2.5 MiB: four make one 10 MiB batch, past the request limit: split in halves.
    // Row 9 alone is a 9.5 MiB request: it cannot be sent, and fails alone.
    let big = "x".repeat(5 << 19);
    let mut lines = Vec::new();
    for i in 0..12 {
        let n = if i == 3 || i == 7 {
            "not a number".to_string()
        } else {
            (i * 10).to_string()
        };
        let payload = if i == 9 {
            "y".repeat(19 << 19)
        } else {
            big.clone()
        };
        let p = json!({"id": format!("r{i:02}"), "n": n, "payload": payload}).to_string();
        lines.push(line(&format!("r{i:02}"), p.as_bytes(), json!({})));
    }
    let input = dir.path().join("in.ndjson");
    write_input(&input, &lines);
    let cp = dir.path().join("cp.json");
    let url = bq.url("rejects", "t");
    let out = subsink()
        .env("SUBSINK_LOG", "subsink=debug")
        .args(["run", "--subscription"])
        .arg(&cfg)
        .arg("--source")
        .arg(&input)
        .args(["--table-url", &url, "--table-schema"])
        .arg(&schema)
        .arg("--checkpoint")
        .arg(&cp)
        .args(shared_bq().flags())
        .output()
        .unwrap();
    let err = stderr(&out);
    // Not done without a dead-letter file: exit 1, listed, kept in the checkpoint.
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("request past the limit: split in halves"),
        "{err}"
    );
    let s = summary(&out);
    assert_eq!(s["messages_written"], 9, "{s}");
    let mut failed: Vec<&str> = s["failed_messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["message_id"].as_str().unwrap())
        .collect();
    failed.sort();
    assert_eq!(failed, ["r03", "r07", "r09"], "{s}");
    for f in s["failed_messages"].as_array().unwrap() {
        assert!(
            f["error"]
                .as_str()
                .unwrap()
                .contains("BigQuery rejected its row"),
            "{f}"
        );
    }
    assert!(
        s["failed_messages"]
            .to_string()
            .contains("10 MB request limit"),
        "{s}"
    );
    let ids = |bq: &util::bigquery::Bq| -> Vec<String> {
        bq.query("SELECT id, n FROM `subsink-bq.rejects.t` ORDER BY id")
            .iter()
            .map(|r| format!("{}={}", r["id"].as_str().unwrap(), r["n"].as_str().unwrap()))
            .collect()
    };
    let want: Vec<String> = (0..12)
        .filter(|i| ![3, 7, 9].contains(i))
        .map(|i| format!("r{i:02}={}", i * 10))
        .collect();
    assert_eq!(ids(bq), want);

    // The rerun with a dead-letter file writes nothing twice and dead-letters the three.
    let dl = dir.path().join("dead.ndjson");
    let out = subsink()
        .args(["run", "--subscription"])
        .arg(&cfg)
        .arg("--source")
        .arg(&input)
        .args(["--table-url", &url, "--table-schema"])
        .arg(&schema)
        .arg("--checkpoint")
        .arg(&cp)
        .arg("--dead-letter")
        .arg(&dl)
        .args(shared_bq().flags())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let s = summary(&out);
    assert_eq!(s["messages_written"], 0, "{s}");
    assert_eq!(s["messages_dead_lettered"], 3, "{s}");
    assert_eq!(ids(bq), want);
    let dead = std::fs::read_to_string(&dl).unwrap();
    assert_eq!(dead.lines().count(), 3);
    assert!(
        dead.contains("\"CloudPubSubDeadLetterSourceDeliveryCount\":\"2\""),
        "{}",
        &dead[..300]
    );
}

#[test]
fn exactly_once_kill_9_and_resume_writes_every_row_once() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    bq.table(
        "exactly",
        "t",
        with_metadata(json!([{"name": "data", "type": "STRING"}]), "JSON"),
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "x.y.z",
        json!({"writeMetadata": true}),
        json!({"subsink": {"limits": "extended", "table": {"maxMessages": "100"}}}),
    );
    let n = 20000;
    let lines: Vec<String> = (0..n)
        .map(|i| {
            line(
                &format!("{i:05}"),
                format!("message {i}").as_bytes(),
                json!({}),
            )
        })
        .collect();
    let input = dir.path().join("in.ndjson");
    write_input(&input, &lines);
    let cp = dir.path().join("cp.json");
    let url = bq.url("exactly", "t");
    let cmd = || {
        let mut c = subsink();
        c.args([
            "run",
            "--exactly-once",
            "--max-concurrent-uploads",
            "2",
            "--subscription",
        ])
        .arg(&cfg)
        .arg("--source")
        .arg(&input)
        .args(["--table-url", &url, "--checkpoint"])
        .arg(&cp)
        .args(shared_bq().flags())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        c
    };
    let mut seed = 0x5eed_u64;
    let mut last = 0;
    let total = std::fs::metadata(&input).unwrap().len();
    for round in 0..4 {
        let child = spawn_draining(&mut cmd());
        last = kill_after_progress(
            child,
            &cp,
            last,
            &mut seed,
            KillTiming {
                limit: Duration::from_secs(120),
                every: Duration::from_millis(5),
                jitter_ms: 150,
            },
            &format!("round {round}"),
        );
        if last >= total * 9 / 10 {
            break;
        }
    }
    let out = cmd().output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Aggregates: a query answer holds at most 10,000 rows.
    let twice = bq.query(
        "SELECT message_id, COUNT(*) AS c FROM `subsink-bq.exactly.t` GROUP BY message_id HAVING c > 1",
    );
    assert!(twice.is_empty(), "rows written twice: {twice:?}");
    let counts = bq.query(
        "SELECT COUNT(*) AS rows, COUNT(DISTINCT message_id) AS ids, \
         COUNTIF(data != CONCAT('message ', CAST(CAST(message_id AS INT64) AS STRING))) AS wrong \
         FROM `subsink-bq.exactly.t`",
    );
    assert_eq!(
        counts,
        [json!({"rows": n.to_string(), "ids": n.to_string(), "wrong": "0"})],
        "every message once, with its data"
    );
}

#[test]
fn pubsub_source_into_bigquery() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    bq.table(
        "pubsub",
        "events",
        with_metadata(
            json!([{"name": "id", "type": "INT64", "mode": "REQUIRED"}, {"name": "name", "type": "STRING"}]),
            "JSON",
        ),
    );
    let env = util::pubsub::PubsubEnv::start();
    let topic = util::pubsub::topic("events");
    let sub = util::pubsub::sub("to-bq");
    let dlq = util::pubsub::topic("dead");
    let mut spec = subsink::pubsub::SubscriptionSpec::new(&sub, &topic);
    spec.dead_letter = Some((dlq.clone(), 5));
    env.topic_and_sub(spec);
    env.subscribe(&util::pubsub::sub("dead-sub"), &dlq);
    let mut msgs = Vec::new();
    for i in 0..30 {
        let payload = if i == 4 || i == 17 {
            json!({"name": "no id"})
        } else {
            json!({"id": i, "name": format!("n{i}")})
        };
        msgs.push(subsink::message::Message {
            data: payload.to_string().into_bytes().into(),
            attributes: [("i".to_string(), i.to_string())].into_iter().collect(),
            ..Default::default()
        });
    }
    let ids = env.publish(&topic, &msgs);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = json!({
        "name": sub, "topic": topic, "ackDeadlineSeconds": 10,
        "subsink": {"limits": "extended", "table": {"maxDuration": "1s"}},
        "deadLetterPolicy": {"deadLetterTopic": dlq, "maxDeliveryAttempts": 5},
        "bigqueryConfig": {"table": format!("{BQ_PROJECT}.pubsub.events"), "useTableSchema": true,
                           "writeMetadata": true},
    });
    cfg["name"] = json!(sub);
    let cfg_path = dir.path().join("sub.json");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let child = subsink()
        .env("PUBSUB_EMULATOR_HOST", env.emu.host())
        .args(["run", "--source", "pubsub", "--subscription"])
        .arg(&cfg_path)
        .args(["--table-url", &bq.url("pubsub", "events")])
        .args(bq.flags())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let rows = loop {
        let rows = bq.rows("pubsub", "events", "id");
        if rows.len() >= 28 || start.elapsed() > Duration::from_secs(60) {
            break rows;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    // Both failing messages reach the dead-letter topic after their 5 deliveries.
    let mut dead = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(90) {
        dead.extend(env.drain(&util::pubsub::sub("dead-sub"), Duration::from_secs(2)));
        let distinct: std::collections::BTreeSet<&str> =
            dead.iter().map(|m| &m.attributes["i"]).collect();
        if distinct.len() >= 2 {
            break;
        }
    }
    let (s, err) = terminate(child, Duration::from_secs(30));
    assert_eq!(rows.len(), 28, "{err}");
    for r in &rows {
        let i: usize = r["id"].as_str().unwrap().parse().unwrap();
        assert_eq!(r["name"], json!(format!("n{i}")));
        assert_eq!(r["message_id"], json!(ids[i]));
        assert_eq!(r["subscription_name"], json!(sub));
        assert_eq!(r["attributes"], json!(format!("{{\"i\":\"{i}\"}}")));
    }
    let mut dead_i: Vec<String> = dead.iter().map(|m| m.attributes["i"].to_string()).collect();
    dead_i.sort();
    dead_i.dedup();
    assert_eq!(dead_i, ["17", "4"], "{s}");
    assert!(s["messages_acked"].as_u64().unwrap() >= 28, "{s}");
}

/// `n` NDJSON lines, ids `00000`…, data `message {i}`.
fn numbered_lines(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            line(
                &format!("{i:05}"),
                format!("message {i}").as_bytes(),
                json!({}),
            )
        })
        .collect()
}

/// `(rows, distinct message ids)` of `ds.t`.
fn row_counts(bq: &util::bigquery::Bq, ds: &str, t: &str) -> (u64, u64) {
    let v = bq.query(&format!(
        "SELECT COUNT(*) AS rows, COUNT(DISTINCT message_id) AS ids FROM `{BQ_PROJECT}.{ds}.{t}`"
    ));
    let n = |k: &str| v[0][k].as_str().unwrap().parse().unwrap();
    (n("rows"), n("ids"))
}

/// The control run of `exactly_once_kill_9_and_resume_writes_every_row_once`: a worker killed
/// after BigQuery appended its rows and before the answer reached it — the answer held back by a
/// proxy — resumes from its checkpoint. On the default stream the append is sent again and every
/// row is there twice (at least once, as documented); with `--exactly-once` the rows of the killed
/// run were on a PENDING stream never committed, and each row is there once.
#[test]
fn a_kill_between_append_and_its_answer_writes_rows_twice_only_without_exactly_once() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    let n = 2000u64;
    for (exactly_once, t) in [(false, "twice"), (true, "once")] {
        bq.table(
            "held",
            t,
            with_metadata(json!([{"name": "data", "type": "STRING"}]), "JSON"),
        );
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(
            dir.path(),
            "x.y.z",
            json!({"writeMetadata": true}),
            json!({}),
        );
        let input = dir.path().join("in.ndjson");
        write_input(&input, &numbered_lines(n as usize));
        let cp = dir.path().join("cp.json");
        let url = bq.url("held", t);
        let run = |storage: &str| {
            let mut c = subsink();
            c.args(["run", "--subscription"])
                .arg(&cfg)
                .arg("--source")
                .arg(&input)
                .args(["--table-url", &url, "--checkpoint"])
                .arg(&cp)
                .args(["--bigquery-endpoint", &bq.rest()])
                .args(["--bigquery-storage-endpoint", storage])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if exactly_once {
                c.arg("--exactly-once");
            }
            c
        };
        // One batch of 2000 rows, one AppendRows request of ~100 KB: the proxy holds the answer
        // to the first request past 20 KB (the stream's creation and the call's opening are
        // smaller).
        let proxy = util::hold::HoldProxy::start(bq.grpc_port);
        proxy.hold_answer_after(20_000);
        let child = spawn_draining(&mut run(&proxy.endpoint()));
        proxy.wait_held(Duration::from_secs(60));
        // BigQuery has the rows: visible on the default stream, waiting for the commit on a
        // PENDING one.
        let (rows, _) = row_counts(bq, "held", t);
        assert_eq!(
            rows,
            if exactly_once { 0 } else { n },
            "rows visible with the answer held (exactly once: {exactly_once})"
        );
        let err = kill_9(child);
        drop(proxy);
        assert_eq!(
            checkpoint_offset(&cp).unwrap_or(0),
            0,
            "the killed run settled nothing: {err}"
        );
        let out = run(&bq.grpc()).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let (rows, ids) = row_counts(bq, "held", t);
        assert_eq!(ids, n, "every message is in the table");
        if exactly_once {
            assert_eq!(rows, n, "with --exactly-once no row is written twice");
        } else {
            assert_eq!(
                rows,
                2 * n,
                "without --exactly-once the held batch is written twice"
            );
        }
    }
}

/// Transient failures of the Storage Write API are retried on a new call: connections refused
/// while the first append is due, then an `AppendRows` call broken after BigQuery appended the
/// request and before its answer came (with `--exactly-once` the retry carries the same offset
/// and BigQuery drops it as already written: each row once). Both runs exit 0.
#[test]
fn transient_failures_a_refused_connection_and_a_broken_call_are_retried() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    let n = 2000u64;
    for (exactly_once, t) in [(false, "refused"), (true, "broken")] {
        bq.table(
            "retry",
            t,
            with_metadata(json!([{"name": "data", "type": "STRING"}]), "JSON"),
        );
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(
            dir.path(),
            "x.y.z",
            json!({"writeMetadata": true}),
            json!({}),
        );
        let input = dir.path().join("in.ndjson");
        write_input(&input, &numbered_lines(n as usize));
        let proxy = util::hold::HoldProxy::start(bq.grpc_port);
        let mut c = subsink();
        c.env("SUBSINK_LOG", "subsink=warn")
            .args(["run", "--subscription"])
            .arg(&cfg)
            .arg("--source")
            .arg(&input)
            .args(["--table-url", &bq.url("retry", t)])
            .args(["--bigquery-endpoint", &bq.rest()])
            .args(["--bigquery-storage-endpoint", &proxy.endpoint()])
            .stdout(Stdio::piped());
        if exactly_once {
            // The PENDING stream is made when the batch opens; the break comes on its append.
            c.arg("--exactly-once");
            proxy.hold_answer_after(20_000);
        } else {
            proxy.refuse(true);
        }
        let child = spawn_draining(&mut c);
        if exactly_once {
            proxy.wait_held(Duration::from_secs(60));
            proxy.break_all();
        } else {
            poll(
                Duration::from_secs(60),
                Duration::from_millis(20),
                || match proxy.refused() {
                    r if r >= 2 => Ok(()),
                    r => Err(format!("{r} connections refused")),
                },
            );
            proxy.refuse(false);
        }
        let out = output(child);
        let err = stderr(&out);
        assert!(out.status.success(), "exactly once {exactly_once}: {err}");
        assert!(err.contains("append failed; retrying"), "{err}");
        assert_eq!(
            row_counts(bq, "retry", t),
            (n, n),
            "every row once (exactly once: {exactly_once})"
        );
    }
}

/// A REST call to the emulator: (HTTP status, the answer as JSON). Unlike `Bq::query`, the
/// answer's `errors` are kept (the emulator answers a failed query with 200 and `errors`).
fn bq_rest(method: &str, path: &str, body: Value) -> (u16, Value) {
    let url = format!(
        "{}/bigquery/v2/projects/{BQ_PROJECT}/{path}",
        shared_bq().rest()
    );
    rt().block_on(async {
        let c = reqwest::Client::new();
        let req = match method {
            "POST" => c.post(&url).body(body.to_string()),
            _ => c.get(&url),
        };
        let resp = req
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    })
}

/// An HTTP/1.1 proxy in front of the emulator's REST port whose `tables.get` answers carry
/// `tableConstraints` — what BigQuery returns for a table with a primary key and the emulator
/// does not keep. Every other byte of the answer is the emulator's. Returns its endpoint and the
/// paths it was asked for.
fn rest_with_constraints(
    constraints: Value,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let asked: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let log = asked.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            // One request per connection (answered with `connection: close`), no body (GET).
            let mut head = Vec::new();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            loop {
                let mut l = String::new();
                if reader.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
                    break;
                }
                head.push(l);
            }
            let Some(first) = head.first() else { continue };
            let mut parts = first.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            log.lock().unwrap().push(format!("{method} {path}"));
            assert_eq!(method, "GET", "only tables.get is expected: {first}");
            let (status, mut v) = rt().block_on(async {
                let resp = reqwest::get(format!("{}{path}", shared_bq().rest()))
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                let bytes = resp.bytes().await.unwrap();
                (status, serde_json::from_slice::<Value>(&bytes).unwrap())
            });
            if status == 200 && path.contains("/tables/") {
                v["tableConstraints"] = constraints.clone();
            }
            let body = v.to_string();
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (format!("http://127.0.0.1:{port}"), asked)
}

/// Reads the protobuf rows cut out of AppendRows requests (a JSON file: per request, its
/// `ProtoSchema` descriptor and its serialized rows, base64): the descriptor's fields (name,
/// number, type, label, type name) and nested types, and each row decoded with that descriptor,
/// by Google's `protobuf` package (nobody here wrote it). A row holds only its present fields
/// (a NULL is an absent field); bytes come back base64.
const PROTO_READER: &str = r#"
import base64, json, sys
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
F = descriptor_pb2.FieldDescriptorProto
def fields(d):
    return [[f.name, f.number, F.Type.Name(f.type), F.Label.Name(f.label), f.type_name] for f in d.field]
def conv(m):
    out = {}
    for f, v in m.ListFields():
        def one(x):
            if f.type == f.TYPE_MESSAGE:
                return conv(x)
            if f.type == f.TYPE_BYTES:
                return base64.b64encode(x).decode()
            return x
        out[f.name] = [one(x) for x in v] if f.is_repeated else one(v)
    return out
res = []
for r in json.load(open(sys.argv[1])):
    dp = descriptor_pb2.DescriptorProto.FromString(base64.b64decode(r["descriptor"]))
    fp = descriptor_pb2.FileDescriptorProto(name="rows.proto", syntax="proto2")
    fp.message_type.add().CopyFrom(dp)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fp)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(dp.name))
    res.append({"name": dp.name, "fields": fields(dp),
                "nested": [[n.name, fields(n)] for n in dp.nested_type],
                "rows": [conv(cls.FromString(base64.b64decode(x))) for x in r["rows"]]})
print(json.dumps(res))
"#;

/// The AppendRows requests a recording proxy saw, each checked to name `stream` and to carry
/// protobuf rows and nothing else (AppendRowsRequest: 1 write_stream, 4 proto_rows {1
/// writer_schema {1 proto_descriptor}, 2 rows {1 serialized_rows, repeated}}), decoded by
/// [`PROTO_READER`]; with the raw rows of each, for byte checks.
fn sent_proto_rows(
    requests: &[Vec<u8>],
    stream: &str,
    dir: &Path,
) -> (Vec<Value>, Vec<Vec<Vec<u8>>>) {
    use util::record::{proto_field, proto_fields, proto_numbers};
    assert!(!requests.is_empty(), "no gRPC request recorded");
    let mut listed = Vec::new();
    let mut raw = Vec::new();
    for (i, req) in requests.iter().enumerate() {
        assert_eq!(
            proto_numbers(req),
            [1, 4],
            "request {i}: protobuf rows only"
        );
        assert_eq!(
            proto_field(req, 1).map(|f| f.bytes()),
            Some(stream.as_bytes()),
            "request {i}"
        );
        let data = proto_field(req, 4).unwrap().bytes();
        assert_eq!(
            proto_numbers(data),
            [1, 2],
            "request {i}: writer_schema, rows"
        );
        let schema = proto_field(data, 1).unwrap().bytes();
        assert_eq!(proto_numbers(schema), [1], "request {i}: proto_descriptor");
        let descriptor = proto_field(schema, 1).unwrap().bytes();
        let rows: Vec<Vec<u8>> = proto_fields(proto_field(data, 2).unwrap().bytes())
            .into_iter()
            .map(|(n, v)| {
                assert_eq!(n, 1, "request {i}: ProtoRows holds serialized_rows only");
                v.bytes().to_vec()
            })
            .collect();
        listed.push(json!({"descriptor": b64(descriptor),
                           "rows": rows.iter().map(|r| b64(r)).collect::<Vec<_>>()}));
        raw.push(rows);
    }
    let file = dir.join("sent.json");
    std::fs::write(&file, Value::Array(listed).to_string()).unwrap();
    let decoded = python_json(PROTO_READER, file.to_str().unwrap(), &[]);
    (decoded.as_array().unwrap().clone(), raw)
}

/// Change data capture into BigQuery (issue 35): a table with a primary key is appended to the
/// `_default` stream as protobuf rows (`ProtoRows`; BigQuery's CDC takes no Arrow rows) whose
/// descriptor has the table's columns and each change's `_CHANGE_TYPE` and
/// `_CHANGE_SEQUENCE_NUMBER` as two string fields — how the Storage Write API takes BigQuery's
/// CDC pseudo-columns. A recording proxy (`tests/util/record.rs`) in front of the emulator's gRPC
/// port keeps what subsink sent; the AppendRows requests are cut out of the HTTP/2 frames, the
/// exact strings looked for in their rows' bytes, and their descriptor and rows decoded by
/// Google's `protobuf` package ([`PROTO_READER`]).
///
/// Twice: the key given with `--table-primary-key` (the emulator's own `tables.get` answer), and
/// the key read from `tableConstraints.primaryKey` of the `tables.get` answer (added by a proxy,
/// as BigQuery answers for a keyed table).
///
/// What the emulator (bqemulator 1.4.0) does, asserted here: it accepts `tableConstraints` on
/// table create (200) but keeps no key (`tables.get` answers without it); it accepts the two
/// extra proto fields (an `append_result`, no error, no row errors) and drops them — it applies
/// no change: every change is stored as a plain row (the DELETEs too, with their NULL columns),
/// and the table has no `_CHANGE_TYPE` column to query. BigQuery would keep one row per key (here
/// only id 3: ids 1 and 2 are deleted) — not testable on the emulator.
#[test]
fn change_data_capture_sends_protobuf_rows_with_the_pseudo_columns() {
    let _serial = util::bigquery::serial();
    let bq = shared_bq();
    bq.dataset("cdc");
    let fields = with_metadata(
        json!([{"name": "id", "type": "INT64"}, {"name": "name", "type": "STRING"}]),
        "JSON",
    );
    let constraints = json!({"primaryKey": {"columns": ["id"]}});
    let n1f = "000000000000001F/0000000000000000/0000000000000000/0000000000000000";
    let nfffb = "0000000000000FFF/000000000000000B/0000000000000000/0000000000000000";
    let n1234 = "0000000000000001/0000000000000002/0000000000000003/ABCDEF0123456789";
    // (message id, change, the row subsink must send: id, name, _CHANGE_TYPE, number).
    let good = [
        (
            "c1",
            json!({"id": 1, "name": "one", "_CHANGE_TYPE": "UPSERT"}),
            json!([1, "one", "UPSERT", null]),
        ),
        (
            "c2",
            json!({"id": 2, "name": "two", "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": "1F"}),
            json!([2, "two", "UPSERT", n1f]),
        ),
        (
            "c3",
            json!({"id": 1, "_CHANGE_TYPE": "DELETE"}),
            json!([1, null, "DELETE", null]),
        ),
        (
            "c4",
            json!({"id": 2, "_CHANGE_TYPE": "DELETE", "_CHANGE_SEQUENCE_NUMBER": "fff/b"}),
            json!([2, null, "DELETE", nfffb]),
        ),
        (
            "c5",
            json!({"id": 3, "name": "three", "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": "1/2/3/aBcDeF0123456789"}),
            json!([3, "three", "UPSERT", n1234]),
        ),
    ];
    // Changes that fail alone, before any append (dead-lettered, never on the wire).
    let bad = [
        (
            "x1",
            json!({"id": 4, "name": "lower case", "_CHANGE_TYPE": "upsert"}),
        ),
        (
            "x2",
            json!({"id": 5, "name": "five sections", "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": "1/2/3/4/5"}),
        ),
        ("x3", json!({"name": "no key", "_CHANGE_TYPE": "DELETE"})),
        // No `_CHANGE_TYPE`: BigQuery requires it; never sent (issue 43).
        ("x4", json!({"id": 6, "name": "no change type"})),
    ];
    let lines: Vec<String> = good
        .iter()
        .map(|(id, c, _)| (id, c))
        .chain(bad.iter().map(|(id, c)| (id, c)))
        .map(|(id, c)| line(id, c.to_string().as_bytes(), json!({})))
        .collect();
    // The rows subsink must send, exactly: the present fields of each (a NULL is absent),
    // TIMESTAMP as µs since the epoch, JSON as its text.
    let want_rows: Vec<Value> = good
        .iter()
        .map(|(id, _, w)| {
            let w = w.as_array().unwrap();
            let mut r = json!({"subscription_name": SUB_NAME, "message_id": id,
                               "publish_time": 1695615000250000_i64, "attributes": "{}",
                               "id": w[0], "_CHANGE_TYPE": w[2]});
            if !w[1].is_null() {
                r["name"] = w[1].clone();
            }
            if !w[3].is_null() {
                r["_CHANGE_SEQUENCE_NUMBER"] = w[3].clone();
            }
            r
        })
        .collect();
    let opt = |name: &str, n: u32, ty: &str| json!([name, n, ty, "LABEL_OPTIONAL", ""]);
    let want_fields = json!([
        opt("id", 1, "TYPE_INT64"),
        opt("name", 2, "TYPE_STRING"),
        opt("subscription_name", 3, "TYPE_STRING"),
        opt("message_id", 4, "TYPE_STRING"),
        opt("publish_time", 5, "TYPE_INT64"),
        opt("attributes", 6, "TYPE_STRING"),
        opt("_CHANGE_TYPE", 7, "TYPE_STRING"),
        opt("_CHANGE_SEQUENCE_NUMBER", 8, "TYPE_STRING"),
    ]);

    for (table, key_from_get) in [("keyed", false), ("keyed_get", true)] {
        let (status, made) = bq_rest(
            "POST",
            "datasets/cdc/tables",
            json!({"tableReference": {"projectId": BQ_PROJECT, "datasetId": "cdc", "tableId": table},
                   "schema": {"fields": fields}, "tableConstraints": constraints}),
        );
        assert_eq!(status, 200, "{made}");
        let (status, got) = bq_rest("GET", &format!("datasets/cdc/tables/{table}"), json!({}));
        assert_eq!(status, 200, "{got}");
        assert!(
            made.get("tableConstraints").is_none() && got.get("tableConstraints").is_none(),
            "the emulator now keeps the primary key: drop the proxy and --table-primary-key\n\
             create: {made}\nget: {got}"
        );

        let dir = tempfile::tempdir().unwrap();
        let cfg = config(
            dir.path(),
            "x.y.z",
            json!({"useTableSchema": true, "writeMetadata": true}),
            json!({}),
        );
        let input = dir.path().join("in.ndjson");
        write_input(&input, &lines);
        let dl = dir.path().join("dead.ndjson");
        let proxy = util::record::RecordProxy::start(bq.grpc_port);
        let (rest, asked) = if key_from_get {
            rest_with_constraints(constraints.clone())
        } else {
            (bq.rest(), Default::default())
        };
        let mut cmd = subsink();
        cmd.args(["run", "--subscription"])
            .arg(&cfg)
            .arg("--source")
            .arg(&input)
            .args(["--table-url", &bq.url("cdc", table)])
            .arg("--dead-letter")
            .arg(&dl)
            .args(["--bigquery-endpoint", &rest])
            .args(["--bigquery-storage-endpoint", &proxy.endpoint()]);
        if !key_from_get {
            cmd.args(["--table-primary-key", "id"]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{table}: {}", stderr(&out));
        if key_from_get {
            assert_eq!(
                *asked.lock().unwrap(),
                [format!(
                    "GET /bigquery/v2/projects/{BQ_PROJECT}/datasets/cdc/tables/{table}"
                )],
                "tables.get, once, through the proxy"
            );
        }
        let s = summary(&out);
        assert_eq!(s["messages_written"], 5, "{table}: {s}");
        assert_eq!(s["messages_dead_lettered"], 4, "{table}: {s}");
        let dead: Vec<Value> = std::fs::read_to_string(&dl)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let mut why: Vec<(String, String)> = dead
            .iter()
            .map(|d| {
                (
                    d["messageId"].as_str().unwrap().to_string(),
                    d["attributes"]["CloudPubSubDeadLetterSourceDeliveryErrorMessage"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect();
        why.sort();
        assert_eq!(
            why.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
            ["x1", "x2", "x3", "x4"]
        );
        for ((id, e), field) in why.iter().zip([
            "`_CHANGE_TYPE`",
            "`_CHANGE_SEQUENCE_NUMBER`",
            "`id`",
            "`_CHANGE_TYPE`",
        ]) {
            assert!(e.contains(field), "{table} {id}: {e}");
        }

        // What went over the wire: every gRPC request was an AppendRows request on the default
        // stream with protobuf rows.
        use util::record::{proto_field, proto_numbers};
        let stream = format!("projects/{BQ_PROJECT}/datasets/cdc/tables/{table}/streams/_default");
        let requests = proxy.requests();
        let (decoded, raw) = sent_proto_rows(&requests, &stream, dir.path());
        // The exact strings, as bytes, in the rows (string fields are their UTF-8 bytes).
        let has = |hay: &[u8], s: &str| hay.windows(s.len()).any(|w| w == s.as_bytes());
        let all: Vec<u8> = raw.iter().flatten().flatten().copied().collect();
        for value in ["DELETE", "UPSERT", n1f, nfffb, n1234] {
            assert!(has(&all, value), "{table}: no {value} in the rows sent");
        }
        for not in [
            "upsert",
            "lower case",
            "five sections",
            "no key",
            "no change type",
        ] {
            assert!(!has(&all, not), "{table}: a bad change ({not}) was sent");
        }
        let mut sent = Vec::new();
        for d in &decoded {
            assert_eq!(d["name"], "Row", "{table}: {d}");
            assert_eq!(d["fields"], want_fields, "{table}: {d}");
            assert_eq!(d["nested"], json!([]), "{table}: {d}");
            sent.extend(d["rows"].as_array().unwrap().iter().cloned());
        }
        assert_eq!(sent, want_rows, "{table}: the rows sent, in order");

        // What the emulator answered: to every request an AppendRowsResponse with
        // `append_result` (1) and `write_stream` (5) — no `error` (2), no `row_errors` (4).
        let responses = proxy.responses();
        assert_eq!(
            responses.len(),
            requests.len(),
            "{table}: one answer per request"
        );
        for r in &responses {
            assert_eq!(proto_numbers(r), [1, 5], "{table}: {r:?}");
            assert_eq!(proto_field(r, 5).unwrap().bytes(), stream.as_bytes());
        }

        // What it stored: every change as a plain row, the pseudo-columns dropped, no change
        // applied (BigQuery would hold only id 3: 1 and 2 deleted).
        let (status, t) = bq_rest("GET", &format!("datasets/cdc/tables/{table}"), json!({}));
        assert_eq!(status, 200);
        let names: Vec<&str> = t["schema"]["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "id",
                "name",
                "subscription_name",
                "message_id",
                "publish_time",
                "attributes"
            ]
        );
        let rows: Vec<Value> = bq
            .rows("cdc", table, "message_id")
            .iter()
            .map(|r| json!([r["message_id"], r["id"], r["name"]]))
            .collect();
        assert_eq!(
            rows,
            [
                json!(["c1", "1", "one"]),
                json!(["c2", "2", "two"]),
                json!(["c3", "1", null]),
                json!(["c4", "2", null]),
                json!(["c5", "3", "three"]),
            ],
            "{table}: the emulator stores every change as a row"
        );
        let (status, q) = bq_rest(
            "POST",
            "queries",
            json!({"query": format!("SELECT _CHANGE_TYPE FROM `{BQ_PROJECT}.cdc.{table}`"),
                   "useLegacySql": false}),
        );
        assert_eq!(status, 200, "{q}");
        assert!(
            q["errors"][0]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("\"_CHANGE_TYPE\" not found"),
            "{table}: {q}"
        );
    }
}

/// `--exactly-once` into a BigQuery table with a primary key is refused at startup, before any
/// server is contacted (the endpoints are closed ports): BigQuery applies CDC rows from the
/// default stream only. The key from `--table-primary-key`, and from the table resource's
/// `tableConstraints` given with `--table-schema`.
#[test]
fn exactly_once_into_a_keyed_bigquery_table_is_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "x.y.z",
        json!({"useTableSchema": true}),
        json!({}),
    );
    let input = dir.path().join("in.ndjson");
    write_input(&input, &[line("1", br#"{"id": 1}"#, json!({}))]);
    let fields = json!([{"name": "id", "type": "INT64"}, {"name": "name", "type": "STRING"}]);
    let plain = dir.path().join("plain.json");
    std::fs::write(&plain, fields.to_string()).unwrap();
    let keyed = dir.path().join("keyed.json");
    std::fs::write(
        &keyed,
        json!({"schema": {"fields": fields}, "tableConstraints": {"primaryKey": {"columns": ["id"]}}})
            .to_string(),
    )
    .unwrap();
    let closed = format!("http://127.0.0.1:{}", free_port());
    let run = |schema: &Path, extra: &[&str]| {
        subsink()
            .args(["run", "--exactly-once", "--subscription"])
            .arg(&cfg)
            .arg("--source")
            .arg(&input)
            .args(["--table-url", "bigquery://p/d/t", "--table-schema"])
            .arg(schema)
            .args([
                "--bigquery-endpoint",
                &closed,
                "--bigquery-storage-endpoint",
                &closed,
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    for (what, out) in [
        (
            "--table-primary-key",
            run(&plain, &["--table-primary-key", "id"]),
        ),
        ("tableConstraints", run(&keyed, &[])),
    ] {
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(
            err.contains("--exactly-once")
                && err.contains("primary key id")
                && err.contains("default stream"),
            "{what}: {err}"
        );
    }
}
