//! subsink on a live subscription: the real binary against Google's Pub/Sub emulator (no mocks),
//! writing to a local folder, with output read back by fastavro.
//!
//! Every test starts its own emulator. The emulator accepts filters but does not apply them, and
//! counts delivery attempts only for subscriptions with a dead-letter policy (measured on the emulator: it sends no delivery attempt without one).

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
use util::proxy::{PubsubCalls, PubsubProxy, S3Proxy};
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
        worker_at(
            &self.emu.host(),
            config,
            &format!("file://{}", bucket.display()),
            extra,
            &[],
        )
    }
}

/// `subsink run --source pubsub` against the Pub/Sub server at `host` (the emulator, or a proxy
/// in front of it), writing to `bucket_url`, with `env` added.
fn worker_at(
    host: &str,
    config: &Path,
    bucket_url: &str,
    extra: &[&str],
    env: &[(&str, String)],
) -> Child {
    subsink()
        .env("PUBSUB_EMULATOR_HOST", host)
        .env("SUBSINK_LOG", "info")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["run", "--source", "pubsub", "--subscription"])
        .arg(config)
        .arg("--bucket-url")
        .arg(bucket_url)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
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

/// Message id → the objects (names relative to the bucket, or `bucket/key` on S3) holding it.
fn holders<'a>(
    recs: impl IntoIterator<Item = (String, &'a Vec<Value>)>,
) -> HashMap<String, HashSet<String>> {
    let mut out: HashMap<String, HashSet<String>> = HashMap::new();
    for (name, r) in recs {
        for x in r {
            out.entry(x["message_id"].as_str().unwrap().to_string())
                .or_default()
                .insert(name.clone());
        }
    }
    out
}

fn local_holders(
    bucket: &Path,
    recs: &[(PathBuf, Vec<Value>)],
) -> HashMap<String, HashSet<String>> {
    holders(recs.iter().map(|(p, r)| {
        (
            p.strip_prefix(bucket)
                .unwrap()
                .to_string_lossy()
                .into_owned(),
            r,
        )
    }))
}

/// Each ack the proxy saw came after an object holding each acked message was visible in the
/// local bucket: the proxy lists the folder when the ack reaches it, before passing it on.
fn assert_acks_follow_visibility(calls: &PubsubCalls, holders: &HashMap<String, HashSet<String>>) {
    assert!(!calls.acks.is_empty(), "no acks at all");
    for (n, (_, ids, visible)) in calls.acks.iter().enumerate() {
        let visible = visible.as_ref().expect("the proxy watches the bucket");
        for id in ids {
            let objects = holders
                .get(id)
                .unwrap_or_else(|| panic!("ack {n}: message {id} was acked but is in no object"));
            assert!(
                objects.iter().any(|o| visible.contains(o)),
                "ack {n}: message {id} acked before its object {objects:?} was visible \
                 (visible then: {visible:?})"
            );
        }
    }
}

/// Each ack came after an object holding each acked message was visible on S3: its put (or
/// multipart completion) was answered 200 before the proxy saw the ack (one monotonic clock).
fn assert_acks_follow_s3_visibility(
    calls: &PubsubCalls,
    holders: &HashMap<String, HashSet<String>>,
    visible: &[(f64, String)],
) {
    assert!(!calls.acks.is_empty(), "no acks at all");
    let since: HashMap<&str, f64> = visible.iter().map(|(t, k)| (k.as_str(), *t)).collect();
    for (n, (t, ids, _)) in calls.acks.iter().enumerate() {
        for id in ids {
            let objects = holders
                .get(id)
                .unwrap_or_else(|| panic!("ack {n}: message {id} was acked but is in no object"));
            assert!(
                objects
                    .iter()
                    .any(|o| since.get(o.as_str()).is_some_and(|v| v < t)),
                "ack {n} at {t}: message {id} acked before any of its objects {objects:?} \
                 was visible ({:?})",
                objects
                    .iter()
                    .map(|o| (o, since.get(o.as_str())))
                    .collect::<Vec<_>>()
            );
        }
    }
}

