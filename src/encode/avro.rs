//! Avro output (docs/contract.md §3.7): one standard Avro object-container file per object, in one of the
//! four layouts Pub/Sub writes.
//!
//! | layout | `avro_config` | writer schema |
//! |---|---|---|
//! | A [`AvroLayout::Plain`] | neither flag | `schemas/PubsubMessage.avsc`: `data` only |
//! | B [`AvroLayout::WithMetadata`] | `write_metadata` | `schemas/PubsubMessageWithMetadata.avsc` |
//! | C [`AvroLayout::TopicSchema`] | `use_topic_schema` | the topic's schema ([`super::topic`]) |
//! | D [`AvroLayout::TopicSchemaWithMetadata`] | both | topic record + B's metadata fields |
//!
//! # Why hand-written
//!
//! The container writer and the datum encoder of layouts A and B are written here, byte by byte,
//! instead of going through `apache_avro::Writer`: that writer builds an `apache_avro::Value` tree
//! per message (a `HashMap` for the attributes, `String`s for every field), which costs several
//! allocations per message and caps throughput far below the ≥ 450k msgs/s per core subsink aims
//! for. Here a message is rendered straight into the caller's scratch `Vec` (zig-zag varints and
//! length-prefixed bytes); in steady state nothing is allocated per message (a test counts
//! allocations). `apache_avro` stays the reference: every test reads our files back with
//! `apache_avro::Reader`.
//!
//! # Container layout
//!
//! `Obj\x01`, a metadata map with two entries (`avro.schema` = the writer schema as compact JSON,
//! `avro.codec` = the codec's Avro name, `"null"` included), the 16-byte sync marker chosen by the
//! caller, then data blocks `count size bytes sync`. A block is flushed once its *uncompressed* size
//! reaches the block target (default [`DEFAULT_BLOCK_TARGET`] = 1 MiB) and at
//! [`FileEncoder::finish`]; a single message larger than the target makes a block of its own. A
//! file without messages is a valid container with a header and no blocks.
//!
//! # Size accounting (docs/contract.md §6 Q2)
//!
//! [`FileEncoder::encode`] returns the datum length plus the block overhead the datum causes: a
//! message that opens a block is charged the sync marker (16 bytes), the block count varint and the
//! block size varint; a message that joins a block is charged only the growth of those two varints
//! (usually 0). With codec `null` the sum of the returned values plus the header length is
//! **exactly** the file size. With a compressing codec the same figures are computed from the
//! codec's worst case for the block ([`payload_bound`]: the uncompressed size plus what the codec
//! may add to incompressible data, snappy's 4-byte CRC included), so they are an upper bound: a
//! file finalized at `max_bytes` never passes it, and comes out smaller by the compression ratio. The estimate is relative
//! to the encoder's current state (whether a block is open). A datum taken back out of one file
//! ([`FileEncoder::rollback`]) and appended to a fresh one opens that file's first block there, so
//! it costs more than it did as a joiner in the old file: [`FileEncoder::append`] returns its
//! size in the file it lands in, and that is the figure to count. Otherwise every file after the
//! first undercounts by up to 19 bytes (sync marker and the two varints) and can pass `maxBytes`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::{EncodeError, FileEncoder, FileFormat};
use crate::avro::wire::{long_len, minify_json, put_bytes, put_long};
use crate::avro::{DatumError, SchemaError, TopicSchema, TopicSchemas};
use crate::message::Message;

/// Writer schema of layout A, exactly as docs/contract.md §3.7 gives it.
pub const PUBSUB_MESSAGE_SCHEMA: &str = include_str!("../../schemas/PubsubMessage.avsc");
/// Writer schema of layout B, exactly as docs/contract.md §3.7 gives it.
pub const PUBSUB_MESSAGE_WITH_METADATA_SCHEMA: &str =
    include_str!("../../schemas/PubsubMessageWithMetadata.avsc");

/// Default uncompressed size at which a data block is flushed (docs/contract.md §6 Q5: "per ~1 MiB").
pub const DEFAULT_BLOCK_TARGET: usize = 1 << 20;

/// `Content-Type` of Avro objects.
///
/// docs/contract.md §6 Q5 lets us pick `application/octet-stream` or `avro/binary`. We pick
/// `application/octet-stream`: it is the contract's first choice (docs/contract.md §3.8), what GCS and BigQuery exports use for
/// Avro, and every client treats it as an opaque download. `avro/binary` is the type of Avro's
/// HTTP RPC transport, not of container files, and `application/avro` is not registered.
pub const AVRO_CONTENT_TYPE: &str = "application/octet-stream";

/// Map key under which layouts B and D store a non-empty ordering key (docs/contract.md §6 Q7).
pub const ORDERING_KEY_ATTRIBUTE: &str = "ordering_key";

const MAGIC: &[u8; 4] = b"Obj\x01";
const SYNC_LEN: usize = 16;
/// zstd's own default level.
const ZSTD_LEVEL: i32 = 3;

/// Block compression codec (docs/contract.md §7 "Compression"; `null` is the default, docs/contract.md §6 Q5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Codec {
    /// Uncompressed blocks; readable by every Avro implementation.
    #[default]
    Null,
    /// Raw deflate (RFC 1951, no zlib header) at level 1: flate2's pure-Rust backend manages
    /// only ~190k msgs/s of 1 KiB at the default level 6, below subsink's per-core target, while
    /// level 1 keeps up (~800k msgs/s); use zstd for a better ratio at speed.
    Deflate,
    /// Raw snappy block followed by the big-endian CRC-32 of the uncompressed block.
    Snappy,
    /// One zstd frame per block, level 3 (zstd's default). Avro name `zstandard`.
    Zstd,
}

impl Codec {
    /// Every codec, for tests and help texts.
    pub const ALL: [Codec; 4] = [Codec::Null, Codec::Deflate, Codec::Snappy, Codec::Zstd];

    /// The value written to the `avro.codec` header entry (Avro specification names).
    pub fn avro_name(self) -> &'static str {
        match self {
            Codec::Null => "null",
            Codec::Deflate => "deflate",
            Codec::Snappy => "snappy",
            Codec::Zstd => "zstandard",
        }
    }

    /// The name used in subsink's configuration (`zstd` rather than Avro's `zstandard`).
    pub fn config_name(self) -> &'static str {
        match self {
            Codec::Zstd => "zstd",
            other => other.avro_name(),
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.config_name())
    }
}

/// A codec name that [`Codec::from_str`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown Avro codec {0:?}: use one of null, deflate, snappy, zstd")]
pub struct UnknownCodec(pub String);

impl FromStr for Codec {
    type Err = UnknownCodec;

    /// Accepts `null`, `deflate`, `snappy`, `zstd` and Avro's own spelling `zstandard`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "null" => Ok(Codec::Null),
            "deflate" => Ok(Codec::Deflate),
            "snappy" => Ok(Codec::Snappy),
            "zstd" | "zstandard" => Ok(Codec::Zstd),
            other => Err(UnknownCodec(other.to_owned())),
        }
    }
}

/// Which of the four layouts of docs/contract.md §3.7 to write.
#[derive(Debug, Clone)]
pub enum AvroLayout {
    /// Layout A: `{data: bytes}`.
    Plain,
    /// Layout B: `subscription_name, message_id, publish_time, attributes, data`.
    WithMetadata,
    /// Layout C: each message's data decoded with the topic schema and written as its datum.
    TopicSchema(TopicSchema),
    /// Layout D: the topic record with `subscription_name, message_id, publish_time, attributes`
    /// appended (layout-B types, no `data` field; docs/contract.md §6 Q8).
    TopicSchemaWithMetadata(TopicSchema),
}

