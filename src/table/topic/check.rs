//! The startup check of use_topic_schema (docs/contract.md §4.4, §4.5): every topic field
//! matched to its column, every problem collected, the [`TopicPlan`] that feeds each column.

use apache_avro::schema::{DecimalSchema, RecordSchema, UuidSchema};
use apache_avro::Schema;

use super::{CompatError, CompatRule, Conv, Incompatibility, Node, Slot, TopicPlan};
use crate::avro::Names;
use crate::table::metadata::{check_metadata_name_conflicts, is_metadata_column};
use crate::table::schema::{FieldMode, FieldType, TableField, TableSchema};

/// Check that `topic` can feed `table` under docs/contract.md §4.4 and §4.5, and plan how.
///
/// * The topic schema must be a record. Its fields match columns by name: exact first, then
///   case-insensitively (Q14); the same inside records and maps.
/// * Types must be compatible (the tables in the [module docs](super)).
/// * An optional topic field (a union with `null`, or `null`) needs a NULLABLE column (REPEATED
///   for an optional array or map); a required one may go to NULLABLE or REQUIRED.
/// * A column absent from the topic schema must be NULLABLE or REPEATED (it is written NULL or
///   empty).
/// * A topic field that is not a column needs `drop_unknown_fields`.
/// * With `write_metadata`, top-level columns named like a metadata column are the metadata's,
///   not the topic's, and a topic field named like one (snake_case or camelCase, §4.5) is an
///   error.
pub fn check_compatibility(
    topic: &Schema,
    table: &TableSchema,
    drop_unknown_fields: bool,
    write_metadata: bool,
) -> Result<TopicPlan, CompatError> {
    let mut c = Checker {
        names: Names::default(),
        drop_unknown: drop_unknown_fields,
        problems: Vec::new(),
    };
    let root = |reason: String| CompatError {
        problems: vec![Incompatibility {
            path: "$".into(),
            topic: "-".into(),
            table: "-".into(),
            rule: CompatRule::Root,
            reason,
        }],
    };
    match Names::of(topic) {
        Ok(names) => c.names = names,
        Err(e) => return Err(root(format!("the topic schema does not resolve: {e}"))),
    }
    let Schema::Record(record) = c.resolve(topic).clone() else {
        return Err(root(format!(
            "the topic schema must be a record to give columns, this one is {}",
            c.describe(topic)
        )));
    };
    let mut warnings = Vec::new();
    let mut reserved = vec![false; record.fields.len()];
    for (i, f) in record.fields.iter().enumerate() {
        match check_metadata_name_conflicts(write_metadata, true, [f.name.as_str()]) {
            Ok(w) => warnings.extend(w),
            Err(e) => {
                reserved[i] = true;
                c.problem(
                    &f.name,
                    Some(&f.schema),
                    None,
                    CompatRule::MetadataName,
                    e.reason,
                );
            }
        }
    }
    let columns: Vec<TableField> = table
        .fields
        .iter()
        .filter(|f| !is_metadata_column(&f.name, write_metadata))
        .cloned()
        .collect();
    let slots = c.record(&record, &columns, "", &reserved);
    if c.problems.is_empty() {
        Ok(TopicPlan { slots, warnings })
    } else {
        Err(CompatError {
            problems: c.problems,
        })
    }
}

struct Checker {
    /// Every named type, to resolve `Schema::Ref`.
    names: Names,
    drop_unknown: bool,
    problems: Vec<Incompatibility>,
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

fn mode_name(m: FieldMode) -> &'static str {
    match m {
        FieldMode::Nullable => "NULLABLE",
        FieldMode::Required => "REQUIRED",
        FieldMode::Repeated => "REPEATED",
    }
}

/// A column as the diff shows it: `INT64 REQUIRED`.
pub(in crate::table) fn column_desc(f: &TableField) -> String {
    format!("{} {}", f.ty.name(), mode_name(f.mode))
}

