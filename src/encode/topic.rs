//! Topic schemas: Avro layouts C and D (docs/contract.md §3.7, Q7, Q8).
//!
//! With `use_topic_schema`, each message's `data` is a datum of the topic's Avro schema, published
//! either as Avro JSON or as Avro binary (`googclient_schemaencoding` says which, docs/contract.md §1.2). The
//! container writer ([`super::avro`]) writes it as one datum of the output file, read and checked by
//! the Avro layer: [`TopicSchema::encode_datum`] (the forms of Avro JSON accepted are listed in
//! [`crate::avro::topic`]). A message that fails is an [`EncodeError::BadMessage`](super::EncodeError::BadMessage) naming the
//! message id, the encoding and the place in the datum that failed.
//!
//! The topic-schema model lives in [`crate::avro`], shared with the table writer; it is re-exported
//! here under its former path.

pub use crate::avro::{
    FetchRevision, SchemaEncoding, SchemaError, TopicSchema, TopicSchemaSource, TopicSchemas,
    ENCODING_ATTRIBUTE, RESERVED_METADATA_FIELDS, REVISION_ID_ATTRIBUTE,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::avro::testutil::*;
    use crate::encode::avro::{AvroFormat, AvroLayout, Codec, DEFAULT_BLOCK_TARGET};
    use crate::encode::{EncodeError, FileFormat};
    use crate::message::Message;
    use apache_avro::types::Value;
    use apache_avro::Schema;
    use serde_json::Value as Json;

    const ORDER_SCHEMA: &str = r#"{
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
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
          {"name": "name", "type": "string"},
          {"name": "tier", "type": ["null", "int", "string"]}
        ]}},
        {"name": "previous", "type": ["null", "Customer"], "default": null},
        {"name": "state2", "type": "Status", "default": "NEW"},
        {"name": "count", "type": "int", "default": 7}
      ]
    }"#;

    /// The Avro JSON of one order, every union wrapped as Pub/Sub requires.
    const ORDER_JSON: &str = r#"{"id": "o-1", "qty": 3, "total": 10000000000, "price": 1.5,
        "ratio": 0.25, "ok": true, "raw": "\u0000\u00ffA", "note": {"string": "hi"},
        "status": "DONE", "tags": ["a", "b"], "props": {"x": 1}, "hash": "ab\u00e9d",
        "created": 1700000000000000, "customer": {"name": "Ann", "tier": {"int": 2}},
        "previous": {"com.example.Customer": {"name": "Bob", "tier": null}}}"#;

    fn customer(name: &str, tier: Value) -> Value {
        Value::Record(vec![
            ("name".into(), Value::String(name.into())),
            ("tier".into(), tier),
        ])
    }

    /// What `apache_avro::Reader` must return for `ORDER_JSON`.
    fn order_value() -> Value {
        Value::Record(vec![
            ("id".into(), Value::String("o-1".into())),
            ("qty".into(), Value::Int(3)),
            ("total".into(), Value::Long(10_000_000_000)),
            ("price".into(), Value::Double(1.5)),
            ("ratio".into(), Value::Float(0.25)),
            ("ok".into(), Value::Boolean(true)),
            ("raw".into(), Value::Bytes(vec![0, 255, b'A'])),
            (
                "note".into(),
                Value::Union(1, Box::new(Value::String("hi".into()))),
            ),
            ("status".into(), Value::Enum(1, "DONE".into())),
            (
                "tags".into(),
                Value::Array(vec![Value::String("a".into()), Value::String("b".into())]),
            ),
            (
                "props".into(),
                Value::Map([("x".to_string(), Value::Long(1))].into_iter().collect()),
            ),
            ("hash".into(), Value::Fixed(4, vec![b'a', b'b', 0xe9, b'd'])),
            (
                "created".into(),
                Value::TimestampMicros(1_700_000_000_000_000),
            ),
            (
                "customer".into(),
                customer("Ann", Value::Union(1, Box::new(Value::Int(2)))),
            ),
            (
                "previous".into(),
                Value::Union(
                    1,
                    Box::new(customer("Bob", Value::Union(0, Box::new(Value::Null)))),
                ),
            ),
            ("state2".into(), Value::Enum(0, "NEW".into())),
            ("count".into(), Value::Int(7)),
        ])
    }

    fn topic(text: &str) -> TopicSchema {
        text.parse().unwrap()
    }

    fn binary_of(schema: &TopicSchema, value: &Value) -> Vec<u8> {
        apache_avro::writer::datum::GenericDatumWriter::builder(schema.schema())
            .build()
            .unwrap()
            .write_value_to_vec(value.clone())
            .unwrap()
    }

    fn message(id: &str, data: &[u8], attrs: &[(&str, &str)]) -> Message {
        Message {
            data: bytes::Bytes::copy_from_slice(data),
            attributes: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            message_id: id.into(),
            publish_time_micros: 1_700_000_000_123_456,
            ordering_key: String::new(),
        }
    }

    /// The same order published as wrapped JSON, lenient JSON and BINARY, with and without the
    /// encoding attribute.
    fn order_messages(schema: &TopicSchema) -> Vec<Message> {
        let binary = binary_of(schema, &order_value());
        let mut lenient: Json = serde_json::from_str(ORDER_JSON).unwrap();
        lenient["note"] = Json::from("hi");
        lenient["previous"] = serde_json::json!({"name": "Bob"});
        lenient["state2"] = Json::from("NEW");
        lenient["unknown_extra"] = Json::from(1);
        vec![
            message("j1", ORDER_JSON.as_bytes(), &[(ENCODING_ATTRIBUTE, "JSON")]),
            message("j2", ORDER_JSON.as_bytes(), &[]),
            message(
                "j3",
                lenient.to_string().as_bytes(),
                &[
                    (ENCODING_ATTRIBUTE, "JSON"),
                    (REVISION_ID_ATTRIBUTE, "3afd3cc8"),
                ],
            ),
            message("b1", &binary, &[(ENCODING_ATTRIBUTE, "BINARY"), ("k", "v")]),
        ]
    }

    fn encode_one(format: &AvroFormat, m: &Message) -> Result<Vec<u8>, EncodeError> {
        let mut enc = format.new_file(SYNC, None).unwrap();
        let mut scratch = Vec::new();
        enc.encode(m, &mut scratch).map(|_| scratch)
    }

    fn reason(format: &AvroFormat, m: &Message) -> String {
        match encode_one(format, m) {
            Err(EncodeError::BadMessage { message_id, reason }) => {
                assert_eq!(message_id, m.message_id);
                reason
            }
            Err(e) => panic!("message {}: not a bad message: {e}", m.message_id),
            Ok(_) => panic!("message {} was accepted", m.message_id),
        }
    }

    #[test]
    fn layout_c_round_trips_json_and_binary_with_every_codec() {
        let schema = topic(ORDER_SCHEMA);
        let messages = order_messages(&schema);
        for codec in Codec::ALL {
            for target in [DEFAULT_BLOCK_TARGET, 1] {
                let layout = AvroLayout::TopicSchema(schema.clone());
                let f = AvroFormat::new(layout, SUBSCRIPTION.into(), codec, target).unwrap();
                let (bytes, estimated) = write_file(&f, &messages);
                if codec == Codec::Null {
                    assert_eq!(estimated, bytes.len());
                }
                let (writer_schema, records) = read_file(&bytes, codec);
                assert_eq!(&writer_schema, schema.schema());
                assert_eq!(records.len(), messages.len());
                for r in &records {
                    assert_eq!(r, &order_value());
                }
            }
        }
    }

    #[test]
    fn layout_d_appends_the_metadata_fields_with_every_codec() {
        let schema = topic(ORDER_SCHEMA);
        let mut messages = order_messages(&schema);
        messages[0].ordering_key = "key-1".into();
        messages[1].publish_time_micros = -5;
        for codec in Codec::ALL {
            let layout = AvroLayout::TopicSchemaWithMetadata(schema.clone());
            let f = AvroFormat::new(layout, SUBSCRIPTION.into(), codec, 100).unwrap();
            let (bytes, estimated) = write_file(&f, &messages);
            if codec == Codec::Null {
                assert_eq!(estimated, bytes.len());
            }
            let (writer_schema, records) = read_file(&bytes, codec);
            let Schema::Record(record) = &writer_schema else {
                panic!("not a record")
            };
            let names: Vec<&str> = record.fields.iter().map(|f| f.name.as_str()).collect();
            assert_eq!(names.len(), 17 + 4);
            assert_eq!(
                names[17..],
                [
                    "subscription_name",
                    "message_id",
                    "publish_time",
                    "attributes"
                ]
            );
            assert_eq!(records.len(), messages.len());
            let Value::Record(expected_topic_fields) = order_value() else {
                unreachable!()
            };
            for (r, m) in records.iter().zip(&messages) {
                let Value::Record(fields) = r else {
                    panic!("not a record")
                };
                assert_eq!(fields[..17], expected_topic_fields[..]);
                assert_metadata(r, m);
                assert!(fields.iter().all(|(n, _)| n != "data"));
            }
        }
    }

    #[test]
    fn layout_d_rejects_non_records_and_reserved_fields() {
        let layout = AvroLayout::TopicSchemaWithMetadata(topic(r#""string""#));
        let err = AvroFormat::new(layout, SUBSCRIPTION.into(), Codec::Null, 1).unwrap_err();
        assert!(
            matches!(err, SchemaError::RootNotRecord(ref k) if k == "string"),
            "{err}"
        );

        let clashing = r#"{"type": "record", "name": "R", "fields": [
            {"name": "message_id", "type": "string"}, {"name": "x", "type": "int"},
            {"name": "attributes", "type": "string"}, {"name": "publishTime", "type": "long"}]}"#;
        let layout = AvroLayout::TopicSchemaWithMetadata(topic(clashing));
        let err = AvroFormat::new(layout, SUBSCRIPTION.into(), Codec::Null, 1).unwrap_err();
        let SchemaError::MetadataFieldConflict(fields) = &err else {
            panic!("{err}")
        };
        assert_eq!(fields, &["message_id", "attributes", "publishTime"]);
        assert!(err
            .to_string()
            .contains("message_id, attributes, publishTime"));

        // Layout C has no such restriction.
        let layout = AvroLayout::TopicSchema(topic(clashing));
        assert!(AvroFormat::new(layout, SUBSCRIPTION.into(), Codec::Null, 1).is_ok());
    }

    #[test]
    fn layout_c_accepts_non_record_and_recursive_schemas() {
        let text = topic(r#""string""#);
        let f = AvroFormat::new(
            AvroLayout::TopicSchema(text),
            SUBSCRIPTION.into(),
            Codec::Null,
            1,
        )
        .unwrap();
        let (bytes, _) = write_file(&f, &[message("1", "\"héllo\"".as_bytes(), &[])]);
        assert_eq!(
            read_file(&bytes, Codec::Null).1,
            [Value::String("héllo".into())]
        );

        let list = topic(
            r#"{"type": "record", "name": "Node", "namespace": "n", "fields": [
                {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}"#,
        );
        let f = AvroFormat::new(
            AvroLayout::TopicSchema(list),
            SUBSCRIPTION.into(),
            Codec::Null,
            1,
        )
        .unwrap();
        let data =
            br#"{"v": 1, "next": {"n.Node": {"v": 2, "next": {"Node": {"v": 3, "next": null}}}}}"#;
        let (bytes, _) = write_file(&f, &[message("1", data, &[])]);
        let node = |v: i32, next: Value| {
            Value::Record(vec![("v".into(), Value::Int(v)), ("next".into(), next)])
        };
        let null = Value::Union(0, Box::new(Value::Null));
        let expected = node(
            1,
            Value::Union(
                1,
                Box::new(node(2, Value::Union(1, Box::new(node(3, null))))),
            ),
        );
        assert_eq!(read_file(&bytes, Codec::Null).1, [expected]);
    }

    #[test]
    fn bad_messages_are_rejected_with_id_and_reason() {
        let schema = topic(ORDER_SCHEMA);
        let f = AvroFormat::new(
            AvroLayout::TopicSchema(schema.clone()),
            SUBSCRIPTION.into(),
            Codec::Null,
            DEFAULT_BLOCK_TARGET,
        )
        .unwrap();
        let with = |edit: &dyn Fn(&mut Json)| -> Vec<u8> {
            let mut v: Json = serde_json::from_str(ORDER_JSON).unwrap();
            edit(&mut v);
            v.to_string().into_bytes()
        };
        let json = [(ENCODING_ATTRIBUTE, "JSON")];
        let cases: Vec<(Message, &str)> = vec![
            (
                message("m1", b"{not json", &json),
                "JSON data is not valid JSON",
            ),
            (
                message("m2", &with(&|v| v["qty"] = Json::from("three")), &json),
                "at $.qty: expected an int",
            ),
            (
                message("m3", &with(&|v| v["qty"] = Json::from(1u64 << 40)), &json),
                "at $.qty: expected an int",
            ),
            (
                message(
                    "m4",
                    &with(&|v| v["customer"]["tier"] = serde_json::json!({"boolean": true})),
                    &json,
                ),
                "at $.customer.tier: a union value must be null or",
            ),
            (
                message("m5", &with(&|v| v["status"] = Json::from("OLD")), &json),
                "\"OLD\" is not a symbol of enum Status (NEW, DONE)",
            ),
            (
                message("m6", &with(&|v| v["hash"] = Json::from("abc")), &json),
                "at $.hash: expected 4 bytes for fixed Hash, got 3",
            ),
            (
                message(
                    "m7",
                    &with(&|v| {
                        v.as_object_mut().unwrap().remove("id");
                    }),
                    &json,
                ),
                "at $.id: missing field",
            ),
            (
                message("m8", &with(&|v| v["raw"] = Json::from("€")), &json),
                "at $.raw: '€' (U+20AC) cannot be a byte",
            ),
            (
                message("m9", &with(&|v| v["tags"][1] = Json::from(5)), &json),
                "at $.tags[1]: expected a string, got 5",
            ),
            (
                message("m10", &with(&|v| v["props"]["x"] = Json::from(0.5)), &json),
                "at $.props[\"x\"]: expected a long",
            ),
            (
                message(
                    "m11",
                    &with(&|v| v["note"] = serde_json::json!({"string": 5})),
                    &json,
                ),
                "at $.note<string>: expected a string, got 5",
            ),
            (
                message("m12", b"{}", &[(ENCODING_ATTRIBUTE, "XML")]),
                "unknown schema encoding \"XML\"",
            ),
        ];
        for (m, expected) in &cases {
            let r = reason(&f, m);
            assert!(
                r.contains(expected),
                "{}: {r:?} lacks {expected:?}",
                m.message_id
            );
        }

        let binary = binary_of(&schema, &order_value());
        let bin = [(ENCODING_ATTRIBUTE, "BINARY")];
        let truncated = message("b1", &binary[..binary.len() - 3], &bin);
        assert!(
            reason(&f, &truncated).contains("BINARY data does not decode with the topic schema")
        );
        let mut long = binary.clone();
        long.push(0);
        let r = reason(&f, &message("b2", &long, &bin));
        assert!(r.contains("1 bytes left after the datum"), "{r}");
        let r = reason(&f, &message("b3", ORDER_JSON.as_bytes(), &bin));
        assert!(r.contains("BINARY data does not decode"), "{r}");
    }

    #[test]
    fn a_bad_message_leaves_the_file_intact() {
        let schema = topic(ORDER_SCHEMA);
        let f = AvroFormat::new(
            AvroLayout::TopicSchemaWithMetadata(schema),
            SUBSCRIPTION.into(),
            Codec::Null,
            DEFAULT_BLOCK_TARGET,
        )
        .unwrap();
        let mut enc = f.new_file(SYNC, None).unwrap();
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        enc.header(&mut out);
        let good = message("g", ORDER_JSON.as_bytes(), &[]);
        let bad = message("b", br#"{"id": 1}"#, &[]);
        enc.encode(&good, &mut scratch).unwrap();
        enc.append(&scratch, &mut out);
        assert!(enc.encode(&bad, &mut scratch).is_err());
        enc.encode(&good, &mut scratch).unwrap();
        enc.append(&scratch, &mut out);
        enc.finish(&mut out);
        assert_eq!(read_file(&out, Codec::Null).1.len(), 2);
    }

    #[test]
    fn default_encoding_applies_without_the_attribute() {
        let schema = TopicSchema::parse(ORDER_SCHEMA, SchemaEncoding::Binary).unwrap();
        assert_eq!(schema.default_encoding(), SchemaEncoding::Binary);
        let binary = binary_of(&schema, &order_value());
        let f = AvroFormat::new(
            AvroLayout::TopicSchema(schema),
            SUBSCRIPTION.into(),
            Codec::Null,
            DEFAULT_BLOCK_TARGET,
        )
        .unwrap();
        let messages = [
            message("1", &binary, &[]),
            message("2", ORDER_JSON.as_bytes(), &[(ENCODING_ATTRIBUTE, "json")]),
        ];
        let (bytes, _) = write_file(&f, &messages);
        assert_eq!(
            read_file(&bytes, Codec::Null).1,
            [order_value(), order_value()]
        );
        let r = reason(&f, &message("3", ORDER_JSON.as_bytes(), &[]));
        assert!(r.contains("BINARY data does not decode"), "{r}");
    }

    #[test]
    fn topic_layouts_group_files_by_schema_revision() {
        let schema = topic(ORDER_SCHEMA);
        let with_rev = message("1", b"{}", &[(REVISION_ID_ATTRIBUTE, "3afd3cc8")]);
        let without = message("2", b"{}", &[]);
        for layout in [
            AvroLayout::TopicSchema(schema.clone()),
            AvroLayout::TopicSchemaWithMetadata(schema.clone()),
        ] {
            let f = AvroFormat::new(layout, SUBSCRIPTION.into(), Codec::Null, 1).unwrap();
            assert_eq!(f.group_key(&with_rev).as_deref(), Some("3afd3cc8"));
            assert_eq!(f.group_key(&without), None);
        }
    }

    #[test]
    fn schemas_load_from_files_and_report_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("order.avsc");
        std::fs::write(&path, ORDER_SCHEMA).unwrap();
        let loaded = TopicSchema::from_file(&path, SchemaEncoding::Binary).unwrap();
        assert_eq!(loaded.default_encoding(), SchemaEncoding::Binary);
        assert_eq!(loaded.schema(), topic(ORDER_SCHEMA).schema());
        assert!(!loaded.schema_json().contains('\n'));
        assert!(loaded
            .schema_json()
            .starts_with(r#"{"type":"record","name":"Order""#));

        let missing =
            TopicSchema::from_file(dir.path().join("nope.avsc"), SchemaEncoding::Json).unwrap_err();
        assert!(matches!(missing, SchemaError::Read { .. }), "{missing}");
        assert!(missing.to_string().contains("nope.avsc"));
        let not_json = "{".parse::<TopicSchema>().unwrap_err();
        assert!(matches!(not_json, SchemaError::Json(_)), "{not_json}");
        let not_avro = r#"{"type": "record", "name": "R"}"#.parse::<TopicSchema>().unwrap_err();
        assert!(matches!(not_avro, SchemaError::Avro(_)), "{not_avro}");
    }

    #[test]
    fn encodings_parse() {
        assert_eq!(
            "JSON".parse::<SchemaEncoding>().unwrap(),
            SchemaEncoding::Json
        );
        assert_eq!(
            "BINARY".parse::<SchemaEncoding>().unwrap(),
            SchemaEncoding::Binary
        );
        assert_eq!(
            "binary".parse::<SchemaEncoding>().unwrap(),
            SchemaEncoding::Binary
        );
        assert!("XML".parse::<SchemaEncoding>().is_err());
        assert_eq!(SchemaEncoding::default(), SchemaEncoding::Json);
        assert_eq!(SchemaEncoding::Binary.to_string(), "BINARY");
    }

    #[test]
    fn json_special_floats_and_logical_types() {
        let schema = topic(
            r#"{"type": "record", "name": "L", "fields": [
                {"name": "d", "type": "double"}, {"name": "f", "type": "float"},
                {"name": "day", "type": {"type": "int", "logicalType": "date"}},
                {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
                {"name": "when", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]}
            ]}"#,
        );
        let f = AvroFormat::new(
            AvroLayout::TopicSchema(schema),
            SUBSCRIPTION.into(),
            Codec::Null,
            1,
        )
        .unwrap();
        let data = br#"{"d": "-Infinity", "f": 2, "day": 19000,
            "id": "67e55044-10b1-426f-9247-bb680e5fe0c8", "when": {"long": 5}}"#;
        let (bytes, _) = write_file(&f, &[message("1", data, &[])]);
        let records = read_file(&bytes, Codec::Null).1;
        let r = &records[0];
        assert_eq!(field(r, "d"), &Value::Double(f64::NEG_INFINITY));
        assert_eq!(field(r, "f"), &Value::Float(2.0));
        assert_eq!(field(r, "day"), &Value::Date(19000));
        assert_eq!(
            field(r, "id"),
            &Value::Uuid("67e55044-10b1-426f-9247-bb680e5fe0c8".parse().unwrap())
        );
        assert_eq!(
            field(r, "when"),
            &Value::Union(1, Box::new(Value::TimestampMillis(5)))
        );
        // A uuid that does not parse fails the decode check rather than landing in the file.
        let bad = br#"{"d": 1, "f": 1, "day": 1, "id": "not-a-uuid", "when": null}"#;
        let r = reason(&f, &message("2", bad, &[]));
        assert!(
            r.contains("JSON data does not decode with the topic schema"),
            "{r}"
        );
    }
}
