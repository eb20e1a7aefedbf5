//! Settling by a checkpoint (the file source, an archive, a push spool): the checkpoint's
//! watermark (docs/contract.md §6; see [`crate::checkpoint_file`] for the protocol), and
//! [`CheckpointSettle::open`], the one place a source's checkpoint and dead-letter file are opened.
//!
//! A message is settled when the watermark — the start of the oldest message that is not durable —
//! moves past it. A file whose upload fails pins the watermark before its first message for the rest
//! of the run, and the run reports it and exits non-zero. A message the sink refuses and that fails
//! alone (the table writer) is redelivered within the run up to the delivery limit when a
//! dead-letter file is given, then appended to it; without one it stays not done, recorded in the
//! checkpoint, which the watermark does not pass.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::dead_letter::{dead_letter_message, split_subscription, DeadLetterFile};
use super::{Admission, Ended, Resume, Settle, SettleError, Verdict};
use crate::checkpoint_file::{Checkpoint, ObjectSpan};
use crate::config::ValidSubscription;
use crate::input::BadLine;
use crate::message::Received;
use crate::receipt::{FileContents, Handover, Refusal, Refused, Replay, Written};
use crate::summary::{FailedMessage, RunSummary, MAX_LISTED_FAILURES};

/// Whether a malformed line stops the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnBadInput {
    /// Stop reading at the first malformed line (the run exits non-zero).
    #[default]
    Fail,
    /// Log the line (file:line and the problem), count it, and go on.
    Skip,
}

/// The file source's settle side: what is in flight, where the watermark is, the checkpoint file.
pub struct CheckpointSettle {
    cp: Checkpoint,
    path: Option<PathBuf>,
    /// The input, for messages (`path` or `-`).
    source_name: String,
    subscription: String,
    on_bad_input: OnBadInput,
    dead_letter: Option<DeadLetterFile>,
    /// (offset, line) of the first message of each file being made durable.
    inflight: HashMap<u64, (u64, u64)>,
    /// (offset, line) of the first message of each failed file: the watermark never passes them.
    stuck: Vec<(u64, u64)>,
    /// (offset, line) just past the last input consumed.
    consumed: (u64, u64),
    /// Offsets of messages that failed in an earlier run and were written in this one: their
    /// failure record is cleared once the file holding them is durable.
    fixed: Vec<u64>,
    /// The message being redelivered within the run ([`Verdict::Redeliver`]): its input offset
    /// and the delivery attempt the next write is.
    redelivering: Option<(u64, u32)>,
    /// (last offset, messages written) of each durable file the watermark has not passed yet:
    /// counted as acked (the summary's `messages_acked`, the acked metric) once it does.
    passing: Vec<(u64, u64)>,
    /// Whether this settle side counts `messages_acked`: not under the push spool, which counts
    /// its 2xx answers ([`crate::source::push::settle::SpoolSettle`]).
    counts_acks: bool,
}

impl CheckpointSettle {
    /// What to do about a run stopped by bad input, for its error message.
    fn bad_input_hint(&self) -> String {
        let resume = match &self.path {
            Some(p) => format!(
                "fix the line and run again: --checkpoint {} resumes after what was written",
                p.display()
            ),
            None => "with --checkpoint FILE a rerun resumes after what was written instead of writing it again".to_string(),
        };
        format!("--on-bad-input fail stops at the first bad line; --on-bad-input skip logs it and goes on; {resume}")
    }

    /// The settle side of a source read from a checkpoint: the checkpoint file `path` loaded,
    /// so reading resumes where it left off, or created (`None`: kept in memory only), under
    /// the id `input`; then the dead-letter file `dead_letter`, if any, opened with the
    /// subscription's delivery limit (5 without a dead-letter policy). `name` names the input
    /// in messages.
    pub fn open(
        path: Option<PathBuf>,
        input: &str,
        name: String,
        sub: &ValidSubscription,
        on_bad_input: OnBadInput,
        dead_letter: Option<&Path>,
    ) -> Result<CheckpointSettle, SettleError> {
        let cp = match &path {
            Some(p) => Checkpoint::load_or_new(p, input)?,
            None => Checkpoint::new(input),
        };
        let dead_letter = match dead_letter {
            Some(p) => Some(DeadLetterFile::open(p, Self::max_attempts(sub))?),
            None => None,
        };
        Ok(CheckpointSettle::new(
            cp,
            path,
            name,
            sub.name.clone(),
            on_bad_input,
            dead_letter,
        ))
    }

