//! Compaction of Delta tables (issue 36): `subsink compact` and `subsink run --compact-after`,
//! the real binary on real tables (local folders, SeaweedFS, Azurite), read back by the
//! `deltalake` Python package: every row id exactly once, the counts exact, fewer files after.
//! Tables partitioned by the `deltalake` package itself; two writers appending while compactions
//! run; a change data capture table compacted between its MERGEs.

mod util;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use util::servers::{
    shared_azurite, shared_seaweedfs, unique_bucket, AZURITE_ACCOUNT, AZURITE_KEY,
};
use util::*;

const SUB: &str = "projects/proj/subscriptions/rows-to-table";
const SCHEMA: &str = r#"[
  {"name": "id", "type": "INT64", "mode": "REQUIRED"},
  {"name": "writer", "type": "STRING"}
]"#;

/// Reads a Delta table with `deltalake`: version, data files (of the log, and `.parquet` files
/// on disk for a local table), every id, and rows per partition when it has partition columns.
const READER: &str = r#"
import json, os, sys
import deltalake, pyarrow as pa
loc = sys.argv[1]
opts = json.loads(os.environ.get("READER_OPTIONS", "{}"))
dt = deltalake.DeltaTable(loc, storage_options=opts or None)
t = dt.to_pyarrow_table()
parts = dt.metadata().partition_columns
per = {}
if parts:
    for r in t.select(parts).to_pylist():
        k = "/".join(f"{c}={r[c]}" for c in parts)
        per[k] = per.get(k, 0) + 1
on_disk = None
if not loc.startswith(("s3://", "az://")):
    on_disk = sum(1 for _, _, fs in os.walk(loc) for f in fs if f.endswith(".parquet"))
adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
ranges = sorted([a.get("min.id"), a.get("max.id")] for a in adds)
print(json.dumps({"version": dt.version(), "files": len(dt.file_uris()), "on_disk": on_disk,
                  "ids": sorted(t.column("id").to_pylist()), "partitions": per,
                  "id_ranges": ranges}))
sys.stdout.flush()
os._exit(0)
"#;

struct Table {
    version: i64,
    files: u64,
    on_disk: Option<u64>,
    ids: Vec<i64>,
    partitions: BTreeMap<String, u64>,
    /// Each file's `[min, max]` of `id` from its statistics (`null`s: none), sorted.
    id_ranges: Value,
}

fn read_at(location: &str, env: &[(&str, String)]) -> Table {
    let v = python_json(READER, location, env);
    Table {
        version: v["version"].as_i64().unwrap(),
        files: v["files"].as_u64().unwrap(),
        on_disk: v["on_disk"].as_u64(),
        ids: v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_i64().unwrap())
            .collect(),
        partitions: v["partitions"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, n)| (k.clone(), n.as_u64().unwrap()))
            .collect(),
        id_ranges: v["id_ranges"].clone(),
    }
}

fn read(table: &Path) -> Table {
    read_at(&table.display().to_string(), &[])
}

/// Every id of `0..n` exactly once.
fn assert_ids_once(ids: &[i64], n: i64, label: &str) {
    let mut dup = Vec::new();
    for w in ids.windows(2) {
        if w[0] == w[1] {
            dup.push(w[0]);
        }
    }
    assert!(
        dup.is_empty(),
        "{label}: ids twice: {:?}",
        &dup[..dup.len().min(10)]
    );
    assert_eq!(ids.len() as i64, n, "{label}: row count");
    assert_eq!(ids, (0..n).collect::<Vec<_>>().as_slice(), "{label}: ids");
}

