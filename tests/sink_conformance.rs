//! One set of checks, written once, run on every sink through the real binary (as
//! `tests/conformance.rs` does for the stores): objects in a local folder and on SeaweedFS, a Delta
//! table in a local folder and on SeaweedFS, BigQuery (`--exactly-once`, on the emulator),
//! `discard://`, and `--publish-to` a Pub/Sub topic (the emulator). Each sink is a
//! [`Destination`]: the flags that point subsink at it, what it holds (read back with readers
//! nobody here wrote: fastavro, deltalake, the BigQuery emulator's query API, a Pub/Sub
//! subscription) and what it promises (docs/destinations.md, docs/delivery.md). The checks:
//!
//! * **durable before settle** and **whole files only**: runs from an NDJSON file with
//!   `--checkpoint`, each `kill -9`ed a random moment after its checkpoint moved; after each kill
//!   every message before the checkpoint's watermark is in the destination, and what the
//!   destination shows is whole (every object parses; a table reads completely).
//! * **positions resumed**: a last run from the same checkpoint ends with every input message in
//!   the destination — exactly once where the sink promises it, at least once otherwise — and a
//!   further run writes nothing.
//! * **shutdown within the grace**: SIGTERM mid-run ends the process within `--shutdown-grace`
//!   plus [`subsink::shutdown::CLOSE_WITHIN`]. A destination behind the network stops answering
//!   first (a [`StallProxy`] before it): the run gives up what it could not make durable at the
//!   end of the grace and exits 1 naming it (docs/operating.md, "Shutdown"); a local one drains and
//!   exits 0. Either way the checkpoint passes only what the destination holds.

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;
use util::bigquery::{metadata_columns, shared_bq, BQ_PROJECT};
use util::pubsub::{sub, topic, PubsubEnv};
use util::servers::{shared_seaweedfs, unique_bucket};
use util::stall::StallProxy;
use util::*;

/// `--shutdown-grace` of the shutdown check.
const GRACE: Duration = Duration::from_secs(3);
/// What the shutdown check allows past the grace: the code's own bound on closing.
const CLOSE: Duration = subsink::shutdown::CLOSE_WITHIN;

/// What a sink promises after crashes and a resume from the checkpoint (docs/destinations.md,
/// docs/delivery.md).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Promise {
    /// Every message once (objects and Delta with `--checkpoint`, BigQuery with `--exactly-once`).
    ExactlyOnce,
    /// Every message, some maybe twice (`--publish-to` a topic).
    AtLeastOnce,
    /// Nothing to read back (`discard://`): only the checkpoint and the exit are checked.
    Nothing,
}

/// One sink under test: a fresh, empty destination of it.
trait Destination {
    /// What the failures name.
    fn name(&self) -> String;
    /// What it promises.
    fn promise(&self) -> Promise;
    /// Ports of the servers it writes to (a [`StallProxy`] may stand before each); none for a
    /// local destination.
    fn upstreams(&self) -> Vec<u16> {
        Vec::new()
    }
    /// `subsink run` writing to it, each upstream port reached through `via(port)`; the caller
    /// adds `--source` and `--checkpoint`.
    fn command(&self, via: &dyn Fn(u16) -> u16) -> Command;
    /// The message ids it holds, one per copy, once it holds at least `expect` (a topic's
    /// subscription is drained until then, for a while); `None` when nothing can be read back.
    fn held(&self, expect: &BTreeSet<String>) -> Option<Vec<String>>;
    /// Checks of what is left beside the messages once a run ended normally after the kills.
    fn assert_clean(&self) {}
}

/// The input of every check: `n` numbered messages (ids `100000 + i`, attribute `i`) of `len`
/// bytes in `dir/in.ndjson`.
struct Input {
    path: PathBuf,
    ids: Vec<String>,
    /// The byte offset just past each line.
    ends: Vec<u64>,
}

