//! Google Cloud Pub/Sub StreamingPull: a source of messages over the client of
//! [`crate::pubsub`].
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
//! ## Memory
//! With a memory budget ([`PubsubSource::start_gated`], `--memory-limit`), every batch is charged
//! to it ([`Charge`]) from the moment its response is decoded until the pipeline has taken it
//! (the next [`Source::next`]), and a pull task reads its stream's next response only while the
//! budget has room for input ([`InputGate::admit`]). So what the source holds is bounded by the
//! budget's input cap plus one response, whatever the server's flow control does: the emulator
//! ignores it, and a pipeline slowed down (a busy machine) would otherwise let up to
//! `CHANNEL_CAPACITY` responses pile up uncounted. HTTP/2 flow control holds the server back
//! meanwhile.
//!
//! ## Several streams
//! [`PubsubSettings::streams`] streams are open at once, each with its own pull task, client id
//! and share of the flow control, all feeding one [`Source::next`]; acks go on any open one.
//! Since the server paces every stream, this is how a worker receives more than one stream
//! delivers.
//!
//! ## Connected (readiness)
//! The source counts as connected ([`Source::connected`]) while a stream is open and answered, or
//! while Pub/Sub answers a GetSubscription for the subscription — asked at start, every
//! `REACH_POLL` (5 s) while no stream is answered, and at once when an answered stream ends.
//! Google answers a stream at once; the emulator (and any gRPC-Java server) only with its first
//! message, so an idle subscription would otherwise never look connected. PERMISSION_DENIED counts
//! as an answer: a plain subscriber may lack `pubsub.subscriptions.get`. An unreachable server, a
//! missing subscription or no answer within `REACH_TIMEOUT` count as not connected.
//!
//! ## Reconnecting and stopping
//! A stream that fails with a retryable status (or that the server closes, as Google does every
//! so often) is reopened after an exponential backoff, 100 ms doubling to 10 s, back to 100 ms
//! after a healthy stream; a non-retryable one (NOT_FOUND, PERMISSION_DENIED, …) ends the source
//! with [`SourceEvent::Failed`]. [`PubsubSource::stop`] half-closes every stream and reads each
//! to its end, so nothing the server already sent is lost; `next()` returns `None` after that.

pub mod build;
pub mod flags;
pub mod settle;

pub use self::flags::{PubsubArgs, PubsubFlagsError};

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::flow::FlowLimit;
use crate::input::{Source, SourceEvent};
use crate::message::{Message, Receipt, Received};
use crate::pubsub::{proto, Acker, Lane, PubsubClient, PubsubError, Stats, StreamItem};
use crate::resources::{held_bytes, Charge, InputGate};

/// An empty `StreamingPullRequest` is sent this often so idle streams are not cut by proxies
/// (what Google's client libraries do).
const STREAM_PING: Duration = Duration::from_secs(30);
/// Batches (one per StreamingPull response) buffered between the pull task and [`Source::next`].
/// Flow control bounds the messages in them (and, with a memory budget, so does the gate: module
/// docs, "Memory"); this bounds the batches.
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
/// While no stream is answered, how often the readiness probe asks Pub/Sub for the subscription.
const REACH_POLL: Duration = Duration::from_secs(5);
/// How long the readiness probe waits for that answer.
const REACH_TIMEOUT: Duration = Duration::from_secs(5);

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
            position: None,
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
    /// Flow control held to `memory_limit` (`--memory-limit`): at most half of it outstanding
    /// (`--max-outstanding-bytes` above that, or 0, is lowered to it, and the log says so).
    pub fn bounded_by(&mut self, memory_limit: Option<u64>) {
        if let Some(limit) = memory_limit {
            let half = (limit / 2).min(i64::MAX as u64) as i64;
            let flag = self.max_outstanding_bytes;
            if flag == 0 || flag > half {
                tracing::info!(
                    max_outstanding_bytes = half,
                    flag,
                    "Pub/Sub flow control: at most half of --memory-limit outstanding"
                );
                self.max_outstanding_bytes = half;
            }
        }
    }

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
    rx: mpsc::Receiver<(SourceEvent, Charge)>,
    /// The charge of the batch handed out last: released when the pipeline asks for the next.
    held: Charge,
    stop: PubsubStopHandle,
    /// Shared with the pull task.
    stats: Arc<Stats>,
    /// For `describe()`.
    subscription: String,
    acker: Acker,
    /// `max_outstanding_messages` / `max_outstanding_bytes`, over every stream.
    flow: Option<FlowLimit>,
}

