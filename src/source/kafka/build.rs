//! The consumer group's constructor: subscribed, its source and its settle side.

use super::settle::KafkaBroker;
use super::{KafkaError, KafkaSettings, KafkaSource};
use crate::connect::{Connected, Context, SourceError};
use crate::settle::Brokered;

/// The Kafka source, subscribed ([`crate::source::kafka::connect`]), and its settle side (commits
/// after durable, redeliveries, dead letters).
pub async fn start(settings: KafkaSettings, ctx: &Context<'_>) -> Result<Connected, SourceError> {
    let sub = ctx.subscription;
    let positions = ctx.positions.clone();
    let c = super::connect(settings, &sub.delivery, positions).await?;
    // Not the options: they may carry a password.
    let name = format!("kafka:{}", c.settings.group);
    let source = KafkaSource::start(&c, name);
    let settle = Brokered::new(KafkaBroker::new(
        c.consumer,
        c.offsets,
        source.redeliver(),
        sub.name.clone(),
        &sub.delivery,
        c.dead_letter,
        c.max_attempts,
        c.settings.exactly_once,
    ));
    Ok(Connected::new(source, settle))
}

impl From<KafkaError> for SourceError {
    fn from(e: KafkaError) -> SourceError {
        let config = e.is_config();
        SourceError::of(e, config)
    }
}
