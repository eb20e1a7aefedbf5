//! The push endpoint's flags ([`PushArgs`]), the settings they make ([`PushSettings`]) and the
//! endpoint's errors.

use std::path::PathBuf;
use std::time::Duration;

use super::spool::{SpoolError, SpoolSettings};
use crate::config::ValidSubscription;

/// The push source's flags that do not go together (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum PushFlagsError {
    #[error("--source push needs --listen HOST:PORT")]
    NeedsListen,
    #[error("--source push: give --spool-dir DIR (its default, $XDG_STATE_HOME/subsink/spool/<subscription ID> or ~/.local/state/subsink/spool/<subscription ID>, needs XDG_STATE_HOME or HOME set to an absolute path), or --no-spool")]
    NeedsSpoolDir,
    #[error("--push-jwks and --push-allowed-email need --push-audience")]
    AuthNeedsAudience,
    #[error(
        "--source push: the file's maxDuration ({max_duration:?}) is longer than the \
         subscription's ackDeadlineSeconds ({deadline:?}): Pub/Sub would time out every push \
         request before its message is durable; lower maxDuration or raise ackDeadlineSeconds"
    )]
    SlowerThanDeadline {
        max_duration: std::time::Duration,
        deadline: std::time::Duration,
    },
    /// `--no-spool` with `--dead-letter`: Pub/Sub dead-letters what fails.
    #[error("--dead-letter is for the file source; Pub/Sub dead-letters to the subscription's deadLetterPolicy topic")]
    DeadLetterWithoutSpool,
}

/// Google's OIDC signing keys (the default `--push-jwks`).
pub const GOOGLE_JWKS: &str = "https://www.googleapis.com/oauth2/v3/certs";

/// Errors starting the push endpoint.
#[derive(Debug, thiserror::Error)]
pub enum PushEndpointError {
    #[error("push endpoint: cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("push JWKS {from}: {reason}")]
    Jwks { from: String, reason: String },
    #[error(transparent)]
    Spool(#[from] SpoolError),
}

/// Where the token-checking keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    Url(String),
    File(PathBuf),
}

impl JwksSource {
    /// `http(s)://…` is a URL, anything else a file.
    pub fn parse(s: &str) -> JwksSource {
        if s.starts_with("https://") || s.starts_with("http://") {
            JwksSource::Url(s.to_string())
        } else {
            JwksSource::File(PathBuf::from(s))
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            JwksSource::Url(u) => u.clone(),
            JwksSource::File(p) => p.display().to_string(),
        }
    }
}

/// Push authentication: `None` = requests are not checked (the emulator sends no tokens).
#[derive(Debug, Clone)]
pub struct PushAuth {
    pub audience: String,
    pub jwks: JwksSource,
    /// Service-account emails a token may be for; empty = any.
    pub allowed_emails: Vec<String>,
}

/// The push endpoint's settings.
#[derive(Debug, Clone)]
pub struct PushSettings {
    pub listen: String,
    /// How requests carry their message (the subscription's `pushConfig.noWrapper`).
    pub wrapping: Wrapping,
    pub auth: Option<PushAuth>,
    /// How long a request waits for its message to be settled (or, with a spool, fsynced) before
    /// it is answered 503.
    pub answer_within: Duration,
    /// `Some`: a request is answered once its message is in the local spool and fsynced
    /// (`--spool-dir`, the default); `None` (`--no-spool`): once the file holding it is durable.
    pub spool: Option<SpoolSpec>,
}

/// How a push request carries its message: the subscription's `pushConfig` says, never the
/// request (docs/sources.md, "Requests"). A request that does not have the configured form is
/// answered 400 and nothing of it is spooled or written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Wrapping {
    /// Pub/Sub's default (`pubsubWrapper`, or no `noWrapper`): the body is the JSON envelope
    /// `{"message": {…, "messageId": …}, "subscription": …}`.
    #[default]
    Wrapped,
    /// `noWrapper`: the body is the payload, whatever its content type. With `writeMetadata` the
    /// message id, publish time and ordering key come as `x-goog-pubsub-*` headers and each
    /// attribute as a header; without it nothing but the payload comes, and the message gets a
    /// random UUID (v4) as its id when it is received.
    Unwrapped { write_metadata: bool },
}

impl Wrapping {
    /// The form the subscription's `pushConfig` gives (wrapped when it has none).
    pub fn of(sub: &crate::config::resource::Subscription) -> Wrapping {
        match sub.push_config.as_ref().and_then(|p| p.no_wrapper.as_ref()) {
            Some(w) => Wrapping::Unwrapped {
                write_metadata: w.write_metadata,
            },
            None => Wrapping::Wrapped,
        }
    }
}

/// The spool of a push endpoint and where what fails after the 2xx goes.
#[derive(Debug, Clone)]
pub struct SpoolSpec {
    pub settings: SpoolSettings,
    /// `--dead-letter`, else `dead-letter.ndjson` in the spool's folder.
    pub dead_letter: PathBuf,
}

