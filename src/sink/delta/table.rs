//! Committing Parquet files as a Delta Lake table on any object store, through the `deltalake-core`
//! crate (only its `rustls` feature: no datafusion, no cloud credential stack of its own).
//!
//! A commit uploads its Parquet files first (single puts: whole objects or nothing, and invisible to
//! readers, who only see files an `add` action in `_delta_log` names), then writes the next log
//! version with put-if-not-exists (`PutMode::Create`). When another writer took that version,
//! deltalake reloads the log, checks the two transactions for conflicts (blind appends never
//! conflict) and tries the next version, so concurrent writers never lose a commit. After a commit
//! deltalake writes a checkpoint every `delta.checkpointInterval` versions (100 unless the table
//! says otherwise); a failure there does not fail the commit, which has already landed.
//!
//! The table lives at the root of the [`Destination`]'s store (a `file://` directory, an
//! `s3://bucket/prefix`, …); deltalake is handed that store directly, so credentials and endpoints
//! come from the same place as every other subsink write.
//!
//! The Arrow → Delta form of the rows is [`super::form`].

use std::sync::Arc;

use arrow_schema::{Schema, SchemaRef};
use deltalake_core::kernel::engine::arrow_conversion::TryFromArrow;
use deltalake_core::kernel::transaction::{
    CommitBuilder, CommitConflictError, CommitProperties, TransactionError,
};
use deltalake_core::kernel::{Action, StructType};
use deltalake_core::logstore::{default_logstore, LogStoreRef, StorageConfig};
use deltalake_core::operations::create::CreateBuilder;
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::DeltaTableError;
use object_store::path::Path;
use object_store::ObjectStoreExt;

use super::data_file::DataFile;
use super::error::DeltaError;
use super::form::delta_arrow_schema;
use super::stats::{add_action, StatsColumns};
use super::txn::AppTxn;
use crate::upload::Destination;

/// How many times a commit tries the next log version after other writers took it. Appends never
/// conflict, so this only bounds how long a commit can be starved by faster writers.
pub const MAX_COMMIT_RETRIES: usize = 1000;

/// Reloads of the log after a listed but unreadable version (see [`DeltaTable::commit`]).
const MAX_RELOADS: usize = 20;

/// A handle on one Delta table: its log store and the last snapshot this writer saw.
pub struct DeltaTable {
    pub(super) url: String,
    pub(super) dest: Destination,
    pub(super) table: deltalake_core::DeltaTable,
    pub(super) schema: SchemaRef,
    /// The table's partition columns (its metadata's), in order.
    pub(super) partition_columns: Vec<String>,
    /// Change data capture: the tombstone table, once opened ([`super::merge`]).
    pub(super) tombstones: Option<Box<DeltaTable>>,
    /// How long a tombstone keeps older changes of its key out (`--table-delete-retention`).
    pub(super) delete_retention: std::time::Duration,
    /// On a tombstone table: when its expired tombstones were last removed.
    pub(super) expired_at: Option<std::time::Instant>,
}

impl std::fmt::Debug for DeltaTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaTable")
            .field("url", &self.url)
            .field("version", &self.version())
            .finish()
    }
}

pub(crate) fn log_store(dest: &Destination) -> LogStoreRef {
    // deltalake reads the log through `dest.store` (rooted at the table) and hands its kernel a
    // "root" store that it addresses with full URLs. A local directory gets its real `file://` URL
    // and a store rooted at `/`: the kernel sorts local listings only for `file` URLs. Every other
    // store is addressed as the root of `memory:///`, the name deltalake sees for `dest.store`;
    // their listings are lexicographic already (S3, GCS, Azure, in-memory).
    if dest.url.starts_with("file:") {
        if let Some(dir) = url::Url::parse(&dest.url)
            .ok()
            .and_then(|u| u.to_file_path().ok())
            .and_then(|p| std::fs::canonicalize(p).ok())
        {
            if let Ok(location) = url::Url::from_directory_path(&dir) {
                return default_logstore(
                    dest.store.clone(),
                    Arc::new(object_store::local::LocalFileSystem::new()),
                    &location,
                    &StorageConfig::default(),
                );
            }
        }
    }
    let location = url::Url::parse("memory:///").expect("a valid URL");
    default_logstore(
        dest.store.clone(),
        dest.store.clone(),
        &location,
        &StorageConfig::default(),
    )
}

