//! `subsink serve`: its flags, the project's export subscriptions discovered and exported
//! ([`crate::serve`]) on the process's runtime until SIGTERM / SIGINT, the exit code.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::process::{endpoint, on_shutdown_signal, runtime, stop_endpoint, RUNTIME_CLOSE};
use crate::cli::destination::WriterArgs;
use crate::cli::subscription::TableBatchingArgs;
use crate::cli::{values, LimitsArg, ServiceArgs};
use crate::config::LimitsMode;
use crate::pubsub::PubsubClient;
use crate::registry::PubsubArgs;
use crate::resources::Resources;
use crate::telemetry::{Health, Metrics};

/// `subsink serve --project P`.
#[derive(Args)]
pub struct ServeArgs {
    /// The project whose export subscriptions are run (`my-project` or `projects/my-project`).
    #[arg(long)]
    pub project: String,
    /// How often the project's subscriptions are listed again.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = values::duration)]
    pub discover_interval: std::time::Duration,
    /// Where a subscription's bucket is: a URL with `{bucket}` (e.g. `file:///data/{bucket}`,
    /// `s3://{bucket}`). Without it Cloud Storage subscriptions are not exported (at least one of
    /// the two templates is needed).
    #[arg(long, value_name = "URL")]
    pub bucket_url_template: Option<String>,
    /// Where a subscription's table is: a URL with `{project}`, `{dataset}`, `{table}` (e.g.
    /// `s3://lake/{dataset}/{table}`). Without it BigQuery subscriptions are not exported.
    #[arg(long, value_name = "URL")]
    pub table_url_template: Option<String>,
    /// Table schemas for tables that do not exist yet: DIR/PROJECT.DATASET.TABLE.json in
    /// BigQuery's JSON format (an existing table's own schema is used first).
    #[arg(long, value_name = "DIR")]
    pub table_schemas: Option<PathBuf>,
    /// Pub/Sub's numeric limits: enforced exactly (`pubsub`, default) or lifted (`extended`).
    #[arg(long, value_enum)]
    pub limits: Option<LimitsArg>,
    /// The table writer's batching for every table subscription (they have no settings of their
    /// own for it).
    #[command(flatten)]
    pub table_batching: TableBatchingArgs,
    #[command(flatten)]
    pub pubsub: PubsubArgs,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub writer: WriterArgs,
}

impl ServeArgs {
    /// `subsink serve`: exit 0 after a shutdown, 2 for bad flags, 1 when Pub/Sub cannot be reached
    /// at startup.
    pub fn run(self) -> ExitCode {
        let args = self;
        use crate::serve::{Exporter, ExporterSettings, ServeSettings, Targets};
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
                    w.positioned = crate::registry::POSITIONED;
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
            tracing::info!(target: "subsink", project = %settings.project, pubsub = client.target(), "serving the project's export subscriptions");
            let mut pipelines = Exporter::new(client.clone(), resources, metrics, health.clone(), exporter);
            crate::serve::supervise(&client, &settings, &mut pipelines, signalled).await;
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
}
