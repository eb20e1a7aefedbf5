//! Kafka source throughput (issue 24, point 8): N records of 1 KiB (3 headers) on a topic of 6
//! partitions of a real broker (Tansu, in memory), drained in interleaved rounds by:
//! * subsink into Avro-with-metadata objects in a local folder,
//! * subsink into a Delta table in a local folder,
//! * subsink with `--exactly-once` into the local folder (its cost),
//! * a confluent-kafka group consumer that only consumes and commits (benches/kafka_consume.py),
//! * a confluent-kafka fetch-only consumer (assigned partitions, no commits): the broker's ceiling.
//!
//! Every round reads the whole topic with a fresh group; every round is printed, then the median.
//! subsink's time runs from its start to the last "acked after durable" (the commit of the last
//! watermark); its files close on flow control or after 1 s (`maxDuration`), so the last file
//! adds at most 1 s. The bar (issue 24): subsink ≥ 1.5× the Python consumer, or within 20% of the
//! ceiling where the broker is the limit.
//!
//! `cargo bench --bench kafka_drain` (needs scripts/setup-test-env: tansu, confluent-kafka);
//! `SUBSINK_BENCH_MESSAGES` sets N (default 1000000), `SUBSINK_BENCH_ROUNDS` the rounds (3).

#[path = "../tests/util/mod.rs"]
mod util;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

const PARTITIONS: u32 = 6;

fn python(args: &[&str]) -> String {
    let out = Command::new(util::venv_bin("python"))
        .arg(util::root().join("benches/kafka_consume.py"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kafka_consume.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The msgs/s at the end of a kafka_consume.py line.
fn rate_of(line: &str) -> f64 {
    line.rsplit(": ")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .map(|s| s.replace(',', ""))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0)
}

/// subsink drains the topic in group `group` with `args` (destination flags); msgs/s from start
/// to the last "acked after durable".
fn subsink(brokers: &str, cfg: &Path, group: &str, args: &[String], n: usize) -> f64 {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_subsink"))
        .env("SUBSINK_LOG", "subsink=info")
        .args(["run", "--source", &format!("kafka://{brokers}")])
        .args([
            "--kafka-topic",
            "bench",
            "--kafka-group",
            group,
            "--subscription",
        ])
        .arg(cfg)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut acked = 0usize;
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.contains("acked after durable") {
            if let Some(m) = line.split("messages=").nth(1) {
                acked += m
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .parse::<usize>()
                    .unwrap();
            }
            if acked >= n {
                break;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    // Read its log to the end: a worker's shutdown is not the bench's to cut short.
    for _ in lines {}
    let _ = child.wait();
    assert_eq!(acked, n, "subsink committed {acked} of {n}");
    n as f64 / secs
}

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let n = util::env_or("SUBSINK_BENCH_MESSAGES", 1_000_000);
    let rounds = util::env_or("SUBSINK_BENCH_ROUNDS", 3);
    let t = util::kafka::tansu();
    t.create_topic("bench", PARTITIONS);
    let start = Instant::now();
    python(&[
        "produce",
        &t.brokers,
        "bench",
        &n.to_string(),
        &PARTITIONS.to_string(),
    ]);
    eprintln!(
        "produced {n} records in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let dir = tempfile::tempdir().unwrap();
    let objects_cfg = dir.path().join("objects.json");
    std::fs::write(
        &objects_cfg,
        r#"{"name":"projects/bench/subscriptions/subsink","topic":"projects/bench/topics/events",
            "ackDeadlineSeconds":60,"subsink":{"limits":"extended"},
            "cloudStorageConfig":{"bucket":"bench","maxDuration":"1s",
                                  "avroConfig":{"writeMetadata":true}}}"#,
    )
    .unwrap();
    let table_cfg = dir.path().join("table.json");
    std::fs::write(
        &table_cfg,
        r#"{"name":"projects/bench/subscriptions/subsink","topic":"projects/bench/topics/events",
            "ackDeadlineSeconds":60,
            "bigqueryConfig":{"table":"bench.bench.events","writeMetadata":true},
            "subsink":{"table":{"maxDuration":"1s"}}}"#,
    )
    .unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"[{"name":"subscription_name","type":"STRING"},{"name":"message_id","type":"STRING"},
            {"name":"publish_time","type":"TIMESTAMP"},{"name":"data","type":"BYTES"},
            {"name":"attributes","type":"JSON"}]"#,
    )
    .unwrap();
    let mut results: Vec<(&str, Vec<f64>)> = vec![
        ("subsink -> local folder (Avro with metadata)", vec![]),
        ("subsink -> Delta table", vec![]),
        (
            "subsink --exactly-once -> local folder (Avro with metadata)",
            vec![],
        ),
        ("confluent-kafka group consumer (consume + commit)", vec![]),
        ("confluent-kafka fetch only (ceiling)", vec![]),
    ];
    for r in 0..rounds {
        let bucket = dir.path().join(format!("bucket{r}"));
        let args = vec![
            "--bucket-url".to_string(),
            format!("file://{}", bucket.display()),
        ];
        let v = subsink(&t.brokers, &objects_cfg, &format!("objects{r}"), &args, n);
        println!("round {r}: {}: {v:.0} msgs/s", results[0].0);
        results[0].1.push(v);
        let _ = std::fs::remove_dir_all(&bucket);
        let table = dir.path().join(format!("table{r}"));
        let args = vec![
            "--table-url".to_string(),
            format!("file://{}", table.display()),
            "--table-schema".to_string(),
            schema.display().to_string(),
        ];
        let v = subsink(&t.brokers, &table_cfg, &format!("table{r}"), &args, n);
        println!("round {r}: {}: {v:.0} msgs/s", results[1].0);
        results[1].1.push(v);
        let _ = std::fs::remove_dir_all(&table);
        // The cost of --exactly-once: one file per partition, named from its first offset,
        // written put-if-absent by single put, a partition's files one after the other.
        let bucket = dir.path().join(format!("exact{r}"));
        let args = vec![
            "--bucket-url".to_string(),
            format!("file://{}", bucket.display()),
            "--exactly-once".to_string(),
        ];
        let v = subsink(&t.brokers, &objects_cfg, &format!("exact{r}"), &args, n);
        println!("round {r}: {}: {v:.0} msgs/s", results[2].0);
        results[2].1.push(v);
        let _ = std::fs::remove_dir_all(&bucket);
        let line = python(&[
            "consume",
            &t.brokers,
            "bench",
            &format!("py{r}"),
            &n.to_string(),
        ]);
        print!("round {r}: {line}");
        results[3].1.push(rate_of(&line));
        let line = python(&[
            "fetch",
            &t.brokers,
            "bench",
            &n.to_string(),
            &PARTITIONS.to_string(),
        ]);
        print!("round {r}: {line}");
        results[4].1.push(rate_of(&line));
    }
    for (name, rates) in &results {
        let mut s = rates.clone();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{name}: median {:.0} msgs/s over {} rounds (min {:.0}, max {:.0})",
            s[s.len() / 2],
            s.len(),
            s[0],
            s[s.len() - 1]
        );
    }
}