/// The Avro output format: a factory of per-file container writers.
///
/// Cheap to clone (the schema and settings are shared).
#[derive(Debug, Clone)]
pub struct AvroFormat {
    shared: Arc<Shared>,
    /// Topic-schema layouts with revisions: the writer of each revision's files (its schema in
    /// the header, its datums read with it), made when the revision is first met; files of a
    /// revision that cannot be had use `shared`.
    topic: Option<Arc<RevisionWriters>>,
}

/// What [`AvroFormat::for_topic`] makes each revision's writer from, and those made so far.
#[derive(Debug)]
struct RevisionWriters {
    schemas: TopicSchemas,
    write_metadata: bool,
    subscription_name: String,
    codec: Codec,
    block_target: usize,
    made: std::sync::RwLock<BTreeMap<String, Arc<Shared>>>,
}

impl RevisionWriters {
    /// The writer of `revision`'s files, `None` when its schema cannot be had (or does not make a
    /// writer: layout D's checks, logged).
    fn of(&self, revision: &str) -> Option<Arc<Shared>> {
        self.make(revision).unwrap_or_else(|e| {
            tracing::error!(revision, error = %e, "the topic schema revision cannot be written; its messages are read with the newest known revision");
            None
        })
    }

    fn make(&self, revision: &str) -> Result<Option<Arc<Shared>>, SchemaError> {
        if let Some(w) = self.made.read().expect("not poisoned").get(revision) {
            return Ok(Some(Arc::clone(w)));
        }
        let Some(schema) = self.schemas.lookup(revision) else {
            return Ok(None);
        };
        let layout = if self.write_metadata {
            AvroLayout::TopicSchemaWithMetadata(schema)
        } else {
            AvroLayout::TopicSchema(schema)
        };
        let f = AvroFormat::new(
            layout,
            self.subscription_name.clone(),
            self.codec,
            self.block_target,
        )?;
        self.made
            .write()
            .expect("not poisoned")
            .insert(revision.to_owned(), Arc::clone(&f.shared));
        Ok(Some(f.shared))
    }
}

#[derive(Debug)]
struct Shared {
    layout: AvroLayout,
    codec: Codec,
    block_target: usize,
    /// The writer schema as compact JSON, as written to `avro.schema`.
    schema_json: String,
    /// Everything of the header but the sync marker.
    header_prefix: Vec<u8>,
    /// `subscription_name` already Avro-encoded (length + UTF-8), copied into every B/D datum.
    subscription_name_datum: Vec<u8>,
}

impl AvroFormat {
    /// Builds the format. `subscription_name` is the full resource name
    /// `projects/{p}/subscriptions/{s}` (docs/contract.md §6 Q7), written by layouts B and D. `block_target` is
    /// the uncompressed block size in bytes at which a block is flushed ([`DEFAULT_BLOCK_TARGET`]
    /// is the usual choice; 0 flushes after every message).
    ///
    /// Fails only for layout D, when the topic schema's root is not a record or already has one of
    /// the metadata field names (docs/contract.md §3.7, Q7); the error lists the offending fields.
    pub fn new(
        layout: AvroLayout,
        subscription_name: String,
        codec: Codec,
        block_target: usize,
    ) -> Result<Self, SchemaError> {
        let schema_json = match &layout {
            AvroLayout::Plain => minify_json(PUBSUB_MESSAGE_SCHEMA),
            AvroLayout::WithMetadata => minify_json(PUBSUB_MESSAGE_WITH_METADATA_SCHEMA),
            AvroLayout::TopicSchema(topic) => topic.schema_json().to_owned(),
            AvroLayout::TopicSchemaWithMetadata(topic) => topic.with_metadata_fields()?.0,
        };
        let mut header_prefix = Vec::with_capacity(schema_json.len() + 64);
        header_prefix.extend_from_slice(MAGIC);
        put_long(&mut header_prefix, 2);
        put_bytes(&mut header_prefix, b"avro.schema");
        put_bytes(&mut header_prefix, schema_json.as_bytes());
        put_bytes(&mut header_prefix, b"avro.codec");
        put_bytes(&mut header_prefix, codec.avro_name().as_bytes());
        put_long(&mut header_prefix, 0);
        let mut subscription_name_datum = Vec::with_capacity(subscription_name.len() + 10);
        put_bytes(&mut subscription_name_datum, subscription_name.as_bytes());
        Ok(Self {
            shared: Arc::new(Shared {
                layout,
                codec,
                block_target,
                schema_json,
                header_prefix,
                subscription_name_datum,
            }),
            topic: None,
        })
    }

    /// Layout C (`write_metadata` false) or D of a topic whose schema has revisions: each
    /// revision's files have that revision's schema as writer schema and its datums are read with
    /// it; a message of any other revision (or none) goes to a file of `schemas`' fallback
    /// (docs/contract.md §6 Q8). Fails as [`AvroFormat::new`] does, for any of the schemas.
    pub fn for_topic(
        schemas: &TopicSchemas,
        write_metadata: bool,
        subscription_name: String,
        codec: Codec,
        block_target: usize,
    ) -> Result<Self, SchemaError> {
        let layout = |s: &TopicSchema| {
            if write_metadata {
                AvroLayout::TopicSchemaWithMetadata(s.clone())
            } else {
                AvroLayout::TopicSchema(s.clone())
            }
        };
        let mut format = Self::new(
            layout(schemas.fallback()),
            subscription_name.clone(),
            codec,
            block_target,
        )?;
        let writers = RevisionWriters {
            schemas: schemas.clone(),
            write_metadata,
            subscription_name,
            codec,
            block_target,
            made: Default::default(),
        };
        // Every revision known at startup must make a writer: a schema layout D cannot take is
        // refused now, not at its first message.
        for (id, _) in schemas.revisions() {
            writers
                .make(&id)
                .map_err(|e| SchemaError::Avro(format!("revision {id}: {e}")))?;
        }
        format.topic = Some(Arc::new(writers));
        Ok(format)
    }

    /// The writer schema written to every file's header, as compact JSON.
    pub fn schema_json(&self) -> &str {
        &self.shared.schema_json
    }

    pub fn codec(&self) -> Codec {
        self.shared.codec
    }

    pub fn block_target(&self) -> usize {
        self.shared.block_target
    }

    pub fn layout(&self) -> &AvroLayout {
        &self.shared.layout
    }
}

impl FileFormat for AvroFormat {
    fn content_type(&self) -> &'static str {
        AVRO_CONTENT_TYPE
    }

    /// Topic-schema layouts split files by schema revision (docs/contract.md §6 Q8): the key is the
    /// `googclient_schemarevisionid` attribute, `None` when absent. A revision with a schema of
    /// its own ([`AvroFormat::for_topic`]) writes its files with it; with one `.avsc` every
    /// revision's file is written with that schema, still one revision per file.
    fn group_key(&self, msg: &Message) -> Option<String> {
        match &self.shared.layout {
            AvroLayout::Plain | AvroLayout::WithMetadata => None,
            AvroLayout::TopicSchema(_) | AvroLayout::TopicSchemaWithMetadata(_) => {
                TopicSchema::revision_of(msg).map(str::to_owned)
            }
        }
    }

    fn checks_messages(&self) -> bool {
        matches!(
            self.shared.layout,
            AvroLayout::TopicSchema(_) | AvroLayout::TopicSchemaWithMetadata(_)
        )
    }

    /// The topic-schema rule of [`FileEncoder::encode`], with the writer of the message's
    /// revision, into a scratch buffer.
    fn check(&self, msg: &Message) -> Result<(), EncodeError> {
        let shared = self.shared_for(self.group_key(msg).as_deref())?;
        match &shared.layout {
            AvroLayout::TopicSchema(topic) | AvroLayout::TopicSchemaWithMetadata(topic) => {
                let mut scratch = Vec::with_capacity(msg.data.len() + 16);
                topic
                    .encode_datum(msg, &mut scratch)
                    .map_err(|e| bad_datum(msg, e))
            }
            AvroLayout::Plain | AvroLayout::WithMetadata => Ok(()),
        }
    }

    fn new_file(
        &self,
        sync_marker: [u8; 16],
        group_key: Option<&str>,
    ) -> Result<Box<dyn FileEncoder>, EncodeError> {
        let shared = self.shared_for(group_key)?;
        Ok(Box::new(AvroFileEncoder {
            shared,
            sync_marker,
            block: Vec::new(),
            block_count: 0,
            tentative: 0,
            compressor: Compressor::new(self.shared.codec),
        }))
    }
}

