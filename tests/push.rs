//! The push source end to end: Google's Pub/Sub emulator pushing to the real binary (wrapped and
//! unwrapped requests), OIDC tokens made with google-auth (a signer nobody here wrote) against a JWKS
//! file of a key made in the test, and the startup rule on maxDuration vs the ack deadline.

mod util;

use std::io::{Read, Write};

use base64::Engine as _;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use util::emulator::Emulator;

/// A storage subscription whose files close after 1 s (extended limits), Avro with metadata.
fn subscription(dir: &Path, ack_deadline: u32, max_duration: &str) -> std::path::PathBuf {
    subscription_pushed(dir, ack_deadline, max_duration, None)
}

/// The same with `pushConfig` (which says how requests carry their message) when given.
fn subscription_pushed(
    dir: &Path,
    ack_deadline: u32,
    max_duration: &str,
    push_config: Option<&str>,
) -> std::path::PathBuf {
    let p = dir.join("sub.json");
    let push = push_config
        .map(|c| format!(r#""pushConfig":{c},"#))
        .unwrap_or_default();
    std::fs::write(
        &p,
        format!(
            r#"{{"name":"projects/p/subscriptions/export","topic":"projects/p/topics/events",
                "ackDeadlineSeconds":{ack_deadline},"subsink":{{"limits":"extended"}},{push}
                "cloudStorageConfig":{{"bucket":"bkt","filenameSuffix":".avro",
                "maxDuration":"{max_duration}","avroConfig":{{"writeMetadata":true}}}}}}"#
        ),
    )
    .unwrap();
    p
}

fn start_push(dir: &Path, port: u16, extra: &[&str]) -> Child {
    let bucket = format!("file://{}", dir.join("bucket").display());
    start_push_to(dir, port, &bucket, &[], extra)
}

/// The push endpoint for the subscription `push_config` gives (see [`subscription_pushed`]).
fn start_push_with(dir: &Path, port: u16, push_config: &str) -> Child {
    let sub = subscription_pushed(dir, 10, "1s", Some(push_config));
    let bucket = format!("file://{}", dir.join("bucket").display());
    start_push_sub(dir, port, &sub, &bucket, &[], &[])
}

/// The push endpoint on `port` writing to `bucket_url`, with `env` added.
fn start_push_to(
    dir: &Path,
    port: u16,
    bucket_url: &str,
    env: &[(&str, String)],
    extra: &[&str],
) -> Child {
    let sub = subscription(dir, 10, "1s");
    start_push_sub(dir, port, &sub, bucket_url, env, extra)
}