fn subscription(dir: &Path, max_messages: u64) -> PathBuf {
    let cfg = json!({
        "name": SUB,
        "topic": "projects/proj/topics/rows",
        "bigqueryConfig": {"table": "proj.analytics.rows", "useTableSchema": true},
        "subsink": {"table": {"maxMessages": max_messages.to_string()}},
    });
    let p = dir.join("sub.json");
    std::fs::write(&p, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    p
}

fn schema(dir: &Path) -> PathBuf {
    let p = dir.join("schema.json");
    std::fs::write(&p, SCHEMA).unwrap();
    p
}

fn row_message(i: i64, writer: &str) -> Message {
    Message {
        data: json!({"id": i, "writer": writer})
            .to_string()
            .into_bytes()
            .into(),
        attributes: Default::default(),
        message_id: format!("{i:09}"),
        publish_time_micros: 1_714_521_600_000_000 + i,
        ordering_key: String::new(),
    }
}

/// `subsink run` into the table at `url`, reading `source` (a file, or `-`: stdin).
fn run_cmd(sub: &Path, schema: &Path, url: &str, source: &str) -> Command {
    let mut c = subsink();
    c.args(["run", "--subscription"])
        .arg(sub)
        .args(["--source", source, "--table-url", url, "--table-schema"])
        .arg(schema);
    c
}

/// A table at `dir/t` written by one run of `n` rows, `per_commit` a commit.
fn small_commits(dir: &Path, n: i64, per_commit: u64) -> PathBuf {
    let table = dir.join("t");
    let src = dir.join("in.ndjson");
    write_lines(
        &src,
        &(0..n).map(|i| row_message(i, "w0")).collect::<Vec<_>>(),
    );
    let out = run_cmd(
        &subscription(dir, per_commit),
        &schema(dir),
        &format!("file://{}", table.display()),
        &src.display().to_string(),
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary(&out)["messages_written"], n);
    table
}

/// `subsink compact --table-url URL ARGS…`: exit code, report (exit 0) and stderr.
fn compact_at(url: &str, args: &[&str], env: &[(&str, String)]) -> (i32, Value, String) {
    let out = subsink()
        .args(["compact", "--table-url", url])
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    report_of(&out)
}

fn report_of(out: &Output) -> (i32, Value, String) {
    let code = out.status.code().unwrap_or(-1);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report = if code == 0 { summary(out) } else { Value::Null };
    (code, report, stderr)
}

fn compact(table: &Path, args: &[&str]) -> (i32, Value, String) {
    compact_at(&format!("file://{}", table.display()), args, &[])
}

#[test]
fn compact_command_packs_the_quiet_part_then_all_and_every_row_stays_once() {
    let dir = tempfile::tempdir().unwrap();
    // 20 commits of 50 rows: versions 1..=20, one file each.
    let table = small_commits(dir.path(), 1000, 50);
    let before = read(&table);
    assert_eq!((before.version, before.files), (20, 20));
    // Every file has its id range in its statistics (issue 44, point 6).
    let fifty: Vec<Value> = (0..20).map(|k| json!([k * 50, k * 50 + 49])).collect();
    assert_eq!(before.id_ranges, json!(fifty));

    // The last 5 commits are left alone: the 15 files of versions 1..=15 become one.
    let (code, r, err) = compact(&table, &["--skip-recent-commits", "5"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["latest_version"], 20);
    assert_eq!(r["read_version"], 15);
    assert_eq!(r["version"], 21);
    assert_eq!(r["commits"], 1);
    assert_eq!(
        (
            r["files_before"].as_u64(),
            r["files_removed"].as_u64(),
            r["files_added"].as_u64()
        ),
        (Some(20), Some(15), Some(1))
    );
    assert!(
        r["bytes_removed"].as_u64().unwrap() > r["bytes_added"].as_u64().unwrap(),
        "{r}"
    );
    assert_eq!(r["partitions"], json!([""]));
    let t = read(&table);
    assert_eq!((t.version, t.files), (21, 6));
    assert_ids_once(&t.ids, 1000, "after the first compaction");
    // The compacted file's statistics (deltalake's OPTIMIZE writes them) and the 5 left alone.
    let mut ranges = vec![json!([0, 749])];
    ranges.extend((15..20).map(|k| json!([k * 50, k * 50 + 49])));
    assert_eq!(t.id_ranges, json!(ranges));
    // The removed files stay on disk for readers of older versions, until a VACUUM.
    assert_eq!(t.on_disk, Some(21));

    // One of the last 5 commits removed files: the quiet part waits.
    let (code, r, err) = compact(&table, &["--skip-recent-commits", "5"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["commits"], 0);
    assert_eq!(r["version"], Value::Null);
    let why = r["skipped"].as_str().unwrap();
    assert!(
        why.contains("version 21") && why.contains("removed files"),
        "{why}"
    );

    // Everything: the compacted file and the 5 recent ones become one.
    let (code, r, err) = compact(&table, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (
            r["files_removed"].as_u64(),
            r["files_added"].as_u64(),
            r["version"].as_i64()
        ),
        (Some(6), Some(1), Some(22))
    );
    let t = read(&table);
    assert_eq!((t.version, t.files, t.on_disk), (22, 1, Some(22)));
    assert_ids_once(&t.ids, 1000, "after the second compaction");
    assert_eq!(t.id_ranges, json!([[0, 999]]));

    // Nothing left to pack: exit 0, no commit.
    let (code, r, _) = compact(&table, &[]);
    assert_eq!((code, r["commits"].as_u64()), (0, Some(0)));
    assert!(
        r["skipped"].as_str().unwrap().contains("small files"),
        "{r}"
    );
    assert_eq!(read(&table).version, 22);
}

#[test]
fn compact_command_refuses_bad_input_with_exit_2_and_waits_for_a_held_lease() {
    let dir = tempfile::tempdir().unwrap();
    let table = small_commits(dir.path(), 100, 20);
    let missing = dir.path().join("none");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--table-url".into(),
                format!("file://{}", missing.display()),
            ],
            "no Delta table",
        ),
        (
            vec!["--table-url".into(), "bigquery://p/d/t".into()],
            "compaction is for Delta tables",
        ),
        (
            vec!["--table-url".into(), "ftp://host/x".into()],
            "unsupported scheme",
        ),
        (
            vec![
                "--table-url".into(),
                format!("file://{}", table.display()),
                "--partition".into(),
                "day=1".into(),
            ],
            "day is not a partition column",
        ),
        (
            vec![
                "--table-url".into(),
                format!("file://{}", table.display()),
                "--partition".into(),
                "day".into(),
            ],
            "expected COLUMN=VALUE",
        ),
        (
            vec![
                "--table-url".into(),
                format!("file://{}", table.display()),
                "--min-files".into(),
                "1".into(),
            ],
            "--min-files 1: at least 2",
        ),
        (
            vec![
                "--table-url".into(),
                format!("file://{}", table.display()),
                "--target-size".into(),
                "0".into(),
            ],
            "--target-size 0",
        ),
        (
            vec![
                "--table-url".into(),
                format!("file://{}", table.display()),
                "--target-size".into(),
                "lots".into(),
            ],
            "--target-size",
        ),
    ];
    for (args, want) in cases {
        let out = subsink().arg("compact").args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(!missing.exists(), "compact creates no folder");
    assert_eq!(read(&table).version, 5, "nothing committed");

    // Another compaction holds the lease: exit 1, nothing committed, the lease left alone.
    let lease = table.join("_subsink_compaction.lease");
    let until = chrono::Utc::now().timestamp_millis() + 600_000;
    std::fs::write(
        &lease,
        json!({"owner": "someone", "until_ms": until}).to_string(),
    )
    .unwrap();
    let (code, _, err) = compact(&table, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("another compaction is running"), "{err}");
    assert!(lease.exists());
    assert_eq!(read(&table).version, 5);
    // An expired lease (its holder died) is taken over, and given back after.
    let until = chrono::Utc::now().timestamp_millis() - 1_000;
    std::fs::write(
        &lease,
        json!({"owner": "someone", "until_ms": until}).to_string(),
    )
    .unwrap();
    let (code, r, err) = compact(&table, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (r["files_removed"].as_u64(), r["files_added"].as_u64()),
        (Some(5), Some(1))
    );
    assert!(!lease.exists(), "the lease is given back");
    let t = read(&table);
    assert_eq!((t.version, t.files), (6, 1));
    assert_ids_once(&t.ids, 100, "after the compaction");
}

/// Creates a table partitioned by `day` with the `deltalake` package and appends to it, 10 rows a
/// commit: 1 commit into day 03, 8 into each of the days 01 and 02, then 3 more into day 03.
const PARTITIONED: &str = r#"
import sys
import pyarrow as pa
import deltalake
loc = sys.argv[1]
schema = pa.schema([("id", pa.int64()), ("day", pa.string())])
n = 0
for day, commits in [("2024-01-03", 1), ("2024-01-01", 8), ("2024-01-02", 8), ("2024-01-03", 3)]:
    for _ in range(commits):
        ids = list(range(n, n + 10))
        n += 10
        t = pa.table({"id": ids, "day": [day] * 10}, schema=schema)
        deltalake.write_deltalake(loc, t, mode="append", partition_by=["day"])
print(n)
"#;

#[test]
fn partitioned_table_of_the_deltalake_package_is_compacted_by_partition() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("p");
    let n: i64 = venv_python(["-c", PARTITIONED, &table.display().to_string()], &[])
        .trim()
        .parse()
        .unwrap();
    assert_eq!(n, 200);
    let before = read(&table);
    assert_eq!((before.version, before.files), (19, 20));

    // The last 3 commits wrote day 03: days 01 and 02 are compacted, one commit each (day 03
    // has a file in the version planned on, so the table is not compacted as a whole).
    let (code, r, err) = compact(&table, &["--skip-recent-commits", "3"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["partitions"], json!(["day=2024-01-01", "day=2024-01-02"]));
    assert_eq!(
        (
            r["commits"].as_u64(),
            r["files_removed"].as_u64(),
            r["files_added"].as_u64()
        ),
        (Some(2), Some(16), Some(2))
    );
    assert_eq!(
        (r["read_version"].as_i64(), r["version"].as_i64()),
        (Some(16), Some(21))
    );
    let t = read(&table);
    assert_eq!(t.files, 6);
    assert_ids_once(&t.ids, n, "partitions 01 and 02 compacted");
    let want: BTreeMap<String, u64> = [
        ("day=2024-01-01", 80),
        ("day=2024-01-02", 80),
        ("day=2024-01-03", 40),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(t.partitions, want);
    // The packed files are in their partition's folder, as the package writes them.
    let in_day = |day: &str| {
        std::fs::read_dir(table.join(format!("day={day}")))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "parquet")
            })
            .count()
    };
    assert_eq!((in_day("2024-01-01"), in_day("2024-01-03")), (9, 4));

    // One partition by name.
    let (code, r, err) = compact(&table, &["--partition", "day=2024-01-03"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["partitions"], json!(["day=2024-01-03"]));
    assert_eq!(
        (r["files_removed"].as_u64(), r["files_added"].as_u64()),
        (Some(4), Some(1))
    );
    let t = read(&table);
    assert_eq!((t.files, t.version), (3, 22));
    assert_ids_once(&t.ids, n, "partition 03 compacted");
    assert_eq!(t.partitions, want);
    // Readable by the package's own writer after: one more append, and its optimize finds
    // nothing to do.
    let more = r#"
import sys, json
import pyarrow as pa, deltalake
loc = sys.argv[1]
deltalake.write_deltalake(loc, pa.table({"id": [200], "day": ["2024-01-02"]}), mode="append", partition_by=["day"])
dt = deltalake.DeltaTable(loc)
print(json.dumps(dt.optimize.compact(partition_filters=[("day", "=", "2024-01-01")])))
"#;
    let m: Value = serde_json::from_str(&venv_python(
        ["-c", more, &table.display().to_string()],
        &[],
    ))
    .unwrap();
    assert_eq!(m["numFilesRemoved"], 0, "{m}");
    assert_ids_once(&read(&table).ids, n + 1, "after the package's append");
}

