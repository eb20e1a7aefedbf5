//! The push source's local spool (issue 22) end to end, with the real binary: a load generator
//! pushes while the worker is killed with SIGKILL at random moments and restarted on the same spool
//! — every message answered 2xx is in the bucket, exactly once unless its request was repeated
//! after a kill; a spool that cannot be written answers 503 and turns /readyz 503; a full spool
//! answers 429; metrics show the spool; the Pub/Sub emulator's 500 pushes with maxDuration 60 s are
//! all written well within maxDuration + 60 s.

mod util;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A storage subscription (extended limits) whose files close after `max_duration`, Avro with
/// metadata.
fn subscription(dir: &Path, max_duration: &str) -> PathBuf {
    let p = dir.join("sub.json");
    std::fs::write(
        &p,
        format!(
            r#"{{"name":"projects/p/subscriptions/export","topic":"projects/p/topics/events",
                "ackDeadlineSeconds":10,"subsink":{{"limits":"extended"}},
                "cloudStorageConfig":{{"bucket":"bkt","filenameSuffix":".avro",
                "maxDuration":"{max_duration}","avroConfig":{{"writeMetadata":true}}}}}}"#
        ),
    )
    .unwrap();
    p
}

/// The worker with a spool in `dir/spool`, writing to `dir/bucket`, listening on `port`.
fn worker(dir: &Path, port: u16, max_duration: &str, extra: &[&str]) -> std::process::Command {
    let sub = subscription(dir, max_duration);
    let mut c = util::subsink();
    c.args(["run", "--source", "push", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--subscription")
        .arg(&sub)
        .arg("--bucket-url")
        .arg(format!("file://{}", dir.join("bucket").display()))
        .arg("--spool-dir")
        .arg(dir.join("spool"))
        .args(extra)
        .stdout(Stdio::piped());
    c
}

fn wait_listening(port: u16, child: &mut Child) {
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("the worker exited ({s}) before it listened");
        }
        assert!(t.elapsed() < Duration::from_secs(60), "never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(cmd: &mut std::process::Command, port: u16) -> Child {
    let mut child = util::process::spawn_draining(cmd);
    wait_listening(port, &mut child);
    child
}

/// SIGTERM; the summary and stderr.
fn stop(child: Child) -> (serde_json::Value, String) {
    util::process::signal(&child, libc::SIGTERM);
    let o = util::process::output(child);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{}: {err}", o.status);
    let summary = serde_json::from_str(out.lines().last().unwrap_or("null")).unwrap_or_default();
    (summary, err)
}

/// Message ids → how many records of the bucket carry them (fastavro).
fn written(dir: &Path) -> HashMap<String, usize> {
    let bucket = dir.join("bucket");
    let mut count = HashMap::new();
    if !bucket.exists() {
        return count;
    }
    let files: Vec<_> = util::files_below(&bucket)
        .into_iter()
        .filter(|f| f.ends_with(".avro"))
        .map(|f| bucket.join(f))
        .collect();
    for r in util::avro_records(&files) {
        *count
            .entry(r["message_id"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    count
}

/// A wrapped push request for message `id` with `pad` bytes of data.
fn request(id: &str, data_b64: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"message":{{"data":"{data_b64}","messageId":"{id}","publishTime":"2026-12-01T00:00:00Z","attributes":{{"n":"{id}"}}}},"subscription":"projects/p/subscriptions/push"}}"#
    );
    format!(
        "POST /push HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// One keep-alive connection: send a request, read the status (and skip any body). `None` when
/// the connection broke (the worker died): no answer.
fn roundtrip(conn: &mut Option<BufReader<TcpStream>>, port: u16, req: &[u8]) -> Option<u16> {
    if conn.is_none() {
        let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        s.set_nodelay(true).ok()?;
        *conn = Some(BufReader::new(s));
    }
    let r = conn.as_mut().unwrap();
    let ok = (|| -> std::io::Result<u16> {
        r.get_mut().write_all(req)?;
        let mut line = String::new();
        r.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status in {line:?}")))?;
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        Ok(status)
    })();
    match ok {
        Ok(s) => Some(s),
        Err(_) => {
            *conn = None;
            None
        }
    }
}

/// What the load generator saw, per message id: every status, in order (0 = no answer).
type Seen = Arc<Mutex<HashMap<String, Vec<u16>>>>;

/// `threads` pushers over `total` messages (ids `m{i}`), each retrying a message until it is
/// answered 2xx — no answer (the worker was killed), 429 or 503 are retried, as Pub/Sub does.
fn load(
    port: u16,
    total: usize,
    threads: usize,
    acked: Arc<AtomicU64>,
    seen: Seen,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    let data = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, vec![b'x'; 200]);
    (0..threads)
        .map(|t| {
            let (acked, seen, stop, data) =
                (acked.clone(), seen.clone(), stop.clone(), data.clone());
            std::thread::spawn(move || {
                let mut conn = None;
                for i in (t..total).step_by(threads) {
                    let id = format!("m{i}");
                    let req = request(&id, &data);
                    loop {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let status = roundtrip(&mut conn, port, &req).unwrap_or(0);
                        seen.lock()
                            .unwrap()
                            .entry(id.clone())
                            .or_default()
                            .push(status);
                        if (200..300).contains(&status) {
                            acked.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(if status == 0 { 20 } else { 5 }));
                    }
                }
            })
        })
        .collect()
}

/// SIGKILL at random moments while a load generator pushes (`SUBSINK_SPOOL_KILL_MESSAGES`,
/// default 50,000, over 16 connections), each asserted mid-run; a restart on the same spool after
/// each. At the end every message answered 2xx is in the bucket: exactly once when its first
/// request was answered 2xx; a message whose request went unanswered (the kill) was pushed again
/// and may be there twice — counted and printed, the at-least-once the push contract allows.
#[test]
fn kill_9_mid_run_loses_no_acked_message_and_duplicates_none_answered_at_once() {
    let total = util::env_or("SUBSINK_SPOOL_KILL_MESSAGES", 50_000);
    let kills = 3;
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    // Small segments: positions span many of them, and settled ones are deleted during the run.
    let extra = ["--spool-segment-bytes", "256KiB"];
    let mut child = start(&mut worker(dir.path(), port, "2s", &extra), port);
    let acked = Arc::new(AtomicU64::new(0));
    let seen: Seen = Default::default();
    let halt = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let pushers = load(port, total, 16, acked.clone(), seen.clone(), halt.clone());
    let mut seed = 0x5eed_0022_u64 ^ std::process::id() as u64;
    let mut marks: Vec<u64> = (0..kills)
        .map(|_| (total as u64 / 10) + util::process::xorshift(&mut seed) % (total as u64 * 7 / 10))
        .collect();
    marks.sort();
    for (k, mark) in marks.iter().enumerate() {
        while acked.load(Ordering::Relaxed) < *mark {
            assert!(child.try_wait().unwrap().is_none(), "the worker died");
            assert!(
                t0.elapsed() < Duration::from_secs(600),
                "kill {k}: too slow"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(
            util::process::xorshift(&mut seed) % 30,
        ));
        let at = acked.load(Ordering::Relaxed);
        assert!(
            (at as usize) < total,
            "kill {k} came after the run had finished ({at} of {total} acked)"
        );
        util::process::kill_9(child);
        eprintln!("kill {k}: at {at} of {total} acked");
        child = start(&mut worker(dir.path(), port, "2s", &extra), port);
    }
    for p in pushers {
        p.join().unwrap();
    }
    let pushed_in = t0.elapsed();
    assert_eq!(acked.load(Ordering::Relaxed) as usize, total);
    // Everything acked is on disk; the export catches up, then a SIGTERM ends the run.
    util::process::poll(Duration::from_secs(300), Duration::from_secs(1), || {
        let n = written(dir.path()).len();
        if n >= total {
            Ok(())
        } else {
            Err(format!("{n} of {total} distinct messages written"))
        }
    });
    let (_summary, _err) = stop(child);
    let got = written(dir.path());
    let seen = seen.lock().unwrap();
    let (mut repeated, mut twice) = (0, 0);
    for i in 0..total {
        let id = format!("m{i}");
        let statuses = &seen[&id];
        let n = got.get(&id).copied().unwrap_or(0);
        assert!(
            n >= 1,
            "{id} was answered {statuses:?} and is not in the bucket"
        );
        let unanswered = statuses.contains(&0);
        if unanswered {
            repeated += 1;
        }
        if n > 1 {
            twice += 1;
            assert!(
                unanswered,
                "{id} answered {statuses:?} without a repeat, and written {n} times"
            );
        }
    }
    assert_eq!(got.len(), total, "nothing but the pushed messages");
    // Settled segments are deleted: what is left is the newest few.
    let segments = std::fs::read_dir(dir.path().join("spool"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "seg")
        })
        .count();
    assert!(segments <= 3, "{segments} segments left after the run");
    eprintln!(
        "{total} messages pushed in {pushed_in:?} with {kills} kills; {repeated} requests unanswered \
         (pushed again), {twice} messages written twice"
    );
}

/// The worker with its file size limited to `bytes` (RLIMIT_FSIZE, SIGXFSZ ignored, which
/// survives exec): past it every write fails with EFBIG, as on a full disk.
fn with_file_size_limit(cmd: &mut std::process::Command, bytes: u64) {
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn post(port: u16, id: &str) -> u16 {
    let mut conn = None;
    roundtrip(&mut conn, port, &request(id, "aGk=")).expect("an answer")
}

#[test]
fn a_spool_that_cannot_be_written_answers_503_and_turns_readyz_503() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let metrics = util::free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let mut cmd = worker(
        dir.path(),
        port,
        "3600s",
        &["--metrics-addr", &addr, "--spool-segment-bytes", "1MiB"],
    );
    with_file_size_limit(&mut cmd, 4096);
    let child = start(&mut cmd, port);
    let base = format!("http://{addr}");
    util::process::poll(Duration::from_secs(20), Duration::from_millis(100), || {
        match util::http::status(&base, "/readyz") {
            (200, _) => Ok(()),
            other => Err(format!("not ready: {other:?}")),
        }
    });
    // Until the 4 KiB limit: answered 204; then the append fails: 503 at once, and readiness says
    // why.
    let mut codes = Vec::new();
    for i in 0..200 {
        codes.push(post(port, &format!("m{i}")));
        if codes.last() == Some(&503) {
            break;
        }
    }
    assert!(
        codes.len() > 1 && codes[..codes.len() - 1].iter().all(|c| *c == 204),
        "{codes:?}"
    );
    assert_eq!(codes.last(), Some(&503), "{codes:?}");
    let t = Instant::now();
    assert_eq!(post(port, "again"), 503);
    assert!(t.elapsed() < Duration::from_millis(500), "not at once");
    // Readiness is reported every second.
    let body = util::process::poll(Duration::from_secs(4), Duration::from_millis(100), || {
        match util::http::status(&base, "/readyz") {
            (503, body) => Ok(body),
            other => Err(format!("still ready: {other:?}")),
        }
    });
    assert!(
        body.contains("spool") && body.contains("cannot be written"),
        "{body}"
    );
    drop(stop_kill(child));
}

fn stop_kill(child: Child) -> String {
    util::process::kill_9(child)
}

#[test]
fn a_full_spool_answers_429_and_metrics_show_its_bytes_segments_and_oldest_age() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let metrics = util::free_port();
    let addr = format!("127.0.0.1:{metrics}");
    // The files close after 8 s only: until then nothing is settled, the spool only grows.
    let child = start(
        &mut worker(
            dir.path(),
            port,
            "8s",
            &[
                "--metrics-addr",
                &addr,
                "--spool-max-bytes",
                "2KiB",
                "--spool-segment-bytes",
                "1KiB",
            ],
        ),
        port,
    );
    let mut codes = Vec::new();
    for i in 0..40 {
        codes.push(post(port, &format!("m{i}")));
        if codes.last() == Some(&429) {
            break;
        }
    }
    assert!(
        codes[..codes.len() - 1].iter().all(|c| *c == 204),
        "{codes:?}"
    );
    assert_eq!(codes.last(), Some(&429), "{codes:?}");
    let accepted = codes.len() - 1;
    // The gauges are set every second: past 2.5 s the oldest message is at least 1 s old.
    std::thread::sleep(Duration::from_millis(2500));
    let base = format!("http://{addr}");
    let labels = serde_json::json!({"subscription": "projects/p/subscriptions/export"});
    let page = util::http::get(&[format!("{base}/metrics")]).remove(0);
    let bytes = util::http::sample(&page, "subsink_spool_bytes", "subsink_spool_bytes", &labels);
    let segments = util::http::sample(
        &page,
        "subsink_spool_segments",
        "subsink_spool_segments",
        &labels,
    );
    let age = util::http::sample(
        &page,
        "subsink_spool_oldest_message_age_seconds",
        "subsink_spool_oldest_message_age_seconds",
        &labels,
    );
    let on_disk: u64 = std::fs::read_dir(dir.path().join("spool"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(bytes, Some(on_disk as f64), "{page}");
    assert!(on_disk <= 2048, "{on_disk}");
    assert!(segments.unwrap() >= 2.0, "{segments:?}");
    assert!(age.unwrap() >= 1.0, "{age:?}");
    // Issue 34, point 8: once the export catches up (the file closes at 8 s and is durable, its
    // segments are deleted), requests are accepted again — 429s, then 2xx.
    let t = Instant::now();
    let mut later = Vec::new();
    util::process::poll(Duration::from_secs(60), Duration::from_millis(200), || {
        later.push(post(port, "after"));
        match later.last() {
            Some(204) => Ok(()),
            _ => Err(format!("answered {later:?} since the spool was full")),
        }
    });
    assert!(
        later[..later.len() - 1].iter().all(|c| *c == 429),
        "{later:?}"
    );
    eprintln!(
        "accepted again {:?} after the metrics, after {} more 429s",
        t.elapsed(),
        later.len() - 1
    );
    // SIGTERM writes the open file: every accepted message is there.
    let (_summary, err) = stop(child);
    let got = written(dir.path());
    assert_eq!(got.len(), accepted + 1, "{err}");
    assert_eq!(got.get("after"), Some(&1), "{got:?}");
}

/// The issue's scenario: the emulator pushes 500 messages to a subscription whose files close
/// after `maxDuration` 60 s (longer than the 10 s ack deadline: allowed with a spool). Every
/// message is written within maxDuration + 60 s of the publish, once each, and the emulator holds
/// nothing unacked afterwards.
#[test]
fn emulator_pushes_500_messages_and_all_are_written_within_max_duration_plus_60s() {
    let emu = util::emulator::Emulator::start();
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let child = start(&mut worker(dir.path(), port, "60s", &[]), port);
    let t0 = Instant::now();
    util::venv_python(
        [
            "-c",
            &format!(
                r#"
from google.cloud import pubsub_v1
pub = pubsub_v1.PublisherClient()
sub = pubsub_v1.SubscriberClient()
pub.create_topic(name="projects/p/topics/events")
sub.create_subscription(request={{"name": "projects/p/subscriptions/push", "topic": "projects/p/topics/events",
    "ack_deadline_seconds": 10, "push_config": {{"push_endpoint": "http://127.0.0.1:{port}/push"}}}})
futures = [pub.publish("projects/p/topics/events", f"message {{i}}".encode(), n=str(i)) for i in range(500)]
[f.result() for f in futures]
"#
            ),
        ],
        &[("PUBSUB_EMULATOR_HOST", emu.host())],
    );
    let within = Duration::from_secs(120);
    util::process::poll(within, Duration::from_millis(500), || {
        let n = written(dir.path()).len();
        if n >= 500 {
            Ok(())
        } else {
            Err(format!(
                "{n} of 500 written after {:?} (maxDuration 60 s + 60 s)",
                t0.elapsed()
            ))
        }
    });
    let took = t0.elapsed();
    // Nothing left unacked: the push subscription made a pull one and drained past its deadline.
    util::venv_python(
        [
            "-c",
            r#"
from google.cloud import pubsub_v1
pubsub_v1.SubscriberClient().modify_push_config(request={"subscription": "projects/p/subscriptions/push", "push_config": {}})
"#,
        ],
        &[("PUBSUB_EMULATOR_HOST", emu.host())],
    );
    let left = util::pubsub::PubsubEnv::on(emu)
        .drain("projects/p/subscriptions/push", Duration::from_secs(12));
    assert!(left.is_empty(), "not acked by the pushes: {}", left.len());
    let (summary, err) = stop(child);
    let got = written(dir.path());
    assert_eq!(got.len(), 500, "{summary}\n{err}");
    assert!(got.values().all(|n| *n == 1), "a message written twice");
    eprintln!("500 pushed messages written {took:?} after the publish");
}

/// A push worker for subscription `sub` (JSON, written to `dir/sub.json`), spooling in
/// `dir/spool`, with `dest` (the destination's flags) and `extra`.
fn worker_for(
    dir: &Path,
    port: u16,
    sub: &serde_json::Value,
    dest: &[String],
) -> std::process::Command {
    let p = dir.join("sub.json");
    std::fs::write(&p, sub.to_string()).unwrap();
    let mut c = util::subsink();
    c.args(["run", "--source", "push", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--subscription")
        .arg(&p)
        .args(dest)
        .arg("--spool-dir")
        .arg(dir.join("spool"))
        .stdout(Stdio::piped());
    c
}

/// A wrapped push request: message `id` with payload `data` and attributes `attrs` (JSON object).
fn request_with(id: &str, data: &[u8], attrs: &serde_json::Value) -> Vec<u8> {
    let body = serde_json::json!({
        "message": {
            "data": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, data),
            "messageId": id,
            "publishTime": "2026-12-01T00:00:00Z",
            "attributes": attrs,
        },
        "subscription": "projects/p/subscriptions/push",
    })
    .to_string();
    format!(
        "POST /push HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn post_with(port: u16, id: &str, data: &[u8], attrs: serde_json::Value) -> u16 {
    let mut conn = None;
    roundtrip(&mut conn, port, &request_with(id, data, &attrs)).expect("an answer")
}

/// Every byte of the spool's segments (what was spooled so far).
fn spooled_bytes(dir: &Path) -> String {
    let mut all = Vec::new();
    for e in std::fs::read_dir(dir.join("spool")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "seg") {
            all.extend(std::fs::read(p).unwrap());
        }
    }
    String::from_utf8_lossy(&all).into_owned()
}

/// Point 1 of issue 22: the filter and the transforms run before a message is spooled. A message
/// the filter does not match and one a UDF returns `null` for are answered 204 and never spooled
/// nor written, and count as filtered (summary and `subsink_messages_filtered_total`); one the
/// UDF throws on is answered an error and never spooled; the good ones next to them are written
/// once, as transformed (once: the export does not transform them again).
#[test]
fn filter_and_transforms_run_before_the_spool_and_filtered_requests_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let metrics = util::free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let code = r#"function shape(message, metadata) {
        if (message.data === "throw") { throw new Error("refused by the UDF"); }
        if (message.data === "null") { return null; }
        message.attributes["times"] = (message.attributes["times"] || "") + "x";
        return message;
    }"#;
    let sub = serde_json::json!({
        "name": "projects/p/subscriptions/export", "topic": "projects/p/topics/events",
        "ackDeadlineSeconds": 10, "subsink": {"limits": "extended"},
        "filter": "NOT attributes:drop",
        "messageTransforms": [{"javascriptUdf": {"functionName": "shape", "code": code}}],
        "cloudStorageConfig": {"bucket": "bkt", "filenameSuffix": ".avro", "maxDuration": "3600s",
            "avroConfig": {"writeMetadata": true}},
    });
    let dest = [
        "--bucket-url".to_string(),
        format!("file://{}", dir.path().join("bucket").display()),
        "--metrics-addr".to_string(),
        addr.clone(),
    ];
    let child = start(&mut worker_for(dir.path(), port, &sub, &dest), port);
    let none = serde_json::json!({});
    assert_eq!(post_with(port, "good-1", b"one", none.clone()), 204);
    assert_eq!(
        post_with(port, "dropped", b"two", serde_json::json!({"drop": "1"})),
        204
    );
    assert_eq!(post_with(port, "nulled", b"null", none.clone()), 204);
    let refused = post_with(port, "thrown", b"throw", none.clone());
    assert_eq!(refused, 422, "a message the UDF throws on");
    // An envelope that is not one (its data is no base64) is refused first: 400.
    let body = r#"{"message":{"data":"%%%","messageId":"bad-envelope"},"subscription":"projects/p/subscriptions/push"}"#;
    let req = format!(
        "POST /push HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(roundtrip(&mut None, port, req.as_bytes()), Some(400));
    assert_eq!(post_with(port, "good-2", b"three", none.clone()), 204);
    let spooled = spooled_bytes(dir.path());
    for id in ["good-1", "good-2"] {
        assert!(spooled.contains(id), "{id} not spooled: {spooled}");
    }
    for id in ["dropped", "nulled", "thrown", "bad-envelope"] {
        assert!(!spooled.contains(id), "{id} spooled: {spooled}");
    }
    // Counted at once (the metrics are set every second), before any file is written.
    let base = format!("http://{addr}");
    let labels = serde_json::json!({"subscription": "projects/p/subscriptions/export"});
    util::process::poll(Duration::from_secs(10), Duration::from_millis(200), || {
        match util::http::metric(
            &base,
            "subsink_messages_filtered",
            "subsink_messages_filtered_total",
            &labels,
        ) {
            Some(2.0) => Ok(()),
            other => Err(format!("subsink_messages_filtered_total {other:?}")),
        }
    });
    let (summary, err) = stop(child);
    assert_eq!(summary["messages_filtered"], 2, "{summary}\n{err}");
    let bucket = dir.path().join("bucket");
    let files: Vec<_> = util::files_below(&bucket)
        .into_iter()
        .map(|f| bucket.join(f))
        .collect();
    let records = util::avro_records(&files);
    let mut got: Vec<(String, String)> = records
        .iter()
        .map(|r| {
            (
                r["message_id"].as_str().unwrap().to_string(),
                r["attributes"]["times"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("good-1".to_string(), "x".to_string()),
            ("good-2".to_string(), "x".to_string())
        ],
        "{records:?}"
    );
}

/// Point 1 of issue 22: the topic-schema check runs before a message is spooled. A payload that
/// is not a record of the topic's schema is answered an error and never spooled; the good ones
/// next to it are written.
#[test]
fn a_message_off_the_topic_schema_is_refused_before_the_spool() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let schema = dir.path().join("event.avsc");
    std::fs::write(
        &schema,
        r#"{"type":"record","name":"Event","fields":[{"name":"id","type":"long"},{"name":"name","type":"string"}]}"#,
    )
    .unwrap();
    let sub = serde_json::json!({
        "name": "projects/p/subscriptions/export", "topic": "projects/p/topics/events",
        "ackDeadlineSeconds": 10, "subsink": {"limits": "extended"},
        "cloudStorageConfig": {"bucket": "bkt", "filenameSuffix": ".avro", "maxDuration": "3600s",
            "avroConfig": {"writeMetadata": true, "useTopicSchema": true}},
    });
    let dest = [
        "--bucket-url".to_string(),
        format!("file://{}", dir.path().join("bucket").display()),
        "--topic-schema".to_string(),
        schema.display().to_string(),
    ];
    let child = start(&mut worker_for(dir.path(), port, &sub, &dest), port);
    let none = serde_json::json!({});
    assert_eq!(
        post_with(port, "good-1", br#"{"id":1,"name":"a"}"#, none.clone()),
        204
    );
    let refused = post_with(port, "off-schema", br#"{"id":"one"}"#, none.clone());
    assert_eq!(refused, 422, "a message off the topic schema");
    assert_eq!(
        post_with(port, "good-2", br#"{"id":2,"name":"b"}"#, none.clone()),
        204
    );
    let spooled = spooled_bytes(dir.path());
    assert!(!spooled.contains("off-schema"), "{spooled}");
    let (summary, err) = stop(child);
    let got = written(dir.path());
    let mut ids: Vec<_> = got.keys().cloned().collect();
    ids.sort();
    assert_eq!(ids, ["good-1", "good-2"], "{summary}\n{err}");
}

/// Point 1 of issue 22: the table-row check runs before a message is spooled. With
/// `useTableSchema`, a payload whose field does not fit its column is answered an error and never
/// spooled; the good ones next to it are rows of the table.
#[test]
fn a_message_that_is_no_row_of_the_table_is_refused_before_the_spool() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"[{"name":"id","type":"INTEGER","mode":"REQUIRED"},{"name":"name","type":"STRING"}]"#,
    )
    .unwrap();
    let table = dir.path().join("table");
    let sub = serde_json::json!({
        "name": "projects/p/subscriptions/export", "topic": "projects/p/topics/events",
        "ackDeadlineSeconds": 10,
        "bigqueryConfig": {"table": "p.d.t", "useTableSchema": true, "writeMetadata": true},
    });
    let dest = [
        "--table-url".to_string(),
        format!("file://{}", table.display()),
        "--table-schema".to_string(),
        schema.display().to_string(),
    ];
    let child = start(&mut worker_for(dir.path(), port, &sub, &dest), port);
    let none = serde_json::json!({});
    assert_eq!(
        post_with(port, "good-1", br#"{"id":1,"name":"a"}"#, none.clone()),
        204
    );
    let refused = post_with(port, "no-row", br#"{"id":"one","name":"b"}"#, none.clone());
    assert_eq!(refused, 422, "a message that is no row");
    assert_eq!(
        post_with(port, "good-2", br#"{"id":2,"name":"c"}"#, none.clone()),
        204
    );
    let spooled = spooled_bytes(dir.path());
    assert!(!spooled.contains("no-row"), "{spooled}");
    let (summary, err) = stop(child);
    assert_eq!(summary["messages_written"], 2, "{summary}\n{err}");
    let ids = util::python_json(
        r#"
import json, os, sys, deltalake
rows = deltalake.DeltaTable(sys.argv[1]).to_pyarrow_table().to_pylist()
print(json.dumps(sorted(r["message_id"] for r in rows)))
sys.stdout.flush()
os._exit(0)
"#,
        table.to_str().unwrap(),
        &[],
    );
    assert_eq!(ids, serde_json::json!(["good-1", "good-2"]));
}

/// Point 1 of issue 22, after the 2xx: a row the table rejects once its file was handed over
/// (BigQuery's own rule: the table says INT64 where the schema subsink was given says STRING)
/// goes to the local dead-letter file (by default in the spool's folder), never blocks the
/// spool: the other rows are written, and the segment that held it is deleted.
#[test]
fn a_row_the_table_rejects_after_the_2xx_is_dead_lettered_and_its_segment_deleted() {
    let _serial = util::bigquery::serial();
    let bq = util::bigquery::shared_bq();
    bq.table(
        "spooldl",
        "t",
        serde_json::json!([{"name": "id", "type": "STRING"}, {"name": "n", "type": "INT64"}]),
    );
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"[{"name":"id","type":"STRING"},{"name":"n","type":"STRING"}]"#,
    )
    .unwrap();
    let sub = serde_json::json!({
        "name": "projects/subsink-bq/subscriptions/rows", "topic": "projects/subsink-bq/topics/events",
        "ackDeadlineSeconds": 10,
        "subsink": {"limits": "extended", "table": {"maxDuration": "1s"}},
        "bigqueryConfig": {"table": "x.y.z", "useTableSchema": true},
    });
    let mut dest = vec![
        "--table-url".to_string(),
        bq.url("spooldl", "t"),
        "--table-schema".to_string(),
        schema.display().to_string(),
        // One segment per message.
        "--spool-segment-bytes".to_string(),
        "1".to_string(),
    ];
    dest.extend(bq.flags());
    let child = start(&mut worker_for(dir.path(), port, &sub, &dest), port);
    let none = serde_json::json!({});
    for (id, n) in [("r1", "10"), ("r2", "not a number"), ("r3", "30")] {
        let p = serde_json::json!({"id": id, "n": n}).to_string();
        assert_eq!(post_with(port, id, p.as_bytes(), none.clone()), 204, "{id}");
    }
    let dl = dir.path().join("spool").join("dead-letter.ndjson");
    let dead = util::process::poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let text = std::fs::read_to_string(&dl).unwrap_or_default();
        if text.lines().count() >= 1 {
            Ok(text)
        } else {
            Err("nothing dead-lettered yet".to_string())
        }
    });
    assert_eq!(dead.lines().count(), 1, "{dead}");
    let m: serde_json::Value = serde_json::from_str(dead.lines().next().unwrap()).unwrap();
    assert_eq!(m["messageId"], "r2", "{m}");
    let ids = || -> Vec<String> {
        bq.query("SELECT id FROM `subsink-bq.spooldl.t` ORDER BY id")
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect()
    };
    util::process::poll(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || match ids() {
            got if got == ["r1", "r3"] => Ok(()),
            got => Err(format!("rows {got:?}")),
        },
    );
    // The segments before the last one's are settled and deleted, r2's with them.
    util::process::poll(Duration::from_secs(10), Duration::from_millis(100), || {
        let spooled = spooled_bytes(dir.path());
        if spooled.contains("r1") || spooled.contains("r2") {
            Err(format!("still spooled: {spooled}"))
        } else {
            Ok(())
        }
    });
    let (summary, err) = stop(child);
    assert_eq!(summary["messages_dead_lettered"], 1, "{summary}\n{err}");
    assert_eq!(ids(), ["r1", "r3"]);
}

/// Point 1 of issue 22, after the 2xx: a file that fails (its folder in the bucket is a plain
/// file: the store refuses every object there) keeps its messages in the spool and is written
/// again within the run, after a backoff, once the destination takes it — no restart, each
/// message once. The settled segments are deleted.
#[test]
fn a_file_that_fails_after_the_2xx_is_written_again_within_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let metrics = util::free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let bucket = dir.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    // The objects go to `out/…`: a file there refuses them.
    std::fs::write(bucket.join("out"), b"in the way").unwrap();
    let sub = serde_json::json!({
        "name": "projects/p/subscriptions/export", "topic": "projects/p/topics/events",
        "ackDeadlineSeconds": 10, "subsink": {"limits": "extended"},
        "cloudStorageConfig": {"bucket": "bkt", "filenamePrefix": "out/", "filenameSuffix": ".avro",
            "maxDuration": "1s", "avroConfig": {"writeMetadata": true}},
    });
    let dest = [
        "--bucket-url".to_string(),
        format!("file://{}", bucket.display()),
        "--metrics-addr".to_string(),
        addr.clone(),
        "--spool-segment-bytes".to_string(),
        "1".to_string(),
    ];
    let child = start(&mut worker_for(dir.path(), port, &sub, &dest), port);
    let none = serde_json::json!({});
    for id in ["m1", "m2", "m3"] {
        assert_eq!(post_with(port, id, b"payload", none.clone()), 204, "{id}");
    }
    // A second file is finalized only once the first one (maxDuration 1 s) failed and the retry
    // read the spool again (no new message meanwhile); the retry's file is finalized as soon as
    // the replay is read (reason `flow_control`: reading holds until it is settled).
    let base = format!("http://{addr}");
    let finalized = |reason: &str| {
        let labels = serde_json::json!({"subscription": "projects/p/subscriptions/export", "reason": reason});
        util::http::metric(
            &base,
            "subsink_files_finalized",
            "subsink_files_finalized_total",
            &labels,
        )
    };
    util::process::poll(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || match (finalized("max_duration"), finalized("flow_control")) {
            (Some(a), Some(b)) if a >= 1.0 && b >= 1.0 => Ok(()),
            other => Err(format!(
                "files finalized (max_duration, flow_control): {other:?}"
            )),
        },
    );
    assert!(written(dir.path()).is_empty());
    std::fs::remove_file(bucket.join("out")).unwrap();
    util::process::poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let n = written(dir.path()).len();
        if n >= 3 {
            Ok(())
        } else {
            Err(format!("{n} of 3 written"))
        }
    });
    util::process::poll(Duration::from_secs(10), Duration::from_millis(100), || {
        let spooled = spooled_bytes(dir.path());
        if spooled.contains("m1") || spooled.contains("m2") {
            Err(format!("still spooled: {spooled}"))
        } else {
            Ok(())
        }
    });
    let (summary, err) = stop(child);
    let got = written(dir.path());
    let mut ids: Vec<_> = got.iter().map(|(k, v)| (k.clone(), *v)).collect();
    ids.sort();
    assert_eq!(
        ids,
        [("m1".into(), 1), ("m2".into(), 1), ("m3".into(), 1)],
        "{summary}\n{err}"
    );
    assert!(err.contains("written again"), "{err}");
}

/// Point 1 of issue 22, after the 2xx: a destination that keeps refusing a file outright gets the
/// subscription's max delivery attempts (5 by default), written again within the run after a
/// growing backoff; then the file's messages go to the dead-letter file, never lost, and the spool
/// goes on: a message pushed once the destination takes files again is written, and the settled
/// segments (the dead-lettered messages') are deleted.
#[test]
fn a_file_the_destination_keeps_refusing_is_dead_lettered_after_its_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let bucket = dir.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    std::fs::write(bucket.join("out"), b"in the way").unwrap();
    let sub = serde_json::json!({
        "name": "projects/p/subscriptions/export", "topic": "projects/p/topics/events",
        "ackDeadlineSeconds": 10, "subsink": {"limits": "extended"},
        "cloudStorageConfig": {"bucket": "bkt", "filenamePrefix": "out/", "filenameSuffix": ".avro",
            "maxDuration": "1s", "avroConfig": {"writeMetadata": true}},
    });
    let dl = dir.path().join("dead.ndjson");
    let dest = [
        "--bucket-url".to_string(),
        format!("file://{}", bucket.display()),
        "--dead-letter".to_string(),
        dl.display().to_string(),
        "--spool-segment-bytes".to_string(),
        "1".to_string(),
    ];
    let child = start(&mut worker_for(dir.path(), port, &sub, &dest), port);
    let none = serde_json::json!({});
    for id in ["m1", "m2", "m3"] {
        assert_eq!(post_with(port, id, b"payload", none.clone()), 204, "{id}");
    }
    // 1 + 2 + 4 + 8 s of backoff between the five attempts, then at once to the dead-letter file.
    let dead = util::process::poll(Duration::from_secs(90), Duration::from_millis(200), || {
        let text = std::fs::read_to_string(&dl).unwrap_or_default();
        if text.lines().count() >= 3 {
            Ok(text)
        } else {
            Err(format!("dead-lettered so far: {text}"))
        }
    });
    let mut ids: Vec<String> = dead
        .lines()
        .map(|l| {
            let m: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(
                m["attributes"]["CloudPubSubDeadLetterSourceDeliveryCount"], "5",
                "{m}"
            );
            m["messageId"].as_str().unwrap().to_string()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, ["m1", "m2", "m3"]);
    std::fs::remove_file(bucket.join("out")).unwrap();
    assert_eq!(post_with(port, "m4", b"payload", none.clone()), 204);
    util::process::poll(Duration::from_secs(30), Duration::from_millis(200), || {
        let got = written(dir.path());
        let spooled = spooled_bytes(dir.path());
        if got.contains_key("m4") && !["m1", "m2", "m3"].iter().any(|m| spooled.contains(m)) {
            Ok(())
        } else {
            Err(format!("written {got:?}, spooled {spooled}"))
        }
    });
    let (summary, err) = stop(child);
    assert_eq!(summary["messages_dead_lettered"], 3, "{summary}\n{err}");
    assert_eq!(written(dir.path()).len(), 1, "{summary}\n{err}");
    assert_eq!(std::fs::read_to_string(&dl).unwrap().lines().count(), 3);
}

/// The in-run retry keeps an ordered subscription's order: while the failed file waits for its
/// retry, the export reads nothing new (messages pushed meanwhile are spooled and answered), so
/// nothing later of the key becomes durable before the failed messages. The objects, in the order
/// they became durable, hold the key's messages in push order, each once.
#[test]
fn the_retry_of_a_failed_file_keeps_an_ordering_keys_order() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let metrics = util::free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let bucket = dir.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    std::fs::write(bucket.join("out"), b"in the way").unwrap();
    let sub = serde_json::json!({
        "name": "projects/p/subscriptions/export", "topic": "projects/p/topics/events",
        "ackDeadlineSeconds": 10, "subsink": {"limits": "extended"},
        "enableMessageOrdering": true,
        "cloudStorageConfig": {"bucket": "bkt", "filenamePrefix": "out/", "filenameSuffix": ".avro",
            "maxDuration": "1s", "avroConfig": {"writeMetadata": true}},
    });
    let dest = [
        "--bucket-url".to_string(),
        format!("file://{}", bucket.display()),
        "--metrics-addr".to_string(),
        addr.clone(),
    ];
    let child = start(&mut worker_for(dir.path(), port, &sub, &dest), port);
    let push = |id: &str| {
        let body = serde_json::json!({
            "message": {"data": "cGF5bG9hZA==", "messageId": id, "orderingKey": "k",
                        "publishTime": "2026-12-01T00:00:00Z"},
            "subscription": "projects/p/subscriptions/push",
        })
        .to_string();
        let req = format!(
            "POST /push HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut conn = None;
        roundtrip(&mut conn, port, req.as_bytes()).expect("an answer")
    };
    for i in 1..=4 {
        assert_eq!(push(&format!("k{i}")), 204);
    }
    let base = format!("http://{addr}");
    // A second file is finalized only once the first one failed and its retry read the spool
    // again (and failed again: the folder is still blocked)...
    util::process::poll(Duration::from_secs(30), Duration::from_millis(100), || {
        let page = util::http::get(&[format!("{base}/metrics")]).remove(0);
        // Whatever the reason.
        let n: f64 = page["families"]["subsink_files_finalized"]["samples"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s[0] == "subsink_files_finalized_total")
            .filter_map(|s| s[2].as_f64())
            .sum();
        if n >= 2.0 {
            Ok(())
        } else {
            Err(format!("files finalized: {n}"))
        }
    });
    // The destination takes files again, and these come while the failed file waits for its
    // retry (2 s after its second failure): written before it, they would break the key's order.
    std::fs::remove_file(bucket.join("out")).unwrap();
    for i in 5..=6 {
        assert_eq!(push(&format!("k{i}")), 204);
    }
    util::process::poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let n = written(dir.path()).len();
        if n >= 6 {
            Ok(())
        } else {
            Err(format!("{n} of 6 written"))
        }
    });
    let (summary, err) = stop(child);
    let mut files: Vec<_> = util::files_below(&bucket)
        .into_iter()
        .map(|f| bucket.join(f))
        .collect();
    files.sort_by_key(|f| std::fs::metadata(f).unwrap().modified().unwrap());
    let order: Vec<String> = util::avro_records_by_file(files)
        .into_iter()
        .flat_map(|(_, recs)| recs)
        .map(|r| r["message_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        order,
        ["k1", "k2", "k3", "k4", "k5", "k6"],
        "{summary}\n{err}"
    );
    assert!(err.contains("written again"), "{err}");
}

/// Message ids → how many records of the S3 bucket `bkt` carry them (downloaded, read with
/// fastavro).
fn s3_written(s3: &util::S3Server) -> HashMap<String, usize> {
    let tmp = tempfile::tempdir().unwrap();
    let files = s3.download_files("bkt", tmp.path());
    let mut count = HashMap::new();
    for r in util::avro_records(&files) {
        *count
            .entry(r["message_id"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    count
}

/// Message ids of a dead-letter file.
fn dead_lettered(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let m: serde_json::Value = serde_json::from_str(l).unwrap();
            m["messageId"].as_str().unwrap().to_string()
        })
        .collect()
}

/// `CLOCK_MONOTONIC` in seconds: the clock of the S3 proxy's log (Python's `time.monotonic`).
fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// One pusher, one message every `every` (ids `s{i}`), until `stop`: every id with the status it
/// got (0 = no answer) and when ([`monotonic`]). `sent` counts the requests answered so far.
fn steady_pusher(
    port: u16,
    every: Duration,
    sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(String, u16, f64)>> {
    std::thread::spawn(move || {
        let data = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [b'x'; 100]);
        let mut conn = None;
        let mut out = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let id = format!("s{i}");
            let status = roundtrip(&mut conn, port, &request(&id, &data)).unwrap_or(0);
            out.push((id, status, monotonic()));
            i += 1;
            sent.store(i, Ordering::Relaxed);
            std::thread::sleep(every);
        }
        out
    })
}

/// Point 1 of issue 22, after the 2xx, with a real store: pushes go on (one every 25 ms, each
/// answered 204 from the spool) while an S3 store (moto behind the recording proxy) first answers
/// every write 503 for longer than the upload's own retries (`--upload-retry-for 2s`): the files
/// fail, are written again within the run (no restart) and nothing is dead-lettered — a store
/// that is down is waited for. Then it answers 403 (no retry helps): the file that keeps being
/// refused gets its 5 attempts, then its messages go to the dead-letter file, and once the store
/// takes writes again the spool drains on. At the end every message answered 2xx is in the bucket
/// exactly once or in the dead-letter file (never both, none lost), and the settled segments are
/// deleted.
#[test]
fn an_s3_store_that_fails_then_recovers_loses_no_2xx_message_and_the_spool_drains() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = util::S3Server::start();
    s3.create_bucket("bkt");
    let proxy = util::proxy::S3Proxy::start(&s3, dir.path());
    let port = util::free_port();
    let sub = serde_json::json!({
        "name": "projects/p/subscriptions/export", "topic": "projects/p/topics/events",
        "ackDeadlineSeconds": 10, "subsink": {"limits": "extended"},
        "cloudStorageConfig": {"bucket": "bkt", "filenameSuffix": ".avro", "maxDuration": "1s",
            "avroConfig": {"writeMetadata": true}},
    });
    let dl = dir.path().join("dead.ndjson");
    let dest = [
        "--bucket-url".to_string(),
        "s3://bkt".to_string(),
        "--upload-retry-for".to_string(),
        "2s".to_string(),
        "--dead-letter".to_string(),
        dl.display().to_string(),
        // One segment per message: a settled message's segment is deleted.
        "--spool-segment-bytes".to_string(),
        "1".to_string(),
    ];
    let mut cmd = worker_for(dir.path(), port, &sub, &dest);
    cmd.envs(proxy.env());
    let child = start(&mut cmd, port);
    let stop_pushing = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let pusher = steady_pusher(
        port,
        Duration::from_millis(25),
        sent.clone(),
        stop_pushing.clone(),
    );
    let refused = |status: u64| {
        proxy
            .writes()
            .iter()
            .filter(|w| w.status == Some(status))
            .count()
    };

    // The store works: files are written.
    util::process::poll(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || match proxy.visible().len() {
            0 => Err("no object yet".to_string()),
            _ => Ok(()),
        },
    );
    // Down (503, retryable) for 8 s: past the upload's 2 s of retries, the files fail.
    proxy.set(serde_json::json!({"mode": "unavailable"}));
    std::thread::sleep(Duration::from_secs(8));
    let visible_before = proxy.visible().len();
    assert!(
        refused(503) > 0,
        "no write reached the store while it was down"
    );
    // Up again: everything pushed so far is written, nothing is dead-lettered.
    proxy.set(serde_json::json!({"mode": "pass"}));
    let t = Instant::now();
    let before = sent.load(Ordering::Relaxed);
    util::process::poll(Duration::from_secs(90), Duration::from_secs(1), || {
        let got = s3_written(&s3);
        let missing = (0..before)
            .map(|i| format!("s{i}"))
            .filter(|id| !got.contains_key(id))
            .count();
        match missing {
            0 => Ok(()),
            n => Err(format!(
                "{n} of the first {before} messages not written yet"
            )),
        }
    });
    eprintln!(
        "after the 503s: the first {before} messages written {:?} after the store came back",
        t.elapsed()
    );
    assert!(proxy.visible().len() > visible_before);
    assert!(
        dead_lettered(&dl).is_empty(),
        "a store that was down dead-lettered messages"
    );

    // Refusing (403, no retry helps): after its 5 attempts (1 + 2 + 4 + 8 s of backoff) a file's
    // messages are dead-lettered; then the store takes writes again and the spool drains on.
    proxy.set(serde_json::json!({"mode": "deny"}));
    let t = Instant::now();
    util::process::poll(
        Duration::from_secs(90),
        Duration::from_millis(500),
        || match dead_lettered(&dl).len() {
            0 => Err("nothing dead-lettered yet".to_string()),
            _ => Ok(()),
        },
    );
    let refused_for = t.elapsed();
    // Not before its five attempts: 1 + 2 + 4 + 8 s of backoff between them.
    assert!(
        refused_for >= Duration::from_secs(14),
        "dead-lettered after {refused_for:?}"
    );
    assert!(refused(403) >= 5, "{} writes refused", refused(403));
    proxy.set(serde_json::json!({"mode": "pass"}));
    std::thread::sleep(Duration::from_secs(2));
    stop_pushing.store(true, Ordering::Relaxed);
    let answers = pusher.join().unwrap();
    let acked: Vec<String> = answers
        .iter()
        .filter(|(_, s, _)| *s == 204)
        .map(|(id, _, _)| id.clone())
        .collect();
    // The spool answers at once whatever the store does.
    let other: Vec<_> = answers.iter().filter(|(_, s, _)| *s != 204).collect();
    assert!(other.is_empty(), "{other:?}");
    let (got, dead) = util::process::poll(Duration::from_secs(90), Duration::from_secs(1), || {
        let got = s3_written(&s3);
        let dead = dead_lettered(&dl);
        let missing: Vec<_> = acked
            .iter()
            .filter(|id| !got.contains_key(*id) && !dead.contains(id))
            .collect();
        match missing.len() {
            0 => Ok((got, dead)),
            n => Err(format!(
                "{n} answered 2xx neither written nor dead-lettered: {missing:?}"
            )),
        }
    });
    // The settled segments are deleted (each held one message), all but the newest, which is
    // still appended to.
    let last = acked.last().unwrap().clone();
    util::process::poll(Duration::from_secs(10), Duration::from_millis(200), || {
        let spooled = spooled_bytes(dir.path());
        let kept: Vec<&str> = spooled
            .lines()
            .filter(|l| !l.contains(&format!(r#""messageId":"{last}""#)))
            .collect();
        match kept.len() {
            0 => Ok(()),
            n => Err(format!("{n} messages still spooled: {kept:?}")),
        }
    });
    let (summary, err) = stop(child);
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "written twice: {twice:?}\n{summary}\n{err}"
    );
    let both: Vec<_> = dead.iter().filter(|id| got.contains_key(*id)).collect();
    assert!(both.is_empty(), "written and dead-lettered: {both:?}");
    let mut unique = dead.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), dead.len(), "dead-lettered twice: {dead:?}");
    // Nothing written or dead-lettered that was not answered 2xx.
    assert_eq!(got.len() + dead.len(), acked.len(), "{summary}\n{err}");
    assert_eq!(summary["messages_dead_lettered"], dead.len(), "{summary}");
    // Only the messages of the files refused first are dead-lettered: each was answered before
    // the first 403 (with a second's slack for the files finalized as it came). A message
    // spooled later was read after those files' retries and had attempts of its own; it never
    // joined a file written again.
    let first_403 = proxy
        .writes()
        .iter()
        .find(|w| w.status == Some(403))
        .map(|w| w.t)
        .unwrap();
    let answered_at: HashMap<&str, f64> =
        answers.iter().map(|(id, _, t)| (id.as_str(), *t)).collect();
    let late: Vec<_> = dead
        .iter()
        .filter(|id| answered_at[id.as_str()] > first_403 + 1.0)
        .map(|id| (id, answered_at[id.as_str()] - first_403))
        .collect();
    assert!(
        late.is_empty(),
        "dead-lettered, answered s after the first 403: {late:?}"
    );
    // Both kinds of failure reached the spool's retry: the store down past the upload's own
    // retries (retryable, 503), and the store refusing (not retryable, 403) — written again
    // within the run until its fifth attempt.
    let failed: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("a file failed after its messages were answered 2xx"))
        .collect();
    for n in 1..=5 {
        assert!(
            failed
                .iter()
                .any(|l| l.contains(&format!("attempts={n} retryable=false"))),
            "no attempt {n}: {failed:#?}"
        );
    }
    assert!(
        failed
            .iter()
            .any(|l| l.contains("retryable=true") && l.contains("503")),
        "{failed:#?}"
    );
    assert!(
        failed
            .iter()
            .any(|l| l.contains("retryable=false") && l.contains("403")),
        "{failed:#?}"
    );
    eprintln!(
        "{} pushed and answered 204: {} written once each, {} dead-lettered; {} writes refused 503, {} refused 403",
        acked.len(),
        got.len(),
        dead.len(),
        refused(503),
        refused(403)
    );
}

