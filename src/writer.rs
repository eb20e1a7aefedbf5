//! The storage writer stage: assigns messages to open files, encodes them, and hands finalized
//! files to the upload stage. One open file per group (normally one; topic-schema revisions get one
//! each, SPEC Q8).
//!
//! The life of a file: `open` (header written, name chosen from the time of its first write) →
//! messages appended (bytes stream to a multipart upload past a threshold) → `finalize` (the batcher
//! said so, or end of input) → [`FinalizedFile`], which the caller makes visible and then settles.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

use crate::batch::{Admit, FileStats, FlushReason, Limits};
use crate::checkpoint::Span;
use crate::config::StorageSettings;
use crate::encode::{EncodeError, FileEncoder, FileFormat};
use crate::ids::{Clock, Ids};
use crate::message::Received;
use crate::naming;
use crate::upload::{Destination, ObjectSink, UploadError, UploadSettings};

/// Errors of the writer stage.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// This message cannot be encoded; nothing was written for it.
    #[error(transparent)]
    BadMessage(#[from] EncodeError),
    /// This message cannot be a row of the table; the batch is unchanged.
    #[error(transparent)]
    BadRow(#[from] crate::table::RowError),
    /// The destination failed while a file was open.
    #[error(transparent)]
    Upload(#[from] UploadError),
}

/// What a file holds, for settling and for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContents {
    pub span: Span,
    pub first_line: u64,
    pub last_line: u64,
    pub first_message_id: String,
    pub last_message_id: String,
    pub messages: u64,
    /// Pulled messages: what settling them needs (empty for the file source).
    pub acks: Vec<AckRef>,
}

/// A pulled message inside a file: its ack id, and what dead-lettering it would need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckRef {
    pub ack_id: String,
    pub message_id: String,
    /// Delivery attempt this delivery is (1-based): the server's count, or subsink's own.
    pub attempt: u32,
    /// The message itself, kept only when a failure of this delivery would dead-letter it.
    pub kept: Option<crate::message::Message>,
}

/// Where a finalized file's contents go to become durable.
pub enum FileSink {
    /// An object of the storage writer: every byte is in the sink, still to be made visible.
    Object(Box<ObjectSink>),
    /// A batch of rows of the table writer, still to be written as Parquet and committed.
    Table(Box<crate::table::writer::TableCommit>),
}

impl FileSink {
    /// Object name, or data file path relative to the table root.
    pub fn name(&self) -> &str {
        match self {
            FileSink::Object(s) => s.name(),
            FileSink::Table(t) => t.name(),
        }
    }

    /// Make it durable (visible object, committed table version); returns the bytes written.
    pub async fn finish(self) -> Result<u64, UploadError> {
        match self {
            FileSink::Object(s) => (*s).finish().await,
            FileSink::Table(t) => (*t).finish().await,
        }
    }

    /// Give up on it (nothing partial stays visible).
    pub async fn abort(self) {
        match self {
            FileSink::Object(s) => (*s).abort().await,
            FileSink::Table(_) => {}
        }
    }
}

/// A finalized file: every byte is in `sink`, which still has to be made visible.
pub struct FinalizedFile {
    pub sink: FileSink,
    pub contents: FileContents,
    pub reason: FlushReason,
    /// Identifies the file while it is open or uploading.
    pub id: u64,
}

struct OpenFile {
    id: u64,
    encoder: Box<dyn FileEncoder>,
    sink: ObjectSink,
    stats: FileStats,
    opened_at: Instant,
    contents: FileContents,
}

/// The storage writer stage.
pub struct StorageWriter {
    settings: StorageSettings,
    limits: Limits,
    format: Arc<dyn FileFormat>,
    dest: Destination,
    upload: UploadSettings,
    ids: Ids,
    clock: Clock,
    open: HashMap<Option<String>, OpenFile>,
    scratch: Vec<u8>,
    next_id: u64,
}

impl StorageWriter {
    pub fn new(
        settings: StorageSettings,
        format: Arc<dyn FileFormat>,
        dest: Destination,
        upload: UploadSettings,
        ids: Ids,
        clock: Clock,
    ) -> StorageWriter {
        let limits = Limits {
            max_duration: settings.max_duration,
            max_bytes: settings.max_bytes,
            max_messages: settings.max_messages,
        };
        StorageWriter {
            settings,
            limits,
            format,
            dest,
            upload,
            ids,
            clock,
            open: HashMap::new(),
            scratch: Vec::with_capacity(4096),
            next_id: 0,
        }
    }

