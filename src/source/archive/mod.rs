//! Archives as a source: the objects an export wrote (`--source s3://bucket/prefix/`, `gs://`,
//! `az://`, `file:///dir`), read back as the messages they hold (docs/replay.md).
//!
//! The objects under the URL are listed once, in name order. An object is read when its name is
//! an export name ([`names`]; `--archive-subscription` narrows this to that subscription's rule and
//! output settings) and its datetime lies in `--from`/`--to`; every other object is skipped,
//! named in the log and counted in the summary. Its format is told from its content: an Avro
//! container (`Obj\x01`, the layout from its writer schema, [`decode`]) or else Text.
//!
//! A reader thread streams one object at a time from the store — an Avro object one block at a
//! time ([`container`]), a Text object one line at a time — so memory holds at most a block and
//! the batches in the bounded channel, whatever the object's size.
//!
//! Record numbers ([`record_number`]): a record's receipt `start` is `object ordinal << 32 |
//! record index` (the ordinal in the listing, the index from 0), so the file source's checkpoint
//! ([`crate::checkpoint_file`]) keeps (object, record) progress unchanged. With `--checkpoint`, the listing is kept beside the
//! checkpoint (`<checkpoint>.objects.json`) and a rerun reads that listing, so ordinals stay put
//! even if objects were added since.

pub mod build;
pub mod container;
pub mod decode;
pub mod flags;
pub mod names;
pub mod settle;

pub use self::flags::{parse_time, ArchiveArgs, ArchiveFlagsError, ArchiveSpec};

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use self::container::{Broken, Container};
use self::decode::{read_datum, Layout};
use self::names::NameRule;
use crate::avro::SchemaEncoding;
use crate::config::OutputFormat;
use crate::input::{BadLine, Source, SourceEvent};
use crate::message::{Message, Receipt, Received, WireError};
use crate::source::file::OnBadInput;
use crate::summary::RunSummary;
use crate::telemetry::metrics::{ArchiveCounts, SubscriptionMetrics};
use crate::telemetry::progress::Progress;
use crate::upload::Destination;

/// Records per batch handed to the pipeline.
const BATCH: usize = 1000;
/// Batches buffered between the reader thread and the pipeline.
const CHANNEL: usize = 8;
/// Read buffer of a streamed object.
const READ_BUFFER: usize = 256 << 10;

/// The record number of record `record` of the object at `ordinal` in the listing: what a
/// receipt's `start` and the checkpoint hold (`ordinal << 32 | record`).
pub fn record_number(ordinal: usize, record: u64) -> u64 {
    ((ordinal as u64) << 32) | record
}

/// `(ordinal, record)` of a [`record_number`].
pub fn split_record_number(p: u64) -> (usize, u64) {
    ((p >> 32) as usize, p & 0xffff_ffff)
}

/// Settings of the archive source.
#[derive(Debug, Clone)]
pub struct ArchiveSettings {
    /// The archive's URL, as given.
    pub url: String,
    pub rule: NameRule,
    /// `--archive-subscription`: its output settings (an object written otherwise is skipped).
    pub output: Option<OutputFormat>,
    /// Names whose datetime is at or after `from` and before `to`.
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub on_bad_input: OnBadInput,
    /// Payload encoding of topic-schema records without a `googclient_schemaencoding` attribute.
    pub schema_encoding: SchemaEncoding,
    /// Where the listing is kept for a rerun (beside the checkpoint).
    pub listing: Option<PathBuf>,
    /// Where reading starts (a [`record_number`], from the checkpoint).
    pub start: u64,
    pub progress: bool,
}

/// What the archive source counted; shared with its settle side, which puts it in the summary.
#[derive(Debug, Default)]
pub struct ArchiveStats {
    pub objects_listed: AtomicU64,
    pub objects_read: AtomicU64,
    pub objects_skipped: AtomicU64,
    pub objects_broken: AtomicU64,
    pub bytes_read: AtomicU64,
}

