//! Running subsink as a service (issue 10): the telemetry endpoint read by a real HTTP client and
//! Prometheus's own Python parser, health flips, JSON logs, the progress bar under a
//! pseudo-terminal, and `subsink inspect` compared record by record with fastavro and deltalake.

mod util;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use subsink::telemetry::{FinalizeReason, Health, Metrics, RetryKind};
use util::http::{get, sample};
use util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_readiness_over_http() {
    let metrics = Metrics::new();
    let health = Health::new(Duration::from_secs(3));
    let server = subsink::telemetry::http::serve("127.0.0.1:0", metrics.clone(), health.clone())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    let urls =
        |paths: &[&str]| -> Vec<String> { paths.iter().map(|p| format!("{base}{p}")).collect() };
    let fetch = move |u: Vec<String>| async move {
        tokio::task::spawn_blocking(move || get(&u)).await.unwrap()
    };

    let sub = "projects/p/subscriptions/archive";
    let m = metrics.subscription(sub);
    let probe = health.probe(sub);
    m.received(10);
    m.written(7, 2048);
    m.acked(7);
    m.nacked(1);
    m.dead_lettered(1);
    m.filtered(2);
    m.bad(1);
    m.finalized(FinalizeReason::MaxMessages);
    m.finalized(FinalizeReason::EndOfInput);
    m.upload_seconds(Duration::from_millis(20));
    m.commit_seconds(Duration::from_millis(700));
    m.open_files(2);
    m.buffered_bytes(512);
    m.oldest_unacked_age(Duration::from_millis(2500));
    m.retried(RetryKind::Upload);

    // Not ready until the pipeline says its source and destination are up; alive throughout.
    let r = fetch(urls(&["/metrics", "/healthz", "/readyz"])).await;
    let (page, healthz, readyz) = (&r[0], &r[1], &r[2]);
    assert_eq!(page["status"], 200);
    assert!(
        page["content_type"]
            .as_str()
            .unwrap()
            .starts_with("application/openmetrics-text"),
        "{page}"
    );
    let l = json!({"subscription": sub});
    for (family, name, want) in [
        (
            "subsink_messages_received",
            "subsink_messages_received_total",
            10.0,
        ),
        (
            "subsink_messages_written",
            "subsink_messages_written_total",
            7.0,
        ),
        (
            "subsink_messages_acked",
            "subsink_messages_acked_total",
            7.0,
        ),
        (
            "subsink_messages_nacked",
            "subsink_messages_nacked_total",
            1.0,
        ),
        (
            "subsink_messages_dead_lettered",
            "subsink_messages_dead_lettered_total",
            1.0,
        ),
        (
            "subsink_messages_filtered",
            "subsink_messages_filtered_total",
            2.0,
        ),
        ("subsink_messages_bad", "subsink_messages_bad_total", 1.0),
        (
            "subsink_bytes_written",
            "subsink_bytes_written_total",
            2048.0,
        ),
        ("subsink_open_files", "subsink_open_files", 2.0),
        ("subsink_buffered_bytes", "subsink_buffered_bytes", 512.0),
        (
            "subsink_oldest_unacked_age_seconds",
            "subsink_oldest_unacked_age_seconds",
            2.5,
        ),
    ] {
        assert_eq!(sample(page, family, name, &l), Some(want), "{name}");
    }
    assert_eq!(
        page["families"]["subsink_messages_received"]["type"],
        "counter"
    );
    assert_eq!(page["families"]["subsink_open_files"]["type"], "gauge");
    let reason = |r: &str| json!({"subscription": sub, "reason": r});
    assert_eq!(
        sample(
            page,
            "subsink_files_finalized",
            "subsink_files_finalized_total",
            &reason("max_messages")
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            page,
            "subsink_files_finalized",
            "subsink_files_finalized_total",
            &reason("memory")
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            page,
            "subsink_retries",
            "subsink_retries_total",
            &json!({"subscription": sub, "kind": "upload"})
        ),
        Some(1.0)
    );
    let hist = &page["families"]["subsink_upload_duration_seconds"];
    assert_eq!(hist["type"], "histogram");
    let obj = json!({"subscription": sub, "kind": "object"});
    let commit = json!({"subscription": sub, "kind": "commit"});
    assert_eq!(
        sample(
            page,
            "subsink_upload_duration_seconds",
            "subsink_upload_duration_seconds_count",
            &obj
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            page,
            "subsink_upload_duration_seconds",
            "subsink_upload_duration_seconds_sum",
            &commit
        ),
        Some(0.7)
    );
    let le = |v: &str| json!({"subscription": sub, "kind": "commit", "le": v});
    assert_eq!(
        sample(
            page,
            "subsink_upload_duration_seconds",
            "subsink_upload_duration_seconds_bucket",
            &le("0.5")
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            page,
            "subsink_upload_duration_seconds",
            "subsink_upload_duration_seconds_bucket",
            &le("1.0")
        ),
        Some(1.0)
    );
    assert_eq!(healthz["status"], 200, "{healthz}");
    assert_eq!(readyz["status"], 503, "{readyz}");
    let body: Value = serde_json::from_str(readyz["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        body["problems"],
        json!([
            format!("{sub}: source not connected"),
            format!("{sub}: destination not reachable")
        ])
    );

    // Connected and reachable: ready.
    probe.set_source_connected(true);
    probe.set_destination_reachable(true);
    probe.beat();
    let r = fetch(urls(&["/readyz", "/healthz"])).await;
    assert_eq!(r[0]["status"], 200, "{}", r[0]);
    assert_eq!(r[1]["status"], 200, "{}", r[1]);

    // The store goes away: not ready (still alive); it comes back: ready again.
    probe.set_destination_reachable(false);
    probe.beat();
    let r = fetch(urls(&["/readyz", "/healthz"])).await;
    assert_eq!(r[0]["status"], 503, "{}", r[0]);
    assert!(r[0]["body"]
        .as_str()
        .unwrap()
        .contains("destination not reachable"));
    assert_eq!(r[1]["status"], 200);
    probe.set_destination_reachable(true);
    assert_eq!(fetch(urls(&["/readyz"])).await[0]["status"], 200);

    // The loop stops ticking: not alive; it ticks again: alive.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let r = fetch(urls(&["/healthz"])).await;
    assert_eq!(r[0]["status"], 503, "{}", r[0]);
    assert!(r[0]["body"].as_str().unwrap().contains("no heartbeat"));
    probe.beat();
    assert_eq!(fetch(urls(&["/healthz"])).await[0]["status"], 200);

    // SIGTERM: draining is not ready, but alive.
    health.set_shutting_down();
    probe.beat();
    let r = fetch(urls(&["/readyz", "/healthz"])).await;
    assert_eq!(r[0]["status"], 503);
    assert!(r[0]["body"].as_str().unwrap().contains("shutting down"));
    assert_eq!(r[1]["status"], 200);
    server.stop().await;
}

/// Messages with text, binary (not UTF-8) and empty payloads, attributes and an ordering key.
fn mixed_messages(n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| Message {
            data: match i % 4 {
                0 => format!("hello {i} ✓").into_bytes(),
                1 => vec![0xff, 0x00, i as u8, 0xfe],
                2 => Vec::new(),
                _ => format!("{{\"n\": {i}}}").into_bytes(),
            }
            .into(),
            attributes: [("i".to_string(), i.to_string())].into(),
            message_id: format!("m{i:05}"),
            publish_time_micros: 1_695_615_000_123_456 + i as i64,
            ordering_key: if i % 3 == 0 {
                "key".into()
            } else {
                String::new()
            },
        })
        .collect()
}

