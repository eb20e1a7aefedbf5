//! Ready means reachable, not busy: `/readyz` of the real binary with subscriptions that deliver
//! nothing (Pub/Sub on the emulator, NATS JetStream on `nats-server`, `subsink serve`), with a
//! Pub/Sub nobody answers for, and with a NATS server that goes away (docs/operating.md, "Health
//! and readiness").

mod util;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use util::pubsub::{archive_config, file_url, sub, topic, PubsubEnv};
use util::servers::{http_status, Guarded};
use util::*;

/// Poll `/readyz` of the worker on `port` every 50 ms until it answers 200; how long that took
/// from `since`. Panics past `limit` (or when the worker exits).
fn ready_after(child: &mut Child, port: u16, since: Instant, limit: Duration) -> Duration {
    loop {
        if http_status(port, "GET", "/readyz", &[], b"") == 200 {
            return since.elapsed();
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the worker exited ({status}) before it was ready");
        }
        assert!(
            since.elapsed() < limit,
            "/readyz not 200 within {limit:?}: {:?}",
            util::http::status(&format!("http://127.0.0.1:{port}"), "/readyz")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `subsink run --source pubsub` on the emulator at `host`, writing to the local `bucket`, with
/// its telemetry on `port`.
fn pubsub_worker(host: &str, config: &Path, bucket: &Path, port: u16) -> Child {
    spawn_draining(
        subsink()
            .env("PUBSUB_EMULATOR_HOST", host)
            .args(["run", "--source", "pubsub", "--subscription"])
            .arg(config)
            .args(["--bucket-url", &file_url(bucket)])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::piped()),
    )
}

/// An idle subscription (nothing published, ever) is ready within seconds of the start: the
/// emulator answers a StreamingPull only with its first message, so the stream alone never said
/// so; Pub/Sub answering for the subscription does. Fails on the build before it: 503 "source not
/// connected" for as long as nothing is published.
#[test]
fn an_idle_pubsub_subscription_is_ready_within_seconds() {
    let env = PubsubEnv::start();
    env.rt
        .block_on(env.client.create_topic(&topic("events")))
        .unwrap();
    env.subscribe(&sub("archive"), &topic("events"));
    let dir = tempfile::tempdir().unwrap();
    let cfg = archive_config(dir.path(), json!({}), json!({}));
    let port = free_port();
    let start = Instant::now();
    let mut child = pubsub_worker(&env.emu.host(), &cfg, &dir.path().join("bucket"), port);
    let took = ready_after(&mut child, port, start, Duration::from_secs(10));
    eprintln!("idle Pub/Sub subscription ready {took:?} after the start");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Still ready a while later (the probe keeps answering), with nothing delivered.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(http_status(port, "GET", "/readyz", &[], b""), 200);
    let (s, _) = sigterm_ok(child);
    assert_eq!(summary(&s)["messages_read"], 0);
}

/// A Pub/Sub nobody answers for (no server on the port) is never ready, while the worker stays
/// alive; the reason is the source.
#[test]
fn an_unreachable_pubsub_stays_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = archive_config(dir.path(), json!({}), json!({}));
    let port = free_port();
    // Held, so no server another test starts can take it.
    let nobody_port = free_port();
    let _hold = PortHold::new(&[nobody_port]);
    let nobody = format!("127.0.0.1:{nobody_port}");
    let mut child = pubsub_worker(&nobody, &cfg, &dir.path().join("bucket"), port);
    wait_for_port(port, "subsink", &mut child);
    let base = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(8) {
        assert_eq!(http_status(port, "GET", "/readyz", &[], b""), 503);
        assert_eq!(http_status(port, "GET", "/healthz", &[], b""), 200);
        std::thread::sleep(Duration::from_millis(400));
    }
    let (_, body) = util::http::status(&base, "/readyz");
    assert!(
        body.contains("projects/subsink-e2e/subscriptions/archive: source not connected"),
        "{body}"
    );
    kill_9(child);
}

/// Creates the topic `events` of project `subsink-e2e` and two Cloud Storage subscriptions on it.
const CREATE_EXPORTS: &str = r#"
from google.cloud import pubsub_v1
from google.pubsub_v1.types import CloudStorageConfig
pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
topic = pub.topic_path("subsink-e2e", "events")
pub.create_topic(name=topic)
for name in ["idle-a", "idle-b"]:
    sub.create_subscription(request={"name": sub.subscription_path("subsink-e2e", name),
        "topic": topic, "cloud_storage_config": CloudStorageConfig(bucket=name)})
"#;

/// `subsink serve` on a project whose export subscriptions are idle: ready within seconds, every
/// pipeline counted. Fails on the build before it (503 for each pipeline's source).
#[test]
fn serve_with_idle_export_subscriptions_is_ready_within_seconds() {
    let env = PubsubEnv::start();
    let dir = tempfile::tempdir().unwrap();
    // Two export subscriptions, made with Google's own client.
    venv_python(
        ["-c", CREATE_EXPORTS],
        &[("PUBSUB_EMULATOR_HOST", env.emu.host())],
    );
    let port = free_port();
    let start = Instant::now();
    let mut child = spawn_draining(
        subsink()
            .env("PUBSUB_EMULATOR_HOST", env.emu.host())
            .env("SUBSINK_LOG", "info")
            .args([
                "serve",
                "--project",
                "subsink-e2e",
                "--discover-interval",
                "1s",
            ])
            .arg("--bucket-url-template")
            .arg(format!("file://{}/{{bucket}}", dir.path().display()))
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::piped()),
    );
    let took = ready_after(&mut child, port, start, Duration::from_secs(15));
    eprintln!("serve with two idle subscriptions ready {took:?} after the start");
    assert!(took < Duration::from_secs(6), "{took:?}");
    // Both pipelines run (their series are on /metrics), and with them it is still ready.
    poll(Duration::from_secs(10), Duration::from_millis(200), || {
        let metrics = util::http::get(&[format!("http://127.0.0.1:{port}/metrics")]).remove(0);
        let page = metrics["body"].as_str().unwrap().to_string();
        (page.contains("subscriptions/idle-a") && page.contains("subscriptions/idle-b"))
            .then_some(())
            .ok_or(page)
    });
    let (code, body) = util::http::status(&format!("http://127.0.0.1:{port}"), "/readyz");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"problems\":[]"), "{body}");
    let (_, err) = sigterm_ok(child);
    assert!(err.contains("stopping export"), "{err}");
}

