//! The file source's flags (`--on-bad-input`, `--checkpoint`, `--dead-letter`,
//! `--max-line-bytes`), checked into a [`FileSpec`].

use std::fs::File;
use std::path::{Path, PathBuf};

use super::{FileFlagsError, FileSourceSettings, OnBadInput};

/// The file source's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = crate::cli::heading::SOURCE)]
pub struct FileArgs {
    /// Malformed input line: stop the run (`fail`) or log, count and go on (`skip`).
    #[arg(long, value_enum, default_value = "fail")]
    pub on_bad_input: OnBadInput,
    /// Checkpoint file: resume a file source where the last run left off.
    #[arg(long, value_name = "PATH")]
    pub checkpoint: Option<PathBuf>,
    /// File source, table writer: append messages that fail on every delivery attempt here
    /// (NDJSON Pub/Sub messages with the CloudPubSubDeadLetterSource* attributes).
    #[arg(long, value_name = "PATH", help_heading = crate::cli::heading::DELIVERY)]
    pub dead_letter: Option<PathBuf>,
    /// Longest input line (without its newline; `14MiB`, `1000`): a longer one is bad input,
    /// passed over without being held in memory. The default holds Pub/Sub's largest message
    /// (10 MB) in base64 with its attributes.
    #[arg(long, value_name = "SIZE", default_value = "14MiB", value_parser = line_limit)]
    pub max_line_bytes: u64,
}

/// A `--max-line-bytes` value: a size of at least one byte.
fn line_limit(v: &str) -> Result<u64, String> {
    match crate::cli::values::size(v)? {
        0 => Err("a line limit must be at least 1 byte".into()),
        n => Ok(n),
    }
}

/// The file source with what settles it: the checkpoint and the dead-letter file.
#[derive(Debug, Clone)]
pub struct FileSpec {
    pub settings: FileSourceSettings,
    /// Where the checkpoint is kept (`None`: reading starts at the beginning, nothing is saved).
    pub checkpoint: Option<PathBuf>,
    /// Table writer: where messages that failed alone on every delivery go (NDJSON, with the
    /// `CloudPubSubDeadLetterSource*` attributes). `None`: they stay not done.
    pub dead_letter: Option<PathBuf>,
}

/// Whether `path` can be read as a source, without opening anything but a regular file: opening
/// a FIFO here would wait for its writer, and closing it again would break the writer's pipe
/// (EPIPE) before the source opens it for good. A FIFO or device is checked with `access(2)`.
fn readable(path: &Path) -> std::io::Result<()> {
    let meta = std::fs::metadata(path)?;
    if meta.is_dir() {
        return Err(std::io::Error::other("is a directory"));
    }
    if meta.is_file() {
        return File::open(path).map(drop);
    }
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("the path holds a NUL byte"))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    match unsafe { libc::access(c.as_ptr(), libc::R_OK) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

impl FileArgs {
    /// The file source of `path` (`None`: stdin). A missing or unreadable file is a bad flag,
    /// caught before the run starts.
    pub fn spec(
        &self,
        path: Option<PathBuf>,
        default_publish_time_micros: Option<i64>,
    ) -> Result<FileSpec, FileFlagsError> {
        match &path {
            None if self.checkpoint.is_some() => return Err(FileFlagsError::CheckpointOnStdin),
            None => {}
            Some(p) => readable(p).map_err(|source| FileFlagsError::Unreadable {
                path: p.clone(),
                source,
            })?,
        }
        let mut settings = FileSourceSettings::new(path);
        settings.on_bad_input = self.on_bad_input;
        settings.max_line_bytes = self.max_line_bytes;
        settings.default_publish_time_micros = default_publish_time_micros;
        Ok(FileSpec {
            settings,
            checkpoint: self.checkpoint.clone(),
            dead_letter: self.dead_letter.clone(),
        })
    }
}
