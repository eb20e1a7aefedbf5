//! Why a message cannot become a row: the vocabulary of failures that the row builder
//! ([`super::batch`]) and the topic-schema mapping ([`super::topic`]) share.

/// What kind of rule a message broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowErrorKind {
    /// A message field that is not a column, without `drop_unknown_fields`.
    UnknownField,
    /// A REQUIRED column absent from the message or `null`.
    MissingRequired,
    /// A value that does not convert to its column's type (or a payload that is not JSON).
    Invalid,
}

/// Why one message cannot become a row. It is never retryable: the same message fails the same
/// way, so it is nacked until it is dead-lettered (docs/contract.md §4.6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message {message_id:?}: field `{field}`: {reason}")]
pub struct RowError {
    pub message_id: String,
    /// Dotted path of the field (`payload.items[2].sku`), or `$` for the payload as a whole.
    pub field: String,
    pub kind: RowErrorKind,
    pub reason: String,
}

/// A field-level failure before the message id is attached.
pub(super) struct Fail {
    pub(super) field: String,
    pub(super) kind: RowErrorKind,
    pub(super) reason: String,
}
