//! Partitioned Delta tables (docs/destinations.md, "Partitioned tables").
//!
//! A table is partitioned by columns of its own (`--table-partition-by region`: each value its own
//! partition) or by time, as BigQuery's `timePartitioning` says: a TIMESTAMP or DATE column, or
//! the ingestion time (the message's publish time), truncated to HOUR, DAY, MONTH or YEAR. Time
//! partitions are a derived column of the Delta table: `_PARTITIONDATE` (DATE, the first day of the
//! DAY, MONTH or YEAR) or `_PARTITIONTIME` (TIMESTAMP, HOUR). A table that exists already is
//! written with the partition columns of its metadata (a partitioned table made by another writer
//! is filled, not refused).
//!
//! A batch of rows is split by its partition values ([`Partitioning::split`]): one Parquet file
//! per partition, without the partition columns (their values are in the `add` action, Hive-style
//! in the path: `region=eu/part-….parquet`, values escaped as deltalake escapes them, NULL as
//! `__HIVE_DEFAULT_PARTITION__`).
//!
//! The partitioning as configured ([`PartitionBy`]) is `table/partition.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{
    Array, ArrayRef, Date32Array, RecordBatch, TimestampMicrosecondArray, UInt32Array,
};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef, TimeUnit as ArrowUnit};
use chrono::Datelike;
use deltalake_core::arrow::compute::take_record_batch;
use deltalake_core::arrow::row::{RowConverter, SortField};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use crate::table::partition::{
    check_against, PartitionBy, PartitionError, TimeUnit, PARTITION_DATE, PARTITION_TIME,
};

const MICROS_PER_HOUR: i64 = 3_600_000_000;
const MICROS_PER_DAY: i64 = 24 * MICROS_PER_HOUR;

/// A partitioning checked against the rows it partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partitioning {
    by: Vec<PartitionBy>,
    /// Per item: the index of its source column in the rows (`None`: ingestion time).
    sources: Vec<Option<usize>>,
}

impl Partitioning {
    /// Check `by` against `rows` (the row builder's schema): each column exists (top-level),
    /// a column is STRING, INTEGER, BOOLEAN, DATE or TIMESTAMP, a time column TIMESTAMP or DATE
    /// (DATE: not HOUR), at most one time item, no derived column named like a column, no column
    /// twice.
    pub fn new(by: Vec<PartitionBy>, rows: &Schema) -> Result<Partitioning, PartitionError> {
        let sources = check_against(&by, rows)?;
        Ok(Partitioning { by, sources })
    }

