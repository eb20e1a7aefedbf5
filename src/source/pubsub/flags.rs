//! The Pub/Sub source's flags (`run --source pubsub`, and `serve`, which pulls every subscription
//! with them) and the [`PubsubSettings`] they make.

use std::time::Duration;

use clap::Args;

use super::{PubsubSettings, MAX_STREAMS};
use crate::cli::{heading, values};

/// The Pub/Sub source's flags that do not go together (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum PubsubFlagsError {
    #[error("--pubsub-streams {0}: 1–{max} streams are allowed", max = MAX_STREAMS)]
    StreamsOutOfRange(usize),
    #[error(
        "--pubsub-streams {0}: a subscription with enableMessageOrdering is read on one stream"
    )]
    StreamsWithOrdering(usize),
    #[error("--dead-letter is for the file source; Pub/Sub dead-letters to the subscription's deadLetterPolicy topic")]
    DeadLetterFile,
}

/// Flow control, lease and streams of StreamingPull.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = heading::PUBSUB)]
pub struct PubsubArgs {
    /// Pub/Sub flow control (NATS: MaxAckPending of a consumer created here): messages delivered
    /// and not yet settled at most.
    #[arg(long, default_value_t = 10_000)]
    pub max_outstanding_messages: i64,
    /// Pub/Sub flow control: bytes of message data delivered and not yet settled at most.
    #[arg(long, default_value = "100MiB", value_name = "SIZE", value_parser = values::size)]
    pub max_outstanding_bytes: u64,
    /// Pub/Sub: lease set on pulled messages and renewed every third of it until they are
    /// durable (10–600 s).
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = values::duration)]
    pub ack_lease: Duration,
    /// Pub/Sub: StreamingPull streams open at once (1–16; default 2, and 1 with message
    /// ordering, which needs one). The server paces each stream, so more streams deliver more.
    #[arg(long, value_name = "N")]
    pub pubsub_streams: Option<usize>,
}

impl PubsubArgs {
    /// How `subscription` is pulled; `ordering`: it has enableMessageOrdering (one stream).
    pub fn settings(
        &self,
        subscription: &str,
        ordering: bool,
    ) -> Result<PubsubSettings, PubsubFlagsError> {
        let mut p = PubsubSettings::new(subscription);
        p.max_outstanding_messages = self.max_outstanding_messages;
        p.max_outstanding_bytes = self.max_outstanding_bytes as i64;
        p.stream_ack_deadline = self.ack_lease;
        p.streams = self.streams(ordering)?;
        Ok(p)
    }

    /// `--pubsub-streams`: 2 by default, 1 with message ordering (a second stream could hand out
    /// a key's messages beside the first's).
    fn streams(&self, ordering: bool) -> Result<usize, PubsubFlagsError> {
        match self.pubsub_streams {
            None if ordering => Ok(1),
            None => Ok(2),
            Some(n) if !(1..=MAX_STREAMS).contains(&n) => {
                Err(PubsubFlagsError::StreamsOutOfRange(n))
            }
            Some(n) if n > 1 && ordering => Err(PubsubFlagsError::StreamsWithOrdering(n)),
            Some(n) => Ok(n),
        }
    }
}
