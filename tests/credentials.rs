//! Google credentials end to end, without Google (issue 27, point 5): every kind of credential the
//! chain reads (src/gauth.rs) meets a token endpoint on 127.0.0.1, and every request to Pub/Sub,
//! BigQuery and Cloud Storage passes a server that refuses it without a valid token.
//!
//! `tests/py/google_fake.py` is Google's side: a token endpoint that verifies a service account's
//! RS256 assertion with the key's public half (Python's `cryptography`) and checks its claims, and
//! an `authorized_user`'s refresh grant; a metadata server; a Cloud Storage XML API; a forwarding
//! proxy in front of the BigQuery emulator's REST API; a gRPC proxy in front of the Pub/Sub
//! emulator and the BigQuery emulator's Storage Write API. Tokens it issued expire: a request with
//! an expired, unknown or missing token is refused (401 / UNAUTHENTICATED) and logged.
//!
//! Every run logs at debug level; no access token, private key, client secret or refresh token
//! may appear in its output.
//!
//! AWS shared config files (issue 44) are at the end: profiles in a temporary HOME, against a
//! SeaweedFS that checks every request's signature.

mod util;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use util::bigquery::shared_bq;
use util::pubsub::{topic, Scenario};
use util::*;

/// google_fake.py, killed (with its process group) on drop.
struct Fake {
    child: Child,
    dir: tempfile::TempDir,
    http: u16,
    grpc: u16,
}

