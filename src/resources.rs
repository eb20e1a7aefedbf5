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
//! Sources take from the same budget ([`InputGate`]; the file source and the broker sources:
//! Pub/Sub, Kafka, NATS): what they read ahead and parsed, not yet in a file, is held as
//! [`Charge`]s (released when dropped; the Kafka source also holds one for librdkafka's read-ahead,
//! bounded by its settings, for its life), counted in the total above and capped at
//! [`input_cap`]; near the limit the source stops reading (at the input edge, never inside the
//! writer), except that it may always hold one block when it holds nothing else, so a message of
//! any size goes through.
//!
//! What the budget does not count (the documented fixed overhead, docs/operating.md "How to size a
//! pod"): the binary and runtime at rest, thread stacks, the allocator's slack, the file source's
//! pool of small block buffers, one message being decoded past the cap (the progress rule above),
//! the Delta log snapshot, and a broker client's own buffers (one response being decoded).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use crate::message::Received;

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
                input: Mutex::new(0),
                freed: Condvar::new(),
                wanted: AtomicU64::new(0),
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

    /// Bytes every pipeline reports holding now (tests, logs), and what sources hold.
    pub fn memory_used(&self) -> u64 {
        // The input lock first, as the gate takes them.
        let input = self.memory.input();
        let members = self.memory.members.lock().expect("budget lock");
        members.iter().map(|m| m.held()).sum::<u64>() + input
    }

    /// The gate a source takes its read-ahead through.
    pub fn input_gate(&self) -> InputGate {
        InputGate {
            budget: self.memory.clone(),
        }
    }
}

/// What a batch of received messages holds in memory, as the broker sources charge it to the
/// budget: each message's payload, attributes, ids and ordering key, and its ack id.
pub fn held_bytes(batch: &[Received]) -> u64 {
    batch
        .iter()
        .map(|r| {
            let ack_id = r.receipt.ack_id.as_ref().map_or(0, String::len);
            crate::flow::message_bytes(&r.msg) + ack_id as u64
        })
        .sum()
}

/// The process's resident memory now (/proc/self/statm; 0 where there is none).
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    pages * page
}

/// What sources may hold (read ahead, parsed, not yet in a file): a quarter of the limit, so the
/// rest is the writers'; without a limit, 64 MiB (a read-ahead bounded in bytes either way).
pub fn input_cap(limit: Option<u64>) -> u64 {
    match limit {
        Some(l) => (l / 4).max(1 << 20),
        None => 64 << 20,
    }
}

#[derive(Debug)]
struct Budget {
    limit: Option<u64>,
    members: Mutex<Vec<Arc<Member>>>,
    /// Bytes the sources' [`Charge`]s hold.
    input: Mutex<u64>,
    /// Signalled when a charge is released.
    freed: Condvar,
    /// Bytes a source waits for that only the writers can make room for (counted in the total).
    wanted: AtomicU64,
}

impl Budget {
    fn input(&self) -> u64 {
        *self.input.lock().expect("input lock")
    }

    /// With `subsink::resources=trace` in `SUBSINK_LOG`: one line with what the budget counts
    /// (the writers' `held`, the sources' `input`, what a source waits for) beside the process's
    /// resident memory now (`rss`, /proc/self/statm) — the difference is what the budget does not
    /// count (docs/operating.md, How to size a pod). `at`: where it was asked (a pipeline's
    /// report, a source's charge).
    fn trace_view(&self, at: &'static str) {
        if !tracing::enabled!(tracing::Level::TRACE) {
            return;
        }
        let input = self.input();
        let held: u64 = self
            .members
            .lock()
            .expect("budget lock")
            .iter()
            .map(|m| m.held())
            .sum();
        let wanted = self.wanted.load(Ordering::Relaxed);
        tracing::trace!(
            at,
            held,
            input,
            wanted,
            counted = held + input,
            rss = resident_bytes(),
            "memory budget"
        );
    }

    /// Ask the pipeline holding the process's largest open file to report again (it is then
    /// told to finalize that file).
    fn wake_largest(&self) {
        let members = self.members.lock().expect("budget lock");
        if let Some(m) = members
            .iter()
            .filter(|m| m.largest.load(Ordering::Relaxed) > 0)
            .max_by_key(|m| m.largest.load(Ordering::Relaxed))
        {
            m.wake.notify_one();
        }
    }
}

