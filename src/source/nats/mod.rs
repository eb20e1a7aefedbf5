//! NATS JetStream: a durable pull consumer as a source (`--source nats://HOST:PORT`).
//!
//! ## The consumer
//! [`connect`] looks up the durable consumer `--nats-consumer` on the stream `--nats-stream` and
//! creates it when it is absent, with the subscription's delivery settings:
//!
//! | consumer setting | from |
//! |---|---|
//! | `AckPolicy` | `explicit` (a message is acked only after the file holding it is durable) |
//! | `AckWait` | `ackDeadlineSeconds` |
//! | `MaxDeliver` | `deadLetterPolicy.maxDeliveryAttempts` (5 with `--nats-dead-letter-subject` and no policy; unlimited without a dead-letter subject) |
//! | `MaxAckPending` | `--max-outstanding-messages` (the flow control: messages delivered and not yet settled; see [`crate::flow`]) |
//! | `DeliverPolicy` | `all` |
//!
//! An existing consumer is used as it is (its settings are the operator's; a difference is
//! logged), but one whose ack policy is not `explicit` is refused: it would settle messages
//! before they are durable.
//!
//! ## A JetStream message as a Pub/Sub message
//! | Pub/Sub | JetStream |
//! |---|---|
//! | `data` | the payload |
//! | `attributes` | the headers, except JetStream's own `Nats-*` ones; a header with several values becomes one attribute, its values joined with `", "`; plus `nats.subject` = the subject the message was published to |
//! | `messageId` | the `Nats-Msg-Id` header, else the stream sequence (decimal) |
//! | `publishTime` | the time the stream stored the message |
//! | `orderingKey` | empty |
//! | delivery attempt | the consumer's delivery count |
//!
//! The ack id of a message is its reply subject (`$JS.ACK.…`): the settle side
//! ([`crate::source::nats::settle`]) acks, naks and extends by publishing to it.
//!
//! ## Pulling and stopping
//! One task pulls batches (`PULL_BATCH` messages, or what arrives within `PULL_EXPIRES`) and hands
//! them out as they arrive; at most `CHANNEL_CAPACITY` chunks wait for [`Source::next`]. A failed
//! pull (connection lost, server restarting) is retried after a backoff of 100 ms doubling to
//! 10 s; the client reconnects by itself. [`NatsSource::stop`] lets the current pull finish —
//! every message the server already sent is handed out — and then ends the source.
//!
//! ## Memory
//! Within a memory budget ([`NatsSource::start_gated`], `--memory-limit`) every chunk is charged
//! to it ([`Charge`]) from the moment it is handed to the channel until the pipeline has taken it
//! (the next [`Source::next`]), and a pull is asked for only while the budget has room for input
//! ([`InputGate::admit`]) and by bytes as well as messages: its `max_bytes` is the room left under
//! the sources' cap ([`InputGate::room`]; at least `PULL_MIN_BYTES`). So what the source holds,
//! counted and in the client's subscription buffer, stays under the input cap, whatever
//! `MaxAckPending` allows. A message larger than that room is refused by the server for that pull
//! (`409 Message Size Exceeds MaxBytes`; it keeps the message); once the pipeline has taken every
//! chunk the source handed out, the next pull asks for that one message alone, up to the server's
//! `max_payload`: as the file source, the source may always take one message of any size when it
//! holds nothing else, so it holds at most the cap or one message.
//!
//! ## Connected (readiness)
//! The source counts as connected ([`Source::connected`]) while the client is connected to the
//! server and the last pull request was accepted — from the start on, since [`connect`] has just
//! found the consumer, whether or not any message comes: an idle consumer is ready.

pub mod build;
pub mod flags;
pub mod settle;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::{self, Context};
use futures::StreamExt;
use tokio::sync::{mpsc, Notify};

use crate::config::DeliverySettings;
use crate::flow::FlowLimit;
use crate::input::{Source, SourceEvent};
use crate::message::{Message, Receipt, Received};
use crate::resources::{held_bytes, Charge, InputGate, Resources};

