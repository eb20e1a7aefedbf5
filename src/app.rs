//! Wires the pipeline: source → writer (batch + encode) → upload → settle (checkpoint / ack).
//!
//! Delivery guarantee: a message is settled only after the object holding it is durable. For the
//! file source "settled" means the checkpoint watermark moves past it (see `checkpoint`); a file
//! whose upload fails pins the watermark before its first message for the rest of the run, and the
//! run reports it and exits non-zero.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::batch::FlushReason;
use crate::checkpoint::{Checkpoint, CheckpointError, ObjectSpan};
use crate::config::ValidSubscription;
use crate::encode::FileFormat;
use crate::ids::{Clock, Ids};
use crate::source::file::{FileSource, FileSourceSettings, OnBadInput};
use crate::source::{Source, SourceEvent};
use crate::upload::{self, Destination, UploadError, UploadSettings};
use crate::writer::{FileContents, FinalizedFile, StorageWriter, WriteError};

/// Errors that stop a run before or outside the per-message path.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("subscription {0} has no cloudStorageConfig: the storage writer needs one")]
    NotStorage(String),
    #[error("cannot read {path}: {source}")]
    Source {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--checkpoint needs a file source (stdin cannot be resumed)")]
    CheckpointOnStdin,
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Upload(#[from] UploadError),
}

/// Everything a storage-writer run needs, already validated.
pub struct RunConfig {
    pub subscription: ValidSubscription,
    pub source: FileSourceSettings,
    pub dest: Destination,
    pub format: Arc<dyn FileFormat>,
    pub upload: UploadSettings,
    pub checkpoint: Option<PathBuf>,
    pub seed: Option<u64>,
    pub clock: Clock,
    /// Finalized files being made visible at once; bounds memory with the open files.
    pub max_concurrent_uploads: usize,
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
    pub bad_lines: u64,
    pub bad_messages: u64,
    /// Objects written, in the order their files were opened.
    pub objects: Vec<String>,
    pub failed_objects: Vec<FailedObject>,
    /// Why reading stopped before the end of input, if it did.
    pub stopped: Option<String>,
}

impl RunSummary {
    /// Did every message read end up durable (or skipped as documented)?
    pub fn ok(&self) -> bool {
        self.failed_objects.is_empty() && self.stopped.is_none()
    }
}

struct Uploaded {
    id: u64,
    name: String,
    contents: FileContents,
    result: Result<u64, UploadError>,
}

/// The settle side: what is in flight, where the watermark is, and the checkpoint file.
struct Progress {
    cp: Checkpoint,
    path: Option<PathBuf>,
    /// (offset, line) of the first message of each file being uploaded.
    inflight: HashMap<u64, (u64, u64)>,
    /// (offset, line) of the first message of each failed file: the watermark never passes them.
    stuck: Vec<(u64, u64)>,
    /// (file id, name) of every object written, to list them in the order they were opened.
    written: Vec<(u64, String)>,
    /// (offset, line) just past the last input consumed.
    consumed: (u64, u64),
}

impl Progress {
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

/// Run the storage writer over a file source until the end of input.
pub async fn run(cfg: RunConfig) -> Result<RunSummary, RunError> {
    let storage = cfg
        .subscription
        .storage
        .clone()
        .ok_or_else(|| RunError::NotStorage(cfg.subscription.name.clone()))?;
    let source_name = cfg
        .source
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "-".into());

    // Resume: settle pending objects of a previous run by looking them up.
    let mut cp = match &cfg.checkpoint {
        Some(p) => {
            if cfg.source.path.is_none() {
                return Err(RunError::CheckpointOnStdin);
            }
            Checkpoint::load_or_new(p, &source_name)?
        }
        None => Checkpoint::new(&source_name),
    };
    for pending in std::mem::take(&mut cp.pending) {
        if upload::exists(&cfg.dest, &pending.object).await? {
            tracing::info!(object = %pending.object, "object of the previous run is durable");
            cp.committed.push(pending);
        }
    }
    let mut source_settings = cfg.source.clone();
    source_settings.start_offset = cp.offset;
    source_settings.start_line = cp.line;
    let on_bad_input = source_settings.on_bad_input;
    let mut progress = Progress {
        consumed: (cp.offset, cp.line),
        cp,
        path: cfg.checkpoint.clone(),
        inflight: HashMap::new(),
        stuck: Vec::new(),
        written: Vec::new(),
    };
    progress.save()?;

    let mut source = FileSource::open(source_settings).map_err(|source| RunError::Source {
        path: source_name.clone(),
        source,
    })?;
    let mut writer = StorageWriter::new(
        storage,
        cfg.format.clone(),
        cfg.dest.clone(),
        cfg.upload,
        Ids::new(cfg.seed),
        cfg.clock,
    );
    let uploads = Arc::new(Semaphore::new(cfg.max_concurrent_uploads.max(1)));
    let (tx, mut rx) = mpsc::unbounded_channel::<Uploaded>();
    let mut summary = RunSummary::default();
    let mut done: Vec<FinalizedFile> = Vec::new();

    'read: loop {
        let deadline = writer.next_deadline();
        tokio::select! {
            biased;
            Some(up) = rx.recv() => settle(up, &mut progress, &writer, &mut summary)?,
            _ = sleep_until(deadline), if deadline.is_some() => {
                writer.expire(Instant::now(), &mut done);
            }
            ev = source.next() => match ev {
                None => break 'read,
                Some(SourceEvent::Messages(batch)) => {
                    for r in &batch {
                        summary.messages_read += 1;
                        let group = writer.group_of(r);
                        if progress.cp.covers(group.as_deref(), r.receipt.start) {
                            summary.messages_already_written += 1;
                            progress.consumed = (r.receipt.end, r.receipt.line + 1);
                            continue;
                        }
                        match writer.push(r, group, &mut done).await {
                            Ok(()) => progress.consumed = (r.receipt.end, r.receipt.line + 1),
                            Err(WriteError::BadMessage(e)) => {
                                summary.bad_messages += 1;
                                let what = format!("{source_name}:{}: {e}", r.receipt.line);
                                tracing::error!("{what}");
                                if on_bad_input == OnBadInput::Fail {
                                    summary.stopped = Some(what);
                                    break 'read;
                                }
                                progress.consumed = (r.receipt.end, r.receipt.line + 1);
                            }
                            Err(WriteError::Upload(e)) => {
                                summary.stopped = Some(e.to_string());
                                break 'read;
                            }
                        }
                        if !done.is_empty() {
                            start_uploads(&mut done, &mut progress, &uploads, &tx).await?;
                        }
                    }
                }
                Some(SourceEvent::Bad(bad)) => {
                    summary.bad_lines += 1;
                    tracing::error!("{bad}");
                    if on_bad_input == OnBadInput::Fail {
                        summary.stopped = Some(bad.to_string());
                        break 'read;
                    }
                    progress.consumed = (bad.end, bad.line + 1);
                }
                Some(SourceEvent::Failed(e)) => {
                    summary.stopped = Some(e);
                    break 'read;
                }
            }
        }
        if !done.is_empty() {
            start_uploads(&mut done, &mut progress, &uploads, &tx).await?;
        }
    }

    // End of input (or a stop): finalize what is open, wait for every upload, settle.
    let reason = if summary.stopped.is_some() {
        FlushReason::Early
    } else {
        FlushReason::EndOfInput
    };
    writer.finalize_all(reason, &mut done);
    start_uploads(&mut done, &mut progress, &uploads, &tx).await?;
    drop(tx);
    while let Some(up) = rx.recv().await {
        settle(up, &mut progress, &writer, &mut summary)?;
    }
    progress.advance(std::iter::empty())?;
    progress.written.sort();
    summary.objects = progress.written.into_iter().map(|(_, n)| n).collect();
    Ok(summary)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn start_uploads(
    done: &mut Vec<FinalizedFile>,
    progress: &mut Progress,
    uploads: &Arc<Semaphore>,
    tx: &mpsc::UnboundedSender<Uploaded>,
) -> Result<(), RunError> {
    for f in done.drain(..) {
        if f.contents.messages == 0 {
            // Opened for a message that then failed to encode: nothing to write.
            f.sink.abort().await;
            continue;
        }
        let name = f.sink.name().to_string();
        tracing::debug!(object = %name, reason = ?f.reason, messages = f.contents.messages, "finalize");
        progress.cp.pending.push(ObjectSpan {
            object: name.clone(),
            span: f.contents.span.clone(),
        });
        progress
            .inflight
            .insert(f.id, (f.contents.span.first, f.contents.first_line));
        progress.save()?;
        let permit = uploads
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        let tx = tx.clone();
        tokio::spawn(async move {
            let result = f.sink.finish().await;
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

fn settle(
    up: Uploaded,
    progress: &mut Progress,
    writer: &StorageWriter,
    summary: &mut RunSummary,
) -> Result<(), RunError> {
    let start = progress.inflight.remove(&up.id).expect("tracked");
    let idx = progress
        .cp
        .pending
        .iter()
        .position(|p| p.object == up.name)
        .expect("pending");
    let pending = progress.cp.pending.remove(idx);
    let c = &up.contents;
    match up.result {
        Ok(bytes) => {
            tracing::info!(object = %up.name, messages = c.messages, bytes, "object written");
            summary.messages_written += c.messages;
            progress.written.push((up.id, up.name));
            progress.cp.committed.push(pending);
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
            progress.stuck.push(start);
            summary.failed_objects.push(FailedObject {
                object: up.name,
                error: e.to_string(),
                messages: c.messages,
                first_line: c.first_line,
                last_line: c.last_line,
                first_message_id: c.first_message_id.clone(),
                last_message_id: c.last_message_id.clone(),
            });
        }
    }
    progress.advance(writer.open_starts())?;
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
