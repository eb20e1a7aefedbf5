//! The Avro layer under both writers: the Avro container files of [`crate::encode`] and the
//! use_topic_schema rows of [`crate::table`] read topic-schema messages through it, and neither
//! depends on the other.
//!
//! | file | what it holds |
//! |---|---|
//! | `wire` | the binary encoding's building blocks: zig-zag varints, length-prefixed bytes, compact schema text |
//! | [`types`] | one description of Avro types: named types and references ([`Names`]), type names, their readable form |
//! | [`encoding`] | how a message says what its data is: [`SchemaEncoding`], the `googclient_schema*` attributes, the revision |
//! | [`topic`] | [`TopicSchema`]: the topic's schema parsed once; a message's datum as bytes or as a value |
//! | `json` | Avro JSON → Avro binary, guided by the schema |
//! | [`path`] | [`DatumPath`]: where in a datum a value is |
//! | [`error`] | [`SchemaError`] (startup), [`DatumError`] (per message: kind, encoding, path, reason) |

pub mod encoding;
pub mod error;
mod json;
pub mod path;
pub mod topic;
pub mod types;
pub(crate) mod wire;

pub use encoding::{SchemaEncoding, UnknownEncoding, ENCODING_ATTRIBUTE, REVISION_ID_ATTRIBUTE};
pub use error::{DatumError, DatumErrorKind, SchemaError};
pub use path::{DatumPath, Segment};
pub use topic::{
    FetchRevision, TopicSchema, TopicSchemaSource, TopicSchemas, RESERVED_METADATA_FIELDS,
};
pub use types::Names;
