//! Settling a Pub/Sub source: acks, nacks with the retry policy's backoff, dead letters, leases
//! (docs/contract.md §2.4, §2.8, §2.9).
//!
//! The messages of a durable file are acked; until then their leases are extended
//! (ModifyAckDeadline) so a long `maxDuration` does not cause redelivery. A failed file's messages
//! are nacked — after the retry policy's backoff, by setting their deadline to it — or, on their
//! last allowed attempt, published to the dead-letter topic and acked. Filtered messages are acked
//! at once (§2.5).

use std::collections::HashMap;
use std::time::Duration;

use crate::config::DeliverySettings;
use crate::message::{Message, Received};
use crate::pubsub::{Acker, PubsubClient};
use crate::receipt::AckRef;
use crate::settle::dead_letter::{dead_letter_message, split_subscription, Backoff};
use crate::settle::{Admission, Broker};
use crate::summary::RunSummary;

/// How Pub/Sub settles a delivery (the settle side is [`super::Brokered`] of it).
pub struct PubsubBroker {
    /// For publishing dead letters.
    client: PubsubClient,
    /// Acks and deadline changes, on the source's stream while one is open.
    acker: Acker,
    subscription: String,
    /// `(topic, max_delivery_attempts)`.
    dead_letter: Option<(String, u32)>,
    backoff: Backoff,
    /// Failed deliveries seen here, per message id — the attempt count when the server sends
    /// none (no dead-letter policy on the subscription, §1.1).
    failures: HashMap<String, u32>,
    /// Lease length set on every extension.
    lease: Duration,
    /// `enableMessageOrdering`.
    ordering: bool,
    /// Ordering: key → id of its earliest nacked message. Pub/Sub redelivers that message and every
    /// later one of its key; until it comes back, later messages of the key that still arrive (sent
    /// before the server saw the nack) must not be written, or they would become durable before
    /// it. They are nacked at once, not counted as failed deliveries.
    blocked: HashMap<String, String>,
    /// Ack ids of messages handed back because their key is blocked, nacked with the batch.
    held_back: Vec<String>,
}

impl PubsubBroker {
    pub fn new(
        client: PubsubClient,
        acker: Acker,
        subscription: String,
        delivery: &DeliverySettings,
        lease: Duration,
    ) -> PubsubBroker {
        PubsubBroker {
            client,
            acker,
            subscription,
            dead_letter: delivery.dead_letter.clone(),
            backoff: Backoff {
                policy: delivery.retry,
            },
            failures: HashMap::new(),
            lease,
            ordering: delivery.enable_message_ordering,
            blocked: HashMap::new(),
            held_back: Vec::new(),
        }
    }

    /// The delivery attempt `r` is (1-based): the server's count, else subsink's own.
    fn attempt(&self, r: &Received) -> u32 {
        match r.receipt.delivery_attempt {
            Some(n) if n > 0 => n as u32,
            _ => self.failures.get(&r.msg.message_id).copied().unwrap_or(0) + 1,
        }
    }

    /// Acknowledge; false when the call failed (the messages will then be redelivered).
    async fn ack(&self, ids: &[String]) -> bool {
        if ids.is_empty() {
            return true;
        }
        match self.acker.ack(ids.to_vec()).await {
            Ok(()) => true,
            Err(e) => {
                // The object is durable; a lost ack only means a duplicate later (at least once).
                tracing::warn!(messages = ids.len(), error = %e, "ack failed; the messages will be redelivered");
                false
            }
        }
    }
}

#[async_trait::async_trait]
impl Broker for PubsubBroker {
    fn subscription(&self) -> &str {
        &self.subscription
    }

    fn dead_letters(&self) -> bool {
        self.dead_letter.is_some()
    }

    fn ack_ref(&self, r: &Received) -> AckRef {
        let key = match self.ordering {
            true => r.msg.ordering_key.clone(),
            false => String::new(),
        };
        AckRef::of(
            r,
            self.attempt(r),
            self.dead_letter.as_ref().map(|d| d.1),
            key,
        )
    }

