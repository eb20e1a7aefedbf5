//! A table sink's view of its table's schema while it runs (docs/destinations.md, "Schema changes
//! while running"), one for every table sink: what differs between tables — their columns, how
//! the table's are compared with what is written, how new ones are taken up — is a
//! [`WatchedColumns`] (`sink/delta/schema.rs`, `sink/bigquery/schema.rs`); how a table is read is
//! the sink's own.
//!
//! A [`SchemaWatch`] is shared by the sink, its commits (or appends) and a task of its own that
//! reads the table every `--table-schema-refresh`:
//! * new NULLABLE columns wait in the watch until the sink opens its next batch, which takes them
//!   up ([`SchemaWatch::take_added`]): a batch already open is written with the columns it was
//!   opened with (readers, or BigQuery, fill a column left out with NULL);
//! * a change the written rows no longer fit (a column removed or retyped, a new REQUIRED
//!   column) is the subscription's `SCHEMA_MISMATCH`: readiness says why
//!   ([`SchemaWatch::problem`]), a warning is logged once per change, and writes wait
//!   ([`SchemaWatch::hold`]) — nothing written, nothing settled — trying again every refresh
//!   interval, until the table fits again.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::table::evolve::Fit;

/// The shortest refresh interval: a read of the table each time.
pub const MIN_REFRESH: Duration = Duration::from_millis(100);

/// What differs between the schema watches of two kinds of table: their columns, how the
/// table's columns are compared with the written ones, how new columns are taken up, and the
/// words of the log lines.
pub trait WatchedColumns: Send + 'static {
    /// One column of the table.
    type Column: Clone + PartialEq + Send;
    /// The table's columns as read.
    type Table: ?Sized;
    /// What the table is read through (a client), if the watch reads it itself.
    type Source: Send + Sync;
    /// The table's kind in a SCHEMA_MISMATCH (`Delta table`).
    const KIND: &'static str;
    /// What is held while the table does not fit (`committed`).
    const HELD: &'static str;
    /// What goes on when it fits again (`commits`).
    const WRITES: &'static str;

    /// The table's columns `table` against what is written; `added` are the new columns found
    /// before and not taken up yet. `None`: nothing to compare yet (a first read only sets what
    /// later reads are compared with).
    fn fit(&mut self, table: &Self::Table, added: &[Self::Column]) -> Option<Fit<Self::Column>>;

    /// The new columns `added` are written from now on.
    fn take_up(&mut self, added: &[Self::Column]);

    /// A column's name, for the log.
    fn name(column: &Self::Column) -> &str;
}

/// What the sink, its writes and the refresh task know of the table's schema.
pub struct SchemaWatch<C: WatchedColumns> {
    /// The table, as the log and SCHEMA_MISMATCH name it.
    table: String,
    /// What the table is read through.
    source: C::Source,
    /// How often the table is read again (`--table-schema-refresh`).
    pub refresh: Duration,
    state: Mutex<State<C>>,
}

/// The watch's mutable part.
struct State<C: WatchedColumns> {
    /// What the sink writes, and how a table's columns are compared with it.
    columns: C,
    /// The table version whose schema was last compared (versioned tables only).
    version: Option<i64>,
    /// New NULLABLE columns of the table not yet taken up by the sink.
    added: Vec<C::Column>,
    /// SCHEMA_MISMATCH: why the written rows no longer fit the table.
    problem: Option<String>,
}

/// One attempt of a write held while the table does not fit ([`SchemaWatch::hold`]).
pub enum Attempt<T> {
    /// Written (or failed for another reason): the outcome.
    Done(T),
    /// The table does not fit: at which version (if the table has versions) and why; `None`:
    /// the watch knows already.
    Held(Option<(Option<i64>, String)>),
}

impl<T> Attempt<T> {
    /// An attempt that may fail before it knows whether the table fits: a failure is its
    /// outcome.
    pub fn or_failed<E>(attempt: Result<Attempt<T>, E>) -> Attempt<Result<T, E>> {
        match attempt {
            Ok(Attempt::Done(t)) => Attempt::Done(Ok(t)),
            Ok(Attempt::Held(why)) => Attempt::Held(why),
            Err(e) => Attempt::Done(Err(e)),
        }
    }
}

impl<C: WatchedColumns> SchemaWatch<C> {
    /// A watch of the table named `table` (read through `source`), whose new batches are
    /// written as `columns` says.
    pub fn watching(
        table: String,
        columns: C,
        source: C::Source,
        refresh: Duration,
    ) -> SchemaWatch<C> {
        SchemaWatch {
            table,
            source,
            refresh: refresh.max(MIN_REFRESH),
            state: Mutex::new(State {
                columns,
                version: None,
                added: Vec::new(),
                problem: None,
            }),
        }
    }

