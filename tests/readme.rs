//! README's claims about the file source and the objects, each run end to end with the real binary
//! and read back with readers nobody here wrote: the README's own `run` examples, Content-Type on
//! S3 (moto), the subscription filter on a file, and `messageId` defaults.

mod util;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use subsink::message::Message;
use util::*;

/// A `run` example of README: environment assignments before the command, arguments after `run`.
#[derive(Debug)]
struct Example {
    env: Vec<String>,
    args: Vec<String>,
}

/// Every `… run …` command in README's code blocks (continuation lines joined, `#` comments
/// dropped), whether written `subsink run` or `cargo run --release -- run`.
fn readme_run_examples() -> Vec<Example> {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut out = Vec::new();
    let mut in_block = false;
    let mut logical = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            logical.clear();
            continue;
        }
        if !in_block {
            continue;
        }
        let line = line.split(" #").next().unwrap();
        if line.trim_start().starts_with('#') {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                logical.push_str(head);
                logical.push(' ');
                continue;
            }
            None => logical.push_str(line),
        }
        let words: Vec<String> = logical.split_whitespace().map(str::to_string).collect();
        logical.clear();
        let run = words
            .windows(2)
            .position(|w| (w[0] == "subsink" || w[0] == "--") && w[1] == "run");
        if let Some(at) = run {
            let start = words
                .iter()
                .position(|w| w == "subsink" || w == "cargo")
                .unwrap();
            out.push(Example {
                env: words[..start].to_vec(),
                args: words[at + 2..].to_vec(),
            });
        }
    }
    out
}

fn arg<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .map(|i| args[i + 1].as_str())
}

