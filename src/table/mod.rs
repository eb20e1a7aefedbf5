//! The table writer's mapping core: messages → Arrow record batches with Pub/Sub BigQuery
//! subscription semantics (docs/contract.md §4), independent of where the rows go (Parquet/Delta, or later
//! BigQuery's Storage Write API).
//!
//! | file | what it does |
//! |---|---|
//! | [`schema`] | BigQuery's JSON table schema (every type alias, modes, nested RECORDs) and its Arrow form |
//! | [`convert`] | JSON value → column value, exactly per docs/contract.md §4.3, with its integer (§4.3.1) and byte (§4.3.2) encodings |
//! | [`batch`] | [`RowBuilder`]: one row per message in each mode, metadata columns (§4.5), unknown fields (§4.6) |
//! | `metadata` | the metadata columns' names and the §4.5 name check, shared by `batch` and `topic` |
//! | `error` | [`RowError`] and its kind: why a message cannot become a row |
//! | [`topic`] | use_topic_schema: the topic schema checked against the table (§4.4, a diff of every problem), Avro datums (JSON or BINARY) → cells |
//! | [`encoder`] | [`ParquetEncoder`]: a Parquet file encoded on its own thread while its rows are converted |
//! | [`cdc`] | change data capture: the primary key, the `_CHANGE_TYPE` / `_CHANGE_SEQUENCE_NUMBER` pseudo-columns and their per-row rules |
//! | [`compact`] | compaction while writers append: deltalake's OPTIMIZE on the table's quiet part, one compaction at a time (a lease), `subsink compact` and `run --compact-after` |
//! | [`vacuum`] | deltalake's VACUUM: files the log removed longer ago than the retention (the table's unless forced) deleted, `subsink vacuum` |
//! | [`merge`] | change data capture into a Delta table: the last change per key, tombstones, one MERGE per commit |
//! | [`partition`] | partitioned Delta tables: the partition columns (by value or by time, the derived `_PARTITIONDATE` / `_PARTITIONTIME`), rows split by partition, Delta's value serialization and escaping |
//! | `existing` | an existing table against what subsink would write, at startup: its partitioning, then its columns, one line naming the difference (exit 2) |
//! | [`evolve`] | a table's schema while running against what a writer writes: the same, new NULLABLE columns, or SCHEMA_MISMATCH; Delta columns back to BigQuery fields |
//! | `columns` | typed Arrow column builders that a failed message is truncated out of |
//! | `fast` | the fast path of JSON payloads: parsed straight into the builders, the reference path decides every doubt |
//!
//! Arrow types: NUMERIC `Decimal128(38, 9)`, BIGNUMERIC `Decimal256(76, 38)`, DATE `Date32`, TIME
//! `Time64(µs)`, DATETIME `Timestamp(µs)`, TIMESTAMP `Timestamp(µs, "UTC")`, JSON `Utf8` with
//! `ARROW:extension:name = arrow.json`, RECORD `Struct`, REPEATED a non-nullable `List` of
//! non-nullable `element`s, BYTES `Binary`, INT64 `Int64`, FLOAT64 `Float64`, BOOL `Boolean`,
//! STRING `Utf8`. GEOGRAPHY, INTERVAL and RANGE columns are rejected when the schema is loaded.

pub mod batch;
pub mod cdc;
mod columns;
pub mod compact;
pub mod convert;
pub mod delta;
pub mod encoder;
mod error;
pub mod evolve;
mod existing;
mod fast;
pub mod files;
pub mod merge;
mod metadata;
pub mod parquet;
pub mod partition;
pub mod schema;
pub mod stats;
pub mod topic;
pub mod vacuum;

#[cfg(test)]
mod tests;

pub use self::parquet::{default_writer_properties, write_parquet, ParquetFile, ParquetStream};
pub use batch::{columns_added, RowBuilder, RowOptions, SchemaMode};
pub use delta::{
    delta_arrow_schema, new_data_file_name, to_delta_batch, DataFile, DeltaError, DeltaTable,
};
pub use encoder::{ParquetEncodeError, ParquetEncoder};
pub use error::{RowError, RowErrorKind};
pub use metadata::{check_metadata_name_conflicts, METADATA_NAMES};
pub use schema::{FieldMode, FieldType, InvalidTableSchema, TableField, TableSchema};
pub use topic::{check_compatibility, CompatError, CompatRule, Incompatibility, TopicPlan};
