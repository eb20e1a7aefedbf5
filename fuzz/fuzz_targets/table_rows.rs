//! Fuzzes the JSON → row mapper (`subsink::table::RowBuilder`, use_table_schema with metadata)
//! with a schema of every column type, nested RECORD and REPEATED columns included: any payload
//! and attributes must give a row or a per-message error without a panic; the batch holds one
//! row per accepted message, and casts to its Delta form.

#![no_main]

use libfuzzer_sys::fuzz_target;
use subsink::message::Message;
use subsink::table::{
    delta_arrow_schema, to_delta_batch, RowBuilder, RowOptions, SchemaMode, TableSchema,
};

const SCHEMA: &str = r#"[
  {"name": "s", "type": "STRING", "maxLength": "8"},
  {"name": "b", "type": "BYTES"},
  {"name": "i", "type": "INT64"},
  {"name": "f", "type": "FLOAT64"},
  {"name": "n", "type": "NUMERIC"},
  {"name": "bn", "type": "BIGNUMERIC"},
  {"name": "ok", "type": "BOOL"},
  {"name": "ts", "type": "TIMESTAMP"},
  {"name": "d", "type": "DATE"},
  {"name": "t", "type": "TIME"},
  {"name": "dt", "type": "DATETIME"},
  {"name": "j", "type": "JSON"},
  {"name": "req", "type": "STRING", "mode": "REQUIRED"},
  {"name": "tags", "type": "STRING", "mode": "REPEATED"},
  {"name": "r", "type": "RECORD", "fields": [
    {"name": "x", "type": "INT64", "mode": "REQUIRED"},
    {"name": "ys", "type": "NUMERIC", "mode": "REPEATED"},
    {"name": "inner", "type": "RECORD", "mode": "REPEATED", "fields": [
      {"name": "t", "type": "TIME"}, {"name": "bn", "type": "BIGNUMERIC"}
    ]}
  ]}
]"#;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the options; the rest is the payload, optionally followed by one
    // attribute after a NUL.
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (payload, attribute) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let schema = TableSchema::from_json(SCHEMA).unwrap();
    let opts = RowOptions {
        mode: SchemaMode::UseTableSchema,
        write_metadata: flags & 1 != 0,
        drop_unknown_fields: flags & 2 != 0,
        subscription_name: "projects/p/subscriptions/s".into(),
    };
    let mut rows = RowBuilder::new(&schema, opts).unwrap();
    let mut msg = Message {
        data: payload.to_vec().into(),
        message_id: "1".into(),
        publish_time_micros: 1_695_615_000_000_000,
        ..Message::default()
    };
    if let Some(a) = attribute {
        msg.attributes
            .insert("k".into(), String::from_utf8_lossy(a).into_owned());
    }
    // The same message twice: a failure must leave nothing behind for the second.
    let mut accepted = 0;
    for _ in 0..2 {
        match rows.append(&msg) {
            Ok(()) => accepted += 1,
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
    assert!(accepted == 0 || accepted == 2, "the same message accepted once");
    let batch = rows.finish();
    assert_eq!(batch.num_rows(), accepted);
    let delta = delta_arrow_schema(&batch.schema()).unwrap();
    to_delta_batch(&batch, &delta).unwrap();
});
