//! Topic schemas: Avro layouts C and D (SPEC §3.7, Q7, Q8).
//!
//! With `use_topic_schema`, each message's `data` is a datum of the topic's Avro schema, published
//! either as Avro JSON or as Avro binary (`googclient_schemaencoding` says which, SPEC §1.2). The
//! writer decodes it and writes it as one datum of the output file:
//!
//! * **BINARY**: the data is decoded with `apache_avro` against the schema (it must decode
//!   completely, no trailing bytes); the original bytes are then written unchanged.
//! * **JSON**: the data is parsed as JSON and converted, guided by the schema, straight to Avro
//!   binary (see [Avro JSON accepted](#avro-json-accepted)); the result is then decoded with
//!   `apache_avro` like a BINARY message, so a file never holds a datum the reference
//!   implementation cannot read.
//!
//! A message that fails either way is an [`EncodeError::BadMessage`] naming the message id, the
//! encoding and the place in the datum that failed.
//!
//! # Avro JSON accepted
//!
//! Pub/Sub validates JSON messages with the Avro JSON encoding (a third-party report, e.g.
//! `Ten0/serde_avro_fast#5`, shows Pub/Sub rejecting an unwrapped value for a `["null","string"]`
//! field), so published messages use its forms; we accept those and a few lenient extras:
//!
//! | schema | JSON accepted |
//! |---|---|
//! | `null`, `boolean`, `string` | `null`, `true`/`false`, a string |
//! | `int`, `long` (and their logical types `date`, `time-*`, `timestamp-*`) | an integer in range |
//! | `float`, `double` | a number, or the strings `"NaN"`, `"Infinity"`, `"-Infinity"` |
//! | `bytes`, `fixed` (and `decimal`, `duration`) | a string whose code points are 0–255, one byte each |
//! | `enum` | a symbol string |
//! | `array`, `map` | an array, an object |
//! | `record` | an object; a missing field takes its schema default, a missing field of a union with `null` is null (lenient); unknown fields are ignored (lenient) |
//! | union | `null`, or `{"<branch>": value}` where `<branch>` is the type name (`"string"`, `"long"`, …) or the full or short name of a named type; **lenient:** for a union of `null` and one other type, the bare value is accepted too |
//!
//! A wrapped form is tried first; `{"map": …}` for a union of `null` and a map is read as the
//! wrapped form if that succeeds, else as a map with the key `map`.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use apache_avro::schema::{
    DecimalSchema, InnerDecimalSchema, Name, RecordSchema, ResolvedSchema, UnionSchema, UuidSchema,
};
use apache_avro::Schema;
use serde_json::Value as Json;

use super::avro::{minify_json, put_bytes, put_long};
use super::EncodeError;
use crate::message::Message;

/// Attribute naming the schema revision a message was validated against (SPEC §1.2).
pub const REVISION_ID_ATTRIBUTE: &str = "googclient_schemarevisionid";
/// Attribute naming the encoding of a schema-validated message, `JSON` or `BINARY` (SPEC §1.2).
pub const ENCODING_ATTRIBUTE: &str = "googclient_schemaencoding";

/// Field names layout D adds to the topic record, plus their camelCase forms, which SPEC Q7 also
/// reserves so that a BigQuery-style reader cannot confuse them.
pub const RESERVED_METADATA_FIELDS: [&str; 7] = [
    "subscription_name",
    "subscriptionName",
    "message_id",
    "messageId",
    "publish_time",
    "publishTime",
    "attributes",
];

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

impl FromStr for SchemaEncoding {
    type Err = SchemaError;

    /// `JSON` or `BINARY`, case-insensitive (Pub/Sub writes them upper-case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("json") {
            Ok(SchemaEncoding::Json)
        } else if s.eq_ignore_ascii_case("binary") {
            Ok(SchemaEncoding::Binary)
        } else {
            Err(SchemaError::UnknownEncoding(s.to_owned()))
        }
    }
}

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

/// A topic's Avro schema, parsed and checked once. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TopicSchema {
    inner: Arc<Inner>,
    default_encoding: SchemaEncoding,
}

#[derive(Debug)]
struct Inner {
    /// The schema as the user wrote it, for building layout D's writer schema.
    json: Json,
    /// The schema as compact JSON, key order kept, for the file header of layout C.
    text: String,
    schema: Schema,
    /// Every named type of the schema, to resolve references (`Schema::Ref`).
    names: HashMap<Name, Schema>,
}

impl FromStr for TopicSchema {
    type Err = SchemaError;

    /// Parses the text of an `.avsc` file.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let json: Json = serde_json::from_str(text)?;
        let schema = Schema::parse(&json).map_err(|e| SchemaError::Avro(e.to_string()))?;
        let names = ResolvedSchema::try_from(&schema)
            .map_err(|e| SchemaError::Avro(e.to_string()))?
            .get_names()
            .iter()
            .map(|(name, schema)| (name.clone(), (*schema).clone()))
            .collect();
        Ok(TopicSchema {
            inner: Arc::new(Inner {
                json,
                text: minify_json(text.trim()),
                schema,
                names,
            }),
            default_encoding: SchemaEncoding::default(),
        })
    }
}

