//! The BigQuery sink's view of its table's schema while it runs (docs/destinations.md, "Schema
//! changes while running"): the same contract as a Delta table's ([`crate::sink::delta`]'s
//! `SchemaWatch`), read with `tables.get`.
//!
//! A [`BigQuerySchemaWatch`] is shared by the sink, its appends and a task of its own:
//! * the task reads the table resource every `--table-schema-refresh` ([`BigQuerySchemaWatch::run`]);
//! * new NULLABLE columns wait in the watch until the sink opens its next batch, which takes them
//!   up ([`BigQuerySchemaWatch::take_added`]); a batch already open is appended with the columns it was
//!   opened with (BigQuery fills a column a request leaves out with NULL);
//! * a change the rows no longer fit (a column removed or retyped, a new REQUIRED column, a
//!   NULLABLE column made REQUIRED) is the subscription's `SCHEMA_MISMATCH`: readiness says why
//!   ([`BigQuerySchemaWatch::problem`]), a warning is logged once per change, and appends wait
//!   ([`BigQuerySchemaWatch::wait_fits`]) — nothing appended, nothing settled — re-reading the table every
//!   refresh interval until it fits again. A request BigQuery refuses makes the append read the
//!   table at once ([`BigQuerySchemaWatch::recheck`]): a change made since the last read holds the
//!   request instead of failing its rows.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::client::{BigQueryClient, TableRef};
use crate::table::evolve::{fit_fields, FieldFit};
use crate::table::{FieldMode, TableField};

/// The shortest refresh interval: a `tables.get` each time.
const MIN_REFRESH: Duration = Duration::from_millis(100);

/// What the sink, its appends and the refresh task know of the table's schema.
pub struct BigQuerySchemaWatch {
    table: TableRef,
    client: BigQueryClient,
    /// How often the table is read again (`--table-schema-refresh`).
    pub refresh: Duration,
    state: Mutex<State>,
}

struct State {
    /// The columns the sink's new batches are written with.
    writes: Vec<TableField>,
    /// The table's columns as last seen fitting (the first read's, to begin with): what a change
    /// is a change from. A `--table-schema` may differ from the table (a drift BigQuery answers
    /// row by row, as before); only what changes in the table after that counts.
    baseline: Option<Vec<TableField>>,
    /// New NULLABLE columns of the table not yet taken up by the sink.
    added: Vec<TableField>,
    /// SCHEMA_MISMATCH: why the rows no longer fit the table.
    problem: Option<String>,
}

impl BigQuerySchemaWatch {
    /// A watch of `table`, whose new batches are written with the columns `writes`.
    pub fn new(
        table: TableRef,
        client: BigQueryClient,
        writes: &[TableField],
        refresh: Duration,
    ) -> Arc<BigQuerySchemaWatch> {
        Arc::new(BigQuerySchemaWatch {
            table,
            client,
            refresh: refresh.max(MIN_REFRESH),
            state: Mutex::new(State {
                writes: writes.to_vec(),
                baseline: None,
                added: Vec::new(),
                problem: None,
            }),
        })
    }

    /// The table's columns are `table`: compared with what the sink writes, as the table had
    /// them when they last fitted (the first call only sets that).
    pub fn observe(&self, table: &[TableField]) {
        let mut s = self.state.lock().expect("schema watch");
        let Some(base) = &s.baseline else {
            s.baseline = Some(table.to_vec());
            return;
        };
        // The written columns as the table had them (a column the table lacked is BigQuery's to
        // answer row by row); REQUIRED where the writer never writes NULL.
        let written: Vec<TableField> = s
            .writes
            .iter()
            .filter_map(|w| {
                let mut f = base.iter().find(|b| b.name == w.name)?.clone();
                if w.mode == FieldMode::Required && f.mode == FieldMode::Nullable {
                    f.mode = FieldMode::Required;
                }
                Some(f)
            })
            .collect();
        let fit = match fit_fields(&written, table) {
            // Only columns new to the table (or found new and not taken up yet): its own columns
            // the writer leaves out stay out.
            FieldFit::Added(added) => {
                let new: Vec<TableField> = added
                    .into_iter()
                    .filter(|a| {
                        !base.iter().any(|b| b.name == a.name)
                            || s.added.iter().any(|p| p.name == a.name)
                    })
                    .collect();
                if new.is_empty() {
                    FieldFit::Same
                } else {
                    FieldFit::Added(new)
                }
            }
            other => other,
        };
        if !matches!(fit, FieldFit::Mismatch(_)) {
            s.baseline = Some(table.to_vec());
        }
        match fit {
            FieldFit::Same => {
                s.added.clear();
                self.clear(&mut s);
            }
            FieldFit::Added(added) => {
                if s.added != added {
                    let names: Vec<&str> = added.iter().map(|f| f.name.as_str()).collect();
                    tracing::info!(
                        table = %self.table,
                        columns = ?names,
                        "new NULLABLE columns in the table: written from the next batch on"
                    );
                }
                s.added = added;
                self.clear(&mut s);
            }
            FieldFit::Mismatch(why) => {
                let problem = format!("SCHEMA_MISMATCH: BigQuery table {}: {why}", self.table);
                if s.problem.as_ref() != Some(&problem) {
                    // Once per change: the refresh finds the same problem again every interval.
                    tracing::warn!(
                        table = %self.table,
                        "{problem}; nothing is appended and no message settled until the table fits again (re-checked every {:?})",
                        self.refresh
                    );
                    s.problem = Some(problem);
                }
            }
        }
    }

