//! The file source's registration ([`File`]: a path or `-`, and its flags) and its constructor:
//! its source and its settle side.

use std::path::PathBuf;

use super::flags::{FileArgs, FileSpec};
use super::FileSource;
use crate::connect::{
    Claim, Connect, Connected, Context, FlagsError, Register, SharedFlags, SourceError, SourceSpec,
};
use crate::settle::watermark::CheckpointSettle;

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

/// The file source as the registry knows it: a path, or `-` for stdin.
pub struct File;

impl Register for File {
    type Args = FileArgs;
    const FORMS: &'static str = "a path or -";
    const HELP: &'static str =
        "A path (or the `file://` URL of a file): NDJSON of Pub/Sub messages (REST `PubsubMessage` or pull form); `-` reads stdin";

    fn claims(value: &str) -> Claim {
        if file_url(value).is_some() {
            return Claim::Yes;
        }
        match value.contains("://") {
            true => Claim::No,
            false => Claim::Fallback,
        }
    }

    fn describe(value: &str) -> String {
        match value {
            "-" => "stdin".into(),
            path => path_of(path).display().to_string(),
        }
    }

    fn spec(
        value: &str,
        args: &FileArgs,
        shared: &SharedFlags<'_>,
    ) -> Result<SourceSpec, FlagsError> {
        let path = (value != "-").then(|| path_of(value));
        let spec = args.spec(path, shared.default_publish_time_micros);
        Ok(SourceSpec::new(spec.map_err(FlagsError::of)?))
    }
}

/// The file a `file://` URL names, when it is one (not a folder: a folder is an archive): the
/// file source reads it as it reads its path.
fn file_url(value: &str) -> Option<PathBuf> {
    if !value.starts_with("file://") {
        return None;
    }
    let path = url::Url::parse(value).ok()?.to_file_path().ok()?;
    path.is_file().then_some(path)
}

/// The path `--source` names: a path as given, or the file of a `file://` URL.
fn path_of(value: &str) -> PathBuf {
    file_url(value).unwrap_or_else(|| PathBuf::from(value))
}

#[async_trait::async_trait]
impl Connect for FileSpec {
    async fn connect(self: Box<Self>, ctx: &Context<'_>) -> Result<Connected, SourceError> {
        start(*self, ctx)
    }

    fn is_broker(&self) -> bool {
        false
    }

    fn reread_by_rerun(&self) -> Option<String> {
        match (&self.settings.path, &self.checkpoint) {
            (Some(path), None) => Some(path.display().to_string()),
            _ => None,
        }
    }
}
