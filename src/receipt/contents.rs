//! [`FileContents`]: what a file holds, for settling and for error messages.

use super::AckRef;
use crate::checkpoint_file::Span;
use crate::message::Received;

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
    /// ([`crate::sink::Sink::rejects_rows`]): every message with its receipt, in push order, so
    /// a rejected one can be settled alone. Empty otherwise.
    pub held: Vec<Received>,
}