impl Fake {
    fn start(args: &[&str]) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(venv_bin("python"))
            .arg(root().join("tests/py/google_fake.py"))
            .arg(dir.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ports: Value = serde_json::from_str(
            line.strip_prefix("ready ")
                .unwrap_or_else(|| panic!("google_fake.py: {line:?}")),
        )
        .unwrap();
        Fake {
            child,
            http: ports["http"].as_u64().unwrap() as u16,
            grpc: ports["grpc"].as_u64().unwrap() as u16,
            dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    fn grpc_host(&self) -> String {
        format!("127.0.0.1:{}", self.grpc)
    }

    /// The service-account key it made (its token_uri is this server).
    fn sa(&self) -> PathBuf {
        self.dir.path().join("sa.json")
    }

    /// The authorized_user file it made.
    fn user(&self) -> PathBuf {
        self.dir.path().join("user.json")
    }

    fn json(&self, p: &Path) -> Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    }

    fn log(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("log.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn events(&self, ev: &str) -> Vec<Value> {
        self.log().into_iter().filter(|e| e["ev"] == ev).collect()
    }

    /// What must never be printed: every token issued, the private key (each line of its PEM
    /// body), the client secret and the refresh token.
    fn secrets(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .events("grant")
            .iter()
            .filter_map(|g| g["token"].as_str().map(str::to_string))
            .collect();
        let sa = self.json(&self.sa());
        out.extend(
            sa["private_key"]
                .as_str()
                .unwrap()
                .lines()
                .filter(|l| !l.starts_with("-----") && l.len() > 20)
                .map(str::to_string),
        );
        let user = self.json(&self.user());
        for k in ["client_secret", "refresh_token"] {
            out.push(user[k].as_str().unwrap().to_string());
        }
        out
    }

    /// No secret in `text` (a run's stdout and stderr).
    fn assert_no_secret(&self, text: &str) {
        for s in self.secrets() {
            assert!(
                !text.contains(&s),
                "a secret ({}…) was printed:\n{text}",
                &s[..12]
            );
        }
    }

    /// Calls of `api` it saw, at least one, every one with a valid token issued by a grant of
    /// `kind`. The calls.
    fn assert_calls_authorized(&self, api: &str, kind: &str) -> Vec<Value> {
        let calls: Vec<Value> = self
            .events("call")
            .into_iter()
            .filter(|c| c["api"] == api)
            .collect();
        assert!(!calls.is_empty(), "no {api} call reached the fake");
        for c in &calls {
            assert_eq!(c["auth"], "ok", "{api} call without a valid token: {c}");
            assert_eq!(c["kind"], kind, "{c}");
        }
        calls
    }

    /// Its grants: every one granted, of `kind`. Their count.
    fn assert_grants(&self, kind: &str) -> Vec<Value> {
        let grants = self.events("grant");
        assert!(!grants.is_empty(), "no token was asked for");
        for g in &grants {
            assert_eq!(g["ok"], true, "grant refused: {g}");
            assert_eq!(g["kind"], kind, "{g}");
        }
        grants
    }

    /// The Cloud Storage environment of object_store: this server as the XML API.
    fn gcs_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("GOOGLE_BASE_URL", self.url()),
            ("GOOGLE_ALLOW_HTTP", "true".into()),
        ]
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        unsafe {
            libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// `subsink` with none of this machine's Google credentials: the variables of the chain removed,
/// HOME an empty folder (no gcloud file), the metadata server a closed port; `env` added; debug
/// logs.
fn clean(home: &Path, env: &[(&str, String)]) -> Command {
    let mut c = subsink();
    for k in [
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_PATH",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "SERVICE_ACCOUNT",
        "CLOUDSDK_CONFIG",
        "GCE_METADATA_ROOT",
        "GCE_METADATA_IP",
        "SUBSINK_GOOGLE_AUTH",
        "PUBSUB_EMULATOR_HOST",
    ] {
        c.env_remove(k);
    }
    c.env("HOME", home)
        .env("GCE_METADATA_HOST", "127.0.0.1:9")
        .env("GCE_METADATA_IP", "127.0.0.1:9")
        .env("SUBSINK_LOG", "debug");
    c.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    c
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Message ids of the Avro objects below `dir`, sorted.
fn ids_below(dir: &Path) -> Vec<String> {
    let files = objects_below(dir);
    let mut ids = message_ids(&avro_records(&files));
    ids.sort();
    ids
}

/// (a) A service-account key (`GOOGLE_APPLICATION_CREDENTIALS`): its JWT assertion reaches the
/// key's token_uri — RS256, verified with the key's public half; iss, scope, aud, lifetime ≤ 1 h —
/// and the token it gives is on every Cloud Storage request, single puts and multipart uploads.
#[test]
fn service_account_key_jwt_at_token_uri_then_every_gcs_request() {
    let work = tempfile::tempdir().unwrap();
    let gcs = work.path().join("gcs");
    let fake = Fake::start(&["--gcs-dir", gcs.to_str().unwrap()]);
    let input = work.path().join("in.ndjson");
    // 100 + 100 + 50 messages of 1000 bytes: two objects above the 64 KiB threshold (multipart),
    // one below (a single put).
    let mut want = write_numbered_messages(&input, 250, 1000);
    want.sort();
    let mut env = fake.gcs_env();
    env.push((
        "GOOGLE_APPLICATION_CREDENTIALS",
        fake.sa().display().to_string(),
    ));
    let out = clean(work.path(), &env)
        .args(storage_run_cmd("bkt", "avro").get_args())
        .args([
            "--cloud-storage-write-metadata",
            "--cloud-storage-max-messages",
            "100",
            "--avro-block-size",
            "16KiB",
            "--multipart-threshold",
            "64KiB",
            "--part-size",
            "32KiB",
            "--bucket-url",
            "gs://bkt",
            "--source",
        ])
        .arg(&input)
        .arg("--checkpoint")
        .arg(work.path().join("cp.json"))
        .output()
        .unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert_eq!(ids_below(&gcs.join("bkt")), want);

    let grants = fake.assert_grants("jwt");
    assert_eq!(grants.len(), 1, "one token serves the run: {grants:?}");
    let sa = fake.json(&fake.sa());
    let (header, claims) = (&grants[0]["header"], &grants[0]["claims"]);
    assert_eq!(header["alg"], "RS256");
    assert_eq!(header["kid"], sa["private_key_id"]);
    assert_eq!(claims["iss"], sa["client_email"]);
    assert_eq!(
        claims["scope"],
        "https://www.googleapis.com/auth/cloud-platform"
    );
    assert_eq!(claims["aud"], sa["token_uri"]);
    let lifetime = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert!(lifetime > 0 && lifetime <= 3600, "{claims}");

    let calls = fake.assert_calls_authorized("gcs", "jwt");
    let ops: Vec<&str> = calls
        .iter()
        .map(|c| c["method"].as_str().unwrap())
        .collect();
    for op in ["PUT", "INITIATE", "PART", "COMPLETE"] {
        assert!(ops.contains(&op), "no {op} among {ops:?}");
    }
    fake.assert_no_secret(&all);
}

/// (b) An `authorized_user` file in gcloud's well-known place (`~/.config/gcloud/…`): its refresh
/// token is exchanged at its token_uri, and with `SUBSINK_GOOGLE_AUTH=always` the token is on
/// every BigQuery request to the emulator — REST `tables.get` and the Storage Write API (pending
/// streams, appends, commits).
#[test]
fn authorized_user_gcloud_file_then_every_bigquery_request() {
    let bq = shared_bq();
    bq.table(
        "creds",
        "user",
        json!([{"name": "data", "type": "BYTES"}, {"name": "message_id", "type": "STRING"},
               {"name": "subscription_name", "type": "STRING"},
               {"name": "publish_time", "type": "TIMESTAMP"}, {"name": "attributes", "type": "STRING"}]),
    );
    let fake = Fake::start(&[
        "--bq-rest",
        &bq.rest(),
        "--bq-grpc",
        &format!("127.0.0.1:{}", bq.grpc_port),
    ]);
    let home = tempfile::tempdir().unwrap();
    let gcloud = home.path().join(".config/gcloud");
    std::fs::create_dir_all(&gcloud).unwrap();
    std::fs::copy(
        fake.user(),
        gcloud.join("application_default_credentials.json"),
    )
    .unwrap();
    let input = home.path().join("in.ndjson");
    let mut want = write_numbered_messages(&input, 30, 20);
    want.sort();
    let cfg = home.path().join("sub.json");
    std::fs::write(
        &cfg,
        json!({"name": "projects/subsink-bq/subscriptions/creds", "topic": "projects/subsink-bq/topics/events",
               "subsink": {"limits": "extended"},
               "bigqueryConfig": {"table": "subsink-bq.creds.user", "writeMetadata": true}})
        .to_string(),
    )
    .unwrap();
    let storage = format!("http://127.0.0.1:{}", fake.grpc);
    let out = clean(home.path(), &[("SUBSINK_GOOGLE_AUTH", "always".into())])
        .args(["run", "--subscription"])
        .arg(&cfg)
        .arg("--source")
        .arg(&input)
        .args(["--table-url", "bigquery", "--exactly-once", "--checkpoint"])
        .arg(home.path().join("cp.json"))
        .args(["--bigquery-endpoint", &fake.url()])
        .args(["--bigquery-storage-endpoint", &storage])
        .output()
        .unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let mut got: Vec<String> = bq
        .rows("creds", "user", "message_id")
        .iter()
        .map(|r| r["message_id"].as_str().unwrap().to_string())
        .collect();
    got.sort();
    assert_eq!(got, want);

    assert_eq!(fake.assert_grants("refresh").len(), 1);
    fake.assert_calls_authorized("bq-rest", "refresh");
    let calls = fake.assert_calls_authorized("grpc", "refresh");
    let methods: Vec<&str> = calls
        .iter()
        .map(|c| c["method"].as_str().unwrap().rsplit('/').next().unwrap())
        .collect();
    for m in ["CreateWriteStream", "AppendRows", "BatchCommitWriteStreams"] {
        assert!(methods.contains(&m), "no {m} among {methods:?}");
    }
    fake.assert_no_secret(&all);
}

/// The Pub/Sub worker of these tests: `--source pubsub` through the fake's gRPC proxy.
fn pubsub_worker(
    fake: &Fake,
    home: &Path,
    config: &Path,
    bucket_url: &str,
    env: &[(&str, String)],
) -> Child {
    let mut env = env.to_vec();
    env.push(("PUBSUB_EMULATOR_HOST", fake.grpc_host()));
    env.push(("SUBSINK_GOOGLE_AUTH", "always".into()));
    spawn_draining(
        clean(home, &env)
            .args(["run", "--source", "pubsub", "--subscription"])
            .arg(config)
            .arg("--bucket-url")
            .arg(bucket_url)
            .stdout(Stdio::piped()),
    )
}

/// (c) The metadata server on 127.0.0.1 (`GCE_METADATA_IP`, after `GCE_METADATA_HOST` refused the
/// connection): with no key anywhere its token (asked with `Metadata-Flavor: Google`) is on every
/// Pub/Sub call, through a proxy in front of the emulator; every message written and acked.
#[test]
fn metadata_server_token_on_every_pubsub_call() {
    let sc = Scenario::leased();
    let fake = Fake::start(&["--pubsub", &sc.env.emu.host()]);
    let ids = sc.env.publish_n(20, 50);
    let cfg = sc.config(
        json!({"maxMessages": "10", "maxDuration": "600s"}),
        json!({}),
    );
    let worker = pubsub_worker(
        &fake,
        sc.dir.path(),
        &cfg,
        &pubsub::file_url(&sc.bucket),
        // The host refuses the connection: the chain goes on to the IP, as on a machine where
        // `metadata.google.internal` does not resolve.
        &[("GCE_METADATA_IP", format!("127.0.0.1:{}", fake.http))],
    );
    let mut want = ids.clone();
    want.sort();
    poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let got = if sc.bucket.exists() {
            ids_below(&sc.bucket)
        } else {
            vec![]
        };
        (got == want)
            .then_some(())
            .ok_or(format!("{} of 20 written", got.len()))
    });
    // Acked through the proxy: nothing comes back.
    let (_, err) = terminate(worker, Duration::from_secs(30));
    assert!(sc.drain_archive(Duration::from_secs(2)).is_empty());

    let grants = fake.assert_grants("metadata");
    assert_eq!(grants.len(), 1, "{grants:?}");
    assert_eq!(
        grants[0]["scopes"],
        "https://www.googleapis.com/auth/cloud-platform"
    );
    let calls = fake.assert_calls_authorized("grpc", "metadata");
    assert!(
        calls
            .iter()
            .any(|c| c["method"].as_str().unwrap().ends_with("/StreamingPull")),
        "{calls:?}"
    );
    fake.assert_no_secret(&err);
}

/// Tokens that live 3 s: each is renewed at half its life, before the next request, so no request
/// — Cloud Storage puts, Pub/Sub calls — ever carries one that has expired or is about to, over a
/// run of several lifetimes. The key comes from `GOOGLE_SERVICE_ACCOUNT` (object_store's variable).
#[test]
fn tokens_near_expiry_are_renewed_before_use() {
    let sc = Scenario::leased();
    let gcs = sc.dir.path().join("gcs");
    let fake = Fake::start(&[
        "--lifetime",
        "3",
        "--pubsub",
        &sc.env.emu.host(),
        "--gcs-dir",
        gcs.to_str().unwrap(),
    ]);
    let cfg = sc.config(
        json!({"maxDuration": "1s", "maxMessages": "1000"}),
        json!({}),
    );
    let mut env = fake.gcs_env();
    env.push(("GOOGLE_SERVICE_ACCOUNT", fake.sa().display().to_string()));
    let worker = pubsub_worker(&fake, sc.dir.path(), &cfg, "gs://bkt", &env);
    // Messages for 8 s, a few every 700 ms: objects are written all along.
    let start = Instant::now();
    let mut want = Vec::new();
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(8) {
        let batch: Vec<Message> = (i..i + 3).map(|n| numbered_message(n, 30)).collect();
        want.extend(sc.env.publish(&topic("events"), &batch));
        i += 3;
        std::thread::sleep(Duration::from_millis(700));
    }
    want.sort();
    poll(Duration::from_secs(60), Duration::from_millis(200), || {
        let dir = gcs.join("bkt");
        let got = if dir.exists() {
            ids_below(&dir)
        } else {
            vec![]
        };
        (got == want)
            .then_some(())
            .ok_or(format!("{} of {} written", got.len(), want.len()))
    });
    let (_, err) = terminate(worker, Duration::from_secs(30));

    let grants = fake.assert_grants("jwt");
    assert!(
        grants.len() >= 3,
        "8 s of 3 s tokens: {} grants",
        grants.len()
    );
    let mut calls = fake.assert_calls_authorized("gcs", "jwt");
    calls.extend(fake.assert_calls_authorized("grpc", "jwt"));
    // Renewed at half-life (1.5 s left); a request takes milliseconds here.
    for c in &calls {
        let left = c["remaining"].as_f64().unwrap();
        assert!(left > 1.0, "a token with {left} s left was used: {c}");
    }
    let puts = calls.iter().filter(|c| c["method"] == "PUT").count();
    assert!(puts >= 4, "objects written all along: {puts} puts");
    assert!(sc.drain_archive(Duration::from_secs(1)).is_empty());
    fake.assert_no_secret(&err);
}

/// A renewal that fails for now (the token endpoint answers 503) while the token is still valid:
/// the current token goes on being used, and every message is written with it.
#[test]
fn a_failed_renewal_keeps_the_valid_token() {
    let sc = Scenario::leased();
    let gcs = sc.dir.path().join("gcs");
    let fake = Fake::start(&[
        "--lifetime",
        "20",
        "--fail-after",
        "1",
        "--pubsub",
        &sc.env.emu.host(),
        "--gcs-dir",
        gcs.to_str().unwrap(),
    ]);
    let cfg = sc.config(
        json!({"maxDuration": "1s", "maxMessages": "1000"}),
        json!({}),
    );
    let mut env = fake.gcs_env();
    env.push(("GOOGLE_SERVICE_ACCOUNT", fake.sa().display().to_string()));
    let worker = pubsub_worker(&fake, sc.dir.path(), &cfg, "gs://bkt", &env);
    // A token of 20 s is due for renewal after 10 s: messages for 14 s.
    let start = Instant::now();
    let mut want = Vec::new();
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(14) {
        let batch: Vec<Message> = (i..i + 3).map(|n| numbered_message(n, 30)).collect();
        want.extend(sc.env.publish(&topic("events"), &batch));
        i += 3;
        std::thread::sleep(Duration::from_millis(700));
    }
    want.sort();
    poll(Duration::from_secs(5), Duration::from_millis(200), || {
        let dir = gcs.join("bkt");
        let got = if dir.exists() {
            ids_below(&dir)
        } else {
            vec![]
        };
        (got == want)
            .then_some(())
            .ok_or(format!("{} of {} written", got.len(), want.len()))
    });
    let (_, err) = terminate(worker, Duration::from_secs(30));
    let grants = fake.events("grant");
    let ok = grants.iter().filter(|g| g["ok"] == true).count();
    assert_eq!(ok, 1, "{grants:?}");
    assert!(grants.len() > 1, "no renewal was tried: {grants:?}");
    fake.assert_calls_authorized("gcs", "jwt");
    assert!(err.contains("Google token renewal failed"), "{err}");
    fake.assert_no_secret(&err);
}

/// A token endpoint that refuses the grant (a revoked key, an expired refresh token) fails the
/// run at once, naming the source and the endpoint's answer, for Cloud Storage (a key), BigQuery
/// (an authorized_user file) and the Pub/Sub source (a key), and prints no secret.
#[test]
fn a_refused_grant_fails_the_run_at_once() {
    let work = tempfile::tempdir().unwrap();
    let sc = Scenario::leased();
    sc.env.publish_n(3, 10);
    let bq = shared_bq();
    let fake = Fake::start(&[
        "--refuse",
        "--gcs-dir",
        work.path().join("gcs").to_str().unwrap(),
        "--pubsub",
        &sc.env.emu.host(),
        "--bq-rest",
        &bq.rest(),
    ]);
    let input = work.path().join("in.ndjson");
    write_numbered_messages(&input, 5, 10);
    let check = |what: &str, out: Output, took: Duration| {
        let all = text(&out);
        assert!(!out.status.success(), "{what}: {all}");
        assert!(
            took < Duration::from_secs(20),
            "{what}: took {took:?} (retried?): {all}"
        );
        assert!(
            all.contains("refused the grant") && all.contains("invalid_grant"),
            "{what}: the error does not say the grant was refused:\n{all}"
        );
        fake.assert_no_secret(&all);
    };

    // Cloud Storage, a key; --upload-retry-for is left at its 5 minutes.
    let mut env = fake.gcs_env();
    env.push((
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        std::fs::read_to_string(fake.sa()).unwrap(),
    ));
    let t = Instant::now();
    let out = clean(work.path(), &env)
        .args(storage_run_cmd("bkt", "avro").get_args())
        .args(["--bucket-url", "gs://bkt", "--source"])
        .arg(&input)
        .output()
        .unwrap();
    check("gcs", out, t.elapsed());

    // BigQuery, an authorized_user file.
    let cfg = work.path().join("bq.json");
    std::fs::write(
        &cfg,
        json!({"name": "projects/subsink-bq/subscriptions/refused", "topic": "projects/subsink-bq/topics/events",
               "bigqueryConfig": {"table": "subsink-bq.creds.refused"}})
        .to_string(),
    )
    .unwrap();
    let t = Instant::now();
    let out = clean(
        work.path(),
        &[
            (
                "GOOGLE_APPLICATION_CREDENTIALS",
                fake.user().display().to_string(),
            ),
            ("SUBSINK_GOOGLE_AUTH", "always".into()),
        ],
    )
    .args(["run", "--subscription"])
    .arg(&cfg)
    .arg("--source")
    .arg(&input)
    .args([
        "--table-url",
        "bigquery",
        "--bigquery-endpoint",
        &fake.url(),
    ])
    .output()
    .unwrap();
    check("bigquery", out, t.elapsed());

    // The Pub/Sub source, a key.
    let cfg = sc.config(json!({}), json!({}));
    let t = Instant::now();
    let mut worker = pubsub_worker(
        &fake,
        work.path(),
        &cfg,
        &pubsub::file_url(&work.path().join("bucket")),
        &[(
            "GOOGLE_APPLICATION_CREDENTIALS",
            fake.sa().display().to_string(),
        )],
    );
    poll(Duration::from_secs(30), Duration::from_millis(100), || {
        worker
            .try_wait()
            .unwrap()
            .ok_or_else(|| "the Pub/Sub worker still runs".to_string())
    });
    check("pubsub", output(worker), t.elapsed());
    assert!(
        fake.events("call").is_empty(),
        "a request went out without a token"
    );
}

/// The rest of Cloud Storage: a Delta table on `gs://` — its put-if-absent probe (two conditional
/// puts, the second refused, then a delete), Parquet puts, log commits (put-if-absent), listings
/// and reads of the log — every request with the token of an `authorized_user` file named by
/// `GOOGLE_APPLICATION_CREDENTIALS`. The table is read back by the `deltalake` package from the
/// fake's folder.
#[test]
fn authorized_user_then_every_gcs_request_of_a_delta_table() {
    let work = tempfile::tempdir().unwrap();
    let gcs = work.path().join("gcs");
    let fake = Fake::start(&["--gcs-dir", gcs.to_str().unwrap()]);
    let mut env = fake.gcs_env();
    env.push((
        "GOOGLE_APPLICATION_CREDENTIALS",
        fake.user().display().to_string(),
    ));
    let input = root().join("fixtures/table.ndjson");
    let out = clean(work.path(), &env)
        .args(["run", "--subscription"])
        .arg(root().join("examples/table-json.json"))
        .arg("--source")
        .arg(&input)
        .args(["--table-url", "gs://bkt/events", "--table-schema"])
        .arg(root().join("examples/events.schema.json"))
        .output()
        .unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let table = python_json(
        "import deltalake, json, os, sys\n\
         dt = deltalake.DeltaTable(sys.argv[1])\n\
         print(json.dumps({'version': dt.version(), 'ids': sorted(r['message_id'] for r in dt.to_pyarrow_table().to_pylist())}))\n\
         # deltalake's threads can abort the interpreter's teardown (as in tests/table_run.rs).\n\
         sys.stdout.flush(); os._exit(0)",
        &gcs.join("bkt/events").display().to_string(),
        &[],
    );
    let mut want: Vec<String> = messages_of(&input)
        .iter()
        .map(|m| m.message_id.clone())
        .collect();
    want.sort();
    assert_eq!(table["ids"], json!(want), "{table}");

    assert_eq!(fake.assert_grants("refresh").len(), 1);
    let calls = fake.assert_calls_authorized("gcs", "refresh");
    let ops: Vec<&str> = calls
        .iter()
        .map(|c| c["method"].as_str().unwrap())
        .collect();
    for op in ["PUT", "DELETE", "LIST", "GET"] {
        assert!(ops.contains(&op), "no {op} among {ops:?}");
    }
    fake.assert_no_secret(&all);
}

/// By default a plaintext endpoint (an emulator) gets no credentials, even with a key at hand:
/// no token is asked for and the request goes without one (the fake refuses it, as Google
/// would). `SUBSINK_GOOGLE_AUTH` takes `auto` or `always` only.
#[test]
fn plaintext_endpoints_get_no_credentials_unless_asked() {
    let bq = shared_bq();
    let fake = Fake::start(&["--bq-rest", &bq.rest()]);
    let work = tempfile::tempdir().unwrap();
    let input = work.path().join("in.ndjson");
    write_numbered_messages(&input, 3, 10);
    let cfg = work.path().join("bq.json");
    std::fs::write(
        &cfg,
        json!({"name": "projects/subsink-bq/subscriptions/plain", "topic": "projects/subsink-bq/topics/events",
               "bigqueryConfig": {"table": "subsink-bq.creds.plain"}})
        .to_string(),
    )
    .unwrap();
    let run = |mode: Option<&str>| {
        let mut env = vec![(
            "GOOGLE_APPLICATION_CREDENTIALS",
            fake.sa().display().to_string(),
        )];
        if let Some(m) = mode {
            env.push(("SUBSINK_GOOGLE_AUTH", m.to_string()));
        }
        clean(work.path(), &env)
            .args(["run", "--subscription"])
            .arg(&cfg)
            .arg("--source")
            .arg(&input)
            .args([
                "--table-url",
                "bigquery",
                "--bigquery-endpoint",
                &fake.url(),
            ])
            .output()
            .unwrap()
    };
    let out = run(None);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(fake.events("grant").is_empty(), "a token was asked for");
    let calls = fake.events("call");
    assert!(!calls.is_empty());
    assert!(calls.iter().all(|c| c["auth"] == "missing"), "{calls:?}");

    let out = run(Some("sometimes"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("SUBSINK_GOOGLE_AUTH=\"sometimes\": expected `auto` or `always`"),
        "{}",
        text(&out)
    );
    assert_eq!(fake.events("call").len(), calls.len());
}

// AWS shared config files (issue 44, point 3): a profile in `~/.aws/credentials` and
// `~/.aws/config` of a temporary HOME, the binary run with no AWS_* variable but the ones a test
// names, against a SeaweedFS that checks every request's signature.

const AWS_ID: &str = "AKIDPROFILE0001";
const AWS_SECRET: &str = "profile-secret-0001/abc+def";

/// `subsink` as an AWS user runs it: every AWS_* variable removed, HOME `home`, the instance
/// metadata service a closed port; `env` added; subsink's own debug logs.
fn aws_user(home: &Path, env: &[(&str, String)]) -> Command {
    let mut c = subsink();
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            c.env_remove(k);
        }
    }
    c.env("HOME", home)
        .env(
            "AWS_METADATA_ENDPOINT",
            format!("http://127.0.0.1:{}", free_port()),
        )
        .env("SUBSINK_LOG", "subsink=debug")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    c
}

/// `subsink run` writing the fixture messages as Avro to `s3://bucket`.
fn aws_run(home: &Path, bucket: &str, env: &[(&str, String)]) -> Output {
    let mut c = aws_user(home, env);
    c.args([
        "run",
        "--limits",
        "extended",
        "--subscription-name",
        SUB,
        "--topic",
        "projects/proj/topics/top",
        "--cloud-storage-bucket",
        bucket,
        "--cloud-storage-output-format",
        "avro",
        "--bucket-url",
    ])
    .arg(format!("s3://{bucket}"))
    .arg("--source")
    .arg(root().join("fixtures/input/messages.ndjson"));
    c.output().unwrap()
}

/// `~/.aws/<name>` of `home`, written.
fn aws_file(home: &Path, name: &str, text: &str) -> PathBuf {
    let p = home.join(".aws").join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, text).unwrap();
    p
}

