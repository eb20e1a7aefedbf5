//! Partitioned object paths (docs/contract.md §7, `subsink.paths`): the Hive-style directory
//! `k1=v1/k2=v2/` a message's object goes in, and reading it back from a name. Pure.
//!
//! * **Where.** The directory goes between the `filenamePrefix`'s own directory (up to its last
//!   `/`) and the rest of the prefix: prefix `exports/data-` gives
//!   `exports/dt=2026-12-05/data-<datetime>_<uuid><suffix>`, so every `k=v` is a whole path
//!   segment, as Hive-partitioned readers need.
//! * **Values.** Escaped as Hive's `FileUtils.escapePathName` (and Spark's
//!   `ExternalCatalogUtils.escapePathName`) do: ASCII control characters and
//!   `" # % ' * / : = ? \ { [ ] ^` become `%XX` (upper-case hex), everything else is kept (UTF-8
//!   as is). Readers that take Hive partitioning URL-decode a value back.
//! * **NULL.** A missing attribute or JSON field, a JSON `null`, object or array, a payload that
//!   is not a JSON object, and the empty string go to [`NULL_PARTITION`], Hive's and Spark's
//!   directory for a NULL partition value.
//! * **Event time.** A partition's `eventTime` is read from a JSON field or an attribute: RFC
//!   3339 text (any offset, taken to UTC) or an integer of epoch milliseconds (a JSON number or
//!   its digits as text), in the years 0000 to 9999. A message without one, or with one that
//!   does not parse, is refused as a bad message ([`PathError::EventTime`], naming the message
//!   id, the partition, where the time was looked for and the rule): writing it under its
//!   publish time or NULL would put it in a folder a query by event time never reads.
//! * **Groups.** One open file per path: the directory is part of the file's group
//!   ([`group`]), together with the format's own group (a topic-schema revision).

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use chrono::Datelike;

use crate::config::{EventTimeSource, PartitionValue, PathPartitions};
use crate::message::Message;
use crate::naming::{self, split_prefix, DatetimeFormat, NameMismatch, NameParts};

/// The directory value of a NULL (missing, empty, not a scalar) partition value.
pub const NULL_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// Bytes of one path segment (`name=value`) at most: what common file systems hold (ext4, XFS,
/// APFS, NTFS), so a partitioned bucket can be copied to a disk and read there.
pub const MAX_SEGMENT_BYTES: usize = 255;
/// Bytes of an object name at most (Cloud Storage's limit; S3's and Azure's are alike).
pub const MAX_NAME_BYTES: usize = 1024;

/// Why a message's object cannot be named: it is refused (as a message the format cannot
/// encode is), never written under another path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error(
        "the value of partition {name} is {bytes} bytes escaped; a path segment (name=value) \
         holds at most {MAX_SEGMENT_BYTES} bytes"
    )]
    Segment { name: String, bytes: usize },
    #[error(
        "its object name {name:?}… would be {bytes} bytes with its partition directories; \
         object names hold at most {MAX_NAME_BYTES} bytes"
    )]
    Name { name: String, bytes: usize },
    #[error(
        "message {message_id}: partition {partition} takes its event time from {from}, \
         {problem}; an event time is RFC 3339 text (2026-12-05T22:30:00Z, any offset) or an \
         integer of epoch milliseconds, in the years 0000 to 9999"
    )]
    EventTime {
        message_id: String,
        partition: String,
        from: String,
        problem: String,
    },
}

/// A message's event time from `text` (see the module docs); `None` when it is not one.
pub fn parse_event_time(text: &str) -> Option<DateTime<Utc>> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let t = if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        DateTime::<Utc>::from_timestamp_millis(text.parse().ok()?)?
    } else {
        DateTime::parse_from_rfc3339(text).ok()?.with_timezone(&Utc)
    };
    (0..=9999).contains(&t.year()).then_some(t)
}

/// The event time of `msg` at `source`, or what is wrong with it (for [`PathError::EventTime`]).
fn event_time(source: &EventTimeSource, msg: &Message) -> Result<DateTime<Utc>, String> {
    let text = match source {
        EventTimeSource::Field(keys) => json_field(&msg.data, keys).ok_or(
            "which it does not have (missing, null, an object or an array, or the payload is \
             not a JSON object)",
        )?,
        EventTimeSource::Attribute(key) => msg
            .attributes
            .get(key)
            .ok_or("which it does not have")?
            .to_string(),
    };
    parse_event_time(&text).ok_or_else(|| {
        let mut shown: String = text.chars().take(64).collect();
        if shown.len() < text.len() {
            shown.push('…');
        }
        format!("which is {shown:?}")
    })
}

