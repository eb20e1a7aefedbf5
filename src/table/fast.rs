//! The fast path of use_table_schema rows: a JSON payload parsed straight into the column
//! builders, in one pass over its bytes, without building a `serde_json::Value` or any error text.
//!
//! It only has to be right when it succeeds: every doubt — anything invalid, and anything valid
//! but unusual (an escaped key, a duplicate or case-insensitive key, an unknown field without
//! drop_unknown_fields, a number outside the simple forms, a `\u` surrogate, nesting deeper than
//! 100) — returns `None`, and the row builder truncates what was appended and converts the
//! message again with the reference path (`serde_json::Value` + [`super::convert`]), which also
//! words the errors. So a message this path accepts is one the reference path accepts, with the
//! same values: each scalar goes through the same [`super::convert`] function or, for numbers, a
//! conversion that gives the same result on the forms accepted here (checked by a property test
//! against the reference path, `table::tests::prop`).

use super::columns::Column;
use super::convert::{
    check_json_text, date_from_days, decode_packed_datetime, decode_packed_time, fast_date,
    fast_datetime, fast_time, fast_timestamp, parse_date, parse_datetime, parse_decimal_text,
    parse_time, parse_timestamp, plain_numeric, timestamp_from_micros, BIGNUMERIC_SCALE,
    NUMERIC_SCALE,
};
use super::schema::{FieldMode, FieldType, TableField};
use crate::jsonscan::{needs_escape, special};

/// Deeper nesting is left to the reference path (serde_json stops at 128).
const MAX_DEPTH: u32 = 100;

/// Append the fields of the JSON object `payload` to `cols` (one builder per field of `fields`,
/// same order), or `None` if the reference path must decide (the builders may then hold a
/// partial row).
pub(crate) fn append_record(
    payload: &[u8],
    fields: &[TableField],
    cols: &mut [Column],
    drop_unknown: bool,
) -> Option<()> {
    let mut p = Parser {
        b: payload,
        i: 0,
        depth: 0,
        drop_unknown,
    };
    p.ws();
    if p.peek()? != b'{' {
        return None;
    }
    p.record(fields, cols)?;
    p.ws();
    (p.i == p.b.len()).then_some(())
}

/// The parser's one check of UTF-8: every string token with a byte ≥ 0x80 is validated (in
/// `string`); every byte outside strings must be one of JSON's ASCII tokens anyway. So every string
/// it hands on is valid UTF-8, as serde_json would insist.
struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    depth: u32,
    drop_unknown: bool,
}

/// A JSON number token.
struct Number<'a> {
    text: &'a [u8],
    /// Its value when it is an integer of at most 18 digits other than `-0`: what serde_json reads
    /// as an `i64`/`u64` and converts exactly.
    int: Option<i64>,
    /// Its digits as one integer and the number of them after the point, when there are at most
    /// 19 digits and no exponent.
    mantissa: Option<(u64, u32)>,
    neg: bool,
}