impl ArchiveStats {
    /// The counts now (metrics, the summary).
    pub fn counts(&self) -> ArchiveCounts {
        ArchiveCounts {
            objects_listed: self.objects_listed.load(Ordering::Relaxed),
            objects_read: self.objects_read.load(Ordering::Relaxed),
            objects_skipped: self.objects_skipped.load(Ordering::Relaxed),
            objects_broken: self.objects_broken.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
        }
    }
}

/// One listed object.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Listed {
    /// Path relative to the archive URL (what the store is asked for).
    path: String,
    /// The object's key in its bucket (what names and ids use).
    key: String,
    size: u64,
}

/// Why the archive could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("--source {url}: {reason}")]
    Store { url: String, reason: String },
    #[error("{path}: {reason}")]
    Listing { path: String, reason: String },
}

/// The archive source.
pub struct ArchiveSource {
    rx: mpsc::Receiver<SourceEvent>,
    stats: Arc<ArchiveStats>,
    name: String,
    stopped: bool,
    on_bad_input: OnBadInput,
}

impl ArchiveSource {
    /// List the archive (or read the listing kept by a previous run) and start reading.
    pub async fn open(
        settings: ArchiveSettings,
        stats: Arc<ArchiveStats>,
    ) -> Result<ArchiveSource, ArchiveError> {
        let store_err = |reason: String| ArchiveError::Store {
            url: settings.url.clone(),
            reason,
        };
        let dest = Destination::from_url(&settings.url).map_err(|e| store_err(e.to_string()))?;
        let listed = match kept_listing(&settings)? {
            Some(l) => l,
            None => {
                let l = list(&dest.store, &settings.url).await.map_err(store_err)?;
                keep_listing(&settings, &l)?;
                l
            }
        };
        stats
            .objects_listed
            .store(listed.len() as u64, Ordering::Relaxed);
        let (start_ordinal, _) = split_record_number(settings.start);
        let taken = choose(&settings, &listed, start_ordinal, &stats);
        let total: u64 = taken.iter().map(|(_, o, _)| o.size).sum();
        tracing::info!(
            url = %settings.url,
            listed = listed.len(),
            to_read = taken.len(),
            bytes = total,
            "archive listed"
        );
        let progress = if settings.progress {
            Progress::for_archive(total, taken.len() as u64)
        } else {
            None
        };
        let (tx, rx) = mpsc::channel(CHANNEL);
        let reader = Reader {
            store: dest.store,
            settings: settings.clone(),
            stats: Arc::clone(&stats),
            tx,
            rt: tokio::runtime::Handle::current(),
            progress,
        };
        std::thread::Builder::new()
            .name("subsink-archive".into())
            .spawn(move || reader.run(taken))
            .map_err(|e| store_err(e.to_string()))?;
        Ok(ArchiveSource {
            rx,
            stats,
            name: settings.url,
            stopped: false,
            on_bad_input: settings.on_bad_input,
        })
    }
}

#[async_trait::async_trait]
impl Source for ArchiveSource {
    async fn next(&mut self) -> Option<SourceEvent> {
        if self.stopped {
            return None;
        }
        let ev = self.rx.recv().await?;
        self.stopped = match &ev {
            SourceEvent::Bad(_) => self.on_bad_input == OnBadInput::Fail,
            SourceEvent::Failed(_) => true,
            SourceEvent::Messages(_) => false,
        };
        Some(ev)
    }

    fn describe(&self) -> &str {
        &self.name
    }

    /// What it counted so far: objects listed, read, skipped.
    fn report(&mut self, metrics: &SubscriptionMetrics, _summary: &mut RunSummary) {
        metrics.archive(&self.stats.counts());
    }
}

/// The prefix of keys under `url` in its bucket (`s3://b/events/` → `events/`); none for a
/// `file://` folder, whose keys are relative to it.
fn key_prefix(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) if u.scheme() != "file" => {
            let p = u.path().trim_matches('/');
            if p.is_empty() {
                String::new()
            } else {
                format!("{p}/")
            }
        }
        _ => String::new(),
    }
}

