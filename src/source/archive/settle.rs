//! Settling an archive source: the file source's checkpoint ([`CheckpointSettle`]), whose
//! positions are (object, record) pairs ([`crate::source::archive::record_number`]); at the end of the
//! run the archive's counts go into the summary.

use std::sync::Arc;

use crate::input::BadLine;
use crate::message::Received;
use crate::receipt::{Handover, Refusal, Refused};
use crate::settle::watermark::CheckpointSettle;
use crate::settle::{Admission, Ended, Resume, Settle, SettleError, Verdict};
use crate::source::archive::ArchiveStats;
use crate::summary::{ArchiveSummary, RunSummary};

/// The checkpoint, and the archive's counts for the summary.
pub struct ArchiveSettle {
    inner: CheckpointSettle,
    stats: Arc<ArchiveStats>,
}

impl ArchiveSettle {
    pub fn new(inner: CheckpointSettle, stats: Arc<ArchiveStats>) -> ArchiveSettle {
        ArchiveSettle { inner, stats }
    }
}

#[async_trait::async_trait]
impl Settle for ArchiveSettle {
    fn admit(&mut self, r: &Received, group: Option<&str>, summary: &mut RunSummary) -> Admission {
        self.inner.admit(r, group, summary)
    }

    fn written(&mut self, r: &Received) {
        self.inner.written(r)
    }

    fn filtered(&mut self, r: &Received) {
        self.inner.filtered(r)
    }

    async fn batch_done(&mut self) {
        self.inner.batch_done().await
    }

    fn bad_line(&mut self, bad: &BadLine) -> Verdict {
        self.inner.bad_line(bad)
    }

    async fn refused(
        &mut self,
        r: &Received,
        error: Refused,
        refusal: Refusal,
        summary: &mut RunSummary,
    ) -> Result<Verdict, SettleError> {
        self.inner.refused(r, error, refusal, summary).await
    }

    fn begin(&mut self, file: Handover<'_>) -> Result<(), SettleError> {
        self.inner.begin(file)
    }

    async fn end(&mut self, ended: Ended<'_>, summary: &mut RunSummary) -> Result<(), SettleError> {
        self.inner.end(ended, summary).await
    }

    async fn close(&mut self, summary: &mut RunSummary) -> Result<(), SettleError> {
        let c = self.stats.counts();
        summary.archive = Some(ArchiveSummary {
            objects_listed: c.objects_listed,
            objects_read: c.objects_read,
            objects_skipped: c.objects_skipped,
            objects_broken: c.objects_broken,
            bytes_read: c.bytes_read,
        });
        self.inner.close(summary).await
    }

    fn resume(&mut self) -> Option<&mut dyn Resume> {
        self.inner.resume()
    }
}
