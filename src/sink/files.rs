//! The open-file lifecycle, written once for every sink.
//!
//! A file is opened for the first message of its group, takes messages while the batcher's limits
//! allow ([`Limits::admit`] before each message, [`Limits::full`] after it), and is finalized by
//! whichever comes first: `max_duration` after it was opened (the timer fires even if no message
//! arrives), `max_bytes`, `max_messages`, the end of input or a shutdown (docs/contract.md §3.5).
//! A finalized file goes to the caller as a [`FinalizedFile`], which is made durable and only then
//! settled.

use std::collections::HashMap;

use tokio::time::Instant;

use super::{Durable, PushError, Sink, SinkError, SinkFile, Unstaged};
use crate::batch::{Admit, FileStats, FlushReason, Limits};
use crate::checkpoint_file::Span;
use crate::flow::{self, OpenFile};
use crate::message::Received;
use crate::receipt::{AckRef, FileContents, Handover, Refusal, Replay};

/// A finalized file: every byte is in `file`, which still has to be made durable.
pub struct FinalizedFile {
    pub file: Box<dyn Durable>,
    pub contents: FileContents,
    pub reason: FlushReason,
    /// Identifies the file while it is open or being made durable (opening order).
    pub id: u64,
    /// When the file was opened: its first message has waited since (oldest-unacked age).
    pub opened_at: Instant,
    /// Bytes it held in memory when it was finalized (the memory budget counts them until it
    /// is durable).
    pub buffered: u64,
    /// Bytes of its messages as a broker's flow control counts them ([`crate::flow`]): they stay
    /// outstanding until the file is settled.
    pub flow_bytes: u64,
}

impl FinalizedFile {
    /// Its settle-facing part, as the settle side records it before it is made durable.
    pub fn handover(&mut self) -> Handover<'_> {
        Handover {
            id: self.id,
            name: self.file.name(),
            contents: &mut self.contents,
        }
    }
}

/// What [`OpenFiles::push`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// In its file.
    Done,
    /// In its file, which has bytes to stream out: call [`OpenFiles::flush`] before the next push.
    NeedsFlush,
}

/// The writer stage the pipeline drives, whatever the sink: [`Files`] of any [`Sink`].
#[async_trait::async_trait]
pub trait OpenFiles: Send {
    /// The group a message goes to (one open file per group).
    fn group_of(&self, r: &Received) -> Option<String>;
    /// What a refused message means for this sink.
    fn refusal(&self) -> Refusal;
    /// What the sink refuses of a message on its own ([`super::Sink::check`]).
    fn check(&self) -> Option<std::sync::Arc<dyn crate::receipt::MessageCheck>>;
    /// How far the destination holds each stream of a positioned source
    /// ([`super::Sink::durable_streams`]).
    fn durable_streams(&self) -> Option<std::sync::Arc<dyn crate::position::DurableStreams>>;
    /// Why the destination cannot take the files now ([`super::Sink::problem`]), for readiness.
    fn problem(&self) -> Option<String>;