    /// No partitions.
    pub fn none() -> Partitioning {
        Partitioning {
            by: Vec::new(),
            sources: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by.is_empty()
    }

    pub fn items(&self) -> &[PartitionBy] {
        &self.by
    }

    /// The same partitioning over other rows (columns added while running move the metadata
    /// columns subsink appends).
    pub fn rebind(&self, rows: &Schema) -> Result<Partitioning, PartitionError> {
        Partitioning::new(self.by.clone(), rows)
    }

    /// The Delta table's partition columns, in order.
    pub fn columns(&self) -> Vec<String> {
        self.by
            .iter()
            .map(|b| b.delta_column().to_string())
            .collect()
    }

    /// Whether rows need their publish time (ingestion-time partitions).
    pub fn needs_publish_time(&self) -> bool {
        self.sources.iter().any(Option::is_none)
    }

    /// The derived columns the table has besides the rows' own, in order.
    pub fn derived_fields(&self) -> Vec<Field> {
        self.by
            .iter()
            .filter_map(|b| match b {
                PartitionBy::Column(_) => None,
                PartitionBy::Time { unit, .. } => Some(match unit {
                    TimeUnit::Hour => Field::new(
                        PARTITION_TIME,
                        DataType::Timestamp(ArrowUnit::Microsecond, Some("UTC".into())),
                        true,
                    ),
                    _ => Field::new(PARTITION_DATE, DataType::Date32, true),
                }),
            })
            .collect()
    }

    /// `rows` with the derived columns appended (`publish`: each row's publish time in
    /// microseconds, needed for ingestion-time partitions).
    pub fn derive(&self, rows: RecordBatch, publish: &[i64]) -> Result<RecordBatch, ArrowError> {
        let mut fields: Vec<Arc<Field>> = rows.schema().fields().iter().cloned().collect();
        let mut columns = rows.columns().to_vec();
        let derived = self.derived_fields();
        let mut derived = derived.into_iter();
        for (b, source) in self.by.iter().zip(&self.sources) {
            let PartitionBy::Time { unit, .. } = b else {
                continue;
            };
            let field = derived.next().expect("one derived field per time item");
            let micros: Vec<Option<i64>> = match source {
                None => {
                    if publish.len() != rows.num_rows() {
                        return Err(ArrowError::InvalidArgumentError(format!(
                            "{} publish times for {} rows",
                            publish.len(),
                            rows.num_rows()
                        )));
                    }
                    publish.iter().map(|t| Some(*t)).collect()
                }
                Some(i) => time_micros(rows.column(*i))?,
            };
            columns.push(truncate(&micros, *unit));
            fields.push(Arc::new(field));
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
    }

    /// Split `rows` (the rows' columns, then the derived ones: [`Partitioning::derive`]) by their
    /// partition values: per partition, in order of first appearance, its values and the rows
    /// without the partition columns.
    pub fn split(
        &self,
        rows: &RecordBatch,
    ) -> Result<Vec<(PartitionValues, RecordBatch)>, ArrowError> {
        let schema = rows.schema();
        let names = self.columns();
        let indices: Vec<usize> = names
            .iter()
            .map(|n| schema.index_of(n))
            .collect::<Result<_, _>>()?;
        let keys: Vec<ArrayRef> = indices.iter().map(|i| rows.column(*i).clone()).collect();
        let converter = RowConverter::new(
            keys.iter()
                .map(|c| SortField::new(c.data_type().clone()))
                .collect(),
        )?;
        let converted = converter.convert_columns(&keys)?;
        let mut groups: HashMap<&[u8], usize> = HashMap::new();
        let mut members: Vec<Vec<u32>> = Vec::new();
        for (i, row) in converted.iter().enumerate() {
            let g = *groups.entry(row.data()).or_insert_with(|| {
                members.push(Vec::new());
                members.len() - 1
            });
            members[g].push(i as u32);
        }
        let mut keep: Vec<usize> = (0..schema.fields().len())
            .filter(|i| !indices.contains(i))
            .collect();
        keep.sort_unstable();
        let rest = rows.project(&keep)?;
        let mut out = Vec::with_capacity(members.len());
        for m in members {
            let first = m[0] as usize;
            let values = PartitionValues::of(&names, &keys, first)?;
            let take = UInt32Array::from(m);
            let part = if take.len() == rows.num_rows() {
                rest.clone()
            } else {
                take_record_batch(&rest, &take)?
            };
            out.push((values, part));
        }
        Ok(out)
    }

    /// `schema` without the partition columns: the schema of the data files.
    pub fn file_schema(&self, schema: &Schema) -> SchemaRef {
        let names = self.columns();
        Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .filter(|f| !names.contains(f.name()))
                .cloned()
                .collect::<Vec<_>>(),
        ))
    }
}

/// One partition's values: as the `add` action holds them (Delta's serialization, NULL as none)
/// and as the Hive-style folder of its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionValues {
    pub values: HashMap<String, Option<String>>,
    /// `k=v/k2=v2`, values escaped as deltalake escapes them.
    pub dir: String,
}

impl PartitionValues {
    fn of(names: &[String], keys: &[ArrayRef], row: usize) -> Result<PartitionValues, ArrowError> {
        let mut values = HashMap::with_capacity(names.len());
        let mut dir = String::new();
        for (name, col) in names.iter().zip(keys) {
            let value = delta_value(col, row)?;
            if !dir.is_empty() {
                dir.push('/');
            }
            dir.push_str(name);
            dir.push('=');
            match &value {
                Some(v) => dir.extend(utf8_percent_encode(v, PARTITION_VALUE)),
                None => dir.push_str(NULL_PARTITION),
            }
            values.insert(name.clone(), value);
        }
        Ok(PartitionValues { values, dir })
    }
}

