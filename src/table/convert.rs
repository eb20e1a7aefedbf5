//! JSON values → BigQuery column values, exactly per docs/contract.md §4.3 (use_table_schema).
//!
//! Natural conversions: string → STRING, number → INT64/FLOAT64, boolean → BOOL, object → RECORD,
//! array → REPEATED. Beyond those: string → NUMERIC/BIGNUMERIC (decimal text, else
//! `BigDecimalByteStringEncoder` bytes in base64, §4.3.2, Q11); number → NUMERIC/BIGNUMERIC (as an
//! IEEE-754 double); string → DATE/TIME/DATETIME/TIMESTAMP (BigQuery's canonical literals); integer →
//! DATE/TIME/DATETIME/TIMESTAMP (§4.3.1); string → JSON (valid JSON text); base64 string → BYTES.
//! Anything else is an error whose text names the rule. Each function here checks one value; the
//! row builder adds the field path and the message id.

use arrow_buffer::i256;
use chrono::{Datelike, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use serde_json::Value;

use super::schema::FieldType;
use crate::civil::{days_from_civil, days_in_month, fixed_date, fixed_datetime, fixed_time};

/// One converted value, before it is appended to the Arrow columns. A row is converted in full
/// into cells first, so a message that fails leaves no trace in the batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// NUMERIC unscaled value (scale 9).
    Numeric(i128),
    /// BIGNUMERIC unscaled value (scale 38).
    BigNumeric(i256),
    /// STRING and JSON text.
    Str(String),
    Bytes(Vec<u8>),
    /// DATE: days since 1970-01-01.
    Date(i32),
    /// TIME: microseconds since midnight.
    Time(i64),
    /// TIMESTAMP (µs since the epoch, UTC) and DATETIME (µs since 1970-01-01T00:00 civil).
    Micros(i64),
    /// REPEATED: the elements (never `Null`).
    List(Vec<Cell>),
    /// RECORD: one cell per sub-field, in schema order.
    Struct(Vec<Cell>),
}

/// NUMERIC's scale and largest unscaled magnitude (10^38 − 1).
pub const NUMERIC_SCALE: u32 = 9;
/// BIGNUMERIC's scale.
pub const BIGNUMERIC_SCALE: u32 = 38;

/// NUMERIC's largest unscaled magnitude: 10^38 − 1.
const NUMERIC_MAX: i128 = 10i128.pow(38) - 1;

/// Convert one non-null JSON scalar to a value of `ty` (not RECORD; the row builder recurses).
pub fn convert_scalar(ty: &FieldType, v: &Value, max_length: Option<u64>) -> Result<Cell, String> {
    match (ty, v) {
        (FieldType::String, Value::String(s)) => {
            if let Some(max) = max_length {
                let n = s.chars().count() as u64;
                if n > max {
                    return Err(format!("STRING of {n} characters exceeds maxLength {max}"));
                }
            }
            Ok(Cell::Str(s.clone()))
        }
        (FieldType::Bytes, Value::String(s)) => {
            let b = crate::message::decode_base64(s.as_bytes())
                .map_err(|e| format!("BYTES expects a base64 string: {e}"))?;
            bytes_cell(b, max_length)
        }
        (FieldType::Int64, Value::Number(n)) => match n.as_i64() {
            Some(i) => Ok(Cell::Int(i)),
            None if n.is_u64() => Err(format!("INT64 out of range: {n}")),
            None => Err(format!("INT64 expects an integer, got {n}")),
        },
        (FieldType::Float64, Value::Number(n)) => Ok(Cell::Float(n.as_f64().unwrap_or(f64::NAN))),
        (FieldType::Bool, Value::Bool(b)) => Ok(Cell::Bool(*b)),
        (FieldType::Numeric, Value::String(s)) => {
            decimal_from_string(s, NUMERIC_SCALE).map(|d| Cell::Numeric(d.as_i128()))
        }
        (FieldType::BigNumeric, Value::String(s)) => {
            decimal_from_string(s, BIGNUMERIC_SCALE).map(Cell::BigNumeric)
        }
        (FieldType::Numeric, Value::Number(n)) => {
            decimal_from_number(n, NUMERIC_SCALE).map(|d| Cell::Numeric(d.as_i128()))
        }
        (FieldType::BigNumeric, Value::Number(n)) => {
            decimal_from_number(n, BIGNUMERIC_SCALE).map(Cell::BigNumeric)
        }
        (FieldType::Date, Value::String(s)) => parse_date(s).map(Cell::Date),
        (FieldType::Time, Value::String(s)) => parse_time(s).map(Cell::Time),
        (FieldType::DateTime, Value::String(s)) => parse_datetime(s).map(Cell::Micros),
        (FieldType::Timestamp, Value::String(s)) => parse_timestamp(s).map(Cell::Micros),
        (FieldType::Date, Value::Number(n)) => date_from_days(integer(n, "DATE")?).map(Cell::Date),
        (FieldType::Time, Value::Number(n)) => {
            decode_packed_time(integer(n, "TIME")?).map(Cell::Time)
        }
        (FieldType::DateTime, Value::Number(n)) => {
            decode_packed_datetime(integer(n, "DATETIME")?).map(Cell::Micros)
        }
        (FieldType::Timestamp, Value::Number(n)) => {
            timestamp_from_micros(integer(n, "TIMESTAMP")?).map(Cell::Micros)
        }
        (FieldType::Json, Value::String(s)) => check_json_text(s).map(|()| Cell::Str(s.clone())),
        (FieldType::Json, _) => Err(format!(
            "JSON expects a string containing JSON text, got {}",
            kind(v)
        )),
        (FieldType::Record(_), _) => Err(format!("RECORD expects an object, got {}", kind(v))),
        (ty, v) => Err(format!("{} cannot take {}", ty.name(), kind(v))),
    }
}

