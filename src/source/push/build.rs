//! The push endpoint's constructor: with a spool or without, its source and its settle side.

use super::settle::{PushBroker, SpoolSettle};
use super::spool::Spool;
use super::{PushEndpointError, PushSettings, PushSource, SpoolSource};
use crate::connect::{Connected, Context, SourceError};
use crate::settle::checkpoint::{CheckpointSettle, OnBadInput};
use crate::settle::dead_letter::DeadLetterFile;
use crate::settle::Brokered;

/// The push endpoint, listening, and its settle side: with a spool, the spool's checkpoint (the
/// export reads the spool from its watermark); without one, the broker side that answers the
/// requests once their files are durable.
pub async fn start(settings: PushSettings, ctx: &Context<'_>) -> Result<Connected, SourceError> {
    let sub = ctx.subscription;
    let Some(spec) = settings.spool.clone() else {
        let src = PushSource::start(settings, ctx.grace.clone()).await?;
        let settle = Brokered::new(PushBroker::new(src.pending(), sub.name.clone()));
        return Ok(Connected::new(src, settle));
    };
    let dir = &spec.settings.dir;
    let name = format!("spool {}", dir.display());
    std::fs::create_dir_all(dir).map_err(|source| SourceError::Open {
        path: dir.display().to_string(),
        source,
    })?;
    let inner = CheckpointSettle::open(
        Some(dir.join("checkpoint.json")),
        "spool",
        name.clone(),
        sub,
        OnBadInput::Skip,
        Some(&spec.dead_letter),
    )?;
    let (start, line) = inner.start();
    let spool = Spool::open(&spec.settings, start).map_err(PushEndpointError::from)?;
    let handle = spool.handle.clone();
    let src = PushSource::start_with(
        settings,
        ctx.grace.clone(),
        Some((
            spool.writer,
            ctx.shaper.clone(),
            SpoolSource::new(spool.reader, line, name),
            spool.handle,
        )),
    )
    .await?;
    let settle = SpoolSettle::new(
        inner,
        handle,
        src.pending(),
        DeadLetterFile::open(&spec.dead_letter, CheckpointSettle::max_attempts(sub))?,
        sub.name.clone(),
    );
    // What is spooled passed the run's shaper before accept: the pipeline does not shape it again.
    let mut connected = Connected::new(src, settle);
    connected.shaped = true;
    Ok(connected)
}

impl From<PushEndpointError> for SourceError {
    fn from(e: PushEndpointError) -> SourceError {
        SourceError::of(e, false)
    }
}