/// Records of every object of an S3 bucket, `(bucket/key, records)`, read back with fastavro.
fn s3_records(s3: &S3Server, bucket: &str) -> Vec<(String, Vec<Value>)> {
    let scratch = tempfile::tempdir().unwrap();
    let got = s3.download_all(bucket, scratch.path());
    if got.is_empty() {
        return Vec::new();
    }
    let files: Vec<PathBuf> = got.iter().map(|(_, p, _)| p.clone()).collect();
    got.into_iter()
        .zip(fastavro_dump(&files))
        .map(|((k, _, _), d)| {
            (
                format!("{bucket}/{k}"),
                d["records"].as_array().unwrap().clone(),
            )
        })
        .collect()
}

/// Wait until an S3 bucket holds records with every `i` in `0..n`.
fn wait_for_all_s3(
    s3: &S3Server,
    bucket: &str,
    n: usize,
    limit: Duration,
) -> Vec<(String, Vec<Value>)> {
    let start = Instant::now();
    loop {
        let recs = s3_records(s3, bucket);
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
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Wait until `cond` holds for what the proxy saw, up to `limit`.
fn wait_calls(
    proxy: &PubsubProxy,
    limit: Duration,
    what: &str,
    cond: impl Fn(&PubsubCalls) -> bool,
) -> PubsubCalls {
    let start = Instant::now();
    loop {
        let c = proxy.calls();
        if cond(&c) {
            return c;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn acks_after_durable_every_ack_follows_the_visibility_of_its_object() {
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
    // The worker talks to the emulator through a proxy that lists the bucket at each ack.
    let proxy = PubsubProxy::start(
        &env.emu.host(),
        &dir.path().join("calls.log"),
        Some(&bucket),
    );
    let worker = worker_at(
        &proxy.host(),
        &cfg,
        &format!("file://{}", bucket.display()),
        &[],
        &[],
    );
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
    // On the wire: every message acked exactly once, never before its object was visible.
    let calls = proxy.calls();
    assert_acks_follow_visibility(&calls, &local_holders(&bucket, &recs));
    let acked = calls.acked();
    assert_eq!(
        acked.keys().map(String::as_str).collect::<HashSet<_>>(),
        ids.iter().map(String::as_str).collect(),
        "every message acked"
    );
    assert!(acked.values().all(|&n| n == 1), "no message acked twice");
    assert!(calls.nacked().is_empty(), "nothing nacked");
    // The emulator agrees: nothing is redelivered.
    assert!(env
        .drain(&sub("archive"), Duration::from_secs(12))
        .is_empty());
}

#[test]
fn sigterm_with_files_open_finalizes_them_acks_and_exits_0_within_the_grace() {
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.ack_deadline_seconds = 10;
    env.topic_and_sub(spec);
    let ids = publish_n(&env, 300, 50);
    // Files would stay open ten minutes: only the shutdown finalizes them.
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxDuration": "600s"}),
        serde_json::json!({}),
    );
    let bucket = dir.path().join("bucket");
    let proxy = PubsubProxy::start(
        &env.emu.host(),
        &dir.path().join("calls.log"),
        Some(&bucket),
    );
    let grace = Duration::from_secs(20);
    let worker = worker_at(
        &proxy.host(),
        &cfg,
        &format!("file://{}", bucket.display()),
        &["--ack-lease", "10s", "--shutdown-grace", "20s"],
        &[],
    );
    wait_calls(&proxy, Duration::from_secs(60), "all 300 delivered", |c| {
        c.delivered().len() == 300
    });
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        objects(&bucket).is_empty(),
        "no object before the shutdown: the files are open"
    );
    let t0 = Instant::now();
    let (s, err) = terminate(worker, grace);
    let took = t0.elapsed();
    eprintln!("shutdown with open files took {took:?}");
    assert_eq!(s["shutdown"], true, "{err}");
    assert_eq!(s["messages_written"], 300, "{err}");
    assert_eq!(s["messages_acked"], 300, "{err}");
    assert_eq!(s["messages_nacked"], 0, "{err}");
    let recs = records(&bucket);
    assert!(!recs.is_empty(), "the open files were finalized");
    let got: Vec<&str> = recs
        .iter()
        .flat_map(|(_, r)| r.iter().map(|x| x["message_id"].as_str().unwrap()))
        .collect();
    assert_eq!(got.len(), 300, "each message once");
    assert_eq!(
        got.iter().copied().collect::<HashSet<_>>(),
        ids.iter().map(String::as_str).collect()
    );
    let calls = proxy.calls();
    assert_acks_follow_visibility(&calls, &local_holders(&bucket, &recs));
    assert_eq!(calls.acked().len(), 300, "every message acked");
    assert!(calls.nacked().is_empty());
    // The 10 s lease has long passed: an unacked message would come back now.
    assert!(env
        .drain(&sub("archive"), Duration::from_secs(15))
        .is_empty());
}

#[test]
fn sigterm_past_the_grace_nacks_what_is_not_durable_and_the_emulator_redelivers_it() {
    let s3 = S3Server::start();
    s3.create_bucket("bkt");
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    let store = S3Proxy::start(&s3, dir.path());
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.ack_deadline_seconds = 10;
    env.topic_and_sub(spec);
    let first = publish_n(&env, 200, 50);
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxMessages": "100", "maxDuration": "600s"}),
        serde_json::json!({}),
    );
    let proxy = PubsubProxy::start(&env.emu.host(), &dir.path().join("calls.log"), None);
    let worker = worker_at(
        &proxy.host(),
        &cfg,
        "s3://bkt",
        &["--shutdown-grace", "3s"],
        &store.env(&s3),
    );
    // Two objects of 100 become durable and are acked.
    wait_calls(&proxy, Duration::from_secs(60), "200 acked", |c| {
        c.acked().len() == 200
    });
    assert_eq!(store.visible().len(), 2);
    // Then the store hangs: the next 150 messages fill one object that never completes and
    // one open file.
    store.set(serde_json::json!({"mode": "hang"}));
    let rest: Vec<String> = env.publish(
        &topic("events"),
        &(200..350).map(|i| message(i, 50)).collect::<Vec<_>>(),
    );
    wait_calls(&proxy, Duration::from_secs(60), "350 delivered", |c| {
        c.delivered().len() == 350
    });
    let start = Instant::now();
    while !store.writes().iter().any(|w| w.status.is_none()) {
        assert!(start.elapsed() < Duration::from_secs(30), "no upload hangs");
        std::thread::sleep(Duration::from_millis(100));
    }
    let t0 = Instant::now();
    let (s, err) = terminate(worker, Duration::from_secs(30));
    let took = t0.elapsed();
    eprintln!("shutdown past a 3 s grace took {took:?}");
    // The grace bounds finalizing and uploading; stopping the stream and the nacks come on top.
    assert!(
        took >= Duration::from_secs(3),
        "exited after {took:?}, before the grace was over"
    );
    assert!(
        took < Duration::from_secs(8),
        "exited {took:?} after SIGTERM with a 3 s grace"
    );
    assert_eq!(s["shutdown"], true, "{err}");
    assert_eq!(s["messages_acked"], 200, "{err}");
    assert_eq!(s["messages_nacked"], 150, "{err}");
    let calls = proxy.calls();
    let acked = calls.acked();
    let nacked = calls.nacked();
    assert_eq!(
        acked.keys().collect::<HashSet<_>>(),
        first.iter().collect(),
        "only the durable messages are acked"
    );
    assert_eq!(
        nacked.keys().collect::<HashSet<_>>(),
        rest.iter().collect(),
        "the others are nacked"
    );
    assert_eq!(s3.list("bkt").len(), 2, "no third object");
    // Nacked, not left to expire: the emulator redelivers them at once (their lease was the
    // default 60 s).
    let again: HashSet<String> = env
        .drain(&sub("archive"), Duration::from_secs(8))
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    assert_eq!(again, rest.iter().cloned().collect());
}

#[test]
fn a_failing_store_nacks_never_acks_and_after_recovery_writes_each_message_once() {
    let s3 = S3Server::start();
    s3.create_bucket("bkt");
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    let store = S3Proxy::start(&s3, dir.path());
    store.set(serde_json::json!({"mode": "deny"}));
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.ack_deadline_seconds = 10;
    env.topic_and_sub(spec);
    let ids = publish_n(&env, 200, 50);
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxMessages": "50", "maxDuration": "2s"}),
        serde_json::json!({}),
    );
    let proxy = PubsubProxy::start(&env.emu.host(), &dir.path().join("calls.log"), None);
    let worker = worker_at(
        &proxy.host(),
        &cfg,
        "s3://bkt",
        &["--ack-lease", "10s"],
        &store.env(&s3),
    );
    // While the store refuses every write, messages come back again and again.
    let calls = wait_calls(
        &proxy,
        Duration::from_secs(90),
        "every message delivered twice",
        |c| {
            let d = c.delivered();
            d.len() == 200 && d.values().all(|&n| n >= 2)
        },
    );
    assert!(
        calls.acks.is_empty(),
        "acked while the store fails: {:?}",
        calls.acks
    );
    let nacked = calls.nacked();
    assert!(
        ids.iter().all(|id| nacked.contains_key(id)),
        "every message nacked"
    );
    assert!(s3.list("bkt").is_empty());
    assert!(store.writes().iter().all(|w| w.status == Some(403)));
    store.set(serde_json::json!({"mode": "pass"}));
    let recs = wait_for_all_s3(&s3, "bkt", 200, Duration::from_secs(90));
    std::thread::sleep(Duration::from_secs(3));
    let (s, err) = terminate(worker, Duration::from_secs(15));
    let recs_after = s3_records(&s3, "bkt");
    assert_eq!(
        recs.len(),
        recs_after.len(),
        "nothing written after the wait"
    );
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (_, r) in &recs_after {
        for x in r {
            *count.entry(x["message_id"].as_str().unwrap()).or_default() += 1;
        }
    }
    assert_eq!(
        count.keys().copied().collect::<HashSet<_>>(),
        ids.iter().map(String::as_str).collect()
    );
    assert!(
        count.values().all(|&n| n == 1),
        "each message written once: {count:?}"
    );
    assert!(!s["failed_objects"].as_array().unwrap().is_empty(), "{err}");
    let calls = proxy.calls();
    assert_acks_follow_s3_visibility(
        &calls,
        &holders(recs_after.iter().map(|(k, r)| (k.clone(), r))),
        &store.visible(),
    );
    assert_eq!(calls.acked().len(), 200);
    assert!(env
        .drain(&sub("archive"), Duration::from_secs(12))
        .is_empty());
}

#[test]
fn with_ordering_a_failed_object_fails_the_later_files_and_no_key_goes_out_of_order() {
    let s3 = S3Server::start();
    s3.create_bucket("bkt");
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    let store = S3Proxy::start(&s3, dir.path());
    // The third object written is refused for good; the store takes everything else.
    store.set(serde_json::json!({"deny_object": 3}));
    let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.enable_message_ordering = true;
    env.topic_and_sub(spec);
    let n = 700;
    let msgs: Vec<Message> = (0..n)
        .map(|i| {
            let mut m = message(i, 30);
            m.ordering_key = format!("k{}", i % 7);
            m
        })
        .collect();
    env.publish(&topic("events"), &msgs);
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxMessages": "50", "maxDuration": "2s"}),
        serde_json::json!({"enableMessageOrdering": true}),
    );
    let proxy = PubsubProxy::start(&env.emu.host(), &dir.path().join("calls.log"), None);
    let worker = worker_at(
        &proxy.host(),
        &cfg,
        "s3://bkt",
        &["--ack-lease", "10s"],
        &store.env(&s3),
    );
    wait_for_all_s3(&s3, "bkt", n, Duration::from_secs(120));
    std::thread::sleep(Duration::from_secs(3));
    let (s, err) = terminate(worker, Duration::from_secs(15));
    let recs = s3_records(&s3, "bkt");
    let writes = store.writes();
    let refused: HashSet<&str> = writes
        .iter()
        .filter(|w| w.status == Some(403))
        .map(|w| w.key.as_str())
        .collect();
    assert_eq!(refused.len(), 1, "one object refused: {refused:?}");
    let failed = s["failed_objects"].as_array().unwrap();
    assert!(
        failed.iter().any(|f| f["error"]
            .as_str()
            .unwrap()
            .contains("an earlier object of this ordered subscription failed")),
        "later files were failed too: {failed:?}\n{err}"
    );
    // Objects in the order they became visible (the store's answers, not the worker's log).
    let visible = store.visible();

    let by_key: HashMap<&str, &Vec<Value>> = recs.iter().map(|(k, r)| (k.as_str(), r)).collect();
    assert_eq!(
        visible.len(),
        recs.len(),
        "every object came through the proxy"
    );
    // For every ordering key: when a message becomes durable, every earlier one of its key
    // already is.
    let mut first_durable: HashMap<usize, usize> = HashMap::new();
    for (pos, (_, key)) in visible.iter().enumerate() {
        for r in by_key[key.as_str()] {
            first_durable.entry(attr_i(r)).or_insert(pos);
        }
    }
    assert_eq!(first_durable.len(), n, "every message durable");
    for k in 0..7 {
        let mut prev: Option<(usize, usize)> = None;
        for i in (k..n).step_by(7) {
            let pos = first_durable[&i];
            if let Some((pi, ppos)) = prev {
                assert!(
                    ppos <= pos,
                    "key k{k}: message {i} durable in object #{pos} before message {pi} \
                     (object #{ppos})"
                );
            }
            prev = Some((i, pos));
        }
    }
    let calls = proxy.calls();
    assert_acks_follow_s3_visibility(
        &calls,
        &holders(recs.iter().map(|(k, r)| (k.clone(), r))),
        &visible,
    );
}

