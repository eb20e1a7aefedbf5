//! What the Kafka source and its settle side share: per assigned partition, the offsets delivered
//! and not yet settled, and the watermark that may be committed; the record ids.
//!
//! A record's position rides on its receipt and its settle reference ([`tp_of`]); the settle
//! side is handed the ids of durable records only ([`Offsets::settle`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use crate::position::{parse_message_id, Position};

/// Topic and partition.
pub type Tp = (String, i32);

/// A record's topic and partition, and its offset, from its position.
pub fn tp_of(at: Option<&Position>) -> Option<(Tp, i64)> {
    let at = at?;
    Some(((at.key.stream.clone(), at.key.part), at.offset))
}

/// One assigned partition's delivered and unsettled records.
#[derive(Debug, Default)]
struct Partition {
    /// Offset → flow-control bytes of the record, for every record delivered and not settled.
    outstanding: BTreeMap<i64, u64>,
    /// One past the highest offset delivered.
    next: i64,
    /// The offset last committed (or found committed: the first delivered), `None` before any.
    committed: Option<i64>,
    /// Stopped on a record that could not be written nor dead-lettered.
    stopped: bool,
    /// `--exactly-once`: the next record was looked up ([`super::exact`]): the destination holds
    /// nothing of the partition from it on.
    checked: bool,
    /// `--exactly-once`: records up to this offset are in a file of an earlier run.
    skip_through: Option<i64>,
}

impl Partition {
    /// The offset to commit: every record below it is settled.
    fn watermark(&self) -> i64 {
        self.outstanding.keys().next().copied().unwrap_or(self.next)
    }
}

/// What the source and its settle side share: per assigned partition, the records delivered and
/// not settled (their watermark is what may be committed), and the totals flow control counts.
#[derive(Debug, Default)]
pub struct Offsets {
    parts: Mutex<State>,
    /// Something was settled: the source looks at flow control again.
    pub settled: Notify,
    /// A rebalance happened: the source pauses the new assignment if it is paused.
    pub(super) rebalanced: AtomicBool,
    /// No broker answers (librdkafka's all-brokers-down), until the next record or assignment.
    pub(super) down: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    parts: HashMap<Tp, Partition>,
    messages: u64,
    bytes: u64,
}

impl Offsets {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.parts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A record was delivered (again, for a redelivery: then it is outstanding already).
    pub(super) fn delivered(&self, tp: &Tp, offset: i64, bytes: u64) {
        let mut s = self.lock();
        let p = s.parts.entry(tp.clone()).or_default();
        if p.committed.is_none() {
            // Read from the group's committed offset (or the reset position): nothing to commit
            // below it.
            p.committed = Some(offset);
        }
        p.next = p.next.max(offset + 1);
        let new = p.outstanding.insert(offset, bytes).is_none();
        if new {
            s.messages += 1;
            s.bytes += bytes;
        }
    }

