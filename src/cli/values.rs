//! Value parsers for flags: sizes, durations and times become typed values while clap parses, so
//! every bad value fails the same way (clap's `invalid value '…' for '--flag <…>': why`, exit 2).

use std::time::Duration;

use crate::config::gcloud::{parse_binary_size, parse_duration};

/// A size: `1000`, `64KiB`, `10MB`, `1GiB` (a bare number is bytes; KB = 1024 bytes, as gcloud).
pub fn size(v: &str) -> Result<u64, String> {
    parse_binary_size(v, false)
}

/// A size, or no limit (`None`): `0` or `none` (`--memory-limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeLimit(pub Option<u64>);

/// A [`SizeLimit`].
pub fn size_or_none(v: &str) -> Result<SizeLimit, String> {
    match v.trim() {
        "0" | "none" => Ok(SizeLimit(None)),
        _ => size(v).map(|n| SizeLimit(Some(n))),
    }
}

/// A duration: `90s`, `5m`, `1h30m`, `1d` (a bare number is seconds).
pub fn duration(v: &str) -> Result<Duration, String> {
    parse_duration(v)
}

/// An RFC 3339 time (`--fixed-time`).
pub fn rfc3339(v: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| e.to_string())
}

/// An Avro block codec (`null`, `deflate`, `snappy`, `zstd`, …).
pub fn avro_codec(v: &str) -> Result<crate::encode::avro::Codec, String> {
    v.parse()
        .map_err(|e: crate::encode::avro::UnknownCodec| e.to_string())
}

/// [`avro_codec`] with its values listed in `--help` and in the error for another one.
pub fn avro_codec_parser(
) -> impl clap::builder::TypedValueParser<Value = crate::encode::avro::Codec> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(["null", "deflate", "snappy", "zstd", "zstandard"])
        .try_map(|v| avro_codec(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations() {
        assert_eq!(size("1MiB"), Ok(1 << 20));
        assert_eq!(size_or_none("none"), Ok(SizeLimit(None)));
        assert_eq!(size_or_none("0"), Ok(SizeLimit(None)));
        assert_eq!(size_or_none("1KiB"), Ok(SizeLimit(Some(1024))));
        assert!(size("lots").is_err());
        assert_eq!(duration("90s"), Ok(Duration::from_secs(90)));
        assert!(duration("-1s").is_err());
        assert!(rfc3339("2023-09-25T04:10:00Z").is_ok());
    }
}