fn write_messages(path: &Path, msgs: &[Message]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for m in msgs {
        writeln!(f, "{}", m.to_json_line()).unwrap();
    }
}

#[test]
fn metrics_endpoint_serves_during_a_real_run_and_logs_are_json() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = spawn_draining(
        subsink()
            .env("SUBSINK_LOG", "info")
            .args(["--log-format", "json", "run", "--subscription"])
            .arg(root().join("examples/storage-text.json"))
            .args(["--source", "-", "--bucket-url"])
            .arg(format!("file://{}", dir.path().display()))
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no listener on {port}"
        );
        assert!(child.try_wait().unwrap().is_none(), "subsink exited early");
        std::thread::sleep(Duration::from_millis(50));
    }
    let base = format!("http://127.0.0.1:{port}");
    let r = get(&[format!("{base}/metrics"), format!("{base}/healthz")]);
    assert_eq!(r[0]["status"], 200);
    let sub = json!({"subscription": "projects/demo-project/subscriptions/archive-text"});
    assert_eq!(
        sample(
            &r[0],
            "subsink_messages_received",
            "subsink_messages_received_total",
            &sub
        ),
        Some(0.0),
        "{}",
        r[0]["body"]
    );
    assert_eq!(
        r[0]["families"]["subsink_build_info"]["samples"][0][1]["version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(r[1]["status"], 200, "{}", r[1]);

    let mut stdin = child.stdin.take().unwrap();
    for m in mixed_messages(5) {
        writeln!(stdin, "{}", m.to_json_line()).unwrap();
    }
    drop(stdin); // end of input: the open file is finalized and the run ends
    let out = output(child);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(summary(&out)["messages_written"], 5);
    // Every stderr line is one JSON object with the standard fields.
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(l["timestamp"].is_string() && l["level"].is_string() && l["message"].is_string());
    }
    assert!(
        lines
            .iter()
            .any(|l| l["message"].as_str().unwrap().contains("/metrics")),
        "{stderr}"
    );
    // The listener is gone with the process.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

/// `/readyz` and `/healthz` read with a real HTTP client (urllib) while `subsink run` writes to
/// SeaweedFS, while SeaweedFS is down, and after it is back: ready, then not ready (the
/// destination is not reachable) while alive all along, then ready again; nothing is lost.
#[test]
fn readiness_follows_a_store_outage_and_liveness_stays() {
    use util::http::status;
    let mut weed = servers::SeaweedFs::start();
    let api = weed.api();
    api.create_bucket("health");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = spawn_draining(
        storage_run_cmd("health", "text")
            .args(["--cloud-storage-max-messages", "5", "--source", "-"])
            .args(["--bucket-url", "s3://health"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .envs(api.env())
            .env("SUBSINK_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    wait_for_port(port, "subsink", &mut child);
    let mut stdin = child.stdin.take().unwrap();
    let msgs = mixed_messages(10);
    let send = |stdin: &mut std::process::ChildStdin, range: std::ops::Range<usize>| {
        for m in &msgs[range] {
            writeln!(stdin, "{}", m.to_json_line()).unwrap();
        }
        stdin.flush().unwrap();
    };
    let until = |what: &str, limit: u64, f: &dyn Fn() -> bool| {
        poll(
            Duration::from_secs(limit),
            Duration::from_millis(250),
            || {
                f().then_some(())
                    .ok_or_else(|| format!("{what} within {limit} s"))
            },
        )
    };

    // During the run: an object is written; ready and alive.
    send(&mut stdin, 0..5);
    until("one object", 30, &|| api.list("health").len() == 1);
    until("ready", 30, &|| status(&base, "/readyz").0 == 200);
    assert_eq!(status(&base, "/healthz").0, 200);

    // The store goes away while a file is being uploaded: not ready, still alive.
    weed.stop();
    send(&mut stdin, 5..10);
    until("not ready", 30, &|| status(&base, "/readyz").0 == 503);
    let (_, body) = status(&base, "/readyz");
    assert!(body.contains("destination not reachable"), "{body}");
    for _ in 0..4 {
        let (code, body) = status(&base, "/healthz");
        assert_eq!(code, 200, "alive during the outage: {body}");
        assert_eq!(status(&base, "/readyz").0, 503);
        std::thread::sleep(Duration::from_millis(500));
    }

    // It comes back: ready again; the file held through the outage is written.
    weed.restart();
    // Once seen failing under CI (not reproduced since): the logs of both sides say why.
    let back = Instant::now();
    while status(&base, "/readyz").0 != 200 {
        if back.elapsed() > Duration::from_secs(60) {
            let err = kill_9(child);
            panic!(
                "not ready again within 60 s of the store's restart\n--- subsink:\n{err}\n\
                 --- SeaweedFS:\n{}",
                weed.log()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(status(&base, "/healthz").0, 200);
    drop(stdin);
    let out = output(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(summary(&out)["messages_written"], 10, "{err}");
    assert_eq!(api.list("health").len(), 2);
}

/// Runs argv[1:] on a pseudo-terminal (120 columns) and prints everything it wrote there.
const PTY_RUN: &str = r#"
import fcntl, json, os, pty, struct, sys, termios
args = json.loads(sys.argv[1])
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    os.execv(args[0], args)
out = b""
while True:
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
_, status = os.waitpid(pid, 0)
print(json.dumps({"status": os.waitstatus_to_exitcode(status), "output": out.decode("utf-8", "replace")}))
"#;

#[test]
fn progress_bar_on_a_terminal_and_never_on_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ndjson");
    write_messages(&input, &mixed_messages(3000));
    let args = |bucket: &str| -> Vec<String> {
        vec![
            subsink_bin().display().to_string(),
            "run".into(),
            "--subscription".into(),
            root()
                .join("examples/storage-text.json")
                .display()
                .to_string(),
            "--limits".into(),
            "extended".into(),
            "--source".into(),
            input.display().to_string(),
            "--bucket-url".into(),
            format!("file://{}", dir.path().join(bucket).display()),
        ]
    };
    let tty = python_json(
        PTY_RUN,
        &serde_json::to_string(&args("tty")).unwrap(),
        // A terminal session names its terminal; without TERM (CI runners, `env -i`) the bar is
        // not drawn, as for TERM=dumb.
        &[("SUBSINK_LOG", "warn".into()), ("TERM", "xterm".into())],
    );
    assert_eq!(tty["status"], 0, "{tty}");
    let screen = tty["output"].as_str().unwrap();
    assert!(screen.contains("100%"), "{screen}");
    assert!(screen.contains("3000 msgs"), "{screen}");
    assert!(screen.contains("msg/s"), "{screen}");
    let size = std::fs::metadata(&input).unwrap().len();
    assert!(size > 1024 * 1024 / 4, "input big enough to show bytes");
    assert!(screen.contains("KiB") || screen.contains("MiB"), "{screen}");

    let mut cmd = Command::new(&args("pipe")[0]);
    without_subsink_env(&mut cmd);
    cmd.args(&args("pipe")[1..]).env("SUBSINK_LOG", "warn");
    let out = run_ok(&mut cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("msg/s"), "{stderr}");
    assert!(!stderr.contains('%'), "{stderr}");
    assert_eq!(summary(&out)["messages_written"], 3000);
}

// ------------------------------------------------------------------------------------------------
// inspect

/// fastavro's records in inspect's JSON forms (bytes: UTF-8 text else {"base64"}; timestamps:
/// RFC 3339 UTC with microseconds), one array per file.
const FASTAVRO_READ: &str = r#"
import base64, datetime, json, sys, fastavro
def plain(v):
    if isinstance(v, (bytes, bytearray)):
        try: return bytes(v).decode("utf-8")
        except UnicodeDecodeError: return {"base64": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, datetime.datetime):
        return v.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(v, dict): return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list): return [plain(x) for x in v]
    return v
out = []
for path in json.loads(sys.argv[1]):
    with open(path, "rb") as f:
        out.append([plain(r) for r in fastavro.reader(f)])
print(json.dumps(out))
"#;

fn inspect_lines(target: &str, extra: &[&str]) -> Vec<Value> {
    let out = run_ok(subsink().arg("inspect").arg(target).args(extra));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

fn storage_run(dir: &Path, input: &Path, extra: &[&str]) -> Vec<PathBuf> {
    let bucket = dir.join("bucket");
    run_ok(
        subsink()
            .args([
                "run",
                "--limits",
                "extended",
                "--subscription-name",
                "projects/proj/subscriptions/sub",
                "--topic",
                "projects/proj/topics/top",
                "--cloud-storage-bucket",
                "bkt",
                "--cloud-storage-file-prefix",
                "out/",
                "--cloud-storage-file-suffix",
                ".avro",
                "--cloud-storage-max-messages",
                "7",
                "--source",
            ])
            .arg(input)
            .arg("--bucket-url")
            .arg(format!("file://{}", bucket.display()))
            .args(extra),
    );
    files_below(&bucket)
        .into_iter()
        .map(|f| bucket.join(f))
        .collect()
}

#[test]
fn inspect_prints_every_avro_layout_as_fastavro_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let plain_input = dir.path().join("mixed.ndjson");
    write_messages(&plain_input, &mixed_messages(20));
    let topic_input = root().join("fixtures/input/topic-messages.ndjson");
    let avsc = root().join("fixtures/input/event.avsc");
    let avsc = avsc.to_str().unwrap();
    let layouts: Vec<(&str, &Path, Vec<&str>)> = vec![
        (
            "A",
            &plain_input,
            vec!["--cloud-storage-output-format", "avro"],
        ),
        (
            "B",
            &plain_input,
            vec![
                "--cloud-storage-output-format",
                "avro",
                "--cloud-storage-write-metadata",
                "--avro-codec",
                "deflate",
            ],
        ),
        (
            "C",
            &topic_input,
            vec![
                "--cloud-storage-output-format",
                "avro",
                "--cloud-storage-use-topic-schema",
                "--topic-schema",
                avsc,
            ],
        ),
        (
            "D",
            &topic_input,
            vec![
                "--cloud-storage-output-format",
                "avro",
                "--cloud-storage-use-topic-schema",
                "--cloud-storage-write-metadata",
                "--topic-schema",
                avsc,
                "--avro-codec",
                "zstd",
            ],
        ),
    ];
    for (layout, input, extra) in layouts {
        let d = dir.path().join(layout);
        let files = storage_run(&d, input, &extra);
        assert!(!files.is_empty(), "layout {layout}: no objects");
        let want = python_json(FASTAVRO_READ, &serde_json::to_string(&files).unwrap(), &[]);
        let mut total = 0;
        for (file, want) in files.iter().zip(want.as_array().unwrap()) {
            let got = inspect_lines(file.to_str().unwrap(), &[]);
            assert_eq!(&Value::Array(got.clone()), want, "layout {layout} {file:?}");
            total += got.len();
            // As a file:// URL too.
            let url = format!("file://{}", file.display());
            assert_eq!(inspect_lines(&url, &[]), got, "layout {layout} via URL");
            let s = inspect_lines(file.to_str().unwrap(), &["--summary"]);
            assert_eq!(s.len(), 1);
            assert_eq!(s[0]["format"], "avro");
            assert_eq!(s[0]["records"], got.len());
            assert!(s[0]["schema"]["fields"].is_array(), "{}", s[0]);
        }
        let lines = std::fs::read_to_string(input).unwrap().lines().count();
        assert_eq!(total, lines, "layout {layout}: every message once");
        if layout == "B" {
            // Text payloads read as text, binary ones as base64; the metadata fields are there.
            let mut all: Vec<Value> = files
                .iter()
                .flat_map(|f| inspect_lines(f.to_str().unwrap(), &[]))
                .collect();
            all.sort_by_key(|r| r["message_id"].as_str().unwrap().to_string());
            assert_eq!(all[0]["data"], "hello 0 ✓");
            assert_eq!(all[1]["data"], json!({"base64": "/wAB/g=="}));
            assert_eq!(all[2]["data"], "");
            assert_eq!(all[0]["message_id"], "m00000");
            assert_eq!(all[0]["publish_time"], "2023-09-25T04:10:00.123456Z");
            assert_eq!(
                all[0]["attributes"],
                json!({"i": "0", "ordering_key": "key"})
            );
            assert_eq!(
                all[0]["subscription_name"],
                "projects/proj/subscriptions/sub"
            );
        }
    }
}

#[test]
fn inspect_checks_names_against_the_subscription() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ndjson");
    write_messages(&input, &mixed_messages(3));
    let bucket = dir.path().join("bucket");
    run_ok(
        subsink()
            .args(["run", "--subscription"])
            .arg(root().join("examples/storage-text.json"))
            .arg("--source")
            .arg(&input)
            .arg("--bucket-url")
            .arg(format!("file://{}", bucket.display())),
    );
    let files = files_below(&bucket);
    assert_eq!(files.len(), 1);
    let object = bucket.join(&files[0]);
    let object = object.to_str().unwrap();
    let text = root().join("examples/storage-text.json");
    let s = inspect_lines(
        object,
        &["--summary", "--subscription", text.to_str().unwrap()],
    );
    assert_eq!(s[0]["format"], "text");
    assert_eq!(s[0]["records"], 3);
    assert_eq!(s[0]["name_check"]["ok"], true, "{}", s[0]);
    // Text records: each line's data.
    let recs = inspect_lines(object, &[]);
    assert_eq!(recs[0], json!({"data": "hello 0 ✓"}));
    assert_eq!(recs[2], json!({"data": ""}));

    // The Avro subscription's rule (prefix `events/`, suffix `.avro`) does not fit it: exit 1,
    // naming the rule that failed.
    let avro = root().join("examples/storage-avro.json");
    let out = subsink()
        .args(["inspect", object, "--summary", "--subscription"])
        .arg(&avro)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "does not follow the naming rule of projects/demo-project/subscriptions/archive-avro"
        ),
        "{err}"
    );
    assert!(err.contains("suffix \".avro\""), "{err}");
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["name_check"]["ok"], false);

    // A file that is not there: exit 1 naming it.
    let out = subsink()
        .args(["inspect", "/nonexistent/object.avro"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/object.avro"));
}

/// The table read by the `deltalake` package in inspect's JSON forms, sorted by message_id.
const DELTA_READ: &str = r#"
import base64, datetime, decimal, json, os, sys, deltalake
def plain(v):
    if isinstance(v, (bytes, bytearray)):
        try: return bytes(v).decode("utf-8")
        except UnicodeDecodeError: return {"base64": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, decimal.Decimal): return format(v, "f")
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None: return v.strftime("%Y-%m-%dT%H:%M:%S.%f")
        return v.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(v, datetime.date): return v.isoformat()
    if isinstance(v, dict): return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list): return [plain(x) for x in v]
    return v
dt = deltalake.DeltaTable(sys.argv[1])
rows = [plain(r) for r in dt.to_pyarrow_table().to_pylist()]
rows.sort(key=lambda r: r["message_id"])
print(json.dumps({"version": dt.version(), "files": len(dt.file_uris()), "rows": rows}))
# deltalake's threads can abort the interpreter's teardown ("terminate called without an
# active exception"): the answer is printed, so leave without the teardown.
sys.stdout.flush()
os._exit(0)
"#;

#[test]
fn inspect_prints_a_delta_table_as_deltalake_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"[
  {"name": "id", "type": "INTEGER", "mode": "REQUIRED"},
  {"name": "name", "type": "STRING"},
  {"name": "amount", "type": "NUMERIC"},
  {"name": "at", "type": "TIMESTAMP"},
  {"name": "local", "type": "DATETIME"},
  {"name": "day", "type": "DATE"},
  {"name": "blob", "type": "BYTES"},
  {"name": "tags", "type": "STRING", "mode": "REPEATED"},
  {"name": "user", "type": "RECORD", "fields": [{"name": "uid", "type": "INT64"}]}
]"#,
    )
    .unwrap();
    let sub = dir.path().join("sub.json");
    std::fs::write(
        &sub,
        json!({
            "name": "projects/proj/subscriptions/to-table",
            "topic": "projects/proj/topics/events",
            "bigqueryConfig": {"table": "proj.ds.events", "useTableSchema": true, "writeMetadata": true},
            "subsink": {"limits": "extended", "table": {"maxMessages": "4"}},
        })
        .to_string(),
    )
    .unwrap();
    let msgs: Vec<Message> = (0..10u64)
        .map(|i| {
            let blob: Vec<u8> = if i % 2 == 0 {
                format!("text {i}").into_bytes()
            } else {
                vec![0xff, i as u8]
            };
            use base64::Engine as _;
            let payload = json!({
                "id": i,
                "name": format!("n{i}"),
                "amount": format!("{i}.25"),
                "at": format!("2024-03-01T10:00:{i:02}.5Z"),
                "local": format!("2024-03-01T10:00:{i:02}"),
                "day": "2024-03-01",
                "blob": base64::engine::general_purpose::STANDARD.encode(&blob),
                "tags": (0..i % 3).map(|t| format!("t{t}")).collect::<Vec<_>>(),
                "user": {"uid": i * 10},
            });
            Message {
                data: payload.to_string().into_bytes().into(),
                attributes: [("i", i.to_string())].into(),
                message_id: format!("id{i:03}"),
                publish_time_micros: 1_714_521_600_000_000 + i as i64,
                ordering_key: String::new(),
            }
        })
        .collect();
    let input = dir.path().join("in.ndjson");
    write_messages(&input, &msgs);
    let table = dir.path().join("table");
    table_run(&sub, &input, &table, &schema);
    let want = python_json(DELTA_READ, table.to_str().unwrap(), &[]);
    let mut got = inspect_lines(table.to_str().unwrap(), &[]);
    got.sort_by_key(|r| r["message_id"].as_str().unwrap().to_string());
    assert_eq!(Value::Array(got.clone()), want["rows"]);
    assert_eq!(got.len(), 10);
    assert_eq!(got[0]["blob"], "text 0");
    assert_eq!(got[1]["blob"], json!({"base64": "/wE="}));
    assert_eq!(got[1]["at"], "2024-03-01T10:00:01.500000Z");
    assert_eq!(got[1]["local"], "2024-03-01T10:00:01.000000");
    assert_eq!(got[1]["amount"], "1.250000000");

    let s = inspect_lines(&format!("file://{}", table.display()), &["--summary"]);
    assert_eq!(s[0]["format"], "delta");
    assert_eq!(s[0]["rows"], 10);
    assert_eq!(s[0]["files"], want["files"]);
    assert_eq!(s[0]["version"], want["version"]);
    assert!(s[0]["schema"]["fields"].is_array(), "{}", s[0]);

    // Its Parquet files one by one: at most 4 rows each (maxMessages), 10 in all.
    let mut rows = 0;
    for part in files_below(&table)
        .iter()
        .filter(|f| f.ends_with(".parquet"))
    {
        let s = inspect_lines(table.join(part).to_str().unwrap(), &["--summary"]);
        assert_eq!(s[0]["format"], "parquet");
        let n = s[0]["rows"].as_u64().unwrap();
        assert!((1..=4).contains(&n), "{}", s[0]);
        rows += n;
    }
    assert_eq!(rows, 10);
}

#[test]
fn inspect_reads_objects_and_tables_from_s3() {
    let s3 = S3Server::start();
    s3.create_bucket("archive");
    s3.create_bucket("lake");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ndjson");
    write_messages(&input, &mixed_messages(12));
    // The same deterministic run into a local folder and into S3: the same object, byte for byte.
    let run = |bucket_url: String| {
        let mut c = subsink();
        c.args(["run", "--subscription"])
            .arg(root().join("examples/storage-avro.json"))
            .arg("--source")
            .arg(&input)
            .args(["--bucket-url", &bucket_url])
            .args(["--fixed-time", "2023-09-25T04:10:00Z", "--seed", "42"])
            .envs(s3.env());
        run_ok(&mut c);
    };
    let local = dir.path().join("local");
    run(format!("file://{}", local.display()));
    run("s3://archive".into());
    let keys = s3.list("archive");
    assert_eq!(keys.len(), 1);
    let key = &keys[0].0;
    assert_eq!(files_below(&local), std::slice::from_ref(key));
    let inspect_s3 = |extra: &[&str]| {
        let mut c = subsink();
        c.args(["inspect", &format!("s3://archive/{key}")])
            .args(extra)
            .envs(s3.env());
        let out = run_ok(&mut c);
        String::from_utf8(out.stdout).unwrap()
    };
    let from_s3 = inspect_s3(&[]);
    let from_disk = run_ok(subsink().args(["inspect", local.join(key).to_str().unwrap()])).stdout;
    assert_eq!(from_s3, String::from_utf8(from_disk).unwrap());
    assert_eq!(from_s3.lines().count(), 12);
    let avro = root().join("examples/storage-avro.json");
    let s: Value = serde_json::from_str(
        inspect_s3(&["--summary", "--subscription", avro.to_str().unwrap()]).trim(),
    )
    .unwrap();
    assert_eq!(s["name_check"]["ok"], true, "{s}");
    assert_eq!(s["name_check"]["datetime"], "2023-09-25T04:10:00Z");

    // A Delta table under a prefix of the bucket.
    let sub = dir.path().join("table.json");
    std::fs::write(
        &sub,
        json!({
            "name": "projects/proj/subscriptions/raw",
            "topic": "projects/proj/topics/events",
            "bigqueryConfig": {"table": "proj.ds.raw", "writeMetadata": true},
        })
        .to_string(),
    )
    .unwrap();
    // The `data` column given explicitly: without --table-schema, `run` refuses an empty schema.
    let schema = dir.path().join("schema.json");
    std::fs::write(&schema, r#"[{"name": "data", "type": "BYTES"}]"#).unwrap();
    let mut c = subsink();
    c.args(["run", "--subscription"])
        .arg(&sub)
        .arg("--source")
        .arg(&input)
        .arg("--table-schema")
        .arg(&schema)
        .args(["--table-url", "s3://lake/raw/events"])
        .envs(s3.env());
    run_ok(&mut c);
    let mut c = subsink();
    c.args(["inspect", "s3://lake/raw/events"]).envs(s3.env());
    let out = run_ok(&mut c);
    let mut rows: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    rows.sort_by_key(|r| r["message_id"].as_str().unwrap().to_string());
    assert_eq!(rows.len(), 12);
    // No schema: the payload is the BYTES `data` column, text or base64 as it is.
    assert_eq!(rows[0]["data"], "hello 0 ✓");
    assert_eq!(rows[1]["data"], json!({"base64": "/wAB/g=="}));
    assert_eq!(
        rows[0]["subscription_name"],
        "projects/proj/subscriptions/raw"
    );
    assert_eq!(rows[0]["publish_time"], "2023-09-25T04:10:00.123456Z");
}

// ------------------------------------------------------------------------------------------------
// Metrics from real runs: every series docs/operating.md lists, read from `/metrics` while (or
// after) a real pipeline did what it counts.

/// Every sample of subscription `sub` on a parsed `/metrics` page, keyed `name{label="v",…}`
/// without the subscription label; histogram buckets and sums (latencies) left out, their counts
/// kept.
fn series_of(page: &Value, sub: &str) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for fam in page["families"].as_object().unwrap().values() {
        for s in fam["samples"].as_array().unwrap() {
            let name = s[0].as_str().unwrap();
            if s[1]["subscription"] != sub
                || name.ends_with("_bucket")
                || name.ends_with("_sum")
                || name.ends_with("_created")
            {
                continue;
            }
            let mut labels: Vec<String> = s[1]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(k, _)| *k != "subscription")
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
                .collect();
            labels.sort();
            let key = match labels.is_empty() {
                true => name.to_string(),
                false => format!("{name}{{{}}}", labels.join(",")),
            };
            out.insert(key, s[2].as_f64().unwrap());
        }
    }
    out
}

