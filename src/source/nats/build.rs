//! The NATS source's constructor: the consumer connected, its source and its settle side.

use super::settle::NatsBroker;
use super::{NatsConnection, NatsError, NatsSettings, NatsSource};
use crate::connect::{Connected, Context, SourceError};
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
    let source = NatsSource::start(consumer, client.clone(), name);
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
