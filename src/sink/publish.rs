//! The publish sink: messages back onto a topic (docs/replay.md). A "file" is a batch of up to
//! [`MAX_MESSAGES`] messages; making it durable publishes it. Batches are published one at a time,
//! in order (the pipeline runs a publish like an ordered subscription).
//!
//! - **Pub/Sub** (`--publish-to projects/P/topics/T`), through the Publish API: grouped by
//!   ordering key, keys in input order ([`PubsubClient::publish`]), with data, attributes and
//!   ordering key; the topic assigns new message ids and publish times.
//! - **Kafka** (`--publish-to kafka://HOST:PORT[,HOST:PORT…]/TOPIC`), through librdkafka's
//!   producer ([`crate::kafka::producer_config`]: `acks=all`; `--publish-option KEY=VALUE` passes other
//!   settings through: SASL, TLS, compression), one record per message:
//!   data → value (an empty payload is an empty value, never a tombstone), attributes → headers
//!   (one each, as they are, `kafka.*` ones included), ordering key → key (none when empty: the
//!   partitioner spreads such records). With one request in flight per broker the records of a
//!   key reach their partition in input order, also across retries. The record timestamp is the
//!   time of the produce. A batch is durable once every record of it is acknowledged.
//!
//! At least once, both: a batch published when the run crashed before its checkpoint moved is
//! published again by the rerun, and a failed batch is retried whole (the records of it that
//! were acknowledged are then published twice).

pub mod register;

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use super::{Durable, PushError, Sink, SinkError, SinkFile, Unstaged};
use crate::batch::Limits;
use crate::message::{Message, Received};
use crate::pubsub::PubsubClient;
use crate::receipt::{Refusal, Refused, Written};

/// Messages in one batch (a PublishRequest holds at most 1,000).
pub const MAX_MESSAGES: u64 = 1000;
/// Message bytes in one batch (requests are split at about 10 MB by the client).
pub const MAX_BYTES: u64 = 9_000_000;
/// A batch is published at most this long after its first message.
pub const MAX_DELAY: Duration = Duration::from_millis(500);
/// Tries of a batch whose publish fails with a retryable status.
const TRIES: u32 = 6;
/// How long a Kafka record may wait for its acknowledgement (librdkafka's `message.timeout.ms`).
const KAFKA_DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the brokers may take to describe the topic at startup.
const KAFKA_METADATA_TIMEOUT: Duration = Duration::from_secs(15);
/// Producer settings `--publish-option` may not change, and why.
const FIXED: [(&str, &str); 5] = [
    (
        "bootstrap.servers",
        "give the brokers in --publish-to kafka://HOST:PORT,…/TOPIC",
    ),
    ("acks", "a batch is done once all in-sync replicas have it"),
    (
        "enable.idempotence",
        "off: the publish is at least once (docs/replay.md)",
    ),
    (
        "max.in.flight.requests.per.connection",
        "the records of a key keep their order with one request in flight",
    ),
    (
        "max.in.flight",
        "the records of a key keep their order with one request in flight",
    ),
];

/// Where `--publish-to` publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishTo {
    /// `projects/P/topics/T`.
    Pubsub(String),
    /// `kafka://HOST:PORT[,HOST:PORT…]/TOPIC`, with the `--publish-option`s in order (later
    /// wins; values may be secrets: never logged).
    Kafka {
        brokers: String,
        topic: String,
        options: Vec<(String, String)>,
    },
}

/// The flags of this sink (`subsink run`, under the destination's heading).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PublishArgs {
    /// Publish the messages onto this Pub/Sub topic (`projects/P/topics/T`; the emulator when
    /// PUBSUB_EMULATOR_HOST is set) or Kafka topic (`kafka://HOST:PORT[,HOST:PORT…]/TOPIC`)
    /// instead of writing the subscription's objects or rows: data, attributes (Kafka: headers)
    /// and ordering keys (Kafka: record keys); at least once.
    #[arg(long, value_name = "TOPIC")]
    pub publish_to: Option<String>,
    /// With --publish-to kafka://…: a librdkafka producer setting, passed through (SASL, TLS,
    /// client.id, compression.type, …; repeatable; values are never logged).
    #[arg(long, value_name = "KEY=VALUE")]
    pub publish_option: Vec<String>,
}

