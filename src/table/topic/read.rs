//! use_topic_schema per message: the payload decoded with its schema revision (BINARY or JSON),
//! the Avro value turned into cells following the [`TopicPlan`].

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use apache_avro::types::Value as Avro;
use arrow_buffer::i256;
use serde_json::Value as Json;

use super::{check_compatibility, Conv, Node, Slot, TopicPlan};
use crate::avro::{DatumError, DatumPath, Segment, TopicSchema, TopicSchemas};
use crate::message::Message;
use crate::table::convert::{
    bytes_cell, convert_scalar, date_from_days, decode_big_decimal_bytes, parse_decimal_text,
    timestamp_from_micros, Cell, BIGNUMERIC_SCALE, NUMERIC_SCALE,
};
use crate::table::error::{Fail, RowErrorKind};
use crate::table::schema::{FieldMode, FieldType, TableField, TableSchema};

/// The topic schema and the plan, as the row builder holds them.
#[derive(Debug, Clone)]
pub(in crate::table) struct TopicRows {
    schema: TopicSchema,
    plan: TopicPlan,
}

/// A revision's rows, or why its messages fail.
type Revision = Result<Arc<TopicRows>, String>;

/// Every schema revision's [`TopicRows`]: a message is read with its revision's, else the
/// fallback's. A revision first met while running (fetched through its [`TopicSchemas`]) is
/// checked against the table then; one that does not fit is logged and read with the fallback.
#[derive(Debug, Clone)]
pub(in crate::table) struct TopicReader {
    fallback: Arc<TopicRows>,
    /// Revision id → its rows, or why its messages fail (its schema does not fit the table);
    /// `None`: Pub/Sub has no such revision (its messages are read with the fallback).
    revisions: Arc<RwLock<BTreeMap<String, Option<Revision>>>>,
    schemas: TopicSchemas,
    table: TableSchema,
    drop_unknown: bool,
    write_metadata: bool,
}

impl TopicReader {
    pub(in crate::table) fn new(
        fallback: TopicRows,
        revisions: BTreeMap<String, TopicRows>,
        schemas: TopicSchemas,
        table: TableSchema,
        drop_unknown: bool,
        write_metadata: bool,
    ) -> Self {
        TopicReader {
            fallback: Arc::new(fallback),
            revisions: Arc::new(RwLock::new(
                revisions
                    .into_iter()
                    .map(|(k, v)| (k, Some(Ok(Arc::new(v)))))
                    .collect(),
            )),
            schemas,
            table,
            drop_unknown,
            write_metadata,
        }
    }

    /// The rows of the revision `msg` was published with. A revision whose schema does not fit
    /// the table fails its messages (each alone), naming the problems.
    pub(in crate::table) fn of_message(&self, msg: &Message) -> Result<Arc<TopicRows>, Fail> {
        let Some(id) = crate::avro::TopicSchema::revision_of(msg) else {
            return Ok(Arc::clone(&self.fallback));
        };
        let settled = |v: &Option<Revision>| match v {
            None => Ok(Arc::clone(&self.fallback)),
            Some(Ok(rows)) => Ok(Arc::clone(rows)),
            Some(Err(reason)) => Err(Bad::new(reason.clone()).into_fail()),
        };
        if let Some(known) = self.revisions.read().expect("not poisoned").get(id) {
            return settled(known);
        }
        let Some(topic) = self.schemas.lookup(id) else {
            // Not written with another revision's schema: asked again next time, unless Pub/Sub
            // said there is no such revision.
            if self.schemas.fetches() && !self.schemas.settled(id) {
                return Err(Bad::new(format!(
                    "topic schema revision {id} cannot be read now (reading it from Pub/Sub failed)"
                ))
                .into_fail());
            }
            self.revisions
                .write()
                .expect("not poisoned")
                .insert(id.to_owned(), None);
            return Ok(Arc::clone(&self.fallback));
        };
        let entry = match check_compatibility(
            topic.schema(),
            &self.table,
            self.drop_unknown,
            self.write_metadata,
        ) {
            Ok(plan) => Ok(Arc::new(TopicRows::new(topic, plan))),
            Err(e) => {
                tracing::error!(
                    revision = id,
                    "schema revision {id} does not fit the table: its messages fail: {e}"
                );
                Err(format!("schema revision {id} does not fit the table: {e}"))
            }
        };
        let entry = Some(entry);
        let answer = settled(&entry);
        self.revisions
            .write()
            .expect("not poisoned")
            .insert(id.to_owned(), entry);
        answer
    }
}

