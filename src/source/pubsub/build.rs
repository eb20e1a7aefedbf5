//! The Pub/Sub source's registration ([`Pubsub`]: `--source pubsub` and its flags) and its
//! constructor: the subscription checked, its source and its settle side.

use super::settle::PubsubBroker;
use super::{PubsubArgs, PubsubFlagsError, PubsubSettings, PubsubSource};
use crate::connect::{
    Claim, Connect, Connected, Context, FlagsError, Register, SharedFlags, SourceError, SourceSpec,
};
use crate::pubsub::{PubsubClient, PubsubError};
use crate::settle::Brokered;

/// The Pub/Sub source, pulling, and its settle side (acks, nacks, lease extensions, dead letters).
pub async fn start(
    client: Option<PubsubClient>,
    mut settings: PubsubSettings,
    ctx: &Context<'_>,
) -> Result<Connected, SourceError> {
    let sub = ctx.subscription;
    settings.bounded_by(ctx.resources.memory_limit());
    let client = match client {
        Some(c) => c,
        None => PubsubClient::connect().await?,
    };
    exists(&client, &settings.subscription).await?;
    let gate = ctx.resources.input_gate();
    let src = PubsubSource::start_gated(client.clone(), settings.clone(), Some(gate))?;
    let settle = Brokered::new(PubsubBroker::new(
        client,
        src.acker(),
        settings.subscription,
        &sub.delivery,
        settings.stream_ack_deadline,
    ));
    Ok(Connected::new(src, settle))
}

/// Refuse a Pub/Sub subscription the server says is not there, before the stream starts (which
/// would otherwise fail over and over). Only NOT_FOUND counts: a plain subscriber may lack the
/// permission to read the subscription, and an unreachable server is the stream's to retry.
async fn exists(client: &PubsubClient, name: &str) -> Result<(), SourceError> {
    let asked = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.get_subscription(name),
    )
    .await;
    match asked {
        Ok(Err(PubsubError::Status {
            code: tonic::Code::NotFound,
            ..
        })) => Err(SourceError::NoSubscription {
            name: name.to_string(),
            target: client.target().to_string(),
        }),
        _ => Ok(()),
    }
}

/// The Pub/Sub source as the registry knows it: `--source pubsub`, the subscription itself.
pub struct Pubsub;

/// A Pub/Sub subscription (Google Cloud or the emulator), pulled with StreamingPull; `client`
/// `None`: [`PubsubClient::connect`] (the emulator at PUBSUB_EMULATOR_HOST, else Google).
pub struct PubsubSpec {
    pub client: Option<PubsubClient>,
    pub settings: PubsubSettings,
}

impl Register for Pubsub {
    type Args = PubsubArgs;
    const FORMS: &'static str = "pubsub";
    const HELP: &'static str = "`pubsub` pulls the subscription itself (Google Cloud with Application Default Credentials, or the emulator when PUBSUB_EMULATOR_HOST is set)";
    const KEEPER: Option<&'static str> = Some("Pub/Sub");

    fn claims(value: &str) -> Claim {
        Claim::word(value, "pubsub")
    }

    fn spec(
        _: &str,
        args: &PubsubArgs,
        shared: &SharedFlags<'_>,
    ) -> Result<SourceSpec, FlagsError> {
        if shared.dead_letter.is_some() {
            return Err(FlagsError::of(PubsubFlagsError::DeadLetterFile));
        }
        let sub = shared.subscription;
        let settings = args.settings(&sub.name, sub.delivery.enable_message_ordering);
        let settings = settings.map_err(FlagsError::of)?;
        Ok(SourceSpec::new(PubsubSpec {
            client: None,
            settings,
        }))
    }
}

#[async_trait::async_trait]
impl Connect for PubsubSpec {
    async fn connect(self: Box<Self>, ctx: &Context<'_>) -> Result<Connected, SourceError> {
        start(self.client, self.settings, ctx).await
    }

    fn is_broker(&self) -> bool {
        true
    }
}
