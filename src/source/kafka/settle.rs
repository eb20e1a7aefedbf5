//! Settling a Kafka source: offsets committed after durable, in-process redelivery with the retry
//! policy's backoff, dead letters to a topic — [`super::nats::NatsBroker`]'s Kafka counterpart
//! (docs/contract.md §2.4, §2.8, §2.9; docs/kafka.md).
//!
//! Kafka has no per-record ack: a record is settled in the source's [`Offsets`], and what is
//! committed is each partition's watermark (every record below it settled):
//!
//! | when | what |
//! |---|---|
//! | the file holding it is durable; it did not match the filter (§2.5); it was dead-lettered | settled; the partition's watermark is committed (synchronously, retried until the broker takes it) |
//! | its file failed, or the sink refused it | handed back to the source after the retry policy's backoff for its attempt (§2.9) and written again (attempt + 1); its partition goes on |
//! | that failure was its last allowed delivery (`maxDeliveryAttempts`, 5 without a policy) | produced to `--kafka-dead-letter-topic` (key, value and headers, plus the five `CloudPubSubDeadLetterSource*` headers, §2.8), then settled once the broker acknowledged it (`acks=all`); without a dead-letter topic its partition stops |
//! | the run ends with it not durable | nothing: its offset is not committed, the next run reads it again |
//! | `--exactly-once`: its file failed, or the sink refused it | its partition stops at once: no redelivery (it would land in a file out of offset order), no dead letter; nothing more of the partition is written; a restart resumes it exactly (docs/kafka.md#exactly-once) |

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::mpsc;

use crate::config::DeliverySettings;
use crate::message::{Message, Receipt, Received};
use crate::receipt::AckRef;
use crate::settle::dead_letter::{dead_letter_message, split_subscription, Backoff};
use crate::settle::{Admission, Broker};
use crate::source::kafka::{
    commit_list, tp_of, KafkaConsumer, Offsets, KEY_ATTRIBUTE, KEY_ENCODING_ATTRIBUTE,
    TOMBSTONE_ATTRIBUTE,
};
use crate::summary::RunSummary;

/// How long a commit may take before the loop goes on (the commit is retried with the next).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long producing one dead letter may take.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(30);

/// How Kafka settles a delivery (the settle side is [`super::Brokered`] of it).
pub struct KafkaBroker {
    consumer: Arc<KafkaConsumer>,
    offsets: Arc<Offsets>,
    /// Where a record goes for another delivery (the source's [`crate::source::kafka::KafkaSource::redeliver`]).
    redeliver: mpsc::UnboundedSender<Received>,
    subscription: String,
    dead_letter: Option<(FutureProducer, String)>,
    max_attempts: u32,
    backoff: Backoff,
    /// A commit still running past [`COMMIT_TIMEOUT`]: the next waits for it.
    commit: Option<tokio::task::JoinHandle<bool>>,
    /// `--exactly-once`: a failed delivery is not written again in this run (out of offset order
    /// its file could not be found again by name): its partition stops, and nothing more of it is
    /// written; a restart resumes it exactly.
    exact: bool,
}