impl PublishArgs {
    /// The topic the flags name, `None` without `--publish-to`. `writers`: the writer flags and
    /// whether each is given; with `--publish-to` a given one is refused, as is
    /// `--publish-option` without it.
    pub fn sink(&self, writers: &[(&str, bool)]) -> Result<Option<PublishTo>, String> {
        let Some(to) = &self.publish_to else {
            if !self.publish_option.is_empty() {
                return Err("--publish-option needs --publish-to kafka://…".to_string());
            }
            return Ok(None);
        };
        if let Some((flag, _)) = writers.iter().find(|(_, given)| *given) {
            return Err(format!(
                "{flag} is not used with --publish-to: messages are published to {to}, not written; drop one of them"
            ));
        }
        Ok(Some(
            PublishTo::parse(to)?.with_options(&self.publish_option)?,
        ))
    }
}

impl PublishTo {
    /// Where messages are published, for the logs (never an option's value).
    pub fn describe(&self) -> String {
        match self {
            PublishTo::Pubsub(t) => t.clone(),
            PublishTo::Kafka { brokers, topic, .. } => format!("kafka://{brokers}/{topic}"),
        }
    }

    /// `--publish-to`'s value.
    pub fn parse(v: &str) -> Result<PublishTo, String> {
        if let Some(rest) = v.strip_prefix("kafka://") {
            let (brokers, topic) = rest.split_once('/').unwrap_or((rest, ""));
            let ok = !brokers.is_empty()
                && brokers.split(',').all(|b| {
                    b.rsplit_once(':')
                        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
                })
                && !topic.is_empty()
                && !topic.contains('/');
            if !ok {
                return Err(format!(
                    "--publish-to {v:?}: expected kafka://HOST:PORT[,HOST:PORT…]/TOPIC"
                ));
            }
            return Ok(PublishTo::Kafka {
                brokers: brokers.to_string(),
                topic: topic.to_string(),
                options: Vec::new(),
            });
        }
        let parts: Vec<&str> = v.split('/').collect();
        if parts.len() != 4 || parts[0] != "projects" || parts[2] != "topics" {
            return Err(format!(
                "--publish-to {v:?}: expected projects/PROJECT/topics/TOPIC or kafka://HOST:PORT/TOPIC"
            ));
        }
        Ok(PublishTo::Pubsub(v.to_string()))
    }

    /// `--publish-option KEY=VALUE`s: librdkafka producer settings, for a Kafka topic only; the
    /// ones subsink sets itself ([`FIXED`]) are refused. The error names the key, never the value.
    pub fn with_options(self, given: &[String]) -> Result<PublishTo, String> {
        if given.is_empty() {
            return Ok(self);
        }
        let PublishTo::Kafka {
            brokers,
            topic,
            mut options,
        } = self
        else {
            return Err("--publish-option is for --publish-to kafka://…".to_string());
        };
        for o in given {
            let Some((k, v)) = o.split_once('=') else {
                return Err(format!("--publish-option {o}: give KEY=VALUE"));
            };
            let k = k.trim();
            if let Some((_, why)) = FIXED.iter().find(|(f, _)| *f == k) {
                return Err(format!("--publish-option {k}: subsink sets it: {why}"));
            }
            options.push((k.to_string(), v.to_string()));
        }
        Ok(PublishTo::Kafka {
            brokers,
            topic,
            options,
        })
    }

