//! `subsink run`: its flags, the run's config built and checked once (exit 2), the pipeline on
//! the process's runtime, the summary on stdout and the exit code (0 all done, 1 some messages
//! not done, 2 bad flags or config).

use std::process::ExitCode;

use clap::Args;

use super::process::{endpoint, on_shutdown_signal, runtime, stop_endpoint, RUNTIME_CLOSE};
use crate::app::{self, RunConfig};
use crate::cli::destination::{DestinationArgs, WriterArgs};
use crate::cli::subscription::SubscriptionArgs;
use crate::cli::{heading, values, ServiceArgs};
use crate::ids::Clock;
use crate::registry::SourceArgs;
use crate::telemetry::{self, Health, Metrics};

/// `subsink run`: the subscription, where messages come from and go to, the process.
#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub sub: SubscriptionArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub destination: DestinationArgs,
    #[command(flatten)]
    pub writer: WriterArgs,
    #[command(flatten)]
    pub service: ServiceArgs,
    /// `--compact-after N`: the Delta table compacted in the background.
    #[command(flatten)]
    pub compact: super::BackgroundArgs,
    /// Pin the wall clock used in object names (and missing publishTime), RFC 3339.
    #[arg(long, value_name = "RFC3339", value_parser = values::rfc3339, help_heading = heading::OPERATING)]
    pub fixed_time: Option<chrono::DateTime<chrono::Utc>>,
    /// Seed object uuids and Avro sync markers (golden tests; never for two workers at once).
    #[arg(long, help_heading = heading::OPERATING)]
    pub seed: Option<u64>,
}

impl RunArgs {
    /// The run's config: the subscription, the output and the source, each checked once (exit 2).
    pub fn config(&self) -> Result<RunConfig, String> {
        let args = self;
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
        writer.positioned = crate::registry::POSITIONED;
        let mut output = args.destination.sink_spec(&writer, &subscription)?;
        source.set_schema_encoding(args.writer.schema_encoding.into());
        rerun_warning(&source, &output);
        args.compact.background(&output)?;
        if args.writer.exactly_once {
            // Each side checks what it needs and is set up (exit 2 with the reason otherwise).
            let positioned = (positioned.as_ref(), crate::registry::POSITIONED);
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

    /// Run `subsink run` with its config ([`RunArgs::config`]): the pipeline on the process's
    /// runtime, until the end of input or a shutdown; its summary and exit code.
    pub fn run(&self, cfg: RunConfig) -> ExitCode {
        let args = self;
        // Where from and where to, resolved: said once at start and in the summary.
        let source = args.source.source.to_string();
        let destination = cfg.output.describe();
        // Checked by `config`.
        let compaction = args.compact.background(&cfg.output).ok().flatten();
        tracing::info!(target: "subsink", subscription = %cfg.subscription.name, %source, %destination, "exporting {source} → {destination}");
        let rt = runtime();
        // A broker keeps what is handed back for redelivery.
        let broker = cfg.source.is_broker();
        // The process's telemetry: the pipeline counts, beats (every second) and reports readiness
        // through its handles.
        let metrics = Metrics::new();
        let health = Health::default();
        let mut cfg = cfg;
        cfg.telemetry =
            telemetry::PipelineTelemetry::new(&metrics, &health, &cfg.subscription.name);
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
            // Beside the writer, on its own table handle: it never holds the writer up.
            let compaction = compaction.map(|c| c.start());
            let result = app::run(cfg).await;
            if let Some(c) = compaction {
                c.stop().await;
            }
            result
        });
        if let Some(server) = server {
            rt.block_on(stop_endpoint(server));
        }
        let result = result.map(|mut summary| {
            summary.source = source;
            summary.destination = destination;
            summary.peak_rss_bytes = crate::summary::peak_rss_bytes();
            summary
        });
        let code = run_exit(result, broker);
        // Tasks given up at the end of the grace (and blocking reads such as stdin's) are not
        // waited for.
        rt.shutdown_timeout(RUNTIME_CLOSE);
        code
    }
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
                use crate::telemetry::logs::report;
                use serde_json::json;
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
                // So is an existing table that does not take what the configuration writes.
                app::RunError::Build(b) if b.is_config() => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

/// A file read without `--checkpoint` is read from its start by every run: say what a rerun does.
fn rerun_warning(source: &crate::registry::SourceSpec, output: &crate::sink::SinkSpec) {
    let Some(path) = source.reread_by_rerun() else {
        return;
    };
    let Some(what) = output.rerun_does() else {
        return;
    };
    tracing::warn!(
        target: "subsink",
        file = %path,
        "no --checkpoint: a rerun on {} {what}; --checkpoint FILE makes a rerun resume where this one ended",
        path
    );
}
