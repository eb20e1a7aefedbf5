//! Google credentials: where a process finds them, the access tokens they are exchanged for, and
//! when a token is renewed. One chain for every Google client of the process — Pub/Sub
//! ([`crate::pubsub`], gRPC metadata), BigQuery ([`crate::sink::bigquery`], REST and gRPC) and
//! Cloud Storage ([`crate::upload`], handed to object_store as its credential provider) — so one
//! token serves them all.
//!
//! ## Where credentials come from (the first that is set wins)
//! 1. `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_SERVICE_ACCOUNT_PATH` / `SERVICE_ACCOUNT` (a service-account
//!    key file) or `GOOGLE_SERVICE_ACCOUNT_KEY` (the key's JSON itself) — the variables object_store
//!    reads for Cloud Storage;
//! 2. the file `GOOGLE_APPLICATION_CREDENTIALS` names (a service-account key or an
//!    `authorized_user` file);
//! 3. gcloud's well-known file (`$CLOUDSDK_CONFIG/application_default_credentials.json`, by default
//!    `~/.config/gcloud/application_default_credentials.json`, which
//!    `gcloud auth application-default login` writes);
//! 4. the metadata server (GCE, GKE workload identity, Cloud Run): `GCE_METADATA_HOST` (or
//!    `GCE_METADATA_ROOT`, default `metadata.google.internal`), then `GCE_METADATA_IP` (default
//!    `169.254.169.254`).
//!
//! A service-account key is exchanged for an access token at the key's `token_uri` (OAuth 2.0 JWT
//! bearer grant: an RS256 assertion with `iss` the account, `scope` cloud-platform, `aud` the
//! `token_uri`, valid one hour). An `authorized_user` file's refresh token is exchanged at its
//! `token_uri` (Google's when absent). The metadata server is asked for the instance account's
//! token. So every token endpoint can be a local server (tests/credentials.rs).
//! External-account (workload identity federation) and impersonation files are refused with a
//! message saying so.
//!
//! ## Renewal
//! A token is used until 4 minutes before it expires (a token that lives less than 8 minutes: until
//! half its life), then renewed before the next call; calls made meanwhile wait for the one
//! renewal (one attempt of at most 10 s while the old token is still valid). If renewal fails
//! transiently while the old token is still valid, the old one is used and renewal is tried again
//! 5 s later.
//! A refused grant (HTTP 400/401/403 from the token endpoint) is not retryable: the run fails.
//!
//! ## Which endpoints get credentials
//! Google endpoints (`https://`) always. Plaintext endpoints (`http://`: the Pub/Sub and BigQuery
//! emulators) get none, unless `SUBSINK_GOOGLE_AUTH=always` ([`AUTH_MODE_ENV`]), which sends them
//! to every endpoint — for a recording proxy or a gateway in front of an emulator. Cloud Storage
//! (object_store) always sends them.
//!
//! Secrets — the private key, the client secret, the refresh token and access tokens — appear in no
//! `Debug` output, log line or error message; errors name the source and the endpoint only.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use serde_json::Value;

/// The scope every token is asked for.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Google's token endpoint, for an `authorized_user` file or a key without `token_uri`.
pub const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// `always`: send credentials to plaintext (`http://`) endpoints too; `auto` (the default): to
/// `https://` endpoints only.
pub const AUTH_MODE_ENV: &str = "SUBSINK_GOOGLE_AUTH";

/// Lifetime asked of a service-account assertion (Google's maximum).
const ASSERTION_LIFETIME: Duration = Duration::from_secs(3600);
/// A token is renewed this long before it expires …
const RENEW_BEFORE: Duration = Duration::from_secs(240);
/// Deadline of one token request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Tries of a token request that fails transiently, within one [`GoogleAuth::token`] call.
const TRIES: u32 = 3;
/// A renewal while the current token is still valid: one attempt of at most this long …
const RENEWAL_TIMEOUT: Duration = Duration::from_secs(10);
/// … and after a failed one, the current token is used this long before the next attempt.
const RENEWAL_RETRY: Duration = Duration::from_secs(5);

