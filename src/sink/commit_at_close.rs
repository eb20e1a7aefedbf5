//! The exactly-once commit-at-close of every table sink: a closed batch whose commit is chained
//! behind earlier commits (`--exactly-once` with a positioned source: a partition's commits land
//! in offset order; change data capture: MERGEs in the batches' order) is under way on a task of
//! its own from the moment it closes, so that it never waits for a slot held by a later batch
//! waiting for it. Any other batch is written when it is made durable.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::task::{JoinError, JoinHandle};

use super::Written;

/// A closed batch a table sink commits: what it takes to make it durable.
pub trait ClosedBatch: Send + 'static {
    /// Why the batch was not committed.
    type Error: Send + 'static;

    /// Write and commit the batch. `cancelled` set: given up before its commit (nothing
    /// committed).
    fn write(
        self,
        cancelled: &AtomicBool,
    ) -> impl Future<Output = Result<Written, Self::Error>> + Send + '_;
}

/// A closed batch's commit: waiting to be made durable, or under way since the batch closed.
pub enum CommitAtClose<B: ClosedBatch> {
    /// Written when made durable ([`CommitAtClose::finish`]).
    Later(Box<B>),
    /// Chained behind earlier commits: under way on a task of its own since the batch closed;
    /// given up before its commit by [`CommitAtClose::abort`].
    Spawned {
        task: JoinHandle<Result<Written, B::Error>>,
        cancelled: Arc<AtomicBool>,
    },
}

impl<B: ClosedBatch> CommitAtClose<B> {
    /// The commit of `batch`, just closed: started at once on a task of its own when it is
    /// `chained` behind earlier commits (and a runtime is there to run it).
    pub fn new(batch: B, chained: bool) -> CommitAtClose<B> {
        match (chained, tokio::runtime::Handle::try_current()) {
            (true, Ok(rt)) => {
                let cancelled = Arc::new(AtomicBool::new(false));
                let c = cancelled.clone();
                let task = rt.spawn(async move { batch.write(&c).await });
                CommitAtClose::Spawned { task, cancelled }
            }
            _ => CommitAtClose::Later(Box::new(batch)),
        }
    }

    /// The batch written and committed: its outcome, or the panic of its task.
    pub async fn finish(self) -> Result<Result<Written, B::Error>, JoinError> {
        match self {
            CommitAtClose::Later(batch) => {
                let never = AtomicBool::new(false);
                Ok(batch.write(&never).await)
            }
            CommitAtClose::Spawned { task, .. } => task.await,
        }
    }

    /// Give up the commit of a batch under way before it lands (a batch not started is never
    /// written).
    pub fn abort(&self) {
        if let CommitAtClose::Spawned { cancelled, .. } = self {
            cancelled.store(true, Ordering::SeqCst);
        }
    }
}
