//! What a new user trips on (issue 34): flags that would be ignored are refused, no local folder
//! is made up, the route is said at start and in the summary, a store without credentials fails
//! at once naming the chain, JSON logs stay JSON to the last line, and the messages for bad input
//! and empty replays say what to do. Every test runs the real binary in a folder of its own (its
//! working directory), so a folder it must not create is seen.

mod util;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use util::*;

fn example(name: &str) -> PathBuf {
    root().join("examples").join(name)
}

fn messages() -> PathBuf {
    root().join("fixtures/input/messages.ndjson")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The binary in `cwd`, with no store or cloud credentials inherited from the environment (HOME
/// is `cwd` too: no `~/.aws` files).
fn in_dir(cwd: &Path) -> Command {
    let mut c = subsink();
    c.current_dir(cwd).env("HOME", cwd);
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") || k.starts_with("AZURE_") || k.starts_with("GOOGLE_") {
            c.env_remove(k);
        }
    }
    c
}

/// `subsink run` of the example subscription `sub` on the fixture messages, in `cwd`.
fn run_example(cwd: &Path, sub: &str) -> Command {
    let mut c = in_dir(cwd);
    c.args(["run", "--subscription"])
        .arg(example(sub))
        .arg("--source")
        .arg(messages());
    c
}

fn exit_2_saying(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "expected exit 2:\n{err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
    assert!(out.stdout.is_empty(), "a refused run prints no summary");
}

/// Nothing was written in the working directory (no `buckets/`, `tables/`, `spool/`).
fn nothing_made_in(cwd: &Path) {
    let left: Vec<_> = std::fs::read_dir(cwd)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.is_empty(),
        "the run made {left:?} in its working directory"
    );
}

#[test]
fn a_gcloud_flag_with_a_subscription_file_is_refused_not_ignored() {
    let cwd = tempfile::tempdir().unwrap();
    let bucket = tempfile::tempdir().unwrap();
    for flag in [
        &["--cloud-storage-max-bytes", "100KB"][..],
        &["--cloud-storage-output-format", "parquet"][..],
        &["--write-metadata"][..],
        &["--topic", "projects/p/topics/t"][..],
    ] {
        let out = in_dir(cwd.path())
            .args(["run", "--subscription"])
            .arg(example("storage-avro.json"))
            .args(flag)
            .arg("--source")
            .arg(messages())
            .arg("--bucket-url")
            .arg(format!("file://{}", bucket.path().display()))
            .output()
            .unwrap();
        exit_2_saying(&out, &[flag[0], "--subscription"]);
        assert!(
            files_below(bucket.path()).is_empty(),
            "{flag:?}: wrote objects"
        );
        // validate refuses the same way.
        let out = in_dir(cwd.path())
            .args(["validate", "--subscription"])
            .arg(example("storage-avro.json"))
            .args(flag)
            .output()
            .unwrap();
        exit_2_saying(&out, &[flag[0]]);
    }
    nothing_made_in(cwd.path());
}

#[test]
fn a_destination_flag_of_the_other_kind_or_none_at_all_is_refused() {
    let cwd = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let url = format!("file://{}/x", elsewhere.path().display());
    let run =
        |sub: &str, extra: &[&str]| run_example(cwd.path(), sub).args(extra).output().unwrap();
    // A storage subscription: a table's flags, or no bucket.
    exit_2_saying(
        &run("storage-avro.json", &["--table-url", &url]),
        &["--table-url", "cloudStorageConfig", "--bucket-url"],
    );
    exit_2_saying(
        &run(
            "storage-avro.json",
            &["--bucket-url", &url, "--table-schema", "events.schema.json"],
        ),
        &["--table-schema", "cloudStorageConfig"],
    );
    exit_2_saying(
        &run("storage-avro.json", &[]),
        &["no --bucket-url", "demo-archive"],
    );
    // A table subscription: a bucket, or no table.
    exit_2_saying(
        &run("table-json.json", &["--bucket-url", &url]),
        &["--bucket-url", "bigqueryConfig", "--table-url"],
    );
    exit_2_saying(&run("table-json.json", &[]), &["no --table-url"]);
    // Publishing writes nothing: a bucket beside it is refused.
    exit_2_saying(
        &run(
            "storage-avro.json",
            &["--publish-to", "projects/p/topics/t", "--bucket-url", &url],
        ),
        &["--bucket-url", "--publish-to"],
    );
    nothing_made_in(cwd.path());
    assert!(files_below(elsewhere.path()).is_empty());
}

