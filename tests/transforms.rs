//! Single Message Transforms end to end (docs/transforms.md): the real binary runs a subscription's
//! JavaScript UDFs before batching and encoding; objects are read back with fastavro, tables with
//! deltalake and DuckDB, and the outcomes of ≥ 1,000 generated messages are compared with Node.js
//! (V8) running the same UDFs (tests/js/smt_reference.js).

mod util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use subsink::message::Message;
use util::*;

/// A `messageTransforms` list entry.
fn udf(name: &str, code: &str) -> Value {
    json!({"javascriptUdf": {"functionName": name, "code": code}})
}

fn write_json(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

fn msg(id: &str, data: &[u8], attrs: &[(&str, &str)], key: &str) -> Message {
    Message {
        data: data.to_vec().into(),
        attributes: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect(),
        message_id: id.into(),
        publish_time_micros: 1_700_000_000_000_000,
        ordering_key: key.into(),
    }
}

/// A Cloud Storage subscription file with `transforms`.
fn storage_subscription(dir: &Path, output: Value, transforms: Value) -> PathBuf {
    let mut cs = json!({"bucket": "bkt", "maxDuration": "60s"});
    for (k, v) in output.as_object().unwrap() {
        cs[k] = v.clone();
    }
    write_json(
        dir,
        "sub.json",
        &json!({
            "name": SUB,
            "topic": "projects/proj/topics/top",
            "cloudStorageConfig": cs,
            "messageTransforms": transforms,
        }),
    )
}

fn storage_cmd(sub: &Path, src: &Path, out: &Path) -> Command {
    let mut c = subsink();
    c.args(["run", "--subscription"])
        .arg(sub)
        .arg("--source")
        .arg(src)
        .arg("--bucket-url")
        .arg(format!("file://{}", out.display()));
    c
}

fn text_of(dir: &Path) -> String {
    let mut all = String::new();
    for f in files_below(dir) {
        all.push_str(&std::fs::read_to_string(dir.join(f)).unwrap());
    }
    all
}

const REDACT: &str = "function redact(message, metadata) {
  var d = JSON.parse(message.data);
  delete d.ssn;
  d.seen = metadata.message_id + '@' + metadata.publish_time;
  message.data = JSON.stringify(d);
  message.attributes.redacted = 'yes';
  delete message.attributes.secret;
  return message;
}";

const DROP_TEST: &str = "function dropTest(message) {
  return JSON.parse(message.data).test ? null : message;
}";

