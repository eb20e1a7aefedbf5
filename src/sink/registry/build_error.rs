//! Errors building a sink at startup ([`crate::sink::SinkSetup::build`]).

use crate::sink::bigquery;

/// Errors building a sink at startup.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("subscription {0} has no cloudStorageConfig: the storage writer needs one")]
    NotStorage(String),
    #[error("subscription {0} has no bigqueryConfig: the table writer needs one")]
    NotBigQuery(String),
    #[error("subscription {0} has neither a cloudStorageConfig nor a bigqueryConfig")]
    NoExport(String),
    #[error(transparent)]
    Table(#[from] Box<crate::sink::delta::error::DeltaError>),
    #[error(transparent)]
    BigQuery(#[from] Box<bigquery::BigQueryError>),
    #[error("--publish-to: {0}")]
    Publish(String),
}

impl BuildError {
    /// An existing table that does not take what the configuration writes (its partitioning,
    /// its columns), or a column no Delta type holds: found before anything is read, and mended
    /// by changing the configuration or the table, as a bad flag is (exit 2).
    pub fn is_config(&self) -> bool {
        use crate::sink::delta::error::DeltaError;
        matches!(
            self,
            BuildError::Table(e) if matches!(
                **e,
                DeltaError::SchemaMismatch { .. }
                    | DeltaError::Partitioning { .. }
                    | DeltaError::Schema { .. }
            )
        )
    }
}
