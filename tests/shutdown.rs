//! SIGTERM bounded: from the signal to the exit of the real binary takes the shutdown grace plus
//! at most a few seconds, whatever uploads, commits or retries are in flight — a store that hangs,
//! one that answers 500s (the upload's own retries), one that is down, a multipart upload that
//! hangs, a Delta commit that hangs — and what was not made durable is reported: a file source
//! exits 1 naming it, its checkpoint not past it; Pub/Sub and NATS get it back. Last, the
//! watchdog: a run stuck in a system call no cancellation reaches is ended at grace + 10 s
//! (docs/operating.md, "Shutdown").

mod util;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use util::proxy::S3Proxy;
use util::pubsub::{archive_config, sub, topic, PubsubEnv};
use util::servers::http_status;
use util::*;

/// `--shutdown-grace` of these tests.
const GRACE: Duration = Duration::from_secs(3);
/// What the tests allow past the grace: the code's own bound on closing,
/// [`subsink::shutdown::CLOSE_WITHIN`] (docs/operating.md, Shutdown), taken from the code so the
/// tests follow it; measured runs take 0.0–0.3 s.
const CLOSE: Duration = subsink::shutdown::CLOSE_WITHIN;
/// When the watchdog ends a stuck run: [`subsink::shutdown::WATCHDOG_MARGIN`] after the grace.
const WATCHDOG: Duration = subsink::shutdown::WATCHDOG_MARGIN;

