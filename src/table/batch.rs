//! Messages → rows of an Arrow [`RecordBatch`], per SPEC §4.3 (modes), §4.5 (metadata) and §4.6
//! (unknown fields).
//!
//! A message is converted in full into [`Cell`]s before anything is appended, so a message that
//! fails leaves the batch exactly as it was: bad messages fail alone.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Decimal256Array,
    Float64Array, Int64Array, ListArray, RecordBatch, StringArray, StructArray,
    Time64MicrosecondArray, TimestampMicrosecondArray,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Fields, Schema, SchemaRef};
use serde_json::Value;

use super::convert::{check_json_text, convert_scalar, kind, timestamp_from_micros, Cell};
use super::schema::{
    arrow_field, arrow_value_type, FieldMode, FieldType, SchemaError, TableField, TableSchema,
};
use super::topic::{
    check_compatibility, column_desc, CompatError, CompatRule, Incompatibility, TopicRows,
};
use crate::encode::topic::TopicSchema;
use crate::message::Message;

/// How message fields become columns (SPEC §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchemaMode {
    /// Neither flag: the payload goes to the `data` column (BYTES, STRING or JSON).
    #[default]
    NoSchema,
    /// `use_table_schema`: the payload is a JSON object whose top-level keys are columns.
    UseTableSchema,
    /// `use_topic_schema`: the payload is a datum of the topic's Avro schema (JSON or BINARY)
    /// whose fields are columns (SPEC §4.4). Build with [`RowBuilder::with_topic_schema`].
    UseTopicSchema,
}

/// The `BigQueryConfig` settings that shape rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowOptions {
    pub mode: SchemaMode,
    /// Write `subscription_name`, `message_id`, `publish_time`, `attributes` (§4.5).
    pub write_metadata: bool,
    /// Drop message fields that are not columns instead of failing the message (§4.6).
    pub drop_unknown_fields: bool,
    /// Written to `subscription_name`: the full resource name `projects/{p}/subscriptions/{s}`
    /// (SPEC Q7).
    pub subscription_name: String,
}

/// What kind of rule a message broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowErrorKind {
    /// A message field that is not a column, without `drop_unknown_fields`.
    UnknownField,
    /// A REQUIRED column absent from the message or `null`.
    MissingRequired,
    /// A value that does not convert to its column's type (or a payload that is not JSON).
    Invalid,
}

/// Why one message cannot become a row. It is never retryable: the same message fails the same
/// way, so it is nacked until it is dead-lettered (SPEC §4.6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message {message_id:?}: field `{field}`: {reason}")]
pub struct RowError {
    pub message_id: String,
    /// Dotted path of the field (`payload.items[2].sku`), or `$` for the payload as a whole.
    pub field: String,
    pub kind: RowErrorKind,
    pub reason: String,
}

/// A field-level failure before the message id is attached.
pub(super) struct Fail {
    pub(super) field: String,
    pub(super) kind: RowErrorKind,
    pub(super) reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Fail {
    Fail {
        field: field.into(),
        kind: RowErrorKind::Invalid,
        reason: reason.into(),
    }
}

/// Where a column's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Top-level message field number `n` (use_table_schema).
    Field(usize),
    /// The payload (no-schema mode).
    Data,
    SubscriptionName,
    MessageId,
    PublishTime,
    Attributes,
    /// A column nothing writes in this mode: NULL (or an empty list).
    Null,
}

/// The metadata columns of §4.5 and the types each may have.
const METADATA: [(&str, Source, &[FieldType]); 4] = [
    (
        "subscription_name",
        Source::SubscriptionName,
        &[FieldType::String],
    ),
    ("message_id", Source::MessageId, &[FieldType::String]),
    ("publish_time", Source::PublishTime, &[FieldType::Timestamp]),
    (
        "attributes",
        Source::Attributes,
        &[FieldType::String, FieldType::Json],
    ),
];
const DATA_TYPES: &[FieldType] = &[FieldType::Bytes, FieldType::String, FieldType::Json];

/// Whether a column named `name` is filled with metadata (§4.5): only with `write_metadata`,
/// names compared case-insensitively.
pub(super) fn is_metadata_column(name: &str, write_metadata: bool) -> bool {
    write_metadata
        && METADATA
            .iter()
            .any(|(n, _, _)| n.eq_ignore_ascii_case(name))
}

/// The column names SPEC §4.5 forbids in a topic schema when `write_metadata` and
/// `use_topic_schema` are both on: each metadata column, snake_case and camelCase.
pub const METADATA_NAMES: [&str; 7] = crate::encode::topic::RESERVED_METADATA_FIELDS;

