//! The archive source (docs/replay.md): what an export wrote, read back by the real binary from a
//! local bucket folder and from an S3 server (moto), into objects (compared byte for byte with
//! the original export), a Delta table (read with deltalake) and a Pub/Sub topic (the emulator).

mod util;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use subsink::message::Message;
use util::servers::Azurite;
use util::*;

const FIXED: [&str; 4] = ["--fixed-time", "2024-05-06T07:08:09Z", "--seed", "7"];

fn input(name: &str) -> PathBuf {
    root().join("fixtures/input").join(name)
}

/// Messages with attributes, some with ordering keys, some payloads with bytes that are not
/// UTF-8 (no newline: Text cannot carry one).
fn messages(n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let mut m = numbered_message(i, 40);
            m.publish_time_micros = 1_700_000_000_000_000 + i as i64 * 1_001;
            m.message_id = format!("m-{i}");
            if i % 3 == 0 {
                m.ordering_key = format!("key-{}", i % 5);
            }
            if i % 7 == 0 {
                let mut d = m.data.to_vec();
                d.extend_from_slice(&[0xff, 0x00, 0xc3]);
                m.data = d.into();
            }
            m
        })
        .collect()
}

/// `subsink run` writing `format` objects (gcloud-style flags, `extra`) into the folder `out`.
fn export_cmd(out: &Path, format: &str, extra: &[&str]) -> Command {
    let mut c = storage_run_cmd("bkt", format);
    c.arg("--bucket-url")
        .arg(format!("file://{}", out.display()))
        .args(extra);
    c
}

/// `subsink run` of the same subscription, for `--publish-to`: no bucket (one beside
/// `--publish-to` is refused, since nothing is written to it).
fn publish_cmd() -> Command {
    storage_run_cmd("bkt", "text")
}

/// Every file below `dir` (relative name, bytes), in name order.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = files_below(dir)
        .into_iter()
        .map(|f| {
            let bytes = std::fs::read(dir.join(&f)).unwrap();
            (f, bytes)
        })
        .collect();
    v.sort();
    v
}

fn archive_url(dir: &Path) -> String {
    format!("file://{}/", dir.display())
}

/// Export `src` as `format` + `extra` into `a`, replay `a` with the same settings into `b`: the
/// two folders must hold the same objects, byte for byte. The replay's summary.
fn export_then_replay(
    work: &Path,
    src: &Path,
    format: &str,
    extra: &[&str],
    replay_extra: &[&str],
) -> Value {
    let (a, b) = (work.join("a"), work.join("b"));
    let mut first = export_cmd(&a, format, extra);
    first.args(FIXED).arg("--source").arg(src);
    run_ok(&mut first);
    std::fs::write(a.join("README.txt"), "not an export object\n").unwrap();
    let mut again = export_cmd(&b, format, extra);
    again
        .args(FIXED)
        .args(replay_extra)
        .arg("--source")
        .arg(archive_url(&a));
    let s = summary(&run_ok(&mut again));
    let mut want = contents(&a);
    want.retain(|(n, _)| n != "README.txt");
    let got = contents(&b);
    assert!(!want.is_empty());
    assert_eq!(
        got.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        want.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "{format} {extra:?}: object names"
    );
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        assert!(g == w, "{format} {extra:?}: {name} differs");
    }
    assert_eq!(s["archive"]["objects_skipped"], 1, "{s}");
    assert_eq!(s["archive"]["objects_read"], want.len() as u64, "{s}");
    s
}

#[test]
fn every_layout_replays_into_a_byte_identical_re_export() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let msgs = messages(2_500);
    write_lines(&src, &msgs);
    // One object per export: objects of one second (all of them, with --fixed-time) are read in
    // name order, i.e. in the order of their uuids, not in the order they were written.
    let split = ["--avro-block-size", "4KiB"];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("text", vec![]),
        ("avro", vec![]),
        ("avro", vec!["--cloud-storage-write-metadata"]),
        (
            "avro",
            vec!["--cloud-storage-write-metadata", "--avro-codec", "zstd"],
        ),
        (
            "avro",
            vec!["--cloud-storage-write-metadata", "--avro-codec", "snappy"],
        ),
        (
            "avro",
            vec!["--cloud-storage-write-metadata", "--avro-codec", "deflate"],
        ),
    ];
    for (i, (format, extra)) in cases.iter().enumerate() {
        let dir = work.path().join(format!("case{i}"));
        let extra: Vec<&str> = extra.iter().chain(&split).copied().collect();
        let s = export_then_replay(&dir, &src, format, &extra, &[]);
        assert_eq!(
            s["messages_written"],
            msgs.len() as u64,
            "{format} {extra:?}"
        );
    }
}

#[test]
fn topic_schema_layouts_replay_as_json_or_binary_payloads() {
    let work = tempfile::tempdir().unwrap();
    let src = input("topic-messages.ndjson");
    let schema = input("event.avsc");
    let topic = [
        "--cloud-storage-use-topic-schema",
        "--topic-schema",
        schema.to_str().unwrap(),
    ];
    for (i, metadata) in [false, true].into_iter().enumerate() {
        for (j, encoding) in ["json", "binary"].into_iter().enumerate() {
            let mut extra: Vec<&str> = topic.to_vec();
            if metadata {
                extra.push("--cloud-storage-write-metadata");
            }
            let dir = work.path().join(format!("case{i}{j}"));
            let s =
                export_then_replay(&dir, &src, "avro", &extra, &["--schema-encoding", encoding]);
            assert_eq!(s["messages_written"], 6);
        }
    }
    // Layout C into Text: each record becomes its payload in the asked encoding.
    let (a, t) = (work.path().join("case00/a"), work.path().join("text"));
    let mut c = export_cmd(&t, "text", &["--schema-encoding", "json"]);
    c.arg("--source").arg(archive_url(&a));
    run_ok(&mut c);
    let files = files_below(&t);
    let text = String::from_utf8(std::fs::read(t.join(&files[0])).unwrap()).unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(
        first,
        json!({"id": 1, "name": "first", "tags": ["a", "b"], "amount": {"double": 1.5}, "kind": "CLICK", "ok": true})
    );
    assert_eq!(text.lines().count(), 6);
}

