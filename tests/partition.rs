//! Partitioned Delta tables end to end (docs/destinations.md, "Partitioned tables"): the real
//! binary fills tables partitioned by another writer (the `deltalake` Python package, and a log
//! written as Spark writes `CREATE TABLE … PARTITIONED BY`) and creates partitioned tables (from a
//! table resource's `timePartitioning`, from `--table-partition-by`), appending and with change
//! data capture, on a folder, SeaweedFS (S3) and Azurite; readers nobody here wrote (deltalake,
//! pyarrow datasets with partition filters, DuckDB over pyarrow) read the right rows per partition.

mod util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use subsink::message::Message;
use util::servers::{Azurite, AZURITE_ACCOUNT, AZURITE_KEY};
use util::*;

const SUB: &str = "projects/proj/subscriptions/orders-to-table";

const SCHEMA: &str = r#"[
  {"name": "id", "type": "INTEGER", "mode": "REQUIRED"},
  {"name": "region", "type": "STRING"},
  {"name": "day", "type": "DATE"},
  {"name": "at", "type": "TIMESTAMP"},
  {"name": "qty", "type": "INTEGER"}
]"#;

/// The Arrow schema of [`SCHEMA`] as subsink writes it, for tables made by others.
const PA_SCHEMA: &str = r#"
import pyarrow as pa
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("region", pa.string()),
    pa.field("day", pa.date32()),
    pa.field("at", pa.timestamp("us", tz="UTC")),
    pa.field("qty", pa.int64()),
])
"#;

const REGIONS: [Option<&str>; 4] = [Some("eu"), Some("us"), Some("a b/c=d%"), None];

/// Order `i`: its payload (the row, as the readers return it).
fn order(i: u64) -> Value {
    let day = 1 + i % 3;
    json!({
        "id": i,
        "region": REGIONS[(i % 4) as usize],
        "day": format!("2026-12-{day:02}"),
        "at": format!("2026-12-{day:02}T{:02}:{:02}:00.000000", (i / 3) % 24, i % 60),
        "qty": i * 10,
    })
}

fn message(i: u64, payload: &Value) -> Message {
    Message {
        data: payload.to_string().into_bytes().into(),
        attributes: Default::default(),
        message_id: format!("m{i}"),
        // 2026-12-05T00:00:00Z plus i minutes: ingestion hours 00 … .
        publish_time_micros: 1_796_428_800_000_000 + i as i64 * 60_000_000,
        ordering_key: String::new(),
    }
}

fn input(dir: &Path, name: &str, payloads: &[Value]) -> PathBuf {
    let msgs: Vec<Message> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| message(i as u64, p))
        .collect();
    let p = dir.join(name);
    write_lines(&p, &msgs);
    p
}

fn subscription(dir: &Path, max_messages: u64) -> PathBuf {
    let cfg = json!({
        "name": SUB,
        "topic": "projects/proj/topics/orders",
        "bigqueryConfig": {"table": "proj.shop.orders", "useTableSchema": true},
        "subsink": {"table": {"maxMessages": max_messages.to_string()}},
    });
    let p = dir.join("sub.json");
    std::fs::write(&p, cfg.to_string()).unwrap();
    p
}

fn schema_file(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("schema.json");
    std::fs::write(&p, text).unwrap();
    p
}

fn run(sub: &Path, src: &Path, url: &str, schema: &Path, extra: &[&str]) -> Command {
    let mut c = subsink();
    c.args(["run", "--subscription"])
        .arg(sub)
        .arg("--source")
        .arg(src)
        .args(["--table-url", url, "--table-schema"])
        .arg(schema)
        .args(extra);
    c
}

/// Reads a partitioned table: its rows (deltalake, sorted by id), its `add` actions (path,
/// partition values), per partition value of `argv[2]`'s column the rows a pyarrow dataset
/// filter returns and the fragments it keeps (pruning), DuckDB's count per value over the same
/// dataset, the columns of every data file, and every `add`'s partition values and statistics
/// as the log holds them.
const READER: &str = r#"
import json, os, sys, datetime, glob, urllib.parse
import deltalake, duckdb, pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
location, column = sys.argv[1], sys.argv[2]
opts = json.loads(os.environ.get("READER_OPTIONS", "{}"))
dt = deltalake.DeltaTable(location, storage_options=opts)
def plain(v):
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None: v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return v.strftime("%Y-%m-%dT%H:%M:%S.%f")
    if isinstance(v, datetime.date): return v.isoformat()
    return v
