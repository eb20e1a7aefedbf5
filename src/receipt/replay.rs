//! [`Replay`]: a file a crashed run left pending, written again exactly.

/// A file to write again exactly as a crashed run left it pending (see [`crate::checkpoint_file`]):
/// under the recorded name, holding the messages from the one it opens with through the one that
/// starts at input offset `last`, written only if no object of that name exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub object: String,
    pub last: u64,
}
