//! Messages the tests feed subsink: the fixtures' NDJSON as docs/sources.md defines it, and numbered
//! messages made up by the tests.

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};
use subsink::message::{Message, WireDefaults};

/// Messages of an NDJSON file as docs/sources.md defines them (a missing `messageId` is the line number).
pub fn messages_of(path: &Path) -> Vec<Message> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let d = WireDefaults {
                publish_time_micros: Some(0),
            };
            let mut m = Message::from_json_line(l.as_bytes(), d).unwrap().0;
            if m.message_id.is_empty() {
                m.message_id = (i + 1).to_string();
            }
            m
        })
        .collect()
}

/// Bytes as fastavro's JSON dump writes them: `{"$b64": …}`.
pub fn b64(v: &[u8]) -> Value {
    use base64::Engine as _;
    json!({"$b64": base64::engine::general_purpose::STANDARD.encode(v)})
}

/// Write `msgs` as NDJSON into `path`.
pub fn write_lines(path: &Path, msgs: &[Message]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for m in msgs {
        writeln!(f, "{}", m.to_json_line()).unwrap();
    }
}

/// `n` messages as NDJSON in `path`: data `data_len` bytes of one letter, attribute `i`, ids
/// `100000 + i`, publish times 1 µs apart. Returns the ids in order.
pub fn write_numbered_messages(path: &Path, n: usize, data_len: usize) -> Vec<String> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut ids = Vec::new();
    for i in 0..n {
        let m = Message {
            data: vec![b'a' + (i % 26) as u8; data_len].into(),
            attributes: [("i".to_string(), i.to_string())].into(),
            message_id: format!("{}", 100_000 + i),
            publish_time_micros: 1_700_000_000_000_000 + i as i64,
            ordering_key: String::new(),
        };
        writeln!(f, "{}", m.to_json_line()).unwrap();
        ids.push(m.message_id);
    }
    ids
}

/// Payload of numbered message `i`: `{i:08}-` padded with `x` to `len` bytes (at least 9).
pub fn numbered_data(i: usize, len: usize) -> Vec<u8> {
    let mut data = format!("{i:08}-").into_bytes();
    data.resize(len.max(9), b'x');
    data
}

/// Numbered message `i` to publish: [`numbered_data`] and attribute `i`, ids left to the server.
pub fn numbered_message(i: usize, data_len: usize) -> Message {
    Message {
        data: numbered_data(i, data_len).into(),
        attributes: [("i".to_string(), i.to_string())].into(),
        ..Default::default()
    }
}
