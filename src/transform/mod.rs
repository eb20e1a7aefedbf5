//! Single Message Transforms (docs/transforms.md): a subscription's JavaScript UDFs
//! (`messageTransforms[].javascriptUdf`), run as Pub/Sub runs them, on QuickJS.
//!
//! * [`Udf`]: one enabled transform (disabled ones never get here); [`check`] compiles one and
//!   says whether it defines its function, with the line and column of a syntax error.
//! * [`Engine`] (`engine.rs`): one QuickJS runtime with every UDF of a subscription, each in a
//!   context of its own; [`Engine::apply`] runs them in order on one message, each call bounded
//!   in time ([`CALL_TIME_LIMIT`], an interrupt handler) and the runtime in memory
//!   ([`MEMORY_LIMIT`]). An engine is not `Send`: it lives on the thread that built it.
//! * [`Transforms`] (`pool.rs`): one engine per worker thread, as many threads as cores; a batch
//!   is cut into contiguous runs, one per thread, and the outcomes come back in the batch's order,
//!   so the messages of an ordering key keep their order whatever thread ran them.
//!
//! The module knows messages and nothing of sources, sinks or settling: the pipeline
//! (`app.rs`) settles a [`Outcome::Filtered`] message as filtered and a [`Outcome::Failed`] one
//! as a message that fails alone.

mod engine;
mod pool;

pub use engine::Engine;
pub use pool::Transforms;

use std::time::Duration;

use crate::message::Message;

/// Most transforms on one subscription (Pub/Sub: 5 SMTs per resource).
pub const MAX_TRANSFORMS: usize = 5;
/// Largest `javascriptUdf.code`, in bytes of UTF-8.
pub const MAX_CODE_BYTES: usize = 20 * 1024;
/// Longest one UDF call may run before the message fails.
pub const CALL_TIME_LIMIT: Duration = Duration::from_millis(500);
/// Memory of one engine (one worker thread: every UDF of the subscription, its globals and the
/// message being transformed); past it the call fails with "out of memory".
pub const MEMORY_LIMIT: usize = 64 << 20;
/// The JavaScript stack of one call (deep recursion fails the message with a RangeError).
pub const STACK_LIMIT: usize = 512 << 10;

/// The attribute a dead-lettered message carries when a transform failed it, with the reason
/// (Pub/Sub's SMT troubleshooting page), in place of `CloudPubSubDeadLetterSourceDeliveryErrorMessage`.
pub const DEAD_LETTER_ATTRIBUTE: &str = "CloudPubSubDeadLetterSourceSMTErrorMessage";

/// Every [`TransformError`] reads `message transform …`: the dead-letter side tells an SMT error
/// from a delivery error by it ([`is_transform_error`]).
const ERROR_PREFIX: &str = "message transform ";

/// One enabled JavaScript UDF: `function <function_name>(message, metadata)` defined in `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Udf {
    pub function_name: String,
    pub code: String,
}

/// What the transforms made of one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Transformed (or unchanged): write this message.
    Keep(Message),
    /// A UDF returned `null`: the message is settled as filtered and never written.
    Filtered {
        /// The function that filtered it.
        by: String,
    },
    /// A UDF threw, returned a value of the wrong shape, or ran past a limit: the message is not
    /// written; it fails alone (redelivered, then dead-lettered).
    Failed(TransformError),
}

/// Why a transform failed a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    /// The payload is not UTF-8 and `message.data` is a string (docs/transforms.md).
    #[error("message transform {function}: the payload is not UTF-8 text ({reason}); a UDF takes message.data as a string")]
    NotUtf8 { function: String, reason: String },
    /// The UDF threw (or a limit stopped it: time, memory, stack).
    #[error("message transform {function}: {reason}")]
    Threw { function: String, reason: String },
    /// It returned something that is neither `null` nor `{data: string, attributes?: {string: string}}`.
    #[error("message transform {function}: wrong return value: {reason}")]
    Shape { function: String, reason: String },
    /// The engine could not be built (out of memory at start, a UDF that no longer compiles).
    #[error("message transform engine: {0}")]
    Engine(String),
}

/// Is `error` (a failed message's reason, as text) a transform's? The dead-letter message then
/// carries it as [`DEAD_LETTER_ATTRIBUTE`].
pub fn is_transform_error(error: &str) -> bool {
    error.starts_with(ERROR_PREFIX)
}

/// Why a UDF cannot be used (`validate`, startup).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The code does not parse; `line`/`column` 1-based, within `code`.
    #[error("{}", syntax_message(.message, *.line, *.column))]
    Syntax {
        message: String,
        line: Option<u32>,
        column: Option<u32>,
    },
    /// The code ran (its top level) but threw.
    #[error("the code throws when it is loaded: {0}")]
    Throws(String),
    /// The code does not define `function_name` as a function.
    #[error("the code defines no function named {0:?}")]
    NoFunction(String),
}

fn syntax_message(message: &str, line: Option<u32>, column: Option<u32>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("syntax error at line {l}, column {c}: {message}"),
        (Some(l), None) => format!("syntax error at line {l}: {message}"),
        _ => format!("syntax error: {message}"),
    }
}

/// Compile `udf` alone in a fresh engine: does it parse, load, and define its function?
pub fn check(udf: &Udf) -> Result<(), CheckError> {
    Engine::check(udf)
}

/// Is `name` a JavaScript identifier a function declaration can have (ASCII letters, digits,
/// `_` and `$`, not starting with a digit; Unicode identifiers are accepted too, reserved words
/// are not)?
pub fn valid_function_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    let start = |c: char| c == '_' || c == '$' || c.is_alphabetic();
    let part = |c: char| start(c) || c.is_alphanumeric() || c == '\u{200c}' || c == '\u{200d}';
    start(first) && chars.all(part) && !RESERVED.contains(&name)
}

const RESERVED: &[&str] = &[
    "await",
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "enum",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "implements",
    "import",
    "in",
    "instanceof",
    "interface",
    "let",
    "new",
    "null",
    "package",
    "private",
    "protected",
    "public",
    "return",
    "static",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "yield",
];

#[cfg(test)]
mod tests;
