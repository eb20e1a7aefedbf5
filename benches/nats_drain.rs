//! NATS JetStream source throughput: publish N messages of 1 KiB (3 headers) to a stream of a real
//! `nats-server -js`, then drain them with subsink — into the discard sink (the pipeline alone)
//! and into a local folder (Avro with metadata) — and with a plain nats-py pull consumer
//! (receive + ack, `benches/nats_pull.py`), in interleaved rounds on the same server and stream.
//! Every round reads the whole stream through a fresh durable consumer; every round is printed.
//! subsink runs with the default batching and flow control (files of up to 5 minutes, no message
//! or byte limit, `MaxAckPending` 10,000): its files are finalized early whenever flow control
//! would hold the consumer back (reason `flow_control`, about 5,000 messages a file).
//!
//! `cargo bench --bench nats_drain` (needs scripts/setup-test-env for nats-server and nats-py);
//! `SUBSINK_BENCH_MESSAGES` sets N (default 100000), `SUBSINK_BENCH_ROUNDS` the rounds (3).

#[path = "../tests/util/mod.rs"]
mod util;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A `nats-server -js` on a free port with its store in `dir`; killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let port = util::free_port();
        let mut child = Command::new(util::venv_bin("nats-server"))
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(child.try_wait().unwrap().is_none(), "nats-server exited");
            assert!(start.elapsed() < Duration::from_secs(30));
            std::thread::sleep(Duration::from_millis(20));
        }
        Server {
            child,
            url: format!("nats://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// subsink drains the stream through consumer `consumer` into `bucket_url`; msgs/s from start to
/// the last "acked after durable". With the default batching the last file stays open for
/// `maxDuration` (5 minutes): once the consumer has delivered every message, a SIGTERM finalizes
/// it (the shutdown writes and acks it; that time counts).
fn subsink(server: &Server, cfg: &Path, consumer: &str, bucket_url: &str, n: usize) -> f64 {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_subsink"))
        .env("SUBSINK_LOG", "subsink=info")
        .args(["run", "--source", &server.url, "--nats-stream", "BENCH"])
        .args(["--nats-consumer", consumer, "--subscription"])
        .arg(cfg)
        .args(["--bucket-url", bucket_url])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    stop_once_delivered(server.url.clone(), consumer.to_string(), child.id());
    let mut acked = 0usize;
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
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
    let _ = child.wait();
    assert_eq!(acked, n, "subsink acked {acked} of {n}");
    n as f64 / secs
}

/// On a thread of its own: SIGTERM the worker `pid` once consumer `consumer` has delivered every
/// message of the stream (polled every 10 ms).
fn stop_once_delivered(url: String, consumer: String, pid: u32) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let js = jetstream::new(async_nats::connect(&url).await.unwrap());
            let stream = js.get_stream("BENCH").await.unwrap();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(600) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                // Absent until the worker creates it.
                if let Ok(info) = stream.consumer_info(&consumer).await {
                    if info.num_pending == 0 {
                        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                        return;
                    }
                }
            }
        });
    });
}

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let n = env_or("SUBSINK_BENCH_MESSAGES", 100_000);
    let rounds = env_or("SUBSINK_BENCH_ROUNDS", 3);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("js"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t = Instant::now();
    rt.block_on(async {
        let js = jetstream::new(async_nats::connect(&server.url).await.unwrap());
        js.create_stream(stream::Config {
            name: "BENCH".into(),
            subjects: vec!["bench.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
        let payload = bytes::Bytes::from(vec![b'p'; 1024]);
        let mut acks = Vec::new();
        for i in 0..n {
            let mut h = async_nats::HeaderMap::new();
            h.insert("source", "bench");
            h.insert("tenant", format!("t-{}", i % 100).as_str());
            h.insert("type", "event.v1");
            acks.push(
                js.publish_with_headers("bench.events", h, payload.clone())
                    .await
                    .unwrap(),
            );
            if acks.len() >= 5000 {
                for a in acks.drain(..) {
                    a.await.unwrap();
                }
            }
        }
        for a in acks {
            a.await.unwrap();
        }
    });
    eprintln!(
        "published {n} messages in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let cfg = dir.path().join("sub.json");
    std::fs::write(
        &cfg,
        r#"{"name":"projects/bench/subscriptions/subsink","topic":"projects/bench/topics/events",
            "ackDeadlineSeconds":60,"subsink":{"limits":"extended"},
            "cloudStorageConfig":{"bucket":"bench","avroConfig":{"writeMetadata":true}}}"#,
    )
    .unwrap();
    let mut results: Vec<(&str, Vec<f64>)> = vec![
        ("subsink -> discard://", vec![]),
        ("subsink -> local folder (Avro)", vec![]),
        ("nats-py pull consumer (receive + ack)", vec![]),
    ];
    for r in 0..rounds {
        let discard = subsink(&server, &cfg, &format!("discard{r}"), "discard://", n);
        println!("round {r}: subsink -> discard://: {discard:.0} msgs/s");
        results[0].1.push(discard);
        let bucket = dir.path().join(format!("bucket{r}"));
        let folder = subsink(
            &server,
            &cfg,
            &format!("folder{r}"),
            &format!("file://{}", bucket.display()),
            n,
        );
        let _ = std::fs::remove_dir_all(&bucket);
        println!("round {r}: subsink -> local folder (Avro): {folder:.0} msgs/s");
        results[1].1.push(folder);
        let out = Command::new(util::venv_bin("python"))
            .arg(util::root().join("benches/nats_pull.py"))
            .args([&server.url, "BENCH", &format!("python{r}"), &n.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "nats_pull.py: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        print!("round {r}: {text}");
        let rate: f64 = text
            .rsplit(": ")
            .next()
            .and_then(|s| s.split_whitespace().next())
            .map(|s| s.replace(',', ""))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0);
        results[2].1.push(rate);
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
