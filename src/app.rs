//! Wires the pipeline: source → filter → sink (batch + encode) → make durable → settle.
//!
//! [`run`] reads as build → loop → drain. It does not know which sink it drives ([`Stage`], built by
//! [`Output::build`]) nor how messages are settled ([`Settle`], chosen with the source).
//!
//! Delivery guarantee (docs/contract.md §2.4, §6): a message is settled only after the file holding
//! it is durable. Messages the filter does not match are settled at once and never written (§2.5).
//! With ordering (`enableMessageOrdering`, §2.6) one file is made durable at a time, in order; once
//! one fails, every later finalized or open file is failed too, so no later message of a key becomes
//! durable before an earlier one. On shutdown, pulling stops, open files are finalized and made
//! durable within `shutdown_grace`, durable ones settled and the rest handed back.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};

use crate::resources::{Held, MemoryShare, Pressure, Resources};
use tokio::time::Instant;

use crate::batch::FlushReason;
use crate::config::ValidSubscription;
use crate::filter::Filter;
use crate::ids::Clock;
use crate::message::Received;
use crate::settle::{Admission, Settle, SettleError, Verdict};
use crate::sink::{
    BuildError, FileContents, FinalizedFile, PushError, Pushed, SinkError, Stage, Written,
};
use crate::source::registry;
use crate::source::SourceEvent;
use crate::telemetry::reach::{ReachProbe, STALLED_AFTER};
use crate::telemetry::{
    DurableFile, DurableKind, PipelineTelemetry, RetryKind, SubscriptionMetrics,
};

pub use crate::settle::dead_letter::dead_letter_message;
pub use crate::sink::object::{build_format, FormatError, FormatOptions};
pub use crate::sink::Output;
pub use crate::source::registry::SourceSpec;
pub use crate::summary::{FailedMessage, FailedObject, RunSummary, MAX_LISTED_FAILURES};

/// Errors that stop a run before or outside the per-message path.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Source(#[from] crate::source::registry::SourceError),
    #[error("subscription filter: {0}")]
    Filter(#[from] crate::filter::FilterError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Settle(#[from] SettleError),
}

impl From<SinkError> for RunError {
    fn from(e: SinkError) -> Self {
        RunError::Settle(SettleError::Sink(e))
    }
}

impl From<crate::checkpoint::CheckpointError> for RunError {
    fn from(e: crate::checkpoint::CheckpointError) -> Self {
        RunError::Settle(SettleError::Checkpoint(e))
    }
}

/// Everything a run needs, already validated.
pub struct RunConfig {
    pub subscription: ValidSubscription,
    /// Where messages come from, checked ([`crate::source::registry`]); connected by [`run`].
    pub source: SourceSpec,
    pub output: Output,
    pub seed: Option<u64>,
    pub clock: Clock,
    /// Upload slots and the memory budget, shared by every pipeline of the process.
    pub resources: Resources,
    /// Resolves when the run should stop gracefully (SIGTERM / SIGINT in the binary).
    pub shutdown: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// How long a graceful shutdown may spend finalizing and uploading open files.
    pub shutdown_grace: Duration,
    /// Metrics and health of this pipeline ([`PipelineTelemetry::detached`] when nobody reads them).
    pub telemetry: PipelineTelemetry,
}