/// How far [`feed_slowly`] got, and the gate its last chunk waits at.
#[derive(Clone, Default)]
struct Feed {
    /// Chunks written so far.
    fed: Arc<AtomicUsize>,
    /// The last chunk (and so the end of the input) waits until this turns true.
    open: Arc<AtomicBool>,
}

/// Feed `msgs` to a child's stdin, `per_pause` lines at a time with a pause between: a stream
/// that lasts a while. The last chunk waits for `feed`'s gate: the writer cannot end before the
/// test lets it.
fn feed_slowly(
    mut child: Child,
    msgs: Vec<Message>,
    per_pause: usize,
    pause: Duration,
    feed: Feed,
) -> Child {
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let chunks = msgs.chunks(per_pause).count();
        for (i, chunk) in msgs.chunks(per_pause).enumerate() {
            while i + 1 == chunks && !feed.open.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let mut buf = Vec::new();
            for m in chunk {
                buf.extend_from_slice(m.to_json_line().as_bytes());
                buf.push(b'\n');
            }
            if stdin.write_all(&buf).is_err() {
                return;
            }
            feed.fed.fetch_add(1, Ordering::Release);
            std::thread::sleep(pause);
        }
    });
    child
}

/// The turns of a test's `subsink compact` loop beside a writer that compacts in the background.
/// On a busy machine the command, run every few hundred milliseconds, can hold the compaction
/// lease at every one of the background's turns; so once half of the writer's input is fed and
/// the background has not compacted yet, the loop waits (bounded) for the background's
/// `compacted` log line before it runs the command again, and the writer's last chunk is held
/// back until that line has come: the background compacts while the writer runs, whatever the
/// load.
struct Turns {
    feed: Feed,
    chunks: usize,
    /// Since when the loop has waited for the background.
    waiting: Option<Instant>,
    /// How long it waited, once the background has compacted.
    waited: Option<Duration>,
}