    /// The table's columns at `version` (if it has versions) are `table`: compared with what
    /// the sink writes (a version older than one already seen is ignored).
    pub fn observe_at(&self, version: Option<i64>, table: &C::Table) {
        let mut s = self.state.lock().expect("schema watch");
        if let (Some(v), Some(seen)) = (version, s.version) {
            if v < seen {
                return;
            }
        }
        if version.is_some() {
            s.version = version;
        }
        let s = &mut *s;
        let Some(fit) = s.columns.fit(table, &s.added) else {
            return;
        };
        match fit {
            Fit::Same => {
                s.added.clear();
                self.clear(s, version);
            }
            Fit::Added(added) => {
                if s.added != added {
                    let names: Vec<&str> = added.iter().map(C::name).collect();
                    let what = "new NULLABLE columns in the table: written from the next batch on";
                    match version {
                        Some(version) => {
                            tracing::info!(table = %self.table, version, columns = ?names, "{what}")
                        }
                        None => tracing::info!(table = %self.table, columns = ?names, "{what}"),
                    }
                }
                s.added = added;
                self.clear(s, version);
            }
            Fit::Mismatch(why) => self.mismatch_locked(s, version, why),
        }
    }

    /// The table, as the log names it.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// What the table is read through.
    pub fn source(&self) -> &C::Source {
        &self.source
    }

    /// A write found the rows no longer fit the table (at `version`): `why`.
    pub fn mismatch_at(&self, version: Option<i64>, why: String) {
        let mut s = self.state.lock().expect("schema watch");
        self.mismatch_locked(&mut s, version, why);
    }

    fn mismatch_locked(&self, s: &mut State<C>, version: Option<i64>, why: String) {
        let problem = format!("SCHEMA_MISMATCH: {} {}: {why}", C::KIND, self.table);
        if s.problem.as_ref() != Some(&problem) {
            // Once per change: the refresh finds the same problem again every interval.
            let (held, refresh) = (C::HELD, self.refresh);
            match version {
                Some(version) => tracing::warn!(
                    table = %self.table,
                    version,
                    "{problem}; nothing is {held} and no message settled until the table fits again (re-checked every {refresh:?})"
                ),
                None => tracing::warn!(
                    table = %self.table,
                    "{problem}; nothing is {held} and no message settled until the table fits again (re-checked every {refresh:?})"
                ),
            }
            s.problem = Some(problem);
        }
    }

    fn clear(&self, s: &mut State<C>, version: Option<i64>) {
        if s.problem.take().is_some() {
            let writes = C::WRITES;
            match version {
                Some(version) => tracing::warn!(
                    table = %self.table,
                    version,
                    "the table's schema fits again: {writes} go on"
                ),
                None => tracing::warn!(
                    table = %self.table,
                    "the table's schema fits again: {writes} go on"
                ),
            }
        }
    }

    /// Why the table does not fit (SCHEMA_MISMATCH), for readiness.
    pub fn problem(&self) -> Option<String> {
        self.state.lock().expect("schema watch").problem.clone()
    }

    /// New NULLABLE columns the sink has not taken up yet (and forget them): the sink's next
    /// batch writes them, so from now on they are part of what it writes.
    pub fn take_added(&self) -> Vec<C::Column> {
        let mut s = self.state.lock().expect("schema watch");
        let added = std::mem::take(&mut s.added);
        if !added.is_empty() {
            s.columns.take_up(&added);
        }
        added
    }

    /// Change what the sink writes (its new batches' columns).
    pub fn with_columns<T>(&self, f: impl FnOnce(&mut C) -> T) -> T {
        f(&mut self.state.lock().expect("schema watch").columns)
    }

    /// The one hold-until-fits loop of every table sink: try `attempt` until it is done; while
    /// the table does not fit, each held attempt is reported ([`SchemaWatch::mismatch_at`]) and the
    /// next one made a refresh interval later — nothing written, its messages not settled.
    /// `None`: `cancelled` was set while held (given up before it was written).
    pub async fn hold<T, F, Fut>(&self, cancelled: Option<&AtomicBool>, mut attempt: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        loop {
            match attempt().await {
                Attempt::Done(t) => return Some(t),
                Attempt::Held(Some((version, why))) => self.mismatch_at(version, why),
                Attempt::Held(None) => {}
            }
            if cancelled.is_some_and(|c| c.load(Ordering::SeqCst)) {
                return None;
            }
            tokio::time::sleep(self.refresh).await;
        }
    }
}
