//! The Pub/Sub push source: an HTTP endpoint a push subscription delivers to (docs/contract.md §5).
//!
//! Every request carries one message, wrapped (a JSON envelope `{"message": …, "subscription": …,
//! "deliveryAttempt": …}`) or unwrapped (`noWrapper`: the body is the payload; with
//! `writeMetadata` the message id, publish time, ordering key and subscription come as
//! `x-goog-pubsub-*` headers and each attribute as a header of its own).
//!
//! With a spool (the default, [`crate::source::push::spool`]): a request passes authentication, the envelope and
//! the checks before accept (the run's [`Shaper`]), is appended to the spool and answered 204 once the spool
//! is fsynced; the export reads the spool ([`super::spool::SpoolSource`]) and settles it by its
//! checkpoint. 429 when the spool is full, 503 when it cannot be written.
//!
//! Without one (`--no-spool`): a request is answered only when the message is settled: 204 once
//! the file holding it is durable (Pub/Sub counts a 2xx as an ack), 503 when it failed or was not
//! written in time — Pub/Sub then redelivers it with its push backoff, and dead-letters it by the
//! subscription's policy. The answer therefore waits for the file's `maxDuration` at most;
//! validation refuses a `maxDuration` longer than the ack deadline, past which Pub/Sub gives up
//! on the request.
//!
//! With an audience set, every request needs `Authorization: Bearer <OIDC token>`: RS256, signed
//! by a key of the JWKS, issued by Google, for that audience, not expired, and (if given) for one
//! of the allowed service-account emails. Anything else gets 401 and nothing is written or
//! spooled. Keys from a URL are fetched in the background; until they are known, 503.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use tokio::sync::{mpsc, oneshot};

mod auth;
pub mod build;
pub mod flags;
pub mod settle;
pub mod spool;
pub mod spooled;

pub use self::flags::{
    default_spool_dir, JwksSource, PushArgs, PushAuth, PushEndpointError, PushFlagsError,
    PushSettings, SpoolSpec, Wrapping, DEFAULT_SPOOL_MAX_BYTES, GOOGLE_JWKS,
};
pub use self::spooled::SpoolSource;

use self::auth::{AuthError, Verifier};

use self::spool::{SpoolError, SpoolHandle, SpoolWriter};
use crate::input::{Source, SourceEvent};
use crate::message::{Message, Receipt, Received};
use crate::shape::{Checked, Shaper};
use crate::shutdown::Grace;
use crate::summary::RunSummary;
use crate::telemetry::metrics::SubscriptionMetrics;

/// Requests handed to the pipeline and not yet taken: a full queue holds new requests back.
const QUEUE: usize = 1024;
/// The largest request body taken: a 10 MB message, base64 in its JSON envelope, with attributes.
const MAX_BODY: usize = 16 << 20;

/// Outcomes of pushed messages, shared by the endpoint (which waits for them) and the settle side
/// ([`crate::source::push::settle::PushBroker`], which resolves them).
#[derive(Debug, Default)]
pub struct Pending {
    waiting: Mutex<HashMap<String, oneshot::Sender<bool>>>,
    /// With a spool: requests answered 2xx so far (spooled, or filtered), i.e. acked.
    answered: AtomicU64,
    /// With a spool: requests answered 2xx without spooling them (filtered before accept).
    filtered: AtomicU64,
    /// With a spool: requests refused by the checks before accept (answered an error).
    refused: AtomicU64,
    /// The endpoint's server task: it ends once its graceful shutdown has answered every request
    /// and closed every connection.
    server: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Pending {
    fn wait(&self, id: &str) -> oneshot::Receiver<bool> {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap().insert(id.to_string(), tx);
        rx
    }

    /// Settle the message of request `id`: `true` answers 2xx (ack), `false` an error (nack).
    pub fn resolve(&self, id: &str, ok: bool) {
        if let Some(tx) = self.waiting.lock().unwrap().remove(id) {
            let _ = tx.send(ok);
        }
    }

    /// Requests answered 2xx by the spooled endpoint so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Requests the spooled endpoint filtered before accept so far (answered 2xx, not spooled).
    pub fn filtered(&self) -> u64 {
        self.filtered.load(Ordering::Relaxed)
    }

    /// Requests the spooled endpoint refused before accept so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn forget(&self, id: &str) {
        self.waiting.lock().unwrap().remove(id);
    }

