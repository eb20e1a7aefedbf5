//! `use_topic_schema` (docs/contract.md §4.4): the topic's Avro schema gives the columns.
//!
//! Two steps, as in Pub/Sub:
//!
//! 1. **At startup**, [`check_compatibility`] matches the topic record's fields to the table's
//!    columns (exact name first, then case-insensitively, docs/contract.md §6 Q14; recursively into records and
//!    maps) and checks every rule of §4.4 and the metadata name rule of §4.5. It collects *all*
//!    problems into one [`CompatError`], which prints as a diff, one line per field. What it
//!    returns, a [`TopicPlan`], says for every column which topic field feeds it and how.
//! 2. **Per message**, the payload is decoded per its encoding (`googclient_schemaencoding`, else
//!    the topic's default): BINARY as one Avro datum, JSON through the Avro layer's Avro-JSON
//!    reader (the same one the Avro files use) and then as a datum ([`TopicSchema::read_value`];
//!    a failure's [`DatumPath`] is the row error's field). The
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

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};

use apache_avro::schema::{DecimalSchema, RecordSchema, UuidSchema};
use apache_avro::types::Value as Avro;
use apache_avro::Schema;
use arrow_buffer::i256;
use serde_json::Value as Json;

use super::convert::{
    convert_scalar, date_from_days, decode_big_decimal_bytes, parse_decimal_text,
    timestamp_from_micros, Cell, BIGNUMERIC_SCALE, NUMERIC_SCALE,
};
use super::error::{Fail, RowErrorKind};
use super::metadata::{check_metadata_name_conflicts, is_metadata_column};
use super::schema::{FieldMode, FieldType, TableField, TableSchema};
use crate::avro::{DatumError, DatumPath, Names, Segment, TopicSchema, TopicSchemas};
use crate::message::Message;

// ---- the startup check ---------------------------------------------------------------------------

/// Which rule of docs/contract.md §4.4 / §4.5 a field breaks.
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

/// Why a topic schema cannot feed a table (docs/contract.md §4.4). Every problem is listed; `Display` prints
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
    /// Things worth logging that are not errors (a topic field named `data`, docs/contract.md §6 Q7).
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

/// Check that `topic` can feed `table` under docs/contract.md §4.4 and §4.5, and plan how.
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
        names: Names::default(),
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
    match Names::of(topic) {
        Ok(names) => c.names = names,
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
    names: Names,
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
        self.names.resolve(s)
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
        self.names.describe(s)
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

/// A revision's rows, or why its messages fail.
type Revision = Result<Arc<TopicRows>, String>;

/// Every schema revision's [`TopicRows`]: a message is read with its revision's, else the
/// fallback's. A revision first met while running (fetched through its [`TopicSchemas`]) is
/// checked against the table then; one that does not fit is logged and read with the fallback.
#[derive(Debug, Clone)]
pub(super) struct TopicReader {
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
    pub(super) fn new(
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
    pub(super) fn of_message(&self, msg: &Message) -> Result<Arc<TopicRows>, Fail> {
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

// The tests build rows with `RowBuilder` (batch.rs), which reads this file: in a file of their own,
// so that no two files import each other.
#[cfg(test)]
mod tests;
