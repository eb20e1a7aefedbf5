//! The archive source's flags ([`ArchiveArgs`]) and what they make ([`ArchiveSpec`]).

use std::path::PathBuf;

use chrono::{DateTime, Utc};

use super::names::NameRule;
use super::ArchiveSettings;
use crate::avro::SchemaEncoding;
use crate::source::file::OnBadInput;

/// The archive source's flags that do not go together (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum ArchiveFlagsError {
    #[error("--archive-subscription {}: {reason}", path.display())]
    Subscription { path: PathBuf, reason: String },
    #[error("--archive-subscription, --from and --to need an archive --source (s3://, gs://, az://, file://)")]
    WithoutArchive,
    #[error("--from must be before --to")]
    EmptyRange,
    /// A `file://` URL that names nothing: the archive would make an empty folder and read none.
    #[error("--source {url}: no such file or folder (a file:// URL names an NDJSON file to read or an archive folder to replay)")]
    NoSuchPath { url: String },
}

/// `--from`/`--to`: an RFC 3339 time, or a date (its midnight, UTC).
pub fn parse_time(v: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        return Ok(t.with_timezone(&Utc));
    }
    chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d")
        .map(|d| d.and_hms_opt(0, 0, 0).expect("midnight").and_utc())
        .map_err(|_| {
            format!(
                "{v:?}: expected an RFC 3339 time (2024-05-01T00:00:00Z) or a date (2024-05-01)"
            )
        })
}

/// The archive source's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = crate::cli::heading::SOURCE)]
pub struct ArchiveArgs {
    /// Archive source: the subscription (JSON file) that wrote the archive; only objects that
    /// follow its naming rule (prefix, datetime format, suffix) and its output settings are read.
    #[arg(long, value_name = "FILE")]
    pub archive_subscription: Option<PathBuf>,
    /// Archive source: read only objects whose name's datetime is at or after this (RFC 3339
    /// time or YYYY-MM-DD).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub from: Option<DateTime<Utc>>,
    /// Archive source: read only objects whose name's datetime is before this.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub to: Option<DateTime<Utc>>,
}

/// The archive source with what settles it.
#[derive(Debug, Clone)]
pub struct ArchiveSpec {
    pub settings: ArchiveSettings,
    pub checkpoint: Option<PathBuf>,
    pub dead_letter: Option<PathBuf>,
}

impl ArchiveArgs {
    /// Any archive flag given?
    pub fn any(&self) -> bool {
        self.archive_subscription.is_some() || self.from.is_some() || self.to.is_some()
    }

    /// The archive source of `url`.
    pub fn spec(
        &self,
        url: &str,
        on_bad_input: OnBadInput,
        checkpoint: Option<PathBuf>,
        dead_letter: Option<PathBuf>,
    ) -> Result<ArchiveSpec, ArchiveFlagsError> {
        if let Some(path) = url
            .strip_prefix("file://")
            .and_then(|_| url::Url::parse(url).ok()?.to_file_path().ok())
        {
            if !path.exists() {
                return Err(ArchiveFlagsError::NoSuchPath { url: url.into() });
            }
        }
        let (rule, output) = match &self.archive_subscription {
            None => (NameRule::Any, None),
            Some(path) => {
                let bad = |reason: String| ArchiveFlagsError::Subscription {
                    path: path.clone(),
                    reason,
                };
                let raw = crate::config::resource::load(path).map_err(|e| bad(e.to_string()))?;
                let v = crate::config::validate(&raw, None).map_err(|e| bad(e.to_string()))?;
                let s = v.storage.ok_or_else(|| {
                    bad(format!(
                        "{} has no cloudStorageConfig, so no object naming rule",
                        v.name
                    ))
                })?;
                (
                    NameRule::Exact {
                        prefix: s.filename_prefix,
                        format: s.datetime_format,
                        suffix: s.filename_suffix,
                        partitions: s
                            .partitions
                            .map(|p| p.partitions.into_iter().map(|p| p.name).collect())
                            .unwrap_or_default(),
                    },
                    Some(s.output),
                )
            }
        };
        if let (Some(f), Some(t)) = (self.from, self.to) {
            if f >= t {
                return Err(ArchiveFlagsError::EmptyRange);
            }
        }
        let listing = checkpoint.as_ref().map(|c| {
            let mut p = c.clone().into_os_string();
            p.push(".objects.json");
            PathBuf::from(p)
        });
        Ok(ArchiveSpec {
            settings: ArchiveSettings {
                url: url.to_string(),
                rule,
                output,
                from: self.from,
                to: self.to,
                on_bad_input,
                schema_encoding: SchemaEncoding::Json,
                listing,
                start: 0,
                progress: true,
            },
            checkpoint,
            dead_letter,
        })
    }
}
