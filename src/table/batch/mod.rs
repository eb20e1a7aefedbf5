//! Messages → rows of an Arrow [`RecordBatch`], per docs/contract.md §4.3 (modes), §4.5 (metadata) and §4.6
//! (unknown fields).
//!
//! Values go straight into typed column builders ([`super::columns`]); a message that fails
//! half-way is truncated away again, so it leaves the batch exactly as it was: bad messages fail
//! alone. JSON payloads take a fast path first ([`super::fast`]: no `serde_json::Value`, no error
//! texts); a payload it does not vouch for, valid or not, is converted again by the reference path
//! here, which gives every error its field path and rule.
//!
//! This file holds [`RowBuilder`]: the columns resolved from the schema and the mode, and a row
//! appended per message. `batch/cells.rs` holds what goes into the builders on the reference
//! path: JSON records field by field, the `data` column, the `attributes` value.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Schema, SchemaRef};
use serde_json::Value;

use super::columns::Column;
use super::convert::{kind, timestamp_from_micros};
use super::error::Fail;
pub use super::error::{RowError, RowErrorKind};
use super::metadata::METADATA_COLUMNS;
pub use super::metadata::{check_metadata_name_conflicts, METADATA_NAMES};
use super::schema::{
    arrow_field, FieldMode, FieldType, InvalidTableSchema, TableField, TableSchema,
};
use super::topic::{
    check_compatibility, column_desc, CompatError, CompatRule, Incompatibility, TopicReader,
    TopicRows,
};
use crate::avro::{TopicSchema, TopicSchemas};
use crate::message::Message;

mod cells;

use cells::{convert_record, data_cell, invalid, push_cell, write_attributes, Path};

/// How message fields become columns (docs/contract.md §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchemaMode {
    /// Neither flag: the payload goes to the `data` column (BYTES, STRING or JSON).
    #[default]
    NoSchema,
    /// `use_table_schema`: the payload is a JSON object whose top-level keys are columns.
    UseTableSchema,
    /// `use_topic_schema`: the payload is a datum of the topic's Avro schema (JSON or BINARY)
    /// whose fields are columns (docs/contract.md §4.4). Build with [`RowBuilder::with_topic_schema`].
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
    /// (docs/contract.md §6 Q7).
    pub subscription_name: String,
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
        METADATA_COLUMNS[0],
        Source::SubscriptionName,
        &[FieldType::String],
    ),
    (METADATA_COLUMNS[1], Source::MessageId, &[FieldType::String]),
    (
        METADATA_COLUMNS[2],
        Source::PublishTime,
        &[FieldType::Timestamp],
    ),
    (
        METADATA_COLUMNS[3],
        Source::Attributes,
        &[FieldType::String, FieldType::Json],
    ),
];
const DATA_TYPES: &[FieldType] = &[FieldType::Bytes, FieldType::String, FieldType::Json];

/// Columns subsink appends to the table when its schema lacks them — the `data` column in
/// no-schema mode, the metadata columns with `write_metadata` — said in one line, to log at
/// startup at INFO (issue 44: one WARN line per column on every run was noise for a choice the
/// user made). Kept deliberately (the table then holds what Pub/Sub would write), but a BigQuery
/// destination refuses such a subscription: Pub/Sub requires those columns to exist. `None` when
/// the table has them all.
pub fn columns_added(schema: &TableSchema, opts: &RowOptions) -> Option<String> {
    let has = |name: &str| {
        schema
            .fields
            .iter()
            .any(|f| f.name.eq_ignore_ascii_case(name))
    };
    let mut added = Vec::new();
    if opts.mode == SchemaMode::NoSchema && !has("data") {
        added.push(format!(
            "`data` {} (no-schema mode writes the payload there)",
            FieldType::Bytes.name()
        ));
    }
    if opts.write_metadata {
        let missing: Vec<String> = METADATA
            .iter()
            .filter(|(name, _, _)| !has(name))
            .map(|(name, _, types)| format!("`{name}` {}", types[0].name()))
            .collect();
        if !missing.is_empty() {
            added.push(format!("{} (writeMetadata)", missing.join(", ")));
        }
    }
    if added.is_empty() {
        return None;
    }
    Some(format!(
        "the table schema lacks columns subsink writes; it adds them as NULLABLE: {}; a BigQuery \
         subscription would be refused until the table has them",
        added.join("; ")
    ))
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
    topic: Option<TopicReader>,
    schema: SchemaRef,
    /// The column builders: first one per message field (in `message_fields` order, so a record
    /// converts into a slice of them), then one per other column in output order.
    builders: Vec<Column>,
    /// Output column `i` is `builders[slot[i]]`.
    slot: Vec<usize>,
    /// Whether JSON payloads take the fast path (use_table_schema, with plain column names).
    fast: bool,
    /// Rows the fast path converted (tests check that it is used).
    #[cfg(test)]
    pub(super) fast_rows: usize,
    /// The output columns that are not message fields, in output order.
    others: Vec<usize>,
    /// Change data capture: the builders of the pseudo-columns and of the key, checked per row.
    changes: Option<ChangeColumns>,
    rows: usize,
    /// The table schema and topic schemas it was resolved from, to resolve again with columns
    /// added while running ([`RowBuilder::with_columns`]).
    origin: Arc<(TableSchema, Option<TopicSchemas>)>,
}

