//! [`Handover`]: the settle-facing part of a finalized file, as it is handed over to be made
//! durable.

use super::FileContents;

/// A finalized file about to be made durable, as the settle side sees it (`Settle::begin`): the
/// checkpoint records it as pending, a broker takes its ack references to settle them later.
pub struct Handover<'a> {
    /// Identifies the file while it is open or being made durable (opening order).
    pub id: u64,
    /// Object name, or data file path relative to the table root.
    pub name: &'a str,
    /// What it holds; a settle side may take what it keeps apart (the ack references).
    pub contents: &'a mut FileContents,
}
