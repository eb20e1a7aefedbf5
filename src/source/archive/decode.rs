//! An archived record back to the message it was (docs/replay.md, "What comes back").
//!
//! | layout | message |
//! |---|---|
//! | Text | `data` = the line without its `\n`; derived id and time |
//! | Avro A (`data` only) | `data`; derived id and time |
//! | Avro B (metadata) | `message_id`, `publish_time`, `attributes`, `data` as written; the map entry `ordering_key` is the ordering key |
//! | Avro C (topic schema) | `data` = the record in JSON or binary (`--schema-encoding`); derived id and time |
//! | Avro D (topic schema + metadata) | as B, `data` = the record in the encoding its `googclient_schemaencoding` attribute names, else `--schema-encoding` |
//!
//! A derived id is `<object key>#<record index>` (the index counts from 0); a derived publish
//! time is the datetime of the object's name.

use apache_avro::types::Value;
use apache_avro::Schema;
use serde_json::{Map, Value as Json};

use super::container::datum;
use crate::avro::types::{named_type, type_name, Names};
use crate::avro::{SchemaEncoding, ENCODING_ATTRIBUTE};
use crate::encode::avro::ORDERING_KEY_ATTRIBUTE;
use crate::message::{Attributes, Message};

/// The four Avro layouts, told from the writer schema.
pub enum Layout {
    /// A: `{data: bytes}`.
    Plain,
    /// B: `subscription_name, message_id, publish_time, attributes, data`.
    WithMetadata,
    /// C (`metadata` false) or D: a topic record, D followed by B's metadata without `data`.
    Topic {
        schema: Box<Schema>,
        names: Names,
        metadata: bool,
    },
}

