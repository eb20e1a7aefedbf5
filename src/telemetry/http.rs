//! The telemetry endpoint (`--metrics-addr HOST:PORT`): `/metrics`, `/healthz` and `/readyz` on one
//! address, served by axum on the process's tokio runtime.
//!
//! Start it before the pipelines and stop it after they have drained, so `/readyz` says
//! "shutting down" (503) for the whole drain and the last scrape sees the final counts.

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::health::{Health, Status};
use super::metrics::Metrics;

/// The OpenMetrics text format (what [`Metrics::render`] writes); Prometheus asks for it in its
/// scrape `Accept` header and parses it natively.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("--metrics-addr {addr}: cannot listen: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Health,
}

/// A running telemetry endpoint. Dropping it without [`TelemetryServer::stop`] leaves it serving
/// until the runtime ends.
#[derive(Debug)]
pub struct TelemetryServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// Listen on `addr` (`HOST:PORT`; port 0 picks a free one) and serve in the background. Fails at
/// once when the address cannot be bound, so a bad flag stops the process at startup.
pub async fn serve(
    addr: &str,
    metrics: Metrics,
    health: Health,
) -> Result<TelemetryServer, TelemetryError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| TelemetryError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|source| TelemetryError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let app = router(metrics, health);
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "telemetry endpoint stopped");
        }
    });
    tracing::info!(addr = %local, "serving /metrics, /healthz, /readyz");
    Ok(TelemetryServer {
        addr: local,
        stop: Some(tx),
        task,
    })
}

impl TelemetryServer {
    /// The address it listens on (the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop accepting, finish the requests in flight, and wait for the server to end.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// The routes, for embedding in another server or for tests without a socket.
pub fn router(metrics: Metrics, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health })
}

async fn metrics_handler(State(s): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        s.metrics.render(),
    )
        .into_response()
}

async fn healthz(State(s): State<AppState>) -> Response {
    status_response(s.health.liveness())
}

async fn readyz(State(s): State<AppState>) -> Response {
    status_response(s.health.readiness())
}

/// 200 or 503, with a JSON body listing what failed (for a person reading `curl` output; probes
/// only look at the code).
fn status_response(st: Status) -> Response {
    let code = if st.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({
        "status": if st.ok { "ok" } else { "fail" },
        "problems": st.problems,
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response()
}