#[test]
fn serve_needs_a_template_and_makes_no_local_folder() {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = in_dir(cwd.path())
        .args(["serve", "--project", "p"])
        .env("PUBSUB_EMULATOR_HOST", format!("127.0.0.1:{}", free_port()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A serve that starts (the defect) would run until stopped: it gets 20 s to refuse.
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("serve without a template did not refuse to start within 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    exit_2_saying(
        &out,
        &[
            "--bucket-url-template",
            "--table-url-template",
            "serve does not write to a local folder",
        ],
    );
    nothing_made_in(cwd.path());
}

#[test]
fn the_route_is_logged_at_start_and_in_the_summary() {
    let cwd = tempfile::tempdir().unwrap();
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}/", bucket.path().display());
    let out = run_ok(
        in_dir(cwd.path())
            .env("SUBSINK_LOG", "subsink=info")
            .args(["run", "--subscription"])
            .arg(example("storage-avro.json"))
            .arg("--source")
            .arg(messages())
            .args(["--bucket-url", &url]),
    );
    let s = summary(&out);
    assert_eq!(s["source"], messages().display().to_string());
    assert_eq!(s["destination"], url);
    let err = stderr(&out);
    let said = format!("exporting {} → {url}", messages().display());
    assert_eq!(err.matches(&said).count(), 1, "{err}");
    // Read with a user and password in the URL: never shown.
    let out = in_dir(cwd.path())
        .env("SUBSINK_LOG", "subsink=info")
        .args(["run", "--subscription"])
        .arg(example("storage-avro.json"))
        .args([
            "--source",
            &format!("nats://alice:hunter2@127.0.0.1:{}", free_port()),
            "--nats-stream",
            "S",
            "--nats-consumer",
            "c",
            "--bucket-url",
            &url,
        ])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!err.contains("hunter2"), "{err}");
    assert!(err.contains("exporting nats://***@127.0.0.1:"), "{err}");
}

#[test]
fn s3_and_azure_without_credentials_fail_at_once_naming_the_chain() {
    let cwd = tempfile::tempdir().unwrap();
    // The metadata endpoints on a local port nobody listens on (never the real 169.254.169.254).
    let closed = format!("http://127.0.0.1:{}", free_port());
    for (url, env, needles) in [
        (
            "s3://archive",
            ("AWS_METADATA_ENDPOINT", closed.clone()),
            &[
                "no credentials for S3: tried static keys (AWS_ACCESS_KEY_ID",
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "instance metadata",
            ][..],
        ),
        (
            "az://archive",
            ("AZURE_MSI_ENDPOINT", format!("{closed}/token")),
            &[
                "no credentials for Azure Blob: tried the emulator",
                "AZURE_STORAGE_ACCOUNT_KEY",
                "managed identity",
            ][..],
        ),
    ] {
        let start = Instant::now();
        let mut c = in_dir(cwd.path());
        c.args(["run", "--subscription"])
            .arg(example("storage-avro.json"))
            .arg("--source")
            .arg(messages())
            .args(["--bucket-url", url])
            .env(env.0, &env.1);
        if url.starts_with("az") {
            c.env("AZURE_STORAGE_ACCOUNT_NAME", "acct");
        }
        let out = c.output().unwrap();
        let took = start.elapsed();
        exit_2_saying(&out, needles);
        assert!(took < Duration::from_secs(10), "{url}: took {took:?}");
    }
    // AWS_EC2_METADATA_DISABLED skips the probe: the same refusal, without a connection.
    let out = run_example(cwd.path(), "storage-avro.json")
        .args(["--bucket-url", "s3://archive"])
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .unwrap();
    exit_2_saying(
        &out,
        &["no credentials for S3", "AWS_EC2_METADATA_DISABLED is set"],
    );
}

#[test]
fn the_credential_source_picked_is_logged_by_name_never_by_value() {
    let s3 = S3Server::start();
    s3.create_bucket("picked");
    let cwd = tempfile::tempdir().unwrap();
    let out = run_ok(
        in_dir(cwd.path())
            .envs(s3.env())
            .env("SUBSINK_LOG", "subsink=info")
            .args(["run", "--subscription"])
            .arg(example("storage-avro.json"))
            .arg("--source")
            .arg(messages())
            .args(["--bucket-url", "s3://picked"]),
    );
    let err = stderr(&out);
    assert!(
        err.contains("static keys (AWS_ACCESS_KEY_ID)"),
        "the credential source is not logged:\n{err}"
    );
    assert!(!err.contains("testtesttest"), "a secret in the log:\n{err}");
    assert_eq!(summary(&out)["messages_written"], 10);
}

