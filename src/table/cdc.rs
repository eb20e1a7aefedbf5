//! Change data capture (docs/contract.md §4.9): the `_CHANGE_TYPE` and `_CHANGE_SEQUENCE_NUMBER`
//! pseudo-columns of a table with a primary key.
//!
//! This file holds what both destinations share: the table's key and its checks at startup, the
//! pseudo-columns added to the row builder's schema, and the per-row rules (a change type of
//! `UPSERT` or `DELETE`, a sequence number in BigQuery's format, a key with no NULL). The Delta
//! side (one MERGE per commit) is [`super::merge`]; BigQuery receives the pseudo-columns as they
//! are, on its default stream.

use super::schema::{FieldMode, FieldType, InvalidTableSchema, TableField, TableSchema};

/// The change type pseudo-column: `UPSERT` or `DELETE`.
pub const CHANGE_TYPE: &str = "_CHANGE_TYPE";
/// The sequence number pseudo-column; in a Delta table, also the column that keeps each row's
/// number (normalized: [`normalize_sequence`]).
pub const CHANGE_SEQUENCE_NUMBER: &str = "_CHANGE_SEQUENCE_NUMBER";
/// The tombstones' retention window by default (`--table-delete-retention`): BigQuery's delete
/// retention window, two days.
pub const DEFAULT_DELETE_RETENTION: std::time::Duration =
    std::time::Duration::from_secs(2 * 24 * 3600);
/// BigQuery's limit on the columns of a primary key.
const MAX_KEY_COLUMNS: usize = 16;
/// Sections of a sequence number, and hex digits per section.
const SECTIONS: usize = 4;
const SECTION_DIGITS: usize = 16;
/// Length of a normalized sequence number: four sections of 16 digits and three slashes.
pub const NORMALIZED_LEN: usize = SECTIONS * SECTION_DIGITS + SECTIONS - 1;

/// The number 0, normalized: the number of a change (or row) without one. It sorts below every
/// other number.
pub const ZERO: &str = "0000000000000000/0000000000000000/0000000000000000/0000000000000000";

/// A change's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Upsert,
    Delete,
}

impl ChangeType {
    /// `UPSERT` or `DELETE`, exactly (BigQuery accepts no other spelling).
    pub fn parse(s: &[u8]) -> Result<ChangeType, String> {
        match s {
            b"UPSERT" => Ok(ChangeType::Upsert),
            b"DELETE" => Ok(ChangeType::Delete),
            _ => Err(format!(
                "must be \"UPSERT\" or \"DELETE\", not {:?}",
                String::from_utf8_lossy(s)
            )),
        }
    }
}

/// BigQuery's sequence number format: one to four sections separated by `/`, each one to 16
/// hexadecimal digits (either case), compared section by section as unsigned 64-bit numbers.
/// Returned in the normalized form this crate stores and compares: four sections (missing ones
/// are 0), each zero-padded to 16 upper-case digits, so that comparing two normalized numbers as
/// strings compares them as numbers (`FFF/B` → `0000000000000FFF/000000000000000B/0…0/0…0`).
pub fn normalize_sequence(s: &[u8]) -> Result<String, String> {
    let rule = "a sequence number is one to four sections of 1 to 16 hexadecimal digits separated \
                by `/` (e.g. \"FFF/B\")";
    let text = std::str::from_utf8(s).map_err(|_| format!("not UTF-8; {rule}"))?;
    let sections: Vec<&str> = text.split('/').collect();
    if sections.len() > SECTIONS {
        return Err(format!("{text:?} has {} sections; {rule}", sections.len()));
    }
    let mut out = String::with_capacity(NORMALIZED_LEN);
    for i in 0..SECTIONS {
        if i > 0 {
            out.push('/');
        }
        let section = sections.get(i).copied().unwrap_or("0");
        if section.is_empty()
            || section.len() > SECTION_DIGITS
            || !section.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(format!("{text:?}: section {:?}; {rule}", section));
        }
        for _ in section.len()..SECTION_DIGITS {
            out.push('0');
        }
        out.extend(section.chars().map(|c| c.to_ascii_uppercase()));
    }
    Ok(out)
}

/// A table's primary key, checked against its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryKey {
    /// The key's columns, spelled as in the table schema.
    pub columns: Vec<String>,
}

