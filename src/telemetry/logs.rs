//! Logs: `--log-format text|json` on stderr, levels from `SUBSINK_LOG` (else `RUST_LOG`), and the
//! one line per durable file.
//!
//! Default: subsink's own lines at info, everything else at warn. The crates below log every
//! request or commit at info/debug (deltalake, object_store, the HTTP and gRPC stacks): a global
//! `info`/`debug`/`trace` asked for in `SUBSINK_LOG` still leaves them at warn, unless the filter
//! names them (`SUBSINK_LOG=debug,object_store=debug`).
//!
//! Lines are written while a progress bar (see [`super::progress`]) is hidden, so neither garbles
//! the other on a terminal.

use std::io::Write;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

pub use super::metrics::DurableFile;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event (colours on a terminal).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's fields
    /// at the top level (what log shippers such as Fluent Bit or Vector parse without rules).
    Json,
}

/// Crates held at warn unless the filter names them.
pub const QUIET_CRATES: &[&str] = &[
    "deltalake",
    "deltalake_core",
    "object_store",
    "parquet",
    "arrow",
    "hyper",
    "hyper_util",
    "h2",
    "tonic",
    "tower",
    "reqwest",
    "rustls",
    "axum",
];

/// The default filter: subsink at info, the rest at warn — but deltalake's MERGE, which warns on
/// every MERGE that a DataFusion scan metric it looks for is missing (change data capture commits
/// one MERGE per batch; the warning says nothing about the data), at error.
pub const DEFAULT_FILTER: &str = "warn,subsink=info,deltalake_core::operations::merge=error";

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{var}={value:?}: {reason}")]
    BadFilter {
        var: &'static str,
        value: String,
        reason: String,
    },
    #[error("a logger is already installed")]
    AlreadyInstalled,
}

/// The filter directives for what the user asked (`None`: nothing asked): theirs, plus
/// `CRATE=warn` for each quiet crate they did not name when their global level is more verbose
/// than warn.
pub fn filter_directives(asked: Option<&str>) -> String {
    let base = match asked.map(str::trim) {
        Some(s) if !s.is_empty() => s,
        _ => DEFAULT_FILTER,
    };
    let directives: Vec<&str> = base.split(',').map(str::trim).collect();
    let global = directives
        .iter()
        .rev()
        .find(|d| is_level(d))
        .map(|d| d.to_ascii_lowercase());
    let verbose = matches!(global.as_deref(), Some("info" | "debug" | "trace"));
    let mut out = base.to_string();
    if verbose {
        for quiet in QUIET_CRATES {
            let named = directives.iter().any(|d| {
                let target = d.split(['=', '[']).next().unwrap_or("");
                target == *quiet || target.starts_with(&format!("{quiet}::"))
            });
            if !named {
                out.push_str(&format!(",{quiet}=warn"));
            }
        }
    }
    out
}

fn is_level(d: &str) -> bool {
    matches!(
        d.to_ascii_lowercase().as_str(),
        "trace" | "debug" | "info" | "warn" | "error" | "off"
    )
}

/// Install the process's logger on stderr. Call once, first thing in `main`.
pub fn init(format: LogFormat) -> Result<(), LogError> {
    JSON.store(
        format == LogFormat::Json,
        std::sync::atomic::Ordering::Relaxed,
    );
    let (var, asked) = match std::env::var("SUBSINK_LOG") {
        Ok(v) => ("SUBSINK_LOG", Some(v)),
        Err(_) => ("RUST_LOG", std::env::var("RUST_LOG").ok()),
    };
    let directives = filter_directives(asked.as_deref());
    let filter = EnvFilter::try_new(&directives).map_err(|e| LogError::BadFilter {
        var,
        value: asked.clone().unwrap_or_default(),
        reason: e.to_string(),
    })?;
    let ansi = format == LogFormat::Text && std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing::subscriber::set_global_default(subscriber(format, filter, StderrWriter, ansi))
        .map_err(|_| LogError::AlreadyInstalled)
}

/// The subscriber [`init`] installs, over any writer (tests capture into a buffer).
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    // A writer's error is not printed to stderr by the subscriber (it would panic where stderr
    // is a closed pipe, in whatever task logged).
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .log_internal_errors(false);
    let handled = tracing_subscriber::filter::filter_fn(|m| !handled_by_subsink(m));
    match format {
        LogFormat::Text => Box::new(b.with_ansi(ansi).finish().with(handled)),
        LogFormat::Json => Box::new(
            b.json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish()
                .with(handled),
        ),
    }
}