/// Issue 34, point 4: a 2xx must not depend on a second run. Pushers send continuously over
/// several connections while the export lags (files of 5 messages each, so the spool holds a
/// backlog); SIGTERM then stops the endpoint and the run exports the whole spool before it exits
/// 0 — every message answered 2xx is in the bucket right after this first process exits, no
/// second run on the same spool.
#[test]
fn sigterm_under_load_exports_every_2xx_message_before_the_first_process_exits() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let sub = serde_json::json!({
        "name": "projects/p/subscriptions/export", "topic": "projects/p/topics/events",
        "ackDeadlineSeconds": 10, "subsink": {"limits": "extended"},
        "cloudStorageConfig": {"bucket": "bkt", "filenameSuffix": ".avro", "maxDuration": "60s",
            "maxMessages": "5", "avroConfig": {"writeMetadata": true}},
    });
    let dest = [
        "--bucket-url".to_string(),
        format!("file://{}", dir.path().join("bucket").display()),
        "--shutdown-grace".to_string(),
        "60s".to_string(),
    ];
    let child = start(&mut worker_for(dir.path(), port, &sub, &dest), port);
    let acked = Arc::new(AtomicU64::new(0));
    let seen: Seen = Default::default();
    let halt = Arc::new(AtomicBool::new(false));
    let pushers = load(
        port,
        10_000_000,
        8,
        acked.clone(),
        seen.clone(),
        halt.clone(),
    );
    util::process::poll(
        Duration::from_secs(60),
        Duration::from_millis(50),
        || match acked.load(Ordering::Relaxed) {
            n if n >= 3000 => Ok(()),
            n => Err(format!("{n} of 3000 answered 2xx before the signal")),
        },
    );
    // Under load: the pushers keep sending through the signal and the drain.
    util::process::signal(&child, libc::SIGTERM);
    let at_signal = acked.load(Ordering::Relaxed);
    let t = Instant::now();
    let o = util::process::output(child);
    let took = t.elapsed();
    halt.store(true, Ordering::Relaxed);
    for p in pushers {
        p.join().unwrap();
    }
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}: {err}", o.status);
    let summary: serde_json::Value =
        serde_json::from_str(out.lines().last().unwrap_or("null")).unwrap();
    assert_eq!(summary["shutdown"], true, "{summary}");
    assert_eq!(summary["stopped"], serde_json::Value::Null, "{summary}");
    let got = written(dir.path());
    let seen = seen.lock().unwrap();
    let answered: Vec<&String> = seen
        .iter()
        .filter(|(_, s)| s.iter().any(|c| (200..300).contains(c)))
        .map(|(id, _)| id)
        .collect();
    let missing: Vec<&&String> = answered
        .iter()
        .filter(|id| !got.contains_key(**id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} messages answered 2xx are not in the bucket after the first run: {:?}\n{err}",
        missing.len(),
        answered.len(),
        &missing[..missing.len().min(20)]
    );
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "written twice: {twice:?}");
    let unknown: Vec<_> = got.keys().filter(|id| !seen.contains_key(*id)).collect();
    assert!(unknown.is_empty(), "never pushed: {unknown:?}");
    // Nothing is left for a next run: the checkpoint is past every spooled message, so a second
    // run on the spool, stopped as soon as it listens (a stop exports what the spool holds past
    // the checkpoint before it exits), writes nothing.
    let cp: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("spool").join("checkpoint.json")).unwrap(),
    )
    .unwrap();
    let second = start(&mut worker_for(dir.path(), port, &sub, &dest), port);
    let (again, again_err) = stop(second);
    assert_eq!(
        again["messages_written"], 0,
        "the second run on the spool wrote again (checkpoint {cp}): {again}\n{again_err}"
    );
    assert_eq!(again["stopped"], serde_json::Value::Null, "{again}");
    assert_eq!(
        written(dir.path()),
        got,
        "the bucket changed in the second run"
    );
    eprintln!(
        "{} answered 2xx ({at_signal} at the signal), all {} in the bucket when the first run \
         exited, {took:?} after SIGTERM; checkpoint {cp}; the second run wrote 0",
        answered.len(),
        got.len()
    );
}

