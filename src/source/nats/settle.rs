//! Settling a NATS JetStream source: acks, naks with the retry policy's delay, in-progress acks,
//! dead letters — [`super::pubsub::PubsubBroker`]'s JetStream counterpart (docs/contract.md §2.4,
//! §2.8, §2.9).
//!
//! Every reply goes to the message's ack subject (its [`crate::message::Receipt::ack_id`]):
//!
//! | when | reply |
//! |---|---|
//! | the file holding it is durable; it did not match the filter (§2.5); it was dead-lettered | `+ACK` |
//! | every third of `AckWait` while its file is open or being made durable | `+WPI` (in progress: the server restarts its `AckWait`) |
//! | its file failed, or the sink refused it | `-NAK {"delay": …}`, the retry policy's backoff for its delivery count (§2.9) |
//! | that failure was its last allowed delivery (`maxDeliveryAttempts`) | published to `--nats-dead-letter-subject` with the five `CloudPubSubDeadLetterSource*` headers (§2.8), then `+ACK` |
//!
//! Acks are published and then flushed (a PING/PONG round trip), so once "acked after durable"
//! is logged the server has them. A dead letter is published through JetStream and acked only
//! after the stream storing it confirmed it; if that fails, the message is nak'ed instead.

use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::{Client, HeaderMap};

use crate::config::DeliverySettings;
use crate::message::Received;
use crate::receipt::AckRef;
use crate::settle::dead_letter::{dead_letter_message, split_subscription, Backoff};
use crate::settle::Broker;
use crate::summary::RunSummary;

const ACK: &[u8] = b"+ACK";
const IN_PROGRESS: &[u8] = b"+WPI";

/// How NATS JetStream settles a delivery (the settle side is [`super::Brokered`] of it).
pub struct NatsBroker {
    client: Client,
    jetstream: Context,
    /// The subscription's full name, for the dead-letter headers and logs.
    subscription: String,
    /// `(subject, max_delivery_attempts)`.
    dead_letter: Option<(String, u32)>,
    backoff: Backoff,
    /// The consumer's `AckWait`.
    ack_wait: Duration,
}

impl NatsBroker {
    pub fn new(
        client: Client,
        jetstream: Context,
        subscription: String,
        delivery: &DeliverySettings,
        dead_letter: Option<(String, u32)>,
        ack_wait: Duration,
    ) -> NatsBroker {
        NatsBroker {
            client,
            jetstream,
            subscription,
            dead_letter,
            backoff: Backoff {
                policy: delivery.retry,
            },
            ack_wait,
        }
    }

