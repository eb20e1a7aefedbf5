//! `subsink serve` groundwork: discover a project's export subscriptions through the Pub/Sub admin
//! API and turn each into what one pipeline needs — the validated subscription and the URL of its
//! bucket or table.
//!
//! 1. [`discover`] lists every subscription of the project (`ListSubscriptions`, all pages) and
//!    keeps those with a `cloudStorageConfig` or a `bigqueryConfig`; each is converted into the
//!    crate's REST-shaped [`Subscription`] ([`from_proto`]) and validated like a config file, so a
//!    subscription subsink cannot honour is reported with every violated rule instead of run.
//! 2. [`Targets`] maps a bucket to a URL with `--bucket-url-template` (`{bucket}`) and a table with
//!    `--table-url-template` (`{project}`, `{dataset}`, `{table}`); a table's schema file comes
//!    from `--table-schemas DIR` (`PROJECT.DATASET.TABLE.json`) when it is there.
//! 3. [`diff`] compares two discoveries: what was created, changed (any field of the resource) and
//!    deleted, for the `--discover-interval` loop ([`supervise`]) to start, restart and stop
//!    pipelines.
//! 4. [`Exporter`] is what `subsink serve` plugs into that loop: one [`crate::app::run`] per
//!    subscription on its own task, pulling it with StreamingPull, all of them sharing one
//!    [`crate::resources::Resources`] (upload slots, memory budget), one metrics registry and one
//!    health (label / probe `subscription`).
//!
//! The emulator (`PUBSUB_EMULATOR_HOST`) stores both export configs and returns them here although
//! it exports nothing itself: this is what lets subsink stand in for the export there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::resource::{
    format_duration, AvroConfig, BigQueryConfig, CloudStorageConfig, DeadLetterPolicy,
    ExpirationPolicy, NoWrapper, OidcToken, PushConfig, RawDuration, RawInt, RetryPolicy,
    SubsinkExtension, TableBatching, TextConfig,
};
use crate::config::{self, ConfigError, LimitsMode, Subscription, ValidSubscription};
use crate::encode::topic::TopicSchemaSource;
use crate::pubsub::{proto, PubsubClient, PubsubError};

mod exporter;
mod table_schema;
mod topic_schema;

pub use exporter::{Exporter, ExporterSettings};
pub use table_schema::{table_schema_of, TableSchemaError};
pub use topic_schema::{
    fetch_topic_schema, uses_topic_schema, FetchedTopicSchema, TopicSchemaCache, TopicSchemaError,
};

/// What a discovered subscription exports to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportKind {
    /// `cloudStorageConfig`: objects in a bucket.
    Storage,
    /// `bigqueryConfig`: rows in a table.
    Table,
}

/// One export subscription as Pub/Sub describes it.
#[derive(Debug)]
pub struct Discovered {
    /// `projects/{p}/subscriptions/{s}`.
    pub name: String,
    pub kind: ExportKind,
    /// The resource in REST shape, as `gcloud … describe --format=json` would print it.
    pub resource: Subscription,
    /// The resource validated; `Err` lists every rule it breaks (it is then not run).
    pub config: Result<ValidSubscription, ConfigError>,
    /// With `useTopicSchema` (and a valid config): the topic's schema revisions, read from Pub/Sub.
    pub topic_schema: Option<Result<FetchedTopicSchema, TopicSchemaError>>,
}

impl Discovered {
    /// What discovery compares to see that a subscription changed: its resource, and its
    /// topic's schema settings (or why it has none). New revisions are not a change: they are
    /// read when their first message comes.
    pub fn seen(&self) -> Seen {
        Seen {
            resource: self.resource.clone(),
            topic_schema: self.topic_schema.as_ref().map(|t| match t {
                Ok(f) => f.settings.clone(),
                Err(e) => vec![e.to_string()],
            }),
        }
    }
}

/// A subscription as discovery last saw it: see [`Discovered::seen`].
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub resource: Subscription,
    pub topic_schema: Option<Vec<String>>,
}

/// Every export subscription of `project` (`my-project` or `projects/my-project`), in name order.
/// Pull and push subscriptions are left out. `limits` validates them as a config file would.
pub async fn discover(
    client: &PubsubClient,
    project: &str,
    limits: LimitsMode,
) -> Result<Vec<Discovered>, PubsubError> {
    discover_with(client, project, limits, None).await
}