/// Run the export until the end of input (file source) or a shutdown (any source).
pub async fn run(cfg: RunConfig) -> Result<RunSummary, RunError> {
    let RunConfig {
        subscription,
        source,
        output,
        seed,
        clock,
        resources,
        shutdown,
        shutdown_grace,
        telemetry,
    } = cfg;
    let m = telemetry.metrics.clone();
    let probe = telemetry.probe.clone();

    // Build: the sink's stage, the source and the settle side that goes with it.
    let reach = ReachProbe::start(output.destination(), probe.clone());
    let mut stage = output.build(&subscription, seed, clock).await?;
    let filter = Filter::parse(&subscription.delivery.filter)?;
    let (mut source, mut settle) = registry::connect(source, &subscription).await?;
    settle.resume(&mut *stage).await?;
    let ordering = subscription.delivery.enable_message_ordering;
    let lease = settle.lease_period();
    let memory = resources.memory_share();
    let mut uploads = Uploads::new(ordering, &resources, lease.is_some(), telemetry);
    let mut summary = RunSummary::default();
    let mut done: Vec<FinalizedFile> = Vec::new();
    let period = lease.unwrap_or(Duration::from_secs(3600));
    let mut lease_tick = tokio::time::interval_at(Instant::now() + period, period);
    let mut shutdown = shutdown.unwrap_or_else(|| Box::pin(std::future::pending()));
    let mut report = Report::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // Over the memory budget with nothing of this pipeline's to finalize: stop reading.
    let mut paused = false;

    // Loop: until the source ends, fails, a bad input stops it, or a shutdown.
    'read: loop {
        let deadline = stage.next_deadline();
        tokio::select! {
            biased;
            Some(up) = uploads.rx.recv() => {
                uploads.finished(up, &mut *settle, &mut *stage, &mut summary, &mut done).await?;
            }
            _ = &mut shutdown, if !summary.shutdown => {
                summary.shutdown = true;
                tracing::info!("shutting down: finalizing open files");
                // A broker source still hands out what it received, then ends.
                if !source.stop() {
                    break 'read;
                }
            }
            _ = lease_tick.tick(), if lease.is_some() => {
                settle.extend_leases(stage.open_ack_ids()).await;
            }
            _ = tick.tick() => {
                probe.beat();
                probe.set_source_connected(source.connected());
                reach.set_stalled(uploads.stalled(STALLED_AFTER));
                report.gauges(&m, &*stage, &uploads);
                report.counters(&m, &summary, source.reconnects());
            }
            _ = sleep_until(deadline), if deadline.is_some() => {
                stage.expire(Instant::now(), &mut done);
            }
            _ = memory.woken() => {}
            _ = tokio::time::sleep(MEMORY_RECHECK), if paused => {}
            ev = source.next(), if !paused => match ev {
                None => break 'read,
                Some(SourceEvent::Messages(batch)) => {
                    let mut w = Writing { filter: &filter, stage: &mut *stage, settle: &mut *settle,
                        uploads: &mut uploads, done: &mut done, summary: &mut summary };
                    if let Some(why) = w.batch(&batch).await? {
                        summary.stopped = Some(why);
                        break 'read;
                    }
                }
                Some(SourceEvent::Bad(bad)) => {
                    summary.bad_lines += 1;
                    tracing::error!("{bad}");
                    if let Verdict::Stop(why) = settle.bad_line(&bad) {
                        summary.stopped = Some(why);
                        break 'read;
                    }
                }
                Some(SourceEvent::Failed(e)) => {
                    summary.stopped = Some(e);
                    break 'read;
                }
            }
        }
        paused = relieve(&memory, &mut *stage, &uploads, &mut done);
        uploads.start(&mut done, &mut *settle).await?;
    }

    // Drain: finalize what is open, wait for it to be durable (within the grace on shutdown),
    // settle.
    let reason = if summary.stopped.is_some() || summary.shutdown {
        FlushReason::Early
    } else {
        FlushReason::EndOfInput
    };
    stage.finalize_all(reason, &mut done);
    uploads.start(&mut done, &mut *settle).await?;
    let grace = if summary.shutdown {
        shutdown_grace
    } else {
        Duration::MAX
    };
    let deadline = Instant::now().checked_add(grace);
    while uploads.in_flight > 0 {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, uploads.rx.recv()).await {
                Ok(n) => n,
                Err(_) => {
                    tracing::error!(
                        "shutdown grace of {grace:?} passed with uploads still running"
                    );
                    break;
                }
            },
            None => uploads.rx.recv().await,
        };
        let Some(up) = next else { break };
        uploads
            .finished(up, &mut *settle, &mut *stage, &mut summary, &mut done)
            .await?;
    }
    settle.close(&mut summary).await?;
    report.gauges(&m, &*stage, &uploads);
    report.counters(&m, &summary, source.reconnects());
    summary.objects = uploads.written();
    Ok(summary)
}

/// One batch of the source on its way through the filter into the sink.
struct Writing<'a> {
    filter: &'a Filter,
    stage: &'a mut dyn Stage,
    settle: &'a mut dyn Settle,
    uploads: &'a mut Uploads,
    done: &'a mut Vec<FinalizedFile>,
    summary: &'a mut RunSummary,
}

