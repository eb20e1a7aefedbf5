//! Appending one closed batch's requests: retries of transient failures on a fresh call
//! ([`Appender`]), and what to send again when BigQuery names bad rows ([`split_on_row_errors`]).

use std::time::Duration;

use super::client::{self, BigQueryClient, BigQueryError};

/// How long a file whose appends keep failing with transient errors is retried (backoff from
/// 0.5 s doubling to 30 s) before it fails.
pub const RETRY_FOR: Duration = Duration::from_secs(300);

/// What to do with a request of `n` rows that BigQuery answered with `errs` (row index within the
/// request, its message): nothing of it is in.
#[derive(Debug, PartialEq)]
pub(super) struct RowErrorSplit<'a> {
    /// The rows to reject (index within the request, why), in request order, each once (the
    /// first message BigQuery gave for it).
    pub(super) bad: Vec<(usize, &'a str)>,
    /// The runs of rows between them to send again: (first row, rows), in request order.
    pub(super) again: Vec<(usize, usize)>,
}

/// Split a request answered with row errors ([`RowErrorSplit`]). Row errors that name no row of
/// the request (an index past its end) reject it whole, with the first error's message: sending
/// it again could only get the same answer.
pub(super) fn split_on_row_errors(n: usize, errs: &[(usize, String)]) -> RowErrorSplit<'_> {
    let mut bad: Vec<(usize, &str)> = errs
        .iter()
        .filter(|e| e.0 < n)
        .map(|(i, why)| (*i, why.as_str()))
        .collect();
    // Stable: of one row's errors the first stays.
    bad.sort_by_key(|e| e.0);
    bad.dedup_by_key(|e| e.0);
    if bad.is_empty() {
        let why = errs
            .first()
            .map_or("row errors naming no row", |e| e.1.as_str());
        return RowErrorSplit {
            bad: (0..n).map(|i| (i, why)).collect(),
            again: Vec::new(),
        };
    }
    let mut again = Vec::new();
    let mut start = 0;
    for i in bad.iter().map(|e| e.0).chain(std::iter::once(n)) {
        if i > start {
            again.push((start, i - start));
        }
        start = i + 1;
    }
    RowErrorSplit { bad, again }
}

/// Appends of one file, with retries of transient failures on a fresh call.
pub(super) struct Appender {
    pub(super) client: BigQueryClient,
    pub(super) stream: String,
    pub(super) call: Option<client::AppendCall>,
    /// PENDING stream: the offset of the next row.
    pub(super) offset: Option<i64>,
    pub(super) first_failure: Option<tokio::time::Instant>,
    pub(super) backoff: Duration,
}

impl Appender {
    pub(super) async fn append(
        &mut self,
        request: &client::AppendRows,
        rows: usize,
    ) -> Result<client::Appended, BigQueryError> {
        loop {
            if self.call.is_none() {
                match self.client.append_rows(&self.stream).await {
                    Ok(c) => self.call = Some(c),
                    Err(e) => {
                        self.wait(e).await?;
                        continue;
                    }
                }
            }
            let call = self.call.as_mut().expect("opened above");
            match call.append(request.clone(), self.offset).await {
                Ok(a) => {
                    self.first_failure = None;
                    self.backoff = Duration::from_millis(500);
                    if matches!(a, client::Appended::Done | client::Appended::AlreadyExists) {
                        if let Some(o) = &mut self.offset {
                            *o += rows as i64;
                        }
                    }
                    return Ok(a);
                }
                Err(e) => {
                    // The call is broken: the next attempt opens a new one (the same offset
                    // deduplicates a request that had landed, on a PENDING stream).
                    self.call = None;
                    self.wait(e).await?;
                }
            }
        }
    }

    /// Wait before trying again, or give up with `e`.
    async fn wait(&mut self, e: BigQueryError) -> Result<(), BigQueryError> {
        if !e.retryable() {
            return Err(e);
        }
        let first = *self
            .first_failure
            .get_or_insert_with(tokio::time::Instant::now);
        if first.elapsed() >= RETRY_FOR {
            return Err(e);
        }
        tracing::warn!(error = %e, retry_in = ?self.backoff, "append failed; retrying");
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(30));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{split_on_row_errors, RowErrorSplit};

    fn errs(e: &[(usize, &str)]) -> Vec<(usize, String)> {
        e.iter().map(|(i, w)| (*i, w.to_string())).collect()
    }

    // The BigQuery emulator answers a bad row by refusing the request whole (the halving path,
    // tested against it in tests/bigquery.rs); only BigQuery names rows, so this split is
    // checked here.
    #[test]
    fn row_errors_reject_the_named_rows_and_send_the_runs_between_again() {
        let e = errs(&[(5, "bad five"), (2, "bad two"), (5, "again five")]);
        assert_eq!(
            split_on_row_errors(8, &e),
            RowErrorSplit {
                bad: vec![(2, "bad two"), (5, "bad five")],
                again: vec![(0, 2), (3, 2), (6, 2)],
            }
        );
        // At the edges and side by side: no empty run.
        let e = errs(&[(0, "a"), (1, "b"), (3, "c")]);
        assert_eq!(
            split_on_row_errors(4, &e),
            RowErrorSplit {
                bad: vec![(0, "a"), (1, "b"), (3, "c")],
                again: vec![(2, 1)],
            }
        );
        // Every row bad: nothing to send again.
        let e = errs(&[(1, "x"), (0, "y")]);
        assert_eq!(
            split_on_row_errors(2, &e).again,
            Vec::<(usize, usize)>::new()
        );
        // An index past the request is left out of the split.
        let e = errs(&[(9, "past"), (1, "one")]);
        assert_eq!(
            split_on_row_errors(3, &e),
            RowErrorSplit {
                bad: vec![(1, "one")],
                again: vec![(0, 1), (2, 1)],
            }
        );
    }

    #[test]
    fn row_errors_that_name_no_row_of_the_request_reject_it_whole() {
        let e = errs(&[(7, "past the end"), (8, "also")]);
        assert_eq!(
            split_on_row_errors(3, &e),
            RowErrorSplit {
                bad: vec![
                    (0, "past the end"),
                    (1, "past the end"),
                    (2, "past the end")
                ],
                again: vec![],
            }
        );
    }
}