#[test]
fn text_objects_hold_the_transformed_data_and_filtered_messages_are_settled() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.ndjson");
    write_lines(
        &src,
        &[
            msg("1", br#"{"a":1,"ssn":"123-45"}"#, &[("secret", "s")], ""),
            msg("2", br#"{"a":2,"test":true}"#, &[], ""),
            msg("3", "{\"a\":\"caf\u{e9} \u{1f600}\"}".as_bytes(), &[], ""),
        ],
    );
    let sub = storage_subscription(
        dir.path(),
        json!({}),
        json!([
            udf("dropTest", DROP_TEST),
            udf("redact", REDACT),
            // Disabled: skipped (it would filter everything).
            {"javascriptUdf": {"functionName": "never", "code": "function never(m) { return null; }"},
             "disabled": true},
        ]),
    );
    let cp = dir.path().join("cp.json");
    let out_dir = dir.path().join("out");
    let out = run_ok(
        storage_cmd(&sub, &src, &out_dir)
            .arg("--checkpoint")
            .arg(&cp),
    );
    let s = summary(&out);
    assert_eq!(s["messages_read"], 3);
    assert_eq!(s["messages_filtered"], 1);
    assert_eq!(s["messages_written"], 2);
    assert_eq!(
        text_of(&out_dir),
        "{\"a\":1,\"seen\":\"1@2023-11-14T22:13:20Z\"}\n{\"a\":\"caf\u{e9} \u{1f600}\",\"seen\":\"3@2023-11-14T22:13:20Z\"}\n"
    );
    // The filtered message is settled: the checkpoint is past the whole input.
    assert_eq!(
        checkpoint_offset(&cp),
        Some(std::fs::metadata(&src).unwrap().len())
    );
}

#[test]
fn avro_with_metadata_holds_the_transformed_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.ndjson");
    let msgs = [
        msg(
            "1",
            br#"{"a":1,"ssn":"x"}"#,
            &[("secret", "s"), ("k", "v")],
            "key",
        ),
        msg("2", br#"{"a":2}"#, &[], ""),
    ];
    write_lines(&src, &msgs);
    let clear = "function clear(m) { if (JSON.parse(m.data).a === 2) return {data: m.data, attributes: {}}; return {data: m.data}; }";
    let sub = storage_subscription(
        dir.path(),
        json!({"avroConfig": {"writeMetadata": true}}),
        json!([udf("redact", REDACT), udf("clear", clear)]),
    );
    let out_dir = dir.path().join("out");
    run_ok(&mut storage_cmd(&sub, &src, &out_dir));
    let recs = avro_records(&paths_below(&out_dir));
    assert_eq!(recs.len(), 2);
    let data = |r: &Value| {
        use base64::Engine as _;
        let b = base64::engine::general_purpose::STANDARD
            .decode(r["data"]["$b64"].as_str().unwrap())
            .unwrap();
        String::from_utf8(b).unwrap()
    };
    assert_eq!(data(&recs[0]), r#"{"a":1,"seen":"1@2023-11-14T22:13:20Z"}"#);
    // Transformed attributes, and the ordering key as Pub/Sub writes it.
    assert_eq!(
        recs[0]["attributes"],
        json!({"k": "v", "redacted": "yes", "ordering_key": "key"})
    );
    assert_eq!(recs[0]["message_id"], "1");
    // `attributes: {}` removed them all.
    assert_eq!(recs[1]["attributes"], json!({}));
}

#[test]
fn topic_schema_avro_checks_the_transformed_data() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.ndjson");
    let attrs = [
        ("googclient_schemaencoding", "JSON"),
        ("googclient_schemaname", "projects/p/schemas/event"),
        ("googclient_schemarevisionid", "3afd3cc8"),
    ];
    // Payloads that do not match the schema until the UDF reshapes them.
    write_lines(
        &src,
        &[
            msg("1", br#"{"ident":7,"label":"seven"}"#, &attrs, ""),
            msg("2", br#"{"ident":8,"label":"eight"}"#, &attrs, ""),
        ],
    );
    let reshape = "function toEvent(m) {
      var d = JSON.parse(m.data);
      m.data = JSON.stringify({id: d.ident, name: d.label, tags: [], amount: null, kind: 'VIEW', ok: true});
      return m;
    }";
    let sub = storage_subscription(
        dir.path(),
        json!({"avroConfig": {"useTopicSchema": true}}),
        json!([udf("toEvent", reshape)]),
    );
    let out_dir = dir.path().join("out");
    let schema = root().join("fixtures/input/event.avsc");
    run_ok(
        storage_cmd(&sub, &src, &out_dir)
            .arg("--topic-schema")
            .arg(&schema),
    );
    let recs = avro_records(&paths_below(&out_dir));
    assert_eq!(
        recs,
        vec![
            json!({"id": 7, "name": "seven", "tags": [], "amount": null, "kind": "VIEW", "ok": true}),
            json!({"id": 8, "name": "eight", "tags": [], "amount": null, "kind": "VIEW", "ok": true}),
        ]
    );
}

/// A UDF that throws, one that returns a wrong shape, and a non-UTF-8 payload: each message fails
/// alone (`--on-bad-input skip` goes on past it; the default stops the run there).
#[test]
fn failed_messages_fail_alone_and_never_crash_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.ndjson");
    write_lines(
        &src,
        &[
            msg("1", b"ok", &[], ""),
            msg("2", b"throw", &[], ""),
            msg("3", b"shape", &[], ""),
            msg("4", &[0xff, 0xfe, b'x'], &[], ""),
            msg("5", b"loop", &[], ""),
            msg("6", b"ok too", &[], ""),
        ],
    );
    let code = "function f(m) {
      if (m.data === 'throw') throw new Error('no thanks');
      if (m.data === 'shape') return {data: 42};
      if (m.data === 'loop') { for (;;) {} }
      return m;
    }";
    let sub = storage_subscription(dir.path(), json!({}), json!([udf("f", code)]));
    let out_dir = dir.path().join("out");
    let out = storage_cmd(&sub, &src, &out_dir)
        .args(["--on-bad-input", "skip"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&out);
    assert_eq!(s["bad_messages"], 4, "{s}");
    assert_eq!(s["messages_written"], 2);
    assert_eq!(text_of(&out_dir), "ok\nok too\n");
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "in.ndjson:2: message transform f: Error: no thanks",
        "in.ndjson:3: message transform f: wrong return value",
        "in.ndjson:4: message transform f: the payload is not UTF-8",
        "in.ndjson:5: message transform f: ran longer than 500 ms",
    ] {
        assert!(err.contains(want), "{want} not in:\n{err}");
    }
    // The default, --on-bad-input fail: the run stops at the first failed message, exit 1.
    let out_dir = dir.path().join("out2");
    let out = storage_cmd(&sub, &src, &out_dir).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const TABLE_SCHEMA: &str = r#"[
  {"name": "id", "type": "INTEGER", "mode": "REQUIRED"},
  {"name": "name", "type": "STRING"}
]"#;