impl Input {
    fn new(dir: &Path, n: usize, len: usize) -> Input {
        let path = dir.join("in.ndjson");
        let ids = write_numbered_messages(&path, n, len);
        let text = std::fs::read(&path).unwrap();
        let ends = text
            .iter()
            .enumerate()
            .filter(|(_, &c)| c == b'\n')
            .map(|(i, _)| i as u64 + 1)
            .collect();
        Input { path, ids, ends }
    }

    fn size(&self) -> u64 {
        *self.ends.last().unwrap()
    }

    /// The ids of the messages a checkpoint at `watermark` has settled (every line before it).
    fn settled(&self, watermark: u64) -> &[String] {
        let k = self.ends.partition_point(|&e| e <= watermark);
        &self.ids[..k]
    }
}

/// Every message the checkpoint `cp` passed is in `d`; `d` reads whole (its reader panics
/// otherwise).
fn assert_durable_before_settled(d: &dyn Destination, input: &Input, cp: &Path, when: &str) {
    let Some(w) = checkpoint_offset(cp) else {
        return;
    };
    let settled: BTreeSet<String> = input.settled(w).iter().cloned().collect();
    let Some(held) = d.held(&settled) else {
        return;
    };
    let held: BTreeSet<String> = held.into_iter().collect();
    let missing: Vec<&String> = settled.difference(&held).collect();
    assert!(
        missing.is_empty(),
        "{} {when}: the checkpoint (watermark {w}) passed {} messages the destination does not \
         hold, e.g. {:?}",
        d.name(),
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    eprintln!(
        "{} {when}: watermark {w} of {}, {} messages settled, {} held",
        d.name(),
        input.size(),
        settled.len(),
        held.len()
    );
}

/// `d`'s run from `input` with checkpoint `cp` (`extra` added).
fn run_cmd(
    d: &dyn Destination,
    input: &Input,
    cp: &Path,
    via: &dyn Fn(u16) -> u16,
    extra: &[&str],
) -> Command {
    let mut c = d.command(via);
    c.arg("--source")
        .arg(&input.path)
        .arg("--checkpoint")
        .arg(cp)
        .args(extra);
    c
}

/// Durable before settle, whole files only, positions resumed: `rounds` kills, then a resume.
fn crash_and_resume(d: &dyn Destination, input: &Input, cp: &Path, rounds: usize, seed: u64) {
    let direct = |p: u16| p;
    let mut seed = seed;
    let mut last = 0;
    for round in 0..rounds {
        let child = run_cmd(d, input, cp, &direct, &[])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let timing = KillTiming {
            limit: Duration::from_secs(120),
            every: Duration::from_millis(2),
            jitter_ms: 40,
        };
        let label = format!("{} round {round}", d.name());
        let now = kill_after_progress(child, cp, last, &mut seed, timing, &label);
        assert!(
            now > last && now < input.size(),
            "{label}: watermark {now} (was {last}, input {})",
            input.size()
        );
        assert_durable_before_settled(d, input, cp, &format!("after kill {round}"));
        last = now;
    }
    let s = summary(&run_ok(&mut run_cmd(d, input, cp, &direct, &[])));
    assert_eq!(
        checkpoint_offset(cp),
        Some(input.size()),
        "{}: the resumed run did not settle the whole input: {s}",
        d.name()
    );
    let written = s["messages_written"].as_u64().unwrap();
    assert!(
        written < input.ids.len() as u64,
        "{}: the resume wrote the whole input again: {s}",
        d.name()
    );
    let want: BTreeSet<String> = input.ids.iter().cloned().collect();
    if let Some(held) = d.held(&want) {
        let counts = tally(held);
        let lost: Vec<&String> = want.iter().filter(|i| !counts.contains_key(*i)).collect();
        assert!(
            lost.is_empty(),
            "{}: {} messages lost, e.g. {:?}",
            d.name(),
            lost.len(),
            &lost[..lost.len().min(5)]
        );
        let strangers: Vec<&String> = counts.keys().filter(|i| !want.contains(*i)).collect();
        assert!(
            strangers.is_empty(),
            "{}: not input: {strangers:?}",
            d.name()
        );
        let twice: BTreeMap<&String, &usize> = counts.iter().filter(|(_, c)| **c > 1).collect();
        eprintln!(
            "{}: every message held after the resume; {} more than once",
            d.name(),
            twice.len()
        );
        if d.promise() == Promise::ExactlyOnce {
            assert!(
                twice.is_empty(),
                "{}: {} messages written more than once, e.g. {:?}",
                d.name(),
                twice.len(),
                twice.iter().take(5).collect::<Vec<_>>()
            );
        }
    }
    d.assert_clean();
    // A further run from the finished checkpoint finds nothing to do.
    let s = summary(&run_ok(&mut run_cmd(d, input, cp, &direct, &[])));
    assert_eq!(s["messages_written"], 0, "{}: {s}", d.name());
}

/// Shutdown within the grace: a run of `d` (through stall proxies when it has upstreams) is sent
/// SIGTERM once its checkpoint moved — after its destination stopped answering, when it can.
fn shutdown_within_the_grace(d: &dyn Destination, input: &Input, cp: &Path) {
    let proxies: BTreeMap<u16, StallProxy> = d
        .upstreams()
        .into_iter()
        .map(|p| (p, StallProxy::start(p)))
        .collect();
    let via = |p: u16| proxies.get(&p).map_or(p, |s| s.port);
    let grace = format!("{}s", GRACE.as_secs());
    let mut child = spawn_draining(
        run_cmd(d, input, cp, &via, &["--shutdown-grace", &grace]).stdout(Stdio::piped()),
    );
    poll(Duration::from_secs(120), Duration::from_millis(5), || {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{}: the run ended ({status}) before SIGTERM", d.name());
        }
        match checkpoint_offset(cp) {
            Some(o) if o > 0 => Ok(()),
            o => Err(format!("{}: no progress: checkpoint {o:?}", d.name())),
        }
    });
    let stalled = !proxies.is_empty();
    for p in proxies.values() {
        p.stall();
    }
    if stalled {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "{}: the run ended before SIGTERM; give it more input",
        d.name()
    );
    signal(&child, libc::SIGTERM);
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            let err = kill_9(child);
            panic!("{}: still running 60 s after SIGTERM:\n{err}", d.name());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = t0.elapsed();
    let out = output(child);
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "{}: SIGTERM → exit {took:?} ({}, grace {GRACE:?}, stalled: {stalled})",
        d.name(),
        out.status
    );
    assert!(
        took <= GRACE + CLOSE,
        "{}: exited {took:?} after SIGTERM, grace {GRACE:?}:\n{err}",
        d.name()
    );
    if stalled {
        // What could not be made durable is given up at the end of the grace, and named.
        assert!(
            took >= GRACE,
            "{}: exited {took:?} after SIGTERM, before the grace, with its destination silent",
            d.name()
        );
        assert_eq!(out.status.code(), Some(1), "{}: {err}", d.name());
        assert!(
            err.contains("given up at the end of the shutdown grace"),
            "{}: {err}",
            d.name()
        );
    } else {
        assert_eq!(out.status.code(), Some(0), "{}: {err}", d.name());
    }
    drop(proxies);
    assert_durable_before_settled(d, input, cp, "after SIGTERM");
}

