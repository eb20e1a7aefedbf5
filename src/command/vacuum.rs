//! `subsink vacuum`: delete the files a Delta table's log removed longer ago than a retention,
//! with deltalake's VACUUM ([`crate::sink::delta::vacuum`]); structured as `subsink compact` is.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::compact::{report, table_destination};
use super::process::runtime;
use crate::cli::values;
use crate::sink::delta::vacuum::{self, VacuumError, VacuumOptions};

/// `subsink vacuum --table-url URL [--retention DURATION]`.
#[derive(Debug, Args)]
pub struct VacuumArgs {
    /// The Delta table: file:///dir, s3://bucket/prefix, gs://, az:// — as `run --table-url`,
    /// with the same credentials from the environment (AWS_*, AZURE_*, Google's chain).
    #[arg(long, value_name = "URL")]
    pub table_url: String,
    /// Delete files the log removed longer ago than this (`7d`, `36h`). Default: the table's
    /// `delta.deletedFileRetentionDuration`, else 7d; a shorter one is refused without --force.
    #[arg(long, value_name = "DURATION", value_parser = values::duration)]
    pub retention: Option<Duration>,
    /// Allow a --retention shorter than the table's: readers and compactions of versions older
    /// than it may fail. Only when nothing uses the older versions.
    #[arg(long)]
    pub force: bool,
    /// List the files that would be deleted; delete nothing, commit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also delete files under the table that no commit names (uploads whose commit never came),
    /// once older than the retention.
    #[arg(long)]
    pub full: bool,
}

impl VacuumArgs {
    /// `subsink vacuum`: its report as one JSON line on stdout; exit 0 done (or nothing to
    /// delete), 1 the VACUUM failed (the store), 2 bad flags, no table at the URL or a retention
    /// shorter than the table's without --force.
    pub fn run(&self) -> ExitCode {
        let dest = match table_destination(&self.table_url, "vacuum") {
            Ok(d) => d,
            Err(e) => {
                say_err!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let opts = VacuumOptions {
            retention: self.retention,
            force: self.force,
            dry_run: self.dry_run,
            full: self.full,
        };
        let rt = runtime();
        let result = rt.block_on(vacuum::vacuum(&dest, &opts));
        rt.shutdown_timeout(Duration::from_secs(1));
        report(result, |e| {
            matches!(
                e,
                VacuumError::TooShort { .. } | VacuumError::NotATable { .. }
            )
        })
    }
}
