//! The Pub/Sub client layer against Google's real emulator (no mocks): publish, StreamingPull,
//! ack, nack, deadline extension, flow control, dead-letter counting and reconnection.
//!
//! Every test starts its own emulator on its own port. What the emulator was seen to do is
//! written beside each assertion.

mod util;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use subsink::message::{Message, Received};
use subsink::pubsub::{PubsubClient, SubscriptionSpec};
use subsink::source::pubsub::{PubsubSettings, PubsubSource};
use subsink::source::{Source, SourceEvent};
use util::emulator::Emulator;

const PROJECT: &str = "projects/subsink-test";

fn topic(name: &str) -> String {
    format!("{PROJECT}/topics/{name}")
}

fn sub(name: &str) -> String {
    format!("{PROJECT}/subscriptions/{name}")
}

async fn emulator() -> (Emulator, PubsubClient) {
    let emu = tokio::task::spawn_blocking(Emulator::start).await.unwrap();
    let client = PubsubClient::connect_emulator(&emu.host()).await.unwrap();
    (emu, client)
}

/// Create the `events` topic and the subscription `sub` on it.
async fn events_sub(client: &PubsubClient) {
    client.create_topic(&topic("events")).await.unwrap();
    client
        .create_subscription(&SubscriptionSpec::new(sub("sub"), topic("events")))
        .await
        .unwrap();
}

/// Publish `msgs` to the `events` topic; their ids.
async fn publish(client: &PubsubClient, msgs: &[Message]) -> Vec<String> {
    client.publish(&topic("events"), msgs).await.unwrap()
}

fn message(i: usize) -> Message {
    Message {
        data: bytes::Bytes::from(format!("payload-{i}")),
        attributes: [("i".to_string(), i.to_string())].into(),
        ..Default::default()
    }
}

fn ack_ids(batch: &[Received]) -> Vec<String> {
    batch
        .iter()
        .map(|r| r.receipt.ack_id.clone().unwrap())
        .collect()
}

/// Every message the source hands out within `window`.
async fn receive_for(src: &mut PubsubSource, window: Duration) -> Vec<Received> {
    let until = tokio::time::Instant::now() + window;
    let mut out = Vec::new();
    while let Ok(ev) = tokio::time::timeout_at(until, src.next()).await {
        match ev {
            Some(SourceEvent::Messages(m)) => out.extend(m),
            Some(other) => panic!("unexpected event {other:?}"),
            None => break,
        }
    }
    out
}

/// The next batch, within `limit`.
async fn next_batch(src: &mut PubsubSource, limit: Duration) -> Vec<Received> {
    match tokio::time::timeout(limit, src.next()).await {
        Ok(Some(SourceEvent::Messages(m))) => m,
        Ok(other) => panic!("unexpected event {other:?}"),
        Err(_) => panic!("no message within {limit:?}"),
    }
}

fn settings(subscription: &str, ack_deadline_s: u64) -> PubsubSettings {
    let mut s = PubsubSettings::new(subscription);
    s.stream_ack_deadline = Duration::from_secs(ack_deadline_s);
    s
}

