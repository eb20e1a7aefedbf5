//! Every metric subsink exports, named in one place, and the per-subscription handle the pipeline
//! updates.
//!
//! The registry is [`prometheus_client`]'s (the Prometheus project's Rust client): an explicit
//! [`Registry`] rather than a process-global recorder, so each test and each `serve` pipeline can
//! own or share one deliberately, and label sets are typed. It renders the OpenMetrics text format
//! (`# EOF` terminated), which Prometheus scrapes natively.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `subsink_messages_received_total` | counter | `subscription` | messages taken from the source (file lines or pulled messages) |
//! | `subsink_messages_written_total` | counter | `subscription` | messages in objects / table commits that are durable |
//! | `subsink_messages_acked_total` | counter | `subscription` | messages settled: acked (Pub/Sub) or passed by the checkpoint (file) |
//! | `subsink_messages_nacked_total` | counter | `subscription` | messages nacked (or, for a file, left not done) |
//! | `subsink_messages_dead_lettered_total` | counter | `subscription` | messages forwarded to the dead-letter topic or file |
//! | `subsink_messages_filtered_total` | counter | `subscription` | messages the subscription's filter passed over |
//! | `subsink_messages_bad_total` | counter | `subscription` | malformed input lines, messages that do not encode or convert |
//! | `subsink_bytes_written_total` | counter | `subscription` | bytes of durable objects / Parquet data files |
//! | `subsink_files_finalized_total` | counter | `subscription`, `reason` | files closed, by why (see [`FinalizeReason`]) |
//! | `subsink_upload_duration_seconds` | histogram | `subscription`, `kind` | finalize → durable: object uploads (`kind="object"`) and Delta commits (`kind="commit"`) |
//! | `subsink_open_files` | gauge | `subscription` | files open for writing now |
//! | `subsink_buffered_bytes` | gauge | `subscription` | bytes held in memory for open and uploading files |
//! | `subsink_oldest_unacked_age_seconds` | gauge | `subscription` | age of the oldest received message not yet settled (0 when none) |
//! | `subsink_retries_total` | counter | `subscription`, `kind` | retried operations, by [`RetryKind`] |
//! | `subsink_archive_objects_listed` | gauge | `subscription` | archive source: objects listed under the archive's URL |
//! | `subsink_archive_objects_total` | counter | `subscription`, `outcome` | archive source: objects `read`, `skipped` (not export objects) or `broken` (truncated or corrupt) |
//! | `subsink_archive_bytes_read_total` | counter | `subscription` | archive source: bytes fetched from the archive's objects |
//! | `subsink_build_info` | gauge | `version` | always 1; the running version |

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::batch::FlushReason;

/// Why a file was finalized: the `reason` label of `subsink_files_finalized_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinalizeReason {
    MaxDuration,
    MaxBytes,
    MaxMessages,
    EndOfInput,
    Shutdown,
    /// Finalized early because the process neared its memory budget.
    Memory,
    /// Finalized early because the broker's flow control held the source back.
    FlowControl,
}

impl FinalizeReason {
    pub const ALL: [FinalizeReason; 7] = [
        FinalizeReason::MaxDuration,
        FinalizeReason::MaxBytes,
        FinalizeReason::MaxMessages,
        FinalizeReason::EndOfInput,
        FinalizeReason::Shutdown,
        FinalizeReason::Memory,
        FinalizeReason::FlowControl,
    ];

    /// The label value (and the word in log lines).
    pub fn as_str(self) -> &'static str {
        match self {
            FinalizeReason::MaxDuration => "max_duration",
            FinalizeReason::MaxBytes => "max_bytes",
            FinalizeReason::MaxMessages => "max_messages",
            FinalizeReason::EndOfInput => "end_of_input",
            FinalizeReason::Shutdown => "shutdown",
            FinalizeReason::Memory => "memory",
            FinalizeReason::FlowControl => "flow_control",
        }
    }
}

