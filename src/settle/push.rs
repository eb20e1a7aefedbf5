//! Settling pushed messages: each push request waits for its message; the answer is the ack
//! (docs/contract.md §5). 2xx once the file holding it is durable, an error status when it failed
//! or the sink refused it — Pub/Sub then redelivers it with its push backoff and dead-letters it by
//! the subscription's policy, so subsink neither backs off nor dead-letters pushed messages itself.

use std::sync::Arc;

use super::Broker;
use crate::message::Received;
use crate::sink::AckRef;
use crate::source::push::Pending;
use crate::summary::RunSummary;

/// How long the end of a run waits for the push endpoint to write its last answers and close.
pub const ANSWERS_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// How a push request is answered (the settle side is [`super::Brokered`] of it).
pub struct PushBroker {
    pending: Arc<Pending>,
    /// The subscription, for logs.
    subscription: String,
}

impl PushBroker {
    pub fn new(pending: Arc<Pending>, subscription: String) -> PushBroker {
        PushBroker {
            pending,
            subscription,
        }
    }

    /// Answer the requests of `acks` with an error status; Pub/Sub redelivers them.
    fn nack(&self, acks: &[AckRef], summary: &mut RunSummary) {
        for a in acks {
            self.pending.resolve(&a.ack_id, false);
        }
        summary.messages_nacked += acks.len() as u64;
    }
}

#[async_trait::async_trait]
impl Broker for PushBroker {
    fn subscription(&self) -> &str {
        &self.subscription
    }

    /// Pub/Sub dead-letters pushed messages itself.
    fn dead_letters(&self) -> bool {
        false
    }

    fn ack_ref(&self, r: &Received) -> AckRef {
        let attempt = r.receipt.delivery_attempt.unwrap_or(1).max(1) as u32;
        AckRef::of(r, attempt, None, String::new())
    }

    /// Filtered messages are answered 2xx.
    async fn batch_done(&mut self, filtered: Vec<String>) {
        for id in &filtered {
            self.pending.resolve(id, true);
        }
    }

    /// No backoff here: Pub/Sub applies the push backoff and the dead-letter policy.
    async fn fail(
        &mut self,
        acks: Vec<AckRef>,
        _error: &str,
        _backoff: bool,
        summary: &mut RunSummary,
    ) {
        self.nack(&acks, summary);
    }

    async fn ack_durable(&mut self, ids: &[String]) -> bool {
        for id in ids {
            self.pending.resolve(id, true);
        }
        true
    }

    /// Called once, when the run closes: what was not made durable is answered 503, and the run
    /// ends only once the endpoint has written every answer (bounded by [`ANSWERS_WITHIN`]).
    async fn hand_back(&mut self, acks: Vec<AckRef>, summary: &mut RunSummary) {
        self.nack(&acks, summary);
        self.pending.finish(ANSWERS_WITHIN).await;
    }
}
