//! subsink on a live subscription: the real binary against Google's Pub/Sub emulator (no mocks),
//! writing to a local folder, with output read back by fastavro.
//!
//! Every test starts its own emulator. The emulator accepts filters but does not apply them, and
//! counts delivery attempts only for subscriptions with a dead-letter policy (measured on the emulator: it sends no delivery attempt without one).

mod util;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use util::proxy::{PubsubCalls, PubsubProxy};
use util::pubsub::{sub, topic, Scenario};
use util::*;

/// Whole objects only (see [`objects_below`]).
fn objects(bucket: &Path) -> Vec<PathBuf> {
    objects_below(bucket)
}

/// Records of every object in `bucket`, per object (in name order).
fn records(bucket: &Path) -> Vec<(PathBuf, Vec<Value>)> {
    avro_records_by_file(objects(bucket))
}

/// Wait until `bucket` holds records with every `i` in `0..n`.
fn wait_for_all(bucket: &Path, n: usize, limit: Duration) -> Vec<(PathBuf, Vec<Value>)> {
    wait_for_every_i(n, limit, Duration::from_millis(200), || records(bucket))
}

/// The message id of every record, object after object.
fn ids_of<K>(recs: &[(K, Vec<Value>)]) -> Vec<&str> {
    recs.iter()
        .flat_map(|(_, r)| r.iter().map(|x| x["message_id"].as_str().unwrap()))
        .collect()
}

/// How often each message id was written.
fn id_counts<K>(recs: &[(K, Vec<Value>)]) -> HashMap<&str, usize> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for id in ids_of(recs) {
        *count.entry(id).or_default() += 1;
    }
    count
}

/// `ids` as a set of `&str`.
fn id_set(ids: &[String]) -> HashSet<&str> {
    ids.iter().map(String::as_str).collect()
}

/// `n` numbered messages of `size` bytes, each with ordering key `k{i % 7}`.
fn keyed_messages(n: usize, size: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let mut m = numbered_message(i, size);
            m.ordering_key = format!("k{}", i % 7);
            m
        })
        .collect()
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
    wait_for_every_i(n, limit, Duration::from_millis(500), || {
        s3_records(s3, bucket)
    })
}

/// Read a worker's stderr on a thread of its own until the worker exits; its text.
fn read_stderr(worker: &mut std::process::Child) -> std::thread::JoinHandle<String> {
    let mut pipe = worker.stderr.take().expect("stderr is piped");
    std::thread::spawn(move || {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut out);
        out
    })
}

/// Wait until `cond` holds for what the proxy saw, up to `limit`.
fn wait_calls(
    proxy: &PubsubProxy,
    limit: Duration,
    what: &str,
    cond: impl Fn(&PubsubCalls) -> bool,
) -> PubsubCalls {
    poll(limit, Duration::from_millis(200), || {
        let c = proxy.calls();
        if cond(&c) {
            Ok(c)
        } else {
            Err(format!("{what}: not within {limit:?}"))
        }
    })
}

#[test]
fn acks_after_durable_every_ack_follows_the_visibility_of_its_object() {
    let sc = Scenario::leased();
    let ids = sc.env.publish_n(2000, 100);
    let cfg = sc.config(
        json!({"maxMessages": "500", "maxDuration": "3s"}),
        json!({}),
    );
    // The worker talks to the emulator through a proxy that lists the bucket at each ack.
    let proxy = sc.proxy(true);
    let worker = sc.worker_via(&proxy, &cfg, &[]);
    let recs = wait_for_all(&sc.bucket, 2000, Duration::from_secs(60));
    let (s, _) = terminate(worker, Duration::from_secs(15));
    let got = ids_of(&recs);
    assert_eq!(got.len(), 2000, "each message exactly once");
    assert_eq!(got.into_iter().collect::<HashSet<_>>(), id_set(&ids));
    assert_eq!(s["messages_acked"], 2000);
    assert_eq!(s["messages_nacked"], 0);
    // On the wire: every message acked exactly once, never before its object was visible.
    let calls = proxy.calls();
    assert_acks_follow_visibility(&calls, &local_holders(&sc.bucket, &recs));
    let acked = calls.acked();
    assert_eq!(
        acked.keys().map(String::as_str).collect::<HashSet<_>>(),
        id_set(&ids),
        "every message acked"
    );
    assert!(acked.values().all(|&n| n == 1), "no message acked twice");
    assert!(calls.nacked().is_empty(), "nothing nacked");
    // The emulator agrees: nothing is redelivered.
    assert!(sc.drain_archive(Duration::from_secs(12)).is_empty());
}