/// The series of one subscription as docs/operating.md lists them, every one at 0 but those in
/// `set`.
fn expected_series(set: &[(&str, f64)]) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for c in [
        "received",
        "written",
        "acked",
        "nacked",
        "dead_lettered",
        "filtered",
        "bad",
    ] {
        out.insert(format!("subsink_messages_{c}_total"), 0.0);
    }
    out.insert("subsink_bytes_written_total".into(), 0.0);
    for r in [
        "max_duration",
        "max_bytes",
        "max_messages",
        "end_of_input",
        "shutdown",
        "memory",
        "flow_control",
    ] {
        out.insert(format!("subsink_files_finalized_total{{reason={r}}}"), 0.0);
    }
    for k in ["object", "commit"] {
        out.insert(
            format!("subsink_upload_duration_seconds_count{{kind={k}}}"),
            0.0,
        );
    }
    for g in ["open_files", "buffered_bytes", "oldest_unacked_age_seconds"] {
        out.insert(format!("subsink_{g}"), 0.0);
    }
    for k in RetryKind::ALL {
        out.insert(format!("subsink_retries_total{{kind={}}}", k.as_str()), 0.0);
    }
    for (k, v) in set {
        assert!(out.contains_key(*k), "no series {k}");
        out.insert(k.to_string(), *v);
    }
    out
}