impl AvroFormat {
    /// The writer of the files of `group_key` (a schema revision).
    fn shared_for(&self, group_key: Option<&str>) -> Result<Arc<Shared>, EncodeError> {
        Ok(match (&self.topic, group_key) {
            (Some(writers), Some(revision)) => match writers.of(revision) {
                Some(w) => w,
                None if writers.schemas.fetches() && !writers.schemas.settled(revision) => {
                    return Err(EncodeError::SchemaUnavailable {
                        revision: revision.to_owned(),
                        reason: "reading it from Pub/Sub failed (logged)".into(),
                    })
                }
                None => Arc::clone(&self.shared),
            },
            _ => Arc::clone(&self.shared),
        })
    }
}

/// What an open file's first block reserves; it grows (doubling) up to the block size.
const FIRST_BLOCK_CAPACITY: usize = 16 << 10;

/// One open container file: the pending (uncompressed) block and the codec's reusable state.
struct AvroFileEncoder {
    shared: Arc<Shared>,
    sync_marker: [u8; 16],
    /// Concatenated datums of the open block, uncompressed.
    block: Vec<u8>,
    /// Number of datums in `block`.
    block_count: u64,
    /// Where the tentative datum starts in `block` (see [`FileEncoder::encode_tentative`]).
    tentative: usize,
    compressor: Compressor,
}

impl AvroFileEncoder {
    /// The block overhead `datum_len` more bytes cause; see the module docs (Size accounting).
    fn overhead_share(&self, datum_len: usize) -> usize {
        self.overhead_share_at(self.block.len(), datum_len)
    }

    /// [`Self::overhead_share`] for a block of `block_len` uncompressed bytes: the block's sync
    /// marker and varints, and what the codec may add to the datum in the worst case
    /// ([`payload_bound`]; nothing for `null`).
    fn overhead_share_at(&self, block_len: usize, datum_len: usize) -> usize {
        let codec = self.shared.codec;
        if self.block_count == 0 {
            let payload = payload_bound(codec, datum_len);
            SYNC_LEN + long_len(1) + long_len(payload as i64) + (payload - datum_len)
        } else {
            let old = payload_bound(codec, block_len);
            let new = payload_bound(codec, block_len + datum_len);
            (long_len(self.block_count as i64 + 1) - long_len(self.block_count as i64))
                + (long_len(new as i64) - long_len(old as i64))
                + (new - old).saturating_sub(datum_len)
        }
    }

    fn flush_block(&mut self, out: &mut Vec<u8>) {
        if self.block_count == 0 {
            return;
        }
        let payload = self.compressor.compress(&self.block);
        put_long(out, self.block_count as i64);
        put_long(out, payload.len() as i64);
        out.extend_from_slice(payload);
        out.extend_from_slice(&self.sync_marker);
        self.block.clear();
        if self.block.capacity() > 2 * self.shared.block_target {
            // A large datum grew the block: do not keep its allocation for the file's life
            // (issue 26: it is counted, and resident, for nothing).
            self.block = Vec::new();
        }
        self.block_count = 0;
    }
}

impl FileEncoder for AvroFileEncoder {
    fn pending(&self) -> usize {
        self.block.capacity()
    }

    fn header(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.shared.header_prefix);
        out.extend_from_slice(&self.sync_marker);
    }

    fn encode(&mut self, msg: &Message, scratch: &mut Vec<u8>) -> Result<usize, EncodeError> {
        scratch.clear();
        let shared = &*self.shared;
        match &shared.layout {
            AvroLayout::Plain => put_bytes(scratch, &msg.data),
            AvroLayout::WithMetadata => {
                scratch.reserve(
                    shared.subscription_name_datum.len()
                        + msg.message_id.len()
                        + msg.data.len()
                        + 48,
                );
                put_metadata(scratch, &shared.subscription_name_datum, msg);
                put_bytes(scratch, &msg.data);
            }
            AvroLayout::TopicSchema(topic) => topic
                .encode_datum(msg, scratch)
                .map_err(|e| bad_datum(msg, e))?,
            AvroLayout::TopicSchemaWithMetadata(topic) => {
                topic
                    .encode_datum(msg, scratch)
                    .map_err(|e| bad_datum(msg, e))?;
                put_metadata(scratch, &shared.subscription_name_datum, msg);
            }
        }
        Ok(scratch.len() + self.overhead_share(scratch.len()))
    }

    fn append(&mut self, datum: &[u8], out: &mut Vec<u8>) -> usize {
        let added = datum.len() + self.overhead_share(datum.len());
        if self.block.capacity() == 0 {
            // Small at first: hundreds of files may be open at once (topic-schema revisions, many
            // subscriptions), most of them holding little; the block grows as it fills.
            self.block.reserve(
                self.shared
                    .block_target
                    .min(FIRST_BLOCK_CAPACITY)
                    .max(datum.len()),
            );
        }
        self.block.extend_from_slice(datum);
        self.block_count += 1;
        if self.block.len() >= self.shared.block_target {
            self.flush_block(out);
        }
        added
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        self.flush_block(out);
    }

    fn encode_tentative(
        &mut self,
        msg: &Message,
        _out: &mut Vec<u8>,
    ) -> Result<usize, EncodeError> {
        if self.block.capacity() == 0 {
            self.block
                .reserve(self.shared.block_target.min(FIRST_BLOCK_CAPACITY));
        }
        let start = self.block.len();
        self.tentative = start;
        let shared = &*self.shared;
        let block = &mut self.block;
        let rendered = match &shared.layout {
            AvroLayout::Plain => {
                put_bytes(block, &msg.data);
                Ok(())
            }
            AvroLayout::WithMetadata => {
                put_metadata(block, &shared.subscription_name_datum, msg);
                put_bytes(block, &msg.data);
                Ok(())
            }
            AvroLayout::TopicSchema(topic) => topic
                .encode_datum(msg, block)
                .map_err(|e| bad_datum(msg, e)),
            AvroLayout::TopicSchemaWithMetadata(topic) => topic
                .encode_datum(msg, block)
                .map(|()| put_metadata(block, &shared.subscription_name_datum, msg))
                .map_err(|e| bad_datum(msg, e)),
        };
        if let Err(e) = rendered {
            self.block.truncate(start);
            return Err(e);
        }
        let datum_len = self.block.len() - start;
        Ok(datum_len + self.overhead_share_at(start, datum_len))
    }

    fn commit(&mut self, out: &mut Vec<u8>) {
        self.block_count += 1;
        if self.block.len() >= self.shared.block_target {
            self.flush_block(out);
        }
    }

    fn rollback(&mut self, _out: &mut Vec<u8>, datum: &mut Vec<u8>) {
        datum.clear();
        datum.extend_from_slice(&self.block[self.tentative..]);
        self.block.truncate(self.tentative);
    }
}