/// The NDJSON input of a replay of layout B: what subsink's file source reads back (the
/// summary's messages, ids, attributes, ordering keys), through an export to NDJSON-like Avro read
/// with fastavro.
#[test]
fn metadata_is_restored_exactly_and_layouts_without_it_get_documented_ids() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let msgs = messages(50);
    write_lines(&src, &msgs);
    // Text archive → Avro with metadata: ids `<key>#<index>`, time of the name.
    let a = work.path().join("a");
    let mut c = export_cmd(&a, "text", &["--cloud-storage-file-prefix", "ev/"]);
    c.args(FIXED).arg("--source").arg(&src);
    run_ok(&mut c);
    let b = work.path().join("b");
    let mut c = export_cmd(&b, "avro", &["--cloud-storage-write-metadata"]);
    c.arg("--source").arg(archive_url(&a));
    run_ok(&mut c);
    let recs = records_of(&dump_all(&b));
    let key = files_below(&a).remove(0);
    assert!(key.starts_with("ev/2024-05-06T07:08:09+00:00_"), "{key}");
    assert_eq!(recs.len(), 50);
    for (i, (r, m)) in recs.iter().zip(&msgs).enumerate() {
        assert_eq!(r["message_id"], format!("{key}#{i}"));
        assert_eq!(r["publish_time"], 1_714_979_289_000_000i64);
        assert_eq!(r["attributes"], json!({}));
        assert_eq!(r["data"], b64(&m.data));
    }
    // Avro with metadata → Avro with metadata: everything as published.
    let a = work.path().join("c");
    let mut c = export_cmd(&a, "avro", &["--cloud-storage-write-metadata"]);
    c.arg("--source").arg(&src);
    run_ok(&mut c);
    let b = work.path().join("d");
    let mut c = export_cmd(&b, "avro", &["--cloud-storage-write-metadata"]);
    c.arg("--source").arg(archive_url(&a));
    run_ok(&mut c);
    let recs = records_of(&dump_all(&b));
    assert_eq!(recs.len(), 50);
    for (r, m) in recs.iter().zip(&msgs) {
        let mut attrs: std::collections::BTreeMap<String, String> = m.attributes.to_map();
        if !m.ordering_key.is_empty() {
            attrs.insert("ordering_key".into(), m.ordering_key.clone());
        }
        assert_eq!(r["message_id"], m.message_id);
        assert_eq!(r["publish_time"], m.publish_time_micros);
        assert_eq!(r["attributes"], json!(attrs));
        assert_eq!(r["data"], b64(&m.data));
    }
}

fn dump_all(dir: &Path) -> Vec<Value> {
    let files = paths_below(dir);
    assert!(!files.is_empty(), "no objects in {}", dir.display());
    fastavro_dump(&files)
}

#[test]
fn archive_subscription_and_time_range_narrow_what_is_read() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    write_lines(&src, &messages(30));
    let a = work.path().join("a");
    // Two exports into one bucket: Avro under `ev/` at two times, Text under `tx/`.
    for (prefix, format, time) in [
        ("ev/", "avro", "2024-05-06T07:08:09Z"),
        ("ev/", "avro", "2024-05-07T07:08:09Z"),
        ("tx/", "text", "2024-05-06T07:08:09Z"),
    ] {
        let mut c = export_cmd(
            &a,
            format,
            &[
                "--cloud-storage-file-prefix",
                prefix,
                "--cloud-storage-file-suffix",
                ".bin",
                "--fixed-time",
                time,
            ],
        );
        c.arg("--source").arg(&src);
        run_ok(&mut c);
    }
    let sub = work.path().join("sub.json");
    std::fs::write(
        &sub,
        json!({
            "name": "projects/proj/subscriptions/writer",
            "topic": "projects/proj/topics/top",
            "cloudStorageConfig": {"bucket": "bkt", "filenamePrefix": "ev/", "filenameSuffix": ".bin",
                                   "avroConfig": {}}
        })
        .to_string(),
    )
    .unwrap();
    let replay = |extra: &[&str]| {
        let out = work.path().join(format!("out{}", extra.len()));
        let mut c = export_cmd(&out, "text", extra);
        c.arg("--source").arg(archive_url(&a));
        summary(&run_ok(&mut c))
    };
    // By default every export object is read: 3 objects, 90 messages.
    let s = replay(&[]);
    assert_eq!(s["messages_written"], 90, "{s}");
    assert_eq!(s["archive"]["objects_read"], 3);
    assert_eq!(s["archive"]["objects_skipped"], 0);
    // The writer subscription: only its prefix, suffix and layout.
    let s = replay(&["--archive-subscription", sub.to_str().unwrap()]);
    assert_eq!(s["messages_written"], 60, "{s}");
    assert_eq!(s["archive"]["objects_skipped"], 1);
    // And a time range: only the first day.
    let s = replay(&[
        "--archive-subscription",
        sub.to_str().unwrap(),
        "--from",
        "2024-05-06",
        "--to",
        "2024-05-07",
    ]);
    assert_eq!(s["messages_written"], 30, "{s}");
    assert_eq!(s["archive"]["objects_skipped"], 2);
}