impl std::fmt::Display for FinalizeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<FlushReason> for FinalizeReason {
    /// `Early` is what the batcher calls a finalize on shutdown (or after a failed source).
    fn from(r: FlushReason) -> Self {
        match r {
            FlushReason::MaxDuration => FinalizeReason::MaxDuration,
            FlushReason::MaxBytes => FinalizeReason::MaxBytes,
            FlushReason::MaxMessages => FinalizeReason::MaxMessages,
            FlushReason::EndOfInput => FinalizeReason::EndOfInput,
            FlushReason::Early => FinalizeReason::Shutdown,
            FlushReason::Memory => FinalizeReason::Memory,
            FlushReason::FlowControl => FinalizeReason::FlowControl,
        }
    }
}

/// What was retried: the `kind` label of `subsink_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
///
/// Acks, lease extensions, nacks and dead-letter publishes are not retried (a lost ack is a
/// redelivery; a failed dead-letter publish nacks the message), so they have no kind.
pub enum RetryKind {
    /// A single put of an object tried again after a transient failure (object_store's own
    /// retries of each request inside it, and of multipart parts, are not counted).
    Upload,
    /// A Delta log commit tried again because the version another writer made was listed but
    /// not readable yet. (A commit that loses the race for its version is retried inside
    /// deltalake's commit and not counted.)
    Commit,
    /// A StreamingPull stream reopened after it broke.
    Stream,
}

impl RetryKind {
    pub const ALL: [RetryKind; 3] = [RetryKind::Upload, RetryKind::Commit, RetryKind::Stream];

    pub fn as_str(self) -> &'static str {
        match self {
            RetryKind::Upload => "upload",
            RetryKind::Commit => "commit",
            RetryKind::Stream => "stream",
        }
    }
}

/// What became durable: the `kind` label of `subsink_upload_duration_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DurableKind {
    /// An object of a Cloud Storage subscription (single put or multipart).
    Object,
    /// A Parquet data file and its Delta log commit.
    Commit,
}

impl DurableKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DurableKind::Object => "object",
            DurableKind::Commit => "commit",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SubLabels {
    subscription: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    subscription: String,
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    subscription: String,
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    subscription: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

/// Upload latency buckets (seconds): a local put takes milliseconds, a 10 GiB multipart upload
/// minutes.
const UPLOAD_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

fn upload_histogram() -> Histogram {
    Histogram::new(UPLOAD_BUCKETS)
}

type F64Gauge = Gauge<f64, AtomicU64>;

/// The families, shared by every subscription's handle.
struct Families {
    received: Family<SubLabels, Counter>,
    written: Family<SubLabels, Counter>,
    acked: Family<SubLabels, Counter>,
    nacked: Family<SubLabels, Counter>,
    dead_lettered: Family<SubLabels, Counter>,
    filtered: Family<SubLabels, Counter>,
    bad: Family<SubLabels, Counter>,
    bytes_written: Family<SubLabels, Counter>,
    finalized: Family<ReasonLabels, Counter>,
    upload: Family<KindLabels, Histogram, fn() -> Histogram>,
    open_files: Family<SubLabels, Gauge>,
    buffered_bytes: Family<SubLabels, Gauge>,
    oldest_unacked: Family<SubLabels, F64Gauge>,
    retries: Family<KindLabels, Counter>,
    spool_bytes: Family<SubLabels, Gauge>,
    spool_segments: Family<SubLabels, Gauge>,
    spool_oldest: Family<SubLabels, F64Gauge>,
    archive_listed: Family<SubLabels, Gauge>,
    archive_objects: Family<OutcomeLabels, Counter>,
    archive_bytes: Family<SubLabels, Counter>,
}

/// The `outcome` label values of `subsink_archive_objects_total`.
const ARCHIVE_OUTCOMES: [&str; 3] = ["read", "skipped", "broken"];

/// What an archive source counted so far (each count only grows during a run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchiveCounts {
    pub objects_listed: u64,
    pub objects_read: u64,
    pub objects_skipped: u64,
    pub objects_broken: u64,
    pub bytes_read: u64,
}

/// The archive series of one subscription.
#[derive(Clone)]
struct ArchiveSeries {
    listed: Gauge,
    /// Indexed like [`ARCHIVE_OUTCOMES`].
    objects: [Counter; 3],
    bytes: Counter,
}

