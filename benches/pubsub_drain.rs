//! Pub/Sub source throughput: publish ~200k messages of ~1 KiB (3 attributes) to the emulator and
//! drain them through the storage writer (Avro with metadata, local folder), printing msgs/s.
//! With `SUBSINK_BENCH_PYTHON=1` the official Python subscriber client (receive + ack only) drains
//! a second subscription of the same topic, for comparison (needs scripts/setup-test-env).
//!
//! `cargo bench --bench pubsub_drain`; `SUBSINK_BENCH_MESSAGES` sets the count (default 200000).

#[path = "../tests/util/mod.rs"]
mod util;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use subsink::message::Message;
use subsink::source::pubsub::{PubsubClient, SubscriptionSpec};

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let n: usize = std::env::var("SUBSINK_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    // Two subscriptions of 200k × 1 KiB live in the emulator's heap.
    if std::env::var_os("SUBSINK_EMULATOR_JAVA_OPTS").is_none() {
        std::env::set_var("SUBSINK_EMULATOR_JAVA_OPTS", "-Xmx6g -XX:+UseParallelGC");
    }
    let emu = util::emulator::Emulator::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt
        .block_on(PubsubClient::connect_emulator(&emu.host()))
        .unwrap();
    let topic = "projects/bench/topics/events";
    let subs = [
        "projects/bench/subscriptions/subsink",
        "projects/bench/subscriptions/python",
    ];
    rt.block_on(async {
        client.create_topic(topic).await.unwrap();
        for s in subs {
            let mut spec = SubscriptionSpec::new(s, topic);
            spec.ack_deadline_seconds = 60;
            client.create_subscription(&spec).await.unwrap();
        }
    });
    let t = Instant::now();
    let payload = vec![b'p'; 1024];
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let msgs: Vec<Message> = chunk
            .iter()
            .map(|&i| Message {
                data: payload.clone().into(),
                attributes: BTreeMap::from([
                    ("source".to_string(), "bench".to_string()),
                    ("tenant".to_string(), format!("t-{}", i % 100)),
                    ("type".to_string(), "event.v1".to_string()),
                ]),
                ..Default::default()
            })
            .collect();
        if let Err(e) = rt.block_on(client.publish(topic, &msgs)) {
            let log = emu.log();
            panic!(
                "publish: {e}\nemulator log tail:\n{}",
                &log[log.len().saturating_sub(3000)..]
            );
        }
    }
    eprintln!(
        "published {n} messages in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("sub.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"name":"{}","topic":"{topic}","subsink":{{"limits":"extended"}},
               "cloudStorageConfig":{{"bucket":"bench","maxDuration":"1s","maxBytes":"104857600",
               "avroConfig":{{"writeMetadata":true}}}}}}"#,
            subs[0]
        ),
    )
    .unwrap();
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_subsink"))
        .env("PUBSUB_EMULATOR_HOST", emu.host())
        .env("SUBSINK_LOG", "info")
        .args(["run", "--source", "pubsub", "--subscription"])
        .arg(&cfg)
        .arg("--bucket-url")
        .arg(format!("file://{}", dir.path().join("bucket").display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut written = 0usize;
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains("acked after durable") {
            if let Some(m) = line.split("messages=").nth(1) {
                written += m.trim().parse::<usize>().unwrap_or(0);
            }
            if written >= n {
                break;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    println!(
        "subsink --source pubsub: {written} msgs written and acked in {secs:.2} s: {:.0} msgs/s",
        written as f64 / secs
    );
    if std::env::var_os("SUBSINK_BENCH_PYTHON").is_some() {
        let out = Command::new(util::venv_bin("python"))
            .env("PUBSUB_EMULATOR_HOST", emu.host())
            .arg(util::root().join("benches/python_subscriber.py"))
            .arg(subs[1])
            .arg(n.to_string())
            .output()
            .unwrap();
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
}