/// How a source takes from the memory budget: cheap to clone, one per source.
#[derive(Clone, Debug)]
pub struct InputGate {
    budget: Arc<Budget>,
}

/// How long a waiting source sleeps before it looks at the budget again, if no charge was
/// released meanwhile (a writer's upload ending frees memory without telling the gate).
const INPUT_RECHECK: Duration = Duration::from_millis(20);

impl InputGate {
    /// The bytes sources may hold at once ([`input_cap`]).
    pub fn cap(&self) -> u64 {
        input_cap(self.budget.limit)
    }

    /// Bytes the sources may still take before they reach [`InputGate::cap`] (0 at or past it):
    /// what a source that asks its broker for a number of bytes asks for.
    pub fn room(&self) -> u64 {
        self.cap().saturating_sub(self.budget.input())
    }

    /// Charge `n` bytes now, whatever the budget says (what is already allocated, or bounded
    /// otherwise).
    pub fn charge(&self, n: u64) -> Charge {
        *self.budget.input.lock().expect("input lock") += n;
        self.budget.trace_view("charge");
        Charge {
            budget: Some(self.budget.clone()),
            n,
        }
    }

    /// May a source that holds `own` (of the sources' total `input`) take `extra` more? `Some`:
    /// yes or no; `None`: not now, and only the writers can change that (the source holds
    /// nothing else, and the process is at the limit): they must free memory.
    fn grants(&self, input: u64, own: u64, extra: u64) -> Option<bool> {
        // Nothing else of the sources' in flight: the cap does not apply (one block always
        // fits, whatever its size), the limit does.
        let alone = input <= own;
        if !alone && input + extra > self.cap() {
            return Some(false);
        }
        let Some(limit) = self.budget.limit else {
            return Some(true);
        };
        let members = self.budget.members.lock().expect("budget lock");
        let held: u64 = members.iter().map(|m| m.held()).sum();
        if held + input + extra <= limit {
            return Some(true);
        }
        if !alone {
            // The writer takes what the sources hold, and finalizes files as it does.
            return Some(false);
        }
        // Alone and over the limit: the writers hold the rest. If they can free some (a file to
        // finalize, an upload under way), wait for it; if not (only replay files, which must
        // take their messages), take it anyway: waiting would never end.
        let can_free = members.iter().any(|m| {
            m.largest.load(Ordering::Relaxed) > 0 || m.uploading.load(Ordering::Relaxed) > 0
        });
        if can_free {
            None
        } else {
            Some(true)
        }
    }

    /// Block until `extra` more bytes may be held besides `own` (a charge of the caller's), then
    /// add them to `own`. Granted when the sources' total stays under [`InputGate::cap`] (or they
    /// hold nothing but `own`: a block of any size goes) and the process's total under the limit.
    /// When only the writers can make room (the source holds nothing else), the bytes wanted
    /// count in the process's total and the pipeline holding the largest open file is woken, so
    /// it finalizes that file ([`Pressure::FinalizeLargest`]) and reading resumes once it is
    /// durable; if the writers hold nothing they can free, the bytes are granted at once.
    /// Blocking: call it from a thread of its own (the file source's reader).
    pub fn wait_for(&self, own: &mut Charge, extra: u64) {
        let mut input = self.budget.input.lock().expect("input lock");
        let mut wanted = 0;
        loop {
            match self.grants(*input, own.n, extra) {
                Some(true) => {
                    *input += extra;
                    own.n += extra;
                    if own.budget.is_none() {
                        own.budget = Some(self.budget.clone());
                    }
                    self.budget.wanted.fetch_sub(wanted, Ordering::Relaxed);
                    return;
                }
                Some(false) => {}
                None if wanted == 0 => {
                    wanted = extra;
                    self.budget.wanted.fetch_add(wanted, Ordering::Relaxed);
                    self.budget.wake_largest();
                }
                None => self.budget.wake_largest(),
            }
            input = self
                .budget
                .freed
                .wait_timeout(input, INPUT_RECHECK)
                .expect("input lock")
                .0;
        }
    }
}

