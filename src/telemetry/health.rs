//! Liveness and readiness, as Kubernetes probes them: `/healthz` and `/readyz`.
//!
//! * **Live** (`/healthz`): the process answers and every pipeline loop has ticked its heartbeat
//!   within `stale_after`. A loop that stops ticking (a deadlock, a blocked runtime) turns it 503,
//!   so a liveness probe restarts the pod. Nothing else does: a store outage is not a reason to
//!   restart.
//! * **Ready** (`/readyz`): not shutting down, and for every pipeline its source is connected and
//!   its destination reachable. A store outage or a broken stream turns it 503 (a readiness probe
//!   takes the pod out of rotation, an alert can fire) until the pipeline sees it recover.
//!
//! The pipeline owns the facts; it reports them through a [`Probe`] (one per pipeline, i.e. per
//! subscription), with setters that are single atomic stores, cheap enough for the hot loop.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a loop may go without a heartbeat before `/healthz` fails, by default. Generous: a
/// loop ticks at least every second or so; a long synchronous encode of a big batch must not
/// restart the pod.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(60);

/// The process's health: every pipeline's [`Probe`] plus the shutdown flag. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    epoch: Instant,
    stale_after: Duration,
    shutting_down: AtomicBool,
    probes: Mutex<BTreeMap<String, Arc<ProbeState>>>,
}

#[derive(Debug)]
struct ProbeState {
    /// Milliseconds since `epoch` of the last heartbeat.
    beat_ms: AtomicU64,
    source_connected: AtomicBool,
    /// Why the source is not ready, when it says (`None`: "source not connected").
    source_problem: Mutex<Option<String>>,
    destination_reachable: AtomicBool,
    /// Why the destination cannot take what the pipeline writes, when it says so (a table in
    /// SCHEMA_MISMATCH): not ready, however reachable it is.
    destination_problem: Mutex<Option<String>>,
}

/// One pipeline's health facts. Cheap to clone; dropping it does not unregister it (see
/// [`Health::remove`]).
#[derive(Clone, Debug)]
pub struct Probe {
    epoch: Instant,
    state: Arc<ProbeState>,
}

/// The answer of a check: `Ok` with what was checked, or every reason it failed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    pub ok: bool,
    /// One line per failed condition, e.g. `projects/p/subscriptions/s: source not connected`.
    pub problems: Vec<String>,
}

impl Default for Health {
    fn default() -> Self {
        Health::new(DEFAULT_STALE_AFTER)
    }
}

impl Health {
    pub fn new(stale_after: Duration) -> Health {
        Health {
            inner: Arc::new(Inner {
                epoch: Instant::now(),
                stale_after,
                shutting_down: AtomicBool::new(false),
                probes: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// The probe of pipeline `name` (a subscription), created on first use with a fresh heartbeat,
    /// its source not connected and its destination not yet known to be reachable: a pipeline is
    /// ready once it says so.
    pub fn probe(&self, name: &str) -> Probe {
        let mut probes = self.inner.probes.lock().expect("health lock");
        let state = probes
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(ProbeState {
                    beat_ms: AtomicU64::new(self.inner.epoch.elapsed().as_millis() as u64),
                    source_connected: AtomicBool::new(false),
                    source_problem: Mutex::new(None),
                    destination_reachable: AtomicBool::new(false),
                    destination_problem: Mutex::new(None),
                })
            })
            .clone();
        Probe {
            epoch: self.inner.epoch,
            state,
        }
    }

    /// Forget pipeline `name` (`serve`: its subscription was deleted and its files are finalized).
    pub fn remove(&self, name: &str) {
        self.inner.probes.lock().expect("health lock").remove(name);
    }

    /// From now on `/readyz` fails: the process is draining (SIGTERM received).
    pub fn set_shutting_down(&self) {
        self.inner.shutting_down.store(true, Ordering::Release);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::Acquire)
    }

    /// `/healthz`: every pipeline's heartbeat is fresh.
    pub fn liveness(&self) -> Status {
        let now = self.inner.epoch.elapsed();
        let probes = self.inner.probes.lock().expect("health lock");
        let mut problems = Vec::new();
        for (name, p) in probes.iter() {
            let last = Duration::from_millis(p.beat_ms.load(Ordering::Acquire));
            let age = now.saturating_sub(last);
            if age > self.inner.stale_after {
                problems.push(format!(
                    "{name}: no heartbeat for {:.1}s (limit {:.1}s)",
                    age.as_secs_f64(),
                    self.inner.stale_after.as_secs_f64()
                ));
            }
        }
        Status {
            ok: problems.is_empty(),
            problems,
        }
    }

    /// `/readyz`: not shutting down, at least one pipeline, each connected and reachable.
    pub fn readiness(&self) -> Status {
        let mut problems = Vec::new();
        if self.is_shutting_down() {
            problems.push("shutting down".to_string());
        }
        let probes = self.inner.probes.lock().expect("health lock");
        if probes.is_empty() {
            problems.push("no pipeline running yet".to_string());
        }
        for (name, p) in probes.iter() {
            if !p.source_connected.load(Ordering::Acquire) {
                match &*p.source_problem.lock().expect("health lock") {
                    Some(why) => problems.push(format!("{name}: {why}")),
                    None => problems.push(format!("{name}: source not connected")),
                }
            }
            if !p.destination_reachable.load(Ordering::Acquire) {
                problems.push(format!("{name}: destination not reachable"));
            }
            if let Some(why) = &*p.destination_problem.lock().expect("health lock") {
                problems.push(format!("{name}: {why}"));
            }
        }
        Status {
            ok: problems.is_empty(),
            problems,
        }
    }
}

impl Probe {
    /// The pipeline loop is alive: call it on every turn of the loop (and from a periodic tick, so
    /// an idle pipeline stays live).
    pub fn beat(&self) {
        self.state
            .beat_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Release);
    }

