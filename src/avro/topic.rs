//! The topic schema (docs/contract.md §3.7, §4.4, Q7, Q8): parsed and checked once, then used to read
//! each message's datum, by the Avro container writer (layouts C and D) and by the table writer
//! (use_topic_schema rows) alike.
//!
//! With `use_topic_schema`, each message's `data` is a datum of the topic's Avro schema, published
//! either as Avro JSON or as Avro binary (`googclient_schemaencoding` says which, docs/contract.md §1.2). The
//! writer decodes it and writes it as one datum of the output file (the table writer reads its
//! value):
//!
//! * **BINARY**: the data is decoded with `apache_avro` against the schema (it must decode
//!   completely, no trailing bytes); the original bytes are then written unchanged.
//! * **JSON**: the data is parsed as JSON and converted, guided by the schema, straight to Avro
//!   binary (see [Avro JSON accepted](#avro-json-accepted)); the result is then decoded with
//!   `apache_avro` like a BINARY message, so a file never holds a datum the reference
//!   implementation cannot read.
//!
//! A message that fails either way is a [`DatumError`]: the step that failed
//! ([`DatumErrorKind`]), the encoding and the place in the datum ([`DatumError::path`]).
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

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use apache_avro::types::Value;
use apache_avro::Schema;
use serde_json::Value as Json;

use super::encoding::{revision_of, SchemaEncoding, ENCODING_ATTRIBUTE};
use super::error::{DatumError, DatumErrorKind, SchemaError};
use super::json::{JsonToAvro, Mismatch, Mode};
use super::types::{type_name, Names};
use super::wire::minify_json;
use crate::message::Message;

/// Field names layout D adds to the topic record, plus their camelCase forms, which
/// docs/contract.md Q7 also reserves so that a BigQuery-style reader cannot confuse them.
pub const RESERVED_METADATA_FIELDS: [&str; 7] = [
    "subscription_name",
    "subscriptionName",
    "message_id",
    "messageId",
    "publish_time",
    "publishTime",
    "attributes",
];

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
    names: Names,
}

impl FromStr for TopicSchema {
    type Err = SchemaError;