/// SIGTERM `child`, then wait for it to exit (at most 60 s, then SIGKILL and fail): its output
/// and how long it took from the signal.
fn sigterm_and_time(child: Child, port: Option<u16>) -> (Output, Duration) {
    let mut child = child;
    signal(&child, libc::SIGTERM);
    let t0 = Instant::now();
    let mut saw_not_ready = port.is_none();
    loop {
        if let Some(p) = port {
            if !saw_not_ready && http_status(p, "GET", "/readyz", &[], b"") == 503 {
                saw_not_ready = true;
            }
        }
        if child.try_wait().unwrap().is_some() {
            let took = t0.elapsed();
            assert!(saw_not_ready, "/readyz never answered 503 during the drain");
            return (output(child), took);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let err = kill_9(child);
            panic!("still running 60 s after SIGTERM (grace {GRACE:?}):\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The exit came within the grace plus [`CLOSE`], and not before the grace (the store might
/// have come back).
fn assert_bounded(took: Duration, what: &str) {
    eprintln!("{what}: SIGTERM → exit {took:?} (grace {GRACE:?})");
    assert!(
        took >= GRACE,
        "{what}: exited {took:?} after SIGTERM, before the grace"
    );
    assert!(
        took <= GRACE + CLOSE,
        "{what}: exited {took:?} after SIGTERM, grace {GRACE:?}"
    );
}

/// Wait until the S3 proxy has seen a write (held, refused or failed).
fn wait_for_a_write(proxy: &S3Proxy) {
    poll(Duration::from_secs(30), Duration::from_millis(50), || {
        (!proxy.writes().is_empty())
            .then_some(())
            .ok_or("no write reached the store".to_string())
    });
}

/// `subsink run` of the storage subscription reading `dir/in.ndjson`, 5 messages a file, one
/// upload at a time, a checkpoint, the grace of these tests, writing to `s3://archive` with `env`.
fn file_run(dir: &Path, env: &[(&'static str, String)], port: u16, extra: &[&str]) -> Child {
    spawn_draining(
        storage_run_cmd("archive", "text")
            .args(["--cloud-storage-max-messages", "5", "--source"])
            .arg(dir.join("in.ndjson"))
            .args([
                "--bucket-url",
                "s3://archive",
                "--max-concurrent-uploads",
                "1",
            ])
            .arg("--checkpoint")
            .arg(dir.join("cp.json"))
            .args(["--shutdown-grace", "3s"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .args(extra)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::piped()),
    )
}

/// Message `i`: id 500000 + i, `len` bytes of data.
fn message(i: usize, len: usize) -> Message {
    Message {
        message_id: format!("{}", 500_000 + i),
        publish_time_micros: 1_700_000_000_000_000 + i as i64,
        ..numbered_message(i, len)
    }
}

/// `dir/in.ndjson` with messages `0..n` of `len` bytes.
fn input(dir: &Path, n: usize, len: usize) {
    let mut f = std::fs::File::create(dir.join("in.ndjson")).unwrap();
    for i in 0..n {
        writeln!(f, "{}", message(i, len).to_json_line()).unwrap();
    }
}

/// A file source whose two files cannot be made durable (`rule` on the store): SIGTERM ends the
/// run within the grace, exit 1, both files named as not done, the checkpoint at 0.
fn file_source_gives_up(rule: Option<Value>, what: &str) {
    let s3 = S3Server::start();
    s3.create_bucket("archive");
    let dir = tempfile::tempdir().unwrap();
    let proxy = S3Proxy::start(&s3, dir.path());
    // No rule: the store is down (nothing listens where the worker looks for it; the port is
    // held, so no server another test starts can take it).
    let down = free_port();
    let _hold = PortHold::new(&[down]);
    let env = match &rule {
        Some(r) => {
            proxy.set(r.clone());
            proxy.env()
        }
        None => S3Api::on_port(down).env(),
    };
    // Two files: the first holds the only upload slot, the second waits for it.
    input(dir.path(), 10, 100);
    let port = free_port();
    let mut child = file_run(dir.path(), &env, port, &[]);
    wait_for_port(port, "subsink", &mut child);
    if rule.is_some() {
        wait_for_a_write(&proxy);
    } else {
        std::thread::sleep(Duration::from_secs(2));
    }
    let (out, took) = sigterm_and_time(child, Some(port));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_bounded(took, what);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    let s = summary(&out);
    assert_eq!(s["messages_written"], 0, "{what}");
    assert_eq!(
        s["failed_objects"].as_array().unwrap().len(),
        2,
        "{what}: {s}"
    );
    assert!(
        err.contains("given up at the end of the shutdown grace"),
        "{what}: {err}"
    );
    assert!(err.contains("ids 500000..500004"), "{what}: {err}");
    assert!(err.contains("ids 500005..500009"), "{what}: {err}");
    let cp: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("cp.json")).unwrap())
            .unwrap();
    assert_eq!(cp["offset"], 0, "{what}: settled past what is not durable");
    assert!(s3.list("archive").is_empty(), "{what}");
}

/// The store holds every write forever. Fails on the build before it: the second file waits for
/// the only upload slot, so SIGTERM is not even seen until the first upload gives up.
#[test]
fn a_store_that_hangs_is_given_up_at_the_end_of_the_grace() {
    file_source_gives_up(Some(json!({"mode": "hang"})), "store hangs");
}

/// The store answers every write 500: object_store's retries, then subsink's own (for
/// `--upload-retry-for`, 5 min) run when SIGTERM comes.
#[test]
fn a_store_answering_500s_is_given_up_at_the_end_of_the_grace() {
    file_source_gives_up(Some(json!({"mode": "error"})), "store answers 500");
}

/// Nothing listens where the store should be: the upload retries connecting.
#[test]
fn a_store_that_is_down_is_given_up_at_the_end_of_the_grace() {
    file_source_gives_up(None, "store down");
}

/// A file large enough to stream as a multipart upload, whose upload never starts (the store
/// holds the request): the pipeline waits on it while pushing messages, and SIGTERM still ends
/// the run within the grace. Fails on the build before it (the batch was not bounded).
#[test]
fn a_hanging_multipart_upload_is_given_up_at_the_end_of_the_grace() {
    let s3 = S3Server::start();
    s3.create_bucket("archive");
    let dir = tempfile::tempdir().unwrap();
    let proxy = S3Proxy::start(&s3, dir.path());
    proxy.set(json!({"mode": "hang"}));
    // 100 messages of 1 KiB pass the 64 KiB threshold: the multipart upload starts (and hangs).
    input(dir.path(), 100, 1024);
    let port = free_port();
    let mut child = spawn_draining(
        storage_run_cmd("archive", "text")
            .args(["--cloud-storage-max-messages", "1000", "--source"])
            .arg(dir.path().join("in.ndjson"))
            .args(["--bucket-url", "s3://archive"])
            .args(["--multipart-threshold", "64KiB", "--part-size", "5MiB"])
            .arg("--checkpoint")
            .arg(dir.path().join("cp.json"))
            .args(["--shutdown-grace", "3s"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .envs(proxy.env())
            .stdout(Stdio::piped()),
    );
    wait_for_port(port, "subsink", &mut child);
    poll(Duration::from_secs(30), Duration::from_millis(50), || {
        proxy
            .writes()
            .iter()
            .any(|w| w.kind == "create")
            .then_some(())
            .ok_or("no multipart upload started".to_string())
    });
    let (out, took) = sigterm_and_time(child, Some(port));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_bounded(took, "multipart upload hangs");
    assert_eq!(out.status.code(), Some(1), "{err}");
    let s = summary(&out);
    assert_eq!(s["messages_written"], 0);
    // The batch stopped where the pipeline waited (the first part, at 64 KiB): the file holds
    // the messages pushed so far; the rest were never taken.
    assert_eq!(s["failed_objects"].as_array().unwrap().len(), 1, "{s}");
    assert!(
        err.contains("given up at the end of the shutdown grace"),
        "{err}"
    );
    assert!(err.contains("lines 1..="), "{err}");
    let cp: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("cp.json")).unwrap())
            .unwrap();
    assert_eq!(cp["offset"], 0);
}

/// A Delta table on S3 whose commit of version 1 never gets an answer (the data file is
/// written): given up at the end of the grace, exit 1, the checkpoint at 0, the table still at
/// version 0.
#[test]
fn a_hanging_delta_commit_is_given_up_at_the_end_of_the_grace() {
    let s3 = S3Server::start();
    s3.create_bucket("lake");
    let dir = tempfile::tempdir().unwrap();
    let proxy = S3Proxy::start(&s3, dir.path());
    proxy.set(json!({"mode": "hang", "key": "_delta_log/00000000000000000001"}));
    let sub_cfg = dir.path().join("sub.json");
    std::fs::write(
        &sub_cfg,
        json!({
            "name": "projects/proj/subscriptions/raw",
            "topic": "projects/proj/topics/events",
            "bigqueryConfig": {"table": "proj.ds.raw", "writeMetadata": true},
            "subsink": {"table": {"maxMessages": "5"}},
        })
        .to_string(),
    )
    .unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(&schema, r#"[{"name": "data", "type": "BYTES"}]"#).unwrap();
    input(dir.path(), 5, 100);
    let port = free_port();
    let mut child = spawn_draining(
        subsink()
            .args(["run", "--subscription"])
            .arg(&sub_cfg)
            .arg("--source")
            .arg(dir.path().join("in.ndjson"))
            .args(["--table-url", "s3://lake/raw/events"])
            .arg("--table-schema")
            .arg(&schema)
            .arg("--checkpoint")
            .arg(dir.path().join("cp.json"))
            .args(["--shutdown-grace", "3s"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .envs(proxy.env())
            .stdout(Stdio::piped()),
    );
    wait_for_port(port, "subsink", &mut child);
    poll(Duration::from_secs(30), Duration::from_millis(50), || {
        proxy
            .writes()
            .iter()
            .any(|w| w.key.contains("00000000000000000001") && w.status.is_none())
            .then_some(())
            .ok_or(format!("no commit held: {:?}", proxy.writes()))
    });
    let (out, took) = sigterm_and_time(child, Some(port));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_bounded(took, "Delta commit hangs");
    assert_eq!(out.status.code(), Some(1), "{err}");
    let s = summary(&out);
    assert_eq!(s["messages_written"], 0, "{s}");
    assert_eq!(s["failed_objects"].as_array().unwrap().len(), 1, "{s}");
    let cp: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("cp.json")).unwrap())
            .unwrap();
    assert_eq!(cp["offset"], 0);
    let log: Vec<String> = s3
        .list("lake")
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k.contains("_delta_log/") && k.ends_with(".json"))
        .collect();
    assert_eq!(log, ["raw/events/_delta_log/00000000000000000000.json"]);
}

/// Pub/Sub: a file whose upload hangs at SIGTERM is given up at the end of the grace and its
/// messages handed back (nacked): another reader gets every one of them at once, not after their
/// ack deadline. The worker exits 0 (Pub/Sub keeps what it got back).
#[test]
fn pubsub_messages_of_a_file_given_up_are_nacked_and_redelivered() {
    let env = PubsubEnv::start();
    env.rt
        .block_on(env.client.create_topic(&topic("events")))
        .unwrap();
    let mut spec = subsink::pubsub::SubscriptionSpec::new(sub("archive"), topic("events"));
    spec.ack_deadline_seconds = 60;
    env.rt
        .block_on(env.client.create_subscription(&spec))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    s3.create_bucket("bkt");
    let proxy = S3Proxy::start(&s3, dir.path());
    proxy.set(json!({"mode": "hang"}));
    let cfg = archive_config(
        dir.path(),
        json!({"maxMessages": 5}),
        json!({"ackDeadlineSeconds": 60}),
    );
    let port = free_port();
    let mut c = subsink();
    c.env("PUBSUB_EMULATOR_HOST", env.emu.host())
        .args(["run", "--source", "pubsub", "--subscription"])
        .arg(&cfg)
        .args(["--bucket-url", "s3://bkt", "--shutdown-grace", "3s"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .envs(proxy.env())
        .stdout(Stdio::piped());
    let mut child = spawn_draining(&mut c);
    wait_for_port(port, "subsink", &mut child);
    let ids = env.publish_n(5, 100);
    wait_for_a_write(&proxy);
    let (out, took) = sigterm_and_time(child, Some(port));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_bounded(took, "Pub/Sub, store hangs");
    assert!(out.status.success(), "{err}");
    let s = summary(&out);
    assert_eq!(s["messages_read"], 5, "{s}");
    assert_eq!(s["messages_written"], 0, "{s}");
    assert_eq!(s["messages_nacked"], 5, "{s}");
    // Redelivered at once (the ack deadline is 60 s).
    let back = Instant::now();
    let mut got: Vec<String> = env
        .drain_until_some(&sub("archive"), Duration::from_secs(10))
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    got.sort();
    let mut want = ids;
    want.sort();
    assert_eq!(got, want);
    assert!(back.elapsed() < Duration::from_secs(20));
}

/// NATS: the same, nak'ed: the consumer redelivers every message at once, not after AckWait.
#[test]
fn nats_messages_of_a_file_given_up_are_naked_and_redelivered() {
    let dir = tempfile::tempdir().unwrap();
    let nats = nats_server(&dir.path().join("js"));
    let rt = rt();
    let js = rt.block_on(async {
        let client = async_nats::connect(&nats.1).await.unwrap();
        let js = async_nats::jetstream::new(client);
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "TERM".into(),
            subjects: vec!["TERM.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
        for i in 0..5 {
            js.publish("TERM.events", format!("m{i}").into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        js
    });
    let s3 = S3Server::start();
    s3.create_bucket("bkt");
    let proxy = S3Proxy::start(&s3, dir.path());
    proxy.set(json!({"mode": "hang"}));
    // AckWait 60 s: a redelivery within seconds is the nak's.
    let cfg = archive_config(
        dir.path(),
        json!({"maxMessages": 5}),
        json!({"ackDeadlineSeconds": 60}),
    );
    let port = free_port();
    let mut child = spawn_draining(
        subsink()
            .args(["run", "--source", &nats.1, "--nats-stream", "TERM"])
            .args(["--nats-consumer", "archive", "--subscription"])
            .arg(&cfg)
            .args(["--bucket-url", "s3://bkt", "--shutdown-grace", "3s"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .envs(proxy.env())
            .stdout(Stdio::piped()),
    );
    wait_for_port(port, "subsink", &mut child);
    wait_for_a_write(&proxy);
    let (out, took) = sigterm_and_time(child, Some(port));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_bounded(took, "NATS, store hangs");
    assert!(out.status.success(), "{err}");
    let s = summary(&out);
    assert_eq!(s["messages_read"], 5, "{s}");
    assert_eq!(s["messages_nacked"], 5, "{s}");
    // The same durable consumer hands all five out again at once.
    let got = rt.block_on(async {
        use futures::StreamExt;
        let stream = js.get_stream("TERM").await.unwrap();
        let consumer: async_nats::jetstream::consumer::PullConsumer =
            stream.get_consumer("archive").await.unwrap();
        let mut batch = consumer
            .fetch()
            .max_messages(10)
            .expires(Duration::from_secs(3))
            .messages()
            .await
            .unwrap();
        let mut got = Vec::new();
        while let Some(m) = batch.next().await {
            let m = m.unwrap();
            got.push(String::from_utf8(m.payload.to_vec()).unwrap());
            m.ack().await.unwrap();
        }
        got
    });
    let mut got = got;
    got.sort();
    assert_eq!(got, ["m0", "m1", "m2", "m3", "m4"]);
}

/// A `nats-server -js` of this test alone, and its URL.
fn nats_server(store: &Path) -> (util::servers::Guarded, String) {
    let port = free_port();
    let server = util::servers::Guarded::spawn(
        Command::new(venv_bin("nats-server"))
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "nats-server",
    );
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "nats-server");
        std::thread::sleep(Duration::from_millis(20));
    }
    (server, format!("nats://127.0.0.1:{port}"))
}

/// The watchdog: a run blocked in a system call that no cancellation reaches — saving its
/// checkpoint into a FIFO nobody reads, as a save to a hung network file system would — still
/// ends at grace + 10 s after SIGTERM, exit 1, saying why. Fails on the build before it: the
/// process never exits.
#[test]
fn the_watchdog_ends_a_run_stuck_in_a_system_call() {
    const STUCK_GRACE: Duration = Duration::from_secs(1);
    let dir = tempfile::tempdir().unwrap();
    input(dir.path(), 5, 100);
    let cp = dir.path().join("cp.json");
    let port = free_port();
    // The checkpoint is saved through `.cp.json.<pid>.tmp` first, at the start already: a shell
    // makes that a FIFO, whose opening for writing blocks until someone reads it, then becomes
    // the worker (same pid).
    let mut cmd = Command::new("sh");
    without_subsink_env(&mut cmd);
    cmd.arg("-c")
        .arg(r#"mkfifo "$0/.cp.json.$$.tmp" && exec "$@""#)
        .arg(dir.path())
        .arg(subsink_bin())
        .args(storage_run_cmd("archive", "text").get_args())
        .args(["--cloud-storage-max-messages", "5", "--source"])
        .arg(dir.path().join("in.ndjson"))
        .arg("--bucket-url")
        .arg(format!("file://{}", dir.path().join("bucket").display()))
        .arg("--checkpoint")
        .arg(&cp)
        .args(["--shutdown-grace", &format!("{}s", STUCK_GRACE.as_secs())])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("SUBSINK_LOG", "warn")
        .stdout(Stdio::piped());
    let mut child = spawn_draining(&mut cmd);
    wait_for_port(port, "subsink", &mut child);
    let fifo = dir.path().join(format!(".cp.json.{}.tmp", child.id()));
    assert!(fifo.exists());
    let (out, took) = sigterm_and_time(child, Some(port));
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("stuck run: SIGTERM → exit {took:?} (grace {STUCK_GRACE:?} + margin {WATCHDOG:?})");
    assert!(took >= STUCK_GRACE + WATCHDOG, "{took:?}");
    // The watchdog's exit, and its message, take well under 3 s more.
    assert!(
        took < STUCK_GRACE + WATCHDOG + Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("still running"), "{err}");
    assert!(!cp.exists(), "no checkpoint was ever saved");
    assert!(files_below(&dir.path().join("bucket")).is_empty());
}

/// Whoever reads a worker's output may go away first (a supervisor restarted, a pipe to a
/// process that ended): with its stdout and stderr closed pipes, a worker reading stdin still
/// writes, and SIGTERM still ends it within the grace, exit 0, every message written. (Before,
/// the first log line after the reader left panicked the signal's task in the logger, so
/// SIGTERM did nothing, and the watchdog's own message panicked too: the worker ran forever.)
#[test]
fn a_worker_whose_output_readers_are_gone_still_ends_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let mut child = storage_run_cmd("archive", "text")
        .args(["--cloud-storage-max-messages", "5", "--source", "-"])
        .arg("--bucket-url")
        .arg(format!("file://{}", bucket.display()))
        .args(["--shutdown-grace", "3s"])
        .env("SUBSINK_LOG", "subsink=info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let lines = |from: usize, to: usize| -> String {
        (from..to)
            .map(|i| format!("{}\n", message(i, 10).to_json_line()))
            .collect()
    };
    stdin.write_all(lines(0, 10).as_bytes()).unwrap();
    stdin.flush().unwrap();
    // Two files written (5 messages each), seen in the log; then both readers go away.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut written = 0;
    let mut line = String::new();
    while written < 2 {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "stderr ended");
        written += line.contains("file written") as usize;
    }
    drop(err);
    drop(child.stdout.take());
    // More messages while nobody reads the log: an open file of 3 when the signal comes.
    stdin.write_all(lines(10, 18).as_bytes()).unwrap();
    stdin.flush().unwrap();
    poll(
        Duration::from_secs(30),
        Duration::from_millis(50),
        || match files_below(&bucket).len() {
            k if k >= 3 => Ok(()),
            k => Err(format!("{k} files, waiting for 3")),
        },
    );
    let (out, took) = sigterm_and_time(child, None);
    let status = out.status;
    eprintln!("output readers gone: SIGTERM → exit {took:?}, {status}");
    assert!(took <= GRACE + CLOSE, "{took:?}");
    assert_eq!(status.code(), Some(0));
    drop(stdin);
    assert_eq!(
        files_below(&bucket).len(),
        4,
        "3 files of 5 and the last of 3"
    );
    // Text files: one message's data per line, each of the 18 once.
    let mut got: Vec<Vec<u8>> = files_below(&bucket)
        .iter()
        .flat_map(|f| {
            let bytes = std::fs::read(bucket.join(f)).unwrap();
            bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect();
    got.sort();
    let mut want: Vec<Vec<u8>> = (0..18).map(|i| message(i, 10).data.to_vec()).collect();
    want.sort();
    assert_eq!(got, want);
}
