//! The archive source's constructor: its source and its settle side.

use super::settle::ArchiveSettle;
use super::{ArchiveError, ArchiveSource, ArchiveSpec, ArchiveStats};
use crate::connect::{Connected, Context, SourceError};
use crate::settle::checkpoint::CheckpointSettle;

/// The archive source and its settle side: the file source's checkpoint over (object, record)
/// positions (loaded, so reading resumes where it left off) and the dead-letter file.
pub async fn start(spec: ArchiveSpec, ctx: &Context<'_>) -> Result<Connected, SourceError> {
    let sub = ctx.subscription;
    let ArchiveSpec {
        mut settings,
        checkpoint,
        dead_letter,
    } = spec;
    let name = settings.url.clone();
    let settle = CheckpointSettle::open(
        checkpoint,
        &name,
        name.clone(),
        sub,
        settings.on_bad_input,
        dead_letter.as_deref(),
    )?;
    settings.start = settle.start().0;
    let stats = std::sync::Arc::new(ArchiveStats::default());
    let src = ArchiveSource::open(settings, stats.clone()).await?;
    Ok(Connected::new(src, ArchiveSettle::new(settle, stats)))
}

impl From<ArchiveError> for SourceError {
    fn from(e: ArchiveError) -> SourceError {
        SourceError::of(e, false)
    }
}
