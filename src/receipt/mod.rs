//! Receipts: what a source, the settle side and a sink share about a message and the file holding
//! it — neither a source's nor a sink's, so that neither side names the other. Sources and
//! `settle/` import this module, never `sink/`; sinks import it to say what they hold and what
//! became of it.
//!
//! | piece | what it is |
//! |---|---|
//! | [`AckRef`] | a pulled message inside a file: the handle its source settles it with |
//! | [`FileContents`] | what a file holds, for settling and for error messages |
//! | [`Handover`] | a finalized file as the settle side sees it, before it is made durable |
//! | [`Replay`] | a file a crashed run left pending, to be written again exactly |
//! | [`Written`], [`Rejected`] | what became durable, and the messages refused one by one |
//! | [`NotDurable`] | why a file did not become durable, as the settle side needs it |
//! | [`Refused`], [`Refusal`] | a message a sink cannot hold, and what that means for it |
//! | [`MessageCheck`] | what a sink would refuse, asked before a message is accepted (push) |
//! | [`PositionedSource`] | a source with stream positions, as error messages name it |
//!
//! A failed file reaches the settle side as a [`NotDurable`], not as the sink's own error: the
//! settle side needs only its text (for logs, dead letters and the summary), whether trying again
//! later can help (a push endpoint's answer) and whether it was given up at the end of the
//! shutdown grace. The sink's error converts into it where the outcome is handed to the settle
//! side (`pipeline.rs`), with the same text.

mod ack;
mod contents;
mod handover;
mod not_durable;
mod positioned;
mod refused;
mod replay;
mod written;

pub use ack::AckRef;
pub use contents::FileContents;
pub use handover::Handover;
pub use not_durable::NotDurable;
pub use positioned::PositionedSource;
pub use refused::{MessageCheck, Refusal, Refused};
pub use replay::Replay;
pub use written::{Rejected, Written};
