//! The `subsink` binary: parse flags, load and validate the subscription once, run the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use subsink::app::{self, RunConfig};
use subsink::cli::output::{DestinationArgs, WriterArgs};
use subsink::cli::subscription::{SubscriptionArgs, TableBatchingArgs};
use subsink::cli::{heading, values, LimitsArg, ServiceArgs};
use subsink::config::{self, LimitsMode};
use subsink::ids::Clock;
use subsink::inspect::InspectOptions;
use subsink::pubsub::PubsubClient;
use subsink::registry::{PubsubArgs, SourceArgs};
use subsink::resources::Resources;
use subsink::telemetry::{self, Health, LogFormat, Metrics};

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
    /// (default `warn,subsink=info`; deltalake, object_store and the HTTP/gRPC stacks stay at warn
    /// unless named).
    #[arg(long, global = true, value_enum, default_value = "text", help_heading = heading::OPERATING)]
    log_format: LogFormat,
}

#[derive(Subcommand)]
enum Cmd {
    /// Read messages and write them as the subscription's export would: objects for a
    /// `cloudStorageConfig`, table rows for a `bigqueryConfig`.
    Run(Box<RunArgs>),
    /// Check a subscription config against every rule; list all violations.
    Validate(Box<SubscriptionArgs>),
    /// Print an Avro object, a Parquet file, a Delta table or a Text object as NDJSON.
    Inspect(InspectArgs),
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

#[derive(Args)]
struct ServeArgs {
    /// The project whose export subscriptions are run (`my-project` or `projects/my-project`).
    #[arg(long)]
    project: String,
    /// How often the project's subscriptions are listed again.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = values::duration)]
    discover_interval: std::time::Duration,
    /// Where a subscription's bucket is: a URL with `{bucket}` (e.g. `file:///data/{bucket}`,
    /// `s3://{bucket}`). Without it Cloud Storage subscriptions are not exported (at least one of
    /// the two templates is needed).
    #[arg(long, value_name = "URL")]
    bucket_url_template: Option<String>,
    /// Where a subscription's table is: a URL with `{project}`, `{dataset}`, `{table}` (e.g.
    /// `s3://lake/{dataset}/{table}`). Without it BigQuery subscriptions are not exported.
    #[arg(long, value_name = "URL")]
    table_url_template: Option<String>,
    /// Table schemas for tables that do not exist yet: DIR/PROJECT.DATASET.TABLE.json in
    /// BigQuery's JSON format (an existing table's own schema is used first).
    #[arg(long, value_name = "DIR")]
    table_schemas: Option<PathBuf>,
    /// Pub/Sub's numeric limits: enforced exactly (`pubsub`, default) or lifted (`extended`).
    #[arg(long, value_enum)]
    limits: Option<LimitsArg>,
    /// The table writer's batching for every table subscription (they have no settings of their
    /// own for it).
    #[command(flatten)]
    table_batching: TableBatchingArgs,
    #[command(flatten)]
    pubsub: PubsubArgs,
    #[command(flatten)]
    service: ServiceArgs,
    #[command(flatten)]
    writer: WriterArgs,
}

#[derive(Args)]
struct InspectArgs {
    /// A local path (file, or a Delta table's directory) or a URL: file://, s3://bucket/key,
    /// gs://, az:// (a table: its root). A folder, bucket or prefix is listed: one line per
    /// object or table, with its size.
    #[arg(value_name = "URL|PATH")]
    input: String,
    /// Print the schema and the counts instead of the records.
    #[arg(long)]
    summary: bool,
    /// Also check the object's name against this subscription's naming rule (exit 1 if it does
    /// not follow it).
    #[arg(long, value_name = "FILE")]
    subscription: Option<PathBuf>,
    /// Limits to validate the subscription with (as for `run`).
    #[arg(long, value_enum)]
    limits: Option<LimitsArg>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    sub: SubscriptionArgs,
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    destination: DestinationArgs,
    #[command(flatten)]
    writer: WriterArgs,
    #[command(flatten)]
    service: ServiceArgs,
    /// Pin the wall clock used in object names (and missing publishTime), RFC 3339.
    #[arg(long, value_name = "RFC3339", value_parser = values::rfc3339, help_heading = heading::OPERATING)]
    fixed_time: Option<chrono::DateTime<chrono::Utc>>,
    /// Seed object uuids and Avro sync markers (golden tests; never for two workers at once).
    #[arg(long, help_heading = heading::OPERATING)]
    seed: Option<u64>,
}

/// Exit codes: 0 all done, 1 some messages not done (failed upload, bad input, given up at the
/// end of the shutdown grace), 2 bad usage/config.
fn main() -> ExitCode {
    no_transparent_huge_pages();
    purge_freed_memory_at_once();
    // Two rustls crypto backends are compiled in (see Cargo.toml): make ring the default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    if let Err(e) = telemetry::logs::init(cli.log_format) {
        say_err!("error: {e}");
        return ExitCode::from(2);
    }
    match cli.cmd {
        Cmd::Validate(args) => match args.load() {
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
        Cmd::Run(args) => run(*args),
        Cmd::Inspect(args) => inspect(args),
        Cmd::Serve(args) => serve(*args),
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

/// `subsink inspect`: exit 0, 1 when the input cannot be read or its name breaks the
/// subscription's naming rule, 2 for a bad subscription file.
fn inspect(args: InspectArgs) -> ExitCode {
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
    let result = rt.block_on(subsink::inspect::inspect(&args.input, &opts, &mut out));
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

/// A flag clap refuses: its own message and exit code, or with `--log-format json` on the command
/// line one JSON line (exit 2), as every other line of the run is then.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let argv: Vec<String> = std::env::args().collect();
    let json = argv
        .windows(2)
        .any(|w| w[0] == "--log-format" && w[1] == "json")
        || argv.iter().any(|a| a == "--log-format=json");
    if !json || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let _ = telemetry::logs::init(LogFormat::Json);
    let text = e.render().to_string();
    let message = text
        .trim()
        .strip_prefix("error: ")
        .unwrap_or(text.trim())
        .replace('\n', " ");
    telemetry::logs::report("ERROR", &message, &[]);
    ExitCode::from(2)
}

fn broken_pipe(e: &subsink::inspect::InspectError) -> bool {
    matches!(e, subsink::inspect::InspectError::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe)
}

fn run(args: RunArgs) -> ExitCode {
    let cfg = match build(&args) {
        Ok(c) => c,
        Err(e) => {
            say_err!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // Where from and where to, resolved: said once at start and in the summary.
    let source = args.source.source.to_string();
    let destination = cfg.output.describe();
    tracing::info!(subscription = %cfg.subscription.name, %source, %destination, "exporting {source} → {destination}");
    let rt = runtime();
    // A broker keeps what is handed back for redelivery.
    let broker = cfg.source.is_broker();
    // The process's telemetry: the pipeline counts, beats (every second) and reports readiness
    // through its handles.
    let metrics = Metrics::new();
    let health = Health::default();
    let mut cfg = cfg;
    cfg.telemetry = telemetry::PipelineTelemetry::new(&metrics, &health, &cfg.subscription.name);
    // Before the endpoint: once it answers, a signal is handled.
    let signalled = on_shutdown_signal(&rt, &health, cfg.shutdown_grace);
    // Bound before the run starts, so a bad --metrics-addr fails at once; stopped after the drain,
    // so /readyz answers "shutting down" throughout it.
    let server = match endpoint(&rt, &args.service, &metrics, &health) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let result = rt.block_on(async move {
        let mut cfg = cfg;
        cfg.shutdown = Some(Box::pin(signalled));
        app::run(cfg).await
    });
    if let Some(server) = server {
        rt.block_on(stop_endpoint(server));
    }
    let result = result.map(|mut summary| {
        summary.source = source;
        summary.destination = destination;
        summary
    });
    let code = run_exit(result, broker);
    // Tasks given up at the end of the grace (and blocking reads such as stdin's) are not
    // waited for.
    rt.shutdown_timeout(RUNTIME_CLOSE);
    code
}

/// The exit code of a run, its summary on stdout and what is not done on stderr.
fn run_exit(result: Result<app::RunSummary, app::RunError>, broker: bool) -> ExitCode {
    match result {
        Ok(summary) => {
            say!(
                "{}",
                serde_json::to_string(&summary).expect("serializable summary")
            );
            if summary.ok(broker) {
                ExitCode::SUCCESS
            } else {
                use serde_json::json;
                use subsink::telemetry::logs::report;
                // A file source's place in the file, as fields of a JSON line.
                let file = (!matches!(summary.source.as_str(), "" | "stdin"))
                    .then(|| summary.source.clone());
                if let Some(why) = &summary.stopped {
                    let mut fields = Vec::new();
                    if let Some(f) = &file {
                        let line = why
                            .strip_prefix(f.as_str())
                            .and_then(|r| r.strip_prefix(':'))
                            .and_then(|r| r.split(':').next())
                            .and_then(|n| n.parse::<u64>().ok());
                        if let Some(line) = line {
                            fields.push(("file", json!(f)));
                            fields.push(("line", json!(line)));
                        }
                    }
                    report("ERROR", &format!("stopped: {why}"), &fields);
                }
                for f in &summary.failed_objects {
                    report(
                        "ERROR",
                        &format!(
                            "object {} not written ({}): its {} messages, lines {}..={}, ids {}..{}, are not done",
                            f.object, f.error, f.messages, f.first_line, f.last_line, f.first_message_id, f.last_message_id
                        ),
                        &[("object", json!(f.object))],
                    );
                }
                for m in &summary.failed_messages {
                    let mut fields =
                        vec![("line", json!(m.line)), ("message_id", json!(m.message_id))];
                    if let Some(f) = &file {
                        fields.push(("file", json!(f)));
                    }
                    report(
                        "ERROR",
                        &format!(
                            "line {}: message {:?} not written after {} delivery attempt(s): {}",
                            m.line, m.message_id, m.attempts, m.error
                        ),
                        &fields,
                    );
                }
                if summary.messages_failed > summary.failed_messages.len() as u64 {
                    say_err!(
                        "error: {} more messages not written (see the log)",
                        summary.messages_failed - summary.failed_messages.len() as u64
                    );
                }
                if summary.messages_failed > 0 {
                    say_err!("error: messages that fail on every attempt: --dead-letter FILE puts them aside and the run goes on; with --checkpoint FILE a rerun tries only what is not done");
                }
                ExitCode::from(1)
            }
        }
        Err(e) => {
            say_err!("error: {e}");
            // A configuration the source's server showed to be wrong (a dead-letter subject no
            // stream stores, a consumer without explicit acks) is found before anything is read,
            // as bad flags are: exit 2.
            match &e {
                app::RunError::Source(s) if s.is_config() => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

/// `subsink serve`: exit 0 after a shutdown, 2 for bad flags, 1 when Pub/Sub cannot be reached
/// at startup.
fn serve(args: ServeArgs) -> ExitCode {
    use subsink::serve::{Exporter, ExporterSettings, ServeSettings, Targets};
    let prepared = (|| -> Result<(ServeSettings, ExporterSettings, Resources), String> {
        let targets = Targets::from_flags(
            args.bucket_url_template.as_deref(),
            args.table_url_template.as_deref(),
            args.table_schemas.clone(),
        )
        .map_err(|e| e.to_string())?;
        if let Some(dir) = &args.table_schemas {
            if !dir.is_dir() {
                return Err(format!(
                    "--table-schemas {}: not a directory",
                    dir.display()
                ));
            }
        }
        let serve = ServeSettings {
            project: args.project.clone(),
            limits: args.limits.map_or(LimitsMode::Pubsub, Into::into),
            interval: args.discover_interval,
            targets,
            table_batching: args.table_batching.table_batching(),
            probe: None,
        };
        let exporter = ExporterSettings {
            writer: {
                let mut w = args.writer.clone();
                w.positioned = subsink::registry::POSITIONED;
                w.options(None)
            },
            pull: args.pubsub.settings("", false).map_err(|e| e.to_string())?,
            shutdown_grace: args.service.shutdown_grace,
        };
        Ok((serve, exporter, args.service.resources()))
    })();
    let (settings, exporter, resources) = match prepared {
        Ok(p) => p,
        Err(e) => {
            say_err!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = runtime();
    let metrics = Metrics::new();
    let health = Health::default();
    let signalled = on_shutdown_signal(&rt, &health, exporter.shutdown_grace);
    let server = match endpoint(&rt, &args.service, &metrics, &health) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut settings = settings;
    settings.probe = Some(health.probe(&format!("discovery of {}", settings.project)));
    let result = rt.block_on(async {
        let client = PubsubClient::connect().await.map_err(|e| e.to_string())?;
        tracing::info!(project = %settings.project, pubsub = client.target(), "serving the project's export subscriptions");
        let mut pipelines = Exporter::new(client.clone(), resources, metrics, health.clone(), exporter);
        subsink::serve::supervise(&client, &settings, &mut pipelines, signalled).await;
        Ok::<(), String>(())
    });
    if let Some(server) = server {
        rt.block_on(stop_endpoint(server));
    }
    rt.shutdown_timeout(RUNTIME_CLOSE);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say_err!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// How long the runtime may take to end its tasks once the work is over (tasks given up at the
/// end of the grace are dropped; a blocking read of stdin is not waited for).
const RUNTIME_CLOSE: std::time::Duration = std::time::Duration::from_secs(1);

/// Watch for SIGTERM / SIGINT on a task of the runtime, so the signal is seen whatever the work
/// waits on: `/readyz` turns 503 for the whole drain and the watchdog starts
/// ([`subsink::shutdown::watchdog`]: the process ends `grace` + 10 s after the signal whatever
/// hangs). The future resolves at the signal.
fn on_shutdown_signal(
    rt: &tokio::runtime::Runtime,
    health: &Health,
    grace: std::time::Duration,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let health = health.clone();
    // Registered now, before anything runs: a signal from here on is seen.
    let signals = {
        let _rt = rt.enter();
        Signals::register()
    };
    rt.spawn(async move {
        signals.recv().await;
        health.set_shutting_down();
        subsink::shutdown::watchdog(grace);
        tracing::info!(grace = ?grace, "shutdown signal: finishing within the grace");
        tx.send_replace(true);
        // The receiver must not see the sender go before it reads the flag.
        std::future::pending::<()>().await;
    });
    async move {
        if rx.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Stop the telemetry endpoint, not waiting more than a second for clients that keep their
/// connections open.
async fn stop_endpoint(server: telemetry::http::TelemetryServer) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), server.stop()).await;
}

/// The process's runtime (`run` and `serve`).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The telemetry endpoint of `--metrics-addr`, bound before anything runs so a bad address fails
/// at once (exit 2).
fn endpoint(
    rt: &tokio::runtime::Runtime,
    s: &ServiceArgs,
    metrics: &Metrics,
    health: &Health,
) -> Result<Option<telemetry::http::TelemetryServer>, ExitCode> {
    let Some(addr) = &s.metrics_addr else {
        return Ok(None);
    };
    match rt.block_on(telemetry::http::serve(
        addr,
        metrics.clone(),
        health.clone(),
    )) {
        Ok(server) => Ok(Some(server)),
        Err(e) => {
            say_err!("error: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// SIGTERM and SIGINT, registered.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Register both handlers (inside a runtime): from now on the signals no longer end the
    /// process but wake [`Signals::recv`].
    fn register() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        Signals {
            term: signal(SignalKind::terminate()).expect("SIGTERM handler"),
            int: signal(SignalKind::interrupt()).expect("SIGINT handler"),
        }
    }

    /// Resolves on SIGTERM or SIGINT.
    async fn recv(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// The run's config: the subscription, the output and the source, each checked once (exit 2).
fn build(args: &RunArgs) -> Result<RunConfig, String> {
    let subscription = args.sub.load()?;
    let clock = Clock {
        fixed: args.fixed_time,
    };
    let mut source = args
        .source
        .spec(&subscription, clock.fixed.map(|t| t.timestamp_micros()))
        .map_err(|e| e.to_string())?;
    // `--exactly-once` with a source whose messages carry stream positions is set up below
    // whatever the destination (a Delta table too); the output's own flag is BigQuery's write
    // mode, for the other sources.
    let positioned = source.positioned();
    let mut writer = args.writer.clone();
    writer.exactly_once &= positioned.is_none();
    writer.positioned = subsink::registry::POSITIONED;
    let mut output = args.destination.output(&writer, &subscription)?;
    source.set_schema_encoding(args.writer.schema_encoding.into());
    rerun_warning(&source, &output);
    if args.writer.exactly_once {
        // Each side checks what it needs and is set up (exit 2 with the reason otherwise).
        let positioned = (positioned.as_ref(), subsink::registry::POSITIONED);
        if let Some(atomic_with) = output.exactly_once(positioned, &subscription)? {
            source.hold_positions(atomic_with)?;
        }
    }
    let name = subscription.name.clone();
    Ok(RunConfig {
        subscription,
        source,
        output,
        seed: args.seed,
        clock,
        resources: args.service.resources(),
        shutdown: None,
        shutdown_grace: args.service.shutdown_grace,
        telemetry: telemetry::PipelineTelemetry::detached(&name),
    })
}

/// A file read without `--checkpoint` is read from its start by every run: say what a rerun does.
fn rerun_warning(source: &subsink::registry::SourceSpec, output: &subsink::sink::Output) {
    use subsink::sink::Output;
    let subsink::registry::SourceSpec::File(f) = source else {
        return;
    };
    let (Some(path), None) = (&f.settings.path, &f.checkpoint) else {
        return;
    };
    let what = match output {
        Output::Table(_) | Output::BigQuery(_) => "appends every row to the table again",
        Output::Storage(_) => "writes every message again, in new objects",
        Output::Publish(_) => "publishes every message again",
        Output::Discard => return,
    };
    tracing::warn!(
        file = %path.display(),
        "no --checkpoint: a rerun on {} {what}; --checkpoint FILE makes a rerun resume where this one ended",
        path.display()
    );
}

#[cfg(test)]
mod tests {
    /// clap's own checks of the flags (names, headings, defaults parsed by their value parsers).
    #[test]
    fn flags_are_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
