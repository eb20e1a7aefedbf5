//! The registration point of the sinks. Each sink's folder holds a `register.rs`: a unit type
//! implementing [`RegisterSink`] (the destination URLs it claims: `--bucket-url`, `--table-url`, a
//! serve target) and its settings implementing [`SinkSetup`] (how it takes `--exactly-once`, how
//! it describes itself, how it builds its [`Files`]). The list below names each sink once; the
//! first that claims a URL builds it. `subsink run` (one subscription, its flags) and `subsink
//! serve` (every export subscription of a project) both build their sinks here, through
//! [`storage_sink`] (docs/contract.md §3) and [`table_sink`] (§4).
//!
//! Adding a sink: a folder under `sink/` with its `register.rs`, its `pub mod` line in
//! `sink/mod.rs`, and its line in the list.

pub mod build_error;
pub mod claim;
pub mod options;
pub mod spec;
pub mod table;

pub use build_error::{BuildError, DestinationError};
pub use claim::RegisterSink;
pub use options::{BigQueryOptions, NamedSchema, WriterOptions};
pub use spec::{SinkSetup, SinkSpec};
pub use table::{table_partitioning, HeldSchema, TableRows, TableSink};

pub use super::discard::register::DISCARD;
pub use super::publish::PublishArgs;

use crate::config::ValidSubscription;

use super::{bigquery, delta, discard, object};

/// Every sink, in the order their claims are asked: the first that claims a URL builds it.
macro_rules! sinks {
    ($($sink:ty,)*) => {
        /// The sink that takes `--bucket-url url`.
        fn claim_bucket(
            sub: &ValidSubscription,
            url: &str,
            opts: &WriterOptions,
        ) -> Result<SinkSpec, String> {
            $(if let Some(spec) = <$sink as RegisterSink>::bucket(sub, url, opts) {
                return spec;
            })*
            unreachable!("the object sink takes every other URL")
        }

        /// The table sink that takes `--table-url url`.
        fn claim_table(url: &str) -> Box<dyn TableSink> {
            $(if let Some(sink) = <$sink as RegisterSink>::table(url) {
                return sink;
            })*
            unreachable!("the Delta sink takes every other URL")
        }
    };
}

sinks! {
    bigquery::register::BigQueryEntry,
    discard::register::DiscardEntry,
    object::register::ObjectEntry,
    delta::register::DeltaEntry,
}

/// The storage sink of `sub` into `bucket_url` (the sink that claims it: `discard://` writes
/// nothing, any other URL is a bucket).
pub fn storage_sink(
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
    claim_bucket(sub, bucket_url, opts)
}

/// The table sink of `sub` into `table_url` (the sink that claims it: `bigquery://…`, `discard://`
/// writes nothing, any other URL a Delta table), with the table's columns from `schema` (`None`:
/// the `data` column and, with `writeMetadata`, the metadata columns). `no_schema_hint` says how
/// to give a schema when `useTableSchema` needs one. The shared steps are [`table::build`]'s.
pub fn table_sink(
    sub: &ValidSubscription,
    table_url: &str,
    schema: Option<NamedSchema>,
    no_schema_hint: &str,
    opts: &WriterOptions,
) -> Result<SinkSpec, String> {
    table::build(sub, table_url, schema, no_schema_hint, opts, claim_table)
}

/// Without `--table-schema`: the schema the destination of `--table-url url` holds, if it holds
/// one before it is written (a BigQuery table's, as Pub/Sub reads it with tables.get), read when
/// the closure is called; the URL is checked at once.
pub fn held_schema(
    url: &str,
    configured: &str,
    endpoint: Option<&str>,
    storage_endpoint: Option<&str>,
) -> Result<Option<HeldSchema>, String> {
    claim_table(url).held_schema(url, configured, (endpoint, storage_endpoint))
}