impl Families {
    /// Every family, without series.
    fn new() -> Families {
        Families {
            received: Family::default(),
            written: Family::default(),
            acked: Family::default(),
            nacked: Family::default(),
            dead_lettered: Family::default(),
            filtered: Family::default(),
            bad: Family::default(),
            bytes_written: Family::default(),
            finalized: Family::default(),
            upload: Family::new_with_constructor(upload_histogram as fn() -> Histogram),
            open_files: Family::default(),
            buffered_bytes: Family::default(),
            oldest_unacked: Family::default(),
            retries: Family::default(),
            spool_bytes: Family::default(),
            spool_segments: Family::default(),
            spool_oldest: Family::default(),
            archive_listed: Family::default(),
            archive_objects: Family::default(),
            archive_bytes: Family::default(),
        }
    }

    /// The message counters: received, written, settled, filtered, bad.
    fn register_messages(&self, r: &mut Registry) {
        r.register(
            "subsink_messages_received",
            "Messages taken from the source",
            self.received.clone(),
        );
        r.register(
            "subsink_messages_written",
            "Messages in durable objects or committed table files",
            self.written.clone(),
        );
        r.register(
            "subsink_messages_acked",
            "Messages settled: acked (Pub/Sub) or passed by the checkpoint (file source)",
            self.acked.clone(),
        );
        r.register(
            "subsink_messages_nacked",
            "Messages nacked (Pub/Sub) or left not done (file source)",
            self.nacked.clone(),
        );
        r.register(
            "subsink_messages_dead_lettered",
            "Messages forwarded to the dead-letter topic or file",
            self.dead_lettered.clone(),
        );
        r.register(
            "subsink_messages_filtered",
            "Messages the subscription's filter passed over (acked, never written)",
            self.filtered.clone(),
        );
        r.register(
            "subsink_messages_bad",
            "Malformed input lines and messages that could not be encoded or converted",
            self.bad.clone(),
        );
    }

    /// The files' metrics: bytes written, finalized, made durable, open, buffered; the oldest
    /// unsettled message, retries.
    fn register_files(&self, r: &mut Registry) {
        r.register(
            "subsink_bytes_written",
            "Bytes of durable objects and committed Parquet data files",
            self.bytes_written.clone(),
        );
        r.register(
            "subsink_files_finalized",
            "Files closed for upload, by reason",
            self.finalized.clone(),
        );
        r.register_with_unit(
        "subsink_upload_duration",
        "Time from finalize to durable: object uploads (kind=object) and Delta commits (kind=commit)",
        Unit::Seconds,
        self.upload.clone(),
    );
        r.register(
            "subsink_open_files",
            "Files open for writing",
            self.open_files.clone(),
        );
        r.register_with_unit(
            "subsink_buffered",
            "Bytes held in memory for open and uploading files",
            Unit::Bytes,
            self.buffered_bytes.clone(),
        );
        r.register_with_unit(
            "subsink_oldest_unacked_age",
            "Age of the oldest received message not yet settled (0 when none)",
            Unit::Seconds,
            self.oldest_unacked.clone(),
        );
        r.register(
            "subsink_retries",
            "Retried operations, by kind",
            self.retries.clone(),
        );
    }

    /// The metrics of one source each: the push spool, the archive.
    fn register_sources(&self, r: &mut Registry) {
        r.register_with_unit(
            "subsink_spool",
            "Bytes of the push spool's segments on disk",
            Unit::Bytes,
            self.spool_bytes.clone(),
        );
        r.register(
            "subsink_spool_segments",
            "Segments of the push spool on disk",
            self.spool_segments.clone(),
        );
        r.register_with_unit(
            "subsink_spool_oldest_message_age",
            "Age of the oldest spooled message not yet durable in the destination (0 when none)",
            Unit::Seconds,
            self.spool_oldest.clone(),
        );
        r.register(
            "subsink_archive_objects_listed",
            "Archive source: objects listed under the archive's URL",
            self.archive_listed.clone(),
        );
        r.register(
        "subsink_archive_objects",
        "Archive source: objects read, skipped (not export objects) or broken (truncated or corrupt), by outcome",
        self.archive_objects.clone(),
    );
        r.register(
            "subsink_archive_bytes_read",
            "Archive source: bytes fetched from the archive's objects",
            self.archive_bytes.clone(),
        );
    }
}

