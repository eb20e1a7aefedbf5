//! Pub/Sub on Google's emulator: the client, a subscription config for the worker, the worker
//! itself, and the usual scenario of the end-to-end tests ([`Scenario`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;
use subsink::message::Message;
use subsink::pubsub::{PubsubClient, SubscriptionSpec};
use subsink::source::pubsub::{PubsubSettings, PubsubSource};
use subsink::source::{Source, SourceEvent};

use super::emulator::Emulator;
use super::proxy::{PubsubProxy, S3Proxy};
use super::{numbered_message, poll, rt, subsink, S3Server};

/// The project of the end-to-end tests.
pub const PROJECT: &str = "projects/subsink-e2e";

/// The full name of topic `name` in [`PROJECT`].
pub fn topic(name: &str) -> String {
    format!("{PROJECT}/topics/{name}")
}

/// The full name of subscription `name` in [`PROJECT`].
pub fn sub(name: &str) -> String {
    format!("{PROJECT}/subscriptions/{name}")
}

/// A fresh emulator, a runtime and a client of it.
pub struct PubsubEnv {
    pub emu: Emulator,
    pub rt: tokio::runtime::Runtime,
    pub client: PubsubClient,
}

impl PubsubEnv {
    /// Start an emulator and connect to it.
    pub fn start() -> PubsubEnv {
        PubsubEnv::on(Emulator::start())
    }

    /// Connect to the running emulator `emu`.
    pub fn on(emu: Emulator) -> PubsubEnv {
        let rt = rt();
        let client = rt
            .block_on(PubsubClient::connect_emulator(&emu.host()))
            .unwrap();
        PubsubEnv { emu, rt, client }
    }

    /// Create the topic of `spec` (and its dead-letter topic), then the subscription.
    pub fn topic_and_sub(&self, spec: SubscriptionSpec) {
        self.rt.block_on(async {
            self.client.create_topic(&spec.topic).await.unwrap();
            if let Some((dlq, _)) = &spec.dead_letter {
                self.client.create_topic(dlq).await.unwrap();
            }
            self.client.create_subscription(&spec).await.unwrap();
        });
    }

    /// Create a plain subscription `name` on `topic`.
    pub fn subscribe(&self, name: &str, topic: &str) {
        self.rt
            .block_on(
                self.client
                    .create_subscription(&SubscriptionSpec::new(name, topic)),
            )
            .unwrap();
    }

    /// Publish `msgs` to `topic`; their ids.
    pub fn publish(&self, topic: &str, msgs: &[Message]) -> Vec<String> {
        self.rt.block_on(self.client.publish(topic, msgs)).unwrap()
    }

    /// `n` numbered messages of `size` bytes published to the `events` topic; their ids.
    pub fn publish_n(&self, n: usize, size: usize) -> Vec<String> {
        self.publish(
            &topic("events"),
            &(0..n)
                .map(|i| numbered_message(i, size))
                .collect::<Vec<_>>(),
        )
    }

    /// Everything a subscription delivers within `window`, acked. Panics when the subscription
    /// cannot be read (see [`PubsubEnv::try_drain`]): "nothing delivered" must not pass for a
    /// subscription that is gone.
    pub fn drain(&self, subscription: &str, window: Duration) -> Vec<Message> {
        self.try_drain(subscription, window)
            .unwrap_or_else(|e| panic!("draining {subscription}: {e}"))
    }

    /// Everything a subscription delivers within `window`, acked; an error when the source fails
    /// (a missing subscription, a refused stream) or ends before the window is over.
    pub fn try_drain(&self, subscription: &str, window: Duration) -> Result<Vec<Message>, String> {
        self.rt.block_on(async {
            let mut s = PubsubSettings::new(subscription);
            s.stream_ack_deadline = Duration::from_secs(30);
            let mut src = PubsubSource::start(self.client.clone(), s).map_err(|e| e.to_string())?;
            let until = tokio::time::Instant::now() + window;
            let mut out = Vec::new();
            let mut failed = None;
            loop {
                match tokio::time::timeout_at(until, src.next()).await {
                    Err(_) => break,
                    Ok(None) => {
                        failed = Some("the source ended before the window was over".to_string());
                        break;
                    }
                    Ok(Some(SourceEvent::Failed(why))) => {
                        failed = Some(format!("the source failed: {why}"));
                        break;
                    }
                    Ok(Some(SourceEvent::Messages(batch))) => {
                        let ids: Vec<String> = batch
                            .iter()
                            .filter_map(|r| r.receipt.ack_id.clone())
                            .collect();
                        if let Err(e) = self.client.ack(subscription, &ids).await {
                            failed = Some(format!("ack: {e}"));
                            break;
                        }
                        out.extend(batch.into_iter().map(|r| r.msg));
                    }
                    Ok(Some(SourceEvent::Bad(_))) => {}
                }
            }
            src.stop();
            match failed {
                Some(why) => Err(why),
                None => Ok(out),
            }
        })
    }

    /// Drain `subscription` in windows of 2 s until it gives something, within `limit`.
    pub fn drain_until_some(&self, subscription: &str, limit: Duration) -> Vec<Message> {
        poll(limit, Duration::ZERO, || {
            let got = self.drain(subscription, Duration::from_secs(2));
            if got.is_empty() {
                Err(format!(
                    "nothing on {subscription} in {} s",
                    limit.as_secs()
                ))
            } else {
                Ok(got)
            }
        })
    }