impl Turns {
    /// The bound on the wait for the background: its interval is 1 s.
    const LIMIT: Duration = Duration::from_secs(60);

    /// How the turns went, for the test's output.
    fn told(&self) -> String {
        match self.waited {
            Some(w) => format!("the command loop waited {w:.1?} for the background"),
            None => "the command loop never waited for the background".into(),
        }
    }

    fn new(feed: Feed, chunks: usize) -> Turns {
        Turns {
            feed,
            chunks,
            waiting: None,
            waited: None,
        }
    }

    /// Whether the command takes this turn; `writer` is the one compacting in the background
    /// (still running: its last chunk waits for the background).
    fn command_may_run(&mut self, writer: &Child) -> bool {
        if self.feed.open.load(Ordering::Acquire) {
            return true;
        }
        if stderr_so_far(writer).contains("compacted ") {
            self.feed.open.store(true, Ordering::Release);
            self.waited = self.waiting.map(|since| since.elapsed());
            return true;
        }
        if self.feed.fed.load(Ordering::Acquire) * 2 < self.chunks {
            return true;
        }
        let since = *self.waiting.get_or_insert_with(Instant::now);
        assert!(
            since.elapsed() < Self::LIMIT,
            "the background did not compact within {:?} while the command waited: {}",
            Self::LIMIT,
            stderr_so_far(writer)
        );
        false
    }
}

/// A failed `subsink compact` of a table being written: it lost to another commit (exit 1,
/// nothing committed: deltalake's conflict check, or its retries ran out — both
/// `DeltaTableError::Transaction` around a `TransactionError` that failed the commit).
fn lost_to_a_commit(code: i32, err: &str) -> bool {
    code == 1 && err.contains("Transaction failed: Failed to commit transaction")
}

