//! Settling: what happens to a message once the file holding it is durable — or fails — and to a
//! message that never reaches a file. Settling never drives the writer: where a settle side wants
//! a message written again within the run, it says so ([`Verdict::Redeliver`]) and the pipeline
//! does it.
//!
//! One trait, [`Settle`], for what every kind of source does, and two capabilities only some have:
//! [`Leases`] (a broker that redelivers a message whose lease lapses) and [`Resume`] (files a
//! crashed run left pending, looked up at startup). Brokers differ only in how they ack, fail and
//! extend a delivery ([`Broker`]); what they do alike is written once, in [`Brokered`].
//!
//! Here: [`watermark::CheckpointSettle`] (+ [`Resume`]), settling by a checkpoint's watermark
//! ([`crate::checkpoint_file`]) — the file source, an archive, a push spool — and [`Brokered`], a
//! broker's settling written once. Each source's own settle side (its [`Broker`], or a wrapper of
//! the checkpoint settle) lives in its folder, `source/<name>/settle.rs`: what "settled" means for
//! it (acked, a 2xx answer, a committed watermark) is the source's business.
//!
//! Beside them: [`dead_letter`] (the dead-letter message and file, the retry backoff).
//!
//! The contract every implementation keeps (docs/contract.md §2.4, §2.8, §2.9, §6): a message is
//! settled only after the file holding it is durable; a filtered message is settled at once (§2.5);
//! a failed file's messages are never settled as done.

pub mod dead_letter;
pub mod watermark;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::checkpoint_file::CheckpointError;
use crate::input::BadLine;
use crate::message::Received;
use crate::receipt::{
    AckRef, FileContents, Handover, NotDurable, Refusal, Refused, Replay, Written,
};
use crate::summary::RunSummary;

/// Errors that stop a run on the settle side.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("dead-letter file {path}: {source}")]
    DeadLetter {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Whether a message goes to the writer.
#[derive(Debug)]
pub enum Admission {
    /// Write it; `Some` holds how a pulled message is settled later.
    Write(Option<AckRef>),
    /// Write it as the first message of a file a crashed run left pending, to be written again
    /// exactly (file sources; see [`crate::checkpoint_file`]).
    Replay(Replay),
    /// Do not write it: it is settled already — a previous run wrote it (its object is committed in
    /// the checkpoint), or the settle side handed it back (a blocked ordering key).
    Skip,
}

/// A file that came back from being made durable, as [`Settle::end`] takes it.
pub struct Ended<'a> {
    /// Identifies the file (opening order), as [`Handover::id`] did.
    pub id: u64,
    /// Its object name, or data file path relative to the table root.
    pub name: &'a str,
    /// What it holds.
    pub contents: &'a FileContents,
    /// Durable (what was written, with the messages the destination rejected one by one), or why
    /// not.
    pub result: Result<&'a Written, NotDurable>,
    /// The (offset, line) starts of the files still open, or finalized and not yet handed over:
    /// a watermark must not pass them.
    pub open_starts: Vec<(u64, u64)>,
}

/// What the pipeline does after a bad line or a refused message.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    /// Stop reading (`--on-bad-input fail`); the reason goes to the summary.
    Stop(String),
    /// Write the refused message again now, as a plain message of the current file (the file
    /// source's own redelivery, which no broker does for it); if it is refused again,
    /// [`Settle::refused`] is asked again.
    Redeliver,
}

/// The settle side of a run.
#[async_trait::async_trait]
pub trait Settle: Send {
    /// A message is about to go to the writer.
    fn admit(&mut self, r: &Received, group: Option<&str>, summary: &mut RunSummary) -> Admission;

    /// `r` is in an open file now.
    fn written(&mut self, r: &Received);

    /// `r` did not match the subscription's filter: settle it without writing it (§2.5).
    fn filtered(&mut self, r: &Received);

    /// The source's batch is through the writer: settle what [`Settle::filtered`] collected.
    async fn batch_done(&mut self) {}

    /// A line of input that is not a message (file sources).
    fn bad_line(&mut self, bad: &BadLine) -> Verdict;

    /// The sink refused `r` with `error` (counted as bad already, on its first refusal).
    async fn refused(
        &mut self,
        r: &Received,
        error: Refused,
        refusal: Refusal,
        summary: &mut RunSummary,
    ) -> Result<Verdict, SettleError>;