/// The startup check of SPEC §4.5 (name conflicts) for a topic schema's top-level field names.
/// Only applies with `write_metadata` and `use_topic_schema`; names compare case-insensitively,
/// like columns (Q14). A field named `data` is allowed with a warning (Q7); the warnings are
/// returned for the caller to log.
pub fn check_metadata_name_conflicts<'a>(
    write_metadata: bool,
    use_topic_schema: bool,
    topic_fields: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<String>, SchemaError> {
    let mut warnings = Vec::new();
    if !(write_metadata && use_topic_schema) {
        return Ok(warnings);
    }
    for name in topic_fields {
        if let Some(m) = METADATA_NAMES.iter().find(|m| m.eq_ignore_ascii_case(name)) {
            return Err(SchemaError::new(
                name,
                format!(
                    "the topic schema has a field named like the metadata column `{m}`, which \
                     write_metadata writes; rename the field or turn write_metadata off"
                ),
            ));
        }
        if name.eq_ignore_ascii_case("data") {
            warnings.push(format!(
                "topic schema field `{name}` shares its name with the metadata `data` column"
            ));
        }
    }
    Ok(warnings)
}

/// Builds one Arrow [`RecordBatch`] from messages, a row per message.
#[derive(Debug)]
pub struct RowBuilder {
    opts: RowOptions,
    /// Every output column, in output order.
    columns: Vec<TableField>,
    sources: Vec<Source>,
    /// The columns fed from message fields (use_table_schema, use_topic_schema), indexed by
    /// `Source::Field`.
    message_fields: Vec<TableField>,
    /// use_topic_schema: the topic schema and how its fields feed `message_fields`.
    topic: Option<TopicRows>,
    schema: SchemaRef,
    /// Converted values, one vector per output column, one cell per row.
    cells: Vec<Vec<Cell>>,
    rows: usize,
}

impl RowBuilder {
    /// Resolve the columns of `schema` for `opts` (a startup check; errors name the column).
    ///
    /// * With `write_metadata`, columns named like a metadata column (case-insensitively) are
    ///   filled with metadata and must have its type; metadata columns the schema lacks are
    ///   appended as NULLABLE `subscription_name STRING, message_id STRING, publish_time
    ///   TIMESTAMP, attributes STRING`.
    /// * No-schema mode: the `data` column (BYTES, STRING or JSON) takes the payload; appended as
    ///   NULLABLE BYTES when the schema lacks it, so an empty schema is valid. Other columns are
    ///   written NULL and must not be REQUIRED.
    /// * use_table_schema: every other column is fed from the message field of its name.
    /// * use_topic_schema needs the topic schema: see [`RowBuilder::with_topic_schema`].
    pub fn new(schema: &TableSchema, opts: RowOptions) -> Result<RowBuilder, SchemaError> {
        if opts.mode == SchemaMode::UseTopicSchema {
            return Err(SchemaError::new(
                "$",
                "use_topic_schema needs the topic schema: build with RowBuilder::with_topic_schema",
            ));
        }
        Self::resolve(schema, opts)
    }

    /// use_topic_schema (SPEC §4.4): `opts.mode` must be [`SchemaMode::UseTopicSchema`]. Checks
    /// at once the table for this mode (as [`RowBuilder::new`]), the topic schema against it
    /// ([`check_compatibility`]) and the metadata name rule (§4.5); the error lists every
    /// problem as a diff. Warnings (a topic field named `data`, Q7) are logged.
    pub fn with_topic_schema(
        schema: &TableSchema,
        opts: RowOptions,
        topic: &TopicSchema,
    ) -> Result<RowBuilder, CompatError> {
        let mut problems = Vec::new();
        if opts.mode != SchemaMode::UseTopicSchema {
            problems.push(Incompatibility {
                path: "$".into(),
                topic: "-".into(),
                table: "-".into(),
                rule: CompatRule::Table,
                reason: format!(
                    "with_topic_schema needs SchemaMode::UseTopicSchema, not {:?}",
                    opts.mode
                ),
            });
        }
        let plan = check_compatibility(
            topic.schema(),
            schema,
            opts.drop_unknown_fields,
            opts.write_metadata,
        );
        let builder = Self::resolve(schema, opts);
        if let Err(e) = &builder {
            let table = schema
                .field(&e.path)
                .map_or_else(|| "-".to_string(), column_desc);
            problems.push(Incompatibility {
                path: e.path.clone(),
                topic: "-".into(),
                table,
                rule: CompatRule::Table,
                reason: e.reason.clone(),
            });
        }
        match plan {
            Err(e) => problems.extend(e.problems),
            Ok(plan) if problems.is_empty() => {
                for w in plan.warnings() {
                    tracing::warn!("{w}");
                }
                let mut builder = builder.expect("no problems");
                debug_assert!(plan.columns().eq(builder.message_fields.iter()));
                builder.topic = Some(TopicRows::new(topic.clone(), plan));
                return Ok(builder);
            }
            Ok(_) => {}
        }
        Err(CompatError { problems })
    }

