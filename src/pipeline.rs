//! What one turn of the pipeline's loop drives ([`Pipeline`]): a batch of the source through the
//! run's [`Shaper`] (filter, then transforms) into the open files, finalized files to the durable
//! stage, outcomes to the settle side; and the errors that stop a run ([`RunError`]).
//!
//! [`crate::app::run`] owns the loop and builds a [`Pipeline`] of its stages for each turn.

use std::collections::HashSet;

use crate::batch::FlushReason;
use crate::durable::{DurableOutcome, MakeDurable};
use crate::message::Received;
use crate::receipt::NotDurable;
use crate::settle::{Admission, Ended, Settle, SettleError, Verdict};
use crate::shape::Shaper;
use crate::sink::{BuildError, FinalizedFile, OpenFiles, PushError, Pushed, SinkError};
use crate::summary::RunSummary;
use crate::transform::{Outcome as Shape, Transforms};

/// Errors that stop a run before or outside the per-message path.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Source(#[from] crate::registry::SourceError),
    #[error("subscription filter: {0}")]
    Filter(#[from] crate::filter::FilterError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Settle(#[from] SettleError),
    /// The destination failed while a redelivered message was written, or while looking up what
    /// a previous run left pending.
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("message transforms: {0}")]
    Transform(#[from] crate::transform::TransformError),
}

/// Settle what a crashed run left pending, if the source can have any: the sink says which of
/// those files are durable.
pub async fn resume(settle: &mut dyn Settle, stage: &mut dyn OpenFiles) -> Result<(), RunError> {
    let Some(resume) = settle.resume() else {
        return Ok(());
    };
    let mut durable = HashSet::new();
    for name in resume.unresolved() {
        if stage.is_durable(&name).await? {
            tracing::info!(object = %name, "object of a previous run is durable");
            durable.insert(name);
        } else {
            tracing::info!(object = %name, "object of a previous run is not durable: its messages are written again under its name");
        }
    }
    Ok(resume.resolve(&durable)?)
}

/// The stages one turn of the loop drives: messages into the open files, finalized files into
/// the durable stage, outcomes to the settle side.
pub struct Pipeline<'a> {
    pub stage: &'a mut dyn OpenFiles,
    pub settle: &'a mut dyn Settle,
    pub durable: &'a mut MakeDurable,
    pub done: &'a mut Vec<FinalizedFile>,
    pub summary: &'a mut RunSummary,
}

