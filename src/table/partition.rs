//! A table's partitioning as configured (docs/destinations.md, "Partitioned tables"): by columns
//! of its own (`--table-partition-by region`: each value its own partition) or by time, as
//! BigQuery's `timePartitioning` says: a TIMESTAMP or DATE column, or the ingestion time (the
//! message's publish time), truncated to HOUR, DAY, MONTH or YEAR; the derived time columns'
//! names (`_PARTITIONDATE`, `_PARTITIONTIME`). How a Delta table's rows are split by it is
//! `sink/delta/partition.rs`.

use arrow_schema::{DataType, Schema, TimeUnit as ArrowUnit};

/// The derived column of DAY, MONTH and YEAR partitions (BigQuery's name for a day partition).
pub const PARTITION_DATE: &str = "_PARTITIONDATE";
/// The derived column of HOUR partitions (BigQuery's name for an ingestion-time partition).
pub const PARTITION_TIME: &str = "_PARTITIONTIME";

/// A time partition's granularity (`timePartitioning.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    Hour,
    Day,
    Month,
    Year,
}

impl TimeUnit {
    fn parse(s: &str) -> Option<TimeUnit> {
        Some(match s.to_ascii_uppercase().as_str() {
            "HOUR" => TimeUnit::Hour,
            "DAY" => TimeUnit::Day,
            "MONTH" => TimeUnit::Month,
            "YEAR" => TimeUnit::Year,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            TimeUnit::Hour => "HOUR",
            TimeUnit::Day => "DAY",
            TimeUnit::Month => "MONTH",
            TimeUnit::Year => "YEAR",
        }
    }

    /// The derived column holding this unit's partitions.
    pub fn column(self) -> &'static str {
        match self {
            TimeUnit::Hour => PARTITION_TIME,
            _ => PARTITION_DATE,
        }
    }
}

/// One partition column as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionBy {
    /// A column of the table, its values as they are.
    Column(String),
    /// A TIMESTAMP or DATE column (`Some`), or the ingestion time (`None`: the publish time),
    /// truncated to `unit`.
    Time {
        column: Option<String>,
        unit: TimeUnit,
    },
}

/// Why a partitioning cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PartitionError(pub String);

impl PartitionBy {
    /// One item of `--table-partition-by`: `COL`, `UNIT(COL)` (UNIT: HOUR, DAY, MONTH, YEAR) or
    /// `UNIT(_PARTITIONTIME)` (ingestion time).
    pub fn parse(item: &str) -> Result<PartitionBy, PartitionError> {
        let item = item.trim();
        let bad = |why: &str| {
            PartitionError(format!(
                "`{item}`: {why}; expected COL, UNIT(COL) or UNIT(_PARTITIONTIME) with UNIT one of HOUR, DAY, MONTH, YEAR"
            ))
        };
        if let Some((unit, rest)) = item.split_once('(') {
            let col = rest
                .strip_suffix(')')
                .ok_or_else(|| bad("no closing parenthesis"))?;
            let unit = TimeUnit::parse(unit.trim()).ok_or_else(|| bad("unknown time unit"))?;
            let col = col.trim();
            if col.is_empty() {
                return Err(bad("no column"));
            }
            let column = (!col.eq_ignore_ascii_case(PARTITION_TIME)).then(|| col.to_string());
            return Ok(PartitionBy::Time { column, unit });
        }
        if item.is_empty() || item.contains([')', '=', '/']) {
            return Err(bad("not a column name"));
        }
        Ok(PartitionBy::Column(item.to_string()))
    }

    /// A table resource's `timePartitioning` (`{"type": "DAY", "field": "ts"}`; no field:
    /// ingestion time).
    pub fn from_time_partitioning(v: &serde_json::Value) -> Result<PartitionBy, PartitionError> {
        let bad = |why: String| PartitionError(format!("timePartitioning: {why}"));
        let ty = match v.get("type") {
            None | Some(serde_json::Value::Null) => "DAY",
            Some(serde_json::Value::String(s)) => s.as_str(),
            Some(other) => return Err(bad(format!("type {other}: expected a string"))),
        };
        let unit = TimeUnit::parse(ty)
            .ok_or_else(|| bad(format!("type {ty:?}: expected HOUR, DAY, MONTH or YEAR")))?;
        let column = match v.get("field") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(other) => return Err(bad(format!("field {other}: expected a column name"))),
        };
        Ok(PartitionBy::Time { column, unit })
    }

    /// The Delta partition column it makes.
    pub fn delta_column(&self) -> &str {
        match self {
            PartitionBy::Column(c) => c,
            PartitionBy::Time { unit, .. } => unit.column(),
        }
    }
}

impl std::fmt::Display for PartitionBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PartitionBy::Column(c) => write!(f, "{c}"),
            PartitionBy::Time { column, unit } => write!(
                f,
                "{}({})",
                unit.name(),
                column.as_deref().unwrap_or(PARTITION_TIME)
            ),
        }
    }
}

