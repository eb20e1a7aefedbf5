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
use util::proxy::NatsProxy;
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

/// The port of [`server`].
fn server_port() -> u16 {
    server().rsplit(':').next().unwrap().parse().unwrap()
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

    /// Pull requests of a consumer waiting at the server (a worker that is pulling).
    fn waiting(&self, consumer: &str) -> usize {
        self.rt.block_on(async {
            let s = self.js.get_stream(&self.stream).await.unwrap();
            s.consumer_info(consumer)
                .await
                .map_or(0, |info| info.num_waiting)
        })
    }

    /// Wait up to 30 s until at least `n` pull requests of `consumer` wait at the server.
    fn wait_pulling(&self, consumer: &str, n: usize) {
        poll(Duration::from_secs(30), Duration::from_millis(50), || {
            let w = self.waiting(consumer);
            if w >= n {
                Ok(())
            } else {
                Err(format!("{w} pull requests of {consumer} waiting, not {n}"))
            }
        })
    }

    /// Wait up to `limit` until nothing of `consumer` is pending (delivered and not acked, or
    /// not delivered yet).
    fn wait_nothing_pending(&self, consumer: &str, limit: Duration) {
        poll(limit, Duration::from_millis(100), || {
            match self.pending(consumer) {
                (0, 0) => Ok(()),
                p => Err(format!("still pending: {p:?}")),
            }
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
        self.worker_at(server(), config, consumer, bucket, extra)
    }

    /// [`Env::worker`] connecting to `url` (a proxy in front of the server).
    fn worker_at(
        &self,
        url: &str,
        config: &Path,
        consumer: &str,
        bucket: &Path,
        extra: &[&str],
    ) -> Child {
        let mut c = subsink();
        c.env("SUBSINK_LOG", "subsink=info")
            .args(["run", "--source", url, "--nats-stream", &self.stream])
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
    // A dead-letter policy needs a subject to dead-letter to: a config error, exit 2.
    let out = subsink()
        .args(["run", "--source", server(), "--nats-stream", "MAP"])
        .args(["--nats-consumer", "archive", "--subscription"])
        .arg(&cfg)
        .arg("--bucket-url")
        .arg(format!("file://{}", bucket.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--nats-dead-letter-subject"));
    // And that subject must be stored by a stream: a config error too, exit 2.
    let out = subsink()
        .args(["run", "--source", server(), "--nats-stream", "MAP"])
        .args(["--nats-consumer", "archive", "--subscription"])
        .arg(&cfg)
        .arg("--bucket-url")
        .arg(format!("file://{}", bucket.display()))
        .args(["--nats-dead-letter-subject", "nowhere.dlq"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
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
    env.wait_nothing_pending("archive", Duration::from_secs(10));
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
    // Once it pulls (its pull request waits at the server), not after a guessed delay.
    env.wait_pulling("archive", 1);
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
    // What was acked is what reached nats-server, as a recording proxy saw it on the wire (with
    // the objects visible in the bucket at that moment) — not what a worker logged: a worker
    // killed just after writing an ack may never get it out. Every ack the proxy logs reaches
    // the server, also when the worker behind it dies.
    let proxy = NatsProxy::start(server_port(), &dir.path().join("acks.log"), Some(&bucket));
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for round in 0..3 {
        let before = proxy.calls().acks.len();
        let w = env.worker_at(&proxy.url(), &cfg, "archive", &bucket, &extra);
        // Let it ack at least one object on the wire, then kill it at a random moment after that.
        poll(Duration::from_secs(30), Duration::from_millis(50), || {
            if proxy.calls().acks.len() > before {
                Ok(())
            } else {
                Err(format!("round {round}: no ack within 30 s"))
            }
        });
        // A random moment within 1.5 s — cut short while a few thousand messages are still to
        // go, so the kill is mid-run however fast the worker drains (flow control finalizes its
        // files at half the 2,000 outstanding, faster than the 1 s files alone did).
        let until = Instant::now() + Duration::from_millis(xorshift(&mut seed) % 1500);
        while Instant::now() < until {
            let (unacked, undelivered) = env.pending("archive");
            if (unacked as u64 + undelivered) < 4000 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Mid-run: messages still wait to be delivered or acked.
        let (unacked, undelivered) = env.pending("archive");
        kill_9(w);
        assert!(
            unacked as u64 + undelivered > 0,
            "round {round}: the kill came after the run had finished"
        );
    }
    // The kills may not have hit a write: a dead writer's staging file makes sure the next
    // worker meets one.
    plant_dead_writers_staging(&bucket);
    // A last worker drains the rest (killed workers' messages come back after AckWait, 10 s).
    let w = env.worker_at(&proxy.url(), &cfg, "archive", &bucket, &extra);
    let recs = wait_for_all(&bucket, n, Duration::from_secs(180));
    env.wait_nothing_pending("archive", Duration::from_secs(30));
    terminate(w, Duration::from_secs(20));
    // The killed workers' staging files were swept by the next worker; the last left none.
    assert_no_staging(&bucket);
    let count = counts(&recs);
    assert_eq!(count.len(), n, "every message is in the output");
    assert!(count.keys().all(|&i| i < n));
    // Stream sequence (the message id: no Nats-Msg-Id) → the objects holding it.
    let mut holders: HashMap<u64, HashSet<String>> = HashMap::new();
    for (path, r) in &recs {
        let name = path
            .strip_prefix(&bucket)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        for x in r {
            let seq: u64 = x["message_id"].as_str().unwrap().parse().unwrap();
            assert_eq!(seq, attr_i(x) as u64 + 1, "message id = stream sequence");
            holders.entry(seq).or_default().insert(name.clone());
        }
    }
    let calls = proxy.calls();
    // Acks only after durable: every ack reached the server after an object holding its message
    // was visible.
    for (k, (_, seqs, visible)) in calls.acks.iter().enumerate() {
        let visible = visible.as_ref().expect("the proxy watches the bucket");
        for seq in seqs {
            let objects = holders
                .get(seq)
                .unwrap_or_else(|| panic!("ack {k}: message {seq} acked but in no object"));
            assert!(
                objects.iter().any(|o| visible.contains(o)),
                "ack {k}: message {seq} acked before its object {objects:?} was visible"
            );
        }
    }
    // A message is never written again once acked: every object holding it was visible already
    // when its first ack reached the server. Checked for every message (the last worker acked
    // them all), duplicated or not; duplicates are copies written before the first ack.
    let mut first_ack: HashMap<u64, &HashSet<String>> = HashMap::new();
    for (_, seqs, visible) in &calls.acks {
        for seq in seqs {
            first_ack
                .entry(*seq)
                .or_insert_with(|| visible.as_ref().unwrap());
        }
    }
    assert_eq!(first_ack.len(), n, "every message acked on the wire");
    let mut dups = 0;
    for (seq, objects) in &holders {
        let visible = first_ack[seq];
        for o in objects {
            assert!(
                visible.contains(o),
                "message {seq} was written again, into {o}, after it was acked"
            );
        }
        dups += objects.len() - 1;
    }
    eprintln!(
        "kill -9 x3: {} objects, {} acks on the wire, {dups} duplicate records",
        recs.len(),
        calls.acks.len()
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
    // The first worker creates the consumer; the second finds it. Each is pulling (its pull
    // request waits at the server) before the next step.
    let a = env.worker(&cfg, "archive", &bucket, &[]);
    env.wait_pulling("archive", 1);
    let b = env.worker(&cfg, "archive", &bucket, &[]);
    env.wait_pulling("archive", 2);
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
    // retries the put would simply wait for the store to come back). The worker talks to the
    // server through a proxy that records its acks.
    let proxy = NatsProxy::start(server_port(), &dir.path().join("acks.log"), None);
    let w = env.worker_at(
        &proxy.url(),
        &cfg,
        "archive",
        &bucket,
        &["--upload-retry-for", "0s"],
    );
    // The failure itself, on the wire: every message nak'ed, none acked; and the server still
    // holds all 100.
    let calls = poll(Duration::from_secs(30), Duration::from_millis(100), || {
        let c = proxy.calls();
        let naked = c.of_kind("-NAK").len();
        if naked == 100 {
            Ok(c)
        } else {
            Err(format!("{naked} of 100 messages nak'ed"))
        }
    });
    assert!(
        calls.acks.is_empty(),
        "acked while the store fails: {:?}",
        calls.acks
    );
    let (unacked, undelivered) = env.pending("archive");
    assert_eq!(
        unacked as u64 + undelivered,
        100,
        "no message may be acked while the store fails"
    );
    std::fs::remove_file(bucket.join("out")).unwrap();
    let recs = wait_for_all(&bucket, 100, Duration::from_secs(30));
    env.wait_nothing_pending("archive", Duration::from_secs(10));
    let (s, err) = terminate(w, Duration::from_secs(10));
    assert_eq!(proxy.calls().acked().len(), 100, "every message acked once");
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
    env.wait_nothing_pending("archive", Duration::from_secs(10));
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

/// `subsink run` on consumer `consumer` of stream `stream`, with `extra`, to the end (a run that
/// is refused before it reads anything).
fn refused_run(stream: &str, consumer: &str, cfg: &Path, extra: &[&str]) -> std::process::Output {
    subsink()
        .args(["run", "--source", server(), "--nats-stream", stream])
        .args(["--nats-consumer", consumer, "--subscription"])
        .arg(cfg)
        // A bucket the refused run never writes to (a run without one is refused for that).
        .arg("--bucket-url")
        .arg(format!(
            "file://{}",
            cfg.parent().unwrap().join("refused-bucket").display()
        ))
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn config_errors_exit_2_and_a_consumer_without_explicit_acks_is_refused_untouched() {
    let env = Env::start("CONF", false);
    let dir = tempfile::tempdir().unwrap();
    env.publish_n(0, 10, 20);
    let cfg = archive_config(dir.path(), json!({"maxDuration": "1s"}), json!({}));
    // Existing consumers with ack policy none and all: subsink acks each message only once it is
    // durable, which neither allows. Refused before a message is pulled.
    for (name, policy) in [("none", AckPolicy::None), ("all", AckPolicy::All)] {
        env.rt.block_on(async {
            let s = env.js.get_stream("CONF").await.unwrap();
            s.create_consumer(jetstream::consumer::pull::Config {
                durable_name: Some(name.to_string()),
                ack_policy: policy,
                ..Default::default()
            })
            .await
            .unwrap();
        });
        let out = refused_run("CONF", name, &cfg, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("its ack policy is {name}")) && err.contains("explicit acks"),
            "{err}"
        );
        assert_eq!(env.pending(name), (0, 10), "{name}: nothing pulled");
        assert_eq!(
            env.consumer_config(name).ack_policy,
            policy,
            "left as it was"
        );
    }
    // A dead-letter policy without a subject, and a subject no stream stores (also tested in
    // `maps_messages_…`), exit 2 as well.
    let dlq = archive_config(
        dir.path(),
        json!({"maxDuration": "1s"}),
        json!({"deadLetterPolicy": {"deadLetterTopic": topic("dlq"), "maxDeliveryAttempts": 5}}),
    );
    let out = refused_run("CONF", "archive", &dlq, &[]);
    assert_eq!(out.status.code(), Some(2));
    let out = refused_run(
        "CONF",
        "archive",
        &cfg,
        &["--nats-dead-letter-subject", "stored.nowhere"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no stream stores it"));
    // --checkpoint is refused with NATS (JetStream keeps what is not acked) and with stdin.
    let cp = dir.path().join("cp.json");
    let out = refused_run(
        "CONF",
        "archive",
        &cfg,
        &["--checkpoint", cp.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("JetStream keeps unacked messages"));
    let out = subsink()
        .args(["run", "--source", "-", "--checkpoint"])
        .arg(&cp)
        .arg("--subscription")
        .arg(&cfg)
        .arg("--bucket-url")
        .arg(format!("file://{}", dir.path().join("bucket").display()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stdin cannot be resumed"));
    assert!(!cp.exists());
}

#[test]
fn an_existing_consumer_is_used_with_its_own_settings() {
    let env = Env::start("MINE", false);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    // Made by someone else, with settings the subscription would not give it.
    env.rt.block_on(async {
        let s = env.js.get_stream("MINE").await.unwrap();
        s.create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("mine".into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            max_deliver: 3,
            max_ack_pending: 50,
            description: Some("made by hand".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    });
    env.publish_n(0, 200, 20);
    // ackDeadlineSeconds 10, no dead-letter policy: AckWait 10 s, MaxDeliver unlimited, 10,000
    // outstanding if subsink had made it.
    let cfg = archive_config(dir.path(), json!({"maxDuration": "1s"}), json!({}));
    let w = env.worker(&cfg, "mine", &bucket, &[]);
    let recs = wait_for_all(&bucket, 200, Duration::from_secs(30));
    env.wait_nothing_pending("mine", Duration::from_secs(10));
    let (s, err) = terminate(w, Duration::from_secs(10));
    assert_eq!(s["messages_acked"], 200, "{err}");
    assert!(counts(&recs).values().all(|&n| n == 1));
    let cc = env.consumer_config("mine");
    assert_eq!(cc.ack_wait, Duration::from_secs(30));
    assert_eq!(cc.max_deliver, 3);
    assert_eq!(cc.max_ack_pending, 50);
    assert_eq!(cc.description.as_deref(), Some("made by hand"));
    assert!(
        err.contains("the existing consumer's settings differ from the subscription's"),
        "the difference is logged: {err}"
    );
}

#[test]
fn max_deliver_is_5_with_a_dead_letter_subject_and_no_policy_and_unlimited_without_a_subject() {
    let env = Env::start("MAXD", true);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let cfg = archive_config(dir.path(), json!({"maxDuration": "1s"}), json!({}));
    for (consumer, extra, want) in [
        (
            "with-dlq",
            &["--nats-dead-letter-subject", "dlq.MAXD"][..],
            5,
        ),
        ("without", &[][..], -1),
    ] {
        let w = env.worker(&cfg, consumer, &bucket, extra);
        // Made once the worker pulls from it.
        env.wait_pulling(consumer, 1);
        terminate(w, Duration::from_secs(10));
        let cc = env.consumer_config(consumer);
        assert_eq!(cc.max_deliver, want, "{consumer}");
        assert_eq!(cc.ack_policy, AckPolicy::Explicit);
        assert_eq!(cc.ack_wait, Duration::from_secs(10));
    }
}

#[test]
fn the_filter_acks_non_matching_messages_and_writes_only_matching_ones() {
    let env = Env::start("FILT", false);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    env.rt.block_on(async {
        let mut acks = Vec::new();
        for i in 0..100 {
            let subject = if i % 2 == 0 {
                "FILT.keep.a"
            } else {
                "FILT.drop.b"
            };
            let mut h = async_nats::HeaderMap::new();
            h.insert("i", i.to_string().as_str());
            acks.push(
                env.js
                    .publish_with_headers(subject, h, numbered_data(i, 20).into())
                    .await
                    .unwrap(),
            );
        }
        for a in acks {
            a.await.unwrap();
        }
    });
    let filter = r#"hasPrefix(attributes."nats.subject", "FILT.keep.")"#;
    let cfg = archive_config(
        dir.path(),
        json!({"maxDuration": "1s"}),
        json!({"filter": filter}),
    );
    let w = env.worker(&cfg, "archive", &bucket, &[]);
    // Every message leaves the consumer (made once the worker pulls): written, or filtered out
    // and acked.
    env.wait_pulling("archive", 1);
    env.wait_nothing_pending("archive", Duration::from_secs(30));
    let (s, err) = terminate(w, Duration::from_secs(10));
    assert_eq!(s["messages_filtered"], 50, "{err}");
    assert_eq!(s["messages_written"], 50, "{err}");
    let written: Vec<usize> = records(&bucket)
        .iter()
        .flat_map(|(_, r)| r.iter().map(attr_i))
        .collect();
    assert_eq!(written.len(), 50);
    assert!(written.iter().all(|i| i % 2 == 0), "{written:?}");
}

#[test]
fn with_ordering_files_become_durable_in_order_and_keep_the_stream_order() {
    // A NATS message has no ordering key: enableMessageOrdering orders no key, but files still
    // become durable one at a time in the order they were opened, and a single consumer delivers
    // in stream order — so without failures the output is the stream, in order.
    let env = Env::start("ORD", false);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let n = 1000;
    env.publish_n(0, n, 20);
    let cfg = archive_config(
        dir.path(),
        json!({"maxMessages": "100", "maxDuration": "1s"}),
        json!({"enableMessageOrdering": true}),
    );
    let w = env.worker(&cfg, "archive", &bucket, &[]);
    wait_for_all(&bucket, n, Duration::from_secs(60));
    env.wait_nothing_pending("archive", Duration::from_secs(10));
    let (s, err) = terminate(w, Duration::from_secs(10));
    assert_eq!(s["messages_written"], n as u64, "{err}");
    // The objects in the order they became durable (logged one at a time with ordering).
    let order: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("file written"))
        .filter_map(|l| l.split("name=").nth(1))
        .map(|s| s.split_whitespace().next().unwrap())
        .collect();
    assert!(order.len() >= 10, "{err}");
    let mut last = None;
    for name in &order {
        for r in avro_records(&[bucket.join(name)]) {
            let i = attr_i(&r);
            if let Some(prev) = last {
                assert_eq!(i, prev + 1, "message {i} after {prev} (object {name})");
            }
            last = Some(i);
        }
    }
    assert_eq!(last, Some(n - 1));
}

/// Issue 27, point 1: flow control never starves the files. With the defaults — `MaxAckPending`
/// 10,000 (`--max-outstanding-messages`), files of up to 5 minutes, no message or byte limit — a
/// backlog of 100,000 messages reaches the consumer's limit while every outstanding message sits
/// in the open file, and JetStream sends nothing more: before, one object of 10,000 messages after
/// 5 minutes. Now the open file is finalized early (reason `flow_control`) at half the limit, and
/// the backlog drains at the pipeline's speed: every message but those of the last, still open,
/// file is acked within a minute.
#[test]
fn flow_control_never_starves_the_files_a_backlog_drains_with_default_batching() {
    const N: usize = 100_000;
    let env = Env::start("FLOW", false);
    env.publish_n(0, N, 1024);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    // Nothing but the defaults: maxDuration 5 min, no maxMessages, no maxBytes.
    let cfg = archive_config(dir.path(), json!({}), json!({}));
    let port = free_port();
    let metrics = ["--metrics-addr".to_string(), format!("127.0.0.1:{port}")];
    let metrics: Vec<&str> = metrics.iter().map(String::as_str).collect();
    let started = Instant::now();
    let w = env.worker(&cfg, "flow", &bucket, &metrics);
    // Drained: every message delivered, and what is not acked is only the open file's, which
    // flow control leaves below half the limit.
    let mut last = None;
    while !matches!(last, Some((acking, 0)) if acking < 5_000) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not drained within a minute: (delivered and not acked, not delivered) = {last:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
        // The worker creates the consumer.
        last = env.rt.block_on(async {
            let s = env.js.get_stream(&env.stream).await.unwrap();
            let info = s.consumer_info("flow").await.ok()?;
            Some((info.num_ack_pending, info.num_pending))
        });
    }
    let last = last.unwrap();
    let drained = started.elapsed();
    assert_eq!(env.consumer_config("flow").max_ack_pending, 10_000);
    let base = format!("http://127.0.0.1:{port}");
    let finalized = |reason: &str| {
        util::http::metric(
            &base,
            "subsink_files_finalized",
            "subsink_files_finalized_total",
            &json!({"subscription": util::pubsub::sub("archive"), "reason": reason}),
        )
        .unwrap_or(0.0) as u64
    };
    let early = finalized("flow_control");
    eprintln!(
        "{N} messages of 1 KiB drained in {drained:?}, {} left in the open file, {early} files finalized for flow control",
        last.0
    );
    // 95,000 messages or more went out in files of at most 10,000 (the consumer's limit).
    assert!(early >= 10, "{early} files finalized for flow control");
    assert_eq!(finalized("max_duration"), 0);

    let (s, err) = terminate(w, Duration::from_secs(30));
    assert_eq!(s["messages_read"], N as u64, "{err}");
    assert_eq!(s["messages_written"], N as u64);
    assert_eq!(s["messages_acked"], N as u64);
    assert_eq!(env.pending("flow"), (0, 0));
    // Each file's line names its reason: the flow-control files, then the open one at shutdown.
    let written: Vec<(&str, u64)> = err
        .lines()
        .filter(|l| l.contains("file written"))
        .map(|l| {
            let field = |name: &str| {
                l.split(&format!("{name}="))
                    .nth(1)
                    .unwrap()
                    .split_whitespace()
                    .next()
                    .unwrap()
            };
            (field("reason"), field("messages").parse().unwrap())
        })
        .collect();
    let flow: Vec<u64> = written
        .iter()
        .filter(|(r, _)| *r == "\"flow_control\"")
        .map(|(_, n)| *n)
        .collect();
    assert_eq!(flow.len() as u64, early, "{written:?}");
    assert!(flow.iter().all(|&n| n <= 10_000), "{written:?}");
    assert_eq!(written.iter().map(|(_, n)| n).sum::<u64>(), N as u64);
    assert_eq!(objects(&bucket).len(), written.len());
}

/// Three workers on one consumer share its `MaxAckPending` (3,000): together they reach it while
/// each holds about 1,000, less than the half that makes a worker finalize its file on its own
/// count. The server's count (asked before every pull) says the consumer is held back, and each
/// worker finalizes its open file: 30,000 messages drain within a minute with the default
/// batching.
#[test]
fn workers_sharing_a_consumer_are_not_starved_by_its_limit_either() {
    const N: usize = 30_000;
    let env = Env::start("SHARED", false);
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let cfg = archive_config(dir.path(), json!({}), json!({}));
    let extra = ["--max-outstanding-messages", "3000"];
    let info = || {
        env.rt.block_on(async {
            let s = env.js.get_stream(&env.stream).await.unwrap();
            let info = s.consumer_info("shared").await.ok()?;
            Some((info.num_ack_pending, info.num_pending))
        })
    };
    // The first worker creates the consumer; the others find it.
    let mut workers = vec![env.worker(&cfg, "shared", &bucket, &extra)];
    poll(Duration::from_secs(30), Duration::from_millis(50), || {
        info().ok_or_else(|| "no consumer yet".to_string())
    });
    workers.push(env.worker(&cfg, "shared", &bucket, &extra));
    workers.push(env.worker(&cfg, "shared", &bucket, &extra));
    let started = Instant::now();
    env.publish_n(0, N, 1024);
    let mut last = None;
    while !matches!(last, Some((acking, 0)) if acking < 4_500) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not drained within a minute: (delivered and not acked, not delivered) = {last:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
        last = info();
    }
    eprintln!(
        "{N} messages drained by three workers in {:?}, {} left in open files",
        started.elapsed(),
        last.unwrap().0
    );
    let mut written = 0;
    let mut flow_files = 0;
    for w in workers {
        let (s, err) = terminate(w, Duration::from_secs(30));
        written += s["messages_written"].as_u64().unwrap();
        flow_files += err
            .lines()
            .filter(|l| l.contains("file written") && l.contains("reason=\"flow_control\""))
            .count();
    }
    assert_eq!(written, N as u64);
    assert!(
        flow_files >= 9,
        "{flow_files} files finalized for flow control"
    );
    assert_eq!(env.pending("shared"), (0, 0));
}
