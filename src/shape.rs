//! What the pipeline makes of a message before it reaches the sink, as one value: the
//! subscription's filter (docs/contract.md §2.5), then its transforms (docs/transforms.md), then
//! what the sink refuses of a message on its own ([`MessageCheck`]).
//!
//! The pipeline runs the filter and the transforms on every batch it reads ([`Shaper::passes`],
//! [`Shaper::apply`]); the sink's own rules it meets when it stages the message. A source that
//! must answer for a message before the pipeline sees it (a push endpoint with a spool answers 2xx
//! once the message is spooled) runs the same [`Shaper`], whole, on one message
//! ([`Shaper::check`]), and hands the pipeline what passed as already shaped.

use std::sync::Arc;

use crate::encode::EncodeError;
use crate::filter::Filter;
use crate::message::{Message, Received};
use crate::receipt::{MessageCheck, Refused};
use crate::transform::{Outcome, Transforms};

/// The run's filter, transforms and sink checks.
pub struct Shaper {
    filter: Filter,
    transforms: Option<Arc<Transforms>>,
    sink: Option<Arc<dyn MessageCheck>>,
}

impl std::fmt::Debug for Shaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shaper")
            .field("filter", &!self.filter.is_empty())
            .field("transforms", &self.transforms)
            .field("sink", &self.sink.is_some())
            .finish()
    }
}

/// What [`Shaper::check`] found.
#[derive(Debug, PartialEq)]
pub enum Checked {
    /// Accept this (the message as transformed).
    Accept(Message),
    /// The filter does not match, or a transform returned `null`: ack it, write nothing
    /// (docs/contract.md §2.5).
    Filtered,
    /// It can never be written: answer an error (the pusher redelivers, then dead-letters).
    /// The message id and why.
    Refused(String, String),
    /// It cannot be checked now (its topic-schema revision cannot be read): the sender retries.
    Unavailable(String),
}

impl Shaper {
    /// `filter`, then `transforms` (none: messages go on as they came), then `sink`'s own rules.
    pub fn new(
        filter: Filter,
        transforms: Option<Arc<Transforms>>,
        sink: Option<Arc<dyn MessageCheck>>,
    ) -> Shaper {
        Shaper {
            filter,
            transforms,
            sink,
        }
    }

    /// Does the filter let `r` through (on the message as published)?
    pub fn passes(&self, r: &Received) -> bool {
        self.filter.is_empty() || self.filter.matches(&r.msg.attributes)
    }

    /// The transforms, if the subscription has any.
    pub fn transforms(&self) -> Option<&Transforms> {
        self.transforms.as_deref()
    }

    /// The transforms' outcome of every message of `batch` the filter lets through, in batch
    /// order, on every core; empty without transforms.
    pub async fn apply(&self, batch: &[Received]) -> Vec<Option<Outcome>> {
        match &self.transforms {
            Some(t) => t.apply(batch, |r| self.passes(r)).await,
            None => Vec::new(),
        }
    }

    /// The whole path on one message, in pipeline order: filter, transforms, the sink's rules.
    pub async fn check(&self, m: Message) -> Checked {
        if !self.filter.is_empty() && !self.filter.matches(&m.attributes) {
            return Checked::Filtered;
        }
        let m = match &self.transforms {
            None => m,
            Some(t) => match t.apply_one(&m).await {
                Outcome::Keep(m) => m,
                Outcome::Filtered { .. } => return Checked::Filtered,
                Outcome::Failed(e) => return Checked::Refused(m.message_id, e.to_string()),
            },
        };
        if let Some(sink) = &self.sink {
            match sink.check(&m) {
                Ok(()) => {}
                Err(e @ Refused::Encode(EncodeError::SchemaUnavailable { .. })) => {
                    return Checked::Unavailable(e.to_string())
                }
                Err(e) => return Checked::Refused(m.message_id, e.to_string()),
            }
        }
        Checked::Accept(m)
    }
}