    /// The run's shutdown grace, for what the sink waits on in place ([`Sink::bounded_by`]).
    fn bounded_by(&mut self, grace: &crate::shutdown::Grace);
    /// Append one message; files the batcher finalizes are pushed to `done`. `ack` says how a
    /// pulled message is settled (`None` for the file source). A refused message leaves every file
    /// as it was.
    fn push(
        &mut self,
        r: &Received,
        group: Option<String>,
        ack: Option<AckRef>,
        done: &mut Vec<FinalizedFile>,
    ) -> Result<Pushed, PushError>;
    /// Append the first message of a [`Replay`]: the open file of its group (if any) is finalized,
    /// and a file named as the replay says takes this message and every one up to `replay.last`,
    /// then is finalized whatever the limits say (it must hold exactly that span). A refused
    /// message leaves no replay file open.
    fn push_replay(
        &mut self,
        r: &Received,
        group: Option<String>,
        replay: &Replay,
        done: &mut Vec<FinalizedFile>,
    ) -> Result<Pushed, PushError>;
    /// Stream out what open files buffered past their threshold (after [`Pushed::NeedsFlush`]).
    async fn flush(&mut self) -> Result<(), SinkError>;
    /// Byte offsets and lines of the first message of every open file (checkpoint watermark).
    fn open_starts(&self) -> Vec<(u64, u64)>;
    /// Ack ids of the messages in open files (their leases must be kept alive).
    fn open_ack_ids(&self) -> Vec<String>;
    /// When the oldest open file reaches `max_duration`.
    fn next_deadline(&self) -> Option<Instant>;
    /// Finalize every open file whose `max_duration` has passed at `now`.
    fn expire(&mut self, now: Instant, done: &mut Vec<FinalizedFile>);
    /// Finalize every open file (end of input, shutdown, an ordered subscription's failure).
    fn finalize_all(&mut self, reason: FlushReason, done: &mut Vec<FinalizedFile>);
    /// Is a file a previous run left pending durable?
    async fn is_durable(&mut self, name: &str) -> Result<bool, SinkError>;
    /// Finalize the open file holding the most bytes in memory (a memory budget).
    fn finalize_largest(&mut self, reason: FlushReason, done: &mut Vec<FinalizedFile>);
    /// Open files.
    fn open_files(&self) -> usize;
    /// Bytes the open files hold in memory.
    fn buffered_bytes(&self) -> u64;
    /// Bytes the open file [`OpenFiles::finalize_largest`] would finalize holds (0: none).
    fn largest_buffered(&self) -> u64;
    /// When the oldest open file was opened.
    fn oldest_open(&self) -> Option<Instant>;
    /// Every open file's messages and their bytes as flow control counts them.
    fn open_flow(&self) -> Vec<OpenFile>;
    /// Finalize the open file `id` (if it is open) for `reason`.
    fn finalize_file(&mut self, id: u64, reason: FlushReason, done: &mut Vec<FinalizedFile>);
}

struct Open<F> {
    id: u64,
    file: F,
    stats: FileStats,
    opened_at: Instant,
    contents: FileContents,
    /// A replay file: finalized right after the message starting at this input offset, and
    /// never earlier by a limit.
    until: Option<u64>,
    /// Bytes of its messages as flow control counts them ([`flow::message_bytes`]).
    flow_bytes: u64,
}

/// The carry buffer keeps its allocation between files up to this size; a larger one (a large
/// message carried to the next file) is freed once placed.
const CARRY_KEPT: usize = 64 << 10;

/// The open files of one sink.
pub struct Files<S: Sink> {
    sink: S,
    limits: Limits,
    /// One open file per group (normally one; topic-schema revisions get one each).
    open: HashMap<Option<String>, Open<S::File>, foldhash::fast::RandomState>,
    /// Bytes of a staged message carried to the next file.
    carry: Vec<u8>,
    next_id: u64,
    /// [`Sink::rejects_rows`]: hold file-source messages with their file.
    hold: bool,
}

impl<S: Sink> Files<S> {
    pub fn new(sink: S) -> Files<S> {
        Files {
            limits: sink.limits(),
            hold: sink.rejects_rows(),
            sink,
            open: HashMap::default(),
            carry: Vec::with_capacity(4096),
            next_id: 0,
        }
    }

    /// The sink (tests, benchmarks).
    pub fn sink(&self) -> &S {
        &self.sink
    }

    fn open_file(
        &mut self,
        group: &Option<String>,
        first: &Received,
    ) -> Result<Open<S::File>, PushError> {
        let file = self.sink.open_for(group.as_deref(), first)?;
        Ok(self.track(file, group, None))
    }

    fn track(
        &mut self,
        file: S::File,
        group: &Option<String>,
        until: Option<u64>,
    ) -> Open<S::File> {
        self.next_id += 1;
        Open {
            id: self.next_id,
            stats: FileStats {
                bytes: file.header_bytes(),
                messages: 0,
            },
            file,
            opened_at: Instant::now(),
            contents: FileContents {
                span: Span {
                    group: group.clone(),
                    first: 0,
                    last: 0,
                },
                first_line: 0,
                last_line: 0,
                first_message_id: String::new(),
                last_message_id: String::new(),
                messages: 0,
                acks: Vec::new(),
                held: Vec::new(),
            },
            until,
            flow_bytes: 0,
        }
    }

