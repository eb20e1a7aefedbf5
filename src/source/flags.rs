//! Source flags that do not go together, found once, before anything starts: the binary exits 2
//! for every one of them. Each source has its own error for its own flags, in its folder
//! ([`FileFlagsError`], [`PubsubFlagsError`], [`PushFlagsError`], [`NatsFlagsError`],
//! [`ArchiveFlagsError`]); [`FlagsError`] is any of them, or a rule about the flags several
//! sources share (`--dead-letter`, `--checkpoint`). The rules are checked by
//! [`crate::registry::SourceArgs::spec`] and the sources' own `Args` structs.

pub use super::archive::ArchiveFlagsError;
pub use super::file::FileFlagsError;
pub use super::nats::NatsFlagsError;
pub use super::pubsub::PubsubFlagsError;
pub use super::push::PushFlagsError;

/// Flags that do not go together, or a source that cannot be read: found before anything starts
/// (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum FlagsError {
    #[error(transparent)]
    File(#[from] FileFlagsError),
    #[error(transparent)]
    Pubsub(#[from] PubsubFlagsError),
    #[error(transparent)]
    Push(#[from] PushFlagsError),
    #[error(transparent)]
    Nats(#[from] NatsFlagsError),
    #[error(transparent)]
    Archive(#[from] ArchiveFlagsError),
    #[error("--dead-letter applies to the table writer (a bigqueryConfig subscription)")]
    DeadLetterNeedsTable,
    /// `keeper`: who keeps unacked messages instead (Pub/Sub, JetStream).
    #[error("--checkpoint is for the file source; {keeper} keeps unacked messages itself")]
    CheckpointOnBroker { keeper: &'static str },
    #[error("--kafka-topic, --kafka-topic-pattern, --kafka-group, --kafka-option and --kafka-dead-letter-topic need --source kafka://HOST:PORT")]
    KafkaFlagsWithoutKafka,
    #[error("--source {0}: give the brokers as kafka://HOST:PORT[,HOST:PORT…]")]
    KafkaBrokers(String),
    #[error(
        "--source kafka://…: give --kafka-topic TOPIC (repeatable) or --kafka-topic-pattern REGEX"
    )]
    KafkaNeedsTopic,
    #[error("--kafka-topic and --kafka-topic-pattern do not go together")]
    KafkaTopicAndPattern,
    #[error("--kafka-topic-pattern {pattern:?}: {why}")]
    KafkaPattern { pattern: String, why: String },
    /// Never the value: it may be a secret.
    #[error("--kafka-option {key}: {why}")]
    KafkaOption { key: String, why: String },
    /// `topic`: the policy's dead-letter topic.
    #[error("the subscription's deadLetterPolicy (topic {topic}) needs a Kafka topic: give --kafka-dead-letter-topic TOPIC")]
    KafkaDeadLetterPolicyWithoutTopic { topic: String },
    #[error("--dead-letter is for the file source; a Kafka source dead-letters to --kafka-dead-letter-topic")]
    DeadLetterOnKafka,
}