#[test]
fn broken_objects_name_the_object_and_record_and_skip_goes_on() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    write_lines(&src, &messages(300));
    let a = work.path().join("a");
    let mut c = export_cmd(
        &a,
        "avro",
        &[
            "--cloud-storage-write-metadata",
            "--cloud-storage-max-messages",
            "100",
            "--avro-block-size",
            "1KiB",
        ],
    );
    c.args(FIXED).arg("--source").arg(&src);
    run_ok(&mut c);
    let names = files_below(&a);
    assert_eq!(names.len(), 3);
    // The second object cut in the middle of a block; crash debris of another tool named like
    // an export object after the last one.
    let second = a.join(&names[1]);
    let bytes = std::fs::read(&second).unwrap();
    std::fs::write(&second, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let debris = a.join("2099-01-01T00:00:00+00:00_0f8c7e6a-1b2c-4d3e-8f90-123456789abc");
    std::fs::write(&debris, b"Obj\x01\x99garbage").unwrap();
    let replay = |on_bad: &str, out: &str| {
        let mut c = export_cmd(&work.path().join(out), "text", &["--on-bad-input", on_bad]);
        c.arg("--source").arg(archive_url(&a));
        c.output().unwrap()
    };
    let out = replay("fail", "o1");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:", names[1])) && err.contains("truncated"),
        "{err}"
    );
    let out = exited_ok(replay("skip", "o2"));
    let s = summary(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(s["archive"]["objects_broken"], 2, "{s}");
    assert_eq!(s["bad_lines"], 2, "{s}");
    let written = s["messages_written"].as_u64().unwrap();
    // The first and last objects whole, the second up to its last whole block.
    assert!((200..300).contains(&written), "{s}");
    let debris_name = debris.file_name().unwrap().to_str().unwrap();
    assert!(err.contains(&format!("{debris_name}:0:")), "{err}");
    let re = regex_record(&err, &names[1]);
    assert_eq!(re + 200, written, "the record where it broke: {err}");
}

/// The record index the log gives for `object` (`<object>:<record>: …`).
fn regex_record(log: &str, object: &str) -> u64 {
    let at = log.find(&format!("{object}:")).expect("object named") + object.len() + 1;
    log[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap()
}

const DELTA_IDS: &str = r#"
import json, sys, os
import deltalake
dt = deltalake.DeltaTable(sys.argv[1])
print(json.dumps(sorted(r["message_id"] for r in dt.to_pyarrow_table(columns=["message_id"]).to_pylist())))
sys.stdout.flush()
os._exit(0)
"#;

#[test]
fn kill_9_then_rerun_replays_every_message_exactly_once_into_delta_and_objects() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let n = 40_000;
    let msgs = messages(n);
    write_lines(&src, &msgs);
    let a = work.path().join("a");
    let mut c = export_cmd(
        &a,
        "avro",
        &[
            "--cloud-storage-write-metadata",
            "--cloud-storage-max-messages",
            "4000",
        ],
    );
    c.arg("--source").arg(&src);
    run_ok(&mut c);
    let objects = files_below(&a).len();
    assert_eq!(objects, 10);
    let mut want: Vec<String> = msgs.iter().map(|m| m.message_id.clone()).collect();
    want.sort();
    let size = (objects as u64) << 32;

    // Into a Delta table.
    let sub = work.path().join("table.json");
    std::fs::write(
        &sub,
        json!({"name": SUB, "topic": "projects/proj/topics/top",
               "bigqueryConfig": {"table": "p.d.t", "writeMetadata": true},
               "subsink": {"table": {"maxMessages": "700"}}})
        .to_string(),
    )
    .unwrap();
    let table = work.path().join("table");
    let cp = work.path().join("cp-table.json");
    let cmd = || {
        let mut c = subsink();
        c.args(["run", "--subscription"])
            .arg(&sub)
            .arg("--table-url")
            .arg(format!("file://{}", table.display()))
            .arg("--checkpoint")
            .arg(&cp)
            .arg("--source")
            .arg(archive_url(&a));
        c
    };
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    kill_rounds(3, &cp, size, &mut seed, || {
        cmd()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    });
    let s = summary(&run_ok(&mut cmd()));
    assert!(s["messages_written"].as_u64().unwrap() < n as u64, "{s}");
    let got: Vec<String> =
        serde_json::from_value(python_json(DELTA_IDS, table.to_str().unwrap(), &[])).unwrap();
    assert_eq!(got.len(), want.len(), "duplicates or losses in the table");
    assert_eq!(got, want);
    assert_eq!(summary(&run_ok(&mut cmd()))["messages_written"], 0);

    // Into objects (Avro with metadata, smaller files).
    let b = work.path().join("b");
    let cp = work.path().join("cp-objects.json");
    let cmd = || {
        let mut c = export_cmd(
            &b,
            "avro",
            &[
                "--cloud-storage-write-metadata",
                "--cloud-storage-max-messages",
                "900",
            ],
        );
        c.arg("--checkpoint")
            .arg(&cp)
            .arg("--source")
            .arg(archive_url(&a));
        c
    };
    kill_rounds(3, &cp, size, &mut seed, || {
        cmd()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    });
    run_ok(&mut cmd());
    let mut got = message_ids(&records_of(&dump_all(&b)));
    got.sort();
    assert_eq!(got.len(), want.len(), "duplicates or losses in the objects");
    assert_eq!(got, want);
}

#[test]
fn an_s3_archive_is_listed_and_streamed() {
    let s3 = S3Server::start();
    let api = s3.api();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let msgs = messages(3_000);
    write_lines(&src, &msgs);
    api.create_bucket("archive");
    let mut c = s3_archive_cmd(
        &api,
        "avro",
        "events/",
        "16MiB",
        &src,
        &[
            "--cloud-storage-write-metadata",
            "--cloud-storage-max-messages",
            "1000",
        ],
    );
    c.args(FIXED);
    run_ok(&mut c);
    let out = work.path().join("out");
    let mut c = export_cmd(&out, "avro", &["--cloud-storage-write-metadata"]);
    c.args(FIXED)
        .arg("--source")
        .arg("s3://archive/events/")
        .envs(api.env());
    let s = summary(&run_ok(&mut c));
    assert_eq!(s["messages_written"], 3_000, "{s}");
    assert_eq!(s["archive"]["objects_read"], 3, "{s}");
    let mut got = message_ids(&records_of(&dump_all(&out)));
    got.sort();
    let mut want: Vec<String> = msgs.iter().map(|m| m.message_id.clone()).collect();
    want.sort();
    assert_eq!(got, want);
}

