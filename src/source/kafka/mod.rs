//! Kafka: a consumer group as a source (`--source kafka://HOST:PORT[,HOST:PORT…]`), through
//! librdkafka (the `rdkafka` crate, which builds its bundled librdkafka from source).
//!
//! ## The consumer
//! [`connect`] checks that every `--kafka-topic` (and `--kafka-dead-letter-topic`) exists, then
//! joins the group `--kafka-group` (default: the subscription's short ID) and subscribes to the
//! topics, or to `--kafka-topic-pattern` (a regex, matched against every topic name), with:
//!
//! | client setting | value |
//! |---|---|
//! | `partition.assignment.strategy` | `cooperative-sticky` (a rebalance moves only the partitions that change owner) |
//! | `enable.auto.commit`, `enable.auto.offset.store` | `false`: an offset is committed only once every record below it is durable (refused if set otherwise) |
//! | `auto.offset.reset` | `earliest` (a new group reads the topic from its start, as Kafka Connect's sinks do) |
//! | `client.id` | `subsink` |
//! | anything from `--kafka-option KEY=VALUE` | passed through (SASL, TLS, …; values are never logged) |
//!
//! ## A Kafka record as a Pub/Sub message
//! | Pub/Sub | Kafka |
//! |---|---|
//! | `data` | the value (a tombstone, a null value: empty, with `kafka.tombstone` = `true`) |
//! | `attributes` | the headers (a header with several values: one attribute, its values joined with `", "`, as the NATS source does; a null value: empty; a value that is not UTF-8: base64, and its name listed in `kafka.headers.base64`), plus `kafka.topic`, `kafka.partition`, `kafka.offset` and, when the record has one, `kafka.key` (text; base64 for a key that is not UTF-8, then `kafka.key.encoding` = `base64`) |
//! | `messageId` | `TOPIC/PARTITION/OFFSET` |
//! | `publishTime` | the record's timestamp (create or log-append time); the time it was read when it has none |
//! | `orderingKey` | with `enableMessageOrdering`: the key as in `kafka.key`; else empty |
//! | delivery attempt | 1, then subsink's own count of in-process redeliveries |
//!
//! ## Offsets, commits, rebalances
//! [`Offsets`] keeps, per assigned partition, the offsets delivered and not yet settled. A record
//! is settled once the file holding it is durable, when the filter did not match it, or once it
//! is dead-lettered; the partition's committed offset is its *watermark*: the lowest unsettled
//! offset, or one past the last delivered when none is unsettled — every record below it is
//! settled (as the file source's checkpoint, per partition). Commits are synchronous, made by the
//! settle side ([`crate::source::kafka::settle`]) after settling, and retried until the broker takes them.
//!
//! On a revoke (another worker joined, or left and came back), the revoked partitions' watermarks
//! are committed before they are released, and the partitions are released without waiting for
//! their open files: what those files hold past the watermark is read again by the next owner
//! (at least once; see docs/kafka.md). A lost assignment (the session timed out) is released the
//! same way; its commit fails and changes nothing.
//!
//! ## Flow control
//! Records delivered and not settled count against `--max-outstanding-messages` and
//! `--max-outstanding-bytes`: at either limit every assigned partition is paused (librdkafka keeps
//! polling, so the group membership lives on), and resumed once settling brings them below it.
//! The pipeline finalizes open files early before that starves them ([`crate::flow`]).
//!
//! ## Memory
//! Within a memory budget (`--memory-limit`) librdkafka's read-ahead is derived from the limit
//! and charged for the life of the source ([`Prefetch`]); `--max-outstanding-bytes` is held to
//! half the limit. Once the read loop takes records they are charged ([`crate::resources::Charge`],
//! in chunks of at most `CHUNK` records or `CHUNK_BYTES`) until the pipeline has taken them (the
//! next [`crate::source::Source::next`]). While the budget has no room for input the partitions
//! are paused as for flow control (librdkafka keeps polling, so the group membership lives on, and
//! drops what it had queued for them), and resumed when there is room again (`PAUSE_AFTER` says
//! why at once).
//!
//! ## Failures
//! A record whose delivery failed (the sink refused it, or its file failed) is handed back to the
//! source after the retry policy's backoff and written again (attempt + 1); its partition goes on
//! meanwhile. At `maxDeliveryAttempts` it goes to `--kafka-dead-letter-topic`; without one its
//! partition stops (paused, its watermark held below the record) with an error naming the record.
//!
//! ## `--exactly-once`
//! A record's position is its partition and offset ([`crate::position`]: stream = topic, part =
//! partition, reader = the group, scheme `subsink-kafka`; its `messageId` is
//! `TOPIC/PARTITION/OFFSET`). The destination keeps a partition's records in offset order and says
//! how far it holds each ([`crate::position::DurableStreams`]); before the first record of a partition
//! (after every assignment) the source asks it and skips what it holds (`exact.rs`).
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | the settings, the record ↔ message attributes, the errors |
//! | `flags.rs` | `--kafka-*` flags → [`KafkaSettings`] |
//! | `offsets.rs` | per partition, what is delivered and not settled; the record ids |
//! | `consumer.rs` | the consumer, its rebalance callbacks, connecting; a record as a message |
//! | `read.rs` | the running source: its read loop, flow control and memory budget |
//! | `prefetch.rs` | librdkafka's read-ahead, derived from `--memory-limit` |
//! | `exact.rs` | `--exactly-once`: a partition's first record looked up in the destination |