table = dt.to_pyarrow_table()
rows = [{k: plain(v) for k, v in r.items()} for r in table.to_pylist()]
rows.sort(key=lambda r: r["id"])
# The log's paths are URIs: decoded once, an object's key below the table.
adds = [{"path": urllib.parse.unquote(a["path"]), "partition": {k: plain(v) for k, v in a["partition"].items()}}
        for a in pa.table(dt.get_add_actions(flatten=False)).to_pylist()]
dataset = dt.to_pyarrow_dataset()
col_type = dataset.schema.field(column).type
values = {}
for v in table.column(column).to_pylist():
    values["None" if v is None else str(plain(v))] = v
per = {}
for key, v in sorted(values.items()):
    f = pc.field(column).is_null() if v is None else pc.field(column) == pa.scalar(v, type=col_type)
    got = dataset.to_table(filter=f)
    per[key] = {"ids": sorted(got.column("id").to_pylist()),
                "fragments": len(list(dataset.get_fragments(filter=f)))}
con = duckdb.connect()
con.execute("SET TimeZone='UTC'")
con.execute("SET enable_progress_bar = false")
con.register("t", dataset)
duck = {("None" if k is None else str(plain(k))): n
        for k, n in con.execute(f'SELECT "{column}", count(*) FROM t GROUP BY 1').fetchall()}
file_columns, log_values, log_stats = [], [], []
if not location.startswith(("s3://", "az://")):
    for a in adds:
        file_columns.append(sorted(pq.read_schema(os.path.join(location, a["path"])).names))
    for f in sorted(glob.glob(os.path.join(location, "_delta_log", "*.json"))):
        for line in open(f):
            j = json.loads(line)
            if "add" in j:
                log_values.append(j["add"]["partitionValues"])
                log_stats.append(json.loads(j["add"].get("stats") or "{}"))
print(json.dumps({"version": dt.version(), "partition_columns": dt.metadata().partition_columns,
                  "rows": rows, "adds": adds, "per": per, "duckdb": duck,
                  "file_columns": file_columns, "log_values": log_values, "log_stats": log_stats}))
sys.stdout.flush()
os._exit(0)
"#;

fn read(location: &str, column: &str, env: &[(&str, String)]) -> Value {
    serde_json::from_str(&venv_python(["-c", READER, location, column], env)).unwrap()
}