/// Change data capture (docs/contract.md §4.9): where a row's change type, sequence number and
/// key are, as indices of message-field builders.
#[derive(Debug, Clone)]
struct ChangeColumns {
    change_type: usize,
    sequence: usize,
    key: Vec<usize>,
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
    pub fn new(schema: &TableSchema, opts: RowOptions) -> Result<RowBuilder, InvalidTableSchema> {
        if opts.mode == SchemaMode::UseTopicSchema {
            return Err(InvalidTableSchema::new(
                "$",
                "use_topic_schema needs the topic schema: build with RowBuilder::with_topic_schema",
            ));
        }
        Self::resolve(schema, opts)
    }

    /// use_topic_schema (docs/contract.md §4.4): `opts.mode` must be [`SchemaMode::UseTopicSchema`]. Checks
    /// at once the table for this mode (as [`RowBuilder::new`]), the topic schema against it
    /// ([`check_compatibility`]) and the metadata name rule (§4.5); the error lists every
    /// problem as a diff. Warnings (a topic field named `data`, Q7) are logged.
    pub fn with_topic_schema(
        schema: &TableSchema,
        opts: RowOptions,
        topic: &TopicSchema,
    ) -> Result<RowBuilder, CompatError> {
        Self::with_topic_schemas(schema, opts, &TopicSchemas::one(topic.clone()))
    }

    /// [`RowBuilder::with_topic_schema`] for a topic whose schema has revisions: each message is
    /// read with its revision's schema (its fallback when the revision is unknown), so every
    /// revision is checked against the table; a problem of one revision names it.
    pub fn with_topic_schemas(
        schema: &TableSchema,
        opts: RowOptions,
        topics: &TopicSchemas,
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
        let (drop_unknown, write_metadata) = (opts.drop_unknown_fields, opts.write_metadata);
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
        let mut plans = Vec::new();
        for (revision, topic) in topics.all() {
            match check_compatibility(topic.schema(), schema, drop_unknown, write_metadata) {
                Ok(plan) => plans.push((revision, topic, plan)),
                Err(e) => problems.extend(e.problems.into_iter().map(|mut p| {
                    if let Some(id) = &revision {
                        p.reason = format!("schema revision {id}: {}", p.reason);
                    }
                    p
                })),
            }
        }
        if !problems.is_empty() {
            return Err(CompatError { problems });
        }
        let mut builder = builder.expect("no problems");
        builder.origin = Arc::new((schema.clone(), Some(topics.clone())));
        let mut fallback = None;
        let mut revisions = BTreeMap::new();
        for (revision, topic, plan) in plans {
            for w in plan.warnings() {
                match &revision {
                    Some(id) => tracing::debug!("schema revision {id}: {w}"),
                    None => tracing::warn!("{w}"),
                }
            }
            debug_assert!(plan.columns().eq(builder.message_fields.iter()));
            let rows = TopicRows::new(topic, plan);
            match revision {
                None => fallback = Some(rows),
                Some(id) => {
                    revisions.insert(id, rows);
                }
            }
        }
        builder.topic = Some(TopicReader::new(
            fallback.expect("the fallback is always checked"),
            revisions,
            topics.clone(),
            schema.clone(),
            drop_unknown,
            write_metadata,
        ));
        Ok(builder)
    }