#[test]
fn without_a_server_count_subsink_counts_deliveries_and_dead_letters_on_the_last() {
    let env = Env::start();
    let dir = tempfile::tempdir().unwrap();
    // The subscription on the server has no dead-letter policy, so the server sends no delivery
    // attempt; subsink's config has one, and counts failed deliveries per message id itself.
    let spec = SubscriptionSpec::new(sub("archive"), topic("events"));
    env.topic_and_sub(spec);
    env.rt.block_on(async {
        env.client
            .create_topic(&topic("dead-letters"))
            .await
            .unwrap();
        env.client
            .create_subscription(&SubscriptionSpec::new(
                sub("dlq-sub"),
                topic("dead-letters"),
            ))
            .await
            .unwrap();
    });
    let schema = root().join("fixtures/input/event.avsc");
    let good = Message {
        data: br#"{"id":1,"name":"n","tags":[],"amount":null,"kind":"CLICK","ok":true}"#
            .to_vec()
            .into(),
        ..Default::default()
    };
    let bad = Message {
        data: br#"{"id":"not a number"}"#.to_vec().into(),
        attributes: BTreeMap::from([("k".to_string(), "v".to_string())]),
        ..Default::default()
    };
    let ids = env.publish(&topic("events"), &[good, bad]);
    let cfg = archive_config(
        dir.path(),
        serde_json::json!({"maxDuration": "2s", "avroConfig": {"writeMetadata": true, "useTopicSchema": true}}),
        serde_json::json!({"deadLetterPolicy": {"deadLetterTopic": topic("dead-letters"), "maxDeliveryAttempts": 5}}),
    );
    let bucket = dir.path().join("bucket");
    let proxy = PubsubProxy::start(&env.emu.host(), &dir.path().join("calls.log"), None);
    let worker = worker_at(
        &proxy.host(),
        &cfg,
        &format!("file://{}", bucket.display()),
        &["--topic-schema", schema.to_str().unwrap()],
        &[],
    );
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
    std::thread::sleep(Duration::from_secs(1));
    let (s, err) = terminate(worker, Duration::from_secs(15));
    assert_eq!(dead.len(), 1, "{err}");
    let a = &dead[0].attributes;
    assert_eq!(a["k"], "v");
    assert_eq!(a["CloudPubSubDeadLetterSourceDeliveryCount"], "5", "{a:?}");
    assert_eq!(a["CloudPubSubDeadLetterSourceSubscription"], "archive");
    assert_eq!(
        a["CloudPubSubDeadLetterSourceSubscriptionProject"],
        "subsink-e2e"
    );
    assert!(
        a["CloudPubSubDeadLetterSourceDeliveryErrorMessage"]
            .contains(&format!("message {}", ids[1])),
        "{a:?}"
    );
    let calls = proxy.calls();
    // The server counted nothing: every delivery came without an attempt number.
    assert!(
        calls.deliveries.iter().all(|(_, _, attempt)| *attempt == 0),
        "{:?}",
        calls.deliveries
    );
    // Delivered exactly five times: nacked after each of the first four, then published to the
    // dead-letter topic and acked.
    assert_eq!(calls.delivered()[&ids[1]], 5);
    assert_eq!(calls.nacked().get(&ids[1]), Some(&4));
    assert_eq!(calls.acked().get(&ids[1]), Some(&1));
    let published = calls
        .publishes
        .iter()
        .find(|(_, t, _)| t == &topic("dead-letters"))
        .expect("published to the dead-letter topic");
    let acked_at = calls
        .acks
        .iter()
        .find(|(_, m, _)| m.contains(&ids[1]))
        .unwrap()
        .0;
    assert!(published.0 < acked_at, "acked before it was dead-lettered");
    assert_eq!(s["messages_dead_lettered"], 1);
    assert_eq!(s["bad_messages"], 5);
    assert_eq!(
        calls.acked().get(&ids[0]),
        Some(&1),
        "the good message is acked"
    );
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
