//! The `subsink` binary: parse flags, load and validate the subscription once, run the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use subsink::app::{self, Output, RunConfig, SourceSpec};
use subsink::config::{self, gcloud::GcloudFlags, LimitsMode, Subscription};
use subsink::encode::avro::Codec;
use subsink::encode::topic::SchemaEncoding;
use subsink::ids::Clock;
use subsink::inspect::InspectOptions;
use subsink::output;
use subsink::pubsub::PubsubClient;
use subsink::resources::Resources;
use subsink::sink::bigquery::{BigQueryClient, TableRef};
use subsink::source::file::{FileSourceSettings, OnBadInput};
use subsink::source::nats::NatsSettings;
use subsink::source::pubsub::PubsubSettings;
use subsink::table::TableSchema;
use subsink::telemetry::{self, Health, LogFormat, Metrics};
use subsink::upload::UploadSettings;

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
    #[arg(long, global = true, value_enum, default_value = "text")]
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
}

#[derive(Args)]
struct ServeArgs {
    /// The project whose export subscriptions are run (`my-project` or `projects/my-project`).
    #[arg(long)]
    project: String,
    /// How often the project's subscriptions are listed again.
    #[arg(long, default_value = "10s")]
    discover_interval: String,
    /// Where a subscription's bucket is: a URL with `{bucket}` (e.g. `file:///data/{bucket}`,
    /// `s3://{bucket}`). Default: the folder ./buckets/{bucket}.
    #[arg(long, value_name = "URL")]
    bucket_url_template: Option<String>,
    /// Where a subscription's table is: a URL with `{project}`, `{dataset}`, `{table}` (e.g.
    /// `s3://lake/{dataset}/{table}`). Default: the folder ./tables/{project}.{dataset}.{table}.
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
    service: ServiceArgs,
    #[command(flatten)]
    writer: WriterArgs,
}

