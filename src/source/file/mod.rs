//! NDJSON file or stdin of Pub/Sub `PubsubMessage` JSON (docs/contract.md §1.1), one message per line.
//!
//! A reader thread cuts the input into blocks of whole lines; parser threads turn blocks into
//! messages (JSON + base64) beside encoding and upload, and hand them over through bounded
//! channels. What is read ahead is bounded in bytes, whatever the line length: every block, and
//! the messages parsed from it until the writer has taken them, holds a [`Charge`] on the
//! process's memory budget ([`InputGate`]), and the reader waits for the budget before it grows
//! its buffer or reads the next block (docs/operating.md, How to size a pod). Blank lines are not
//! messages and are passed over.
//!
//! A line longer than `--max-line-bytes` ([`DEFAULT_MAX_LINE_BYTES`]) is bad input
//! ([`WireError::LineTooLong`]): once a line without its newline passes the limit, the reader
//! stops keeping it and reads on to its newline in the buffer it has, so a line of any length
//! costs at most the limit plus a block in memory.

pub use crate::settle::watermark::OnBadInput;

pub mod build;
pub mod flags;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use tokio::sync::mpsc;

use crate::input::{BadLine, Source, SourceEvent};
use crate::message::{Message, Receipt, Received, WireDefaults, WireError};
use crate::resources::{Charge, InputGate, Resources};
use crate::telemetry::progress::Progress;

/// The file source's flags that do not go together, or an input that cannot be read (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum FileFlagsError {
    #[error("--source {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--checkpoint needs a file source (stdin cannot be resumed)")]
    CheckpointOnStdin,
}

/// Settings of the file source.
#[derive(Debug, Clone)]
pub struct FileSourceSettings {
    /// `None` reads stdin.
    pub path: Option<PathBuf>,
    /// Resume position: byte offset of the first line to read, and its 1-based line number.
    pub start_offset: u64,
    pub start_line: u64,
    pub on_bad_input: OnBadInput,
    /// Parsed blocks buffered between each parser thread and the writer.
    pub channel_capacity: usize,
    /// `publishTime` for lines without one (microseconds since the epoch); `None` = now.
    pub default_publish_time_micros: Option<i64>,
    /// Parser threads (JSON + base64 decode is the costliest step of the pipeline).
    pub parsers: usize,
    /// Draw a progress bar on stderr while reading a regular file, when stderr is a terminal
    /// (never otherwise, whatever this says).
    pub progress: bool,
    /// The memory budget the read-ahead takes from (`None`: a budget of its own, without a
    /// process limit: [`crate::resources::input_cap`]).
    pub memory: Option<InputGate>,
    /// Longest line, in bytes without its newline; a longer one is a bad line, passed over
    /// without being held ([`DEFAULT_MAX_LINE_BYTES`]).
    pub max_line_bytes: u64,
}

/// The default `--max-line-bytes`: 14 MiB (14,680,064 bytes). Pub/Sub's largest message is
/// 10 MB, and its `data` is base64 on a line: 10 MiB of data is 13,981,016 bytes of base64,
/// which leaves 699,048 bytes for the rest of the line — attributes (Pub/Sub allows 100, keys of
/// 256 bytes and values of 1,024: 128,000 bytes before JSON escapes), the message id, publish
/// time, ordering key and the JSON around them.
pub const DEFAULT_MAX_LINE_BYTES: u64 = 14 << 20;

