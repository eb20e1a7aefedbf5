//! Sources of messages, each in a folder of its own, behind one trait ([`Source`], in
//! [`crate::input`], re-exported here).
//!
//! A source's folder holds the source, its flags (a clap `Args` struct under its own help
//! heading), the typed settings they make and its errors, its flag errors among them (each a
//! [`crate::connect::FlagsError`], exit 2), its registration and its constructor (`build.rs`:
//! [`crate::connect::Register`], [`crate::connect::Connect`]). Today: a local NDJSON file or stdin (`file`),
//! a Pub/Sub subscription (`pubsub`), Pub/Sub push requests with their local spool (`push`), a
//! NATS JetStream durable pull consumer (`nats`), the objects an export wrote (`archive`), and a
//! consumer group of a log broker. A source hands out messages in chunks; settling them (ack /
//! checkpoint) happens only after the file holding them is durable, on the settle side that goes
//! with the source ([`crate::settle`]). [`crate::registry`] lists the sources once: it maps `--source`
//! to a source and checks its flags once.

pub mod archive;
pub mod file;
pub mod kafka;
pub mod memory;
pub mod nats;
pub mod pubsub;
pub mod push;

pub use crate::input::{BadLine, Source, SourceEvent};