/// The most bytes a block of `n` uncompressed bytes can take in the file after the codec, as a
/// function that grows by at least `d` when `n` grows by `d` (so each datum's share of it is
/// never negative):
/// * `null`: `n`;
/// * deflate: miniz's `mz_deflateBound`, `max(128 + 1.1 n, 128 + n + 5 (n / 31744 + 1))`;
/// * snappy: `snap::raw::max_compress_len(n)` (32 + n + n/6) and the 4-byte CRC;
/// * zstd: `n + n/256 + 64`, at least `ZSTD_compressBound(n)` (whose last term,
///   `(128 KiB − n) >> 11` below 128 KiB, shrinks as `n` grows and is at most 64).
///
/// Incompressible payloads do grow: before this bound was counted, a 1000-byte `maxBytes` gave
/// deflate objects of up to 1051 bytes and zstd ones of 1060 (one frame per block).
fn payload_bound(codec: Codec, n: usize) -> usize {
    match codec {
        Codec::Null => n,
        Codec::Deflate => (128 + n * 110 / 100).max(128 + n + (n / (31 * 1024) + 1) * 5),
        Codec::Snappy => snap::raw::max_compress_len(n) + 4,
        Codec::Zstd => n + (n >> 8) + 64,
    }
}

/// The codec's per-file state, reused for every block of the file.
enum Compressor {
    Null,
    Deflate {
        engine: flate2::Compress,
        buf: Vec<u8>,
    },
    Snappy {
        engine: Box<snap::raw::Encoder>,
        buf: Vec<u8>,
    },
    Zstd {
        engine: Box<zstd::bulk::Compressor<'static>>,
        buf: Vec<u8>,
    },
}

impl Compressor {
    fn new(codec: Codec) -> Self {
        match codec {
            Codec::Null => Compressor::Null,
            Codec::Deflate => Compressor::Deflate {
                engine: flate2::Compress::new(flate2::Compression::fast(), false),
                buf: Vec::new(),
            },
            Codec::Snappy => Compressor::Snappy {
                engine: Box::new(snap::raw::Encoder::new()),
                buf: Vec::new(),
            },
            Codec::Zstd => Compressor::Zstd {
                // Creating a zstd context only fails when out of memory.
                engine: Box::new(
                    zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("allocate a zstd context"),
                ),
                buf: Vec::new(),
            },
        }
    }

    /// Returns the block as the codec writes it. Compressing into a `Vec` sized by the codec's
    /// own bound cannot fail, hence the `expect`s.
    fn compress<'a>(&'a mut self, block: &'a [u8]) -> &'a [u8] {
        match self {
            Compressor::Null => block,
            Compressor::Deflate { engine, buf } => {
                engine.reset();
                buf.clear();
                buf.reserve(block.len() + block.len() / 8 + 64);
                loop {
                    let consumed = engine.total_in() as usize;
                    let status = engine
                        .compress_vec(&block[consumed..], buf, flate2::FlushCompress::Finish)
                        .expect("deflate into a Vec");
                    if status == flate2::Status::StreamEnd {
                        break;
                    }
                    buf.reserve(buf.capacity().max(4096));
                }
                buf
            }
            Compressor::Snappy { engine, buf } => {
                let bound = snap::raw::max_compress_len(block.len());
                buf.clear();
                buf.resize(bound, 0);
                let n = engine
                    .compress(block, buf)
                    .expect("snappy block within max_compress_len");
                buf.truncate(n);
                buf.extend_from_slice(&crc32fast::hash(block).to_be_bytes());
                buf
            }
            Compressor::Zstd { engine, buf } => {
                buf.clear();
                buf.reserve(zstd::zstd_safe::compress_bound(block.len()));
                engine
                    .compress_to_buffer(block, buf)
                    .expect("zstd into a buffer of compress_bound");
                buf
            }
        }
    }
}

/// Writes the four metadata fields of layouts B and D: `subscription_name`, `message_id`,
/// `publish_time`, `attributes`.
///
/// The attributes map is written as one block (`count`, entries, `0`; an empty map is just `0`) in
/// `BTreeMap` order. A non-empty ordering key is inserted as the entry `ordering_key` at its sorted
/// position (docs/contract.md §6 Q7). If the message also carries an attribute literally named `ordering_key`,
/// the message's ordering key wins and that attribute is dropped (an Avro map cannot hold a key
/// twice, and the ordering key is the message property Pub/Sub promises to export); with an empty
/// ordering key such an attribute is written as is.
#[inline]
fn put_metadata(out: &mut Vec<u8>, subscription_name_datum: &[u8], msg: &Message) {
    out.extend_from_slice(subscription_name_datum);
    put_bytes(out, msg.message_id.as_bytes());
    put_long(out, msg.publish_time_micros);

    let ordering_key = msg.ordering_key.as_str();
    let mut pending_key = !ordering_key.is_empty();
    let count = if pending_key && !msg.attributes.contains_key(ORDERING_KEY_ATTRIBUTE) {
        msg.attributes.len() + 1
    } else {
        msg.attributes.len()
    };
    if count > 0 {
        put_long(out, count as i64);
        for (key, value) in &msg.attributes {
            if pending_key && key >= ORDERING_KEY_ATTRIBUTE {
                put_bytes(out, ORDERING_KEY_ATTRIBUTE.as_bytes());
                put_bytes(out, ordering_key.as_bytes());
                pending_key = false;
                if key == ORDERING_KEY_ATTRIBUTE {
                    continue;
                }
            }
            put_bytes(out, key.as_bytes());
            put_bytes(out, value.as_bytes());
        }
        if pending_key {
            put_bytes(out, ORDERING_KEY_ATTRIBUTE.as_bytes());
            put_bytes(out, ordering_key.as_bytes());
        }
    }
    put_long(out, 0);
}

/// A topic-schema message that is not a datum of the schema, as the encoder reports it.
fn bad_datum(msg: &Message, e: DatumError) -> EncodeError {
    EncodeError::BadMessage {
        message_id: msg.message_id.clone(),
        reason: e.to_string(),
    }
}

/// Helpers shared by the tests of `avro` and `topic`.
#[cfg(test)]
pub(crate) mod testutil {
    use super::*;
    use apache_avro::types::Value;

    pub const SYNC: [u8; 16] = *b"0123456789abcdef";
    pub const SUBSCRIPTION: &str = "projects/p/subscriptions/s";

    /// Writes a whole file the way the batcher does; returns the bytes and the header length plus
    /// the sum of the `encode` estimates.
    pub fn write_file(format: &AvroFormat, messages: &[Message]) -> (Vec<u8>, usize) {
        let group = messages.first().and_then(|m| format.group_key(m));
        let mut enc = format.new_file(SYNC, group.as_deref()).unwrap();
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        enc.header(&mut out);
        let mut estimated = out.len();
        for m in messages {
            estimated += enc.encode(m, &mut scratch).unwrap();
            enc.append(&scratch, &mut out);
        }
        enc.finish(&mut out);
        (out, estimated)
    }

    /// Reads a file with `apache_avro::Reader` (the reference implementation), checking the
    /// header's codec and sync marker; returns the writer schema and the records.
    pub fn read_file(bytes: &[u8], codec: Codec) -> (apache_avro::Schema, Vec<Value>) {
        let reader = apache_avro::Reader::new(bytes).expect("header");
        let schema = reader.writer_schema().clone();
        let records = reader.map(|r| r.expect("record")).collect();
        let (meta, rest) = read_metadata(bytes);
        assert_eq!(meta["avro.codec"], codec.avro_name().as_bytes());
        assert_eq!(&rest[..16], &SYNC);
        (schema, records)
    }

    /// Decodes the header's metadata map by hand; returns it and the bytes after it.
    pub fn read_metadata(bytes: &[u8]) -> (std::collections::HashMap<String, Vec<u8>>, &[u8]) {
        assert_eq!(&bytes[..4], MAGIC);
        let mut rest = &bytes[4..];
        let mut meta = std::collections::HashMap::new();
        loop {
            let count = read_long(&mut rest);
            if count == 0 {
                break;
            }
            for _ in 0..count {
                let k = read_bytes(&mut rest);
                let v = read_bytes(&mut rest);
                meta.insert(String::from_utf8(k).unwrap(), v);
            }
        }
        (meta, rest)
    }

