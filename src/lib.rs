//! # subsink
//!
//! Pub/Sub's export subscriptions, anywhere: a worker that reads messages and writes them exactly
//! as a Pub/Sub **Cloud Storage subscription** would — batched into objects named
//! `<prefix><UTC datetime>_<uuid><suffix>`, encoded as Text or Avro — into any object store, or as a
//! **BigQuery subscription** would — as table rows, committed to a Delta Lake table — and settles a
//! message only once the object or commit holding it is durable.
//!
//! ## The pipeline, one module per stage
//!
//! | stage | module | what it does |
//! |---|---|---|
//! | config | [`config`] | the subscription resource in Pub/Sub's REST shape, parsed then validated once |
//! | source | [`source`] | NDJSON file / stdin of `PubsubMessage` JSON, parsed on its own threads; Pub/Sub StreamingPull |
//! | filter | [`filter`] | the subscription's attribute filter (SPEC §2.5) |
//! | batch | [`batch`] | when a file is finalized: max duration, max bytes, max messages, end of input (pure) |
//! | naming | [`naming`] | object names and the datetime-format grammar (pure) |
//! | encode | [`encode`] | Text, Avro container files in four layouts, codecs |
//! | avro | [`avro`] | the Avro layer under `encode` and `table`: wire helpers, the topic schema, Avro types, datum errors |
//! | write | [`writer`] | assigns messages to open files, streams their bytes |
//! | table | [`table`] | the table writer: messages → Arrow rows (SPEC §4, independent of the destination), batches → Parquet → Delta commits ([`table::writer`]) |
//! | upload | [`upload`] | `object_store` writes: single put or streaming multipart, retries, abort |
//! | settle | [`checkpoint`], [`app`] | the watermark up to which input is durable; acks, nacks, dead letters; resume after a crash |
//!
//! [`app::run`] wires them. `main.rs` only parses flags and calls it.
//!
//! ## Delivery guarantee
//! At least once: a message is settled (checkpointed) only after its object is durable; objects
//! become visible whole or not at all. A rerun after a crash resumes at the checkpoint and writes no
//! second object for messages already written (see [`checkpoint`]).

pub mod app;
pub mod avro;
pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod encode;
pub mod filter;
pub mod ids;
pub mod message;
pub mod naming;
pub mod settle;
pub mod sink;
pub mod source;
pub mod summary;
pub mod table;
pub mod upload;