impl Pipeline<'_> {
    /// One batch of the source through the shaper (filter and transforms; `None`: the batch
    /// passed them before the source accepted it) into the sink. `Some(why)` when reading must
    /// stop (a bad message under `--on-bad-input fail`, or the destination failed while a file
    /// was open).
    pub async fn batch(
        &mut self,
        shaper: Option<&Shaper>,
        batch: &[Received],
    ) -> Result<Option<String>, RunError> {
        let passes = |r: &Received| shaper.is_none_or(|s| s.passes(r));
        let transforms = shaper.and_then(Shaper::transforms);
        // The filter first, on the message as published; then the transforms, on every core.
        let mut shaped = match shaper {
            Some(s) => s.apply(batch).await,
            None => Vec::new(),
        };
        for (i, r) in batch.iter().enumerate() {
            self.summary.messages_read += 1;
            if !passes(r) {
                self.summary.messages_filtered += 1;
                self.settle.filtered(r);
                continue;
            }
            let transformed;
            let outcome = shaped.get_mut(i).and_then(Option::take);
            let r = match self.transformed(r, outcome, transforms).await? {
                Shaped::Write(None) => r,
                Shaped::Write(Some(t)) => {
                    transformed = t;
                    &transformed
                }
                Shaped::Settled => continue,
                Shaped::Stop(why) => return Ok(Some(why)),
            };
            let group = self.stage.group_of(r);
            let mut pushed = match self.settle.admit(r, group.as_deref(), self.summary) {
                Admission::Write(ack) => self.stage.push(r, group, ack, self.done),
                Admission::Replay(replay) => self.stage.push_replay(r, group, &replay, self.done),
                Admission::Skip => continue,
            };
            let mut redelivered = false;
            loop {
                match pushed {
                    Ok(p) => {
                        self.settle.written(r);
                        if p == Pushed::NeedsFlush {
                            if let Err(e) = self.stage.flush().await {
                                if redelivered {
                                    return Err(e.into());
                                }
                                return Ok(Some(e.to_string()));
                            }
                        }
                    }
                    Err(PushError::Refused(e)) => {
                        if !redelivered {
                            self.summary.bad_messages += 1;
                        }
                        let refusal = self.stage.refusal();
                        match self.settle.refused(r, e, refusal, self.summary).await? {
                            Verdict::Continue => {}
                            Verdict::Stop(why) => return Ok(Some(why)),
                            Verdict::Redeliver => {
                                redelivered = true;
                                let group = self.stage.group_of(r);
                                pushed = self.stage.push(r, group, None, self.done);
                                continue;
                            }
                        }
                    }
                    // The destination failed while this message's file was open: reading stops;
                    // during a redelivery within the run, the run fails.
                    Err(PushError::Sink(e)) if redelivered => return Err(e.into()),
                    Err(PushError::Sink(e)) => return Ok(Some(e.to_string())),
                }
                break;
            }
            if !self.done.is_empty() {
                let settle = &mut *self.settle;
                self.durable.start(self.done, |f| settle.begin(f)).await?;
            }
        }
        self.settle.batch_done().await;
        Ok(None)
    }

    /// What the transforms made of `r`: the message to write, or settled here — filtered (acked,
    /// counted as filtered) or failed (as a message the sink refused, with the sink's
    /// [`crate::receipt::Refusal`]: nacked with backoff and dead-lettered by a broker; a file source's
    /// `--on-bad-input`, or for a table its redelivery within the run — which transforms it
    /// again — then the dead-letter file).
    async fn transformed(
        &mut self,
        r: &Received,
        outcome: Option<Shape>,
        transforms: Option<&Transforms>,
    ) -> Result<Shaped, RunError> {
        let (Some(mut outcome), Some(t)) = (outcome, transforms) else {
            return Ok(Shaped::Write(None));
        };
        let mut redelivered = false;
        loop {
            match outcome {
                Shape::Keep(msg) => {
                    let receipt = r.receipt.clone();
                    return Ok(Shaped::Write(Some(Received { msg, receipt })));
                }
                Shape::Filtered { .. } => {
                    self.summary.messages_filtered += 1;
                    self.settle.filtered(r);
                    return Ok(Shaped::Settled);
                }
                Shape::Failed(e) => {
                    if !redelivered {
                        self.summary.bad_messages += 1;
                    }
                    // As a message the sink refused: the sink's policy (docs/transforms.md).
                    let refusal = self.stage.refusal();
                    match self
                        .settle
                        .refused(r, e.into(), refusal, self.summary)
                        .await?
                    {
                        Verdict::Continue => return Ok(Shaped::Settled),
                        Verdict::Stop(why) => return Ok(Shaped::Stop(why)),
                        Verdict::Redeliver => {
                            redelivered = true;
                            outcome = t.apply_one(&r.msg).await;
                        }
                    }
                }
            }
        }
    }

    /// A file came back from the durable stage: account for it, settle its messages, and hand
    /// over whatever was finalized meanwhile.
    pub async fn settle_outcome(&mut self, out: DurableOutcome) -> Result<(), RunError> {
        let gave_up = matches!(out.result, Err(SinkError::GaveUp { .. }));
        if self.durable.finished(&out, self.summary) && !gave_up {
            // Ordering: later messages of its keys sit in open files: fail those too.
            self.stage.finalize_all(FlushReason::Early, self.done);
        }
        if gave_up {
            // The shutdown grace is over: its messages are handed back by `Settle::close` (the
            // checkpoint does not pass them; a broker gets them back), without a failed delivery.
            return Ok(());
        }
        // Files just finalized (an ordered failure) are neither open nor handed over yet: the
        // watermark must not pass them either.
        let mut starts = self.stage.open_starts();
        starts.extend(
            self.done
                .iter()
                .map(|f| (f.contents.span.first, f.contents.first_line)),
        );
        let ended = Ended {
            id: out.id,
            name: &out.name,
            contents: &out.contents,
            result: out.result.as_ref().map_err(NotDurable::from),
            open_starts: starts,
        };
        self.settle.end(ended, self.summary).await?;
        if self.settle.failures_redelivered()
            && self.durable.in_flight() == 0
            && self.done.is_empty()
        {
            // Everything after the failure has been handed back: start afresh.
            self.durable.restart_order();
        }
        let settle = &mut *self.settle;
        Ok(self.durable.start(self.done, |f| settle.begin(f)).await?)
    }
}

/// A message after the transforms.
enum Shaped {
    /// Write it: `None` as it came, `Some` as transformed.
    Write(Option<Received>),
    /// Settled already (filtered, or failed and handed to the settle side).
    Settled,
    /// Reading stops (`--on-bad-input fail`).
    Stop(String),
}