/// What a layout is called in logs and errors.
impl Layout {
    pub fn name(&self) -> &'static str {
        match self {
            Layout::Plain => "Avro without metadata",
            Layout::WithMetadata => "Avro with metadata",
            Layout::Topic {
                metadata: false, ..
            } => "topic-schema Avro",
            Layout::Topic { metadata: true, .. } => "topic-schema Avro with metadata",
        }
    }

    /// `(write_metadata, use_topic_schema)` of the subscription that writes this layout.
    pub fn settings(&self) -> (bool, bool) {
        match self {
            Layout::Plain => (false, false),
            Layout::WithMetadata => (true, false),
            Layout::Topic { metadata, .. } => (*metadata, true),
        }
    }

    /// The layout of a container whose writer schema is `text`.
    pub fn of_schema(text: &str) -> Result<Layout, String> {
        let json: Json = serde_json::from_str(text).map_err(|e| format!("avro.schema: {e}"))?;
        let fields: Vec<(String, Json)> = json
            .get("fields")
            .and_then(Json::as_array)
            .map(|fs| {
                fs.iter()
                    .map(|f| {
                        (
                            f.get("name")
                                .and_then(Json::as_str)
                                .unwrap_or_default()
                                .to_string(),
                            f.get("type").cloned().unwrap_or(Json::Null),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
        let bytes = Json::String("bytes".into());
        const META: [&str; 4] = [
            "subscription_name",
            "message_id",
            "publish_time",
            "attributes",
        ];
        if names == ["data"] && fields[0].1 == bytes {
            return Ok(Layout::Plain);
        }
        if names.len() == 5 && names[..4] == META && names[4] == "data" && fields[4].1 == bytes {
            return Ok(Layout::WithMetadata);
        }
        let metadata = names.len() > 4 && names[names.len() - 4..] == META;
        let topic = if metadata {
            let mut topic = json.clone();
            let fs = topic
                .get_mut("fields")
                .and_then(Json::as_array_mut)
                .expect("fields were read");
            let keep = fs.len() - 4;
            fs.truncate(keep);
            topic
        } else {
            json
        };
        let schema = Schema::parse(&topic).map_err(|e| format!("avro.schema: {e}"))?;
        let names = Names::of(&schema).map_err(|e| format!("avro.schema: {e}"))?;
        Ok(Layout::Topic {
            schema: Box::new(schema),
            names,
            metadata,
        })
    }
}

/// Reads the next datum of a block as a message. `derived`: the id and time for layouts without
/// metadata.
pub fn read_datum(
    layout: &Layout,
    input: &mut &[u8],
    encoding: SchemaEncoding,
    derived: impl FnOnce() -> (String, i64),
) -> Result<Message, String> {
    match layout {
        Layout::Plain => {
            let data = datum::bytes(input)?;
            let (message_id, publish_time_micros) = derived();
            Ok(Message {
                data: bytes::Bytes::copy_from_slice(data),
                attributes: Attributes::default(),
                message_id,
                publish_time_micros,
                ordering_key: String::new(),
            })
        }
        Layout::WithMetadata => {
            let mut m = metadata(input)?;
            m.data = bytes::Bytes::copy_from_slice(datum::bytes(input)?);
            Ok(m)
        }
        Layout::Topic {
            schema,
            names,
            metadata: with,
        } => {
            let before = *input;
            let value = apache_avro::reader::datum::GenericDatumReader::builder(schema)
                .build()
                .and_then(|r| r.read_value(input))
                .map_err(|e| format!("not a datum of the writer schema: {e}"))?;
            let raw = &before[..before.len() - input.len()];
            let mut m = if *with {
                metadata(input)?
            } else {
                let (message_id, publish_time_micros) = derived();
                Message {
                    message_id,
                    publish_time_micros,
                    ..Message::default()
                }
            };
            let encoding = match m.attributes.get(ENCODING_ATTRIBUTE) {
                Some(e) => e.parse().unwrap_or(encoding),
                None => encoding,
            };
            m.data = match encoding {
                SchemaEncoding::Binary => bytes::Bytes::copy_from_slice(raw),
                SchemaEncoding::Json => {
                    let json = to_json(&value, schema, names);
                    bytes::Bytes::from(serde_json::to_vec(&json).expect("serializable"))
                }
            };
            Ok(m)
        }
    }
}

/// B's metadata fields (`subscription_name` is read past: the destination names its own).
fn metadata(input: &mut &[u8]) -> Result<Message, String> {
    datum::bytes(input)?;
    let message_id = datum::string(input)?;
    let publish_time_micros = datum::long(input)?;
    let mut attributes = Attributes::default();
    let mut ordering_key = String::new();
    for (k, v) in datum::string_map(input)? {
        if k == ORDERING_KEY_ATTRIBUTE {
            ordering_key = v;
        } else {
            attributes.insert(k, v);
        }
    }
    Ok(Message {
        data: bytes::Bytes::new(),
        attributes,
        message_id,
        publish_time_micros,
        ordering_key,
    })
}

/// A value in the Avro JSON encoding Pub/Sub validates (unions wrapped as `{"<branch>": value}`,
/// bytes as code points 0–255), guided by `schema` for union branch names. Map keys are sorted
/// (the decoded map does not keep their order).
pub fn to_json(v: &Value, schema: &Schema, names: &Names) -> Json {
    let s = names.resolve(schema);
    let bytes = |b: &[u8]| Json::String(b.iter().map(|&c| char::from(c)).collect());
    let float = |f: f64| {
        if f.is_nan() {
            Json::String("NaN".into())
        } else if f.is_infinite() {
            Json::String(if f > 0.0 { "Infinity" } else { "-Infinity" }.into())
        } else {
            serde_json::Number::from_f64(f).map_or(Json::Null, Json::Number)
        }
    };
    match (v, s) {
        (Value::Union(i, inner), Schema::Union(u)) => {
            let branch = &u.variants()[*i as usize];
            if matches!(**inner, Value::Null) {
                return Json::Null;
            }
            let resolved = names.resolve(branch);
            let name = named_type(resolved)
                .or(named_type(branch))
                .map(|n| n.fullname(None))
                .unwrap_or_else(|| type_name(resolved).to_string());
            let mut m = Map::new();
            m.insert(name, to_json(inner, branch, names));
            Json::Object(m)
        }
        (Value::Record(fields), Schema::Record(r)) => Json::Object(
            fields
                .iter()
                .zip(&r.fields)
                .map(|((n, v), f)| (n.clone(), to_json(v, &f.schema, names)))
                .collect(),
        ),
        (Value::Array(items), Schema::Array(a)) => {
            Json::Array(items.iter().map(|i| to_json(i, &a.items, names)).collect())
        }
        (Value::Map(m), Schema::Map(ms)) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Json::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), to_json(&m[k], &ms.types, names)))
                    .collect(),
            )
        }
        (Value::Null, _) => Json::Null,
        (Value::Boolean(b), _) => Json::Bool(*b),
        (Value::Int(n) | Value::Date(n) | Value::TimeMillis(n), _) => Json::from(*n),
        (
            Value::Long(n)
            | Value::TimeMicros(n)
            | Value::TimestampMillis(n)
            | Value::TimestampMicros(n)
            | Value::TimestampNanos(n)
            | Value::LocalTimestampMillis(n)
            | Value::LocalTimestampMicros(n)
            | Value::LocalTimestampNanos(n),
            _,
        ) => Json::from(*n),
        (Value::Float(f), _) => float(f64::from(*f)),
        (Value::Double(f), _) => float(*f),
        (Value::Bytes(b) | Value::Fixed(_, b), _) => bytes(b),
        (Value::String(t) | Value::Enum(_, t), _) => Json::String(t.clone()),
        (Value::Uuid(u), Schema::Uuid(apache_avro::schema::UuidSchema::String)) => {
            Json::String(u.to_string())
        }
        (Value::Uuid(u), _) => bytes(u.as_bytes()),
        (Value::Decimal(d), _) => bytes(&<Vec<u8>>::try_from(d).unwrap_or_default()),
        (Value::Duration(d), _) => {
            let mut b = Vec::with_capacity(12);
            b.extend_from_slice(&u32::from(d.months()).to_le_bytes());
            b.extend_from_slice(&u32::from(d.days()).to_le_bytes());
            b.extend_from_slice(&u32::from(d.millis()).to_le_bytes());
            bytes(&b)
        }
        (Value::BigDecimal(d), _) => Json::String(d.to_string()),
        (Value::Union(_, inner), _) => to_json(inner, s, names),
        (Value::Record(fields), _) => Json::Object(
            fields
                .iter()
                .map(|(n, v)| (n.clone(), to_json(v, s, names)))
                .collect(),
        ),
        (Value::Array(items), _) => {
            Json::Array(items.iter().map(|i| to_json(i, s, names)).collect())
        }
        (Value::Map(m), _) => Json::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), to_json(v, s, names)))
                .collect(),
        ),
    }
}
