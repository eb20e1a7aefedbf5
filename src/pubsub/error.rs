//! A failed Pub/Sub call, and whether trying it again may succeed.

/// A failed Pub/Sub call. [`PubsubError::retryable`] says whether the same call may succeed later;
/// it is decided where the error is made, from the gRPC status code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PubsubError {
    /// The server (or the transport) answered with a gRPC status.
    #[error("Pub/Sub {method} failed: {code:?}: {message}")]
    Status {
        method: &'static str,
        code: tonic::Code,
        message: String,
        retryable: bool,
    },
    /// Credentials could not be loaded (not retryable) or a token not obtained (retryable).
    #[error("Google credentials: {message}")]
    Auth { message: String, retryable: bool },
    /// A bad endpoint, name or setting: fix the configuration.
    #[error("Pub/Sub client setup: {0}")]
    Config(String),
    /// The server answered something the API does not allow.
    #[error("Pub/Sub {method}: unexpected response: {message}")]
    Protocol {
        method: &'static str,
        message: String,
    },
}

/// Whether a call that failed with `code` may succeed if tried again (the codes Google's client
/// libraries retry).
pub fn retryable_code(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Unavailable | DeadlineExceeded | Internal | ResourceExhausted | Aborted
    )
}

impl PubsubError {
    pub(crate) fn status(method: &'static str, status: tonic::Status) -> PubsubError {
        // tonic reports a broken connection as a status it makes itself, carrying the hyper/io
        // error as its source: `Unknown` ("error reading a body from connection") when a stream
        // breaks, `Cancelled` ("operation was canceled") when the connection closes before the
        // response. A status the server sent has no source. The former are transport failures,
        // as retryable as `Unavailable`.
        let transport = matches!(status.code(), tonic::Code::Unknown | tonic::Code::Cancelled)
            && std::error::Error::source(&status).is_some();
        let message = if transport {
            format!("connection failed: {}", status.message())
        } else {
            status.message().to_string()
        };
        PubsubError::Status {
            method,
            code: status.code(),
            message,
            retryable: transport || retryable_code(status.code()),
        }
    }

    /// Whether trying the same call again may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            PubsubError::Status { retryable, .. } | PubsubError::Auth { retryable, .. } => {
                *retryable
            }
            PubsubError::Config(_) | PubsubError::Protocol { .. } => false,
        }
    }

    /// The gRPC status code, when the error is one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            PubsubError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_follows_the_status_code() {
        let e = |code| PubsubError::status("X", tonic::Status::new(code, "m"));
        for code in [
            tonic::Code::Unavailable,
            tonic::Code::DeadlineExceeded,
            tonic::Code::Internal,
            tonic::Code::ResourceExhausted,
            tonic::Code::Aborted,
        ] {
            assert!(e(code).retryable(), "{code:?}");
        }
        for code in [
            tonic::Code::NotFound,
            tonic::Code::PermissionDenied,
            tonic::Code::InvalidArgument,
            tonic::Code::Unauthenticated,
        ] {
            assert!(!e(code).retryable(), "{code:?}");
        }
        assert!(!PubsubError::Config("x".into()).retryable());
        // Unknown as sent by a server: not retryable; as made by tonic from a broken connection
        // (it carries the io error as its source): retryable.
        assert!(!e(tonic::Code::Unknown).retryable());
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let broken = tonic::Status::from_error(Box::new(io));
        assert_eq!(broken.code(), tonic::Code::Unknown);
        assert!(PubsubError::status("X", broken).retryable());
        assert!(!e(tonic::Code::Cancelled).retryable());
    }
}
