//! gcloud-style flags (`gcloud pubsub subscriptions create … --cloud-storage-*`, docs/contract.md §3.2) turned
//! into a REST [`Subscription`], so flags and config files share one validation.
//!
//! Values are parsed the way gcloud parses them ([`parse_duration`], [`parse_binary_size`]) and
//! written back in REST form (`maxDuration: "90s"`, `maxBytes: "1048576"`); range checks are left
//! to [`super::validate()`], so `--cloud-storage-max-duration=2s` is refused there with Pub/Sub's
//! limits but accepted with extended limits.
//!
//! Names:
//! * `--subscription-name` takes `projects/{project}/subscriptions/{id}`, or a bare `{id}` when
//!   `--topic` is a full name (the project is taken from the topic);
//! * `--topic` takes `projects/{project}/topics/{id}`, or a bare `{id}` in the subscription's
//!   project. Without `--topic` the topic is `_deleted-topic_`, the value Pub/Sub itself gives a
//!   subscription whose topic is gone: the subscription still delivers what it is given, and no
//!   made-up topic name appears in logs or metadata.

use std::time::Duration;

use super::error::{ConfigError, Violation};
use super::resource::{
    AvroConfig, BigQueryConfig, CloudStorageConfig, DeadLetterPolicy, RawDuration, RawInt,
    Subscription, TextConfig,
};

/// The topic used when no `--topic` is given (see the module docs).
pub const NO_TOPIC: &str = "_deleted-topic_";

/// gcloud's subscription flags that subsink understands. Every value is kept as typed on the
/// command line; [`GcloudFlags::to_subscription`] parses them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcloudFlags {
    /// `projects/{p}/subscriptions/{s}` or a bare ID (see the module docs).
    pub subscription_name: Option<String>,
    /// `projects/{p}/topics/{t}` or a bare ID; default [`NO_TOPIC`].
    pub topic: Option<String>,
    /// `--cloud-storage-bucket`: bare bucket name. Required when any other
    /// `--cloud-storage-*` flag is given.
    pub cloud_storage_bucket: Option<String>,
    /// `--cloud-storage-file-prefix`.
    pub cloud_storage_file_prefix: Option<String>,
    /// `--cloud-storage-file-suffix`.
    pub cloud_storage_file_suffix: Option<String>,
    /// `--cloud-storage-file-datetime-format`, e.g. `YYYY-MM-DD/hh_mm_ssZ`.
    pub cloud_storage_file_datetime_format: Option<String>,
    /// `--cloud-storage-max-duration`: `90s`, `5m`, `1h`; a plain number is seconds.
    pub cloud_storage_max_duration: Option<String>,
    /// `--cloud-storage-max-bytes`: binary size; a plain number is KB (KiB).
    pub cloud_storage_max_bytes: Option<String>,
    /// `--cloud-storage-max-messages`: an integer.
    pub cloud_storage_max_messages: Option<String>,
    /// `--cloud-storage-output-format`: `text` (default) or `avro`.
    pub cloud_storage_output_format: Option<String>,
    /// `--cloud-storage-write-metadata`: Avro only.
    pub cloud_storage_write_metadata: bool,
    /// `--cloud-storage-use-topic-schema`: Avro only.
    pub cloud_storage_use_topic_schema: bool,
    /// `--bigquery-table`: `{project}.{dataset}.{table}` or `{project}:{dataset}.{table}`.
    /// Required when any other BigQuery flag is given.
    pub bigquery_table: Option<String>,
    /// `--use-topic-schema`.
    pub use_topic_schema: bool,
    /// `--use-table-schema`.
    pub use_table_schema: bool,
    /// `--write-metadata`.
    pub write_metadata: bool,
    /// `--drop-unknown-fields`.
    pub drop_unknown_fields: bool,
    /// `--dead-letter-topic`: `projects/{p}/topics/{t}` or a bare ID (the subscription's project).
    pub dead_letter_topic: Option<String>,
    /// `--max-delivery-attempts`: 5–100, with `--dead-letter-topic`.
    pub max_delivery_attempts: Option<String>,
}

