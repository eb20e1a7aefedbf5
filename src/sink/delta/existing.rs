//! An existing Delta table set against what subsink would write to it, once, at startup
//! ([`crate::sink::delta::DeltaTable::open_or_create_partitioned`]): its partition columns first,
//! then its columns. What does not fit is refused with one line naming the partitioning or the
//! column and the difference — the table's side, then subsink's — never a dump of both schemas.
//! The run exits 2 on it, as on a bad flag (`command/run.rs`): the table, not the messages, must
//! change. While running, the same comparison of columns is [`super::evolve::fit`]'s.

use deltalake_core::kernel::StructType;

use super::evolve::{column_diffs, type_name, ColumnDiff};
use crate::table::cdc::CHANGE_SEQUENCE_NUMBER;

/// Why an existing table does not take what subsink would write: one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misfit {
    /// Its partition columns differ.
    Partitions(String),
    /// A column differs (the first; how many more).
    Columns(String),
}

/// What subsink would write to the table: its columns, and the partition columns a configured
/// partitioning makes (empty: none configured; an existing table's own are then used).
pub struct Writes<'a> {
    pub columns: &'a StructType,
    pub partition_columns: &'a [String],
    /// The configured partitioning as given (`DAY(_PARTITIONTIME)`, `region`), for the message.
    pub partition_by: &'a str,
}

/// Does the existing table (`columns`, `partition_columns`) take what `writes` would write?
pub fn check(
    columns: &StructType,
    partition_columns: &[String],
    writes: &Writes<'_>,
) -> Result<(), Misfit> {
    let partitions = Misfit::Partitions;
    if !writes.partition_columns.is_empty() && writes.partition_columns != partition_columns {
        return Err(partitions(format!(
            "the table is partitioned by {}, the configured partitioning ({}) makes {}; a table keeps the partitioning it was created with: write to a new table, or give no partitioning to write with the table's",
            list(partition_columns),
            writes.partition_by,
            list(writes.partition_columns),
        )));
    }
    // A derived partition column (a time partitioning's) the configuration does not make.
    let derived: Vec<String> = partition_columns
        .iter()
        .filter(|c| writes.columns.field(c.as_str()).is_none())
        .cloned()
        .collect();
    if !derived.is_empty() {
        return Err(partitions(format!(
            "the table is partitioned by {}, and subsink would write no {} column: a time partitioning's derived column; give it with --table-partition-by (e.g. DAY(column)) or the table resource's timePartitioning",
            list(partition_columns),
            derived.join(", ")
        )));
    }
    let diffs = differences(columns, writes.columns);
    match diffs.split_first() {
        None => Ok(()),
        Some((first, rest)) => {
            let more = match rest.len() {
                0 => String::new(),
                1 => "; and 1 more difference".to_string(),
                n => format!("; and {n} more differences"),
            };
            Err(Misfit::Columns(format!("{first}{more}")))
        }
    }
}

/// `[a, b]`, or `[] (unpartitioned)`.
fn list(columns: &[String]) -> String {
    if columns.is_empty() {
        "[] (unpartitioned)".to_string()
    } else {
        format!("[{}]", columns.join(", "))
    }
}

/// Every column that does not fit, in the written columns' order, then the table's: the table's
/// side first, subsink's second. New NULLABLE columns of the table fit (they are written).
fn differences(table: &StructType, writes: &StructType) -> Vec<String> {
    column_diffs(writes, table)
        .into_iter()
        .filter_map(|diff| match diff {
            ColumnDiff::Missing(w) => {
                let name = w.name();
                let why = if name == CHANGE_SEQUENCE_NUMBER {
                    ": change data capture keeps each row's sequence number there, which a table made without a primary key lacks; write the changes to a new table"
                } else {
                    ""
                };
                Some(format!(
                    "column `{name}` is not in the table, subsink would write it as {}{why}",
                    type_name(w)
                ))
            }
            ColumnDiff::Retyped(t, w) => Some(format!(
                "column `{}` is {} in the table, subsink would write {}",
                w.name(),
                type_name(t),
                type_name(w)
            )),
            ColumnDiff::Required(w) => Some(format!(
                "column `{}` is REQUIRED (NOT NULL) in the table, subsink would write it NULLABLE (it may write NULL there)",
                w.name()
            )),
            ColumnDiff::Unwritten(t) if t.is_nullable() => None,
            ColumnDiff::Unwritten(t) => Some(format!(
                "column `{}` is REQUIRED (NOT NULL) {} in the table, subsink would not write it",
                t.name(),
                type_name(t)
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake_core::kernel::{DataType, StructField};

    fn columns(fields: &[(&str, DataType, bool)]) -> StructType {
        StructType::try_new(
            fields
                .iter()
                .map(|(n, t, null)| StructField::new(*n, t.clone(), *null)),
        )
        .unwrap()
    }

    fn writes<'a>(columns: &'a StructType, parts: &'a [String], by: &'a str) -> Writes<'a> {
        Writes {
            columns,
            partition_columns: parts,
            partition_by: by,
        }
    }

    #[test]
    fn each_difference_is_named_table_side_first() {
        let table = columns(&[
            ("id", DataType::LONG, false),
            ("name", DataType::STRING, true),
            ("extra", DataType::STRING, true),
        ]);
        let same = columns(&[
            ("id", DataType::LONG, false),
            ("name", DataType::STRING, true),
        ]);
        assert!(check(&table, &[], &writes(&same, &[], "")).is_ok());

        let retyped = columns(&[("id", DataType::STRING, false)]);
        let e = check(&table, &[], &writes(&retyped, &[], "")).unwrap_err();
        assert_eq!(
            e,
            Misfit::Columns("column `id` is long in the table, subsink would write string".into())
        );

        let cdc = columns(&[
            ("id", DataType::LONG, true),
            (CHANGE_SEQUENCE_NUMBER, DataType::STRING, true),
        ]);
        let e = check(&table, &[], &writes(&cdc, &[], "")).unwrap_err();
        assert_eq!(
            e,
            Misfit::Columns("column `id` is REQUIRED (NOT NULL) in the table, subsink would write it NULLABLE (it may write NULL there); and 1 more difference".into())
        );
    }

    #[test]
    fn partitions_are_checked_before_columns() {
        let table = columns(&[("id", DataType::LONG, true)]);
        let with_day = columns(&[
            ("id", DataType::LONG, true),
            ("_PARTITIONDATE", DataType::DATE, true),
        ]);
        let day = ["_PARTITIONDATE".to_string()];
        let e = check(&table, &[], &writes(&with_day, &day, "DAY(_PARTITIONTIME)")).unwrap_err();
        assert_eq!(
            e,
            Misfit::Partitions("the table is partitioned by [] (unpartitioned), the configured partitioning (DAY(_PARTITIONTIME)) makes [_PARTITIONDATE]; a table keeps the partitioning it was created with: write to a new table, or give no partitioning to write with the table's".into())
        );
        let e = check(&with_day, &day, &writes(&table, &[], "")).unwrap_err();
        assert!(
            matches!(&e, Misfit::Partitions(why) if why.contains(
                "partitioned by [_PARTITIONDATE], and subsink would write no _PARTITIONDATE column"
            )),
            "{e:?}"
        );
    }
}
