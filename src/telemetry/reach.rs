//! Is the destination answering? Between uploads nothing tells: an upload stuck in its retries
//! (object_store's own retries take up to a minute before subsink's loop sees an error) says
//! nothing for a while. So while an upload has been under way for longer than [`STALLED_AFTER`],
//! the pipeline asks the store directly every [`PROBE_EVERY`]: a HEAD of a name nothing writes,
//! within [`PROBE_TIMEOUT`] and without retries of its own. An answer (found or not found) means
//! reachable, anything else (a refused connection, a timeout, a 5xx) not reachable; readiness
//! (`/readyz`) follows. The same question is asked once when the pipeline starts, so a pipeline
//! with nothing to write yet is ready as soon as its store answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _};
use tokio::task::JoinHandle;

use super::Probe;

/// An upload under way this long makes the pipeline look at the destination.
pub const STALLED_AFTER: Duration = Duration::from_secs(5);
/// How often the destination is asked while an upload is stalled.
pub const PROBE_EVERY: Duration = Duration::from_secs(2);
/// How long one question may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The name asked for (never written).
const PROBE_NAME: &str = ".subsink-readiness-probe";

/// The probing task of one pipeline; stops when dropped.
#[derive(Debug)]
pub struct ReachProbe {
    stalled: Arc<AtomicBool>,
    task: Option<JoinHandle<()>>,
}

impl ReachProbe {
    /// Start probing `dest` — the store, and its URL for logs — for `probe` (nothing to probe
    /// for `None`: the discard sink, BigQuery).
    pub fn start(dest: Option<(Arc<dyn ObjectStore>, String)>, probe: Probe) -> ReachProbe {
        let stalled = Arc::new(AtomicBool::new(false));
        let task = dest.map(|(store, url)| {
            let stalled = stalled.clone();
            tokio::spawn(async move {
                let path = Path::from(PROBE_NAME);
                // Once at startup (an idle pipeline is ready once its store answers), then while
                // an upload is stalled.
                let mut first = true;
                loop {
                    if !std::mem::take(&mut first) {
                        tokio::time::sleep(PROBE_EVERY).await;
                        if !stalled.load(Ordering::Acquire) {
                            continue;
                        }
                    }
                    let answer = tokio::time::timeout(PROBE_TIMEOUT, store.head(&path)).await;
                    let reachable = matches!(
                        answer,
                        Ok(Ok(_)) | Ok(Err(object_store::Error::NotFound { .. }))
                    );
                    if !reachable {
                        tracing::warn!(destination = %url, "destination not answering (an upload is stalled)");
                    }
                    probe.set_destination_reachable(reachable);
                }
            })
        });
        ReachProbe { stalled, task }
    }

    /// Whether an upload has been under way longer than [`STALLED_AFTER`].
    pub fn set_stalled(&self, yes: bool) {
        self.stalled.store(yes, Ordering::Release);
    }
}

impl Drop for ReachProbe {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
