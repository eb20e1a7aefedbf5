//! Every rule of docs/contract.md §2–§3 (and §6, §7) applied once, to a parsed [`Subscription`], producing the
//! [`ValidSubscription`] the rest of the crate uses.
//!
//! All violations are collected, not just the first, each with the REST path of the field to fix
//! (`cloudStorageConfig.maxDuration`) and the rule it breaks.
//!
//! Limits mode (docs/contract.md §7): with [`LimitsMode::Pubsub`] (the default) Pub/Sub's numeric limits hold
//! exactly. [`LimitsMode::Extended`] (from `"subsink": {"limits": "extended"}` or the override
//! argument) lifts these, and only these: `maxDuration` (any > 0), `maxBytes` (≥ 1),
//! `maxMessages` (≥ 1) and `ackDeadlineSeconds` (any > 0). Syntax and format rules, and the other
//! ranges (retention, expiration, retry, dead-letter attempts), hold in both modes.

use std::time::Duration;

use super::names::{check_bucket, check_resource_name, check_table};
use super::resource::{RawDuration, RawInt, Subscription};
use super::{
    BigQuerySettings, DeliverySettings, LimitsMode, OutputFormat, StorageSettings,
    ValidSubscription,
};
use crate::naming::{self, DatetimeFormat};

pub use super::error::{ConfigError, Violation};

const MINUTE: u64 = 60;
const DAY: u64 = 24 * 60 * MINUTE;
/// Largest `maxBytes` Pub/Sub accepts: 10 GiB.
const MAX_BYTES_LIMIT: i64 = 10 * (1 << 30);
const MAX_FILTER_BYTES: usize = 256;
/// Table batching default (`subsink.table.maxBytes`): bounds the rows held in memory per file.
pub const DEFAULT_TABLE_MAX_BYTES: u64 = 64 << 20;

/// `subsink.table.maxDuration` when unset: a streamed feed's first row is readable within
/// about this (a BigQuery subscription's within seconds), at 6 times the files of 60 s on a
/// trickle — 330 an hour at 1 message/s, measured (docs/decisions.md, "The table writer's
/// default flush").
pub const DEFAULT_TABLE_MAX_DURATION: Duration = Duration::from_secs(10);
const MAX_OBJECT_NAME_BYTES: usize = 1024;

pub(crate) const LIMITS_HINT: &str =
    "(set \"subsink\": {\"limits\": \"extended\"} to lift Pub/Sub's limits)";

/// Validates `sub`; `limits_override` (e.g. from a CLI flag) wins over `subsink.limits`.
pub fn validate(
    sub: &Subscription,
    limits_override: Option<LimitsMode>,
) -> Result<ValidSubscription, ConfigError> {
    let limits = limits_override
        .or(sub.subsink.as_ref().and_then(|s| s.limits))
        .unwrap_or_default();
    let mut c = Checker {
        violations: Vec::new(),
        limits,
    };

    // Names (docs/contract.md §2.1, §1.2).
    c.names(sub);
    // Delivery kind: at most one of push / BigQuery / Cloud Storage.
    let kinds = c.delivery_kinds(sub);
    // Ack deadline (docs/contract.md §2.4): 0 or unset means 10 s.
    let ack_deadline = c.ack_deadline(sub.ack_deadline_seconds.as_ref());

    // Retention (docs/contract.md §2.2) and expiration (docs/contract.md §2.3, Q13).
    c.retention(sub);
    // Filter (docs/contract.md §2.5): the length, then the grammar (the parser names the position).
    c.filter(sub);
    // Single Message Transforms (docs/transforms.md): limits, names, and the code compiles.
    let transforms = super::transforms::check(&sub.message_transforms, &mut |f, r| c.fail(f, r));

    let dead_letter = c.dead_letter(sub);
    let retry = c.retry(sub);
    c.exactly_once(sub, &kinds);
    let bigquery = c.bigquery_config(sub);
    let storage = c.cloud_storage(sub);
    c.output_states(sub);

    if !c.violations.is_empty() {
        return Err(ConfigError::Invalid(c.violations));
    }
    Ok(ValidSubscription {
        name: sub.name.clone(),
        topic: sub.topic.clone(),
        limits,
        delivery: DeliverySettings {
            ack_deadline,
            enable_message_ordering: sub.enable_message_ordering,
            filter: sub.filter.clone(),
            dead_letter,
            retry,
        },
        storage,
        bigquery,
        transforms,
        resource: sub.clone(),
    })
}

impl Checker {
    /// The subscription's and its topic's names (docs/contract.md §2.1, §1.2).
    fn names(&mut self, sub: &Subscription) {
        if sub.name.is_empty() {
            self.fail(
                "name",
                "required: projects/{project}/subscriptions/{subscription}",
            );
        } else if let Err(rule) = check_resource_name(&sub.name, "subscriptions", "subscription") {
            self.fail("name", rule);
        }
        if sub.topic.is_empty() {
            self.fail("topic", "required: projects/{project}/topics/{topic}");
        } else if sub.topic != "_deleted-topic_" {
            if let Err(rule) = check_resource_name(&sub.topic, "topics", "topic") {
                self.fail("topic", rule);
            }
        }
    }