/// The process's metrics: one registry, rendered at `/metrics`. Cheap to clone (shared).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    families: Arc<Families>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry with every subsink metric (no series until a subscription handle is made).
    pub fn new() -> Metrics {
        let f = Families::new();
        let mut r = Registry::default();
        // Counters get their `_total` suffix, and unit-registered metrics their unit, from the
        // encoder (OpenMetrics naming), so the names here stop before them.
        f.register_messages(&mut r);
        f.register_files(&mut r);
        f.register_sources(&mut r);
        let build: Family<VersionLabels, Gauge> = Family::default();
        build
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register(
            "subsink_build_info",
            "The running version (always 1)",
            build,
        );
        Metrics {
            registry: Arc::new(r),
            families: Arc::new(f),
        }
    }

    /// The handle of one subscription (its full resource name is the `subscription` label). Every
    /// series of it exists from here on, at 0, so dashboards and `rate()` see it before the first
    /// event.
    pub fn subscription(&self, name: &str) -> SubscriptionMetrics {
        let f = &self.families;
        let sub = SubLabels {
            subscription: name.to_string(),
        };
        let reason = |r: FinalizeReason| {
            f.finalized.get_or_create_owned(&ReasonLabels {
                subscription: name.to_string(),
                reason: r.as_str(),
            })
        };
        let kind = |k: &'static str| KindLabels {
            subscription: name.to_string(),
            kind: k,
        };
        SubscriptionMetrics {
            name: name.into(),
            received: f.received.get_or_create_owned(&sub),
            written: f.written.get_or_create_owned(&sub),
            acked: f.acked.get_or_create_owned(&sub),
            nacked: f.nacked.get_or_create_owned(&sub),
            dead_lettered: f.dead_lettered.get_or_create_owned(&sub),
            filtered: f.filtered.get_or_create_owned(&sub),
            bad: f.bad.get_or_create_owned(&sub),
            bytes_written: f.bytes_written.get_or_create_owned(&sub),
            finalized: FinalizeReason::ALL.map(reason),
            upload_object: f
                .upload
                .get_or_create_owned(&kind(DurableKind::Object.as_str())),
            upload_commit: f
                .upload
                .get_or_create_owned(&kind(DurableKind::Commit.as_str())),
            open_files: f.open_files.get_or_create_owned(&sub),
            buffered_bytes: f.buffered_bytes.get_or_create_owned(&sub),
            oldest_unacked: f.oldest_unacked.get_or_create_owned(&sub),
            spool: Default::default(),
            archive: Default::default(),
            retries: RetryKind::ALL.map(|k| f.retries.get_or_create_owned(&kind(k.as_str()))),
            families: self.families.clone(),
        }
    }

    /// Drop every series of subscription `name` (`serve`: a deleted subscription stops being
    /// exported). Handles still held keep counting, unseen.
    pub fn remove_subscription(&self, name: &str) {
        let f = &self.families;
        let sub = SubLabels {
            subscription: name.to_string(),
        };
        for fam in [
            &f.received,
            &f.written,
            &f.acked,
            &f.nacked,
            &f.dead_lettered,
            &f.filtered,
            &f.bad,
            &f.bytes_written,
        ] {
            fam.remove(&sub);
        }
        f.open_files.remove(&sub);
        f.buffered_bytes.remove(&sub);
        f.oldest_unacked.remove(&sub);
        f.spool_bytes.remove(&sub);
        f.spool_segments.remove(&sub);
        f.spool_oldest.remove(&sub);
        f.archive_listed.remove(&sub);
        f.archive_bytes.remove(&sub);
        for o in ARCHIVE_OUTCOMES {
            f.archive_objects.remove(&OutcomeLabels {
                subscription: name.to_string(),
                outcome: o,
            });
        }
        for r in FinalizeReason::ALL {
            f.finalized.remove(&ReasonLabels {
                subscription: name.to_string(),
                reason: r.as_str(),
            });
        }
        let kind = |k: &'static str| KindLabels {
            subscription: name.to_string(),
            kind: k,
        };
        f.upload.remove(&kind(DurableKind::Object.as_str()));
        f.upload.remove(&kind(DurableKind::Commit.as_str()));
        for k in RetryKind::ALL {
            f.retries.remove(&kind(k.as_str()));
        }
    }

    /// The OpenMetrics text exposition of every metric (what `/metrics` serves).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 << 10);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// One subscription's metrics: each call is an atomic add or store on a series resolved when the
