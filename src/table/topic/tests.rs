//! Tests of use_topic_schema: the startup check (every row of the type tables, the diff) and the
//! rows built from JSON and BINARY messages.

use std::collections::HashMap;

use apache_avro::types::Value;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Decimal256Type, Float64Type, Int64Type, Time64MicrosecondType,
    TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch, StructArray};
use arrow_buffer::i256;
use bytes::Bytes;
use serde_json::json;

use super::*;
use crate::avro::{TopicSchema, ENCODING_ATTRIBUTE};
use crate::message::Message;
use crate::table::batch::{RowBuilder, RowError, RowOptions, SchemaMode};
use crate::table::error::RowErrorKind;
use crate::table::schema::TableSchema;

fn topic(text: &str) -> TopicSchema {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn table(text: &str) -> TableSchema {
    TableSchema::from_json(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn topic_mode() -> RowOptions {
    RowOptions {
        mode: SchemaMode::UseTopicSchema,
        ..RowOptions::default()
    }
}

fn message(id: &str, data: Vec<u8>, encoding: &str) -> Message {
    Message {
        data: Bytes::from(data),
        attributes: [(ENCODING_ATTRIBUTE.to_string(), encoding.to_string())].into(),
        message_id: id.to_string(),
        publish_time_micros: 1_700_000_000_000_000,
        ordering_key: String::new(),
    }
}

fn binary(schema: &TopicSchema, value: Value) -> Vec<u8> {
    apache_avro::writer::datum::GenericDatumWriter::builder(schema.schema())
        .build()
        .unwrap()
        .write_value_to_vec(value)
        .unwrap()
}

fn pow10(n: u32) -> i256 {
    i256::from_i128(10).checked_pow(n).unwrap()
}

/// Bytes in the Avro JSON encoding: one code point 0–255 per byte.
fn json_bytes(b: &[u8]) -> String {
    b.iter().map(|&b| char::from(b)).collect()
}

// ---- the compatibility table -------------------------------------------------------------

/// One topic field `c` of Avro type `avro` into one column `c` declared by `decl`.
fn one(avro: &str, decl: &str) -> Result<TopicPlan, CompatError> {
    let t = topic(&format!(
        r#"{{"type":"record","name":"T","fields":[{{"name":"c","type":{avro}}}]}}"#
    ));
    check_compatibility(
        t.schema(),
        &table(&format!(r#"[{{"name":"c",{decl}}}]"#)),
        false,
        false,
    )
}

fn col(ty: &str, mode: &str) -> String {
    format!(r#""type":"{ty}","mode":"{mode}""#)
}

const KV_LONG: &str = r#""type":"RECORD","mode":"REPEATED","fields":[
        {"name":"key","type":"STRING","mode":"REQUIRED"},{"name":"value","type":"INT64"}]"#;
const REC_X: &str = r#""type":"RECORD","fields":[{"name":"x","type":"INT64"}]"#;
const AVRO_REC_X: &str = r#"{"type":"record","name":"R","fields":[{"name":"x","type":"long"}]}"#;

#[test]
fn every_row_of_the_avro_type_table() {
    let all = [
        "STRING",
        "BYTES",
        "INT64",
        "FLOAT64",
        "NUMERIC",
        "BIGNUMERIC",
        "BOOL",
        "TIMESTAMP",
        "DATE",
        "TIME",
        "DATETIME",
        "JSON",
    ];
    // (Avro type, the BigQuery types it fits; every other scalar type is refused).
    let rows: &[(&str, &[&str])] = &[
        (r#""boolean""#, &["BOOL"]),
        (r#""int""#, &["INT64", "NUMERIC", "BIGNUMERIC"]),
        (r#""long""#, &["INT64", "NUMERIC", "BIGNUMERIC"]),
        (r#""float""#, &["FLOAT64", "NUMERIC", "BIGNUMERIC"]),
        (r#""double""#, &["FLOAT64", "NUMERIC", "BIGNUMERIC"]),
        (r#""bytes""#, &["BYTES", "NUMERIC", "BIGNUMERIC"]),
        (
            r#""string""#,
            &[
                "STRING",
                "JSON",
                "TIMESTAMP",
                "DATETIME",
                "DATE",
                "TIME",
                "NUMERIC",
                "BIGNUMERIC",
            ],
        ),
        (
            r#"{"type":"fixed","name":"F","size":4}"#,
            &["BYTES", "NUMERIC", "BIGNUMERIC"],
        ),
        (
            r#"{"type":"enum","name":"E","symbols":["A","B"]}"#,
            &["INT64"],
        ),
        // Logical types: their own type, and their underlying type's.
        (
            r#"{"type":"long","logicalType":"timestamp-micros"}"#,
            &["TIMESTAMP", "INT64", "NUMERIC", "BIGNUMERIC"],
        ),
        (
            r#"{"type":"long","logicalType":"timestamp-millis"}"#,
            &["TIMESTAMP", "INT64", "NUMERIC", "BIGNUMERIC"],
        ),
        (
            r#"{"type":"int","logicalType":"date"}"#,
            &["DATE", "INT64", "NUMERIC", "BIGNUMERIC"],
        ),
        (
            r#"{"type":"long","logicalType":"time-micros"}"#,
            &["TIME", "INT64", "NUMERIC", "BIGNUMERIC"],
        ),
        (
            r#"{"type":"int","logicalType":"time-millis"}"#,
            &["TIME", "INT64", "NUMERIC", "BIGNUMERIC"],
        ),
        (
            r#"{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}"#,
            &["NUMERIC", "BIGNUMERIC", "BYTES"],
        ),
        (
            r#"{"type":"fixed","name":"D","size":8,"logicalType":"decimal","precision":18,"scale":4}"#,
            &["NUMERIC", "BIGNUMERIC", "BYTES"],
        ),
        // duration's INTERVAL is not supported: only its fixed's types.
        (
            r#"{"type":"fixed","name":"Du","size":12,"logicalType":"duration"}"#,
            &["BYTES", "NUMERIC", "BIGNUMERIC"],
        ),
        // Other logical types: their underlying type only.
        (
            r#"{"type":"string","logicalType":"uuid"}"#,
            &[
                "STRING",
                "JSON",
                "TIMESTAMP",
                "DATETIME",
                "DATE",
                "TIME",
                "NUMERIC",
                "BIGNUMERIC",
            ],
        ),
        (
            r#"{"type":"long","logicalType":"local-timestamp-micros"}"#,
            &["INT64", "NUMERIC", "BIGNUMERIC"],
        ),
        (
            r#"{"type":"long","logicalType":"timestamp-nanos"}"#,
            &["INT64", "NUMERIC", "BIGNUMERIC"],
        ),
    ];
    for (avro, fits) in rows {
        for ty in all {
            for mode in ["NULLABLE", "REQUIRED"] {
                let r = one(avro, &col(ty, mode));
                if fits.contains(&ty) {
                    assert!(r.is_ok(), "{avro} → {ty} {mode}: {}", r.unwrap_err());
                } else {
                    let e = r.err().unwrap_or_else(|| panic!("{avro} → {ty} accepted"));
                    let p = &e.problems[0];
                    assert_eq!((e.problems.len(), p.rule), (1, CompatRule::Type), "{e}");
                    assert_eq!(p.path, "c");
                    assert_eq!(p.table, format!("{ty} {mode}"));
                    let want = format!("expected {ty}, got ");
                    assert!(p.reason.contains(&want), "{avro} → {ty}: {e}");
                    assert!(p.reason.contains(" fits "), "{e}");
                }
            }
        }
        // A scalar never fits a RECORD, and needs an array for REPEATED.
        let e = one(avro, REC_X).unwrap_err();
        assert_eq!(e.problems[0].rule, CompatRule::Type, "{e}");
        let e = one(avro, &col(fits[0], "REPEATED")).unwrap_err();
        assert!(e.problems[0].reason.contains("needs an Avro array"), "{e}");
    }
    let e = one(
        r#"{"type":"fixed","name":"Du","size":12,"logicalType":"duration"}"#,
        &col("STRING", "NULLABLE"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("INTERVAL"), "{e}");
}

#[test]
fn composite_types_nullable_unions_and_modes() {
    type Case = (&'static str, String, Option<(CompatRule, &'static str)>);
    let ok = None;
    let err = |rule, text| Some((rule, text));
    let cases: Vec<Case> = vec![
            // null → any NULLABLE.
            (r#""null""#, col("STRING", "NULLABLE"), ok),
            (r#""null""#, col("DATE", "NULLABLE"), ok),
            (
                r#""null""#,
                col("STRING", "REQUIRED"),
                err(CompatRule::OptionalNotNullable, "NULLABLE"),
            ),
            // union of null and T = NULLABLE T, in either order.
            (r#"["null","long"]"#, col("INT64", "NULLABLE"), ok),
            (r#"["long","null"]"#, col("NUMERIC", "NULLABLE"), ok),
            (
                r#"["null","long"]"#,
                col("INT64", "REQUIRED"),
                err(CompatRule::OptionalNotNullable, "needs a NULLABLE column"),
            ),
            (
                r#"["null","long"]"#,
                col("STRING", "NULLABLE"),
                err(CompatRule::Type, "expected STRING, got long"),
            ),
            (
                r#"["null","long"]"#,
                col("INT64", "REPEATED"),
                err(CompatRule::OptionalNotNullable, "REPEATED if it is an array"),
            ),
            // A required topic field may go to NULLABLE or REQUIRED.
            (r#""long""#, col("INT64", "REQUIRED"), ok),
            (r#""long""#, col("INT64", "NULLABLE"), ok),
            // Other unions are not mappable.
            (
                r#"["null","long","string"]"#,
                col("INT64", "NULLABLE"),
                err(CompatRule::Union, "not mappable"),
            ),
            (
                r#"["long","string"]"#,
                col("STRING", "NULLABLE"),
                err(CompatRule::Union, "not mappable"),
            ),
            (r#"["long"]"#, col("INT64", "REQUIRED"), ok),
            // record → RECORD, field by field.
            (AVRO_REC_X, REC_X.into(), ok),
            (
                AVRO_REC_X,
                col("STRING", "NULLABLE"),
                err(CompatRule::Type, "expected STRING, got record R"),
            ),
            (
                &*Box::leak(format!(r#"["null",{AVRO_REC_X}]"#).into_boxed_str()),
                REC_X.into(),
                ok,
            ),
            (
                r#"{"type":"record","name":"R","fields":[{"name":"x","type":"string"}]}"#,
                REC_X.into(),
                err(CompatRule::Type, "expected INT64, got string"),
            ),
            // array of T → REPEATED T.
            (
                r#"{"type":"array","items":"long"}"#,
                col("INT64", "REPEATED"),
                ok,
            ),
            (
                r#"{"type":"array","items":"long"}"#,
                col("INT64", "NULLABLE"),
                err(CompatRule::Type, "an array fits a REPEATED column"),
            ),
            (
                r#"{"type":"array","items":"long"}"#,
                col("STRING", "REPEATED"),
                err(CompatRule::Type, "expected REPEATED STRING, got long"),
            ),
            (
                r#"["null",{"type":"array","items":"long"}]"#,
                col("INT64", "REPEATED"),
                ok,
            ),
            (
                r#"{"type":"array","items":["null","long"]}"#,
                col("INT64", "REPEATED"),
                err(CompatRule::Type, "cannot hold NULL"),
            ),
            (
                r#"{"type":"array","items":{"type":"array","items":"long"}}"#,
                col("INT64", "REPEATED"),
                err(CompatRule::Type, "do not nest"),
            ),
            (
                &*Box::leak(format!(r#"{{"type":"array","items":{AVRO_REC_X}}}"#).into_boxed_str()),
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"x","type":"INT64"}]"#
                    .into(),
                ok,
            ),
            // map of V → REPEATED RECORD<key STRING, value V>.
            (r#"{"type":"map","values":"long"}"#, KV_LONG.into(), ok),
            (
                r#"["null",{"type":"map","values":"long"}]"#,
                KV_LONG.into(),
                ok,
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"KEY","type":"STRING"},
                   {"name":"Value","type":"NUMERIC"},{"name":"note","type":"STRING"}]"#
                    .into(),
                ok,
            ),
            (
                r#"{"type":"map","values":"string"}"#,
                KV_LONG.into(),
                err(CompatRule::Type, "expected INT64, got string"),
            ),
            (
                r#"{"type":"map","values":["null","long"]}"#,
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"key","type":"STRING"},
                   {"name":"value","type":"INT64","mode":"REQUIRED"}]"#
                    .into(),
                err(CompatRule::OptionalNotNullable, "NULLABLE"),
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"key","type":"INT64"},
                   {"name":"value","type":"INT64"}]"#
                    .into(),
                err(CompatRule::Type, "a map's keys fit a STRING"),
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"k","type":"STRING"},
                   {"name":"value","type":"INT64"}]"#
                    .into(),
                err(CompatRule::Type, "needs sub-fields `key` and `value`"),
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                r#""type":"RECORD","mode":"REPEATED","fields":[{"name":"key","type":"STRING"},
                   {"name":"value","type":"INT64"},{"name":"n","type":"INT64","mode":"REQUIRED"}]"#
                    .into(),
                err(CompatRule::AbsentColumnRequired, "other sub-fields must be NULLABLE"),
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                r#""type":"RECORD","fields":[{"name":"key","type":"STRING"},{"name":"value","type":"INT64"}]"#
                    .into(),
                err(CompatRule::Type, "REPEATED RECORD<key STRING"),
            ),
            (
                r#"{"type":"map","values":"long"}"#,
                col("INT64", "REPEATED"),
                err(CompatRule::Type, "REPEATED RECORD<key STRING"),
            ),
        ];
    for (avro, decl, want) in &cases {
        let r = one(avro, decl);
        match (want, r) {
            (None, Ok(_)) => {}
            (None, Err(e)) => panic!("{avro} → {decl}: {e}"),
            (Some(_), Ok(_)) => panic!("{avro} → {decl} accepted"),
            (Some((rule, text)), Err(e)) => {
                assert_eq!(e.problems.len(), 1, "{avro} → {decl}: {e}");
                assert_eq!(e.problems[0].rule, *rule, "{avro} → {decl}: {e}");
                assert!(e.problems[0].reason.contains(text), "{avro} → {decl}: {e}");
            }
        }
    }
}

#[test]
fn names_absent_columns_unknown_fields_and_metadata() {
    let t = topic(
        r#"{"type":"record","name":"T","fields":[
                {"name":"UserId","type":"long"},
                {"name":"a","type":"long"}, {"name":"A","type":"long"},
                {"name":"nested","type":{"type":"record","name":"N","fields":[
                    {"name":"x","type":"long"},{"name":"y","type":"long"}]}}]}"#,
    );
    let tbl = |extra: &str| {
        table(&format!(
            r#"[{{"name":"userid","type":"INT64"}},{{"name":"a","type":"INT64"}},
                    {{"name":"nested","type":"RECORD","fields":[{{"name":"x","type":"INT64"}}]}}{extra}]"#
        ))
    };
    // `A` and `nested.y` are not columns: refused without drop_unknown_fields, dropped with.
    let e = check_compatibility(t.schema(), &tbl(""), false, false).unwrap_err();
    let got: Vec<(&str, CompatRule)> = e
        .problems
        .iter()
        .map(|p| (p.path.as_str(), p.rule))
        .collect();
    assert_eq!(
        got,
        [
            ("A", CompatRule::UnknownField),
            ("nested.y", CompatRule::UnknownField)
        ]
    );
    assert!(e.problems[0]
        .reason
        .contains("already takes the topic field of exactly its name"));
    let plan = check_compatibility(t.schema(), &tbl(""), true, false).unwrap();
    assert_eq!(plan.slots[0].source, Some(0), "UserId matches userid");
    assert_eq!(plan.slots[1].source, Some(1), "a matches a exactly, not A");

    // Columns the topic lacks: NULLABLE and REPEATED are fine, REQUIRED is not.
    let extra = r#",{"name":"n","type":"STRING"},{"name":"r","type":"INT64","mode":"REPEATED"},
                       {"name":"q","type":"STRING","mode":"REQUIRED"}"#;
    let e = check_compatibility(t.schema(), &tbl(extra), true, false).unwrap_err();
    assert_eq!(e.problems.len(), 1, "{e}");
    assert_eq!(
        (e.problems[0].path.as_str(), e.problems[0].rule),
        ("q", CompatRule::AbsentColumnRequired)
    );
    assert_eq!(e.problems[0].topic, "-");

    // With write_metadata, metadata columns are not "absent", and topic fields may not be
    // named like them (snake_case or camelCase, case-insensitively).
    let meta_cols = r#",{"name":"message_id","type":"STRING","mode":"REQUIRED"},
                           {"name":"publish_time","type":"TIMESTAMP","mode":"REQUIRED"}"#;
    assert!(check_compatibility(t.schema(), &tbl(meta_cols), true, true).is_ok());
    let e = check_compatibility(t.schema(), &tbl(meta_cols), true, false).unwrap_err();
    assert_eq!(
        e.problems.len(),
        2,
        "without write_metadata they are plain columns: {e}"
    );
    for name in [
        "messageId",
        "message_id",
        "PUBLISHTIME",
        "attributes",
        "subscriptionName",
    ] {
        let t = topic(&format!(
            r#"{{"type":"record","name":"T","fields":[{{"name":"{name}","type":"string"}}]}}"#
        ));
        let e = check_compatibility(
            t.schema(),
            &table(r#"[{"name":"x","type":"STRING"}]"#),
            false,
            true,
        )
        .unwrap_err();
        assert_eq!(e.problems.len(), 1, "{e}");
        assert_eq!(e.problems[0].rule, CompatRule::MetadataName, "{e}");
        assert_eq!(e.problems[0].path, name);
        // Without write_metadata the name is an ordinary field.
        let tbl = table(&format!(r#"[{{"name":"{name}","type":"STRING"}}]"#));
        assert!(check_compatibility(t.schema(), &tbl, false, false).is_ok());
    }
    // A topic field named `data` is only a warning (docs/contract.md §6 Q7).
    let t = topic(r#"{"type":"record","name":"T","fields":[{"name":"data","type":"string"}]}"#);
    let plan = check_compatibility(
        t.schema(),
        &table(r#"[{"name":"data","type":"STRING"}]"#),
        false,
        true,
    )
    .unwrap();
    assert_eq!(plan.warnings().len(), 1);

    // The root must be a record.
    let e = check_compatibility(topic(r#""string""#).schema(), &tbl(""), true, false).unwrap_err();
    assert_eq!(e.problems[0].rule, CompatRule::Root);
    assert!(e.to_string().contains("must be a record"), "{e}");
}

#[test]
fn every_problem_is_reported_as_a_diff() {
    let t = topic(
        r#"{"type":"record","name":"T","fields":[
                {"name":"project_ids","type":"string"},
                {"name":"note","type":["null","string"]},
                {"name":"extra","type":"int"},
                {"name":"customer","type":{"type":"record","name":"C","fields":[
                    {"name":"tier","type":["int","string"]}]}}]}"#,
    );
    let tbl = table(
        r#"[{"name":"project_ids","type":"INTEGER"},
                {"name":"note","type":"STRING","mode":"REQUIRED"},
                {"name":"customer","type":"RECORD","fields":[{"name":"tier","type":"STRING"}]},
                {"name":"missing","type":"DATE","mode":"REQUIRED"}]"#,
    );
    let e = check_compatibility(t.schema(), &tbl, false, false).unwrap_err();
    let text = e.to_string();
    let expected = "\
use_topic_schema: the topic schema does not fit the table (5 problems):
  extra          topic: int             table: -                → not a column of the table; add the column or set drop_unknown_fields to drop the field
  project_ids    topic: string          table: INT64 NULLABLE   → incompatible schema type: expected INT64, got string (string fits STRING, JSON, TIMESTAMP, DATETIME, DATE, TIME, NUMERIC or BIGNUMERIC)
  note           topic: [null, string]  table: STRING REQUIRED  → an optional topic field (a union with null) needs a NULLABLE column (REPEATED if it is an array or map)
  customer.tier  topic: [int, string]   table: STRING NULLABLE  → not mappable: only a union of null and one type (NULLABLE) has a BigQuery type
  missing        topic: -               table: DATE REQUIRED    → the column is not in the topic schema, so it must be NULLABLE (it is written NULL)";
    assert_eq!(text, expected);
}

// ---- rows ----------------------------------------------------------------------------------

const ORDER: &str = r#"{
      "type": "record", "name": "Order", "namespace": "com.example",
      "fields": [
        {"name": "id", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "total", "type": "long"},
        {"name": "price", "type": "double"},
        {"name": "ratio", "type": "float"},
        {"name": "ok", "type": "boolean"},
        {"name": "raw", "type": "bytes"},
        {"name": "note", "type": ["null", "string"], "default": null},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "DONE"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "props", "type": {"type": "map", "values": "long"}},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "created_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "at_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "big", "type": {"type": "fixed", "name": "Big", "size": 16, "logicalType": "decimal", "precision": 38, "scale": 20}},
        {"name": "when_text", "type": "string"},
        {"name": "doc", "type": "string"},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
          {"name": "name", "type": "string"},
          {"name": "tier", "type": ["null", "int"]}
        ]}},
        {"name": "previous", "type": ["null", "Customer"], "default": null},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
          {"name": "sku", "type": "string"}, {"name": "n", "type": "int"}]}}},
        {"name": "maybe", "type": ["null", {"type": "array", "items": "long"}], "default": null},
        {"name": "extra", "type": "int", "default": 0}
      ]
    }"#;

const ORDER_TABLE: &str = r#"[
        {"name": "id", "type": "STRING", "mode": "REQUIRED"},
        {"name": "qty", "type": "INT64"},
        {"name": "total", "type": "NUMERIC"},
        {"name": "price", "type": "FLOAT64"},
        {"name": "ratio", "type": "BIGNUMERIC"},
        {"name": "ok", "type": "BOOL"},
        {"name": "raw", "type": "BYTES"},
        {"name": "note", "type": "STRING"},
        {"name": "status", "type": "INTEGER"},
        {"name": "tags", "type": "STRING", "mode": "REPEATED"},
        {"name": "props", "type": "RECORD", "mode": "REPEATED", "fields": [
          {"name": "key", "type": "STRING", "maxLength": 5}, {"name": "value", "type": "INT64"}]},
        {"name": "hash", "type": "BYTES"},
        {"name": "created", "type": "TIMESTAMP"},
        {"name": "created_ms", "type": "TIMESTAMP"},
        {"name": "day", "type": "DATE"},
        {"name": "at", "type": "TIME"},
        {"name": "at_ms", "type": "TIME"},
        {"name": "amount", "type": "NUMERIC"},
        {"name": "big", "type": "BIGNUMERIC"},
        {"name": "when_text", "type": "TIMESTAMP"},
        {"name": "doc", "type": "JSON"},
        {"name": "customer", "type": "RECORD", "fields": [
          {"name": "name", "type": "STRING"}, {"name": "tier", "type": "INT64"}]},
        {"name": "previous", "type": "RECORD", "fields": [
          {"name": "name", "type": "STRING"}, {"name": "tier", "type": "INT64"}]},
        {"name": "lines", "type": "RECORD", "mode": "REPEATED", "fields": [
          {"name": "sku", "type": "STRING", "maxLength": 3}, {"name": "n", "type": "INT64"}]},
        {"name": "maybe", "type": "INT64", "mode": "REPEATED"},
        {"name": "absent", "type": "STRING"}
    ]"#;

/// 1234.56 at scale 2 and -1.5 at scale 20, as Avro decimal bytes (big-endian).
fn amount_bytes() -> Vec<u8> {
    vec![0x01, 0xe2, 0x40]
}
fn big_bytes() -> Vec<u8> {
    (-150_000_000_000_000_000_000i128).to_be_bytes().to_vec()
}

/// Order `n` (0 or 1) in the Avro JSON encoding, unions wrapped.
fn order_json(n: usize) -> serde_json::Value {
    let mut v = json!({
        "id": "o-1", "qty": 3, "total": 10_000_000_000i64, "price": 1.5, "ratio": 0.25,
        "ok": true, "raw": json_bytes(&[0, 255, b'A']), "note": {"string": "hi"},
        "status": "DONE", "tags": ["a", "b"], "props": {"y": 2, "x": 1},
        "hash": json_bytes(b"ab\xe9d"), "created": 1_700_000_000_000_000i64,
        "created_ms": 1_700_000_000_123i64, "day": 19_625, "at": 15_000_500_000i64,
        "at_ms": 45_296_789, "amount": json_bytes(&amount_bytes()),
        "big": json_bytes(&big_bytes()), "when_text": "2023-09-25T04:10:00Z",
        "doc": "{\"k\":[1,2]}", "customer": {"name": "Ann", "tier": {"int": 2}},
        "previous": null, "lines": [{"sku": "s1", "n": 1}, {"sku": "s2", "n": 2}],
        "maybe": null, "extra": 5
    });
    if n == 1 {
        v["note"] = json!(null);
        v["previous"] = json!({"com.example.Customer": {"name": "Bob", "tier": null}});
        v["maybe"] = json!({"array": [7, 8]});
        v["props"] = json!({});
        v["tags"] = json!([]);
    }
    v
}

/// The same order as an Avro value, for BINARY messages.
fn order_value(n: usize) -> Value {
    let s = |x: &str| Value::String(x.into());
    let customer = |name: &str, tier: Value| {
        Value::Record(vec![("name".into(), s(name)), ("tier".into(), tier)])
    };
    let line = |sku: &str, k: i32| {
        Value::Record(vec![("sku".into(), s(sku)), ("n".into(), Value::Int(k))])
    };
    let null = || Value::Union(0, Box::new(Value::Null));
    let (note, previous, maybe, props, tags) = if n == 0 {
        (
            Value::Union(1, Box::new(s("hi"))),
            null(),
            null(),
            HashMap::from([
                ("y".to_string(), Value::Long(2)),
                ("x".to_string(), Value::Long(1)),
            ]),
            vec![s("a"), s("b")],
        )
    } else {
        (
            null(),
            Value::Union(1, Box::new(customer("Bob", null()))),
            Value::Union(
                1,
                Box::new(Value::Array(vec![Value::Long(7), Value::Long(8)])),
            ),
            HashMap::new(),
            vec![],
        )
    };
    Value::Record(vec![
        ("id".into(), s("o-1")),
        ("qty".into(), Value::Int(3)),
        ("total".into(), Value::Long(10_000_000_000)),
        ("price".into(), Value::Double(1.5)),
        ("ratio".into(), Value::Float(0.25)),
        ("ok".into(), Value::Boolean(true)),
        ("raw".into(), Value::Bytes(vec![0, 255, b'A'])),
        ("note".into(), note),
        ("status".into(), Value::Enum(1, "DONE".into())),
        ("tags".into(), Value::Array(tags)),
        ("props".into(), Value::Map(props)),
        ("hash".into(), Value::Fixed(4, b"ab\xe9d".to_vec())),
        (
            "created".into(),
            Value::TimestampMicros(1_700_000_000_000_000),
        ),
        (
            "created_ms".into(),
            Value::TimestampMillis(1_700_000_000_123),
        ),
        ("day".into(), Value::Date(19_625)),
        ("at".into(), Value::TimeMicros(15_000_500_000)),
        ("at_ms".into(), Value::TimeMillis(45_296_789)),
        ("amount".into(), Value::Decimal(amount_bytes().into())),
        ("big".into(), Value::Decimal(big_bytes().into())),
        ("when_text".into(), s("2023-09-25T04:10:00Z")),
        ("doc".into(), s("{\"k\":[1,2]}")),
        (
            "customer".into(),
            customer("Ann", Value::Union(1, Box::new(Value::Int(2)))),
        ),
        ("previous".into(), previous),
        (
            "lines".into(),
            Value::Array(vec![line("s1", 1), line("s2", 2)]),
        ),
        ("maybe".into(), maybe),
        ("extra".into(), Value::Int(5)),
    ])
}

fn order_builder(opts: RowOptions) -> RowBuilder {
    RowBuilder::with_topic_schema(&table(ORDER_TABLE), opts, &topic(ORDER))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn dropping() -> RowOptions {
    RowOptions {
        drop_unknown_fields: true,
        ..topic_mode()
    }
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> &'a dyn Array {
    batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_ref()
}

fn ints(a: &dyn Array) -> Vec<Option<i64>> {
    a.as_primitive::<Int64Type>().iter().collect()
}

fn strs(a: &dyn Array) -> Vec<Option<String>> {
    a.as_string::<i32>()
        .iter()
        .map(|s| s.map(str::to_string))
        .collect()
}

#[test]
fn json_and_binary_messages_become_the_same_rows() {
    let schema = topic(ORDER);
    let mut b = order_builder(dropping());
    for n in 0..2 {
        let json = serde_json::to_vec(&order_json(n)).unwrap();
        b.append(&message(&format!("j{n}"), json, "JSON")).unwrap();
        let bin = binary(&schema, order_value(n));
        b.append(&message(&format!("b{n}"), bin, "BINARY")).unwrap();
    }
    let batch = b.finish();
    assert_eq!(batch.num_rows(), 4);
    // Rows 0/1 are order 0 (JSON, BINARY), rows 2/3 order 1.
    assert_eq!(batch.slice(0, 1), batch.slice(1, 1));
    assert_eq!(batch.slice(2, 1), batch.slice(3, 1));
    assert!(batch.column_by_name("extra").is_none());

    assert_eq!(strs(column(&batch, "id"))[0].as_deref(), Some("o-1"));
    assert_eq!(ints(column(&batch, "qty"))[0], Some(3));
    let total = column(&batch, "total").as_primitive::<Decimal128Type>();
    assert_eq!(total.value(0), 10_000_000_000 * 1_000_000_000);
    let price = column(&batch, "price").as_primitive::<Float64Type>();
    assert_eq!(price.value(0), 1.5);
    let ratio = column(&batch, "ratio").as_primitive::<Decimal256Type>();
    assert_eq!(ratio.value(0), i256::from_i128(25) * pow10(36));
    assert!(column(&batch, "ok").as_boolean().value(0));
    assert_eq!(
        column(&batch, "raw").as_binary::<i32>().value(0),
        [0, 255, b'A']
    );
    assert_eq!(
        strs(column(&batch, "note")),
        [Some("hi".into()), Some("hi".into()), None, None]
    );
    assert_eq!(ints(column(&batch, "status"))[0], Some(1));
    let tags = column(&batch, "tags").as_list::<i32>();
    assert_eq!(
        strs(tags.value(0).as_ref()),
        [Some("a".into()), Some("b".into())]
    );
    assert_eq!(tags.value(2).len(), 0);
    assert!(!tags.is_null(2));
    // map → REPEATED RECORD<key, value>, sorted by key.
    let props = column(&batch, "props").as_list::<i32>();
    let entries = props.value(0);
    let entries = entries.as_struct();
    assert_eq!(
        strs(entries.column(0).as_ref()),
        [Some("x".into()), Some("y".into())]
    );
    assert_eq!(ints(entries.column(1).as_ref()), [Some(1), Some(2)]);
    assert_eq!(props.value(2).len(), 0);
    assert_eq!(
        column(&batch, "hash").as_binary::<i32>().value(0),
        b"ab\xe9d"
    );
    let ts = |name| {
        column(&batch, name)
            .as_primitive::<TimestampMicrosecondType>()
            .value(0)
    };
    assert_eq!(ts("created"), 1_700_000_000_000_000);
    assert_eq!(ts("created_ms"), 1_700_000_000_123_000);
    assert_eq!(ts("when_text"), 1_695_615_000_000_000);
    assert_eq!(
        column(&batch, "day").as_primitive::<Date32Type>().value(0),
        19_625
    );
    let time = |name| {
        column(&batch, name)
            .as_primitive::<Time64MicrosecondType>()
            .value(0)
    };
    assert_eq!(time("at"), 15_000_500_000);
    assert_eq!(time("at_ms"), 45_296_789_000);
    let amount = column(&batch, "amount").as_primitive::<Decimal128Type>();
    assert_eq!(amount.value_as_string(0), "1234.560000000");
    let big = column(&batch, "big").as_primitive::<Decimal256Type>();
    assert_eq!(big.value(0), -i256::from_i128(15) * pow10(37));
    assert_eq!(
        strs(column(&batch, "doc"))[0].as_deref(),
        Some("{\"k\":[1,2]}")
    );
    // Records, nullable records, arrays of records.
    let customer = column(&batch, "customer").as_struct();
    assert_eq!(strs(customer.column(0).as_ref())[0].as_deref(), Some("Ann"));
    assert_eq!(ints(customer.column(1).as_ref())[0], Some(2));
    let previous = column(&batch, "previous").as_struct();
    assert!(previous.is_null(0));
    assert!(previous.is_valid(2));
    assert_eq!(strs(previous.column(0).as_ref())[2].as_deref(), Some("Bob"));
    assert!(previous.column(1).is_null(2));
    let lines = column(&batch, "lines").as_list::<i32>();
    let l0 = lines.value(0);
    let l0: &StructArray = l0.as_struct();
    assert_eq!(
        strs(l0.column(0).as_ref()),
        [Some("s1".into()), Some("s2".into())]
    );
    assert_eq!(ints(l0.column(1).as_ref()), [Some(1), Some(2)]);
    // A null optional array is an empty REPEATED value.
    let maybe = column(&batch, "maybe").as_list::<i32>();
    assert_eq!(maybe.value(0).len(), 0);
    assert_eq!(ints(maybe.value(2).as_ref()), [Some(7), Some(8)]);
    // A column the topic lacks is NULL.
    assert_eq!(column(&batch, "absent").null_count(), 4);
}

#[test]
fn unknown_fields_need_drop_unknown_fields() {
    let e = RowBuilder::with_topic_schema(&table(ORDER_TABLE), topic_mode(), &topic(ORDER))
        .unwrap_err();
    assert_eq!(e.problems.len(), 1, "{e}");
    assert_eq!(
        (e.problems[0].path.as_str(), e.problems[0].rule),
        ("extra", CompatRule::UnknownField)
    );
    // With the column, the field is written.
    let with_extra = ORDER_TABLE.replace(
        r#"{"name": "absent", "type": "STRING"}"#,
        r#"{"name": "absent", "type": "STRING"}, {"name": "extra", "type": "INT64"}"#,
    );
    let mut b =
        RowBuilder::with_topic_schema(&table(&with_extra), topic_mode(), &topic(ORDER)).unwrap();
    let json = serde_json::to_vec(&order_json(0)).unwrap();
    b.append(&message("1", json, "JSON")).unwrap();
    assert_eq!(ints(column(&b.finish(), "extra")), [Some(5)]);
}

#[test]
fn metadata_columns_in_topic_mode() {
    let opts = RowOptions {
        write_metadata: true,
        subscription_name: "projects/p/subscriptions/s".into(),
        ..dropping()
    };
    let tbl = ORDER_TABLE.replace(
        r#"{"name": "absent", "type": "STRING"}"#,
        r#"{"name": "Message_Id", "type": "STRING", "mode": "REQUIRED"}"#,
    );
    let mut b = RowBuilder::with_topic_schema(&table(&tbl), opts.clone(), &topic(ORDER)).unwrap();
    let names: Vec<&str> = b.columns().iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names[names.len() - 4..],
        [
            "Message_Id",
            "subscription_name",
            "publish_time",
            "attributes"
        ]
    );
    let json = serde_json::to_vec(&order_json(0)).unwrap();
    b.append(&message("m-1", json, "JSON")).unwrap();
    let batch = b.finish();
    assert_eq!(strs(column(&batch, "Message_Id")), [Some("m-1".into())]);
    assert_eq!(
        strs(column(&batch, "attributes")),
        [Some(r#"{"googclient_schemaencoding":"JSON"}"#.into())]
    );

    // A topic field named like a metadata column, and a metadata column of the wrong type,
    // are reported together.
    let clash = ORDER.replace(
        r#"{"name": "extra""#,
        r#"{"name": "publishTime", "type": "long"}, {"name": "extra""#,
    );
    let bad_meta = tbl.replace(
        r#"{"name": "Message_Id", "type": "STRING", "mode": "REQUIRED"}"#,
        r#"{"name": "Message_Id", "type": "INT64"}"#,
    );
    let e = RowBuilder::with_topic_schema(&table(&bad_meta), opts, &topic(&clash)).unwrap_err();
    let rules: Vec<(&str, CompatRule)> = e
        .problems
        .iter()
        .map(|p| (p.path.as_str(), p.rule))
        .collect();
    assert_eq!(
        rules,
        [
            ("Message_Id", CompatRule::Table),
            ("publishTime", CompatRule::MetadataName)
        ],
        "{e}"
    );
    assert_eq!(e.problems[0].table, "INT64 NULLABLE");
}

#[test]
fn the_plain_constructor_refuses_topic_mode() {
    let e = RowBuilder::new(&table(ORDER_TABLE), topic_mode()).unwrap_err();
    assert!(e.reason.contains("with_topic_schema"), "{e}");
    let e = RowBuilder::with_topic_schema(
        &table(ORDER_TABLE),
        RowOptions {
            drop_unknown_fields: true,
            ..RowOptions::default()
        },
        &topic(ORDER),
    )
    .unwrap_err();
    assert_eq!(e.problems[0].rule, CompatRule::Table, "{e}");
}

fn failure(b: &mut RowBuilder, m: &Message) -> RowError {
    let before = b.len();
    let e = b.append(m).expect_err(&m.message_id);
    assert_eq!(b.len(), before, "a bad message adds nothing");
    assert_eq!(e.message_id, m.message_id);
    e
}

#[test]
fn bad_messages_fail_alone_with_id_field_and_rule() {
    let schema = topic(ORDER);
    let mut b = order_builder(dropping());
    let good = || message("good", serde_json::to_vec(&order_json(0)).unwrap(), "JSON");
    b.append(&good()).unwrap();
    let json_with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = order_json(0);
        edit(&mut v);
        serde_json::to_vec(&v).unwrap()
    };
    type Fields = Vec<(String, Value)>;
    let bin_with = |edit: &dyn Fn(&mut Fields)| {
        let Value::Record(mut fields) = order_value(0) else {
            unreachable!()
        };
        edit(&mut fields);
        binary(&schema, Value::Record(fields))
    };
    let set = |name: &'static str, v: Value| {
        move |fields: &mut Fields| {
            fields.iter_mut().find(|(n, _)| n == name).unwrap().1 = v.clone();
        }
    };
    let cases: Vec<(Message, &str, &str)> = vec![
        (
            message("m1", b"{nope".to_vec(), "JSON"),
            "$",
            "not valid JSON",
        ),
        (
            message("m2", json_with(&|v| v["qty"] = json!("three")), "JSON"),
            "qty",
            "expected an int",
        ),
        (
            message(
                "m3",
                json_with(&|v| v["customer"]["tier"] = json!({"boolean": true})),
                "JSON",
            ),
            "customer.tier",
            "expected an int",
        ),
        (
            message(
                "m4",
                json_with(&|v| v["when_text"] = json!("yesterday")),
                "JSON",
            ),
            "when_text",
            "TIMESTAMP",
        ),
        (
            message("m5", json_with(&|v| v["doc"] = json!("{")), "JSON"),
            "doc",
            "invalid JSON",
        ),
        (
            message("m6", json_with(&|v| v["ratio"] = json!("NaN")), "JSON"),
            "ratio",
            "not a finite number",
        ),
        (
            message(
                "m7",
                json_with(&|v| v["props"] = json!({"toolong": 1})),
                "JSON",
            ),
            "props[\"toolong\"].key",
            "maxLength 5",
        ),
        (
            // The path comes from the error's structure, not its text: a key with `: ` in it
            // stays whole.
            message(
                "m7b",
                json_with(&|v| v["props"] = json!({"a: b": "x"})),
                "JSON",
            ),
            "props[\"a: b\"]",
            "expected a long",
        ),
        (
            message(
                "m8",
                json_with(&|v| v["lines"][1]["sku"] = json!("long")),
                "JSON",
            ),
            "lines[1].sku",
            "maxLength 3",
        ),
        (
            message(
                "m9",
                bin_with(&set("day", Value::Date(3_000_000))),
                "BINARY",
            ),
            "day",
            "DATE",
        ),
        (
            message(
                "m10",
                bin_with(&set("created_ms", Value::TimestampMillis(i64::MAX / 10))),
                "BINARY",
            ),
            "created_ms",
            "TIMESTAMP",
        ),
        (
            message(
                "m11",
                bin_with(&set("at", Value::TimeMicros(86_400_000_000))),
                "BINARY",
            ),
            "at",
            "TIME",
        ),
        (
            message(
                "m12",
                bin_with(&set("ratio", Value::Float(f32::INFINITY))),
                "BINARY",
            ),
            "ratio",
            "not a finite number",
        ),
        (
            message(
                "m13",
                {
                    let mut d = binary(&schema, order_value(0));
                    d.truncate(d.len() - 2);
                    d
                },
                "BINARY",
            ),
            "$",
            "BINARY data does not decode",
        ),
        (
            message(
                "m14",
                {
                    let mut d = binary(&schema, order_value(0));
                    d.push(0);
                    d
                },
                "BINARY",
            ),
            "$",
            "1 bytes left",
        ),
        (
            message("m15", b"{}".to_vec(), "XML"),
            "$",
            "unknown schema encoding",
        ),
    ];
    for (m, field, reason) in &cases {
        let e = failure(&mut b, m);
        assert_eq!(e.field, *field, "{}: {e}", m.message_id);
        assert_eq!(e.kind, RowErrorKind::Invalid);
        assert!(
            e.reason.contains(reason),
            "{}: {e} lacks {reason:?}",
            m.message_id
        );
    }
    b.append(&good()).unwrap();
    let batch = b.finish();
    assert_eq!(batch.num_rows(), 2);
    assert_eq!(batch.slice(0, 1), batch.slice(1, 1));
}

#[test]
fn decimals_keep_their_exact_value() {
    let t = topic(
        r#"{"type":"record","name":"T","fields":[
                {"name":"d","type":{"type":"bytes","logicalType":"decimal","precision":30,"scale":12}},
                {"name":"b","type":"bytes"},
                {"name":"l","type":"long"},
                {"name":"f","type":"float"}]}"#,
    );
    let tbl = table(
        r#"[{"name":"d","type":"NUMERIC"},{"name":"b","type":"NUMERIC"},
                {"name":"l","type":"BIGNUMERIC"},{"name":"f","type":"NUMERIC"}]"#,
    );
    let mut b = RowBuilder::with_topic_schema(&tbl, topic_mode(), &t).unwrap();
    let row = |d: i128, l: i64, f: f32| {
        let be = d.to_be_bytes();
        let start = be
            .iter()
            .position(|&x| x != 0 && x != 0xff)
            .unwrap_or(15)
            .saturating_sub(1);
        Value::Record(vec![
            ("d".into(), Value::Decimal(be[start..].to_vec().into())),
            // BigDecimalByteStringEncoder bytes of 123.124 (docs/contract.md §4.3.2).
            ("b".into(), Value::Bytes(vec![0x00, 0x25, 0xc3, 0xaa, 0x1c])),
            ("l".into(), Value::Long(l)),
            ("f".into(), Value::Float(f)),
        ])
    };
    // 1.230000000000 at scale 12 fits NUMERIC's 9 (only zeros beyond).
    b.append(&message(
        "1",
        binary(&t, row(1_230_000_000_000, i64::MIN, 0.1)),
        "BINARY",
    ))
    .unwrap();
    let batch = b.finish();
    let dec = |name| {
        column(&batch, name)
            .as_primitive::<Decimal128Type>()
            .value_as_string(0)
    };
    assert_eq!(dec("d"), "1.230000000");
    assert_eq!(dec("b"), "123.124000000");
    assert_eq!(dec("f"), "0.100000000", "a float's shortest decimal form");
    let l = column(&batch, "l").as_primitive::<Decimal256Type>();
    assert_eq!(
        l.value(0),
        i256::from_i128(i128::from(i64::MIN)) * pow10(38)
    );
    // A digit beyond NUMERIC's scale fails the message rather than being rounded.
    let e = failure(
        &mut b,
        &message("2", binary(&t, row(1_000_000_000_001, 0, 0.0)), "BINARY"),
    );
    assert_eq!(e.field, "d");
    assert!(e.reason.contains("more than 9 fractional digits"), "{e}");
}

