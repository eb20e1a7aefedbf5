//! Pub/Sub source throughput on the emulator, beside the official Python subscriber client.
//!
//! Contenders, each on a backlog of its own of the same `SUBSINK_BENCH_MESSAGES` messages (default
//! 100,000; 1 KiB of data, 3 attributes):
//! - `subsink`: `subsink run --source pubsub` into a local folder (Avro with metadata, fsync on),
//!   acking each file's messages once it is durable — subsink's real job, with its defaults: 2
//!   StreamingPull streams, files of up to 5 minutes with no message or byte limit, finalized
//!   early whenever flow control would hold the source back (reason `flow_control`);
//! - `1-stream`: the same with `--pubsub-streams 1`, stream for stream against the Python client
//!   (the emulator paces every stream: one response of at most 100 messages every 50 ms);
//! - `discard`: the same pipeline into `discard://` (no store): the source, batcher and acks alone;
//! - `python`: google-cloud-pubsub's `SubscriberClient` (`benches/python_subscriber.py`), receive
//!   + ack, nothing written (`SUBSINK_BENCH_PYTHON=0` leaves it out; needs scripts/setup-test-env).
//!
//! Same time boundaries for all: from the first message received to the moment the ack of the
//! last one is handed to the transport (subsink logs "acked after durable" only then; the Python
//! script stops its clock when the Acknowledge call carrying the last id starts). Start-up is not
//! timed for anyone. Same flow control: 10,000 messages, 100 MiB. subsink's last file would stay
//! open for 5 minutes: once it has received every message it gets a SIGTERM, and the shutdown
//! writes and acks that file (within the time measured).
//!
//! Each contender drains a fresh topic and subscription, published just before its turn, so the
//! emulator holds one backlog at a time (with every backlog published up front its heap holds them
//! all and it slows down for everyone). Rounds are interleaved (`SUBSINK_BENCH_ROUNDS`, default 3;
//! the order rotates each round); every round is printed, then the medians and python's time over
//! each subsink figure's, per round.
//!
//! `cargo bench --bench pubsub_drain` (`SUBSINK_BENCH_ONLY=subsink,python` runs only those).

#[path = "../tests/util/mod.rs"]
mod util;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use subsink::message::Message;
use subsink::pubsub::{PubsubClient, SubscriptionSpec};

