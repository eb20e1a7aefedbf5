//! The `subsink` binary: parse flags, load and validate the subscription once, run the library.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use subsink::cli::heading;
use subsink::cli::validate::ValidateArgs;
use subsink::command::{usage_error, CompactArgs, InspectArgs, RunArgs, ServeArgs, VacuumArgs};
use subsink::telemetry::{self, LogFormat};

/// `eprintln!` that never panics: where stderr is a closed pipe (its reader gone) the line is
/// dropped and the worker goes on — `eprintln!` would panic in whatever task printed.
macro_rules! say_err {
    ($($t:tt)*) => {
        subsink::telemetry::logs::stderr_line(format_args!($($t)*))
    };
}

/// `println!` that never panics (a closed stdout drops the line).
macro_rules! say {
    ($($t:tt)*) => {
        subsink::telemetry::logs::stdout_line(format_args!($($t)*))
    };
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turn transparent huge pages off for this process. mimalloc reserves its arena in one 1 GiB
/// mapping and asks for huge pages on it (`MADV_HUGEPAGE`), so every page it touches costs 2 MiB
/// of resident memory instead of 4 KiB: the table bench (1M messages) peaked at 263–282 MiB with
/// them and 159–188 MiB without, with a 1000-message run at 100 MiB against 40 MiB. The flag holds
/// for every mapping of the process, made before or after, whatever the system's THP setting.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Let mimalloc give freed memory back to the OS at once instead of 10 ms (arenas: 100 ms) later.
/// A large message passes through buffers that are freed a moment later (the read line, its
/// decoded payload, the encoded pages); kept for those few milliseconds, the buffers of the next
/// message come on top of them, and peak RSS was 20–45 MiB higher (debug build, 9 MiB messages:
/// one message through the table writer 129 → 105 MiB, 20 through the storage writer with a
/// 64 MiB budget 152 → 110 MiB). `--memory-limit` would not hold without it (docs/operating.md,
/// How to size a pod).
fn purge_freed_memory_at_once() {
    // `mi_option_purge_delay` in mimalloc.h (v2 and v3 alike), between `eager_commit_delay` (14)
    // and `use_numa_nodes` (16), which libmimalloc-sys names; it does not name this one.
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets one of mimalloc's integer options; any value is valid.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

#[derive(Parser)]
#[command(
    name = "subsink",
    version,
    about = "Pub/Sub export subscriptions, anywhere"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log lines on stderr as text or JSON (one object per line). Levels: SUBSINK_LOG or RUST_LOG
    /// (default `warn,subsink=info`, deltalake's MERGE at error; deltalake, object_store and the
    /// HTTP/gRPC stacks stay at warn unless named).
    #[arg(long, global = true, value_enum, default_value = "text", help_heading = heading::OPERATING)]
    log_format: LogFormat,
}

#[derive(Subcommand)]
enum Cmd {
    /// Read messages and write them as the subscription's export would: objects for a
    /// `cloudStorageConfig`, table rows for a `bigqueryConfig`.
    Run(Box<RunArgs>),
    /// Check a subscription config against every rule; list all violations.
    Validate(Box<ValidateArgs>),
    /// Print an Avro object, a Parquet file, a Delta table or a Text object as NDJSON.
    Inspect(InspectArgs),
    /// Bin-pack a Delta table's small files into larger ones (deltalake's OPTIMIZE) while writers
    /// go on appending; old files stay for VACUUM. Prints what was done as JSON (exit 0 done or
    /// nothing to do, 1 failed, 2 bad flags or no table).
    Compact(CompactArgs),
    /// Delete the files a Delta table's log removed (compactions, MERGEs) longer ago than the
    /// retention (default the table's, 7 days), with deltalake's VACUUM. Prints what was deleted
    /// as JSON (exit 0 done, 1 failed, 2 bad flags, no table, or a retention shorter than the
    /// table's without --force).
    Vacuum(VacuumArgs),
    /// Export every subscription of a project that has a cloudStorageConfig or a bigqueryConfig,
    /// with the settings Pub/Sub holds (Google Cloud, or the emulator at PUBSUB_EMULATOR_HOST),
    /// picking up created, changed and deleted ones; until SIGTERM / SIGINT.
    Serve(Box<ServeArgs>),
    /// Single Message Transforms: `transforms test` runs a subscription's JavaScript UDFs on one
    /// message and prints what became of it (as `gcloud pubsub message-transforms test`).
    #[command(subcommand)]
    Transforms(TransformsCmd),
}

#[derive(Subcommand)]
enum TransformsCmd {
    /// Run the transforms on one message; print the result, or why it was filtered or failed
    /// (exit 0 transformed or filtered, 1 failed, 2 invalid transforms or message).
    Test(subsink::cli::transforms::TransformsTestArgs),
}

/// Exit codes: 0 all done, 1 some messages not done (failed upload, bad input, given up at the
/// end of the shutdown grace), 2 bad usage/config.
fn main() -> ExitCode {
    no_transparent_huge_pages();
    purge_freed_memory_at_once();
    // Two rustls crypto backends are compiled in (see Cargo.toml): make ring the default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Every flag also from its SUBSINK_… variable (docs/operating.md, Flags).
    let parsed = subsink::cli::env::with_env(Cli::command())
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
        .map_err(|e| {
            let argv: Vec<String> = std::env::args().collect();
            subsink::cli::env::name_variable(e, &argv)
        });
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    if let Err(e) = telemetry::logs::init(cli.log_format) {
        say_err!("error: {e}");
        return ExitCode::from(2);
    }
    match cli.cmd {
        Cmd::Validate(args) => match args.check() {
            Ok(v) => {
                for w in v.warnings() {
                    say_err!("warning: {w}");
                }
                say!("{}: valid", v.name);
                ExitCode::SUCCESS
            }
            Err(e) => {
                say_err!("{e}");
                ExitCode::from(2)
            }
        },
        Cmd::Run(args) => match args.config() {
            Ok(cfg) => args.run(cfg),
            Err(e) => {
                say_err!("error: {e}");
                ExitCode::from(2)
            }
        },
        Cmd::Inspect(args) => args.run(),
        Cmd::Compact(args) => args.run(),
        Cmd::Vacuum(args) => args.run(),
        Cmd::Serve(args) => args.run(),
        Cmd::Transforms(TransformsCmd::Test(args)) => {
            let r = args.run();
            say!(
                "{}",
                serde_json::to_string_pretty(&r.json).unwrap_or_default()
            );
            ExitCode::from(r.code)
        }
    }
}

#[cfg(test)]
mod tests {
    /// clap's own checks of the flags (names, headings, defaults parsed by their value parsers).
    #[test]
    fn flags_are_consistent() {
        use clap::CommandFactory;
        subsink::cli::env::with_env(super::Cli::command()).debug_assert();
    }

    /// Every flag has its `SUBSINK_…` variable, and none is a variable that is not a flag: the
    /// binary's own, or one of those that swap what the tests run (scripts/test's SWAPS, which
    /// CI refuses) — read from the script, so the two lists cannot drift apart.
    #[test]
    fn no_flag_variable_is_a_reserved_one() {
        use clap::CommandFactory;
        use subsink::cli::env::{variables, with_env, PREFIX, RESERVED};
        let script =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/test")).unwrap();
        let swaps = script
            .split_once("SWAPS=(")
            .and_then(|(_, rest)| rest.split_once(')'))
            .map(|(list, _)| list.split_whitespace().collect::<Vec<_>>())
            .expect("scripts/test defines SWAPS=(…)");
        assert!(swaps.len() >= 10, "{swaps:?}");
        for s in &swaps {
            assert!(
                RESERVED.contains(s),
                "{s} (scripts/test SWAPS) is not in cli::env::RESERVED"
            );
        }
        let vars = variables(&with_env(super::Cli::command()));
        assert!(
            vars.len() > 90,
            "every flag of every subcommand: {}",
            vars.len()
        );
        for (var, flag) in &vars {
            assert!(var.starts_with(PREFIX), "{flag}: {var}");
            assert!(
                !RESERVED.contains(&var.as_str()),
                "{flag} would be read from {var}, which is reserved"
            );
        }
        let of = |f: &str| {
            vars.iter()
                .find(|(_, flag)| flag == f)
                .map(|(v, _)| v.as_str())
        };
        assert_eq!(of("run --table-url"), Some("SUBSINK_TABLE_URL"));
        assert_eq!(of("--log-format"), Some("SUBSINK_LOG_FORMAT"));
        assert_eq!(of("transforms test --message"), Some("SUBSINK_MESSAGE"));
    }
}
