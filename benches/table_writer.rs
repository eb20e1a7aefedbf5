//! Table-writer throughput, end to end: NDJSON Pub/Sub messages (REST form; payloads with the 12
//! typed fields of `benches/table_events.schema.json`, made by `benches/table_data.py`) → rows
//! with metadata (use_table_schema, write_metadata) → zstd Parquet files committed to a Delta table
//! in a local folder. Prints, per run, msgs/s, MB/s (input), CPU seconds and peak RSS, each
//! contender in its own process measured alone (`wait4`), and the medians at the end.
//!
//! `cargo bench --bench table_writer` runs 1M messages through:
//! * `subsink run` — the binary, as a user runs it (`--table-url`, `--table-schema`, batches of
//!   the default 64 MiB of message bytes);
//! * `library` — the same stages called directly, as `TableWriter` does (FileSource → `RowBuilder`
//!   → Parquet on a blocking thread → Delta commit), converting on the one async task;
//! * `library, parallel` — the same, converting chunks of messages on blocking threads
//!   (`RowBuilder::fresh` + `append_all`);
//! * `duckdb` (with `SUBSINK_BENCH_DUCKDB=1`) — the same job in DuckDB (`benches/table_duckdb.py`,
//!   needs scripts/setup-test-env), at subsink's zstd level 1, timed inside the script around the
//!   job (Python's start-up and import excluded; its CPU seconds likewise), its row count checked
//!   as strictly as subsink's (COPY's count and the file's own, both equal to the input's).
//!
//! The contenders take turns within each round, so a slower spell of a shared machine hits them
//! alike. Environment:
//! * `SUBSINK_BENCH_MESSAGES` — messages (default 1000000);
//! * `SUBSINK_BENCH_DIR` — scratch folder (default a temp dir); the input is generated once per
//!   message count and kept there;
//! * `SUBSINK_BENCH_RUNS` — rounds (default 3);
//! * `SUBSINK_BENCH_ONLY` — a comma-separated subset of `binary,library,parallel,duckdb`;
//! * `SUBSINK_BENCH_DUCKDB=1` — add DuckDB;
//! * `SUBSINK_BENCH_BINARIES=old=/path/a,new=/path/b` — those builds of the binary instead of this
//!   one (e.g. before and after a refactor), interleaved like the rest.
//!
//! Two diagnostic modes run one stage alone on messages already in memory:
//! `SUBSINK_BENCH_CHILD=convert` and `SUBSINK_BENCH_CHILD=parquet`, with the input file as the only
//! argument of the bench binary (`target/release/deps/table_writer-*`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SUBSCRIPTION: &str = "projects/bench/subscriptions/bench";
/// Message bytes per Parquet file: the binary's default `maxBytes` (64 MiB).
const FILE_BYTES: u64 = 64 << 20;

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

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo test --benches` passes flags like --bench; run only under `cargo bench`.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    if let Some(child) = std::env::var_os("SUBSINK_BENCH_CHILD") {
        let args: Vec<String> = std::env::args().collect();
        let input = Path::new(&args[1]);
        match child.to_str() {
            Some("convert") => library::convert_only(input),
            Some("parquet") => library::parquet_only(input),
            Some(mode) => println!("{}", library::run(input, Path::new(&args[2]), mode)),
            None => panic!("SUBSINK_BENCH_CHILD"),
        }
        return;
    }
    let n = env_num("SUBSINK_BENCH_MESSAGES", 1_000_000);
    let runs = env_num("SUBSINK_BENCH_RUNS", 3);
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = std::env::var_os("SUBSINK_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(format!("table-{n}.ndjson"));
    if !input.exists() {
        let t = Instant::now();
        let ok = Command::new("python3")
            .arg(manifest_path("benches/table_data.py"))
            .arg(&input)
            .arg(n.to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "benches/table_data.py failed");
        eprintln!(
            "generated {n} messages in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let size = std::fs::metadata(&input).unwrap().len();
    let sub = dir.join("table-subscription.json");
    std::fs::write(
        &sub,
        format!(
            r#"{{"name":"{SUBSCRIPTION}","topic":"projects/bench/topics/bench",
               "bigqueryConfig":{{"table":"bench.bench.events","useTableSchema":true,
                                  "writeMetadata":true}},
               "subsink":{{"table":{{"maxDuration":"600s"}}}}}}"#
        ),
    )
    .unwrap();
    let mut contenders = vec!["binary", "library", "parallel", "stream"];
    if std::env::var_os("SUBSINK_BENCH_DUCKDB").is_some() {
        contenders.push("duckdb");
    }
    if let Ok(only) = std::env::var("SUBSINK_BENCH_ONLY") {
        contenders.retain(|c| only.split(',').any(|o| o == *c));
    }
    // `SUBSINK_BENCH_BINARIES=old=/path/a,new=/path/b` puts those builds in the place of
    // `binary` (one contender each, interleaved like the rest).
    let builds: Vec<(String, PathBuf)> = match std::env::var("SUBSINK_BENCH_BINARIES") {
        Ok(list) => list
            .split(',')
            .map(|item| {
                let (name, path) = item
                    .split_once('=')
                    .expect("SUBSINK_BENCH_BINARIES: name=/path,name=/path");
                (format!("binary {name}"), PathBuf::from(path))
            })
            .collect(),
        Err(_) => vec![(
            "binary".to_string(),
            PathBuf::from(env!("CARGO_BIN_EXE_subsink")),
        )],
    };
    let contenders: Vec<(String, Option<PathBuf>)> = contenders
        .into_iter()
        .flat_map(|c| match c {
            "binary" => builds
                .iter()
                .map(|(name, path)| (name.clone(), Some(path.clone())))
                .collect::<Vec<_>>(),
            other => vec![(other.to_string(), None)],
        })
        .collect();
    let table = dir.join("table");
    let duck_out = dir.join("duckdb.parquet");
    let mut results: Vec<(String, Option<PathBuf>, Vec<Run>)> = contenders
        .into_iter()
        .map(|(name, binary)| (name, binary, vec![]))
        .collect();
    for round in 1..=runs {
        for (name, binary, done) in &mut results {
            let _ = std::fs::remove_dir_all(&table);
            let cmd = match (name.as_str(), binary.as_ref()) {
                (_, Some(binary)) => {
                    let mut c = Command::new(binary);
                    c.args(["run", "--subscription"])
                        .arg(&sub)
                        .arg("--source")
                        .arg(&input)
                        .arg("--table-url")
                        .arg(format!("file://{}", table.display()))
                        .arg("--table-schema")
                        .arg(manifest_path("benches/table_events.schema.json"));
                    c
                }
                ("library" | "parallel" | "stream", None) => {
                    let mut c = Command::new(std::env::current_exe().unwrap());
                    c.env("SUBSINK_BENCH_CHILD", name.as_str())
                        .arg(&input)
                        .arg(&table);
                    c
                }
                ("duckdb", None) => {
                    let mut c = Command::new(manifest_path(".venv/bin/python"));
                    c.arg(manifest_path("benches/table_duckdb.py"))
                        .arg(&input)
                        .arg(&duck_out)
                        .arg(n.to_string());
                    c
                }
                (other, None) => panic!("unknown contender {other}"),
            };
            let mut run = measure(cmd);
            let (label, detail) = match name.as_str() {
                "duckdb" => {
                    // The script times the job itself (no Python start-up or import) and has
                    // checked that COPY and the file both hold `n` rows; checked again here.
                    let inner: serde_json::Value =
                        serde_json::from_str(run.stdout.trim()).expect("table_duckdb.py JSON");
                    assert_eq!(inner["rows"], n, "DuckDB wrote every row: {inner}");
                    assert_eq!(
                        inner["file_rows"], n,
                        "DuckDB's file holds every row: {inner}"
                    );
                    let process = run.secs;
                    run.secs = inner["secs"].as_f64().unwrap();
                    run.cpu_secs = inner["cpu_secs"].as_f64().unwrap();
                    let bytes = std::fs::metadata(&duck_out).unwrap().len();
                    (
                        format!("duckdb {}", inner["duckdb"].as_str().unwrap_or("?")),
                        format!(
                            "1 file, {:.1} MB (process with Python start-up: {process:.2} s)",
                            bytes as f64 / 1e6
                        ),
                    )
                }
                _ => {
                    let summary: serde_json::Value =
                        serde_json::from_str(run.stdout.trim()).unwrap();
                    let (written, files) = if binary.is_some() {
                        (
                            summary["messages_written"].clone(),
                            summary["objects"].as_array().unwrap().len(),
                        )
                    } else {
                        (
                            summary["rows"].clone(),
                            summary["files"].as_u64().unwrap() as usize,
                        )
                    };
                    assert_eq!(written, n, "every message written: {summary}");
                    (
                        format!("subsink ({name})"),
                        format!(
                            "{files} Parquet files, {:.1} MB",
                            dir_bytes(&table) as f64 / 1e6
                        ),
                    )
                }
            };
            println!(
                "round {round} {label}: {n} msgs in {:.2} s: {:.0} msgs/s, {:.1} MB/s input, \
                 CPU {:.1} s, peak RSS {:.0} MiB, {detail}",
                run.secs,
                n as f64 / run.secs,
                size as f64 / run.secs / 1e6,
                run.cpu_secs,
                run.peak_rss_mib,
            );
            done.push(run);
        }
    }
    let _ = std::fs::remove_dir_all(&table);
    let _ = std::fs::remove_file(&duck_out);
    println!("medians of {runs} runs:");
    for (name, _, done) in &results {
        let secs = median(done.iter().map(|r| r.secs).collect());
        println!(
            "  {name:>8}: {secs:.2} s, {:.0} msgs/s, CPU {:.1} s, peak RSS {:.0} MiB",
            n as f64 / secs,
            median(done.iter().map(|r| r.cpu_secs).collect()),
            median(done.iter().map(|r| r.peak_rss_mib).collect()),
        );
    }
    // The issue's target: each contender's speed over DuckDB's, round by round (the rounds are
    // interleaved, so a round's contenders saw the same machine).
    if let Some((_, _, duck)) = results.iter().find(|(name, _, _)| name == "duckdb") {
        println!(
            "speed-up over DuckDB (its wall time / ours), per round; target: median >= 1.50, \
             every round >= 1.20:"
        );
        for (name, _, done) in results.iter().filter(|(name, _, _)| name != "duckdb") {
            let ratios: Vec<f64> = done
                .iter()
                .zip(duck)
                .map(|(r, d)| d.secs / r.secs)
                .collect();
            println!(
                "  {name:>8}: min {:.2}, median {:.2}, max {:.2}  [{}]",
                ratios.iter().copied().fold(f64::INFINITY, f64::min),
                median(ratios.clone()),
                ratios.iter().copied().fold(0.0, f64::max),
                ratios
                    .iter()
                    .map(|r| format!("{r:.2}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
    }
}

/// The library pipelines and the single-stage modes, run in a child process.
mod library {
    use std::collections::VecDeque;
    use std::path::Path;

    use arrow_array::RecordBatch;
    use subsink::message::{Message, Received};
    use subsink::sink::chunk::{message_bytes, CHUNK_ROWS};
    use subsink::sink::delta::{to_delta_batch, DataFile, DeltaTable, ParquetEncoder};
    use subsink::source::file::{FileSource, FileSourceSettings};
    use subsink::source::{Source, SourceEvent};
    use subsink::table::{write_parquet, RowBuilder, RowOptions, SchemaMode, TableSchema};
    use subsink::upload::Destination;
    use tokio::task::JoinHandle;

    use super::{env_num, manifest_path, FILE_BYTES, SUBSCRIPTION};

    /// Messages per chunk converted on a blocking thread (parallel pipeline).
    const CHUNK: usize = 8192;

    fn builder() -> RowBuilder {
        let text =
            std::fs::read_to_string(manifest_path("benches/table_events.schema.json")).unwrap();
        let schema = TableSchema::from_json(&text).unwrap();
        RowBuilder::new(
            &schema,
            RowOptions {
                mode: SchemaMode::UseTableSchema,
                write_metadata: true,
                drop_unknown_fields: false,
                subscription_name: SUBSCRIPTION.into(),
            },
        )
        .unwrap()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    pub fn run(input: &Path, table_dir: &Path, mode: &str) -> serde_json::Value {
        let _ = rustls::crypto::ring::default_provider().install_default();
        match mode {
            "stream" => runtime().block_on(pipeline_stream(input, table_dir)),
            _ => runtime().block_on(pipeline(input, table_dir, mode == "parallel")),
        }
    }

    /// The row builder, the table's Delta schema, the table (created in `table_dir`) and the
    /// source reading `input`, as every library pipeline starts.
    async fn open(
        input: &Path,
        table_dir: &Path,
    ) -> (
        RowBuilder,
        arrow_schema::SchemaRef,
        std::sync::Arc<tokio::sync::Mutex<DeltaTable>>,
        FileSource,
    ) {
        let rows = builder();
        std::fs::create_dir_all(table_dir).unwrap();
        let dest = Destination::from_url(&format!("file://{}", table_dir.display())).unwrap();
        let table = DeltaTable::open_or_create(&dest, &rows.schema())
            .await
            .unwrap();
        let delta_schema = table.schema().clone();
        let table = std::sync::Arc::new(tokio::sync::Mutex::new(table));
        let source = FileSource::open(FileSourceSettings::new(Some(input.into()))).unwrap();
        (rows, delta_schema, table, source)
    }

    /// Conversion on the async task as in `pipeline`, but every `CHUNK_ROWS` rows go to the open
    /// file's [`ParquetEncoder`], which encodes them on its own thread at once; at a file's end only
    /// its last rows remain to encode.
    async fn pipeline_stream(input: &Path, table_dir: &Path) -> serde_json::Value {
        let (mut rows, delta_schema, table, mut source) = open(input, table_dir).await;
        let mut commits: VecDeque<Commit> = VecDeque::new();
        let (mut total, mut file_bytes) = (0usize, 0u64);
        let mut open: Option<ParquetEncoder> = None;
        // The open file is complete: finish it and commit it, in the background.
        let close = |enc: ParquetEncoder| {
            let table = table.clone();
            tokio::spawn(async move {
                let file = tokio::task::spawn_blocking(move || enc.finish())
                    .await
                    .unwrap()
                    .unwrap();
                table
                    .lock()
                    .await
                    .commit(vec![DataFile::new(file)])
                    .await
                    .unwrap();
            })
        };
        let new_file = || ParquetEncoder::start(delta_schema.clone(), None).unwrap();
        while let Some(event) = source.next().await {
            let SourceEvent::Messages(msgs) = event else {
                panic!("bad input: {event:?}")
            };
            for r in msgs {
                let bytes = message_bytes(&r.msg);
                if file_bytes + bytes > FILE_BYTES {
                    let enc = open.take().unwrap_or_else(new_file);
                    if !rows.is_empty() {
                        enc.write(rows.finish()).unwrap();
                    }
                    while commits.len() >= 2 {
                        commits.pop_front().unwrap().await.unwrap();
                    }
                    commits.push_back(close(enc));
                    file_bytes = 0;
                }
                file_bytes += bytes;
                total += 1;
                rows.append(&r.msg).unwrap();
                if rows.len() == CHUNK_ROWS {
                    open.get_or_insert_with(new_file)
                        .write(rows.finish())
                        .unwrap();
                }
            }
        }
        if file_bytes > 0 {
            let enc = open.take().unwrap_or_else(new_file);
            if !rows.is_empty() {
                enc.write(rows.finish()).unwrap();
            }
            commits.push_back(close(enc));
        }
        for c in commits {
            c.await.unwrap();
        }
        let table = table.lock().await;
        serde_json::json!({"rows": total, "files": table.version(), "version": table.version()})
    }

    /// A Parquet file being made and committed, as `TableCommit::finish` does it.
    type Commit = JoinHandle<()>;

    /// Encode `batches` as one file on a blocking thread, then commit it (commits are serialised
    /// by the table lock, as in the binary).
    fn commit(
        table: &std::sync::Arc<tokio::sync::Mutex<DeltaTable>>,
        schema: arrow_schema::SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Commit {
        let table = table.clone();
        tokio::spawn(async move {
            let file = tokio::task::spawn_blocking(move || {
                let delta: Vec<RecordBatch> = batches
                    .iter()
                    .map(|b| to_delta_batch(b, &schema).unwrap())
                    .collect();
                write_parquet(&schema, &delta, None).unwrap()
            })
            .await
            .unwrap();
            table
                .lock()
                .await
                .commit(vec![DataFile::new(file)])
                .await
                .unwrap();
        })
    }

    async fn pipeline(input: &Path, table_dir: &Path, parallel: bool) -> serde_json::Value {
        let (mut rows, delta_schema, table, mut source) = open(input, table_dir).await;
        // At most two files encoding/committing at once (the binary's upload concurrency).
        let mut commits: VecDeque<Commit> = VecDeque::new();
        // Parallel: chunks converting, in order, with the file they belong to.
        let mut converting: VecDeque<(usize, JoinHandle<RecordBatch>)> = VecDeque::new();
        let mut chunk: Vec<Received> = Vec::with_capacity(CHUNK);
        let mut files: Vec<Vec<RecordBatch>> = vec![Vec::new()];
        let (mut total, mut file_bytes, mut committed) = (0usize, 0u64, 0usize);
        let mut done = false;
        while !done {
            let event = source.next().await;
            done = event.is_none();
            let msgs = match event {
                Some(SourceEvent::Messages(m)) => m,
                None => Vec::new(),
                Some(other) => panic!("bad input: {other:?}"),
            };
            for r in msgs {
                let bytes = message_bytes(&r.msg);
                if file_bytes + bytes > FILE_BYTES {
                    // Close the file: the rows so far go to it.
                    if parallel {
                        if !chunk.is_empty() {
                            converting.push_back((files.len() - 1, convert(&rows, &mut chunk)));
                        }
                    } else {
                        files.last_mut().unwrap().push(rows.finish());
                    }
                    files.push(Vec::new());
                    file_bytes = 0;
                }
                file_bytes += bytes;
                total += 1;
                if parallel {
                    chunk.push(r);
                    if chunk.len() == CHUNK {
                        converting.push_back((files.len() - 1, convert(&rows, &mut chunk)));
                    }
                } else {
                    rows.append(&r.msg).unwrap();
                }
            }
            if done {
                if parallel && !chunk.is_empty() {
                    converting.push_back((files.len() - 1, convert(&rows, &mut chunk)));
                } else if !rows.is_empty() {
                    files.last_mut().unwrap().push(rows.finish());
                }
            }
            // Collect converted chunks, waiting only when two are in flight (or at the end).
            while converting
                .front()
                .is_some_and(|(_, h)| h.is_finished() || converting.len() > 2 || done)
            {
                let (file, h) = converting.pop_front().unwrap();
                files[file].push(h.await.unwrap());
            }
            // Files complete (every chunk of theirs converted) go to encoding.
            let open = if done && converting.is_empty() {
                files.len()
            } else {
                converting
                    .front()
                    .map_or(files.len() - 1, |(f, _)| *f)
                    .min(files.len() - 1)
            };
            while committed < open {
                let batches = std::mem::take(&mut files[committed]);
                if !batches.is_empty() {
                    while commits.len() >= 2 {
                        commits.pop_front().unwrap().await.unwrap();
                    }
                    commits.push_back(commit(&table, delta_schema.clone(), batches));
                }
                committed += 1;
            }
        }
        for c in commits {
            c.await.unwrap();
        }
        let table = table.lock().await;
        serde_json::json!({"rows": total, "files": table.version(), "version": table.version()})
    }

    /// Convert `chunk` (taken) on a blocking thread with a fresh builder like `rows`.
    fn convert(rows: &RowBuilder, chunk: &mut Vec<Received>) -> JoinHandle<RecordBatch> {
        let mut b = rows.fresh();
        let msgs = std::mem::replace(chunk, Vec::with_capacity(CHUNK));
        tokio::task::spawn_blocking(move || {
            let failed = b.append_all(msgs.iter().map(|r| &r.msg));
            assert!(failed.is_empty(), "{failed:?}");
            b.finish()
        })
    }

    fn load(input: &Path) -> Vec<Message> {
        runtime().block_on(async {
            let mut source = FileSource::open(FileSourceSettings::new(Some(input.into()))).unwrap();
            let mut all = Vec::new();
            while let Some(SourceEvent::Messages(b)) = source.next().await {
                all.extend(b.into_iter().map(|r| r.msg));
            }
            all
        })
    }

    /// The conversion alone: every message in memory first, then timed through `RowBuilder` in
    /// chunks; the fastest of `SUBSINK_BENCH_REPEAT` passes (the machine is shared and noisy).
    pub fn convert_only(input: &Path) {
        let msgs = load(input);
        let mut rows = builder();
        let (mut append, mut finish) = (f64::MAX, f64::MAX);
        for _ in 0..env_num("SUBSINK_BENCH_REPEAT", 3) {
            let (mut a, mut f) = (0.0, 0.0);
            for part in msgs.chunks(16_384) {
                let t = std::time::Instant::now();
                for m in part {
                    rows.append(m).unwrap();
                }
                let t2 = std::time::Instant::now();
                std::hint::black_box(rows.finish());
                a += (t2 - t).as_secs_f64();
                f += t2.elapsed().as_secs_f64();
            }
            append = append.min(a);
            finish = finish.min(f);
        }
        let n = msgs.len() as f64;
        eprintln!(
            "convert: {} msgs: append {:.0} ns/msg, finish {:.0} ns/msg (fastest pass)",
            msgs.len(),
            append / n * 1e9,
            finish / n * 1e9
        );
    }

    /// Parquet encoding alone (the Delta form of all the rows, one file), with a few writer
    /// settings; the fastest of `SUBSINK_BENCH_REPEAT` passes.
    pub fn parquet_only(input: &Path) {
        use parquet::basic::{Compression, ZstdLevel};
        use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
        let msgs = load(input);
        let mut rows = builder();
        let tmp = tempfile::tempdir().unwrap();
        let dest = Destination::from_url(&format!("file://{}", tmp.path().display())).unwrap();
        let table = runtime()
            .block_on(DeltaTable::open_or_create(&dest, &rows.schema()))
            .unwrap();
        let batches: Vec<_> = msgs
            .chunks(16_384)
            .map(|part| {
                for m in part {
                    rows.append(m).unwrap();
                }
                to_delta_batch(&rows.finish(), table.schema()).unwrap()
            })
            .collect();
        let base = || {
            WriterProperties::builder()
                .set_compression(Compression::ZSTD(ZstdLevel::default()))
                .set_writer_version(WriterVersion::PARQUET_2_0)
                .set_max_row_group_row_count(Some(1 << 20))
        };
        let variants: Vec<(&str, WriterProperties)> = vec![
            ("default", subsink::table::default_writer_properties()),
            (
                "no statistics",
                base()
                    .set_statistics_enabled(EnabledStatistics::None)
                    .build(),
            ),
            (
                "uncompressed",
                base().set_compression(Compression::UNCOMPRESSED).build(),
            ),
            (
                "chunk statistics",
                base()
                    .set_statistics_enabled(EnabledStatistics::Chunk)
                    .build(),
            ),
            (
                "PLAIN where there is no dictionary",
                base().set_encoding(parquet::basic::Encoding::PLAIN).build(),
            ),
            (
                "PLAIN, chunk statistics",
                base()
                    .set_encoding(parquet::basic::Encoding::PLAIN)
                    .set_statistics_enabled(EnabledStatistics::Chunk)
                    .build(),
            ),
            (
                "no statistics on attributes, subscription_name",
                base()
                    .set_column_statistics_enabled("attributes".into(), EnabledStatistics::None)
                    .set_column_statistics_enabled(
                        "subscription_name".into(),
                        EnabledStatistics::None,
                    )
                    .build(),
            ),
        ];
        for (name, props) in variants {
            let mut best = f64::MAX;
            let mut size = 0;
            for _ in 0..env_num("SUBSINK_BENCH_REPEAT", 3) {
                let t = std::time::Instant::now();
                let f = write_parquet(table.schema(), &batches, Some(props.clone())).unwrap();
                best = best.min(t.elapsed().as_secs_f64());
                size = f.size() as usize;
            }
            eprintln!(
                "parquet {name}: {} rows in {:.0} ms ({:.0} ns/row), {:.1} MB",
                msgs.len(),
                best * 1e3,
                best / msgs.len() as f64 * 1e9,
                size as f64 / 1e6
            );
        }
    }
}
