//! # subsink
//!
//! Pub/Sub's export subscriptions, anywhere: a worker that reads messages and writes them exactly
//! as a Pub/Sub **Cloud Storage subscription** would — batched into objects named
//! `<prefix><UTC datetime>_<uuid><suffix>`, encoded as Text or Avro — into any object store, or as a
//! **BigQuery subscription** would — as table rows, committed to a Delta Lake table or appended to
//! BigQuery — and settles a message only once the object, commit or append holding it is durable.
//!
//! ## The pipeline, one module per stage
//!
//! | stage | module | what it does |
//! |---|---|---|
//! | config | [`config`] | the subscription resource in Pub/Sub's REST shape, parsed then validated once |
//! | input | [`input`] | [`input::Source`]: what every source hands the pipeline (batches of messages, bad lines, a failure), whichever source it is |
//! | source | [`source`] | each source in a folder of its own: NDJSON file / stdin of `PubsubMessage` JSON, parsed on its own threads ([`source::file`]); Pub/Sub StreamingPull ([`source::pubsub`]); a Pub/Sub push endpoint and its local spool ([`source::push`]); a NATS JetStream pull consumer ([`source::nats`]); an archive an export wrote ([`source::archive`]) |
//! | connect | [`connect`] | what connecting a source takes (the subscription, resources, the run's shaper, its grace) and gives (the source and its settle side) |
//! | shape | [`shape`] | [`shape::Shaper`]: the filter, the transforms and the sink's own checks as one value, run by the pipeline on every batch and by a source that checks a message before it accepts it |
//! | filter | [`filter`] | the subscription's attribute filter (docs/contract.md §2.5) |
//! | batch | [`batch`] | when a file is finalized: max duration, max bytes, max messages, end of input (pure) |
//! | naming | [`naming`] | object names and the datetime-format grammar (pure) |
//! | encode | [`encode`] | Text, Avro container files in four layouts, codecs |
//! | avro | [`avro`] | the Avro layer under `encode` and `table`: wire helpers, the topic schema, Avro types, datum errors |
//! | table | [`table`] | the table mapping core: messages → Arrow rows (§4, independent of the destination), Parquet, the Delta log |
//! | receipts | [`receipt`] | what sources, the settle side and sinks share about a message and its file: ack references, file contents, what became durable or why not, refusals — so that neither side names the other |
//! | sink | [`sink`] | [`sink::Sink`]: where files become durable — objects ([`sink::object`]), Delta rows ([`sink::delta`]), BigQuery rows ([`sink::bigquery`]), nothing ([`sink::discard`]); the open-file lifecycle once ([`sink::Files`]) |
//! | make durable | [`durable`] | [`durable::MakeDurable`]: finalized files made durable on their own tasks — slots, the ordering chain, in-flight accounting — their outcomes back to the pipeline |
//! | pipeline | [`pipeline`] | [`pipeline::Pipeline`]: what one turn of the run's loop drives — a batch through the shaper into the open files, finalized files to the durable stage, outcomes to the settle side |
//! | upload | [`upload`] | `object_store` writes: single put or streaming multipart, retries, abort |
//! | settle | [`settle`] | [`settle::Settle`]: the checkpoint watermark ([`checkpoint_file`]), or acks, nacks, dead letters and leases of a broker ([`settle::Brokered`]) |
//! | operate | [`telemetry`] | metrics, `/metrics` `/healthz` `/readyz`, logs, the progress bar |
//! | sink registry | [`sink::registry`] | each sink's registration in its folder; a validated subscription and its URL → the [`sink::SinkSpec`] of the sink that claims it (`run` and `serve`) |
//! | look inside | [`inspect`] | Avro / Parquet / Delta / Text as NDJSON, name checks (`subsink inspect`) |
//! | Google credentials | [`gauth`] | service-account keys, authorized_user files, the metadata server: access tokens, renewed before they expire, for Pub/Sub, BigQuery and Cloud Storage |
//! | Pub/Sub | [`pubsub`] | the Pub/Sub gRPC client: acks, deadline changes, publish, admin calls; used by the StreamingPull source, its settle side and `serve` |
//! | many subscriptions | [`serve`] | discover a project's export subscriptions and run one pipeline each |
//! | shutdown | [`shutdown`] | the shutdown grace counted from the signal, what it bounds, the watchdog |
//! | shared | [`resources`] | upload slots and the memory budget every pipeline of the process shares |
//! | flow control | [`flow`] | which open file to finalize early when a broker's flow control holds the source back (pure) |
//! | stream positions | [`position`] | where a message sits in a partitioned stream, and what a destination holds of it: the vocabulary of `--exactly-once` with a positioned source |
//! | flags | [`cli`] | clap `Args` of the subscription, destination and process, typed values, help headings; a source's own flags live with it, gathered by [`registry`] |
//! | commands | [`command`] | the binary's subcommands as library code: `run`, `serve`, `inspect` (their flags, what they build, their output and exit codes), the runtime, shutdown signals and telemetry endpoint they share |
//!
//! [`app::run`] wires them: build → loop → drain; no stage calls another. `main.rs` only parses
//! flags and calls a [`command`], which builds the run and calls it. `docs/architecture.md` tells how a message flows and where to add a source
//! or a sink.
//!
//! ## Delivery guarantee
//! At least once: a message is settled (checkpointed, acked) only after its object, commit or
//! append is durable; objects become visible whole or not at all. A rerun after a crash resumes at
//! the checkpoint and writes no second object for messages already written (see [`checkpoint_file`]).

pub mod app;
pub mod avro;
pub mod batch;
pub mod checkpoint_file;
mod civil;
pub mod cli;
pub mod command;
pub mod config;
pub mod connect;
pub mod durable;
pub mod encode;
pub mod filter;
pub mod flow;
pub mod gauth;
pub mod ids;
pub mod input;
pub mod inspect;
mod jsonscan;
pub mod kafka;
pub mod message;
pub mod naming;
pub mod paths;
pub mod pipeline;
pub mod position;
pub mod pubsub;
pub mod receipt;
pub mod registry;
pub mod resources;
pub mod serve;
pub mod settle;
pub mod shape;
pub mod shutdown;
pub mod sink;
pub mod source;
pub mod summary;
pub mod table;
pub mod telemetry;
pub mod transform;
pub mod upload;
