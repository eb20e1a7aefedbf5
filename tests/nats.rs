//! subsink on a NATS JetStream consumer: the real binary against a real `nats-server -js` (no
//! mocks), writing Avro to a local folder, read back by fastavro.
//!
//! One server serves every test of this binary (each test has its own stream); tests publish and
//! inspect consumers with async-nats.

mod util;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::AckPolicy, stream};
use serde_json::{json, Value};
use util::pubsub::{archive_config, topic};
use util::*;

/// The test binary's `nats-server`, started once on a thread that lives as long as the process;
/// the server gets SIGKILL when that thread's process ends (`PR_SET_PDEATHSIG`), so no server
/// outlives the tests.
fn server() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let port = free_port();
            let store = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nats-js");
            let _ = std::fs::remove_dir_all(&store);
            let mut cmd = Command::new(venv_bin("nats-server"));
            cmd.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
                .arg(&store)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let mut child = cmd.spawn().expect("start nats-server");
            let start = Instant::now();
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "nats-server exited early"
                );
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "nats-server not listening"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            tx.send(format!("nats://127.0.0.1:{port}")).unwrap();
            // This thread lives as long as the server (the death signal is tied to it).
            let _ = child.wait();
        });
        rx.recv().unwrap()
    })
}

struct Env {
    rt: tokio::runtime::Runtime,
    js: jetstream::Context,
    stream: String,
}

impl Env {
    /// A fresh stream `name` on subjects `name.>`, and if asked a dead-letter stream on `dlq.name`.
    fn start(name: &str, dead_letters: bool) -> Env {
        let rt = rt();
        let js = rt.block_on(async {
            let client = async_nats::connect(server()).await.unwrap();
            let js = jetstream::new(client);
            js.create_stream(stream::Config {
                name: name.to_string(),
                subjects: vec![format!("{name}.>")],
                ..Default::default()
            })
            .await
            .unwrap();
            if dead_letters {
                js.create_stream(stream::Config {
                    name: format!("{name}_DLQ"),
                    subjects: vec![format!("dlq.{name}")],
                    ..Default::default()
                })
                .await
                .unwrap();
            }
            js
        });
        Env {
            rt,
            js,
            stream: name.to_string(),
        }
    }

    /// Publish `n` numbered messages (header `i`) of `size` bytes to `<stream>.events`, waiting
    /// for every ack of the stream.
    fn publish_n(&self, from: usize, n: usize, size: usize) {
        self.rt.block_on(async {
            let mut acks = Vec::new();
            for i in from..from + n {
                let data = numbered_data(i, size);
                let mut h = async_nats::HeaderMap::new();
                h.insert("i", i.to_string().as_str());
                acks.push(
                    self.js
                        .publish_with_headers(format!("{}.events", self.stream), h, data.into())
                        .await
                        .unwrap(),
                );
                if acks.len() >= 1000 {
                    for a in acks.drain(..) {
                        a.await.unwrap();
                    }
                }
            }
            for a in acks {
                a.await.unwrap();
            }
        });
    }

    /// `(delivered and not acked, not yet delivered)` of a consumer.
    fn pending(&self, consumer: &str) -> (usize, u64) {
        self.rt.block_on(async {
            let s = self.js.get_stream(&self.stream).await.unwrap();
            let info = s.consumer_info(consumer).await.unwrap();
            (info.num_ack_pending, info.num_pending)
        })
    }

    fn consumer_config(&self, consumer: &str) -> jetstream::consumer::Config {
        self.rt.block_on(async {
            let s = self.js.get_stream(&self.stream).await.unwrap();
            s.consumer_info(consumer).await.unwrap().config
        })
    }

    /// Every message of the dead-letter stream: `(headers, payload)`.
    fn dead_letters(&self) -> Vec<(BTreeMap<String, String>, Vec<u8>)> {
        self.rt.block_on(async {
            let mut s = self
                .js
                .get_stream(format!("{}_DLQ", self.stream))
                .await
                .unwrap();
            let last = s.info().await.unwrap().state.last_sequence;
            let mut out = Vec::new();
            for seq in 1..=last {
                let m = s.get_raw_message(seq).await.unwrap();
                let headers = m
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v[0].to_string()))
                    .collect();
                out.push((headers, m.payload.to_vec()));
            }
            out
        })
    }

    /// `subsink run --source nats://…` on consumer `consumer`, writing into `bucket`.
    fn worker(&self, config: &Path, consumer: &str, bucket: &Path, extra: &[&str]) -> Child {
        let mut c = subsink();
        c.env("SUBSINK_LOG", "subsink=info")
            .args(["run", "--source", server(), "--nats-stream", &self.stream])
            .args(["--nats-consumer", consumer, "--subscription"])
            .arg(config)
            .arg("--bucket-url")
            .arg(format!("file://{}", bucket.display()))
            .args(extra)
            .stdout(Stdio::piped());
        spawn_draining(&mut c)
    }
}