/// Credentials could not be loaded or a token not obtained.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A setting or a credential file is wrong: fix the configuration.
    #[error("{0}")]
    Config(String),
    /// The token endpoint refused the grant (a revoked key, a wrong secret, an expired refresh
    /// token): not retryable.
    #[error("{source_name}: the token endpoint {endpoint} refused the grant: {reason}")]
    Refused {
        source_name: String,
        endpoint: String,
        reason: String,
    },
    /// The token endpoint or the metadata server could not be reached or failed: retryable.
    #[error("{source_name}: no token from {endpoint}: {reason}")]
    Unavailable {
        source_name: String,
        endpoint: String,
        reason: String,
    },
}

impl AuthError {
    /// Whether asking again later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, AuthError::Unavailable { .. })
    }
}

/// Whether plaintext endpoints get credentials ([`AUTH_MODE_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// `https://` endpoints only (the default).
    Auto,
    /// Every endpoint.
    Always,
}

impl AuthMode {
    /// [`AUTH_MODE_ENV`] from the environment (unset or empty: `auto`).
    pub fn from_env() -> Result<AuthMode, AuthError> {
        match std::env::var(AUTH_MODE_ENV) {
            Err(_) => Ok(AuthMode::Auto),
            Ok(v) => match v.trim() {
                "" | "auto" => Ok(AuthMode::Auto),
                "always" => Ok(AuthMode::Always),
                other => Err(AuthError::Config(format!(
                    "{AUTH_MODE_ENV}={other:?}: expected `auto` or `always`"
                ))),
            },
        }
    }

    /// Whether an endpoint `url` gets credentials.
    pub fn sends_to(self, url: &str) -> bool {
        self == AuthMode::Always || url.starts_with("https://")
    }
}

/// An access token. Its `Debug` shows no secret.
#[derive(Clone)]
pub struct AccessToken(Arc<str>);

impl AccessToken {
    /// The token itself, for a request header.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// `Bearer <token>`: the value of an `Authorization` header.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AccessToken(<{} bytes, redacted>)", self.0.len())
    }
}

/// A string that is never printed.
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A service-account key.
struct ServiceAccount {
    client_email: String,
    private_key_id: String,
    key: RsaKeyPair,
    token_uri: String,
}

/// An `authorized_user` file (gcloud's application-default login).
#[derive(Debug)]
struct AuthorizedUser {
    client_id: String,
    client_secret: Secret,
    refresh_token: Secret,
    token_uri: String,
}

/// Where tokens come from.
enum Kind {
    ServiceAccount(Box<ServiceAccount>),
    AuthorizedUser(AuthorizedUser),
    /// The metadata server: the hosts tried in order.
    Metadata(Vec<String>),
    /// A key with `"disable_oauth": true` (object_store's convention for fake Cloud Storage
    /// servers): no token, no `Authorization` header.
    NoOAuth,
}

/// A token and when to renew it.
struct Cached {
    token: AccessToken,
    renew_at: Instant,
    expires_at: Instant,
}

/// Google credentials from one source, and the token they last gave.
pub struct GoogleAuth {
    kind: Kind,
    /// Which source, for messages: `service account a@p.iam… (GOOGLE_APPLICATION_CREDENTIALS /k.json)`.
    name: String,
    http: reqwest::Client,
    cached: tokio::sync::Mutex<Option<Cached>>,
}

impl std::fmt::Debug for GoogleAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoogleAuth")
            .field("source", &self.name)
            .field("endpoint", &self.endpoint())
            .finish_non_exhaustive()
    }
}

impl GoogleAuth {
    /// The process's credentials, found once ([`GoogleAuth::from_env`]) and shared by every client,
    /// so that one token serves Pub/Sub, BigQuery and Cloud Storage.
    pub fn shared() -> Result<Arc<GoogleAuth>, AuthError> {
        static SHARED: OnceLock<Arc<GoogleAuth>> = OnceLock::new();
        if let Some(a) = SHARED.get() {
            return Ok(a.clone());
        }
        let auth = Arc::new(Self::from_env()?);
        tracing::info!(source = %auth.name, "Google credentials");
        Ok(SHARED.get_or_init(|| auth).clone())
    }