    /// The end of a run: every request still waiting is answered 503 (its message was not made
    /// durable; Pub/Sub redelivers it), then wait up to `within` for the stopped endpoint to have
    /// written those answers and closed its connections — the process must not exit first, or a
    /// received request would get no answer at all.
    pub async fn finish(&self, within: Duration) {
        let rest: Vec<_> = self.waiting.lock().unwrap().drain().collect();
        for (_, tx) in rest {
            let _ = tx.send(false);
        }
        let server = self.server.lock().unwrap().take();
        if let Some(server) = server {
            if tokio::time::timeout(within, server).await.is_err() {
                tracing::warn!(
                    ?within,
                    "push endpoint: connections still open at exit; their requests may go unanswered"
                );
            }
        }
    }
}

struct Shared {
    /// Without a spool: requests go to the pipeline and wait for their file.
    tx: mpsc::Sender<SourceEvent>,
    /// With a spool: requests are appended to it, after the checks before accept: the run's
    /// filter, transforms and the sink's own rules, in pipeline order. A refusal is answered to
    /// the pusher, which redelivers the message and dead-letters it by the subscription's policy;
    /// nothing refused is spooled. What is spooled is the message as transformed, so the export
    /// neither filters nor transforms it again.
    spool: Option<(SpoolWriter, Arc<Shaper>)>,
    pending: Arc<Pending>,
    auth: Option<Arc<Verifier>>,
    answer_within: Duration,
    wrapping: Wrapping,
    next_id: AtomicU64,
    stopping: Arc<AtomicBool>,
}

/// The push endpoint behind the [`Source`] trait.
pub struct PushSource {
    rx: mpsc::Receiver<SourceEvent>,
    /// With a spool: the export reads it, not the requests.
    spooled: Option<(SpoolSource, SpoolHandle)>,
    /// The token checker, whose keys may not be known yet (readiness).
    auth: Option<Arc<Verifier>>,
    pending: Arc<Pending>,
    /// (filtered, refused) before accept, counted in the summary so far.
    counted: (u64, u64),
    stopping: Arc<AtomicBool>,
    shutdown: Option<oneshot::Sender<()>>,
    addr: SocketAddr,
    name: String,
}

impl PushSource {
    /// Bind the endpoint and start serving (needs a tokio runtime).
    pub async fn start(
        settings: PushSettings,
        grace: Option<Grace>,
    ) -> Result<PushSource, PushEndpointError> {
        Self::start_with(settings, grace, None).await
    }

    /// Bind the endpoint; with `spool` (its writer, the checks before accept, the export's reader
    /// and its handle) requests are answered once spooled. `grace`: the run's shutdown grace, at
    /// whose signal the endpoint stops accepting.
    pub async fn start_with(
        settings: PushSettings,
        grace: Option<Grace>,
        spool: Option<(SpoolWriter, Arc<Shaper>, SpoolSource, SpoolHandle)>,
    ) -> Result<PushSource, PushEndpointError> {
        let (spool, spooled) = match spool {
            Some((w, c, r, h)) => (Some((w, c)), Some((r, h))),
            None => (None, None),
        };
        let auth = match &settings.auth {
            Some(a) => Some(Verifier::start(a.clone()).await?),
            None => None,
        };
        let listener = tokio::net::TcpListener::bind(&settings.listen)
            .await
            .map_err(|source| PushEndpointError::Listen {
                addr: settings.listen.clone(),
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| PushEndpointError::Listen {
                addr: settings.listen.clone(),
                source,
            })?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let pending = Arc::new(Pending::default());
        let stopping = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            tx,
            spool,
            pending: pending.clone(),
            auth: auth.clone(),
            answer_within: settings.answer_within,
            wrapping: settings.wrapping,
            next_id: AtomicU64::new(1),
            stopping: stopping.clone(),
        });
        let app = axum::Router::new()
            .fallback(axum::routing::post(handle))
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
            .with_state(shared);
        let (shutdown, stop_rx) = oneshot::channel::<()>();
        let spool_dir = spooled.as_ref().map(|(_, h)| h.dir().to_path_buf());
        let stop = {
            let stopping = stopping.clone();
            async move {
                // Asked by the pipeline ([`Source::stop`]), or the signal itself.
                match grace {
                    Some(g) => tokio::select! {
                        _ = stop_rx => {}
                        _ = g.signalled() => {}
                    },
                    None => {
                        let _ = stop_rx.await;
                    }
                }
                // Set before the graceful shutdown starts: a request on a connection still open
                // is answered 503 from now on.
                stopping.store(true, Ordering::SeqCst);
                match spool_dir {
                    Some(dir) => tracing::info!(
                        spool = %dir.display(),
                        "push endpoint: no longer accepting; exporting what the spool holds"
                    ),
                    None => tracing::info!("push endpoint: no longer accepting"),
                }
            }
        };
        let server = tokio::spawn(async move {
            // Answers are small and each one is awaited by its pusher: no Nagle delay on them.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "push endpoint stopped");
            }
        });
        *pending.server.lock().unwrap() = Some(server);
        match &spooled {
            Some((_, h)) => {
                tracing::info!(%addr, spool = %h.dir().display(), ?settings.wrapping, "push endpoint listening")
            }
            None => tracing::info!(%addr, ?settings.wrapping, "push endpoint listening"),
        }
        Ok(PushSource {
            rx,
            auth,
            spooled,
            pending,
            counted: (0, 0),
            stopping,
            shutdown: Some(shutdown),
            addr,
            name: format!("push endpoint {addr}"),
        })
    }

    /// Where it listens (with port 0 in `listen`, the port the system chose).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The outcomes its settle side resolves.
    pub fn pending(&self) -> Arc<Pending> {
        self.pending.clone()
    }
}