    /// The delivery kinds set: at most one of push / BigQuery / Cloud Storage.
    fn delivery_kinds(&mut self, sub: &Subscription) -> Vec<&'static str> {
        let kinds: Vec<&'static str> = [
            (
                "pushConfig",
                sub.push_config.as_ref().is_some_and(|p| p.is_push()),
            ),
            ("bigqueryConfig", sub.bigquery_config.is_some()),
            ("cloudStorageConfig", sub.cloud_storage_config.is_some()),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(k, _)| k)
        .collect();
        for extra in kinds.iter().skip(1) {
            self.fail(
                *extra,
                format!(
                    "at most one of pushConfig (with a pushEndpoint), bigqueryConfig and \
                     cloudStorageConfig may be set; found {}",
                    kinds.join(" and ")
                ),
            );
        }
        kinds
    }

    /// Retention (docs/contract.md §2.2) and expiration (docs/contract.md §2.3, Q13).
    fn retention(&mut self, sub: &Subscription) {
        let retention = self
            .duration(
                "messageRetentionDuration",
                sub.message_retention_duration.as_ref(),
            )
            .unwrap_or(Duration::from_secs(7 * DAY));
        self.range(
            "messageRetentionDuration",
            retention,
            Duration::from_secs(10 * MINUTE),
            Duration::from_secs(31 * DAY),
            "10 minutes to 31 days",
        );
        if let Some(ttl_raw) = sub.expiration_policy.as_ref().and_then(|p| p.ttl.as_ref()) {
            if let Some(ttl) = self.duration("expirationPolicy.ttl", Some(ttl_raw)) {
                if ttl < Duration::from_secs(DAY) {
                    self.fail(
                        "expirationPolicy.ttl",
                        format!("must be at least 1 day (86400s), got {ttl_raw}"),
                    );
                } else if ttl < retention {
                    self.fail(
                        "expirationPolicy.ttl",
                        format!(
                            "must be at least the message retention duration ({}), got {ttl_raw}",
                            RawDuration::from(retention)
                        ),
                    );
                }
            }
        }
    }

    /// The filter (docs/contract.md §2.5): the length, then the grammar (the parser names the
    /// position).
    fn filter(&mut self, sub: &Subscription) {
        if sub.filter.len() > MAX_FILTER_BYTES {
            self.fail(
                "filter",
                format!(
                    "must be at most {MAX_FILTER_BYTES} bytes of UTF-8, got {}",
                    sub.filter.len()
                ),
            );
        } else if let Err(e) = crate::filter::Filter::parse(&sub.filter) {
            self.fail("filter", e.to_string());
        }
    }

    /// The dead-letter policy (docs/contract.md §2.8): its topic and max delivery attempts.
    fn dead_letter(&mut self, sub: &Subscription) -> Option<(String, u32)> {
        sub.dead_letter_policy.as_ref().map(|p| {
            if p.dead_letter_topic.is_empty() {
                self.fail(
                    "deadLetterPolicy.deadLetterTopic",
                    "required when deadLetterPolicy is set: projects/{project}/topics/{topic}",
                );
            } else if let Err(rule) = check_resource_name(&p.dead_letter_topic, "topics", "topic") {
                self.fail("deadLetterPolicy.deadLetterTopic", rule);
            }
            let attempts = self
                .int(
                    "deadLetterPolicy.maxDeliveryAttempts",
                    p.max_delivery_attempts.as_ref(),
                )
                .unwrap_or(0);
            let attempts = match attempts {
                0 => 5,
                5..=100 => attempts as u32,
                _ => {
                    self.fail(
                        "deadLetterPolicy.maxDeliveryAttempts",
                        format!("must be between 5 and 100 (0 means 5), got {attempts}"),
                    );
                    5
                }
            };
            (p.dead_letter_topic.clone(), attempts)
        })
    }

    /// The retry policy (docs/contract.md §2.9): one side missing takes its default.
    fn retry(&mut self, sub: &Subscription) -> Option<(Duration, Duration)> {
        sub.retry_policy.as_ref().map(|p| {
            let max_backoff = Duration::from_secs(600);
            let min = self
                .duration("retryPolicy.minimumBackoff", p.minimum_backoff.as_ref())
                .unwrap_or(Duration::from_secs(10));
            let max = self
                .duration("retryPolicy.maximumBackoff", p.maximum_backoff.as_ref())
                .unwrap_or(max_backoff);
            let min_ok = self.range(
                "retryPolicy.minimumBackoff",
                min,
                Duration::ZERO,
                max_backoff,
                "0 to 600 seconds",
            );
            let max_ok = self.range(
                "retryPolicy.maximumBackoff",
                max,
                Duration::ZERO,
                max_backoff,
                "0 to 600 seconds",
            );
            if min_ok && max_ok && min > max {
                self.fail(
                    "retryPolicy.minimumBackoff",
                    format!(
                        "must not exceed maximumBackoff ({}), got {}",
                        RawDuration::from(max),
                        RawDuration::from(min)
                    ),
                );
            }
            (min, max)
        })
    }

    /// Exactly-once delivery (docs/contract.md §2.7): pull subscriptions only.
    fn exactly_once(&mut self, sub: &Subscription, kinds: &[&str]) {
        if sub.enable_exactly_once_delivery {
            if let Some(kind) = kinds.first() {
                self.fail(
                    "enableExactlyOnceDelivery",
                    format!(
                        "only pull subscriptions support exactly-once delivery; remove it or {kind}"
                    ),
                );
            }
        }
    }

    /// The BigQuery config (docs/contract.md §4.2) and the table batching.
    fn bigquery_config(&mut self, sub: &Subscription) -> Option<BigQuerySettings> {
        if let Some(bq) = &sub.bigquery_config {
            if bq.table.is_empty() {
                self.fail(
                    "bigqueryConfig.table",
                    "required: {project}.{dataset}.{table}",
                );
            } else if let Err(rule) = check_table(&bq.table) {
                self.fail("bigqueryConfig.table", rule);
            }
            if bq.use_topic_schema && bq.use_table_schema {
                self.fail(
                    "bigqueryConfig.useTableSchema",
                    "useTopicSchema and useTableSchema are exclusive",
                );
            }
        }
        let batching = sub.subsink.as_ref().and_then(|x| x.table.clone());
        if batching.is_some() && sub.bigquery_config.is_none() {
            self.fail(
                "subsink.table",
                "table batching applies only to a subscription with a bigqueryConfig",
            );
        }
        sub.bigquery_config
            .as_ref()
            .map(|bq| self.bigquery(bq, &batching.unwrap_or_default()))
    }

    /// Partitioned object paths (docs/contract.md §7, objects only), then the Cloud Storage
    /// config (docs/contract.md §3.2–§3.5).
    fn cloud_storage(&mut self, sub: &Subscription) -> Option<StorageSettings> {
        let paths = sub.subsink.as_ref().and_then(|x| x.paths.as_ref());
        if paths.is_some() && sub.cloud_storage_config.is_none() {
            let what = if sub.bigquery_config.is_some() {
                "a BigQuery subscription writes rows to a table, not objects"
            } else {
                "this subscription exports nothing"
            };
            self.fail(
                "subsink.paths",
                format!("partitioned object paths apply only to a subscription with a cloudStorageConfig; {what}"),
            );
        }
        let partitions = match paths {
            Some(p) if sub.cloud_storage_config.is_some() => {
                super::paths::check(p, &mut |f, r| self.fail(f, r))
            }
            _ => None,
        };
        // Cloud Storage (docs/contract.md §3.2–§3.5).
        sub.cloud_storage_config
            .as_ref()
            .map(|cs| self.storage(cs, partitions))
    }

    /// Output-only enums (docs/contract.md §2.1, §3.9, §4.7): ignored, but only Pub/Sub's values
    /// are accepted, so a typo or a value from elsewhere is not taken silently.
    fn output_states(&mut self, sub: &Subscription) {
        let states: [(&str, Option<&String>, &[&str]); 3] = [
            ("state", sub.state.as_ref(), SUBSCRIPTION_STATES),
            (
                "cloudStorageConfig.state",
                sub.cloud_storage_config
                    .as_ref()
                    .and_then(|cs| cs.state.as_ref()),
                CLOUD_STORAGE_STATES,
            ),
            (
                "bigqueryConfig.state",
                sub.bigquery_config
                    .as_ref()
                    .and_then(|bq| bq.state.as_ref()),
                BIGQUERY_STATES,
            ),
        ];
        for (field, value, allowed) in states {
            if let Some(v) = value {
                if !allowed.contains(&v.as_str()) {
                    self.fail(
                        field,
                        format!(
                            "unknown value {v:?}: must be one of {} (output only; ignored)",
                            allowed.join(", ")
                        ),
                    );
                }
            }
        }
    }
}

/// `Subscription.State` (docs/contract.md §2.1).
const SUBSCRIPTION_STATES: &[&str] = &["STATE_UNSPECIFIED", "ACTIVE", "RESOURCE_ERROR"];
/// `CloudStorageConfig.State` (docs/contract.md §3.9).
const CLOUD_STORAGE_STATES: &[&str] = &[
    "STATE_UNSPECIFIED",
    "ACTIVE",
    "PERMISSION_DENIED",
    "NOT_FOUND",
    "IN_TRANSIT_LOCATION_RESTRICTION",
    "SCHEMA_MISMATCH",
    "VERTEX_AI_LOCATION_RESTRICTION",
];
/// `BigQueryConfig.State` (docs/contract.md §4.7).
const BIGQUERY_STATES: &[&str] = &[
    "STATE_UNSPECIFIED",
    "ACTIVE",
    "PERMISSION_DENIED",
    "NOT_FOUND",
    "SCHEMA_MISMATCH",
    "IN_TRANSIT_LOCATION_RESTRICTION",
    "VERTEX_AI_LOCATION_RESTRICTION",
];

/// Collects violations; every check returns a usable value (the default on failure) so one
/// pass finds everything.
struct Checker {
    violations: Vec<Violation>,
    limits: LimitsMode,
}

impl Checker {
    fn fail(&mut self, field: impl Into<String>, rule: impl Into<String>) {
        self.violations.push(Violation {
            field: field.into(),
            rule: rule.into(),
        });
    }

    fn extended(&self) -> bool {
        self.limits == LimitsMode::Extended
    }