impl InputGate {
    /// Wait until a source that holds nothing of its own outside `Charge`s may read one more
    /// unit of input: the sources' total is under [`InputGate::cap`] and the process's total
    /// under the limit (or the sources hold nothing and the writers cannot free anything, so
    /// waiting would never end). The async sources' gate (a broker's pull task): it does not
    /// know the size of what it reads next, so it waits for room rather than for `n` bytes, and
    /// then charges what it read ([`InputGate::charge`]). Cancel-safe.
    pub async fn admit(&self) {
        while !self.has_room(0) {
            tokio::time::sleep(INPUT_RECHECK).await;
        }
    }

    /// May a source that holds `own` of the sources' total outside the units it reads (a charge
    /// it keeps for its life, as the Kafka source's read-ahead: module docs of
    /// `source::kafka::prefetch`) read one more unit now? The rules of [`InputGate::admit`],
    /// without waiting: a source that must keep doing something else meanwhile (a Kafka consumer
    /// keeps polling) asks again a moment later ([`InputGate::recheck`]). When only the writers can
    /// make room, the pipeline holding the largest open file is woken.
    pub fn has_room(&self, own: u64) -> bool {
        match self.grants(self.budget.input(), own, 1) {
            Some(room) => room,
            None => {
                self.budget.wake_largest();
                false
            }
        }
    }

    /// How long a source that was told there is no room waits before it asks again.
    pub fn recheck(&self) -> Duration {
        INPUT_RECHECK
    }
}

/// Bytes a source holds, charged to the memory budget until dropped (or shrunk).
#[derive(Debug, Default)]
pub struct Charge {
    budget: Option<Arc<Budget>>,
    n: u64,
}

impl Charge {
    /// Bytes charged.
    pub fn bytes(&self) -> u64 {
        self.n
    }

    /// Charge `n` more now, whatever the budget says.
    pub fn grow(&mut self, n: u64) {
        if let Some(b) = &self.budget {
            *b.input.lock().expect("input lock") += n;
            self.n += n;
        }
    }

