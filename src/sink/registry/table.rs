//! The table sinks' shared startup (docs/contract.md §4): from a validated subscription, its table
//! URL and the table's schema to the [`SinkSpec`] of the table sink that claims the URL — the
//! schema mode, change data capture, the row mapping and the partitioning, checked at startup.
//! What differs between the table sinks (BigQuery's required columns, Delta's partitioning, how
//! each is built) is their [`TableSink`], asked at fixed points of [`build`].

use crate::config::{BigQuerySettings, ValidSubscription};
use crate::table::cdc::{with_change_columns, PrimaryKey};
use crate::table::partition::{check_against, PartitionBy};
use crate::table::{RowBuilder, RowOptions, SchemaMode, TableField, TableSchema};

use super::options::{NamedSchema, WriterOptions};
use super::spec::SinkSpec;

/// What a table sink is built from once the shared checks passed.
pub struct TableRows {
    /// The table URL it claimed.
    pub url: String,
    /// The row mapping of the subscription's messages onto the table's columns.
    pub rows: RowBuilder,
    /// The primary key of change data capture (`None`: rows are appended).
    pub key: Option<PrimaryKey>,
    /// The partitioning the sink asked for ([`TableSink::partition_by`]).
    pub partition_by: Vec<PartitionBy>,
    /// The table's columns as read at startup, when the schema came from the table itself: what
    /// a schema watch compares later reads with (a schema file is compared with the watch's own
    /// first read instead).
    pub table_columns: Option<Vec<TableField>>,
}

/// A deferred read of the schema a destination holds ([`TableSink::held_schema`]).
pub type HeldSchema = Box<dyn FnOnce() -> Result<NamedSchema, String>>;

/// One table sink's own steps of [`build`], asked in this order; the defaults are a table
/// on an object store's.
pub trait TableSink {
    /// Without `--table-schema`: the schema the destination itself holds for `url`, read when
    /// the returned closure is called (the URL is checked at once); `None` for a destination
    /// that holds none before it is written (the default). `configured`: the table
    /// `bigqueryConfig.table` names; the endpoints: `--bigquery-endpoint`,
    /// `--bigquery-storage-endpoint`.
    fn held_schema(
        &self,
        _url: &str,
        _configured: &str,
        _endpoints: (Option<&str>, Option<&str>),
    ) -> Result<Option<HeldSchema>, String> {
        Ok(None)
    }

    /// `--exactly-once` with change data capture on the key `names` (a refusal, exit 2).
    fn change_capture(&self, _names: &str, _opts: &WriterOptions) -> Result<(), String> {
        Ok(())
    }

    /// The table's columns (with the change columns) before the rows are mapped, and
    /// `--exactly-once`: by default only BigQuery's own write mode, refused here.
    fn check_columns(
        &mut self,
        _url: &str,
        _bq: &BigQuerySettings,
        _schema: &TableSchema,
        _row_opts: &RowOptions,
        opts: &WriterOptions,
    ) -> Result<(), String> {
        if opts.bigquery.exactly_once {
            let p = opts.bigquery.positioned;
            return Err(format!("--exactly-once is for a BigQuery table (--table-url bigquery://…), or a Delta table read from {} ({})", p.name, p.flag));
        }
        Ok(())
    }

    /// How the table is partitioned: by default [`table_partitioning`].
    fn partition_by(
        &self,
        schema: &TableSchema,
        origin: &str,
        rows: &RowBuilder,
        opts: &WriterOptions,
    ) -> Result<Vec<PartitionBy>, String> {
        table_partitioning(schema, origin, rows, opts)
    }

    /// The sink, from the rows the shared checks made.
    fn build(self: Box<Self>, rows: TableRows, opts: &WriterOptions) -> Result<SinkSpec, String>;
}

