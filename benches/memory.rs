//! The documented memory claims, measured on the release binary and asserted: peak RSS (`wait4` on the
//! worker alone) must stay within the bound the docs state, not grow with `maxBytes` or a backlog.
//!
//! * Storage (docs/destinations.md, Objects): "Memory per open file is bounded by the threshold, the Avro block
//!   and the parts in flight, not by `maxBytes`." The same input is written once in small files
//!   (`maxBytes` 1 MiB) and once as one object (`maxBytes` 10 GiB, a streaming multipart upload);
//!   the second may use at most `multipart_threshold + avro_block + part_size × parts in flight`
//!   (16 + 1 + 2 × 8 MiB, the defaults) more.
//! * Table (docs/decisions.md, Table writer decisions): "Memory is bounded by configuration: the open file's
//!   compressed pages (about a tenth of `maxBytes` for JSON events), a 4 MiB chunk being converted,
//!   four chunks queued for the encoder, and the files still committing." The same input is
//!   committed in 8 MiB batches and in one 1 GiB batch; the second may use at most a tenth of its
//!   message bytes plus 5 × 4 MiB more.
//! * Pub/Sub (docs/sources.md, Pub/Sub flow control): "memory stays bounded even where the server ignores flow
//!   control (the emulator does)". A backlog several times `--max-outstanding-bytes` is drained
//!   into one large object; the worker may use at most the small-file storage run's peak plus
//!   `--max-outstanding-bytes` plus one open file's bound.
//!
//! * One bound (docs/operating.md, How to size a pod; issue 26): peak RSS ≤ `--memory-limit` + 64 MiB
//!   for any message size. 20 messages of 9 MiB and `SUBSINK_BENCH_SIZED` (default 1,000,000)
//!   messages of 1 KiB, through the storage writer (Avro with metadata) and the table writer
//!   (Delta, `writeMetadata`), each with `--memory-limit` 64 MiB and 256 MiB; 20 × 9 MiB into
//!   BigQuery (the emulator) and from Pub/Sub (the emulator) at 64 MiB; each at rest (the same
//!   runs as `tests/memory.rs` on the debug build, from `tests/memory/sized.rs`).
//!
//! `cargo bench --bench memory`. Environment: `SUBSINK_BENCH_MESSAGES` (storage and table
//! messages, default 300000), `SUBSINK_BENCH_BACKLOG` (Pub/Sub messages of 1 KiB, default 300000),
//! `SUBSINK_BENCH_ONLY` (a comma-separated subset of `storage,table,pubsub,sized`), `SUBSINK_BENCH_DIR`.

#[path = "../tests/memory/sized.rs"]
mod sized;
#[path = "../tests/util/mod.rs"]
mod util;

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use subsink::message::{Message, WireDefaults};
use subsink::pubsub::{PubsubClient, SubscriptionSpec};

const MIB: f64 = 1024.0 * 1024.0;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn wanted(what: &str) -> bool {
    std::env::var("SUBSINK_BENCH_ONLY")
        .map(|o| o.split(',').any(|x| x == what))
        .unwrap_or(true)
}

/// Peak RSS (MiB) and wall seconds of `cmd`, measured alone with `wait4`; stdout returned.
// The child is reaped by `wait4`, not `Child::wait`, which cannot return its rusage.
#[allow(clippy::zombie_processes)]
fn measure(mut cmd: Command) -> (f64, f64, String) {
    unsafe { libc::sync() };
    let start = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("start child");
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        s
    });
    let (status, ru) = wait4(child.id());
    let secs = start.elapsed().as_secs_f64();
    let stdout = reader.join().unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed ({status}): {stdout}"
    );
    (ru.ru_maxrss as f64 / 1024.0, secs, stdout)
}

fn wait4(pid: u32) -> (i32, libc::rusage) {
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let got = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut ru) };
    assert_eq!(got, pid as libc::pid_t, "wait4");
    (status, ru)
}

fn subsink() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_subsink"));
    c.env("SUBSINK_LOG", "warn");
    c
}

/// `n` messages of 1 KiB of pseudo-random letters with three attributes (the storage bench's).
fn generate_storage_input(path: &Path, n: u64) {
    use base64::Engine as _;
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut data = vec![0u8; 1024];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..n {
        for b in data.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = b'a' + (x % 26) as u8;
        }
        let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
        writeln!(
            w,
            r#"{{"data":"{b64}","attributes":{{"source":"bench","tenant":"t-{}","type":"event.v1"}},"messageId":"{}","publishTime":"2026-11-30T00:00:00Z"}}"#,
            i % 100,
            10_000_000_000u64 + i
        )
        .unwrap();
    }
    w.flush().unwrap();
}