    fn resolve(schema: &TableSchema, opts: RowOptions) -> Result<RowBuilder, SchemaError> {
        let mut columns = Vec::new();
        let mut sources = Vec::new();
        let mut message_fields = Vec::new();
        let mut have_meta = [false; 4];
        let mut have_data = false;
        for f in &schema.fields {
            let meta = METADATA
                .iter()
                .position(|(n, _, _)| opts.write_metadata && n.eq_ignore_ascii_case(&f.name));
            let source = if let Some(i) = meta {
                let (name, source, types) = &METADATA[i];
                check_column(f, name, types)?;
                have_meta[i] = true;
                *source
            } else if opts.mode == SchemaMode::NoSchema && f.name.eq_ignore_ascii_case("data") {
                check_column(f, "data", DATA_TYPES)?;
                have_data = true;
                Source::Data
            } else if matches!(
                opts.mode,
                SchemaMode::UseTableSchema | SchemaMode::UseTopicSchema
            ) {
                message_fields.push(f.clone());
                Source::Field(message_fields.len() - 1)
            } else {
                if f.mode == FieldMode::Required {
                    return Err(SchemaError::new(
                        &f.name,
                        "REQUIRED, but in no-schema mode only `data` and the metadata columns are \
                         written; make it NULLABLE",
                    ));
                }
                Source::Null
            };
            columns.push(f.clone());
            sources.push(source);
        }
        if opts.mode == SchemaMode::NoSchema && !have_data {
            columns.push(TableField::new(
                "data",
                FieldType::Bytes,
                FieldMode::Nullable,
            ));
            sources.push(Source::Data);
        }
        if opts.write_metadata {
            for (i, (name, source, types)) in METADATA.iter().enumerate() {
                if !have_meta[i] {
                    columns.push(TableField::new(
                        *name,
                        types[0].clone(),
                        FieldMode::Nullable,
                    ));
                    sources.push(*source);
                }
            }
        }
        let arrow = Schema::new(columns.iter().map(arrow_field).collect::<Vec<_>>());
        Ok(RowBuilder {
            cells: vec![Vec::new(); columns.len()],
            opts,
            columns,
            sources,
            message_fields,
            topic: None,
            schema: Arc::new(arrow),
            rows: 0,
        })
    }

    /// The Arrow schema of the batches [`RowBuilder::finish`] returns.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The output columns (the table schema plus appended metadata/`data` columns).
    pub fn columns(&self) -> &[TableField] {
        &self.columns
    }

    /// Rows appended since the last [`RowBuilder::finish`].
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Append `msg` as one row, or fail with the field and the rule it broke; on failure the
    /// builder is unchanged.
    pub fn append(&mut self, msg: &Message) -> Result<(), RowError> {
        let row = self.convert(msg).map_err(|f| RowError {
            message_id: msg.message_id.clone(),
            field: f.field,
            kind: f.kind,
            reason: f.reason,
        })?;
        for (col, cell) in self.cells.iter_mut().zip(row) {
            col.push(cell);
        }
        self.rows += 1;
        Ok(())
    }

    fn convert(&self, msg: &Message) -> Result<Vec<Cell>, Fail> {
        let fields = if let Some(topic) = &self.topic {
            topic.convert(msg)?
        } else if self.opts.mode == SchemaMode::UseTableSchema {
            let v: Value = serde_json::from_slice(&msg.data)
                .map_err(|e| invalid("$", format!("message data is not valid JSON: {e}")))?;
            let Value::Object(obj) = v else {
                return Err(invalid(
                    "$",
                    format!("message data must be a JSON object, got {}", kind(&v)),
                ));
            };
            convert_record(
                &self.message_fields,
                &obj,
                "",
                self.opts.drop_unknown_fields,
            )?
        } else {
            Vec::new()
        };
        let mut fields = fields.into_iter();
        let mut row = Vec::with_capacity(self.columns.len());
        for (col, source) in self.columns.iter().zip(&self.sources) {
            let cell = match source {
                Source::Field(_) => fields.next().expect("one cell per message field"),
                Source::Data => data_cell(&col.ty, &msg.data)?,
                Source::SubscriptionName => Cell::Str(self.opts.subscription_name.clone()),
                Source::MessageId => Cell::Str(msg.message_id.clone()),
                Source::PublishTime => Cell::Micros(
                    timestamp_from_micros(msg.publish_time_micros)
                        .map_err(|e| invalid(&col.name, e))?,
                ),
                Source::Attributes => Cell::Str(attributes_json(msg)),
                Source::Null if col.mode == FieldMode::Repeated => Cell::List(Vec::new()),
                Source::Null => Cell::Null,
            };
            row.push(cell);
        }
        Ok(row)
    }