impl TopicSchema {
    /// Reads and parses an `.avsc` file. `default_encoding` is the encoding of messages without
    /// a `googclient_schemaencoding` attribute (the topic's `schema_settings.encoding`).
    pub fn from_file(
        path: impl AsRef<Path>,
        default_encoding: SchemaEncoding,
    ) -> Result<Self, SchemaError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| SchemaError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, default_encoding)
    }

    /// Parses the text of an `.avsc` file; see [`TopicSchema::from_file`]. (`str::parse` works
    /// too, with the default encoding [`SchemaEncoding::Json`].)
    pub fn parse(text: &str, default_encoding: SchemaEncoding) -> Result<Self, SchemaError> {
        Ok(text
            .parse::<Self>()?
            .with_default_encoding(default_encoding))
    }

    /// The encoding assumed for messages without a `googclient_schemaencoding` attribute
    /// (default [`SchemaEncoding::Json`]); set it to the topic's `schema_settings.encoding`.
    pub fn with_default_encoding(mut self, encoding: SchemaEncoding) -> Self {
        self.default_encoding = encoding;
        self
    }

    pub fn default_encoding(&self) -> SchemaEncoding {
        self.default_encoding
    }

    /// The parsed schema.
    pub fn schema(&self) -> &Schema {
        &self.inner.schema
    }

    /// The schema as compact JSON (the `.avsc` without insignificant whitespace).
    pub fn schema_json(&self) -> &str {
        &self.inner.text
    }

    /// The schema revision a message was validated against, from `googclient_schemarevisionid`.
    pub fn revision_of(msg: &Message) -> Option<&str> {
        msg.attributes
            .get(REVISION_ID_ATTRIBUTE)
            .map(String::as_str)
    }

    /// Layout D's writer schema: the topic record with `subscription_name`, `message_id`,
    /// `publish_time` (long, timestamp-micros) and `attributes` (map of string) appended, as
    /// compact JSON and parsed. Fails if the root is not a record or a field name is reserved
    /// ([`RESERVED_METADATA_FIELDS`]).
    pub fn with_metadata_fields(&self) -> Result<(String, Schema), SchemaError> {
        let Schema::Record(record) = &self.inner.schema else {
            return Err(SchemaError::RootNotRecord(kind_name(&self.inner.schema)));
        };
        let conflicts: Vec<String> = record
            .fields
            .iter()
            .filter(|f| RESERVED_METADATA_FIELDS.contains(&f.name.as_str()))
            .map(|f| f.name.clone())
            .collect();
        if !conflicts.is_empty() {
            return Err(SchemaError::MetadataFieldConflict(conflicts));
        }
        if record.fields.iter().any(|f| f.name == "data") {
            // SPEC Q7: no clash in Avro (layout D has no data field), but a reader that expects
            // layout B's `data` would pick the topic's field up instead.
            tracing::warn!(
                "the topic schema has a field named `data`; layout D keeps it as the topic's field"
            );
        }
        let mut json = self.inner.json.clone();
        let fields = json
            .get_mut("fields")
            .and_then(Json::as_array_mut)
            .ok_or_else(|| SchemaError::RootNotRecord("record without a fields list".into()))?;
        fields.extend([
            serde_json::json!({"name": "subscription_name", "type": "string"}),
            serde_json::json!({"name": "message_id", "type": "string"}),
            serde_json::json!({"name": "publish_time",
                               "type": {"type": "long", "logicalType": "timestamp-micros"}}),
            serde_json::json!({"name": "attributes",
                               "type": {"type": "map", "values": "string"}}),
        ]);
        let schema = Schema::parse(&json).map_err(|e| SchemaError::Avro(e.to_string()))?;
        Ok((json.to_string(), schema))
    }

    /// The encoding of a message: its `googclient_schemaencoding` attribute, else the default.
    pub fn encoding_of(&self, msg: &Message) -> Result<SchemaEncoding, SchemaError> {
        match msg.attributes.get(ENCODING_ATTRIBUTE) {
            Some(value) => value.parse(),
            None => Ok(self.default_encoding),
        }
    }

    /// Appends the datum of `msg.data` to `out` (see the module docs); `out` is left as it was on
    /// error.
    pub fn encode_datum(&self, msg: &Message, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let bad = |reason: String| EncodeError::BadMessage {
            message_id: msg.message_id.clone(),
            reason,
        };
        let encoding = self.encoding_of(msg).map_err(|e| bad(e.to_string()))?;
        let start = out.len();
        let datum: &[u8] = match encoding {
            SchemaEncoding::Binary => &msg.data,
            SchemaEncoding::Json => {
                let json: Json = serde_json::from_slice(&msg.data)
                    .map_err(|e| bad(format!("JSON data is not valid JSON: {e}")))?;
                let converter = JsonToAvro {
                    names: &self.inner.names,
                };
                if let Err(e) = converter.emit(&self.inner.schema, &json, Mode::Json, out) {
                    out.truncate(start);
                    return Err(bad(format!(
                        "JSON data does not match the topic schema: {e}"
                    )));
                }
                &out[start..]
            }
        };
        if let Err(reason) = self.check_decodes(datum) {
            out.truncate(start);
            return Err(bad(format!(
                "{encoding} data does not decode with the topic schema: {reason}"
            )));
        }
        if encoding == SchemaEncoding::Binary {
            out.extend_from_slice(&msg.data);
        }
        Ok(())
    }

    /// Decodes one datum with `apache_avro` and checks that nothing is left over.
    fn check_decodes(&self, datum: &[u8]) -> Result<(), String> {
        let reader = apache_avro::reader::datum::GenericDatumReader::builder(&self.inner.schema)
            .build()
            .map_err(|e| e.to_string())?;
        let mut rest = datum;
        reader.read_value(&mut rest).map_err(|e| e.to_string())?;
        if !rest.is_empty() {
            return Err(format!("{} bytes left after the datum", rest.len()));
        }
        Ok(())
    }
}