    pub fn read_long(input: &mut &[u8]) -> i64 {
        let mut z: u64 = 0;
        let mut shift = 0;
        loop {
            let b = input[0];
            *input = &input[1..];
            z |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        ((z >> 1) as i64) ^ -((z & 1) as i64)
    }

    pub fn read_bytes(input: &mut &[u8]) -> Vec<u8> {
        let n = read_long(input) as usize;
        let v = input[..n].to_vec();
        *input = &input[n..];
        v
    }

    /// The blocks of a file as `(count, payload size)`, parsed by hand from the raw bytes.
    pub fn blocks(bytes: &[u8]) -> Vec<(i64, usize)> {
        let (_, rest) = read_metadata(bytes);
        let mut rest = &rest[16..];
        let mut blocks = Vec::new();
        while !rest.is_empty() {
            let count = read_long(&mut rest);
            let size = read_long(&mut rest) as usize;
            rest = &rest[size..];
            assert_eq!(&rest[..16], &SYNC, "block not followed by the sync marker");
            rest = &rest[16..];
            blocks.push((count, size));
        }
        blocks
    }

    /// Looks a field up in a record value.
    pub fn field<'a>(record: &'a Value, name: &str) -> &'a Value {
        match record {
            Value::Record(fields) => {
                &fields
                    .iter()
                    .find(|(n, _)| n == name)
                    .unwrap_or_else(|| panic!("no field {name}"))
                    .1
            }
            other => panic!("not a record: {other:?}"),
        }
    }

    /// The `attributes` map layouts B and D must write for `m` (ordering key merged in).
    pub fn expected_attributes(m: &Message) -> Value {
        let mut attrs: std::collections::HashMap<String, Value> = m
            .attributes
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        if !m.ordering_key.is_empty() {
            attrs.insert(
                ORDERING_KEY_ATTRIBUTE.into(),
                Value::String(m.ordering_key.clone()),
            );
        }
        Value::Map(attrs)
    }

    /// Checks the four metadata fields of a B or D record against the message.
    pub fn assert_metadata(record: &Value, m: &Message) {
        assert_eq!(
            field(record, "subscription_name"),
            &Value::String(SUBSCRIPTION.into())
        );
        assert_eq!(
            field(record, "message_id"),
            &Value::String(m.message_id.clone())
        );
        assert_eq!(
            field(record, "publish_time"),
            &Value::TimestampMicros(m.publish_time_micros)
        );
        assert_eq!(field(record, "attributes"), &expected_attributes(m));
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;
    use apache_avro::types::Value;
    use std::collections::BTreeMap;

    fn format(layout: AvroLayout, codec: Codec, block_target: usize) -> AvroFormat {
        AvroFormat::new(layout, SUBSCRIPTION.into(), codec, block_target).unwrap()
    }

    fn msg(id: &str, data: &[u8], attrs: &[(&str, &str)], time: i64, key: &str) -> Message {
        Message {
            data: bytes::Bytes::copy_from_slice(data),
            attributes: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            message_id: id.into(),
            publish_time_micros: time,
            ordering_key: key.into(),
        }
    }

    /// The edge cases every layout and codec must survive.
    fn edge_messages() -> Vec<Message> {
        vec![
            msg("1", b"hello", &[("k", "v")], 1_614_366_835_749_000, ""),
            msg("2", b"", &[("only", "attrs")], 0, ""),
            msg("3", b"no attributes", &[], -1, ""),
            msg(
                "4",
                b"\x00\xff\x80binary",
                &[("a", "1"), ("z", "2")],
                -62_135_596_800_000_000,
                "user-42",
            ),
            msg(
                "5",
                b"x",
                &[("ключ", "значение ✓"), ("emoji 🦀", "日本語")],
                i64::MAX,
                "κλειδί",
            ),
            msg("6", &vec![b'q'; 5000], &[("big", "yes")], i64::MIN, ""),
            msg("", b"", &[], 7, ""),
        ]
    }

    fn assert_layout_a(records: &[Value], messages: &[Message]) {
        assert_eq!(records.len(), messages.len());
        for (r, m) in records.iter().zip(messages) {
            assert_eq!(
                r,
                &Value::Record(vec![("data".into(), Value::Bytes(m.data.to_vec()))])
            );
        }
    }

    fn assert_layout_b(records: &[Value], messages: &[Message]) {
        assert_eq!(records.len(), messages.len());
        for (r, m) in records.iter().zip(messages) {
            let Value::Record(fields) = r else {
                panic!("not a record")
            };
            let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                [
                    "subscription_name",
                    "message_id",
                    "publish_time",
                    "attributes",
                    "data"
                ]
            );
            assert_metadata(r, m);
            assert_eq!(field(r, "data"), &Value::Bytes(m.data.to_vec()));
        }
    }

    #[test]
    fn layout_a_round_trips_with_every_codec() {
        let messages = edge_messages();
        for codec in Codec::ALL {
            for target in [DEFAULT_BLOCK_TARGET, 100, 0] {
                let f = format(AvroLayout::Plain, codec, target);
                let (bytes, _) = write_file(&f, &messages);
                let (schema, records) = read_file(&bytes, codec);
                assert_eq!(
                    schema,
                    apache_avro::Schema::parse_str(PUBSUB_MESSAGE_SCHEMA).unwrap()
                );
                assert_layout_a(&records, &messages);
            }
        }
    }

    #[test]
    fn layout_b_round_trips_with_every_codec() {
        let messages = edge_messages();
        for codec in Codec::ALL {
            for target in [DEFAULT_BLOCK_TARGET, 100, 0] {
                let f = format(AvroLayout::WithMetadata, codec, target);
                let (bytes, _) = write_file(&f, &messages);
                let (schema, records) = read_file(&bytes, codec);
                assert_eq!(
                    schema,
                    apache_avro::Schema::parse_str(PUBSUB_MESSAGE_WITH_METADATA_SCHEMA).unwrap()
                );
                assert_layout_b(&records, &messages);
            }
        }
    }

    #[test]
    fn header_carries_the_schema_text_and_codec_name() {
        for codec in Codec::ALL {
            let f = format(AvroLayout::WithMetadata, codec, DEFAULT_BLOCK_TARGET);
            let (bytes, _) = write_file(&f, &[]);
            let (meta, rest) = read_metadata(&bytes);
            assert_eq!(meta.len(), 2);
            assert_eq!(meta["avro.codec"], codec.avro_name().as_bytes());
            let schema: serde_json::Value = serde_json::from_slice(&meta["avro.schema"]).unwrap();
            let file: serde_json::Value =
                serde_json::from_str(PUBSUB_MESSAGE_WITH_METADATA_SCHEMA).unwrap();
            assert_eq!(schema, file);
            assert!(!meta["avro.schema"].contains(&b'\n'), "schema is minified");
            assert_eq!(rest, SYNC, "empty file: header then sync marker, no blocks");
        }
    }

    #[test]
    fn zero_messages_is_a_valid_empty_container() {
        for codec in Codec::ALL {
            for layout in [AvroLayout::Plain, AvroLayout::WithMetadata] {
                let f = format(layout, codec, DEFAULT_BLOCK_TARGET);
                let (bytes, estimated) = write_file(&f, &[]);
                let (_, records) = read_file(&bytes, codec);
                assert!(records.is_empty());
                assert!(blocks(&bytes).is_empty());
                assert_eq!(estimated, bytes.len());
            }
        }
    }

    #[test]
    fn blocks_flush_at_the_target_size() {
        // Layout A datum of a 9-byte payload = 1 length byte + 9 = 10 bytes.
        let messages: Vec<Message> = (0..25)
            .map(|i| msg(&i.to_string(), b"123456789", &[], 0, ""))
            .collect();
        for codec in Codec::ALL {
            let f = format(AvroLayout::Plain, codec, 30);
            let (bytes, _) = write_file(&f, &messages);
            let counts: Vec<i64> = blocks(&bytes).iter().map(|b| b.0).collect();
            // 3 datums reach 30 bytes; the last 1 is flushed by finish.
            assert_eq!(counts, [3, 3, 3, 3, 3, 3, 3, 3, 1], "{codec}");
            if codec == Codec::Null {
                assert!(blocks(&bytes).iter().all(|b| b.1 == 10 * b.0 as usize));
            }
            // The sync marker appears once after the header and once per block.
            let syncs = bytes.windows(16).filter(|w| *w == SYNC).count();
            assert_eq!(syncs, 1 + counts.len());
            assert_eq!(read_file(&bytes, codec).1.len(), 25);
        }
    }

    #[test]
    fn default_target_keeps_small_files_in_one_block() {
        let messages: Vec<Message> = (0..1000)
            .map(|i| msg(&i.to_string(), &[7; 1000], &[], 0, ""))
            .collect();
        let f = format(AvroLayout::Plain, Codec::Null, DEFAULT_BLOCK_TARGET);
        let (bytes, _) = write_file(&f, &messages);
        assert_eq!(blocks(&bytes), [(1000, 1000 * 1002)]);
        let messages: Vec<Message> = (0..2000)
            .map(|i| msg(&i.to_string(), &[7; 1000], &[], 0, ""))
            .collect();
        let (bytes, _) = write_file(&f, &messages);
        // 1047 datums of 1002 bytes first reach 1 MiB.
        assert_eq!(blocks(&bytes), [(1047, 1047 * 1002), (953, 953 * 1002)]);
    }

    #[test]
    fn a_message_bigger_than_the_target_gets_a_block_of_its_own() {
        let messages = vec![
            msg("1", b"small", &[], 0, ""),
            msg("2", &[1; 10_000], &[], 0, ""),
            msg("3", b"small", &[], 0, ""),
        ];
        for codec in Codec::ALL {
            let f = format(AvroLayout::Plain, codec, 1000);
            let (bytes, _) = write_file(&f, &messages);
            let counts: Vec<i64> = blocks(&bytes).iter().map(|b| b.0).collect();
            assert_eq!(counts, [2, 1], "small + big reach the target together");
            assert_layout_a(&read_file(&bytes, codec).1, &messages);
            let f = format(AvroLayout::Plain, codec, 4);
            let (bytes, _) = write_file(&f, &messages);
            let counts: Vec<i64> = blocks(&bytes).iter().map(|b| b.0).collect();
            assert_eq!(counts, [1, 1, 1]);
            assert_layout_a(&read_file(&bytes, codec).1, &messages);
        }
    }

    #[test]
    fn estimates_add_up_to_the_exact_size_with_codec_null() {
        let messages = edge_messages();
        for layout in [AvroLayout::Plain, AvroLayout::WithMetadata] {
            for target in [0, 1, 50, 100, 1000, 6000, DEFAULT_BLOCK_TARGET] {
                let f = format(layout.clone(), Codec::Null, target);
                let (bytes, estimated) = write_file(&f, &messages);
                assert_eq!(estimated, bytes.len(), "target {target}");
            }
        }
        // Varint growth inside a block: 200 datums of 1 byte (count and size varints grow past 63).
        let tiny: Vec<Message> = (0..200).map(|_| msg("", b"", &[], 0, "")).collect();
        let f = format(AvroLayout::Plain, Codec::Null, DEFAULT_BLOCK_TARGET);
        let (bytes, estimated) = write_file(&f, &tiny);
        assert_eq!(estimated, bytes.len());
    }

    /// The storage writer's placement of messages into files (`Writer::push`): a tentative
    /// encode into the open file, [`Limits::admit`], then commit, or rollback and append to a fresh
    /// file; [`Limits::full`] after each message. Each file's count starts at its header and adds
    /// what the encoder said a message adds — for a moved datum, the old file's tentative figure
    /// (`count_moved_in_new_file == false`, how the writer counted before) or what `append`
    /// returns in the new file. Returns each file's bytes, counted size and message count.
    pub(crate) fn batch_files(
        format: &AvroFormat,
        limits: &crate::batch::Limits,
        messages: &[Message],
        count_moved_in_new_file: bool,
    ) -> Vec<(Vec<u8>, u64, u64)> {
        use crate::batch::{Admit, FileStats};
        struct Open {
            enc: Box<dyn FileEncoder>,
            out: Vec<u8>,
            stats: FileStats,
        }
        let open = || {
            let mut enc = format.new_file(SYNC, None).unwrap();
            let mut out = Vec::new();
            enc.header(&mut out);
            let stats = FileStats {
                bytes: out.len() as u64,
                messages: 0,
            };
            Open { enc, out, stats }
        };
        let close = |mut f: Open, files: &mut Vec<(Vec<u8>, u64, u64)>| {
            f.enc.finish(&mut f.out);
            files.push((f.out, f.stats.bytes, f.stats.messages));
        };
        let mut files = Vec::new();
        let mut scratch = Vec::new();
        let mut current: Option<Open> = None;
        for m in messages {
            let f = current.get_or_insert_with(open);
            let mut len = f.enc.encode_tentative(m, &mut f.out).unwrap() as u64;
            match limits.admit(f.stats, len) {
                Admit::Append => f.enc.commit(&mut f.out),
                Admit::FinalizeFirst(_) => {
                    f.enc.rollback(&mut f.out, &mut scratch);
                    close(current.take().unwrap(), &mut files);
                    let f = current.insert(open());
                    let moved = f.enc.append(&scratch, &mut f.out) as u64;
                    if count_moved_in_new_file {
                        len = moved;
                    }
                }
            }
            let f = current.as_mut().unwrap();
            f.stats.bytes += len;
            f.stats.messages += 1;
            if limits.full(f.stats).is_some() {
                close(current.take().unwrap(), &mut files);
            }
        }
        if let Some(f) = current {
            close(f, &mut files);
        }
        files
    }

    fn max_bytes(max: u64) -> crate::batch::Limits {
        crate::batch::Limits {
            max_duration: std::time::Duration::from_secs(600),
            max_bytes: Some(max),
            max_messages: None,
        }
    }

    /// Issue 13's numbers: layout A with `maxBytes: 1000` made objects of 1001 bytes from 100-byte
    /// messages and 1014 bytes from 5-byte ones, because a datum moved to a fresh file was counted
    /// as the joiner it had been in the full file, not as the opener of the new file's first block
    /// (sync marker and two varints). Counted where it lands, every object is within the limit and
    /// its size is exactly what was counted.
    #[test]
    fn avro_objects_stay_within_max_bytes_when_a_message_moves_to_the_next_file() {
        let f = format(AvroLayout::Plain, Codec::Null, DEFAULT_BLOCK_TARGET);
        for (count, size, old_max) in [(60, 100, 1001), (400, 5, 1014)] {
            let messages: Vec<Message> = (0..count)
                .map(|i| msg(&i.to_string(), &vec![b'x'; size], &[], 0, ""))
                .collect();
            let before = batch_files(&f, &max_bytes(1000), &messages, false);
            let largest = before.iter().map(|(b, _, _)| b.len()).max().unwrap();
            assert_eq!(largest, old_max, "{count} x {size} B: the issue's figure");
            let files = batch_files(&f, &max_bytes(1000), &messages, true);
            for (bytes, counted, n) in &files {
                assert!(
                    bytes.len() <= 1000,
                    "{count} x {size} B: {} bytes, {n} messages",
                    bytes.len()
                );
                assert_eq!(bytes.len() as u64, *counted);
            }
            let total: u64 = files.iter().map(|f| f.2).sum();
            assert_eq!(total, count);
        }
    }

    /// With a compressing codec the count is the codec's worst case, so even incompressible
    /// payloads (which every codec makes larger) give objects within `maxBytes`, and no object
    /// is larger than its count.
    #[test]
    fn compressed_objects_stay_within_max_bytes_even_for_incompressible_payloads() {
        let mut x: u32 = 1;
        let messages: Vec<Message> = (0..400)
            .map(|i| {
                let data: Vec<u8> = (0..97)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        x as u8
                    })
                    .collect();
                msg(&i.to_string(), &data, &[], 0, "")
            })
            .collect();
        for codec in [Codec::Deflate, Codec::Snappy, Codec::Zstd] {
            for target in [0, 500, DEFAULT_BLOCK_TARGET] {
                let f = format(AvroLayout::Plain, codec, target);
                let files = batch_files(&f, &max_bytes(1000), &messages, true);
                for (bytes, counted, n) in &files {
                    assert!(
                        bytes.len() <= 1000 || *n == 1,
                        "{codec} target {target}: {} bytes, {n} messages",
                        bytes.len()
                    );
                    assert!(bytes.len() as u64 <= *counted, "{codec} target {target}");
                }
                let total: u64 = files.iter().map(|f| f.2).sum();
                assert_eq!(total, 400);
            }
        }
    }

    #[test]
    fn estimates_bound_compressed_files() {
        let messages: Vec<Message> = (0..500)
            .map(|i| msg(&i.to_string(), &[b'a'; 300], &[], 0, ""))
            .collect();
        for codec in [Codec::Deflate, Codec::Snappy, Codec::Zstd] {
            let f = format(AvroLayout::WithMetadata, codec, 10_000);
            let (bytes, estimated) = write_file(&f, &messages);
            assert!(
                bytes.len() < estimated,
                "{codec}: {} >= {estimated}",
                bytes.len()
            );
        }
    }

    #[test]
    fn layout_b_datum_bytes_are_exact() {
        // Attributes in BTreeMap order, the ordering key merged in at its sorted position.
        let m = msg("7", b"hi", &[("a", "1"), ("z", "2")], -3, "k");
        let f = format(AvroLayout::WithMetadata, Codec::Null, DEFAULT_BLOCK_TARGET);
        let mut enc = f.new_file(SYNC, None).unwrap();
        let mut scratch = Vec::new();
        enc.encode(&m, &mut scratch).unwrap();
        let mut expected = Vec::new();
        expected.push(2 * SUBSCRIPTION.len() as u8);
        expected.extend_from_slice(SUBSCRIPTION.as_bytes());
        expected.extend_from_slice(b"\x027"); // message_id
        expected.push(5); // publish_time -3 zig-zag
        expected.push(6); // map block of 3 entries
        expected.extend_from_slice(b"\x02a\x021");
        expected.extend_from_slice(b"\x18ordering_key\x02k");
        expected.extend_from_slice(b"\x02z\x022");
        expected.push(0); // end of map
        expected.extend_from_slice(b"\x04hi");
        assert_eq!(scratch, expected);

        // No attributes, no key: the map is a single 0.
        let m = msg("", b"", &[], 0, "");
        enc.encode(&m, &mut scratch).unwrap();
        let mut expected = Vec::new();
        expected.push(2 * SUBSCRIPTION.len() as u8);
        expected.extend_from_slice(SUBSCRIPTION.as_bytes());
        expected.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(scratch, expected);
    }

    #[test]
    fn ordering_key_is_inserted_only_when_non_empty_and_wins_over_an_attribute() {
        let messages = vec![
            msg("1", b"x", &[("ordering_key", "from attribute")], 0, ""),
            msg(
                "2",
                b"x",
                &[("ordering_key", "from attribute"), ("p", "q")],
                0,
                "real key",
            ),
            msg("3", b"x", &[("a", "b")], 0, ""),
            msg("4", b"x", &[("zz", "b")], 0, "k"),
            msg("5", b"x", &[], 0, "k"),
        ];
        let f = format(AvroLayout::WithMetadata, Codec::Null, DEFAULT_BLOCK_TARGET);
        let (bytes, _) = write_file(&f, &messages);
        let (_, records) = read_file(&bytes, Codec::Null);
        let attrs = |i: usize| match field(&records[i], "attributes") {
            Value::Map(m) => m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => (k.clone(), s.clone()),
                    other => panic!("{other:?}"),
                })
                .collect::<BTreeMap<_, _>>(),
            other => panic!("{other:?}"),
        };
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(attrs(0), map(&[("ordering_key", "from attribute")]));
        assert_eq!(attrs(1), map(&[("ordering_key", "real key"), ("p", "q")]));
        assert_eq!(attrs(2), map(&[("a", "b")]));
        assert_eq!(attrs(3), map(&[("ordering_key", "k"), ("zz", "b")]));
        assert_eq!(attrs(4), map(&[("ordering_key", "k")]));
    }

    #[test]
    fn format_properties() {
        let f = format(AvroLayout::WithMetadata, Codec::Null, DEFAULT_BLOCK_TARGET);
        let m = msg("1", b"x", &[("googclient_schemarevisionid", "abc")], 0, "");
        assert_eq!(f.content_type(), AVRO_CONTENT_TYPE);
        assert_eq!(
            f.group_key(&m),
            None,
            "only topic-schema layouts split by revision"
        );
        assert_eq!(f.codec(), Codec::Null);
        assert_eq!(f.block_target(), DEFAULT_BLOCK_TARGET);
    }

    #[test]
    fn codec_names_parse_and_print() {
        for codec in Codec::ALL {
            assert_eq!(codec.config_name().parse::<Codec>().unwrap(), codec);
            assert_eq!(codec.avro_name().parse::<Codec>().unwrap(), codec);
            assert_eq!(codec.to_string(), codec.config_name());
        }
        assert_eq!(Codec::default(), Codec::Null);
        assert_eq!("zstd".parse::<Codec>().unwrap().avro_name(), "zstandard");
        let err = "gzip".parse::<Codec>().unwrap_err();
        assert_eq!(err, UnknownCodec("gzip".into()));
        assert!(err.to_string().contains("null, deflate, snappy, zstd"));
    }

    #[test]
    fn varints_match_the_avro_encoding() {
        for n in [
            0i64,
            -1,
            1,
            63,
            -64,
            64,
            -65,
            8191,
            8192,
            i32::MAX as i64,
            i64::MAX,
            i64::MIN,
        ] {
            let mut ours = Vec::new();
            put_long(&mut ours, n);
            assert_eq!(ours.len(), long_len(n), "{n}");
            let mut theirs: &[u8] = &ours;
            assert_eq!(read_long(&mut theirs), n);
            let reference =
                apache_avro::writer::datum::GenericDatumWriter::builder(&apache_avro::Schema::Long)
                    .build()
                    .unwrap()
                    .write_value_to_vec(Value::Long(n))
                    .unwrap();
            assert_eq!(ours, reference, "{n}");
        }
    }

    #[test]
    fn minify_keeps_strings_and_order() {
        assert_eq!(
            minify_json("{ \"b\" : \"x y\\\" z\",\n \"a\": [1, 2] }"),
            "{\"b\":\"x y\\\" z\",\"a\":[1,2]}"
        );
    }

    /// Steady-state encoding of layout B must not allocate: only the scratch, block and output
    /// `Vec`s may grow, and once they are large enough nothing allocates at all.
    #[test]
    fn layout_b_encodes_without_allocating_per_message() {
        let messages: Vec<Message> = (0..64)
            .map(|i| {
                msg(
                    &format!("{}", 1_000_000 + i),
                    &[b'x'; 1024],
                    &[("attr-one", "value"), ("attr-two", "value"), ("three", "3")],
                    1_700_000_000_000_000 + i,
                    if i % 2 == 0 { "key" } else { "" },
                )
            })
            .collect();
        for codec in Codec::ALL {
            let f = format(AvroLayout::WithMetadata, codec, 16 * 1024);
            let mut enc = f.new_file(SYNC, None).unwrap();
            let mut scratch = Vec::new();
            let mut out = Vec::with_capacity(64 << 20);
            enc.header(&mut out);
            // Warm up: grow the scratch and block buffers and the codec's buffers once.
            for m in messages.iter().cycle().take(200) {
                enc.encode(m, &mut scratch).unwrap();
                enc.append(&scratch, &mut out);
            }
            let before = alloc_count::get();
            for m in messages.iter().cycle().take(5000) {
                enc.encode(m, &mut scratch).unwrap();
                enc.append(&scratch, &mut out);
            }
            let allocations = alloc_count::get() - before;
            let probe = alloc_count::get();
            drop(std::hint::black_box(Box::new(1u64)));
            assert!(
                alloc_count::get() > probe,
                "the counting allocator is active"
            );
            assert_eq!(allocations, 0, "{codec}: {allocations} allocations");
            enc.finish(&mut out);
            assert_eq!(read_file(&out, codec).1.len(), 5200);
        }
    }

    /// A counting global allocator for the allocation test; counts per thread so tests running in
    /// parallel do not disturb each other.
    mod alloc_count {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static COUNT: Cell<u64> = const { Cell::new(0) };
        }

        pub fn get() -> u64 {
            COUNT.with(Cell::get)
        }

        fn bump() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }

        struct Counting;

        #[global_allocator]
        static GLOBAL: Counting = Counting;

        // SAFETY: every call is forwarded unchanged to the system allocator.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                bump();
                unsafe { System.alloc(layout) }
            }
            unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
                bump();
                unsafe { System.alloc_zeroed(layout) }
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                bump();
                unsafe { System.realloc(ptr, layout, new_size) }
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                unsafe { System.dealloc(ptr, layout) }
            }
        }
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn arb_message() -> impl Strategy<Value = Message> {
            (
                proptest::collection::vec(any::<u8>(), 0..2000),
                proptest::collection::btree_map(".{0,12}", ".{0,20}", 0..6),
                "[0-9]{0,20}",
                any::<i64>(),
                prop_oneof![
                    Just(String::new()),
                    ".{1,10}",
                    Just("ordering_key".to_string())
                ],
            )
                .prop_map(
                    |(data, attributes, message_id, publish_time_micros, ordering_key)| Message {
                        data: data.into(),
                        attributes: attributes.into(),
                        message_id,
                        publish_time_micros,
                        ordering_key,
                    },
                )
        }

        fn arb_messages() -> impl Strategy<Value = Vec<Message>> {
            proptest::collection::vec(arb_message(), 0..40).prop_map(|mut ms| {
                // Now and then give a message an `ordering_key` attribute to collide with.
                for (i, m) in ms.iter_mut().enumerate() {
                    if i % 7 == 3 {
                        m.attributes.insert("ordering_key".into(), "attr".into());
                    }
                }
                ms
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]

            /// Whatever the layout, codec, payloads, message sizes, block size and limit: every
            /// object holds at most `maxBytes` bytes or a single message, its size on disk is
            /// exactly the writer's count (codec null; at most the count with compression), and
            /// every message is in it once and in order.
            #[test]
            fn avro_objects_never_exceed_max_bytes_and_match_the_count(
                sizes in proptest::collection::vec(prop_oneof![0usize..20, 0usize..300, 0usize..3000], 1..250),
                with_metadata in any::<bool>(),
                target in prop_oneof![Just(0usize), 1usize..4000, Just(DEFAULT_BLOCK_TARGET)],
                max in prop_oneof![1000u64..1100, 1000u64..20_000],
                codec in proptest::sample::select(Codec::ALL.to_vec()),
                noisy in any::<bool>(),
            ) {
                let layout = if with_metadata { AvroLayout::WithMetadata } else { AvroLayout::Plain };
                let f = format(layout, codec, target);
                // Repeated bytes compress; xorshift noise does not (every codec then adds bytes).
                let mut x = 0x9e37_79b9u32;
                let messages: Vec<Message> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| {
                        let data: Vec<u8> = (0..n)
                            .map(|_| {
                                x ^= x << 13;
                                x ^= x >> 17;
                                x ^= x << 5;
                                if noisy { x as u8 } else { (i % 251) as u8 }
                            })
                            .collect();
                        msg(&i.to_string(), &data, &[("k", "v")], i as i64, "")
                    })
                    .collect();
                let files = batch_files(&f, &max_bytes(max), &messages, true);
                let mut next = 0;
                for (bytes, counted, n) in &files {
                    if codec == Codec::Null {
                        prop_assert_eq!(bytes.len() as u64, *counted);
                    } else {
                        prop_assert!(bytes.len() as u64 <= *counted, "{}: {} > count {}", codec, bytes.len(), counted);
                    }
                    prop_assert!(bytes.len() as u64 <= max || *n == 1, "{} bytes > {} with {} messages", bytes.len(), max, n);
                    let (_, records) = read_file(bytes, codec);
                    prop_assert_eq!(records.len() as u64, *n);
                    for r in &records {
                        let want = Value::Bytes(messages[next].data.to_vec());
                        prop_assert_eq!(field(r, "data"), &want);
                        next += 1;
                    }
                }
                prop_assert_eq!(next, messages.len());
            }

            #[test]
            fn layout_b_round_trips(
                messages in arb_messages(),
                codec in proptest::sample::select(Codec::ALL.to_vec()),
                target in prop_oneof![Just(0usize), 1usize..5000, Just(DEFAULT_BLOCK_TARGET)],
            ) {
                let f = format(AvroLayout::WithMetadata, codec, target);
                let (bytes, estimated) = write_file(&f, &messages);
                let (_, records) = read_file(&bytes, codec);
                assert_layout_b(&records, &messages);
                if codec == Codec::Null {
                    prop_assert_eq!(estimated, bytes.len());
                }
                let total: i64 = blocks(&bytes).iter().map(|b| b.0).sum();
                prop_assert_eq!(total as usize, messages.len());
            }
        }
    }
}

