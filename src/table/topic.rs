//! `use_topic_schema` (SPEC §4.4): the topic's Avro schema gives the columns.
//!
//! Two steps, as in Pub/Sub:
//!
//! 1. **At startup**, [`check_compatibility`] matches the topic record's fields to the table's
//!    columns (exact name first, then case-insensitively, SPEC Q14; recursively into records and
//!    maps) and checks every rule of §4.4 and the metadata name rule of §4.5. It collects *all*
//!    problems into one [`CompatError`], which prints as a diff, one line per field. What it
//!    returns, a [`TopicPlan`], says for every column which topic field feeds it and how.
//! 2. **Per message**, the payload is decoded per its encoding (`googclient_schemaencoding`, else
//!    the topic's default): BINARY as one Avro datum, JSON through the encoder's Avro-JSON reader
//!    ([`TopicSchema::encode_datum`], with its readable mismatch errors) and then as a datum. The
//!    Avro value is turned into cells following the plan; string values go through
//!    [`convert_scalar`], the table-schema conversions of §4.3, so a string into TIMESTAMP or
//!    NUMERIC follows exactly the same rules in both modes. A message that fails, fails alone.
//!
//! # Types
//!
//! | Avro | BigQuery column | value written |
//! |---|---|---|
//! | `null` | any NULLABLE | NULL |
//! | `boolean` | BOOL | the boolean |
//! | `int`, `long` | INT64, NUMERIC, BIGNUMERIC | the integer (exact) |
//! | `float`, `double` | FLOAT64, NUMERIC, BIGNUMERIC | the number; into NUMERIC/BIGNUMERIC its shortest decimal form, NaN/±Infinity fail the message |
//! | `bytes`, `fixed` | BYTES, NUMERIC, BIGNUMERIC | the bytes; into NUMERIC/BIGNUMERIC they are `BigDecimalByteStringEncoder` bytes (§4.3.2) |
//! | `string` | STRING, JSON, TIMESTAMP, DATETIME, DATE, TIME, NUMERIC, BIGNUMERIC | as a JSON string in use_table_schema (§4.3): BigQuery's literal formats |
//! | `enum` | INT64 | the symbol's index |
//! | `record` | RECORD | field by field |
//! | `array` of T | REPEATED T | the items; items may not be nullable |
//! | `map` of V | REPEATED RECORD<`key` STRING, `value` V> | one record per entry, sorted by key |
//! | `["null", T]` (either order) | NULLABLE T; REPEATED T when T is an array or map | NULL (an empty array for REPEATED) |
//! | `[T]` | as T | |
//! | other unions | none | |
//!
//! Logical types match their BigQuery types *and* their underlying Avro type's:
//!
//! | logical type | BigQuery column | value written |
//! |---|---|---|
//! | `timestamp-micros`, `timestamp-millis` | TIMESTAMP (or as `long`) | the instant (millis × 1000) |
//! | `date` | DATE (or as `int`) | the day |
//! | `time-micros`, `time-millis` | TIME (or as `long`/`int`) | the time of day; outside 00:00–24:00 fails the message |
//! | `decimal(p, s)` | NUMERIC, BIGNUMERIC (or BYTES, its raw two's-complement bytes) | the exact value; digits beyond the column's scale (other than trailing zeros) or out of range fail the message |
//! | `big-decimal` | NUMERIC, BIGNUMERIC | as `decimal` |
//! | `duration` | (INTERVAL: not supported by the table writer) `fixed` targets only | its 12 bytes |
//! | `uuid`, `timestamp-nanos`, `local-timestamp-*` | as their underlying type | the underlying value (uuid as text or bytes) |
//!
//! A REPEATED column needs an Avro array or map (or a nullable one); a non-array field cannot go to
//! a REPEATED column, nor an array to a non-REPEATED one.

use std::collections::HashMap;
use std::fmt;

use apache_avro::schema::{
    DecimalSchema, InnerDecimalSchema, Name, RecordSchema, ResolvedSchema, UuidSchema,
};
use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use arrow_buffer::i256;
use serde_json::Value as Json;

use super::batch::{check_metadata_name_conflicts, is_metadata_column, Fail, RowErrorKind};
use super::convert::{
    convert_scalar, date_from_days, decode_big_decimal_bytes, parse_decimal_text,
    timestamp_from_micros, Cell, BIGNUMERIC_SCALE, NUMERIC_SCALE,
};
use super::schema::{FieldMode, FieldType, TableField, TableSchema};
use crate::encode::topic::{SchemaEncoding, TopicSchema};
use crate::encode::EncodeError;
use crate::message::Message;

// ---- the startup check ---------------------------------------------------------------------------

/// Which rule of SPEC §4.4 / §4.5 a field breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompatRule {
    /// The topic schema's root is not a record (or its named types do not resolve).
    Root,
    /// The topic field's type does not map to the column's type (or mode: array ↔ REPEATED).
    Type,
    /// A union other than `null` plus one type.
    Union,
    /// An optional (nullable-union or `null`) topic field into a column that is not NULLABLE.
    OptionalNotNullable,
    /// A REQUIRED column that no topic field feeds.
    AbsentColumnRequired,
    /// A topic field that is not a column, without `drop_unknown_fields`.
    UnknownField,
    /// With write_metadata, a topic field named like a metadata column (§4.5).
    MetadataName,
    /// The table schema cannot be used in this mode at all (e.g. a metadata column of the wrong
    /// type); found by the row builder.
    Table,
}

/// One incompatible field: its path and both sides, as the diff shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incompatibility {
    /// Dotted path (`customer.tier`; a map's entries are `props.key` / `props.value`), or `$`.
    pub path: String,
    /// The topic field's Avro type (`["null", "string"]`, `long (timestamp-micros)`), or `-`.
    pub topic: String,
    /// The column's type and mode (`INT64 REQUIRED`), or `-`.
    pub table: String,
    pub rule: CompatRule,
    /// What is wrong and what would fit.
    pub reason: String,
}

/// Why a topic schema cannot feed a table (SPEC §4.4). Every problem is listed; `Display` prints
/// them as a diff, one line per field:
///
/// ```text
/// use_topic_schema: the topic schema does not fit the table (2 problems):
///   qty   topic: string  table: INT64 REQUIRED  → incompatible schema type: expected INT64, got string (string fits STRING, JSON, …)
///   note  topic: -       table: STRING REQUIRED → the column is not in the topic schema, so it must be NULLABLE
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct CompatError {
    pub problems: Vec<Incompatibility>,
}

impl fmt::Display for CompatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "use_topic_schema: the topic schema does not fit the table ({n} problem{}):",
            if n == 1 { "" } else { "s" }
        )?;
        let width = |get: fn(&Incompatibility) -> &str| {
            self.problems
                .iter()
                .map(|p| get(p).chars().count())
                .max()
                .unwrap_or(0)
        };
        let (wp, wt, wb) = (width(|p| &p.path), width(|p| &p.topic), width(|p| &p.table));
        for p in &self.problems {
            write!(
                f,
                "\n  {:wp$}  topic: {:wt$}  table: {:wb$}  → {}",
                p.path, p.topic, p.table, p.reason
            )?;
        }
        Ok(())
    }
}

/// How each column is fed from the topic schema, decided once by [`check_compatibility`].
#[derive(Debug, Clone)]
pub struct TopicPlan {
    /// One per non-metadata top-level column, in table order.
    slots: Vec<Slot>,
    warnings: Vec<String>,
}

impl TopicPlan {
    /// Things worth logging that are not errors (a topic field named `data`, SPEC Q7).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The columns the plan feeds, in order (the table's columns minus the metadata columns
    /// when write_metadata is on).
    pub fn columns(&self) -> impl Iterator<Item = &TableField> {
        self.slots.iter().map(|s| &s.field)
    }
}

/// One column (or sub-field) and where its value comes from.
#[derive(Debug, Clone)]
struct Slot {
    field: TableField,
    /// Index of the topic record's field; `None`: not in the topic schema, always NULL/empty.
    source: Option<usize>,
    node: Node,
}

/// What one topic value becomes.
#[derive(Debug, Clone)]
enum Node {
    /// Avro `null`: always NULL.
    Null,
    /// A union of `null` and one type, or of one type alone: NULL, or the branch's value.
    Union(Box<Node>),
    Scalar(Conv),
    Record(Vec<Slot>),
    /// The items of a REPEATED column.
    Array(Box<Node>),
    /// A map into REPEATED RECORD: one record per entry, `key` and `value` at these sub-field
    /// positions, every other sub-field NULL (or empty).
    Map {
        sub: Vec<TableField>,
        key: usize,
        value: usize,
        value_node: Box<Node>,
    },
}

/// A scalar conversion, chosen by the Avro type and the column type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Conv {
    /// boolean → BOOL.
    Bool,
    /// int/long (and the raw value of their logical types) → INT64.
    Int,
    /// enum → INT64, its index.
    EnumIndex,
    /// int/long → NUMERIC/BIGNUMERIC, exactly.
    IntDecimal,
    /// float/double → FLOAT64.
    Float,
    /// float/double → NUMERIC/BIGNUMERIC, its shortest decimal form.
    FloatDecimal,
    /// bytes/fixed (raw) → BYTES.
    Bytes,
    /// bytes/fixed → NUMERIC/BIGNUMERIC: `BigDecimalByteStringEncoder` bytes.
    BytesDecimal,
    /// string → STRING/JSON/date-time/decimal types, as a JSON string in §4.3.
    Text,
    /// date → DATE.
    Date,
    /// time-micros/time-millis → TIME.
    Time,
    /// timestamp-micros/timestamp-millis → TIMESTAMP.
    Timestamp,
    /// decimal(p, s) → NUMERIC/BIGNUMERIC.
    Decimal { scale: usize },
    /// big-decimal → NUMERIC/BIGNUMERIC.
    BigDecimal,
}