/// The push endpoint's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = crate::cli::heading::PUSH)]
pub struct PushArgs {
    /// `--source push`: the address the push endpoint listens on (e.g. 127.0.0.1:8080).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// `--source push`: require an OIDC token for this audience on every request (else 401).
    #[arg(long, value_name = "AUDIENCE")]
    pub push_audience: Option<String>,
    /// `--source push`: the keys tokens are checked against, a JWKS URL or file (default Google's).
    #[arg(long, value_name = "URL|FILE")]
    pub push_jwks: Option<String>,
    /// `--source push`: a service-account email tokens may be for (repeatable; default any).
    #[arg(long, value_name = "EMAIL")]
    pub push_allowed_email: Vec<String>,
    /// `--source push`: the local spool. A request is answered 2xx once its message is appended
    /// here and fsynced; the export reads it as it grows. Default
    /// $XDG_STATE_HOME/subsink/spool/<subscription ID>, else
    /// ~/.local/state/subsink/spool/<subscription ID>; put it on a persistent volume.
    #[arg(long, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    /// `--source push`: no spool: a request is answered only once the file holding its message
    /// is durable (maxDuration must then be at most ackDeadlineSeconds).
    #[arg(long, conflicts_with_all = ["spool_dir", "spool_max_bytes"])]
    pub no_spool: bool,
    /// `--source push`: bytes the spool may hold on disk; past it requests are answered 429 (the
    /// pusher backs off) until the export catches up.
    #[arg(long, value_name = "SIZE", value_parser = crate::cli::values::size)]
    pub spool_max_bytes: Option<u64>,
    /// `--source push`: a spool segment is sealed at this size (and deleted once every message in
    /// it is durable in the destination).
    #[arg(long, default_value = "64MiB", value_name = "SIZE", value_parser = crate::cli::values::size)]
    pub spool_segment_bytes: u64,
}

/// `--spool-max-bytes` by default: 1 GiB.
pub const DEFAULT_SPOOL_MAX_BYTES: u64 = 1 << 30;

/// The default `--spool-dir` of subscription `id`: `$XDG_STATE_HOME/subsink/spool/<id>`, else
/// `$HOME/.local/state/subsink/spool/<id>` — state of this user's, outside any working directory
/// (a spool inside a checkout is one `git clean` from lost 2xx messages). `None` when neither
/// variable holds an absolute path (as the XDG rules read them): the flag is needed then.
pub fn default_spool_dir(
    id: &str,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let absolute = |k: &str| env(k).map(PathBuf::from).filter(|p| p.is_absolute());
    let state = absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|h| h.join(".local").join("state")))?;
    Some(state.join("subsink").join("spool").join(id))
}

impl PushArgs {
    /// The endpoint's settings for `sub`; `dead_letter`: `--dead-letter` (with a spool, where
    /// messages that fail after their 2xx go). Without a spool a message is answered once its
    /// file is durable — at most `maxDuration` later — and Pub/Sub waits for an answer up to the
    /// ack deadline: a longer `maxDuration` would time out every request, so it is refused here.
    /// With a spool the answer waits for an fsync only, and the rule does not apply.
    pub fn settings(
        &self,
        sub: &ValidSubscription,
        dead_letter: Option<&PathBuf>,
    ) -> Result<PushSettings, PushFlagsError> {
        let deadline = sub.delivery.ack_deadline;
        let max_duration = match (&sub.storage, &sub.bigquery) {
            (Some(s), _) => s.max_duration,
            (None, Some(b)) => b.max_duration,
            (None, None) => deadline,
        };
        if self.no_spool && max_duration > deadline {
            return Err(PushFlagsError::SlowerThanDeadline {
                max_duration,
                deadline,
            });
        }
        if self.no_spool && dead_letter.is_some() {
            return Err(PushFlagsError::DeadLetterWithoutSpool);
        }
        let listen = self.listen.clone().ok_or(PushFlagsError::NeedsListen)?;
        let auth = match &self.push_audience {
            Some(aud) => Some(PushAuth {
                audience: aud.clone(),
                jwks: JwksSource::parse(self.push_jwks.as_deref().unwrap_or(GOOGLE_JWKS)),
                allowed_emails: self.push_allowed_email.clone(),
            }),
            None if self.push_jwks.is_some() || !self.push_allowed_email.is_empty() => {
                return Err(PushFlagsError::AuthNeedsAudience)
            }
            None => None,
        };
        let spool = match self.no_spool {
            true => None,
            false => {
                let id = sub.name.rsplit('/').next().unwrap_or(&sub.name);
                let dir = match &self.spool_dir {
                    Some(d) => d.clone(),
                    None => default_spool_dir(id, |k| std::env::var_os(k))
                        .ok_or(PushFlagsError::NeedsSpoolDir)?,
                };
                Some(dir)
            }
        };
        let spool = spool.map(|dir| SpoolSpec {
            dead_letter: dead_letter
                .cloned()
                .unwrap_or_else(|| dir.join("dead-letter.ndjson")),
            settings: SpoolSettings {
                dir,
                max_bytes: self.spool_max_bytes.unwrap_or(DEFAULT_SPOOL_MAX_BYTES),
                segment_bytes: self.spool_segment_bytes,
            },
        });
        Ok(PushSettings {
            listen,
            wrapping: Wrapping::of(&sub.resource),
            auth,
            answer_within: deadline,
            spool,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_spool_dir_is_state_outside_the_working_directory() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert_eq!(
            default_spool_dir("s", env(&[("XDG_STATE_HOME", "/st"), ("HOME", "/h")])),
            Some(PathBuf::from("/st/subsink/spool/s"))
        );
        assert_eq!(
            default_spool_dir("s", env(&[("XDG_STATE_HOME", "rel"), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.local/state/subsink/spool/s"))
        );
        assert_eq!(default_spool_dir("s", env(&[("HOME", "")])), None);
        assert_eq!(default_spool_dir("s", env(&[])), None);
    }
}