    /// `file` is about to be made durable (the checkpoint records it as pending first).
    fn begin(&mut self, file: Handover<'_>) -> Result<(), SettleError>;

    /// A file is durable ([`Ended::result`] Ok, its bytes) or failed. The messages a durable
    /// file's [`Written::rejected`] names fail alone, as a message the sink refused with
    /// [`Refusal::FailsAlone`]; the others are settled as durable.
    async fn end(&mut self, ended: Ended<'_>, summary: &mut RunSummary) -> Result<(), SettleError>;

    /// The run is over; files still being made durable (past a shutdown's grace) are not done.
    async fn close(&mut self, summary: &mut RunSummary) -> Result<(), SettleError>;

    /// Are the messages of a failed file handed back for redelivery (a broker), so that an ordered
    /// subscription may start afresh once every later file has failed too? A file source keeps
    /// them not done for the rest of the run instead.
    fn failures_redelivered(&self) -> bool {
        false
    }

    /// The leases of messages not yet durable, if the source holds any.
    fn leases(&mut self) -> Option<&mut dyn Leases> {
        None
    }

    /// Files a crashed run left pending, if the source can have any.
    fn resume(&mut self) -> Option<&mut dyn Resume> {
        None
    }
}

/// A source that leases messages: unless extended, a lease lapses and the message is delivered
/// again (written twice).
#[async_trait::async_trait]
pub trait Leases: Send {
    /// How often the pipeline extends them.
    fn period(&self) -> Duration;

    /// Extend the leases of `open` (messages in open files) and of every file being made durable.
    async fn extend(&mut self, open: Vec<String>);
}

/// A source whose earlier run may have left files pending (recorded before they were handed over,
/// their fate unknown after a crash). Before reading, the pipeline asks the sink about each.
pub trait Resume: Send {
    /// The names of the files whose fate is unknown.
    fn unresolved(&self) -> Vec<String>;

    /// Of those, `durable` are durable; the rest are not (their messages are written again).
    fn resolve(&mut self, durable: &HashSet<String>) -> Result<(), SettleError>;
}

/// How a broker that delivers messages one by one settles a delivery: the part in which Pub/Sub,
/// push and NATS JetStream differ. Everything else is [`Brokered`]'s.
#[async_trait::async_trait]
pub trait Broker: Send {
    /// The subscription, for logs.
    fn subscription(&self) -> &str;

    /// Is a dead-letter destination attached?
    fn dead_letters(&self) -> bool;

    /// How `r` is settled later (its ack id, delivery attempt, and the message itself when a
    /// failure would dead-letter it).
    fn ack_ref(&self, r: &Received) -> AckRef;

    /// Whether `r` goes to the writer (Pub/Sub holds back later messages of a blocked ordering
    /// key).
    fn admit(&mut self, r: &Received, _summary: &mut RunSummary) -> Admission {
        Admission::Write(Some(self.ack_ref(r)))
    }

    /// The source's batch is through the writer: ack `filtered`, the ack ids of its messages the
    /// filter did not match (and settle whatever else the broker gathers per batch).
    async fn batch_done(&mut self, filtered: Vec<String>);

    /// Settle deliveries that failed with `error`: dead-letter those on their last attempt,
    /// redeliver the others — after their backoff, or at once with `backoff: false`.
    async fn fail(
        &mut self,
        acks: Vec<AckRef>,
        error: &str,
        backoff: bool,
        summary: &mut RunSummary,
    );

    /// Ack messages whose file is durable; `false` when the broker may not have them (they may be
    /// redelivered).
    async fn ack_durable(&mut self, ids: &[String]) -> bool;

    /// The run is over and these messages' files were not durable in time: hand them back.
    async fn hand_back(&mut self, acks: Vec<AckRef>, summary: &mut RunSummary);

    /// How often leases are extended (`None`: no leases).
    fn lease_period(&self) -> Option<Duration> {
        None
    }

    /// Extend the leases of `ids`.
    async fn extend_leases(&mut self, _ids: Vec<String>) {}
}

/// The settle side of every [`Broker`]: ack references travel with their file, a durable file's
/// messages are acked, a failed file's failed, a refused message fails alone — never a reason to
/// stop the worker.
pub struct Brokered<B> {
    broker: B,
    /// Ack references of the files being made durable.
    inflight: HashMap<u64, Vec<AckRef>>,
    /// Ack ids of filtered messages of the current batch, settled together.
    filtered: Vec<String>,
}

impl<B: Broker> Brokered<B> {
    pub fn new(broker: B) -> Brokered<B> {
        Brokered {
            broker,
            inflight: HashMap::new(),
            filtered: Vec::new(),
        }
    }
}

#[async_trait::async_trait]
impl<B: Broker> Settle for Brokered<B> {
    fn admit(&mut self, r: &Received, _group: Option<&str>, summary: &mut RunSummary) -> Admission {
        self.broker.admit(r, summary)
    }

    fn written(&mut self, _r: &Received) {}

    fn filtered(&mut self, r: &Received) {
        self.filtered.extend(r.receipt.ack_id.clone());
    }

    async fn batch_done(&mut self) {
        let filtered = std::mem::take(&mut self.filtered);
        self.broker.batch_done(filtered).await;
    }

    fn bad_line(&mut self, _bad: &BadLine) -> Verdict {
        Verdict::Continue
    }

    /// A message that cannot be written is a failed delivery (redelivered, at its last attempt
    /// dead-lettered).
    async fn refused(
        &mut self,
        r: &Received,
        error: Refused,
        refusal: Refusal,
        summary: &mut RunSummary,
    ) -> Result<Verdict, SettleError> {
        let a = self.broker.ack_ref(r);
        let b = &mut self.broker;
        tracing::error!(message_id = %r.msg.message_id, "{}: {error}", b.subscription());
        let backoff = refusal.backs_off(b.dead_letters());
        b.fail(vec![a], &error.to_string(), backoff, summary).await;
        Ok(Verdict::Continue)
    }

    fn begin(&mut self, f: Handover<'_>) -> Result<(), SettleError> {
        self.inflight
            .insert(f.id, std::mem::take(&mut f.contents.acks));
        Ok(())
    }

    /// A durable file's messages are acked, except the ones the destination rejected, which fail
    /// alone (without backoff when a dead-letter destination takes them sooner, §4.1); a failed
    /// file's messages are all failed.
    async fn end(&mut self, ended: Ended<'_>, summary: &mut RunSummary) -> Result<(), SettleError> {
        let name = ended.name;
        let acks = self.inflight.remove(&ended.id).unwrap_or_default();
        let b = &mut self.broker;
        match &ended.result {
            Ok(w) => {
                let (acks, rejected) = w.split(acks);
                let backoff = Refusal::FailsAlone.backs_off(b.dead_letters());
                for (a, why) in rejected {
                    tracing::error!("{}: {why}", b.subscription());
                    b.fail(vec![a], &why, backoff, summary).await;
                }
                let ids: Vec<String> = acks.into_iter().map(|a| a.ack_id).collect();
                // Counted and logged once the broker has the acks, not when they are queued.
                if b.ack_durable(&ids).await {
                    summary.messages_acked += ids.len() as u64;
                    tracing::info!(object = %name, messages = ids.len(), "acked after durable");
                }
            }
            Err(e) => b.fail(acks, &e.to_string(), true, summary).await,
        }
        Ok(())
    }

    /// Whatever is still being made durable past the grace period is handed back.
    async fn close(&mut self, summary: &mut RunSummary) -> Result<(), SettleError> {
        let rest: Vec<AckRef> = self.inflight.drain().flat_map(|(_, v)| v).collect();
        self.broker.hand_back(rest, summary).await;
        Ok(())
    }

    fn failures_redelivered(&self) -> bool {
        true
    }

    fn leases(&mut self) -> Option<&mut dyn Leases> {
        match self.broker.lease_period() {
            Some(_) => Some(self),
            None => None,
        }
    }
}

#[async_trait::async_trait]
impl<B: Broker> Leases for Brokered<B> {
    fn period(&self) -> Duration {
        self.broker.lease_period().unwrap_or(Duration::MAX)
    }

    async fn extend(&mut self, open: Vec<String>) {
        let ids: Vec<String> = open
            .into_iter()
            .chain(self.inflight.values().flatten().map(|a| a.ack_id.clone()))
            .collect();
        self.broker.extend_leases(ids).await;
    }
}
