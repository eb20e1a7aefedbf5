//! Wires the pipeline: source → filter → transforms → sink (batch + encode) → make durable → settle.
//!
//! [`run`] reads as build → loop → drain. It does not know which sink it drives ([`Stage`], built by
//! [`SinkSpec::build`]) nor how messages are settled ([`Settle`], chosen with the source).
//!
//! Delivery guarantee (docs/contract.md §2.4, §6): a message is settled only after the file holding
//! it is durable. Messages the filter does not match are settled at once and never written (§2.5).
//! With ordering (`enableMessageOrdering`, §2.6) one file is made durable at a time, in order; once
//! one fails, every later finalized or open file is failed too, so no later message of a key becomes
//! durable before an earlier one. On shutdown, pulling stops, open files are finalized and made
//! durable within `shutdown_grace`, durable ones settled and the rest handed back. The grace counts
//! from the signal and bounds every wait of the run (a batch, an upload slot, the drain); at its
//! end the files in flight are given up and the run returns within [`CLOSE_WITHIN`]
//! ([`crate::shutdown`]).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::batch::FlushReason;
use crate::config::ValidSubscription;
use crate::durable::{DurableOutcome, MakeDurable};
use crate::filter::Filter;
use crate::ids::Clock;
use crate::message::Received;
use crate::registry;
use crate::resources::{MemoryHeld, MemoryShare, Pressure, Resources};
use crate::settle::{Admission, Settle, SettleError, Verdict};
use crate::shutdown::Grace;
use crate::sink::{BuildError, FinalizedFile, PushError, Pushed, SinkError, Stage};
use crate::source::push::BeforeAccept;
use crate::source::SourceEvent;
use crate::telemetry::reach::{ReachProbe, STALLED_AFTER};
use crate::telemetry::report::{Holding, Report};
use crate::telemetry::PipelineTelemetry;
use crate::transform::{Outcome as Shape, Transforms};

pub use crate::registry::SourceSpec;
pub use crate::shutdown::CLOSE_WITHIN;
pub use crate::sink::SinkSpec;
pub use crate::summary::RunSummary;