/// Two writers append rows with disjoint ids to `url` from slow streams (one of them with the
/// background compaction, `background` its flags), while `subsink compact` runs in a loop;
/// every id `0..2n` must be in the table once. Returns the reports of the commands that
/// compacted, and the background's log lines of compactions.
fn two_writers_and_compactions(
    dir: &Path,
    url: &str,
    env: &[(&str, String)],
    n: i64,
    background: &[&str],
) -> (Vec<Value>, usize) {
    let sub = subscription(dir, 20);
    let schema = schema(dir);
    let mut feeds = Vec::new();
    let writers: Vec<Child> = (0..2i64)
        .map(|w| {
            let mut c = run_cmd(&sub, &schema, url, "-");
            c.envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .env("SUBSINK_LOG", "warn,subsink=info")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
            if w == 0 {
                c.args(background);
            }
            let msgs: Vec<Message> = (w * n..(w + 1) * n)
                .map(|i| row_message(i, &format!("w{w}")))
                .collect();
            // Only writer 0 compacts in the background: writer 1's input is never held back.
            let feed = Feed::default();
            if w == 1 {
                feed.open.store(true, Ordering::Release);
            }
            feeds.push(feed.clone());
            feed_slowly(
                spawn_draining(&mut c),
                msgs,
                20,
                Duration::from_millis(40),
                feed,
            )
        })
        .collect();
    let mut turns = Turns::new(feeds[0].clone(), (n as usize).div_ceil(20));
    let mut reports = Vec::new();
    let (mut busy, mut failed) = (0, Vec::new());
    let start = Instant::now();
    // The command, over and over, until the writers are done.
    let mut done = Vec::new();
    let mut writers: Vec<Option<Child>> = writers.into_iter().map(Some).collect();
    while done.len() < 2 {
        std::thread::sleep(Duration::from_millis(300));
        let command = match &writers[0] {
            Some(w0) => turns.command_may_run(w0),
            None => true,
        };
        let (code, r, err) = if command {
            compact_at(
                url,
                &["--skip-recent-commits", "3", "--min-files", "3"],
                env,
            )
        } else {
            (0, Value::Null, String::new())
        };
        match code {
            0 if r["commits"].as_u64() > Some(0) => reports.push(r),
            0 => {}
            1 if err.contains("another compaction is running") => busy += 1,
            // The writers have not created the table yet (the first loop turns).
            2 if reports.is_empty() && err.contains("no Delta table") => {}
            _ => failed.push((code, err)),
        }
        for (w, slot) in writers.iter_mut().enumerate() {
            if let Some(c) = slot {
                if c.try_wait().unwrap().is_some() {
                    done.push((w, output(slot.take().unwrap())));
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the writers did not end"
        );
    }
    let mut background_compactions = 0;
    for (w, out) in &done {
        let s = summary(out);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "writer {w}: {err}");
        assert_eq!(s["messages_written"], n, "writer {w}: {s}");
        if *w == 0 {
            background_compactions = err.matches("compacted ").count();
            assert!(!err.contains("compaction failed"), "{err}");
        }
    }
    eprintln!(
        "[compact] {} command compactions, {busy} found the lease held, {} failed (conflicts), {background_compactions} background compactions, {}, {:.1} s",
        reports.len(),
        failed.len(),
        turns.told(),
        start.elapsed().as_secs_f64()
    );
    // A compaction may lose to a writer's commit (deltalake's retries run out): exit 1, nothing
    // committed; anything else is a failure.
    for (code, e) in &failed {
        assert!(lost_to_a_commit(*code, e), "exit {code}: {e}");
    }
    (reports, background_compactions)
}

#[test]
fn two_writers_with_the_command_and_the_background_compaction_lose_and_duplicate_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let url = format!("file://{}", table.display());
    let n = 2_000;
    let (reports, background) = two_writers_and_compactions(
        dir.path(),
        &url,
        &[],
        n,
        &[
            "--compact-after",
            "4",
            "--compact-interval",
            "1s",
            "--compact-skip-recent",
            "3",
        ],
    );
    assert!(
        !reports.is_empty(),
        "the command compacted while the writers ran"
    );
    assert!(
        background > 0,
        "the background compacted while the writers ran"
    );
    let t = read(&table);
    assert_ids_once(&t.ids, 2 * n, "two writers and compactions");
    // 2 × 100 commits of one file each; what is left is far fewer.
    let removed: u64 = reports
        .iter()
        .map(|r| r["files_removed"].as_u64().unwrap())
        .sum();
    assert!(
        t.files < 100,
        "{} files, {removed} removed by the command",
        t.files
    );
    // A last compaction, the writers gone: one file.
    let (code, _, err) = compact(&table, &[]);
    assert_eq!(code, 0, "{err}");
    let t = read(&table);
    assert_eq!(t.files, 1);
    assert_ids_once(&t.ids, 2 * n, "after a last compaction");
}

#[test]
fn two_writers_and_compactions_on_seaweedfs_lose_and_duplicate_nothing() {
    let s3 = shared_seaweedfs().api();
    let bucket = unique_bucket("compact");
    s3.create_bucket(&bucket);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("s3://{bucket}/warehouse/rows");
    let env = s3.env();
    let n = 1_000;
    let (_, background) = two_writers_and_compactions(
        dir.path(),
        &url,
        &env,
        n,
        &[
            "--compact-after",
            "4",
            "--compact-interval",
            "1s",
            "--compact-skip-recent",
            "3",
        ],
    );
    assert!(
        background > 0,
        "the background compacted while the writers ran"
    );
    let mut reader_env = env.clone();
    reader_env.push(("READER_OPTIONS", reader_options(&env)));
    let t = read_at(&url, &reader_env);
    assert_ids_once(&t.ids, 2 * n, "two writers and compactions on SeaweedFS");
    assert!(t.files < 100, "{} files", t.files);
}

