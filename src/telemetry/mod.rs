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

pub mod health;
pub mod http;
pub mod logs;
pub mod metrics;
pub mod progress;

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

    /// Handles that count and report into a private registry nobody reads.
    pub fn detached(name: &str) -> PipelineTelemetry {
        PipelineTelemetry::new(&Metrics::new(), &Health::default(), name)
    }
}
