//! Wires the pipeline: source → filter → writer (batch + encode) → upload → settle.
//!
//! Delivery guarantee: a message is settled only after the object holding it is durable.
//! * File source: "settled" means the checkpoint watermark moves past it (see `checkpoint`); a
//!   file whose upload fails pins the watermark before its first message for the rest of the run,
//!   and the run reports it and exits non-zero.
//! * Pub/Sub source: the messages of a durable object are acked; until then their leases are
//!   extended (ModifyAckDeadline) so a long `maxDuration` does not cause redelivery. A failed
//!   object's messages are nacked — after the retry policy's backoff, by setting their deadline to
//!   it — or, on their last allowed attempt, published to the dead-letter topic and acked.
//! * Filter (SPEC §2.5): messages whose attributes do not match are settled at once (acked, or
//!   passed over by the checkpoint) and never written.
//! * Ordering (`enableMessageOrdering`): one object is made durable at a time, in order; once one
//!   fails, every later finalized or open file is failed (nacked) too, so no later message of a
//!   key becomes durable before an earlier one.
//! * Shutdown: when the `shutdown` future resolves, pulling stops, messages not yet written are
//!   nacked, open files are finalized and uploaded within `shutdown_grace`, durable ones acked and
//!   the rest nacked.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::batch::FlushReason;
use crate::checkpoint::{Checkpoint, CheckpointError, ObjectSpan};
use crate::config::ValidSubscription;
use crate::encode::FileFormat;
use crate::filter::Filter;
use crate::ids::{Clock, Ids};
use crate::message::{Message, Received};
use crate::source::file::{FileSource, FileSourceSettings, OnBadInput};
use crate::source::pubsub::{PubsubClient, PubsubSettings, PubsubSource, PubsubStopHandle};
use crate::source::{Source, SourceEvent};
use crate::table::writer::TableWriter;
use crate::table::{DeltaError, DeltaTable, RowBuilder};
use crate::upload::{self, Destination, UploadError, UploadSettings};
use crate::writer::{AckRef, FileContents, FinalizedFile, StorageWriter, WriteError};