impl DeltaTable {
    /// Open the Delta table at the root of `dest`, or create it (version 0: protocol and
    /// metadata) with the Delta form of `schema` (the mapping core's Arrow schema). An existing
    /// table must have the same columns and types.
    pub async fn open_or_create(
        dest: &Destination,
        schema: &Schema,
    ) -> Result<DeltaTable, DeltaError> {
        Self::open_or_create_with_properties(dest, schema, &[]).await
    }

    /// [`DeltaTable::open_or_create`], setting Delta table properties (`delta.checkpointInterval`,
    /// `delta.appendOnly`, `delta.logRetentionDuration`, …) when this call creates the table; an
    /// existing table keeps its own.
    pub async fn open_or_create_with_properties(
        dest: &Destination,
        schema: &Schema,
        properties: &[(&str, &str)],
    ) -> Result<DeltaTable, DeltaError> {
        Self::open_or_create_partitioned(dest, schema, &[], "", properties).await
    }

    /// [`DeltaTable::open_or_create_with_properties`], creating a table partitioned by
    /// `partition_columns` (columns of `schema`; made by the configured `partition_by`) when this
    /// call creates it. An existing table keeps its own partition columns, which must be those
    /// when any are given; its columns must take `schema` ([`super::existing`]).
    pub async fn open_or_create_partitioned(
        dest: &Destination,
        schema: &Schema,
        partition_columns: &[String],
        partition_by: &str,
        properties: &[(&str, &str)],
    ) -> Result<DeltaTable, DeltaError> {
        let url = dest.url.clone();
        let delta_schema = delta_arrow_schema(schema)?;
        let struct_type =
            StructType::try_from_arrow(delta_schema.as_ref()).map_err(|e| DeltaError::Schema {
                column: "$".into(),
                reason: e.to_string(),
            })?;
        let delta_err = |source| DeltaError::Delta {
            url: url.clone(),
            source,
        };
        crate::upload::check_put_if_absent(dest)
            .await
            .map_err(|reason| DeltaError::NoPutIfAbsent {
                url: url.clone(),
                reason,
            })?;
        let store = log_store(dest);
        let mut table = deltalake_core::DeltaTable::new(store.clone());
        // No log yet: create without a load, which would log an error for the missing log.
        let loaded = if Self::has_log(dest).await {
            table.load().await
        } else {
            Err(DeltaTableError::NotATable("no _delta_log".into()))
        };
        match loaded {
            Ok(()) => {}
            Err(DeltaTableError::NotATable(_)) => {
                let created = CreateBuilder::new()
                    .with_log_store(store.clone())
                    .with_columns(struct_type.fields().cloned())
                    .with_partition_columns(partition_columns.to_vec())
                    .with_save_mode(SaveMode::Ignore)
                    .with_configuration(properties.iter().map(|(k, v)| (*k, Some(*v))))
                    // No retry: when another writer creates the table first, deltalake would
                    // retry the create as version 1 (a second protocol + metadata commit); use
                    // theirs instead.
                    .with_commit_properties(CommitProperties::default().with_max_retries(0))
                    .await;
                match created {
                    Ok(t) => table = t,
                    // Another writer created it at the same moment: use theirs.
                    Err(_) if Self::exists(&store).await => {
                        table = deltalake_core::DeltaTable::new(store.clone());
                        table.load().await.map_err(delta_err)?;
                    }
                    Err(e) => return Err(delta_err(e)),
                }
            }
            Err(e) => return Err(delta_err(e)),
        }
        let snapshot = table.snapshot().map_err(delta_err)?;
        let writes = super::existing::Writes {
            columns: &struct_type,
            partition_columns,
            partition_by,
        };
        let partitioned_by = snapshot.metadata().partition_columns();
        use super::existing::{check, Misfit};
        check(&snapshot.schema(), partitioned_by, &writes).map_err(|m| match m {
            Misfit::Partitions(reason) => DeltaError::Partitioning {
                url: url.clone(),
                reason,
            },
            Misfit::Columns(diff) => DeltaError::SchemaMismatch {
                url: url.clone(),
                diff,
            },
        })?;
        let partition_columns = snapshot.metadata().partition_columns().to_vec();
        Ok(DeltaTable {
            url,
            dest: dest.clone(),
            table,
            schema: delta_schema,
            partition_columns,
            tombstones: None,
            delete_retention: crate::table::cdc::DEFAULT_DELETE_RETENTION,
            expired_at: None,
        })
    }