/// The NATS source's flags that do not go together (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum NatsFlagsError {
    #[error("--nats-stream, --nats-consumer and --nats-dead-letter-subject need --source nats://HOST:PORT")]
    WithoutNats,
    #[error("--source nats://…: give --nats-stream STREAM and --nats-consumer NAME")]
    NeedsStreamAndConsumer,
    /// `topic`: the policy's dead-letter topic.
    #[error("the subscription's deadLetterPolicy (topic {topic}) needs a NATS subject: give --nats-dead-letter-subject SUBJECT")]
    DeadLetterPolicyWithoutSubject { topic: String },
    #[error("--dead-letter is for the file source; a NATS source dead-letters to --nats-dead-letter-subject")]
    DeadLetterFile,
}

/// Attribute holding the subject a message was published to.
pub const SUBJECT_ATTRIBUTE: &str = "nats.subject";
/// JetStream's message de-duplication header; it becomes the message id.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// `maxDeliveryAttempts` when a dead-letter subject is given without a dead-letter policy
/// (Pub/Sub's default).
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: u32 = 5;

/// Messages asked for by one pull request.
const PULL_BATCH: usize = 1000;
/// How long one pull request waits for messages. Short, because a stop waits for the current
/// pull to end (so that nothing the server sent is left unread).
const PULL_EXPIRES: Duration = Duration::from_secs(1);
/// Messages handed out at once.
const CHUNK: usize = 500;
/// Chunks waiting for [`Source::next`].
const CHANNEL_CAPACITY: usize = 16;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// What the NATS source needs (flags of `subsink run`).
#[derive(Debug, Clone)]
pub struct NatsSettings {
    /// `nats://HOST:PORT` (or `tls://`, with `user:password@` or a token if the server wants one).
    pub url: String,
    pub stream: String,
    pub consumer: String,
    /// Where messages go after their last allowed delivery failed (`--nats-dead-letter-subject`).
    pub dead_letter_subject: Option<String>,
    /// `MaxAckPending` of a consumer created here.
    pub max_ack_pending: i64,
}

impl NatsSettings {
    pub fn new(url: &str, stream: &str, consumer: &str) -> NatsSettings {
        NatsSettings {
            url: url.to_string(),
            stream: stream.to_string(),
            consumer: consumer.to_string(),
            dead_letter_subject: None,
            max_ack_pending: 10_000,
        }
    }
}

/// Why the NATS source could not start.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    #[error("NATS {url}: cannot connect: {message}")]
    Connect { url: String, message: String },
    #[error("NATS stream {stream:?}: {message}")]
    Stream { stream: String, message: String },
    #[error("NATS consumer {consumer:?} of stream {stream:?}: {message}")]
    Consumer {
        stream: String,
        consumer: String,
        message: String,
    },
    /// An existing consumer whose ack policy is not explicit.
    #[error("NATS consumer {consumer:?} of stream {stream:?}: its ack policy is {policy}; subsink needs explicit acks (a message is acked only after it is durable)")]
    NotExplicitAcks {
        stream: String,
        consumer: String,
        policy: String,
    },
    #[error("--nats-dead-letter-subject {subject:?}: {message}")]
    DeadLetter { subject: String, message: String },
    #[error("{0}")]
    Config(String),
}

impl NatsError {
    /// A configuration the server showed to be wrong (a dead-letter subject no stream stores, a
    /// consumer without explicit acks, a dead-letter policy without a subject), not a failure to
    /// reach it: the binary exits 2.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            NatsError::NotExplicitAcks { .. } | NatsError::DeadLetter { .. } | NatsError::Config(_)
        )
    }
}

/// A connected JetStream consumer, ready for the registry to start ([`crate::registry::connect`]).
pub struct NatsConnection {
    pub client: async_nats::Client,
    pub jetstream: Context,
    pub consumer: PullConsumer,
    pub settings: NatsSettings,
    /// The consumer's `AckWait`: the lease of a delivered message.
    pub ack_wait: Duration,
    /// `(subject, attempts)`: dead-letter a message whose delivery `attempts` failed.
    pub dead_letter: Option<(String, u32)>,
}

