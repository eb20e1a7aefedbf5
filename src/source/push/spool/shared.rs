//! What the spool's writer, its reader and its settle side share: spool offsets, settings, errors,
//! stats and the state behind one `Arc` ([`Shared`]).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;

/// Bits of a spool offset that hold the offset within its segment.
pub const SEGMENT_SHIFT: u32 = 40;
/// How long appends are refused at once after the spool failed to write, before one tries again.
pub const RETRY_UNWRITABLE_AFTER: Duration = Duration::from_secs(1);
/// Bytes one group commit writes at most (more waits for the next one).
pub(super) const MAX_GROUP: usize = 8 << 20;
/// The oldest-message clock keeps one mark per this interval of appends.
pub(super) const AGE_GRAIN: Duration = Duration::from_millis(100);

/// The spool offset of byte `offset` of segment `seq`: `seq << 40 | offset`, growing through
/// the whole spool.
pub fn spool_offset(seq: u64, offset: u64) -> u64 {
    (seq << SEGMENT_SHIFT) | offset
}

/// `(seq, offset)` of a [`spool_offset`].
pub fn split_spool_offset(pos: u64) -> (u64, u64) {
    (pos >> SEGMENT_SHIFT, pos & ((1 << SEGMENT_SHIFT) - 1))
}

/// The spool's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolSettings {
    pub dir: PathBuf,
    /// Bytes the segments may hold on disk; past it appends are refused ([`SpoolError::Full`]).
    pub max_bytes: u64,
    /// A segment is sealed once it holds this many bytes.
    pub segment_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {dir}: {source}")]
    Io {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("spool {dir} is full: {bytes} bytes of at most {max}")]
    Full { dir: String, bytes: u64, max: u64 },
    #[error("spool {dir} cannot be written: {reason}")]
    Unwritable { dir: String, reason: String },
    #[error("the spool is closed")]
    Closed,
}

/// What the spool holds, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpoolStats {
    /// Bytes of the segments on disk.
    pub bytes: u64,
    pub segments: u64,
    /// Age of the oldest message not yet durable in the destination (zero when there is none).
    pub oldest: Duration,
}

/// What the spool holds that is not yet durable in the destination ([`SpoolHandle::left`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpoolLeft {
    pub messages: u64,
    pub bytes: u64,
    /// Segments holding some of them.
    pub segments: u64,
}

pub(super) struct Append {
    pub(super) line: Vec<u8>,
    pub(super) done: oneshot::Sender<Result<u64, SpoolError>>,
}

/// State the writer, the reader and the settle side share.
pub(super) struct Shared {
    pub(super) dir: PathBuf,
    pub(super) max_bytes: u64,
    /// Bytes of the segments on disk.
    pub(super) bytes: AtomicU64,
    /// Bytes queued for the writer and not yet written.
    pub(super) queued: AtomicU64,
    /// Segment seq → its length, for every segment on disk (the newest one's grows).
    pub(super) segments: Mutex<BTreeMap<u64, u64>>,
    /// The last write failure: when, and why.
    pub(super) unwritable: Mutex<Option<(Instant, String)>>,
    /// `unwritable` holds a failure (read without the lock on every append).
    pub(super) failing: AtomicBool,
    /// (position, wall time) marks: the message at a position at or after a mark was appended at or
    /// after its time. Trimmed below the watermark.
    pub(super) ages: Mutex<VecDeque<(u64, SystemTime)>>,
    /// Everything before it is durable in the destination.
    pub(super) watermark: AtomicU64,
    /// Everything before it is in the spool and fsynced.
    pub(super) committed: AtomicU64,
    /// The in-run retry of files that failed ([`SpoolHandle::retry_from`]).
    pub(super) retry: Retry,
}

/// The in-run retry of failed files, between the settle side (which asks for it) and the reader
/// (which rewinds). A retry reads the spool again from the first failed message once nothing is
/// open or being made durable — so every file still holds messages in spool order — and while
/// it reads below the position it had reached (`replay_high`), the settle side writes only the
/// messages of the failed files again.
#[derive(Default)]
pub(super) struct Retry {
    /// Read again from this position (and its line number) once the time has come.
    pub(super) due: Mutex<Option<(u64, u64, Instant)>>,
    /// No file is open or being made durable (the settle side says).
    pub(super) quiet: AtomicBool,
    /// The reader waits for quiet to rewind (the pipeline finalizes its open files).
    pub(super) holding: AtomicBool,
    /// While reading again: the position reading had reached before the rewind; 0 otherwise.
    pub(super) replay_high: AtomicU64,
    /// Rewinds so far.
    pub(super) rewinds: AtomicU64,
}

impl Shared {
    pub(super) fn dir_name(&self) -> String {
        self.dir.display().to_string()
    }

    pub(super) fn seg_path(&self, seq: u64) -> PathBuf {
        segment_path(&self.dir, seq)
    }
}

pub(super) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.seg"))
}