/// The JSON kind of a value, for error texts.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn integer(n: &serde_json::Number, ty: &str) -> Result<i64, String> {
    n.as_i64()
        .ok_or_else(|| format!("{ty} from a number expects an integer in INT64 range, got {n}"))
}

/// A JSON column's text must parse as JSON; `""` does not (docs/contract.md §4.3).
pub fn check_json_text(s: &str) -> Result<(), String> {
    serde_json::from_str::<serde::de::IgnoredAny>(s)
        .map(|_| ())
        .map_err(|e| format!("JSON column: invalid JSON text: {e}"))
}

// ---- NUMERIC / BIGNUMERIC ----------------------------------------------------------------------

fn type_name(scale: u32) -> &'static str {
    if scale == NUMERIC_SCALE {
        "NUMERIC"
    } else {
        "BIGNUMERIC"
    }
}

/// A string for NUMERIC (scale 9) or BIGNUMERIC (scale 38): decimal text if it has decimal
/// syntax (then its errors are final), else base64 `BigDecimalByteStringEncoder` bytes (Q11).
pub fn decimal_from_string(s: &str, scale: u32) -> Result<i256, String> {
    match parse_decimal_text(s, scale) {
        Some(r) => r,
        None => {
            let bytes = crate::message::decode_base64(s.as_bytes()).map_err(|_| {
                format!(
                    "{}: {s:?} is neither a decimal number nor base64 BigDecimalByteStringEncoder bytes",
                    type_name(scale)
                )
            })?;
            decode_big_decimal_bytes(&bytes, scale)
        }
    }
}

/// A JSON number for NUMERIC/BIGNUMERIC: taken as an IEEE-754 double (docs/contract.md §4.3), written in its
/// shortest round-trip decimal form, then parsed like decimal text.
pub fn decimal_from_number(n: &serde_json::Number, scale: u32) -> Result<i256, String> {
    let f = n.as_f64().unwrap_or(f64::NAN);
    if !f.is_finite() {
        return Err(format!("{}: {n} is not a finite double", type_name(scale)));
    }
    // `Display` of f64 is the shortest round-trip form, without exponent.
    let text = f.to_string();
    parse_decimal_text(&text, scale).unwrap_or_else(|| Err(format!("{}: {n}", type_name(scale))))
}

/// Parse `[+-]digits[.digits][(e|E)[+-]digits]` (Java `BigDecimal` syntax) to an unscaled value
/// of `scale`. `None` when `s` is not decimal syntax. Like `BigDecimalByteStringEncoder`, a value
/// whose own scale (fraction digits minus exponent, trailing zeros included) exceeds `scale` is an
/// error, and so is one outside the type's range.
pub fn parse_decimal_text(s: &str, scale: u32) -> Option<Result<i256, String>> {
    if scale == NUMERIC_SCALE {
        if let Some(v) = plain_numeric(s.as_bytes()) {
            return Some(Ok(i256::from_i128(v)));
        }
    }
    general_decimal_text(s, scale)
}

/// [`parse_decimal_text`] of any form, by the grammar.
fn general_decimal_text(s: &str, scale: u32) -> Option<Result<i256, String>> {
    let b = s.as_bytes();
    let mut i = 0;
    let neg = match b.first() {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = &b[int_start..i];
    let mut frac_digits: &[u8] = &[];
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let f = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        frac_digits = &b[f..i];
    }
    if int_digits.is_empty() && frac_digits.is_empty() {
        return None;
    }
    let mut exp: i64 = 0;
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        let eneg = match b.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let e = i;
        while i < b.len() && b[i].is_ascii_digit() {
            // Saturate: a huge exponent is out of range (or out of scale) either way.
            exp = (exp * 10 + i64::from(b[i] - b'0')).min(1_000_000);
            i += 1;
        }
        if i == e {
            return None;
        }
        if eneg {
            exp = -exp;
        }
    }
    if i != b.len() {
        return None;
    }
    let name = type_name(scale);
    let own_scale = frac_digits.len() as i64 - exp;
    if own_scale > i64::from(scale) {
        return Some(Err(format!(
            "{name}: {s:?} has more than {scale} fractional digits"
        )));
    }
    let out_of_range = || Err(format!("{name}: {s:?} is out of range"));
    // ≥ 0. Up to 38 digits and a shift that keeps them in i128 (every NUMERIC, most BIGNUMERICs):
    // in native integers; the i256 loop below takes everything else, to the same value.
    let shift = i64::from(scale) - own_scale;
    if int_digits.len() + frac_digits.len() <= 38 && shift <= 38 {
        let mut acc: i128 = 0;
        for &d in int_digits.iter().chain(frac_digits) {
            acc = acc * 10 + i128::from(d - b'0');
        }
        if let Some(v) = 10i128
            .checked_pow(shift as u32)
            .and_then(|m| acc.checked_mul(m))
        {
            let v = i256::from_i128(if neg { -v } else { v });
            return Some(check_decimal_range(v, scale).map_err(|e| format!("{name}: {s:?} {e}")));
        }
    }
    let mut acc = i256::ZERO;
    let ten = i256::from_i128(10);
    for &d in int_digits.iter().chain(frac_digits) {
        let d = i256::from_i128(i128::from(d - b'0'));
        let next = acc.checked_mul(ten).and_then(|a| {
            if neg {
                a.checked_sub(d)
            } else {
                a.checked_add(d)
            }
        });
        match next {
            Some(n) => acc = n,
            None => return Some(out_of_range()),
        }
    }
    if acc != i256::ZERO {
        let Some(m) = u32::try_from(shift).ok().and_then(|k| ten.checked_pow(k)) else {
            return Some(out_of_range());
        };
        match acc.checked_mul(m) {
            Some(v) => acc = v,
            None => return Some(out_of_range()),
        }
    }
    Some(check_decimal_range(acc, scale).map_err(|e| format!("{name}: {s:?} {e}")))
}