/// A message whose event-time partitions have no usable time: refused, naming the message, the
/// partition and the rule.
pub fn check_message(p: &PathPartitions, msg: &Message) -> Result<(), PathError> {
    for part in &p.partitions {
        if let PartitionValue::EventTime(source, _) = &part.value {
            event_time(source, msg).map_err(|problem| PathError::EventTime {
                message_id: msg.message_id.clone(),
                partition: part.name.clone(),
                from: source.to_string(),
                problem,
            })?;
        }
    }
    Ok(())
}

/// Does Hive escape `c` in a partition value?
fn escaped(c: char) -> bool {
    c.is_ascii_control()
        || matches!(
            c,
            '"' | '#' | '%' | '\'' | '*' | '/' | ':' | '=' | '?' | '\\' | '{' | '[' | ']' | '^'
        )
}

/// Appends `value` escaped as a partition value (see the module docs); empty: [`NULL_PARTITION`].
pub fn escape_into(value: &str, out: &mut String) {
    if value.is_empty() {
        out.push_str(NULL_PARTITION);
        return;
    }
    for c in value.chars() {
        if escaped(c) {
            let _ = write!(out, "%{:02X}", c as u32);
        } else {
            out.push(c);
        }
    }
}

/// The directory of `msg`: `name=value/` for each partition, in order. A segment longer than
/// [`MAX_SEGMENT_BYTES`] is written `name=\0<bytes>` instead, and one without a usable event time
/// `name=\0?` (a NUL is escaped in any value, so it cannot be taken for one): [`check_dir`]
/// refuses both, and the file group stays short.
pub fn dir_of(p: &PathPartitions, msg: &Message) -> String {
    let mut out = String::with_capacity(64);
    for part in &p.partitions {
        let segment = out.len();
        out.push_str(&part.name);
        out.push('=');
        let value = out.len();
        match &part.value {
            PartitionValue::PublishTime(f) => {
                let t = DateTime::<Utc>::from_timestamp_micros(msg.publish_time_micros)
                    .unwrap_or_default();
                escape_into(&f.render(t), &mut out);
            }
            PartitionValue::Attribute(key) => {
                escape_into(msg.attributes.get(key).unwrap_or_default(), &mut out)
            }
            PartitionValue::Field(keys) => match json_field(&msg.data, keys) {
                Some(v) => escape_into(&v, &mut out),
                None => out.push_str(NULL_PARTITION),
            },
            PartitionValue::EventTime(source, f) => match event_time(source, msg) {
                Ok(t) => escape_into(&f.render(t), &mut out),
                Err(_) => out.push_str("\0?"),
            },
        }
        if out.len() - segment > MAX_SEGMENT_BYTES {
            let bytes = out.len() - value;
            out.truncate(value);
            let _ = write!(out, "\0{bytes}");
        }
        out.push('/');
    }
    out
}

/// Can a file of directory `dir` (from [`dir_of`]) be named? `name` is the object name with it.
pub fn check_dir(dir: &str, name: &str) -> Result<(), PathError> {
    if let Some(segment) = dir.split('/').find(|s| s.contains('\0')) {
        let (name, bytes) = segment.split_once("=\0").unwrap_or((segment, ""));
        if bytes == "?" {
            // Reached only without the message at hand: [`check_message`] names it.
            return Err(PathError::EventTime {
                message_id: "?".into(),
                partition: name.to_string(),
                from: "the message".into(),
                problem: "which has none that parses".into(),
            });
        }
        return Err(PathError::Segment {
            name: name.to_string(),
            bytes: bytes.parse().unwrap_or_default(),
        });
    }
    if name.len() > MAX_NAME_BYTES {
        let mut cut = 80;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        return Err(PathError::Name {
            name: name[..cut].to_string(),
            bytes: name.len(),
        });
    }
    Ok(())
}

/// The file group of `msg` under partitions: its directory, then the format's own group after a
/// line feed (a directory never holds one: control characters are escaped).
pub fn group(p: &PathPartitions, msg: &Message, format_group: Option<String>) -> String {
    let mut g = dir_of(p, msg);
    if let Some(f) = format_group {
        g.push('\n');
        g.push_str(&f);
    }
    g
}

/// A [`group`] taken apart: the directory and the format's group.
pub fn split_group(group: &str) -> (&str, Option<&str>) {
    match group.split_once('\n') {
        Some((dir, f)) => (dir, Some(f)),
        None => (group, None),
    }
}