/// The command on Azurite (Blob storage): a table of 20 small commits packed into one file, read
/// back from Azurite by the `deltalake` package with every id once; the compactions' lease is
/// given back (a second run finds nothing to do rather than a held lease).
#[test]
fn compact_command_on_azurite_packs_the_table_and_gives_the_lease_back() {
    let az = shared_azurite();
    let container = unique_bucket("compact");
    az.create_container(&container);
    let env = az.env();
    let dir = tempfile::tempdir().unwrap();
    let n = 2_000;
    let src = dir.path().join("in.ndjson");
    write_lines(
        &src,
        &(0..n).map(|i| row_message(i, "w0")).collect::<Vec<_>>(),
    );
    let url = format!("az://{container}/warehouse/rows");
    let out = run_cmd(
        &subscription(dir.path(), 100),
        &schema(dir.path()),
        &url,
        &src.display().to_string(),
    )
    .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, r, err) = compact_at(&url, &[], &env);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (&r["files_before"], &r["files_removed"], &r["files_added"]),
        (&json!(20), &json!(20), &json!(1)),
        "{r}"
    );
    let mut reader_env = env.clone();
    reader_env.push((
        "READER_OPTIONS",
        json!({
            "azure_storage_account_name": AZURITE_ACCOUNT,
            "azure_storage_account_key": AZURITE_KEY,
            "azure_storage_use_emulator": "true",
            "azure_allow_http": "true",
        })
        .to_string(),
    ));
    let t = read_at(&url, &reader_env);
    assert_eq!(t.files, 1);
    assert_eq!(t.version, r["version"].as_i64().unwrap());
    assert_ids_once(&t.ids, n, "compacted on Azurite");
    let (code, r, err) = compact_at(&url, &[], &env);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["version"], Value::Null, "nothing left to compact: {r}");
}

/// The `deltalake` package's storage options for the S3 server of `env`.
fn reader_options(env: &[(&str, String)]) -> String {
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    json!({
        "AWS_ENDPOINT_URL": get("AWS_ENDPOINT_URL"),
        "AWS_ACCESS_KEY_ID": get("AWS_ACCESS_KEY_ID"),
        "AWS_SECRET_ACCESS_KEY": get("AWS_SECRET_ACCESS_KEY"),
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    })
    .to_string()
}

// --- change data capture --------------------------------------------------------------------------

/// The columns of the change data capture table (key `id`), as tests/cdc.rs has them.
const CDC_FIELDS: &str = r#"[
  {"name": "id", "type": "INTEGER"},
  {"name": "region", "type": "STRING"},
  {"name": "name", "type": "STRING"},
  {"name": "qty", "type": "INT64"},
  {"name": "score", "type": "FLOAT64"},
  {"name": "ok", "type": "BOOL"}
]"#;

/// Every row of a table by its `id`, read with `deltalake`; an id twice is a failure.
const ROWS_BY_ID: &str = r#"
import json, os, sys
import deltalake
dt = deltalake.DeltaTable(sys.argv[1])
print(json.dumps({"files": len(dt.file_uris()), "rows": dt.to_pyarrow_table().to_pylist()}))
sys.stdout.flush()
os._exit(0)
"#;

fn rows_by_id(rows: &[Value], what: &str) -> BTreeMap<i64, Value> {
    let mut m = BTreeMap::new();
    for r in rows {
        let id = r["id"].as_i64().unwrap();
        if let Some(old) = m.insert(id, r.clone()) {
            panic!("{what}: id {id} twice: {old} and {r}");
        }
    }
    m
}

/// The CDC writer with `subsink.table.maxMessages` `per_commit`, reading stdin.
fn cdc_writer(dir: &Path, table: &Path, per_commit: u64) -> Command {
    let cfg = json!({
        "name": SUB,
        "topic": "projects/proj/topics/rows",
        "bigqueryConfig": {"table": "proj.analytics.changes", "useTableSchema": true},
        "subsink": {"table": {"maxMessages": per_commit.to_string()}},
    });
    let sub = dir.join("cdc-sub.json");
    std::fs::write(&sub, cfg.to_string()).unwrap();
    let fields = dir.join("cdc-fields.json");
    std::fs::write(&fields, CDC_FIELDS).unwrap();
    let mut c = run_cmd(&sub, &fields, &format!("file://{}", table.display()), "-");
    c.args(["--table-primary-key", "id"]);
    c
}

