//! Wires the pipeline: source → filter → transforms → sink (batch + encode) → make durable → settle.
//!
//! [`run`] reads as build → loop → drain. It does not know which sink it drives ([`OpenFiles`], built by
//! [`SinkSpec::build`] from the sink's registration, [`crate::sink::registry`]) nor how messages are
//! settled ([`crate::settle::Settle`], chosen with the source).
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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::batch::FlushReason;
use crate::config::ValidSubscription;
use crate::connect::{Connected, Context};
use crate::durable::MakeDurable;
use crate::filter::Filter;
use crate::ids::Clock;
use crate::input::SourceEvent;
use crate::pipeline::{resume, Pipeline};
use crate::registry;
use crate::resources::{MemoryHeld, MemoryShare, Pressure, Resources};
use crate::settle::Verdict;
use crate::shape::Shaper;
use crate::shutdown::Grace;
use crate::sink::{FinalizedFile, OpenFiles};
use crate::telemetry::reach::{ReachProbe, STALLED_AFTER};
use crate::telemetry::report::{Holding, Report};
use crate::telemetry::PipelineTelemetry;
use crate::transform::Transforms;

pub use crate::pipeline::RunError;
pub use crate::registry::SourceSpec;
pub use crate::shutdown::CLOSE_WITHIN;
pub use crate::sink::SinkSpec;
pub use crate::summary::RunSummary;

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

/// Run the export until the end of input (a source that ends) or a shutdown (any source).
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
    // A sink that keeps each key's order across batches (a topic's): one file at a time.
    let ordering = subscription.delivery.enable_message_ordering || output.keeps_key_order();
    let reach = ReachProbe::start(dest, probe.clone());
    let mut stage = output.build(&subscription, seed, clock).await?;
    stage.bounded_by(&grace);
    let shaper = shaper_of(&subscription, &*stage)?;
    let c = connect(
        source,
        &subscription,
        &resources,
        &shaper,
        &grace,
        &mut *stage,
    )
    .await?;
    let (mut source, mut settle) = (c.source, c.settle);
    // Its messages come shaped already: not again.
    let shaper = (!c.shaped).then_some(shaper);
    resume(&mut *settle, &mut *stage).await?;
    let flow_limit = source.flow_limit();
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
                if grace.bound(p.settle_outcome(out)).await.transpose()?.is_none() {
                    summary.shutdown = true;
                    break 'read;
                }
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
                if !extend_leases(&mut *settle, &mut *stage, &grace).await {
                    summary.shutdown = true;
                    break 'read;
                }
            }
            _ = tick.tick() => {
                beat(&probe, &reach, &*source, &*stage, &durable);
                report_now(&mut report, &m, (&mut *source, &*stage, &durable), &mut summary);
            }
            _ = sleep_until(deadline), if deadline.is_some() => {
                stage.expire(Instant::now(), &mut done);
            }
            _ = memory.woken() => {}
            _ = tokio::time::sleep(MEMORY_RECHECK), if paused => {}
            ev = source.next(), if !paused => {
                let mut p = Pipeline { stage: &mut *stage, settle: &mut *settle,
                    durable: &mut durable, done: &mut done, summary: &mut summary };
                if take(&mut p, ev, shaper.as_deref(), &grace).await? {
                    break 'read;
                }
            }
        }
        paused = relieve(&memory, &mut *stage, &durable, &mut done);
        relieve_flow(
            flow_limit.as_ref(),
            source.held_back(),
            &mut *stage,
            &durable,
            &mut done,
        );
        // Bounded inside: past the grace a file is given up instead of waiting for a slot.
        durable.start(&mut done, |f| settle.begin(f)).await?;
    }

    // Drain: finalize what is open, wait for it to be durable, settle.
    drain(
        &mut *stage,
        &mut *settle,
        &mut durable,
        &mut done,
        &mut summary,
        &grace,
    )
    .await?;
    report_now(
        &mut report,
        &m,
        (&mut *source, &*stage, &durable),
        &mut summary,
    );
    summary.objects = durable.written();
    Ok(summary)
}

/// Every second: the pipeline is alive, and what its source and sink say of themselves.
fn beat(
    probe: &crate::telemetry::Probe,
    reach: &ReachProbe,
    source: &dyn crate::input::Source,
    stage: &dyn OpenFiles,
    durable: &MakeDurable,
) {
    probe.beat();
    probe.set_source_connected(source.connected());
    probe.set_source_problem(source.problem());
    probe.set_destination_problem(stage.problem());
    reach.set_stalled(durable.stalled(STALLED_AFTER));
}

/// The gauges and counters of the pipeline (`held`: its source, open files and files being made
/// durable) and its summary, reported to the metrics `m`.
fn report_now(
    report: &mut Report,
    m: &crate::telemetry::SubscriptionMetrics,
    (source, stage, durable): (&mut dyn crate::input::Source, &dyn OpenFiles, &MakeDurable),
    summary: &mut RunSummary,
) {
    report.gauges(m, holding(stage, durable));
    source.report(m, summary);
    report.counters(m, summary, source.reconnects());
}