/// [`discover`], with the table writer's batching (`subsink.table`, which a BigQuery subscription
/// has no field for) set on every subscription before it is validated. A valid `useTopicSchema`
/// subscription's topic schema is read too ([`fetch_topic_schema`]).
pub async fn discover_with(
    client: &PubsubClient,
    project: &str,
    limits: LimitsMode,
    table_batching: Option<&TableBatching>,
) -> Result<Vec<Discovered>, PubsubError> {
    let mut schemas = TopicSchemaCache::default();
    discover_cached(client, project, limits, table_batching, &mut schemas).await
}

/// [`discover_with`], with the topic schemas read by earlier discoveries in `schemas`: a topic's
/// revisions are listed again only when its schema settings changed ([`TopicSchemaCache`]).
pub async fn discover_cached(
    client: &PubsubClient,
    project: &str,
    limits: LimitsMode,
    table_batching: Option<&TableBatching>,
    schemas: &mut TopicSchemaCache,
) -> Result<Vec<Discovered>, PubsubError> {
    let mut out: Vec<Discovered> = client
        .list_subscriptions(project)
        .await?
        .into_iter()
        .filter_map(|p| {
            let kind = if p.cloud_storage_config.is_some() {
                ExportKind::Storage
            } else if p.bigquery_config.is_some() {
                ExportKind::Table
            } else {
                return None;
            };
            let mut resource = from_proto(&p);
            if let (Some(t), true) = (table_batching, p.bigquery_config.is_some()) {
                resource.subsink = Some(SubsinkExtension {
                    limits: None,
                    table: Some(t.clone()),
                });
            }
            let config = config::validate(&resource, Some(limits));
            Some(Discovered {
                name: p.name,
                kind,
                resource,
                config,
                topic_schema: None,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    schemas.begin();
    for d in &mut out {
        if let Ok(sub) = &d.config {
            if uses_topic_schema(sub) {
                d.topic_schema = Some(schemas.get(client, &sub.topic).await);
            }
        }
    }
    schemas.end();
    Ok(out)
}

fn duration(d: &Option<prost_types::Duration>) -> Option<RawDuration> {
    d.as_ref().map(|d| {
        RawDuration(format_duration(Duration::new(
            d.seconds.max(0) as u64,
            d.nanos.max(0) as u32,
        )))
    })
}

/// A number the REST form omits when it is 0 (unset).
fn int(n: i64) -> Option<RawInt> {
    (n != 0).then(|| RawInt(n.to_string()))
}

/// The gRPC resource in the REST shape [`config::validate()`] takes: the mapping `gcloud` applies
/// (unset scalars omitted, durations as `"300s"`, int64 as strings). Output-only states are
/// dropped; message transforms are kept as their REST JSON.
pub fn from_proto(p: &proto::Subscription) -> Subscription {
    use proto::cloud_storage_config::OutputFormat;
    use proto::push_config::{AuthenticationMethod, Wrapper};
    let push_config = p
        .push_config
        .as_ref()
        .filter(|c| !c.push_endpoint.is_empty())
        .map(|c| PushConfig {
            push_endpoint: c.push_endpoint.clone(),
            attributes: c.attributes.clone().into_iter().collect(),
            oidc_token: c.authentication_method.as_ref().map(
                |AuthenticationMethod::OidcToken(t)| OidcToken {
                    service_account_email: t.service_account_email.clone(),
                    audience: t.audience.clone(),
                },
            ),
            pubsub_wrapper: match &c.wrapper {
                Some(Wrapper::PubsubWrapper(_)) => Some(serde_json::json!({})),
                _ => None,
            },
            no_wrapper: match &c.wrapper {
                Some(Wrapper::NoWrapper(w)) => Some(NoWrapper {
                    write_metadata: w.write_metadata,
                }),
                _ => None,
            },
        });
    let bigquery_config = p.bigquery_config.as_ref().map(|b| BigQueryConfig {
        table: b.table.clone(),
        use_topic_schema: b.use_topic_schema,
        use_table_schema: b.use_table_schema,
        write_metadata: b.write_metadata,
        drop_unknown_fields: b.drop_unknown_fields,
        service_account_email: b.service_account_email.clone(),
        state: None,
    });
    let cloud_storage_config = p.cloud_storage_config.as_ref().map(|c| {
        let (text_config, avro_config) = match &c.output_format {
            Some(OutputFormat::TextConfig(_)) => (Some(TextConfig {}), None),
            Some(OutputFormat::AvroConfig(a)) => (
                None,
                Some(AvroConfig {
                    write_metadata: a.write_metadata,
                    use_topic_schema: a.use_topic_schema,
                }),
            ),
            None => (None, None),
        };
        CloudStorageConfig {
            bucket: c.bucket.clone(),
            filename_prefix: c.filename_prefix.clone(),
            filename_suffix: c.filename_suffix.clone(),
            filename_datetime_format: c.filename_datetime_format.clone(),
            text_config,
            avro_config,
            max_duration: duration(&c.max_duration),
            max_bytes: int(c.max_bytes),
            max_messages: int(c.max_messages),
            state: None,
            service_account_email: c.service_account_email.clone(),
        }
    });
    Subscription {
        name: p.name.clone(),
        topic: p.topic.clone(),
        push_config,
        bigquery_config,
        cloud_storage_config,
        ack_deadline_seconds: int(i64::from(p.ack_deadline_seconds)),
        retain_acked_messages: p.retain_acked_messages,
        message_retention_duration: duration(&p.message_retention_duration),
        labels: p.labels.clone().into_iter().collect(),
        enable_message_ordering: p.enable_message_ordering,
        expiration_policy: p.expiration_policy.as_ref().map(|e| ExpirationPolicy {
            ttl: duration(&e.ttl),
        }),
        filter: p.filter.clone(),
        dead_letter_policy: p.dead_letter_policy.as_ref().map(|d| DeadLetterPolicy {
            dead_letter_topic: d.dead_letter_topic.clone(),
            max_delivery_attempts: int(i64::from(d.max_delivery_attempts)),
        }),
        retry_policy: p.retry_policy.as_ref().map(|r| RetryPolicy {
            minimum_backoff: duration(&r.minimum_backoff),
            maximum_backoff: duration(&r.maximum_backoff),
        }),
        detached: p.detached,
        enable_exactly_once_delivery: p.enable_exactly_once_delivery,
        topic_message_retention_duration: None,
        state: None,
        analytics_hub_subscription_info: None,
        message_transforms: p.message_transforms.iter().filter_map(transform).collect(),
        tags: Default::default(),
        subsink: None,
    }
}

fn transform(t: &proto::MessageTransform) -> Option<serde_json::Value> {
    use proto::message_transform::Transform;
    match &t.transform {
        Some(Transform::JavascriptUdf(u)) => Some(serde_json::json!({
            "javascriptUdf": {"functionName": u.function_name, "code": u.code},
            "disabled": t.disabled,
        })),
        _ => None,
    }
}

// ------------------------------------------------------------------------------------------------
// URL templates

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("{flag} {template:?}: unknown placeholder {{{name}}}; it may use {allowed}")]
    Unknown {
        flag: &'static str,
        template: String,
        name: String,
        allowed: String,
    },
    #[error("{flag} {template:?}: unbalanced brace at position {position}")]
    Brace {
        flag: &'static str,
        template: String,
        position: usize,
    },
    #[error("{flag} {template:?}: never uses {needed}, so every {what} would map to one place")]
    Constant {
        flag: &'static str,
        template: String,
        needed: &'static str,
        what: &'static str,
    },
    #[error(
        "bigqueryConfig.table {table:?}: expected PROJECT.DATASET.TABLE (or PROJECT:DATASET.TABLE)"
    )]
    Table { table: String },
}