/// The common NUMERIC text, `[+-]digits[.digits]` with at most 18 digits in all and at most 9
/// after the point, as its unscaled value; `None` for anything else (then the general parser
/// decides). Such a value is always in NUMERIC's range, and is what the general parser makes of it.
pub(crate) fn plain_numeric(b: &[u8]) -> Option<i128> {
    let (neg, digits) = match b.first()? {
        b'-' => (true, &b[1..]),
        b'+' => (false, &b[1..]),
        _ => (false, b),
    };
    let mut acc = 0u64;
    let mut point = None;
    for (i, &c) in digits.iter().enumerate() {
        let d = c.wrapping_sub(b'0');
        if d <= 9 {
            acc = acc.wrapping_mul(10).wrapping_add(u64::from(d));
        } else if c == b'.' && point.is_none() {
            point = Some(i);
        } else {
            return None;
        }
    }
    let n = digits.len() - usize::from(point.is_some());
    let frac = point.map_or(0, |p| digits.len() - p - 1);
    // At least one digit, on either side of the point; `acc` did not wrap.
    if n == 0 || n > 18 || frac > NUMERIC_SCALE as usize {
        return None;
    }
    const POW10: [i128; 10] = [
        1,
        10,
        100,
        1_000,
        10_000,
        100_000,
        1_000_000,
        10_000_000,
        100_000_000,
        1_000_000_000,
    ];
    let v = i128::from(acc) * POW10[NUMERIC_SCALE as usize - frac];
    Some(if neg { -v } else { v })
}

/// NUMERIC: |v| ≤ 10^38 − 1 (unscaled). BIGNUMERIC: every 256-bit value. BigQuery's range,
/// −5.7896044618658097711785492504343953926634992332820282019728792003956564819968 × 10^38 to
/// +5.7896044618658097711785492504343953926634992332820282019728792003956564819967 × 10^38 with 38
/// fraction digits, is exactly `i256::MIN ..= i256::MAX` at scale 38, so a value that parsed into
/// an `i256` is in range; the parsers refuse anything beyond it with checked arithmetic.
fn check_decimal_range(v: i256, scale: u32) -> Result<i256, String> {
    if scale == NUMERIC_SCALE
        && v.to_i128()
            .is_none_or(|v| !(-NUMERIC_MAX..=NUMERIC_MAX).contains(&v))
    {
        return Err("is out of range".to_string());
    }
    Ok(v)
}

/// Decode `BigDecimalByteStringEncoder` bytes (docs/contract.md §4.3.2): the unscaled value's two's-complement
/// bytes, little-endian (Java `BigInteger.toByteArray` reversed). Redundant sign bytes are allowed,
/// as `BigInteger` allows them.
pub fn decode_big_decimal_bytes(bytes: &[u8], scale: u32) -> Result<i256, String> {
    let name = type_name(scale);
    let Some(&top) = bytes.last() else {
        return Err(format!("{name}: empty BigDecimalByteStringEncoder bytes"));
    };
    let fill = if top & 0x80 != 0 { 0xff } else { 0x00 };
    let mut le = [fill; 32];
    for (i, &b) in bytes.iter().enumerate() {
        if i < 32 {
            le[i] = b;
        } else if b != fill {
            return Err(format!(
                "{name}: BigDecimalByteStringEncoder value out of range"
            ));
        }
    }
    if bytes.len() > 32 && (le[31] & 0x80 != 0) != (fill == 0xff) {
        return Err(format!(
            "{name}: BigDecimalByteStringEncoder value out of range"
        ));
    }
    check_decimal_range(i256::from_le_bytes(le), scale)
        .map_err(|e| format!("{name}: BigDecimalByteStringEncoder value {e}"))
}

/// Encode an unscaled value as `BigDecimalByteStringEncoder` bytes (minimal two's complement,
/// little-endian). The inverse of [`decode_big_decimal_bytes`]; used by tests and generators.
pub fn encode_big_decimal_bytes(v: i256) -> Vec<u8> {
    let le = v.to_le_bytes();
    let fill = if v.is_negative() { 0xff } else { 0x00 };
    let mut n = 32;
    // Drop redundant sign bytes, keeping one whose top bit carries the sign.
    while n > 1 && le[n - 1] == fill && (le[n - 2] & 0x80 != 0) == (fill == 0xff) {
        n -= 1;
    }
    le[..n].to_vec()
}