/// The source of `spec` and its settle side, connected for the sink's open files `stage` (how
/// far its destination holds each stream) with the run's `shaper`.
async fn connect(
    spec: SourceSpec,
    subscription: &ValidSubscription,
    resources: &Resources,
    shaper: &Arc<Shaper>,
    grace: &Grace,
    stage: &mut dyn OpenFiles,
) -> Result<Connected, RunError> {
    let ctx = Context {
        subscription,
        resources,
        shaper: shaper.clone(),
        grace: Some(grace.clone()),
        durable_streams: stage.durable_streams(),
    };
    Ok(registry::connect(spec, &ctx).await?)
}

/// Extend the leases of what the open files hold, for a settle side with leases. `false`: the
/// grace ended first.
async fn extend_leases(
    settle: &mut dyn crate::settle::Settle,
    stage: &mut dyn OpenFiles,
    grace: &Grace,
) -> bool {
    match settle.leases() {
        Some(leases) => grace
            .bound(leases.extend(stage.open_ack_ids()))
            .await
            .is_some(),
        None => true,
    }
}

/// The filter, the transforms and the sink's own checks, as one value: the pipeline runs it on
/// every batch, and a source that answers for a message before the pipeline sees it runs the
/// same before it accepts the message.
fn shaper_of(
    subscription: &ValidSubscription,
    stage: &dyn OpenFiles,
) -> Result<Arc<Shaper>, RunError> {
    let filter = Filter::parse(&subscription.delivery.filter)?;
    // Single Message Transforms (docs/transforms.md): one QuickJS engine per core.
    let transforms = match subscription.transforms.is_empty() {
        true => None,
        false => Some(std::sync::Arc::new(Transforms::start(
            &subscription.transforms,
            None,
        )?)),
    };
    Ok(Arc::new(Shaper::new(filter, transforms, stage.check())))
}

/// Hand one source event to the pipeline `p`: a batch, a bad input line, the source's failure.
/// `true`: the run stops reading (the source ended, a shutdown, a bad input that stops it, a
/// failure).
async fn take(
    p: &mut Pipeline<'_>,
    ev: Option<SourceEvent>,
    shaper: Option<&Shaper>,
    grace: &Grace,
) -> Result<bool, RunError> {
    let Some(ev) = ev else {
        return Ok(true);
    };
    match ev {
        SourceEvent::Messages(batch) => {
            // A batch waits on the store (a part of a multipart upload, an upload slot): the
            // grace bounds it.
            let Some(r) = grace.bound(p.batch(shaper, &batch)).await else {
                p.summary.shutdown = true;
                return Ok(true);
            };
            if let Some(why) = r? {
                p.summary.stopped = Some(why);
                return Ok(true);
            }
        }
        SourceEvent::Bad(bad) => {
            p.summary.bad_lines += 1;
            tracing::error!(file = %bad.file, line = bad.line, "{bad}");
            if let Verdict::Stop(why) = p.settle.bad_line(&bad) {
                p.summary.stopped = Some(why);
                return Ok(true);
            }
        }
        SourceEvent::Failed(e) => {
            p.summary.stopped = Some(e);
            return Ok(true);
        }
    }
    Ok(false)
}

/// The drain at the end of a run: finalize what is open, wait for it to be durable, settle. On
/// shutdown (also one that comes during an end-of-input drain) the files still in flight when the
/// grace ends come back given up; settling what came back and closing take at most
/// [`CLOSE_WITHIN`] more.
async fn drain(
    stage: &mut dyn OpenFiles,
    settle: &mut dyn crate::settle::Settle,
    durable: &mut MakeDurable,
    done: &mut Vec<FinalizedFile>,
    summary: &mut RunSummary,
    grace: &Grace,
) -> Result<(), RunError> {
    let reason = if summary.stopped.is_some() || summary.shutdown {
        FlushReason::Early
    } else {
        FlushReason::EndOfInput
    };
    stage.finalize_all(reason, done);
    durable.start(done, |f| settle.begin(f)).await?;
    let drained = grace
        .bound_by(CLOSE_WITHIN / 2, async {
            while durable.in_flight() > 0 {
                let Some(out) = durable.next().await else {
                    break;
                };
                let mut p = Pipeline {
                    stage: &mut *stage,
                    settle: &mut *settle,
                    durable: &mut *durable,
                    done: &mut *done,
                    summary: &mut *summary,
                };
                p.settle_outcome(out).await?;
            }
            Ok::<(), RunError>(())
        })
        .await;
    match drained {
        Some(r) => r?,
        None => {
            let n = durable.abandon(summary);
            tracing::error!(
                "shutdown: {n} file(s) still unsettled {CLOSE_WITHIN:?} after the grace; abandoned"
            );
        }
    }
    if grace
        .bound_by(CLOSE_WITHIN, settle.close(summary))
        .await
        .transpose()?
        .is_none()
    {
        tracing::error!("shutdown: handing back what is not durable took longer than {CLOSE_WITHIN:?} after the grace; stopped waiting");
    }
    Ok(())
}

/// What the pipeline holds now, for the gauges.
fn holding(stage: &dyn OpenFiles, durable: &MakeDurable) -> Holding {
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
    stage: &mut dyn OpenFiles,
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
    stage: &mut dyn OpenFiles,
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
