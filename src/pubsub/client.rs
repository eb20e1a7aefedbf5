//! The connection to Pub/Sub and the unary calls a worker needs — Acknowledge,
//! ModifyAckDeadline, Publish — batched as Google's client libraries batch them.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::error::PubsubError;
use super::proto;
use crate::gauth::{AuthError, AuthMode, GoogleAuth};
use crate::message::Message;
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

/// A connection to Pub/Sub (Google or the emulator). Cheap to clone: clones share one HTTP/2
/// connection, which reconnects by itself after it breaks.
#[derive(Clone)]
pub struct PubsubClient {
    channel: Channel,
    /// `None` for the emulator, which takes no credentials (unless `SUBSINK_GOOGLE_AUTH=always`).
    auth: Option<Arc<GoogleAuth>>,
    /// Where it points, for logs.
    target: Arc<str>,
}

impl std::fmt::Debug for PubsubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubsubClient")
            .field("target", &self.target)
            .field("auth", &self.auth.as_ref().map(|a| a.source_name()))
            .finish()
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

    /// The emulator at `host` (`127.0.0.1:8681`): plaintext, no credentials — unless
    /// `SUBSINK_GOOGLE_AUTH=always` ([`crate::gauth::AUTH_MODE_ENV`]), which sends the process's
    /// Google credentials to it too (a recording proxy or a gateway in front of an emulator).
    pub async fn connect_emulator(host: &str) -> Result<PubsubClient, PubsubError> {
        let url = format!("http://{host}");
        let channel = endpoint(&url)?.connect_lazy();
        let auth = match AuthMode::from_env().map_err(auth_error)? {
            AuthMode::Always => Some(GoogleAuth::shared().map_err(auth_error)?),
            AuthMode::Auto => None,
        };
        Ok(PubsubClient {
            channel,
            auth,
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
        // Credentials are read now (files only, no network); the first call gets a token.
        let auth = GoogleAuth::shared().map_err(auth_error)?;
        Ok(PubsubClient {
            channel,
            auth: Some(auth),
            target: url.into(),
        })
    }

    /// Where this client points (`http://127.0.0.1:8681`, `https://pubsub.googleapis.com`).
    pub fn target(&self) -> &str {
        &self.target
    }

    pub(crate) fn subscriber(&self) -> SubscriberClient<Channel> {
        SubscriberClient::new(self.channel.clone()).max_decoding_message_size(MAX_DECODE_BYTES)
    }

    pub(super) fn publisher(&self) -> PublisherClient<Channel> {
        PublisherClient::new(self.channel.clone()).max_decoding_message_size(MAX_DECODE_BYTES)
    }

    pub(super) fn schemas(&self) -> SchemaServiceClient<Channel> {
        SchemaServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_DECODE_BYTES)
    }

    /// One unary call: `msg` as a request ([`Self::request`], within [`UNARY_TIMEOUT`]) sent by
    /// `call`; its answer, or the call's status as the error of `method`.
    pub(super) async fn unary<M, R, Fut>(
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
    pub(crate) async fn request<T>(
        &self,
        msg: T,
        routing: (&str, &str),
        timeout: Option<Duration>,
    ) -> Result<tonic::Request<T>, PubsubError> {
        let mut req = tonic::Request::new(msg);
        if let Some(auth) = &self.auth {
            // Token endpoints and the metadata server fail transiently (retryable); a refused
            // grant does not pass by waiting.
            if let Some(bearer) = auth.authorization().await.map_err(auth_error)? {
                let value = MetadataValue::try_from(bearer).map_err(|_| PubsubError::Auth {
                    message: "the access token is not a header value".into(),
                    retryable: false,
                })?;
                req.metadata_mut().insert("authorization", value);
            }
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
}

fn auth_error(e: AuthError) -> PubsubError {
    PubsubError::Auth {
        retryable: e.retryable(),
        message: e.to_string(),
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
pub(super) fn ack_batches<'a>(subscription: &str, ack_ids: &'a [String]) -> Vec<&'a [String]> {
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
}
