//! Avro JSON → Avro binary, guided by the schema: how a JSON topic-schema message becomes the
//! datum a file holds and a row is read from. The forms accepted are listed in
//! [`crate::avro::topic`].

use apache_avro::schema::{
    ArraySchema, DecimalSchema, EnumSchema, FixedSchema, InnerDecimalSchema, MapSchema,
    RecordSchema, UnionSchema, UuidSchema,
};
use apache_avro::Schema;
use serde_json::Value as Json;

use super::path::{DatumPath, Segment};
use super::types::{named_type, type_name, Names};
use super::wire::{put_bytes, put_long};

/// Where a JSON value did not fit its schema, and why.
#[derive(Debug)]
pub(crate) struct Mismatch {
    pub(crate) path: DatumPath,
    pub(crate) reason: String,
}

impl Mismatch {
    fn new(reason: impl Into<String>) -> Self {
        Mismatch {
            path: DatumPath::default(),
            reason: reason.into(),
        }
    }

    fn at(mut self, segment: Segment) -> Self {
        self.path.push_outer(segment);
        self
    }
}

/// Whether a value comes from a message (Avro JSON encoding) or from a schema `default`, where a
/// union's value is unwrapped and belongs to the first branch (the Avro specification's rule; we
/// accept any branch that fits, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Json,
    Default,
}

/// Converts Avro JSON to Avro binary, guided by the schema.
pub(crate) struct JsonToAvro<'a> {
    pub(crate) names: &'a Names,
}

fn describe(v: &Json) -> String {
    let text = v.to_string();
    if text.len() > 40 {
        let cut = (0..=40)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        format!("{}…", &text[..cut])
    } else {
        text
    }
}

fn expected(what: &str, v: &Json) -> Mismatch {
    Mismatch::new(format!("expected {what}, got {}", describe(v)))
}

/// A fixed (or a duration, a fixed uuid or decimal): exactly its size in bytes.
fn emit_fixed(fixed: &FixedSchema, v: &Json, out: &mut Vec<u8>) -> Result<(), Mismatch> {
    let bytes = json_bytes(v)?;
    if bytes.len() != fixed.size {
        return Err(Mismatch::new(format!(
            "expected {} bytes for fixed {}, got {}",
            fixed.size,
            fixed.name.name(),
            bytes.len()
        )));
    }
    out.extend_from_slice(&bytes);
    Ok(())
}

/// An enum symbol, as its index.
fn emit_enum(e: &EnumSchema, v: &Json, out: &mut Vec<u8>) -> Result<(), Mismatch> {
    let symbol = v.as_str().ok_or_else(|| expected("an enum symbol", v))?;
    let index = e.symbols.iter().position(|s| s == symbol).ok_or_else(|| {
        Mismatch::new(format!(
            "{symbol:?} is not a symbol of enum {} ({})",
            e.name.name(),
            e.symbols.join(", ")
        ))
    })?;
    put_long(out, index as i64);
    Ok(())
}

