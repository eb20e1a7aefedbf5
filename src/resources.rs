//! What the pipelines of one process share: the upload slots and the memory budget.
//!
//! `subsink run` has one pipeline, `subsink serve` one per subscription; either way there is one
//! [`Resources`] per process, so `--max-concurrent-uploads` and `--memory-limit` hold for the whole
//! process, not per subscription.
//!
//! ## The memory budget (`--memory-limit`, docs/contract.md §7)
//! Each pipeline reports through its [`MemoryShare`] what it holds: the bytes its open files
//! buffer, the bytes of its finalized files not yet durable, and its largest open file. When the
//! process's total passes the limit:
//! * if the uploads already under way hold at least the excess, nothing is finalized: the
//!   pipelines stop reading until those uploads free it ([`Pressure::Wait`]);
//! * else the largest open file of the whole process is finalized early, with reason `memory`
//!   ([`Pressure::FinalizeLargest`] for its pipeline; the others wait, and the owner is woken if
//!   it is idle).
//!
//! What the budget does not count (the documented overhead): messages received and not yet in a
//! file (Pub/Sub flow control, the file source's read-ahead), multipart parts in flight, a table
//! file's encoded Parquet pages, and the allocator's and runtime's own memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, Semaphore};

/// `--memory-limit`'s default.
pub const DEFAULT_MEMORY_LIMIT: u64 = 1 << 30;

/// The process's shared upload slots and memory budget. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Resources {
    uploads: Arc<Semaphore>,
    memory: Arc<Budget>,
}

