//! `subsink.paths`: partitioned object paths of a Cloud Storage subscription (docs/contract.md
//! §7), checked once into [`PathPartitions`].
//!
//! Each partition is a Hive-style directory `name=value/` in front of an object's file name; its
//! value comes from exactly one of the message's publish time (rendered with the
//! `filenameDatetimeFormat` grammar, [`DatetimeFormat::parse_partition`]), an attribute, or a key
//! of a JSON object payload. Where the directories go and how values are escaped is
//! [`crate::paths`]' business; this module only says whether the configuration is usable.

use super::resource::ObjectPaths;
use crate::naming::DatetimeFormat;

/// At most this many partitions (directory levels).
pub const MAX_PARTITIONS: usize = 16;
/// A partition name's bytes at most.
const MAX_NAME_BYTES: usize = 128;
/// Pub/Sub's limit on an attribute key (docs/contract.md §1.2).
const MAX_ATTRIBUTE_KEY_BYTES: usize = 256;

/// Where a partition's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionValue {
    /// The message's publish time (UTC), rendered with this format.
    PublishTime(DatetimeFormat),
    /// The value of this attribute.
    Attribute(String),
    /// The value at this key path of a JSON object payload (`["a", "b"]` for `a.b`).
    Field(Vec<String>),
    /// An event time the message carries (UTC), rendered with this format, as Kafka Connect's
    /// time-based partitioner does with a record field.
    EventTime(EventTimeSource, DatetimeFormat),
}

/// Where a message's event time is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventTimeSource {
    /// A key path of a JSON object payload.
    Field(Vec<String>),
    /// An attribute.
    Attribute(String),
}

impl std::fmt::Display for EventTimeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventTimeSource::Field(keys) => write!(f, "field `{}`", keys.join(".")),
            EventTimeSource::Attribute(a) => write!(f, "attribute `{a}`"),
        }
    }
}

/// One directory level: `name=value/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub value: PartitionValue,
}

/// Validated `subsink.paths`: the partitions, in directory order (1 to [`MAX_PARTITIONS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPartitions {
    pub partitions: Vec<Partition>,
}

impl PathPartitions {
    /// Bytes every partition directory takes whatever the message: names, `=`, `/` and the
    /// rendered publish times (escaped: a `:` becomes `%3A`). Attribute and field values add
    /// their own.
    pub fn fixed_len(&self) -> usize {
        self.partitions
            .iter()
            .map(|p| {
                let value = match &p.value {
                    PartitionValue::PublishTime(f) | PartitionValue::EventTime(_, f) => {
                        f.rendered_len() + 2 * f.as_str().matches(':').count()
                    }
                    _ => 0,
                };
                p.name.len() + 2 + value
            })
            .sum()
    }
}

/// Checks `subsink.paths`; every rule broken is reported through `fail(field, rule)`. `None` when
/// one was.
pub fn check(paths: &ObjectPaths, fail: &mut dyn FnMut(String, String)) -> Option<PathPartitions> {
    const F: &str = "subsink.paths.partitions";
    let before = std::cell::Cell::new(0usize);
    let mut fail = |field: String, rule: String| {
        before.set(before.get() + 1);
        fail(field, rule)
    };
    if paths.partitions.is_empty() {
        fail(
            F.into(),
            "at least one partition is required (remove subsink.paths to write without)".into(),
        );
    } else if paths.partitions.len() > MAX_PARTITIONS {
        fail(
            F.into(),
            format!(
                "at most {MAX_PARTITIONS} partitions, got {}",
                paths.partitions.len()
            ),
        );
    }
    let mut out = Vec::new();
    for (i, raw) in paths.partitions.iter().enumerate() {
        let at = format!("{F}[{i}]");
        if raw.name.is_empty() {
            fail(
                format!("{at}.name"),
                "required: the directory's key, e.g. dt".into(),
            );
        } else if let Err(rule) = check_name(&raw.name) {
            fail(format!("{at}.name"), rule);
        } else if let Some(j) = paths.partitions[..i]
            .iter()
            .position(|p| p.name.eq_ignore_ascii_case(&raw.name))
        {
            fail(
                format!("{at}.name"),
                format!(
                    "{:?} is already the name of partition {j} (names are case-insensitive, \
                     as Hive's and Spark's columns)",
                    raw.name
                ),
            );
        }
        let given: Vec<&str> = [
            ("publishTime", raw.publish_time.is_some()),
            ("attribute", raw.attribute.is_some()),
            ("field", raw.field.is_some()),
            ("eventTime", raw.event_time.is_some()),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(k, _)| k)
        .collect();
        if given.len() != 1 {
            let rule = if given.is_empty() {
                "one of publishTime, attribute, field or eventTime is required".to_string()
            } else {
                format!(
                    "publishTime, attribute, field and eventTime are exclusive; found {}",
                    given.join(" and ")
                )
            };
            fail(at.clone(), rule);
            continue;
        }
        let value = if let Some(f) = &raw.publish_time {
            match DatetimeFormat::parse_partition(f) {
                Ok(f) => PartitionValue::PublishTime(f),
                Err(e) => {
                    fail(format!("{at}.publishTime"), e.to_string());
                    continue;
                }
            }
        } else if let Some(a) = &raw.attribute {
            match attribute_key(a) {
                Ok(()) => PartitionValue::Attribute(a.clone()),
                Err(rule) => {
                    fail(format!("{at}.attribute"), rule);
                    continue;
                }
            }
        } else if let Some(f) = &raw.field {
            match field_keys(f) {
                Ok(keys) => PartitionValue::Field(keys),
                Err(rule) => {
                    fail(format!("{at}.field"), rule);
                    continue;
                }
            }
        } else {
            let e = raw.event_time.as_ref().expect("one source is given");
            match event_time(e, &format!("{at}.eventTime"), &mut fail) {
                Some(v) => v,
                None => continue,
            }
        };
        out.push(Partition {
            name: raw.name.clone(),
            value,
        });
    }
    (before.get() == 0).then_some(PathPartitions { partitions: out })
}

