//! The destination's flags (`run`, and `serve` for the writer's): where files go and how they are
//! written, and the [`SinkSpec`] they build, checked at startup.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{heading, values};
use crate::config::ValidSubscription;
use crate::encode::avro::Codec;
use crate::encode::topic::{SchemaEncoding, TopicSchemaSource};
use crate::receipt::PositionedSource;
use crate::sink::registry::{self, BigQueryOptions, NamedSchema, PublishArgs, WriterOptions};
use crate::sink::SinkSpec;
use crate::table::TableSchema;
use crate::upload::UploadSettings;

/// `--schema-encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EncodingArg {
    Json,
    Binary,
}

impl From<EncodingArg> for SchemaEncoding {
    fn from(e: EncodingArg) -> SchemaEncoding {
        match e {
            EncodingArg::Json => SchemaEncoding::Json,
            EncodingArg::Binary => SchemaEncoding::Binary,
        }
    }
}

/// How files are written, whatever the subscription (`run` and `serve`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = heading::DESTINATION)]
pub struct WriterArgs {
    /// Avro block codec (`zstandard` is zstd's Avro name).
    #[arg(long, default_value = "null", value_parser = values::avro_codec_parser())]
    pub avro_codec: Codec,
    /// Uncompressed size at which an Avro block is closed.
    #[arg(long, default_value = "1MiB", value_name = "SIZE", value_parser = values::size)]
    pub avro_block_size: u64,
    /// Encoding of messages without a `googclient_schemaencoding` attribute.
    #[arg(long, value_enum, default_value = "json")]
    pub schema_encoding: EncodingArg,
    /// Objects larger than this are streamed as multipart uploads.
    #[arg(long, default_value = "16MiB", value_name = "SIZE", value_parser = values::size)]
    pub multipart_threshold: u64,
    /// Multipart part size.
    #[arg(long, default_value = "8MiB", value_name = "SIZE", value_parser = values::size)]
    pub part_size: u64,
    /// How long an object whose upload keeps failing with a transient error (the store down or
    /// unreachable, 5xx) is retried, with backoff from 0.5 s doubling to 30 s, before its messages
    /// are given up as not done for this run.
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = values::duration, help_heading = heading::DELIVERY)]
    pub upload_retry_for: Duration,
    /// Table writer: Parquet compression: zstd (level 1), zstd(N), snappy, gzip, gzip(N), uncompressed.
    #[arg(long, default_value = "zstd", help_heading = heading::TABLES)]
    pub parquet_compression: String,
    /// BigQuery destination (`--table-url bigquery://PROJECT/DATASET/TABLE`): the REST endpoint
    /// (tables.get), e.g. an emulator's http://127.0.0.1:9050. Default Google's, with Application
    /// Default Credentials.
    #[arg(long, value_name = "URL", help_heading = heading::TABLES)]
    pub bigquery_endpoint: Option<String>,
    /// BigQuery destination: the Storage Write API (gRPC) endpoint, e.g. http://127.0.0.1:9060.
    /// Default Google's, with Application Default Credentials.
    #[arg(long, value_name = "URL", help_heading = heading::TABLES)]
    pub bigquery_storage_endpoint: Option<String>,
    /// BigQuery destination: write each batch through a PENDING stream with offsets, committed
    /// atomically, instead of the default stream (at least once); with a file source and
    /// --checkpoint, a crash and resume writes no row twice. A source whose records carry their
    /// stream position, into a bucket: one file per partition, named from its first offset,
    /// written put-if-absent in offset order and found again on restart, so every record is
    /// written once (Avro with writeMetadata only); into a Delta table: each commit carries a txn
    /// action per partition (its last offset), read back on restart.
    #[arg(long, help_heading = heading::TABLES)]
    pub exactly_once: bool,
    /// Table writer: how often a running writer reads its table's schema again (a Delta table's
    /// log, a BigQuery table's tables.get). A NULLABLE column another writer adds is written from
    /// the next batch opened after that (so within this interval plus the batch's maxDuration); a
    /// column removed or retyped is SCHEMA_MISMATCH: nothing is committed or acked, /readyz says
    /// why, checked again this often until the table fits.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = values::duration, help_heading = heading::TABLES)]
    pub table_schema_refresh: Duration,
    /// Table writer, change data capture into a Delta table: how long a DELETE's tombstone keeps
    /// older changes of its key out (BigQuery's delete retention window, two days by default).
    /// A change numbered below a key's DELETE that arrives later than this after the DELETE's
    /// commit is applied; tombstones past the window are removed. At least 1s.
    #[arg(long, default_value = "2d", value_name = "DURATION", value_parser = values::duration, help_heading = heading::TABLES)]
    pub table_delete_retention: Duration,
    /// The source that writes a bucket or a Delta table exactly once, as refusals name it (set
    /// by the `run` and `serve` commands from the registry).
    #[arg(skip)]
    pub positioned: PositionedSource,
}