impl PrimaryKey {
    /// Check `names` against `schema`: 1 to 16 distinct top-level columns, none REPEATED or
    /// RECORD (nor JSON: BigQuery's key types are the comparable ones). Names match
    /// case-insensitively, as BigQuery's do; the result spells them as the schema does.
    pub fn new(names: &[String], schema: &TableSchema) -> Result<PrimaryKey, InvalidTableSchema> {
        if names.is_empty() || names.len() > MAX_KEY_COLUMNS {
            return Err(InvalidTableSchema::new(
                "$",
                format!(
                    "a primary key has 1 to {MAX_KEY_COLUMNS} columns, not {}",
                    names.len()
                ),
            ));
        }
        let mut columns: Vec<String> = Vec::with_capacity(names.len());
        for name in names {
            let Some(f) = schema.field(name) else {
                return Err(InvalidTableSchema::new(
                    name,
                    format!(
                        "primary key column `{name}` is not a column of the table (columns: {})",
                        schema
                            .fields
                            .iter()
                            .map(|f| f.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            };
            if f.mode == FieldMode::Repeated
                || matches!(f.ty, FieldType::Record(_) | FieldType::Json)
            {
                return Err(InvalidTableSchema::new(
                    &f.name,
                    format!(
                        "a primary key column cannot be {}{}",
                        if f.mode == FieldMode::Repeated {
                            "REPEATED "
                        } else {
                            ""
                        },
                        f.ty.name()
                    ),
                ));
            }
            if columns.iter().any(|c| c.eq_ignore_ascii_case(&f.name)) {
                return Err(InvalidTableSchema::new(
                    &f.name,
                    "named twice in the primary key",
                ));
            }
            columns.push(f.name.clone());
        }
        Ok(PrimaryKey { columns })
    }
}

/// `schema` with the two pseudo-columns appended (NULLABLE STRING), for the row builder: a
/// message's `_CHANGE_TYPE` and `_CHANGE_SEQUENCE_NUMBER` fields (or a topic schema's fields of
/// those names) then fill them like any column. A table that has columns of those names already
/// is refused: they are BigQuery's reserved pseudo-columns.
pub fn with_change_columns(schema: &TableSchema) -> Result<TableSchema, InvalidTableSchema> {
    for name in [CHANGE_TYPE, CHANGE_SEQUENCE_NUMBER] {
        if let Some(f) = schema.field(name) {
            return Err(InvalidTableSchema::new(
                &f.name,
                format!(
                    "`{name}` is a change data capture pseudo-column, not a column of a table \
                     with a primary key; drop it from the schema"
                ),
            ));
        }
    }
    let mut out = schema.clone();
    for name in [CHANGE_TYPE, CHANGE_SEQUENCE_NUMBER] {
        out.fields.push(TableField::new(
            name,
            FieldType::String,
            FieldMode::Nullable,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_normalize_so_string_order_is_number_order() {
        let n = |s: &str| normalize_sequence(s.as_bytes()).unwrap();
        assert_eq!(
            n("FFF/b"),
            "0000000000000FFF/000000000000000B/0000000000000000/0000000000000000"
        );
        assert_eq!(n("0").len(), NORMALIZED_LEN);
        assert_eq!(n("0/0"), ZERO);
        assert_eq!(n("ff"), n("FF/0"));
        assert_eq!(n("FFFFFFFFFFFFFFFF/1/2/3").len(), NORMALIZED_LEN);
        // Numbers, not text: 10 > F, and the first section decides before the second.
        assert!(n("10") > n("F"));
        assert!(n("2/0") > n("1/FFFFFFFFFFFFFFFF"));
        assert!(n("1/2") > n("1/1"));
        for bad in [
            "",
            "/",
            "1//2",
            "G",
            "1/2/3/4/5",
            "11111111111111111",
            "-1",
            " 1",
        ] {
            let e = normalize_sequence(bad.as_bytes()).unwrap_err();
            assert!(e.contains("hexadecimal"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn change_types_are_exact() {
        assert_eq!(ChangeType::parse(b"UPSERT"), Ok(ChangeType::Upsert));
        assert_eq!(ChangeType::parse(b"DELETE"), Ok(ChangeType::Delete));
        let e = ChangeType::parse(b"upsert").unwrap_err();
        assert!(e.contains("\"UPSERT\" or \"DELETE\""), "{e}");
    }

    #[test]
    fn keys_are_checked_against_the_schema() {
        let schema = TableSchema::from_json(
            r#"[{"name":"Id","type":"INT64","mode":"REQUIRED"},{"name":"tags","type":"STRING","mode":"REPEATED"},
                {"name":"doc","type":"JSON"},{"name":"region","type":"STRING"}]"#,
        )
        .unwrap();
        let key = |names: &[&str]| {
            PrimaryKey::new(
                &names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                &schema,
            )
        };
        assert_eq!(key(&["id", "REGION"]).unwrap().columns, ["Id", "region"]);
        let e = key(&["nope"]).unwrap_err().to_string();
        assert!(
            e.contains("`nope` is not a column") && e.contains("Id, tags"),
            "{e}"
        );
        assert!(key(&["tags"]).unwrap_err().to_string().contains("REPEATED"));
        assert!(key(&["doc"]).unwrap_err().to_string().contains("JSON"));
        assert!(key(&["id", "Id"])
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(key(&[]).unwrap_err().to_string().contains("1 to 16"));
        let e = with_change_columns(
            &TableSchema::from_json(r#"[{"name":"_change_type","type":"STRING"}]"#).unwrap(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("pseudo-column"), "{e}");
    }
}
