//! The object sink's registration: every `--bucket-url` no other sink claims, the subscription's
//! format, and the files named from their first records under `--exactly-once`.

use std::sync::Arc;

use crate::config::ValidSubscription;
use crate::ids::{Clock, Ids};
use crate::position::Streams;
use crate::sink::registry::claim::RegisterSink;
use crate::sink::registry::options::WriterOptions;
use crate::sink::{BuildError, Files, OpenFiles, PositionedSource, SinkSetup, SinkSpec};
use crate::upload::Destination;

use super::{build_format, hold_positions, FormatOptions, ObjectSettings, ObjectSink};

/// The object sink in the registry: it claims every bucket URL (asked last).
pub struct ObjectEntry;

impl RegisterSink for ObjectEntry {
    fn bucket(
        sub: &ValidSubscription,
        url: &str,
        opts: &WriterOptions,
    ) -> Option<Result<SinkSpec, String>> {
        Some(settings(sub, url, opts).map(SinkSpec::new))
    }
}

/// The bucket and format of `sub`'s objects.
fn settings(
    sub: &ValidSubscription,
    bucket_url: &str,
    opts: &WriterOptions,
) -> Result<ObjectSettings, String> {
    let dest = Destination::from_url_retrying(bucket_url, opts.upload.retry_for)
        .map_err(|e| e.to_string())?;
    let format = build_format(
        sub,
        &FormatOptions {
            codec: opts.avro_codec,
            block_size: opts.avro_block_size,
            topic_schema: opts.topic_schema.clone(),
            default_encoding: opts.schema_encoding,
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(ObjectSettings {
        dest,
        format: Arc::clone(&format),
        upload: opts.upload,
        exact: None,
    })
}

#[async_trait::async_trait]
impl SinkSetup for ObjectSettings {
    fn describe(&self) -> String {
        self.dest.url.clone()
    }

    fn destination(&self) -> Option<Destination> {
        Some(self.dest.clone())
    }

    fn rerun_does(&self) -> Option<&'static str> {
        Some("writes every message again, in new objects")
    }

    fn hold_positions(
        &mut self,
        streams: &Streams,
        sub: &ValidSubscription,
    ) -> Result<&'static str, String> {
        let source = &streams.name;
        let storage = sub.storage.as_ref().ok_or("no cloudStorageConfig")?;
        hold_positions(self, storage, streams)
            .map_err(|why| format!("--exactly-once with {source}: {why}"))?;
        Ok("the files")
    }

    fn without_positions(&self, positioned: PositionedSource) -> Result<(), String> {
        Err(format!(
            "--exactly-once with a bucket needs a {} source ({}); other sources write objects at least once",
            positioned.name, positioned.flag
        ))
    }

    async fn build(
        self: Box<Self>,
        sub: &ValidSubscription,
        seed: Option<u64>,
        clock: Clock,
    ) -> Result<Box<dyn OpenFiles>, BuildError> {
        let storage = sub
            .storage
            .clone()
            .ok_or_else(|| BuildError::NotStorage(sub.name.clone()))?;
        Ok(Box::new(Files::new(ObjectSink::new(
            storage,
            *self,
            Ids::new(seed),
            clock,
        ))))
    }
}
