//! The one ordering mechanism of the crate: chains of commits ([`Chains`]), each link waiting for
//! the previous link of each of its keys ([`Chained`]). Three orders are kept with it:
//! * `--exactly-once` with a positioned source into a table (a Delta table, a BigQuery table),
//!   so that what a table holds of a stream's partition is always a run of its offsets from the
//!   start, whose last offset tells a restart where to go on ([`crate::position`]): a
//!   partition's commits land in offset order — a batch's commit waits for the previous commit
//!   of each of its partitions, and fails when one of those failed or was given up
//!   ([`StreamOrder::chain`], [`Chained::wait_before`]); and once a record of a partition is
//!   refused (it cannot be a row), every later record of that partition is refused in this run
//!   ([`StreamOrder::stage`]): its partition stops, and no later commit passes the record;
//! * `--exactly-once` into objects: the files of a partition, keyed by its [`StreamKey`], each
//!   written only once the one before it is (`sink::object::ExactNames`);
//! * change data capture, and message ordering (`crate::durable::MakeDurable`): one chain
//!   ([`ArrivalOrder`]), each commit after the one handed over before it has ended, whatever its
//!   outcome ([`Chained::wait_ended`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::message::Received;
use crate::position::{Position, StreamKey, Streams};
use crate::table::{RowError, RowErrorKind};

/// The outcome of a commit, for the next commits of its partitions: `None` while it runs.
type Outcome = tokio::sync::watch::Receiver<Option<bool>>;

/// Chains of commits, one per key (cheap to clone: the clones share the chains): per key, the
/// outcome of the last link handed out.
pub struct Chains<K> {
    last: Arc<Mutex<HashMap<K, Outcome>>>,
}

impl<K> Clone for Chains<K> {
    fn clone(&self) -> Self {
        Chains {
            last: self.last.clone(),
        }
    }
}

impl<K> Default for Chains<K> {
    fn default() -> Self {
        Chains {
            last: Default::default(),
        }
    }
}

impl<K: Eq + Hash> Chains<K> {
    /// A new link at the end of the chain of each of `keys`: after the previous link of each.
    pub fn link(&self, keys: impl IntoIterator<Item = K>) -> Chained {
        // This link's outcome is what the next links of its keys wait for.
        let (tx, rx) = tokio::sync::watch::channel(None);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let before = keys
            .into_iter()
            .filter_map(|key| last.insert(key, rx.clone()))
            .collect();
        Chained { before, tx }
    }
}

/// Change data capture without `--exactly-once`: a sink's MERGEs land in the order their
/// batches closed, since a change without a sequence number (or with an equal one) is decided by
/// arrival ([`crate::table::merge`]); message ordering: a pipeline's files become durable one at
/// a time, in the order handed over. One chain: each batch's place is after the previous batch's
/// commit has ended, whatever its outcome (a batch retried after a failed commit arrives at its
/// retry).
pub type ArrivalOrder = Chains<()>;

impl Chains<()> {
    /// A closed batch: its place after the batch closed before it.
    pub fn chain(&self) -> Chained {
        self.link([()])
    }
}

/// What the files of one sink share (cheap to clone): the source's streams, their order, and the
/// records refused.
#[derive(Clone)]
pub struct StreamOrder {
    streams: Streams,
    /// Per partition, the chain of its commits.
    chains: Chains<StreamKey>,
    /// Per partition, the first offset refused in this run: no later record of it is written.
    refused: Arc<Mutex<HashMap<StreamKey, i64>>>,
}

/// Per partition, the first and last offset of its records in a batch.
pub type Parts = BTreeMap<StreamKey, (i64, i64)>;

impl StreamOrder {
    /// The order of the partitions of `streams`.
    pub fn new(streams: Streams) -> StreamOrder {
        StreamOrder {
            streams,
            chains: Chains::default(),
            refused: Default::default(),
        }
    }

    /// The source's streams.
    pub fn streams(&self) -> &Streams {
        &self.streams
    }

    fn refused(&self) -> MutexGuard<'_, HashMap<StreamKey, i64>> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stage `msg` with `append` (the row builder's), unless a record of its partition was
    /// refused before it in this run; a record `append` refuses is remembered as refused. Its
    /// partition and offset, to count once the row is kept.
    pub fn stage<E: Into<crate::receipt::Refused>>(
        &self,
        r: &Received,
        append: impl FnOnce() -> Result<(), E>,
    ) -> Result<Option<Position>, crate::receipt::Refused> {
        let msg = &r.msg;
        let at = r.receipt.position.as_deref().cloned();
        if let Some(Position { key, offset }) = &at {
            if let Some(o) = self.refused().get(key).filter(|o| *o < offset) {
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
                let mut refused = self.refused();
                let o = refused.entry(key).or_insert(offset);
                *o = (*o).min(offset);
            }
            return Err(e.into());
        }
        Ok(at)
    }

    /// A closed batch holding `parts`: its place after the previous commit of each.
    pub fn chain<'a>(&self, parts: impl IntoIterator<Item = &'a StreamKey>) -> Chained {
        self.chains.link(parts.into_iter().cloned())
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

/// A link of [`Chains`]: a batch's (or a file's) place in the order of its keys.
pub struct Chained {
    /// The outcomes of the previous links of its keys.
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
