//! The binary's subcommands as library code: `main.rs` parses the flags and calls one of these.
//! Each command owns its clap `Args` (the flags of its parts flattened from [`crate::cli`] and
//! [`crate::registry`]), turns them into what the library runs, and says how it ended: lines on
//! stdout and stderr, and the exit code (0 done, 1 not done, 2 bad flags or config).
//!
//! | file | what it holds |
//! |---|---|
//! | `command/run.rs` | `subsink run`: [`RunArgs`], the run's config, the pipeline, its summary and exit code |
//! | `command/serve.rs` | `subsink serve`: [`ServeArgs`], every export subscription of a project |
//! | `command/compact.rs` | `subsink compact`: [`CompactArgs`], a Delta table's small files bin-packed; and `run --compact-after`, the background compaction |
//! | `command/vacuum.rs` | `subsink vacuum`: [`VacuumArgs`], a Delta table's removed files deleted after the retention |
//! | `command/inspect.rs` | `subsink inspect`: [`InspectArgs`], a file, table or listing as NDJSON |
//! | `command/process.rs` | what `run` and `serve` share: the runtime, the shutdown signals, the telemetry endpoint; and a flag clap refuses ([`usage_error`]) |
//!
//! This module is above every other: nothing in the library uses it. Its log lines keep the
//! target `subsink`, the binary's, that they had when this code was in `main.rs`.

/// `eprintln!` that never panics: where stderr is a closed pipe (its reader gone) the line is
/// dropped and the worker goes on — `eprintln!` would panic in whatever task printed.
macro_rules! say_err {
    ($($t:tt)*) => {
        crate::telemetry::logs::stderr_line(format_args!($($t)*))
    };
}

/// `println!` that never panics (a closed stdout drops the line).
macro_rules! say {
    ($($t:tt)*) => {
        crate::telemetry::logs::stdout_line(format_args!($($t)*))
    };
}

mod compact;
mod inspect;
mod process;
mod run;
mod serve;
mod vacuum;

pub use compact::{BackgroundArgs, CompactArgs};
pub use inspect::InspectArgs;
pub use process::usage_error;
pub use run::RunArgs;
pub use serve::ServeArgs;
pub use vacuum::VacuumArgs;
