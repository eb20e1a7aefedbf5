//! A message a sink cannot hold ([`Refused`]), what that means for its delivery ([`Refusal`]),
//! and the check a source asks before it accepts a message ([`MessageCheck`]).

use crate::message::Message;

/// A message a sink cannot hold: nothing was written for it. The error names the message id and the
/// rule it broke.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// It cannot be encoded in the object format (e.g. it does not match the topic schema).
    #[error(transparent)]
    Encode(#[from] crate::encode::EncodeError),
    /// It cannot be a row of the table.
    #[error(transparent)]
    Row(#[from] crate::table::RowError),
    /// A Single Message Transform failed it before it reached the sink (it fails alone).
    #[error(transparent)]
    Transform(#[from] crate::transform::TransformError),
    /// Its partitioned object path cannot be stored (`subsink.paths`: a value too long).
    #[error(transparent)]
    Path(#[from] crate::paths::PathError),
}

/// What a sink would refuse of a message on its own (the topic schema, the table's row rules),
/// asked before the message is accepted: the push endpoint's checks before it spools a message
/// and answers 2xx ([`crate::shape::Shaper::check`]). The same rules as
/// [`crate::sink::SinkFile::stage`].
pub trait MessageCheck: Send + Sync {
    fn check(&self, msg: &Message) -> Result<(), Refused>;
}

/// What a refused message means for its delivery — a property of the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Bad input: a file source applies `--on-bad-input`; a broker redelivers it with the retry
    /// policy's backoff and dead-letters it at the last attempt.
    BadInput,
    /// The message fails alone, the others go on (a BigQuery subscription's rows, §4.6): a file
    /// source redelivers it within the run up to the delivery limit, then dead-letters it or keeps
    /// it not done; a broker redelivers it — without backoff when a dead-letter topic is attached.
    FailsAlone,
}

impl Refusal {
    /// Is a broker's redelivery of a refused message delayed by the retry policy? Not for a
    /// message that fails alone when a dead-letter destination exists: it goes there sooner
    /// (docs/contract.md §4.1).
    pub fn backs_off(self, dead_letter: bool) -> bool {
        !(self == Refusal::FailsAlone && dead_letter)
    }
}