    /// Credentials from the environment, in the order of the module's documentation. Reads files
    /// but does not touch the network: a missing metadata server shows up at the first token.
    pub fn from_env() -> Result<GoogleAuth, AuthError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let path = [
            "GOOGLE_SERVICE_ACCOUNT",
            "GOOGLE_SERVICE_ACCOUNT_PATH",
            "SERVICE_ACCOUNT",
        ]
        .into_iter()
        .find_map(|k| var(k).map(|v| (k, v)));
        let inline = var("GOOGLE_SERVICE_ACCOUNT_KEY");
        let (kind, name) = match (path, inline) {
            (Some((k, _)), Some(_)) => {
                return Err(AuthError::Config(format!(
                    "both {k} and GOOGLE_SERVICE_ACCOUNT_KEY are set: give one"
                )))
            }
            (Some((k, p)), None) => {
                let origin = format!("{k} {p}");
                let v = read_json(Path::new(&p), &origin)?;
                service_account(&v, &origin)?
            }
            (None, Some(json)) => {
                let origin = "GOOGLE_SERVICE_ACCOUNT_KEY".to_string();
                let v = parse_json(json.as_bytes(), &origin)?;
                service_account(&v, &origin)?
            }
            (None, None) => {
                if let Some(p) = var("GOOGLE_APPLICATION_CREDENTIALS") {
                    let origin = format!("GOOGLE_APPLICATION_CREDENTIALS {p}");
                    credentials_file(&read_json(Path::new(&p), &origin)?, &origin)?
                } else if let Some(p) = well_known_file().filter(|p| p.exists()) {
                    let origin = format!("gcloud's file {}", p.display());
                    credentials_file(&read_json(&p, &origin)?, &origin)?
                } else {
                    let host = var("GCE_METADATA_HOST")
                        .or_else(|| var("GCE_METADATA_ROOT"))
                        .unwrap_or_else(|| "metadata.google.internal".into());
                    let ip = var("GCE_METADATA_IP").unwrap_or_else(|| "169.254.169.254".into());
                    let mut hosts = vec![host];
                    if !hosts.contains(&ip) {
                        hosts.push(ip);
                    }
                    let name = format!("the metadata server ({})", hosts.join(", then "));
                    (Kind::Metadata(hosts), name)
                }
            }
        };
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("subsink/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| AuthError::Config(format!("HTTP client for Google credentials: {e}")))?;
        Ok(GoogleAuth {
            kind,
            name,
            http,
            cached: tokio::sync::Mutex::new(None),
        })
    }

    /// Which source the credentials come from (no secret), for logs.
    pub fn source_name(&self) -> &str {
        &self.name
    }

    /// Whether requests carry no token at all (a key with `"disable_oauth": true`).
    pub fn is_disabled(&self) -> bool {
        matches!(self.kind, Kind::NoOAuth)
    }

    /// A valid access token: the cached one until it is due for renewal, else a new one.
    pub async fn token(&self) -> Result<AccessToken, AuthError> {
        let mut cached = self.cached.lock().await;
        let now = Instant::now();
        if let Some(c) = cached.as_ref() {
            if now < c.renew_at {
                return Ok(c.token.clone());
            }
        }
        // While the current token is still valid, a renewal is one attempt of at most
        // RENEWAL_TIMEOUT: calls wait for it, so a hanging token endpoint must not hold them
        // long when the old token would do.
        let still_valid = cached.as_ref().is_some_and(|c| now < c.expires_at);
        let fetched = if still_valid {
            match tokio::time::timeout(RENEWAL_TIMEOUT, self.fetch_once()).await {
                Ok(r) => r,
                Err(_) => Err(AuthError::Unavailable {
                    source_name: self.name.clone(),
                    endpoint: self.endpoint(),
                    reason: format!("no answer within {RENEWAL_TIMEOUT:?}"),
                }),
            }
        } else {
            self.fetch().await
        };
        match fetched {
            Ok((token, lifetime)) => {
                let now = Instant::now();
                let renew_before = RENEW_BEFORE.min(lifetime / 2);
                *cached = Some(Cached {
                    token: token.clone(),
                    renew_at: now + lifetime - renew_before,
                    expires_at: now + lifetime,
                });
                tracing::debug!(
                    source = %self.name,
                    lifetime_s = lifetime.as_secs(),
                    "Google access token obtained"
                );
                Ok(token)
            }
            Err(e) => match cached.as_mut() {
                // Renewal failed for now and the old token still works: use it, and try again
                // after RENEWAL_RETRY (or when it expires), not on every call meanwhile.
                Some(c) if e.retryable() && Instant::now() < c.expires_at => {
                    tracing::warn!(source = %self.name, error = %e, "Google token renewal failed; the current token is still valid");
                    c.renew_at = (Instant::now() + RENEWAL_RETRY).min(c.expires_at);
                    Ok(c.token.clone())
                }
                _ => Err(e),
            },
        }
    }

