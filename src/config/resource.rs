//! The `Subscription` resource in Pub/Sub's REST JSON shape (docs/contract.md §2.1, §3.2, §4.2, §5), as
//! `gcloud pubsub subscriptions describe --format=json` prints it, read from JSON or YAML.
//!
//! Parsing only checks shape: field names and JSON types. Every value rule (formats, ranges,
//! exclusivity) lives in [`mod@super::validate`], which reports all violations with their REST path.
//! That is why durations and integers are kept as [`RawDuration`] / [`RawInt`]: a bad `"5 min"`
//! becomes the violation `cloudStorageConfig.maxDuration: ...` rather than an opaque serde error.
//!
//! Protobuf-JSON conventions followed here:
//! * durations are strings `"<seconds>[.<fraction>]s"` (`"300s"`, `"3.5s"`); a JSON number is
//!   accepted as seconds;
//! * int64 values (`maxBytes`, `maxMessages`) are strings (`"10000000"`); numbers are accepted, and
//!   so are strings for the int32 fields (`ackDeadlineSeconds`, `maxDeliveryAttempts`);
//! * unset scalars are omitted: an empty string, `false` and `0` mean "unset".
//!
//! Unknown fields are rejected at every level (a typo such as `maxDurations` must not silently
//! fall back to a default); the error names the field and its line and column. Output-only
//! fields (`state`, `topicMessageRetentionDuration`, `analyticsHubSubscriptionInfo`, the configs'
//! `state`) are accepted and ignored, so gcloud output can be used as is.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::ConfigError;
use super::LimitsMode;

/// A Pub/Sub subscription (REST `Subscription`), plus subsink's own `subsink` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Subscription {
    /// `projects/{project}/subscriptions/{subscription}`. Required.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `projects/{project}/topics/{topic}`, or `_deleted-topic_` once the topic is deleted.
    /// Required.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub topic: String,
    /// Push delivery (docs/contract.md §5). An empty `pushConfig: {}` (as gcloud prints for pull and export
    /// subscriptions) means "no push".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_config: Option<PushConfig>,
    /// BigQuery export (docs/contract.md §4). Exclusive with push and Cloud Storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bigquery_config: Option<BigQueryConfig>,
    /// Cloud Storage export (docs/contract.md §3). Exclusive with push and BigQuery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_storage_config: Option<CloudStorageConfig>,
    /// Seconds; 0 or unset means 10; 10–600 (any > 0 with extended limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_deadline_seconds: Option<RawInt>,
    /// Keep acked messages for the retention window (seek/replay). Default false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub retain_acked_messages: bool,
    /// Duration; default 7 days; 10 minutes – 31 days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_retention_duration: Option<RawDuration>,
    /// Free-form key/value labels; not used by the worker.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Deliver messages with the same ordering key in publish order. Default false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub enable_message_ordering: bool,
    /// Unset: expires after 31 days of inactivity; present without `ttl`: never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_policy: Option<ExpirationPolicy>,
    /// Attribute filter (docs/contract.md §2.5); empty delivers everything; at most 256 bytes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filter: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_policy: Option<DeadLetterPolicy>,
    /// Unset: redeliver immediately.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<RetryPolicy>,
    /// A detached subscription receives nothing.
    #[serde(default, skip_serializing_if = "is_false")]
    pub detached: bool,
    /// Pull subscriptions only.
    #[serde(default, skip_serializing_if = "is_false")]
    pub enable_exactly_once_delivery: bool,
    /// Output only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_message_retention_duration: Option<RawDuration>,
    /// Output only: `STATE_UNSPECIFIED`, `ACTIVE` or `RESOURCE_ERROR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Output only, kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analytics_hub_subscription_info: Option<serde_json::Value>,
    /// Single Message Transforms (docs/contract.md §2.10), applied in list order; kept as given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub message_transforms: Vec<serde_json::Value>,
    /// Input only: resource-manager tags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// subsink's extension (docs/contract.md §7); not part of Pub/Sub's resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subsink: Option<SubsinkExtension>,
}

/// `"subsink": {"limits": "pubsub" | "extended", "table": {...}, "paths": {...}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubsinkExtension {
    /// `pubsub` (default): Pub/Sub's limits exactly; `extended`: numeric limits lifted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsMode>,
    /// How the table writer batches rows into Parquet files (a BigQuery subscription has no
    /// batching settings: BigQuery's Storage Write API takes rows as they come).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<TableBatching>,
    /// Partitioned object paths of a Cloud Storage subscription (docs/contract.md §7): Hive-style
    /// `name=value/` directories in front of each object's file name. Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<ObjectPaths>,
}

