//! [`NotDurable`]: why a file did not become durable, as the settle side needs it.

/// A file that did not become durable: the destination's error as its text, and the two things
/// settling decides on. Made from the sink's own error where the outcome is handed to the settle
/// side; its text is that error's, word for word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotDurable {
    /// The error, as the sink words it.
    pub message: String,
    /// Can trying again later help (a network fault, a server error, a race)?
    pub retryable: bool,
    /// The shutdown grace ended before the file was durable: it was given up, its messages are
    /// not done and are handed back at close.
    pub gave_up: bool,
}

impl std::fmt::Display for NotDurable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