// ---- dates and times ---------------------------------------------------------------------------

/// 0001-01-01 and 9999-12-31 as days since 1970-01-01: BigQuery's DATE range.
pub const MIN_DATE_DAYS: i64 = -719_162;
pub const MAX_DATE_DAYS: i64 = 2_932_896;
/// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z in µs: BigQuery's TIMESTAMP range.
pub const MIN_TIMESTAMP_MICROS: i64 = -62_135_596_800_000_000;
pub const MAX_TIMESTAMP_MICROS: i64 = 253_402_300_799_999_999;
const UNIX_EPOCH_DAYS_FROM_CE: i64 = 719_163;

fn days_of(d: NaiveDate) -> i32 {
    (i64::from(d.num_days_from_ce()) - UNIX_EPOCH_DAYS_FROM_CE) as i32
}

fn micros_of(dt: NaiveDateTime) -> i64 {
    let days = i64::from(days_of(dt.date()));
    days * 86_400_000_000 + time_micros(dt.time())
}

fn time_micros(t: NaiveTime) -> i64 {
    i64::from(t.num_seconds_from_midnight()) * 1_000_000 + i64::from(t.nanosecond() / 1000)
}

/// A cursor over an ASCII literal.
struct Lit<'a> {
    b: &'a [u8],
    i: usize,
}

impl Lit<'_> {
    /// `min..=max` digits as a number.
    fn digits(&mut self, min: usize, max: usize) -> Option<(u32, usize)> {
        let start = self.i;
        let mut v: u32 = 0;
        while self.i < self.b.len() && self.i - start < max && self.b[self.i].is_ascii_digit() {
            v = v * 10 + u32::from(self.b[self.i] - b'0');
            self.i += 1;
        }
        let n = self.i - start;
        (n >= min).then_some((v, n))
    }
    fn eat(&mut self, c: u8) -> bool {
        let ok = self.b.get(self.i) == Some(&c);
        if ok {
            self.i += 1;
        }
        ok
    }
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }
    fn done(&self) -> bool {
        self.i == self.b.len()
    }
}

/// `YYYY-[M]M-[D]D` → days since 1970-01-01.
fn lit_date(l: &mut Lit) -> Result<i32, String> {
    let (y, _) = l.digits(4, 4).ok_or("expected a 4-digit year")?;
    if !l.eat(b'-') {
        return Err("expected `-` after the year".into());
    }
    let (m, _) = l.digits(1, 2).ok_or("expected a month")?;
    if !l.eat(b'-') {
        return Err("expected `-` after the month".into());
    }
    let (d, _) = l.digits(1, 2).ok_or("expected a day")?;
    if y == 0 {
        return Err("year 0 is outside 0001–9999".into());
    }
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return Err(format!("no such date {y:04}-{m}-{d}"));
    }
    Ok(days_from_civil(y, m, d))
}

/// `[H]H:[M]M:[S]S[.F{1,6}]` → µs since midnight.
fn lit_time(l: &mut Lit) -> Result<i64, String> {
    let (h, _) = l.digits(1, 2).ok_or("expected an hour")?;
    if !l.eat(b':') {
        return Err("expected `:` after the hour".into());
    }
    let (mi, _) = l.digits(1, 2).ok_or("expected minutes")?;
    if !l.eat(b':') {
        return Err("expected `:` after the minutes".into());
    }
    let (s, _) = l.digits(1, 2).ok_or("expected seconds")?;
    let mut micros = 0;
    if l.eat(b'.') {
        let (f, n) = l
            .digits(1, 7)
            .ok_or("expected 1 to 6 fractional digits after `.`")?;
        if n > 6 {
            return Err("more than 6 fractional digits (BigQuery keeps microseconds)".into());
        }
        micros = f * 10u32.pow(6 - n as u32);
    }
    if h > 23 || mi > 59 || s > 59 {
        return Err(format!("time {h}:{mi}:{s} out of range"));
    }
    Ok(i64::from((h * 60 + mi) * 60 + s) * 1_000_000 + i64::from(micros))
}

fn finish<T>(l: &Lit, v: T, what: &str, s: &str) -> Result<T, String> {
    if l.done() {
        Ok(v)
    } else {
        Err(format!(
            "{what}: unexpected text at {:?} in {s:?}",
            &s[l.i..]
        ))
    }
}

/// [`parse_date`] of the usual form only (see [`fixed_date`]).
pub(crate) fn fast_date(b: &[u8]) -> Option<i32> {
    (b.len() == 10).then(|| fixed_date(b)).flatten()
}

/// [`parse_time`] of the usual form only (see [`fixed_date`]).
pub(crate) fn fast_time(b: &[u8]) -> Option<i64> {
    fixed_time(b)
        .filter(|(_, len)| *len == b.len())
        .map(|(t, _)| t)
}

