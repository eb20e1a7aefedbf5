//! A Delta table read as a reader sees it, without changing it: its newest version, the data
//! files that version holds and its schema (`subsink inspect`, `serve`'s table schema).

use super::error::DeltaError;
use super::table::log_store;
use crate::upload::Destination;

/// A table's newest version as a reader sees it (`subsink inspect`).
#[derive(Debug, Clone)]
pub struct TableFiles {
    pub version: i64,
    /// Data files of the version, relative to the table root, in log order.
    pub files: Vec<String>,
    /// The table's schema in Delta's JSON form.
    pub schema: serde_json::Value,
}

/// Read the Delta table at the root of `dest` without changing it: its newest version, the data
/// files that version holds and its schema.
pub async fn read_table_files(dest: &Destination) -> Result<TableFiles, DeltaError> {
    let delta_err = |source| DeltaError::Delta {
        url: dest.url.clone(),
        source,
    };
    let mut table = deltalake_core::DeltaTable::new(log_store(dest));
    table.load().await.map_err(delta_err)?;
    let version = table.version().map(|v| v as i64).unwrap_or(-1);
    let snapshot = table.snapshot().map_err(delta_err)?;
    let files = snapshot
        .log_data()
        .into_iter()
        .map(|f| f.object_store_path().to_string())
        .collect();
    let schema = serde_json::to_value(snapshot.schema().as_ref()).unwrap_or_default();
    Ok(TableFiles {
        version,
        files,
        schema,
    })
}
