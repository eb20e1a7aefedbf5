//! Telemetry: metrics, health, logs and the progress bar — every name in one place, and small
//! handles the pipeline calls.
//!
//! | concern | module | what the pipeline calls |
//! |---|---|---|
//! | metrics | [`metrics`] | [`Metrics::subscription`] once, then [`SubscriptionMetrics`]`::received(n)`, `written(n, bytes)`, `finalized(reason)`, `file_durable(..)`, `open_files(n)`, … |
//! | health | [`health`] | [`Health::probe`] once, then [`Probe`]`::beat()` each loop turn, `set_source_connected`, `set_destination_reachable`; [`Health::set_shutting_down`] on SIGTERM |
//! | endpoint | [`http`] | [`http::serve`] at startup (`--metrics-addr`), [`http::TelemetryServer::stop`] after the drain |
//! | logs | [`logs`] | [`logs::init`] in `main`; [`logs::file_durable`] (or `SubscriptionMetrics::file_durable`) per durable file |
//! | progress | [`progress`] | nothing: the file source draws it |

pub mod health;
pub mod http;
pub mod logs;
pub mod metrics;
pub mod progress;

pub use health::{Health, Probe};
pub use logs::{DurableFile, LogFormat};
pub use metrics::{DurableKind, FinalizeReason, Metrics, RetryKind, SubscriptionMetrics};