/// The series of `sub` on the `/metrics` page at `base`.
fn series_at(base: &str, sub: &str) -> std::collections::BTreeMap<String, f64> {
    series_of(&get(&[format!("{base}/metrics")]).remove(0), sub)
}

/// Sum of the sizes of the files below `dir`.
fn bytes_below(dir: &Path) -> u64 {
    objects_below(dir)
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum()
}

/// A file run (stdin kept open, so the endpoint can be read after each step) through a
/// subscription filter, `--on-bad-input skip`, `maxDuration` 5 s, `maxMessages` 5 and
/// `maxBytes` 2000: each series is read from `/metrics` after the step that moves it, and at the
/// end every series of the subscription is compared with what the run did (objects and bytes on
/// disk, the summary).
#[test]
fn metrics_of_a_real_file_run_match_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let name = "projects/demo-project/subscriptions/metrics-run";
    let cfg = dir.path().join("sub.json");
    std::fs::write(
        &cfg,
        json!({
            "name": name,
            "topic": "projects/demo-project/topics/events",
            "filter": "attributes.keep = \"yes\"",
            "subsink": {"limits": "extended"},
            "cloudStorageConfig": {"bucket": "bkt", "textConfig": {}, "maxDuration": "5s",
                                   "maxMessages": "5", "maxBytes": "2000"},
        })
        .to_string(),
    )
    .unwrap();
    let port = free_port();
    let log_path = dir.path().join("log");
    let mut child = servers::guard(
        subsink()
            .env("SUBSINK_LOG", "info")
            .args(["run", "--subscription"])
            .arg(&cfg)
            .args(["--source", "-", "--on-bad-input", "skip", "--bucket-url"])
            .arg(format!("file://{}", bucket.display()))
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log_path).unwrap()),
    )
    .spawn()
    .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_for_port(port, "subsink", &mut child);
    let base = format!("http://127.0.0.1:{port}");
    let series = || series_at(&base, name);
    let until = |what: &str, f: &dyn Fn(&std::collections::BTreeMap<String, f64>) -> bool| {
        poll(Duration::from_secs(30), Duration::from_millis(200), || {
            let s = series();
            f(&s)
                .then_some(s.clone())
                .ok_or_else(|| format!("{what}: {s:?}\n{}", log()))
        })
    };
    let mut stdin = child.stdin.take().unwrap();
    let mut send = |lines: Vec<String>| {
        for l in lines {
            writeln!(stdin, "{l}").unwrap();
        }
        stdin.flush().unwrap();
    };
    let msg = |i: usize, keep: bool, len: usize| {
        let mut m = numbered_message(i, len);
        m.attributes
            .insert("keep".into(), if keep { "yes" } else { "no" }.into());
        m.to_json_line()
    };
    let finalized = |r: &str| format!("subsink_files_finalized_total{{reason={r}}}");

    // From the start, every series at 0.
    assert_eq!(series(), expected_series(&[]), "{}", log());

    // Two messages in an open file: the gauges show it while it waits for maxDuration.
    send(vec![msg(0, true, 100), msg(1, true, 100)]);
    let s = until("a file open with two messages", &|s| {
        s["subsink_messages_received_total"] == 2.0 && s["subsink_open_files"] == 1.0
    });
    assert!(s["subsink_buffered_bytes"] >= 200.0, "{s:?}");
    let age = s["subsink_oldest_unacked_age_seconds"];
    assert!(age > 0.0 && age < 6.0, "{s:?}");
    // The gauges are reported once a second too.
    until("finalized after maxDuration, no file open", &|s| {
        s[&finalized("max_duration")] == 1.0
            && s["subsink_messages_written_total"] == 2.0
            && s["subsink_open_files"] == 0.0
            && s["subsink_buffered_bytes"] == 0.0
    });

    // Five kept, three filtered, one bad line: one file of five (maxMessages).
    let mut lines: Vec<String> = (2..7).map(|i| msg(i, true, 100)).collect();
    lines.extend((7..10).map(|i| msg(i, false, 100)));
    lines.push("this is not JSON".into());
    send(lines);
    until("finalized at maxMessages", &|s| {
        s[&finalized("max_messages")] == 1.0 && s["subsink_messages_written_total"] == 7.0
    });

    // A message larger than maxBytes: a file of its own.
    send(vec![msg(10, true, 3000)]);
    until("finalized at maxBytes", &|s| {
        s[&finalized("max_bytes")] == 1.0 && s["subsink_messages_written_total"] == 8.0
    });

    let objects = objects_below(&bucket);
    assert_eq!(objects.len(), 3, "{objects:?}");
    let bytes = bytes_below(&bucket);
    assert_eq!(
        bytes,
        7 * 101 + 3001,
        "Text: each message's data and a newline"
    );
    // Written, bytes, finalized files and latencies count as they happen; the other message
    // counters are reported once a second: wait for that report.
    let want = expected_series(&[
        ("subsink_messages_received_total", 11.0),
        ("subsink_messages_written_total", 8.0),
        ("subsink_messages_acked_total", 8.0),
        ("subsink_messages_filtered_total", 3.0),
        ("subsink_messages_bad_total", 1.0),
        ("subsink_bytes_written_total", bytes as f64),
        (&finalized("max_duration"), 1.0),
        (&finalized("max_messages"), 1.0),
        (&finalized("max_bytes"), 1.0),
        ("subsink_upload_duration_seconds_count{kind=object}", 3.0),
    ]);
    let s = until("every series as the run did", &|s| *s == want);
    assert_eq!(s, want);
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", log());
    let sum = summary(&out);
    assert_eq!(sum["messages_read"], 11);
    assert_eq!(sum["messages_written"], 8);
    assert_eq!(sum["messages_filtered"], 3);
    assert_eq!(sum["bad_lines"], 1);
    assert_eq!(objects_below(&bucket).len(), 3, "nothing was left open");
    assert_no_staging(&bucket);
}