#[test]
fn readme_run_examples_run_and_write_what_readme_says() {
    let examples = readme_run_examples();
    let tmp = tempfile::tempdir().unwrap();
    let mut ran = Vec::new();
    for ex in &examples {
        // The push and NATS examples serve or pull until stopped; tests/push.rs and tests/nats.rs
        // run those sources against the emulator and a real nats-server.
        let source = arg(&ex.args, "--source");
        if source == Some("push") || source.is_some_and(|s| s.starts_with("nats://")) {
            continue;
        }
        // The BigQuery examples write to Google's BigQuery; tests/bigquery.rs runs that
        // destination (file and Pub/Sub sources, --exactly-once) against bqemulator.
        if arg(&ex.args, "--table-url")
            .is_some_and(|u| u == "bigquery" || u.starts_with("bigquery://"))
        {
            continue;
        }
        // The Pub/Sub example needs the user's own subscription file and bucket (`sub.json`,
        // `s3://archive`); tests/pubsub.rs runs that path against the emulator.
        if arg(&ex.args, "--source") == Some("pubsub") {
            assert_eq!(
                ex.env,
                vec!["PUBSUB_EMULATOR_HOST=127.0.0.1:8681".to_string()],
                "{ex:?}"
            );
            continue;
        }
        assert!(ex.env.is_empty(), "{ex:?}");
        // README writes under /tmp; each example gets its own folder here.
        let case = tmp.path().join(ran.len().to_string());
        let args: Vec<String> = ex
            .args
            .iter()
            .map(|a| a.replace("/tmp/", &format!("{}/", case.display())))
            .collect();
        let out = run_ok(subsink().current_dir(root()).arg("run").args(&args));
        let s = summary(&out);
        let config = arg(&args, "--subscription").unwrap().to_string();
        let source = root().join(arg(&args, "--source").unwrap());
        let want = messages_of(&source);
        assert_eq!(s["messages_read"], want.len(), "{ex:?}");
        assert_eq!(s["messages_written"], want.len(), "{ex:?}");
        let resource: Value =
            serde_json::from_str(&std::fs::read_to_string(root().join(&config)).unwrap()).unwrap();
        match config.as_str() {
            "examples/storage-avro.json" => {
                // "writes one Avro-with-metadata object under /tmp/subsink-bucket/events/…"
                let bucket = case.join("subsink-bucket");
                assert_eq!(
                    arg(&args, "--bucket-url").unwrap(),
                    format!("file://{}", bucket.display())
                );
                let files = files_below(&bucket);
                assert_eq!(files.len(), 1, "one object: {files:?}");
                assert!(files[0].starts_with("events/"), "{files:?}");
                assert!(files[0].ends_with(".avro"), "{files:?}");
                assert_eq!(s["objects"], json!([files[0]]));
                let dump = fastavro_dump(&[bucket.join(&files[0])]);
                let got = dump[0]["records"].as_array().unwrap();
                let expected: Vec<Value> = want
                    .iter()
                    .map(|m| {
                        let mut attrs = m.attributes.clone();
                        if !m.ordering_key.is_empty() {
                            attrs.insert("ordering_key".into(), m.ordering_key.clone());
                        }
                        json!({
                            "subscription_name": resource["name"],
                            "message_id": m.message_id,
                            "publish_time": m.publish_time_micros,
                            "attributes": attrs,
                            "data": b64(&m.data),
                        })
                    })
                    .collect();
                assert_eq!(got, &expected);
            }
            "examples/table-json.json" => {
                let table = case.join("warehouse/events");
                let t = python_json(
                    "import json, os, sys, deltalake\n\
                     dt = deltalake.DeltaTable(sys.argv[1])\n\
                     rows = dt.to_pyarrow_table().to_pylist()\n\
                     print(json.dumps({'version': dt.version(), 'ids': sorted(r['message_id'] for r in rows),\n\
                                       'subs': sorted({r['subscription_name'] for r in rows}),\n\
                                       'columns': dt.schema().to_arrow().names}, default=str))\n\
                     sys.stdout.flush()\n\
                     os._exit(0)  # deltalake's threads can abort the interpreter's teardown",
                    &table.display().to_string(),
                    &[],
                );
                let mut ids: Vec<String> = want.iter().map(|m| m.message_id.clone()).collect();
                ids.sort();
                assert_eq!(t["ids"], json!(ids), "every message is one row");
                assert_eq!(t["subs"], json!([resource["name"]]));
                let schema: Value = serde_json::from_str(
                    &std::fs::read_to_string(root().join(arg(&args, "--table-schema").unwrap()))
                        .unwrap(),
                )
                .unwrap();
                let columns = t["columns"].as_array().unwrap();
                for field in schema.as_array().unwrap() {
                    assert!(columns.contains(&field["name"]), "{field} in {columns:?}");
                }
            }
            "examples/table-changes.json" => {
                // "applied by MERGE by the key ..., the highest sequence number winning per key":
                // customer 1 at 14 (13 came late), 2 deleted, 9's delete changes nothing.
                let table = case.join("warehouse/customers");
                let t = python_json(
                    "import json, os, sys, deltalake\n\
                     dt = deltalake.DeltaTable(sys.argv[1])\n\
                     rows = sorted(dt.to_pyarrow_table().to_pylist(), key=lambda r: r['customer_id'])\n\
                     print(json.dumps(rows))\n\
                     sys.stdout.flush()\n\
                     os._exit(0)  # deltalake's threads can abort the interpreter's teardown",
                    &table.display().to_string(),
                    &[],
                );
                let n = |x: &str| format!("{x:0>16}/{z}/{z}/{z}", z = "0".repeat(16));
                assert_eq!(
                    t,
                    json!([
                        {"customer_id": 1, "name": "Ada", "tier": "platinum", "_CHANGE_SEQUENCE_NUMBER": n("14")},
                        {"customer_id": 3, "name": "Chen", "tier": "bronze", "_CHANGE_SEQUENCE_NUMBER": n("12")},
                        {"customer_id": 4, "name": "Dana", "tier": "gold", "_CHANGE_SEQUENCE_NUMBER": n("16")},
                    ])
                );
            }
            "examples/storage-partitioned.json" => {
                // "objects go under Hive-style folders … events/dt=2023-09-25/hour=04/region=us-east1/part-…avro"
                let bucket = case.join("subsink-partitioned");
                let files = files_below(&bucket);
                let mut held = 0;
                for f in &files {
                    let (dir, file) = f.rsplit_once('/').unwrap();
                    assert!(file.starts_with("part-") && file.ends_with(".avro"), "{f}");
                    let segments: Vec<&str> = dir.split('/').collect();
                    assert_eq!(segments[0], "events", "{f}");
                    let keys: Vec<&str> = segments[1..]
                        .iter()
                        .map(|s| s.split_once('=').unwrap().0)
                        .collect();
                    assert_eq!(keys, ["dt", "hour", "region"], "{f}");
                    held += records_of(&fastavro_dump(&[bucket.join(f)])).len();
                }
                assert!(
                    files.iter().any(
                        |f| f.starts_with("events/dt=2023-09-25/hour=04/region=us-east1/part-")
                    ),
                    "{files:?}"
                );
                assert_eq!(held, want.len());
            }
            other => panic!("README runs {other}: add what it should write to this test"),
        }
        ran.push(config);
    }
    ran.sort();
    ran.dedup();
    assert_eq!(
        ran,
        [
            "examples/storage-avro.json",
            "examples/storage-partitioned.json",
            "examples/table-changes.json",
            "examples/table-json.json"
        ],
        "{examples:?}"
    );
}