    /// The source is connected (a file is open; a StreamingPull stream is up) or not (the stream
    /// broke and is being reopened).
    pub fn set_source_connected(&self, yes: bool) {
        self.state.source_connected.store(yes, Ordering::Release);
    }

    /// Why the source is not ready (shown by `/readyz` while it is not connected), or `None`.
    pub fn set_source_problem(&self, why: Option<String>) {
        let mut p = self.state.source_problem.lock().expect("health lock");
        if *p != why {
            *p = why;
        }
    }

    /// Why the destination cannot take the pipeline's files (shown by `/readyz` while set), or
    /// `None`: e.g. `SCHEMA_MISMATCH: …` while a table's schema no longer fits.
    pub fn set_destination_problem(&self, why: Option<String>) {
        let mut p = self.state.destination_problem.lock().expect("health lock");
        if *p != why {
            *p = why;
        }
    }

    /// The destination answered (a put or commit succeeded) or failed (an upload failed after its
    /// retries, a commit could not be written).
    pub fn set_destination_reachable(&self, yes: bool) {
        self.state
            .destination_reachable
            .store(yes, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_every_flag_and_no_shutdown() {
        let h = Health::default();
        assert!(!h.readiness().ok, "no pipeline yet");
        let p = h.probe("projects/p/subscriptions/s");
        assert_eq!(
            h.readiness().problems,
            [
                "projects/p/subscriptions/s: source not connected",
                "projects/p/subscriptions/s: destination not reachable"
            ]
        );
        p.set_source_connected(true);
        p.set_destination_reachable(true);
        assert!(h.readiness().ok);
        p.set_destination_reachable(false);
        assert_eq!(
            h.readiness().problems,
            ["projects/p/subscriptions/s: destination not reachable"]
        );
        p.set_destination_reachable(true);
        p.set_destination_problem(Some("SCHEMA_MISMATCH: table t: column `c`".into()));
        assert_eq!(
            h.readiness().problems,
            ["projects/p/subscriptions/s: SCHEMA_MISMATCH: table t: column `c`"]
        );
        p.set_destination_problem(None);
        assert!(h.readiness().ok);
        h.set_shutting_down();
        assert_eq!(h.readiness().problems, ["shutting down"]);
        assert!(h.liveness().ok, "draining is still alive");
    }

    #[test]
    fn stale_heartbeat_fails_liveness_until_the_next_beat() {
        let h = Health::new(Duration::from_millis(50));
        let p = h.probe("s");
        assert!(h.liveness().ok);
        std::thread::sleep(Duration::from_millis(120));
        let st = h.liveness();
        assert!(!st.ok);
        assert!(st.problems[0].starts_with("s: no heartbeat for"), "{st:?}");
        p.beat();
        assert!(h.liveness().ok);
        h.remove("s");
        assert!(h.liveness().ok);
        assert!(!h.readiness().ok);
    }
}
