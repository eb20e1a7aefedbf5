//! BigQuery destination throughput: N messages (default 200,000; JSON events of ~300 bytes, two
//! attributes) from an NDJSON file into a BigQuery table on `bqemulator` 1.4.0 (started here,
//! through `tests/py/bqemulator_launcher.py`), use_table_schema + write_metadata, by
//!
//! * `subsink run --source FILE --table-url bigquery://…` (the bench build; default stream,
//!   and — `SUBSINK_BENCH_EXACTLY_ONCE=1` — also `--exactly-once`), timed from spawn to exit;
//! * Google's official Python client (`google-cloud-bigquery-storage`, `AppendRowsStream` with
//!   Arrow rows, the same rows; `benches/bigquery_append.py`), timed inside the script from its
//!   first line read to its last append answered (interpreter start and imports not counted).
//!
//! Rounds are interleaved (one of each contender per round, a fresh table each), every round is
//! printed, then the medians. Both write to the same emulator, whose DuckDB insert is part of
//! every append: the numbers compare two clients of one server, not BigQuery's own speed.
//!
//! `cargo bench --bench bigquery_append` (needs scripts/setup-test-env); `SUBSINK_BENCH_MESSAGES`
//! sets N, `SUBSINK_BENCH_ROUNDS` the rounds (3).

#[path = "../tests/util/mod.rs"]
mod util;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use base64::Engine as _;
use serde_json::json;
use util::bigquery::{shared_bq, BQ_PROJECT};
use util::env_or;

const SUB: &str = "projects/subsink-bq/subscriptions/bench";

fn fields() -> serde_json::Value {
    json!([
        {"name": "id", "type": "INT64", "mode": "REQUIRED"},
        {"name": "name", "type": "STRING"},
        {"name": "score", "type": "FLOAT64"},
        {"name": "ok", "type": "BOOL"},
        {"name": "at", "type": "TIMESTAMP"},
        {"name": "payload", "type": "STRING"},
        {"name": "subscription_name", "type": "STRING"},
        {"name": "message_id", "type": "STRING"},
        {"name": "publish_time", "type": "TIMESTAMP"},
        {"name": "attributes", "type": "JSON"}
    ])
}

fn write_input(path: &Path, n: usize) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in 0..n {
        let payload = json!({
            "id": i, "name": format!("event-{}", i % 1000), "score": i as f64 / 7.0,
            "ok": i % 3 == 0, "at": "2023-09-25T04:10:00.123456Z",
            "payload": "p".repeat(150 + i % 100),
        })
        .to_string();
        let line = json!({
            "data": base64::engine::general_purpose::STANDARD.encode(payload),
            "messageId": format!("m{i}"), "publishTime": "2023-09-25T04:10:01Z",
            "attributes": {"tenant": format!("t{}", i % 17), "kind": "click"},
        });
        writeln!(f, "{line}").unwrap();
    }
}

fn count(bq: &util::bigquery::Bq, table: &str) -> u64 {
    let r = bq.query(&format!(
        "SELECT COUNT(*) AS n FROM `{BQ_PROJECT}.bench.{table}`"
    ));
    r[0]["n"].as_str().unwrap().parse().unwrap()
}

fn main() {
    let n = env_or("SUBSINK_BENCH_MESSAGES", 200_000);
    let rounds = env_or("SUBSINK_BENCH_ROUNDS", 3);
    let exactly = std::env::var("SUBSINK_BENCH_EXACTLY_ONCE").is_ok_and(|v| v == "1");
    // The binary cargo built for this bench (the bench profile: release settings).
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_subsink"));
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ndjson");
    write_input(&input, n);
    let mb = std::fs::metadata(&input).unwrap().len() as f64 / 1e6;
    let bq = shared_bq();
    let cfg = dir.path().join("sub.json");
    std::fs::write(
        &cfg,
        json!({"name": SUB, "topic": "projects/subsink-bq/topics/bench",
               "bigqueryConfig": {"table": "x.y.z", "useTableSchema": true, "writeMetadata": true}})
        .to_string(),
    )
    .unwrap();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{n} messages ({mb:.0} MB NDJSON), {rounds} rounds; load average before: {}",
        load.trim()
    );
    let mut contenders: Vec<&str> = vec!["subsink", "python"];
    if exactly {
        contenders.insert(1, "subsink-exactly-once");
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
    for round in 0..rounds {
        for (c, name) in contenders.iter().enumerate() {
            let table = format!("r{round}_{}", name.replace('-', "_"));
            bq.table("bench", &table, fields());
            let secs = match *name {
                "python" => {
                    let out = Command::new(util::venv_bin("python"))
                        .arg(util::root().join("benches/bigquery_append.py"))
                        .arg(&input)
                        .arg(format!("127.0.0.1:{}", bq.grpc_port))
                        .arg(format!(
                            "projects/{BQ_PROJECT}/datasets/bench/tables/{table}"
                        ))
                        .arg(SUB)
                        .output()
                        .unwrap();
                    assert!(
                        out.status.success(),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    let v: serde_json::Value =
                        serde_json::from_slice(&out.stdout).expect("python's JSON line");
                    v["seconds"].as_f64().unwrap()
                }
                _ => {
                    let t = Instant::now();
                    let mut cmd = Command::new(&bin);
                    cmd.env("SUBSINK_LOG", "warn")
                        .args(["run", "--subscription"])
                        .arg(&cfg)
                        .arg("--source")
                        .arg(&input)
                        .args(["--table-url", &bq.url("bench", &table)])
                        .args(bq.flags());
                    if *name == "subsink-exactly-once" {
                        cmd.arg("--exactly-once");
                    }
                    let out = cmd.output().unwrap();
                    assert!(
                        out.status.success(),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    t.elapsed().as_secs_f64()
                }
            };
            let rows = count(bq, &table);
            assert_eq!(rows, n as u64, "{name} round {round}: rows in the table");
            println!(
                "round {round} {name:<22} {secs:7.2} s  {:>9.0} rows/s",
                n as f64 / secs
            );
            times[c].push(secs);
        }
    }
    for (c, name) in contenders.iter().enumerate() {
        let mut t = times[c].clone();
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let med = t[t.len() / 2];
        println!(
            "median {name:<22} {med:7.2} s  {:>9.0} rows/s",
            n as f64 / med
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average after: {}", load.trim());
}
