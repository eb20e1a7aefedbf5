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

pub use crate::source::flags::FlagsError;
use crate::source::flags::{ArchiveFlagsError, NatsFlagsError, PubsubFlagsError};

use crate::cli::heading;
use crate::config::ValidSubscription;
use crate::connect::{Connected, Context};
use crate::pubsub::{PubsubClient, PubsubError};
use crate::resources::Resources;
use crate::settle::checkpoint::CheckpointSettle;
use crate::settle::dead_letter::DeadLetterFile;
use crate::settle::{Brokered, SettleError};
use crate::source::archive::settle::ArchiveSettle;
use crate::source::archive::{ArchiveArgs, ArchiveError, ArchiveSource, ArchiveSpec, ArchiveStats};
use crate::source::file::OnBadInput;
use crate::source::file::{FileArgs, FileSource, FileSpec};
use crate::source::kafka::settle::KafkaBroker;
use crate::source::kafka::{KafkaArgs, KafkaError, KafkaSettings, KafkaSource};
use crate::source::nats::settle::NatsBroker;
use crate::source::nats::{NatsArgs, NatsConnection, NatsError, NatsSettings, NatsSource};
use crate::source::pubsub::settle::PubsubBroker;
pub use crate::source::pubsub::PubsubArgs;
use crate::source::pubsub::{PubsubSettings, PubsubSource};
use crate::source::push::settle::{PushBroker, SpoolSettle};
use crate::source::push::spool::Spool;
use crate::source::push::SpoolSource;
use crate::source::push::{PushArgs, PushEndpointError, PushSettings, PushSource};

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

    /// `spec` held to the memory budget: a file source reads ahead through the budget's
    /// [`crate::resources::InputGate`]; a Pub/Sub source's flow control lets at most half the limit be outstanding
    /// (`--max-outstanding-bytes` above that, or 0, is lowered to it, and the log says so).
    /// NATS JetStream has no flow control in bytes: its bound is `MaxAckPending` messages
    /// (docs/operating.md, How to size a pod).
    pub fn bounded_by(self, resources: &Resources) -> SourceSpec {
        let mut spec = self;
        match &mut spec {
            SourceSpec::File(f) => f.settings.memory = Some(resources.input_gate()),
            SourceSpec::Pubsub { settings, .. } => settings.bounded_by(resources.memory_limit()),
            _ => {}
        }
        spec
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
    #[error(transparent)]
    Push(#[from] PushEndpointError),
    #[error(transparent)]
    Nats(#[from] NatsError),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The checkpoint or the dead-letter file.
    #[error(transparent)]
    Settle(#[from] SettleError),
    /// `--source pubsub`: the server says the subscription does not exist.
    #[error("Pub/Sub subscription {name} does not exist ({target} answered NOT_FOUND): create it, or fix the subscription's name")]
    NoSubscription { name: String, target: String },
}

impl SourceError {
    /// Is it a configuration error, found before anything was read (the binary exits 2), rather
    /// than a failure to reach or read the source (exit 1)? A dead-letter subject no stream
    /// stores, a dead-letter policy without a subject, an existing NATS consumer without explicit
    /// acks, `--checkpoint` with stdin.
    pub fn is_config(&self) -> bool {
        match self {
            SourceError::CheckpointOnStdin | SourceError::NoSubscription { .. } => true,
            SourceError::Nats(e) => e.is_config(),
            SourceError::Kafka(e) => e.is_config(),
            _ => false,
        }
    }
}

/// The source of `spec`, held to the process's memory budget ([`SourceSpec::bounded_by`]), and
/// its settle side, from the source's constructor below.
pub async fn connect(spec: SourceSpec, ctx: &Context<'_>) -> Result<Connected, SourceError> {
    let sub = ctx.subscription;
    match spec.bounded_by(ctx.resources) {
        SourceSpec::File(spec) => start_file(spec, sub),
        SourceSpec::Pubsub { client, settings } => {
            let client = match client {
                Some(c) => c,
                None => PubsubClient::connect().await?,
            };
            exists(&client, &settings.subscription).await?;
            start_pubsub(client, settings, sub)
        }
        SourceSpec::Push(settings) => start_push(settings, ctx).await,
        SourceSpec::Nats(settings) => start_nats(settings, sub).await,
        SourceSpec::Archive(spec) => start_archive(spec, sub).await,
        SourceSpec::Kafka(settings) => start_kafka(settings, sub, ctx.positions.clone()).await,
    }
}

// Each source's constructor: its source and its settle side. They sit here, not in the source's
// module, because a settle module uses its source's types (a constructor there would make the two
// files depend on each other).

/// The file source and its settle side: the checkpoint (loaded, so reading resumes where it left
/// off) and the dead-letter file.
fn start_file(spec: FileSpec, sub: &ValidSubscription) -> Result<Connected, SourceError> {
    let FileSpec {
        mut settings,
        checkpoint,
        dead_letter,
    } = spec;
    let name = settings
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "-".into());
    if checkpoint.is_some() && settings.path.is_none() {
        return Err(SourceError::CheckpointOnStdin);
    }
    let settle = CheckpointSettle::open(
        checkpoint,
        &name,
        name.clone(),
        sub,
        settings.on_bad_input,
        dead_letter.as_deref(),
    )?;
    (settings.start_offset, settings.start_line) = settle.start();
    let src =
        FileSource::open(settings).map_err(|source| SourceError::Open { path: name, source })?;
    Ok(Connected::new(src, settle))
}

/// Refuse a Pub/Sub subscription the server says is not there, before the stream starts (which
/// would otherwise fail over and over). Only NOT_FOUND counts: a plain subscriber may lack the
/// permission to read the subscription, and an unreachable server is the stream's to retry.
async fn exists(client: &PubsubClient, name: &str) -> Result<(), SourceError> {
    let asked = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.get_subscription(name),
    )
    .await;
    match asked {
        Ok(Err(PubsubError::Status {
            code: tonic::Code::NotFound,
            ..
        })) => Err(SourceError::NoSubscription {
            name: name.to_string(),
            target: client.target().to_string(),
        }),
        _ => Ok(()),
    }
}

/// The archive source and its settle side: the file source's checkpoint over (object, record)
/// positions (loaded, so reading resumes where it left off) and the dead-letter file.
async fn start_archive(
    spec: ArchiveSpec,
    sub: &ValidSubscription,
) -> Result<Connected, SourceError> {
    let ArchiveSpec {
        mut settings,
        checkpoint,
        dead_letter,
    } = spec;
    let name = settings.url.clone();
    let settle = CheckpointSettle::open(
        checkpoint,
        &name,
        name.clone(),
        sub,
        settings.on_bad_input,
        dead_letter.as_deref(),
    )?;
    settings.start = settle.start().0;
    let stats = std::sync::Arc::new(ArchiveStats::default());
    let src = ArchiveSource::open(settings, stats.clone()).await?;
    Ok(Connected::new(src, ArchiveSettle::new(settle, stats)))
}

/// The Pub/Sub source, pulling, and its settle side (acks, nacks, lease extensions, dead letters).
fn start_pubsub(
    client: PubsubClient,
    settings: PubsubSettings,
    sub: &ValidSubscription,
) -> Result<Connected, SourceError> {
    let src = PubsubSource::start(client.clone(), settings.clone())?;
    let settle = Brokered::new(PubsubBroker::new(
        client,
        src.acker(),
        settings.subscription,
        &sub.delivery,
        settings.stream_ack_deadline,
    ));
    Ok(Connected::new(src, settle))
}

/// The push endpoint, listening, and its settle side: with a spool, the spool's checkpoint (the
/// export reads the spool from its watermark); without one, the broker side that answers the
/// requests once their files are durable.
async fn start_push(settings: PushSettings, ctx: &Context<'_>) -> Result<Connected, SourceError> {
    let sub = ctx.subscription;
    let Some(spec) = settings.spool.clone() else {
        let src = PushSource::start(settings, ctx.grace.clone()).await?;
        let settle = Brokered::new(PushBroker::new(src.pending(), sub.name.clone()));
        return Ok(Connected::new(src, settle));
    };
    let dir = &spec.settings.dir;
    let name = format!("spool {}", dir.display());
    std::fs::create_dir_all(dir).map_err(|source| SourceError::Open {
        path: dir.display().to_string(),
        source,
    })?;
    let inner = CheckpointSettle::open(
        Some(dir.join("checkpoint.json")),
        "spool",
        name.clone(),
        sub,
        OnBadInput::Skip,
        Some(&spec.dead_letter),
    )?;
    let (start, line) = inner.start();
    let spool = Spool::open(&spec.settings, start).map_err(PushEndpointError::from)?;
    let handle = spool.handle.clone();
    let src = PushSource::start_with(
        settings,
        ctx.grace.clone(),
        Some((
            spool.writer,
            ctx.shaper.clone(),
            SpoolSource::new(spool.reader, line, name),
            spool.handle,
        )),
    )
    .await?;
    let settle = SpoolSettle::new(
        inner,
        handle,
        src.pending(),
        DeadLetterFile::open(&spec.dead_letter, CheckpointSettle::max_attempts(sub))?,
        sub.name.clone(),
    );
    // What is spooled passed the run's shaper before accept: the pipeline does not shape it again.
    let mut connected = Connected::new(src, settle);
    connected.shaped = true;
    Ok(connected)
}

/// The NATS source, connected ([`crate::source::nats::connect`]), and its settle side (acks, naks, dead letters).
async fn start_nats(
    settings: NatsSettings,
    sub: &ValidSubscription,
) -> Result<Connected, SourceError> {
    let NatsConnection {
        client,
        jetstream,
        consumer,
        settings,
        ack_wait,
        dead_letter,
    } = crate::source::nats::connect(settings, &sub.delivery).await?;
    // Not the URL: it may carry a password.
    let name = format!("nats:{}/{}", settings.stream, settings.consumer);
    let source = NatsSource::start(consumer, client.clone(), name);
    let settle = Brokered::new(NatsBroker::new(
        client,
        jetstream,
        sub.name.clone(),
        &sub.delivery,
        dead_letter,
        ack_wait,
    ));
    Ok(Connected::new(source, settle))
}

/// The Kafka source, subscribed ([`crate::source::kafka::connect`]), and its settle side (commits
/// after durable, redeliveries, dead letters).
async fn start_kafka(
    settings: KafkaSettings,
    sub: &ValidSubscription,
    positions: Option<std::sync::Arc<dyn crate::position::Positions>>,
) -> Result<Connected, SourceError> {
    let c = crate::source::kafka::connect(settings, &sub.delivery, positions).await?;
    // Not the options: they may carry a password.
    let name = format!("kafka:{}", c.settings.group);
    let source = KafkaSource::start(&c, name);
    let settle = Brokered::new(KafkaBroker::new(
        c.consumer,
        c.offsets,
        source.redeliver(),
        sub.name.clone(),
        &sub.delivery,
        c.dead_letter,
        c.max_attempts,
        c.settings.exactly_once,
    ));
    Ok(Connected::new(source, settle))
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