#[tokio::test]
async fn publish_1000_and_receive_each_exactly_once_when_acked() {
    let (_emu, client) = emulator().await;
    events_sub(&client).await;

    let messages: Vec<Message> = (0..1000).map(message).collect();
    let ids = publish(&client, &messages).await;
    assert_eq!(ids.len(), 1000);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 1000);
    let index_of: HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();

    let mut src = PubsubSource::start(client.clone(), settings(&sub("sub"), 10)).unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let start = Instant::now();
    while seen.len() < 1000 {
        let batch = next_batch(&mut src, Duration::from_secs(20)).await;
        client.ack(&sub("sub"), &ack_ids(&batch)).await.unwrap();
        for r in batch {
            let i = index_of[r.msg.message_id.as_str()];
            assert_eq!(r.msg.data, messages[i].data);
            assert_eq!(r.msg.attributes, messages[i].attributes);
            assert!(r.msg.publish_time_micros > 1_600_000_000_000_000);
            assert_eq!(r.receipt.delivery_attempt, None, "no dead-letter policy");
            *seen.entry(r.msg.message_id).or_default() += 1;
        }
    }
    let first_pass = start.elapsed();
    assert!(
        seen.values().all(|&n| n == 1),
        "a message came twice before all were acked"
    );

    // Acked: nothing comes back within twice the (stream) ack deadline.
    let late = receive_for(&mut src, Duration::from_secs(20)).await;
    let late_ids: Vec<&str> = late.iter().map(|r| r.msg.message_id.as_str()).collect();
    assert!(late.is_empty(), "redelivered after ack: {late_ids:?}");
    assert_eq!(src.messages_received(), 1000);
    assert_eq!(src.reconnects(), 0);
    eprintln!("1000 messages received and acked in {first_pass:?}; none redelivered in 20 s");
    src.stop();
    assert!(src.next().await.is_none());
}

#[tokio::test]
async fn nack_redelivers_and_counts_delivery_attempts_up_to_dead_letter() {
    let (_emu, client) = emulator().await;
    client.create_topic(&topic("events")).await.unwrap();
    client.create_topic(&topic("dead")).await.unwrap();
    client
        .create_subscription(&SubscriptionSpec::new(sub("dead-sub"), topic("dead")))
        .await
        .unwrap();
    let mut with_dlq = SubscriptionSpec::new(sub("dlq"), topic("events"));
    with_dlq.dead_letter = Some((topic("dead"), 5));
    client.create_subscription(&with_dlq).await.unwrap();
    client
        .create_subscription(&SubscriptionSpec::new(sub("plain"), topic("events")))
        .await
        .unwrap();
    let ids = publish(&client, &[message(7)]).await;

    // With a dead-letter policy: attempts 1..=5, each nack redelivers at once, then the message
    // moves to the dead-letter topic.
    let mut src = PubsubSource::start(client.clone(), settings(&sub("dlq"), 60)).unwrap();
    let mut attempts = Vec::new();
    let mut delays = Vec::new();
    for _ in 0..5 {
        let nacked = Instant::now();
        let batch = next_batch(&mut src, Duration::from_secs(20)).await;
        delays.push(nacked.elapsed());
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].msg.message_id, ids[0]);
        attempts.push(batch[0].receipt.delivery_attempt);
        client
            .modify_ack_deadline(&sub("dlq"), &ack_ids(&batch), 0)
            .await
            .unwrap();
    }
    assert_eq!(attempts, [Some(1), Some(2), Some(3), Some(4), Some(5)]);
    eprintln!("nack → redelivery delays (no retry policy): {delays:?}");
    let after = receive_for(&mut src, Duration::from_secs(3)).await;
    assert!(
        after.is_empty(),
        "delivered again after max attempts: {after:?}"
    );
    src.stop();

    let mut dead = PubsubSource::start(client.clone(), settings(&sub("dead-sub"), 60)).unwrap();
    let forwarded = next_batch(&mut dead, Duration::from_secs(20)).await;
    assert_eq!(forwarded.len(), 1);
    let f = &forwarded[0];
    assert_eq!(f.msg.data, message(7).data);
    assert_eq!(&f.msg.attributes["i"], "7");
    eprintln!(
        "dead-lettered: id {} (source id {}), attributes {:?}",
        f.msg.message_id, ids[0], f.msg.attributes
    );
    assert_eq!(
        f.msg
            .attributes
            .get("CloudPubSubDeadLetterSourceDeliveryCount"),
        Some("5")
    );
    client
        .ack(&sub("dead-sub"), &ack_ids(&forwarded))
        .await
        .unwrap();

    // Without a dead-letter policy the server does not count: deliveryAttempt is absent.
    let mut plain = PubsubSource::start(client.clone(), settings(&sub("plain"), 60)).unwrap();
    let first = next_batch(&mut plain, Duration::from_secs(20)).await;
    assert_eq!(first[0].receipt.delivery_attempt, None);
    client
        .modify_ack_deadline(&sub("plain"), &ack_ids(&first), 0)
        .await
        .unwrap();
    let again = next_batch(&mut plain, Duration::from_secs(20)).await;
    assert_eq!(again[0].msg.message_id, ids[0]);
    assert_eq!(again[0].receipt.delivery_attempt, None);
    client.ack(&sub("plain"), &ack_ids(&again)).await.unwrap();
}

