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
//! settle side ([`crate::settle::kafka`]) after settling, and retried until the broker takes them.
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
//! ## Failures
//! A record whose delivery failed (the sink refused it, or its file failed) is handed back to the
//! source after the retry policy's backoff and written again (attempt + 1); its partition goes on
//! meanwhile. At `maxDeliveryAttempts` it goes to `--kafka-dead-letter-topic`; without one its
//! partition stops (paused, its watermark held below the record) with an error naming the record.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{BorrowedMessage, Headers, Message as _};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio::sync::{mpsc, Notify};

use super::flags::FlagsError;
use super::{Source, SourceEvent};
use crate::config::{DeliverySettings, StorageSettings};
use crate::flow::{message_bytes, FlowLimit};
use crate::message::{Attributes, Message, Receipt, Received};
use crate::sink::bigquery::{BigQueryClient, BigQueryOutput, KafkaRows, WriteMode};
use crate::sink::delta::DeltaSettings;
use crate::sink::object::{ExactNames, ObjectSettings};
use crate::table::delta::{kafka_app_id, TxnVersions};
use crate::upload::Destination;

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

/// Records handed out at once.
const CHUNK: usize = 500;
/// Chunks waiting for [`Source::next`].
const CHANNEL_CAPACITY: usize = 16;
/// How long the topic check waits for the brokers.
const METADATA_TIMEOUT: Duration = Duration::from_secs(15);
/// Client settings subsink sets and refuses from `--kafka-option`, with why.
const FIXED: [(&str, &str); 4] = [
    (
        "enable.auto.commit",
        "offsets are committed only once the records below them are durable",
    ),
    (
        "enable.auto.offset.store",
        "offsets are committed only once the records below them are durable",
    ),
    ("group.id", "give --kafka-group"),
    (
        "bootstrap.servers",
        "give the brokers in --source kafka://HOST:PORT,…",
    ),
];

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
    /// `--exactly-once`: where what earlier runs wrote is looked up.
    pub exactly_once: Option<Exact>,
}

/// `--exactly-once` (docs/kafka.md#exactly-once): how a run finds, before writing a partition's
/// first record, what an earlier run wrote of it without committing its offsets.
#[derive(Clone)]
pub enum Exact {
    /// Into objects: the files, by their derived names.
    Objects(ExactRecovery),
    /// Into a Delta table: the partitions' `txn` versions.
    Delta(ExactDelta),
    /// Into a BigQuery table: the partitions' highest offsets among the table's rows.
    BigQuery(ExactBigQuery),
}

/// `--exactly-once` into a BigQuery table: every row carries its record's `message_id`
/// (`writeMetadata`) and a partition's batches are committed in offset order
/// ([`crate::sink::bigquery`]). Before the first record of a partition (after every assignment)
/// is written, one query asks the table for the partition's highest offset among the
/// subscription's rows: the records up to it are skipped and the offset after it is committed.
#[derive(Clone)]
pub struct ExactBigQuery {
    pub rows: KafkaRows,
    rest: Option<String>,
    storage: Option<String>,
    /// Made on first use, inside the runtime (its gRPC channel starts a worker there).
    client: Arc<tokio::sync::OnceCell<BigQueryClient>>,
}

impl ExactBigQuery {
    /// The highest offset of `tp` in the table, if it holds any.
    async fn last_offset(&self, tp: &Tp) -> Result<Option<i64>, String> {
        let client = self
            .client
            .get_or_try_init(|| async {
                BigQueryClient::new(self.rest.as_deref(), self.storage.as_deref())
            })
            .await
            .map_err(|e| e.to_string())?;
        let found = self
            .rows
            .last_offsets(client, std::slice::from_ref(tp))
            .await
            .map_err(|e| e.to_string())?;
        Ok(found.get(tp).copied())
    }
}

/// `--exactly-once` into a Delta table (kafka-delta-ingest's way): every commit carries a `txn`
/// action per partition it holds records of (application id
/// [`crate::table::delta::kafka_app_id`], version = the partition's last offset in the commit,
/// [`crate::sink::delta`]). Before the first record of a partition (after every assignment) is
/// written, the table's version for the partition is read: the records up to it are skipped and
/// the offset after it is committed.
#[derive(Clone)]
pub struct ExactDelta {
    pub group: String,
    pub dest: Destination,
    versions: Arc<tokio::sync::Mutex<TxnVersions>>,
}

/// `--exactly-once` with objects (docs/kafka.md#exactly-once): before the first record of a
/// partition (after every assignment) is written, the file a run would have started with it is
/// looked up by its derived name ([`ExactNames`]); when a crashed run left it, its last offset is
/// read back from its records (`message_id` = `TOPIC/PARTITION/OFFSET`), the records up to it are
/// skipped, that offset + 1 is committed, and the next record is looked up the same way.
#[derive(Clone)]
pub struct ExactRecovery {
    pub names: ExactNames,
    pub storage: StorageSettings,
    pub dest: Destination,
}

/// Under `--exactly-once` a refused record stops its partition: producing a dead letter is not
/// atomic with what the destination commits (`what`).
fn no_dead_letter_topic(kafka: &KafkaSettings, what: &str) -> Result<(), String> {
    match kafka.dead_letter_topic {
        Some(_) => Err(format!("--exactly-once with Kafka: --kafka-dead-letter-topic is not available (producing a dead letter is not atomic with {what}; a refused record stops its partition instead)")),
        None => Ok(()),
    }
}