/// Crash and resume on a fresh `d` (`make`), with `n` messages of 200 bytes.
fn conform_crash(n: usize, seed: u64, make: impl Fn(&Path) -> Box<dyn Destination>) {
    let work = tempfile::tempdir().unwrap();
    let input = Input::new(work.path(), n, 200);
    let d = make(&work.path().join("crash"));
    crash_and_resume(d.as_ref(), &input, &work.path().join("cp.json"), 3, seed);
}

/// Shutdown within the grace on a fresh `d` (`make`), with `n` messages of 200 bytes.
fn conform_shutdown(n: usize, make: impl Fn(&Path) -> Box<dyn Destination>) {
    let work = tempfile::tempdir().unwrap();
    let input = Input::new(work.path(), n, 200);
    let d = make(&work.path().join("shutdown"));
    shutdown_within_the_grace(d.as_ref(), &input, &work.path().join("cp.json"));
}

// ---- the destinations ------------------------------------------------------------------------

/// Avro objects with metadata, 100 messages each, in a local folder.
struct Folder(PathBuf);

/// Avro objects with metadata, 100 messages each, in a bucket on the shared SeaweedFS.
struct S3Bucket {
    bucket: String,
    scratch: PathBuf,
}

/// A Delta table (metadata columns, 200 rows a commit), in a local folder or on SeaweedFS.
struct Delta {
    dir: PathBuf,
    /// The bucket on SeaweedFS, or none for the local folder `dir/table`.
    bucket: Option<String>,
}