/// A URL with `{name}` placeholders, checked once at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlTemplate {
    text: String,
}

impl UrlTemplate {
    /// The template as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Parse `text`: braces balanced, every placeholder in `allowed`, at least one of `allowed`
    /// used (a constant template would send every subscription to the same place).
    pub fn parse(
        flag: &'static str,
        text: &str,
        allowed: &[&'static str],
        what: &'static str,
    ) -> Result<UrlTemplate, TemplateError> {
        let mut used = 0;
        let mut rest = text;
        let mut pos = 0;
        while let Some(i) = rest.find(['{', '}']) {
            if rest.as_bytes()[i] == b'}' {
                return Err(TemplateError::Brace {
                    flag,
                    template: text.into(),
                    position: pos + i,
                });
            }
            let close = rest[i..].find('}').ok_or(TemplateError::Brace {
                flag,
                template: text.into(),
                position: pos + i,
            })?;
            let name = &rest[i + 1..i + close];
            if !allowed.contains(&name) {
                return Err(TemplateError::Unknown {
                    flag,
                    template: text.into(),
                    name: name.into(),
                    allowed: allowed
                        .iter()
                        .map(|a| format!("{{{a}}}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            used += 1;
            pos += i + close + 1;
            rest = &rest[i + close + 1..];
        }
        if used == 0 {
            return Err(TemplateError::Constant {
                flag,
                template: text.into(),
                needed: allowed.first().copied().unwrap_or(""),
                what,
            });
        }
        Ok(UrlTemplate { text: text.into() })
    }

    /// Substitute each `{name}` by its value, percent-encoded outside `A-Z a-z 0-9 - . _ ~` so
    /// a name never adds a path segment or breaks the URL.
    pub fn expand(&self, vars: &[(&str, &str)]) -> String {
        let mut out = self.text.clone();
        for (name, value) in vars {
            out = out.replace(&format!("{{{name}}}"), &encode(value));
        }
        out
    }
}

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `PROJECT.DATASET.TABLE` or `PROJECT:DATASET.TABLE` (the project may hold a domain:
/// `example.com:proj`) → its three parts.
pub fn split_table(table: &str) -> Result<(String, String, String), TemplateError> {
    let bad = || TemplateError::Table {
        table: table.into(),
    };
    let (project, rest) = match table.rfind(':') {
        Some(i) => (&table[..i], &table[i + 1..]),
        None => {
            let mut parts = table.rsplitn(3, '.');
            let (t, d, p) = (
                parts.next().ok_or_else(bad)?,
                parts.next().ok_or_else(bad)?,
                parts.next().ok_or_else(bad)?,
            );
            if [p, d, t].iter().any(|s| s.is_empty()) {
                return Err(bad());
            }
            return Ok((p.into(), d.into(), t.into()));
        }
    };
    let (dataset, t) = rest.split_once('.').ok_or_else(bad)?;
    if [project, dataset, t].iter().any(|s| s.is_empty()) || t.contains('.') {
        return Err(bad());
    }
    Ok((project.into(), dataset.into(), t.into()))
}

/// Where discovered subscriptions write: the two templates and the schema folder.
#[derive(Debug, Clone)]
pub struct Targets {
    pub bucket_url: UrlTemplate,
    pub table_url: UrlTemplate,
    /// `--table-schemas DIR`: `PROJECT.DATASET.TABLE.json` files in BigQuery's JSON schema format.
    pub table_schemas: Option<PathBuf>,
}

/// Where one subscription writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Bucket {
        url: String,
    },
    Table {
        url: String,
        /// The table's schema file, when `--table-schemas` has one for it.
        schema: Option<PathBuf>,
    },
}

impl Targets {
    pub const BUCKET_FLAG: &'static str = "--bucket-url-template";
    pub const TABLE_FLAG: &'static str = "--table-url-template";

    /// Parse the two templates (`file:///data/{bucket}`, `s3://{bucket}`;
    /// `s3://lake/{project}/{dataset}/{table}`).
    pub fn new(
        bucket_url: &str,
        table_url: &str,
        table_schemas: Option<PathBuf>,
    ) -> Result<Targets, TemplateError> {
        Ok(Targets {
            bucket_url: UrlTemplate::parse(Self::BUCKET_FLAG, bucket_url, &["bucket"], "bucket")?,
            table_url: UrlTemplate::parse(
                Self::TABLE_FLAG,
                table_url,
                &["table", "dataset", "project"],
                "table",
            )?,
            table_schemas,
        })
    }

    /// Local defaults, like `run`'s: `<dir>/buckets/{bucket}` and
    /// `<dir>/tables/{project}.{dataset}.{table}`.
    pub fn local(dir: &Path) -> Targets {
        let base = url::Url::from_directory_path(dir)
            .map(|u| u.to_string())
            .unwrap_or_else(|_| format!("file://{}/", dir.display()));
        Targets::new(
            &format!("{base}buckets/{{bucket}}"),
            &format!("{base}tables/{{project}}.{{dataset}}.{{table}}"),
            None,
        )
        .expect("valid default templates")
    }

    /// The destination of a validated subscription.
    pub fn target(&self, sub: &ValidSubscription) -> Result<Target, TemplateError> {
        if let Some(bq) = &sub.bigquery {
            let (project, dataset, table) = split_table(&bq.table)?;
            let url = self.table_url.expand(&[
                ("project", &project),
                ("dataset", &dataset),
                ("table", &table),
            ]);
            let schema = self
                .table_schemas
                .as_ref()
                .map(|d| d.join(format!("{project}.{dataset}.{table}.json")))
                .filter(|p| p.is_file());
            return Ok(Target::Table { url, schema });
        }
        let bucket = sub
            .storage
            .as_ref()
            .map(|s| s.bucket.as_str())
            .unwrap_or_default();
        Ok(Target::Bucket {
            url: self.bucket_url.expand(&[("bucket", bucket)]),
        })
    }
}

// ------------------------------------------------------------------------------------------------
// Changes between discoveries

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

// ------------------------------------------------------------------------------------------------
// The discovery loop

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
        let found = match discover_cached(
            client,
            &settings.project,
            settings.limits,
            settings.table_batching.as_ref(),
            &mut schemas,
        )
        .await
        {
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
    use super::*;

    #[test]
    fn templates_expand_and_reject_mistakes() {
        let t = Targets::new(
            "s3://{bucket}",
            "file:///lake/{project}/{dataset}/{table}",
            None,
        )
        .unwrap();
        assert_eq!(t.bucket_url.expand(&[("bucket", "my-bkt")]), "s3://my-bkt");
        assert_eq!(
            t.table_url
                .expand(&[("project", "p"), ("dataset", "d"), ("table", "events/x y")]),
            "file:///lake/p/d/events%2Fx%20y"
        );
        assert!(matches!(
            UrlTemplate::parse(
                "--bucket-url-template",
                "s3://{bukket}",
                &["bucket"],
                "bucket"
            ),
            Err(TemplateError::Unknown { .. })
        ));
        assert!(matches!(
            UrlTemplate::parse(
                "--bucket-url-template",
                "s3://{bucket",
                &["bucket"],
                "bucket"
            ),
            Err(TemplateError::Brace { position: 5, .. })
        ));
        let e = UrlTemplate::parse("--bucket-url-template", "s3://one", &["bucket"], "bucket")
            .unwrap_err();
        assert!(e.to_string().contains("never uses bucket"), "{e}");
    }

    #[test]
    fn table_names_split_in_both_forms() {
        let t = |s: &str| split_table(s).map(|(p, d, t)| format!("{p}|{d}|{t}"));
        assert_eq!(t("proj.ds.events").unwrap(), "proj|ds|events");
        assert_eq!(t("proj:ds.events").unwrap(), "proj|ds|events");
        assert_eq!(
            t("example.com:proj:ds.events").unwrap(),
            "example.com:proj|ds|events"
        );
        assert!(t("ds.events").is_err());
        assert!(t("proj:ds").is_err());
        assert!(t("a..b").is_err());
    }

    #[test]
    fn proto_to_rest_shape_validates() {
        use proto::cloud_storage_config::{AvroConfig as PAvro, OutputFormat};
        let p = proto::Subscription {
            name: "projects/proj/subscriptions/sub".into(),
            topic: "projects/proj/topics/top".into(),
            ack_deadline_seconds: 30,
            push_config: Some(proto::PushConfig::default()),
            cloud_storage_config: Some(proto::CloudStorageConfig {
                bucket: "bkt".into(),
                filename_prefix: "x/".into(),
                filename_suffix: ".avro".into(),
                max_duration: Some(prost_types::Duration {
                    seconds: 90,
                    nanos: 0,
                }),
                max_bytes: 5_000_000,
                output_format: Some(OutputFormat::AvroConfig(PAvro {
                    write_metadata: true,
                    use_topic_schema: false,
                })),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = from_proto(&p);
        assert_eq!(r.push_config, None, "an empty push config means pull");
        let v = config::validate(&r, Some(LimitsMode::Pubsub)).unwrap();
        let s = v.storage.unwrap();
        assert_eq!(s.bucket, "bkt");
        assert_eq!(s.max_duration, Duration::from_secs(90));
        assert_eq!(s.max_bytes, Some(5_000_000));
        assert_eq!(s.max_messages, None);
        assert_eq!(
            s.output,
            config::OutputFormat::Avro {
                write_metadata: true,
                use_topic_schema: false
            }
        );
        assert_eq!(v.delivery.ack_deadline, Duration::from_secs(30));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["cloudStorageConfig"]["maxDuration"], "90s");
        assert_eq!(json["cloudStorageConfig"]["maxBytes"], "5000000");
    }

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