impl Resources {
    /// `max_concurrent_uploads` files made durable at once across every pipeline (at least 1);
    /// `memory_limit` bytes held by every pipeline's files (`None`: no budget).
    pub fn new(max_concurrent_uploads: usize, memory_limit: Option<u64>) -> Resources {
        Resources {
            uploads: Arc::new(Semaphore::new(max_concurrent_uploads.max(1))),
            memory: Arc::new(Budget {
                limit: memory_limit,
                members: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The upload slots every pipeline takes one of per file being made durable.
    pub fn upload_slots(&self) -> Arc<Semaphore> {
        self.uploads.clone()
    }

    /// The memory limit, if any.
    pub fn memory_limit(&self) -> Option<u64> {
        self.memory.limit
    }

    /// A pipeline's share of the budget; it leaves the budget when dropped.
    pub fn memory_share(&self) -> MemoryShare {
        let me = Arc::new(Member::default());
        self.memory
            .members
            .lock()
            .expect("budget lock")
            .push(me.clone());
        MemoryShare {
            budget: self.memory.clone(),
            me,
        }
    }

    /// Bytes every pipeline reports holding now (tests, logs).
    pub fn memory_used(&self) -> u64 {
        let members = self.memory.members.lock().expect("budget lock");
        members.iter().map(|m| m.held()).sum()
    }
}

#[derive(Debug)]
struct Budget {
    limit: Option<u64>,
    members: Mutex<Vec<Arc<Member>>>,
}

#[derive(Debug, Default)]
struct Member {
    /// Bytes the open files buffer.
    open: AtomicU64,
    /// Bytes of finalized files not yet durable.
    uploading: AtomicU64,
    /// Bytes of the largest open file (0: none could be finalized).
    largest: AtomicU64,
    /// Another pipeline asks this one to look at the budget again (it holds the largest file).
    wake: Notify,
}

impl Member {
    fn held(&self) -> u64 {
        self.open.load(Ordering::Relaxed) + self.uploading.load(Ordering::Relaxed)
    }
}

/// What a pipeline must do about the budget now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// Under the limit: read on.
    Fine,
    /// Over it, and this pipeline holds the process's largest open file: finalize it (reason
    /// `memory`), then report again.
    FinalizeLargest,
    /// Over it, and what frees memory is elsewhere (uploads under way, or another pipeline's
    /// file): stop reading, report again when an upload ends or a moment later.
    Wait,
}

/// What one pipeline holds: one per pipeline, from [`Resources::memory_share`].
#[derive(Debug)]
pub struct MemoryShare {
    budget: Arc<Budget>,
    me: Arc<Member>,
}

/// One pipeline's memory as it reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Bytes buffered by the open files.
    pub open: u64,
    /// Bytes of finalized files not yet durable.
    pub uploading: u64,
    /// The largest open file's bytes.
    pub largest: u64,
}

impl MemoryShare {
    /// Is there a budget at all?
    pub fn limited(&self) -> bool {
        self.budget.limit.is_some()
    }

    /// Record what this pipeline holds and say what it must do.
    pub fn report(&self, held: Held) -> Pressure {
        self.me.open.store(held.open, Ordering::Relaxed);
        self.me.uploading.store(held.uploading, Ordering::Relaxed);
        self.me.largest.store(held.largest, Ordering::Relaxed);
        let Some(limit) = self.budget.limit else {
            return Pressure::Fine;
        };
        let members = self.budget.members.lock().expect("budget lock");
        let total: u64 = members.iter().map(|m| m.held()).sum();
        if total <= limit {
            return Pressure::Fine;
        }
        let uploading: u64 = members
            .iter()
            .map(|m| m.uploading.load(Ordering::Relaxed))
            .sum();
        if uploading >= total - limit {
            return Pressure::Wait;
        }
        let owner = members
            .iter()
            .filter(|m| m.largest.load(Ordering::Relaxed) > 0)
            .max_by_key(|m| m.largest.load(Ordering::Relaxed));
        match owner {
            Some(m) if Arc::ptr_eq(m, &self.me) => Pressure::FinalizeLargest,
            Some(m) => {
                m.wake.notify_one();
                Pressure::Wait
            }
            // Nothing can be finalized (only replay files are open, which must take their
            // messages): waiting would never end.
            None => Pressure::Fine,
        }
    }

    /// Resolves when another pipeline asked this one to report again.
    pub async fn woken(&self) {
        self.me.wake.notified().await
    }
}

impl Drop for MemoryShare {
    fn drop(&mut self) {
        let mut members = self.budget.members.lock().expect("budget lock");
        members.retain(|m| !Arc::ptr_eq(m, &self.me));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(open: u64, uploading: u64, largest: u64) -> Held {
        Held {
            open,
            uploading,
            largest,
        }
    }

    #[test]
    fn the_largest_file_of_the_process_is_finalized_and_uploads_count() {
        let r = Resources::new(2, Some(1000));
        let a = r.memory_share();
        let b = r.memory_share();
        assert_eq!(a.report(held(400, 0, 300)), Pressure::Fine);
        assert_eq!(b.report(held(500, 0, 500)), Pressure::Fine);
        assert_eq!(r.memory_used(), 900);
        // a grows past the limit; b holds the largest file: a waits, b is asked.
        assert_eq!(a.report(held(600, 0, 350)), Pressure::Wait);
        assert_eq!(b.report(held(500, 0, 500)), Pressure::FinalizeLargest);
        // b finalized it: its bytes are uploading, which covers the excess.
        assert_eq!(b.report(held(0, 500, 0)), Pressure::Wait);
        assert_eq!(a.report(held(650, 0, 350)), Pressure::Wait);
        // The upload ended: under the limit again.
        assert_eq!(b.report(held(0, 0, 0)), Pressure::Fine);
        drop(b);
        assert_eq!(r.memory_used(), 650);
        assert_eq!(a.report(held(650, 0, 350)), Pressure::Fine);
        assert_eq!(a.report(held(1200, 0, 350)), Pressure::FinalizeLargest);
        // No budget: always fine.
        let r = Resources::new(1, None);
        assert_eq!(
            r.memory_share().report(held(u64::MAX / 4, 0, 1)),
            Pressure::Fine
        );
    }
}
