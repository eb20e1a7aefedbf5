//! Values as JSON (see the [module docs](super)): bytes, timestamps, dates, times, decimals, Avro
//! values with their schema, Arrow cells and rows.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

/// Bytes as text when valid UTF-8, else `{"base64": …}`.
pub fn bytes_json(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => json!({"base64": base64::engine::general_purpose::STANDARD.encode(b)}),
    }
}

fn micros_rfc3339(us: i64) -> Value {
    match DateTime::<Utc>::from_timestamp_micros(us) {
        Some(t) => json!(t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        None => json!(us),
    }
}

/// A zone-less timestamp: wall-clock time, no `Z`.
fn naive_micros_json(us: i64) -> Value {
    match DateTime::<Utc>::from_timestamp_micros(us) {
        Some(t) => json!(t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.6f").to_string()),
        None => json!(us),
    }
}

fn date_json(days: i32) -> Value {
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("valid date");
    match epoch.checked_add_signed(chrono::Duration::days(days.into())) {
        Some(d) => json!(d.format("%Y-%m-%d").to_string()),
        None => json!(days),
    }
}

fn time_micros_json(us: i64) -> Value {
    let secs = us.div_euclid(1_000_000);
    let frac = us.rem_euclid(1_000_000);
    json!(format!(
        "{:02}:{:02}:{:02}.{frac:06}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    ))
}

fn float_json(f: f64) -> Value {
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or_else(|| json!(f.to_string()))
}

/// [`avro_json`] with the writer schema at hand, for what the value alone cannot say: a decimal's
/// scale (decimals become exact decimal text).
pub(super) fn avro_json_with(
    v: &apache_avro::types::Value,
    schema: &apache_avro::Schema,
    names: &apache_avro::schema::NamesRef<'_>,
) -> Value {
    use apache_avro::types::Value as A;
    use apache_avro::Schema as S;
    match (v, schema) {
        (_, S::Ref { name }) => match names.get(name) {
            Some(s) => avro_json_with(v, s, names),
            None => avro_json(v),
        },
        (A::Decimal(d), S::Decimal(ds)) => match Vec::<u8>::try_from(d) {
            Ok(bytes) if bytes.len() <= 16 => {
                // Big-endian two's complement, sign-extended to 128 bits.
                let fill = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
                    0xff
                } else {
                    0
                };
                let mut buf = [fill; 16];
                buf[16 - bytes.len()..].copy_from_slice(&bytes);
                json!(decimal_text(
                    i128::from_be_bytes(buf),
                    ds.scale.min(127) as i8
                ))
            }
            Ok(bytes) => bytes_json(&bytes),
            Err(_) => avro_json(v),
        },
        (A::Record(fields), S::Record(rs)) => Value::Object(
            fields
                .iter()
                .map(|(k, fv)| {
                    let j = match rs.lookup.get(k).and_then(|&i| rs.fields.get(i)) {
                        Some(f) => avro_json_with(fv, &f.schema, names),
                        None => avro_json(fv),
                    };
                    (k.clone(), j)
                })
                .collect(),
        ),
        (A::Union(i, inner), S::Union(us)) => match us.variants().get(*i as usize) {
            Some(s) => avro_json_with(inner, s, names),
            None => avro_json(inner),
        },
        (A::Array(items), S::Array(a)) => Value::Array(
            items
                .iter()
                .map(|x| avro_json_with(x, &a.items, names))
                .collect(),
        ),
        (A::Map(m), S::Map(ms)) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), avro_json_with(x, &ms.types, names)))
                .collect(),
        ),
        _ => avro_json(v),
    }
}