/// A `nats-server -js` of this test alone (so it can be stopped), on a free port.
struct Nats {
    server: Guarded,
    url: String,
}

impl Nats {
    /// Started on a free port; a server that exits before it listens (another process took the
    /// port between [`free_port`] and its bind, which happens with many servers starting beside
    /// it) is started again on another port, up to three times. Listening means its port answers
    /// while it is still running, so a port answered by someone else is not taken for it.
    fn start(store: &Path) -> Nats {
        for _ in 0..3 {
            let port = free_port();
            let mut server = Guarded::spawn(
                Command::new(venv_bin("nats-server"))
                    .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
                    .arg(store)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
                "nats-server",
            );
            let start = Instant::now();
            loop {
                if let Some(status) = server.try_wait() {
                    eprintln!("nats-server on port {port} exited ({status}); another port");
                    break;
                }
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    std::thread::sleep(Duration::from_millis(100));
                    if server.try_wait().is_none() {
                        return Nats {
                            server,
                            url: format!("nats://127.0.0.1:{port}"),
                        };
                    }
                    continue;
                }
                assert!(start.elapsed() < Duration::from_secs(30), "nats-server");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("nats-server exited before listening on three free ports");
    }
}

/// An idle NATS consumer (an empty stream) is ready within seconds; the NATS server gone, the
/// worker is not ready (it stays alive, reconnecting). Fails on the build before it at the second
/// half: a NATS source counted as connected whatever happened to its server.
#[test]
fn an_idle_nats_consumer_is_ready_and_a_lost_server_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut nats = Nats::start(&dir.path().join("js"));
    let rt = rt();
    rt.block_on(async {
        let client = async_nats::connect(&nats.url).await.unwrap();
        async_nats::jetstream::new(client)
            .create_stream(async_nats::jetstream::stream::Config {
                name: "IDLE".into(),
                subjects: vec!["IDLE.>".into()],
                ..Default::default()
            })
            .await
            .unwrap();
    });
    let cfg = archive_config(dir.path(), json!({}), json!({}));
    let port = free_port();
    let start = Instant::now();
    let mut child = spawn_draining(
        subsink()
            .args(["run", "--source", &nats.url, "--nats-stream", "IDLE"])
            .args(["--nats-consumer", "archive", "--subscription"])
            .arg(&cfg)
            .args(["--bucket-url", &file_url(&dir.path().join("bucket"))])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::piped()),
    );
    let took = ready_after(&mut child, port, start, Duration::from_secs(10));
    eprintln!("idle NATS consumer ready {took:?} after the start");
    assert!(took < Duration::from_secs(4), "{took:?}");

    nats.server.kill();
    let gone = Instant::now();
    poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || match http_status(port, "GET", "/readyz", &[], b"") {
            503 => Ok(()),
            c => Err(format!(
                "/readyz {c} {:?} after the NATS server died",
                gone.elapsed()
            )),
        },
    );
    eprintln!("not ready {:?} after the NATS server died", gone.elapsed());
    let (_, body) = util::http::status(&format!("http://127.0.0.1:{port}"), "/readyz");
    assert!(body.contains("source not connected"), "{body}");
    assert_eq!(http_status(port, "GET", "/healthz", &[], b""), 200);
    kill_9(child);
}