/// The object name `<prefix dir><dir><prefix file part><datetime><sep><uuid><suffix>`.
pub fn object_name(
    prefix: &str,
    dir: &str,
    fmt: &DatetimeFormat,
    t: DateTime<Utc>,
    uuid: &str,
    suffix: &str,
) -> String {
    let (prefix_dir, file) = split_prefix(prefix);
    let mut name = String::with_capacity(prefix.len() + dir.len() + 80 + suffix.len());
    name.push_str(prefix_dir);
    name.push_str(dir);
    name.push_str(&naming::object_name(file, fmt, t, uuid, suffix));
    name
}

/// Why a name does not follow a partitioned naming rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathMismatch {
    #[error(transparent)]
    Name(#[from] NameMismatch),
    #[error(
        "{found:?} is not the partition directories {expected} (after the prefix's directory {dir:?})"
    )]
    Partitions {
        found: String,
        expected: String,
        dir: String,
    },
}

/// Checks `name` against a partitioned naming rule (`names`: the partitions' names, in order) and
/// returns its parts and the partition values as written (escaped). Like
/// [`naming::check_object_name`], `name` may be a bare object name or a full path or URL.
pub fn check_partitioned_name(
    name: &str,
    prefix: &str,
    fmt: &DatetimeFormat,
    suffix: &str,
    names: &[String],
) -> Result<(NameParts, Vec<String>), PathMismatch> {
    let (prefix_dir, file) = split_prefix(prefix);
    // The file-name part follows a `/`: the last partition directory's.
    let mut parts = naming::check_object_name(name, file, fmt, suffix)?;
    let mismatch = |found: &str| PathMismatch::Partitions {
        found: found.to_string(),
        expected: names.iter().map(|n| format!("{n}=…/")).collect::<String>(),
        dir: prefix_dir.to_string(),
    };
    // `location` ends with `<prefix dir>k1=v1/…/kn=vn/`: take the segments from the end.
    let mut rest = parts.location.as_str();
    let mut values = Vec::with_capacity(names.len());
    for n in names.iter().rev() {
        let body = rest.strip_suffix('/').ok_or_else(|| mismatch(rest))?;
        let start = body.rfind('/').map_or(0, |i| i + 1);
        let segment = &body[start..];
        let value = segment
            .strip_prefix(n.as_str())
            .and_then(|v| v.strip_prefix('='))
            .filter(|v| !v.is_empty())
            .ok_or_else(|| mismatch(segment))?;
        values.push(value.to_string());
        rest = &body[..start];
    }
    values.reverse();
    let location = rest
        .strip_suffix(prefix_dir)
        .filter(|loc| loc.is_empty() || loc.ends_with('/') || prefix_dir.starts_with('/'))
        .ok_or_else(|| mismatch(rest))?;
    parts.location = location.to_string();
    Ok((parts, values))
}

/// Checks `name` against a Cloud Storage subscription's naming rule, with its partition
/// directories when it has `subsink.paths`.
pub fn check_storage_name(
    name: &str,
    s: &crate::config::StorageSettings,
) -> Result<NameParts, PathMismatch> {
    match &s.partitions {
        None => Ok(naming::check_object_name(
            name,
            &s.filename_prefix,
            &s.datetime_format,
            &s.filename_suffix,
        )?),
        Some(p) => {
            let names: Vec<String> = p.partitions.iter().map(|p| p.name.clone()).collect();
            check_partitioned_name(
                name,
                &s.filename_prefix,
                &s.datetime_format,
                &s.filename_suffix,
                &names,
            )
            .map(|(parts, _)| parts)
        }
    }
}

/// The scalar at `keys` of a JSON object payload, as text (a string as is, a number or boolean as
/// JSON writes it); `None` when the payload is not a JSON object, a key is missing, or the value
/// is `null`, an object or an array. The payload is scanned once without building it: only the
/// value asked for is kept.
pub fn json_field(data: &[u8], keys: &[String]) -> Option<String> {
    let mut de = serde_json::Deserializer::from_slice(data);
    let found = Field { keys, top: true }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    found
}

/// Finds the value at `keys` of what it is given (`top`: the payload itself, which must be an
/// object).
struct Field<'k> {
    keys: &'k [String],
    top: bool,
}

