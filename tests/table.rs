//! The table writer's Delta Lake output read back by readers nobody here wrote: the `deltalake`
//! Python package (its own log replay, returning a pyarrow table) and DuckDB (reading the Parquet
//! files the log lists).

mod util;

use std::path::Path;

use bytes::Bytes;
use object_store::ObjectStoreExt;
use serde_json::{json, Value};
use subsink::message::Message;
use subsink::sink::delta::{to_delta_batch, DataFile, DeltaTable};
use subsink::table::{write_parquet, RowBuilder, RowOptions, SchemaMode, TableSchema};
use subsink::upload::Destination;
use util::*;

const SUB: &str = "projects/proj/subscriptions/sub";

/// Every column type the mapping core supports, nested RECORDs and REPEATED included, and the
/// metadata columns.
const SCHEMA: &str = r#"[
  {"name": "id", "type": "INT64", "mode": "REQUIRED"},
  {"name": "s", "type": "STRING"},
  {"name": "b", "type": "BYTES"},
  {"name": "f", "type": "FLOAT64"},
  {"name": "n", "type": "NUMERIC"},
  {"name": "bn", "type": "BIGNUMERIC"},
  {"name": "ok", "type": "BOOL"},
  {"name": "ts", "type": "TIMESTAMP"},
  {"name": "d", "type": "DATE"},
  {"name": "t", "type": "TIME"},
  {"name": "dt", "type": "DATETIME"},
  {"name": "j", "type": "JSON"},
  {"name": "tags", "type": "STRING", "mode": "REPEATED"},
  {"name": "rec", "type": "RECORD", "fields": [
    {"name": "x", "type": "INT64"},
    {"name": "at", "type": "TIME"},
    {"name": "items", "type": "RECORD", "mode": "REPEATED", "fields": [
      {"name": "sku", "type": "STRING", "mode": "REQUIRED"},
      {"name": "qty", "type": "INT64"}
    ]}
  ]},
  {"name": "subscription_name", "type": "STRING"},
  {"name": "message_id", "type": "STRING"},
  {"name": "publish_time", "type": "TIMESTAMP"},
  {"name": "attributes", "type": "JSON"}
]"#;

fn builder() -> RowBuilder {
    let schema = TableSchema::from_json(SCHEMA).unwrap();
    RowBuilder::new(
        &schema,
        RowOptions {
            mode: SchemaMode::UseTableSchema,
            write_metadata: true,
            drop_unknown_fields: false,
            subscription_name: SUB.into(),
        },
    )
    .unwrap()
}

fn msg(id: &str, publish_time_micros: i64, data: Value) -> Message {
    Message {
        data: Bytes::from(data.to_string()),
        attributes: [("k".to_string(), format!("v{id}"))].into(),
        message_id: id.to_string(),
        publish_time_micros,
        ordering_key: String::new(),
    }
}

/// The payload of [`full_row`]: a value for every column type.
fn full_row_data() -> Value {
    json!({
        "id": 1,
        "s": "héllo",
        "b": "AAEC/w==",
        "f": 1.5,
        "n": "123.124",
        "bn": "-99999999999999999999999999999999999999.99999999999999999999999999999999999999",
        "ok": true,
        "ts": "2023-09-25T06:10:00.000001+02:00",
        "d": "2023-09-25",
        "t": "04:10:00.5",
        "dt": "2023-09-25 04:10:00",
        "j": r#"{"a":1,"b":[true,null]}"#,
        "tags": ["x", "y"],
        "rec": {"x": 7, "at": "23:59:59.999999", "items": [{"sku": "A", "qty": 2}, {"sku": "B"}]}
    })
}

fn full_row() -> Message {
    msg("1", 1_695_615_000_000_000, full_row_data())
}

/// [`full_row`] as the readers return it: the payload as stored, and the metadata columns.
fn full_row_expected() -> Value {
    let mut row = full_row_data();
    let stored = json!({
        "b": {"$b64": "AAEC/w=="},
        "n": "123.124000000",
        "ts": "2023-09-25T04:10:00.000001+00:00",
        "t": "04:10:00.500",
        "dt": "2023-09-25T04:10:00",
        "rec": {"x": 7, "at": "23:59:59.999999", "items": [{"sku": "A", "qty": 2}, {"sku": "B", "qty": null}]},
        "subscription_name": SUB,
        "message_id": "1",
        "publish_time": "2023-09-25T04:10:00+00:00",
        "attributes": r#"{"k":"v1"}"#
    });
    for (k, v) in stored.as_object().unwrap() {
        row[k] = v.clone();
    }
    row
}

/// Only the REQUIRED column: everything else null, REPEATED columns empty.
fn sparse_row(id: i64) -> Message {
    msg(&id.to_string(), 1_000_001, json!({ "id": id }))
}