/// `az://`: an archive in Azure Blob storage (Azurite) is listed and streamed like an S3 one.
#[test]
fn an_azure_archive_is_listed_and_streamed() {
    let az = Azurite::start();
    az.create_container("archive");
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let msgs = messages(3_000);
    write_lines(&src, &msgs);
    let mut c = storage_run_cmd("archive", "avro");
    c.args([
        "--cloud-storage-write-metadata",
        "--cloud-storage-max-messages",
        "1000",
        "--cloud-storage-file-prefix",
        "events/",
        "--bucket-url",
        "az://archive",
        "--source",
    ])
    .arg(&src)
    .args(FIXED)
    .envs(az.env());
    run_ok(&mut c);
    let out = work.path().join("out");
    let mut c = export_cmd(&out, "avro", &["--cloud-storage-write-metadata"]);
    c.args(FIXED)
        .arg("--source")
        .arg("az://archive/events/")
        .envs(az.env());
    let s = summary(&run_ok(&mut c));
    assert_eq!(s["messages_written"], 3_000, "{s}");
    assert_eq!(s["archive"]["objects_read"], 3, "{s}");
    let mut got = message_ids(&records_of(&dump_all(&out)));
    got.sort();
    let mut want: Vec<String> = msgs.iter().map(|m| m.message_id.clone()).collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn archive_flags_without_an_archive_source_exit_2() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    write_lines(&src, &messages(1));
    let mut c = export_cmd(&work.path().join("o"), "text", &["--from", "2024-01-01"]);
    c.arg("--source").arg(&src);
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("need an archive --source"));
}

#[test]
fn publish_to_puts_messages_back_on_a_topic_with_attributes_and_ordering_keys() {
    use subsink::pubsub::SubscriptionSpec;
    use util::pubsub::{sub, topic, PubsubEnv};
    let env = PubsubEnv::start();
    let mut spec = SubscriptionSpec::new(sub("replayed"), topic("replay"));
    spec.enable_message_ordering = true;
    env.topic_and_sub(spec);
    let work = tempfile::tempdir().unwrap();
    let msgs = messages(2_500);
    let a = metadata_archive(work.path(), &msgs);
    let mut c = publish_cmd();
    c.arg("--publish-to")
        .arg(topic("replay"))
        .arg("--source")
        .arg(archive_url(&a))
        .env("PUBSUB_EMULATOR_HOST", env.emu.host());
    let s = summary(&run_ok(&mut c));
    assert_eq!(s["messages_written"], 2_500, "{s}");
    let got = env.drain(&sub("replayed"), std::time::Duration::from_secs(5));
    assert_eq!(got.len(), msgs.len(), "every message once");
    let key = |m: &Message| {
        (
            m.data.to_vec(),
            m.attributes.to_map(),
            m.ordering_key.clone(),
        )
    };
    let mut g: Vec<_> = got.iter().map(key).collect();
    let mut w: Vec<_> = msgs.iter().map(key).collect();
    g.sort();
    w.sort();
    assert!(g == w, "data, attributes and ordering keys as archived");
    // Each ordering key's messages in archive order: the objects in name order (all of one
    // second here, so in uuid order), the records in file order.
    let mut files = paths_below(&a);
    files.sort();
    let archived = records_of(&fastavro_dump(&files));
    for k in 0..5 {
        let ok = format!("key-{k}");
        let got: Vec<Value> = got
            .iter()
            .filter(|m| m.ordering_key == ok)
            .map(|m| b64(&m.data))
            .collect();
        let want: Vec<Value> = archived
            .iter()
            .filter(|r| r["attributes"]["ordering_key"] == json!(ok))
            .map(|r| r["data"].clone())
            .collect();
        assert!(!want.is_empty());
        assert!(got == want, "{ok}: not in archive order");
    }
}

/// `msgs` exported under `work/a` as Avro with metadata, 1,000 messages per object.
fn metadata_archive(work: &Path, msgs: &[Message]) -> PathBuf {
    let src = work.join("in.ndjson");
    write_lines(&src, msgs);
    let a = work.join("a");
    let mut c = export_cmd(
        &a,
        "avro",
        &[
            "--cloud-storage-write-metadata",
            "--cloud-storage-max-messages",
            "1000",
        ],
    );
    c.arg("--source").arg(&src);
    run_ok(&mut c);
    a
}

/// An Avro-with-metadata archive of `n` messages in objects of 1,000, plus a file that is not an
/// export object, in `work/a`: its folder and the bytes of its export objects.
fn small_archive(work: &Path, n: usize) -> (PathBuf, u64) {
    let a = metadata_archive(work, &messages(n));
    let bytes = paths_below(&a)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    std::fs::write(a.join("README.txt"), "not an export object\n").unwrap();
    (a, bytes)
}

