//! Record batches in the Delta form: Arrow → Delta types (decisions where Delta has no equivalent of a BigQuery type):
//!
//! | Arrow (from [`super::schema`]) | Delta |
//! |---|---|
//! | `Utf8`, `Binary`, `Int64`, `Float64`, `Boolean`, `Date32` | `string`, `binary`, `long`, `double`, `boolean`, `date` |
//! | `Decimal128(38, 9)` (NUMERIC) | `decimal(38,9)` |
//! | `Decimal256(76, 38)` (BIGNUMERIC) | `string`: the exact decimal text with all 38 fraction digits, `-1.50000000000000000000000000000000000000`, over BigQuery's whole range ±5.789…×10^38 (Delta decimals stop at precision 38, and a BIGNUMERIC needs up to 77 digits) |
//! | `Time64(µs)` (TIME) | `string` `HH:MM:SS`, `HH:MM:SS.fff` or `HH:MM:SS.ffffff` (Arrow's cast; Delta has no time-of-day type) |
//! | `Timestamp(µs, UTC)` (TIMESTAMP) | `timestamp` |
//! | `Timestamp(µs)` (DATETIME) | `timestamp_ntz` (reader 3 / writer 7, feature `timestampNtz`) |
//! | `Utf8` + `arrow.json` extension (JSON) | `string` (the extension metadata is dropped) |
//! | `Struct` / `List` | `struct` / `array` |

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Fields, Schema, SchemaRef, TimeUnit};

use super::error::DeltaError;