    /// The rows appended so far as a batch; the builder starts empty again.
    pub fn finish(&mut self) -> RecordBatch {
        let arrays: Vec<ArrayRef> = self
            .columns
            .iter()
            .zip(self.cells.iter_mut())
            .map(|(f, cells)| build_column(f, std::mem::take(cells)))
            .collect();
        self.rows = 0;
        RecordBatch::try_new(self.schema.clone(), arrays)
            .expect("cells were checked against the schema when appended")
    }
}

fn check_column(f: &TableField, name: &str, types: &[FieldType]) -> Result<(), SchemaError> {
    if !types.contains(&f.ty) || f.mode == FieldMode::Repeated {
        let want: Vec<_> = types.iter().map(FieldType::name).collect();
        return Err(SchemaError::new(
            &f.name,
            format!(
                "the `{name}` column must be {} and not REPEATED, not {} {:?}",
                want.join(" or "),
                f.ty.name(),
                f.mode
            ),
        ));
    }
    Ok(())
}

/// The `attributes` metadata value: a JSON object of the attributes plus `ordering_key` when the
/// message has one (SPEC Q7; the ordering key wins over an attribute of that name); `{}` when empty.
fn attributes_json(msg: &Message) -> String {
    if msg.ordering_key.is_empty() {
        return serde_json::to_string(&msg.attributes).expect("string map");
    }
    let mut all: BTreeMap<&str, &str> = msg
        .attributes
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    all.insert("ordering_key", &msg.ordering_key);
    serde_json::to_string(&all).expect("string map")
}

/// The `data` column in no-schema mode (§4.3, Q10): BYTES as-is; STRING must be UTF-8; JSON must
/// be UTF-8 JSON text.
fn data_cell(ty: &FieldType, data: &[u8]) -> Result<Cell, Fail> {
    match ty {
        FieldType::Bytes => Ok(Cell::Bytes(data.to_vec())),
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
            Ok(Cell::Str(s.to_string()))
        }
        _ => unreachable!("checked by RowBuilder::new"),
    }
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Match the keys of `obj` to `fields` (exact name first, then case-insensitively, Q14) and
/// convert each field's value; one cell per field, in schema order.
fn convert_record(
    fields: &[TableField],
    obj: &serde_json::Map<String, Value>,
    prefix: &str,
    drop_unknown: bool,
) -> Result<Vec<Cell>, Fail> {
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
                    field: join(prefix, k),
                    kind: RowErrorKind::UnknownField,
                    reason: format!(
                        "unknown field: column `{}` is already given by a key of exactly its name",
                        fields[i].name
                    ),
                })
            }
            None => {
                return Err(Fail {
                    field: join(prefix, k),
                    kind: RowErrorKind::UnknownField,
                    reason: "unknown field: not a column of the table (drop_unknown_fields is off)"
                        .to_string(),
                })
            }
        }
    }
    fields
        .iter()
        .zip(slots)
        .map(|(f, v)| convert_field(f, v, &join(prefix, &f.name), drop_unknown))
        .collect()
}

fn convert_field(
    f: &TableField,
    v: Option<&Value>,
    path: &str,
    drop_unknown: bool,
) -> Result<Cell, Fail> {
    match (f.mode, v) {
        // A REPEATED column absent or null is an empty array (BigQuery arrays are never NULL).
        (FieldMode::Repeated, None | Some(Value::Null)) => Ok(Cell::List(Vec::new())),
        (FieldMode::Repeated, Some(Value::Array(items))) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let p = format!("{path}[{i}]");
                if item.is_null() {
                    Err(invalid(p, "REPEATED: array elements cannot be NULL"))
                } else {
                    convert_value(f, item, &p, drop_unknown)
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Cell::List),
        (FieldMode::Repeated, Some(other)) => Err(invalid(
            path,
            format!("REPEATED expects an array, got {}", kind(other)),
        )),
        (FieldMode::Nullable, None | Some(Value::Null)) => Ok(Cell::Null),
        (FieldMode::Required, None | Some(Value::Null)) => Err(Fail {
            field: path.to_string(),
            kind: RowErrorKind::MissingRequired,
            reason: format!(
                "REQUIRED column is {}",
                if v.is_none() { "missing" } else { "null" }
            ),
        }),
        (_, Some(v)) => convert_value(f, v, path, drop_unknown),
    }
}