/// Table rows: the transformed JSON is mapped to columns; a failed message goes to the
/// dead-letter file with `CloudPubSubDeadLetterSourceSMTErrorMessage`.
#[test]
fn table_rows_are_the_transformed_json_and_failures_are_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.ndjson");
    write_lines(
        &src,
        &[
            msg("1", br#"{"ident":1,"label":"one","extra":true}"#, &[], ""),
            msg("2", br#"{"ident":2,"label":"two","extra":true}"#, &[], ""),
            msg("3", br#"not json"#, &[], ""),
        ],
    );
    let code = "function toRow(m) {
      var d = JSON.parse(m.data);
      return {data: JSON.stringify({id: d.ident, name: d.label.toUpperCase()})};
    }";
    let sub = write_json(
        dir.path(),
        "sub.json",
        &json!({
            "name": "projects/proj/subscriptions/rows",
            "topic": "projects/proj/topics/top",
            "bigqueryConfig": {"table": "proj.ds.rows", "useTableSchema": true},
            "deadLetterPolicy": {"deadLetterTopic": "projects/proj/topics/dead", "maxDeliveryAttempts": 5},
            "messageTransforms": [udf("toRow", code)],
        }),
    );
    let schema = dir.path().join("schema.json");
    std::fs::write(&schema, TABLE_SCHEMA).unwrap();
    let table = dir.path().join("rows");
    let dead = dir.path().join("dead.ndjson");
    let out = run_ok(
        subsink()
            .args(["run", "--subscription"])
            .arg(&sub)
            .arg("--source")
            .arg(&src)
            .arg("--table-url")
            .arg(format!("file://{}", table.display()))
            .arg("--table-schema")
            .arg(&schema)
            .arg("--dead-letter")
            .arg(&dead),
    );
    let s = summary(&out);
    assert_eq!(s["messages_written"], 2, "{s}");
    assert_eq!(s["messages_dead_lettered"], 1, "{s}");
    let rows = python_json(
        "import sys, json, deltalake\nrows = deltalake.DeltaTable(sys.argv[1]).to_pyarrow_table().to_pylist()\nprint(json.dumps(sorted(rows, key=lambda r: r['id'])))\n# deltalake's threads can abort the interpreter's teardown (tests/table_run.rs): leave without it.\nimport os; sys.stdout.flush(); os._exit(0)",
        table.to_str().unwrap(),
        &[],
    );
    assert_eq!(
        rows,
        json!([{"id": 1, "name": "ONE"}, {"id": 2, "name": "TWO"}])
    );
    let dl = messages_of(&dead);
    assert_eq!(dl.len(), 1);
    assert_eq!(&dl[0].data[..], b"not json");
    let why = dl[0]
        .attributes
        .get("CloudPubSubDeadLetterSourceSMTErrorMessage")
        .expect("the SMT error attribute");
    assert!(
        why.contains("toRow") && why.contains("SyntaxError"),
        "{why}"
    );
    assert_eq!(
        dl[0]
            .attributes
            .get("CloudPubSubDeadLetterSourceDeliveryCount"),
        Some("5")
    );
    assert!(dl[0]
        .attributes
        .get("CloudPubSubDeadLetterSourceDeliveryErrorMessage")
        .is_none());
}

/// Many messages of a few ordering keys through the transforms on several threads: every key's
/// messages come out in input order.
#[test]
fn ordering_keys_keep_their_order_through_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.ndjson");
    let n = 5000;
    let msgs: Vec<Message> = (0..n)
        .map(|i| {
            msg(
                &i.to_string(),
                format!("{i}").as_bytes(),
                &[],
                ["a", "b", "c"][i % 3],
            )
        })
        .collect();
    write_lines(&src, &msgs);
    // Uneven work, so threads finish out of step.
    let code = "function tag(m, meta) {
      var spin = (Number(m.data) * 7919) % 200; var x = 0;
      for (var i = 0; i < spin * 50; i++) { x += i; }
      return {data: meta.ordering_key + ':' + m.data};
    }";
    let mut sub: Value = serde_json::from_str(
        &std::fs::read_to_string(storage_subscription(
            dir.path(),
            json!({}),
            json!([udf("tag", code)]),
        ))
        .unwrap(),
    )
    .unwrap();
    sub["enableMessageOrdering"] = json!(true);
    let sub = write_json(dir.path(), "sub.json", &sub);
    let out_dir = dir.path().join("out");
    run_ok(&mut storage_cmd(&sub, &src, &out_dir));
    let mut per_key: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let text = text_of(&out_dir);
    for line in text.lines() {
        let (k, i) = line.split_once(':').unwrap();
        per_key
            .entry(k.into())
            .or_default()
            .push(i.parse().unwrap());
    }
    assert_eq!(per_key.values().map(Vec::len).sum::<usize>(), n);
    for (k, seq) in per_key {
        assert!(seq.windows(2).all(|w| w[0] < w[1]), "key {k} out of order");
    }
}