    /// Connect: the Pub/Sub client (the emulator when PUBSUB_EMULATOR_HOST is set), or a Kafka
    /// producer whose brokers have the topic.
    pub async fn connect(self) -> Result<PublishSink, String> {
        let target = match self {
            PublishTo::Pubsub(topic) => {
                let client = PubsubClient::connect().await.map_err(|e| e.to_string())?;
                Target::Pubsub { client, topic }
            }
            PublishTo::Kafka {
                brokers,
                topic,
                options,
            } => {
                let mut client = crate::kafka::client_config(&brokers);
                client
                    // A missing topic is refused below, not created by the metadata request
                    // (librdkafka's producer default, which brokers with auto-creation honour);
                    // `--publish-option allow.auto.create.topics=true` turns that back on.
                    .set("allow.auto.create.topics", "false")
                    .set(
                        "message.timeout.ms",
                        KAFKA_DELIVERY_TIMEOUT.as_millis().to_string(),
                    );
                for (k, v) in &options {
                    client.set(k, v);
                }
                let producer: FutureProducer = crate::kafka::producer_config(&client)
                    .set("max.in.flight.requests.per.connection", "1")
                    .create()
                    .map_err(|e| match e {
                        // The key and librdkafka's reason, not the value (it may be a secret).
                        rdkafka::error::KafkaError::ClientConfig(_, why, key, _) => {
                            format!("--publish-option {key}: {why}")
                        }
                        e => format!("Kafka {brokers}: {e}"),
                    })?;
                let p = producer.clone();
                let t = topic.clone();
                let md = tokio::task::spawn_blocking(move || {
                    p.client().fetch_metadata(Some(&t), KAFKA_METADATA_TIMEOUT)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| {
                    format!("Kafka {brokers}: cannot read the metadata of topic {topic:?}: {e}")
                })?;
                let found = md.topics().iter().find(|m| m.name() == topic);
                match found {
                    Some(m) if m.error().is_none() && !m.partitions().is_empty() => {}
                    _ => {
                        return Err(format!(
                            "Kafka {brokers}: the brokers do not have topic {topic:?}"
                        ))
                    }
                }
                Target::Kafka { producer, topic }
            }
        };
        Ok(PublishSink { target, batches: 0 })
    }
}

/// A connected destination.
#[derive(Clone)]
enum Target {
    Pubsub {
        client: PubsubClient,
        topic: String,
    },
    Kafka {
        producer: FutureProducer,
        topic: String,
    },
}

impl Target {
    fn topic(&self) -> &str {
        match self {
            Target::Pubsub { topic, .. } | Target::Kafka { topic, .. } => topic,
        }
    }
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
#[error("Kafka topic {topic:?}: {message}")]
pub struct KafkaPublishError {
    topic: String,
    message: String,
}

/// Publishes batches onto a topic.
pub struct PublishSink {
    target: Target,
    batches: u64,
}

impl Sink for PublishSink {
    type File = Batch;

    fn limits(&self) -> Limits {
        Limits {
            max_duration: MAX_DELAY,
            max_bytes: Some(MAX_BYTES),
            max_messages: Some(MAX_MESSAGES),
        }
    }

    fn refusal(&self) -> Refusal {
        Refusal::BadInput
    }

    fn open(&mut self, _group: Option<&str>) -> Result<Batch, PushError> {
        self.batches += 1;
        Ok(Batch {
            name: format!("{}#batch-{}", self.target.topic(), self.batches),
            target: self.target.clone(),
            messages: Vec::new(),
            staged: None,
            bytes: 0,
        })
    }

    async fn is_durable(&self, _name: &str) -> Result<bool, SinkError> {
        // A topic cannot be asked whether a batch reached it: publish again (at least once).
        Ok(false)
    }
}

/// One batch of messages to publish.
pub struct Batch {
    name: String,
    target: Target,
    messages: Vec<Message>,
    staged: Option<Message>,
    bytes: u64,
}

impl SinkFile for Batch {
    type Closed = Batch;

    fn name(&self) -> &str {
        &self.name
    }

    fn header_bytes(&self) -> u64 {
        0
    }

    fn stage(&mut self, r: &Received) -> Result<u64, Refused> {
        let size = super::chunk::message_bytes(&r.msg);
        self.staged = Some(r.msg.clone());
        Ok(size)
    }

    fn commit(&mut self) {
        if let Some(m) = self.staged.take() {
            self.bytes += super::chunk::message_bytes(&m);
            self.messages.push(m);
        }
    }

    fn unstage(&mut self, _carry: &mut Vec<u8>) -> Unstaged {
        self.staged = None;
        Unstaged::Restage
    }

    fn close(self) -> Batch {
        self
    }
}

#[async_trait::async_trait]
impl Durable for Batch {
    fn name(&self) -> &str {
        &self.name
    }

    async fn make_durable(self: Box<Self>) -> Result<Written, SinkError> {
        let mut wait = Duration::from_millis(500);
        let mut tries = 0;
        loop {
            tries += 1;
            let (e, retryable): (Box<dyn std::error::Error + Send + Sync>, bool) =
                match &self.target {
                    Target::Pubsub { client, topic } => {
                        match client.publish(topic, &self.messages).await {
                            Ok(_) => return Ok(self.bytes.into()),
                            Err(e) => {
                                let r = e.retryable();
                                (Box::new(e), r)
                            }
                        }
                    }
                    Target::Kafka { producer, topic } => {
                        match produce(producer, topic, &self.messages).await {
                            Ok(()) => return Ok(self.bytes.into()),
                            Err((e, r)) => (Box::new(e), r),
                        }
                    }
                };
            if retryable && tries < TRIES {
                tracing::warn!(topic = %self.target.topic(), "publish failed, retrying in {wait:?}: {e}");
                tokio::time::sleep(wait).await;
                wait *= 2;
                continue;
            }
            return Err(SinkError::Commit {
                name: self.name.clone(),
                source: e,
                retryable,
            });
        }
    }

