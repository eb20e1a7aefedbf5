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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::sink::delta::data_file::DataFile;
    use crate::sink::delta::txn::AppTxn;
    use crate::table::parquet::write_parquet;

    /// `txn` actions land with the data and are read back; a commit whose partition the table
    /// already holds from its first offset on is refused, and so is one that races a commit of
    /// the same application id (deltalake's conflict check).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn txn_versions_are_committed_with_the_data_and_compared_before() {
        let dest = Destination::from_url("memory://").unwrap();
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let mut versions = TxnVersions::new(&dest);
        let app_id = |p: i32| format!("subsink-x/g/x/t/{p}");
        let (p0, p1) = (app_id(0), app_id(1));
        assert_eq!(versions.version(&p0).await.unwrap(), None, "no table yet");
        let mut a = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
        let mut b = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
        let file = |t: &DeltaTable| {
            let batch = RecordBatch::try_new(
                t.schema().clone(),
                vec![Arc::new(Int64Array::from(vec![1]))],
            )
            .unwrap();
            DataFile::new(write_parquet(t.schema(), &[batch], None).unwrap())
        };
        let txn = |app_id: &str, first, version| AppTxn {
            app_id: app_id.to_string(),
            version,
            first,
        };
        let f = file(&a);
        a.commit_with(vec![f], &[txn(&p0, 0, 9), txn(&p1, 0, 4)])
            .await
            .unwrap();
        assert_eq!(versions.version(&p0).await.unwrap(), Some(9));
        assert_eq!(versions.version(&p1).await.unwrap(), Some(4));
        // The table holds p0 up to 9: a commit from 5 on is refused, nothing lands.
        let f = file(&a);
        let err = a
            .commit_with(vec![f], &[txn(&p0, 5, 12)])
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                DeltaError::TxnAhead {
                    table: 9,
                    first: 5,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(a.version(), 1);
        // b built on version 0 (it never saw p0 at 9): deltalake's conflict check refuses it.
        let f = file(&b);
        let err = b.commit_with(vec![f], &[txn(&p0, 0, 3)]).await.unwrap_err();
        assert!(err.to_string().contains("Concurrent transaction"), "{err}");
        // A partition no later version touched goes on from the same stale snapshot.
        let p2 = app_id(2);
        let f = file(&b);
        assert_eq!(b.commit_with(vec![f], &[txn(&p2, 0, 7)]).await.unwrap(), 2);
        let f = file(&a);
        assert_eq!(
            a.commit_with(vec![f], &[txn(&p0, 10, 11)]).await.unwrap(),
            3
        );
        assert_eq!(versions.version(&p0).await.unwrap(), Some(11));
        assert_eq!(versions.version(&p1).await.unwrap(), Some(4));
        assert_eq!(versions.version(&p2).await.unwrap(), Some(7));
    }
}