    /// `subsink run --source pubsub` on `config`, writing into the local folder `bucket`.
    pub fn worker(&self, config: &Path, bucket: &Path, extra: &[&str]) -> Child {
        worker_at(&self.emu.host(), config, &file_url(bucket), extra, &[])
    }
}

/// `file://` URL of a local folder.
pub fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// `subsink run --source pubsub` against the Pub/Sub server at `host` (the emulator, or a proxy
/// in front of it), writing to `bucket_url`, with `env` added.
pub fn worker_at(
    host: &str,
    config: &Path,
    bucket_url: &str,
    extra: &[&str],
    env: &[(&str, String)],
) -> Child {
    subsink()
        .env("PUBSUB_EMULATOR_HOST", host)
        .env("SUBSINK_LOG", "info")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["run", "--source", "pubsub", "--subscription"])
        .arg(config)
        .arg("--bucket-url")
        .arg(bucket_url)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// [`subscription_config`] for the `archive` subscription of the `events` topic.
pub fn archive_config(dir: &Path, storage: Value, extra: Value) -> PathBuf {
    subscription_config(dir, &sub("archive"), &topic("events"), storage, extra)
}

/// A subscription config (REST JSON) writing Avro with metadata, extended limits; `storage` is
/// merged into its `cloudStorageConfig`, `extra` into the top level.
pub fn subscription_config(
    dir: &Path,
    name: &str,
    topic: &str,
    storage: Value,
    extra: Value,
) -> PathBuf {
    let mut cfg = serde_json::json!({
        "name": name,
        "topic": topic,
        "ackDeadlineSeconds": 10,
        "subsink": {"limits": "extended"},
        "cloudStorageConfig": {"bucket": "bkt", "avroConfig": {"writeMetadata": true}},
    });
    for (k, v) in storage.as_object().unwrap() {
        cfg["cloudStorageConfig"][k] = v.clone();
    }
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    let path = dir.join(format!("{}.json", name.rsplit('/').next().unwrap()));
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    path
}

/// The usual end-to-end scenario: a fresh emulator with the `archive` subscription of the
/// `events` topic, and a scratch folder holding the configs, the proxy logs and a local bucket.
pub struct Scenario {
    pub env: PubsubEnv,
    pub dir: tempfile::TempDir,
    /// `<dir>/bucket`, the local bucket (made by the worker or a watching proxy).
    pub bucket: PathBuf,
}

impl Scenario {
    /// The scenario with the subscription as `tweak` leaves its spec.
    pub fn start(tweak: impl FnOnce(&mut SubscriptionSpec)) -> Scenario {
        let env = PubsubEnv::start();
        let dir = tempfile::tempdir().unwrap();
        let mut spec = SubscriptionSpec::new(sub("archive"), topic("events"));
        tweak(&mut spec);
        env.topic_and_sub(spec);
        let bucket = dir.path().join("bucket");
        Scenario { env, dir, bucket }
    }

    /// The scenario with a 10 s ack deadline on the subscription.
    pub fn leased() -> Scenario {
        Scenario::start(|s| s.ack_deadline_seconds = 10)
    }

    /// Everything the `archive` subscription still delivers within `window`, acked.
    pub fn drain_archive(&self, window: Duration) -> Vec<Message> {
        self.env.drain(&sub("archive"), window)
    }

    /// [`archive_config`] in the scratch folder.
    pub fn config(&self, storage: Value, extra: Value) -> PathBuf {
        archive_config(self.dir.path(), storage, extra)
    }

    /// A recording proxy in front of the emulator, logging into `calls.log`; with `watch`, each
    /// ack records the objects visible in the local bucket.
    pub fn proxy(&self, watch: bool) -> PubsubProxy {
        let log = self.dir.path().join("calls.log");
        PubsubProxy::start(
            &self.env.emu.host(),
            &log,
            watch.then_some(self.bucket.as_path()),
        )
    }

    /// A worker on `config` talking to the emulator, writing into the local bucket.
    pub fn worker(&self, config: &Path, extra: &[&str]) -> Child {
        self.env.worker(config, &self.bucket, extra)
    }

    /// A worker on `config` talking to `proxy`, writing into the local bucket.
    pub fn worker_via(&self, proxy: &PubsubProxy, config: &Path, extra: &[&str]) -> Child {
        worker_at(&proxy.host(), config, &file_url(&self.bucket), extra, &[])
    }

    /// moto with the bucket `bkt` behind a recording S3 proxy (its files in the scratch folder).
    pub fn s3_store(&self) -> S3Store {
        let s3 = S3Server::start();
        s3.create_bucket("bkt");
        let proxy = S3Proxy::start(&s3, self.dir.path());
        S3Store { s3, proxy }
    }
}

/// moto with the bucket `bkt`, and the recording proxy the worker writes through.
pub struct S3Store {
    pub s3: S3Server,
    pub proxy: S3Proxy,
}

impl S3Store {
    /// A worker on `config` talking to `pubsub`, writing to `s3://bkt` through the S3 proxy.
    pub fn worker(&self, pubsub: &PubsubProxy, config: &Path, extra: &[&str]) -> Child {
        worker_at(&pubsub.host(), config, "s3://bkt", extra, &self.proxy.env())
    }
}