/// `subsink run`'s flags, parsed by the library's own clap structs (those main.rs flattens).
#[derive(clap::Parser)]
struct RunFlags {
    #[command(flatten)]
    sub: subsink::cli::subscription::SubscriptionArgs,
    #[command(flatten)]
    source: subsink::registry::SourceArgs,
    #[command(flatten)]
    destination: subsink::cli::destination::DestinationArgs,
    #[command(flatten)]
    writer: subsink::cli::destination::WriterArgs,
    #[command(flatten)]
    service: subsink::cli::ServiceArgs,
}

type Shutdown = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The pipeline of `subsink run ARGS`, built from the flags as main.rs builds it, reporting into
/// `metrics`; `shutdown` stands for SIGTERM. Its summary.
async fn library_run(
    args: &[String],
    metrics: &Metrics,
    shutdown: Option<Shutdown>,
) -> subsink::app::RunSummary {
    use clap::Parser as _;
    let f =
        RunFlags::try_parse_from(std::iter::once("run".to_string()).chain(args.iter().cloned()))
            .unwrap();
    let subscription = f.sub.load().unwrap();
    let output = f.destination.sink_spec(&f.writer, &subscription).unwrap();
    let source = f.source.spec(&subscription, None).unwrap();
    let telemetry =
        subsink::telemetry::PipelineTelemetry::new(metrics, &Health::default(), &subscription.name);
    subsink::app::run(subsink::app::RunConfig {
        subscription,
        source,
        output,
        seed: None,
        clock: subsink::ids::Clock { fixed: None },
        resources: f.service.resources(),
        shutdown,
        shutdown_grace: f.service.shutdown_grace,
        telemetry,
    })
    .await
    .unwrap()
}