    /// Deliveries of a message before it is dead-lettered: the subscription's policy, else 5.
    pub fn max_attempts(sub: &ValidSubscription) -> u32 {
        sub.delivery.dead_letter.as_ref().map_or(5, |(_, max)| *max)
    }

    /// `cp`: the loaded checkpoint (or a new one); `path`: where it is saved (`None`: not saved).
    pub fn new(
        cp: Checkpoint,
        path: Option<PathBuf>,
        source_name: String,
        subscription: String,
        on_bad_input: OnBadInput,
        dead_letter: Option<DeadLetterFile>,
    ) -> CheckpointSettle {
        CheckpointSettle {
            consumed: (cp.offset, cp.line),
            cp,
            path,
            source_name,
            subscription,
            on_bad_input,
            dead_letter,
            inflight: HashMap::new(),
            stuck: Vec::new(),
            fixed: Vec::new(),
            redelivering: None,
            passing: Vec::new(),
            counts_acks: true,
        }
    }

    /// Leave `messages_acked` to the settle side around this one (the push spool).
    pub fn acks_counted_elsewhere(&mut self) {
        self.counts_acks = false;
    }

    /// Where reading resumes: (byte offset, line).
    pub fn start(&self) -> (u64, u64) {
        (self.cp.offset, self.cp.line)
    }

    /// The messages of the failed file that started at `first` are written again in this run
    /// (the push spool's retry, [`crate::source::push::settle::SpoolSettle`]): the watermark waits for
    /// the files they are in now, no longer for the failure.
    pub fn unstick(&mut self, first: u64) {
        self.stuck.retain(|s| s.0 != first);
    }

    /// The watermark: every message starting before this offset is settled.
    pub fn watermark(&self) -> u64 {
        self.cp.offset
    }

    /// `r` is passed over: the watermark may move past it.
    fn consume(&mut self, end: u64, line: u64) {
        self.consumed = (end, line + 1);
    }

    fn save(&self) -> Result<(), SettleError> {
        match &self.path {
            Some(p) => Ok(self.cp.save(p)?),
            None => Ok(()),
        }
    }

    fn advance(
        &mut self,
        open: impl Iterator<Item = (u64, u64)>,
        summary: &mut RunSummary,
    ) -> Result<(), SettleError> {
        let w = open
            .chain(self.inflight.values().copied())
            .chain(self.stuck.iter().copied())
            .chain(std::iter::once(self.consumed))
            .min_by_key(|p| p.0)
            .expect("consumed is always there");
        if w.0 > self.cp.offset {
            self.cp.offset = w.0;
            self.cp.line = w.1;
            self.cp.prune();
        }
        let watermark = self.cp.offset;
        let mut passed = 0;
        self.passing.retain(|&(last, n)| {
            let behind = last < watermark;
            if behind {
                passed += n;
            }
            !behind
        });
        if self.counts_acks {
            summary.messages_acked += passed;
        }
        self.save()
    }

