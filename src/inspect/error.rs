//! What `inspect` fails with ([`InspectError`]), and what every reader shares: the summary it may
//! return and one NDJSON line written.

use std::io::Write;

use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {reason}")]
    Store { what: String, reason: String },
    #[error("{what}: not an Avro object: {reason}")]
    Avro { what: String, reason: String },
    #[error("{what}: not a Parquet file: {reason}")]
    Parquet { what: String, reason: String },
    #[error("{what}: Delta table: {reason}")]
    Delta { what: String, reason: String },
    #[error("{what}: {reason}")]
    Unsupported { what: String, reason: String },
    /// Neither an object nor a prefix (or folder) with objects below it.
    #[error(
        "{what}: neither an object nor a prefix (or folder) holding objects: nothing to inspect"
    )]
    Nothing { what: String },
    #[error("{name}: does not follow the naming rule of {subscription}: {mismatch}")]
    Name {
        name: String,
        subscription: String,
        #[source]
        mismatch: Box<crate::paths::PathMismatch>,
    },
}

/// A reader's `--summary` object (`None`: the records were printed).
pub(super) type Summary = Option<Map<String, Value>>;

pub(super) fn write_line(out: &mut dyn Write, what: &str, v: &Value) -> Result<(), InspectError> {
    writeln!(out, "{v}").map_err(|source| InspectError::Io {
        what: what.into(),
        source,
    })
}