    /// Publish `payload` to every ack subject in `subjects`, then flush; false when that failed
    /// (the messages are then redelivered after their `AckWait`).
    async fn reply(&self, subjects: &[String], payload: &'static [u8], what: &str) -> bool {
        if subjects.is_empty() {
            return true;
        }
        for s in subjects {
            if let Err(e) = self
                .client
                .publish(s.clone(), bytes::Bytes::from_static(payload))
                .await
            {
                tracing::warn!(error = %e, messages = subjects.len(), "NATS {what} failed");
                return false;
            }
        }
        match self.client.flush().await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, messages = subjects.len(), "NATS {what} failed");
                false
            }
        }
    }

    /// Ack `subjects` and wait for the server to confirm each one (JetStream's acknowledged ack:
    /// the `+ACK` is a request and the server answers once it has applied it), many in flight at
    /// once. A plain publish is only in a socket buffer when it returns: if the process dies then,
    /// an ack it logged can still be lost and the message written twice. `false` if any ack was
    /// not confirmed (those messages may be redelivered).
    async fn confirmed_ack(&self, subjects: &[String]) -> bool {
        use futures::StreamExt;
        let failed = futures::stream::iter(subjects.iter().cloned())
            .map(|s| self.client.request(s, bytes::Bytes::from_static(ACK)))
            .buffer_unordered(8192)
            .filter_map(|r| async move { r.err() })
            .collect::<Vec<_>>()
            .await;
        match failed.first() {
            None => true,
            Some(e) => {
                tracing::warn!(error = %e, failed = failed.len(), messages = subjects.len(), "NATS ack not confirmed");
                false
            }
        }
    }

    /// Nak each message with its own delay.
    async fn nak(&self, naks: &[(String, Duration)]) {
        for (subject, delay) in naks {
            let payload = if delay.is_zero() {
                "-NAK".to_string()
            } else {
                format!("-NAK {{\"delay\":{}}}", delay.as_nanos())
            };
            if let Err(e) = self.client.publish(subject.clone(), payload.into()).await {
                tracing::warn!(error = %e, "nak failed; the message will be redelivered after its AckWait");
                return;
            }
        }
        if let Err(e) = self.client.flush().await {
            tracing::warn!(error = %e, "nak failed; the messages will be redelivered after their AckWait");
        }
    }

    /// Publish one dead letter and wait for the stream to store it.
    async fn publish_dead_letter(
        &self,
        subject: &str,
        m: &crate::message::Message,
    ) -> Result<(), String> {
        let mut headers = HeaderMap::new();
        for (k, v) in &m.attributes {
            // A header value cannot hold a line break (the error message may).
            let v: String = v
                .chars()
                .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
                .collect();
            headers.insert(k, v.as_str());
        }
        self.jetstream
            .publish_with_headers(subject.to_string(), headers, m.data.clone())
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Broker for NatsBroker {
    fn subscription(&self) -> &str {
        &self.subscription
    }

    fn dead_letters(&self) -> bool {
        self.dead_letter.is_some()
    }

    fn ack_ref(&self, r: &Received) -> AckRef {
        let attempt = r.receipt.delivery_attempt.unwrap_or(1).max(1) as u32;
        AckRef::of(
            r,
            attempt,
            self.dead_letter.as_ref().map(|d| d.1),
            String::new(),
        )
    }

    async fn batch_done(&mut self, filtered: Vec<String>) {
        self.reply(&filtered, ACK, "ack of filtered messages").await;
    }

    async fn fail(
        &mut self,
        acks: Vec<AckRef>,
        error: &str,
        backoff: bool,
        summary: &mut RunSummary,
    ) {
        let mut naks = Vec::new();
        let mut dead_acked = Vec::new();
        let (project, sub_id) = split_subscription(&self.subscription);
        for a in acks {
            match (&self.dead_letter, a.kept) {
                (Some((subject, max)), Some(m)) if a.attempt >= *max => {
                    let letter = dead_letter_message(&m, a.attempt, &project, &sub_id, error);
                    match self.publish_dead_letter(subject, &letter).await {
                        Ok(()) => {
                            tracing::warn!(message_id = %m.message_id, subject = %subject, "dead-lettered: {error}");
                            dead_acked.push(a.ack_id);
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "publishing to the dead-letter subject failed; naking");
                            naks.push((a.ack_id, Duration::ZERO));
                        }
                    }
                }
                _ if !backoff => naks.push((a.ack_id, Duration::ZERO)),
                _ => naks.push((a.ack_id, self.backoff.delay(a.attempt))),
            }
        }
        if !dead_acked.is_empty() {
            summary.messages_dead_lettered += dead_acked.len() as u64;
            self.reply(&dead_acked, ACK, "ack of dead letters").await;
        }
        summary.messages_nacked += naks.len() as u64;
        self.nak(&naks).await;
    }

    /// Confirmed by the server ([`NatsBroker::confirmed_ack`]).
    async fn ack_durable(&mut self, ids: &[String]) -> bool {
        self.confirmed_ack(ids).await
    }

    /// Handed back at once: a shutdown is not a failed delivery, so no backoff and no dead
    /// letter.
    async fn hand_back(&mut self, acks: Vec<AckRef>, summary: &mut RunSummary) {
        let rest: Vec<(String, Duration)> = acks
            .into_iter()
            .map(|a| (a.ack_id, Duration::ZERO))
            .collect();
        summary.messages_nacked += rest.len() as u64;
        self.nak(&rest).await;
        // Everything published must reach the server before the process ends.
        let _ = self.client.flush().await;
    }

    fn lease_period(&self) -> Option<Duration> {
        Some(self.ack_wait / 3)
    }

    async fn extend_leases(&mut self, ids: Vec<String>) {
        self.reply(&ids, IN_PROGRESS, "in-progress ack").await;
    }
}
