//! The memory budget (issue 10, point 7): 250 open files at once (one per topic-schema revision,
//! docs/contract.md §3.7) in one run. With `--memory-limit 16MiB` the largest open file is
//! finalized early whenever the files together pass the limit — reason `memory` in the metrics
//! and in the log — and the process's peak RSS (the kernel's, from `wait4`) stays under the limit
//! plus the documented overhead; without a limit the same run holds every file whole and its peak
//! is far above that, so the budget is what keeps it down.

#[path = "memory/brokers.rs"]
mod brokers;
#[path = "memory/sized.rs"]
mod sized;
mod util;

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use sized::*;
use subsink::message::Message;
use util::http::metric;
use util::*;

const REVISIONS: usize = 250;
const MESSAGES: usize = 25_000;
/// Bytes of the `name` field of each message (the Avro record is a little larger).
const NAME_BYTES: usize = 4000;
const LIMIT_MIB: u64 = 16;
/// The documented overhead (docs/operating.md, Memory budget): what the budget does not count — the
/// process's base (binary, runtime, the file source's read-ahead: about 50 MiB RSS for this debug
/// build) and about 128 KiB per open file, with room for the allocator's slack — so peak RSS <
/// limit + 64 MiB + 128 KiB × files. (Before the binary turned transparent huge pages off, the
/// allocator's slack alone reached about 3× the budget: 106–125 MiB here.) Measured with THP off:
/// 78 MiB with 250 files and a 16 MiB budget; 267 MiB without one.
fn bound_mib() -> f64 {
    (LIMIT_MIB + 64) as f64 + REVISIONS as f64 * 0.125
}

fn message(i: usize) -> Message {
    let payload = json!({
        "id": i,
        "name": format!("{i:08}{}", "x".repeat(NAME_BYTES - 8)),
        "tags": [],
        "amount": null,
        "kind": "CLICK",
        "ok": true,
    });
    Message {
        data: payload.to_string().into_bytes().into(),
        attributes: [
            ("googclient_schemaencoding".to_string(), "JSON".to_string()),
            (
                "googclient_schemaname".to_string(),
                "projects/p/schemas/event".to_string(),
            ),
            (
                "googclient_schemarevisionid".to_string(),
                format!("r{:04}", i % REVISIONS),
            ),
        ]
        .into(),
        message_id: format!("{i}"),
        publish_time_micros: 1_700_000_000_000_000 + i as i64,
        ordering_key: String::new(),
    }
}

struct Outcome {
    peak_mib: f64,
    summary: serde_json::Value,
    log: String,
    objects: usize,
}

/// Run the 250-revision input through `subsink run` reading stdin, with `limit`; when
/// `check` is set, read the metrics while every message is in and stdin still open.
fn run(dir: &Path, limit: &str, check: bool) -> Outcome {
    let bucket = dir.join(format!("bucket-{limit}"));
    let port = free_port();
    let out_path = dir.join(format!("out-{limit}"));
    let log_path = dir.join(format!("log-{limit}"));
    let own = own_peak_mib();
    // Reaped by `wait_rusage` (wait4), which also gives the peak RSS.
    #[allow(clippy::zombie_processes)]
    let mut child = storage_run_cmd("bkt", "avro")
        .args(["--cloud-storage-use-topic-schema", "--topic-schema"])
        .arg(root().join("fixtures/input/event.avsc"))
        .args(["--cloud-storage-max-duration", "3600s"])
        .args(["--cloud-storage-max-bytes", "10GiB"])
        .args(["--memory-limit", limit, "--source", "-"])
        .arg("--bucket-url")
        .arg(format!("file://{}", bucket.display()))
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("SUBSINK_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut stdin);
        for i in 0..MESSAGES {
            writeln!(w, "{}", message(i).to_json_line()).unwrap();
        }
        w.flush().unwrap();
        drop(w);
        stdin
    });
    let stdin = writer.join().unwrap();
    if check {
        let base = format!("http://127.0.0.1:{port}");
        let sub = json!({"subscription": SUB});
        poll(Duration::from_secs(120), Duration::from_millis(500), || {
            let got = metric(
                &base,
                "subsink_messages_received",
                "subsink_messages_received_total",
                &sub,
            );
            (got == Some(MESSAGES as f64))
                .then_some(())
                .ok_or(format!("received {got:?} of {MESSAGES}"))
        });
        // Every revision has its file open at once.
        let open = metric(&base, "subsink_open_files", "subsink_open_files", &sub).unwrap();
        assert!(open >= 200.0, "open files: {open}");
        let memory = json!({"subscription": SUB, "reason": "memory"});
        let early = metric(
            &base,
            "subsink_files_finalized",
            "subsink_files_finalized_total",
            &memory,
        )
        .unwrap();
        assert!(early > 0.0, "no file finalized for memory");
        let buffered = metric(
            &base,
            "subsink_buffered_bytes",
            "subsink_buffered_bytes",
            &sub,
        );
        assert!(
            buffered.unwrap() <= (LIMIT_MIB << 20) as f64,
            "buffered {buffered:?}"
        );
    }
    drop(stdin);
    let (code, peak_kib) = wait_rusage(pid);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(code, 0, "{log}");
    let out = std::fs::read_to_string(&out_path).unwrap();
    let summary: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_no_staging(&bucket);
    Outcome {
        peak_mib: worker_peak(limit, &summary, peak_kib, own),
        summary,
        log,
        objects: objects_below(&bucket).len(),
    }
}

