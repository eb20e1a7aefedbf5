//! The discard sink's registration: `discard://` as the bucket or the table URL.

use crate::batch::Limits;
use crate::config::ValidSubscription;
use crate::ids::Clock;
use crate::sink::registry::claim::RegisterSink;
use crate::sink::registry::options::WriterOptions;
use crate::sink::registry::table::{TableRows, TableSink};
use crate::sink::{BuildError, Files, OpenFiles, SinkSetup, SinkSpec};

use super::DiscardSink;

/// The bucket or table URL of the discard sink: the pipeline without a store (benchmarks).
pub const DISCARD: &str = "discard://";

/// The discard sink in the registry: it claims [`DISCARD`].
pub struct DiscardEntry;

impl RegisterSink for DiscardEntry {
    fn bucket(
        _sub: &ValidSubscription,
        url: &str,
        _opts: &WriterOptions,
    ) -> Option<Result<SinkSpec, String>> {
        (url == DISCARD).then(|| Ok(SinkSpec::new(DiscardSettings)))
    }

    fn table(url: &str) -> Option<Box<dyn TableSink>> {
        (url == DISCARD).then(|| Box::new(DiscardSettings) as Box<dyn TableSink>)
    }
}

/// The discard sink's settings: none (its limits are the subscription's).
pub struct DiscardSettings;

/// A table that is not written: the rows are checked as a Delta table's would be.
impl TableSink for DiscardSettings {
    fn build(self: Box<Self>, _rows: TableRows, _opts: &WriterOptions) -> Result<SinkSpec, String> {
        Ok(SinkSpec::new(DiscardSettings))
    }
}

#[async_trait::async_trait]
impl SinkSetup for DiscardSettings {
    fn describe(&self) -> String {
        DISCARD.to_string()
    }

    fn rerun_does(&self) -> Option<&'static str> {
        None
    }

    async fn build(
        self: Box<Self>,
        sub: &ValidSubscription,
        _seed: Option<u64>,
        _clock: Clock,
    ) -> Result<Box<dyn OpenFiles>, BuildError> {
        let limits = if let Some(s) = &sub.storage {
            Limits {
                max_duration: s.max_duration,
                max_bytes: s.max_bytes,
                max_messages: s.max_messages,
            }
        } else if let Some(bq) = &sub.bigquery {
            Limits {
                max_duration: bq.max_duration,
                max_bytes: bq.max_bytes,
                max_messages: bq.max_messages,
            }
        } else {
            return Err(BuildError::NoExport(sub.name.clone()));
        };
        Ok(Box::new(Files::new(DiscardSink::new(limits))))
    }
}
