//! The registration point of sources: what a `--source` value names ([`SourceKind`]), every
//! source's flags ([`SourceArgs`], each source's own `Args` struct flattened under its heading),
//! the one check of their compatibility ([`SourceArgs::spec`], errors [`FlagsError`], exit 2), and
//! the source with its settle side ([`connect`], each source module's own constructor).
//!
//! Adding a source: a `SourceKind` arm in [`SourceKind::parse`], its `Args` struct flattened into
//! [`SourceArgs`], a [`SourceSpec`] arm built in [`SourceArgs::spec`], and one line in [`connect`]
//! calling the module's `start`.

use std::path::PathBuf;

use clap::Args;

use super::file::{FileArgs, FileSpec};
use super::nats::{NatsArgs, NatsError, NatsSettings};
use super::pubsub::{PubsubClient, PubsubError, PubsubSettings};
use super::pubsub_args::PubsubArgs;
use super::push::{PushArgs, PushError, PushSettings};
use super::Source;
use crate::cli::heading;
use crate::config::ValidSubscription;
use crate::settle::{Settle, SettleError};

/// A source and the settle side that goes with it.
pub type Connected = (Box<dyn Source>, Box<dyn Settle>);

/// What a `--source` value names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    /// NDJSON of Pub/Sub messages: a file, or stdin (`-`, `None`).
    File(Option<PathBuf>),
    /// `pubsub`: the subscription itself, pulled with StreamingPull.
    Pubsub,
    /// `push`: an endpoint a push subscription delivers to.
    Push,
    /// `nats://HOST:PORT` or `tls://…`: a JetStream durable pull consumer.
    Nats(String),
}

/// URL schemes kept for sources to come (a Kafka consumer group, archives in an object store).
const RESERVED: [&str; 6] = ["kafka", "file", "s3", "gs", "az", "memory"];

impl SourceKind {
    /// `-` or a path, `pubsub`, `push`, `nats://…` / `tls://…`; another `scheme://` is refused.
    pub fn parse(v: &str) -> Result<SourceKind, String> {
        match v {
            "-" => return Ok(SourceKind::File(None)),
            "pubsub" => return Ok(SourceKind::Pubsub),
            "push" => return Ok(SourceKind::Push),
            _ => {}
        }
        match v.split_once("://") {
            None => Ok(SourceKind::File(Some(PathBuf::from(v)))),
            Some(("nats" | "tls", _)) => Ok(SourceKind::Nats(v.to_string())),
            Some((scheme, _)) if RESERVED.contains(&scheme) => Err(format!(
                "{scheme}:// sources are not supported yet (sources: a path or -, pubsub, push, nats://HOST:PORT)"
            )),
            Some((scheme, _)) => Err(format!(
                "{scheme}:// is not a source (sources: a path or -, pubsub, push, nats://HOST:PORT)"
            )),
        }
    }

    /// Does a broker keep what is handed back for redelivery (else the run must finish it)?
    pub fn is_broker(&self) -> bool {
        !matches!(self, SourceKind::File(_))
    }
}

/// Every source's flags (`subsink run`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = heading::SOURCE)]
pub struct SourceArgs {
    /// NDJSON of Pub/Sub messages (REST `PubsubMessage` or pull form); `-` reads stdin;
    /// `pubsub` pulls the subscription itself (Google Cloud with Application Default Credentials,
    /// or the emulator when PUBSUB_EMULATOR_HOST is set); `push` receives a push subscription's
    /// requests on --listen.
    /// `nats://HOST:PORT` (or `tls://`) pulls a NATS JetStream durable consumer (--nats-stream,
    /// --nats-consumer).
    #[arg(long, default_value = "-", value_parser = SourceKind::parse)]
    pub source: SourceKind,
    #[command(flatten)]
    pub file: FileArgs,
    #[command(flatten)]
    pub pubsub: PubsubArgs,
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub push: PushArgs,
}

/// Flags that do not go together, or a source that cannot be read: found before anything starts
/// (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum FlagsError {
    #[error("--source {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--dead-letter applies to the table writer (a bigqueryConfig subscription)")]
    DeadLetterNeedsTable,
    #[error("--dead-letter is for the file source; Pub/Sub dead-letters to the subscription's deadLetterPolicy topic")]
    DeadLetterOnPubsub,
    #[error("--dead-letter is for the file source; a NATS source dead-letters to --nats-dead-letter-subject")]
    DeadLetterOnNats,
    #[error("--checkpoint needs a file source (stdin cannot be resumed)")]
    CheckpointOnStdin,
    /// `keeper`: who keeps unacked messages instead (Pub/Sub, JetStream).
    #[error("--checkpoint is for the file source; {keeper} keeps unacked messages itself")]
    CheckpointOnBroker { keeper: &'static str },
    #[error("--nats-stream, --nats-consumer and --nats-dead-letter-subject need --source nats://HOST:PORT")]
    NatsFlagsWithoutNats,
    #[error("--source nats://…: give --nats-stream STREAM and --nats-consumer NAME")]
    NatsNeedsStreamAndConsumer,
    #[error("--source push needs --listen HOST:PORT")]
    PushNeedsListen,
    #[error("--push-jwks and --push-allowed-email need --push-audience")]
    PushAuthNeedsAudience,
    #[error(
        "--source push: the file's maxDuration ({max_duration:?}) is longer than the \
         subscription's ackDeadlineSeconds ({deadline:?}): Pub/Sub would time out every push \
         request before its message is durable; lower maxDuration or raise ackDeadlineSeconds"
    )]
    PushSlowerThanDeadline {
        max_duration: std::time::Duration,
        deadline: std::time::Duration,
    },
    #[error("--pubsub-streams {0}: 1–{max} streams are allowed", max = super::pubsub::MAX_STREAMS)]
    PubsubStreamsOutOfRange(usize),
    #[error(
        "--pubsub-streams {0}: a subscription with enableMessageOrdering is read on one stream"
    )]
    PubsubStreamsWithOrdering(usize),
}

