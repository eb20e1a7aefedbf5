//! BigQuery on `bqemulator` (PyPI, started through `tests/py/bqemulator_launcher.py`): one
//! emulator per test binary, datasets and tables made through its REST API, rows read back with
//! its query API (`jobs.query`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::servers::{in_keeper_thread, Guarded};
use super::{free_port, root, rt, venv_bin};

/// The emulator's project.
pub const BQ_PROJECT: &str = "subsink-bq";

struct BqProcess {
    _proc: Guarded,
}

/// The shared emulator: its REST and gRPC ports.
pub struct Bq {
    pub rest_port: u16,
    pub grpc_port: u16,
    pub log: PathBuf,
}

fn start() -> (BqProcess, Bq) {
    let (rest_port, grpc_port) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("subsink-bqemu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("bqemulator.log");
    let mut proc = Guarded::spawn(
        Command::new(venv_bin("python"))
            .arg(root().join("tests/py/bqemulator_launcher.py"))
            .args(["start", "--rest-host", "127.0.0.1", "--rest-port"])
            .arg(rest_port.to_string())
            .args(["--grpc-host", "127.0.0.1", "--grpc-port"])
            .arg(grpc_port.to_string())
            .args(["--project", BQ_PROJECT])
            .env("BQEMU_TELEMETRY_ENABLED", "false")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
            )),
        "bqemulator",
    );
    let t = Instant::now();
    for port in [rest_port, grpc_port] {
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = proc.try_wait() {
                panic!(
                    "bqemulator exited early ({status}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "bqemulator did not listen within 60 s:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let bq = Bq {
        rest_port,
        grpc_port,
        log,
    };
    (BqProcess { _proc: proc }, bq)
}

/// One test at a time on the shared emulator: its write path is not made for several writers at
/// once, and a test that times a kill must not wait behind another's appends. Each test holds the
/// guard for its whole run (a panicking test poisons nothing: the lock is taken back).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The columns of a table written with `writeMetadata` and no table schema: the payload and the
/// four metadata columns (attributes as a JSON string).
pub fn metadata_columns() -> Value {
    json!([
        {"name": "data", "type": "BYTES"},
        {"name": "subscription_name", "type": "STRING"},
        {"name": "message_id", "type": "STRING"},
        {"name": "publish_time", "type": "TIMESTAMP"},
        {"name": "attributes", "type": "STRING"},
    ])
}

/// One emulator for the whole test binary.
pub fn shared_bq() -> &'static Bq {
    static B: OnceLock<Bq> = OnceLock::new();
    B.get_or_init(|| {
        in_keeper_thread(start, |(_, b)| Bq {
            rest_port: b.rest_port,
            grpc_port: b.grpc_port,
            log: b.log.clone(),
        })
    })
}

impl Bq {
    pub fn rest(&self) -> String {
        format!("http://127.0.0.1:{}", self.rest_port)
    }

    pub fn grpc(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The endpoint flags of `subsink run`.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--bigquery-endpoint".into(),
            self.rest(),
            "--bigquery-storage-endpoint".into(),
            self.grpc(),
        ]
    }

    fn call(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let url = format!("{}/bigquery/v2/projects/{BQ_PROJECT}/{path}", self.rest());
        rt().block_on(async {
            let c = reqwest::Client::new();
            let req = match method {
                "POST" => c.post(&url).body(body.to_string()),
                "PATCH" => c.patch(&url).body(body.to_string()),
                "DELETE" => c.delete(&url),
                _ => c.get(&url),
            };
            let resp = req
                .header("content-type", "application/json")
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await.unwrap();
            (
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            )
        })
    }

    /// Create dataset `ds` (once; an existing one is fine).
    pub fn dataset(&self, ds: &str) {
        let (status, v) = self.call(
            "POST",
            "datasets",
            json!({"datasetReference": {"projectId": BQ_PROJECT, "datasetId": ds}}),
        );
        assert!(
            status == 200 || status == 409,
            "create dataset {ds}: {status} {v}"
        );
    }

    /// Create table `ds.table` with `fields` (BigQuery's JSON schema), in a fresh dataset `ds`.
    pub fn table(&self, ds: &str, table: &str, fields: Value) {
        self.dataset(ds);
        let (status, v) = self.call(
            "POST",
            &format!("datasets/{ds}/tables"),
            json!({
                "tableReference": {"projectId": BQ_PROJECT, "datasetId": ds, "tableId": table},
                "schema": {"fields": fields},
            }),
        );
        assert_eq!(status, 200, "create table {ds}.{table}: {v}");
    }

    /// Change the columns of `ds.table` to `fields` (BigQuery's JSON schema) with `tables.patch`,
    /// after `alter` (GoogleSQL DDL, run first when given): the emulator's `tables.patch` changes
    /// the table resource (what `tables.get` answers) but not its storage, and its `ALTER TABLE`
    /// the storage but not the resource, so a schema change there takes both.
    pub fn change_columns(&self, ds: &str, table: &str, alter: &str, fields: Value) {
        if !alter.is_empty() {
            let (status, v) = self.call(
                "POST",
                "queries",
                json!({"query": alter, "useLegacySql": false}),
            );
            assert!(status == 200 && v["errors"].is_null(), "{alter}: {v}");
        }
        let (status, v) = self.call(
            "PATCH",
            &format!("datasets/{ds}/tables/{table}"),
            json!({"schema": {"fields": fields}}),
        );
        assert_eq!(status, 200, "patch {ds}.{table}: {v}");
    }

    /// `bigquery://PROJECT/DS/TABLE`.
    pub fn url(&self, ds: &str, table: &str) -> String {
        format!("bigquery://{BQ_PROJECT}/{ds}/{table}")
    }

    /// Rows of `sql` as JSON objects (column → value as `jobs.query` gives it: scalars as
    /// strings, a RECORD an object, a REPEATED column an array).
    pub fn query(&self, sql: &str) -> Vec<Value> {
        let (status, v) = self.call(
            "POST",
            "queries",
            // Every row on one page (the emulator's default page is 10,000 rows).
            json!({"query": sql, "useLegacySql": false, "maxResults": 1_000_000}),
        );
        assert_eq!(status, 200, "query {sql}: {v}");
        let fields = v["schema"]["fields"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        v["rows"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|r| record(&fields, r))
            .collect()
    }

    /// Every row of `ds.table`, sorted by `key`.
    pub fn rows(&self, ds: &str, table: &str, key: &str) -> Vec<Value> {
        self.query(&format!(
            "SELECT * FROM `{BQ_PROJECT}.{ds}.{table}` ORDER BY {key}"
        ))
    }
}

/// A `{"f": [{"v": …}]}` row of `fields` as an object.
fn record(fields: &[Value], row: &Value) -> Value {
    let cells = row["f"].as_array().cloned().unwrap_or_default();
    let mut out = serde_json::Map::new();
    for (f, c) in fields.iter().zip(cells) {
        out.insert(f["name"].as_str().unwrap().to_string(), cell(f, &c["v"]));
    }
    Value::Object(out)
}

fn cell(field: &Value, v: &Value) -> Value {
    let sub = field["fields"].as_array().cloned().unwrap_or_default();
    let one = |v: &Value| {
        if sub.is_empty() || v.is_null() {
            v.clone()
        } else {
            record(&sub, v)
        }
    };
    if field["mode"] == "REPEATED" {
        Value::Array(
            v.as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|e| one(&e["v"]))
                .collect(),
        )
    } else {
        one(v)
    }
}