/// Check that `--exactly-once` can hold for a Kafka source writing objects, and set both sides up
/// (exit 2 with the reason otherwise).
pub fn exactly_once_objects(
    kafka: &mut KafkaSettings,
    objects: &mut ObjectSettings,
    storage: &StorageSettings,
) -> Result<(), String> {
    use crate::config::OutputFormat;
    let why = match storage.output {
        OutputFormat::Text => Some("Text files do not carry the records' offsets, so a restart cannot find where a file of a crashed run ends; use avroConfig.writeMetadata"),
        OutputFormat::Avro { write_metadata: false, .. } => Some("Avro without writeMetadata does not carry the records' offsets (message_id), so a restart cannot find where a file of a crashed run ends; set avroConfig.writeMetadata"),
        OutputFormat::Avro { use_topic_schema: true, .. } => Some("useTopicSchema writes one file per schema revision, so a partition's records would not follow one another file by file"),
        OutputFormat::Avro { .. } => None,
    };
    if let Some(why) = why {
        return Err(format!("--exactly-once with Kafka: {why}"));
    }
    no_dead_letter_topic(kafka, "the files")?;
    let names = ExactNames {
        group: kafka.group.clone(),
    };
    objects.exact = Some(names.clone());
    kafka.exactly_once = Some(Exact::Objects(ExactRecovery {
        names,
        storage: storage.clone(),
        dest: objects.dest.clone(),
    }));
    Ok(())
}

/// Check that `--exactly-once` can hold for a Kafka source writing a Delta table, and set both
/// sides up (exit 2 with the reason otherwise).
pub fn exactly_once_delta(
    kafka: &mut KafkaSettings,
    delta: &mut DeltaSettings,
) -> Result<(), String> {
    no_dead_letter_topic(kafka, "the table's commits")?;
    delta.kafka_group = Some(kafka.group.clone());
    kafka.exactly_once = Some(Exact::Delta(ExactDelta {
        group: kafka.group.clone(),
        dest: delta.dest.clone(),
        versions: Arc::new(tokio::sync::Mutex::new(TxnVersions::new(&delta.dest))),
    }));
    Ok(())
}

