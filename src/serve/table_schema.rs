//! A discovered table subscription's schema: the destination table's own columns when the table
//! exists, else `--table-schemas DIR/PROJECT.DATASET.TABLE.json`, else none (the `data` column).
//!
//! A Delta table's schema maps back to BigQuery's types one to one except for the types Delta
//! stores as text (docs/contract.md §4.1): a `string` column reads as STRING, although subsink
//! writes JSON, TIME and BIGNUMERIC columns as `string` too. When a schema file is there as well
//! and its Delta form is the table's, the file is used (it keeps those types); when the two
//! disagree the table wins, with a warning, since it is what the rows must fit.

use std::path::Path;

use serde_json::{json, Value};

use crate::sink::bigquery::{BigQueryClient, BigQueryError, TableRef};
use crate::table::TableSchema;
use crate::upload::Destination;
use crate::writer::{is_bigquery_url, BigQueryOptions, NamedSchema};

/// Why a table's schema could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TableSchemaError {
    /// The table or the schema file is there but cannot be used: not retried.
    #[error("{0}")]
    Invalid(String),
    /// The store could not be read (it may pass).
    #[error("{0}")]
    Unreachable(String),
}

/// The schema of the table at `url` (when it has a Delta log; a BigQuery table's through
/// `tables.get`, as Pub/Sub reads it), else of `file` (when given). `config_table` is the
/// subscription's `bigqueryConfig.table` (for `--table-url-template bigquery`).
pub async fn table_schema_of(
    url: &str,
    file: Option<&Path>,
    config_table: &str,
    bigquery: &BigQueryOptions,
) -> Result<Option<NamedSchema>, TableSchemaError> {
    if is_bigquery_url(url) {
        return bigquery_schema(url, config_table, bigquery).await.map(Some);
    }
    let from_file = match file {
        Some(p) => Some(read_file(p)?),
        None => None,
    };
    let dest = Destination::from_url(url)
        .map_err(|e| TableSchemaError::Invalid(format!("table {url}: {e}")))?;
    if !has_log(&dest).await? {
        return Ok(from_file);
    }
    let files = crate::table::delta::read_table_files(&dest)
        .await
        .map_err(|e| TableSchemaError::Unreachable(e.to_string()))?;
    let bq = bigquery_fields(&files.schema)
        .map_err(|e| TableSchemaError::Invalid(format!("the table {url}: its schema: {e}")))?;
    let schema = TableSchema::from_json(&bq.to_string())
        .map_err(|e| TableSchemaError::Invalid(format!("the table {url}: {e}")))?;
    let table = NamedSchema {
        schema,
        origin: format!("the table {url}"),
    };
    Ok(Some(match from_file {
        Some(f) if same_delta_form(&f.schema, &table.schema) => f,
        Some(f) => {
            tracing::warn!(
                table = url,
                "{} differs from the table's own schema; the table's is used",
                f.origin
            );
            table
        }
        None => table,
    }))
}

/// A BigQuery table's own schema: the destination always has one (a BigQuery subscription needs
/// its table to exist), so no schema file is read.
async fn bigquery_schema(
    url: &str,
    config_table: &str,
    bq: &BigQueryOptions,
) -> Result<NamedSchema, TableSchemaError> {
    let t = TableRef::from_url(url, config_table).map_err(TableSchemaError::Invalid)?;
    let fail = |e: BigQueryError| {
        if e.retryable() {
            TableSchemaError::Unreachable(e.to_string())
        } else {
            TableSchemaError::Invalid(e.to_string())
        }
    };
    let client = BigQueryClient::new(bq.rest.as_deref(), bq.storage.as_deref()).map_err(fail)?;
    let schema = client.table_schema(&t).await.map_err(fail)?;
    Ok(NamedSchema {
        schema,
        origin: format!("the BigQuery table {t}"),
    })
}

fn read_file(p: &Path) -> Result<NamedSchema, TableSchemaError> {
    let origin = format!("--table-schemas {}", p.display());
    let text = std::fs::read_to_string(p)
        .map_err(|e| TableSchemaError::Invalid(format!("{origin}: {e}")))?;
    let schema = TableSchema::from_json(&text)
        .map_err(|e| TableSchemaError::Invalid(format!("{origin}: {e}")))?;
    Ok(NamedSchema { schema, origin })
}

async fn has_log(dest: &Destination) -> Result<bool, TableSchemaError> {
    use futures::StreamExt;
    let prefix = object_store::path::Path::from("_delta_log");
    match dest.store.list(Some(&prefix)).next().await {
        None => Ok(false),
        Some(Ok(_)) => Ok(true),
        Some(Err(e)) => Err(TableSchemaError::Unreachable(format!(
            "table {}: {e}",
            dest.url
        ))),
    }
}

/// Do two schemas make the same Delta columns?
fn same_delta_form(a: &TableSchema, b: &TableSchema) -> bool {
    let delta = |s: &TableSchema| crate::table::delta::delta_arrow_schema(&s.arrow_schema()).ok();
    match (delta(a), delta(b)) {
        (Some(x), Some(y)) => x.fields() == y.fields(),
        _ => false,
    }
}

/// A Delta schema (its JSON form: `{"type": "struct", "fields": [...]}`) as BigQuery's JSON
/// schema fields.
fn bigquery_fields(delta: &Value) -> Result<Value, String> {
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
        // Back to Delta: the same columns.
        let back = crate::table::delta::delta_arrow_schema(&schema.arrow_schema()).unwrap();
        assert_eq!(back.fields().len(), 7);
        assert!(
            bigquery_fields(&json!({"fields": [{"name": "m", "type": {"type": "map"}}]})).is_err()
        );
    }
}
