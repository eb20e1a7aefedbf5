//! The Avro binary encoding's building blocks, shared by the container writer
//! ([`crate::encode::avro`]) and the JSON → Avro conversion of topic-schema datums
//! ([`super::json`]): zig-zag varints, length-prefixed bytes, and the compact schema text of a file
//! header.

/// Appends an Avro `long` (or `int`): zig-zag, then base-128 varint, least significant group first.
#[inline]
pub(crate) fn put_long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    if z < 0x80 {
        out.push(z as u8);
        return;
    }
    let mut buf = [0u8; 10];
    let mut i = 0;
    while z >= 0x80 {
        buf[i] = (z as u8) | 0x80;
        z >>= 7;
        i += 1;
    }
    buf[i] = z as u8;
    out.extend_from_slice(&buf[..=i]);
}

/// Appends Avro `bytes` / `string`: the length as a `long`, then the bytes.
#[inline]
pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_long(out, bytes.len() as i64);
    out.extend_from_slice(bytes);
}

/// Number of bytes `put_long(n)` writes.
#[inline]
pub(crate) fn long_len(n: i64) -> usize {
    let z = ((n << 1) ^ (n >> 63)) as u64;
    // Bits needed (at least 1), 7 per byte.
    let bits = 64 - (z | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Removes the whitespace outside strings of a JSON text, keeping key order (so the header shows
/// the schema as written in the `.avsc`).
pub(crate) fn minify_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_whitespace() {
            out.push(c);
        }
    }
    out
}