    async fn abort(self: Box<Self>) {}
}

/// Produce `messages` onto `topic` in their order, then wait for every acknowledgement. The error
/// of the first record that failed, and whether trying the batch again may succeed.
async fn produce(
    producer: &FutureProducer,
    topic: &str,
    messages: &[Message],
) -> Result<(), (KafkaPublishError, bool)> {
    let err = |message: String, retryable: bool| {
        (
            KafkaPublishError {
                topic: topic.to_string(),
                message,
            },
            retryable,
        )
    };
    let mut pending = Vec::with_capacity(messages.len());
    for m in messages {
        let mut headers = OwnedHeaders::new_with_capacity(m.attributes.len());
        for (k, v) in m.attributes.iter() {
            headers = headers.insert(Header {
                key: k,
                value: Some(v),
            });
        }
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
            .payload(&m.data[..])
            .headers(headers);
        if !m.ordering_key.is_empty() {
            rec = rec.key(m.ordering_key.as_bytes());
        }
        // Enqueued in input order: a full local queue is waited out, never skipped.
        loop {
            match producer.send_result(rec) {
                Ok(f) => {
                    pending.push(f);
                    break;
                }
                Err((
                    rdkafka::error::KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                    r,
                )) => {
                    rec = r;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((e, _)) => return Err(err(e.to_string(), retryable(&e))),
            }
        }
    }
    let mut first = None;
    for f in pending {
        let failed = match f.await {
            Ok(Ok(_)) => None,
            Ok(Err((e, _))) => Some((e.to_string(), retryable(&e))),
            Err(_) => Some(("the producer went away".to_string(), true)),
        };
        if first.is_none() {
            first = failed;
        }
    }
    match first {
        None => Ok(()),
        Some((m, r)) => Err(err(m, r)),
    }
}

/// Can the same record succeed if produced again? Not when it is too large, malformed or not
/// allowed.
fn retryable(e: &rdkafka::error::KafkaError) -> bool {
    !matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::UnknownTopicOrPartition
        )
    )
}

#[cfg(test)]
mod tests {
    use super::PublishTo;

    #[test]
    fn publish_to_parses_pubsub_topics_and_kafka_urls() {
        assert_eq!(
            PublishTo::parse("projects/p/topics/t"),
            Ok(PublishTo::Pubsub("projects/p/topics/t".into()))
        );
        assert_eq!(
            PublishTo::parse("kafka://a:9092,b:9093/events"),
            Ok(PublishTo::Kafka {
                brokers: "a:9092,b:9093".into(),
                topic: "events".into(),
                options: Vec::new(),
            })
        );
        for bad in [
            "kafka://a:9092",
            "kafka://a:9092/",
            "kafka:///t",
            "kafka://a/t",
            "kafka://a:9092/t/u",
            "projects/p/t",
            "t",
        ] {
            assert!(PublishTo::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn publish_options_pass_through_to_kafka_only_and_never_the_fixed_ones() {
        let kafka = PublishTo::parse("kafka://a:9092/t").unwrap();
        assert_eq!(
            kafka.clone().with_options(&[
                "security.protocol=SASL_SSL".into(),
                " sasl.password=a=b".into()
            ]),
            Ok(PublishTo::Kafka {
                brokers: "a:9092".into(),
                topic: "t".into(),
                options: vec![
                    ("security.protocol".into(), "SASL_SSL".into()),
                    ("sasl.password".into(), "a=b".into()),
                ],
            })
        );
        let err = kafka.clone().with_options(&["acks=1".into()]).unwrap_err();
        assert!(
            err.starts_with("--publish-option acks: subsink sets it"),
            "{err}"
        );
        let err = kafka.with_options(&["linger.ms".into()]).unwrap_err();
        assert_eq!(err, "--publish-option linger.ms: give KEY=VALUE");
        let pubsub = PublishTo::parse("projects/p/topics/t").unwrap();
        assert_eq!(pubsub.clone().with_options(&[]), Ok(pubsub.clone()));
        let err = pubsub.with_options(&["acks=1".into()]).unwrap_err();
        assert_eq!(err, "--publish-option is for --publish-to kafka://…");
    }
}
