//! BigQuery's JSON table-schema format (`bq show --schema --format=prettyjson`) and its Arrow form.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema, TimeUnit};
use serde_json::Value;

/// A column's BigQuery type, aliases resolved (docs/contract.md §4.4: `INT`, `SMALLINT`, `INTEGER`, `BIGINT`,
/// `TINYINT`, `BYTEINT` = INT64; `DECIMAL` = NUMERIC; `BIGDECIMAL` = BIGNUMERIC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldType {
    String,
    Bytes,
    Int64,
    Float64,
    /// Arrow `Decimal128(38, 9)`.
    Numeric,
    /// Arrow `Decimal256(76, 38)` in memory: its unscaled `i256` at scale 38 is BigQuery's whole
    /// range (±5.789…×10^38, 77 digits at the bounds; arrow does not check values against the
    /// precision label, which cannot exceed 76). Stored in Delta as exact decimal text
    /// ([`super::delta`]).
    BigNumeric,
    Bool,
    /// Arrow `Timestamp(µs, "UTC")`.
    Timestamp,
    /// Arrow `Date32`.
    Date,
    /// Arrow `Time64(µs)`.
    Time,
    /// Arrow `Timestamp(µs, None)`: a civil date and time without zone.
    DateTime,
    /// Arrow `Utf8` marked `ARROW:extension:name = arrow.json`.
    Json,
    /// RECORD / STRUCT with its sub-fields.
    Record(Vec<TableField>),
}

impl FieldType {
    /// The canonical BigQuery name (`INT64`, not `INTEGER`).
    pub fn name(&self) -> &'static str {
        match self {
            FieldType::String => "STRING",
            FieldType::Bytes => "BYTES",
            FieldType::Int64 => "INT64",
            FieldType::Float64 => "FLOAT64",
            FieldType::Numeric => "NUMERIC",
            FieldType::BigNumeric => "BIGNUMERIC",
            FieldType::Bool => "BOOL",
            FieldType::Timestamp => "TIMESTAMP",
            FieldType::Date => "DATE",
            FieldType::Time => "TIME",
            FieldType::DateTime => "DATETIME",
            FieldType::Json => "JSON",
            FieldType::Record(_) => "RECORD",
        }
    }
}

/// A column's mode. `NULLABLE` when the schema leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldMode {
    #[default]
    Nullable,
    Required,
    Repeated,
}

/// One column (or one sub-field of a RECORD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableField {
    pub name: String,
    pub ty: FieldType,
    pub mode: FieldMode,
    /// `maxLength` of a STRING (characters) or BYTES (bytes) column; longer values fail the message.
    pub max_length: Option<u64>,
    pub description: Option<String>,
}

impl TableField {
    /// A field without description or length limit.
    pub fn new(name: impl Into<String>, ty: FieldType, mode: FieldMode) -> Self {
        TableField {
            name: name.into(),
            ty,
            mode,
            max_length: None,
            description: None,
        }
    }
}

/// BigQuery's column types subsink writes, with their aliases, for errors.
const KNOWN_TYPES: &str = "STRING, BYTES, INTEGER (INT64, INT, SMALLINT, BIGINT, TINYINT, \
     BYTEINT), FLOAT (FLOAT64), NUMERIC (DECIMAL), BIGNUMERIC (BIGDECIMAL), BOOLEAN (BOOL), \
     TIMESTAMP, DATE, TIME, DATETIME, JSON, RECORD (STRUCT)";

/// A table schema: the top-level columns in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableSchema {
    pub fields: Vec<TableField>,
    /// The primary key's columns (`tableConstraints.primaryKey.columns` of a table resource), or
    /// empty: a table with a key takes change data capture (docs/contract.md §4.9).
    pub primary_key: Vec<String>,
    /// A table resource's `timePartitioning` (a Delta table subsink creates is partitioned so:
    /// [`super::partition`]), or empty.
    pub partitioning: Vec<super::partition::PartitionBy>,
    /// The table resource has a `rangePartitioning` (not made for Delta tables: refused there).
    pub range_partitioning: bool,
}

/// Why a table schema (or a schema for a mode) was rejected. `path` is the dotted field path
/// (`payload.items.sku`), or `$` for the document itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("table schema: field `{path}`: {reason}")]
pub struct InvalidTableSchema {
    pub path: String,
    pub reason: String,
}