fn kind_name(schema: &Schema) -> String {
    match schema {
        Schema::Record(_) => "record".into(),
        Schema::Union(_) => "union".into(),
        Schema::Array(_) => "array".into(),
        Schema::Map(_) => "map".into(),
        Schema::Enum(_) => "enum".into(),
        other => primitive_name(other).to_owned(),
    }
}

/// Where a JSON value did not fit its schema: the path from the root (innermost last) and why.
#[derive(Debug)]
struct Mismatch {
    /// Path segments, innermost first (pushed while unwinding).
    path: Vec<String>,
    reason: String,
}

impl Mismatch {
    fn new(reason: impl Into<String>) -> Self {
        Mismatch {
            path: Vec::new(),
            reason: reason.into(),
        }
    }

    fn at(mut self, segment: impl Into<String>) -> Self {
        self.path.push(segment.into());
        self
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("at $")?;
        for segment in self.path.iter().rev() {
            f.write_str(segment)?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// Whether a value comes from a message (Avro JSON encoding) or from a schema `default`, where a
/// union's value is unwrapped and belongs to the first branch (the Avro specification's rule; we
/// accept any branch that fits, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Json,
    Default,
}

/// Converts Avro JSON to Avro binary, guided by the schema.
struct JsonToAvro<'a> {
    names: &'a HashMap<Name, Schema>,
}

fn describe(v: &Json) -> String {
    let text = v.to_string();
    if text.len() > 40 {
        let cut = (0..=40)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        format!("{}…", &text[..cut])
    } else {
        text
    }
}

fn expected(what: &str, v: &Json) -> Mismatch {
    Mismatch::new(format!("expected {what}, got {}", describe(v)))
}

impl JsonToAvro<'_> {
    fn emit(
        &self,
        schema: &Schema,
        v: &Json,
        mode: Mode,
        out: &mut Vec<u8>,
    ) -> Result<(), Mismatch> {
        match schema {
            Schema::Null => match v {
                Json::Null => Ok(()),
                _ => Err(expected("null", v)),
            },
            Schema::Boolean => match v {
                Json::Bool(b) => {
                    out.push(u8::from(*b));
                    Ok(())
                }
                _ => Err(expected("a boolean", v)),
            },
            Schema::Int | Schema::Date | Schema::TimeMillis => {
                let n = v
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| expected("an int (32-bit integer)", v))?;
                put_long(out, i64::from(n));
                Ok(())
            }
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => {
                let n = v
                    .as_i64()
                    .ok_or_else(|| expected("a long (64-bit integer)", v))?;
                put_long(out, n);
                Ok(())
            }
            Schema::Float => {
                let x = json_float(v).ok_or_else(|| expected("a float", v))?;
                out.extend_from_slice(&(x as f32).to_le_bytes());
                Ok(())
            }
            Schema::Double => {
                let x = json_float(v).ok_or_else(|| expected("a double", v))?;
                out.extend_from_slice(&x.to_le_bytes());
                Ok(())
            }
            Schema::String | Schema::Uuid(UuidSchema::String) => match v {
                Json::String(s) => {
                    put_bytes(out, s.as_bytes());
                    Ok(())
                }
                _ => Err(expected("a string", v)),
            },
            Schema::Bytes
            | Schema::BigDecimal
            | Schema::Uuid(UuidSchema::Bytes)
            | Schema::Decimal(DecimalSchema {
                inner: InnerDecimalSchema::Bytes,
                ..
            }) => {
                let bytes = json_bytes(v)?;
                put_bytes(out, &bytes);
                Ok(())
            }
            Schema::Fixed(fixed)
            | Schema::Duration(fixed)
            | Schema::Uuid(UuidSchema::Fixed(fixed))
            | Schema::Decimal(DecimalSchema {
                inner: InnerDecimalSchema::Fixed(fixed),
                ..
            }) => {
                let bytes = json_bytes(v)?;
                if bytes.len() != fixed.size {
                    return Err(Mismatch::new(format!(
                        "expected {} bytes for fixed {}, got {}",
                        fixed.size,
                        fixed.name.name(),
                        bytes.len()
                    )));
                }
                out.extend_from_slice(&bytes);
                Ok(())
            }
            Schema::Enum(e) => {
                let symbol = v.as_str().ok_or_else(|| expected("an enum symbol", v))?;
                let index = e.symbols.iter().position(|s| s == symbol).ok_or_else(|| {
                    Mismatch::new(format!(
                        "{symbol:?} is not a symbol of enum {} ({})",
                        e.name.name(),
                        e.symbols.join(", ")
                    ))
                })?;
                put_long(out, index as i64);
                Ok(())
            }
            Schema::Array(array) => {
                let items = v.as_array().ok_or_else(|| expected("an array", v))?;
                if !items.is_empty() {
                    put_long(out, items.len() as i64);
                    for (i, item) in items.iter().enumerate() {
                        self.emit(&array.items, item, mode, out)
                            .map_err(|e| e.at(format!("[{i}]")))?;
                    }
                }
                put_long(out, 0);
                Ok(())
            }
            Schema::Map(map) => {
                let entries = v
                    .as_object()
                    .ok_or_else(|| expected("an object (map)", v))?;
                if !entries.is_empty() {
                    put_long(out, entries.len() as i64);
                    for (key, value) in entries {
                        put_bytes(out, key.as_bytes());
                        self.emit(&map.types, value, mode, out)
                            .map_err(|e| e.at(format!("[{key:?}]")))?;
                    }
                }
                put_long(out, 0);
                Ok(())
            }
            Schema::Record(record) => self.emit_record(record, v, mode, out),
            Schema::Union(union) => self.emit_union(union, v, mode, out),
            Schema::Ref { name } => {
                let target = self.names.get(name).ok_or_else(|| {
                    Mismatch::new(format!("unknown named type {}", name.fullname(None)))
                })?;
                self.emit(target, v, mode, out)
            }
        }
    }

    fn emit_record(
        &self,
        record: &RecordSchema,
        v: &Json,
        mode: Mode,
        out: &mut Vec<u8>,
    ) -> Result<(), Mismatch> {
        let object = v
            .as_object()
            .ok_or_else(|| expected(&format!("an object (record {})", record.name.name()), v))?;
        for field in &record.fields {
            let at = |e: Mismatch| e.at(format!(".{}", field.name));
            match (object.get(&field.name), &field.default) {
                (Some(value), _) => self.emit(&field.schema, value, mode, out).map_err(at)?,
                (None, Some(default)) => self
                    .emit(&field.schema, default, Mode::Default, out)
                    .map_err(at)?,
                (None, None) => match self.null_branch(&field.schema) {
                    Some(index) => put_long(out, index as i64),
                    None => return Err(at(Mismatch::new("missing field"))),
                },
            }
        }
        Ok(())
    }

    fn emit_union(
        &self,
        union: &UnionSchema,
        v: &Json,
        mode: Mode,
        out: &mut Vec<u8>,
    ) -> Result<(), Mismatch> {
        let variants = union.variants();
        let start = out.len();
        if mode == Mode::Default {
            // A default's value is unwrapped; try the branches in order, the first one first.
            let mut first_error = None;
            for (i, variant) in variants.iter().enumerate() {
                put_long(out, i as i64);
                match self.emit(variant, v, mode, out) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        out.truncate(start);
                        first_error.get_or_insert(e);
                    }
                }
            }
            return Err(first_error.unwrap_or_else(|| Mismatch::new("empty union")));
        }
        if v.is_null() {
            return match variants.iter().position(|s| matches!(s, Schema::Null)) {
                Some(i) => {
                    put_long(out, i as i64);
                    Ok(())
                }
                None => Err(Mismatch::new("null, but the union has no null branch")),
            };
        }
        let non_null: Vec<usize> = (0..variants.len())
            .filter(|&i| !matches!(variants[i], Schema::Null))
            .collect();
        let mut wrapped_error = None;
        if let Some((key, inner)) = v
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.iter().next())
        {
            if let Some(i) = variants.iter().position(|s| self.branch_is_named(s, key)) {
                put_long(out, i as i64);
                match self.emit(&variants[i], inner, mode, out) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        out.truncate(start);
                        wrapped_error = Some(e.at(format!("<{key}>")));
                    }
                }
            }
        }
        if let [only] = non_null[..] {
            // Lenient: the bare value of a `["null", T]` union.
            put_long(out, only as i64);
            match self.emit(&variants[only], v, mode, out) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    out.truncate(start);
                    return Err(wrapped_error.unwrap_or(e));
                }
            }
        }
        Err(wrapped_error.unwrap_or_else(|| {
            let names: Vec<String> = variants.iter().map(|s| self.branch_name(s)).collect();
            Mismatch::new(format!(
                "a union value must be null or {{\"<type>\": value}} with <type> one of {}; got {}",
                names.join(", "),
                describe(v)
            ))
        }))
    }

    /// The index of the `null` branch when `schema` is a union that has one.
    fn null_branch(&self, schema: &Schema) -> Option<usize> {
        match schema {
            Schema::Union(u) => u.variants().iter().position(|s| matches!(s, Schema::Null)),
            _ => None,
        }
    }

    fn branch_name(&self, schema: &Schema) -> String {
        match named_type(schema) {
            Some(name) => name.fullname(None),
            None => primitive_name(schema).to_owned(),
        }
    }

    /// Whether `key` names the branch `schema` in a wrapped union value: the type name for
    /// unnamed types (logical types use their underlying type), the full name of a named type or,
    /// leniently, its short name.
    fn branch_is_named(&self, schema: &Schema, key: &str) -> bool {
        match named_type(schema) {
            Some(name) => key == name.name() || key == name.fullname(None),
            None => key == primitive_name(schema),
        }
    }
}

