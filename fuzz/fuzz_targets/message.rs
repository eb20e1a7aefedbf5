//! Fuzzes the NDJSON wire parser (`src/message.rs`): any line must parse or be rejected without
//! a panic. An accepted line is a JSON object holding data or an attribute, and the message's own
//! REST form parses back to the same message (the fast path and serde_json's agree on it).

#![no_main]

use libfuzzer_sys::fuzz_target;

// Compiled in directly, as the filter target does: the parser needs only its own few crates.
#[path = "../../src/message.rs"]
#[allow(dead_code)]
mod message;

use message::{Message, WireDefaults};

const DEFAULTS: WireDefaults = WireDefaults {
    publish_time_micros: Some(1_695_615_000_000_000),
};

fuzz_target!(|line: &[u8]| {
    let (m, _ack, _attempt) = match Message::from_json_line(line, DEFAULTS) {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert!(
        !m.data.is_empty() || !m.attributes.is_empty(),
        "accepted a message without data or attributes: {:?}",
        String::from_utf8_lossy(line)
    );
    assert!(
        serde_json::from_slice::<serde_json::Value>(line).is_ok_and(|v| v.is_object()),
        "accepted a line that is not a JSON object: {:?}",
        String::from_utf8_lossy(line)
    );
    let again = m.to_json_line();
    let (back, _, _) = Message::from_json_line(again.as_bytes(), DEFAULTS)
        .unwrap_or_else(|e| panic!("own form {again:?} rejected: {e}"));
    assert_eq!(back, m, "{again}");
});