impl Writing<'_> {
    /// `Some(why)` when reading must stop (a bad message under `--on-bad-input fail`, or the
    /// destination failed while a file was open).
    async fn batch(&mut self, batch: &[Received]) -> Result<Option<String>, RunError> {
        for r in batch {
            self.summary.messages_read += 1;
            if !self.filter.is_empty() && !self.filter.matches(&r.msg.attributes) {
                self.summary.messages_filtered += 1;
                self.settle.filtered(r);
                continue;
            }
            let group = self.stage.group_of(&r.msg);
            let pushed = match self.settle.admit(r, group.as_deref(), self.summary) {
                Admission::Write(ack) => self.stage.push(r, group, ack, self.done),
                Admission::Replay(replay) => self.stage.push_replay(r, group, &replay, self.done),
                Admission::Skip => continue,
            };
            match pushed {
                Ok(pushed) => {
                    self.settle.written(r);
                    if pushed == Pushed::NeedsFlush {
                        if let Err(e) = self.stage.flush().await {
                            return Ok(Some(e.to_string()));
                        }
                    }
                }
                Err(PushError::Refused(e)) => {
                    self.summary.bad_messages += 1;
                    let refusal = self.stage.refusal();
                    let verdict = self
                        .settle
                        .refused(r, e, refusal, self.stage, self.done, self.summary)
                        .await?;
                    if let Verdict::Stop(why) = verdict {
                        return Ok(Some(why));
                    }
                }
                Err(PushError::Sink(e)) => return Ok(Some(e.to_string())),
            }
            if !self.done.is_empty() {
                self.uploads.start(self.done, self.settle).await?;
            }
        }
        self.settle.batch_done().await;
        Ok(None)
    }
}

/// A file made durable, or not.
struct Uploaded {
    id: u64,
    name: String,
    contents: FileContents,
    result: Result<Written, SinkError>,
    reason: FlushReason,
    kind: DurableKind,
    /// Start of `make_durable` → its end.
    latency: Duration,
}

/// A file being made durable.
struct InFlight {
    opened: Instant,
    since: Instant,
    bytes: u64,
}

/// Finalized files being made durable: at most `max_concurrent_uploads` at once (one with
/// ordering), each on its own task; their outcomes come back on `rx`.
struct Uploads {
    permits: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<Uploaded>,
    rx: mpsc::UnboundedReceiver<Uploaded>,
    /// Ordering: an earlier file failed, so later ones must not become durable.
    broken: Arc<AtomicBool>,
    ordering: bool,
    in_flight: usize,
    /// (id, name) of every durable file.
    written: Vec<(u64, String)>,
    /// Each file being made durable: when it was opened (oldest-unacked age), when it was handed
    /// over, and the bytes it holds.
    opened: std::collections::HashMap<u64, InFlight>,
    /// Bytes the files being made durable hold (the memory budget).
    uploading: u64,
    /// The source holds leases (a broker): never wait for a slot on the loop.
    leased: bool,
    /// Ordering: resolves when the last file started has finished.
    chain: Option<tokio::sync::oneshot::Receiver<()>>,
    telemetry: PipelineTelemetry,
}

impl Uploads {
    /// With ordering, files also wait for each other (a chain); the slots are the process's.
    fn new(
        ordering: bool,
        resources: &Resources,
        leased: bool,
        telemetry: PipelineTelemetry,
    ) -> Uploads {
        let (tx, rx) = mpsc::unbounded_channel();
        Uploads {
            permits: resources.upload_slots(),
            tx,
            rx,
            broken: Arc::new(AtomicBool::new(false)),
            ordering,
            in_flight: 0,
            written: Vec::new(),
            opened: std::collections::HashMap::new(),
            uploading: 0,
            leased,
            chain: None,
            telemetry,
        }
    }

    /// Has a file been under way for longer than `after`?
    fn stalled(&self, after: Duration) -> bool {
        self.opened.values().any(|f| f.since.elapsed() > after)
    }

    /// Durable files' names, in the order the files were opened.
    fn written(mut self) -> Vec<String> {
        self.written.sort();
        self.written.into_iter().map(|(_, n)| n).collect()
    }

