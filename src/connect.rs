//! What connecting a source takes ([`Context`]) and gives ([`Connected`]): the source, the settle
//! side that goes with it, and whether its messages come shaped already.

use std::sync::Arc;

use crate::config::ValidSubscription;
use crate::input::Source;
use crate::position::Positions;
use crate::resources::Resources;
use crate::settle::Settle;
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