/// The table sink of `sub` into `table_url`, the one `claim` names for it, after the shared
/// checks ([`super::table_sink`]).
pub fn build(
    sub: &ValidSubscription,
    table_url: &str,
    schema: Option<NamedSchema>,
    no_schema_hint: &str,
    opts: &WriterOptions,
    claim: fn(&str) -> Box<dyn TableSink>,
) -> Result<SinkSpec, String> {
    let bq = sub.bigquery.as_ref().ok_or_else(|| {
        format!(
            "subscription {} has no bigqueryConfig: the table writer needs one",
            sub.name
        )
    })?;
    let (mut schema, origin, from_table) = named_schema(schema, bq, no_schema_hint)?;
    let table_columns = from_table.then(|| schema.fields.clone());
    let row_opts = row_options(sub, bq);
    let mut sink = claim(table_url);
    let key = change_data_capture(&mut schema, &origin, &row_opts, &*sink, opts)?;
    sink.check_columns(table_url, bq, &schema, &row_opts, opts)?;
    // Decisions that stay but deserve a word at startup (docs/decisions.md, Table writer decisions).
    for w in sub.warnings() {
        tracing::warn!(subscription = %sub.name, "{w}");
    }
    if let Some(added) = crate::table::columns_added(&schema, &row_opts) {
        tracing::info!(subscription = %sub.name, "{added}");
    }
    let mut rows = row_builder(&schema, &origin, row_opts, bq, opts)?;
    if let Some(key) = &key {
        rows.check_changes(key)
            .map_err(|e| format!("{origin}: {e}"))?;
    }
    let partition_by = sink.partition_by(&schema, &origin, &rows, opts)?;
    let rows = TableRows {
        url: table_url.to_string(),
        rows,
        key,
        partition_by,
        table_columns,
    };
    sink.build(rows, opts)
}

/// The table's schema, where it came from, and whether it was read from the table itself.
fn named_schema(
    schema: Option<NamedSchema>,
    bq: &BigQuerySettings,
    no_schema_hint: &str,
) -> Result<(TableSchema, String, bool), String> {
    Ok(match schema {
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
    })
}

/// The row mapping's options: the schema mode and the subscription's row settings.
fn row_options(sub: &ValidSubscription, bq: &BigQuerySettings) -> RowOptions {
    let mode = if bq.use_topic_schema {
        SchemaMode::UseTopicSchema
    } else if bq.use_table_schema {
        SchemaMode::UseTableSchema
    } else {
        SchemaMode::NoSchema
    };
    RowOptions {
        mode,
        write_metadata: bq.write_metadata,
        drop_unknown_fields: bq.drop_unknown_fields,
        subscription_name: sub.name.clone(),
    }
}

/// The row builder of the table's columns: with the topic's schemas (`useTopicSchema`), or the
/// table's alone.
fn row_builder(
    schema: &TableSchema,
    origin: &str,
    row_opts: RowOptions,
    bq: &BigQuerySettings,
    opts: &WriterOptions,
) -> Result<RowBuilder, String> {
    if !bq.use_topic_schema {
        return RowBuilder::new(schema, row_opts).map_err(|e| format!("{origin}: {e}"));
    }
    let source = opts.topic_schema.as_ref().ok_or(
        "bigqueryConfig.useTopicSchema: give the topic's Avro schema with --topic-schema FILE.avsc",
    )?;
    let topics = source
        .load(opts.schema_encoding)
        .map_err(|e| format!("{}: {e}", source.origin()))?;
    RowBuilder::with_topic_schemas(schema, row_opts, &topics).map_err(|e| {
        format!(
            "the topic schema ({}) does not fit the table schema {origin} (docs/contract.md §4.4):\n{e}",
            source.origin()
        )
    })
}

/// A table's partitioning (docs/destinations.md, "Partitioned tables"): `--table-partition-by`
/// over the table resource's `timePartitioning`, checked against the rows. A `rangePartitioning`
/// is refused (no Delta equivalent is made).
pub fn table_partitioning(
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
    check_against(&by, &rows.schema()).map_err(|e| {
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
/// carry no key), a key column the table lacks, what the sink refuses of it
/// ([`TableSink::change_capture`]). No key: `None`, rows are appended.
fn change_data_capture(
    schema: &mut TableSchema,
    origin: &str,
    row_opts: &RowOptions,
    sink: &dyn TableSink,
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
    sink.change_capture(&names, opts)?;
    *schema = with_change_columns(schema).map_err(|e| format!("{origin}: {e}"))?;
    Ok(Some(key))
}