impl GcloudFlags {
    /// The REST resource these flags describe. Flag errors (unparsable values, missing bucket,
    /// Avro-only flags without Avro) are all reported together, each under its flag name.
    pub fn to_subscription(&self) -> Result<Subscription, ConfigError> {
        let mut errors = Vec::new();
        let mut fail = |field: &str, rule: String| {
            errors.push(Violation {
                field: field.to_string(),
                rule,
            })
        };

        let (name, topic) = self.names(&mut fail);

        let storage = self.storage_config(&mut fail);
        let bigquery = self.bigquery_config(&mut fail);
        let dead_letter_policy = self.dead_letter_policy(&name, &mut fail);

        if !errors.is_empty() {
            return Err(ConfigError::Invalid(errors));
        }
        Ok(Subscription {
            name,
            topic,
            cloud_storage_config: storage,
            bigquery_config: bigquery,
            dead_letter_policy,
            ..Subscription::default()
        })
    }

    /// The `cloudStorageConfig` of the `--cloud-storage-*` flags (`None`: none given).
    fn storage_config(&self, fail: &mut impl FnMut(&str, String)) -> Option<CloudStorageConfig> {
        let any_storage_flag = self.cloud_storage_bucket.is_some()
            || self.cloud_storage_file_prefix.is_some()
            || self.cloud_storage_file_suffix.is_some()
            || self.cloud_storage_file_datetime_format.is_some()
            || self.cloud_storage_max_duration.is_some()
            || self.cloud_storage_max_bytes.is_some()
            || self.cloud_storage_max_messages.is_some()
            || self.cloud_storage_output_format.is_some()
            || self.cloud_storage_write_metadata
            || self.cloud_storage_use_topic_schema;
        if !any_storage_flag {
            return None;
        }
        if self.cloud_storage_bucket.is_none() {
            fail(
                "--cloud-storage-bucket",
                "required when other --cloud-storage-* flags are given".to_string(),
            );
        }
        let mut cs = CloudStorageConfig {
            bucket: self.cloud_storage_bucket.clone().unwrap_or_default(),
            filename_prefix: self.cloud_storage_file_prefix.clone().unwrap_or_default(),
            filename_suffix: self.cloud_storage_file_suffix.clone().unwrap_or_default(),
            filename_datetime_format: self
                .cloud_storage_file_datetime_format
                .clone()
                .unwrap_or_default(),
            ..CloudStorageConfig::default()
        };
        if let Some(s) = &self.cloud_storage_max_duration {
            match parse_duration(s) {
                Ok(d) => cs.max_duration = Some(RawDuration::from(d)),
                Err(e) => fail("--cloud-storage-max-duration", e),
            }
        }
        if let Some(s) = &self.cloud_storage_max_bytes {
            match parse_binary_size(s, true) {
                Ok(n) => cs.max_bytes = Some(RawInt::from(n)),
                Err(e) => fail("--cloud-storage-max-bytes", e),
            }
        }
        if let Some(s) = &self.cloud_storage_max_messages {
            match parse_count(s) {
                Ok(n) => cs.max_messages = Some(RawInt::from(n)),
                Err(e) => fail("--cloud-storage-max-messages", e),
            }
        }
        match self.cloud_storage_output_format.as_deref() {
            None | Some("text") => {
                // gcloud effectively ignores these two without Avro; refusing them tells the
                // user their intent had no effect.
                for (set, flag) in [
                    (
                        self.cloud_storage_write_metadata,
                        "--cloud-storage-write-metadata",
                    ),
                    (
                        self.cloud_storage_use_topic_schema,
                        "--cloud-storage-use-topic-schema",
                    ),
                ] {
                    if set {
                        fail(
                            flag,
                            "applies only to Avro output: add --cloud-storage-output-format=avro"
                                .to_string(),
                        );
                    }
                }
                cs.text_config = Some(TextConfig {});
            }
            Some("avro") => {
                cs.avro_config = Some(AvroConfig {
                    write_metadata: self.cloud_storage_write_metadata,
                    use_topic_schema: self.cloud_storage_use_topic_schema,
                })
            }
            Some(other) => fail(
                "--cloud-storage-output-format",
                format!("must be text or avro, got {other:?}"),
            ),
        }
        Some(cs)
    }