/// `"subsink": {"paths": {"partitions": [{"name": "dt", "publishTime": "YYYY-MM-DD"}, ...]}}`:
/// the directories an object of a Cloud Storage subscription goes in, one per partition, in list
/// order (rules: [`crate::config::paths`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectPaths {
    /// 1 to 16 partitions; each names its directory and where its value comes from.
    #[serde(default)]
    pub partitions: Vec<RawPartition>,
}

/// One partition: `{"name": "dt", "publishTime": "YYYY-MM-DD"}`, `{"name": "region",
/// "attribute": "region"}` or `{"name": "kind", "field": "kind"}` — exactly one source.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawPartition {
    /// The directory's key (`dt` in `dt=2026-12-05/`): letters, digits and `_`, not starting with
    /// a digit, at most 128 bytes.
    #[serde(default)]
    pub name: String,
    /// The message's publish time (UTC) in the `filenameDatetimeFormat` grammar, any of its
    /// matchers at most once (`YYYY-MM-DD`, `hh`), no `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_time: Option<String>,
    /// The value of this message attribute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribute: Option<String>,
    /// The value of this key of a JSON object payload; `a.b` reads key `b` of the object at `a`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// An event time the message carries, rendered like `publishTime` (issue 44).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<RawEventTime>,
}

/// `{"field": "ts", "format": "YYYY-MM-DD"}` or `{"attribute": "event_time", "format": "hh"}`:
/// where a message's event time is and how its directory value is written. The time is RFC 3339
/// text or an integer of epoch milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawEventTime {
    /// The `publishTime` grammar: `filenameDatetimeFormat`'s matchers, each at most once, no `/`.
    #[serde(default)]
    pub format: String,
    /// A key of the JSON object payload (`a.b`: key `b` of the object at `a`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// A message attribute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribute: Option<String>,
}

/// `"subsink": {"table": {"maxDuration": "10s", "maxBytes": "67108864", "maxMessages": "0"}}`:
/// when the table writer closes a Parquet file and commits it, like `CloudStorageConfig`'s three
/// limits (same JSON forms).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TableBatching {
    /// Default 10 s; any duration > 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration: Option<RawDuration>,
    /// Message bytes (payload + attribute keys and values) in one file; default 64 MiB; 0 = none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<RawInt>,
    /// Rows in one file; unset or 0: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_messages: Option<RawInt>,
}

impl Serialize for LimitsMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            LimitsMode::Pubsub => "pubsub",
            LimitsMode::Extended => "extended",
        })
    }
}

/// REST `PushConfig` (docs/contract.md §5).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PushConfig {
    /// Empty means "pull".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub push_endpoint: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc_token: Option<OidcToken>,
    /// `{}` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pubsub_wrapper: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_wrapper: Option<NoWrapper>,
}

impl PushConfig {
    /// True when this is a push subscription (an endpoint is set).
    pub fn is_push(&self) -> bool {
        !self.push_endpoint.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OidcToken {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account_email: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub audience: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NoWrapper {
    #[serde(default, skip_serializing_if = "is_false")]
    pub write_metadata: bool,
}

/// REST `BigQueryConfig` (docs/contract.md §4.2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BigQueryConfig {
    /// `{project}.{dataset}.{table}` (or `{project}:{dataset}.{table}`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub table: String,
    /// Exclusive with `use_table_schema`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub use_topic_schema: bool,
    /// Exclusive with `use_topic_schema`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub use_table_schema: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub write_metadata: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub drop_unknown_fields: bool,
    /// The identity Pub/Sub writes as; kept for round-tripping.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account_email: String,
    /// Output only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// REST `CloudStorageConfig` (docs/contract.md §3.2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudStorageConfig {
    /// Bare bucket name (no `gs://`). Required.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bucket: String,
    /// Start of every object name; may contain `/`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filename_prefix: String,
    /// End of every object name; must not end with `/`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filename_suffix: String,
    /// docs/contract.md §3.4; empty means `YYYY-MM-DDThh:mm:ss+00:00`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filename_datetime_format: String,
    /// Text output (the default when neither format is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_config: Option<TextConfig>,
    /// Avro output; exclusive with `text_config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avro_config: Option<AvroConfig>,
    /// Default 5 minutes; 1–10 minutes (any > 0 with extended limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration: Option<RawDuration>,
    /// Bytes; unset or 0: no limit; 1000 – 10 GiB (≥ 1 with extended limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<RawInt>,
    /// Unset or 0: no limit; ≥ 1000 (≥ 1 with extended limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_messages: Option<RawInt>,
    /// Output only (docs/contract.md §3.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The identity Pub/Sub writes as; kept for round-tripping, unused by the worker.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account_email: String,
}

/// REST `TextConfig`: no fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {}

/// REST `AvroConfig` (docs/contract.md §3.7).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AvroConfig {
    /// Add subscription name, message id, publish time and attributes to each record.
    #[serde(default, skip_serializing_if = "is_false")]
    pub write_metadata: bool,
    /// Write records with the topic's Avro schema instead of the generic one.
    #[serde(default, skip_serializing_if = "is_false")]
    pub use_topic_schema: bool,
}

/// REST `ExpirationPolicy` (docs/contract.md §2.3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpirationPolicy {
    /// Unset: never expires. At least 1 day and at least the retention duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<RawDuration>,
}