/// Message bytes (payload + attribute keys and values) of an NDJSON file: what `maxBytes` counts.
fn message_bytes(path: &Path) -> u64 {
    let f = BufReader::new(std::fs::File::open(path).unwrap());
    let d = WireDefaults {
        publish_time_micros: Some(0),
    };
    f.lines()
        .map(|l| {
            let m = Message::from_json_line(l.unwrap().as_bytes(), d).unwrap().0;
            m.data.len() as u64
                + m.attributes
                    .iter()
                    .map(|(k, v)| (k.len() + v.len()) as u64)
                    .sum::<u64>()
        })
        .sum()
}

/// Open-file bound of docs/destinations.md for the storage writer with the default flags: multipart threshold
/// 16 MiB + Avro block 1 MiB + 2 parts in flight of 8 MiB.
const OPEN_FILE_MIB: f64 = 16.0 + 1.0 + 2.0 * 8.0;

fn storage(dir: &Path, n: u64, failures: &mut Vec<String>) -> f64 {
    let input = dir.join(format!("storage-{n}.ndjson"));
    if !input.exists() {
        generate_storage_input(&input, n);
    }
    let size = std::fs::metadata(&input).unwrap().len();
    let mut peaks = Vec::new();
    for (label, max_bytes) in [("1 MiB files", "1048576"), ("one object", "10737418240")] {
        let bucket = dir.join("bucket");
        let _ = std::fs::remove_dir_all(&bucket);
        let sub = dir.join("storage.json");
        std::fs::write(
            &sub,
            format!(
                r#"{{"name":"projects/bench/subscriptions/bench","topic":"projects/bench/topics/bench",
                   "cloudStorageConfig":{{"bucket":"bench","maxDuration":"600s","maxBytes":"{max_bytes}",
                   "avroConfig":{{"writeMetadata":true}}}}}}"#
            ),
        )
        .unwrap();
        let mut c = subsink();
        c.args(["run", "--subscription"])
            .arg(&sub)
            .arg("--source")
            .arg(&input)
            .arg("--bucket-url")
            .arg(format!("file://{}", bucket.display()));
        let (peak, secs, out) = measure(c);
        let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(s["messages_written"], n);
        let objects = s["objects"].as_array().unwrap().len();
        println!(
            "storage, {label} (maxBytes {max_bytes}): {n} msgs ({:.0} MB input) in {secs:.1} s, \
             {objects} objects, peak RSS {peak:.0} MiB",
            size as f64 / 1e6
        );
        peaks.push(peak);
        std::fs::remove_dir_all(&bucket).unwrap();
    }
    let bound = peaks[0] + OPEN_FILE_MIB;
    println!(
        "storage: one object {:.0} MiB <= small files {:.0} MiB + open-file bound {OPEN_FILE_MIB:.0} MiB = {bound:.0} MiB",
        peaks[1], peaks[0]
    );
    if peaks[1] > bound {
        failures.push(format!(
            "storage: peak RSS {:.0} MiB with maxBytes 10 GiB exceeds the documented bound {bound:.0} MiB",
            peaks[1]
        ));
    }
    peaks[0]
}

fn table(dir: &Path, n: u64, failures: &mut Vec<String>) {
    let input = dir.join(format!("table-{n}.ndjson"));
    if !input.exists() {
        let ok = Command::new("python3")
            .arg(util::root().join("benches/table_data.py"))
            .arg(&input)
            .arg(n.to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "benches/table_data.py failed");
    }
    let bytes = message_bytes(&input);
    let mut peaks = Vec::new();
    for (label, max_bytes) in [("8 MiB batches", "8MiB"), ("one 1 GiB batch", "1GiB")] {
        let table = dir.join("table");
        let _ = std::fs::remove_dir_all(&table);
        let sub = dir.join("table.json");
        std::fs::write(
            &sub,
            r#"{"name":"projects/bench/subscriptions/bench","topic":"projects/bench/topics/bench",
               "bigqueryConfig":{"table":"bench.bench.events","useTableSchema":true,"writeMetadata":true},
               "subsink":{"table":{"maxDuration":"600s"}}}"#,
        )
        .unwrap();
        let mut c = subsink();
        c.args(["run", "--subscription"])
            .arg(&sub)
            .arg("--source")
            .arg(&input)
            .arg("--table-url")
            .arg(format!("file://{}", table.display()))
            .arg("--table-schema")
            .arg(util::root().join("benches/table_events.schema.json"))
            .args(["--table-max-bytes", max_bytes]);
        let (peak, secs, out) = measure(c);
        let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(s["messages_written"], n);
        let files = std::fs::read_dir(&table)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "parquet")
            })
            .count();
        println!(
            "table, {label}: {n} msgs ({:.0} MiB of message bytes) in {secs:.1} s, {files} files, \
             peak RSS {peak:.0} MiB",
            bytes as f64 / MIB
        );
        peaks.push(peak);
        std::fs::remove_dir_all(&table).unwrap();
    }
    // The 1 GiB file holds the whole input: its compressed pages are about a tenth of the input's
    // message bytes; a chunk converting and four queued are 4 MiB each.
    let extra = bytes.min(1 << 30) as f64 / 10.0 / MIB + 5.0 * 4.0;
    let bound = peaks[0] + extra;
    println!(
        "table: one batch {:.0} MiB <= 8 MiB batches {:.0} MiB + {extra:.0} MiB = {bound:.0} MiB",
        peaks[1], peaks[0]
    );
    if peaks[1] > bound {
        failures.push(format!(
            "table: peak RSS {:.0} MiB with one 1 GiB batch exceeds the documented bound {bound:.0} MiB",
            peaks[1]
        ));
    }
}