impl PubsubSource {
    /// Validate `settings` and start pulling (needs a tokio runtime), outside any memory budget.
    pub fn start(client: PubsubClient, settings: PubsubSettings) -> Result<Self, PubsubError> {
        Self::start_gated(client, settings, None)
    }

    /// [`PubsubSource::start`] within the memory budget of `gate` (module docs, "Memory").
    pub fn start_gated(
        client: PubsubClient,
        settings: PubsubSettings,
        gate: Option<InputGate>,
    ) -> Result<Self, PubsubError> {
        settings.validate()?;
        let flow = FlowLimit::new(
            settings.max_outstanding_messages,
            settings.max_outstanding_bytes,
        );
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
        tokio::spawn(reach_task(
            client.clone(),
            subscription.clone(),
            stop_rx.clone(),
            stats.clone(),
        ));
        for (i, lane) in lanes.into_iter().enumerate() {
            tokio::spawn(pull_task(
                client.clone(),
                settings.stream(i),
                tx.clone(),
                stop_rx.clone(),
                lane,
                stats.clone(),
                gate.clone(),
            ));
        }
        Ok(PubsubSource {
            rx,
            held: Charge::default(),
            stop: PubsubStopHandle {
                stop: Arc::new(stop_tx),
            },
            stats,
            subscription,
            acker,
            flow,
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
        // The pipeline has taken the last batch: its charge goes.
        self.held = Charge::default();
        let (event, charge) = self.rx.recv().await?;
        self.held = charge;
        Some(event)
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

    /// A stream is answered, or Pub/Sub answered the last readiness probe (see the module docs).
    fn connected(&self) -> bool {
        self.stats.answered.load(Ordering::Relaxed) > 0
            || self.stats.reachable.load(Ordering::Relaxed)
    }

    fn flow_limit(&self) -> Option<FlowLimit> {
        self.flow
    }
}

/// The readiness probe (module docs, "Connected"): while no stream is answered, ask Pub/Sub for
/// the subscription every [`REACH_POLL`], and at once when an answered stream ends; until the
/// source is stopped or dropped.
async fn reach_task(
    client: PubsubClient,
    subscription: String,
    mut stop: watch::Receiver<bool>,
    stats: Arc<Stats>,
) {
    let mut was: Option<bool> = None;
    loop {
        if stats.answered.load(Ordering::Relaxed) == 0 {
            let answer = tokio::select! {
                a = client.answers_for(&subscription, REACH_TIMEOUT) => a,
                _ = stop.wait_for(|s| *s) => return,
            };
            let ok = answer.is_ok();
            stats.reachable.store(ok, Ordering::Relaxed);
            if was != Some(ok) {
                match &answer {
                    Ok(()) => {
                        tracing::debug!(%subscription, "Pub/Sub answers for the subscription")
                    }
                    Err(error) => {
                        tracing::warn!(%subscription, target = %client.target(), %error, "Pub/Sub does not answer for the subscription: not ready")
                    }
                }
                was = Some(ok);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(REACH_POLL) => {}
            _ = stats.stream_ended.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Counts a stream as answered while it lives (readiness); when it ends, the last probe's answer
/// is stale too, and the probe asks again.
struct AnsweredStream<'a> {
    stats: &'a Stats,
    counted: bool,
}

impl AnsweredStream<'_> {
    fn answered(&mut self) {
        if !self.counted {
            self.counted = true;
            self.stats.answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for AnsweredStream<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.stats.answered.fetch_sub(1, Ordering::Relaxed);
            self.stats.reachable.store(false, Ordering::Relaxed);
            self.stats.stream_ended.notify_one();
        }
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

/// The hand-over from a pull task to [`Source::next`]: each batch with its charge.
type Batches = mpsc::Sender<(SourceEvent, Charge)>;

/// What a pull task needs besides its stream's settings.
struct Pull<'a> {
    client: &'a PubsubClient,
    tx: &'a Batches,
    lane: &'a Lane,
    stats: &'a Stats,
    gate: Option<&'a InputGate>,
}

async fn pull_task(
    client: PubsubClient,
    settings: PubsubSettings,
    tx: Batches,
    stop: watch::Receiver<bool>,
    lane: Lane,
    stats: Arc<Stats>,
    gate: Option<InputGate>,
) {
    let pull = Pull {
        client: &client,
        tx: &tx,
        lane: &lane,
        stats: &stats,
        gate: gate.as_ref(),
    };
    // No stream from when this returns: acks go by unary calls ([`Acker`] finds the lane empty).
    pull_streams(&pull, &settings, stop).await;
}

async fn pull_streams(pull: &Pull<'_>, settings: &PubsubSettings, mut stop: watch::Receiver<bool>) {
    let Pull {
        client, tx, stats, ..
    } = *pull;
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
    loop {
        if *stop.borrow() {
            return;
        }
        let (error, healthy) = match pull_stream(pull, settings, &mut stop).await {
            StreamEnd::Stopped => return,
            StreamEnd::Broken { error, healthy } => (error, healthy),
        };
        if !error.retryable() {
            tracing::error!(subscription = %settings.subscription, %error, "StreamingPull failed for good");
            let failed = SourceEvent::Failed(error.to_string());
            let _ = tx.send((failed, Charge::default())).await;
            return;
        }
        if healthy {
            backoff.reset();
        }
        let delay = backoff.next_delay();
        let reconnects = stats.reconnects.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(
            subscription = %settings.subscription,
            target = %client.target(),
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
    pull: &Pull<'_>,
    settings: &PubsubSettings,
    stop: &mut watch::Receiver<bool>,
) -> StreamEnd {
    let Pull {
        client,
        lane,
        stats,
        gate,
        ..
    } = *pull;
    let broken = |error, healthy| StreamEnd::Broken { error, healthy };
    // The request half stays open for the life of the stream (the server ends a stream whose
    // requests end); it carries the first request, the pings, and the acks and deadline changes
    // of every [`Acker`] (through `lane`, once the server answered). Dropping every sender closes
    // it.
    let (req_tx, requests) = request_half(settings);
    let mut req_tx = Some(req_tx);
    // However this stream ends, acks stop going to it, and it no longer counts as answered.
    let _lane = LaneGuard(lane);
    let mut answered = AnsweredStream {
        stats,
        counted: false,
    };
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
            // The next response is read only while the memory budget has room for input.
            item = async {
                if let Some(g) = gate {
                    g.admit().await;
                }
                stream.as_mut().expect("guarded").message().await
            }, if stream.is_some() => Step::Item(item),
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
                answered.answered();
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
                if !hand_out(pull, resp).await {
                    return StreamEnd::Stopped; // the source was dropped
                }
            }
        }
    }
}

/// The request half of a StreamingPull stream, its first request queued: the sender the pings
/// and acks go by, and the stream tonic reads. Whoever waits for a request hears when tonic takes
/// it (to encode it and write it out).
fn request_half(
    settings: &PubsubSettings,
) -> (
    mpsc::Sender<StreamItem>,
    impl futures::Stream<Item = proto::StreamingPullRequest> + Send + 'static,
) {
    let (req_tx, req_rx) = mpsc::channel::<StreamItem>(REQUEST_QUEUE);
    let _ = req_tx.try_send((settings.first_request(), None));
    let requests = futures::stream::unfold(req_rx, |mut rx| async move {
        let (r, handed) = rx.recv().await?;
        if let Some(h) = handed {
            let _ = h.send(());
        }
        Some((r, rx))
    });
    (req_tx, requests)
}

/// Hand out the messages of one StreamingPull response, charged to the memory budget; false when
/// the source was dropped.
async fn hand_out(pull: &Pull<'_>, resp: proto::StreamingPullResponse) -> bool {
    let Pull {
        tx, stats, gate, ..
    } = *pull;
    let batch: Vec<Received> = resp
        .received_messages
        .into_iter()
        .filter_map(to_received)
        .collect();
    tracing::trace!(messages = batch.len(), "StreamingPull response");
    if batch.is_empty() {
        return true;
    }
    stats
        .messages
        .fetch_add(batch.len() as u64, Ordering::Relaxed);
    // Not raced against stop: a batch in hand is always handed out (the pipeline drains `next()`
    // until `None` during shutdown).
    let charge = gate.map_or_else(Charge::default, |g| g.charge(held_bytes(&batch)));
    tx.send((SourceEvent::Messages(batch), charge))
        .await
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