/// [`parse_datetime`] of the usual form only (see [`fixed_date`]).
pub(crate) fn fast_datetime(b: &[u8]) -> Option<i64> {
    fixed_datetime(b)
        .filter(|(_, len)| *len == b.len())
        .map(|(t, _)| t)
}

/// [`parse_timestamp`] of the usual form only, in UTC: a [`fast_datetime`] form, then nothing,
/// `Z` or `z` (see [`fixed_date`]).
pub(crate) fn fast_timestamp(b: &[u8]) -> Option<i64> {
    let (t, len) = fixed_datetime(b)?;
    match &b[len..] {
        b"" | b"Z" | b"z" => timestamp_from_micros(t).ok(),
        _ => None,
    }
}

/// DATE literal `YYYY-[M]M-[D]D` → days since 1970-01-01.
pub fn parse_date(s: &str) -> Result<i32, String> {
    fast_date(s.as_bytes()).map_or_else(|| general_date(s), Ok)
}

/// [`parse_date`] of any form, by the grammar.
fn general_date(s: &str) -> Result<i32, String> {
    let mut l = Lit {
        b: s.as_bytes(),
        i: 0,
    };
    let d = lit_date(&mut l).map_err(|e| format!("DATE {s:?}: {e} (format YYYY-[M]M-[D]D)"))?;
    finish(&l, d, "DATE", s)
}

/// TIME literal `[H]H:[M]M:[S]S[.F]` → µs since midnight.
pub fn parse_time(s: &str) -> Result<i64, String> {
    fast_time(s.as_bytes()).map_or_else(|| general_time(s), Ok)
}

/// [`parse_time`] of any form, by the grammar.
fn general_time(s: &str) -> Result<i64, String> {
    let mut l = Lit {
        b: s.as_bytes(),
        i: 0,
    };
    let t = lit_time(&mut l).map_err(|e| format!("TIME {s:?}: {e} (format [H]H:[M]M:[S]S[.F])"))?;
    finish(&l, t, "TIME", s)
}

/// `date[( |T)time]` → µs since 1970-01-01T00:00, shared by DATETIME and TIMESTAMP.
fn lit_datetime(l: &mut Lit) -> Result<i64, String> {
    let days = i64::from(lit_date(l)?) * 86_400_000_000;
    let sep = l.peek();
    let has_time = matches!(sep, Some(b'T' | b't'))
        || (sep == Some(b' ') && l.b.get(l.i + 1).is_some_and(u8::is_ascii_digit));
    if has_time {
        l.i += 1;
        Ok(days + lit_time(l)?)
    } else {
        Ok(days)
    }
}

/// DATETIME literal `YYYY-[M]M-[D]D[( |T)[H]H:[M]M:[S]S[.F]]` → µs since 1970-01-01T00:00.
pub fn parse_datetime(s: &str) -> Result<i64, String> {
    fast_datetime(s.as_bytes()).map_or_else(|| general_datetime(s), Ok)
}

/// [`parse_datetime`] of any form, by the grammar.
fn general_datetime(s: &str) -> Result<i64, String> {
    let mut l = Lit {
        b: s.as_bytes(),
        i: 0,
    };
    let dt = lit_datetime(&mut l).map_err(|e| {
        format!("DATETIME {s:?}: {e} (format YYYY-[M]M-[D]D[( |T)[H]H:[M]M:[S]S[.F]])")
    })?;
    finish(&l, dt, "DATETIME", s)
}

/// TIMESTAMP literal: a DATETIME literal, then optionally a zone — `Z`, `±H[H][[:]MM]` or `UTC`,
/// optionally after a space; none means UTC. Named zones other than UTC are rejected.
pub fn parse_timestamp(s: &str) -> Result<i64, String> {
    fast_timestamp(s.as_bytes()).map_or_else(|| general_timestamp(s), Ok)
}

/// [`parse_timestamp`] of any form, by the grammar.
fn general_timestamp(s: &str) -> Result<i64, String> {
    let fmt = "format YYYY-[M]M-[D]D[( |T)[H]H:[M]M:[S]S[.F]][Z|±HH[:MM]|UTC]";
    let err = |e: String| format!("TIMESTAMP {s:?}: {e} ({fmt})");
    let mut l = Lit {
        b: s.as_bytes(),
        i: 0,
    };
    let dt = lit_datetime(&mut l).map_err(err)?;
    let space = l.eat(b' ');
    let rest = &s[l.i..];
    let offset_secs: i64 = if (rest.is_empty() && !space) || matches!(rest, "Z" | "z" | "UTC") {
        0
    } else if let Some(sign @ (b'+' | b'-')) = l.peek() {
        l.i += 1;
        let (h, _) = l
            .digits(1, 2)
            .ok_or_else(|| err("expected an offset hour".into()))?;
        let colon = l.eat(b':');
        let mi = match l.digits(2, 2) {
            Some((m, _)) => m,
            None if colon => return Err(err("expected offset minutes".into())),
            None => 0,
        };
        if !l.done() {
            return Err(err(format!("unexpected text at {:?}", &s[l.i..])));
        }
        if h > 14 || mi > 59 {
            return Err(err("zone offset out of range".into()));
        }
        let o = i64::from(h * 3600 + mi * 60);
        if sign == b'-' {
            -o
        } else {
            o
        }
    } else {
        return Err(err(format!(
            "unsupported zone {rest:?} (only UTC, Z and numeric offsets)"
        )));
    };
    let micros = dt - offset_secs * 1_000_000;
    timestamp_from_micros(micros).map_err(|_| err("outside 0001-01-01 … 9999-12-31 UTC".into()))
}