#[derive(Args)]
struct InspectArgs {
    /// A local path (file, or a Delta table's directory) or a URL: file://, s3://bucket/key,
    /// gs://, az:// (a table: its root).
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

#[derive(Clone, Copy, ValueEnum)]
enum LimitsArg {
    Pubsub,
    Extended,
}

#[derive(Clone, Copy, ValueEnum)]
enum EncodingArg {
    Json,
    Binary,
}

/// The subscription: a REST JSON/YAML file, or gcloud-style flags.
#[derive(Args)]
struct SubscriptionArgs {
    /// Subscription resource as JSON or YAML (`gcloud pubsub subscriptions describe --format=json`).
    #[arg(long, value_name = "FILE")]
    subscription: Option<PathBuf>,
    /// Pub/Sub's numeric limits: enforced exactly (`pubsub`, default) or lifted (`extended`).
    #[arg(long, value_enum)]
    limits: Option<LimitsArg>,
    /// Without --subscription: the subscription's full name (`projects/P/subscriptions/S`).
    #[arg(long, value_name = "projects/P/subscriptions/S")]
    subscription_name: Option<String>,
    /// Without --subscription: the topic the subscription is attached to.
    #[arg(long, value_name = "projects/P/topics/T")]
    topic: Option<String>,
    /// Cloud Storage subscription: the bucket name (objects go to --bucket-url).
    #[arg(long)]
    cloud_storage_bucket: Option<String>,
    /// Cloud Storage: text every object name starts with (e.g. `logs/`).
    #[arg(long)]
    cloud_storage_file_prefix: Option<String>,
    /// Cloud Storage: text every object name ends with (e.g. `.avro`; not `/`).
    #[arg(long)]
    cloud_storage_file_suffix: Option<String>,
    /// Cloud Storage: the UTC datetime in object names, e.g. `YYYY-MM-DD/hh_mm_ssZ`.
    #[arg(long)]
    cloud_storage_file_datetime_format: Option<String>,
    /// e.g. `90s`, `5m` (default unit: seconds).
    #[arg(long)]
    cloud_storage_max_duration: Option<String>,
    /// e.g. `10MB`, `1GiB` (default unit: KB = 1024 bytes, as gcloud).
    #[arg(long)]
    cloud_storage_max_bytes: Option<String>,
    /// Cloud Storage: messages per object at most (1000 or more).
    #[arg(long)]
    cloud_storage_max_messages: Option<String>,
    /// `text` (default) or `avro`.
    #[arg(long)]
    cloud_storage_output_format: Option<String>,
    /// Cloud Storage, Avro: also write message id, publish time, attributes, subscription name.
    #[arg(long)]
    cloud_storage_write_metadata: bool,
    /// Cloud Storage, Avro: write messages with the topic's schema (give it with --topic-schema).
    #[arg(long)]
    cloud_storage_use_topic_schema: bool,
    /// BigQuery subscription: `{project}.{dataset}.{table}` (or `{project}:{dataset}.{table}`).
    #[arg(long)]
    bigquery_table: Option<String>,
    /// BigQuery: the topic's Avro schema fields become columns (give it with --topic-schema).
    #[arg(long)]
    use_topic_schema: bool,
    /// BigQuery: top-level JSON keys of each message become columns (--table-schema).
    #[arg(long)]
    use_table_schema: bool,
    /// BigQuery: also write subscription_name, message_id, publish_time, attributes.
    #[arg(long)]
    write_metadata: bool,
    /// BigQuery: drop message fields that are not columns instead of failing the message.
    #[arg(long)]
    drop_unknown_fields: bool,
    /// Dead-letter topic (`projects/P/topics/T` or an ID in the subscription's project).
    #[arg(long)]
    dead_letter_topic: Option<String>,
    /// Deliveries before a message is dead-lettered (5–100; default 5).
    #[arg(long)]
    max_delivery_attempts: Option<String>,
    #[command(flatten)]
    table_batching: TableBatchingArgs,
}

/// The table writer's batching (`subsink.table`), which a BigQuery subscription lacks.
#[derive(Args)]
struct TableBatchingArgs {
    /// Table writer: close and commit a Parquet file this long after its first row
    /// (`subsink.table.maxDuration`; default 60s).
    #[arg(long)]
    table_max_duration: Option<String>,
    /// Table writer: message bytes (payload + attributes) per file (`subsink.table.maxBytes`;
    /// default 64MiB; 0 = no limit).
    #[arg(long)]
    table_max_bytes: Option<String>,
    /// Table writer: rows per file (`subsink.table.maxMessages`; default no limit).
    #[arg(long)]
    table_max_messages: Option<String>,
}

/// Flags of the process: flow control, the shared upload slots and memory budget, shutdown,
/// telemetry (`run` and `serve`).
#[derive(Args)]
struct ServiceArgs {
    /// Pub/Sub flow control (NATS: MaxAckPending of a consumer created here): messages delivered
    /// and not yet settled at most.
    #[arg(long, default_value_t = 10_000)]
    max_outstanding_messages: i64,
    /// Pub/Sub flow control: bytes of message data delivered and not yet settled at most.
    #[arg(long, default_value = "100MiB")]
    max_outstanding_bytes: String,
    /// Pub/Sub: lease set on pulled messages and renewed every third of it until they are
    /// durable (10–600 s).
    #[arg(long, default_value = "60s")]
    ack_lease: String,
    /// Pub/Sub: StreamingPull streams open at once (1–16; default 2, and 1 with message
    /// ordering, which needs one). The server paces each stream, so more streams deliver more.
    #[arg(long, value_name = "N")]
    pubsub_streams: Option<usize>,
    /// Bytes the open files and the files being uploaded may hold in memory, over every
    /// subscription of the process; near it the largest open file is finalized early (reason
    /// `memory`). `0` or `none`: no budget beyond the file limits.
    #[arg(long, default_value = "1GiB", value_name = "SIZE")]
    memory_limit: String,
    /// On SIGTERM / SIGINT: how long finalizing and uploading open files may take.
    #[arg(long, default_value = "60s")]
    shutdown_grace: String,
    /// Finalized files being made durable at once, over every subscription of the process.
    #[arg(long, default_value_t = 2)]
    max_concurrent_uploads: usize,
    /// Serve Prometheus metrics at /metrics, and /healthz and /readyz, on HOST:PORT
    /// (e.g. 0.0.0.0:9090).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
}

/// How files are written, whatever the subscription (`run` and `serve`).
#[derive(Args)]
struct WriterArgs {
    /// Avro block codec.
    #[arg(long, default_value = "null")]
    avro_codec: String,
    /// Uncompressed size at which an Avro block is closed.
    #[arg(long, default_value = "1MiB")]
    avro_block_size: String,
    /// Encoding of messages without a `googclient_schemaencoding` attribute.
    #[arg(long, value_enum, default_value = "json")]
    schema_encoding: EncodingArg,
    /// Objects larger than this are streamed as multipart uploads.
    #[arg(long, default_value = "16MiB")]
    multipart_threshold: String,
    /// Multipart part size.
    #[arg(long, default_value = "8MiB")]
    part_size: String,
    /// How long an object whose upload keeps failing with a transient error (the store down or
    /// unreachable, 5xx) is retried, with backoff from 0.5 s doubling to 30 s, before its messages
    /// are given up as not done for this run.
    #[arg(long, default_value = "5m")]
    upload_retry_for: String,
    /// Table writer: Parquet compression: zstd (level 1), zstd(N), snappy, gzip, gzip(N), uncompressed.
    #[arg(long, default_value = "zstd")]
    parquet_compression: String,
    /// BigQuery destination (`--table-url bigquery://PROJECT/DATASET/TABLE`): the REST endpoint
    /// (tables.get), e.g. an emulator's http://127.0.0.1:9050. Default Google's, with Application
    /// Default Credentials.
    #[arg(long, value_name = "URL")]
    bigquery_endpoint: Option<String>,
    /// BigQuery destination: the Storage Write API (gRPC) endpoint, e.g. http://127.0.0.1:9060.
    /// Default Google's, with Application Default Credentials.
    #[arg(long, value_name = "URL")]
    bigquery_storage_endpoint: Option<String>,
    /// BigQuery destination: write each batch through a PENDING stream with offsets, committed
    /// atomically, instead of the default stream (at least once); with a file source and
    /// --checkpoint, a crash and resume writes no row twice.
    #[arg(long)]
    exactly_once: bool,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    sub: SubscriptionArgs,
    #[command(flatten)]
    service: ServiceArgs,
    #[command(flatten)]
    writer: WriterArgs,
    /// NDJSON of Pub/Sub messages (REST `PubsubMessage` or pull form); `-` reads stdin;
    /// `pubsub` pulls the subscription itself (Google Cloud with Application Default Credentials,
    /// or the emulator when PUBSUB_EMULATOR_HOST is set); `push` receives a push subscription's
    /// requests on --listen.
    /// `nats://HOST:PORT` (or `tls://`) pulls a NATS JetStream durable consumer (--nats-stream,
    /// --nats-consumer).
    #[arg(long, default_value = "-")]
    source: String,
    /// `--source push`: the address the push endpoint listens on (e.g. 127.0.0.1:8080).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// `--source push`: require an OIDC token for this audience on every request (else 401).
    #[arg(long, value_name = "AUDIENCE")]
    push_audience: Option<String>,
    /// `--source push`: the keys tokens are checked against, a JWKS URL or file (default Google's).
    #[arg(long, value_name = "URL|FILE")]
    push_jwks: Option<String>,
    /// `--source push`: a service-account email tokens may be for (repeatable; default any).
    #[arg(long, value_name = "EMAIL")]
    push_allowed_email: Vec<String>,
    /// NATS source: the JetStream stream to read.
    #[arg(long, value_name = "STREAM")]
    nats_stream: Option<String>,
    /// NATS source: the durable pull consumer (created if absent, with explicit acks, AckWait =
    /// ackDeadlineSeconds, MaxDeliver = maxDeliveryAttempts, MaxAckPending =
    /// --max-outstanding-messages).
    #[arg(long, value_name = "NAME")]
    nats_consumer: Option<String>,
    /// NATS source: where a message goes after its last allowed delivery failed (a subject a
    /// stream stores), with the CloudPubSubDeadLetterSource* headers.
    #[arg(long, value_name = "SUBJECT")]
    nats_dead_letter_subject: Option<String>,
    /// Where the subscription's bucket lives: file:///dir, s3://bucket, gs://, az://, memory://,
    /// or discard:// (write nothing: the pipeline alone). Default: the folder ./buckets/<bucket>.
    #[arg(long)]
    bucket_url: Option<String>,
    /// Malformed input line: stop the run (`fail`) or log, count and go on (`skip`).
    #[arg(long, value_enum, default_value = "fail")]
    on_bad_input: OnBadInput,
    /// Checkpoint file: resume a file source where the last run left off.
    #[arg(long, value_name = "PATH")]
    checkpoint: Option<PathBuf>,
    /// Pin the wall clock used in object names (and missing publishTime), RFC 3339.
    #[arg(long, value_name = "RFC3339")]
    fixed_time: Option<String>,
    /// Seed object uuids and Avro sync markers (golden tests; never for two workers at once).
    #[arg(long)]
    seed: Option<u64>,
    /// The topic's Avro schema (.avsc), for use_topic_schema.
    #[arg(long, value_name = "FILE.avsc")]
    topic_schema: Option<PathBuf>,
    /// Table writer: where the Delta table lives: file:///dir, s3://bucket/prefix, gs://, az://,
    /// memory://, or discard:// (write nothing). Default: the folder ./tables/<bigqueryConfig.table>.
    #[arg(long)]
    table_url: Option<String>,
    /// Table writer: the table's schema in BigQuery's JSON format
    /// (`bq show --schema --format=prettyjson`). Without it the table has the `data` column
    /// (BYTES) and, with write_metadata, the metadata columns.
    #[arg(long, value_name = "FILE.json")]
    table_schema: Option<PathBuf>,
    /// File source, table writer: append messages that fail on every delivery attempt here
    /// (NDJSON Pub/Sub messages with the CloudPubSubDeadLetterSource* attributes).
    #[arg(long, value_name = "PATH")]
    dead_letter: Option<PathBuf>,
}

/// Exit codes: 0 all done, 1 some messages not done (failed upload, bad input), 2 bad usage/config.
fn main() -> ExitCode {
    no_transparent_huge_pages();
    // Two rustls crypto backends are compiled in (see Cargo.toml): make ring the default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    if let Err(e) = telemetry::logs::init(cli.log_format) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    match cli.cmd {
        Cmd::Validate(args) => match load_subscription(&args) {
            Ok(v) => {
                for w in v.warnings() {
                    eprintln!("warning: {w}");
                }
                println!("{}: valid", v.name);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        },
        Cmd::Run(args) => run(*args),
        Cmd::Inspect(args) => inspect(args),
        Cmd::Serve(args) => serve(*args),
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
                    config::validate(
                        &r,
                        args.limits.map(|l| match l {
                            LimitsArg::Pubsub => LimitsMode::Pubsub,
                            LimitsArg::Extended => LimitsMode::Extended,
                        }),
                    )
                    .map_err(|e| e.to_string())
                });
            match checked {
                Ok(v) => match v.storage {
                    Some(storage) => Some((v.name, storage)),
                    None => {
                        eprintln!(
                            "error: --subscription {}: {} has no cloudStorageConfig, so no object naming rule",
                            path.display(),
                            v.name
                        );
                        return ExitCode::from(2);
                    }
                },
                Err(e) => {
                    eprintln!("error: --subscription {}: {e}", path.display());
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
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn broken_pipe(e: &subsink::inspect::InspectError) -> bool {
    matches!(e, subsink::inspect::InspectError::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe)
}

fn load_subscription(args: &SubscriptionArgs) -> Result<config::ValidSubscription, String> {
    let resource: Subscription = match &args.subscription {
        Some(path) => config::resource::load(path).map_err(|e| e.to_string())?,
        None => GcloudFlags {
            subscription_name: args.subscription_name.clone(),
            topic: args.topic.clone(),
            cloud_storage_bucket: args.cloud_storage_bucket.clone(),
            cloud_storage_file_prefix: args.cloud_storage_file_prefix.clone(),
            cloud_storage_file_suffix: args.cloud_storage_file_suffix.clone(),
            cloud_storage_file_datetime_format: args.cloud_storage_file_datetime_format.clone(),
            cloud_storage_max_duration: args.cloud_storage_max_duration.clone(),
            cloud_storage_max_bytes: args.cloud_storage_max_bytes.clone(),
            cloud_storage_max_messages: args.cloud_storage_max_messages.clone(),
            cloud_storage_output_format: args.cloud_storage_output_format.clone(),
            cloud_storage_write_metadata: args.cloud_storage_write_metadata,
            cloud_storage_use_topic_schema: args.cloud_storage_use_topic_schema,
            bigquery_table: args.bigquery_table.clone(),
            use_topic_schema: args.use_topic_schema,
            use_table_schema: args.use_table_schema,
            write_metadata: args.write_metadata,
            drop_unknown_fields: args.drop_unknown_fields,
            dead_letter_topic: args.dead_letter_topic.clone(),
            max_delivery_attempts: args.max_delivery_attempts.clone(),
        }
        .to_subscription()
        .map_err(|e| e.to_string())?,
    };
    let mut resource = resource;
    if let Some(t) = table_batching(&args.table_batching)? {
        let ext = resource.subsink.get_or_insert_with(Default::default);
        let cur = ext.table.get_or_insert_with(Default::default);
        cur.max_duration = t.max_duration.or(cur.max_duration.take());
        cur.max_bytes = t.max_bytes.or(cur.max_bytes.take());
        cur.max_messages = t.max_messages.or(cur.max_messages.take());
    }
    let limits = args.limits.map(|l| match l {
        LimitsArg::Pubsub => LimitsMode::Pubsub,
        LimitsArg::Extended => LimitsMode::Extended,
    });
    config::validate(&resource, limits).map_err(|e| e.to_string())
}

/// `--table-max-*` flags: they override `subsink.table` of the resource (validated with it).
fn table_batching(
    args: &TableBatchingArgs,
) -> Result<Option<config::resource::TableBatching>, String> {
    use subsink::config::resource::{RawDuration, RawInt, TableBatching};
    if args.table_max_duration.is_none()
        && args.table_max_bytes.is_none()
        && args.table_max_messages.is_none()
    {
        return Ok(None);
    }
    let mut t = TableBatching::default();
    if let Some(v) = &args.table_max_duration {
        t.max_duration = Some(RawDuration::from(duration("table-max-duration", v)?));
    }
    if let Some(v) = &args.table_max_bytes {
        let n = config::gcloud::parse_binary_size(v, false)
            .map_err(|e| format!("--table-max-bytes {v:?}: {e}"))?;
        t.max_bytes = Some(RawInt::from(n));
    }
    if let Some(v) = &args.table_max_messages {
        let n: u64 = v
            .parse()
            .map_err(|_| format!("--table-max-messages {v:?}: not a whole number"))?;
        t.max_messages = Some(RawInt::from(n));
    }
    Ok(Some(t))
}

fn size(flag: &str, v: &str) -> Result<usize, String> {
    config::gcloud::parse_binary_size(v, false)
        .map(|n| n as usize)
        .map_err(|e| format!("--{flag} {v:?}: {e}"))
}

fn run(args: RunArgs) -> ExitCode {
    let (cfg, connect) = match build(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = runtime();
    // A broker keeps what is handed back for redelivery.
    let broker = connect.is_some();
    // The process's telemetry: the pipeline counts, beats (every second) and reports readiness
    // through its handles.
    let metrics = Metrics::new();
    let health = Health::default();
    let mut cfg = cfg;
    cfg.telemetry = telemetry::PipelineTelemetry::new(&metrics, &health, &cfg.subscription.name);
    // Bound before the run starts, so a bad --metrics-addr fails at once; stopped after the drain,
    // so /readyz answers "shutting down" throughout it.
    let server = match endpoint(&rt, &args.service, &metrics, &health) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let result = rt.block_on(async move {
        let mut cfg = cfg;
        match connect {
            Some(Connect::Pubsub(settings)) => {
                let client = PubsubClient::connect()
                    .await
                    .map_err(|e| app::RunError::Pubsub(e).to_string())?;
                cfg.source = SourceSpec::Pubsub { client, settings };
            }
            Some(Connect::Nats(settings)) => {
                let conn = subsink::source::nats::connect(settings, &cfg.subscription.delivery)
                    .await
                    .map_err(|e| e.to_string())?;
                cfg.source = SourceSpec::Nats(Box::new(conn));
            }
            None => {}
        }
        let draining = health.clone();
        cfg.shutdown = Some(Box::pin(async move {
            shutdown_signal().await;
            // /readyz turns 503 for the whole drain.
            draining.set_shutting_down();
        }));
        app::run(cfg).await.map_err(|e| e.to_string())
    });
    if let Some(server) = server {
        rt.block_on(server.stop());
    }
    match result {
        Ok(summary) => {
            println!(
                "{}",
                serde_json::to_string(&summary).expect("serializable summary")
            );
            if summary.ok(broker) {
                ExitCode::SUCCESS
            } else {
                if let Some(why) = &summary.stopped {
                    eprintln!("error: stopped: {why}");
                }
                for f in &summary.failed_objects {
                    eprintln!(
                        "error: object {} not written ({}): its {} messages, lines {}..={}, ids {}..{}, are not done",
                        f.object, f.error, f.messages, f.first_line, f.last_line, f.first_message_id, f.last_message_id
                    );
                }
                for m in &summary.failed_messages {
                    eprintln!(
                        "error: line {}: message {:?} not written after {} delivery attempt(s): {}",
                        m.line, m.message_id, m.attempts, m.error
                    );
                }
                if summary.messages_failed > summary.failed_messages.len() as u64 {
                    eprintln!(
                        "error: {} more messages not written (see the log)",
                        summary.messages_failed - summary.failed_messages.len() as u64
                    );
                }
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// `subsink serve`: exit 0 after a shutdown, 2 for bad flags, 1 when Pub/Sub cannot be reached
/// at startup.
fn serve(args: ServeArgs) -> ExitCode {
    use subsink::serve::{Exporter, ExporterSettings, ServeSettings, Targets};
    let prepared = (|| -> Result<(ServeSettings, ExporterSettings, Resources), String> {
        let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
        let local = Targets::local(&cwd);
        let targets = Targets::new(
            args.bucket_url_template
                .as_deref()
                .unwrap_or(local.bucket_url.as_str()),
            args.table_url_template
                .as_deref()
                .unwrap_or(local.table_url.as_str()),
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
            limits: match args.limits {
                Some(LimitsArg::Extended) => LimitsMode::Extended,
                _ => LimitsMode::Pubsub,
            },
            interval: duration("discover-interval", &args.discover_interval)?,
            targets,
            table_batching: table_batching(&args.table_batching)?,
            probe: None,
        };
        let exporter = ExporterSettings {
            writer: writer_options(&args.writer, None)?,
            pull: pubsub_settings(&args.service, "", false)?,
            shutdown_grace: duration("shutdown-grace", &args.service.shutdown_grace)?,
        };
        Ok((serve, exporter, resources(&args.service)?))
    })();
    let (settings, exporter, resources) = match prepared {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = runtime();
    let metrics = Metrics::new();
    let health = Health::default();
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
        let draining = health.clone();
        subsink::serve::supervise(&client, &settings, &mut pipelines, async move {
            shutdown_signal().await;
            // /readyz turns 503 for the whole drain.
            draining.set_shutting_down();
        })
        .await;
        Ok::<(), String>(())
    });
    if let Some(server) = server {
        rt.block_on(server.stop());
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
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
            eprintln!("error: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn duration(flag: &str, v: &str) -> Result<std::time::Duration, String> {
    config::gcloud::parse_duration(v).map_err(|e| format!("--{flag} {v:?}: {e}"))
}

/// `--pubsub-streams`: 2 by default, 1 with message ordering (a second stream could hand out a
/// key's messages beside the first's).
fn pubsub_streams(flag: Option<usize>, ordering: bool) -> Result<usize, String> {
    use subsink::source::pubsub::MAX_STREAMS;
    match flag {
        None if ordering => Ok(1),
        None => Ok(2),
        Some(n) if !(1..=MAX_STREAMS).contains(&n) => Err(format!(
            "--pubsub-streams {n}: 1–{MAX_STREAMS} streams are allowed"
        )),
        Some(n) if n > 1 && ordering => Err(format!(
            "--pubsub-streams {n}: a subscription with enableMessageOrdering is read on one stream"
        )),
        Some(n) => Ok(n),
    }
}

/// A broker source, connected inside the runtime; it then takes the place of the file source.
enum Connect {
    Pubsub(PubsubSettings),
    Nats(NatsSettings),
}

/// The run's config; with a broker source also its settings (see [`Connect`]).
fn build(args: &RunArgs) -> Result<(RunConfig, Option<Connect>), String> {
    let subscription = load_subscription(&args.sub)?;
    let clock = Clock {
        fixed: args
            .fixed_time
            .as_deref()
            .map(|t| {
                chrono::DateTime::parse_from_rfc3339(t)
                    .map(|t| t.with_timezone(&chrono::Utc))
                    .map_err(|e| format!("--fixed-time {t:?}: {e}"))
            })
            .transpose()?,
    };
    let output = if subscription.bigquery.is_some() {
        table_output(args, &subscription)?
    } else {
        storage_output(args, &subscription)?
    };
    if args.dead_letter.is_some() && subscription.bigquery.is_none() {
        return Err(
            "--dead-letter applies to the table writer (a bigqueryConfig subscription)".into(),
        );
    }
    let mut pull = None;
    let nats = args.source.starts_with("nats://") || args.source.starts_with("tls://");
    if !nats
        && (args.nats_stream.is_some()
            || args.nats_consumer.is_some()
            || args.nats_dead_letter_subject.is_some())
    {
        return Err("--nats-stream, --nats-consumer and --nats-dead-letter-subject need --source nats://HOST:PORT".into());
    }
    let source = if args.source == "push" {
        push_settings(args, &subscription)?
    } else if args.source == "pubsub" {
        let s = pubsub_settings(
            &args.service,
            &subscription.name,
            subscription.delivery.enable_message_ordering,
        )?;
        if args.checkpoint.is_some() {
            return Err(
                "--checkpoint is for the file source; Pub/Sub keeps unacked messages itself".into(),
            );
        }
        if args.dead_letter.is_some() {
            return Err(app::RunError::DeadLetterOnPubsub.to_string());
        }
        pull = Some(Connect::Pubsub(s));
        SourceSpec::File(FileSourceSettings::new(None))
    } else if nats {
        let (Some(stream), Some(consumer)) = (&args.nats_stream, &args.nats_consumer) else {
            return Err(
                "--source nats://…: give --nats-stream STREAM and --nats-consumer NAME".into(),
            );
        };
        if args.checkpoint.is_some() {
            return Err(
                "--checkpoint is for the file source; JetStream keeps unacked messages itself"
                    .into(),
            );
        }
        if args.dead_letter.is_some() {
            return Err("--dead-letter is for the file source; a NATS source dead-letters to --nats-dead-letter-subject".into());
        }
        let mut s = NatsSettings::new(&args.source, stream, consumer);
        s.dead_letter_subject = args.nats_dead_letter_subject.clone();
        s.max_ack_pending = args.service.max_outstanding_messages;
        pull = Some(Connect::Nats(s));
        SourceSpec::File(FileSourceSettings::new(None))
    } else {
        let path = match args.source.as_str() {
            "-" => None,
            p => Some(PathBuf::from(p)),
        };
        if path.is_none() && args.checkpoint.is_some() {
            return Err(app::RunError::CheckpointOnStdin.to_string());
        }
        // A missing or unreadable file is a bad flag (exit 2), caught before the run starts.
        if let Some(p) = &path {
            std::fs::File::open(p)
                .and_then(|f| f.metadata())
                .and_then(|m| {
                    if m.is_dir() {
                        Err(std::io::Error::other("is a directory"))
                    } else {
                        Ok(())
                    }
                })
                .map_err(|e| format!("--source {}: {e}", p.display()))?;
        }
        let mut s = FileSourceSettings::new(path);
        s.on_bad_input = args.on_bad_input;
        s.default_publish_time_micros = clock.fixed.map(|t| t.timestamp_micros());
        SourceSpec::File(s)
    };
    let name = subscription.name.clone();
    let cfg = RunConfig {
        subscription,
        source,
        output,
        checkpoint: args.checkpoint.clone(),
        dead_letter: args.dead_letter.clone(),
        seed: args.seed,
        clock,
        resources: resources(&args.service)?,
        shutdown: None,
        shutdown_grace: duration("shutdown-grace", &args.service.shutdown_grace)?,
        telemetry: telemetry::PipelineTelemetry::detached(&name),
    };
    Ok((cfg, pull))
}

/// The process's upload slots and memory budget (`--max-concurrent-uploads`, `--memory-limit`).
fn resources(s: &ServiceArgs) -> Result<Resources, String> {
    let limit = match s.memory_limit.as_str() {
        "0" | "none" => None,
        v => Some(size("memory-limit", v)? as u64),
    };
    Ok(Resources::new(s.max_concurrent_uploads, limit))
}

/// StreamingPull settings of `subscription` from the flow-control and lease flags.
/// How a Pub/Sub subscription is pulled; `ordering`: it has enableMessageOrdering (one stream).
fn pubsub_settings(
    s: &ServiceArgs,
    subscription: &str,
    ordering: bool,
) -> Result<PubsubSettings, String> {
    let mut p = PubsubSettings::new(subscription);
    p.max_outstanding_messages = s.max_outstanding_messages;
    p.max_outstanding_bytes = size("max-outstanding-bytes", &s.max_outstanding_bytes)? as i64;
    p.stream_ack_deadline = duration("ack-lease", &s.ack_lease)?;
    p.streams = pubsub_streams(s.pubsub_streams, ordering)?;
    Ok(p)
}

/// `--source push`: the endpoint's settings. Pub/Sub waits for a push request's answer up to the
/// ack deadline, and a message is answered once its file is durable — at most `maxDuration` later:
/// a longer `maxDuration` would time out every request, so it is refused here.
fn push_settings(
    args: &RunArgs,
    subscription: &config::ValidSubscription,
) -> Result<SourceSpec, String> {
    use subsink::source::push::{JwksSource, PushAuth, PushSettings, GOOGLE_JWKS};
    let deadline = subscription.delivery.ack_deadline;
    let max_duration = match (&subscription.storage, &subscription.bigquery) {
        (Some(s), _) => s.max_duration,
        (None, Some(b)) => b.max_duration,
        (None, None) => deadline,
    };
    if max_duration > deadline {
        return Err(format!(
            "--source push: the file's maxDuration ({max_duration:?}) is longer than the \
             subscription's ackDeadlineSeconds ({deadline:?}): Pub/Sub would time out every push \
             request before its message is durable; lower maxDuration or raise ackDeadlineSeconds"
        ));
    }
    let listen = args
        .listen
        .clone()
        .ok_or("--source push needs --listen HOST:PORT")?;
    if args.checkpoint.is_some() {
        return Err(
            "--checkpoint is for the file source; Pub/Sub keeps unacked messages itself".into(),
        );
    }
    let auth = match &args.push_audience {
        Some(aud) => Some(PushAuth {
            audience: aud.clone(),
            jwks: JwksSource::parse(args.push_jwks.as_deref().unwrap_or(GOOGLE_JWKS)),
            allowed_emails: args.push_allowed_email.clone(),
        }),
        None if args.push_jwks.is_some() || !args.push_allowed_email.is_empty() => {
            return Err("--push-jwks and --push-allowed-email need --push-audience".into())
        }
        None => None,
    };
    Ok(SourceSpec::Push(PushSettings {
        listen,
        auth,
        answer_within: deadline,
    }))
}

/// A local folder as the default location: `./<parent>/<name>`, as a `file://` URL.
fn default_dir_url(parent: &str, name: &str) -> Result<String, String> {
    let dir = std::env::current_dir()
        .map_err(|e| e.to_string())?
        .join(parent)
        .join(name);
    url::Url::from_directory_path(&dir)
        .map(|u| u.to_string())
        .map_err(|_| format!("cannot make a URL of {}", dir.display()))
}

/// How files are written, from the flags `run` and `serve` share.
fn writer_options(
    w: &WriterArgs,
    topic_schema: Option<PathBuf>,
) -> Result<output::WriterOptions, String> {
    Ok(output::WriterOptions {
        avro_codec: w
            .avro_codec
            .parse::<Codec>()
            .map_err(|e| format!("--avro-codec: {e}"))?,
        avro_block_size: size("avro-block-size", &w.avro_block_size)?,
        topic_schema: topic_schema.map(subsink::encode::topic::TopicSchemaSource::File),
        schema_encoding: match w.schema_encoding {
            EncodingArg::Json => SchemaEncoding::Json,
            EncodingArg::Binary => SchemaEncoding::Binary,
        },
        upload: UploadSettings {
            multipart_threshold: size("multipart-threshold", &w.multipart_threshold)?,
            part_size: size("part-size", &w.part_size)?,
            retry_for: duration("upload-retry-for", &w.upload_retry_for)?,
            ..UploadSettings::default()
        },
        parquet_compression: w.parquet_compression.clone(),
        bigquery: output::BigQueryOptions {
            rest: w.bigquery_endpoint.clone(),
            storage: w.bigquery_storage_endpoint.clone(),
            exactly_once: w.exactly_once,
        },
    })
}

/// The storage writer's bucket and format (docs/contract.md §3).
fn storage_output(
    args: &RunArgs,
    subscription: &config::ValidSubscription,
) -> Result<Output, String> {
    let opts = writer_options(&args.writer, args.topic_schema.clone())?;
    let bucket_url = match (&args.bucket_url, &subscription.storage) {
        (Some(u), _) => u.clone(),
        (None, Some(storage)) => default_dir_url("buckets", &storage.bucket)?,
        (None, None) => String::new(),
    };
    output::storage_output(subscription, &bucket_url, &opts)
}

/// The schema of BigQuery table `t`, read with tables.get (a runtime of its own: startup, before
/// the run's).
fn bigquery_schema(w: &WriterArgs, t: &TableRef) -> Result<TableSchema, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = BigQueryClient::new(
            w.bigquery_endpoint.as_deref(),
            w.bigquery_storage_endpoint.as_deref(),
        )
        .map_err(|e| e.to_string())?;
        client.table_schema(t).await.map_err(|e| e.to_string())
    })
}

/// The table writer's table and row mapping (docs/contract.md §4): schema and mode checked here, at startup.
fn table_output(
    args: &RunArgs,
    subscription: &config::ValidSubscription,
) -> Result<Output, String> {
    let bq = subscription
        .bigquery
        .as_ref()
        .expect("checked by the caller");
    let bigquery = match args.table_url.as_deref() {
        Some(u) if output::is_bigquery_url(u) => Some(TableRef::from_url(u, &bq.table)?),
        _ => None,
    };
    let schema = match &args.table_schema {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--table-schema {}: {e}", path.display()))?;
            Some(output::NamedSchema {
                schema: TableSchema::from_json(&text)
                    .map_err(|e| format!("--table-schema {}: {e}", path.display()))?,
                origin: format!("--table-schema {}", path.display()),
            })
        }
        // As Pub/Sub does: the table's own schema, read with tables.get.
        None => match &bigquery {
            Some(t) => Some(output::NamedSchema {
                schema: bigquery_schema(&args.writer, t)?,
                origin: format!("the BigQuery table {t}"),
            }),
            None => None,
        },
    };
    let table_url = match &args.table_url {
        Some(u) => u.clone(),
        None => default_dir_url("tables", &bq.table.replace(':', "."))?,
    };
    let opts = writer_options(&args.writer, args.topic_schema.clone())?;
    output::table_output(
        subscription,
        &table_url,
        schema,
        "--table-schema FILE.json",
        &opts,
    )
}