    fn finalize(&mut self, group: &Option<String>, reason: FlushReason) -> FinalizedFile {
        let f = self.open.remove(group).expect("finalizing an open file");
        finalize(f, reason)
    }
}

fn finalize<F: SinkFile>(f: Open<F>, reason: FlushReason) -> FinalizedFile {
    FinalizedFile {
        buffered: f.file.buffered(),
        file: Box::new(f.file.close()),
        contents: f.contents,
        reason,
        id: f.id,
        opened_at: f.opened_at,
        flow_bytes: f.flow_bytes,
    }
}

#[async_trait::async_trait]
impl<S: Sink> OpenFiles for Files<S> {
    fn group_of(&self, r: &Received) -> Option<String> {
        self.sink.group_of(r)
    }

    fn refusal(&self) -> Refusal {
        self.sink.refusal()
    }

    fn check(&self) -> Option<std::sync::Arc<dyn crate::receipt::MessageCheck>> {
        self.sink.check()
    }

    fn durable_streams(&self) -> Option<std::sync::Arc<dyn crate::position::DurableStreams>> {
        self.sink.durable_streams()
    }

    fn problem(&self) -> Option<String> {
        self.sink.problem()
    }

    fn bounded_by(&mut self, grace: &crate::shutdown::Grace) {
        self.sink.bounded_by(grace)
    }

    fn push(
        &mut self,
        r: &Received,
        group: Option<String>,
        ack: Option<AckRef>,
        done: &mut Vec<FinalizedFile>,
    ) -> Result<Pushed, PushError> {
        // One lookup decides: no open file, or a replay file whose last message never came
        // (refused this time) and which ends here, means a fresh file.
        let fresh = match self.open.get(&group).map(|f| f.until) {
            None => true,
            Some(Some(until)) if r.receipt.start > until => {
                let f = self.finalize(&group, FlushReason::Early);
                done.push(f);
                true
            }
            Some(_) => false,
        };
        if fresh {
            let f = self.open_file(&group, r)?;
            self.open.insert(group.clone(), f);
        }
        let f = self.open.get_mut(&group).expect("opened above");
        let mut len = f.file.stage(r)?;
        let admit = match f.until {
            Some(_) => Admit::Append,
            None => self.limits.admit(f.stats, len),
        };
        let f = match admit {
            Admit::Append => {
                f.file.commit();
                f
            }
            Admit::FinalizeFirst(reason) => {
                // Rare: take the message back out, finalize, and put it in a fresh file.
                let carried = f.file.unstage(&mut self.carry);
                let full = self.finalize(&group, reason);
                done.push(full);
                let mut f = self.open_file(&group, r)?;
                // Counted where it lands.
                len = match carried {
                    Unstaged::Carried => {
                        let n = f.file.place(&self.carry);
                        if self.carry.capacity() > CARRY_KEPT {
                            // A large message's copy is not kept for ever (issue 26).
                            self.carry = Vec::with_capacity(4096);
                        }
                        n
                    }
                    Unstaged::Restage => {
                        let n = f.file.stage(r)?;
                        f.file.commit();
                        n
                    }
                };
                self.open.insert(group.clone(), f);
                self.open.get_mut(&group).expect("present")
            }
        };
        f.stats.bytes += len;
        f.stats.messages += 1;
        let c = &mut f.contents;
        if c.messages == 0 {
            c.span.first = r.receipt.start;
            c.first_line = r.receipt.line;
            c.first_message_id.clone_from(&r.msg.message_id);
        }
        c.span.last = r.receipt.start;
        c.last_line = r.receipt.line;
        c.last_message_id.clone_from(&r.msg.message_id);
        c.messages += 1;
        f.flow_bytes += flow::message_bytes(&r.msg);
        match ack {
            Some(ack) => c.acks.push(ack),
            None if self.hold => c.held.push(r.clone()),
            None => {}
        }
        let full = match f.until {
            Some(last) => (r.receipt.start >= last).then_some(FlushReason::Early),
            None => self.limits.full(f.stats),
        };
        if let Some(reason) = full {
            let full = self.finalize(&group, reason);
            done.push(full);
            return Ok(Pushed::Done);
        }
        Ok(if f.file.needs_flush() {
            Pushed::NeedsFlush
        } else {
            Pushed::Done
        })
    }

