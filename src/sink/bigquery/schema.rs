//! The BigQuery sink's [`BigQuerySchemaWatch`] (docs/destinations.md, "Schema changes while
//! running"): the generic watch of `sink/schema_watch.rs` over BigQuery's columns
//! ([`BigQueryColumns`]), read with `tables.get`.
//!
//! * the watch's task reads the table resource every `--table-schema-refresh`
//!   ([`BigQuerySchemaWatch::run`]);
//! * a change the rows no longer fit holds appends ([`BigQuerySchemaWatch::wait_fits`]),
//!   re-reading the table every refresh interval until it fits again. A request BigQuery refuses
//!   makes the append read the table at once ([`BigQuerySchemaWatch::recheck`]): a change made
//!   since the last read holds the request instead of failing its rows.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::client::{BigQueryClient, TableRef};
use crate::sink::schema_watch::{Attempt, SchemaWatch, WatchedColumns};
use crate::table::evolve::{fit_fields, Fit};
use crate::table::{FieldMode, TableField};

/// What the BigQuery sink, its appends and the refresh task know of the table's schema.
pub type BigQuerySchemaWatch = SchemaWatch<BigQueryColumns>;

/// The columns the BigQuery sink's new batches are written with, and the table's as last seen
/// fitting.
pub struct BigQueryColumns {
    /// The columns the sink's new batches are written with.
    writes: Vec<TableField>,
    /// The table's columns as last seen fitting (the first read's, to begin with): what a change
    /// is a change from. A `--table-schema` may differ from the table (a drift BigQuery answers
    /// row by row, as before); only what changes in the table after that counts.
    baseline: Option<Vec<TableField>>,
}

/// The table a BigQuery schema watch reads, and the client it reads it with.
pub struct BigQueryTable {
    table: TableRef,
    client: BigQueryClient,
}

impl WatchedColumns for BigQueryColumns {
    type Column = TableField;
    type Table = [TableField];
    type Source = BigQueryTable;
    const KIND: &'static str = "BigQuery table";
    const HELD: &'static str = "appended";
    const WRITES: &'static str = "appends";

    /// The table's columns against what the sink writes, as the table had them when they last
    /// fitted (the first call only sets that).
    fn fit(&mut self, table: &[TableField], pending: &[TableField]) -> Option<Fit<TableField>> {
        let Some(base) = &self.baseline else {
            self.baseline = Some(table.to_vec());
            return None;
        };
        // The written columns as the table had them (a column the table lacked is BigQuery's to
        // answer row by row); REQUIRED where the writer never writes NULL.
        let written: Vec<TableField> = self
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
            Fit::Added(added) => {
                let new: Vec<TableField> = added
                    .into_iter()
                    .filter(|a| {
                        !base.iter().any(|b| b.name == a.name)
                            || pending.iter().any(|p| p.name == a.name)
                    })
                    .collect();
                if new.is_empty() {
                    Fit::Same
                } else {
                    Fit::Added(new)
                }
            }
            other => other,
        };
        if !matches!(fit, Fit::Mismatch(_)) {
            self.baseline = Some(table.to_vec());
        }
        Some(fit)
    }

    fn take_up(&mut self, added: &[TableField]) {
        self.writes.extend(added.iter().cloned());
    }

    fn name(column: &TableField) -> &str {
        &column.name
    }
}

impl SchemaWatch<BigQueryColumns> {
    /// A watch of `table`, whose new batches are written with the columns `writes`.
    pub fn new(
        table: TableRef,
        client: BigQueryClient,
        writes: &[TableField],
        refresh: Duration,
    ) -> Arc<BigQuerySchemaWatch> {
        let columns = BigQueryColumns {
            writes: writes.to_vec(),
            baseline: None,
        };
        let name = table.to_string();
        Arc::new(SchemaWatch::watching(
            name,
            columns,
            BigQueryTable { table, client },
            refresh,
        ))
    }

    /// The table's columns are `table`: compared with what the sink writes, as the table had
    /// them when they last fitted (the first call only sets that).
    pub fn observe(&self, table: &[TableField]) {
        self.observe_at(None, table);
    }

    /// The sink's new batches are written with the columns `writes` from now on.
    pub fn set_writes(&self, writes: &[TableField]) {
        self.with_columns(|c| c.writes = writes.to_vec());
    }

    /// Read the table now and compare. A failed read changes nothing (the appends report an
    /// unreachable BigQuery themselves).
    pub async fn read(&self) {
        let source = self.source();
        match source.client.table_schema(&source.table).await {
            Ok(schema) => self.observe(&schema.fields),
            Err(e) => {
                tracing::debug!(table = %source.table, error = %e, "reading the table's schema failed")
            }
        }
    }

    /// Read the table now: does it still fit? (After BigQuery refused a request: a change made
    /// since the last read holds the request rather than failing its rows.)
    pub async fn recheck(&self) -> bool {
        self.read().await;
        self.problem().is_none()
    }

    /// Wait while the table does not fit (SCHEMA_MISMATCH), reading it every refresh interval
    /// ([`SchemaWatch::hold`]). Returns at once when it fits.
    pub async fn wait_fits(&self) {
        let mut first = true;
        self.hold(None, || {
            let read = !std::mem::take(&mut first);
            async move {
                if read {
                    self.read().await;
                }
                match self.problem() {
                    None => Attempt::Done(()),
                    Some(_) => Attempt::Held(None),
                }
            }
        })
        .await;
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