pub mod build;
mod consumer;
mod exact;
mod flags;
mod offsets;
mod prefetch;
mod read;
pub mod settle;

use rdkafka::ClientConfig;

use crate::position::Streams;
use crate::receipt::PositionedSource;

pub use consumer::{connect, received, KafkaConnection, KafkaConsumer, KafkaContext};
pub use flags::{KafkaArgs, KafkaFlagsError};
pub use offsets::{commit_list, tp_of, Offsets, Tp};
pub use prefetch::Prefetch;
pub use read::KafkaSource;

pub const TOPIC_ATTRIBUTE: &str = "kafka.topic";
pub const PARTITION_ATTRIBUTE: &str = "kafka.partition";
pub const OFFSET_ATTRIBUTE: &str = "kafka.offset";
pub const KEY_ATTRIBUTE: &str = "kafka.key";
/// `base64` when [`KEY_ATTRIBUTE`] holds a key that is not UTF-8.
pub const KEY_ENCODING_ATTRIBUTE: &str = "kafka.key.encoding";
/// `true` for a record with a null value.
pub const TOMBSTONE_ATTRIBUTE: &str = "kafka.tombstone";
/// The names of the headers whose values were not UTF-8 (their attributes hold base64), joined
/// with `,`.
pub const BASE64_HEADERS_ATTRIBUTE: &str = "kafka.headers.base64";
/// `maxDeliveryAttempts` without a dead-letter policy (Pub/Sub's default).
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: u32 = 5;

/// What the Kafka source needs (flags of `subsink run`).
#[derive(Clone)]
pub struct KafkaSettings {
    /// `HOST:PORT[,HOST:PORT…]`.
    pub brokers: String,
    pub topics: Vec<String>,
    /// A regex over topic names (librdkafka's `^…` subscription).
    pub topic_pattern: Option<String>,
    pub group: String,
    /// `--kafka-option`s, in order (later wins). Values may be secrets: never logged.
    pub options: Vec<(String, String)>,
    pub dead_letter_topic: Option<String>,
    pub max_outstanding_messages: Option<u64>,
    pub max_outstanding_bytes: Option<u64>,
    /// With `enableMessageOrdering`: the key is the ordering key.
    pub ordering: bool,
    /// `--exactly-once`: a partition's records are written in offset order and looked up in the
    /// destination before its first (`exact.rs`).
    pub exactly_once: bool,
    /// librdkafka's read-ahead, derived from `--memory-limit` ([`KafkaSettings::bounded_by`]);
    /// `None`: librdkafka's defaults (no budget).
    pub prefetch: Option<Prefetch>,
}

/// The Kafka source as refusals of `--exactly-once` name it (the only source whose records carry
/// a stream position).
pub const POSITIONED: PositionedSource = PositionedSource {
    name: "Kafka",
    flag: "--source kafka://…",
};

/// The help heading of the Kafka source's flags.
pub const HEADING: &str = "Kafka";

impl KafkaSettings {
    /// Held to `memory_limit` (`--memory-limit`): librdkafka's read-ahead derived from it
    /// ([`Prefetch`]), and at most half of it outstanding (`--max-outstanding-bytes` above that,
    /// or none, is lowered to it, and the log says so), as the Pub/Sub source is.
    pub fn bounded_by(&mut self, memory_limit: Option<u64>) {
        let Some(limit) = memory_limit else {
            return;
        };
        self.prefetch = Some(Prefetch::for_limit(limit));
        let half = limit / 2;
        if self.max_outstanding_bytes.is_none_or(|b| b > half) {
            tracing::info!(
                max_outstanding_bytes = half,
                flag = ?self.max_outstanding_bytes,
                "Kafka flow control: at most half of --memory-limit outstanding"
            );
            self.max_outstanding_bytes = Some(half);
        }
    }

    /// The streams this run reads: the topics' partitions, read by the group.
    pub fn streams(&self) -> Streams {
        Streams {
            name: POSITIONED.name.into(),
            scheme: "subsink-kafka".into(),
            reader: self.group.as_str().into(),
        }
    }

    /// `--exactly-once` into a destination that holds positions (checked by it: see
    /// [`crate::sink::SinkSpec::hold_positions`]); `atomic_with`: what the destination commits. A
    /// refused record then stops its partition: producing a dead letter is not atomic with what
    /// the destination commits (exit 2 with the reason).
    pub fn hold_positions(&mut self, atomic_with: &str) -> Result<(), String> {
        if self.dead_letter_topic.is_some() {
            return Err(format!("--exactly-once with Kafka: --kafka-dead-letter-topic is not available (producing a dead letter is not atomic with {atomic_with}; a refused record stops its partition instead)"));
        }
        self.exactly_once = true;
        Ok(())
    }
}

