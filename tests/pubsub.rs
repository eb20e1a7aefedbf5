//! subsink on a live subscription: the real binary against Google's Pub/Sub emulator (no mocks),
//! writing to a local folder, with output read back by fastavro.
//!
//! Every test starts its own emulator. The emulator accepts filters but does not apply them, and
//! counts delivery attempts only for subscriptions with a dead-letter policy (TESTING.md).

mod util;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use subsink::message::Message;
use subsink::source::pubsub::{PubsubClient, PubsubSettings, PubsubSource, SubscriptionSpec};
use subsink::source::{Source, SourceEvent};
use util::emulator::Emulator;
use util::*;

const PROJECT: &str = "projects/subsink-e2e";

fn topic(name: &str) -> String {
    format!("{PROJECT}/topics/{name}")
}

fn sub(name: &str) -> String {
    format!("{PROJECT}/subscriptions/{name}")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

struct Env {
    emu: Emulator,
    rt: tokio::runtime::Runtime,
    client: PubsubClient,
}

impl Env {
    fn start() -> Env {
        let emu = Emulator::start();
        let rt = rt();
        let client = rt
            .block_on(PubsubClient::connect_emulator(&emu.host()))
            .unwrap();
        Env { emu, rt, client }
    }

    fn topic_and_sub(&self, spec: SubscriptionSpec) {
        self.rt.block_on(async {
            self.client.create_topic(&spec.topic).await.unwrap();
            if let Some((dlq, _)) = &spec.dead_letter {
                self.client.create_topic(dlq).await.unwrap();
            }
            self.client.create_subscription(&spec).await.unwrap();
        });
    }

    fn publish(&self, topic: &str, msgs: &[Message]) -> Vec<String> {
        self.rt.block_on(self.client.publish(topic, msgs)).unwrap()
    }

    /// Everything a subscription delivers within `window`, acked.
    fn drain(&self, subscription: &str, window: Duration) -> Vec<Message> {
        self.rt.block_on(async {
            let mut s = PubsubSettings::new(subscription);
            s.stream_ack_deadline = Duration::from_secs(30);
            let mut src = PubsubSource::start(self.client.clone(), s).unwrap();
            let until = tokio::time::Instant::now() + window;
            let mut out = Vec::new();
            while let Ok(Some(ev)) = tokio::time::timeout_at(until, src.next()).await {
                if let SourceEvent::Messages(batch) = ev {
                    let ids: Vec<String> = batch
                        .iter()
                        .filter_map(|r| r.receipt.ack_id.clone())
                        .collect();
                    self.client.ack(subscription, &ids).await.unwrap();
                    out.extend(batch.into_iter().map(|r| r.msg));
                }
            }
            src.stop();
            out
        })
    }

    /// `subsink run --source pubsub` on `subscription` (a config file), writing into `bucket`.
    fn worker(&self, config: &Path, bucket: &Path, extra: &[&str]) -> Child {
        subsink()
            .env("PUBSUB_EMULATOR_HOST", self.emu.host())
            .env("SUBSINK_LOG", "info")
            .args(["run", "--source", "pubsub", "--subscription"])
            .arg(config)
            .arg("--bucket-url")
            .arg(format!("file://{}", bucket.display()))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

fn message(i: usize, data_len: usize) -> Message {
    let mut data = format!("{i:08}-").into_bytes();
    data.resize(data_len.max(9), b'x');
    Message {
        data: data.into(),
        attributes: BTreeMap::from([("i".to_string(), i.to_string())]),
        ..Default::default()
    }
}

/// `n` numbered messages of `size` bytes published to the `events` topic; their ids.
fn publish_n(env: &Env, n: usize, size: usize) -> Vec<String> {
    env.publish(
        &topic("events"),
        &(0..n).map(|i| message(i, size)).collect::<Vec<_>>(),
    )
}

/// [`config`] for the `archive` subscription of the `events` topic.
fn archive_config(dir: &Path, storage: Value, extra: Value) -> PathBuf {
    config(dir, &sub("archive"), &topic("events"), storage, extra)
}

/// A subscription config (REST JSON) writing Avro with metadata, extended limits.
fn config(dir: &Path, name: &str, topic: &str, storage: Value, extra: Value) -> PathBuf {
    let mut cfg = serde_json::json!({
        "name": name,
        "topic": topic,
        "ackDeadlineSeconds": 10,
        "subsink": {"limits": "extended"},
        "cloudStorageConfig": {"bucket": "bkt", "avroConfig": {"writeMetadata": true}},
    });
    for (k, v) in storage.as_object().unwrap() {
        cfg["cloudStorageConfig"][k] = v.clone();
    }
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    let path = dir.join(format!("{}.json", name.rsplit('/').next().unwrap()));
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    path
}

/// Whole objects only (a local put stages `name#N` files, which are not objects).
fn objects(bucket: &Path) -> Vec<PathBuf> {
    files_below(bucket)
        .into_iter()
        .filter(|f| !f.contains('#'))
        .map(|f| bucket.join(f))
        .collect()
}

/// Records of every object in `bucket`, per object (in name order).
fn records(bucket: &Path) -> Vec<(PathBuf, Vec<Value>)> {
    let files = objects(bucket);
    if files.is_empty() {
        return Vec::new();
    }
    let dumps = fastavro_dump(&files);
    files
        .into_iter()
        .zip(dumps)
        .map(|(f, d)| (f, d["records"].as_array().unwrap().clone()))
        .collect()
}

fn attr_i(r: &Value) -> usize {
    r["attributes"]["i"].as_str().unwrap().parse().unwrap()
}

/// Wait until `bucket` holds records with every `i` in `0..n`.
fn wait_for_all(bucket: &Path, n: usize, limit: Duration) -> Vec<(PathBuf, Vec<Value>)> {
    let start = Instant::now();
    loop {
        let recs = records(bucket);
        let seen: HashSet<usize> = recs
            .iter()
            .flat_map(|(_, r)| r.iter().map(attr_i))
            .collect();
        if seen.len() >= n {
            return recs;
        }
        assert!(
            start.elapsed() < limit,
            "only {} of {n} messages written after {limit:?}",
            seen.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// SIGTERM the worker; it must exit 0 within `limit`. Returns (summary, stderr).
fn terminate(mut child: Child, limit: Duration) -> (Value, String) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(status.success(), "worker exited {status}: {err}");
            return (summary(&out), err);
        }
        assert!(
            start.elapsed() < limit,
            "worker still running {limit:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn drains_a_subscription_acks_after_durable_and_stops_on_sigterm() {
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.ack_deadline_seconds = 10;
    env.topic_and_sub(spec);
    let msgs: Vec<Message> = (0..2000).map(|i| message(i, 100)).collect();
    let ids = env.publish(&topic("events"), &msgs);
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxMessages": "500", "maxDuration": "3s"}),
        serde_json::json!({}),
    );
    let bucket = dir.path().join("bucket");
    let worker = env.worker(&cfg, &bucket, &[]);
    let recs = wait_for_all(&bucket, 2000, Duration::from_secs(60));
    let (s, _) = terminate(worker, Duration::from_secs(15));
    let got: Vec<&str> = recs
        .iter()
        .flat_map(|(_, r)| r.iter().map(|x| x["message_id"].as_str().unwrap()))
        .collect();
    assert_eq!(got.len(), 2000, "each message exactly once");
    assert_eq!(
        got.iter().copied().collect::<HashSet<_>>(),
        ids.iter().map(String::as_str).collect()
    );
    assert_eq!(s["messages_acked"], 2000);
    assert_eq!(s["messages_nacked"], 0);
    // Everything was acked: nothing is redelivered.
    assert!(env
        .drain(&sub("archive"), Duration::from_secs(12))
        .is_empty());
}

#[test]
fn leases_are_extended_while_files_stay_open_past_the_ack_deadline() {
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.ack_deadline_seconds = 10;
    env.topic_and_sub(spec);
    publish_n(&env, 100, 50);
    // Files stay open 25 s, two and a half times the 10 s lease: without extensions every
    // message would be redelivered (and written twice).
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxDuration": "25s"}),
        serde_json::json!({}),
    );
    let bucket = dir.path().join("bucket");
    let worker = env.worker(&cfg, &bucket, &["--ack-lease", "10s"]);
    let recs = wait_for_all(&bucket, 100, Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(2));
    let (s, _) = terminate(worker, Duration::from_secs(15));
    let n: usize = recs.iter().map(|(_, r)| r.len()).sum();
    assert_eq!(n, 100, "no message redelivered while its file was open");
    assert_eq!(s["messages_read"], 100);
}

#[test]
fn filter_is_applied_and_non_matching_messages_are_acked_not_written() {
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.filter = "attributes.kind = \"keep\"".into();
    env.topic_and_sub(spec);
    let msgs: Vec<Message> = (0..200)
        .map(|i| {
            let mut m = message(i, 20);
            m.attributes.insert(
                "kind".into(),
                if i % 2 == 0 { "keep" } else { "drop" }.into(),
            );
            m
        })
        .collect();
    env.publish(&topic("events"), &msgs);
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxDuration": "2s"}),
        serde_json::json!({"filter": "attributes.kind = \"keep\""}),
    );
    let bucket = dir.path().join("bucket");
    let worker = env.worker(&cfg, &bucket, &[]);
    let recs = wait_for_all(&bucket, 100, Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(3));
    let (s, _) = terminate(worker, Duration::from_secs(15));
    let written: Vec<usize> = recs
        .iter()
        .flat_map(|(_, r)| r.iter().map(attr_i))
        .collect();
    assert_eq!(written.len(), 100);
    assert!(
        written.iter().all(|i| i % 2 == 0),
        "only matching messages are written"
    );
    assert_eq!(s["messages_filtered"], 100);
    assert!(
        env.drain(&sub("archive"), Duration::from_secs(12))
            .is_empty(),
        "filtered messages were acked"
    );
}

#[test]
fn failing_messages_are_dead_lettered_with_the_five_attributes_after_max_attempts() {
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.dead_letter = Some((topic("dead-letters"), 5));
    spec.retry = Some((Duration::from_secs(1), Duration::from_secs(2)));
    env.topic_and_sub(spec);
    env.rt
        .block_on(env.client.create_subscription(&SubscriptionSpec::new(
            sub("dlq-sub"),
            topic("dead-letters"),
        )))
        .unwrap();
    let schema = root().join("fixtures/input/event.avsc");
    // Two good messages and one that does not match the topic schema: that one fails on every
    // delivery, the others are written.
    let good = |id: i64| Message {
        data: format!(
            r#"{{"id":{id},"name":"n","tags":[],"amount":null,"kind":"CLICK","ok":true}}"#
        )
        .into_bytes()
        .into(),
        attributes: BTreeMap::from([("i".to_string(), id.to_string())]),
        ..Default::default()
    };
    let bad = Message {
        data: br#"{"id":"not a number"}"#.to_vec().into(),
        attributes: BTreeMap::from([("i".to_string(), "2".to_string())]),
        ..Default::default()
    };
    let published = Instant::now();
    let ids = env.publish(&topic("events"), &[good(0), good(1), bad]);
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxDuration": "2s", "avroConfig": {"writeMetadata": true, "useTopicSchema": true}}),
        serde_json::json!({"deadLetterPolicy": {"deadLetterTopic": topic("dead-letters"), "maxDeliveryAttempts": 5},
                           "retryPolicy": {"minimumBackoff": "1s", "maximumBackoff": "2s"}}),
    );
    let bucket = dir.path().join("bucket");
    let worker = env.worker(&cfg, &bucket, &["--topic-schema", schema.to_str().unwrap()]);
    let dead = {
        let start = Instant::now();
        loop {
            let got = env.drain(&sub("dlq-sub"), Duration::from_secs(2));
            if !got.is_empty() {
                break got;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "nothing dead-lettered in 60 s"
            );
        }
    };
    let took = published.elapsed();
    let (s, err) = terminate(worker, Duration::from_secs(15));
    assert_eq!(dead.len(), 1, "{err}");
    let d = &dead[0];
    assert_eq!(&d.data[..], br#"{"id":"not a number"}"#);
    let a = &d.attributes;
    assert_eq!(a["i"], "2");
    assert_eq!(a["CloudPubSubDeadLetterSourceDeliveryCount"], "5");
    assert_eq!(a["CloudPubSubDeadLetterSourceSubscription"], "archive");
    assert_eq!(
        a["CloudPubSubDeadLetterSourceSubscriptionProject"],
        "subsink-e2e"
    );
    assert!(
        a["CloudPubSubDeadLetterSourceTopicPublishTime"].ends_with("+00:00"),
        "{a:?}"
    );
    assert!(
        a["CloudPubSubDeadLetterSourceDeliveryErrorMessage"]
            .contains(&format!("message {}", ids[2])),
        "{a:?}"
    );
    assert!(
        a["CloudPubSubDeadLetterSourceDeliveryErrorMessage"].contains("topic schema"),
        "{a:?}"
    );
    // Retry policy: four waits of at least 0.8, 1.6, 1.6, 1.6 s before the fifth attempt.
    assert!(
        took >= Duration::from_millis(5500),
        "dead-lettered after {took:?}: backoff not applied"
    );
    assert_eq!(s["messages_dead_lettered"], 1);
    assert_eq!(s["bad_messages"], 5);
    let written: Vec<usize> = records(&bucket)
        .iter()
        .flat_map(|(_, r)| r.iter().map(|x| x["id"].as_i64().unwrap() as usize))
        .collect();
    assert_eq!(
        written.iter().copied().collect::<HashSet<_>>(),
        HashSet::from([0, 1])
    );
    assert!(
        env.drain(&sub("archive"), Duration::from_secs(12))
            .is_empty(),
        "dead-lettered message was acked"
    );
}

#[test]
fn ordering_keys_keep_their_order_within_and_across_files() {
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.enable_message_ordering = true;
    env.topic_and_sub(spec);
    let msgs: Vec<Message> = (0..1000)
        .map(|i| {
            let mut m = message(i, 30);
            m.ordering_key = format!("k{}", i % 7);
            m
        })
        .collect();
    env.publish(&topic("events"), &msgs);
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxMessages": "100", "maxDuration": "2s"}),
        serde_json::json!({"enableMessageOrdering": true}),
    );
    let bucket = dir.path().join("bucket");
    let worker = env.worker(&cfg, &bucket, &[]);
    wait_for_all(&bucket, 1000, Duration::from_secs(60));
    let (_, err) = terminate(worker, Duration::from_secs(15));
    // Objects in the order the worker opened them (its log lists them as they are written,
    // one at a time with ordering).
    let order: Vec<String> = err
        .lines()
        .filter(|l| l.contains("object written"))
        .filter_map(|l| {
            l.split("object=")
                .nth(1)
                .map(|s| s.split_whitespace().next().unwrap().to_string())
        })
        .collect();
    assert!(order.len() >= 10, "{err}");
    let mut last: HashMap<String, usize> = HashMap::new();
    for name in &order {
        let dump = fastavro_dump(&[bucket.join(name)]);
        for r in dump[0]["records"].as_array().unwrap() {
            let key = r["attributes"]["ordering_key"]
                .as_str()
                .unwrap()
                .to_string();
            let i = attr_i(r);
            if let Some(prev) = last.insert(key.clone(), i) {
                assert!(i > prev, "key {key}: {i} after {prev} (object {name})");
            }
        }
    }
}

#[test]
fn two_workers_split_the_load_without_name_collisions_or_loss() {
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    env.topic_and_sub(SubscriptionSpec::new(sub("archive"), topic("events")));
    let n = 6000;
    let ids = publish_n(&env, n, 200);
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxMessages": "250", "maxDuration": "2s"}),
        serde_json::json!({}),
    );
    let bucket = dir.path().join("bucket");
    let a = env.worker(&cfg, &bucket, &["--max-outstanding-messages", "500"]);
    let b = env.worker(&cfg, &bucket, &["--max-outstanding-messages", "500"]);
    let recs = wait_for_all(&bucket, n, Duration::from_secs(90));
    let (sa, _) = terminate(a, Duration::from_secs(15));
    let (sb, _) = terminate(b, Duration::from_secs(15));
    let (wa, wb) = (
        sa["messages_written"].as_u64().unwrap(),
        sb["messages_written"].as_u64().unwrap(),
    );
    assert!(wa > 0 && wb > 0, "both workers wrote: {wa} + {wb}");
    let names_a: HashSet<String> = sa["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap().to_string())
        .collect();
    let names_b: HashSet<String> = sb["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap().to_string())
        .collect();
    assert!(names_a.is_disjoint(&names_b), "object name collision");
    assert_eq!(
        objects(&bucket).len(),
        names_a.len() + names_b.len(),
        "every object survives"
    );
    let got: HashSet<&str> = recs
        .iter()
        .flat_map(|(_, r)| r.iter().map(|x| x["message_id"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        ids.iter().map(String::as_str).collect(),
        "nothing lost"
    );
    assert_eq!(
        wa + wb,
        recs.iter().map(|(_, r)| r.len() as u64).sum::<u64>()
    );
}

#[test]
fn kill_9_at_random_moments_loses_nothing_and_duplicates_only_unacked_messages() {
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.ack_deadline_seconds = 10;
    env.topic_and_sub(spec);
    let n = 20_000;
    let ids = publish_n(&env, n, 100);
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxMessages": "1000", "maxDuration": "2s"}),
        serde_json::json!({}),
    );
    let bucket = dir.path().join("bucket");
    // Objects whose messages a worker acked (it logs "acked" after the ack call returns).
    let mut acked_objects: HashSet<String> = HashSet::new();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let collect_acks = |err: &str, acked: &mut HashSet<String>| {
        for l in err.lines().filter(|l| l.contains("acked after durable")) {
            if let Some(o) = l.split("object=").nth(1) {
                acked.insert(o.split_whitespace().next().unwrap().to_string());
            }
        }
    };
    for _ in 0..3 {
        let mut w = env.worker(&cfg, &bucket, &["--ack-lease", "10s"]);
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(1500 + seed % 2500));
        unsafe { libc::kill(w.id() as i32, libc::SIGKILL) };
        let _ = w.wait();
        let out = w.wait_with_output().unwrap();
        collect_acks(&String::from_utf8_lossy(&out.stderr), &mut acked_objects);
    }
    // Messages of killed workers come back after their 10 s lease; the last worker drains all.
    let w = env.worker(&cfg, &bucket, &["--ack-lease", "10s"]);
    // The emulator does not notice a killed worker's stream: it keeps pushing messages to it,
    // and they come back only when their 10 s lease expires, to be pushed again to a live or a
    // dead stream. With three dead streams and one live one a message reaches the live worker
    // with probability 1/4 per lease, so the tail is long (measured: 240 s was not always
    // enough with four dead streams); Pub/Sub itself drops a broken stream.
    let recs = wait_for_all(&bucket, n, Duration::from_secs(480));
    let (_, err) = terminate(w, Duration::from_secs(20));
    collect_acks(&err, &mut acked_objects);
    // Every object is whole: fastavro read each one (records() above).
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (_, r) in &recs {
        for x in r {
            *count.entry(x["message_id"].as_str().unwrap()).or_default() += 1;
        }
    }
    let all: HashSet<&str> = count.keys().copied().collect();
    assert_eq!(
        all,
        ids.iter().map(String::as_str).collect(),
        "every message id is in the output"
    );
    // A message in an acked object is never written again.
    for (path, r) in &recs {
        let name = path
            .strip_prefix(&bucket)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if acked_objects.contains(&name) {
            for x in r {
                let id = x["message_id"].as_str().unwrap();
                assert_eq!(
                    count[id], 1,
                    "message {id} of acked object {name} was written again"
                );
            }
        }
    }
    assert!(!acked_objects.is_empty());
}