#[tokio::test]
async fn retry_policy_delays_redelivery_after_nack() {
    let (_emu, client) = emulator().await;
    client.create_topic(&topic("events")).await.unwrap();
    let mut spec = SubscriptionSpec::new(sub("sub"), topic("events"));
    spec.retry = Some((Duration::from_secs(2), Duration::from_secs(4)));
    client.create_subscription(&spec).await.unwrap();
    publish(&client, &[message(1)]).await;

    let mut src = PubsubSource::start(client.clone(), settings(&sub("sub"), 60)).unwrap();
    let mut batch = next_batch(&mut src, Duration::from_secs(20)).await;
    let mut delays = Vec::new();
    for _ in 0..3 {
        client
            .modify_ack_deadline(&sub("sub"), &ack_ids(&batch), 0)
            .await
            .unwrap();
        let nacked = Instant::now();
        batch = next_batch(&mut src, Duration::from_secs(20)).await;
        delays.push(nacked.elapsed());
    }
    client.ack(&sub("sub"), &ack_ids(&batch)).await.unwrap();
    eprintln!("nack → redelivery delays with retry policy 2 s..4 s: {delays:?}");
    // The emulator redelivers after the first nack at once (~40 ms, as without a policy), then
    // applies the policy: no redelivery before the minimum, none much after the maximum (seen:
    // 2.8–3.9 s, then ~4.0 s).
    assert!(delays[0] < Duration::from_millis(1800), "{delays:?}");
    for d in &delays[1..] {
        assert!(*d >= Duration::from_millis(1800), "{delays:?}");
        assert!(*d <= Duration::from_secs(6), "{delays:?}");
    }
}

/// Flow control is the server's job: `max_outstanding_messages` / `max_outstanding_bytes` travel in
/// the first StreamingPullRequest (unit-tested in `src/source/pubsub.rs`). The emulator (0.8.20)
/// ignores both — its classes never read them, and it delivers the whole backlog at once — so on
/// the emulator only the client's own bound holds: the pull task stops reading the stream once
/// `CHANNEL_CAPACITY` (16) batches wait for `next()` (the emulator merges publishes into
/// responses of up to ~100 messages, so that is ~1700 messages here). This test pins both facts, so a newer
/// emulator that starts honouring flow control shows up here.
#[tokio::test]
async fn flow_control_settings_and_the_client_side_bound() {
    let (_emu, client) = emulator().await;
    events_sub(&client).await;
    let mut s = settings(&sub("sub"), 60);
    s.max_outstanding_messages = 50;
    s.max_outstanding_bytes = 10_000;
    let mut src = PubsubSource::start(client.clone(), s).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await; // the stream is open

    // 40 publishes of 50: the emulator pushes each to the open stream as its own response.
    for chunk in 0..40 {
        let batch: Vec<Message> = (chunk * 50..chunk * 50 + 50).map(message).collect();
        publish(&client, &batch).await;
    }
    // Nobody calls next(): the task reads 16 batches into the channel, holds one more, stops.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let read_undrained = src.messages_received();
    tokio::time::sleep(Duration::from_secs(1)).await;
    eprintln!("not draining: the pull task read {read_undrained} of 2000 messages and stopped");
    assert!((50..2000).contains(&read_undrained), "{read_undrained}");
    assert_eq!(src.messages_received(), read_undrained, "still reading");

    // Draining without a single ack: a server honouring max_outstanding_messages = 50 would stop
    // near 50; the emulator delivers all 2000.
    let all = receive_for(&mut src, Duration::from_secs(4)).await;
    eprintln!(
        "max_outstanding_messages = 50, max_outstanding_bytes = 10000, no acks: {} delivered",
        all.len()
    );
    assert_eq!(
        all.len(),
        2000,
        "the emulator now applies flow control: assert the cap here"
    );
}

