//! Dead letters and retry backoff, shared by the settle sides (docs/contract.md §2.8, §2.9).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::SettleError;
use crate::message::Message;

/// The message published to the dead-letter topic (or written to the dead-letter file): the
/// original data, attributes and ordering key, plus the five `CloudPubSubDeadLetterSource*`
/// attributes (§2.8).
pub fn dead_letter_message(
    m: &Message,
    attempts: u32,
    project: &str,
    subscription_id: &str,
    error: &str,
) -> Message {
    let mut out = m.clone();
    let t = chrono::DateTime::from_timestamp_micros(m.publish_time_micros).unwrap_or_default();
    let a = &mut out.attributes;
    a.insert(
        "CloudPubSubDeadLetterSourceDeliveryCount".into(),
        attempts.to_string(),
    );
    a.insert(
        "CloudPubSubDeadLetterSourceSubscription".into(),
        subscription_id.to_string(),
    );
    a.insert(
        "CloudPubSubDeadLetterSourceSubscriptionProject".into(),
        project.to_string(),
    );
    a.insert(
        "CloudPubSubDeadLetterSourceTopicPublishTime".into(),
        t.format("%Y-%m-%dT%H:%M:%S%.3f+00:00").to_string(),
    );
    // A message a transform failed says so in its own attribute (Pub/Sub's SMT troubleshooting).
    let why = match crate::transform::is_transform_error(error) {
        true => crate::transform::DEAD_LETTER_ATTRIBUTE,
        false => "CloudPubSubDeadLetterSourceDeliveryErrorMessage",
    };
    a.insert(why.into(), error.to_string());
    out.message_id = String::new();
    out
}

/// `projects/{p}/subscriptions/{s}` → `(p, s)`.
pub fn split_subscription(name: &str) -> (String, String) {
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        ["projects", p, "subscriptions", s] => (p.to_string(), s.to_string()),
        _ => (String::new(), name.to_string()),
    }
}

/// The retry policy's redelivery delay (§2.9): none without a policy, else
/// `min(max, min · 2^(attempt−1))`, with ±20 % jitter so that messages that failed together are
/// not all redelivered at the same moment, never above `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// `(minimum_backoff, maximum_backoff)`; `None` = redeliver at once.
    pub policy: Option<(Duration, Duration)>,
}

impl Backoff {
    /// The delay after delivery `attempt` (1-based) failed; `jitter` in `[0, 1)` (a random draw).
    pub fn delay_with(&self, attempt: u32, jitter: f64) -> Duration {
        let Some((min, max)) = self.policy else {
            return Duration::ZERO;
        };
        let exp = min.saturating_mul(1u32 << (attempt.saturating_sub(1)).min(20));
        let base = exp.min(max);
        base.mul_f64(0.8 + 0.4 * jitter).min(max)
    }

    /// [`Backoff::delay_with`] with a random jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, rand::random::<f64>())
    }

    /// The delay as a Pub/Sub ack deadline: whole seconds, rounded up so that a backoff is never
    /// cut to zero, at most 600 (the deadline's maximum).
    pub fn deadline_secs(delay: Duration) -> i32 {
        (delay.as_secs_f64().ceil() as u64).min(600) as i32
    }
}

/// The dead-letter file of a file-source run (`--dead-letter`): NDJSON, appended and synced
/// before the message counts as done.
pub struct DeadLetterFile {
    path: PathBuf,
    file: std::fs::File,
    /// Deliveries a message gets before it is dead-lettered (the subscription's
    /// `maxDeliveryAttempts`, 5 without a dead-letter policy).
    pub max_attempts: u32,
}

