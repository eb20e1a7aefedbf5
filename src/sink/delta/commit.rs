//! A closed batch's commit: appended files (after the schema fits: [`commit_fitting`]) or one
//! MERGE of changes (held alike while it does not: the watch's one hold-until-fits loop), in
//! order with the previous commits of its partitions under `--exactly-once`.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use deltalake_core::kernel::engine::arrow_conversion::TryFromArrow;
use deltalake_core::kernel::{StructField, StructType};
use tokio::sync::Mutex;

use super::data_file::DataFile;
use super::encoder::ParquetEncodeError;
use super::error::DeltaError;
use super::evolve;
use super::out::{ChangeSpec, PartError};
use super::schema::DeltaSchemaWatch;
use super::table::DeltaTable;
use super::txn::AppTxn;
use crate::receipt::Written;
use crate::sink::order::Chained;
use crate::sink::schema_watch::Attempt;
use crate::table::evolve::Fit;

/// `--exactly-once`: a commit's `txn` actions and its place in its partitions' order.
pub(super) struct ExactCommit {
    pub(super) txns: Vec<AppTxn>,
    pub(super) order: Chained,
    /// The positioned source's name, for errors.
    pub(super) source: Arc<str>,
}

/// The columns a batch was written with, and the sink's schema watch: its commit lands only
/// while the table's schema fits them (else it waits: SCHEMA_MISMATCH).
pub(super) struct Fits {
    pub(super) writes: SchemaRef,
    pub(super) watch: Arc<DeltaSchemaWatch>,
}

