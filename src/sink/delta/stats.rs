//! Delta's per-column statistics of a data file subsink commits (issue 44, point 6): the `stats`
//! of its `add` action — `numRecords`, and `minValues`, `maxValues` and `nullCount` per column —
//! as delta-rs and kafka-delta-ingest write them, so a reader skips the files a predicate rules
//! out. They are read off the file's Parquet footer (the column chunks' statistics the Parquet
//! writer kept while encoding): no second pass over the rows.
//!
//! * **Which columns.** The table's `delta.dataSkippingStatsColumns` (a comma-separated list of
//!   column names, nested ones dotted) when set; else its first `delta.dataSkippingNumIndexedCols`
//!   top-level columns (32 by default; `-1`: all), as Delta's protocol says. A value that is not
//!   a number of -1 or more counts as the default. Partition columns are never counted (their
//!   values are in the `add` itself). Repeated (list) columns get none, as in delta-rs.
//! * **Which values.** Strings, numbers, decimals, booleans, dates and timestamps get min and
//!   max; binary columns their null count only. Columns whose chunks keep no statistics at all
//!   (subsink's large-value columns, see [`crate::table::parquet`]) get none. A bound is a true bound: timestamps
//!   are written to the millisecond (the protocol's precision) with the minimum rounded down and
//!   the maximum up, and a decimal that a JSON number (a double) cannot hold exactly is widened
//!   by one step of the double outwards.
//! * **All or nothing per column.** When a row group of the file has no statistics for a column,
//!   the column gets none at all: a partial null count or range would make a reader skip a file
//!   that holds matching rows.

use std::collections::HashMap;

use chrono::{DateTime, NaiveDate, Timelike};
use deltalake_core::kernel::Add;
use parquet::basic::{ConvertedType, LogicalType, TimeUnit, Type as PhysicalType};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnDescriptor;
use serde_json::{Map, Value};

use crate::table::parquet::ParquetFile;

/// The `add` action of the data file `file` at `path` (uploaded, `size` bytes, at `now`,
/// milliseconds since the epoch), its `stats` per `columns` ([`file_stats`]; `numRecords` alone
/// for a file without its footer).
pub(super) fn add_action(
    path: String,
    partition_values: HashMap<String, Option<String>>,
    file: &ParquetFile,
    (size, now): (i64, i64),
    columns: &StatsColumns,
    partition_columns: &[String],
) -> Add {
    let stats = match &file.metadata {
        Some(meta) => file_stats(meta, columns, partition_columns),
        None => serde_json::json!({ "numRecords": file.num_records }).to_string(),
    };
    Add {
        path,
        partition_values,
        size,
        modification_time: now,
        data_change: true,
        stats: Some(stats),
        tags: None,
        deletion_vector: None,
        base_row_id: None,
        default_row_commit_version: None,
        clustering_provider: None,
    }
}

/// Delta's default of `delta.dataSkippingNumIndexedCols`.
pub const DEFAULT_INDEXED_COLUMNS: usize = 32;

/// The columns a table wants statistics for (its table properties).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatsColumns {
    /// The first this many top-level columns (partition columns not counted).
    First(usize),
    /// Every column (`delta.dataSkippingNumIndexedCols` = -1).
    All,
    /// These columns (`delta.dataSkippingStatsColumns`; a struct's name takes its fields).
    Named(Vec<String>),
}

impl Default for StatsColumns {
    fn default() -> Self {
        StatsColumns::First(DEFAULT_INDEXED_COLUMNS)
    }
}

impl StatsColumns {
    /// The columns of a table with these properties (its metadata's `configuration`).
    pub fn of(config: &HashMap<String, String>) -> StatsColumns {
        if let Some(names) = config.get("delta.dataSkippingStatsColumns") {
            let names: Vec<String> = names
                .split(',')
                .map(|n| n.trim().trim_matches('`').to_string())
                .filter(|n| !n.is_empty())
                .collect();
            return StatsColumns::Named(names);
        }
        match config
            .get("delta.dataSkippingNumIndexedCols")
            .and_then(|v| v.trim().parse::<i64>().ok())
        {
            Some(-1) => StatsColumns::All,
            Some(n) if n >= 0 => StatsColumns::First(n as usize),
            _ => StatsColumns::default(),
        }
    }

