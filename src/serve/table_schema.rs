//! A discovered table subscription's schema: the destination table's own columns when the table
//! exists, else `--table-schemas DIR/PROJECT.DATASET.TABLE.json`, else none (the `data` column).
//!
//! A Delta table's schema maps back to BigQuery's types one to one except for the types Delta
//! stores as text (docs/contract.md §4.1): a `string` column reads as STRING, although subsink
//! writes JSON, TIME and BIGNUMERIC columns as `string` too. When a schema file is there as well
//! and its Delta form is the table's, the file is used (it keeps those types); when the two
//! disagree the table wins, with a warning, since it is what the rows must fit.

use std::path::Path;

use crate::sink::bigquery::register::is_bigquery_url;
use crate::sink::bigquery::{BigQueryClient, BigQueryError, TableRef};
use crate::sink::registry::{BigQueryOptions, NamedSchema};
use crate::table::TableSchema;
use crate::upload::Destination;

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
    let files = crate::sink::delta::files::read_table_files(&dest)
        .await
        .map_err(|e| TableSchemaError::Unreachable(e.to_string()))?;
    let bq = crate::sink::delta::evolve::bigquery_fields(&files.schema)
        .map_err(|e| TableSchemaError::Invalid(format!("the table {url}: its schema: {e}")))?;
    let schema = TableSchema::from_json(&bq.to_string())
        .map_err(|e| TableSchemaError::Invalid(format!("the table {url}: {e}")))?;
    let table = NamedSchema {
        schema,
        origin: format!("the table {url}"),
        from_table: true,
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
        from_table: true,
    })
}

fn read_file(p: &Path) -> Result<NamedSchema, TableSchemaError> {
    let origin = format!("--table-schemas {}", p.display());
    let text = std::fs::read_to_string(p)
        .map_err(|e| TableSchemaError::Invalid(format!("{origin}: {e}")))?;
    let schema = TableSchema::from_json(&text)
        .map_err(|e| TableSchemaError::Invalid(format!("{origin}: {e}")))?;
    Ok(NamedSchema {
        schema,
        origin,
        from_table: false,
    })
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
    let delta = |s: &TableSchema| crate::sink::delta::delta_arrow_schema(&s.arrow_schema()).ok();
    match (delta(a), delta(b)) {
        (Some(x), Some(y)) => x.fields() == y.fields(),
        _ => false,
    }
}
