//! Archive replay throughput (issue 25, point 7): 1M archived messages (Avro with metadata, 10
//! objects) replayed into a Delta table in a local folder, by `subsink run --source file://…`
//! against a Python pipeline doing the same job (`benches/archive_replay.py`: fastavro reading,
//! pyarrow building the batch, `deltalake.write_deltalake`). Each contender runs in its own
//! process, measured alone (`wait4`: wall time, CPU seconds, peak RSS); the contenders take turns
//! within each round and every round is printed, then the medians and the ratio (the issue asks
//! for ≥ 5× the Python pipeline's rate). After each round both tables are read back with deltalake
//! and pyarrow (`benches/archive_replay_check.py`, not timed): n rows each, message ids 0..n-1 each
//! once, and the same columns, values (row by row) and Parquet codec in both; the bench fails
//! otherwise.
//!
//! `cargo bench --bench archive_replay`. Environment:
//! * `SUBSINK_BENCH_MESSAGES` — messages (default 1000000), in 10 objects;
//! * `SUBSINK_BENCH_RUNS` — rounds (default 3);
//! * `SUBSINK_BENCH_DIR` — scratch folder (default a temp dir); the archive is made once and kept;
//! * `SUBSINK_VENV` — the test venv with fastavro, pyarrow and deltalake (default `.venv`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use base64::Engine as _;

const SUBSCRIPTION: &str = "projects/bench/subscriptions/replay";

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Run {
    secs: f64,
    cpu_secs: f64,
    peak_rss_mib: f64,
}

/// Run `cmd` to completion, measured alone (its own rusage through `wait4`).
#[allow(clippy::zombie_processes)]
fn measure(mut cmd: Command) -> Run {
    unsafe { libc::sync() };
    let start = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("start child");
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        s
    });
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru) };
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(pid, child.id() as libc::pid_t, "wait4");
    let stdout = reader.join().unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed ({status}): {stdout}"
    );
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Run {
        secs,
        cpu_secs: tv(ru.ru_utime) + tv(ru.ru_stime),
        peak_rss_mib: ru.ru_maxrss as f64 / 1024.0,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn python() -> PathBuf {
    std::env::var_os("SUBSINK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"))
        .join("bin/python")
}

/// `n` messages as NDJSON (400-byte JSON payloads, three attributes), then exported by the binary
/// as 10 Avro-with-metadata objects under `archive`.
fn make_archive(dir: &Path, archive: &Path, n: u64) {
    let input = dir.join("input.ndjson");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
    let b64 = base64::engine::general_purpose::STANDARD;
    for i in 0..n {
        let payload = format!(
            r#"{{"id":{i},"user":"user-{}","kind":"click","pad":"{}"}}"#,
            i % 9973,
            "x".repeat(340)
        );
        writeln!(
            w,
            r#"{{"data":"{}","attributes":{{"source":"bench","shard":"{}","seq":"{i}"}},"messageId":"{i}","publishTime":"2024-05-06T07:08:09.{:06}Z"}}"#,
            b64.encode(payload),
            i % 16,
            i % 1_000_000
        )
        .unwrap();
    }
    w.flush().unwrap();
    drop(w);
    let ok = Command::new(env!("CARGO_BIN_EXE_subsink"))
        .args([
            "run",
            "--limits",
            "extended",
            "--subscription-name",
            "projects/bench/subscriptions/export",
            "--topic",
            "projects/bench/topics/bench-events",
            "--cloud-storage-bucket",
            "archive",
            "--cloud-storage-output-format",
            "avro",
            "--cloud-storage-write-metadata",
            "--cloud-storage-max-messages",
            &(n / 10).max(1).to_string(),
            "--bucket-url",
        ])
        .arg(format!("file://{}", archive.display()))
        .arg("--source")
        .arg(&input)
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "exporting the archive failed");
    std::fs::remove_file(&input).unwrap();
}

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let n = env_num("SUBSINK_BENCH_MESSAGES", 1_000_000);
    let runs = env_num("SUBSINK_BENCH_RUNS", 3);
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = std::env::var_os("SUBSINK_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    let archive = dir.join(format!("archive-{n}"));
    if !archive.exists() {
        let t = Instant::now();
        make_archive(&dir, &archive, n);
        eprintln!(
            "archived {n} messages in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let sub = dir.join("replay-table.json");
    std::fs::write(
        &sub,
        format!(
            r#"{{"name":"{SUBSCRIPTION}","topic":"projects/bench/topics/bench-events",
               "bigqueryConfig":{{"table":"bench.bench.replay","writeMetadata":true}},
               "subsink":{{"table":{{"maxDuration":"600s"}}}}}}"#
        ),
    )
    .unwrap();
    let contenders = ["subsink", "python"];
    let mut results: Vec<Vec<Run>> = vec![Vec::new(), Vec::new()];
    for round in 0..runs {
        for (i, name) in contenders.iter().enumerate() {
            let table = dir.join(format!("table-{name}"));
            let _ = std::fs::remove_dir_all(&table);
            let cmd = match *name {
                "subsink" => {
                    let mut c = Command::new(env!("CARGO_BIN_EXE_subsink"));
                    c.env("SUBSINK_LOG", "error")
                        .args(["run", "--subscription"])
                        .arg(&sub)
                        .arg("--table-url")
                        .arg(format!("file://{}", table.display()))
                        .arg("--source")
                        .arg(format!("file://{}/", archive.display()))
                        .stderr(Stdio::null());
                    c
                }
                _ => {
                    let mut c = Command::new(python());
                    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/archive_replay.py"))
                        .arg(&archive)
                        .arg(&table);
                    c
                }
            };
            let r = measure(cmd);
            println!(
                "round {round} {name:>8}: {:>9.0} msgs/s  {:>6.2} s  cpu {:>6.2} s  peak RSS {:>7.1} MiB",
                n as f64 / r.secs,
                r.secs,
                r.cpu_secs,
                r.peak_rss_mib
            );
            results[i].push(r);
        }
        // Not timed: both tables read back (benches/archive_replay_check.py, deltalake + pyarrow):
        // n rows each, message ids 0..n-1 each once, the same columns, values and codec.
        let tables: Vec<PathBuf> = contenders
            .iter()
            .map(|name| dir.join(format!("table-{name}")))
            .collect();
        let check = Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/archive_replay_check.py"))
            .arg(n.to_string())
            .args(&tables)
            .status()
            .expect("start benches/archive_replay_check.py");
        assert!(
            check.success(),
            "round {round}: the tables' check failed (above)"
        );
    }
    let rate = |rs: &[Run]| n as f64 / median(rs.iter().map(|r| r.secs).collect());
    let rss = |rs: &[Run]| median(rs.iter().map(|r| r.peak_rss_mib).collect());
    let (s, p) = (rate(&results[0]), rate(&results[1]));
    println!(
        "median: subsink {s:.0} msgs/s (peak RSS {:.1} MiB), python {p:.0} msgs/s (peak RSS {:.1} MiB): {:.1}× (goal ≥ 5×)",
        rss(&results[0]),
        rss(&results[1]),
        s / p
    );
}