    /// Does the table root hold any `_delta_log/` entry?
    pub(super) async fn has_log(dest: &Destination) -> bool {
        use futures::StreamExt;
        let prefix = Path::from("_delta_log");
        let mut list = dest.store.list(Some(&prefix));
        // A listing error means "cannot tell": let the load report it.
        list.next().await.is_some()
    }

    async fn exists(store: &LogStoreRef) -> bool {
        let mut t = deltalake_core::DeltaTable::new(store.clone());
        t.load().await.is_ok()
    }

    /// Is the data file `path` (relative to the table root) in the table's newest version? Used
    /// when resuming: a file the previous run uploaded but never committed is not.
    pub async fn contains_file(&mut self, path: &str) -> Result<bool, DeltaError> {
        let delta_err = |source| DeltaError::Delta {
            url: self.url.clone(),
            source,
        };
        self.table.update_state().await.map_err(delta_err)?;
        let snapshot = self.table.snapshot().map_err(delta_err)?;
        // A partitioned table's batch is one file per partition, each `<folder>/<path>`.
        let nested = format!("/{path}");
        let found = snapshot.log_data().into_iter().any(|f| {
            let p = f.object_store_path();
            p.as_ref() == path || p.as_ref().ends_with(&nested)
        });
        Ok(found)
    }

    /// The Arrow schema of this table's columns (its Parquet files' columns, and the partition
    /// columns); see [`to_delta_batch`].
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The table's partition columns, in order (empty: unpartitioned).
    pub fn partition_columns(&self) -> &[String] {
        &self.partition_columns
    }

    /// The table's columns (Delta's form) in the snapshot this handle holds.
    pub fn columns(&self) -> Result<Arc<StructType>, DeltaError> {
        Ok(self
            .table
            .snapshot()
            .map_err(|e| self.delta_err(e))?
            .schema())
    }

    /// The last version this handle committed or loaded.
    pub fn version(&self) -> i64 {
        self.table.version().map(|v| v as i64).unwrap_or(-1)
    }

    /// `txns`' compare-and-set ([`DeltaTable::commit_with`]): the snapshot holds each
    /// partition below the commit's first offset of it.
    pub(super) async fn txns_behind(&self, txns: &[AppTxn]) -> Result<(), DeltaError> {
        let snapshot = self.table.snapshot().map_err(|e| self.delta_err(e))?;
        for t in txns {
            let known = snapshot
                .transaction_version(self.table.log_store().as_ref(), &t.app_id)
                .await
                .map_err(|e| self.delta_err(e))?;
            if let Some(v) = known.filter(|v| *v >= t.first) {
                return Err(DeltaError::TxnAhead {
                    url: self.url.clone(),
                    app_id: t.app_id.clone(),
                    table: v,
                    first: t.first,
                });
            }
        }
        Ok(())
    }

