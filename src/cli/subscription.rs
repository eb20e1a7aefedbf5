//! The subscription's flags (`run`, `validate`): a REST JSON/YAML file, or gcloud-style flags, and
//! the table writer's batching; loaded and validated once ([`SubscriptionArgs::load`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{heading, values, LimitsArg};
use crate::config::gcloud::GcloudFlags;
use crate::config::resource::{RawDuration, RawInt, TableBatching};
use crate::config::{self, Subscription, ValidSubscription};

/// The subscription: a REST JSON/YAML file, or gcloud-style flags — not both: with
/// `--subscription FILE` a gcloud-style flag is refused (exit 2) rather than ignored, since the
/// file already says what that flag would.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = heading::SOURCE)]
pub struct SubscriptionArgs {
    /// Subscription resource as JSON or YAML (`gcloud pubsub subscriptions describe --format=json`).
    #[arg(long, value_name = "FILE")]
    pub subscription: Option<PathBuf>,
    /// Pub/Sub's numeric limits: enforced exactly (`pubsub`, default) or lifted (`extended`).
    #[arg(long, value_enum)]
    pub limits: Option<LimitsArg>,
    /// Without --subscription: the subscription's full name (`projects/P/subscriptions/S`).
    #[arg(
        long,
        conflicts_with = "subscription",
        value_name = "projects/P/subscriptions/S"
    )]
    pub subscription_name: Option<String>,
    /// Without --subscription: the topic the subscription is attached to.
    #[arg(
        long,
        conflicts_with = "subscription",
        value_name = "projects/P/topics/T"
    )]
    pub topic: Option<String>,
    /// Cloud Storage subscription: the bucket name (objects go to --bucket-url).
    #[arg(long, conflicts_with = "subscription", help_heading = heading::DESTINATION)]
    pub cloud_storage_bucket: Option<String>,
    /// Cloud Storage: text every object name starts with (e.g. `logs/`).
    #[arg(long, conflicts_with = "subscription", help_heading = heading::DESTINATION)]
    pub cloud_storage_file_prefix: Option<String>,
    /// Cloud Storage: text every object name ends with (e.g. `.avro`; not `/`).
    #[arg(long, conflicts_with = "subscription", help_heading = heading::DESTINATION)]
    pub cloud_storage_file_suffix: Option<String>,
    /// Cloud Storage: the UTC datetime in object names, e.g. `YYYY-MM-DD/hh_mm_ssZ`.
    #[arg(long, conflicts_with = "subscription", help_heading = heading::DESTINATION)]
    pub cloud_storage_file_datetime_format: Option<String>,
    /// Cloud Storage: finalize an object this long after its first message, e.g. `90s`, `5m`
    /// (default unit: seconds; 1 to 10 minutes) [default: 5m].
    #[arg(long, conflicts_with = "subscription", help_heading = heading::BATCHING)]
    pub cloud_storage_max_duration: Option<String>,
    /// Cloud Storage: bytes per object at most, e.g. `10MB`, `1GiB` (default unit: KB = 1024
    /// bytes, as gcloud; 1 KB to 10 GiB) [default: no limit].
    #[arg(long, conflicts_with = "subscription", help_heading = heading::BATCHING)]
    pub cloud_storage_max_bytes: Option<String>,
    /// Cloud Storage: messages per object at most (1000 or more) [default: no limit].
    #[arg(long, conflicts_with = "subscription", help_heading = heading::BATCHING)]
    pub cloud_storage_max_messages: Option<String>,
    /// Cloud Storage: `text` or `avro` [default: text].
    #[arg(long, conflicts_with = "subscription", help_heading = heading::DESTINATION)]
    pub cloud_storage_output_format: Option<String>,
    /// Cloud Storage, Avro: also write message id, publish time, attributes, subscription name.
    #[arg(long, conflicts_with = "subscription", help_heading = heading::DESTINATION)]
    pub cloud_storage_write_metadata: bool,
    /// Cloud Storage, Avro: write messages with the topic's schema (give it with --topic-schema).
    #[arg(long, conflicts_with = "subscription", help_heading = heading::DESTINATION)]
    pub cloud_storage_use_topic_schema: bool,
    /// BigQuery subscription: `{project}.{dataset}.{table}` (or `{project}:{dataset}.{table}`).
    #[arg(long, conflicts_with = "subscription", help_heading = heading::TABLES)]
    pub bigquery_table: Option<String>,
    /// BigQuery: the topic's Avro schema fields become columns (give it with --topic-schema).
    #[arg(long, conflicts_with = "subscription", help_heading = heading::TABLES)]
    pub use_topic_schema: bool,
    /// BigQuery: top-level JSON keys of each message become columns (--table-schema).
    #[arg(long, conflicts_with = "subscription", help_heading = heading::TABLES)]
    pub use_table_schema: bool,
    /// BigQuery: also write subscription_name, message_id, publish_time, attributes.
    #[arg(long, conflicts_with = "subscription", help_heading = heading::TABLES)]
    pub write_metadata: bool,
    /// BigQuery: drop message fields that are not columns instead of failing the message.
    #[arg(long, conflicts_with = "subscription", help_heading = heading::TABLES)]
    pub drop_unknown_fields: bool,
    /// Dead-letter topic (`projects/P/topics/T` or an ID in the subscription's project).
    #[arg(long, conflicts_with = "subscription", help_heading = heading::DELIVERY)]
    pub dead_letter_topic: Option<String>,
    /// Deliveries before a message is dead-lettered (5–100; default 5).
    #[arg(long, conflicts_with = "subscription", help_heading = heading::DELIVERY)]
    pub max_delivery_attempts: Option<String>,
    /// Single Message Transforms: a JSON or YAML list of transforms (`messageTransforms`, REST
    /// field names, as gcloud's flag); replaces the subscription file's list.
    #[arg(long, value_name = "FILE", help_heading = heading::DELIVERY)]
    pub message_transforms_file: Option<PathBuf>,
    #[command(flatten)]
    pub table_batching: TableBatchingArgs,
}

