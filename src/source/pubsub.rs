//! Google Cloud Pub/Sub over gRPC: a StreamingPull source, and the unary calls a worker (and its
//! tests) need — Acknowledge, ModifyAckDeadline, Publish and a little admin.
//!
//! ## Who settles a message
//! Nothing here acks, nacks or extends a message on its own: no lease manager, no auto-ack. A
//! message handed out by [`PubsubSource`] stays outstanding until the caller settles it with
//! [`PubsubClient::ack`] or [`PubsubClient::modify_ack_deadline`] (0 s = nack). Until then the
//! server redelivers it once its deadline passes — [`PubsubSettings::stream_ack_deadline`] from
//! delivery, or whatever the last ModifyAckDeadline set (docs/contract.md §2.4). A caller that holds messages
//! longer (an open file) must extend them itself.
//!
//! ## Flow control
//! `max_outstanding_messages` / `max_outstanding_bytes` go to the server in the first
//! `StreamingPullRequest` of every stream: the server stops sending once that many messages (or
//! bytes) are delivered and not yet acked, nacked or expired. The same `client_id` is sent on every
//! reconnect so the server keeps counting the messages of earlier streams. The server may overshoot
//! by part of one response. The emulator (0.8.20) ignores both limits: each stream gets one
//! response of at most 100 messages every 50 ms (its pusher pulls 1000, its backlog hands out 100
//! per pull), about 2,000 messages a second per stream, whoever reads it. There the only bound is
//! this side's: the pull tasks stop reading their streams while 16 batches wait for
//! [`Source::next`] (`tests/pubsub_client.rs` pins both facts).
//!
//! ## Several streams
//! [`PubsubSettings::streams`] streams are open at once, each with its own pull task, client id
//! and share of the flow control, all feeding one [`Source::next`]; acks go on any open one.
//! Since the server paces every stream, this is how a worker receives more than one stream
//! delivers.
//!
//! ## Reconnecting and stopping
//! A stream that fails with a retryable status (or that the server closes, as Google does every
//! so often) is reopened after an exponential backoff, 100 ms doubling to 10 s, back to 100 ms
//! after a healthy stream; a non-retryable one (NOT_FOUND, PERMISSION_DENIED, …) ends the source
//! with [`SourceEvent::Failed`]. [`PubsubSource::stop`] half-closes every stream and reads each
//! to its end, so nothing the server already sent is lost; `next()` returns `None` after that.
//!
//! ## Connection
//! [`PubsubClient::connect`] talks to the emulator when `PUBSUB_EMULATOR_HOST` is set (plaintext,
//! no credentials), else to `pubsub.googleapis.com` over TLS with Application Default Credentials
//! — taken from `object_store`'s GCP credential chain (`GOOGLE_APPLICATION_CREDENTIALS` or the
//! other `GOOGLE_*` variables, then gcloud's well-known file, then the metadata server), so
//! storage and Pub/Sub authenticate the same way. External-account (workload identity
//! federation) and impersonated credential files are not supported by that chain.
//!
//! The gRPC stubs are `googleapis-tonic-google-pubsub-v1` on tonic; [`proto`] re-exports them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::gcp::{GcpCredentialProvider, GoogleCloudStorageBuilder};
use tokio::sync::{mpsc, watch};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::{Source, SourceEvent};
use crate::message::{Message, Receipt, Received};

/// The generated Pub/Sub v1 messages and clients (`data` is `Bytes`, maps are `BTreeMap`s).
pub use googleapis_tonic_google_pubsub_v1::google::pubsub::v1 as proto;
use proto::publisher_client::PublisherClient;
use proto::schema_service_client::SchemaServiceClient;
use proto::subscriber_client::SubscriberClient;

/// Google's Pub/Sub endpoint. Regional endpoints (`https://REGION-pubsub.googleapis.com`) can be
/// given to [`PubsubClient::connect_google_endpoint`].
pub const GOOGLE_ENDPOINT: &str = "https://pubsub.googleapis.com";

/// Ack ids per Acknowledge / ModifyAckDeadline request (the Go client's batch size).
pub const MAX_ACK_IDS_PER_REQUEST: usize = 2500;
/// Bytes of one Acknowledge / ModifyAckDeadline request (the Go client's `maxPayload`; the server
/// rejects requests much above it).
pub const MAX_ACK_REQUEST_BYTES: usize = 512 * 1024;
/// Messages per PublishRequest (server limit).
pub const MAX_PUBLISH_MESSAGES: usize = 1000;
/// Bytes of one PublishRequest: the server takes 10,000,000 (docs/contract.md §1.2); kept below that so the
/// estimate of the encoded size never has to be exact.
pub const MAX_PUBLISH_BYTES: usize = 9_000_000;

/// Deadline of every unary call (ack, modack, publish, admin).
const UNARY_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest gRPC message accepted from the server. A StreamingPull response holds many messages of
/// up to 10 MB each; tonic's 4 MiB default would fail the stream on the first large one.
const MAX_DECODE_BYTES: usize = 256 * 1024 * 1024;
/// An empty `StreamingPullRequest` is sent this often so idle streams are not cut by proxies
/// (what Google's client libraries do).
const STREAM_PING: Duration = Duration::from_secs(30);
/// Batches (one per StreamingPull response) buffered between the pull task and [`Source::next`].
/// Flow control bounds the messages in them; this bounds the batches.
const CHANNEL_CAPACITY: usize = 16;
/// Most StreamingPull streams one source opens.
pub const MAX_STREAMS: usize = 16;
/// Requests (acks, deadline changes, pings) queued for a stream before sending one waits.
const REQUEST_QUEUE: usize = 64;
/// Reconnect backoff: first delay, cap.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A stream that lasted this long (or delivered anything) was healthy: the backoff starts over.
const HEALTHY_AFTER: Duration = Duration::from_secs(10);
/// After a stop, how long the server has to finish the stream once its request half is closed.
const STOP_GRACE: Duration = Duration::from_secs(5);

// ------------------------------------------------------------------------------------------------
// Errors