#[async_trait::async_trait]
impl Source for PushSource {
    async fn next(&mut self) -> Option<SourceEvent> {
        if let Some((reader, _)) = &mut self.spooled {
            return reader.next().await;
        }
        if self.stopping.load(Ordering::SeqCst) {
            // Stopping: hand out what was already received, then end.
            return self.rx.try_recv().ok();
        }
        self.rx.recv().await
    }

    fn describe(&self) -> &str {
        &self.name
    }

    /// The endpoint stops accepting (its listener closes; a request on an open connection is
    /// answered 503) and answers what it received. Without a spool, what was received is still
    /// handed out (its requests wait for it). With one, the export goes on reading the spool
    /// until it has read everything answered 2xx — the spool ends once the endpoint's last
    /// request is answered — so that the run makes it durable within the shutdown grace rather
    /// than leaving it to a next run on the same disk, which may never come.
    fn stop(&mut self) -> bool {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        true
    }

    fn connected(&self) -> bool {
        self.problem().is_none()
    }

    fn problem(&self) -> Option<String> {
        self.auth
            .as_ref()
            .and_then(|a| a.problem())
            .or_else(|| self.spooled.as_ref().and_then(|(_, h)| h.problem()))
    }

    /// With a spool: no broker limit, but the spool's retry of failed files asks for the open
    /// files to be finalized ([`Source::held_back`]) — a limit no count reaches.
    fn flow_limit(&self) -> Option<crate::flow::FlowLimit> {
        self.spooled.as_ref().map(|_| crate::flow::FlowLimit {
            messages: Some(u64::MAX),
            bytes: None,
        })
    }

    fn held_back(&self) -> bool {
        self.spooled.as_ref().is_some_and(|(r, _)| r.holding())
    }

    /// With a spool: its gauges. Requests filtered before accept are read and filtered messages;
    /// refused ones are read, bad and nacked (the pusher redelivers them).
    fn report(&mut self, metrics: &SubscriptionMetrics, summary: &mut RunSummary) {
        if let Some((_, h)) = &self.spooled {
            let s = h.stats();
            metrics.spool(s.bytes, s.segments, s.oldest);
        }
        let (f, r) = (self.pending.filtered(), self.pending.refused());
        let (df, dr) = (f - self.counted.0, r - self.counted.1);
        self.counted = (f, r);
        summary.messages_read += df + dr;
        summary.messages_filtered += df;
        summary.bad_messages += dr;
        summary.messages_nacked += dr;
    }
}

/// How a push request is answered: a status, or a refusal with its reason as the body.
type Answer = Result<StatusCode, (StatusCode, String)>;