    /// Where tokens are asked for (no secret), for messages.
    fn endpoint(&self) -> String {
        match &self.kind {
            Kind::ServiceAccount(sa) => sa.token_uri.clone(),
            Kind::AuthorizedUser(u) => u.token_uri.clone(),
            Kind::Metadata(hosts) => hosts.join(", "),
            Kind::NoOAuth => String::new(),
        }
    }

    /// `Bearer <token>`, or `None` when OAuth is disabled.
    pub async fn authorization(&self) -> Result<Option<String>, AuthError> {
        if self.is_disabled() {
            return Ok(None);
        }
        Ok(Some(self.token().await?.bearer()))
    }

    /// A new token and its lifetime, trying a transient failure up to [`TRIES`] times.
    async fn fetch(&self) -> Result<(AccessToken, Duration), AuthError> {
        let mut delay = Duration::from_millis(250);
        let mut attempt = 1;
        loop {
            match self.fetch_once().await {
                Err(e) if e.retryable() && attempt < TRIES => {
                    tracing::debug!(source = %self.name, error = %e, attempt, "Google token request failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 4;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn fetch_once(&self) -> Result<(AccessToken, Duration), AuthError> {
        match &self.kind {
            Kind::ServiceAccount(sa) => {
                let assertion = sa.assertion(&self.name)?;
                let form = [
                    ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                    ("assertion", assertion.as_str()),
                ];
                let req = self.http.post(&sa.token_uri).form(&form);
                self.exchange(req, &sa.token_uri).await
            }
            Kind::AuthorizedUser(u) => {
                let form = [
                    ("grant_type", "refresh_token"),
                    ("client_id", u.client_id.as_str()),
                    ("client_secret", u.client_secret.0.as_str()),
                    ("refresh_token", u.refresh_token.0.as_str()),
                ];
                let req = self.http.post(&u.token_uri).form(&form);
                self.exchange(req, &u.token_uri).await
            }
            Kind::Metadata(hosts) => {
                let mut last = None;
                for host in hosts {
                    let url = format!(
                        "http://{host}/computeMetadata/v1/instance/service-accounts/default/token"
                    );
                    let req = self
                        .http
                        .get(&url)
                        .query(&[("scopes", SCOPE)])
                        .header("Metadata-Flavor", "Google");
                    match self.exchange(req, &url).await {
                        Err(e) if e.retryable() => last = Some(e),
                        other => return other,
                    }
                }
                Err(last.unwrap_or_else(|| AuthError::Config("no metadata host".into())))
            }
            Kind::NoOAuth => Ok((AccessToken(Arc::from("")), Duration::from_secs(86400))),
        }
    }

    /// Send a token request to `endpoint` and read the token from its answer.
    async fn exchange(
        &self,
        req: reqwest::RequestBuilder,
        endpoint: &str,
    ) -> Result<(AccessToken, Duration), AuthError> {
        let unavailable = |reason: String| AuthError::Unavailable {
            source_name: self.name.clone(),
            endpoint: endpoint.to_string(),
            reason,
        };
        let refused = |reason: String| AuthError::Refused {
            source_name: self.name.clone(),
            endpoint: endpoint.to_string(),
            reason,
        };
        // reqwest's error text names the URL and the cause (refused, timed out), never the body.
        let resp = req.send().await.map_err(|e| unavailable(error_chain(&e)))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| unavailable(error_chain(&e)))?;
        if !status.is_success() {
            let why = format!("HTTP {status}{}", oauth_error(&body));
            return Err(if status.is_server_error() || status.as_u16() == 429 {
                unavailable(why)
            } else {
                refused(why)
            });
        }
        let v: Value = serde_json::from_slice(&body)
            .map_err(|_| unavailable("the answer is not JSON".into()))?;
        let token = v
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unavailable("the answer holds no access_token".into()))?;
        if let Some(tt) = v.get("token_type").and_then(Value::as_str) {
            if !tt.eq_ignore_ascii_case("bearer") {
                return Err(refused(format!("token_type {tt:?}, expected Bearer")));
            }
        }
        if reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
            return Err(unavailable(
                "the access token is not a valid header value".into(),
            ));
        }
        // Google answers `expires_in` as a number; some servers as a string.
        let secs = match v.get("expires_in") {
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(s)) => s.parse().ok(),
            _ => None,
        }
        .unwrap_or(3600);
        Ok((
            AccessToken(Arc::from(token)),
            Duration::from_secs(secs.max(1)),
        ))
    }
}

