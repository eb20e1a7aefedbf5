//! Values into the column builders on the reference path: a JSON record matched to its columns
//! and converted field by field, with the field's path in every error (docs/contract.md §4.3,
//! §4.6); the `data` column of no-schema mode and the `attributes` metadata value (§4.5).

use serde_json::Value;

use crate::message::Message;
use crate::table::columns::Column;
use crate::table::convert::{check_json_text, convert_scalar, kind, Cell};
use crate::table::error::{Fail, RowErrorKind};
use crate::table::schema::{FieldMode, FieldType, TableField};

/// A message's value `field` is invalid for its column: why.
pub(super) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Fail {
    Fail {
        field: field.into(),
        kind: RowErrorKind::Invalid,
        reason: reason.into(),
    }
}

/// The `attributes` metadata value: a JSON object of the attributes plus `ordering_key` when the
/// message has one (docs/contract.md §6 Q7; the ordering key wins over an attribute of that name); `{}` when empty.
/// Keys in order, as serde_json writes a map.
pub(super) fn write_attributes(msg: &Message, out: &mut Vec<u8>) {
    const KEY: &str = "ordering_key";
    if msg.ordering_key.is_empty() && msg.attributes.write_json_plain(out) {
        return;
    }
    let mut key = (!msg.ordering_key.is_empty()).then_some(msg.ordering_key.as_str());
    let mut first = true;
    let mut pair = |k: &str, v: &str, out: &mut Vec<u8>| {
        out.push(if first { b'{' } else { b',' });
        first = false;
        json_string(k, out);
        out.push(b':');
        json_string(v, out);
    };
    for (k, v) in &msg.attributes {
        if let Some(ordering_key) = key {
            if k >= KEY {
                pair(KEY, ordering_key, out);
                key = None;
                if k == KEY {
                    continue;
                }
            }
        }
        pair(k, v, out);
    }
    if let Some(ordering_key) = key {
        pair(KEY, ordering_key, out);
    }
    if first {
        out.push(b'{');
    }
    out.push(b'}');
}