#[test]
fn many_open_files_stay_within_the_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let limited = run(dir.path(), &format!("{LIMIT_MIB}MiB"), true);
    let unlimited = run(dir.path(), "none", false);
    eprintln!(
        "peak RSS: {:.1} MiB with --memory-limit {LIMIT_MIB}MiB ({} objects), {:.1} MiB without ({} objects)",
        limited.peak_mib, limited.objects, unlimited.peak_mib, unlimited.objects
    );
    for o in [&limited, &unlimited] {
        assert_eq!(o.summary["messages_written"], MESSAGES as u64);
    }
    // Every message once, over every file.
    let logged: u64 = limited
        .log
        .lines()
        .filter(|l| l.contains("file written"))
        .map(|l| {
            l.split("messages=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(logged, MESSAGES as u64);
    let early = limited
        .log
        .lines()
        .filter(|l| l.contains("file written") && l.contains("reason=\"memory\""))
        .count();
    assert!(early > 0, "no file logged with reason memory");
    assert_eq!(
        unlimited.objects, REVISIONS,
        "one file per revision without a budget"
    );
    assert!(limited.objects > REVISIONS, "files finalized early");
    let bound = bound_mib();
    assert!(
        limited.peak_mib < bound,
        "peak RSS {:.1} MiB over the limit plus overhead ({bound} MiB)",
        limited.peak_mib
    );
    assert!(
        unlimited.peak_mib > bound,
        "without a limit the run should need more ({:.1} MiB): the test would not show the budget",
        unlimited.peak_mib
    );
}

/// Messages and their data size of [`reading_pauses_while_uploads_hold_the_memory_budget`].
const HELD_MESSAGES: usize = 600;
const HELD_DATA: usize = 8000;

/// One run of [`reading_pauses_while_uploads_hold_the_memory_budget`] with `limit` and `slots`
/// upload slots: the store holds every write until the run has stopped receiving (or received
/// everything); then it answers, the input ends and every message must be written. Messages
/// received (by the metrics) and lines the run took from its stdin pipe while the store held
/// the writes.
fn received_while_the_store_holds(
    s3: &S3Server,
    dir: &Path,
    limit: &str,
    slots: usize,
) -> (f64, usize) {
    let dir = dir.join(format!("held-{limit}-{slots}"));
    std::fs::create_dir_all(&dir).unwrap();
    let proxy = util::proxy::S3Proxy::start(s3, &dir);
    proxy.set(json!({"mode": "hold"}));
    let port = free_port();
    let log_path = dir.join("log");
    let mut child = servers::guard(
        storage_run_cmd("bkt", "text")
            .args(["--cloud-storage-max-messages", "10"])
            .args(["--cloud-storage-max-duration", "3600s"])
            .args(["--cloud-storage-file-prefix", &format!("{limit}-{slots}/")])
            .args(["--max-concurrent-uploads", &slots.to_string()])
            .args(["--memory-limit", limit, "--source", "-"])
            .args(["--bucket-url", "s3://bkt"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .envs(proxy.env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log_path).unwrap()),
    )
    .spawn()
    .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut stdin = child.stdin.take().unwrap();
    // Blocks while the run does not read (a full pipe): joined once the store answers. `sent`:
    // the lines the pipe took so far.
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let sent = sent.clone();
        std::thread::spawn(move || {
            for i in 0..HELD_MESSAGES {
                writeln!(stdin, "{}", numbered_message(i, HELD_DATA).to_json_line()).unwrap();
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            stdin
        })
    };
    let sent = move || sent.load(std::sync::atomic::Ordering::SeqCst);
    wait_for_port(port, "subsink", &mut child);
    let base = format!("http://127.0.0.1:{port}");
    let received = || {
        metric(
            &base,
            "subsink_messages_received",
            "subsink_messages_received_total",
            &json!({"subscription": SUB}),
        )
        .unwrap_or(0.0)
    };
    // Received is reported each second: the run has stopped reading once writes are held and
    // neither the count nor the lines its stdin took changed over three seconds.
    let mut last = ((-1.0, 0), std::time::Instant::now());
    let got = poll(Duration::from_secs(90), Duration::from_millis(250), || {
        let n = (received(), sent());
        if n.0 == HELD_MESSAGES as f64 {
            return Ok(n);
        }
        if n != last.0 {
            last = (n, std::time::Instant::now());
        }
        let held = proxy.writes().iter().filter(|w| w.status.is_none()).count();
        if held > 0 && last.1.elapsed() >= Duration::from_secs(3) {
            return Ok(n);
        }
        Err(format!("received {n:?}, {held} writes held: {}", log()))
    });
    assert!(
        proxy.writes().iter().all(|w| w.status.is_none()),
        "nothing is written while the store holds"
    );
    proxy.set(json!({"mode": "pass"}));
    let stdin = writer.join().unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", log());
    assert_eq!(
        summary(&out)["messages_written"],
        HELD_MESSAGES as u64,
        "{}",
        log()
    );
    got
}

/// The budget pauses reading (docs/operating.md, Memory budget: "when what is over is already
/// being uploaded, reading pauses until those uploads end"). The store (moto behind the test
/// proxy) holds every write; with `--memory-limit 512KiB` the files waiting on it fill the budget
/// and the run stops receiving far short of its 600 messages of 8 KB (4.8 MB); once the store
/// answers, reading resumes and every message is written. The same run without a budget receives
/// all 600 while the store still holds every write: the pause is the budget's, not the upload
/// slots' (100 slots, more than the 60 files). With the default 2 slots and no budget, reading
/// stops too, once both slots hold an upload and a third file waits for one: a file source's
/// backpressure on a store that does not answer (docs/operating.md, Memory budget).
#[test]
fn reading_pauses_while_uploads_hold_the_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    s3.create_bucket("bkt");
    let (limited, limited_sent) = received_while_the_store_holds(&s3, dir.path(), "512KiB", 100);
    let (unlimited, _) = received_while_the_store_holds(&s3, dir.path(), "none", 100);
    let (_, slots_sent) = received_while_the_store_holds(&s3, dir.path(), "none", 2);
    eprintln!(
        "while the store held the writes: {limited} received ({limited_sent} lines taken from \
         stdin) with a 512 KiB budget, {unlimited} without; {slots_sent} lines taken without a \
         budget but with 2 upload slots"
    );
    assert!(limited_sent < HELD_MESSAGES, "the budget stops reading");
    // (Its loop waits for a slot, so its counters are not reported meanwhile: the lines its
    // stdin took tell how far it read.)
    assert!(
        slots_sent < HELD_MESSAGES,
        "2 upload slots: a file source waits for one"
    );
    assert_eq!(unlimited, HELD_MESSAGES as f64, "no budget: no pause");
    // 512 KiB is 65 messages of 8 KB; what the budget does not count (the source's read-ahead of
    // 256 KiB blocks, a file's buffer growing by doubling) adds some.
    assert!(
        limited > 0.0 && limited <= 200.0,
        "received {limited} of {HELD_MESSAGES} while the budget was full"
    );
}

// ---------------------------------------------------------------------------------------------
// Issue 26 (the runs and the bound: tests/memory/sized.rs).

/// Many messages of 1 KiB: `SUBSINK_MEMORY_SMALL` of them (default the 1M: a debug build
/// takes 31–86 s per run on a shared 2-core machine, 3–5 minutes for the four runs).
const SMALL_DEFAULT: usize = 1_000_000;

/// `writers` × limits 64 and 256 MiB over `input` of `count` messages: every message written,
/// each message id read back exactly once (fastavro, deltalake), peak RSS under the fixed
/// [`fixed_bound`].
fn within_the_limit(dir: &Path, input: &Path, count: usize, writers: &[Writer], what: &str) {
    let mut over = Vec::new();
    for &writer in writers {
        for limit_mib in [64u64, 256] {
            let r = sized_run_then(dir, input, writer, &format!("{limit_mib}MiB"), |out| {
                assert_every_id_once(writer, out, count)
            });
            let bound = fixed_bound(limit_mib, writer);
            eprintln!(
                "{what}, {writer:?}, --memory-limit {limit_mib}MiB: peak RSS {:.1} MiB = limit + \
                 {:.1} (bound {bound:.1} MiB = limit + {} at rest + {DYNAMIC_MIB}), {} \
                 written in {:.1} s",
                r.peak_mib,
                r.peak_mib - limit_mib as f64,
                rest_mib(writer),
                r.written,
                r.seconds
            );
            assert_eq!(
                r.written, count as u64,
                "{what}, {writer:?}, {limit_mib} MiB"
            );
            if r.peak_mib > bound {
                over.push(format!(
                    "{writer:?} at {limit_mib} MiB: {:.1} MiB > {bound:.1} MiB",
                    r.peak_mib
                ));
            }
        }
    }
    assert!(over.is_empty(), "{what}: peak RSS over the bound: {over:?}");
}

/// 20 × 9 MiB: the input is 240 MiB of base64, more than either limit.
#[test]
fn large_messages_stay_within_the_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let input = sized_input(dir.path(), LARGE_COUNT, LARGE_BYTES);
    within_the_limit(
        dir.path(),
        &input,
        LARGE_COUNT,
        &[Writer::Storage, Writer::Delta],
        "20 x 9 MiB",
    );
}

/// Many × 1 KiB.
#[test]
fn small_messages_stay_within_the_memory_limit() {
    let count = env_or("SUBSINK_MEMORY_SMALL", SMALL_DEFAULT);
    let dir = tempfile::tempdir().unwrap();
    let input = sized_input(dir.path(), count, SMALL_BYTES);
    within_the_limit(
        dir.path(),
        &input,
        count,
        &[Writer::Storage, Writer::Delta],
        &format!("{count} x 1 KiB"),
    );
}

/// The BigQuery table writer (the emulator, through the Storage Write API) on 20 × 9 MiB, limit
/// 64 MiB: every row in the table, whole, and peak RSS under the same bound.
#[test]
fn large_messages_into_bigquery_stay_within_the_memory_limit() {
    let _serial = util::bigquery::serial();
    let dir = tempfile::tempdir().unwrap();
    let input = sized_input(dir.path(), LARGE_COUNT, LARGE_BYTES);
    let before = bq_rows();
    let r = sized_run(dir.path(), &input, Writer::BigQuery, "64MiB");
    let bound = fixed_bound(64, Writer::BigQuery);
    eprintln!(
        "20 x 9 MiB, BigQuery, --memory-limit 64MiB: peak RSS {:.1} MiB = limit + {:.1} (bound \
         {bound:.1} MiB), {} written in {:.1} s",
        r.peak_mib,
        r.peak_mib - 64.0,
        r.written,
        r.seconds
    );
    assert_eq!(r.written, LARGE_COUNT as u64);
    let after = bq_rows();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (LARGE_COUNT as u64, (LARGE_COUNT * LARGE_BYTES) as u64),
        "every row in the table, whole"
    );
    assert!(
        r.peak_mib <= bound,
        "peak RSS {:.1} MiB over the bound {bound:.1} MiB",
        r.peak_mib
    );
}