#[test]
fn sigterm_with_files_open_finalizes_them_acks_and_exits_0_within_the_grace() {
    let sc = Scenario::leased();
    let ids = sc.env.publish_n(300, 50);
    // Files would stay open ten minutes: only the shutdown finalizes them.
    let cfg = sc.config(json!({"maxDuration": "600s"}), json!({}));
    let proxy = sc.proxy(true);
    let grace = Duration::from_secs(20);
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let worker = sc.worker_via(
        &proxy,
        &cfg,
        &[
            "--ack-lease",
            "10s",
            "--shutdown-grace",
            "20s",
            "--metrics-addr",
            &metrics_addr,
        ],
    );
    wait_calls(&proxy, Duration::from_secs(60), "all 300 delivered", |c| {
        c.delivered().len() == 300
    });
    // The worker holds all 300 in open files (its own gauges say so), not "a second later".
    let base = format!("http://{metrics_addr}");
    let labels = json!({"subscription": sub("archive")});
    poll(Duration::from_secs(30), Duration::from_millis(200), || {
        let received = util::http::metric(
            &base,
            "subsink_messages_received",
            "subsink_messages_received_total",
            &labels,
        );
        let open = util::http::metric(&base, "subsink_open_files", "subsink_open_files", &labels);
        match (received, open) {
            (Some(r), Some(o)) if r == 300.0 && o >= 1.0 => Ok(()),
            other => Err(format!("received, open files: {other:?}")),
        }
    });
    assert!(
        objects(&sc.bucket).is_empty(),
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
    let recs = records(&sc.bucket);
    assert!(!recs.is_empty(), "the open files were finalized");
    let got = ids_of(&recs);
    assert_eq!(got.len(), 300, "each message once");
    assert_eq!(got.into_iter().collect::<HashSet<_>>(), id_set(&ids));
    let calls = proxy.calls();
    assert_acks_follow_visibility(&calls, &local_holders(&sc.bucket, &recs));
    assert_eq!(calls.acked().len(), 300, "every message acked");
    assert!(calls.nacked().is_empty());
    // The 10 s lease has long passed: an unacked message would come back now.
    assert!(sc.drain_archive(Duration::from_secs(15)).is_empty());
}

#[test]
fn sigterm_past_the_grace_nacks_what_is_not_durable_and_the_emulator_redelivers_it() {
    let sc = Scenario::leased();
    let store = sc.s3_store();
    let first = sc.env.publish_n(200, 50);
    let cfg = sc.config(
        json!({"maxMessages": "100", "maxDuration": "600s"}),
        json!({}),
    );
    let proxy = sc.proxy(false);
    let worker = store.worker(&proxy, &cfg, &["--shutdown-grace", "3s"]);
    // Two objects of 100 become durable and are acked.
    wait_calls(&proxy, Duration::from_secs(60), "200 acked", |c| {
        c.acked().len() == 200
    });
    assert_eq!(store.proxy.visible().len(), 2);
    // Then the store hangs: the next 150 messages fill one object that never completes and
    // one open file.
    store.proxy.set(json!({"mode": "hang"}));
    let rest: Vec<String> = sc.env.publish(
        &topic("events"),
        &(200..350)
            .map(|i| numbered_message(i, 50))
            .collect::<Vec<_>>(),
    );
    wait_calls(&proxy, Duration::from_secs(60), "350 delivered", |c| {
        c.delivered().len() == 350
    });
    let start = Instant::now();
    while !store.proxy.writes().iter().any(|w| w.status.is_none()) {
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
    assert_eq!(store.s3.list("bkt").len(), 2, "no third object");
    // Nacked, not left to expire: the emulator redelivers them at once (their lease was the
    // default 60 s).
    let again: HashSet<String> = sc
        .drain_archive(Duration::from_secs(8))
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    assert_eq!(again, rest.iter().cloned().collect());
}

#[test]
fn a_failing_store_nacks_never_acks_and_after_recovery_writes_each_message_once() {
    let sc = Scenario::leased();
    let store = sc.s3_store();
    store.proxy.set(json!({"mode": "deny"}));
    let ids = sc.env.publish_n(200, 50);
    let cfg = sc.config(json!({"maxMessages": "50", "maxDuration": "2s"}), json!({}));
    let proxy = sc.proxy(false);
    let mut worker = store.worker(&proxy, &cfg, &["--ack-lease", "10s"]);
    // Every failed object logs an error, dozens a second while the store refuses: read them as
    // they come, or the worker blocks writing to a full pipe.
    let stderr = read_stderr(&mut worker);
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
    assert!(store.s3.list("bkt").is_empty());
    assert!(store.proxy.writes().iter().all(|w| w.status == Some(403)));
    store.proxy.set(json!({"mode": "pass"}));
    let recs = wait_for_all_s3(&store.s3, "bkt", 200, Duration::from_secs(90));
    // Done once every message is acked on the wire; anything written after that is a duplicate.
    wait_calls(
        &proxy,
        Duration::from_secs(60),
        "every message acked",
        |c| c.acked().len() == 200,
    );
    let (s, _) = terminate(worker, Duration::from_secs(15));
    let err = stderr.join().unwrap();
    let recs_after = s3_records(&store.s3, "bkt");
    assert_eq!(
        recs.len(),
        recs_after.len(),
        "nothing written after the wait"
    );
    let count = id_counts(&recs_after);
    assert_eq!(count.keys().copied().collect::<HashSet<_>>(), id_set(&ids));
    assert!(
        count.values().all(|&n| n == 1),
        "each message written once: {count:?}"
    );
    assert!(!s["failed_objects"].as_array().unwrap().is_empty(), "{err}");
    let calls = proxy.calls();
    assert_acks_follow_s3_visibility(
        &calls,
        &holders(recs_after.iter().map(|(k, r)| (k.clone(), r))),
        &store.proxy.visible(),
    );
    assert_eq!(calls.acked().len(), 200);
    assert!(sc.drain_archive(Duration::from_secs(12)).is_empty());
}

#[test]
fn with_ordering_a_failed_object_fails_the_later_files_and_no_key_goes_out_of_order() {
    let sc = Scenario::start(|s| s.enable_message_ordering = true);
    let store = sc.s3_store();
    // The third object written is refused for good; the store takes everything else.
    store.proxy.set(json!({"deny_object": 3}));
    let n = 700;
    sc.env.publish(&topic("events"), &keyed_messages(n, 30));
    let cfg = sc.config(
        json!({"maxMessages": "50", "maxDuration": "2s"}),
        json!({"enableMessageOrdering": true}),
    );
    let proxy = sc.proxy(false);
    let worker = store.worker(&proxy, &cfg, &["--ack-lease", "10s"]);
    wait_for_all_s3(&store.s3, "bkt", n, Duration::from_secs(120));
    wait_calls(
        &proxy,
        Duration::from_secs(60),
        "every message acked",
        |c| c.acked().len() == n,
    );
    let (s, err) = terminate(worker, Duration::from_secs(15));
    let recs = s3_records(&store.s3, "bkt");
    let writes = store.proxy.writes();
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
    let visible = store.proxy.visible();

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
    // The subscription on the server has no dead-letter policy, so the server sends no delivery
    // attempt; subsink's config has one, and counts failed deliveries per message id itself.
    let sc = Scenario::start(|_| {});
    sc.env
        .rt
        .block_on(sc.env.client.create_topic(&topic("dead-letters")))
        .unwrap();
    sc.env.subscribe(&sub("dlq-sub"), &topic("dead-letters"));
    let schema = root().join("fixtures/input/event.avsc");
    let good = Message {
        data: br#"{"id":1,"name":"n","tags":[],"amount":null,"kind":"CLICK","ok":true}"#
            .to_vec()
            .into(),
        ..Default::default()
    };
    let bad = Message {
        data: br#"{"id":"not a number"}"#.to_vec().into(),
        attributes: [("k".to_string(), "v".to_string())].into(),
        ..Default::default()
    };
    let ids = sc.env.publish(&topic("events"), &[good, bad]);
    let cfg = sc.config(
        json!({"maxDuration": "2s", "avroConfig": {"writeMetadata": true, "useTopicSchema": true}}),
        json!({"deadLetterPolicy": {"deadLetterTopic": topic("dead-letters"), "maxDeliveryAttempts": 5}}),
    );
    let proxy = sc.proxy(false);
    let worker = sc.worker_via(&proxy, &cfg, &["--topic-schema", schema.to_str().unwrap()]);
    let dead = sc
        .env
        .drain_until_some(&sub("dlq-sub"), Duration::from_secs(60));
    // Both messages are settled on the wire: the good one written and acked, the bad one acked
    // after its dead letter was published.
    wait_calls(
        &proxy,
        Duration::from_secs(30),
        "both messages acked",
        |c| {
            let acked = c.acked();
            acked.contains_key(&ids[0]) && acked.contains_key(&ids[1])
        },
    );
    let (s, err) = terminate(worker, Duration::from_secs(15));
    assert_eq!(dead.len(), 1, "{err}");
    let a = &dead[0].attributes;
    assert_eq!(&a["k"], "v");
    assert_eq!(&a["CloudPubSubDeadLetterSourceDeliveryCount"], "5", "{a:?}");
    assert_eq!(&a["CloudPubSubDeadLetterSourceSubscription"], "archive");
    assert_eq!(
        &a["CloudPubSubDeadLetterSourceSubscriptionProject"],
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
    assert!(sc.drain_archive(Duration::from_secs(12)).is_empty());
}

#[test]
fn leases_are_extended_while_files_stay_open_past_the_ack_deadline() {
    let sc = Scenario::leased();
    sc.env.publish_n(100, 50);
    // Files stay open 25 s, two and a half times the 10 s lease: without extensions every
    // message would be redelivered (and written twice).
    let cfg = sc.config(json!({"maxDuration": "25s"}), json!({}));
    let proxy = sc.proxy(false);
    let worker = sc.worker_via(&proxy, &cfg, &["--ack-lease", "10s"]);
    let recs = wait_for_all(&sc.bucket, 100, Duration::from_secs(60));
    let calls = wait_calls(
        &proxy,
        Duration::from_secs(30),
        "every message acked",
        |c| c.acked().len() == 100,
    );
    let (s, _) = terminate(worker, Duration::from_secs(15));
    let n: usize = recs.iter().map(|(_, r)| r.len()).sum();
    assert_eq!(n, 100, "no message redelivered while its file was open");
    assert_eq!(s["messages_read"], 100);
    // On the wire: each message delivered once, its lease extended while its file was open.
    assert!(
        calls.delivered().values().all(|&d| d == 1),
        "redelivered: {:?}",
        calls.delivered()
    );
    assert!(
        calls.modacks.iter().any(|(_, _, secs)| *secs > 0),
        "no lease extension"
    );
}

#[test]
fn filter_is_applied_and_non_matching_messages_are_acked_not_written() {
    let sc = Scenario::start(|s| s.filter = "attributes.kind = \"keep\"".into());
    let msgs: Vec<Message> = (0..200)
        .map(|i| {
            let mut m = numbered_message(i, 20);
            m.attributes.insert(
                "kind".into(),
                if i % 2 == 0 { "keep" } else { "drop" }.into(),
            );
            m
        })
        .collect();
    sc.env.publish(&topic("events"), &msgs);
    let cfg = sc.config(
        json!({"maxDuration": "2s"}),
        json!({"filter": "attributes.kind = \"keep\""}),
    );
    let proxy = sc.proxy(false);
    let worker = sc.worker_via(&proxy, &cfg, &[]);
    let recs = wait_for_all(&sc.bucket, 100, Duration::from_secs(60));
    // Every message settled on the wire: 100 written, 100 filtered out, all 200 acked.
    wait_calls(&proxy, Duration::from_secs(30), "all 200 acked", |c| {
        c.acked().len() == 200
    });
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
        sc.drain_archive(Duration::from_secs(12)).is_empty(),
        "filtered messages were acked"
    );
}

#[test]
fn failing_messages_are_dead_lettered_with_the_five_attributes_after_max_attempts() {
    let sc = Scenario::start(|s| {
        s.dead_letter = Some((topic("dead-letters"), 5));
        s.retry = Some((Duration::from_secs(1), Duration::from_secs(2)));
    });
    sc.env.subscribe(&sub("dlq-sub"), &topic("dead-letters"));
    let schema = root().join("fixtures/input/event.avsc");
    // Two good messages and one that does not match the topic schema: that one fails on every
    // delivery, the others are written.
    let good = |id: i64| Message {
        data: format!(
            r#"{{"id":{id},"name":"n","tags":[],"amount":null,"kind":"CLICK","ok":true}}"#
        )
        .into_bytes()
        .into(),
        attributes: [("i".to_string(), id.to_string())].into(),
        ..Default::default()
    };
    let bad = Message {
        data: br#"{"id":"not a number"}"#.to_vec().into(),
        attributes: [("i".to_string(), "2".to_string())].into(),
        ..Default::default()
    };
    let published = Instant::now();
    let ids = sc.env.publish(&topic("events"), &[good(0), good(1), bad]);
    let cfg = sc.config(
        json!({"maxDuration": "2s", "avroConfig": {"writeMetadata": true, "useTopicSchema": true}}),
        json!({"deadLetterPolicy": {"deadLetterTopic": topic("dead-letters"), "maxDeliveryAttempts": 5},
                           "retryPolicy": {"minimumBackoff": "1s", "maximumBackoff": "2s"}}),
    );
    let worker = sc.worker(&cfg, &["--topic-schema", schema.to_str().unwrap()]);
    let dead = sc
        .env
        .drain_until_some(&sub("dlq-sub"), Duration::from_secs(60));
    let took = published.elapsed();
    let (s, err) = terminate(worker, Duration::from_secs(15));
    assert_eq!(dead.len(), 1, "{err}");
    let d = &dead[0];
    assert_eq!(&d.data[..], br#"{"id":"not a number"}"#);
    let a = &d.attributes;
    assert_eq!(&a["i"], "2");
    assert_eq!(&a["CloudPubSubDeadLetterSourceDeliveryCount"], "5");
    assert_eq!(&a["CloudPubSubDeadLetterSourceSubscription"], "archive");
    assert_eq!(
        &a["CloudPubSubDeadLetterSourceSubscriptionProject"],
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
    let written: Vec<usize> = records(&sc.bucket)
        .iter()
        .flat_map(|(_, r)| r.iter().map(|x| x["id"].as_i64().unwrap() as usize))
        .collect();
    assert_eq!(
        written.iter().copied().collect::<HashSet<_>>(),
        HashSet::from([0, 1])
    );
    assert!(
        sc.drain_archive(Duration::from_secs(12)).is_empty(),
        "dead-lettered message was acked"
    );
}

#[test]
fn ordering_keys_keep_their_order_within_and_across_files() {
    let sc = Scenario::start(|s| s.enable_message_ordering = true);
    sc.env.publish(&topic("events"), &keyed_messages(1000, 30));
    let cfg = sc.config(
        json!({"maxMessages": "100", "maxDuration": "2s"}),
        json!({"enableMessageOrdering": true}),
    );
    let worker = sc.worker(&cfg, &[]);
    wait_for_all(&sc.bucket, 1000, Duration::from_secs(60));
    let (_, err) = terminate(worker, Duration::from_secs(15));
    // Objects in the order the worker opened them (its log lists them as they are written,
    // one at a time with ordering).
    let order: Vec<String> = err
        .lines()
        .filter(|l| l.contains("file written"))
        .filter_map(|l| {
            l.split("name=")
                .nth(1)
                .map(|s| s.split_whitespace().next().unwrap().to_string())
        })
        .collect();
    assert!(order.len() >= 10, "{err}");
    let mut last: HashMap<String, usize> = HashMap::new();
    for name in &order {
        let dump = fastavro_dump(&[sc.bucket.join(name)]);
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
    let sc = Scenario::start(|_| {});
    let n = 6000;
    let ids = sc.env.publish_n(n, 200);
    let cfg = sc.config(
        json!({"maxMessages": "250", "maxDuration": "2s"}),
        json!({}),
    );
    let a = sc.worker(&cfg, &["--max-outstanding-messages", "500"]);
    let b = sc.worker(&cfg, &["--max-outstanding-messages", "500"]);
    let recs = wait_for_all(&sc.bucket, n, Duration::from_secs(90));
    let (sa, _) = terminate(a, Duration::from_secs(15));
    let (sb, _) = terminate(b, Duration::from_secs(15));
    let (wa, wb) = (
        sa["messages_written"].as_u64().unwrap(),
        sb["messages_written"].as_u64().unwrap(),
    );
    assert!(wa > 0 && wb > 0, "both workers wrote: {wa} + {wb}");
    let names_a: HashSet<String> = summary_objects(&sa).into_iter().collect();
    let names_b: HashSet<String> = summary_objects(&sb).into_iter().collect();
    assert!(names_a.is_disjoint(&names_b), "object name collision");
    assert_eq!(
        objects(&sc.bucket).len(),
        names_a.len() + names_b.len(),
        "every object survives"
    );
    let got: HashSet<&str> = ids_of(&recs).into_iter().collect();
    assert_eq!(got, id_set(&ids), "nothing lost");
    assert_eq!(
        wa + wb,
        recs.iter().map(|(_, r)| r.len() as u64).sum::<u64>()
    );
}

/// The monotonic clock the recording proxy stamps its events with (`time.monotonic()`, one
/// clock for every process of the machine).
fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[test]
fn kill_9_at_random_moments_loses_nothing_and_duplicates_only_unacked_messages() {
    let sc = Scenario::leased();
    let n = 20_000;
    let ids = sc.env.publish_n(n, 100);
    let cfg = sc.config(
        json!({"maxMessages": "1000", "maxDuration": "2s"}),
        json!({}),
    );
    // What was acked is what reached Pub/Sub, as the recording proxy saw it — not what a worker
    // logged: a worker killed just after handing an ack to its connection may never get it out
    // (the kernel resets a connection that has unread data), so "acked" in its log proves
    // nothing about the server. Every ack the proxy logs reaches the emulator, also when the
    // worker behind it dies (see tests/py/pubsub_proxy.py).
    let proxy = sc.proxy(true);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    // Three kills that hit a run in progress. A worker that has acked everything it was handed
    // when the kill lands (it waits on the emulator's pace) is no crash test: that attempt is
    // reported and not counted, at most three times.
    let (mut crashes, mut idle) = (0, 0);
    for round in 1.. {
        if crashes == 3 {
            break;
        }
        assert!(idle < 3, "{idle} kills hit no run in progress");
        let started = monotonic();
        let mut w = sc.worker_via(&proxy, &cfg, &["--ack-lease", "10s"]);
        // Not a fixed delay: once the worker made progress (an ack reached the proxy), a random
        // moment up to 1 s later.
        wait_calls(
            &proxy,
            Duration::from_secs(120),
            "an ack of the worker",
            |c| c.acks.iter().any(|(t, _, _)| *t > started),
        );
        std::thread::sleep(Duration::from_millis(xorshift(&mut seed) % 1000));
        assert!(
            w.try_wait().unwrap().is_none(),
            "round {round}: the worker ended before the kill"
        );
        let killed = monotonic();
        kill_9(w);
        // The kill hit a run in progress: the worker had been handed messages it had not acked.
        let calls = proxy.calls();
        let acked_before: HashSet<&str> = calls
            .acks
            .iter()
            .filter(|(t, _, _)| *t < killed)
            .flat_map(|(_, ids, _)| ids.iter().map(String::as_str))
            .collect();
        let handed: HashSet<&str> = calls
            .deliveries_between(started, killed)
            .into_iter()
            .collect();
        let open = handed.difference(&acked_before).count();
        if open == 0 {
            eprintln!(
                "round {round}: the kill hit no run in progress ({} messages handed to the \
                 worker, all acked): not counted",
                handed.len()
            );
            idle += 1;
            continue;
        }
        crashes += 1;
        eprintln!(
            "round {round}: killed with {open} of {} messages handed to it not acked",
            handed.len()
        );
    }
    // The kills may not have hit a write: a dead writer's staging file makes sure the next
    // worker meets one.
    plant_dead_writers_staging(&sc.bucket);
    // Messages of killed workers come back after their 10 s lease; the last worker drains all.
    let w = sc.worker_via(&proxy, &cfg, &["--ack-lease", "10s"]);
    let recs = wait_for_all(&sc.bucket, n, Duration::from_secs(480));
    terminate(w, Duration::from_secs(20));
    // The killed workers' staging files were swept by the next worker; the last left none.
    assert_no_staging(&sc.bucket);
    // Every object is whole: fastavro read each one (records() above).
    let count = id_counts(&recs);
    let all: HashSet<&str> = count.keys().copied().collect();
    assert_eq!(all, id_set(&ids), "every message id is in the output");
    let holders = local_holders(&sc.bucket, &recs);
    let calls = proxy.calls();
    // Acks only after durable, across the kills too.
    assert_acks_follow_visibility(&calls, &holders);
    // A message is never written again once acked: every object holding it was visible already
    // when the proxy saw its first ack. Duplicates are of messages not acked when written.
    let mut first_ack: HashMap<&str, &HashSet<String>> = HashMap::new();
    for (_, acked, visible) in &calls.acks {
        for id in acked {
            first_ack
                .entry(id.as_str())
                .or_insert_with(|| visible.as_ref().expect("the proxy watches the bucket"));
        }
    }
    assert!(!first_ack.is_empty(), "no message acked");
    let mut duplicated = 0;
    for (id, objects) in &holders {
        // Never acked (written by a killed worker only, or by the last one after it stopped
        // acking): any number of copies is at least once.
        let Some(visible) = first_ack.get(id.as_str()) else {
            continue;
        };
        for o in objects {
            assert!(
                visible.contains(o),
                "message {id} was written again, into {o}, after it was acked"
            );
        }
        duplicated += usize::from(objects.len() > 1);
    }
    eprintln!(
        "{} messages acked; {duplicated} written more than once, each copy before its ack",
        first_ack.len()
    );
}

#[test]
fn draining_a_subscription_that_is_gone_fails_instead_of_finding_nothing() {
    // The tests' "nothing is redelivered" is `drain(..).is_empty()`: it must not also hold when
    // the subscription cannot be read at all.
    let sc = Scenario::start(|_| {});
    sc.env.publish_n(3, 10);
    let got = sc
        .env
        .try_drain(&sub("archive"), Duration::from_secs(3))
        .unwrap();
    assert_eq!(got.len(), 3, "the live subscription drains");
    sc.env
        .rt
        .block_on(sc.env.client.delete_subscription(&sub("archive")))
        .unwrap();
    let err = sc
        .env
        .try_drain(&sub("archive"), Duration::from_secs(5))
        .expect_err("a deleted subscription drained as empty");
    assert!(err.contains("source failed"), "{err}");
    let missing = sc
        .env
        .try_drain(&sub("never-made"), Duration::from_secs(5))
        .expect_err("a missing subscription drained as empty");
    assert!(missing.contains("source failed"), "{missing}");
}

/// A backlog of `n` messages of `size` bytes through a proxy that enforces flow control as
/// Pub/Sub does (the emulator does not), with the default batching (files of up to 5 minutes, no
/// message or byte limit) and `flags` setting the worker's limits: every message but at most
/// `rest` (the last open file's, below half a limit) is acked within a minute, and the files
/// finalized early carry the reason `flow_control` in the metric and in their log line. Before,
/// the open file held everything outstanding for 5 minutes and the server sent nothing more.
fn drains_under_flow_control(n: usize, size: usize, flags: &[&str], rest: usize) {
    let sc = Scenario::leased();
    let ids = sc.env.publish_n(n, size);
    let cfg = sc.config(json!({}), json!({}));
    let proxy =
        PubsubProxy::with_flow_control(&sc.env.emu.host(), &sc.dir.path().join("calls.log"));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = vec!["--metrics-addr", &addr];
    args.extend(flags);
    let started = Instant::now();
    let worker = sc.worker_via(&proxy, &cfg, &args);
    // Drained: all but `rest` acked, and every message delivered and taken in by the worker (a
    // SIGTERM before the last deliveries reach it leaves them to the server's redelivery, which
    // is right, but then they are not in the bucket: CI once stopped the worker that early).
    let calls = wait_calls(&proxy, Duration::from_secs(60), "drained", |c| {
        c.acked().len() + rest >= n && c.delivered().len() == n
    });
    let drained = started.elapsed();
    let received = || {
        util::http::metric(
            &format!("http://{addr}"),
            "subsink_messages_received",
            "subsink_messages_received_total",
            &json!({"subscription": sub("archive")}),
        )
        .unwrap_or(0.0) as usize
    };
    poll(Duration::from_secs(30), Duration::from_millis(200), || {
        let got = received();
        if got >= n {
            Ok(())
        } else {
            Err(format!(
                "the worker took in {got} of {n} messages delivered"
            ))
        }
    });
    eprintln!(
        "{n} messages of {size} B drained in {drained:?} through a flow-controlling proxy \
         ({} times a stream was held back, {} messages not acked yet)",
        calls.withheld.len(),
        n - calls.acked().len()
    );
    let early = util::http::metric(
        &format!("http://{addr}"),
        "subsink_files_finalized",
        "subsink_files_finalized_total",
        &json!({"subscription": sub("archive"), "reason": "flow_control"}),
    )
    .unwrap_or(0.0) as usize;
    assert!(early >= 2, "{early} files finalized for flow control");

    let (s, err) = terminate(worker, Duration::from_secs(30));
    assert_eq!(s["messages_nacked"], 0, "{err}");
    let recs = records(&sc.bucket);
    let counts = id_counts(&recs);
    assert_eq!(
        counts.keys().copied().collect::<HashSet<_>>(),
        id_set(&ids),
        "every message written"
    );
    assert!(counts.values().all(|&c| c == 1), "each once");
    let flow_lines = err
        .lines()
        .filter(|l| l.contains("file written") && l.contains("reason=\"flow_control\""))
        .count();
    assert_eq!(flow_lines, early, "{err}");
    // Everything acked once on the wire; the emulator redelivers nothing.
    let acked = proxy.calls().acked();
    assert_eq!(acked.len(), n);
    assert!(acked.values().all(|&c| c == 1));
}

/// Issue 27, point 1: `--max-outstanding-messages 2000` (1,000 per stream of two) against a
/// server that holds to it: 10,000 messages drain within a minute with 5-minute files.
#[test]
fn flow_control_in_messages_never_starves_the_files() {
    drains_under_flow_control(10_000, 100, &["--max-outstanding-messages", "2000"], 1_000);
}

/// The same for the bytes: `--max-outstanding-bytes 1MiB` holds about 1,000 messages of 1 KiB
/// (the message limit, 10,000, is never reached); the last open file keeps less than 512 KiB.
#[test]
fn flow_control_in_bytes_never_starves_the_files() {
    drains_under_flow_control(5_000, 1024, &["--max-outstanding-bytes", "1MiB"], 520);
}

/// The witness of the two tests above: the proxy holds a subscriber to the flow control it asks
/// for, as Pub/Sub does and the emulator does not. A stream asking for 100 messages outstanding
/// gets 100 and no more until it acks; acks and nacks each make room for as many.
#[test]
fn the_flow_control_proxy_withholds_what_is_past_the_limit() {
    use subsink::pubsub::PubsubClient;
    use subsink::source::pubsub::{PubsubSettings, PubsubSource};
    use subsink::source::{Source, SourceEvent};

    let sc = Scenario::leased();
    sc.env.publish_n(1_000, 10);
    let proxy =
        PubsubProxy::with_flow_control(&sc.env.emu.host(), &sc.dir.path().join("calls.log"));
    sc.env.rt.block_on(async {
        let client = PubsubClient::connect_emulator(&proxy.host()).await.unwrap();
        let mut s = PubsubSettings::new(sub("archive"));
        s.max_outstanding_messages = 100;
        let mut src = PubsubSource::start(client.clone(), s).unwrap();
        // Everything a stream hands out until it has been quiet for 2 s.
        async fn quiet(src: &mut PubsubSource) -> Vec<String> {
            let mut acks = Vec::new();
            while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(2), src.next()).await
            {
                if let SourceEvent::Messages(batch) = ev {
                    acks.extend(batch.into_iter().filter_map(|r| r.receipt.ack_id));
                }
            }
            acks
        }
        let first = quiet(&mut src).await;
        assert_eq!(first.len(), 100, "the limit, no more");
        client.ack(&sub("archive"), &first[..30]).await.unwrap();
        client
            .modify_ack_deadline(&sub("archive"), &first[30..50], 0)
            .await
            .unwrap();
        let second = quiet(&mut src).await;
        assert_eq!(second.len(), 50, "as many as were acked and nacked");
        src.stop();
    });
    assert!(!proxy.calls().withheld.is_empty());
}