    fn clear(&self, s: &mut State) {
        if s.problem.take().is_some() {
            tracing::warn!(table = %self.table, "the table's schema fits again: appends go on");
        }
    }

    /// Why the table does not fit (SCHEMA_MISMATCH), for readiness.
    pub fn problem(&self) -> Option<String> {
        self.state.lock().expect("schema watch").problem.clone()
    }

    /// New NULLABLE columns the sink has not taken up yet (and forget them): the sink's next
    /// batch writes them, so from now on they are part of what it writes.
    pub fn take_added(&self) -> Vec<TableField> {
        let mut s = self.state.lock().expect("schema watch");
        let added = std::mem::take(&mut s.added);
        s.writes.extend(added.iter().cloned());
        added
    }

    /// The sink's new batches are written with the columns `writes` from now on.
    pub fn set_writes(&self, writes: &[TableField]) {
        self.state.lock().expect("schema watch").writes = writes.to_vec();
    }

    /// Read the table now and compare. A failed read changes nothing (the appends report an
    /// unreachable BigQuery themselves).
    pub async fn read(&self) {
        match self.client.table_schema(&self.table).await {
            Ok(schema) => self.observe(&schema.fields),
            Err(e) => {
                tracing::debug!(table = %self.table, error = %e, "reading the table's schema failed")
            }
        }
    }

    /// Read the table now: does it still fit? (After BigQuery refused a request: a change made
    /// since the last read holds the request rather than failing its rows.)
    pub async fn recheck(&self) -> bool {
        self.read().await;
        self.problem().is_none()
    }

    /// Wait while the table does not fit (SCHEMA_MISMATCH), reading it every refresh interval.
    /// Returns at once when it fits.
    pub async fn wait_fits(&self) {
        while self.problem().is_some() {
            tokio::time::sleep(self.refresh).await;
            self.read().await;
        }
    }

    /// Read the table at once when `read_first` (what later reads compare with, when nothing
    /// was observed at startup), then every refresh interval, until the watch is dropped (the
    /// sink and its appends are gone).
    pub async fn run(watch: Weak<BigQuerySchemaWatch>, read_first: bool) {
        if read_first {
            match watch.upgrade() {
                Some(w) => w.read().await,
                None => return,
            }
        }
        loop {
            let refresh = match watch.upgrade() {
                Some(w) => w.refresh,
                None => return,
            };
            tokio::time::sleep(refresh).await;
            let Some(w) = watch.upgrade() else { return };
            w.read().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{FieldMode, FieldType};

    fn watch(writes: &[TableField]) -> Arc<BigQuerySchemaWatch> {
        let client = BigQueryClient::new(Some("http://127.0.0.1:9"), Some("http://127.0.0.1:9"))
            .expect("a client");
        let table = TableRef::from_config("p.d.t").expect("a table");
        BigQuerySchemaWatch::new(table, client, writes, Duration::from_secs(1))
    }

    #[tokio::test]
    async fn a_drift_at_startup_is_not_a_change_only_what_changes_after_it_counts() {
        // `--table-schema` says STRING, the table INT64; it also has a column not written.
        let written = TableField::new("n", FieldType::String, FieldMode::Nullable);
        let table = TableField::new("n", FieldType::Int64, FieldMode::Nullable);
        let other = TableField::new("other", FieldType::Bool, FieldMode::Nullable);
        let w = watch(std::slice::from_ref(&written));
        w.observe(&[table.clone(), other.clone()]);
        w.observe(&[table.clone(), other.clone()]);
        assert_eq!((w.problem(), w.take_added()), (None, vec![]));
        // The table's own column retyped: a change.
        let retyped = TableField::new("n", FieldType::Float64, FieldMode::Nullable);
        w.observe(&[retyped, other.clone()]);
        assert!(w.problem().expect("a mismatch").contains("`n` is FLOAT64"));
        w.observe(&[table, other]);
        assert_eq!(w.problem(), None, "back as it was");
    }

    #[tokio::test]
    async fn added_columns_wait_for_the_next_batch_a_mismatch_is_said_until_it_passes() {
        let id = TableField::new("id", FieldType::String, FieldMode::Nullable);
        let extra = TableField::new("extra", FieldType::Int64, FieldMode::Nullable);
        let w = watch(std::slice::from_ref(&id));
        w.observe(std::slice::from_ref(&id));
        assert_eq!(
            w.take_added(),
            vec![],
            "the first read is what changes are from"
        );
        w.observe(&[id.clone(), extra.clone()]);
        // Read again before the sink opens a batch: still to take up.
        w.observe(&[id.clone(), extra.clone()]);
        assert_eq!(w.problem(), None);
        assert_eq!(w.take_added(), vec![extra.clone()]);
        assert_eq!(w.take_added(), vec![], "taken once");
        w.observe(&[id.clone(), extra.clone()]);
        assert_eq!(w.take_added(), vec![], "written now: nothing new");
        // What is written now includes `extra`: dropping it is a mismatch.
        w.observe(std::slice::from_ref(&id));
        let problem = w.problem().expect("a mismatch");
        assert_eq!(
            problem,
            "SCHEMA_MISMATCH: BigQuery table p.d.t: column `extra` is not in the table any more \
             (removed or renamed); subsink writes it as INT64"
        );
        w.observe(&[id, extra]);
        assert_eq!(w.problem(), None, "fits again");
    }
}