#[tokio::test]
async fn modack_extension_keeps_a_message_past_its_deadline() {
    let (_emu, client) = emulator().await;
    events_sub(&client).await;
    let ids = publish(&client, &[message(0), message(1)]).await;
    let (kept, left) = (ids[0].clone(), ids[1].clone());

    let mut src = PubsubSource::start(client.clone(), settings(&sub("sub"), 10)).unwrap();
    let mut first: Vec<Received> = Vec::new();
    while first.len() < 2 {
        first.extend(next_batch(&mut src, Duration::from_secs(20)).await);
    }
    let delivered = Instant::now();
    let kept_ack = first
        .iter()
        .find(|r| r.msg.message_id == kept)
        .map(|r| r.receipt.ack_id.clone().unwrap())
        .unwrap();

    // Extend `kept` by 10 s every 3 s for 25 s; leave `left` to expire (10 s).
    let mut redelivered: Vec<(String, Duration)> = Vec::new();
    while delivered.elapsed() < Duration::from_secs(25) {
        client
            .modify_ack_deadline(&sub("sub"), std::slice::from_ref(&kept_ack), 10)
            .await
            .unwrap();
        for r in receive_for(&mut src, Duration::from_secs(3)).await {
            redelivered.push((r.msg.message_id.clone(), delivered.elapsed()));
            if r.msg.message_id == left {
                client.ack(&sub("sub"), &ack_ids(&[r])).await.unwrap();
            }
        }
    }
    eprintln!("redeliveries while extending {kept}: {redelivered:?}");
    assert!(
        redelivered.iter().all(|(id, _)| *id != kept),
        "the extended message came back: {redelivered:?}"
    );
    let left_back: Vec<Duration> = redelivered
        .iter()
        .filter(|(id, _)| *id == left)
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(left_back.len(), 1, "{redelivered:?}");
    assert!(left_back[0] >= Duration::from_secs(9), "{left_back:?}");
    client.ack(&sub("sub"), &[kept_ack]).await.unwrap();
}