#[test]
fn validate_names_every_rule_a_transform_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let six: Vec<Value> = (0..6)
        .map(|i| {
            udf(
                &format!("f{i}"),
                &format!("function f{i}(m) {{ return m; }}"),
            )
        })
        .collect();
    let cases: Vec<(Value, &str)> = vec![
        (json!(six), "messageTransforms: at most 5 transforms per subscription, got 6"),
        (
            json!([udf("f", "function f(m) {\n  return m;\n  var = 1;\n}")]),
            "messageTransforms[0].javascriptUdf.code: syntax error at line 3, column",
        ),
        (
            json!([udf("g", "function f(m) { return m; }")]),
            "messageTransforms[0].javascriptUdf.code: the code defines no function named \"g\"",
        ),
        (
            json!([udf("f", "function f(m) { return m; }"), udf("f", "function f(m) { return m; }")]),
            "messageTransforms[1].javascriptUdf.functionName: \"f\" is already the name of another transform",
        ),
        (
            json!([udf("f", &format!("function f(m) {{ return m; }} // {}", "x".repeat(20 * 1024)))]),
            "messageTransforms[0].javascriptUdf.code: must be at most 20480 bytes",
        ),
        (
            json!([udf("a-b", "function f(m) { return m; }")]),
            "messageTransforms[0].javascriptUdf.functionName: \"a-b\" is not a JavaScript function name",
        ),
        (
            json!([{"aiInference": {"endpoint": "e"}}]),
            "messageTransforms[0].aiInference: AI inference transforms call Vertex AI",
        ),
        (
            json!([{"javascriptUdf": {"functionName": "f"}, "disabled": true}]),
            "messageTransforms[0].javascriptUdf.code: required",
        ),
    ];
    for (transforms, want) in cases {
        let sub = storage_subscription(dir.path(), json!({}), transforms);
        let out = subsink()
            .args(["validate", "--subscription"])
            .arg(&sub)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{want}\nnot in:\n{err}");
    }
    // --message-transforms-file (YAML, as gcloud takes it) replaces the file's list.
    let sub = storage_subscription(dir.path(), json!({}), json!([]));
    let yaml = dir.path().join("t.yaml");
    std::fs::write(
        &yaml,
        "- javascriptUdf:\n    functionName: f\n    code: |\n      function f(m) {\n        return m;;;\n      }}\n",
    )
    .unwrap();
    let out = subsink()
        .args(["validate", "--subscription"])
        .arg(&sub)
        .arg("--message-transforms-file")
        .arg(&yaml)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("syntax error at line 3"), "{err}");
}

/// `code` of exactly `len` bytes of UTF-8 defining `function f`: padded with a comment of `é`
/// (2 bytes, 1 char) and `x`, so a limit counted in chars instead of bytes shows.
fn code_of_bytes(len: usize) -> String {
    let mut code = String::from("function f(m) { return m; }\n// ");
    while code.len() + 2 <= len {
        code.push('é');
    }
    while code.len() < len {
        code.push('x');
    }
    assert_eq!(code.len(), len);
    code
}

/// The code limit from both sides: exactly 20,480 bytes (Pub/Sub's 20 KB) validate, 20,481 fail,
/// counted in bytes of UTF-8 (the padding is mostly 2-byte characters).
#[test]
fn code_of_exactly_the_limit_validates_and_one_byte_more_fails() {
    let dir = tempfile::tempdir().unwrap();
    let validate = |len: usize| {
        let sub = storage_subscription(
            dir.path(),
            json!({}),
            json!([udf("f", &code_of_bytes(len))]),
        );
        subsink()
            .args(["validate", "--subscription"])
            .arg(&sub)
            .output()
            .unwrap()
    };
    let out = validate(20_480);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(": valid"));
    let out = validate(20_481);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "messageTransforms[0].javascriptUdf.code: must be at most 20480 bytes (20 KiB), got 20481"
        ),
        "{err}"
    );
}