impl FileSourceSettings {
    pub fn new(path: Option<PathBuf>) -> Self {
        FileSourceSettings {
            path,
            start_offset: 0,
            start_line: 1,
            on_bad_input: OnBadInput::Fail,
            channel_capacity: 8,
            default_publish_time_micros: None,
            parsers: 2,
            progress: true,
            memory: None,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }
}

/// The file source: a reader thread cuts the input into blocks of whole lines, `parsers` threads
/// parse blocks in turn (block `i` goes to parser `i % parsers`), and [`Source::next`] takes their
/// results in the same turn, so messages come out in input order without a reorder buffer.
pub struct FileSource {
    outputs: Vec<mpsc::Receiver<Parsed>>,
    /// Index of the block whose events come next.
    block: usize,
    pending: std::collections::VecDeque<SourceEvent>,
    /// Line number at the start of the next block.
    line_base: u64,
    /// A stop (bad line under `fail`, read error) was handed out: nothing follows.
    stopped: bool,
    on_bad_input: OnBadInput,
    name: String,
    /// The terminal progress bar, when one is drawn.
    progress: Option<Progress>,
    /// The charge of the block whose messages were handed out last: released when the writer
    /// asks for the next (it has then put them in its files).
    held: Charge,
}

/// A block of whole lines, as the reader cut it: `bytes[..len]`.
struct Block {
    bytes: Vec<u8>,
    len: usize,
    /// Byte offset of the block in the input.
    offset: u64,
    /// The read failed after this block (its message).
    failed: Option<String>,
    /// Its bytes on the memory budget.
    charge: Charge,
    /// The block is one line over the limit, not held (`bytes` is empty): its length without the
    /// newline and the offset just past it.
    too_long: Option<TooLong>,
}

/// A line over `--max-line-bytes`, as the reader passed over it.
#[derive(Debug, Clone, Copy)]
struct TooLong {
    /// The line's length without its newline.
    bytes: u64,
    /// Byte offset just past the line (its newline, or the end of the input).
    end: u64,
}

/// What a parser made of one block. Line numbers in `events` count from 0 within the block; the
/// merger adds the block's base.
struct Parsed {
    events: Vec<SourceEvent>,
    lines: u64,
    /// The decoded payloads' bytes on the memory budget.
    charge: Charge,
}

/// Blocks are at least this big (fewer, larger hand-overs), unless less input is available now.
const BLOCK_SIZE: usize = 256 << 10;
/// Buffers up to this size go back to the reader for reuse; larger ones (a long line's) are freed.
const POOLED: usize = 2 * BLOCK_SIZE;

impl FileSource {
    /// Open the file (or stdin) and start the reader and parser threads.
    pub fn open(settings: FileSourceSettings) -> std::io::Result<FileSource> {
        let name = settings
            .path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "-".to_string());
        let reader: Box<dyn Read + Send> = match &settings.path {
            Some(p) => {
                let mut f = File::open(p)?;
                if settings.start_offset > 0 {
                    f.seek(SeekFrom::Start(settings.start_offset))?;
                }
                Box::new(f)
            }
            None => Box::new(std::io::stdin()),
        };
        let parsers = settings.parsers.max(1);
        let gate = settings
            .memory
            .clone()
            .unwrap_or_else(|| Resources::new(1, None).input_gate());
        let (pool_tx, pool_rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let mut inputs = Vec::with_capacity(parsers);
        let mut outputs = Vec::with_capacity(parsers);
        for i in 0..parsers {
            let (in_tx, in_rx) = std::sync::mpsc::sync_channel::<Block>(1);
            let (out_tx, out_rx) = mpsc::channel::<Parsed>(settings.channel_capacity.max(1));
            let s = settings.clone();
            let file = name.clone();
            let pool = pool_tx.clone();
            std::thread::Builder::new()
                .name(format!("subsink-parse-{i}"))
                .spawn(move || {
                    // Bytes per line of the last block, to size the next one's message list.
                    let mut line_bytes = 256;
                    for mut block in in_rx {
                        let expect = block.len / line_bytes;
                        // The block's charge holds its buffer and the arena its payloads
                        // decode into (the reader waited for both).
                        let mut charge = std::mem::take(&mut block.charge);
                        let buffer = block.bytes.len() as u64;
                        let mut parsed = parse_block(&block, &file, &s, expect + expect / 8 + 16);
                        if parsed.lines > 0 {
                            line_bytes = (block.len / parsed.lines as usize).max(1);
                        }
                        if !block.bytes.is_empty() && block.bytes.len() <= POOLED {
                            let _ = pool.send(block.bytes); // back to the reader for reuse
                        }
                        charge.set(charge.bytes().saturating_sub(buffer));
                        parsed.charge = charge;
                        if out_tx.blocking_send(parsed).is_err() {
                            return; // the writer stopped
                        }
                    }
                })?;
            inputs.push(in_tx);
            outputs.push(out_rx);
        }
        let start = settings.start_offset;
        let max_line = settings.max_line_bytes;
        let progress = match &settings.path {
            Some(p) if settings.progress => Progress::for_file(p, start),
            _ => None,
        };
        std::thread::Builder::new()
            .name("subsink-read".into())
            .spawn(move || read_blocks(reader, start, max_line, inputs, pool_rx, gate))?;
        Ok(FileSource {
            outputs,
            block: 0,
            pending: Default::default(),
            line_base: settings.start_line,
            stopped: false,
            on_bad_input: settings.on_bad_input,
            name,
            progress,
            held: Charge::default(),
        })
    }
}

#[async_trait::async_trait]
impl Source for FileSource {
    async fn next(&mut self) -> Option<SourceEvent> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                self.stopped = match &ev {
                    SourceEvent::Bad(_) => self.on_bad_input == OnBadInput::Fail,
                    SourceEvent::Failed(_) => true,
                    SourceEvent::Messages(_) => false,
                };
                if self.stopped {
                    self.pending.clear();
                }
                return Some(ev);
            }
            if self.stopped {
                return None;
            }
            // Everything handed out is in the writer's files now.
            self.held = Charge::default();
            let k = self.block % self.outputs.len();
            let Some(mut parsed) = self.outputs[k].recv().await else {
                if let Some(p) = &self.progress {
                    p.finish();
                }
                return None;
            };
            self.block += 1;
            self.held = std::mem::take(&mut parsed.charge);
            let base = self.line_base;
            self.line_base += parsed.lines;
            if let Some(p) = &self.progress {
                let (mut n, mut end) = (0u64, None);
                for ev in &parsed.events {
                    match ev {
                        SourceEvent::Messages(batch) => {
                            n += batch.len() as u64;
                            end = batch.last().map(|r| r.receipt.end).or(end);
                        }
                        SourceEvent::Bad(b) => end = Some(b.end),
                        SourceEvent::Failed(_) => {}
                    }
                }
                if let Some(end) = end {
                    p.advance(n, end);
                }
            }
            for mut ev in parsed.events {
                match &mut ev {
                    SourceEvent::Messages(batch) => {
                        for r in batch.iter_mut() {
                            r.receipt.line += base;
                            if r.msg.message_id.is_empty() {
                                // No messageId on the wire: the line number (docs/sources.md, Input format).
                                r.msg.message_id = r.receipt.line.to_string();
                            }
                        }
                    }
                    SourceEvent::Bad(b) => b.line += base,
                    SourceEvent::Failed(e) => *e = format!("{}:{}: {e}", self.name, self.line_base),
                }
                self.pending.push_back(ev);
            }
        }
    }

    fn describe(&self) -> &str {
        &self.name
    }
}