    /// Parses the text of an `.avsc` file.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let json: Json = serde_json::from_str(text)?;
        let schema = Schema::parse(&json).map_err(|e| SchemaError::Avro(e.to_string()))?;
        let names = Names::of(&schema).map_err(|e| SchemaError::Avro(e.to_string()))?;
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
        revision_of(msg)
    }

    /// Layout D's writer schema: the topic record with `subscription_name`, `message_id`,
    /// `publish_time` (long, timestamp-micros) and `attributes` (map of string) appended, as
    /// compact JSON and parsed. Fails if the root is not a record or a field name is reserved
    /// ([`RESERVED_METADATA_FIELDS`]).
    pub fn with_metadata_fields(&self) -> Result<(String, Schema), SchemaError> {
        let Schema::Record(record) = &self.inner.schema else {
            return Err(SchemaError::RootNotRecord(
                type_name(&self.inner.schema).to_owned(),
            ));
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
            // docs/contract.md Q7: no clash in Avro (layout D has no data field), but a reader that expects
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
            Some(value) => Ok(value.parse()?),
            None => Ok(self.default_encoding),
        }
    }

    /// Appends the datum of `msg.data` to `out` (see the module docs); `out` is left as it was on
    /// error.
    pub fn encode_datum(&self, msg: &Message, out: &mut Vec<u8>) -> Result<(), DatumError> {
        let encoding = self.datum_encoding(msg)?;
        let start = out.len();
        let datum: &[u8] = match encoding {
            SchemaEncoding::Binary => &msg.data,
            SchemaEncoding::Json => {
                if let Err(e) = self.json_to_binary(&msg.data, out) {
                    out.truncate(start);
                    return Err(e);
                }
                &out[start..]
            }
        };
        if let Err(e) = self.read_datum(datum, encoding) {
            out.truncate(start);
            return Err(e);
        }
        if encoding == SchemaEncoding::Binary {
            out.extend_from_slice(&msg.data);
        }
        Ok(())
    }

    /// The value of `msg.data` (see the module docs): a BINARY datum decoded as it is, a JSON one
    /// converted to binary first. Either must decode completely.
    pub fn read_value(&self, msg: &Message) -> Result<Value, DatumError> {
        let encoding = self.datum_encoding(msg)?;
        match encoding {
            SchemaEncoding::Binary => self.read_datum(&msg.data, encoding),
            SchemaEncoding::Json => {
                let mut converted = Vec::new();
                self.json_to_binary(&msg.data, &mut converted)?;
                self.read_datum(&converted, encoding)
            }
        }
    }

    fn datum_encoding(&self, msg: &Message) -> Result<SchemaEncoding, DatumError> {
        self.encoding_of(msg).map_err(|e| {
            DatumError::new(
                DatumErrorKind::UnknownEncoding,
                self.default_encoding,
                e.to_string(),
            )
        })
    }

    /// Converts a JSON datum to binary, appended to `out` (partly written on error).
    fn json_to_binary(&self, data: &[u8], out: &mut Vec<u8>) -> Result<(), DatumError> {
        let json: Json = serde_json::from_slice(data).map_err(|e| {
            DatumError::new(DatumErrorKind::NotJson, SchemaEncoding::Json, e.to_string())
        })?;
        let converter = JsonToAvro {
            names: &self.inner.names,
        };
        converter
            .emit(&self.inner.schema, &json, Mode::Json, out)
            .map_err(|Mismatch { path, reason }| DatumError {
                kind: DatumErrorKind::Mismatch,
                encoding: SchemaEncoding::Json,
                path,
                reason,
            })
    }

    /// Decodes one datum with `apache_avro` and checks that nothing is left over.
    fn read_datum(&self, datum: &[u8], encoding: SchemaEncoding) -> Result<Value, DatumError> {
        let fail = |reason: String| DatumError::new(DatumErrorKind::Decode, encoding, reason);
        let reader = apache_avro::reader::datum::GenericDatumReader::builder(&self.inner.schema)
            .build()
            .map_err(|e| fail(e.to_string()))?;
        // One byte past the datum: `apache_avro` reads a union whose index is cut off by the end
        // of its input as null, so a datum that ends before a union field (a message of an older
        // schema revision, without the field a newer one added) would pass, and the file would
        // hold bytes no reader can decode. With the byte there, such a datum reads it and fails
        // the check below.
        const PAST_THE_END: &[u8] = &[0];
        let mut input = std::io::Read::chain(datum, PAST_THE_END);
        let value = reader
            .read_value(&mut input)
            .map_err(|e| fail(e.to_string()))?;
        let (rest, past) = input.into_inner();
        if !rest.is_empty() {
            return Err(fail(format!("{} bytes left after the datum", rest.len())));
        }
        if past.is_empty() {
            return Err(fail(
                "the datum ended before the schema did (it is shorter than a datum of this schema)"
                    .into(),
            ));
        }
        Ok(value)
    }
}

/// Every revision of a topic's schema subsink knows, by revision id, and the one used for a
/// message whose revision is not among them (or that names none): the schema `--topic-schema`
/// gives (then it is the only one), or, in `serve`, every revision Pub/Sub lists for the topic's
/// schema, the topic's newest allowed revision being the fallback (docs/contract.md §6 Q8).
///
/// A message is read with the schema of its `googclient_schemarevisionid`: a BINARY datum only
/// decodes with the schema it was written with. A revision that is not known yet is asked of the
/// [`FetchRevision`] when there is one (a revision committed after the export started), once;
/// the answer is kept. Cheap to clone; clones share what they learn.
#[derive(Debug, Clone)]
pub struct TopicSchemas {
    fallback: TopicSchema,
    /// Known revisions; `None`: asked for and not found (not asked again).
    revisions: Arc<std::sync::RwLock<std::collections::BTreeMap<String, Option<TopicSchema>>>>,
    fetch: Option<Arc<dyn FetchRevision>>,
}

