//! The object sink: a Cloud Storage subscription's files, written as objects through `object_store`
//! (docs/contract.md §3).
//!
//! A file is named when it is opened (`<prefix><datetime>_<uuid><suffix>`, §3.3; with
//! `subsink.paths`, the message's partition directory goes after the prefix's directory,
//! [`crate::paths`], and each directory has its own open file), its header is
//! written, messages are encoded into it (Text or Avro, [`crate::encode`]); past the multipart
//! threshold its bytes stream to a multipart upload ([`crate::upload::ObjectUpload`]), and closing it
//! writes the last block. Made durable = a single put, or the multipart upload completed: only whole
//! objects become visible.

pub mod register;

use std::sync::Arc;

use super::order::{Chained, Chains};
use super::{Durable, PushError, Sink, SinkError, SinkFile, Unstaged};
use crate::batch::Limits;
use crate::config::{StorageSettings, ValidSubscription};
use crate::encode::{FileEncoder, FileFormat};
use crate::ids::{Clock, Ids};
use crate::message::{Message, Received};
use crate::naming;
use crate::paths;
use crate::position::{DurableStreams, Position, StreamKey, Streams};
use crate::receipt::{Refusal, Refused};
use crate::upload::{self, Destination, ObjectUpload, UploadSettings};

/// Where and how objects are written (besides the subscription's `cloudStorageConfig`).
pub struct ObjectSettings {
    pub dest: Destination,
    pub format: Arc<dyn FileFormat>,
    pub upload: UploadSettings,
    /// `--exactly-once` with a positioned source: names derived from each file's first record.
    pub exact: Option<ExactNames>,
}

/// `--exactly-once` with a positioned source ([`crate::position`]): a file holds records of one
/// stream partition only, its name is a function of its first record's position
/// ([`StreamKey::seed`]) and timestamp, it is written put-if-absent
/// ([`ObjectUpload::create_exact`], single put), and the files of a partition become durable one
/// after the other, in offset order — a file whose predecessor failed fails too, so the durable
/// files of a partition always start at a committed offset and follow one another. A restart
/// finds them again by name ([`ObjectDurableStreams`]).
#[derive(Debug, Clone)]
pub struct ExactNames {
    /// The source's streams.
    pub streams: Streams,
}

impl ExactNames {
    /// The uuid part: a name-based uuid (v3) of the first record's position.
    pub fn uuid(&self, key: &StreamKey, first: i64) -> String {
        uuid::Uuid::new_v3(&uuid::Uuid::NAMESPACE_OID, key.seed(first).as_bytes()).to_string()
    }

    /// The object name of the file whose first record is at `first` of `key` with timestamp
    /// `publish_time_micros`, under the subscription's naming (prefix, datetime format, suffix).
    pub fn name(
        &self,
        storage: &StorageSettings,
        key: &StreamKey,
        first: i64,
        publish_time_micros: i64,
    ) -> String {
        let t = chrono::DateTime::from_timestamp_micros(publish_time_micros).unwrap_or_default();
        naming::object_name(
            &storage.filename_prefix,
            &storage.datetime_format,
            t,
            &self.uuid(key, first),
            &storage.filename_suffix,
        )
    }

    /// The stream partition of a message (`STREAM/PART`, from its receipt's position), as the
    /// file group.
    pub fn group_of(&self, r: &Received) -> Option<String> {
        r.receipt.position.as_ref().map(|p| p.key.to_string())
    }
}

/// `--exactly-once` into objects: check that the files can hold it (`Err`: why not) and name them
/// from their first records from now on.
pub fn hold_positions(
    objects: &mut ObjectSettings,
    storage: &StorageSettings,
    streams: &Streams,
) -> Result<(), &'static str> {
    use crate::config::OutputFormat;
    if storage.partitions.is_some() {
        return Err("subsink.paths splits a partition's records over several open files, one per path, so its files would not follow one another offset by offset; remove subsink.paths or --exactly-once");
    }
    let why = match storage.output {
        OutputFormat::Text => Some("Text files do not carry the records' offsets, so a restart cannot find where a file of a crashed run ends; use avroConfig.writeMetadata"),
        OutputFormat::Avro { write_metadata: false, .. } => Some("Avro without writeMetadata does not carry the records' offsets (message_id), so a restart cannot find where a file of a crashed run ends; set avroConfig.writeMetadata"),
        OutputFormat::Avro { use_topic_schema: true, .. } => Some("useTopicSchema writes one file per schema revision, so a partition's records would not follow one another file by file"),
        OutputFormat::Avro { .. } => None,
    };
    if let Some(why) = why {
        return Err(why);
    }
    objects.exact = Some(ExactNames {
        streams: streams.clone(),
    });
    Ok(())
}

