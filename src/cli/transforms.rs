//! `subsink transforms test`: the counterpart of `gcloud pubsub message-transforms test` — run a
//! subscription's transforms on one message and say what became of it.

use std::path::PathBuf;

use clap::Args;

use crate::config;
use crate::message::{Message, WireDefaults};
use crate::transform::{Engine, Outcome, Udf};

/// `subsink transforms test --subscription FILE --message TEXT [--attribute K=V]`.
#[derive(Debug, Clone, Args)]
pub struct TransformsTestArgs {
    /// The subscription (REST JSON or YAML) whose `messageTransforms` run.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "message_transforms_file"
    )]
    pub subscription: Option<PathBuf>,
    /// Or a JSON/YAML list of transforms (as gcloud's `--message-transforms-file`); with
    /// --subscription, it replaces the subscription's list.
    #[arg(long, value_name = "FILE")]
    pub message_transforms_file: Option<PathBuf>,
    /// The message body, as text (as gcloud's `--message`). A text that is itself a PubsubMessage
    /// in REST JSON (`{"data": BASE64, "attributes": {…}, "messageId": …}`, only its fields: the
    /// file source's input format) is read as that message, unless --attribute is given.
    #[arg(long, value_name = "TEXT", required_unless_present = "attribute")]
    pub message: Option<String>,
    /// Attributes of the message, as gcloud's `--attribute`: `KEY=VALUE`, comma-separated or
    /// repeated (a value may be quoted: `k="v"`).
    #[arg(long, value_name = "KEY=VALUE", value_delimiter = ',')]
    pub attribute: Vec<String>,
}

/// What `transforms test` prints (one JSON object) and its exit code: 0 transformed or filtered,
/// 1 failed, 2 a config or message that cannot be used.
pub struct TestReport {
    pub json: serde_json::Value,
    pub code: u8,
}

impl TransformsTestArgs {
    /// The enabled UDFs, validated as `validate` validates them.
    pub fn udfs(&self) -> Result<Vec<Udf>, String> {
        let list = match (&self.message_transforms_file, &self.subscription) {
            (Some(f), _) => config::transforms::read_file(f)?,
            (None, Some(s)) => {
                config::resource::load(s)
                    .map_err(|e| e.to_string())?
                    .message_transforms
            }
            (None, None) => return Err("give --subscription or --message-transforms-file".into()),
        };
        let mut errors = Vec::new();
        let udfs = config::transforms::check(&list, &mut |f, r| errors.push(format!("{f}: {r}")));
        if !errors.is_empty() {
            return Err(errors.join("\n"));
        }
        Ok(udfs)
    }

    /// Run the transforms on `--message`.
    pub fn run(&self) -> TestReport {
        let udfs = match self.udfs() {
            Ok(u) => u,
            Err(e) => return bad(e),
        };
        let defaults = WireDefaults {
            publish_time_micros: None,
        };
        let (m, read_as) = match self.message(defaults) {
            Ok(m) => m,
            Err(e) => return bad(e),
        };
        let mut engine = match Engine::new(&udfs) {
            Ok(e) => e,
            Err(e) => return bad(e.to_string()),
        };
        let mut report = report(&udfs, engine.apply(&m));
        report.json["message_read_as"] = read_as.into();
        report
    }

    /// The message of `--message` and `--attribute`, and how `--message` was read: `text` (the
    /// body, as gcloud reads it) or `PubsubMessage JSON` (the REST form, without --attribute).
    fn message(&self, defaults: WireDefaults) -> Result<(Message, &'static str), String> {
        let text = self.message.as_deref().unwrap_or_default();
        if self.attribute.is_empty() && text.trim_start().starts_with('{') {
            if let Ok((m, _, _)) = Message::from_json_line(text.as_bytes(), defaults) {
                return Ok((m, "PubsubMessage JSON"));
            }
        }
        let mut m = Message {
            data: bytes::Bytes::copy_from_slice(text.as_bytes()),
            publish_time_micros: chrono::Utc::now().timestamp_micros(),
            ..Message::default()
        };
        for a in &self.attribute {
            let Some((k, v)) = a.split_once('=') else {
                return Err(format!("--attribute {a}: not KEY=VALUE"));
            };
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            m.attributes.insert(k.to_string(), v.to_string());
        }
        if m.data.is_empty() && m.attributes.is_empty() {
            return Err("--message is empty and no --attribute: Pub/Sub refuses a message with neither data nor attributes".into());
        }
        Ok((m, "text"))
    }
}

fn bad(error: String) -> TestReport {
    TestReport {
        json: serde_json::json!({"outcome": "invalid", "error": error}),
        code: 2,
    }
}

fn report(udfs: &[Udf], outcome: Outcome) -> TestReport {
    let names: Vec<&str> = udfs.iter().map(|u| u.function_name.as_str()).collect();
    match outcome {
        Outcome::Keep(m) => {
            let wire: serde_json::Value =
                serde_json::from_str(&m.to_json_line()).unwrap_or_default();
            TestReport {
                json: serde_json::json!({
                    "outcome": "transformed",
                    "transforms": names,
                    "text": String::from_utf8_lossy(&m.data),
                    "message": wire,
                }),
                code: 0,
            }
        }
        Outcome::Filtered { by } => TestReport {
            json: serde_json::json!({
                "outcome": "filtered",
                "transforms": names,
                "by": by,
                "reason": format!("{by} returned null: the message is acked and not written"),
            }),
            code: 0,
        },
        Outcome::Failed(e) => TestReport {
            json: serde_json::json!({
                "outcome": "failed",
                "transforms": names,
                "error": e.to_string(),
                "reason": "not written: redelivered, then dead-lettered with CloudPubSubDeadLetterSourceSMTErrorMessage",
            }),
            code: 1,
        },
    }
}