    pub(super) fn delta_err(&self, source: DeltaTableError) -> DeltaError {
        DeltaError::Delta {
            url: self.url.clone(),
            source,
        }
    }

    /// Catch up with the log (other writers' commits).
    pub async fn reload(&mut self) -> Result<(), DeltaError> {
        self.table
            .update_state()
            .await
            .map_err(|e| self.delta_err(e))
    }

    /// Upload `files` (each with a single put), then commit one log version adding all of them.
    /// Returns the committed version. On error nothing was committed: uploaded files stay
    /// unreferenced, invisible to readers (a later `VACUUM` removes them).
    pub async fn commit(&mut self, files: Vec<DataFile>) -> Result<i64, DeltaError> {
        self.commit_with(files, &[]).await
    }

    /// [`DeltaTable::commit`], with one `txn` action per entry of `txns` in the same log version
    /// (atomic with the data). Compare-and-set per application id: the snapshot the commit builds
    /// on must hold a version below each [`AppTxn::first`] (else [`DeltaError::TxnAhead`]), and
    /// deltalake's conflict check fails the commit (`ConcurrentTransaction`) when a version
    /// written after that snapshot carries a `txn` of one of the ids.
    pub async fn commit_with(
        &mut self,
        files: Vec<DataFile>,
        txns: &[AppTxn],
    ) -> Result<i64, DeltaError> {
        let now = chrono::Utc::now().timestamp_millis();
        let columns = StatsColumns::of_table(&self.table);
        let mut actions = Vec::with_capacity(files.len());
        for f in files {
            let path = Path::parse(&f.path).map_err(|e| DeltaError::Upload {
                url: self.url.clone(),
                path: f.path.clone(),
                source: e.into(),
            })?;
            let size = f.file.size() as i64;
            self.dest
                .store
                .put(&path, f.file.payload.clone())
                .await
                .map_err(|source| DeltaError::Upload {
                    url: self.url.clone(),
                    path: f.path.clone(),
                    source,
                })?;
            let add = add_action(
                f.path,
                f.partition_values,
                &f.file,
                (size, now),
                &columns,
                &self.partition_columns,
            );
            actions.push(Action::Add(add));
        }
        let delta_err = |source| DeltaError::Delta {
            url: self.url.clone(),
            source,
        };
        let operation = DeltaOperation::Write {
            mode: SaveMode::Append,
            partition_by: (!self.partition_columns.is_empty())
                .then(|| self.partition_columns.clone()),
            predicate: None,
        };
        // `From<CommitProperties>` turns on the post-commit hook: a checkpoint every
        // `delta.checkpointInterval` versions (100 by default) and expired-log cleanup per the
        // table's properties, so log replay stays short for readers and writers.
        // Two steps, so a failing post-commit hook (a checkpoint that could not be written) is not
        // mistaken for a failed commit: once the log version is written the files are in the
        // table, and reporting an error would make the caller write the rows a second time.
        let app_txns = AppTxn::actions(txns, now);
        let mut reloads = 0;
        let post = loop {
            self.txns_behind(txns).await?;
            let snapshot = self.table.snapshot().map_err(delta_err)?;
            let attempt = CommitBuilder::from(
                CommitProperties::default()
                    .with_max_retries(MAX_COMMIT_RETRIES)
                    .with_application_transactions(app_txns.clone()),
            )
            .with_actions(actions.clone())
            .build(Some(snapshot), self.table.log_store(), operation.clone())
            .into_prepared_commit_future()
            .await;
            let attempt = match attempt {
                Ok(prepared) => prepared.await,
                Err(e) => Err(e),
            };
            match attempt {
                Ok(post) => break post,
                // Another writer's version is listed but not readable yet (a store whose
                // listing runs ahead of its reads): reload the log and commit again. (Azurite's
                // InvalidVersion came from listings that ignored their offset: upload::offset.)
                Err(DeltaTableError::InvalidVersion(v)) if reloads < MAX_RELOADS => {
                    reloads += 1;
                    tracing::warn!(table = %self.url, version = v, "Delta log version not readable yet; reloading and committing again");
                    crate::telemetry::retried(crate::telemetry::RetryKind::Commit);
                    tokio::time::sleep(std::time::Duration::from_millis(100 * reloads as u64))
                        .await;
                    self.table.update_state().await.map_err(delta_err)?;
                }
                // Another writer changed the schema: the caller checks the new one.
                Err(DeltaTableError::Transaction {
                    source: TransactionError::CommitConflict(CommitConflictError::MetadataChanged),
                }) => {
                    self.table.update_state().await.map_err(delta_err)?;
                    return Err(DeltaError::MetadataChanged {
                        url: self.url.clone(),
                    });
                }
                Err(e) => return Err(delta_err(e)),
            }
        };
        let version = post.version;
        match post.await {
            Ok(finalized) => self.table.state = Some(finalized.snapshot()),
            Err(e) => {
                tracing::warn!(
                    table = %self.url,
                    version,
                    error = %e,
                    "Delta commit landed but its post-commit hook (checkpoint, log cleanup) failed"
                );
                // Catch up with the log instead; failing that, the next commit's conflict
                // handling does.
                if let Err(e) = self.table.update_state().await {
                    tracing::warn!(table = %self.url, error = %e, "reloading the Delta log failed");
                }
            }
        }
        Ok(version as i64)
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, RecordBatch, StructArray};
    use arrow_schema::{DataType, Field, Fields};
    use futures::StreamExt;