/// `--exactly-once` into objects: before the first record of a stream partition is written, the
/// file a run would have started with it is looked up by its derived name ([`ExactNames`]); when
/// a crashed run left it, its last offset is read back from its records (Avro with metadata: each
/// record's `message_id` is its position).
pub struct ObjectDurableStreams {
    names: ExactNames,
    storage: StorageSettings,
    dest: Destination,
}

#[async_trait::async_trait]
impl DurableStreams for ObjectDurableStreams {
    /// Derived names are only as good as the store's put-if-absent (a Delta table checks its own
    /// when it is opened).
    async fn ready(&self) -> Result<(), String> {
        upload::check_put_if_absent(&self.dest).await.map_err(|e| {
            format!(
                "the bucket {} has no atomic put-if-absent ({e})",
                self.dest.url
            )
        })
    }

    fn lookup(&self, at: &Position, publish_time_micros: i64) -> String {
        self.names
            .name(&self.storage, &at.key, at.offset, publish_time_micros)
    }

    /// The last offset of `at.key` in the object named for `at`, or `None` when there is no such
    /// object. An object that is not Avro with metadata, or holds another partition, is an error.
    async fn held_through(
        &self,
        at: &Position,
        publish_time_micros: i64,
    ) -> Result<Option<i64>, String> {
        use object_store::ObjectStoreExt;
        let name = self.lookup(at, publish_time_micros);
        let path = object_store::path::Path::parse(name).map_err(|e| e.to_string())?;
        let bytes = match self.dest.store.get(&path).await {
            Ok(r) => r.bytes().await.map_err(|e| e.to_string())?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let reader = apache_avro::Reader::new(&bytes[..]).map_err(|e| e.to_string())?;
        let mut last = None;
        for v in reader {
            let v = v.map_err(|e| e.to_string())?;
            let apache_avro::types::Value::Record(fields) = v else {
                return Err("not a record".into());
            };
            let id = fields.iter().find_map(|(k, v)| match (k.as_str(), v) {
                ("message_id", apache_avro::types::Value::String(s)) => Some(s.as_str()),
                _ => None,
            });
            let Some(p) = id.and_then(|id| self.names.streams.position_of(id)) else {
                return Err(format!(
                    "a record without a {} message_id (TOPIC/PARTITION/OFFSET)",
                    self.names.streams.name
                ));
            };
            if p.key != at.key {
                return Err(format!("a record of {}", p.key));
            }
            last = Some(last.map_or(p.offset, |l: i64| l.max(p.offset)));
        }
        last.map(Some).ok_or_else(|| "no records".to_string())
    }

    fn held_in(&self, _last: i64) -> String {
        "in a file of an earlier run".into()
    }
}

/// Objects in a bucket.
pub struct ObjectSink {
    storage: StorageSettings,
    settings: ObjectSettings,
    ids: Ids,
    clock: Clock,
    /// [`ExactNames`]: the files of each stream partition, in order: each waits for the one
    /// before.
    chains: Chains<StreamKey>,
}

impl ObjectSink {
    pub fn new(
        storage: StorageSettings,
        settings: ObjectSettings,
        ids: Ids,
        clock: Clock,
    ) -> ObjectSink {
        ObjectSink {
            storage,
            settings,
            ids,
            clock,
            chains: Chains::default(),
        }
    }

    /// The bucket objects go to.
    pub fn dest(&self) -> &Destination {
        &self.settings.dest
    }
}

impl Sink for ObjectSink {
    type File = ObjectFile;

    fn limits(&self) -> Limits {
        Limits {
            max_duration: self.storage.max_duration,
            max_bytes: self.storage.max_bytes,
            max_messages: self.storage.max_messages,
        }
    }

