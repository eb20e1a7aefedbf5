//! Settling pushed messages: each push request waits for its message; the answer is the ack
//! (docs/contract.md §5). 2xx once the file holding it is durable, an error status when it failed
//! or the sink refused it — Pub/Sub then redelivers it with its push backoff and dead-letters it by
//! the subscription's policy, so subsink neither backs off nor dead-letters pushed messages itself.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Admission, Settle, SettleError, Verdict};
use crate::message::Received;
use crate::sink::{
    AckRef, FileContents, FinalizedFile, Refusal, Refused, SinkError, Stage, Written,
};
use crate::source::push::Pending;
use crate::source::BadLine;
use crate::summary::RunSummary;

/// The push endpoint's settle side.
pub struct PushSettle {
    pending: Arc<Pending>,
    /// Request ids of the messages of the files being made durable.
    inflight: HashMap<u64, Vec<AckRef>>,
}

impl PushSettle {
    pub fn new(pending: Arc<Pending>) -> PushSettle {
        PushSettle {
            pending,
            inflight: HashMap::new(),
        }
    }
}

#[async_trait::async_trait]
impl Settle for PushSettle {
    fn admit(&mut self, r: &Received, _group: Option<&str>, _: &mut RunSummary) -> Admission {
        Admission::Write(Some(AckRef {
            ack_id: r.receipt.ack_id.clone().unwrap_or_default(),
            message_id: r.msg.message_id.clone(),
            attempt: r.receipt.delivery_attempt.unwrap_or(1).max(1) as u32,
            ordering_key: String::new(),
            kept: None,
        }))
    }

    fn written(&mut self, _r: &Received) {}

    fn filtered(&mut self, r: &Received) {
        if let Some(id) = &r.receipt.ack_id {
            self.pending.resolve(id, true);
        }
    }

    fn bad_line(&mut self, _bad: &BadLine) -> Verdict {
        Verdict::Continue
    }

    async fn refused(
        &mut self,
        r: &Received,
        error: Refused,
        _refusal: Refusal,
        _stage: &mut dyn Stage,
        _done: &mut Vec<FinalizedFile>,
        summary: &mut RunSummary,
    ) -> Result<Verdict, SettleError> {
        tracing::error!("pushed message: {error}");
        if let Some(id) = &r.receipt.ack_id {
            self.pending.resolve(id, false);
        }
        summary.messages_nacked += 1;
        Ok(Verdict::Continue)
    }

    fn begin(&mut self, f: &mut FinalizedFile) -> Result<(), SettleError> {
        self.inflight
            .insert(f.id, std::mem::take(&mut f.contents.acks));
        Ok(())
    }

    async fn end(
        &mut self,
        id: u64,
        _name: &str,
        _contents: &FileContents,
        result: &Result<Written, SinkError>,
        _open_starts: Vec<(u64, u64)>,
        summary: &mut RunSummary,
    ) -> Result<(), SettleError> {
        let acks = self.inflight.remove(&id).unwrap_or_default();
        let ok = result.is_ok();
        let acks = match result {
            Ok(w) => {
                // Rows the destination rejected: answered as failed (Pub/Sub redelivers them).
                let (acks, rejected) = w.split(acks);
                for (a, why) in &rejected {
                    tracing::error!("message {}: {why}", a.message_id);
                    self.pending.resolve(&a.ack_id, false);
                }
                summary.messages_nacked += rejected.len() as u64;
                acks
            }
            Err(_) => acks,
        };
        for a in &acks {
            self.pending.resolve(&a.ack_id, ok);
        }
        if ok {
            summary.messages_acked += acks.len() as u64;
        } else {
            summary.messages_nacked += acks.len() as u64;
        }
        Ok(())
    }

    fn failures_redelivered(&self) -> bool {
        true
    }

    async fn close(&mut self, summary: &mut RunSummary) -> Result<(), SettleError> {
        for (_, acks) in self.inflight.drain() {
            for a in &acks {
                self.pending.resolve(&a.ack_id, false);
            }
            summary.messages_nacked += acks.len() as u64;
        }
        Ok(())
    }
}