impl InvalidTableSchema {
    pub(crate) fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        InvalidTableSchema {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// Longest column name BigQuery allows.
const MAX_NAME_LEN: usize = 300;

impl TableSchema {
    /// Parse BigQuery's JSON schema: an array of field objects, `{"fields": [...]}` (the
    /// `schema` member of a table resource), or a whole table resource (`schema.fields`, and its
    /// primary key from `tableConstraints.primaryKey.columns`). Keys other than `name`, `type`,
    /// `mode`, `fields`, `description`, `maxLength` (e.g. `policyTags`, `collation`) are ignored.
    pub fn from_json(text: &str) -> Result<TableSchema, InvalidTableSchema> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| InvalidTableSchema::new("$", e.to_string()))?;
        let shape = "expected a JSON array of fields, an object with a `fields` array, or a table \
                     resource (`bq show --format=prettyjson`) with `schema.fields`";
        let (fields, resource) = match &v {
            Value::Array(a) => (a, None),
            Value::Object(o) => {
                let fields = o
                    .get("fields")
                    .or_else(|| o.get("schema").and_then(|s| s.get("fields")));
                match fields {
                    Some(Value::Array(a)) => (a, Some(o)),
                    _ => return Err(InvalidTableSchema::new("$", shape)),
                }
            }
            _ => return Err(InvalidTableSchema::new("$", shape)),
        };
        if fields.is_empty() {
            return Err(InvalidTableSchema::new(
                "$",
                "a table needs at least one column",
            ));
        }
        let primary_key = match resource.and_then(|o| o.get("tableConstraints")) {
            None | Some(Value::Null) => Vec::new(),
            Some(c) => match c.get("primaryKey").map(|k| k.get("columns")) {
                None | Some(None) => Vec::new(),
                Some(Some(Value::Array(cols))) => cols
                    .iter()
                    .map(|c| {
                        c.as_str().map(str::to_string).ok_or_else(|| {
                            InvalidTableSchema::new(
                                "tableConstraints.primaryKey.columns",
                                "expected an array of column names",
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?,
                Some(Some(_)) => {
                    return Err(InvalidTableSchema::new(
                        "tableConstraints.primaryKey.columns",
                        "expected an array of column names",
                    ))
                }
            },
        };
        let partitioning = match resource.and_then(|o| o.get("timePartitioning")) {
            None | Some(Value::Null) => Vec::new(),
            Some(tp) => vec![super::partition::PartitionBy::from_time_partitioning(tp)
                .map_err(|e| InvalidTableSchema::new("timePartitioning", e.0))?],
        };
        let range_partitioning = resource
            .and_then(|o| o.get("rangePartitioning"))
            .is_some_and(|r| !r.is_null());
        Ok(TableSchema {
            fields: parse_fields(fields, "")?,
            primary_key,
            partitioning,
            range_partitioning,
        })
    }

    /// The column named `name`, compared case-insensitively (BigQuery column names are).
    pub fn field(&self, name: &str) -> Option<&TableField> {
        self.fields
            .iter()
            .find(|f| f.name.eq_ignore_ascii_case(name))
    }

    /// The Arrow schema of these columns (see [`arrow_field`]).
    pub fn arrow_schema(&self) -> Schema {
        Schema::new(self.fields.iter().map(arrow_field).collect::<Vec<_>>())
    }
}

fn parse_fields(fields: &[Value], parent: &str) -> Result<Vec<TableField>, InvalidTableSchema> {
    let mut out: Vec<TableField> = Vec::with_capacity(fields.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, f) in fields.iter().enumerate() {
        let positional = if parent.is_empty() {
            format!("[{i}]")
        } else {
            format!("{parent}[{i}]")
        };
        let Value::Object(o) = f else {
            return Err(InvalidTableSchema::new(
                positional,
                "a field must be a JSON object",
            ));
        };
        let name = match o.get("name") {
            Some(Value::String(s)) => s.as_str(),
            _ => return Err(InvalidTableSchema::new(positional, "missing string `name`")),
        };
        let path = if parent.is_empty() {
            name.to_string()
        } else {
            format!("{parent}.{name}")
        };
        check_name(name).map_err(|r| InvalidTableSchema::new(&path, r))?;
        if let Some(prev) = seen.insert(name.to_ascii_lowercase(), i) {
            return Err(InvalidTableSchema::new(
                &path,
                format!(
                    "duplicate column name (same as `{}`; names are case-insensitive)",
                    out[prev].name
                ),
            ));
        }
        let ty_name = match o.get("type") {
            Some(Value::String(s)) => s.to_ascii_uppercase(),
            _ => return Err(InvalidTableSchema::new(&path, "missing string `type`")),
        };
        let mode = field_mode(o.get("mode"), &path)?;
        let sub = match o.get("fields") {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => Some(a),
            Some(_) => return Err(InvalidTableSchema::new(&path, "`fields` must be an array")),
        };
        let ty = field_type(&ty_name, sub, &path)?;
        if sub.is_some_and(|a| !a.is_empty()) && !matches!(ty, FieldType::Record(_)) {
            return Err(InvalidTableSchema::new(
                &path,
                format!("`fields` given for a {} column", ty.name()),
            ));
        }
        if (o.contains_key("precision") || o.contains_key("scale"))
            && matches!(ty, FieldType::Numeric | FieldType::BigNumeric)
        {
            return Err(InvalidTableSchema::new(
                &path,
                "parameterized NUMERIC/BIGNUMERIC (precision, scale) is not supported",
            ));
        }
        let max_length = max_length(o.get("maxLength"), &ty, &path)?;
        let description = match o.get("description") {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        };
        out.push(TableField {
            name: name.to_string(),
            ty,
            mode,
            max_length,
            description,
        });
    }
    Ok(out)
}

/// A field's `mode` (`path` names it in errors): NULLABLE when absent.
fn field_mode(v: Option<&Value>, path: &str) -> Result<FieldMode, InvalidTableSchema> {
    Ok(match v {
        None | Some(Value::Null) => FieldMode::Nullable,
        Some(Value::String(s)) => match s.to_ascii_uppercase().as_str() {
            "NULLABLE" => FieldMode::Nullable,
            "REQUIRED" => FieldMode::Required,
            "REPEATED" => FieldMode::Repeated,
            other => {
                return Err(InvalidTableSchema::new(
                    path,
                    format!("unknown mode `{other}` (NULLABLE, REQUIRED or REPEATED)"),
                ))
            }
        },
        Some(_) => return Err(InvalidTableSchema::new(path, "`mode` must be a string")),
    })
}

/// A field's type from its `type` name (upper-cased) and its `fields` (`sub`, a RECORD's).
fn field_type(
    ty_name: &str,
    sub: Option<&Vec<Value>>,
    path: &str,
) -> Result<FieldType, InvalidTableSchema> {
    Ok(match ty_name {
        "STRING" => FieldType::String,
        "BYTES" => FieldType::Bytes,
        "INTEGER" | "INT64" | "INT" | "SMALLINT" | "BIGINT" | "TINYINT" | "BYTEINT" => {
            FieldType::Int64
        }
        "FLOAT" | "FLOAT64" => FieldType::Float64,
        "NUMERIC" | "DECIMAL" => FieldType::Numeric,
        "BIGNUMERIC" | "BIGDECIMAL" => FieldType::BigNumeric,
        "BOOLEAN" | "BOOL" => FieldType::Bool,
        "TIMESTAMP" => FieldType::Timestamp,
        "DATE" => FieldType::Date,
        "TIME" => FieldType::Time,
        "DATETIME" => FieldType::DateTime,
        "JSON" => FieldType::Json,
        "RECORD" | "STRUCT" => match sub {
            Some(a) if !a.is_empty() => FieldType::Record(parse_fields(a, path)?),
            _ => {
                return Err(InvalidTableSchema::new(
                    path,
                    "a RECORD needs a non-empty `fields` array",
                ))
            }
        },
        "GEOGRAPHY" | "INTERVAL" | "RANGE" => {
            return Err(InvalidTableSchema::new(
                path,
                format!("type {ty_name} is not supported by subsink's table writer"),
            ))
        }
        other => {
            return Err(InvalidTableSchema::new(
                path,
                format!("unknown type `{other}`: use one of {KNOWN_TYPES}"),
            ))
        }
    })
}

/// A STRING or BYTES field's `maxLength` (a positive integer, as a JSON string or number).
fn max_length(
    v: Option<&Value>,
    ty: &FieldType,
    path: &str,
) -> Result<Option<u64>, InvalidTableSchema> {
    Ok(match v {
        None | Some(Value::Null) => None,
        Some(v) => {
            if !matches!(ty, FieldType::String | FieldType::Bytes) {
                return Err(InvalidTableSchema::new(
                    path,
                    "`maxLength` applies to STRING and BYTES only",
                ));
            }
            // The REST API writes int64 as a JSON string; accept a number too.
            let n = match v {
                Value::String(s) => s.parse::<u64>().ok(),
                Value::Number(n) => n.as_u64(),
                _ => None,
            };
            match n {
                Some(n) if n > 0 => Some(n),
                _ => {
                    return Err(InvalidTableSchema::new(
                        path,
                        "`maxLength` must be a positive integer",
                    ))
                }
            }
        }
    })
}

/// docs/contract.md §4.3: column names may contain only `[a-zA-Z0-9_]`.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty column name".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("column name longer than {MAX_NAME_LEN} characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
    {
        return Err(format!(
            "column name contains {c:?}; only [a-zA-Z0-9_] is allowed"
        ));
    }
    Ok(())
}

/// Field metadata key/value marking a `Utf8` column as JSON (Arrow's canonical extension type).
pub const JSON_EXTENSION_KEY: &str = "ARROW:extension:name";
pub const JSON_EXTENSION_NAME: &str = "arrow.json";

/// Name of the element field of a REPEATED column's Arrow list (Parquet's LIST convention).
pub const LIST_ELEMENT: &str = "element";

/// The Arrow data type of one value of `ty` (ignoring the mode).
pub fn arrow_value_type(ty: &FieldType) -> DataType {
    match ty {
        FieldType::String | FieldType::Json => DataType::Utf8,
        FieldType::Bytes => DataType::Binary,
        FieldType::Int64 => DataType::Int64,
        FieldType::Float64 => DataType::Float64,
        FieldType::Numeric => DataType::Decimal128(38, 9),
        FieldType::BigNumeric => DataType::Decimal256(76, 38),
        FieldType::Bool => DataType::Boolean,
        FieldType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        FieldType::Date => DataType::Date32,
        FieldType::Time => DataType::Time64(TimeUnit::Microsecond),
        FieldType::DateTime => DataType::Timestamp(TimeUnit::Microsecond, None),
        FieldType::Record(fields) => DataType::Struct(Fields::from(
            fields.iter().map(arrow_field).collect::<Vec<_>>(),
        )),
    }
}

/// The Arrow field of a column: NULLABLE → nullable; REQUIRED → not nullable; REPEATED → a
/// non-nullable `List` whose non-nullable `element`s have the column's type (BigQuery arrays hold
/// no NULLs and are never NULL themselves). JSON columns carry the `arrow.json` extension name;
/// a description becomes the `comment` metadata (Delta's and Spark's key).
pub fn arrow_field(f: &TableField) -> Field {
    let mut meta = HashMap::new();
    if f.ty == FieldType::Json {
        meta.insert(
            JSON_EXTENSION_KEY.to_string(),
            JSON_EXTENSION_NAME.to_string(),
        );
    }
    let value = arrow_value_type(&f.ty);
    let field = match f.mode {
        FieldMode::Nullable => Field::new(&f.name, value, true),
        FieldMode::Required => Field::new(&f.name, value, false),
        FieldMode::Repeated => {
            let element = Field::new(LIST_ELEMENT, value, false).with_metadata(meta.clone());
            meta.clear();
            Field::new(&f.name, DataType::List(Arc::new(element)), false)
        }
    };
    if let Some(d) = &f.description {
        meta.insert("comment".to_string(), d.clone());
    }
    field.with_metadata(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(ty: &str) -> Result<TableField, InvalidTableSchema> {
        let text = format!(r#"[{{"name":"c","type":"{ty}"}}]"#);
        TableSchema::from_json(&text).map(|s| s.fields.into_iter().next().unwrap())
    }

    #[test]
    fn every_type_name_and_alias() {
        let cases = [
            ("STRING", FieldType::String),
            ("BYTES", FieldType::Bytes),
            ("INTEGER", FieldType::Int64),
            ("INT64", FieldType::Int64),
            ("INT", FieldType::Int64),
            ("SMALLINT", FieldType::Int64),
            ("BIGINT", FieldType::Int64),
            ("TINYINT", FieldType::Int64),
            ("BYTEINT", FieldType::Int64),
            ("FLOAT", FieldType::Float64),
            ("FLOAT64", FieldType::Float64),
            ("NUMERIC", FieldType::Numeric),
            ("DECIMAL", FieldType::Numeric),
            ("BIGNUMERIC", FieldType::BigNumeric),
            ("BIGDECIMAL", FieldType::BigNumeric),
            ("BOOLEAN", FieldType::Bool),
            ("BOOL", FieldType::Bool),
            ("TIMESTAMP", FieldType::Timestamp),
            ("DATE", FieldType::Date),
            ("TIME", FieldType::Time),
            ("DATETIME", FieldType::DateTime),
            ("JSON", FieldType::Json),
            ("string", FieldType::String),
            ("Int64", FieldType::Int64),
        ];
        for (name, ty) in cases {
            let f = one(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(f.ty, ty, "{name}");
            assert_eq!(f.mode, FieldMode::Nullable, "{name}");
        }
        for name in ["GEOGRAPHY", "INTERVAL", "RANGE"] {
            let e = one(name).unwrap_err();
            assert_eq!(e.path, "c");
            assert!(e.reason.contains("not supported"), "{e}");
        }
        let e = one("VARCHAR").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("table schema: field `c`: unknown type `VARCHAR`: use one of {KNOWN_TYPES}")
        );
        assert!(
            KNOWN_TYPES.starts_with("STRING, BYTES, INTEGER (INT64"),
            "{KNOWN_TYPES}"
        );
    }

    #[test]
    fn nested_modes_and_both_document_shapes() {
        let text = r#"[
          {"name": "id", "type": "STRING", "mode": "REQUIRED", "description": "the id"},
          {"name": "tags", "type": "STRING", "mode": "REPEATED", "maxLength": "8"},
          {"name": "payload", "type": "RECORD", "policyTags": {},
           "fields": [
             {"name": "n", "type": "INTEGER"},
             {"name": "items", "type": "STRUCT", "mode": "REPEATED",
              "fields": [{"name": "sku", "type": "STRING", "mode": "required"}]}
           ]}
        ]"#;
        let s = TableSchema::from_json(text).unwrap();
        let wrapped = format!(r#"{{"fields": {text}}}"#);
        assert_eq!(TableSchema::from_json(&wrapped).unwrap(), s);
        assert_eq!(s.fields[0].mode, FieldMode::Required);
        assert_eq!(s.fields[0].description.as_deref(), Some("the id"));
        assert_eq!(s.fields[1].mode, FieldMode::Repeated);
        assert_eq!(s.fields[1].max_length, Some(8));
        let FieldType::Record(sub) = &s.fields[2].ty else {
            panic!()
        };
        assert_eq!(sub[0].ty, FieldType::Int64);
        let FieldType::Record(items) = &sub[1].ty else {
            panic!()
        };
        assert_eq!(sub[1].mode, FieldMode::Repeated);
        assert_eq!(
            items[0],
            TableField::new("sku", FieldType::String, FieldMode::Required)
        );
        assert!(s.field("PAYLOAD").is_some());

        let arrow = s.arrow_schema();
        assert!(!arrow.field(0).is_nullable());
        assert_eq!(arrow.field(0).metadata()["comment"], "the id");
        let DataType::List(el) = arrow.field(1).data_type() else {
            panic!()
        };
        assert_eq!(el.name(), LIST_ELEMENT);
        assert!(!el.is_nullable() && !arrow.field(1).is_nullable());
        let DataType::Struct(pf) = arrow.field(2).data_type() else {
            panic!()
        };
        assert!(arrow.field(2).is_nullable());
        assert_eq!(pf[0].data_type(), &DataType::Int64);
        assert!(
            matches!(pf[1].data_type(), DataType::List(e) if matches!(e.data_type(), DataType::Struct(_)))
        );
    }

    #[test]
    fn arrow_types() {
        let cases = [
            ("NUMERIC", DataType::Decimal128(38, 9)),
            ("BIGNUMERIC", DataType::Decimal256(76, 38)),
            ("DATE", DataType::Date32),
            ("TIME", DataType::Time64(TimeUnit::Microsecond)),
            ("DATETIME", DataType::Timestamp(TimeUnit::Microsecond, None)),
            (
                "TIMESTAMP",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            ),
            ("JSON", DataType::Utf8),
            ("BYTES", DataType::Binary),
            ("INT64", DataType::Int64),
            ("FLOAT64", DataType::Float64),
            ("BOOL", DataType::Boolean),
            ("STRING", DataType::Utf8),
        ];
        for (name, dt) in cases {
            let f = arrow_field(&one(name).unwrap());
            assert_eq!(f.data_type(), &dt, "{name}");
            assert!(f.is_nullable());
            let json = f.metadata().get(JSON_EXTENSION_KEY).map(String::as_str);
            assert_eq!(
                json,
                (name == "JSON").then_some(JSON_EXTENSION_NAME),
                "{name}"
            );
        }
        let rep = TableField::new("j", FieldType::Json, FieldMode::Repeated);
        let DataType::List(el) = arrow_field(&rep).data_type().clone() else {
            panic!()
        };
        assert_eq!(el.metadata()[JSON_EXTENSION_KEY], JSON_EXTENSION_NAME);
    }

    #[test]
    fn errors_name_the_field_path() {
        let cases: &[(&str, &str, &str)] = &[
            ("{", "$", "EOF"),
            ("5", "$", "expected a JSON array"),
            (r#"{"x":[]}"#, "$", "expected a JSON array"),
            ("[]", "$", "at least one column"),
            ("[5]", "[0]", "must be a JSON object"),
            (r#"[{"type":"STRING"}]"#, "[0]", "missing string `name`"),
            (
                r#"[{"name":"a-b","type":"STRING"}]"#,
                "a-b",
                "only [a-zA-Z0-9_]",
            ),
            (r#"[{"name":"","type":"STRING"}]"#, "", "empty column name"),
            (r#"[{"name":"a"}]"#, "a", "missing string `type`"),
            (
                r#"[{"name":"a","type":"STRING","mode":"OPTIONAL"}]"#,
                "a",
                "unknown mode `OPTIONAL`",
            ),
            (
                r#"[{"name":"a","type":"STRING"},{"name":"A","type":"INT64"}]"#,
                "A",
                "duplicate column name (same as `a`",
            ),
            (
                r#"[{"name":"r","type":"RECORD"}]"#,
                "r",
                "non-empty `fields`",
            ),
            (
                r#"[{"name":"r","type":"RECORD","fields":[]}]"#,
                "r",
                "non-empty `fields`",
            ),
            (
                r#"[{"name":"s","type":"STRING","fields":[{"name":"x","type":"INT64"}]}]"#,
                "s",
                "`fields` given for a STRING column",
            ),
            (
                r#"[{"name":"r","type":"RECORD","fields":[{"name":"q","type":"RECORD","fields":[{"name":"b c","type":"INT64"}]}]}]"#,
                "r.q.b c",
                "only [a-zA-Z0-9_]",
            ),
            (
                r#"[{"name":"r","type":"RECORD","fields":[{"name":"g","type":"GEOGRAPHY"}]}]"#,
                "r.g",
                "GEOGRAPHY is not supported",
            ),
            (
                r#"[{"name":"r","type":"RECORD","fields":[7]}]"#,
                "r[0]",
                "must be a JSON object",
            ),
            (
                r#"[{"name":"n","type":"NUMERIC","precision":"10"}]"#,
                "n",
                "parameterized",
            ),
            (
                r#"[{"name":"n","type":"INT64","maxLength":"10"}]"#,
                "n",
                "STRING and BYTES only",
            ),
            (
                r#"[{"name":"n","type":"STRING","maxLength":"0"}]"#,
                "n",
                "positive integer",
            ),
        ];
        for (text, path, reason) in cases {
            let e = TableSchema::from_json(text).unwrap_err();
            assert_eq!(&e.path, path, "{text}: {e}");
            assert!(e.reason.contains(reason), "{text}: {e}");
        }
        let long = "a".repeat(301);
        let e = TableSchema::from_json(&format!(r#"[{{"name":"{long}","type":"STRING"}}]"#))
            .unwrap_err();
        assert!(e.reason.contains("longer than 300"), "{e}");
    }
}