    fn group_of(&self, r: &Received) -> Option<String> {
        let msg = &r.msg;
        match &self.settings.exact {
            // One file per partition (the format has no groups of its own: checked at start).
            Some(names) => names.group_of(r),
            None => match &self.storage.partitions {
                None => self.settings.format.group_key(msg),
                // One file per path and format group.
                Some(p) => Some(paths::group(p, msg, self.settings.format.group_key(msg))),
            },
        }
    }

    fn durable_streams(&self) -> Option<Arc<dyn DurableStreams>> {
        let names = self.settings.exact.clone()?;
        Some(Arc::new(ObjectDurableStreams {
            names,
            storage: self.storage.clone(),
            dest: self.settings.dest.clone(),
        }))
    }

    fn refusal(&self) -> Refusal {
        Refusal::BadInput
    }

    fn check(&self) -> Option<Arc<dyn crate::receipt::MessageCheck>> {
        let format = &self.settings.format;
        let format = format.checks_messages().then(|| {
            Arc::new(super::FormatCheck(format.clone())) as Arc<dyn crate::receipt::MessageCheck>
        });
        match &self.storage.partitions {
            None => format,
            Some(_) => Some(Arc::new(PathCheck {
                storage: self.storage.clone(),
                then: format,
            })),
        }
    }

    fn open(&mut self, group: Option<&str>) -> Result<ObjectFile, PushError> {
        let uuid = self.ids.uuid();
        let s = &self.storage;
        let (dir, group) = self.split(group);
        let name = paths::object_name(
            &s.filename_prefix,
            dir,
            &s.datetime_format,
            self.clock.now(),
            &uuid,
            &s.filename_suffix,
        );
        if !dir.is_empty() {
            paths::check_dir(dir, &name).map_err(Refused::from)?;
        }
        self.open_as(group, &name, false)
    }

    fn open_for(&mut self, group: Option<&str>, first: &Received) -> Result<ObjectFile, PushError> {
        let Some(exact) = &self.settings.exact else {
            // A message without a usable event time has a directory no file can open: named.
            if let (Some(p), Some(g)) = (&self.storage.partitions, group) {
                if g.contains("=\0?") {
                    paths::check_message(p, &first.msg).map_err(Refused::from)?;
                }
            }
            return self.open(group);
        };
        let Some(at) = first.receipt.position.as_deref() else {
            return self.open(group);
        };
        let name = exact.name(
            &self.storage,
            &at.key,
            at.offset,
            first.msg.publish_time_micros,
        );
        let link = self.chains.link([at.key.clone()]);
        let mut f = self.open_with(None, &name, Upload::Exact)?;
        f.link = Some(link);
        Ok(f)
    }

    fn open_named(&mut self, group: Option<&str>, name: &str) -> Result<ObjectFile, PushError> {
        // The recorded name holds the partition directory already.
        let (_, group) = self.split(group);
        self.open_as(group, name, true)
    }

    async fn is_durable(&self, name: &str) -> Result<bool, SinkError> {
        Ok(upload::exists(&self.settings.dest, name).await?)
    }
}

impl ObjectSink {
    /// A file group taken apart: the partition directory (empty without `subsink.paths`) and the
    /// format's own group.
    fn split<'g>(&self, group: Option<&'g str>) -> (&'g str, Option<&'g str>) {
        match (&self.storage.partitions, group) {
            (Some(_), Some(g)) => paths::split_group(g),
            _ => ("", group),
        }
    }

    /// A new object `name`; `create_only`: put-if-absent (see [`ObjectUpload::create_only`]).
    fn open_as(
        &mut self,
        group: Option<&str>,
        name: &str,
        create_only: bool,
    ) -> Result<ObjectFile, PushError> {
        let how = match create_only {
            true => Upload::CreateOnly,
            false => Upload::Overwrite,
        };
        self.open_with(group, name, how)
    }

