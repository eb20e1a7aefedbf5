//! A shutdown that ends in bounded time (docs/operating.md, "Shutdown").
//!
//! The grace (`--shutdown-grace`) counts from the signal, not from whenever the pipeline gets
//! round to noticing it: [`Grace::start`] watches the shutdown future on a task of its own and
//! sets the deadline the moment it resolves, while the pipeline may be waiting on an upload slot,
//! a part of a multipart upload, a commit or an ack. Every wait of the pipeline that can last is
//! bounded by [`Grace::bound`]; at the deadline the files still being made durable are given up
//! ([`crate::sink::SinkError::GaveUp`]) and what remains — reporting them, handing their messages
//! back — takes at most [`CLOSE_WITHIN`]. Whatever still hangs past [`WATCHDOG_MARGIN`] after the
//! grace (a blocking system call, which no cancellation reaches) is ended by the binary's watchdog
//! ([`watchdog`]).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Once the grace is over, how long the pipeline may take to give up what is in flight, report
/// it and hand back its messages (nacks, the checkpoint) before it returns regardless.
pub const CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// How long after the grace the binary's watchdog ends the process, whatever still runs. A run
/// that is not stuck in a system call has returned [`CLOSE_WITHIN`] after the grace.
pub const WATCHDOG_MARGIN: Duration = Duration::from_secs(10);

/// The deadline of a graceful shutdown: unset until the shutdown is asked for, then the moment
/// the grace ends. Cheap to clone; every clone sees the same deadline.
#[derive(Clone, Debug)]
pub struct Grace {
    deadline: watch::Receiver<Option<Instant>>,
}

/// The task that watches for the shutdown; aborted when dropped.
#[derive(Debug)]
pub struct Watching(Option<JoinHandle<()>>);

impl Drop for Watching {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.abort();
        }
    }
}

impl Grace {
    /// A grace that never starts (no shutdown can be asked for).
    pub fn never() -> Grace {
        let (_tx, rx) = watch::channel(None);
        Grace { deadline: rx }
    }

    /// Watch `shutdown` on a task of its own (needs a tokio runtime): when it resolves, the grace
    /// starts and ends `grace` later. Keep the [`Watching`] for as long as a shutdown may come.
    pub fn start(
        shutdown: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
        grace: Duration,
    ) -> (Grace, Watching) {
        let Some(shutdown) = shutdown else {
            return (Grace::never(), Watching(None));
        };
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(async move {
            shutdown.await;
            let now = Instant::now();
            // A grace too long to add is no deadline at all.
            let end = now
                .checked_add(grace)
                .unwrap_or(now + Duration::from_secs(86400 * 365));
            tx.send_replace(Some(end));
            // Held until aborted, so the receivers never see the sender gone.
            std::future::pending::<()>().await;
        });
        (Grace { deadline: rx }, Watching(Some(task)))
    }

    /// When the grace ends, once a shutdown was asked for.
    pub fn deadline(&self) -> Option<Instant> {
        *self.deadline.borrow()
    }

    /// Resolves once a shutdown is asked for (at once if it was); never without one.
    pub async fn signalled(&self) -> Instant {
        let mut rx = self.deadline.clone();
        let end = rx.wait_for(Option::is_some).await.map(|d| *d);
        match end {
            Ok(Some(end)) => end,
            _ => std::future::pending().await,
        }
    }

    /// Resolves `extra` after the grace ends (never without a shutdown).
    pub async fn over_by(&self, extra: Duration) {
        let end = self.signalled().await;
        tokio::time::sleep_until(end + extra).await;
    }

    /// Resolves when the grace ends (never without a shutdown).
    pub async fn over(&self) {
        self.over_by(Duration::ZERO).await
    }

    /// Has the grace ended?
    pub fn is_over(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() >= d)
    }

    /// `fut`'s output, or `None` when the grace ends first (`fut` is dropped then).
    pub async fn bound<F: Future>(&self, fut: F) -> Option<F::Output> {
        self.bound_by(Duration::ZERO, fut).await
    }

    /// `fut`'s output, or `None` when `extra` after the grace passes first.
    pub async fn bound_by<F: Future>(&self, extra: Duration, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            out = fut => Some(out),
            _ = self.over_by(extra) => None,
        }
    }
}

/// The binary's last resort: from the signal, a thread (not a task: it must run when every
/// worker of the runtime is blocked) ends the process with exit code 1 once `grace` plus
/// [`WATCHDOG_MARGIN`] have passed, whatever still runs.
pub fn watchdog(grace: Duration) {
    let limit = grace.saturating_add(WATCHDOG_MARGIN);
    let spawned = std::thread::Builder::new()
        .name("shutdown-watchdog".into())
        .spawn(move || {
            std::thread::sleep(limit);
            tracing::error!(
                "still running {limit:?} after the shutdown signal (grace {grace:?} + margin {WATCHDOG_MARGIN:?}): exiting; what was not yet durable is not done"
            );
            crate::telemetry::logs::stderr_line(format_args!(
                "error: still running {:.1} s after the shutdown signal (--shutdown-grace {:.1} s + {} s): exiting; messages not yet durable are not done (a file source's checkpoint does not pass them; a broker redelivers them)",
                limit.as_secs_f64(),
                grace.as_secs_f64(),
                WATCHDOG_MARGIN.as_secs()
            ));
            std::process::exit(1);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the shutdown watchdog");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_grace_counts_from_the_signal_and_bounds_what_waits() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (grace, _watching) = Grace::start(
            Some(Box::pin(async move {
                let _ = rx.await;
            })),
            Duration::from_secs(3),
        );
        assert_eq!(grace.deadline(), None);
        // Nothing is bounded before the signal.
        let slow = grace
            .bound(tokio::time::sleep(Duration::from_secs(100)))
            .await;
        assert_eq!(slow, Some(()));
        let t0 = Instant::now();
        tx.send(()).unwrap();
        let at = grace.signalled().await;
        assert!(at - t0 >= Duration::from_secs(3) && at - t0 < Duration::from_secs(4));
        assert!(!grace.is_over());
        let hung = grace.bound(std::future::pending::<()>()).await;
        assert_eq!(hung, None);
        assert!(grace.is_over());
        assert_eq!(Instant::now(), at);
        // Later waits end at once; `extra` past the grace is still granted.
        assert_eq!(grace.bound(std::future::pending::<()>()).await, None);
        assert_eq!(
            grace.bound_by(Duration::from_secs(5), async { 7 }).await,
            Some(7)
        );
        grace.over_by(Duration::from_secs(5)).await;
        assert_eq!(Instant::now(), at + Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_shutdown_nothing_is_bounded() {
        let (grace, _w) = Grace::start(None, Duration::from_secs(1));
        let r = grace
            .bound(tokio::time::sleep(Duration::from_secs(1000)))
            .await;
        assert_eq!(r, Some(()));
        assert!(!grace.is_over());
    }
}
