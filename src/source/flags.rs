//! Source flags that do not go together, found once, before anything starts: one error type, and
//! the binary exits 2 for every one of them. The rules are checked by
//! [`crate::registry::SourceArgs::spec`] and the sources' own `Args` structs.

use std::path::PathBuf;

/// Flags that do not go together, or a source that cannot be read: found before anything starts
/// (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum FlagsError {
    #[error("--source {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--dead-letter applies to the table writer (a bigqueryConfig subscription)")]
    DeadLetterNeedsTable,
    #[error("--dead-letter is for the file source; Pub/Sub dead-letters to the subscription's deadLetterPolicy topic")]
    DeadLetterOnPubsub,
    #[error("--dead-letter is for the file source; a NATS source dead-letters to --nats-dead-letter-subject")]
    DeadLetterOnNats,
    #[error("--checkpoint needs a file source (stdin cannot be resumed)")]
    CheckpointOnStdin,
    /// `keeper`: who keeps unacked messages instead (Pub/Sub, JetStream).
    #[error("--checkpoint is for the file source; {keeper} keeps unacked messages itself")]
    CheckpointOnBroker { keeper: &'static str },
    #[error("--nats-stream, --nats-consumer and --nats-dead-letter-subject need --source nats://HOST:PORT")]
    NatsFlagsWithoutNats,
    #[error("--source nats://…: give --nats-stream STREAM and --nats-consumer NAME")]
    NatsNeedsStreamAndConsumer,
    /// `topic`: the policy's dead-letter topic.
    #[error("the subscription's deadLetterPolicy (topic {topic}) needs a NATS subject: give --nats-dead-letter-subject SUBJECT")]
    NatsDeadLetterPolicyWithoutSubject { topic: String },
    #[error("--source push needs --listen HOST:PORT")]
    PushNeedsListen,
    #[error("--source push: give --spool-dir DIR (its default, $XDG_STATE_HOME/subsink/spool/<subscription ID> or ~/.local/state/subsink/spool/<subscription ID>, needs XDG_STATE_HOME or HOME set to an absolute path), or --no-spool")]
    PushNeedsSpoolDir,
    #[error("--push-jwks and --push-allowed-email need --push-audience")]
    PushAuthNeedsAudience,
    #[error(
        "--source push: the file's maxDuration ({max_duration:?}) is longer than the \
         subscription's ackDeadlineSeconds ({deadline:?}): Pub/Sub would time out every push \
         request before its message is durable; lower maxDuration or raise ackDeadlineSeconds"
    )]
    PushSlowerThanDeadline {
        max_duration: std::time::Duration,
        deadline: std::time::Duration,
    },
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
    #[error("--pubsub-streams {0}: 1–{max} streams are allowed", max = super::pubsub::MAX_STREAMS)]
    PubsubStreamsOutOfRange(usize),
    #[error(
        "--pubsub-streams {0}: a subscription with enableMessageOrdering is read on one stream"
    )]
    PubsubStreamsWithOrdering(usize),
    #[error("--archive-subscription {}: {reason}", path.display())]
    ArchiveSubscription { path: PathBuf, reason: String },
    #[error("--archive-subscription, --from and --to need an archive --source (s3://, gs://, az://, file://)")]
    ArchiveFlagsWithoutArchive,
    #[error("--from must be before --to")]
    ArchiveEmptyRange,
}
