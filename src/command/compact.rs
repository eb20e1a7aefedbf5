//! `subsink compact`: bin-pack a Delta table's small files with deltalake's OPTIMIZE while
//! writers go on appending ([`crate::sink::delta::compact`]); and the flags of `subsink run`'s
//! background compaction (`--compact-after N`, [`BackgroundArgs`]).

use std::num::NonZeroU64;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::process::runtime;
use crate::cli::{heading, values};
use crate::sink::delta::compact::{self, CompactError, CompactOptions};
use crate::sink::SinkSpec;
use crate::upload::Destination;

/// `subsink compact --table-url URL`.
#[derive(Debug, Args)]
pub struct CompactArgs {
    /// The Delta table: file:///dir, s3://bucket/prefix, gs://, az:// — as `run --table-url`,
    /// with the same credentials from the environment (AWS_*, AZURE_*, Google's chain).
    #[arg(long, value_name = "URL")]
    pub table_url: String,
    /// Size of the packed files; files larger than this are left alone. Default: the table's
    /// `delta.targetFileSize`, else 100MiB.
    #[arg(long, value_name = "SIZE", value_parser = values::size)]
    pub target_size: Option<u64>,
    /// Compact a partition (an unpartitioned table: the table) only when it holds at least this
    /// many small files (at least 2).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub min_files: usize,
    /// Only the partition(s) where COLUMN has VALUE (repeat for several columns: all must hold).
    #[arg(long, value_name = "COLUMN=VALUE", value_parser = partition_value)]
    pub partition: Vec<(String, String)>,
    /// Leave the files of the last K commits alone (and, in a partitioned table, every partition
    /// those commits wrote to): the part of the table writers are still filling.
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub skip_recent_commits: u64,
    /// Longest a compaction may hold the table's compaction lease (one compaction of a table at
    /// a time); a compaction that would take longer is abandoned, nothing committed.
    #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = values::duration)]
    pub lease: Duration,
}

/// `COLUMN=VALUE`.
fn partition_value(v: &str) -> Result<(String, String), String> {
    match v.split_once('=') {
        Some((c, val)) if !c.trim().is_empty() => Ok((c.trim().to_string(), val.to_string())),
        _ => Err(format!("{v:?}: expected COLUMN=VALUE")),
    }
}

