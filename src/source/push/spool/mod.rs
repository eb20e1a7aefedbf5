//! The push source's local spool (issue 22): an accepted push request is appended here and answered
//! 2xx once the spool is fsynced; the export reads the spool as it grows, as the file source reads
//! its input, and settles by a checkpoint watermark ([`crate::checkpoint_file`]).
//!
//! On disk: a folder of **segments**, `00000000000000000001.seg`, `…2.seg`, … — NDJSON of REST
//! `PubsubMessage`s, the file source's own input format, one message a line. Only the newest
//! segment is appended to; it is sealed (and a new one started) once it holds `segment_bytes`, and
//! at every start of the process.
//!
//! * **Group commit.** Appends go to one writer thread. It takes every append that is queued,
//!   writes them with one `write`, makes them durable with one `fdatasync`, and only then answers
//!   each of them: the requests that arrived while a sync ran share the next one. No append is
//!   answered before the sync that covers it.
//! * **Spool offsets** span segments: a spool offset is `seq << 40 | offset` (a segment holds less
//!   than 1 TiB), so spool offsets grow through the whole spool and a checkpoint's watermark is one
//!   number.
//! * **Reading as it grows.** The reader only reads what is durable: the writer publishes the
//!   position up to which the spool is fsynced ([`SpoolReader::next_chunk`] waits for it to move).
//! * **A torn tail** (a crash during an append) is cut at startup: the newest segment is kept up to
//!   its last whole line that is a message. What was cut was never synced, so never answered 2xx.
//! * **Deleting.** Once the watermark (every message before it durable in the destination) is past
//!   a segment, the segment is deleted ([`SpoolHandle::release_below`]).
//! * **Bounded.** Past `max_bytes` on disk (with what is queued), an append is refused at once
//!   ([`SpoolError::Full`]); a spool that cannot be written ([`SpoolError::Unwritable`]: disk full,
//!   permissions) refuses appends at once for a second after each failure, then tries again.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{oneshot, watch};

use crate::message::{Message, WireDefaults};

mod line;
mod shared;

pub use self::line::encode_line;
pub use self::shared::{
    split_spool_offset, spool_offset, SpoolError, SpoolLeft, SpoolSettings, SpoolStats,
    RETRY_UNWRITABLE_AFTER, SEGMENT_SHIFT,
};

use self::shared::{segment_path, Append, Retry, Shared, AGE_GRAIN, MAX_GROUP};

/// The spool: open it once ([`Spool::open`]); appends through [`SpoolWriter`] (cheap to clone, for
/// every request handler), the export through the one [`SpoolReader`], segments released through
/// [`SpoolHandle`].
pub struct Spool {
    pub writer: SpoolWriter,
    pub reader: SpoolReader,
    pub handle: SpoolHandle,
}

/// Appends messages (request handlers).
#[derive(Clone)]
pub struct SpoolWriter {
    tx: std::sync::mpsc::Sender<Append>,
    shared: Arc<Shared>,
}

/// What the settle side and the telemetry hold: releasing segments, stats, readiness.
#[derive(Clone)]
pub struct SpoolHandle {
    shared: Arc<Shared>,
}

