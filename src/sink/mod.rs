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
pub mod delta;
pub mod discard;
pub mod files;
pub mod object;
pub mod order;
pub mod publish;
pub mod registry;

use std::future::Future;

use crate::batch::Limits;
use crate::checkpoint::Span;
use crate::message::Message;
use crate::position::Positions;
use crate::upload::UploadError;

pub use files::{Files, FinalizedFile, OpenFiles, Pushed};
pub use registry::{BuildError, SinkSetup, SinkSpec};

/// A message a sink cannot hold: nothing was written for it. The error names the message id and the
/// rule it broke.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// It cannot be encoded in the object format (e.g. it does not match the topic schema).
    #[error(transparent)]
    Encode(#[from] crate::encode::EncodeError),
    /// It cannot be a row of the table.
    #[error(transparent)]
    Row(#[from] crate::table::RowError),
    /// A Single Message Transform failed it before it reached the sink (it fails alone).
    #[error(transparent)]
    Transform(#[from] crate::transform::TransformError),
    /// Its partitioned object path cannot be stored (`subsink.paths`: a value too long).
    #[error(transparent)]
    Path(#[from] crate::paths::PathError),
}

/// What a sink would refuse of a message on its own (the topic schema, the table's row rules),
/// asked before the message is accepted: the push endpoint's checks before it spools a message
/// and answers 2xx ([`crate::shape::Shaper::check`]). The same rules as [`SinkFile::stage`].
pub trait MessageCheck: Send + Sync {
    fn check(&self, msg: &Message) -> Result<(), Refused>;
}

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

/// What a refused message means for its delivery — a property of the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Bad input: a file source applies `--on-bad-input`; a broker redelivers it with the retry
    /// policy's backoff and dead-letters it at the last attempt.
    BadInput,
    /// The message fails alone, the others go on (a BigQuery subscription's rows, §4.6): a file
    /// source redelivers it within the run up to the delivery limit, then dead-letters it or keeps
    /// it not done; a broker redelivers it — without backoff when a dead-letter topic is attached.
    FailsAlone,
}

impl Refusal {
    /// Is a broker's redelivery of a refused message delayed by the retry policy? Not for a
    /// message that fails alone when a dead-letter destination exists: it goes there sooner
    /// (docs/contract.md §4.1).
    pub fn backs_off(self, dead_letter: bool) -> bool {
        !(self == Refusal::FailsAlone && dead_letter)
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
    Table(#[from] Box<crate::table::DeltaError>),
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

/// A pulled message inside a file: the handle its source settles it with, and what dead-lettering
/// it would need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckRef {
    /// The source's handle for this delivery (a Pub/Sub ack id).
    pub ack_id: String,
    pub message_id: String,
    /// Delivery attempt this delivery is (1-based): the server's count, or subsink's own.
    pub attempt: u32,
    /// The message's ordering key ("" for none; kept only with message ordering): a failed
    /// delivery blocks its key.
    pub ordering_key: String,
    /// The message itself, kept only when a failure of this delivery would dead-letter it.
    pub kept: Option<Message>,
}

impl AckRef {
    /// The reference of delivery `attempt` of `r`: the message itself is kept only when a failure
    /// of this delivery would dead-letter it (`attempt` ≥ `dead_letter_after`, the subscription's
    /// max delivery attempts when it has a dead-letter destination).
    pub fn of(
        r: &crate::message::Received,
        attempt: u32,
        dead_letter_after: Option<u32>,
        ordering_key: String,
    ) -> AckRef {
        AckRef {
            ack_id: r.receipt.ack_id.clone().unwrap_or_default(),
            message_id: r.msg.message_id.clone(),
            attempt,
            ordering_key,
            kept: dead_letter_after
                .is_some_and(|max| attempt >= max)
                .then(|| r.msg.clone()),
        }
    }
}

/// What a file holds, for settling and for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContents {
    /// Input span (file source): byte offsets of the first and last message, and their group.
    pub span: Span,
    pub first_line: u64,
    pub last_line: u64,
    pub first_message_id: String,
    pub last_message_id: String,
    pub messages: u64,
    /// Pulled messages: what settling them needs (empty for the file source).
    pub acks: Vec<AckRef>,
    /// File source, for a sink that can reject single messages after the file was handed to it
    /// ([`Sink::rejects_rows`]): every message with its receipt, in push order, so a rejected
    /// one can be settled alone. Empty otherwise.
    pub held: Vec<crate::message::Received>,
}

/// A file to write again exactly as a crashed run left it pending (see [`crate::checkpoint`]):
/// under the recorded name, holding the messages from the one it opens with through the one that
/// starts at input offset `last`, written only if no object of that name exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub object: String,
    pub last: u64,
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
    fn group_of(&self, _msg: &Message) -> Option<String> {
        None
    }

    /// What a refused message means here.
    fn refusal(&self) -> Refusal;

    /// Can making a file durable reject single messages of it ([`Written::rejected`])? Then the
    /// file source's messages are held with the file ([`FileContents::held`]).
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
    fn positions(&self) -> Option<std::sync::Arc<dyn Positions>> {
        None
    }

    /// Why the destination cannot take this sink's files now, e.g. `SCHEMA_MISMATCH: …` while a
    /// table's schema no longer fits its rows (`/readyz` shows it; nothing is committed or
    /// settled meanwhile). `None`: no such problem (the default).
    fn problem(&self) -> Option<String> {
        None
    }

    /// Open a new file for `group`.
    fn open(&mut self, group: Option<&str>) -> Result<Self::File, PushError>;

    /// Open a new file for `group` whose first message is `first`. A sink whose file names derive
    /// from their first message (objects under `--exactly-once` with a positioned source,
    /// [`object::ExactNames`]) names it here; the others open as [`Sink::open`] does.
    fn open_for(&mut self, group: Option<&str>, _first: &Message) -> Result<Self::File, PushError> {
        self.open(group)
    }

    /// Open a file that must be stored as `name`, and only if nothing of that name exists yet
    /// (a [`Replay`]). A sink whose files are not named objects opens an ordinary file: its
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

    /// Add `msg` tentatively; the bytes it adds to the file. On error nothing stays behind.
    fn stage(&mut self, msg: &Message) -> Result<u64, Refused>;

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

/// What [`Durable::make_durable`] made durable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// Bytes written.
    pub bytes: u64,
    /// Messages of the file the destination refused after the file was handed to it (a row
    /// BigQuery rejected): each fails alone, as a refused message does ([`Refusal::FailsAlone`]);
    /// every other message of the file is durable. Sorted by index, each index once.
    pub rejected: Vec<Rejected>,
    /// What the summary and the log name for the file: the data files its commit added (a Delta
    /// table's paths; none for a MERGE of deletes only). `None`: the file itself, by its name.
    pub committed: Option<Vec<String>>,
}

/// One message of a durable file that the destination refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Its place in the file: the 0-based position among the file's messages, in the order they
    /// were pushed (the order of [`FileContents::acks`] and [`FileContents::held`]).
    pub index: usize,
    /// Why, as the destination said it (with the message id where known).
    pub error: String,
}

impl From<u64> for Written {
    /// Every message durable.
    fn from(bytes: u64) -> Written {
        Written {
            bytes,
            rejected: Vec::new(),
            committed: None,
        }
    }
}

impl Written {
    /// A commit of `bytes` that added the data files `files`.
    pub fn committed(bytes: u64, files: Vec<String>) -> Written {
        Written {
            bytes,
            rejected: Vec::new(),
            committed: Some(files),
        }
    }

    /// Split the items of a file (its ack references, or its held messages) into the durable
    /// ones and the rejected ones with their errors.
    pub fn split<T>(&self, items: Vec<T>) -> (Vec<T>, Vec<(T, String)>) {
        if self.rejected.is_empty() {
            return (items, Vec::new());
        }
        let mut bad = self.rejected.iter().peekable();
        let (mut ok, mut out) = (Vec::with_capacity(items.len()), Vec::new());
        for (i, item) in items.into_iter().enumerate() {
            match bad.peek() {
                Some(r) if r.index == i => {
                    out.push((item, r.error.clone()));
                    bad.next();
                }
                _ => ok.push(item),
            }
        }
        (ok, out)
    }
}

/// A source that can write exactly once into a bucket or a Delta table, as error messages name
/// it: its name (`NAME source`) and how it is given (`--source SCHEME://…`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PositionedSource {
    pub name: &'static str,
    pub flag: &'static str,
}

#[cfg(test)]
mod tests {
    use super::{Rejected, Written};

    #[test]
    fn written_splits_the_rejected_messages_out_by_index() {
        let w = Written {
            bytes: 10,
            rejected: vec![
                Rejected {
                    index: 1,
                    error: "bad one".into(),
                },
                Rejected {
                    index: 3,
                    error: "bad three".into(),
                },
            ],
            committed: None,
        };
        let (ok, bad) = w.split(vec!["a", "b", "c", "d", "e"]);
        assert_eq!(ok, ["a", "c", "e"]);
        assert_eq!(
            bad,
            [("b", "bad one".to_string()), ("d", "bad three".to_string())]
        );
        let (ok, bad) = Written::from(3).split(vec![1, 2]);
        assert_eq!((ok, bad.len()), (vec![1, 2], 0));
    }
}
