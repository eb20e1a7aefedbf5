//! Settling pushed messages (docs/contract.md §5). With a spool (the default), a request was
//! answered once its message was fsynced in the spool, and settling is the spool's checkpoint
//! ([`SpoolSettle`]). Without one (`--no-spool`) each push request waits for its message; the
//! answer is the ack: 2xx once the file holding it is durable, an error status when it failed or
//! the sink refused it — Pub/Sub then redelivers it with its push backoff and dead-letters it by
//! the subscription's policy, so subsink neither backs off nor dead-letters pushed messages itself
//! ([`PushBroker`]).

use std::sync::Arc;

use super::dead_letter::{dead_letter_message, split_subscription, DeadLetterFile};
use super::file::CheckpointSettle;
use super::{Admission, Broker, Resume, Settle, SettleError, Verdict};
use crate::message::Received;
use crate::sink::{AckRef, FileContents, FinalizedFile, Refusal, Refused, SinkError, Written};
use crate::source::push::Pending;
use crate::source::BadLine;
use crate::spool::SpoolHandle;
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

/// The settle side of a push endpoint with a spool ([`crate::spool`]): the request was answered
/// 2xx once its message was fsynced in the spool, so settling is the spool's own checkpoint
/// watermark, as for a file ([`CheckpointSettle`]); a segment wholly before the watermark is
/// deleted. What fails after the 2xx never blocks the spool and is never lost: a row the table
/// refuses is redelivered within the run and then dead-lettered (the checkpoint's rule), a
/// message the sink refuses outright is dead-lettered at once — both to the local dead-letter file
/// (`--dead-letter`, else `dead-letter.ndjson` in the spool's folder). A file that fails after its
/// retries pins the watermark before it: the spool keeps its messages (it fills, and the endpoint
/// answers 429) and the next run writes them.
pub struct SpoolSettle {
    inner: CheckpointSettle,
    spool: SpoolHandle,
    /// The endpoint's server, waited for at close (its requests answered).
    pending: Arc<Pending>,
    dead_letter: DeadLetterFile,
    subscription: String,
    /// Requests answered 2xx counted in the summary so far (acked: the 2xx is Pub/Sub's ack).
    counted: u64,
}

impl SpoolSettle {
    pub fn new(
        inner: CheckpointSettle,
        spool: SpoolHandle,
        pending: Arc<Pending>,
        dead_letter: DeadLetterFile,
        subscription: String,
    ) -> SpoolSettle {
        spool.release_below(inner.watermark());
        SpoolSettle {
            inner,
            spool,
            pending,
            dead_letter,
            subscription,
            counted: 0,
        }
    }

    /// Delete what is settled; count the 2xx answered since the last call as acked.
    fn release(&mut self, summary: &mut RunSummary) {
        self.spool.release_below(self.inner.watermark());
        let n = self.pending.answered();
        summary.messages_acked += n - self.counted;
        self.counted = n;
    }
}

#[async_trait::async_trait]
impl Settle for SpoolSettle {
    fn admit(&mut self, r: &Received, group: Option<&str>, summary: &mut RunSummary) -> Admission {
        self.inner.admit(r, group, summary)
    }

    fn written(&mut self, r: &Received) {
        self.inner.written(r)
    }

    fn filtered(&mut self, r: &Received) {
        self.inner.filtered(r)
    }

    fn bad_line(&mut self, bad: &BadLine) -> Verdict {
        self.inner.bad_line(bad)
    }

    async fn refused(
        &mut self,
        r: &Received,
        error: Refused,
        refusal: Refusal,
        summary: &mut RunSummary,
    ) -> Result<Verdict, SettleError> {
        if refusal == Refusal::BadInput {
            let (project, sub_id) = split_subscription(&self.subscription);
            let why = error.to_string();
            let mut m = dead_letter_message(&r.msg, 1, &project, &sub_id, &why);
            m.message_id.clone_from(&r.msg.message_id);
            self.dead_letter.write(&m)?;
            tracing::warn!(
                "spool:{}: message {:?} refused after its 2xx ({why}): dead-lettered to {}",
                r.receipt.line,
                r.msg.message_id,
                self.dead_letter.path().display()
            );
            summary.messages_dead_lettered += 1;
        }
        self.inner.refused(r, error, refusal, summary).await
    }

    fn begin(&mut self, file: &mut FinalizedFile) -> Result<(), SettleError> {
        self.inner.begin(file)
    }

    async fn end(
        &mut self,
        id: u64,
        name: &str,
        contents: &FileContents,
        result: &Result<Written, SinkError>,
        open_starts: Vec<(u64, u64)>,
        summary: &mut RunSummary,
    ) -> Result<(), SettleError> {
        self.inner
            .end(id, name, contents, result, open_starts, summary)
            .await?;
        self.release(summary);
        Ok(())
    }

    /// The checkpoint is saved, and the run ends once the endpoint has answered its last requests
    /// (bounded by [`ANSWERS_WITHIN`]).
    async fn close(&mut self, summary: &mut RunSummary) -> Result<(), SettleError> {
        self.inner.close(summary).await?;
        self.pending.finish(ANSWERS_WITHIN).await;
        self.release(summary);
        Ok(())
    }

    fn resume(&mut self) -> Option<&mut dyn Resume> {
        self.inner.resume()
    }
}
