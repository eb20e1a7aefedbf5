//! `subsink serve` end to end (issue 10, point 6): subscriptions created with Google's official
//! Python client on the Pub/Sub emulator — Text, Avro with metadata, a table with a schema file,
//! a table that already exists, one that breaks the rules — are discovered and exported by one
//! process; objects are read back with fastavro, rows with the `deltalake` package. One
//! subscription is deleted mid-run (its open file is finalized and it stops), one is changed
//! (`ackDeadlineSeconds`, the field the emulator lets one update: it restarts), one is created
//! mid-run (it is picked up), and the one metrics endpoint labels each. Below it, the parts on
//! their own: what discovery reads from the emulator, and the discovery loop over a stand-in.

mod util;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subsink::message::Message;
use util::emulator::Emulator;
use util::http::{get, metric, sample};
use util::*;

const PROJECT: &str = "test-project";

/// Creates, deletes and publishes on the emulator with Google's official client
/// (`google-cloud-pubsub`), one request (JSON) per run.
const ADMIN: &str = r#"
import json, sys
from google.cloud import pubsub_v1
from google.pubsub_v1.types import BigQueryConfig, CloudStorageConfig, DeadLetterPolicy, Subscription
from google.protobuf import duration_pb2, field_mask_pb2
req = json.loads(sys.argv[1])
project = "test-project"
pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
path = lambda s: sub.subscription_path(project, s)
topic = pub.topic_path(project, "events")
secs = lambda n: duration_pb2.Duration(seconds=n)
def storage(name, **cfg):
    sub.create_subscription(request={"name": path(name), "topic": topic,
                                     "cloud_storage_config": CloudStorageConfig(**cfg)})
def table(name, table):
    sub.create_subscription(request={"name": path(name), "topic": topic,
        "bigquery_config": BigQueryConfig(table=f"{project}.{table}", use_table_schema=True,
                                          write_metadata=True, drop_unknown_fields=True)})
a = req["action"]
if a == "create":
    # The discovery tests: every field they check, under Pub/Sub's limits.
    pub.create_topic(name=topic)
    pub.create_topic(name=pub.topic_path(project, "dead"))
    storage("archive-text", bucket="text-bucket", filename_prefix="text/", filename_suffix=".txt",
            max_duration=secs(120), max_messages=1000, text_config=CloudStorageConfig.TextConfig())
    sub.create_subscription(request={
        "name": path("archive-avro"), "topic": topic, "ack_deadline_seconds": 60,
        "dead_letter_policy": DeadLetterPolicy(
            dead_letter_topic=pub.topic_path(project, "dead"), max_delivery_attempts=7),
        "cloud_storage_config": CloudStorageConfig(
            bucket="avro-bucket", filename_datetime_format="YYYY/MM/DD/hh_mm_ssZ",
            max_bytes=10_000_000,
            avro_config=CloudStorageConfig.AvroConfig(write_metadata=True))})
    table("to-table", "analytics.events")
    sub.create_subscription(request={"name": path("plain-pull"), "topic": topic})
elif a == "setup":
    # The end-to-end test (extended limits): files finalized every 2 s.
    pub.create_topic(name=topic)
    storage("archive-text", bucket="text-bucket", filename_prefix="text/", filename_suffix=".txt",
            max_duration=secs(2), text_config=CloudStorageConfig.TextConfig())
    storage("archive-avro", bucket="avro-bucket", filename_suffix=".avro", max_duration=secs(2),
            avro_config=CloudStorageConfig.AvroConfig(write_metadata=True))
    # Finalized only when it stops: a long maxDuration.
    storage("doomed", bucket="doomed-bucket", max_duration=secs(3600),
            avro_config=CloudStorageConfig.AvroConfig(write_metadata=True))
    # Breaks two rules: a suffix ending in "/" and an unknown datetime letter.
    storage("broken", bucket="broken-bucket", filename_suffix="x/", filename_datetime_format="YYYY-QQ")
    table("to-table", "analytics.events")
    table("to-existing", "analytics.existing")
    sub.create_subscription(request={"name": path("plain-pull"), "topic": topic})
elif a == "topic":
    pub.create_topic(name=topic)
elif a == "many":
    # More export subscriptions than one page of ListSubscriptions holds (1,000).
    pub.create_topic(name=topic)
    for i in range(req["count"]):
        storage(f"many-{i:04}", bucket="many-bucket")
elif a == "delete":
    sub.delete_subscription(subscription=path(req["name"]))
elif a == "create-short":
    # maxDuration 30 s is below Pub/Sub's 1 minute: subsink must refuse it.
    storage(req["name"], bucket="short-bucket", max_duration=secs(30))
elif a == "create-text":
    extra = {"max_duration": secs(req["max_duration"])} if "max_duration" in req else {}
    storage(req["name"], bucket="late-bucket", text_config=CloudStorageConfig.TextConfig(), **extra)
elif a == "update-ack":
    # The one export-relevant field the emulator lets UpdateSubscription change.
    sub.update_subscription(request={
        "subscription": Subscription(name=path(req["name"]), ack_deadline_seconds=req["seconds"]),
        "update_mask": field_mask_pb2.FieldMask(paths=["ack_deadline_seconds"])})
elif a == "publish":
    futures = [pub.publish(topic, json.dumps({"id": i, "name": f"n{i}"}).encode(), i=str(i))
               for i in range(req["from"], req["to"])]
    print(json.dumps([f.result() for f in futures]))
    sys.exit(0)
print(json.dumps({"ok": True}))
"#;

/// Run [`ADMIN`] with `req` against the emulator at `host`.
fn admin_at(host: &str, req: &Value) -> Value {
    python_json(
        ADMIN,
        &req.to_string(),
        &[("PUBSUB_EMULATOR_HOST", host.to_string())],
    )
}