/// Errors that stop a run before or outside the per-message path.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("subscription {0} has no cloudStorageConfig: the storage writer needs one")]
    NotStorage(String),
    #[error("subscription {0} has no bigqueryConfig: the table writer needs one")]
    NotBigQuery(String),
    #[error("--dead-letter is for the file source; Pub/Sub dead-letters to the subscription's deadLetterPolicy topic")]
    DeadLetterOnPubsub,
    #[error("dead-letter file {path}: {source}")]
    DeadLetter {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Table(Box<DeltaError>),
    #[error("cannot read {path}: {source}")]
    Source {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--checkpoint needs a file source (stdin cannot be resumed)")]
    CheckpointOnStdin,
    #[error("--checkpoint is for the file source; Pub/Sub keeps unacked messages itself")]
    CheckpointOnPubsub,
    #[error("subscription filter: {0}")]
    Filter(#[from] crate::filter::FilterError),
    #[error(transparent)]
    Pubsub(#[from] crate::source::pubsub::PubsubError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Upload(#[from] UploadError),
}

impl From<DeltaError> for RunError {
    fn from(e: DeltaError) -> Self {
        RunError::Table(Box::new(e))
    }
}

/// Where messages come from.
pub enum SourceSpec {
    /// NDJSON file or stdin.
    File(FileSourceSettings),
    /// A Pub/Sub subscription (Google Cloud or the emulator), pulled with StreamingPull.
    Pubsub {
        client: PubsubClient,
        settings: PubsubSettings,
    },
}

/// Where rows or objects go. Built once per run, so its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Output {
    /// The storage writer (SPEC §3): objects in a bucket.
    Storage {
        dest: Destination,
        format: Arc<dyn FileFormat>,
        upload: UploadSettings,
    },
    /// The table writer (SPEC §4): rows committed to a Delta table at the root of `dest`.
    Table {
        dest: Destination,
        rows: RowBuilder,
        /// Parquet writer settings (compression).
        parquet: parquet::file::properties::WriterProperties,
    },
}

/// Everything a run needs, already validated.
pub struct RunConfig {
    pub subscription: ValidSubscription,
    pub source: SourceSpec,
    pub output: Output,
    pub checkpoint: Option<PathBuf>,
    /// File source, table writer: where messages that failed alone on every delivery go
    /// (NDJSON, with the `CloudPubSubDeadLetterSource*` attributes). `None`: they stay not done.
    pub dead_letter: Option<PathBuf>,
    pub seed: Option<u64>,
    pub clock: Clock,
    /// Finalized files being made visible at once; bounds memory with the open files.
    pub max_concurrent_uploads: usize,
    /// Resolves when the run should stop gracefully (SIGTERM / SIGINT in the binary).
    pub shutdown: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// How long a graceful shutdown may spend finalizing and uploading open files.
    pub shutdown_grace: Duration,
}

/// A file whose messages are not done.
#[derive(Debug, Clone, Serialize)]
pub struct FailedObject {
    pub object: String,
    pub error: String,
    pub messages: u64,
    pub first_line: u64,
    pub last_line: u64,
    pub first_message_id: String,
    pub last_message_id: String,
}

/// What a run did; printed as JSON by the binary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    pub messages_read: u64,
    pub messages_written: u64,
    /// Messages a previous run already wrote (found in the checkpoint), not written again.
    pub messages_already_written: u64,
    /// Messages the subscription's filter did not match: settled, not written.
    pub messages_filtered: u64,
    pub bad_lines: u64,
    pub bad_messages: u64,
    /// Pub/Sub: messages acked after their object was durable (filtered and dead-lettered ones
    /// are counted apart).
    pub messages_acked: u64,
    /// Pub/Sub: messages handed back for redelivery.
    pub messages_nacked: u64,
    /// Pub/Sub: messages published to the dead-letter topic (then acked).
    pub messages_dead_lettered: u64,
    /// File source, table writer: messages that failed alone and are not done (not written,
    /// not dead-lettered); the checkpoint keeps them for the next run.
    pub messages_failed: u64,
    /// The first [`MAX_LISTED_FAILURES`] of them, with line, id and the rule broken.
    pub failed_messages: Vec<FailedMessage>,
    /// Objects written, in the order their files were opened.
    pub objects: Vec<String>,
    pub failed_objects: Vec<FailedObject>,
    /// Why reading stopped before the end of input, if it did.
    pub stopped: Option<String>,
    /// The run was asked to stop (signal) and stopped gracefully.
    pub shutdown: bool,
}

/// A message that failed alone, in the run summary.
#[derive(Debug, Clone, Serialize)]
pub struct FailedMessage {
    pub line: u64,
    pub message_id: String,
    pub attempts: u32,
    pub error: String,
}

/// How many failed messages the summary lists (all are counted).
pub const MAX_LISTED_FAILURES: usize = 100;

impl RunSummary {
    /// Did every message read end up durable (or settled as documented)? A Pub/Sub run counts as
    /// fine when failed messages were handed back for redelivery: Pub/Sub keeps them.
    pub fn ok(&self, pubsub: bool) -> bool {
        self.stopped.is_none()
            && (pubsub || (self.failed_objects.is_empty() && self.messages_failed == 0))
    }
}

struct Uploaded {
    id: u64,
    name: String,
    contents: FileContents,
    result: Result<u64, UploadError>,
}

/// The file source's settle side: what is in flight, where the watermark is, the checkpoint file.
struct Progress {
    cp: Checkpoint,
    path: Option<PathBuf>,
    /// (offset, line) of the first message of each file being uploaded.
    inflight: HashMap<u64, (u64, u64)>,
    /// (offset, line) of the first message of each failed file: the watermark never passes them.
    stuck: Vec<(u64, u64)>,
    /// (offset, line) just past the last input consumed.
    consumed: (u64, u64),
    /// Offsets of messages that failed in an earlier run and were written in this one: their
    /// failure record is cleared once the file holding them is durable.
    fixed: Vec<u64>,
}

impl Progress {
    /// `r` is in an open file now.
    fn written(&mut self, r: &Received) {
        self.consumed = (r.receipt.end, r.receipt.line + 1);
        if !self.cp.failed.is_empty() && self.cp.attempts(r.receipt.start) > 0 {
            self.fixed.push(r.receipt.start);
        }
    }

    fn save(&self) -> Result<(), CheckpointError> {
        match &self.path {
            Some(p) => self.cp.save(p),
            None => Ok(()),
        }
    }

    fn advance(&mut self, open: impl Iterator<Item = (u64, u64)>) -> Result<(), CheckpointError> {
        let w = open
            .chain(self.inflight.values().copied())
            .chain(self.stuck.iter().copied())
            .chain(std::iter::once(self.consumed))
            .min_by_key(|p| p.0)
            .expect("consumed is always there");
        if w.0 > self.cp.offset {
            self.cp.offset = w.0;
            self.cp.line = w.1;
            self.cp.prune();
        }
        self.save()
    }
}

/// The Pub/Sub settle side: acks, nacks with backoff, dead letters, leases.
struct PubsubSettle {
    client: PubsubClient,
    subscription: String,
    /// `(topic, max_delivery_attempts)`.
    dead_letter: Option<(String, u32)>,
    /// `(minimum_backoff, maximum_backoff)`; `None` = redeliver at once.
    retry: Option<(Duration, Duration)>,
    /// Failed deliveries seen here, per message id — the attempt count when the server sends
    /// none (no dead-letter policy on the subscription, SPEC §1.1).
    failures: HashMap<String, u32>,
    /// Last failure of each message id, for the dead-letter error attribute.
    last_error: HashMap<String, String>,
    /// Ack references of the files being uploaded.
    inflight: HashMap<u64, Vec<AckRef>>,
    /// Lease length set on every extension.
    lease: Duration,
}

impl PubsubSettle {
    /// The delivery attempt `r` is (1-based).
    fn attempt(&self, r: &Received) -> u32 {
        match r.receipt.delivery_attempt {
            Some(n) if n > 0 => n as u32,
            _ => self.failures.get(&r.msg.message_id).copied().unwrap_or(0) + 1,
        }
    }

    fn ack_ref(&self, r: &Received) -> AckRef {
        let attempt = self.attempt(r);
        let last_chance = self
            .dead_letter
            .as_ref()
            .is_some_and(|(_, max)| attempt >= *max);
        AckRef {
            ack_id: r.receipt.ack_id.clone().unwrap_or_default(),
            message_id: r.msg.message_id.clone(),
            attempt,
            kept: last_chance.then(|| r.msg.clone()),
        }
    }

    /// Acknowledge; false when the call failed (the messages will then be redelivered).
    async fn ack(&self, ids: &[String]) -> bool {
        if ids.is_empty() {
            return true;
        }
        match self.client.ack(&self.subscription, ids).await {
            Ok(()) => true,
            Err(e) => {
                // The object is durable; a lost ack only means a duplicate later (at least once).
                tracing::warn!(messages = ids.len(), error = %e, "ack failed; the messages will be redelivered");
                false
            }
        }
    }

    /// Redelivery delay of a message that failed on `attempt` (SPEC §2.9, Q9): none without a
    /// retry policy, else `min(max, min · 2^(attempt−1))` with ±20 % jitter.
    fn backoff(&self, attempt: u32) -> Duration {
        let Some((min, max)) = self.retry else {
            return Duration::ZERO;
        };
        let exp = min.saturating_mul(1u32 << (attempt.saturating_sub(1)).min(20));
        let base = exp.min(max);
        let jitter = 0.8 + 0.4 * rand::random::<f64>();
        base.mul_f64(jitter).min(max)
    }

    /// Settle messages whose delivery failed with `error`: dead-letter those on their last
    /// attempt, nack the others (after their backoff).
    async fn fail(&mut self, acks: Vec<AckRef>, error: &str, summary: &mut RunSummary) {
        self.fail_with(acks, error, true, summary).await
    }

    /// [`PubsubSettle::fail`]; `backoff: false` redelivers at once whatever the retry policy.
    async fn fail_with(
        &mut self,
        acks: Vec<AckRef>,
        error: &str,
        backoff: bool,
        summary: &mut RunSummary,
    ) {
        let mut dead = Vec::new();
        let mut by_delay: HashMap<u64, Vec<String>> = HashMap::new();
        for a in acks {
            *self.failures.entry(a.message_id.clone()).or_default() += 1;
            self.last_error
                .insert(a.message_id.clone(), error.to_string());
            match (&self.dead_letter, a.kept) {
                (Some((_, max)), Some(m)) if a.attempt >= *max => {
                    dead.push((a.ack_id, a.attempt, m))
                }
                // Deadlines are whole seconds: round a backoff up, so it is never cut to zero.
                _ if !backoff => by_delay.entry(0).or_default().push(a.ack_id),
                _ => by_delay
                    .entry(self.backoff(a.attempt).as_secs_f64().ceil() as u64)
                    .or_default()
                    .push(a.ack_id),
            }
        }
        if !dead.is_empty() {
            let (topic, _) = self.dead_letter.clone().expect("dead letters need a topic");
            let (project, sub_id) = split_subscription(&self.subscription);
            let wrapped: Vec<Message> = dead
                .iter()
                .map(|(_, attempt, m)| dead_letter_message(m, *attempt, &project, &sub_id, error))
                .collect();
            match self.client.publish(&topic, &wrapped).await {
                Ok(_) => {
                    let ids: Vec<String> = dead.iter().map(|d| d.0.clone()).collect();
                    let _ = self.ack(&ids).await;
                    summary.messages_dead_lettered += ids.len() as u64;
                    for (_, _, m) in &dead {
                        self.failures.remove(&m.message_id);
                        self.last_error.remove(&m.message_id);
                    }
                    tracing::warn!(messages = ids.len(), topic = %topic, "dead-lettered: {error}");
                }
                Err(e) => {
                    tracing::error!(error = %e, "publishing to the dead-letter topic failed; nacking");
                    by_delay
                        .entry(0)
                        .or_default()
                        .extend(dead.into_iter().map(|d| d.0));
                }
            }
        }
        for (secs, ids) in by_delay {
            summary.messages_nacked += ids.len() as u64;
            // A nack is a deadline of 0; a positive deadline delays redelivery by that much
            // (SPEC §2.1: ModifyAckDeadline), which is how the retry policy's backoff is applied.
            let secs = secs.min(600) as i32;
            if let Err(e) = self
                .client
                .modify_ack_deadline(&self.subscription, &ids, secs)
                .await
            {
                tracing::warn!(error = %e, "nack failed; the messages will be redelivered at their deadline");
            }
        }
    }

    /// Extend the leases of every message not yet durable.
    async fn extend(&self, open: Vec<String>) {
        let ids: Vec<String> = open
            .into_iter()
            .chain(self.inflight.values().flatten().map(|a| a.ack_id.clone()))
            .collect();
        if ids.is_empty() {
            return;
        }
        let secs = self.lease.as_secs().clamp(10, 600) as i32;
        if let Err(e) = self
            .client
            .modify_ack_deadline(&self.subscription, &ids, secs)
            .await
        {
            tracing::warn!(error = %e, messages = ids.len(), "lease extension failed");
        }
    }
}

/// `projects/{p}/subscriptions/{s}` → `(p, s)`.
fn split_subscription(name: &str) -> (String, String) {
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        ["projects", p, "subscriptions", s] => (p.to_string(), s.to_string()),
        _ => (String::new(), name.to_string()),
    }
}