/// A broker source: 20 × 9 MiB published to the Pub/Sub emulator and pulled by a worker into
/// Avro files with `--memory-limit 64MiB` ([`pubsub_run`]). Its peak RSS stays under
/// [`broker_bound`]: limit + at rest + [`DYNAMIC_MIB`] + the message the client is decoding (`M`,
/// 9 MiB) + the HTTP/2 window (`W`, 2 MiB) = 163 MiB, a formula written down before the runs
/// below (its terms: [`BROKER_MIB`]). It replaces a bound raised by one 9 MiB message after
/// failures (152 + 9 = 161 MiB).
///
/// The spread (issue 43): the run's own peak went from 129 to 155 MiB over runs of the same
/// input, measured alone. Sampled against the budget's own view during the run (the
/// `subsink::resources` trace: what the budget counts and the process's resident memory at each
/// report and charge), resident memory minus what the budget counts moved from 49 to 109 MiB
/// within one run, the process at rest being 68.7 MiB: below at rest when the budget counts
/// buffers by capacity whose pages are not touched yet, up to 40 MiB (four 9 MiB messages) above
/// it when memory the budget has released — files made durable, messages written — is still
/// resident (at `held=0 input=0` the process sat at 99–109 MiB); and the budget's own total
/// passed the limit by one message while the writers finalized a file (68 MiB counted at 64).
/// How much residue is left when the budget is full again decides the peak, from run to run.
/// Measured with this bound (debug build, this test alone, others building beside it): 137.0
/// (load 11.9), 127.9 (7.6), 155.3 (7.8), 136.4 MiB (8.5), 9–13 s each.
#[test]
fn large_messages_from_pubsub_stay_within_the_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let env = util::pubsub::PubsubEnv::start();
    let input = sized_input(dir.path(), LARGE_COUNT, LARGE_BYTES);
    let r = pubsub_run(dir.path(), &env, "large", &input, LARGE_COUNT, "64MiB");
    let bound = broker_bound(64);
    eprintln!(
        "20 x 9 MiB from Pub/Sub, storage, --memory-limit 64MiB: peak RSS {:.1} MiB = limit + \
         {:.1} (bound {bound:.1} MiB), {} written in {:.1} s",
        r.peak_mib,
        r.peak_mib - 64.0,
        r.written,
        r.seconds
    );
    // At least once: a message redelivered meanwhile is written again.
    assert!(r.written >= LARGE_COUNT as u64, "written {}", r.written);
    assert!(
        r.peak_mib <= bound,
        "peak RSS {:.1} MiB over the bound {bound:.1} MiB",
        r.peak_mib
    );
}