    /// The records `ids` (`TOPIC/PARTITION/OFFSET`) are settled. Ids of partitions no longer
    /// assigned are ignored (their next owner reads them again).
    pub fn settle<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        let mut s = self.lock();
        let (mut messages, mut bytes) = (0, 0);
        for id in ids {
            let Some((topic, partition, offset)) = parse_message_id(id) else {
                continue;
            };
            let tp = (topic.to_string(), partition);
            if let Some(b) = s
                .parts
                .get_mut(&tp)
                .and_then(|p| p.outstanding.remove(&offset))
            {
                messages += 1;
                bytes += b;
            }
        }
        s.messages -= messages;
        s.bytes -= bytes;
        drop(s);
        if messages > 0 {
            self.settled.notify_one();
        }
    }

    /// The partitions whose watermark is past their committed offset, with that watermark.
    pub fn to_commit(&self) -> Vec<(Tp, i64)> {
        let s = self.lock();
        s.parts
            .iter()
            .filter_map(|(tp, p)| {
                let w = p.watermark();
                (p.committed.is_some_and(|c| w > c)).then(|| (tp.clone(), w))
            })
            .collect()
    }

    /// `offsets` were committed.
    pub fn committed(&self, offsets: &[(Tp, i64)]) {
        let mut s = self.lock();
        for (tp, o) in offsets {
            if let Some(p) = s.parts.get_mut(tp) {
                p.committed = Some(p.committed.map_or(*o, |c| c.max(*o)));
            }
        }
    }

    /// `--exactly-once`: has `tp`'s next record been looked up?
    pub(super) fn checked(&self, tp: &Tp) -> bool {
        self.lock().parts.get(tp).is_some_and(|p| p.checked)
    }

    /// `--exactly-once`: what to do with `tp`'s record `offset` before it is looked up: `true`
    /// when a file of an earlier run holds it (skipped: settled as it is).
    pub(super) fn skip(&self, tp: &Tp, offset: i64) -> bool {
        let mut s = self.lock();
        let p = s.parts.entry(tp.clone()).or_default();
        if p.committed.is_none() {
            p.committed = Some(offset);
        }
        match p.skip_through {
            Some(last) if offset <= last => {
                p.next = p.next.max(offset + 1);
                true
            }
            _ => false,
        }
    }

    /// `--exactly-once`: a file of an earlier run holds `tp`'s records up to `last`; the record
    /// after it is looked up next.
    pub(super) fn found(&self, tp: &Tp, last: i64) {
        let mut s = self.lock();
        let p = s.parts.entry(tp.clone()).or_default();
        p.skip_through = Some(last);
        p.next = p.next.max(last + 1);
    }

    /// `--exactly-once`: `tp`'s next record starts no file of an earlier run.
    pub(super) fn set_checked(&self, tp: &Tp) {
        if let Some(p) = self.lock().parts.get_mut(tp) {
            p.checked = true;
        }
    }

    /// Is `tp`'s partition stopped (or no longer assigned)?
    pub fn is_stopped(&self, tp: &Tp) -> bool {
        self.lock().parts.get(tp).is_none_or(|p| p.stopped)
    }

    /// `--exactly-once`: `tp`'s record `offset` is not written (its partition stopped): it no
    /// longer counts for flow control. The watermark stays below the record that stopped the
    /// partition (still outstanding), so nothing past it is committed.
    pub fn forget(&self, tp: &Tp, offset: i64) {
        let mut s = self.lock();
        let Some(p) = s.parts.get_mut(tp) else {
            return;
        };
        if p.outstanding.keys().next().is_some_and(|low| *low < offset) {
            if let Some(b) = p.outstanding.remove(&offset) {
                s.messages -= 1;
                s.bytes -= b;
            }
        }
    }

    /// Is `tp` assigned here?
    pub fn is_assigned(&self, tp: &Tp) -> bool {
        self.lock().parts.contains_key(tp)
    }

    /// Stop `tp`'s partition: its watermark stays where it is; the source pauses it.
    pub fn stop_partition(&self, tp: &Tp) {
        if let Some(p) = self.lock().parts.get_mut(tp) {
            p.stopped = true;
        }
        self.rebalanced.store(true, Ordering::SeqCst);
        self.settled.notify_one();
    }

    /// The partitions stopped on a record.
    pub(super) fn stopped(&self) -> Vec<Tp> {
        self.lock()
            .parts
            .iter()
            .filter(|(_, p)| p.stopped)
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    /// Released partitions: forgotten, their records no longer counted.
    pub(super) fn release(&self, tps: &[Tp]) {
        let mut s = self.lock();
        for tp in tps {
            if let Some(p) = s.parts.remove(tp) {
                s.messages -= p.outstanding.len() as u64;
                s.bytes -= p.outstanding.values().sum::<u64>();
            }
        }
    }

    /// The watermarks of `tps` that are past their committed offsets.
    pub(super) fn watermarks_of(&self, tps: &[Tp]) -> Vec<(Tp, i64)> {
        let s = self.lock();
        tps.iter()
            .filter_map(|tp| {
                let p = s.parts.get(tp)?;
                let w = p.watermark();
                p.committed.is_some_and(|c| w > c).then(|| (tp.clone(), w))
            })
            .collect()
    }

    /// Records and bytes delivered and not settled.
    pub fn outstanding(&self) -> (u64, u64) {
        let s = self.lock();
        (s.messages, s.bytes)
    }
}

/// A list of partitions with the offsets to commit.
pub fn commit_list(offsets: &[(Tp, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for ((t, p), o) in offsets {
        let _ = tpl.add_partition_offset(t, *p, Offset::Offset(*o));
    }
    tpl
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_watermarks_are_contiguous() {
        assert_eq!(
            parse_message_id("orders.eu/3/42"),
            Some(("orders.eu", 3, 42))
        );
        assert_eq!(parse_message_id("x/y"), None);
        let o = Offsets::default();
        let tp: Tp = ("t".into(), 0);
        for off in 10..15 {
            o.delivered(&tp, off, 1);
        }
        assert_eq!(o.to_commit(), vec![]);
        o.settle(["t/0/11", "t/0/12"]);
        // 10 is not settled: nothing to commit.
        assert_eq!(o.to_commit(), vec![]);
        o.settle(["t/0/10"]);
        assert_eq!(o.to_commit(), vec![(tp.clone(), 13)]);
        o.committed(&[(tp.clone(), 13)]);
        o.settle(["t/0/13", "t/0/14", "other/0/1"]);
        assert_eq!(o.to_commit(), vec![(tp.clone(), 15)]);
        assert_eq!(o.outstanding(), (0, 0));
        o.delivered(&tp, 15, 7);
        o.delivered(&tp, 15, 7);
        assert_eq!(o.outstanding(), (1, 7));
        o.release(std::slice::from_ref(&tp));
        assert_eq!(o.outstanding(), (0, 0));
        o.settle(["t/0/15"]);
        assert_eq!(o.outstanding(), (0, 0));
    }

    #[test]
    fn exactly_once_skips_what_a_found_file_holds_and_a_stop_holds_the_watermark() {
        let o = Offsets::default();
        let tp: Tp = ("t".into(), 0);
        // The first record read is at the committed offset 10; a file of a killed run holds 10..=14.
        assert!(!o.skip(&tp, 10));
        o.found(&tp, 14);
        assert!(o.skip(&tp, 10) && o.skip(&tp, 14));
        assert!(!o.skip(&tp, 15));
        assert_eq!(o.to_commit(), vec![(tp.clone(), 15)]);
        assert!(!o.checked(&tp));
        o.set_checked(&tp);
        assert!(o.checked(&tp));
        // 15 failed: the partition stops; what comes after it is not written and not counted.
        o.delivered(&tp, 15, 1);
        o.delivered(&tp, 16, 1);
        o.stop_partition(&tp);
        assert!(o.is_stopped(&tp));
        o.forget(&tp, 16);
        o.forget(&tp, 15);
        assert_eq!(o.outstanding(), (1, 1));
        assert_eq!(o.to_commit(), vec![(tp.clone(), 15)]);
    }
}