fn start_push_sub(
    dir: &Path,
    port: u16,
    sub: &Path,
    bucket_url: &str,
    env: &[(&str, String)],
    extra: &[&str],
) -> Child {
    let child = util::spawn_draining(
        util::subsink()
            .args(["run", "--source", "push", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--subscription")
            .arg(sub)
            .args(spool_dir(dir, extra))
            .arg("--bucket-url")
            .arg(bucket_url)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .args(extra)
            .stdout(Stdio::piped()),
    );
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "push endpoint never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// `--spool-dir DIR/spool` unless `extra` has `--no-spool` (the answer-after-durable mode).
fn spool_dir(dir: &Path, extra: &[&str]) -> Vec<std::ffi::OsString> {
    if extra.contains(&"--no-spool") {
        return Vec::new();
    }
    vec!["--spool-dir".into(), dir.join("spool").into()]
}

/// SIGTERM, then the exit status and the summary.
fn stop(child: Child) -> (std::process::ExitStatus, serde_json::Value, String) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = util::output(child);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let status = o.status;
    let summary = serde_json::from_str(out.lines().last().unwrap_or("null")).unwrap_or_default();
    (status, summary, err)
}

/// Every Avro record in the bucket (fastavro).
fn records(dir: &Path) -> Vec<serde_json::Value> {
    let bucket = dir.join("bucket");
    if !bucket.exists() {
        return Vec::new();
    }
    let files: Vec<_> = util::files_below(&bucket)
        .into_iter()
        .filter(|f| f.ends_with(".avro"))
        .map(|f| bucket.join(f))
        .collect();
    util::avro_records(&files)
}

/// Run Python `code` against the emulator; its stdout.
fn python(emu: &Emulator, code: &str) -> String {
    util::venv_python(["-c", code], &[("PUBSUB_EMULATOR_HOST", emu.host())])
}

/// The emulator pushes 30 messages to subsink through a push subscription; each lands in the bucket
/// exactly once with its id, data and attributes, and every request was acked (no redelivery shows
/// up as a second copy).
fn emulator_push_case(no_wrapper: bool) {
    let emu = Emulator::start();
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    // subsink's subscription says what the pushes carry, as the pushing one does.
    let child = match no_wrapper {
        true => start_push_with(dir.path(), port, r#"{"noWrapper":{"writeMetadata":true}}"#),
        false => start_push(dir.path(), port, &[]),
    };
    let push_config = if no_wrapper {
        format!(
            r#"{{"push_endpoint": "http://127.0.0.1:{port}/push", "no_wrapper": {{"write_metadata": True}}}}"#
        )
    } else {
        format!(r#"{{"push_endpoint": "http://127.0.0.1:{port}/push"}}"#)
    };
    let ids = python(
        &emu,
        &format!(
            r#"
import json
from google.cloud import pubsub_v1
pub = pubsub_v1.PublisherClient()
sub = pubsub_v1.SubscriberClient()
pub.create_topic(name="projects/p/topics/events")
sub.create_subscription(request={{"name": "projects/p/subscriptions/push", "topic": "projects/p/topics/events",
    "ack_deadline_seconds": 10, "push_config": {push_config}}})
futures = [pub.publish("projects/p/topics/events", f"message {{i}}".encode(), n=str(i), kind="event")
           for i in range(30)]
print(json.dumps([f.result() for f in futures]))
"#
        ),
    );
    let ids: Vec<String> = serde_json::from_str(ids.trim()).unwrap();
    util::poll(Duration::from_secs(90), Duration::from_millis(500), || {
        let n = records(dir.path()).len();
        if n >= 30 {
            Ok(())
        } else {
            Err(format!("{n} of 30 pushed messages written"))
        }
    });
    // A nacked or timed-out request would come back: ask the emulator, not a clock. The push
    // subscription becomes a pull one (no more pushes), and what it still holds unacked is
    // delivered once its 10 s ack deadline has passed: draining past that deadline finds
    // nothing only if every push was acked.
    python(
        &emu,
        r#"
from google.cloud import pubsub_v1
pubsub_v1.SubscriberClient().modify_push_config(request={"subscription": "projects/p/subscriptions/push", "push_config": {}})
"#,
    );
    let left = util::pubsub::PubsubEnv::on(emu)
        .drain("projects/p/subscriptions/push", Duration::from_secs(12));
    assert!(left.is_empty(), "not acked by the pushes: {left:?}");
    let (status, summary, err) = stop(child);
    assert!(status.success(), "{status}: {err}");
    let got = records(dir.path());
    assert_eq!(
        got.len(),
        30,
        "each pushed message written once: {got:?}\n{err}"
    );
    assert_eq!(summary["messages_acked"], 30, "{summary}");
    assert_eq!(summary["messages_nacked"], 0, "{summary}");
    let mut seen: Vec<String> = Vec::new();
    for r in &got {
        let id = r["message_id"].as_str().unwrap().to_string();
        // `n` is the publish order; its id is the one the emulator gave that publish.
        let i: usize = r["attributes"]["n"].as_str().unwrap().parse().unwrap();
        assert_eq!(id, ids[i], "{r}");
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("message {i}"));
        assert_eq!(r["data"], serde_json::json!({ "$b64": b64 }), "{r}");
        assert_eq!(
            r["attributes"],
            serde_json::json!({"kind": "event", "n": i.to_string()}),
            "{r}"
        );
        seen.push(id);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 30);
}

#[test]
fn emulator_pushes_wrapped_requests_and_each_message_is_written_once() {
    emulator_push_case(false);
}

#[test]
fn emulator_pushes_unwrapped_requests_with_metadata_headers() {
    emulator_push_case(true);
}

/// POST a wrapped push request; the HTTP status.
fn post(port: u16, token: Option<&str>, id: &str) -> u16 {
    let body = format!(
        r#"{{"message":{{"data":"aGk=","messageId":"{id}","publishTime":"2026-12-01T00:00:00Z","attributes":{{"k":"v"}}}},"subscription":"projects/p/subscriptions/push"}}"#
    );
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "POST /push HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {resp:?}"))
}

/// Tokens made by google-auth's RSA signer: a valid one, and expired, wrong-audience, wrong-issuer,
/// wrong-email, forged (another key under the same key id) and unsigned (`alg: none`) ones.
const TOKENS: &str = r#"
import base64, json, sys, time
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives import serialization
from google.auth import crypt, jwt

def pem(k):
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption()).decode()
def b64(n):
    return base64.urlsafe_b64encode(n.to_bytes((n.bit_length() + 7) // 8, "big")).rstrip(b"=").decode()

key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
pub = key.public_key().public_numbers()
json.dump({"keys": [{"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "k1", "n": b64(pub.n), "e": b64(pub.e)}]},
          open(sys.argv[1], "w"))
signer = crypt.RSASigner.from_string(pem(key), key_id="k1")
forger = crypt.RSASigner.from_string(pem(other), key_id="k1")
now = int(time.time())
def claims(**kw):
    c = {"iss": "https://accounts.google.com", "aud": "https://subsink.test/push", "iat": now,
         "exp": now + 600, "email": "push@p.iam.gserviceaccount.com", "email_verified": True}
    c.update(kw)
    return c
def tok(s, c):
    return jwt.encode(s, c).decode()
none = (base64.urlsafe_b64encode(json.dumps({"alg": "none", "typ": "JWT", "kid": "k1"}).encode()).rstrip(b"=").decode()
        + "." + base64.urlsafe_b64encode(json.dumps(claims()).encode()).rstrip(b"=").decode() + ".")
print(json.dumps({
    "valid": tok(signer, claims()),
    "expired": tok(signer, claims(iat=now - 7200, exp=now - 3600)),
    "audience": tok(signer, claims(aud="https://elsewhere.test/")),
    "issuer": tok(signer, claims(iss="https://evil.test")),
    "email": tok(signer, claims(email="someone@evil.test")),
    "forged": tok(forger, claims()),
    "unsigned": none,
}))
"#;

#[test]
fn push_requests_need_a_valid_oidc_token_when_an_audience_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let tokens = util::python_json(TOKENS, jwks.to_str().unwrap(), &[]);
    let port = util::free_port();
    let child = start_push(
        dir.path(),
        port,
        &[
            "--push-audience",
            "https://subsink.test/push",
            "--push-jwks",
            jwks.to_str().unwrap(),
            "--push-allowed-email",
            "push@p.iam.gserviceaccount.com",
        ],
    );
    assert_eq!(post(port, None, "no-token"), 401);
    for bad in [
        "expired", "audience", "issuer", "email", "forged", "unsigned",
    ] {
        let t = tokens[bad].as_str().unwrap();
        assert_eq!(post(port, Some(t), bad), 401, "{bad} token accepted");
    }
    assert_eq!(post(port, Some("not.a.jwt"), "garbage"), 401);
    // The valid one is answered 204 once its file (maxDuration 1 s) is durable.
    assert_eq!(
        post(port, Some(tokens["valid"].as_str().unwrap()), "good"),
        204
    );
    let (status, summary, err) = stop(child);
    assert!(status.success(), "{status}: {err}");
    let got = records(dir.path());
    let ids: Vec<&str> = got
        .iter()
        .map(|r| r["message_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["good"], "only the authenticated message is written");
    assert_eq!(summary["messages_written"], 1);
    // Authentication runs before the spool: nothing of a refused request was spooled.
    let spooled: String = std::fs::read_dir(dir.path().join("spool"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert_eq!(spooled.matches("messageId").count(), 1, "{spooled}");
    assert!(spooled.contains(r#""messageId":"good""#), "{spooled}");
    // Refusals name the rule, never the token.
    for t in tokens.as_object().unwrap().values() {
        assert!(!err.contains(t.as_str().unwrap()), "a token in the log");
    }
}

/// `--push-jwks` names a URL nobody serves yet (here, Google's certificates where the network is
/// closed): the worker starts anyway, answers 503 (the pusher retries) and `/readyz` says why;
/// once the keys can be fetched (a server starts), a valid token is answered 204.
#[test]
fn push_keys_are_fetched_in_the_background_and_requests_get_503_until_they_are_known() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let tokens = util::python_json(TOKENS, keys.join("jwks.json").to_str().unwrap(), &[]);
    let valid = tokens["valid"].as_str().unwrap().to_string();
    let (port, keys_port, metrics_port) = (util::free_port(), util::free_port(), util::free_port());
    let jwks_url = format!("http://127.0.0.1:{keys_port}/jwks.json");
    let addr = format!("127.0.0.1:{metrics_port}");
    let child = start_push(
        dir.path(),
        port,
        &[
            "--push-audience",
            "https://subsink.test/push",
            "--push-jwks",
            &jwks_url,
            "--metrics-addr",
            &addr,
        ],
    );
    assert_eq!(post(port, Some(&valid), "early"), 503);
    let (code, body) = util::http::status(&format!("http://{addr}"), "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("push JWKS") && body.contains(&jwks_url),
        "{body}"
    );
    let mut server = std::process::Command::new(util::venv_bin("python"))
        .args([
            "-m",
            "http.server",
            &keys_port.to_string(),
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(&keys)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    util::poll(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || match post(port, Some(&valid), "good") {
            204 => Ok(()),
            c => Err(format!("answered {c} after the key server started")),
        },
    );
    // Readiness is refreshed on the pipeline's one-second tick, so it may lag the first 204.
    util::poll(
        Duration::from_secs(10),
        Duration::from_millis(200),
        || match util::http::status(&format!("http://{addr}"), "/readyz") {
            (_, body) if body.contains("push JWKS") => Err(body),
            _ => Ok(()),
        },
    );
    let _ = server.kill();
    let _ = server.wait();
    let (status, _summary, err) = stop(child);
    assert!(status.success(), "{status}: {err}");
    let ids: Vec<String> = records(dir.path())
        .iter()
        .map(|r| r["message_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["good"], "only the message answered 204 is written");
}

#[test]
fn push_refuses_a_max_duration_longer_than_the_ack_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let sub = subscription(dir.path(), 10, "30s");
    let out = util::subsink()
        .args([
            "run",
            "--source",
            "push",
            "--listen",
            "127.0.0.1:0",
            "--no-spool",
            "--subscription",
        ])
        .arg(&sub)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("maxDuration") && err.contains("ackDeadlineSeconds"),
        "{err}"
    );
}

/// moto with the bucket `bkt` behind the recording S3 proxy (its files in `dir`), which fails or
/// hangs writes on demand.
fn s3_store(dir: &Path) -> (util::S3Server, util::proxy::S3Proxy) {
    let s3 = util::S3Server::start();
    s3.create_bucket("bkt");
    let proxy = util::proxy::S3Proxy::start(&s3, dir);
    (s3, proxy)
}

/// Wait up to 30 s until a write to the S3 proxy hangs (the proxy holds it, unanswered).
fn wait_for_a_hung_write(proxy: &util::proxy::S3Proxy) {
    util::poll(Duration::from_secs(30), Duration::from_millis(50), || {
        if proxy.writes().iter().any(|w| w.status.is_none()) {
            Ok(())
        } else {
            Err("no write hangs".to_string())
        }
    })
}

#[test]
fn push_answers_503_when_the_file_fails_or_is_not_durable_within_the_ack_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (s3, store) = s3_store(dir.path());
    let port = util::free_port();
    // A short grace: the hung write is still pending when the worker stops.
    let child = start_push_to(
        dir.path(),
        port,
        "s3://bkt",
        &store.env(),
        &["--shutdown-grace", "2s", "--no-spool"],
    );
    // The store refuses the write (403, which no retry changes): the file fails, 503 at once.
    store.set(serde_json::json!({"mode": "deny"}));
    let t = Instant::now();
    assert_eq!(post(port, None, "refused"), 503);
    let refused_after = t.elapsed();
    assert!(
        refused_after < Duration::from_secs(8),
        "answered after {refused_after:?}: the failure, not the 10 s deadline, answered it"
    );
    // The store hangs: the file is not durable within the subscription's 10 s ack deadline, past
    // which Pub/Sub gives up on the request; it is answered 503 then.
    store.set(serde_json::json!({"mode": "hang"}));
    let t = Instant::now();
    assert_eq!(post(port, None, "late"), 503);
    let late_after = t.elapsed();
    assert!(
        late_after >= Duration::from_secs(10) && late_after < Duration::from_secs(14),
        "a late file answered after {late_after:?}, not at the 10 s ack deadline"
    );
    // The store works again: 204 once the file is durable.
    store.set(serde_json::json!({"mode": "pass"}));
    assert_eq!(post(port, None, "good"), 204);
    let keys = s3.list("bkt");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let (status, summary, err) = stop(child);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(summary["messages_acked"], 1, "{summary}");
    assert!(
        summary["messages_nacked"].as_u64().unwrap() >= 2,
        "{summary}"
    );
}

#[test]
fn after_sigterm_new_connections_are_refused_and_a_request_received_is_still_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (s3, store) = s3_store(dir.path());
    let port = util::free_port();
    let mut child = start_push_to(
        dir.path(),
        port,
        "s3://bkt",
        &store.env(),
        &["--shutdown-grace", "3s", "--no-spool"],
    );
    // A request whose file cannot become durable (the store hangs its write) keeps the worker
    // draining after SIGTERM.
    store.set(serde_json::json!({"mode": "hang"}));
    let first = std::thread::spawn(move || {
        let t = Instant::now();
        (post(port, None, "received"), t.elapsed())
    });
    wait_for_a_hung_write(&store);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    // The listener closes: a new connection is refused while the worker still drains.
    util::poll(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || match TcpStream::connect(("127.0.0.1", port)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
            other => Err(format!("a new connection after SIGTERM: {other:?}")),
        },
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "the worker had already exited: the refusal proves nothing"
    );
    // The received request is answered, not dropped: its file is not durable when the 3 s grace
    // ends, so 503 (Pub/Sub redelivers it), and the worker exits 0.
    let (code, after) = first.join().unwrap();
    assert_eq!(code, 503);
    assert!(after < Duration::from_secs(10), "answered after {after:?}");
    let (status, summary, err) = stop(child);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(summary["shutdown"], true, "{summary}");
    assert_eq!(summary["messages_acked"], 0, "{summary}");
    assert_eq!(summary["messages_nacked"], 1, "{summary}");
    assert!(s3.list("bkt").is_empty());
}

/// POST `body` with `headers` (each `Name: value`); the HTTP status.
fn post_raw(port: u16, headers: &[&str], body: &[u8]) -> u16 {
    post_answer(port, headers, body).0
}

/// POST `body` with `headers`; the HTTP status and the answer's body.
fn post_answer(port: u16, headers: &[&str], body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = String::from("POST /push HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {resp:?}"));
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// Every spooled line (the segments, in order).
fn spooled_lines(dir: &Path) -> Vec<String> {
    let mut segs: Vec<_> = std::fs::read_dir(dir.join("spool"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    segs.iter()
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Issue 34, point 3: without `noWrapper` in the subscription's pushConfig every request must be
/// the JSON envelope with a message id. A body that is not JSON, one with a misspelt `message`
/// and one without `messageId` are answered 400 — with `Content-Type: application/json` too —
/// never spooled nor written, and the log names the rule; the envelope next to them is written.
#[test]
fn with_the_wrapper_a_body_that_is_not_an_envelope_is_400_and_never_spooled() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let child = start_push(dir.path(), port, &[]);
    let json = ["Content-Type: application/json"];
    let bad: [(&[&str], &[u8]); 5] = [
        (&json, b"not json"),
        (&json, br#"{"mesage":{"data":"aGk=","messageId":"typo"}}"#),
        (
            &json,
            br#"{"message":{"data":"aGk="},"subscription":"projects/p/subscriptions/s"}"#,
        ),
        (&json, br#"{"message":{"data":"%%%","messageId":"b64"}}"#),
        (&["Content-Type: text/plain"], b"plain text"),
    ];
    for (headers, body) in bad {
        assert_eq!(
            post_raw(port, headers, body),
            400,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    assert_eq!(post(port, None, "good"), 204);
    let (status, summary, err) = stop(child);
    assert!(status.success(), "{status}: {err}");
    let ids: Vec<String> = records(dir.path())
        .iter()
        .map(|r| r["message_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["good"], "{summary}");
    let lines = spooled_lines(dir.path());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(r#""messageId":"good""#), "{lines:?}");
    for rule in [
        "not a push envelope",
        "field `mesage`: unknown field, did you mean `message`?",
        "no field `message.messageId`",
        "field `message.data`: invalid base64",
    ] {
        assert!(
            err.contains(&format!(
                "push request refused (400, nothing spooled): {rule}"
            )) || err.contains(rule),
            "no {rule:?} in the log: {err}"
        );
    }
}

/// Issue 44, points 1 and 9: an envelope with an unknown field — in the envelope or in its
/// message — is answered 400 naming the field and the nearest known name, never written without
/// its attributes; and every 400 carries its reason in the answer's body, the pusher's only view
/// of it. The same envelope spelt right is written with its attributes.
#[test]
fn a_400_answer_carries_its_reason_and_unknown_envelope_fields_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let child = start_push(dir.path(), port, &[]);
    let json = ["Content-Type: application/json"];
    let typo = br#"{"message":{"data":"aGk=","atributes":{"k":"v"},"messageId":"typo-1"},"subscription":"projects/p/subscriptions/s"}"#;
    assert_eq!(
        post_answer(port, &json, typo),
        (
            400,
            "not a push envelope: field `message.atributes`: unknown field, did you mean \
             `attributes`? (a PubsubMessage has data, attributes, messageId, publishTime, \
             orderingKey; Pub/Sub refuses unknown fields)\n"
                .to_string()
        )
    );
    let (status, body) = post_answer(
        port,
        &json,
        br#"{"message":{"data":"aGk=","messageId":"m"},"deliveryAtempt":2}"#,
    );
    assert_eq!(status, 400);
    assert!(
        body.starts_with(
            "not a push envelope: field `deliveryAtempt`: unknown field, did you mean `deliveryAttempt`?"
        ),
        "{body}"
    );
    let (status, body) = post_answer(port, &json, br#"{"message":{"data":"aGk="}}"#);
    assert_eq!(status, 400);
    assert!(body.contains("no field `message.messageId`"), "{body}");
    let good = br#"{"message":{"data":"aGk=","attributes":{"k":"v"},"messageId":"typo-1"},"subscription":"projects/p/subscriptions/s"}"#;
    assert_eq!(post_raw(port, &json, good), 204);
    let (status, summary, err) = stop(child);
    assert!(status.success(), "{status}: {err}");
    let written = records(dir.path());
    assert_eq!(written.len(), 1, "{summary}");
    assert_eq!(written[0]["message_id"], "typo-1");
    assert_eq!(written[0]["attributes"]["k"], "v", "{:?}", written[0]);
}

/// Issue 34, point 3: with `noWrapper` (no writeMetadata) the body is the payload whatever its
/// content type — a JSON envelope too — and, as nothing identifies the message, each gets an id
/// of its own (a UUID) that a restart on the same spool never repeats.
#[test]
fn without_the_wrapper_the_body_is_the_payload_and_ids_are_unique_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let port = util::free_port();
    let envelope: &[u8] = br#"{"message":{"data":"aGk=","messageId":"7"}}"#;
    let bodies: [(&str, &[u8]); 4] = [
        ("Content-Type: application/json", envelope),
        ("Content-Type: text/plain", b"not json"),
        ("Content-Type: application/json", b"not json either"),
        ("Content-Type: application/octet-stream", b"\x00\x01bytes"),
    ];
    let mut expected: Vec<Vec<u8>> = Vec::new();
    for run in 0..2 {
        let child = start_push_with(dir.path(), port, r#"{"noWrapper":{}}"#);
        for (ct, body) in bodies {
            // A header that is no attribute without writeMetadata.
            assert_eq!(post_raw(port, &[ct, "X-Request-Id: proxy-1"], body), 204);
            expected.push(body.to_vec());
        }
        let (status, _summary, err) = stop(child);
        assert!(status.success(), "run {run}: {status}: {err}");
    }
    let got = records(dir.path());
    assert_eq!(got.len(), 8, "{got:?}");
    let mut datas: Vec<Vec<u8>> = got
        .iter()
        .map(|r| {
            let b64 = r["data"]["$b64"].as_str().unwrap();
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap()
        })
        .collect();
    datas.sort();
    expected.sort();
    assert_eq!(datas, expected);
    let mut ids: Vec<String> = got
        .iter()
        .map(|r| r["message_id"].as_str().unwrap().to_string())
        .collect();
    for (r, id) in got.iter().zip(&ids) {
        assert!(uuid_like(id), "message id {id:?} of {r}");
        assert_eq!(r["attributes"], serde_json::json!({}), "{r}");
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 8, "ids repeat across the two runs: {ids:?}");
}

/// 36 characters of hex in 8-4-4-4-12 groups.
fn uuid_like(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}