/// One push request. The request is taken whole (not its headers through an extractor, which
/// copies them): one less allocation on the path that must keep up. A request refused for what it
/// holds (400, 422) is answered with the reason as its body, as the log line says it.
async fn handle(State(s): State<Arc<Shared>>, req: axum::extract::Request) -> Answer {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            tracing::error!("push request: body not read: {e}");
            return Ok(StatusCode::PAYLOAD_TOO_LARGE);
        }
    };
    if let Some(v) = &s.auth {
        match v.check(&headers).await {
            Ok(()) => {}
            // The keys are not known yet: the pusher retries.
            Err(AuthError::NoKeys(why)) => {
                tracing::warn!("push request not checked: {why}");
                return Ok(StatusCode::SERVICE_UNAVAILABLE);
            }
            Err(AuthError::Refused(why)) => {
                tracing::warn!("push request refused: {why}");
                return Ok(StatusCode::UNAUTHORIZED);
            }
        }
    }
    if s.stopping.load(Ordering::SeqCst) {
        return Ok(StatusCode::SERVICE_UNAVAILABLE);
    }
    let (msg, attempt) = match parse_push(s.wrapping, &headers, &body) {
        Ok(m) => m,
        Err(why) => {
            tracing::error!("push request refused (400, nothing spooled): {why}");
            return Err((StatusCode::BAD_REQUEST, format!("{why}\n")));
        }
    };
    if let Some((spool, checks)) = &s.spool {
        let answer = spooled(spool, checks, msg, s.answer_within, &s.pending).await;
        if answer.as_ref().is_ok_and(StatusCode::is_success) {
            s.pending.answered.fetch_add(1, Ordering::Relaxed);
        }
        return answer;
    }
    let id = format!("push-{}", s.next_id.fetch_add(1, Ordering::Relaxed));
    let answer = s.pending.wait(&id);
    let r = Received {
        msg,
        receipt: Receipt {
            ack_id: Some(id.clone()),
            delivery_attempt: attempt,
            ..Default::default()
        },
    };
    if s.tx.send(SourceEvent::Messages(vec![r])).await.is_err() {
        s.pending.forget(&id);
        return Ok(StatusCode::SERVICE_UNAVAILABLE);
    }
    Ok(match tokio::time::timeout(s.answer_within, answer).await {
        Ok(Ok(true)) => StatusCode::NO_CONTENT,
        Ok(_) => StatusCode::SERVICE_UNAVAILABLE,
        Err(_) => {
            // Pub/Sub has given up on this request by now and will redeliver the message.
            s.pending.forget(&id);
            StatusCode::SERVICE_UNAVAILABLE
        }
    })
}

/// With a spool: the checks before accept, then the append; 2xx only once it is fsynced.
async fn spooled(
    spool: &SpoolWriter,
    checks: &Shaper,
    msg: Message,
    within: Duration,
    pending: &Pending,
) -> Answer {
    let msg = match checks.check(msg).await {
        Checked::Accept(m) => m,
        Checked::Filtered => {
            pending.filtered.fetch_add(1, Ordering::Relaxed);
            return Ok(StatusCode::NO_CONTENT);
        }
        Checked::Refused(id, why) => {
            pending.refused.fetch_add(1, Ordering::Relaxed);
            tracing::error!(message_id = %id, "push request refused: {why}");
            let body = format!("message {id}: {why}\n");
            return Err((StatusCode::UNPROCESSABLE_ENTITY, body));
        }
        Checked::Unavailable(why) => {
            tracing::warn!("push request not checked now: {why}");
            return Ok(StatusCode::SERVICE_UNAVAILABLE);
        }
    };
    Ok(
        match tokio::time::timeout(within, spool.append(&msg)).await {
            Ok(Ok(_)) => StatusCode::NO_CONTENT,
            Ok(Err(SpoolError::Full { .. })) => StatusCode::TOO_MANY_REQUESTS,
            Ok(Err(_)) | Err(_) => StatusCode::SERVICE_UNAVAILABLE,
        },
    )
}