/// DATE from an integer: days since 1970-01-01, within 0001-01-01 … 9999-12-31.
pub fn date_from_days(days: i64) -> Result<i32, String> {
    if (MIN_DATE_DAYS..=MAX_DATE_DAYS).contains(&days) {
        Ok(days as i32)
    } else {
        Err(format!(
            "DATE {days} days is outside 0001-01-01 … 9999-12-31"
        ))
    }
}

/// TIMESTAMP from an integer: µs since the epoch, within 0001-01-01 … 9999-12-31 UTC.
pub fn timestamp_from_micros(micros: i64) -> Result<i64, String> {
    if (MIN_TIMESTAMP_MICROS..=MAX_TIMESTAMP_MICROS).contains(&micros) {
        Ok(micros)
    } else {
        Err(format!(
            "TIMESTAMP {micros} µs is outside 0001-01-01 … 9999-12-31 UTC"
        ))
    }
}

fn bits(v: i64, shift: u32, width: u32) -> u32 {
    ((v >> shift) & ((1 << width) - 1)) as u32
}

/// Split the low 37 bits of a CivilTimeEncoder value (hour 5, minute 6, second 6, micros 20 bits).
fn packed_time_parts(v: i64, what: &str) -> Result<NaiveTime, String> {
    let (h, mi, s, us) = (
        bits(v, 32, 5),
        bits(v, 26, 6),
        bits(v, 20, 6),
        bits(v, 0, 20),
    );
    if h > 23 || mi > 59 || s > 59 || us > 999_999 {
        return Err(format!(
            "{what} {v}: packed time fields out of range (hour {h}, minute {mi}, second {s}, micros {us})"
        ));
    }
    Ok(NaiveTime::from_hms_micro_opt(h, mi, s, us).expect("checked"))
}

/// TIME from CivilTimeEncoder's packed integer: `(hour<<32) + (minute<<26) + (second<<20) +
/// micros` (docs/contract.md §4.3.1); bits above 37 must be zero.
pub fn decode_packed_time(v: i64) -> Result<i64, String> {
    if v < 0 || v >> 37 != 0 {
        return Err(format!(
            "TIME {v}: stray bits outside the packed (hour<<32)+(minute<<26)+(second<<20)+micros fields"
        ));
    }
    packed_time_parts(v, "TIME").map(time_micros)
}

/// DATETIME from CivilTimeEncoder's packed integer: `(year<<46) + (month<<42) + (day<<37) +
/// time bits`; year 1–9999, bits above 60 zero.
pub fn decode_packed_datetime(v: i64) -> Result<i64, String> {
    if v < 0 || v >> 60 != 0 {
        return Err(format!(
            "DATETIME {v}: stray bits outside the packed (year<<46)+…+micros fields"
        ));
    }
    let (y, m, d) = (bits(v, 46, 14), bits(v, 42, 4), bits(v, 37, 5));
    let date = NaiveDate::from_ymd_opt(y as i32, m, d)
        .filter(|_| (1..=9999).contains(&y))
        .ok_or_else(|| {
            format!("DATETIME {v}: packed date fields out of range (year {y}, month {m}, day {d})")
        })?;
    let t = packed_time_parts(v, "DATETIME")?;
    Ok(micros_of(date.and_time(t)))
}

/// The CivilTimeEncoder packing of a time (µs since midnight); inverse of [`decode_packed_time`].
pub fn encode_packed_time(micros: i64) -> i64 {
    let (secs, us) = (micros / 1_000_000, micros % 1_000_000);
    ((secs / 3600) << 32) | (((secs / 60) % 60) << 26) | ((secs % 60) << 20) | us
}

/// The CivilTimeEncoder packing of a datetime (µs since 1970-01-01T00:00 civil).
pub fn encode_packed_datetime(micros: i64) -> i64 {
    let days = micros.div_euclid(86_400_000_000);
    let tod = micros.rem_euclid(86_400_000_000);
    let d = NaiveDate::from_num_days_from_ce_opt((days + UNIX_EPOCH_DAYS_FROM_CE) as i32)
        .expect("in range");
    (i64::from(d.year()) << 46)
        | (i64::from(d.month()) << 42)
        | (i64::from(d.day()) << 37)
        | encode_packed_time(tod)
}