/// A failure inside the datum: where, and why.
struct Bad {
    path: DatumPath,
    reason: String,
}

impl Bad {
    fn new(reason: impl Into<String>) -> Self {
        Bad {
            path: DatumPath::default(),
            reason: reason.into(),
        }
    }

    fn at(mut self, segment: Segment) -> Self {
        self.path.push_outer(segment);
        self
    }

    fn into_fail(self) -> Fail {
        Fail {
            field: self.path.field(),
            kind: RowErrorKind::Invalid,
            reason: self.reason,
        }
    }
}

/// A message whose data is not a datum of the topic schema: the error's path (where a JSON value
/// did not fit) is the field, its whole text the reason.
impl From<DatumError> for Bad {
    fn from(e: DatumError) -> Self {
        Bad {
            reason: e.to_string(),
            path: e.path,
        }
    }
}

impl TopicRows {
    pub(in crate::table) fn new(schema: TopicSchema, plan: TopicPlan) -> Self {
        TopicRows { schema, plan }
    }

    /// One cell per planned column, from the message's datum.
    pub(in crate::table) fn convert(&self, msg: &Message) -> Result<Vec<Cell>, Fail> {
        let value = self.decode(msg).map_err(Bad::into_fail)?;
        let Avro::Record(fields) = value else {
            return Err(Bad::new("the datum is not a record").into_fail());
        };
        record_cells(&self.plan.slots, fields).map_err(Bad::into_fail)
    }

    /// The message's datum as an Avro value: BINARY decoded as it is, JSON converted by the Avro
    /// layer first. Either must decode completely.
    fn decode(&self, msg: &Message) -> Result<Avro, Bad> {
        Ok(self.schema.read_value(msg)?)
    }
}

fn null_cell(f: &TableField) -> Cell {
    if f.mode == FieldMode::Repeated {
        Cell::List(Vec::new())
    } else {
        Cell::Null
    }
}

fn record_cells(slots: &[Slot], fields: Vec<(String, Avro)>) -> Result<Vec<Cell>, Bad> {
    let mut values: Vec<Avro> = fields.into_iter().map(|(_, v)| v).collect();
    slots
        .iter()
        .map(|slot| match slot.source {
            None => Ok(null_cell(&slot.field)),
            Some(i) => {
                let v = values
                    .get_mut(i)
                    .map(|v| std::mem::replace(v, Avro::Null))
                    .ok_or_else(|| Bad::new("the datum lacks a field of the topic schema"))?;
                node_cell(&slot.node, &slot.field, v)
                    .map_err(|b| b.at(Segment::Field(slot.field.name.clone())))
            }
        })
        .collect()
}

fn node_cell(node: &Node, f: &TableField, v: Avro) -> Result<Cell, Bad> {
    match node {
        Node::Null => Ok(null_cell(f)),
        Node::Union(inner) => match v {
            Avro::Union(_, b) => match *b {
                Avro::Null => Ok(null_cell(f)),
                other => node_cell(inner, f, other),
            },
            Avro::Null => Ok(null_cell(f)),
            other => node_cell(inner, f, other),
        },
        Node::Record(slots) => match v {
            Avro::Record(fields) => record_cells(slots, fields).map(Cell::Struct),
            other => Err(unexpected("a record", &other)),
        },
        Node::Array(item) => match v {
            Avro::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, it)| node_cell(item, f, it).map_err(|b| b.at(Segment::Index(i))))
                .collect::<Result<Vec<_>, _>>()
                .map(Cell::List),
            other => Err(unexpected("an array", &other)),
        },
        Node::Map {
            sub,
            key,
            value,
            value_node,
        } => {
            let Avro::Map(entries) = v else {
                return Err(unexpected("a map", &v));
            };
            // Avro maps are unordered (and decode into a hash map): sort for stable output.
            let mut entries: Vec<(String, Avro)> = entries.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            entries
                .into_iter()
                .map(|(k, val)| {
                    let at = |b: Bad, sub_field: &TableField, key: &str| {
                        b.at(Segment::Field(sub_field.name.clone()))
                            .at(Segment::Key(key.to_string()))
                    };
                    let mut cells: Vec<Cell> = sub.iter().map(null_cell).collect();
                    cells[*value] = node_cell(value_node, &sub[*value], val)
                        .map_err(|b| at(b, &sub[*value], &k))?;
                    let k = Json::String(k);
                    cells[*key] = convert_scalar(&sub[*key].ty, &k, sub[*key].max_length)
                        .map_err(|e| at(Bad::new(e), &sub[*key], k.as_str().unwrap_or("")))?;
                    Ok(Cell::Struct(cells))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Cell::List)
        }
        Node::Scalar(conv) => scalar_cell(*conv, f, v).map_err(Bad::new),
    }
}

