//! The discovery loop: compare each discovery with the last ([`diff`]) and start, restart and
//! stop one pipeline per export subscription ([`Pipelines`]).

use std::collections::BTreeMap;
use std::time::Duration;

use super::discovery::{discover_cached, Discovered, Seen};
use super::targets::{Target, Targets};
use super::topic_schema::{TopicSchemaCache, TopicSchemaError};
use crate::config::resource::TableBatching;
use crate::config::{ConfigError, LimitsMode, ValidSubscription};
use crate::encode::topic::TopicSchemaSource;
use crate::pubsub::PubsubClient;

/// What changed between two discoveries, by subscription name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub created: Vec<String>,
    /// Any field of the resource differs: the pipeline restarts with the new settings.
    pub changed: Vec<String>,
    /// Gone: the pipeline finalizes its files and stops.
    pub deleted: Vec<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.created.is_empty() && self.changed.is_empty() && self.deleted.is_empty()
    }
}

/// Compare the running set (`before`) with a new discovery (`now`).
pub fn diff(before: &BTreeMap<String, Seen>, now: &[Discovered]) -> Changes {
    let mut c = Changes::default();
    let now_names: BTreeMap<&str, &Discovered> = now.iter().map(|d| (d.name.as_str(), d)).collect();
    for (name, d) in &now_names {
        match before.get(*name) {
            None => c.created.push(name.to_string()),
            // Pub/Sub could not be asked for the topic's schema this time: nothing is known to
            // have changed, so a running export goes on (it used to be restarted by the blip).
            Some(_) if matches!(d.topic_schema, Some(Err(TopicSchemaError::Unreachable(_)))) => {}
            Some(old) if *old != d.seen() => c.changed.push(name.to_string()),
            Some(_) => {}
        }
    }
    for name in before.keys() {
        if !now_names.contains_key(name.as_str()) {
            c.deleted.push(name.clone());
        }
    }
    c
}

/// Starts and stops one export pipeline per subscription; what `serve` runs on top of
/// [`supervise`]. Implementations spawn the pipeline (its own task) in `start` and return at once.
#[async_trait::async_trait]
pub trait Pipelines: Send {
    /// Start exporting `sub` to `target`, with its topic's schema when it uses one.
    /// [`StartError::Invalid`] is logged once and waits for the subscription to change;
    /// [`StartError::Failed`] is retried at the next discovery.
    async fn start(
        &mut self,
        sub: &ValidSubscription,
        target: &Target,
        topic_schema: Option<&TopicSchemaSource>,
    ) -> Result<(), StartError>;
    /// Stop the pipeline of subscription `name`: stop pulling, finalize and upload its open files,
    /// settle, and return when it is done.
    async fn stop(&mut self, name: &str, why: StopReason);
    /// Pipelines that ended by themselves since the last call (their source failed, the
    /// subscription vanished): they are started again when the next discovery still lists them.
    fn ended(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// Stop every pipeline in `names` (the process shuts down).
    async fn stop_all(&mut self, names: Vec<String>) {
        for name in &names {
            self.stop(name, StopReason::Shutdown).await;
        }
    }
}

/// Why [`Pipelines::start`] did not start a pipeline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// Its settings cannot be exported as they are (a table schema that does not fit, a format
    /// option serve cannot give): not retried until the subscription changes.
    #[error("{0}")]
    Invalid(String),
    /// Something that may pass (the store unreachable while reading the table's schema).
    #[error("{0}")]
    Failed(String),
}

/// Why [`Pipelines::stop`] is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The subscription is gone (or no longer exports): its telemetry goes too.
    Deleted,
    /// Its settings changed: it starts again with the new ones.
    Changed,
    /// The process shuts down.
    Shutdown,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Deleted => "deleted",
            StopReason::Changed => "changed",
            StopReason::Shutdown => "shutting down",
        }
    }
}