/// `rows`' ids per value of `column` (as the reader prints values: `None` for NULL).
fn ids_by(rows: &[Value], column: &str) -> BTreeMap<String, Vec<i64>> {
    let mut m: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in rows {
        let k = match &r[column] {
            Value::Null => "None".to_string(),
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        m.entry(k).or_default().push(r["id"].as_i64().unwrap());
    }
    for v in m.values_mut() {
        v.sort_unstable();
    }
    m
}

/// Every check of a table partitioned by `column` that holds `want`: rows, one Hive folder per
/// partition named by its values, partition values in every `add`, no partition column in the
/// files, a filter per partition returning its rows from its files only, DuckDB agreeing, and
/// per-column statistics on every `add` ever committed (appends and MERGE rewrites; issue 44,
/// point 6) that leave the partition columns out.
fn check_partitioned(t: &Value, column: &str, want: &[Value], partition_columns: &[&str]) {
    assert_eq!(t["partition_columns"], json!(partition_columns));
    for stats in t["log_stats"].as_array().unwrap() {
        assert!(stats["numRecords"].as_u64() > Some(0), "{stats}");
        assert!(stats["minValues"]["id"].is_number(), "no id range: {stats}");
        assert!(stats["maxValues"]["id"].is_number(), "no id range: {stats}");
        assert_eq!(stats["nullCount"]["id"], 0, "{stats}");
        for c in partition_columns {
            for key in ["minValues", "maxValues", "nullCount"] {
                assert!(stats[key].get(c).is_none(), "{key} of {c}: {stats}");
            }
        }
    }
    let rows = t["rows"].as_array().unwrap();
    assert_eq!(rows.len(), want.len());
    for (g, w) in rows.iter().zip(want) {
        for (k, v) in w.as_object().unwrap() {
            assert_eq!(&g[k], v, "column {k} of row {}", w["id"]);
        }
    }
    for a in t["adds"].as_array().unwrap() {
        let path = a["path"].as_str().unwrap();
        let folders: Vec<&str> = path.split('/').collect();
        assert_eq!(folders.len(), partition_columns.len() + 1, "{path}");
        for (folder, col) in folders.iter().zip(partition_columns) {
            assert!(folder.starts_with(&format!("{col}=")), "{path}");
            let value = &a["partition"][col];
            let expect = match value {
                Value::Null => "__HIVE_DEFAULT_PARTITION__".to_string(),
                // A timestamp's Delta form has a space where the reader's text has `T`.
                Value::String(s) if s.len() == 26 && s.as_bytes()[10] == b'T' => {
                    s.replacen('T', "%20", 1).replace(':', "%3A")
                }
                Value::String(s) => s
                    .replace('%', "%25")
                    .replace(' ', "%20")
                    .replace('/', "%2F")
                    .replace('=', "%3D")
                    .replace(':', "%3A"),
                v => v.to_string(),
            };
            assert_eq!(folder[col.len() + 1..], expect, "{path}");
        }
    }
    for cols in t["file_columns"].as_array().unwrap() {
        for c in partition_columns {
            assert!(
                !cols.as_array().unwrap().contains(&json!(c)),
                "a data file holds the partition column {c}: {cols}"
            );
        }
    }
    let by = ids_by(want, column);
    let per = t["per"].as_object().unwrap();
    assert_eq!(
        per.keys().collect::<Vec<_>>(),
        by.keys().collect::<Vec<_>>(),
        "partitions"
    );
    let files_of = |value: &str| {
        t["adds"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| {
                let v = &a["partition"][column];
                match v {
                    Value::Null => value == "None",
                    Value::String(s) => s == value,
                    Value::Number(n) => n.to_string() == *value,
                    _ => false,
                }
            })
            .count()
    };
    for (value, ids) in &by {
        assert_eq!(per[value]["ids"], json!(ids), "filter {column} = {value}");
        assert_eq!(
            per[value]["fragments"],
            files_of(value),
            "the filter {column} = {value} reads its partition's files only"
        );
        assert_eq!(t["duckdb"][value], ids.len(), "DuckDB count of {value}");
    }
}

#[test]
fn tables_partitioned_by_others_get_partition_values_and_hive_folders() {
    let dir = tempfile::tempdir().unwrap();
    let sub = subscription(dir.path(), 500);
    let schema = schema_file(dir.path(), SCHEMA);
    let payloads: Vec<Value> = (0..2_000).map(order).collect();
    let src = input(dir.path(), "in.ndjson", &payloads);
    // 1. A table the `deltalake` package created, partitioned by region, with rows of its own.
    let by_python = dir.path().join("by_python");
    let made = format!(
        "{PA_SCHEMA}
import sys, deltalake, datetime
rows = [{{'id': -1, 'region': 'eu', 'day': datetime.date(2026, 12, 1),
         'at': datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc), 'qty': 0}}]
deltalake.write_deltalake(sys.argv[1], pa.Table.from_pylist(rows, schema=SCHEMA), partition_by=['region'])
print('{{}}')"
    );
    python_json(&made, &by_python.display().to_string(), &[]);
    let out = run_ok(&mut run(
        &sub,
        &src,
        &format!("file://{}", by_python.display()),
        &schema,
        &[],
    ));
    assert_eq!(summary(&out)["messages_written"], 2_000);
    let t = read(&by_python.display().to_string(), "region", &[]);
    assert_eq!(
        t["version"], 4,
        "the package's version 0, then 4 commits of 500"
    );
    let mut want = vec![json!({"id": -1, "region": "eu", "qty": 0})];
    want.extend(payloads.iter().cloned());
    check_partitioned(&t, "region", &want, &["region"]);
    // Every commit adds one file per region (4), named `<folder>/<the batch's file>`.
    assert_eq!(t["adds"].as_array().unwrap().len(), 1 + 4 * 4);
    // The summary names those files, each in the log and on disk (issue 44, point 8).
    let named = summary_objects(&summary(&out));
    let added: Vec<&str> = t["adds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(named.len(), 4 * 4, "{named:?}");
    for name in &named {
        assert!(
            added.contains(&name.as_str()),
            "{name} is not an add of the log"
        );
        assert!(by_python.join(name).is_file(), "{name} is not on disk");
    }

    // 2. A table whose log was written as Spark writes a partitioned CREATE TABLE: protocol,
    // metadata with two partition columns, no data.
    let by_spark = dir.path().join("by_spark");
    std::fs::create_dir_all(by_spark.join("_delta_log")).unwrap();
    let fields = json!([
        {"name": "id", "type": "long", "nullable": false, "metadata": {}},
        {"name": "region", "type": "string", "nullable": true, "metadata": {}},
        {"name": "day", "type": "date", "nullable": true, "metadata": {}},
        {"name": "at", "type": "timestamp", "nullable": true, "metadata": {}},
        {"name": "qty", "type": "long", "nullable": true, "metadata": {}},
    ]);
    let log = [
        json!({"commitInfo": {"timestamp": 1_796_428_800_000u64, "operation": "CREATE TABLE",
            "operationParameters": {"partitionBy": "[\"day\",\"region\"]"}, "isBlindAppend": true}}),
        json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}),
        json!({"metaData": {"id": "8a4b0a43-1b4c-4a4e-9d51-2f0f5b8e3c11",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json!({"type": "struct", "fields": fields}).to_string(),
            "partitionColumns": ["day", "region"], "configuration": {},
            "createdTime": 1_796_428_800_000u64}}),
    ];
    std::fs::write(
        by_spark.join("_delta_log/00000000000000000000.json"),
        log.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    run_ok(&mut run(
        &sub,
        &src,
        &format!("file://{}", by_spark.display()),
        &schema,
        &[],
    ));
    let t = read(&by_spark.display().to_string(), "day", &[]);
    check_partitioned(&t, "day", &payloads, &["day", "region"]);
    // 3 days × 4 regions per commit.
    assert_eq!(t["adds"].as_array().unwrap().len(), 4 * 12);
    let t = read(&by_spark.display().to_string(), "region", &[]);
    check_partitioned(&t, "region", &payloads, &["day", "region"]);

    // 3. A configured partitioning an existing table does not have is refused, naming both (exit
    // 2, as an existing table with other columns is).
    let out = run(
        &sub,
        &src,
        &format!("file://{}", by_python.display()),
        &schema,
        &["--table-partition-by", "day"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("partitioned by [region]") && err.contains("makes [day]"),
        "{err}"
    );
}

#[test]
fn created_tables_are_partitioned_by_time_partitioning_and_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let sub = subscription(dir.path(), 400);
    let payloads: Vec<Value> = (0..1_200).map(order).collect();
    let src = input(dir.path(), "in.ndjson", &payloads);
    // The table resource's timePartitioning: DAY of `at` → a `_PARTITIONDATE` column.
    let resource = json!({
        "schema": {"fields": serde_json::from_str::<Value>(SCHEMA).unwrap()},
        "timePartitioning": {"type": "DAY", "field": "at", "expirationMs": "7776000000"},
    });
    let schema = schema_file(dir.path(), &resource.to_string());
    let daily = dir.path().join("daily");
    run_ok(&mut run(
        &sub,
        &src,
        &format!("file://{}", daily.display()),
        &schema,
        &[],
    ));
    let t = read(&daily.display().to_string(), "_PARTITIONDATE", &[]);
    let with = |col: &str, f: &dyn Fn(&Value) -> Value| -> Vec<Value> {
        payloads
            .iter()
            .map(|p| {
                let mut p = p.clone();
                p[col] = f(&p);
                p
            })
            .collect()
    };
    let want = with("_PARTITIONDATE", &|p| json!(p["day"]));
    check_partitioned(&t, "_PARTITIONDATE", &want, &["_PARTITIONDATE"]);

    // --table-partition-by over the resource: the ingestion (publish) hour, a `_PARTITIONTIME`
    // TIMESTAMP; message i is published at 00:00 + i minutes on 2026-12-05.
    let hourly = dir.path().join("hourly");
    run_ok(&mut run(
        &sub,
        &src,
        &format!("file://{}", hourly.display()),
        &schema,
        &["--table-partition-by", "HOUR(_PARTITIONTIME)"],
    ));
    let t = read(&hourly.display().to_string(), "_PARTITIONTIME", &[]);
    let want = with("_PARTITIONTIME", &|p| {
        let i = p["id"].as_u64().unwrap();
        json!(format!("2026-12-05T{:02}:00:00.000000", i / 60))
    });
    check_partitioned(&t, "_PARTITIONTIME", &want, &["_PARTITIONTIME"]);
    assert_eq!(t["per"].as_object().unwrap().len(), 20, "20 hours");
    // Delta's serialization of a timestamp partition value, as deltalake writes it.
    let mut hours: Vec<String> = t["log_values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["_PARTITIONTIME"].as_str().unwrap().to_string())
        .collect();
    hours.sort();
    hours.dedup();
    let expect: Vec<String> = (0..20)
        .map(|h| format!("2026-12-05 {h:02}:00:00.000000"))
        .collect();
    assert_eq!(hours, expect);

    // MONTH of a DATE column together with a column: both folders, in the flag's order.
    let monthly = dir.path().join("monthly");
    run_ok(&mut run(
        &sub,
        &src,
        &format!("file://{}", monthly.display()),
        &schema,
        &["--table-partition-by", "MONTH(day),region"],
    ));
    let t = read(&monthly.display().to_string(), "region", &[]);
    let want = with("_PARTITIONDATE", &|_| json!("2026-12-01"));
    check_partitioned(&t, "region", &want, &["_PARTITIONDATE", "region"]);

    // A second run into the daily table without the partitioning is told how to give it.
    let plain = schema_file(dir.path(), SCHEMA);
    let out = run(
        &sub,
        &src,
        &format!("file://{}", daily.display()),
        &plain,
        &[],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--table-partition-by"), "{err}");

    // Startup refusals, exit 2, naming the flag and the rule.
    for (flag, says) in [
        ("DAY(region)", "TIMESTAMP or DATE"),
        ("HOUR(day)", "DATE column: DAY, MONTH or YEAR"),
        ("nope", "`nope` is not a column"),
        ("WEEK(at)", "unknown time unit"),
        (
            "DAY(at),HOUR(_PARTITIONTIME)",
            "at most one time partitioning",
        ),
    ] {
        let out = run(
            &sub,
            &src,
            &format!("file://{}", dir.path().join("x").display()),
            &plain,
            &["--table-partition-by", flag],
        )
        .output()
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(
            err.contains("--table-partition-by") && err.contains(says),
            "{flag}: {err}"
        );
    }
    let range = schema_file(
        dir.path(),
        &json!({
            "schema": {"fields": serde_json::from_str::<Value>(SCHEMA).unwrap()},
            "rangePartitioning": {"field": "qty", "range": {"start": "0", "end": "100", "interval": "10"}},
        })
        .to_string(),
    );
    let out = run(
        &sub,
        &src,
        &format!("file://{}", dir.path().join("x").display()),
        &range,
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rangePartitioning"));
}

#[test]
fn change_data_capture_moves_rows_between_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let sub = subscription(dir.path(), 300);
    let schema = schema_file(dir.path(), SCHEMA);
    // 300 keys, five rounds of changes arriving in the order 0, 1, 3, 2, 4 with numbers rising
    // per round: rows move between partitions (a new region and day each round); every seventh
    // key is deleted in round 3; round 4 touches the even keys only. So an odd multiple of 7
    // ends deleted, and round 2's upsert of it, arriving after the delete, is ignored.
    let keys = 300u64;
    let mut changes = Vec::new();
    let mut newest: BTreeMap<u64, (u64, Value)> = BTreeMap::new();
    for round in [0u64, 1, 3, 2, 4] {
        for k in (0..keys).filter(|k| round != 4 || k % 2 == 0) {
            let mut row = order(k + round * 7);
            row["id"] = json!(k);
            let delete = round == 3 && k % 7 == 0;
            row["_CHANGE_TYPE"] = json!(if delete { "DELETE" } else { "UPSERT" });
            row["_CHANGE_SEQUENCE_NUMBER"] = json!(format!("{:X}", round + 1));
            changes.push(row.clone());
            if newest.get(&k).is_none_or(|(r, _)| *r < round) {
                newest.insert(k, (round, row));
            }
        }
    }
    let want: Vec<Value> = newest
        .into_values()
        .filter(|(_, row)| row["_CHANGE_TYPE"] == "UPSERT")
        .map(|(round, mut row)| {
            row.as_object_mut().unwrap().remove("_CHANGE_TYPE");
            row["_CHANGE_SEQUENCE_NUMBER"] = json!(format!(
                "{:016X}/{:016X}/{:016X}/{:016X}",
                round + 1,
                0,
                0,
                0
            ));
            row
        })
        .collect();
    assert_eq!(want.len(), 300 - 21, "the odd multiples of 7 are deleted");
    let src = input(dir.path(), "changes.ndjson", &changes);
    for (name, by, column) in [
        ("by_region", "region", "region"),
        ("by_day", "DAY(at)", "_PARTITIONDATE"),
    ] {
        let table = dir.path().join(name);
        let out = run_ok(&mut run(
            &sub,
            &src,
            &format!("file://{}", table.display()),
            &schema,
            &["--table-primary-key", "id", "--table-partition-by", by],
        ));
        assert_eq!(summary(&out)["messages_written"], changes.len());
        let t = read(&table.display().to_string(), column, &[]);
        let want: Vec<Value> = if column == "_PARTITIONDATE" {
            want.iter()
                .map(|w| {
                    let mut w = w.clone();
                    w["_PARTITIONDATE"] = json!(w["at"].as_str().unwrap()[..10]);
                    w
                })
                .collect()
        } else {
            want.clone()
        };
        check_partitioned(&t, column, &want, &[column]);
    }
}

/// The same partitioned table made on SeaweedFS (S3) and on Azurite, read back from the store.
#[test]
fn partitioned_tables_on_s3_and_azure() {
    let dir = tempfile::tempdir().unwrap();
    let sub = subscription(dir.path(), 250);
    let schema = schema_file(dir.path(), SCHEMA);
    let payloads: Vec<Value> = (0..1_000).map(order).collect();
    let src = input(dir.path(), "in.ndjson", &payloads);
    let s3 = S3Server::start();
    s3.create_bucket("lake");
    let url = "s3://lake/warehouse/orders";
    run_ok(
        run(
            &sub,
            &src,
            url,
            &schema,
            &["--table-partition-by", "region"],
        )
        .envs(s3.env()),
    );
    let t = read(url, "region", &s3.env());
    check_partitioned(&t, "region", &payloads, &["region"]);
    let keys: Vec<String> = s3.list("lake").into_iter().map(|(k, _)| k).collect();
    assert!(
        keys.iter()
            .any(|k| k.starts_with("warehouse/orders/region=a%20b%2Fc%3Dd%25/part-")),
        "{keys:?}"
    );

    let az = Azurite::start();
    az.create_container("lake");
    let url = "az://lake/warehouse/orders";
    run_ok(
        run(
            &sub,
            &src,
            url,
            &schema,
            &["--table-partition-by", "region"],
        )
        .envs(az.env()),
    );
    let mut env = az.env();
    env.push((
        "READER_OPTIONS",
        json!({
            "azure_storage_account_name": AZURITE_ACCOUNT,
            "azure_storage_account_key": AZURITE_KEY,
            "azure_storage_use_emulator": "true",
            "azure_allow_http": "true",
        })
        .to_string(),
    ));
    let t = read(url, "region", &env);
    check_partitioned(&t, "region", &payloads, &["region"]);
}

/// Wait for `pid`: its exit code and peak RSS in MiB (the kernel's accounting).
fn wait_peak_mib(pid: u32) -> (i32, f64) {
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(r, pid as libc::pid_t, "wait4");
    (libc::WEXITSTATUS(status), usage.ru_maxrss as f64 / 1024.0)
}

/// One run of [`a_batch_over_many_partitions_stays_within_the_memory_limit`]: `src` into a new
/// table `name` partitioned by region, with `--memory-limit limit`; the worker's own peak RSS
/// (MiB) and what deltalake reads back from the table.
fn many_partitions_run(
    dir: &Path,
    sub: &Path,
    src: &Path,
    schema: &Path,
    limit: &str,
) -> (f64, Value) {
    let table = dir.join(format!("wide-{limit}"));
    let summary = dir.join(format!("summary-{limit}.json"));
    let own = util::own_peak_mib();
    #[allow(clippy::zombie_processes)] // reaped by wait4
    let child = run(
        sub,
        src,
        &format!("file://{}", table.display()),
        schema,
        &["--table-partition-by", "region", "--memory-limit", limit],
    )
    .stdout(std::fs::File::create(&summary).unwrap())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let (code, wait_mib) = wait_peak_mib(child.id());
    assert_eq!(code, 0, "--memory-limit {limit}");
    // The worker's own peak, from its summary: `wait4`'s would start at this test process's peak
    // (the kernel carries a spawning process's high-water mark into its child), which the other
    // tests of this binary, running beside this one, raise (165.5 MiB seen, the child's own 142).
    let out = std::fs::read_to_string(&summary).unwrap();
    let s: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let peak = s["peak_rss_bytes"].as_f64().expect("peak_rss_bytes") / (1 << 20) as f64;
    // Never above `wait4`'s; the same (within 64 KiB) when this process's peak was the smaller.
    assert!(
        peak <= wait_mib,
        "{limit}: own peak {peak:.2} MiB, wait4 {wait_mib:.2} MiB"
    );
    if own + 0.0625 < peak {
        assert!(
            wait_mib - peak <= 0.0625,
            "{limit}: wait4 {wait_mib:.2} MiB, own peak {peak:.2} MiB, this process {own:.1} MiB"
        );
    }
    const READ: &str = r#"
import json, os, sys, collections, deltalake
dt = deltalake.DeltaTable(sys.argv[1])
t = dt.to_pyarrow_table(columns=["id", "region"])
ids = t.column("id").to_pylist()
bad = sum(1 for i, r in zip(ids, t.column("region").to_pylist()) if r != "r%03d" % (i % 200))
print(json.dumps({"rows": len(ids), "distinct": len(set(ids)), "min": min(ids), "max": max(ids),
                  "misplaced": bad, "version": dt.version(), "files": len(dt.file_uris())}))
sys.stdout.flush()
os._exit(0)
"#;
    (peak, python_json(READ, &table.display().to_string(), &[]))
}

/// A batch spread over 200 partitions holds one open file each; the memory budget counts them
/// all and commits the batch early, so the run stays within `--memory-limit` plus the documented
/// overhead (docs/operating.md: a debug build's Delta writer at rest, 104 MiB, plus 16 MiB), and
/// every row is in the table once, in its partition. The same run without a budget
/// (`--memory-limit none`) must pass that bound, or the bound shows nothing (issue 43, point 4).
#[test]
fn a_batch_over_many_partitions_stays_within_the_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = json!({
        "name": SUB,
        "topic": "projects/proj/topics/orders",
        "bigqueryConfig": {"table": "proj.shop.orders", "useTableSchema": true},
        "subsink": {"limits": "extended", "table": {"maxBytes": "1000000000"}},
    });
    let sub = dir.path().join("sub.json");
    std::fs::write(&sub, cfg.to_string()).unwrap();
    let schema = schema_file(
        dir.path(),
        r#"[{"name": "id", "type": "INTEGER", "mode": "REQUIRED"},
            {"name": "region", "type": "STRING"},
            {"name": "pad", "type": "STRING"}]"#,
    );
    // 20,000 rows of ~2 KB that do not compress, over 200 regions: 40 MB.
    let n = 20_000u64;
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let payloads: Vec<Value> = (0..n)
        .map(|i| {
            let pad: String = (0..128)
                .map(|_| format!("{:016x}", xorshift(&mut seed)))
                .collect();
            json!({"id": i, "region": format!("r{:03}", i % 200), "pad": pad})
        })
        .collect();
    let src = input(dir.path(), "in.ndjson", &payloads);
    drop(payloads);
    let limit_mib = 32u64;
    let bound = (limit_mib + if cfg!(debug_assertions) { 104 } else { 48 } + 16) as f64;
    let (peak, t) =
        many_partitions_run(dir.path(), &sub, &src, &schema, &format!("{limit_mib}MiB"));
    let (unlimited, u) = many_partitions_run(dir.path(), &sub, &src, &schema, "none");
    let whole = (&json!(n), &json!(n), &json!(0), &json!(n - 1), &json!(0));
    for t in [&t, &u] {
        assert_eq!(
            (
                &t["rows"],
                &t["distinct"],
                &t["min"],
                &t["max"],
                &t["misplaced"]
            ),
            whole,
            "{t}"
        );
    }
    assert!(
        t["version"].as_u64().unwrap() > 1,
        "the budget commits the batch early: {t}"
    );
    eprintln!(
        "peak RSS {peak:.1} MiB with --memory-limit {limit_mib}MiB, {unlimited:.1} MiB without \
         (bound {bound} MiB); tables {t}, {u}"
    );
    assert!(peak < bound, "peak RSS {peak:.1} MiB over {bound} MiB");
    assert!(
        unlimited > bound,
        "without a budget the run should need more ({unlimited:.1} MiB): the bound would not show \
         the budget"
    );
}

