//! Sources of messages, one file per broker, behind one trait.
//!
//! Today: a local NDJSON file or stdin (`file`), a Pub/Sub subscription (`pubsub`), Pub/Sub push
//! requests (`push`), a NATS JetStream durable pull consumer (`nats`), a Kafka consumer group
//! (`kafka`). A source hands out messages
//! in chunks; settling them (ack / checkpoint) happens only after the file holding them is durable,
//! on the settle side that goes with the source ([`crate::settle`]). A source's flags are a
//! clap `Args` struct in its module; [`crate::registry`] maps `--source` to them, checks them once and
//! holds each source's constructor from its typed settings to its source and settle side.

pub mod archive;
pub mod file;
pub mod flags;
pub mod kafka;
pub mod nats;
pub mod pubsub;
pub mod pubsub_args;
pub mod push;
pub mod spool;

use crate::flow::FlowLimit;
use crate::message::{Received, WireError};

/// A line of input that is not a valid message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{file}:{line}: {error}")]
pub struct BadLine {
    pub file: String,
    pub line: u64,
    pub start: u64,
    pub end: u64,
    pub error: WireError,
}

/// What a source yields.
#[derive(Debug)]
pub enum SourceEvent {
    Messages(Vec<Received>),
    Bad(BadLine),
    /// The source could not be read (I/O error); no more events follow.
    Failed(String),
}

/// A source of messages.
#[async_trait::async_trait]
pub trait Source: Send {
    /// The next event; `None` at the end of input.
    async fn next(&mut self) -> Option<SourceEvent>;
    /// A name for messages: the file path or `-`.
    fn describe(&self) -> &str;
    /// Stop (a graceful shutdown). `true`: the source keeps handing out what it already received,
    /// then ends with `None` — keep calling [`Source::next`]. `false`: just stop reading.
    fn stop(&mut self) -> bool {
        false
    }
    /// Is the source connected (readiness)? A file is, once open; a broker while its stream is up.
    fn connected(&self) -> bool {
        true
    }
    /// Times the source reopened its connection after it broke, so far (`subsink_retries_total`
    /// with `kind="stream"`).
    fn reconnects(&self) -> u64 {
        0
    }
    /// The broker's flow control: how much may be delivered and not yet settled before it sends
    /// nothing more (NATS: the consumer's `MaxAckPending`; Pub/Sub: `max_outstanding_messages` /
    /// `max_outstanding_bytes`). `None`: the source is not held back so (a file, push). The
    /// pipeline finalizes open files early before it starves them ([`crate::flow`]).
    fn flow_limit(&self) -> Option<FlowLimit> {
        None
    }
    /// What a push source's spool holds now (metrics); `None`: the source has no spool.
    fn spool(&self) -> Option<crate::spool::SpoolStats> {
        None
    }

    /// Have its messages passed the subscription's filter and transforms already (a push
    /// endpoint with a spool runs them before accept)? Then the pipeline runs neither again.
    fn shaped(&self) -> bool {
        false
    }

    /// Add to the summary the messages the source settled itself, without the pipeline (a push
    /// endpoint with a spool: those its checks filtered or refused before accept). Called every
    /// second and at the end of the run.
    fn count(&mut self, _summary: &mut crate::summary::RunSummary) {}

    /// What an archive source counted so far (metrics); `None`: not an archive source.
    fn archive(&self) -> Option<crate::telemetry::metrics::ArchiveCounts> {
        None
    }
    /// Why the source is not ready, when [`Source::connected`] says it is not and it knows why
    /// (`/readyz` shows it).
    fn problem(&self) -> Option<String> {
        None
    }
    /// Does the broker say, as last heard, that it sends nothing more because its limit is
    /// reached? Where several workers share one limit (a NATS consumer's `MaxAckPending`), it is
    /// reached while each holds less than half of it.
    fn held_back(&self) -> bool {
        false
    }
}