    fn resolve(schema: &TableSchema, opts: RowOptions) -> Result<RowBuilder, InvalidTableSchema> {
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
                    return Err(InvalidTableSchema::new(
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
        let mut builders: Vec<Column> = message_fields.iter().map(Column::new).collect();
        let slot = columns
            .iter()
            .zip(&sources)
            .map(|(c, source)| match source {
                Source::Field(n) => *n,
                _ => {
                    builders.push(Column::new(c));
                    builders.len() - 1
                }
            })
            .collect();
        let fast =
            opts.mode == SchemaMode::UseTableSchema && super::fast::plain_names(&message_fields);
        let others = (0..columns.len())
            .filter(|&i| !matches!(sources[i], Source::Field(_)))
            .collect();
        Ok(RowBuilder {
            opts,
            columns,
            sources,
            message_fields,
            topic: None,
            schema: Arc::new(arrow),
            builders,
            slot,
            fast,
            #[cfg(test)]
            fast_rows: 0,
            others,
            changes: None,
            rows: 0,
            origin: Arc::new((schema.clone(), None)),
        })
    }

    /// The same mapping over the table schema with `added` columns after its own (columns added
    /// to the table while running: docs/destinations.md, "Schema changes while running"), as
    /// [`RowBuilder::new`] or [`RowBuilder::with_topic_schemas`] would resolve it at startup.
    /// Change data capture carries over: the table's own columns keep their places (the new ones
    /// come after them), so its key, `_CHANGE_TYPE` and `_CHANGE_SEQUENCE_NUMBER` columns are
    /// where [`RowBuilder::check_changes`] found them.
    pub fn with_columns(&self, added: &[TableField]) -> Result<RowBuilder, String> {
        let (table, topics) = &*self.origin;
        let mut schema = table.clone();
        schema.fields.extend(added.iter().cloned());
        let mut rows = match topics {
            Some(t) => {
                Self::with_topic_schemas(&schema, self.opts.clone(), t).map_err(|e| e.to_string())
            }
            None => Self::resolve(&schema, self.opts.clone()).map_err(|e| e.to_string()),
        }?;
        if let Some(c) = &self.changes {
            let same = |i: &usize| {
                let name = |r: &RowBuilder| r.message_fields.get(*i).map(|f| f.name.clone());
                name(self).is_some() && name(self) == name(&rows)
            };
            if !(same(&c.change_type) && same(&c.sequence) && c.key.iter().all(same)) {
                return Err("the change data capture columns moved".into());
            }
            rows.changes = Some(c.clone());
        }
        Ok(rows)
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

    /// The same builder without the fast path: every message through the reference conversion
    /// (for the property test that holds the fast path to it).
    #[cfg(test)]
    pub(super) fn reference_only(mut self) -> RowBuilder {
        self.fast = false;
        self
    }

    /// An empty builder with the same columns and options: one per thread converting messages
    /// in parallel (see [`RowBuilder::append_all`]).
    pub fn fresh(&self) -> RowBuilder {
        let mut builders: Vec<Column> = self.message_fields.iter().map(Column::new).collect();
        builders.extend(self.others.iter().map(|&i| Column::new(&self.columns[i])));
        RowBuilder {
            opts: self.opts.clone(),
            columns: self.columns.clone(),
            sources: self.sources.clone(),
            message_fields: self.message_fields.clone(),
            topic: self.topic.clone(),
            schema: self.schema.clone(),
            builders,
            slot: self.slot.clone(),
            fast: self.fast,
            #[cfg(test)]
            fast_rows: 0,
            others: self.others.clone(),
            changes: self.changes.clone(),
            rows: 0,
            origin: self.origin.clone(),
        }
    }

    /// [`RowBuilder::append`] each message in turn; the ones that fail are left out and returned
    /// with their index. With [`RowBuilder::fresh`] and [`RowBuilder::finish`], converts a chunk
    /// of messages into a record batch on a blocking thread, so conversion can use every core:
    ///
    /// ```ignore
    /// let mut rows = template.fresh();
    /// let (batch, failed) = tokio::task::spawn_blocking(move || {
    ///     let failed = rows.append_all(chunk.iter().map(|r| &r.msg));
    ///     (rows.finish(), failed)
    /// }).await?;
    /// ```
    pub fn append_all<'a>(
        &mut self,
        msgs: impl IntoIterator<Item = &'a Message>,
    ) -> Vec<(usize, RowError)> {
        msgs.into_iter()
            .enumerate()
            .filter_map(|(i, m)| self.append(m).err().map(|e| (i, e)))
            .collect()
    }

    /// Append `msg` as one row, or fail with the field and the rule it broke; on failure the
    /// builder is unchanged.
    pub fn append(&mut self, msg: &Message) -> Result<(), RowError> {
        let fast = self.fast && {
            let done = self.append_fast(msg).is_some();
            if !done {
                self.truncate(); // what the fast path appended before it gave up
            }
            done
        };
        #[cfg(test)]
        if fast {
            self.fast_rows += 1;
        }
        let checked = if fast {
            Ok(())
        } else {
            self.append_checked(msg)
        };
        if let Err(f) = checked.and_then(|()| self.check_change()) {
            self.truncate();
            return Err(RowError {
                message_id: msg.message_id.clone(),
                field: f.field,
                kind: f.kind,
                reason: f.reason,
            });
        }
        self.rows += 1;
        Ok(())
    }

    /// Change data capture (docs/contract.md §4.9): check each row's change and key against
    /// `key`. The schema must hold the pseudo-columns ([`super::cdc::with_change_columns`]) and
    /// the mode must feed columns from message fields (use_table_schema or use_topic_schema).
    /// Then a row's `_CHANGE_TYPE` is `UPSERT` or `DELETE` (required), its
    /// `_CHANGE_SEQUENCE_NUMBER` is absent or in BigQuery's format (stored normalized:
    /// [`super::cdc::normalize_sequence`]), and no key column is NULL; a row that breaks one
    /// fails alone, naming the field.
    pub fn check_changes(
        &mut self,
        key: &super::cdc::PrimaryKey,
    ) -> Result<(), InvalidTableSchema> {
        let find = |name: &str| {
            self.message_fields
                .iter()
                .position(|f| f.name.eq_ignore_ascii_case(name))
                .ok_or_else(|| {
                    InvalidTableSchema::new(
                        name,
                        format!(
                            "change data capture needs the message fields to be columns \
                             (use_table_schema or use_topic_schema); `{name}` is not one"
                        ),
                    )
                })
        };
        let changes = ChangeColumns {
            change_type: find(super::cdc::CHANGE_TYPE)?,
            sequence: find(super::cdc::CHANGE_SEQUENCE_NUMBER)?,
            key: key
                .columns
                .iter()
                .map(|c| find(c))
                .collect::<Result<_, _>>()?,
        };
        self.changes = Some(changes);
        Ok(())
    }

    /// [`RowBuilder::check_changes`]' rules on the row just appended.
    fn check_change(&mut self) -> Result<(), Fail> {
        let Some(c) = &self.changes else {
            return Ok(());
        };
        use super::cdc::{normalize_sequence, ChangeType, CHANGE_SEQUENCE_NUMBER, CHANGE_TYPE};
        let b = &mut self.builders;
        // Required, as BigQuery requires it: a change without one is not taken for an UPSERT.
        match b[c.change_type].last_bytes() {
            None => {
                return Err(Fail {
                    field: CHANGE_TYPE.into(),
                    kind: RowErrorKind::MissingRequired,
                    reason: "required in a table with a primary key: \"UPSERT\" or \"DELETE\""
                        .into(),
                })
            }
            Some(t) => {
                ChangeType::parse(t).map_err(|e| invalid(CHANGE_TYPE, e))?;
            }
        }
        if let Some(seq) = b[c.sequence].last_bytes() {
            let n = normalize_sequence(seq).map_err(|e| invalid(CHANGE_SEQUENCE_NUMBER, e))?;
            b[c.sequence].replace_last_bytes(n.as_bytes());
        }
        for &k in &c.key {
            if b[k].last_is_null() {
                return Err(Fail {
                    field: self.message_fields[k].name.clone(),
                    kind: RowErrorKind::MissingRequired,
                    reason: "a primary key column cannot be NULL".into(),
                });
            }
        }
        Ok(())
    }

    /// Take the last appended row back out (it goes to another batch).
    pub fn pop_row(&mut self) {
        assert!(self.rows > 0, "pop_row on an empty builder");
        self.rows -= 1;
        self.truncate();
    }

    /// Undo a partly appended row.
    fn truncate(&mut self) {
        for b in &mut self.builders {
            b.truncate(self.rows);
        }
    }

    /// The fast path of a use_table_schema row; `None` when it does not vouch for the message
    /// (the caller truncates and takes the reference path).
    fn append_fast(&mut self, msg: &Message) -> Option<()> {
        let n = self.message_fields.len();
        super::fast::append_record(
            &msg.data,
            &self.message_fields,
            &mut self.builders[..n],
            self.opts.drop_unknown_fields,
        )?;
        self.append_other_columns(msg).ok()
    }

    /// The reference path: every rule checked, errors with their field path. Topic-schema
    /// messages always come here.
    fn append_checked(&mut self, msg: &Message) -> Result<(), Fail> {
        let n = self.message_fields.len();
        if let Some(topic) = &self.topic {
            let cells = topic.of_message(msg)?.convert(msg)?;
            for ((f, col), cell) in self
                .message_fields
                .iter()
                .zip(&mut self.builders[..n])
                .zip(cells)
            {
                push_cell(f, col, cell);
            }
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
                &mut self.builders[..n],
                &obj,
                Path::Root,
                self.opts.drop_unknown_fields,
            )?;
        }
        self.append_other_columns(msg)
    }

    /// Every column that is not a message field: metadata, `data`, and columns written NULL.
    fn append_other_columns(&mut self, msg: &Message) -> Result<(), Fail> {
        let n = self.message_fields.len();
        for &i in &self.others {
            let (col, b) = (&self.columns[i], &mut self.builders[self.slot[i]]);
            match self.sources[i] {
                Source::Field(_) => unreachable!("not in `others`"),
                Source::Data => data_cell(&col.ty, &msg.data, b)?,
                Source::SubscriptionName => b.push_bytes(self.opts.subscription_name.as_bytes()),
                Source::MessageId => b.push_bytes(msg.message_id.as_bytes()),
                Source::PublishTime => b.push_i64(
                    timestamp_from_micros(msg.publish_time_micros)
                        .map_err(|e| invalid(&col.name, e))?,
                ),
                Source::Attributes => {
                    write_attributes(msg, b.bytes_buffer());
                    b.close_bytes();
                }
                Source::Null if col.mode == FieldMode::Repeated => b.close_list(),
                Source::Null => b.push_null(),
            }
        }
        debug_assert!(self.builders[n..].iter().all(|b| b.len() == self.rows + 1));
        Ok(())
    }

    /// The rows appended so far as a batch; the builder starts empty again.
    pub fn finish(&mut self) -> RecordBatch {
        let mut arrays: Vec<Option<ArrayRef>> = vec![None; self.builders.len()];
        for (i, b) in self.builders.iter_mut().enumerate() {
            arrays[i] = Some(b.finish());
        }
        let arrays = self
            .slot
            .iter()
            .map(|&i| arrays[i].take().expect("one builder per column"))
            .collect();
        self.rows = 0;
        RecordBatch::try_new(self.schema.clone(), arrays)
            .expect("values were checked against the schema when appended")
    }
}

fn check_column(f: &TableField, name: &str, types: &[FieldType]) -> Result<(), InvalidTableSchema> {
    if !types.contains(&f.ty) || f.mode == FieldMode::Repeated {
        let want: Vec<_> = types.iter().map(FieldType::name).collect();
        return Err(InvalidTableSchema::new(
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