/// Check that `--exactly-once` can hold for a Kafka source writing a BigQuery table (its rows must
/// carry their offsets: `writeMetadata`), and set both sides up (exit 2 with the reason
/// otherwise). `subscription`: the subscription's name, as its rows' `subscription_name` holds it.
pub fn exactly_once_bigquery(
    kafka: &mut KafkaSettings,
    out: &mut BigQueryOutput,
    write_metadata: bool,
    subscription: &str,
) -> Result<(), String> {
    if !write_metadata {
        return Err("--exactly-once with Kafka into BigQuery: without bigqueryConfig.writeMetadata the rows do not carry the records' offsets (message_id), so a restart cannot find what a crashed run committed; set bigqueryConfig.writeMetadata".into());
    }
    no_dead_letter_topic(kafka, "the table's commits")?;
    let rows = KafkaRows {
        table: out.table.clone(),
        subscription: subscription.to_string(),
    };
    out.mode = WriteMode::ExactlyOnce;
    out.kafka = Some(rows.clone());
    kafka.exactly_once = Some(Exact::BigQuery(ExactBigQuery {
        rows,
        rest: out.rest.clone(),
        storage: out.storage.clone(),
        client: Default::default(),
    }));
    Ok(())
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
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", "subsink")
            .set("log_level", "4");
        for (k, v) in &self.options {
            c.set(k, v);
        }
        c
    }

    fn consumer(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", "subsink")
            .set("log_level", "4")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky");
        for (k, v) in &self.options {
            c.set(k, v);
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

/// One assigned partition's delivered and unsettled records.
#[derive(Debug, Default)]
struct Partition {
    /// Offset → flow-control bytes of the record, for every record delivered and not settled.
    outstanding: BTreeMap<i64, u64>,
    /// One past the highest offset delivered.
    next: i64,
    /// The offset last committed (or found committed: the first delivered), `None` before any.
    committed: Option<i64>,
    /// Stopped on a record that could not be written nor dead-lettered.
    stopped: bool,
    /// `--exactly-once`: the next record was looked up ([`ExactRecovery`]): it starts no file of
    /// an earlier run.
    checked: bool,
    /// `--exactly-once`: records up to this offset are in a file of an earlier run.
    skip_through: Option<i64>,
}

impl Partition {
    /// The offset to commit: every record below it is settled.
    fn watermark(&self) -> i64 {
        self.outstanding.keys().next().copied().unwrap_or(self.next)
    }
}

pub use crate::message::kafka_id::{parse_id, Tp};

/// What the source and its settle side share: per assigned partition, the records delivered and
/// not settled (their watermark is what may be committed), and the totals flow control counts.
#[derive(Debug, Default)]
pub struct Offsets {
    parts: Mutex<State>,
    /// Something was settled: the source looks at flow control again.
    pub settled: Notify,
    /// A rebalance happened: the source pauses the new assignment if it is paused.
    rebalanced: AtomicBool,
    /// No broker answers (librdkafka's all-brokers-down), until the next record or assignment.
    down: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    parts: HashMap<Tp, Partition>,
    messages: u64,
    bytes: u64,
}

impl Offsets {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.parts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A record was delivered (again, for a redelivery: then it is outstanding already).
    fn delivered(&self, tp: &Tp, offset: i64, bytes: u64) {
        let mut s = self.lock();
        let p = s.parts.entry(tp.clone()).or_default();
        if p.committed.is_none() {
            // Read from the group's committed offset (or the reset position): nothing to commit
            // below it.
            p.committed = Some(offset);
        }
        p.next = p.next.max(offset + 1);
        let new = p.outstanding.insert(offset, bytes).is_none();
        if new {
            s.messages += 1;
            s.bytes += bytes;
        }
    }

    /// The records `ids` (`TOPIC/PARTITION/OFFSET`) are settled. Ids of partitions no longer
    /// assigned are ignored (their next owner reads them again).
    pub fn settle<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut s = self.lock();
        let (mut messages, mut bytes) = (0, 0);
        for id in ids {
            let Some((tp, offset)) = parse_id(id) else {
                continue;
            };
            if let Some(b) = s
                .parts
                .get_mut(&tp)
                .and_then(|p| p.outstanding.remove(&offset))
            {
                messages += 1;
                bytes += b;
            }
        }
        s.messages -= messages;
        s.bytes -= bytes;
        drop(s);
        if messages > 0 {
            self.settled.notify_one();
        }
    }

    /// The partitions whose watermark is past their committed offset, with that watermark.
    pub fn to_commit(&self) -> Vec<(Tp, i64)> {
        let s = self.lock();
        s.parts
            .iter()
            .filter_map(|(tp, p)| {
                let w = p.watermark();
                (p.committed.is_some_and(|c| w > c)).then(|| (tp.clone(), w))
            })
            .collect()
    }

    /// `offsets` were committed.
    pub fn committed(&self, offsets: &[(Tp, i64)]) {
        let mut s = self.lock();
        for (tp, o) in offsets {
            if let Some(p) = s.parts.get_mut(tp) {
                p.committed = Some(p.committed.map_or(*o, |c| c.max(*o)));
            }
        }
    }

    /// `--exactly-once`: has `tp`'s next record been looked up?
    fn checked(&self, tp: &Tp) -> bool {
        self.lock().parts.get(tp).is_some_and(|p| p.checked)
    }

    /// `--exactly-once`: what to do with `tp`'s record `offset` before it is looked up: `true`
    /// when a file of an earlier run holds it (skipped: settled as it is).
    fn skip(&self, tp: &Tp, offset: i64) -> bool {
        let mut s = self.lock();
        let p = s.parts.entry(tp.clone()).or_default();
        if p.committed.is_none() {
            p.committed = Some(offset);
        }
        match p.skip_through {
            Some(last) if offset <= last => {
                p.next = p.next.max(offset + 1);
                true
            }
            _ => false,
        }
    }

    /// `--exactly-once`: a file of an earlier run holds `tp`'s records up to `last`; the record
    /// after it is looked up next.
    fn found(&self, tp: &Tp, last: i64) {
        let mut s = self.lock();
        let p = s.parts.entry(tp.clone()).or_default();
        p.skip_through = Some(last);
        p.next = p.next.max(last + 1);
    }

    /// `--exactly-once`: `tp`'s next record starts no file of an earlier run.
    fn set_checked(&self, tp: &Tp) {
        if let Some(p) = self.lock().parts.get_mut(tp) {
            p.checked = true;
        }
    }

    /// Is `tp`'s partition stopped (or no longer assigned)?
    pub fn is_stopped(&self, tp: &Tp) -> bool {
        self.lock().parts.get(tp).is_none_or(|p| p.stopped)
    }

    /// `--exactly-once`: `tp`'s record `offset` is not written (its partition stopped): it no
    /// longer counts for flow control. The watermark stays below the record that stopped the
    /// partition (still outstanding), so nothing past it is committed.
    pub fn forget(&self, tp: &Tp, offset: i64) {
        let mut s = self.lock();
        let Some(p) = s.parts.get_mut(tp) else {
            return;
        };
        if p.outstanding.keys().next().is_some_and(|low| *low < offset) {
            if let Some(b) = p.outstanding.remove(&offset) {
                s.messages -= 1;
                s.bytes -= b;
            }
        }
    }

    /// Is `tp` assigned here?
    pub fn is_assigned(&self, tp: &Tp) -> bool {
        self.lock().parts.contains_key(tp)
    }

    /// Stop `tp`'s partition: its watermark stays where it is; the source pauses it.
    pub fn stop_partition(&self, tp: &Tp) {
        if let Some(p) = self.lock().parts.get_mut(tp) {
            p.stopped = true;
        }
        self.rebalanced.store(true, Ordering::SeqCst);
        self.settled.notify_one();
    }

    /// The partitions stopped on a record.
    fn stopped(&self) -> Vec<Tp> {
        self.lock()
            .parts
            .iter()
            .filter(|(_, p)| p.stopped)
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    /// Released partitions: forgotten, their records no longer counted.
    fn release(&self, tps: &[Tp]) {
        let mut s = self.lock();
        for tp in tps {
            if let Some(p) = s.parts.remove(tp) {
                s.messages -= p.outstanding.len() as u64;
                s.bytes -= p.outstanding.values().sum::<u64>();
            }
        }
    }

    /// The watermarks of `tps` that are past their committed offsets.
    fn watermarks_of(&self, tps: &[Tp]) -> Vec<(Tp, i64)> {
        let s = self.lock();
        tps.iter()
            .filter_map(|tp| {
                let p = s.parts.get(tp)?;
                let w = p.watermark();
                p.committed.is_some_and(|c| w > c).then(|| (tp.clone(), w))
            })
            .collect()
    }

    /// Records and bytes delivered and not settled.
    pub fn outstanding(&self) -> (u64, u64) {
        let s = self.lock();
        (s.messages, s.bytes)
    }
}

/// A list of partitions with the offsets to commit.
pub fn commit_list(offsets: &[(Tp, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for ((t, p), o) in offsets {
        let _ = tpl.add_partition_offset(t, *p, Offset::Offset(*o));
    }
    tpl
}

/// The consumer's callbacks: rebalances and client errors.
pub struct KafkaContext {
    offsets: Arc<Offsets>,
}

impl ClientContext for KafkaContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        use rdkafka::types::RDKafkaErrorCode;
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.offsets.down.store(true, Ordering::Relaxed);
        }
        tracing::warn!(error = %error, "Kafka client: {reason}");
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(facility = fac, "librdkafka: {log_message}")
            }
            L::Warning => tracing::warn!(facility = fac, "librdkafka: {log_message}"),
            _ => tracing::debug!(facility = fac, "librdkafka: {log_message}"),
        }
    }
}