    fn open_with(
        &mut self,
        group: Option<&str>,
        name: &str,
        how: Upload,
    ) -> Result<ObjectFile, PushError> {
        let sync = self.ids.sync_marker();
        let format = &self.settings.format;
        let mut encoder = format.new_file(sync, group).map_err(Refused::from)?;
        let mut settings = self.settings.upload;
        if how == Upload::Exact {
            // A single put: the only atomic put-if-absent.
            settings.multipart_threshold = usize::MAX;
        }
        let mut upload =
            ObjectUpload::new(&self.settings.dest, name, format.content_type(), settings)?;
        upload = match how {
            Upload::Overwrite => upload,
            Upload::CreateOnly => upload.create_only(),
            Upload::Exact => upload.create_exact(),
        };
        encoder.header(&mut upload.buf);
        Ok(ObjectFile {
            header: upload.len(),
            encoder,
            upload,
            link: None,
        })
    }
}

/// `subsink.paths`: a message whose path cannot be stored is refused before it is accepted (a
/// push endpoint's check), as [`Sink::open`] would refuse it; then the format's own check.
struct PathCheck {
    storage: StorageSettings,
    then: Option<Arc<dyn crate::receipt::MessageCheck>>,
}

impl crate::receipt::MessageCheck for PathCheck {
    fn check(&self, msg: &Message) -> Result<(), Refused> {
        if let Some(p) = &self.storage.partitions {
            let s = &self.storage;
            paths::check_message(p, msg)?;
            let dir = paths::dir_of(p, msg);
            let name = paths::object_name(
                &s.filename_prefix,
                &dir,
                &s.datetime_format,
                chrono::DateTime::UNIX_EPOCH,
                "00000000-0000-4000-8000-000000000000",
                &s.filename_suffix,
            );
            paths::check_dir(&dir, &name)?;
        }
        match &self.then {
            Some(c) => c.check(msg),
            None => Ok(()),
        }
    }
}

/// How an object is put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upload {
    Overwrite,
    /// [`ObjectUpload::create_only`].
    CreateOnly,
    /// [`ObjectUpload::create_exact`], single put.
    Exact,
}

/// One object being written.
pub struct ObjectFile {
    encoder: Box<dyn FileEncoder>,
    upload: ObjectUpload,
    header: u64,
    /// [`ExactNames`]: the file's place in its partition's chain.
    link: Option<Chained>,
}

impl SinkFile for ObjectFile {
    type Closed = ClosedObject;

    fn name(&self) -> &str {
        self.upload.name()
    }

    fn header_bytes(&self) -> u64 {
        self.header
    }

    fn stage(&mut self, r: &Received) -> Result<u64, Refused> {
        Ok(self
            .encoder
            .encode_tentative(&r.msg, &mut self.upload.buf)? as u64)
    }

    fn commit(&mut self) {
        self.encoder.commit(&mut self.upload.buf);
    }

    fn unstage(&mut self, carry: &mut Vec<u8>) -> Unstaged {
        self.encoder.rollback(&mut self.upload.buf, carry);
        Unstaged::Carried
    }

    fn place(&mut self, carry: &[u8]) -> u64 {
        self.encoder.append(carry, &mut self.upload.buf) as u64
    }

    fn buffered(&self) -> u64 {
        // As allocated: what the file costs in memory, not only what it has written, with the
        // parts of its multipart upload that may be in flight.
        self.upload.held() + self.encoder.pending() as u64
    }

    fn needs_flush(&self) -> bool {
        self.upload.wants_stream()
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        Ok(self.upload.maybe_stream().await?)
    }

    fn close(mut self) -> ClosedObject {
        self.encoder.finish(&mut self.upload.buf);
        ClosedObject(self.upload, self.link)
    }
}

/// A finished object: every byte is in the upload, still to be made visible; under
/// [`ExactNames`], its link in the partition's chain.
pub struct ClosedObject(ObjectUpload, Option<Chained>);

impl ClosedObject {
    /// Bytes of the object.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[async_trait::async_trait]
impl Durable for ClosedObject {
    fn name(&self) -> &str {
        self.0.name()
    }

    async fn ready(&mut self) {
        if let Some(link) = &self.1 {
            link.wait_before().await;
        }
    }