/// Reads one revision of a topic's schema when it is first met (`serve`: `GetSchema
/// name@revision` on Pub/Sub). `Ok(None)`: there is no such revision.
pub trait FetchRevision: Send + Sync + std::fmt::Debug {
    fn fetch(&self, revision: &str) -> Result<Option<TopicSchema>, String>;
}

impl TopicSchemas {
    /// One schema for every message, whatever its revision (`--topic-schema FILE`).
    pub fn one(schema: TopicSchema) -> TopicSchemas {
        Self::new(schema, Default::default())
    }

    /// The schemas of `revisions` (revision id → schema), and `fallback` for messages of any other
    /// revision or none.
    pub fn new(
        fallback: TopicSchema,
        revisions: std::collections::BTreeMap<String, TopicSchema>,
    ) -> TopicSchemas {
        TopicSchemas {
            fallback,
            revisions: Arc::new(std::sync::RwLock::new(
                revisions.into_iter().map(|(k, v)| (k, Some(v))).collect(),
            )),
            fetch: None,
        }
    }

    /// Revisions not known are asked of `fetch`.
    pub fn with_fetch(mut self, fetch: Arc<dyn FetchRevision>) -> TopicSchemas {
        self.fetch = Some(fetch);
        self
    }

    /// The schema of messages whose revision is not known.
    pub fn fallback(&self) -> &TopicSchema {
        &self.fallback
    }

    /// The schema of revision `id` when it is known or can be fetched; `None` otherwise.
    pub fn lookup(&self, id: &str) -> Option<TopicSchema> {
        if let Some(known) = self.revisions.read().expect("not poisoned").get(id) {
            return known.clone();
        }
        let fetch = self.fetch.as_ref()?;
        let found = match fetch.fetch(id) {
            Ok(found) => found,
            Err(e) => {
                // Not kept: the next message of this revision asks again.
                tracing::warn!(revision = id, error = %e, "cannot read the topic schema revision; its messages are read with the newest known revision");
                return None;
            }
        };
        if found.is_none() {
            tracing::warn!(revision = id, "the topic's schema has no such revision; its messages are read with the newest known revision");
        }
        self.revisions
            .write()
            .expect("not poisoned")
            .insert(id.to_owned(), found.clone());
        found
    }

    /// Are revisions not known asked of a [`FetchRevision`]?
    pub fn fetches(&self) -> bool {
        self.fetch.is_some()
    }

    /// Has revision `id` been settled: known, or found missing (not a failed fetch)?
    pub fn settled(&self, id: &str) -> bool {
        self.revisions
            .read()
            .expect("not poisoned")
            .contains_key(id)
    }

    /// The schema of revision `id`; the fallback for `None` or a revision that cannot be had.
    pub fn of_revision(&self, id: Option<&str>) -> TopicSchema {
        id.and_then(|id| self.lookup(id))
            .unwrap_or_else(|| self.fallback.clone())
    }

    /// The schema `msg` was published with: [`Self::of_revision`] of its
    /// `googclient_schemarevisionid`.
    pub fn of_message(&self, msg: &Message) -> TopicSchema {
        self.of_revision(revision_of(msg))
    }

    /// The revisions known now, by id.
    pub fn revisions(&self) -> Vec<(String, TopicSchema)> {
        self.revisions
            .read()
            .expect("not poisoned")
            .iter()
            .filter_map(|(id, s)| s.clone().map(|s| (id.clone(), s)))
            .collect()
    }

    /// Every schema to check at startup: the fallback (`None`) and each known revision.
    pub fn all(&self) -> Vec<(Option<String>, TopicSchema)> {
        std::iter::once((None, self.fallback.clone()))
            .chain(self.revisions().into_iter().map(|(id, s)| (Some(id), s)))
            .collect()
    }
}

/// Where a pipeline's topic schema comes from: an `.avsc` file (`--topic-schema`), or schemas
/// already read from Pub/Sub (`serve`).
#[derive(Debug, Clone)]
pub enum TopicSchemaSource {
    /// One schema for every revision, read at startup.
    File(std::path::PathBuf),
    /// Every revision of the topic's schema; `origin` names it in errors
    /// (`the schema projects/p/schemas/s of topic projects/p/topics/t`).
    Fetched {
        origin: String,
        schemas: TopicSchemas,
    },
}

