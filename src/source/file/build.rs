//! The file source's constructor: its source and its settle side.

use super::{FileSource, FileSpec};
use crate::connect::{Connected, Context, SourceError};
use crate::settle::checkpoint::CheckpointSettle;

/// The file source and its settle side: the checkpoint (loaded, so reading resumes where it left
/// off) and the dead-letter file.
pub fn start(spec: FileSpec, ctx: &Context<'_>) -> Result<Connected, SourceError> {
    let sub = ctx.subscription;
    let FileSpec {
        mut settings,
        checkpoint,
        dead_letter,
    } = spec;
    settings.memory = Some(ctx.resources.input_gate());
    let name = settings
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "-".into());
    if checkpoint.is_some() && settings.path.is_none() {
        return Err(SourceError::CheckpointOnStdin);
    }
    let settle = CheckpointSettle::open(
        checkpoint,
        &name,
        name.clone(),
        sub,
        settings.on_bad_input,
        dead_letter.as_deref(),
    )?;
    (settings.start_offset, settings.start_line) = settle.start();
    let src =
        FileSource::open(settings).map_err(|source| SourceError::Open { path: name, source })?;
    Ok(Connected::new(src, settle))
}