    async fn make_durable(self: Box<Self>) -> Result<crate::receipt::Written, SinkError> {
        let ClosedObject(upload, link) = *self;
        let Some(link) = link else {
            return Ok(upload.finish().await?.into());
        };
        // [`ExactNames`]: only after the partition's previous file, and not at all if it failed
        // (or was given up: its link dropped). Waited for in `ready` already (then this answers
        // at once), unless the caller went straight here.
        if !link.wait_before().await {
            let name = upload.name().to_string();
            upload.abort().await;
            link.done(false);
            return Err(SinkError::OrderBroken { name });
        }
        let result = upload.finish().await;
        link.done(result.is_ok());
        Ok(result?.into())
    }

    async fn abort(self: Box<Self>) {
        self.0.abort().await
    }
}

/// Output options that are not part of the subscription resource (subsink extensions).
#[derive(Debug, Clone)]
pub struct FormatOptions {
    pub codec: crate::encode::avro::Codec,
    /// Uncompressed bytes at which an Avro block is closed.
    pub block_size: usize,
    /// The topic's Avro schema (its revisions), required with `useTopicSchema`.
    pub topic_schema: Option<crate::encode::topic::TopicSchemaSource>,
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
    /// `origin` is `--topic-schema PATH`, or where `serve` read the schema.
    #[error("{origin}: {reason}")]
    TopicSchema { origin: String, reason: String },
}

/// Build the output format a subscription asks for (docs/contract.md §3.6, §3.7).
pub fn build_format(
    sub: &ValidSubscription,
    opts: &FormatOptions,
) -> Result<Arc<dyn FileFormat>, FormatError> {
    use crate::config::OutputFormat;
    use crate::encode::avro::{AvroFormat, AvroLayout};
    use crate::encode::text::TextFormat;
    use crate::encode::topic::SchemaError;
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
    let bad = |source: &crate::encode::topic::TopicSchemaSource, e: SchemaError| {
        FormatError::TopicSchema {
            origin: source.origin(),
            reason: e.to_string(),
        }
    };
    let format = if use_topic_schema {
        let source = opts
            .topic_schema
            .as_ref()
            .ok_or(FormatError::MissingTopicSchema)?;
        let schemas = source
            .load(opts.default_encoding)
            .map_err(|e| bad(source, e))?;
        AvroFormat::for_topic(
            &schemas,
            write_metadata,
            sub.name.clone(),
            opts.codec,
            opts.block_size,
        )
        .map_err(|e| bad(source, e))?
    } else {
        let layout = if write_metadata {
            AvroLayout::WithMetadata
        } else {
            AvroLayout::Plain
        };
        AvroFormat::new(layout, sub.name.clone(), opts.codec, opts.block_size)
            .expect("layouts A and B always build")
    };
    Ok(Arc::new(format))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::FlushReason;
    use crate::encode::text::TextFormat;
    use crate::message::{Message, Receipt, Received};
    use crate::naming::DatetimeFormat;
    use crate::receipt::Replay;
    use crate::sink::{Files, OpenFiles, Pushed};
    use proptest::prelude::*;
    use std::time::Duration;

    /// Names under `--exactly-once`: a function of reader, stream, partition and first offset
    /// (moved here from the positioned source's tests, with the names).
    #[test]
    fn exact_names_are_a_function_of_the_first_position() {
        let streams = |reader: &str| Streams {
            name: "X".into(),
            scheme: "subsink-x".into(),
            reader: reader.into(),
        };
        let g = ExactNames {
            streams: streams("g"),
        };
        let (t0, t1) = (g.streams.key("t", 0), g.streams.key("t", 1));
        assert_eq!(g.uuid(&t0, 15), g.uuid(&t0, 15));
        assert_ne!(g.uuid(&t0, 15), g.uuid(&t0, 16));
        assert_ne!(g.uuid(&t0, 15), g.uuid(&t1, 15));
        let h = ExactNames {
            streams: streams("h"),
        };
        assert_ne!(g.uuid(&t0, 15), h.uuid(&h.streams.key("t", 0), 15));
    }

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
            partitions: None,
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
        let mut w = Files::new(ObjectSink::new(
            settings(max_bytes, max_messages),
            ObjectSettings {
                exact: None,
                dest: dest.clone(),
                format: Arc::new(TextFormat),
                upload: UploadSettings {
                    multipart_threshold: 64,
                    part_size: 64,
                    ..UploadSettings::default()
                },
            },
            Ids::new(Some(1)),
            Clock::default(),
        ));
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
            if w.push(&r, None, None, &mut done).unwrap() == Pushed::NeedsFlush {
                w.flush().await.unwrap();
            }
        }
        w.finalize_all(FlushReason::EndOfInput, &mut done);
        let mut objects = Vec::new();
        for f in done {
            let name = f.file.name().to_string();
            let len = f.file.make_durable().await.unwrap().bytes;
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

    fn sink(dest: &Destination, max_messages: Option<u64>) -> Files<ObjectSink> {
        Files::new(ObjectSink::new(
            settings(None, max_messages),
            ObjectSettings {
                exact: None,
                dest: dest.clone(),
                format: Arc::new(TextFormat),
                upload: UploadSettings::default(),
            },
            Ids::new(Some(1)),
            Clock::default(),
        ))
    }

    /// Message `i` of a file source: its line starts at byte `10 * i`.
    fn line(i: u64) -> Received {
        Received {
            msg: Message {
                data: format!("m{i}").into_bytes().into(),
                message_id: i.to_string(),
                ..Default::default()
            },
            receipt: Receipt {
                start: 10 * i,
                end: 10 * i + 10,
                line: i + 1,
                ..Default::default()
            },
        }
    }

    async fn read(dest: &Destination, name: &str) -> String {
        use object_store::ObjectStoreExt;
        let p = object_store::path::Path::parse(name).unwrap();
        let b = dest.store.get(&p).await.unwrap().bytes().await.unwrap();
        String::from_utf8(b.to_vec()).unwrap()
    }

    /// A span a crashed run left pending is written again exactly: under its recorded name, from
    /// its first message through its last whatever maxMessages says, the file before it cut
    /// where the span begins and the file after it starting fresh.
    #[tokio::test]
    async fn a_replay_file_holds_exactly_its_span_under_its_recorded_name() {
        let dest = Destination::from_url("memory://").unwrap();
        let mut w = sink(&dest, Some(2));
        let mut done = Vec::new();
        w.push(&line(0), None, None, &mut done).unwrap();
        let replay = Replay {
            object: "p/replayed.txt".into(),
            last: 40,
        };
        w.push_replay(&line(1), None, &replay, &mut done).unwrap();
        for i in 2..=5 {
            w.push(&line(i), None, None, &mut done).unwrap();
        }
        w.finalize_all(FlushReason::EndOfInput, &mut done);
        let spans: Vec<(u64, u64, u64)> = done
            .iter()
            .map(|f| {
                (
                    f.contents.span.first,
                    f.contents.span.last,
                    f.contents.messages,
                )
            })
            .collect();
        assert_eq!(spans, [(0, 0, 1), (10, 40, 4), (50, 50, 1)]);
        assert_eq!(done[1].file.name(), "p/replayed.txt");
        assert_eq!(done[1].reason, FlushReason::Early);
        let mut names = Vec::new();
        for f in done {
            names.push(f.file.name().to_string());
            f.file.make_durable().await.unwrap();
        }
        assert_eq!(read(&dest, &names[1]).await, "m1\nm2\nm3\nm4\n");
        assert_eq!(read(&dest, &names[2]).await, "m5\n");
    }

    /// The put of the crashed run landed first: the replay reports the object durable and leaves
    /// it as it is (put-if-absent), so the span is in one object only.
    #[tokio::test]
    async fn a_replay_never_overwrites_an_object_that_landed_first() {
        use object_store::ObjectStoreExt;
        let dest = Destination::from_url("memory://").unwrap();
        let p = object_store::path::Path::parse("p/replayed.txt").unwrap();
        dest.store.put(&p, "landed late\n".into()).await.unwrap();
        let mut w = sink(&dest, None);
        let mut done = Vec::new();
        let replay = Replay {
            object: "p/replayed.txt".into(),
            last: 10,
        };
        w.push_replay(&line(0), None, &replay, &mut done).unwrap();
        w.push(&line(1), None, None, &mut done).unwrap();
        assert_eq!(done.len(), 1, "finalized right after its last message");
        let f = done.pop().unwrap();
        f.file.make_durable().await.unwrap();
        assert_eq!(read(&dest, "p/replayed.txt").await, "landed late\n");
    }

    /// A replay whose last message is not written this time (refused, or the input changed)
    /// ends before the next message of its group instead of taking it in.
    #[tokio::test]
    async fn a_replay_file_ends_before_a_message_past_its_span() {
        let dest = Destination::from_url("memory://").unwrap();
        let mut w = sink(&dest, None);
        let mut done = Vec::new();
        let replay = Replay {
            object: "p/replayed.txt".into(),
            last: 20,
        };
        w.push_replay(&line(0), None, &replay, &mut done).unwrap();
        w.push(&line(1), None, None, &mut done).unwrap();
        w.push(&line(3), None, None, &mut done).unwrap();
        w.finalize_all(FlushReason::EndOfInput, &mut done);
        let spans: Vec<(u64, u64)> = done
            .iter()
            .map(|f| (f.contents.span.first, f.contents.span.last))
            .collect();
        assert_eq!(spans, [(0, 10), (30, 30)]);
        assert_eq!(done[0].file.name(), "p/replayed.txt");
    }

    /// What flow control sees of the open files, and the one file it finalizes.
    #[tokio::test]
    async fn open_files_report_what_flow_control_counts_and_one_is_finalized_by_id() {
        let dest = Destination::from_url("memory://").unwrap();
        let mut w = sink(&dest, None);
        let mut done = Vec::new();
        let group = |g: &str| Some(g.to_string());
        for i in 0..3 {
            w.push(&line(i), group("a"), None, &mut done).unwrap();
        }
        w.push(&line(3), group("b"), None, &mut done).unwrap();
        let replay = Replay {
            object: "p/replayed.txt".into(),
            last: 50,
        };
        w.push_replay(&line(4), group("c"), &replay, &mut done)
            .unwrap();
        let mut open = w.open_flow();
        open.sort_by_key(|f| f.id);
        // Bytes: data ("m0") and message id ("0") of each message.
        let seen: Vec<(u64, u64, bool)> = open
            .iter()
            .map(|f| (f.held.messages, f.held.bytes, f.replay))
            .collect();
        assert_eq!(seen, [(3, 9, false), (1, 3, false), (1, 3, true)]);
        assert!(done.is_empty());
        w.finalize_file(open[0].id, FlushReason::FlowControl, &mut done);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].reason, FlushReason::FlowControl);
        assert_eq!((done[0].contents.messages, done[0].flow_bytes), (3, 9));
        assert_eq!(w.open_files(), 2);
        // An id no longer open: nothing happens.
        w.finalize_file(open[0].id, FlushReason::FlowControl, &mut done);
        assert_eq!((done.len(), w.open_files()), (1, 2));
    }

    /// Text, with the attribute `rev` as the format's own group (as topic-schema revisions are);
    /// a file is handed the format's group only, never the partition directory.
    struct Revisions;

    impl FileFormat for Revisions {
        fn content_type(&self) -> &'static str {
            "text/plain"
        }

        fn group_key(&self, msg: &Message) -> Option<String> {
            msg.attributes.get("rev").map(str::to_string)
        }

        fn new_file(
            &self,
            sync: [u8; 16],
            group: Option<&str>,
        ) -> Result<Box<dyn FileEncoder>, crate::encode::EncodeError> {
            assert!(group.is_some_and(|g| g.starts_with("rev")), "{group:?}");
            TextFormat.new_file(sync, None)
        }
    }

    fn by_region() -> crate::config::PathPartitions {
        crate::config::PathPartitions {
            partitions: vec![crate::config::Partition {
                name: "region".into(),
                value: crate::config::PartitionValue::Attribute("region".into()),
            }],
        }
    }

    /// One open file per (partition directory, format group); a replay keeps its recorded name
    /// (which holds the directory) and its file gets the format's group.
    #[tokio::test]
    async fn each_path_and_format_group_has_its_own_file() {
        let dest = Destination::from_url("memory://").unwrap();
        let mut storage = settings(None, None);
        storage.filename_prefix = "out/part-".into();
        storage.partitions = Some(by_region());
        let mut w = Files::new(ObjectSink::new(
            storage,
            ObjectSettings {
                exact: None,
                dest: dest.clone(),
                format: Arc::new(Revisions),
                upload: UploadSettings::default(),
            },
            Ids::new(Some(1)),
            Clock::default(),
        ));
        let mut done = Vec::new();
        let regions = [Some("eu"), Some("us/1"), None];
        for i in 0..12u64 {
            let mut r = line(i);
            if let Some(region) = regions[i as usize % 3] {
                r.msg.attributes.insert("region".into(), region.into());
            }
            r.msg
                .attributes
                .insert("rev".into(), format!("rev{}", i % 2));
            let group = w.group_of(&r);
            if i == 10 {
                let replay = Replay {
                    object: "out/region=us%2F1/part-replayed.txt".into(),
                    last: 100,
                };
                w.push_replay(&r, group, &replay, &mut done).unwrap();
            } else {
                w.push(&r, group, None, &mut done).unwrap();
            }
        }
        w.finalize_all(FlushReason::EndOfInput, &mut done);
        let mut files = Vec::new();
        for f in done {
            let name = f.file.name().to_string();
            f.file.make_durable().await.unwrap();
            if name.ends_with("replayed.txt") {
                assert_eq!(read(&dest, &name).await, "m10\n");
            }
            let (dir, file) = name.rsplit_once('/').unwrap();
            assert!(file.starts_with("part-"), "{name}");
            files.push((dir.to_string(), read(&dest, &name).await));
        }
        files.sort();
        let want: Vec<(String, String)> = [
            ("out/region=__HIVE_DEFAULT_PARTITION__", "m2\nm8\n"),
            ("out/region=__HIVE_DEFAULT_PARTITION__", "m5\nm11\n"),
            ("out/region=eu", "m0\nm6\n"),
            ("out/region=eu", "m3\nm9\n"),
            ("out/region=us%2F1", "m1\nm7\n"),
            ("out/region=us%2F1", "m10\n"),
            ("out/region=us%2F1", "m4\n"),
        ]
        .iter()
        .map(|(d, c)| (d.to_string(), c.to_string()))
        .collect();
        assert_eq!(files, want);
    }

    /// The check a push endpoint asks before it accepts a message refuses what open would.
    #[test]
    fn the_message_check_refuses_a_path_that_cannot_be_stored() {
        let mut storage = settings(None, None);
        let objects = || ObjectSettings {
            exact: None,
            dest: Destination::from_url("memory://").unwrap(),
            format: Arc::new(TextFormat),
            upload: UploadSettings::default(),
        };
        let plain = ObjectSink::new(
            storage.clone(),
            objects(),
            Ids::new(Some(1)),
            Clock::default(),
        );
        assert!(plain.check().is_none());
        storage.partitions = Some(by_region());
        let sink = ObjectSink::new(storage, objects(), Ids::new(Some(1)), Clock::default());
        let check = sink.check().unwrap();
        let mut r = line(0);
        r.msg.attributes.insert("region".into(), "eu".into());
        assert!(check.check(&r.msg).is_ok());
        r.msg.attributes.insert("region".into(), "y".repeat(300));
        let e = check.check(&r.msg).unwrap_err();
        assert!(matches!(e, Refused::Path(_)), "{e}");
    }

    /// `--exactly-once` names need a partition's files to follow one another: refused with paths.
    #[test]
    fn exactly_once_refuses_partitioned_paths() {
        let mut storage = settings(None, None);
        storage.output = crate::config::OutputFormat::Avro {
            write_metadata: true,
            use_topic_schema: false,
        };
        let mut objects = ObjectSettings {
            exact: None,
            dest: Destination::from_url("memory://").unwrap(),
            format: Arc::new(TextFormat),
            upload: UploadSettings::default(),
        };
        let streams = Streams {
            name: "X".into(),
            scheme: "subsink-x".into(),
            reader: "g".into(),
        };
        assert!(hold_positions(&mut objects, &storage, &streams).is_ok());
        objects.exact = None;
        storage.partitions = Some(by_region());
        let why = hold_positions(&mut objects, &storage, &streams).unwrap_err();
        assert!(why.contains("subsink.paths"), "{why}");
        assert!(objects.exact.is_none());
    }
}