impl KafkaBroker {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        consumer: Arc<KafkaConsumer>,
        offsets: Arc<Offsets>,
        redeliver: mpsc::UnboundedSender<Received>,
        subscription: String,
        delivery: &DeliverySettings,
        dead_letter: Option<(FutureProducer, String)>,
        max_attempts: u32,
        exact: bool,
    ) -> KafkaBroker {
        KafkaBroker {
            consumer,
            offsets,
            redeliver,
            subscription,
            dead_letter,
            max_attempts,
            backoff: Backoff {
                policy: delivery.retry,
            },
            commit: None,
            exact,
        }
    }

    /// Commit every partition whose watermark moved; `false` if the broker did not take it
    /// (within [`COMMIT_TIMEOUT`]; it is tried again with the next).
    async fn commit(&mut self) -> bool {
        if let Some(h) = &mut self.commit {
            match tokio::time::timeout(COMMIT_TIMEOUT, h).await {
                Ok(_) => self.commit = None,
                Err(_) => return false,
            }
        }
        let marks = self.offsets.to_commit();
        if marks.is_empty() {
            return true;
        }
        let (consumer, offsets) = (self.consumer.clone(), self.offsets.clone());
        let mut h = tokio::task::spawn_blocking(move || {
            match consumer.commit(&commit_list(&marks), CommitMode::Sync) {
                Ok(()) => {
                    offsets.committed(&marks);
                    tracing::debug!(offsets = ?marks, "Kafka: committed");
                    true
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Kafka: offset commit failed; retried with the next");
                    false
                }
            }
        });
        match tokio::time::timeout(COMMIT_TIMEOUT, &mut h).await {
            Ok(r) => r.unwrap_or(false),
            Err(_) => {
                tracing::warn!("Kafka: offset commit still waiting for the broker");
                self.commit = Some(h);
                false
            }
        }
    }

    /// Produce `m` (a dead letter) to `topic` and wait for the broker's acknowledgement.
    async fn produce(producer: &FutureProducer, topic: &str, m: &Message) -> Result<(), String> {
        let a = &m.attributes;
        let key: Option<Vec<u8>> =
            a.get(KEY_ATTRIBUTE)
                .map(|k| match a.get(KEY_ENCODING_ATTRIBUTE) {
                    Some("base64") => base64::engine::general_purpose::STANDARD
                        .decode(k)
                        .unwrap_or_else(|_| k.as_bytes().to_vec()),
                    _ => k.as_bytes().to_vec(),
                });
        let mut headers = OwnedHeaders::new_with_capacity(a.len());
        for (k, v) in a.iter() {
            if k == KEY_ATTRIBUTE || k == KEY_ENCODING_ATTRIBUTE {
                continue;
            }
            headers = headers.insert(Header {
                key: k,
                value: Some(v),
            });
        }
        let tombstone = a.get(TOMBSTONE_ATTRIBUTE) == Some("true");
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if !tombstone {
            rec = rec.payload(&m.data[..]);
        }
        if let Some(k) = &key {
            rec = rec.key(&k[..]);
        }
        producer
            .send(rec, PRODUCE_TIMEOUT)
            .await
            .map(|_| ())
            .map_err(|(e, _)| e.to_string())
    }
}

#[async_trait::async_trait]
impl Broker for KafkaBroker {
    fn subscription(&self) -> &str {
        &self.subscription
    }

    fn dead_letters(&self) -> bool {
        self.dead_letter.is_some()
    }

    /// `--exactly-once`: nothing more of a stopped partition (or of one no longer assigned) is
    /// written.
    fn admit(&mut self, r: &Received, _summary: &mut RunSummary) -> Admission {
        if self.exact {
            if let Some((tp, offset)) = tp_of(r.receipt.position.as_deref()) {
                if self.offsets.is_stopped(&tp) {
                    self.offsets.forget(&tp, offset);
                    return Admission::Skip;
                }
            }
        }
        Admission::Write(Some(self.ack_ref(r)))
    }

    /// The record itself travels with its file: a failed delivery is redelivered from it (Kafka
    /// redelivers nothing by itself).
    fn ack_ref(&self, r: &Received) -> AckRef {
        let attempt = r.receipt.delivery_attempt.unwrap_or(1).max(1) as u32;
        let key = r.msg.ordering_key.clone();
        AckRef::of(r, attempt, Some(1), key)
    }

    async fn batch_done(&mut self, filtered: Vec<String>) {
        if !filtered.is_empty() {
            self.offsets.settle(filtered.iter().map(String::as_str));
        }
        // Also the commit of an earlier batch that failed.
        self.commit().await;
    }