/// Killed (-9) four times at random moments while it fills a table partitioned by region and
/// day (12 partitions, each batch a file in each), then resumed from its checkpoint: every row
/// is in the table once and in its partition, and one more run writes nothing.
#[test]
fn checkpoint_resume_after_kill_fills_every_partition_once() {
    let dir = tempfile::tempdir().unwrap();
    let n = 20_000u64;
    let sub = subscription(dir.path(), 500);
    let schema = schema_file(dir.path(), SCHEMA);
    let payloads: Vec<Value> = (0..n).map(order).collect();
    let src = input(dir.path(), "in.ndjson", &payloads);
    let table = dir.path().join("t");
    let url = format!("file://{}", table.display());
    let cp = dir.path().join("cp.json");
    let cmd = || {
        let mut c = run(
            &sub,
            &src,
            &url,
            &schema,
            &["--table-partition-by", "region,DAY(at)"],
        );
        c.arg("--checkpoint").arg(&cp);
        c
    };
    let size = std::fs::metadata(&src).unwrap().len();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    kill_rounds(4, &cp, size, &mut seed, || {
        cmd()
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    });
    let resumed = summary(&run_ok(&mut cmd()))["messages_written"]
        .as_u64()
        .unwrap();
    assert!(
        resumed < n,
        "the last run resumed: it wrote {resumed} of {n}"
    );
    let t = read(&table.display().to_string(), "region", &[]);
    check_partitioned(&t, "region", &payloads, &["region", "_PARTITIONDATE"]);
    let rows = t["rows"].as_array().unwrap();
    assert!(
        rows.iter()
            .all(|r| r["_PARTITIONDATE"].as_str() == Some(&r["day"].as_str().unwrap()[..10])),
        "a row outside its day's partition"
    );
    assert_eq!(summary(&run_ok(&mut cmd()))["messages_written"], 0);
}