/// `'…'`-quoted for sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// On a terminal (util-linux `script` gives the run a pseudo-terminal), the bar counts objects and
/// bytes over what was listed, with an ETA, and a log line after it starts on a line of its own;
/// with stderr not a terminal, none of it is written.
#[test]
fn the_progress_bar_counts_objects_and_bytes_on_a_terminal_only() {
    let work = tempfile::tempdir().unwrap();
    let (a, total) = small_archive(work.path(), 3_000);
    let replay = |out: &str| -> Command {
        let mut c = export_cmd(&work.path().join(out), "text", &[]);
        c.arg("--source")
            .arg(archive_url(&a))
            .env("SUBSINK_LOG", "info");
        c
    };
    // On a terminal: stderr is the pty (what `script` writes out); stdout, the summary, a file.
    let c = replay("tty");
    let mut line: Vec<String> = vec![sh_quote(c.get_program().to_str().unwrap())];
    line.extend(c.get_args().map(|a| sh_quote(a.to_str().unwrap())));
    let summary_path = work.path().join("summary.json");
    let shell = format!(
        "{} >{}",
        line.join(" "),
        sh_quote(summary_path.to_str().unwrap())
    );
    let mut script = Command::new("script");
    without_subsink_env(&mut script);
    let out = script
        .args(["-qfec", &shell, "/dev/null"])
        .envs(c.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .expect("util-linux script");
    assert!(out.status.success(), "{out:?}");
    let s: Value =
        serde_json::from_str(std::fs::read_to_string(&summary_path).unwrap().trim()).unwrap();
    assert_eq!(s["messages_written"], 3_000, "{s}");
    let tty = String::from_utf8_lossy(&out.stdout).to_string();
    // The bar's states, each drawn after a carriage return (or an erase) on the terminal.
    let states: Vec<&str> = tty
        .split(['\r', '\n'])
        .flat_map(|l| l.split("\x1b[2K"))
        .filter(|l| l.contains(" objects "))
        .collect();
    let total_h = indicatif::HumanBytes(total).to_string();
    let last = states
        .last()
        .unwrap_or_else(|| panic!("no bar drawn:\n{tty}"));
    let done = format!("3/3 objects {total_h}/{total_h} 3000 msgs ");
    assert!(last.contains(&done), "{done:?} not in {last:?}");
    assert!(last.contains("100%"), "{last}");
    let eta = last.split("ETA ").nth(1).unwrap_or_default();
    let digits = eta.chars().take_while(char::is_ascii_digit).count();
    assert!(
        digits > 0 && eta[digits..].starts_with('s'),
        "no ETA in {last:?}"
    );
    assert!(
        states
            .iter()
            .all(|l| l.contains("/3 objects ") && l.contains(&format!("/{total_h} "))),
        "every state counts over the 3 objects and {total_h} listed: {states:#?}"
    );
    // The log lines after the bar (the objects written on drain) are not glued to its last line.
    let after = &tty[tty.rfind(&done).unwrap()..];
    let end = after.find(['\r', '\n']).unwrap_or(after.len());
    assert!(
        !after[..end].contains("file written"),
        "a log line on the bar's line: {:?}",
        &after[..end]
    );
    assert!(after.contains("file written"), "{after}");
    // Not a terminal: no bar, nothing of it in the log.
    let out = run_ok(&mut replay("pipe"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("archive listed"), "{err}");
    for not in [" objects ", "ETA", "msg/s", "\r", "\x1b["] {
        assert!(!err.contains(not), "{not:?} in the log:\n{err}");
    }
}

/// The archive series on `/metrics`, scraped mid-run while the archive's store holds the read of
/// its last object: objects listed, read, skipped and broken, bytes read, next to the usual series
/// of any source (messages received, written and acked: those of the two objects read); then the
/// run ends with every object read.
#[test]
fn archive_metrics_are_served_during_a_run() {
    use std::time::Duration;
    use util::http::metric;
    use util::proxy::S3Proxy;
    let s3 = S3Server::start();
    let api = s3.api();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    write_lines(&src, &messages(3_000));
    api.create_bucket("archive");
    let mut c = s3_archive_cmd(
        &api,
        "avro",
        "events/",
        "16MiB",
        &src,
        &[
            "--cloud-storage-write-metadata",
            "--cloud-storage-max-messages",
            "1000",
        ],
    );
    run_ok(&mut c);
    api.python(
        "import boto3; boto3.client('s3').put_object(Bucket='archive', Key='events/README.txt', Body=b'not an export object')",
    );
    let mut objects = api.list_under("archive", "events/");
    objects.retain(|(k, _)| !k.ends_with("README.txt"));
    objects.sort();
    assert_eq!(objects.len(), 3, "{objects:?}");
    let proxy = S3Proxy::start(&s3, work.path());
    let last = objects[2].0.rsplit('_').next().unwrap().to_string();
    proxy.set(json!({"mode": "hold", "reads": true, "key": last}));
    let port = free_port();
    let out = work.path().join("out");
    let child = spawn_draining(
        // Objects of 1,000 messages: the two objects read before the hold are written and acked.
        export_cmd(&out, "text", &["--cloud-storage-max-messages", "1000"])
            .arg("--source")
            .arg("s3://archive/events/")
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .envs(proxy.env())
            .stdout(Stdio::piped()),
    );
    let base = format!("http://127.0.0.1:{port}");
    let sub = json!({"subscription": SUB});
    let outcome = |o: &str| json!({"subscription": SUB, "outcome": o});
    let m = |family: &str, name: &str, labels: &Value| {
        std::panic::catch_unwind(|| metric(&base, family, name, labels)).unwrap_or(None)
    };
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        poll(Duration::from_secs(60), Duration::from_millis(200), || {
            let got = (
                m(
                    "subsink_archive_objects",
                    "subsink_archive_objects_total",
                    &outcome("read"),
                ),
                m(
                    "subsink_messages_received",
                    "subsink_messages_received_total",
                    &sub,
                ),
                m(
                    "subsink_messages_written",
                    "subsink_messages_written_total",
                    &sub,
                ),
                m(
                    "subsink_messages_acked",
                    "subsink_messages_acked_total",
                    &sub,
                ),
            );
            let want = (Some(2.0), Some(2_000.0), Some(2_000.0), Some(2_000.0));
            (got == want).then_some(()).ok_or(format!(
                "objects read, messages received, written, acked: {got:?}"
            ))
        })
    }));
    if let Err(e) = polled {
        let err = kill_9(child);
        std::panic::resume_unwind(Box::new(format!("{e:?}; subsink's log:\n{err}")));
    }
    let series =
        |family: &str, name: &str, labels: &Value| (name.to_string(), m(family, name, labels));
    let got = vec![
        series(
            "subsink_archive_objects_listed",
            "subsink_archive_objects_listed",
            &sub,
        ),
        series(
            "subsink_archive_objects",
            "subsink_archive_objects_total",
            &outcome("skipped"),
        ),
        series(
            "subsink_archive_objects",
            "subsink_archive_objects_total",
            &outcome("broken"),
        ),
        series(
            "subsink_archive_bytes_read",
            "subsink_archive_bytes_read_total",
            &sub,
        ),
    ];
    let want = vec![
        ("subsink_archive_objects_listed".to_string(), Some(4.0)),
        ("subsink_archive_objects_total".to_string(), Some(1.0)),
        ("subsink_archive_objects_total".to_string(), Some(0.0)),
        (
            "subsink_archive_bytes_read_total".to_string(),
            Some((objects[0].1 + objects[1].1) as f64),
        ),
    ];
    if got != want {
        let err = kill_9(child);
        panic!("{got:?} != {want:?}; subsink's log:\n{err}");
    }
    // Released: the run reads the last object and ends.
    proxy.set(json!({"mode": "pass"}));
    let done = output(child);
    assert!(done.status.success(), "{done:?}");
    let s = summary(&done);
    assert_eq!(s["messages_written"], 3_000, "{s}");
    assert_eq!(s["messages_acked"], 3_000, "passed by the watermark: {s}");
    assert_eq!(s["archive"]["objects_read"], 3, "{s}");
    let total: u64 = objects.iter().map(|(_, n)| n).sum();
    assert_eq!(s["archive"]["bytes_read"], total, "{s}");
}