/// An attribute key a partition reads: 1 to 256 bytes.
fn attribute_key(a: &str) -> Result<(), String> {
    if a.is_empty() || a.len() > MAX_ATTRIBUTE_KEY_BYTES {
        return Err(format!(
            "must be an attribute key of 1 to {MAX_ATTRIBUTE_KEY_BYTES} bytes, got {} bytes",
            a.len()
        ));
    }
    Ok(())
}

/// A key path of the JSON payload: keys joined by `.`, none empty.
fn field_keys(f: &str) -> Result<Vec<String>, String> {
    let keys: Vec<String> = f.split('.').map(str::to_string).collect();
    if keys.iter().any(String::is_empty) {
        return Err(format!(
            "must be a key of the JSON payload, or keys joined by '.' (a.b), without an empty \
             one; got {f:?}"
        ));
    }
    Ok(keys)
}

/// `eventTime` at `at`: a format, and exactly one of a field or an attribute. `None` when a rule
/// was broken (each reported through `fail`).
fn event_time(
    e: &super::resource::RawEventTime,
    at: &str,
    fail: &mut dyn FnMut(String, String),
) -> Option<PartitionValue> {
    let format = if e.format.is_empty() {
        fail(
            format!("{at}.format"),
            "required: how the event time is written, in the publishTime grammar (YYYY-MM-DD)"
                .into(),
        );
        None
    } else {
        match DatetimeFormat::parse_partition(&e.format) {
            Ok(f) => Some(f),
            Err(err) => {
                fail(format!("{at}.format"), err.to_string());
                None
            }
        }
    };
    let source = match (&e.field, &e.attribute) {
        (Some(f), None) => match field_keys(f) {
            Ok(keys) => Some(EventTimeSource::Field(keys)),
            Err(rule) => {
                fail(format!("{at}.field"), rule);
                None
            }
        },
        (None, Some(a)) => match attribute_key(a) {
            Ok(()) => Some(EventTimeSource::Attribute(a.clone())),
            Err(rule) => {
                fail(format!("{at}.attribute"), rule);
                None
            }
        },
        (None, None) => {
            fail(
                at.into(),
                "one of field or attribute is required: where the message's event time is".into(),
            );
            None
        }
        (Some(_), Some(_)) => {
            fail(at.into(), "field and attribute are exclusive".into());
            None
        }
    };
    Some(PartitionValue::EventTime(source?, format?))
}

