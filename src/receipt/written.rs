//! [`Written`]: what making a file durable made durable, with the messages the destination
//! refused one by one ([`Rejected`]).

/// What [`crate::sink::Durable::make_durable`] made durable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// Bytes written.
    pub bytes: u64,
    /// Messages of the file the destination refused after the file was handed to it (a row
    /// BigQuery rejected): each fails alone, as a refused message does
    /// ([`super::Refusal::FailsAlone`]); every other message of the file is durable. Sorted by
    /// index, each index once.
    pub rejected: Vec<Rejected>,
    /// What the summary and the log name for the file: the data files its commit added (a Delta
    /// table's paths; none for a MERGE of deletes only). `None`: the file itself, by its name.
    pub committed: Option<Vec<String>>,
}

/// One message of a durable file that the destination refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Its place in the file: the 0-based position among the file's messages, in the order they
    /// were pushed (the order of [`FileContents::acks`] and [`FileContents::held`]).
    pub index: usize,
    /// Why, as the destination said it (with the message id where known).
    pub error: String,
}

impl From<u64> for Written {
    /// Every message durable.
    fn from(bytes: u64) -> Written {
        Written {
            bytes,
            rejected: Vec::new(),
            committed: None,
        }
    }
}

impl Written {
    /// A commit of `bytes` that added the data files `files`.
    pub fn committed(bytes: u64, files: Vec<String>) -> Written {
        Written {
            bytes,
            rejected: Vec::new(),
            committed: Some(files),
        }
    }

    /// Split the items of a file (its ack references, or its held messages) into the durable
    /// ones and the rejected ones with their errors.
    pub fn split<T>(&self, items: Vec<T>) -> (Vec<T>, Vec<(T, String)>) {
        if self.rejected.is_empty() {
            return (items, Vec::new());
        }
        let mut bad = self.rejected.iter().peekable();
        let (mut ok, mut out) = (Vec::with_capacity(items.len()), Vec::new());
        for (i, item) in items.into_iter().enumerate() {
            match bad.peek() {
                Some(r) if r.index == i => {
                    out.push((item, r.error.clone()));
                    bad.next();
                }
                _ => ok.push(item),
            }
        }
        (ok, out)
    }
}

#[cfg(test)]
mod tests {
    use super::{Rejected, Written};

    #[test]
    fn written_splits_the_rejected_messages_out_by_index() {
        let w = Written {
            bytes: 10,
            rejected: vec![
                Rejected {
                    index: 1,
                    error: "bad one".into(),
                },
                Rejected {
                    index: 3,
                    error: "bad three".into(),
                },
            ],
            committed: None,
        };
        let (ok, bad) = w.split(vec!["a", "b", "c", "d", "e"]);
        assert_eq!(ok, ["a", "c", "e"]);
        assert_eq!(
            bad,
            [("b", "bad one".to_string()), ("d", "bad three".to_string())]
        );
        let (ok, bad) = Written::from(3).split(vec![1, 2]);
        assert_eq!((ok, bad.len()), (vec![1, 2], 0));
    }
}