    fn push_replay(
        &mut self,
        r: &Received,
        group: Option<String>,
        replay: &Replay,
        done: &mut Vec<FinalizedFile>,
    ) -> Result<Pushed, PushError> {
        if self.open.contains_key(&group) {
            let f = self.finalize(&group, FlushReason::Early);
            done.push(f);
        }
        let file = self.sink.open_named(group.as_deref(), &replay.object)?;
        let f = self.track(file, &group, Some(replay.last));
        self.open.insert(group.clone(), f);
        let pushed = self.push(r, group.clone(), None, done);
        if pushed.is_err() {
            // Nothing of the replay is in it: drop the empty file (nothing was sent for it).
            self.open.remove(&group);
        }
        pushed
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        for f in self.open.values_mut() {
            if f.file.needs_flush() {
                f.file.flush().await?;
            }
        }
        Ok(())
    }

    fn open_starts(&self) -> Vec<(u64, u64)> {
        self.open
            .values()
            .map(|f| (f.contents.span.first, f.contents.first_line))
            .collect()
    }

    fn open_ack_ids(&self) -> Vec<String> {
        self.open
            .values()
            .flat_map(|f| f.contents.acks.iter().map(|a| a.ack_id.clone()))
            .collect()
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.open
            .values()
            .filter(|f| f.until.is_none())
            .map(|f| f.opened_at + self.limits.max_duration)
            .min()
    }

    fn expire(&mut self, now: Instant, done: &mut Vec<FinalizedFile>) {
        let max = self.limits.max_duration;
        let mut due: Vec<(u64, Option<String>)> = self
            .open
            .iter()
            .filter(|(_, f)| f.until.is_none() && f.opened_at + max <= now)
            .map(|(k, f)| (f.id, k.clone()))
            .collect();
        due.sort();
        for (_, k) in due {
            let f = self.finalize(&k, FlushReason::MaxDuration);
            done.push(f);
        }
    }

    fn finalize_all(&mut self, reason: FlushReason, done: &mut Vec<FinalizedFile>) {
        let mut files: Vec<Open<S::File>> = self.open.drain().map(|(_, f)| f).collect();
        files.sort_by_key(|f| f.id);
        done.extend(files.into_iter().map(|f| finalize(f, reason)));
    }

    async fn is_durable(&mut self, name: &str) -> Result<bool, SinkError> {
        self.sink.is_durable(name).await
    }

    fn finalize_largest(&mut self, reason: FlushReason, done: &mut Vec<FinalizedFile>) {
        let largest = self
            .open
            .iter()
            .filter(|(_, f)| f.until.is_none())
            .max_by_key(|(_, f)| f.file.buffered())
            .map(|(k, _)| k.clone());
        if let Some(k) = largest {
            let f = self.finalize(&k, reason);
            done.push(f);
        }
    }

    fn open_files(&self) -> usize {
        self.open.len()
    }

    fn buffered_bytes(&self) -> u64 {
        self.open.values().map(|f| f.file.buffered()).sum()
    }

    fn largest_buffered(&self) -> u64 {
        self.open
            .values()
            .filter(|f| f.until.is_none())
            .map(|f| f.file.buffered())
            .max()
            .unwrap_or(0)
    }

    fn oldest_open(&self) -> Option<Instant> {
        self.open.values().map(|f| f.opened_at).min()
    }

    fn open_flow(&self) -> Vec<OpenFile> {
        self.open
            .values()
            .map(|f| OpenFile {
                id: f.id,
                held: flow::Held {
                    messages: f.contents.messages,
                    bytes: f.flow_bytes,
                },
                replay: f.until.is_some(),
            })
            .collect()
    }

    fn finalize_file(&mut self, id: u64, reason: FlushReason, done: &mut Vec<FinalizedFile>) {
        let group = self
            .open
            .iter()
            .find(|(_, f)| f.id == id)
            .map(|(k, _)| k.clone());
        if let Some(k) = group {
            let f = self.finalize(&k, reason);
            done.push(f);
        }
    }
}