impl Spool {
    /// Open (or create) the spool in `settings.dir`: cut the torn tail of the newest segment, start
    /// a fresh segment after it and the writer thread. Reading starts at `start` (the checkpoint's
    /// watermark; 0 for a new spool).
    pub fn open(settings: &SpoolSettings, start: u64) -> Result<Spool, SpoolError> {
        let dir = settings.dir.clone();
        let io = |source| SpoolError::Io {
            dir: dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let mut found: BTreeMap<u64, u64> = BTreeMap::new();
        let mut ages = VecDeque::new();
        for e in std::fs::read_dir(&dir).map_err(io)? {
            let e = e.map_err(io)?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(seq) = name
                .strip_suffix(".seg")
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            found.insert(seq, e.metadata().map_err(io)?.len());
        }
        let newest = found.keys().next_back().copied();
        for (&seq, len) in found.iter_mut() {
            let path = segment_path(&dir, seq);
            let keep = if Some(seq) == newest {
                valid_prefix(&path).map_err(io)?
            } else {
                whole_lines(&path, *len).map_err(io)?
            };
            if keep < *len {
                tracing::warn!(
                    segment = %path.display(),
                    "spool: cutting a torn tail of {} bytes (never synced, never answered 2xx)",
                    *len - keep
                );
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io)?;
                f.set_len(keep).and_then(|()| f.sync_all()).map_err(io)?;
                *len = keep;
            }
            let mtime = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .unwrap_or_else(|_| SystemTime::now());
            ages.push_back((spool_offset(seq, 0), mtime));
        }
        let active = newest.map_or(1, |n| n + 1);
        let file = create_segment(&dir, active).map_err(io)?;
        found.insert(active, 0);
        let bytes = found.values().sum();
        let committed = spool_offset(active, 0);
        let shared = Arc::new(Shared {
            dir: dir.clone(),
            max_bytes: settings.max_bytes,
            bytes: AtomicU64::new(bytes),
            queued: AtomicU64::new(0),
            segments: Mutex::new(found),
            unwritable: Mutex::new(None),
            failing: AtomicBool::new(false),
            ages: Mutex::new(ages),
            watermark: AtomicU64::new(start),
            committed: AtomicU64::new(committed),
            retry: Retry {
                quiet: AtomicBool::new(true),
                ..Default::default()
            },
        });
        let (tx, rx) = std::sync::mpsc::channel::<Append>();
        let (committed_tx, committed_rx) = watch::channel(committed);
        let segment_bytes = settings.segment_bytes.max(1);
        let s = shared.clone();
        std::thread::Builder::new()
            .name("subsink-spool".into())
            .spawn(move || {
                write_loop(
                    Segment {
                        seq: active,
                        file,
                        len: 0,
                        dirty: false,
                    },
                    rx,
                    s,
                    committed_tx,
                    segment_bytes,
                )
            })
            .map_err(io)?;
        Ok(Spool {
            writer: SpoolWriter {
                tx,
                shared: shared.clone(),
            },
            reader: SpoolReader {
                shared: shared.clone(),
                committed: committed_rx,
                pos: start,
                file: None,
            },
            handle: SpoolHandle { shared },
        })
    }
}

impl SpoolWriter {
    /// Refuse at once when the spool is full or failed to write within the last second: the
    /// request is answered without waiting (429 / 503, the pusher backs off).
    pub fn check(&self, more: u64) -> Result<(), SpoolError> {
        let s = &self.shared;
        if !s.failing.load(Ordering::Relaxed) {
            // The common case: no lock.
        } else if let Some((at, why)) = &*s.unwritable.lock().unwrap() {
            if at.elapsed() < RETRY_UNWRITABLE_AFTER {
                return Err(SpoolError::Unwritable {
                    dir: s.dir_name(),
                    reason: why.clone(),
                });
            }
        }
        let bytes = s.bytes.load(Ordering::Relaxed) + s.queued.load(Ordering::Relaxed);
        if bytes + more > s.max_bytes {
            return Err(SpoolError::Full {
                dir: s.dir_name(),
                bytes,
                max: s.max_bytes,
            });
        }
        Ok(())
    }

    /// Append one message and wait until it is fsynced; its position.
    pub async fn append(&self, m: &Message) -> Result<u64, SpoolError> {
        let mut line = Vec::new();
        encode_line(m, &mut line);
        let n = line.len() as u64;
        self.check(n)?;
        let (done, answer) = oneshot::channel();
        self.shared.queued.fetch_add(n, Ordering::Relaxed);
        if self.tx.send(Append { line, done }).is_err() {
            self.shared.queued.fetch_sub(n, Ordering::Relaxed);
            return Err(SpoolError::Closed);
        }
        answer.await.unwrap_or(Err(SpoolError::Closed))
    }
}