/// Issue 34, point 4: when the shutdown grace ends before the spool is durable (the store hangs
/// every write), the run exits 1 and says what is left — how many messages answered 2xx, the
/// spool that keeps them — on stderr and in the summary; the next run on that spool exports them.
#[test]
fn sigterm_when_the_store_hangs_exits_1_naming_what_the_spool_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = util::S3Server::start();
    s3.create_bucket("bkt");
    let proxy = util::proxy::S3Proxy::start(&s3, dir.path());
    let port = util::free_port();
    let sub = serde_json::json!({
        "name": "projects/p/subscriptions/export", "topic": "projects/p/topics/events",
        "ackDeadlineSeconds": 10, "subsink": {"limits": "extended"},
        "cloudStorageConfig": {"bucket": "bkt", "filenameSuffix": ".avro", "maxDuration": "1s",
            "avroConfig": {"writeMetadata": true}},
    });
    let dest = [
        "--bucket-url".to_string(),
        "s3://bkt".to_string(),
        "--shutdown-grace".to_string(),
        "2s".to_string(),
    ];
    proxy.set(serde_json::json!({"mode": "hang"}));
    let mut cmd = worker_for(dir.path(), port, &sub, &dest);
    cmd.envs(proxy.env());
    let child = start(&mut cmd, port);
    for i in 0..7 {
        assert_eq!(post(port, &format!("h{i}")), 204);
    }
    util::process::poll(
        Duration::from_secs(30),
        Duration::from_millis(50),
        || match proxy.writes().iter().any(|w| w.status.is_none()) {
            true => Ok(()),
            false => Err("no write hangs yet".to_string()),
        },
    );
    util::process::signal(&child, libc::SIGTERM);
    let t = Instant::now();
    let o = util::process::output(child);
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    // The grace (2 s) plus the close (at most 5 s), not the watchdog's.
    assert!(
        took < Duration::from_secs(10),
        "exited {took:?} after SIGTERM"
    );
    let spool = dir.path().join("spool").display().to_string();
    let says = "7 message(s) answered 2xx are not durable in the destination yet";
    let line = err
        .lines()
        .find(|l| l.starts_with("error: stopped:"))
        .unwrap_or_else(|| panic!("no `error: stopped:` line: {err}"));
    assert!(
        line.contains("shutdown grace ended first") && line.contains(says) && line.contains(&spool),
        "{line}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(out.lines().last().unwrap_or("null")).unwrap();
    let stopped = summary["stopped"].as_str().unwrap_or_default();
    assert!(
        stopped.contains(says) && stopped.contains(&spool),
        "{summary}"
    );
    // The next run on the same spool exports them, once each.
    proxy.set(serde_json::json!({"mode": "pass"}));
    let mut cmd = worker_for(dir.path(), port, &sub, &dest[..2]);
    cmd.envs(proxy.env());
    let child = start(&mut cmd, port);
    util::process::poll(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || match s3_written(&s3).len() {
            7 => Ok(()),
            n => Err(format!("{n} of 7 written")),
        },
    );
    let (summary, err) = stop(child);
    assert_eq!(
        summary["stopped"],
        serde_json::Value::Null,
        "{summary}\n{err}"
    );
    let got = s3_written(&s3);
    assert!(got.values().all(|n| *n == 1), "{got:?}");
}

