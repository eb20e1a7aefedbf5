//! End-to-end tests of the storage writer: the real binary, real files, a real S3-compatible server
//! (moto), and Avro read back with fastavro.

mod util;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use util::*;

fn input(name: &str) -> PathBuf {
    root().join("fixtures/input").join(name)
}

/// Flags for a subscription in gcloud style writing into the local folder `out`.
fn storage_cmd(out: &Path, format: &str, extra: &[&str]) -> std::process::Command {
    let mut c = storage_run_cmd("bkt", format);
    c.arg("--bucket-url")
        .arg(format!("file://{}", out.display()))
        .args(extra);
    c
}

/// Read every object of a local bucket with fastavro, in name order.
fn dump_all(dir: &Path) -> Vec<Value> {
    let files = paths_below(dir);
    assert!(!files.is_empty(), "no objects in {}", dir.display());
    fastavro_dump(&files)
}

fn expected_metadata_record(m: &Message) -> Value {
    let mut attrs: BTreeMap<String, String> = m.attributes.to_map();
    if !m.ordering_key.is_empty() {
        attrs.insert("ordering_key".into(), m.ordering_key.clone());
    }
    json!({
        "subscription_name": SUB,
        "message_id": m.message_id,
        "publish_time": m.publish_time_micros,
        "attributes": attrs,
        "data": b64(&m.data),
    })
}

#[test]
fn plain_and_metadata_layouts_read_back_with_fastavro_for_every_codec() {
    let msgs = messages_of(&input("messages.ndjson"));
    for codec in ["null", "deflate", "snappy", "zstd"] {
        for metadata in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let mut extra = vec!["--avro-codec", codec, "--source"];
            let src = input("messages.ndjson");
            extra.push(src.to_str().unwrap());
            if metadata {
                extra.push("--cloud-storage-write-metadata");
            }
            let out = run_ok(&mut storage_cmd(dir.path(), "avro", &extra));
            let s = summary(&out);
            assert_eq!(s["messages_written"], msgs.len() as u64);
            let dumps = dump_all(dir.path());
            assert_eq!(dumps.len(), 1, "one file for 10 messages");
            assert_eq!(
                dumps[0]["codec"],
                if codec == "zstd" { "zstandard" } else { codec }
            );
            let name = dumps[0]["schema"]["name"].as_str().unwrap().to_string();
            let recs = records_of(&dumps);
            assert_eq!(recs.len(), msgs.len());
            for (r, m) in recs.iter().zip(&msgs) {
                if metadata {
                    assert_eq!(name, "com.google.pubsub.PubsubMessageWithMetadata");
                    assert_eq!(r, &expected_metadata_record(m), "codec {codec}");
                } else {
                    assert_eq!(name, "com.google.pubsub.PubsubMessage");
                    assert_eq!(r, &json!({"data": b64(&m.data)}), "codec {codec}");
                }
            }
        }
    }
}

fn expected_events() -> Vec<Value> {
    let base = [
        json!({"id": 1, "name": "first", "tags": ["a", "b"], "amount": 1.5, "kind": "CLICK", "ok": true}),
        json!({"id": -2, "name": "café", "tags": [], "amount": null, "kind": "VIEW", "ok": false}),
        json!({"id": 1_099_511_627_776u64, "name": "", "tags": ["x"], "amount": -0.25, "kind": "CLICK", "ok": true}),
    ];
    // The fixture holds the three records JSON-encoded, then the same three BINARY-encoded.
    base.iter().chain(base.iter()).cloned().collect()
}

#[test]
fn topic_schema_layouts_read_back_with_fastavro_for_every_codec() {
    let msgs = messages_of(&input("topic-messages.ndjson"));
    let events = expected_events();
    for codec in ["null", "deflate", "snappy", "zstd"] {
        for metadata in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let src = input("topic-messages.ndjson");
            let schema = input("event.avsc");
            let mut extra = vec![
                "--avro-codec",
                codec,
                "--cloud-storage-use-topic-schema",
                "--topic-schema",
                schema.to_str().unwrap(),
                "--source",
                src.to_str().unwrap(),
            ];
            if metadata {
                extra.push("--cloud-storage-write-metadata");
            }
            run_ok(&mut storage_cmd(dir.path(), "avro", &extra));
            let dumps = dump_all(dir.path());
            let recs = records_of(&dumps);
            assert_eq!(recs.len(), events.len());
            let fields: Vec<String> = dumps[0]["schema"]["fields"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["name"].as_str().unwrap().to_string())
                .collect();
            if metadata {
                assert_eq!(
                    fields,
                    [
                        "id",
                        "name",
                        "tags",
                        "amount",
                        "kind",
                        "ok",
                        "subscription_name",
                        "message_id",
                        "publish_time",
                        "attributes"
                    ]
                );
            } else {
                assert_eq!(fields, ["id", "name", "tags", "amount", "kind", "ok"]);
            }
            for ((r, want), m) in recs.iter().zip(&events).zip(&msgs) {
                let mut want = want.clone();
                if metadata {
                    let meta = expected_metadata_record(m);
                    for k in [
                        "subscription_name",
                        "message_id",
                        "publish_time",
                        "attributes",
                    ] {
                        want[k] = meta[k].clone();
                    }
                }
                assert_eq!(r, &want, "codec {codec} metadata {metadata}");
            }
        }
    }
}

