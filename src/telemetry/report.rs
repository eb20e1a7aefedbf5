//! The run summary's counts turned into the metrics' counters, and the gauges set: one place that
//! knows both, called by the pipeline every second and once at the end.

use std::time::Duration;

use tokio::time::Instant;

use super::metrics::{RetryKind, SubscriptionMetrics};
use crate::summary::RunSummary;

/// What a pipeline holds right now, for the gauges.
#[derive(Debug, Clone, Copy)]
pub struct Holding {
    /// Files open.
    pub open_files: usize,
    /// Bytes held by open files and by files being made durable.
    pub buffered_bytes: u64,
    /// When the oldest file not yet durable was opened.
    pub oldest: Option<Instant>,
}

/// Counters by difference since the last report (the summary counts from the start).
#[derive(Default)]
pub struct Report {
    last: RunSummary,
    reconnects: u64,
}

impl Report {
    pub fn counters(&mut self, m: &SubscriptionMetrics, s: &RunSummary, reconnects: u64) {
        for _ in self.reconnects..reconnects {
            m.retried(RetryKind::Stream);
        }
        self.reconnects = self.reconnects.max(reconnects);
        let l = &self.last;
        m.received(s.messages_read - l.messages_read);
        m.filtered(s.messages_filtered - l.messages_filtered);
        m.bad((s.bad_lines + s.bad_messages) - (l.bad_lines + l.bad_messages));
        m.acked(s.messages_acked - l.messages_acked);
        m.nacked(s.messages_nacked - l.messages_nacked);
        m.dead_lettered(s.messages_dead_lettered - l.messages_dead_lettered);
        self.last = RunSummary {
            messages_read: s.messages_read,
            messages_filtered: s.messages_filtered,
            bad_lines: s.bad_lines,
            bad_messages: s.bad_messages,
            messages_acked: s.messages_acked,
            messages_nacked: s.messages_nacked,
            messages_dead_lettered: s.messages_dead_lettered,
            ..RunSummary::default()
        };
    }

    pub fn gauges(&self, m: &SubscriptionMetrics, h: Holding) {
        m.open_files(h.open_files);
        m.buffered_bytes(h.buffered_bytes);
        m.oldest_unacked_age(h.oldest.map_or(Duration::ZERO, |t| t.elapsed()));
    }
}
