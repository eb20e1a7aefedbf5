//! Fuzzes the subscription filter language (`src/filter`): any input must parse or be rejected
//! without a panic; an accepted filter must evaluate without a panic and its canonical text must
//! parse back to the same filter.
//!
//! The filter module is compiled in directly (`#[path]`) rather than through the `subsink` crate:
//! it depends only on `thiserror`, and this keeps the instrumented build small (no object_store,
//! tokio, avro ...).

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

#[path = "../../src/filter/mod.rs"]
#[allow(dead_code)]
mod filter;

use filter::{Filter, MAX_FILTER_BYTES};

fn attribute_sets() -> [BTreeMap<String, String>; 3] {
    let map = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    [
        BTreeMap::new(),
        map(&[("domain", "com"), ("region", "us-east1")]),
        map(&[("a", ""), ("a.b", "x"), ("", "empty"), ("é", "\u{1}")]),
    ]
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(filter) = Filter::parse(&text) else {
        return;
    };
    for attributes in &attribute_sets() {
        let _ = filter.matches(attributes);
    }
    let canonical = filter.to_string();
    // The canonical text can outgrow the limit (`-x` prints as `NOT x`); the in-crate proptests
    // check those through the unlimited parser.
    if canonical.len() <= MAX_FILTER_BYTES {
        let again = Filter::parse(&canonical)
            .unwrap_or_else(|e| panic!("canonical {canonical:?} of {text:?} rejected: {e}"));
        assert_eq!(again, filter, "canonical {canonical:?} of {text:?}");
        assert_eq!(again.to_string(), canonical);
    }
});