impl ServiceAccount {
    /// The signed JWT bearer assertion (RFC 7523) for a token of [`SCOPE`].
    fn assertion(&self, name: &str) -> Result<String, AuthError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": self.private_key_id});
        let claims = serde_json::json!({
            "iss": self.client_email,
            "scope": SCOPE,
            "aud": self.token_uri,
            "iat": now,
            "exp": now + ASSERTION_LIFETIME.as_secs(),
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut sig = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                signing_input.as_bytes(),
                &mut sig,
            )
            .map_err(|_| AuthError::Config(format!("{name}: signing the token request failed")))?;
        Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }
}

/// gcloud's application-default credentials file.
fn well_known_file() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CLOUDSDK_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("application_default_credentials.json"));
    }
    let home = std::env::var_os("HOME").filter(|d| !d.is_empty())?;
    Some(PathBuf::from(home).join(".config/gcloud/application_default_credentials.json"))
}

fn read_json(path: &Path, origin: &str) -> Result<Value, AuthError> {
    let bytes = std::fs::read(path)
        .map_err(|e| AuthError::Config(format!("{origin}: cannot read the file: {e}")))?;
    parse_json(&bytes, origin)
}

/// The JSON of a credential file. serde_json's messages for wrong values quote them, so only the
/// position of a syntax error is told.
fn parse_json(bytes: &[u8], origin: &str) -> Result<Value, AuthError> {
    serde_json::from_slice(bytes).map_err(|e| {
        AuthError::Config(format!(
            "{origin}: not a JSON credential file (line {}, column {})",
            e.line(),
            e.column()
        ))
    })
}

fn field<'a>(v: &'a Value, key: &str, origin: &str) -> Result<&'a str, AuthError> {
    v.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| AuthError::Config(format!("{origin}: no {key:?} (a non-empty string)")))
}

/// A `GOOGLE_APPLICATION_CREDENTIALS` or gcloud file: by its `type`.
fn credentials_file(v: &Value, origin: &str) -> Result<(Kind, String), AuthError> {
    match v.get("type").and_then(Value::as_str) {
        Some("service_account") => service_account(v, origin),
        Some("authorized_user") => {
            let client_id = field(v, "client_id", origin)?.to_string();
            let client_secret = Secret(field(v, "client_secret", origin)?.to_string());
            let refresh_token = Secret(field(v, "refresh_token", origin)?.to_string());
            let token_uri = token_uri(v, origin)?;
            Ok((
                Kind::AuthorizedUser(AuthorizedUser {
                    client_id,
                    client_secret,
                    refresh_token,
                    token_uri,
                }),
                format!("authorized user ({origin})"),
            ))
        }
        Some(t @ ("external_account" | "impersonated_service_account" | "external_account_authorized_user")) => {
            Err(AuthError::Config(format!(
                "{origin}: credentials of type {t:?} are not supported (a service-account key, an authorized_user file or the metadata server are)"
            )))
        }
        Some(t) => Err(AuthError::Config(format!(
            "{origin}: unknown credential type {t:?}"
        ))),
        None => Err(AuthError::Config(format!(
            "{origin}: no \"type\" (service_account or authorized_user)"
        ))),
    }
}

