//! The metadata columns of write_metadata (docs/contract.md §4.5): their names, and the startup check that
//! a topic schema does not use them. Shared by the row builder ([`super::batch`]) and the
//! topic-schema mapping ([`super::topic`]).

use super::schema::InvalidTableSchema;

/// The metadata columns, in the order [`super::batch`] lists their sources and types.
pub(super) const METADATA_COLUMNS: [&str; 4] = [
    "subscription_name",
    "message_id",
    "publish_time",
    "attributes",
];

/// Whether a column named `name` is filled with metadata (§4.5): only with `write_metadata`,
/// names compared case-insensitively.
pub(super) fn is_metadata_column(name: &str, write_metadata: bool) -> bool {
    write_metadata
        && METADATA_COLUMNS
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
}

/// The column names docs/contract.md §4.5 forbids in a topic schema when `write_metadata` and
/// `use_topic_schema` are both on: each metadata column, snake_case and camelCase.
pub const METADATA_NAMES: [&str; 7] = crate::avro::RESERVED_METADATA_FIELDS;

/// The startup check of docs/contract.md §4.5 (name conflicts) for a topic schema's top-level field names.
/// Only applies with `write_metadata` and `use_topic_schema`; names compare case-insensitively,
/// like columns (Q14). A field named `data` is allowed with a warning (Q7); the warnings are
/// returned for the caller to log.
pub fn check_metadata_name_conflicts<'a>(
    write_metadata: bool,
    use_topic_schema: bool,
    topic_fields: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<String>, InvalidTableSchema> {
    let mut warnings = Vec::new();
    if !(write_metadata && use_topic_schema) {
        return Ok(warnings);
    }
    for name in topic_fields {
        if let Some(m) = METADATA_NAMES.iter().find(|m| m.eq_ignore_ascii_case(name)) {
            return Err(InvalidTableSchema::new(
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
