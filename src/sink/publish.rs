//! The publish sink: messages back onto a Pub/Sub topic (`--publish-to projects/P/topics/T`),
//! through the Publish API (docs/replay.md). A "file" is a batch of up to [`MAX_MESSAGES`]
//! messages; making it durable publishes it — grouped by ordering key, keys in input order
//! ([`PubsubClient::publish`]) — with data, attributes and ordering key; the topic assigns new
//! message ids and publish times. At least once: a batch published when the run crashed before
//! its checkpoint moved is published again by the rerun, and a failed request retried.

use std::time::Duration;

use super::{Durable, PushError, Refusal, Refused, Sink, SinkError, SinkFile, Unstaged, Written};
use crate::batch::Limits;
use crate::message::Message;
use crate::pubsub::PubsubClient;

/// Messages in one batch (a PublishRequest holds at most 1,000).
pub const MAX_MESSAGES: u64 = 1000;
/// Message bytes in one batch (requests are split at about 10 MB by the client).
pub const MAX_BYTES: u64 = 9_000_000;
/// A batch is published at most this long after its first message.
pub const MAX_DELAY: Duration = Duration::from_millis(500);
/// Tries of a batch whose publish fails with a retryable status.
const TRIES: u32 = 6;

/// Publishes batches onto `topic`.
pub struct PublishSink {
    client: PubsubClient,
    topic: String,
    batches: u64,
}

impl PublishSink {
    pub fn new(client: PubsubClient, topic: String) -> PublishSink {
        PublishSink {
            client,
            topic,
            batches: 0,
        }
    }
}

impl Sink for PublishSink {
    type File = Batch;

    fn limits(&self) -> Limits {
        Limits {
            max_duration: MAX_DELAY,
            max_bytes: Some(MAX_BYTES),
            max_messages: Some(MAX_MESSAGES),
        }
    }

    fn refusal(&self) -> Refusal {
        Refusal::BadInput
    }

    fn open(&mut self, _group: Option<&str>) -> Result<Batch, PushError> {
        self.batches += 1;
        Ok(Batch {
            name: format!("{}#batch-{}", self.topic, self.batches),
            client: self.client.clone(),
            topic: self.topic.clone(),
            messages: Vec::new(),
            staged: None,
            bytes: 0,
        })
    }

    async fn is_durable(&self, _name: &str) -> Result<bool, SinkError> {
        // A topic cannot be asked whether a batch reached it: publish again (at least once).
        Ok(false)
    }
}

/// One batch of messages to publish.
pub struct Batch {
    name: String,
    client: PubsubClient,
    topic: String,
    messages: Vec<Message>,
    staged: Option<Message>,
    bytes: u64,
}

impl SinkFile for Batch {
    type Closed = Batch;

    fn name(&self) -> &str {
        &self.name
    }

    fn header_bytes(&self) -> u64 {
        0
    }

    fn stage(&mut self, msg: &Message) -> Result<u64, Refused> {
        let size = super::delta::message_bytes(msg);
        self.staged = Some(msg.clone());
        Ok(size)
    }

    fn commit(&mut self) {
        if let Some(m) = self.staged.take() {
            self.bytes += super::delta::message_bytes(&m);
            self.messages.push(m);
        }
    }

    fn unstage(&mut self, _carry: &mut Vec<u8>) -> Unstaged {
        self.staged = None;
        Unstaged::Restage
    }

    fn close(self) -> Batch {
        self
    }
}

#[async_trait::async_trait]
impl Durable for Batch {
    fn name(&self) -> &str {
        &self.name
    }

    async fn make_durable(self: Box<Self>) -> Result<Written, SinkError> {
        let mut wait = Duration::from_millis(500);
        let mut tries = 0;
        loop {
            tries += 1;
            match self.client.publish(&self.topic, &self.messages).await {
                Ok(_) => return Ok(self.bytes.into()),
                Err(e) if e.retryable() && tries < TRIES => {
                    tracing::warn!(topic = %self.topic, "publish failed, retrying in {wait:?}: {e}");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) => {
                    let retryable = e.retryable();
                    return Err(SinkError::Commit {
                        name: self.name.clone(),
                        source: Box::new(e),
                        retryable,
                    });
                }
            }
        }
    }

    async fn abort(self: Box<Self>) {}
}
