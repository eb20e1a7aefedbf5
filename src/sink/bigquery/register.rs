//! The BigQuery sink's registration: `--table-url bigquery://PROJECT/DATASET/TABLE` (or
//! `bigquery` for the table `bigqueryConfig.table` names), the columns Pub/Sub requires of the
//! table, BigQuery's own partitioning, and `--exactly-once` through PENDING streams.

use crate::config::{BigQuerySettings, ValidSubscription};
use crate::ids::Clock;
use crate::position::Streams;
use crate::sink::registry::claim::RegisterSink;
use crate::sink::registry::options::NamedSchema;
use crate::sink::registry::options::WriterOptions;
use crate::sink::registry::table::{HeldSchema, TableRows, TableSink};
use crate::sink::{BuildError, Files, OpenFiles, SinkSetup, SinkSpec};
use crate::table::partition::PartitionBy;
use crate::table::{RowBuilder, RowOptions, SchemaMode, TableSchema};

use super::{missing_columns, BigQueryClient, BigQueryOutput, BigQuerySink, TableRef, WriteMode};

/// Is `table_url` a BigQuery table (`bigquery://PROJECT/DATASET/TABLE`, or `bigquery` alone for
/// the table `bigqueryConfig.table` names)?
pub fn is_bigquery_url(table_url: &str) -> bool {
    table_url == "bigquery" || table_url.starts_with("bigquery://")
}

/// The BigQuery sink in the registry: it claims the BigQuery table URLs.
pub struct BigQueryEntry;

impl RegisterSink for BigQueryEntry {
    fn table(url: &str) -> Option<Box<dyn TableSink>> {
        is_bigquery_url(url)
            .then(|| Box::new(BigQueryTableSink { table: None }) as Box<dyn TableSink>)
    }
}

/// A BigQuery table's steps of the table sinks' startup.
struct BigQueryTableSink {
    /// The table, once its URL was read ([`TableSink::check_columns`]).
    table: Option<TableRef>,
}

impl TableSink for BigQueryTableSink {
    fn held_schema(
        &self,
        url: &str,
        configured: &str,
        (endpoint, storage_endpoint): (Option<&str>, Option<&str>),
    ) -> Result<Option<HeldSchema>, String> {
        let t = TableRef::from_url(url, configured)?;
        let endpoints = (
            endpoint.map(str::to_owned),
            storage_endpoint.map(str::to_owned),
        );
        Ok(Some(Box::new(move || {
            Ok(NamedSchema {
                schema: bigquery_schema(endpoints.0.as_deref(), endpoints.1.as_deref(), &t)?,
                origin: format!("the BigQuery table {t}"),
                from_table: true,
            })
        })))
    }

    fn change_capture(&self, names: &str, opts: &WriterOptions) -> Result<(), String> {
        if opts.bigquery.exactly_once {
            return Err(format!(
                "--exactly-once: the BigQuery table has primary key {names}, and BigQuery applies \
                 change data capture rows from its default stream only (at least once); drop \
                 --exactly-once"
            ));
        }
        Ok(())
    }

    /// A BigQuery table is not extended: Pub/Sub refuses a subscription whose table lacks the
    /// columns it writes.
    fn check_columns(
        &mut self,
        url: &str,
        bq: &BigQuerySettings,
        schema: &TableSchema,
        row_opts: &RowOptions,
        _opts: &WriterOptions,
    ) -> Result<(), String> {
        let t = TableRef::from_url(url, &bq.table)?;
        let missing = missing_columns(schema, row_opts);
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
        self.table = Some(t);
        Ok(())
    }

    /// A BigQuery table partitions itself (its own timePartitioning).
    fn partition_by(
        &self,
        _schema: &TableSchema,
        _origin: &str,
        _rows: &RowBuilder,
        opts: &WriterOptions,
    ) -> Result<Vec<PartitionBy>, String> {
        if let (Some(t), false) = (&self.table, opts.partition_by.is_empty()) {
            return Err(format!(
                "--table-partition-by {}: the BigQuery table {t} is partitioned by BigQuery (its timePartitioning); the flag is for Delta tables",
                opts.partition_by.join(",")
            ));
        }
        Ok(Vec::new())
    }

    fn build(self: Box<Self>, t: TableRows, opts: &WriterOptions) -> Result<SinkSpec, String> {
        let table = self.table.expect("read by check_columns");
        Ok(SinkSpec::new(BigQueryOutput {
            table,
            rest: opts.bigquery.rest.clone(),
            storage: opts.bigquery.storage.clone(),
            rows: t.rows,
            mode: if opts.bigquery.exactly_once {
                WriteMode::ExactlyOnce
            } else {
                WriteMode::AtLeastOnce
            },
            positions: None,
            cdc: t.key.is_some(),
            schema_refresh: Some(opts.schema_refresh),
            table_columns: t.table_columns,
        }))
    }
}

#[async_trait::async_trait]
impl SinkSetup for BigQueryOutput {
    fn describe(&self) -> String {
        format!("bigquery://{}", self.table)
    }

    fn rerun_does(&self) -> Option<&'static str> {
        Some(match self.cdc {
            true => "applies every change to the table again",
            false => "appends every row to the table again",
        })
    }

    fn hold_positions(
        &mut self,
        streams: &Streams,
        sub: &ValidSubscription,
    ) -> Result<&'static str, String> {
        let source = &streams.name;
        let bq = sub.bigquery.as_ref().ok_or("no bigqueryConfig")?;
        if !bq.write_metadata {
            return Err(format!("--exactly-once with {source} into BigQuery: without bigqueryConfig.writeMetadata the rows do not carry the records' offsets (message_id), so a restart cannot find what a crashed run committed; set bigqueryConfig.writeMetadata"));
        }
        BigQueryOutput::hold_positions(self, streams, &sub.name);
        Ok("the table's commits")
    }

    async fn build(
        self: Box<Self>,
        sub: &ValidSubscription,
        _seed: Option<u64>,
        _clock: Clock,
    ) -> Result<Box<dyn OpenFiles>, BuildError> {
        let bq = sub
            .bigquery
            .as_ref()
            .ok_or_else(|| BuildError::NotBigQuery(sub.name.clone()))?;
        Ok(Box::new(Files::new(
            BigQuerySink::new(bq, *self).map_err(Box::new)?,
        )))
    }
}

/// The schema of BigQuery table `t`, read with tables.get (a runtime of its own: startup, before
/// the run's).
fn bigquery_schema(
    endpoint: Option<&str>,
    storage_endpoint: Option<&str>,
    t: &TableRef,
) -> Result<TableSchema, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = BigQueryClient::new(endpoint, storage_endpoint).map_err(|e| e.to_string())?;
        client.table_schema(t).await.map_err(|e| e.to_string())
    })
}
