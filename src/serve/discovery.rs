//! Discovery: a project's export subscriptions, read through the Pub/Sub admin API, each in the
//! crate's REST shape ([`from_proto`]) and validated like a config file.

use std::time::Duration;

use super::topic_schema::{
    uses_topic_schema, FetchedTopicSchema, TopicSchemaCache, TopicSchemaError,
};
use crate::config::resource::{
    format_duration, AvroConfig, BigQueryConfig, CloudStorageConfig, DeadLetterPolicy,
    ExpirationPolicy, NoWrapper, OidcToken, PushConfig, RawDuration, RawInt, RetryPolicy,
    SubsinkExtension, TableBatching, TextConfig,
};
use crate::config::{self, ConfigError, LimitsMode, Subscription, ValidSubscription};
use crate::pubsub::{proto, PubsubClient, PubsubError};

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
/// subscription's topic schema is read too ([`super::topic_schema::fetch_topic_schema`]).
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
                    paths: None,
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
        // Kept, so that validation refuses the subscription rather than run it without it.
        Some(Transform::AiInference(a)) => Some(serde_json::json!({
            "aiInference": {"endpoint": a.endpoint},
            "disabled": t.disabled,
        })),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
