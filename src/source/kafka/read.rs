//! The running Kafka source: a read loop on its own task hands out chunks of records, pauses and
//! resumes the partitions as flow control says, and under `--exactly-once` asks the destination
//! before a partition's first record ([`super::exact`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::message::Message as _;
use rdkafka::TopicPartitionList;
use tokio::sync::{mpsc, Notify};

use super::consumer::{received, KafkaConnection, KafkaConsumer};
use super::exact::recover;
use super::offsets::{Offsets, Tp};
use crate::flow::{message_bytes, FlowLimit};
use crate::message::Received;
use crate::position::{DurableStreams, Streams};
use crate::resources::{held_bytes, Charge, InputGate, Resources};
use crate::source::{Source, SourceEvent};

/// Records handed out at once.
const CHUNK: usize = 500;
/// A chunk ends once its records hold this many bytes (module docs of [`super`], "Memory"): large
/// records are taken, and charged, a few at a time.
const CHUNK_BYTES: u64 = 1 << 20;
/// How long the budget may have no room for input before the partitions are paused (module docs
/// of [`super`], "Memory"): at once. Measured on 20 × 9 MiB at 64 MiB (debug): waiting 1 s
/// first (reading skipped meanwhile) ran in 26 s but peaked at 162–163 MiB, librdkafka's queue
/// (one 9 MiB record past its 4 MiB) and the response it was receiving held beside a full
/// budget; pausing at once drops them: 136–137 MiB, in 42–44 s (each large record is fetched again
/// after the resume, about a second later).
const PAUSE_AFTER: Duration = Duration::ZERO;
/// Chunks waiting for [`Source::next`].
const CHANNEL_CAPACITY: usize = 16;

/// The source's stop signal.
#[derive(Default)]
struct StopSignal {
    stopped: AtomicBool,
    notify: Notify,
}

/// A running consumer.
pub struct KafkaSource {
    /// Chunks from the read loop with their charges.
    rx: mpsc::Receiver<(SourceEvent, Charge)>,
    /// The charge of the chunk handed out last: released when the pipeline asks for the next.
    held: Charge,
    /// Records handed back for another delivery ([`KafkaSource::redeliver`]).
    retry_rx: mpsc::UnboundedReceiver<Received>,
    retry_tx: mpsc::UnboundedSender<Received>,
    stop: Arc<StopSignal>,
    name: String,
    offsets: Arc<Offsets>,
    flow: Option<FlowLimit>,
    paused: Arc<AtomicBool>,
    reading: bool,
}

impl KafkaSource {
    /// Start reading `consumer` on its own task, outside any memory budget.
    pub fn start(c: &KafkaConnection, name: String) -> KafkaSource {
        Self::start_gated(c, name, Resources::new(1, None).input_gate())
    }

    /// [`KafkaSource::start`] within the memory budget of `gate`: librdkafka's read-ahead
    /// ([`super::Prefetch`], when the settings have one) is charged for the life of the source,
    /// and what the read loop took until the pipeline takes it (module docs of [`super`]).
    pub fn start_gated(c: &KafkaConnection, name: String, gate: InputGate) -> KafkaSource {
        let s = &c.settings;
        let flow = FlowLimit::new(
            s.max_outstanding_messages.map_or(0, |v| v as i64),
            s.max_outstanding_bytes.map_or(0, |v| v as i64),
        );
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (retry_tx, retry_rx) = mpsc::unbounded_channel();
        let stop = Arc::new(StopSignal::default());
        let paused = Arc::new(AtomicBool::new(false));
        tokio::spawn(read_loop(
            c.consumer.clone(),
            c.offsets.clone(),
            tx,
            stop.clone(),
            (flow, paused.clone()),
            s.ordering,
            (s.streams(), c.durable_streams.clone()),
            (gate, s.prefetch.map_or(0, |p| p.bytes())),
        ));
        KafkaSource {
            rx,
            held: Charge::default(),
            retry_rx,
            retry_tx,
            stop,
            name,
            offsets: c.offsets.clone(),
            flow,
            paused,
            reading: true,
        }
    }