fn convert_value(f: &TableField, v: &Value, path: &str, drop_unknown: bool) -> Result<Cell, Fail> {
    match (&f.ty, v) {
        (FieldType::Record(sub), Value::Object(obj)) => {
            convert_record(sub, obj, path, drop_unknown).map(Cell::Struct)
        }
        (ty, v) => convert_scalar(ty, v, f.max_length).map_err(|e| invalid(path, e)),
    }
}

// ---- cells → Arrow arrays ----------------------------------------------------------------------

fn build_column(f: &TableField, cells: Vec<Cell>) -> ArrayRef {
    if f.mode != FieldMode::Repeated {
        return build_values(&f.ty, cells);
    }
    let DataType::List(element) = arrow_field(f).data_type().clone() else {
        unreachable!("REPEATED is a list")
    };
    let mut offsets = Vec::with_capacity(cells.len() + 1);
    offsets.push(0i32);
    let mut values = Vec::new();
    let mut valid = Vec::with_capacity(cells.len());
    for c in cells {
        match c {
            Cell::List(items) => {
                values.extend(items);
                valid.push(true);
            }
            // Only under a NULL record: the list is NULL because its parent is.
            Cell::Null => valid.push(false),
            other => unreachable!("REPEATED cell {other:?}"),
        }
        offsets.push(i32::try_from(values.len()).expect("fewer than 2^31 list elements"));
    }
    let nulls = valid.contains(&false).then(|| NullBuffer::from(valid));
    let values = build_values(&f.ty, values);
    Arc::new(ListArray::new(
        element,
        OffsetBuffer::new(offsets.into()),
        values,
        nulls,
    ))
}

macro_rules! prim {
    ($cells:expr, $arr:ty, $pat:path) => {
        <$arr>::from_iter($cells.into_iter().map(|c| match c {
            $pat(v) => Some(v),
            Cell::Null => None,
            other => unreachable!("{other:?}"),
        }))
    };
}

fn build_values(ty: &FieldType, cells: Vec<Cell>) -> ArrayRef {
    match ty {
        FieldType::String | FieldType::Json => Arc::new(prim!(cells, StringArray, Cell::Str)),
        FieldType::Bytes => Arc::new(prim!(cells, BinaryArray, Cell::Bytes)),
        FieldType::Int64 => Arc::new(prim!(cells, Int64Array, Cell::Int)),
        FieldType::Float64 => Arc::new(prim!(cells, Float64Array, Cell::Float)),
        FieldType::Bool => Arc::new(prim!(cells, BooleanArray, Cell::Bool)),
        FieldType::Date => Arc::new(prim!(cells, Date32Array, Cell::Date)),
        FieldType::Time => Arc::new(prim!(cells, Time64MicrosecondArray, Cell::Time)),
        FieldType::DateTime => Arc::new(prim!(cells, TimestampMicrosecondArray, Cell::Micros)),
        FieldType::Timestamp => {
            Arc::new(prim!(cells, TimestampMicrosecondArray, Cell::Micros).with_timezone("UTC"))
        }
        FieldType::Numeric => Arc::new(
            prim!(cells, Decimal128Array, Cell::Numeric)
                .with_precision_and_scale(38, 9)
                .expect("valid precision"),
        ),
        FieldType::BigNumeric => Arc::new(
            prim!(cells, Decimal256Array, Cell::BigNumeric)
                .with_precision_and_scale(76, 38)
                .expect("valid precision"),
        ),
        FieldType::Record(sub) => {
            let DataType::Struct(fields) = arrow_value_type(ty) else {
                unreachable!()
            };
            let mut children: Vec<Vec<Cell>> = vec![Vec::with_capacity(cells.len()); sub.len()];
            let mut valid = Vec::with_capacity(cells.len());
            for c in cells {
                match c {
                    Cell::Struct(vals) => {
                        for (child, v) in children.iter_mut().zip(vals) {
                            child.push(v);
                        }
                        valid.push(true);
                    }
                    Cell::Null => {
                        for child in &mut children {
                            child.push(Cell::Null);
                        }
                        valid.push(false);
                    }
                    other => unreachable!("RECORD cell {other:?}"),
                }
            }
            let nulls = valid.contains(&false).then(|| NullBuffer::from(valid));
            let arrays = sub
                .iter()
                .zip(children)
                .map(|(f, c)| build_column(f, c))
                .collect();
            Arc::new(StructArray::new(Fields::clone(&fields), arrays, nulls))
        }
    }
}