impl SpoolHandle {
    /// Everything before `watermark` is durable in the destination: delete the segments wholly
    /// before it.
    pub fn release_below(&self, watermark: u64) {
        let s = &self.shared;
        s.watermark.fetch_max(watermark, Ordering::Relaxed);
        let (wseq, _) = split_spool_offset(watermark);
        let gone: Vec<(u64, u64)> = {
            let segs = s.segments.lock().unwrap();
            segs.range(..wseq).map(|(k, v)| (*k, *v)).collect()
        };
        for (seq, len) in gone {
            match std::fs::remove_file(s.seg_path(seq)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(segment = seq, error = %e, "spool: cannot delete a settled segment");
                    continue;
                }
            }
            s.segments.lock().unwrap().remove(&seq);
            s.bytes.fetch_sub(len, Ordering::Relaxed);
            tracing::debug!(segment = seq, "spool: segment settled and deleted");
        }
        let mut ages = s.ages.lock().unwrap();
        while ages.len() > 1 && ages[1].0 <= watermark {
            ages.pop_front();
        }
    }

    /// What the spool holds now.
    pub fn stats(&self) -> SpoolStats {
        let s = &self.shared;
        let w = s.watermark.load(Ordering::Relaxed);
        let c = s.committed.load(Ordering::Relaxed);
        let oldest = if w >= c {
            Duration::ZERO
        } else {
            let ages = s.ages.lock().unwrap();
            ages.iter()
                .take_while(|(p, _)| *p <= w)
                .last()
                .or(ages.front())
                .and_then(|(_, t)| t.elapsed().ok())
                .unwrap_or_default()
        };
        SpoolStats {
            bytes: s.bytes.load(Ordering::Relaxed),
            segments: s.segments.lock().unwrap().len() as u64,
            oldest,
        }
    }

    /// What is in the spool — fsynced, so answered 2xx — and not yet durable in the destination:
    /// everything from the watermark to the end of what is fsynced. Reads those bytes to count
    /// the messages (the end of a run: at most `max_bytes`).
    pub fn left(&self) -> std::io::Result<SpoolLeft> {
        let s = &self.shared;
        let w = s.watermark.load(Ordering::Relaxed);
        let c = s.committed.load(Ordering::Relaxed);
        let mut left = SpoolLeft::default();
        if w >= c {
            return Ok(left);
        }
        let ((wseq, woff), (cseq, coff)) = (split_spool_offset(w), split_spool_offset(c));
        let segs: Vec<(u64, u64)> = {
            let segs = s.segments.lock().unwrap();
            segs.range(wseq..=cseq).map(|(k, v)| (*k, *v)).collect()
        };
        let mut buf = vec![0u8; 1 << 20];
        for (seq, len) in segs {
            let from = if seq == wseq { woff } else { 0 };
            let to = if seq == cseq { coff.min(len) } else { len };
            if to <= from {
                continue;
            }
            let f = File::open(s.seg_path(seq))?;
            let mut at = from;
            while at < to {
                let n = buf.len().min((to - at) as usize);
                f.read_exact_at(&mut buf[..n], at)?;
                left.messages += memchr::memchr_iter(b'\n', &buf[..n]).count() as u64;
                at += n as u64;
            }
            left.bytes += to - from;
            left.segments += 1;
        }
        Ok(left)
    }

    /// Why the spool cannot take appends now, if it cannot (readiness).
    pub fn problem(&self) -> Option<String> {
        let s = &self.shared;
        if let Some((at, why)) = &*s.unwritable.lock().unwrap() {
            if at.elapsed() < RETRY_UNWRITABLE_AFTER * 10 {
                return Some(format!("spool {} cannot be written: {why}", s.dir_name()));
            }
        }
        let bytes = s.bytes.load(Ordering::Relaxed);
        if bytes >= s.max_bytes {
            return Some(format!(
                "spool {} is full ({bytes} bytes of at most {})",
                s.dir_name(),
                s.max_bytes
            ));
        }
        None
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Read the spool again from `from` (the first message of a failed file) at `at` or later,
    /// once nothing is open or being made durable. An earlier retry not yet started keeps the
    /// lower position and the earlier time.
    pub fn retry_from(&self, from: u64, line: u64, at: Instant) {
        let mut due = self.shared.retry.due.lock().unwrap();
        *due = Some(match *due {
            Some((f, l, t)) if f < from => (f, l, t.min(at)),
            Some((_, _, t)) => (from, line, t.min(at)),
            None => (from, line, at),
        });
    }

    /// Whether no file is open or being made durable now.
    pub fn set_quiet(&self, quiet: bool) {
        self.shared.retry.quiet.store(quiet, Ordering::Relaxed);
    }

    /// (rewinds so far, the position reading had reached before the last one — 0 once reading
    /// is past it again).
    pub fn replay(&self) -> (u64, u64) {
        let r = &self.shared.retry;
        (
            r.rewinds.load(Ordering::Relaxed),
            r.replay_high.load(Ordering::Relaxed),
        )
    }
}

