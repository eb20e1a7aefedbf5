//! The broker sources of `tests/memory.rs` besides Pub/Sub (issue 43, point 3): the same 20 × 9 MiB
//! input published to Kafka (the test binary's nisshi broker) and to NATS JetStream (a
//! `nats-server` of this binary's own, whose `max_payload` takes a 9 MiB message), drained by a
//! worker into Avro files under `--memory-limit`, every message id read back once (fastavro).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::sized::*;
use crate::util::http::metric;
use crate::util::*;

/// The `nats-server` of this test binary: JetStream on, `max_payload` 16 MiB (its default of
/// 1 MiB refuses a 9 MiB message; above 8 MiB it only warns). Started once on a thread that lives
/// as long as the process; the server gets SIGKILL when that thread's process ends.
fn nats_server() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let port = free_port();
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("nats-memory-{port}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let config = dir.join("server.conf");
            std::fs::write(
                &config,
                format!(
                    "listen: 127.0.0.1:{port}\nmax_payload: 16MB\njetstream {{ store_dir: {:?} }}\n",
                    dir.join("js").display().to_string()
                ),
            )
            .unwrap();
            let mut cmd = Command::new(venv_bin("nats-server"));
            cmd.arg("-c")
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("log")).unwrap());
            crate::util::process::die_with_thread(&mut cmd);
            let mut child = cmd.spawn().expect("start nats-server");
            let start = Instant::now();
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "nats-server exited early: {}",
                    dir.join("log").display()
                );
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "nats-server not listening"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            tx.send(format!("nats://127.0.0.1:{port}")).unwrap();
            let _ = child.wait();
        });
        rx.recv().unwrap()
    })
}

/// Publishes the NDJSON `input` to the JetStream stream `stream` (made here, on `stream.>`), each
/// message's data decoded and its `messageId` as `Nats-Msg-Id`: in a Python process of its own
/// (nats-py), so this process never holds a 9 MiB message.
const NATS_PUBLISH: &str = r#"
import asyncio, base64, json, sys
import nats

async def main(url, stream, path):
    nc = await nats.connect(url, max_reconnect_attempts=0, pending_size=64 << 20)
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[stream + ".>"])
    n = 0
    with open(path) as f:
        for line in f:
            m = json.loads(line)
            await js.publish(stream + ".events", base64.b64decode(m["data"]),
                             headers={"Nats-Msg-Id": m["messageId"]}, timeout=60)
            n += 1
    await nc.close()
    print(n)

asyncio.run(main(*sys.argv[1:]))
"#;

/// Which broker a [`broker_run`] drains.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Broker {
    Kafka,
    Nats,
}

/// `input` (of `count` messages) published to `broker` under the name `name` (a topic of one
/// partition, or a stream), then drained by a worker into Avro files (the storage writer of the
/// file runs, [`Writer::Storage`]) with `--memory-limit limit` until `count` are received, then
/// stopped (SIGTERM: the open file is finalized); every message id read back once; its peak RSS.
pub fn broker_run(
    dir: &Path,
    broker: Broker,
    name: &str,
    input: &Path,
    count: usize,
    limit: &str,
) -> Sized {
    let tag = format!("{broker:?}-{name}-{limit}");
    let out_dir = dir.join(format!("out-{tag}"));
    let log_path = dir.join(format!("log-{tag}"));
    let out_path = dir.join(format!("summary-{tag}"));
    let port = free_port();
    let mut cmd = writer_cmd(dir, Writer::Storage, &tag, &out_dir);
    // The ids read back: a Kafka record's is `TOPIC/PARTITION/OFFSET`, a NATS message's its
    // `Nats-Msg-Id` (the input's `messageId`).
    let prefix = match broker {
        Broker::Kafka => {
            let kafka = crate::util::kafka::tansu();
            kafka.create_topic(name, 1);
            let mut publish = storage_run_cmd("unused", "text");
            publish
                .arg("--publish-to")
                .arg(format!("{}/{name}", kafka.url()))
                .args(["--publish-option", "message.max.bytes=16777216"])
                .arg("--source")
                .arg(input)
                .stdout(Stdio::null());
            let mut publisher = crate::util::process::spawn_draining(&mut publish);
            // Bounded: a publish that hangs fails the test with its log instead of hanging it.
            let started = Instant::now();
            while publisher.try_wait().unwrap().is_none() {
                if started.elapsed() > Duration::from_secs(300) {
                    let _ = publisher.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let published = crate::util::process::output(publisher);
            assert!(
                published.status.success(),
                "publishing to Kafka ({}, {:.0?}): {}",
                published.status,
                started.elapsed(),
                String::from_utf8_lossy(&published.stderr)
            );
            cmd.args(["--source", &kafka.url(), "--kafka-topic", name]);
            format!("{name}/0/")
        }
        Broker::Nats => {
            let url = nats_server();
            let n = venv_python(
                ["-c", NATS_PUBLISH, url, name, input.to_str().unwrap()],
                &[],
            );
            assert_eq!(n.trim(), count.to_string(), "published");
            cmd.args([
                "--source",
                url,
                "--nats-stream",
                name,
                "--nats-consumer",
                name,
            ]);
            String::new()
        }
    };
    cmd.env(
        "SUBSINK_LOG",
        std::env::var("SUBSINK_MEMORY_LOG").unwrap_or_else(|_| "info".into()),
    )
    .args(["--memory-limit", limit])
    .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
    .stdin(Stdio::null())
    .stdout(std::fs::File::create(&out_path).unwrap())
    .stderr(std::fs::File::create(&log_path).unwrap());
    let own = own_peak_mib();
    let start = Instant::now();
    // Reaped by `wait_rusage` (wait4), which also gives the peak RSS.
    #[allow(clippy::zombie_processes)]
    let mut child = cmd.spawn().unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_for_port(port, "subsink", &mut child);
    let base = format!("http://127.0.0.1:{port}");
    // Every message received (reported each second); the stop finalizes the open file.
    poll(Duration::from_secs(300), Duration::from_millis(500), || {
        let got = metric(
            &base,
            "subsink_messages_received",
            "subsink_messages_received_total",
            &json!({"subscription": SUB}),
        );
        (got >= Some(count as f64))
            .then_some(())
            .ok_or(format!("received {got:?} of {count}: {}", log()))
    });
    let (summary, peak_kib, seconds) = stop_worker(&child, start, &tag, &log_path, &out_path);
    assert_ids_once(Writer::Storage, &out_dir, &prefix, count);
    let _ = std::fs::remove_dir_all(&out_dir);
    let peak_mib = worker_peak(&tag, &summary, peak_kib, own);
    Sized {
        peak_mib,
        written: summary["messages_written"].as_u64().unwrap(),
        seconds,
    }
}
