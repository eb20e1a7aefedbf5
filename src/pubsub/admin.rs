//! Admin calls: topics, subscriptions and schemas — what `serve`'s discovery, tools and tests
//! need.

use std::time::Duration;

use super::client::PubsubClient;
use super::error::PubsubError;
use super::proto;

/// What [`PubsubClient::create_subscription`] creates: a pull subscription with the properties of
/// docs/contract.md §2 that tests and tools need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionSpec {
    /// `projects/{p}/subscriptions/{s}`.
    pub name: String,
    /// `projects/{p}/topics/{t}`.
    pub topic: String,
    /// 10–600 s; 0 = the server default, 10 s.
    pub ack_deadline_seconds: i32,
    pub enable_message_ordering: bool,
    /// `(dead-letter topic, max_delivery_attempts 5–100)`.
    pub dead_letter: Option<(String, i32)>,
    /// `(minimum_backoff, maximum_backoff)`, each 0–600 s.
    pub retry: Option<(Duration, Duration)>,
    /// Empty = every message. (The emulator accepts filters but does not apply them.)
    pub filter: String,
}

impl SubscriptionSpec {
    /// A plain subscription: 10 s deadline, no ordering, no dead letters, no retry policy, no filter.
    pub fn new(name: impl Into<String>, topic: impl Into<String>) -> SubscriptionSpec {
        SubscriptionSpec {
            name: name.into(),
            topic: topic.into(),
            ack_deadline_seconds: 10,
            enable_message_ordering: false,
            dead_letter: None,
            retry: None,
            filter: String::new(),
        }
    }
}

impl PubsubClient {
    /// Create topic `name` (`projects/{p}/topics/{t}`).
    pub async fn create_topic(&self, name: &str) -> Result<(), PubsubError> {
        let msg = proto::Topic {
            name: name.to_string(),
            ..Default::default()
        };
        self.unary("CreateTopic", msg, ("name", name), |r| {
            let mut c = self.publisher();
            async move { c.create_topic(r).await }
        })
        .await?;
        Ok(())
    }

    /// Delete topic `name`; its subscriptions stay, detached from it.
    pub async fn delete_topic(&self, name: &str) -> Result<(), PubsubError> {
        let msg = proto::DeleteTopicRequest {
            topic: name.to_string(),
        };
        self.unary("DeleteTopic", msg, ("topic", name), |r| {
            let mut c = self.publisher();
            async move { c.delete_topic(r).await }
        })
        .await?;
        Ok(())
    }

    /// Create a pull subscription; returns it as the server stored it.
    pub async fn create_subscription(
        &self,
        spec: &SubscriptionSpec,
    ) -> Result<proto::Subscription, PubsubError> {
        let msg = proto::Subscription {
            name: spec.name.clone(),
            topic: spec.topic.clone(),
            ack_deadline_seconds: spec.ack_deadline_seconds,
            enable_message_ordering: spec.enable_message_ordering,
            dead_letter_policy: spec.dead_letter.as_ref().map(|(topic, attempts)| {
                proto::DeadLetterPolicy {
                    dead_letter_topic: topic.clone(),
                    max_delivery_attempts: *attempts,
                }
            }),
            retry_policy: spec.retry.map(|(min, max)| proto::RetryPolicy {
                minimum_backoff: Some(proto_duration(min)),
                maximum_backoff: Some(proto_duration(max)),
            }),
            filter: spec.filter.clone(),
            ..Default::default()
        };
        self.unary("CreateSubscription", msg, ("name", &spec.name), |r| {
            let mut c = self.subscriber();
            async move { c.create_subscription(r).await }
        })
        .await
    }

    /// Read a subscription (its ack deadline, ordering, policies). Needs
    /// `pubsub.subscriptions.get`, which the plain subscriber role lacks.
    pub async fn get_subscription(&self, name: &str) -> Result<proto::Subscription, PubsubError> {
        let msg = proto::GetSubscriptionRequest {
            subscription: name.to_string(),
        };
        self.unary("GetSubscription", msg, ("subscription", name), |r| {
            let mut c = self.subscriber();
            async move { c.get_subscription(r).await }
        })
        .await
    }

