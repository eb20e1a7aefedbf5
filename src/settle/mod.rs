//! Settling: what happens to a message once the file holding it is durable — or fails — and to a
//! message that never reaches a file. One trait, one implementation per kind of source.
//!
//! | implementation | source | "settled" means |
//! |---|---|---|
//! | [`file::CheckpointSettle`] | an NDJSON file (or stdin) | the checkpoint's watermark moves past it ([`crate::checkpoint`]) |
//! | [`pubsub::AckSettle`] | a Pub/Sub subscription | acked; on failure nacked after the retry policy's backoff, or dead-lettered |
//! | [`push::PushSettle`] | Pub/Sub push requests | the request answered 2xx; on failure an error status (Pub/Sub redelivers) |
//! | [`nats::NatsSettle`] | a NATS JetStream consumer | acked; on failure nak'ed with the retry policy's delay, or dead-lettered to a subject |
//!
//! Beside them: [`dead_letter`] (the dead-letter message and file, the retry backoff).
//!
//! The contract every implementation keeps (docs/contract.md §2.4, §2.8, §2.9, §6): a message is
//! settled only after the file holding it is durable; a filtered message is settled at once (§2.5);
//! a failed file's messages are never settled as done.

pub mod dead_letter;
pub mod file;
pub mod nats;
pub mod pubsub;
pub mod push;

use std::time::Duration;

use crate::checkpoint::CheckpointError;
use crate::message::Received;
use crate::sink::{
    AckRef, FileContents, FinalizedFile, Refusal, Refused, SinkError, Stage, Written,
};
use crate::source::BadLine;
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
    /// The destination failed while a redelivered message was written, or while looking up what
    /// a previous run left pending.
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// Whether a message goes to the writer.
#[derive(Debug)]
pub enum Admission {
    /// Write it; `Some` holds how a pulled message is settled later.
    Write(Option<AckRef>),
    /// Write it as the first message of a file a crashed run left pending, to be written again
    /// exactly (file sources; see [`crate::checkpoint`]).
    Replay(crate::sink::Replay),
    /// Do not write it: it is settled already — a previous run wrote it (its object is committed in
    /// the checkpoint), or the settle side handed it back (a blocked ordering key).
    Skip,
}

/// Whether the run goes on after a bad message or line.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    /// Stop reading (`--on-bad-input fail`); the reason goes to the summary.
    Stop(String),
}

/// The settle side of a run.
#[async_trait::async_trait]
pub trait Settle: Send {
    /// Before reading: settle what a crashed run left pending, using the sink to look it up.
    async fn resume(&mut self, _stage: &mut dyn Stage) -> Result<(), SettleError> {
        Ok(())
    }

    /// How often the leases of messages not yet durable are extended (`None`: no leases).
    fn lease_period(&self) -> Option<Duration> {
        None
    }

    /// Extend the leases of `open` (messages in open files) and of every file being made durable.
    async fn extend_leases(&mut self, _open: Vec<String>) {}

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

    /// The sink refused `r` (it is counted as bad already). `stage` and `done` are there for a
    /// settle side that redelivers within the run.
    async fn refused(
        &mut self,
        r: &Received,
        error: Refused,
        refusal: Refusal,
        stage: &mut dyn Stage,
        done: &mut Vec<FinalizedFile>,
        summary: &mut RunSummary,
    ) -> Result<Verdict, SettleError>;

    /// `file` is about to be made durable (the checkpoint records it as pending first).
    fn begin(&mut self, file: &mut FinalizedFile) -> Result<(), SettleError>;

    /// The file `id` named `name` is durable (`result` Ok, its bytes) or failed; `open_starts` are
    /// the starts of the files still open. The messages a durable file's [`Written::rejected`]
    /// names fail alone, as a message the sink refused with [`Refusal::FailsAlone`]; the others
    /// are settled as durable.
    async fn end(
        &mut self,
        id: u64,
        name: &str,
        contents: &FileContents,
        result: &Result<Written, SinkError>,
        open_starts: Vec<(u64, u64)>,
        summary: &mut RunSummary,
    ) -> Result<(), SettleError>;

    /// Are the messages of a failed file handed back for redelivery (a broker), so that an ordered
    /// subscription may start afresh once every later file has failed too? A file source keeps
    /// them not done for the rest of the run instead.
    fn failures_redelivered(&self) -> bool {
        false
    }

    /// The run is over; files still being made durable (past a shutdown's grace) are not done.
    async fn close(&mut self, summary: &mut RunSummary) -> Result<(), SettleError>;
}

/// What the settle sides of brokers that lease messages (Pub/Sub, NATS JetStream) do alike once a
/// file is durable or failed ([`broker_end`]); each says how it acks and how it fails a delivery.
#[async_trait::async_trait]
trait Broker: Send {
    /// The subscription, for logs.
    fn subscription(&self) -> &str;

    /// Is a dead-letter destination attached?
    fn dead_letters(&self) -> bool;

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
}

/// [`Settle::refused`] of a broker, for `a`, the ack reference of message `message_id`: a message
/// that cannot be written is a failed delivery (redelivered, at its last attempt dead-lettered),
/// never a reason to stop the worker.
async fn broker_refused(
    b: &mut dyn Broker,
    a: AckRef,
    message_id: &str,
    error: &Refused,
    refusal: Refusal,
    summary: &mut RunSummary,
) -> Verdict {
    tracing::error!(message_id, "{}: {error}", b.subscription());
    let backoff = refusal.backs_off(b.dead_letters());
    b.fail(vec![a], &error.to_string(), backoff, summary).await;
    Verdict::Continue
}

/// [`Settle::end`] of a broker, for the `acks` of the file `name`: a durable file's messages are
/// acked, except the ones the destination rejected, which fail alone (without backoff when a
/// dead-letter destination takes them sooner, §4.1); a failed file's messages are all failed.
async fn broker_end(
    b: &mut dyn Broker,
    name: &str,
    acks: Vec<AckRef>,
    result: &Result<Written, SinkError>,
    summary: &mut RunSummary,
) {
    match result {
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
}