fn tps_of(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

impl ConsumerContext for KafkaContext {
    /// Before partitions are released: commit their watermarks (the durable part), then forget
    /// them; their open files still become durable, and what they hold past the watermark is
    /// read again by the next owner.
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let tps = tps_of(tpl);
            let marks = self.offsets.watermarks_of(&tps);
            if !marks.is_empty() && !consumer.assignment_lost() {
                match consumer.commit(&commit_list(&marks), CommitMode::Sync) {
                    Ok(()) => self.offsets.committed(&marks),
                    Err(e) => {
                        tracing::warn!(error = %e, "Kafka: committing revoked partitions failed")
                    }
                }
            }
            self.offsets.release(&tps);
            tracing::info!(partitions = ?tps, "Kafka: partitions revoked");
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                self.offsets.down.store(false, Ordering::Relaxed);
                tracing::info!(partitions = ?tps_of(tpl), "Kafka: partitions assigned");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!(error = %e, "Kafka: rebalance failed"),
        }
        self.offsets.rebalanced.store(true, Ordering::SeqCst);
    }
}

pub type KafkaConsumer = StreamConsumer<KafkaContext>;

/// A consumer subscribed to the topics, ready for the registry to start
/// ([`crate::registry::connect`]).
pub struct KafkaConnection {
    pub consumer: Arc<KafkaConsumer>,
    pub offsets: Arc<Offsets>,
    /// The dead-letter topic's producer, and the topic.
    pub dead_letter: Option<(rdkafka::producer::FutureProducer, String)>,
    /// Deliveries a record gets before it is dead-lettered, or its partition stopped.
    pub max_attempts: u32,
    pub settings: KafkaSettings,
}

/// Make the consumer, check the named topics and the dead-letter topic, subscribe.
pub async fn connect(
    settings: KafkaSettings,
    delivery: &DeliverySettings,
) -> Result<KafkaConnection, KafkaError> {
    let max_attempts = delivery
        .dead_letter
        .as_ref()
        .map_or(DEFAULT_MAX_DELIVERY_ATTEMPTS, |(_, max)| *max);
    if let Some(Exact::Objects(exact)) = &settings.exactly_once {
        // Derived names are only as good as the store's put-if-absent (a Delta table checks its
        // own when it is opened).
        crate::upload::check_put_if_absent(&exact.dest)
            .await
            .map_err(|e| {
                KafkaError::ExactlyOnce(format!(
                    "the bucket {} has no atomic put-if-absent ({e})",
                    exact.dest.url
                ))
            })?;
    }
    let offsets = Arc::new(Offsets::default());
    let client_err = |e: rdkafka::error::KafkaError| KafkaError::Client {
        brokers: settings.brokers.clone(),
        message: e.to_string(),
    };
    let consumer: KafkaConsumer = settings
        .consumer()
        .create_with_context(KafkaContext {
            offsets: offsets.clone(),
        })
        .map_err(|e| match e {
            rdkafka::error::KafkaError::ClientConfig(..) => KafkaError::Option(e.to_string()),
            e => client_err(e),
        })?;
    let consumer = Arc::new(consumer);
    let named: Vec<String> = settings
        .topics
        .iter()
        .chain(&settings.dead_letter_topic)
        .cloned()
        .collect();
    let c = consumer.clone();
    let brokers = settings.brokers.clone();
    tokio::task::spawn_blocking(move || check_topics(&c, &named, &brokers))
        .await
        .map_err(|e| KafkaError::Client {
            brokers: settings.brokers.clone(),
            message: e.to_string(),
        })??;
    let subscription = settings.subscription();
    let refs: Vec<&str> = subscription.iter().map(String::as_str).collect();
    consumer.subscribe(&refs).map_err(client_err)?;
    let dead_letter = match &settings.dead_letter_topic {
        Some(t) => {
            let p: rdkafka::producer::FutureProducer =
                crate::sink::publish::producer_config(&settings.client())
                    .create()
                    .map_err(client_err)?;
            Some((p, t.clone()))
        }
        None => None,
    };
    Ok(KafkaConnection {
        consumer,
        offsets,
        dead_letter,
        max_attempts,
        settings,
    })
}

/// Every topic in `topics` exists (a consumer does not create it).
fn check_topics(c: &KafkaConsumer, topics: &[String], brokers: &str) -> Result<(), KafkaError> {
    for t in topics {
        let md = c
            .fetch_metadata(Some(t), METADATA_TIMEOUT)
            .map_err(|e| KafkaError::Client {
                brokers: brokers.to_string(),
                message: format!("cannot read the metadata of topic {t:?}: {e}"),
            })?;
        let found = md.topics().iter().find(|m| m.name() == t);
        match found {
            Some(m) if m.error().is_none() && !m.partitions().is_empty() => {}
            Some(m) => {
                return Err(KafkaError::Topic {
                    topic: t.clone(),
                    message: match m.error() {
                        Some(e) => format!(
                            "{} (the brokers do not create topics for a consumer)",
                            rdkafka::types::RDKafkaErrorCode::from(e)
                        ),
                        None => "the topic has no partitions".into(),
                    },
                })
            }
            None => {
                return Err(KafkaError::Topic {
                    topic: t.clone(),
                    message: "the brokers do not have it".into(),
                })
            }
        }
    }
    Ok(())
}