fn avro_json(v: &apache_avro::types::Value) -> Value {
    use apache_avro::types::Value as A;
    match v {
        A::Null => Value::Null,
        A::Boolean(b) => json!(b),
        A::Int(i) => json!(i),
        A::Long(i) => json!(i),
        A::Float(f) => float_json(f64::from(*f)),
        A::Double(f) => float_json(*f),
        A::Bytes(b) | A::Fixed(_, b) => bytes_json(b),
        A::String(s) | A::Enum(_, s) => json!(s),
        A::Union(_, inner) => avro_json(inner),
        A::Array(items) => Value::Array(items.iter().map(avro_json).collect()),
        A::Map(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), avro_json(v))).collect()),
        A::Record(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), avro_json(v)))
                .collect(),
        ),
        A::Date(d) => date_json(*d),
        A::TimeMillis(ms) => time_micros_json(i64::from(*ms) * 1000),
        A::TimeMicros(us) => time_micros_json(*us),
        A::TimestampMillis(ms) => micros_rfc3339(ms.saturating_mul(1000)),
        A::TimestampMicros(us) => micros_rfc3339(*us),
        A::TimestampNanos(ns) => micros_rfc3339(ns.div_euclid(1000)),
        A::BigDecimal(d) => json!(d.to_string()),
        A::Uuid(u) => json!(u.to_string()),
        A::LocalTimestampMillis(ms) => naive_micros_json(ms.saturating_mul(1000)),
        A::LocalTimestampMicros(us) => naive_micros_json(*us),
        A::LocalTimestampNanos(ns) => naive_micros_json(ns.div_euclid(1000)),
        // Durations (and decimals outside a schema walk): their debug form.
        other => json!(format!("{other:?}")),
    }
}

/// Every row of `batch` as a JSON object, columns in schema order.
pub fn batch_rows(batch: &RecordBatch) -> Vec<Value> {
    let schema = batch.schema();
    (0..batch.num_rows())
        .map(|row| {
            Value::Object(
                schema
                    .fields()
                    .iter()
                    .zip(batch.columns())
                    .map(|(f, col)| (f.name().clone(), cell(col.as_ref(), row)))
                    .collect(),
            )
        })
        .collect()
}

fn decimal_text(unscaled: i128, scale: i8) -> String {
    if scale <= 0 {
        return (unscaled * 10i128.pow(u32::from(scale.unsigned_abs()))).to_string();
    }
    let neg = unscaled < 0;
    let digits = unscaled.unsigned_abs().to_string();
    let s = scale as usize;
    let padded = format!("{digits:0>width$}", width = s + 1);
    let (whole, frac) = padded.split_at(padded.len() - s);
    format!("{}{whole}.{frac}", if neg { "-" } else { "" })
}

