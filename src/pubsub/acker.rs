//! Acks and deadline changes for the messages of a StreamingPull source: on its open stream,
//! else by unary calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::client::{ack_batches, PubsubClient};
use super::error::PubsubError;
use super::proto;

/// Counters of a running [`PubsubSource`](crate::source::pubsub::PubsubSource); here because its
/// [`Acker`]s count what they settle in them.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Streams reopened after one failed or was closed (each is logged).
    pub(crate) reconnects: AtomicU64,
    /// Streams the server answered.
    pub(crate) streams: AtomicU64,
    /// Messages handed to the channel, redeliveries included.
    pub(crate) messages: AtomicU64,
    /// Streams open and answered now (readiness).
    pub(crate) answered: AtomicU64,
    /// The last GetSubscription of the readiness probe was answered (readiness while no stream
    /// is answered: the emulator answers an idle stream only with its first message).
    pub(crate) reachable: std::sync::atomic::AtomicBool,
    /// Wakes the readiness probe when an answered stream ends.
    pub(crate) stream_ended: tokio::sync::Notify,
    /// Ack ids acked or given a new deadline on a stream, and by unary calls.
    pub(crate) settled_on_stream: AtomicU64,
    pub(crate) settled_by_call: AtomicU64,
}

/// A request for the open stream, and who waits to hear that it was handed to the transport.
pub(crate) type StreamItem = (
    proto::StreamingPullRequest,
    Option<tokio::sync::oneshot::Sender<()>>,
);

/// The request queue of the stream that is open and answered, if one is: set by the pull task,
/// used by every [`Acker`].
pub(crate) type Lane = Arc<std::sync::Mutex<Option<mpsc::Sender<StreamItem>>>>;

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
    pub(crate) lanes: Arc<[Lane]>,
    /// Where the next ack starts looking for an open stream.
    pub(crate) next: Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) client: PubsubClient,
    pub(crate) subscription: String,
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