    async fn fail(
        &mut self,
        acks: Vec<AckRef>,
        error: &str,
        backoff: bool,
        summary: &mut RunSummary,
    ) {
        if self.exact {
            for a in acks {
                let Some((tp, _)) = tp_of(a.position.as_deref()) else {
                    continue;
                };
                summary.messages_nacked += 1;
                // A partition revoked meanwhile is its next owner's to read again.
                if self.offsets.is_assigned(&tp) && !self.offsets.is_stopped(&tp) {
                    tracing::error!(
                        message_id = %a.message_id,
                        "Kafka partition {}/{} stopped: record {} failed under --exactly-once ({error}); its offset and every later one stay uncommitted, nothing more of the partition is written; a restart resumes it exactly",
                        tp.0, tp.1, a.message_id
                    );
                    self.offsets.stop_partition(&tp);
                }
            }
            return;
        }
        let (project, sub_id) = split_subscription(&self.subscription);
        let mut dead = Vec::new();
        for a in acks {
            let Some(m) = a.kept else {
                continue;
            };
            if a.attempt < self.max_attempts {
                let delay = match backoff {
                    true => self.backoff.delay(a.attempt),
                    false => Duration::ZERO,
                };
                let r = Received {
                    msg: m,
                    receipt: Receipt {
                        ack_id: Some(a.ack_id),
                        delivery_attempt: Some(a.attempt as i32 + 1),
                        position: a.position,
                        ..Receipt::default()
                    },
                };
                let tx = self.redeliver.clone();
                summary.messages_nacked += 1;
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = tx.send(r);
                });
                continue;
            }
            match &self.dead_letter {
                Some((producer, topic)) => {
                    let letter = dead_letter_message(&m, a.attempt, &project, &sub_id, error);
                    match Self::produce(producer, topic, &letter).await {
                        Ok(()) => {
                            tracing::warn!(message_id = %m.message_id, topic = %topic, "dead-lettered: {error}");
                            summary.messages_dead_lettered += 1;
                            dead.push(a.ack_id);
                        }
                        Err(e) => {
                            // Tried again, as a delivery that failed once more.
                            tracing::error!(error = %e, message_id = %m.message_id, "producing to the dead-letter topic failed; delivered again");
                            let r = Received {
                                msg: m,
                                receipt: Receipt {
                                    ack_id: Some(a.ack_id),
                                    delivery_attempt: Some(a.attempt as i32),
                                    position: a.position,
                                    ..Receipt::default()
                                },
                            };
                            let tx = self.redeliver.clone();
                            let delay = self.backoff.delay(a.attempt).max(Duration::from_secs(1));
                            tokio::spawn(async move {
                                tokio::time::sleep(delay).await;
                                let _ = tx.send(r);
                            });
                        }
                    }
                }
                None => {
                    if let Some((tp, _)) = tp_of(a.position.as_deref()) {
                        tracing::error!(
                            message_id = %m.message_id, attempts = a.attempt,
                            "Kafka partition {}/{} stopped: record {} failed {} deliveries and there is no --kafka-dead-letter-topic ({error}); its offset and every later one stay uncommitted",
                            tp.0, tp.1, m.message_id, a.attempt
                        );
                        summary.messages_nacked += 1;
                        self.offsets.stop_partition(&tp);
                    }
                }
            }
        }
        if !dead.is_empty() {
            self.offsets.settle(dead.iter().map(String::as_str));
            self.commit().await;
        }
    }

    /// Settled, then committed: `true` once the broker has the commit.
    async fn ack_durable(&mut self, ids: &[String]) -> bool {
        self.offsets.settle(ids.iter().map(String::as_str));
        self.commit().await
    }

    /// Nothing to hand back: what is not committed is read again by the next run. The last
    /// watermarks are committed.
    async fn hand_back(&mut self, acks: Vec<AckRef>, summary: &mut RunSummary) {
        summary.messages_nacked += acks.len() as u64;
        self.commit().await;
    }
}
