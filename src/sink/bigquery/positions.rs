//! `--exactly-once` with a positioned source into BigQuery ([`crate::position`]): the rows a
//! subscription wrote of each stream partition, found again by their `message_id`
//! (`STREAM/PART/OFFSET`, written with `writeMetadata`) and `subscription_name` columns — what a
//! restart asks before a partition's first record ([`BigQueryDurableStreams`]) and what a batch asks
//! again right before its commit ([`commit_exact`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::client::{BigQueryClient, BigQueryError, TableRef};
use crate::position::{message_id_sql, DurableStreams, Position, StreamKey, Streams};
use crate::receipt::Rejected;
use crate::sink::order::{Chained, Parts, StreamOrder};
use crate::sink::SinkError;

/// The rows a subscription wrote to a table, by stream partition.
#[derive(Debug, Clone)]
pub struct StreamRows {
    pub table: TableRef,
    /// The subscription's name, as its rows' `subscription_name` holds it.
    pub subscription: String,
    /// The source's streams.
    pub streams: Streams,
}

/// How often a query of [`StreamRows::last_offsets`] is tried before it fails (0.5 s, doubling).
const QUERY_ATTEMPTS: u32 = 6;

impl StreamRows {
    /// The query of [`StreamRows::last_offsets`] for `n` partitions (parameters `@subscription`
    /// and `@p0`…: each partition's `STREAM/PART/`): per partition, its prefix and its highest
    /// offset. A stream name holds no `/`, so a prefix matches one partition only.
    pub fn sql(&self, n: usize) -> String {
        let any = (0..n)
            .map(|i| format!("STARTS_WITH(message_id, @p{i})"))
            .collect::<Vec<_>>()
            .join(" OR ");
        let (prefix, offset) = message_id_sql("message_id");
        format!(
            "SELECT {prefix} AS prefix, MAX({offset}) AS last \
             FROM `{}.{}.{}` WHERE subscription_name = @subscription AND ({any}) GROUP BY prefix",
            self.table.project, self.table.dataset, self.table.table
        )
    }

    /// The highest offset of each of `keys` among the subscription's rows in the table (a
    /// partition without rows is left out): one query, tried again on transient errors.
    pub async fn last_offsets(
        &self,
        client: &BigQueryClient,
        keys: &[StreamKey],
    ) -> Result<HashMap<StreamKey, i64>, BigQueryError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let prefixes: Vec<String> = keys.iter().map(StreamKey::id_prefix).collect();
        let names: Vec<String> = (0..keys.len()).map(|i| format!("p{i}")).collect();
        let mut params = vec![("subscription", self.subscription.as_str())];
        params.extend(
            names
                .iter()
                .map(String::as_str)
                .zip(prefixes.iter().map(String::as_str)),
        );
        let sql = self.sql(keys.len());
        let mut wait = Duration::from_millis(500);
        let mut attempt = 1;
        let rows = loop {
            match client.query(&self.table.project, &sql, &params).await {
                Ok(rows) => break rows,
                Err(e) if e.retryable() && attempt < QUERY_ATTEMPTS => {
                    tracing::warn!(error = %e, retry_in = ?wait, "the query of the table's {} offsets failed; retrying", self.streams.name);
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        };
        let mut out = HashMap::new();
        for row in rows {
            let (Some(Some(prefix)), Some(Some(last))) = (row.first(), row.get(1)) else {
                continue;
            };
            let key = self.streams.key_of_prefix(prefix);
            let (Some(key), Ok(last)) = (key, last.parse::<i64>()) else {
                return Err(BigQueryError::Query {
                    project: self.table.project.clone(),
                    reason: format!(
                        "an answer row that is not a partition's offset: {prefix:?}, {last:?}"
                    ),
                    retryable: false,
                });
            };
            if keys.contains(&key) {
                out.insert(key, last);
            }
        }
        Ok(out)
    }
}

/// Before the first record of a stream partition (after every assignment) is written, one query
/// asks the table for the partition's highest offset among the subscription's rows.
pub struct BigQueryDurableStreams {
    pub rows: StreamRows,
    pub client: BigQueryClient,
}

#[async_trait::async_trait]
impl DurableStreams for BigQueryDurableStreams {
    fn lookup(&self, at: &Position, _publish_time_micros: i64) -> String {
        format!("{} in {}", at.key.id_prefix(), self.rows.table)
    }