impl JsonToAvro<'_> {
    pub(crate) fn emit(
        &self,
        schema: &Schema,
        v: &Json,
        mode: Mode,
        out: &mut Vec<u8>,
    ) -> Result<(), Mismatch> {
        match schema {
            Schema::Null => match v {
                Json::Null => Ok(()),
                _ => Err(expected("null", v)),
            },
            Schema::Boolean => match v {
                Json::Bool(b) => {
                    out.push(u8::from(*b));
                    Ok(())
                }
                _ => Err(expected("a boolean", v)),
            },
            Schema::Int | Schema::Date | Schema::TimeMillis => {
                let n = v
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| expected("an int (32-bit integer)", v))?;
                put_long(out, i64::from(n));
                Ok(())
            }
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => {
                let n = v
                    .as_i64()
                    .ok_or_else(|| expected("a long (64-bit integer)", v))?;
                put_long(out, n);
                Ok(())
            }
            Schema::Float => {
                let x = json_float(v).ok_or_else(|| expected("a float", v))?;
                out.extend_from_slice(&(x as f32).to_le_bytes());
                Ok(())
            }
            Schema::Double => {
                let x = json_float(v).ok_or_else(|| expected("a double", v))?;
                out.extend_from_slice(&x.to_le_bytes());
                Ok(())
            }
            Schema::String | Schema::Uuid(UuidSchema::String) => match v {
                Json::String(s) => {
                    put_bytes(out, s.as_bytes());
                    Ok(())
                }
                _ => Err(expected("a string", v)),
            },
            Schema::Bytes
            | Schema::BigDecimal
            | Schema::Uuid(UuidSchema::Bytes)
            | Schema::Decimal(DecimalSchema {
                inner: InnerDecimalSchema::Bytes,
                ..
            }) => {
                let bytes = json_bytes(v)?;
                put_bytes(out, &bytes);
                Ok(())
            }
            Schema::Fixed(fixed)
            | Schema::Duration(fixed)
            | Schema::Uuid(UuidSchema::Fixed(fixed))
            | Schema::Decimal(DecimalSchema {
                inner: InnerDecimalSchema::Fixed(fixed),
                ..
            }) => emit_fixed(fixed, v, out),
            Schema::Enum(e) => emit_enum(e, v, out),
            Schema::Array(array) => self.emit_array(array, v, mode, out),
            Schema::Map(map) => self.emit_map(map, v, mode, out),
            Schema::Record(record) => self.emit_record(record, v, mode, out),
            Schema::Union(union) => self.emit_union(union, v, mode, out),
            Schema::Ref { name } => {
                let target = self.names.get(name).ok_or_else(|| {
                    Mismatch::new(format!("unknown named type {}", name.fullname(None)))
                })?;
                self.emit(target, v, mode, out)
            }
        }
    }

    /// An array: its items in one block, then the end marker.
    fn emit_array(
        &self,
        array: &ArraySchema,
        v: &Json,
        mode: Mode,
        out: &mut Vec<u8>,
    ) -> Result<(), Mismatch> {
        let items = v.as_array().ok_or_else(|| expected("an array", v))?;
        if !items.is_empty() {
            put_long(out, items.len() as i64);
            for (i, item) in items.iter().enumerate() {
                self.emit(&array.items, item, mode, out)
                    .map_err(|e| e.at(Segment::Index(i)))?;
            }
        }
        put_long(out, 0);
        Ok(())
    }

    /// A map: its entries in one block, then the end marker.
    fn emit_map(
        &self,
        map: &MapSchema,
        v: &Json,
        mode: Mode,
        out: &mut Vec<u8>,
    ) -> Result<(), Mismatch> {
        let entries = v
            .as_object()
            .ok_or_else(|| expected("an object (map)", v))?;
        if !entries.is_empty() {
            put_long(out, entries.len() as i64);
            for (key, value) in entries {
                put_bytes(out, key.as_bytes());
                self.emit(&map.types, value, mode, out)
                    .map_err(|e| e.at(Segment::Key(key.clone())))?;
            }
        }
        put_long(out, 0);
        Ok(())
    }

    fn emit_record(
        &self,
        record: &RecordSchema,
        v: &Json,
        mode: Mode,
        out: &mut Vec<u8>,
    ) -> Result<(), Mismatch> {
        let object = v
            .as_object()
            .ok_or_else(|| expected(&format!("an object (record {})", record.name.name()), v))?;
        for field in &record.fields {
            let at = |e: Mismatch| e.at(Segment::Field(field.name.clone()));
            match (object.get(&field.name), &field.default) {
                (Some(value), _) => self.emit(&field.schema, value, mode, out).map_err(at)?,
                (None, Some(default)) => self
                    .emit(&field.schema, default, Mode::Default, out)
                    .map_err(at)?,
                (None, None) => match self.null_branch(&field.schema) {
                    Some(index) => put_long(out, index as i64),
                    None => return Err(at(Mismatch::new("missing field"))),
                },
            }
        }
        Ok(())
    }

    fn emit_union(
        &self,
        union: &UnionSchema,
        v: &Json,
        mode: Mode,
        out: &mut Vec<u8>,
    ) -> Result<(), Mismatch> {
        let variants = union.variants();
        let start = out.len();
        if mode == Mode::Default {
            // A default's value is unwrapped; try the branches in order, the first one first.
            let mut first_error = None;
            for (i, variant) in variants.iter().enumerate() {
                put_long(out, i as i64);
                match self.emit(variant, v, mode, out) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        out.truncate(start);
                        first_error.get_or_insert(e);
                    }
                }
            }
            return Err(first_error.unwrap_or_else(|| Mismatch::new("empty union")));
        }
        if v.is_null() {
            return match variants.iter().position(|s| matches!(s, Schema::Null)) {
                Some(i) => {
                    put_long(out, i as i64);
                    Ok(())
                }
                None => Err(Mismatch::new("null, but the union has no null branch")),
            };
        }
        let non_null: Vec<usize> = (0..variants.len())
            .filter(|&i| !matches!(variants[i], Schema::Null))
            .collect();
        let mut wrapped_error = None;
        if let Some((key, inner)) = v
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.iter().next())
        {
            if let Some(i) = variants.iter().position(|s| self.branch_is_named(s, key)) {
                put_long(out, i as i64);
                match self.emit(&variants[i], inner, mode, out) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        out.truncate(start);
                        wrapped_error = Some(e.at(Segment::Branch(key.clone())));
                    }
                }
            }
        }
        if let [only] = non_null[..] {
            // Lenient: the bare value of a `["null", T]` union.
            put_long(out, only as i64);
            match self.emit(&variants[only], v, mode, out) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    out.truncate(start);
                    return Err(wrapped_error.unwrap_or(e));
                }
            }
        }
        Err(wrapped_error.unwrap_or_else(|| {
            let names: Vec<String> = variants.iter().map(|s| self.branch_name(s)).collect();
            Mismatch::new(format!(
                "a union value must be null or {{\"<type>\": value}} with <type> one of {}; got {}",
                names.join(", "),
                describe(v)
            ))
        }))
    }

    /// The index of the `null` branch when `schema` is a union that has one.
    fn null_branch(&self, schema: &Schema) -> Option<usize> {
        match schema {
            Schema::Union(u) => u.variants().iter().position(|s| matches!(s, Schema::Null)),
            _ => None,
        }
    }

    fn branch_name(&self, schema: &Schema) -> String {
        match named_type(schema) {
            Some(name) => name.fullname(None),
            None => type_name(schema).to_owned(),
        }
    }

    /// Whether `key` names the branch `schema` in a wrapped union value: the type name for
    /// unnamed types (logical types use their underlying type), the full name of a named type or,
    /// leniently, its short name.
    fn branch_is_named(&self, schema: &Schema, key: &str) -> bool {
        match named_type(schema) {
            Some(name) => key == name.name() || key == name.fullname(None),
            None => key == type_name(schema),
        }
    }
}

/// A float or double in the Avro JSON encoding: a number, or the names of the special values.
fn json_float(v: &Json) -> Option<f64> {
    match v {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// `bytes` / `fixed` in the Avro JSON encoding: a string whose code points 0–255 are the bytes.
fn json_bytes(v: &Json) -> Result<Vec<u8>, Mismatch> {
    let s = v
        .as_str()
        .ok_or_else(|| expected("a string of bytes (code points 0-255)", v))?;
    s.chars()
        .map(|c| {
            u8::try_from(u32::from(c)).map_err(|_| {
                Mismatch::new(format!(
                    "{c:?} (U+{:04X}) cannot be a byte: bytes are written as code points 0-255",
                    u32::from(c)
                ))
            })
        })
        .collect()
}