/// A credential file's `token_uri` (Google's when absent or empty), checked.
fn token_uri(v: &Value, origin: &str) -> Result<String, AuthError> {
    let uri = v
        .get("token_uri")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(GOOGLE_TOKEN_URI)
        .to_string();
    check_uri(&uri, origin)?;
    Ok(uri)
}

/// A service-account key: its account, key and token endpoint.
fn service_account(v: &Value, origin: &str) -> Result<(Kind, String), AuthError> {
    if let Some(t) = v.get("type").and_then(Value::as_str) {
        if t != "service_account" {
            return Err(AuthError::Config(format!(
                "{origin}: a service-account key is expected, this file is of type {t:?}"
            )));
        }
    }
    if v.get("disable_oauth").and_then(Value::as_bool) == Some(true) {
        return Ok((Kind::NoOAuth, format!("no OAuth ({origin}: disable_oauth)")));
    }
    let client_email = field(v, "client_email", origin)?.to_string();
    let private_key_id = v
        .get("private_key_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let key = rsa_key(field(v, "private_key", origin)?, origin)?;
    let token_uri = token_uri(v, origin)?;
    let name = format!("service account {client_email} ({origin})");
    Ok((
        Kind::ServiceAccount(Box::new(ServiceAccount {
            client_email,
            private_key_id,
            key,
            token_uri,
        })),
        name,
    ))
}

fn check_uri(uri: &str, origin: &str) -> Result<(), AuthError> {
    match url::Url::parse(uri) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(()),
        _ => Err(AuthError::Config(format!(
            "{origin}: token_uri {uri:?} is not an http(s) URL"
        ))),
    }
}

/// The RSA key of a PEM `PRIVATE KEY` (PKCS#8, what Google issues) or `RSA PRIVATE KEY` (PKCS#1).
fn rsa_key(pem: &str, origin: &str) -> Result<RsaKeyPair, AuthError> {
    let bad = |why: &str| AuthError::Config(format!("{origin}: private_key: {why}"));
    let (label, body) = pem_block(pem).ok_or_else(|| bad("no PEM block"))?;
    let der = STANDARD
        .decode(body)
        .map_err(|_| bad("the PEM block is not base64"))?;
    let key = match label.as_str() {
        "PRIVATE KEY" => RsaKeyPair::from_pkcs8(&der),
        "RSA PRIVATE KEY" => RsaKeyPair::from_der(&der),
        _ => return Err(bad("not a PRIVATE KEY or RSA PRIVATE KEY block")),
    };
    key.map_err(|e| bad(&format!("not a usable RSA key ({e})")))
}

/// The label and the base64 text of the first PEM block of `pem`.
fn pem_block(pem: &str) -> Option<(String, String)> {
    let start = pem.find("-----BEGIN ")?;
    let rest = &pem[start + "-----BEGIN ".len()..];
    let label_end = rest.find("-----")?;
    let label = rest[..label_end].to_string();
    let body_start = &rest[label_end + 5..];
    let end = body_start.find(&format!("-----END {label}-----"))?;
    let body: String = body_start[..end]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    Some((label, body))
}

/// An error and its causes, `: `-joined (reqwest's top-level text alone hides the cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// `: error (description)` of an OAuth error answer, at most 200 characters each; nothing when
/// the body is not one.
fn oauth_error(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return String::new();
    };
    let short = |s: &str| s.chars().take(200).collect::<String>();
    let error = match v.get("error") {
        Some(Value::String(s)) => short(s),
        // Google's APIs (not the token endpoint) nest it: {"error": {"message": …}}.
        Some(Value::Object(o)) => o
            .get("message")
            .and_then(Value::as_str)
            .map(short)
            .unwrap_or_default(),
        _ => String::new(),
    };
    let description = v
        .get("error_description")
        .and_then(Value::as_str)
        .map(short);
    match (error.is_empty(), description) {
        (true, None) => String::new(),
        (false, None) => format!(": {error}"),
        (true, Some(d)) => format!(": {d}"),
        (false, Some(d)) => format!(": {error} ({d})"),
    }
}