#[test]
fn text_is_data_and_newline_per_message() {
    let dir = tempfile::tempdir().unwrap();
    let src = input("messages.ndjson");
    run_ok(&mut storage_cmd(
        dir.path(),
        "text",
        &["--source", src.to_str().unwrap()],
    ));
    let files = files_below(dir.path());
    assert_eq!(files.len(), 1);
    let got = std::fs::read(dir.path().join(&files[0])).unwrap();
    let mut want = Vec::new();
    for m in messages_of(&src) {
        want.extend_from_slice(&m.data);
        want.push(b'\n');
    }
    assert_eq!(got, want);
}

#[test]
fn max_messages_and_max_bytes_split_files_in_order() {
    let msgs = messages_of(&input("messages.ndjson"));
    let src = input("messages.ndjson");
    // max messages 3: files of 3, 3, 3, 1, in input order.
    let dir = tempfile::tempdir().unwrap();
    let out = summary(&run_ok(&mut storage_cmd(
        dir.path(),
        "text",
        &[
            "--cloud-storage-max-messages",
            "3",
            "--source",
            src.to_str().unwrap(),
            "--fixed-time",
            "2023-09-25T04:10:00Z",
            "--seed",
            "1",
        ],
    )));
    let objects = summary_objects(&out);
    assert_eq!(objects.len(), 4);
    let mut counts = Vec::new();
    let mut all = Vec::new();
    for o in &objects {
        assert!(o.starts_with("2023-09-25T04:10:00+00:00_"), "{o}");
        let text = std::fs::read(dir.path().join(o)).unwrap();
        counts.push(text.iter().filter(|&&b| b == b'\n').count());
        all.extend(text);
    }
    // Messages 3 (all 256 byte values) and 6 hold a newline of their own.
    assert_eq!(counts, [3, 4, 4, 1]);
    let want: Vec<u8> = msgs
        .iter()
        .flat_map(|m| [m.data.to_vec(), b"\n".to_vec()].concat())
        .collect();
    assert_eq!(all, want);

    // max bytes 2000 (binary size flags as gcloud parses them): the 3000-byte message gets a file
    // of its own; no other file passes 2000 bytes.
    let dir = tempfile::tempdir().unwrap();
    let out = summary(&run_ok(&mut storage_cmd(
        dir.path(),
        "text",
        &[
            "--cloud-storage-max-bytes",
            "2000B",
            "--source",
            src.to_str().unwrap(),
        ],
    )));
    let sizes: Vec<u64> = out["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            std::fs::metadata(dir.path().join(o.as_str().unwrap()))
                .unwrap()
                .len()
        })
        .collect();
    assert!(sizes.contains(&3001), "{sizes:?}");
    assert!(sizes.iter().all(|&s| s <= 2000 || s == 3001), "{sizes:?}");
    assert_eq!(sizes.iter().sum::<u64>(), want.len() as u64);
}

#[test]
fn max_duration_fires_without_new_messages() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = storage_cmd(
        dir.path(),
        "text",
        &["--cloud-storage-max-duration", "1s", "--source", "-"],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(
            b"{\"data\":\"YQ==\",\"messageId\":\"1\"}\n{\"data\":\"Yg==\",\"messageId\":\"2\"}\n",
        )
        .unwrap();
    stdin.flush().unwrap();
    let start = Instant::now();
    // Input stays open: only the timer can finalize the file.
    while files_below(dir.path()).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no object after 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "finalized too early: {waited:?}"
    );
    let files = files_below(dir.path());
    assert_eq!(
        std::fs::read(dir.path().join(&files[0])).unwrap(),
        b"a\nb\n"
    );
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(summary(&out)["messages_written"], 2);
}