/// A BigQuery table on the emulator, 100 rows a batch, written on the default stream (at least
/// once) or with `--exactly-once` (a PENDING stream a batch: exactly once from a file source with
/// `--checkpoint`).
struct BigQuery {
    dir: PathBuf,
    dataset: String,
    exactly_once: bool,
}

/// `discard://`.
struct Discard;

/// `--publish-to` a topic of the Pub/Sub emulator; what it holds is drained from a subscription
/// of that topic made before the first run (every copy kept across reads).
struct Publish {
    env: std::sync::Arc<PubsubEnv>,
    /// The topic, and its subscription.
    name: String,
    drained: Mutex<Vec<String>>,
}

/// The object flags of the storage checks: Avro with metadata, 100 messages an object.
fn objects_cmd(url: &str) -> Command {
    let mut c = storage_run_cmd("bkt", "avro");
    c.args([
        "--cloud-storage-write-metadata",
        "--cloud-storage-max-messages",
        "100",
        "--bucket-url",
        url,
    ]);
    c
}

/// The message ids of Avro object files, read with fastavro (which fails on a partial one).
fn avro_ids(files: &[PathBuf]) -> Vec<String> {
    message_ids(&avro_records(files))
}

impl Destination for Folder {
    fn name(&self) -> String {
        "objects in a local folder".into()
    }
    fn promise(&self) -> Promise {
        Promise::ExactlyOnce
    }
    fn command(&self, _: &dyn Fn(u16) -> u16) -> Command {
        objects_cmd(&format!("file://{}", self.0.display()))
    }
    fn held(&self, _: &BTreeSet<String>) -> Option<Vec<String>> {
        let files = objects_below(&self.0);
        assert!(
            files.iter().all(|f| !f.to_string_lossy().contains('#')),
            "not an object: {files:?}"
        );
        Some(avro_ids(&files))
    }
    fn assert_clean(&self) {
        // The killed runs' staging files are gone once a run ended normally.
        assert_no_staging(&self.0);
    }
}

fn seaweed() -> S3Api {
    shared_seaweedfs().api()
}

impl Destination for S3Bucket {
    fn name(&self) -> String {
        "objects on SeaweedFS".into()
    }
    fn promise(&self) -> Promise {
        Promise::ExactlyOnce
    }
    fn upstreams(&self) -> Vec<u16> {
        vec![shared_seaweedfs().s3_port]
    }
    fn command(&self, via: &dyn Fn(u16) -> u16) -> Command {
        let mut c = objects_cmd(&format!("s3://{}", self.bucket));
        c.envs(S3Api::on_port(via(shared_seaweedfs().s3_port)).env());
        c
    }
    fn held(&self, _: &BTreeSet<String>) -> Option<Vec<String>> {
        let dir = self.scratch.join(format!("dl-{}", unique_bucket("read")));
        std::fs::create_dir_all(&dir).unwrap();
        let objects = seaweed().download_all(&self.bucket, &dir);
        assert!(
            objects
                .iter()
                .all(|(k, _, _)| !k.contains('#') && !k.starts_with('.')),
            "not an object: {:?}",
            objects.iter().map(|o| &o.0).collect::<Vec<_>>()
        );
        let files: Vec<PathBuf> = objects.into_iter().map(|(_, p, _)| p).collect();
        let ids = avro_ids(&files);
        let _ = std::fs::remove_dir_all(&dir);
        Some(ids)
    }
}

