//! Single Message Transforms throughput (issue 23, docs/transforms.md): the storage bench's job
//! (NDJSON file → subsink → Avro with metadata in a local folder) on 1M messages of ~1 KiB JSON
//! payloads, with a UDF that parses the payload, adds a field, deletes one and stringifies it;
//! against Node.js reading the same NDJSON and applying the same UDF (reading + transforming only,
//! no writing: benches/transforms_node.js); and the same subsink job without the UDF (the
//! transforms' overhead). Contenders run in interleaved rounds; every round is printed.
//!
//! `cargo bench --bench transforms`. Environment: `SUBSINK_BENCH_MESSAGES` (default 1000000),
//! `SUBSINK_BENCH_ROUNDS` (default 3), `SUBSINK_BENCH_DIR` (scratch folder, default a temp dir).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use base64::Engine as _;

const UDF: &str = "function enrich(message, metadata) {
  var d = JSON.parse(message.data);
  d.received = metadata.message_id + '@' + metadata.publish_time;
  delete d.debug;
  message.data = JSON.stringify(d);
  return message;
}";

/// `n` messages whose payload is a JSON object of about 1 KiB.
fn generate(path: &Path, n: u64) -> u64 {
    let f = std::fs::File::create(path).unwrap();
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut word = |len: usize| -> String {
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (b'a' + (x % 26) as u8) as char
            })
            .collect()
    };
    let base = chrono::DateTime::parse_from_rfc3339("2026-11-30T00:00:00Z")
        .unwrap()
        .timestamp_micros();
    let mut b64 = String::with_capacity(2048);
    for i in 0..n {
        let payload = serde_json::json!({
            "id": i, "user": word(12), "email": format!("{}@example.com", word(10)),
            "amount": (i % 10_000) as f64 / 100.0, "currency": "EUR", "ok": i % 3 != 0,
            "tags": [word(6), word(6), word(6)],
            "address": {"street": word(20), "city": word(10), "zip": word(5)},
            "debug": word(300), "note": word(480),
        })
        .to_string();
        b64.clear();
        base64::engine::general_purpose::STANDARD.encode_string(payload.as_bytes(), &mut b64);
        let t = chrono::DateTime::from_timestamp_micros(base + i as i64 * 1000).unwrap();
        writeln!(
            w,
            r#"{{"data":"{b64}","attributes":{{"source":"bench","tenant":"t-{}","type":"event.v1"}},"messageId":"{}","publishTime":"{}"}}"#,
            i % 100,
            10_000_000_000u64 + i,
            t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        )
        .unwrap();
    }
    w.flush().unwrap();
    std::fs::metadata(path).unwrap().len()
}

/// One subsink job: seconds.
fn subsink_job(sub: &Path, input: &Path, bucket: &Path, n: u64) -> f64 {
    let _ = std::fs::remove_dir_all(bucket);
    unsafe { libc::sync() };
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_subsink"))
        .args(["run", "--subscription"])
        .arg(sub)
        .arg("--source")
        .arg(input)
        .arg("--bucket-url")
        .arg(format!("file://{}", bucket.display()))
        .output()
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(summary["messages_written"].as_u64().unwrap(), n);
    let _ = std::fs::remove_dir_all(bucket);
    secs
}

/// Node.js reading and transforming the same file: its own timing of the work (seconds).
fn node_job(input: &Path, udf: &Path, n: u64) -> f64 {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/transforms_node.js");
    let out = Command::new("node")
        .arg(script)
        .arg(input)
        .arg(udf)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(r["messages"].as_u64().unwrap(), n);
    r["seconds"].as_f64().unwrap()
}

fn median(v: &[f64]) -> f64 {
    let mut t = v.to_vec();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    // `cargo test --benches` passes flags like --bench; run only under `cargo bench`.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let n: u64 = std::env::var("SUBSINK_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: usize = std::env::var("SUBSINK_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = std::env::var_os("SUBSINK_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(format!("bench-json-{n}.ndjson"));
    let size = if input.exists() {
        std::fs::metadata(&input).unwrap().len()
    } else {
        generate(&input, n)
    };
    let udf = dir.join("enrich.js");
    std::fs::write(&udf, UDF).unwrap();
    let config = |transforms: bool| {
        let mut v = serde_json::json!({
            "name": "projects/bench/subscriptions/bench", "topic": "projects/bench/topics/bench",
            "cloudStorageConfig": {"bucket": "bench", "filenameSuffix": ".avro", "maxDuration": "600s",
                "maxBytes": "10737418240", "avroConfig": {"writeMetadata": true}},
        });
        if transforms {
            v["messageTransforms"] =
                serde_json::json!([{"javascriptUdf": {"functionName": "enrich", "code": UDF}}]);
        }
        let p = dir.join(format!("sub-{transforms}.json"));
        std::fs::write(&p, v.to_string()).unwrap();
        p
    };
    let (with, without) = (config(true), config(false));
    let bucket = dir.join("bucket");
    let (mut t_udf, mut t_plain, mut t_node) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let s = subsink_job(&with, &input, &bucket, n);
        println!(
            "round {round} subsink + UDF: {n} msgs in {s:.2} s: {:.0} msgs/s",
            n as f64 / s
        );
        t_udf.push(s);
        let s = node_job(&input, &udf, n);
        println!(
            "round {round} node (read + UDF): {n} msgs in {s:.2} s: {:.0} msgs/s",
            n as f64 / s
        );
        t_node.push(s);
        let s = subsink_job(&without, &input, &bucket, n);
        println!(
            "round {round} subsink, no UDF: {n} msgs in {s:.2} s: {:.0} msgs/s",
            n as f64 / s
        );
        t_plain.push(s);
    }
    let (u, p, nd) = (median(&t_udf), median(&t_plain), median(&t_node));
    println!(
        "medians over {rounds} rounds ({:.1} MB input): subsink + UDF {:.0} msgs/s, node {:.0} msgs/s \
         (subsink = {:.2}× node), subsink without UDF {:.0} msgs/s (the UDF costs {:.0}% more time)",
        size as f64 / 1e6,
        n as f64 / u,
        n as f64 / nd,
        nd / u,
        n as f64 / p,
        (u / p - 1.0) * 100.0
    );
}
