//! Fuzzes `filenameDatetimeFormat` parsing and object naming (`src/naming.rs`): any text must
//! parse or be rejected without a panic. An accepted format renders to exactly `rendered_len`
//! bytes at any time in years 0–9999, prints back to a text that parses to the same format, and
//! the storable-name check answers without a panic for prefixes and suffixes built from the input.

#![no_main]

use chrono::{DateTime, Utc};
use libfuzzer_sys::fuzz_target;

// Compiled in directly, as the filter target does (it needs only chrono and thiserror).
#[path = "../../src/naming.rs"]
#[allow(dead_code)]
mod naming;

use naming::{check_storable, max_rendered_len, object_name, DatetimeFormat, UUID_LEN};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // The format, then optionally a prefix and a suffix after NUL separators.
    let mut parts = text.split('\0');
    let format = parts.next().unwrap_or_default();
    let prefix = parts.next().unwrap_or_default();
    let suffix = parts.next().unwrap_or_default();
    let Ok(fmt) = DatetimeFormat::parse(format) else {
        return;
    };
    let again = DatetimeFormat::parse(&fmt.to_string())
        .unwrap_or_else(|e| panic!("{format:?} prints as {fmt}, rejected: {e}"));
    assert_eq!(again.to_string(), fmt.to_string());
    for secs in [
        -62_167_219_200i64, // 0000-01-01
        0,
        1_695_615_000,
        253_402_300_799, // 9999-12-31T23:59:59
    ] {
        let t = DateTime::<Utc>::from_timestamp(secs, 999_999_999).unwrap();
        let rendered = fmt.render(t);
        assert_eq!(rendered.len(), fmt.rendered_len(), "{format:?} at {t}");
        let uuid = "0".repeat(UUID_LEN);
        let name = object_name(prefix, &fmt, t, &uuid, suffix);
        assert_eq!(name.len(), max_rendered_len(prefix, &fmt, suffix));
    }
    let _ = check_storable(prefix, &fmt, suffix).map_err(|e| e.to_string());
});