/// Connect, check the stream, find or create the consumer (see the module docs), and check that
/// a stream stores the dead-letter subject.
pub async fn connect(
    settings: NatsSettings,
    delivery: &DeliverySettings,
) -> Result<NatsConnection, NatsError> {
    let max_attempts = match (&settings.dead_letter_subject, &delivery.dead_letter) {
        (Some(_), Some((_, max))) => Some(*max),
        (Some(_), None) => Some(DEFAULT_MAX_DELIVERY_ATTEMPTS),
        (None, Some((topic, _))) => {
            return Err(NatsError::Config(format!(
                "the subscription's deadLetterPolicy (topic {topic}) needs a NATS subject: give --nats-dead-letter-subject SUBJECT"
            )))
        }
        (None, None) => None,
    };
    let client = async_nats::ConnectOptions::new()
        .name("subsink")
        .connect(settings.url.as_str())
        .await
        .map_err(|e| NatsError::Connect {
            url: crate::telemetry::logs::redact_url(&settings.url),
            message: e.to_string(),
        })?;
    let js = jetstream::new(client.clone());
    let stream = js
        .get_stream(&settings.stream)
        .await
        .map_err(|e| NatsError::Stream {
            stream: settings.stream.clone(),
            message: e.to_string(),
        })?;
    let consumer_err = |message: String| NatsError::Consumer {
        stream: settings.stream.clone(),
        consumer: settings.consumer.clone(),
        message,
    };
    let wanted = pull::Config {
        durable_name: Some(settings.consumer.clone()),
        ack_policy: AckPolicy::Explicit,
        ack_wait: delivery.ack_deadline,
        max_deliver: max_attempts.map_or(-1, i64::from),
        max_ack_pending: settings.max_ack_pending,
        deliver_policy: DeliverPolicy::All,
        description: Some("subsink export worker".into()),
        ..Default::default()
    };
    let consumer: PullConsumer = stream
        .get_or_create_consumer(&settings.consumer, wanted.clone())
        .await
        .map_err(|e| consumer_err(e.to_string()))?;
    let have = &consumer.cached_info().config;
    if have.ack_policy != AckPolicy::Explicit {
        return Err(NatsError::NotExplicitAcks {
            stream: settings.stream.clone(),
            consumer: settings.consumer.clone(),
            policy: format!("{:?}", have.ack_policy).to_lowercase(),
        });
    }
    if have.ack_wait != wanted.ack_wait
        || have.max_deliver != wanted.max_deliver
        || have.max_ack_pending != wanted.max_ack_pending
    {
        tracing::warn!(
            consumer = %settings.consumer,
            ack_wait = ?have.ack_wait, max_deliver = have.max_deliver, max_ack_pending = have.max_ack_pending,
            "the existing consumer's settings differ from the subscription's; using the consumer's"
        );
    }
    let ack_wait = have.ack_wait;
    // A message is dead-lettered on the failure of its last delivery the server will make: the
    // policy's attempts, or fewer if the existing consumer allows fewer.
    let dead_letter = match (&settings.dead_letter_subject, max_attempts) {
        (Some(subject), Some(max)) => {
            let max = if have.max_deliver > 0 {
                max.min(have.max_deliver as u32)
            } else {
                max
            };
            // A dead letter must be stored: published to a subject no stream captures it would be
            // dropped by the server, and the message acked.
            js.stream_by_subject(subject.clone())
                .await
                .map_err(|e| NatsError::DeadLetter {
                    subject: subject.clone(),
                    message: format!("no stream stores it ({e}); dead letters would be lost"),
                })?;
            Some((subject.clone(), max))
        }
        _ => None,
    };
    Ok(NatsConnection {
        client,
        jetstream: js,
        consumer,
        settings,
        ack_wait,
        dead_letter,
    })
}

/// What a JetStream ack subject says about a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckInfo {
    pub stream_sequence: u64,
    /// Deliveries of this message so far, this one included.
    pub delivered: i64,
    /// When the stream stored the message, in nanoseconds since the Unix epoch.
    pub published_nanos: i64,
}