impl<'de> DeserializeSeed<'de> for Field<'_> {
    type Value = Option<String>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Field<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        let mut seen = false;
        while let Some(hit) = map.next_key_seed(KeyIs(self.keys.first()))? {
            if hit && !seen && !self.keys.is_empty() {
                seen = true;
                found = map.next_value_seed(Field {
                    keys: &self.keys[1..],
                    top: false,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.leaf(|| v.to_string()))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(self.leaf(|| v.to_string()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(self.leaf(|| v.to_string()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(self.leaf(|| v.to_string()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(self
            .leaf(|| serde_json::Number::from_f64(v).map_or_else(String::new, |n| n.to_string())))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

impl Field<'_> {
    /// A scalar: the value when it is the one asked for (not the payload itself, and no key
    /// left to follow).
    fn leaf(&self, text: impl FnOnce() -> String) -> Option<String> {
        (!self.top && self.keys.is_empty()).then(text)
    }
}

/// Is the key `Some(k)`? (Compared without allocating when the key has no escapes.)
struct KeyIs<'k>(Option<&'k String>);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(self.0.is_some_and(|k| k == v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Partition;

    fn parts(list: &[(&str, PartitionValue)]) -> PathPartitions {
        PathPartitions {
            partitions: list
                .iter()
                .map(|(n, v)| Partition {
                    name: n.to_string(),
                    value: v.clone(),
                })
                .collect(),
        }
    }

    fn msg(data: &str, attrs: &[(&str, &str)], micros: i64) -> Message {
        let mut m = Message {
            data: bytes::Bytes::copy_from_slice(data.as_bytes()),
            attributes: Default::default(),
            message_id: "1".into(),
            publish_time_micros: micros,
            ordering_key: String::new(),
        };
        for (k, v) in attrs {
            m.attributes.insert(k.to_string(), v.to_string());
        }
        m
    }

    fn keys(path: &str) -> Vec<String> {
        path.split('.').map(str::to_string).collect()
    }

    #[test]
    fn json_fields_are_scalars_of_an_object_payload() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            (r#"{"kind":"a"}"#, "kind", Some("a")),
            (
                r#"{"x":[1,{"kind":"no"}],"kind":"b","y":{}}"#,
                "kind",
                Some("b"),
            ),
            (r#"{"kind":"first","kind":"second"}"#, "kind", Some("first")),
            (r#"{"k\u0069nd":"esc\"aped"}"#, "kind", Some("esc\"aped")),
            (r#"{"kind":7}"#, "kind", Some("7")),
            (r#"{"kind":-7}"#, "kind", Some("-7")),
            (r#"{"kind":1.5}"#, "kind", Some("1.5")),
            (r#"{"kind":true}"#, "kind", Some("true")),
            (r#"{"kind":null}"#, "kind", None),
            (r#"{"kind":{"a":1}}"#, "kind", None),
            (r#"{"kind":[1]}"#, "kind", None),
            (r#"{"other":"a"}"#, "kind", None),
            (r#"["kind"]"#, "kind", None),
            (r#""kind""#, "kind", None),
            (r#"{"kind":"a"} trailing"#, "kind", None),
            (r#"{"kind":"a""#, "kind", None),
            ("not json", "kind", None),
            ("", "kind", None),
            (
                r#"{"meta":{"kind":"deep"},"kind":"top"}"#,
                "meta.kind",
                Some("deep"),
            ),
            (r#"{"meta":"flat"}"#, "meta.kind", None),
            (r#"{"meta.kind":"dotted"}"#, "meta.kind", None),
        ];
        for (data, path, want) in cases {
            assert_eq!(
                json_field(data.as_bytes(), &keys(path)).as_deref(),
                *want,
                "{data} at {path}"
            );
        }
    }

    #[test]
    fn values_are_escaped_as_hive_escapes_them() {
        let cases = [
            ("eu-west", "eu-west"),
            ("a/b", "a%2Fb"),
            ("k=v", "k%3Dv"),
            ("100%", "100%25"),
            ("12:30", "12%3A30"),
            ("tab\there\n", "tab%09here%0A"),
            ("\u{7f}", "%7F"),
            ("\"#'*?\\{[]^", "%22%23%27%2A%3F%5C%7B%5B%5D%5E"),
            ("é ü", "é ü"),
            ("..", ".."),
            ("", NULL_PARTITION),
        ];
        for (value, want) in cases {
            let mut out = String::new();
            escape_into(value, &mut out);
            assert_eq!(out, want, "{value:?}");
        }
    }

    #[test]
    fn a_message_gets_one_directory_per_partition() {
        let p = parts(&[
            (
                "dt",
                PartitionValue::PublishTime(DatetimeFormat::parse_partition("YYYY-MM-DD").unwrap()),
            ),
            (
                "hour",
                PartitionValue::PublishTime(DatetimeFormat::parse_partition("hh").unwrap()),
            ),
            ("region", PartitionValue::Attribute("region".into())),
            ("kind", PartitionValue::Field(keys("kind"))),
        ]);
        // 2026-12-05T04:10:00.999999Z
        let t = 1_796_443_800_999_999;
        let m = msg(r#"{"kind":"click/tap"}"#, &[("region", "eu=1")], t);
        assert_eq!(
            dir_of(&p, &m),
            "dt=2026-12-05/hour=04/region=eu%3D1/kind=click%2Ftap/"
        );
        let m = msg("plain text", &[], t);
        assert_eq!(
            dir_of(&p, &m),
            "dt=2026-12-05/hour=04/region=__HIVE_DEFAULT_PARTITION__/kind=__HIVE_DEFAULT_PARTITION__/"
        );
        let g = group(&p, &m, Some("rev-1".into()));
        assert_eq!(split_group(&g), (dir_of(&p, &m).as_str(), Some("rev-1")));
        let g = group(&p, &m, None);
        assert_eq!(split_group(&g), (dir_of(&p, &m).as_str(), None));
    }

    #[test]
    fn values_too_long_for_a_path_are_refused_at_open() {
        let p = parts(&[("region", PartitionValue::Attribute("region".into()))]);
        // `region=` + 248 bytes: 255, the most a segment holds.
        let fits = "a".repeat(248);
        let dir = dir_of(&p, &msg("", &[("region", &fits)], 0));
        assert_eq!(dir, format!("region={fits}/"));
        assert_eq!(check_dir(&dir, &format!("x/{dir}f")), Ok(()));
        // One byte more, or an escaped value past it: refused, naming the partition and size.
        for (value, bytes) in [("a".repeat(249), 249), ("/".repeat(90), 270)] {
            let dir = dir_of(&p, &msg("", &[("region", &value)], 0));
            assert_eq!(dir.len(), "region=\0".len() + 3 + 1, "{dir:?}");
            assert_eq!(
                check_dir(&dir, &dir),
                Err(PathError::Segment {
                    name: "region".into(),
                    bytes
                })
            );
        }
        // A NUL in a value is escaped, never taken for the marker.
        let dir = dir_of(&p, &msg("", &[("region", "a\0b")], 0));
        assert_eq!(dir, "region=a%00b/");
        assert_eq!(check_dir(&dir, &dir), Ok(()));
        // Names past 1024 bytes.
        let long = format!("{}é", "n".repeat(1024));
        assert!(matches!(
            check_dir("region=a/", &long),
            Err(PathError::Name { bytes: 1026, .. })
        ));
    }

    #[test]
    fn the_directory_goes_after_the_prefix_directory_and_reads_back() {
        let fmt = DatetimeFormat::parse("YYYY/MM/DD/hh_mm_ss").unwrap();
        let t = DateTime::from_timestamp(1_796_443_800, 0).unwrap();
        let uuid = "0b6c2a4e-2f35-4a8e-9d61-1c1f1d2b3c4d";
        let dir = "dt=2026-12-05/region=eu%3D1/";
        let names = vec!["dt".to_string(), "region".to_string()];
        let cases = [
            (
                "exports/data-",
                "exports/dt=2026-12-05/region=eu%3D1/data-2026/12/05/04_10_00_0b6c2a4e-2f35-4a8e-9d61-1c1f1d2b3c4d.avro",
            ),
            (
                "data-",
                "dt=2026-12-05/region=eu%3D1/data-2026/12/05/04_10_00_0b6c2a4e-2f35-4a8e-9d61-1c1f1d2b3c4d.avro",
            ),
            (
                "a/b/",
                "a/b/dt=2026-12-05/region=eu%3D1/2026/12/05/04_10_00_0b6c2a4e-2f35-4a8e-9d61-1c1f1d2b3c4d.avro",
            ),
            (
                "",
                "dt=2026-12-05/region=eu%3D1/2026/12/05/04_10_00_0b6c2a4e-2f35-4a8e-9d61-1c1f1d2b3c4d.avro",
            ),
        ];
        for (prefix, want) in cases {
            let name = object_name(prefix, dir, &fmt, t, uuid, ".avro");
            assert_eq!(name, want);
            for location in ["", "s3://bkt/", "/tmp/out/"] {
                let full = format!("{location}{name}");
                let (p, values) =
                    check_partitioned_name(&full, prefix, &fmt, ".avro", &names).unwrap();
                assert_eq!(p.datetime, t);
                assert_eq!(p.uuid.to_string(), uuid);
                assert_eq!(p.location, location, "{full}");
                assert_eq!(values, ["2026-12-05", "eu%3D1"]);
            }
        }
        // Not partitioned so: a name without the directories, a wrong name, one level missing.
        let plain = naming::object_name("exports/data-", &fmt, t, uuid, ".avro");
        for bad in [
            plain.as_str(),
            "exports/dt=2026-12-05/place=eu/data-2026/12/05/04_10_00_0b6c2a4e-2f35-4a8e-9d61-1c1f1d2b3c4d.avro",
            "exports/region=eu/data-2026/12/05/04_10_00_0b6c2a4e-2f35-4a8e-9d61-1c1f1d2b3c4d.avro",
            "other/dt=2026-12-05/region=eu/data-2026/12/05/04_10_00_0b6c2a4e-2f35-4a8e-9d61-1c1f1d2b3c4d.avro",
            "exports/dt=/region=eu/data-2026/12/05/04_10_00_0b6c2a4e-2f35-4a8e-9d61-1c1f1d2b3c4d.avro",
        ] {
            assert!(
                matches!(
                    check_partitioned_name(bad, "exports/data-", &fmt, ".avro", &names),
                    Err(PathMismatch::Partitions { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn event_times_are_rfc3339_or_epoch_millis() {
        let utc = |s: &str| Some(DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc));
        let cases: &[(&str, Option<DateTime<Utc>>)] = &[
            ("2026-12-05T22:30:00Z", utc("2026-12-05T22:30:00Z")),
            (
                "2026-12-05T23:30:00.123+01:00",
                utc("2026-12-05T22:30:00.123Z"),
            ),
            ("2026-12-06T00:30:00-02:00", utc("2026-12-06T02:30:00Z")),
            ("1796509800000", utc("2026-12-05T22:30:00Z")),
            ("0", utc("1970-01-01T00:00:00Z")),
            ("-1000", utc("1969-12-31T23:59:59Z")),
            ("2026-12-05", None),
            ("2026-12-05T22:30:00", None),
            ("1796509800.5", None),
            ("yesterday", None),
            ("", None),
            ("-", None),
            ("253402300800000", None),
            ("99999999999999999999", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_event_time(text), *want, "{text:?}");
        }
    }

    #[test]
    fn event_time_partitions_or_a_refusal_naming_the_message() {
        let f = DatetimeFormat::parse_partition("YYYY-MM-DD").unwrap();
        let h = DatetimeFormat::parse_partition("hh").unwrap();
        let p = parts(&[
            (
                "dt",
                PartitionValue::EventTime(EventTimeSource::Field(keys("meta.ts")), f),
            ),
            (
                "hour",
                PartitionValue::EventTime(EventTimeSource::Attribute("at".into()), h),
            ),
        ]);
        let m = msg(
            r#"{"meta":{"ts":"2026-12-05T23:30:00+01:00"}}"#,
            &[("at", "1796518800000")],
            0,
        );
        assert_eq!(dir_of(&p, &m), "dt=2026-12-05/hour=01/");
        assert_eq!(check_message(&p, &m), Ok(()));
        let m = msg(r#"{"meta":{"ts":17}}"#, &[], 0);
        assert_eq!(dir_of(&p, &m), "dt=1970-01-01/hour=\0?/");
        assert_eq!(
            check_message(&p, &m).unwrap_err().to_string(),
            "message 1: partition hour takes its event time from attribute `at`, which it does \
             not have; an event time is RFC 3339 text (2026-12-05T22:30:00Z, any offset) or an \
             integer of epoch milliseconds, in the years 0000 to 9999"
        );
        let m = msg(r#"{"meta":{"ts":"soon"}}"#, &[("at", "0")], 0);
        assert!(check_message(&p, &m).unwrap_err().to_string().starts_with(
            "message 1: partition dt takes its event time from field `meta.ts`, which is \"soon\";"
        ));
        let dir = dir_of(&p, &m);
        assert!(matches!(
            check_dir(&dir, "x"),
            Err(PathError::EventTime { .. })
        ));
        let m = msg(r#"{"meta":{}}"#, &[("at", "0")], 0);
        assert!(check_message(&p, &m)
            .unwrap_err()
            .to_string()
            .contains("from field `meta.ts`, which it does not have (missing, null"));
    }
}
