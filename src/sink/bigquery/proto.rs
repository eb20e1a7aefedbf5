//! Protobuf rows (`ProtoRows`) for the Storage Write API: what a keyed table's change data
//! capture rows are appended as (BigQuery's CDC takes protobuf rows only: "The Apache Arrow format
//! isn't supported"). The row builder's Arrow batches are encoded row by row into proto2 messages
//! described by a [`DescriptorProto`] made from the same Arrow schema (with the `_CHANGE_TYPE` and
//! `_CHANGE_SEQUENCE_NUMBER` columns, BigQuery's pseudo-columns).
//!
//! The Storage Write API's type mapping:
//!
//! | BigQuery | Arrow (row builder) | proto field | value |
//! |---|---|---|---|
//! | INT64 | `Int64` | `int64` | |
//! | FLOAT64 | `Float64` | `double` | |
//! | BOOL | `Boolean` | `bool` | |
//! | STRING, JSON | `Utf8` | `string` | |
//! | BYTES | `Binary` | `bytes` | |
//! | NUMERIC, BIGNUMERIC | `Decimal128(38, 9)`, `Decimal256(76, 38)` | `string` | the exact decimal, no trailing fraction zeros (`-1.5`, `42`) |
//! | DATE | `Date32` | `int32` | days since 1970-01-01 |
//! | TIME | `Time64(µs)` | `string` | `HH:MM:SS[.ffffff]` |
//! | DATETIME | `Timestamp(µs)` | `string` | `YYYY-MM-DD HH:MM:SS[.ffffff]` |
//! | TIMESTAMP | `Timestamp(µs, "UTC")` | `int64` | µs since the epoch |
//! | RECORD | `Struct` | a nested message | |
//! | REPEATED | `List` | `LABEL_REPEATED` (not packed) | |
//!
//! Every other field is `LABEL_OPTIONAL`; a NULL is an absent field. Field numbers are 1..n in
//! column order. The descriptor is self-contained: every RECORD's message type is declared in the
//! root message's `nested_type` as `__ROOT__N` (a prefix no BigQuery column name may start with,
//! so no type clashes with a field) and named relatively in `type_name`.
//!
//! The wire encoding is written by hand (varints, tags, length prefixes): a request's rows go into
//! one buffer, each row a slice of it — no allocation per row or value.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Decimal256Type, Float64Type, Int64Type, Time64MicrosecondType,
    TimestampMicrosecondType,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema, TimeUnit};
use bytes::Bytes;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto};

/// The root message's name.
pub const ROW_MESSAGE: &str = "Row";

/// The proto2 descriptor of rows of `schema` (the row builder's Arrow schema).
pub fn descriptor(schema: &Schema) -> Result<DescriptorProto, String> {
    let mut nested = Vec::new();
    let mut root = message(ROW_MESSAGE.to_string(), schema.fields(), &mut nested)?;
    root.nested_type = nested;
    Ok(root)
}

fn message(
    name: String,
    fields: &Fields,
    nested: &mut Vec<DescriptorProto>,
) -> Result<DescriptorProto, String> {
    let mut field = Vec::with_capacity(fields.len());
    for (i, f) in fields.iter().enumerate() {
        let (label, data_type) = match f.data_type() {
            DataType::List(elem) => (Label::Repeated, elem.data_type()),
            t => (Label::Optional, t),
        };
        let (ty, type_name) = match data_type {
            DataType::Struct(children) => {
                // Reserved before the children's, so the numbering follows the schema's order.
                let at = nested.len();
                let type_name = format!("__ROOT__{}", at + 1);
                nested.push(DescriptorProto::default());
                nested[at] = message(type_name.clone(), children, nested)?;
                (Type::Message, Some(type_name))
            }
            t => (scalar_type(t).ok_or_else(|| unsupported(f))?, None),
        };
        field.push(FieldDescriptorProto {
            name: Some(f.name().clone()),
            number: Some(i as i32 + 1),
            label: Some(label as i32),
            r#type: Some(ty as i32),
            type_name,
            ..Default::default()
        });
    }
    Ok(DescriptorProto {
        name: Some(name),
        field,
        ..Default::default()
    })
}