/// 20 × 9 MiB from Kafka or NATS at `--memory-limit 64MiB` ([`brokers::broker_run`]): every
/// message id read back once, and peak RSS under [`broker_bound`] (as from Pub/Sub).
fn large_messages_from(broker: brokers::Broker, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let input = sized_input(dir.path(), LARGE_COUNT, LARGE_BYTES);
    let r = brokers::broker_run(dir.path(), broker, name, &input, LARGE_COUNT, "64MiB");
    let bound = broker_bound(64);
    eprintln!(
        "20 x 9 MiB from {broker:?}, storage, --memory-limit 64MiB: peak RSS {:.1} MiB = limit + \
         {:.1} (bound {bound:.1} MiB), {} written in {:.1} s",
        r.peak_mib,
        r.peak_mib - 64.0,
        r.written,
        r.seconds
    );
    assert_eq!(r.written, LARGE_COUNT as u64);
    assert!(
        r.peak_mib <= bound,
        "{broker:?}: peak RSS {:.1} MiB over the bound {bound:.1} MiB",
        r.peak_mib
    );
}

/// Issue 43, point 3: librdkafka's read-ahead derived from the limit and charged, and the records
/// the source took charged until the pipeline takes them. (Before: 258 and 236 MiB here, 181–219 MiB in
/// the issue: librdkafka fetched ahead up to its 64 MiB queue and 50 MiB fetch whatever the
/// limit, and 16 chunks waited uncounted.) Measured: 137.3, 136.8, 136.3 MiB (load 6–7), 42–44 s
/// each, 23 s of it the group join on nisshi.
#[test]
fn large_messages_from_kafka_stay_within_the_memory_limit() {
    large_messages_from(brokers::Broker::Kafka, "large-kafka");
}

