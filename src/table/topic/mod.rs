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
//!    reader (the same one the Avro files use) and then as a datum
//!    ([`crate::avro::TopicSchema::read_value`]; a failure's [`crate::avro::DatumPath`] is the row
//!    error's field). The
//!    Avro value is turned into cells following the plan; string values go through
//!    [`super::convert::convert_scalar`], the table-schema conversions of §4.3, so a string into TIMESTAMP or
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

//!
//! | file | what it holds |
//! |---|---|
//! | `topic/mod.rs` | the plan's vocabulary: [`CompatRule`], [`Incompatibility`], [`CompatError`] and its diff, [`TopicPlan`] and its nodes |
//! | `topic/check.rs` | the startup check: [`check_compatibility`], topic field by column |
//! | `topic/read.rs` | per message: a payload decoded with its schema revision, the Avro value turned into cells |

use std::fmt;

use super::schema::TableField;

mod check;
mod read;

pub use check::check_compatibility;
pub(super) use check::column_desc;
pub(super) use read::{TopicReader, TopicRows};

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

// The tests build rows with `RowBuilder` (batch.rs), which reads this file: in a file of their own,
// so that no two files import each other.
#[cfg(test)]
mod tests;