fn sparse_row_expected(id: i64) -> Value {
    json!({
        "id": id,
        "s": null, "b": null, "f": null, "n": null, "bn": null, "ok": null, "ts": null, "d": null,
        "t": null, "dt": null, "j": null, "tags": [], "rec": null,
        "subscription_name": SUB,
        "message_id": id.to_string(),
        "publish_time": "1970-01-01T00:00:01.000001+00:00",
        "attributes": format!(r#"{{"k":"v{id}"}}"#)
    })
}

/// Build one Parquet data file from messages, in the table's Delta form.
fn data_file(table: &DeltaTable, msgs: &[Message]) -> DataFile {
    let mut rb = builder();
    for m in msgs {
        rb.append(m).unwrap();
    }
    let batch = to_delta_batch(&rb.finish(), table.schema()).unwrap();
    DataFile::new(write_parquet(table.schema(), &[batch], None).unwrap())
}

fn file_dest(dir: &Path) -> Destination {
    Destination::from_url(&format!("file://{}", dir.display())).unwrap()
}

const READER: &str = r#"
import base64, datetime, decimal, json, os, sys
import deltalake, duckdb

def plain(v):
    if isinstance(v, (bytes, bytearray)):
        return {"$b64": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc)
        return v.isoformat()
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v

dt = deltalake.DeltaTable(sys.argv[1])
p = dt.protocol()
rows = sorted(dt.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
files = dt.file_uris()
duck = None
if not sys.argv[1].startswith("s3://"):  # DuckDB's S3 support is an extension it downloads
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    # A query past ~2 s would print DuckDB's progress bar into the JSON on stdout.
    con.execute("SET enable_progress_bar = false")
    cur = con.execute("SELECT * FROM read_parquet(?) ORDER BY id", [files])
    names = [d[0] for d in cur.description]
    duck = [dict(zip(names, r)) for r in cur.fetchall()]
print(json.dumps({
    "version": dt.version(),
    "files": len(files),
    "schema": json.loads(dt.schema().to_json()),
    "protocol": {"reader": p.min_reader_version, "writer": p.min_writer_version,
                 "reader_features": p.reader_features, "writer_features": p.writer_features},
    "deltalake": plain(rows),
    "duckdb": plain(duck),
}))
# deltalake's object-store threads can abort the interpreter's teardown on an S3 table
# ("terminate called without an active exception", seen in a clean CI run): the answer is
# printed, so leave without the teardown.
sys.stdout.flush()
os._exit(0)
"#;

fn read_table(dir: &Path) -> Value {
    read_table_at(&dir.display().to_string(), &[])
}

/// Read the table at a path or URL; `env` configures the reader's object store.
fn read_table_at(location: &str, env: &[(&str, String)]) -> Value {
    python_json(READER, location, env)
}

fn delta_types(schema: &Value) -> Value {
    schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_string(), f["type"].clone()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_table_read_back_by_deltalake_and_duckdb() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = file_dest(tmp.path());
    let schema = builder().schema();
    let mut table = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
    assert_eq!(table.version(), 0);

    let f1 = data_file(&table, &[full_row(), sparse_row(2)]);
    assert_eq!(f1.file.num_records, 2);
    assert_eq!(table.commit(vec![f1]).await.unwrap(), 1);

    // A file uploaded but never committed (a failed batch): readers must not see it.
    let orphan = data_file(&table, &[sparse_row(99)]);
    dest.store
        .put(
            &object_store::path::Path::parse(&orphan.path).unwrap(),
            orphan.file.payload.clone(),
        )
        .await
        .unwrap();

    // A second writer handle (a restarted process) opens the existing table and appends.
    let mut again = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
    assert_eq!(again.version(), 1);
    let f2 = data_file(&again, &[sparse_row(3)]);
    let f3 = data_file(&again, &[sparse_row(4)]);
    assert_eq!(again.commit(vec![f2, f3]).await.unwrap(), 2);

    // The log entry of version 1: one `add` naming the file with its size and row count.
    let log1 =
        std::fs::read_to_string(tmp.path().join("_delta_log/00000000000000000001.json")).unwrap();
    let adds: Vec<Value> = log1
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|a| a.get("add").cloned())
        .collect();
    assert_eq!(adds.len(), 1, "{log1}");
    let add = &adds[0];
    let on_disk = std::fs::metadata(tmp.path().join(add["path"].as_str().unwrap())).unwrap();
    assert_eq!(add["size"], on_disk.len(), "{log1}");
    assert_eq!(add["dataChange"], true, "{log1}");
    let stats: Value = serde_json::from_str(add["stats"].as_str().unwrap()).unwrap();
    assert_eq!(stats["numRecords"], 2, "{log1}");

    let got = read_table(tmp.path());
    assert_eq!(got["version"], 2);
    assert_eq!(
        got["files"], 3,
        "the uncommitted file is not part of the table"
    );
    let expected = json!([
        full_row_expected(),
        sparse_row_expected(2),
        sparse_row_expected(3),
        sparse_row_expected(4)
    ]);
    assert_eq!(got["deltalake"], expected, "deltalake/pyarrow read");
    assert_eq!(got["duckdb"], expected, "duckdb read of the log's files");

    let types = delta_types(&got["schema"]);
    for (col, ty) in [
        ("id", "long"),
        ("s", "string"),
        ("b", "binary"),
        ("f", "double"),
        ("n", "decimal(38,9)"),
        ("bn", "string"),
        ("ok", "boolean"),
        ("ts", "timestamp"),
        ("d", "date"),
        ("t", "string"),
        ("dt", "timestamp_ntz"),
        ("j", "string"),
        ("publish_time", "timestamp"),
    ] {
        assert_eq!(types[col], ty, "Delta type of {col}");
    }
    assert_eq!(types["tags"]["type"], "array");
    assert_eq!(types["tags"]["elementType"], "string");
    assert_eq!(types["rec"]["type"], "struct");
    let p = &got["protocol"];
    assert_eq!(p["reader"], 3, "{p}");
    assert_eq!(p["writer"], 7, "{p}");
    assert!(p["reader_features"]
        .as_array()
        .unwrap()
        .contains(&json!("timestampNtz")));
    assert!(p["writer_features"]
        .as_array()
        .unwrap()
        .contains(&json!("timestampNtz")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commits_both_land() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = file_dest(tmp.path());
    let schema = builder().schema();
    // A checkpoint after version 1 (deltalake: (v + 1) % interval == 0), so the reader replays a
    // checkpoint written here plus the JSON commit after it.
    DeltaTable::open_or_create_with_properties(
        &dest,
        &schema,
        &[("delta.checkpointInterval", "2")],
    )
    .await
    .unwrap();

    // Two writers, each with its own handle opened at version 0, commit at the same moment.
    let mut a = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
    let mut b = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
    let fa = data_file(&a, &[sparse_row(10), sparse_row(11)]);
    let fb = data_file(&b, &[sparse_row(20)]);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let (ba, bb) = (barrier.clone(), barrier);
    let ta = tokio::spawn(async move {
        ba.wait().await;
        a.commit(vec![fa]).await.unwrap()
    });
    let tb = tokio::spawn(async move {
        bb.wait().await;
        b.commit(vec![fb]).await.unwrap()
    });
    let mut versions = vec![ta.await.unwrap(), tb.await.unwrap()];
    versions.sort();
    assert_eq!(versions, vec![1, 2]);

    assert!(tmp
        .path()
        .join("_delta_log/00000000000000000001.checkpoint.parquet")
        .exists());
    let got = read_table(tmp.path());
    assert_eq!(got["version"], 2);
    let ids: Vec<i64> = got["deltalake"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![10, 11, 20]);
    assert_eq!(got["duckdb"], got["deltalake"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_make_one_table() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = file_dest(tmp.path());
    let schema = builder().schema();
    let (d1, d2) = (dest.clone(), dest.clone());
    let (s1, s2) = (schema.clone(), schema.clone());
    let t1 = tokio::spawn(async move { DeltaTable::open_or_create(&d1, &s1).await.unwrap() });
    let t2 = tokio::spawn(async move { DeltaTable::open_or_create(&d2, &s2).await.unwrap() });
    let (mut a, b) = (t1.await.unwrap(), t2.await.unwrap());
    assert_eq!((a.version(), b.version()), (0, 0));
    let f = data_file(&a, &[sparse_row(1)]);
    assert_eq!(a.commit(vec![f]).await.unwrap(), 1);
    let got = read_table(tmp.path());
    assert_eq!(got["version"], 1);
    assert_eq!(got["deltalake"], json!([sparse_row_expected(1)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_table_with_another_schema_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = file_dest(tmp.path());
    DeltaTable::open_or_create(&dest, &builder().schema())
        .await
        .unwrap();
    let other = RowBuilder::new(
        &TableSchema::from_json(r#"[{"name": "id", "type": "STRING"}]"#).unwrap(),
        RowOptions {
            mode: SchemaMode::UseTableSchema,
            ..RowOptions::default()
        },
    )
    .unwrap()
    .schema();
    let err = DeltaTable::open_or_create(&dest, &other).await.unwrap_err();
    assert!(
        err.to_string().contains("schema differs"),
        "unexpected error: {err}"
    );
}

/// The same on an S3-compatible server (moto), below a prefix: deltalake commits through the
/// Destination's prefixed store with conditional puts, and two writers still both land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_table_on_s3_below_a_prefix() {
    let s3 = S3Server::start();
    s3.create_bucket("lake");
    // Destination::from_url takes S3 settings from the standard environment variables; no other
    // test of this binary reads them.
    for (k, v) in s3.env() {
        std::env::set_var(k, v);
    }
    let url = "s3://lake/warehouse/events";
    let dest = Destination::from_url(url).unwrap();
    let schema = builder().schema();
    let mut a = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
    let mut b = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
    let fa = data_file(&a, &[full_row(), sparse_row(2)]);
    let fb = data_file(&b, &[sparse_row(3)]);
    let (ra, rb) = tokio::join!(a.commit(vec![fa]), b.commit(vec![fb]));
    let mut versions = vec![ra.unwrap(), rb.unwrap()];
    versions.sort();
    assert_eq!(versions, vec![1, 2]);

    let keys: Vec<String> = s3.list("lake").into_iter().map(|(k, _)| k).collect();
    assert!(
        keys.iter().all(|k| k.starts_with("warehouse/events/")),
        "{keys:?}"
    );
    assert!(keys.contains(&"warehouse/events/_delta_log/00000000000000000002.json".to_string()));

    let got = read_table_at(url, &s3.env());
    assert_eq!(got["version"], 2);
    assert_eq!(
        got["deltalake"],
        json!([
            full_row_expected(),
            sparse_row_expected(2),
            sparse_row_expected(3)
        ])
    );
}

/// The table writer streams each batch's rows to its encoder in chunks (by rows, and by bytes
/// for large messages) and commits one file per batch: every row comes back once, in order, with
/// its values, whatever chunk it was in; a message that is not a row fails alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_writer_streams_chunks_into_one_file_per_batch() {
    use std::time::Duration;
    use subsink::batch::Limits;
    use subsink::message::{Receipt, Received};
    use subsink::sink::chunk::CHUNK_ROWS;
    use subsink::sink::delta::{DeltaSink, CHUNK_BYTES};
    use subsink::sink::{Files, OpenFiles};

    let dir = tempfile::tempdir().unwrap();
    let rows = builder();
    let table = DeltaTable::open_or_create(&file_dest(dir.path()), &rows.schema())
        .await
        .unwrap();
    // Two batches of 20,000 messages (several row chunks each) and a last one of 5,000 holding
    // messages large enough that chunks close on bytes.
    let limits = Limits {
        max_duration: Duration::from_secs(3600),
        max_bytes: None,
        max_messages: Some(20_000),
    };
    const { assert!(20_000 > 2 * CHUNK_ROWS) };
    let mut writer = Files::new(DeltaSink::new(
        rows,
        limits,
        table,
        subsink::table::default_writer_properties(),
    ));
    let big = "é".repeat(150_000); // 300 kB: a chunk closes on bytes after 14 of them
    const { assert!(CHUNK_BYTES / 300_000 < 20) };
    let (mut done, mut expected) = (Vec::new(), Vec::new());
    for id in 1..=45_000i64 {
        let m = if id == 777 {
            msg("777", 1_000_001, json!({"id": 777, "nope": 1})) // unknown field
        } else if id > 40_000 && id % 100 == 0 {
            let mut m = sparse_row(id);
            m.data = Bytes::from(json!({"id": id, "s": big}).to_string());
            m
        } else {
            sparse_row(id)
        };
        let r = Received {
            msg: m,
            receipt: Receipt::default(),
        };
        match writer.push(&r, None, None, &mut done) {
            Ok(_) => {
                let mut e = sparse_row_expected(id);
                if id > 40_000 && id % 100 == 0 {
                    e["s"] = json!(big);
                }
                expected.push(e);
            }
            Err(e) => {
                assert_eq!(id, 777);
                assert!(e.to_string().contains("nope"), "{e}");
            }
        }
    }
    writer.finalize_all(subsink::batch::FlushReason::EndOfInput, &mut done);
    assert_eq!(done.len(), 3);
    assert_eq!(
        done.iter().map(|f| f.contents.messages).collect::<Vec<_>>(),
        [20_000, 20_000, 4_999]
    );
    for f in done {
        assert!(f.file.make_durable().await.unwrap().bytes > 0);
    }
    let back = read_table(dir.path());
    assert_eq!(back["version"], 3);
    assert_eq!(back["files"], 3);
    for reader in ["deltalake", "duckdb"] {
        let got = back[reader].as_array().unwrap();
        assert_eq!(got.len(), expected.len(), "{reader}");
        for (g, e) in got.iter().zip(&expected) {
            assert_eq!(g, e, "{reader}");
        }
    }
}
