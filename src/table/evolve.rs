//! A table's columns set against what a writer writes, while it runs (docs/destinations.md,
//! "Schema changes while running"): the same columns, new NULLABLE columns the writer can take up
//! (a file or request without a nullable column still fits the table: readers fill it with NULL),
//! or a change that makes what is written no longer fit — a column removed or retyped, a new
//! REQUIRED column, a nullable column made REQUIRED — Pub/Sub's `SCHEMA_MISMATCH`. One [`Fit`]
//! for every table: [`fit_fields`] compares BigQuery columns; a Delta table's columns are
//! compared in `sink/delta/evolve.rs`.

use super::schema::{FieldMode, FieldType, TableField};

/// How a table's columns (of type `C`: a BigQuery [`TableField`], a Delta column) relate to the
/// columns a writer writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Fit<C> {
    /// Every written column is in the table with its type and a mode that takes what is
    /// written; no new column.
    Same,
    /// As [`Fit::Same`], and the table has these new NULLABLE columns (in its order).
    Added(Vec<C>),
    /// What is written no longer fits the table: why, naming the column.
    Mismatch(String),
}

/// a Delta table's are compared: a written column gone or retyped (a RECORD's sub-fields included), or
/// a NULLABLE column made REQUIRED, or a new REQUIRED column, is a mismatch; a REQUIRED column
/// relaxed to NULLABLE still fits. A RECORD's new NULLABLE sub-fields fit and are not written
/// (BigQuery fills them with NULL).
pub fn fit_fields(writes: &[TableField], table: &[TableField]) -> Fit<TableField> {
    if let Err(why) = written_fit(writes, table, "") {
        return Fit::Mismatch(why);
    }
    let mut added = Vec::new();
    for t in table {
        if writes.iter().any(|w| w.name == t.name) {
            continue;
        }
        if t.mode == FieldMode::Required {
            return Fit::Mismatch(format!(
                "column `{}` ({}) was added as REQUIRED; subsink takes up new NULLABLE columns only",
                t.name,
                t.ty.name()
            ));
        }
        added.push(t.clone());
    }
    if added.is_empty() {
        Fit::Same
    } else {
        Fit::Added(added)
    }
}

/// Every written field (under `path`) still in `table` with its type and a mode that takes it.
fn written_fit(writes: &[TableField], table: &[TableField], path: &str) -> Result<(), String> {
    for w in writes {
        let name = format!("{path}{}", w.name);
        let Some(t) = table.iter().find(|t| t.name == w.name) else {
            return Err(format!(
                "column `{name}` is not in the table any more (removed or renamed); subsink writes it as {}",
                w.ty.name()
            ));
        };
        let repeated = |f: &TableField| f.mode == FieldMode::Repeated;
        let retyped = match (&w.ty, &t.ty) {
            (FieldType::Record(ws), FieldType::Record(ts)) => {
                written_fit(ws, ts, &format!("{name}."))?;
                false
            }
            (a, b) => a != b,
        };
        if retyped || repeated(w) != repeated(t) {
            let mode = |f: &TableField| if repeated(f) { " REPEATED" } else { "" };
            return Err(format!(
                "column `{name}` is {}{} in the table, subsink writes {}{} (retyped)",
                t.ty.name(),
                mode(t),
                w.ty.name(),
                mode(w)
            ));
        }
        if t.mode == FieldMode::Required && w.mode == FieldMode::Nullable {
            return Err(format!(
                "column `{name}` is REQUIRED in the table, subsink may write NULL there"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bigquery_columns_added_nullable_fit_anything_else_is_a_mismatch_naming_the_column() {
        use crate::table::schema::{FieldMode as M, FieldType as T, TableField as F};
        let rec = |fields: Vec<F>| F::new("r", T::Record(fields), M::Nullable);
        let writes = vec![
            F::new("id", T::String, M::Required),
            F::new("n", T::Int64, M::Nullable),
            rec(vec![F::new("a", T::Bool, M::Nullable)]),
        ];
        assert_eq!(fit_fields(&writes, &writes), Fit::Same);
        // Relaxed to NULLABLE; a RECORD's new nullable sub-field: still fits, nothing to take up.
        let mut relaxed = writes.clone();
        relaxed[0].mode = M::Nullable;
        relaxed[2] = rec(vec![
            F::new("a", T::Bool, M::Nullable),
            F::new("b", T::Date, M::Nullable),
        ]);
        assert_eq!(fit_fields(&writes, &relaxed), Fit::Same);
        let mut added = writes.clone();
        added.push(F::new("extra", T::String, M::Nullable));
        assert_eq!(
            fit_fields(&writes, &added),
            Fit::Added(vec![F::new("extra", T::String, M::Nullable)])
        );
        let mismatch = |table: Vec<F>| match fit_fields(&writes, &table) {
            Fit::Mismatch(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(mismatch(writes[1..].to_vec()).starts_with("column `id` is not in the table"));
        let mut retyped = writes.clone();
        retyped[1].ty = T::String;
        assert_eq!(
            mismatch(retyped),
            "column `n` is STRING in the table, subsink writes INT64 (retyped)"
        );
        let mut nested = writes.clone();
        nested[2] = rec(vec![F::new("a", T::Int64, M::Nullable)]);
        assert!(mismatch(nested).starts_with("column `r.a` is INT64 in the table"));
        let mut repeated = writes.clone();
        repeated[1].mode = M::Repeated;
        assert!(mismatch(repeated).contains("INT64 REPEATED in the table, subsink writes INT64"));
        let mut required = writes.clone();
        required[1].mode = M::Required;
        assert!(mismatch(required).contains("`n` is REQUIRED in the table"));
        let mut new_required = writes.clone();
        new_required.push(F::new("must", T::Int64, M::Required));
        assert!(mismatch(new_required).contains("`must` (INT64) was added as REQUIRED"));
    }
}
