//! The pipelines of `subsink serve`: one [`app::run`] per export subscription, each on its own
//! task, pulling its subscription with StreamingPull. They share the process's
//! [`Resources`] (upload slots, memory budget), its metrics registry and its health; stopping one
//! stops its pull, finalizes its open files (reason `shutdown`), makes them durable within the
//! shutdown grace and settles them.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{table_schema_of, Pipelines, StartError, StopReason, TableSchemaError, Target};
use crate::app::{self, RunConfig, SourceSpec};
use crate::config::ValidSubscription;
use crate::encode::topic::TopicSchemaSource;
use crate::ids::Clock;
use crate::pubsub::PubsubClient;
use crate::resources::Resources;
use crate::sink::registry::{self, WriterOptions};
use crate::source::pubsub::build::PubsubSpec;
use crate::source::pubsub::PubsubSettings;
use crate::summary::RunSummary;
use crate::telemetry::{Health, Metrics, PipelineTelemetry};

/// What every pipeline of the process is built with.
#[derive(Debug, Clone)]
pub struct ExporterSettings {
    /// How files are written (codec, multipart, Parquet compression, …).
    pub writer: WriterOptions,
    /// Flow control and lease of each subscription's StreamingPull (the name is set per
    /// subscription).
    pub pull: PubsubSettings,
    /// How long a stopping pipeline may spend finalizing and uploading its open files.
    pub shutdown_grace: Duration,
}

/// The running pipelines, by subscription name.
pub struct Exporter {
    client: PubsubClient,
    resources: Resources,
    metrics: Metrics,
    health: Health,
    settings: ExporterSettings,
    running: BTreeMap<String, Running>,
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<RunSummary, String>>,
}

impl Exporter {
    pub fn new(
        client: PubsubClient,
        resources: Resources,
        metrics: Metrics,
        health: Health,
        settings: ExporterSettings,
    ) -> Exporter {
        Exporter {
            client,
            resources,
            metrics,
            health,
            settings,
            running: BTreeMap::new(),
        }
    }

    /// Names of the subscriptions being exported now.
    pub fn running(&self) -> Vec<String> {
        self.running.keys().cloned().collect()
    }

    /// The output of `sub`: its bucket, or its table with the schema of the destination table
    /// (else of `--table-schemas`); written with `topic_schema`'s revisions when it uses one.
    async fn output(
        &self,
        sub: &ValidSubscription,
        target: &Target,
        topic_schema: Option<&TopicSchemaSource>,
    ) -> Result<app::SinkSpec, StartError> {
        let mut writer = self.settings.writer.clone();
        if let Some(t) = topic_schema {
            writer.topic_schema = Some(t.clone());
        } else if super::uses_topic_schema(sub) {
            return Err(StartError::Invalid(
                "useTopicSchema: the topic's schema was not read".into(),
            ));
        }
        match target {
            Target::Bucket { url } => {
                registry::storage_sink(sub, url, &writer).map_err(StartError::Invalid)
            }
            Target::Table { url, schema } => {
                let config_table = sub.bigquery.as_ref().map_or("", |b| b.table.as_str());
                let named = table_schema_of(
                    url,
                    schema.as_deref(),
                    config_table,
                    &self.settings.writer.bigquery,
                )
                .await
                .map_err(|e| match e {
                    TableSchemaError::Invalid(m) => StartError::Invalid(m),
                    TableSchemaError::Unreachable(m) => StartError::Failed(m),
                })?;
                registry::table_sink(
                    sub,
                    url,
                    named,
                    "--table-schemas DIR (DIR/PROJECT.DATASET.TABLE.json), or create the table first",
                    &writer,
                )
                .map_err(StartError::Invalid)
            }
        }
    }
}

#[async_trait::async_trait]
impl Pipelines for Exporter {
    async fn start(
        &mut self,
        sub: &ValidSubscription,
        target: &Target,
        topic_schema: Option<&TopicSchemaSource>,
    ) -> Result<(), StartError> {
        let output = self.output(sub, target, topic_schema).await?;
        let name = sub.name.clone();
        let mut pull = self.settings.pull.clone();
        pull.subscription = name.clone();
        if sub.delivery.enable_message_ordering {
            // A second stream could hand out a key's messages beside the first's.
            pull.streams = 1;
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let cfg = RunConfig {
            subscription: sub.clone(),
            // The source is the subscription itself.
            source: SourceSpec::new(PubsubSpec {
                client: Some(self.client.clone()),
                settings: pull,
            }),
            output,
            seed: None,
            clock: Clock::default(),
            resources: self.resources.clone(),
            shutdown: Some(Box::pin(async move {
                let _ = stopped.await;
            })),
            shutdown_grace: self.settings.shutdown_grace,
            telemetry: PipelineTelemetry::new(&self.metrics, &self.health, &name),
        };
        let task_name = name.clone();
        let task = tokio::spawn(async move {
            let result = app::run(cfg).await.map_err(|e| e.to_string());
            match &result {
                Ok(s) => tracing::info!(
                    subscription = %task_name,
                    received = s.messages_read,
                    written = s.messages_written,
                    acked = s.messages_acked,
                    failed_objects = s.failed_objects.len(),
                    stopped = s.stopped.as_deref().unwrap_or(""),
                    "export ended"
                ),
                Err(e) => tracing::error!(subscription = %task_name, error = %e, "export failed"),
            }
            result
        });
        self.running.insert(
            name,
            Running {
                stop: Some(stop),
                task,
            },
        );
        Ok(())
    }

    async fn stop(&mut self, name: &str, why: StopReason) {
        if let Some(mut r) = self.running.remove(name) {
            if let Some(stop) = r.stop.take() {
                let _ = stop.send(());
            }
            // The run bounds its own drain by the shutdown grace.
            let _ = (&mut r.task).await;
        }
        self.health.remove(name);
        if why == StopReason::Deleted {
            self.metrics.remove_subscription(name);
        }
    }

    async fn stop_all(&mut self, names: Vec<String>) {
        // Every pipeline drains at once: the shutdown grace holds for the process.
        for name in &names {
            if let Some(stop) = self.running.get_mut(name).and_then(|r| r.stop.take()) {
                let _ = stop.send(());
            }
        }
        for name in &names {
            self.stop(name, StopReason::Shutdown).await;
        }
    }

    fn ended(&mut self) -> Vec<String> {
        let done: Vec<String> = self
            .running
            .iter()
            .filter(|(_, r)| r.task.is_finished())
            .map(|(n, _)| n.clone())
            .collect();
        for name in &done {
            self.running.remove(name);
            self.health.remove(name);
        }
        done
    }
}