/// A failed Pub/Sub call. [`PubsubError::retryable`] says whether the same call may succeed later;
/// it is decided where the error is made, from the gRPC status code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PubsubError {
    /// The server (or the transport) answered with a gRPC status.
    #[error("Pub/Sub {method} failed: {code:?}: {message}")]
    Status {
        method: &'static str,
        code: tonic::Code,
        message: String,
        retryable: bool,
    },
    /// Credentials could not be loaded (not retryable) or a token not obtained (retryable).
    #[error("Google credentials: {message}")]
    Auth { message: String, retryable: bool },
    /// A bad endpoint, name or setting: fix the configuration.
    #[error("Pub/Sub client setup: {0}")]
    Config(String),
    /// The server answered something the API does not allow.
    #[error("Pub/Sub {method}: unexpected response: {message}")]
    Protocol {
        method: &'static str,
        message: String,
    },
}

/// Whether a call that failed with `code` may succeed if tried again (the codes Google's client
/// libraries retry).
pub fn retryable_code(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Unavailable | DeadlineExceeded | Internal | ResourceExhausted | Aborted
    )
}

impl PubsubError {
    fn status(method: &'static str, status: tonic::Status) -> PubsubError {
        // tonic reports a broken connection as a status it makes itself, carrying the hyper/io
        // error as its source: `Unknown` ("error reading a body from connection") when a stream
        // breaks, `Cancelled` ("operation was canceled") when the connection closes before the
        // response. A status the server sent has no source. The former are transport failures,
        // as retryable as `Unavailable`.
        let transport = matches!(status.code(), tonic::Code::Unknown | tonic::Code::Cancelled)
            && std::error::Error::source(&status).is_some();
        let message = if transport {
            format!("connection failed: {}", status.message())
        } else {
            status.message().to_string()
        };
        PubsubError::Status {
            method,
            code: status.code(),
            message,
            retryable: transport || retryable_code(status.code()),
        }
    }

    /// Whether trying the same call again may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            PubsubError::Status { retryable, .. } | PubsubError::Auth { retryable, .. } => {
                *retryable
            }
            PubsubError::Config(_) | PubsubError::Protocol { .. } => false,
        }
    }

    /// The gRPC status code, when the error is one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            PubsubError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Client

/// A connection to Pub/Sub (Google or the emulator). Cheap to clone: clones share one HTTP/2
/// connection, which reconnects by itself after it breaks.
#[derive(Clone)]
pub struct PubsubClient {
    channel: Channel,
    /// `None` for the emulator, which takes no credentials.
    auth: Option<GcpCredentialProvider>,
    /// Where it points, for logs.
    target: Arc<str>,
}