#[cfg(test)]
mod revision_tests {
    use super::*;
    use crate::avro::FetchRevision;

    const V1: &str = r#"{"type":"record","name":"E","fields":[{"name":"a","type":"long"}]}"#;
    const V2: &str = r#"{"type":"record","name":"E","fields":[{"name":"a","type":"long"},{"name":"b","type":"long"}]}"#;

    /// "r2" is V2; "down" cannot be read; anything else does not exist.
    #[derive(Debug)]
    struct Fetch;

    impl FetchRevision for Fetch {
        fn fetch(&self, revision: &str) -> Result<Option<TopicSchema>, String> {
            match revision {
                "r2" => Ok(Some(V2.parse().unwrap())),
                "down" => Err("unavailable".into()),
                _ => Ok(None),
            }
        }
    }

    fn header_schema(f: &AvroFormat, revision: &str) -> Result<String, EncodeError> {
        let mut enc = f.new_file([7; 16], Some(revision))?;
        let mut out = Vec::new();
        enc.header(&mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        Ok(if text.contains(r#""name":"b""#) {
            "v2"
        } else {
            "v1"
        }
        .to_string())
    }

    #[test]
    fn each_revision_gets_its_writer_and_an_unreadable_one_is_refused() {
        let schemas = TopicSchemas::new(
            V1.parse().unwrap(),
            [("r1".to_string(), V1.parse().unwrap())].into(),
        )
        .with_fetch(Arc::new(Fetch));
        let f = AvroFormat::for_topic(&schemas, false, "s".into(), Codec::Null, 1 << 20).unwrap();
        assert_eq!(header_schema(&f, "r1").unwrap(), "v1");
        assert_eq!(
            header_schema(&f, "r2").unwrap(),
            "v2",
            "fetched when first met"
        );
        assert_eq!(
            header_schema(&f, "gone").unwrap(),
            "v1",
            "no such revision: the fallback"
        );
        let e = header_schema(&f, "down").unwrap_err();
        assert!(
            matches!(&e, EncodeError::SchemaUnavailable { revision, .. } if revision == "down"),
            "{e}"
        );
    }
}
