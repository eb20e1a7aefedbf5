//! Sinks: where messages become durable. One trait for every destination, one lifecycle of open
//! files for all of them.
//!
//! | piece | what it is |
//! |---|---|
//! | [`Sink`] | a destination: its finalize limits, how it groups messages, how it opens a file, how it finds a file a crashed run left pending |
//! | [`SinkFile`] | one open file of a sink: messages are *staged* (tentatively added, so the batcher can see their size), then *committed* or *taken back* |
//! | [`Durable`] | a closed file, ready to be made durable (a visible object, a committed table version) or aborted |
//! | [`Files`] | the open-file lifecycle, written once: groups, deadlines, the batcher's limits, finalize reasons, what each file holds (input span, ack references) |
//! | [`OpenFiles`] | what the pipeline (`app`) drives: [`Files`] of any sink, behind one object-safe trait |
//!
//! The sinks: [`object`] (objects in a bucket: the Cloud Storage subscription's files,
//! docs/contract.md §3), [`delta`] (rows committed to a Delta Lake table: the BigQuery
//! subscription's rows, §4), [`bigquery`] (the same rows appended to BigQuery itself through the
//! Storage Write API) and [`discard`] (counts and writes nothing: the pipeline without a store,
//! for benchmarks). Adding one is a folder here with its `register.rs`, plus its line in
//! [`registry`]'s list (the registration point of the sinks). Whatever the
//! source (a file, Pub/Sub pull or push, NATS JetStream), the sink sees the same messages.

pub mod bigquery;
pub mod chunk;
pub mod commit_at_close;
pub mod delta;
pub mod discard;
pub mod files;
pub mod object;
pub mod order;
pub mod publish;
pub mod registry;
pub mod schema_watch;

use std::future::Future;

use crate::batch::Limits;

use crate::message::{Message, Received};
use crate::position::DurableStreams;
use crate::receipt::{MessageCheck, NotDurable, PositionedSource, Refusal, Refused, Written};
use crate::upload::UploadError;

pub use files::{Files, FinalizedFile, OpenFiles, Pushed};
pub use registry::{BuildError, SinkSetup, SinkSpec};

/// [`MessageCheck`] of an object format that can refuse a message (a topic schema).
struct FormatCheck(std::sync::Arc<dyn crate::encode::FileFormat>);

impl MessageCheck for FormatCheck {
    fn check(&self, msg: &Message) -> Result<(), Refused> {
        Ok(self.0.check(msg)?)
    }
}

/// [`MessageCheck`] of a table: the message is appended as a row to a builder of the sink's
/// mapping ([`crate::table::RowBuilder::append`]) and taken back out. Builders are kept for
/// reuse, one per concurrent check.
pub struct RowCheck {
    template: std::sync::Mutex<crate::table::RowBuilder>,
    spare: std::sync::Mutex<Vec<crate::table::RowBuilder>>,
}

impl RowCheck {
    pub fn new(rows: &crate::table::RowBuilder) -> RowCheck {
        RowCheck {
            template: std::sync::Mutex::new(rows.fresh()),
            spare: Default::default(),
        }
    }
}

impl RowCheck {
    /// Check with `rows` from now on (columns added to the table while running).
    pub fn replace(&self, rows: &crate::table::RowBuilder) {
        *self.template.lock().unwrap() = rows.fresh();
        self.spare.lock().unwrap().clear();
    }
}

impl MessageCheck for RowCheck {
    fn check(&self, msg: &Message) -> Result<(), Refused> {
        let spare = self.spare.lock().unwrap().pop();
        let mut rows = spare.unwrap_or_else(|| self.template.lock().unwrap().fresh());
        let got = rows.append(msg);
        if got.is_ok() {
            rows.pop_row();
        }
        self.spare.lock().unwrap().push(rows);
        Ok(got?)
    }
}

/// Errors of the destination. [`SinkError::retryable`] says whether trying again later can help.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The object store failed (or refused a name).
    #[error(transparent)]
    Upload(#[from] UploadError),
    /// An earlier file of an ordered subscription failed, so this one must not become durable.
    #[error("object {name:?} not written: an earlier object of this ordered subscription failed")]
    OrderBroken { name: String },
    /// The table's log refused a commit, or its data file could not be encoded.
    #[error("data file {name:?} not committed: {source}")]
    Commit {
        name: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        retryable: bool,
    },
    /// The destination cannot be opened or read (startup, resume).
    #[error(transparent)]
    Table(Box<dyn std::error::Error + Send + Sync>),
    /// The shutdown grace ended before the file was durable: it was given up (its upload, commit
    /// or retries dropped). Its messages are not done: a file source's checkpoint does not pass
    /// them, a broker gets them back ([`crate::shutdown`]).
    #[error("object {name:?} not written: given up at the end of the shutdown grace")]
    GaveUp { name: String },
}