/// A NULL partition value's folder (Hive's, Spark's and deltalake's name).
pub const NULL_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// What deltalake escapes in a partition value's folder (the Delta protocol's "How to URL encode
/// keys and string values"): controls, space and RFC 3986's reserved and unsafe characters.
const PARTITION_VALUE: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'!')
    .add(b'"')
    .add(b'#')
    .add(b'$')
    .add(b'%')
    .add(b'&')
    .add(b'\'')
    .add(b'(')
    .add(b')')
    .add(b'*')
    .add(b'+')
    .add(b',')
    .add(b'/')
    .add(b':')
    .add(b';')
    .add(b'<')
    .add(b'=')
    .add(b'>')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// Row `row` of a partition column as the Delta protocol serializes partition values (NULL:
/// `None`): strings as they are, integers in decimal, `true`/`false`, dates `YYYY-MM-DD`,
/// timestamps `YYYY-MM-DD HH:MM:SS.ffffff` in UTC (as deltalake writes them).
fn delta_value(col: &ArrayRef, row: usize) -> Result<Option<String>, ArrowError> {
    if col.is_null(row) {
        return Ok(None);
    }
    Ok(Some(match col.data_type() {
        DataType::Utf8 => col.as_string::<i32>().value(row).to_string(),
        DataType::Int64 => col.as_primitive::<Int64Type>().value(row).to_string(),
        DataType::Boolean => col.as_boolean().value(row).to_string(),
        DataType::Date32 => {
            let days = col.as_primitive::<Date32Type>().value(row);
            chrono::DateTime::from_timestamp(days as i64 * 86_400, 0)
                .map(|t| t.format("%Y-%m-%d").to_string())
                .ok_or_else(|| {
                    ArrowError::InvalidArgumentError(format!("date {days} out of range"))
                })?
        }
        DataType::Timestamp(ArrowUnit::Microsecond, _) => {
            let m = col.as_primitive::<TimestampMicrosecondType>().value(row);
            chrono::DateTime::from_timestamp_micros(m)
                .map(|t| t.format("%Y-%m-%d %H:%M:%S%.6f").to_string())
                .ok_or_else(|| {
                    ArrowError::InvalidArgumentError(format!("timestamp {m} out of range"))
                })?
        }
        other => {
            return Err(ArrowError::InvalidArgumentError(format!(
                "a partition column of type {other}"
            )))
        }
    }))
}

/// A TIMESTAMP (µs) or DATE column as microseconds since the epoch.
fn time_micros(col: &ArrayRef) -> Result<Vec<Option<i64>>, ArrowError> {
    if let Some(a) = col.as_any().downcast_ref::<TimestampMicrosecondArray>() {
        return Ok(a.iter().collect());
    }
    if let Some(a) = col.as_any().downcast_ref::<Date32Array>() {
        return Ok(a
            .iter()
            .map(|d| d.map(|d| d as i64 * MICROS_PER_DAY))
            .collect());
    }
    Err(ArrowError::InvalidArgumentError(format!(
        "a time partition's column has type {}",
        col.data_type()
    )))
}

/// The partition of each time: HOUR as a TIMESTAMP, the others as the DATE of their first day.
fn truncate(micros: &[Option<i64>], unit: TimeUnit) -> ArrayRef {
    match unit {
        TimeUnit::Hour => Arc::new(
            TimestampMicrosecondArray::from(
                micros
                    .iter()
                    .map(|m| m.map(|m| m.div_euclid(MICROS_PER_HOUR) * MICROS_PER_HOUR))
                    .collect::<Vec<_>>(),
            )
            .with_timezone("UTC"),
        ),
        _ => Arc::new(Date32Array::from(
            micros
                .iter()
                .map(|m| m.map(|m| first_day(m.div_euclid(MICROS_PER_DAY), unit)))
                .collect::<Vec<_>>(),
        )),
    }
}

