//! Encoders: how a batch of messages becomes the bytes of one object (docs/contract.md §3.6, §3.7).
//!
//! Formats are *whole-file* encoders: a file has a header (Avro container header), a body built
//! message by message, and a trailer (the last Avro block). The batcher needs to know how many
//! bytes a message adds *before* it is added, so encoding is split in two steps:
//! [`FileEncoder::encode`] renders one message into a scratch buffer (and may fail on bad input,
//! e.g. a message that does not match the topic schema), and [`FileEncoder::append`] commits the
//! rendered datum to the file.

pub mod avro;
pub mod text;
pub mod topic;

use crate::message::Message;

/// Errors of a single message that cannot be encoded. The message is not written; the error names
/// the message id and the rule broken.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("message {message_id}: {reason}")]
    BadMessage { message_id: String, reason: String },
    /// The schema revision a message names could not be read (Pub/Sub did not answer): the
    /// message is not written with another revision's schema, and is tried again later.
    #[error("topic schema revision {revision} cannot be read now: {reason}")]
    SchemaUnavailable { revision: String, reason: String },
}

/// A factory of per-file encoders for one output format.
pub trait FileFormat: Send + Sync {
    /// `Content-Type` of the objects written.
    fn content_type(&self) -> &'static str;
    /// Messages whose keys differ are written to different files (topic-schema revisions, docs/contract.md §6 Q8).
    /// `None` for formats where every message fits in one file.
    fn group_key(&self, msg: &Message) -> Option<String>;
    /// Start a new file. `sync_marker` is the Avro sync marker (ignored by Text).
    /// `group_key` is what [`FileFormat::group_key`] returned for the file's messages.
    fn new_file(
        &self,
        sync_marker: [u8; 16],
        group_key: Option<&str>,
    ) -> Result<Box<dyn FileEncoder>, EncodeError>;
    /// Can [`FileFormat::check`] refuse a message (a topic schema)? When not, it is not called.
    fn checks_messages(&self) -> bool {
        false
    }
    /// Would `msg` be refused, alone, when encoded into a file of its group? The same rule as
    /// [`FileEncoder::encode`], without a file: the push endpoint's checks before accept.
    fn check(&self, _msg: &Message) -> Result<(), EncodeError> {
        Ok(())
    }
}

/// The encoder of one open file.
pub trait FileEncoder: Send {
    /// Write the file header (if any) into `out`. Called once, before anything else.
    fn header(&mut self, out: &mut Vec<u8>);
    /// Render `msg` into `scratch` (cleared first). Returns the number of bytes the message adds to
    /// *this* file when appended next, block overhead included (docs/contract.md §3.5): exact for
    /// Text and uncompressed Avro, the uncompressed size for compressed Avro.
    fn encode(&mut self, msg: &Message, scratch: &mut Vec<u8>) -> Result<usize, EncodeError>;
    /// Append a datum rendered by `encode` (or taken back by [`FileEncoder::rollback`] from
    /// another file) to this file; may write finished blocks to `out`. Returns the bytes the datum
    /// adds to *this* file, block overhead included — what `encode` would have returned here. A
    /// caller moving a datum from one file to another must count this figure, not the one the
    /// other file gave: the first datum of a file opens its first Avro block (sync marker, count
    /// and size), which a datum joining an open block did not pay for.
    fn append(&mut self, datum: &[u8], out: &mut Vec<u8>) -> usize;
    /// Write everything still pending (the last block) into `out`. Called once, at finalize.
    fn finish(&mut self, out: &mut Vec<u8>);

    /// The fast path of `encode` + `append`: render `msg` straight into the file (or its open
    /// block) as a *tentative* datum and return the bytes it adds. The caller then calls exactly
    /// one of [`FileEncoder::commit`] (keep it) or [`FileEncoder::rollback`] (take it back out, to
    /// append it to another file), and touches `out` only after that. On error nothing stays behind.
    fn encode_tentative(&mut self, msg: &Message, out: &mut Vec<u8>) -> Result<usize, EncodeError>;
    /// Keep the tentative datum; may write finished blocks to `out`.
    fn commit(&mut self, out: &mut Vec<u8>);
    /// Remove the tentative datum from the file and put its bytes into `datum` (cleared first),
    /// ready for [`FileEncoder::append`] on another file, whose return value is then the datum's
    /// size there.
    fn rollback(&mut self, out: &mut Vec<u8>, datum: &mut Vec<u8>);
    /// Bytes of memory the encoder holds for data not in `out` yet (an Avro file's open block,
    /// as allocated): the memory budget counts them with the file.
    fn pending(&self) -> usize {
        0
    }
}
