//! Change data capture into Delta, end to end (issue 35): NDJSON Pub/Sub messages whose payloads are
//! UPSERTs and DELETEs of rows keyed by `id`, with `_CHANGE_SEQUENCE_NUMBER`s (made by
//! `benches/cdc_data.py`: 100k changes over 5k keys, ~25% deletes, numbers rising per key in one
//! or two sections, ~5% delivered late, so ~3% arrive after a higher number of their key) → one
//! MERGE per batch of changes into a Delta table in a local folder. Each contender runs in its own
//! process, measured alone (`wait4`: CPU seconds and peak RSS), and the medians come at the end.
//!
//! `cargo bench --bench cdc_merge` (with `CARGO_TARGET_DIR` as you like) runs, per round:
//! * `subsink` — `subsink run --table-primary-key id --memory-limit …`, the release binary, as a
//!   user runs it: the subscription's `subsink.table.maxMessages` cuts the input into batches of
//!   `SUBSINK_BENCH_BATCH` changes, each applied as one MERGE (and a MERGE of its tombstone table,
//!   `_subsink_tombstones/`); timed as the whole process (start-up included);
//! * `deltalake` — the same job with the Python `deltalake` package (`benches/cdc_merge.py run`):
//!   per batch of the same size, decode, last change per key, normalized numbers, tombstones the
//!   same way (a second table, `_tombstones/`), then `DeltaTable.merge` with subsink's three clauses
//!   and predicates. Timed inside the script from before it creates its tables to its last commit
//!   (Python's start-up and imports excluded; its CPU seconds likewise), peak RSS the process's.
//!   Decoding with the standard library's `json`; `deltalake-orjson` (with
//!   `SUBSINK_BENCH_PY_DECODE=json,orjson`) is the same peer decoding with orjson, a C parser.
//!
//! After each round `benches/cdc_merge.py check` reads both tables (and both tombstone tables) with
//! `deltalake` and compares the sorted rows with each other and with a model of the input (per key
//! the highest number wins; a DELETE winner is no row), and subsink's tombstones with the model's
//! (the keys whose winner is a DELETE; the peer keeps one for every numbered DELETE, as subsink did
//! before issue 43); the bench stops when anything differs. It
//! also prints each table's log history: versions, files in the snapshot, files added and removed
//! and MB written over all commits (a MERGE rewrites every file that holds a key of its batch).
//!
//! The contenders take turns within each round (their order alternates), so a slower spell of a
//! shared machine hits both alike. Environment:
//! * `SUBSINK_BENCH_CHANGES` — changes (default 100000);
//! * `SUBSINK_BENCH_KEYS` — keys (default 5000);
//! * `SUBSINK_BENCH_BATCH` — changes per commit (default 10000);
//! * `SUBSINK_BENCH_RUNS` — rounds (default 3);
//! * `SUBSINK_BENCH_MEMORY_LIMIT` — subsink's `--memory-limit` (default `256MiB`);
//! * `SUBSINK_BENCH_DIR` — scratch folder (default a temp dir); the input is generated once per
//!   change and key count and kept there;
//! * `SUBSINK_BENCH_PY_DECODE` — the peer's decoders, comma-separated: `json` (default),
//!   `orjson`; one contender each (`deltalake`, `deltalake-orjson`);
//! * `SUBSINK_BENCH_ONLY` — a comma-separated subset of the contenders (the check needs
//!   `subsink`);
//! * `SUBSINK_LOG` — subsink's log filter (default `warn` here, and `error` for deltalake_core's
//!   MERGE, which warns of a missing metric on every MERGE: the rounds stay readable).
//!
//! Needs the project's `.venv` (scripts/setup-test-env: `deltalake`, `pyarrow`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const SUBSCRIPTION: &str = "projects/bench/subscriptions/cdc";
/// The table's columns; subsink adds `_CHANGE_SEQUENCE_NUMBER` (STRING) to the Delta table.
const SCHEMA: &str = r#"[
  {"name": "id", "type": "INTEGER"},
  {"name": "name", "type": "STRING"},
  {"name": "qty", "type": "INTEGER"},
  {"name": "price", "type": "FLOAT"}
]"#;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn manifest_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// What one measured child process took.
struct Run {
    secs: f64,
    cpu_secs: f64,
    peak_rss_mib: f64,
    stdout: String,
}

