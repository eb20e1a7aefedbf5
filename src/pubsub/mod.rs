//! The Pub/Sub client: one gRPC connection to Pub/Sub (Google or the emulator) and the calls made
//! on it — Acknowledge, ModifyAckDeadline, Publish and a little admin — for the StreamingPull
//! source ([`crate::source::pubsub`]), its settle side ([`crate::source::pubsub::settle`]), `serve`'s
//! discovery and the tests.
//!
//! | file | holds |
//! |---|---|
//! | `client.rs` | [`PubsubClient`]: connecting, the request (token, routing header), Acknowledge, ModifyAckDeadline, Publish and their batching |
//! | `admin.rs` | topics, subscriptions ([`SubscriptionSpec`]) and schemas: create, get, list, delete |
//! | `acker.rs` | [`Acker`]: acks and deadline changes on the source's open stream, else by unary calls |
//! | `error.rs` | [`PubsubError`], retryable or not from the gRPC status |
//!
//! ## Connection
//! [`PubsubClient::connect`] talks to the emulator when `PUBSUB_EMULATOR_HOST` is set (plaintext,
//! no credentials unless `SUBSINK_GOOGLE_AUTH=always`), else to `pubsub.googleapis.com` over TLS
//! with the process's Google credentials ([`crate::gauth`]: the `GOOGLE_SERVICE_ACCOUNT*`
//! variables, `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's well-known file, the metadata server),
//! the one token that BigQuery and Cloud Storage use too. External-account (workload identity
//! federation) and impersonated credential files are refused.
//!
//! The gRPC stubs are `googleapis-tonic-google-pubsub-v1` on tonic; [`proto`] re-exports them.

mod acker;
mod admin;
mod client;
mod error;

pub use acker::Acker;
pub(crate) use acker::{Lane, Stats, StreamItem};
pub use admin::SubscriptionSpec;
pub use client::{
    PubsubClient, GOOGLE_ENDPOINT, MAX_ACK_IDS_PER_REQUEST, MAX_ACK_REQUEST_BYTES,
    MAX_PUBLISH_BYTES, MAX_PUBLISH_MESSAGES,
};
pub use error::{retryable_code, PubsubError};

/// The generated Pub/Sub v1 messages and clients (`data` is `Bytes`, maps are `BTreeMap`s).
pub use googleapis_tonic_google_pubsub_v1::google::pubsub::v1 as proto;
