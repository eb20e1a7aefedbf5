//! NDJSON file or stdin of Pub/Sub `PubsubMessage` JSON (SPEC §1.1), one message per line.
//!
//! Lines are parsed on a dedicated thread and handed over in chunks through a bounded channel, so
//! parsing (JSON + base64) runs beside encoding and upload, and memory stays bounded by
//! `chunk_size × channel capacity` whatever the input size. Blank lines are not messages and are
//! passed over.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::PathBuf;

use tokio::sync::mpsc;

use super::{BadLine, Source, SourceEvent};
use crate::message::{Message, Receipt, Received, WireDefaults};

/// Whether a malformed line stops the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnBadInput {
    /// Stop reading at the first malformed line (the run exits non-zero).
    #[default]
    Fail,
    /// Log the line (file:line and the problem), count it, and go on.
    Skip,
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
    /// Messages per chunk handed to the writer.
    pub chunk_size: usize,
    /// Chunks buffered between the parser thread and the writer.
    pub channel_capacity: usize,
    /// `publishTime` for lines without one (microseconds since the epoch); `None` = now.
    pub default_publish_time_micros: Option<i64>,
}

impl FileSourceSettings {
    pub fn new(path: Option<PathBuf>) -> Self {
        FileSourceSettings {
            path,
            start_offset: 0,
            start_line: 1,
            on_bad_input: OnBadInput::Fail,
            chunk_size: 1024,
            channel_capacity: 8,
            default_publish_time_micros: None,
        }
    }
}

/// The file source: a reader thread and the receiving end of its channel.
pub struct FileSource {
    rx: mpsc::Receiver<SourceEvent>,
    name: String,
}

impl FileSource {
    /// Open the file (or stdin) and start the parser thread.
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
        let (tx, rx) = mpsc::channel(settings.channel_capacity.max(1));
        let thread_name = name.clone();
        std::thread::Builder::new()
            .name("subsink-parse".into())
            .spawn(move || parse_loop(reader, &thread_name, settings, tx))?;
        Ok(FileSource { rx, name })
    }
}

#[async_trait::async_trait]
impl Source for FileSource {
    async fn next(&mut self) -> Option<SourceEvent> {
        self.rx.recv().await
    }

    fn describe(&self) -> &str {
        &self.name
    }
}

fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

fn parse_loop(
    reader: Box<dyn Read + Send>,
    name: &str,
    s: FileSourceSettings,
    tx: mpsc::Sender<SourceEvent>,
) {
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let mut line = Vec::with_capacity(8 << 10);
    let mut offset = s.start_offset;
    let mut line_no = s.start_line;
    let mut chunk = Vec::with_capacity(s.chunk_size);
    loop {
        line.clear();
        let n = match reader.read_until(b'\n', &mut line) {
            Ok(n) => n,
            Err(e) => {
                if !chunk.is_empty() {
                    let _ = tx.blocking_send(SourceEvent::Messages(std::mem::take(&mut chunk)));
                }
                let _ = tx.blocking_send(SourceEvent::Failed(format!("{name}:{line_no}: {e}")));
                return;
            }
        };
        if n == 0 {
            break;
        }
        let start = offset;
        offset += n as u64;
        let this_line = line_no;
        line_no += 1;
        let text = trim_ascii(&line);
        if text.is_empty() {
            continue;
        }
        let defaults = WireDefaults {
            publish_time_micros: s.default_publish_time_micros.unwrap_or_else(now_micros),
            line: this_line,
        };
        match Message::from_json_line(text, defaults) {
            Ok((msg, ack_id, delivery_attempt)) => {
                chunk.push(Received {
                    msg,
                    receipt: Receipt {
                        start,
                        end: offset,
                        line: this_line,
                        ack_id,
                        delivery_attempt,
                    },
                });
                // Hand the chunk over when it is full, or when the next line is not buffered yet
                // (a pipe or a growing file may not deliver it for a while, and the batcher's
                // timer must still see what has arrived).
                if chunk.len() >= s.chunk_size || reader.buffer().is_empty() {
                    let full = std::mem::replace(&mut chunk, Vec::with_capacity(s.chunk_size));
                    if tx.blocking_send(SourceEvent::Messages(full)).is_err() {
                        return; // the writer stopped
                    }
                }
            }
            Err(error) => {
                if !chunk.is_empty()
                    && tx
                        .blocking_send(SourceEvent::Messages(std::mem::take(&mut chunk)))
                        .is_err()
                {
                    return;
                }
                let bad = BadLine {
                    file: name.to_string(),
                    line: this_line,
                    start,
                    end: offset,
                    error,
                };
                if tx.blocking_send(SourceEvent::Bad(bad)).is_err() {
                    return;
                }
                if s.on_bad_input == OnBadInput::Fail {
                    return;
                }
            }
        }
    }
    if !chunk.is_empty() {
        let _ = tx.blocking_send(SourceEvent::Messages(chunk));
    }
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    b.trim_ascii()
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
        s.chunk_size = 1;
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
