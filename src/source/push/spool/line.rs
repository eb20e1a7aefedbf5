//! One message as one spool line.

use crate::message::Message;

/// `m` as one spool line, appended to `out`: the REST `PubsubMessage` JSON that
/// [`Message::to_json_line`] writes (and [`Message::from_json_line_in`] reads), and a newline —
/// written straight into one buffer sized up front (the request path: no map, no second copy).
pub fn encode_line(m: &Message, out: &mut Vec<u8>) {
    let b64 = base64_simd::STANDARD;
    let data_len = b64.encoded_length(m.data.len());
    out.reserve(
        data_len + m.attributes.text_len() + 8 * m.attributes.len() + m.message_id.len() + 96,
    );
    out.extend_from_slice(b"{\"data\":\"");
    b64.encode_append(&m.data, out);
    out.push(b'"');
    if !m.attributes.is_empty() {
        out.extend_from_slice(b",\"attributes\":{");
        for (i, (k, v)) in m.attributes.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_string(k, out);
            out.push(b':');
            json_string(v, out);
        }
        out.push(b'}');
    }
    out.extend_from_slice(b",\"messageId\":");
    json_string(&m.message_id, out);
    out.extend_from_slice(b",\"publishTime\":\"");
    out.extend_from_slice(crate::message::format_rfc3339_micros(m.publish_time_micros).as_bytes());
    out.push(b'"');
    if !m.ordering_key.is_empty() {
        out.extend_from_slice(b",\"orderingKey\":");
        json_string(&m.ordering_key, out);
    }
    out.extend_from_slice(b"}\n");
}

/// `s` as a JSON string (quoted, escaped).
fn json_string(s: &str, out: &mut Vec<u8>) {
    let plain = s
        .bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f);
    if plain {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("a string into a Vec");
    }
}