fn scalar_type(t: &DataType) -> Option<Type> {
    Some(match t {
        DataType::Int64 => Type::Int64,
        DataType::Float64 => Type::Double,
        DataType::Boolean => Type::Bool,
        DataType::Utf8 | DataType::Decimal128(..) | DataType::Decimal256(..) => Type::String,
        DataType::Time64(TimeUnit::Microsecond) => Type::String,
        DataType::Timestamp(TimeUnit::Microsecond, None) => Type::String,
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => Type::Int64,
        DataType::Binary => Type::Bytes,
        DataType::Date32 => Type::Int32,
        _ => return None,
    })
}

fn unsupported(f: &Field) -> String {
    format!(
        "column `{}`: Arrow type {} has no protobuf row encoding",
        f.name(),
        f.data_type()
    )
}

/// An upper estimate of the encoded size of `d` (for the request size limit).
pub fn descriptor_size(d: &DescriptorProto) -> usize {
    let fields: usize = d
        .field
        .iter()
        .map(|f| {
            24 + f.name.as_ref().map_or(0, String::len)
                + f.type_name.as_ref().map_or(0, String::len)
        })
        .sum();
    let nested: usize = d.nested_type.iter().map(descriptor_size).sum();
    16 + d.name.as_ref().map_or(0, String::len) + fields + nested
}