    use super::*;
    use crate::table::parquet::write_parquet;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_on_an_in_memory_store() {
        let dest = Destination::from_url("memory://").unwrap();
        let fields = Fields::from(vec![Field::new("x", DataType::Int64, true)]);
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("rec", DataType::Struct(fields.clone()), true),
        ]);
        let mut a = DeltaTable::open_or_create_with_properties(
            &dest,
            &schema,
            &[("delta.checkpointInterval", "2")],
        )
        .await
        .unwrap();
        let mut b = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
        assert_eq!((a.version(), b.version()), (0, 0));
        let file = |ids: Vec<i64>| {
            let n = ids.len();
            let rec = StructArray::new(
                fields.clone(),
                vec![Arc::new(Int64Array::from(vec![Some(1); n]))],
                None,
            );
            let batch = RecordBatch::try_new(
                a.schema().clone(),
                vec![Arc::new(Int64Array::from(ids)), Arc::new(rec)],
            )
            .unwrap();
            DataFile::new(write_parquet(a.schema(), &[batch], None).unwrap())
        };
        let (f1, f2, f3) = (file(vec![1, 2]), file(vec![3]), file(vec![4]));
        assert_eq!(a.commit(vec![f1]).await.unwrap(), 1);
        // b still holds version 0: its commit conflicts on version 1 and lands as 2.
        assert_eq!(b.commit(vec![f2]).await.unwrap(), 2);
        assert_eq!(a.commit(vec![f3]).await.unwrap(), 3);
        let mut log: Vec<String> = dest
            .store
            .list(Some(&Path::from("_delta_log")))
            .map(|m| m.unwrap().location.to_string())
            .collect()
            .await;
        log.sort();
        let mut want: Vec<String> = (0..4).map(|v| format!("_delta_log/{v:020}.json")).collect();
        // deltalake checkpoints after every version v with (v + 1) % interval == 0.
        want.push(format!("_delta_log/{:020}.checkpoint.parquet", 1));
        want.push(format!("_delta_log/{:020}.checkpoint.parquet", 3));
        want.push("_delta_log/_last_checkpoint".into());
        want.sort();
        assert_eq!(log, want);
        let reopened = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
        assert_eq!(reopened.version(), 3);
        let files = reopened.table.snapshot().unwrap().log_data().num_files();
        assert_eq!(files, 3);
    }
}