/// A TCP proxy between the client and the emulator that can cut every connection and refuse new
/// ones, so a test decides when the client may reach the server.
struct Proxy {
    port: u16,
    refusing: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let refusing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Default::default();
        let (r, c) = (refusing.clone(), conns.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if r.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(inbound); // refused: the client's handshake fails
                    continue;
                }
                let upstream = upstream.clone();
                c.lock().unwrap().push(tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                }));
            }
        });
        Proxy {
            port,
            refusing,
            conns,
        }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Refuse (or again accept) new connections; open ones are left alone.
    fn refuse(&self, on: bool) {
        self.refusing.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Close every open connection.
    fn cut(&self) {
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

/// The emulator dies under an open stream and comes back, empty, on the same port: the source
/// reconnects with backoff and pulls again. (A proxy holds the source off until the subscription
/// exists again; otherwise its first stream would get NOT_FOUND, which is final.)
///
/// Not done through a network cut alone: the emulator does not notice a client connection that
/// closes under a stream — its pusher for the dead stream keeps taking messages, which then come
/// back only after their ack deadline (seen: 10 and 20 s delays with a 10 s deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulling_resumes_after_the_emulator_restarts() {
    let (mut emu, admin) = emulator().await;
    events_sub(&admin).await;
    let proxy = Proxy::start(emu.host()).await;
    let client = PubsubClient::connect_emulator(&proxy.host()).await.unwrap();
    let mut src = PubsubSource::start(client.clone(), settings(&sub("sub"), 10)).unwrap();

    let first = publish(&admin, &[message(1)]).await;
    let before = next_batch(&mut src, Duration::from_secs(20)).await;
    assert_eq!(before[0].msg.message_id, first[0]);
    client.ack(&sub("sub"), &ack_ids(&before)).await.unwrap();
    assert_eq!(src.reconnects(), 0);

    // The server dies under the open stream; attempts fail and back off 100, 200, 400, ... ms.
    proxy.refuse(true);
    tokio::task::block_in_place(|| emu.kill());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let while_down = src.reconnects();
    assert!(while_down >= 3, "reconnects while down: {while_down}");

    // Back, empty: recreate the topic and subscription, then let the source in.
    tokio::task::block_in_place(|| emu.restart());
    let admin = PubsubClient::connect_emulator(&emu.host()).await.unwrap();
    events_sub(&admin).await;
    proxy.refuse(false);
    let published = Instant::now();
    let ids = publish(&admin, &(2..12).map(message).collect::<Vec<_>>()).await;
    let mut got = HashSet::new();
    while got.len() < ids.len() {
        let batch = next_batch(&mut src, Duration::from_secs(20)).await;
        client.ack(&sub("sub"), &ack_ids(&batch)).await.unwrap();
        got.extend(batch.into_iter().map(|r| r.msg.message_id));
    }
    let reconnects = src.reconnects();
    eprintln!(
        "{while_down} reconnects in 1.5 s of the server being down, {reconnects} in all; the 10 \
         messages published after it came back arrived in {:?}",
        published.elapsed()
    );
    assert_eq!(got, ids.into_iter().collect::<HashSet<_>>());
    // The backoff is capped and reset once a stream is healthy: a few more attempts at most.
    assert!(reconnects <= while_down + 4, "{reconnects}");

    // A stream that cannot come back: the subscription is gone → NOT_FOUND, not retryable, so
    // the source reports Failed and ends.
    admin.delete_subscription(&sub("sub")).await.unwrap();
    proxy.cut();
    let ev = tokio::time::timeout(Duration::from_secs(30), src.next())
        .await
        .expect("the source should fail");
    match ev {
        Some(SourceEvent::Failed(e)) => assert!(e.contains("NotFound"), "{e}"),
        other => panic!("expected Failed, got {other:?}"),
    }
    assert!(src.next().await.is_none());
}

/// `stop()` ends the stream cleanly (it half-closes the stream and reads it to its end): batches
/// already received still come out, then `None`; the emulator retires the old stream, so a new
/// source on the same subscription gets every new message at once (none is lost to the old
/// stream until its deadline, as happened when the old stream was merely dropped).
#[tokio::test]
async fn stop_drains_then_ends_and_a_new_source_takes_over() {
    let (_emu, client) = emulator().await;
    events_sub(&client).await;
    let ids = publish(&client, &(0..20).map(message).collect::<Vec<_>>()).await;
    let mut src = PubsubSource::start(client.clone(), settings(&sub("sub"), 10)).unwrap();
    let mut got = Vec::new();
    while got.len() < 20 {
        got.extend(next_batch(&mut src, Duration::from_secs(20)).await);
    }
    client.ack(&sub("sub"), &ack_ids(&got)).await.unwrap();
    let handle = src.stop_handle();
    let stopping = Instant::now();
    handle.stop();
    let rest = tokio::time::timeout(Duration::from_secs(5), async {
        let mut n = 0;
        while let Some(ev) = src.next().await {
            if let SourceEvent::Messages(m) = ev {
                n += m.len();
            }
        }
        n
    })
    .await
    .expect("next() returns None after stop");
    let stopped_in = stopping.elapsed();
    assert_eq!(rest, 0);
    // The emulator finishes a half-closed stream within its 50 ms push loop: well before the
    // 5 s grace after which the stream would be cancelled.
    assert!(stopped_in < Duration::from_secs(2), "{stopped_in:?}");
    drop(src);

    let mut next = PubsubSource::start(client.clone(), settings(&sub("sub"), 10)).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let more = publish(&client, &(20..60).map(message).collect::<Vec<_>>()).await;
    let published = Instant::now();
    let mut seen = HashSet::new();
    while seen.len() < more.len() {
        let batch = next_batch(&mut next, Duration::from_secs(20)).await;
        client.ack(&sub("sub"), &ack_ids(&batch)).await.unwrap();
        seen.extend(batch.into_iter().map(|r| r.msg.message_id));
    }
    eprintln!(
        "stop() ended the stream in {stopped_in:?}; a new source got 40 new messages in {:?}",
        published.elapsed()
    );
    assert!(published.elapsed() < Duration::from_secs(5));
    assert!(seen.iter().all(|id| !ids.contains(id)));
}

#[tokio::test]
async fn ordering_keys_keep_per_key_order() {
    let (_emu, client) = emulator().await;
    client.create_topic(&topic("events")).await.unwrap();
    let mut spec = SubscriptionSpec::new(sub("sub"), topic("events"));
    spec.enable_message_ordering = true;
    client.create_subscription(&spec).await.unwrap();
    let messages: Vec<Message> = (0..300)
        .map(|i| Message {
            ordering_key: format!("key-{}", i % 3),
            ..message(i)
        })
        .collect();
    let ids = publish(&client, &messages).await;
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 300);

    let mut src = PubsubSource::start(client.clone(), settings(&sub("sub"), 60)).unwrap();
    let mut order: HashMap<String, Vec<usize>> = HashMap::new();
    let mut n = 0;
    while n < 300 {
        let batch = next_batch(&mut src, Duration::from_secs(20)).await;
        client.ack(&sub("sub"), &ack_ids(&batch)).await.unwrap();
        for r in batch {
            let i: usize = r.msg.attributes["i"].parse().unwrap();
            assert_eq!(r.msg.ordering_key, format!("key-{}", i % 3));
            order.entry(r.msg.ordering_key).or_default().push(i);
            n += 1;
        }
    }
    for (key, seq) in &order {
        assert!(seq.windows(2).all(|w| w[0] < w[1]), "{key}: {seq:?}");
        assert_eq!(seq.len(), 100);
    }
}