impl std::fmt::Debug for PubsubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubsubClient")
            .field("target", &self.target)
            .field("auth", &self.auth.is_some())
            .finish()
    }
}

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
    /// The emulator at `PUBSUB_EMULATOR_HOST` when that is set, else Google with Application
    /// Default Credentials. Connects lazily: an unreachable server shows up as a retryable
    /// `Unavailable` error on the first call.
    pub async fn connect() -> Result<PubsubClient, PubsubError> {
        match std::env::var("PUBSUB_EMULATOR_HOST") {
            Ok(host) if !host.trim().is_empty() => Self::connect_emulator(host.trim()).await,
            _ => Self::connect_google().await,
        }
    }

    /// The emulator at `host` (`127.0.0.1:8681`): plaintext, no credentials.
    pub async fn connect_emulator(host: &str) -> Result<PubsubClient, PubsubError> {
        let url = format!("http://{host}");
        let channel = endpoint(&url)?.connect_lazy();
        Ok(PubsubClient {
            channel,
            auth: None,
            target: url.into(),
        })
    }

    /// Google's global endpoint with Application Default Credentials.
    pub async fn connect_google() -> Result<PubsubClient, PubsubError> {
        Self::connect_google_endpoint(GOOGLE_ENDPOINT).await
    }

    /// A Google endpoint (`https://…`) with Application Default Credentials.
    pub async fn connect_google_endpoint(url: &str) -> Result<PubsubClient, PubsubError> {
        let host = url::Url::parse(url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .ok_or_else(|| PubsubError::Config(format!("endpoint {url:?} is not a URL")))?;
        let tls = ClientTlsConfig::new().with_native_roots().domain_name(host);
        let channel = endpoint(url)?
            .tls_config(tls)
            .map_err(|e| PubsubError::Config(format!("TLS for {url}: {e}")))?
            .connect_lazy();
        // object_store's GCP builder resolves ADC without touching the network; the bucket name
        // is required by the builder and never used.
        let store = GoogleCloudStorageBuilder::from_env()
            .with_bucket_name("subsink-pubsub-credentials")
            .build()
            .map_err(|e| PubsubError::Auth {
                message: e.to_string(),
                retryable: false,
            })?;
        Ok(PubsubClient {
            channel,
            auth: Some(store.credentials().clone()),
            target: url.into(),
        })
    }

    /// Where this client points (`http://127.0.0.1:8681`, `https://pubsub.googleapis.com`).
    pub fn target(&self) -> &str {
        &self.target
    }

    fn subscriber(&self) -> SubscriberClient<Channel> {
        SubscriberClient::new(self.channel.clone()).max_decoding_message_size(MAX_DECODE_BYTES)
    }

    fn publisher(&self) -> PublisherClient<Channel> {
        PublisherClient::new(self.channel.clone()).max_decoding_message_size(MAX_DECODE_BYTES)
    }

    fn schemas(&self) -> SchemaServiceClient<Channel> {
        SchemaServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_DECODE_BYTES)
    }

    /// One unary call: `msg` as a request ([`Self::request`], within [`UNARY_TIMEOUT`]) sent by
    /// `call`; its answer, or the call's status as the error of `method`.
    async fn unary<M, R, Fut>(
        &self,
        method: &'static str,
        msg: M,
        routing: (&str, &str),
        call: impl FnOnce(tonic::Request<M>) -> Fut,
    ) -> Result<R, PubsubError>
    where
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let req = self.request(msg, routing, Some(UNARY_TIMEOUT)).await?;
        Ok(call(req)
            .await
            .map_err(|s| PubsubError::status(method, s))?
            .into_inner())
    }

    /// `msg` as a request: a bearer token when talking to Google, and the routing header Google's
    /// front end uses to send the call to the resource's home (`subscription=…` / `topic=…`).
    async fn request<T>(
        &self,
        msg: T,
        routing: (&str, &str),
        timeout: Option<Duration>,
    ) -> Result<tonic::Request<T>, PubsubError> {
        let mut req = tonic::Request::new(msg);
        if let Some(auth) = &self.auth {
            let cred = auth.get_credential().await.map_err(|e| PubsubError::Auth {
                message: e.to_string(),
                // Token endpoints and the metadata server fail transiently; a bad key file
                // fails at `connect`, not here.
                retryable: true,
            })?;
            let value =
                MetadataValue::try_from(format!("Bearer {}", cred.bearer)).map_err(|e| {
                    PubsubError::Auth {
                        message: format!("token is not a header value: {e}"),
                        retryable: false,
                    }
                })?;
            req.metadata_mut().insert("authorization", value);
        }
        let (key, value) = routing;
        let encoded: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
        if let Ok(v) = MetadataValue::try_from(format!("{key}={encoded}")) {
            req.metadata_mut().insert("x-goog-request-params", v);
        }
        if let Some(t) = timeout {
            req.set_timeout(t);
        }
        Ok(req)
    }

    /// Acknowledge `ack_ids`: the messages are settled and not redelivered. Sent in requests of at
    /// most [`MAX_ACK_IDS_PER_REQUEST`] ids and [`MAX_ACK_REQUEST_BYTES`], concurrently. On an
    /// error some batches may have been applied; acks are idempotent, so retrying all is safe.
    pub async fn ack(&self, subscription: &str, ack_ids: &[String]) -> Result<(), PubsubError> {
        let calls = ack_batches(subscription, ack_ids).into_iter().map(|ids| {
            let msg = proto::AcknowledgeRequest {
                subscription: subscription.to_string(),
                ack_ids: ids.to_vec(),
            };
            async move {
                self.unary("Acknowledge", msg, ("subscription", subscription), |r| {
                    let mut c = self.subscriber();
                    async move { c.acknowledge(r).await }
                })
                .await?;
                Ok::<(), PubsubError>(())
            }
        });
        futures::future::try_join_all(calls).await?;
        Ok(())
    }

    /// Set the deadline of `ack_ids` to `seconds` from now (0–600). 0 is a nack: the message is
    /// redelivered at once, or after the subscription's retry-policy backoff. A positive value
    /// extends (or shortens) the lease; the message is redelivered when it passes. Batched like
    /// [`ack`](Self::ack).
    pub async fn modify_ack_deadline(
        &self,
        subscription: &str,
        ack_ids: &[String],
        seconds: i32,
    ) -> Result<(), PubsubError> {
        let calls = ack_batches(subscription, ack_ids).into_iter().map(|ids| {
            let msg = proto::ModifyAckDeadlineRequest {
                subscription: subscription.to_string(),
                ack_ids: ids.to_vec(),
                ack_deadline_seconds: seconds,
            };
            async move {
                self.unary(
                    "ModifyAckDeadline",
                    msg,
                    ("subscription", subscription),
                    |r| {
                        let mut c = self.subscriber();
                        async move { c.modify_ack_deadline(r).await }
                    },
                )
                .await?;
                Ok::<(), PubsubError>(())
            }
        });
        futures::future::try_join_all(calls).await?;
        Ok(())
    }

    /// Publish `messages` (data, attributes, ordering key; id and publish time are the server's)
    /// to `topic` (`projects/{p}/topics/{t}`). Returns the server's message ids in input order.
    ///
    /// A PublishRequest may carry only one ordering key (docs/contract.md §1.1), so messages are grouped by
    /// key; requests of one key are sent one after another in input order (so the key's order
    /// holds), different keys and unkeyed requests concurrently. Each request holds at most
    /// [`MAX_PUBLISH_MESSAGES`] and about [`MAX_PUBLISH_BYTES`]. On an error some requests may
    /// have been published.
    pub async fn publish(
        &self,
        topic: &str,
        messages: &[Message],
    ) -> Result<Vec<String>, PubsubError> {
        let lanes = publish_plan(messages);
        let mut ids = vec![String::new(); messages.len()];
        let results: Vec<Result<Vec<(usize, String)>, PubsubError>> = futures::stream::iter(lanes)
            .map(|lane| async move {
                let mut out = Vec::new();
                for request in lane {
                    let msg = proto::PublishRequest {
                        topic: topic.to_string(),
                        messages: request.iter().map(|&i| to_proto(&messages[i])).collect(),
                    };
                    let resp = self
                        .unary("Publish", msg, ("topic", topic), |r| {
                            let mut c = self.publisher();
                            async move { c.publish(r).await }
                        })
                        .await?;
                    if resp.message_ids.len() != request.len() {
                        return Err(PubsubError::Protocol {
                            method: "Publish",
                            message: format!(
                                "{} message ids for {} messages",
                                resp.message_ids.len(),
                                request.len()
                            ),
                        });
                    }
                    out.extend(request.into_iter().zip(resp.message_ids));
                }
                Ok(out)
            })
            .buffer_unordered(8)
            .collect()
            .await;
        for r in results {
            for (i, id) in r? {
                ids[i] = id;
            }
        }
        Ok(ids)
    }

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

fn endpoint(url: &str) -> Result<Endpoint, PubsubError> {
    let ep = Endpoint::from_shared(url.to_string())
        .map_err(|e| PubsubError::Config(format!("endpoint {url:?}: {e}")))?
        .user_agent(concat!("subsink/", env!("CARGO_PKG_VERSION")))
        .map_err(|e| PubsubError::Config(e.to_string()))?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        // HTTP/2 pings no more often than gRPC servers allow by default (5 min): more frequent
        // ones get the connection closed with ENHANCE_YOUR_CALM. The StreamingPull ping keeps
        // streams themselves alive.
        .http2_keep_alive_interval(Duration::from_secs(300))
        .keep_alive_timeout(Duration::from_secs(20));
    Ok(ep)
}

fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn to_proto(m: &Message) -> proto::PubsubMessage {
    proto::PubsubMessage {
        data: m.data.clone(),
        attributes: m.attributes.to_map(),
        ordering_key: m.ordering_key.clone(),
        ..Default::default()
    }
}

