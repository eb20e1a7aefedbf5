//! Settling pushed messages (docs/contract.md §5). With a spool (the default), a request was
//! answered once its message was fsynced in the spool, and settling is the spool's checkpoint
//! ([`SpoolSettle`]). Without one (`--no-spool`) each push request waits for its message; the
//! answer is the ack: 2xx once the file holding it is durable, an error status when it failed or
//! the sink refused it — Pub/Sub then redelivers it with its push backoff and dead-letters it by
//! the subscription's policy, so subsink neither backs off nor dead-letters pushed messages itself
//! ([`PushBroker`]).

use std::sync::Arc;

use crate::input::BadLine;
use crate::message::Received;
use crate::receipt::{AckRef, Handover, Refusal, Refused};
use crate::settle::dead_letter::{dead_letter_message, split_subscription, DeadLetterFile};
use crate::settle::watermark::CheckpointSettle;
use crate::settle::{Admission, Broker, Ended, Resume, Settle, SettleError, Verdict};
use crate::source::push::spool::SpoolHandle;
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

/// The settle side of a push endpoint with a spool ([`crate::source::push::spool`]): the request was answered
/// 2xx once its message was fsynced in the spool, so settling is the spool's own checkpoint
/// watermark, as for a file ([`CheckpointSettle`]); a segment wholly before the watermark is
/// deleted. What fails after the 2xx never blocks the spool and is never lost, all of it going to
/// the local dead-letter file (`--dead-letter`, else `dead-letter.ndjson` in the spool's folder)
/// when it cannot be written:
///
/// * a row the table rejects after its file was handed over is dead-lettered at once, one the
///   sink refuses while writing is redelivered within the run and then dead-lettered (the
///   checkpoint's rules); a message the sink refuses outright is dead-lettered at once;
/// * a file that fails after the destination's own retries is **written again within the run**,
///   after a backoff ([`retry_delay`]) during which the export reads nothing new (the endpoint
///   keeps accepting; an ordered subscription's keys keep their order): the spool is read again
///   from its first message once nothing is open or being made durable, and only the failed
///   files' messages are written again ([`crate::source::push::spool::SpoolHandle::retry_from`]); reading
///   goes on past them only once their file is settled
///   ([`crate::source::push::spool::SpoolReader::retry_step`]), so a message read later never shares a
///   failing file's attempts. Until then the failure pins the
///   watermark, so the spool keeps them. A destination that refuses a file outright
///   ([`crate::receipt::NotDurable::retryable`] false) gets the subscription's max delivery attempts, then the
///   file's messages are dead-lettered; one that is down (retryable) is tried again for as long
///   as it fails — the spool holds the messages, and once it is full the endpoint answers 429.
pub struct SpoolSettle {
    inner: CheckpointSettle,
    spool: SpoolHandle,
    /// The endpoint's server, waited for at close (its requests answered).
    pending: Arc<Pending>,
    dead_letter: DeadLetterFile,
    subscription: String,
    /// Requests answered 2xx counted in the summary so far (acked: the 2xx is Pub/Sub's ack).
    counted: u64,
    /// Files that failed and are to be written again.
    failed: Vec<FailedSpan>,
    /// Spans written again already in this run (for the attempts of a later failure).
    tried: Vec<FailedSpan>,
    /// The spool's rewinds seen (a new one starts a replay of every span in `failed`).
    rewinds: u64,
    /// Messages in open files (written, not yet handed to the durable stage).
    unfinalized: u64,
    /// Files being made durable.
    in_flight: u64,
    /// Positions of messages dead-lettered in this run (not written again by a replay).
    dead: std::collections::HashSet<u64>,
}

/// The messages of a failed file: its group's messages from `first` through `last`.
#[derive(Debug, Clone)]
struct FailedSpan {
    group: Option<String>,
    first: u64,
    last: u64,
    /// Failed writes of these messages so far.
    attempts: u32,
    /// Can another try help (the destination is down), or did it refuse the file?
    retryable: bool,
    error: String,
    /// Being written again by the current replay.
    replaying: bool,
}

impl FailedSpan {
    fn holds(&self, group: Option<&str>, pos: u64) -> bool {
        self.group.as_deref() == group && self.first <= pos && pos <= self.last
    }
}