/// Two reasons a file is finalized that only the end of a run shows — `end_of_input` and
/// `shutdown` — and the Delta commit latency, read from `/metrics` once real pipelines (the
/// library's, built from `subsink run`'s flags as the binary builds them, whose endpoint ends with
/// the process) have ended: a file of 7 messages with `maxMessages` 5; a FIFO that stays open,
/// stopped like SIGTERM; a Delta table of 7 rows with `maxMessages` 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_finalized_at_the_end_of_input_and_on_shutdown_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Metrics::new();
    let server = subsink::telemetry::http::serve("127.0.0.1:0", metrics.clone(), Health::default())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    let series = |sub: &'static str| {
        let base = base.clone();
        async move {
            tokio::task::spawn_blocking(move || series_at(&base, sub))
                .await
                .unwrap()
        }
    };
    let finalized = |r: &str| format!("subsink_files_finalized_total{{reason={r}}}");
    let storage = |name: &str, bucket: &Path, max_messages: &str| -> Vec<String> {
        [
            "--limits",
            "extended",
            "--subscription-name",
            name,
            "--topic",
            "projects/demo-project/topics/events",
            "--cloud-storage-bucket",
            "bkt",
            "--cloud-storage-output-format",
            "text",
            "--cloud-storage-max-messages",
            max_messages,
            "--cloud-storage-max-duration",
            "3600s",
            "--bucket-url",
            &format!("file://{}", bucket.display()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };

    // The end of a file.
    let input = dir.path().join("in.ndjson");
    write_lines(
        &input,
        &(0..7).map(|i| numbered_message(i, 100)).collect::<Vec<_>>(),
    );
    let bucket = dir.path().join("eoi");
    let mut args = storage("projects/demo-project/subscriptions/eoi", &bucket, "5");
    args.extend(["--source".to_string(), input.display().to_string()]);
    let s = library_run(&args, &metrics, None).await;
    assert_eq!(s.messages_written, 7);
    let bytes = bytes_below(&bucket);
    assert_eq!(bytes, 7 * 101);
    assert_eq!(
        series("projects/demo-project/subscriptions/eoi").await,
        expected_series(&[
            ("subsink_messages_received_total", 7.0),
            ("subsink_messages_written_total", 7.0),
            ("subsink_messages_acked_total", 7.0),
            ("subsink_bytes_written_total", bytes as f64),
            (&finalized("max_messages"), 1.0),
            (&finalized("end_of_input"), 1.0),
            ("subsink_upload_duration_seconds_count{kind=object}", 2.0),
        ])
    );

    // A shutdown: three messages through a FIFO that stays open, then the signal.
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (close_tx, close_rx) = std::sync::mpsc::channel::<()>();
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            for i in 0..3 {
                writeln!(w, "{}", numbered_message(i, 100).to_json_line()).unwrap();
            }
            w.flush().unwrap();
            let _ = close_rx.recv();
        })
    };
    let bucket = dir.path().join("shutdown");
    let mut args = storage(
        "projects/demo-project/subscriptions/shutdown",
        &bucket,
        "100",
    );
    args.extend(["--source".to_string(), fifo.display().to_string()]);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = {
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let stop: Shutdown = Box::pin(async move {
                let _ = stop_rx.await;
            });
            library_run(&args, &metrics, Some(stop)).await
        })
    };
    let start = Instant::now();
    loop {
        let s = series("projects/demo-project/subscriptions/shutdown").await;
        if s.get("subsink_messages_received_total") == Some(&3.0) && s["subsink_open_files"] == 1.0
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_tx.send(()).unwrap();
    let s = run.await.unwrap();
    close_tx.send(()).unwrap();
    writer.join().unwrap();
    assert_eq!(s.messages_written, 3);
    let bytes = bytes_below(&bucket);
    assert_eq!(
        series("projects/demo-project/subscriptions/shutdown").await,
        expected_series(&[
            ("subsink_messages_received_total", 3.0),
            ("subsink_messages_written_total", 3.0),
            ("subsink_messages_acked_total", 3.0),
            ("subsink_bytes_written_total", bytes as f64),
            (&finalized("shutdown"), 1.0),
            ("subsink_upload_duration_seconds_count{kind=object}", 1.0),
        ])
    );

    // A Delta table: each file is a commit.
    let table_sub = dir.path().join("table-sub.json");
    std::fs::write(
        &table_sub,
        json!({
            "name": "projects/demo-project/subscriptions/table",
            "topic": "projects/demo-project/topics/events",
            "subsink": {"limits": "extended", "table": {"maxMessages": "5"}},
            "bigqueryConfig": {"table": "demo-project.analytics.events"},
        })
        .to_string(),
    )
    .unwrap();
    let table = dir.path().join("table");
    let args: Vec<String> = vec![
        "--subscription".into(),
        table_sub.display().to_string(),
        "--source".into(),
        input.display().to_string(),
        "--table-url".into(),
        format!("file://{}", table.display()),
    ];
    let s = library_run(&args, &metrics, None).await;
    assert_eq!(s.messages_written, 7);
    let got = series("projects/demo-project/subscriptions/table").await;
    let commits = std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".json")
        })
        .count();
    assert_eq!(commits, 3, "the table's creation and two commits");
    assert_eq!(
        got,
        expected_series(&[
            ("subsink_messages_received_total", 7.0),
            ("subsink_messages_written_total", 7.0),
            ("subsink_messages_acked_total", 7.0),
            (
                "subsink_bytes_written_total",
                got["subsink_bytes_written_total"]
            ),
            (&finalized("max_messages"), 1.0),
            (&finalized("end_of_input"), 1.0),
            ("subsink_upload_duration_seconds_count{kind=commit}", 2.0),
        ])
    );
    let parquet: u64 = files_below(&table)
        .iter()
        .filter(|f| f.ends_with(".parquet"))
        .map(|f| std::fs::metadata(table.join(f)).unwrap().len())
        .sum();
    assert_eq!(got["subsink_bytes_written_total"], parquet as f64);
    server.stop().await;
}