    /// Where the settle side hands a record back for another delivery.
    pub fn redeliver(&self) -> mpsc::UnboundedSender<Received> {
        self.retry_tx.clone()
    }
}

/// Are the records delivered and not settled at a flow-control limit?
fn over_limit(offsets: &Offsets, flow: Option<FlowLimit>) -> bool {
    flow.is_some_and(|f| {
        let (m, b) = offsets.outstanding();
        f.messages.is_some_and(|l| m >= l) || f.bytes.is_some_and(|l| b >= l)
    })
}

/// Pause or resume every assigned partition as flow control and the memory budget say (stopped
/// partitions stay paused). `hold`: the budget has no room for input; `state`: are the
/// partitions paused now; `paused`: by flow control (what [`Source::held_back`] says).
fn apply_flow(
    consumer: &KafkaConsumer,
    offsets: &Offsets,
    flow: Option<FlowLimit>,
    (paused, state): (&AtomicBool, &mut bool),
    hold: bool,
) {
    let over_flow = over_limit(offsets, flow);
    let over = over_flow || hold;
    let rebalanced = offsets.rebalanced.swap(false, Ordering::SeqCst);
    if over_flow != paused.swap(over_flow, Ordering::Relaxed) {
        tracing::debug!(paused = over_flow, "Kafka flow control");
    }
    if over == *state && !rebalanced {
        return;
    }
    let Ok(assigned) = consumer.assignment() else {
        return;
    };
    let stopped = offsets.stopped();
    if over {
        let _ = consumer.pause(&assigned);
    } else {
        let mut resume = TopicPartitionList::new();
        let mut stop = TopicPartitionList::new();
        for e in assigned.elements() {
            let tp = (e.topic().to_string(), e.partition());
            let list = if stopped.contains(&tp) {
                &mut stop
            } else {
                &mut resume
            };
            list.add_partition(e.topic(), e.partition());
        }
        let _ = consumer.resume(&resume);
        if stop.count() > 0 {
            let _ = consumer.pause(&stop);
        }
    }
    if over != *state {
        tracing::trace!(paused = over, memory = hold, "Kafka partitions");
    }
    *state = over;
}

