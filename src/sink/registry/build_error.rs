//! Errors building a sink at startup ([`crate::sink::SinkSetup::build`]).

/// Errors building a sink at startup.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("subscription {0} has no cloudStorageConfig: the storage writer needs one")]
    NotStorage(String),
    #[error("subscription {0} has no bigqueryConfig: the table writer needs one")]
    NotBigQuery(String),
    #[error("subscription {0} has neither a cloudStorageConfig nor a bigqueryConfig")]
    NoExport(String),
    /// The destination could not be opened or read, as the sink says it.
    #[error(transparent)]
    Destination(#[from] DestinationError),
    #[error("--publish-to: {0}")]
    Publish(String),
}

/// A sink's own error opening its destination (a Delta table's log, a BigQuery table), and
/// whether it is the configuration's fault: an existing table that does not take what the
/// configuration writes (its partitioning, its columns), found before anything is read and
/// mended by changing the configuration or the table, as a bad flag is (exit 2). Shown as the
/// sink's error itself.
#[derive(Debug)]
pub struct DestinationError {
    pub error: Box<dyn std::error::Error + Send + Sync>,
    pub config: bool,
}

impl std::fmt::Display for DestinationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for DestinationError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl BuildError {
    /// Is the configuration at fault ([`DestinationError::config`]): exit 2.
    pub fn is_config(&self) -> bool {
        matches!(self, BuildError::Destination(d) if d.config)
    }
}