#[test]
fn bad_input_fail_stops_and_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let src = input("bad.ndjson");
    let out = storage_cmd(dir.path(), "text", &["--source", src.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.ndjson:2: field `data`: invalid base64"),
        "{err}"
    );
    let s = summary(&out);
    assert_eq!(s["bad_lines"], 1);
    // The good message before the bad line is written whole; nothing after it.
    assert_eq!(s["messages_written"], 1);
    let files = files_below(dir.path());
    assert_eq!(files.len(), 1);
    assert_eq!(
        std::fs::read(dir.path().join(&files[0])).unwrap(),
        b"good 1\n"
    );
}

#[test]
fn bad_input_skip_counts_and_logs_every_line() {
    let dir = tempfile::tempdir().unwrap();
    let src = input("bad.ndjson");
    let out = storage_cmd(
        dir.path(),
        "text",
        &["--source", src.to_str().unwrap(), "--on-bad-input", "skip"],
    )
    .output()
    .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for line in [2, 4, 5, 6, 7] {
        assert!(
            err.contains(&format!("bad.ndjson:{line}: ")),
            "line {line} not reported:\n{err}"
        );
    }
    assert!(err.contains("publishTime"), "{err}");
    let s = summary(&out);
    assert_eq!(s["bad_lines"], 5);
    assert_eq!(s["messages_written"], 3);
    let files = files_below(dir.path());
    assert_eq!(
        std::fs::read(dir.path().join(&files[0])).unwrap(),
        b"good 1\ngood 2\ngood 3\n"
    );
}

#[test]
fn message_not_matching_topic_schema_is_reported_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let src = input("topic-bad.ndjson");
    let schema = input("event.avsc");
    let out = run_ok(&mut storage_cmd(
        dir.path(),
        "avro",
        &[
            "--cloud-storage-use-topic-schema",
            "--topic-schema",
            schema.to_str().unwrap(),
            "--source",
            src.to_str().unwrap(),
            "--on-bad-input",
            "skip",
        ],
    ));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("topic-bad.ndjson:2: message 1020"), "{err}");
    let s = summary(&out);
    assert_eq!(s["bad_messages"], 1);
    assert_eq!(s["messages_written"], 2);
}