/// The name of a named type (record, enum, fixed and the logical types built on fixed).
fn named_type(schema: &Schema) -> Option<&Name> {
    match schema {
        Schema::Record(r) => Some(&r.name),
        Schema::Enum(e) => Some(&e.name),
        Schema::Fixed(f)
        | Schema::Duration(f)
        | Schema::Uuid(UuidSchema::Fixed(f))
        | Schema::Decimal(DecimalSchema {
            inner: InnerDecimalSchema::Fixed(f),
            ..
        }) => Some(&f.name),
        Schema::Ref { name } => Some(name),
        _ => None,
    }
}

/// The Avro type name of an unnamed type; logical types give their underlying type.
fn primitive_name(schema: &Schema) -> &'static str {
    match schema {
        Schema::Null => "null",
        Schema::Boolean => "boolean",
        Schema::Int | Schema::Date | Schema::TimeMillis => "int",
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => "long",
        Schema::Float => "float",
        Schema::Double => "double",
        Schema::Bytes | Schema::BigDecimal | Schema::Uuid(UuidSchema::Bytes) => "bytes",
        Schema::Decimal(DecimalSchema {
            inner: InnerDecimalSchema::Bytes,
            ..
        }) => "bytes",
        Schema::String | Schema::Uuid(UuidSchema::String) => "string",
        Schema::Array(_) => "array",
        Schema::Map(_) => "map",
        Schema::Union(_) => "union",
        Schema::Record(_) => "record",
        Schema::Enum(_) => "enum",
        Schema::Fixed(_)
        | Schema::Duration(_)
        | Schema::Uuid(UuidSchema::Fixed(_))
        | Schema::Decimal(_)
        | Schema::Ref { .. } => "fixed",
    }
}

