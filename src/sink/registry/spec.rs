//! [`SinkSpec`]: the sink a run writes to, built once per run from the destination flags (or a
//! serve target) by the sink that claims them; [`SinkSetup`]: what each sink's settings answer.
//! The pipeline and the commands ask it, never which sink it is.

use crate::config::ValidSubscription;
use crate::ids::Clock;
use crate::position::Streams;
use crate::sink::{OpenFiles, PositionedSource};
use crate::upload::Destination;

use super::build_error::BuildError;

/// What a sink's settings answer before the run, and how they build the sink: implemented in the
/// sink's `register.rs`.
#[async_trait::async_trait]
pub trait SinkSetup: Send {
    /// Where this sink writes, for the start-up log line and the run summary: the bucket or table
    /// URL, the BigQuery table, the topic (never an option's value).
    fn describe(&self) -> String;

    /// The store files go to (`None`: not an object store, or nothing is written), for the
    /// pipeline's readiness probe.
    fn destination(&self) -> Option<Destination> {
        None
    }

    /// Does the sink keep each ordering key's order across files (one file durable at a time),
    /// whatever the subscription says? (Publishing onto a topic.)
    fn keeps_key_order(&self) -> bool {
        false
    }

    /// What a rerun over the same input does here, for the warning of a file read without
    /// `--checkpoint` (`None`: nothing worth a word).
    fn rerun_does(&self) -> Option<&'static str>;

    /// The Delta table `run --compact-after` compacts beside the writer (`None`: no such table).
    fn compacts(&self) -> Option<Destination> {
        None
    }

    /// `--exactly-once` with a source whose messages carry stream positions (`streams`): check
    /// that this sink can hold it and set it up (exit 2 with the reason otherwise). Returns what
    /// the sink commits, for the source's own check. By default refused.
    fn hold_positions(
        &mut self,
        streams: &Streams,
        _sub: &ValidSubscription,
    ) -> Result<&'static str, String> {
        Err(format!(
            "--exactly-once with {} needs a bucket (--bucket-url), a Delta table (--table-url to an object store) or a BigQuery table (--table-url bigquery://…)",
            streams.name
        ))
    }

    /// `--exactly-once` with a source whose messages carry no stream positions (`positioned`
    /// names those that do): by default nothing to check here (BigQuery's own write mode is
    /// checked when the sink is made).
    fn without_positions(&self, _positioned: PositionedSource) -> Result<(), String> {
        Ok(())
    }

    /// The sink's open files for `sub`, ready for the pipeline.
    async fn build(
        self: Box<Self>,
        sub: &ValidSubscription,
        seed: Option<u64>,
        clock: Clock,
    ) -> Result<Box<dyn OpenFiles>, BuildError>;
}

/// Where rows or objects go: one sink's settings, built once per run ([`crate::sink::registry`]).
pub struct SinkSpec(Box<dyn SinkSetup>);

impl SinkSpec {
    /// The spec of a sink with these settings.
    pub fn new(setup: impl SinkSetup + 'static) -> SinkSpec {
        SinkSpec(Box::new(setup))
    }

    /// See [`SinkSetup::describe`].
    pub fn describe(&self) -> String {
        self.0.describe()
    }

    /// See [`SinkSetup::destination`].
    pub fn destination(&self) -> Option<Destination> {
        self.0.destination()
    }

    /// See [`SinkSetup::keeps_key_order`].
    pub fn keeps_key_order(&self) -> bool {
        self.0.keeps_key_order()
    }

    /// See [`SinkSetup::rerun_does`].
    pub fn rerun_does(&self) -> Option<&'static str> {
        self.0.rerun_does()
    }

    /// See [`SinkSetup::compacts`].
    pub fn compacts(&self) -> Option<Destination> {
        self.0.compacts()
    }

    /// `--exactly-once`, whatever the source: with the streams of a positioned source
    /// ([`SinkSetup::hold_positions`], `Some`: what the source must check), or without
    /// ([`SinkSetup::without_positions`], naming the sources that have them).
    pub fn exactly_once(
        &mut self,
        (streams, positioned): (Option<&Streams>, PositionedSource),
        sub: &ValidSubscription,
    ) -> Result<Option<&'static str>, String> {
        match streams {
            Some(streams) => self.0.hold_positions(streams, sub).map(Some),
            None => self.0.without_positions(positioned).map(|()| None),
        }
    }

    /// Build the sink's open files for `sub`.
    pub async fn build(
        self,
        sub: &ValidSubscription,
        seed: Option<u64>,
        clock: Clock,
    ) -> Result<Box<dyn OpenFiles>, BuildError> {
        self.0.build(sub, seed, clock).await
    }
}