/// Cut the input into blocks of whole lines and deal them to the parsers in turn. A block is
/// handed over once it holds `BLOCK_SIZE` bytes, or as soon as the input has nothing more to give
/// right now (a pipe), so the batcher's timer sees every line that has arrived.
///
/// Buffers come back from the parsers through `pool` and are reused; they are kept at
/// `len == capacity` (zeroed once, when first made), with the filled part tracked apart, so no
/// byte is zeroed twice.
///
/// The buffer is charged to the memory budget (`gate`) as it grows, and a block takes its
/// buffer's charge along. Before it reads into a fresh buffer or grows one, the reader waits
/// for the budget ([`InputGate::wait_for`]): reading pauses at the input edge.
///
/// A line longer than `max_line` is not kept: the buffer grows only while the line it holds is
/// within the limit; past it, [`pass_over_line`] reads on to the line's newline in that buffer,
/// and the line goes to the parsers as a [`TooLong`] block.
fn read_blocks(
    reader: Box<dyn Read + Send>,
    offset: u64,
    max_line: u64,
    inputs: Vec<std::sync::mpsc::SyncSender<Block>>,
    pool: std::sync::mpsc::Receiver<Vec<u8>>,
    gate: InputGate,
) {
    let buf = new_buf(&pool, 0);
    let charge = gate.charge(buf.len() as u64);
    let cutter = Cutter {
        reader,
        offset,
        max_line,
        inputs,
        turn: 0,
        pool,
        gate,
        buf,
        charge,
        filled: 0,
        fresh: true,
    };
    cutter.run();
}

/// A buffer of at least `at_least` bytes: one the parsers gave back, or a new one.
fn new_buf(pool: &std::sync::mpsc::Receiver<Vec<u8>>, at_least: usize) -> Vec<u8> {
    match pool.try_recv() {
        Ok(b) if b.len() >= at_least => b,
        _ => vec![0u8; (BLOCK_SIZE * 2).max(at_least)],
    }
}

