//! The worker threads that run a subscription's transforms: one [`Engine`] each (a QuickJS
//! runtime is bound to its thread), as many as the machine has cores.
//!
//! Order: a batch is cut into contiguous runs, one per thread, and the outcomes are put back
//! together in the batch's order. The pipeline then handles them one by one, in that order, so
//! the messages of an ordering key reach the writer in the order they came, whichever threads
//! transformed them.

use std::sync::mpsc;
use std::thread;

use tokio::sync::oneshot;

use super::{Engine, Outcome, TransformError, Udf};
use crate::message::{Message, Received};

/// Fewer messages than this go to one thread: below it, handing work out costs more than it saves.
const MIN_RUN: usize = 32;
/// A UDF may recurse up to [`super::STACK_LIMIT`]; QuickJS's C frames need room beyond it.
const THREAD_STACK: usize = 8 << 20;

type Job = (Vec<Message>, oneshot::Sender<Vec<Outcome>>);

/// A subscription's enabled transforms and the threads that run them.
pub struct Transforms {
    names: Vec<String>,
    workers: Vec<mpsc::Sender<Job>>,
}

impl std::fmt::Debug for Transforms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transforms")
            .field("names", &self.names)
            .field("threads", &self.workers.len())
            .finish()
    }
}

impl Transforms {
    /// Start one thread per core, each loading `udfs`; `threads` overrides the count.
    /// Fails if a UDF does not load (validation checks each one before a run).
    pub fn start(udfs: &[Udf], threads: Option<usize>) -> Result<Self, TransformError> {
        // Load once here, so a broken UDF fails the start rather than every message.
        Engine::new(udfs)?;
        let n = threads
            .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let (tx, rx) = mpsc::channel::<Job>();
            let udfs = udfs.to_vec();
            thread::Builder::new()
                .name(format!("subsink-smt-{i}"))
                .stack_size(THREAD_STACK)
                .spawn(move || work(udfs, rx))
                .map_err(|e| TransformError::Engine(format!("starting a thread: {e}")))?;
            workers.push(tx);
        }
        Ok(Transforms {
            names: udfs.iter().map(|u| u.function_name.clone()).collect(),
            workers,
        })
    }

    /// The function names, in the order they run.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Transform the messages of `batch` that `wanted` accepts (those the subscription's filter
    /// let through); the others get `None`. Outcomes come back in the batch's order.
    pub async fn apply(
        &self,
        batch: &[Received],
        wanted: impl Fn(&Received) -> bool,
    ) -> Vec<Option<Outcome>> {
        let mut slots: Vec<Option<Outcome>> = Vec::with_capacity(batch.len());
        let mut todo: Vec<Message> = Vec::new();
        let mut at: Vec<usize> = Vec::new();
        for (i, r) in batch.iter().enumerate() {
            slots.push(None);
            if wanted(r) {
                todo.push(r.msg.clone());
                at.push(i);
            }
        }
        let outcomes = self.run(todo).await;
        for (i, o) in at.into_iter().zip(outcomes) {
            slots[i] = Some(o);
        }
        slots
    }

    /// Transform one message (a redelivery within the run).
    pub async fn apply_one(&self, m: &Message) -> Outcome {
        self.run(vec![m.clone()])
            .await
            .pop()
            .unwrap_or_else(|| Outcome::Failed(TransformError::Engine("no outcome".into())))
    }

    async fn run(&self, todo: Vec<Message>) -> Vec<Outcome> {
        let n = todo.len();
        if n == 0 {
            return Vec::new();
        }
        let runs = self.workers.len().min(n.div_ceil(MIN_RUN)).max(1);
        let per = n.div_ceil(runs);
        let mut pending = Vec::with_capacity(runs);
        // Contiguous runs, front to back.
        let mut pieces = Vec::with_capacity(runs);
        let mut it = todo.into_iter();
        loop {
            let piece: Vec<Message> = it.by_ref().take(per).collect();
            if piece.is_empty() {
                break;
            }
            pieces.push(piece);
        }
        for (w, piece) in pieces.into_iter().enumerate() {
            let len = piece.len();
            let (tx, rx) = oneshot::channel();
            let sent = self.workers[w % self.workers.len()].send((piece, tx));
            pending.push((len, sent.is_ok().then_some(rx)));
        }
        let mut out = Vec::with_capacity(n);
        for (len, rx) in pending {
            let got = match rx {
                Some(rx) => rx.await.ok(),
                None => None,
            };
            match got {
                Some(v) if v.len() == len => out.extend(v),
                _ => out.extend((0..len).map(|_| {
                    Outcome::Failed(TransformError::Engine("a transform thread stopped".into()))
                })),
            }
        }
        out
    }
}

fn work(udfs: Vec<Udf>, rx: mpsc::Receiver<Job>) {
    let mut engine = Engine::new(&udfs);
    while let Ok((msgs, tx)) = rx.recv() {
        let out = match &mut engine {
            Ok(e) => msgs.iter().map(|m| e.apply(m)).collect(),
            Err(err) => msgs.iter().map(|_| Outcome::Failed(err.clone())).collect(),
        };
        let _ = tx.send(out);
    }
}