/// REST `DeadLetterPolicy` (docs/contract.md §2.8).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeadLetterPolicy {
    /// `projects/{project}/topics/{topic}`. Required when the policy is present.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dead_letter_topic: String,
    /// 0 or unset means 5; 5–100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delivery_attempts: Option<RawInt>,
}

/// REST `RetryPolicy` (docs/contract.md §2.9).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryPolicy {
    /// Default 10 s; 0–600 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_backoff: Option<RawDuration>,
    /// Default 600 s; 0–600 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_backoff: Option<RawDuration>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A protobuf-JSON duration as written (`"300s"`, `"3.5s"`), parsed by [`RawDuration::parse`]
/// during validation. A JSON/YAML number `n` is read as `"{n}s"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawDuration(pub String);

impl RawDuration {
    /// Parses `"<seconds>[.<up to 9 digits>]s"`. Negative durations are rejected.
    pub fn parse(&self) -> Result<Duration, String> {
        let s = self.0.as_str();
        let bad = || {
            format!(
                "{s:?} is not a duration: expected seconds with an `s` suffix, \
                 e.g. \"300s\" or \"3.5s\""
            )
        };
        let body = s.strip_suffix('s').ok_or_else(bad)?;
        if body.starts_with('-') {
            return Err(format!("{s:?}: a duration must not be negative"));
        }
        let (whole, frac) = match body.split_once('.') {
            Some((w, f)) => (w, f),
            None => (body, ""),
        };
        let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits(whole) || !digits(frac) || frac.len() > 9 {
            return Err(bad());
        }
        if body.ends_with('.') {
            return Err(bad());
        }
        let secs: u64 = whole
            .parse()
            .map_err(|_| format!("{s:?}: duration out of range"))?;
        // Protobuf's Duration maximum, about 10,000 years.
        if secs > 315_576_000_000 {
            return Err(format!("{s:?}: duration out of range"));
        }
        let nanos: u32 = if frac.is_empty() {
            0
        } else {
            format!("{frac:0<9}").parse().map_err(|_| bad())?
        };
        Ok(Duration::new(secs, nanos))
    }
}

impl From<Duration> for RawDuration {
    /// Protobuf-JSON form: `"90s"`, `"3.5s"`.
    fn from(d: Duration) -> Self {
        RawDuration(format_duration(d))
    }
}

impl fmt::Display for RawDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Protobuf-JSON form of a duration: `"90s"`, `"3.5s"`, `"0.000000001s"`.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.subsec_nanos();
    if nanos == 0 {
        format!("{}s", d.as_secs())
    } else {
        let frac = format!("{nanos:09}");
        format!("{}.{}s", d.as_secs(), frac.trim_end_matches('0'))
    }
}

impl Serialize for RawDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor {
            what: "a duration such as \"300s\" (or a number of seconds)",
            number_suffix: "s",
        })
        .map(RawDuration)
    }
}

/// An integer as written: a JSON string (protobuf's int64 form) or a number, parsed during
/// validation by [`RawInt::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawInt(pub String);

