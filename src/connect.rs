//! What connecting a source takes ([`Context`]) and gives ([`Connected`]): the source, the settle
//! side that goes with it, and whether its messages come shaped already.

use std::sync::Arc;

use crate::config::ValidSubscription;
use crate::input::Source;
use crate::position::Positions;
use crate::pubsub::PubsubError;
use crate::resources::Resources;
use crate::settle::{Settle, SettleError};
use crate::shape::Shaper;
use crate::shutdown::Grace;

/// What a source is connected with: the run's subscription, the process's resources, the run's
/// [`Shaper`] (for a source that checks a message before it accepts it), its shutdown grace and
/// the destination's stream positions.
#[derive(Clone)]
pub struct Context<'a> {
    pub subscription: &'a ValidSubscription,
    pub resources: &'a Resources,
    pub shaper: Arc<Shaper>,
    /// The run's shutdown grace: a source that answers senders stops accepting the moment the
    /// shutdown is asked for, whatever the pipeline is waiting on then.
    pub grace: Option<Grace>,
    /// How far the destination holds each stream, for a source whose messages carry a stream
    /// position ([`crate::sink::Stage::positions`]).
    pub positions: Option<Arc<dyn Positions>>,
}

/// A source, connected, and the settle side that goes with it.
pub struct Connected {
    pub source: Box<dyn Source>,
    pub settle: Box<dyn Settle>,
    /// Its messages passed the run's [`Shaper`] before the source accepted them: the pipeline
    /// neither filters nor transforms them again.
    pub shaped: bool,
}

impl Connected {
    /// `source` and `settle`, whose messages the pipeline shapes.
    pub fn new(source: impl Source + 'static, settle: impl Settle + 'static) -> Connected {
        Connected {
            source: Box::new(source),
            settle: Box::new(settle),
            shaped: false,
        }
    }
}

/// Why a source could not start: exit 1 (the flags were fine), or 2 for what
/// [`SourceError::is_config`] says is a configuration the broker showed to be wrong.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot read {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--checkpoint needs a file source (stdin cannot be resumed)")]
    CheckpointOnStdin,
    #[error(transparent)]
    Pubsub(#[from] PubsubError),
    /// A source's own error (its connection, its endpoint, its listing).
    #[error(transparent)]
    Source(SourceFailure),
    /// The checkpoint or the dead-letter file.
    #[error(transparent)]
    Settle(#[from] SettleError),
    /// `--source pubsub`: the server says the subscription does not exist.
    #[error("Pub/Sub subscription {name} does not exist ({target} answered NOT_FOUND): create it, or fix the subscription's name")]
    NoSubscription { name: String, target: String },
}

impl SourceError {
    /// A source's own error `error`; `config`: whether it shows the configuration to be wrong
    /// ([`SourceError::is_config`]).
    pub fn of(error: impl std::error::Error + Send + Sync + 'static, config: bool) -> SourceError {
        SourceError::Source(SourceFailure {
            error: Box::new(error),
            config,
        })
    }

    /// Is it a configuration error, found before anything was read (the binary exits 2), rather
    /// than a failure to reach or read the source (exit 1)? A dead-letter subject no stream
    /// stores, a dead-letter policy without a subject, an existing NATS consumer without explicit
    /// acks, `--checkpoint` with stdin.
    pub fn is_config(&self) -> bool {
        match self {
            SourceError::CheckpointOnStdin | SourceError::NoSubscription { .. } => true,
            SourceError::Source(e) => e.config,
            _ => false,
        }
    }
}

/// A source's own error, as it is ([`SourceError::of`]): its text and its causes are the error's.
#[derive(Debug)]
pub struct SourceFailure {
    error: Box<dyn std::error::Error + Send + Sync>,
    config: bool,
}

impl std::fmt::Display for SourceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for SourceFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}
