//! The Delta sink's registration: every `--table-url` no other sink claims is a Delta table on an
//! object store or a local folder; `--exactly-once` with a positioned source commits its positions
//! with the rows.

use crate::config::ValidSubscription;
use crate::ids::Clock;
use crate::position::Streams;
use crate::sink::registry::claim::RegisterSink;
use crate::sink::registry::options::WriterOptions;
use crate::sink::registry::table::{TableRows, TableSink};
use crate::sink::{BuildError, Files, OpenFiles, SinkSetup, SinkSpec};
use crate::upload::Destination;

use super::{DeltaSettings, DeltaSink};

/// The Delta sink in the registry: it claims every table URL (asked last).
pub struct DeltaEntry;

impl RegisterSink for DeltaEntry {
    fn table(_url: &str) -> Option<Box<dyn TableSink>> {
        Some(Box::new(DeltaTableSink))
    }
}

/// A Delta table's steps of the table sinks' startup: the defaults, then its store and Parquet
/// settings.
struct DeltaTableSink;

impl TableSink for DeltaTableSink {
    fn build(self: Box<Self>, t: TableRows, opts: &WriterOptions) -> Result<SinkSpec, String> {
        let dest = Destination::from_url(&t.url).map_err(|e| e.to_string())?;
        let parquet = crate::table::parquet::writer_properties_with(&opts.parquet_compression)
            .map_err(|e| format!("--parquet-compression {e}"))?;
        Ok(SinkSpec::new(DeltaSettings {
            dest,
            rows: t.rows,
            parquet,
            streams: None,
            key: t.key,
            partition_by: t.partition_by,
            schema_refresh: opts.schema_refresh,
            delete_retention: opts.delete_retention,
        }))
    }
}

#[async_trait::async_trait]
impl SinkSetup for DeltaSettings {
    fn describe(&self) -> String {
        self.dest.url.clone()
    }

    fn destination(&self) -> Option<Destination> {
        Some(self.dest.clone())
    }

    fn rerun_does(&self) -> Option<&'static str> {
        Some(match self.key {
            // Change data capture: the changes are applied again (no effect with sequence
            // numbers).
            Some(_) => "applies every change to the table again",
            None => "appends every row to the table again",
        })
    }

    fn compacts(&self) -> Option<Destination> {
        Some(self.dest.clone())
    }

    fn hold_positions(
        &mut self,
        streams: &Streams,
        _sub: &ValidSubscription,
    ) -> Result<&'static str, String> {
        self.streams = Some(streams.clone());
        Ok("the table's commits")
    }

    async fn build(
        self: Box<Self>,
        sub: &ValidSubscription,
        _seed: Option<u64>,
        _clock: Clock,
    ) -> Result<Box<dyn OpenFiles>, BuildError> {
        let bq = sub
            .bigquery
            .as_ref()
            .ok_or_else(|| BuildError::NotBigQuery(sub.name.clone()))?;
        Ok(Box::new(Files::new(DeltaSink::open(bq, *self).await?)))
    }
}