    /// The `bigqueryConfig` of the BigQuery flags (`None`: none given).
    fn bigquery_config(&self, fail: &mut impl FnMut(&str, String)) -> Option<BigQueryConfig> {
        let any_bigquery_flag = self.bigquery_table.is_some()
            || self.use_topic_schema
            || self.use_table_schema
            || self.write_metadata
            || self.drop_unknown_fields;
        if !any_bigquery_flag {
            return None;
        }
        if self.bigquery_table.is_none() {
            fail(
                "--bigquery-table",
                "required when --use-topic-schema, --use-table-schema, --write-metadata or \
                 --drop-unknown-fields is given"
                    .to_string(),
            );
        }
        if self.use_topic_schema && self.use_table_schema {
            fail(
                "--use-table-schema",
                "--use-topic-schema and --use-table-schema are mutually exclusive".to_string(),
            );
        }
        Some(BigQueryConfig {
            table: self.bigquery_table.clone().unwrap_or_default(),
            use_topic_schema: self.use_topic_schema,
            use_table_schema: self.use_table_schema,
            write_metadata: self.write_metadata,
            drop_unknown_fields: self.drop_unknown_fields,
            ..BigQueryConfig::default()
        })
    }

    /// The `deadLetterPolicy` of `--dead-letter-topic` (a bare ID in the project of the
    /// subscription `name`) and `--max-delivery-attempts`.
    fn dead_letter_policy(
        &self,
        name: &str,
        fail: &mut impl FnMut(&str, String),
    ) -> Option<DeadLetterPolicy> {
        match (&self.dead_letter_topic, &self.max_delivery_attempts) {
            (None, Some(_)) => {
                fail(
                    "--max-delivery-attempts",
                    "applies only with --dead-letter-topic".to_string(),
                );
                None
            }
            (Some(t), attempts) => {
                let topic = if t.contains('/') {
                    t.clone()
                } else {
                    match project_of(name) {
                        Some(p) => format!("projects/{p}/topics/{t}"),
                        None => t.clone(),
                    }
                };
                let mut policy = DeadLetterPolicy {
                    dead_letter_topic: topic,
                    max_delivery_attempts: None,
                };
                if let Some(a) = attempts {
                    match parse_count(a) {
                        Ok(n) => policy.max_delivery_attempts = Some(RawInt::from(n)),
                        Err(e) => fail("--max-delivery-attempts", e),
                    }
                }
                Some(policy)
            }
            (None, None) => None,
        }
    }

    /// Full subscription and topic names, completing a bare ID from the other's project.
    fn names(&self, fail: &mut impl FnMut(&str, String)) -> (String, String) {
        let name = self.subscription_name.clone().unwrap_or_default();
        let topic = self.topic.clone().unwrap_or_default();
        let name_project = project_of(&name).map(str::to_string);
        let topic_project = project_of(&topic).map(str::to_string);

        let full_name = if name.is_empty() {
            fail(
                "--subscription-name",
                "required: projects/{project}/subscriptions/{subscription}, with --topic and \
                 --cloud-storage-bucket or --bigquery-table; or the whole subscription with \
                 --subscription FILE (JSON or YAML, as `gcloud pubsub subscriptions describe \
                 --format=json` prints it)"
                    .to_string(),
            );
            name
        } else if name.contains('/') {
            name
        } else if let Some(p) = topic_project {
            format!("projects/{p}/subscriptions/{name}")
        } else {
            fail(
                "--subscription-name",
                format!(
                    "{name:?} has no project: give projects/{{project}}/subscriptions/{name} \
                     (or a full --topic projects/{{project}}/topics/{{topic}})"
                ),
            );
            name
        };

        let full_topic = if topic.is_empty() {
            NO_TOPIC.to_string()
        } else if topic.contains('/') || topic == NO_TOPIC {
            topic
        } else if let Some(p) = name_project {
            format!("projects/{p}/topics/{topic}")
        } else {
            // The subscription name is bare too and already reported; keep the value as given.
            topic
        };
        (full_name, full_topic)
    }
}

/// The `{project}` of `projects/{project}/…`.
fn project_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("projects/")?;
    let project = rest.split('/').next()?;
    (!project.is_empty()).then_some(project)
}

/// An integer flag value such as `--cloud-storage-max-messages=1000`.
fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not a non-negative integer"));
    }
    t.parse().map_err(|_| format!("{s:?} is too large"))
}