struct Segment {
    seq: u64,
    file: File,
    len: u64,
    /// A write failed: the file may hold bytes past `len`; the next append starts a new segment.
    dirty: bool,
}

fn create_segment(dir: &Path, seq: u64) -> std::io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(segment_path(dir, seq))?;
    File::open(dir)?.sync_all()?;
    Ok(f)
}

/// The writer thread: group commits until every [`SpoolWriter`] is gone.
fn write_loop(
    mut seg: Segment,
    rx: std::sync::mpsc::Receiver<Append>,
    s: Arc<Shared>,
    committed: watch::Sender<u64>,
    segment_bytes: u64,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut last_mark: Option<Instant> = None;
    // Reused: the appends of one group commit. While one is written and synced, the next
    // group's appends queue in `rx`, and the next commit takes them all.
    let mut group: Vec<Append> = Vec::with_capacity(256);
    while let Ok(first) = rx.recv() {
        let mut size = first.line.len();
        group.push(first);
        while size < MAX_GROUP {
            match rx.try_recv() {
                Ok(a) => {
                    size += a.line.len();
                    group.push(a);
                }
                Err(_) => break,
            }
        }
        s.queued.fetch_sub(size as u64, Ordering::Relaxed);
        let result = commit(&mut seg, &group, &mut buf, &s, segment_bytes);
        match result {
            Ok(start) => {
                if s.failing.load(Ordering::Relaxed) {
                    *s.unwritable.lock().unwrap() = None;
                    s.failing.store(false, Ordering::Relaxed);
                }
                let end = spool_offset(seg.seq, seg.len);
                s.committed.store(end, Ordering::Relaxed);
                if last_mark.is_none_or(|t| t.elapsed() >= AGE_GRAIN) {
                    last_mark = Some(Instant::now());
                    s.ages
                        .lock()
                        .unwrap()
                        .push_back((spool_offset(seg.seq, start), SystemTime::now()));
                }
                committed.send_replace(end);
                let mut at = start;
                for a in group.drain(..) {
                    let n = a.line.len() as u64;
                    let _ = a.done.send(Ok(spool_offset(seg.seq, at)));
                    at += n;
                }
            }
            Err(e) => {
                tracing::error!(error = %e, dir = %s.dir.display(), "spool: append failed; answering 503");
                *s.unwritable.lock().unwrap() = Some((Instant::now(), e.to_string()));
                s.failing.store(true, Ordering::Relaxed);
                for a in group.drain(..) {
                    let _ = a.done.send(Err(SpoolError::Unwritable {
                        dir: s.dir_name(),
                        reason: e.to_string(),
                    }));
                }
            }
        }
    }
}