impl AckInfo {
    /// Parse `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<nanos>.<pending>`, or the
    /// longer form with a domain and an account hash first (NATS ADR-15); more tokens after
    /// these are ignored.
    pub fn parse(reply: &str) -> Option<AckInfo> {
        let tokens: Vec<&str> = reply.strip_prefix("$JS.ACK.")?.split('.').collect();
        // The short form has 7 tokens; the long one 9 or more, two of them before the stream.
        let t = match tokens.len() {
            7 => &tokens[2..],
            n if n >= 9 => &tokens[4..],
            _ => return None,
        };
        Some(AckInfo {
            delivered: t[0].parse().ok()?,
            stream_sequence: t[1].parse().ok()?,
            published_nanos: t[3].parse().ok()?,
        })
    }
}

/// Turn a JetStream message into a [`Received`] (see the module docs for the mapping).
pub fn received(m: &async_nats::Message) -> Result<Received, String> {
    let reply = m
        .reply
        .as_ref()
        .ok_or_else(|| format!("message on {} has no reply subject", m.subject))?;
    let info = AckInfo::parse(reply.as_str())
        .ok_or_else(|| format!("reply subject {reply}: not a JetStream ack subject"))?;
    let mut attributes = std::collections::BTreeMap::new();
    let mut message_id = None;
    if let Some(h) = &m.headers {
        for (name, values) in h.iter() {
            let name: &str = name.as_ref();
            if name.eq_ignore_ascii_case(MSG_ID_HEADER) {
                message_id = values.first().map(|v| v.as_str().to_string());
                continue;
            }
            if name.len() >= 5 && name[..5].eq_ignore_ascii_case("nats-") {
                continue;
            }
            let joined = values
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            attributes.insert(name.to_string(), joined);
        }
    }
    attributes.insert(SUBJECT_ATTRIBUTE.to_string(), m.subject.to_string());
    let message_id = message_id
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| info.stream_sequence.to_string());
    let publish_time_micros = info.published_nanos.div_euclid(1000);
    Ok(Received {
        msg: Message {
            data: m.payload.clone(),
            attributes: attributes.into(),
            message_id,
            publish_time_micros,
            ordering_key: String::new(),
        },
        receipt: Receipt {
            ack_id: Some(reply.to_string()),
            delivery_attempt: Some(info.delivered.clamp(0, i32::MAX as i64) as i32),
            ..Default::default()
        },
    })
}

/// The pull task's half of a stop.
#[derive(Default)]
struct StopSignal {
    stopped: AtomicBool,
    notify: Notify,
    /// The last pull request was accepted (readiness).
    pulling: AtomicBool,
}

/// A running JetStream pull consumer.
pub struct NatsSource {
    /// Chunks from the pull task with their charges (module docs, "Memory").
    rx: mpsc::Receiver<(SourceEvent, Held)>,
    /// The charge of the chunk handed out last: released when the pipeline asks for the next.
    held: Held,
    stop: Arc<StopSignal>,
    name: String,
    /// The consumer's connection, for readiness.
    client: async_nats::Client,
    /// The consumer's `MaxAckPending`, as the server reports it.
    flow: Option<FlowLimit>,
    /// The consumer's messages delivered and not acked (by every worker on it) had reached
    /// `MaxAckPending` when last asked.
    held_back: Arc<AtomicBool>,
}

impl NatsSource {
    /// Start pulling `consumer` (reached through `client`) on its own task, outside any memory
    /// budget.
    pub fn start(consumer: PullConsumer, client: async_nats::Client, name: String) -> NatsSource {
        Self::start_gated(consumer, client, name, Resources::new(1, None).input_gate())
    }

    /// [`NatsSource::start`] within the memory budget of `gate` (module docs, "Memory").
    pub fn start_gated(
        consumer: PullConsumer,
        client: async_nats::Client,
        name: String,
        gate: InputGate,
    ) -> NatsSource {
        // The consumer in use: one created here, or the operator's own with its own limit
        // (-1: none).
        let flow = FlowLimit::new(consumer.cached_info().config.max_ack_pending, 0);
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let stop = Arc::new(StopSignal::default());
        // Just found or created by `connect`: the consumer is there.
        stop.pulling.store(true, Ordering::Relaxed);
        let held_back = Arc::new(AtomicBool::new(false));
        let max = flow.and_then(|f| f.messages);
        // The largest message the server takes (its `max_payload`, headers included), plus the
        // subject and reply a delivery adds: what a pull for one message must allow.
        let largest = client.server_info().max_payload as u64 + DELIVERY_FRAMING;
        tokio::spawn(pull_loop(
            consumer,
            tx,
            stop.clone(),
            (max, held_back.clone()),
            (gate, largest),
        ));
        NatsSource {
            rx,
            held: Held::default(),
            stop,
            name,
            client,
            flow,
            held_back,
        }
    }
}