/// A source, checked and ready to [`connect`].
pub enum SourceSpec {
    /// NDJSON file or stdin, with its checkpoint and dead-letter file.
    File(FileSpec),
    /// A Pub/Sub subscription (Google Cloud or the emulator), pulled with StreamingPull; `client`
    /// `None`: [`PubsubClient::connect`] (the emulator at PUBSUB_EMULATOR_HOST, else Google).
    Pubsub {
        client: Option<PubsubClient>,
        settings: PubsubSettings,
    },
    /// An endpoint a Pub/Sub push subscription delivers to.
    Push(PushSettings),
    /// A NATS JetStream durable pull consumer (connected by [`connect`]).
    Nats(NatsSettings),
}

impl SourceSpec {
    /// Does a broker keep what is handed back for redelivery?
    pub fn is_broker(&self) -> bool {
        !matches!(self, SourceSpec::File(_))
    }
}

impl SourceArgs {
    /// The source the flags name, for `sub`: every compatibility rule of the source flags, checked
    /// here and only here. `default_publish_time_micros`: `publishTime` for input lines without one
    /// (`--fixed-time`).
    pub fn spec(
        &self,
        sub: &ValidSubscription,
        default_publish_time_micros: Option<i64>,
    ) -> Result<SourceSpec, FlagsError> {
        let (checkpoint, dead_letter) = (&self.file.checkpoint, &self.file.dead_letter);
        if dead_letter.is_some() && sub.bigquery.is_none() {
            return Err(FlagsError::DeadLetterNeedsTable);
        }
        let nats = matches!(self.source, SourceKind::Nats(_));
        if !nats && self.nats.any() {
            return Err(FlagsError::NatsFlagsWithoutNats);
        }
        // What the broker sources keep themselves.
        let keeper = match self.source {
            SourceKind::File(_) => None,
            SourceKind::Nats(_) => Some("JetStream"),
            SourceKind::Pubsub | SourceKind::Push => Some("Pub/Sub"),
        };
        if let (Some(keeper), Some(_)) = (keeper, checkpoint) {
            return Err(FlagsError::CheckpointOnBroker { keeper });
        }
        match &self.source {
            SourceKind::File(path) => Ok(SourceSpec::File(
                self.file.spec(path.clone(), default_publish_time_micros)?,
            )),
            _ if dead_letter.is_some() && nats => Err(FlagsError::DeadLetterOnNats),
            _ if dead_letter.is_some() => Err(FlagsError::DeadLetterOnPubsub),
            SourceKind::Pubsub => Ok(SourceSpec::Pubsub {
                client: None,
                settings: self
                    .pubsub
                    .settings(&sub.name, sub.delivery.enable_message_ordering)?,
            }),
            SourceKind::Push => Ok(SourceSpec::Push(self.push.settings(sub)?)),
            SourceKind::Nats(url) => Ok(SourceSpec::Nats(
                self.nats
                    .settings(url, self.pubsub.max_outstanding_messages)?,
            )),
        }
    }
}

/// Why a source could not start (exit 1: the flags were fine).
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
    #[error(transparent)]
    Push(#[from] PushError),
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// The checkpoint or the dead-letter file.
    #[error(transparent)]
    Settle(#[from] SettleError),
}

/// The source of `spec` and its settle side: each source module's own constructor.
pub async fn connect(spec: SourceSpec, sub: &ValidSubscription) -> Result<Connected, SourceError> {
    match spec {
        SourceSpec::File(spec) => super::file::start(spec, sub),
        SourceSpec::Pubsub { client, settings } => {
            let client = match client {
                Some(c) => c,
                None => PubsubClient::connect().await?,
            };
            super::pubsub::start(client, settings, sub)
        }
        SourceSpec::Push(settings) => super::push::start(settings).await,
        SourceSpec::Nats(settings) => super::nats::start(settings, sub).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_values() {
        assert_eq!(SourceKind::parse("-"), Ok(SourceKind::File(None)));
        assert_eq!(
            SourceKind::parse("in.ndjson"),
            Ok(SourceKind::File(Some("in.ndjson".into())))
        );
        assert_eq!(SourceKind::parse("pubsub"), Ok(SourceKind::Pubsub));
        assert_eq!(SourceKind::parse("push"), Ok(SourceKind::Push));
        assert_eq!(
            SourceKind::parse("tls://h:4222"),
            Ok(SourceKind::Nats("tls://h:4222".into()))
        );
        for v in ["kafka://b:9092/t", "s3://bucket/dir", "file:///tmp/x"] {
            let e = SourceKind::parse(v).unwrap_err();
            assert!(e.contains("not supported yet"), "{v}: {e}");
        }
        assert!(SourceKind::parse("ftp://x")
            .unwrap_err()
            .contains("is not a source"));
    }
}
