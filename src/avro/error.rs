//! The errors of the Avro layer: a topic schema that cannot be used ([`SchemaError`], found at
//! startup) and a message whose data is not a datum of it ([`DatumError`], per message, with the
//! failing step as a [`DatumErrorKind`] and the place as a [`DatumPath`]).

use std::fmt;
use std::path::PathBuf;

use super::encoding::{SchemaEncoding, UnknownEncoding};
use super::path::DatumPath;

/// A topic schema that cannot be used. Found at startup, never while messages flow.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    #[error("cannot read the topic schema {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the topic schema is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the topic schema is not a valid Avro schema: {0}")]
    Avro(String),
    #[error(
        "write_metadata with use_topic_schema needs a topic schema whose root is a record, \
         this one is a {0}; turn write_metadata off or wrap the type in a record"
    )]
    RootNotRecord(String),
    #[error(
        "the topic schema already has field(s) {} that write_metadata adds; rename them in the \
         topic schema or turn write_metadata off",
        .0.join(", ")
    )]
    MetadataFieldConflict(Vec<String>),
    #[error("unknown schema encoding {0:?}: use JSON or BINARY")]
    UnknownEncoding(String),
}

impl From<UnknownEncoding> for SchemaError {
    fn from(e: UnknownEncoding) -> Self {
        SchemaError::UnknownEncoding(e.0)
    }
}

/// Which step of reading a topic-schema message failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatumErrorKind {
    /// The `googclient_schemaencoding` attribute is neither `JSON` nor `BINARY`.
    UnknownEncoding,
    /// A JSON message whose data is not JSON.
    NotJson,
    /// A JSON message whose value does not fit the schema; the path says where.
    Mismatch,
    /// The datum (BINARY, or JSON once converted) does not decode completely with the schema.
    Decode,
}

/// Why a message's data is not a datum of the topic schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatumError {
    pub kind: DatumErrorKind,
    /// The encoding the message was read with (for [`DatumErrorKind::UnknownEncoding`], the
    /// default, as the attribute did not name one).
    pub encoding: SchemaEncoding,
    /// Where in the value ([`DatumErrorKind::Mismatch`]); the root for the other kinds.
    pub path: DatumPath,
    /// What is wrong, without the path.
    pub reason: String,
}

impl DatumError {
    pub(crate) fn new(kind: DatumErrorKind, encoding: SchemaEncoding, reason: String) -> Self {
        DatumError {
            kind,
            encoding,
            path: DatumPath::default(),
            reason,
        }
    }
}

impl std::error::Error for DatumError {}

impl fmt::Display for DatumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let encoding = self.encoding;
        match self.kind {
            DatumErrorKind::UnknownEncoding => f.write_str(&self.reason),
            DatumErrorKind::NotJson => write!(f, "JSON data is not valid JSON: {}", self.reason),
            DatumErrorKind::Mismatch => write!(
                f,
                "JSON data does not match the topic schema: at {}: {}",
                self.path, self.reason
            ),
            DatumErrorKind::Decode => write!(
                f,
                "{encoding} data does not decode with the topic schema: {}",
                self.reason
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::avro::path::Segment;

    #[test]
    fn errors_print_the_kind_path_and_reason() {
        let mut e = DatumError::new(
            DatumErrorKind::Mismatch,
            SchemaEncoding::Json,
            "missing field".into(),
        );
        e.path.push_outer(Segment::Field("qty".into()));
        assert_eq!(
            e.to_string(),
            "JSON data does not match the topic schema: at $.qty: missing field"
        );
        let e = DatumError::new(DatumErrorKind::Decode, SchemaEncoding::Binary, "eof".into());
        assert_eq!(
            e.to_string(),
            "BINARY data does not decode with the topic schema: eof"
        );
    }
}