// The worker is reaped by `wait4`, not `Child::wait`, which cannot return its rusage.
#[allow(clippy::zombie_processes)]
fn pubsub(dir: &Path, n: usize, small_files_peak: f64, failures: &mut Vec<String>) {
    // The backlog lives in the emulator's heap.
    if std::env::var_os("SUBSINK_EMULATOR_JAVA_OPTS").is_none() {
        std::env::set_var("SUBSINK_EMULATOR_JAVA_OPTS", "-Xmx4g -XX:+UseParallelGC");
    }
    let emu = util::emulator::Emulator::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt
        .block_on(PubsubClient::connect_emulator(&emu.host()))
        .unwrap();
    let topic = "projects/bench/topics/events";
    let sub = "projects/bench/subscriptions/backlog";
    rt.block_on(async {
        client.create_topic(topic).await.unwrap();
        let mut spec = SubscriptionSpec::new(sub, topic);
        spec.ack_deadline_seconds = 60;
        client.create_subscription(&spec).await.unwrap();
    });
    let t = Instant::now();
    let payload = vec![b'p'; 1024];
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let msgs: Vec<Message> = chunk
            .iter()
            .map(|&i| Message {
                data: payload.clone().into(),
                attributes: [("i".to_string(), i.to_string())].into(),
                ..Default::default()
            })
            .collect();
        rt.block_on(client.publish(topic, &msgs)).unwrap();
    }
    let backlog_mib = (n * 1024) as f64 / MIB;
    eprintln!(
        "published a backlog of {n} messages ({backlog_mib:.0} MiB) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let cfg = dir.join("pubsub.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"name":"{sub}","topic":"{topic}","subsink":{{"limits":"extended"}},
               "cloudStorageConfig":{{"bucket":"bench","maxDuration":"600s","maxBytes":"10737418240",
               "maxMessages":"100000","avroConfig":{{"writeMetadata":true}}}}}}"#
        ),
    )
    .unwrap();
    let bucket = dir.join("pubsub-bucket");
    let _ = std::fs::remove_dir_all(&bucket);
    let outstanding_mib = 100.0;
    unsafe { libc::sync() };
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_subsink"))
        .env("PUBSUB_EMULATOR_HOST", emu.host())
        .env("SUBSINK_LOG", "subsink=info")
        .args(["run", "--source", "pubsub", "--subscription"])
        .arg(&cfg)
        .arg("--bucket-url")
        .arg(format!("file://{}", bucket.display()))
        .args(["--max-outstanding-bytes", "100MiB"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The log is read to its end on a thread of its own: a worker whose stderr was closed
    // would fail writing its shutdown lines.
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let stderr = child.stderr.take().unwrap();
    let logger = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap();
            if line.contains("acked after durable") {
                if let Some(m) = line.split("messages=").nth(1) {
                    let _ = tx.send(m.trim().parse::<usize>().unwrap_or(0));
                }
            }
        }
    });
    let mut acked = 0usize;
    while acked < n {
        match rx.recv_timeout(Duration::from_secs(900)) {
            Ok(k) => acked += k,
            Err(_) => break,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (status, ru) = wait4(child.id());
    logger.join().unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "worker status {status}"
    );
    assert_eq!(acked, n, "every message of the backlog written and acked");
    let peak = ru.ru_maxrss as f64 / 1024.0;
    let bound = small_files_peak + outstanding_mib + OPEN_FILE_MIB;
    println!(
        "pubsub: backlog {n} msgs ({backlog_mib:.0} MiB) drained in {secs:.1} s into objects of \
         100k messages, peak RSS {peak:.0} MiB <= storage run {small_files_peak:.0} MiB + \
         max outstanding {outstanding_mib:.0} MiB + open file {OPEN_FILE_MIB:.0} MiB = {bound:.0} MiB"
    );
    if peak > bound {
        failures.push(format!(
            "pubsub: peak RSS {peak:.0} MiB draining a {backlog_mib:.0} MiB backlog exceeds {bound:.0} MiB"
        ));
    }
    let _ = std::fs::remove_dir_all(&bucket);
}