/// Issue 43, point 3: pulls by bytes, as the budget has room, and the chunks charged until the
/// pipeline takes them. (Before: 200 and 218 MiB here, 118–154 MiB in the issue: pulls bounded by
/// message count only.) Measured: 150.8, 150.3, 150.4, 150.4 MiB (load 3.4–3.6), 3 s each
/// (147.8–154.8 MiB at load 8–13 before a message larger than the room waited for the source to
/// hold nothing else; 171 MiB once, `wait4`, then).
#[test]
fn large_messages_from_nats_stay_within_the_memory_limit() {
    large_messages_from(brokers::Broker::Nats, "large-nats");
}

// ---------------------------------------------------------------------------------------------
// Issue 34, point 6: a line of 300 MiB in a file source.

/// Bytes of the garbage line (300 MiB, no newline in it).
const HUGE_LINE: u64 = 300 << 20;
/// The peak RSS a run on it may reach: the default line limit (14 MiB) is all of the line held,
/// at most, beside the worker at rest (55-62 MiB for a debug build).
const HUGE_LINE_BOUND_MIB: f64 = 100.0;

/// `good 1`, 300 MiB of `x` (not JSON), `good 3`, `good 4`, made 1 MiB at a time.
fn huge_line_input(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("events.ndjson");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let good = |id: &str| format!("{{\"data\":\"Z29vZA==\",\"messageId\":\"{id}\"}}\n");
    w.write_all(good("1").as_bytes()).unwrap();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..HUGE_LINE >> 20 {
        w.write_all(&chunk).unwrap();
    }
    w.write_all(b"\n").unwrap();
    w.write_all(good("3").as_bytes()).unwrap();
    w.write_all(good("4").as_bytes()).unwrap();
    w.flush().unwrap();
    path
}