fn admin(emu: &Emulator, req: Value) -> Value {
    admin_at(&emu.host(), &req)
}

/// [`admin_at`] on a blocking thread (the async tests).
async fn pubsub_admin(host: String, req: Value) {
    tokio::task::spawn_blocking(move || {
        admin_at(&host, &req);
    })
    .await
    .unwrap();
}

/// Rows of a Delta table read by the `deltalake` package, sorted by `id`.
const DELTA_ROWS: &str = r#"
import json, os, sys, deltalake
dt = deltalake.DeltaTable(sys.argv[1])
rows = dt.to_pyarrow_table().to_pylist()
for r in rows:
    r["publish_time"] = str(r["publish_time"])
rows.sort(key=lambda r: r["id"])
print(json.dumps(rows))
# deltalake's threads can abort the interpreter's teardown ("terminate called without an
# active exception"): the answer is printed, so leave without the teardown.
sys.stdout.flush()
os._exit(0)
"#;

fn delta_rows(dir: &Path) -> Vec<Value> {
    if !dir.join("_delta_log").exists() {
        return Vec::new();
    }
    python_json(DELTA_ROWS, dir.to_str().unwrap(), &[])
        .as_array()
        .unwrap()
        .clone()
}

/// The `id` of each line of the Text objects in `bucket` (each line is a message's data).
fn text_ids(bucket: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = objects_below(bucket)
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| {
                    serde_json::from_str::<Value>(l).unwrap()["id"]
                        .as_u64()
                        .unwrap()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    ids.sort();
    ids
}

/// The payload `id` of each record of the Avro objects in `bucket`, and the records.
fn avro_ids(bucket: &Path) -> (Vec<u64>, Vec<Value>) {
    let recs = avro_records(&objects_below(bucket));
    let mut ids: Vec<u64> = recs
        .iter()
        .map(|r| {
            use base64::Engine as _;
            let data = base64::engine::general_purpose::STANDARD
                .decode(r["data"]["$b64"].as_str().unwrap())
                .unwrap();
            serde_json::from_slice::<Value>(&data).unwrap()["id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    ids.sort();
    (ids, recs)
}

fn range(from: u64, to: u64) -> Vec<u64> {
    (from..to).collect()
}

fn wait<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    poll(Duration::from_secs(90), Duration::from_millis(500), || {
        f().ok_or_else(|| format!("waited 90 s for {what}"))
    })
}

const SCHEMA: &str =
    r#"[{"name": "id", "type": "INT64", "mode": "REQUIRED"}, {"name": "name", "type": "STRING"}]"#;

/// A Delta table made by `subsink run` before serve starts (the schema then comes from the table).
fn existing_table(dir: &Path, table: &Path) {
    let schema = dir.join("existing-schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    let sub = dir.join("existing-sub.json");
    std::fs::write(
        &sub,
        json!({
            "name": "projects/test-project/subscriptions/to-existing",
            "topic": "projects/test-project/topics/events",
            "bigqueryConfig": {"table": "test-project.analytics.existing", "useTableSchema": true,
                               "writeMetadata": true},
        })
        .to_string(),
    )
    .unwrap();
    let input = dir.join("seed.ndjson");
    let seed = Message {
        data: br#"{"id": 1000000, "name": "seed"}"#.to_vec().into(),
        attributes: Default::default(),
        message_id: "seed-1".into(),
        publish_time_micros: 1_700_000_000_000_000,
        ordering_key: String::new(),
    };
    std::fs::write(&input, format!("{}\n", seed.to_json_line())).unwrap();
    table_run(&sub, &input, table, &schema);
}

/// `subsink serve` of the project on `emu`, discovering every second, its buckets and tables below
/// `data`, table schemas from `schemas`, its log in `log`; and the base URL of its metrics.
fn spawn_serve(
    emu: &Emulator,
    data: &Path,
    schemas: &Path,
    log: &Path,
) -> (servers::Guarded, String) {
    spawn_serve_at(&emu.host(), data, schemas, log)
}

/// [`spawn_serve`] with Pub/Sub at `host` (the emulator, or a proxy in front of it).
fn spawn_serve_at(
    host: &str,
    data: &Path,
    schemas: &Path,
    log: &Path,
) -> (servers::Guarded, String) {
    let port = free_port();
    let child = servers::Guarded::spawn(
        subsink()
            .env("PUBSUB_EMULATOR_HOST", host)
            .env("SUBSINK_LOG", "info")
            .args(["serve", "--project", PROJECT, "--limits", "extended"])
            .args(["--discover-interval", "1s", "--table-max-duration", "2s"])
            .arg("--bucket-url-template")
            .arg(format!("file://{}/buckets/{{bucket}}", data.display()))
            .arg("--table-url-template")
            .arg(format!("file://{}/tables/{{table}}", data.display()))
            .arg("--table-schemas")
            .arg(schemas)
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap()),
        "subsink serve",
    );
    (child, format!("http://127.0.0.1:{port}"))
}

/// Messages subscription `s` of the project received, by the metrics at `base`; `None` while it
/// is not exported.
fn received(base: &str, s: &str) -> Option<f64> {
    metric(
        base,
        "subsink_messages_received",
        "subsink_messages_received_total",
        &json!({"subscription": format!("projects/{PROJECT}/subscriptions/{s}")}),
    )
}

#[test]
fn serve_exports_every_export_subscription_of_a_project() {
    let emu = Emulator::start();
    admin(&emu, json!({"action": "setup"}));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let schemas = dir.path().join("schemas");
    std::fs::create_dir_all(&schemas).unwrap();
    std::fs::write(schemas.join("test-project.analytics.events.json"), SCHEMA).unwrap();
    let bucket = |b: &str| data.join("buckets").join(b);
    let table = |t: &str| data.join("tables").join(t);
    existing_table(dir.path(), &table("existing"));

    let log = dir.path().join("serve.log");
    let (mut child, base) = spawn_serve(&emu, &data, &schemas, &log);
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let sub = |s: &str| json!({"subscription": format!("projects/{PROJECT}/subscriptions/{s}")});
    let received = |s: &str| received(&base, s);
    // Every export subscription is running (its series exist) before anything is published.
    wait("five pipelines", || {
        assert!(child.try_wait().is_none(), "serve exited: {}", logged());
        let names = [
            "archive-text",
            "archive-avro",
            "doomed",
            "to-table",
            "to-existing",
        ];
        names.iter().all(|s| received(s).is_some()).then_some(())
    });
    assert!(
        received("plain-pull").is_none(),
        "a pull subscription is not exported"
    );
    assert!(received("broken").is_none(), "an invalid one is not run");
    let text = logged();
    let broken = text
        .lines()
        .find(|l| l.contains("subscriptions/broken") && l.contains("not exported"))
        .unwrap_or_else(|| panic!("no line about the invalid subscription: {text}"));
    assert!(broken.contains("filenameSuffix"), "{broken}");
    assert!(broken.contains("filenameDatetimeFormat"), "{broken}");

    admin(&emu, json!({"action": "publish", "from": 0, "to": 30}));
    let want = range(0, 30);
    wait("text objects", || {
        (text_ids(&bucket("text-bucket")) == want).then_some(())
    });
    for f in objects_below(&bucket("text-bucket")) {
        let name = f
            .strip_prefix(bucket("text-bucket"))
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            name.starts_with("text/") && name.ends_with(".txt"),
            "{name}"
        );
    }
    let (_, recs) = wait("avro objects", || {
        let (ids, recs) = avro_ids(&bucket("avro-bucket"));
        (ids == want).then_some((ids, recs))
    });
    assert_eq!(
        recs[0]["subscription_name"],
        "projects/test-project/subscriptions/archive-avro"
    );
    assert!(recs.iter().all(|r| r["attributes"]["i"].is_string()));
    let rows = wait("table rows", || {
        let rows = delta_rows(&table("events"));
        (rows.len() == 30).then_some(rows)
    });
    let ids: Vec<u64> = rows.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, want);
    assert_eq!(rows[3]["name"], "n3");
    assert_eq!(
        rows[3]["subscription_name"],
        "projects/test-project/subscriptions/to-table"
    );
    // The existing table's own schema: its seed row and the 30 new ones.
    let rows = wait("rows in the existing table", || {
        let rows = delta_rows(&table("existing"));
        (rows.len() == 31).then_some(rows)
    });
    assert_eq!(rows[30]["name"], "seed");

    // Deleted mid-run: the open file (maxDuration 1 h) is finalized and the pipeline stops.
    wait("doomed received 30", || {
        (received("doomed") == Some(30.0)).then_some(())
    });
    assert!(
        objects_below(&bucket("doomed-bucket")).is_empty(),
        "nothing finalized yet"
    );
    admin(&emu, json!({"action": "delete", "name": "doomed"}));
    let (ids, _) = wait("doomed's file", || {
        let got = avro_ids(&bucket("doomed-bucket"));
        (got.0 == want).then_some(got)
    });
    assert_eq!(ids.len(), 30);
    wait("doomed's series gone", || {
        received("doomed").is_none().then_some(())
    });
    let text = logged();
    assert!(
        text.lines().any(|l| l.contains("subscriptions/doomed")
            && l.contains("file written")
            && l.contains("reason=\"shutdown\"")),
        "{text}"
    );

    // Created mid-run: picked up at the next discovery.
    admin(
        &emu,
        json!({"action": "create-text", "name": "late-text", "max_duration": 2}),
    );
    wait("late-text running", || {
        received("late-text").is_some().then_some(())
    });
    admin(&emu, json!({"action": "publish", "from": 30, "to": 40}));
    wait("late objects", || {
        (text_ids(&bucket("late-bucket")) == range(30, 40)).then_some(())
    });
    wait("text objects", || {
        (text_ids(&bucket("text-bucket")) == range(0, 40)).then_some(())
    });
    assert!(
        objects_below(&bucket("doomed-bucket")).len() == 1,
        "doomed stopped"
    );

    // Changed mid-run: stopped (its files finalized) and started again with the new settings.
    admin(
        &emu,
        json!({"action": "update-ack", "name": "archive-text", "seconds": 42}),
    );
    let text_lines = |what: &str| {
        logged()
            .lines()
            .filter(|l| l.contains("subscriptions/archive-text") && l.contains(what))
            .count()
    };
    wait("archive-text restarted", || {
        (text_lines("why=\"changed\"") == 1 && text_lines("export started") == 2).then_some(())
    });
    admin(&emu, json!({"action": "publish", "from": 40, "to": 45}));
    wait("text objects after the restart", || {
        (text_ids(&bucket("text-bucket")) == range(0, 45)).then_some(())
    });

    // One endpoint: every running subscription under its label; ready.
    let page = get(&[format!("{base}/metrics")]).remove(0);
    for s in [
        "archive-text",
        "archive-avro",
        "to-table",
        "to-existing",
        "late-text",
    ] {
        let v = sample(
            &page,
            "subsink_messages_written",
            "subsink_messages_written_total",
            &sub(s),
        );
        assert!(v.is_some_and(|v| v > 0.0), "{s}: {v:?}");
    }
    let (code, body) = util::http::status(&base, "/readyz");
    assert_eq!(code, 200, "{body}");

    // SIGTERM: every pipeline drains, exit 0.
    signal_group(&child, libc::SIGTERM);
    let status = wait("serve to exit", || child.try_wait());
    assert!(status.success(), "{status}: {}", logged());
    assert!(logged().contains("stopping export"), "{}", logged());
    assert_no_staging(&data.join("buckets"));
}

/// `serve` rides out failed listings and a pipeline that ends by itself. Pub/Sub is behind the
/// recording proxy, which answers the first three ListSubscriptions UNAVAILABLE and the first
/// StreamingPull PERMISSION_DENIED (a status the source does not retry: its pipeline ends). While
/// the listing fails, the discovery's own health entry keeps `/readyz` 503 and `/healthz` 200;
/// each failed listing is logged and the next interval's is tried; the ended pipeline is started
/// again at the next discovery; and the messages published then are exported.
#[test]
fn serve_retries_a_failed_listing_and_restarts_a_pipeline_that_ended() {
    let emu = Emulator::start();
    admin(&emu, json!({"action": "topic"}));
    admin(
        &emu,
        json!({"action": "create-text", "name": "late-text", "max_duration": 2}),
    );
    let dir = tempfile::tempdir().unwrap();
    let proxy = util::proxy::PubsubProxy::start(&emu.host(), &dir.path().join("calls.log"), None);
    proxy.fail_next(
        "ListSubscriptions",
        &["UNAVAILABLE", "UNAVAILABLE", "UNAVAILABLE"],
    );
    proxy.fail_next("StreamingPull", &["PERMISSION_DENIED"]);
    let data = dir.path().join("data");
    let schemas = dir.path().join("schemas");
    std::fs::create_dir_all(&schemas).unwrap();
    let log = dir.path().join("serve.log");
    let (mut child, base) = spawn_serve_at(&proxy.host(), &data, &schemas, &log);
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let lines = |what: &str| {
        logged()
            .lines()
            .filter(|l| l.contains(what))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // Not ready while discovery cannot list (two listings failed, the third will): alive.
    wait("two failed listings", || {
        assert!(child.try_wait().is_none(), "serve exited: {}", logged());
        (proxy.faults().len() >= 2).then_some(())
    });
    let (code, body) = util::http::status(&base, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("discovery of test-project: source not connected"),
        "{body}"
    );
    assert_eq!(util::http::status(&base, "/healthz").0, 200);
    wait("the export started twice", || {
        assert!(child.try_wait().is_none(), "serve exited: {}", logged());
        (lines("export started").len() == 2).then_some(())
    });
    let listing = ("ListSubscriptions".to_string(), "UNAVAILABLE".to_string());
    assert_eq!(
        proxy.faults(),
        [
            listing.clone(),
            listing.clone(),
            listing,
            ("StreamingPull".to_string(), "PERMISSION_DENIED".to_string()),
        ]
    );
    let failed = lines("cannot list subscriptions; retrying at the next interval");
    assert_eq!(failed.len(), 3, "{}", logged());
    assert!(
        failed[0].contains("Unavailable") || failed[0].contains("UNAVAILABLE"),
        "{}",
        failed[0]
    );
    let ended = lines("export ended by itself; starting it again");
    assert_eq!(ended.len(), 1, "{}", logged());
    assert!(ended[0].contains("subscriptions/late-text"), "{}", ended[0]);

    // The restarted export works: what is published now is written.
    wait("late-text running", || {
        received(&base, "late-text").is_some().then_some(())
    });
    admin(&emu, json!({"action": "publish", "from": 0, "to": 10}));
    wait("the objects", || {
        (text_ids(&data.join("buckets").join("late-bucket")) == range(0, 10)).then_some(())
    });
    let (code, body) = util::http::status(&base, "/readyz");
    assert_eq!(code, 200, "{body}");
    signal_group(&child, libc::SIGTERM);
    let status = wait("serve to exit", || child.try_wait());
    assert!(status.success(), "{status}: {}", logged());
    assert_no_staging(&data.join("buckets"));
}

/// ListSubscriptions answers at most 1,000 subscriptions a page (the emulator too, with a
/// next-page token): discovery reads every page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_reads_every_page_past_1000_subscriptions() {
    use subsink::config::LimitsMode;
    use subsink::pubsub::PubsubClient;
    use subsink::serve::discover;

    let emu = Emulator::start();
    pubsub_admin(emu.host(), json!({"action": "many", "count": 1001})).await;
    let client = PubsubClient::connect_emulator(&emu.host()).await.unwrap();
    let found = discover(&client, "test-project", LimitsMode::Pubsub)
        .await
        .unwrap();
    let names: Vec<&str> = found.iter().map(|d| d.name.as_str()).collect();
    let want: Vec<String> = (0..1001)
        .map(|i| format!("projects/test-project/subscriptions/many-{i:04}"))
        .collect();
    assert_eq!(names.len(), 1001, "every page read");
    assert_eq!(names, want);
    assert!(found.iter().all(|d| d.config.is_ok()));
}

/// Discovery reads a topic's schema revisions once for all its subscriptions, and again only
/// when the topic's schema settings change or its schema was deleted and made again: a revision
/// committed meanwhile is no change (it is read when its first message comes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lists_a_topics_revisions_once_until_its_schema_settings_change() {
    use subsink::config::LimitsMode;
    use subsink::encode::topic::{TopicSchemaSource, TopicSchemas};
    use subsink::pubsub::PubsubClient;
    use subsink::serve::{discover_cached, FetchedTopicSchema, TopicSchemaCache};

    let emu = Emulator::start();
    let run = |req: Value| {
        let host = emu.host();
        tokio::task::block_in_place(move || {
            python_json(TYPED, &req.to_string(), &[("PUBSUB_EMULATOR_HOST", host)])
        })
    };
    run(json!({"action": "setup"}));
    let client = PubsubClient::connect_emulator(&emu.host()).await.unwrap();
    let mut cache = TopicSchemaCache::default();
    // Each typed subscription's revision set, in name order (typed-avro, typed-table).
    async fn round(client: &PubsubClient, cache: &mut TopicSchemaCache) -> Vec<TopicSchemas> {
        discover_cached(client, "test-project", LimitsMode::Extended, None, cache)
            .await
            .unwrap()
            .into_iter()
            .filter(|d| d.name.contains("/typed-"))
            .map(|d| match d.topic_schema {
                Some(Ok(FetchedTopicSchema {
                    source: TopicSchemaSource::Fetched { schemas, .. },
                    ..
                })) => schemas,
                other => panic!("{}: {other:?} {:?}", d.name, d.config),
            })
            .collect()
    }
    let ids =
        |s: &TopicSchemas| -> Vec<String> { s.revisions().into_iter().map(|(id, _)| id).collect() };

    let first = round(&client, &mut cache).await;
    assert_eq!(first.len(), 2);
    assert_eq!(
        cache.listings(),
        1,
        "one listing for the topic's two subscriptions"
    );
    let v1 = ids(&first[0]);
    assert_eq!(v1.len(), 1);
    assert_eq!(ids(&first[1]), v1);
    // One set: what typed-avro learns (a revision that does not exist), typed-table knows.
    assert!(first[0].lookup("no-such-revision").is_none());
    assert!(first[1].settled("no-such-revision"));

    // The next discoveries: nothing listed; a revision committed meanwhile changes nothing.
    let again = round(&client, &mut cache).await;
    assert_eq!(cache.listings(), 1);
    assert!(again[1].settled("no-such-revision"), "the same set");
    let v2 = run(json!({"action": "commit-v2"}))["revision"]
        .as_str()
        .unwrap()
        .to_string();
    let after_commit = round(&client, &mut cache).await;
    assert_eq!(cache.listings(), 1, "a new revision is not a change");
    assert_eq!(ids(&after_commit[0]), v1);
    // It is read when its first message comes, and then known to both.
    assert!(after_commit[0].lookup(&v2).is_some());
    assert!(after_commit[1].settled(&v2));

    // The schema deleted: no schema for either subscription. Made again under the same name, with
    // the topic's settings as they were: read afresh, not the old revisions.
    run(json!({"action": "delete-schema"}));
    for d in discover_cached(
        &client,
        "test-project",
        LimitsMode::Extended,
        None,
        &mut cache,
    )
    .await
    .unwrap()
    .into_iter()
    .filter(|d| d.name.contains("/typed-"))
    {
        let e = d.topic_schema.unwrap().unwrap_err().to_string();
        assert!(e.contains("was deleted"), "{}: {e}", d.name);
    }
    let v3 = run(json!({"action": "recreate"}))["revision"]
        .as_str()
        .unwrap()
        .to_string();
    let recreated = round(&client, &mut cache).await;
    assert_eq!(cache.listings(), 2, "the same settings, but a new schema");
    assert_eq!(ids(&recreated[0]), [v3.as_str()]);
    assert_eq!(ids(&recreated[1]), [v3.as_str()]);

    // The topic's schema settings change (its last revision pinned): listed again, once.
    let pinned = run(json!({"action": "pin"}))["revision"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(pinned, v3);
    let changed = round(&client, &mut cache).await;
    assert_eq!(cache.listings(), 3);
    assert_eq!(ids(&changed[0]), [v3.as_str()]);
    assert!(!changed[0].settled("no-such-revision"), "a fresh set");
    assert!(recreated[0].lookup("no-such-revision").is_none());
    assert!(
        !changed[1].settled("no-such-revision"),
        "not the set before"
    );
    assert_eq!(
        changed[0].fallback().schema_json(),
        after_commit[0].lookup(&v2).unwrap().schema_json(),
        "the pinned revision (V2's definition) is the fallback"
    );
    round(&client, &mut cache).await;
    assert_eq!(cache.listings(), 3);
}

fn signal_group(child: &servers::Guarded, sig: i32) {
    unsafe { libc::kill(child.id() as i32, sig) };
}

// ------------------------------------------------------------------------------------------------
// serve: discovering export subscriptions

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_export_subscriptions_created_by_the_python_client() {
    use subsink::config::{LimitsMode, OutputFormat};
    use subsink::pubsub::PubsubClient;
    use subsink::serve::{diff, discover, ExportKind, Target, Targets};

    let emu = util::emulator::Emulator::start();
    let host = emu.host();
    let admin = |req: Value| pubsub_admin(host.clone(), req);
    admin(json!({"action": "create"})).await;

    let client = PubsubClient::connect_emulator(&emu.host()).await.unwrap();
    let found = discover(&client, "test-project", LimitsMode::Pubsub)
        .await
        .unwrap();
    let names: Vec<&str> = found.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "projects/test-project/subscriptions/archive-avro",
            "projects/test-project/subscriptions/archive-text",
            "projects/test-project/subscriptions/to-table",
        ],
        "the pull subscription is left out"
    );
    let kinds: Vec<ExportKind> = found.iter().map(|d| d.kind).collect();
    assert_eq!(
        kinds,
        [ExportKind::Storage, ExportKind::Storage, ExportKind::Table]
    );

    let avro = found[0].config.as_ref().unwrap();
    let s = avro.storage.as_ref().unwrap();
    assert_eq!(s.bucket, "avro-bucket");
    assert_eq!(s.datetime_format.as_str(), "YYYY/MM/DD/hh_mm_ssZ");
    assert_eq!(s.max_bytes, Some(10_000_000));
    assert_eq!(
        s.max_duration,
        Duration::from_secs(300),
        "Pub/Sub's default"
    );
    assert_eq!(
        s.output,
        OutputFormat::Avro {
            write_metadata: true,
            use_topic_schema: false
        }
    );
    assert_eq!(avro.delivery.ack_deadline, Duration::from_secs(60));
    assert_eq!(
        avro.delivery.dead_letter,
        Some(("projects/test-project/topics/dead".to_string(), 7))
    );
    assert_eq!(avro.topic, "projects/test-project/topics/events");

    let text = found[1].config.as_ref().unwrap();
    let s = text.storage.as_ref().unwrap();
    assert_eq!(
        (
            s.bucket.as_str(),
            s.filename_prefix.as_str(),
            s.filename_suffix.as_str()
        ),
        ("text-bucket", "text/", ".txt")
    );
    assert_eq!(s.max_duration, Duration::from_secs(120));
    assert_eq!(s.max_messages, Some(1000));
    assert_eq!(s.output, OutputFormat::Text);

    let table = found[2].config.as_ref().unwrap();
    let bq = table.bigquery.as_ref().unwrap();
    assert_eq!(bq.table, "test-project.analytics.events");
    assert!(bq.use_table_schema && bq.write_metadata && bq.drop_unknown_fields);
    assert!(!bq.use_topic_schema);

    // Destinations from the templates; the table's schema from --table-schemas when present.
    let schemas = tempfile::tempdir().unwrap();
    let schema_file = schemas.path().join("test-project.analytics.events.json");
    std::fs::write(&schema_file, r#"[{"name": "id", "type": "INT64"}]"#).unwrap();
    let targets = Targets::new(
        "file:///data/{bucket}",
        "s3://lake/{project}/{dataset}/{table}",
        Some(schemas.path().to_path_buf()),
    )
    .unwrap();
    assert_eq!(
        targets.target(avro).unwrap(),
        Target::Bucket {
            url: "file:///data/avro-bucket".into()
        }
    );
    assert_eq!(
        targets.target(table).unwrap(),
        Target::Table {
            url: "s3://lake/test-project/analytics/events".into(),
            schema: Some(schema_file),
        }
    );

    // The REST shape round-trips through the crate's config file parser.
    let json_text = serde_json::to_string(&found[0].resource).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub.json");
    std::fs::write(&path, &json_text).unwrap();
    assert_eq!(
        subsink::config::resource::load(&path).unwrap(),
        found[0].resource
    );

    // One deleted, one created: the next discovery says so.
    let running: BTreeMap<String, subsink::serve::Seen> =
        found.iter().map(|d| (d.name.clone(), d.seen())).collect();
    admin(json!({"action": "delete", "name": "archive-text"})).await;
    admin(json!({"action": "create-text", "name": "late-text"})).await;
    let again = discover(&client, "projects/test-project", LimitsMode::Pubsub)
        .await
        .unwrap();
    let changes = diff(&running, &again);
    assert_eq!(
        changes.deleted,
        ["projects/test-project/subscriptions/archive-text"]
    );
    assert_eq!(
        changes.created,
        ["projects/test-project/subscriptions/late-text"]
    );
    assert!(changes.changed.is_empty(), "{changes:?}");
}

