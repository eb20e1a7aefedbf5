//! The export side of the push spool ([`crate::source::push::spool`]): its segments read as one growing NDJSON
//! input, as the file source reads a file. A message's receipt holds its spool positions (which
//! span segments), so the checkpoint's watermark ([`crate::settle::watermark::CheckpointSettle`])
//! settles the spool as it settles a file.

use super::spool::SpoolReader;
use crate::input::{BadLine, Source, SourceEvent};
use crate::message::{Message, Receipt, Received, WireDefaults};

/// Bytes read from the spool at a time.
const CHUNK: usize = 1 << 20;

/// The spool, read from the checkpoint's watermark on.
pub struct SpoolSource {
    reader: SpoolReader,
    /// 1-based number of the next line (counted from the checkpoint's).
    line: u64,
    name: String,
}

impl SpoolSource {
    /// Read from where `reader` starts, whose line number is `line`.
    pub fn new(reader: SpoolReader, line: u64, name: String) -> SpoolSource {
        SpoolSource { reader, line, name }
    }

    /// Does it wait for the open files to be finalized (a retry of failed files is due)?
    pub fn holding(&self) -> bool {
        self.reader.holding()
    }
}

#[async_trait::async_trait]
impl Source for SpoolSource {
    async fn next(&mut self) -> Option<SourceEvent> {
        // While a retry of failed files is pending, reading waits ([`SpoolReader::retry_step`]).
        // (The pipeline asks again after each of its events: a failure is seen at once.)
        let (start, chunk) = loop {
            match self.reader.retry_step() {
                Err(wait) => tokio::time::sleep(wait).await,
                Ok(rewound) => {
                    if let Some(line) = rewound {
                        self.line = line;
                    }
                    break self.reader.next_chunk(CHUNK).await?;
                }
            }
        };
        let mut batch = Vec::new();
        let mut arena = bytes::BytesMut::with_capacity(chunk.len());
        let mut pos = 0usize;
        while pos < chunk.len() {
            let end = memchr::memchr(b'\n', &chunk[pos..]).map_or(chunk.len(), |i| pos + i + 1);
            let line = self.line;
            self.line += 1;
            let (s, e) = (start + pos as u64, start + end as u64);
            let text = chunk[pos..end].trim_ascii();
            pos = end;
            match Message::from_json_line_in(
                text,
                WireDefaults {
                    publish_time_micros: None,
                },
                &mut arena,
            ) {
                Ok((mut msg, _, _)) => {
                    if msg.message_id.is_empty() {
                        msg.message_id = line.to_string();
                    }
                    batch.push(Received {
                        msg,
                        receipt: Receipt {
                            start: s,
                            end: e,
                            line,
                            ack_id: None,
                            delivery_attempt: None,
                            position: None,
                        },
                    });
                }
                // Never written so (a line is cut at startup unless it is a message): logged and
                // passed over, as a bad line of a file.
                Err(error) => {
                    if !batch.is_empty() {
                        // Handed out first; the bad line comes with the next call.
                        self.line = line;
                        self.reader.rewind(s);
                        return Some(SourceEvent::Messages(batch));
                    }
                    return Some(SourceEvent::Bad(BadLine {
                        file: self.name.clone(),
                        line,
                        start: s,
                        end: e,
                        error,
                    }));
                }
            }
        }
        Some(SourceEvent::Messages(batch))
    }

    fn describe(&self) -> &str {
        &self.name
    }
}