/// The backfill recipe into BigQuery (the emulator): an archive with metadata replayed into a
/// table with the metadata columns; every row as archived — data, message id, publish time,
/// attributes (with the ordering key as the `ordering_key` entry) — and the destination's
/// subscription name.
#[test]
fn an_archive_backfills_a_bigquery_table() {
    use base64::Engine as _;
    use util::bigquery::{serial, shared_bq};
    let _bq = serial();
    let n = 2_500;
    let work = tempfile::tempdir().unwrap();
    let msgs = messages(n);
    let a = metadata_archive(work.path(), &msgs);
    std::fs::write(a.join("README.txt"), "not an export object\n").unwrap();
    let bq = shared_bq();
    bq.table(
        "replay",
        "events",
        json!([
            {"name": "data", "type": "BYTES"},
            {"name": "subscription_name", "type": "STRING"},
            {"name": "message_id", "type": "STRING"},
            {"name": "publish_time", "type": "TIMESTAMP"},
            {"name": "attributes", "type": "JSON"},
        ]),
    );
    let dest = "projects/subsink-bq/subscriptions/backfill";
    let cfg = work.path().join("table.json");
    std::fs::write(
        &cfg,
        json!({
            "name": dest,
            "topic": "projects/subsink-bq/topics/events",
            "subsink": {"limits": "extended"},
            "bigqueryConfig": {"table": "unused.ds.t", "writeMetadata": true},
        })
        .to_string(),
    )
    .unwrap();
    let out = run_ok(
        subsink()
            .args(["run", "--subscription"])
            .arg(&cfg)
            .arg("--source")
            .arg(archive_url(&a))
            .args(["--table-url", &bq.url("replay", "events")])
            .args(bq.flags()),
    );
    let s = summary(&out);
    assert_eq!(s["messages_written"], n as u64, "{s}");
    assert_eq!(s["messages_acked"], n as u64, "{s}");
    assert_eq!(s["archive"]["objects_read"], 3, "{s}");
    assert_eq!(s["archive"]["objects_skipped"], 1, "{s}");
    let rows = bq.rows("replay", "events", "message_id");
    assert_eq!(rows.len(), n, "every archived message once");
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    let mut want: Vec<&Message> = msgs.iter().collect();
    want.sort_by(|x, y| x.message_id.cmp(&y.message_id));
    for (r, m) in rows.iter().zip(want) {
        assert_eq!(r["message_id"], json!(m.message_id), "{r}");
        assert_eq!(r["data"], json!(b64(&m.data)), "{r}");
        assert_eq!(
            r["publish_time"],
            json!(m.publish_time_micros.to_string()),
            "{r}"
        );
        assert_eq!(r["subscription_name"], json!(dest), "{r}");
        let mut attrs: serde_json::Map<String, Value> = m
            .attributes
            .to_map()
            .into_iter()
            .map(|(k, v)| (k, json!(v)))
            .collect();
        if !m.ordering_key.is_empty() {
            attrs.insert("ordering_key".into(), json!(m.ordering_key));
        }
        let got: Value = serde_json::from_str(r["attributes"].as_str().unwrap()).unwrap();
        assert_eq!(got, Value::Object(attrs), "{r}");
    }
}