/// handle was made (no lookup, no lock), so the pipeline can call it per message batch. Cheap to
/// clone; clones update the same series.
#[derive(Clone)]
pub struct SubscriptionMetrics {
    name: Arc<str>,
    received: Counter,
    written: Counter,
    acked: Counter,
    nacked: Counter,
    dead_lettered: Counter,
    filtered: Counter,
    bad: Counter,
    bytes_written: Counter,
    /// Indexed like [`FinalizeReason::ALL`].
    finalized: [Counter; 7],
    upload_object: Histogram,
    upload_commit: Histogram,
    open_files: Gauge,
    buffered_bytes: Gauge,
    oldest_unacked: F64Gauge,
    /// The push spool's gauges, made on first use (only a push source with a spool has them).
    spool: std::sync::OnceLock<(Gauge, Gauge, F64Gauge)>,
    /// The archive source's series, made on first use (only an archive source has them).
    archive: std::sync::OnceLock<ArchiveSeries>,
    /// Indexed like [`RetryKind::ALL`].
    retries: [Counter; 3],
    families: Arc<Families>,
}

impl std::fmt::Debug for SubscriptionMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionMetrics")
            .field("subscription", &self.name)
            .finish_non_exhaustive()
    }
}

impl SubscriptionMetrics {
    /// The subscription this handle counts for.
    pub fn subscription(&self) -> &str {
        &self.name
    }

    /// `n` messages taken from the source.
    pub fn received(&self, n: u64) {
        self.received.inc_by(n);
    }

    /// `messages` messages in `bytes` bytes became durable (an object or a table commit).
    pub fn written(&self, messages: u64, bytes: u64) {
        self.written.inc_by(messages);
        self.bytes_written.inc_by(bytes);
    }

    /// `n` messages settled: acked, or passed by the checkpoint.
    pub fn acked(&self, n: u64) {
        self.acked.inc_by(n);
    }

    /// `n` messages nacked (or left not done by a file run).
    pub fn nacked(&self, n: u64) {
        self.nacked.inc_by(n);
    }

    /// `n` messages forwarded to the dead-letter topic or file.
    pub fn dead_lettered(&self, n: u64) {
        self.dead_lettered.inc_by(n);
    }

    /// `n` messages the filter passed over.
    pub fn filtered(&self, n: u64) {
        self.filtered.inc_by(n);
    }

    /// `n` malformed lines or messages that could not be encoded.
    pub fn bad(&self, n: u64) {
        self.bad.inc_by(n);
    }

    /// A file was closed for upload.
    pub fn finalized(&self, reason: FinalizeReason) {
        self.finalized[reason_index(reason)].inc();
    }

    /// An object upload took `d` from finalize to durable.
    pub fn upload_seconds(&self, d: Duration) {
        self.upload_object.observe(d.as_secs_f64());
    }

    /// A Delta commit (data file put + log commit) took `d`.
    pub fn commit_seconds(&self, d: Duration) {
        self.upload_commit.observe(d.as_secs_f64());
    }

    /// Files open for writing now.
    pub fn open_files(&self, n: usize) {
        self.open_files.set(n as i64);
    }

    /// Bytes held in memory now for open and uploading files.
    pub fn buffered_bytes(&self, n: u64) {
        self.buffered_bytes.set(n.min(i64::MAX as u64) as i64);
    }

    /// Age of the oldest message received and not settled; `Duration::ZERO` when none is.
    pub fn oldest_unacked_age(&self, d: Duration) {
        self.oldest_unacked.set(d.as_secs_f64());
    }