/// Encoded size of a string in a repeated/`string` field: tag, length varint, bytes.
fn field_len(len: usize) -> usize {
    1 + varint_len(len) + len
}

fn varint_len(mut v: usize) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Split `ack_ids` into requests of at most [`MAX_ACK_IDS_PER_REQUEST`] ids and
/// [`MAX_ACK_REQUEST_BYTES`] encoded bytes (an id that alone exceeds the byte limit still gets a
/// request of its own; the server then decides).
fn ack_batches<'a>(subscription: &str, ack_ids: &'a [String]) -> Vec<&'a [String]> {
    let fixed = field_len(subscription.len()) + 16;
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = fixed;
    for (i, id) in ack_ids.iter().enumerate() {
        let len = field_len(id.len());
        if i > start
            && (i - start == MAX_ACK_IDS_PER_REQUEST || bytes + len > MAX_ACK_REQUEST_BYTES)
        {
            out.push(&ack_ids[start..i]);
            start = i;
            bytes = fixed;
        }
        bytes += len;
    }
    if start < ack_ids.len() {
        out.push(&ack_ids[start..]);
    }
    out
}

/// Upper bound of a message's encoded size inside a PublishRequest.
fn publish_size(m: &Message) -> usize {
    let attrs: usize = m
        .attributes
        .iter()
        .map(|(k, v)| field_len(field_len(k.len()) + field_len(v.len())))
        .sum();
    field_len(field_len(m.data.len()) + attrs + field_len(m.ordering_key.len()))
}

/// How to publish `messages`: lanes that may run concurrently, each a list of requests (message
/// indices) to send in order. One lane per non-empty ordering key, its messages in input order;
/// unkeyed messages get one lane per request, since nothing orders them.
fn publish_plan(messages: &[Message]) -> Vec<Vec<Vec<usize>>> {
    let mut by_key: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (i, m) in messages.iter().enumerate() {
        by_key.entry(m.ordering_key.as_str()).or_default().push(i);
    }
    let mut lanes = Vec::new();
    for (key, indices) in by_key {
        let mut requests = Vec::new();
        let mut current: Vec<usize> = Vec::new();
        let mut bytes = 64;
        for i in indices {
            let size = publish_size(&messages[i]);
            if !current.is_empty()
                && (current.len() == MAX_PUBLISH_MESSAGES || bytes + size > MAX_PUBLISH_BYTES)
            {
                requests.push(std::mem::take(&mut current));
                bytes = 64;
            }
            bytes += size;
            current.push(i);
        }
        if !current.is_empty() {
            requests.push(current);
        }
        if key.is_empty() {
            lanes.extend(requests.into_iter().map(|r| vec![r]));
        } else {
            lanes.push(requests);
        }
    }
    lanes
}

/// A pulled message as the pipeline sees it. `None` when the server sent no message body.
fn to_received(r: proto::ReceivedMessage) -> Option<Received> {
    let m = r.message?;
    let publish_time_micros = m
        .publish_time
        .map(|t| t.seconds * 1_000_000 + i64::from(t.nanos) / 1_000)
        .unwrap_or(0);
    Some(Received {
        msg: Message {
            data: m.data,
            attributes: m.attributes.into(),
            message_id: m.message_id,
            publish_time_micros,
            ordering_key: m.ordering_key,
        },
        receipt: Receipt {
            start: 0,
            end: 0,
            line: 0,
            ack_id: Some(r.ack_id),
            // 0 = the subscription has no dead-letter policy, so the server does not count.
            delivery_attempt: (r.delivery_attempt > 0).then_some(r.delivery_attempt),
        },
    })
}

// ------------------------------------------------------------------------------------------------
// Source

/// Settings of a [`PubsubSource`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubsubSettings {
    /// `projects/{p}/subscriptions/{s}`.
    pub subscription: String,
    /// Flow control: the server sends no more once this many messages are outstanding
    /// (delivered, not yet acked / nacked / expired). 0 = no limit. Default 10,000.
    pub max_outstanding_messages: i64,
    /// Flow control: the same, in bytes of message data. 0 = no limit. Default 100 MiB.
    pub max_outstanding_bytes: i64,
    /// Ack deadline of messages delivered on the stream (whole seconds, 10–600; a fraction is
    /// dropped), replacing the subscription's own. A message not acked or extended by then is redelivered. Default 60 s.
    pub stream_ack_deadline: Duration,
    /// Identifies this worker to the server, the same on every reconnect so flow control counts
    /// the messages of earlier streams too. Default: a random UUID. With several streams, stream
    /// `i` is `{client_id}-{i}`.
    pub client_id: String,
    /// StreamingPull streams open at once (1–16), as Google's clients can open several
    /// (Node.js `maxStreams`, Go `NumGoroutines`, Java `parallelPullCount`): each stream delivers
    /// at its own pace, so more streams deliver more (the emulator sends one response of at most
    /// 100 messages per stream every 50 ms). Each stream gets an equal share of the flow-control
    /// limits; their batches go to one [`Source::next`]. Keep 1 with message ordering. Default 1.
    pub streams: usize,
}

impl PubsubSettings {
    pub fn new(subscription: impl Into<String>) -> PubsubSettings {
        PubsubSettings {
            subscription: subscription.into(),
            max_outstanding_messages: 10_000,
            max_outstanding_bytes: 100 * 1024 * 1024,
            stream_ack_deadline: Duration::from_secs(60),
            client_id: format!("subsink-{}", uuid::Uuid::new_v4()),
            streams: 1,
        }
    }

    fn validate(&self) -> Result<(), PubsubError> {
        let parts: Vec<&str> = self.subscription.split('/').collect();
        if parts.len() != 4
            || parts[0] != "projects"
            || parts[2] != "subscriptions"
            || parts[1].is_empty()
            || parts[3].is_empty()
        {
            return Err(PubsubError::Config(format!(
                "subscription {:?} is not projects/PROJECT/subscriptions/NAME",
                self.subscription
            )));
        }
        let secs = self.stream_ack_deadline.as_secs();
        if !(10..=600).contains(&secs) {
            return Err(PubsubError::Config(format!(
                "stream ack deadline {secs} s is outside 10–600 s"
            )));
        }
        if !(1..=MAX_STREAMS).contains(&self.streams) {
            return Err(PubsubError::Config(format!(
                "{} StreamingPull streams: 1–{MAX_STREAMS} are allowed",
                self.streams
            )));
        }
        if self.max_outstanding_messages < 0 || self.max_outstanding_bytes < 0 {
            return Err(PubsubError::Config(
                "flow-control limits must not be negative".into(),
            ));
        }
        Ok(())
    }