/// Days since the epoch of the first day of `days`' DAY, MONTH or YEAR.
fn first_day(days: i64, unit: TimeUnit) -> i32 {
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date");
    let Some(d) = epoch.checked_add_signed(chrono::Duration::days(days)) else {
        return days as i32;
    };
    let first = match unit {
        TimeUnit::Month => d.with_day(1),
        TimeUnit::Year => d.with_day(1).and_then(|d| d.with_month(1)),
        _ => Some(d),
    }
    .unwrap_or(d);
    (first - epoch).num_days() as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};

    fn rows() -> RecordBatch {
        let ts = TimestampMicrosecondArray::from(vec![
            Some(1_796_444_400_000_000), // 2026-12-05T04:20:00Z
            Some(1_796_448_000_000_000), // 2026-12-05T05:20:00Z
            None,
            Some(1_796_444_400_000_000),
        ])
        .with_timezone("UTC");
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("region", DataType::Utf8, true),
            Field::new("ts", ts.data_type().clone(), true),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(StringArray::from(vec![
                    Some("eu"),
                    Some("a b/c=d"),
                    None,
                    Some("eu"),
                ])),
                Arc::new(ts),
            ],
        )
        .unwrap()
    }

    #[test]
    fn checks_name_the_column_and_the_rule() {
        let schema = rows().schema();
        let err = |s: &str| {
            Partitioning::new(vec![PartitionBy::parse(s).unwrap()], &schema)
                .unwrap_err()
                .0
        };
        assert!(
            err("nope").contains("`nope` is not a column"),
            "{}",
            err("nope")
        );
        assert!(err("Region").contains("case-sensitive here: `region`"));
        assert!(err("DAY(region)").contains("TIMESTAMP or DATE"));
        let two = vec![
            PartitionBy::parse("DAY(ts)").unwrap(),
            PartitionBy::parse("HOUR(_PARTITIONTIME)").unwrap(),
        ];
        assert!(Partitioning::new(two, &schema).is_err());
    }

    #[test]
    fn rows_split_by_column_and_day_with_escaped_folders() {
        let p = Partitioning::new(
            vec![
                PartitionBy::parse("region").unwrap(),
                PartitionBy::parse("DAY(ts)").unwrap(),
            ],
            &rows().schema(),
        )
        .unwrap();
        let all = p.derive(rows(), &[]).unwrap();
        let parts = p.split(&all).unwrap();
        let dirs: Vec<&str> = parts.iter().map(|(v, _)| v.dir.as_str()).collect();
        assert_eq!(
            dirs,
            [
                "region=eu/_PARTITIONDATE=2026-12-05",
                "region=a%20b%2Fc%3Dd/_PARTITIONDATE=2026-12-05",
                "region=__HIVE_DEFAULT_PARTITION__/_PARTITIONDATE=__HIVE_DEFAULT_PARTITION__",
            ]
        );
        assert_eq!(parts[0].0.values["region"].as_deref(), Some("eu"));
        assert_eq!(parts[1].0.values["region"].as_deref(), Some("a b/c=d"));
        assert_eq!(parts[2].0.values["_PARTITIONDATE"], None);
        let ids: Vec<Vec<i64>> = parts
            .iter()
            .map(|(_, b)| {
                assert_eq!(
                    b.schema().fields().len(),
                    2,
                    "id and ts, no partition column"
                );
                let a = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                a.values().to_vec()
            })
            .collect();
        assert_eq!(ids, [vec![1, 4], vec![2], vec![3]]);
    }

    #[test]
    fn hours_months_years_and_ingestion_time() {
        let schema = rows().schema();
        let dir = |item: &str, publish: &[i64]| {
            let p = Partitioning::new(vec![PartitionBy::parse(item).unwrap()], &schema).unwrap();
            let all = p.derive(rows(), publish).unwrap();
            p.split(&all)
                .unwrap()
                .into_iter()
                .map(|(v, _)| v.dir)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            dir("HOUR(ts)", &[]),
            [
                "_PARTITIONTIME=2026-12-05%2004%3A00%3A00.000000",
                "_PARTITIONTIME=2026-12-05%2005%3A00%3A00.000000",
                "_PARTITIONTIME=__HIVE_DEFAULT_PARTITION__",
            ]
        );
        assert_eq!(
            dir("MONTH(ts)", &[]),
            [
                "_PARTITIONDATE=2026-12-01",
                "_PARTITIONDATE=__HIVE_DEFAULT_PARTITION__"
            ]
        );
        assert_eq!(
            dir("YEAR(ts)", &[]),
            [
                "_PARTITIONDATE=2026-01-01",
                "_PARTITIONDATE=__HIVE_DEFAULT_PARTITION__"
            ]
        );
        // Ingestion time: the publish times, one per row; before 1970 too.
        assert_eq!(
            dir("DAY(_PARTITIONTIME)", &[0, -1, 0, MICROS_PER_DAY]),
            [
                "_PARTITIONDATE=1970-01-01",
                "_PARTITIONDATE=1969-12-31",
                "_PARTITIONDATE=1970-01-02"
            ]
        );
    }
}
