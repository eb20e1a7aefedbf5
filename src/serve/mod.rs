//! `subsink serve` groundwork: discover a project's export subscriptions through the Pub/Sub admin
//! API and turn each into what one pipeline needs — the validated subscription and the URL of its
//! bucket or table.
//!
//! 1. [`discover`] (`discovery.rs`) lists every subscription of the project (`ListSubscriptions`,
//!    all pages) and keeps those with a `cloudStorageConfig` or a `bigqueryConfig`; each is
//!    converted into the crate's REST-shaped [`Subscription`](crate::config::Subscription)
//!    ([`from_proto`]) and validated like a config file, so a subscription subsink cannot honour
//!    is reported with every violated rule instead of run.
//! 2. [`Targets`] (`targets.rs`) maps a bucket to a URL with `--bucket-url-template` (`{bucket}`)
//!    and a table with `--table-url-template` (`{project}`, `{dataset}`, `{table}`); a table's
//!    schema file comes from `--table-schemas DIR` (`PROJECT.DATASET.TABLE.json`) when it is there.
//! 3. [`diff`] (`supervise.rs`) compares two discoveries: what was created, changed (any field of
//!    the resource) and deleted, for the `--discover-interval` loop ([`supervise`]) to start,
//!    restart and stop pipelines.
//! 4. [`Exporter`] (`exporter.rs`) is what `subsink serve` plugs into that loop: one
//!    [`crate::app::run`] per subscription on its own task, pulling it with StreamingPull, all of
//!    them sharing one [`crate::resources::Resources`] (upload slots, memory budget), one metrics
//!    registry and one health (label / probe `subscription`).
//!
//! A topic's schema for `useTopicSchema` subscriptions is read in `topic_schema.rs`, a table's
//! schema in `table_schema.rs`.
//!
//! The emulator (`PUBSUB_EMULATOR_HOST`) stores both export configs and returns them here although
//! it exports nothing itself: this is what lets subsink stand in for the export there.

mod discovery;
mod exporter;
mod supervise;
mod table_schema;
mod targets;
mod topic_schema;

pub use discovery::{
    discover, discover_cached, discover_with, from_proto, Discovered, ExportKind, Seen,
};
pub use exporter::{Exporter, ExporterSettings};
pub use supervise::{
    diff, supervise, Changes, Pipelines, ServeSettings, StartError, StopReason,
    DEFAULT_DISCOVER_INTERVAL,
};
pub use table_schema::{table_schema_of, TableSchemaError};
pub use targets::{split_table, Target, Targets, TemplateError, UrlTemplate};
pub use topic_schema::{
    fetch_topic_schema, uses_topic_schema, FetchedTopicSchema, TopicSchemaCache, TopicSchemaError,
};