#[test]
fn transforms_test_prints_the_result_or_why() {
    let dir = tempfile::tempdir().unwrap();
    let sub = storage_subscription(
        dir.path(),
        json!({}),
        json!([udf("dropTest", DROP_TEST), udf("redact", REDACT)]),
    );
    let test = |m: Value| {
        let out = subsink()
            .args(["transforms", "test", "--subscription"])
            .arg(&sub)
            .arg("--message")
            .arg(m.to_string())
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        (out.status.code(), v)
    };
    let b64 = |s: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let (code, v) = test(
        json!({"data": b64(r#"{"a":1,"ssn":"x"}"#), "attributes": {"secret": "s"},
        "messageId": "7", "publishTime": "2024-01-02T03:04:05.678Z"}),
    );
    assert_eq!(code, Some(0));
    assert_eq!(v["outcome"], "transformed");
    assert_eq!(v["text"], r#"{"a":1,"seen":"7@2024-01-02T03:04:05Z"}"#);
    assert_eq!(v["message"]["attributes"], json!({"redacted": "yes"}));
    let (code, v) = test(json!({"data": b64(r#"{"test":1}"#), "messageId": "8"}));
    assert_eq!(code, Some(0));
    assert_eq!(v["outcome"], "filtered");
    assert_eq!(v["by"], "dropTest");
    let (code, v) = test(json!({"data": b64("not json"), "messageId": "9"}));
    assert_eq!(code, Some(1));
    assert_eq!(v["outcome"], "failed");
    assert!(v["error"].as_str().unwrap().contains("SyntaxError"), "{v}");
}

/// Issue 44, point 10: `--message` is the body as text and `--attribute` gives attributes, as
/// gcloud's `message-transforms test` takes them; a JSON payload is text too (it was refused:
/// not a PubsubMessage). The REST form still reads as before (the test above), and the report
/// says which reading it took.
#[test]
fn transforms_test_takes_plain_text_and_attributes_as_gcloud_does() {
    let dir = tempfile::tempdir().unwrap();
    let sub = storage_subscription(dir.path(), json!({}), json!([udf("redact", REDACT)]));
    let test = |args: &[&str]| {
        let out = subsink()
            .args(["transforms", "test", "--subscription"])
            .arg(&sub)
            .args(args)
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code(), v)
    };
    let (code, v) = test(&[
        "--message",
        r#"{"a":1,"ssn":"x"}"#,
        "--attribute",
        r#"secret=s,k="v w""#,
        "--attribute",
        "j=2",
    ]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["outcome"], "transformed");
    assert_eq!(v["message_read_as"], "text");
    // The body is the text itself; gcloud gives no message id (the UDF's metadata has none).
    let text: Value = serde_json::from_str(v["text"].as_str().unwrap()).unwrap();
    assert_eq!(text["a"], 1, "{v}");
    assert!(text.get("ssn").is_none(), "{v}");
    assert!(
        text["seen"].as_str().unwrap().starts_with("undefined@"),
        "{v}"
    );
    assert_eq!(
        v["message"]["attributes"],
        json!({"j": "2", "k": "v w", "redacted": "yes"})
    );
    // Plain text that is not JSON reaches the UDF as it is (here it fails JSON.parse).
    let (code, v) = test(&["--message", "hello world"]);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(
        (v["outcome"].as_str(), v["message_read_as"].as_str()),
        (Some("failed"), Some("text"))
    );
    assert!(v["error"].as_str().unwrap().contains("SyntaxError"), "{v}");
    // The REST form without --attribute: read as the message it is.
    let (code, v) = test(&[
        "--message",
        r#"{"data":"eyJhIjoxfQ==","messageId":"7","publishTime":"2024-01-02T03:04:05Z"}"#,
    ]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["message_read_as"], "PubsubMessage JSON");
    assert_eq!(v["text"], r#"{"a":1,"seen":"7@2024-01-02T03:04:05Z"}"#);
    // Neither a body nor an attribute, or an attribute without `=`: refused, exit 2.
    let (code, v) = test(&["--attribute", "novalue"]);
    assert_eq!(
        (code, v["error"].as_str()),
        (Some(2), Some("--attribute novalue: not KEY=VALUE"))
    );
}

// ---- The differential test: subsink (QuickJS) against Node.js (V8). ----

/// Reshape JSON payloads; attribute edits; filter by payload; unicode in data and attributes;
/// a throw; wrong return shapes.
const DIFF_UDFS: &[(&str, &str)] = &[
    (
        "reshape",
        "function reshape(message, metadata) {
  var d;
  try { d = JSON.parse(message.data); } catch (e) { return message; }
  if (d === null || typeof d !== 'object' || Array.isArray(d)) return message;
  if (d.kind === 'THROW') throw new TypeError('kind THROW: ' + d.n);
  d.total = (d.price || 0) * (d.qty || 0);
  d.name = (d.name || '').normalize('NFC');
  d.chars = Array.from(d.name).length;
  d.units = d.name.length;
  d.meta = metadata.message_id + '|' + metadata.publish_time + '|' + (metadata.ordering_key || '-');
  delete d.secret;
  var keys = Object.keys(d).sort();
  var out = {};
  keys.forEach(function (k) { out[k] = d[k]; });
  return {data: JSON.stringify(out), attributes: message.attributes};
}",
    ),
    (
        "attrs",
        "function attrs(message) {
  var a = message.attributes;
  if (a.clear === 'yes') return {data: message.data, attributes: {}};
  if (a.keep === 'yes') return {data: message.data};
  var out = {};
  Object.keys(a).forEach(function (k) {
    if (k.indexOf('drop') === 0) return;
    out[k.toUpperCase()] = a[k] + '\\u2713';
  });
  out.len = String(message.data.length);
  out.first = message.data.length ? Array.from(message.data)[0] : '';
  return {data: message.data, attributes: out};
}",
    ),
    (
        "filterer",
        "function filterer(message) {
  if (message.data.indexOf('FILTER') >= 0) return null;
  if (/\\bskip-me\\b/.test(message.data)) return null;
  return message;
}",
    ),
    (
        "shaper",
        "function shaper(message) {
  if (message.data.indexOf('SHAPE-NUM') >= 0) return {data: 42};
  if (message.data.indexOf('SHAPE-STR') >= 0) return 'just a string';
  if (message.data.indexOf('SHAPE-UNDEF') >= 0) return undefined;
  if (message.data.indexOf('SHAPE-ATTR') >= 0) return {data: 'x', attributes: {n: 1}};
  if (message.data.indexOf('SHAPE-ARR') >= 0) return [message.data];
  if (message.data.indexOf('RAISE') >= 0) throw 'a string';
  return message;
}",
    ),
    (
        "unicode",
        "function unicode(message) {
  var s = message.data;
  var rev = Array.from(s).reverse().join('');
  var upper = s.toUpperCase();
  var cps = Array.from(s).map(function (c) { return c.codePointAt(0).toString(16); }).slice(0, 8).join(' ');
  return {data: s + '\\n' + rev + '\\n' + upper + '\\n' + cps + '\\n' + encodeURIComponent(s.slice(0, 12))};
}",
    ),
];

/// Deterministic generated messages: JSON and text payloads with unicode (accents, CJK, emoji,
/// combining marks), markers that filter, throw or return wrong shapes, unicode attributes.
fn generated(n: usize) -> Vec<Message> {
    let mut seed = 0x5eed_u64;
    let words = [
        "café",
        "naïve",
        "Straße",
        "東京",
        "😀",
        "e\u{301}",
        "Ωmega",
        "plain",
        "ǅ",
        "İstanbul",
        "ﬁ",
        "x",
        "\u{1F1EB}\u{1F1F7}",
        "tab\there",
        "quote\"s",
    ];
    let markers = [
        "FILTER",
        "skip-me",
        "SHAPE-NUM",
        "SHAPE-STR",
        "SHAPE-UNDEF",
        "SHAPE-ATTR",
        "SHAPE-ARR",
        "RAISE",
    ];
    let mut pick = |m: usize| (xorshift(&mut seed) % m as u64) as usize;
    (0..n)
        .map(|i| {
            let mut text = String::new();
            for _ in 0..1 + pick(4) {
                text.push_str(words[pick(words.len())]);
                text.push(' ');
            }
            let roll = pick(20);
            let data = if roll < 10 {
                let kind = if pick(25) == 0 { "THROW" } else { "order" };
                json!({"n": i, "kind": kind, "name": text, "price": pick(1000) as f64 / 8.0,
                       "qty": pick(7), "secret": "s", "nested": {"w": words[pick(words.len())]}})
                .to_string()
            } else if roll < 13 {
                format!("{text}{}", markers[pick(markers.len())])
            } else if roll < 14 {
                "[1,2,3]".to_string()
            } else {
                text
            };
            let mut attrs: Vec<(String, String)> = vec![];
            for _ in 0..pick(4) {
                attrs.push((
                    format!("k{}", pick(5)),
                    words[pick(words.len())].to_string(),
                ));
            }
            match pick(10) {
                0 => attrs.push(("clear".into(), "yes".into())),
                1 => attrs.push(("keep".into(), "yes".into())),
                2 => attrs.push(("drop_me".into(), "gone".into())),
                3 => attrs.push(("ünï".into(), "çødé 😀".into())),
                _ => {}
            }
            Message {
                data: data.into_bytes().into(),
                attributes: attrs.into_iter().collect(),
                message_id: format!("m{i}"),
                publish_time_micros: 1_700_000_000_000_000 + (i as i64) * 1_234_567,
                ordering_key: if pick(3) == 0 {
                    format!("key{}", pick(4))
                } else {
                    String::new()
                },
            }
        })
        .collect()
}

#[test]
fn outcomes_match_node_on_generated_messages() {
    let dir = tempfile::tempdir().unwrap();
    let n = 1500;
    let msgs = generated(n);
    let src = dir.path().join("in.ndjson");
    write_lines(&src, &msgs);
    let transforms: Vec<Value> = DIFF_UDFS.iter().map(|(n, c)| udf(n, c)).collect();
    let tfile = write_json(dir.path(), "transforms.json", &json!(transforms));

    // Node.js (V8): the reference outcomes, on the machine's Node.js: at least 18, as
    // scripts/setup-test-env checks (docs/testing.md); the version is printed.
    let version = Command::new("node")
        .arg("--version")
        .output()
        .expect("node");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("node --version: {version:?}"));
    eprintln!("differential reference: Node.js {version} (major {major})");
    assert!(major >= 18, "Node.js {version}: the test needs 18 or later");
    let node = Command::new("node")
        .arg(root().join("tests/js/smt_reference.js"))
        .arg(&tfile)
        .arg(&src)
        .output()
        .expect("node");
    assert!(
        node.status.success(),
        "{}",
        String::from_utf8_lossy(&node.stderr)
    );
    let want: Vec<Value> = String::from_utf8(node.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(want.len(), n);

    // subsink: a real run, Avro with metadata (data and attributes per message id), failed
    // messages skipped and named in the log.
    let sub = storage_subscription(
        dir.path(),
        json!({"avroConfig": {"writeMetadata": true}}),
        json!([]),
    );
    let out_dir = dir.path().join("out");
    let out = storage_cmd(&sub, &src, &out_dir)
        .arg("--message-transforms-file")
        .arg(&tfile)
        .args(["--on-bad-input", "skip"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&out);
    let mut got: BTreeMap<String, Value> = BTreeMap::new();
    for r in avro_records(&paths_below(&out_dir)) {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD
            .decode(r["data"]["$b64"].as_str().unwrap())
            .unwrap();
        let mut attrs = r["attributes"].clone();
        attrs.as_object_mut().unwrap().remove("ordering_key");
        got.insert(
            r["message_id"].as_str().unwrap().to_string(),
            json!({"data": String::from_utf8(data).unwrap(), "attributes": attrs}),
        );
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let (mut transformed, mut filtered, mut failed) = (0, 0, 0);
    for (w, m) in want.iter().zip(&msgs) {
        let id = w["id"].as_str().unwrap();
        match w["outcome"].as_str().unwrap() {
            "transformed" => {
                transformed += 1;
                let g = got
                    .get(id)
                    .unwrap_or_else(|| panic!("{id}: node transformed it, subsink did not\n{w}"));
                assert_eq!(g["data"], w["data"], "{id}: data differs");
                assert_eq!(g["attributes"], w["attributes"], "{id}: attributes differ");
            }
            "filtered" => {
                filtered += 1;
                assert!(
                    !got.contains_key(id),
                    "{id}: node filtered it, subsink wrote it"
                );
            }
            "failed" => {
                failed += 1;
                assert!(
                    !got.contains_key(id),
                    "{id}: node failed it, subsink wrote it"
                );
                // Line numbers are 1-based and message i is on line i + 1.
                let line = id[1..].parse::<usize>().unwrap() + 1;
                let by = w["by"].as_str().unwrap();
                let logged = format!("in.ndjson:{line}: message transform {by}");
                assert!(err.contains(&logged), "{id} ({m:?}): {logged} not logged");
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!(got.len(), transformed);
    assert_eq!(s["messages_filtered"], filtered);
    assert_eq!(s["bad_messages"], failed);
    // Every kind of outcome is well represented.
    assert!(
        transformed > 800 && filtered > 50 && failed > 80,
        "{transformed} {filtered} {failed}"
    );
}

// ---- Pub/Sub (the emulator): acks, nacks, dead letters; serve reads the field. ----

use std::time::Duration;
use util::pubsub::{sub, topic, Scenario};

/// From Pub/Sub: the transformed message is written, the filtered one acked and never written, the
/// one a UDF throws on redelivered then dead-lettered with the SMT error attribute.
#[test]
fn pubsub_source_acks_filtered_and_dead_letters_failed_messages() {
    let sc = Scenario::start(|s| {
        s.dead_letter = Some((topic("dead-letters"), 5));
    });
    sc.env.subscribe(&sub("dlq-sub"), &topic("dead-letters"));
    let m = |data: &str| Message {
        data: data.as_bytes().to_vec().into(),
        attributes: [("k".to_string(), "v".to_string())].into(),
        ..Default::default()
    };
    let ids = sc
        .env
        .publish(&topic("events"), &[m("keep"), m("drop"), m("throw")]);
    let code = "function f(msg) {
      if (msg.data === 'drop') return null;
      if (msg.data === 'throw') throw new RangeError('bad ' + msg.data);
      return {data: msg.data.toUpperCase(), attributes: {k2: msg.attributes.k}};
    }";
    let cfg = sc.config(
        json!({"maxDuration": "1s"}),
        json!({"deadLetterPolicy": {"deadLetterTopic": topic("dead-letters"), "maxDeliveryAttempts": 5},
               "messageTransforms": [udf("f", code)]}),
    );
    let proxy = sc.proxy(false);
    let worker = sc.worker_via(&proxy, &cfg, &[]);
    let dead = sc
        .env
        .drain_until_some(&sub("dlq-sub"), Duration::from_secs(90));
    poll(Duration::from_secs(30), Duration::from_millis(200), || {
        let acked = proxy.calls().acked();
        match ids.iter().all(|id| acked.contains_key(id)) {
            true => Ok(()),
            false => Err(format!("not every message acked: {acked:?}")),
        }
    });
    let (s, err) = util::terminate(worker, Duration::from_secs(15));
    assert_eq!(dead.len(), 1, "{err}");
    let a = &dead[0].attributes;
    assert_eq!(&dead[0].data[..], b"throw", "dead-lettered as it came");
    assert_eq!(&a["k"], "v");
    assert!(
        a["CloudPubSubDeadLetterSourceSMTErrorMessage"]
            .contains("message transform f: RangeError: bad throw"),
        "{a:?}"
    );
    assert_eq!(&a["CloudPubSubDeadLetterSourceDeliveryCount"], "5");
    assert!(s["messages_filtered"].as_u64().unwrap() >= 1, "{s}");
    let recs = avro_records(&paths_below(&sc.bucket));
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["data"], b64(b"KEEP"));
    assert_eq!(recs[0]["attributes"], json!({"k2": "v"}));
}

/// The emulator stores a subscription's `messageTransforms` and returns them, and does not apply
/// them: `serve` reads them from the subscription and subsink applies them.
#[test]
fn serve_applies_the_transforms_pubsub_holds_for_a_subscription() {
    let env = util::pubsub::PubsubEnv::start();
    let dir = tempfile::tempdir().unwrap();
    // Over the emulator's REST interface (the same port as gRPC), as gcloud would.
    let rest = |path: &str, body: Value| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-X",
                "PUT",
                "-H",
                "content-type: application/json",
                "-d",
            ])
            .arg(body.to_string())
            .arg(format!("http://{}/v1/{path}", env.emu.host()))
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v.get("error").is_none(), "{v}");
        v
    };
    rest(&topic("events"), json!({}));
    let created = rest(
        &sub("smt"),
        json!({"topic": topic("events"), "ackDeadlineSeconds": 10,
               "cloudStorageConfig": {"bucket": "smt-bkt", "maxDuration": "1s"},
               "messageTransforms": [udf("tag", "function tag(m, meta) { return {data: 'tagged:' + m.data}; }")]}),
    );
    // The emulator keeps the field.
    assert_eq!(
        created["messageTransforms"][0]["javascriptUdf"]["functionName"],
        "tag"
    );
    let mut hello = msg("", b"hello", &[], "");
    hello.message_id.clear();
    env.publish(&topic("events"), &[hello]);
    let mut serve = subsink()
        .env("PUBSUB_EMULATOR_HOST", env.emu.host())
        .args([
            "serve",
            "--project",
            util::pubsub::PROJECT,
            "--bucket-url-template",
        ])
        .arg(format!("file://{}/{{bucket}}", dir.path().display()))
        .args(["--limits", "extended", "--discover-interval", "1s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let bucket = dir.path().join("smt-bkt");
    let text = poll(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || match bucket
            .exists()
            .then(|| text_of(&bucket))
            .filter(|t| !t.is_empty())
        {
            Some(t) => Ok(t),
            None => Err("no object from serve".to_string()),
        },
    );
    util::signal(&serve, libc::SIGTERM);
    let _ = serve.wait();
    assert_eq!(text, "tagged:hello\n");
}