impl DeadLetterFile {
    /// Open (or create) the file for appending. A last line without its newline is the torn
    /// append of a run that crashed while writing it; that message was not settled (the
    /// checkpoint had not passed it), so the line is cut off and the message is written again.
    /// A new file's folder is fsynced, so the file itself survives a power cut.
    pub fn open(path: &Path, max_attempts: u32) -> Result<DeadLetterFile, SettleError> {
        let err = |source| SettleError::DeadLetter {
            path: path.display().to_string(),
            source,
        };
        let existed = path.exists();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(err)?;
        let len = file.metadata().map_err(err)?.len();
        let whole = whole_lines_len(&file, len).map_err(err)?;
        if whole < len {
            tracing::warn!(
                "{}: cutting a torn last line ({} bytes) left by a crashed run; its message is written again",
                path.display(),
                len - whole
            );
            file.set_len(whole)
                .and_then(|()| file.sync_all())
                .map_err(err)?;
        }
        if !existed {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(err)?;
        }
        Ok(DeadLetterFile {
            path: path.to_path_buf(),
            file,
            max_attempts,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append `m` (already carrying the dead-letter attributes) as a REST `PubsubMessage` line
    /// and sync it.
    pub fn write(&mut self, m: &Message) -> Result<(), SettleError> {
        use std::io::Write;
        let mut line = m.to_json_line().into_bytes();
        line.push(b'\n');
        self.file
            .write_all(&line)
            .and_then(|()| self.file.sync_data())
            .map_err(|source| SettleError::DeadLetter {
                path: self.path.display().to_string(),
                source,
            })
    }
}

/// Length of `file` (`len` bytes long) up to and including its last newline (0 when it has none).
fn whole_lines_len(file: &std::fs::File, len: u64) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut end = len;
    let mut buf = vec![0u8; 64 << 10];
    while end > 0 {
        let n = buf.len().min(end as usize);
        let start = end - n as u64;
        file.read_exact_at(&mut buf[..n], start)?;
        if let Some(i) = memchr::memrchr(b'\n', &buf[..n]) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_of_the_dead_letter_file_is_cut_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dl.ndjson");
        std::fs::write(
            &path,
            b"{\"messageId\":\"1\"}\n{\"messageId\":\"2\"}\n{\"mess",
        )
        .unwrap();
        let mut dl = DeadLetterFile::open(&path, 5).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"{\"messageId\":\"1\"}\n{\"messageId\":\"2\"}\n"
        );
        dl.write(&Message {
            message_id: "3".into(),
            data: bytes::Bytes::from_static(b"x"),
            ..Default::default()
        })
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let ids: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["messageId"].to_string())
            .collect();
        assert_eq!(ids, ["\"1\"", "\"2\"", "\"3\""]);
        // A file of one torn line (no newline at all) is emptied; a whole file is left alone.
        std::fs::write(&path, b"{\"mess").unwrap();
        DeadLetterFile::open(&path, 5).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        std::fs::write(&path, b"{}\n").unwrap();
        DeadLetterFile::open(&path, 5).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}\n");
    }

    fn policy(min: u64, max: u64) -> Backoff {
        Backoff {
            policy: Some((Duration::from_secs(min), Duration::from_secs(max))),
        }
    }

    #[test]
    fn backoff_doubles_from_the_minimum_up_to_the_maximum() {
        let b = policy(10, 600);
        // jitter 0.5 is the midpoint: no change.
        let mid: Vec<u64> = (1..=8).map(|a| b.delay_with(a, 0.5).as_secs()).collect();
        assert_eq!(mid, [10, 20, 40, 80, 160, 320, 600, 600]);
        assert_eq!(Backoff { policy: None }.delay_with(3, 0.9), Duration::ZERO);
        // Huge attempt counts saturate instead of overflowing.
        assert_eq!(b.delay_with(u32::MAX, 0.5), Duration::from_secs(600));
    }

    #[test]
    fn backoff_jitter_is_plus_or_minus_20_percent_and_never_above_the_maximum() {
        let b = policy(10, 600);
        assert_eq!(b.delay_with(1, 0.0), Duration::from_secs(8));
        assert_eq!(b.delay_with(1, 1.0), Duration::from_secs(12));
        assert_eq!(b.delay_with(3, 0.0), Duration::from_secs(32));
        // At the maximum the jitter may only lower it.
        assert_eq!(b.delay_with(7, 1.0), Duration::from_secs(600));
        assert_eq!(b.delay_with(7, 0.0), Duration::from_secs(480));
        // Random draws stay inside the band.
        for _ in 0..1000 {
            let d = b.delay(2).as_secs_f64();
            assert!((16.0..=24.0).contains(&d), "{d}");
        }
    }

    #[test]
    fn backoff_rounds_up_to_whole_seconds_for_the_ack_deadline() {
        assert_eq!(Backoff::deadline_secs(Duration::from_millis(0)), 0);
        assert_eq!(Backoff::deadline_secs(Duration::from_millis(1)), 1);
        assert_eq!(Backoff::deadline_secs(Duration::from_millis(8000)), 8);
        assert_eq!(Backoff::deadline_secs(Duration::from_millis(8001)), 9);
        assert_eq!(Backoff::deadline_secs(Duration::from_secs(601)), 600);
        // The smallest policy Pub/Sub allows (0 s) with jitter still redelivers at once.
        let b = policy(0, 0);
        assert_eq!(Backoff::deadline_secs(b.delay(1)), 0);
    }

    #[test]
    fn dead_letter_message_carries_the_five_attributes() {
        let m = Message {
            data: bytes::Bytes::from_static(b"x"),
            message_id: "42".into(),
            publish_time_micros: 1_700_000_000_123_456,
            ordering_key: "k".into(),
            ..Default::default()
        };
        let d = dead_letter_message(&m, 5, "p", "s", "bad row");
        let a = &d.attributes;
        assert_eq!(&a["CloudPubSubDeadLetterSourceDeliveryCount"], "5");
        assert_eq!(&a["CloudPubSubDeadLetterSourceSubscription"], "s");
        assert_eq!(&a["CloudPubSubDeadLetterSourceSubscriptionProject"], "p");
        assert_eq!(
            &a["CloudPubSubDeadLetterSourceTopicPublishTime"],
            "2023-11-14T22:13:20.123+00:00"
        );
        assert_eq!(
            &a["CloudPubSubDeadLetterSourceDeliveryErrorMessage"],
            "bad row"
        );
        assert_eq!(
            (d.data, d.ordering_key, d.message_id),
            (m.data, m.ordering_key, String::new())
        );
        assert_eq!(
            split_subscription("projects/p/subscriptions/s"),
            ("p".into(), "s".into())
        );
    }
}