/// A block of the whole lines `bytes[..len]` at `offset` in the input.
fn lines(bytes: Vec<u8>, len: usize, offset: u64, failed: Option<String>, charge: Charge) -> Block {
    Block {
        bytes,
        len,
        offset,
        failed,
        charge,
        too_long: None,
    }
}

/// The reader thread of [`read_blocks`]: the input, the buffer it reads into, and the parsers
/// it deals blocks to.
struct Cutter {
    reader: Box<dyn Read + Send>,
    /// Byte offset in the input of `buf[0]`.
    offset: u64,
    max_line: u64,
    /// The parsers' inputs, dealt to in turn (`turn` counts the blocks sent).
    inputs: Vec<std::sync::mpsc::SyncSender<Block>>,
    turn: usize,
    /// Buffers the parsers gave back.
    pool: std::sync::mpsc::Receiver<Vec<u8>>,
    gate: InputGate,
    /// The buffer read into (`len == capacity`), its first `filled` bytes read, and its charge.
    buf: Vec<u8>,
    charge: Charge,
    filled: usize,
    /// A fresh buffer: wait for the budget before reading into it.
    fresh: bool,
}

impl Cutter {
    fn run(mut self) {
        loop {
            // The buffer is nearly full, and so holds one unfinished line (a read that brought
            // it past BLOCK_SIZE with a newline in it cut a block): past the limit, it is passed
            // over.
            if self.buf.len() - self.filled < BLOCK_SIZE / 4
                && self.filled as u64 > self.max_line
                && memchr::memchr(b'\n', &self.buf[..self.filled]).is_none()
            {
                if self.pass_over() {
                    continue;
                }
                return;
            }
            self.make_room();
            let filled = self.filled;
            let n = match self.reader.read(&mut self.buf[filled..]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.hand_over_rest(Some(e.to_string()));
                    return;
                }
            };
            let had = self.filled;
            self.filled += n;
            if n == 0 {
                if self.filled > 0 {
                    self.hand_over_rest(None); // last line without a newline
                }
                return;
            }
            if self.filled < BLOCK_SIZE && !input_idle(n, had) {
                continue;
            }
            let Some(last_nl) = memchr_last(&self.buf[..self.filled]) else {
                continue; // no whole line yet
            };
            if !self.cut(last_nl + 1) {
                return;
            }
        }
    }

    /// Deal `block` to the next parser; false when the parsers are gone.
    fn send(&mut self, block: Block) -> bool {
        let ok = self.inputs[self.turn % self.inputs.len()]
            .send(block)
            .is_ok();
        self.turn += 1;
        ok
    }

    /// Before a read: grow a buffer with no room left, or wait for the budget before reading
    /// into a fresh one.
    fn make_room(&mut self) {
        if self.buf.len() - self.filled < BLOCK_SIZE / 4 {
            // A line longer than the buffer: grow it (the new part is zeroed once), once the
            // budget allows: by doubling up to GROW_STEP, then by GROW_STEP, so a 12 MiB line
            // does not take a 16-24 MiB buffer. Growing moves the buffer: both live during the
            // copy, and both are charged until then.
            let old = self.buf.len();
            let grow = old.min(GROW_STEP);
            self.gate.wait_for(&mut self.charge, (old + grow) as u64);
            self.buf.reserve_exact(grow);
            self.buf.resize(old + grow, 0);
            self.charge.set((old + grow) as u64);
        } else if self.fresh {
            self.gate.wait_for(&mut self.charge, 0);
        }
        self.fresh = false;
    }

    /// Hand over what the buffer holds as the last block (`failed`: the read's error).
    fn hand_over_rest(&mut self, failed: Option<String>) {
        self.gate
            .wait_for(&mut self.charge, arena_bytes(self.filled));
        let buf = std::mem::take(&mut self.buf);
        let charge = std::mem::take(&mut self.charge);
        self.send(lines(buf, self.filled, self.offset, failed, charge));
    }

    /// Hand over the buffer's first `cut` bytes (whole lines) as a block, keeping what follows in
    /// a fresh buffer; false when the parsers are gone.
    fn cut(&mut self, cut: usize) -> bool {
        let rest = self.filled - cut;
        // The arena the block's payloads decode into (base64: 3/4 of the line at most), charged
        // beside the buffer while both live.
        self.gate.wait_for(&mut self.charge, arena_bytes(cut));
        let mut next = new_buf(&self.pool, rest + BLOCK_SIZE);
        next[..rest].copy_from_slice(&self.buf[cut..self.filled]);
        let block = std::mem::replace(&mut self.buf, next);
        let block_charge =
            std::mem::replace(&mut self.charge, self.gate.charge(self.buf.len() as u64));
        self.filled = rest;
        self.fresh = true;
        if !self.send(lines(block, cut, self.offset, None, block_charge)) {
            return false;
        }
        self.offset += cut as u64;
        true
    }

    /// Pass over the line over the limit that fills the buffer ([`pass_over_line`]) and hand it
    /// over as a [`TooLong`] block; false when reading ends (the input, or the parsers).
    fn pass_over(&mut self) -> bool {
        let (bytes, ended) = match pass_over_line(&mut self.reader, &mut self.buf, self.filled) {
            Ok(x) => x,
            Err(e) => {
                let failed = lines(
                    Vec::new(),
                    0,
                    self.offset,
                    Some(e.to_string()),
                    Charge::default(),
                );
                self.send(failed);
                return false;
            }
        };
        let end = self.offset + bytes + u64::from(ended.is_some());
        let block = Block {
            bytes: Vec::new(),
            len: 0,
            offset: self.offset,
            failed: None,
            charge: Charge::default(),
            too_long: Some(TooLong { bytes, end }),
        };
        if !self.send(block) {
            return false;
        }
        self.offset = end;
        let Some(rest) = ended else {
            return false; // the input ended inside the line
        };
        // What followed the newline in the last read: the next lines, in a buffer of the usual
        // size (the grown one is freed).
        let mut next = new_buf(&self.pool, rest + BLOCK_SIZE);
        next[..rest].copy_from_slice(&self.buf[..rest]);
        self.buf = next;
        self.charge.set(self.buf.len() as u64);
        self.filled = rest;
        self.fresh = true;
        true
    }
}

