//! The NATS source's registration ([`Nats`]: `--source nats://…` and its flags) and its
//! constructor: the consumer connected, its source and its settle side.

use super::flags::NatsArgs;
use super::settle::NatsBroker;
use super::{NatsConnection, NatsError, NatsFlagsError, NatsSettings, NatsSource};
use crate::connect::{
    Claim, Connect, Connected, Context, FlagsError, Register, SharedFlags, SourceError, SourceSpec,
};
use crate::settle::Brokered;

/// The NATS source, connected ([`crate::source::nats::connect`]), and its settle side (acks, naks, dead letters).
pub async fn start(settings: NatsSettings, ctx: &Context<'_>) -> Result<Connected, SourceError> {
    let sub = ctx.subscription;
    let NatsConnection {
        client,
        jetstream,
        consumer,
        settings,
        ack_wait,
        dead_letter,
    } = super::connect(settings, &sub.delivery).await?;
    // Not the URL: it may carry a password.
    let name = format!("nats:{}/{}", settings.stream, settings.consumer);
    let gate = ctx.resources.input_gate();
    let source = NatsSource::start_gated(consumer, client.clone(), name, gate);
    let settle = Brokered::new(NatsBroker::new(
        client,
        jetstream,
        sub.name.clone(),
        &sub.delivery,
        dead_letter,
        ack_wait,
    ));
    Ok(Connected::new(source, settle))
}

impl From<NatsError> for SourceError {
    fn from(e: NatsError) -> SourceError {
        let config = e.is_config();
        SourceError::of(e, config)
    }
}

/// The NATS source as the registry knows it: `--source nats://HOST:PORT` (or `tls://`).
pub struct Nats;

impl Register for Nats {
    type Args = NatsArgs;
    const FORMS: &'static str = "nats://HOST:PORT";
    const HELP: &'static str = "`nats://HOST:PORT` (or `tls://`) pulls a NATS JetStream durable consumer (--nats-stream, --nats-consumer)";
    const KEEPER: Option<&'static str> = Some("JetStream");

    fn claims(value: &str) -> Claim {
        Claim::scheme(value, &["nats", "tls"])
    }

    fn misplaced(args: &NatsArgs) -> Option<FlagsError> {
        args.any()
            .then(|| FlagsError::of(NatsFlagsError::WithoutNats))
    }

    fn spec(
        url: &str,
        args: &NatsArgs,
        shared: &SharedFlags<'_>,
    ) -> Result<SourceSpec, FlagsError> {
        if shared.dead_letter.is_some() {
            return Err(FlagsError::of(NatsFlagsError::DeadLetterFile));
        }
        let policy = &shared.subscription.delivery.dead_letter;
        if let (Some((topic, _)), None) = (policy, &args.nats_dead_letter_subject) {
            let topic = topic.clone();
            return Err(FlagsError::of(
                NatsFlagsError::DeadLetterPolicyWithoutSubject { topic },
            ));
        }
        let settings = args.settings(url, shared.max_outstanding_messages);
        Ok(SourceSpec::new(settings.map_err(FlagsError::of)?))
    }
}

#[async_trait::async_trait]
impl Connect for NatsSettings {
    async fn connect(self: Box<Self>, ctx: &Context<'_>) -> Result<Connected, SourceError> {
        start(*self, ctx).await
    }

    fn is_broker(&self) -> bool {
        true
    }
}
