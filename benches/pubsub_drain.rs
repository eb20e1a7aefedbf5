//! Pub/Sub source throughput: publish ~200k messages of ~1 KiB (3 attributes) to the emulator and
//! drain them through the storage writer (Avro with metadata, local folder), printing msgs/s.
//! With `SUBSINK_BENCH_PYTHON=1` the official Python subscriber client (receive + ack only) drains
//! a second subscription of the same topic, for comparison (needs scripts/setup-test-env).
//!
//! Every contender drains its own subscription of the same backlog, in interleaved rounds
//! (`SUBSINK_BENCH_ROUNDS`, default 3; who goes first alternates), and every round is printed,
//! then the medians and python's time over subsink's per round.
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
    // Two subscriptions per round of 200k × 1 KiB each live in the emulator's heap.
    if std::env::var_os("SUBSINK_EMULATOR_JAVA_OPTS").is_none() {
        std::env::set_var("SUBSINK_EMULATOR_JAVA_OPTS", "-Xmx6g -XX:+UseParallelGC");
    }
    let emu = util::emulator::Emulator::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt
        .block_on(PubsubClient::connect_emulator(&emu.host()))
        .unwrap();
    let topic = "projects/bench/topics/events";
    let rounds: usize = std::env::var("SUBSINK_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let python = std::env::var_os("SUBSINK_BENCH_PYTHON").is_some();
    // One subscription per contender and round, all made before publishing, so each holds every
    // message: the contenders drain the same backlog, turn by turn.
    let subs: Vec<(usize, &str, String)> = (1..=rounds)
        .flat_map(|r| {
            let mut v = vec![(
                r,
                "subsink",
                format!("projects/bench/subscriptions/subsink-{r}"),
            )];
            if python {
                v.push((
                    r,
                    "python",
                    format!("projects/bench/subscriptions/python-{r}"),
                ));
            }
            // Alternate who goes first, so neither always meets the emulator fresh.
            if r % 2 == 0 {
                v.reverse();
            }
            v
        })
        .collect();
    rt.block_on(async {
        client.create_topic(topic).await.unwrap();
        for (_, _, s) in &subs {
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
        "published {n} messages to {} subscriptions in {:.1} s",
        subs.len(),
        t.elapsed().as_secs_f64()
    );

    let mut secs: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (round, who, sub) in &subs {
        let (got, took) = match *who {
            "subsink" => drain_subsink(&emu.host(), topic, sub, n),
            _ => drain_python(&emu.host(), sub, n),
        };
        assert_eq!(got, n, "round {round} {who}: every message drained");
        println!(
            "round {round} {who:>7}: {got} msgs in {took:.2} s: {:.0} msgs/s",
            got as f64 / took
        );
        secs.entry(who).or_default().push(took);
    }
    for (who, v) in &secs {
        let m = median(v.clone());
        println!(
            "median of {} rounds {who:>7}: {m:.2} s, {:.0} msgs/s",
            v.len(),
            n as f64 / m
        );
    }
    if let (Some(s), Some(p)) = (secs.get("subsink"), secs.get("python")) {
        let ratios: Vec<f64> = s.iter().zip(p).map(|(s, p)| p / s).collect();
        println!(
            "subsink over python (python's time / subsink's), per round: [{}], median {:.2}",
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(" "),
            median(ratios.clone())
        );
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// `subsink run --source pubsub` on `sub` into a local folder (Avro with metadata), until `n`
/// messages are written and acked: (messages, seconds since the process started).
fn drain_subsink(host: &str, topic: &str, sub: &str, n: usize) -> (usize, f64) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("sub.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"name":"{sub}","topic":"{topic}","subsink":{{"limits":"extended"}},
               "cloudStorageConfig":{{"bucket":"bench","maxDuration":"1s","maxBytes":"104857600",
               "avroConfig":{{"writeMetadata":true}}}}}}"#
        ),
    )
    .unwrap();
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_subsink"))
        .env("PUBSUB_EMULATOR_HOST", host)
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
    (written, secs)
}

/// The official Python subscriber client on `sub` (receive + ack, `benches/python_subscriber.py`,
/// timed from its subscribe call): (messages, seconds).
fn drain_python(host: &str, sub: &str, n: usize) -> (usize, f64) {
    let out = Command::new(util::venv_bin("python"))
        .env("PUBSUB_EMULATOR_HOST", host)
        .arg(util::root().join("benches/python_subscriber.py"))
        .arg(sub)
        .arg(n.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    // "python subscriber: N msgs in S s: …"
    let words: Vec<&str> = text.split_whitespace().collect();
    let got = words.get(2).and_then(|w| w.parse().ok()).unwrap_or(0);
    let secs = words
        .get(5)
        .and_then(|w| w.parse().ok())
        .unwrap_or(f64::NAN);
    (got, secs)
}