/// `gate`: the memory budget, and the bytes of librdkafka's read-ahead charged to it for the life
/// of the loop.
#[allow(clippy::too_many_arguments)]
async fn read_loop(
    consumer: Arc<KafkaConsumer>,
    offsets: Arc<Offsets>,
    tx: mpsc::Sender<(SourceEvent, Charge)>,
    stop: Arc<StopSignal>,
    (flow, paused): (Option<FlowLimit>, Arc<AtomicBool>),
    ordering: bool,
    (streams, exact): (Streams, Option<Arc<dyn DurableStreams>>),
    (gate, prefetch): (InputGate, u64),
) {
    use futures::FutureExt;
    // librdkafka's queue and fetch, bounded by its settings, counted while the source lives.
    let standing = gate.charge(prefetch);
    let mut state = false;
    // Since when the budget has had no room for input.
    let mut full_since: Option<Instant> = None;
    while !stop.stopped.load(Ordering::SeqCst) {
        let room = gate.has_room(standing.bytes());
        let full_for = match (room, &full_since) {
            (true, _) => {
                full_since = None;
                Duration::ZERO
            }
            (false, Some(t)) => t.elapsed(),
            (false, None) => {
                full_since = Some(Instant::now());
                Duration::ZERO
            }
        };
        // A wait past `PAUSE_AFTER` pauses the partitions, so the loop goes on polling without
        // taking records (the group membership lives on) and librdkafka drops what it queued for
        // them; a shorter one only skips reading.
        let hold = !room && full_for >= PAUSE_AFTER;
        apply_flow(&consumer, &offsets, flow, (&paused, &mut state), hold);
        if !room && !hold {
            tokio::select! {
                _ = stop.notify.notified() => break,
                _ = tokio::time::sleep(gate.recheck()) => continue,
            }
        }
        // Rebalances and pauses are looked at again now and then while nothing comes; the
        // budget soon (it frees without telling this loop).
        let again = if room {
            Duration::from_millis(200)
        } else {
            gate.recheck()
        };
        let first = tokio::select! {
            m = consumer.recv() => m,
            _ = offsets.settled.notified() => continue,
            _ = stop.notify.notified() => break,
            _ = tokio::time::sleep(again) => continue,
        };
        // A borrowed message is not `Send`: none lives past this block.
        let (mut out, unchecked) = {
            let mut out = Vec::new();
            // `--exactly-once`: records of partitions whose next record is still to be looked up.
            let mut unchecked = Vec::new();
            let mut next = Some(first);
            while let Some(m) = next.take() {
                match m {
                    Ok(m) => {
                        let r = received(&m, ordering, &streams);
                        let tp = (m.topic().to_string(), m.partition());
                        offsets.down.store(false, Ordering::Relaxed);
                        if exact.is_some() && !offsets.checked(&tp) {
                            unchecked.push((tp, m.offset(), r));
                        } else {
                            offsets.delivered(&tp, m.offset(), message_bytes(&r.msg));
                            out.push(r);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "Kafka consumer"),
                }
                // A chunk ends at the flow-control limit (the partitions are paused before
                // more) and at `CHUNK_BYTES` (the budget is asked before more).
                if out.len() + unchecked.len() < CHUNK
                    && bytes(&out, &unchecked) < CHUNK_BYTES
                    && !over_limit(&offsets, flow)
                {
                    next = consumer.recv().now_or_never();
                }
            }
            (out, unchecked)
        };
        // Taken from librdkafka: charged until the pipeline takes them.
        let charge = gate.charge(bytes(&out, &unchecked));
        if let Some(positions) = &exact {
            for (tp, offset, r) in unchecked {
                let at = streams.at(&tp.0, tp.1, offset);
                if recover(positions.as_ref(), &consumer, &offsets, &tp, &at, &r).await {
                    continue;
                }
                offsets.delivered(&tp, offset, message_bytes(&r.msg));
                out.push(r);
            }
        }
        if !out.is_empty() && tx.send((SourceEvent::Messages(out), charge)).await.is_err() {
            return;
        }
    }
}

/// The bytes of a chunk as charged to the budget ([`held_bytes`]).
fn bytes(out: &[Received], unchecked: &[(Tp, i64, Received)]) -> u64 {
    held_bytes(out)
        + unchecked
            .iter()
            .map(|(_, _, r)| held_bytes(std::slice::from_ref(r)))
            .sum::<u64>()
}

#[async_trait::async_trait]
impl Source for KafkaSource {
    async fn next(&mut self) -> Option<SourceEvent> {
        if !self.reading {
            return None;
        }
        // The pipeline has taken the last chunk: its charge goes.
        self.held = Charge::default();
        tokio::select! {
            biased;
            Some(r) = self.retry_rx.recv() => Some(SourceEvent::Messages(vec![r])),
            e = self.rx.recv() => {
                let Some((e, charge)) = e else {
                    self.reading = false;
                    return None;
                };
                self.held = charge;
                Some(e)
            }
        }
    }

    fn describe(&self) -> &str {
        &self.name
    }

    /// A broker answers (librdkafka has not said that all are down since the last record or
    /// assignment).
    fn connected(&self) -> bool {
        !self.offsets.down.load(Ordering::Relaxed)
    }

    /// Read no more; what was read is handed out, then `next()` returns `None`. Records handed
    /// back for redelivery are left: their offsets are not committed.
    fn stop(&mut self) -> bool {
        self.stop.stopped.store(true, Ordering::SeqCst);
        self.stop.notify.notify_waiters();
        true
    }

    fn flow_limit(&self) -> Option<FlowLimit> {
        self.flow
    }

    /// Every partition is paused by flow control.
    fn held_back(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }
}
