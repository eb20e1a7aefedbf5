//! Typed Arrow column builders for the row builder: one per output column, nested like the table
//! schema (a RECORD holds one builder per sub-field, a REPEATED column a builder of its elements).
//!
//! Values are appended as they are converted, straight into the buffers the Arrow arrays are made
//! of. A message that fails half-way is undone with [`Column::truncate`] back to the row count
//! before it, so a bad message still leaves the batch exactly as it was.

use std::sync::Arc;

use arrow_array::types::{
    Date32Type, Decimal128Type, Decimal256Type, Float64Type, Int64Type, Time64MicrosecondType,
    TimestampMicrosecondType,
};
use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, ListArray, PrimitiveArray, StringArray, StructArray,
};
use arrow_buffer::{
    i256, BooleanBufferBuilder, Buffer, NullBuffer, NullBufferBuilder, OffsetBuffer, ScalarBuffer,
};
use arrow_schema::{DataType, FieldRef, Fields};

use super::schema::{arrow_field, arrow_value_type, FieldMode, FieldType, TableField};

/// The builder of one column (or of the elements of a REPEATED column, or of a RECORD's
/// sub-field).
#[derive(Debug)]
pub(crate) struct Column {
    /// The Arrow type of the finished array.
    data_type: DataType,
    /// Entries so far (kept apart from `nulls`, whose `len` is not inlined: the fast path asks
    /// for every field).
    len: usize,
    /// One validity bit per entry.
    nulls: NullBufferBuilder,
    values: Values,
}

#[derive(Debug)]
enum Values {
    /// STRING and JSON (`utf8`) or BYTES: offsets (one more than entries) and bytes.
    Bytes {
        utf8: bool,
        offsets: Vec<i32>,
        data: Vec<u8>,
    },
    /// INT64, TIME (µs), TIMESTAMP and DATETIME (µs).
    I64(Vec<i64>),
    /// DATE (days).
    I32(Vec<i32>),
    F64(Vec<f64>),
    Bool(BooleanBufferBuilder),
    /// NUMERIC, unscaled (scale 9).
    I128(Vec<i128>),
    /// BIGNUMERIC, unscaled (scale 38).
    I256(Vec<i256>),
    /// RECORD: one builder per sub-field.
    Struct(Fields, Vec<Column>),
    /// REPEATED: offsets into the element builder.
    List {
        element: FieldRef,
        offsets: Vec<i32>,
        child: Box<Column>,
    },
}

/// An offset into a values buffer; Arrow's `Utf8`, `Binary` and `List` offsets are 32-bit.
fn offset(n: usize) -> i32 {
    i32::try_from(n).expect("a column of one batch holds less than 2 GiB (Arrow i32 offsets)")
}

impl Column {
    /// An empty builder for `f` (its mode included).
    pub(crate) fn new(f: &TableField) -> Column {
        if f.mode != FieldMode::Repeated {
            return Column::values_of(&f.ty);
        }
        let data_type = arrow_field(f).data_type().clone();
        let DataType::List(element) = &data_type else {
            unreachable!("REPEATED is a list")
        };
        Column {
            values: Values::List {
                element: element.clone(),
                offsets: vec![0],
                child: Box::new(Column::values_of(&f.ty)),
            },
            data_type,
            len: 0,
            nulls: NullBufferBuilder::new(0),
        }
    }

    /// A builder of single values of `ty` (no mode).
    fn values_of(ty: &FieldType) -> Column {
        let data_type = arrow_value_type(ty);
        let bytes = |utf8| Values::Bytes {
            utf8,
            offsets: vec![0],
            data: Vec::new(),
        };
        let values = match ty {
            FieldType::String | FieldType::Json => bytes(true),
            FieldType::Bytes => bytes(false),
            FieldType::Int64 | FieldType::Time | FieldType::Timestamp | FieldType::DateTime => {
                Values::I64(Vec::new())
            }
            FieldType::Date => Values::I32(Vec::new()),
            FieldType::Float64 => Values::F64(Vec::new()),
            FieldType::Bool => Values::Bool(BooleanBufferBuilder::new(0)),
            FieldType::Numeric => Values::I128(Vec::new()),
            FieldType::BigNumeric => Values::I256(Vec::new()),
            FieldType::Record(sub) => {
                let DataType::Struct(fields) = &data_type else {
                    unreachable!("RECORD is a struct")
                };
                Values::Struct(fields.clone(), sub.iter().map(Column::new).collect())
            }
        };
        Column {
            data_type,
            len: 0,
            nulls: NullBufferBuilder::new(0),
            values,
        }
    }

