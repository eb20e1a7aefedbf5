//! The discard sink: counts and writes nothing. The pipeline without a store — source, filter,
//! batcher, settling — for benchmarks (`--bucket-url discard://` or `--table-url discard://`).
//! A message counts its payload and attribute bytes; every file is durable at once.

pub mod register;

use super::{Durable, PushError, Sink, SinkError, SinkFile, Unstaged};
use crate::batch::Limits;
use crate::message::Received;
use crate::receipt::{Refusal, Refused};

/// Counts messages into files and drops them.
pub struct DiscardSink {
    limits: Limits,
    files: u64,
}

impl DiscardSink {
    pub fn new(limits: Limits) -> DiscardSink {
        DiscardSink { limits, files: 0 }
    }
}

impl Sink for DiscardSink {
    type File = DiscardFile;

    fn limits(&self) -> Limits {
        self.limits
    }

    fn refusal(&self) -> Refusal {
        Refusal::BadInput
    }

    fn open(&mut self, _group: Option<&str>) -> Result<DiscardFile, PushError> {
        self.files += 1;
        Ok(DiscardFile {
            name: format!("discarded-{}", self.files),
            bytes: 0,
            staged: 0,
        })
    }

    async fn is_durable(&self, _name: &str) -> Result<bool, SinkError> {
        // Nothing was ever written, so nothing a crashed run left pending exists.
        Ok(false)
    }
}

pub struct DiscardFile {
    name: String,
    bytes: u64,
    staged: u64,
}

impl SinkFile for DiscardFile {
    type Closed = DiscardFile;

    fn name(&self) -> &str {
        &self.name
    }

    fn header_bytes(&self) -> u64 {
        0
    }

    fn stage(&mut self, r: &Received) -> Result<u64, Refused> {
        self.staged = super::chunk::message_bytes(&r.msg);
        Ok(self.staged)
    }

    fn commit(&mut self) {
        self.bytes += self.staged;
    }

    fn unstage(&mut self, _carry: &mut Vec<u8>) -> Unstaged {
        Unstaged::Restage
    }

    fn close(self) -> DiscardFile {
        self
    }
}

#[async_trait::async_trait]
impl Durable for DiscardFile {
    fn name(&self) -> &str {
        &self.name
    }

    async fn make_durable(self: Box<Self>) -> Result<crate::receipt::Written, SinkError> {
        Ok(self.bytes.into())
    }

    async fn abort(self: Box<Self>) {}
}