/// A pushed message and its delivery attempt, from a request of the form `wrapping` says; why
/// the request is not one, naming the rule.
pub fn parse_push(
    wrapping: Wrapping,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Message, Option<i32>), String> {
    let write_metadata = match wrapping {
        Wrapping::Wrapped => {
            let env = serde_json::from_slice::<Envelope>(body).map_err(|e| {
                if let Some(unknown) = unknown_field(body) {
                    return unknown;
                }
                format!(
                    "not a push envelope: {e} (the subscription's pushConfig has no noWrapper, so \
                     the body must be the JSON envelope {{\"message\": {{…}}, \"subscription\": …}})"
                )
            })?;
            let m = env.message.ok_or(
                "the push envelope has no field `message` (the subscription's pushConfig has no \
                 noWrapper, so the body must be the JSON envelope {\"message\": {…}, \"subscription\": …})",
            )?;
            return Ok((m.into_message()?, env.delivery_attempt));
        }
        Wrapping::Unwrapped { write_metadata } => write_metadata,
    };
    // Unwrapped: the body is the payload whatever its content type; metadata and attributes
    // come in headers only with writeMetadata.
    let mut msg = Message {
        data: Bytes::copy_from_slice(body),
        ..Default::default()
    };
    if !write_metadata {
        // Nothing identifies the message: an id of its own, unique across workers and restarts.
        msg.message_id = uuid::Uuid::new_v4().to_string();
        msg.publish_time_micros = chrono::Utc::now().timestamp_micros();
        return Ok((msg, None));
    }
    for (k, v) in headers {
        let k = k.as_str();
        let Ok(v) = v.to_str() else { continue };
        match k {
            "x-goog-pubsub-message-id" => msg.message_id = v.to_string(),
            "x-goog-pubsub-publish-time" => {
                msg.publish_time_micros = crate::message::parse_rfc3339_micros(v)
                    .map_err(|e| format!("header {k}: {e}"))?
            }
            "x-goog-pubsub-ordering-key" => msg.ordering_key = v.to_string(),
            _ if k.starts_with("x-goog-") || is_transport_header(k) => {}
            _ => {
                msg.attributes.insert(k.to_string(), v.to_string());
            }
        }
    }
    if msg.message_id.is_empty() {
        return Err(
            "no header x-goog-pubsub-message-id (the subscription's pushConfig.noWrapper has \
             writeMetadata: Pub/Sub sends the message id with every request)"
                .to_string(),
        );
    }
    if msg.publish_time_micros == 0 {
        msg.publish_time_micros = chrono::Utc::now().timestamp_micros();
    }
    Ok((msg, None))
}

/// A field of the envelope, or of its message, that a push envelope does not have, named with the
/// nearest known one. Only on the error path (the body is parsed a second time, to walk it).
fn unknown_field(body: &[u8]) -> Option<String> {
    use crate::message::{fields, unknown_field};
    let v = serde_json::from_slice::<serde_json::Value>(body).ok()?;
    let env = v.as_object()?;
    let e = unknown_field(env, "", fields::ENVELOPE, "a push envelope").or_else(|| {
        let m = env.get("message")?.as_object()?;
        unknown_field(m, "message.", fields::MESSAGE, "a PubsubMessage")
    })?;
    Some(format!("not a push envelope: {e}"))
}

/// Headers HTTP and Pub/Sub's push transport add, which are not message attributes.
fn is_transport_header(k: &str) -> bool {
    matches!(
        k,
        "host"
            | "content-type"
            | "content-length"
            | "user-agent"
            | "accept"
            | "accept-encoding"
            | "authorization"
            | "connection"
            | "from"
            | "transfer-encoding"
            | "forwarded"
            | "via"
    ) || k.starts_with("x-forwarded-")
        || k.starts_with("x-cloud-trace")
        || k == "traceparent"
}

/// The envelope's fields ([`crate::message::fields::ENVELOPE`]): any other is refused.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Envelope<'a> {
    #[serde(borrow)]
    message: Option<PushedMessage<'a>>,
    #[serde(default)]
    #[allow(dead_code)] // read to be known; the source knows its subscription
    subscription: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    delivery_attempt: Option<i32>,
}

/// Borrowed from the request body where the JSON has no escapes (the base64 payload, the times).
/// A field a `PubsubMessage` does not have is refused.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PushedMessage<'a> {
    #[serde(default, borrow)]
    data: Option<Cow<'a, str>>,
    #[serde(default)]
    attributes: crate::message::Attributes,
    #[serde(default, borrow, rename = "messageId")]
    message_id: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "message_id")]
    message_id_snake: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "publishTime")]
    publish_time: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "publish_time")]
    publish_time_snake: Option<Cow<'a, str>>,
    #[serde(default, rename = "orderingKey", alias = "ordering_key")]
    ordering_key: Option<String>,
}