/// The message published to the dead-letter topic: the original data, attributes and ordering key,
/// plus the five `CloudPubSubDeadLetterSource*` attributes (SPEC §2.8).
pub fn dead_letter_message(
    m: &Message,
    attempts: u32,
    project: &str,
    subscription_id: &str,
    error: &str,
) -> Message {
    let mut out = m.clone();
    let t = chrono::DateTime::from_timestamp_micros(m.publish_time_micros).unwrap_or_default();
    let a = &mut out.attributes;
    a.insert(
        "CloudPubSubDeadLetterSourceDeliveryCount".into(),
        attempts.to_string(),
    );
    a.insert(
        "CloudPubSubDeadLetterSourceSubscription".into(),
        subscription_id.to_string(),
    );
    a.insert(
        "CloudPubSubDeadLetterSourceSubscriptionProject".into(),
        project.to_string(),
    );
    a.insert(
        "CloudPubSubDeadLetterSourceTopicPublishTime".into(),
        t.format("%Y-%m-%dT%H:%M:%S%.3f+00:00").to_string(),
    );
    a.insert(
        "CloudPubSubDeadLetterSourceDeliveryErrorMessage".into(),
        error.to_string(),
    );
    out.message_id = String::new();
    out
}

/// How messages are settled: by the checkpoint (file) or by acks (Pub/Sub).
enum Settle {
    File(Box<Progress>),
    Pubsub(Box<PubsubSettle>),
}