/// What a chunk holds until the pipeline has taken it: its charge, and a token of the pull loop's
/// (while any token lives, the source holds chunks the pipeline has not taken).
#[derive(Debug, Default)]
struct Held {
    _charge: Charge,
    _token: Option<Arc<()>>,
}

/// What a pull for one message allows beyond the server's `max_payload`: the subject and reply
/// subject of the delivery, which JetStream counts in a pull's `max_bytes`.
const DELIVERY_FRAMING: u64 = 64 << 10;
/// The least a pull asks for in bytes (when the budget has less room, the pull still asks for this
/// much: a pull of a few bytes would bring nothing).
const PULL_MIN_BYTES: u64 = 64 << 10;

/// The bytes of one pull ([`pull_loop`]): the room the budget's input cap has left, or — after a
/// pull that brought nothing but the server's refusal (its next message is larger than that room:
/// JetStream answers `409 Message Size Exceeds MaxBytes` and keeps the message) — one message of
/// any size the server takes (`largest`), as the file source may always take one block.
fn pull_bytes(gate: &InputGate, largest: u64, oversize: bool) -> (usize, u64) {
    if oversize {
        (1, largest)
    } else {
        (PULL_BATCH, gate.room().max(PULL_MIN_BYTES))
    }
}

/// `held_back`: the consumer's `MaxAckPending`, and where to say whether the consumer's
/// messages delivered and not acked have reached it (asked after every pull: other workers on the
/// consumer count too). `gate`: the memory budget, and the largest delivery the server may send.
async fn pull_loop(
    consumer: PullConsumer,
    tx: mpsc::Sender<(SourceEvent, Held)>,
    stop: Arc<StopSignal>,
    held_back: (Option<u64>, Arc<AtomicBool>),
    (gate, largest): (InputGate, u64),
) {
    let mut backoff = BACKOFF_MIN;
    // The last pull was refused for a message larger than its bytes: ask for that one alone.
    let mut oversize = false;
    // Cloned into every chunk handed out: only this one left, the source holds no chunk.
    let token = Arc::new(());
    while !stop.stopped.load(Ordering::SeqCst) {
        if let (Some(max), flag) = &held_back {
            // Bounded: a server that does not answer must not hold up the pull (which retries).
            if let Ok(Ok(info)) = tokio::time::timeout(PULL_EXPIRES, consumer.get_info()).await {
                flag.store(info.num_ack_pending as u64 >= *max, Ordering::Relaxed);
            }
        }
        // A pull is asked for only while the budget has room for input, and for no more bytes
        // than that room (module docs, "Memory").
        tokio::select! {
            _ = gate.admit() => {}
            _ = stop.notify.notified() => continue,
        }
        // One message of any size only when the source holds nothing else (as the file source
        // takes one block of any size): at most the cap, or that message, not both.
        while oversize && Arc::strong_count(&token) > 1 && !stop.stopped.load(Ordering::SeqCst) {
            tokio::time::sleep(gate.recheck()).await;
        }
        let (messages, bytes) = pull_bytes(&gate, largest, oversize);
        let batch = consumer
            .batch()
            .max_messages(messages)
            .max_bytes(bytes.min(usize::MAX as u64) as usize)
            .expires(PULL_EXPIRES)
            .messages()
            .await;
        stop.pulling.store(batch.is_ok(), Ordering::Relaxed);
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "NATS pull request failed");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.notify.notified() => {}
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        // Hand out what has arrived, in chunks, without waiting for the pull to complete. A stop
        // does not interrupt the pull: what the server sent for it is still handed out.
        let mut chunks = batch.ready_chunks(CHUNK);
        let (mut delivered, mut refused) = (false, false);
        while let Some(chunk) = chunks.next().await {
            let mut out = Vec::with_capacity(chunk.len());
            for m in chunk {
                match m {
                    Ok(m) => match received(&m.message) {
                        Ok(r) => out.push(r),
                        Err(e) => tracing::warn!(error = %e, "NATS pull: skipped a delivery"),
                    },
                    // The server ended the pull with a status (the client gives its text only).
                    Err(e) => {
                        refused = true;
                        if oversize {
                            tracing::warn!(error = %e, "NATS pull for one message ended");
                        } else {
                            tracing::debug!(error = %e, "NATS pull ended");
                        }
                    }
                }
            }
            if !out.is_empty() {
                delivered = true;
                backoff = BACKOFF_MIN;
                // The server just sent: it is not holding this worker back (asked again before
                // the next pull).
                held_back.1.store(false, Ordering::Relaxed);
                let held = Held {
                    _charge: gate.charge(held_bytes(&out)),
                    _token: Some(token.clone()),
                };
                if tx.send((SourceEvent::Messages(out), held)).await.is_err() {
                    return;
                }
            }
        }
        // A pull the server ended with a status before any message: with room for input, the
        // status that comes without a message is 409 Message Size Exceeds MaxBytes, so the next
        // pull asks for one message of any size.
        oversize = refused && !delivered;
    }
}