/// Gives revision "r2" (one more field, with its column) and "bad" (a field of the wrong type).
#[derive(Debug)]
struct Revisions;

impl crate::avro::FetchRevision for Revisions {
    fn fetch(&self, revision: &str) -> Result<Option<TopicSchema>, String> {
        Ok(match revision {
            "r2" => Some(topic(
                r#"{"type":"record","name":"R","fields":[{"name":"id","type":"long"},{"name":"note","type":["null","string"],"default":null}]}"#,
            )),
            "bad" => Some(topic(
                r#"{"type":"record","name":"R","fields":[{"name":"id","type":"string"}]}"#,
            )),
            _ => None,
        })
    }
}

#[test]
fn a_revision_met_while_running_is_checked_against_the_table() {
    let v1 = topic(r#"{"type":"record","name":"R","fields":[{"name":"id","type":"long"}]}"#);
    let schemas = crate::avro::TopicSchemas::new(v1.clone(), [("r1".to_string(), v1)].into())
        .with_fetch(std::sync::Arc::new(Revisions));
    let tbl = table(
        r#"[{"name": "id", "type": "INT64", "mode": "REQUIRED"}, {"name": "note", "type": "STRING"}]"#,
    );
    let mut b = RowBuilder::with_topic_schemas(&tbl, topic_mode(), &schemas).unwrap();
    let msg = |id: &str, rev: &str, data: &str| {
        let mut m = message(id, data.as_bytes().to_vec(), "JSON");
        m.attributes
            .insert("googclient_schemarevisionid".into(), rev.into());
        m
    };
    b.append(&msg("1", "r1", r#"{"id": 1}"#)).unwrap();
    // Revision 2 was not known at start: fetched, checked, its new field written.
    b.append(&msg("2", "r2", r#"{"id": 2, "note": {"string": "n"}}"#))
        .unwrap();
    // A revision that does not fit the table fails its messages, naming it.
    let e = b
        .append(&msg("3", "bad", r#"{"id": "x"}"#))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("schema revision bad does not fit the table"),
        "{e}"
    );
    // An unknown revision is read with the fallback.
    b.append(&msg("4", "gone", r#"{"id": 4}"#)).unwrap();
    let batch = b.finish();
    assert_eq!(ints(column(&batch, "id")), [Some(1), Some(2), Some(4)]);
    let notes = column(&batch, "note").as_string::<i32>();
    assert_eq!(
        (0..3)
            .map(|i| notes.is_valid(i).then(|| notes.value(i)))
            .collect::<Vec<_>>(),
        [None, Some("n"), None]
    );
}