    /// What the push spool holds: bytes on disk, segments, and the age of its oldest message not
    /// yet durable in the destination.
    pub fn spool(&self, bytes: u64, segments: u64, oldest: Duration) {
        let f = &self.families;
        let sub = SubLabels {
            subscription: self.name.to_string(),
        };
        let (b, s, o) = self.spool.get_or_init(|| {
            (
                f.spool_bytes.get_or_create_owned(&sub),
                f.spool_segments.get_or_create_owned(&sub),
                f.spool_oldest.get_or_create_owned(&sub),
            )
        });
        b.set(bytes.min(i64::MAX as u64) as i64);
        s.set(segments.min(i64::MAX as u64) as i64);
        o.set(oldest.as_secs_f64());
    }

    /// What the archive source counted so far: the series are set to the counts (they only grow,
    /// so the counters stay monotonic).
    pub fn archive(&self, c: &ArchiveCounts) {
        let f = &self.families;
        let a = self.archive.get_or_init(|| {
            let sub = SubLabels {
                subscription: self.name.to_string(),
            };
            ArchiveSeries {
                listed: f.archive_listed.get_or_create_owned(&sub),
                objects: ARCHIVE_OUTCOMES.map(|o| {
                    f.archive_objects.get_or_create_owned(&OutcomeLabels {
                        subscription: self.name.to_string(),
                        outcome: o,
                    })
                }),
                bytes: f.archive_bytes.get_or_create_owned(&sub),
            }
        });
        let set = |counter: &Counter, v: u64| {
            counter
                .inner()
                .fetch_max(v, std::sync::atomic::Ordering::Relaxed);
        };
        a.listed.set(c.objects_listed.min(i64::MAX as u64) as i64);
        set(&a.objects[0], c.objects_read);
        set(&a.objects[1], c.objects_skipped);
        set(&a.objects[2], c.objects_broken);
        set(&a.bytes, c.bytes_read);
    }

    /// One operation of `kind` was retried.
    pub fn retried(&self, kind: RetryKind) {
        self.retries[retry_index(kind)].inc();
    }

    /// The durable-file counters in one call: `written` and the upload (or commit) latency
    /// ([`super::PipelineTelemetry::file_durable`] adds the log line).
    pub fn file_durable(&self, f: &DurableFile<'_>) {
        self.written(f.messages, f.bytes);
        match f.kind {
            DurableKind::Object => self.upload_seconds(f.latency),
            DurableKind::Commit => self.commit_seconds(f.latency),
        }
    }
}

/// A file that became durable, as the info line reports it.
#[derive(Debug, Clone)]
pub struct DurableFile<'a> {
    /// The object name (storage), or the data files the commit added, comma-separated (their
    /// paths in a Delta table; empty for a MERGE of deletes only).
    pub name: &'a str,
    pub messages: u64,
    /// Bytes of the object or data file.
    pub bytes: u64,
    pub reason: FinalizeReason,
    /// Finalize → durable (upload, or data file put + log commit).
    pub latency: Duration,
    pub kind: DurableKind,
}

fn reason_index(r: FinalizeReason) -> usize {
    FinalizeReason::ALL
        .iter()
        .position(|x| *x == r)
        .expect("every reason is in ALL")
}