/// "A, B or C".
fn one_of(types: &[FieldType]) -> String {
    let names: Vec<&str> = types.iter().map(FieldType::name).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

const INTEGER_TARGETS: [FieldType; 3] =
    [FieldType::Int64, FieldType::Numeric, FieldType::BigNumeric];
const FLOAT_TARGETS: [FieldType; 3] = [
    FieldType::Float64,
    FieldType::Numeric,
    FieldType::BigNumeric,
];
const BYTES_TARGETS: [FieldType; 3] = [FieldType::Bytes, FieldType::Numeric, FieldType::BigNumeric];
const STRING_TARGETS: [FieldType; 8] = [
    FieldType::String,
    FieldType::Json,
    FieldType::Timestamp,
    FieldType::DateTime,
    FieldType::Date,
    FieldType::Time,
    FieldType::Numeric,
    FieldType::BigNumeric,
];

fn is_decimal(ty: &FieldType) -> bool {
    matches!(ty, FieldType::Numeric | FieldType::BigNumeric)
}

impl Checker {
    fn resolve<'s>(&'s self, s: &'s Schema) -> &'s Schema {
        self.names.resolve(s)
    }

    fn problem(
        &mut self,
        path: &str,
        topic: Option<&Schema>,
        column: Option<&TableField>,
        rule: CompatRule,
        reason: impl Into<String>,
    ) {
        self.problems.push(Incompatibility {
            path: path.to_string(),
            topic: topic.map_or_else(|| "-".to_string(), |s| self.describe(s)),
            table: column.map_or_else(|| "-".to_string(), column_desc),
            rule,
            reason: reason.into(),
        });
    }

    /// An Avro type as the diff shows it.
    fn describe(&self, s: &Schema) -> String {
        self.names.describe(s)
    }

    /// Match the fields of `record` to `columns` and plan each column. `skip[i]`: topic field
    /// `i` was already reported (metadata name).
    fn record(
        &mut self,
        record: &RecordSchema,
        columns: &[TableField],
        prefix: &str,
        skip: &[bool],
    ) -> Vec<Slot> {
        let mut source: Vec<Option<usize>> = vec![None; columns.len()];
        let mut unmatched = Vec::new();
        for (i, f) in record.fields.iter().enumerate() {
            if skip.get(i).copied().unwrap_or(false) {
                continue;
            }
            match columns.iter().position(|c| c.name == f.name) {
                Some(j) if source[j].is_none() => source[j] = Some(i),
                _ => unmatched.push(i),
            }
        }
        for i in unmatched {
            let f = &record.fields[i];
            match columns
                .iter()
                .position(|c| c.name.eq_ignore_ascii_case(&f.name))
            {
                Some(j) if source[j].is_none() => source[j] = Some(i),
                _ if self.drop_unknown => {}
                taken => {
                    let reason = match taken {
                        Some(j) => format!(
                            "not a column of the table: column `{}` already takes the topic \
                             field of exactly its name; set drop_unknown_fields to drop this one",
                            columns[j].name
                        ),
                        None => "not a column of the table; add the column or set \
                                 drop_unknown_fields to drop the field"
                            .to_string(),
                    };
                    self.problem(
                        &join(prefix, &f.name),
                        Some(&f.schema),
                        None,
                        CompatRule::UnknownField,
                        reason,
                    );
                }
            }
        }
        columns
            .iter()
            .zip(source)
            .map(|(col, src)| {
                let path = join(prefix, &col.name);
                let node = match src {
                    Some(i) => self.field(&record.fields[i].schema, col, &path),
                    None => {
                        if col.mode == FieldMode::Required {
                            self.problem(
                                &path,
                                None,
                                Some(col),
                                CompatRule::AbsentColumnRequired,
                                "the column is not in the topic schema, so it must be NULLABLE \
                                 (it is written NULL)",
                            );
                        }
                        Node::Null
                    }
                };
                Slot {
                    field: col.clone(),
                    source: src,
                    node,
                }
            })
            .collect()
    }

    /// Plan one topic field (any schema) into `col`, mode included.
    fn field(&mut self, schema: &Schema, col: &TableField, path: &str) -> Node {
        let schema = self.resolve(schema).clone();
        match &schema {
            Schema::Null => {
                if col.mode != FieldMode::Nullable {
                    self.problem(
                        path,
                        Some(&schema),
                        Some(col),
                        CompatRule::OptionalNotNullable,
                        "a null topic field needs a NULLABLE column",
                    );
                }
                Node::Null
            }
            Schema::Union(u) => {
                let variants = u.variants();
                let has_null = variants.iter().any(|v| matches!(v, Schema::Null));
                let others: Vec<&Schema> = variants
                    .iter()
                    .filter(|v| !matches!(v, Schema::Null))
                    .collect();
                match (has_null, others.as_slice()) {
                    (true, []) => self.field(&Schema::Null, col, path),
                    (false, [only]) => Node::Union(Box::new(self.field(only, col, path))),
                    (true, [only]) => {
                        let only = self.resolve(only).clone();
                        let repeated = matches!(only, Schema::Array(_) | Schema::Map(_));
                        if col.mode == FieldMode::Required
                            || (col.mode == FieldMode::Repeated && !repeated)
                        {
                            self.problem(
                                path,
                                Some(&schema),
                                Some(col),
                                CompatRule::OptionalNotNullable,
                                "an optional topic field (a union with null) needs a NULLABLE \
                                 column (REPEATED if it is an array or map)",
                            );
                            return Node::Null;
                        }
                        Node::Union(Box::new(self.value(&only, col, path)))
                    }
                    _ => {
                        self.problem(
                            path,
                            Some(&schema),
                            Some(col),
                            CompatRule::Union,
                            "not mappable: only a union of null and one type (NULLABLE) has a \
                             BigQuery type",
                        );
                        Node::Null
                    }
                }
            }
            _ => self.value(&schema, col, path),
        }
    }

    /// Plan a non-union, non-null topic value into `col`: arrays and maps need REPEATED, other
    /// values need NULLABLE or REQUIRED.
    fn value(&mut self, schema: &Schema, col: &TableField, path: &str) -> Node {
        let schema = self.resolve(schema).clone();
        match &schema {
            Schema::Array(a) => {
                if col.mode != FieldMode::Repeated {
                    self.mismatch(path, &schema, col, "an array fits a REPEATED column");
                    return Node::Null;
                }
                let items = self.resolve(&a.items).clone();
                let nullable = match &items {
                    Schema::Null => true,
                    Schema::Union(u) => u.is_nullable(),
                    _ => false,
                };
                if nullable {
                    self.problem(
                        path,
                        Some(&schema),
                        Some(col),
                        CompatRule::Type,
                        "the array's items can be null, but BigQuery arrays cannot hold NULL",
                    );
                    return Node::Null;
                }
                Node::Array(Box::new(self.element(&items, col, path)))
            }
            Schema::Map(m) => self.map(&schema, &m.types, col, path),
            _ if col.mode == FieldMode::Repeated => {
                self.mismatch(
                    path,
                    &schema,
                    col,
                    "a REPEATED column needs an Avro array (or map)",
                );
                Node::Null
            }
            _ => self.element(&schema, col, path),
        }
    }

    /// Plan one value (an array item, or a non-repeated field) by type alone.
    fn element(&mut self, schema: &Schema, col: &TableField, path: &str) -> Node {
        let schema = self.resolve(schema).clone();
        match (&schema, &col.ty) {
            (Schema::Record(r), FieldType::Record(sub)) => {
                Node::Record(self.record(r, sub, path, &[]))
            }
            (Schema::Record(_), _) => {
                self.mismatch(path, &schema, col, "a record fits RECORD");
                Node::Null
            }
            (Schema::Array(_) | Schema::Map(_), _) => {
                self.problem(
                    path,
                    Some(&schema),
                    Some(col),
                    CompatRule::Type,
                    "an array or map inside an array has no BigQuery type (BigQuery arrays do \
                     not nest); wrap the inner one in a record",
                );
                Node::Null
            }
            (Schema::Union(u), _) if !u.is_nullable() && u.variants().len() == 1 => {
                let only = u.variants()[0].clone();
                Node::Union(Box::new(self.element(&only, col, path)))
            }
            (Schema::Union(_), _) => {
                self.problem(
                    path,
                    Some(&schema),
                    Some(col),
                    CompatRule::Union,
                    "not mappable here: only a union of null and one type has a BigQuery type, \
                     and array items cannot be NULL",
                );
                Node::Null
            }
            (Schema::Null, _) => {
                self.problem(
                    path,
                    Some(&schema),
                    Some(col),
                    CompatRule::Type,
                    "null items cannot go into an array",
                );
                Node::Null
            }
            _ => match scalar_conv(&schema, &self.describe(&schema), &col.ty) {
                Ok(conv) => Node::Scalar(conv),
                Err(fits) => {
                    self.mismatch(path, &schema, col, &fits);
                    Node::Null
                }
            },
        }
    }

    /// map<V> → REPEATED RECORD<key STRING, value V>.
    fn map(&mut self, schema: &Schema, values: &Schema, col: &TableField, path: &str) -> Node {
        let shape = "a map fits REPEATED RECORD<key STRING, value …>";
        let FieldType::Record(sub) = &col.ty else {
            self.mismatch(path, schema, col, shape);
            return Node::Null;
        };
        if col.mode != FieldMode::Repeated {
            self.mismatch(path, schema, col, shape);
            return Node::Null;
        }
        let find = |name: &str| {
            sub.iter()
                .position(|f| f.name == name)
                .or_else(|| sub.iter().position(|f| f.name.eq_ignore_ascii_case(name)))
        };
        let (Some(key), Some(value)) = (find("key"), find("value")) else {
            self.problem(
                path,
                Some(schema),
                Some(col),
                CompatRule::Type,
                format!("{shape}: the record needs sub-fields `key` and `value`"),
            );
            return Node::Null;
        };
        let key_path = join(path, &sub[key].name);
        if sub[key].ty != FieldType::String || sub[key].mode == FieldMode::Repeated {
            self.problem(
                &key_path,
                Some(&Schema::String),
                Some(&sub[key]),
                CompatRule::Type,
                "incompatible schema type: a map's keys fit a STRING (NULLABLE or REQUIRED) \
                 `key` sub-field",
            );
        }
        for (i, f) in sub.iter().enumerate() {
            if i != key && i != value && f.mode == FieldMode::Required {
                self.problem(
                    &join(path, &f.name),
                    None,
                    Some(f),
                    CompatRule::AbsentColumnRequired,
                    "a map entry only has `key` and `value`, so other sub-fields must be NULLABLE",
                );
            }
        }
        let value_node = self.field(values, &sub[value], &join(path, &sub[value].name));
        Node::Map {
            sub: sub.clone(),
            key,
            value,
            value_node: Box::new(value_node),
        }
    }

    fn mismatch(&mut self, path: &str, schema: &Schema, col: &TableField, fits: &str) {
        let got = self.describe(schema);
        let what = if col.mode == FieldMode::Repeated {
            format!("REPEATED {}", col.ty.name())
        } else {
            col.ty.name().to_string()
        };
        self.problem(
            path,
            Some(schema),
            Some(col),
            CompatRule::Type,
            format!("incompatible schema type: expected {what}, got {got} ({fits})"),
        );
    }
}

/// The conversion of a scalar Avro type (described as `desc`) into `ty`, or what it fits instead.
fn scalar_conv(schema: &Schema, desc: &str, ty: &FieldType) -> Result<Conv, String> {
    let fits = |types: &[FieldType]| format!("{desc} fits {}", one_of(types));
    let integer = || {
        if *ty == FieldType::Int64 {
            Ok(Conv::Int)
        } else if is_decimal(ty) {
            Ok(Conv::IntDecimal)
        } else {
            Err(fits(&INTEGER_TARGETS))
        }
    };
    let bytes = |note: &str| {
        if *ty == FieldType::Bytes {
            Ok(Conv::Bytes)
        } else if is_decimal(ty) {
            Ok(Conv::BytesDecimal)
        } else {
            Err(format!("{}{note}", fits(&BYTES_TARGETS)))
        }
    };
    // A logical type of the table matches its BigQuery type and its underlying int/long's.
    let logical = |target: FieldType, conv: Conv| {
        if *ty == target {
            Ok(conv)
        } else {
            let mut all = vec![target];
            all.extend(INTEGER_TARGETS);
            integer().map_err(|_| fits(&all))
        }
    };
    match schema {
        Schema::Boolean if *ty == FieldType::Bool => Ok(Conv::Bool),
        Schema::Boolean => Err(fits(&[FieldType::Bool])),
        Schema::Int
        | Schema::Long
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => integer(),
        Schema::Float | Schema::Double if *ty == FieldType::Float64 => Ok(Conv::Float),
        Schema::Float | Schema::Double if is_decimal(ty) => Ok(Conv::FloatDecimal),
        Schema::Float | Schema::Double => Err(fits(&FLOAT_TARGETS)),
        Schema::Bytes
        | Schema::Fixed(_)
        | Schema::Uuid(UuidSchema::Bytes | UuidSchema::Fixed(_)) => bytes(""),
        Schema::Duration(_) => bytes(" (its INTERVAL column type is not supported)"),
        Schema::String | Schema::Uuid(UuidSchema::String) if STRING_TARGETS.contains(ty) => {
            Ok(Conv::Text)
        }
        Schema::String | Schema::Uuid(UuidSchema::String) => Err(fits(&STRING_TARGETS)),
        Schema::Enum(_) if *ty == FieldType::Int64 => Ok(Conv::EnumIndex),
        Schema::Enum(_) => Err(format!("{} (its index)", fits(&[FieldType::Int64]))),
        Schema::Date => logical(FieldType::Date, Conv::Date),
        Schema::TimeMillis | Schema::TimeMicros => logical(FieldType::Time, Conv::Time),
        Schema::TimestampMillis | Schema::TimestampMicros => {
            logical(FieldType::Timestamp, Conv::Timestamp)
        }
        Schema::Decimal(DecimalSchema { scale, .. }) if is_decimal(ty) => {
            Ok(Conv::Decimal { scale: *scale })
        }
        Schema::Decimal(_) if *ty == FieldType::Bytes => Ok(Conv::Bytes),
        Schema::Decimal(_) => Err(format!(
            "{} (BYTES: its two's-complement bytes)",
            fits(&BYTES_TARGETS)
        )),
        Schema::BigDecimal if is_decimal(ty) => Ok(Conv::BigDecimal),
        Schema::BigDecimal => Err(fits(&[FieldType::Numeric, FieldType::BigNumeric])),
        // Composite types are planned by the caller.
        _ => Err(format!("{desc} has no scalar conversion")),
    }
}