impl RawInt {
    /// Parses a decimal integer (optional sign, no spaces or exponent).
    pub fn parse(&self) -> Result<i64, String> {
        let s = self.0.as_str();
        let unsigned = s.strip_prefix(['-', '+']).unwrap_or(s);
        if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{s:?} is not an integer"));
        }
        s.parse::<i64>()
            .map_err(|_| format!("{s:?} is out of the 64-bit integer range"))
    }
}

impl From<u64> for RawInt {
    fn from(n: u64) -> Self {
        RawInt(n.to_string())
    }
}

impl fmt::Display for RawInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for RawInt {
    /// Protobuf-JSON emits int64 values as strings; that form is accepted for int32 fields too.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RawInt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor {
            what: "an integer (a number or a string of digits)",
            number_suffix: "",
        })
        .map(RawInt)
    }
}

/// Reads a string or a number as text, so validation can report bad values with their path.
struct RawVisitor {
    what: &'static str,
    number_suffix: &'static str,
}

impl serde::de::Visitor<'_> for RawVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
        Ok(format!("{v}{}", self.number_suffix))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
        Ok(format!("{v}{}", self.number_suffix))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<String, E> {
        // `Display` for f64 prints integral values without a fraction ("1000"), so an integer
        // written as 1000.0 still parses; 3.5 stays "3.5" and fails integer parsing later.
        Ok(format!("{v}{}", self.number_suffix))
    }
}

impl Subscription {
    /// Parses a subscription from JSON (text starting with `{`) or YAML (anything else).
    /// `path_for_errors` names the source in error messages.
    pub fn from_str_any(text: &str, path_for_errors: &str) -> Result<Subscription, ConfigError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| {
                let (line, column) = match e.line() {
                    0 => (None, None),
                    l => (Some(l), Some(e.column())),
                };
                parse_error(path_for_errors, e.to_string(), line, column)
            })
        } else {
            if text.trim().is_empty() {
                return Err(ConfigError::Parse {
                    path: path_for_errors.to_string(),
                    message: "empty document: expected a subscription resource".to_string(),
                    line: None,
                    column: None,
                });
            }
            serde_yaml::from_str(text).map_err(|e| {
                let loc = e.location();
                parse_error(
                    path_for_errors,
                    e.to_string(),
                    loc.as_ref().map(|l| l.line()),
                    loc.as_ref().map(|l| l.column()),
                )
            })
        }
    }

    /// Reads and parses a subscription file (JSON or YAML).
    pub fn load(path: &Path) -> Result<Subscription, ConfigError> {
        load(path)
    }
}

/// Reads and parses a subscription file (JSON or YAML).
pub fn load(path: &Path) -> Result<Subscription, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: shown.clone(),
        source,
    })?;
    Subscription::from_str_any(&text, &shown)
}