/// The wait before failed files are written again: 1 s after the first failure, doubling up to
/// 30 s.
pub fn retry_delay(attempts: u32) -> std::time::Duration {
    let secs = 1u64 << attempts.saturating_sub(1).min(5);
    std::time::Duration::from_secs(secs.min(30))
}

impl SpoolSettle {
    pub fn new(
        mut inner: CheckpointSettle,
        spool: SpoolHandle,
        pending: Arc<Pending>,
        dead_letter: DeadLetterFile,
        subscription: String,
    ) -> SpoolSettle {
        spool.release_below(inner.watermark());
        inner.acks_counted_elsewhere();
        SpoolSettle {
            inner,
            spool,
            pending,
            dead_letter,
            subscription,
            counted: 0,
            failed: Vec::new(),
            tried: Vec::new(),
            rewinds: 0,
            unfinalized: 0,
            in_flight: 0,
            dead: Default::default(),
        }
    }

    /// Delete what is settled; count the 2xx answered since the last call as acked.
    fn release(&mut self, summary: &mut RunSummary) {
        let w = self.inner.watermark();
        self.spool.release_below(w);
        self.tried.retain(|t| t.last >= w);
        self.dead.retain(|p| *p >= w);
        let n = self.pending.answered();
        summary.messages_acked += n - self.counted;
        self.counted = n;
    }

    fn quiet(&self) {
        self.spool
            .set_quiet(self.unfinalized == 0 && self.in_flight == 0);
    }

    /// A new rewind of the spool: the previous replay is through (its spans are written again
    /// or dead-lettered), the spans failed since are replayed now.
    fn sync_replay(&mut self) -> u64 {
        let (rewinds, high) = self.spool.replay();
        if rewinds != self.rewinds {
            self.rewinds = rewinds;
            let (done, rest): (Vec<_>, Vec<_>) = self.failed.drain(..).partition(|f| f.replaying);
            self.tried.extend(done);
            self.failed = rest;
            for f in &mut self.failed {
                f.replaying = true;
            }
        }
        high
    }

    /// `r` is through the replay (written again, refused, or dead-lettered): the failure of the
    /// span it opens no longer pins the watermark — the file it is in now does, or it is settled.
    fn passed(&mut self, start: u64) {
        for f in &self.failed {
            if f.replaying && f.first == start {
                self.inner.unstick(f.first);
            }
        }
    }