/// The record `m` as a message (see the module docs for the mapping).
pub fn received(m: &BorrowedMessage<'_>, ordering: bool) -> Received {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (topic, partition, offset) = (m.topic(), m.partition(), m.offset());
    let mut attrs: BTreeMap<String, String> = BTreeMap::new();
    let mut base64_headers: Vec<&str> = Vec::new();
    if let Some(h) = m.headers() {
        for h in h.iter() {
            let v = match h.value {
                None => String::new(),
                Some(v) => match std::str::from_utf8(v) {
                    Ok(s) => s.to_string(),
                    Err(_) => {
                        if !base64_headers.contains(&h.key) {
                            base64_headers.push(h.key);
                        }
                        b64.encode(v)
                    }
                },
            };
            attrs
                .entry(h.key.to_string())
                .and_modify(|e| {
                    e.push_str(", ");
                    e.push_str(&v);
                })
                .or_insert(v);
        }
    }
    if !base64_headers.is_empty() {
        base64_headers.sort_unstable();
        attrs.insert(BASE64_HEADERS_ATTRIBUTE.into(), base64_headers.join(","));
    }
    attrs.insert(TOPIC_ATTRIBUTE.into(), topic.to_string());
    attrs.insert(PARTITION_ATTRIBUTE.into(), partition.to_string());
    attrs.insert(OFFSET_ATTRIBUTE.into(), offset.to_string());
    let key = m.key().map(|k| match std::str::from_utf8(k) {
        Ok(s) => s.to_string(),
        Err(_) => {
            attrs.insert(KEY_ENCODING_ATTRIBUTE.into(), "base64".into());
            b64.encode(k)
        }
    });
    if let Some(k) = &key {
        attrs.insert(KEY_ATTRIBUTE.into(), k.clone());
    }
    let data = match m.payload() {
        Some(v) => bytes::Bytes::copy_from_slice(v),
        None => {
            attrs.insert(TOMBSTONE_ATTRIBUTE.into(), "true".into());
            bytes::Bytes::new()
        }
    };
    let publish_time_micros = m
        .timestamp()
        .to_millis()
        .filter(|t| *t >= 0)
        .map(|t| t * 1000)
        .unwrap_or_else(|| chrono::Utc::now().timestamp_micros());
    let message_id = format!("{topic}/{partition}/{offset}");
    Received {
        msg: Message {
            data,
            attributes: Attributes::from_iter(attrs),
            message_id: message_id.clone(),
            publish_time_micros,
            ordering_key: if ordering {
                key.unwrap_or_default()
            } else {
                String::new()
            },
        },
        receipt: Receipt {
            ack_id: Some(message_id),
            delivery_attempt: Some(1),
            ..Receipt::default()
        },
    }
}

/// The source's stop signal.
#[derive(Default)]
struct StopSignal {
    stopped: AtomicBool,
    notify: Notify,
}

/// A running consumer.
pub struct KafkaSource {
    rx: mpsc::Receiver<SourceEvent>,
    /// Records handed back for another delivery ([`KafkaSource::redeliver`]).
    retry_rx: mpsc::UnboundedReceiver<Received>,
    retry_tx: mpsc::UnboundedSender<Received>,
    stop: Arc<StopSignal>,
    name: String,
    offsets: Arc<Offsets>,
    flow: Option<FlowLimit>,
    paused: Arc<AtomicBool>,
    reading: bool,
}

impl KafkaSource {
    /// Start reading `consumer` on its own task.
    pub fn start(c: &KafkaConnection, name: String) -> KafkaSource {
        let s = &c.settings;
        let flow = FlowLimit::new(
            s.max_outstanding_messages.map_or(0, |v| v as i64),
            s.max_outstanding_bytes.map_or(0, |v| v as i64),
        );
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (retry_tx, retry_rx) = mpsc::unbounded_channel();
        let stop = Arc::new(StopSignal::default());
        let paused = Arc::new(AtomicBool::new(false));
        tokio::spawn(read_loop(
            c.consumer.clone(),
            c.offsets.clone(),
            tx,
            stop.clone(),
            (flow, paused.clone()),
            s.ordering,
            s.exactly_once.clone(),
        ));
        KafkaSource {
            rx,
            retry_rx,
            retry_tx,
            stop,
            name,
            offsets: c.offsets.clone(),
            flow,
            paused,
            reading: true,
        }
    }

    /// Where the settle side hands a record back for another delivery.
    pub fn redeliver(&self) -> mpsc::UnboundedSender<Received> {
        self.retry_tx.clone()
    }
}

/// Are the records delivered and not settled at a flow-control limit?
fn over_limit(offsets: &Offsets, flow: Option<FlowLimit>) -> bool {
    flow.is_some_and(|f| {
        let (m, b) = offsets.outstanding();
        f.messages.is_some_and(|l| m >= l) || f.bytes.is_some_and(|l| b >= l)
    })
}

/// Pause or resume every assigned partition as flow control says (stopped partitions stay
/// paused).
fn apply_flow(
    consumer: &KafkaConsumer,
    offsets: &Offsets,
    flow: Option<FlowLimit>,
    paused: &AtomicBool,
) {
    let over = over_limit(offsets, flow);
    let rebalanced = offsets.rebalanced.swap(false, Ordering::SeqCst);
    if over == paused.load(Ordering::Relaxed) && !rebalanced {
        return;
    }
    let Ok(assigned) = consumer.assignment() else {
        return;
    };
    let stopped = offsets.stopped();
    if over {
        let _ = consumer.pause(&assigned);
    } else {
        let mut resume = TopicPartitionList::new();
        let mut stop = TopicPartitionList::new();
        for e in assigned.elements() {
            let tp = (e.topic().to_string(), e.partition());
            let list = if stopped.contains(&tp) {
                &mut stop
            } else {
                &mut resume
            };
            list.add_partition(e.topic(), e.partition());
        }
        let _ = consumer.resume(&resume);
        if stop.count() > 0 {
            let _ = consumer.pause(&stop);
        }
    }
    if over != paused.swap(over, Ordering::Relaxed) {
        tracing::debug!(paused = over, "Kafka flow control");
    }
}

