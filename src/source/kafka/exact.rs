//! `--exactly-once`: before the first record of a partition (after every assignment) is written,
//! the destination is asked how far it holds the partition from that record on
//! ([`crate::position::DurableStreams`]: a file of an earlier run by its derived name, a Delta table's
//! `txn` version, a BigQuery table's highest offset); the records up to what it holds are skipped
//! and the offset after it is committed.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer};

use super::consumer::KafkaConsumer;
use super::offsets::{commit_list, Offsets, Tp};
use crate::message::Received;
use crate::position::{DurableStreams, Position};

/// Is `tp`'s record at `at` (`r`) written already by an earlier run? Looks it up in the
/// destination (`durable`) unless what was found before holds it. What is found moves the
/// committed offset past it. `false`: write it (the partition is checked from here on).
pub async fn recover(
    durable: &dyn DurableStreams,
    consumer: &Arc<KafkaConsumer>,
    offsets: &Offsets,
    tp: &Tp,
    at: &Position,
    r: &Received,
) -> bool {
    let offset = at.offset;
    if offsets.skip(tp, offset) {
        return true;
    }
    if offsets.checked(tp) {
        return false;
    }
    let time = r.msg.publish_time_micros;
    // What is looked up: an object name, a `txn` application id, a query.
    let what = durable.lookup(at, time);
    let mut wait = Duration::from_millis(200);
    let found = loop {
        match durable.held_through(at, time).await {
            Ok(found) => break found,
            Err(e) if wait < Duration::from_secs(10) => {
                tracing::warn!(lookup = %what, "Kafka --exactly-once: looking up what an earlier run wrote from {}/{}/{offset} failed ({e}); trying again in {wait:?}", tp.0, tp.1);
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            Err(e) => {
                tracing::error!(lookup = %what, "Kafka partition {}/{} stopped: what an earlier run wrote from record {}/{}/{offset} cannot be read back ({e}); restart to try again", tp.0, tp.1, tp.0, tp.1);
                offsets.stop_partition(tp);
                return true;
            }
        }
    };
    match found {
        Some(last) => {
            tracing::info!(lookup = %what, "Kafka --exactly-once: {}/{} offsets {offset}..={last} are {}; committing {}", tp.0, tp.1, durable.held_in(last), last + 1);
            offsets.found(tp, last);
            let (c, list) = (consumer.clone(), commit_list(&[(tp.clone(), last + 1)]));
            let committed =
                tokio::task::spawn_blocking(move || c.commit(&list, CommitMode::Sync)).await;
            if let Ok(Ok(())) = committed {
                offsets.committed(&[(tp.clone(), last + 1)]);
            }
            // Later records up to `last` are skipped; the one after it is looked up (a table's
            // version is then below it: the partition is checked).
            offsets.skip(tp, offset)
        }
        None => {
            offsets.set_checked(tp);
            false
        }
    }
}
