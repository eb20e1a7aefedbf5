//! What the sinks share of a batch's size: a message's bytes as the batch limits count them,
//! and the rows a table sink converts before it hands them on as one record batch.

use crate::message::Message;

/// Rows handed on at a time (at most): to a Delta batch's encoder, into a BigQuery batch's next
/// request.
pub const CHUNK_ROWS: usize = 8192;

/// Message bytes as the batch limits count them: payload plus attribute keys and values.
pub fn message_bytes(m: &Message) -> u64 {
    (m.data.len() + m.attributes.text_len()) as u64
}
