//! Outages of the store: SeaweedFS (an S3 server that stores on disk) is stopped for 60 s while
//! subsink writes to it, then started again on the same data. Uploads retry with capped backoff,
//! nothing is lost, nothing is written twice, and the run carries on by itself; past the retry
//! budget (`--upload-retry-for`) a file-source run exits 1 naming what is not done.

mod util;

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use subsink::pubsub::SubscriptionSpec;
use util::pubsub::{archive_config, sub, topic, worker_at, PubsubEnv};
use util::servers::*;
use util::*;

const OUTAGE: Duration = Duration::from_secs(60);

fn message(i: usize) -> Message {
    Message {
        data: format!("{i:08}-{}", "x".repeat(300)).into_bytes().into(),
        attributes: [("i".to_string(), i.to_string())].into(),
        message_id: format!("{}", 500_000 + i),
        publish_time_micros: 1_700_000_000_000_000 + i as i64,
        ordering_key: String::new(),
    }
}

/// Message ids (or `i` attributes) of every record in a bucket, sorted, and the object count.
fn records_in(api: &S3Api, bucket: &str, scratch: &Path, key: &str) -> (Vec<String>, usize) {
    let dir = scratch.join(format!("dl-{}", Instant::now().elapsed().as_nanos()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = api.download_files(bucket, &dir);
    let mut got: Vec<String> = avro_records(&files)
        .iter()
        .map(|r| match key {
            "i" => r["attributes"]["i"].as_str().unwrap().to_string(),
            _ => r["message_id"].as_str().unwrap().to_string(),
        })
        .collect();
    got.sort();
    let _ = std::fs::remove_dir_all(&dir);
    (got, files.len())
}

/// Avro with metadata in objects of 200 messages into `s3://bucket` on `api`; `extra` added.
fn storage_cmd(api: &S3Api, bucket: &str, extra: &[&str]) -> std::process::Command {
    let mut c = storage_run_cmd(bucket, "avro");
    c.args([
        "--cloud-storage-write-metadata",
        "--cloud-storage-max-messages",
        "200",
        "--bucket-url",
        &format!("s3://{bucket}"),
    ])
    .args(extra)
    .envs(api.env());
    c
}

fn wait_for_objects(api: &S3Api, bucket: &str, at_least: usize, limit: Duration) {
    let start = Instant::now();
    while api.list(bucket).len() < at_least {
        assert!(
            start.elapsed() < limit,
            "fewer than {at_least} objects after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn file_source_rides_out_a_60_s_store_outage_and_writes_everything_once() {
    let mut weed = SeaweedFs::start();
    let api = weed.api();
    api.create_bucket("outage");
    let work = tempfile::tempdir().unwrap();
    let n = 4000;
    let lines: Vec<String> = (0..n).map(|i| message(i).to_json_line()).collect();
    // stdin: the run is still reading when the store goes away.
    let mut child = storage_cmd(&api, "outage", &["--source", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for l in &lines[..n / 2] {
        writeln!(stdin, "{l}").unwrap();
    }
    stdin.flush().unwrap();
    wait_for_objects(&api, "outage", 2, Duration::from_secs(60));
    weed.stop();
    let stopped = Instant::now();
    // The rest of the input goes in from its own thread: with its uploads stuck, a file source
    // stops reading once its upload slots and read-ahead are full (memory stays bounded), so these
    // writes may block until the store is back. The outage lasts 60 s whatever the run reads.
    let rest = lines[n / 2..].to_vec();
    let writer = std::thread::spawn(move || {
        for l in &rest {
            writeln!(stdin, "{l}")?;
        }
        stdin.flush()
    });
    std::thread::sleep(OUTAGE.saturating_sub(stopped.elapsed()));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run gave up during the outage"
    );
    weed.restart();
    writer
        .join()
        .unwrap()
        .expect("the run read all of its input after the outage");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {}: {err}", out.status);
    let s = summary(&out);
    assert_eq!(s["messages_written"], n as u64, "{err}");
    assert!(err.contains("retrying"), "no retry was logged: {err}");
    let (got, objects) = records_in(&api, "outage", work.path(), "id");
    let want: Vec<String> = {
        let mut w: Vec<String> = (0..n).map(|i| message(i).message_id).collect();
        w.sort();
        w
    };
    assert_eq!(got.len(), n, "duplicates or losses");
    assert_eq!(got, want);
    assert_eq!(objects, n / 200);
    assert_eq!(api.open_multipart_uploads("outage"), 0);
}

#[test]
fn file_source_past_its_retry_budget_exits_1_naming_what_is_not_done() {
    let mut weed = SeaweedFs::start();
    let api = weed.api();
    api.create_bucket("down");
    weed.stop();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let mut f = std::fs::File::create(&src).unwrap();
    for i in 0..400 {
        writeln!(f, "{}", message(i).to_json_line()).unwrap();
    }
    drop(f);
    let cp = work.path().join("cp.json");
    let start = Instant::now();
    let out = storage_cmd(
        &api,
        "down",
        &[
            "--upload-retry-for",
            "6s",
            "--source",
            src.to_str().unwrap(),
            "--checkpoint",
            cp.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        took >= Duration::from_secs(6),
        "gave up after {took:?}, before the budget"
    );
    assert!(
        took < Duration::from_secs(60),
        "took {took:?} for a 6 s budget"
    );
    assert!(err.contains("ids 500000..500199"), "{err}");
    assert!(err.contains("ids 500200..500399"), "{err}");
    assert!(err.contains("not done"), "{err}");
    let s = summary(&out);
    assert_eq!(s["messages_written"], 0);
    assert_eq!(s["failed_objects"].as_array().unwrap().len(), 2);
    let state: Value = serde_json::from_str(&std::fs::read_to_string(&cp).unwrap()).unwrap();
    assert_eq!(state["offset"], 0, "settled past unwritten messages");
    // The store back, the rerun writes it all, once.
    weed.restart();
    let s = summary(&run_ok(&mut storage_cmd(
        &api,
        "down",
        &[
            "--source",
            src.to_str().unwrap(),
            "--checkpoint",
            cp.to_str().unwrap(),
        ],
    )));
    assert_eq!(s["messages_written"], 400);
    let (got, _) = records_in(&api, "down", work.path(), "id");
    assert_eq!(got.len(), 400);
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), 400);
}

#[test]
fn pubsub_source_rides_out_a_60_s_store_outage_without_redelivery_or_duplicates() {
    let mut weed = SeaweedFs::start();
    let api = weed.api();
    api.create_bucket("live");
    let env = PubsubEnv::start();
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.ack_deadline_seconds = 10;
    env.topic_and_sub(spec);
    let publish = |range: std::ops::Range<usize>| {
        let msgs: Vec<Message> = range
            .map(|i| Message {
                message_id: String::new(),
                publish_time_micros: 0,
                ..message(i)
            })
            .collect();
        env.publish(&topic("events"), &msgs)
    };
    let work = tempfile::tempdir().unwrap();
    let cfg = archive_config(
        work.path(),
        json!({"bucket": "live", "maxMessages": "200", "maxDuration": "2s"}),
        json!({}),
    );
    let n = 2000;
    publish(0..n / 2);
    let child = worker_at(
        &env.emu.host(),
        &cfg,
        "s3://live",
        &["--ack-lease", "10s"],
        &api.env(),
    );
    wait_for_objects(&api, "live", 2, Duration::from_secs(60));
    weed.stop();
    // Messages keep coming during the outage; they wait in open or uploading files, leased.
    publish(n / 2..n);
    std::thread::sleep(OUTAGE);
    weed.restart();
    poll(Duration::from_secs(180), Duration::from_secs(1), || {
        // Just after the restart SeaweedFS may list an object it cannot serve yet (GetObject
        // InternalError while its volume server registers again): a read that fails is a poll
        // that found nothing yet, not a failed test; the assertions below read again.
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            records_in(&api, "live", work.path(), "i")
        }));
        let Ok((got, _)) = read else {
            return Err("the store cannot serve its objects yet".to_string());
        };
        if got.iter().collect::<HashSet<_>>().len() >= n {
            Ok(())
        } else {
            Err(format!(
                "only {} of {n} messages after the store came back",
                got.len()
            ))
        }
    });
    let (out, err) = sigterm_ok(child);
    let s = summary(&out);
    let (got, _) = records_in(&api, "live", work.path(), "i");
    let seen = tally(&got);
    let twice: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).take(5).collect();
    assert!(twice.is_empty(), "messages written twice: {twice:?}\n{err}");
    assert_eq!(seen.len(), n, "{err}");
    assert_eq!(s["messages_acked"], n as u64, "{s}");
    assert_eq!(api.open_multipart_uploads("live"), 0);
}