    /// A message the table writer refused fails alone (§4.6). No broker redelivers from a file, so
    /// with a dead-letter file the run redelivers it itself ([`Verdict::Redeliver`]), up to the
    /// subscription's max delivery attempts (counting earlier runs' attempts, kept in the
    /// checkpoint), then appends it to the dead-letter file. Without one it stays not done and is
    /// reported.
    fn fail_alone(
        &mut self,
        r: &Received,
        error: String,
        summary: &mut RunSummary,
    ) -> Result<Verdict, SettleError> {
        let offset = r.receipt.start;
        let line = r.receipt.line;
        let attempts = match self.redelivering.take() {
            Some((o, next)) if o == offset => next,
            _ => {
                let attempts = self.cp.attempts(offset) + 1;
                let source_name = &self.source_name;
                tracing::error!(file = %source_name, line, "{source_name}:{line}: {error} (delivery attempt {attempts})");
                attempts
            }
        };
        if let Some(dl) = &self.dead_letter {
            if attempts < dl.max_attempts {
                self.redelivering = Some((offset, attempts + 1));
                return Ok(Verdict::Redeliver);
            }
            self.dead_lettered(r, attempts, &error, summary)?;
        } else {
            self.not_done(r, attempts, &error, summary);
        }
        self.consume(r.receipt.end, line);
        Ok(Verdict::Continue)
    }

    /// Append `r`, which had `attempts` deliveries, to the dead-letter file: it is done.
    fn dead_lettered(
        &mut self,
        r: &Received,
        attempts: u32,
        error: &str,
        summary: &mut RunSummary,
    ) -> Result<(), SettleError> {
        let Some(dl) = self.dead_letter.as_mut() else {
            return Ok(());
        };
        let (project, sub_id) = split_subscription(&self.subscription);
        let mut m = dead_letter_message(&r.msg, attempts, &project, &sub_id, error);
        // A file has no topic to assign a new id: keep the original one, for tracing.
        m.message_id.clone_from(&r.msg.message_id);
        dl.write(&m)?;
        tracing::warn!(
            "{}:{}: message {:?} dead-lettered to {} after {attempts} attempts",
            self.source_name,
            r.receipt.line,
            r.msg.message_id,
            dl.path().display()
        );
        self.cp.clear_failure(r.receipt.start);
        summary.messages_dead_lettered += 1;
        Ok(())
    }

    /// `r` failed alone and stays not done: recorded in the checkpoint (the watermark stays
    /// before it), listed in the summary.
    fn not_done(&mut self, r: &Received, attempts: u32, error: &str, summary: &mut RunSummary) {
        let (offset, line) = (r.receipt.start, r.receipt.line);
        self.cp
            .record_failure(offset, line, &r.msg.message_id, attempts, error);
        self.stuck.push((offset, line));
        summary.messages_failed += 1;
        if summary.failed_messages.len() < MAX_LISTED_FAILURES {
            summary.failed_messages.push(FailedMessage {
                line,
                message_id: r.msg.message_id.clone(),
                attempts,
                error: error.to_string(),
            });
        }
    }
}