/// Builds a parse error, moving serde's trailing " at line L column C" into `line`/`column`.
fn parse_error(
    path: &str,
    message: String,
    line: Option<usize>,
    column: Option<usize>,
) -> ConfigError {
    let message = match (line, column) {
        (Some(l), Some(c)) => {
            let tail = format!(" at line {l} column {c}");
            message
                .strip_suffix(&tail)
                .map(str::to_string)
                .unwrap_or(message)
        }
        _ => message,
    };
    ConfigError::Parse {
        path: path.to_string(),
        message,
        line,
        column,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = [
            ("300s", Duration::from_secs(300)),
            ("3.5s", Duration::from_millis(3500)),
            ("0s", Duration::ZERO),
            ("0.000000001s", Duration::from_nanos(1)),
            ("604800s", Duration::from_secs(604_800)),
        ];
        for (s, want) in ok {
            assert_eq!(RawDuration(s.into()).parse(), Ok(want), "{s}");
            assert_eq!(format_duration(want), s);
        }
        for s in [
            "300",
            "5m",
            "-1s",
            "s",
            ".5s",
            "1.s",
            "1.0000000001s",
            "1 s",
            "",
            "1e3s",
            "+1s",
        ] {
            assert!(RawDuration(s.into()).parse().is_err(), "{s}");
        }
        assert_eq!(RawDuration::from(Duration::from_secs(90)).0, "90s");
    }

    #[test]
    fn ints() {
        assert_eq!(RawInt("10000000".into()).parse(), Ok(10_000_000));
        assert_eq!(RawInt("-5".into()).parse(), Ok(-5));
        for s in ["", "1e6", "1.5", "10 MB", "99999999999999999999", "-"] {
            assert!(RawInt(s.into()).parse().is_err(), "{s}");
        }
    }

    #[test]
    fn numbers_and_strings_are_both_accepted() {
        let json = r#"{"name":"n","ackDeadlineSeconds":"60",
            "cloudStorageConfig":{"bucket":"b","maxDuration":90,"maxBytes":1000,"maxMessages":"2000"}}"#;
        let sub = Subscription::from_str_any(json, "x.json").unwrap();
        assert_eq!(sub.ack_deadline_seconds, Some(RawInt("60".into())));
        let cs = sub.cloud_storage_config.unwrap();
        assert_eq!(cs.max_duration, Some(RawDuration("90s".into())));
        assert_eq!(cs.max_bytes, Some(RawInt("1000".into())));
        assert_eq!(cs.max_messages, Some(RawInt("2000".into())));
        let yaml =
            "name: n\ncloudStorageConfig:\n  bucket: b\n  maxDuration: 300s\n  maxBytes: 1000.0\n";
        let cs = Subscription::from_str_any(yaml, "x.yaml")
            .unwrap()
            .cloud_storage_config
            .unwrap();
        assert_eq!(cs.max_duration, Some(RawDuration("300s".into())));
        assert_eq!(cs.max_bytes.unwrap().parse(), Ok(1000));
    }

    #[test]
    fn unknown_top_level_field_is_named_with_position() {
        let json = "{\n  \"name\": \"n\",\n  \"maxDurations\": \"1s\"\n}";
        let err = Subscription::from_str_any(json, "sub.json").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("unknown field `maxDurations`"), "{text}");
        assert!(text.starts_with("sub.json:3:"), "{text}");
        match err {
            ConfigError::Parse { line, .. } => assert_eq!(line, Some(3)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_nested_field_in_yaml_names_its_path() {
        let yaml = "name: n\ncloudStorageConfig:\n  bucket: b\n  maxDurations: 1s\n";
        let err = Subscription::from_str_any(yaml, "sub.yaml").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("cloudStorageConfig: unknown field `maxDurations`"),
            "{text}"
        );
        assert!(text.starts_with("sub.yaml:4:"), "{text}");
    }

    #[test]
    fn wrong_types_and_syntax_errors_are_located() {
        let err = Subscription::from_str_any("{\"detached\": \"yes\"}", "a.json").unwrap_err();
        assert!(err.to_string().contains("invalid type"), "{err}");
        let err = Subscription::from_str_any("{\"name\": ", "a.json").unwrap_err();
        assert!(err.to_string().starts_with("a.json:1:"), "{err}");
        let err = Subscription::from_str_any("name: [", "a.yaml").unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
        let err = Subscription::from_str_any("  \n", "a.yaml").unwrap_err();
        assert!(err.to_string().contains("empty document"), "{err}");
        let err = Subscription::from_str_any("{\"subsink\": {\"limits\": \"huge\"}}", "a.json")
            .unwrap_err();
        assert!(err.to_string().contains("unknown variant `huge`"), "{err}");
    }

    #[test]
    fn serializes_back_to_rest_shape() {
        let json = r#"{"name":"projects/p/subscriptions/s","topic":"projects/p/topics/t",
            "cloudStorageConfig":{"bucket":"b","textConfig":{},"maxDuration":"90s","maxBytes":"1000"},
            "subsink":{"limits":"extended"}}"#;
        let sub = Subscription::from_str_any(json, "x").unwrap();
        let out = serde_json::to_value(&sub).unwrap();
        assert_eq!(
            out,
            serde_json::json!({
                "name": "projects/p/subscriptions/s",
                "topic": "projects/p/topics/t",
                "cloudStorageConfig": {"bucket": "b", "textConfig": {}, "maxDuration": "90s", "maxBytes": "1000"},
                "subsink": {"limits": "extended"}
            })
        );
        let again = Subscription::from_str_any(&out.to_string(), "x").unwrap();
        assert_eq!(again, sub);
    }

    #[test]
    fn load_reads_files_and_reports_io_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub.yaml");
        std::fs::write(&path, "name: projects/p/subscriptions/s\n").unwrap();
        assert_eq!(load(&path).unwrap().name, "projects/p/subscriptions/s");
        let missing = dir.path().join("nope.json");
        let err = Subscription::load(&missing).unwrap_err();
        assert!(matches!(err, ConfigError::Io { .. }), "{err}");
        assert!(err.to_string().contains("nope.json"), "{err}");
    }
}
