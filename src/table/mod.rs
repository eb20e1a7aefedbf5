//! The table writer's mapping core: messages → Arrow record batches with Pub/Sub BigQuery
//! subscription semantics (docs/contract.md §4), independent of where the rows go (a Delta table,
//! `sink/delta/`, or BigQuery's Storage Write API, `sink/bigquery/`). Nothing here imports deltalake.
//!
//! | file | what it does |
//! |---|---|
//! | [`schema`] | BigQuery's JSON table schema (every type alias, modes, nested RECORDs) and its Arrow form |
//! | [`convert`] | JSON value → column value, exactly per docs/contract.md §4.3, with its integer (§4.3.1) and byte (§4.3.2) encodings |
//! | [`batch`] | [`RowBuilder`]: one row per message in each mode, metadata columns (§4.5), unknown fields (§4.6) |
//! | `metadata` | the metadata columns' names and the §4.5 name check, shared by `batch` and `topic` |
//! | `error` | [`RowError`] and its kind: why a message cannot become a row |
//! | [`topic`] | use_topic_schema: the topic schema checked against the table (§4.4, a diff of every problem), Avro datums (JSON or BINARY) → cells |
//! | [`cdc`] | change data capture: the primary key, the `_CHANGE_TYPE` / `_CHANGE_SEQUENCE_NUMBER` pseudo-columns and their per-row rules |
//! | [`partition`] | a table's partitioning as configured: by value or by time, the derived `_PARTITIONDATE` / `_PARTITIONTIME` |
//! | [`evolve`] | a table's columns while running against what a writer writes ([`evolve::Fit`]): the same, new NULLABLE columns, or SCHEMA_MISMATCH |
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
pub mod convert;
mod error;
pub mod evolve;
mod fast;
mod metadata;
pub mod parquet;
pub mod partition;
pub mod schema;
pub mod topic;

#[cfg(test)]
mod tests;

pub use self::parquet::{default_writer_properties, write_parquet, ParquetFile, ParquetStream};
pub use batch::{columns_added, RowBuilder, RowOptions, SchemaMode};
pub use error::{RowError, RowErrorKind};
pub use metadata::{check_metadata_name_conflicts, METADATA_NAMES};
pub use schema::{FieldMode, FieldType, InvalidTableSchema, TableField, TableSchema};
pub use topic::{check_compatibility, CompatError, CompatRule, Incompatibility, TopicPlan};