/// Check that `topic` can feed `table` under SPEC §4.4 and §4.5, and plan how.
///
/// * The topic schema must be a record. Its fields match columns by name: exact first, then
///   case-insensitively (Q14); the same inside records and maps.
/// * Types must be compatible (the tables in the [module docs](self)).
/// * An optional topic field (a union with `null`, or `null`) needs a NULLABLE column (REPEATED
///   for an optional array or map); a required one may go to NULLABLE or REQUIRED.
/// * A column absent from the topic schema must be NULLABLE or REPEATED (it is written NULL or
///   empty).
/// * A topic field that is not a column needs `drop_unknown_fields`.
/// * With `write_metadata`, top-level columns named like a metadata column are the metadata's,
///   not the topic's, and a topic field named like one (snake_case or camelCase, §4.5) is an
///   error.
pub fn check_compatibility(
    topic: &Schema,
    table: &TableSchema,
    drop_unknown_fields: bool,
    write_metadata: bool,
) -> Result<TopicPlan, CompatError> {
    let mut c = Checker {
        names: HashMap::new(),
        drop_unknown: drop_unknown_fields,
        problems: Vec::new(),
    };
    let root = |reason: String| CompatError {
        problems: vec![Incompatibility {
            path: "$".into(),
            topic: "-".into(),
            table: "-".into(),
            rule: CompatRule::Root,
            reason,
        }],
    };
    match ResolvedSchema::try_from(topic) {
        Ok(r) => {
            c.names = r
                .get_names()
                .iter()
                .map(|(n, s)| (n.clone(), (*s).clone()))
                .collect();
        }
        Err(e) => return Err(root(format!("the topic schema does not resolve: {e}"))),
    }
    let Schema::Record(record) = c.resolve(topic).clone() else {
        return Err(root(format!(
            "the topic schema must be a record to give columns, this one is {}",
            c.describe(topic)
        )));
    };
    let mut warnings = Vec::new();
    let mut reserved = vec![false; record.fields.len()];
    for (i, f) in record.fields.iter().enumerate() {
        match check_metadata_name_conflicts(write_metadata, true, [f.name.as_str()]) {
            Ok(w) => warnings.extend(w),
            Err(e) => {
                reserved[i] = true;
                c.problem(
                    &f.name,
                    Some(&f.schema),
                    None,
                    CompatRule::MetadataName,
                    e.reason,
                );
            }
        }
    }
    let columns: Vec<TableField> = table
        .fields
        .iter()
        .filter(|f| !is_metadata_column(&f.name, write_metadata))
        .cloned()
        .collect();
    let slots = c.record(&record, &columns, "", &reserved);
    if c.problems.is_empty() {
        Ok(TopicPlan { slots, warnings })
    } else {
        Err(CompatError {
            problems: c.problems,
        })
    }
}

struct Checker {
    /// Every named type, to resolve `Schema::Ref`.
    names: HashMap<Name, Schema>,
    drop_unknown: bool,
    problems: Vec<Incompatibility>,
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

fn mode_name(m: FieldMode) -> &'static str {
    match m {
        FieldMode::Nullable => "NULLABLE",
        FieldMode::Required => "REQUIRED",
        FieldMode::Repeated => "REPEATED",
    }
}

/// A column as the diff shows it: `INT64 REQUIRED`.
pub(super) fn column_desc(f: &TableField) -> String {
    format!("{} {}", f.ty.name(), mode_name(f.mode))
}

