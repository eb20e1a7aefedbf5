//! How a topic-schema message says what its data is: the attributes Pub/Sub sets on a
//! schema-validated message (docs/contract.md §1.2) and the two encodings of a datum.

use std::fmt;
use std::str::FromStr;

use crate::message::Message;

/// Attribute naming the schema revision a message was validated against (docs/contract.md §1.2).
pub const REVISION_ID_ATTRIBUTE: &str = "googclient_schemarevisionid";
/// Attribute naming the encoding of a schema-validated message, `JSON` or `BINARY`
/// (docs/contract.md §1.2).
pub const ENCODING_ATTRIBUTE: &str = "googclient_schemaencoding";

/// How a message's `data` encodes the topic-schema datum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SchemaEncoding {
    /// Avro JSON encoding. The default when neither the message nor the caller says otherwise
    /// (our choice: a wrong guess of JSON fails loudly on binary data, and JSON is what
    /// hand-published test messages use).
    #[default]
    Json,
    /// Avro binary encoding of one datum.
    Binary,
}

impl fmt::Display for SchemaEncoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SchemaEncoding::Json => "JSON",
            SchemaEncoding::Binary => "BINARY",
        })
    }
}

/// An encoding name that is neither `JSON` nor `BINARY`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown schema encoding {0:?}: use JSON or BINARY")]
pub struct UnknownEncoding(pub String);

impl FromStr for SchemaEncoding {
    type Err = UnknownEncoding;

    /// `JSON` or `BINARY`, case-insensitive (Pub/Sub writes them upper-case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("json") {
            Ok(SchemaEncoding::Json)
        } else if s.eq_ignore_ascii_case("binary") {
            Ok(SchemaEncoding::Binary)
        } else {
            Err(UnknownEncoding(s.to_owned()))
        }
    }
}

/// The schema revision a message was validated against, from `googclient_schemarevisionid`.
pub fn revision_of(msg: &Message) -> Option<&str> {
    msg.attributes.get(REVISION_ID_ATTRIBUTE)
}