/// One cell as JSON (see the module docs for the forms).
fn cell(col: &dyn Array, row: usize) -> Value {
    if col.is_null(row) {
        return Value::Null;
    }
    match col.data_type() {
        DataType::Null => Value::Null,
        DataType::Boolean => json!(col.as_boolean().value(row)),
        DataType::Int8 => json!(col.as_primitive::<Int8Type>().value(row)),
        DataType::Int16 => json!(col.as_primitive::<Int16Type>().value(row)),
        DataType::Int32 => json!(col.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => json!(col.as_primitive::<Int64Type>().value(row)),
        DataType::UInt8 => json!(col.as_primitive::<UInt8Type>().value(row)),
        DataType::UInt16 => json!(col.as_primitive::<UInt16Type>().value(row)),
        DataType::UInt32 => json!(col.as_primitive::<UInt32Type>().value(row)),
        DataType::UInt64 => json!(col.as_primitive::<UInt64Type>().value(row)),
        DataType::Float32 => float_json(f64::from(col.as_primitive::<Float32Type>().value(row))),
        DataType::Float64 => float_json(col.as_primitive::<Float64Type>().value(row)),
        DataType::Utf8 => json!(col.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => json!(col.as_string::<i64>().value(row)),
        DataType::Utf8View => json!(col.as_string_view().value(row)),
        DataType::Binary => bytes_json(col.as_binary::<i32>().value(row)),
        DataType::LargeBinary => bytes_json(col.as_binary::<i64>().value(row)),
        DataType::BinaryView => bytes_json(col.as_binary_view().value(row)),
        DataType::FixedSizeBinary(_) => bytes_json(col.as_fixed_size_binary().value(row)),
        DataType::Date32 => date_json(col.as_primitive::<Date32Type>().value(row)),
        DataType::Timestamp(unit, tz) => {
            let v = match unit {
                TimeUnit::Second => col
                    .as_primitive::<TimestampSecondType>()
                    .value(row)
                    .saturating_mul(1_000_000),
                TimeUnit::Millisecond => col
                    .as_primitive::<TimestampMillisecondType>()
                    .value(row)
                    .saturating_mul(1000),
                TimeUnit::Microsecond => col.as_primitive::<TimestampMicrosecondType>().value(row),
                TimeUnit::Nanosecond => col
                    .as_primitive::<TimestampNanosecondType>()
                    .value(row)
                    .div_euclid(1000),
            };
            match tz {
                Some(_) => micros_rfc3339(v),
                // No zone (Delta's timestamp_ntz, BigQuery's DATETIME): a wall-clock time.
                None => naive_micros_json(v),
            }
        }
        DataType::Decimal128(_, scale) => json!(decimal_text(
            col.as_primitive::<Decimal128Type>().value(row),
            *scale
        )),
        DataType::List(_) => {
            let l = col.as_list::<i32>().value(row);
            Value::Array((0..l.len()).map(|i| cell(l.as_ref(), i)).collect())
        }
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>().value(row);
            Value::Array((0..l.len()).map(|i| cell(l.as_ref(), i)).collect())
        }
        DataType::Struct(fields) => {
            let s = col.as_struct();
            Value::Object(
                fields
                    .iter()
                    .zip(s.columns())
                    .map(|(f, c)| (f.name().clone(), cell(c.as_ref(), row)))
                    .collect(),
            )
        }
        DataType::Map(_, _) => {
            let m = col.as_map();
            let entries = m.value(row);
            let (keys, values) = (entries.column(0), entries.column(1));
            Value::Object(
                (0..entries.len())
                    .map(|i| {
                        let k = match cell(keys.as_ref(), i) {
                            Value::String(s) => s,
                            other => other.to_string(),
                        };
                        (k, cell(values.as_ref(), i))
                    })
                    .collect(),
            )
        }
        _ => {
            let fmt = arrow_cast::display::ArrayFormatter::try_new(
                col,
                &arrow_cast::display::FormatOptions::default(),
            );
            match fmt {
                Ok(f) => json!(f.value(row).to_string()),
                Err(e) => json!(format!("<{e}>")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_text_when_they_can_be() {
        assert_eq!(bytes_json(b"hello"), json!("hello"));
        assert_eq!(bytes_json(&[0xff, 0x00]), json!({"base64": "/wA="}));
    }

    #[test]
    fn decimals_keep_every_digit() {
        assert_eq!(decimal_text(123_456_000_000, 9), "123.456000000");
        assert_eq!(decimal_text(-5, 9), "-0.000000005");
        assert_eq!(decimal_text(7, 0), "7");
        assert_eq!(decimal_text(7, -2), "700");
    }

    #[test]
    fn avro_decimals_use_their_schema_scale() {
        use apache_avro::types::Value as A;
        let schema = apache_avro::Schema::parse_str(
            r#"{"type": "record", "name": "R", "fields": [
                {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
                {"name": "opt", "type": ["null", {"type": "fixed", "name": "F", "size": 4, "logicalType": "decimal", "precision": 8, "scale": 3}]},
                {"name": "again", "type": ["null", "F"]}
            ]}"#,
        )
        .unwrap();
        let resolved = apache_avro::schema::ResolvedSchema::try_from(&schema).unwrap();
        let v = A::Record(vec![
            (
                "price".into(),
                A::Decimal(apache_avro::Decimal::from(vec![0xfb, 0x2e])),
            ), // -1234
            (
                "opt".into(),
                A::Union(
                    1,
                    Box::new(A::Decimal(apache_avro::Decimal::from(vec![
                        0, 0, 0x30, 0x39,
                    ]))),
                ),
            ), // 12345
            (
                "again".into(),
                A::Union(
                    1,
                    Box::new(A::Decimal(apache_avro::Decimal::from(vec![0, 0, 0, 5]))),
                ),
            ),
        ]);
        assert_eq!(
            avro_json_with(&v, &schema, resolved.get_names()),
            json!({"price": "-12.34", "opt": "12.345", "again": "0.005"})
        );
    }

    #[test]
    fn times_render_like_rfc3339() {
        assert_eq!(
            micros_rfc3339(1_695_615_000_123_456),
            json!("2023-09-25T04:10:00.123456Z")
        );
        assert_eq!(date_json(19_625), json!("2023-09-25"));
        assert_eq!(time_micros_json(3_723_000_004), json!("01:02:03.000004"));
    }
}
