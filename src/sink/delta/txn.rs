//! One `txn` action of a commit ([`AppTxn`]): where a stream partition's records in the table end.

use deltalake_core::kernel::Transaction;

/// One `txn` action of a commit: the stream partition `app_id`
/// ([`crate::position::StreamKey::app_id`]) is in the table up to
/// offset `version` (its last record in the commit). The commit holds the partition's records
/// from offset `first` on, and is refused ([`DeltaError::TxnAhead`]) when the table's version for
/// `app_id` is `first` or more already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppTxn {
    pub app_id: String,
    pub version: i64,
    pub first: i64,
}

impl AppTxn {
    /// The `txn` actions of `txns`, stamped `now` (milliseconds since the epoch).
    pub(super) fn actions(txns: &[AppTxn], now: i64) -> Vec<Transaction> {
        txns.iter()
            .map(|t| Transaction::new_with_last_update(&t.app_id, t.version, Some(now)))
            .collect()
    }
}
