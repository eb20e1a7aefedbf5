//! `subsink inspect`: its flags, the subscription whose naming rule is checked (exit 2 when it is
//! bad), the library's [`crate::inspect::inspect`] on a runtime of its own, the exit code.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::cli::LimitsArg;
use crate::config;
use crate::inspect::InspectOptions;

/// `subsink inspect URL|PATH`.
#[derive(Args)]
pub struct InspectArgs {
    /// A local path (file, or a Delta table's directory) or a URL: file://, s3://bucket/key,
    /// gs://, az:// (a table: its root). A folder, bucket or prefix is listed: one line per
    /// object or table, with its size.
    #[arg(value_name = "URL|PATH")]
    pub input: String,
    /// Print the schema and the counts instead of the records.
    #[arg(long)]
    pub summary: bool,
    /// Also check the object's name against this subscription's naming rule (exit 1 if it does
    /// not follow it).
    #[arg(long, value_name = "FILE")]
    pub subscription: Option<PathBuf>,
    /// Limits to validate the subscription with (as for `run`).
    #[arg(long, value_enum)]
    pub limits: Option<LimitsArg>,
}

impl InspectArgs {
    /// `subsink inspect`: exit 0, 1 when the input cannot be read or its name breaks the
    /// subscription's naming rule, 2 for a bad subscription file.
    pub fn run(&self) -> ExitCode {
        let args = self;
        let naming = match &args.subscription {
            None => None,
            Some(path) => {
                let checked = config::resource::load(path)
                    .map_err(|e| e.to_string())
                    .and_then(|r| {
                        config::validate(&r, args.limits.map(Into::into)).map_err(|e| e.to_string())
                    });
                match checked {
                    Ok(v) => match v.storage {
                        Some(storage) => Some((v.name, storage)),
                        None => {
                            say_err!(
                                "error: --subscription {}: {} has no cloudStorageConfig, so no object naming rule",
                                path.display(),
                                v.name
                            );
                            return ExitCode::from(2);
                        }
                    },
                    Err(e) => {
                        say_err!("error: --subscription {}: {e}", path.display());
                        return ExitCode::from(2);
                    }
                }
            }
        };
        let opts = InspectOptions {
            summary: args.summary,
            naming,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        let result = rt.block_on(crate::inspect::inspect(&args.input, &opts, &mut out));
        let flushed = std::io::Write::flush(&mut out);
        match result.map_err(|e| (e.to_string(), broken_pipe(&e))) {
            Ok(()) if flushed.is_ok() => ExitCode::SUCCESS,
            // `| head`: the reader went away; nothing to report.
            Err((_, true)) => ExitCode::SUCCESS,
            Ok(()) => ExitCode::SUCCESS,
            Err((e, false)) => {
                say_err!("error: {e}");
                ExitCode::from(1)
            }
        }
    }
}

fn broken_pipe(e: &crate::inspect::InspectError) -> bool {
    matches!(e, crate::inspect::InspectError::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe)
}