/// A column, typed once per batch.
enum Col<'a> {
    Int64(&'a arrow_array::Int64Array),
    Float64(&'a arrow_array::Float64Array),
    Bool(&'a arrow_array::BooleanArray),
    Utf8(&'a arrow_array::StringArray),
    Binary(&'a arrow_array::BinaryArray),
    Dec128(&'a arrow_array::Decimal128Array, u32),
    Dec256(&'a arrow_array::Decimal256Array, u32),
    Date(&'a arrow_array::Date32Array),
    Time(&'a arrow_array::Time64MicrosecondArray),
    DateTime(&'a arrow_array::TimestampMicrosecondArray),
    Timestamp(&'a arrow_array::TimestampMicrosecondArray),
    Struct(&'a arrow_array::StructArray, Vec<Col<'a>>),
    List(&'a arrow_array::ListArray, Box<Col<'a>>),
}

impl<'a> Col<'a> {
    fn new(a: &'a ArrayRef) -> Result<Col<'a>, String> {
        Ok(match a.data_type() {
            DataType::Int64 => Col::Int64(a.as_primitive::<Int64Type>()),
            DataType::Float64 => Col::Float64(a.as_primitive::<Float64Type>()),
            DataType::Boolean => Col::Bool(a.as_boolean()),
            DataType::Utf8 => Col::Utf8(a.as_string::<i32>()),
            DataType::Binary => Col::Binary(a.as_binary::<i32>()),
            DataType::Decimal128(_, s) => {
                Col::Dec128(a.as_primitive::<Decimal128Type>(), scale(*s)?)
            }
            DataType::Decimal256(_, s) => {
                Col::Dec256(a.as_primitive::<Decimal256Type>(), scale(*s)?)
            }
            DataType::Date32 => Col::Date(a.as_primitive::<Date32Type>()),
            DataType::Time64(TimeUnit::Microsecond) => {
                Col::Time(a.as_primitive::<Time64MicrosecondType>())
            }
            DataType::Timestamp(TimeUnit::Microsecond, tz) => {
                let t = a.as_primitive::<TimestampMicrosecondType>();
                if tz.is_some() {
                    Col::Timestamp(t)
                } else {
                    Col::DateTime(t)
                }
            }
            DataType::Struct(_) => {
                let s = a.as_struct();
                let cols = s.columns().iter().map(Col::new).collect::<Result<_, _>>()?;
                Col::Struct(s, cols)
            }
            DataType::List(_) => {
                let l = a.as_list::<i32>();
                Col::List(l, Box::new(Col::new(l.values())?))
            }
            t => return Err(format!("Arrow type {t} has no protobuf row encoding")),
        })
    }

    fn is_null(&self, i: usize) -> bool {
        match self {
            Col::Int64(a) => a.is_null(i),
            Col::Float64(a) => a.is_null(i),
            Col::Bool(a) => a.is_null(i),
            Col::Utf8(a) => a.is_null(i),
            Col::Binary(a) => a.is_null(i),
            Col::Dec128(a, _) => a.is_null(i),
            Col::Dec256(a, _) => a.is_null(i),
            Col::Date(a) => a.is_null(i),
            Col::Time(a) => a.is_null(i),
            Col::DateTime(a) | Col::Timestamp(a) => a.is_null(i),
            Col::Struct(a, _) => a.is_null(i),
            Col::List(a, _) => a.is_null(i),
        }
    }

    /// Field `tag`'s value(s) at row `i` (not NULL), appended to `out`.
    fn encode(&self, tag: u32, i: usize, out: &mut Vec<u8>) {
        match self {
            Col::Int64(a) => varint_field(tag, a.value(i) as u64, out),
            Col::Timestamp(a) => varint_field(tag, a.value(i) as u64, out),
            // int32: sign-extended to 64 bits, as protobuf encodes negative int32s.
            Col::Date(a) => varint_field(tag, a.value(i) as i64 as u64, out),
            Col::Bool(a) => varint_field(tag, a.value(i) as u64, out),
            Col::Float64(a) => {
                key(tag, WIRE_FIXED64, out);
                out.extend_from_slice(&a.value(i).to_bits().to_le_bytes());
            }
            Col::Utf8(a) => bytes_field(tag, a.value(i).as_bytes(), out),
            Col::Binary(a) => bytes_field(tag, a.value(i), out),
            Col::Dec128(a, s) => {
                let v = a.value(i);
                let mut digits = [0u8; 80];
                let n = digits_u128(v.unsigned_abs(), &mut digits);
                decimal_field(tag, v < 0, &digits[80 - n..], *s, out);
            }
            Col::Dec256(a, s) => {
                let v = a.value(i);
                let neg = v.is_negative();
                let mag = if neg { v.wrapping_neg() } else { v };
                let mut digits = [0u8; 80];
                let n = digits_u256(mag.to_le_bytes(), &mut digits);
                decimal_field(tag, neg, &digits[80 - n..], *s, out);
            }
            Col::Time(a) => {
                let mut b = [0u8; 16];
                let n = time_text(a.value(i).rem_euclid(DAY_MICROS), &mut b);
                bytes_field(tag, &b[..n], out);
            }
            Col::DateTime(a) => {
                let mut b = [0u8; 40];
                let n = datetime_text(a.value(i), &mut b);
                bytes_field(tag, &b[..n], out);
            }
            Col::Struct(_, cols) => {
                key(tag, WIRE_LEN, out);
                let start = out.len();
                encode_fields(cols, i, out);
                prefix_length(start, out);
            }
            Col::List(a, elem) => {
                let offsets = a.value_offsets();
                for j in offsets[i] as usize..offsets[i + 1] as usize {
                    if !elem.is_null(j) {
                        elem.encode(tag, j, out);
                    }
                }
            }
        }
    }
}

fn scale(s: i8) -> Result<u32, String> {
    u32::try_from(s).map_err(|_| format!("decimal scale {s} has no protobuf row encoding"))
}

/// The fields (1..n) of row `i`, appended to `out`.
fn encode_fields(cols: &[Col<'_>], i: usize, out: &mut Vec<u8>) {
    for (n, c) in cols.iter().enumerate() {
        if !c.is_null(i) {
            c.encode(n as u32 + 1, i, out);
        }
    }
}

/// Each row of `batch` as one serialized message of [`descriptor`]`(batch.schema())`, and the
/// encoded size of all of them: slices of one buffer.
/// Change data capture rows must each carry a `_CHANGE_TYPE` (BigQuery requires it; the row
/// builder fails a message without one): a batch with a row missing it is not sent at all.
pub fn check_change_types(batch: &RecordBatch) -> Result<(), String> {
    use crate::table::cdc::CHANGE_TYPE;
    let Some(ct) = batch.column_by_name(CHANGE_TYPE) else {
        return Err(format!(
            "change data capture rows without a `{CHANGE_TYPE}` column"
        ));
    };
    match (0..ct.len()).find(|&i| ct.is_null(i)) {
        Some(i) => Err(format!(
            "row {i} has no `{CHANGE_TYPE}`: BigQuery requires \"UPSERT\" or \"DELETE\" on \
             every change data capture row; the batch was not sent"
        )),
        None => Ok(()),
    }
}

pub fn encode_rows(batch: &RecordBatch) -> Result<(Vec<Bytes>, usize), String> {
    let cols = batch
        .columns()
        .iter()
        .zip(batch.schema().fields())
        .map(|(a, f)| Col::new(a).map_err(|e| format!("column `{}`: {e}", f.name())))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::new();
    let mut ends = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        encode_fields(&cols, i, &mut out);
        ends.push(out.len());
    }
    let size = out.len();
    let buf = Bytes::from(out);
    let mut start = 0;
    let rows = ends
        .into_iter()
        .map(|end| {
            let r = buf.slice(start..end);
            start = end;
            r
        })
        .collect();
    Ok((rows, size))
}

const WIRE_VARINT: u32 = 0;
const WIRE_FIXED64: u32 = 1;
const WIRE_LEN: u32 = 2;
const DAY_MICROS: i64 = 86_400_000_000;

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(tag: u32, wire: u32, out: &mut Vec<u8>) {
    varint(((tag << 3) | wire) as u64, out);
}

fn varint_field(tag: u32, v: u64, out: &mut Vec<u8>) {
    key(tag, WIRE_VARINT, out);
    varint(v, out);
}

fn bytes_field(tag: u32, v: &[u8], out: &mut Vec<u8>) {
    key(tag, WIRE_LEN, out);
    varint(v.len() as u64, out);
    out.extend_from_slice(v);
}

/// Put the length of `out[start..]` (a nested message just written) in front of it.
fn prefix_length(start: usize, out: &mut Vec<u8>) {
    let len = out.len() - start;
    varint(len as u64, out);
    let prefix = out.len() - start - len;
    out[start..].rotate_right(prefix);
}

/// The decimal digits of `v`, right-aligned in `buf`; how many.
fn digits_u128(mut v: u128, buf: &mut [u8; 80]) -> usize {
    let mut n = 0;
    loop {
        n += 1;
        buf[80 - n] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return n;
        }
    }
}

/// The decimal digits of the unsigned 256-bit `le` (little-endian), right-aligned in `buf`.
fn digits_u256(le: [u8; 32], buf: &mut [u8; 80]) -> usize {
    let mut limbs = [0u64; 4];
    for (k, l) in limbs.iter_mut().enumerate() {
        *l = u64::from_le_bytes(le[k * 8..k * 8 + 8].try_into().expect("8 bytes"));
    }
    let mut n = 0;
    loop {
        let mut rem = 0u128;
        for l in limbs.iter_mut().rev() {
            let cur = (rem << 64) | *l as u128;
            *l = (cur / 10) as u64;
            rem = cur % 10;
        }
        n += 1;
        buf[80 - n] = b'0' + rem as u8;
        if limbs == [0; 4] {
            return n;
        }
    }
}

/// A decimal of `digits` (the magnitude's, unscaled) and `scale` as a string field: `-`, the
/// integer part (`0` when none), and the fraction without trailing zeros.
fn decimal_field(tag: u32, neg: bool, digits: &[u8], scale: u32, out: &mut Vec<u8>) {
    let scale = scale as usize;
    let (int, frac): (&[u8], &[u8]) = if digits.len() > scale {
        digits.split_at(digits.len() - scale)
    } else {
        (b"0", digits)
    };
    let pad = scale - frac.len();
    let trimmed = frac.len() - frac.iter().rev().take_while(|d| **d == b'0').count();
    let frac = &frac[..trimmed];
    // The fraction's leading zeros (a magnitude shorter than the scale), unless it is all zeros.
    let pad = if frac.is_empty() { 0 } else { pad };
    // -0 (not made by the row builder) is written as 0.
    let neg = neg && (int != b"0" || !frac.is_empty());
    let len = neg as usize
        + int.len()
        + if frac.is_empty() {
            0
        } else {
            1 + pad + frac.len()
        };
    key(tag, WIRE_LEN, out);
    varint(len as u64, out);
    if neg {
        out.push(b'-');
    }
    out.extend_from_slice(int);
    if !frac.is_empty() {
        out.push(b'.');
        out.extend(std::iter::repeat_n(b'0', pad));
        out.extend_from_slice(frac);
    }
}

fn two(v: i64, b: &mut [u8]) {
    b[0] = b'0' + (v / 10) as u8;
    b[1] = b'0' + (v % 10) as u8;
}

/// `HH:MM:SS[.ffffff]` of `micros` since midnight, into `b`; its length.
fn time_text(micros: i64, b: &mut [u8]) -> usize {
    let secs = micros / 1_000_000;
    two(secs / 3600, &mut b[0..]);
    b[2] = b':';
    two(secs / 60 % 60, &mut b[3..]);
    b[5] = b':';
    two(secs % 60, &mut b[6..]);
    let frac = micros % 1_000_000;
    if frac == 0 {
        return 8;
    }
    b[8] = b'.';
    let mut f = frac;
    for k in (9..15).rev() {
        b[k] = b'0' + (f % 10) as u8;
        f /= 10;
    }
    15
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]` of `micros` since 1970-01-01 00:00:00, into `b`; its length.
fn datetime_text(micros: i64, b: &mut [u8]) -> usize {
    let days = micros.div_euclid(DAY_MICROS);
    let (y, m, d) = civil(days);
    let mut y4 = y.rem_euclid(10000);
    for k in (0..4).rev() {
        b[k] = b'0' + (y4 % 10) as u8;
        y4 /= 10;
    }
    b[4] = b'-';
    two(m, &mut b[5..]);
    b[7] = b'-';
    two(d, &mut b[8..]);
    b[10] = b' ';
    11 + time_text(micros.rem_euclid(DAY_MICROS), &mut b[11..])
}

/// (year, month, day) of `days` since 1970-01-01 (proleptic Gregorian; Howard Hinnant's
/// `civil_from_days`).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(neg: bool, digits: &str, scale: u32) -> String {
        let mut out = Vec::new();
        decimal_field(1, neg, digits.as_bytes(), scale, &mut out);
        assert_eq!(out[1] as usize, out.len() - 2, "length prefix of {digits}");
        String::from_utf8(out[2..].to_vec()).unwrap()
    }

    #[test]
    fn decimals_are_exact_text() {
        assert_eq!(dec(false, "123456000000", 9), "123.456");
        assert_eq!(dec(true, "1500000000", 9), "-1.5");
        assert_eq!(dec(false, "42000000000", 9), "42");
        assert_eq!(dec(false, "0", 9), "0");
        assert_eq!(dec(false, "5", 9), "0.000000005");
        assert_eq!(dec(true, "120", 9), "-0.00000012");
        let mut b = [0u8; 80];
        let n = digits_u128(u128::MAX, &mut b);
        assert_eq!(&b[80 - n..], u128::MAX.to_string().as_bytes());
        let big = arrow_buffer::i256::from_i128(i128::MAX)
            .wrapping_mul(arrow_buffer::i256::from_i128(1_000_000_007));
        let n = digits_u256(big.to_le_bytes(), &mut b);
        assert_eq!(std::str::from_utf8(&b[80 - n..]).unwrap(), big.to_string());
    }

    #[test]
    fn times_and_datetimes() {
        let mut b = [0u8; 40];
        let n = time_text(45_296_789_000, &mut b);
        assert_eq!(&b[..n], b"12:34:56.789000");
        let n = time_text(0, &mut b);
        assert_eq!(&b[..n], b"00:00:00");
        let n = datetime_text(1_704_164_645_123_456, &mut b);
        assert_eq!(&b[..n], b"2024-01-02 03:04:05.123456");
        let n = datetime_text(-62_135_596_800_000_000, &mut b);
        assert_eq!(&b[..n], b"0001-01-01 00:00:00");
        let n = datetime_text(253_402_300_799_999_999, &mut b);
        assert_eq!(&b[..n], b"9999-12-31 23:59:59.999999");
        assert_eq!(civil(19_782), (2024, 2, 29));
    }

    #[test]
    fn a_batch_of_bignumeric_lists_and_records() {
        use arrow_array::builder::{Int64Builder, ListBuilder};
        use std::sync::Arc;
        let big = arrow_array::Decimal256Array::from(vec![
            Some(
                arrow_buffer::i256::from_i128(-15)
                    * arrow_buffer::i256::from_i128(10).wrapping_pow(37),
            ),
            None,
        ])
        .with_precision_and_scale(76, 38)
        .unwrap();
        let mut list = ListBuilder::new(Int64Builder::new());
        list.values().append_value(-1);
        list.values().append_value(300);
        list.append(true);
        list.append(true);
        let x = Arc::new(arrow_array::Int64Array::from(vec![Some(5), None])) as ArrayRef;
        let rec = arrow_array::StructArray::from(vec![(
            Arc::new(Field::new("x", DataType::Int64, true)),
            x,
        )]);
        let batch = RecordBatch::try_from_iter([
            ("n", Arc::new(big) as ArrayRef),
            ("r", Arc::new(list.finish()) as ArrayRef),
            ("rec", Arc::new(rec) as ArrayRef),
        ])
        .unwrap();
        let d = descriptor(&batch.schema()).unwrap();
        assert_eq!(d.field[1].label, Some(Label::Repeated as i32));
        assert_eq!(d.field[2].type_name.as_deref(), Some("__ROOT__1"));
        assert_eq!(d.nested_type[0].name.as_deref(), Some("__ROOT__1"));
        let (rows, size) = encode_rows(&batch).unwrap();
        let mut want0 = vec![0x0A, 4];
        want0.extend_from_slice(b"-1.5");
        // -1 as a ten-byte varint, 300 as two bytes; the record's x = 5.
        want0.extend_from_slice(&[
            0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01,
        ]);
        want0.extend_from_slice(&[0x10, 0xAC, 0x02, 0x1A, 2, 0x08, 5]);
        assert_eq!(&rows[0][..], &want0[..]);
        // NULL decimal absent, empty list absent, a record of NULLs is an empty message.
        assert_eq!(&rows[1][..], &[0x1A, 0]);
        assert_eq!(size, want0.len() + 2);
    }

    #[test]
    fn nested_lengths_are_prefixed() {
        let mut out = vec![7];
        let start = out.len();
        out.extend(std::iter::repeat_n(1u8, 200));
        prefix_length(start, &mut out);
        assert_eq!(&out[..3], &[7, 0xC8, 0x01]);
        assert_eq!(out.len(), 203);
    }

    #[test]
    fn a_change_row_without_a_change_type_is_not_sent() {
        use arrow_array::StringArray;
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("_CHANGE_TYPE", DataType::Utf8, true),
        ]));
        let batch = |ct: Vec<Option<&str>>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(arrow_array::Int64Array::from(vec![1; ct.len()])),
                    Arc::new(StringArray::from(ct)),
                ],
            )
            .unwrap()
        };
        check_change_types(&batch(vec![Some("UPSERT"), Some("DELETE")])).unwrap();
        let e = check_change_types(&batch(vec![Some("UPSERT"), None])).unwrap_err();
        assert!(e.contains("row 1 has no `_CHANGE_TYPE`"), "{e}");
    }
}
