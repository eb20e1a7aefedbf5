//! A source of messages made in memory, for tests and benchmarks: `--source memory://N` yields N
//! generated messages (`message 0` … `message N-1`, ids `0` … `N-1`) in batches, then ends,
//! settled by a checkpoint kept in memory: every run makes the same N messages anew.
//!
//! It is also the smallest complete source: its registration ([`Memory`]: the `--source` values
//! it takes, its flags — none — and what they make), a [`Source`], its settle side and its
//! constructor ([`start`]), all in this folder, and one line in the registry.

use crate::connect::{
    Claim, Connect, Connected, Context, FlagsError, Register, SharedFlags, SourceError, SourceSpec,
};
use crate::input::{Source, SourceEvent};
use crate::message::{Message, Receipt, Received};
use crate::settle::watermark::{CheckpointSettle, OnBadInput};

/// Messages per batch handed to the pipeline.
const BATCH: u64 = 1000;

/// `memory://N`: `count` generated messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySpec {
    pub count: u64,
}

impl std::fmt::Display for MemorySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "memory://{}", self.count)
    }
}

/// Message `i`: data `message i`, id `i`, published `i` µs after 2023-11-14T22:13:20Z. Its
/// receipt places it at offset `i` of a virtual input, one byte a message, line `i + 1`.
pub fn message(i: u64) -> Received {
    Received {
        msg: Message {
            data: format!("message {i}").into_bytes().into(),
            message_id: i.to_string(),
            publish_time_micros: 1_700_000_000_000_000 + i as i64,
            ..Default::default()
        },
        receipt: Receipt {
            start: i,
            end: i + 1,
            line: i + 1,
            ack_id: None,
            delivery_attempt: None,
            position: None,
        },
    }
}

/// The source: messages `next..end`, then the end of input.
pub struct MemorySource {
    next: u64,
    end: u64,
    name: String,
}

#[async_trait::async_trait]
impl Source for MemorySource {
    async fn next(&mut self) -> Option<SourceEvent> {
        if self.next >= self.end {
            return None;
        }
        let upto = (self.next + BATCH).min(self.end);
        let batch = (self.next..upto).map(message).collect();
        self.next = upto;
        Some(SourceEvent::Messages(batch))
    }

    fn describe(&self) -> &str {
        &self.name
    }
}

/// The source of `spec` and its settle side: a checkpoint kept in memory (a bad message stops the
/// run, as `--on-bad-input fail` does), from which reading starts.
pub fn start(spec: MemorySpec, ctx: &Context<'_>) -> Result<Connected, SourceError> {
    let name = spec.to_string();
    let settle = CheckpointSettle::open(
        None,
        &name,
        name.clone(),
        ctx.subscription,
        OnBadInput::Fail,
        None,
    )?;
    let source = MemorySource {
        next: settle.start().0,
        end: spec.count,
        name,
    };
    Ok(Connected::new(source, settle))
}

/// Why a `memory://` source cannot be made (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum MemoryFlagsError {
    #[error("--source {0}: give the number of messages to make, memory://N")]
    Count(String),
    #[error("--checkpoint and --dead-letter are for the file source; a memory:// source makes its messages anew every run")]
    FileFlags,
}

/// The flags of the memory source: none.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct MemoryArgs {}

/// The memory source as the registry knows it: `memory://N`.
pub struct Memory;

impl Register for Memory {
    type Args = MemoryArgs;
    const FORMS: &'static str = "memory://N";
    const HELP: &'static str = "`memory://N` makes N messages (`message 0` …), for tests";

    fn claims(value: &str) -> Claim {
        Claim::scheme(value, &["memory"])
    }

    fn spec(
        value: &str,
        _: &MemoryArgs,
        shared: &SharedFlags<'_>,
    ) -> Result<SourceSpec, FlagsError> {
        if shared.checkpoint.is_some() || shared.dead_letter.is_some() {
            return Err(FlagsError::of(MemoryFlagsError::FileFlags));
        }
        let count = value.strip_prefix("memory://").and_then(|n| n.parse().ok());
        let count = count.ok_or_else(|| FlagsError::of(MemoryFlagsError::Count(value.into())))?;
        Ok(SourceSpec::new(MemorySpec { count }))
    }
}

#[async_trait::async_trait]
impl Connect for MemorySpec {
    async fn connect(self: Box<Self>, ctx: &Context<'_>) -> Result<Connected, SourceError> {
        start(*self, ctx)
    }

    fn is_broker(&self) -> bool {
        false
    }
}