impl PushedMessage<'_> {
    fn into_message(self) -> Result<Message, String> {
        let data = match &self.data {
            Some(d) => crate::message::decode_base64(d.as_bytes())
                .map_err(|e| format!("field `message.data`: invalid base64: {e}"))?,
            None => Vec::new(),
        };
        let publish_time_micros = match self.publish_time.or(self.publish_time_snake) {
            Some(t) => crate::message::parse_rfc3339_micros(&t)
                .map_err(|e| format!("field `message.publishTime`: {e}"))?,
            None => chrono::Utc::now().timestamp_micros(),
        };
        let message_id = self
            .message_id
            .or(self.message_id_snake)
            .filter(|id| !id.is_empty())
            .ok_or("the push envelope has no field `message.messageId` (Pub/Sub sets it on every push)")?
            .into_owned();
        Ok(Message {
            data: data.into(),
            attributes: self.attributes,
            message_id,
            publish_time_micros,
            ordering_key: self.ordering_key.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapped_requests_carry_the_message_and_its_attempt() {
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/json".parse().unwrap());
        let body = br#"{"message":{"attributes":{"k":"v"},"data":"aGk=","messageId":"7",
            "message_id":"7","publishTime":"2021-02-26T19:13:55.749Z",
            "publish_time":"2021-02-26T19:13:55.749Z","orderingKey":"o"},
            "subscription":"projects/p/subscriptions/s","deliveryAttempt":3}"#;
        let (m, attempt) = parse_push(Wrapping::Wrapped, &h, body).unwrap();
        assert_eq!(&m.data[..], b"hi");
        assert_eq!(&m.attributes["k"], "v");
        assert_eq!((m.message_id.as_str(), m.ordering_key.as_str()), ("7", "o"));
        assert_eq!(m.publish_time_micros, 1_614_366_835_749_000);
        assert_eq!(attempt, Some(3));
        let bad = br#"{"message":{"data":"%%%","messageId":"1"}}"#;
        let e = parse_push(Wrapping::Wrapped, &h, bad).unwrap_err();
        assert!(e.contains("message.data"), "{e}");
    }

    /// Issue 34, point 3: with the wrapper, a body that is not the envelope is refused (400),
    /// whatever its content type — never taken as a payload — and the error names the rule.
    #[test]
    fn with_the_wrapper_a_body_that_is_not_an_envelope_is_refused() {
        for ct in [Some("application/json"), Some("text/plain"), None] {
            let mut h = HeaderMap::new();
            if let Some(ct) = ct {
                h.insert("content-type", ct.parse().unwrap());
            }
            let cases: [(&[u8], &str); 8] = [
                (b"not json", "not a push envelope"),
                (
                    br#"{"mesage":{"data":"aGk=","messageId":"1"}}"#,
                    "field `mesage`: unknown field, did you mean `message`?",
                ),
                (br#"{"order":1}"#, "field `order`: unknown field (a push envelope has message, subscription, deliveryAttempt"),
                (br#"{"message":null}"#, "field `message`"),
                (br#"{"message":{"data":"aGk="}}"#, "message.messageId"),
                (
                    br#"{"message":{"data":"aGk=","messageId":""}}"#,
                    "message.messageId",
                ),
                (
                    br#"{"message":{"data":"aGk=","messageId":7}}"#,
                    "not a push envelope",
                ),
                (
                    br#"{"message":{"data":"aGk=","messageId":"1","publishTime":"yesterday"}}"#,
                    "message.publishTime",
                ),
            ];
            for (body, rule) in cases {
                let e = parse_push(Wrapping::Wrapped, &h, body).unwrap_err();
                assert!(
                    e.contains(rule),
                    "{ct:?} {}: {e}",
                    String::from_utf8_lossy(body)
                );
            }
        }
    }

    /// Issue 44, point 1: an unknown field of the envelope or of its message is refused (400)
    /// naming it and the nearest known name, never dropped; every spelling Pub/Sub sends is read.
    #[test]
    fn an_unknown_field_of_an_envelope_is_refused() {
        let h = HeaderMap::new();
        for (body, want) in [
            (
                &br#"{"message":{"data":"aGk=","atributes":{"k":"v"},"messageId":"1"},"subscription":"s"}"#[..],
                "not a push envelope: field `message.atributes`: unknown field, did you mean `attributes`? (a PubsubMessage has data, attributes, messageId, publishTime, orderingKey; Pub/Sub refuses unknown fields)",
            ),
            (
                br#"{"message":{"data":"aGk=","messageId":"1"},"subscription":"s","deliveryattempt":2}"#,
                "not a push envelope: field `deliveryattempt`: unknown field, did you mean `deliveryAttempt`? (a push envelope has message, subscription, deliveryAttempt; Pub/Sub refuses unknown fields)",
            ),
        ] {
            let e = parse_push(Wrapping::Wrapped, &h, body).unwrap_err();
            assert_eq!(e, want, "{}", String::from_utf8_lossy(body));
        }
        let snake = br#"{"message":{"data":"aGk=","message_id":"7","publish_time":"2021-02-26T19:13:55Z","ordering_key":"o"},"subscription":"s"}"#;
        let (m, _) = parse_push(Wrapping::Wrapped, &h, snake).unwrap();
        assert_eq!((m.message_id.as_str(), m.ordering_key.as_str()), ("7", "o"));
    }

    #[test]
    fn unwrapped_requests_take_metadata_and_attributes_from_headers() {
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/json".parse().unwrap());
        h.insert("x-goog-pubsub-message-id", "42".parse().unwrap());
        h.insert(
            "x-goog-pubsub-publish-time",
            "2021-02-26T19:13:55.749Z".parse().unwrap(),
        );
        h.insert(
            "x-goog-pubsub-subscription-name",
            "projects/p/subscriptions/s".parse().unwrap(),
        );
        h.insert("tenant", "t-1".parse().unwrap());
        h.insert("user-agent", "pubsub".parse().unwrap());
        let meta = Wrapping::Unwrapped {
            write_metadata: true,
        };
        // A JSON payload that looks like an envelope is the data itself.
        let envelope = br#"{"message":{"data":"aGk=","messageId":"1"}}"#;
        let (m, attempt) = parse_push(meta, &h, envelope).unwrap();
        assert_eq!(&m.data[..], envelope);
        assert_eq!(m.message_id, "42");
        assert_eq!(m.publish_time_micros, 1_614_366_835_749_000);
        assert_eq!(
            m.attributes,
            crate::message::Attributes::from([("tenant", "t-1")])
        );
        assert_eq!(attempt, None);
        // writeMetadata promises the message id: a request without it is refused.
        h.remove("x-goog-pubsub-message-id");
        let e = parse_push(meta, &h, b"x").unwrap_err();
        assert!(e.contains("x-goog-pubsub-message-id"), "{e}");
    }

    /// Issue 34, point 3: without writeMetadata nothing but the payload comes: no header is an
    /// attribute, and each message gets an id of its own that no restart repeats (not a counter).
    #[test]
    fn unwrapped_requests_without_metadata_get_ids_unique_across_restarts() {
        let mut h = HeaderMap::new();
        h.insert("content-type", "text/plain".parse().unwrap());
        h.insert("x-request-id", "from-a-proxy".parse().unwrap());
        let bare = Wrapping::Unwrapped {
            write_metadata: false,
        };
        let mut ids = std::collections::HashSet::new();
        for _ in 0..1000 {
            let (m, _) = parse_push(bare, &h, b"not json").unwrap();
            assert_eq!(&m.data[..], b"not json");
            assert!(m.attributes.is_empty(), "{:?}", m.attributes);
            let id = uuid::Uuid::try_parse(&m.message_id).unwrap();
            assert_eq!(id.get_version_num(), 4);
            assert!(m.publish_time_micros > 0);
            assert!(ids.insert(m.message_id));
        }
    }

    #[test]
    fn the_wrapping_comes_from_the_subscriptions_push_config() {
        let sub = |j: serde_json::Value| -> crate::config::resource::Subscription {
            serde_json::from_value(j).unwrap()
        };
        assert_eq!(Wrapping::of(&sub(serde_json::json!({}))), Wrapping::Wrapped);
        assert_eq!(
            Wrapping::of(&sub(
                serde_json::json!({"pushConfig": {"pubsubWrapper": {}}})
            )),
            Wrapping::Wrapped
        );
        assert_eq!(
            Wrapping::of(&sub(serde_json::json!({"pushConfig": {"noWrapper": {}}}))),
            Wrapping::Unwrapped {
                write_metadata: false
            }
        );
        assert_eq!(
            Wrapping::of(&sub(
                serde_json::json!({"pushConfig": {"noWrapper": {"writeMetadata": true}}})
            )),
            Wrapping::Unwrapped {
                write_metadata: true
            }
        );
    }
}