/// A partition name: ASCII letters, digits and `_`, not starting with a digit (a column name
/// every Hive-partitioned reader takes as is).
fn check_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "must be at most {MAX_NAME_BYTES} bytes, got {}",
            name.len()
        ));
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if let Some(c) = name.chars().find(|c| !ok_char(*c)) {
        return Err(format!(
            "{name:?} has {c:?}: a partition name is ASCII letters, digits and '_' (it becomes \
             a column of Hive-partitioned readers)"
        ));
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!("{name:?} must not start with a digit"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::resource::RawPartition;

    fn part(name: &str, kind: &str, v: &str) -> RawPartition {
        let mut p = RawPartition {
            name: name.into(),
            ..Default::default()
        };
        match kind {
            "publishTime" => p.publish_time = Some(v.into()),
            "attribute" => p.attribute = Some(v.into()),
            _ => p.field = Some(v.into()),
        }
        p
    }

    fn event(name: &str, format: &str, field: Option<&str>, attr: Option<&str>) -> RawPartition {
        RawPartition {
            name: name.into(),
            event_time: Some(crate::config::resource::RawEventTime {
                format: format.into(),
                field: field.map(str::to_string),
                attribute: attr.map(str::to_string),
            }),
            ..Default::default()
        }
    }

    fn run(partitions: Vec<RawPartition>) -> Result<PathPartitions, Vec<(String, String)>> {
        let mut v = Vec::new();
        let out = check(&ObjectPaths { partitions }, &mut |f, r| v.push((f, r)));
        out.ok_or(v)
    }

    #[test]
    fn every_kind_of_value_is_taken() {
        let p = run(vec![
            part("dt", "publishTime", "YYYY-MM-DD"),
            part("hour", "publishTime", "hh"),
            part("region", "attribute", "region"),
            part("kind", "field", "meta.kind"),
            event("day", "YYYY-MM-DD", Some("meta.ts"), None),
            event("at", "hh:mm", None, Some("event_time")),
        ])
        .unwrap();
        assert_eq!(p.partitions.len(), 6);
        assert_eq!(
            p.partitions[4].value,
            PartitionValue::EventTime(
                EventTimeSource::Field(vec!["meta".into(), "ts".into()]),
                DatetimeFormat::parse_partition("YYYY-MM-DD").unwrap()
            )
        );
        assert_eq!(
            p.partitions[5].value,
            PartitionValue::EventTime(
                EventTimeSource::Attribute("event_time".into()),
                DatetimeFormat::parse_partition("hh:mm").unwrap()
            )
        );
        assert_eq!(p.fixed_len(), 14 + 8 + 8 + 6 + 15 + 11);
        assert_eq!(
            p.partitions[3].value,
            PartitionValue::Field(vec!["meta".into(), "kind".into()])
        );
        assert_eq!(
            p.partitions[2].value,
            PartitionValue::Attribute("region".into())
        );
        // dt=2026-12-05/ hour=04/ region=/ kind=/ day=2026-12-05/ at=04%3A05/
    }

    #[test]
    fn each_rule_names_its_field() {
        let cases: Vec<(Vec<RawPartition>, &str, &str)> = vec![
            (vec![], "subsink.paths.partitions", "at least one"),
            (
                (0..17)
                    .map(|i| part(&format!("p{i}"), "attribute", "a"))
                    .collect(),
                "subsink.paths.partitions",
                "at most 16",
            ),
            (
                vec![part("", "attribute", "a")],
                "subsink.paths.partitions[0].name",
                "required",
            ),
            (
                vec![part("a-b", "attribute", "a")],
                "subsink.paths.partitions[0].name",
                "'-'",
            ),
            (
                vec![part("1a", "attribute", "a")],
                "subsink.paths.partitions[0].name",
                "digit",
            ),
            (
                vec![part("dt", "attribute", "a"), part("DT", "attribute", "b")],
                "subsink.paths.partitions[1].name",
                "already",
            ),
            (
                vec![part("dt", "publishTime", "YYYY/MM")],
                "subsink.paths.partitions[0].publishTime",
                "'/' at position 4",
            ),
            (
                vec![part("dt", "publishTime", "YYYY-YY")],
                "subsink.paths.partitions[0].publishTime",
                "year given twice",
            ),
            (
                vec![part("dt", "publishTime", "T-Z")],
                "subsink.paths.partitions[0].publishTime",
                "no matcher",
            ),
            (
                vec![part("dt", "publishTime", "")],
                "subsink.paths.partitions[0].publishTime",
                "no matcher",
            ),
            (
                vec![part("dt", "attribute", "")],
                "subsink.paths.partitions[0].attribute",
                "1 to 256 bytes",
            ),
            (
                vec![part("k", "field", "a..b")],
                "subsink.paths.partitions[0].field",
                "without an empty one",
            ),
            (
                vec![RawPartition {
                    name: "k".into(),
                    ..Default::default()
                }],
                "subsink.paths.partitions[0]",
                "one of publishTime, attribute, field or eventTime is required",
            ),
            (
                vec![event("dt", "", Some("ts"), None)],
                "subsink.paths.partitions[0].eventTime.format",
                "required: how the event time is written",
            ),
            (
                vec![event("dt", "YYYY/MM", Some("ts"), None)],
                "subsink.paths.partitions[0].eventTime.format",
                "'/' at position 4",
            ),
            (
                vec![event("dt", "YYYY", None, None)],
                "subsink.paths.partitions[0].eventTime",
                "one of field or attribute is required",
            ),
            (
                vec![event("dt", "YYYY", Some("ts"), Some("t"))],
                "subsink.paths.partitions[0].eventTime",
                "field and attribute are exclusive",
            ),
            (
                vec![event("dt", "YYYY", Some("a..b"), None)],
                "subsink.paths.partitions[0].eventTime.field",
                "without an empty one",
            ),
            (
                vec![event("dt", "YYYY", None, Some(""))],
                "subsink.paths.partitions[0].eventTime.attribute",
                "1 to 256 bytes",
            ),
            (
                vec![RawPartition {
                    publish_time: Some("YYYY".into()),
                    ..event("dt", "YYYY", Some("ts"), None)
                }],
                "subsink.paths.partitions[0]",
                "exclusive; found publishTime and eventTime",
            ),
            (
                vec![RawPartition {
                    name: "k".into(),
                    attribute: Some("a".into()),
                    field: Some("b".into()),
                    ..Default::default()
                }],
                "subsink.paths.partitions[0]",
                "exclusive; found attribute and field",
            ),
        ];
        for (parts, field, rule) in cases {
            let v = run(parts).unwrap_err();
            assert_eq!(v.len(), 1, "{v:?}");
            assert_eq!(v[0].0, field, "{v:?}");
            assert!(v[0].1.contains(rule), "{:?} lacks {rule:?}", v[0].1);
        }
    }
}