/// The Arrow schema of the Parquet files of a Delta table holding rows of `schema` (see the module
/// table): BIGNUMERIC and TIME become strings, JSON extension metadata is dropped.
pub fn delta_arrow_schema(schema: &Schema) -> Result<SchemaRef, DeltaError> {
    let fields = schema
        .fields()
        .iter()
        .map(|f| delta_field(f, &f.name().to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

fn delta_field(f: &Field, path: &str) -> Result<Field, DeltaError> {
    Ok(Field::new(
        f.name(),
        delta_type(f.data_type(), path)?,
        f.is_nullable(),
    ))
}

fn delta_type(ty: &DataType, path: &str) -> Result<DataType, DeltaError> {
    Ok(match ty {
        DataType::Utf8
        | DataType::Binary
        | DataType::Int64
        | DataType::Float64
        | DataType::Boolean
        | DataType::Date32 => ty.clone(),
        DataType::Decimal128(p, s) if *p <= 38 => DataType::Decimal128(*p, *s),
        DataType::Decimal256(..) | DataType::Time64(TimeUnit::Microsecond) => DataType::Utf8,
        DataType::Timestamp(TimeUnit::Microsecond, None) => ty.clone(),
        DataType::Timestamp(TimeUnit::Microsecond, Some(tz)) if tz.as_ref() == "UTC" => ty.clone(),
        DataType::Struct(fields) => DataType::Struct(Fields::from(
            fields
                .iter()
                .map(|f| delta_field(f, &format!("{path}.{}", f.name())))
                .collect::<Result<Vec<_>, _>>()?,
        )),
        DataType::List(item) => DataType::List(FieldRef::new(delta_field(item, path)?)),
        other => {
            return Err(DeltaError::Schema {
                column: path.to_string(),
                reason: format!("Arrow type {other} has no Delta equivalent"),
            })
        }
    })
}

/// Cast a batch of the mapping core's schema to `delta_schema` (from [`delta_arrow_schema`]).
pub fn to_delta_batch(
    batch: &RecordBatch,
    delta_schema: &SchemaRef,
) -> Result<RecordBatch, DeltaError> {
    let columns = batch
        .columns()
        .iter()
        .zip(delta_schema.fields().iter())
        .map(|(col, f)| to_delta_array(col, f.data_type()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(delta_schema.clone(), columns)?)
}

/// One column in its Delta type, RECORD fields and REPEATED items included.
///
/// * BIGNUMERIC as text by hand: arrow's decimal formatting keeps at most the type's 76 digits,
///   and BigQuery's range needs 77 at its bounds (±5.789…×10^38).
/// * TIME as text by hand: arrow's cast formats every value through chrono's `Debug` (3% of a
///   run's CPU); the same text, checked against it in a test.
/// * Everything else through arrow's cast.
fn to_delta_array(col: &ArrayRef, to: &DataType) -> Result<ArrayRef, ArrowError> {
    use arrow_array::{Array, ListArray, StructArray};
    if col.data_type() == to {
        return Ok(col.clone());
    }
    let any = col.as_any();
    match to {
        DataType::Utf8 => {
            if let Some(d) = any.downcast_ref::<arrow_array::Decimal256Array>() {
                return Ok(Arc::new(bignumeric_text(d)));
            }
            if let Some(t) = any.downcast_ref::<arrow_array::Time64MicrosecondArray>() {
                if let Some(text) = time_text(t) {
                    return Ok(Arc::new(text));
                }
            }
        }
        DataType::Struct(fields) => {
            if let Some(st) = any.downcast_ref::<StructArray>() {
                let children = st
                    .columns()
                    .iter()
                    .zip(fields.iter())
                    .map(|(c, f)| to_delta_array(c, f.data_type()))
                    .collect::<Result<Vec<_>, _>>()?;
                return Ok(Arc::new(StructArray::try_new(
                    fields.clone(),
                    children,
                    st.nulls().cloned(),
                )?));
            }
        }
        DataType::List(item) => {
            if let Some(l) = any.downcast_ref::<ListArray>() {
                let values = to_delta_array(l.values(), item.data_type())?;
                return Ok(Arc::new(ListArray::try_new(
                    item.clone(),
                    l.offsets().clone(),
                    values,
                    l.nulls().cloned(),
                )?));
            }
        }
        _ => {}
    }
    arrow_cast::cast(col, to)
}

/// BIGNUMERIC (unscaled at scale 38) as its exact decimal text with all 38 fraction digits,
/// `-1.50000000000000000000000000000000000000`, for any 256-bit value.
fn bignumeric_text(a: &arrow_array::Decimal256Array) -> arrow_array::StringArray {
    use arrow_array::Array;
    use std::fmt::Write as _;
    let scale = match a.data_type() {
        DataType::Decimal256(_, s) => (*s).max(0) as usize,
        _ => 38,
    };
    let mut out = arrow_array::builder::StringBuilder::with_capacity(a.len(), a.len() * 41);
    let mut digits = String::with_capacity(80);
    let mut text = String::with_capacity(82);
    for i in 0..a.len() {
        if a.is_null(i) {
            out.append_null();
            continue;
        }
        digits.clear();
        let _ = write!(digits, "{}", a.value(i));
        let (sign, abs) = match digits.strip_prefix('-') {
            Some(d) => ("-", d),
            None => ("", digits.as_str()),
        };
        text.clear();
        text.push_str(sign);
        if abs.len() <= scale {
            text.push('0');
            if scale > 0 {
                text.push('.');
                text.extend(std::iter::repeat_n('0', scale - abs.len()));
                text.push_str(abs);
            }
        } else {
            let (int, frac) = abs.split_at(abs.len() - scale);
            text.push_str(int);
            if scale > 0 {
                text.push('.');
                text.push_str(frac);
            }
        }
        out.append_value(&text);
    }
    out.finish()
}

/// TIME (µs since midnight) as the text arrow's cast gives it (chrono's `NaiveTime` form):
/// `HH:MM:SS`, then `.mmm` when the value has whole milliseconds, else `.uuuuuu`. `None` when a
/// value is not a time of day (the cast then decides).
fn time_text(a: &arrow_array::Time64MicrosecondArray) -> Option<arrow_array::StringArray> {
    use arrow_array::Array;
    const DAY: i64 = 86_400_000_000;
    let mut out = arrow_array::builder::StringBuilder::with_capacity(a.len(), a.len() * 15);
    let mut buf = [0u8; 15];
    let digits = |buf: &mut [u8], mut v: i64| {
        for b in buf.iter_mut().rev() {
            *b = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    for i in 0..a.len() {
        if a.is_null(i) {
            out.append_null();
            continue;
        }
        let v = a.value(i);
        if !(0..DAY).contains(&v) {
            return None;
        }
        let (secs, micros) = (v / 1_000_000, v % 1_000_000);
        digits(&mut buf[0..2], secs / 3600);
        buf[2] = b':';
        digits(&mut buf[3..5], secs / 60 % 60);
        buf[5] = b':';
        digits(&mut buf[6..8], secs % 60);
        let len = if micros == 0 {
            8
        } else if micros % 1000 == 0 {
            buf[8] = b'.';
            digits(&mut buf[9..12], micros / 1000);
            12
        } else {
            buf[8] = b'.';
            digits(&mut buf[9..15], micros);
            15
        };
        // ASCII digits and separators only.
        out.append_value(std::str::from_utf8(&buf[..len]).expect("ASCII"));
    }
    Some(out.finish())
}

#[cfg(test)]
mod tests {
    use arrow_array::{
        Array, Decimal256Array, Int64Array, ListArray, StringArray, StructArray,
        Time64MicrosecondArray,
    };
    use std::collections::HashMap;

    use arrow_buffer::i256;

    use super::*;

    use proptest::prelude::*;

    proptest::proptest! {
        /// TIME as text by hand is exactly arrow's cast, nulls included; a value that is not a
        /// time of day is left to the cast.
        #[test]
        fn time_text_is_arrows_cast(
            values in proptest::collection::vec(proptest::option::of(proptest::prop_oneof![
                0i64..86_400_000_000,
                (0i64..86_400).prop_map(|s| s * 1_000_000),
                (0i64..86_400_000).prop_map(|ms| ms * 1000),
                proptest::prelude::Just(86_399_999_999i64),
            ]), 0..50),
        ) {
            let a = arrow_array::Time64MicrosecondArray::from(values);
            let ours = time_text(&a).unwrap();
            let theirs = arrow_cast::cast(&a, &DataType::Utf8).unwrap();
            prop_assert_eq!(&ours as &dyn arrow_array::Array, theirs.as_ref());
        }

        /// BIGNUMERIC text by hand is arrow's cast wherever the cast is exact (76 digits or
        /// fewer), nulls included.
        #[test]
        fn bignumeric_text_is_arrows_cast_within_76_digits(
            values in proptest::collection::vec(proptest::option::of(
                (proptest::prelude::any::<[u8; 32]>(), 0u32..77).prop_map(|(le, digits)| {
                    let v = i256::from_le_bytes(le);
                    let m = i256::from_i128(10).wrapping_pow(digits);
                    if digits == 0 { i256::ZERO } else { v.wrapping_rem(m) }
                })
            ), 0..30),
        ) {
            let a = arrow_array::Decimal256Array::from(values)
                .with_precision_and_scale(76, 38)
                .unwrap();
            let ours = bignumeric_text(&a);
            let theirs = arrow_cast::cast(&a, &DataType::Utf8).unwrap();
            prop_assert_eq!(&ours as &dyn arrow_array::Array, theirs.as_ref());
        }
    }

    #[test]
    fn time_text_leaves_other_values_to_the_cast() {
        for v in [-1, 86_400_000_000] {
            let a = arrow_array::Time64MicrosecondArray::from(vec![v]);
            assert!(time_text(&a).is_none());
        }
    }

    fn mapped(ty: DataType) -> Result<DataType, DeltaError> {
        delta_arrow_schema(&Schema::new(vec![Field::new("c", ty, true)]))
            .map(|s| s.field(0).data_type().clone())
    }

    #[test]
    fn arrow_types_map_to_delta_types() {
        let same = [
            DataType::Utf8,
            DataType::Binary,
            DataType::Int64,
            DataType::Float64,
            DataType::Boolean,
            DataType::Date32,
            DataType::Decimal128(38, 9),
            DataType::Timestamp(TimeUnit::Microsecond, None),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        ];
        for ty in same {
            assert_eq!(mapped(ty.clone()).unwrap(), ty);
        }
        assert_eq!(
            mapped(DataType::Decimal256(76, 38)).unwrap(),
            DataType::Utf8
        );
        assert_eq!(
            mapped(DataType::Time64(TimeUnit::Microsecond)).unwrap(),
            DataType::Utf8
        );
        // Nested: TIME inside a list of structs becomes a string there too.
        let inner = Fields::from(vec![Field::new(
            "t",
            DataType::Time64(TimeUnit::Microsecond),
            true,
        )]);
        let list = DataType::List(Arc::new(Field::new(
            "element",
            DataType::Struct(inner),
            false,
        )));
        let want = DataType::List(Arc::new(Field::new(
            "element",
            DataType::Struct(Fields::from(vec![Field::new("t", DataType::Utf8, true)])),
            false,
        )));
        assert_eq!(mapped(list).unwrap(), want);
        // JSON's extension metadata is dropped.
        let json = Field::new("j", DataType::Utf8, true).with_metadata(HashMap::from([(
            "ARROW:extension:name".to_string(),
            "arrow.json".to_string(),
        )]));
        let s = delta_arrow_schema(&Schema::new(vec![json])).unwrap();
        assert!(s.field(0).metadata().is_empty());
        // Types the mapping core never produces are refused with the column's path.
        let err = mapped(DataType::Struct(Fields::from(vec![Field::new(
            "u",
            DataType::UInt8,
            true,
        )])))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Delta table: column `c.u`: Arrow type UInt8 has no Delta equivalent"
        );
        assert!(mapped(DataType::Timestamp(TimeUnit::Millisecond, None)).is_err());
    }

    #[test]
    fn bignumeric_text_is_exact_over_bigquerys_whole_range() {
        // The in-memory column is arrow's 256-bit decimal at scale 38, whose unscaled i256 holds
        // BIGNUMERIC's whole range; arrow labels it precision 76 but never checks values against
        // it. Delta gets every digit, at the top level, in a RECORD and in a REPEATED column.
        let ty = DataType::Decimal256(76, 38);
        let ten = i256::from_i128(10);
        let bn: ArrayRef = Arc::new(
            Decimal256Array::from(vec![
                i256::MAX,
                i256::MIN,
                ten.wrapping_pow(76),
                -ten.wrapping_pow(76) + i256::ONE,
                i256::ONE,
            ])
            .with_precision_and_scale(76, 38)
            .unwrap(),
        );
        let record: ArrayRef = Arc::new(StructArray::from(vec![(
            Arc::new(Field::new("x", ty.clone(), true)),
            bn.clone(),
        )]));
        // Row i holds the list [bn[i]].
        let list: ArrayRef = Arc::new(
            ListArray::try_new(
                Arc::new(Field::new("element", ty.clone(), false)),
                arrow_buffer::OffsetBuffer::from_lengths([1; 5]),
                bn.clone(),
                None,
            )
            .unwrap(),
        );
        let schema = Schema::new(vec![
            Field::new("bn", ty.clone(), true),
            Field::new("r", record.data_type().clone(), true),
            Field::new("l", list.data_type().clone(), true),
        ]);
        let delta = delta_arrow_schema(&schema).unwrap();
        let batch = RecordBatch::try_new(Arc::new(schema), vec![bn, record, list]).unwrap();
        let out = to_delta_batch(&batch, &delta).unwrap();
        let text = |a: &dyn Array| {
            let s = a.as_any().downcast_ref::<StringArray>().unwrap();
            (0..s.len())
                .map(|i| s.value(i).to_string())
                .collect::<Vec<_>>()
        };
        let want = [
            "578960446186580977117854925043439539266.34992332820282019728792003956564819967",
            "-578960446186580977117854925043439539266.34992332820282019728792003956564819968",
            "100000000000000000000000000000000000000.00000000000000000000000000000000000000",
            "-99999999999999999999999999999999999999.99999999999999999999999999999999999999",
            "0.00000000000000000000000000000000000001",
        ];
        assert_eq!(text(out.column(0)), want);
        let nested = out
            .column(1)
            .as_any()
            .downcast_ref::<StructArray>()
            .unwrap();
        assert_eq!(text(nested.column(0).as_ref()), want);
        let items = out.column(2).as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(text(items.values().as_ref()), want);
    }

    #[test]
    fn batches_are_cast_to_the_delta_form() {
        let time = DataType::Time64(TimeUnit::Microsecond);
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("t", time.clone(), true),
            Field::new("bn", DataType::Decimal256(76, 38), true),
            Field::new(
                "l",
                DataType::List(Arc::new(Field::new("element", time.clone(), false))),
                false,
            ),
        ]);
        let delta = delta_arrow_schema(&schema).unwrap();
        let times = Time64MicrosecondArray::from(vec![4 * 3_600_000_000 + 500_000, 1]);
        let list = ListArray::try_new(
            Arc::new(Field::new("element", time, false)),
            arrow_buffer::OffsetBuffer::from_lengths([2, 0]),
            Arc::new(times.clone()),
            None,
        )
        .unwrap();
        let bn = Decimal256Array::from(vec![
            Some(i256::from_i128(-15) * i256::from_i128(10i128.pow(37))),
            None,
        ])
        .with_precision_and_scale(76, 38)
        .unwrap();
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(times),
                Arc::new(bn),
                Arc::new(list),
            ],
        )
        .unwrap();
        let out = to_delta_batch(&batch, &delta).unwrap();
        let strings = |a: &dyn Array| {
            let s = a.as_any().downcast_ref::<StringArray>().unwrap();
            (0..s.len())
                .map(|i| s.is_valid(i).then(|| s.value(i).to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            strings(out.column(1)),
            vec![Some("04:00:00.500".into()), Some("00:00:00.000001".into())]
        );
        assert_eq!(
            strings(out.column(2)),
            vec![
                Some("-1.50000000000000000000000000000000000000".into()),
                None
            ]
        );
        let l = out.column(3).as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(
            strings(l.values().as_ref()),
            vec![Some("04:00:00.500".into()), Some("00:00:00.000001".into())]
        );
    }
}