/// How [`supervise`] discovers.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    /// `my-project` or `projects/my-project`.
    pub project: String,
    pub limits: LimitsMode,
    /// `--discover-interval` (default 10 s).
    pub interval: Duration,
    pub targets: Targets,
    /// `--table-max-duration`, `--table-max-bytes`, `--table-max-messages` for every table
    /// subscription.
    pub table_batching: Option<TableBatching>,
    /// The discovery loop's own health probe: alive while the loop turns, ready once the
    /// project's subscriptions could be listed (so a project with no export subscription is
    /// ready, and an unreachable Pub/Sub is not).
    pub probe: Option<crate::telemetry::Probe>,
}

/// `--discover-interval`'s default.
pub const DEFAULT_DISCOVER_INTERVAL: Duration = Duration::from_secs(10);

/// Run the discovery loop until `shutdown` resolves: every `interval`, list the project's export
/// subscriptions and start the new ones, restart the changed ones (stop, then start with the new
/// settings) and stop the deleted ones; on shutdown stop them all. A subscription whose config is
/// invalid (or whose target cannot be made) is logged with every violation and left alone until
/// it changes; a failed listing (Pub/Sub unreachable) is logged and retried at the next interval,
/// and the running pipelines go on.
pub async fn supervise<P: Pipelines>(
    client: &PubsubClient,
    settings: &ServeSettings,
    pipelines: &mut P,
    shutdown: impl std::future::Future<Output = ()>,
) {
    // Resources of the subscriptions handled so far (running, or rejected as invalid), so a
    // rejected one is reported once, not every interval.
    let mut known: BTreeMap<String, Seen> = BTreeMap::new();
    let mut running: std::collections::BTreeSet<String> = Default::default();
    let mut schemas = TopicSchemaCache::default();
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beat = tokio::time::interval(Duration::from_secs(1));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = beat.tick() => {
                if let Some(p) = &settings.probe {
                    p.beat();
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        // A listing can take a while (an unreachable Pub/Sub: up to a call's deadline): a
        // shutdown does not wait for it.
        let listed = tokio::select! {
            found = discover_cached(
                client,
                &settings.project,
                settings.limits,
                settings.table_batching.as_ref(),
                &mut schemas,
            ) => found,
            _ = &mut shutdown => break,
        };
        let found = match listed {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(project = %settings.project, error = %e, "cannot list subscriptions; retrying at the next interval");
                if let Some(p) = &settings.probe {
                    p.set_source_connected(false);
                }
                continue;
            }
        };
        if let Some(p) = &settings.probe {
            // Listing works: discovery is ready (it writes nothing, so its destination is).
            p.set_source_connected(true);
            p.set_destination_reachable(true);
        }
        let ended = pipelines.ended();
        let changes = diff(&known, &found);
        // A pipeline that ended by itself (its source failed) starts again below, unless its
        // subscription is gone: then it is stopped as deleted (its telemetry goes).
        for name in ended {
            if !changes.deleted.contains(&name) && running.remove(&name) {
                tracing::warn!(subscription = %name, "export ended by itself; starting it again");
                known.remove(&name);
            }
        }
        for name in changes.deleted.iter().chain(&changes.changed) {
            known.remove(name);
            if running.remove(name) {
                let why = if changes.deleted.contains(name) {
                    StopReason::Deleted
                } else {
                    StopReason::Changed
                };
                tracing::info!(subscription = %name, why = why.as_str(), "stopping export");
                pipelines.stop(name, why).await;
            }
        }
        for d in &found {
            if known.contains_key(&d.name) {
                continue;
            }
            let started = match &d.config {
                Err(e) => Err(StartError::Invalid(one_line(e))),
                Ok(sub) => match (settings.targets.target(sub), &d.topic_schema) {
                    (Err(e), _) => Err(StartError::Invalid(e.to_string())),
                    (Ok(_), Some(Err(TopicSchemaError::Invalid(e)))) => {
                        Err(StartError::Invalid(e.clone()))
                    }
                    (Ok(_), Some(Err(TopicSchemaError::Unreachable(e)))) => {
                        Err(StartError::Failed(e.clone()))
                    }
                    (Ok(target), topic) => {
                        let topic = topic.as_ref().and_then(|t| t.as_ref().ok());
                        pipelines
                            .start(sub, &target, topic.map(|t| &t.source))
                            .await
                            .map(|()| target)
                    }
                },
            };
            match started {
                Ok(target) => {
                    tracing::info!(subscription = %d.name, ?target, "export started");
                    running.insert(d.name.clone());
                    known.insert(d.name.clone(), d.seen());
                }
                // Invalid ones wait for the subscription to change; failed starts retry.
                Err(StartError::Invalid(e)) => {
                    tracing::warn!(subscription = %d.name, error = %e, "not exported");
                    known.insert(d.name.clone(), d.seen());
                }
                Err(StartError::Failed(e)) => {
                    tracing::warn!(subscription = %d.name, error = %e, "cannot start export; retrying")
                }
            }
        }
    }
    for name in &running {
        tracing::info!(subscription = %name, "stopping export: shutting down");
    }
    pipelines.stop_all(running.into_iter().collect()).await;
}