    /// The settings of stream `i` of [`streams`](Self::streams): its own client id and an equal
    /// share (rounded up) of the flow-control limits (0, no limit, stays 0).
    fn stream(&self, i: usize) -> PubsubSettings {
        if self.streams <= 1 {
            return self.clone();
        }
        let n = self.streams as i64;
        let share = |v: i64| (v + n - 1) / n;
        PubsubSettings {
            client_id: format!("{}-{i}", self.client_id),
            max_outstanding_messages: share(self.max_outstanding_messages),
            max_outstanding_bytes: share(self.max_outstanding_bytes),
            streams: 1,
            ..self.clone()
        }
    }

    fn first_request(&self) -> proto::StreamingPullRequest {
        proto::StreamingPullRequest {
            subscription: self.subscription.clone(),
            stream_ack_deadline_seconds: self.stream_ack_deadline.as_secs() as i32,
            client_id: self.client_id.clone(),
            max_outstanding_messages: self.max_outstanding_messages,
            max_outstanding_bytes: self.max_outstanding_bytes,
            ..Default::default()
        }
    }
}

/// Counters of a running [`PubsubSource`].
#[derive(Debug, Default)]
struct Stats {
    /// Streams reopened after one failed or was closed (each is logged).
    reconnects: AtomicU64,
    /// Streams the server answered.
    streams: AtomicU64,
    /// Messages handed to the channel, redeliveries included.
    messages: AtomicU64,
    /// A stream is open and answered (readiness).
    up: std::sync::atomic::AtomicBool,
    /// Ack ids acked or given a new deadline on a stream, and by unary calls.
    settled_on_stream: AtomicU64,
    settled_by_call: AtomicU64,
}

/// A request for the open stream, and who waits to hear that it was handed to the transport.
type StreamItem = (
    proto::StreamingPullRequest,
    Option<tokio::sync::oneshot::Sender<()>>,
);

/// The request queue of the stream that is open and answered, if one is: set by the pull task,
/// used by every [`Acker`].
type Lane = Arc<std::sync::Mutex<Option<mpsc::Sender<StreamItem>>>>;

/// Sends acks and deadline changes (leases, nacks) on the open StreamingPull stream, batched, as
/// Pub/Sub's client libraries do; while no stream is open (reconnecting, stopping, stopped) they go
/// by unary calls instead.
///
/// [`ack`](Acker::ack) and [`modify_deadline`](Acker::modify_deadline) return once their
/// requests have been handed to the transport: the stream's request body yielded the last of
/// them to tonic, which encodes it and writes it to the connection. A stream carries no answer to
/// an ack, so that is as far as a worker can know; an ack lost with a breaking stream or a killed
/// process means a redelivery (at least once), never a loss. When the stream breaks before the
/// hand-over (or it takes longer than [`HANDOFF_TIMEOUT`]) the same ids go by a unary call —
/// acks and deadline changes are idempotent.
#[derive(Debug, Clone)]
pub struct Acker {
    /// One per stream; an ack may go on any stream of the subscription (the API says so of
    /// `StreamingPullRequest.ack_ids`), so they take turns.
    lanes: Arc<[Lane]>,
    /// Where the next ack starts looking for an open stream.
    next: Arc<std::sync::atomic::AtomicUsize>,
    stats: Arc<Stats>,
    client: PubsubClient,
    subscription: String,
}

/// How long an ack may wait to be handed to the stream before it goes by a unary call instead.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(10);

impl Acker {
    /// Acknowledge `ids`. An error only when the unary fallback failed.
    pub async fn ack(&self, ids: Vec<String>) -> Result<(), PubsubError> {
        if ids.is_empty() {
            return Ok(());
        }
        let requests = ack_batches(&self.subscription, &ids)
            .into_iter()
            .map(|b| proto::StreamingPullRequest {
                ack_ids: b.to_vec(),
                ..Default::default()
            })
            .collect();
        if self.on_stream(requests, ids.len()).await {
            return Ok(());
        }
        self.client.ack(&self.subscription, &ids).await?;
        self.by_call(ids.len());
        Ok(())
    }

