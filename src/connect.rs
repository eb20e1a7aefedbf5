//! What connecting a source takes ([`Context`]) and gives ([`Connected`]): the source, the settle
//! side that goes with it, and whether its messages come shaped already. And the two traits every
//! source implements in its folder: [`Register`] (its `--source` values and flags → a
//! [`SourceSpec`]) and [`Connect`] (a `SourceSpec` → the source and its settle side).

use std::path::PathBuf;
use std::sync::Arc;

use crate::avro::SchemaEncoding;
use crate::config::ValidSubscription;
use crate::input::Source;
use crate::position::{DurableStreams, Streams};
use crate::pubsub::PubsubError;
use crate::receipt::PositionedSource;
use crate::resources::Resources;
use crate::settle::watermark::OnBadInput;
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
    /// position ([`crate::sink::OpenFiles::durable_streams`]).
    pub durable_streams: Option<Arc<dyn DurableStreams>>,
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

/// Flags that do not go together, or a source that cannot be read: found before anything starts
/// (exit 2). A rule about the flags several sources share (`--dead-letter`, `--checkpoint`), or a
/// source's own flag error, as its folder words it ([`FlagsError::of`]).
#[derive(Debug, thiserror::Error)]
pub enum FlagsError {
    #[error("--dead-letter applies to the table writer (a bigqueryConfig subscription)")]
    DeadLetterNeedsTable,
    /// `keeper`: who keeps unacked messages instead (Pub/Sub, JetStream).
    #[error("--checkpoint is for the file source; {keeper} keeps unacked messages itself")]
    CheckpointOnBroker { keeper: &'static str },
    /// A source's own flag error.
    #[error(transparent)]
    Source(Box<dyn std::error::Error + Send + Sync>),
}

impl FlagsError {
    /// A source's own flag error `error`.
    pub fn of(error: impl std::error::Error + Send + Sync + 'static) -> FlagsError {
        FlagsError::Source(Box::new(error))
    }
}

/// The flags every source may read besides its own, checked by the registry: the file source's
/// `--checkpoint`, `--dead-letter` and `--on-bad-input` (an archive and a push spool take them
/// too) and the flow control of `--max-outstanding-*` (a broker's read-ahead).
#[derive(Debug, Clone)]
pub struct SharedFlags<'a> {
    pub subscription: &'a ValidSubscription,
    pub checkpoint: Option<PathBuf>,
    pub dead_letter: Option<PathBuf>,
    pub on_bad_input: OnBadInput,
    pub max_outstanding_messages: i64,
    pub max_outstanding_bytes: u64,
    /// `publishTime` for input lines without one (`--fixed-time`).
    pub default_publish_time_micros: Option<i64>,
}

/// How strongly a source claims a `--source` value: the registry takes the first source that
/// claims it, and a fallback (a bare path is a file) only when none does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    No,
    Yes,
    Fallback,
}

impl Claim {
    /// `Yes` when `value` is a URL of one of `schemes` (`nats` for `nats://…`).
    pub fn scheme(value: &str, schemes: &[&str]) -> Claim {
        match value.split_once("://") {
            Some((scheme, _)) if schemes.contains(&scheme) => Claim::Yes,
            _ => Claim::No,
        }
    }

    /// `Yes` when `value` is the word `word` (`pubsub`, `push`).
    pub fn word(value: &str, word: &str) -> Claim {
        match value == word {
            true => Claim::Yes,
            false => Claim::No,
        }
    }
}

/// One source as the registry knows it: the `--source` values it takes, its flags, what they
/// make ([`SourceSpec`]). Each source's folder implements it; the registry lists each once.
pub trait Register {
    /// The source's own flags, flattened into the registry's under the source's help heading.
    type Args: clap::Args + clap::FromArgMatches + Clone + std::fmt::Debug;
    /// The `--source` values it takes, as the list of sources in an error names them.
    const FORMS: &'static str;
    /// Who keeps this source's unsettled messages, refusing `--checkpoint`; `None`: it takes one.
    const KEEPER: Option<&'static str> = None;
    /// `--dead-letter` (a local file) applies whatever the writer, not only to a table.
    const DEAD_LETTER_ANY_WRITER: bool = false;
    /// How refusals of `--exactly-once` name this source when its messages carry stream positions.
    const POSITIONED: Option<PositionedSource> = None;
    /// Its part of the help of `--source`: the values it takes and what they read.
    const HELP: &'static str;
    /// Does `value` (of `--source`) name this source?
    fn claims(value: &str) -> Claim;
    /// The source as the user named it, for the start-up log line and the run summary; a user and
    /// password in a URL are never shown.
    fn describe(value: &str) -> String {
        crate::telemetry::logs::redact_url(value)
    }
    /// Its flags were given while another source was named: the error that says so.
    fn misplaced(_args: &Self::Args) -> Option<FlagsError> {
        None
    }
    /// The source `value` names, from its flags and the shared ones: every rule of its flags,
    /// checked here and only here.
    fn spec(
        value: &str,
        args: &Self::Args,
        shared: &SharedFlags<'_>,
    ) -> Result<SourceSpec, FlagsError>;
}