async fn read_loop(
    consumer: Arc<KafkaConsumer>,
    offsets: Arc<Offsets>,
    tx: mpsc::Sender<SourceEvent>,
    stop: Arc<StopSignal>,
    (flow, paused): (Option<FlowLimit>, Arc<AtomicBool>),
    ordering: bool,
    exact: Option<Exact>,
) {
    use futures::FutureExt;
    while !stop.stopped.load(Ordering::SeqCst) {
        apply_flow(&consumer, &offsets, flow, &paused);
        let first = tokio::select! {
            m = consumer.recv() => m,
            _ = offsets.settled.notified() => continue,
            _ = stop.notify.notified() => break,
            // Rebalances and pauses are looked at again now and then while nothing comes.
            _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
        };
        // A borrowed message is not `Send`: none lives past this block.
        let (mut out, unchecked) = {
            let mut out = Vec::new();
            // `--exactly-once`: records of partitions whose next record is still to be looked up.
            let mut unchecked = Vec::new();
            let mut next = Some(first);
            while let Some(m) = next.take() {
                match m {
                    Ok(m) => {
                        let r = received(&m, ordering);
                        let tp = (m.topic().to_string(), m.partition());
                        offsets.down.store(false, Ordering::Relaxed);
                        if exact.is_some() && !offsets.checked(&tp) {
                            unchecked.push((tp, m.offset(), r));
                        } else {
                            offsets.delivered(&tp, m.offset(), message_bytes(&r.msg));
                            out.push(r);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "Kafka consumer"),
                }
                // A chunk ends at the flow-control limit: the partitions are paused before more.
                if out.len() + unchecked.len() < CHUNK && !over_limit(&offsets, flow) {
                    next = consumer.recv().now_or_never();
                }
            }
            (out, unchecked)
        };
        if let Some(exact) = &exact {
            for (tp, offset, r) in unchecked {
                if recover(exact, &consumer, &offsets, &tp, offset, &r).await {
                    continue;
                }
                offsets.delivered(&tp, offset, message_bytes(&r.msg));
                out.push(r);
            }
        }
        if !out.is_empty() && tx.send(SourceEvent::Messages(out)).await.is_err() {
            return;
        }
    }
}

/// `--exactly-once`: is `tp`'s record `offset` (`r`) written already by an earlier run? Looks it
/// up ([`Exact`]) unless what was found before holds it: a file of an earlier run by its derived
/// name, the Delta table's `txn` version of the partition, or its highest offset in a BigQuery
/// table. What is found moves the committed
/// offset past it. `false`: write it (the partition is checked from here on).
async fn recover(
    exact: &Exact,
    consumer: &Arc<KafkaConsumer>,
    offsets: &Offsets,
    tp: &Tp,
    offset: i64,
    r: &Received,
) -> bool {
    if offsets.skip(tp, offset) {
        return true;
    }
    if offsets.checked(tp) {
        return false;
    }
    // What is looked up: an object name, or a `txn` application id.
    let what = match exact {
        Exact::Objects(o) => {
            o.names
                .name(&o.storage, &tp.0, tp.1, offset, r.msg.publish_time_micros)
        }
        Exact::Delta(d) => kafka_app_id(&d.group, &tp.0, tp.1),
        Exact::BigQuery(b) => format!("{}/{}/ in {}", tp.0, tp.1, b.rows.table),
    };
    let mut wait = Duration::from_millis(200);
    let found = loop {
        let looked = match exact {
            Exact::Objects(o) => last_offset(&o.dest, &what, tp).await,
            Exact::Delta(d) => match d.versions.lock().await.version(&what).await {
                Ok(v) => Ok(v.filter(|v| *v >= offset)),
                Err(e) => Err(e.to_string()),
            },
            Exact::BigQuery(b) => b.last_offset(tp).await.map(|v| v.filter(|v| *v >= offset)),
        };
        match looked {
            Ok(found) => break found,
            Err(e) if wait < Duration::from_secs(10) => {
                tracing::warn!(lookup = %what, "Kafka --exactly-once: looking up what an earlier run wrote from {}/{}/{offset} failed ({e}); trying again in {wait:?}", tp.0, tp.1);
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            Err(e) => {
                tracing::error!(lookup = %what, "Kafka partition {}/{} stopped: what an earlier run wrote from record {}/{}/{offset} cannot be read back ({e}); restart to try again", tp.0, tp.1, tp.0, tp.1);
                offsets.stop_partition(tp);
                return true;
            }
        }
    };
    match found {
        Some(last) => {
            match exact {
                Exact::Objects(_) => {
                    tracing::info!(object = %what, "Kafka --exactly-once: {}/{} offsets {offset}..={last} are in a file of an earlier run; committing {}", tp.0, tp.1, last + 1)
                }
                Exact::Delta(_) => {
                    tracing::info!(app_id = %what, "Kafka --exactly-once: {}/{} offsets {offset}..={last} are in the Delta table already (txn version {last}); committing {}", tp.0, tp.1, last + 1)
                }
                Exact::BigQuery(_) => {
                    tracing::info!(lookup = %what, "Kafka --exactly-once: {}/{} offsets {offset}..={last} are in the BigQuery table already (its highest offset there); committing {}", tp.0, tp.1, last + 1)
                }
            }
            offsets.found(tp, last);
            let (c, list) = (consumer.clone(), commit_list(&[(tp.clone(), last + 1)]));
            let committed =
                tokio::task::spawn_blocking(move || c.commit(&list, CommitMode::Sync)).await;
            if let Ok(Ok(())) = committed {
                offsets.committed(&[(tp.clone(), last + 1)]);
            }
            // Later records up to `last` are skipped; the one after it is looked up (a table's
            // version is then below it: the partition is checked).
            offsets.skip(tp, offset)
        }
        None => {
            offsets.set_checked(tp);
            false
        }
    }
}

/// The last offset of `tp` in the object `name`, or `None` when there is no such object. An
/// object that is not Avro with metadata, or holds another partition, is an error.
async fn last_offset(dest: &Destination, name: &str, tp: &Tp) -> Result<Option<i64>, String> {
    use object_store::ObjectStoreExt;
    let path = object_store::path::Path::parse(name).map_err(|e| e.to_string())?;
    let bytes = match dest.store.get(&path).await {
        Ok(r) => r.bytes().await.map_err(|e| e.to_string())?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let reader = apache_avro::Reader::new(&bytes[..]).map_err(|e| e.to_string())?;
    let mut last = None;
    for v in reader {
        let v = v.map_err(|e| e.to_string())?;
        let apache_avro::types::Value::Record(fields) = v else {
            return Err("not a record".into());
        };
        let id = fields.iter().find_map(|(k, v)| match (k.as_str(), v) {
            ("message_id", apache_avro::types::Value::String(s)) => Some(s.clone()),
            _ => None,
        });
        let Some((rtp, o)) = id.as_deref().and_then(parse_id) else {
            return Err("a record without a Kafka message_id (TOPIC/PARTITION/OFFSET)".into());
        };
        if &rtp != tp {
            return Err(format!("a record of {}/{}", rtp.0, rtp.1));
        }
        last = Some(last.map_or(o, |l: i64| l.max(o)));
    }
    last.map(Some).ok_or_else(|| "no records".to_string())
}

#[async_trait::async_trait]
impl Source for KafkaSource {
    async fn next(&mut self) -> Option<SourceEvent> {
        if !self.reading {
            return None;
        }
        tokio::select! {
            biased;
            Some(r) = self.retry_rx.recv() => Some(SourceEvent::Messages(vec![r])),
            e = self.rx.recv() => {
                if e.is_none() {
                    self.reading = false;
                }
                e
            }
        }
    }

    fn describe(&self) -> &str {
        &self.name
    }

    /// A broker answers (librdkafka has not said that all are down since the last record or
    /// assignment).
    fn connected(&self) -> bool {
        !self.offsets.down.load(Ordering::Relaxed)
    }

    /// Read no more; what was read is handed out, then `next()` returns `None`. Records handed
    /// back for redelivery are left: their offsets are not committed.
    fn stop(&mut self) -> bool {
        self.stop.stopped.store(true, Ordering::SeqCst);
        self.stop.notify.notify_waiters();
        true
    }

    fn flow_limit(&self) -> Option<FlowLimit> {
        self.flow
    }

    /// Every partition is paused by flow control.
    fn held_back(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }
}

/// The Kafka source's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = crate::cli::heading::KAFKA)]
pub struct KafkaArgs {
    /// Kafka source: a topic to read (repeatable).
    #[arg(long, value_name = "TOPIC")]
    pub kafka_topic: Vec<String>,
    /// Kafka source: read every topic whose name matches this regex (instead of --kafka-topic).
    #[arg(long, value_name = "REGEX")]
    pub kafka_topic_pattern: Option<String>,
    /// Kafka source: the consumer group (default: the subscription's short ID).
    #[arg(long, value_name = "GROUP")]
    pub kafka_group: Option<String>,
    /// Kafka source: a librdkafka client setting, passed through (SASL, TLS, client.id, …;
    /// repeatable; values are never logged).
    #[arg(long, value_name = "KEY=VALUE")]
    pub kafka_option: Vec<String>,
    /// Kafka source: where a record goes after its last allowed delivery failed, with its
    /// headers and the CloudPubSubDeadLetterSource* headers (without it, such a record stops its
    /// partition).
    #[arg(long, value_name = "TOPIC")]
    pub kafka_dead_letter_topic: Option<String>,
}

impl KafkaArgs {
    /// Is any Kafka flag given?
    pub fn any(&self) -> bool {
        !self.kafka_topic.is_empty()
            || self.kafka_topic_pattern.is_some()
            || self.kafka_group.is_some()
            || !self.kafka_option.is_empty()
            || self.kafka_dead_letter_topic.is_some()
    }

    /// The source's settings for the brokers of `url` (`kafka://HOST:PORT,…`), for the
    /// subscription `subscription` (its short ID is the default group).
    pub fn settings(&self, url: &str, subscription: &str) -> Result<KafkaSettings, FlagsError> {
        let brokers = url
            .strip_prefix("kafka://")
            .unwrap_or(url)
            .trim_end_matches('/');
        if brokers.is_empty() || brokers.contains('/') {
            return Err(FlagsError::KafkaBrokers(url.to_string()));
        }
        match (&self.kafka_topic[..], &self.kafka_topic_pattern) {
            ([], None) => return Err(FlagsError::KafkaNeedsTopic),
            ([_, ..], Some(_)) => return Err(FlagsError::KafkaTopicAndPattern),
            _ => {}
        }
        if let Some(p) = &self.kafka_topic_pattern {
            regex_check(p)?;
        }
        let mut options = Vec::new();
        for o in &self.kafka_option {
            let Some((k, v)) = o.split_once('=') else {
                return Err(FlagsError::KafkaOption {
                    key: o.clone(),
                    why: "give KEY=VALUE".into(),
                });
            };
            let k = k.trim();
            if let Some((_, why)) = FIXED.iter().find(|(f, _)| *f == k) {
                return Err(FlagsError::KafkaOption {
                    key: k.to_string(),
                    why: format!("subsink sets it: {why}"),
                });
            }
            options.push((k.to_string(), v.to_string()));
        }
        let group = self.kafka_group.clone().unwrap_or_else(|| {
            subscription
                .rsplit('/')
                .next()
                .unwrap_or(subscription)
                .to_string()
        });
        Ok(KafkaSettings {
            brokers: brokers.to_string(),
            topics: self.kafka_topic.clone(),
            topic_pattern: self.kafka_topic_pattern.clone(),
            group,
            options,
            dead_letter_topic: self.kafka_dead_letter_topic.clone(),
            max_outstanding_messages: None,
            max_outstanding_bytes: None,
            ordering: false,
            exactly_once: None,
        })
    }
}

/// A pattern librdkafka would take: balanced brackets and parentheses, no trailing backslash
/// (librdkafka's own regex engine reports a bad one only later, as a consumer error).
fn regex_check(p: &str) -> Result<(), FlagsError> {
    let bad = |why: &str| FlagsError::KafkaPattern {
        pattern: p.to_string(),
        why: why.to_string(),
    };
    if p.is_empty() {
        return Err(bad("empty"));
    }
    let (mut paren, mut bracket, mut escaped) = (0i32, false, false);
    for c in p.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '[' if !bracket => bracket = true,
            ']' if bracket => bracket = false,
            '(' if !bracket => paren += 1,
            ')' if !bracket => paren -= 1,
            _ => {}
        }
        if paren < 0 {
            return Err(bad("unbalanced ')'"));
        }
    }
    if escaped || bracket || paren != 0 {
        return Err(bad("unbalanced or unfinished"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_watermarks_are_contiguous() {
        assert_eq!(
            parse_id("orders.eu/3/42"),
            Some((("orders.eu".into(), 3), 42))
        );
        assert_eq!(parse_id("x/y"), None);
        let o = Offsets::default();
        let tp: Tp = ("t".into(), 0);
        for off in 10..15 {
            o.delivered(&tp, off, 1);
        }
        assert_eq!(o.to_commit(), vec![]);
        o.settle(["t/0/11", "t/0/12"]);
        // 10 is not settled: nothing to commit.
        assert_eq!(o.to_commit(), vec![]);
        o.settle(["t/0/10"]);
        assert_eq!(o.to_commit(), vec![(tp.clone(), 13)]);
        o.committed(&[(tp.clone(), 13)]);
        o.settle(["t/0/13", "t/0/14", "other/0/1"]);
        assert_eq!(o.to_commit(), vec![(tp.clone(), 15)]);
        assert_eq!(o.outstanding(), (0, 0));
        o.delivered(&tp, 15, 7);
        o.delivered(&tp, 15, 7);
        assert_eq!(o.outstanding(), (1, 7));
        o.release(std::slice::from_ref(&tp));
        assert_eq!(o.outstanding(), (0, 0));
        o.settle(["t/0/15"]);
        assert_eq!(o.outstanding(), (0, 0));
    }

    #[test]
    fn exactly_once_skips_what_a_found_file_holds_and_a_stop_holds_the_watermark() {
        let o = Offsets::default();
        let tp: Tp = ("t".into(), 0);
        // The first record read is at the committed offset 10; a file of a killed run holds 10..=14.
        assert!(!o.skip(&tp, 10));
        o.found(&tp, 14);
        assert!(o.skip(&tp, 10) && o.skip(&tp, 14));
        assert!(!o.skip(&tp, 15));
        assert_eq!(o.to_commit(), vec![(tp.clone(), 15)]);
        assert!(!o.checked(&tp));
        o.set_checked(&tp);
        assert!(o.checked(&tp));
        // 15 failed: the partition stops; what comes after it is not written and not counted.
        o.delivered(&tp, 15, 1);
        o.delivered(&tp, 16, 1);
        o.stop_partition(&tp);
        assert!(o.is_stopped(&tp));
        o.forget(&tp, 16);
        o.forget(&tp, 15);
        assert_eq!(o.outstanding(), (1, 1));
        assert_eq!(o.to_commit(), vec![(tp.clone(), 15)]);
        // Names: a function of group, topic, partition and first offset.
        let g = ExactNames { group: "g".into() };
        assert_eq!(g.uuid("t", 0, 15), g.uuid("t", 0, 15));
        assert_ne!(g.uuid("t", 0, 15), g.uuid("t", 0, 16));
        assert_ne!(g.uuid("t", 0, 15), g.uuid("t", 1, 15));
        assert_ne!(
            g.uuid("t", 0, 15),
            ExactNames { group: "h".into() }.uuid("t", 0, 15)
        );
    }

    #[test]
    fn flags() {
        let a = KafkaArgs {
            kafka_topic: vec!["t".into()],
            kafka_topic_pattern: None,
            kafka_group: None,
            kafka_option: vec!["sasl.password=hunter2".into(), "client.id=me".into()],
            kafka_dead_letter_topic: None,
        };
        let s = a
            .settings("kafka://a:9092,b:9092", "projects/p/subscriptions/sub")
            .unwrap();
        assert_eq!(s.brokers, "a:9092,b:9092");
        assert_eq!(s.group, "sub");
        assert!(!format!("{s:?}").contains("hunter2"));
        let mut b = a.clone();
        b.kafka_option = vec!["enable.auto.commit=true".into()];
        assert!(b.settings("kafka://a:1", "s").is_err());
        let mut c = a.clone();
        c.kafka_topic_pattern = Some("orders\\..*".into());
        assert!(c.settings("kafka://a:1", "s").is_err());
        c.kafka_topic.clear();
        assert_eq!(
            c.settings("kafka://a:1", "s").unwrap().subscription(),
            vec!["^orders\\..*".to_string()]
        );
        c.kafka_topic_pattern = Some("(a".into());
        assert!(c.settings("kafka://a:1", "s").is_err());
    }
}