/// Whole objects only (see [`objects_below`]).
fn objects(bucket: &Path) -> Vec<PathBuf> {
    objects_below(bucket)
}

/// Records of every object in `bucket`, per object.
fn records(bucket: &Path) -> Vec<(PathBuf, Vec<Value>)> {
    avro_records_by_file(objects(bucket))
}

/// How often each `i` was written.
fn counts(recs: &[(PathBuf, Vec<Value>)]) -> HashMap<usize, usize> {
    let mut c = HashMap::new();
    for (_, r) in recs {
        for x in r {
            *c.entry(attr_i(x)).or_default() += 1;
        }
    }
    c
}

/// Wait until `bucket` holds records with every `i` in `0..n`.
fn wait_for_all(bucket: &Path, n: usize, limit: Duration) -> Vec<(PathBuf, Vec<Value>)> {
    wait_for_every_i(n, limit, Duration::from_millis(300), || records(bucket))
}

#[test]
fn maps_messages_acks_after_durable_and_drains_on_sigterm() {
    let env = Env::start("MAP", false);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    // Headers (one repeated), a Nats-Msg-Id on one message, and two subjects.
    let published_at = chrono::Utc::now().timestamp_micros();
    env.rt.block_on(async {
        let mut h = async_nats::HeaderMap::new();
        h.insert("i", "0");
        h.append("tag", "a");
        h.append("tag", "b");
        h.insert("Nats-Msg-Id", "order-7");
        env.js
            .publish_with_headers("MAP.orders.eu", h, "first".into())
            .await
            .unwrap()
            .await
            .unwrap();
        let mut h = async_nats::HeaderMap::new();
        h.insert("i", "1");
        env.js
            .publish_with_headers("MAP.orders.us", h, "second".into())
            .await
            .unwrap()
            .await
            .unwrap();
    });
    env.publish_n(2, 298, 50);
    let cfg = archive_config(
        dir.path(),
        json!({"maxDuration": "1s"}),
        json!({"deadLetterPolicy": {"deadLetterTopic": topic("dlq"), "maxDeliveryAttempts": 7}}),
    );
    // A dead-letter policy needs a subject to dead-letter to.
    let out = subsink()
        .args(["run", "--source", server(), "--nats-stream", "MAP"])
        .args(["--nats-consumer", "archive", "--subscription"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--nats-dead-letter-subject"));
    // And that subject must be stored by a stream.
    let out = subsink()
        .args(["run", "--source", server(), "--nats-stream", "MAP"])
        .args(["--nats-consumer", "archive", "--subscription"])
        .arg(&cfg)
        .args(["--nats-dead-letter-subject", "nowhere.dlq"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no stream stores it"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.rt.block_on(async {
        env.js
            .create_stream(stream::Config {
                name: "MAP_DLQ".into(),
                subjects: vec!["dlq.MAP".into()],
                ..Default::default()
            })
            .await
            .unwrap();
    });

    let w = env.worker(
        &cfg,
        "archive",
        &bucket,
        &["--nats-dead-letter-subject", "dlq.MAP"],
    );
    let recs = wait_for_all(&bucket, 300, Duration::from_secs(30));
    // Nothing pending once the objects are durable and acked.
    let start = Instant::now();
    while env.pending("archive") != (0, 0) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still pending: {:?}",
            env.pending("archive")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (s, err) = terminate(w, Duration::from_secs(10));
    assert_eq!(s["messages_read"], 300, "{err}");
    assert_eq!(s["messages_written"], 300);
    assert_eq!(s["messages_acked"], 300);
    assert_eq!(s["shutdown"], true);
    let c = counts(&recs);
    assert!(c.values().all(|&n| n == 1), "written once each");

    // The consumer subsink created: durable, explicit acks, AckWait and MaxDeliver from the
    // subscription, MaxAckPending from --max-outstanding-messages (default 10000).
    let cc = env.consumer_config("archive");
    assert_eq!(cc.durable_name.as_deref(), Some("archive"));
    assert_eq!(cc.ack_policy, AckPolicy::Explicit);
    assert_eq!(cc.ack_wait, Duration::from_secs(10));
    assert_eq!(cc.max_deliver, 7);
    assert_eq!(cc.max_ack_pending, 10_000);

    // The mapping: headers → attributes, the subject kept, Nats-Msg-Id (else the stream
    // sequence) → messageId, the stream's timestamp → publishTime.
    let all: Vec<&Value> = recs.iter().flat_map(|(_, r)| r.iter()).collect();
    let by_i = |i: usize| *all.iter().find(|r| attr_i(r) == i).unwrap();
    let first = by_i(0);
    assert_eq!(first["message_id"], "order-7");
    assert_eq!(
        first["attributes"],
        json!({"i": "0", "tag": "a, b", "nats.subject": "MAP.orders.eu"})
    );
    assert_eq!(first["data"], json!({"$b64": "Zmlyc3Q="}));
    let t = first["publish_time"].as_i64().unwrap();
    assert!(
        (t - published_at).abs() < 5_000_000,
        "publish time {t} vs {published_at}"
    );
    let second = by_i(1);
    assert_eq!(second["message_id"], "2", "the stream sequence");
    assert_eq!(second["attributes"]["nats.subject"], "MAP.orders.us");
    assert_eq!(by_i(299)["message_id"], "300");

    // Drain with nothing pending: a worker on an empty consumer stops at once on SIGTERM.
    let w = env.worker(
        &cfg,
        "archive",
        &bucket,
        &["--nats-dead-letter-subject", "dlq.MAP"],
    );
    std::thread::sleep(Duration::from_millis(1500));
    let started = Instant::now();
    let (s, err) = terminate(w, Duration::from_secs(5));
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
    assert_eq!(s["messages_read"], 0, "{err}");
    assert_eq!(s["shutdown"], true);
    assert_eq!(objects(&bucket).len(), recs.len(), "no new object");
}

#[test]
fn a_file_open_past_the_ack_wait_keeps_its_messages_with_in_progress_acks() {
    let env = Env::start("LEASE", false);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    env.publish_n(0, 50, 20);
    // AckWait 10 s, files open for 25 s: without +WPI the server would redeliver after 10 s.
    let cfg = archive_config(dir.path(), json!({"maxDuration": "25s"}), json!({}));
    let w = env.worker(&cfg, "archive", &bucket, &[]);
    let recs = wait_for_all(&bucket, 50, Duration::from_secs(60));
    let (s, err) = terminate(w, Duration::from_secs(10));
    assert_eq!(
        s["messages_read"], 50,
        "redelivered while the file was open: {err}"
    );
    assert!(counts(&recs).values().all(|&n| n == 1));
    assert_eq!(env.pending("archive"), (0, 0));
}

#[test]
fn kill_9_three_times_loses_nothing_and_duplicates_only_unacked_messages() {
    let env = Env::start("KILL", false);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let n = 20_000;
    env.publish_n(0, n, 100);
    // Files close on their 1 s duration, and the consumer lets 2000 messages be outstanding:
    // a worker writes about 2000 messages a second, so 20k take several worker lifetimes.
    let cfg = archive_config(
        dir.path(),
        json!({"maxMessages": "5000", "maxDuration": "1s"}),
        json!({}),
    );
    let extra = ["--max-outstanding-messages", "2000"];
    let mut acked = HashSet::new();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for round in 0..3 {
        let before = objects(&bucket).len();
        let mut w = env.worker(&cfg, "archive", &bucket, &extra);
        // Let it write at least one object, then kill it at a random moment after that.
        let start = Instant::now();
        while objects(&bucket).len() == before {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "round {round}: nothing written"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(xorshift(&mut seed) % 1500));
        // Mid-run: messages still wait to be delivered or acked.
        let (unacked, undelivered) = env.pending("archive");
        unsafe { libc::kill(w.id() as i32, libc::SIGKILL) };
        let _ = w.wait();
        let out = output(w);
        acked_objects(&String::from_utf8_lossy(&out.stderr), &mut acked);
        assert!(
            unacked as u64 + undelivered > 0,
            "round {round}: the kill came after the run had finished"
        );
        assert!(
            objects(&bucket).len() > before,
            "round {round}: the kill came before any progress"
        );
    }
    // A last worker drains the rest (killed workers' messages come back after AckWait, 10 s).
    let w = env.worker(&cfg, "archive", &bucket, &extra);
    let recs = wait_for_all(&bucket, n, Duration::from_secs(180));
    let start = Instant::now();
    while env.pending("archive") != (0, 0) {
        assert!(start.elapsed() < Duration::from_secs(30), "still pending");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, err) = terminate(w, Duration::from_secs(20));
    acked_objects(&err, &mut acked);
    let count = counts(&recs);
    assert_eq!(count.len(), n, "every message is in the output");
    assert!(count.keys().all(|&i| i < n));
    // A message in an acked object is never written again: no copy of it is in an object
    // written later (by modification time). A copy in an object that became durable but was
    // killed before its ack was confirmed comes back, as at-least-once allows, and may then be
    // written again and acked.
    let written = |path: &Path| std::fs::metadata(path).unwrap().modified().unwrap();
    let mut copies: HashMap<usize, Vec<(std::time::SystemTime, String)>> = HashMap::new();
    for (path, r) in &recs {
        let name = path
            .strip_prefix(&bucket)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        for x in r {
            let i = attr_i(x);
            if count[&i] > 1 {
                copies
                    .entry(i)
                    .or_default()
                    .push((written(path), name.clone()));
            }
        }
    }
    let mut dups = 0;
    for (i, c) in &copies {
        dups += c.len();
        for (t, name) in c.iter().filter(|(_, n)| acked.contains(n)) {
            let later: Vec<&String> = c.iter().filter(|(u, _)| u > t).map(|(_, n)| n).collect();
            assert!(
                later.is_empty(),
                "message {i} of acked object {name} was written again, in {later:?}"
            );
        }
    }
    assert!(!acked.is_empty());
    eprintln!(
        "kill -9 x3: {} objects, {} acked, {dups} duplicate records",
        recs.len(),
        acked.len()
    );
}

#[test]
fn two_workers_on_one_consumer_write_each_message_once() {
    let env = Env::start("TWO", false);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let cfg = archive_config(
        dir.path(),
        json!({"maxMessages": "1000", "maxDuration": "1s"}),
        json!({}),
    );
    // The first worker creates the consumer; the second finds it.
    let a = env.worker(&cfg, "archive", &bucket, &[]);
    std::thread::sleep(Duration::from_millis(700));
    let b = env.worker(&cfg, "archive", &bucket, &[]);
    std::thread::sleep(Duration::from_millis(700));
    let n = 10_000;
    env.publish_n(0, n, 100);
    let recs = wait_for_all(&bucket, n, Duration::from_secs(60));
    let (sa, ea) = terminate(a, Duration::from_secs(10));
    let (sb, eb) = terminate(b, Duration::from_secs(10));
    let count = counts(&recs);
    assert_eq!(count.len(), n);
    assert!(
        count.values().all(|&c| c == 1),
        "a message was written twice without a failure"
    );
    let (wa, wb) = (
        sa["messages_written"].as_u64().unwrap(),
        sb["messages_written"].as_u64().unwrap(),
    );
    assert_eq!(wa + wb, n as u64, "{ea}\n{eb}");
    assert!(wa > 0 && wb > 0, "one worker did everything: {wa} / {wb}");
    assert_eq!(env.pending("archive"), (0, 0));
}

#[test]
fn a_failing_store_naks_with_backoff_and_the_messages_are_written_after_recovery() {
    let env = Env::start("RETRY", false);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    // Objects go below `out/`, and `out` is a file: every write fails (even as root) until it is
    // removed.
    std::fs::create_dir(&bucket).unwrap();
    std::fs::write(bucket.join("out"), b"not a folder").unwrap();
    env.publish_n(0, 100, 20);
    let cfg = archive_config(
        dir.path(),
        json!({"maxDuration": "1s", "filenamePrefix": "out/"}),
        json!({"retryPolicy": {"minimumBackoff": "2s", "maximumBackoff": "4s"}}),
    );
    // No upload retries: a failing put fails its object at once, so the messages are nak'ed (with
    // retries the put would simply wait for the store to come back).
    let w = env.worker(&cfg, "archive", &bucket, &["--upload-retry-for", "0s"]);
    // Wait for a failed object, and check the messages are back on the consumer, not acked.
    std::thread::sleep(Duration::from_secs(4));
    let (unacked, undelivered) = env.pending("archive");
    assert_eq!(
        unacked as u64 + undelivered,
        100,
        "no message may be acked while the store fails"
    );
    std::fs::remove_file(bucket.join("out")).unwrap();
    let recs = wait_for_all(&bucket, 100, Duration::from_secs(30));
    let start = Instant::now();
    while env.pending("archive") != (0, 0) {
        assert!(start.elapsed() < Duration::from_secs(10), "still pending");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (s, err) = terminate(w, Duration::from_secs(10));
    assert!(s["messages_nacked"].as_u64().unwrap() >= 100, "{err}");
    assert!(!s["failed_objects"].as_array().unwrap().is_empty());
    assert_eq!(s["messages_acked"], 100);
    assert!(counts(&recs).values().all(|&n| n == 1));
}

#[test]
fn a_message_the_sink_refuses_is_dead_lettered_with_the_five_headers() {
    let env = Env::start("DEAD", true);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let schema = root().join("fixtures/input/event.avsc");
    // Two good messages and one that does not match the topic schema.
    env.rt.block_on(async {
        for (i, data) in [
            (
                0,
                r#"{"id":0,"name":"n","tags":[],"amount":null,"kind":"CLICK","ok":true}"#,
            ),
            (1, r#"{"id":"not a number"}"#),
            (
                2,
                r#"{"id":2,"name":"n","tags":[],"amount":null,"kind":"CLICK","ok":true}"#,
            ),
        ] {
            let mut h = async_nats::HeaderMap::new();
            h.insert("i", i.to_string().as_str());
            env.js
                .publish_with_headers("DEAD.events", h, data.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    });
    let published = Instant::now();
    let cfg = archive_config(
        dir.path(),
        json!({"maxDuration": "1s", "avroConfig": {"writeMetadata": true, "useTopicSchema": true}}),
        json!({"deadLetterPolicy": {"deadLetterTopic": topic("dlq"), "maxDeliveryAttempts": 5},
               "retryPolicy": {"minimumBackoff": "1s", "maximumBackoff": "2s"}}),
    );
    let w = env.worker(
        &cfg,
        "archive",
        &bucket,
        &[
            "--topic-schema",
            schema.to_str().unwrap(),
            "--nats-dead-letter-subject",
            "dlq.DEAD",
        ],
    );
    let dead = {
        let start = Instant::now();
        loop {
            let d = env.dead_letters();
            if !d.is_empty() {
                break d;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "nothing dead-lettered"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let took = published.elapsed();
    let start = Instant::now();
    while env.pending("archive") != (0, 0) {
        assert!(start.elapsed() < Duration::from_secs(10), "still pending");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (s, err) = terminate(w, Duration::from_secs(10));
    assert_eq!(dead.len(), 1, "{err}");
    let (h, data) = &dead[0];
    assert_eq!(data, br#"{"id":"not a number"}"#);
    assert_eq!(h["i"], "1");
    assert_eq!(h["nats.subject"], "DEAD.events");
    assert_eq!(h["CloudPubSubDeadLetterSourceDeliveryCount"], "5");
    assert_eq!(h["CloudPubSubDeadLetterSourceSubscription"], "archive");
    assert_eq!(
        h["CloudPubSubDeadLetterSourceSubscriptionProject"],
        "subsink-e2e"
    );
    assert!(h["CloudPubSubDeadLetterSourceTopicPublishTime"].ends_with("+00:00"));
    let why = &h["CloudPubSubDeadLetterSourceDeliveryErrorMessage"];
    assert!(why.contains("topic schema"), "{why}");
    // Retry policy: waits of at least 0.8, 1.6, 1.6, 1.6 s before the fifth delivery.
    assert!(
        took >= Duration::from_millis(5500),
        "dead-lettered after {took:?}: backoff not applied"
    );
    assert_eq!(s["messages_dead_lettered"], 1, "{err}");
    assert_eq!(s["bad_messages"], 5);
    let written: HashSet<usize> = records(&bucket)
        .iter()
        .flat_map(|(_, r)| r.iter().map(|x| x["id"].as_i64().unwrap() as usize))
        .collect();
    assert_eq!(written, HashSet::from([0, 2]));
}

/// The metrics of a real NATS run, against what the server counted: two good messages and one
/// that breaks the topic schema (nak'ed four times, dead-lettered on its fifth delivery). The
/// consumer's delivery count is what the run received; the dead-letter stream holds what it
/// dead-lettered; the objects on disk are what it wrote.
#[test]
fn metrics_of_a_real_nats_run_match_what_the_server_counted() {
    let env = Env::start("METRICS", true);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let schema = root().join("fixtures/input/event.avsc");
    env.rt.block_on(async {
        for data in [
            r#"{"id":0,"name":"n","tags":[],"amount":null,"kind":"CLICK","ok":true}"#,
            r#"{"id":"not a number"}"#,
            r#"{"id":2,"name":"n","tags":[],"amount":null,"kind":"CLICK","ok":true}"#,
        ] {
            env.js
                .publish("METRICS.events", data.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    });
    let cfg = archive_config(
        dir.path(),
        json!({"maxDuration": "1s", "avroConfig": {"writeMetadata": true, "useTopicSchema": true}}),
        json!({"deadLetterPolicy": {"deadLetterTopic": topic("dlq"), "maxDeliveryAttempts": 5}}),
    );
    let port = free_port();
    let mut w = env.worker(
        &cfg,
        "archive",
        &bucket,
        &[
            "--topic-schema",
            schema.to_str().unwrap(),
            "--nats-dead-letter-subject",
            "dlq.METRICS",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ],
    );
    wait_for_port(port, "subsink", &mut w);
    let base = format!("http://127.0.0.1:{port}");
    let sub = json!({"subscription": "projects/subsink-e2e/subscriptions/archive"});
    let labelled = |k: &str, v: &str| {
        let mut l = sub.clone();
        l[k] = json!(v);
        l
    };
    let counter =
        |page: &Value, name: &str| util::http::sample(page, name, &format!("{name}_total"), &sub);
    let page = poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let page = util::http::get(&[format!("{base}/metrics")]).remove(0);
        let done = counter(&page, "subsink_messages_dead_lettered") == Some(1.0)
            && counter(&page, "subsink_messages_acked") == Some(2.0)
            && util::http::sample(&page, "subsink_open_files", "subsink_open_files", &sub)
                == Some(0.0);
        done.then_some(page.clone())
            .ok_or_else(|| format!("{}", page["body"]))
    });
    assert_eq!(env.pending("archive"), (0, 0), "everything settled");
    assert_eq!(env.dead_letters().len(), 1);
    let delivered = env.rt.block_on(async {
        let s = env.js.get_stream("METRICS").await.unwrap();
        s.consumer_info("archive")
            .await
            .unwrap()
            .delivered
            .consumer_sequence
    });
    assert_eq!(delivered, 7, "two good, five of the bad one");
    let objects = objects_below(&bucket);
    let bytes: u64 = objects
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    for (name, want) in [
        ("subsink_messages_received", delivered as f64),
        ("subsink_messages_written", 2.0),
        ("subsink_messages_acked", 2.0),
        ("subsink_messages_nacked", 4.0),
        ("subsink_messages_dead_lettered", 1.0),
        ("subsink_messages_bad", 5.0),
        ("subsink_messages_filtered", 0.0),
        ("subsink_bytes_written", bytes as f64),
    ] {
        assert_eq!(counter(&page, name), Some(want), "{name}: {}", page["body"]);
    }
    let finalized: f64 = ["max_duration", "max_bytes", "max_messages", "memory"]
        .iter()
        .map(|r| {
            util::http::sample(
                &page,
                "subsink_files_finalized",
                "subsink_files_finalized_total",
                &labelled("reason", r),
            )
            .unwrap()
        })
        .sum();
    assert_eq!(finalized, objects.len() as f64);
    assert_eq!(
        util::http::sample(
            &page,
            "subsink_upload_duration_seconds",
            "subsink_upload_duration_seconds_count",
            &labelled("kind", "object"),
        ),
        Some(objects.len() as f64)
    );
    for k in ["upload", "commit", "stream"] {
        assert_eq!(
            util::http::sample(
                &page,
                "subsink_retries",
                "subsink_retries_total",
                &labelled("kind", k)
            ),
            Some(0.0),
            "{k}"
        );
    }
    let (s, err) = terminate(w, Duration::from_secs(10));
    assert_eq!(s["messages_dead_lettered"], 1, "{err}");
    assert_eq!(s["messages_acked"], 2, "{err}");
}
