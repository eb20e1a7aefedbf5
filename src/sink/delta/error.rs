//! Why a Delta table operation failed: [`DeltaError`].

use arrow_schema::ArrowError;
use deltalake_core::DeltaTableError;

/// Errors of the Delta committer.
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    /// A column whose type cannot be a Delta column.
    #[error("Delta table: column `{column}`: {reason}")]
    Schema { column: String, reason: String },
    /// The table exists with another schema.
    #[error("Delta table at {url}: its schema differs from what subsink would write: {diff}")]
    SchemaMismatch { url: String, diff: String },
    /// While running: another writer changed the table's metadata (its schema) after the
    /// snapshot a commit built on; the handle has reloaded the log, nothing was committed.
    #[error("Delta table at {url}: its metadata (schema) changed under the commit; reloaded")]
    MetadataChanged { url: String },
    /// The table's partition columns do not fit the configuration or the rows.
    #[error("Delta table at {url}: partitions: {reason}")]
    Partitioning { url: String, reason: String },
    #[error("Delta table at {url}: {source}")]
    Delta {
        url: String,
        #[source]
        source: DeltaTableError,
    },
    #[error("Delta table at {url}: data file {path:?} not uploaded: {source}")]
    Upload {
        url: String,
        path: String,
        #[source]
        source: object_store::Error,
    },
    /// The store cannot do atomic put-if-absent, on which concurrent commits depend.
    #[error("Delta table at {url}: the store cannot be used for tables: {reason}; Delta commits need an atomic put-if-absent so that two writers never both take one log version (for S3-compatible servers: one that honours `If-None-Match: *`, with AWS_CONDITIONAL_PUT unset or `etag`)")]
    NoPutIfAbsent { url: String, reason: String },
    #[error("Delta table: batch does not fit the table schema: {0}")]
    Arrow(#[from] ArrowError),
    /// Change data capture: planning or running the MERGE's reads.
    #[error("Delta table: MERGE of changes: {0}")]
    Merge(#[from] deltalake_core::datafusion::error::DataFusionError),
    /// `--exactly-once` with a positioned source: the table already holds a stream partition's
    /// records from this commit's first offset on (another worker wrote them: a rebalance), so
    /// this commit would write them twice.
    #[error("Delta table at {url}: txn {app_id:?} is at version {table}, and this commit starts at offset {first}: its records are in the table already (written by another worker of the group); not committed")]
    TxnAhead {
        url: String,
        app_id: String,
        table: i64,
        first: i64,
    },
}

impl From<Box<DeltaError>> for crate::sink::registry::build_error::BuildError {
    /// A table that cannot be opened; the configuration's fault when the existing table does
    /// not take what it writes (its columns, its partitioning) or a column has no Delta type.
    fn from(e: Box<DeltaError>) -> crate::sink::registry::build_error::BuildError {
        let config = matches!(
            *e,
            DeltaError::SchemaMismatch { .. }
                | DeltaError::Partitioning { .. }
                | DeltaError::Schema { .. }
        );
        crate::sink::registry::build_error::DestinationError { error: e, config }.into()
    }
}

impl From<Box<DeltaError>> for crate::sink::SinkError {
    /// The table cannot be opened or read (startup, resume): trying again does not help.
    fn from(e: Box<DeltaError>) -> crate::sink::SinkError {
        crate::sink::SinkError::Table(e)
    }
}
