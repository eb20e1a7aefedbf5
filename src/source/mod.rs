//! Sources of messages, one module per broker, behind one trait ([`Source`], in
//! [`crate::input`], re-exported here).
//!
//! Today: a local NDJSON file or stdin (`file`), a Pub/Sub subscription (`pubsub`), Pub/Sub push
//! requests (`push`), a NATS JetStream durable pull consumer (`nats`), a Kafka consumer group
//! (`kafka`). A source hands out messages
//! in chunks; settling them (ack / checkpoint) happens only after the file holding them is durable,
//! on the settle side that goes with the source ([`crate::settle`]). A source's flags are a
//! clap `Args` struct in its module; [`crate::registry`] maps `--source` to them, checks them once and
//! holds each source's constructor from its typed settings to its source and settle side.

pub mod archive;
pub mod file;
pub mod flags;
pub mod kafka;
pub mod nats;
pub mod pubsub;
pub mod push;

pub use crate::input::{BadLine, Source, SourceEvent};