impl std::fmt::Debug for KafkaSettings {
    /// Option values are left out: they may be passwords.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self.options.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("KafkaSettings")
            .field("brokers", &self.brokers)
            .field("topics", &self.topics)
            .field("topic_pattern", &self.topic_pattern)
            .field("group", &self.group)
            .field("options", &keys)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .finish_non_exhaustive()
    }
}

impl KafkaSettings {
    /// The subscription form of the topics: names, or `^pattern`.
    fn subscription(&self) -> Vec<String> {
        match &self.topic_pattern {
            Some(p) if p.starts_with('^') => vec![p.clone()],
            Some(p) => vec![format!("^{p}")],
            None => self.topics.clone(),
        }
    }

    /// The client settings shared by the consumer and the dead-letter producer.
    fn client(&self) -> ClientConfig {
        let mut c = crate::kafka::client_config(&self.brokers);
        for (k, v) in &self.options {
            c.set(k, v);
        }
        c
    }

    fn consumer(&self) -> ClientConfig {
        let mut c = crate::kafka::client_config(&self.brokers);
        c.set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky");
        for (k, v) in &self.options {
            c.set(k, v);
        }
        if let Some(p) = &self.prefetch {
            p.apply(&mut c, &self.options);
        }
        c.set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        c
    }
}

/// Why the Kafka source could not start.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("Kafka {brokers}: {message}")]
    Client { brokers: String, message: String },
    /// A named topic the brokers do not have (they do not create it for a consumer).
    #[error("Kafka topic {topic:?}: {message}")]
    Topic { topic: String, message: String },
    #[error("--kafka-option: {0}")]
    Option(String),
    /// `--exactly-once` cannot hold with this destination.
    #[error("--exactly-once with Kafka: {0}")]
    ExactlyOnce(String),
}

impl KafkaError {
    /// A topic the brokers do not have, or a client option librdkafka refuses: exit 2.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            KafkaError::Topic { .. } | KafkaError::Option(_) | KafkaError::ExactlyOnce(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broker list without credentials is shown in logs as given (moved from the telemetry's
    /// redaction test, next to the URLs it is about).
    #[test]
    fn a_broker_url_without_credentials_is_shown_as_given() {
        use crate::telemetry::logs::redact_url;
        assert_eq!(redact_url("kafka://h:9092"), "kafka://h:9092");
    }

    /// Issue 43: under `--memory-limit` the read-ahead is derived and `--max-outstanding-bytes`
    /// is at most half the limit (kept when smaller); without a budget neither changes.
    #[test]
    fn the_memory_limit_bounds_the_read_ahead_and_the_outstanding_bytes() {
        let a = KafkaArgs {
            kafka_topic: vec!["t".into()],
            kafka_topic_pattern: None,
            kafka_group: None,
            kafka_option: vec!["queued.max.messages.kbytes=1000000".into()],
            kafka_dead_letter_topic: None,
        };
        let mut s = a.settings("kafka://a:9092", "s").unwrap();
        s.max_outstanding_bytes = Some(100 << 20);
        s.bounded_by(None);
        assert_eq!(
            (s.prefetch, s.max_outstanding_bytes),
            (None, Some(100 << 20))
        );
        assert_eq!(
            s.consumer().get("queued.max.messages.kbytes"),
            Some("1000000")
        );
        s.bounded_by(Some(64 << 20));
        assert_eq!(s.prefetch, Some(Prefetch::for_limit(64 << 20)));
        assert_eq!(s.max_outstanding_bytes, Some(32 << 20));
        let c = s.consumer();
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("4096"));
        assert_eq!(c.get("fetch.max.bytes"), Some("4194304"));
        s.max_outstanding_bytes = Some(1 << 20);
        s.bounded_by(Some(64 << 20));
        assert_eq!(
            s.max_outstanding_bytes,
            Some(1 << 20),
            "a smaller flag is kept"
        );
    }

    #[test]
    fn positions_are_the_strings_earlier_runs_wrote() {
        let a = KafkaArgs {
            kafka_topic: vec!["t".into()],
            kafka_topic_pattern: None,
            kafka_group: Some("g/x".into()),
            kafka_option: vec![],
            kafka_dead_letter_topic: None,
        };
        let s = a.settings("kafka://a:9092", "s").unwrap();
        // Moved from table/delta.rs (the txn application id is made here now).
        let p0 = s.streams().key("t", 0).app_id();
        assert_eq!(p0, "subsink-kafka/g/x/t/0");
        assert_eq!(
            s.streams().key("t", 0).seed(15),
            "subsink-kafka\ng/x\nt\n0\n15"
        );
    }
}
