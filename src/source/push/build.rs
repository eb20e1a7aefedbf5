//! The push endpoint's registration ([`Push`]: `--source push` and its flags) and its
//! constructor: with a spool or without, its source and its settle side.

use super::settle::{PushBroker, SpoolSettle};
use super::spool::Spool;
use super::{PushArgs, PushEndpointError, PushSettings, PushSource, SpoolSource};
use crate::connect::{
    Claim, Connect, Connected, Context, FlagsError, Register, SharedFlags, SourceError, SourceSpec,
};
use crate::settle::dead_letter::DeadLetterFile;
use crate::settle::watermark::{CheckpointSettle, OnBadInput};
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

/// The push endpoint as the registry knows it: `--source push`.
pub struct Push;

impl Register for Push {
    type Args = PushArgs;
    const FORMS: &'static str = "push";
    const HELP: &'static str = "`push` receives a push subscription's requests on --listen";
    const KEEPER: Option<&'static str> = Some("Pub/Sub");
    // With a spool, what fails after its 2xx is dead-lettered to a local file.
    const DEAD_LETTER_ANY_WRITER: bool = true;

    fn claims(value: &str) -> Claim {
        Claim::word(value, "push")
    }

    fn spec(_: &str, args: &PushArgs, shared: &SharedFlags<'_>) -> Result<SourceSpec, FlagsError> {
        let settings = args.settings(shared.subscription, shared.dead_letter.as_ref());
        Ok(SourceSpec::new(settings.map_err(FlagsError::of)?))
    }
}

#[async_trait::async_trait]
impl Connect for PushSettings {
    async fn connect(self: Box<Self>, ctx: &Context<'_>) -> Result<Connected, SourceError> {
        start(*self, ctx).await
    }

    fn is_broker(&self) -> bool {
        true
    }
}