#[test]
fn change_data_capture_table_compacted_between_merges_equals_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("cdc");
    let n = env_or("COMPACT_CDC_CHANGES", 20_000);
    // New keys in rising order, 200 changes a MERGE; every third MERGE also updates or deletes
    // 4 keys anywhere in the table. An insert-only MERGE adds a file and rewrites none; the
    // others rewrite the files holding their keys: the table keeps several small files (the case
    // compaction is for), and MERGEs rewrite files a compaction is packing. Numbered, so the
    // model's order is the numbers'.
    let mut seed = 36u64;
    let (mut next, mut changes) = (0i64, Vec::new());
    for i in 0..n {
        let number = format!("{:X}", i + 1);
        let change = if (i / 200) % 3 != 2 || i % 50 != 0 || next == 0 {
            next += 1;
            json!({"id": next - 1, "region": "eu", "name": format!("n{i}"), "qty": i,
                   "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": number})
        } else {
            let id = (xorshift(&mut seed) % next as u64) as i64;
            if i % 100 == 0 {
                json!({"id": id, "region": "us", "name": format!("u{i}"), "qty": i,
                       "score": 0.5, "_CHANGE_TYPE": "UPSERT", "_CHANGE_SEQUENCE_NUMBER": number})
            } else {
                json!({"id": id, "_CHANGE_TYPE": "DELETE", "_CHANGE_SEQUENCE_NUMBER": number})
            }
        };
        changes.push(change);
    }
    let model = {
        let input = dir.path().join("changes.json");
        std::fs::write(&input, serde_json::to_vec(&changes).unwrap()).unwrap();
        let out = Command::new(venv_bin("python"))
            .arg(root().join("tests/py/cdc_model.py"))
            .args(["model", "--key", "id"])
            .stdin(std::fs::File::open(&input).unwrap())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
    };
    let want = rows_by_id(&model, "model");
    assert!(want.len() > n / 2, "{} rows", want.len());
    let msgs: Vec<Message> = changes
        .iter()
        .enumerate()
        .map(|(i, c)| Message {
            data: serde_json::to_vec(c).unwrap().into(),
            attributes: Default::default(),
            message_id: format!("c{i:07}"),
            publish_time_micros: 1_714_521_600_000_000 + i as i64,
            ordering_key: String::new(),
        })
        .collect();
    // 100 MERGEs of 200 changes, from a stream that lasts ~10 s, while the command compacts the
    // table over and over (K = 0: every MERGE removes files, so the quiet part never is).
    // The writer compacts in the background too (K = 0: a MERGE that rewrites files removes
    // them, so a quiet part would rarely be).
    let mut c = cdc_writer(dir.path(), &table, 200);
    c.args([
        "--compact-after",
        "2",
        "--compact-interval",
        "1s",
        "--compact-skip-recent",
        "0",
    ]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .env("SUBSINK_LOG", "warn,subsink=debug");
    let feed = Feed::default();
    let mut turns = Turns::new(feed.clone(), msgs.len().div_ceil(200));
    let mut writer = Some(feed_slowly(
        spawn_draining(&mut c),
        msgs,
        200,
        Duration::from_millis(100),
        feed,
    ));
    let (mut compacted, mut busy, mut lost) = (0, 0, 0);
    let mut last = String::new();
    let start = Instant::now();
    let out = loop {
        std::thread::sleep(Duration::from_millis(200));
        let command = turns.command_may_run(writer.as_ref().unwrap());
        if command && table.join("_delta_log").exists() {
            let (code, r, err) = compact(&table, &["--min-files", "2"]);
            match code {
                0 if r["commits"].as_u64() > Some(0) => compacted += 1,
                0 => last = r.to_string(),
                // The background compaction held the lease.
                1 if err.contains("another compaction is running") => busy += 1,
                // Lost to a MERGE: nothing committed, tried again at the next turn.
                _ if lost_to_a_commit(code, &err) => lost += 1,
                _ => panic!("a compaction failed otherwise (exit {code}): {err}"),
            }
        }
        if writer.as_mut().unwrap().try_wait().unwrap().is_some() {
            break output(writer.take().unwrap());
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the writer did not end"
        );
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(summary(&out)["messages_written"], changes.len());
    // How often a MERGE lost to a compaction and ran again depends on timing: printed, not
    // asserted (that the result equals the model is).
    let reruns = err.matches("MERGE conflicted with another writer").count();
    if let Some(line) = err.lines().find(|l| l.contains("MERGE conflicted")) {
        eprintln!("[compact] CDC: e.g. {line}");
    }
    let background = err.matches("compacted ").count();
    eprintln!(
        "[compact] CDC: {compacted} compactions by the command ({busy} found the lease held, {lost} lost to a MERGE), {background} in the background, {}, {reruns} MERGEs ran again, {:.1} s",
        turns.told(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        background > 0,
        "the background compacted between the MERGEs"
    );
    assert!(
        compacted > 0,
        "the command compacted between the MERGEs; last: {last}"
    );
    let v = python_json(ROWS_BY_ID, &table.display().to_string(), &[]);
    let got = rows_by_id(v["rows"].as_array().unwrap(), "table");
    let missing = want.keys().filter(|k| !got.contains_key(k)).count();
    let extra = got.keys().filter(|k| !want.contains_key(k)).count();
    let differ = want
        .iter()
        .filter(|(k, w)| got.get(k).is_some_and(|g| g != *w))
        .count();
    assert_eq!(
        (missing, extra, differ),
        (0, 0, 0),
        "the table differs from the model ({} rows, model {})",
        got.len(),
        want.len()
    );
}

#[test]
fn background_compaction_is_refused_for_a_bucket_and_a_bad_count() {
    let dir = tempfile::tempdir().unwrap();
    let out = storage_run_cmd("bucket-b", "text")
        .args([
            "--bucket-url",
            &format!("file://{}", dir.path().join("b").display()),
        ])
        .args(["--compact-after", "4"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--compact-after 4: background compaction is for a Delta table"),
        "{err}"
    );
    let table = dir.path().join("t");
    let out = run_cmd(
        &subscription(dir.path(), 10),
        &schema(dir.path()),
        &format!("file://{}", table.display()),
        "-",
    )
    .args(["--compact-after", "1"])
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--compact-after 1: at least 2"), "{err}");
    assert!(!table.join("_delta_log").exists(), "nothing written");
}

/// The `.parquet` files in a local table's root, by name.
fn parquet_files(table: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(table)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".parquet"))
        .collect()
}

/// `subsink vacuum --table-url file://TABLE ARGS…`: exit code, report (exit 0) and stderr.
fn vacuum(table: &Path, args: &[&str]) -> (i32, Value, String) {
    let out = subsink()
        .args([
            "vacuum",
            "--table-url",
            &format!("file://{}", table.display()),
        ])
        .args(args)
        .output()
        .unwrap();
    report_of(&out)
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect()
}

/// Issue 44, point 9: compaction leaves the files it removed on the store; `subsink vacuum`
/// deletes exactly those removed longer ago than the retention (the table's
/// `delta.deletedFileRetentionDuration`, here 10 s), refuses a shorter one without `--force`,
/// and with `--full` also deletes a file no commit names once it is older; `--dry-run` lists
/// the same files and deletes none. The `deltalake` package reads the same rows throughout.
#[test]
fn vacuum_deletes_exactly_the_removed_files_older_than_the_retention() {
    let dir = tempfile::tempdir().unwrap();
    let table = small_commits(dir.path(), 100, 10);
    venv_python(
        [
            "-c",
            "import sys, deltalake\n\
             deltalake.DeltaTable(sys.argv[1]).alter.set_table_properties(\n\
                 {'delta.deletedFileRetentionDuration': 'interval 10 seconds'})",
            &table.display().to_string(),
        ],
        &[],
    );
    let first = parquet_files(&table);
    assert_eq!(first.len(), 10);
    let (code, r, err) = compact(&table, &[]);
    assert_eq!((code, r["files_removed"].as_u64()), (0, Some(10)), "{err}");
    let packed: Vec<String> = parquet_files(&table).difference(&first).cloned().collect();
    assert_eq!(
        packed.len(),
        1,
        "compaction leaves the old files: {packed:?}"
    );
    std::thread::sleep(Duration::from_secs(11));

    // Ten more rows in five files; then the packed file and those are packed again (removed
    // now, within the retention).
    let src = dir.path().join("more.ndjson");
    write_lines(
        &src,
        &(100..110).map(|i| row_message(i, "w1")).collect::<Vec<_>>(),
    );
    let url = format!("file://{}", table.display());
    let out = run_cmd(
        &subscription(dir.path(), 2),
        &schema(dir.path()),
        &url,
        &src.display().to_string(),
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before_second = parquet_files(&table);
    let (code, r, err) = compact(&table, &[]);
    assert_eq!((code, r["files_removed"].as_u64()), (0, Some(6)), "{err}");
    let on_disk = parquet_files(&table);
    assert_eq!(on_disk.len(), 17);
    let want: Vec<String> = first.iter().cloned().collect();

    let (code, r, err) = vacuum(&table, &["--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (r["dry_run"].as_bool(), r["mode"].as_str()),
        (Some(true), Some("lite"))
    );
    assert_eq!(
        names(&r["files"]),
        want,
        "the files removed more than 10 s ago"
    );
    assert_eq!(parquet_files(&table), on_disk, "a dry run deletes nothing");
    let (code, r, err) = vacuum(&table, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (
            r["retention_seconds"].as_u64(),
            r["table_retention_seconds"].as_u64()
        ),
        (Some(10), Some(10))
    );
    assert_eq!(r["file_count"], 10);
    assert_eq!(names(&r["files"]), want);
    let kept: std::collections::BTreeSet<String> = on_disk.difference(&first).cloned().collect();
    assert_eq!(
        parquet_files(&table),
        kept,
        "the files removed within the retention stay"
    );

    // Shorter than the table's retention: refused, one line, nothing deleted.
    let (code, _, err) = vacuum(&table, &["--retention", "1s"]);
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "error: --retention 1s is shorter than the table's delta.deletedFileRetentionDuration (10s): readers of versions up to 10s old (time travel, a scan in progress) and a compaction planned on one may still need the files it would delete; give --retention 10s or more, or add --force when nothing uses the older versions\n"
    );
    assert_eq!(parquet_files(&table), kept);
    let t = read(&table);
    assert_ids_once(&t.ids, 110, "after the vacuum");

    // A file no commit names (an upload whose commit never came), an hour old: only --full
    // deletes it, with the files the second compaction removed once they are 10 s old.
    let orphan = table.join("part-00000-orphan-c000.zstd.parquet");
    std::fs::write(&orphan, b"not committed").unwrap();
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&orphan)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    std::thread::sleep(Duration::from_secs(11));
    let (code, r, err) = vacuum(&table, &[]);
    assert_eq!(code, 0, "{err}");
    let second: Vec<String> = before_second.difference(&first).cloned().collect();
    assert_eq!(names(&r["files"]), second, "lite: the removed files only");
    let (code, r, err) = vacuum(&table, &["--full", "--dry-run"]);
    assert_eq!((code, r["mode"].as_str()), (0, Some("full")), "{err}");
    assert_eq!(
        names(&r["files"]),
        vec!["part-00000-orphan-c000.zstd.parquet".to_string()]
    );
    let (code, r, err) = vacuum(&table, &["--full"]);
    assert_eq!((code, r["file_count"].as_u64()), (0, Some(1)), "{err}");
    let last: std::collections::BTreeSet<String> =
        kept.difference(&before_second).cloned().collect();
    assert_eq!(
        parquet_files(&table),
        last,
        "only the table's one file is left"
    );
    let t = read(&table);
    assert_eq!(t.files, 1);
    assert_ids_once(&t.ids, 110, "after the full vacuum");
}