/// Issue 43: a test that panics while its worker runs does not leave the worker running. The
/// worker is started (as every test starts one, from `util::subsink`) on a thread that then
/// unwinds without stopping it: the worker is killed (SIGKILL) as that thread ends, and its port
/// no longer answers.
#[test]
fn a_worker_dies_with_the_test_thread_that_panics() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let cmd_dir = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    let test = std::thread::spawn(move || {
        // Never waited for here, as in a test that fails: the test below reaps it.
        #[allow(clippy::zombie_processes)]
        let child = start(&mut worker(&cmd_dir, port, "60s", &[]), port);
        tx.send(child.id()).unwrap();
        // A failing assertion's unwinding, without the panic message in the test's output.
        std::panic::resume_unwind(Box::new("the test failed while its worker ran"));
    });
    assert!(test.join().is_err(), "the thread unwound");
    let pid = rx.recv().unwrap() as libc::pid_t;
    let t = Instant::now();
    let status = loop {
        let mut status = 0;
        // The dropped `Child` never reaps it: this test does, once it has exited.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            break status;
        }
        if t.elapsed() > Duration::from_secs(10) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the worker {pid} still runs 10 s after the thread that started it panicked");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL,
        "the worker ended otherwise: wait status {status}"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "something still listens on the worker's port"
    );
    eprintln!("the worker died {:?} after the thread unwound", t.elapsed());
}