/// Payloads near the limits: `publish` splits them into requests of at most 9 MB, and the
/// source accepts StreamingPull responses far above tonic's 4 MiB default (the emulator put three
/// 3 MB messages, 9 MB, in one response).
#[tokio::test]
async fn large_messages_are_split_on_publish_and_received_whole() {
    let (_emu, client) = emulator().await;
    events_sub(&client).await;
    let messages: Vec<Message> = (0..4u8)
        .map(|i| Message {
            data: bytes::Bytes::from(vec![b'a' + i; 3_000_000]),
            ..message(usize::from(i))
        })
        .collect();
    let ids = publish(&client, &messages).await;
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 4);

    let mut src = PubsubSource::start(client.clone(), settings(&sub("sub"), 60)).unwrap();
    let mut got = HashMap::new();
    while got.len() < 4 {
        let batch = next_batch(&mut src, Duration::from_secs(20)).await;
        client.ack(&sub("sub"), &ack_ids(&batch)).await.unwrap();
        got.extend(batch.into_iter().map(|r| (r.msg.message_id.clone(), r.msg)));
    }
    for (id, m) in ids.iter().zip(&messages) {
        assert_eq!(got[id].data, m.data);
    }
}

/// Acks through the source's [`Acker`](subsink::pubsub::Acker): on an open stream — any
/// of several — while one is open, by unary calls once the source stopped; either way the
/// messages are settled (nothing comes back past the 10 s deadline). Two streams deliver in
/// parallel: the emulator paces each (one response of at most 100 messages every 50 ms).
#[tokio::test]
async fn acks_go_on_any_open_stream_and_by_unary_calls_once_stopped() {
    let (_emu, client) = emulator().await;
    events_sub(&client).await;
    let ids = publish(&client, &(0..3000).map(message).collect::<Vec<_>>()).await;

    let mut s = settings(&sub("sub"), 10);
    s.streams = 2;
    let mut src = PubsubSource::start(client.clone(), s).unwrap();
    let acker = src.acker();
    let mut seen: HashSet<String> = HashSet::new();
    let mut held: Vec<String> = Vec::new();
    while seen.len() < ids.len() {
        let batch = next_batch(&mut src, Duration::from_secs(20)).await;
        seen.extend(batch.iter().map(|r| r.msg.message_id.clone()));
        if seen.len() < ids.len() {
            acker.ack(ack_ids(&batch)).await.unwrap();
        } else {
            held = ack_ids(&batch); // acked after the stop
        }
    }
    assert_eq!(src.streams_opened(), 2, "both streams delivered");
    let (on_stream, by_call) = src.settled();
    assert_eq!(
        (on_stream, by_call),
        (3000 - held.len() as u64, 0),
        "every ack so far went on a stream"
    );

    src.stop();
    let rest = receive_for(&mut src, Duration::from_secs(10)).await;
    assert!(rest.is_empty(), "nothing more to deliver: {}", rest.len());
    acker.ack(held.clone()).await.unwrap();
    assert_eq!(
        src.settled(),
        (on_stream, held.len() as u64),
        "no stream: by a unary call"
    );

    // Settled, both ways: nothing comes back past the deadline.
    let mut again = PubsubSource::start(client.clone(), settings(&sub("sub"), 10)).unwrap();
    let late = receive_for(&mut again, Duration::from_secs(15)).await;
    assert!(
        late.is_empty(),
        "{} messages redelivered after their acks",
        late.len()
    );
    again.stop();
}

