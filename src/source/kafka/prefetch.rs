//! What librdkafka may hold before subsink takes a record, derived from `--memory-limit`
//! (docs/operating.md, Memory budget).
//!
//! librdkafka fetches ahead on its own threads: records sit in its queue, and one fetch response
//! at a time is on its way, before [`super::KafkaSource`] takes any. Those bytes cannot be charged
//! to the budget record by record, so they are bounded by configuration and charged as one
//! standing [`crate::resources::Charge`] for the life of the source: librdkafka's share is half
//! the sources' input cap (a quarter of the limit, [`crate::resources::input_cap`]), split evenly
//! between the queue (`queued.max.messages.kbytes`, checked before each fetch) and one fetch
//! response (`fetch.max.bytes`, at least 1 MiB: librdkafka wants it at least `message.max.bytes`).
//! A response may still carry one record batch larger than that (the broker returns the first
//! batch whole so that the consumer makes progress): that batch is the one message past the
//! budget that every broker source may hold (docs/operating.md). Records a partition fetch asks
//! for (`max.partition.fetch.bytes`) are at most a fetch; `queued.min.messages`, the messages
//! librdkafka keeps queued whatever their size, is one per KiB of the queue, so the bookkeeping
//! of many tiny records stays small too. `fetch.queue.backoff.ms` is 20 ms (librdkafka's 1 s
//! would hold every large record a second once it passed the small queue), unless given.
//!
//! A `--kafka-option` for one of these keys is kept when it is at most the derived value (less
//! read-ahead is the operator's choice); a larger one is lowered to it, and the log says so, as
//! Pub/Sub's `--max-outstanding-bytes` is.

use rdkafka::ClientConfig;

/// The least `fetch.max.bytes` (librdkafka refuses one below `message.max.bytes`, 1,000,000 by
/// default).
const MIN_FETCH: u64 = 1 << 20;

/// librdkafka's read-ahead for one memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefetch {
    /// `queued.max.messages.kbytes`, in bytes.
    pub queue: u64,
    /// `fetch.max.bytes`.
    pub fetch: u64,
}

impl Prefetch {
    /// The read-ahead for `limit` (`--memory-limit`): half of the sources' input cap, half of
    /// that queued and half one fetch (module docs).
    pub fn for_limit(limit: u64) -> Prefetch {
        let share = crate::resources::input_cap(Some(limit)) / 2;
        Prefetch {
            queue: (share / 2).max(1 << 10),
            fetch: (share / 2).max(MIN_FETCH),
        }
    }

    /// The bytes charged to the budget for the life of the source: the queue and one fetch.
    pub fn bytes(&self) -> u64 {
        self.queue + self.fetch
    }

    /// The client settings, each `(key, value)`.
    fn settings(&self) -> [(&'static str, u64); 4] {
        [
            ("queued.max.messages.kbytes", self.queue >> 10),
            ("fetch.max.bytes", self.fetch),
            ("max.partition.fetch.bytes", self.fetch.min(MIN_FETCH)),
            ("queued.min.messages", (self.queue >> 10).max(1)),
        ]
    }

    /// How long librdkafka waits before it fetches again once the queue was over its size
    /// (`fetch.queue.backoff.ms`, default 1000): with a queue this small one large record passes
    /// it, and every record would wait a second.
    const QUEUE_BACKOFF_MS: u64 = 20;

    /// Set the read-ahead on `c`, whose `options` (the `--kafka-option`s, already on `c`) keep a
    /// value at most the derived one.
    pub fn apply(&self, c: &mut ClientConfig, options: &[(String, String)]) {
        let given = |key: &str| {
            options
                .iter()
                .rev()
                .find(|(k, _)| {
                    k == key
                        || (key == "max.partition.fetch.bytes" && k == "fetch.message.max.bytes")
                })
                .map(|(_, v)| v.trim().parse::<u64>().ok())
        };
        for (key, derived) in self.settings() {
            match given(key) {
                Some(Some(v)) if v <= derived => continue,
                Some(flag) => tracing::info!(
                    key,
                    value = derived,
                    flag = ?flag,
                    "Kafka read-ahead held to --memory-limit"
                ),
                None => {}
            }
            c.set(key, derived.to_string());
        }
        if given("fetch.queue.backoff.ms").is_none() {
            c.set("fetch.queue.backoff.ms", Self::QUEUE_BACKOFF_MS.to_string());
        }
        // librdkafka refuses a `fetch.max.bytes` under `message.max.bytes`: an operator who raised
        // the latter gets a fetch that large.
        if let Some(Some(m)) = given("message.max.bytes") {
            if m > self.fetch {
                c.set("fetch.max.bytes", m.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derivation docs/operating.md states: at 64 MiB, 4 MiB queued and 4 MiB fetched (half
    /// of the 16 MiB input cap); at 1 GiB, 64 and 64 MiB; never a fetch under 1 MiB.
    #[test]
    fn the_read_ahead_is_half_the_input_cap() {
        let p = Prefetch::for_limit(64 << 20);
        assert_eq!((p.queue, p.fetch, p.bytes()), (4 << 20, 4 << 20, 8 << 20));
        assert_eq!(
            p.settings(),
            [
                ("queued.max.messages.kbytes", 4096),
                ("fetch.max.bytes", 4 << 20),
                ("max.partition.fetch.bytes", 1 << 20),
                ("queued.min.messages", 4096),
            ]
        );
        let p = Prefetch::for_limit(1 << 30);
        assert_eq!((p.queue, p.fetch), (64 << 20, 64 << 20));
        let p = Prefetch::for_limit(4 << 20);
        assert_eq!((p.queue, p.fetch), (256 << 10, 1 << 20));
    }

    #[test]
    fn an_option_above_the_derived_value_is_lowered_and_one_below_kept() {
        let p = Prefetch::for_limit(64 << 20);
        let options = vec![
            (
                "queued.max.messages.kbytes".to_string(),
                "65536".to_string(),
            ),
            ("fetch.max.bytes".to_string(), "2000000".to_string()),
        ];
        let mut c = ClientConfig::new();
        for (k, v) in &options {
            c.set(k, v);
        }
        p.apply(&mut c, &options);
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("4096"));
        assert_eq!(c.get("fetch.max.bytes"), Some("2000000"));
        assert_eq!(c.get("max.partition.fetch.bytes"), Some("1048576"));
        assert_eq!(c.get("queued.min.messages"), Some("4096"));
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("20"));
    }
}