/// The writer stage of this run: objects (storage) or rows (table).
enum Stage {
    Storage(Box<StorageWriter>),
    Table(Box<TableWriter>),
}

impl Stage {
    fn group_of(&self, r: &Received) -> Option<String> {
        match self {
            Stage::Storage(w) => w.group_of(r),
            Stage::Table(_) => None,
        }
    }

    fn open_starts(&self) -> Vec<(u64, u64)> {
        match self {
            Stage::Storage(w) => w.open_starts().collect(),
            Stage::Table(w) => w.open_starts().collect(),
        }
    }

    async fn push(
        &mut self,
        r: &Received,
        group: Option<String>,
        ack: Option<AckRef>,
        done: &mut Vec<FinalizedFile>,
    ) -> Result<(), WriteError> {
        match self {
            Stage::Storage(w) => w.push(r, group, ack, done).await,
            Stage::Table(w) => Ok(w.push(r, ack, done)?),
        }
    }

    fn open_ack_ids(&self) -> Vec<String> {
        match self {
            Stage::Storage(w) => w.open_ack_ids().map(str::to_string).collect(),
            Stage::Table(w) => w.open_ack_ids().map(str::to_string).collect(),
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        match self {
            Stage::Storage(w) => w.next_deadline(),
            Stage::Table(w) => w.next_deadline(),
        }
    }

    fn expire(&mut self, now: Instant, done: &mut Vec<FinalizedFile>) {
        match self {
            Stage::Storage(w) => w.expire(now, done),
            Stage::Table(w) => w.expire(now, done),
        }
    }

    fn finalize_all(&mut self, reason: FlushReason, done: &mut Vec<FinalizedFile>) {
        match self {
            Stage::Storage(w) => w.finalize_all(reason, done),
            Stage::Table(w) => w.finalize_all(reason, done),
        }
    }

    /// Is an object (data file) a previous run left pending durable (committed)?
    async fn is_durable(&self, name: &str) -> Result<bool, RunError> {
        Ok(match self {
            Stage::Storage(w) => upload::exists(w.dest(), name).await?,
            Stage::Table(w) => w.table().lock().await.contains_file(name).await?,
        })
    }
}

/// The dead-letter file of a file-source run (`--dead-letter`): NDJSON, appended and synced
/// before the message counts as done.
struct DeadLetterFile {
    path: PathBuf,
    file: std::fs::File,
    /// Deliveries a message gets before it is dead-lettered (the subscription's
    /// `maxDeliveryAttempts`, 5 without a dead-letter policy).
    max_attempts: u32,
}

impl DeadLetterFile {
    fn open(path: &std::path::Path, max_attempts: u32) -> Result<DeadLetterFile, RunError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| RunError::DeadLetter {
                path: path.display().to_string(),
                source,
            })?;
        Ok(DeadLetterFile {
            path: path.to_path_buf(),
            file,
            max_attempts,
        })
    }

    /// Append `m` (already carrying the dead-letter attributes) as a REST `PubsubMessage` line
    /// and sync it.
    fn write(&mut self, m: &Message) -> Result<(), RunError> {
        use std::io::Write;
        let mut line = m.to_json_line().into_bytes();
        line.push(b'\n');
        self.file
            .write_all(&line)
            .and_then(|()| self.file.sync_data())
            .map_err(|source| RunError::DeadLetter {
                path: self.path.display().to_string(),
                source,
            })
    }
}

