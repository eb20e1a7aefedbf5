//! Telemetry: metrics, health, logs and the progress bar — every name in one place, and small
//! handles the pipeline calls.
//!
//! | concern | module | what the pipeline calls |
//! |---|---|---|
//! | metrics | [`metrics`] | [`Metrics::subscription`] once, then [`SubscriptionMetrics`]`::received(n)`, `written(n, bytes)`, `finalized(reason)`, `file_durable(..)`, `open_files(n)`, … |
//! | health | [`health`] | [`Health::probe`] once, then [`Probe`]`::beat()` each loop turn, `set_source_connected`, `set_destination_reachable`; [`Health::set_shutting_down`] on SIGTERM |
//! | endpoint | [`http`] | [`http::serve`] at startup (`--metrics-addr`), [`http::TelemetryServer::stop`] after the drain |
//! | logs | [`logs`] | [`logs::init`] in `main`; [`PipelineTelemetry::file_durable`] per durable file (counters and the log line) |
//! | progress | [`progress`] | nothing: the file source draws it |
//! | counters and gauges | [`report`] | [`report::Report`]`::counters` and `gauges` each second: the run summary's counts and what the pipeline holds |
//! | reachability | [`reach`] | [`reach::ReachProbe::start`] per pipeline, `set_stalled` each tick: the destination is asked directly while an upload is stalled |
//! | retries | [`retried`] | code deep in a stage with no handle (an upload's put retry, a Delta commit retry) inside the pipeline's [`scoped`] tasks |

pub mod health;
pub mod http;
pub mod logs;
pub mod metrics;
pub mod progress;
pub mod reach;
pub mod report;

pub use health::{Health, Probe};
pub use logs::LogFormat;
pub use metrics::DurableFile;
pub use metrics::{DurableKind, FinalizeReason, Metrics, RetryKind, SubscriptionMetrics};

/// What one pipeline (one subscription) reports through: its metrics handle and its health probe.
/// Cheap to clone. Put it in the pipeline's config; [`PipelineTelemetry::detached`] is the stand-in
/// for runs and tests that serve no endpoint.
#[derive(Clone, Debug)]
pub struct PipelineTelemetry {
    pub metrics: SubscriptionMetrics,
    pub probe: Probe,
}

impl PipelineTelemetry {
    /// The handles of subscription `name` in the process's registry and health.
    pub fn new(metrics: &Metrics, health: &Health, name: &str) -> PipelineTelemetry {
        PipelineTelemetry {
            metrics: metrics.subscription(name),
            probe: health.probe(name),
        }
    }

    /// A file became durable: its counters and latency, and its info log line.
    pub fn file_durable(&self, f: &DurableFile<'_>) {
        self.metrics.file_durable(f);
        logs::file_durable(self.metrics.subscription(), f);
    }

    /// An operation of `kind` is being tried again: counted, and an upload retry means the
    /// destination is not answering (readiness) until a file becomes durable again. (A commit
    /// retry is a race with another writer, not an outage.)
    pub fn retried(&self, kind: RetryKind) {
        self.metrics.retried(kind);
        if kind == RetryKind::Upload {
            self.probe.set_destination_reachable(false);
        }
    }

    /// Handles that count and report into a private registry nobody reads.
    pub fn detached(name: &str) -> PipelineTelemetry {
        PipelineTelemetry::new(&Metrics::new(), &Health::default(), name)
    }
}

tokio::task_local! {
    /// The telemetry of the pipeline a task works for (see [`scoped`]).
    static PIPELINE: PipelineTelemetry;
}

/// Run `f` as work of the pipeline `t`: [`retried`] inside it reports to `t`. The pipeline wraps
/// the tasks that make files durable in it, so the upload and commit code need no handle.
pub fn scoped<F: std::future::Future>(
    t: PipelineTelemetry,
    f: F,
) -> impl std::future::Future<Output = F::Output> {
    PIPELINE.scope(t, f)
}

/// An operation of `kind` is being tried again, in the current pipeline's task (nothing outside
/// one, e.g. in a test calling the upload code directly).
pub fn retried(kind: RetryKind) {
    let _ = PIPELINE.try_with(|t| t.retried(kind));
}