impl CheckpointSettle {
    /// Messages of a durable file that the destination rejected one by one (rows BigQuery
    /// refused) fail alone. They are not pushed again within the run — they would land out of
    /// input order in a later file, whose span could then not be exact — so each rejection is
    /// one delivery attempt, and BigQuery's verdict on a row does not change within seconds: with
    /// a dead-letter file the message goes there at once (with its attempts so far); without
    /// one it stays not done, recorded in the checkpoint, whose watermark and committed spans do
    /// not pass it; the next run writes it again.
    fn rejected(
        &mut self,
        contents: &FileContents,
        w: &Written,
        summary: &mut RunSummary,
    ) -> Result<(), SettleError> {
        for rej in &w.rejected {
            let Some(r) = contents.held.get(rej.index) else {
                continue;
            };
            let offset = r.receipt.start;
            let attempts = self.cp.attempts(offset) + 1;
            tracing::error!(
                "{}:{}: {} (delivery attempt {attempts})",
                self.source_name,
                r.receipt.line,
                rej.error
            );
            // Its failure record is what it is now, not cleared by the file's durability.
            self.fixed.retain(|&o| o != offset);
            if self.dead_letter.is_some() {
                self.dead_lettered(r, attempts, &rej.error, summary)?;
            } else {
                self.not_done(r, attempts, &rej.error, summary);
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Settle for CheckpointSettle {
    fn admit(&mut self, r: &Received, group: Option<&str>, summary: &mut RunSummary) -> Admission {
        if self.cp.covers(group, r.receipt.start) {
            summary.messages_already_written += 1;
            self.consume(r.receipt.end, r.receipt.line);
            return Admission::Skip;
        }
        match self.cp.replay_for(group, r.receipt.start) {
            Some(replay) => Admission::Replay(Replay {
                object: replay.object.clone(),
                last: replay.span.last,
            }),
            None => Admission::Write(None),
        }
    }

    fn written(&mut self, r: &Received) {
        self.redelivering = None;
        self.consume(r.receipt.end, r.receipt.line);
        if !self.cp.failed.is_empty() && self.cp.attempts(r.receipt.start) > 0 {
            self.fixed.push(r.receipt.start);
        }
    }

    fn filtered(&mut self, r: &Received) {
        self.consume(r.receipt.end, r.receipt.line);
    }

    fn bad_line(&mut self, bad: &BadLine) -> Verdict {
        if self.on_bad_input == OnBadInput::Fail {
            return Verdict::Stop(format!("{bad} ({})", self.bad_input_hint()));
        }
        self.consume(bad.end, bad.line);
        Verdict::Continue
    }

    async fn refused(
        &mut self,
        r: &Received,
        error: Refused,
        refusal: Refusal,
        summary: &mut RunSummary,
    ) -> Result<Verdict, SettleError> {
        match refusal {
            Refusal::FailsAlone => self.fail_alone(r, error.to_string(), summary),
            Refusal::BadInput => {
                let what = format!("{}:{}: {error}", self.source_name, r.receipt.line);
                tracing::error!(file = %self.source_name, line = r.receipt.line, "{what}");
                if self.on_bad_input == OnBadInput::Fail {
                    return Ok(Verdict::Stop(format!("{what} ({})", self.bad_input_hint())));
                }
                self.consume(r.receipt.end, r.receipt.line);
                Ok(Verdict::Continue)
            }
        }
    }

    fn begin(&mut self, f: Handover<'_>) -> Result<(), SettleError> {
        self.cp.pending.push(ObjectSpan {
            object: f.name.to_string(),
            span: f.contents.span.clone(),
        });
        self.inflight
            .insert(f.id, (f.contents.span.first, f.contents.first_line));
        self.save()
    }

    async fn end(&mut self, ended: Ended<'_>, summary: &mut RunSummary) -> Result<(), SettleError> {
        let Ended {
            id,
            name,
            contents,
            result,
            open_starts,
        } = ended;
        let start = self
            .inflight
            .remove(&id)
            .expect("a file being made durable");
        let idx = self
            .cp
            .pending
            .iter()
            .position(|p| p.object == name)
            .expect("recorded as pending");
        let pending = self.cp.pending.remove(idx);
        if let Ok(w) = &result {
            self.rejected(contents, w, summary)?;
            let written = contents.messages.saturating_sub(w.rejected.len() as u64);
            self.passing.push((pending.span.last, written));
        }
        if result.is_ok() {
            // Messages that failed in an earlier run and are in this file are done now.
            let cp = &mut self.cp;
            let span = &pending.span;
            self.fixed.retain(|&o| {
                let inside = span.first <= o && o <= span.last;
                if inside {
                    cp.clear_failure(o);
                }
                !inside
            });
            self.cp.replayed(&pending.object);
            self.cp.committed.push(pending);
        } else {
            self.stuck.push(start);
        }
        self.advance(open_starts.into_iter(), summary)
    }

    async fn close(&mut self, summary: &mut RunSummary) -> Result<(), SettleError> {
        self.advance(std::iter::empty(), summary)
    }

    fn resume(&mut self) -> Option<&mut dyn Resume> {
        Some(self)
    }
}

/// Objects of previous runs whose fate is unknown are looked up: present ⇒ committed; absent ⇒ to
/// replay (written again under the same name with the same messages, put-if-absent, since a put
/// of the crashed run may still land).
impl Resume for CheckpointSettle {
    fn unresolved(&self) -> Vec<String> {
        self.cp.unresolved()
    }

    fn resolve(&mut self, durable: &HashSet<String>) -> Result<(), SettleError> {
        self.cp.resolve(durable);
        self.save()
    }
}
