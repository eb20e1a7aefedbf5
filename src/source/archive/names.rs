//! Which listed objects are export objects, and the datetime their names carry.
//!
//! With `--archive-subscription`, a name must follow that subscription's naming rule exactly
//! ([`crate::naming::check_object_name`], the check `inspect --subscription` makes), with its
//! partition directories when it has `subsink.paths` ([`crate::paths::check_partitioned_name`]:
//! `k=v/` segments of its partitions' names, in order, after the prefix's directory). Without one,
//! a name is taken when its last path segment ends like an export name: a datetime, the
//! separator, a hyphenated UUID, then any suffix without `/`. The datetime is read from the
//! digits before the UUID, in year-month-day-hour-minute-second order (14 digits, or 12 with a
//! two-digit year); a format in another order needs `--archive-subscription`.

use chrono::{DateTime, Utc};

use crate::naming::{check_object_name, DatetimeFormat, UUID_LEN};
use crate::paths::check_partitioned_name;

/// How export names are recognised.
#[derive(Debug, Clone)]
pub enum NameRule {
    /// Anything that ends like `<datetime><sep><uuid><suffix>`.
    Any,
    /// A subscription's rule.
    Exact {
        prefix: String,
        format: DatetimeFormat,
        suffix: String,
        /// The names of its partitions (`subsink.paths`), in directory order; empty: none.
        partitions: Vec<String>,
    },
}

impl NameRule {
    /// The datetime of `key` (the object's path in its bucket), or why it is not an export name.
    pub fn datetime(&self, key: &str) -> Result<DateTime<Utc>, String> {
        match self {
            NameRule::Exact {
                prefix,
                format,
                suffix,
                partitions,
            } if !partitions.is_empty() => {
                check_partitioned_name(key, prefix, format, suffix, partitions)
                    .map(|(p, _)| p.datetime)
                    .map_err(|e| e.to_string())
            }
            NameRule::Exact {
                prefix,
                format,
                suffix,
                ..
            } => check_object_name(key, prefix, format, suffix)
                .map(|p| p.datetime)
                .map_err(|e| e.to_string()),
            NameRule::Any => any_datetime(key),
        }
    }
}

/// The default recognition (see the module docs).
fn any_datetime(key: &str) -> Result<DateTime<Utc>, String> {
    let segment = key.rsplit('/').next().unwrap_or(key);
    // The UUID: the last 36-character run that parses as a hyphenated UUID.
    let bytes = segment.as_bytes();
    let mut found = None;
    if bytes.len() >= UUID_LEN {
        for start in (0..=bytes.len() - UUID_LEN).rev() {
            let Some(text) = segment.get(start..start + UUID_LEN) else {
                continue;
            };
            if text.as_bytes()[8] == b'-' && uuid::Uuid::try_parse(text).is_ok() {
                found = Some(start);
                break;
            }
        }
    }
    let start = found.ok_or("no <uuid> in the name")?;
    // Everything before the uuid, in the whole key (a format may hold `/`).
    let before_uuid = &key[..key.len() - segment.len() + start];
    let tail: String = {
        let allowed = |c: char| c.is_ascii_digit() || "-_:/TZ+".contains(c);
        let cut = before_uuid
            .char_indices()
            .rev()
            .take_while(|(_, c)| allowed(*c))
            .last()
            .map_or(before_uuid.len(), |(i, _)| i);
        before_uuid[cut..].replace("+00:00", "")
    };
    let digits: Vec<u32> = tail
        .chars()
        .filter_map(|c| c.to_digit(10))
        .collect::<Vec<_>>();
    let num = |d: &[u32]| d.iter().fold(0u32, |a, x| a * 10 + x);
    let parse = |d: &[u32], year: i32| {
        chrono::NaiveDate::from_ymd_opt(year, num(&d[0..2]), num(&d[2..4]))
            .and_then(|date| date.and_hms_opt(num(&d[4..6]), num(&d[6..8]), num(&d[8..10])))
            .map(|t| t.and_utc())
    };
    let n = digits.len();
    if n >= 14 {
        let d = &digits[n - 14..];
        if let Some(t) = parse(&d[4..], num(&d[..4]) as i32) {
            return Ok(t);
        }
    }
    if n >= 12 {
        let d = &digits[n - 12..];
        if let Some(t) = parse(&d[2..], 2000 + num(&d[..2]) as i32) {
            return Ok(t);
        }
    }
    Err("no <datetime> before the <uuid>".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "0f8c7e6a-1b2c-4d3e-8f90-123456789abc";

    #[test]
    fn default_recognition_reads_common_formats() {
        let t = |s: &str| any_datetime(s).map(|t| t.to_rfc3339());
        let want = Ok("2024-05-06T07:08:09+00:00".to_string());
        assert_eq!(t(&format!("a/2024-05-06T07:08:09+00:00_{U}")), want);
        assert_eq!(t(&format!("a/p-2024-05-06T07:08:09Z_{U}.avro")), want);
        assert_eq!(t(&format!("x/2024/05/06/07:08:09/{U}.txt")), want);
        assert_eq!(t(&format!("240506070809_{U}")), want);
        assert!(t(&format!("notes_{U}")).is_err());
        assert!(t("2024-05-06T07:08:09Z_not-a-uuid").is_err());
        assert!(t(&format!("2024-13-06T07:08:09Z_{U}")).is_err());
    }

    #[test]
    fn exact_rule_follows_the_subscription() {
        let rule = NameRule::Exact {
            prefix: "ev/".into(),
            format: DatetimeFormat::parse("YYYY-MM-DD/hh_mm_ss").unwrap(),
            suffix: ".avro".into(),
            partitions: Vec::new(),
        };
        assert!(rule
            .datetime(&format!("ev/2024-05-06/07_08_09_{U}.avro"))
            .is_ok());
        assert!(rule
            .datetime(&format!("ev/2024-05-06/07_08_09_{U}.txt"))
            .is_err());
        assert!(rule
            .datetime(&format!("other/2024-05-06/07_08_09_{U}.avro"))
            .is_err());
    }

    #[test]
    fn exact_rule_reads_partition_directories() {
        let rule = NameRule::Exact {
            prefix: "ev/data-".into(),
            format: DatetimeFormat::parse("YYYY-MM-DD/hh_mm_ss").unwrap(),
            suffix: ".avro".into(),
            partitions: vec!["dt".into(), "region".into()],
        };
        let t = rule
            .datetime(&format!(
                "ev/dt=2024-05-06/region=eu%2Fw/data-2024-05-06/07_08_09_{U}.avro"
            ))
            .unwrap();
        assert_eq!(t.to_rfc3339(), "2024-05-06T07:08:09+00:00");
        for bad in [
            format!("ev/data-2024-05-06/07_08_09_{U}.avro"),
            format!("ev/dt=2024-05-06/data-2024-05-06/07_08_09_{U}.avro"),
            format!("ev/region=eu/dt=2024-05-06/data-2024-05-06/07_08_09_{U}.avro"),
            format!("xv/dt=2024-05-06/region=eu/data-2024-05-06/07_08_09_{U}.avro"),
        ] {
            assert!(rule.datetime(&bad).is_err(), "{bad}");
        }
    }
}