/// A Pub/Sub run through the recording proxy, which answers the first StreamingPull UNAVAILABLE:
/// two good messages wait in an open file (`maxDuration` 6 s) under lease, and one that breaks
/// the topic schema fails each of its five deliveries — nacked four times, then published to the
/// dead-letter topic. Every series is compared with what the proxy saw on the wire.
#[test]
fn metrics_of_a_real_pubsub_run_match_what_the_proxy_saw() {
    use util::pubsub::{sub, topic, Scenario};
    let sc = Scenario::start(|s| s.dead_letter = Some((topic("dead-letters"), 5)));
    let proxy = sc.proxy(false);
    proxy.fail_next("StreamingPull", &["UNAVAILABLE"]);
    let good = |id: i64| Message {
        data: format!(
            r#"{{"id":{id},"name":"n","tags":[],"amount":null,"kind":"CLICK","ok":true}}"#
        )
        .into_bytes()
        .into(),
        ..Default::default()
    };
    let bad = Message {
        data: br#"{"id":"not a number"}"#.to_vec().into(),
        ..Default::default()
    };
    sc.env.publish(&topic("events"), &[good(0), good(1), bad]);
    let cfg = sc.config(
        json!({"maxDuration": "6s", "avroConfig": {"writeMetadata": true, "useTopicSchema": true}}),
        json!({"deadLetterPolicy": {"deadLetterTopic": topic("dead-letters"), "maxDeliveryAttempts": 5}}),
    );
    let port = free_port();
    let schema = root().join("fixtures/input/event.avsc");
    let mut worker = sc.worker_via(
        &proxy,
        &cfg,
        &[
            "--topic-schema",
            schema.to_str().unwrap(),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ],
    );
    wait_for_port(port, "subsink", &mut worker);
    let base = format!("http://127.0.0.1:{port}");
    let name = sub("archive");
    let series = || series_at(&base, &name);
    let until = |what: &str, f: &dyn Fn(&std::collections::BTreeMap<String, f64>) -> bool| {
        poll(Duration::from_secs(60), Duration::from_millis(200), || {
            let s = series();
            f(&s)
                .then_some(s.clone())
                .ok_or_else(|| format!("{what}: {s:?}"))
        })
    };

    // The good messages wait in the open file: the gauges show them.
    let s = until("the open file", &|s| {
        s["subsink_open_files"] == 1.0 && s["subsink_oldest_unacked_age_seconds"] >= 1.0
    });
    assert!(s["subsink_buffered_bytes"] > 0.0, "{s:?}");
    assert_eq!(s["subsink_messages_written_total"], 0.0);
    let s = until("written and dead-lettered", &|s| {
        s["subsink_messages_written_total"] == 2.0
            && s["subsink_messages_dead_lettered_total"] == 1.0
            && s["subsink_messages_acked_total"] == 2.0
            && s["subsink_open_files"] == 0.0
    });
    let calls = proxy.calls();
    assert_eq!(
        proxy.faults(),
        [("StreamingPull".to_string(), "UNAVAILABLE".to_string())]
    );
    let dead_letters: u64 = calls
        .publishes
        .iter()
        .filter(|(_, t, _)| t == &topic("dead-letters"))
        .map(|(_, _, n)| n)
        .sum();
    let objects = objects_below(&sc.bucket);
    let bytes = objects
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum::<u64>();
    assert_eq!(objects.len(), 1);
    assert_eq!(calls.deliveries.len(), 7, "two good, five of the bad one");
    assert_eq!(calls.nacked().values().sum::<usize>(), 4);
    assert_eq!(dead_letters, 1);
    assert_eq!(
        s,
        expected_series(&[
            (
                "subsink_messages_received_total",
                calls.deliveries.len() as f64
            ),
            ("subsink_messages_written_total", 2.0),
            ("subsink_messages_acked_total", 2.0),
            ("subsink_messages_nacked_total", 4.0),
            ("subsink_messages_dead_lettered_total", dead_letters as f64),
            ("subsink_messages_bad_total", 5.0),
            ("subsink_bytes_written_total", bytes as f64),
            ("subsink_files_finalized_total{reason=max_duration}", 1.0),
            ("subsink_upload_duration_seconds_count{kind=object}", 1.0),
            ("subsink_retries_total{kind=stream}", 1.0),
        ])
    );
    // The two good messages and the dead-lettered one were acked, on the wire.
    assert_eq!(calls.acked().len(), 3, "{:?}", calls.acked());
    let (summary, _) = terminate(worker, Duration::from_secs(15));
    assert_eq!(summary["messages_acked"], 2);
    assert_eq!(summary["messages_dead_lettered"], 1);
}

