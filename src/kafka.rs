//! The Kafka client settings the Kafka source ([`crate::source::kafka`]) and the publish sink
//! ([`crate::sink::publish`]) share, as `pubsub/` holds the Pub/Sub client: one place says how
//! subsink connects to brokers through librdkafka, so that neither side imports the other.

use rdkafka::ClientConfig;

/// The settings of every client of `brokers` (`HOST:PORT[,HOST:PORT…]`) before a side's own ones
/// and the user's options (`--kafka-option`, `--publish-option`: SASL, TLS, …) go on top.
pub fn client_config(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("client.id", "subsink")
        .set("log_level", "4");
    c
}

/// A Kafka producer's settings on top of the client settings `client`: every produce acknowledged
/// by all in-sync replicas (`acks=all`), without the idempotent producer. `--publish-to
/// kafka://…`'s producer, and the Kafka source's dead-letter producer.
pub fn producer_config(client: &ClientConfig) -> ClientConfig {
    let mut c = client.clone();
    c.set("enable.idempotence", "false").set("acks", "all");
    c
}