    /// Parses an optional duration; `None` when unset or invalid (a violation is recorded).
    fn duration(&mut self, field: &str, raw: Option<&RawDuration>) -> Option<Duration> {
        match raw?.parse() {
            Ok(d) => Some(d),
            Err(rule) => {
                self.fail(field, rule);
                None
            }
        }
    }

    /// Parses an optional integer; `None` when unset or invalid (a violation is recorded).
    fn int(&mut self, field: &str, raw: Option<&RawInt>) -> Option<i64> {
        match raw?.parse() {
            Ok(n) => Some(n),
            Err(rule) => {
                self.fail(field, rule);
                None
            }
        }
    }

    /// Records a violation unless `min <= d <= max`; returns whether `d` is in range.
    fn range(
        &mut self,
        field: &str,
        d: Duration,
        min: Duration,
        max: Duration,
        human: &str,
    ) -> bool {
        if d < min || d > max {
            self.fail(
                field,
                format!(
                    "must be between {} and {} ({human}), got {}",
                    RawDuration::from(min),
                    RawDuration::from(max),
                    RawDuration::from(d)
                ),
            );
            return false;
        }
        true
    }

    fn ack_deadline(&mut self, raw: Option<&RawInt>) -> Duration {
        let field = "ackDeadlineSeconds";
        let default = Duration::from_secs(10);
        let Some(secs) = self.int(field, raw) else {
            return default;
        };
        match secs {
            0 => default,
            s if s < 0 => {
                self.fail(field, format!("must not be negative, got {s}"));
                default
            }
            s if self.extended() || (10..=600).contains(&s) => Duration::from_secs(s as u64),
            s => {
                self.fail(
                    field,
                    format!("must be between 10 and 600 (0 means 10), got {s} {LIMITS_HINT}"),
                );
                default
            }
        }
    }

    /// `maxBytes` / `maxMessages`: unset or 0 means "no limit" (protobuf's unset int64).
    fn optional_limit(
        &mut self,
        field: &str,
        raw: Option<&RawInt>,
        min: i64,
        max: i64,
    ) -> Option<u64> {
        let n = self.int(field, raw)?;
        if n == 0 {
            return None;
        }
        if n < 0 {
            self.fail(field, format!("must not be negative, got {n}"));
            return None;
        }
        if self.extended() || (min..=max).contains(&n) {
            return Some(n as u64);
        }
        let rule = if max == i64::MAX {
            format!("must be at least {min} (0 or unset means no limit), got {n} {LIMITS_HINT}")
        } else {
            format!(
                "must be between {min} and {max} (0 or unset means no limit), got {n} {LIMITS_HINT}"
            )
        };
        self.fail(field, rule);
        None
    }

    /// The BigQuery settings and subsink's table batching (`subsink.table`, docs/contract.md §7): subsink's
    /// own limits, so only `> 0` is required whatever the limits mode.
    fn bigquery(
        &mut self,
        bq: &super::resource::BigQueryConfig,
        b: &super::resource::TableBatching,
    ) -> BigQuerySettings {
        const F: &str = "subsink.table";
        let default_duration = DEFAULT_TABLE_MAX_DURATION;
        let max_duration = match self.duration(&format!("{F}.maxDuration"), b.max_duration.as_ref())
        {
            None => default_duration,
            Some(d) if d.is_zero() => {
                self.fail(format!("{F}.maxDuration"), "must be greater than 0s");
                default_duration
            }
            Some(d) => d,
        };
        let max_bytes = match &b.max_bytes {
            None => Some(DEFAULT_TABLE_MAX_BYTES),
            raw => self.optional_limit(&format!("{F}.maxBytes"), raw.as_ref(), 1, i64::MAX),
        };
        let max_messages = self.optional_limit(
            &format!("{F}.maxMessages"),
            b.max_messages.as_ref(),
            1,
            i64::MAX,
        );
        BigQuerySettings {
            table: bq.table.clone(),
            use_topic_schema: bq.use_topic_schema,
            use_table_schema: bq.use_table_schema,
            write_metadata: bq.write_metadata,
            drop_unknown_fields: bq.drop_unknown_fields,
            max_duration,
            max_bytes,
            max_messages,
        }
    }

    fn storage(
        &mut self,
        cs: &super::resource::CloudStorageConfig,
        partitions: Option<super::PathPartitions>,
    ) -> StorageSettings {
        const F: &str = "cloudStorageConfig";
        self.object_name_parts(cs);
        let datetime_format = self.datetime_format(cs, partitions.as_ref());
        let output = self.output_format(cs);
        let max_duration = self.storage_max_duration(cs);

        let max_bytes = self.optional_limit(
            &format!("{F}.maxBytes"),
            cs.max_bytes.as_ref(),
            1000,
            MAX_BYTES_LIMIT,
        );
        let max_messages = self.optional_limit(
            &format!("{F}.maxMessages"),
            cs.max_messages.as_ref(),
            1000,
            i64::MAX,
        );

        StorageSettings {
            bucket: cs.bucket.clone(),
            filename_prefix: cs.filename_prefix.clone(),
            filename_suffix: cs.filename_suffix.clone(),
            datetime_format,
            max_duration,
            max_bytes,
            max_messages,
            output,
            partitions,
        }
    }

    /// The bucket, and the object-name rules of the prefix and suffix alone.
    fn object_name_parts(&mut self, cs: &super::resource::CloudStorageConfig) {
        const F: &str = "cloudStorageConfig";
        if cs.bucket.is_empty() {
            self.fail(
                format!("{F}.bucket"),
                "required: a bare bucket name such as my-bucket",
            );
        } else if let Err(rule) = check_bucket(&cs.bucket) {
            self.fail(format!("{F}.bucket"), rule);
        }

        for (field, value) in [
            ("filenamePrefix", &cs.filename_prefix),
            ("filenameSuffix", &cs.filename_suffix),
        ] {
            if value.contains(['\r', '\n']) {
                self.fail(
                    format!("{F}.{field}"),
                    "must not contain CR or LF (Cloud Storage object-name rule)",
                );
            }
        }
        if cs
            .filename_prefix
            .starts_with(".well-known/acme-challenge/")
        {
            self.fail(
                format!("{F}.filenamePrefix"),
                "object names must not start with .well-known/acme-challenge/",
            );
        }
        if cs.filename_suffix.ends_with('/') {
            self.fail(format!("{F}.filenameSuffix"), "must not end with '/'");
        }
    }

    /// The datetime format of object names, and the names it makes with the prefix, suffix and
    /// partition directories (their length, whether Cloud Storage stores them).
    fn datetime_format(
        &mut self,
        cs: &super::resource::CloudStorageConfig,
        partitions: Option<&super::PathPartitions>,
    ) -> DatetimeFormat {
        const F: &str = "cloudStorageConfig";
        match DatetimeFormat::parse(&cs.filename_datetime_format) {
            Ok(fmt) => {
                let dirs = partitions.map_or(0, |p| p.fixed_len());
                let len = naming::max_rendered_len(&cs.filename_prefix, &fmt, &cs.filename_suffix);
                if dirs > 0 && len + dirs > MAX_OBJECT_NAME_BYTES {
                    self.fail(
                        "subsink.paths",
                        format!(
                            "object names would be at least {} bytes (partition directories \
                             {dirs} + the name {len}); Cloud Storage allows at most \
                             {MAX_OBJECT_NAME_BYTES}",
                            len + dirs
                        ),
                    );
                } else if len > MAX_OBJECT_NAME_BYTES {
                    let field = if cs.filename_prefix.len() >= cs.filename_suffix.len() {
                        "filenamePrefix"
                    } else {
                        "filenameSuffix"
                    };
                    self.fail(
                        format!("{F}.{field}"),
                        format!(
                            "object names would be {len} bytes (prefix {} + datetime and uuid {} \
                             + suffix {}); Cloud Storage allows at most {MAX_OBJECT_NAME_BYTES}",
                            cs.filename_prefix.len(),
                            len - cs.filename_prefix.len() - cs.filename_suffix.len(),
                            cs.filename_suffix.len()
                        ),
                    );
                }
                // CR and LF have their own rule above.
                let crlf = |s: &str| s.contains(['\r', '\n']);
                if !crlf(&cs.filename_prefix) && !crlf(&cs.filename_suffix) {
                    // With partitioned paths a directory `k=v/` comes between the prefix's
                    // directory and its file-name part: the datetime may then follow a `/`.
                    let prefix = match &partitions {
                        None => cs.filename_prefix.clone(),
                        Some(_) => {
                            let (dir, file) = naming::split_prefix(&cs.filename_prefix);
                            format!("{dir}k=v/{file}")
                        }
                    };
                    if let Err(e) = naming::check_storable(&prefix, &fmt, &cs.filename_suffix) {
                        let field = match e.part {
                            naming::NamePart::Prefix => "filenamePrefix",
                            naming::NamePart::DatetimeFormat => "filenameDatetimeFormat",
                            naming::NamePart::Suffix => "filenameSuffix",
                        };
                        self.fail(format!("{F}.{field}"), e.to_string());
                    }
                }
                fmt
            }
            Err(e) => {
                self.fail(format!("{F}.filenameDatetimeFormat"), e.to_string());
                DatetimeFormat::default()
            }
        }
    }

