//! [`AckRef`]: how a pulled message in a file is settled later.

use crate::message::{Message, Received};

/// A pulled message inside a file: the handle its source settles it with, and what dead-lettering
/// it would need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckRef {
    /// The source's handle for this delivery (a Pub/Sub ack id).
    pub ack_id: String,
    pub message_id: String,
    /// Delivery attempt this delivery is (1-based): the server's count, or subsink's own.
    pub attempt: u32,
    /// The message's ordering key ("" for none; kept only with message ordering): a failed
    /// delivery blocks its key.
    pub ordering_key: String,
    /// The message itself, kept only when a failure of this delivery would dead-letter it.
    pub kept: Option<Message>,
    /// A positioned source: where the message sits in its stream ([`Receipt::position`]).
    ///
    /// [`Receipt::position`]: crate::message::Receipt::position
    pub position: Option<std::sync::Arc<crate::position::Position>>,
}

impl AckRef {
    /// The reference of delivery `attempt` of `r`: the message itself is kept only when a failure
    /// of this delivery would dead-letter it (`attempt` ≥ `dead_letter_after`, the subscription's
    /// max delivery attempts when it has a dead-letter destination).
    pub fn of(
        r: &Received,
        attempt: u32,
        dead_letter_after: Option<u32>,
        ordering_key: String,
    ) -> AckRef {
        AckRef {
            ack_id: r.receipt.ack_id.clone().unwrap_or_default(),
            message_id: r.msg.message_id.clone(),
            attempt,
            ordering_key,
            kept: dead_letter_after
                .is_some_and(|max| attempt >= max)
                .then(|| r.msg.clone()),
            position: r.receipt.position.clone(),
        }
    }
}
