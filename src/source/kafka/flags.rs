//! The Kafka source's flags (`--kafka-*`) and the settings they make.

use super::KafkaSettings;

/// The Kafka source's flags that do not go together (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum KafkaFlagsError {
    #[error("--kafka-topic, --kafka-topic-pattern, --kafka-group, --kafka-option and --kafka-dead-letter-topic need --source kafka://HOST:PORT")]
    WithoutKafka,
    #[error("--source {0}: give the brokers as kafka://HOST:PORT[,HOST:PORT…]")]
    Brokers(String),
    #[error(
        "--source kafka://…: give --kafka-topic TOPIC (repeatable) or --kafka-topic-pattern REGEX"
    )]
    NeedsTopic,
    #[error("--kafka-topic and --kafka-topic-pattern do not go together")]
    TopicAndPattern,
    #[error("--kafka-topic-pattern {pattern:?}: {why}")]
    Pattern { pattern: String, why: String },
    /// Never the value: it may be a secret.
    #[error("--kafka-option {key}: {why}")]
    Option { key: String, why: String },
    /// `topic`: the policy's dead-letter topic.
    #[error("the subscription's deadLetterPolicy (topic {topic}) needs a Kafka topic: give --kafka-dead-letter-topic TOPIC")]
    DeadLetterPolicyWithoutTopic { topic: String },
    #[error("--dead-letter is for the file source; a Kafka source dead-letters to --kafka-dead-letter-topic")]
    DeadLetterFile,
}

/// Client settings subsink sets and refuses from `--kafka-option`, with why.
const FIXED: [(&str, &str); 4] = [
    (
        "enable.auto.commit",
        "offsets are committed only once the records below them are durable",
    ),
    (
        "enable.auto.offset.store",
        "offsets are committed only once the records below them are durable",
    ),
    ("group.id", "give --kafka-group"),
    (
        "bootstrap.servers",
        "give the brokers in --source kafka://HOST:PORT,…",
    ),
];

/// The Kafka source's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = super::HEADING)]
pub struct KafkaArgs {
    /// Kafka source: a topic to read (repeatable).
    #[arg(long, value_name = "TOPIC")]
    pub kafka_topic: Vec<String>,
    /// Kafka source: read every topic whose name matches this regex (instead of --kafka-topic).
    #[arg(long, value_name = "REGEX")]
    pub kafka_topic_pattern: Option<String>,
    /// Kafka source: the consumer group (default: the subscription's short ID).
    #[arg(long, value_name = "GROUP")]
    pub kafka_group: Option<String>,
    /// Kafka source: a librdkafka client setting, passed through (SASL, TLS, client.id, …;
    /// repeatable; values are never logged).
    #[arg(long, value_name = "KEY=VALUE")]
    pub kafka_option: Vec<String>,
    /// Kafka source: where a record goes after its last allowed delivery failed, with its
    /// headers and the CloudPubSubDeadLetterSource* headers (without it, such a record stops its
    /// partition).
    #[arg(long, value_name = "TOPIC")]
    pub kafka_dead_letter_topic: Option<String>,
}

impl KafkaArgs {
    /// Is any Kafka flag given?
    pub fn any(&self) -> bool {
        !self.kafka_topic.is_empty()
            || self.kafka_topic_pattern.is_some()
            || self.kafka_group.is_some()
            || !self.kafka_option.is_empty()
            || self.kafka_dead_letter_topic.is_some()
    }

    /// The source's settings for the brokers of `url` (`kafka://HOST:PORT,…`), for the
    /// subscription `subscription` (its short ID is the default group).
    pub fn settings(
        &self,
        url: &str,
        subscription: &str,
    ) -> Result<KafkaSettings, KafkaFlagsError> {
        let brokers = url
            .strip_prefix("kafka://")
            .unwrap_or(url)
            .trim_end_matches('/');
        if brokers.is_empty() || brokers.contains('/') {
            return Err(KafkaFlagsError::Brokers(url.to_string()));
        }
        match (&self.kafka_topic[..], &self.kafka_topic_pattern) {
            ([], None) => return Err(KafkaFlagsError::NeedsTopic),
            ([_, ..], Some(_)) => return Err(KafkaFlagsError::TopicAndPattern),
            _ => {}
        }
        if let Some(p) = &self.kafka_topic_pattern {
            regex_check(p)?;
        }
        let mut options = Vec::new();
        for o in &self.kafka_option {
            let Some((k, v)) = o.split_once('=') else {
                return Err(KafkaFlagsError::Option {
                    key: o.clone(),
                    why: "give KEY=VALUE".into(),
                });
            };
            let k = k.trim();
            if let Some((_, why)) = FIXED.iter().find(|(f, _)| *f == k) {
                return Err(KafkaFlagsError::Option {
                    key: k.to_string(),
                    why: format!("subsink sets it: {why}"),
                });
            }
            options.push((k.to_string(), v.to_string()));
        }
        let group = self.kafka_group.clone().unwrap_or_else(|| {
            subscription
                .rsplit('/')
                .next()
                .unwrap_or(subscription)
                .to_string()
        });
        Ok(KafkaSettings {
            brokers: brokers.to_string(),
            topics: self.kafka_topic.clone(),
            topic_pattern: self.kafka_topic_pattern.clone(),
            group,
            options,
            dead_letter_topic: self.kafka_dead_letter_topic.clone(),
            max_outstanding_messages: None,
            max_outstanding_bytes: None,
            ordering: false,
            exactly_once: false,
            prefetch: None,
        })
    }
}

/// A pattern librdkafka would take: balanced brackets and parentheses, no trailing backslash
/// (librdkafka's own regex engine reports a bad one only later, as a consumer error).
fn regex_check(p: &str) -> Result<(), KafkaFlagsError> {
    let bad = |why: &str| KafkaFlagsError::Pattern {
        pattern: p.to_string(),
        why: why.to_string(),
    };
    if p.is_empty() {
        return Err(bad("empty"));
    }
    let (mut paren, mut bracket, mut escaped) = (0i32, false, false);
    for c in p.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '[' if !bracket => bracket = true,
            ']' if bracket => bracket = false,
            '(' if !bracket => paren += 1,
            ')' if !bracket => paren -= 1,
            _ => {}
        }
        if paren < 0 {
            return Err(bad("unbalanced ')'"));
        }
    }
    if escaped || bracket || paren != 0 {
        return Err(bad("unbalanced or unfinished"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let a = KafkaArgs {
            kafka_topic: vec!["t".into()],
            kafka_topic_pattern: None,
            kafka_group: None,
            kafka_option: vec!["sasl.password=hunter2".into(), "client.id=me".into()],
            kafka_dead_letter_topic: None,
        };
        let s = a
            .settings("kafka://a:9092,b:9092", "projects/p/subscriptions/sub")
            .unwrap();
        assert_eq!(s.brokers, "a:9092,b:9092");
        assert_eq!(s.group, "sub");
        assert!(!format!("{s:?}").contains("hunter2"));
        let mut b = a.clone();
        b.kafka_option = vec!["enable.auto.commit=true".into()];
        assert!(b.settings("kafka://a:1", "s").is_err());
        let mut c = a.clone();
        c.kafka_topic_pattern = Some("orders\\..*".into());
        assert!(c.settings("kafka://a:1", "s").is_err());
        c.kafka_topic.clear();
        assert_eq!(
            c.settings("kafka://a:1", "s").unwrap().subscription(),
            vec!["^orders\\..*".to_string()]
        );
        c.kafka_topic_pattern = Some("(a".into());
        assert!(c.settings("kafka://a:1", "s").is_err());
    }
}