impl WriterArgs {
    /// How files are written; `topic_schema`: the topic's Avro schema file, if given.
    pub fn options(&self, topic_schema: Option<PathBuf>) -> WriterOptions {
        WriterOptions {
            avro_codec: self.avro_codec,
            avro_block_size: self.avro_block_size as usize,
            topic_schema: topic_schema.map(TopicSchemaSource::File),
            schema_encoding: self.schema_encoding.into(),
            upload: UploadSettings {
                multipart_threshold: self.multipart_threshold as usize,
                part_size: self.part_size as usize,
                retry_for: self.upload_retry_for,
                ..UploadSettings::default()
            },
            parquet_compression: self.parquet_compression.clone(),
            partition_by: Vec::new(),
            schema_refresh: self.table_schema_refresh,
            delete_retention: self.table_delete_retention,
            bigquery: BigQueryOptions {
                rest: self.bigquery_endpoint.clone(),
                storage: self.bigquery_storage_endpoint.clone(),
                exactly_once: self.exactly_once,
                positioned: self.positioned,
            },
        }
    }
}

/// Where a run's files go (`run`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = heading::DESTINATION)]
pub struct DestinationArgs {
    /// Where the subscription's bucket lives: file:///dir, s3://bucket, gs://, az://, memory://,
    /// or discard:// (write nothing: the pipeline alone). Needed for a cloudStorageConfig
    /// subscription; there is no default folder.
    #[arg(long)]
    pub bucket_url: Option<String>,
    /// The topic's Avro schema (.avsc), for use_topic_schema.
    #[arg(long, value_name = "FILE.avsc")]
    pub topic_schema: Option<PathBuf>,
    /// Table writer: where the Delta table lives: file:///dir, s3://bucket/prefix, gs://, az://,
    /// memory://, discard:// (write nothing), or bigquery://PROJECT/DATASET/TABLE (`bigquery`: the
    /// table bigqueryConfig.table names). Needed for a bigqueryConfig subscription.
    #[arg(long, help_heading = heading::TABLES)]
    pub table_url: Option<String>,
    /// Table writer: the table's schema in BigQuery's JSON format
    /// (`bq show --schema --format=prettyjson`). Without it the table has the `data` column
    /// (BYTES) and, with write_metadata, the metadata columns.
    #[arg(long, value_name = "FILE.json", help_heading = heading::TABLES)]
    pub table_schema: Option<PathBuf>,
    /// Table writer: the table's primary key (its columns, comma-separated), for change data
    /// capture: rows with `_CHANGE_TYPE` UPSERT or DELETE update and delete rows by this key.
    /// Default: the key of the table resource given with --table-schema
    /// (`tableConstraints.primaryKey`), or of the BigQuery table.
    #[arg(long, value_name = "COL[,COL]", value_delimiter = ',', help_heading = heading::TABLES)]
    pub table_primary_key: Vec<String>,
    /// Table writer: how a Delta table this run creates is partitioned (comma-separated): a
    /// column (`region`: one partition per value), `UNIT(COL)` for a TIMESTAMP or DATE column, or
    /// `UNIT(_PARTITIONTIME)` for the ingestion (publish) time, UNIT one of HOUR, DAY, MONTH,
    /// YEAR (a derived `_PARTITIONTIME` or `_PARTITIONDATE` column). Default: the table resource's
    /// `timePartitioning` (--table-schema); an existing table keeps its own partitions.
    #[arg(long, value_name = "COL|UNIT(COL)[,…]", value_delimiter = ',', help_heading = heading::TABLES)]
    pub table_partition_by: Vec<String>,
    /// `--publish-to` and its options: the publish sink's own flags.
    #[command(flatten)]
    pub publish: PublishArgs,
}