    /// Hold `n` bytes from now on (less: the rest is released).
    pub fn set(&mut self, n: u64) {
        if n >= self.n {
            self.grow(n - self.n);
            return;
        }
        if let Some(b) = &self.budget {
            *b.input.lock().expect("input lock") -= self.n - n;
            self.n = n;
            b.freed.notify_all();
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.set(0);
    }
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
pub struct MemoryHeld {
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
    pub fn report(&self, held: MemoryHeld) -> Pressure {
        self.me.open.store(held.open, Ordering::Relaxed);
        self.me.uploading.store(held.uploading, Ordering::Relaxed);
        self.me.largest.store(held.largest, Ordering::Relaxed);
        self.budget.trace_view("report");
        let Some(limit) = self.budget.limit else {
            return Pressure::Fine;
        };
        let input = self.budget.input() + self.budget.wanted.load(Ordering::Relaxed);
        let members = self.budget.members.lock().expect("budget lock");
        let total: u64 = members.iter().map(|m| m.held()).sum::<u64>() + input;
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
            // Nothing can be finalized, but uploads under way will free memory (what the
            // sources read ahead is only freed by reading on, after them): wait for them.
            None if uploading > 0 => Pressure::Wait,
            // Nothing can be finalized and nothing is uploading (only replay files are open,
            // which must take their messages): waiting would never end.
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

    fn held(open: u64, uploading: u64, largest: u64) -> MemoryHeld {
        MemoryHeld {
            open,
            uploading,
            largest,
        }
    }

    #[test]
    fn sources_wait_for_the_budget_but_always_hold_one_block() {
        let r = Resources::new(1, Some(64 << 20));
        let gate = r.input_gate();
        assert_eq!(gate.cap(), 16 << 20);
        // Alone, a source takes what it needs, even past the cap (one long line).
        let mut own = gate.charge(1 << 20);
        gate.wait_for(&mut own, 31 << 20);
        assert_eq!(own.bytes(), 32 << 20);
        assert_eq!(r.memory_used(), 32 << 20);
        // With 32 MiB in flight elsewhere, it waits until that is released.
        let mut reader = gate.charge(1 << 20);
        let waited = std::thread::spawn({
            let gate = gate.clone();
            move || {
                gate.wait_for(&mut reader, 1 << 20);
                reader
            }
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!waited.is_finished(), "over the cap: the reader waits");
        drop(own);
        let reader = waited.join().unwrap();
        assert_eq!(reader.bytes(), 2 << 20);
        assert_eq!(r.memory_used(), 2 << 20);
        // What the sources hold counts in the pipelines' total.
        let share = r.memory_share();
        assert_eq!(
            share.report(held(63 << 20, 0, 1)),
            Pressure::FinalizeLargest
        );
        drop(reader);
        assert_eq!(r.memory_used(), 63 << 20, "every charge released");
        assert_eq!(share.report(held(63 << 20, 0, 1)), Pressure::Fine);
    }

    /// Issue 26: a source alone over the limit (the writers hold the rest) waits for the writers
    /// to free memory rather than pass the limit: what it wants counts in the total, so the
    /// pipeline holding the largest file is told to finalize it (and is woken); once that
    /// file's upload ends, the source goes on. When the writers hold nothing they can free, it
    /// goes on at once.
    #[test]
    fn a_source_over_the_limit_waits_for_the_writers_to_free_memory() {
        let r = Resources::new(1, Some(64 << 20));
        let gate = r.input_gate();
        let share = r.memory_share();
        assert_eq!(share.report(held(50 << 20, 0, 50 << 20)), Pressure::Fine);
        let mut reader = gate.charge(1 << 20);
        let waited = std::thread::spawn({
            let gate = gate.clone();
            move || {
                gate.wait_for(&mut reader, 20 << 20);
                reader
            }
        });
        let woken = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(10), share.woken())
                    .await
                    .is_ok()
            });
        assert!(woken, "the pipeline holding the largest file is woken");
        assert!(!waited.is_finished(), "over the limit: the source waits");
        // What the source wants counts: the writer is told to finalize its file.
        assert_eq!(
            share.report(held(50 << 20, 0, 50 << 20)),
            Pressure::FinalizeLargest
        );
        // Finalized: uploading covers the excess, the pipeline waits; so does the source.
        assert_eq!(share.report(held(0, 50 << 20, 0)), Pressure::Wait);
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waited.is_finished(), "the upload still holds the memory");
        // The upload ended: the source goes on.
        assert_eq!(share.report(held(0, 0, 0)), Pressure::Fine);
        let reader = waited.join().unwrap();
        assert_eq!(reader.bytes(), 21 << 20);
        assert_eq!(r.memory_used(), 21 << 20);
        drop(reader);
        // Only files that cannot be finalized (largest 0) and nothing uploading: granted at once.
        assert_eq!(share.report(held(60 << 20, 0, 0)), Pressure::Fine);
        let mut alone = gate.charge(1 << 20);
        gate.wait_for(&mut alone, 20 << 20);
        assert_eq!(alone.bytes(), 21 << 20);
    }

    /// Issue 43: the broker sources' view of the gate. `room` is what a NATS pull asks for; a
    /// source's own standing charge (Kafka's read-ahead) does not count against it as another
    /// source's would: holding only that, it may read (alone, as a file source with one block).
    #[test]
    fn broker_sources_ask_for_the_room_and_a_standing_charge_is_their_own() {
        let r = Resources::new(1, Some(64 << 20));
        let gate = r.input_gate();
        assert_eq!(gate.room(), 16 << 20);
        let standing = gate.charge(20 << 20);
        assert_eq!(gate.room(), 0, "past the cap: no room");
        assert!(gate.has_room(standing.bytes()), "alone: it may read");
        assert!(!gate.has_room(0), "another source's charge is not its own");
        let chunk = gate.charge(9 << 20);
        assert!(!gate.has_room(standing.bytes()), "a chunk not taken yet");
        drop(chunk);
        assert!(gate.has_room(standing.bytes()));
        drop(standing);
        assert_eq!((gate.room(), r.memory_used()), (16 << 20, 0));
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
