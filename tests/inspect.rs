//! `subsink inspect` on a folder, a bucket or a prefix (issue 34, point 5): it lists the objects
//! and tables below, one NDJSON line each with its size, in name order, and exits 0; a name that
//! is neither an object nor a prefix holding objects is an error naming it, exit 1. Before, a
//! bucket's URL printed S3's own listing (XML) as Text records, a prefix failed on a missing key
//! and a local folder that is not a Delta table was refused. On a local folder, moto and
//! SeaweedFS; sizes compared with the file system's and boto3's own listing.

mod util;

use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};
use util::*;

/// `subsink inspect` with `args` and `env`; its output (any exit).
fn inspect(args: &[&str], env: &[(&'static str, String)]) -> Output {
    subsink()
        .arg("inspect")
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap()
}

/// The NDJSON lines of an inspect that must exit 0.
fn lines(out: Output) -> Vec<Value> {
    let out = exited_ok(out);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// An inspect that must fail with exit 1 saying there is nothing at `what`.
fn assert_nothing(out: Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    assert!(out.stdout.is_empty(), "{what}: printed {:?}", out.stdout);
    assert!(
        err.contains(&format!(
            "{what}: neither an object nor a prefix (or folder) holding objects"
        )),
        "{err}"
    );
}

/// Five messages of text, two per object: three objects under `events/`.
fn input(dir: &Path) -> std::path::PathBuf {
    let input = dir.join("in.ndjson");
    let msgs: Vec<_> = (0..5).map(|i| numbered_message(i, 16)).collect();
    write_lines(&input, &msgs);
    input
}

/// Write the five messages as Text objects under `events/` of `bucket_url`, and a Delta table of
/// them at `table_url`.
fn write_objects_and_a_table(
    dir: &Path,
    bucket_url: &str,
    table_url: &str,
    env: &[(&'static str, String)],
) {
    let input = input(dir);
    run_ok(
        storage_run_cmd("bkt", "text")
            .args(["--cloud-storage-max-messages", "2"])
            .args(["--cloud-storage-file-prefix", "events/"])
            .args(["--bucket-url", bucket_url, "--source"])
            .arg(&input)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
    );
    let sub = dir.join("table.json");
    std::fs::write(
        &sub,
        json!({
            "name": "projects/proj/subscriptions/raw",
            "topic": "projects/proj/topics/events",
            "bigqueryConfig": {"table": "proj.ds.raw", "writeMetadata": true},
        })
        .to_string(),
    )
    .unwrap();
    let schema = dir.join("schema.json");
    std::fs::write(&schema, r#"[{"name": "data", "type": "BYTES"}]"#).unwrap();
    run_ok(
        subsink()
            .args(["run", "--subscription"])
            .arg(&sub)
            .arg("--source")
            .arg(&input)
            .arg("--table-schema")
            .arg(&schema)
            .args(["--table-url", table_url])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
    );
}

/// What inspect must list for `objects` (`(name relative to the listed place, size)`, every
/// object below it), with `url` making a name a location: one line per object outside
/// `table_root`, one for the table.
fn expected(objects: &[(String, u64)], table_root: &str, url: &dyn Fn(&str) -> String) -> Value {
    let in_table: Vec<_> = objects
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{table_root}/")))
        .collect();
    assert!(
        in_table.iter().any(|(k, _)| k.contains("/_delta_log/")),
        "{objects:?}"
    );
    let mut want: Vec<(String, Value)> = objects
        .iter()
        .filter(|(k, _)| !k.starts_with(&format!("{table_root}/")))
        .map(|(k, size)| (k.clone(), json!({"object": k, "size": size, "url": url(k)})))
        .collect();
    want.push((
        table_root.to_string(),
        json!({
            "table": table_root,
            "format": "delta",
            "objects": in_table.len(),
            "size": in_table.iter().map(|(_, s)| s).sum::<u64>(),
            "url": url(table_root),
        }),
    ));
    want.sort_by(|a, b| a.0.cmp(&b.0));
    Value::Array(want.into_iter().map(|(_, v)| v).collect())
}

/// The listed lines without `last_modified` (checked for form here: RFC 3339 UTC, seconds).
fn without_times(got: Vec<Value>) -> Value {
    Value::Array(
        got.into_iter()
            .map(|mut v| {
                if v.get("object").is_some() {
                    let t = v["last_modified"].as_str().unwrap_or_else(|| panic!("{v}"));
                    assert!(
                        chrono::DateTime::parse_from_rfc3339(t).is_ok() && t.ends_with('Z'),
                        "{v}"
                    );
                    v.as_object_mut().unwrap().remove("last_modified");
                }
                v
            })
            .collect(),
    )
}

#[test]
fn inspect_lists_a_local_folder_that_is_not_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    write_objects_and_a_table(
        dir.path(),
        &format!("file://{}", bucket.display()),
        &format!("file://{}", bucket.join("lake/t").display()),
        &[],
    );
    // A crashed writer's staging file: not an object, not listed.
    plant_dead_writers_staging(&bucket);
    let objects: Vec<(String, u64)> = files_below(&bucket)
        .into_iter()
        .filter(|f| !f.starts_with(".subsink-staging/"))
        .map(|f| {
            let size = std::fs::metadata(bucket.join(&f)).unwrap().len();
            (f, size)
        })
        .collect();
    assert_eq!(
        objects
            .iter()
            .filter(|(k, _)| k.starts_with("events/"))
            .count(),
        3
    );
    let base = bucket.to_str().unwrap().to_string();
    let url = |name: &str| format!("{base}/{name}");
    let want = expected(&objects, "lake/t", &url);
    let got = lines(inspect(&[&base], &[]));
    assert_eq!(without_times(got), want);
    // A trailing slash and a file:// URL list the same, with URLs of their own form.
    let got = lines(inspect(&[&format!("{base}/")], &[]));
    assert_eq!(without_times(got), want);
    let file_url = format!("file://{base}");
    let got = lines(inspect(&[&file_url], &[]));
    let furl = |name: &str| format!("{file_url}/{name}");
    assert_eq!(without_times(got), expected(&objects, "lake/t", &furl));

    // Each listed URL inspects: the three objects hold the five messages, so does the table.
    let listed = lines(inspect(&[&base], &[]));
    let mut records = 0;
    for l in listed.iter().filter(|l| l.get("object").is_some()) {
        records += lines(inspect(&[l["url"].as_str().unwrap()], &[])).len();
    }
    assert_eq!(records, 5);
    let table = listed.iter().find(|l| l.get("table").is_some()).unwrap();
    assert_eq!(
        lines(inspect(&[table["url"].as_str().unwrap()], &[])).len(),
        5
    );

    // A subfolder: names relative to it.
    let events = format!("{base}/events");
    let got = lines(inspect(&[&events], &[]));
    let names: Vec<_> = got.iter().map(|l| l["object"].clone()).collect();
    let want: Vec<Value> = objects
        .iter()
        .filter_map(|(k, _)| k.strip_prefix("events/").map(|n| json!(n)))
        .collect();
    assert_eq!(names, want);

    let s = lines(inspect(&[&base, "--summary"], &[]));
    let total: u64 = objects.iter().map(|(_, s)| s).sum();
    assert_eq!(
        s,
        [json!({"format": "listing", "objects": 3, "tables": 1, "size": total})]
    );

    // An empty folder holds nothing to inspect: exit 1, naming it.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert_nothing(
        inspect(&[empty.to_str().unwrap()], &[]),
        empty.to_str().unwrap(),
    );
    // A name check is for one object, not a folder.
    let text = root().join("examples/storage-text.json");
    let out = inspect(&[&base, "--subscription", text.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("--subscription checks the name of one object"));
}

/// The bucket, its prefixes and a key that is not there, on one S3 server (`api`) whose bucket
/// `bucket` is empty.
fn s3_listing(api: &S3Api, bucket: &str) {
    let dir = tempfile::tempdir().unwrap();
    let env = api.env();
    write_objects_and_a_table(
        dir.path(),
        &format!("s3://{bucket}"),
        &format!("s3://{bucket}/lake/t"),
        &env,
    );
    api.python(&format!(
        "import boto3; boto3.client('s3').put_object(Bucket='{bucket}', Key='top.txt', Body=b'top\\n')"
    ));
    let objects = api.list(bucket);
    assert_eq!(
        objects
            .iter()
            .filter(|(k, _)| k.starts_with("events/"))
            .count(),
        3,
        "{objects:?}"
    );
    let root_url = format!("s3://{bucket}/");
    let url = |name: &str| format!("{root_url}{name}");
    let want = expected(&objects, "lake/t", &url);
    for place in [format!("s3://{bucket}/"), format!("s3://{bucket}")] {
        let got = lines(inspect(&[&place], &env));
        assert_eq!(without_times(got), want, "{place}");
    }
    // A prefix, with and without its slash: names relative to it, URLs whole.
    let events: Vec<(String, u64)> = objects
        .iter()
        .filter_map(|(k, s)| k.strip_prefix("events/").map(|n| (n.to_string(), *s)))
        .collect();
    for place in [
        format!("s3://{bucket}/events"),
        format!("s3://{bucket}/events/"),
    ] {
        let got = without_times(lines(inspect(&[&place], &env)));
        let want: Vec<Value> = events
            .iter()
            .map(|(n, s)| json!({"object": n, "size": s, "url": format!("s3://{bucket}/events/{n}")}))
            .collect();
        assert_eq!(got, Value::Array(want), "{place}");
    }
    // A listed URL is an object: its records (the five messages over the three objects).
    let mut data: Vec<String> = Vec::new();
    for (n, _) in &events {
        let recs = lines(inspect(&[&format!("s3://{bucket}/events/{n}")], &env));
        data.extend(recs.iter().map(|r| r["data"].as_str().unwrap().to_string()));
    }
    data.sort();
    let want: Vec<String> = (0..5)
        .map(|i| String::from_utf8(numbered_message(i, 16).data.to_vec()).unwrap())
        .collect();
    assert_eq!(data, want);
    let s = lines(inspect(&[&format!("s3://{bucket}/"), "--summary"], &env));
    assert_eq!(s[0]["format"], "listing");
    assert_eq!(s[0]["objects"], 4);
    assert_eq!(s[0]["tables"], 1);
    // Neither an object nor a prefix with objects: exit 1, naming it. (`events/2` is the start
    // of object names, not a prefix of path segments.)
    for place in [
        format!("s3://{bucket}/nothing"),
        format!("s3://{bucket}/nothing/"),
        format!("s3://{bucket}/events/2"),
    ] {
        assert_nothing(inspect(&[&place], &env), &place);
    }
}

#[test]
fn inspect_lists_a_bucket_and_its_prefixes_on_moto() {
    let s3 = S3Server::start();
    s3.create_bucket("archive");
    s3_listing(&s3.api(), "archive");
    // An empty bucket holds nothing to inspect.
    s3.create_bucket("empty");
    assert_nothing(inspect(&["s3://empty/"], &s3.env()), "s3://empty/");
}

#[test]
fn inspect_lists_a_bucket_and_its_prefixes_on_seaweedfs() {
    let api = servers::shared_seaweedfs().api();
    let bucket = servers::unique_bucket("inspect");
    api.create_bucket(&bucket);
    s3_listing(&api, &bucket);
}