    fn admit(&mut self, r: &Received, summary: &mut RunSummary) -> Admission {
        if self.ordering && !self.blocked.is_empty() {
            let key = &r.msg.ordering_key;
            match self.blocked.get(key).map(|head| *head == r.msg.message_id) {
                Some(true) => {
                    self.blocked.remove(key);
                }
                Some(false) => {
                    self.held_back.extend(r.receipt.ack_id.clone());
                    summary.messages_nacked += 1;
                    return Admission::Skip;
                }
                None => {}
            }
        }
        Admission::Write(Some(self.ack_ref(r)))
    }

    /// Filtered messages are acked; messages held back behind a blocked key nacked.
    async fn batch_done(&mut self, filtered: Vec<String>) {
        let _ = self.ack(&filtered).await;
        let held = std::mem::take(&mut self.held_back);
        if !held.is_empty() {
            if let Err(e) = self.acker.modify_deadline(held, 0).await {
                tracing::warn!(error = %e, "nack failed; the messages will be redelivered at their deadline");
            }
        }
    }

    async fn fail(
        &mut self,
        acks: Vec<AckRef>,
        error: &str,
        backoff: bool,
        summary: &mut RunSummary,
    ) {
        let mut dead = Vec::new();
        let mut by_delay: HashMap<i32, Vec<String>> = HashMap::new();
        for a in acks {
            let dead_now = matches!((&self.dead_letter, &a.kept), (Some((_, max)), Some(_)) if a.attempt >= *max);
            if !a.ordering_key.is_empty() && !dead_now {
                self.blocked
                    .entry(a.ordering_key.clone())
                    .or_insert_with(|| a.message_id.clone());
            }
            *self.failures.entry(a.message_id.clone()).or_default() += 1;
            match (&self.dead_letter, a.kept) {
                (Some((_, max)), Some(m)) if a.attempt >= *max => {
                    dead.push((a.ack_id, a.attempt, m))
                }
                _ if !backoff => by_delay.entry(0).or_default().push(a.ack_id),
                _ => by_delay
                    .entry(Backoff::deadline_secs(self.backoff.delay(a.attempt)))
                    .or_default()
                    .push(a.ack_id),
            }
        }
        if !dead.is_empty() {
            let (topic, _) = self.dead_letter.clone().expect("dead letters need a topic");
            let (project, sub_id) = split_subscription(&self.subscription);
            let wrapped: Vec<Message> = dead
                .iter()
                .map(|(_, attempt, m)| dead_letter_message(m, *attempt, &project, &sub_id, error))
                .collect();
            match self.client.publish(&topic, &wrapped).await {
                Ok(_) => {
                    let ids: Vec<String> = dead.iter().map(|d| d.0.clone()).collect();
                    let _ = self.ack(&ids).await;
                    summary.messages_dead_lettered += ids.len() as u64;
                    for (_, _, m) in &dead {
                        self.failures.remove(&m.message_id);
                    }
                    tracing::warn!(messages = ids.len(), topic = %topic, "dead-lettered: {error}");
                }
                Err(e) => {
                    tracing::error!(error = %e, "publishing to the dead-letter topic failed; nacking");
                    by_delay
                        .entry(0)
                        .or_default()
                        .extend(dead.into_iter().map(|d| d.0));
                }
            }
        }
        for (secs, ids) in by_delay {
            summary.messages_nacked += ids.len() as u64;
            // A nack is a deadline of 0; a positive deadline delays redelivery by that much
            // (§2.1: ModifyAckDeadline), which is how the retry policy's backoff is applied.
            if let Err(e) = self.acker.modify_deadline(ids, secs).await {
                tracing::warn!(error = %e, "nack failed; the messages will be redelivered at their deadline");
            }
        }
    }

    /// Handed to the transport: the stream's, or a unary call's answer ([`PubsubBroker::ack`]).
    async fn ack_durable(&mut self, ids: &[String]) -> bool {
        self.ack(ids).await
    }

    async fn hand_back(&mut self, acks: Vec<AckRef>, summary: &mut RunSummary) {
        if !acks.is_empty() {
            self.fail(
                acks,
                "shutdown before the object was durable",
                true,
                summary,
            )
            .await;
        }
    }

    fn lease_period(&self) -> Option<Duration> {
        Some(self.lease / 3)
    }

    async fn extend_leases(&mut self, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        let secs = self.lease.as_secs().clamp(10, 600) as i32;
        let n = ids.len();
        if let Err(e) = self.acker.modify_deadline(ids, secs).await {
            tracing::warn!(error = %e, messages = n, "lease extension failed");
        }
    }
}