/// The fixed overhead docs/operating.md (How to size a pod) states over `--memory-limit`.
const FIXED_OVERHEAD_MIB: f64 = 64.0;

/// The runs of `tests/memory.rs` (issue 26) on the release binary, reporting the same figures:
/// 20 × 9 MiB and `small` × 1 KiB through the storage writer (Avro with metadata) and Delta
/// (`writeMetadata`) at 64 and 256 MiB, 20 × 9 MiB through BigQuery (the emulator) and from
/// Pub/Sub (the emulator) at 64 MiB, and each writer at rest (one message of 16 bytes). Peak RSS
/// must stay within limit + 64 MiB, and within limit + at rest + `DYNAMIC_MIB` as the test
/// asserts.
fn sized(dir: &Path, small: u64, failures: &mut Vec<String>) {
    use sized::{Writer, LARGE_BYTES, LARGE_COUNT, SMALL_BYTES};
    let mut check = |what: &str, limit: u64, rest: f64, r: &sized::Sized, count: usize| {
        let bound = sized::bound_for(limit, rest);
        let fixed = limit as f64 + FIXED_OVERHEAD_MIB;
        println!(
            "sized: {what}, --memory-limit {limit}MiB: peak RSS {:.0} MiB (limit + {:.0}; at \
             rest {rest:.0}, so limit + at rest + {:.0}), written {} in {:.1} s; bounds {fixed:.0} \
             and {bound:.0} MiB",
            r.peak_mib,
            r.peak_mib - limit as f64,
            r.peak_mib - limit as f64 - rest,
            r.written,
            r.seconds
        );
        if r.written < count as u64 {
            failures.push(format!("sized {what} {limit}: written {}", r.written));
        }
        if r.peak_mib > fixed.min(bound) {
            failures.push(format!(
                "sized {what} {limit} MiB: peak RSS {:.0} MiB > {:.0} MiB",
                r.peak_mib,
                fixed.min(bound)
            ));
        }
    };
    let large = sized::sized_input(dir, LARGE_COUNT, LARGE_BYTES);
    let many = sized::sized_input(dir, small as usize, SMALL_BYTES);
    for writer in [Writer::Storage, Writer::Delta] {
        let rest = sized::at_rest(dir, writer);
        println!("sized: {writer:?} at rest (1 message of 16 bytes): peak RSS {rest:.0} MiB");
        for (input, count, what) in [
            (&large, LARGE_COUNT, "9 MiB"),
            (&many, small as usize, "1 KiB"),
        ] {
            for limit in [64u64, 256] {
                let r = sized::sized_run(dir, input, writer, &format!("{limit}MiB"));
                check(
                    &format!("{count} x {what}, {writer:?}"),
                    limit,
                    rest,
                    &r,
                    count,
                );
            }
        }
    }
    let rest = sized::at_rest(dir, Writer::BigQuery);
    println!("sized: BigQuery at rest: peak RSS {rest:.0} MiB");
    let r = sized::sized_run(dir, &large, Writer::BigQuery, "64MiB");
    check("20 x 9 MiB, BigQuery", 64, rest, &r, LARGE_COUNT);
    let env = util::pubsub::PubsubEnv::start();
    let tiny = sized::sized_input(dir, 1, 16);
    let rest = sized::pubsub_run(dir, &env, "rest", &tiny, 1, "64MiB").peak_mib;
    println!("sized: Pub/Sub source at rest: peak RSS {rest:.0} MiB");
    let r = sized::pubsub_run(dir, &env, "large", &large, LARGE_COUNT, "64MiB");
    check(
        "20 x 9 MiB from Pub/Sub, storage",
        64,
        rest,
        &r,
        LARGE_COUNT,
    );
}

fn main() {
    // `cargo test --benches` passes flags like --bench; run only under `cargo bench`.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let n = env_num("SUBSINK_BENCH_MESSAGES", 300_000);
    let backlog = env_num("SUBSINK_BENCH_BACKLOG", 300_000) as usize;
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = std::env::var_os("SUBSINK_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    // Every part runs and prints its numbers; the bounds are checked at the end.
    let mut failures = Vec::new();
    let mut small_files_peak = None;
    if wanted("storage") || wanted("pubsub") {
        small_files_peak = Some(storage(&dir, n, &mut failures));
    }
    if wanted("table") {
        table(&dir, n, &mut failures);
    }
    if wanted("pubsub") {
        pubsub(&dir, backlog, small_files_peak.unwrap(), &mut failures);
    }
    if wanted("sized") {
        sized(
            &dir,
            env_num("SUBSINK_BENCH_SIZED", 1_000_000),
            &mut failures,
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