    /// The bucket objects go to.
    pub fn dest(&self) -> &Destination {
        &self.dest
    }

    /// The group a message belongs to (see [`FileFormat::group_key`]).
    pub fn group_of(&self, r: &Received) -> Option<String> {
        self.format.group_key(&r.msg)
    }

    /// Byte offsets and lines of the first message of every open file (for the checkpoint watermark).
    pub fn open_starts(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.open
            .values()
            .map(|f| (f.contents.span.first, f.contents.first_line))
    }

    /// Append one message; files the batcher finalizes are pushed to `done`. `ack` says how a
    /// pulled message is settled (`None` for the file source).
    pub async fn push(
        &mut self,
        r: &Received,
        group: Option<String>,
        ack: Option<AckRef>,
        done: &mut Vec<FinalizedFile>,
    ) -> Result<(), WriteError> {
        if !self.open.contains_key(&group) {
            let f = self.open_file(group.clone())?;
            self.open.insert(group.clone(), f);
        }
        let file = self.open.get_mut(&group).expect("opened above");
        let len = file.encoder.encode_tentative(&r.msg, &mut file.sink.buf)? as u64;
        let file = match self.limits.admit(file.stats, len) {
            Admit::Append => {
                file.encoder.commit(&mut file.sink.buf);
                file
            }
            Admit::FinalizeFirst(reason) => {
                // Rare: take the datum back out, finalize, and append it to a fresh file.
                file.encoder.rollback(&mut file.sink.buf, &mut self.scratch);
                let full = self.open.remove(&group).expect("present");
                done.push(finalize(full, reason));
                let f = self.open_file(group.clone())?;
                self.open.insert(group.clone(), f);
                let file = self.open.get_mut(&group).expect("present");
                file.encoder.append(&self.scratch, &mut file.sink.buf);
                file
            }
        };
        file.stats.bytes += len;
        file.stats.messages += 1;
        let c = &mut file.contents;
        if c.messages == 0 {
            c.span.first = r.receipt.start;
            c.first_line = r.receipt.line;
            c.first_message_id.clone_from(&r.msg.message_id);
        }
        c.span.last = r.receipt.start;
        c.last_line = r.receipt.line;
        c.last_message_id.clone_from(&r.msg.message_id);
        c.messages += 1;
        if let Some(ack) = ack {
            c.acks.push(ack);
        }
        file.sink.maybe_stream().await?;
        if let Some(reason) = self.limits.full(file.stats) {
            let full = self.open.remove(&group).expect("present");
            done.push(finalize(full, reason));
        }
        Ok(())
    }

    /// Ack ids of the messages in open files (their leases must be kept alive).
    pub fn open_ack_ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.open
            .values()
            .flat_map(|f| f.contents.acks.iter().map(|a| a.ack_id.as_str()))
    }

    /// When the oldest open file reaches `max_duration`.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.open
            .values()
            .map(|f| f.opened_at + self.limits.max_duration)
            .min()
    }

    /// Finalize every open file whose `max_duration` has passed at `now`.
    pub fn expire(&mut self, now: Instant, done: &mut Vec<FinalizedFile>) {
        let max = self.limits.max_duration;
        let due: Vec<Option<String>> = self
            .open
            .iter()
            .filter(|(_, f)| f.opened_at + max <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            let f = self.open.remove(&k).expect("present");
            done.push(finalize(f, FlushReason::MaxDuration));
        }
    }

    /// Finalize every open file (end of input, shutdown).
    pub fn finalize_all(&mut self, reason: FlushReason, done: &mut Vec<FinalizedFile>) {
        let mut files: Vec<OpenFile> = self.open.drain().map(|(_, f)| f).collect();
        files.sort_by_key(|f| f.id);
        done.extend(files.into_iter().map(|f| finalize(f, reason)));
    }

    fn open_file(&mut self, group: Option<String>) -> Result<OpenFile, WriteError> {
        let uuid = self.ids.uuid();
        let sync = self.ids.sync_marker();
        let name = naming::object_name(
            &self.settings.filename_prefix,
            &self.settings.datetime_format,
            self.clock.now(),
            &uuid,
            &self.settings.filename_suffix,
        );
        let mut encoder = self.format.new_file(sync, group.as_deref())?;
        let mut sink = ObjectSink::new(&self.dest, &name, self.format.content_type(), self.upload)?;
        encoder.header(&mut sink.buf);
        let stats = FileStats {
            bytes: sink.len(),
            messages: 0,
        };
        self.next_id += 1;
        Ok(OpenFile {
            id: self.next_id,
            encoder,
            sink,
            stats,
            opened_at: Instant::now(),
            contents: FileContents {
                span: Span {
                    group,
                    first: 0,
                    last: 0,
                },
                first_line: 0,
                last_line: 0,
                first_message_id: String::new(),
                last_message_id: String::new(),
                messages: 0,
                acks: Vec::new(),
            },
        })
    }
}