/// An upload retried in a real run: the store (moto behind the test proxy) answers every write
/// 503 until the run logs that it retries the put; then it passes. `subsink_retries_total
/// {kind="upload"}` counts each retry the log names, and the object is written.
#[test]
fn an_upload_retried_in_a_real_run_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    s3.create_bucket("bkt");
    let proxy = util::proxy::S3Proxy::start(&s3, dir.path());
    proxy.set(json!({"mode": "unavailable"}));
    let port = free_port();
    let log_path = dir.path().join("log");
    let mut child = servers::guard(
        storage_run_cmd("bkt", "text")
            .args(["--cloud-storage-max-messages", "2", "--source", "-"])
            .args(["--bucket-url", "s3://bkt", "--upload-retry-for", "30s"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .envs(proxy.env())
            .env("SUBSINK_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log_path).unwrap()),
    )
    .spawn()
    .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let retries_logged = || log().matches("put failed; retrying").count();
    wait_for_port(port, "subsink", &mut child);
    let base = format!("http://127.0.0.1:{port}");
    let mut stdin = child.stdin.take().unwrap();
    for i in 0..2 {
        writeln!(stdin, "{}", numbered_message(i, 100).to_json_line()).unwrap();
    }
    stdin.flush().unwrap();
    poll(Duration::from_secs(60), Duration::from_millis(100), || {
        (retries_logged() > 0)
            .then_some(())
            .ok_or_else(|| format!("no retry logged: {}", log()))
    });
    proxy.set(json!({"mode": "pass"}));
    let s = poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let s = series_at(&base, SUB);
        (s["subsink_messages_written_total"] == 2.0)
            .then_some(s.clone())
            .ok_or_else(|| format!("{s:?}: {}", log()))
    });
    let refused = proxy
        .writes()
        .iter()
        .filter(|w| w.status == Some(503))
        .count();
    assert!(refused > 0);
    assert_eq!(
        s["subsink_retries_total{kind=upload}"],
        retries_logged() as f64,
        "{}",
        log()
    );
    assert_eq!(s["subsink_upload_duration_seconds_count{kind=object}"], 1.0);
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", log());
    assert_eq!(s3.list("bkt").len(), 1);
}

/// Dead-letter publishes are not retried (docs/operating.md, so `subsink_retries_total` has no
/// kind for them): the recording proxy answers the first Publish UNAVAILABLE, and the message, on
/// its last allowed attempt, is nacked instead. Pub/Sub's own dead-letter policy (the emulator
/// applies it too) then forwards it to the dead-letter topic: not delivered again, not lost.
#[test]
fn a_failed_dead_letter_publish_is_nacked_not_retried() {
    use util::pubsub::{sub, topic, Scenario};
    let sc = Scenario::start(|s| s.dead_letter = Some((topic("dead-letters"), 5)));
    sc.env.subscribe(&sub("dlq-sub"), &topic("dead-letters"));
    let proxy = sc.proxy(false);
    proxy.fail_next("Publish", &["UNAVAILABLE"]);
    let bad = Message {
        data: br#"{"id":"not a number"}"#.to_vec().into(),
        ..Default::default()
    };
    let ids = sc.env.publish(&topic("events"), &[bad]);
    let cfg = sc.config(
        json!({"maxDuration": "2s", "avroConfig": {"writeMetadata": true, "useTopicSchema": true}}),
        json!({"deadLetterPolicy": {"deadLetterTopic": topic("dead-letters"), "maxDeliveryAttempts": 5}}),
    );
    let port = free_port();
    let schema = root().join("fixtures/input/event.avsc");
    let mut worker = sc.worker_via(
        &proxy,
        &cfg,
        &[
            "--topic-schema",
            schema.to_str().unwrap(),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ],
    );
    wait_for_port(port, "subsink", &mut worker);
    let dead = sc
        .env
        .drain_until_some(&sub("dlq-sub"), Duration::from_secs(60));
    assert_eq!(dead.len(), 1);
    assert_eq!(&dead[0].data[..], br#"{"id":"not a number"}"#);
    let base = format!("http://127.0.0.1:{port}");
    let name = sub("archive");
    let s = poll(Duration::from_secs(30), Duration::from_millis(200), || {
        let s = series_at(&base, &name);
        (s["subsink_messages_nacked_total"] == 5.0)
            .then_some(s.clone())
            .ok_or_else(|| format!("{s:?}"))
    });
    let calls = proxy.calls();
    assert_eq!(
        proxy.faults(),
        [("Publish".to_string(), "UNAVAILABLE".to_string())],
        "one publish, refused, and not tried again"
    );
    assert!(calls.publishes.is_empty(), "{:?}", calls.publishes);
    assert_eq!(calls.delivered()[&ids[0]], 5);
    assert_eq!(calls.nacked()[&ids[0]], 5, "the fifth attempt nacked too");
    assert!(calls.acked().is_empty(), "{:?}", calls.acked());
    assert_eq!(s["subsink_messages_bad_total"], 5.0, "{s:?}");
    assert_eq!(s["subsink_messages_dead_lettered_total"], 0.0, "{s:?}");
    for k in RetryKind::ALL {
        assert_eq!(
            s[&format!("subsink_retries_total{{kind={}}}", k.as_str())],
            0.0,
            "{s:?}"
        );
    }
    let (summary, _) = terminate(worker, Duration::from_secs(15));
    assert_eq!(summary["messages_dead_lettered"], 0);
}
