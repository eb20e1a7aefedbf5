//! Make durable: the stage between the open files ([`crate::sink::OpenFiles`]) and settling
//! ([`crate::settle::Settle`]). A finalized file is handed over here and made durable on its own
//! task — an object upload, a Delta commit, a BigQuery append, whatever its
//! [`crate::sink::Durable`] is — and its [`DurableOutcome`] comes back to the pipeline, which
//! settles its messages.
//!
//! What this stage owns (docs/contract.md §2.4, §2.6, §7):
//! * **Slots**: at most `--max-concurrent-uploads` files of the process at once (the
//!   [`Resources`]' semaphore, shared by every pipeline). A file source waits for a slot before
//!   handing over the next file (that bounds memory); a leased source (a broker) never waits on the
//!   pipeline's loop, or its leases would lapse during a store outage — its flow control bounds
//!   what waits instead.
//! * **Ordering** (`enableMessageOrdering`): one file at a time, in the order handed over (a
//!   chain of [`crate::sink::order::ArrivalOrder`], not the semaphore's wake-up order). Once one fails, every later
//!   file is aborted as [`SinkError::OrderBroken`] until [`MakeDurable::restart_order`], so no later
//!   message of a key becomes durable before an earlier one.
//! * **Accounting and telemetry**: the files in flight, the bytes they hold (the memory budget
//!   counts them until they are durable), when each was opened (oldest-unacked age) and handed
//!   over (a stalled destination), the finalize and durable metrics, and one log line per durable
//!   file.
//!
//! * **The shutdown grace** ([`MakeDurable::bounded_by`]): once it ends, a file still waiting for
//!   its slot or being made durable is given up — its work dropped, its outcome
//!   [`SinkError::GaveUp`] — so no retry loop, hung request or slow commit holds the shutdown.
//!
//! Retrying a store that fails is the [`crate::sink::Durable`]'s own business (the upload's retry
//! policy, a commit's conflict retries): an [`DurableOutcome`] is final.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::batch::FlushReason;
use crate::flow::Held;
use crate::receipt::{FileContents, Handover, Written};
use crate::resources::Resources;
use crate::shutdown::Grace;
use crate::sink::order::ArrivalOrder;
use crate::sink::{FinalizedFile, SinkError};
use crate::summary::{FailedObject, RunSummary};
use crate::telemetry::{DurableFile, DurableKind, PipelineTelemetry};

/// A file made durable, or not: what the pipeline settles.
#[derive(Debug)]
pub struct DurableOutcome {
    /// The file's id ([`FinalizedFile::id`]).
    pub id: u64,
    pub name: String,
    pub contents: FileContents,
    pub result: Result<Written, SinkError>,
    pub reason: FlushReason,
    pub kind: DurableKind,
    /// Start of `make_durable` → its end.
    pub latency: Duration,
}

/// A file being made durable.
struct InFlight {
    /// When it was opened: its first message has waited since.
    opened: Instant,
    /// When it was handed over.
    since: Instant,
    /// Bytes it holds in memory.
    bytes: u64,
    /// What the summary says of it if it is abandoned ([`MakeDurable::abandon`]).
    failed: FailedObject,
    /// Its messages and their bytes as flow control counts them.
    flow: Held,
}

/// What `f` holds, as flow control counts it.
pub fn flow_held(f: &FinalizedFile) -> Held {
    Held {
        messages: f.contents.messages,
        bytes: f.flow_bytes,
    }
}

/// The files of one pipeline being made durable, each on its own task; their [`DurableOutcome`]s
/// come back through [`MakeDurable::next`].
pub struct MakeDurable {
    permits: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<DurableOutcome>,
    rx: mpsc::UnboundedReceiver<DurableOutcome>,
    /// Ordering: an earlier file failed, so later ones must not become durable.
    broken: Arc<AtomicBool>,
    ordering: bool,
    /// The source holds leases (a broker): never wait for a slot on the pipeline's loop.
    leased: bool,
    /// Ordering: each file after the one handed over before it has finished.
    chain: ArrivalOrder,
    in_flight: HashMap<u64, InFlight>,
    /// Bytes the files in flight hold.
    uploading: u64,
    /// What the files in flight hold, as flow control counts it.
    flowing: Held,
    /// (id, name) of every durable file.
    written: Vec<(u64, String)>,
    telemetry: PipelineTelemetry,
    /// Files still in flight when it ends are given up.
    grace: Grace,
}

