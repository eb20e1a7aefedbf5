//! A Parquet file to commit to a Delta table ([`DataFile`]) and its fresh name.

use std::collections::HashMap;

use crate::table::ParquetFile;

/// A Parquet file to commit: its path relative to the table root, and the file itself.
#[derive(Debug, Clone)]
pub struct DataFile {
    pub path: String,
    pub file: ParquetFile,
    /// A partitioned table's partition values of the file (Delta's serialization, NULL as
    /// `None`; [`super::partition`]); empty for an unpartitioned table.
    pub partition_values: HashMap<String, Option<String>>,
}

impl DataFile {
    /// A data file with a fresh unique name at the table root
    /// (`part-00000-<uuid>-c000.zstd.parquet`, Spark's naming).
    pub fn new(file: ParquetFile) -> DataFile {
        DataFile {
            path: new_data_file_name(),
            file,
            partition_values: HashMap::new(),
        }
    }
}

/// A fresh, unique data file name at the table root.
pub fn new_data_file_name() -> String {
    format!("part-00000-{}-c000.zstd.parquet", uuid::Uuid::new_v4())
}