/// Parses a gcloud duration: one or more `<number><unit>` parts with units `d`, `h`, `m`, `s`
/// (case-insensitive, largest first, each at most once), e.g. `90s`, `5m`, `1h30m`, `1.5h`; a
/// plain number is seconds. The ISO 8601 form gcloud also takes (`PT5M`, `P1DT2H`) is accepted;
/// months and years are not (their length varies).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let bad = |why: &str| format!("{s:?} is not a duration ({why}); examples: 90s, 5m, 1h30m, 1d");
    if t.is_empty() {
        return Err(bad("empty"));
    }
    if t.starts_with('-') {
        return Err(format!("{s:?}: a duration must not be negative"));
    }
    // A plain number: seconds.
    if t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return amount_nanos(t, 1).and_then(nanos_to_duration).map_err(bad);
    }

    let iso = t.starts_with(['P', 'p']);
    let mut rest = if iso { &t[1..] } else { t };
    if rest.is_empty() {
        return Err(bad("no amount"));
    }
    let mut total: u128 = 0;
    let mut last_rank = usize::MAX; // units must come largest first
    let mut in_time = !iso; // ISO: `T` separates days from hours/minutes/seconds
    while !rest.is_empty() {
        if iso && !in_time && rest.starts_with(['T', 't']) {
            in_time = true;
            rest = &rest[1..];
            if rest.is_empty() {
                return Err(bad("nothing after T"));
            }
            continue;
        }
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(bad("expected a number"));
        }
        let (num, after) = rest.split_at(num_len);
        let Some(unit) = after.chars().next() else {
            return Err(bad(
                "a unit (s, m, h, d) must follow every number but a lone one",
            ));
        };
        let (rank, secs) = match unit.to_ascii_lowercase() {
            'd' if !iso || !in_time => (3, 86_400),
            'h' if in_time => (2, 3_600),
            'm' if in_time => (1, 60),
            's' if in_time => (0, 1),
            'm' | 'y' | 'w' if iso => return Err(bad("years, months and weeks are not supported")),
            _ => return Err(bad(&format!("unknown unit {unit:?}; use s, m, h or d"))),
        };
        if rank >= last_rank {
            return Err(bad("units must be given largest first, each once"));
        }
        last_rank = rank;
        total = amount_nanos(num, secs)
            .and_then(|n| total.checked_add(n).ok_or("too large"))
            .map_err(bad)?;
        rest = &after[unit.len_utf8()..];
    }
    nanos_to_duration(total).map_err(bad)
}

/// `num` (digits with an optional fraction of up to 9 digits) times `unit_secs`, in nanoseconds.
fn amount_nanos(num: &str, unit_secs: u128) -> Result<u128, &'static str> {
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if (whole.is_empty() && frac.is_empty()) || frac.len() > 9 || frac.contains('.') {
        return Err("bad number");
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| "too large")?
    };
    let frac: u128 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().map_err(|_| "bad number")?
    };
    whole
        .checked_mul(1_000_000_000)
        .and_then(|w| w.checked_add(frac))
        .and_then(|n| n.checked_mul(unit_secs))
        .ok_or("too large")
}