/// Errors that stop a run before or outside the per-message path.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Source(#[from] crate::registry::SourceError),
    #[error("subscription filter: {0}")]
    Filter(#[from] crate::filter::FilterError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Settle(#[from] SettleError),
    #[error("message transforms: {0}")]
    Transform(#[from] crate::transform::TransformError),
}

impl From<SinkError> for RunError {
    fn from(e: SinkError) -> Self {
        RunError::Settle(SettleError::Sink(e))
    }
}

/// Everything a run needs, already validated.
pub struct RunConfig {
    pub subscription: ValidSubscription,
    /// Where messages come from, checked ([`crate::registry`]); connected by [`run`].
    pub source: SourceSpec,
    pub output: SinkSpec,
    pub seed: Option<u64>,
    pub clock: Clock,
    /// Upload slots and the memory budget, shared by every pipeline of the process.
    pub resources: Resources,
    /// Resolves when the run should stop gracefully (SIGTERM / SIGINT in the binary).
    pub shutdown: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// How long a graceful shutdown may spend finalizing and uploading open files, from the moment
    /// `shutdown` resolves; what is not durable by then is given up ([`crate::shutdown`]).
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
    // Watched from the start, on a task of its own: the grace counts from the signal, whatever
    // the run is waiting on then.
    let (grace, _watching) = Grace::start(shutdown, shutdown_grace);
    let m = telemetry.metrics.clone();
    let probe = telemetry.probe.clone();

    // Build: the sink's stage, the source and the settle side that goes with it.
    let dest = output.destination().map(|d| (d.store, d.url));
    // Publishing onto a topic keeps each ordering key's order across batches: one at a time.
    let publish = matches!(output, crate::sink::SinkSpec::Publish(_));
    let reach = ReachProbe::start(dest, probe.clone());
    let mut stage = output.build(&subscription, seed, clock).await?;
    let filter = Filter::parse(&subscription.delivery.filter)?;
    // Single Message Transforms (docs/transforms.md): one QuickJS engine per core.
    let transforms = match subscription.transforms.is_empty() {
        true => None,
        false => Some(std::sync::Arc::new(Transforms::start(
            &subscription.transforms,
            None,
        )?)),
    };
    let mut source = source.bounded_by(&resources);
    // A push endpoint with a spool runs the transforms and the sink's checks before accept.
    source.set_before_accept(BeforeAccept {
        transforms: transforms.clone(),
        sink: stage.check(),
        grace: Some(grace.clone()),
    });
    let (mut source, mut settle) =
        registry::connect(source, &subscription, stage.positions()).await?;
    // Its messages come filtered and transformed: not again.
    let (filter, transforms) = match source.shaped() {
        true => (Filter::parse("")?, None),
        false => (filter, transforms),
    };
    resume(&mut *settle, &mut *stage).await?;
    let flow_limit = source.flow_limit();
    let ordering = subscription.delivery.enable_message_ordering || publish;
    let lease = settle.leases().map(|l| l.period());
    let memory = resources.memory_share();
    let mut durable = MakeDurable::new(ordering, &resources, lease.is_some(), telemetry);
    durable.bounded_by(grace.clone());
    let mut summary = RunSummary::default();
    let mut done: Vec<FinalizedFile> = Vec::new();
    let period = lease.unwrap_or(Duration::from_secs(3600));
    let mut lease_tick = tokio::time::interval_at(Instant::now() + period, period);
    let mut report = Report::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // Over the memory budget with nothing of this pipeline's to finalize: stop reading.
    let mut paused = false;

    // Loop: until the source ends, fails, a bad input stops it, or a shutdown.
    'read: loop {
        let deadline = stage.next_deadline();
        tokio::select! {
            biased;
            Some(out) = durable.next() => {
                let mut p = Pipeline { stage: &mut *stage, settle: &mut *settle,
                    durable: &mut durable, done: &mut done, summary: &mut summary };
                let Some(r) = grace.bound(p.settle_outcome(out)).await else {
                    summary.shutdown = true;
                    break 'read;
                };
                r?;
            }
            // A broker source still draining what it received when the grace ends: stop there.
            _ = grace.over(), if summary.shutdown => break 'read,
            _ = grace.signalled(), if !summary.shutdown => {
                summary.shutdown = true;
                tracing::info!("shutting down: finalizing open files");
                // A broker source still hands out what it received, then ends.
                if !source.stop() {
                    break 'read;
                }
            }
            _ = lease_tick.tick(), if lease.is_some() => {
                if let Some(leases) = settle.leases() {
                    if grace.bound(leases.extend(stage.open_ack_ids())).await.is_none() {
                        summary.shutdown = true;
                        break 'read;
                    }
                }
            }
            _ = tick.tick() => {
                probe.beat();
                probe.set_source_connected(source.connected());
                probe.set_source_problem(source.problem());
                reach.set_stalled(durable.stalled(STALLED_AFTER));
                report.gauges(&m, holding(&*stage, &durable));
                source.count(&mut summary);
                report.counters(&m, &summary, source.reconnects());
                if let Some(s) = source.spool() {
                    m.spool(s.bytes, s.segments, s.oldest);
                }
                if let Some(a) = source.archive() {
                    m.archive(&a);
                }
            }
            _ = sleep_until(deadline), if deadline.is_some() => {
                stage.expire(Instant::now(), &mut done);
            }
            _ = memory.woken() => {}
            _ = tokio::time::sleep(MEMORY_RECHECK), if paused => {}
            ev = source.next(), if !paused => match ev {
                None => break 'read,
                Some(SourceEvent::Messages(batch)) => {
                    let mut p = Pipeline { stage: &mut *stage, settle: &mut *settle,
                        durable: &mut durable, done: &mut done, summary: &mut summary };
                    // A batch waits on the store (a part of a multipart upload, an upload slot):
                    // the grace bounds it.
                    let Some(r) = grace.bound(p.batch(&filter, transforms.as_deref(), &batch)).await else {
                        summary.shutdown = true;
                        break 'read;
                    };
                    if let Some(why) = r? {
                        summary.stopped = Some(why);
                        break 'read;
                    }
                }
                Some(SourceEvent::Bad(bad)) => {
                    summary.bad_lines += 1;
                    tracing::error!(file = %bad.file, line = bad.line, "{bad}");
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
        paused = relieve(&memory, &mut *stage, &durable, &mut done);
        let held_back = source.held_back();
        relieve_flow(
            flow_limit.as_ref(),
            held_back,
            &mut *stage,
            &durable,
            &mut done,
        );
        // Bounded inside: past the grace a file is given up instead of waiting for a slot.
        durable.start(&mut done, |f| settle.begin(f)).await?;
    }

    // Drain: finalize what is open, wait for it to be durable, settle. On shutdown (also one
    // that comes during an end-of-input drain) the files still in flight when the grace ends
    // come back given up; settling what came back and closing take at most CLOSE_WITHIN more.
    let reason = if summary.stopped.is_some() || summary.shutdown {
        FlushReason::Early
    } else {
        FlushReason::EndOfInput
    };
    stage.finalize_all(reason, &mut done);
    durable.start(&mut done, |f| settle.begin(f)).await?;
    let drained = grace
        .bound_by(CLOSE_WITHIN / 2, async {
            while durable.in_flight() > 0 {
                let Some(out) = durable.next().await else {
                    break;
                };
                let mut p = Pipeline {
                    stage: &mut *stage,
                    settle: &mut *settle,
                    durable: &mut durable,
                    done: &mut done,
                    summary: &mut summary,
                };
                p.settle_outcome(out).await?;
            }
            Ok::<(), RunError>(())
        })
        .await;
    match drained {
        Some(r) => r?,
        None => {
            let n = durable.abandon(&mut summary);
            tracing::error!(
                "shutdown: {n} file(s) still unsettled {CLOSE_WITHIN:?} after the grace; abandoned"
            );
        }
    }
    if grace
        .bound_by(CLOSE_WITHIN, settle.close(&mut summary))
        .await
        .transpose()?
        .is_none()
    {
        tracing::error!("shutdown: handing back what is not durable took longer than {CLOSE_WITHIN:?} after the grace; stopped waiting");
    }
    report.gauges(&m, holding(&*stage, &durable));
    source.count(&mut summary);
    report.counters(&m, &summary, source.reconnects());
    if let Some(a) = source.archive() {
        m.archive(&a);
    }
    summary.objects = durable.written();
    Ok(summary)
}

/// Settle what a crashed run left pending, if the source can have any: the sink says which of
/// those files are durable.
async fn resume(settle: &mut dyn Settle, stage: &mut dyn Stage) -> Result<(), RunError> {
    let Some(resume) = settle.resume() else {
        return Ok(());
    };
    let mut durable = HashSet::new();
    for name in resume.unresolved() {
        if stage.is_durable(&name).await? {
            tracing::info!(object = %name, "object of a previous run is durable");
            durable.insert(name);
        } else {
            tracing::info!(object = %name, "object of a previous run is not durable: its messages are written again under its name");
        }
    }
    Ok(resume.resolve(&durable)?)
}

/// The stages one turn of the loop drives: messages into the open files, finalized files into
/// the durable stage, outcomes to the settle side.
struct Pipeline<'a> {
    stage: &'a mut dyn Stage,
    settle: &'a mut dyn Settle,
    durable: &'a mut MakeDurable,
    done: &'a mut Vec<FinalizedFile>,
    summary: &'a mut RunSummary,
}

impl Pipeline<'_> {
    /// One batch of the source through the filter and the transforms into the sink. `Some(why)`
    /// when reading must stop (a bad message under `--on-bad-input fail`, or the destination
    /// failed while a file was open).
    async fn batch(
        &mut self,
        filter: &Filter,
        transforms: Option<&Transforms>,
        batch: &[Received],
    ) -> Result<Option<String>, RunError> {
        let passes = |r: &Received| filter.is_empty() || filter.matches(&r.msg.attributes);
        // The filter first, on the message as published; then the transforms, on every core.
        let mut shaped = match transforms {
            Some(t) => t.apply(batch, passes).await,
            None => Vec::new(),
        };
        for (i, r) in batch.iter().enumerate() {
            self.summary.messages_read += 1;
            if !passes(r) {
                self.summary.messages_filtered += 1;
                self.settle.filtered(r);
                continue;
            }
            let transformed;
            let outcome = shaped.get_mut(i).and_then(Option::take);
            let r = match self.transformed(r, outcome, transforms).await? {
                Shaped::Write(None) => r,
                Shaped::Write(Some(t)) => {
                    transformed = t;
                    &transformed
                }
                Shaped::Settled => continue,
                Shaped::Stop(why) => return Ok(Some(why)),
            };
            let group = self.stage.group_of(&r.msg);
            let mut pushed = match self.settle.admit(r, group.as_deref(), self.summary) {
                Admission::Write(ack) => self.stage.push(r, group, ack, self.done),
                Admission::Replay(replay) => self.stage.push_replay(r, group, &replay, self.done),
                Admission::Skip => continue,
            };
            let mut redelivered = false;
            loop {
                match pushed {
                    Ok(p) => {
                        self.settle.written(r);
                        if p == Pushed::NeedsFlush {
                            if let Err(e) = self.stage.flush().await {
                                if redelivered {
                                    return Err(e.into());
                                }
                                return Ok(Some(e.to_string()));
                            }
                        }
                    }
                    Err(PushError::Refused(e)) => {
                        if !redelivered {
                            self.summary.bad_messages += 1;
                        }
                        let refusal = self.stage.refusal();
                        match self.settle.refused(r, e, refusal, self.summary).await? {
                            Verdict::Continue => {}
                            Verdict::Stop(why) => return Ok(Some(why)),
                            Verdict::Redeliver => {
                                redelivered = true;
                                let group = self.stage.group_of(&r.msg);
                                pushed = self.stage.push(r, group, None, self.done);
                                continue;
                            }
                        }
                    }
                    // The destination failed while this message's file was open: reading stops;
                    // during a redelivery within the run, the run fails.
                    Err(PushError::Sink(e)) if redelivered => return Err(e.into()),
                    Err(PushError::Sink(e)) => return Ok(Some(e.to_string())),
                }
                break;
            }
            if !self.done.is_empty() {
                let settle = &mut *self.settle;
                self.durable.start(self.done, |f| settle.begin(f)).await?;
            }
        }
        self.settle.batch_done().await;
        Ok(None)
    }

    /// What the transforms made of `r`: the message to write, or settled here — filtered (acked,
    /// counted as filtered) or failed (as a message the sink refused, with the sink's
    /// [`crate::sink::Refusal`]: nacked with backoff and dead-lettered by a broker; a file source's
    /// `--on-bad-input`, or for a table its redelivery within the run — which transforms it
    /// again — then the dead-letter file).
    async fn transformed(
        &mut self,
        r: &Received,
        outcome: Option<Shape>,
        transforms: Option<&Transforms>,
    ) -> Result<Shaped, RunError> {
        let (Some(mut outcome), Some(t)) = (outcome, transforms) else {
            return Ok(Shaped::Write(None));
        };
        let mut redelivered = false;
        loop {
            match outcome {
                Shape::Keep(msg) => {
                    let receipt = r.receipt.clone();
                    return Ok(Shaped::Write(Some(Received { msg, receipt })));
                }
                Shape::Filtered { .. } => {
                    self.summary.messages_filtered += 1;
                    self.settle.filtered(r);
                    return Ok(Shaped::Settled);
                }
                Shape::Failed(e) => {
                    if !redelivered {
                        self.summary.bad_messages += 1;
                    }
                    // As a message the sink refused: the sink's policy (docs/transforms.md).
                    let refusal = self.stage.refusal();
                    match self
                        .settle
                        .refused(r, e.into(), refusal, self.summary)
                        .await?
                    {
                        Verdict::Continue => return Ok(Shaped::Settled),
                        Verdict::Stop(why) => return Ok(Shaped::Stop(why)),
                        Verdict::Redeliver => {
                            redelivered = true;
                            outcome = t.apply_one(&r.msg).await;
                        }
                    }
                }
            }
        }
    }

    /// A file came back from the durable stage: account for it, settle its messages, and hand
    /// over whatever was finalized meanwhile.
    async fn settle_outcome(&mut self, out: DurableOutcome) -> Result<(), RunError> {
        let gave_up = matches!(out.result, Err(SinkError::GaveUp { .. }));
        if self.durable.finished(&out, self.summary) && !gave_up {
            // Ordering: later messages of its keys sit in open files: fail those too.
            self.stage.finalize_all(FlushReason::Early, self.done);
        }
        if gave_up {
            // The shutdown grace is over: its messages are handed back by `Settle::close` (the
            // checkpoint does not pass them; a broker gets them back), without a failed delivery.
            return Ok(());
        }
        // Files just finalized (an ordered failure) are neither open nor handed over yet: the
        // watermark must not pass them either.
        let mut starts = self.stage.open_starts();
        starts.extend(
            self.done
                .iter()
                .map(|f| (f.contents.span.first, f.contents.first_line)),
        );
        self.settle
            .end(
                out.id,
                &out.name,
                &out.contents,
                &out.result,
                starts,
                self.summary,
            )
            .await?;
        if self.settle.failures_redelivered()
            && self.durable.in_flight() == 0
            && self.done.is_empty()
        {
            // Everything after the failure has been handed back: start afresh.
            self.durable.restart_order();
        }
        let settle = &mut *self.settle;
        Ok(self.durable.start(self.done, |f| settle.begin(f)).await?)
    }
}

/// A message after the transforms.
enum Shaped {
    /// Write it: `None` as it came, `Some` as transformed.
    Write(Option<Received>),
    /// Settled already (filtered, or failed and handed to the settle side).
    Settled,
    /// Reading stops (`--on-bad-input fail`).
    Stop(String),
}

/// What the pipeline holds now, for the gauges.
fn holding(stage: &dyn Stage, durable: &MakeDurable) -> Holding {
    Holding {
        open_files: stage.open_files(),
        buffered_bytes: stage.buffered_bytes() + durable.uploading(),
        oldest: stage
            .oldest_open()
            .into_iter()
            .chain(durable.oldest_opened())
            .min(),
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
    durable: &MakeDurable,
    done: &mut Vec<FinalizedFile>,
) -> bool {
    if !memory.limited() {
        return false;
    }
    loop {
        let held = MemoryHeld {
            open: stage.buffered_bytes(),
            uploading: durable.uploading() + done.iter().map(|f| f.buffered).sum::<u64>(),
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

/// While the source's flow control holds it back (or soon will) and what is outstanding sits in
/// open files, finalize the open file that frees most (reason `flow_control`), so the broker sends
/// more before `maxDuration` ([`crate::flow::pick`] decides; docs/decisions.md says why).
fn relieve_flow(
    limit: Option<&crate::flow::FlowLimit>,
    held_back: bool,
    stage: &mut dyn Stage,
    durable: &MakeDurable,
    done: &mut Vec<FinalizedFile>,
) {
    let Some(limit) = limit else {
        return;
    };
    // At most every open file; normally one.
    for _ in 0..stage.open_files() {
        let mut in_flight = durable.flowing();
        for f in done.iter() {
            in_flight += crate::durable::flow_held(f);
        }
        let open = stage.open_flow();
        let Some(id) = crate::flow::pick(limit, &open, in_flight, held_back) else {
            return;
        };
        tracing::debug!(
            in_flight = in_flight.messages,
            held_back,
            open = open.iter().map(|f| f.held.messages).sum::<u64>(),
            "flow control holds the source back: finalizing the open file that frees most"
        );
        stage.finalize_file(id, FlushReason::FlowControl, done);
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