    /// Does Pub/Sub answer for subscription `name` within `timeout`? A GetSubscription that
    /// succeeds, or that is refused for want of `pubsub.subscriptions.get` (PERMISSION_DENIED: the
    /// server answered, and a plain subscriber may lack that permission), says yes; no answer, an
    /// unreachable server or a missing subscription says no. The readiness probe of the
    /// StreamingPull source.
    pub async fn answers_for(&self, name: &str, timeout: Duration) -> Result<(), PubsubError> {
        let msg = proto::GetSubscriptionRequest {
            subscription: name.to_string(),
        };
        let req = self
            .request(msg, ("subscription", name), Some(timeout))
            .await?;
        let mut subscriber = self.subscriber();
        let call = subscriber.get_subscription(req);
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) if s.code() == tonic::Code::PermissionDenied => Ok(()),
            Ok(Err(s)) => Err(PubsubError::status("GetSubscription", s)),
            Err(_) => Err(PubsubError::Status {
                method: "GetSubscription",
                code: tonic::Code::DeadlineExceeded,
                message: format!("no answer within {timeout:?}"),
                retryable: true,
            }),
        }
    }

    /// Delete subscription `name`.
    pub async fn delete_subscription(&self, name: &str) -> Result<(), PubsubError> {
        let msg = proto::DeleteSubscriptionRequest {
            subscription: name.to_string(),
        };
        self.unary("DeleteSubscription", msg, ("subscription", name), |r| {
            let mut c = self.subscriber();
            async move { c.delete_subscription(r).await }
        })
        .await?;
        Ok(())
    }
}

impl PubsubClient {
    /// Read topic `name` (`projects/{p}/topics/{t}`): its schema settings among the rest. Needs
    /// `pubsub.topics.get`.
    pub async fn get_topic(&self, name: &str) -> Result<proto::Topic, PubsubError> {
        let msg = proto::GetTopicRequest {
            topic: name.to_string(),
        };
        self.unary("GetTopic", msg, ("topic", name), |r| {
            let mut c = self.publisher();
            async move { c.get_topic(r).await }
        })
        .await
    }

    /// Schema `name` (`projects/{p}/schemas/{s}`, or `…@{revision}` for one revision), its
    /// definition included (needs `pubsub.schemas.get`).
    pub async fn get_schema(&self, name: &str) -> Result<proto::Schema, PubsubError> {
        let msg = proto::GetSchemaRequest {
            name: name.to_string(),
            view: proto::SchemaView::Full as i32,
        };
        self.unary("GetSchema", msg, ("name", name), |r| {
            let mut c = self.schemas();
            async move { c.get_schema(r).await }
        })
        .await
    }

    /// Every revision of schema `name` (`projects/{p}/schemas/{s}`), definitions included, all
    /// pages of `ListSchemaRevisions` (needs `pubsub.schemas.listRevisions`). Used by `serve` for
    /// `useTopicSchema` subscriptions.
    pub async fn list_schema_revisions(
        &self,
        name: &str,
    ) -> Result<Vec<proto::Schema>, PubsubError> {
        let mut out = Vec::new();
        let mut page_token = String::new();
        loop {
            let msg = proto::ListSchemaRevisionsRequest {
                name: name.to_string(),
                view: proto::SchemaView::Full as i32,
                page_size: 100,
                page_token: page_token.clone(),
            };
            let resp = self
                .unary("ListSchemaRevisions", msg, ("name", name), |r| {
                    let mut c = self.schemas();
                    async move { c.list_schema_revisions(r).await }
                })
                .await?;
            out.extend(resp.schemas);
            if resp.next_page_token.is_empty() {
                return Ok(out);
            }
            page_token = resp.next_page_token;
        }
    }
}

impl PubsubClient {
    /// Every subscription of `project` (`my-project` or `projects/my-project`), all pages of
    /// `ListSubscriptions` (needs `pubsub.subscriptions.list`). Used by `serve` to discover
    /// export subscriptions.
    pub async fn list_subscriptions(
        &self,
        project: &str,
    ) -> Result<Vec<proto::Subscription>, PubsubError> {
        let project = if project.starts_with("projects/") {
            project.to_string()
        } else {
            format!("projects/{project}")
        };
        let mut out = Vec::new();
        let mut page_token = String::new();
        loop {
            let msg = proto::ListSubscriptionsRequest {
                project: project.clone(),
                page_size: 1000,
                page_token: page_token.clone(),
            };
            let resp = self
                .unary("ListSubscriptions", msg, ("project", &project), |r| {
                    let mut c = self.subscriber();
                    async move { c.list_subscriptions(r).await }
                })
                .await?;
            out.extend(resp.subscriptions);
            if resp.next_page_token.is_empty() {
                return Ok(out);
            }
            page_token = resp.next_page_token;
        }
    }
}

fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}