    fn by_call(&self, n: usize) {
        self.stats
            .settled_by_call
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Set the deadline of `ids` to `secs` from now (0 = nack). An error only when the unary
    /// fallback failed.
    pub async fn modify_deadline(&self, ids: Vec<String>, secs: i32) -> Result<(), PubsubError> {
        if ids.is_empty() {
            return Ok(());
        }
        let requests = ack_batches(&self.subscription, &ids)
            .into_iter()
            .map(|b| proto::StreamingPullRequest {
                modify_deadline_ack_ids: b.to_vec(),
                modify_deadline_seconds: vec![secs; b.len()],
                ..Default::default()
            })
            .collect();
        if self.on_stream(requests, ids.len()).await {
            return Ok(());
        }
        self.client
            .modify_ack_deadline(&self.subscription, &ids, secs)
            .await?;
        self.by_call(ids.len());
        Ok(())
    }

    /// Queue `requests` on the open stream and wait until the last one is handed to the
    /// transport (the queue is FIFO: the others went before it). False: no stream, or it broke or
    /// stalled first — the caller sends them by a unary call.
    async fn on_stream(&self, requests: Vec<proto::StreamingPullRequest>, ids: usize) -> bool {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let open = (0..self.lanes.len()).find_map(|i| {
            let lane = &self.lanes[(start + i) % self.lanes.len()];
            lane.lock().expect("lane lock").clone()
        });
        let Some(tx) = open else {
            return false;
        };
        let (done, handed) = tokio::sync::oneshot::channel();
        let queued = async move {
            let last = requests.len().saturating_sub(1);
            let mut done = Some(done);
            for (i, r) in requests.into_iter().enumerate() {
                let d = if i == last { done.take() } else { None };
                if tx.send((r, d)).await.is_err() {
                    return false; // the stream ended
                }
            }
            // This sender is dropped here, so a stop can half-close the stream while we wait.
            drop(tx);
            // Dropped unsent (the stream ended with it still queued): an error.
            handed.await.is_ok()
        };
        let handed = matches!(
            tokio::time::timeout(HANDOFF_TIMEOUT, queued).await,
            Ok(true)
        );
        if handed {
            self.stats
                .settled_on_stream
                .fetch_add(ids as u64, Ordering::Relaxed);
        }
        handed
    }
}

/// Stops a [`PubsubSource`] from another task (a signal handler) while the pipeline owns the
/// source.
#[derive(Debug, Clone)]
pub struct PubsubStopHandle {
    /// `true` once stopped. Shared by the source and its handles; when the last one is dropped
    /// the pull task stops as well.
    stop: Arc<watch::Sender<bool>>,
}

impl PubsubStopHandle {
    /// Stop pulling: the request half of the stream is closed, which asks the server to finish
    /// it; whatever it still sends is handed out. Batches keep coming out of [`Source::next`]
    /// until the stream ends (at most 5 s later; then it is cancelled), then
    /// `None`. The caller must keep draining `next()` until `None`.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }
}

/// A StreamingPull subscriber behind the [`Source`] trait. A task owns the stream; batches (one per
/// server response) reach [`Source::next`] through a bounded channel. When the stream fails with
/// a retryable status or the server closes it, the task reopens it after an exponential backoff
/// (100 ms doubling to 10 s, back to 100 ms after a healthy stream); a non-retryable status ends
/// the source with [`SourceEvent::Failed`].
pub struct PubsubSource {
    /// Batches from the pull task, bounded (`CHANNEL_CAPACITY`) so a slow pipeline stops the task
    /// from reading the stream. Closed when the task ends: `next()` then returns `None`.
    rx: mpsc::Receiver<SourceEvent>,
    stop: PubsubStopHandle,
    /// Shared with the pull task.
    stats: Arc<Stats>,
    /// For `describe()`.
    subscription: String,
    acker: Acker,
}

impl PubsubSource {
    /// Validate `settings` and start pulling (needs a tokio runtime).
    pub fn start(client: PubsubClient, settings: PubsubSettings) -> Result<Self, PubsubError> {
        settings.validate()?;
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (stop_tx, stop_rx) = watch::channel(false);
        let stats = Arc::new(Stats::default());
        let subscription = settings.subscription.clone();
        let lanes: Vec<Lane> = (0..settings.streams).map(|_| Lane::default()).collect();
        let acker = Acker {
            lanes: lanes.clone().into(),
            next: Arc::default(),
            stats: stats.clone(),
            client: client.clone(),
            subscription: subscription.clone(),
        };
        for (i, lane) in lanes.into_iter().enumerate() {
            tokio::spawn(pull_task(
                client.clone(),
                settings.stream(i),
                tx.clone(),
                stop_rx.clone(),
                lane,
                stats.clone(),
            ));
        }
        Ok(PubsubSource {
            rx,
            stop: PubsubStopHandle {
                stop: Arc::new(stop_tx),
            },
            stats,
            subscription,
            acker,
        })
    }

    /// Acks and deadline changes for this source's messages, on its stream while one is open.
    pub fn acker(&self) -> Acker {
        self.acker.clone()
    }

    /// See [`PubsubStopHandle::stop`].
    pub fn stop(&self) {
        self.stop.stop();
    }

    /// A handle that stops this source from elsewhere.
    pub fn stop_handle(&self) -> PubsubStopHandle {
        self.stop.clone()
    }

    /// Streams reopened after the first one failed or was closed.
    pub fn reconnects(&self) -> u64 {
        self.stats.reconnects.load(Ordering::Relaxed)
    }

    /// Streams the server has answered so far (the first one included). A stream counts once its
    /// response headers arrive, which gRPC-Java servers (the emulator) send only with the first
    /// response: an idle stream may not count yet.
    pub fn streams_opened(&self) -> u64 {
        self.stats.streams.load(Ordering::Relaxed)
    }

    /// Messages received so far (redeliveries included).
    pub fn messages_received(&self) -> u64 {
        self.stats.messages.load(Ordering::Relaxed)
    }

    /// Ack ids this source's [`Acker`]s have acked or given a new deadline so far: `(handed to a
    /// stream, by unary calls)`.
    pub fn settled(&self) -> (u64, u64) {
        (
            self.stats.settled_on_stream.load(Ordering::Relaxed),
            self.stats.settled_by_call.load(Ordering::Relaxed),
        )
    }
}

#[async_trait::async_trait]
impl Source for PubsubSource {
    async fn next(&mut self) -> Option<SourceEvent> {
        self.rx.recv().await
    }

    fn describe(&self) -> &str {
        &self.subscription
    }

    fn stop(&mut self) -> bool {
        self.stop.stop();
        true
    }

    fn reconnects(&self) -> u64 {
        PubsubSource::reconnects(self)
    }

    fn connected(&self) -> bool {
        self.stats.up.load(Ordering::Relaxed)
    }
}

/// Exponential backoff between stream attempts: `min`, doubling, capped at `max`.
#[derive(Debug, Clone)]
struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    fn reset(&mut self) {
        self.next = self.min;
    }
}

/// How one stream ended.
enum StreamEnd {
    /// [`PubsubStopHandle::stop`] was called (or the source dropped).
    Stopped,
    /// The stream failed or the server closed it; `healthy` = it delivered or lasted.
    Broken { error: PubsubError, healthy: bool },
}

/// Empties the lane when a stream ends, so acks do not queue for a stream that is gone.
struct LaneGuard<'a>(&'a Lane);

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut l) = self.0.lock() {
            l.take();
        }
    }
}

async fn pull_task(
    client: PubsubClient,
    settings: PubsubSettings,
    tx: mpsc::Sender<SourceEvent>,
    stop: watch::Receiver<bool>,
    lane: Lane,
    stats: Arc<Stats>,
) {
    // No stream from when this returns: acks go by unary calls ([`Acker`] finds the lane empty).
    pull_streams(&client, &settings, &tx, stop, &lane, &stats).await;
}