/// `s` as a JSON string, as serde_json writes it: plain text is copied as it is; text with a
/// quote, a backslash or a control character goes through serde_json's escaping.
fn json_string(s: &str, out: &mut Vec<u8>) {
    if crate::jsonscan::needs_escape(s.as_bytes()) {
        serde_json::to_writer(out, s).expect("a string");
    } else {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// The `data` column in no-schema mode (§4.3, Q10): BYTES as-is; STRING must be UTF-8; JSON must
/// be UTF-8 JSON text.
pub(super) fn data_cell(ty: &FieldType, data: &[u8], b: &mut Column) -> Result<(), Fail> {
    match ty {
        FieldType::Bytes => b.push_bytes(data),
        FieldType::String | FieldType::Json => {
            let s = std::str::from_utf8(data).map_err(|e| {
                invalid(
                    "data",
                    format!("{} column: payload is not UTF-8: {e}", ty.name()),
                )
            })?;
            if *ty == FieldType::Json {
                check_json_text(s).map_err(|e| invalid("data", e))?;
            }
            b.push_bytes(s.as_bytes());
        }
        _ => unreachable!("checked by RowBuilder::new"),
    }
    Ok(())
}

/// Where a value sits in the message, for error texts; rendered only when there is an error.
#[derive(Clone, Copy)]
pub(super) enum Path<'a> {
    /// The payload object itself.
    Root,
    /// A key of the object at the parent path.
    Field(&'a Path<'a>, &'a str),
    /// An element of the array at the parent path.
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    /// `user.langs[1]`; the root alone is the empty string.
    fn render(&self) -> String {
        match self {
            Path::Root => String::new(),
            Path::Field(Path::Root, name) => name.to_string(),
            Path::Field(parent, name) => format!("{}.{name}", parent.render()),
            Path::Index(parent, i) => format!("{}[{i}]", parent.render()),
        }
    }
}

/// Match the keys of `obj` to `fields` (exact name first, then case-insensitively, Q14) and
/// convert each field's value into its builder in `cols` (one per field, same order). On error
/// the builders hold a partial row: the caller truncates them.
///
/// This is the reference conversion (every message the fast path does not vouch for comes here),
/// and the entry for messages that are already a JSON object (decoded topic-schema messages).
pub(super) fn convert_record(
    fields: &[TableField],
    cols: &mut [Column],
    obj: &serde_json::Map<String, Value>,
    path: Path,
    drop_unknown: bool,
) -> Result<(), Fail> {
    let mut slots: Vec<Option<&Value>> = vec![None; fields.len()];
    let mut inexact = Vec::new();
    for (k, v) in obj {
        match fields.iter().position(|f| f.name == *k) {
            Some(i) => slots[i] = Some(v),
            None => inexact.push((k, v)),
        }
    }
    for (k, v) in inexact {
        match fields.iter().position(|f| f.name.eq_ignore_ascii_case(k)) {
            Some(i) if slots[i].is_none() => slots[i] = Some(v),
            _ if drop_unknown => {}
            Some(i) => {
                return Err(Fail {
                    field: Path::Field(&path, k).render(),
                    kind: RowErrorKind::UnknownField,
                    reason: format!(
                        "unknown field: column `{}` is already given by a key of exactly its name",
                        fields[i].name
                    ),
                })
            }
            None => {
                return Err(Fail {
                    field: Path::Field(&path, k).render(),
                    kind: RowErrorKind::UnknownField,
                    reason: "unknown field: not a column of the table (drop_unknown_fields is off)"
                        .to_string(),
                })
            }
        }
    }
    for ((f, col), v) in fields.iter().zip(cols).zip(slots) {
        convert_field(f, col, v, Path::Field(&path, &f.name), drop_unknown)?;
    }
    Ok(())
}

fn convert_field(
    f: &TableField,
    col: &mut Column,
    v: Option<&Value>,
    path: Path,
    drop_unknown: bool,
) -> Result<(), Fail> {
    match (f.mode, v) {
        // A REPEATED column absent or null is an empty array (BigQuery arrays are never NULL).
        (FieldMode::Repeated, None | Some(Value::Null)) => col.close_list(),
        (FieldMode::Repeated, Some(Value::Array(items))) => {
            let elements = col.elements();
            for (i, item) in items.iter().enumerate() {
                let p = Path::Index(&path, i);
                if item.is_null() {
                    return Err(invalid(
                        p.render(),
                        "REPEATED: array elements cannot be NULL",
                    ));
                }
                convert_value(f, elements, item, p, drop_unknown)?;
            }
            col.close_list();
        }
        (FieldMode::Repeated, Some(other)) => {
            return Err(invalid(
                path.render(),
                format!("REPEATED expects an array, got {}", kind(other)),
            ))
        }
        (FieldMode::Nullable, None | Some(Value::Null)) => col.push_null(),
        (FieldMode::Required, None | Some(Value::Null)) => {
            return Err(Fail {
                field: path.render(),
                kind: RowErrorKind::MissingRequired,
                reason: format!(
                    "REQUIRED column is {}",
                    if v.is_none() { "missing" } else { "null" }
                ),
            })
        }
        (_, Some(v)) => convert_value(f, col, v, path, drop_unknown)?,
    }
    Ok(())
}

/// Convert one non-null value of `f`'s type (an element, for REPEATED) into `col`.
fn convert_value(
    f: &TableField,
    col: &mut Column,
    v: &Value,
    path: Path,
    drop_unknown: bool,
) -> Result<(), Fail> {
    if let (FieldType::Record(sub), Value::Object(obj)) = (&f.ty, v) {
        convert_record(sub, col.children(), obj, path, drop_unknown)?;
        col.close_struct();
        return Ok(());
    }
    let cell = convert_scalar(&f.ty, v, f.max_length).map_err(|e| invalid(path.render(), e))?;
    push_value(&f.ty, col, cell);
    Ok(())
}

/// Append a converted value of `f` (its mode included: a REPEATED field takes a `Cell::List`)
/// to `col`: the topic-schema path converts messages into cells first.
pub(super) fn push_cell(f: &TableField, col: &mut Column, cell: Cell) {
    if f.mode == FieldMode::Repeated {
        match cell {
            Cell::List(items) => {
                let elements = col.elements();
                for item in items {
                    push_value(&f.ty, elements, item);
                }
                col.close_list();
            }
            // Only under a NULL record.
            Cell::Null => col.push_null(),
            other => unreachable!("REPEATED cell {other:?}"),
        }
    } else {
        push_value(&f.ty, col, cell);
    }
}

/// Append one value (not a list) of type `ty`.
fn push_value(ty: &FieldType, col: &mut Column, cell: Cell) {
    match cell {
        Cell::Null => col.push_null(),
        Cell::Bool(x) => col.push_bool(x),
        Cell::Int(x) | Cell::Time(x) | Cell::Micros(x) => col.push_i64(x),
        Cell::Float(x) => col.push_f64(x),
        Cell::Numeric(x) => col.push_numeric(x),
        Cell::BigNumeric(x) => col.push_bignumeric(x),
        Cell::Str(x) => col.push_bytes(x.as_bytes()),
        Cell::Bytes(x) => col.push_bytes(&x),
        Cell::Date(x) => col.push_date(x),
        Cell::Struct(cells) => {
            let FieldType::Record(sub) = ty else {
                unreachable!("a record cell for {}", ty.name())
            };
            for ((f, c), cell) in sub.iter().zip(col.children()).zip(cells) {
                push_cell(f, c, cell);
            }
            col.close_struct();
        }
        Cell::List(_) => unreachable!("a list cell for a single value"),
    }
}

#[cfg(test)]
mod attribute_tests {
    use super::*;

    proptest::proptest! {
        /// The `attributes` value is serde_json's rendering of the attributes with `ordering_key`
        /// set to the ordering key when there is one.
        #[test]
        fn attributes_json_is_serde_jsons_map(
            attrs in proptest::collection::btree_map(
                proptest::prop_oneof![
                    proptest::strategy::Just("ordering_key".to_string()),
                    "[a-z_\"\\\\\u{1}é]{0,13}",
                ],
                "[a-z\"\\\\\u{1}é]{0,3}",
                0..5,
            ),
            ordering_key in "[a-z\"\u{7f}]{0,3}",
        ) {
            let msg = Message {
                attributes: (&attrs).into(),
                ordering_key: ordering_key.clone(),
                ..Message::default()
            };
            let mut want = attrs;
            if !ordering_key.is_empty() {
                want.insert("ordering_key".into(), ordering_key);
            }
            let mut out = Vec::new();
            write_attributes(&msg, &mut out);
            proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&want).unwrap());
        }
    }
}