/// A float or double in the Avro JSON encoding: a number, or the names of the special values.
fn json_float(v: &Json) -> Option<f64> {
    match v {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// `bytes` / `fixed` in the Avro JSON encoding: a string whose code points 0–255 are the bytes.
fn json_bytes(v: &Json) -> Result<Vec<u8>, Mismatch> {
    let s = v
        .as_str()
        .ok_or_else(|| expected("a string of bytes (code points 0-255)", v))?;
    s.chars()
        .map(|c| {
            u8::try_from(u32::from(c)).map_err(|_| {
                Mismatch::new(format!(
                    "{c:?} (U+{:04X}) cannot be a byte: bytes are written as code points 0-255",
                    u32::from(c)
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::avro::testutil::*;
    use crate::encode::avro::{AvroFormat, AvroLayout, Codec, DEFAULT_BLOCK_TARGET};
    use crate::encode::FileFormat;
    use apache_avro::types::Value;

    const ORDER_SCHEMA: &str = r#"{
      "type": "record", "name": "Order", "namespace": "com.example",
      "fields": [
        {"name": "id", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "total", "type": "long"},
        {"name": "price", "type": "double"},
        {"name": "ratio", "type": "float"},
        {"name": "ok", "type": "boolean"},
        {"name": "raw", "type": "bytes"},
        {"name": "note", "type": ["null", "string"], "default": null},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "DONE"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "props", "type": {"type": "map", "values": "long"}},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
          {"name": "name", "type": "string"},
          {"name": "tier", "type": ["null", "int", "string"]}
        ]}},
        {"name": "previous", "type": ["null", "Customer"], "default": null},
        {"name": "state2", "type": "Status", "default": "NEW"},
        {"name": "count", "type": "int", "default": 7}
      ]
    }"#;

    /// The Avro JSON of one order, every union wrapped as Pub/Sub requires.
    const ORDER_JSON: &str = r#"{"id": "o-1", "qty": 3, "total": 10000000000, "price": 1.5,
        "ratio": 0.25, "ok": true, "raw": "\u0000\u00ffA", "note": {"string": "hi"},
        "status": "DONE", "tags": ["a", "b"], "props": {"x": 1}, "hash": "ab\u00e9d",
        "created": 1700000000000000, "customer": {"name": "Ann", "tier": {"int": 2}},
        "previous": {"com.example.Customer": {"name": "Bob", "tier": null}}}"#;

    fn customer(name: &str, tier: Value) -> Value {
        Value::Record(vec![
            ("name".into(), Value::String(name.into())),
            ("tier".into(), tier),
        ])
    }

    /// What `apache_avro::Reader` must return for `ORDER_JSON`.
    fn order_value() -> Value {
        Value::Record(vec![
            ("id".into(), Value::String("o-1".into())),
            ("qty".into(), Value::Int(3)),
            ("total".into(), Value::Long(10_000_000_000)),
            ("price".into(), Value::Double(1.5)),
            ("ratio".into(), Value::Float(0.25)),
            ("ok".into(), Value::Boolean(true)),
            ("raw".into(), Value::Bytes(vec![0, 255, b'A'])),
            (
                "note".into(),
                Value::Union(1, Box::new(Value::String("hi".into()))),
            ),
            ("status".into(), Value::Enum(1, "DONE".into())),
            (
                "tags".into(),
                Value::Array(vec![Value::String("a".into()), Value::String("b".into())]),
            ),
            (
                "props".into(),
                Value::Map([("x".to_string(), Value::Long(1))].into_iter().collect()),
            ),
            ("hash".into(), Value::Fixed(4, vec![b'a', b'b', 0xe9, b'd'])),
            (
                "created".into(),
                Value::TimestampMicros(1_700_000_000_000_000),
            ),
            (
                "customer".into(),
                customer("Ann", Value::Union(1, Box::new(Value::Int(2)))),
            ),
            (
                "previous".into(),
                Value::Union(
                    1,
                    Box::new(customer("Bob", Value::Union(0, Box::new(Value::Null)))),
                ),
            ),
            ("state2".into(), Value::Enum(0, "NEW".into())),
            ("count".into(), Value::Int(7)),
        ])
    }

    fn topic(text: &str) -> TopicSchema {
        text.parse().unwrap()
    }

    fn binary_of(schema: &TopicSchema, value: &Value) -> Vec<u8> {
        apache_avro::writer::datum::GenericDatumWriter::builder(schema.schema())
            .build()
            .unwrap()
            .write_value_to_vec(value.clone())
            .unwrap()
    }

    fn message(id: &str, data: &[u8], attrs: &[(&str, &str)]) -> Message {
        Message {
            data: bytes::Bytes::copy_from_slice(data),
            attributes: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            message_id: id.into(),
            publish_time_micros: 1_700_000_000_123_456,
            ordering_key: String::new(),
        }
    }

    /// The same order published as wrapped JSON, lenient JSON and BINARY, with and without the
    /// encoding attribute.
    fn order_messages(schema: &TopicSchema) -> Vec<Message> {
        let binary = binary_of(schema, &order_value());
        let mut lenient: Json = serde_json::from_str(ORDER_JSON).unwrap();
        lenient["note"] = Json::from("hi");
        lenient["previous"] = serde_json::json!({"name": "Bob"});
        lenient["state2"] = Json::from("NEW");
        lenient["unknown_extra"] = Json::from(1);
        vec![
            message("j1", ORDER_JSON.as_bytes(), &[(ENCODING_ATTRIBUTE, "JSON")]),
            message("j2", ORDER_JSON.as_bytes(), &[]),
            message(
                "j3",
                lenient.to_string().as_bytes(),
                &[
                    (ENCODING_ATTRIBUTE, "JSON"),
                    (REVISION_ID_ATTRIBUTE, "3afd3cc8"),
                ],
            ),
            message("b1", &binary, &[(ENCODING_ATTRIBUTE, "BINARY"), ("k", "v")]),
        ]
    }

    fn encode_one(format: &AvroFormat, m: &Message) -> Result<Vec<u8>, EncodeError> {
        let mut enc = format.new_file(SYNC, None).unwrap();
        let mut scratch = Vec::new();
        enc.encode(m, &mut scratch).map(|_| scratch)
    }

    fn reason(format: &AvroFormat, m: &Message) -> String {
        match encode_one(format, m) {
            Err(EncodeError::BadMessage { message_id, reason }) => {
                assert_eq!(message_id, m.message_id);
                reason
            }
            Ok(_) => panic!("message {} was accepted", m.message_id),
        }
    }

    #[test]
    fn layout_c_round_trips_json_and_binary_with_every_codec() {
        let schema = topic(ORDER_SCHEMA);
        let messages = order_messages(&schema);
        for codec in Codec::ALL {
            for target in [DEFAULT_BLOCK_TARGET, 1] {
                let layout = AvroLayout::TopicSchema(schema.clone());
                let f = AvroFormat::new(layout, SUBSCRIPTION.into(), codec, target).unwrap();
                let (bytes, estimated) = write_file(&f, &messages);
                if codec == Codec::Null {
                    assert_eq!(estimated, bytes.len());
                }
                let (writer_schema, records) = read_file(&bytes, codec);
                assert_eq!(&writer_schema, schema.schema());
                assert_eq!(records.len(), messages.len());
                for r in &records {
                    assert_eq!(r, &order_value());
                }
            }
        }
    }

    #[test]
    fn layout_d_appends_the_metadata_fields_with_every_codec() {
        let schema = topic(ORDER_SCHEMA);
        let mut messages = order_messages(&schema);
        messages[0].ordering_key = "key-1".into();
        messages[1].publish_time_micros = -5;
        for codec in Codec::ALL {
            let layout = AvroLayout::TopicSchemaWithMetadata(schema.clone());
            let f = AvroFormat::new(layout, SUBSCRIPTION.into(), codec, 100).unwrap();
            let (bytes, estimated) = write_file(&f, &messages);
            if codec == Codec::Null {
                assert_eq!(estimated, bytes.len());
            }
            let (writer_schema, records) = read_file(&bytes, codec);
            let Schema::Record(record) = &writer_schema else {
                panic!("not a record")
            };
            let names: Vec<&str> = record.fields.iter().map(|f| f.name.as_str()).collect();
            assert_eq!(names.len(), 17 + 4);
            assert_eq!(
                names[17..],
                [
                    "subscription_name",
                    "message_id",
                    "publish_time",
                    "attributes"
                ]
            );
            assert_eq!(records.len(), messages.len());
            let Value::Record(expected_topic_fields) = order_value() else {
                unreachable!()
            };
            for (r, m) in records.iter().zip(&messages) {
                let Value::Record(fields) = r else {
                    panic!("not a record")
                };
                assert_eq!(fields[..17], expected_topic_fields[..]);
                assert_metadata(r, m);
                assert!(fields.iter().all(|(n, _)| n != "data"));
            }
        }
    }

    #[test]
    fn layout_d_rejects_non_records_and_reserved_fields() {
        let layout = AvroLayout::TopicSchemaWithMetadata(topic(r#""string""#));
        let err = AvroFormat::new(layout, SUBSCRIPTION.into(), Codec::Null, 1).unwrap_err();
        assert!(
            matches!(err, SchemaError::RootNotRecord(ref k) if k == "string"),
            "{err}"
        );

        let clashing = r#"{"type": "record", "name": "R", "fields": [
            {"name": "message_id", "type": "string"}, {"name": "x", "type": "int"},
            {"name": "attributes", "type": "string"}, {"name": "publishTime", "type": "long"}]}"#;
        let layout = AvroLayout::TopicSchemaWithMetadata(topic(clashing));
        let err = AvroFormat::new(layout, SUBSCRIPTION.into(), Codec::Null, 1).unwrap_err();
        let SchemaError::MetadataFieldConflict(fields) = &err else {
            panic!("{err}")
        };
        assert_eq!(fields, &["message_id", "attributes", "publishTime"]);
        assert!(err
            .to_string()
            .contains("message_id, attributes, publishTime"));

        // Layout C has no such restriction.
        let layout = AvroLayout::TopicSchema(topic(clashing));
        assert!(AvroFormat::new(layout, SUBSCRIPTION.into(), Codec::Null, 1).is_ok());
    }

    #[test]
    fn layout_c_accepts_non_record_and_recursive_schemas() {
        let text = topic(r#""string""#);
        let f = AvroFormat::new(
            AvroLayout::TopicSchema(text),
            SUBSCRIPTION.into(),
            Codec::Null,
            1,
        )
        .unwrap();
        let (bytes, _) = write_file(&f, &[message("1", "\"héllo\"".as_bytes(), &[])]);
        assert_eq!(
            read_file(&bytes, Codec::Null).1,
            [Value::String("héllo".into())]
        );

        let list = topic(
            r#"{"type": "record", "name": "Node", "namespace": "n", "fields": [
                {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}"#,
        );
        let f = AvroFormat::new(
            AvroLayout::TopicSchema(list),
            SUBSCRIPTION.into(),
            Codec::Null,
            1,
        )
        .unwrap();
        let data =
            br#"{"v": 1, "next": {"n.Node": {"v": 2, "next": {"Node": {"v": 3, "next": null}}}}}"#;
        let (bytes, _) = write_file(&f, &[message("1", data, &[])]);
        let node = |v: i32, next: Value| {
            Value::Record(vec![("v".into(), Value::Int(v)), ("next".into(), next)])
        };
        let null = Value::Union(0, Box::new(Value::Null));
        let expected = node(
            1,
            Value::Union(
                1,
                Box::new(node(2, Value::Union(1, Box::new(node(3, null))))),
            ),
        );
        assert_eq!(read_file(&bytes, Codec::Null).1, [expected]);
    }

    #[test]
    fn bad_messages_are_rejected_with_id_and_reason() {
        let schema = topic(ORDER_SCHEMA);
        let f = AvroFormat::new(
            AvroLayout::TopicSchema(schema.clone()),
            SUBSCRIPTION.into(),
            Codec::Null,
            DEFAULT_BLOCK_TARGET,
        )
        .unwrap();
        let with = |edit: &dyn Fn(&mut Json)| -> Vec<u8> {
            let mut v: Json = serde_json::from_str(ORDER_JSON).unwrap();
            edit(&mut v);
            v.to_string().into_bytes()
        };
        let json = [(ENCODING_ATTRIBUTE, "JSON")];
        let cases: Vec<(Message, &str)> = vec![
            (
                message("m1", b"{not json", &json),
                "JSON data is not valid JSON",
            ),
            (
                message("m2", &with(&|v| v["qty"] = Json::from("three")), &json),
                "at $.qty: expected an int",
            ),
            (
                message("m3", &with(&|v| v["qty"] = Json::from(1u64 << 40)), &json),
                "at $.qty: expected an int",
            ),
            (
                message(
                    "m4",
                    &with(&|v| v["customer"]["tier"] = serde_json::json!({"boolean": true})),
                    &json,
                ),
                "at $.customer.tier: a union value must be null or",
            ),
            (
                message("m5", &with(&|v| v["status"] = Json::from("OLD")), &json),
                "\"OLD\" is not a symbol of enum Status (NEW, DONE)",
            ),
            (
                message("m6", &with(&|v| v["hash"] = Json::from("abc")), &json),
                "at $.hash: expected 4 bytes for fixed Hash, got 3",
            ),
            (
                message(
                    "m7",
                    &with(&|v| {
                        v.as_object_mut().unwrap().remove("id");
                    }),
                    &json,
                ),
                "at $.id: missing field",
            ),
            (
                message("m8", &with(&|v| v["raw"] = Json::from("€")), &json),
                "at $.raw: '€' (U+20AC) cannot be a byte",
            ),
            (
                message("m9", &with(&|v| v["tags"][1] = Json::from(5)), &json),
                "at $.tags[1]: expected a string, got 5",
            ),
            (
                message("m10", &with(&|v| v["props"]["x"] = Json::from(0.5)), &json),
                "at $.props[\"x\"]: expected a long",
            ),
            (
                message(
                    "m11",
                    &with(&|v| v["note"] = serde_json::json!({"string": 5})),
                    &json,
                ),
                "at $.note<string>: expected a string, got 5",
            ),
            (
                message("m12", b"{}", &[(ENCODING_ATTRIBUTE, "XML")]),
                "unknown schema encoding \"XML\"",
            ),
        ];
        for (m, expected) in &cases {
            let r = reason(&f, m);
            assert!(
                r.contains(expected),
                "{}: {r:?} lacks {expected:?}",
                m.message_id
            );
        }

        let binary = binary_of(&schema, &order_value());
        let bin = [(ENCODING_ATTRIBUTE, "BINARY")];
        let truncated = message("b1", &binary[..binary.len() - 3], &bin);
        assert!(
            reason(&f, &truncated).contains("BINARY data does not decode with the topic schema")
        );
        let mut long = binary.clone();
        long.push(0);
        let r = reason(&f, &message("b2", &long, &bin));
        assert!(r.contains("1 bytes left after the datum"), "{r}");
        let r = reason(&f, &message("b3", ORDER_JSON.as_bytes(), &bin));
        assert!(r.contains("BINARY data does not decode"), "{r}");
    }

    #[test]
    fn a_bad_message_leaves_the_file_intact() {
        let schema = topic(ORDER_SCHEMA);
        let f = AvroFormat::new(
            AvroLayout::TopicSchemaWithMetadata(schema),
            SUBSCRIPTION.into(),
            Codec::Null,
            DEFAULT_BLOCK_TARGET,
        )
        .unwrap();
        let mut enc = f.new_file(SYNC, None).unwrap();
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        enc.header(&mut out);
        let good = message("g", ORDER_JSON.as_bytes(), &[]);
        let bad = message("b", br#"{"id": 1}"#, &[]);
        enc.encode(&good, &mut scratch).unwrap();
        enc.append(&scratch, &mut out);
        assert!(enc.encode(&bad, &mut scratch).is_err());
        enc.encode(&good, &mut scratch).unwrap();
        enc.append(&scratch, &mut out);
        enc.finish(&mut out);
        assert_eq!(read_file(&out, Codec::Null).1.len(), 2);
    }

    #[test]
    fn default_encoding_applies_without_the_attribute() {
        let schema = TopicSchema::parse(ORDER_SCHEMA, SchemaEncoding::Binary).unwrap();
        assert_eq!(schema.default_encoding(), SchemaEncoding::Binary);
        let binary = binary_of(&schema, &order_value());
        let f = AvroFormat::new(
            AvroLayout::TopicSchema(schema),
            SUBSCRIPTION.into(),
            Codec::Null,
            DEFAULT_BLOCK_TARGET,
        )
        .unwrap();
        let messages = [
            message("1", &binary, &[]),
            message("2", ORDER_JSON.as_bytes(), &[(ENCODING_ATTRIBUTE, "json")]),
        ];
        let (bytes, _) = write_file(&f, &messages);
        assert_eq!(
            read_file(&bytes, Codec::Null).1,
            [order_value(), order_value()]
        );
        let r = reason(&f, &message("3", ORDER_JSON.as_bytes(), &[]));
        assert!(r.contains("BINARY data does not decode"), "{r}");
    }

    #[test]
    fn topic_layouts_group_files_by_schema_revision() {
        let schema = topic(ORDER_SCHEMA);
        let with_rev = message("1", b"{}", &[(REVISION_ID_ATTRIBUTE, "3afd3cc8")]);
        let without = message("2", b"{}", &[]);
        for layout in [
            AvroLayout::TopicSchema(schema.clone()),
            AvroLayout::TopicSchemaWithMetadata(schema.clone()),
        ] {
            let f = AvroFormat::new(layout, SUBSCRIPTION.into(), Codec::Null, 1).unwrap();
            assert_eq!(f.group_key(&with_rev).as_deref(), Some("3afd3cc8"));
            assert_eq!(f.group_key(&without), None);
        }
    }

    #[test]
    fn schemas_load_from_files_and_report_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("order.avsc");
        std::fs::write(&path, ORDER_SCHEMA).unwrap();
        let loaded = TopicSchema::from_file(&path, SchemaEncoding::Binary).unwrap();
        assert_eq!(loaded.default_encoding(), SchemaEncoding::Binary);
        assert_eq!(loaded.schema(), topic(ORDER_SCHEMA).schema());
        assert!(!loaded.schema_json().contains('\n'));
        assert!(loaded
            .schema_json()
            .starts_with(r#"{"type":"record","name":"Order""#));

        let missing =
            TopicSchema::from_file(dir.path().join("nope.avsc"), SchemaEncoding::Json).unwrap_err();
        assert!(matches!(missing, SchemaError::Read { .. }), "{missing}");
        assert!(missing.to_string().contains("nope.avsc"));
        let not_json = "{".parse::<TopicSchema>().unwrap_err();
        assert!(matches!(not_json, SchemaError::Json(_)), "{not_json}");
        let not_avro = r#"{"type": "record", "name": "R"}"#.parse::<TopicSchema>().unwrap_err();
        assert!(matches!(not_avro, SchemaError::Avro(_)), "{not_avro}");
    }

    #[test]
    fn encodings_parse() {
        assert_eq!(
            "JSON".parse::<SchemaEncoding>().unwrap(),
            SchemaEncoding::Json
        );
        assert_eq!(
            "BINARY".parse::<SchemaEncoding>().unwrap(),
            SchemaEncoding::Binary
        );
        assert_eq!(
            "binary".parse::<SchemaEncoding>().unwrap(),
            SchemaEncoding::Binary
        );
        assert!("XML".parse::<SchemaEncoding>().is_err());
        assert_eq!(SchemaEncoding::default(), SchemaEncoding::Json);
        assert_eq!(SchemaEncoding::Binary.to_string(), "BINARY");
    }

    #[test]
    fn json_special_floats_and_logical_types() {
        let schema = topic(
            r#"{"type": "record", "name": "L", "fields": [
                {"name": "d", "type": "double"}, {"name": "f", "type": "float"},
                {"name": "day", "type": {"type": "int", "logicalType": "date"}},
                {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
                {"name": "when", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]}
            ]}"#,
        );
        let f = AvroFormat::new(
            AvroLayout::TopicSchema(schema),
            SUBSCRIPTION.into(),
            Codec::Null,
            1,
        )
        .unwrap();
        let data = br#"{"d": "-Infinity", "f": 2, "day": 19000,
            "id": "67e55044-10b1-426f-9247-bb680e5fe0c8", "when": {"long": 5}}"#;
        let (bytes, _) = write_file(&f, &[message("1", data, &[])]);
        let records = read_file(&bytes, Codec::Null).1;
        let r = &records[0];
        assert_eq!(field(r, "d"), &Value::Double(f64::NEG_INFINITY));
        assert_eq!(field(r, "f"), &Value::Float(2.0));
        assert_eq!(field(r, "day"), &Value::Date(19000));
        assert_eq!(
            field(r, "id"),
            &Value::Uuid("67e55044-10b1-426f-9247-bb680e5fe0c8".parse().unwrap())
        );
        assert_eq!(
            field(r, "when"),
            &Value::Union(1, Box::new(Value::TimestampMillis(5)))
        );
        // A uuid that does not parse fails the decode check rather than landing in the file.
        let bad = br#"{"d": 1, "f": 1, "day": 1, "id": "not-a-uuid", "when": null}"#;
        let r = reason(&f, &message("2", bad, &[]));
        assert!(
            r.contains("JSON data does not decode with the topic schema"),
            "{r}"
        );
    }
}
