//! The push endpoint's authentication: OIDC tokens checked against a JWKS ([`Verifier`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;

use super::flags::{JwksSource, PushAuth, PushEndpointError};

/// Issuers of Google's OIDC tokens.
const GOOGLE_ISSUERS: [&str; 2] = ["https://accounts.google.com", "accounts.google.com"];

/// Checks OIDC tokens. The keys of a JWKS URL are fetched in the background, with retries, so
/// an unreachable key server does not stop the worker: until they are known, requests are
/// answered 503 (the pusher retries) and readiness says why. A JWKS file is read at startup.
pub(super) struct Verifier {
    auth: PushAuth,
    keys: tokio::sync::RwLock<Option<jsonwebtoken::jwk::JwkSet>>,
    /// Why the keys are not known yet (the last fetch's error).
    missing: Mutex<Option<String>>,
}

/// Why a request's token was not accepted.
pub(super) enum AuthError {
    /// No keys yet to check it with (503).
    NoKeys(String),
    /// The token is not acceptable (401); the reason names the rule, never the token.
    Refused(String),
}

impl From<String> for AuthError {
    fn from(s: String) -> AuthError {
        AuthError::Refused(s)
    }
}

impl From<&str> for AuthError {
    fn from(s: &str) -> AuthError {
        AuthError::Refused(s.to_string())
    }
}

/// The first retry of a failed key fetch, doubled up to [`KEYS_RETRY_MAX`].
const KEYS_RETRY_MIN: Duration = Duration::from_millis(500);
const KEYS_RETRY_MAX: Duration = Duration::from_secs(30);

#[derive(serde::Deserialize)]
struct Claims {
    #[serde(default)]
    email: Option<String>,
    #[serde(default)]
    email_verified: Option<bool>,
}

impl Verifier {
    /// A file's keys are read now (a bad file is an error); a URL's are fetched on a task of their
    /// own until they come.
    pub(super) async fn start(auth: PushAuth) -> Result<Arc<Verifier>, PushEndpointError> {
        if let JwksSource::File(_) = &auth.jwks {
            let keys = fetch_jwks(&auth.jwks).await?;
            return Ok(Arc::new(Verifier {
                auth,
                keys: tokio::sync::RwLock::new(Some(keys)),
                missing: Mutex::new(None),
            }));
        }
        let v = Arc::new(Verifier {
            missing: Mutex::new(Some(format!(
                "push JWKS {}: not fetched yet",
                auth.jwks.describe()
            ))),
            auth,
            keys: tokio::sync::RwLock::new(None),
        });
        let weak = Arc::downgrade(&v);
        tokio::spawn(async move {
            let mut wait = KEYS_RETRY_MIN;
            loop {
                let Some(v) = weak.upgrade() else { return };
                match fetch_jwks(&v.auth.jwks).await {
                    Ok(keys) => {
                        *v.keys.write().await = Some(keys);
                        *v.missing.lock().unwrap() = None;
                        tracing::info!(from = %v.auth.jwks.describe(), "push JWKS fetched");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?wait, "push JWKS: fetch failed; requests are answered 503 until it succeeds");
                        *v.missing.lock().unwrap() = Some(e.to_string());
                    }
                }
                drop(v);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(KEYS_RETRY_MAX);
            }
        });
        Ok(v)
    }

    /// Why requests cannot be checked now, if they cannot.
    pub(super) fn problem(&self) -> Option<String> {
        self.missing.lock().unwrap().clone()
    }

    /// Why the request's token is not acceptable, if it is not.
    pub(super) async fn check(&self, headers: &HeaderMap) -> Result<(), AuthError> {
        use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or("no `Authorization: Bearer` token")?;
        let header = decode_header(token).map_err(|e| format!("malformed token: {e}"))?;
        if header.alg != Algorithm::RS256 {
            return Err(format!("token algorithm {:?}, not RS256", header.alg).into());
        }
        let kid = header.kid.ok_or("token names no signing key (kid)")?;
        let known = self
            .keys
            .read()
            .await
            .as_ref()
            .map(|k| k.find(&kid).cloned());
        let mut jwk = match known {
            None => return Err(AuthError::NoKeys(self.problem().unwrap_or_default())),
            Some(k) => k,
        };
        if jwk.is_none() {
            // Google rotates its keys: refetch once for an unknown key id.
            if let Ok(fresh) = fetch_jwks(&self.auth.jwks).await {
                jwk = fresh.find(&kid).cloned();
                *self.keys.write().await = Some(fresh);
            }
        }
        let jwk = jwk.ok_or_else(|| format!("token signed by unknown key {kid:?}"))?;
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| format!("key {kid:?}: {e}"))?;
        let mut v = Validation::new(Algorithm::RS256);
        v.set_audience(&[&self.auth.audience]);
        v.set_issuer(&GOOGLE_ISSUERS);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = decode::<Claims>(token, &key, &v).map_err(|e| format!("token refused: {e}"))?;
        if !self.auth.allowed_emails.is_empty() {
            let c = data.claims;
            let ok = c.email_verified.unwrap_or(false)
                && c.email
                    .as_ref()
                    .is_some_and(|e| self.auth.allowed_emails.contains(e));
            if !ok {
                return Err(format!(
                    "token is for {:?}, not an allowed (verified) email",
                    c.email.unwrap_or_default()
                )
                .into());
            }
        }
        Ok(())
    }
}

async fn fetch_jwks(from: &JwksSource) -> Result<jsonwebtoken::jwk::JwkSet, PushEndpointError> {
    let err = |reason: String| PushEndpointError::Jwks {
        from: from.describe(),
        reason,
    };
    let bytes = match from {
        JwksSource::File(p) => std::fs::read(p).map_err(|e| err(e.to_string()))?,
        JwksSource::Url(u) => reqwest::get(u)
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| err(e.to_string()))?
            .bytes()
            .await
            .map_err(|e| err(e.to_string()))?
            .to_vec(),
    };
    serde_json::from_slice(&bytes).map_err(|e| err(format!("not a JWKS: {e}")))
}
