//! The publish sink's registration: `--publish-to` (its flags, [`super::PublishArgs`], claim it
//! before any writer flag), and how it is built.

use crate::config::ValidSubscription;
use crate::ids::Clock;
use crate::sink::{BuildError, Files, OpenFiles, SinkSetup, SinkSpec};

use super::{PublishArgs, PublishTo};

impl PublishArgs {
    /// The publish sink the flags name, `None` without `--publish-to` ([`PublishArgs::sink`]).
    pub fn sink_spec(&self, writers: &[(&str, bool)]) -> Result<Option<SinkSpec>, String> {
        Ok(self.sink(writers)?.map(SinkSpec::new))
    }
}

#[async_trait::async_trait]
impl SinkSetup for PublishTo {
    fn describe(&self) -> String {
        PublishTo::describe(self)
    }

    /// Publishing onto a topic keeps each ordering key's order across batches: one at a time.
    fn keeps_key_order(&self) -> bool {
        true
    }

    fn rerun_does(&self) -> Option<&'static str> {
        Some("publishes every message again")
    }

    async fn build(
        self: Box<Self>,
        _sub: &ValidSubscription,
        _seed: Option<u64>,
        _clock: Clock,
    ) -> Result<Box<dyn OpenFiles>, BuildError> {
        Ok(Box::new(Files::new(
            (*self).connect().await.map_err(BuildError::Publish)?,
        )))
    }
}