/// Google credentials as object_store's Cloud Storage credential provider.
#[derive(Debug)]
pub struct GcsCredentials(pub Arc<GoogleAuth>);

#[async_trait::async_trait]
impl object_store::CredentialProvider for GcsCredentials {
    type Credential = object_store::gcp::GcpCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<object_store::gcp::GcpCredential>> {
        match self.0.token().await {
            Ok(t) => Ok(Arc::new(object_store::gcp::GcpCredential {
                bearer: t.secret().to_string(),
            })),
            // A generic error is retried by the upload (upload::is_transient); a refused grant
            // or a bad file is not.
            Err(e) if e.retryable() => Err(object_store::Error::Generic {
                store: "GCS",
                source: Box::new(e),
            }),
            Err(e) => Err(object_store::Error::Unauthenticated {
                path: "(Google credentials)".into(),
                source: Box::new(e),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_margin() {
        // 4 minutes before expiry, or at half-life for tokens under 8 minutes.
        let m = |s: u64| RENEW_BEFORE.min(Duration::from_secs(s) / 2);
        assert_eq!(m(3600), Duration::from_secs(240));
        assert_eq!(m(480), Duration::from_secs(240));
        assert_eq!(m(60), Duration::from_secs(30));
    }

    #[test]
    fn pem_blocks() {
        let pem = "junk\n-----BEGIN PRIVATE KEY-----\nQUJD\nREVG\n-----END PRIVATE KEY-----\n";
        assert_eq!(
            pem_block(pem),
            Some(("PRIVATE KEY".into(), "QUJDREVG".into()))
        );
        assert_eq!(pem_block("-----BEGIN X-----\nAA"), None);
    }

    #[test]
    fn secrets_stay_out_of_debug_and_errors() {
        let user = serde_json::json!({
            "type": "authorized_user",
            "client_id": "id-1",
            "client_secret": "SECRET-client",
            "refresh_token": "SECRET-refresh",
        });
        let (kind, name) = credentials_file(&user, "test").unwrap();
        let auth = GoogleAuth {
            kind,
            name,
            http: reqwest::Client::new(),
            cached: tokio::sync::Mutex::new(Some(Cached {
                token: AccessToken(Arc::from("SECRET-token")),
                renew_at: Instant::now(),
                expires_at: Instant::now(),
            })),
        };
        let Kind::AuthorizedUser(u) = &auth.kind else {
            panic!()
        };
        let shown = format!(
            "{auth:?} {u:?} {:?}",
            AccessToken(Arc::from("SECRET-token"))
        );
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains(GOOGLE_TOKEN_URI), "{shown}");

        // A key that is no key, a value of the wrong type: the messages quote neither.
        let bad = serde_json::json!({
            "type": "service_account",
            "client_email": "a@p",
            "private_key": "-----BEGIN PRIVATE KEY-----\nU0VDUkVULWtleQ==\n-----END PRIVATE KEY-----\n",
        });
        let e = service_account(&bad, "test").err().unwrap().to_string();
        assert!(e.contains("not a usable RSA key"), "{e}");
        assert!(!e.contains("U0VDUkVU"), "{e}");
        let e = credentials_file(&serde_json::json!({"type": "authorized_user", "client_id": "i", "client_secret": 7, "refresh_token": "SECRET"}), "test")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("client_secret") && !e.contains("SECRET"), "{e}");
        let e = parse_json(br#"{"private_key": "SECRET"#, "test")
            .err()
            .unwrap()
            .to_string();
        assert!(!e.contains("SECRET"), "{e}");
    }

    #[test]
    fn oauth_errors_are_summarised() {
        assert_eq!(
            oauth_error(br#"{"error":"invalid_grant","error_description":"Invalid JWT"}"#),
            ": invalid_grant (Invalid JWT)"
        );
        assert_eq!(oauth_error(b"<html>"), "");
    }

    #[test]
    fn auth_mode() {
        assert!(AuthMode::Auto.sends_to("https://pubsub.googleapis.com"));
        assert!(!AuthMode::Auto.sends_to("http://127.0.0.1:8085"));
        assert!(AuthMode::Always.sends_to("http://127.0.0.1:8085"));
    }
}