impl SinkError {
    /// Can trying again later help? Network faults, server errors and races can pass; a refused
    /// name, a missing bucket or an encoder fault do not.
    pub fn retryable(&self) -> bool {
        match self {
            SinkError::Upload(e) => upload_retryable(e),
            SinkError::OrderBroken { .. } | SinkError::GaveUp { .. } => true,
            SinkError::Commit { retryable, .. } => *retryable,
            SinkError::Table(_) => false,
        }
    }
}

/// Whether an object store error can pass: a refused URL or name, a missing bucket, a permission
/// or a precondition does not, nor a local error that waiting cannot mend; a network fault or a
/// server error can.
fn upload_retryable(e: &UploadError) -> bool {
    match e {
        UploadError::BadUrl { .. }
        | UploadError::BadName { .. }
        | UploadError::NoCredentials { .. }
        | UploadError::AwsProfile { .. } => false,
        UploadError::Abandoned { .. } | UploadError::Commit { .. } => true,
        UploadError::Store { source, .. } => {
            !crate::upload::local::is_permanent(source) && !upload_refused(source)
        }
    }
}

/// An object store's answer that no retry changes.
fn upload_refused(source: &object_store::Error) -> bool {
    use object_store::Error as E;
    matches!(
        source,
        E::NotFound { .. }
            | E::InvalidPath { .. }
            | E::NotSupported { .. }
            | E::AlreadyExists { .. }
            | E::Precondition { .. }
            | E::NotImplemented { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::UnknownConfigurationKey { .. }
    )
}

impl From<&SinkError> for NotDurable {
    /// The settle side's view of a failed file: the same text, whether it can pass, whether the
    /// shutdown grace gave it up.
    fn from(e: &SinkError) -> NotDurable {
        NotDurable {
            message: e.to_string(),
            retryable: e.retryable(),
            gave_up: matches!(e, SinkError::GaveUp { .. }),
        }
    }
}

/// Why [`OpenFiles::push`] did not take a message.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// This message cannot be written (see [`Refusal`] for what follows).
    #[error(transparent)]
    Refused(#[from] Refused),
    /// The destination failed while a file was open: the run cannot go on writing.
    #[error(transparent)]
    Sink(#[from] SinkError),
}

impl From<UploadError> for PushError {
    fn from(e: UploadError) -> Self {
        PushError::Sink(SinkError::Upload(e))
    }
}

/// What happens to a staged message when the batcher says its file must be finalized first.
pub enum Unstaged {
    /// The rendered bytes are in the carry buffer: [`SinkFile::place`] them in the next file.
    Carried,
    /// Nothing to carry: stage the message again in the next file.
    Restage,
}

/// A destination. See the module docs for the lifecycle.
pub trait Sink: Send + 'static {
    type File: SinkFile;

    /// When a file is finalized: max duration, bytes, messages.
    fn limits(&self) -> Limits;

    /// Messages whose keys differ go to different files (topic-schema revisions, §3.7).
    fn group_of(&self, _r: &Received) -> Option<String> {
        None
    }

    /// What a refused message means here.
    fn refusal(&self) -> Refusal;

    /// Can making a file durable reject single messages of it ([`Written::rejected`])? Then the
    /// file source's messages are held with the file ([`crate::receipt::FileContents::held`]).
    fn rejects_rows(&self) -> bool {
        false
    }

    /// What this sink refuses of a message on its own, to be asked before it is accepted;
    /// `None` when it refuses nothing alone.
    fn check(&self) -> Option<std::sync::Arc<dyn MessageCheck>> {
        None
    }

    /// `--exactly-once` with a positioned source: how far this sink's destination holds each
    /// stream, for the source to ask before a stream's first record; `None` otherwise.
    fn durable_streams(&self) -> Option<std::sync::Arc<dyn DurableStreams>> {
        None
    }

    /// Why the destination cannot take this sink's files now, e.g. `SCHEMA_MISMATCH: …` while a
    /// table's schema no longer fits its rows (`/readyz` shows it; nothing is committed or
    /// settled meanwhile). `None`: no such problem (the default).
    fn problem(&self) -> Option<String> {
        None
    }

    /// The run's shutdown grace: what a sink waits on in place (a call [`Sink::open`] makes)
    /// gives up when it ends, so that the run ends within it ([`crate::shutdown`]). Ignored by
    /// a sink that never waits in place (the default).
    fn bounded_by(&mut self, _grace: &crate::shutdown::Grace) {}

    /// Open a new file for `group`.
    fn open(&mut self, group: Option<&str>) -> Result<Self::File, PushError>;

    /// Open a new file for `group` whose first message is `first`. A sink whose file names derive
    /// from their first message (objects under `--exactly-once` with a positioned source,
    /// [`object::ExactNames`]) names it here; the others open as [`Sink::open`] does.
    fn open_for(
        &mut self,
        group: Option<&str>,
        _first: &Received,
    ) -> Result<Self::File, PushError> {
        self.open(group)
    }

    /// Open a file that must be stored as `name`, and only if nothing of that name exists yet
    /// (a [`crate::receipt::Replay`]). A sink whose files are not named objects opens an ordinary file: its
    /// durability does not hinge on a name.
    fn open_named(&mut self, group: Option<&str>, _name: &str) -> Result<Self::File, PushError> {
        self.open(group)
    }

    /// Is a file that a previous run left pending durable? (Resume after a crash.)
    fn is_durable(&self, name: &str) -> impl Future<Output = Result<bool, SinkError>> + Send;
}

/// One open file of a sink.
///
/// The batcher must know what a message adds before the message is in: [`SinkFile::stage`] adds it
/// tentatively and returns its size; then exactly one of [`SinkFile::commit`] (keep it) or
/// [`SinkFile::unstage`] (take it back out, to go to the next file) follows.
pub trait SinkFile: Send + 'static {
    type Closed: Durable;

    /// Object name, or data file path relative to the table root.
    fn name(&self) -> &str;

    /// Bytes the file counts before its first message (the Avro header).
    fn header_bytes(&self) -> u64;

    /// Add `r`'s message tentatively; the bytes it adds to the file. On error nothing stays
    /// behind.
    fn stage(&mut self, r: &Received) -> Result<u64, Refused>;

    /// Keep the staged message.
    fn commit(&mut self);

    /// Take the staged message back out; may leave its rendered bytes in `carry`.
    fn unstage(&mut self, carry: &mut Vec<u8>) -> Unstaged;

    /// Append bytes a previous file's [`SinkFile::unstage`] carried (this file is new and empty);
    /// the bytes they add here (a fresh file's first block can cost more than the old file's).
    fn place(&mut self, _carry: &[u8]) -> u64 {
        unreachable!("a sink that carries bytes must place them")
    }

    /// Bytes the file holds in memory (not yet streamed out or handed to an encoder).
    fn buffered(&self) -> u64 {
        0
    }

    /// Does the file want [`SinkFile::flush`] (bytes to stream out)?
    fn needs_flush(&self) -> bool {
        false
    }

    /// Stream what is buffered (a multipart upload part); waits while too much is in flight.
    fn flush(&mut self) -> impl Future<Output = Result<(), SinkError>> + Send {
        async { Ok(()) }
    }

    /// No more messages: the file as it will be made durable.
    fn close(self) -> Self::Closed;
}

/// A closed file, ready to be made durable.
#[async_trait::async_trait]
pub trait Durable: Send + 'static {
    fn name(&self) -> &str;
    /// What making it durable is: an object upload, or a table commit (metrics, logs).
    fn kind(&self) -> crate::telemetry::DurableKind {
        crate::telemetry::DurableKind::Object
    }
    /// Wait for what must be durable before it (under `--exactly-once`, the previous file of its
    /// partition). Awaited before an upload slot is taken, so a file that waits never holds a
    /// slot the file it waits for needs.
    async fn ready(&mut self) {}
    /// Make it durable (a visible object, a committed table version): the bytes written, and the
    /// messages the destination refused one by one (rows BigQuery rejected) while the rest of the
    /// file became durable.
    async fn make_durable(self: Box<Self>) -> Result<Written, SinkError>;
    /// Give up on it: nothing partial stays visible.
    async fn abort(self: Box<Self>);
}