/// The table writer's batching (`subsink.table`), which a BigQuery subscription lacks.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = heading::BATCHING)]
pub struct TableBatchingArgs {
    /// Table writer: close and commit a Parquet file this long after its first row
    /// (`subsink.table.maxDuration`; default 10s).
    #[arg(long, value_name = "DURATION", value_parser = values::duration)]
    pub table_max_duration: Option<Duration>,
    /// Table writer: message bytes (payload + attributes) per file (`subsink.table.maxBytes`;
    /// default 64MiB; 0 = no limit).
    #[arg(long, value_name = "SIZE", value_parser = values::size)]
    pub table_max_bytes: Option<u64>,
    /// Table writer: rows per file (`subsink.table.maxMessages`; default no limit).
    #[arg(long)]
    pub table_max_messages: Option<u64>,
}

impl TableBatchingArgs {
    /// The flags as `subsink.table` (they override the resource's, and are validated with it);
    /// `None` when none is given.
    pub fn table_batching(&self) -> Option<TableBatching> {
        if self.table_max_duration.is_none()
            && self.table_max_bytes.is_none()
            && self.table_max_messages.is_none()
        {
            return None;
        }
        Some(TableBatching {
            max_duration: self.table_max_duration.map(RawDuration::from),
            max_bytes: self.table_max_bytes.map(RawInt::from),
            max_messages: self.table_max_messages.map(RawInt::from),
        })
    }
}

impl SubscriptionArgs {
    /// The subscription from the file or the gcloud-style flags, with `--table-max-*` over its
    /// `subsink.table`, validated (every violation listed).
    pub fn load(&self) -> Result<ValidSubscription, String> {
        let mut resource: Subscription = match &self.subscription {
            Some(path) => config::resource::load(path).map_err(|e| e.to_string())?,
            None => self.gcloud().to_subscription().map_err(|e| e.to_string())?,
        };
        if let Some(path) = &self.message_transforms_file {
            resource.message_transforms = config::transforms::read_file(path)?;
        }
        if let Some(t) = self.table_batching.table_batching() {
            let ext = resource.subsink.get_or_insert_with(Default::default);
            let cur = ext.table.get_or_insert_with(Default::default);
            cur.max_duration = t.max_duration.or(cur.max_duration.take());
            cur.max_bytes = t.max_bytes.or(cur.max_bytes.take());
            cur.max_messages = t.max_messages.or(cur.max_messages.take());
        }
        let valid = config::validate(&resource, self.limits.map(Into::into));
        match (valid, &self.subscription) {
            (Ok(v), _) => Ok(v),
            (Err(e), Some(_)) => Err(e.to_string()),
            (Err(e), None) => Err(as_flags(e)),
        }
    }

    fn gcloud(&self) -> GcloudFlags {
        GcloudFlags {
            subscription_name: self.subscription_name.clone(),
            topic: self.topic.clone(),
            cloud_storage_bucket: self.cloud_storage_bucket.clone(),
            cloud_storage_file_prefix: self.cloud_storage_file_prefix.clone(),
            cloud_storage_file_suffix: self.cloud_storage_file_suffix.clone(),
            cloud_storage_file_datetime_format: self.cloud_storage_file_datetime_format.clone(),
            cloud_storage_max_duration: self.cloud_storage_max_duration.clone(),
            cloud_storage_max_bytes: self.cloud_storage_max_bytes.clone(),
            cloud_storage_max_messages: self.cloud_storage_max_messages.clone(),
            cloud_storage_output_format: self.cloud_storage_output_format.clone(),
            cloud_storage_write_metadata: self.cloud_storage_write_metadata,
            cloud_storage_use_topic_schema: self.cloud_storage_use_topic_schema,
            bigquery_table: self.bigquery_table.clone(),
            use_topic_schema: self.use_topic_schema,
            use_table_schema: self.use_table_schema,
            write_metadata: self.write_metadata,
            drop_unknown_fields: self.drop_unknown_fields,
            dead_letter_topic: self.dead_letter_topic.clone(),
            max_delivery_attempts: self.max_delivery_attempts.clone(),
        }
    }
}

/// A config error of a subscription made from the gcloud-style flags: the way to lift Pub/Sub's
/// limits is the flag `--limits extended` (there is no config file to put
/// `"subsink": {"limits": …}` in).
fn as_flags(e: config::ConfigError) -> String {
    let config::ConfigError::Invalid(violations) = e else {
        return e.to_string();
    };
    let hint = config::validate::LIMITS_HINT;
    let violations = violations
        .into_iter()
        .map(|v| config::Violation {
            rule: v
                .rule
                .replace(hint, "(--limits extended lifts Pub/Sub's limits)"),
            ..v
        })
        .collect();
    config::ConfigError::Invalid(violations).to_string()
}
