//! Batching: when an open file is finalized (docs/contract.md §3.5). Pure: no I/O, no clock of its own.
//!
//! A file is finalized by whichever comes first: `max_duration` after its first write (the timer
//! fires even if no message arrives), `max_bytes` serialized bytes, `max_messages` messages, or the
//! end of input. Before a message is appended, [`Limits::admit`] says whether it fits; a message
//! that does not fit finalizes the current file first, and an empty file always accepts one
//! message, so a message larger than `max_bytes` gets a file of its own (docs/contract.md §6 Q2).

use std::time::Duration;

/// Why a file was finalized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushReason {
    MaxDuration,
    MaxBytes,
    MaxMessages,
    EndOfInput,
    /// Shutdown, a failed source, or another reason to finalize early (docs/contract.md §3.5 allows it).
    Early,
    /// The process neared its memory budget: the largest open file is finalized early.
    Memory,
    /// The broker's flow control holds the source back while what is outstanding sits in open
    /// files: the open file that frees most is finalized early ([`crate::flow`]).
    FlowControl,
}

/// The finalize conditions of a Cloud Storage subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_duration: Duration,
    pub max_bytes: Option<u64>,
    pub max_messages: Option<u64>,
}

/// What an open file holds so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStats {
    /// Serialized bytes, header included.
    pub bytes: u64,
    pub messages: u64,
}

/// The answer of [`Limits::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Append to the open file.
    Append,
    /// Finalize the open file first, then append to a new one.
    FinalizeFirst(FlushReason),
}

impl Limits {
    /// May a message adding `len` bytes be appended to a file with `stats`?
    pub fn admit(&self, stats: FileStats, len: u64) -> Admit {
        if stats.messages == 0 {
            return Admit::Append;
        }
        if let Some(max) = self.max_messages {
            if stats.messages + 1 > max {
                return Admit::FinalizeFirst(FlushReason::MaxMessages);
            }
        }
        if let Some(max) = self.max_bytes {
            if stats.bytes + len > max {
                return Admit::FinalizeFirst(FlushReason::MaxBytes);
            }
        }
        Admit::Append
    }

    /// After an append: is the file full, so that waiting for the next message is pointless?
    pub fn full(&self, stats: FileStats) -> Option<FlushReason> {
        if self.max_messages.is_some_and(|max| stats.messages >= max) {
            return Some(FlushReason::MaxMessages);
        }
        if self.max_bytes.is_some_and(|max| stats.bytes >= max) {
            return Some(FlushReason::MaxBytes);
        }
        None
    }
}

/// Split a sequence of message sizes into files, as the writer does (header bytes per file given).
/// Used by the property tests; the writer applies the same two calls message by message.
pub fn plan(limits: &Limits, header: u64, sizes: &[u64]) -> Vec<(Vec<usize>, FlushReason)> {
    let mut files = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut stats = FileStats {
        bytes: header,
        messages: 0,
    };
    for (i, &len) in sizes.iter().enumerate() {
        if let Admit::FinalizeFirst(reason) = limits.admit(stats, len) {
            files.push((std::mem::take(&mut current), reason));
            stats = FileStats {
                bytes: header,
                messages: 0,
            };
        }
        current.push(i);
        stats.bytes += len;
        stats.messages += 1;
        if let Some(reason) = limits.full(stats) {
            files.push((std::mem::take(&mut current), reason));
            stats = FileStats {
                bytes: header,
                messages: 0,
            };
        }
    }
    if !current.is_empty() {
        files.push((current, FlushReason::EndOfInput));
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(bytes: Option<u64>, messages: Option<u64>) -> Limits {
        Limits {
            max_duration: Duration::from_secs(60),
            max_bytes: bytes,
            max_messages: messages,
        }
    }

    #[test]
    fn oversize_message_gets_a_file_of_its_own() {
        let files = plan(&limits(Some(100), None), 0, &[10, 500, 10]);
        let idx: Vec<Vec<usize>> = files.iter().map(|f| f.0.clone()).collect();
        assert_eq!(idx, vec![vec![0], vec![1], vec![2]]);
        assert_eq!(files[0].1, FlushReason::MaxBytes);
        assert_eq!(files[1].1, FlushReason::MaxBytes);
        assert_eq!(files[2].1, FlushReason::EndOfInput);
    }

    #[test]
    fn exact_fit_finalizes_at_once() {
        let files = plan(&limits(Some(30), None), 0, &[10, 10, 10, 10]);
        assert_eq!(files[0], (vec![0, 1, 2], FlushReason::MaxBytes));
        assert_eq!(files[1], (vec![3], FlushReason::EndOfInput));
        let files = plan(&limits(None, Some(2)), 0, &[1, 1, 1]);
        assert_eq!(files[0], (vec![0, 1], FlushReason::MaxMessages));
    }

    proptest! {
        #[test]
        fn no_loss_no_duplicate_no_reorder_limits_hold(
            sizes in prop::collection::vec(1u64..2000, 0..400),
            max_bytes in prop::option::of(1u64..5000),
            max_messages in prop::option::of(1u64..50),
            header in 0u64..64,
        ) {
            let l = limits(max_bytes, max_messages);
            let files = plan(&l, header, &sizes);
            let flat: Vec<usize> = files.iter().flat_map(|f| f.0.iter().copied()).collect();
            prop_assert_eq!(flat, (0..sizes.len()).collect::<Vec<_>>());
            for (f, _) in &files {
                prop_assert!(!f.is_empty());
                if let Some(m) = max_messages {
                    prop_assert!(f.len() as u64 <= m);
                }
                if let Some(b) = max_bytes {
                    let total: u64 = header + f.iter().map(|&i| sizes[i]).sum::<u64>();
                    // Only a file of a single oversize message may exceed max_bytes.
                    prop_assert!(total <= b || f.len() == 1, "{} > {} with {} messages", total, b, f.len());
                }
            }
            // Files are as full as the limits allow: the next file's first message did not fit.
            for w in files.windows(2) {
                let (f, reason) = &w[0];
                let next_len = sizes[w[1].0[0]];
                let total: u64 = header + f.iter().map(|&i| sizes[i]).sum::<u64>();
                match reason {
                    FlushReason::MaxBytes => prop_assert!(total + next_len > max_bytes.unwrap() || total >= max_bytes.unwrap()),
                    FlushReason::MaxMessages => prop_assert_eq!(f.len() as u64, max_messages.unwrap()),
                    _ => prop_assert!(false, "unexpected reason {:?}", reason),
                }
            }
        }
    }
}
