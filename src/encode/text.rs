//! Text format (docs/contract.md §3.6): the raw `data` bytes of each message followed by `\n`.
//!
//! Only the payload is stored — no attributes, ids, publish times or ordering keys (docs/contract.md §3.6,
//! Q16). Payloads are written verbatim: a payload that itself contains `\n` splits visually, exactly
//! as in Pub/Sub's own output, because no escaping is documented.
//!
//! Every record is newline-*terminated*, including the last one (docs/contract.md §6 Q4), so an object is valid
//! JSON Lines when the payloads are JSON, and concatenating two objects never glues two records.

use super::{EncodeError, FileEncoder, FileFormat};
use crate::message::Message;

/// The Text output format: `data + "\n"` per message, `Content-Type: text/plain`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TextFormat;

impl FileFormat for TextFormat {
    fn content_type(&self) -> &'static str {
        "text/plain"
    }

    fn group_key(&self, _msg: &Message) -> Option<String> {
        None
    }

    fn new_file(
        &self,
        _sync_marker: [u8; 16],
        _group_key: Option<&str>,
    ) -> Result<Box<dyn FileEncoder>, EncodeError> {
        Ok(Box::new(TextEncoder::default()))
    }
}

/// Per-file state of the Text format: no header, no trailer; only where a tentative datum starts.
#[derive(Default)]
struct TextEncoder {
    tentative: usize,
}

impl FileEncoder for TextEncoder {
    fn header(&mut self, _out: &mut Vec<u8>) {}

    /// Exact: the message adds `data.len() + 1` bytes to the file.
    fn encode(&mut self, msg: &Message, scratch: &mut Vec<u8>) -> Result<usize, EncodeError> {
        scratch.clear();
        scratch.reserve(msg.data.len() + 1);
        scratch.extend_from_slice(&msg.data);
        scratch.push(b'\n');
        Ok(scratch.len())
    }

    fn append(&mut self, datum: &[u8], out: &mut Vec<u8>) -> usize {
        out.extend_from_slice(datum);
        datum.len()
    }

    fn finish(&mut self, _out: &mut Vec<u8>) {}

    fn encode_tentative(&mut self, msg: &Message, out: &mut Vec<u8>) -> Result<usize, EncodeError> {
        self.tentative = out.len();
        out.extend_from_slice(&msg.data);
        out.push(b'\n');
        Ok(msg.data.len() + 1)
    }

    fn commit(&mut self, _out: &mut Vec<u8>) {}

    fn rollback(&mut self, out: &mut Vec<u8>, datum: &mut Vec<u8>) {
        datum.clear();
        datum.extend_from_slice(&out[self.tentative..]);
        out.truncate(self.tentative);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(data: &[u8]) -> Message {
        Message {
            data: bytes::Bytes::copy_from_slice(data),
            message_id: "1".into(),
            ..Message::default()
        }
    }

    /// Runs a whole file through the encoder the way the batcher does.
    fn write_file(messages: &[Message]) -> (Vec<u8>, usize) {
        let format = TextFormat;
        let mut enc = format.new_file([0; 16], None).unwrap();
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

    #[test]
    fn every_record_is_newline_terminated() {
        let (out, estimated) = write_file(&[msg(b"a"), msg(b"{\"k\":1}"), msg(b"last")]);
        assert_eq!(out, b"a\n{\"k\":1}\nlast\n");
        assert_eq!(estimated, out.len(), "the size estimate is exact for text");
    }

    #[test]
    fn empty_payload_is_an_empty_line_and_payload_newlines_are_not_escaped() {
        let (out, _) = write_file(&[msg(b""), msg(b"x\ny"), msg(b"\xff\x00")]);
        assert_eq!(out, b"\nx\ny\n\xff\x00\n");
    }

    #[test]
    fn no_messages_is_an_empty_object() {
        let (out, estimated) = write_file(&[]);
        assert!(out.is_empty());
        assert_eq!(estimated, 0);
    }

    #[test]
    fn only_the_payload_is_written() {
        let mut m = msg(b"payload");
        m.attributes.insert("k".into(), "v".into());
        m.ordering_key = "key".into();
        m.publish_time_micros = 42;
        let (out, _) = write_file(&[m]);
        assert_eq!(out, b"payload\n");
    }

    #[test]
    fn format_properties() {
        let m = msg(b"x");
        assert_eq!(TextFormat.content_type(), "text/plain");
        assert_eq!(TextFormat.group_key(&m), None);
    }
}