/// A BYTES cell, held to the field's `maxLength`.
pub(crate) fn bytes_cell(b: Vec<u8>, max_length: Option<u64>) -> Result<Cell, String> {
    if let Some(max) = max_length {
        if b.len() as u64 > max {
            return Err(format!(
                "BYTES of {} bytes exceeds maxLength {max}",
                b.len()
            ));
        }
    }
    Ok(Cell::Bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_decimal_bytes_match_the_spec_examples() {
        // docs/contract.md §4.3.2: 123.124 → 00 25 c3 aa 1c; -1 → 00 36 65 c4; 0 → 00.
        let n = |s: &str| parse_decimal_text(s, NUMERIC_SCALE).unwrap().unwrap();
        assert_eq!(
            encode_big_decimal_bytes(n("123.124")),
            [0x00, 0x25, 0xc3, 0xaa, 0x1c]
        );
        assert_eq!(encode_big_decimal_bytes(n("-1")), [0x00, 0x36, 0x65, 0xc4]);
        assert_eq!(encode_big_decimal_bytes(n("0")), [0x00]);
        assert_eq!(
            decimal_from_string("ACXDqhw=", NUMERIC_SCALE).unwrap(),
            n("123.124")
        );
        assert_eq!(
            decimal_from_string("ADZlxA==", NUMERIC_SCALE).unwrap(),
            n("-1")
        );
        // A redundant sign byte is accepted, as BigInteger accepts it.
        assert_eq!(
            decode_big_decimal_bytes(&[0x00, 0x36, 0x65, 0xc4, 0xff], 9).unwrap(),
            n("-1")
        );
        for v in [
            i256::MAX,
            i256::MIN,
            i256::ZERO,
            i256::ONE,
            i256::MINUS_ONE,
            i256::from_i128(128),
            i256::from_i128(-129),
        ] {
            let bytes = encode_big_decimal_bytes(v);
            let mut le = [if v.is_negative() { 0xff } else { 0 }; 32];
            le[..bytes.len()].copy_from_slice(&bytes);
            assert_eq!(i256::from_le_bytes(le), v, "{v}");
        }
    }

    #[test]
    fn packed_civil_time_matches_the_spec_examples() {
        assert_eq!(
            decode_packed_time(17_851_457_824).unwrap(),
            (4 * 3600 + 10 * 60) * 1_000_000 + 500_000
        );
        let dt = decode_packed_datetime(142_399_005_714_808_832).unwrap();
        assert_eq!(dt, 1_695_615_000_000_000);
        assert_eq!(encode_packed_datetime(dt), 142_399_005_714_808_832);
        assert_eq!(
            encode_packed_time(decode_packed_time(17_851_457_824).unwrap()),
            17_851_457_824
        );
    }

    proptest::proptest! {
        #[test]
        fn packed_round_trip(micros in MIN_TIMESTAMP_MICROS..=MAX_TIMESTAMP_MICROS) {
            proptest::prop_assert_eq!(decode_packed_datetime(encode_packed_datetime(micros)), Ok(micros));
            let tod = micros.rem_euclid(86_400_000_000);
            proptest::prop_assert_eq!(decode_packed_time(encode_packed_time(tod)), Ok(tod));
        }

        #[test]
        fn literals_agree_with_chrono(days in MIN_DATE_DAYS..=MAX_DATE_DAYS, tod in 0i64..86_400_000_000) {
            let d = NaiveDate::from_num_days_from_ce_opt((days + UNIX_EPOCH_DAYS_FROM_CE) as i32).unwrap();
            let t = NaiveTime::from_num_seconds_from_midnight_opt((tod / 1_000_000) as u32, (tod % 1_000_000) as u32 * 1000).unwrap();
            proptest::prop_assert_eq!(i64::from(days_of(d)), days);
            proptest::prop_assert_eq!(parse_date(&d.format("%Y-%m-%d").to_string()), Ok(days as i32));
            proptest::prop_assert_eq!(parse_time(&t.format("%H:%M:%S%.6f").to_string()), Ok(tod));
            let dt = d.and_time(t);
            proptest::prop_assert_eq!(parse_datetime(&dt.format("%Y-%m-%dT%H:%M:%S%.f").to_string()), Ok(micros_of(dt)));
        }

        /// The fast forms of the literals give what the grammar gives, and take the usual forms.
        #[test]
        fn fixed_literals_agree_with_the_grammar(
            y in 0u32..10_000, m in 0u32..14, d in 0u32..33, h in 0u32..26, mi in 0u32..62,
            sec in 0u32..62, frac in "[0-9]{0,8}", sep in "[Tt ]", zone in "(|Z|z| UTC|\\+01:00|x)",
            pad in proptest::prelude::any::<bool>(),
        ) {
            let date = if pad { format!("{y:04}-{m:02}-{d:02}") } else { format!("{y:04}-{m}-{d}") };
            let dot = if frac.is_empty() { String::new() } else { format!(".{frac}") };
            let time = format!("{h:02}:{mi:02}:{sec:02}{dot}");
            let dt = format!("{date}{sep}{time}");
            let ts = format!("{dt}{zone}");
            let usual = date.len() == 10 && y > 0 && chrono::NaiveDate::from_ymd_opt(y as i32, m, d).is_some();
            let usual_time = h < 24 && mi < 60 && sec < 60 && frac.len() <= 6;
            for (fast, general, text, taken) in [
                (fast_date(date.as_bytes()).map(i64::from), general_date(&date).ok().map(i64::from), &date, usual),
                (fast_time(time.as_bytes()), general_time(&time).ok(), &time, usual_time),
                (fast_datetime(dt.as_bytes()), general_datetime(&dt).ok(), &dt, usual && usual_time),
                (fast_timestamp(ts.as_bytes()), general_timestamp(&ts).ok(), &ts, usual && usual_time && matches!(zone.as_str(), "" | "Z" | "z")),
            ] {
                if let Some(v) = fast {
                    proptest::prop_assert_eq!(Some(v), general, "{}", text);
                }
                proptest::prop_assert_eq!(fast.is_some(), taken, "{}", text);
            }
        }

        /// The fast form of NUMERIC text gives what the grammar gives.
        #[test]
        fn plain_numeric_agrees_with_the_grammar(s in "[+-]?[0-9]{0,20}(\\.[0-9]{0,11})?") {
            if let Some(v) = plain_numeric(s.as_bytes()) {
                proptest::prop_assert_eq!(general_decimal_text(&s, NUMERIC_SCALE), Some(Ok(i256::from_i128(v))), "{}", s);
            }
            let digits = s.bytes().filter(u8::is_ascii_digit).count();
            let frac = s.split('.').nth(1).map_or(0, str::len);
            proptest::prop_assert_eq!(plain_numeric(s.as_bytes()).is_some(), (1..=18).contains(&digits) && frac <= 9, "{}", s);
        }

        #[test]
        fn decimal_text_round_trip(v in proptest::prelude::any::<i128>()) {
            let max = 10i128.pow(38) - 1;
            let v = v % max;
            let text = format!("{}{}.{:09}", if v < 0 { "-" } else { "" }, (v / 1_000_000_000).abs(), (v % 1_000_000_000).abs());
            proptest::prop_assert_eq!(parse_decimal_text(&text, 9), Some(Ok(i256::from_i128(v))));
            let bytes = encode_big_decimal_bytes(i256::from_i128(v));
            proptest::prop_assert_eq!(decode_big_decimal_bytes(&bytes, 9), Ok(i256::from_i128(v)));
        }

        /// Every BIGNUMERIC value, ±5.789…×10^38 included, reads back exactly from its decimal
        /// text (plain and with an exponent) and from its BigDecimalByteStringEncoder bytes.
        #[test]
        fn bignumeric_full_range_round_trip(le in proptest::prelude::any::<[u8; 32]>(), small in proptest::prelude::any::<bool>()) {
            // Half the cases near zero, so the native fast loop is covered as well as the i256 one.
            let v = if small { i256::from_i128(i128::from_le_bytes(le[..16].try_into().unwrap()) >> 12) } else { i256::from_le_bytes(le) };
            let text = bignumeric_text(v);
            proptest::prop_assert_eq!(parse_decimal_text(&text, BIGNUMERIC_SCALE), Some(Ok(v)), "{}", text);
            // The unscaled digits with an exponent.
            let exp = format!("{v}E-38");
            proptest::prop_assert_eq!(parse_decimal_text(&exp, BIGNUMERIC_SCALE), Some(Ok(v)), "{}", exp);
            proptest::prop_assert_eq!(decode_big_decimal_bytes(&encode_big_decimal_bytes(v), BIGNUMERIC_SCALE), Ok(v));
        }
    }

    /// `unscaled / 10^38` as plain decimal text with all 38 fraction digits.
    fn bignumeric_text(v: i256) -> String {
        let s = v.to_string();
        let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
        let padded = format!("{digits:0>39}");
        let (int, frac) = padded.split_at(padded.len() - 38);
        format!("{sign}{int}.{frac}")
    }

    #[test]
    fn bignumeric_range_is_bigquerys_exactly() {
        let max = "578960446186580977117854925043439539266.34992332820282019728792003956564819967";
        let min = "-578960446186580977117854925043439539266.34992332820282019728792003956564819968";
        assert_eq!(bignumeric_text(i256::MAX), max);
        assert_eq!(bignumeric_text(i256::MIN), min);
        assert_eq!(parse_decimal_text(max, 38), Some(Ok(i256::MAX)));
        assert_eq!(parse_decimal_text(min, 38), Some(Ok(i256::MIN)));
        let ten = i256::from_i128(10);
        assert_eq!(
            parse_decimal_text("1e38", 38),
            Some(Ok(ten.wrapping_pow(76)))
        );
        assert_eq!(
            parse_decimal_text("-1E+38", 38),
            Some(Ok(-ten.wrapping_pow(76)))
        );
        for beyond in [
            "578960446186580977117854925043439539266.34992332820282019728792003956564819968",
            "-578960446186580977117854925043439539266.34992332820282019728792003956564819969",
            "578960446186580977117854925043439539267",
            "1e77",
            "-6e38",
        ] {
            let got = parse_decimal_text(beyond, 38);
            assert_eq!(
                got,
                Some(Err(format!("BIGNUMERIC: {beyond:?} is out of range"))),
                "{beyond}"
            );
        }
        // Bytes: 2^255 and −2^255 − 1 need 33 bytes.
        let mut plus_one = vec![0u8; 33];
        plus_one[31] = 0x80;
        assert!(decode_big_decimal_bytes(&plus_one, 38).is_err());
        let mut minus_one = vec![0xffu8; 33];
        minus_one[31] = 0x7f;
        assert!(decode_big_decimal_bytes(&minus_one, 38).is_err());
        // Numbers: doubles near the bounds.
        let n = |x: &str| serde_json::from_str::<serde_json::Number>(x).unwrap();
        assert_eq!(
            decimal_from_number(&n("1e38"), 38),
            Ok(ten.wrapping_pow(76))
        );
        assert!(decimal_from_number(&n("5.7e38"), 38).is_ok());
        assert!(decimal_from_number(&n("5.8e38"), 38).is_err());
    }
}
