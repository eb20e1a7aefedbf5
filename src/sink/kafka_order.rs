//! `--exactly-once` with Kafka into a table (a Delta table, a BigQuery table): what the two table
//! sinks share so that what a table holds of a partition is always a run of its offsets from the
//! start, whose last offset tells a restart where to go on (docs/kafka.md#exactly-once):
//! * a partition's commits land in offset order: a batch's commit waits for the previous commit
//!   of each of its partitions, and fails when one of those failed or was given up
//!   ([`KafkaOrder::chain`], [`Chained::wait_before`]);
//! * once a record of a partition is refused (it cannot be a row), every later record of that
//!   partition is refused in this run ([`KafkaOrder::stage`]): its partition stops, and no later
//!   commit passes the record.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::message::kafka_id::{parse_id, Tp};
use crate::message::Message;
use crate::table::{RowError, RowErrorKind};

/// The outcome of a commit, for the next commits of its partitions: `None` while it runs.
type Outcome = tokio::sync::watch::Receiver<Option<bool>>;

#[derive(Default)]
struct State {
    /// Per partition, the outcome of its last commit handed over.
    last: HashMap<Tp, Outcome>,
    /// Per partition, the first offset refused in this run: no later record of it is written.
    refused: HashMap<Tp, i64>,
}

/// What the files of one sink share (cheap to clone).
#[derive(Clone, Default)]
pub struct KafkaOrder {
    state: Arc<Mutex<State>>,
}

/// Per partition, the first and last offset of its records in a batch.
pub type Parts = BTreeMap<Tp, (i64, i64)>;

impl KafkaOrder {
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
    ) -> Result<Option<(Tp, i64)>, crate::sink::Refused> {
        let at = parse_id(&msg.message_id);
        if let Some((tp, offset)) = &at {
            if let Some(o) = self.lock().refused.get(tp).filter(|o| *o < offset) {
                return Err(RowError {
                    message_id: msg.message_id.clone(),
                    field: "$".into(),
                    kind: RowErrorKind::Invalid,
                    reason: format!(
                        "--exactly-once: record {}/{}/{o} of its partition was refused before it, so nothing after it is written in this run",
                        tp.0, tp.1
                    ),
                }
                .into());
            }
        }
        if let Err(e) = append() {
            if let Some((tp, offset)) = at {
                let mut state = self.lock();
                let o = state.refused.entry(tp).or_insert(offset);
                *o = (*o).min(offset);
            }
            return Err(e.into());
        }
        Ok(at)
    }

    /// A closed batch holding `parts`: its place after the previous commit of each.
    pub fn chain<'a>(&self, parts: impl IntoIterator<Item = &'a Tp>) -> Chained {
        // This commit's outcome is what the next commits of its partitions wait for.
        let (tx, rx) = tokio::sync::watch::channel(None);
        let mut state = self.lock();
        let before = parts
            .into_iter()
            .filter_map(|tp| state.last.insert(tp.clone(), rx.clone()))
            .collect();
        Chained { before, tx }
    }
}

/// Count `at` (from [`KafkaOrder::stage`]) in `parts` once its row is kept.
pub fn count(parts: &mut Parts, at: Option<(Tp, i64)>) {
    if let Some((tp, offset)) = at {
        let e = parts.entry(tp).or_insert((offset, offset));
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

    /// The batch's commit landed (`true`) or not.
    pub fn done(self, ok: bool) {
        let _ = self.tx.send(Some(ok));
    }
}