fn unexpected(want: &str, v: &Avro) -> Bad {
    Bad::new(format!(
        "internal: the decoded datum has {v:?} where the plan expects {want}"
    ))
}

fn target_scale(ty: &FieldType) -> u32 {
    if *ty == FieldType::BigNumeric {
        BIGNUMERIC_SCALE
    } else {
        NUMERIC_SCALE
    }
}

/// A NUMERIC/BIGNUMERIC cell from an unscaled value of the column's scale.
fn decimal_cell(ty: &FieldType, v: i256) -> Cell {
    if *ty == FieldType::BigNumeric {
        Cell::BigNumeric(v)
    } else {
        Cell::Numeric(v.as_i128())
    }
}

/// Decimal text (no exponent, trailing fractional zeros removed, as a decimal's scale does not
/// limit an exact value) into NUMERIC/BIGNUMERIC, with §4.3's range and scale checks.
fn decimal_text_cell(ty: &FieldType, text: &str) -> Result<Cell, String> {
    let trimmed = if text.contains('.') && !text.contains(['e', 'E']) {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        text
    };
    match parse_decimal_text(trimmed, target_scale(ty)) {
        Some(r) => r.map(|v| decimal_cell(ty, v)),
        None => Err(format!("{}: {text:?} is not a decimal number", ty.name())),
    }
}

/// The raw value of an int/long (or of a logical type built on one).
fn integer_of(v: &Avro) -> Option<i64> {
    Some(match *v {
        Avro::Int(i) | Avro::Date(i) | Avro::TimeMillis(i) => i64::from(i),
        Avro::Long(i)
        | Avro::TimeMicros(i)
        | Avro::TimestampMillis(i)
        | Avro::TimestampMicros(i)
        | Avro::TimestampNanos(i)
        | Avro::LocalTimestampMillis(i)
        | Avro::LocalTimestampMicros(i)
        | Avro::LocalTimestampNanos(i) => i,
        _ => return None,
    })
}

/// The raw bytes of a bytes/fixed value (or of a logical type built on one).
fn bytes_of(v: Avro) -> Result<Vec<u8>, Avro> {
    match v {
        Avro::Bytes(b) | Avro::Fixed(_, b) => Ok(b),
        Avro::Uuid(u) => Ok(u.as_bytes().to_vec()),
        Avro::Duration(d) => Ok(<[u8; 12]>::from(d).to_vec()),
        Avro::Decimal(d) => Vec::<u8>::try_from(&d).map_err(|_| Avro::Decimal(d)),
        other => Err(other),
    }
}

