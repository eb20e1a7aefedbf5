//! Storage-writer throughput, end to end: NDJSON file → subsink binary → Avro with metadata
//! (layout B) in a local folder. Prints msgs/s, MB/s and the worker's peak RSS.
//!
//! `cargo bench --bench storage_writer` runs 1M messages of ~1 KiB with 3 attributes, then the same
//! job into the discard sink (`--bucket-url discard://`: the pipeline without the store).
//! `SUBSINK_BENCH_BINARIES=old=/path/a,new=/path/b SUBSINK_BENCH_ROUNDS=5` compares builds in
//! interleaved rounds.
//! Environment: `SUBSINK_BENCH_MESSAGES` (default 1000000, e.g. 10000000 for the 10M memory run),
//! `SUBSINK_BENCH_DIR` (scratch folder, default a temp dir), `SUBSINK_BENCH_FASTAVRO=1` to also run
//! the same job with fastavro (needs scripts/setup-test-env).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use base64::Engine as _;

fn generate(path: &Path, n: u64) -> u64 {
    let f = std::fs::File::create(path).unwrap();
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut data = vec![0u8; 1024];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let base = chrono::DateTime::parse_from_rfc3339("2026-11-30T00:00:00Z")
        .unwrap()
        .timestamp_micros();
    let mut b64 = String::with_capacity(2048);
    for i in 0..n {
        for b in data.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = b'a' + (x % 26) as u8;
        }
        b64.clear();
        base64::engine::general_purpose::STANDARD.encode_string(&data, &mut b64);
        let t = chrono::DateTime::from_timestamp_micros(base + i as i64 * 1000).unwrap();
        writeln!(
            w,
            r#"{{"data":"{b64}","attributes":{{"source":"bench","tenant":"t-{}","type":"event.v1"}},"messageId":"{}","publishTime":"{}"}}"#,
            i % 100,
            10_000_000_000u64 + i,
            t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        )
        .unwrap();
    }
    w.flush().unwrap();
    std::fs::metadata(path).unwrap().len()
}

/// Run one job: (seconds, peak RSS in MiB, objects written). Peak RSS is the child's own
/// (wait4), not the largest child's so far.
// The child is reaped by `wait4` (which also gives its own peak RSS), not `Child::wait`.
#[allow(clippy::zombie_processes)]
fn run_job(bin: &Path, sub: &Path, input: &Path, url: &str, n: u64) -> (f64, f64, usize) {
    use std::os::unix::process::ExitStatusExt;
    // Flush earlier runs' dirty pages first: the kernel's writeback of them would otherwise
    // compete for the two cores during the timed run.
    unsafe { libc::sync() };
    let start = Instant::now();
    let child = Command::new(bin)
        .args(["run", "--subscription"])
        .arg(sub)
        .arg("--source")
        .arg(input)
        .arg("--bucket-url")
        .arg(url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.unwrap();
    let mut stderr = child.stderr.unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).unwrap();
        s
    });
    let mut out = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let secs = start.elapsed().as_secs_f64();
    let status = std::process::ExitStatus::from_raw(status);
    assert!(
        status.success(),
        "{} failed: {}",
        bin.display(),
        err.join().unwrap()
    );
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        summary["messages_written"].as_u64().unwrap(),
        n,
        "every message written"
    );
    let objects = summary["objects"].as_array().unwrap().len();
    (secs, ru.ru_maxrss as f64 / 1024.0, objects)
}

fn main() {
    // `cargo test --benches` passes flags like --bench; run only under `cargo bench`.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let n: u64 = std::env::var("SUBSINK_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = std::env::var_os("SUBSINK_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(format!("bench-{n}.ndjson"));
    let size = if input.exists() {
        std::fs::metadata(&input).unwrap().len()
    } else {
        let t = Instant::now();
        let s = generate(&input, n);
        eprintln!(
            "generated {n} messages ({:.1} MB) in {:.1} s",
            s as f64 / 1e6,
            t.elapsed().as_secs_f64()
        );
        s
    };
    let sub = dir.join("bench-subscription.json");
    std::fs::write(
        &sub,
        r#"{"name":"projects/bench/subscriptions/bench","topic":"projects/bench/topics/bench",
            "cloudStorageConfig":{"bucket":"bench","filenameSuffix":".avro","maxDuration":"600s",
            "maxBytes":"10737418240","avroConfig":{"writeMetadata":true}}}"#,
    )
    .unwrap();
    // Contenders: this build, or builds named in SUBSINK_BENCH_BINARIES (`name=/path,name=/path`),
    // run in interleaved rounds (SUBSINK_BENCH_ROUNDS, default 1) so each sees the same machine;
    // then this build once more into the discard sink (the pipeline without the store).
    let binaries: Vec<(String, PathBuf)> = match std::env::var("SUBSINK_BENCH_BINARIES") {
        Ok(list) => list
            .split(',')
            .map(|kv| {
                let (k, v) = kv.split_once('=').expect("name=/path");
                (k.to_string(), PathBuf::from(v))
            })
            .collect(),
        Err(_) => vec![(
            "subsink".into(),
            PathBuf::from(env!("CARGO_BIN_EXE_subsink")),
        )],
    };
    let rounds: usize = std::env::var("SUBSINK_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let bucket = dir.join("bucket");
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); binaries.len()];
    for round in 1..=rounds {
        for (i, (name, bin)) in binaries.iter().enumerate() {
            let _ = std::fs::remove_dir_all(&bucket);
            let url = format!("file://{}", bucket.display());
            let (secs, rss, objects) = run_job(bin, &sub, &input, &url, n);
            let out_bytes: u64 = std::fs::read_dir(&bucket)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum();
            println!(
                "round {round} {name}: {n} msgs in {secs:.2} s: {:.0} msgs/s, {:.1} MB/s input, \
                 {:.1} MB/s output, {objects} objects, peak RSS {rss:.0} MiB",
                n as f64 / secs,
                size as f64 / secs / 1e6,
                out_bytes as f64 / secs / 1e6,
            );
            times[i].push(secs);
            std::fs::remove_dir_all(&bucket).unwrap();
        }
    }
    for (i, (name, _)) in binaries.iter().enumerate() {
        let mut t = times[i].clone();
        t.sort_by(f64::total_cmp);
        println!(
            "{name}: median {:.2} s ({:.0} msgs/s) over {rounds} rounds, min {:.2} s, max {:.2} s",
            t[t.len() / 2],
            n as f64 / t[t.len() / 2],
            t[0],
            t[t.len() - 1]
        );
    }
    let (secs, rss, files) = run_job(
        Path::new(env!("CARGO_BIN_EXE_subsink")),
        &sub,
        &input,
        "discard://",
        n,
    );
    println!(
        "discard sink (no store): {n} msgs in {secs:.2} s: {:.0} msgs/s, {files} files, peak RSS \
         {rss:.0} MiB",
        n as f64 / secs
    );
    if std::env::var_os("SUBSINK_BENCH_FASTAVRO").is_some() {
        let py = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
        let out = Command::new(py)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/fastavro_same_job.py"))
            .arg(&input)
            .arg(dir.join("fastavro.avro"))
            .output()
            .unwrap();
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        let _ = std::fs::remove_file(dir.join("fastavro.avro"));
    }
}
