//! What every source hands the pipeline, whichever source it is: the [`Source`] trait and its
//! events ([`SourceEvent`], [`BadLine`]).
//!
//! The pipeline (`app.rs`) sees sources only through this module, [`crate::connect`] and
//! [`crate::registry`]; the sources themselves live in [`crate::source`].

use crate::flow::FlowLimit;
use crate::message::{Received, WireError};
use crate::summary::RunSummary;
use crate::telemetry::metrics::SubscriptionMetrics;

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
    /// Report what the source keeps of its own: its metrics (a push spool's gauges, an archive's
    /// object counts) and the messages it settled itself, without the pipeline, into the summary
    /// (a push endpoint with a spool: those its checks filtered or refused before accept). Called
    /// every second and at the end of the run, before the pipeline's counters are published.
    fn report(&mut self, _metrics: &SubscriptionMetrics, _summary: &mut RunSummary) {}
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