impl MakeDurable {
    /// `ordering`: one file at a time, in order; `leased`: the source holds leases (see the module
    /// doc). The slots are the process's ([`Resources::upload_slots`]).
    pub fn new(
        ordering: bool,
        resources: &Resources,
        leased: bool,
        telemetry: PipelineTelemetry,
    ) -> MakeDurable {
        let (tx, rx) = mpsc::unbounded_channel();
        MakeDurable {
            permits: resources.upload_slots(),
            tx,
            rx,
            broken: Arc::new(AtomicBool::new(false)),
            ordering,
            leased,
            chain: ArrivalOrder::default(),
            in_flight: HashMap::new(),
            uploading: 0,
            flowing: Held::default(),
            written: Vec::new(),
            telemetry,
            grace: Grace::never(),
        }
    }

    /// Give up every file still waiting for a slot or being made durable when `grace` ends
    /// (outcome [`SinkError::GaveUp`]); a file handed over after it ends is given up at once.
    pub fn bounded_by(&mut self, grace: Grace) {
        self.grace = grace;
    }

    /// Hand over every file of `done`, in order. `begin` runs for each before it is handed over
    /// (the settle side records it: a checkpoint saves it as pending before it can become
    /// visible); its error stops the hand-over there. A file without messages (opened for a
    /// message that then failed to encode) is aborted: there is nothing to write.
    pub async fn start<E>(
        &mut self,
        done: &mut Vec<FinalizedFile>,
        mut begin: impl FnMut(Handover<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        // One at a time off the front, so that a caller that stops waiting (the shutdown grace)
        // leaves the files not yet handed over in `done`.
        while !done.is_empty() {
            let mut f = done.remove(0);
            if f.contents.messages == 0 {
                let _ = self.grace.bound(f.file.abort()).await;
                continue;
            }
            tracing::debug!(object = %f.file.name(), reason = ?f.reason, messages = f.contents.messages, "finalize");
            self.telemetry.metrics.finalized(f.reason.into());
            begin(f.handover())?;
            self.spawn(f).await;
        }
        Ok(())
    }

    /// Make `f` durable on a task of its own.
    async fn spawn(&mut self, f: FinalizedFile) {
        let c = &f.contents;
        let failed = FailedObject {
            object: f.file.name().to_string(),
            error: String::new(),
            messages: c.messages,
            first_line: c.first_line,
            last_line: c.last_line,
            first_message_id: c.first_message_id.clone(),
            last_message_id: c.last_message_id.clone(),
        };
        self.in_flight.insert(
            f.id,
            InFlight {
                opened: f.opened_at,
                since: Instant::now(),
                bytes: f.buffered,
                failed,
                flow: flow_held(&f),
            },
        );
        self.uploading += f.buffered;
        self.flowing += flow_held(&f);
        // `None` for a leased source, and once the grace is over (the file is given up at once).
        let held = if self.leased {
            None
        } else {
            self.wait_for_slot().await
        };
        let link = self.ordering.then(|| self.chain.chain());
        let permits = self.permits.clone();
        let (tx, broken, ordering) = (self.tx.clone(), self.broken.clone(), self.ordering);
        let grace = self.grace.clone();
        let name = f.file.name().to_string();
        let (reason, kind) = (f.reason, f.file.kind());
        let FinalizedFile {
            mut file,
            contents,
            id,
            ..
        } = f;
        tokio::spawn(crate::telemetry::scoped(
            self.telemetry.clone(),
            async move {
                let mut started = Instant::now();
                let work = async {
                    if let Some(link) = &link {
                        link.wait_ended().await;
                    }
                    // What the file waits for, before it takes a slot (a leased source's files
                    // take theirs here, in no set order: two files waiting for earlier ones
                    // while holding both slots would wait for ever).
                    file.ready().await;
                    let permit = match held {
                        Some(p) => p,
                        None => permits.acquire_owned().await.expect("never closed"),
                    };
                    started = Instant::now();
                    let result = if ordering && broken.load(AtomicOrdering::SeqCst) {
                        file.abort().await;
                        Err(SinkError::OrderBroken { name: name.clone() })
                    } else {
                        file.make_durable().await
                    };
                    (result, permit)
                };
                // Past the grace the work is dropped: the upload, its retries, the commit.
                let result = match grace.bound(work).await {
                    Some((result, _permit)) => result,
                    None => {
                        tracing::warn!(object = %name, "shutdown grace over: giving up the file");
                        Err(SinkError::GaveUp { name: name.clone() })
                    }
                };
                if ordering && result.is_err() {
                    // Before the next file goes: its task must see the failure.
                    broken.store(true, AtomicOrdering::SeqCst);
                }
                if let Some(link) = link {
                    link.done(result.is_ok());
                }
                let _ = tx.send(DurableOutcome {
                    id,
                    name,
                    contents,
                    result,
                    reason,
                    kind,
                    latency: started.elapsed(),
                });
            },
        ));
    }

    /// A slot, for a source that may wait for one; `None` once the shutdown grace is over. The
    /// pipeline is alive while it waits (the store is slow or down): it keeps beating.
    async fn wait_for_slot(&self) -> Option<OwnedSemaphorePermit> {
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        let acquire = self.permits.clone().acquire_owned();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                p = &mut acquire => return Some(p.expect("never closed")),
                _ = self.grace.over() => return None,
                _ = beat.tick() => self.telemetry.probe.beat(),
            }
        }
    }

    /// The next file made durable or failed (`None` never comes while this stage lives: it holds
    /// a sender itself). Cancel-safe.
    pub async fn next(&mut self) -> Option<DurableOutcome> {
        self.rx.recv().await
    }

    /// Account for `out` (it is no longer in flight), log it and report it to the telemetry and
    /// to `summary`. `true`: the file failed with ordering on — every later file must fail too,
    /// so the pipeline finalizes its open files (their messages come after this file's).
    pub fn finished(&mut self, out: &DurableOutcome, summary: &mut RunSummary) -> bool {
        if let Some(f) = self.in_flight.remove(&out.id) {
            self.uploading -= f.bytes;
            self.flowing.messages -= f.flow.messages;
            self.flowing.bytes -= f.flow.bytes;
        }
        let c = &out.contents;
        let probe = &self.telemetry.probe;
        match &out.result {
            Ok(w) => {
                // Messages the destination rejected one by one fail alone (the settle side
                // settles them so); the rest of the file is durable.
                let rejected = w.rejected.len() as u64;
                let messages = c.messages - rejected;
                summary.bad_messages += rejected;
                if rejected > 0 {
                    tracing::warn!(object = %out.name, rejected, "messages rejected by the destination");
                }
                // A commit names the data files it added (a MERGE writes its own), else the
                // file is its name.
                let names = w
                    .committed
                    .as_deref()
                    .unwrap_or(std::slice::from_ref(&out.name));
                self.telemetry.file_durable(&DurableFile {
                    name: &names.join(","),
                    messages,
                    bytes: w.bytes,
                    reason: out.reason.into(),
                    latency: out.latency,
                    kind: out.kind,
                });
                probe.set_destination_reachable(true);
                summary.messages_written += messages;
                self.written
                    .extend(names.iter().map(|n| (out.id, n.clone())));
                false
            }
            Err(e) => {
                if !matches!(e, SinkError::OrderBroken { .. } | SinkError::GaveUp { .. }) {
                    probe.set_destination_reachable(false);
                }
                tracing::error!(
                    "object {} failed: {e}; its {} messages (lines {}..={}, ids {}..{}) are not done",
                    out.name,
                    c.messages,
                    c.first_line,
                    c.last_line,
                    c.first_message_id,
                    c.last_message_id
                );
                summary.failed_objects.push(FailedObject {
                    object: out.name.clone(),
                    error: e.to_string(),
                    messages: c.messages,
                    first_line: c.first_line,
                    last_line: c.last_line,
                    first_message_id: c.first_message_id.clone(),
                    last_message_id: c.last_message_id.clone(),
                });
                if self.ordering {
                    // On every failure: files handed over since the last one hold later messages
                    // as well.
                    self.broken.store(true, AtomicOrdering::SeqCst);
                }
                self.ordering
            }
        }
    }

    /// The run ends without waiting for the files still in flight (their outcomes, if any came
    /// back, are not settled): each is reported in `summary` as not done. Returns how many.
    pub fn abandon(&mut self, summary: &mut RunSummary) -> usize {
        while self.rx.try_recv().is_ok() {}
        let mut left: Vec<(u64, InFlight)> = self.in_flight.drain().collect();
        left.sort_by_key(|(id, _)| *id);
        self.uploading = 0;
        for (_, f) in &left {
            let mut failed = f.failed.clone();
            failed.error = "abandoned at the end of the shutdown grace".into();
            tracing::error!(
                "object {} abandoned at the end of the shutdown grace; its {} messages (lines {}..={}, ids {}..{}) are not done",
                failed.object,
                failed.messages,
                failed.first_line,
                failed.last_line,
                failed.first_message_id,
                failed.last_message_id
            );
            summary.failed_objects.push(failed);
        }
        left.len()
    }

    /// Ordering: every file after a failure has failed and its messages were handed back for
    /// redelivery, so later files may become durable again.
    pub fn restart_order(&mut self) {
        self.broken.store(false, AtomicOrdering::SeqCst);
    }

    /// Files handed over and not yet come back through [`MakeDurable::next`].
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Bytes the files in flight hold in memory.
    pub fn uploading(&self) -> u64 {
        self.uploading
    }

    /// What the files in flight hold: messages outstanding at the broker until they are settled
    /// ([`crate::flow`]).
    pub fn flowing(&self) -> Held {
        self.flowing
    }

    /// When the oldest file in flight was opened.
    pub fn oldest_opened(&self) -> Option<Instant> {
        self.in_flight.values().map(|f| f.opened).min()
    }

    /// Has a file been in flight for longer than `after`?
    pub fn stalled(&self, after: Duration) -> bool {
        self.in_flight.values().any(|f| f.since.elapsed() > after)
    }

    /// Durable files' names, in the order the files were opened.
    pub fn written(mut self) -> Vec<String> {
        self.written.sort();
        self.written.into_iter().map(|(_, n)| n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint_file::Span;
    use crate::sink::Durable;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    /// What the fake files did, in order: `durable NAME`, `aborted NAME`.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<String>>>);

    impl Log {
        fn push(&self, s: String) {
            self.0.lock().unwrap().push(s);
        }
        fn lines(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    /// A file that takes `delay` to become durable (or to fail), counting how many are being
    /// made durable at once.
    struct Fake {
        name: String,
        delay: Duration,
        fail: bool,
        bytes: u64,
        log: Log,
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        /// What it waits for before a slot ([`Durable::ready`]), like a file of a partition
        /// waiting for the one before.
        gate: Option<tokio::sync::oneshot::Receiver<()>>,
    }

    #[async_trait::async_trait]
    impl Durable for Fake {
        fn name(&self) -> &str {
            &self.name
        }
        async fn ready(&mut self) {
            if let Some(gate) = self.gate.take() {
                let _ = gate.await;
            }
        }
        async fn make_durable(self: Box<Self>) -> Result<Written, SinkError> {
            let n = self.now.fetch_add(1, AtomicOrdering::SeqCst) + 1;
            self.most.fetch_max(n, AtomicOrdering::SeqCst);
            tokio::time::sleep(self.delay).await;
            self.now.fetch_sub(1, AtomicOrdering::SeqCst);
            if self.fail {
                self.log.push(format!("failed {}", self.name));
                return Err(SinkError::Commit {
                    name: self.name.clone(),
                    source: "store down".into(),
                    retryable: true,
                });
            }
            self.log.push(format!("durable {}", self.name));
            Ok(Written::from(self.bytes))
        }
        async fn abort(self: Box<Self>) {
            self.log.push(format!("aborted {}", self.name));
        }
    }

    struct Files {
        log: Log,
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        next_id: u64,
    }

    impl Files {
        fn new() -> Files {
            Files {
                log: Log::default(),
                now: Arc::default(),
                most: Arc::default(),
                next_id: 0,
            }
        }

        fn file(&mut self, messages: u64, delay_ms: u64, fail: bool) -> FinalizedFile {
            self.next_id += 1;
            let name = format!("f{}", self.next_id);
            FinalizedFile {
                file: Box::new(Fake {
                    name: name.clone(),
                    delay: Duration::from_millis(delay_ms),
                    fail,
                    bytes: 100 * messages,
                    log: self.log.clone(),
                    now: self.now.clone(),
                    most: self.most.clone(),
                    gate: None,
                }),
                contents: FileContents {
                    span: Span {
                        group: None,
                        first: 0,
                        last: 0,
                    },
                    first_line: 1,
                    last_line: messages,
                    first_message_id: "1".into(),
                    last_message_id: messages.to_string(),
                    messages,
                    acks: Vec::new(),
                    held: Vec::new(),
                },
                reason: FlushReason::MaxMessages,
                id: self.next_id,
                opened_at: Instant::now(),
                buffered: 1000 * messages,
                flow_bytes: 10 * messages,
            }
        }
    }

    fn stage(ordering: bool, slots: usize, leased: bool) -> MakeDurable {
        MakeDurable::new(
            ordering,
            &Resources::new(slots, None),
            leased,
            PipelineTelemetry::detached("projects/p/subscriptions/s"),
        )
    }

    async fn drain(d: &mut MakeDurable, summary: &mut RunSummary) -> Vec<DurableOutcome> {
        let mut outs = Vec::new();
        while d.in_flight() > 0 {
            let out = d.next().await.unwrap();
            d.finished(&out, summary);
            outs.push(out);
        }
        outs
    }

    #[tokio::test]
    async fn never_more_files_at_once_than_slots_and_every_one_comes_back() {
        for leased in [false, true] {
            let mut files = Files::new();
            let mut d = stage(false, 2, leased);
            let mut done: Vec<FinalizedFile> = (0..6).map(|_| files.file(3, 20, false)).collect();
            let mut begun = Vec::new();
            d.start(&mut done, |f| {
                begun.push(f.id);
                Ok::<_, ()>(())
            })
            .await
            .unwrap();
            assert_eq!(begun, vec![1, 2, 3, 4, 5, 6]);
            let mut summary = RunSummary::default();
            let outs = drain(&mut d, &mut summary).await;
            assert_eq!(outs.len(), 6);
            assert!(outs.iter().all(|o| o.result.is_ok()));
            assert_eq!(
                files.most.load(AtomicOrdering::SeqCst),
                2,
                "leased {leased}"
            );
            assert_eq!(summary.messages_written, 18);
            assert_eq!(d.uploading(), 0);
            assert_eq!(d.written(), vec!["f1", "f2", "f3", "f4", "f5", "f6"]);
        }
    }

    /// A file waiting for another (under `--exactly-once`, the previous file of its partition)
    /// holds no slot while it waits: with one slot, the file handed over after it is made
    /// durable first, and it goes once its wait is over. (Holding the slot, it would wait for
    /// ever where what it waits for needs that slot.)
    #[tokio::test]
    async fn a_file_waiting_for_another_holds_no_slot_while_it_waits() {
        let mut files = Files::new();
        let mut d = stage(false, 1, true);
        let (open, gate) = tokio::sync::oneshot::channel();
        let mut waiting = files.file(1, 1, false);
        waiting.file = Box::new(Fake {
            name: "f1".into(),
            delay: Duration::from_millis(1),
            fail: false,
            bytes: 100,
            log: files.log.clone(),
            now: files.now.clone(),
            most: files.most.clone(),
            gate: Some(gate),
        });
        let mut done = vec![waiting, files.file(1, 1, false)];
        d.start(&mut done, |_| Ok::<_, ()>(())).await.unwrap();
        let mut summary = RunSummary::default();
        let first = tokio::time::timeout(Duration::from_secs(5), d.next())
            .await
            .expect("the second file waited behind the first one's wait")
            .unwrap();
        d.finished(&first, &mut summary);
        assert_eq!(first.name, "f2");
        open.send(()).unwrap();
        let second = d.next().await.unwrap();
        assert_eq!(second.name, "f1");
        assert!(second.result.is_ok());
    }

    #[tokio::test]
    async fn bytes_in_flight_are_counted_until_the_file_comes_back() {
        let mut files = Files::new();
        let mut d = stage(false, 4, true);
        let mut done = vec![files.file(2, 50, false), files.file(5, 10, false)];
        d.start(&mut done, |_| Ok::<_, ()>(())).await.unwrap();
        assert!(done.is_empty());
        assert_eq!((d.in_flight(), d.uploading()), (2, 7000));
        let held = |messages, bytes| Held { messages, bytes };
        assert_eq!(d.flowing(), held(7, 70), "messages outstanding at a broker");
        assert!(d.oldest_opened().is_some());
        let mut summary = RunSummary::default();
        let first = d.next().await.unwrap();
        d.finished(&first, &mut summary);
        assert_eq!(first.name, "f2", "the quicker file comes back first");
        assert_eq!((d.in_flight(), d.uploading()), (1, 2000));
        assert_eq!(d.flowing(), held(2, 20));
        drain(&mut d, &mut summary).await;
        assert_eq!((d.in_flight(), d.uploading()), (0, 0));
        assert_eq!(d.flowing(), held(0, 0));
        assert_eq!(d.oldest_opened(), None);
        assert!(!d.stalled(Duration::ZERO));
    }

    #[tokio::test]
    async fn an_empty_file_is_aborted_and_never_begun() {
        let mut files = Files::new();
        let mut d = stage(false, 2, false);
        let mut done = vec![files.file(0, 0, false), files.file(1, 0, false)];
        let mut begun = Vec::new();
        d.start(&mut done, |f| {
            begun.push(f.id);
            Ok::<_, ()>(())
        })
        .await
        .unwrap();
        assert_eq!(begun, vec![2]);
        drain(&mut d, &mut RunSummary::default()).await;
        assert_eq!(files.log.lines(), vec!["aborted f1", "durable f2"]);
    }

    #[tokio::test]
    async fn a_begin_that_fails_stops_the_hand_over_there() {
        let mut files = Files::new();
        let mut d = stage(false, 2, true);
        let mut done: Vec<FinalizedFile> = (0..3).map(|_| files.file(1, 0, false)).collect();
        let r = d
            .start(
                &mut done,
                |f| if f.id == 2 { Err("disk full") } else { Ok(()) },
            )
            .await;
        assert_eq!(r, Err("disk full"));
        let outs = drain(&mut d, &mut RunSummary::default()).await;
        assert_eq!(outs.iter().map(|o| o.id).collect::<Vec<_>>(), vec![1]);
    }

    #[tokio::test]
    async fn ordered_files_go_one_at_a_time_in_order_and_a_failure_fails_the_rest() {
        let mut files = Files::new();
        let mut d = stage(true, 4, true);
        // The first is the slowest: still, none after it starts before it ends.
        let mut done = vec![
            files.file(1, 60, false),
            files.file(1, 1, true),
            files.file(1, 1, false),
            files.file(1, 1, false),
        ];
        d.start(&mut done, |_| Ok::<_, ()>(())).await.unwrap();
        let mut summary = RunSummary::default();
        let mut broken = Vec::new();
        let mut outs = Vec::new();
        while d.in_flight() > 0 {
            let out = d.next().await.unwrap();
            broken.push(d.finished(&out, &mut summary));
            outs.push(out);
        }
        assert_eq!(files.most.load(AtomicOrdering::SeqCst), 1);
        assert_eq!(
            files.log.lines(),
            vec!["durable f1", "failed f2", "aborted f3", "aborted f4"]
        );
        assert_eq!(outs.iter().map(|o| o.id).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert!(matches!(
            outs[2].result,
            Err(SinkError::OrderBroken { ref name }) if name == "f3"
        ));
        assert_eq!(broken, [false, true, true, true]);
        assert_eq!(summary.failed_objects.len(), 3);
        assert_eq!(summary.messages_written, 1);

        // Once the failures are handed back, later files become durable again.
        d.restart_order();
        let mut done = vec![files.file(1, 1, false)];
        d.start(&mut done, |_| Ok::<_, ()>(())).await.unwrap();
        let outs = drain(&mut d, &mut summary).await;
        assert!(outs[0].result.is_ok());
        assert_eq!(d.written(), vec!["f1", "f5"]);
    }

    /// At the end of the shutdown grace a file being made durable and one waiting for the only
    /// slot come back given up, and `abandon` has nothing left to report.
    #[tokio::test(start_paused = true)]
    async fn at_the_end_of_the_grace_files_in_flight_are_given_up() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (grace, _w) = Grace::start(
            Some(Box::pin(async move {
                let _ = rx.await;
            })),
            Duration::from_secs(3),
        );
        let mut files = Files::new();
        let mut d = stage(false, 1, false);
        d.bounded_by(grace);
        // The first takes an hour; the second waits for its slot (the hand-over waits too, so
        // it runs beside the signal).
        let mut done = vec![files.file(2, 3_600_000, false), files.file(1, 1, false)];
        let signal = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send(()).unwrap();
        };
        let t0 = Instant::now();
        let (r, ()) = tokio::join!(d.start(&mut done, |_| Ok::<_, ()>(())), signal);
        r.unwrap();
        let mut summary = RunSummary::default();
        let outs = drain(&mut d, &mut summary).await;
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(4),
            "signal at 1 s + grace 3 s"
        );
        assert_eq!(outs.len(), 2);
        assert!(outs
            .iter()
            .all(|o| matches!(o.result, Err(SinkError::GaveUp { .. }))));
        assert_eq!(summary.failed_objects.len(), 2);
        assert_eq!(summary.messages_written, 0);
        assert!(files.log.lines().is_empty(), "neither finished");
        assert_eq!(d.abandon(&mut summary), 0);
    }

    #[tokio::test]
    async fn without_ordering_a_failure_fails_only_its_file() {
        let mut files = Files::new();
        let mut d = stage(false, 1, false);
        let mut done = vec![files.file(2, 1, true), files.file(3, 1, false)];
        d.start(&mut done, |_| Ok::<_, ()>(())).await.unwrap();
        let mut summary = RunSummary::default();
        let mut broken = Vec::new();
        while d.in_flight() > 0 {
            let out = d.next().await.unwrap();
            broken.push(d.finished(&out, &mut summary));
        }
        assert_eq!(broken, [false, false]);
        assert_eq!(files.log.lines(), vec!["failed f1", "durable f2"]);
        assert_eq!(summary.failed_objects[0].object, "f1");
        assert_eq!(summary.failed_objects[0].messages, 2);
        assert_eq!(summary.messages_written, 3);
    }
}