/// Reads a Delta table with deltalake (argv[1] the URL, argv[2] its storage options as JSON):
/// every file its log names must exist and read whole; the message ids, one per row.
const DELTA_IDS: &str = r#"
import json, os, sys
import deltalake
dt = deltalake.DeltaTable(sys.argv[1], storage_options=json.loads(sys.argv[2]) or None)
rows = dt.to_pyarrow_table(columns=["message_id"]).to_pylist()
print(json.dumps([r["message_id"] for r in rows]))
sys.stdout.flush()
os._exit(0)
"#;

impl Delta {
    fn url(&self) -> String {
        match &self.bucket {
            Some(b) => format!("s3://{b}/events"),
            None => format!("file://{}", self.dir.join("table").display()),
        }
    }
}

impl Destination for Delta {
    fn name(&self) -> String {
        match self.bucket {
            Some(_) => "a Delta table on SeaweedFS".into(),
            None => "a Delta table in a local folder".into(),
        }
    }
    fn promise(&self) -> Promise {
        Promise::ExactlyOnce
    }
    fn upstreams(&self) -> Vec<u16> {
        match self.bucket {
            Some(_) => vec![shared_seaweedfs().s3_port],
            None => Vec::new(),
        }
    }
    fn command(&self, via: &dyn Fn(u16) -> u16) -> Command {
        let cfg = self.dir.join("table.json");
        std::fs::write(
            &cfg,
            json!({"name": SUB, "topic": "projects/proj/topics/top",
                   "bigqueryConfig": {"table": "p.d.t", "writeMetadata": true},
                   "subsink": {"table": {"maxMessages": "200"}}})
            .to_string(),
        )
        .unwrap();
        let mut c = subsink();
        c.args(["run", "--subscription"])
            .arg(&cfg)
            .args(["--table-url", &self.url()]);
        if self.bucket.is_some() {
            c.envs(S3Api::on_port(via(shared_seaweedfs().s3_port)).env());
        }
        c
    }
    fn held(&self, _: &BTreeSet<String>) -> Option<Vec<String>> {
        if self.bucket.is_none() && !self.dir.join("table/_delta_log").exists() {
            return Some(Vec::new());
        }
        let (options, env) = match &self.bucket {
            Some(_) => {
                let api = seaweed();
                let mut o: BTreeMap<&str, String> = api.options().into_iter().collect();
                o.insert("aws_s3_allow_unsafe_rename", "true".into());
                (json!(o).to_string(), api.env())
            }
            None => ("{}".to_string(), Vec::new()),
        };
        let out = venv_python(["-c", DELTA_IDS, &self.url(), &options], &env);
        Some(serde_json::from_str(out.trim()).unwrap())
    }
}

impl BigQuery {
    fn new(dir: &Path, exactly_once: bool) -> BigQuery {
        std::fs::create_dir_all(dir).unwrap();
        let dataset = unique_bucket("conf").replace('-', "_");
        shared_bq().table(&dataset, "t", metadata_columns());
        BigQuery {
            dir: dir.to_path_buf(),
            dataset,
            exactly_once,
        }
    }
}

