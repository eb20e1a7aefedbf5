//! Why a subscription config cannot be used: the error that reading ([`super::resource`]) and
//! checking ([`mod@super::validate`]) a config both return.

/// One broken rule: the REST path of the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// REST path, e.g. `cloudStorageConfig.maxDuration`.
    pub field: String,
    /// The rule broken, with the offending value.
    pub rule: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

/// Why a subscription config could not be used. Never retryable: the config must be fixed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The config is not valid JSON/YAML, has an unknown field or a value of the wrong type.
    /// `line`/`column` are 1-based when the parser knows them.
    #[error("{}", parse_message(.path, .message, *.line, *.column))]
    Parse {
        path: String,
        message: String,
        line: Option<usize>,
        column: Option<usize>,
    },
    /// The config parsed but breaks rules; every violation, one per line as `field: rule`.
    #[error("{}", list_violations(.0))]
    Invalid(Vec<Violation>),
}

impl ConfigError {
    /// The violations of an [`ConfigError::Invalid`]; empty for other errors.
    pub fn violations(&self) -> &[Violation] {
        match self {
            ConfigError::Invalid(v) => v,
            _ => &[],
        }
    }
}

fn parse_message(path: &str, message: &str, line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("{path}:{l}:{c}: {message}"),
        (Some(l), None) => format!("{path}:{l}: {message}"),
        _ => format!("{path}: {message}"),
    }
}

fn list_violations(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(Violation::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}