    async fn start(
        &mut self,
        done: &mut Vec<FinalizedFile>,
        settle: &mut dyn Settle,
    ) -> Result<(), RunError> {
        for mut f in done.drain(..) {
            if f.contents.messages == 0 {
                // Opened for a message that then failed to encode: nothing to write.
                f.file.abort().await;
                continue;
            }
            let name = f.file.name().to_string();
            tracing::debug!(object = %name, reason = ?f.reason, messages = f.contents.messages, "finalize");
            self.telemetry.metrics.finalized(f.reason.into());
            settle.begin(&mut f)?;
            self.opened.insert(
                f.id,
                InFlight {
                    opened: f.opened_at,
                    since: Instant::now(),
                    bytes: f.buffered,
                },
            );
            self.uploading += f.buffered;
            // A leased source (a broker) must not wait here for a slot: the loop would stop extending
            // leases, and the messages would be redelivered and written twice (an outage of the
            // store); its flow control bounds what waits. A file source waits: that bounds memory.
            let held = if self.leased {
                None
            } else {
                Some(self.wait_for_slot().await)
            };
            // With ordering, each file waits for the one before it (a chain, not the semaphore's
            // wake-up order).
            let (prev, next) = if self.ordering {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                (self.chain.replace(rx), Some(tx))
            } else {
                (None, None)
            };
            let permits = self.permits.clone();
            let (tx, broken, ordering) = (self.tx.clone(), self.broken.clone(), self.ordering);
            self.in_flight += 1;
            let (reason, kind) = (f.reason, f.file.kind());
            tokio::spawn(crate::telemetry::scoped(
                self.telemetry.clone(),
                async move {
                    if let Some(prev) = prev {
                        let _ = prev.await;
                    }
                    let permit = match held {
                        Some(p) => p,
                        None => permits.acquire_owned().await.expect("never closed"),
                    };
                    let started = Instant::now();
                    let result = if ordering && broken.load(AtomicOrdering::SeqCst) {
                        f.file.abort().await;
                        Err(SinkError::OrderBroken { name: name.clone() })
                    } else {
                        f.file.make_durable().await
                    };
                    if ordering && result.is_err() {
                        // Before the next file goes: its task must see the failure.
                        broken.store(true, AtomicOrdering::SeqCst);
                    }
                    if let Some(next) = next {
                        let _ = next.send(());
                    }
                    let _ = tx.send(Uploaded {
                        id: f.id,
                        name,
                        contents: f.contents,
                        result,
                        reason,
                        kind,
                        latency: started.elapsed(),
                    });
                    drop(permit);
                },
            ));
        }
        Ok(())
    }

    /// An upload slot, for a source that may wait for one (a file: waiting bounds memory). The
    /// loop is alive while it waits (the store is slow or down): it keeps beating.
    async fn wait_for_slot(&self) -> tokio::sync::OwnedSemaphorePermit {
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        let acquire = self.permits.clone().acquire_owned();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                p = &mut acquire => return p.expect("never closed"),
                _ = beat.tick() => self.telemetry.probe.beat(),
            }
        }
    }

    async fn finished(
        &mut self,
        up: Uploaded,
        settle: &mut dyn Settle,
        stage: &mut dyn Stage,
        summary: &mut RunSummary,
        done: &mut Vec<FinalizedFile>,
    ) -> Result<(), RunError> {
        self.in_flight -= 1;
        if let Some(f) = self.opened.remove(&up.id) {
            self.uploading -= f.bytes;
        }
        let c = &up.contents;
        let probe = &self.telemetry.probe;
        match &up.result {
            Ok(w) => {
                // Messages the destination rejected one by one fail alone (the settle side
                // settles them so); the rest of the file is durable.
                let rejected = w.rejected.len() as u64;
                let messages = c.messages - rejected;
                summary.bad_messages += rejected;
                // The line subsink has always logged (scripts and tests grep it), then the
                // telemetry's line with the reason and latency.
                tracing::info!(object = %up.name, messages, bytes = w.bytes, "object written");
                if rejected > 0 {
                    tracing::warn!(object = %up.name, rejected, "messages rejected by the destination");
                }
                self.telemetry.file_durable(&DurableFile {
                    name: &up.name,
                    messages,
                    bytes: w.bytes,
                    reason: up.reason.into(),
                    latency: up.latency,
                    kind: up.kind,
                });
                probe.set_destination_reachable(true);
                summary.messages_written += messages;
                self.written.push((up.id, up.name.clone()));
            }
            Err(e) => {
                if !matches!(e, SinkError::OrderBroken { .. }) {
                    probe.set_destination_reachable(false);
                }
                tracing::error!(
                    "object {} failed: {e}; its {} messages (lines {}..={}, ids {}..{}) are not done",
                    up.name,
                    c.messages,
                    c.first_line,
                    c.last_line,
                    c.first_message_id,
                    c.last_message_id
                );
                summary.failed_objects.push(FailedObject {
                    object: up.name.clone(),
                    error: e.to_string(),
                    messages: c.messages,
                    first_line: c.first_line,
                    last_line: c.last_line,
                    first_message_id: c.first_message_id.clone(),
                    last_message_id: c.last_message_id.clone(),
                });
                if self.ordering {
                    // Later messages of its keys sit in open files: fail those too (on every
                    // failure: files opened since the last one hold later messages as well).
                    self.broken.store(true, AtomicOrdering::SeqCst);
                    stage.finalize_all(FlushReason::Early, done);
                }
            }
        }
        // Files just finalized (an ordered failure) are neither open nor started yet: the
        // watermark must not pass them either.
        let mut starts = stage.open_starts();
        starts.extend(
            done.iter()
                .map(|f| (f.contents.span.first, f.contents.first_line)),
        );
        settle
            .end(up.id, &up.name, c, &up.result, starts, summary)
            .await?;
        if settle.failures_redelivered() && self.in_flight == 0 && done.is_empty() {
            // Everything after the failure has been handed back: start afresh.
            self.broken.store(false, AtomicOrdering::SeqCst);
        }
        self.start(done, settle).await
    }
}

