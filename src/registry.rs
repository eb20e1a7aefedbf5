//! The registration point of sources: what a `--source` value names ([`SourceKind`]), every
//! source's flags ([`SourceArgs`], each source's own `Args` struct flattened under its heading),
//! the one check of their compatibility ([`SourceArgs::spec`], errors [`FlagsError`], exit 2), and
//! each source's constructor from its typed settings to its source and settle side ([`connect`]).
//!
//! Adding a source: a `SourceKind` arm in [`SourceKind::parse`], its `Args` struct flattened into
//! [`SourceArgs`], a [`SourceSpec`] arm built in [`SourceArgs::spec`], and its constructor, called
//! from [`connect`].

use std::path::PathBuf;

use clap::Args;

pub use crate::connect::SourceError;
pub use crate::source::flags::FlagsError;
pub use crate::source::pubsub::PubsubArgs;

use crate::cli::heading;
use crate::config::ValidSubscription;
use crate::connect::{Connected, Context};
use crate::pubsub::PubsubClient;
use crate::source;
use crate::source::archive::{ArchiveArgs, ArchiveSpec};
use crate::source::file::{FileArgs, FileSpec};
use crate::source::flags::{ArchiveFlagsError, NatsFlagsError, PubsubFlagsError};
use crate::source::kafka::{KafkaArgs, KafkaSettings};
use crate::source::nats::{NatsArgs, NatsSettings};
use crate::source::pubsub::PubsubSettings;
use crate::source::push::{PushArgs, PushSettings};

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
    /// `s3://`, `gs://`, `az://`, `file://`: the objects an export wrote (docs/replay.md).
    Archive(String),
    /// `kafka://HOST:PORT[,HOST:PORT…]`: a Kafka consumer group.
    Kafka(String),
}

impl std::fmt::Display for SourceKind {
    /// The source as the user named it, for the start-up log line and the run summary; a user
    /// and password in a URL are never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceKind::File(None) => f.write_str("stdin"),
            SourceKind::File(Some(p)) => write!(f, "{}", p.display()),
            SourceKind::Pubsub => f.write_str("pubsub"),
            SourceKind::Push => f.write_str("push"),
            SourceKind::Nats(u) | SourceKind::Archive(u) | SourceKind::Kafka(u) => {
                f.write_str(&crate::telemetry::logs::redact_url(u))
            }
        }
    }
}

/// URL schemes kept for sources to come.
const RESERVED: [&str; 1] = ["memory"];

/// Object-store schemes an archive is read from.
const ARCHIVES: [&str; 5] = ["s3", "s3a", "gs", "az", "file"];

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
            Some((scheme, _)) if ARCHIVES.contains(&scheme) => Ok(SourceKind::Archive(v.to_string())),
            Some(("kafka", _)) => Ok(SourceKind::Kafka(v.to_string())),
            Some((scheme, _)) if RESERVED.contains(&scheme) => Err(format!(
                "{scheme}:// sources are not supported yet (sources: a path or -, pubsub, push, nats://HOST:PORT, kafka://HOST:PORT, an archive URL s3:// gs:// az:// file://)"
            )),
            Some((scheme, _)) => Err(format!(
                "{scheme}:// is not a source (sources: a path or -, pubsub, push, nats://HOST:PORT, kafka://HOST:PORT, an archive URL s3:// gs:// az:// file://)"
            )),
        }
    }
}

/// Every source's flags (`subsink run`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = heading::SOURCE)]
pub struct SourceArgs {
    /// Where messages come from. A path: NDJSON of Pub/Sub messages (REST `PubsubMessage` or pull
    /// form); `-` reads stdin; `pubsub` pulls the subscription itself (Google Cloud with
    /// Application Default Credentials, or the emulator when PUBSUB_EMULATOR_HOST is set); `push`
    /// receives a push subscription's requests on --listen; `nats://HOST:PORT` (or `tls://`) pulls
    /// a NATS JetStream durable consumer (--nats-stream, --nats-consumer);
    /// `kafka://HOST:PORT[,HOST:PORT…]` reads a Kafka consumer group (--kafka-topic);
    /// `s3://BUCKET[/PREFIX]`, `gs://…`, `az://…`, `file:///DIR` replays an archive: the objects
    /// an export wrote (--archive-subscription, --from, --to).
    #[arg(long, default_value = "-", value_parser = SourceKind::parse)]
    pub source: SourceKind,
    #[command(flatten)]
    pub file: FileArgs,
    #[command(flatten)]
    pub pubsub: PubsubArgs,
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub push: PushArgs,
    #[command(flatten)]
    pub archive: ArchiveArgs,
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
    /// An archive: the objects an export wrote.
    Archive(ArchiveSpec),
    /// A Kafka consumer group (connected by [`connect`]).
    Kafka(KafkaSettings),
}

/// The sources whose messages carry a stream position, as refusals of `--exactly-once` name them.
pub const POSITIONED: crate::sink::PositionedSource = crate::source::kafka::POSITIONED;