    /// The columns `table` asks for, per its snapshot as the handle last saw it.
    pub fn of_table(table: &deltalake_core::DeltaTable) -> StatsColumns {
        table
            .snapshot()
            .map(|s| StatsColumns::of(s.metadata().configuration()))
            .unwrap_or_default()
    }

    /// The leaf columns of `meta`'s schema to keep statistics for (their indexes).
    fn leaves(&self, meta: &ParquetMetaData, partition_columns: &[String]) -> Vec<usize> {
        let schema = meta.file_metadata().schema_descr();
        let mut tops: Vec<&str> = Vec::new();
        let mut out = Vec::new();
        for (i, col) in schema.columns().iter().enumerate() {
            let parts = col.path().parts();
            let top = parts[0].as_str();
            if partition_columns.iter().any(|p| p == top) {
                continue;
            }
            let keep = match self {
                StatsColumns::All => true,
                StatsColumns::First(n) => {
                    if !tops.contains(&top) {
                        tops.push(top);
                    }
                    tops.iter().position(|t| *t == top).is_some_and(|p| p < *n)
                }
                StatsColumns::Named(names) => {
                    let path = parts.join(".");
                    names
                        .iter()
                        .any(|n| path == *n || path.starts_with(&format!("{n}.")))
                }
            };
            if keep {
                out.push(i);
            }
        }
        out
    }
}

/// The `stats` JSON of a data file: `numRecords`, and per column of `columns` (partition
/// columns left out) its `minValues`, `maxValues` and `nullCount`, from the file's footer.
pub fn file_stats(
    meta: &ParquetMetaData,
    columns: &StatsColumns,
    partition_columns: &[String],
) -> String {
    let (mut mins, mut maxes, mut nulls) = (Map::new(), Map::new(), Map::new());
    let schema = meta.file_metadata().schema_descr();
    for i in columns.leaves(meta, partition_columns) {
        let col = schema.column(i);
        if col.max_rep_level() > 0 {
            continue;
        }
        let Some(c) = aggregate(meta, i, &col) else {
            continue;
        };
        let path = col.path().parts();
        insert(&mut nulls, path, Value::from(c.nulls));
        if let (Some(min), Some(max)) = (c.min, c.max) {
            insert(&mut mins, path, min);
            insert(&mut maxes, path, max);
        }
    }
    let mut stats = Map::new();
    stats.insert(
        "numRecords".into(),
        Value::from(meta.file_metadata().num_rows()),
    );
    stats.insert("minValues".into(), Value::Object(mins));
    stats.insert("maxValues".into(), Value::Object(maxes));
    stats.insert("nullCount".into(), Value::Object(nulls));
    Value::Object(stats).to_string()
}

/// A column's statistics over the file's row groups.
struct Column {
    nulls: u64,
    min: Option<Value>,
    max: Option<Value>,
}

/// Leaf `i`'s statistics over every row group of `meta`; `None` when a row group has none (or
/// no null count). `min`/`max` are `None` unless every row group has them.
fn aggregate(meta: &ParquetMetaData, i: usize, col: &ColumnDescriptor) -> Option<Column> {
    let logical = col
        .logical_type_ref()
        .cloned()
        .or_else(|| match col.converted_type() {
            ConvertedType::UTF8 => Some(LogicalType::String),
            ConvertedType::DATE => Some(LogicalType::Date),
            _ => None,
        });
    let mut nulls = 0u64;
    let mut range: Option<(Ord, Ord)> = None;
    let mut ranged = true;
    for rg in meta.row_groups() {
        let s = rg.column(i).statistics()?;
        nulls += s.null_count_opt()?;
        if rg.num_rows() == s.null_count_opt()? as i64 {
            // All NULL: no values, no bounds to take.
            continue;
        }
        match (
            ordered(s, logical.as_ref(), true),
            ordered(s, logical.as_ref(), false),
        ) {
            (Some(lo), Some(hi)) if ranged => {
                range = Some(match range {
                    None => (lo, hi),
                    Some((a, b)) => (a.min(lo), b.max(hi)),
                });
            }
            _ => ranged = false,
        }
    }
    let (min, max) = match range.filter(|_| ranged) {
        Some((lo, hi)) => (lo.json(Bound::Lower), hi.json(Bound::Upper)),
        None => (None, None),
    };
    Some(Column { nulls, min, max })
}