async fn pull_streams(
    client: &PubsubClient,
    settings: &PubsubSettings,
    tx: &mpsc::Sender<SourceEvent>,
    mut stop: watch::Receiver<bool>,
    lane: &Lane,
    stats: &Stats,
) {
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
    loop {
        if *stop.borrow() {
            return;
        }
        let (error, healthy) = match pull_stream(client, settings, tx, &mut stop, lane, stats).await
        {
            StreamEnd::Stopped => return,
            StreamEnd::Broken { error, healthy } => (error, healthy),
        };
        if !error.retryable() {
            tracing::error!(subscription = %settings.subscription, %error, "StreamingPull failed for good");
            let _ = tx.send(SourceEvent::Failed(error.to_string())).await;
            return;
        }
        if healthy {
            backoff.reset();
        }
        let delay = backoff.next_delay();
        let reconnects = stats.reconnects.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(
            subscription = %settings.subscription,
            target = %client.target,
            %error,
            delay_ms = delay.as_millis() as u64,
            reconnects,
            "StreamingPull stream ended; reconnecting"
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Run one StreamingPull stream until it breaks or the source is stopped.
///
/// Stopping is graceful: the request half is closed, which asks the server to finish the stream,
/// and responses keep being read (and handed out) until it does, or [`STOP_GRACE`] passes. Simply
/// dropping the stream would lose what the server already sent until those messages' deadlines
/// pass — and the emulator does not always notice a cancelled stream, whose pusher then keeps
/// taking messages.
async fn pull_stream(
    client: &PubsubClient,
    settings: &PubsubSettings,
    tx: &mpsc::Sender<SourceEvent>,
    stop: &mut watch::Receiver<bool>,
    lane: &Lane,
    stats: &Stats,
) -> StreamEnd {
    let broken = |error, healthy| StreamEnd::Broken { error, healthy };
    // The request half stays open for the life of the stream (the server ends a stream whose
    // requests end); it carries the first request, the pings, and the acks and deadline changes
    // of every [`Acker`] (through `lane`, once the server answered). Dropping every sender closes
    // it.
    let (req_tx, req_rx) = mpsc::channel::<StreamItem>(REQUEST_QUEUE);
    let _ = req_tx.try_send((settings.first_request(), None));
    let mut req_tx = Some(req_tx);
    // Whoever waits for a request hears when tonic takes it (to encode it and write it out).
    let requests = futures::stream::unfold(req_rx, |mut rx| async move {
        let (r, handed) = rx.recv().await?;
        if let Some(h) = handed {
            let _ = h.send(());
        }
        Some((r, rx))
    });
    // However this stream ends, acks stop going to it.
    let _lane = LaneGuard(lane);
    let req = match client
        .request(requests, ("subscription", &settings.subscription), None)
        .await
    {
        Ok(r) => r,
        Err(e) => return broken(e, false),
    };
    let opened = Instant::now();
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + STREAM_PING, STREAM_PING);
    let mut subscriber = client.subscriber();
    // The call resolves when the server sends response headers. gRPC-Java servers (the emulator)
    // send them only with the first response, so an idle stream can wait there for long: the
    // loop pings and watches for stop meanwhile too.
    let mut call = std::pin::pin!(subscriber.streaming_pull(req));
    let mut stream: Option<tonic::Streaming<proto::StreamingPullResponse>> = None;
    let mut delivered = false;
    // Set once stopping: the request half is closed and the server has until then to finish.
    let mut closing: Option<tokio::time::Instant> = None;

    enum Step {
        Stop,
        GraceOver,
        Ping,
        Answered(
            Result<tonic::Response<tonic::Streaming<proto::StreamingPullResponse>>, tonic::Status>,
        ),
        Item(Result<Option<proto::StreamingPullResponse>, tonic::Status>),
    }
    loop {
        let step = tokio::select! {
            _ = stop.wait_for(|s| *s), if closing.is_none() => Step::Stop,
            _ = tokio::time::sleep_until(closing.unwrap_or_else(tokio::time::Instant::now)), if closing.is_some() => Step::GraceOver,
            _ = ping.tick(), if closing.is_none() => Step::Ping,
            r = &mut call, if stream.is_none() => Step::Answered(r),
            item = async { stream.as_mut().expect("guarded").message().await }, if stream.is_some() => Step::Item(item),
        };
        let healthy = delivered || opened.elapsed() >= HEALTHY_AFTER;
        match step {
            Step::Stop => {
                closing = Some(tokio::time::Instant::now() + STOP_GRACE);
                // Half-close: the server finishes the stream. Later acks go by unary calls.
                lane.lock().expect("lane lock").take();
                req_tx = None;
            }
            Step::GraceOver => return StreamEnd::Stopped,
            Step::Ping => {
                if let Some(t) = &req_tx {
                    let _ = t.try_send((proto::StreamingPullRequest::default(), None));
                }
            }
            Step::Answered(Ok(resp)) => {
                stream = Some(resp.into_inner());
                // Acks go on the stream once the server answered it (before that, a request
                // could wait behind the unanswered call for long).
                if let Some(t) = &req_tx {
                    *lane.lock().expect("lane lock") = Some(t.clone());
                }
                stats.streams.fetch_add(1, Ordering::Relaxed);
                stats.up.store(true, Ordering::Relaxed);
                tracing::debug!(subscription = %settings.subscription, "StreamingPull stream answered");
            }
            Step::Answered(Err(_)) | Step::Item(Ok(None)) | Step::Item(Err(_))
                if closing.is_some() =>
            {
                return StreamEnd::Stopped;
            }
            Step::Answered(Err(s)) | Step::Item(Err(s)) => {
                return broken(PubsubError::status("StreamingPull", s), healthy);
            }
            Step::Item(Ok(None)) => {
                let error = PubsubError::Status {
                    method: "StreamingPull",
                    code: tonic::Code::Unavailable,
                    message: "stream closed by the server".into(),
                    retryable: true,
                };
                return broken(error, healthy);
            }
            Step::Item(Ok(Some(resp))) => {
                delivered = true;
                let batch: Vec<Received> = resp
                    .received_messages
                    .into_iter()
                    .filter_map(to_received)
                    .collect();
                tracing::trace!(messages = batch.len(), "StreamingPull response");
                if batch.is_empty() {
                    continue;
                }
                stats
                    .messages
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                // Not raced against stop: a batch in hand is always handed out (the pipeline
                // drains `next()` until `None` during shutdown).
                if tx.send(SourceEvent::Messages(batch)).await.is_err() {
                    return StreamEnd::Stopped; // the source was dropped
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(key: &str, data_len: usize) -> Message {
        Message {
            data: bytes::Bytes::from(vec![b'x'; data_len]),
            ordering_key: key.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
        let ms: Vec<u128> = (0..10).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(
            ms,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]
        );
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn ack_batches_respect_count_and_bytes() {
        let ids: Vec<String> = (0..6000).map(|i| format!("ack-{i:06}")).collect();
        let batches = ack_batches("projects/p/subscriptions/s", &ids);
        let sizes: Vec<usize> = batches.iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [2500, 2500, 1000]);
        assert_eq!(batches.concat(), ids);

        // Long ids: the byte limit binds first.
        let long: Vec<String> = (0..3000).map(|i| format!("{i:0>400}")).collect();
        let batches = ack_batches("projects/p/subscriptions/s", &long);
        assert!(batches.len() > 2);
        for b in &batches {
            let bytes: usize = b.iter().map(|id| field_len(id.len())).sum();
            assert!(bytes <= MAX_ACK_REQUEST_BYTES, "{bytes}");
        }
        assert_eq!(batches.concat(), long);
        assert!(ack_batches("s", &[]).is_empty());
    }

    #[test]
    fn publish_plan_groups_by_key_and_splits_by_count_and_bytes() {
        let mut messages: Vec<Message> = (0..2500).map(|_| msg("", 10)).collect();
        for _ in 0..5 {
            messages.push(msg("a", 10));
            messages.push(msg("b", 2_900_000)); // three fit in 9 MB, not four
        }
        let plan = publish_plan(&messages);
        // Unkeyed: 1000 + 1000 + 500, one lane each. Key a: one request. Key b: 3 + 2.
        let mut shapes: Vec<Vec<usize>> = plan
            .iter()
            .map(|lane| lane.iter().map(Vec::len).collect())
            .collect();
        shapes.sort();
        assert_eq!(
            shapes,
            vec![vec![3, 2], vec![5], vec![500], vec![1000], vec![1000]]
        );
        // Every message once; each lane keeps input order and one key per request.
        let mut all: Vec<usize> = plan.iter().flatten().flatten().copied().collect();
        all.sort();
        assert_eq!(all, (0..messages.len()).collect::<Vec<_>>());
        for lane in &plan {
            let flat: Vec<usize> = lane.iter().flatten().copied().collect();
            assert!(flat.windows(2).all(|w| w[0] < w[1]));
            for req in lane {
                let key = &messages[req[0]].ordering_key;
                assert!(req.iter().all(|&i| &messages[i].ordering_key == key));
            }
        }
    }

    #[test]
    fn received_message_maps_to_message_and_receipt() {
        let r = proto::ReceivedMessage {
            ack_id: "ack-1".into(),
            delivery_attempt: 0,
            message: Some(proto::PubsubMessage {
                data: bytes::Bytes::from_static(b"hi"),
                attributes: [("k".to_string(), "v".to_string())].into(),
                message_id: "42".into(),
                publish_time: Some(prost_types::Timestamp {
                    seconds: 1_614_366_835,
                    nanos: 749_123_456,
                }),
                ordering_key: "user-42".into(),
            }),
        };
        let got = to_received(r.clone()).unwrap();
        assert_eq!(got.msg.data.as_ref(), b"hi");
        assert_eq!(&got.msg.attributes["k"], "v");
        assert_eq!(got.msg.message_id, "42");
        assert_eq!(got.msg.publish_time_micros, 1_614_366_835_749_123);
        assert_eq!(got.msg.ordering_key, "user-42");
        assert_eq!(got.receipt.ack_id.as_deref(), Some("ack-1"));
        assert_eq!(got.receipt.delivery_attempt, None);
        assert_eq!((got.receipt.start, got.receipt.line), (0, 0));

        let got = to_received(proto::ReceivedMessage {
            delivery_attempt: 3,
            ..r
        })
        .unwrap();
        assert_eq!(got.receipt.delivery_attempt, Some(3));
    }

    #[test]
    fn retryable_follows_the_status_code() {
        let e = |code| PubsubError::status("X", tonic::Status::new(code, "m"));
        for code in [
            tonic::Code::Unavailable,
            tonic::Code::DeadlineExceeded,
            tonic::Code::Internal,
            tonic::Code::ResourceExhausted,
            tonic::Code::Aborted,
        ] {
            assert!(e(code).retryable(), "{code:?}");
        }
        for code in [
            tonic::Code::NotFound,
            tonic::Code::PermissionDenied,
            tonic::Code::InvalidArgument,
            tonic::Code::Unauthenticated,
        ] {
            assert!(!e(code).retryable(), "{code:?}");
        }
        assert!(!PubsubError::Config("x".into()).retryable());
        // Unknown as sent by a server: not retryable; as made by tonic from a broken connection
        // (it carries the io error as its source): retryable.
        assert!(!e(tonic::Code::Unknown).retryable());
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let broken = tonic::Status::from_error(Box::new(io));
        assert_eq!(broken.code(), tonic::Code::Unknown);
        assert!(PubsubError::status("X", broken).retryable());
        assert!(!e(tonic::Code::Cancelled).retryable());
    }

    #[test]
    fn settings_validate() {
        let ok = PubsubSettings::new("projects/p/subscriptions/s");
        assert!(ok.validate().is_ok());
        assert!(PubsubSettings::new("s").validate().is_err());
        let mut s = ok.clone();
        s.stream_ack_deadline = Duration::from_secs(5);
        assert!(s.validate().is_err());
        let first = ok.first_request();
        assert_eq!(first.stream_ack_deadline_seconds, 60);
        assert_eq!(first.max_outstanding_messages, 10_000);
        assert_eq!(first.client_id, ok.client_id);
    }
}
