//! The Pub/Sub source's constructor: the subscription checked, its source and its settle side.

use super::settle::PubsubBroker;
use super::{PubsubSettings, PubsubSource};
use crate::connect::{Connected, Context, SourceError};
use crate::pubsub::{PubsubClient, PubsubError};
use crate::settle::Brokered;

/// The Pub/Sub source, pulling, and its settle side (acks, nacks, lease extensions, dead letters).
pub async fn start(
    client: Option<PubsubClient>,
    mut settings: PubsubSettings,
    ctx: &Context<'_>,
) -> Result<Connected, SourceError> {
    let sub = ctx.subscription;
    settings.bounded_by(ctx.resources.memory_limit());
    let client = match client {
        Some(c) => c,
        None => PubsubClient::connect().await?,
    };
    exists(&client, &settings.subscription).await?;
    let src = PubsubSource::start(client.clone(), settings.clone())?;
    let settle = Brokered::new(PubsubBroker::new(
        client,
        src.acker(),
        settings.subscription,
        &sub.delivery,
        settings.stream_ack_deadline,
    ));
    Ok(Connected::new(src, settle))
}

/// Refuse a Pub/Sub subscription the server says is not there, before the stream starts (which
/// would otherwise fail over and over). Only NOT_FOUND counts: a plain subscriber may lack the
/// permission to read the subscription, and an unreachable server is the stream's to retry.
async fn exists(client: &PubsubClient, name: &str) -> Result<(), SourceError> {
    let asked = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.get_subscription(name),
    )
    .await;
    match asked {
        Ok(Err(PubsubError::Status {
            code: tonic::Code::NotFound,
            ..
        })) => Err(SourceError::NoSubscription {
            name: name.to_string(),
            target: client.target().to_string(),
        }),
        _ => Ok(()),
    }
}
