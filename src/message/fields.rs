//! The field names a wire message may carry, and the nearest of them to a name that is none
//! (`atributes` → `attributes`): an unknown field is bad input, as Pub/Sub's REST API refuses
//! one, never a field silently dropped (docs/sources.md, Input format).

/// A `PubsubMessage`'s fields, each with the snake_case spelling accepted too.
pub const MESSAGE: &[&str] = &[
    "data",
    "attributes",
    "messageId",
    "message_id",
    "publishTime",
    "publish_time",
    "orderingKey",
    "ordering_key",
];

/// The pull form's (`ReceivedMessage`) fields around its `message`.
pub const RECEIVED: &[&str] = &[
    "ackId",
    "ack_id",
    "message",
    "deliveryAttempt",
    "delivery_attempt",
];

/// The push envelope's fields around its `message`.
pub const ENVELOPE: &[&str] = &["message", "subscription", "deliveryAttempt"];

/// The name of `known` nearest to `field`, when one is near enough to be what was meant: the same
/// name but for case and `_` (`messageID`, `Message_Id`), or within a few edits of it
/// (Damerau–Levenshtein, at most 2, and at most a third of the name).
pub fn nearest(field: &str, known: &[&'static str]) -> Option<&'static str> {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect()
    };
    let f = norm(field);
    let (best, distance) = known
        .iter()
        .map(|k| (*k, strsim::damerau_levenshtein(&f, &norm(k))))
        .min_by_key(|(_, d)| *d)?;
    let near = distance == 0 || (distance <= 2 && distance * 3 <= f.chars().count());
    near.then_some(best)
}

/// `known` for a message: the camelCase names (the snake_case ones are accepted, not listed).
pub fn listed(known: &[&str]) -> String {
    known
        .iter()
        .filter(|k| !k.contains('_'))
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_names_what_was_meant() {
        for (typo, want) in [
            ("atributes", Some("attributes")),
            ("messageID", Some("messageId")),
            ("Message_Id", Some("messageId")),
            ("publishtime", Some("publishTime")),
            ("publish-time", Some("publishTime")),
            ("orderingKy", Some("orderingKey")),
            ("orderKey", None),
            ("dta", Some("data")),
            ("attributess", Some("attributes")),
            ("color", None),
            ("x", None),
            ("payload", None),
        ] {
            assert_eq!(nearest(typo, MESSAGE), want, "{typo}");
        }
        assert_eq!(nearest("ackID", RECEIVED), Some("ackId"));
        assert_eq!(nearest("mesage", ENVELOPE), Some("message"));
        assert_eq!(nearest("subscriptions", ENVELOPE), Some("subscription"));
        assert_eq!(
            listed(MESSAGE),
            "data, attributes, messageId, publishTime, orderingKey"
        );
    }
}