/// Write `group` to the active segment (sealing it first when full or dirty) and fsync; the
/// offset of the first line in the segment.
fn commit(
    seg: &mut Segment,
    group: &[Append],
    buf: &mut Vec<u8>,
    s: &Shared,
    segment_bytes: u64,
) -> std::io::Result<u64> {
    if seg.dirty || (seg.len > 0 && seg.len + group_len(group) > segment_bytes) {
        let next = seg.seq + 1;
        let file = create_segment(&s.dir, next)?;
        {
            let mut segs = s.segments.lock().unwrap();
            segs.insert(seg.seq, seg.len);
            segs.insert(next, 0);
        }
        *seg = Segment {
            seq: next,
            file,
            len: 0,
            dirty: false,
        };
    }
    buf.clear();
    for a in group {
        buf.extend_from_slice(&a.line);
    }
    let start = seg.len;
    let written = seg
        .file
        .write_all_at(buf, start)
        .and_then(|()| seg.file.sync_data());
    if let Err(e) = written {
        // Bytes past `len` may be on disk: cut them, and start a new segment either way.
        seg.dirty = true;
        let _ = seg.file.set_len(start);
        return Err(e);
    }
    seg.len += buf.len() as u64;
    s.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
    s.segments.lock().unwrap().insert(seg.seq, seg.len);
    Ok(start)
}

fn group_len(group: &[Append]) -> u64 {
    group.iter().map(|a| a.line.len() as u64).sum()
}

/// Length of the newest segment up to its last whole line that is a message.
fn valid_prefix(path: &Path) -> std::io::Result<u64> {
    let bytes = std::fs::read(path)?;
    let mut pos = 0usize;
    let mut arena = bytes::BytesMut::new();
    while pos < bytes.len() {
        let Some(i) = memchr::memchr(b'\n', &bytes[pos..]) else {
            break;
        };
        let line = &bytes[pos..pos + i];
        if Message::from_json_line_in(
            line,
            WireDefaults {
                publish_time_micros: None,
            },
            &mut arena,
        )
        .is_err()
        {
            break;
        }
        pos += i + 1;
    }
    Ok(pos as u64)
}