impl SourceSpec {
    /// The streams of a source whose messages carry a stream position ([`crate::position`]);
    /// `None` for the others.
    pub fn positioned(&self) -> Option<crate::position::Streams> {
        match self {
            SourceSpec::Kafka(k) => Some(k.streams()),
            _ => None,
        }
    }

    /// `--exactly-once` with a positioned source, into a destination that commits `atomic_with`
    /// (exit 2 with the reason when the source cannot hold it).
    pub fn hold_positions(&mut self, atomic_with: &str) -> Result<(), String> {
        match self {
            SourceSpec::Kafka(k) => k.hold_positions(atomic_with),
            _ => Ok(()),
        }
    }

    /// The payload encoding of topic-schema records an archive source reads back (the run's
    /// `--schema-encoding`); other sources ignore it.
    pub fn set_schema_encoding(&mut self, encoding: crate::avro::SchemaEncoding) {
        if let SourceSpec::Archive(a) = self {
            a.settings.schema_encoding = encoding;
        }
    }

    /// Does a broker keep what is handed back for redelivery?
    pub fn is_broker(&self) -> bool {
        !matches!(self, SourceSpec::File(_) | SourceSpec::Archive(_))
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
        let push = matches!(self.source, SourceKind::Push);
        // With a spool, push dead-letters what fails after its 2xx to a local file.
        if dead_letter.is_some() && sub.bigquery.is_none() && !push {
            return Err(FlagsError::DeadLetterNeedsTable);
        }
        let nats = matches!(self.source, SourceKind::Nats(_));
        if !nats && self.nats.any() {
            return Err(NatsFlagsError::WithoutNats.into());
        }
        let kafka = matches!(self.source, SourceKind::Kafka(_));
        if !kafka && self.kafka.any() {
            return Err(FlagsError::KafkaFlagsWithoutKafka);
        }
        // What the broker sources keep themselves.
        if !matches!(self.source, SourceKind::Archive(_)) && self.archive.any() {
            return Err(ArchiveFlagsError::WithoutArchive.into());
        }
        let keeper = match self.source {
            SourceKind::File(_) | SourceKind::Archive(_) => None,
            SourceKind::Nats(_) => Some("JetStream"),
            SourceKind::Kafka(_) => Some("Kafka"),
            SourceKind::Pubsub | SourceKind::Push => Some("Pub/Sub"),
        };
        if let (Some(keeper), Some(_)) = (keeper, checkpoint) {
            return Err(FlagsError::CheckpointOnBroker { keeper });
        }
        match &self.source {
            SourceKind::File(path) => Ok(SourceSpec::File(
                self.file.spec(path.clone(), default_publish_time_micros)?,
            )),
            SourceKind::Archive(url) => Ok(SourceSpec::Archive(self.archive.spec(
                url,
                self.file.on_bad_input,
                checkpoint.clone(),
                dead_letter.clone(),
            )?)),
            SourceKind::Push => Ok(SourceSpec::Push(
                self.push.settings(sub, dead_letter.as_ref())?,
            )),
            _ if dead_letter.is_some() && nats => Err(NatsFlagsError::DeadLetterFile.into()),
            _ if dead_letter.is_some() && kafka => Err(FlagsError::DeadLetterOnKafka),
            _ if dead_letter.is_some() => Err(PubsubFlagsError::DeadLetterFile.into()),
            SourceKind::Pubsub => Ok(SourceSpec::Pubsub {
                client: None,
                settings: self
                    .pubsub
                    .settings(&sub.name, sub.delivery.enable_message_ordering)?,
            }),
            SourceKind::Nats(url) => {
                if let (Some((topic, _)), None) = (
                    &sub.delivery.dead_letter,
                    &self.nats.nats_dead_letter_subject,
                ) {
                    return Err(NatsFlagsError::DeadLetterPolicyWithoutSubject {
                        topic: topic.clone(),
                    }
                    .into());
                }
                Ok(SourceSpec::Nats(
                    self.nats
                        .settings(url, self.pubsub.max_outstanding_messages)?,
                ))
            }
            SourceKind::Kafka(url) => {
                if let (Some((topic, _)), None) = (
                    &sub.delivery.dead_letter,
                    &self.kafka.kafka_dead_letter_topic,
                ) {
                    return Err(FlagsError::KafkaDeadLetterPolicyWithoutTopic {
                        topic: topic.clone(),
                    });
                }
                let mut s = self.kafka.settings(url, &sub.name)?;
                s.max_outstanding_messages = u64::try_from(self.pubsub.max_outstanding_messages)
                    .ok()
                    .filter(|v| *v > 0);
                s.max_outstanding_bytes =
                    Some(self.pubsub.max_outstanding_bytes).filter(|v| *v > 0);
                s.ordering = sub.delivery.enable_message_ordering;
                Ok(SourceSpec::Kafka(s))
            }
        }
    }
}