/// A stand-in for the pipelines: records what `supervise` asks for, and counts the discoveries
/// that listed the project (each asks which pipelines ended).
#[derive(Clone, Default)]
struct Recorder(
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
);

#[async_trait::async_trait]
impl subsink::serve::Pipelines for Recorder {
    async fn start(
        &mut self,
        sub: &subsink::config::ValidSubscription,
        target: &subsink::serve::Target,
        _topic_schema: Option<&subsink::encode::topic::TopicSchemaSource>,
    ) -> Result<(), subsink::serve::StartError> {
        let url = match target {
            subsink::serve::Target::Bucket { url } | subsink::serve::Target::Table { url, .. } => {
                url
            }
        };
        self.0.lock().unwrap().push(format!(
            "start {} {url}",
            sub.name.rsplit('/').next().unwrap()
        ));
        Ok(())
    }
    async fn stop(&mut self, name: &str, _why: subsink::serve::StopReason) {
        self.0
            .lock()
            .unwrap()
            .push(format!("stop {}", name.rsplit('/').next().unwrap()));
    }
    fn ended(&mut self) -> Vec<String> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Vec::new()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervise_starts_stops_and_skips_invalid_subscriptions() {
    use subsink::config::LimitsMode;
    use subsink::pubsub::PubsubClient;
    use subsink::serve::{supervise, ServeSettings, Targets};

    let emu = util::emulator::Emulator::start();
    let host = emu.host();
    let admin = |req: Value| pubsub_admin(host.clone(), req);
    admin(json!({"action": "create"})).await;
    admin(json!({"action": "create-short", "name": "too-short"})).await;

    let client = PubsubClient::connect_emulator(&emu.host()).await.unwrap();
    let settings = ServeSettings {
        project: "test-project".into(),
        limits: LimitsMode::Pubsub,
        interval: Duration::from_millis(300),
        targets: Targets::new("file:///data/{bucket}", "file:///lake/{table}", None).unwrap(),
        table_batching: None,
        probe: None,
    };
    let rec = Recorder::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = {
        let mut rec = rec.clone();
        tokio::spawn(async move {
            supervise(&client, &settings, &mut rec, async {
                let _ = stop_rx.await;
            })
            .await
        })
    };
    let events = || rec.0.lock().unwrap().clone();
    let wait_for = |n: usize| async move {
        let start = Instant::now();
        while events().len() < n {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "waited for {n} events: {:?}",
                events()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    wait_for(3).await;
    assert_eq!(
        events(),
        [
            "start archive-avro file:///data/avro-bucket",
            "start archive-text file:///data/text-bucket",
            "start to-table file:///lake/events",
        ],
        "the pull subscription is not exported, the invalid one is refused"
    );
    admin(json!({"action": "delete", "name": "archive-text"})).await;
    wait_for(4).await;
    assert_eq!(events()[3], "stop archive-text");
    admin(json!({"action": "create-text", "name": "late-text"})).await;
    wait_for(5).await;
    assert_eq!(events()[4], "start late-text file:///data/late-bucket");
    // Three more discoveries: nothing new (the invalid one is not retried while unchanged).
    let discoveries = || rec.1.load(std::sync::atomic::Ordering::SeqCst);
    let seen = discoveries();
    let start = Instant::now();
    while discoveries() < seen + 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waited for three discoveries"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(events().len(), 5, "{:?}", events());
    stop_tx.send(()).unwrap();
    task.await.unwrap();
    let mut last: Vec<String> = events()[5..].to_vec();
    last.sort();
    assert_eq!(
        last,
        ["stop archive-avro", "stop late-text", "stop to-table"],
        "shutdown stops every running export"
    );
}

// ------------------------------------------------------------------------------------------------
// serve: useTopicSchema, with the topic's schema read from Pub/Sub

/// Schemas, a topic with one (BINARY encoding) and its subscriptions, made with the official
/// client; messages published as Avro binary of the revision asked for (fastavro).
const TYPED: &str = r#"
import io, json, sys, fastavro
from google.cloud import pubsub_v1
from google.cloud.pubsub import SchemaServiceClient
from google.pubsub_v1.types import BigQueryConfig, CloudStorageConfig, Encoding, Schema
from google.protobuf import duration_pb2
req = json.loads(sys.argv[1])
project = "test-project"
pub, sub, schemas = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient(), SchemaServiceClient()
schema = schemas.schema_path(project, "events-schema")
topic = pub.topic_path(project, "typed")
V1 = {"type": "record", "name": "Event", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}
V2 = {"type": "record", "name": "Event", "fields": V1["fields"] + [
    {"name": "note", "type": ["null", "string"], "default": None}]}
a = req["action"]
if a == "setup":
    schemas.create_schema(request={"parent": f"projects/{project}", "schema_id": "events-schema",
        "schema": Schema(type_=Schema.Type.AVRO, definition=json.dumps(V1))})
    pub.create_topic(request={"name": topic,
        "schema_settings": {"schema": schema, "encoding": Encoding.BINARY}})
    plain = pub.topic_path(project, "untyped")
    pub.create_topic(name=plain)
    sub.create_subscription(request={"name": sub.subscription_path(project, "typed-avro"),
        "topic": topic, "cloud_storage_config": CloudStorageConfig(
            bucket="typed-bucket", filename_suffix=".avro",
            max_duration=duration_pb2.Duration(seconds=2),
            avro_config=CloudStorageConfig.AvroConfig(write_metadata=True, use_topic_schema=True))})
    sub.create_subscription(request={"name": sub.subscription_path(project, "typed-table"),
        "topic": topic, "bigquery_config": BigQueryConfig(table=f"{project}.analytics.typed",
            use_topic_schema=True, write_metadata=True)})
    # Its topic has no schema: reported, not exported.
    sub.create_subscription(request={"name": sub.subscription_path(project, "untyped-avro"),
        "topic": plain, "cloud_storage_config": CloudStorageConfig(bucket="untyped-bucket",
            avro_config=CloudStorageConfig.AvroConfig(use_topic_schema=True))})
    print(json.dumps({"ok": True}))
elif a == "commit-v2":
    r = schemas.commit_schema(request={"name": schema,
        "schema": Schema(name=schema, type_=Schema.Type.AVRO, definition=json.dumps(V2))})
    print(json.dumps({"revision": r.revision_id}))
elif a == "delete-schema":
    schemas.delete_schema(request={"name": schema})
    print(json.dumps({"ok": True}))
elif a == "recreate":
    # The same name again, one revision (V2); the topic points at it with no revision bounds.
    r = schemas.create_schema(request={"parent": f"projects/{project}", "schema_id": "events-schema",
        "schema": Schema(type_=Schema.Type.AVRO, definition=json.dumps(V2))})
    pub.update_topic(request={"topic": {"name": topic, "schema_settings": {"schema": schema,
        "encoding": Encoding.BINARY}}, "update_mask": {"paths": ["schema_settings"]}})
    print(json.dumps({"revision": r.revision_id}))
elif a == "pin":
    # The topic allows revisions up to the schema's current one (its schema settings change).
    rid = schemas.get_schema(request={"name": schema}).revision_id
    pub.update_topic(request={"topic": {"name": topic, "schema_settings": {"schema": schema,
        "encoding": Encoding.BINARY, "last_revision_id": rid}},
        "update_mask": {"paths": ["schema_settings"]}})
    print(json.dumps({"revision": rid}))
elif a == "publish":
    writer = fastavro.parse_schema(V2 if req["v2"] else V1)
    futures = []
    for i in range(req["from"], req["to"]):
        rec = {"id": i, "name": f"n{i}"}
        if req["v2"]:
            rec["note"] = f"note {i}"
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, writer, rec)
        futures.append(pub.publish(topic, buf.getvalue(), i=str(i)))
    print(json.dumps([f.result() for f in futures]))
"#;

fn typed(emu: &Emulator, req: Value) -> Value {
    python_json(
        TYPED,
        &req.to_string(),
        &[("PUBSUB_EMULATOR_HOST", emu.host())],
    )
}

#[test]
fn serve_writes_each_topic_schema_revision_with_its_own_schema() {
    let emu = Emulator::start();
    typed(&emu, json!({"action": "setup"}));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let schemas = dir.path().join("schemas");
    std::fs::create_dir_all(&schemas).unwrap();
    std::fs::write(
        schemas.join("test-project.analytics.typed.json"),
        r#"[{"name": "id", "type": "INT64", "mode": "REQUIRED"}, {"name": "name", "type": "STRING"},
            {"name": "note", "type": "STRING"}]"#,
    )
    .unwrap();
    let bucket = data.join("buckets").join("typed-bucket");
    let table = data.join("tables").join("typed");
    let log = dir.path().join("serve.log");
    let (mut child, base) = spawn_serve(&emu, &data, &schemas, &log);
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let running = |s: &str| received(&base, s).is_some();
    wait("both typed pipelines", || {
        assert!(child.try_wait().is_none(), "serve exited: {}", logged());
        (running("typed-avro") && running("typed-table")).then_some(())
    });
    let text = logged();
    let untyped = text
        .lines()
        .find(|l| l.contains("subscriptions/untyped-avro") && l.contains("not exported"))
        .unwrap_or_else(|| panic!("no line about the subscription without a schema: {text}"));
    assert!(
        untyped.contains("topic projects/test-project/topics/untyped has no schema"),
        "{untyped}"
    );
    assert!(!running("untyped-avro"));

    // Revision 1's messages; then revision 2 is committed and its messages follow at once: the
    // exports read the new revision when its first message comes (discovery restarts nothing for
    // it). Then revision 1's again. Binary datums decode only with their own revision.
    typed(
        &emu,
        json!({"action": "publish", "from": 0, "to": 10, "v2": false}),
    );
    wait("revision 1's rows", || {
        (delta_rows(&table).len() == 10).then_some(())
    });
    let v2 = typed(&emu, json!({"action": "commit-v2"}))["revision"]
        .as_str()
        .unwrap()
        .to_string();
    typed(
        &emu,
        json!({"action": "publish", "from": 10, "to": 20, "v2": true}),
    );
    typed(
        &emu,
        json!({"action": "publish", "from": 20, "to": 30, "v2": false}),
    );

    // The objects: each file's writer schema is its messages' revision's, plus the metadata.
    let dumps = wait("30 records in the objects", || {
        let files = objects_below(&bucket);
        if files.is_empty() {
            return None;
        }
        let dumps = util::readers::fastavro_dump(&files);
        let n: usize = dumps
            .iter()
            .map(|d| d["records"].as_array().unwrap().len())
            .sum();
        (n == 30).then_some(dumps)
    });
    let mut ids = Vec::new();
    let mut files_per_revision = BTreeMap::new();
    for d in &dumps {
        let fields: Vec<&str> = d["schema"]["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        let records = d["records"].as_array().unwrap();
        let revision = records[0]["attributes"]["googclient_schemarevisionid"]
            .as_str()
            .unwrap()
            .to_string();
        let want: &[&str] = if revision == v2 {
            &[
                "id",
                "name",
                "note",
                "subscription_name",
                "message_id",
                "publish_time",
                "attributes",
            ]
        } else {
            &[
                "id",
                "name",
                "subscription_name",
                "message_id",
                "publish_time",
                "attributes",
            ]
        };
        assert_eq!(fields, want, "{}", d["file"]);
        for r in records {
            assert_eq!(
                r["attributes"]["googclient_schemarevisionid"], revision,
                "one revision per file: {}",
                d["file"]
            );
            let id = r["id"].as_u64().unwrap();
            assert_eq!(r["name"], format!("n{id}"));
            if revision == v2 {
                assert_eq!(r["note"], format!("note {id}"));
            }
            assert_eq!(r["attributes"]["i"], id.to_string());
            ids.push(id);
        }
        *files_per_revision.entry(revision).or_insert(0) += 1;
    }
    ids.sort();
    assert_eq!(ids, range(0, 30));
    assert_eq!(files_per_revision.len(), 2, "{files_per_revision:?}");

    // The table: revision 1's rows have no note, revision 2's have theirs.
    let rows = wait("30 rows", || {
        let rows = delta_rows(&table);
        (rows.len() == 30).then_some(rows)
    });
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["id"], i as u64);
        assert_eq!(r["name"], format!("n{i}"));
        let note = if (10..20).contains(&i) {
            json!(format!("note {i}"))
        } else {
            Value::Null
        };
        assert_eq!(r["note"], note, "row {i}");
        assert_eq!(
            r["subscription_name"],
            "projects/test-project/subscriptions/typed-table"
        );
    }
    let bad = metric(
        &base,
        "subsink_messages_bad",
        "subsink_messages_bad_total",
        &json!({"subscription": "projects/test-project/subscriptions/typed-avro"}),
    );
    assert_eq!(bad, Some(0.0), "no message failed its schema");

    let starts = logged()
        .lines()
        .filter(|l| l.contains("subscriptions/typed-") && l.contains("export started"))
        .count();
    assert_eq!(starts, 2, "a new revision restarts nothing: {}", logged());

    signal_group(&child, libc::SIGTERM);
    let status = wait("serve to exit", || child.try_wait());
    assert!(status.success(), "{status}: {}", logged());
    assert_no_staging(&bucket);
}