impl Destination for BigQuery {
    fn name(&self) -> String {
        match self.exactly_once {
            true => "BigQuery with --exactly-once".into(),
            false => "BigQuery on the default stream".into(),
        }
    }
    fn promise(&self) -> Promise {
        match self.exactly_once {
            true => Promise::ExactlyOnce,
            false => Promise::AtLeastOnce,
        }
    }
    fn upstreams(&self) -> Vec<u16> {
        vec![shared_bq().rest_port, shared_bq().grpc_port]
    }
    fn command(&self, via: &dyn Fn(u16) -> u16) -> Command {
        let bq = shared_bq();
        let cfg = self.dir.join("bq.json");
        std::fs::write(
            &cfg,
            json!({"name": SUB, "topic": "projects/proj/topics/top",
                   "bigqueryConfig": {"table": "x.y.z", "writeMetadata": true},
                   "subsink": {"limits": "extended", "table": {"maxMessages": "100"}}})
            .to_string(),
        )
        .unwrap();
        let mut c = subsink();
        c.arg("run");
        if self.exactly_once {
            c.arg("--exactly-once");
        }
        c.arg("--subscription")
            .arg(&cfg)
            .args(["--table-url", &bq.url(&self.dataset, "t")])
            .args([
                "--bigquery-endpoint".to_string(),
                format!("http://127.0.0.1:{}", via(bq.rest_port)),
                "--bigquery-storage-endpoint".to_string(),
                format!("http://127.0.0.1:{}", via(bq.grpc_port)),
            ]);
        c
    }
    fn held(&self, _: &BTreeSet<String>) -> Option<Vec<String>> {
        let rows = shared_bq().query(&format!(
            "SELECT message_id FROM `{BQ_PROJECT}.{}.t`",
            self.dataset
        ));
        Some(
            rows.iter()
                .map(|r| r["message_id"].as_str().unwrap().to_string())
                .collect(),
        )
    }
}

impl Destination for Discard {
    fn name(&self) -> String {
        "discard://".into()
    }
    fn promise(&self) -> Promise {
        Promise::Nothing
    }
    fn command(&self, _: &dyn Fn(u16) -> u16) -> Command {
        objects_cmd("discard://")
    }
    fn held(&self, _: &BTreeSet<String>) -> Option<Vec<String>> {
        None
    }
}

impl Publish {
    fn new(env: std::sync::Arc<PubsubEnv>) -> Publish {
        let name = unique_bucket("conf");
        env.rt
            .block_on(env.client.create_topic(&topic(&name)))
            .unwrap();
        env.subscribe(&sub(&name), &topic(&name));
        Publish {
            env,
            name,
            drained: Mutex::new(Vec::new()),
        }
    }
}

impl Destination for Publish {
    fn name(&self) -> String {
        "--publish-to a Pub/Sub topic".into()
    }
    fn promise(&self) -> Promise {
        Promise::AtLeastOnce
    }
    fn upstreams(&self) -> Vec<u16> {
        vec![self.env.emu.port()]
    }
    fn command(&self, via: &dyn Fn(u16) -> u16) -> Command {
        let mut c = storage_run_cmd("bkt", "text");
        c.arg("--publish-to").arg(topic(&self.name)).env(
            "PUBSUB_EMULATOR_HOST",
            format!("127.0.0.1:{}", via(self.env.emu.port())),
        );
        c
    }
    fn held(&self, expect: &BTreeSet<String>) -> Option<Vec<String>> {
        let mut drained = self.drained.lock().unwrap();
        let start = Instant::now();
        loop {
            // Messages the reader had leased when its window closed come back after their ack
            // deadline (30 s): the read goes on for longer than that before it gives up.
            let got = self.env.drain(&sub(&self.name), Duration::from_secs(2));
            drained.extend(got.iter().map(|m| {
                let i: usize = m.attributes.get("i").unwrap().parse().unwrap();
                format!("{}", 100_000 + i)
            }));
            let have: BTreeSet<&String> = drained.iter().collect();
            let complete = expect.iter().all(|i| have.contains(i));
            if (complete && got.is_empty()) || start.elapsed() > Duration::from_secs(75) {
                return Some(drained.clone());
            }
        }
    }
}

// ---- the tests: each check on each sink ----------------------------------------------------

/// A fresh local folder of objects below `dir`.
fn folder(dir: &Path) -> Box<dyn Destination> {
    Box::new(Folder(dir.join("bucket")))
}