/// A table command's outcome (`compact`, `vacuum`): its report as one JSON line on stdout, exit
/// 0; or its error on stderr, exit 2 when `usage` says the flags or the URL are at fault, else 1.
pub(super) fn report<R: serde::Serialize, E: std::fmt::Display>(
    result: Result<R, E>,
    usage: impl Fn(&E) -> bool,
) -> ExitCode {
    match result {
        Ok(report) => {
            say!(
                "{}",
                serde_json::to_string(&report).expect("serializable report")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            say_err!("error: {e}");
            ExitCode::from(if usage(&e) { 2 } else { 1 })
        }
    }
}

/// The table's store; a `file://` folder must exist already (`what`, this command, creates
/// nothing).
pub(super) fn table_destination(url: &str, what: &str) -> Result<Destination, String> {
    if let Ok(u) = url::Url::parse(url) {
        if u.scheme() == "file" {
            match u.to_file_path() {
                Ok(p) if p.join("_delta_log").is_dir() => {}
                Ok(p) => {
                    return Err(format!(
                        "--table-url {url}: no Delta table at {} (no _delta_log/ folder)",
                        p.display()
                    ))
                }
                Err(()) => return Err(format!("--table-url {url}: not an absolute local path")),
            }
        }
    }
    if url.starts_with("bigquery:") || url.starts_with("discard:") || url.starts_with("memory:") {
        return Err(format!(
            "--table-url {url}: {what} is for Delta tables on an object store or a local folder"
        ));
    }
    Destination::from_url(url).map_err(|e| format!("--table-url {url}: {e}"))
}

impl CompactArgs {
    fn options(&self) -> Result<CompactOptions, String> {
        let target_size = match self.target_size {
            None => None,
            Some(n) => Some(NonZeroU64::new(n).ok_or("--target-size 0: give a size above 0")?),
        };
        Ok(CompactOptions {
            target_size,
            min_files: self.min_files,
            partitions: self.partition.clone(),
            quiet_versions: self.skip_recent_commits,
            lease: self.lease,
            ..CompactOptions::default()
        })
    }

    /// `subsink compact`: its report as one JSON line on stdout; exit 0 compacted or nothing to
    /// do, 1 the compaction failed (the store, a conflict, another compaction running), 2 bad
    /// flags or no table at the URL.
    pub fn run(&self) -> ExitCode {
        let opts = match self.options() {
            Ok(o) => o,
            Err(e) => {
                say_err!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let dest = match table_destination(&self.table_url, "compaction") {
            Ok(d) => d,
            Err(e) => {
                say_err!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let rt = runtime();
        let result = rt.block_on(async {
            // The lease, as the table's log, needs an atomic put-if-absent.
            if let Err(reason) = crate::upload::check_put_if_absent(&dest).await {
                return Err(CompactError::Usage(format!(
                    "--table-url {}: the store cannot be used for tables: {reason}",
                    dest.url
                )));
            }
            compact::compact(&dest, &opts).await
        });
        rt.shutdown_timeout(Duration::from_secs(1));
        report(result, |e| {
            matches!(e, CompactError::Usage(_) | CompactError::NotATable { .. })
        })
    }
}

/// `subsink run`'s background compaction of its Delta table.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = heading::TABLES)]
pub struct BackgroundArgs {
    /// Delta table: compact in the background, while writing, once the table's older part
    /// (all but the last --compact-skip-recent commits) holds at least N small files
    /// (docs/destinations.md, Compaction). Off by default.
    #[arg(long, value_name = "N")]
    pub compact_after: Option<usize>,
    /// Background compaction: how often the table is looked at.
    #[arg(long, default_value = "1m", value_name = "DURATION", value_parser = values::duration)]
    pub compact_interval: Duration,
    /// Background compaction: the last K commits (and the partitions they wrote to) are left
    /// alone.
    #[arg(long, default_value_t = 10, value_name = "K")]
    pub compact_skip_recent: u64,
    /// Background compaction: size of the packed files (default: the table's
    /// `delta.targetFileSize`, else 100MiB).
    #[arg(long, value_name = "SIZE", value_parser = values::size)]
    pub compact_target_size: Option<u64>,
}

/// The background compaction of a run, checked at startup.
#[derive(Debug, Clone)]
pub struct Background {
    dest: Destination,
    opts: CompactOptions,
    interval: Duration,
}

/// How long a compaction in progress may hold the shutdown up: it is abandoned after this.
const STOP_WITHIN: Duration = Duration::from_secs(3);

impl BackgroundArgs {
    /// The background compaction of `output`, if asked for; only a Delta table takes it (exit 2
    /// otherwise).
    pub fn background(&self, output: &SinkSpec) -> Result<Option<Background>, String> {
        let Some(after) = self.compact_after else {
            return Ok(None);
        };
        let Some(dest) = output.compacts() else {
            return Err(format!(
                "--compact-after {after}: background compaction is for a Delta table (--table-url to a folder or an object store)"
            ));
        };
        if after < 2 {
            return Err(format!(
                "--compact-after {after}: at least 2 (one small file cannot be packed)"
            ));
        }
        let target_size = match self.compact_target_size {
            None => None,
            Some(n) => {
                Some(NonZeroU64::new(n).ok_or("--compact-target-size 0: give a size above 0")?)
            }
        };
        Ok(Some(Background {
            dest,
            opts: CompactOptions {
                target_size,
                min_total: after,
                quiet_versions: self.compact_skip_recent,
                // One file rewritten at a time: the writer keeps the cores.
                tasks: 1,
                lease: Duration::from_secs(3600).max(self.compact_interval),
                ..CompactOptions::default()
            },
            interval: self.compact_interval,
        }))
    }
}

impl Background {
    /// Start the compaction task on the current runtime; [`Running::stop`] ends it.
    pub fn start(self) -> Running {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(compact::background(self.dest, self.opts, self.interval, rx));
        Running { tx, task }
    }
}

/// A background compaction task.
pub struct Running {
    tx: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stop it: a compaction in progress is abandoned (nothing more committed) and its lease
    /// given back, within [`STOP_WITHIN`].
    pub async fn stop(self) {
        let _ = self.tx.send(true);
        let mut task = self.task;
        if tokio::time::timeout(STOP_WITHIN, &mut task).await.is_err() {
            task.abort();
        }
    }
}
