//! One description of Avro types, read by both the container encoder (union branch names in
//! wrapped JSON values) and the table mapping (the types shown in a compatibility diff): the named
//! types of a schema, the name of each type, and its readable form.

use std::collections::HashMap;

use apache_avro::schema::{DecimalSchema, InnerDecimalSchema, Name, ResolvedSchema, UuidSchema};
use apache_avro::Schema;

/// Every named type of a schema, to resolve references (`Schema::Ref`).
#[derive(Debug, Clone, Default)]
pub struct Names(HashMap<Name, Schema>);

impl Names {
    /// The named types of `schema`; fails if a reference does not resolve.
    pub fn of(schema: &Schema) -> Result<Self, apache_avro::Error> {
        Ok(Names(
            ResolvedSchema::try_from(schema)?
                .get_names()
                .iter()
                .map(|(name, schema)| (name.clone(), (*schema).clone()))
                .collect(),
        ))
    }

    /// The named type `name`.
    pub fn get(&self, name: &Name) -> Option<&Schema> {
        self.0.get(name)
    }

    /// `schema`, or the type it refers to when it is a reference that resolves.
    pub fn resolve<'s>(&'s self, schema: &'s Schema) -> &'s Schema {
        match schema {
            Schema::Ref { name } => self.0.get(name).unwrap_or(schema),
            _ => schema,
        }
    }

    /// An Avro type as a person reads it: `[null, string]`, `array<long>`, `record Order`,
    /// `long (timestamp-micros)`, `fixed Hash(4)`; references are shown as their target.
    pub fn describe(&self, s: &Schema) -> String {
        let named = |kind: &str, n: &Name| format!("{kind} {}", n.name());
        match s {
            Schema::Null => "null".into(),
            Schema::Boolean => "boolean".into(),
            Schema::Int => "int".into(),
            Schema::Long => "long".into(),
            Schema::Float => "float".into(),
            Schema::Double => "double".into(),
            Schema::Bytes => "bytes".into(),
            Schema::String => "string".into(),
            Schema::Array(a) => format!("array<{}>", self.describe(&a.items)),
            Schema::Map(m) => format!("map<{}>", self.describe(&m.types)),
            Schema::Union(u) => {
                let v: Vec<String> = u.variants().iter().map(|s| self.describe(s)).collect();
                format!("[{}]", v.join(", "))
            }
            Schema::Record(r) => named("record", &r.name),
            Schema::Enum(e) => named("enum", &e.name),
            Schema::Fixed(f) => format!("fixed {}({})", f.name.name(), f.size),
            Schema::Decimal(d) => {
                let inner = match &d.inner {
                    InnerDecimalSchema::Bytes => "bytes".to_string(),
                    InnerDecimalSchema::Fixed(f) => format!("fixed {}({})", f.name.name(), f.size),
                };
                format!("{inner} (decimal({}, {}))", d.precision, d.scale)
            }
            Schema::BigDecimal => "bytes (big-decimal)".into(),
            Schema::Uuid(UuidSchema::String) => "string (uuid)".into(),
            Schema::Uuid(UuidSchema::Bytes) => "bytes (uuid)".into(),
            Schema::Uuid(UuidSchema::Fixed(f)) => {
                format!("fixed {}({}) (uuid)", f.name.name(), f.size)
            }
            Schema::Date => "int (date)".into(),
            Schema::TimeMillis => "int (time-millis)".into(),
            Schema::TimeMicros => "long (time-micros)".into(),
            Schema::TimestampMillis => "long (timestamp-millis)".into(),
            Schema::TimestampMicros => "long (timestamp-micros)".into(),
            Schema::TimestampNanos => "long (timestamp-nanos)".into(),
            Schema::LocalTimestampMillis => "long (local-timestamp-millis)".into(),
            Schema::LocalTimestampMicros => "long (local-timestamp-micros)".into(),
            Schema::LocalTimestampNanos => "long (local-timestamp-nanos)".into(),
            Schema::Duration(f) => format!("fixed {}({}) (duration)", f.name.name(), f.size),
            Schema::Ref { name } => match self.0.get(name) {
                Some(target) => self.describe(target),
                None => name.fullname(None),
            },
        }
    }
}

/// The name of a named type (record, enum, fixed and the logical types built on fixed).
pub fn named_type(schema: &Schema) -> Option<&Name> {
    match schema {
        Schema::Record(r) => Some(&r.name),
        Schema::Enum(e) => Some(&e.name),
        Schema::Fixed(f)
        | Schema::Duration(f)
        | Schema::Uuid(UuidSchema::Fixed(f))
        | Schema::Decimal(DecimalSchema {
            inner: InnerDecimalSchema::Fixed(f),
            ..
        }) => Some(&f.name),
        Schema::Ref { name } => Some(name),
        _ => None,
    }
}

/// The Avro type name of a type: `record`, `union`, `long`, …; logical types give their
/// underlying type (`timestamp-micros` is a `long`).
pub fn type_name(schema: &Schema) -> &'static str {
    match schema {
        Schema::Null => "null",
        Schema::Boolean => "boolean",
        Schema::Int | Schema::Date | Schema::TimeMillis => "int",
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => "long",
        Schema::Float => "float",
        Schema::Double => "double",
        Schema::Bytes | Schema::BigDecimal | Schema::Uuid(UuidSchema::Bytes) => "bytes",
        Schema::Decimal(DecimalSchema {
            inner: InnerDecimalSchema::Bytes,
            ..
        }) => "bytes",
        Schema::String | Schema::Uuid(UuidSchema::String) => "string",
        Schema::Array(_) => "array",
        Schema::Map(_) => "map",
        Schema::Union(_) => "union",
        Schema::Record(_) => "record",
        Schema::Enum(_) => "enum",
        Schema::Fixed(_)
        | Schema::Duration(_)
        | Schema::Uuid(UuidSchema::Fixed(_))
        | Schema::Decimal(_)
        | Schema::Ref { .. } => "fixed",
    }
}