/// deltalake's ERROR events for a commit it hands back to its caller, which subsink handles:
/// `conflict detected, aborting transaction` (another writer's commit conflicts: a schema
/// changed under the commit, which subsink checks and commits again) and `exceeded maximum
/// commit attempts` (the versions were taken by others; the commit is tried again). They are
/// left out of the log whatever the filter: an operator alerting on ERROR sees subsink's own
/// line when the commit finally fails (`object … failed: …`), never one for a commit that then
/// lands. Told apart by their fields (`conflicts_checked`, `max_retries`), which no other event
/// of the module has; its other ERROR (`commit failed, aborting`: the store failed) stays.
fn handled_by_subsink(m: &tracing::Metadata<'_>) -> bool {
    *m.level() == tracing::Level::ERROR
        && m.target() == "deltalake_core::kernel::transaction"
        && m.fields()
            .iter()
            .any(|f| matches!(f.name(), "conflicts_checked" | "max_retries"))
}

/// stderr, with any progress bar hidden while a line is written. A line stderr does not take
/// (its reader is gone: a closed pipe) is dropped: the worker goes on, and shuts down on a
/// signal, without its log — it never fails or stops over one.
#[derive(Debug, Clone, Copy, Default)]
pub struct StderrWriter;

impl Write for StderrWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter hands over a whole line per call: one suspend per line.
        let _ = super::progress::suspend(|| std::io::stderr().lock().write_all(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Whether [`init`] chose JSON: the binary's own lines ([`stderr_line`], [`report`]) follow.
static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A line to stderr that never panics (`eprintln!` does where stderr is a closed pipe): the
/// binary's own messages, like the log, are dropped when nobody reads them. With
/// `--log-format json` the line is a JSON object as the log's are (`error: …` and `warning: …`
/// become the level; see [`report`]).
pub fn stderr_line(args: std::fmt::Arguments<'_>) {
    if JSON.load(std::sync::atomic::Ordering::Relaxed) {
        let text = args.to_string();
        let (level, message) = match text.split_once(": ") {
            Some(("error", m)) => ("ERROR", m),
            Some(("warning", m)) => ("WARN", m),
            _ => ("INFO", text.as_str()),
        };
        return report(level, message, &[]);
    }
    let _ = super::progress::suspend(|| writeln!(std::io::stderr().lock(), "{args}"));
}

/// One of the binary's own lines on stderr (the final error, what is not done) with `fields`:
/// as text, `error: message`; as JSON, an object shaped as the log's lines are (`timestamp`,
/// `level`, `target`, `message` and the fields at the top level, e.g. `file` and `line`).
pub fn report(level: &str, message: &str, fields: &[(&str, serde_json::Value)]) {
    let line = if JSON.load(std::sync::atomic::Ordering::Relaxed) {
        let mut obj = serde_json::Map::new();
        obj.insert(
            "timestamp".into(),
            chrono::Utc::now()
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                .into(),
        );
        obj.insert("level".into(), level.into());
        obj.insert("target".into(), "subsink".into());
        obj.insert("message".into(), message.into());
        for (k, v) in fields {
            obj.insert((*k).into(), v.clone());
        }
        serde_json::Value::Object(obj).to_string()
    } else {
        let prefix = match level {
            "ERROR" => "error: ",
            "WARN" => "warning: ",
            _ => "",
        };
        format!("{prefix}{message}")
    };
    let _ = super::progress::suspend(|| writeln!(std::io::stderr().lock(), "{line}"));
}

/// A line to stdout that never panics (`println!` does where stdout is a closed pipe).
pub fn stdout_line(args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stdout().lock(), "{args}");
}

impl<'a> MakeWriter<'a> for StderrWriter {
    type Writer = StderrWriter;

    fn make_writer(&'a self) -> Self::Writer {
        StderrWriter
    }
}

/// The info line for a durable file, with its facts as fields:
/// `file written subscription=… name=… messages=… bytes=… reason=… upload_seconds=… kind=…`.
/// [`super::PipelineTelemetry::file_durable`] calls it along with the counters.
pub fn file_durable(subscription: &str, f: &DurableFile<'_>) {
    // Milliseconds are what a person compares; more digits are noise in a log line.
    let secs = (f.latency.as_secs_f64() * 1000.0).round() / 1000.0;
    tracing::info!(
        target: "subsink::file",
        subscription,
        name = %f.name,
        messages = f.messages,
        bytes = f.bytes,
        reason = f.reason.as_str(),
        upload_seconds = secs,
        kind = f.kind.as_str(),
        "file written"
    );
}

/// A URL as it may be logged: `scheme://user:password@host/…` → `scheme://***@host/…` (a source
/// URL may carry credentials; they never reach a log line or an error).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::metrics::{DurableKind, FinalizeReason};
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    fn capture(format: LogFormat, asked: Option<&str>, f: impl FnOnce()) -> String {
        let buf = Buf::default();
        let filter = EnvFilter::try_new(filter_directives(asked)).unwrap();
        let sub = subscriber(format, filter, buf.clone(), false);
        tracing::subscriber::with_default(sub, f);
        let out = buf.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    fn sample_file() -> DurableFile<'static> {
        DurableFile {
            name: "events/2023-09-25T04:10:00+00:00_u.avro",
            messages: 42,
            bytes: 4096,
            reason: FinalizeReason::MaxBytes,
            latency: Duration::from_micros(31_415),
            kind: DurableKind::Object,
        }
    }

    #[test]
    fn json_line_per_durable_file_has_every_fact() {
        let out = capture(LogFormat::Json, None, || {
            file_durable("projects/p/subscriptions/s", &sample_file())
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["message"], "file written");
        assert_eq!(v["subscription"], "projects/p/subscriptions/s");
        assert_eq!(v["name"], "events/2023-09-25T04:10:00+00:00_u.avro");
        assert_eq!(v["messages"], 42);
        assert_eq!(v["bytes"], 4096);
        assert_eq!(v["reason"], "max_bytes");
        assert_eq!(v["upload_seconds"], 0.031);
        assert_eq!(v["kind"], "object");
        assert!(v["timestamp"].is_string());
    }

    #[test]
    fn text_line_names_the_file() {
        let out = capture(LogFormat::Text, None, || {
            file_durable("projects/p/subscriptions/s", &sample_file())
        });
        assert!(out.contains(" INFO subsink::file: file written"), "{out}");
        assert!(
            out.contains("messages=42 bytes=4096 reason=\"max_bytes\""),
            "{out}"
        );
    }

    #[test]
    fn dependencies_stay_at_warn_unless_named() {
        let emit = || {
            tracing::info!(target: "object_store::aws", "put request");
            tracing::warn!(target: "object_store::aws", "put retried");
            tracing::info!(target: "deltalake_core::kernel", "commit");
            tracing::debug!(target: "subsink::app", "subsink debug");
            tracing::info!(target: "subsink::app", "subsink info");
        };
        let default = capture(LogFormat::Text, None, emit);
        assert!(!default.contains("put request"), "{default}");
        assert!(default.contains("put retried"), "{default}");
        assert!(!default.contains("commit"), "{default}");
        assert!(default.contains("subsink info"), "{default}");
        assert!(!default.contains("subsink debug"), "{default}");

        let debug = capture(LogFormat::Text, Some("debug"), emit);
        assert!(!debug.contains("put request"), "{debug}");
        assert!(!debug.contains("commit"), "{debug}");
        assert!(debug.contains("subsink debug"), "{debug}");

        let asked = capture(LogFormat::Text, Some("debug,object_store=info"), emit);
        assert!(asked.contains("put request"), "{asked}");
        assert!(!asked.contains("commit"), "{asked}");

        let quiet = capture(LogFormat::Text, Some("error"), emit);
        assert!(quiet.is_empty(), "{quiet}");
    }

    #[test]
    fn deltalakes_errors_for_a_handled_commit_are_left_out() {
        let emit = || {
            let t = "deltalake_core::kernel::transaction";
            tracing::error!(target: "deltalake_core::kernel::transaction", conflicts_checked = 1, error = "Metadata changed since last commit.", "conflict detected, aborting transaction");
            tracing::error!(target: "deltalake_core::kernel::transaction", max_retries = 15, "exceeded maximum commit attempts");
            tracing::error!(target: "deltalake_core::kernel::transaction", version = 7, error = "disk full", "commit failed, aborting");
            tracing::warn!(target: "deltalake_core::kernel::transaction", base_version = 1, "table updated during transaction, checking for conflicts");
            tracing::error!(target: "subsink::durable", "object x failed: {t}");
        };
        for (format, asked) in [
            (LogFormat::Text, None),
            (LogFormat::Json, None),
            (LogFormat::Text, Some("debug,deltalake_core=debug")),
        ] {
            let out = capture(format, asked, emit);
            assert!(!out.contains("conflict detected"), "{out}");
            assert!(!out.contains("exceeded maximum commit attempts"), "{out}");
            assert!(out.contains("commit failed, aborting"), "{out}");
            assert!(out.contains("checking for conflicts"), "{out}");
            assert!(out.contains("object x failed"), "{out}");
        }
    }

    #[test]
    fn directives_cap_only_verbose_globals() {
        assert_eq!(filter_directives(Some("error")), "error");
        assert_eq!(filter_directives(Some("subsink=debug")), "subsink=debug");
        let d = filter_directives(Some("info,object_store::aws=debug"));
        assert!(!d.contains(",object_store=warn"), "{d}");
        assert!(d.contains(",deltalake_core=warn"), "{d}");
    }
}

#[cfg(test)]
mod redact_tests {
    #[test]
    fn credentials_in_a_url_are_hidden() {
        use super::redact_url;
        assert_eq!(
            redact_url("nats://alice:hunter2@127.0.0.1:4222"),
            "nats://***@127.0.0.1:4222"
        );
        assert_eq!(redact_url("s3://bucket/a@b"), "s3://bucket/a@b");
        assert_eq!(redact_url("events.ndjson"), "events.ndjson");
    }
}