fn nanos_to_duration(nanos: u128) -> Result<Duration, &'static str> {
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| "too large")?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// gcloud's binary sizes: units `B`, `KB`, `KiB`, `MB`, `MiB`, `GB`, `GiB`, `TB`, `TiB`, `PB`,
/// `PiB`, case-insensitive, all powers of 1024 (gcloud's `KB` is a KiB). A plain integer is in
/// KB when `default_unit_kb` (as for `--cloud-storage-max-bytes`), else in bytes.
pub fn parse_binary_size(s: &str, default_unit_kb: bool) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (num, unit) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size: expected INTEGER[UNIT], e.g. 1000, 64KB, 10MiB, 1GB"
        ));
    }
    let scale: u64 = match unit.to_ascii_uppercase().as_str() {
        "" if default_unit_kb => 1 << 10,
        "" | "B" => 1,
        "KB" | "KIB" => 1 << 10,
        "MB" | "MIB" => 1 << 20,
        "GB" | "GIB" => 1 << 30,
        "TB" | "TIB" => 1 << 40,
        "PB" | "PIB" => 1 << 50,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?}; use B, KB, KiB, MB, MiB, GB, GiB, TB or TiB"
            ))
        }
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{validate, LimitsMode, OutputFormat};
    use serde_json::json;

    #[test]
    fn durations_in_every_unit() {
        let cases = [
            ("90", 90_000),
            ("90s", 90_000),
            ("90S", 90_000),
            ("5m", 300_000),
            ("5M", 300_000),
            ("1h", 3_600_000),
            ("2d", 172_800_000),
            ("1h30m", 5_400_000),
            ("1d2h3m4s", 93_784_000),
            ("1.5m", 90_000),
            ("0.25s", 250),
            ("2.5", 2_500),
            ("0", 0),
            (" 10m ", 600_000),
            ("PT5M", 300_000),
            ("pt90s", 90_000),
            ("PT1H30M", 5_400_000),
            ("P1D", 86_400_000),
            ("P1DT2H", 93_600_000),
            ("PT0.5S", 500),
        ];
        for (s, ms) in cases {
            assert_eq!(parse_duration(s), Ok(Duration::from_millis(ms)), "{s}");
        }
        assert_eq!(parse_duration("1.000000001s"), Ok(Duration::new(1, 1)));
    }

    #[test]
    fn duration_errors() {
        for s in [
            "",
            "s",
            "m5",
            "5x",
            "5 m",
            "-5s",
            "1m1h",
            "1m1m",
            "1h30",
            "1.2.3s",
            "1.0000000001s",
            "P",
            "PT",
            "P1M",
            "P1Y",
            "P1W",
            "PT1D",
            "P1H",
            "..s",
            "99999999999999999999999d",
        ] {
            let e = parse_duration(s).expect_err(s);
            assert!(e.contains(&format!("{s:?}")), "{s}: {e}");
        }
    }

    #[test]
    fn binary_sizes_in_every_unit() {
        let k = 1u64 << 10;
        let cases = [
            ("1000", true, 1000 * k),
            ("1000", false, 1000),
            ("1000B", true, 1000),
            ("1000b", true, 1000),
            ("1KB", true, k),
            ("1kb", true, k),
            ("1KiB", true, k),
            ("1kib", true, k),
            ("10MB", true, 10 << 20),
            ("10MiB", true, 10 << 20),
            ("10mb", true, 10 << 20),
            ("10GB", true, 10 << 30),
            ("10GiB", true, 10 << 30),
            ("1TB", true, 1 << 40),
            ("1TiB", true, 1 << 40),
            ("1PB", true, 1 << 50),
            ("1PiB", true, 1 << 50),
            ("0", true, 0),
            (" 64KB ", true, 64 * k),
        ];
        for (s, kb, want) in cases {
            assert_eq!(parse_binary_size(s, kb), Ok(want), "{s}");
        }
    }

    #[test]
    fn binary_size_errors() {
        for s in [
            "",
            "KB",
            "1.5KB",
            "-1KB",
            "10XB",
            "10 K",
            "10K",
            "1e3",
            "10 KB",
            "99999999999999999999",
            "16384PB",
        ] {
            let e = parse_binary_size(s, true).expect_err(s);
            assert!(e.contains(&format!("{s:?}")), "{s}: {e}");
        }
    }

    fn storage_flags() -> GcloudFlags {
        GcloudFlags {
            subscription_name: Some("projects/my-project/subscriptions/my-export".into()),
            topic: Some("events".into()),
            cloud_storage_bucket: Some("my-bucket".into()),
            cloud_storage_file_prefix: Some("prod_".into()),
            cloud_storage_file_suffix: Some("_archive".into()),
            cloud_storage_file_datetime_format: Some("YYYY-MM-DD/hh_mm_ssZ".into()),
            cloud_storage_max_duration: Some("90s".into()),
            cloud_storage_max_bytes: Some("10MB".into()),
            cloud_storage_max_messages: Some("1000".into()),
            cloud_storage_output_format: Some("avro".into()),
            cloud_storage_write_metadata: true,
            cloud_storage_use_topic_schema: false,
            ..GcloudFlags::default()
        }
    }

    #[test]
    fn flags_become_a_rest_resource() {
        let sub = storage_flags().to_subscription().unwrap();
        assert_eq!(
            serde_json::to_value(&sub).unwrap(),
            json!({
                "name": "projects/my-project/subscriptions/my-export",
                "topic": "projects/my-project/topics/events",
                "cloudStorageConfig": {
                    "bucket": "my-bucket",
                    "filenamePrefix": "prod_",
                    "filenameSuffix": "_archive",
                    "filenameDatetimeFormat": "YYYY-MM-DD/hh_mm_ssZ",
                    "avroConfig": {"writeMetadata": true},
                    "maxDuration": "90s",
                    "maxBytes": "10485760",
                    "maxMessages": "1000"
                }
            })
        );
        let valid = validate(&sub, None).unwrap();
        let s = valid.storage.unwrap();
        assert_eq!(s.max_duration, Duration::from_secs(90));
        assert_eq!(s.max_bytes, Some(10 << 20));
        assert_eq!(
            s.output,
            OutputFormat::Avro {
                write_metadata: true,
                use_topic_schema: false
            }
        );
    }

    #[test]
    fn names_and_defaults() {
        // Bare subscription ID with a full topic; text by default.
        let flags = GcloudFlags {
            subscription_name: Some("sub-1".into()),
            topic: Some("projects/p/topics/t-1".into()),
            cloud_storage_bucket: Some("bkt".into()),
            ..GcloudFlags::default()
        };
        let sub = flags.to_subscription().unwrap();
        assert_eq!(sub.name, "projects/p/subscriptions/sub-1");
        assert_eq!(sub.topic, "projects/p/topics/t-1");
        let cs = sub.cloud_storage_config.clone().unwrap();
        assert_eq!(cs.text_config, Some(TextConfig {}));
        assert_eq!(cs.avro_config, None);
        assert_eq!(
            validate(&sub, None).unwrap().storage.unwrap().output,
            OutputFormat::Text
        );

        // No topic: Pub/Sub's `_deleted-topic_`; no storage flags: a pull subscription.
        let flags = GcloudFlags {
            subscription_name: Some("projects/p/subscriptions/sub-1".into()),
            ..GcloudFlags::default()
        };
        let sub = flags.to_subscription().unwrap();
        assert_eq!(sub.topic, NO_TOPIC);
        assert_eq!(sub.cloud_storage_config, None);
        assert!(validate(&sub, None).unwrap().storage.is_none());
    }

    #[test]
    fn flag_errors_are_all_reported_under_their_flag() {
        let flags = GcloudFlags {
            subscription_name: Some("sub-1".into()),
            cloud_storage_max_duration: Some("5 minutes".into()),
            cloud_storage_max_bytes: Some("10XB".into()),
            cloud_storage_max_messages: Some("many".into()),
            cloud_storage_write_metadata: true,
            cloud_storage_use_topic_schema: true,
            ..GcloudFlags::default()
        };
        let err = flags.to_subscription().unwrap_err();
        let fields: Vec<&str> = err.violations().iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "--subscription-name",
                "--cloud-storage-bucket",
                "--cloud-storage-max-duration",
                "--cloud-storage-max-bytes",
                "--cloud-storage-max-messages",
                "--cloud-storage-write-metadata",
                "--cloud-storage-use-topic-schema",
            ]
        );
        assert_eq!(err.to_string().lines().count(), 7, "{err}");

        let flags = GcloudFlags {
            cloud_storage_output_format: Some("parquet".into()),
            ..storage_flags()
        };
        let err = flags.to_subscription().unwrap_err();
        assert_eq!(
            err.to_string(),
            "--cloud-storage-output-format: must be text or avro, got \"parquet\""
        );

        let err = GcloudFlags::default().to_subscription().unwrap_err();
        assert_eq!(err.violations()[0].field, "--subscription-name");
    }

    #[test]
    fn ranges_are_left_to_validation() {
        let flags = GcloudFlags {
            cloud_storage_max_duration: Some("2s".into()),
            cloud_storage_max_messages: Some("10".into()),
            cloud_storage_max_bytes: Some("1B".into()),
            ..storage_flags()
        };
        let sub = flags.to_subscription().unwrap();
        let err = validate(&sub, None).unwrap_err();
        let fields: Vec<&str> = err.violations().iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "cloudStorageConfig.maxDuration",
                "cloudStorageConfig.maxBytes",
                "cloudStorageConfig.maxMessages"
            ]
        );
        let s = validate(&sub, Some(LimitsMode::Extended))
            .unwrap()
            .storage
            .unwrap();
        assert_eq!(s.max_duration, Duration::from_secs(2));
        assert_eq!(s.max_bytes, Some(1));
        assert_eq!(s.max_messages, Some(10));
    }
}