/// Read on past a line too long to keep, whose first `filled` bytes (no newline among them) are
/// in `buf`, reusing `buf` for what follows (a block at a time). Returns the line's length
/// without its newline, and `Some(n)` when the newline was found: `buf[..n]` then holds what followed it; `None` when the
/// input ended first.
fn pass_over_line(
    reader: &mut dyn Read,
    buf: &mut [u8],
    filled: usize,
) -> std::io::Result<(u64, Option<usize>)> {
    let mut seen = filled as u64;
    // At most a block at a time, so what follows the newline fits a buffer of the usual size
    // (two blocks) with room to read on.
    let window = buf.len().min(BLOCK_SIZE);
    loop {
        let n = match reader.read(&mut buf[..window]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok((seen, None));
        }
        match memchr::memchr(b'\n', &buf[..n]) {
            Some(i) => {
                buf.copy_within(i + 1..n, 0);
                return Ok((seen + i as u64, Some(n - i - 1)));
            }
            None => seen += n as u64,
        }
    }
}

/// A buffer holding a long line grows by doubling up to this size, then by this much.
const GROW_STEP: usize = 4 << 20;

/// The arena a block of `len` bytes of lines may decode into (its payloads' base64 at most).
fn arena_bytes(len: usize) -> u64 {
    len as u64 / 4 * 3
}

/// Whether the last read came back short, i.e. the input had nothing more to give at once.
fn input_idle(read: usize, had: usize) -> bool {
    read < BLOCK_SIZE / 4 && had + read < BLOCK_SIZE
}

fn memchr_last(b: &[u8]) -> Option<usize> {
    memchr::memrchr(b'\n', b)
}