/// Objects in `bucket` on the signature-checking server, listed with the profile's keys.
fn aws_list(endpoint: &str, bucket: &str, create: bool) -> Vec<String> {
    let out = venv_python(
        [
            "-c",
            &format!(
                "import boto3, json\n\
                 c = boto3.client('s3', endpoint_url='{endpoint}', region_name='us-east-1', \
                 aws_access_key_id='{AWS_ID}', aws_secret_access_key='{AWS_SECRET}')\n\
                 if {create}: c.create_bucket(Bucket='{bucket}')\n\
                 print(json.dumps([o['Key'] for o in c.list_objects_v2(Bucket='{bucket}').get('Contents', [])]))",
                create = if create { "True" } else { "False" }
            ),
        ],
        &[],
    );
    serde_json::from_str(out.trim()).unwrap()
}

#[test]
fn aws_profile_keys_region_and_endpoint_from_a_temp_home() {
    let weed = util::servers::SeaweedFs::with_identities(&[(AWS_ID, AWS_SECRET)]);
    let endpoint = weed.api().endpoint;
    assert!(aws_list(&endpoint, "profiled", true).is_empty());
    let home = tempfile::tempdir().unwrap();
    let creds = aws_file(
        home.path(),
        "credentials",
        &format!(
            "[default]\naws_access_key_id = AKIDWRONG\naws_secret_access_key = wrong\n\n\
             [dev]\naws_access_key_id = {AWS_ID}\naws_secret_access_key = {AWS_SECRET}\n"
        ),
    );
    aws_file(
        home.path(),
        "config",
        &format!("[default]\nregion = eu-west-3\n\n[profile dev]\nregion = us-east-1\nendpoint_url = {endpoint}\n"),
    );
    let out = aws_run(home.path(), "profiled", &[("AWS_PROFILE", "dev".into())]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert_eq!(summary(&out)["messages_written"], 10, "{all}");
    let objects = aws_list(&endpoint, "profiled", false);
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert!(
        all.contains(&format!(
            "static keys (aws_access_key_id) of AWS profile `dev` in {}",
            creds.display()
        )),
        "{all}"
    );
    assert!(!all.contains(AWS_SECRET), "the secret was printed:\n{all}");

    // The default profile, from files the variables name (none under HOME): a session token
    // goes with the keys. SeaweedFS takes a request with a session token for a temporary
    // credential of its own STS and refuses it: that answer shows the token was sent.
    let elsewhere = tempfile::tempdir().unwrap();
    let creds = elsewhere.path().join("creds.ini");
    let config = elsewhere.path().join("config.ini");
    std::fs::write(
        &creds,
        format!("[default]\naws_access_key_id = {AWS_ID}\naws_secret_access_key = {AWS_SECRET}\n"),
    )
    .unwrap();
    std::fs::write(
        &config,
        format!("[default]\nregion = us-east-1\nendpoint_url = {endpoint}\n"),
    )
    .unwrap();
    let files = [
        ("AWS_SHARED_CREDENTIALS_FILE", creds.display().to_string()),
        ("AWS_CONFIG_FILE", config.display().to_string()),
    ];
    let out = aws_run(home.path(), "profiled", &files);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(aws_list(&endpoint, "profiled", false).len(), 2);
    std::fs::write(
        &creds,
        format!(
            "[default]\naws_access_key_id = {AWS_ID}\naws_secret_access_key = {AWS_SECRET}\n\
             aws_session_token = session-token-0001\n"
        ),
    )
    .unwrap();
    let out = aws_run(home.path(), "profiled", &files);
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("InvalidAccessKeyId"), "{all}");
    assert!(
        all.contains(
            "static keys (aws_access_key_id + aws_session_token) of AWS profile `default`"
        ),
        "{all}"
    );
    assert!(
        !all.contains("session-token-0001") && !all.contains(AWS_SECRET),
        "{all}"
    );
}