/// Column types a table can be partitioned by as they are.
fn identity_type(ty: &DataType) -> bool {
    matches!(
        ty,
        DataType::Utf8 | DataType::Int64 | DataType::Boolean | DataType::Date32
    ) || matches!(ty, DataType::Timestamp(ArrowUnit::Microsecond, Some(tz)) if tz.as_ref() == "UTC")
}

/// Check `by` against `rows` (the row builder's schema): each column exists (top-level),
/// a column is STRING, INTEGER, BOOLEAN, DATE or TIMESTAMP, a time column TIMESTAMP or DATE
/// (DATE: not HOUR), at most one time item, no derived column named like a column, no column
/// twice. Per item: the index of its source column in the rows (`None`: ingestion time).
pub fn check_against(
    by: &[PartitionBy],
    rows: &Schema,
) -> Result<Vec<Option<usize>>, PartitionError> {
    let mut sources = Vec::with_capacity(by.len());
    let mut seen: Vec<&str> = Vec::new();
    let find = |c: &str| -> Result<usize, PartitionError> {
        rows.index_of(c).map_err(|_| {
            let near = rows
                .fields()
                .iter()
                .find(|f| f.name().eq_ignore_ascii_case(c))
                .map(|f| format!(" (column names are case-sensitive here: `{}`)", f.name()))
                .unwrap_or_default();
            PartitionError(format!(
                "partition column `{c}` is not a column of the table{near}; columns: {}",
                rows.fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    };
    if by
        .iter()
        .filter(|b| matches!(b, PartitionBy::Time { .. }))
        .count()
        > 1
    {
        return Err(PartitionError(
            "at most one time partitioning (HOUR/DAY/MONTH/YEAR), as in BigQuery".into(),
        ));
    }
    for b in by {
        let name = b.delta_column();
        if seen.contains(&name) {
            return Err(PartitionError(format!(
                "partition column `{name}` given twice"
            )));
        }
        seen.push(name);
        match b {
            PartitionBy::Column(c) => {
                let i = find(c)?;
                let ty = rows.field(i).data_type();
                if !identity_type(ty) {
                    return Err(PartitionError(format!(
                "partition column `{c}` has Arrow type {ty}: a table is partitioned by STRING, INTEGER, BOOLEAN, DATE or TIMESTAMP columns (a TIMESTAMP by time: DAY({c}) or HOUR({c}))"
            )));
                }
                sources.push(Some(i));
            }
            PartitionBy::Time { column, unit } => {
                if rows.index_of(unit.column()).is_ok() {
                    return Err(PartitionError(format!(
                "{b}: the table has a column `{}`, the name of the derived partition column",
                unit.column()
            )));
                }
                let Some(c) = column else {
                    sources.push(None);
                    continue;
                };
                let i = find(c)?;
                match (rows.field(i).data_type(), unit) {
                    (DataType::Timestamp(ArrowUnit::Microsecond, Some(_)), _) => {}
                    (DataType::Date32, TimeUnit::Hour) => {
                        return Err(PartitionError(format!(
                            "{b}: `{c}` is a DATE column: DAY, MONTH or YEAR"
                        )))
                    }
                    (DataType::Date32, _) => {}
                    (ty, _) => {
                        return Err(PartitionError(format!(
                "{b}: `{c}` has Arrow type {ty}: time partitioning takes a TIMESTAMP or DATE column"
                )))
                    }
                }
                sources.push(Some(i));
            }
        }
    }
    Ok(sources)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_parse_and_print() {
        for (s, want) in [
            ("region", PartitionBy::Column("region".into())),
            (
                "DAY(ts)",
                PartitionBy::Time {
                    column: Some("ts".into()),
                    unit: TimeUnit::Day,
                },
            ),
            (
                "hour(_PARTITIONTIME)",
                PartitionBy::Time {
                    column: None,
                    unit: TimeUnit::Hour,
                },
            ),
        ] {
            assert_eq!(PartitionBy::parse(s).unwrap(), want, "{s}");
        }
        assert_eq!(
            PartitionBy::parse("hour(_PARTITIONTIME)")
                .unwrap()
                .to_string(),
            "HOUR(_PARTITIONTIME)"
        );
        for bad in ["WEEK(ts)", "DAY(ts", "DAY()", "", "a=b"] {
            assert!(PartitionBy::parse(bad).is_err(), "{bad}");
        }
        let tp = serde_json::json!({"type": "MONTH", "field": "ts"});
        assert_eq!(
            PartitionBy::from_time_partitioning(&tp)
                .unwrap()
                .to_string(),
            "MONTH(ts)"
        );
        let tp = serde_json::json!({"type": "DAY"});
        assert_eq!(
            PartitionBy::from_time_partitioning(&tp)
                .unwrap()
                .to_string(),
            "DAY(_PARTITIONTIME)"
        );
    }
}
