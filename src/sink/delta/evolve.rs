//! A Delta table's columns set against what a writer writes, while it runs (docs/destinations.md,
//! "Schema changes while running"): the same columns, new NULLABLE columns the writer can take up
//! (a file without a nullable column still fits the table: readers fill it with NULL), or a
//! change that makes the writer's files no longer fit — a column removed or retyped, a new
//! REQUIRED column, a nullable column made REQUIRED — Pub/Sub's `SCHEMA_MISMATCH`.
//!
//! Also the way back from Delta to BigQuery: a Delta column's JSON form as BigQuery's JSON schema
//! field, so a new column is mapped as a column of the table schema at startup would be.
//!
//! The fit itself is one type for every table: [`Fit`] (`table/evolve.rs`).

use deltalake_core::kernel::{StructField, StructType};
use serde_json::{json, Value};

use crate::table::evolve::Fit;
use crate::table::schema::{TableField, TableSchema};

/// One way a table's columns differ from the columns a writer writes, by name
/// ([`column_diffs`]). The comparison [`fit`] makes while running and
/// [`super::existing::check`] at startup; each words it for its moment.
#[derive(Debug, Clone, Copy)]
pub enum ColumnDiff<'a> {
    /// A written column the table lacks.
    Missing(&'a StructField),
    /// A column of another type in the table: the table's, the written.
    Retyped(&'a StructField, &'a StructField),
    /// A column REQUIRED (NOT NULL) in the table that the writer writes NULLABLE.
    Required(&'a StructField),
    /// A column of the table the writer does not write (NULLABLE: it can take it up).
    Unwritten(&'a StructField),
}

/// Every difference between `writes` and `table`: the written columns' in their order, then the
/// table's columns the writer does not write, in the table's order.
pub fn column_diffs<'a>(writes: &'a StructType, table: &'a StructType) -> Vec<ColumnDiff<'a>> {
    let mut out = Vec::new();
    for w in writes.fields() {
        match table.field(w.name()) {
            None => out.push(ColumnDiff::Missing(w)),
            Some(t) if t.data_type() != w.data_type() => out.push(ColumnDiff::Retyped(t, w)),
            Some(t) if !t.is_nullable() && w.is_nullable() => out.push(ColumnDiff::Required(w)),
            Some(_) => {}
        }
    }
    out.extend(
        table
            .fields()
            .filter(|t| writes.field(t.name()).is_none())
            .map(ColumnDiff::Unwritten),
    );
    out
}

/// Compare the columns a writer writes (`writes`) with the table's (`table`), by name.
pub fn fit(writes: &StructType, table: &StructType) -> Fit<StructField> {
    let mut added = Vec::new();
    for diff in column_diffs(writes, table) {
        let why = match diff {
            ColumnDiff::Missing(w) => format!(
                "column `{}` is not in the table any more (removed or renamed); subsink writes it as {}",
                w.name(),
                type_name(w)
            ),
            ColumnDiff::Retyped(t, w) => format!(
                "column `{}` is {} in the table, subsink writes {} (retyped)",
                w.name(),
                type_name(t),
                type_name(w)
            ),
            ColumnDiff::Required(w) => format!(
                "column `{}` is REQUIRED (NOT NULL) in the table, subsink may write NULL there",
                w.name()
            ),
            ColumnDiff::Unwritten(t) if t.is_nullable() => {
                added.push(t.clone());
                continue;
            }
            ColumnDiff::Unwritten(t) => format!(
                "column `{}` ({}) was added as REQUIRED (NOT NULL); subsink takes up new NULLABLE columns only",
                t.name(),
                type_name(t)
            ),
        };
        return Fit::Mismatch(why);
    }
    if added.is_empty() {
        Fit::Same
    } else {
        Fit::Added(added)
    }
}

/// A column's Delta type as its JSON form (`long`, `{"type":"struct",…}`).
pub(super) fn type_name(f: &StructField) -> String {
    match serde_json::to_value(f.data_type()) {
        Ok(Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => format!("{:?}", f.data_type()),
    }
}

/// Delta columns as BigQuery table fields (the mapping of a table's own schema at startup,
/// docs/contract.md §4.1).
pub fn table_fields(fields: &[StructField]) -> Result<Vec<TableField>, String> {
    let delta = json!({
        "type": "struct",
        "fields": fields
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?,
    });
    let bq = bigquery_fields(&delta)?;
    Ok(TableSchema::from_json(&bq.to_string())
        .map_err(|e| e.to_string())?
        .fields)
}

/// A Delta schema (its JSON form: `{"type": "struct", "fields": [...]}`) as BigQuery's JSON
/// schema fields.
pub fn bigquery_fields(delta: &Value) -> Result<Value, String> {
    let fields = delta["fields"]
        .as_array()
        .ok_or_else(|| format!("not a struct: {delta}"))?;
    fields
        .iter()
        .map(bigquery_field)
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

fn bigquery_field(f: &Value) -> Result<Value, String> {
    let name = f["name"]
        .as_str()
        .ok_or_else(|| format!("a field without a name: {f}"))?;
    let nullable = f["nullable"].as_bool().unwrap_or(true);
    let (ty, mode, sub) = match &f["type"] {
        Value::Object(o) if o.get("type") == Some(&json!("array")) => {
            let element = o.get("elementType").cloned().unwrap_or(Value::Null);
            let (ty, sub) = value_type(&element).map_err(|e| format!("{name}: {e}"))?;
            (ty, "REPEATED", sub)
        }
        t => {
            let (ty, sub) = value_type(t).map_err(|e| format!("{name}: {e}"))?;
            (ty, if nullable { "NULLABLE" } else { "REQUIRED" }, sub)
        }
    };
    let mut out = json!({"name": name, "type": ty, "mode": mode});
    if let Some(sub) = sub {
        out["fields"] = sub;
    }
    Ok(out)
}

/// The BigQuery type of a Delta value type, and the sub-fields of a struct.
fn value_type(t: &Value) -> Result<(&'static str, Option<Value>), String> {
    if let Value::Object(o) = t {
        if o.get("type") == Some(&json!("struct")) {
            return Ok(("RECORD", Some(bigquery_fields(t)?)));
        }
        return Err(format!("type {t} has no BigQuery column type"));
    }
    let name = t.as_str().unwrap_or_default();
    Ok((
        match name {
            "string" => "STRING",
            "binary" => "BYTES",
            "long" | "integer" | "short" | "byte" => "INT64",
            "double" | "float" => "FLOAT64",
            "boolean" => "BOOL",
            "date" => "DATE",
            "timestamp" => "TIMESTAMP",
            "timestamp_ntz" => "DATETIME",
            "decimal(38,9)" => "NUMERIC",
            other => return Err(format!("type {other:?} has no BigQuery column type")),
        },
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake_core::kernel::{DataType, PrimitiveType};

    fn col(name: &str, ty: PrimitiveType, nullable: bool) -> StructField {
        StructField::new(name, DataType::Primitive(ty), nullable)
    }

    fn st(fields: Vec<StructField>) -> StructType {
        StructType::try_new(fields).unwrap()
    }

    #[test]
    fn added_nullable_columns_fit_anything_else_is_a_mismatch_naming_the_column() {
        let writes = st(vec![
            col("id", PrimitiveType::Long, false),
            col("name", PrimitiveType::String, true),
        ]);
        assert_eq!(fit(&writes, &writes), Fit::Same);
        let extra = col("extra", PrimitiveType::String, true);
        let mut t = writes.fields().cloned().collect::<Vec<_>>();
        t.push(extra.clone());
        assert_eq!(fit(&writes, &st(t)), Fit::Added(vec![extra]));
        // Removed.
        let Fit::Mismatch(why) = fit(&writes, &st(vec![col("id", PrimitiveType::Long, false)]))
        else {
            panic!()
        };
        assert!(why.contains("`name` is not in the table"), "{why}");
        // Retyped.
        let Fit::Mismatch(why) = fit(
            &writes,
            &st(vec![
                col("id", PrimitiveType::Long, false),
                col("name", PrimitiveType::Long, true),
            ]),
        ) else {
            panic!()
        };
        assert_eq!(
            why,
            "column `name` is long in the table, subsink writes string (retyped)"
        );
        // A new REQUIRED column; a column made REQUIRED.
        let mut t = writes.fields().cloned().collect::<Vec<_>>();
        t.push(col("must", PrimitiveType::Integer, false));
        assert!(matches!(fit(&writes, &st(t)), Fit::Mismatch(w) if w.contains("`must`")));
        let Fit::Mismatch(why) = fit(
            &writes,
            &st(vec![
                col("id", PrimitiveType::Long, false),
                col("name", PrimitiveType::String, false),
            ]),
        ) else {
            panic!()
        };
        assert!(why.contains("`name` is REQUIRED"), "{why}");
        // A REQUIRED column written may become NULLABLE in the table.
        let relaxed = st(vec![
            col("id", PrimitiveType::Long, true),
            col("name", PrimitiveType::String, true),
        ]);
        assert_eq!(fit(&writes, &relaxed), Fit::Same);
    }

    #[test]
    fn new_columns_map_to_bigquery_fields() {
        let fields = table_fields(&[
            col("extra", PrimitiveType::String, true),
            col("n", PrimitiveType::Long, true),
        ])
        .unwrap();
        let got: Vec<String> = fields
            .iter()
            .map(|f| format!("{} {} {:?}", f.name, f.ty.name(), f.mode))
            .collect();
        assert_eq!(got, ["extra STRING Nullable", "n INT64 Nullable"]);
    }

    #[test]
    fn delta_types_map_back_to_bigquery_columns() {
        let delta = json!({"type": "struct", "fields": [
            {"name": "id", "type": "long", "nullable": false, "metadata": {}},
            {"name": "name", "type": "string", "nullable": true, "metadata": {}},
            {"name": "amount", "type": "decimal(38,9)", "nullable": true, "metadata": {}},
            {"name": "at", "type": "timestamp", "nullable": true, "metadata": {}},
            {"name": "local", "type": "timestamp_ntz", "nullable": true, "metadata": {}},
            {"name": "tags", "type": {"type": "array", "elementType": "string", "containsNull": false}, "nullable": false, "metadata": {}},
            {"name": "user", "type": {"type": "struct", "fields": [
                {"name": "uid", "type": "long", "nullable": true, "metadata": {}}]}, "nullable": true, "metadata": {}},
        ]});
        let bq = bigquery_fields(&delta).unwrap();
        let schema = TableSchema::from_json(&bq.to_string()).unwrap();
        let got: Vec<String> = schema
            .fields
            .iter()
            .map(|f| format!("{} {} {:?}", f.name, f.ty.name(), f.mode))
            .collect();
        assert_eq!(
            got,
            [
                "id INT64 Required",
                "name STRING Nullable",
                "amount NUMERIC Nullable",
                "at TIMESTAMP Nullable",
                "local DATETIME Nullable",
                "tags STRING Repeated",
                "user RECORD Nullable",
            ]
        );
        assert!(
            bigquery_fields(&json!({"fields": [{"name": "m", "type": {"type": "map"}}]})).is_err()
        );
    }
}