/// `unscaled / 10^scale` as decimal text.
fn decimal_text(unscaled: i256, scale: usize) -> String {
    // Sign and digits from the text, not from an absolute value: `i256::MIN` has none.
    let text = unscaled.to_string();
    let (sign, digits) = match text.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", text.as_str()),
    };
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// An Avro decimal's big-endian two's-complement bytes as a 256-bit integer.
fn i256_from_be(bytes: &[u8]) -> Option<i256> {
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let fill = if negative { 0xff } else { 0x00 };
    let mut le = [fill; 32];
    for (i, &b) in bytes.iter().rev().enumerate() {
        if i < 32 {
            le[i] = b;
        } else if b != fill {
            return None;
        }
    }
    if bytes.len() > 32 && (le[31] & 0x80 != 0) != negative {
        return None;
    }
    Some(i256::from_le_bytes(le))
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

fn scalar_cell(conv: Conv, f: &TableField, v: Avro) -> Result<Cell, String> {
    let ty = &f.ty;
    let wrong = |v: &Avro| format!("internal: the decoded datum has {v:?} for a {conv:?} column");
    match conv {
        Conv::Bool => match v {
            Avro::Boolean(b) => Ok(Cell::Bool(b)),
            other => Err(wrong(&other)),
        },
        Conv::Int => integer_of(&v).map(Cell::Int).ok_or_else(|| wrong(&v)),
        Conv::EnumIndex => match v {
            Avro::Enum(i, _) => Ok(Cell::Int(i64::from(i))),
            other => Err(wrong(&other)),
        },
        Conv::IntDecimal => {
            let n = integer_of(&v).ok_or_else(|| wrong(&v))?;
            decimal_text_cell(ty, &n.to_string())
        }
        Conv::Float => match v {
            Avro::Float(x) => Ok(Cell::Float(f64::from(x))),
            Avro::Double(x) => Ok(Cell::Float(x)),
            other => Err(wrong(&other)),
        },
        Conv::FloatDecimal => {
            // `Display` of f32/f64 is the shortest text that reads back as the same number.
            let (text, finite) = match v {
                Avro::Float(x) => (x.to_string(), x.is_finite()),
                Avro::Double(x) => (x.to_string(), x.is_finite()),
                other => return Err(wrong(&other)),
            };
            if !finite {
                return Err(format!("{}: {text} is not a finite number", ty.name()));
            }
            decimal_text_cell(ty, &text)
        }
        Conv::Bytes => bytes_of(v)
            .map_err(|v| wrong(&v))
            .and_then(|b| bytes_cell(b, f.max_length)),
        Conv::BytesDecimal => {
            let b = bytes_of(v).map_err(|v| wrong(&v))?;
            decode_big_decimal_bytes(&b, target_scale(ty)).map(|d| decimal_cell(ty, d))
        }
        Conv::Text => {
            let s = match v {
                Avro::String(s) => s,
                Avro::Uuid(u) => u.to_string(),
                other => return Err(wrong(&other)),
            };
            convert_scalar(ty, &Json::String(s), f.max_length)
        }
        Conv::Date => match v {
            Avro::Date(d) => date_from_days(i64::from(d)).map(Cell::Date),
            other => Err(wrong(&other)),
        },
        Conv::Time => {
            let micros = match v {
                Avro::TimeMillis(ms) => i64::from(ms) * 1000,
                Avro::TimeMicros(us) => us,
                other => return Err(wrong(&other)),
            };
            if (0..MICROS_PER_DAY).contains(&micros) {
                Ok(Cell::Time(micros))
            } else {
                Err(format!(
                    "TIME {micros} µs since midnight is outside 00:00:00 … 23:59:59.999999"
                ))
            }
        }
        Conv::Timestamp => {
            let micros = match v {
                Avro::TimestampMillis(ms) => ms.checked_mul(1000).ok_or_else(|| {
                    format!("TIMESTAMP {ms} ms is outside 0001-01-01 … 9999-12-31 UTC")
                })?,
                Avro::TimestampMicros(us) => us,
                other => return Err(wrong(&other)),
            };
            timestamp_from_micros(micros).map(Cell::Micros)
        }
        Conv::Decimal { scale } => {
            let bytes = bytes_of(v).map_err(|v| wrong(&v))?;
            let unscaled = i256_from_be(&bytes)
                .ok_or_else(|| format!("{}: decimal value out of range", ty.name()))?;
            decimal_text_cell(ty, &decimal_text(unscaled, scale))
        }
        Conv::BigDecimal => match v {
            Avro::BigDecimal(d) => decimal_text_cell(ty, &d.normalized().to_string()),
            other => Err(wrong(&other)),
        },
    }
}
