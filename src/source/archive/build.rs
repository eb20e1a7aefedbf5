//! The archive source's registration ([`Archive`]: an archive URL and its flags) and its
//! constructor: its source and its settle side.

use super::settle::ArchiveSettle;
use super::{
    ArchiveArgs, ArchiveError, ArchiveFlagsError, ArchiveSource, ArchiveSpec, ArchiveStats,
};
use crate::avro::SchemaEncoding;
use crate::connect::{
    Claim, Connect, Connected, Context, FlagsError, Register, SharedFlags, SourceError, SourceSpec,
};
use crate::settle::watermark::CheckpointSettle;

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

/// Object-store schemes an archive is read from.
const ARCHIVES: [&str; 5] = ["s3", "s3a", "gs", "az", "file"];

/// The archive source as the registry knows it: `s3://`, `gs://`, `az://`, `file://`.
pub struct Archive;

impl Register for Archive {
    type Args = ArchiveArgs;
    const FORMS: &'static str = "an archive URL s3:// gs:// az:// file://";
    const HELP: &'static str = "`s3://BUCKET[/PREFIX]`, `gs://…`, `az://…`, `file:///DIR` replays an archive: the objects an export wrote (--archive-subscription, --from, --to)";

    fn claims(value: &str) -> Claim {
        Claim::scheme(value, &ARCHIVES)
    }

    fn misplaced(args: &ArchiveArgs) -> Option<FlagsError> {
        args.any()
            .then(|| FlagsError::of(ArchiveFlagsError::WithoutArchive))
    }

    fn spec(
        url: &str,
        args: &ArchiveArgs,
        shared: &SharedFlags<'_>,
    ) -> Result<SourceSpec, FlagsError> {
        let (checkpoint, dead_letter) = (shared.checkpoint.clone(), shared.dead_letter.clone());
        let spec = args.spec(url, shared.on_bad_input, checkpoint, dead_letter);
        Ok(SourceSpec::new(spec.map_err(FlagsError::of)?))
    }
}

#[async_trait::async_trait]
impl Connect for ArchiveSpec {
    async fn connect(self: Box<Self>, ctx: &Context<'_>) -> Result<Connected, SourceError> {
        start(*self, ctx).await
    }

    fn is_broker(&self) -> bool {
        false
    }

    fn set_schema_encoding(&mut self, encoding: SchemaEncoding) {
        self.settings.schema_encoding = encoding;
    }
}