impl Number<'_> {
    /// The number as serde_json reads it into an `f64` (correctly rounded, `float_roundtrip`):
    /// exact integers as they are; up to 2^53 over a power of ten up to 10^22 by one division,
    /// which is then correctly rounded too (Clinger's fast path); anything else by the standard
    /// library's correctly rounded parser. `None` when it overflows (serde_json rejects those).
    fn float(&self) -> Option<f64> {
        const POW10: [f64; 23] = [
            1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
            1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
        ];
        if let Some(i) = self.int {
            return Some(i as f64);
        }
        if let Some((m, k)) = self.mantissa {
            if m <= 1 << 53 && k <= 22 {
                let x = m as f64 / POW10[k as usize];
                return Some(if self.neg { -x } else { x });
            }
        }
        std::str::from_utf8(self.text)
            .ok()?
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
    }
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// Consume `lit` (`null`, `true`, `false`); what follows is checked by the caller.
    fn literal(&mut self, lit: &[u8]) -> Option<()> {
        if self.b[self.i..].starts_with(lit) {
            self.i += lit.len();
            Some(())
        } else {
            None
        }
    }

    /// Whether the key token at `"` is exactly `name`.
    #[inline]
    fn at_key(&self, name: &[u8]) -> bool {
        let (start, end) = (self.i + 1, self.i + 1 + name.len());
        self.b.get(end) == Some(&b'"') && same(&self.b[start..end], name)
    }

    /// The object at `{`, into one builder per field.
    fn record(&mut self, fields: &[TableField], cols: &mut [Column]) -> Option<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        self.i += 1; // `{`
                     // Every builder of the record has `start` entries before it; a field is given once its
                     // builder has one more.
        let start = cols.first().map_or(0, Column::len);
        // Keys usually come in schema order: try the field after the last one first.
        let mut next = 0;
        // Fields given so far, and whether every key so far was the next field in schema order
        // (then no key can repeat one before it, and `given` fields are the first `given`).
        let mut given = 0;
        let mut in_order = true;
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
        } else {
            loop {
                if self.peek()? != b'"' {
                    return None;
                }
                // Keys usually come in schema order: the next field's name is checked in place
                // (column names hold nothing a JSON string escapes; see `plain_names`).
                let found = match fields.get(next) {
                    Some(f) if self.at_key(f.name.as_bytes()) => {
                        self.i += f.name.len() + 2;
                        Some(next)
                    }
                    _ => {
                        in_order = false;
                        let (key, escaped) = self.string()?;
                        if escaped {
                            return None;
                        }
                        match fields.iter().position(|f| same(f.name.as_bytes(), key)) {
                            Some(k) => Some(k),
                            // A key matching a column case-insensitively, or an unknown field that
                            // fails the message: the reference path decides.
                            None if !self.drop_unknown
                                || fields
                                    .iter()
                                    .any(|f| f.name.as_bytes().eq_ignore_ascii_case(key)) =>
                            {
                                return None
                            }
                            None => None,
                        }
                    }
                };
                self.ws();
                if self.peek()? != b':' {
                    return None;
                }
                self.i += 1;
                self.ws();
                match found {
                    Some(k) => {
                        if !in_order && cols[k].len() > start {
                            return None; // a duplicate key: the last one wins, in serde_json
                        }
                        next = k + 1;
                        given += 1;
                        self.field(&fields[k], &mut cols[k])?;
                    }
                    None => self.skip()?, // an unknown field, dropped
                }
                self.ws();
                match self.peek()? {
                    b',' => {
                        self.i += 1;
                        self.ws();
                    }
                    b'}' => {
                        self.i += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        // Every field given (each once: repeats were refused above) leaves none to fill in.
        if given < fields.len() {
            for (f, col) in fields.iter().zip(cols.iter_mut()) {
                if col.len() == start {
                    match f.mode {
                        FieldMode::Repeated => col.close_list(),
                        FieldMode::Nullable => col.push_null(),
                        FieldMode::Required => return None,
                    }
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    /// The value of field `f` (any mode) into `col`.
    fn field(&mut self, f: &TableField, col: &mut Column) -> Option<()> {
        match (f.mode, self.peek()?) {
            (FieldMode::Repeated, b'n') => {
                self.literal(b"null")?;
                col.close_list();
            }
            (FieldMode::Repeated, b'[') => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return None;
                }
                self.i += 1;
                self.ws();
                if self.peek()? == b']' {
                    self.i += 1;
                } else {
                    let elements = col.elements();
                    loop {
                        // A NULL element fails the message.
                        if self.peek()? == b'n' {
                            return None;
                        }
                        self.value(f, elements)?;
                        self.ws();
                        match self.peek()? {
                            b',' => {
                                self.i += 1;
                                self.ws();
                            }
                            b']' => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                self.depth -= 1;
                col.close_list();
            }
            (FieldMode::Repeated, _) => return None,
            (FieldMode::Nullable, b'n') => {
                self.literal(b"null")?;
                col.push_null();
            }
            (FieldMode::Required, b'n') => return None,
            _ => self.value(f, col)?,
        }
        Some(())
    }

    /// One non-null value of `f`'s type into `col`.
    fn value(&mut self, f: &TableField, col: &mut Column) -> Option<()> {
        match (&f.ty, self.peek()?) {
            (FieldType::Record(sub), b'{') => {
                self.record(sub, col.children())?;
                col.close_struct();
            }
            (FieldType::String, b'"') => {
                self.string_into(col)?;
                if let Some(max) = f.max_length {
                    let s = std::str::from_utf8(col.open_bytes()).ok()?;
                    if s.chars().count() as u64 > max {
                        return None;
                    }
                }
                col.close_bytes();
            }
            (FieldType::Json, b'"') => {
                self.string_into(col)?;
                check_json_text(std::str::from_utf8(col.open_bytes()).ok()?).ok()?;
                col.close_bytes();
            }
            (FieldType::Bytes, b'"') => {
                let (raw, escaped) = self.string()?;
                if escaped {
                    return None;
                }
                let bytes = crate::message::decode_base64(raw).ok()?;
                if f.max_length.is_some_and(|max| bytes.len() as u64 > max) {
                    return None;
                }
                col.push_bytes(&bytes);
            }
            (FieldType::Bool, b't') => {
                self.literal(b"true")?;
                col.push_bool(true);
            }
            (FieldType::Bool, b'f') => {
                self.literal(b"false")?;
                col.push_bool(false);
            }
            (FieldType::Int64, _) => col.push_i64(self.number()?.int?),
            (FieldType::Float64, _) => col.push_f64(self.number()?.float()?),
            (FieldType::Numeric, b'"') => {
                let b = self.plain_string()?;
                let v = match plain_numeric(b) {
                    Some(v) => v,
                    None => parse_decimal_text(text(b)?, NUMERIC_SCALE)?
                        .ok()?
                        .to_i128()?,
                };
                col.push_numeric(v);
            }
            (FieldType::BigNumeric, b'"') => {
                let v = parse_decimal_text(text(self.plain_string()?)?, BIGNUMERIC_SCALE)?.ok()?;
                col.push_bignumeric(v);
            }
            (FieldType::Date, b'"') => {
                let b = self.plain_string()?;
                let d = fast_date(b).or_else(|| parse_date(text(b)?).ok())?;
                col.push_date(d);
            }
            (FieldType::Time, b'"') => {
                let b = self.plain_string()?;
                col.push_i64(fast_time(b).or_else(|| parse_time(text(b)?).ok())?);
            }
            (FieldType::DateTime, b'"') => {
                let b = self.plain_string()?;
                col.push_i64(fast_datetime(b).or_else(|| parse_datetime(text(b)?).ok())?);
            }
            (FieldType::Timestamp, b'"') => {
                let b = self.plain_string()?;
                col.push_i64(fast_timestamp(b).or_else(|| parse_timestamp(text(b)?).ok())?);
            }
            (FieldType::Date, _) => col.push_date(date_from_days(self.number()?.int?).ok()?),
            (FieldType::Time, _) => col.push_i64(decode_packed_time(self.number()?.int?).ok()?),
            (FieldType::DateTime, _) => {
                col.push_i64(decode_packed_datetime(self.number()?.int?).ok()?)
            }
            (FieldType::Timestamp, _) => {
                col.push_i64(timestamp_from_micros(self.number()?.int?).ok()?)
            }
            // NUMERIC from a JSON number, and every mismatch: the reference path.
            _ => return None,
        }
        Some(())
    }

    /// The string at `"`: the bytes between the quotes (valid UTF-8), and whether they hold
    /// escapes. `None` for a control character, an unterminated string, a malformed escape, a `\u`
    /// surrogate or invalid UTF-8.
    #[inline]
    fn string(&mut self) -> Option<(&'a [u8], bool)> {
        let start = self.i + 1; // after `"`
        let mut i = start;
        let mut escaped = false;
        let mut non_ascii = false;
        loop {
            let (k, high) = special(&self.b[i..])?;
            i += k;
            non_ascii |= high;
            match self.b[i] {
                b'"' => {
                    self.i = i + 1;
                    let raw = &self.b[start..i];
                    // Escapes are ASCII: the raw bytes are valid exactly when the text is.
                    if non_ascii {
                        std::str::from_utf8(raw).ok()?;
                    }
                    return Some((raw, escaped));
                }
                b'\\' => {
                    escaped = true;
                    match *self.b.get(i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                        b'u' => {
                            let c = hex4(self.b.get(i + 2..i + 6)?)?;
                            if (0xD800..=0xDFFF).contains(&c) {
                                return None;
                            }
                            i += 6;
                        }
                        _ => return None,
                    }
                }
                _ => return None, // a control character
            }
        }
    }

    /// A string without escapes (dates, times, decimals).
    #[inline]
    fn plain_string(&mut self) -> Option<&'a [u8]> {
        let (raw, escaped) = self.string()?;
        (!escaped).then_some(raw)
    }

    /// The string at `"`, unescaped into `col`'s open value (closed by the caller).
    #[inline]
    fn string_into(&mut self, col: &mut Column) -> Option<()> {
        let (raw, escaped) = self.string()?;
        let out = col.bytes_buffer();
        if !escaped {
            out.extend_from_slice(raw);
            return Some(());
        }
        // `string` checked every escape already.
        let mut i = 0;
        while i < raw.len() {
            let Some(k) = raw[i..].iter().position(|&c| c == b'\\') else {
                out.extend_from_slice(&raw[i..]);
                break;
            };
            out.extend_from_slice(&raw[i..i + k]);
            i += k;
            let c = match raw[i + 1] {
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    let c = char::from_u32(hex4(&raw[i + 2..i + 6])?)?;
                    i += 4;
                    c
                }
                other => char::from(other), // `"`, `\` and `/`
            };
            i += 2;
            let mut buf = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
        Some(())
    }

    /// A number token: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    #[inline]
    fn number(&mut self) -> Option<Number<'a>> {
        let b = self.b;
        let start = self.i;
        let neg = b.get(start) == Some(&b'-');
        let mut i = start + usize::from(neg);
        // Integer part: `0` alone, or digits not starting with 0; every digit into `m`.
        let int_start = i;
        let mut m: u64 = 0;
        while let Some(&c) = b.get(i) {
            let d = c.wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            m = m.wrapping_mul(10).wrapping_add(u64::from(d));
            i += 1;
        }
        let int_len = i - int_start;
        if int_len == 0 || (int_len > 1 && b[int_start] == b'0') {
            return None;
        }
        let mut frac_len = 0;
        if b.get(i) == Some(&b'.') {
            i += 1;
            while let Some(&c) = b.get(i) {
                let d = c.wrapping_sub(b'0');
                if d > 9 {
                    break;
                }
                m = m.wrapping_mul(10).wrapping_add(u64::from(d));
                i += 1;
                frac_len += 1;
            }
            if frac_len == 0 {
                return None;
            }
        }
        let mut exponent = false;
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            let e = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == e {
                return None;
            }
            exponent = true;
        }
        self.i = i;
        // `m` wrapped unless there are at most 19 digits.
        let mantissa = (!exponent && int_len + frac_len <= 19).then_some((m, frac_len as u32));
        let int = match mantissa {
            // serde_json reads `-0` as the float -0.0.
            Some((m, 0)) if int_len <= 18 && !(neg && m == 0) => {
                Some(if neg { -(m as i64) } else { m as i64 })
            }
            _ => None,
        };
        Some(Number {
            text: &b[start..i],
            int,
            mantissa,
            neg,
        })
    }

    /// Skip one value of any kind (an unknown field under drop_unknown_fields), checking it the
    /// way serde_json would: a value it would reject, or a number it would read as infinite, is
    /// `None`.
    fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.string()?;
            }
            b'n' => self.literal(b"null")?,
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'{' | b'[' => {
                let close = if self.peek()? == b'{' { b'}' } else { b']' };
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return None;
                }
                self.i += 1;
                self.ws();
                if self.peek()? == close {
                    self.i += 1;
                } else {
                    loop {
                        if close == b'}' {
                            if self.peek()? != b'"' {
                                return None;
                            }
                            self.string()?;
                            self.ws();
                            if self.peek()? != b':' {
                                return None;
                            }
                            self.i += 1;
                            self.ws();
                        }
                        self.skip()?;
                        self.ws();
                        match self.peek()? {
                            b',' => {
                                self.i += 1;
                                self.ws();
                            }
                            c if c == close => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                self.depth -= 1;
            }
            _ => {
                self.number()?.float()?;
            }
        }
        Some(())
    }
}

/// An ASCII (or checked UTF-8) token as text, for the general parsers.
fn text(b: &[u8]) -> Option<&str> {
    std::str::from_utf8(b).ok()
}

/// `a == b` for short keys, inline: the slice comparison calls `memcmp`. Two overlapping loads
/// cover 4 to 16 bytes.
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let w4 = |s: &[u8], i: usize| u32::from_ne_bytes(s[i..i + 4].try_into().expect("4 bytes"));
    let w8 = |s: &[u8], i: usize| u64::from_ne_bytes(s[i..i + 8].try_into().expect("8 bytes"));
    match n {
        0..=3 => a == b,
        4..=7 => w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4),
        8..=16 => w8(a, 0) == w8(b, 0) && w8(a, n - 8) == w8(b, n - 8),
        _ => a == b,
    }
}

/// Whether every name in `fields` (nested ones too) is made of characters a JSON string holds
/// as they are (no `"`, `\\` or control character), so a key can be matched to it byte for byte.
/// Names from a schema file always are (`[a-zA-Z0-9_]`); the fast path is off otherwise.
pub(crate) fn plain_names(fields: &[TableField]) -> bool {
    fields.iter().all(|f| {
        !needs_escape(f.name.as_bytes())
            && match &f.ty {
                FieldType::Record(sub) => plain_names(sub),
                _ => true,
            }
    })
}

/// Four hex digits.
fn hex4(h: &[u8]) -> Option<u32> {
    let mut v = 0;
    for &c in h {
        v = v * 16 + char::from(c).to_digit(16)?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What the fast path reads a number token as, for FLOAT64.
    fn fast_float(text: &str) -> Option<f64> {
        let mut p = Parser {
            b: text.as_bytes(),
            i: 0,
            depth: 0,
            drop_unknown: false,
        };
        let n = p.number()?;
        (p.i == text.len()).then_some(())?;
        n.float()
    }

    /// What serde_json (the reference path) reads it as.
    fn serde_float(text: &str) -> Option<f64> {
        serde_json::from_str::<serde_json::Value>(text)
            .ok()?
            .as_f64()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn floats_read_as_serde_json_reads_them(
            m in prop_oneof![0u64..1 << 53, 1u64 << 53..1 << 55, any::<u64>()],
            k in 0usize..26,
            exp in proptest::option::of(-330i32..330),
            neg in any::<bool>(),
        ) {
            // `m` with `k` digits after the point, as JSON writes it.
            let digits = format!("{m:0>width$}", width = k + 1);
            let (int, frac) = digits.split_at(digits.len() - k);
            let mut text = format!("{}{int}", if neg { "-" } else { "" });
            if k > 0 {
                text = format!("{text}.{frac}");
            }
            if let Some(e) = exp {
                text.push_str(&format!("e{e}"));
            }
            let (fast, reference) = (fast_float(&text), serde_float(&text));
            prop_assert_eq!(fast.map(f64::to_bits), reference.map(f64::to_bits), "{}", text);
        }
    }
}