    async fn held_through(
        &self,
        at: &Position,
        _publish_time_micros: i64,
    ) -> Result<Option<i64>, String> {
        let found = self
            .rows
            .last_offsets(&self.client, std::slice::from_ref(&at.key))
            .await
            .map_err(|e| e.to_string())?;
        Ok(found.get(&at.key).copied().filter(|v| *v >= at.offset))
    }

    fn held_in(&self, _last: i64) -> String {
        "in the BigQuery table already (its highest offset there)".into()
    }
}

/// What the sink's files share.
#[derive(Clone)]
pub struct Exact {
    pub rows: StreamRows,
    pub order: StreamOrder,
}

/// Why a batch was not committed under `--exactly-once` with a positioned source (`source`: its
/// name).
#[derive(Debug, thiserror::Error)]
enum ExactError {
    #[error("an earlier commit of one of its {0} partitions failed; under --exactly-once a partition's commits land in offset order")]
    Earlier(Arc<str>),
    #[error("given up before it was committed")]
    Cancelled,
    #[error("BigQuery rejected a row of it ({why}); under --exactly-once with {name} such a batch is not committed (a later row of the same partition would pass the rejected one)")]
    Rejected { why: String, name: Arc<str> },
    #[error("the table holds {key} up to offset {last} already, at or past this batch's first offset {first} of it (another worker of the group wrote those records: a rebalance while this batch was in flight); not committed")]
    InTable {
        key: StreamKey,
        last: i64,
        first: i64,
    },
}

/// A batch's partitions and its place in their order.
pub struct ExactBatch {
    pub rows: StreamRows,
    pub parts: Parts,
    pub order: Chained,
}

/// Commit the finalized `stream` of the batch `name` once the previous commits of its partitions
/// landed, unless a row was rejected, the batch was given up, or the table (asked again now)
/// holds one of its partitions at or past its first offset of it. Returns with the batch's
/// outcome handed to the next commits of its partitions (an error drops it unsent: failed).
pub async fn commit_exact(
    client: &BigQueryClient,
    name: &str,
    stream: &str,
    exact: ExactBatch,
    rejected: &[Rejected],
    cancelled: &AtomicBool,
) -> Result<(), SinkError> {
    let fail = |e: ExactError| SinkError::Commit {
        name: name.to_string(),
        retryable: false,
        source: Box::new(e),
    };
    let failed = |e: BigQueryError| SinkError::Commit {
        name: name.to_string(),
        retryable: e.retryable(),
        source: Box::new(e),
    };
    let source = exact.rows.streams.name.clone();
    if !exact.order.wait_before().await {
        return Err(fail(ExactError::Earlier(source)));
    }
    if let Some(r) = rejected.first() {
        return Err(fail(ExactError::Rejected {
            why: r.error.clone(),
            name: source,
        }));
    }
    if cancelled.load(Ordering::SeqCst) {
        return Err(fail(ExactError::Cancelled));
    }
    let keys: Vec<StreamKey> = exact.parts.keys().cloned().collect();
    let held = exact
        .rows
        .last_offsets(client, &keys)
        .await
        .map_err(failed)?;
    for (key, (first, _)) in &exact.parts {
        if let Some(last) = held.get(key).filter(|last| *last >= first) {
            return Err(fail(ExactError::InTable {
                key: key.clone(),
                last: *last,
                first: *first,
            }));
        }
    }
    let committed = client
        .batch_commit(&exact.rows.table, &[stream.to_string()])
        .await;
    exact.order.done(committed.is_ok());
    committed.map_err(failed)
}