/// The source of `spec` and its settle side, from the source's constructor (`build::start` in its
/// folder), which also holds it to the process's memory budget.
pub async fn connect(spec: SourceSpec, ctx: &Context<'_>) -> Result<Connected, SourceError> {
    match spec {
        SourceSpec::File(spec) => source::file::build::start(spec, ctx),
        SourceSpec::Pubsub { client, settings } => {
            source::pubsub::build::start(client, settings, ctx).await
        }
        SourceSpec::Push(settings) => source::push::build::start(settings, ctx).await,
        SourceSpec::Nats(settings) => source::nats::build::start(settings, ctx).await,
        SourceSpec::Archive(spec) => source::archive::build::start(spec, ctx).await,
        SourceSpec::Kafka(settings) => source::kafka::build::start(settings, ctx).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        source: SourceArgs,
    }

    /// A subscription with a `bigqueryConfig` (`table`) or a `cloudStorageConfig`.
    fn subscription(table: bool) -> ValidSubscription {
        let config = match table {
            true => r#""bigqueryConfig": {"table": "proj.ds.tbl"}"#,
            false => r#""cloudStorageConfig": {"bucket": "bkt", "maxDuration": "60s"}"#,
        };
        let json = format!(
            r#"{{"name": "projects/proj/subscriptions/sub", "topic": "projects/proj/topics/top",
                "ackDeadlineSeconds": 600, {config}}}"#
        );
        let r = crate::config::Subscription::from_str_any(&json, "test").unwrap();
        crate::config::validate(&r, None).unwrap()
    }

    fn spec(table: bool, args: &[&str]) -> Result<SourceSpec, FlagsError> {
        let flags =
            Flags::try_parse_from(std::iter::once("subsink").chain(args.iter().copied())).unwrap();
        flags.source.spec(&subscription(table), None)
    }

    /// Every rule, each with its own error (the binary exits 2 for all).
    #[test]
    fn flags_that_do_not_go_together() {
        let nats = [
            "--source",
            "nats://h:4222",
            "--nats-stream",
            "S",
            "--nats-consumer",
            "C",
        ];
        let with = |base: &[&'static str], more: &[&'static str]| -> Vec<&'static str> {
            base.iter().chain(more).copied().collect()
        };
        let cases: Vec<(bool, Vec<&str>, &str)> = vec![
            (
                false,
                vec!["--dead-letter", "dl"],
                "applies to the table writer",
            ),
            (
                true,
                vec![
                    "--source",
                    "push",
                    "--listen",
                    "h:1",
                    "--no-spool",
                    "--dead-letter",
                    "dl",
                ],
                "Pub/Sub dead-letters",
            ),
            (
                true,
                vec!["--source", "pubsub", "--dead-letter", "dl"],
                "Pub/Sub dead-letters",
            ),
            (
                true,
                with(&nats, &["--dead-letter", "dl"]),
                "--nats-dead-letter-subject",
            ),
            (false, vec!["--checkpoint", "cp"], "needs a file source"),
            (
                false,
                vec!["--source", "pubsub", "--checkpoint", "cp"],
                "Pub/Sub keeps",
            ),
            (
                false,
                vec!["--source", "push", "--listen", "h:1", "--checkpoint", "cp"],
                "Pub/Sub keeps",
            ),
            (
                false,
                with(&nats, &["--checkpoint", "cp"]),
                "JetStream keeps",
            ),
            (false, vec!["--nats-consumer", "C"], "need --source nats://"),
            (
                false,
                vec!["--source", "nats://h:4222", "--nats-stream", "S"],
                "give --nats-stream",
            ),
            (false, vec!["--source", "push"], "needs --listen"),
            (
                false,
                vec!["--source", "push", "--listen", "h:1", "--push-jwks", "k"],
                "need --push-audience",
            ),
            (
                false,
                vec!["--source", "pubsub", "--pubsub-streams", "17"],
                "1–16 streams",
            ),
        ];
        for (table, args, want) in cases {
            let e = spec(table, &args)
                .err()
                .unwrap_or_else(|| panic!("{args:?} accepted"));
            assert!(e.to_string().contains(want), "{args:?}: {e}");
        }
        assert!(matches!(spec(true, &nats), Ok(SourceSpec::Nats(_))));
        assert!(matches!(
            spec(false, &["--source", "pubsub"]),
            Ok(SourceSpec::Pubsub { client: None, .. })
        ));
        assert!(matches!(spec(false, &[]), Ok(SourceSpec::File(_))));
    }

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
        assert_eq!(
            SourceKind::parse("s3://bucket/dir/"),
            Ok(SourceKind::Archive("s3://bucket/dir/".into()))
        );
        assert_eq!(
            SourceKind::parse("kafka://b:9092,c:9092"),
            Ok(SourceKind::Kafka("kafka://b:9092,c:9092".into()))
        );
        let e = SourceKind::parse("memory://").unwrap_err();
        assert!(e.contains("not supported yet"), "memory://: {e}");
        assert!(SourceKind::parse("ftp://x")
            .unwrap_err()
            .contains("is not a source"));
    }
}