fn retry_index(k: RetryKind) -> usize {
    RetryKind::ALL
        .iter()
        .position(|x| *x == k)
        .expect("every kind is in ALL")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(text: &'a str, series: &str) -> Option<&'a str> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
    }

    #[test]
    fn every_series_exists_at_zero_and_counts() {
        let m = Metrics::new();
        let s = m.subscription("projects/p/subscriptions/s");
        let text = m.render();
        let sub = r#"{subscription="projects/p/subscriptions/s"}"#;
        for name in [
            "subsink_messages_received_total",
            "subsink_messages_written_total",
            "subsink_messages_acked_total",
            "subsink_messages_nacked_total",
            "subsink_messages_dead_lettered_total",
            "subsink_messages_filtered_total",
            "subsink_messages_bad_total",
            "subsink_bytes_written_total",
            "subsink_open_files",
            "subsink_buffered_bytes",
        ] {
            assert_eq!(sample(&text, &format!("{name}{sub}")), Some("0"), "{name}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        s.received(5);
        s.received(2);
        s.written(6, 1234);
        s.finalized(FinalizeReason::MaxBytes);
        s.finalized(FinalizeReason::MaxBytes);
        s.finalized(FinalizeReason::from(FlushReason::Early));
        s.retried(RetryKind::Commit);
        s.open_files(3);
        s.buffered_bytes(4096);
        s.upload_seconds(Duration::from_millis(30));
        s.oldest_unacked_age(Duration::from_millis(1500));
        let text = m.render();
        let got = |series: &str| sample(&text, series).map(str::to_string);
        assert_eq!(
            got(&format!("subsink_messages_received_total{sub}")).as_deref(),
            Some("7")
        );
        assert_eq!(
            got(&format!("subsink_bytes_written_total{sub}")).as_deref(),
            Some("1234")
        );
        assert_eq!(
            got(r#"subsink_files_finalized_total{subscription="projects/p/subscriptions/s",reason="max_bytes"}"#).as_deref(),
            Some("2")
        );
        assert_eq!(
            got(r#"subsink_files_finalized_total{subscription="projects/p/subscriptions/s",reason="shutdown"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            got(
                r#"subsink_retries_total{subscription="projects/p/subscriptions/s",kind="commit"}"#
            )
            .as_deref(),
            Some("1")
        );
        assert_eq!(
            got(&format!("subsink_open_files{sub}")).as_deref(),
            Some("3")
        );
        assert_eq!(
            got(&format!("subsink_oldest_unacked_age_seconds{sub}")).as_deref(),
            Some("1.5")
        );
        assert_eq!(
            got(r#"subsink_upload_duration_seconds_bucket{le="0.05",subscription="projects/p/subscriptions/s",kind="object"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            got(r#"subsink_upload_duration_seconds_bucket{le="0.025",subscription="projects/p/subscriptions/s",kind="object"}"#).as_deref(),
            Some("0")
        );
    }

    #[test]
    fn archive_series_appear_with_an_archive_source_and_follow_its_counts() {
        let m = Metrics::new();
        let s = m.subscription("projects/p/subscriptions/s");
        assert!(!m.render().contains("subsink_archive_objects_total{"));
        let mut c = ArchiveCounts {
            objects_listed: 5,
            objects_read: 2,
            objects_skipped: 1,
            objects_broken: 0,
            bytes_read: 4096,
        };
        s.archive(&c);
        c.objects_read = 4;
        c.bytes_read = 9000;
        s.archive(&c);
        let text = m.render();
        let sub = r#"subscription="projects/p/subscriptions/s""#;
        for (series, want) in [
            (format!("subsink_archive_objects_listed{{{sub}}}"), "5"),
            (
                format!(r#"subsink_archive_objects_total{{{sub},outcome="read"}}"#),
                "4",
            ),
            (
                format!(r#"subsink_archive_objects_total{{{sub},outcome="skipped"}}"#),
                "1",
            ),
            (
                format!(r#"subsink_archive_objects_total{{{sub},outcome="broken"}}"#),
                "0",
            ),
            (format!("subsink_archive_bytes_read_total{{{sub}}}"), "9000"),
        ] {
            assert_eq!(sample(&text, &series), Some(want), "{series}\n{text}");
        }
        m.remove_subscription("projects/p/subscriptions/s");
        assert!(!m.render().contains("subsink_archive_objects_total{"));
    }

    #[test]
    fn removed_subscription_disappears_others_stay() {
        let m = Metrics::new();
        let a = m.subscription("projects/p/subscriptions/a");
        let b = m.subscription("projects/p/subscriptions/b");
        a.received(1);
        b.received(2);
        m.remove_subscription("projects/p/subscriptions/a");
        let text = m.render();
        assert!(!text.contains("subscriptions/a"), "{text}");
        assert!(text.contains(
            r#"subsink_messages_received_total{subscription="projects/p/subscriptions/b"} 2"#
        ));
    }
}
