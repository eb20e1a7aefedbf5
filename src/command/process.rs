//! What the `run` and `serve` commands share as a process: the runtime, the shutdown signals
//! (SIGTERM / SIGINT) and the watchdog, the telemetry endpoint of `--metrics-addr`; and a flag
//! clap refuses, reported as text or as one JSON line.

use std::process::ExitCode;

use crate::cli::ServiceArgs;
use crate::telemetry::{self, Health, LogFormat, Metrics};

/// A flag clap refuses: its own message and exit code, or with `--log-format json` on the command
/// line one JSON line (exit 2), as every other line of the run is then.
pub fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let argv: Vec<String> = std::env::args().collect();
    let json = argv
        .windows(2)
        .any(|w| w[0] == "--log-format" && w[1] == "json")
        || argv.iter().any(|a| a == "--log-format=json");
    if !json || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let _ = telemetry::logs::init(LogFormat::Json);
    let text = e.render().to_string();
    let message = text
        .trim()
        .strip_prefix("error: ")
        .unwrap_or(text.trim())
        .replace('\n', " ");
    telemetry::logs::report("ERROR", &message, &[]);
    ExitCode::from(2)
}

/// How long the runtime may take to end its tasks once the work is over (tasks given up at the
/// end of the grace are dropped; a blocking read of stdin is not waited for).
pub(super) const RUNTIME_CLOSE: std::time::Duration = std::time::Duration::from_secs(1);

/// Watch for SIGTERM / SIGINT on a task of the runtime, so the signal is seen whatever the work
/// waits on: `/readyz` turns 503 for the whole drain and the watchdog starts
/// ([`crate::shutdown::watchdog`]: the process ends `grace` + 10 s after the signal whatever
/// hangs). The future resolves at the signal.
pub(super) fn on_shutdown_signal(
    rt: &tokio::runtime::Runtime,
    health: &Health,
    grace: std::time::Duration,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let health = health.clone();
    // Registered now, before anything runs: a signal from here on is seen.
    let signals = {
        let _rt = rt.enter();
        Signals::register()
    };
    rt.spawn(async move {
        signals.recv().await;
        health.set_shutting_down();
        crate::shutdown::watchdog(grace);
        tracing::info!(target: "subsink", grace = ?grace, "shutdown signal: finishing within the grace");
        tx.send_replace(true);
        // The receiver must not see the sender go before it reads the flag.
        std::future::pending::<()>().await;
    });
    async move {
        if rx.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Stop the telemetry endpoint, not waiting more than a second for clients that keep their
/// connections open.
pub(super) async fn stop_endpoint(server: telemetry::http::TelemetryServer) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), server.stop()).await;
}

/// The process's runtime (`run` and `serve`).
pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The telemetry endpoint of `--metrics-addr`, bound before anything runs so a bad address fails
/// at once (exit 2).
pub(super) fn endpoint(
    rt: &tokio::runtime::Runtime,
    s: &ServiceArgs,
    metrics: &Metrics,
    health: &Health,
) -> Result<Option<telemetry::http::TelemetryServer>, ExitCode> {
    let Some(addr) = &s.metrics_addr else {
        return Ok(None);
    };
    match rt.block_on(telemetry::http::serve(
        addr,
        metrics.clone(),
        health.clone(),
    )) {
        Ok(server) => Ok(Some(server)),
        Err(e) => {
            say_err!("error: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// SIGTERM and SIGINT, registered.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Register both handlers (inside a runtime): from now on the signals no longer end the
    /// process but wake [`Signals::recv`].
    fn register() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        Signals {
            term: signal(SignalKind::terminate()).expect("SIGTERM handler"),
            int: signal(SignalKind::interrupt()).expect("SIGINT handler"),
        }
    }

    /// Resolves on SIGTERM or SIGINT.
    async fn recv(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