    fn dead_letter(
        &mut self,
        r: &Received,
        attempts: u32,
        why: &str,
        summary: &mut RunSummary,
    ) -> Result<(), SettleError> {
        let (project, sub_id) = split_subscription(&self.subscription);
        let mut m = dead_letter_message(&r.msg, attempts, &project, &sub_id, why);
        m.message_id.clone_from(&r.msg.message_id);
        self.dead_letter.write(&m)?;
        tracing::warn!(
            "spool:{}: message {:?} not written after its 2xx ({why}): dead-lettered to {}",
            r.receipt.line,
            r.msg.message_id,
            self.dead_letter.path().display()
        );
        self.dead.insert(r.receipt.start);
        summary.messages_dead_lettered += 1;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Settle for SpoolSettle {
    fn admit(&mut self, r: &Received, group: Option<&str>, summary: &mut RunSummary) -> Admission {
        let high = self.sync_replay();
        let start = r.receipt.start;
        if high != 0 && start < high {
            // Reading again: only the messages of the failed files are written.
            let span = self
                .failed
                .iter()
                .find(|f| f.replaying && f.holds(group, start))
                .cloned();
            let again = span.as_ref().is_some_and(|_| !self.dead.contains(&start));
            if !again {
                self.inner.filtered(r);
                self.passed(start);
                return Admission::Skip;
            }
            let f = span.expect("a failed span");
            if !f.retryable && f.attempts >= self.dead_letter.max_attempts {
                let why = format!("its file failed {} times: {}", f.attempts, f.error);
                match self.dead_letter(r, f.attempts, &why, summary) {
                    Ok(()) => {
                        self.inner.filtered(r);
                        self.passed(start);
                        return Admission::Skip;
                    }
                    // Written again rather than lost.
                    Err(e) => tracing::error!(error = %e, "spool: cannot dead-letter"),
                }
            }
        }
        self.inner.admit(r, group, summary)
    }

    fn written(&mut self, r: &Received) {
        self.inner.written(r);
        self.unfinalized += 1;
        self.quiet();
        self.passed(r.receipt.start);
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
            self.dead_letter(r, 1, &error.to_string(), summary)?;
        }
        let verdict = self.inner.refused(r, error, refusal, summary).await?;
        if !matches!(verdict, Verdict::Redeliver) {
            self.passed(r.receipt.start);
        }
        Ok(verdict)
    }

    fn begin(&mut self, file: Handover<'_>) -> Result<(), SettleError> {
        self.unfinalized = self.unfinalized.saturating_sub(file.contents.messages);
        self.in_flight += 1;
        self.quiet();
        self.inner.begin(file)
    }

    async fn end(&mut self, ended: Ended<'_>, summary: &mut RunSummary) -> Result<(), SettleError> {
        let (name, contents) = (ended.name, ended.contents);
        let failed = ended.result.as_ref().err().cloned();
        self.in_flight = self.in_flight.saturating_sub(1);
        if ended.open_starts.is_empty() {
            // Nothing open, nothing finalized and not yet handed over: the count is 0, whatever
            // it says.
            self.unfinalized = 0;
        }
        self.quiet();
        self.inner.end(ended, summary).await?;
        if let Some(e) = failed {
            let span = &contents.span;
            let before = self
                .tried
                .iter()
                .chain(&self.failed)
                .filter(|t| t.group == span.group && t.first <= span.last && span.first <= t.last)
                .map(|t| t.attempts)
                .max()
                .unwrap_or(0);
            let f = FailedSpan {
                group: span.group.clone(),
                first: span.first,
                last: span.last,
                attempts: before + 1,
                retryable: e.retryable,
                error: e.to_string(),
                replaying: false,
            };
            // The replay that dead-letters them need not wait.
            let wait = if !f.retryable && f.attempts >= self.dead_letter.max_attempts {
                std::time::Duration::ZERO
            } else {
                retry_delay(f.attempts)
            };
            tracing::warn!(
                object = name,
                attempts = f.attempts,
                retryable = f.retryable,
                retry_in = ?wait,
                error = %f.error,
                "spool: a file failed after its messages were answered 2xx; they stay in the spool and are written again"
            );
            self.spool.retry_from(
                f.first,
                contents.first_line,
                std::time::Instant::now() + wait,
            );
            self.failed.push(f);
        }
        self.release(summary);
        Ok(())
    }

    /// The checkpoint is saved, and the run ends once the endpoint has answered its last requests
    /// (bounded by [`ANSWERS_WITHIN`]). A message answered 2xx and not yet durable in the
    /// destination — the shutdown grace ended before the export had made the whole spool
    /// durable — makes the run fail (exit 1), naming how many there are and the spool that
    /// keeps them: a 2xx must not depend on a next run on the same disk.
    async fn close(&mut self, summary: &mut RunSummary) -> Result<(), SettleError> {
        self.inner.close(summary).await?;
        self.pending.finish(ANSWERS_WITHIN).await;
        self.release(summary);
        let spool = self.spool.clone();
        let left = tokio::task::spawn_blocking(move || spool.left())
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        let why = match left {
            Ok(l) if l.messages == 0 => return Ok(()),
            Ok(l) => format!(
                "{} message(s) answered 2xx are not durable in the destination yet: they stay in \
                 the spool {} ({} bytes in {} segment(s)) and are exported by the next run with \
                 --spool-dir {}",
                l.messages,
                self.spool.dir().display(),
                l.bytes,
                l.segments,
                self.spool.dir().display()
            ),
            Err(e) => format!(
                "cannot count what the spool {} still holds ({e}): messages answered 2xx may \
                 not be durable in the destination yet; the next run with --spool-dir {} \
                 exports them",
                self.spool.dir().display(),
                self.spool.dir().display()
            ),
        };
        let why = match summary.shutdown {
            true => format!("the shutdown grace ended first: {why}"),
            false => why,
        };
        tracing::error!("{why}");
        summary.stopped = Some(match summary.stopped.take() {
            Some(before) => format!("{before}; {why}"),
            None => why,
        });
        Ok(())
    }

    fn resume(&mut self) -> Option<&mut dyn Resume> {
        self.inner.resume()
    }

    /// A failed file's messages are written again within the run (from the spool): an ordered
    /// subscription starts afresh once nothing is in flight, as the replay needs.
    fn failures_redelivered(&self) -> bool {
        true
    }
}