/// Every stderr line of `out`, parsed as JSON (each must be).
fn json_lines(out: &Output) -> Vec<Value> {
    stderr(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn json_logs_stay_json_to_the_final_error_with_file_and_line() {
    let cwd = tempfile::tempdir().unwrap();
    let bucket = tempfile::tempdir().unwrap();
    let input = cwd.path().join("in.ndjson");
    let good = std::fs::read_to_string(messages()).unwrap();
    let first = good.lines().next().unwrap();
    std::fs::write(&input, format!("{first}\n{{not json\n{first}\n")).unwrap();
    let out = in_dir(cwd.path())
        .env("SUBSINK_LOG", "subsink=info")
        .args(["--log-format", "json", "run", "--subscription"])
        .arg(example("storage-avro.json"))
        .arg("--source")
        .arg(&input)
        .arg("--bucket-url")
        .arg(format!("file://{}", bucket.path().display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let lines = json_lines(&out);
    let file = input.display().to_string();
    // The bad line's own log line and the final error both carry the place as fields.
    let placed: Vec<&Value> = lines
        .iter()
        .filter(|l| l["level"] == "ERROR" && l["line"] == 2 && l["file"] == file.as_str())
        .collect();
    assert!(placed.len() >= 2, "{lines:#?}");
    let last = lines.last().unwrap();
    assert_eq!(last["level"], "ERROR");
    let msg = last["message"].as_str().unwrap();
    assert!(msg.starts_with("stopped: "), "{msg}");
    assert!(
        msg.contains("--on-bad-input skip"),
        "no way out named: {msg}"
    );
    assert!(msg.contains("--checkpoint"), "{msg}");
    // A flag clap refuses is a JSON line too, exit 2.
    let out = in_dir(cwd.path())
        .args(["--log-format", "json", "run", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["level"], "ERROR");
    assert!(lines[0]["message"]
        .as_str()
        .unwrap()
        .contains("--no-such-flag"));
}

#[test]
fn a_rerun_without_checkpoint_is_warned_of() {
    let cwd = tempfile::tempdir().unwrap();
    let table = cwd.path().join("t");
    let out = run_ok(
        in_dir(cwd.path())
            .args(["run", "--subscription"])
            .arg(example("table-json.json"))
            .arg("--source")
            .arg(root().join("fixtures/table.ndjson"))
            .arg("--table-url")
            .arg(format!("file://{}", table.display()))
            .arg("--table-schema")
            .arg(example("events.schema.json")),
    );
    let err = stderr(&out);
    assert!(
        err.contains("no --checkpoint: a rerun on")
            && err.contains("appends every row to the table again"),
        "{err}"
    );
    let out = run_ok(
        in_dir(cwd.path())
            .args(["run", "--subscription"])
            .arg(example("table-json.json"))
            .arg("--source")
            .arg(root().join("fixtures/table.ndjson"))
            .arg("--checkpoint")
            .arg(cwd.path().join("cp.json"))
            .arg("--table-url")
            .arg(format!("file://{}", cwd.path().join("t2").display()))
            .arg("--table-schema")
            .arg(example("events.schema.json")),
    );
    assert!(
        !stderr(&out).contains("no --checkpoint"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_replay_that_matches_nothing_says_why() {
    let cwd = tempfile::tempdir().unwrap();
    let archive = tempfile::tempdir().unwrap();
    let out_bucket = tempfile::tempdir().unwrap();
    let replay = |extra: &[&str]| {
        in_dir(cwd.path())
            .args(["run", "--subscription"])
            .arg(example("storage-avro.json"))
            .arg("--source")
            .arg(format!("file://{}", archive.path().display()))
            .arg("--bucket-url")
            .arg(format!("file://{}", out_bucket.path().display()))
            .args(extra)
            .output()
            .unwrap()
    };
    let out = replay(&[]);
    let err = stderr(&out);
    assert!(
        err.contains("archive replay matches no object: no object is under it"),
        "{err}"
    );
    std::fs::write(archive.path().join("notes.txt"), "x").unwrap();
    let out = replay(&[]);
    let err = stderr(&out);
    assert!(
        err.contains("1 objects listed, none to replay: 1 not named as this subscription's export"),
        "{err}"
    );
    assert!(err.contains("notes.txt"), "{err}");
    assert_eq!(summary(&out)["messages_read"], 0);
}

#[test]
fn help_lists_values_and_defaults() {
    let out = run_ok(subsink().args(["run", "--help"]));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "[possible values: null, deflate, snappy, zstd, zstandard]",
        "[default: 5m]",
        "s3://BUCKET[/PREFIX]",
    ] {
        assert!(help.contains(needle), "run --help lacks {needle:?}");
    }
    let out = subsink()
        .args(["run", "--avro-codec", "gzip"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("null, deflate, snappy, zstd"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_missing_pubsub_subscription_exits_2_with_one_message() {
    let emulator = util::emulator::Emulator::start();
    let cwd = tempfile::tempdir().unwrap();
    let bucket = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let out = in_dir(cwd.path())
        .env("PUBSUB_EMULATOR_HOST", emulator.host())
        .args(["run", "--subscription"])
        .arg(example("storage-avro.json"))
        .args(["--source", "pubsub", "--bucket-url"])
        .arg(format!("file://{}", bucket.path().display()))
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one message, not a retry log:\n{err}");
    assert!(
        lines[0].contains(
            "Pub/Sub subscription projects/demo-project/subscriptions/archive-avro does not exist"
        ),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(files_below(bucket.path()).is_empty());
}

/// Issue 44, point 10: a no-schema table subscription (no `--table-schema`) gets its `data` and
/// metadata columns added on every run; that is said in one INFO line naming them, not a WARN
/// line per column.
#[test]
fn the_columns_a_schemaless_table_gets_are_one_info_line() {
    let cwd = tempfile::tempdir().unwrap();
    let sub = cwd.path().join("sub.json");
    std::fs::write(
        &sub,
        r#"{"name": "projects/proj/subscriptions/sub", "topic": "projects/proj/topics/top",
            "bigqueryConfig": {"table": "proj.data.events", "writeMetadata": true}}"#,
    )
    .unwrap();
    let table = cwd.path().join("t");
    let run = |log: &str| {
        run_ok(
            in_dir(cwd.path())
                .env("SUBSINK_LOG", log)
                .args(["run", "--subscription"])
                .arg(&sub)
                .arg("--source")
                .arg(root().join("fixtures/table.ndjson"))
                .arg("--checkpoint")
                .arg(cwd.path().join(format!("cp-{}.json", log.len())))
                .arg("--table-url")
                .arg(format!("file://{}", table.display())),
        )
    };
    let out = run("warn");
    assert_eq!(stderr(&out), "", "a run that went well warns of nothing");
    let out = run("subsink=info");
    let err = stderr(&out);
    assert!(!err.contains(" WARN "), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("NULLABLE")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(" INFO "), "{}", lines[0]);
    assert!(
        lines[0].contains(
            "the table schema lacks columns subsink writes; it adds them as NULLABLE: `data` \
             BYTES (no-schema mode writes the payload there); `subscription_name` STRING, \
             `message_id` STRING, `publish_time` TIMESTAMP, `attributes` STRING (writeMetadata)"
        ),
        "{}",
        lines[0]
    );
}

/// The first shell command in `doc`'s code blocks (continuation lines joined) that holds every
/// one of `needles`, as its words.
fn doc_command(doc: &str, needles: &[&str]) -> Vec<String> {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    let mut command = String::new();
    for line in text.lines() {
        command.push_str(line.trim_end_matches('\\'));
        command.push(' ');
        if line.ends_with('\\') {
            continue;
        }
        if needles.iter().all(|n| command.contains(n)) {
            return command
                .split_whitespace()
                .map(|w| w.trim_matches('\'').to_string())
                .collect();
        }
        command.clear();
    }
    panic!("{doc} has no command with {needles:?}");
}

/// A documented `run` command run in `cwd`, its `/tmp/` paths moved below `tmp`, with
/// `--checkpoint` (so a refusal is the only line on stderr) and `extra` flags.
fn run_documented(cwd: &Path, tmp: &Path, words: &[String], extra: &[&str]) -> Output {
    // `subsink run …` or `cargo run --release -- run …`.
    let at = match words.iter().position(|w| w == "--") {
        Some(dashes) => dashes + 1,
        None => words.iter().position(|w| w == "subsink").unwrap() + 1,
    };
    let mut c = in_dir(cwd);
    for w in &words[at..] {
        let w = w.replace("file:///tmp/", &format!("file://{}/", tmp.display()));
        c.arg(
            match w.starts_with("examples/") || w.starts_with("fixtures/") {
                true => root().join(&w).display().to_string(),
                false => w,
            },
        );
    }
    let n = std::fs::read_dir(tmp).unwrap().count();
    c.arg("--checkpoint")
        .arg(tmp.join(format!("checkpoint-{n}.json")))
        .args(extra);
    c.output().unwrap()
}

fn table_url(words: &[String]) -> String {
    let at = words.iter().position(|w| w == "--table-url").unwrap();
    words[at + 1].clone()
}

/// Issue 44, point 2: the README's Delta example and docs/destinations.md's partition example,
/// run one after the other as written, both succeed (their own tables); the partition flag
/// against the README's table, and the README's flags against the partitioned one, exit 2 with
/// one line naming the partitioning on both sides — not a dump of two schemas and exit 1.
#[test]
fn a_partitioning_the_table_lacks_exits_2_with_one_line() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let delta = doc_command("README.md", &["examples/table-json.json", "--table-url"]);
    let by_day = doc_command(
        "docs/destinations.md",
        &["--table-partition-by", "DAY(_PARTITIONTIME)"],
    );
    assert_ne!(
        table_url(&delta),
        table_url(&by_day),
        "the examples share a table"
    );
    for words in [&delta, &by_day] {
        let out = run_documented(cwd.path(), tmp.path(), words, &[]);
        assert_eq!(out.status.code(), Some(0), "{words:?}: {}", stderr(&out));
    }
    let events = format!("file://{}/warehouse/events", tmp.path().display());
    let out = run_documented(
        cwd.path(),
        tmp.path(),
        &delta,
        &["--table-partition-by", "DAY(_PARTITIONTIME)"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!("error: Delta table at {events}: partitions: the table is partitioned by [] (unpartitioned), the configured partitioning (DAY(_PARTITIONTIME)) makes [_PARTITIONDATE]; a table keeps the partitioning it was created with: write to a new table, or give no partitioning to write with the table's\n")
    );
    assert!(out.stdout.is_empty());
    let by_day_url =
        table_url(&by_day).replace("file:///tmp/", &format!("file://{}/", tmp.path().display()));
    let words: Vec<String> = by_day
        .iter()
        .take_while(|w| *w != "--table-partition-by")
        .cloned()
        .collect();
    let out = run_documented(cwd.path(), tmp.path(), &words, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!("error: Delta table at {by_day_url}: partitions: the table is partitioned by [_PARTITIONDATE], and subsink would write no _PARTITIONDATE column: a time partitioning's derived column; give it with --table-partition-by (e.g. DAY(column)) or the table resource's timePartitioning\n")
    );
    nothing_made_in(cwd.path());
}

/// Issue 44, point 2: change data capture turned on for a table written without a primary key
/// (so without `_CHANGE_SEQUENCE_NUMBER`), and a column of another type: exit 2, one line
/// naming the column, the table's side and subsink's.
#[test]
fn a_column_the_table_lacks_or_types_otherwise_exits_2_with_one_line() {
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cdc = doc_command("README.md", &["examples/table-changes.json", "--table-url"]);
    // First without the key: the README's table resource without its tableConstraints, the
    // change pseudo-columns dropped as unknown fields.
    let mut resource: Value =
        serde_json::from_str(&std::fs::read_to_string(example("customers.table.json")).unwrap())
            .unwrap();
    resource.as_object_mut().unwrap().remove("tableConstraints");
    let plain = tmp.path().join("plain.table.json");
    std::fs::write(&plain, resource.to_string()).unwrap();
    let mut sub: Value =
        serde_json::from_str(&std::fs::read_to_string(example("table-changes.json")).unwrap())
            .unwrap();
    sub["bigqueryConfig"]["dropUnknownFields"] = Value::Bool(true);
    let sub_file = tmp.path().join("sub.json");
    std::fs::write(&sub_file, sub.to_string()).unwrap();
    let no_key: Vec<String> = cdc
        .iter()
        .map(|w| match w.as_str() {
            "examples/table-changes.json" => sub_file.display().to_string(),
            "examples/customers.table.json" => plain.display().to_string(),
            _ => w.clone(),
        })
        .collect();
    let out = run_documented(cwd.path(), tmp.path(), &no_key, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let customers = format!("file://{}/warehouse/customers", tmp.path().display());
    let out = run_documented(cwd.path(), tmp.path(), &cdc, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!("error: Delta table at {customers}: its schema differs from what subsink would write: column `_CHANGE_SEQUENCE_NUMBER` is not in the table, subsink would write it as string: change data capture keeps each row's sequence number there, which a table made without a primary key lacks; write the changes to a new table\n")
    );
    // `tier` as an INTEGER where the table holds strings.
    resource["schema"]["fields"][2]["type"] = Value::from("INTEGER");
    std::fs::write(&plain, resource.to_string()).unwrap();
    let out = run_documented(cwd.path(), tmp.path(), &no_key, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!("error: Delta table at {customers}: its schema differs from what subsink would write: column `tier` is string in the table, subsink would write long\n")
    );
    nothing_made_in(cwd.path());
}

/// Issue 44, point 9: every flag from its `SUBSINK_<FLAG>` variable, as a container is
/// configured — a variable takes effect, the command line wins over it, a global flag's
/// variable works before any subcommand, a bad value names the variable, and help names the
/// variable but never shows its value.
#[test]
fn a_flag_from_its_environment_variable_and_the_command_line_over_it() {
    let cwd = tempfile::tempdir().unwrap();
    let (env_bucket, flag_bucket) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env_url = format!("file://{}", env_bucket.path().display());
    let out = run_example(cwd.path(), "storage-avro.json")
        .env("SUBSINK_BUCKET_URL", &env_url)
        .env("SUBSINK_LOG_FORMAT", "json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(summary(&out)["destination"], env_url.as_str());
    assert_eq!(files_below(env_bucket.path()).len(), 1);
    // The rerun warning, as JSON: SUBSINK_LOG_FORMAT took effect too.
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{}", stderr(&out));
    assert_eq!(lines[0]["level"], "WARN");

    let flag_url = format!("file://{}", flag_bucket.path().display());
    let out = run_example(cwd.path(), "storage-avro.json")
        .env("SUBSINK_BUCKET_URL", &env_url)
        .env("SUBSINK_LOG_FORMAT", "json")
        .args(["--bucket-url", &flag_url, "--log-format", "text"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(summary(&out)["destination"], flag_url.as_str());
    assert_eq!(files_below(flag_bucket.path()).len(), 1);
    assert_eq!(
        files_below(env_bucket.path()).len(),
        1,
        "nothing more from the variable"
    );
    assert!(
        stderr(&out).contains(" WARN "),
        "text logs: {}",
        stderr(&out)
    );

    let out = run_example(cwd.path(), "storage-avro.json")
        .env("SUBSINK_BUCKET_URL", &env_url)
        .env("SUBSINK_MAX_CONCURRENT_UPLOADS", "several")
        .output()
        .unwrap();
    exit_2_saying(
        &out,
        &["invalid value 'several' for '--max-concurrent-uploads <MAX_CONCURRENT_UPLOADS>': invalid digit found in string (from SUBSINK_MAX_CONCURRENT_UPLOADS)"],
    );

    let out = run_ok(
        in_dir(cwd.path())
            .env("SUBSINK_KAFKA_OPTION", "sasl.password=hunter2")
            .args(["run", "--help"]),
    );
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("[env: SUBSINK_KAFKA_OPTION]"), "{help}");
    assert!(help.contains("[env: SUBSINK_TABLE_URL]"), "{help}");
    assert!(!help.contains("hunter2"), "a variable's value in help");
    nothing_made_in(cwd.path());
}

/// Issue 44, point 10: the README's Delta example fed as a stream (stdin kept open, one
/// message): the row is readable by the `deltalake` package within the table writer's default
/// flush, 10 s (`subsink.table.maxDuration`), plus the commit — not after 60 s.
#[test]
fn a_streamed_first_row_is_readable_within_the_default_flush() {
    use std::io::Write;
    const DEFAULT_FLUSH: Duration = Duration::from_secs(10);
    let cwd = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let words = doc_command("README.md", &["examples/table-json.json", "--table-url"]);
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(example("table-json.json")).unwrap())
            .unwrap();
    assert_eq!(
        config["subsink"]["table"]["maxDuration"],
        Value::Null,
        "the default applies"
    );
    let at = words.iter().position(|w| w == "--").unwrap() + 1;
    let mut c = in_dir(cwd.path());
    let mut source = false;
    for w in &words[at..] {
        let w = w.replace("file:///tmp/", &format!("file://{}/", tmp.path().display()));
        c.arg(match (source, w.starts_with("examples/")) {
            (true, _) => "-".to_string(),
            (false, true) => root().join(&w).display().to_string(),
            (false, false) => w.clone(),
        });
        source = w == "--source";
    }
    let mut child = c
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let table = tmp.path().join("warehouse/events");
    let first = std::fs::read_to_string(root().join("fixtures/table.ndjson")).unwrap();
    let first = first.lines().next().unwrap().to_string();
    let id = serde_json::from_str::<Value>(&first).unwrap()["messageId"].clone();
    // The table is created at start (version 0); the row's commit is version 1.
    poll(Duration::from_secs(30), Duration::from_millis(50), || {
        table
            .join("_delta_log/00000000000000000000.json")
            .exists()
            .then_some(())
            .ok_or("no table".to_string())
    });
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{first}").unwrap();
    stdin.flush().unwrap();
    let sent = Instant::now();
    let commit = table.join("_delta_log/00000000000000000001.json");
    while !commit.exists() && sent.elapsed() < DEFAULT_FLUSH + Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = sent.elapsed();
    assert!(commit.exists(), "no commit {took:?} after the first row");
    assert!(
        took >= DEFAULT_FLUSH - Duration::from_millis(500),
        "committed after {took:?}"
    );
    let rows = python_json(
        "import json, os, sys, deltalake\n\
         t = deltalake.DeltaTable(sys.argv[1]).to_pyarrow_table()\n\
         print(json.dumps(t.column('message_id').to_pylist()))\n\
         sys.stdout.flush()\n\
         os._exit(0)",
        &table.display().to_string(),
        &[],
    );
    assert_eq!(
        rows,
        serde_json::json!([id]),
        "readable {took:?} after it was sent"
    );
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// The gcloud-style flags of a storage subscription (no config file).
const GCLOUD: [&str; 6] = [
    "--subscription-name",
    "projects/proj/subscriptions/sub",
    "--topic",
    "projects/proj/topics/top",
    "--cloud-storage-bucket",
    "bkt",
];

/// Issue 44, point 1: a typo in an input line lost the attributes and the message id, exit 0.
/// An unknown field is a bad line naming file:line, the field and the nearest known name; the
/// snake_case spellings the docs accept are read; under `skip` the line is counted and the rest
/// written.
#[test]
fn an_unknown_field_in_an_input_line_is_bad_input_naming_the_nearest_field() {
    let cwd = tempfile::tempdir().unwrap();
    let input = cwd.path().join("m.ndjson");
    std::fs::write(
        &input,
        concat!(
            r#"{"data":"aGk=","attributes":{"k":"v"},"message_id":"ok-1","publish_time":"2021-02-26T19:13:55Z","ordering_key":"o"}"#,
            "\n",
            r#"{"data":"aGk=","atributes":{"k":"v"},"messageID":"typo-1"}"#,
            "\n",
        ),
    )
    .unwrap();
    let bucket = cwd.path().join("bucket");
    let run = |extra: &[&str]| {
        in_dir(cwd.path())
            .arg("run")
            .args(GCLOUD)
            .args(["--source", "m.ndjson", "--bucket-url"])
            .arg(format!("file://{}", bucket.display()))
            .args(extra)
            .output()
            .unwrap()
    };
    let want = "m.ndjson:2: field `atributes`: unknown field, did you mean `attributes`? \
                (a PubsubMessage has data, attributes, messageId, publishTime, orderingKey; \
                Pub/Sub refuses unknown fields)";
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(want), "{}", stderr(&out));
    let out = run_ok(&mut {
        let mut c = in_dir(cwd.path());
        c.arg("run")
            .args(GCLOUD)
            .args([
                "--source",
                "m.ndjson",
                "--on-bad-input",
                "skip",
                "--bucket-url",
            ])
            .arg(format!("file://{}", cwd.path().join("skipped").display()));
        c
    });
    assert!(stderr(&out).contains(want), "{}", stderr(&out));
    let s = summary(&out);
    assert_eq!(
        (s["messages_written"].as_u64(), s["bad_lines"].as_u64()),
        (Some(1), Some(1)),
        "{s}"
    );
}

/// Issue 44, point 4: `--source file:///abs/file` failed with "File exists (os error 17)" (it was
/// taken for an archive folder); it reads the file. A plain path as `--bucket-url` said
/// "relative URL without a base"; it is refused with the `file://` URL to write.
#[test]
fn a_file_url_source_reads_the_file_and_a_plain_bucket_path_names_its_url() {
    let cwd = tempfile::tempdir().unwrap();
    let bucket = cwd.path().join("bucket");
    let out = run_ok(
        in_dir(cwd.path())
            .arg("run")
            .args(GCLOUD)
            .arg("--source")
            .arg(format!("file://{}", messages().display()))
            .arg("--bucket-url")
            .arg(format!("file://{}", bucket.display())),
    );
    let s = summary(&out);
    assert_eq!(s["messages_written"], 10, "{s}");
    assert_eq!(s["source"], messages().display().to_string(), "{s}");
    for (given, url) in [
        (
            bucket.display().to_string(),
            format!("file://{}", bucket.display()),
        ),
        (
            "out/x".to_string(),
            format!("file://{}/out/x", cwd.path().display()),
        ),
    ] {
        let out = run_example(cwd.path(), "storage-avro.json")
            .args(["--bucket-url", &given])
            .output()
            .unwrap();
        exit_2_saying(
            &out,
            &[&format!(
                "bucket URL {given:?}: a plain path, not a URL: a local folder is written as a \
                 file:// URL, here {url}"
            )],
        );
    }
    assert!(!cwd.path().join("out").exists());
    // A file:// URL of nothing (a typo) was an empty archive folder made and read: exit 0.
    let typo = cwd.path().join("mesages.ndjson");
    let out = in_dir(cwd.path())
        .arg("run")
        .args(GCLOUD)
        .arg("--source")
        .arg(format!("file://{}", typo.display()))
        .arg("--bucket-url")
        .arg(format!("file://{}", bucket.display()))
        .output()
        .unwrap();
    exit_2_saying(
        &out,
        &[&format!(
            "--source file://{}: no such file or folder (a file:// URL names an NDJSON file to \
             read or an archive folder to replay)",
            typo.display()
        )],
    );
    assert!(!typo.exists());
}

/// Issue 44, point 5 (1/4): `--table-partition-by` beside `--bucket-url` said "give
/// --bucket-url instead"; it says the flag is a table's, to drop.
#[test]
fn a_table_flag_beside_a_bucket_url_is_named_as_the_one_to_drop() {
    let cwd = tempfile::tempdir().unwrap();
    let url = format!("file://{}/b", cwd.path().display());
    let out = run_example(cwd.path(), "storage-avro.json")
        .args([
            "--bucket-url",
            &url,
            "--table-partition-by",
            "DAY(publish_time)",
        ])
        .output()
        .unwrap();
    exit_2_saying(
        &out,
        &["--table-partition-by DAY(publish_time): subscription projects/demo-project/subscriptions/archive-avro has a cloudStorageConfig, whose messages go to objects in a bucket: --table-partition-by is for a table (a bigqueryConfig): drop it"],
    );
    assert!(
        !stderr(&out).contains("give --bucket-url"),
        "{}",
        stderr(&out)
    );
    nothing_made_in(cwd.path());
}

/// Issue 44, point 5 (2/4): `validate --table-partition-by` without a schema talked about
/// `--topic-schema`; it names the flag given.
#[test]
fn validate_names_the_table_flag_given_when_the_schema_is_missing() {
    let cwd = tempfile::tempdir().unwrap();
    let out = in_dir(cwd.path())
        .args(["validate", "--subscription"])
        .arg(example("table-json.json"))
        .args(["--table-partition-by", "DAY(publish_time)"])
        .output()
        .unwrap();
    exit_2_saying(
        &out,
        &["--table-partition-by: checked against the table's columns: give the table's schema with --table-schema too"],
    );
    assert!(!stderr(&out).contains("--topic-schema"), "{}", stderr(&out));
}

/// Issue 44, point 5 (3/4): `run` with no arguments named only `--subscription-name`; it names
/// `--subscription FILE` too.
#[test]
fn run_without_a_subscription_names_both_ways_to_give_one() {
    let cwd = tempfile::tempdir().unwrap();
    let out = in_dir(cwd.path()).arg("run").output().unwrap();
    exit_2_saying(
        &out,
        &[
            "--subscription-name: required: projects/{project}/subscriptions/{subscription}, with --topic and --cloud-storage-bucket or --bigquery-table",
            "or the whole subscription with --subscription FILE (JSON or YAML",
        ],
    );
    nothing_made_in(cwd.path());
}

/// Issue 44, point 5 (4/4): with the gcloud-style flags a `maxDuration` past Pub/Sub's limit
/// suggested a config-file snippet; it names `--limits extended`, which works.
#[test]
fn a_limit_broken_by_a_gcloud_flag_names_the_flag_that_lifts_it() {
    let cwd = tempfile::tempdir().unwrap();
    let out = in_dir(cwd.path())
        .arg("validate")
        .args(GCLOUD)
        .args(["--cloud-storage-max-duration", "20m"])
        .output()
        .unwrap();
    exit_2_saying(
        &out,
        &["cloudStorageConfig.maxDuration: must be between 60s and 600s (1 to 10 minutes), got 1200s (--limits extended lifts Pub/Sub's limits)"],
    );
    assert!(!stderr(&out).contains("\"subsink\""), "{}", stderr(&out));
    let out = in_dir(cwd.path())
        .arg("validate")
        .args(GCLOUD)
        .args([
            "--cloud-storage-max-duration",
            "20m",
            "--limits",
            "extended",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    nothing_made_in(cwd.path());
}
