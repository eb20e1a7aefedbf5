//! The consumer group's registration ([`Kafka`]: `--source kafka://…` and its flags) and its
//! constructor: subscribed, its source and its settle side.

use super::settle::KafkaBroker;
use super::{KafkaArgs, KafkaError, KafkaFlagsError, KafkaSettings, KafkaSource};
use crate::connect::{
    Claim, Connect, Connected, Context, FlagsError, Register, SharedFlags, SourceError, SourceSpec,
};
use crate::position::Streams;
use crate::receipt::PositionedSource;
use crate::settle::Brokered;

/// The Kafka source, subscribed ([`crate::source::kafka::connect`]), and its settle side (commits
/// after durable, redeliveries, dead letters).
pub async fn start(
    mut settings: KafkaSettings,
    ctx: &Context<'_>,
) -> Result<Connected, SourceError> {
    let sub = ctx.subscription;
    settings.bounded_by(ctx.resources.memory_limit());
    let durable_streams = ctx.durable_streams.clone();
    let c = super::connect(settings, &sub.delivery, durable_streams).await?;
    // Not the options: they may carry a password.
    let name = format!("kafka:{}", c.settings.group);
    let source = KafkaSource::start_gated(&c, name, ctx.resources.input_gate());
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

/// The consumer group as the registry knows it (`--source kafka://HOST:PORT[,HOST:PORT…]`).
pub struct Kafka;

impl Register for Kafka {
    type Args = KafkaArgs;
    const FORMS: &'static str = "kafka://HOST:PORT";
    const HELP: &'static str =
        "`kafka://HOST:PORT[,HOST:PORT…]` reads a Kafka consumer group (--kafka-topic)";
    const KEEPER: Option<&'static str> = Some("Kafka");
    const POSITIONED: Option<PositionedSource> = Some(super::POSITIONED);

    fn claims(value: &str) -> Claim {
        Claim::scheme(value, &["kafka"])
    }

    fn misplaced(args: &KafkaArgs) -> Option<FlagsError> {
        args.any()
            .then(|| FlagsError::of(KafkaFlagsError::WithoutKafka))
    }

    fn spec(
        url: &str,
        args: &KafkaArgs,
        shared: &SharedFlags<'_>,
    ) -> Result<SourceSpec, FlagsError> {
        let sub = shared.subscription;
        if shared.dead_letter.is_some() {
            return Err(FlagsError::of(KafkaFlagsError::DeadLetterFile));
        }
        if let (Some((topic, _)), None) = (&sub.delivery.dead_letter, &args.kafka_dead_letter_topic)
        {
            let topic = topic.clone();
            return Err(FlagsError::of(
                KafkaFlagsError::DeadLetterPolicyWithoutTopic { topic },
            ));
        }
        let mut s = args.settings(url, &sub.name).map_err(FlagsError::of)?;
        s.max_outstanding_messages = u64::try_from(shared.max_outstanding_messages)
            .ok()
            .filter(|v| *v > 0);
        s.max_outstanding_bytes = Some(shared.max_outstanding_bytes).filter(|v| *v > 0);
        s.ordering = sub.delivery.enable_message_ordering;
        Ok(SourceSpec::new(s))
    }
}

#[async_trait::async_trait]
impl Connect for KafkaSettings {
    async fn connect(self: Box<Self>, ctx: &Context<'_>) -> Result<Connected, SourceError> {
        start(*self, ctx).await
    }

    fn is_broker(&self) -> bool {
        true
    }

    fn positioned(&self) -> Option<Streams> {
        Some(self.streams())
    }

    fn hold_positions(&mut self, atomic_with: &str) -> Result<(), String> {
        KafkaSettings::hold_positions(self, atomic_with)
    }
}
