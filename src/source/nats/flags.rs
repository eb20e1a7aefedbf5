//! The NATS source's flags (`--nats-stream`, `--nats-consumer`, `--nats-dead-letter-subject`),
//! checked into [`NatsSettings`].

use super::{NatsFlagsError, NatsSettings};

/// The NATS source's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = crate::cli::heading::NATS)]
pub struct NatsArgs {
    /// NATS source: the JetStream stream to read.
    #[arg(long, value_name = "STREAM")]
    pub nats_stream: Option<String>,
    /// NATS source: the durable pull consumer (created if absent, with explicit acks, AckWait =
    /// ackDeadlineSeconds, MaxDeliver = maxDeliveryAttempts, MaxAckPending =
    /// --max-outstanding-messages).
    #[arg(long, value_name = "NAME")]
    pub nats_consumer: Option<String>,
    /// NATS source: where a message goes after its last allowed delivery failed (a subject a
    /// stream stores), with the CloudPubSubDeadLetterSource* headers.
    #[arg(long, value_name = "SUBJECT")]
    pub nats_dead_letter_subject: Option<String>,
}

impl NatsArgs {
    /// Is any NATS flag given?
    pub fn any(&self) -> bool {
        self.nats_stream.is_some()
            || self.nats_consumer.is_some()
            || self.nats_dead_letter_subject.is_some()
    }

    /// The source's settings for the server at `url`; `max_ack_pending`: of a consumer created
    /// here (`--max-outstanding-messages`).
    pub fn settings(
        &self,
        url: &str,
        max_ack_pending: i64,
    ) -> Result<NatsSettings, NatsFlagsError> {
        let (Some(stream), Some(consumer)) = (&self.nats_stream, &self.nats_consumer) else {
            return Err(NatsFlagsError::NeedsStreamAndConsumer);
        };
        let mut s = NatsSettings::new(url, stream, consumer);
        s.dead_letter_subject = self.nats_dead_letter_subject.clone();
        s.max_ack_pending = max_ack_pending;
        Ok(s)
    }
}