/// Run the storage writer until the end of input (file source) or a shutdown (any source).
pub async fn run(mut cfg: RunConfig) -> Result<RunSummary, RunError> {
    let mut writer = match cfg.output {
        Output::Storage {
            dest,
            format,
            upload,
        } => {
            let storage = cfg
                .subscription
                .storage
                .clone()
                .ok_or_else(|| RunError::NotStorage(cfg.subscription.name.clone()))?;
            Stage::Storage(Box::new(StorageWriter::new(
                storage,
                format,
                dest,
                upload,
                Ids::new(cfg.seed),
                cfg.clock,
            )))
        }
        Output::Table {
            dest,
            rows,
            parquet,
        } => {
            let bq = cfg
                .subscription
                .bigquery
                .clone()
                .ok_or_else(|| RunError::NotBigQuery(cfg.subscription.name.clone()))?;
            let table = DeltaTable::open_or_create(&dest, &rows.schema()).await?;
            let limits = crate::batch::Limits {
                max_duration: bq.max_duration,
                max_bytes: bq.max_bytes,
                max_messages: bq.max_messages,
            };
            Stage::Table(Box::new(TableWriter::new(rows, limits, table, parquet)))
        }
    };
    let table_mode = matches!(writer, Stage::Table(_));
    let mut dead_letter = None;
    let filter = Filter::parse(&cfg.subscription.delivery.filter)?;
    let ordering = cfg.subscription.delivery.enable_message_ordering;
    let mut summary = RunSummary::default();
    let mut done: Vec<FinalizedFile> = Vec::new();

    let (mut source, mut settle, stop, on_bad_input, source_name): (
        Box<dyn Source>,
        Settle,
        Option<PubsubStopHandle>,
        OnBadInput,
        String,
    ) = match std::mem::replace(
        &mut cfg.source,
        SourceSpec::File(FileSourceSettings::new(None)),
    ) {
        SourceSpec::File(fs) => {
            let name = fs
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "-".into());
            // Resume: settle pending objects of a previous run by looking them up.
            let mut cp = match &cfg.checkpoint {
                Some(p) => {
                    if fs.path.is_none() {
                        return Err(RunError::CheckpointOnStdin);
                    }
                    Checkpoint::load_or_new(p, &name)?
                }
                None => Checkpoint::new(&name),
            };
            for pending in std::mem::take(&mut cp.pending) {
                if writer.is_durable(&pending.object).await? {
                    tracing::info!(object = %pending.object, "object of the previous run is durable");
                    cp.committed.push(pending);
                }
            }
            let mut fs = fs;
            fs.start_offset = cp.offset;
            fs.start_line = cp.line;
            let progress = Progress {
                consumed: (cp.offset, cp.line),
                cp,
                path: cfg.checkpoint.clone(),
                inflight: HashMap::new(),
                stuck: Vec::new(),
                fixed: Vec::new(),
            };
            progress.save()?;
            if let Some(path) = &cfg.dead_letter {
                let max = cfg
                    .subscription
                    .delivery
                    .dead_letter
                    .as_ref()
                    .map_or(5, |(_, max)| *max);
                dead_letter = Some(DeadLetterFile::open(path, max)?);
            }
            let bad = fs.on_bad_input;
            let src = FileSource::open(fs).map_err(|source| RunError::Source {
                path: name.clone(),
                source,
            })?;
            (
                Box::new(src),
                Settle::File(Box::new(progress)),
                None,
                bad,
                name,
            )
        }
        SourceSpec::Pubsub { client, settings } => {
            if cfg.checkpoint.is_some() {
                return Err(RunError::CheckpointOnPubsub);
            }
            if cfg.dead_letter.is_some() {
                return Err(RunError::DeadLetterOnPubsub);
            }
            let src = PubsubSource::start(client.clone(), settings.clone())?;
            let stop = src.stop_handle();
            let d = &cfg.subscription.delivery;
            let settle = PubsubSettle {
                client,
                subscription: settings.subscription.clone(),
                dead_letter: d.dead_letter.clone(),
                retry: d.retry,
                failures: HashMap::new(),
                last_error: HashMap::new(),
                inflight: HashMap::new(),
                lease: settings.stream_ack_deadline,
            };
            // A message that cannot be encoded is a failed delivery (nack, then dead letter),
            // never a reason to stop the worker.
            (
                Box::new(src),
                Settle::Pubsub(Box::new(settle)),
                Some(stop),
                OnBadInput::Skip,
                settings.subscription,
            )
        }
    };
    let pubsub = matches!(settle, Settle::Pubsub(_));

    // With ordering, objects become durable one at a time, in order.
    let uploads = Arc::new(Semaphore::new(if ordering {
        1
    } else {
        cfg.max_concurrent_uploads.max(1)
    }));
    let broken = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = mpsc::unbounded_channel::<Uploaded>();
    let mut written: Vec<(u64, String)> = Vec::new();
    let lease_period = match &settle {
        Settle::Pubsub(ps) => ps.lease / 3,
        Settle::File(_) => Duration::from_secs(3600),
    };
    let mut lease_tick = tokio::time::interval_at(Instant::now() + lease_period, lease_period);
    let mut shutdown: Pin<Box<dyn Future<Output = ()> + Send>> = cfg
        .shutdown
        .take()
        .unwrap_or_else(|| Box::pin(std::future::pending()));
    let ctx = Ctx {
        uploads: uploads.clone(),
        tx: tx.clone(),
        broken: broken.clone(),
        ordering,
    };

    'read: loop {
        let deadline = writer.next_deadline();
        tokio::select! {
            biased;
            Some(up) = rx.recv() => {
                on_uploaded(up, &mut settle, &mut writer, &mut summary, &mut written, &mut done, &ctx).await?;
            }
            _ = &mut shutdown, if !summary.shutdown => {
                summary.shutdown = true;
                tracing::info!("shutting down: finalizing open files");
                match &stop {
                    // Pulling stops; what was already received still comes out, then `None`.
                    Some(h) => h.stop(),
                    None => break 'read,
                }
            }
            _ = lease_tick.tick(), if pubsub => {
                if let Settle::Pubsub(ps) = &settle {
                    ps.extend(writer.open_ack_ids()).await;
                }
            }
            _ = sleep_until(deadline), if deadline.is_some() => {
                writer.expire(Instant::now(), &mut done);
            }
            ev = source.next() => match ev {
                None => break 'read,
                Some(SourceEvent::Messages(batch)) => {
                    let mut filtered_acks = Vec::new();
                    for r in &batch {
                        summary.messages_read += 1;
                        if !filter.is_empty() && !filter.matches(&r.msg.attributes) {
                            // Pub/Sub acks non-matching messages itself (SPEC §2.5).
                            summary.messages_filtered += 1;
                            match &mut settle {
                                Settle::File(p) => p.consumed = (r.receipt.end, r.receipt.line + 1),
                                Settle::Pubsub(_) => filtered_acks.extend(r.receipt.ack_id.clone()),
                            }
                            continue;
                        }
                        let group = writer.group_of(r);
                        let ack = match &mut settle {
                            Settle::File(p) => {
                                if p.cp.covers(group.as_deref(), r.receipt.start) {
                                    summary.messages_already_written += 1;
                                    p.consumed = (r.receipt.end, r.receipt.line + 1);
                                    continue;
                                }
                                None
                            }
                            Settle::Pubsub(ps) => Some(ps.ack_ref(r)),
                        };
                        match writer.push(r, group, ack, &mut done).await {
                            Ok(()) => {
                                if let Settle::File(p) = &mut settle {
                                    p.written(r);
                                }
                            }
                            Err(e @ (WriteError::BadMessage(_) | WriteError::BadRow(_))) => {
                                summary.bad_messages += 1;
                                match &mut settle {
                                    Settle::File(p) if table_mode => {
                                        fail_alone(
                                            r,
                                            e.to_string(),
                                            p,
                                            &mut writer,
                                            &mut dead_letter,
                                            &mut done,
                                            &mut summary,
                                            &source_name,
                                            &cfg.subscription.name,
                                        )
                                        .await?;
                                    }
                                    Settle::File(p) => {
                                        let what = format!("{source_name}:{}: {e}", r.receipt.line);
                                        tracing::error!("{what}");
                                        if on_bad_input == OnBadInput::Fail {
                                            summary.stopped = Some(what);
                                            break 'read;
                                        }
                                        p.consumed = (r.receipt.end, r.receipt.line + 1);
                                    }
                                    Settle::Pubsub(ps) => {
                                        tracing::error!("{source_name}: {e}");
                                        let a = ps.ack_ref(r);
                                        // SPEC §4.1: a message that does not fit the table's
                                        // schema is not backed off when a dead-letter topic
                                        // is attached; it goes there sooner.
                                        let backoff = !(table_mode && ps.dead_letter.is_some());
                                        ps.fail_with(vec![a], &e.to_string(), backoff, &mut summary)
                                            .await;
                                    }
                                }
                            }
                            Err(WriteError::Upload(e)) => {
                                summary.stopped = Some(e.to_string());
                                break 'read;
                            }
                        }
                        if !done.is_empty() {
                            start_uploads(&mut done, &mut settle, &ctx).await?;
                        }
                    }
                    if let Settle::Pubsub(ps) = &settle {
                        let _ = ps.ack(&filtered_acks).await;
                    }
                }
                Some(SourceEvent::Bad(bad)) => {
                    summary.bad_lines += 1;
                    tracing::error!("{bad}");
                    if on_bad_input == OnBadInput::Fail {
                        summary.stopped = Some(bad.to_string());
                        break 'read;
                    }
                    if let Settle::File(p) = &mut settle {
                        p.consumed = (bad.end, bad.line + 1);
                    }
                }
                Some(SourceEvent::Failed(e)) => {
                    summary.stopped = Some(e);
                    break 'read;
                }
            }
        }
        if !done.is_empty() {
            start_uploads(&mut done, &mut settle, &ctx).await?;
        }
    }

    // End of input, a stop or a shutdown: finalize what is open, wait for the uploads, settle.
    let reason = if summary.stopped.is_some() || summary.shutdown {
        FlushReason::Early
    } else {
        FlushReason::EndOfInput
    };
    writer.finalize_all(reason, &mut done);
    start_uploads(&mut done, &mut settle, &ctx).await?;
    drop(ctx);
    drop(tx);
    let grace = if summary.shutdown {
        cfg.shutdown_grace
    } else {
        Duration::MAX
    };
    let deadline = Instant::now().checked_add(grace);
    loop {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, rx.recv()).await {
                Ok(n) => n,
                Err(_) => {
                    tracing::error!(
                        "shutdown grace of {grace:?} passed with uploads still running"
                    );
                    break;
                }
            },
            None => rx.recv().await,
        };
        let Some(up) = next else { break };
        on_uploaded(
            up,
            &mut settle,
            &mut writer,
            &mut summary,
            &mut written,
            &mut done,
            &Ctx {
                uploads: uploads.clone(),
                tx: mpsc::unbounded_channel().0,
                broken: broken.clone(),
                ordering,
            },
        )
        .await?;
    }
    match &mut settle {
        Settle::File(p) => p.advance(std::iter::empty())?,
        Settle::Pubsub(ps) => {
            // Whatever is still uploading past the grace period is handed back.
            let rest: Vec<AckRef> = ps.inflight.drain().flat_map(|(_, v)| v).collect();
            if !rest.is_empty() {
                ps.fail(rest, "shutdown before the object was durable", &mut summary)
                    .await;
            }
        }
    }
    written.sort();
    summary.objects = written.into_iter().map(|(_, n)| n).collect();
    let _ = pubsub;
    Ok(summary)
}