/// Length of a sealed segment up to its last newline.
fn whole_lines(path: &Path, len: u64) -> std::io::Result<u64> {
    if len == 0 {
        return Ok(0);
    }
    let f = File::open(path)?;
    let mut end = len;
    let mut buf = vec![0u8; 64 << 10];
    while end > 0 {
        let n = buf.len().min(end as usize);
        let start = end - n as u64;
        f.read_exact_at(&mut buf[..n], start)?;
        if let Some(i) = memchr::memrchr(b'\n', &buf[..n]) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Reads the spool in order, as it grows, up to what is fsynced.
pub struct SpoolReader {
    shared: Arc<Shared>,
    committed: watch::Receiver<u64>,
    /// Spool offset of the next byte to read.
    pos: u64,
    file: Option<(u64, File)>,
}

impl SpoolReader {
    /// Where the next chunk starts.
    pub fn next_offset(&self) -> u64 {
        self.pos
    }

    /// Read again from `pos` (a position handed out already, within the last chunk).
    pub fn rewind(&mut self, pos: u64) {
        self.pos = pos;
    }

    /// Does the reader wait for the open files to be finalized (a retry is due)?
    pub fn holding(&self) -> bool {
        self.shared.retry.holding.load(Ordering::Relaxed)
    }

    /// The in-run retry, before each read: `Err(wait)` while a retry is pending — reading waits
    /// (ask again after `wait`) so that nothing later is written before the failed messages (an
    /// ordered subscription's keys keep their order), and the pipeline finalizes what is open —
    /// until its time has come and nothing is open or in flight; then it rewinds. `Ok` to read
    /// on, with the line number reading goes on from when it rewound. A replay reads up to where
    /// reading was ([`SpoolReader::next_chunk`] stops there), then waits again until what it
    /// wrote is finalized and settled (durable, or failed again), and ends: a file written again
    /// holds the failed files' messages only — a message read later never joins a file that
    /// keeps failing, nor shares its attempts and its dead-lettering.
    pub fn retry_step(&mut self) -> Result<Option<u64>, Duration> {
        let r = &self.shared.retry;
        let high = r.replay_high.load(Ordering::Relaxed);
        if high != 0 {
            if self.pos < high {
                // One replay at a time: the next one starts after this one is through.
                return Ok(None);
            }
            if !r.quiet.load(Ordering::Relaxed) {
                r.holding.store(true, Ordering::Relaxed);
                return Err(Duration::from_millis(10));
            }
            r.holding.store(false, Ordering::Relaxed);
            r.replay_high.store(0, Ordering::Relaxed);
        }
        let mut due = r.due.lock().unwrap();
        let Some((from, line, at)) = *due else {
            return Ok(None);
        };
        let now = Instant::now();
        if now < at || !r.quiet.load(Ordering::Relaxed) {
            r.holding.store(true, Ordering::Relaxed);
            return Err(at
                .saturating_duration_since(now)
                .clamp(Duration::from_millis(10), Duration::from_millis(50)));
        }
        *due = None;
        r.holding.store(false, Ordering::Relaxed);
        if from < self.pos {
            tracing::info!(
                from,
                to = self.pos,
                "spool: writing the messages of failed files again"
            );
            r.replay_high.store(self.pos, Ordering::Relaxed);
            r.rewinds.fetch_add(1, Ordering::Relaxed);
            self.pos = from;
            self.file = None;
            return Ok(Some(line));
        }
        Ok(None)
    }

    /// The next whole lines (at most about `max` bytes, at least one line) and the position of the
    /// first; waits while everything fsynced has been read. `None` once the writer is gone and all
    /// is read. While a replay of failed files reads again, a chunk ends where reading was before
    /// it rewound (a line boundary): nothing new comes with the last of the replay.
    pub async fn next_chunk(&mut self, max: usize) -> Option<(u64, Vec<u8>)> {
        loop {
            let c = *self.committed.borrow_and_update();
            let (seq, off) = split_spool_offset(self.pos);
            let (cseq, coff) = split_spool_offset(c);
            let end = if seq < cseq {
                self.shared
                    .segments
                    .lock()
                    .unwrap()
                    .get(&seq)
                    .copied()
                    .unwrap_or(0)
            } else {
                coff
            };
            let high = self.shared.retry.replay_high.load(Ordering::Relaxed);
            let end = match split_spool_offset(high) {
                (hseq, hoff) if high > self.pos && hseq == seq => end.min(hoff),
                _ => end,
            };
            if seq <= cseq && off < end {
                match self.read(seq, off, end, max) {
                    Ok(Some(bytes)) => {
                        let start = self.pos;
                        self.pos += bytes.len() as u64;
                        return Some((start, bytes));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(segment = seq, error = %e, "spool: cannot read a segment; waiting");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                }
            }
            if seq < cseq {
                self.pos = spool_offset(seq + 1, 0);
                self.file = None;
                continue;
            }
            if self.committed.changed().await.is_err() {
                let c = *self.committed.borrow();
                if self.pos >= c {
                    return None;
                }
            }
        }
    }

    /// Whole lines of segment `seq` from `off`, before `end`.
    fn read(
        &mut self,
        seq: u64,
        off: u64,
        end: u64,
        max: usize,
    ) -> std::io::Result<Option<Vec<u8>>> {
        if self.file.as_ref().is_none_or(|(s, _)| *s != seq) {
            self.file = Some((seq, File::open(self.shared.seg_path(seq))?));
        }
        let f = &self.file.as_ref().expect("opened").1;
        let mut want = ((end - off) as usize).min(max.max(1));
        loop {
            let mut buf = vec![0u8; want];
            f.read_exact_at(&mut buf, off)?;
            if let Some(i) = memchr::memrchr(b'\n', &buf) {
                buf.truncate(i + 1);
                return Ok(Some(buf));
            }
            if off + want as u64 >= end {
                // A segment's committed part always ends with a newline.
                return Ok(None);
            }
            want = (want * 2).min((end - off) as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn msg(i: usize) -> Message {
        Message {
            data: bytes::Bytes::from(format!("message {i}")),
            message_id: i.to_string(),
            publish_time_micros: 1_700_000_000_000_000,
            ..Default::default()
        }
    }

    fn settings(dir: &Path, segment_bytes: u64) -> SpoolSettings {
        SpoolSettings {
            dir: dir.to_path_buf(),
            max_bytes: 1 << 30,
            segment_bytes,
        }
    }

    async fn read_ids(r: &mut SpoolReader, n: usize) -> Vec<String> {
        let mut ids = Vec::new();
        while ids.len() < n {
            let (_, chunk) = r.next_chunk(1 << 20).await.unwrap();
            for line in chunk.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let (m, _, _) = Message::from_json_line(
                    line,
                    WireDefaults {
                        publish_time_micros: None,
                    },
                )
                .unwrap();
                ids.push(m.message_id);
            }
        }
        ids
    }

    #[tokio::test]
    async fn appends_are_read_back_across_segments_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(&settings(dir.path(), 200), 0).unwrap();
        let mut positions = Vec::new();
        for i in 0..20 {
            positions.push(spool.writer.append(&msg(i)).await.unwrap());
        }
        assert!(positions.windows(2).all(|w| w[0] < w[1]));
        let mut reader = spool.reader;
        let ids = read_ids(&mut reader, 20).await;
        assert_eq!(ids, (0..20).map(|i| i.to_string()).collect::<Vec<_>>());
        let segs = spool.handle.stats().segments;
        assert!(segs > 3, "{segs} segments of 200 bytes");
        // Released below the 10th message: the segments before its segment are deleted.
        spool.handle.release_below(positions[10]);
        assert!(spool.handle.stats().segments < segs);
        drop(spool.writer);
        // A crash in the middle of an append: half a line at the end of the newest segment.
        let newest = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "seg"))
            .max()
            .unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&newest)
            .unwrap();
        f.write_all(b"{\"data\":\"aGk=\",\"messageId\":\"torn")
            .unwrap();
        drop(f);
        let again = Spool::open(&settings(dir.path(), 200), positions[10]).unwrap();
        let mut reader = again.reader;
        let ids = read_ids(&mut reader, 10).await;
        assert_eq!(ids, (10..20).map(|i| i.to_string()).collect::<Vec<_>>());
        again.writer.append(&msg(20)).await.unwrap();
        assert_eq!(read_ids(&mut reader, 1).await, ["20"]);
    }

    /// What is left at the end of a run is counted from the watermark, across segments, and
    /// includes what a previous run spooled; nothing once the watermark is at the end.
    #[tokio::test]
    async fn left_counts_the_messages_after_the_watermark_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(&settings(dir.path(), 200), 0).unwrap();
        let mut positions = Vec::new();
        for i in 0..20 {
            positions.push(spool.writer.append(&msg(i)).await.unwrap());
        }
        let all = spool.handle.left().unwrap();
        assert_eq!(all.messages, 20);
        assert!(all.segments > 3, "{all:?}");
        spool.handle.release_below(positions[12]);
        let rest = spool.handle.left().unwrap();
        assert_eq!(rest.messages, 8, "{rest:?}");
        assert!(
            rest.bytes < all.bytes && rest.segments < all.segments,
            "{rest:?}"
        );
        drop(spool);
        // A new run on the same spool: what the previous one left is still left.
        let again = Spool::open(&settings(dir.path(), 200), positions[12]).unwrap();
        assert_eq!(again.handle.left().unwrap().messages, 8);
        let end = again.writer.append(&msg(20)).await.unwrap();
        assert_eq!(again.handle.left().unwrap().messages, 9);
        let mut reader = again.reader;
        assert_eq!(read_ids(&mut reader, 9).await.len(), 9);
        again.handle.release_below(reader.next_offset());
        assert!(reader.next_offset() > end);
        assert_eq!(again.handle.left().unwrap(), SpoolLeft::default());
    }

    #[test]
    fn a_spool_line_reads_back_as_the_message_and_matches_to_json_line() {
        let mut m = msg(7);
        m.data = bytes::Bytes::from_static(b"\x00\xffbinary \"quoted\"\n");
        m.attributes = [("k\"ey", "v\\al\nue"), ("plain", "ü-ç"), ("a", "")].into();
        m.ordering_key = "key\t1".into();
        m.publish_time_micros = 1_614_366_835_749_123;
        for m in [msg(1), m] {
            let mut line = Vec::new();
            encode_line(&m, &mut line);
            assert_eq!(line.last(), Some(&b'\n'));
            let ours: serde_json::Value = serde_json::from_slice(&line).unwrap();
            let theirs: serde_json::Value = serde_json::from_str(&m.to_json_line()).unwrap();
            assert_eq!(ours, theirs);
            let (back, _, _) = Message::from_json_line(
                &line[..line.len() - 1],
                WireDefaults {
                    publish_time_micros: None,
                },
            )
            .unwrap();
            assert_eq!(back, m);
        }
    }

    fn ids_of(chunk: &[u8]) -> Vec<String> {
        chunk
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let d = WireDefaults {
                    publish_time_micros: None,
                };
                Message::from_json_line(l, d).unwrap().0.message_id
            })
            .collect()
    }

    /// A replay of failed files reads up to where reading was — no further, even when more is
    /// spooled — and then holds until what it wrote is settled (the settle side says quiet), so
    /// a message spooled meanwhile never joins a file written again.
    #[tokio::test]
    async fn a_replay_stops_where_reading_was_and_holds_until_its_files_are_settled() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(&settings(dir.path(), 1 << 20), 0).unwrap();
        let mut pos = Vec::new();
        for i in 0..3 {
            pos.push(spool.writer.append(&msg(i)).await.unwrap());
        }
        let mut reader = spool.reader;
        assert_eq!(read_ids(&mut reader, 3).await, ["0", "1", "2"]);
        // The file holding messages 1 and 2 failed; more is spooled while its retry waits.
        spool.handle.set_quiet(false);
        spool.handle.retry_from(pos[1], 2, Instant::now());
        for i in 3..5 {
            spool.writer.append(&msg(i)).await.unwrap();
        }
        assert!(reader.retry_step().is_err(), "rewound with a file open");
        assert!(reader.holding());
        spool.handle.set_quiet(true);
        assert_eq!(reader.retry_step(), Ok(Some(2)));
        let (start, chunk) = reader.next_chunk(1 << 20).await.unwrap();
        assert_eq!(start, pos[1]);
        assert_eq!(
            ids_of(&chunk),
            ["1", "2"],
            "the replay read past where reading was"
        );
        // The replayed messages are in an open file: nothing new is read until it is settled.
        spool.handle.set_quiet(false);
        assert!(
            reader.retry_step().is_err(),
            "read on with the replay's file open"
        );
        assert!(reader.holding());
        spool.handle.set_quiet(true);
        assert_eq!(reader.retry_step(), Ok(None));
        assert!(!reader.holding());
        assert_eq!(read_ids(&mut reader, 2).await, ["3", "4"]);
    }

    #[tokio::test]
    async fn a_full_spool_refuses_appends_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = settings(dir.path(), 1 << 20);
        s.max_bytes = 300;
        let spool = Spool::open(&s, 0).unwrap();
        let mut n = 0;
        loop {
            match spool.writer.append(&msg(n)).await {
                Ok(_) => n += 1,
                Err(SpoolError::Full { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(n > 0 && spool.handle.stats().bytes <= 300);
        assert!(spool.handle.problem().is_none() || n > 0);
    }
}
