//! The `txn` versions of a table read back ([`TxnVersions`]): `--exactly-once` with a positioned
//! source resumes where a stream partition's records in the table end.

use super::error::DeltaError;
use super::table::{log_store, DeltaTable};
use crate::upload::Destination;

/// Reads the `txn` versions of a table as they are now (`--exactly-once` with a positioned
/// source: where a stream partition's records in the table end). One handle, brought up to date before every read.
pub struct TxnVersions {
    dest: Destination,
    table: Option<deltalake_core::DeltaTable>,
}

impl TxnVersions {
    pub fn new(dest: &Destination) -> TxnVersions {
        TxnVersions {
            dest: dest.clone(),
            table: None,
        }
    }

    /// The newest version of `app_id` in the table; `None` when no commit carried it (or there
    /// is no table yet).
    pub async fn version(&mut self, app_id: &str) -> Result<Option<i64>, DeltaError> {
        let delta_err = |source| DeltaError::Delta {
            url: self.dest.url.clone(),
            source,
        };
        match &mut self.table {
            Some(t) => t.update_state().await.map_err(delta_err)?,
            None => {
                if !DeltaTable::has_log(&self.dest).await {
                    return Ok(None);
                }
                let mut t = deltalake_core::DeltaTable::new(log_store(&self.dest));
                t.load().await.map_err(delta_err)?;
                self.table = Some(t);
            }
        }
        let t = self.table.as_ref().expect("loaded above");
        t.snapshot()
            .map_err(delta_err)?
            .transaction_version(t.log_store().as_ref(), app_id)
            .await
            .map_err(delta_err)
    }
}