/// File source, table writer: a message that cannot be a row fails alone (SPEC §4.6). No broker
/// redelivers from a file, so with a dead-letter file the run redelivers it itself, up to the
/// subscription's max delivery attempts (counting earlier runs' attempts, kept in the
/// checkpoint), then appends it to the dead-letter file. Without one it stays not done: recorded
/// in the checkpoint, which the watermark does not pass, and reported.
#[allow(clippy::too_many_arguments)]
async fn fail_alone(
    r: &Received,
    first_error: String,
    p: &mut Progress,
    writer: &mut Stage,
    dead_letter: &mut Option<DeadLetterFile>,
    done: &mut Vec<FinalizedFile>,
    summary: &mut RunSummary,
    source_name: &str,
    subscription: &str,
) -> Result<(), RunError> {
    let offset = r.receipt.start;
    let line = r.receipt.line;
    let mut attempts = p.cp.attempts(offset) + 1;
    let mut error = first_error;
    tracing::error!("{source_name}:{line}: {error} (delivery attempt {attempts})");
    if let Some(dl) = dead_letter {
        while attempts < dl.max_attempts {
            attempts += 1;
            match writer.push(r, None, None, done).await {
                Ok(()) => {
                    p.written(r);
                    return Ok(());
                }
                Err(WriteError::Upload(e)) => return Err(e.into()),
                Err(e) => error = e.to_string(),
            }
        }
        let (project, sub_id) = split_subscription(subscription);
        let mut m = dead_letter_message(&r.msg, attempts, &project, &sub_id, &error);
        // A file has no topic to assign a new id: keep the original one, for tracing.
        m.message_id.clone_from(&r.msg.message_id);
        dl.write(&m)?;
        p.cp.clear_failure(offset);
        p.consumed = (r.receipt.end, line + 1);
        summary.messages_dead_lettered += 1;
        tracing::warn!(
            "{source_name}:{line}: message {:?} dead-lettered to {} after {attempts} attempts",
            r.msg.message_id,
            dl.path.display()
        );
        return Ok(());
    }
    p.cp.record_failure(offset, line, &r.msg.message_id, attempts, &error);
    p.stuck.push((offset, line));
    p.consumed = (r.receipt.end, line + 1);
    summary.messages_failed += 1;
    if summary.failed_messages.len() < MAX_LISTED_FAILURES {
        summary.failed_messages.push(FailedMessage {
            line,
            message_id: r.msg.message_id.clone(),
            attempts,
            error,
        });
    }
    Ok(())
}