/// A line far over `--max-line-bytes` is bad input named with file:line, its length and the
/// rule, and is passed over in bounded memory: under `fail` the run stops (exit 1), under `skip`
/// the lines after it are written (read back with fastavro). Peak RSS (wait4) stays under
/// [`HUGE_LINE_BOUND_MIB`] either way. (Before: the whole line was read into memory, 638 MiB RSS
/// for a release build, then "invalid JSON".)
#[test]
fn a_line_over_the_limit_is_bad_input_read_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let input = huge_line_input(dir.path());
    let rule = format!(
        "{}:2: {HUGE_LINE} bytes, over the 14 MiB line limit (--max-line-bytes)",
        input.display()
    );
    for mode in ["fail", "skip"] {
        let bucket = dir.path().join(format!("bucket-{mode}"));
        let log_path = dir.path().join(format!("log-{mode}"));
        let out_path = dir.path().join(format!("out-{mode}"));
        let own = own_peak_mib();
        // Reaped by `wait_rusage` (wait4), which also gives the peak RSS.
        #[allow(clippy::zombie_processes)]
        let child = storage_run_cmd("bkt", "avro")
            .args(["--cloud-storage-write-metadata", "--on-bad-input", mode])
            .arg("--bucket-url")
            .arg(format!("file://{}", bucket.display()))
            .arg("--source")
            .arg(&input)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        let (code, peak_kib) = wait_rusage(child.id());
        let peak_mib = peak_kib as f64 / 1024.0;
        let log = std::fs::read_to_string(&log_path).unwrap();
        eprintln!("a {HUGE_LINE}-byte line, --on-bad-input {mode}: exit {code}, peak RSS {peak_mib:.1} MiB");
        assert!(
            peak_mib > own,
            "the child's peak is this process's ({own:.1} MiB)"
        );
        assert!(
            peak_mib < HUGE_LINE_BOUND_MIB,
            "{mode}: peak RSS {peak_mib:.1} MiB, bound {HUGE_LINE_BOUND_MIB} MiB"
        );
        assert!(log.contains(&rule), "{mode}: {log}");
        let ids = message_ids(&avro_records(&objects_below(&bucket)));
        match mode {
            "fail" => {
                assert_eq!(code, 1, "{log}");
                assert!(ids.iter().all(|i| i == "1"), "{ids:?}");
            }
            _ => {
                assert_eq!(code, 0, "{log}");
                assert_eq!(ids, ["1", "3", "4"]);
                let out = std::fs::read_to_string(&out_path).unwrap();
                let s: serde_json::Value =
                    serde_json::from_str(out.lines().last().unwrap()).unwrap();
                assert_eq!(s["messages_written"], 3, "{s}");
                assert_eq!(s["bad_lines"], 1, "{s}");
            }
        }
    }
}