fn finalize(mut f: OpenFile, reason: FlushReason) -> FinalizedFile {
    f.encoder.finish(&mut f.sink.buf);
    FinalizedFile {
        sink: FileSink::Object(Box::new(f.sink)),
        contents: f.contents,
        reason,
        id: f.id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::text::TextFormat;
    use crate::message::{Message, Receipt};
    use crate::naming::DatetimeFormat;
    use proptest::prelude::*;
    use std::time::Duration;

    fn settings(max_bytes: Option<u64>, max_messages: Option<u64>) -> StorageSettings {
        StorageSettings {
            bucket: "b".into(),
            filename_prefix: "p/".into(),
            filename_suffix: ".txt".into(),
            datetime_format: DatetimeFormat::default(),
            max_duration: Duration::from_secs(60),
            max_bytes,
            max_messages,
            output: crate::config::OutputFormat::Text,
        }
    }

    /// The real writer, on the in-memory store: every file it finalizes is made visible, then the
    /// objects are read back.
    async fn write_all(
        sizes: &[usize],
        max_bytes: Option<u64>,
        max_messages: Option<u64>,
    ) -> Vec<Vec<u8>> {
        let dest = Destination::from_url("memory://").unwrap();
        let mut w = StorageWriter::new(
            settings(max_bytes, max_messages),
            Arc::new(TextFormat),
            dest.clone(),
            UploadSettings {
                multipart_threshold: 64,
                part_size: 64,
                ..UploadSettings::default()
            },
            Ids::new(Some(1)),
            Clock::default(),
        );
        let mut done = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            // Payload: the message number, padded to `n` bytes (no newline inside).
            let mut data = format!("{i}:").into_bytes();
            data.resize(n.max(data.len()), b'.');
            let r = Received {
                msg: Message {
                    data: data.into(),
                    message_id: i.to_string(),
                    ..Default::default()
                },
                receipt: Receipt::default(),
            };
            w.push(&r, None, None, &mut done).await.unwrap();
        }
        w.finalize_all(FlushReason::EndOfInput, &mut done);
        let mut objects = Vec::new();
        for f in done {
            let name = f.sink.name().to_string();
            let len = f.sink.finish().await.unwrap();
            let got = {
                use object_store::ObjectStoreExt;
                let p = object_store::path::Path::parse(&name).unwrap();
                dest.store
                    .get(&p)
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
                    .to_vec()
            };
            assert_eq!(got.len() as u64, len);
            objects.push(got);
        }
        objects
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The writer itself (not a model of it): no message lost, duplicated or reordered, every
        /// file within max_messages, and within max_bytes unless it holds one oversize message.
        #[test]
        fn writer_keeps_order_and_limits(
            sizes in prop::collection::vec(1usize..300, 0..120),
            max_bytes in prop::option::of(20u64..1000),
            max_messages in prop::option::of(1u64..20),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let objects = rt.block_on(write_all(&sizes, max_bytes, max_messages));
            let mut next = 0usize;
            for o in &objects {
                prop_assert!(!o.is_empty(), "no empty objects");
                let lines: Vec<&[u8]> = o.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
                if let Some(m) = max_messages {
                    prop_assert!(lines.len() as u64 <= m);
                }
                if let Some(b) = max_bytes {
                    prop_assert!(o.len() as u64 <= b || lines.len() == 1, "{} bytes, {} messages", o.len(), lines.len());
                }
                for l in lines {
                    let id: usize = std::str::from_utf8(l).unwrap().split(':').next().unwrap().parse().unwrap();
                    prop_assert_eq!(id, next, "lost, duplicated or reordered");
                    next += 1;
                }
            }
            prop_assert_eq!(next, sizes.len());
        }
    }
}