/// Why a data file was not committed.
#[derive(Debug, thiserror::Error)]
pub(super) enum CommitError {
    #[error("cannot start the Parquet encoder thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the Parquet encoder panicked: {0}")]
    Panicked(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Encode(#[from] ParquetEncodeError),
    #[error(transparent)]
    Delta(#[from] DeltaError),
    #[error("the rows could not be split into the table's partitions: {0}")]
    Partition(String),
    /// `--exactly-once`: an earlier commit of one of its partitions failed.
    #[error("an earlier commit of one of its {0} partitions failed; under --exactly-once a partition's commits land in offset order")]
    Earlier(Arc<str>),
    /// `--exactly-once`: given up before its commit.
    #[error("given up before it was committed")]
    Cancelled,
}

impl From<PartError> for CommitError {
    fn from(e: PartError) -> Self {
        match e {
            PartError::Thread(e) => CommitError::Thread(e),
            PartError::Encode(e) => CommitError::Encode(e),
            PartError::Panicked(e) => CommitError::Panicked(e),
        }
    }
}

/// Commit `files` as one log version, after the previous commits of the batch's partitions
/// under `--exactly-once`. Returns the files' size and their paths in the table.
pub(super) async fn append(
    name: String,
    files: Vec<DataFile>,
    table: Arc<Mutex<DeltaTable>>,
    exact: Option<ExactCommit>,
    fits: Option<Fits>,
    cancelled: Option<&std::sync::atomic::AtomicBool>,
) -> Result<Written, CommitError> {
    let size = files.iter().map(|f| f.file.size()).sum::<u64>();
    let paths: Vec<String> = files.iter().map(|f| f.path.clone()).collect();
    if let Some(e) = &exact {
        if !e.order.wait_before().await {
            // Dropping `e.order` unsent fails the commits after this one.
            return Err(CommitError::Earlier(e.source.clone()));
        }
    }
    if cancelled.is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst)) {
        return Err(CommitError::Cancelled);
    }
    let txns = exact.as_ref().map_or(&[][..], |e| &e.txns[..]);
    let committed = match &fits {
        None => {
            let mut table = table.lock().await;
            table
                .commit_with(files, txns)
                .await
                .map_err(CommitError::from)
        }
        Some(fits) => commit_fitting(&table, files, txns, fits, cancelled).await,
    };
    if let Some(e) = exact {
        e.order.done(committed.is_ok());
    }
    let version = committed?;
    tracing::debug!(file = %name, version, "committed");
    Ok(Written::committed(size, paths))
}

/// Commit `files` once the table's schema fits the columns they were written with. While it
/// does not (SCHEMA_MISMATCH: a column removed or retyped, a new REQUIRED column) the commit
/// waits — nothing committed, its messages not settled — and checks again every refresh
/// interval; it lands when the table fits again. A commit that finds another writer changed the
/// schema under it checks the new schema and tries again.
async fn commit_fitting(
    table: &Mutex<DeltaTable>,
    files: Vec<DataFile>,
    txns: &[AppTxn],
    fits: &Fits,
    cancelled: Option<&std::sync::atomic::AtomicBool>,
) -> Result<i64, CommitError> {
    let files = &files;
    let attempt = move || async move {
        let attempt: Result<Attempt<i64>, CommitError> = async {
            loop {
                let mut t = table.lock().await;
                let mut fit = fit_of(&t, &fits.writes)?;
                if let Fit::Mismatch(_) = fit {
                    // The handle's snapshot may be older than the table (a fix already made).
                    t.reload().await?;
                    fit = fit_of(&t, &fits.writes)?;
                }
                if let Fit::Mismatch(why) = fit {
                    return Ok(Attempt::Held(Some((Some(t.version()), why))));
                }
                let committed = t.commit_with(files.clone(), txns).await;
                // The snapshot it landed on, or reloaded: the schema a commit sees anyway.
                if let Ok(columns) = t.columns() {
                    fits.watch.observe(t.version(), &columns);
                }
                match committed {
                    Err(DeltaError::MetadataChanged { .. }) => continue,
                    other => return Ok(Attempt::Done(other?)),
                }
            }
        }
        .await;
        Attempt::or_failed(attempt)
    };
    match fits.watch.hold(cancelled, attempt).await {
        Some(committed) => committed,
        None => Err(CommitError::Cancelled),
    }
}

/// Change data capture: [`Batch::commit`] as one MERGE of `chunks` ([`crate::sink::delta::merge`]).
/// Returns the bytes of the rows merged and the data files the MERGE's commit added (not the
/// batch's name: the MERGE writes files of its own).
/// Like an append, the MERGE waits while the table's schema does not fit the batch's columns
/// (SCHEMA_MISMATCH).
pub(super) async fn merge(
    name: String,
    spec: Arc<ChangeSpec>,
    chunks: Vec<RecordBatch>,
    table: Arc<Mutex<DeltaTable>>,
    exact: Option<ExactCommit>,
    fits: Option<Fits>,
    cancelled: Option<&std::sync::atomic::AtomicBool>,
) -> Result<Written, CommitError> {
    if let Some(e) = &exact {
        if !e.order.wait_before().await {
            return Err(CommitError::Earlier(e.source.clone()));
        }
    }
    if cancelled.is_some_and(|c| c.load(std::sync::atomic::Ordering::SeqCst)) {
        return Err(CommitError::Cancelled);
    }
    let txns = exact.as_ref().map_or(&[][..], |e| &e.txns[..]);
    let bytes = chunks
        .iter()
        .map(|c| c.get_array_memory_size() as u64)
        .sum::<u64>();
    let merged = match &fits {
        None => {
            let mut t = table.lock().await;
            t.merge_changes(&spec.rows, &chunks, &spec.key, txns, &spec.props)
                .await
                .map_err(CommitError::from)
        }
        Some(fits) => {
            let (table, spec, chunks) = (&*table, &*spec, &chunks[..]);
            let attempt = move || async move {
                let mut t = table.lock().await;
                // The handle's snapshot; the newest version when that or the watch says it does
                // not fit (a fix may be there already). A change made since, which the MERGE
                // finds, is checked when it fails (below): no log read per MERGE while the table
                // fits.
                let mut fit = fit_of(&t, &fits.writes);
                if matches!(fit, Ok(Fit::Mismatch(_))) || fits.watch.problem().is_some() {
                    fit = match t.reload().await {
                        Ok(()) => fit_of(&t, &fits.writes),
                        Err(e) => Err(e),
                    };
                }
                let why = match fit {
                    Err(e) => return Attempt::Done(Err(CommitError::from(e))),
                    Ok(Fit::Mismatch(why)) => why,
                    Ok(Fit::Same | Fit::Added(_)) => {
                        let merged = t
                            .merge_changes(&spec.rows, chunks, &spec.key, txns, &spec.props)
                            .await;
                        // Changed under the MERGE? Then it waits like the rest; else it failed.
                        let changed = match &merged {
                            Ok(_) => None,
                            Err(_) => match (t.reload().await, fit_of(&t, &fits.writes)) {
                                (Ok(()), Ok(Fit::Mismatch(why))) => Some(why),
                                _ => None,
                            },
                        };
                        match changed {
                            Some(why) => why,
                            None => {
                                if let Ok(columns) = t.columns() {
                                    fits.watch.observe(t.version(), &columns);
                                }
                                return Attempt::Done(merged.map_err(CommitError::from));
                            }
                        }
                    }
                };
                Attempt::Held(Some((Some(t.version()), why)))
            };
            match fits.watch.hold(cancelled, attempt).await {
                Some(merged) => merged,
                None => Err(CommitError::Cancelled),
            }
        }
    };
    if let Some(e) = exact {
        e.order.done(merged.is_ok());
    }
    let (version, counts) = merged?;
    tracing::debug!(batch = %name, version, ?counts, "changes merged");
    Ok(Written::committed(bytes, counts.files))
}

/// How the table's columns, in the snapshot `t` holds, relate to `writes` (the Arrow schema of
/// a batch's files, [`crate::sink::delta::delta_arrow_schema`]).
fn fit_of(t: &DeltaTable, writes: &arrow_schema::Schema) -> Result<Fit<StructField>, DeltaError> {
    let writes = StructType::try_from_arrow(writes).map_err(|e| DeltaError::Schema {
        column: "$".into(),
        reason: e.to_string(),
    })?;
    Ok(evolve::fit(&writes, &*t.columns()?))
}
