//! `subsink transforms test`: the counterpart of `gcloud pubsub message-transforms test` — run a
//! subscription's transforms on one message and say what became of it.

use std::path::PathBuf;

use clap::Args;

use crate::config;
use crate::message::{Message, WireDefaults};
use crate::transform::{Engine, Outcome, Udf};

/// `subsink transforms test --subscription FILE --message JSON`.
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
    /// The message: a PubsubMessage in REST JSON (`{"data": BASE64, "attributes": {…},
    /// "messageId": …, "publishTime": …, "orderingKey": …}`), the input format of the file source.
    #[arg(long, value_name = "JSON")]
    pub message: String,
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
        let m = match Message::from_json_line(self.message.as_bytes(), defaults) {
            Ok((m, _, _)) => m,
            Err(e) => return bad(format!("--message: {e}")),
        };
        let mut engine = match Engine::new(&udfs) {
            Ok(e) => e,
            Err(e) => return bad(e.to_string()),
        };
        report(&udfs, engine.apply(&m))
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