/// The republish recipe onto Kafka (Tansu, read back with confluent-kafka): every archived message
/// once, data as the value, attributes as headers, the ordering key as the record key (none
/// without one), and the records of each key in archive order in their partition.
#[test]
fn publish_to_kafka_puts_messages_back_as_records() {
    use base64::Engine as _;
    use std::collections::BTreeMap;
    use util::kafka::tansu;
    let _alone = kafka_alone();
    let b64 = |d: &[u8]| json!(base64::engine::general_purpose::STANDARD.encode(d));
    let kafka = tansu();
    kafka.create_topic("replayed", 3);
    let work = tempfile::tempdir().unwrap();
    let msgs = messages(2_500);
    let a = metadata_archive(work.path(), &msgs);
    let mut c = publish_cmd();
    c.arg("--publish-to")
        .arg(format!("kafka://{}/replayed", kafka.brokers))
        .args(["--publish-option", "client.id=replayer"])
        .arg("--source")
        .arg(archive_url(&a));
    let s = summary(&run_ok(&mut c));
    assert_eq!(s["messages_written"], 2_500, "{s}");
    let got = kafka.read("replayed", msgs.len());
    assert_eq!(got.len(), msgs.len(), "every message once");
    // (value, headers, key), as confluent-kafka gives them (base64).
    let record = |r: &Value| {
        let mut h: Vec<(String, Value)> = r["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|kv| (kv[0].as_str().unwrap().to_string(), kv[1].clone()))
            .collect();
        h.sort_by(|x, y| x.0.cmp(&y.0));
        (r["value"].clone(), h, r["key"].clone())
    };
    let want_record = |m: &Message| {
        let h: Vec<(String, Value)> = m
            .attributes
            .to_map()
            .into_iter()
            .map(|(k, v)| (k, b64(v.as_bytes())))
            .collect();
        let key = match m.ordering_key.as_str() {
            "" => Value::Null,
            k => b64(k.as_bytes()),
        };
        (b64(&m.data), h, key)
    };
    let mut g: Vec<_> = got.iter().map(record).collect();
    let mut w: Vec<_> = msgs.iter().map(want_record).collect();
    g.sort_by_key(|x| x.to_owned().0.to_string() + &x.2.to_string());
    w.sort_by_key(|x| x.to_owned().0.to_string() + &x.2.to_string());
    if let Some((x, y)) = g.iter().zip(&w).find(|(x, y)| x != y) {
        panic!("values, headers and keys as archived: got {x:?}, want {y:?}");
    }
    // Each key's records in archive order (objects in name order, records in file order).
    let mut files = paths_below(&a);
    files.sort();
    let archived = records_of(&fastavro_dump(&files));
    let mut by_key: BTreeMap<String, Vec<(i64, i64, Value)>> = BTreeMap::new();
    for r in &got {
        if let Some(k) = r["key"].as_str() {
            by_key.entry(k.to_string()).or_default().push((
                r["partition"].as_i64().unwrap(),
                r["offset"].as_i64().unwrap(),
                r["value"].clone(),
            ));
        }
    }
    assert_eq!(by_key.len(), 5, "{:?}", by_key.keys());
    for k in 0..5 {
        let ok = format!("key-{k}");
        let mut recs = by_key.remove(b64(ok.as_bytes()).as_str().unwrap()).unwrap();
        let partitions: std::collections::BTreeSet<i64> = recs.iter().map(|r| r.0).collect();
        assert_eq!(partitions.len(), 1, "{ok}: one partition");
        recs.sort_by_key(|r| r.1);
        let got: Vec<Value> = recs.into_iter().map(|r| r.2).collect();
        let want: Vec<Value> = archived
            .iter()
            .filter(|r| r["attributes"]["ordering_key"] == json!(ok))
            .map(|r| r["data"]["$b64"].clone())
            .collect();
        assert!(!want.is_empty());
        assert!(got == want, "{ok}: not in archive order");
    }
    // A topic the brokers do not have: said at startup, nothing read.
    let mut c = publish_cmd();
    c.arg("--publish-to")
        .arg(format!("kafka://{}/no-such-topic", kafka.brokers))
        .arg("--source")
        .arg(archive_url(&a));
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(r#"the brokers do not have topic "no-such-topic""#),
        "{err}"
    );
    // Producer settings pass through to librdkafka (which refuses one it does not know), except
    // those subsink sets; an error names the key, never the value.
    for (option, code, want) in [
        (
            "no.such.setting=v4lue",
            1,
            "--publish-option no.such.setting: No such configuration property",
        ),
        ("acks=v4lue", 2, "--publish-option acks: subsink sets it"),
    ] {
        let mut c = publish_cmd();
        c.arg("--publish-to")
            .arg(format!("kafka://{}/replayed", kafka.brokers))
            .args([
                "--publish-option",
                "linger.ms=5",
                "--publish-option",
                option,
            ])
            .arg("--source")
            .arg(archive_url(&a));
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{err}");
        assert!(err.contains(want), "{want:?} not in {err}");
        assert!(!err.contains("v4lue"), "the value logged: {err}");
    }
}

/// Held by the tests of this binary that use its broker: one of them stops it (SIGSTOP).
fn kafka_alone() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The messages (their attribute `i`) of the archive in `a`, in the order a replay reads them.
fn archive_order(a: &Path) -> Vec<String> {
    let mut files = paths_below(a);
    files.sort();
    records_of(&fastavro_dump(&files))
        .iter()
        .map(|r| r["attributes"]["i"].as_str().unwrap().to_string())
        .collect()
}

/// Start `cmd`, a republish of an archive of `n` messages in objects of 1,000 with `--checkpoint
/// cp`; once it settled a first batch, hold the topic's answers (`hold(true)`) for 4 s: the run
/// goes on waiting and its checkpoint does not move meanwhile. Then `kill -9` it, release the
/// topic (`hold(false)`) and return how many messages the checkpoint passed, mid-archive.
fn kill_while_held(cmd: &mut Command, cp: &Path, n: usize, hold: impl Fn(bool)) -> usize {
    use std::time::Duration;
    let mut child = spawn_draining(cmd.stdout(Stdio::null()));
    poll(
        Duration::from_secs(60),
        Duration::from_millis(2),
        || match checkpoint_offset(cp) {
            Some(o) if o > 0 => Ok(()),
            o => Err(format!("no batch settled: checkpoint {o:?}")),
        },
    );
    hold(true);
    std::thread::sleep(Duration::from_secs(2));
    let held = checkpoint_offset(cp).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let still = checkpoint_offset(cp).unwrap();
    let running = child.try_wait().unwrap().is_none();
    let log = kill_9(child);
    hold(false);
    assert!(running, "the run ended while the topic was held:\n{log}");
    assert_eq!(
        still, held,
        "the checkpoint moved while the topic acknowledged nothing:\n{log}"
    );
    // (object ordinal, record index).
    let settled = (held >> 32) as usize * 1000 + (held & 0xffff_ffff) as usize;
    assert!(
        settled > 0 && settled < n,
        "not mid-archive: {settled} settled"
    );
    settled
}

/// What a rerun from the checkpoint left on the topic, `got` (attribute `i` → times published),
/// for the archive read in `order` with `settled` messages settled before the kill: none lost,
/// none that is not archived, those settled before the kill once (the rerun did not publish them
/// again), and no more than the one batch in flight (1,000) twice. How many twice.
fn check_republished(
    order: &[String],
    settled: usize,
    got: &std::collections::BTreeMap<String, usize>,
) -> usize {
    let lost: Vec<&String> = order.iter().filter(|i| !got.contains_key(*i)).collect();
    assert!(
        lost.is_empty(),
        "{} messages lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    assert_eq!(got.len(), order.len(), "messages that are not archived");
    let again: Vec<&String> = order[..settled].iter().filter(|i| got[*i] > 1).collect();
    assert!(
        again.is_empty(),
        "settled before the kill, published again: {again:?}"
    );
    let twice: usize = got.values().map(|c| c - 1).sum();
    assert!(
        twice <= 1000,
        "{twice} published twice: more than the batch in flight"
    );
    eprintln!("{settled} messages settled at the kill; {twice} published twice");
    twice
}

/// A republish onto Kafka settles a batch (moves the checkpoint) only once the broker acknowledged
/// every record of it, and a rerun after `kill -9` loses nothing: the broker is stopped (SIGSTOP)
/// after the first batches were settled, so the batch in flight waits for its acknowledgements;
/// the checkpoint stays where it was while the run waits, the run is killed there, the broker
/// goes on, and a rerun from the checkpoint publishes the rest ([`check_republished`]).
#[test]
fn publish_to_kafka_settles_acknowledged_batches_only_and_a_rerun_after_kill_9_loses_nothing() {
    use base64::Engine as _;
    use util::kafka::tansu;
    let _alone = kafka_alone();
    let kafka = tansu();
    kafka.create_topic("republished", 3);
    let work = tempfile::tempdir().unwrap();
    let n = 20_000;
    let a = metadata_archive(work.path(), &messages(n));
    let order = archive_order(&a);
    let cp = work.path().join("republish.json");
    let cmd = || {
        let mut c = publish_cmd();
        c.arg("--publish-to")
            .arg(format!("kafka://{}/republished", kafka.brokers))
            .arg("--checkpoint")
            .arg(&cp)
            .arg("--source")
            .arg(archive_url(&a));
        c
    };
    let settled = kill_while_held(&mut cmd(), &cp, n, |on| kafka.freeze(on));
    let s = summary(&run_ok(&mut cmd()));
    assert_eq!(s["messages_written"], (n - settled) as u64, "{s}");
    let got = tally(kafka.read_all("republished", 3).iter().map(|r| {
        let h = r["headers"].as_array().unwrap();
        let i = h
            .iter()
            .find(|h| h[0] == "i")
            .unwrap_or_else(|| panic!("no header i: {r}"));
        let i = base64::engine::general_purpose::STANDARD
            .decode(i[1].as_str().unwrap())
            .unwrap();
        String::from_utf8(i).unwrap()
    }));
    check_republished(&order, settled, &got);
}

/// The same onto Pub/Sub: the topic answers every Publish with UNAVAILABLE (a proxy in front of
/// the emulator) after the first batches were settled, so the batch in flight is retried and never
/// published; the checkpoint stays where it was, the run is killed there, and a rerun from the
/// checkpoint publishes the rest: every archived message once.
#[test]
fn publish_to_pubsub_settles_published_batches_only_and_a_rerun_after_kill_9_loses_nothing() {
    use std::time::Duration;
    use subsink::pubsub::SubscriptionSpec;
    use util::proxy::PubsubProxy;
    use util::pubsub::{sub, topic, PubsubEnv};
    let env = PubsubEnv::start();
    env.topic_and_sub(SubscriptionSpec::new(sub("republished"), topic("replay")));
    let work = tempfile::tempdir().unwrap();
    let proxy = PubsubProxy::start(&env.emu.host(), &work.path().join("proxy.log"), None);
    let n = 10_000;
    let a = metadata_archive(work.path(), &messages(n));
    let order = archive_order(&a);
    let cp = work.path().join("republish.json");
    let cmd = || {
        let mut c = publish_cmd();
        c.arg("--publish-to")
            .arg(topic("replay"))
            .arg("--checkpoint")
            .arg(&cp)
            .arg("--source")
            .arg(archive_url(&a))
            .env("PUBSUB_EMULATOR_HOST", proxy.host());
        c
    };
    let settled = kill_while_held(&mut cmd(), &cp, n, |on| {
        let codes = vec!["UNAVAILABLE"; if on { 100 } else { 0 }];
        proxy.fail_next("Publish", &codes);
    });
    assert!(!proxy.faults().is_empty(), "no Publish was held");
    // What the killed run published: the settled batches, and any Publish call of the batch in
    // flight that passed before the proxy was armed (the worker may send one in the moments
    // between the checkpoint's move and the arming). Those, and only those, the rerun publishes
    // again: a call the proxy failed published nothing.
    let passed: u64 = proxy.calls().publishes.iter().map(|p| p.2).sum();
    let s = summary(&run_ok(&mut cmd()));
    assert_eq!(s["messages_written"], (n - settled) as u64, "{s}");
    let mut got = Vec::new();
    poll(Duration::from_secs(60), Duration::ZERO, || {
        got.extend(env.drain(&sub("republished"), Duration::from_secs(3)));
        let ids: std::collections::BTreeSet<&str> =
            got.iter().map(|m| m.attributes.get("i").unwrap()).collect();
        match ids.len() {
            k if k >= n => Ok(()),
            k => Err(format!("{k} of {n} messages on the topic")),
        }
    });
    let got = tally(
        got.iter()
            .map(|m| m.attributes.get("i").unwrap().to_string()),
    );
    assert_eq!(
        check_republished(&order, settled, &got) as i64,
        passed as i64 - settled as i64,
        "published twice: exactly what passed the proxy unsettled ({passed} passed before the \
         kill, {settled} settled); a Publish call that failed published nothing"
    );
}