/// Run `cmd` to completion and measure it alone: wall time, and its own CPU time and peak RSS
/// (`wait4` on its pid, so earlier children such as the data generator do not count).
// The child is reaped by `wait4`, not `Child::wait`, which cannot return its rusage.
#[allow(clippy::zombie_processes)]
fn measure(mut cmd: Command) -> Run {
    // Flush earlier runs' dirty pages first: their writeback would compete for the two cores.
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
        stdout,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One line of a table's log history from `cdc_merge.py check`.
fn history(h: &serde_json::Value) -> String {
    format!(
        "{} versions, {} file(s) now (peak {}), {} added / {} removed, {} MB written",
        h["versions"],
        h["files"],
        h["peak_files"],
        h["files_added"],
        h["files_removed"],
        h["mb_written"]
    )
}

fn main() {
    // `cargo test --benches` passes flags like --bench; run only under `cargo bench`.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let n = env_num("SUBSINK_BENCH_CHANGES", 100_000);
    let keys = env_num("SUBSINK_BENCH_KEYS", 5_000);
    let batch = env_num("SUBSINK_BENCH_BATCH", 10_000);
    let runs = env_num("SUBSINK_BENCH_RUNS", 3);
    let memory_limit =
        std::env::var("SUBSINK_BENCH_MEMORY_LIMIT").unwrap_or_else(|_| "256MiB".into());
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = std::env::var_os("SUBSINK_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(format!("cdc-{n}-{keys}.ndjson"));
    if !input.exists() {
        let t = Instant::now();
        let ok = Command::new("python3")
            .arg(manifest_path("benches/cdc_data.py"))
            .arg(&input)
            .arg(n.to_string())
            .arg(keys.to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "benches/cdc_data.py failed");
        eprintln!(
            "generated {n} changes over {keys} keys in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let size = std::fs::metadata(&input).unwrap().len();
    let schema = dir.join("cdc.schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    let sub = dir.join("cdc-subscription.json");
    // Batches cut by count alone: time and bytes limits far away.
    std::fs::write(
        &sub,
        format!(
            r#"{{"name":"{SUBSCRIPTION}","topic":"projects/bench/topics/cdc",
               "bigqueryConfig":{{"table":"bench.bench.items","useTableSchema":true}},
               "subsink":{{"table":{{"maxMessages":"{batch}","maxDuration":"3600s",
                                     "maxBytes":"1073741824"}}}}}}"#
        ),
    )
    .unwrap();
    let python = manifest_path(".venv/bin/python");
    let script = manifest_path("benches/cdc_merge.py");
    // The peer once per decoder asked for: `deltalake` (the standard library's json) and
    // `deltalake-orjson`.
    let decoders = std::env::var("SUBSINK_BENCH_PY_DECODE").unwrap_or_else(|_| "json".into());
    let mut contenders = vec!["subsink".to_string()];
    for d in decoders.split(',') {
        assert!(
            d == "json" || d == "orjson",
            "SUBSINK_BENCH_PY_DECODE: json, orjson"
        );
        contenders.push(match d {
            "json" => "deltalake".to_string(),
            _ => format!("deltalake-{d}"),
        });
    }
    if let Ok(only) = std::env::var("SUBSINK_BENCH_ONLY") {
        contenders.retain(|c| only.split(',').any(|o| o == c));
    }
    let table_of = |name: &str| dir.join(format!("table-{name}"));
    let tombstones_of = |name: &str| match name {
        "subsink" => table_of(name).join("_subsink_tombstones"),
        _ => table_of(name).join("_tombstones"),
    };
    println!(
        "{n} changes over {keys} keys ({:.1} MB of NDJSON), batches of {batch}, subsink \
         --memory-limit {memory_limit}, {runs} rounds",
        size as f64 / 1e6
    );
    let mut results: Vec<(&str, Vec<Run>)> =
        contenders.iter().map(|c| (c.as_str(), vec![])).collect();
    for round in 1..=runs {
        // Alternate who goes first.
        let mut order: Vec<usize> = (0..results.len()).collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for i in order {
            let (name, done) = &mut results[i];
            let name: &str = name;
            let table = table_of(name);
            let _ = std::fs::remove_dir_all(&table);
            let cmd = match name {
                "subsink" => {
                    let mut c = Command::new(env!("CARGO_BIN_EXE_subsink"));
                    c.args(["run", "--subscription"])
                        .arg(&sub)
                        .arg("--source")
                        .arg(&input)
                        .arg("--table-url")
                        .arg(format!("file://{}", table.display()))
                        .arg("--table-schema")
                        .arg(&schema)
                        .args(["--table-primary-key", "id", "--memory-limit", &memory_limit]);
                    if std::env::var_os("SUBSINK_LOG").is_none() {
                        // deltalake_core 1.1 warns of a missing metric on every MERGE.
                        c.env(
                            "SUBSINK_LOG",
                            "warn,deltalake_core::operations::merge=error",
                        );
                    }
                    c
                }
                peer => {
                    let mut c = Command::new(&python);
                    c.arg(&script)
                        .arg("run")
                        .arg(&input)
                        .arg(&table)
                        .arg(batch.to_string())
                        .arg(peer.strip_prefix("deltalake-").unwrap_or("json"));
                    c
                }
            };
            let mut run = measure(cmd);
            let (label, detail) = match name {
                "subsink" => {
                    let summary: serde_json::Value =
                        serde_json::from_str(run.stdout.trim()).expect("subsink's summary");
                    assert_eq!(
                        summary["messages_written"], n,
                        "every change written: {summary}"
                    );
                    ("subsink".to_string(), String::new())
                }
                _ => {
                    let inner: serde_json::Value =
                        serde_json::from_str(run.stdout.trim()).expect("cdc_merge.py JSON");
                    assert_eq!(inner["changes"], n, "every change applied: {inner}");
                    let process = run.secs;
                    run.secs = inner["secs"].as_f64().unwrap();
                    run.cpu_secs = inner["cpu_secs"].as_f64().unwrap();
                    (
                        format!(
                            "{name} {} ({} decode)",
                            inner["deltalake"].as_str().unwrap_or("?"),
                            inner["decoder"].as_str().unwrap_or("?")
                        ),
                        format!(
                            ", {} commits (process with Python start-up: {process:.2} s); \
                             phases (s): {}; table MERGEs (ms, summed): execution {}, scan {}, \
                             rewrite {}, files scanned {}",
                            inner["commits"],
                            inner["phases"],
                            inner["merge"]["execution_time_ms"],
                            inner["merge"]["scan_time_ms"],
                            inner["merge"]["rewrite_time_ms"],
                            inner["merge"]["num_target_files_scanned"],
                        ),
                    )
                }
            };
            println!(
                "round {round} {label}: {n} changes in {:.2} s: {:.0} changes/s, CPU {:.2} s, \
                 peak RSS {:.0} MiB{detail}",
                run.secs,
                n as f64 / run.secs,
                run.cpu_secs,
                run.peak_rss_mib,
            );
            done.push(run);
        }
        // Each peer's tables, and tombstone tables, against subsink's and the model.
        if results.first().is_some_and(|(name, _)| *name == "subsink") {
            for (peer, _) in &results[1..] {
                let out = Command::new(&python)
                    .arg(&script)
                    .arg("check")
                    .arg(&input)
                    .arg(table_of("subsink"))
                    .arg(tombstones_of("subsink"))
                    .arg(table_of(peer))
                    .arg(tombstones_of(peer))
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success(),
                    "round {round}: subsink's and {peer}'s tables differ: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let c: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
                println!(
                    "round {round} check: subsink = {peer} = model ({} rows, {} tombstones); \
                     subsink: {}; {peer}: {}",
                    c["rows"][0],
                    c["tombstones"][0],
                    history(&c["a"]),
                    history(&c["b"]),
                );
            }
        }
    }
    for name in &contenders {
        let _ = std::fs::remove_dir_all(table_of(name));
    }
    println!("medians of {runs} rounds:");
    for (name, done) in &results {
        let secs = median(done.iter().map(|r| r.secs).collect());
        println!(
            "  {name:>9}: {secs:.2} s, {:.0} changes/s, CPU {:.2} s, peak RSS {:.0} MiB",
            n as f64 / secs,
            median(done.iter().map(|r| r.cpu_secs).collect()),
            median(done.iter().map(|r| r.peak_rss_mib).collect()),
        );
    }
    // The goal: subsink at least twice as fast as the peer, round by round (the rounds are
    // interleaved, so a round's contenders saw the same machine).
    let Some(((_, ours), peers)) = results
        .split_first()
        .filter(|((name, _), _)| *name == "subsink")
    else {
        return;
    };
    for (peer, theirs) in peers {
        let ratios: Vec<f64> = ours
            .iter()
            .zip(theirs)
            .map(|(o, p)| p.secs / o.secs)
            .collect();
        println!(
            "speed-up over {peer} (its time / subsink's), per round; goal: >= 2: median {:.2} \
             [{}]",
            median(ratios.clone()),
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
}