/// A statistic as a value that orders as its column's type does.
#[derive(Debug, Clone, PartialEq, PartialOrd)]
enum Ord {
    Bool(bool),
    Int(i64),
    Float(f64),
    /// The unscaled value and the scale.
    Decimal(i128, i32),
    Date(i32),
    /// Microseconds since the epoch; `true`: UTC (`timestamp`), else `timestamp_ntz`.
    Timestamp(i64, bool),
    Text(String),
}

impl Ord {
    fn min(self, o: Ord) -> Ord {
        if o < self {
            o
        } else {
            self
        }
    }

    fn max(self, o: Ord) -> Ord {
        if o > self {
            o
        } else {
            self
        }
    }

    /// The JSON of the bound, as Delta's stats write it; `None` where no JSON holds it.
    fn json(&self, bound: Bound) -> Option<Value> {
        Some(match self {
            Ord::Bool(b) => Value::Bool(*b),
            Ord::Int(v) => Value::from(*v),
            Ord::Float(f) => Value::Number(serde_json::Number::from_f64(*f)?),
            Ord::Decimal(v, scale) => decimal_json(*v, *scale, bound)?,
            Ord::Date(d) => {
                let day = NaiveDate::from_ymd_opt(1970, 1, 1)?
                    .checked_add_signed(chrono::Duration::days(*d as i64))?;
                Value::from(day.format("%Y-%m-%d").to_string())
            }
            Ord::Timestamp(us, utc) => {
                // The protocol's precision is the millisecond: the minimum down, the maximum up.
                let ms = match bound {
                    Bound::Lower => us.div_euclid(1000),
                    Bound::Upper => us.div_euclid(1000) + i64::from(us.rem_euclid(1000) != 0),
                };
                let t = DateTime::from_timestamp_millis(ms)?.naive_utc();
                let format = match (utc, t.nanosecond() == 0) {
                    (true, true) => "%Y-%m-%dT%H:%M:%SZ",
                    (true, false) => "%Y-%m-%dT%H:%M:%S%.3fZ",
                    (false, true) => "%Y-%m-%d %H:%M:%S",
                    (false, false) => "%Y-%m-%d %H:%M:%S%.3f",
                };
                Value::from(t.format(format).to_string())
            }
            Ord::Text(s) => Value::from(s.as_str()),
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Bound {
    Lower,
    Upper,
}

/// A decimal's bound as a JSON number (a double, as delta-rs and Spark write them): exact where
/// the double's shortest form is the decimal, else one step of the double outwards.
fn decimal_json(v: i128, scale: i32, bound: Bound) -> Option<Value> {
    let text = if scale <= 0 {
        let whole = v.checked_mul(10i128.checked_pow(scale.unsigned_abs())?)?;
        if let Ok(w) = i64::try_from(whole) {
            return Some(Value::from(w));
        }
        whole.to_string()
    } else {
        decimal_text(v, scale as u32)
    };
    let f: f64 = text.parse().ok()?;
    let exact = trim_fraction(&format!("{f}")) == trim_fraction(&text);
    let f = match (exact, bound) {
        (true, _) => f,
        (false, Bound::Lower) => f.next_down(),
        (false, Bound::Upper) => f.next_up(),
    };
    Some(Value::Number(serde_json::Number::from_f64(f)?))
}

/// `v` scaled down by `scale` digits, as decimal text (`-12.340`).
fn decimal_text(v: i128, scale: u32) -> String {
    let digits = v.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, frac) = padded.split_at(padded.len() - scale);
    let sign = if v < 0 { "-" } else { "" };
    format!("{sign}{whole}.{frac}")
}

/// Decimal text without trailing fraction zeros (`1.50` → `1.5`, `2.0` → `2`).
fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// The minimum (`min`) or maximum of a chunk's statistics, as its column's type orders.
fn ordered(s: &Statistics, logical: Option<&LogicalType>, min: bool) -> Option<Ord> {
    macro_rules! pick {
        ($v:expr) => {
            if min {
                $v.min_opt()
            } else {
                $v.max_opt()
            }
        };
    }
    let bytes = || {
        if min {
            s.min_bytes_opt()
        } else {
            s.max_bytes_opt()
        }
    };
    Some(match (s, logical) {
        (Statistics::Boolean(v), _) => Ord::Bool(*pick!(v)?),
        (Statistics::Int32(v), Some(LogicalType::Date)) => Ord::Date(*pick!(v)?),
        (Statistics::Int32(v), Some(LogicalType::Decimal(d))) => {
            Ord::Decimal(*pick!(v)? as i128, d.scale)
        }
        (Statistics::Int32(v), None | Some(LogicalType::Integer(_))) => Ord::Int(*pick!(v)? as i64),
        (Statistics::Int64(v), Some(LogicalType::Timestamp(t))) => {
            let v = *pick!(v)?;
            // A bound in microseconds that stays a bound (nanoseconds: floor for the minimum,
            // ceiling for the maximum).
            let us = match t.unit {
                TimeUnit::MILLIS => v.checked_mul(1000)?,
                TimeUnit::MICROS => v,
                TimeUnit::NANOS if min => v.div_euclid(1000),
                TimeUnit::NANOS => v.div_euclid(1000) + i64::from(v.rem_euclid(1000) != 0),
            };
            Ord::Timestamp(us, t.is_adjusted_to_u_t_c)
        }
        (Statistics::Int64(v), Some(LogicalType::Decimal(d))) => {
            Ord::Decimal(*pick!(v)? as i128, d.scale)
        }
        (Statistics::Int64(v), None | Some(LogicalType::Integer(_))) => Ord::Int(*pick!(v)?),
        (Statistics::Float(v), _) => Ord::Float(*pick!(v)? as f64),
        (Statistics::Double(v), _) => Ord::Float(*pick!(v)?),
        (Statistics::ByteArray(_), Some(LogicalType::String)) => {
            Ord::Text(String::from_utf8(bytes()?.to_vec()).ok()?)
        }
        (Statistics::FixedLenByteArray(_), Some(LogicalType::Decimal(d)))
            if s.physical_type() == PhysicalType::FIXED_LEN_BYTE_ARRAY =>
        {
            let b = bytes()?;
            if b.is_empty() || b.len() > 16 {
                return None;
            }
            let mut be = if b[0] & 0x80 != 0 {
                [0xff; 16]
            } else {
                [0; 16]
            };
            be[16 - b.len()..].copy_from_slice(b);
            Ord::Decimal(i128::from_be_bytes(be), d.scale)
        }
        _ => return None,
    })
}

/// Put `value` at `path` (nested columns as nested objects).
fn insert(into: &mut Map<String, Value>, path: &[String], value: Value) {
    match path {
        [] => {}
        [leaf] => {
            into.insert(leaf.clone(), value);
        }
        [head, rest @ ..] => {
            let child = into
                .entry(head.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = child {
                insert(m, rest, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{
        ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int64Array, ListArray,
        RecordBatch, StringArray, StructArray, TimestampMicrosecondArray,
    };
    use arrow_schema::{DataType, Field, Fields, Schema, TimeUnit as ArrowUnit};
    use serde_json::json;

    use super::*;
    use crate::table::parquet::write_parquet;

    fn schema() -> Arc<Schema> {
        let user = Fields::from(vec![
            Field::new("uid", DataType::Int64, false),
            Field::new("email", DataType::Utf8, true),
        ]);
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("score", DataType::Float64, true),
            Field::new("ok", DataType::Boolean, true),
            Field::new("amount", DataType::Decimal128(38, 9), true),
            Field::new(
                "at",
                DataType::Timestamp(ArrowUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new(
                "local",
                DataType::Timestamp(ArrowUnit::Microsecond, None),
                true,
            ),
            Field::new("day", DataType::Date32, true),
            Field::new(
                "tags",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
            Field::new("user", DataType::Struct(user), true),
            Field::new("note", DataType::Utf8, true),
            Field::new("blob", DataType::Binary, true),
        ]))
    }

    /// Rows `ids`; id 2 has NULL in every nullable column.
    fn batch(ids: &[i64]) -> RecordBatch {
        let s = schema();
        let some = |i: &i64| *i != 2;
        let user_fields = match s.field(9).data_type() {
            DataType::Struct(f) => f.clone(),
            _ => unreachable!(),
        };
        let tags = ListArray::from_iter_primitive::<arrow_array::types::Int32Type, _, _>(
            ids.iter().map(|_| Some(vec![Some(1)])),
        );
        let tags = arrow_cast::cast(&tags, s.field(8).data_type()).unwrap();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(ids.to_vec())),
            Arc::new(StringArray::from_iter(
                ids.iter().map(|i| some(i).then(|| format!("n{i}"))),
            )),
            Arc::new(Float64Array::from_iter(
                ids.iter().map(|i| some(i).then(|| *i as f64 / 4.0)),
            )),
            Arc::new(BooleanArray::from_iter(
                ids.iter().map(|i| some(i).then_some(i % 3 == 0)),
            )),
            Arc::new(
                Decimal128Array::from_iter(
                    ids.iter()
                        .map(|i| some(i).then_some(*i as i128 * 1_250_000_000)),
                )
                .with_precision_and_scale(38, 9)
                .unwrap(),
            ),
            Arc::new(
                TimestampMicrosecondArray::from_iter(
                    // 2024-01-01T00:00:00Z plus i seconds and 500 µs.
                    ids.iter()
                        .map(|i| some(i).then_some(1_704_067_200_000_000 + i * 1_000_000 + 500)),
                )
                .with_timezone("UTC"),
            ),
            Arc::new(TimestampMicrosecondArray::from_iter(
                ids.iter()
                    .map(|i| some(i).then_some(1_704_067_200_000_000 + i * 1_000)),
            )),
            Arc::new(Date32Array::from_iter(
                ids.iter().map(|i| some(i).then_some(19_723 + *i as i32)),
            )),
            tags,
            Arc::new(StructArray::new(
                user_fields,
                vec![
                    Arc::new(Int64Array::from_iter_values(ids.iter().map(|i| i * 10))),
                    Arc::new(StringArray::from_iter(
                        ids.iter().map(|i| (i % 2 == 1).then(|| format!("u{i}@x"))),
                    )),
                ],
                None,
            )),
            Arc::new(StringArray::from_iter(ids.iter().map(|_| None::<String>))),
            Arc::new(arrow_array::BinaryArray::from_iter(
                ids.iter().map(|i| some(i).then(|| vec![*i as u8])),
            )),
        ];
        RecordBatch::try_new(s, columns).unwrap()
    }

    fn stats_of(batches: &[RecordBatch], columns: &StatsColumns, parts: &[String]) -> Value {
        let file = write_parquet(&schema(), batches, None).unwrap();
        let meta = file.metadata.as_ref().unwrap();
        serde_json::from_str(&file_stats(meta, columns, parts)).unwrap()
    }

    #[test]
    fn every_column_gets_delta_rs_shaped_stats_with_true_bounds() {
        let s = stats_of(
            &[batch(&[1, 2, 3]), batch(&[7])],
            &StatsColumns::default(),
            &[],
        );
        assert_eq!(s["numRecords"], 4);
        assert_eq!(
            s["minValues"],
            json!({
                "id": 1, "name": "n1", "score": 0.25, "ok": false, "amount": 1.25,
                // 500 µs past the second: the minimum down to the millisecond, the maximum up.
                "at": "2024-01-01T00:00:01Z", "local": "2024-01-01 00:00:00.001",
                "day": "2024-01-02", "user": {"uid": 10, "email": "u1@x"},
            })
        );
        assert_eq!(
            s["maxValues"],
            json!({
                "id": 7, "name": "n7", "score": 1.75, "ok": true, "amount": 8.75,
                "at": "2024-01-01T00:00:07.001Z", "local": "2024-01-01 00:00:00.007",
                "day": "2024-01-08", "user": {"uid": 70, "email": "u7@x"},
            })
        );
        // Lists get none; an all-NULL column and a binary one their null count only.
        assert_eq!(
            s["nullCount"],
            json!({
                "id": 0, "name": 1, "score": 1, "ok": 1, "amount": 1, "at": 1, "local": 1,
                "day": 1, "user": {"uid": 0, "email": 1}, "note": 4, "blob": 1,
            })
        );
    }

    #[test]
    fn row_groups_are_combined() {
        // Row groups of two rows: [5, 6], [2, 9], [3]; the second's `name` is NULL but for 9.
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(2))
            .build();
        let batches = [batch(&[5, 6, 2, 9, 3])];
        let file = write_parquet(&schema(), &batches, Some(props)).unwrap();
        let meta = file.metadata.as_ref().unwrap();
        assert_eq!(meta.num_row_groups(), 3);
        let s: Value = serde_json::from_str(&file_stats(meta, &StatsColumns::All, &[])).unwrap();
        assert_eq!(s["numRecords"], 5);
        assert_eq!(s["minValues"]["id"], 2);
        assert_eq!(s["maxValues"]["id"], 9);
        assert_eq!(s["minValues"]["name"], "n3");
        assert_eq!(s["maxValues"]["name"], "n9");
        assert_eq!(s["nullCount"]["name"], 1);
        // A row group of NULLs only takes no part in the range.
        let file = write_parquet(
            &schema(),
            &[batch(&[2, 2, 4])],
            Some(
                parquet::file::properties::WriterProperties::builder()
                    .set_max_row_group_row_count(Some(2))
                    .build(),
            ),
        )
        .unwrap();
        let s: Value = serde_json::from_str(&file_stats(
            file.metadata.as_ref().unwrap(),
            &StatsColumns::All,
            &[],
        ))
        .unwrap();
        assert_eq!(
            (
                s["minValues"]["score"].clone(),
                s["maxValues"]["score"].clone()
            ),
            (json!(1.0), json!(1.0))
        );
        assert_eq!(s["nullCount"]["score"], 2);
    }

    #[test]
    fn the_table_properties_choose_the_columns() {
        let config = |k: &str, v: &str| HashMap::from([(k.to_string(), v.to_string())]);
        assert_eq!(StatsColumns::of(&HashMap::new()), StatsColumns::First(32));
        let two = StatsColumns::of(&config("delta.dataSkippingNumIndexedCols", "2"));
        assert_eq!(two, StatsColumns::First(2));
        assert_eq!(
            StatsColumns::of(&config("delta.dataSkippingNumIndexedCols", "-1")),
            StatsColumns::All
        );
        assert_eq!(
            StatsColumns::of(&config("delta.dataSkippingNumIndexedCols", "-7")),
            StatsColumns::First(32)
        );
        let s = stats_of(&[batch(&[1])], &two, &[]);
        assert_eq!(s["minValues"], json!({"id": 1, "name": "n1"}));
        assert_eq!(s["nullCount"], json!({"id": 0, "name": 0}));
        // A partition column is not counted: the next column takes its place.
        let s = stats_of(&[batch(&[1])], &two, &["id".to_string()]);
        assert_eq!(s["nullCount"], json!({"name": 0, "score": 0}));
        // Named columns; a struct's name takes its fields.
        let named = StatsColumns::of(&config("delta.dataSkippingStatsColumns", "score, user"));
        let s = stats_of(&[batch(&[1])], &named, &[]);
        assert_eq!(
            s["maxValues"],
            json!({"score": 0.25, "user": {"uid": 10, "email": "u1@x"}})
        );
        // Zero columns: numRecords alone.
        let s = stats_of(&[batch(&[1])], &StatsColumns::First(0), &[]);
        assert_eq!(s["nullCount"], json!({}));
    }

    #[test]
    fn decimals_a_double_cannot_hold_are_widened_outwards() {
        assert_eq!(
            decimal_json(1_250_000_000, 9, Bound::Lower),
            Some(json!(1.25))
        );
        assert_eq!(decimal_json(-5, 0, Bound::Upper), Some(json!(-5)));
        assert_eq!(decimal_json(12, -2, Bound::Upper), Some(json!(1200)));
        // 2^53 + 1 (as 9007199254740993.0) has no double: the lower bound is the double below
        // it, the upper the one above.
        let v = (1i128 << 53) + 1;
        let lo = decimal_json(v * 10, 1, Bound::Lower)
            .unwrap()
            .as_f64()
            .unwrap();
        let hi = decimal_json(v * 10, 1, Bound::Upper)
            .unwrap()
            .as_f64()
            .unwrap();
        assert!((lo as i128) < v, "{lo}");
        assert!(hi as i128 > v, "{hi}");
        // BigQuery NUMERIC's largest value, 38 digits with 9 after the point.
        let max = 10i128.pow(38) - 1;
        let hi = decimal_json(max, 9, Bound::Upper)
            .unwrap()
            .as_f64()
            .unwrap();
        assert!(hi >= 1e29, "{hi}");
        assert_eq!(decimal_text(-1_234, 3), "-1.234");
        assert_eq!(decimal_text(5, 3), "0.005");
    }
}