#[test]
fn aws_profiles_subsink_cannot_use_are_refused_and_no_credentials_names_the_files() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path().display();
    // No files at all: the chain names the files it looked in.
    let out = aws_run(home.path(), "nowhere", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "no credentials for S3: tried static keys (AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY), \
             the AWS shared config files' profile `default` ({h}/.aws/credentials and \
             {h}/.aws/config): no such profile, web identity"
        )),
        "{err}"
    );
    // A profile AWS_PROFILE names that neither file has.
    let out = aws_run(home.path(), "nowhere", &[("AWS_PROFILE", "prod".into())]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "AWS profile `prod` (AWS_PROFILE) is not in {h}/.aws/credentials and {h}/.aws/config"
        )),
        "{err}"
    );
    // Ways to credentials subsink does not implement: named, never run or printed.
    let config = aws_file(
        home.path(),
        "config",
        "[profile proc]\ncredential_process = /bin/sh -c 'echo SECRET-IN-COMMAND'\n\n\
         [profile role]\nrole_arn = arn:aws:iam::123456789012:role/exporter\nsource_profile = base\n\n\
         [profile base]\naws_access_key_id = AKIDBASE\naws_secret_access_key = base-secret\n",
    );
    for (profile, key) in [("proc", "credential_process"), ("role", "role_arn")] {
        let out = aws_run(home.path(), "nowhere", &[("AWS_PROFILE", profile.into())]);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{all}");
        assert!(
            all.contains(&format!(
                "AWS profile `{profile}` in {}: `{key}` is not supported by subsink; get the \
                 credentials outside subsink (`aws configure export-credentials --profile \
                 {profile} --format env` prints them)",
                config.display()
            )),
            "{all}"
        );
        assert!(
            !all.contains("SECRET-IN-COMMAND") && !all.contains("base-secret"),
            "{all}"
        );
    }
}
