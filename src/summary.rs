//! What a run did: counts, the objects written, what is not done and why. Printed as JSON by the
//! binary; filled in by the pipeline (`app`) and the settle side (`settle`).

use serde::Serialize;

/// A file whose messages are not done.
#[derive(Debug, Clone, Serialize)]
pub struct FailedObject {
    pub object: String,
    pub error: String,
    pub messages: u64,
    pub first_line: u64,
    pub last_line: u64,
    pub first_message_id: String,
    pub last_message_id: String,
}

/// What a run did; printed as JSON by the binary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// Where messages were read from (`subsink run`: the `--source`, credentials never shown).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// Where they were written: the bucket, table or topic URL (`subsink run`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination: String,
    pub messages_read: u64,
    pub messages_written: u64,
    /// Messages a previous run already wrote (found in the checkpoint), not written again.
    pub messages_already_written: u64,
    /// Messages the subscription's filter did not match: settled, not written.
    pub messages_filtered: u64,
    pub bad_lines: u64,
    pub bad_messages: u64,
    /// Pub/Sub: messages acked after their object was durable (filtered and dead-lettered ones
    /// are counted apart); a file or archive source: messages written that the checkpoint's
    /// watermark passed (with or without `--checkpoint`).
    pub messages_acked: u64,
    /// Pub/Sub: messages handed back for redelivery.
    pub messages_nacked: u64,
    /// Pub/Sub: messages published to the dead-letter topic (then acked).
    pub messages_dead_lettered: u64,
    /// File source, table writer: messages that failed alone and are not done (not written,
    /// not dead-lettered); the checkpoint keeps them for the next run.
    pub messages_failed: u64,
    /// The first [`MAX_LISTED_FAILURES`] of them, with line, id and the rule broken.
    pub failed_messages: Vec<FailedMessage>,
    /// Objects written, in the order their files were opened.
    pub objects: Vec<String>,
    pub failed_objects: Vec<FailedObject>,
    /// Why reading stopped before the end of input, if it did.
    pub stopped: Option<String>,
    /// The run was asked to stop (signal) and stopped gracefully.
    pub shutdown: bool,
    /// Archive source: the objects listed, read, skipped (not export objects) and broken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveSummary>,
    /// The process's peak resident memory at the end of the run (Linux: `VmHWM`, its own since
    /// it started, whatever its parent held), for sizing a container against `--memory-limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
}

/// The process's peak resident memory (`VmHWM` of /proc/self/status), where the system says it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// What an archive source read (`--source s3://…`, docs/replay.md).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ArchiveSummary {
    pub objects_listed: u64,
    pub objects_read: u64,
    /// Not export objects (name, time range or the archive subscription's settings): logged.
    pub objects_skipped: u64,
    /// Truncated or corrupt: reported with the object and the record where they broke.
    pub objects_broken: u64,
    pub bytes_read: u64,
}

/// A message that failed alone, in the run summary.
#[derive(Debug, Clone, Serialize)]
pub struct FailedMessage {
    pub line: u64,
    pub message_id: String,
    pub attempts: u32,
    pub error: String,
}

/// How many failed messages the summary lists (all are counted).
pub const MAX_LISTED_FAILURES: usize = 100;

impl RunSummary {
    /// Did every message read end up durable (or settled as documented)? A Pub/Sub run counts as
    /// fine when failed messages were handed back for redelivery: Pub/Sub keeps them.
    pub fn ok(&self, pubsub: bool) -> bool {
        self.stopped.is_none()
            && (pubsub || (self.failed_objects.is_empty() && self.messages_failed == 0))
    }
}