/// A source, checked and ready to connect: what [`Register::spec`] made, or what code built.
#[async_trait::async_trait]
pub trait Connect: Send + 'static {
    /// The source and its settle side (from the source's constructor, `build.rs` in its folder).
    async fn connect(self: Box<Self>, ctx: &Context<'_>) -> Result<Connected, SourceError>;
    /// Does a broker keep what is handed back for redelivery?
    fn is_broker(&self) -> bool;
    /// The streams of a source whose messages carry a stream position ([`crate::position`]).
    fn positioned(&self) -> Option<Streams> {
        None
    }
    /// `--exactly-once` with a positioned source, into a destination that commits `atomic_with`
    /// (exit 2 with the reason when the source cannot hold it).
    fn hold_positions(&mut self, _atomic_with: &str) -> Result<(), String> {
        Ok(())
    }
    /// The payload encoding of topic-schema records the source reads back (the run's
    /// `--schema-encoding`); most sources ignore it.
    fn set_schema_encoding(&mut self, _encoding: SchemaEncoding) {}
    /// A source every run reads from its start (no checkpoint): what it reads, for the warning
    /// about what a rerun does.
    fn reread_by_rerun(&self) -> Option<String> {
        None
    }
}

/// A source, checked and ready to connect ([`crate::registry::connect`]).
pub struct SourceSpec(Box<dyn Connect>);

impl SourceSpec {
    pub fn new(spec: impl Connect) -> SourceSpec {
        SourceSpec(Box::new(spec))
    }

    /// The source and its settle side.
    pub async fn connect(self, ctx: &Context<'_>) -> Result<Connected, SourceError> {
        self.0.connect(ctx).await
    }
}

impl std::ops::Deref for SourceSpec {
    type Target = dyn Connect;
    fn deref(&self) -> &dyn Connect {
        &*self.0
    }
}

impl std::ops::DerefMut for SourceSpec {
    fn deref_mut(&mut self) -> &mut dyn Connect {
        &mut *self.0
    }
}

/// What the registry knows of a registered source without its flags ([`Entry::of`]).
#[derive(Debug)]
pub struct Entry {
    pub name: &'static str,
    pub forms: &'static str,
    pub help: &'static str,
    pub claims: fn(&str) -> Claim,
    pub describe: fn(&str) -> String,
    pub keeper: Option<&'static str>,
    pub dead_letter_any_writer: bool,
}

impl Entry {
    /// The source `S`, registered as `name` (its field among the registry's flags).
    pub const fn of<S: Register>(name: &'static str) -> Entry {
        Entry {
            name,
            forms: S::FORMS,
            help: S::HELP,
            claims: S::claims,
            describe: S::describe,
            keeper: S::KEEPER,
            dead_letter_any_writer: S::DEAD_LETTER_ANY_WRITER,
        }
    }

    /// How refusals of `--exactly-once` name the positioned sources: the first registered.
    pub const fn positioned(all: &[Option<PositionedSource>]) -> PositionedSource {
        let mut i = 0;
        while i < all.len() {
            if let Some(p) = all[i] {
                return p;
            }
            i += 1;
        }
        PositionedSource { name: "", flag: "" }
    }
}

/// A `--source` value and the registered source it names.
#[derive(Debug, Clone)]
pub struct SourceValue {
    pub value: String,
    entry: &'static Entry,
}

impl SourceValue {
    /// The first of `registered` that claims `v` (a bare path is a file, a fallback); a
    /// `scheme://` none claims is refused, with the list of sources.
    pub fn parse(v: &str, registered: &'static [Entry]) -> Result<SourceValue, String> {
        let claim = |want| registered.iter().find(|e| (e.claims)(v) == want);
        if let Some(entry) = claim(Claim::Yes).or_else(|| claim(Claim::Fallback)) {
            let value = v.to_string();
            return Ok(SourceValue { value, entry });
        }
        let forms: Vec<&str> = registered.iter().map(|e| e.forms).collect();
        let scheme = v.split_once("://").map_or(v, |(s, _)| s);
        let forms = forms.join(", ");
        Err(format!("{scheme}:// is not a source (sources: {forms})"))
    }

    /// The help of `--source`: every registered source's part.
    pub fn help(registered: &'static [Entry]) -> String {
        let parts: Vec<&str> = registered.iter().map(|e| e.help).collect();
        format!("Where messages come from. {}", parts.join("; "))
    }

    /// The name of the source it names (`file`, `pubsub`, …).
    pub fn source(&self) -> &'static str {
        self.entry.name
    }

    /// What the registry knows of the source it names.
    pub fn entry(&self) -> &'static Entry {
        self.entry
    }
}

impl std::fmt::Display for SourceValue {
    /// The source as the user named it ([`Register::describe`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&(self.entry.describe)(&self.value))
    }
}