async fn list(store: &Arc<dyn ObjectStore>, url: &str) -> Result<Vec<Listed>, String> {
    let prefix = key_prefix(url);
    let metas: Vec<object_store::ObjectMeta> = store
        .list(None)
        .try_collect()
        .await
        .map_err(|e| format!("cannot list: {e}"))?;
    let mut listed: Vec<Listed> = metas
        .into_iter()
        .map(|m| Listed {
            key: format!("{prefix}{}", m.location),
            path: m.location.to_string(),
            size: m.size,
        })
        .collect();
    listed.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(listed)
}

/// The objects of `listed` to read from `start_ordinal` on: named like an export, in the time
/// range. The others are skipped, named in the log and counted; a warning says why when none is
/// taken from the start.
fn choose(
    settings: &ArchiveSettings,
    listed: &[Listed],
    start_ordinal: usize,
    stats: &ArchiveStats,
) -> Vec<(usize, Listed, DateTime<Utc>)> {
    let mut taken = Vec::new();
    // Why objects were not taken, counted for the warning when none is: hidden, misnamed,
    // out of --from/--to.
    let (mut hidden, mut misnamed, mut out_of_range) = (0usize, 0usize, 0usize);
    let mut example = None;
    for (ordinal, o) in listed.iter().enumerate() {
        let why_not = if o.key.split('/').any(|s| s.starts_with('.')) {
            Err("a hidden name".to_string())
        } else {
            settings.rule.datetime(&o.key).and_then(|t| {
                if settings.from.is_some_and(|f| t < f) || settings.to.is_some_and(|to| t >= to) {
                    Err(format!(
                        "its datetime {} is outside --from/--to",
                        t.to_rfc3339()
                    ))
                } else {
                    Ok(t)
                }
            })
        };
        match why_not {
            Ok(t) => {
                if ordinal >= start_ordinal {
                    taken.push((ordinal, o.clone(), t));
                }
            }
            Err(reason) => {
                if reason == "a hidden name" {
                    hidden += 1;
                } else if reason.contains("outside --from/--to") {
                    out_of_range += 1;
                } else {
                    misnamed += 1;
                    example.get_or_insert_with(|| format!("{}: {reason}", o.key));
                }
                tracing::info!(object = %o.key, "archive: skipped, not an export object: {reason}");
                stats.objects_skipped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if taken.is_empty() && start_ordinal == 0 {
        let why = if listed.is_empty() {
            "no object is under it: check the bucket and the prefix".to_string()
        } else {
            let mut parts = Vec::new();
            if misnamed > 0 {
                parts.push(format!(
                    "{misnamed} not named as this subscription's export names its objects (prefix, datetime format, suffix; --archive-subscription gives the exporting subscription), e.g. {}",
                    example.as_deref().unwrap_or("?")
                ));
            }
            if out_of_range > 0 {
                parts.push(format!("{out_of_range} outside --from/--to"));
            }
            if hidden > 0 {
                parts.push(format!(
                    "{hidden} with a hidden name (a part starting with `.`)"
                ));
            }
            format!(
                "{} objects listed, none to replay: {}",
                listed.len(),
                parts.join("; ")
            )
        };
        tracing::warn!(url = %settings.url, "archive replay matches no object: {why}");
    }
    taken
}

fn kept_listing(s: &ArchiveSettings) -> Result<Option<Vec<Listed>>, ArchiveError> {
    let Some(path) = &s.listing else {
        return Ok(None);
    };
    let err = |reason: String| ArchiveError::Listing {
        path: path.display().to_string(),
        reason,
    };
    match std::fs::read(path) {
        Ok(text) => serde_json::from_slice(&text)
            .map(Some)
            .map_err(|e| err(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(err(e.to_string())),
    }
}

fn keep_listing(s: &ArchiveSettings, listed: &[Listed]) -> Result<(), ArchiveError> {
    let Some(path) = &s.listing else {
        return Ok(());
    };
    let err = |reason: String| ArchiveError::Listing {
        path: path.display().to_string(),
        reason,
    };
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_vec(listed).expect("serializable");
    std::fs::write(&tmp, text).map_err(|e| err(e.to_string()))?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| err(e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
}

/// An object's bytes as a blocking reader, fetched as a stream (never whole).
struct StreamRead {
    body: Body,
    /// Bytes of this object read so far.
    read: Arc<AtomicU64>,
    /// Counts every byte read, as it is read (metrics).
    stats: Arc<ArchiveStats>,
}

/// Where an object's bytes come from.
enum Body {
    /// A local file (`file://`): read straight from it on the reader thread. object_store's
    /// stream of a local file hands over 8 KiB chunks, each read on the blocking pool: two thread
    /// wake-ups per 8 KiB, which cost more than decoding the records (a third of the replay's
    /// time on the bench).
    File(std::io::Take<std::fs::File>),
    /// Any other store: its stream of chunks.
    Stream {
        rt: tokio::runtime::Handle,
        stream: BoxStream<'static, object_store::Result<Bytes>>,
        cur: Bytes,
    },
}

impl StreamRead {
    fn new(
        got: object_store::GetResult,
        rt: &tokio::runtime::Handle,
        read: &Arc<AtomicU64>,
        stats: &Arc<ArchiveStats>,
    ) -> std::io::Result<StreamRead> {
        let range = got.range.clone();
        let body = match got.payload {
            object_store::GetResultPayload::File(mut file, _) => {
                use std::io::{Seek, SeekFrom};
                file.seek(SeekFrom::Start(range.start))?;
                Body::File(file.take(range.end - range.start))
            }
            object_store::GetResultPayload::Stream(stream) => Body::Stream {
                rt: rt.clone(),
                stream,
                cur: Bytes::new(),
            },
        };
        Ok(StreamRead {
            body,
            read: Arc::clone(read),
            stats: Arc::clone(stats),
        })
    }
}

impl Read for StreamRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = match &mut self.body {
            Body::File(file) => file.read(buf)?,
            Body::Stream { rt, stream, cur } => {
                while cur.is_empty() {
                    match rt.block_on(stream.next()) {
                        None => return Ok(0),
                        Some(Ok(b)) => *cur = b,
                        Some(Err(e)) => return Err(std::io::Error::other(e.to_string())),
                    }
                }
                let n = buf.len().min(cur.len());
                buf[..n].copy_from_slice(&cur[..n]);
                let _ = cur.split_to(n);
                n
            }
        };
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        self.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// The reader thread.
struct Reader {
    store: Arc<dyn ObjectStore>,
    settings: ArchiveSettings,
    stats: Arc<ArchiveStats>,
    tx: mpsc::Sender<SourceEvent>,
    rt: tokio::runtime::Handle,
    progress: Option<Progress>,
}

/// How one object ended.
enum Ended {
    /// Read to its end (or skipped whole).
    Done,
    /// Broken: reported; under `skip` go on with the next object.
    Broken,
    /// The pipeline is gone, or the store failed: stop.
    Stop,
}

impl Reader {
    fn run(self, taken: Vec<(usize, Listed, DateTime<Utc>)>) {
        let (start_ordinal, start_record) = split_record_number(self.settings.start);
        let mut done_bytes = 0u64;
        for (i, (ordinal, o, t)) in taken.iter().enumerate() {
            let skip_below = if *ordinal == start_ordinal {
                start_record
            } else {
                0
            };
            let read = Arc::new(AtomicU64::new(0));
            match self.object(*ordinal, o, *t, skip_below, &read, done_bytes) {
                Ended::Done => {}
                Ended::Broken => {
                    self.stats.objects_broken.fetch_add(1, Ordering::Relaxed);
                    if self.settings.on_bad_input == OnBadInput::Fail {
                        return;
                    }
                }
                Ended::Stop => return,
            }
            done_bytes += o.size;
            if let Some(p) = &self.progress {
                p.object_done(i as u64 + 1, done_bytes);
            }
        }
        if let Some(p) = &self.progress {
            p.finish();
        }
    }

    fn send(&self, ev: SourceEvent) -> bool {
        self.tx.blocking_send(ev).is_ok()
    }

    fn skipped(&self, o: &Listed, reason: &str) -> Ended {
        tracing::info!(object = %o.key, "archive: skipped: {reason}");
        self.stats.objects_skipped.fetch_add(1, Ordering::Relaxed);
        Ended::Done
    }

    fn broken(&self, ordinal: usize, o: &Listed, b: Broken) -> Ended {
        let bad = BadLine {
            file: o.key.clone(),
            line: b.record,
            start: record_number(ordinal, b.record),
            end: record_number(ordinal + 1, 0),
            error: WireError::Archive(b.reason),
        };
        tracing::error!("archive: {bad}");
        if self.send(SourceEvent::Bad(bad)) {
            Ended::Broken
        } else {
            Ended::Stop
        }
    }

    fn object(
        &self,
        ordinal: usize,
        o: &Listed,
        t: DateTime<Utc>,
        skip_below: u64,
        read: &Arc<AtomicU64>,
        done_bytes: u64,
    ) -> Ended {
        let path = match ObjectPath::parse(&o.path) {
            Ok(p) => p,
            Err(e) => return self.skipped(o, &format!("not a valid object path: {e}")),
        };
        let body = match self.rt.block_on(self.store.get(&path)) {
            Ok(got) => StreamRead::new(got, &self.rt, read, &self.stats),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        };
        let body = match body {
            Ok(b) => b,
            Err(e) => {
                let _ = self.send(SourceEvent::Failed(format!("{}: cannot read: {e}", o.key)));
                return Ended::Stop;
            }
        };
        let mut input = BufReader::with_capacity(READ_BUFFER, body);
        let head = match input.fill_buf() {
            Ok(b) => b.get(..4).map(|h| h == b"Obj\x01").unwrap_or(false),
            Err(e) => {
                let _ = self.send(SourceEvent::Failed(format!("{}: cannot read: {e}", o.key)));
                return Ended::Stop;
            }
        };
        let one = OneObject {
            reader: self,
            ordinal,
            o,
            t,
            skip_below,
            read,
            done_bytes,
            batch: Vec::with_capacity(BATCH),
        };
        if head {
            one.avro(input)
        } else {
            one.text(input)
        }
    }
}

/// One object being read: where it is in the listing, where reading starts in it, and the batch
/// of its records not yet handed out.
struct OneObject<'a> {
    reader: &'a Reader,
    ordinal: usize,
    o: &'a Listed,
    /// The datetime in its name (the publish time of records that carry none).
    t: DateTime<Utc>,
    /// Records below this index were settled by a previous run: read past, not handed out.
    skip_below: u64,
    /// Bytes of this object read so far, and of the objects before it (progress).
    read: &'a Arc<AtomicU64>,
    done_bytes: u64,
    batch: Vec<Received>,
}

impl OneObject<'_> {
    /// The message id and publish time of record `record`, for records that carry none.
    fn derive(&self, record: u64) -> (String, i64) {
        (
            format!("{}#{record}", self.o.key),
            self.t.timestamp_micros(),
        )
    }

    /// Hand out the batch; false when the pipeline is gone.
    fn flush(&mut self) -> bool {
        if self.batch.is_empty() {
            return true;
        }
        if let Some(p) = &self.reader.progress {
            p.advance(
                self.batch.len() as u64,
                self.done_bytes + self.read.load(Ordering::Relaxed),
            );
        }
        self.reader
            .send(SourceEvent::Messages(std::mem::take(&mut self.batch)))
    }

    /// Hand out the batch, then report the object broken.
    fn flush_broken(&mut self, b: Broken) -> Ended {
        if !self.flush() {
            return Ended::Stop;
        }
        self.reader.broken(self.ordinal, self.o, b)
    }

    /// Read a Text object, one line at a time.
    fn text(mut self, mut input: BufReader<StreamRead>) -> Ended {
        let reader = self.reader;
        if let Some(OutputFormat::Avro { .. }) = reader.settings.output {
            return reader.skipped(
                self.o,
                "a Text object, but the archive subscription writes Avro",
            );
        }
        reader.stats.objects_read.fetch_add(1, Ordering::Relaxed);
        let mut record = 0u64;
        let mut line = Vec::new();
        loop {
            line.clear();
            match input.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    let _ = reader.send(SourceEvent::Failed(format!(
                        "{}: record {record}: cannot read: {e}",
                        self.o.key
                    )));
                    return Ended::Stop;
                }
            }
            if line.last() != Some(&b'\n') {
                return self.flush_broken(Broken {
                    record,
                    reason: "the last line has no newline: the Text object is truncated".into(),
                });
            }
            if record >= self.skip_below {
                line.pop();
                let (message_id, publish_time_micros) = self.derive(record);
                let msg = Message {
                    data: Bytes::copy_from_slice(&line),
                    message_id,
                    publish_time_micros,
                    ..Message::default()
                };
                self.batch.push(received(msg, self.ordinal, record));
                if self.batch.len() >= BATCH && !self.flush() {
                    return Ended::Stop;
                }
            }
            record += 1;
        }
        if self.flush() {
            Ended::Done
        } else {
            Ended::Stop
        }
    }

    /// Read an Avro container, one block at a time.
    fn avro(mut self, mut input: BufReader<StreamRead>) -> Ended {
        let reader = self.reader;
        input.consume(4);
        let mut c = match Container::open(input) {
            Ok(c) => c,
            Err(b) => return reader.broken(self.ordinal, self.o, b),
        };
        let layout = match Layout::of_schema(&c.header.schema) {
            Ok(l) => l,
            Err(reason) => {
                return reader.broken(self.ordinal, self.o, Broken { record: 0, reason })
            }
        };
        if let Some(skipped) = self.other_output(&layout) {
            return skipped;
        }
        reader.stats.objects_read.fetch_add(1, Ordering::Relaxed);
        loop {
            let block = match c.next_block(self.skip_below) {
                Ok(Some(b)) => b,
                Ok(None) => break,
                Err(b) => return self.flush_broken(b),
            };
            let mut data = block.data;
            let mut failed = None;
            for i in 0..block.count {
                let record = block.first + i;
                let got = read_datum(&layout, &mut data, reader.settings.schema_encoding, || {
                    self.derive(record)
                });
                match got {
                    Ok(m) if record >= self.skip_below => {
                        self.batch.push(received(m, self.ordinal, record))
                    }
                    Ok(_) => {}
                    Err(reason) => {
                        failed = Some(Broken { record, reason });
                        break;
                    }
                }
            }
            if failed.is_none() && !data.is_empty() {
                failed = Some(Broken {
                    record: block.first + block.count,
                    reason: format!(
                        "{} bytes left in the block after its {} records (corrupt)",
                        data.len(),
                        block.count
                    ),
                });
            }
            if !self.flush() {
                return Ended::Stop;
            }
            if let Some(b) = failed {
                return reader.broken(self.ordinal, self.o, b);
            }
        }
        Ended::Done
    }

    /// `Some(skipped)` when `--archive-subscription` writes otherwise than this Avro object.
    fn other_output(&self, layout: &Layout) -> Option<Ended> {
        let reader = self.reader;
        match reader.settings.output {
            Some(OutputFormat::Text) => Some(reader.skipped(
                self.o,
                "an Avro object, but the archive subscription writes Text",
            )),
            Some(OutputFormat::Avro {
                write_metadata,
                use_topic_schema,
            }) if (write_metadata, use_topic_schema) != layout.settings() => Some(reader.skipped(
                self.o,
                &format!(
                    "{}, but the archive subscription writes writeMetadata={write_metadata} useTopicSchema={use_topic_schema}",
                    layout.name()
                ),
            )),
            _ => None,
        }
    }
}

/// Record `record` of the object at `ordinal`, as received.
fn received(msg: Message, ordinal: usize, record: u64) -> Received {
    Received {
        msg,
        receipt: Receipt {
            start: record_number(ordinal, record),
            end: record_number(ordinal, record) + 1,
            line: record,
            ack_id: None,
            delivery_attempt: None,
            position: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::container::Container;
    use super::decode::{read_datum, Layout};
    use super::*;
    use crate::encode::avro::testutil::write_file;
    use crate::encode::avro::{AvroFormat, AvroLayout, Codec};

    fn messages() -> Vec<Message> {
        (0..500)
            .map(|i| {
                let mut m = Message {
                    data: Bytes::from(format!("payload {i} {}", "x".repeat(i % 50))),
                    message_id: format!("id-{i}"),
                    publish_time_micros: 1_700_000_000_000_000 + i as i64,
                    ..Message::default()
                };
                m.attributes.insert("k".into(), format!("v{i}"));
                if i % 3 == 0 {
                    m.ordering_key = format!("key-{}", i % 4);
                }
                m
            })
            .collect()
    }

    /// Every codec, both layouts without a topic schema: what the writer wrote comes back.
    #[test]
    fn containers_read_back_block_by_block_for_every_codec() {
        let msgs = messages();
        for codec in Codec::ALL {
            for metadata in [false, true] {
                let layout = if metadata {
                    AvroLayout::WithMetadata
                } else {
                    AvroLayout::Plain
                };
                let format =
                    AvroFormat::new(layout, "projects/p/subscriptions/s".into(), codec, 1024)
                        .unwrap();
                let (bytes, _) = write_file(&format, &msgs);
                let mut c = Container::open(&bytes[4..]).unwrap();
                let layout = Layout::of_schema(&c.header.schema).unwrap();
                assert_eq!(layout.settings(), (metadata, false));
                let mut got = Vec::new();
                while let Some(b) = c.next_block(0).unwrap() {
                    let mut data = b.data;
                    for i in 0..b.count {
                        let n = b.first + i;
                        got.push(
                            read_datum(&layout, &mut data, SchemaEncoding::Json, || {
                                (format!("derived-{n}"), 7)
                            })
                            .unwrap(),
                        );
                    }
                    assert!(data.is_empty());
                }
                assert_eq!(got.len(), msgs.len(), "{codec}");
                for (i, (g, m)) in got.iter().zip(&msgs).enumerate() {
                    if metadata {
                        assert_eq!(g, m, "{codec}");
                    } else {
                        assert_eq!(g.data, m.data);
                        assert_eq!(g.message_id, format!("derived-{i}"));
                        assert_eq!(g.publish_time_micros, 7);
                    }
                }
                // Skipping passes whole blocks unread; a cut object breaks at a record index.
                let mut c = Container::open(&bytes[4..]).unwrap();
                let first = c.next_block(300).unwrap().unwrap().first;
                assert!(first <= 300 && first > 0, "{first}");
                let cut = &bytes[4..bytes.len() - 10];
                let mut c = Container::open(cut).unwrap();
                let mut n = 0;
                let err = loop {
                    match c.next_block(0) {
                        Ok(Some(b)) => n += b.count,
                        Ok(None) => panic!("a cut object read to its end"),
                        Err(e) => break e,
                    }
                };
                assert_eq!(err.record, n);
                assert!(err.reason.contains("truncated"), "{err}");
            }
        }
    }

    #[test]
    fn positions_keep_object_and_record() {
        assert_eq!(split_record_number(record_number(7, 12345)), (7, 12345));
        assert!(record_number(1, 0) > record_number(0, u32::MAX as u64));
    }
}