    /// The object format: text (the default) or Avro.
    fn output_format(&mut self, cs: &super::resource::CloudStorageConfig) -> OutputFormat {
        const F: &str = "cloudStorageConfig";
        match (&cs.text_config, &cs.avro_config) {
            (Some(_), Some(_)) => {
                self.fail(
                    format!("{F}.avroConfig"),
                    "textConfig and avroConfig are exclusive (set one; neither means text)",
                );
                OutputFormat::Text
            }
            (_, Some(avro)) => OutputFormat::Avro {
                write_metadata: avro.write_metadata,
                use_topic_schema: avro.use_topic_schema,
            },
            _ => OutputFormat::Text,
        }
    }

    /// `maxDuration` of a Cloud Storage file (docs/contract.md §3.5, §7).
    fn storage_max_duration(&mut self, cs: &super::resource::CloudStorageConfig) -> Duration {
        const F: &str = "cloudStorageConfig";
        let default_duration = Duration::from_secs(5 * MINUTE);
        match self.duration(&format!("{F}.maxDuration"), cs.max_duration.as_ref()) {
            None => default_duration,
            Some(d) if self.extended() => {
                if d.is_zero() {
                    self.fail(format!("{F}.maxDuration"), "must be greater than 0s");
                    default_duration
                } else {
                    d
                }
            }
            Some(d) => {
                let min = Duration::from_secs(MINUTE);
                let max = Duration::from_secs(10 * MINUTE);
                if d < min || d > max {
                    self.fail(
                        format!("{F}.maxDuration"),
                        format!(
                            "must be between 60s and 600s (1 to 10 minutes), got {} {LIMITS_HINT}",
                            RawDuration::from(d)
                        ),
                    );
                    default_duration
                } else {
                    d
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// What `gcloud pubsub subscriptions describe --format=json` prints for a Cloud Storage
    /// subscription, output-only fields included, plus every other field of the resource.
    fn describe_json() -> Value {
        json!({
            "ackDeadlineSeconds": 60,
            "analyticsHubSubscriptionInfo": {
                "listing": "projects/123/locations/us/dataExchanges/x/listings/y",
                "subscription": "projects/other/locations/us/subscriptions/z"
            },
            "cloudStorageConfig": {
                "avroConfig": {"writeMetadata": true, "useTopicSchema": false},
                "bucket": "my-bucket",
                "filenameDatetimeFormat": "YYYY-MM-DD/hh_mm_ssZ",
                "filenamePrefix": "prod_",
                "filenameSuffix": "_archive",
                "maxBytes": "10000000",
                "maxDuration": "300s",
                "maxMessages": "1000",
                "serviceAccountEmail": "writer@my-project.iam.gserviceaccount.com",
                "state": "ACTIVE"
            },
            "deadLetterPolicy": {
                "deadLetterTopic": "projects/my-project/topics/dead-letters",
                "maxDeliveryAttempts": 10
            },
            "detached": false,
            "enableExactlyOnceDelivery": false,
            "enableMessageOrdering": true,
            "expirationPolicy": {"ttl": "2678400s"},
            "filter": "attributes:domain",
            "labels": {"env": "prod"},
            "messageRetentionDuration": "604800s",
            "messageTransforms": [
                {"javascriptUdf": {"functionName": "f", "code": "function f(m, meta) { return m; }"}}
            ],
            "name": "projects/my-project/subscriptions/my-export",
            "pushConfig": {},
            "retainAckedMessages": false,
            "retryPolicy": {"minimumBackoff": "10s", "maximumBackoff": "600s"},
            "state": "ACTIVE",
            "tags": {"tagKeys/123": "tagValues/456"},
            "topic": "projects/my-project/topics/events",
            "topicMessageRetentionDuration": "86400s",
            "subsink": {"limits": "pubsub"}
        })
    }

    const DESCRIBE_YAML: &str = r#"
ackDeadlineSeconds: 60
analyticsHubSubscriptionInfo:
  listing: projects/123/locations/us/dataExchanges/x/listings/y
  subscription: projects/other/locations/us/subscriptions/z
cloudStorageConfig:
  avroConfig:
    writeMetadata: true
    useTopicSchema: false
  bucket: my-bucket
  filenameDatetimeFormat: YYYY-MM-DD/hh_mm_ssZ
  filenamePrefix: prod_
  filenameSuffix: _archive
  maxBytes: '10000000'
  maxDuration: 300s
  maxMessages: '1000'
  serviceAccountEmail: writer@my-project.iam.gserviceaccount.com
  state: ACTIVE
deadLetterPolicy:
  deadLetterTopic: projects/my-project/topics/dead-letters
  maxDeliveryAttempts: 10
detached: false
enableExactlyOnceDelivery: false
enableMessageOrdering: true
expirationPolicy:
  ttl: 2678400s
filter: attributes:domain
labels:
  env: prod
messageRetentionDuration: 604800s
messageTransforms:
- javascriptUdf:
    functionName: f
    code: 'function f(m, meta) { return m; }'
name: projects/my-project/subscriptions/my-export
pushConfig: {}
retainAckedMessages: false
retryPolicy:
  minimumBackoff: 10s
  maximumBackoff: 600s
state: ACTIVE
tags:
  tagKeys/123: tagValues/456
topic: projects/my-project/topics/events
topicMessageRetentionDuration: 86400s
subsink:
  limits: pubsub
"#;

    fn parse(v: &Value) -> Subscription {
        Subscription::from_str_any(&v.to_string(), "test.json").unwrap()
    }

    /// Sets (or, with `Value::Null`, removes) the field at a dotted REST path.
    fn set(v: &mut Value, path: &str, value: Value) {
        let mut cur = v;
        let parts: Vec<&str> = path.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            let obj = cur.as_object_mut().unwrap();
            cur = obj.entry(p.to_string()).or_insert_with(|| json!({}));
        }
        let obj = cur.as_object_mut().unwrap();
        let last = parts[parts.len() - 1];
        if value.is_null() {
            obj.remove(last);
        } else {
            obj.insert(last.to_string(), value);
        }
    }

    fn with(patches: &[(&str, Value)]) -> Value {
        let mut v = describe_json();
        for (path, value) in patches {
            set(&mut v, path, value.clone());
        }
        v
    }

    fn fields(result: Result<ValidSubscription, ConfigError>) -> Vec<String> {
        match result {
            Ok(_) => vec![],
            Err(e) => e.violations().iter().map(|v| v.field.clone()).collect(),
        }
    }

    #[test]
    fn gcloud_describe_json_is_valid() {
        let sub = parse(&describe_json());
        let valid = validate(&sub, None).unwrap();
        assert_eq!(valid.name, "projects/my-project/subscriptions/my-export");
        assert_eq!(valid.topic, "projects/my-project/topics/events");
        assert_eq!(valid.limits, LimitsMode::Pubsub);
        assert_eq!(valid.delivery.ack_deadline, Duration::from_secs(60));
        assert!(valid.delivery.enable_message_ordering);
        assert_eq!(valid.delivery.filter, "attributes:domain");
        assert_eq!(
            valid.delivery.dead_letter,
            Some(("projects/my-project/topics/dead-letters".to_string(), 10))
        );
        assert_eq!(
            valid.delivery.retry,
            Some((Duration::from_secs(10), Duration::from_secs(600)))
        );
        let s = valid.storage.unwrap();
        assert_eq!(s.bucket, "my-bucket");
        assert_eq!(s.filename_prefix, "prod_");
        assert_eq!(s.filename_suffix, "_archive");
        assert_eq!(s.datetime_format.as_str(), "YYYY-MM-DD/hh_mm_ssZ");
        assert_eq!(s.max_duration, Duration::from_secs(300));
        assert_eq!(s.max_bytes, Some(10_000_000));
        assert_eq!(s.max_messages, Some(1000));
        assert_eq!(
            s.output,
            OutputFormat::Avro {
                write_metadata: true,
                use_topic_schema: false
            }
        );
        assert_eq!(valid.resource, sub);
    }

    #[test]
    fn yaml_equivalent_parses_to_the_same_resource() {
        let yaml = Subscription::from_str_any(DESCRIBE_YAML, "test.yaml").unwrap();
        assert_eq!(yaml, parse(&describe_json()));
        validate(&yaml, None).unwrap();
    }

    #[test]
    fn defaults_of_a_minimal_subscription() {
        let sub = parse(&json!({
            "name": "projects/p/subscriptions/sub",
            "topic": "projects/p/topics/top",
            "cloudStorageConfig": {"bucket": "b-1"}
        }));
        let v = validate(&sub, None).unwrap();
        assert_eq!(v.delivery.ack_deadline, Duration::from_secs(10));
        assert_eq!(v.delivery.dead_letter, None);
        assert_eq!(v.delivery.retry, None);
        let s = v.storage.unwrap();
        assert_eq!(s.max_duration, Duration::from_secs(300));
        assert_eq!((s.max_bytes, s.max_messages), (None, None));
        assert_eq!(s.output, OutputFormat::Text);
        assert_eq!(s.datetime_format, DatetimeFormat::default());

        // Pull subscription: no storage settings.
        let pull =
            parse(&json!({"name": "projects/p/subscriptions/sub", "topic": "_deleted-topic_"}));
        assert!(validate(&pull, None).unwrap().storage.is_none());

        // Dead-letter 0 means 5; retry with one side missing takes the other default.
        let sub = parse(&json!({
            "name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top",
            "ackDeadlineSeconds": 0,
            "deadLetterPolicy": {"deadLetterTopic": "projects/q/topics/dead", "maxDeliveryAttempts": 0},
            "retryPolicy": {"maximumBackoff": "30s"},
            "expirationPolicy": {}
        }));
        let v = validate(&sub, None).unwrap();
        assert_eq!(v.delivery.ack_deadline, Duration::from_secs(10));
        assert_eq!(
            v.delivery.dead_letter,
            Some(("projects/q/topics/dead".into(), 5))
        );
        assert_eq!(
            v.delivery.retry,
            Some((Duration::from_secs(10), Duration::from_secs(30)))
        );
        let sub = parse(&json!({
            "name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top",
            "retryPolicy": {"minimumBackoff": "1.5s"}
        }));
        assert_eq!(
            validate(&sub, None).unwrap().delivery.retry,
            Some((Duration::from_millis(1500), Duration::from_secs(600)))
        );
    }

    /// One case per rule: the patch, and the single field path reported.
    #[test]
    fn each_rule_reports_its_field() {
        let long = "a".repeat(1000);
        let cases: Vec<(Vec<(&str, Value)>, &str)> = vec![
            (vec![("name", Value::Null)], "name"),
            (vec![("name", json!("my-export"))], "name"),
            (vec![("name", json!("projects/p/topics/my-export"))], "name"),
            (
                vec![("name", json!("projects/p/subscriptions/1abc"))],
                "name",
            ),
            (vec![("name", json!("projects/p/subscriptions/ab"))], "name"),
            (
                vec![("name", json!("projects/p/subscriptions/goog-sub"))],
                "name",
            ),
            (
                vec![("name", json!("projects/p/subscriptions/a b c"))],
                "name",
            ),
            (
                vec![(
                    "name",
                    json!(format!("projects/p/subscriptions/a{}", "b".repeat(255))),
                )],
                "name",
            ),
            (vec![("name", json!("projects//subscriptions/abc"))], "name"),
            (vec![("topic", Value::Null)], "topic"),
            (vec![("topic", json!("projects/p/topics/t"))], "topic"),
            (vec![("topic", json!("events"))], "topic"),
            (
                vec![(
                    "pushConfig",
                    json!({"pushEndpoint": "https://example.com/push"}),
                )],
                "cloudStorageConfig",
            ),
            (
                vec![("bigqueryConfig", json!({"table": "p.d.t"}))],
                "cloudStorageConfig",
            ),
            (vec![("ackDeadlineSeconds", json!(5))], "ackDeadlineSeconds"),
            (
                vec![("ackDeadlineSeconds", json!(601))],
                "ackDeadlineSeconds",
            ),
            (
                vec![("ackDeadlineSeconds", json!(-1))],
                "ackDeadlineSeconds",
            ),
            (
                vec![("ackDeadlineSeconds", json!("ten"))],
                "ackDeadlineSeconds",
            ),
            (
                vec![("messageRetentionDuration", json!("599s"))],
                "messageRetentionDuration",
            ),
            (
                vec![
                    ("messageRetentionDuration", json!("2678401s")),
                    ("expirationPolicy", Value::Null),
                ],
                "messageRetentionDuration",
            ),
            (
                vec![("messageRetentionDuration", json!("7d"))],
                "messageRetentionDuration",
            ),
            (
                vec![("expirationPolicy.ttl", json!("86399s"))],
                "expirationPolicy.ttl",
            ),
            (
                vec![("expirationPolicy.ttl", json!("86400s"))],
                "expirationPolicy.ttl",
            ), // < 7 d retention
            (
                vec![("expirationPolicy.ttl", json!("1 day"))],
                "expirationPolicy.ttl",
            ),
            (vec![("filter", json!("x".repeat(257)))], "filter"),
            (vec![("filter", json!("é".repeat(129)))], "filter"), // 258 bytes, 129 chars
            (
                vec![("deadLetterPolicy.deadLetterTopic", Value::Null)],
                "deadLetterPolicy.deadLetterTopic",
            ),
            (
                vec![("deadLetterPolicy.deadLetterTopic", json!("dead-letters"))],
                "deadLetterPolicy.deadLetterTopic",
            ),
            (
                vec![("deadLetterPolicy.maxDeliveryAttempts", json!(4))],
                "deadLetterPolicy.maxDeliveryAttempts",
            ),
            (
                vec![("deadLetterPolicy.maxDeliveryAttempts", json!(101))],
                "deadLetterPolicy.maxDeliveryAttempts",
            ),
            (
                vec![("retryPolicy.minimumBackoff", json!("601s"))],
                "retryPolicy.minimumBackoff",
            ),
            (
                vec![("retryPolicy.maximumBackoff", json!("601s"))],
                "retryPolicy.maximumBackoff",
            ),
            (
                vec![("retryPolicy.maximumBackoff", json!("5s"))],
                "retryPolicy.minimumBackoff",
            ), // min 10 s > max
            (
                vec![("retryPolicy.minimumBackoff", json!("-1s"))],
                "retryPolicy.minimumBackoff",
            ),
            (
                vec![("enableExactlyOnceDelivery", json!(true))],
                "enableExactlyOnceDelivery",
            ),
            (
                vec![("cloudStorageConfig.bucket", Value::Null)],
                "cloudStorageConfig.bucket",
            ),
            (
                vec![("cloudStorageConfig.bucket", json!("gs://my-bucket"))],
                "cloudStorageConfig.bucket",
            ),
            (
                vec![("cloudStorageConfig.bucket", json!("my-bucket/dir"))],
                "cloudStorageConfig.bucket",
            ),
            (
                vec![("cloudStorageConfig.bucket", json!("My-Bucket"))],
                "cloudStorageConfig.bucket",
            ),
            (
                vec![("cloudStorageConfig.bucket", json!("ab"))],
                "cloudStorageConfig.bucket",
            ),
            (
                vec![("cloudStorageConfig.bucket", json!("b".repeat(64)))],
                "cloudStorageConfig.bucket",
            ),
            (
                vec![("cloudStorageConfig.bucket", json!("-bucket"))],
                "cloudStorageConfig.bucket",
            ),
            (
                vec![("cloudStorageConfig.bucket", json!("bucket_"))],
                "cloudStorageConfig.bucket",
            ),
            (
                vec![("cloudStorageConfig.bucket", json!("my-google-bucket"))],
                "cloudStorageConfig.bucket",
            ),
            (
                vec![("cloudStorageConfig.filenamePrefix", json!("a\nb"))],
                "cloudStorageConfig.filenamePrefix",
            ),
            (
                vec![("cloudStorageConfig.filenameSuffix", json!("a\rb"))],
                "cloudStorageConfig.filenameSuffix",
            ),
            (
                vec![("cloudStorageConfig.filenameSuffix", json!("dir/"))],
                "cloudStorageConfig.filenameSuffix",
            ),
            (
                vec![(
                    "cloudStorageConfig.filenamePrefix",
                    json!(".well-known/acme-challenge/x"),
                )],
                "cloudStorageConfig.filenamePrefix",
            ),
            (
                vec![(
                    "cloudStorageConfig.filenameDatetimeFormat",
                    json!("YYYY.MM.DD"),
                )],
                "cloudStorageConfig.filenameDatetimeFormat",
            ),
            (
                vec![("cloudStorageConfig.filenamePrefix", json!(long))],
                "cloudStorageConfig.filenamePrefix",
            ),
            (
                vec![("cloudStorageConfig.filenameSuffix", json!("s".repeat(1000)))],
                "cloudStorageConfig.filenameSuffix",
            ),
            (
                vec![("cloudStorageConfig.textConfig", json!({}))],
                "cloudStorageConfig.avroConfig",
            ),
            (
                vec![("cloudStorageConfig.maxDuration", json!("59s"))],
                "cloudStorageConfig.maxDuration",
            ),
            (
                vec![("cloudStorageConfig.maxDuration", json!("601s"))],
                "cloudStorageConfig.maxDuration",
            ),
            (
                vec![("cloudStorageConfig.maxDuration", json!("5m"))],
                "cloudStorageConfig.maxDuration",
            ),
            (
                vec![("cloudStorageConfig.maxBytes", json!("999"))],
                "cloudStorageConfig.maxBytes",
            ),
            (
                vec![("cloudStorageConfig.maxBytes", json!("10737418241"))],
                "cloudStorageConfig.maxBytes",
            ),
            (
                vec![("cloudStorageConfig.maxBytes", json!("-1"))],
                "cloudStorageConfig.maxBytes",
            ),
            (
                vec![("cloudStorageConfig.maxBytes", json!("10MB"))],
                "cloudStorageConfig.maxBytes",
            ),
            (
                vec![("cloudStorageConfig.maxMessages", json!(999))],
                "cloudStorageConfig.maxMessages",
            ),
            (
                vec![("cloudStorageConfig.maxMessages", json!(1.5))],
                "cloudStorageConfig.maxMessages",
            ),
        ];
        for (patches, want) in cases {
            let v = with(&patches);
            let got = fields(validate(&parse(&v), None));
            assert_eq!(got, vec![want.to_string()], "patches {patches:?}");
        }
    }

    /// Issue 13: names with an empty, `.` or `..` segment (or an ASCII control character)
    /// validated, then every message failed at upload. Refused, naming the field to fix.
    #[test]
    fn names_a_store_cannot_hold_are_refused() {
        for (prefix, format, suffix, field, problem) in [
            (
                "logs/",
                "/YYYY/MM/DD/hh/mm/ss",
                "",
                "filenameDatetimeFormat",
                "empty path segment",
            ),
            ("a//b/", "", "", "filenamePrefix", "empty path segment"),
            ("//", "", "", "filenamePrefix", "empty path segment"),
            ("./", "", "", "filenamePrefix", "a `.` path segment"),
            ("../", "", "", "filenamePrefix", "a `..` path segment"),
            ("a/../", "", "", "filenamePrefix", "a `..` path segment"),
            (
                "logs/",
                "YYYY//MM-DD-hh-mm-ss",
                "",
                "filenameDatetimeFormat",
                "empty path segment",
            ),
            ("", "", "//x", "filenameSuffix", "empty path segment"),
            ("", "", "/./x", "filenameSuffix", "a `.` path segment"),
            ("", "", "/../x", "filenameSuffix", "a `..` path segment"),
            (
                "a\tb/",
                "",
                "",
                "filenamePrefix",
                "the control character '\\t'",
            ),
            ("", "", "\u{1}", "filenameSuffix", "control character"),
        ] {
            let v = with(&[
                ("cloudStorageConfig.filenamePrefix", json!(prefix)),
                ("cloudStorageConfig.filenameDatetimeFormat", json!(format)),
                ("cloudStorageConfig.filenameSuffix", json!(suffix)),
            ]);
            let err = validate(&parse(&v), None).unwrap_err();
            let got = err.violations();
            assert_eq!(got.len(), 1, "{prefix:?} {format:?} {suffix:?}: {err}");
            assert_eq!(
                got[0].field,
                format!("cloudStorageConfig.{field}"),
                "{prefix:?} {format:?} {suffix:?}"
            );
            assert!(got[0].rule.contains(problem), "{}", got[0].rule);
            assert!(got[0].rule.contains("object_store"), "{}", got[0].rule);
        }
        // Storable: a leading `/` (dropped by the store), dots inside segments, spaces.
        for (prefix, format) in [
            ("", "/YYYY/MM/DD/hh/mm/ss"),
            ("/logs/", ""),
            ("logs", "/YYYY/MM/DD/hh/mm/ss"),
            (".hidden/..x/a.b/", ""),
            ("logs/", "YYYY/MM/DD/hh/mm/ss/"),
        ] {
            let v = with(&[
                ("cloudStorageConfig.filenamePrefix", json!(prefix)),
                ("cloudStorageConfig.filenameDatetimeFormat", json!(format)),
                ("cloudStorageConfig.filenameSuffix", json!("")),
            ]);
            assert_eq!(
                fields(validate(&parse(&v), None)),
                Vec::<String>::new(),
                "{prefix:?} {format:?}"
            );
        }
    }

    /// Issue 13, a decision that stays: dropUnknownFields without a schema option is accepted
    /// (a no-op, as in Pub/Sub) with a warning.
    #[test]
    fn drop_unknown_fields_without_a_schema_option_warns() {
        let base =
            json!({"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top"});
        for (config, warns) in [
            (json!({"table": "p.d.t", "dropUnknownFields": true}), true),
            (
                json!({"table": "p.d.t", "dropUnknownFields": true, "useTableSchema": true}),
                false,
            ),
            (
                json!({"table": "p.d.t", "dropUnknownFields": true, "useTopicSchema": true}),
                false,
            ),
            (json!({"table": "p.d.t"}), false),
        ] {
            let mut v = base.clone();
            set(&mut v, "bigqueryConfig", config.clone());
            let w = validate(&parse(&v), None).unwrap().warnings();
            assert_eq!(w.len(), usize::from(warns), "{config}: {w:?}");
            if warns {
                assert!(w[0].contains("dropUnknownFields has no effect"), "{w:?}");
            }
        }
    }

    /// Issue 13: Cloud Storage forbids bucket names that look like an IPv4 address.
    #[test]
    fn a_bucket_named_like_an_ip_address_is_refused() {
        for bucket in ["192.168.5.4", "0.0.0.0", "255.255.255.255", "10.0.0.01"] {
            let v = with(&[("cloudStorageConfig.bucket", json!(bucket))]);
            let err = validate(&parse(&v), None).unwrap_err();
            assert_eq!(err.violations()[0].field, "cloudStorageConfig.bucket");
            assert_eq!(err.violations().len(), 1);
            assert!(err.to_string().contains("IP address"), "{err}");
        }
        for bucket in [
            "192.168.5",
            "192.168.5.4.5",
            "256.1.1.1",
            "1.2.3.a4",
            "1234.1.1.1",
        ] {
            let v = with(&[("cloudStorageConfig.bucket", json!(bucket))]);
            assert_eq!(
                fields(validate(&parse(&v), None)),
                Vec::<String>::new(),
                "{bucket}"
            );
        }
    }

    /// Issue 13: output-only enums take only their documented values, listed in the error.
    #[test]
    fn unknown_enum_values_are_refused_with_the_documented_ones() {
        for (path, good, list) in [
            ("state", "RESOURCE_ERROR", "STATE_UNSPECIFIED, ACTIVE, RESOURCE_ERROR"),
            ("cloudStorageConfig.state", "VERTEX_AI_LOCATION_RESTRICTION", "STATE_UNSPECIFIED, ACTIVE, PERMISSION_DENIED, NOT_FOUND, IN_TRANSIT_LOCATION_RESTRICTION, SCHEMA_MISMATCH, VERTEX_AI_LOCATION_RESTRICTION"),
        ] {
            let v = with(&[(path, json!(good))]);
            assert_eq!(fields(validate(&parse(&v), None)), Vec::<String>::new(), "{path}");
            for bad in ["BOGUS", "active", ""] {
                let v = with(&[(path, json!(bad))]);
                let err = validate(&parse(&v), None).unwrap_err();
                assert_eq!(err.violations().len(), 1, "{err}");
                assert_eq!(err.violations()[0].field, path);
                assert!(err.to_string().contains(list), "{err}");
            }
        }
        let base =
            json!({"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top"});
        for (state, ok) in [
            ("SCHEMA_MISMATCH", true),
            ("NOT_FOUND", true),
            ("RESOURCE_ERROR", false),
        ] {
            let mut v = base.clone();
            set(
                &mut v,
                "bigqueryConfig",
                json!({"table": "p.d.t", "state": state}),
            );
            let got = fields(validate(&parse(&v), None));
            assert_eq!(got.is_empty(), ok, "{state}: {got:?}");
        }
    }

    #[test]
    fn bigquery_rules() {
        let base =
            json!({"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top"});
        let mut ok = base.clone();
        set(
            &mut ok,
            "bigqueryConfig",
            json!({"table": "p:d.t", "useTopicSchema": true, "writeMetadata": true, "state": "ACTIVE"}),
        );
        let v = validate(&parse(&ok), None).unwrap();
        assert!(v.storage.is_none());

        for (config, want) in [
            (
                json!({"table": "p.d.t", "useTopicSchema": true, "useTableSchema": true}),
                "bigqueryConfig.useTableSchema",
            ),
            (json!({}), "bigqueryConfig.table"),
            (json!({"table": "dataset.table"}), "bigqueryConfig.table"),
            (json!({"table": "p..t"}), "bigqueryConfig.table"),
        ] {
            let mut v = base.clone();
            set(&mut v, "bigqueryConfig", config);
            assert_eq!(fields(validate(&parse(&v), None)), vec![want.to_string()]);
        }
    }

    #[test]
    fn accepted_edge_values() {
        for patches in [
            vec![("cloudStorageConfig.maxDuration", json!("60s"))],
            vec![("cloudStorageConfig.maxDuration", json!("600s"))],
            vec![("cloudStorageConfig.maxDuration", json!(90))],
            vec![("cloudStorageConfig.maxBytes", json!("1000"))],
            vec![("cloudStorageConfig.maxBytes", json!(10737418240u64))],
            vec![("cloudStorageConfig.maxBytes", json!("0"))],
            vec![("cloudStorageConfig.maxMessages", json!("0"))],
            vec![("cloudStorageConfig.maxMessages", json!("1000000000"))],
            vec![("ackDeadlineSeconds", json!(10))],
            vec![("ackDeadlineSeconds", json!("600"))],
            vec![("topic", json!("_deleted-topic_"))],
            vec![(
                "name",
                json!("projects/example.com:proj/subscriptions/A-b_c.d~e+f%g"),
            )],
            vec![("cloudStorageConfig.bucket", json!("my.bucket.example.com"))],
            vec![("cloudStorageConfig.bucket", json!("1_a"))],
            vec![(
                "cloudStorageConfig.filenamePrefix",
                json!("dir/sub dir/#file-"),
            )],
            vec![("cloudStorageConfig.filenameDatetimeFormat", json!(""))],
            vec![("expirationPolicy", json!({}))],
            vec![("expirationPolicy", Value::Null)],
            vec![("expirationPolicy.ttl", json!("604800s"))], // == retention
            vec![("retryPolicy", json!({}))],
            vec![
                ("retryPolicy.minimumBackoff", json!("0s")),
                ("retryPolicy.maximumBackoff", json!("0s")),
            ],
            vec![("filter", json!(format!("attributes:{}", "x".repeat(245))))],
            vec![(
                "pushConfig",
                json!({"attributes": {"x-goog-version": "v1"}}),
            )],
            vec![
                ("enableExactlyOnceDelivery", json!(true)),
                ("cloudStorageConfig", Value::Null),
            ],
            vec![("cloudStorageConfig.avroConfig", Value::Null)],
            vec![
                ("cloudStorageConfig.avroConfig", Value::Null),
                ("cloudStorageConfig.textConfig", json!({})),
            ],
            vec![("subsink", Value::Null)],
        ] {
            let v = with(&patches);
            assert_eq!(
                fields(validate(&parse(&v), None)),
                Vec::<String>::new(),
                "{patches:?}"
            );
        }
        // The longest prefix that still fits in 1024 bytes: 1024 - 8 (suffix) - 20 (datetime)
        // - 1 ('_' is replaced? no: format ends in Z, so '_' stays) - 36 (uuid).
        let fits = 1024 - "_archive".len() - "2023-09-25/04_10_00Z".len() - 1 - 36;
        let v = with(&[("cloudStorageConfig.filenamePrefix", json!("p".repeat(fits)))]);
        validate(&parse(&v), None).unwrap();
        let v = with(&[(
            "cloudStorageConfig.filenamePrefix",
            json!("p".repeat(fits + 1)),
        )]);
        assert_eq!(
            fields(validate(&parse(&v), None)),
            vec!["cloudStorageConfig.filenamePrefix".to_string()]
        );
    }

    #[test]
    fn all_violations_are_reported() {
        let v = with(&[
            ("cloudStorageConfig.maxDuration", json!("30s")),
            ("cloudStorageConfig.bucket", json!("gs://my-bucket")),
            ("ackDeadlineSeconds", json!(1000)),
        ]);
        let err = validate(&parse(&v), None).unwrap_err();
        assert_eq!(
            fields(Err(err_clone(&err))),
            vec![
                "ackDeadlineSeconds",
                "cloudStorageConfig.bucket",
                "cloudStorageConfig.maxDuration"
            ]
        );
        let text = err.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with("ackDeadlineSeconds: must be between 10 and 600"),
            "{text}"
        );
        assert!(
            lines[1]
                .starts_with("cloudStorageConfig.bucket: must be a bare bucket name without gs://"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("cloudStorageConfig.maxDuration: must be between 60s and 600s"),
            "{text}"
        );
        assert!(lines[2].contains("got 30s"), "{text}");
    }

    fn err_clone(e: &ConfigError) -> ConfigError {
        ConfigError::Invalid(e.violations().to_vec())
    }

    #[test]
    fn datetime_format_error_text_is_reported() {
        let v = with(&[(
            "cloudStorageConfig.filenameDatetimeFormat",
            json!("YY-YYYY-MM-DDhhmmss"),
        )]);
        let err = validate(&parse(&v), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cloudStorageConfig.filenameDatetimeFormat: year given twice (YY and YYYY); the second at position 3"
        );
    }

    #[test]
    fn extended_limits_lift_numeric_limits_only() {
        let patches = [
            ("cloudStorageConfig.maxDuration", json!("2s")),
            ("cloudStorageConfig.maxBytes", json!("1")),
            ("cloudStorageConfig.maxMessages", json!(10)),
            ("ackDeadlineSeconds", json!(3600)),
        ];
        let v = with(&patches);
        assert_eq!(
            fields(validate(&parse(&v), None)),
            vec![
                "ackDeadlineSeconds",
                "cloudStorageConfig.maxDuration",
                "cloudStorageConfig.maxBytes",
                "cloudStorageConfig.maxMessages"
            ]
        );
        // The override argument.
        let valid = validate(&parse(&v), Some(LimitsMode::Extended)).unwrap();
        assert_eq!(valid.limits, LimitsMode::Extended);
        assert_eq!(valid.delivery.ack_deadline, Duration::from_secs(3600));
        let s = valid.storage.unwrap();
        assert_eq!(s.max_duration, Duration::from_secs(2));
        assert_eq!(s.max_bytes, Some(1));
        assert_eq!(s.max_messages, Some(10));

        // The `subsink.limits` field; the override wins over it.
        let mut ext = v.clone();
        set(&mut ext, "subsink.limits", json!("extended"));
        validate(&parse(&ext), None).unwrap();
        assert!(validate(&parse(&ext), Some(LimitsMode::Pubsub)).is_err());

        // An hour is fine too; zero, negatives and bad syntax are not.
        let v = with(&[
            ("subsink.limits", json!("extended")),
            ("cloudStorageConfig.maxDuration", json!("3600s")),
        ]);
        assert_eq!(
            validate(&parse(&v), None)
                .unwrap()
                .storage
                .unwrap()
                .max_duration,
            Duration::from_secs(3600)
        );
        for (field, value) in [
            ("cloudStorageConfig.maxDuration", json!("0s")),
            ("cloudStorageConfig.maxDuration", json!("1h")),
            ("cloudStorageConfig.maxBytes", json!(-1)),
            ("ackDeadlineSeconds", json!(-1)),
            ("cloudStorageConfig.bucket", json!("gs://b")),
            ("messageRetentionDuration", json!("60s")),
        ] {
            let v = with(&[(field, value)]);
            assert_eq!(
                fields(validate(&parse(&v), Some(LimitsMode::Extended))),
                vec![field.to_string()],
                "{field}"
            );
        }
    }

    #[test]
    fn several_delivery_kinds_and_exactly_once() {
        let v = with(&[
            (
                "pushConfig",
                json!({"pushEndpoint": "https://example.com/push"}),
            ),
            ("bigqueryConfig", json!({"table": "p.d.t"})),
            ("enableExactlyOnceDelivery", json!(true)),
        ]);
        let err = validate(&parse(&v), None).unwrap_err();
        assert_eq!(
            fields(Err(err_clone(&err))),
            vec![
                "bigqueryConfig",
                "cloudStorageConfig",
                "enableExactlyOnceDelivery"
            ]
        );
        assert!(err
            .to_string()
            .contains("found pushConfig and bigqueryConfig and cloudStorageConfig"));
    }

    #[test]
    fn parse_and_io_errors_display() {
        let e = ConfigError::Parse {
            path: "a.json".into(),
            message: "unknown field `x`".into(),
            line: Some(3),
            column: Some(5),
        };
        assert_eq!(e.to_string(), "a.json:3:5: unknown field `x`");
        let e = ConfigError::Parse {
            path: "a.yaml".into(),
            message: "empty".into(),
            line: None,
            column: None,
        };
        assert_eq!(e.to_string(), "a.yaml: empty");
        assert!(e.violations().is_empty());
    }

    #[test]
    fn partitioned_paths_are_for_storage_subscriptions_only() {
        let paths = json!({"partitions": [
            {"name": "dt", "publishTime": "YYYY-MM-DD"},
            {"name": "region", "attribute": "region"}
        ]});
        let v = with(&[("subsink.paths", paths.clone())]);
        let s = validate(&parse(&v), None).unwrap().storage.unwrap();
        let p = s.partitions.unwrap();
        assert_eq!(p.partitions.len(), 2);
        assert_eq!(p.partitions[0].name, "dt");
        assert_eq!(
            p.partitions[1].value,
            super::super::PartitionValue::Attribute("region".into())
        );
        // Off by default.
        assert!(validate(&parse(&describe_json()), None)
            .unwrap()
            .storage
            .unwrap()
            .partitions
            .is_none());

        // A BigQuery subscription: refused, with the reason.
        let v = with(&[
            ("cloudStorageConfig", Value::Null),
            ("bigqueryConfig", json!({"table": "p.d.t"})),
            ("subsink.paths", paths.clone()),
        ]);
        let err = validate(&parse(&v), None).unwrap_err();
        assert_eq!(fields(Err(err_clone(&err))), vec!["subsink.paths"]);
        assert!(err
            .to_string()
            .contains("a BigQuery subscription writes rows"));

        // A rule of a partition, named by its index; an unknown key is a parse error.
        let v = with(&[(
            "subsink.paths",
            json!({"partitions": [{"name": "dt", "publishTime": "YYYY-MM-DD", "attribute": "a"}]}),
        )]);
        assert_eq!(
            fields(validate(&parse(&v), None)),
            vec!["subsink.paths.partitions[0]"]
        );
        let v = with(&[(
            "subsink.paths",
            json!({"partitions": [{"name": "dt", "publishtime": "YYYY"}]}),
        )]);
        assert!(Subscription::from_str_any(&v.to_string(), "t.json").is_err());

        // Names that would pass Cloud Storage's 1024 bytes with the directories.
        let long = "p".repeat(900);
        let v = with(&[
            ("cloudStorageConfig.filenamePrefix", json!(long)),
            (
                "subsink.paths",
                json!({"partitions": [{"name": "x".repeat(100), "attribute": "a"}]}),
            ),
        ]);
        assert_eq!(fields(validate(&parse(&v), None)), vec!["subsink.paths"]);

        // A format starting with `/` after an empty file-name part: fine at the bucket's root
        // (the store drops a leading `/`), an empty segment after the partition directories.
        let v = with(&[
            ("cloudStorageConfig.filenamePrefix", json!("")),
            (
                "cloudStorageConfig.filenameDatetimeFormat",
                json!("/YYYY-MM-DD/hh_mm_ss"),
            ),
        ]);
        validate(&parse(&v), None).unwrap();
        let mut with_paths = v.clone();
        set(&mut with_paths, "subsink.paths", paths);
        assert_eq!(
            fields(validate(&parse(&with_paths), None)),
            vec!["cloudStorageConfig.filenameDatetimeFormat"]
        );
    }
}