#[test]
fn text_objects_are_text_plain_and_avro_objects_application_octet_stream() {
    let s3 = S3Server::start();
    s3.create_bucket("archive");
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    // ~12 MiB: above a 5 MiB threshold the object streams as a multipart upload, whose
    // Content-Type is set when the upload starts.
    write_numbered_messages(&src, 3000, 4096);
    let cases = [
        ("text", "64MiB", "text/plain"),
        ("text", "5MiB", "text/plain"),
        ("avro", "64MiB", "application/octet-stream"),
        ("avro", "5MiB", "application/octet-stream"),
    ];
    for (format, threshold, want) in cases {
        let prefix = format!("{format}-{}/", threshold.to_lowercase());
        let mut c = s3_archive_cmd(&s3, format, &prefix, threshold, &src, &[]);
        let s = summary(&run_ok(&mut c));
        assert_eq!(s["messages_written"], 3000);
        let listed = s3.list_under("archive", &prefix);
        assert_eq!(listed.len(), 1, "{listed:?}");
        let local = work.path().join("object");
        let content_type = s3.download("archive", &listed[0].0, &local);
        assert_eq!(content_type, want, "{format} with threshold {threshold}");
    }
    assert_eq!(s3.open_multipart_uploads("archive"), 0);
}

/// A subscription config file (REST JSON): Avro with metadata, extended limits, plus `extra`.
fn config(dir: &Path, extra: Value) -> PathBuf {
    let mut cfg = json!({
        "name": SUB,
        "topic": "projects/proj/topics/top",
        "subsink": {"limits": "extended"},
        "cloudStorageConfig": {"bucket": "bkt", "maxMessages": "10",
                               "avroConfig": {"writeMetadata": true}},
    });
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    let path = dir.join("sub.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    path
}

fn run_file(cfg: &Path, src: &str, bucket: &Path, extra: &[&str]) -> Command {
    let mut c = subsink();
    c.args(["run", "--subscription"])
        .arg(cfg)
        .args(["--source", src, "--bucket-url"])
        .arg(format!("file://{}", bucket.display()))
        .args(extra);
    c
}

/// Records of every object in a local bucket, in name order.
fn records_below(bucket: &Path) -> Vec<Value> {
    avro_records(&paths_below(bucket))
}

fn checkpoint_of(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn filter_on_the_file_source_writes_matches_only_and_the_checkpoint_settles_the_rest() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let mut f = std::fs::File::create(&src).unwrap();
    let mut keep = Vec::new();
    // Every third message matches, and the last ten do not: the checkpoint must still pass them.
    for i in 0..100 {
        let kind = if i % 3 == 0 && i < 90 { "keep" } else { "drop" };
        let m = Message {
            data: format!("m{i}").into_bytes().into(),
            attributes: [
                ("kind".to_string(), kind.to_string()),
                ("i".to_string(), i.to_string()),
            ]
            .into(),
            message_id: format!("id-{i}"),
            publish_time_micros: 1_700_000_000_000_000,
            ordering_key: String::new(),
        };
        writeln!(f, "{}", m.to_json_line()).unwrap();
        if kind == "keep" {
            keep.push(m.message_id);
        }
    }
    drop(f);
    let cfg = config(work.path(), json!({"filter": "attributes.kind = \"keep\""}));
    let bucket = work.path().join("bucket");
    let cp = work.path().join("cp.json");
    let src_arg = src.display().to_string();
    let cp_arg = cp.display().to_string();
    let s = summary(&run_ok(&mut run_file(
        &cfg,
        &src_arg,
        &bucket,
        &["--checkpoint", &cp_arg],
    )));
    assert_eq!(s["messages_read"], 100);
    assert_eq!(s["messages_filtered"], 100 - keep.len());
    assert_eq!(s["messages_written"], keep.len());
    // Objects in the order their files were opened (names in one second sort by uuid).
    let files: Vec<PathBuf> = s["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| bucket.join(o.as_str().unwrap()))
        .collect();
    assert_eq!(files.len(), files_below(&bucket).len());
    let got = message_ids(&avro_records(&files));
    assert_eq!(got, keep, "only matching messages, in order");
    // Settled: the watermark is past every message, the filtered tail included.
    let state = checkpoint_of(&cp);
    assert_eq!(state["offset"], std::fs::metadata(&src).unwrap().len());
    assert_eq!(state["line"], 101);
    // A rerun finds nothing to do.
    let objects = files_below(&bucket);
    let s = summary(&run_ok(&mut run_file(
        &cfg,
        &src_arg,
        &bucket,
        &["--checkpoint", &cp_arg],
    )));
    assert_eq!(s["messages_read"], 0);
    assert_eq!(s["messages_filtered"], 0);
    assert_eq!(files_below(&bucket), objects);
}

#[test]
fn a_missing_message_id_is_the_line_number_also_after_a_resume_and_on_stdin() {
    let work = tempfile::tempdir().unwrap();
    let cfg = config(work.path(), json!({}));
    // Line 2 is blank (not a message, but a line); line 4 is the pull form.
    let text = "{\"data\":\"YQ==\",\"messageId\":\"given\"}\n\
                \n\
                {\"data\":\"Yg==\"}\n\
                {\"ackId\":\"x\",\"message\":{\"data\":\"Yw==\"}}\n\
                {\"attributes\":{\"k\":\"v\"}}\n";
    let src = work.path().join("in.ndjson");
    std::fs::write(&src, text).unwrap();
    let ids = |bucket: &Path| -> Vec<String> { message_ids(&records_below(bucket)) };
    let b1 = work.path().join("file");
    run_ok(&mut run_file(&cfg, &src.display().to_string(), &b1, &[]));
    assert_eq!(ids(&b1), ["given", "3", "4", "5"]);
    // stdin: the same lines, the same numbers.
    let b2 = work.path().join("stdin");
    let mut child = run_file(&cfg, "-", &b2, &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    exited_ok(child.wait_with_output().unwrap());
    assert_eq!(ids(&b2), ["given", "3", "4", "5"]);
    // A resumed run numbers lines from the start of the file, not from where it resumed: line 3
    // is bad (`@` is not base64), the run stops there, then the line is mended in place.
    let bad = "{\"data\":\"YQ==\"}\n{\"data\":\"Yg==\"}\n{\"data\":\"Y@==\"}\n\
               {\"data\":\"Yw==\"}\n\n{\"data\":\"ZA==\"}\n";
    let src = work.path().join("resume.ndjson");
    std::fs::write(&src, bad).unwrap();
    let b3 = work.path().join("resume");
    let cp = work.path().join("cp.json");
    let cp_arg = cp.display().to_string();
    let src_arg = src.display().to_string();
    let out = run_file(&cfg, &src_arg, &b3, &["--checkpoint", &cp_arg])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(ids(&b3), ["1", "2"]);
    assert_eq!(checkpoint_of(&cp)["line"], 3);
    std::fs::write(&src, bad.replace("Y@==", "YQ==")).unwrap();
    run_ok(&mut run_file(
        &cfg,
        &src_arg,
        &b3,
        &["--checkpoint", &cp_arg],
    ));
    let mut got = ids(&b3);
    got.sort();
    assert_eq!(got, ["1", "2", "3", "4", "6"]);
}

/// The first hour: README's examples call `subsink`, so README says how it gets on PATH, and
/// what it says reads partitioned Avro is what can: pyarrow has no Avro reader (checked here
/// against the installed pyarrow), and DuckDB reads Avro only through an extension it downloads.
#[test]
fn readme_puts_subsink_on_path_and_names_what_reads_partitioned_avro() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let examples = text.find("## Examples").unwrap();
    let first_run = examples + text[examples..].find("subsink run").unwrap();
    let before = &text[examples..first_run];
    assert!(
        before.contains("`cargo install --path .`") && before.contains("target/release/subsink"),
        "README's examples call `subsink` without saying how it gets on PATH:\n{before}"
    );
    let at = text.find("**Partitioned paths**").unwrap();
    let para = &text[at..at + text[at..].find("```").unwrap()];
    assert!(
        !para.contains("Spark, DuckDB or pyarrow"),
        "README still says pyarrow and DuckDB read partitioned Avro:\n{para}"
    );
    assert!(
        para.contains("has no Avro reader") && para.contains("fastavro"),
        "{para}"
    );
    // The claim itself: the pyarrow the tests install has no Avro reader.
    let probe = "import importlib.util as u, pyarrow; print(u.find_spec('pyarrow.avro') is None)";
    assert_eq!(venv_python(["-c", probe], &[]).trim(), "True");
}