/// What starting an upload needs.
struct Ctx {
    uploads: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<Uploaded>,
    /// Ordering: an earlier object failed, so later ones must not become durable.
    broken: Arc<AtomicBool>,
    ordering: bool,
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn start_uploads(
    done: &mut Vec<FinalizedFile>,
    settle: &mut Settle,
    ctx: &Ctx,
) -> Result<(), RunError> {
    for mut f in done.drain(..) {
        if f.contents.messages == 0 {
            // Opened for a message that then failed to encode: nothing to write.
            f.sink.abort().await;
            continue;
        }
        let name = f.sink.name().to_string();
        tracing::debug!(object = %name, reason = ?f.reason, messages = f.contents.messages, "finalize");
        match settle {
            Settle::File(progress) => {
                progress.cp.pending.push(ObjectSpan {
                    object: name.clone(),
                    span: f.contents.span.clone(),
                });
                progress
                    .inflight
                    .insert(f.id, (f.contents.span.first, f.contents.first_line));
                progress.save()?;
            }
            Settle::Pubsub(ps) => {
                ps.inflight
                    .insert(f.id, std::mem::take(&mut f.contents.acks));
            }
        }
        let permit = ctx
            .uploads
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        let tx = ctx.tx.clone();
        let broken = ctx.broken.clone();
        let ordering = ctx.ordering;
        tokio::spawn(async move {
            let result = if ordering && broken.load(AtomicOrdering::SeqCst) {
                f.sink.abort().await;
                Err(UploadError::Abandoned {
                    name: name.clone(),
                    reason: "an earlier object of this ordered subscription failed".into(),
                })
            } else {
                f.sink.finish().await
            };
            let _ = tx.send(Uploaded {
                id: f.id,
                name,
                contents: f.contents,
                result,
            });
            drop(permit);
        });
    }
    Ok(())
}

async fn on_uploaded(
    up: Uploaded,
    settle: &mut Settle,
    writer: &mut Stage,
    summary: &mut RunSummary,
    written: &mut Vec<(u64, String)>,
    done: &mut Vec<FinalizedFile>,
    ctx: &Ctx,
) -> Result<(), RunError> {
    let c = &up.contents;
    let ok = match &up.result {
        Ok(bytes) => {
            tracing::info!(object = %up.name, messages = c.messages, bytes, "object written");
            summary.messages_written += c.messages;
            written.push((up.id, up.name.clone()));
            true
        }
        Err(e) => {
            tracing::error!(
                "object {} failed: {e}; its {} messages (lines {}..={}, ids {}..{}) are not done",
                up.name,
                c.messages,
                c.first_line,
                c.last_line,
                c.first_message_id,
                c.last_message_id
            );
            summary.failed_objects.push(FailedObject {
                object: up.name.clone(),
                error: e.to_string(),
                messages: c.messages,
                first_line: c.first_line,
                last_line: c.last_line,
                first_message_id: c.first_message_id.clone(),
                last_message_id: c.last_message_id.clone(),
            });
            if ctx.ordering && !ctx.broken.swap(true, AtomicOrdering::SeqCst) {
                // Later messages of its keys sit in open files: fail those too.
                writer.finalize_all(FlushReason::Early, done);
            }
            false
        }
    };
    match settle {
        Settle::File(progress) => {
            let start = progress.inflight.remove(&up.id).expect("tracked");
            let idx = progress
                .cp
                .pending
                .iter()
                .position(|p| p.object == up.name)
                .expect("pending");
            let pending = progress.cp.pending.remove(idx);
            if ok {
                // Messages that failed in an earlier run and are in this file are done now.
                let cp = &mut progress.cp;
                let span = &pending.span;
                progress.fixed.retain(|&o| {
                    let inside = span.first <= o && o <= span.last;
                    if inside {
                        cp.clear_failure(o);
                    }
                    !inside
                });
                progress.cp.committed.push(pending);
            } else {
                progress.stuck.push(start);
            }
            progress.advance(writer.open_starts().into_iter())?;
        }
        Settle::Pubsub(ps) => {
            let acks = ps.inflight.remove(&up.id).unwrap_or_default();
            if ok {
                let ids: Vec<String> = acks.into_iter().map(|a| a.ack_id).collect();
                summary.messages_acked += ids.len() as u64;
                if ps.ack(&ids).await {
                    tracing::info!(object = %up.name, messages = ids.len(), "acked after durable");
                }
            } else {
                let reason = match &up.result {
                    Err(e) => e.to_string(),
                    Ok(_) => unreachable!(),
                };
                ps.fail(acks, &reason, summary).await;
            }
            if ps.inflight.is_empty() && done.is_empty() {
                // Everything after the failure has been handed back: start afresh.
                ctx.broken.store(false, AtomicOrdering::SeqCst);
            }
        }
    }
    if !done.is_empty() {
        start_uploads(done, settle, ctx).await?;
    }
    Ok(())
}

/// Output options that are not part of the subscription resource (subsink extensions).
#[derive(Debug, Clone)]
pub struct FormatOptions {
    pub codec: crate::encode::avro::Codec,
    /// Uncompressed bytes at which an Avro block is closed.
    pub block_size: usize,
    /// The topic's Avro schema, required with `useTopicSchema`.
    pub topic_schema: Option<PathBuf>,
    /// Encoding of messages without a `googclient_schemaencoding` attribute.
    pub default_encoding: crate::encode::topic::SchemaEncoding,
}

/// Errors building the output format at startup.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("subscription {0} has no cloudStorageConfig")]
    NotStorage(String),
    #[error("avroConfig.useTopicSchema is set: give the topic's Avro schema with --topic-schema FILE.avsc")]
    MissingTopicSchema,
    #[error("--topic-schema {path}: {reason}")]
    TopicSchema { path: String, reason: String },
}

