//! The subscription resource, in Pub/Sub's REST JSON shape (docs/contract.md §2, §3), parsed then validated once.
//!
//! `resource` mirrors the REST resource (what `gcloud pubsub subscriptions describe --format=json`
//! prints) with serde; `validate` checks every rule and limit and returns a [`ValidSubscription`],
//! the only type the rest of the crate accepts; `gcloud` turns gcloud-style flags into a resource.

pub mod error;
pub mod gcloud;
mod names;
pub mod paths;
pub mod resource;
pub mod transforms;
pub mod validate;

use std::time::Duration;

use crate::naming::DatetimeFormat;

pub use error::{ConfigError, Violation};
pub use paths::{EventTimeSource, Partition, PartitionValue, PathPartitions};
pub use resource::Subscription;
pub use validate::validate;

/// Pub/Sub's numeric limits (docs/contract.md §7): enforced exactly by default, lifted with `extended`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitsMode {
    #[default]
    Pubsub,
    Extended,
}

/// Output format of a Cloud Storage subscription (docs/contract.md §3.6, §3.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Text,
    Avro {
        write_metadata: bool,
        use_topic_schema: bool,
    },
}

/// A validated Cloud Storage subscription: everything the storage writer needs, already checked.
#[derive(Debug, Clone)]
pub struct StorageSettings {
    pub bucket: String,
    pub filename_prefix: String,
    pub filename_suffix: String,
    pub datetime_format: DatetimeFormat,
    /// Always set (default 5 min).
    pub max_duration: Duration,
    pub max_bytes: Option<u64>,
    pub max_messages: Option<u64>,
    pub output: OutputFormat,
    /// `subsink.paths` (docs/contract.md §7): Hive-style directories in front of each file name;
    /// `None`: off.
    pub partitions: Option<PathPartitions>,
}

/// Delivery settings common to every subscription (docs/contract.md §2).
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    pub ack_deadline: Duration,
    pub enable_message_ordering: bool,
    pub filter: String,
    /// `(dead_letter_topic, max_delivery_attempts)`.
    pub dead_letter: Option<(String, u32)>,
    /// `(minimum_backoff, maximum_backoff)`; `None` = retry immediately.
    pub retry: Option<(Duration, Duration)>,
}

/// A validated BigQuery subscription (docs/contract.md §4.2) and subsink's table batching (§7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BigQuerySettings {
    /// `{project}.{dataset}.{table}` as given (names the table; where it lives is `--table-url`).
    pub table: String,
    pub use_topic_schema: bool,
    pub use_table_schema: bool,
    pub write_metadata: bool,
    pub drop_unknown_fields: bool,
    /// Close a Parquet file this long after its first row (default 10 s).
    pub max_duration: Duration,
    /// Message bytes (payload + attributes) in one file (default 64 MiB; `None`: no limit).
    pub max_bytes: Option<u64>,
    /// Rows in one file (`None`: no limit).
    pub max_messages: Option<u64>,
}

/// A subscription resource that passed every rule of docs/contract.md §2–§3.
#[derive(Debug, Clone)]
pub struct ValidSubscription {
    /// Full resource name `projects/{p}/subscriptions/{s}`.
    pub name: String,
    pub topic: String,
    pub limits: LimitsMode,
    pub delivery: DeliverySettings,
    /// `Some` when the resource has a `cloudStorageConfig`.
    pub storage: Option<StorageSettings>,
    /// `Some` when the resource has a `bigqueryConfig`.
    pub bigquery: Option<BigQuerySettings>,
    /// The enabled JavaScript UDFs of `messageTransforms`, in the order they run (docs/transforms.md).
    pub transforms: Vec<crate::transform::Udf>,
    /// The resource as parsed (for writers added later, e.g. BigQuery).
    pub resource: Subscription,
}

impl ValidSubscription {
    /// Settings Pub/Sub accepts but that have no effect, to log at startup (and print from
    /// `validate`): valid, so not violations, but likely not what the user meant.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(bq) = &self.bigquery {
            if bq.drop_unknown_fields && !bq.use_table_schema && !bq.use_topic_schema {
                out.push(
                    "bigqueryConfig.dropUnknownFields has no effect without useTableSchema or \
                     useTopicSchema: the payload goes whole to the `data` column (Pub/Sub accepts \
                     it too)"
                        .to_string(),
                );
            }
        }
        out
    }
}