#[async_trait::async_trait]
impl Source for NatsSource {
    async fn next(&mut self) -> Option<SourceEvent> {
        // The pipeline has taken the last chunk: its charge goes.
        self.held = Held::default();
        let (event, held) = self.rx.recv().await?;
        self.held = held;
        Some(event)
    }

    fn describe(&self) -> &str {
        &self.name
    }

    /// The client is connected and the last pull request was accepted.
    fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
            && self.stop.pulling.load(Ordering::Relaxed)
    }

    /// Ask no more; the current pull is read to its end, then `next()` returns `None`.
    fn stop(&mut self) -> bool {
        self.stop.stopped.store(true, Ordering::SeqCst);
        self.stop.notify.notify_waiters();
        true
    }

    /// The consumer's `MaxAckPending` (messages only: JetStream has no limit in bytes).
    fn flow_limit(&self) -> Option<FlowLimit> {
        self.flow
    }

    /// The consumer's delivered and unacked messages, every worker's, had reached `MaxAckPending`
    /// when last asked (before each pull).
    fn held_back(&self) -> bool {
        self.held_back.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(headers: Option<async_nats::HeaderMap>) -> async_nats::Message {
        async_nats::Message {
            subject: "orders.eu".into(),
            // $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<nanos>.<pending>
            reply: Some("$JS.ACK.ORDERS.archive.3.42.57.1700000000123456789.0".into()),
            payload: bytes::Bytes::from_static(b"hello"),
            headers,
            status: None,
            description: None,
            length: 5,
        }
    }

    #[test]
    fn headers_become_attributes_and_the_subject_is_kept() {
        let mut h = async_nats::HeaderMap::new();
        h.insert("color", "red");
        h.append("tag", "a");
        h.append("tag", "b");
        h.insert("Nats-Msg-Id", "order-7");
        h.insert("Nats-Expected-Stream", "ORDERS");
        let r = received(&msg(Some(h))).unwrap();
        assert_eq!(r.msg.message_id, "order-7");
        assert_eq!(
            r.msg.attributes,
            [
                ("color", "red"),
                ("nats.subject", "orders.eu"),
                ("tag", "a, b")
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
        );
        assert_eq!(&r.msg.data[..], b"hello");
        assert_eq!(r.msg.publish_time_micros, 1_700_000_000_123_456);
        assert_eq!(r.receipt.delivery_attempt, Some(3));
        assert_eq!(
            r.receipt.ack_id.as_deref(),
            Some("$JS.ACK.ORDERS.archive.3.42.57.1700000000123456789.0")
        );
    }

    #[test]
    fn without_nats_msg_id_the_stream_sequence_is_the_message_id() {
        let r = received(&msg(None)).unwrap();
        assert_eq!(r.msg.message_id, "42");
        assert_eq!(r.msg.attributes.len(), 1);
        let mut m = msg(None);
        m.reply = None;
        assert!(received(&m).unwrap_err().contains("no reply subject"));
    }
}
