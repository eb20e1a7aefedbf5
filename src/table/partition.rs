//! A table's partitioning as configured (docs/destinations.md, "Partitioned tables"): by columns
//! of its own (`--table-partition-by region`: each value its own partition) or by time, as
//! BigQuery's `timePartitioning` says: a TIMESTAMP or DATE column, or the ingestion time (the
//! message's publish time), truncated to HOUR, DAY, MONTH or YEAR; the derived time columns'
//! names (`_PARTITIONDATE`, `_PARTITIONTIME`). How a Delta table's rows are split by it is
//! `sink/delta/partition.rs`.

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