/// With a memory budget, a source whose batches are not taken stops reading its stream once it
/// holds the budget's input cap: the emulator ignores flow control, so without the gate the pull
/// task would read on until `CHANNEL_CAPACITY` (16) responses wait, whatever their size. Messages
/// of 1 MiB are published one at a time after the stream is open (the emulator sends one response
/// per 50 ms with what has arrived), so each response holds one. The budget: 16 MiB, input cap 4
/// MiB. Then everything is taken, each message once, and the charges are released.
#[tokio::test]
async fn a_source_not_taken_from_stops_reading_at_the_memory_budget() {
    let (_emu, client) = emulator().await;
    events_sub(&client).await;
    let resources = subsink::resources::Resources::new(1, Some(16 << 20));
    let gate = resources.input_gate();
    let mut s = settings(&sub("sub"), 60);
    s.max_outstanding_bytes = 0;
    let mut src = PubsubSource::start_gated(client.clone(), s, Some(gate)).unwrap();
    const MIB: usize = 1 << 20;
    const COUNT: usize = 24;
    let big = |i: usize| Message {
        data: bytes::Bytes::from(vec![i as u8; MIB]),
        ..Default::default()
    };
    // The stream is open (the emulator answers it with its first message): take that one.
    publish(&client, &[big(0)]).await;
    let first = next_batch(&mut src, Duration::from_secs(20)).await;
    assert_eq!(first.len(), 1);
    for i in 1..COUNT {
        publish(&client, &[big(i)]).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Held: the batch handed out (1 MiB) and what waits in the channel. The gate lets the task
    // read while the sources hold under 4 MiB, so it stops at 4–5 MiB (one response past it).
    let received = src.messages_received() as usize;
    let used = resources.memory_used();
    eprintln!("not taken: {received} of {COUNT} received, {used} bytes held");
    assert!(
        (4..=6).contains(&received),
        "received {received} of {COUNT} while nothing was taken"
    );
    assert!(used <= 5 * MIB as u64 + 4096, "held {used} bytes");
    // Taken: the rest comes, each once, and nothing stays charged.
    let mut seen: Vec<u8> = first.iter().map(|r| r.msg.data[0]).collect();
    client.ack(&sub("sub"), &ack_ids(&first)).await.unwrap();
    while seen.len() < COUNT {
        let batch = next_batch(&mut src, Duration::from_secs(20)).await;
        client.ack(&sub("sub"), &ack_ids(&batch)).await.unwrap();
        seen.extend(batch.iter().map(|r| r.msg.data[0]));
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..COUNT as u8).collect::<Vec<_>>());
    drop(src);
    assert_eq!(resources.memory_used(), 0);
}