#[test]
fn validate_lists_every_violation() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.json");
    std::fs::write(
        &cfg,
        r#"{"name":"projects/p/subscriptions/s","topic":"projects/proj/topics/top",
            "cloudStorageConfig":{"bucket":"b","filenameSuffix":"x/","maxDuration":"5s",
            "maxMessages":"10","filenameDatetimeFormat":"YYYY-MM-DD","textConfig":{},"avroConfig":{}}}"#,
    )
    .unwrap();
    let out = subsink()
        .args(["validate", "--subscription"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for field in [
        "cloudStorageConfig.filenameSuffix",
        "cloudStorageConfig.maxDuration",
        "cloudStorageConfig.maxMessages",
        "cloudStorageConfig.filenameDatetimeFormat",
    ] {
        assert!(err.contains(field), "{field} missing from:\n{err}");
    }
    assert!(
        err.contains("textConfig") || err.contains("avroConfig"),
        "{err}"
    );
    // Every example config is valid.
    for ex in [
        "storage-avro.json",
        "storage-text.json",
        "storage-topic-schema.yaml",
        "storage-local-test.json",
        "table-json.json",
    ] {
        let out = subsink()
            .args(["validate", "--subscription"])
            .arg(root().join("examples").join(ex))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{ex}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every message of `ids` appears exactly once across the Avro objects in `dir`.
fn assert_exactly_once(dir: &Path, ids: &[String]) {
    let recs = records_of(&dump_all(dir));
    let mut got = message_ids(&recs);
    got.sort();
    let mut want = ids.to_vec();
    want.sort();
    assert_eq!(got.len(), want.len(), "duplicates or losses");
    assert_eq!(got, want);
}

#[test]
fn checkpoint_resume_after_kill_writes_every_message_exactly_once() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let ids = write_numbered_messages(&src, 60_000, 200);
    let bucket = work.path().join("bucket");
    let cp = work.path().join("cp.json");
    let args = |c: &mut std::process::Command| {
        c.args([
            "--cloud-storage-write-metadata",
            "--cloud-storage-max-messages",
            "500",
            "--source",
        ])
        .arg(&src)
        .arg("--checkpoint")
        .arg(&cp);
    };
    // Kill -9 at several moments while objects are being written. Each kill waits until the run
    // has made progress of its own (its checkpoint watermark moved), then lands a random moment
    // later, and must find the run still working: on any machine every round is a crash, never a
    // plain run to the end.
    let size = std::fs::metadata(&src).unwrap().len();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    kill_rounds(4, &cp, size, &mut seed, || {
        let mut c = storage_cmd(&bucket, "avro", &[]);
        args(&mut c);
        c.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    });
    let mut c = storage_cmd(&bucket, "avro", &[]);
    args(&mut c);
    let out = run_ok(&mut c);
    let s = summary(&out);
    assert!(s["messages_written"].as_u64().unwrap() < 60_000);
    // Every file in the bucket folder is a whole object: a staging file left by a killed put
    // (object_store's `<name>#N`, or subsink's own staging folder) is debris a reader of the
    // folder would take for a corrupt object.
    let everything = files_below(&bucket);
    assert!(
        everything
            .iter()
            .all(|f| !f.contains('#') && !f.starts_with('.')),
        "staging debris: {everything:?}"
    );
    assert!(everything.len() >= 120, "{} objects", everything.len());
    assert_exactly_once(&bucket, &ids);
    // A further run finds nothing left to do.
    let mut c = storage_cmd(&bucket, "avro", &[]);
    args(&mut c);
    let s = summary(&run_ok(&mut c));
    assert_eq!(s["messages_written"], 0);
}

#[test]
fn s3_end_to_end_single_put_and_multipart() {
    let s3 = S3Server::start();
    s3.create_bucket("archive");
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    // ~12 MiB of messages: with a 5 MiB threshold the object streams as a multipart upload.
    let ids = write_numbered_messages(&src, 3000, 4096);
    for (threshold, files) in [("64MiB", "single put"), ("5MiB", "multipart")] {
        let prefix = threshold.to_lowercase();
        let mut c = s3_archive_cmd(
            &s3,
            "avro",
            &format!("{prefix}/"),
            threshold,
            &src,
            &["--cloud-storage-write-metadata"],
        );
        let s = summary(&run_ok(&mut c));
        assert_eq!(s["messages_written"], 3000, "{files}");
        let listed = s3.list_under("archive", &prefix);
        assert_eq!(listed.len(), 1, "{files}: {listed:?}");
        assert!(listed[0].1 > 12_000_000, "{listed:?}");
        let local = work.path().join(format!("{prefix}.avro"));
        let content_type = s3.download("archive", &listed[0].0, &local);
        assert_eq!(content_type, "application/octet-stream", "{files}");
        let dump = fastavro_dump(&[local]);
        let got: Vec<&str> = dump[0]["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["message_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            got,
            ids.iter().map(String::as_str).collect::<Vec<_>>(),
            "{files}"
        );
    }
    assert_eq!(s3.open_multipart_uploads("archive"), 0);
}

#[test]
fn failed_upload_is_not_settled_and_rerun_writes_it_once() {
    let s3 = S3Server::start();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let ids = write_numbered_messages(&src, 50, 10);
    let cp = work.path().join("cp.json");
    let cmd = || {
        let mut c = storage_run_cmd("missing", "avro");
        c.args([
            "--cloud-storage-write-metadata",
            "--cloud-storage-max-messages",
            "20",
            "--bucket-url",
            "s3://missing",
            "--source",
        ])
        .arg(&src)
        .arg("--checkpoint")
        .arg(&cp)
        .envs(s3.env());
        c
    };
    // The bucket does not exist: every upload fails, nothing is settled, the run says which.
    let out = cmd().output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ids 100000..100019"), "{err}");
    assert!(err.contains("not done"), "{err}");
    let s = summary(&out);
    assert_eq!(s["messages_written"], 0);
    assert_eq!(s["failed_objects"].as_array().unwrap().len(), 3);
    let state: Value = serde_json::from_str(&std::fs::read_to_string(&cp).unwrap()).unwrap();
    assert_eq!(
        state["offset"], 0,
        "watermark must not pass unwritten messages"
    );
    // Once the bucket exists, the rerun writes everything, once.
    s3.create_bucket("missing");
    let s = summary(&run_ok(&mut cmd()));
    assert_eq!(s["messages_written"], 50);
    let listed = s3.list("missing");
    assert_eq!(listed.len(), 3);
    let mut files = Vec::new();
    for (i, (k, _)) in listed.iter().enumerate() {
        let p = work.path().join(format!("{i}.avro"));
        s3.download("missing", k, &p);
        files.push(p);
    }
    let mut got = message_ids(&avro_records(&files));
    got.sort();
    assert_eq!(got, ids);
}

/// Issue 13: a prefix and format whose names have an empty (or `.`/`..`) path segment passed
/// `validate`, then `run` failed every message. Both refuse it now, naming the field and why.
#[test]
fn names_with_empty_or_dot_segments_are_refused_by_validate_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let src = input("messages.ndjson");
    for (prefix, format, field) in [
        ("logs/", "/YYYY/MM/DD/hh/mm/ss", "filenameDatetimeFormat"),
        ("a//b/", "YYYY-MM-DD/hh_mm_ss", "filenamePrefix"),
        ("./", "YYYY-MM-DD/hh_mm_ss", "filenamePrefix"),
        ("../", "YYYY-MM-DD/hh_mm_ss", "filenamePrefix"),
    ] {
        let flags = [
            "--cloud-storage-file-prefix",
            prefix,
            "--cloud-storage-file-datetime-format",
            format,
        ];
        let mut validate = subsink();
        validate.args([
            "validate",
            "--subscription-name",
            SUB,
            "--topic",
            "projects/proj/topics/top",
            "--cloud-storage-bucket",
            "bkt",
        ]);
        let mut run = storage_cmd(dir.path(), "text", &["--source", src.to_str().unwrap()]);
        for cmd in [&mut validate, &mut run] {
            let out = cmd.args(flags).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{prefix:?} {format:?}: {err}");
            assert!(
                err.contains(&format!(
                    "cloudStorageConfig.{field}: object names would look like"
                )) && err.contains("object_store"),
                "{prefix:?} {format:?}: {err}"
            );
        }
        assert!(files_below(dir.path()).is_empty());
    }
}

/// Issue 13: with an empty prefix and a format starting with `/`, the store drops the leading
/// `/`; the summary reports the object as stored.
#[test]
fn a_leading_slash_is_dropped_and_the_summary_names_the_stored_object() {
    let dir = tempfile::tempdir().unwrap();
    let src = input("messages.ndjson");
    let out = run_ok(&mut storage_cmd(
        dir.path(),
        "text",
        &[
            "--source",
            src.to_str().unwrap(),
            "--cloud-storage-file-datetime-format",
            "/YYYY/MM/DD/hh/mm/ss",
            "--fixed-time",
            "2023-09-25T04:10:00Z",
        ],
    ));
    let files = files_below(dir.path());
    assert_eq!(files.len(), 1);
    assert!(files[0].starts_with("2023/09/25/04/10/00_"), "{files:?}");
    assert_eq!(summary(&out)["objects"], json!(files));
}

/// Issue 13: arrays and scalars are bad lines (an array was read positionally as a message), a
/// line with neither data nor attributes is not a message, and every error names the field.
/// `--on-bad-input` decides: skip logs and counts each, fail stops at the first.
#[test]
fn non_object_lines_and_empty_messages_are_bad_lines_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.ndjson");
    std::fs::write(
        &src,
        concat!(
            "{\"data\":\"Z29vZCAx\"}\n",
            "[\"aGk=\"]\n",
            "[1,2,3]\n",
            "\"aGk=\"\n",
            "{\"messageId\":\"7\"}\n",
            "{\"data\":\"Z29vZCAy\",\"attributes\":{\"k\":1}}\n",
            "{\"ackId\":\"a\",\"message\":[\"aGk=\"]}\n",
            "{\"attributes\":{\"only\":\"attrs\"}}\n",
        ),
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let out = storage_cmd(
        &out_dir,
        "text",
        &["--source", src.to_str().unwrap(), "--on-bad-input", "skip"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    for want in [
        "in.ndjson:2: field `line`: a message must be a JSON object (a PubsubMessage), got an array",
        "in.ndjson:3: field `line`: a message must be a JSON object (a PubsubMessage), got an array",
        "in.ndjson:4: field `line`: a message must be a JSON object (a PubsubMessage), got a string",
        "in.ndjson:5: field `line`: a message needs non-empty data or at least one attribute",
        "in.ndjson:6: field `attributes.k`: expected a string, got 1",
        "in.ndjson:7: field `message`: a message must be a JSON object (a PubsubMessage), got an array",
    ] {
        assert!(err.contains(want), "{want}\n{err}");
    }
    let s = summary(&out);
    assert_eq!(s["bad_lines"], 6);
    assert_eq!(s["messages_written"], 2);
    let files = files_below(&out_dir);
    assert_eq!(
        std::fs::read(out_dir.join(&files[0])).unwrap(),
        b"good 1\n\n"
    );
    // Under `fail` the array stops the run at line 2, after writing line 1.
    let fail_dir = dir.path().join("fail");
    let out = storage_cmd(&fail_dir, "text", &["--source", src.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in.ndjson:2: field `line`"));
    assert_eq!(summary(&out)["messages_written"], 1);
}

/// Issue 13: docs/operating.md reserves exit code 2 for bad flags and config; a missing `--source` file (and
/// the flag combinations that cannot run) exited 1, as if messages had failed.
#[test]
fn bad_source_flags_exit_2_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such.ndjson");
    let src = input("messages.ndjson");
    let checkpoint = dir.path().join("ck.json");
    for (args, want) in [
        (
            vec!["--source", missing.to_str().unwrap()],
            format!("--source {}: ", missing.display()),
        ),
        (
            vec!["--source", dir.path().to_str().unwrap()],
            "is a directory".to_string(),
        ),
        (
            vec![
                "--source",
                "-",
                "--checkpoint",
                checkpoint.to_str().unwrap(),
            ],
            "--checkpoint needs a file source".to_string(),
        ),
    ] {
        let out = storage_cmd(&dir.path().join("out"), "text", &args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&want), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "no summary: the run never started");
    }
    // The good file runs.
    run_ok(&mut storage_cmd(
        &dir.path().join("out"),
        "text",
        &["--source", src.to_str().unwrap()],
    ));
}

/// Issue 27: a local error that waiting cannot mend fails the object at once — named, with the OS
/// error — instead of being retried for `--upload-retry-for` as if the store were down.
#[test]
fn a_file_where_the_prefix_folder_must_be_fails_the_object_at_once() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    std::fs::create_dir(&bucket).unwrap();
    std::fs::write(bucket.join("events"), b"a file, not a folder").unwrap();
    let started = Instant::now();
    let out = subsink()
        .args(["run", "--subscription"])
        .arg(root().join("examples/storage-avro.json"))
        .arg("--source")
        .arg(input("messages.ndjson"))
        .arg("--bucket-url")
        .arg(format!("file://{}", bucket.display()))
        .output()
        .unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        !err.contains("retrying"),
        "retried a permanent error:\n{err}"
    );
    // The first retry would come after a second; the default budget is five minutes.
    assert!(took < Duration::from_secs(20), "took {took:?}:\n{err}");
    let s = summary(&out);
    assert_eq!(s["messages_written"], 0);
    let failed = s["failed_objects"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{s}");
    let object = failed[0]["object"].as_str().unwrap();
    assert!(object.starts_with("events/"), "{object}");
    let error = failed[0]["error"].as_str().unwrap();
    assert!(error.contains(object), "{error}");
    assert!(
        error.contains("File exists") || error.contains("Not a directory"),
        "{error}"
    );
    assert_eq!(
        std::fs::read(bucket.join("events")).unwrap(),
        b"a file, not a folder"
    );
}

/// A named pipe as the source: its writer opens it and writes at once. Before, the flag check
/// opened the FIFO and closed it again before the source opened it for good: the writer, woken
/// by the first open, met no reader (EPIPE), and the run waited for a writer forever.
#[test]
fn a_fifo_source_is_opened_once_so_its_writer_never_meets_a_closed_pipe() {
    let src = input("messages.ndjson");
    let bytes = std::fs::read(&src).unwrap();
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let out = dir.path().join("out");
        let mut child = storage_cmd(&out, "text", &["--source", fifo.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let writer = {
            let (fifo, bytes) = (fifo.clone(), bytes.clone());
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut w = std::fs::OpenOptions::new().write(true).open(&fifo)?;
                w.write_all(&bytes)
            })
        };
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(30) {
                child.kill().unwrap();
                panic!("round {round}: the run still waits for its input after 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let wrote = writer.join().unwrap();
        assert!(wrote.is_ok(), "round {round}: the writer got {wrote:?}");
        assert!(status.success(), "round {round}: {status}");
        let files = files_below(&out);
        assert_eq!(files.len(), 1, "round {round}");
        let mut want = Vec::new();
        for m in messages_of(&src) {
            want.extend_from_slice(&m.data);
            want.push(b'\n');
        }
        assert_eq!(std::fs::read(out.join(&files[0])).unwrap(), want);
    }
}