/// Build the output format a subscription asks for (SPEC §3.6, §3.7).
pub fn build_format(
    sub: &ValidSubscription,
    opts: &FormatOptions,
) -> Result<Arc<dyn FileFormat>, FormatError> {
    use crate::config::OutputFormat;
    use crate::encode::avro::{AvroFormat, AvroLayout};
    use crate::encode::text::TextFormat;
    use crate::encode::topic::TopicSchema;
    let storage = sub
        .storage
        .as_ref()
        .ok_or_else(|| FormatError::NotStorage(sub.name.clone()))?;
    let (write_metadata, use_topic_schema) = match storage.output {
        OutputFormat::Text => return Ok(Arc::new(TextFormat)),
        OutputFormat::Avro {
            write_metadata,
            use_topic_schema,
        } => (write_metadata, use_topic_schema),
    };
    let layout = if use_topic_schema {
        let path = opts
            .topic_schema
            .as_ref()
            .ok_or(FormatError::MissingTopicSchema)?;
        let schema = TopicSchema::from_file(path, opts.default_encoding).map_err(|e| {
            FormatError::TopicSchema {
                path: path.display().to_string(),
                reason: e.to_string(),
            }
        })?;
        if write_metadata {
            AvroLayout::TopicSchemaWithMetadata(schema)
        } else {
            AvroLayout::TopicSchema(schema)
        }
    } else if write_metadata {
        AvroLayout::WithMetadata
    } else {
        AvroLayout::Plain
    };
    let format =
        AvroFormat::new(layout, sub.name.clone(), opts.codec, opts.block_size).map_err(|e| {
            FormatError::TopicSchema {
                path: opts
                    .topic_schema
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                reason: e.to_string(),
            }
        })?;
    Ok(Arc::new(format))
}
