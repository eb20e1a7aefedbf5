//! `--exactly-once` with a positioned source into a table (a Delta table, a BigQuery table): what
//! the two table sinks share so that what a table holds of a stream's partition is always a run of
//! its offsets from the start, whose last offset tells a restart where to go on
//! ([`crate::position`]):
//! * a partition's commits land in offset order: a batch's commit waits for the previous commit
//!   of each of its partitions, and fails when one of those failed or was given up
//!   ([`StreamOrder::chain`], [`Chained::wait_before`]);
//! * once a record of a partition is refused (it cannot be a row), every later record of that
//!   partition is refused in this run ([`StreamOrder::stage`]): its partition stops, and no later
//!   commit passes the record.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::message::Message;
use crate::position::{Position, StreamKey, Streams};
use crate::table::{RowError, RowErrorKind};

/// The outcome of a commit, for the next commits of its partitions: `None` while it runs.
type Outcome = tokio::sync::watch::Receiver<Option<bool>>;

#[derive(Default)]
struct State {
    /// Per partition, the outcome of its last commit handed over.
    last: HashMap<StreamKey, Outcome>,
    /// Per partition, the first offset refused in this run: no later record of it is written.
    refused: HashMap<StreamKey, i64>,
}

/// What the files of one sink share (cheap to clone): the source's streams, and their order.
#[derive(Clone)]
pub struct StreamOrder {
    streams: Streams,
    state: Arc<Mutex<State>>,
}

/// Per partition, the first and last offset of its records in a batch.
pub type Parts = BTreeMap<StreamKey, (i64, i64)>;

impl StreamOrder {
    /// The order of the partitions of `streams`.
    pub fn new(streams: Streams) -> StreamOrder {
        StreamOrder {
            streams,
            state: Default::default(),
        }
    }

    /// The source's streams.
    pub fn streams(&self) -> &Streams {
        &self.streams
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stage `msg` with `append` (the row builder's), unless a record of its partition was
    /// refused before it in this run; a record `append` refuses is remembered as refused. Its
    /// partition and offset, to count once the row is kept.
    pub fn stage<E: Into<crate::sink::Refused>>(
        &self,
        msg: &Message,
        append: impl FnOnce() -> Result<(), E>,
    ) -> Result<Option<Position>, crate::sink::Refused> {
        let at = self.streams.position_of(&msg.message_id);
        if let Some(Position { key, offset }) = &at {
            if let Some(o) = self.lock().refused.get(key).filter(|o| *o < offset) {
                return Err(RowError {
                    message_id: msg.message_id.clone(),
                    field: "$".into(),
                    kind: RowErrorKind::Invalid,
                    reason: format!(
                        "--exactly-once: record {} of its partition was refused before it, so nothing after it is written in this run",
                        key.message_id(*o)
                    ),
                }
                .into());
            }
        }
        if let Err(e) = append() {
            if let Some(Position { key, offset }) = at {
                let mut state = self.lock();
                let o = state.refused.entry(key).or_insert(offset);
                *o = (*o).min(offset);
            }
            return Err(e.into());
        }
        Ok(at)
    }

    /// A closed batch holding `parts`: its place after the previous commit of each.
    pub fn chain<'a>(&self, parts: impl IntoIterator<Item = &'a StreamKey>) -> Chained {
        // This commit's outcome is what the next commits of its partitions wait for.
        let (tx, rx) = tokio::sync::watch::channel(None);
        let mut state = self.lock();
        let before = parts
            .into_iter()
            .filter_map(|key| state.last.insert(key.clone(), rx.clone()))
            .collect();
        Chained { before, tx }
    }
}

/// Change data capture without `--exactly-once`: a sink's MERGEs land in the order their
/// batches closed, since a change without a sequence number (or with an equal one) is decided by
/// arrival ([`crate::sink::delta::merge`]). Each batch's place: after the previous batch's commit has
/// ended, whatever its outcome (a batch retried after a failed commit arrives at its retry).
#[derive(Clone, Default)]
pub struct ArrivalOrder {
    last: Arc<Mutex<Option<Outcome>>>,
}

impl ArrivalOrder {
    /// A closed batch: its place after the batch closed before it.
    pub fn chain(&self) -> Chained {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let before = last.replace(rx).into_iter().collect();
        Chained { before, tx }
    }
}

/// Count `at` (from [`StreamOrder::stage`]) in `parts` once its row is kept.
pub fn count(parts: &mut Parts, at: Option<Position>) {
    if let Some(Position { key, offset }) = at {
        let e = parts.entry(key).or_insert((offset, offset));
        e.0 = e.0.min(offset);
        e.1 = e.1.max(offset);
    }
}

/// A batch's place in its partitions' order.
pub struct Chained {
    /// The outcomes of the previous commits of its partitions.
    before: Vec<Outcome>,
    /// Its own outcome (dropped unsent: failed).
    tx: tokio::sync::watch::Sender<Option<bool>>,
}

impl Chained {
    /// Wait for the previous commits of the batch's partitions: `false` when one of them failed
    /// (then this one must fail too: drop it unsent).
    pub async fn wait_before(&self) -> bool {
        for before in &self.before {
            let mut before = before.clone();
            let ok = matches!(
                before.wait_for(Option::is_some).await.as_deref(),
                Ok(Some(true))
            );
            if !ok {
                return false;
            }
        }
        true
    }

    /// Wait until the previous commits have ended, landed or not ([`ArrivalOrder`]).
    pub async fn wait_ended(&self) {
        for before in &self.before {
            let _ = before.clone().wait_for(Option::is_some).await;
        }
    }

    /// The batch's commit landed (`true`) or not.
    pub fn done(self, ok: bool) {
        let _ = self.tx.send(Some(ok));
    }
}