/// A config error on one log line: every rule it breaks, `; `-separated.
fn one_line(e: &ConfigError) -> String {
    match e.violations() {
        [] => format!("invalid: {e}"),
        v => format!(
            "invalid, {} rule(s) broken: {}",
            v.len(),
            v.iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::discovery::{from_proto, ExportKind};
    use super::super::topic_schema::FetchedTopicSchema;
    use super::*;
    use crate::config;
    use crate::pubsub::proto;

    #[test]
    fn diff_sees_created_changed_and_deleted() {
        let mk = |name: &str, prefix: &str| {
            let p = proto::Subscription {
                name: name.into(),
                topic: "projects/p/topics/t".into(),
                cloud_storage_config: Some(proto::CloudStorageConfig {
                    bucket: "b".into(),
                    filename_prefix: prefix.into(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let resource = from_proto(&p);
            Discovered {
                name: name.into(),
                kind: ExportKind::Storage,
                config: config::validate(&resource, None),
                resource,
                topic_schema: None,
            }
        };
        let before: BTreeMap<String, Seen> = [mk("a", "x/"), mk("b", "y/")]
            .into_iter()
            .map(|d| (d.name.clone(), d.seen()))
            .collect();
        let now = [mk("b", "z/"), mk("c", "x/")];
        assert_eq!(
            diff(&before, &now),
            Changes {
                created: vec!["c".into()],
                changed: vec!["b".into()],
                deleted: vec!["a".into()],
            }
        );
        let same: Vec<Discovered> = vec![mk("a", "x/"), mk("b", "y/")];
        assert!(diff(&before, &same).is_empty());
    }

    /// A topic schema Pub/Sub could not be read this time is no change (the export goes on); one
    /// read with other settings, or now refused, is.
    #[test]
    fn diff_keeps_an_export_whose_topic_schema_could_not_be_read() {
        let mk = |topic_schema: Result<(), TopicSchemaError>| {
            let p = proto::Subscription {
                name: "projects/p/subscriptions/a".into(),
                topic: "projects/p/topics/t".into(),
                cloud_storage_config: Some(proto::CloudStorageConfig {
                    bucket: "b".into(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let resource = from_proto(&p);
            Discovered {
                name: p.name,
                kind: ExportKind::Storage,
                config: config::validate(&resource, None),
                resource,
                topic_schema: Some(topic_schema.map(|()| FetchedTopicSchema {
                    source: TopicSchemaSource::File(std::path::PathBuf::from("s.avsc")),
                    settings: vec!["projects/p/schemas/s".into(), "Json".into()],
                })),
            }
        };
        let before: BTreeMap<String, Seen> = [mk(Ok(()))]
            .into_iter()
            .map(|d| (d.name.clone(), d.seen()))
            .collect();
        let blip = mk(Err(TopicSchemaError::Unreachable("unavailable".into())));
        assert!(diff(&before, &[blip]).is_empty());
        let refused = mk(Err(TopicSchemaError::Invalid("no schema".into())));
        assert_eq!(
            diff(&before, &[refused]).changed,
            vec!["projects/p/subscriptions/a".to_string()]
        );
    }
}
