//! The writer a subscription runs: from a validated subscription and where it writes to the
//! [`SinkSpec`] of its pipeline — the storage writer's bucket and format (docs/contract.md §3), or
//! the table writer's table and row mapping (§4), checked at startup. `subsink run` (one
//! subscription, its flags) and `subsink serve` (every export subscription of a project) both
//! build their writers here.

use std::sync::Arc;

use crate::config::ValidSubscription;
use crate::encode::avro::Codec;
use crate::encode::topic::{SchemaEncoding, TopicSchemaSource};
use crate::receipt::PositionedSource;
use crate::sink::bigquery::{missing_columns, BigQueryOutput, TableRef, WriteMode};
use crate::sink::delta::partition::Partitioning;
use crate::sink::delta::DeltaSettings;
use crate::sink::object::{build_format, FormatOptions, ObjectSettings};
use crate::sink::SinkSpec;
use crate::table::cdc::{with_change_columns, PrimaryKey};
use crate::table::partition::PartitionBy;
use crate::table::{RowBuilder, RowOptions, SchemaMode, TableSchema};
use crate::upload::{Destination, UploadSettings};

/// The bucket or table URL of the discard sink: the pipeline without a store (benchmarks).
pub const DISCARD: &str = "discard://";

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

/// Is `table_url` a BigQuery table (`bigquery://PROJECT/DATASET/TABLE`, or `bigquery` alone for
/// the table `bigqueryConfig.table` names)?
pub fn is_bigquery_url(table_url: &str) -> bool {
    table_url == "bigquery" || table_url.starts_with("bigquery://")
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

/// The storage writer of `sub` into `bucket_url` (`discard://`: nothing written).
pub fn storage_writer(
    sub: &ValidSubscription,
    bucket_url: &str,
    opts: &WriterOptions,
) -> Result<SinkSpec, String> {
    if sub.storage.is_none() {
        return Err(format!(
            "subscription {} has neither a cloudStorageConfig nor a bigqueryConfig: nothing to export",
            sub.name
        ));
    }
    if bucket_url == DISCARD {
        return Ok(SinkSpec::Discard);
    }
    let dest = Destination::from_url_retrying(bucket_url, opts.upload.retry_for)
        .map_err(|e| e.to_string())?;
    let format = build_format(
        sub,
        &FormatOptions {
            codec: opts.avro_codec,
            block_size: opts.avro_block_size,
            topic_schema: opts.topic_schema.clone(),
            default_encoding: opts.schema_encoding,
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(SinkSpec::Storage(ObjectSettings {
        dest,
        format: Arc::clone(&format),
        upload: opts.upload,
        exact: None,
    }))
}

/// The table writer of `sub` into `table_url` (`discard://`: nothing written), with the table's
/// columns from `schema` (`None`: the `data` column and, with `writeMetadata`, the metadata
/// columns). `no_schema_hint` says how to give a schema when `useTableSchema` needs one.
pub fn table_writer(
    sub: &ValidSubscription,
    table_url: &str,
    schema: Option<NamedSchema>,
    no_schema_hint: &str,
    opts: &WriterOptions,
) -> Result<SinkSpec, String> {
    let bq = sub.bigquery.as_ref().ok_or_else(|| {
        format!(
            "subscription {} has no bigqueryConfig: the table writer needs one",
            sub.name
        )
    })?;
    let (mut schema, origin, from_table) = match schema {
        Some(n) => (n.schema, n.origin, n.from_table),
        None if bq.use_table_schema => {
            return Err(format!(
                "bigqueryConfig.useTableSchema: give the table's columns with {no_schema_hint}"
            ))
        }
        // No schema: no columns of its own (a schema *file* must have one); the row builder
        // adds `data` and the metadata columns.
        None => (
            TableSchema::default(),
            "(none: a data column)".to_string(),
            false,
        ),
    };
    // The table's columns as read at startup: what a BigQuery destination's schema watch compares
    // later reads with (a schema file is compared with the watch's own first read instead).
    let table_columns = from_table.then(|| schema.fields.clone());
    let mode = if bq.use_topic_schema {
        SchemaMode::UseTopicSchema
    } else if bq.use_table_schema {
        SchemaMode::UseTableSchema
    } else {
        SchemaMode::NoSchema
    };
    let row_opts = RowOptions {
        mode,
        write_metadata: bq.write_metadata,
        drop_unknown_fields: bq.drop_unknown_fields,
        subscription_name: sub.name.clone(),
    };
    let key = change_data_capture(&mut schema, &origin, &row_opts, table_url, opts)?;
    let bigquery = if is_bigquery_url(table_url) {
        let t = TableRef::from_url(table_url, &bq.table)?;
        // A BigQuery table is not extended: Pub/Sub refuses a subscription whose table lacks these.
        let missing = missing_columns(&schema, &row_opts);
        if !missing.is_empty() {
            return Err(format!(
                "BigQuery table {t}: no column {} ({}), which Pub/Sub requires of a BigQuery subscription's table; add {} to the table",
                missing.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", "),
                if row_opts.mode == SchemaMode::NoSchema && missing.contains(&"data") {
                    "no-schema mode writes the payload to `data`"
                } else {
                    "writeMetadata"
                },
                if missing.len() == 1 { "it" } else { "them" },
            ));
        }
        Some(t)
    } else if opts.bigquery.exactly_once {
        let p = opts.bigquery.positioned;
        return Err(format!("--exactly-once is for a BigQuery table (--table-url bigquery://…), or a Delta table read from {} ({})", p.name, p.flag));
    } else {
        None
    };
    // Decisions that stay but deserve a word at startup (docs/decisions.md, Table writer decisions).
    for w in sub.warnings() {
        tracing::warn!(subscription = %sub.name, "{w}");
    }
    if let Some(added) = crate::table::columns_added(&schema, &row_opts) {
        tracing::info!(subscription = %sub.name, "{added}");
    }
    let rows = if bq.use_topic_schema {
        let source = opts.topic_schema.as_ref().ok_or(
            "bigqueryConfig.useTopicSchema: give the topic's Avro schema with --topic-schema FILE.avsc",
        )?;
        let topics = source
            .load(opts.schema_encoding)
            .map_err(|e| format!("{}: {e}", source.origin()))?;
        RowBuilder::with_topic_schemas(&schema, row_opts, &topics).map_err(|e| {
            format!(
                "the topic schema ({}) does not fit the table schema {origin} (docs/contract.md §4.4):\n{e}",
                source.origin()
            )
        })?
    } else {
        RowBuilder::new(&schema, row_opts).map_err(|e| format!("{origin}: {e}"))?
    };
    let mut rows = rows;
    if let Some(key) = &key {
        rows.check_changes(key)
            .map_err(|e| format!("{origin}: {e}"))?;
    }
    // A BigQuery table partitions itself (its own timePartitioning); a Delta table as configured.
    let partition_by = match &bigquery {
        Some(t) if !opts.partition_by.is_empty() => {
            return Err(format!(
                "--table-partition-by {}: the BigQuery table {t} is partitioned by BigQuery (its timePartitioning); the flag is for Delta tables",
                opts.partition_by.join(",")
            ))
        }
        Some(_) => Vec::new(),
        None => delta_partitioning(&schema, &origin, &rows, opts)?,
    };
    if table_url == DISCARD {
        return Ok(SinkSpec::Discard);
    }
    if let Some(table) = bigquery {
        return Ok(SinkSpec::BigQuery(BigQueryOutput {
            table,
            rest: opts.bigquery.rest.clone(),
            storage: opts.bigquery.storage.clone(),
            rows,
            mode: if opts.bigquery.exactly_once {
                WriteMode::ExactlyOnce
            } else {
                WriteMode::AtLeastOnce
            },
            positions: None,
            cdc: key.is_some(),
            schema_refresh: Some(opts.schema_refresh),
            table_columns,
        }));
    }
    let dest = Destination::from_url(table_url).map_err(|e| e.to_string())?;
    let parquet = crate::table::parquet::writer_properties_with(&opts.parquet_compression)
        .map_err(|e| format!("--parquet-compression {e}"))?;
    Ok(SinkSpec::Table(DeltaSettings {
        dest,
        rows,
        parquet,
        streams: None,
        key,
        partition_by,
        schema_refresh: opts.schema_refresh,
        delete_retention: opts.delete_retention,
    }))
}

/// A Delta table's partitioning (docs/destinations.md, "Partitioned tables"):
/// `--table-partition-by` over the table resource's `timePartitioning`, checked against the
/// rows. A `rangePartitioning` is refused (no Delta equivalent is made).
fn delta_partitioning(
    schema: &TableSchema,
    origin: &str,
    rows: &RowBuilder,
    opts: &WriterOptions,
) -> Result<Vec<PartitionBy>, String> {
    let by = if opts.partition_by.is_empty() {
        if schema.range_partitioning {
            return Err(format!(
                "{origin}: rangePartitioning: a Delta table is partitioned by columns or by time; give --table-partition-by COL or UNIT(COL) instead (docs/destinations.md)"
            ));
        }
        schema.partitioning.clone()
    } else {
        opts.partition_by
            .iter()
            .map(|i| PartitionBy::parse(i).map_err(|e| format!("--table-partition-by {e}")))
            .collect::<Result<Vec<_>, _>>()?
    };
    Partitioning::new(by.clone(), &rows.schema()).map_err(|e| {
        let from = if opts.partition_by.is_empty() {
            format!("{origin}: timePartitioning")
        } else {
            format!("--table-partition-by {}", opts.partition_by.join(","))
        };
        format!("{from}: {e}")
    })?;
    Ok(by)
}

/// Change data capture (docs/contract.md §4.9): a table with a primary key (from its schema or
/// `--table-primary-key`) takes `_CHANGE_TYPE` / `_CHANGE_SEQUENCE_NUMBER` from each message;
/// `schema` gains those two pseudo-columns. Refused: a key without a schema mode (no-schema rows
/// carry no key), a key column the table lacks, `--exactly-once` into BigQuery (BigQuery applies
/// changes from its default stream only). No key: `None`, rows are appended.
fn change_data_capture(
    schema: &mut TableSchema,
    origin: &str,
    row_opts: &RowOptions,
    table_url: &str,
    opts: &WriterOptions,
) -> Result<Option<PrimaryKey>, String> {
    if schema.primary_key.is_empty() {
        return Ok(None);
    }
    let names = schema.primary_key.join(",");
    if row_opts.mode == SchemaMode::NoSchema {
        return Err(format!(
            "{origin}: primary key {names}: change data capture (_CHANGE_TYPE, \
             _CHANGE_SEQUENCE_NUMBER) needs useTableSchema or useTopicSchema; without a schema \
             mode a row is the payload in `data` and carries no key"
        ));
    }
    let key = PrimaryKey::new(&schema.primary_key, schema).map_err(|e| format!("{origin}: {e}"))?;
    if is_bigquery_url(table_url) && opts.bigquery.exactly_once {
        return Err(format!(
            "--exactly-once: the BigQuery table has primary key {names}, and BigQuery applies \
             change data capture rows from its default stream only (at least once); drop \
             --exactly-once"
        ));
    }
    *schema = with_change_columns(schema).map_err(|e| format!("{origin}: {e}"))?;
    Ok(Some(key))
}