/// "A, B or C".
fn one_of(types: &[FieldType]) -> String {
    let names: Vec<&str> = types.iter().map(FieldType::name).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

const INTEGER_TARGETS: [FieldType; 3] =
    [FieldType::Int64, FieldType::Numeric, FieldType::BigNumeric];
const FLOAT_TARGETS: [FieldType; 3] = [
    FieldType::Float64,
    FieldType::Numeric,
    FieldType::BigNumeric,
];
const BYTES_TARGETS: [FieldType; 3] = [FieldType::Bytes, FieldType::Numeric, FieldType::BigNumeric];
const STRING_TARGETS: [FieldType; 8] = [
    FieldType::String,
    FieldType::Json,
    FieldType::Timestamp,
    FieldType::DateTime,
    FieldType::Date,
    FieldType::Time,
    FieldType::Numeric,
    FieldType::BigNumeric,
];

fn is_decimal(ty: &FieldType) -> bool {
    matches!(ty, FieldType::Numeric | FieldType::BigNumeric)
}

impl Checker {
    fn resolve<'s>(&'s self, s: &'s Schema) -> &'s Schema {
        match s {
            Schema::Ref { name } => self.names.get(name).unwrap_or(s),
            _ => s,
        }
    }

    fn problem(
        &mut self,
        path: &str,
        topic: Option<&Schema>,
        column: Option<&TableField>,
        rule: CompatRule,
        reason: impl Into<String>,
    ) {
        self.problems.push(Incompatibility {
            path: path.to_string(),
            topic: topic.map_or_else(|| "-".to_string(), |s| self.describe(s)),
            table: column.map_or_else(|| "-".to_string(), column_desc),
            rule,
            reason: reason.into(),
        });
    }

    /// An Avro type as the diff shows it.
    fn describe(&self, s: &Schema) -> String {
        let named = |kind: &str, n: &Name| format!("{kind} {}", n.name());
        match s {
            Schema::Null => "null".into(),
            Schema::Boolean => "boolean".into(),
            Schema::Int => "int".into(),
            Schema::Long => "long".into(),
            Schema::Float => "float".into(),
            Schema::Double => "double".into(),
            Schema::Bytes => "bytes".into(),
            Schema::String => "string".into(),
            Schema::Array(a) => format!("array<{}>", self.describe(&a.items)),
            Schema::Map(m) => format!("map<{}>", self.describe(&m.types)),
            Schema::Union(u) => {
                let v: Vec<String> = u.variants().iter().map(|s| self.describe(s)).collect();
                format!("[{}]", v.join(", "))
            }
            Schema::Record(r) => named("record", &r.name),
            Schema::Enum(e) => named("enum", &e.name),
            Schema::Fixed(f) => format!("fixed {}({})", f.name.name(), f.size),
            Schema::Decimal(d) => {
                let inner = match &d.inner {
                    InnerDecimalSchema::Bytes => "bytes".to_string(),
                    InnerDecimalSchema::Fixed(f) => format!("fixed {}({})", f.name.name(), f.size),
                };
                format!("{inner} (decimal({}, {}))", d.precision, d.scale)
            }
            Schema::BigDecimal => "bytes (big-decimal)".into(),
            Schema::Uuid(UuidSchema::String) => "string (uuid)".into(),
            Schema::Uuid(UuidSchema::Bytes) => "bytes (uuid)".into(),
            Schema::Uuid(UuidSchema::Fixed(f)) => {
                format!("fixed {}({}) (uuid)", f.name.name(), f.size)
            }
            Schema::Date => "int (date)".into(),
            Schema::TimeMillis => "int (time-millis)".into(),
            Schema::TimeMicros => "long (time-micros)".into(),
            Schema::TimestampMillis => "long (timestamp-millis)".into(),
            Schema::TimestampMicros => "long (timestamp-micros)".into(),
            Schema::TimestampNanos => "long (timestamp-nanos)".into(),
            Schema::LocalTimestampMillis => "long (local-timestamp-millis)".into(),
            Schema::LocalTimestampMicros => "long (local-timestamp-micros)".into(),
            Schema::LocalTimestampNanos => "long (local-timestamp-nanos)".into(),
            Schema::Duration(f) => format!("fixed {}({}) (duration)", f.name.name(), f.size),
            Schema::Ref { name } => match self.names.get(name) {
                Some(target) => self.describe(target),
                None => name.fullname(None),
            },
        }
    }

    /// Match the fields of `record` to `columns` and plan each column. `skip[i]`: topic field
    /// `i` was already reported (metadata name).
    fn record(
        &mut self,
        record: &RecordSchema,
        columns: &[TableField],
        prefix: &str,
        skip: &[bool],
    ) -> Vec<Slot> {
        let mut source: Vec<Option<usize>> = vec![None; columns.len()];
        let mut unmatched = Vec::new();
        for (i, f) in record.fields.iter().enumerate() {
            if skip.get(i).copied().unwrap_or(false) {
                continue;
            }
            match columns.iter().position(|c| c.name == f.name) {
                Some(j) if source[j].is_none() => source[j] = Some(i),
                _ => unmatched.push(i),
            }
        }
        for i in unmatched {
            let f = &record.fields[i];
            match columns
                .iter()
                .position(|c| c.name.eq_ignore_ascii_case(&f.name))
            {
                Some(j) if source[j].is_none() => source[j] = Some(i),
                _ if self.drop_unknown => {}
                taken => {
                    let reason = match taken {
                        Some(j) => format!(
                            "not a column of the table: column `{}` already takes the topic \
                             field of exactly its name; set drop_unknown_fields to drop this one",
                            columns[j].name
                        ),
                        None => "not a column of the table; add the column or set \
                                 drop_unknown_fields to drop the field"
                            .to_string(),
                    };
                    self.problem(
                        &join(prefix, &f.name),
                        Some(&f.schema),
                        None,
                        CompatRule::UnknownField,
                        reason,
                    );
                }
            }
        }
        columns
            .iter()
            .zip(source)
            .map(|(col, src)| {
                let path = join(prefix, &col.name);
                let node = match src {
                    Some(i) => self.field(&record.fields[i].schema, col, &path),
                    None => {
                        if col.mode == FieldMode::Required {
                            self.problem(
                                &path,
                                None,
                                Some(col),
                                CompatRule::AbsentColumnRequired,
                                "the column is not in the topic schema, so it must be NULLABLE \
                                 (it is written NULL)",
                            );
                        }
                        Node::Null
                    }
                };
                Slot {
                    field: col.clone(),
                    source: src,
                    node,
                }
            })
            .collect()
    }

    /// Plan one topic field (any schema) into `col`, mode included.
    fn field(&mut self, schema: &Schema, col: &TableField, path: &str) -> Node {
        let schema = self.resolve(schema).clone();
        match &schema {
            Schema::Null => {
                if col.mode != FieldMode::Nullable {
                    self.problem(
                        path,
                        Some(&schema),
                        Some(col),
                        CompatRule::OptionalNotNullable,
                        "a null topic field needs a NULLABLE column",
                    );
                }
                Node::Null
            }
            Schema::Union(u) => {
                let variants = u.variants();
                let has_null = variants.iter().any(|v| matches!(v, Schema::Null));
                let others: Vec<&Schema> = variants
                    .iter()
                    .filter(|v| !matches!(v, Schema::Null))
                    .collect();
                match (has_null, others.as_slice()) {
                    (true, []) => self.field(&Schema::Null, col, path),
                    (false, [only]) => Node::Union(Box::new(self.field(only, col, path))),
                    (true, [only]) => {
                        let only = self.resolve(only).clone();
                        let repeated = matches!(only, Schema::Array(_) | Schema::Map(_));
                        if col.mode == FieldMode::Required
                            || (col.mode == FieldMode::Repeated && !repeated)
                        {
                            self.problem(
                                path,
                                Some(&schema),
                                Some(col),
                                CompatRule::OptionalNotNullable,
                                "an optional topic field (a union with null) needs a NULLABLE \
                                 column (REPEATED if it is an array or map)",
                            );
                            return Node::Null;
                        }
                        Node::Union(Box::new(self.value(&only, col, path)))
                    }
                    _ => {
                        self.problem(
                            path,
                            Some(&schema),
                            Some(col),
                            CompatRule::Union,
                            "not mappable: only a union of null and one type (NULLABLE) has a \
                             BigQuery type",
                        );
                        Node::Null
                    }
                }
            }
            _ => self.value(&schema, col, path),
        }
    }

    /// Plan a non-union, non-null topic value into `col`: arrays and maps need REPEATED, other
    /// values need NULLABLE or REQUIRED.
    fn value(&mut self, schema: &Schema, col: &TableField, path: &str) -> Node {
        let schema = self.resolve(schema).clone();
        match &schema {
            Schema::Array(a) => {
                if col.mode != FieldMode::Repeated {
                    self.mismatch(path, &schema, col, "an array fits a REPEATED column");
                    return Node::Null;
                }
                let items = self.resolve(&a.items).clone();
                let nullable = match &items {
                    Schema::Null => true,
                    Schema::Union(u) => u.is_nullable(),
                    _ => false,
                };
                if nullable {
                    self.problem(
                        path,
                        Some(&schema),
                        Some(col),
                        CompatRule::Type,
                        "the array's items can be null, but BigQuery arrays cannot hold NULL",
                    );
                    return Node::Null;
                }
                Node::Array(Box::new(self.element(&items, col, path)))
            }
            Schema::Map(m) => self.map(&schema, &m.types, col, path),
            _ if col.mode == FieldMode::Repeated => {
                self.mismatch(
                    path,
                    &schema,
                    col,
                    "a REPEATED column needs an Avro array (or map)",
                );
                Node::Null
            }
            _ => self.element(&schema, col, path),
        }
    }

    /// Plan one value (an array item, or a non-repeated field) by type alone.
    fn element(&mut self, schema: &Schema, col: &TableField, path: &str) -> Node {
        let schema = self.resolve(schema).clone();
        match (&schema, &col.ty) {
            (Schema::Record(r), FieldType::Record(sub)) => {
                Node::Record(self.record(r, sub, path, &[]))
            }
            (Schema::Record(_), _) => {
                self.mismatch(path, &schema, col, "a record fits RECORD");
                Node::Null
            }
            (Schema::Array(_) | Schema::Map(_), _) => {
                self.problem(
                    path,
                    Some(&schema),
                    Some(col),
                    CompatRule::Type,
                    "an array or map inside an array has no BigQuery type (BigQuery arrays do \
                     not nest); wrap the inner one in a record",
                );
                Node::Null
            }
            (Schema::Union(u), _) if !u.is_nullable() && u.variants().len() == 1 => {
                let only = u.variants()[0].clone();
                Node::Union(Box::new(self.element(&only, col, path)))
            }
            (Schema::Union(_), _) => {
                self.problem(
                    path,
                    Some(&schema),
                    Some(col),
                    CompatRule::Union,
                    "not mappable here: only a union of null and one type has a BigQuery type, \
                     and array items cannot be NULL",
                );
                Node::Null
            }
            (Schema::Null, _) => {
                self.problem(
                    path,
                    Some(&schema),
                    Some(col),
                    CompatRule::Type,
                    "null items cannot go into an array",
                );
                Node::Null
            }
            _ => match scalar_conv(&schema, &self.describe(&schema), &col.ty) {
                Ok(conv) => Node::Scalar(conv),
                Err(fits) => {
                    self.mismatch(path, &schema, col, &fits);
                    Node::Null
                }
            },
        }
    }

    /// map<V> → REPEATED RECORD<key STRING, value V>.
    fn map(&mut self, schema: &Schema, values: &Schema, col: &TableField, path: &str) -> Node {
        let shape = "a map fits REPEATED RECORD<key STRING, value …>";
        let FieldType::Record(sub) = &col.ty else {
            self.mismatch(path, schema, col, shape);
            return Node::Null;
        };
        if col.mode != FieldMode::Repeated {
            self.mismatch(path, schema, col, shape);
            return Node::Null;
        }
        let find = |name: &str| {
            sub.iter()
                .position(|f| f.name == name)
                .or_else(|| sub.iter().position(|f| f.name.eq_ignore_ascii_case(name)))
        };
        let (Some(key), Some(value)) = (find("key"), find("value")) else {
            self.problem(
                path,
                Some(schema),
                Some(col),
                CompatRule::Type,
                format!("{shape}: the record needs sub-fields `key` and `value`"),
            );
            return Node::Null;
        };
        let key_path = join(path, &sub[key].name);
        if sub[key].ty != FieldType::String || sub[key].mode == FieldMode::Repeated {
            self.problem(
                &key_path,
                Some(&Schema::String),
                Some(&sub[key]),
                CompatRule::Type,
                "incompatible schema type: a map's keys fit a STRING (NULLABLE or REQUIRED) \
                 `key` sub-field",
            );
        }
        for (i, f) in sub.iter().enumerate() {
            if i != key && i != value && f.mode == FieldMode::Required {
                self.problem(
                    &join(path, &f.name),
                    None,
                    Some(f),
                    CompatRule::AbsentColumnRequired,
                    "a map entry only has `key` and `value`, so other sub-fields must be NULLABLE",
                );
            }
        }
        let value_node = self.field(values, &sub[value], &join(path, &sub[value].name));
        Node::Map {
            sub: sub.clone(),
            key,
            value,
            value_node: Box::new(value_node),
        }
    }

    fn mismatch(&mut self, path: &str, schema: &Schema, col: &TableField, fits: &str) {
        let got = self.describe(schema);
        let what = if col.mode == FieldMode::Repeated {
            format!("REPEATED {}", col.ty.name())
        } else {
            col.ty.name().to_string()
        };
        self.problem(
            path,
            Some(schema),
            Some(col),
            CompatRule::Type,
            format!("incompatible schema type: expected {what}, got {got} ({fits})"),
        );
    }
}

/// The conversion of a scalar Avro type (described as `desc`) into `ty`, or what it fits instead.
fn scalar_conv(schema: &Schema, desc: &str, ty: &FieldType) -> Result<Conv, String> {
    let fits = |types: &[FieldType]| format!("{desc} fits {}", one_of(types));
    let integer = || {
        if *ty == FieldType::Int64 {
            Ok(Conv::Int)
        } else if is_decimal(ty) {
            Ok(Conv::IntDecimal)
        } else {
            Err(fits(&INTEGER_TARGETS))
        }
    };
    let bytes = |note: &str| {
        if *ty == FieldType::Bytes {
            Ok(Conv::Bytes)
        } else if is_decimal(ty) {
            Ok(Conv::BytesDecimal)
        } else {
            Err(format!("{}{note}", fits(&BYTES_TARGETS)))
        }
    };
    // A logical type of the table matches its BigQuery type and its underlying int/long's.
    let logical = |target: FieldType, conv: Conv| {
        if *ty == target {
            Ok(conv)
        } else {
            let mut all = vec![target];
            all.extend(INTEGER_TARGETS);
            integer().map_err(|_| fits(&all))
        }
    };
    match schema {
        Schema::Boolean if *ty == FieldType::Bool => Ok(Conv::Bool),
        Schema::Boolean => Err(fits(&[FieldType::Bool])),
        Schema::Int
        | Schema::Long
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => integer(),
        Schema::Float | Schema::Double if *ty == FieldType::Float64 => Ok(Conv::Float),
        Schema::Float | Schema::Double if is_decimal(ty) => Ok(Conv::FloatDecimal),
        Schema::Float | Schema::Double => Err(fits(&FLOAT_TARGETS)),
        Schema::Bytes
        | Schema::Fixed(_)
        | Schema::Uuid(UuidSchema::Bytes | UuidSchema::Fixed(_)) => bytes(""),
        Schema::Duration(_) => bytes(" (its INTERVAL column type is not supported)"),
        Schema::String | Schema::Uuid(UuidSchema::String) if STRING_TARGETS.contains(ty) => {
            Ok(Conv::Text)
        }
        Schema::String | Schema::Uuid(UuidSchema::String) => Err(fits(&STRING_TARGETS)),
        Schema::Enum(_) if *ty == FieldType::Int64 => Ok(Conv::EnumIndex),
        Schema::Enum(_) => Err(format!("{} (its index)", fits(&[FieldType::Int64]))),
        Schema::Date => logical(FieldType::Date, Conv::Date),
        Schema::TimeMillis | Schema::TimeMicros => logical(FieldType::Time, Conv::Time),
        Schema::TimestampMillis | Schema::TimestampMicros => {
            logical(FieldType::Timestamp, Conv::Timestamp)
        }
        Schema::Decimal(DecimalSchema { scale, .. }) if is_decimal(ty) => {
            Ok(Conv::Decimal { scale: *scale })
        }
        Schema::Decimal(_) if *ty == FieldType::Bytes => Ok(Conv::Bytes),
        Schema::Decimal(_) => Err(format!(
            "{} (BYTES: its two's-complement bytes)",
            fits(&BYTES_TARGETS)
        )),
        Schema::BigDecimal if is_decimal(ty) => Ok(Conv::BigDecimal),
        Schema::BigDecimal => Err(fits(&[FieldType::Numeric, FieldType::BigNumeric])),
        // Composite types are planned by the caller.
        _ => Err(format!("{desc} has no scalar conversion")),
    }
}

// ---- per message -------------------------------------------------------------------------------

/// The topic schema and the plan, as the row builder holds them.
#[derive(Debug, Clone)]
pub(super) struct TopicRows {
    schema: TopicSchema,
    plan: TopicPlan,
}

/// A failure inside the datum: the path from the root (innermost first) and why.
struct Bad {
    path: Vec<String>,
    kind: RowErrorKind,
    reason: String,
}

impl Bad {
    fn new(reason: impl Into<String>) -> Self {
        Bad {
            path: Vec::new(),
            kind: RowErrorKind::Invalid,
            reason: reason.into(),
        }
    }

    fn at(mut self, segment: impl Into<String>) -> Self {
        self.path.push(segment.into());
        self
    }

    fn into_fail(self) -> Fail {
        let mut field = String::new();
        for s in self.path.iter().rev() {
            if !field.is_empty() && !s.starts_with('[') {
                field.push('.');
            }
            field.push_str(s);
        }
        if field.is_empty() {
            field.push('$');
        }
        Fail {
            field,
            kind: self.kind,
            reason: self.reason,
        }
    }
}

impl TopicRows {
    pub(super) fn new(schema: TopicSchema, plan: TopicPlan) -> Self {
        TopicRows { schema, plan }
    }

    /// One cell per planned column, from the message's datum.
    pub(super) fn convert(&self, msg: &Message) -> Result<Vec<Cell>, Fail> {
        let value = self.decode(msg).map_err(Bad::into_fail)?;
        let Avro::Record(fields) = value else {
            return Err(Bad::new("the datum is not a record").into_fail());
        };
        record_cells(&self.plan.slots, fields).map_err(Bad::into_fail)
    }

    /// The message's datum as an Avro value: BINARY decoded as it is, JSON through the encoder's
    /// Avro-JSON reader first. Either must decode completely.
    fn decode(&self, msg: &Message) -> Result<Avro, Bad> {
        let encoding = self
            .schema
            .encoding_of(msg)
            .map_err(|e| Bad::new(e.to_string()))?;
        let mut converted = Vec::new();
        let datum: &[u8] = match encoding {
            SchemaEncoding::Binary => &msg.data,
            SchemaEncoding::Json => {
                self.schema
                    .encode_datum(msg, &mut converted)
                    .map_err(|EncodeError::BadMessage { reason, .. }| json_failure(reason))?;
                &converted
            }
        };
        let reader = apache_avro::reader::datum::GenericDatumReader::builder(self.schema.schema())
            .build()
            .map_err(|e| Bad::new(e.to_string()))?;
        let mut rest = datum;
        let value = reader.read_value(&mut rest).map_err(|e| {
            Bad::new(format!(
                "{encoding} data does not decode with the topic schema: {e}"
            ))
        })?;
        if !rest.is_empty() {
            return Err(Bad::new(format!(
                "{encoding} data does not decode with the topic schema: {} bytes left after the \
                 datum",
                rest.len()
            )));
        }
        Ok(value)
    }
}

/// A JSON message the encoder's Avro-JSON reader refused. Its reason reads
/// `… at $.a.b[2]: why`; the path is lifted into the error's field (best effort: a map key
/// containing `: ` leaves the field at `$`, the reason still has it).
fn json_failure(reason: String) -> Bad {
    let path = reason.find(" at $").and_then(|i| {
        let rest = &reason[i + " at $".len()..];
        let end = rest.find(": ")?;
        let p = &rest[..end];
        (!p.contains(": ")).then(|| p.trim_start_matches('.').to_string())
    });
    let mut bad = Bad::new(reason);
    if let Some(p) = path.filter(|p| !p.is_empty()) {
        bad.path.push(p);
    }
    bad
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
                node_cell(&slot.node, &slot.field, v).map_err(|b| b.at(&slot.field.name))
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
                .map(|(i, it)| node_cell(item, f, it).map_err(|b| b.at(format!("[{i}]"))))
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
                    let at = format!("[{k:?}]");
                    let mut cells: Vec<Cell> = sub.iter().map(null_cell).collect();
                    cells[*value] = node_cell(value_node, &sub[*value], val)
                        .map_err(|b| b.at(&sub[*value].name).at(&at))?;
                    cells[*key] =
                        convert_scalar(&sub[*key].ty, &Json::String(k), sub[*key].max_length)
                            .map_err(|e| Bad::new(e).at(&sub[*key].name).at(&at))?;
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

fn bytes_cell(b: Vec<u8>, max_length: Option<u64>) -> Result<Cell, String> {
    if let Some(max) = max_length {
        if b.len() as u64 > max {
            return Err(format!(
                "BYTES of {} bytes exceeds maxLength {max}",
                b.len()
            ));
        }
    }
    Ok(Cell::Bytes(b))
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use apache_avro::types::Value;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Date32Type, Decimal128Type, Decimal256Type, Float64Type, Int64Type, Time64MicrosecondType,
        TimestampMicrosecondType,
    };
    use arrow_array::{Array, RecordBatch, StructArray};
    use bytes::Bytes;
    use serde_json::json;

    use super::*;
    use crate::encode::topic::ENCODING_ATTRIBUTE;
    use crate::table::batch::{RowBuilder, RowError, RowOptions, SchemaMode};

    fn topic(text: &str) -> TopicSchema {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn table(text: &str) -> TableSchema {
        TableSchema::from_json(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn topic_mode() -> RowOptions {
        RowOptions {
            mode: SchemaMode::UseTopicSchema,
            ..RowOptions::default()
        }
    }

    fn message(id: &str, data: Vec<u8>, encoding: &str) -> Message {
        Message {
            data: Bytes::from(data),
            attributes: [(ENCODING_ATTRIBUTE.to_string(), encoding.to_string())].into(),
            message_id: id.to_string(),
            publish_time_micros: 1_700_000_000_000_000,
            ordering_key: String::new(),
        }
    }

    fn binary(schema: &TopicSchema, value: Value) -> Vec<u8> {
        apache_avro::writer::datum::GenericDatumWriter::builder(schema.schema())
            .build()
            .unwrap()
            .write_value_to_vec(value)
            .unwrap()
    }

    fn pow10(n: u32) -> i256 {
        i256::from_i128(10).checked_pow(n).unwrap()
    }

    /// Bytes in the Avro JSON encoding: one code point 0–255 per byte.
    fn json_bytes(b: &[u8]) -> String {
        b.iter().map(|&b| char::from(b)).collect()
    }

    // ---- the compatibility table -------------------------------------------------------------

    /// One topic field `c` of Avro type `avro` into one column `c` declared by `decl`.
    fn one(avro: &str, decl: &str) -> Result<TopicPlan, CompatError> {
        let t = topic(&format!(
            r#"{{"type":"record","name":"T","fields":[{{"name":"c","type":{avro}}}]}}"#
        ));
        check_compatibility(
            t.schema(),
            &table(&format!(r#"[{{"name":"c",{decl}}}]"#)),
            false,
            false,
        )
    }

    fn col(ty: &str, mode: &str) -> String {
        format!(r#""type":"{ty}","mode":"{mode}""#)
    }

    const KV_LONG: &str = r#""type":"RECORD","mode":"REPEATED","fields":[
        {"name":"key","type":"STRING","mode":"REQUIRED"},{"name":"value","type":"INT64"}]"#;
    const REC_X: &str = r#""type":"RECORD","fields":[{"name":"x","type":"INT64"}]"#;
    const AVRO_REC_X: &str =
        r#"{"type":"record","name":"R","fields":[{"name":"x","type":"long"}]}"#;

    #[test]
    fn every_row_of_the_avro_type_table() {
        let all = [
            "STRING",
            "BYTES",
            "INT64",
            "FLOAT64",
            "NUMERIC",
            "BIGNUMERIC",
            "BOOL",
            "TIMESTAMP",
            "DATE",
            "TIME",
            "DATETIME",
            "JSON",
        ];
        // (Avro type, the BigQuery types it fits; every other scalar type is refused).
        let rows: &[(&str, &[&str])] = &[
            (r#""boolean""#, &["BOOL"]),
            (r#""int""#, &["INT64", "NUMERIC", "BIGNUMERIC"]),
            (r#""long""#, &["INT64", "NUMERIC", "BIGNUMERIC"]),
            (r#""float""#, &["FLOAT64", "NUMERIC", "BIGNUMERIC"]),
            (r#""double""#, &["FLOAT64", "NUMERIC", "BIGNUMERIC"]),
            (r#""bytes""#, &["BYTES", "NUMERIC", "BIGNUMERIC"]),
            (
                r#""string""#,
                &[
                    "STRING",
                    "JSON",
                    "TIMESTAMP",
                    "DATETIME",
                    "DATE",
                    "TIME",
                    "NUMERIC",
                    "BIGNUMERIC",
                ],
            ),
            (
                r#"{"type":"fixed","name":"F","size":4}"#,
                &["BYTES", "NUMERIC", "BIGNUMERIC"],
            ),
            (
                r#"{"type":"enum","name":"E","symbols":["A","B"]}"#,
                &["INT64"],
            ),
            // Logical types: their own type, and their underlying type's.
            (
                r#"{"type":"long","logicalType":"timestamp-micros"}"#,
                &["TIMESTAMP", "INT64", "NUMERIC", "BIGNUMERIC"],
            ),
            (
                r#"{"type":"long","logicalType":"timestamp-millis"}"#,
                &["TIMESTAMP", "INT64", "NUMERIC", "BIGNUMERIC"],
            ),
            (
                r#"{"type":"int","logicalType":"date"}"#,
                &["DATE", "INT64", "NUMERIC", "BIGNUMERIC"],
            ),
            (
                r#"{"type":"long","logicalType":"time-micros"}"#,
                &["TIME", "INT64", "NUMERIC", "BIGNUMERIC"],
            ),
            (
                r#"{"type":"int","logicalType":"time-millis"}"#,
                &["TIME", "INT64", "NUMERIC", "BIGNUMERIC"],
            ),
            (
                r#"{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}"#,
                &["NUMERIC", "BIGNUMERIC", "BYTES"],
            ),
            (
                r#"{"type":"fixed","name":"D","size":8,"logicalType":"decimal","precision":18,"scale":4}"#,
                &["NUMERIC", "BIGNUMERIC", "BYTES"],
            ),
            // duration's INTERVAL is not supported: only its fixed's types.
            (
                r#"{"type":"fixed","name":"Du","size":12,"logicalType":"duration"}"#,
                &["BYTES", "NUMERIC", "BIGNUMERIC"],
            ),
            // Other logical types: their underlying type only.
            (
                r#"{"type":"string","logicalType":"uuid"}"#,
                &[
                    "STRING",
                    "JSON",
                    "TIMESTAMP",
                    "DATETIME",
                    "DATE",
                    "TIME",
                    "NUMERIC",
                    "BIGNUMERIC",
                ],
            ),
            (
                r#"{"type":"long","logicalType":"local-timestamp-micros"}"#,
                &["INT64", "NUMERIC", "BIGNUMERIC"],
            ),
            (
                r#"{"type":"long","logicalType":"timestamp-nanos"}"#,
                &["INT64", "NUMERIC", "BIGNUMERIC"],
            ),
        ];
        for (avro, fits) in rows {
            for ty in all {
                for mode in ["NULLABLE", "REQUIRED"] {
                    let r = one(avro, &col(ty, mode));
                    if fits.contains(&ty) {
                        assert!(r.is_ok(), "{avro} → {ty} {mode}: {}", r.unwrap_err());
                    } else {
                        let e = r.err().unwrap_or_else(|| panic!("{avro} → {ty} accepted"));
                        let p = &e.problems[0];
                        assert_eq!((e.problems.len(), p.rule), (1, CompatRule::Type), "{e}");
                        assert_eq!(p.path, "c");
                        assert_eq!(p.table, format!("{ty} {mode}"));
                        let want = format!("expected {ty}, got ");
                        assert!(p.reason.contains(&want), "{avro} → {ty}: {e}");
                        assert!(p.reason.contains(" fits "), "{e}");
                    }
                }
            }
            // A scalar never fits a RECORD, and needs an array for REPEATED.
            let e = one(avro, REC_X).unwrap_err();
            assert_eq!(e.problems[0].rule, CompatRule::Type, "{e}");
            let e = one(avro, &col(fits[0], "REPEATED")).unwrap_err();
            assert!(e.problems[0].reason.contains("needs an Avro array"), "{e}");
        }
        let e = one(
            r#"{"type":"fixed","name":"Du","size":12,"logicalType":"duration"}"#,
            &col("STRING", "NULLABLE"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("INTERVAL"), "{e}");
    }

    #[test]
    fn composite_types_nullable_unions_and_modes() {
        type Case = (&'static str, String, Option<(CompatRule, &'static str)>);
        let ok = None;
        let err = |rule, text| Some((rule, text));
        let cases: Vec<Case> = vec![
            // null → any NULLABLE.
            (r#""null""#, col("STRING", "NULLABLE"), ok),
            (r#""null""#, col("DATE", "NULLABLE"), ok),
            (
                r#""null""#,
                col("STRING", "REQUIRED"),
                err(CompatRule::OptionalNotNullable, "NULLABLE"),
            ),
            // union of null and T = NULLABLE T, in either order.
            (r#"["null","long"]"#, col("INT64", "NULLABLE"), ok),
            (r#"["long","null"]"#, col("NUMERIC", "NULLABLE"), ok),
            (
                r#"["null","long"]"#,
                col("INT64", "REQUIRED"),
                err(CompatRule::OptionalNotNullable, "needs a NULLABLE column"),
            ),
            (
                r#"["null","long"]"#,
                col("STRING", "NULLABLE"),
                err(CompatRule::Type, "expected STRING, got long"),
            ),
            (
                r#"["null","long"]"#,
                col("INT64", "REPEATED"),
                err(CompatRule::OptionalNotNullable, "REPEATED if it is an array"),
            ),
            // A required topic field may go to NULLABLE or REQUIRED.
            (r#""long""#, col("INT64", "REQUIRED"), ok),
            (r#""long""#, col("INT64", "NULLABLE"), ok),
            // Other unions are not mappable.
            (
                r#"["null","long","string"]"#,
                col("INT64", "NULLABLE"),
                err(CompatRule::Union, "not mappable"),
            ),
            (
                r#"["long","string"]"#,
                col("STRING", "NULLABLE"),
                err(CompatRule::Union, "not mappable"),
            ),
            (r#"["long"]"#, col("INT64", "REQUIRED"), ok),
            // record → RECORD, field by field.
            (AVRO_REC_X, REC_X.into(), ok),
            (
                AVRO_REC_X,
                col("STRING", "NULLABLE"),
                err(CompatRule::Type, "expected STRING, got record R"),
            ),
            (
                &*Box::leak(format!(r#"["null",{AVRO_REC_X}]"#).into_boxed_str()),
                REC_X.into(),
                ok,
            ),
            (
                r#"{"type":"record","name":"R","fields":[{"name":"x","type":"string"}]}"#,
                REC_X.into(),
                err(CompatRule::Type, "expected INT64, got string"),
            ),
            // array of T → REPEATED T.
            (
                r#"{"type":"array","items":"long"}"#,
                col("INT64", "REPEATED"),
                ok,
            ),
            (
                r#"{"type":"array","items":"long"}"#,
                col("INT64", "NULLABLE"),
                err(CompatRule::Type, "an array fits a REPEATED column"),
            ),
            (
                r#"{"type":"array","items":"long"}"#,
                col("STRING", "REPEATED"),
                err(CompatRule::Type, "expected REPEATED STRING, got long"),
            ),
            (
                r#"["null",{"type":"array","items":"long"}]"#,
                col("INT64", "REPEATED"),
                ok,
            ),
            (
                r#"{"type":"array","items":["null","long"]}"#,
                col("INT64", "REPEATED"),
                err(CompatRule::Type, "cannot hold NULL"),
            ),
            (
                r#"{"type":"array","items":{"type":"array","items":"long"}}"#,
                col("INT64", "REPEATED"),
                err(CompatRule::Type, "do not nest"),
            ),
            (
                &*Box::leak(format!(r#"{{"type":"array","items":{AVRO_REC_X}}}"#).into_boxed_str()),
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"x","type":"INT64"}]"#
                    .into(),
                ok,
            ),
            // map of V → REPEATED RECORD<key STRING, value V>.
            (r#"{"type":"map","values":"long"}"#, KV_LONG.into(), ok),
            (
                r#"["null",{"type":"map","values":"long"}]"#,
                KV_LONG.into(),
                ok,
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"KEY","type":"STRING"},
                   {"name":"Value","type":"NUMERIC"},{"name":"note","type":"STRING"}]"#
                    .into(),
                ok,
            ),
            (
                r#"{"type":"map","values":"string"}"#,
                KV_LONG.into(),
                err(CompatRule::Type, "expected INT64, got string"),
            ),
            (
                r#"{"type":"map","values":["null","long"]}"#,
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"key","type":"STRING"},
                   {"name":"value","type":"INT64","mode":"REQUIRED"}]"#
                    .into(),
                err(CompatRule::OptionalNotNullable, "NULLABLE"),
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"key","type":"INT64"},
                   {"name":"value","type":"INT64"}]"#
                    .into(),
                err(CompatRule::Type, "a map's keys fit a STRING"),
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"k","type":"STRING"},
                   {"name":"value","type":"INT64"}]"#
                    .into(),
                err(CompatRule::Type, "needs sub-fields `key` and `value`"),
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"key","type":"STRING"},
                   {"name":"value","type":"INT64"},{"name":"n","type":"INT64","mode":"REQUIRED"}]"#
                    .into(),
                err(CompatRule::AbsentColumnRequired, "other sub-fields must be NULLABLE"),
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                r#""type":"RECORD","fields":[{"name":"key","type":"STRING"},{"name":"value","type":"INT64"}]"#
                    .into(),
                err(CompatRule::Type, "REPEATED RECORD<key STRING"),
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                col("INT64", "REPEATED"),
                err(CompatRule::Type, "REPEATED RECORD<key STRING"),
            ),
        ];
        for (avro, decl, want) in &cases {
            let r = one(avro, decl);
            match (want, r) {
                (None, Ok(_)) => {}
                (None, Err(e)) => panic!("{avro} → {decl}: {e}"),
                (Some(_), Ok(_)) => panic!("{avro} → {decl} accepted"),
                (Some((rule, text)), Err(e)) => {
                    assert_eq!(e.problems.len(), 1, "{avro} → {decl}: {e}");
                    assert_eq!(e.problems[0].rule, *rule, "{avro} → {decl}: {e}");
                    assert!(e.problems[0].reason.contains(text), "{avro} → {decl}: {e}");
                }
            }
        }
    }

    #[test]
    fn names_absent_columns_unknown_fields_and_metadata() {
        let t = topic(
            r#"{"type":"record","name":"T","fields":[
                {"name":"UserId","type":"long"},
                {"name":"a","type":"long"}, {"name":"A","type":"long"},
                {"name":"nested","type":{"type":"record","name":"N","fields":[
                    {"name":"x","type":"long"},{"name":"y","type":"long"}]}}]}"#,
        );
        let tbl = |extra: &str| {
            table(&format!(
                r#"[{{"name":"userid","type":"INT64"}},{{"name":"a","type":"INT64"}},
                    {{"name":"nested","type":"RECORD","fields":[{{"name":"x","type":"INT64"}}]}}{extra}]"#
            ))
        };
        // `A` and `nested.y` are not columns: refused without drop_unknown_fields, dropped with.
        let e = check_compatibility(t.schema(), &tbl(""), false, false).unwrap_err();
        let got: Vec<(&str, CompatRule)> = e
            .problems
            .iter()
            .map(|p| (p.path.as_str(), p.rule))
            .collect();
        assert_eq!(
            got,
            [
                ("A", CompatRule::UnknownField),
                ("nested.y", CompatRule::UnknownField)
            ]
        );
        assert!(e.problems[0]
            .reason
            .contains("already takes the topic field of exactly its name"));
        let plan = check_compatibility(t.schema(), &tbl(""), true, false).unwrap();
        assert_eq!(plan.slots[0].source, Some(0), "UserId matches userid");
        assert_eq!(plan.slots[1].source, Some(1), "a matches a exactly, not A");

        // Columns the topic lacks: NULLABLE and REPEATED are fine, REQUIRED is not.
        let extra = r#",{"name":"n","type":"STRING"},{"name":"r","type":"INT64","mode":"REPEATED"},
                       {"name":"q","type":"STRING","mode":"REQUIRED"}"#;
        let e = check_compatibility(t.schema(), &tbl(extra), true, false).unwrap_err();
        assert_eq!(e.problems.len(), 1, "{e}");
        assert_eq!(
            (e.problems[0].path.as_str(), e.problems[0].rule),
            ("q", CompatRule::AbsentColumnRequired)
        );
        assert_eq!(e.problems[0].topic, "-");

        // With write_metadata, metadata columns are not "absent", and topic fields may not be
        // named like them (snake_case or camelCase, case-insensitively).
        let meta_cols = r#",{"name":"message_id","type":"STRING","mode":"REQUIRED"},
                           {"name":"publish_time","type":"TIMESTAMP","mode":"REQUIRED"}"#;
        assert!(check_compatibility(t.schema(), &tbl(meta_cols), true, true).is_ok());
        let e = check_compatibility(t.schema(), &tbl(meta_cols), true, false).unwrap_err();
        assert_eq!(
            e.problems.len(),
            2,
            "without write_metadata they are plain columns: {e}"
        );
        for name in [
            "messageId",
            "message_id",
            "PUBLISHTIME",
            "attributes",
            "subscriptionName",
        ] {
            let t = topic(&format!(
                r#"{{"type":"record","name":"T","fields":[{{"name":"{name}","type":"string"}}]}}"#
            ));
            let e = check_compatibility(
                t.schema(),
                &table(r#"[{"name":"x","type":"STRING"}]"#),
                false,
                true,
            )
            .unwrap_err();
            assert_eq!(e.problems.len(), 1, "{e}");
            assert_eq!(e.problems[0].rule, CompatRule::MetadataName, "{e}");
            assert_eq!(e.problems[0].path, name);
            // Without write_metadata the name is an ordinary field.
            let tbl = table(&format!(r#"[{{"name":"{name}","type":"STRING"}}]"#));
            assert!(check_compatibility(t.schema(), &tbl, false, false).is_ok());
        }
        // A topic field named `data` is only a warning (SPEC Q7).
        let t = topic(r#"{"type":"record","name":"T","fields":[{"name":"data","type":"string"}]}"#);
        let plan = check_compatibility(
            t.schema(),
            &table(r#"[{"name":"data","type":"STRING"}]"#),
            false,
            true,
        )
        .unwrap();
        assert_eq!(plan.warnings().len(), 1);

        // The root must be a record.
        let e =
            check_compatibility(topic(r#""string""#).schema(), &tbl(""), true, false).unwrap_err();
        assert_eq!(e.problems[0].rule, CompatRule::Root);
        assert!(e.to_string().contains("must be a record"), "{e}");
    }

    #[test]
    fn every_problem_is_reported_as_a_diff() {
        let t = topic(
            r#"{"type":"record","name":"T","fields":[
                {"name":"project_ids","type":"string"},
                {"name":"note","type":["null","string"]},
                {"name":"extra","type":"int"},
                {"name":"customer","type":{"type":"record","name":"C","fields":[
                    {"name":"tier","type":["int","string"]}]}}]}"#,
        );
        let tbl = table(
            r#"[{"name":"project_ids","type":"INTEGER"},
                {"name":"note","type":"STRING","mode":"REQUIRED"},
                {"name":"customer","type":"RECORD","fields":[{"name":"tier","type":"STRING"}]},
                {"name":"missing","type":"DATE","mode":"REQUIRED"}]"#,
        );
        let e = check_compatibility(t.schema(), &tbl, false, false).unwrap_err();
        let text = e.to_string();
        let expected = "\
use_topic_schema: the topic schema does not fit the table (5 problems):
  extra          topic: int             table: -                → not a column of the table; add the column or set drop_unknown_fields to drop the field
  project_ids    topic: string          table: INT64 NULLABLE   → incompatible schema type: expected INT64, got string (string fits STRING, JSON, TIMESTAMP, DATETIME, DATE, TIME, NUMERIC or BIGNUMERIC)
  note           topic: [null, string]  table: STRING REQUIRED  → an optional topic field (a union with null) needs a NULLABLE column (REPEATED if it is an array or map)
  customer.tier  topic: [int, string]   table: STRING NULLABLE  → not mappable: only a union of null and one type (NULLABLE) has a BigQuery type
  missing        topic: -               table: DATE REQUIRED    → the column is not in the topic schema, so it must be NULLABLE (it is written NULL)";
        assert_eq!(text, expected);
    }

    // ---- rows ----------------------------------------------------------------------------------

    const ORDER: &str = r#"{
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
        {"name": "created_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "at_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "big", "type": {"type": "fixed", "name": "Big", "size": 16, "logicalType": "decimal", "precision": 38, "scale": 20}},
        {"name": "when_text", "type": "string"},
        {"name": "doc", "type": "string"},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
          {"name": "name", "type": "string"},
          {"name": "tier", "type": ["null", "int"]}
        ]}},
        {"name": "previous", "type": ["null", "Customer"], "default": null},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
          {"name": "sku", "type": "string"}, {"name": "n", "type": "int"}]}}},
        {"name": "maybe", "type": ["null", {"type": "array", "items": "long"}], "default": null},
        {"name": "extra", "type": "int", "default": 0}
      ]
    }"#;

    const ORDER_TABLE: &str = r#"[
        {"name": "id", "type": "STRING", "mode": "REQUIRED"},
        {"name": "qty", "type": "INT64"},
        {"name": "total", "type": "NUMERIC"},
        {"name": "price", "type": "FLOAT64"},
        {"name": "ratio", "type": "BIGNUMERIC"},
        {"name": "ok", "type": "BOOL"},
        {"name": "raw", "type": "BYTES"},
        {"name": "note", "type": "STRING"},
        {"name": "status", "type": "INTEGER"},
        {"name": "tags", "type": "STRING", "mode": "REPEATED"},
        {"name": "props", "type": "RECORD", "mode": "REPEATED", "fields": [
          {"name": "key", "type": "STRING", "maxLength": 5}, {"name": "value", "type": "INT64"}]},
        {"name": "hash", "type": "BYTES"},
        {"name": "created", "type": "TIMESTAMP"},
        {"name": "created_ms", "type": "TIMESTAMP"},
        {"name": "day", "type": "DATE"},
        {"name": "at", "type": "TIME"},
        {"name": "at_ms", "type": "TIME"},
        {"name": "amount", "type": "NUMERIC"},
        {"name": "big", "type": "BIGNUMERIC"},
        {"name": "when_text", "type": "TIMESTAMP"},
        {"name": "doc", "type": "JSON"},
        {"name": "customer", "type": "RECORD", "fields": [
          {"name": "name", "type": "STRING"}, {"name": "tier", "type": "INT64"}]},
        {"name": "previous", "type": "RECORD", "fields": [
          {"name": "name", "type": "STRING"}, {"name": "tier", "type": "INT64"}]},
        {"name": "lines", "type": "RECORD", "mode": "REPEATED", "fields": [
          {"name": "sku", "type": "STRING", "maxLength": 3}, {"name": "n", "type": "INT64"}]},
        {"name": "maybe", "type": "INT64", "mode": "REPEATED"},
        {"name": "absent", "type": "STRING"}
    ]"#;

    /// 1234.56 at scale 2 and -1.5 at scale 20, as Avro decimal bytes (big-endian).
    fn amount_bytes() -> Vec<u8> {
        vec![0x01, 0xe2, 0x40]
    }
    fn big_bytes() -> Vec<u8> {
        (-150_000_000_000_000_000_000i128).to_be_bytes().to_vec()
    }

    /// Order `n` (0 or 1) in the Avro JSON encoding, unions wrapped.
    fn order_json(n: usize) -> serde_json::Value {
        let mut v = json!({
            "id": "o-1", "qty": 3, "total": 10_000_000_000i64, "price": 1.5, "ratio": 0.25,
            "ok": true, "raw": json_bytes(&[0, 255, b'A']), "note": {"string": "hi"},
            "status": "DONE", "tags": ["a", "b"], "props": {"y": 2, "x": 1},
            "hash": json_bytes(b"ab\xe9d"), "created": 1_700_000_000_000_000i64,
            "created_ms": 1_700_000_000_123i64, "day": 19_625, "at": 15_000_500_000i64,
            "at_ms": 45_296_789, "amount": json_bytes(&amount_bytes()),
            "big": json_bytes(&big_bytes()), "when_text": "2023-09-25T04:10:00Z",
            "doc": "{\"k\":[1,2]}", "customer": {"name": "Ann", "tier": {"int": 2}},
            "previous": null, "lines": [{"sku": "s1", "n": 1}, {"sku": "s2", "n": 2}],
            "maybe": null, "extra": 5
        });
        if n == 1 {
            v["note"] = json!(null);
            v["previous"] = json!({"com.example.Customer": {"name": "Bob", "tier": null}});
            v["maybe"] = json!({"array": [7, 8]});
            v["props"] = json!({});
            v["tags"] = json!([]);
        }
        v
    }

    /// The same order as an Avro value, for BINARY messages.
    fn order_value(n: usize) -> Value {
        let s = |x: &str| Value::String(x.into());
        let customer = |name: &str, tier: Value| {
            Value::Record(vec![("name".into(), s(name)), ("tier".into(), tier)])
        };
        let line = |sku: &str, k: i32| {
            Value::Record(vec![("sku".into(), s(sku)), ("n".into(), Value::Int(k))])
        };
        let null = || Value::Union(0, Box::new(Value::Null));
        let (note, previous, maybe, props, tags) = if n == 0 {
            (
                Value::Union(1, Box::new(s("hi"))),
                null(),
                null(),
                HashMap::from([
                    ("y".to_string(), Value::Long(2)),
                    ("x".to_string(), Value::Long(1)),
                ]),
                vec![s("a"), s("b")],
            )
        } else {
            (
                null(),
                Value::Union(1, Box::new(customer("Bob", null()))),
                Value::Union(
                    1,
                    Box::new(Value::Array(vec![Value::Long(7), Value::Long(8)])),
                ),
                HashMap::new(),
                vec![],
            )
        };
        Value::Record(vec![
            ("id".into(), s("o-1")),
            ("qty".into(), Value::Int(3)),
            ("total".into(), Value::Long(10_000_000_000)),
            ("price".into(), Value::Double(1.5)),
            ("ratio".into(), Value::Float(0.25)),
            ("ok".into(), Value::Boolean(true)),
            ("raw".into(), Value::Bytes(vec![0, 255, b'A'])),
            ("note".into(), note),
            ("status".into(), Value::Enum(1, "DONE".into())),
            ("tags".into(), Value::Array(tags)),
            ("props".into(), Value::Map(props)),
            ("hash".into(), Value::Fixed(4, b"ab\xe9d".to_vec())),
            (
                "created".into(),
                Value::TimestampMicros(1_700_000_000_000_000),
            ),
            (
                "created_ms".into(),
                Value::TimestampMillis(1_700_000_000_123),
            ),
            ("day".into(), Value::Date(19_625)),
            ("at".into(), Value::TimeMicros(15_000_500_000)),
            ("at_ms".into(), Value::TimeMillis(45_296_789)),
            ("amount".into(), Value::Decimal(amount_bytes().into())),
            ("big".into(), Value::Decimal(big_bytes().into())),
            ("when_text".into(), s("2023-09-25T04:10:00Z")),
            ("doc".into(), s("{\"k\":[1,2]}")),
            (
                "customer".into(),
                customer("Ann", Value::Union(1, Box::new(Value::Int(2)))),
            ),
            ("previous".into(), previous),
            (
                "lines".into(),
                Value::Array(vec![line("s1", 1), line("s2", 2)]),
            ),
            ("maybe".into(), maybe),
            ("extra".into(), Value::Int(5)),
        ])
    }

    fn order_builder(opts: RowOptions) -> RowBuilder {
        RowBuilder::with_topic_schema(&table(ORDER_TABLE), opts, &topic(ORDER))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn dropping() -> RowOptions {
        RowOptions {
            drop_unknown_fields: true,
            ..topic_mode()
        }
    }

    fn column<'a>(batch: &'a RecordBatch, name: &str) -> &'a dyn Array {
        batch
            .column_by_name(name)
            .unwrap_or_else(|| panic!("no column {name}"))
            .as_ref()
    }

    fn ints(a: &dyn Array) -> Vec<Option<i64>> {
        a.as_primitive::<Int64Type>().iter().collect()
    }

    fn strs(a: &dyn Array) -> Vec<Option<String>> {
        a.as_string::<i32>()
            .iter()
            .map(|s| s.map(str::to_string))
            .collect()
    }

    #[test]
    fn json_and_binary_messages_become_the_same_rows() {
        let schema = topic(ORDER);
        let mut b = order_builder(dropping());
        for n in 0..2 {
            let json = serde_json::to_vec(&order_json(n)).unwrap();
            b.append(&message(&format!("j{n}"), json, "JSON")).unwrap();
            let bin = binary(&schema, order_value(n));
            b.append(&message(&format!("b{n}"), bin, "BINARY")).unwrap();
        }
        let batch = b.finish();
        assert_eq!(batch.num_rows(), 4);
        // Rows 0/1 are order 0 (JSON, BINARY), rows 2/3 order 1.
        assert_eq!(batch.slice(0, 1), batch.slice(1, 1));
        assert_eq!(batch.slice(2, 1), batch.slice(3, 1));
        assert!(batch.column_by_name("extra").is_none());

        assert_eq!(strs(column(&batch, "id"))[0].as_deref(), Some("o-1"));
        assert_eq!(ints(column(&batch, "qty"))[0], Some(3));
        let total = column(&batch, "total").as_primitive::<Decimal128Type>();
        assert_eq!(total.value(0), 10_000_000_000 * 1_000_000_000);
        let price = column(&batch, "price").as_primitive::<Float64Type>();
        assert_eq!(price.value(0), 1.5);
        let ratio = column(&batch, "ratio").as_primitive::<Decimal256Type>();
        assert_eq!(ratio.value(0), i256::from_i128(25) * pow10(36));
        assert!(column(&batch, "ok").as_boolean().value(0));
        assert_eq!(
            column(&batch, "raw").as_binary::<i32>().value(0),
            [0, 255, b'A']
        );
        assert_eq!(
            strs(column(&batch, "note")),
            [Some("hi".into()), Some("hi".into()), None, None]
        );
        assert_eq!(ints(column(&batch, "status"))[0], Some(1));
        let tags = column(&batch, "tags").as_list::<i32>();
        assert_eq!(
            strs(tags.value(0).as_ref()),
            [Some("a".into()), Some("b".into())]
        );
        assert_eq!(tags.value(2).len(), 0);
        assert!(!tags.is_null(2));
        // map → REPEATED RECORD<key, value>, sorted by key.
        let props = column(&batch, "props").as_list::<i32>();
        let entries = props.value(0);
        let entries = entries.as_struct();
        assert_eq!(
            strs(entries.column(0).as_ref()),
            [Some("x".into()), Some("y".into())]
        );
        assert_eq!(ints(entries.column(1).as_ref()), [Some(1), Some(2)]);
        assert_eq!(props.value(2).len(), 0);
        assert_eq!(
            column(&batch, "hash").as_binary::<i32>().value(0),
            b"ab\xe9d"
        );
        let ts = |name| {
            column(&batch, name)
                .as_primitive::<TimestampMicrosecondType>()
                .value(0)
        };
        assert_eq!(ts("created"), 1_700_000_000_000_000);
        assert_eq!(ts("created_ms"), 1_700_000_000_123_000);
        assert_eq!(ts("when_text"), 1_695_615_000_000_000);
        assert_eq!(
            column(&batch, "day").as_primitive::<Date32Type>().value(0),
            19_625
        );
        let time = |name| {
            column(&batch, name)
                .as_primitive::<Time64MicrosecondType>()
                .value(0)
        };
        assert_eq!(time("at"), 15_000_500_000);
        assert_eq!(time("at_ms"), 45_296_789_000);
        let amount = column(&batch, "amount").as_primitive::<Decimal128Type>();
        assert_eq!(amount.value_as_string(0), "1234.560000000");
        let big = column(&batch, "big").as_primitive::<Decimal256Type>();
        assert_eq!(big.value(0), -i256::from_i128(15) * pow10(37));
        assert_eq!(
            strs(column(&batch, "doc"))[0].as_deref(),
            Some("{\"k\":[1,2]}")
        );
        // Records, nullable records, arrays of records.
        let customer = column(&batch, "customer").as_struct();
        assert_eq!(strs(customer.column(0).as_ref())[0].as_deref(), Some("Ann"));
        assert_eq!(ints(customer.column(1).as_ref())[0], Some(2));
        let previous = column(&batch, "previous").as_struct();
        assert!(previous.is_null(0));
        assert!(previous.is_valid(2));
        assert_eq!(strs(previous.column(0).as_ref())[2].as_deref(), Some("Bob"));
        assert!(previous.column(1).is_null(2));
        let lines = column(&batch, "lines").as_list::<i32>();
        let l0 = lines.value(0);
        let l0: &StructArray = l0.as_struct();
        assert_eq!(
            strs(l0.column(0).as_ref()),
            [Some("s1".into()), Some("s2".into())]
        );
        assert_eq!(ints(l0.column(1).as_ref()), [Some(1), Some(2)]);
        // A null optional array is an empty REPEATED value.
        let maybe = column(&batch, "maybe").as_list::<i32>();
        assert_eq!(maybe.value(0).len(), 0);
        assert_eq!(ints(maybe.value(2).as_ref()), [Some(7), Some(8)]);
        // A column the topic lacks is NULL.
        assert_eq!(column(&batch, "absent").null_count(), 4);
    }

    #[test]
    fn unknown_fields_need_drop_unknown_fields() {
        let e = RowBuilder::with_topic_schema(&table(ORDER_TABLE), topic_mode(), &topic(ORDER))
            .unwrap_err();
        assert_eq!(e.problems.len(), 1, "{e}");
        assert_eq!(
            (e.problems[0].path.as_str(), e.problems[0].rule),
            ("extra", CompatRule::UnknownField)
        );
        // With the column, the field is written.
        let with_extra = ORDER_TABLE.replace(
            r#"{"name": "absent", "type": "STRING"}"#,
            r#"{"name": "absent", "type": "STRING"}, {"name": "extra", "type": "INT64"}"#,
        );
        let mut b = RowBuilder::with_topic_schema(&table(&with_extra), topic_mode(), &topic(ORDER))
            .unwrap();
        let json = serde_json::to_vec(&order_json(0)).unwrap();
        b.append(&message("1", json, "JSON")).unwrap();
        assert_eq!(ints(column(&b.finish(), "extra")), [Some(5)]);
    }

    #[test]
    fn metadata_columns_in_topic_mode() {
        let opts = RowOptions {
            write_metadata: true,
            subscription_name: "projects/p/subscriptions/s".into(),
            ..dropping()
        };
        let tbl = ORDER_TABLE.replace(
            r#"{"name": "absent", "type": "STRING"}"#,
            r#"{"name": "Message_Id", "type": "STRING", "mode": "REQUIRED"}"#,
        );
        let mut b =
            RowBuilder::with_topic_schema(&table(&tbl), opts.clone(), &topic(ORDER)).unwrap();
        let names: Vec<&str> = b.columns().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names[names.len() - 4..],
            [
                "Message_Id",
                "subscription_name",
                "publish_time",
                "attributes"
            ]
        );
        let json = serde_json::to_vec(&order_json(0)).unwrap();
        b.append(&message("m-1", json, "JSON")).unwrap();
        let batch = b.finish();
        assert_eq!(strs(column(&batch, "Message_Id")), [Some("m-1".into())]);
        assert_eq!(
            strs(column(&batch, "attributes")),
            [Some(r#"{"googclient_schemaencoding":"JSON"}"#.into())]
        );

        // A topic field named like a metadata column, and a metadata column of the wrong type,
        // are reported together.
        let clash = ORDER.replace(
            r#"{"name": "extra""#,
            r#"{"name": "publishTime", "type": "long"}, {"name": "extra""#,
        );
        let bad_meta = tbl.replace(
            r#"{"name": "Message_Id", "type": "STRING", "mode": "REQUIRED"}"#,
            r#"{"name": "Message_Id", "type": "INT64"}"#,
        );
        let e = RowBuilder::with_topic_schema(&table(&bad_meta), opts, &topic(&clash)).unwrap_err();
        let rules: Vec<(&str, CompatRule)> = e
            .problems
            .iter()
            .map(|p| (p.path.as_str(), p.rule))
            .collect();
        assert_eq!(
            rules,
            [
                ("Message_Id", CompatRule::Table),
                ("publishTime", CompatRule::MetadataName)
            ],
            "{e}"
        );
        assert_eq!(e.problems[0].table, "INT64 NULLABLE");
    }

    #[test]
    fn the_plain_constructor_refuses_topic_mode() {
        let e = RowBuilder::new(&table(ORDER_TABLE), topic_mode()).unwrap_err();
        assert!(e.reason.contains("with_topic_schema"), "{e}");
        let e = RowBuilder::with_topic_schema(
            &table(ORDER_TABLE),
            RowOptions {
                drop_unknown_fields: true,
                ..RowOptions::default()
            },
            &topic(ORDER),
        )
        .unwrap_err();
        assert_eq!(e.problems[0].rule, CompatRule::Table, "{e}");
    }

    fn failure(b: &mut RowBuilder, m: &Message) -> RowError {
        let before = b.len();
        let e = b.append(m).expect_err(&m.message_id);
        assert_eq!(b.len(), before, "a bad message adds nothing");
        assert_eq!(e.message_id, m.message_id);
        e
    }

    #[test]
    fn bad_messages_fail_alone_with_id_field_and_rule() {
        let schema = topic(ORDER);
        let mut b = order_builder(dropping());
        let good = || message("good", serde_json::to_vec(&order_json(0)).unwrap(), "JSON");
        b.append(&good()).unwrap();
        let json_with = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut v = order_json(0);
            edit(&mut v);
            serde_json::to_vec(&v).unwrap()
        };
        type Fields = Vec<(String, Value)>;
        let bin_with = |edit: &dyn Fn(&mut Fields)| {
            let Value::Record(mut fields) = order_value(0) else {
                unreachable!()
            };
            edit(&mut fields);
            binary(&schema, Value::Record(fields))
        };
        let set = |name: &'static str, v: Value| {
            move |fields: &mut Fields| {
                fields.iter_mut().find(|(n, _)| n == name).unwrap().1 = v.clone();
            }
        };
        let cases: Vec<(Message, &str, &str)> = vec![
            (
                message("m1", b"{nope".to_vec(), "JSON"),
                "$",
                "not valid JSON",
            ),
            (
                message("m2", json_with(&|v| v["qty"] = json!("three")), "JSON"),
                "qty",
                "expected an int",
            ),
            (
                message(
                    "m3",
                    json_with(&|v| v["customer"]["tier"] = json!({"boolean": true})),
                    "JSON",
                ),
                "customer.tier",
                "expected an int",
            ),
            (
                message(
                    "m4",
                    json_with(&|v| v["when_text"] = json!("yesterday")),
                    "JSON",
                ),
                "when_text",
                "TIMESTAMP",
            ),
            (
                message("m5", json_with(&|v| v["doc"] = json!("{")), "JSON"),
                "doc",
                "invalid JSON",
            ),
            (
                message("m6", json_with(&|v| v["ratio"] = json!("NaN")), "JSON"),
                "ratio",
                "not a finite number",
            ),
            (
                message(
                    "m7",
                    json_with(&|v| v["props"] = json!({"toolong": 1})),
                    "JSON",
                ),
                "props[\"toolong\"].key",
                "maxLength 5",
            ),
            (
                message(
                    "m8",
                    json_with(&|v| v["lines"][1]["sku"] = json!("long")),
                    "JSON",
                ),
                "lines[1].sku",
                "maxLength 3",
            ),
            (
                message(
                    "m9",
                    bin_with(&set("day", Value::Date(3_000_000))),
                    "BINARY",
                ),
                "day",
                "DATE",
            ),
            (
                message(
                    "m10",
                    bin_with(&set("created_ms", Value::TimestampMillis(i64::MAX / 10))),
                    "BINARY",
                ),
                "created_ms",
                "TIMESTAMP",
            ),
            (
                message(
                    "m11",
                    bin_with(&set("at", Value::TimeMicros(86_400_000_000))),
                    "BINARY",
                ),
                "at",
                "TIME",
            ),
            (
                message(
                    "m12",
                    bin_with(&set("ratio", Value::Float(f32::INFINITY))),
                    "BINARY",
                ),
                "ratio",
                "not a finite number",
            ),
            (
                message(
                    "m13",
                    {
                        let mut d = binary(&schema, order_value(0));
                        d.truncate(d.len() - 2);
                        d
                    },
                    "BINARY",
                ),
                "$",
                "BINARY data does not decode",
            ),
            (
                message(
                    "m14",
                    {
                        let mut d = binary(&schema, order_value(0));
                        d.push(0);
                        d
                    },
                    "BINARY",
                ),
                "$",
                "1 bytes left",
            ),
            (
                message("m15", b"{}".to_vec(), "XML"),
                "$",
                "unknown schema encoding",
            ),
        ];
        for (m, field, reason) in &cases {
            let e = failure(&mut b, m);
            assert_eq!(e.field, *field, "{}: {e}", m.message_id);
            assert_eq!(e.kind, RowErrorKind::Invalid);
            assert!(
                e.reason.contains(reason),
                "{}: {e} lacks {reason:?}",
                m.message_id
            );
        }
        b.append(&good()).unwrap();
        let batch = b.finish();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.slice(0, 1), batch.slice(1, 1));
    }

    #[test]
    fn decimals_keep_their_exact_value() {
        let t = topic(
            r#"{"type":"record","name":"T","fields":[
                {"name":"d","type":{"type":"bytes","logicalType":"decimal","precision":30,"scale":12}},
                {"name":"b","type":"bytes"},
                {"name":"l","type":"long"},
                {"name":"f","type":"float"}]}"#,
        );
        let tbl = table(
            r#"[{"name":"d","type":"NUMERIC"},{"name":"b","type":"NUMERIC"},
                {"name":"l","type":"BIGNUMERIC"},{"name":"f","type":"NUMERIC"}]"#,
        );
        let mut b = RowBuilder::with_topic_schema(&tbl, topic_mode(), &t).unwrap();
        let row = |d: i128, l: i64, f: f32| {
            let be = d.to_be_bytes();
            let start = be
                .iter()
                .position(|&x| x != 0 && x != 0xff)
                .unwrap_or(15)
                .saturating_sub(1);
            Value::Record(vec![
                ("d".into(), Value::Decimal(be[start..].to_vec().into())),
                // BigDecimalByteStringEncoder bytes of 123.124 (SPEC §4.3.2).
                ("b".into(), Value::Bytes(vec![0x00, 0x25, 0xc3, 0xaa, 0x1c])),
                ("l".into(), Value::Long(l)),
                ("f".into(), Value::Float(f)),
            ])
        };
        // 1.230000000000 at scale 12 fits NUMERIC's 9 (only zeros beyond).
        b.append(&message(
            "1",
            binary(&t, row(1_230_000_000_000, i64::MIN, 0.1)),
            "BINARY",
        ))
        .unwrap();
        let batch = b.finish();
        let dec = |name| {
            column(&batch, name)
                .as_primitive::<Decimal128Type>()
                .value_as_string(0)
        };
        assert_eq!(dec("d"), "1.230000000");
        assert_eq!(dec("b"), "123.124000000");
        assert_eq!(dec("f"), "0.100000000", "a float's shortest decimal form");
        let l = column(&batch, "l").as_primitive::<Decimal256Type>();
        assert_eq!(
            l.value(0),
            i256::from_i128(i128::from(i64::MIN)) * pow10(38)
        );
        // A digit beyond NUMERIC's scale fails the message rather than being rounded.
        let e = failure(
            &mut b,
            &message("2", binary(&t, row(1_000_000_000_001, 0, 0.0)), "BINARY"),
        );
        assert_eq!(e.field, "d");
        assert!(e.reason.contains("more than 9 fractional digits"), "{e}");
    }
}