/// Turns the summary's counts into the metrics' counters (by difference since the last report) and
/// sets the gauges: one place that knows both.
#[derive(Default)]
struct Report {
    last: RunSummary,
    reconnects: u64,
}

impl Report {
    fn counters(&mut self, m: &SubscriptionMetrics, s: &RunSummary, reconnects: u64) {
        for _ in self.reconnects..reconnects {
            m.retried(RetryKind::Stream);
        }
        self.reconnects = self.reconnects.max(reconnects);
        let l = &self.last;
        m.received(s.messages_read - l.messages_read);
        m.filtered(s.messages_filtered - l.messages_filtered);
        m.bad((s.bad_lines + s.bad_messages) - (l.bad_lines + l.bad_messages));
        m.acked(s.messages_acked - l.messages_acked);
        m.nacked(s.messages_nacked - l.messages_nacked);
        m.dead_lettered(s.messages_dead_lettered - l.messages_dead_lettered);
        self.last = RunSummary {
            messages_read: s.messages_read,
            messages_filtered: s.messages_filtered,
            bad_lines: s.bad_lines,
            bad_messages: s.bad_messages,
            messages_acked: s.messages_acked,
            messages_nacked: s.messages_nacked,
            messages_dead_lettered: s.messages_dead_lettered,
            ..RunSummary::default()
        };
    }

    fn gauges(&self, m: &SubscriptionMetrics, stage: &dyn Stage, uploads: &Uploads) {
        m.open_files(stage.open_files());
        m.buffered_bytes(stage.buffered_bytes() + uploads.uploading);
        let oldest = stage
            .oldest_open()
            .into_iter()
            .chain(uploads.opened.values().map(|f| f.opened))
            .min();
        m.oldest_unacked_age(oldest.map_or(Duration::ZERO, |t| t.elapsed()));
    }
}

/// How often a pipeline paused by the memory budget looks at it again (besides when one of its
/// uploads ends or another pipeline wakes it).
const MEMORY_RECHECK: Duration = Duration::from_millis(50);

/// Report what this pipeline holds to the process's memory budget and finalize its largest open
/// file (reason `memory`) while the budget asks for it. `true`: stop reading for now.
fn relieve(
    memory: &MemoryShare,
    stage: &mut dyn Stage,
    uploads: &Uploads,
    done: &mut Vec<FinalizedFile>,
) -> bool {
    if !memory.limited() {
        return false;
    }
    loop {
        let held = Held {
            open: stage.buffered_bytes(),
            uploading: uploads.uploading + done.iter().map(|f| f.buffered).sum::<u64>(),
            largest: stage.largest_buffered(),
        };
        match memory.report(held) {
            Pressure::Fine => return false,
            Pressure::Wait => return true,
            Pressure::FinalizeLargest => {
                tracing::debug!(
                    open = held.open,
                    largest = held.largest,
                    "memory budget reached: finalizing the largest open file"
                );
                stage.finalize_largest(FlushReason::Memory, done);
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