const CONTENDERS: [&str; 4] = ["subsink", "1-stream", "discard", "python"];

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let env_num = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = env_num("SUBSINK_BENCH_MESSAGES", 100_000);
    let rounds = env_num("SUBSINK_BENCH_ROUNDS", 3);
    let python = std::env::var("SUBSINK_BENCH_PYTHON").map_or(true, |v| v != "0");
    // One backlog of 100k × 1 KiB at a time, plus what deleted subscriptions leave to collect.
    if std::env::var_os("SUBSINK_EMULATOR_JAVA_OPTS").is_none() {
        std::env::set_var("SUBSINK_EMULATOR_JAVA_OPTS", "-Xmx3g -XX:+UseParallelGC");
    }
    let emu = util::emulator::Emulator::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt
        .block_on(PubsubClient::connect_emulator(&emu.host()))
        .unwrap();
    // SUBSINK_BENCH_ONLY=subsink,python runs only those.
    let only = std::env::var("SUBSINK_BENCH_ONLY").ok();
    let contenders: Vec<&str> = CONTENDERS
        .into_iter()
        .filter(|c| python || *c != "python")
        .filter(|c| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|x| x == *c))
        })
        .collect();
    println!(
        "{n} messages of 1 KiB per contender and round, {rounds} rounds; load before: {}",
        load()
    );

    let mut secs: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 1..=rounds {
        // Rotate who goes first, so no one always meets the emulator in the same state.
        let mut order = contenders.clone();
        let turn = (round - 1) % order.len();
        order.rotate_left(turn);
        for who in order {
            let topic = format!("projects/bench/topics/drain-{who}-{round}");
            let sub = format!("projects/bench/subscriptions/drain-{who}-{round}");
            rt.block_on(async {
                client.create_topic(&topic).await.unwrap();
                let mut spec = SubscriptionSpec::new(&sub, &topic);
                spec.ack_deadline_seconds = 60;
                client.create_subscription(&spec).await.unwrap();
            });
            let published = Instant::now();
            publish(&rt, &client, &emu, &topic, n);
            let published = published.elapsed().as_secs_f64();
            let (got, took, cpu) = match who {
                "subsink" => drain_subsink(&emu.host(), &topic, &sub, n, false, &[]),
                "1-stream" => drain_subsink(
                    &emu.host(),
                    &topic,
                    &sub,
                    n,
                    false,
                    &["--pubsub-streams", "1"],
                ),
                "discard" => drain_subsink(&emu.host(), &topic, &sub, n, true, &[]),
                _ => drain_python(&emu.host(), &sub, n),
            };
            assert!(got >= n, "round {round} {who}: {got} of {n} acked");
            println!(
                "round {round} {who:>8}: {n} msgs in {took:.2} s: {:.0} msgs/s (process CPU {cpu:.1} s; published in {published:.1} s; load {})",
                n as f64 / took,
                load()
            );
            secs.entry(who).or_default().push(took);
            rt.block_on(async {
                client.delete_subscription(&sub).await.unwrap();
                client.delete_topic(&topic).await.unwrap();
            });
        }
    }
    for (who, v) in &secs {
        let m = median(v.clone());
        println!(
            "median of {} rounds {who:>8}: {m:.2} s, {:.0} msgs/s",
            v.len(),
            n as f64 / m
        );
    }
    if let Some(p) = secs.get("python") {
        for who in ["subsink", "1-stream", "discard"] {
            let Some(s) = secs.get(who) else { continue };
            let ratios: Vec<f64> = s.iter().zip(p).map(|(s, p)| p / s).collect();
            println!(
                "{who} over python (python's time / {who}'s), per round: [{}], median {:.2}",
                ratios
                    .iter()
                    .map(|r| format!("{r:.2}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                median(ratios.clone())
            );
        }
    }
    println!("load after: {}", load());
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The 1-, 5- and 15-minute load averages.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Publish `n` messages of 1 KiB with 3 attributes to `topic`, 1000 per request.
fn publish(
    rt: &tokio::runtime::Runtime,
    client: &PubsubClient,
    emu: &util::emulator::Emulator,
    topic: &str,
    n: usize,
) {
    let payload = bytes::Bytes::from(vec![b'p'; 1024]);
    for start in (0..n).step_by(1_000) {
        let msgs: Vec<Message> = (start..n.min(start + 1_000))
            .map(|i| Message {
                data: payload.clone(),
                attributes: [
                    ("source".to_string(), "bench".to_string()),
                    ("tenant".to_string(), format!("t-{}", i % 100)),
                    ("type".to_string(), "event.v1".to_string()),
                ]
                .into(),
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
}

/// `subsink run --source pubsub` on `sub`, into a local folder (Avro with metadata) or
/// `discard://`, until `n` messages are acked: (messages acked, seconds from the first message
/// received — the first StreamingPull response — to the last "acked after durable" line, CPU
/// seconds of the process).
fn drain_subsink(
    host: &str,
    topic: &str,
    sub: &str,
    n: usize,
    discard: bool,
    extra: &[&str],
) -> (usize, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("sub.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"name":"{sub}","topic":"{topic}","subsink":{{"limits":"extended"}},
               "cloudStorageConfig":{{"bucket":"bench","avroConfig":{{"writeMetadata":true}}}}}}"#
        ),
    )
    .unwrap();
    let url = if discard {
        "discard://".to_string()
    } else {
        format!("file://{}", dir.path().join("bucket").display())
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_subsink"))
        .env("PUBSUB_EMULATOR_HOST", host)
        // The stream's first answer comes with the first response: the start of the clock. Each
        // response is logged (trace) with its messages: the SIGTERM once all are in.
        .env("SUBSINK_LOG", "info,subsink::source::pubsub=trace")
        .args(["run", "--source", "pubsub", "--subscription"])
        .arg(&cfg)
        .arg("--bucket-url")
        .arg(url)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut acked = 0usize;
    let mut received = 0usize;
    let mut first: Option<Instant> = None;
    let mut last = None;
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if first.is_none() && line.contains("StreamingPull stream answered") {
            first = Some(Instant::now());
        }
        if received < n && line.contains("StreamingPull response") {
            if let Some(m) = line.split("messages=").nth(1) {
                let m = m.split_whitespace().next().unwrap_or("");
                received += m.parse::<usize>().unwrap_or(0);
            }
            if received >= n {
                // Every message is in: the shutdown finalizes the last, still open, file.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            }
        }
        if line.contains("acked after durable") {
            if let Some(m) = line.split("messages=").nth(1) {
                let m = m.split_whitespace().next().unwrap_or("");
                acked += m.parse::<usize>().unwrap_or(0);
            }
            if acked >= n {
                last = Some(Instant::now());
                break;
            }
        }
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let cpu = reap(child);
    let secs = match (first, last) {
        (Some(f), Some(l)) => (l - f).as_secs_f64(),
        _ => f64::NAN,
    };
    if !discard {
        // Not timed: the folder holds every message once, as fastavro reads it.
        let files = util::objects_below(&dir.path().join("bucket"));
        let ids: std::collections::HashSet<String> = util::message_ids(&util::avro_records(&files))
            .into_iter()
            .collect();
        assert_eq!(ids.len(), n, "{sub}: distinct messages in the folder");
    }
    (acked, secs, cpu)
}

/// Wait for `child` with `wait4`: its own CPU seconds (user + system), start-up and shutdown
/// included.
// The child is reaped by `wait4`, not `Child::wait`.
#[allow(clippy::zombie_processes)]
fn reap(child: std::process::Child) -> f64 {
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The official Python subscriber client on `sub` (`benches/python_subscriber.py`):
/// (messages acked, seconds from its first message to the last ack handed to the transport, CPU
/// seconds of the process).
fn drain_python(host: &str, sub: &str, n: usize) -> (usize, f64, f64) {
    let mut child = Command::new(util::venv_bin("python"))
        .env("PUBSUB_EMULATOR_HOST", host)
        .arg(util::root().join("benches/python_subscriber.py"))
        .arg(sub)
        .arg(n.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut text).unwrap();
    let cpu = reap(child);
    // "python subscriber: R received, A acked in S s"
    let words: Vec<&str> = text.split_whitespace().collect();
    let acked = words.get(4).and_then(|w| w.parse().ok()).unwrap_or(0);
    let secs = words
        .get(7)
        .and_then(|w| w.parse().ok())
        .unwrap_or(f64::NAN);
    (acked, secs, cpu)
}