/// `lines` is how many lines the block is expected to hold (from the last block's line length):
/// the message list is sized once for them, as growing it by doubling cost a few % of a run and
/// counting the lines first cost 2%.
fn parse_block(block: &Block, name: &str, s: &FileSourceSettings, lines: usize) -> Parsed {
    let mut events = Vec::new();
    let bad = |line: u64, start: u64, end: u64, error: WireError| {
        SourceEvent::Bad(BadLine {
            file: name.to_string(),
            line,
            start,
            end,
            error,
        })
    };
    if let Some(t) = block.too_long {
        let error = WireError::LineTooLong {
            bytes: t.bytes,
            limit: s.max_line_bytes,
        };
        return Parsed {
            events: vec![bad(0, block.offset, t.end, error)],
            lines: 1,
            charge: Charge::default(),
        };
    }
    let mut chunk = Vec::with_capacity(lines);
    // Payloads of the block decode into one arena: one allocation (and one free) per ~256 KiB.
    let mut arena = bytes::BytesMut::with_capacity(block.len);
    let mut line_no = 0u64;
    let mut pos = 0usize;
    let bytes = &block.bytes[..block.len];
    while pos < bytes.len() {
        let end = memchr::memchr(b'\n', &bytes[pos..])
            .map(|i| pos + i + 1)
            .unwrap_or(bytes.len());
        let start = block.offset + pos as u64;
        let line = &bytes[pos..end];
        let length = line.strip_suffix(b"\n").unwrap_or(line).len() as u64;
        let text = line.trim_ascii();
        let this_line = line_no;
        line_no += 1;
        pos = end;
        if text.is_empty() {
            continue;
        }
        let defaults = WireDefaults {
            publish_time_micros: s.default_publish_time_micros,
        };
        let parsed = if length > s.max_line_bytes {
            Err(WireError::LineTooLong {
                bytes: length,
                limit: s.max_line_bytes,
            })
        } else {
            Message::from_json_line_in(text, defaults, &mut arena)
        };
        match parsed {
            Ok((msg, ack_id, delivery_attempt)) => {
                chunk.push(Received {
                    msg,
                    receipt: Receipt {
                        start,
                        end: block.offset + end as u64,
                        line: this_line,
                        ack_id,
                        delivery_attempt,
                        position: None,
                    },
                });
            }
            Err(error) => {
                if !chunk.is_empty() {
                    events.push(SourceEvent::Messages(std::mem::take(&mut chunk)));
                }
                events.push(bad(this_line, start, block.offset + end as u64, error));
                if s.on_bad_input == OnBadInput::Fail {
                    return Parsed {
                        events,
                        lines: line_no,
                        charge: Charge::default(),
                    };
                }
            }
        }
    }
    if !chunk.is_empty() {
        events.push(SourceEvent::Messages(chunk));
    }
    if let Some(e) = &block.failed {
        events.push(SourceEvent::Failed(e.clone()));
    }
    Parsed {
        events,
        lines: line_no,
        charge: Charge::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    async fn collect(mut settings: FileSourceSettings) -> (Vec<Received>, Vec<BadLine>) {
        settings.default_publish_time_micros = Some(0);
        let mut src = FileSource::open(settings).unwrap();
        let (mut ok, mut bad) = (Vec::new(), Vec::new());
        while let Some(ev) = src.next().await {
            match ev {
                SourceEvent::Messages(m) => ok.extend(m),
                SourceEvent::Bad(b) => bad.push(b),
                SourceEvent::Failed(e) => panic!("{e}"),
            }
        }
        (ok, bad)
    }

    fn file(lines: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(lines.as_bytes()).unwrap();
        f
    }

    const INPUT: &str = "{\"data\":\"YQ==\",\"messageId\":\"1\"}\n\n{\"data\":\"@@\",\"messageId\":\"2\"}\n{\"data\":\"Yg==\",\"messageId\":\"3\"}";

    #[tokio::test]
    async fn skip_counts_bad_lines_with_position() {
        let f = file(INPUT);
        let mut s = FileSourceSettings::new(Some(f.path().into()));
        s.on_bad_input = OnBadInput::Skip;
        let (ok, bad) = collect(s).await;
        let ids: Vec<_> = ok.iter().map(|r| r.msg.message_id.as_str()).collect();
        assert_eq!(ids, ["1", "3"]);
        assert_eq!(ok[1].receipt.line, 4);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].line, 3);
        let text = bad[0].to_string();
        assert!(text.contains(":3: field `data`: invalid base64"), "{text}");
    }

    #[tokio::test]
    async fn fail_stops_at_first_bad_line() {
        let f = file(INPUT);
        let (ok, bad) = collect(FileSourceSettings::new(Some(f.path().into()))).await;
        assert_eq!(ok.len(), 1);
        assert_eq!(bad.len(), 1);
    }

    /// Lines over `--max-line-bytes` are bad lines named with their length and the limit,
    /// whether they fit in a block (2,000 bytes) or not (3 MiB, passed over in the reader; and
    /// 2 MiB ending the input without a newline); the lines after them are read, at their offsets.
    #[tokio::test]
    async fn lines_over_the_limit_are_bad_lines() {
        let good = |id: &str| format!("{{\"data\":\"YQ==\",\"messageId\":\"{id}\"}}\n");
        let mut input = good("1");
        input.push_str(&format!("{}\n", "x".repeat(2000)));
        input.push_str(&good("3"));
        input.push_str(&format!("{}\n", "y".repeat(3 << 20)));
        let line5 = input.len() as u64;
        input.push_str(&good("5"));
        input.push_str(&"z".repeat(2 << 20));
        let f = file(&input);
        let mut s = FileSourceSettings::new(Some(f.path().into()));
        s.on_bad_input = OnBadInput::Skip;
        s.max_line_bytes = 1000;
        let (ok, bad) = collect(s).await;
        let ids: Vec<_> = ok.iter().map(|r| r.msg.message_id.as_str()).collect();
        assert_eq!(ids, ["1", "3", "5"]);
        assert_eq!((ok[2].receipt.line, ok[2].receipt.start), (5, line5));
        let got: Vec<_> = bad.iter().map(|b| (b.line, b.error.clone())).collect();
        let over = |bytes| WireError::LineTooLong { bytes, limit: 1000 };
        assert_eq!(
            got,
            [(2, over(2000)), (4, over(3 << 20)), (6, over(2 << 20))]
        );
        assert_eq!(
            bad[1].end, line5,
            "the line passed over ends at its newline"
        );
        assert_eq!(bad[2].end, input.len() as u64);
        let text = bad[1].to_string();
        assert!(
            text.ends_with(":4: 3145728 bytes, over the 1000 bytes line limit (--max-line-bytes)"),
            "{text}"
        );
        // A line of exactly the limit is a line (here a bad one for its JSON, not its length).
        let f = file(&format!("{}\n", "x".repeat(1000)));
        let mut s = FileSourceSettings::new(Some(f.path().into()));
        s.max_line_bytes = 1000;
        let (_, bad) = collect(s).await;
        assert!(matches!(bad[0].error, WireError::Json(_)), "{}", bad[0]);
    }

    /// The default limit holds a Pub/Sub message of 10 MB in base64 with 100 attributes.
    #[tokio::test]
    async fn the_default_limit_holds_pubsub_s_largest_message() {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.encode(vec![7u8; 10 << 20]);
        let attrs: serde_json::Map<String, serde_json::Value> = (0..100)
            .map(|i| (format!("{i:0>256}"), "v".repeat(1024).into()))
            .collect();
        let line = serde_json::json!({"data": data, "attributes": attrs, "messageId": "big"});
        let f = file(&format!(
            "{line}\n{}\n",
            "q".repeat(DEFAULT_MAX_LINE_BYTES as usize + 1)
        ));
        let mut s = FileSourceSettings::new(Some(f.path().into()));
        s.on_bad_input = OnBadInput::Skip;
        let (ok, bad) = collect(s).await;
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].msg.data.len(), 10 << 20);
        assert_eq!(bad.len(), 1);
        assert_eq!(
            bad[0].error,
            WireError::LineTooLong {
                bytes: DEFAULT_MAX_LINE_BYTES + 1,
                limit: DEFAULT_MAX_LINE_BYTES
            }
        );
        assert!(bad[0].to_string().contains("over the 14 MiB line limit"));
    }

    #[tokio::test]
    async fn resumes_at_offset() {
        let f = file(INPUT);
        let (all, _) = {
            let mut s = FileSourceSettings::new(Some(f.path().into()));
            s.on_bad_input = OnBadInput::Skip;
            collect(s).await
        };
        let mut s = FileSourceSettings::new(Some(f.path().into()));
        s.start_offset = all[1].receipt.start;
        s.start_line = all[1].receipt.line;
        let (ok, bad) = collect(s).await;
        assert!(bad.is_empty());
        assert_eq!(ok, all[1..].to_vec());
    }
}