    /// Entries appended since the last [`Column::finish`].
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Drop every entry after the first `len` (which must not exceed [`Column::len`]), children
    /// included: undoes a message that failed half-way.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = len;
        self.nulls.truncate(len);
        match &mut self.values {
            Values::Bytes { offsets, data, .. } => {
                offsets.truncate(len + 1);
                data.truncate(offsets[len] as usize);
            }
            Values::I64(v) => v.truncate(len),
            Values::I32(v) => v.truncate(len),
            Values::F64(v) => v.truncate(len),
            Values::Bool(v) => v.truncate(len),
            Values::I128(v) => v.truncate(len),
            Values::I256(v) => v.truncate(len),
            Values::Struct(_, children) => children.iter_mut().for_each(|c| c.truncate(len)),
            Values::List { offsets, child, .. } => {
                offsets.truncate(len + 1);
                child.truncate(offsets[len] as usize);
            }
        }
    }

    /// Append a NULL entry. Under a RECORD every sub-field gets a NULL entry as well (a REPEATED
    /// one a NULL list: it is NULL because its parent is; Arrow masks it with the parent's bit).
    /// Count a non-NULL entry.
    #[inline]
    fn valid(&mut self) {
        self.len += 1;
        self.nulls.append_non_null();
    }

    #[inline]
    pub(crate) fn push_null(&mut self) {
        self.len += 1;
        self.nulls.append_null();
        match &mut self.values {
            Values::Bytes { offsets, data, .. } => offsets.push(offset(data.len())),
            Values::I64(v) => v.push(0),
            Values::I32(v) => v.push(0),
            Values::F64(v) => v.push(0.0),
            Values::Bool(v) => v.append(false),
            Values::I128(v) => v.push(0),
            Values::I256(v) => v.push(i256::ZERO),
            Values::Struct(_, children) => children.iter_mut().for_each(Column::push_null),
            Values::List { offsets, .. } => offsets.push(*offsets.last().expect("offsets")),
        }
    }

    /// Whether the last entry is NULL (there must be one).
    pub(crate) fn last_is_null(&self) -> bool {
        !self.nulls.is_valid(self.len - 1)
    }

    /// The last entry of a string/bytes column, or `None` when it is NULL (there must be one).
    pub(crate) fn last_bytes(&self) -> Option<&[u8]> {
        if self.last_is_null() {
            return None;
        }
        let Values::Bytes { offsets, data, .. } = &self.values else {
            unreachable!("not a string column")
        };
        let n = offsets.len();
        Some(&data[offsets[n - 2] as usize..offsets[n - 1] as usize])
    }

    /// Replace the last entry of a string/bytes column (there must be one) by `s`.
    pub(crate) fn replace_last_bytes(&mut self, s: &[u8]) {
        self.truncate(self.len - 1);
        self.push_bytes(s);
    }

    /// Append a string (STRING, JSON) or bytes (BYTES) value; the caller knows the column's type.
    #[inline]
    pub(crate) fn push_bytes(&mut self, s: &[u8]) {
        let Values::Bytes { offsets, data, .. } = &mut self.values else {
            unreachable!("not a string column")
        };
        data.extend_from_slice(s);
        offsets.push(offset(data.len()));
        self.valid();
    }

    /// The byte buffer of a string/bytes column, to append one value in pieces; finish the value
    /// with [`Column::close_bytes`]. Bytes written here without a `close_bytes` are dropped by the
    /// next [`Column::truncate`].
    #[inline]
    pub(crate) fn bytes_buffer(&mut self) -> &mut Vec<u8> {
        let Values::Bytes { data, .. } = &mut self.values else {
            unreachable!("not a string column")
        };
        data
    }

    /// End the value written into [`Column::bytes_buffer`].
    #[inline]
    pub(crate) fn close_bytes(&mut self) {
        let Values::Bytes { offsets, data, .. } = &mut self.values else {
            unreachable!("not a string column")
        };
        offsets.push(offset(data.len()));
        self.valid();
    }

    /// The bytes of the value being written into [`Column::bytes_buffer`] so far.
    pub(crate) fn open_bytes(&self) -> &[u8] {
        let Values::Bytes { offsets, data, .. } = &self.values else {
            unreachable!("not a string column")
        };
        &data[*offsets.last().expect("offsets") as usize..]
    }

    /// Append an INT64, TIME, TIMESTAMP or DATETIME value.
    #[inline]
    pub(crate) fn push_i64(&mut self, x: i64) {
        let Values::I64(v) = &mut self.values else {
            unreachable!("not a 64-bit integer column")
        };
        v.push(x);
        self.valid();
    }

    #[inline]
    pub(crate) fn push_date(&mut self, days: i32) {
        let Values::I32(v) = &mut self.values else {
            unreachable!("not a DATE column")
        };
        v.push(days);
        self.valid();
    }

    #[inline]
    pub(crate) fn push_f64(&mut self, x: f64) {
        let Values::F64(v) = &mut self.values else {
            unreachable!("not a FLOAT64 column")
        };
        v.push(x);
        self.valid();
    }

    #[inline]
    pub(crate) fn push_bool(&mut self, x: bool) {
        let Values::Bool(v) = &mut self.values else {
            unreachable!("not a BOOL column")
        };
        v.append(x);
        self.valid();
    }

    #[inline]
    pub(crate) fn push_numeric(&mut self, x: i128) {
        let Values::I128(v) = &mut self.values else {
            unreachable!("not a NUMERIC column")
        };
        v.push(x);
        self.valid();
    }

    #[inline]
    pub(crate) fn push_bignumeric(&mut self, x: i256) {
        let Values::I256(v) = &mut self.values else {
            unreachable!("not a BIGNUMERIC column")
        };
        v.push(x);
        self.valid();
    }

    /// The sub-field builders of a RECORD column, to append one record: fill every one of them
    /// with one entry, then call [`Column::close_struct`].
    #[inline]
    pub(crate) fn children(&mut self) -> &mut [Column] {
        let Values::Struct(_, children) = &mut self.values else {
            unreachable!("not a RECORD column")
        };
        children
    }

    /// End a (non-NULL) record whose sub-fields were appended through [`Column::children`].
    #[inline]
    pub(crate) fn close_struct(&mut self) {
        self.valid();
    }

    /// The element builder of a REPEATED column: append the elements of one list to it, then call
    /// [`Column::close_list`].
    #[inline]
    pub(crate) fn elements(&mut self) -> &mut Column {
        let Values::List { child, .. } = &mut self.values else {
            unreachable!("not a REPEATED column")
        };
        child
    }

    /// End a list whose elements were appended through [`Column::elements`] (none for an empty
    /// list).
    #[inline]
    pub(crate) fn close_list(&mut self) {
        let Values::List { offsets, child, .. } = &mut self.values else {
            unreachable!("not a REPEATED column")
        };
        offsets.push(offset(child.len()));
        self.valid();
    }

    /// The entries appended so far as an Arrow array; the builder starts empty again, with room
    /// for as many entries.
    pub(crate) fn finish(&mut self) -> ArrayRef {
        let len = std::mem::take(&mut self.len);
        let nulls = self.nulls.finish().filter(|n| n.null_count() > 0);
        self.nulls = NullBufferBuilder::new(len);
        fn take<T>(v: &mut Vec<T>) -> Vec<T> {
            let cap = v.len();
            std::mem::replace(v, Vec::with_capacity(cap))
        }
        fn prim<T: arrow_array::ArrowPrimitiveType>(
            v: Vec<T::Native>,
            nulls: Option<NullBuffer>,
            data_type: &DataType,
        ) -> ArrayRef {
            Arc::new(
                PrimitiveArray::<T>::new(ScalarBuffer::from(v), nulls)
                    .with_data_type(data_type.clone()),
            )
        }
        let dt = &self.data_type;
        match &mut self.values {
            Values::Bytes {
                utf8,
                offsets,
                data,
            } => {
                let mut next = Vec::with_capacity(offsets.len());
                next.push(0);
                let offsets = OffsetBuffer::new(std::mem::replace(offsets, next).into());
                let data = Buffer::from_vec(take(data));
                if *utf8 {
                    // Checking the text again here cost 1.5% of a table run. Every value of a
                    // STRING or JSON column is appended from a `&str` or, by the fast path, from
                    // string tokens it validated as UTF-8 (`fast::Parser`); tests (debug builds)
                    // keep checking it.
                    if cfg!(debug_assertions) {
                        Arc::new(StringArray::new(offsets, data, nulls))
                    } else {
                        // SAFETY: the offsets are monotonic and in bounds (each closes a value
                        // appended to `data`) and the values are valid UTF-8, as said above.
                        Arc::new(unsafe { StringArray::new_unchecked(offsets, data, nulls) })
                    }
                } else {
                    Arc::new(BinaryArray::new(offsets, data, nulls))
                }
            }
            Values::I64(v) => match dt {
                DataType::Int64 => prim::<Int64Type>(take(v), nulls, dt),
                DataType::Time64(_) => prim::<Time64MicrosecondType>(take(v), nulls, dt),
                _ => prim::<TimestampMicrosecondType>(take(v), nulls, dt),
            },
            Values::I32(v) => prim::<Date32Type>(take(v), nulls, dt),
            Values::F64(v) => prim::<Float64Type>(take(v), nulls, dt),
            Values::Bool(v) => Arc::new(BooleanArray::new(v.finish(), nulls)),
            Values::I128(v) => prim::<Decimal128Type>(take(v), nulls, dt),
            Values::I256(v) => prim::<Decimal256Type>(take(v), nulls, dt),
            Values::Struct(fields, children) => {
                let arrays = children.iter_mut().map(Column::finish).collect();
                Arc::new(
                    StructArray::try_new_with_length(fields.clone(), arrays, nulls, len)
                        .expect("sub-fields were appended with their record"),
                )
            }
            Values::List {
                element,
                offsets,
                child,
            } => {
                let mut next = Vec::with_capacity(offsets.len());
                next.push(0);
                let offsets = OffsetBuffer::new(std::mem::replace(offsets, next).into());
                Arc::new(ListArray::new(
                    element.clone(),
                    offsets,
                    child.finish(),
                    nulls,
                ))
            }
        }
    }
}