impl DestinationArgs {
    /// The run's sink: the table writer for a `bigqueryConfig`, else the storage writer; the
    /// table's schema and mode are checked here, at startup. A flag the destination would not use
    /// is refused, and there is no default place: the bucket or table is named by a flag.
    pub fn sink_spec(&self, w: &WriterArgs, sub: &ValidSubscription) -> Result<SinkSpec, String> {
        let mut opts = w.options(self.topic_schema.clone());
        opts.partition_by = self.table_partition_by.clone();
        if w.table_delete_retention < Duration::from_secs(1) {
            return Err(format!(
                "--table-delete-retention {:?}: at least 1s (a DELETE's tombstone must outlive \
                 its own batch); the default is BigQuery's two days",
                w.table_delete_retention
            ));
        }
        let writers = [
            ("--bucket-url", self.bucket_url.is_some()),
            ("--table-url", self.table_url.is_some()),
            ("--table-schema", self.table_schema.is_some()),
            ("--table-primary-key", !self.table_primary_key.is_empty()),
            ("--table-partition-by", !self.table_partition_by.is_empty()),
        ];
        if let Some(to) = self.publish.sink_spec(&writers)? {
            return Ok(to);
        }
        if sub.bigquery.is_some() {
            if let Some(u) = &self.bucket_url {
                return Err(format!(
                    "--bucket-url {u}: subscription {} has a bigqueryConfig, whose rows go to a table: give --table-url (a Delta table's URL, or bigquery://PROJECT/DATASET/TABLE)",
                    sub.name
                ));
            }
            self.table_writer(w, sub, &opts)
        } else {
            for (flag, given) in [
                ("--table-url", &self.table_url),
                (
                    "--table-schema",
                    &self.table_schema.as_ref().map(|p| p.display().to_string()),
                ),
                (
                    "--table-primary-key",
                    &(!self.table_primary_key.is_empty()).then(|| self.table_primary_key.join(",")),
                ),
                (
                    "--table-partition-by",
                    &(!self.table_partition_by.is_empty())
                        .then(|| self.table_partition_by.join(",")),
                ),
            ] {
                if let Some(v) = given {
                    // With --bucket-url given, the flag is the one too many; without, say both.
                    let instead = match self.bucket_url {
                        Some(_) => format!("{flag} is for a table (a bigqueryConfig): drop it"),
                        None => "give --bucket-url instead".into(),
                    };
                    return Err(format!(
                        "{flag} {v}: subscription {} has a cloudStorageConfig, whose messages go to objects in a bucket: {instead}",
                        sub.name
                    ));
                }
            }
            self.storage_writer(sub, &opts)
        }
    }

    /// The storage writer's bucket and format (docs/contract.md §3).
    fn storage_writer(
        &self,
        sub: &ValidSubscription,
        opts: &WriterOptions,
    ) -> Result<SinkSpec, String> {
        let bucket_url = match (&self.bucket_url, &sub.storage) {
            (Some(u), _) => u.clone(),
            (None, Some(storage)) => {
                return Err(format!(
                    "no --bucket-url: where the bucket {:?} of subscription {} lives (file:///path/to/folder, s3://BUCKET, gs://BUCKET, az://CONTAINER; discard:// writes nothing)",
                    storage.bucket, sub.name
                ))
            }
            (None, None) => String::new(),
        };
        registry::storage_sink(sub, &bucket_url, opts)
    }

    /// The table writer's table and row mapping (docs/contract.md §4).
    fn table_writer(
        &self,
        w: &WriterArgs,
        sub: &ValidSubscription,
        opts: &WriterOptions,
    ) -> Result<SinkSpec, String> {
        let bq = sub.bigquery.as_ref().expect("checked by the caller");
        // As Pub/Sub does: without --table-schema, the table's own schema where the destination
        // holds one (a BigQuery table, read with tables.get).
        let held = match self.table_url.as_deref() {
            Some(u) => registry::held_schema(
                u,
                &bq.table,
                w.bigquery_endpoint.as_deref(),
                w.bigquery_storage_endpoint.as_deref(),
            )?,
            None => None,
        };
        let schema = match &self.table_schema {
            Some(path) => Some(schema_file(path)?),
            None => held.map(|held| held()).transpose()?,
        };
        let schema = with_primary_key(schema, &self.table_primary_key)?;
        let table_url = match &self.table_url {
            Some(u) => u.clone(),
            None => {
                return Err(format!(
                    "no --table-url: where the table {:?} of subscription {} lives (a Delta table: file:///path/to/table, s3://BUCKET/PATH, gs://, az://; BigQuery itself: bigquery://PROJECT/DATASET/TABLE, or `bigquery` for the table bigqueryConfig.table names; discard:// writes nothing)",
                    bq.table, sub.name
                ))
            }
        };
        registry::table_sink(sub, &table_url, schema, "--table-schema FILE.json", opts)
    }
}

/// The table schema in `path` (`--table-schema`): a BigQuery JSON schema or table resource.
pub fn schema_file(path: &std::path::Path) -> Result<NamedSchema, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--table-schema {}: {e}", path.display()))?;
    Ok(NamedSchema {
        schema: TableSchema::from_json(&text)
            .map_err(|e| format!("--table-schema {}: {e}", path.display()))?,
        origin: format!("--table-schema {}", path.display()),
        from_table: false,
    })
}

/// `--table-primary-key` over the schema's own key (none given: the schema as it is).
pub fn with_primary_key(
    schema: Option<NamedSchema>,
    key: &[String],
) -> Result<Option<NamedSchema>, String> {
    match (schema, key) {
        (schema, []) => Ok(schema),
        (Some(mut n), key) => {
            n.schema.primary_key = key.to_vec();
            n.origin = format!("{} with --table-primary-key {}", n.origin, key.join(","));
            Ok(Some(n))
        }
        (None, key) => Err(format!(
            "--table-primary-key {}: a key names columns of the table's schema; give it with --table-schema FILE.json",
            key.join(",")
        )),
    }
}