impl TopicSchemaSource {
    /// The schemas, a file read now with `default_encoding` for messages without a
    /// `googclient_schemaencoding` attribute (fetched schemas carry the topic's encoding).
    pub fn load(&self, default_encoding: SchemaEncoding) -> Result<TopicSchemas, SchemaError> {
        match self {
            TopicSchemaSource::File(path) => {
                TopicSchema::from_file(path, default_encoding).map(TopicSchemas::one)
            }
            TopicSchemaSource::Fetched { schemas, .. } => Ok(schemas.clone()),
        }
    }

    /// What errors call it: `--topic-schema PATH`, or the fetched schema's origin.
    pub fn origin(&self) -> String {
        match self {
            TopicSchemaSource::File(path) => format!("--topic-schema {}", path.display()),
            TopicSchemaSource::Fetched { origin, .. } => origin.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::avro::{DatumPath, Segment};

    const SCHEMA: &str = r#"{"type": "record", "name": "R", "fields": [
        {"name": "a", "type": {"type": "array", "items": "long"}},
        {"name": "m", "type": {"type": "map", "values": "string"}}
    ]}"#;

    fn message(data: &[u8], encoding: &str) -> Message {
        Message {
            data: bytes::Bytes::copy_from_slice(data),
            attributes: [(ENCODING_ATTRIBUTE.to_string(), encoding.to_string())].into(),
            message_id: "m1".to_string(),
            publish_time_micros: 0,
            ordering_key: String::new(),
        }
    }

    fn path(outermost_first: &[Segment]) -> DatumPath {
        outermost_first.iter().cloned().collect()
    }

