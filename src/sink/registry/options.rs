//! How a subscription's sink is written, whatever the subscription: the flags `run` and `serve`
//! share ([`WriterOptions`]), a BigQuery destination's endpoints, and a table schema with where it
//! came from.

use crate::encode::avro::Codec;
use crate::encode::topic::{SchemaEncoding, TopicSchemaSource};
use crate::sink::PositionedSource;
use crate::table::TableSchema;
use crate::upload::UploadSettings;

/// How files are written, whatever the subscription: the flags `run` and `serve` share.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    pub avro_codec: Codec,
    /// Uncompressed bytes at which an Avro block is closed.
    pub avro_block_size: usize,
    /// The topic's Avro schema and its revisions (`useTopicSchema`).
    pub topic_schema: Option<TopicSchemaSource>,
    /// Encoding of messages without a `googclient_schemaencoding` attribute.
    pub schema_encoding: SchemaEncoding,
    /// Multipart threshold, part size, and how long failing uploads are retried.
    pub upload: UploadSettings,
    /// `zstd`, `zstd(N)`, `snappy`, `gzip`, `gzip(N)`, `uncompressed`.
    pub parquet_compression: String,
    /// Where a BigQuery table is reached, and how rows are written to it.
    pub bigquery: BigQueryOptions,
    /// `--table-partition-by`: a Delta table's partitioning, over the table resource's
    /// `timePartitioning` (docs/destinations.md, "Partitioned tables").
    pub partition_by: Vec<String>,
    /// `--table-schema-refresh`: how often a running table sink (Delta or BigQuery) reads its
    /// table's schema again (docs/destinations.md, "Schema changes while running").
    pub schema_refresh: std::time::Duration,
    /// `--table-delete-retention`: how long a Delta table's tombstones keep older changes out
    /// (docs/destinations.md, "Change data capture").
    pub delete_retention: std::time::Duration,
}

/// A BigQuery destination's endpoints and write mode (docs/contract.md §4.8).
#[derive(Debug, Clone, Default)]
pub struct BigQueryOptions {
    /// REST endpoint for `tables.get` (`None`: Google's).
    pub rest: Option<String>,
    /// Storage Write API (gRPC) endpoint (`None`: Google's).
    pub storage: Option<String>,
    /// PENDING streams with offsets, committed per batch, instead of the default stream.
    pub exactly_once: bool,
    /// The source that writes a Delta table exactly once, as the refusal names it.
    pub positioned: PositionedSource,
}

/// A table schema and where it came from (named in errors).
#[derive(Debug, Clone)]
pub struct NamedSchema {
    pub schema: TableSchema,
    /// e.g. `--table-schema events.json`, `the table s3://lake/events`.
    pub origin: String,
    /// Read from the destination table itself (`tables.get`, a Delta log), not from a file.
    pub from_table: bool,
}