/// A fresh bucket of objects on the shared SeaweedFS.
fn s3_bucket(dir: &Path) -> Box<dyn Destination> {
    std::fs::create_dir_all(dir).unwrap();
    let bucket = unique_bucket("conf");
    seaweed().create_bucket(&bucket);
    Box::new(S3Bucket {
        bucket,
        scratch: dir.to_path_buf(),
    })
}

/// A fresh Delta table in a local folder below `dir`.
fn delta_file(dir: &Path) -> Box<dyn Destination> {
    std::fs::create_dir_all(dir).unwrap();
    Box::new(Delta {
        dir: dir.to_path_buf(),
        bucket: None,
    })
}

/// A fresh Delta table in a bucket of the shared SeaweedFS.
fn delta_s3(dir: &Path) -> Box<dyn Destination> {
    std::fs::create_dir_all(dir).unwrap();
    let bucket = unique_bucket("conf");
    seaweed().create_bucket(&bucket);
    Box::new(Delta {
        dir: dir.to_path_buf(),
        bucket: Some(bucket),
    })
}

#[test]
fn objects_in_a_local_folder_crash_and_resume() {
    conform_crash(20_000, 0x2545_F491_4F6C_DD1D, folder);
}

#[test]
fn objects_in_a_local_folder_shutdown_within_the_grace() {
    conform_shutdown(6_000, folder);
}

#[test]
fn objects_on_seaweedfs_crash_and_resume() {
    conform_crash(20_000, 0x9E37_79B9_7F4A_7C15, s3_bucket);
}

#[test]
fn objects_on_seaweedfs_shutdown_within_the_grace() {
    conform_shutdown(6_000, s3_bucket);
}

#[test]
fn a_delta_table_in_a_local_folder_crash_and_resume() {
    conform_crash(20_000, 0x5eed_0001, delta_file);
}

#[test]
fn a_delta_table_in_a_local_folder_shutdown_within_the_grace() {
    conform_shutdown(6_000, delta_file);
}

#[test]
fn a_delta_table_on_seaweedfs_crash_and_resume() {
    conform_crash(20_000, 0x5eed_0002, delta_s3);
}

#[test]
fn a_delta_table_on_seaweedfs_shutdown_within_the_grace() {
    conform_shutdown(6_000, delta_s3);
}

#[test]
fn bigquery_on_the_default_stream_crash_and_resume() {
    let _serial = util::bigquery::serial();
    conform_crash(20_000, 0x5eed_0006, |dir| {
        Box::new(BigQuery::new(dir, false))
    });
}

#[test]
fn bigquery_on_the_default_stream_shutdown_within_the_grace() {
    let _serial = util::bigquery::serial();
    conform_shutdown(3_000, |dir| Box::new(BigQuery::new(dir, false)));
}

#[test]
fn bigquery_with_exactly_once_crash_and_resume() {
    let _serial = util::bigquery::serial();
    conform_crash(20_000, 0x5eed_0003, |dir| {
        Box::new(BigQuery::new(dir, true))
    });
}

#[test]
fn bigquery_with_exactly_once_shutdown_within_the_grace() {
    let _serial = util::bigquery::serial();
    conform_shutdown(3_000, |dir| Box::new(BigQuery::new(dir, true)));
}

#[test]
fn discard_crash_and_resume() {
    conform_crash(100_000, 0x5eed_0004, |_| Box::new(Discard));
}

#[test]
fn discard_shutdown_within_the_grace() {
    conform_shutdown(100_000, |_| Box::new(Discard));
}

// The publish tests start an emulator each (a JVM that dies with its test).
#[test]
fn publish_to_a_pubsub_topic_crash_and_resume() {
    let env = std::sync::Arc::new(PubsubEnv::start());
    conform_crash(20_000, 0x5eed_0005, |_| Box::new(Publish::new(env.clone())));
}

#[test]
fn publish_to_a_pubsub_topic_shutdown_within_the_grace() {
    let env = std::sync::Arc::new(PubsubEnv::start());
    conform_shutdown(20_000, |_| Box::new(Publish::new(env.clone())));
}