    #[test]
    fn json_and_binary_give_the_same_value_and_bytes() {
        let schema: TopicSchema = SCHEMA.parse().unwrap();
        let json = message(br#"{"a": [1, -2], "m": {"k": "v"}}"#, "JSON");
        let mut binary = Vec::new();
        schema.encode_datum(&json, &mut binary).unwrap();
        let binary = message(&binary, "BINARY");
        let mut again = b"prefix".to_vec();
        schema.encode_datum(&binary, &mut again).unwrap();
        assert_eq!(&again[6..], &binary.data[..]);
        assert_eq!(
            schema.read_value(&json).unwrap(),
            schema.read_value(&binary).unwrap()
        );
    }

    #[test]
    fn errors_say_which_step_failed_and_where() {
        let schema: TopicSchema = SCHEMA.parse().unwrap();
        let fail = |m: &Message| {
            let mut out = b"kept".to_vec();
            let e = schema.encode_datum(m, &mut out).unwrap_err();
            assert_eq!(out, b"kept", "nothing stays behind");
            assert_eq!(schema.read_value(m).unwrap_err(), e);
            e
        };

        let e = fail(&message(br#"{"a": [1, "x"], "m": {}}"#, "JSON"));
        assert_eq!(e.kind, DatumErrorKind::Mismatch);
        assert_eq!(
            e.path,
            path(&[Segment::Field("a".into()), Segment::Index(1)])
        );
        assert_eq!(e.reason, r#"expected a long (64-bit integer), got "x""#);
        assert_eq!(
            e.to_string(),
            r#"JSON data does not match the topic schema: at $.a[1]: expected a long (64-bit integer), got "x""#
        );

        let e = fail(&message(br#"{"a": [], "m": {"k: \"v\"": 1}}"#, "JSON"));
        assert_eq!(e.kind, DatumErrorKind::Mismatch);
        assert_eq!(
            e.path,
            path(&[Segment::Field("m".into()), Segment::Key("k: \"v\"".into())])
        );

        let e = fail(&message(b"{", "JSON"));
        assert_eq!((e.kind, e.path.is_root()), (DatumErrorKind::NotJson, true));

        let e = fail(&message(b"\x00\x00", "XML"));
        assert_eq!(e.kind, DatumErrorKind::UnknownEncoding);
        assert_eq!(
            e.to_string(),
            r#"unknown schema encoding "XML": use JSON or BINARY"#
        );

        let e = fail(&message(b"\x00\x00\x00", "BINARY"));
        assert_eq!(
            (e.kind, e.encoding, e.reason.as_str()),
            (
                DatumErrorKind::Decode,
                SchemaEncoding::Binary,
                "1 bytes left after the datum"
            )
        );
    }
}

#[cfg(test)]
mod revision_tests {
    use super::*;

    const V1: &str = r#"{"type":"record","name":"Event","fields":[{"name":"id","type":"long"},{"name":"name","type":"string"}]}"#;
    const V2: &str = r#"{"type":"record","name":"Event","fields":[{"name":"id","type":"long"},{"name":"name","type":"string"},{"name":"note","type":["null","string"],"default":null}]}"#;

    #[test]
    fn a_binary_datum_of_one_revision_does_not_pass_as_another() {
        let v1 = TopicSchema::parse(V1, SchemaEncoding::Binary).unwrap();
        let v2 = TopicSchema::parse(V2, SchemaEncoding::Binary).unwrap();
        // id 3, name "n3" in revision 1's binary form.
        let one = Message {
            data: bytes::Bytes::from_static(&[6, 4, b'n', b'3']),
            message_id: "m1".into(),
            ..Default::default()
        };
        let mut out = Vec::new();
        v1.encode_datum(&one, &mut out).unwrap();
        assert_eq!(out, [6, 4, b'n', b'3']);
        out.clear();
        assert!(v2.encode_datum(&one, &mut out).is_err(), "{out:?}");
        assert!(out.is_empty());
    }
}

#[cfg(test)]
mod fetch_tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const V1: &str = r#"{"type":"record","name":"E","fields":[{"name":"a","type":"long"}]}"#;
    const V2: &str = r#"{"type":"record","name":"E","fields":[{"name":"a","type":"long"},{"name":"b","type":"long"}]}"#;

    /// Knows revision "r2"; fails for "flaky" the first time; has nothing else.
    #[derive(Debug, Default)]
    struct Fake {
        calls: AtomicUsize,
        flaky_calls: AtomicUsize,
    }

    impl FetchRevision for Fake {
        fn fetch(&self, revision: &str) -> Result<Option<TopicSchema>, String> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match revision {
                "r2" => Ok(Some(V2.parse().unwrap())),
                "flaky" if self.flaky_calls.fetch_add(1, Ordering::SeqCst) == 0 => {
                    Err("unavailable".into())
                }
                "flaky" => Ok(Some(V2.parse().unwrap())),
                _ => Ok(None),
            }
        }
    }

    #[test]
    fn unknown_revisions_are_fetched_once_and_failures_asked_again() {
        let fake = Arc::new(Fake::default());
        let schemas = TopicSchemas::new(
            V1.parse().unwrap(),
            [("r1".to_string(), V1.parse().unwrap())].into(),
        )
        .with_fetch(fake.clone());
        let json = |id: &str| schemas.of_revision(Some(id)).schema_json().to_string();
        assert_eq!(json("r1"), V1);
        assert_eq!(fake.calls.load(Ordering::SeqCst), 0, "known: not fetched");
        assert_eq!(json("r2"), V2);
        assert_eq!(json("r2"), V2);
        assert_eq!(
            fake.calls.load(Ordering::SeqCst),
            1,
            "fetched once, then kept"
        );
        assert_eq!(json("gone"), V1, "no such revision: the fallback");
        assert!(schemas.settled("gone"));
        assert_eq!(json("gone"), V1);
        assert_eq!(
            fake.calls.load(Ordering::SeqCst),
            2,
            "a missing revision is not asked again"
        );
        assert_eq!(json("flaky"), V1, "a failed fetch: the fallback for now");
        assert!(!schemas.settled("flaky"));
        assert_eq!(json("flaky"), V2, "asked again, and kept");
        // Clones share what was learned.
        let clone = schemas.clone();
        assert_eq!(clone.of_revision(Some("r2")).schema_json(), V2);
        assert_eq!(fake.calls.load(Ordering::SeqCst), 4);
    }
}
