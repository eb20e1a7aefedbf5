//! The Kafka consumer: its client callbacks (rebalances commit and release partitions), connecting
//! (the topics checked, the group joined), and a record as a message.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{BorrowedMessage, Headers, Message as _};
use rdkafka::{ClientContext, TopicPartitionList};

use super::offsets::{commit_list, Offsets, Tp};
use super::{
    KafkaError, KafkaSettings, BASE64_HEADERS_ATTRIBUTE, DEFAULT_MAX_DELIVERY_ATTEMPTS,
    KEY_ATTRIBUTE, KEY_ENCODING_ATTRIBUTE, OFFSET_ATTRIBUTE, PARTITION_ATTRIBUTE,
    TOMBSTONE_ATTRIBUTE, TOPIC_ATTRIBUTE,
};
use crate::config::DeliverySettings;
use crate::message::{Attributes, Message, Receipt, Received};
use crate::position::{DurableStreams, Streams};

/// How long the topic check waits for the brokers.
const METADATA_TIMEOUT: Duration = Duration::from_secs(15);

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
    /// `--exactly-once`: how far the destination holds each partition.
    pub durable_streams: Option<Arc<dyn DurableStreams>>,
}

/// Make the consumer, check the named topics and the dead-letter topic, subscribe.
pub async fn connect(
    settings: KafkaSettings,
    delivery: &DeliverySettings,
    durable_streams: Option<Arc<dyn DurableStreams>>,
) -> Result<KafkaConnection, KafkaError> {
    let max_attempts = delivery
        .dead_letter
        .as_ref()
        .map_or(DEFAULT_MAX_DELIVERY_ATTEMPTS, |(_, max)| *max);
    let durable_streams = match (settings.exactly_once, durable_streams) {
        (false, _) => None,
        (true, Some(p)) => {
            // What the destination needs to keep its promise (objects: put-if-absent).
            p.ready().await.map_err(KafkaError::ExactlyOnce)?;
            Some(p)
        }
        (true, None) => {
            return Err(KafkaError::ExactlyOnce(
                "the destination cannot say how far it holds each partition".into(),
            ))
        }
    };
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
                crate::kafka::producer_config(&settings.client())
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
        durable_streams,
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

/// The record `m` of `streams` as a message (see the module docs for the mapping), its position
/// on its receipt.
pub fn received(m: &BorrowedMessage<'_>, ordering: bool, streams: &Streams) -> Received {
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
    let position = streams.at(topic, partition, offset);
    let message_id = position.message_id();
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
            position: Some(std::sync::Arc::new(position)),
            ..Receipt::default()
        },
    }
}
