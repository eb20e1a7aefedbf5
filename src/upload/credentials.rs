//! Which credentials an S3 or Azure store will use, found at startup as object_store's builders
//! will find them, so that a store with none fails at once (exit 2) with the chain that was tried,
//! instead of retrying an unreachable instance-metadata endpoint for the whole upload retry time.
//! The source picked is logged once, by name: never a key, a token or a secret.
//!
//! object_store takes the first of these that is configured (its builders' `build`), and falls
//! back to the cloud's instance-metadata service when none is. That last step is the only one that
//! cannot be decided from the configuration alone: it is probed with one TCP connect (at most
//! [`PROBE_WITHIN`]), and skipped when `AWS_EC2_METADATA_DISABLED=true` (the AWS SDKs' switch).

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};

/// How long the instance-metadata endpoint may take to accept a connection before it is taken to
/// be absent. A metadata service answers within milliseconds where there is one.
pub const PROBE_WITHIN: Duration = Duration::from_secs(1);

/// The instance-metadata endpoint object_store uses for AWS when `AWS_METADATA_ENDPOINT` is unset.
const AWS_METADATA: &str = "http://169.254.169.254";
/// Azure's managed-identity endpoint when `AZURE_MSI_ENDPOINT` is unset.
const AZURE_METADATA: &str = "http://169.254.169.254/metadata/identity/oauth2/token";

/// The chain for S3, in its order, as named in errors: the environment's keys, then the AWS
/// shared config files' profile ([`super::profile`], named with its files), then the rest of
/// object_store's chain.
const AWS_ENV_KEYS: &str = "static keys (AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY)";
const AWS_CHAIN: &str = "web identity \
(AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN), ECS container credentials \
(AWS_CONTAINER_CREDENTIALS_RELATIVE_URI), EKS pod identity (AWS_CONTAINER_CREDENTIALS_FULL_URI + \
AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE), unsigned requests (AWS_SKIP_SIGNATURE=true), then the \
EC2 instance metadata service (AWS_METADATA_ENDPOINT)";

/// The chain object_store walks for Azure Blob, in its order, as named in errors.
pub const AZURE_CHAIN: &str = "the emulator (AZURE_STORAGE_USE_EMULATOR=true), a bearer token \
(AZURE_STORAGE_TOKEN), an account key (AZURE_STORAGE_ACCOUNT_KEY), workload identity \
(AZURE_CLIENT_ID + AZURE_TENANT_ID + AZURE_FEDERATED_TOKEN_FILE), a client secret (AZURE_CLIENT_ID + \
AZURE_CLIENT_SECRET + AZURE_TENANT_ID), a SAS token (AZURE_STORAGE_SAS_KEY), the Azure CLI \
(AZURE_USE_AZURE_CLI=true), unsigned requests (AZURE_SKIP_SIGNATURE=true), then the managed \
identity endpoint (AZURE_MSI_ENDPOINT)";

/// No credential source of the chain is there.
#[derive(Debug, thiserror::Error)]
#[error("no credentials for {store}: tried {chain}; {why}")]
pub struct NoCredentials {
    /// `S3`, `Azure Blob`.
    pub store: &'static str,
    pub chain: String,
    /// Why the last step, the metadata service, does not count.
    pub why: String,
}

/// The credential source object_store will use for this S3 builder, by name; `shared` says what
/// the AWS shared config files gave it ([`super::profile::apply`]).
pub fn s3(b: &AmazonS3Builder, shared: &super::profile::Applied) -> Result<String, NoCredentials> {
    let set = |k: AmazonS3ConfigKey| b.get_config_value(&k).filter(|v| !v.is_empty());
    let on = |k: AmazonS3ConfigKey| set(k).is_some_and(|v| is_true(&v));
    if set(AmazonS3ConfigKey::AccessKeyId).is_some()
        || set(AmazonS3ConfigKey::SecretAccessKey).is_some()
    {
        return Ok(shared
            .keys
            .clone()
            .unwrap_or_else(|| "static keys (AWS_ACCESS_KEY_ID)".into()));
    }
    if set(AmazonS3ConfigKey::WebIdentityTokenFile).is_some()
        && set(AmazonS3ConfigKey::RoleArn).is_some()
    {
        return Ok("web identity (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN)".into());
    }
    if set(AmazonS3ConfigKey::ContainerCredentialsRelativeUri).is_some() {
        return Ok("ECS container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI)".into());
    }
    if set(AmazonS3ConfigKey::ContainerCredentialsFullUri).is_some()
        && set(AmazonS3ConfigKey::ContainerAuthorizationTokenFile).is_some()
    {
        return Ok("EKS pod identity (AWS_CONTAINER_CREDENTIALS_FULL_URI)".into());
    }
    if on(AmazonS3ConfigKey::SkipSignature) {
        return Ok("none: unsigned requests (AWS_SKIP_SIGNATURE)".into());
    }
    let endpoint = set(AmazonS3ConfigKey::MetadataEndpoint).unwrap_or_else(|| AWS_METADATA.into());
    let disabled = std::env::var("AWS_EC2_METADATA_DISABLED").is_ok_and(|v| is_true(&v));
    metadata(
        "S3",
        format!("{AWS_ENV_KEYS}, {}, {AWS_CHAIN}", shared.tried),
        &endpoint,
        disabled,
        "AWS_EC2_METADATA_DISABLED is set",
    )
    .map(|()| format!("the EC2 instance metadata service ({endpoint})"))
}

/// The credential source object_store will use for this Azure builder, by name.
pub fn azure(b: &MicrosoftAzureBuilder) -> Result<String, NoCredentials> {
    let set = |k: AzureConfigKey| b.get_config_value(&k).filter(|v| !v.is_empty());
    let on = |k: AzureConfigKey| set(k).is_some_and(|v| is_true(&v));
    if on(AzureConfigKey::UseEmulator) {
        return Ok("the storage emulator's account (AZURE_STORAGE_USE_EMULATOR)".into());
    }
    if set(AzureConfigKey::Token).is_some() {
        return Ok("a bearer token (AZURE_STORAGE_TOKEN)".into());
    }
    if set(AzureConfigKey::AccessKey).is_some() {
        return Ok("an account key (AZURE_STORAGE_ACCOUNT_KEY)".into());
    }
    let client =
        set(AzureConfigKey::ClientId).is_some() && set(AzureConfigKey::AuthorityId).is_some();
    if client && set(AzureConfigKey::FederatedTokenFile).is_some() {
        return Ok("workload identity (AZURE_FEDERATED_TOKEN_FILE)".into());
    }
    if client && set(AzureConfigKey::ClientSecret).is_some() {
        return Ok("a client secret (AZURE_CLIENT_ID, AZURE_CLIENT_SECRET)".into());
    }
    if set(AzureConfigKey::SasKey).is_some() {
        return Ok("a SAS token (AZURE_STORAGE_SAS_KEY)".into());
    }
    if on(AzureConfigKey::UseAzureCli) {
        return Ok("the Azure CLI (AZURE_USE_AZURE_CLI)".into());
    }
    if on(AzureConfigKey::SkipSignature) {
        return Ok("none: unsigned requests (AZURE_SKIP_SIGNATURE)".into());
    }
    let endpoint = set(AzureConfigKey::MsiEndpoint).unwrap_or_else(|| AZURE_METADATA.into());
    metadata("Azure Blob", AZURE_CHAIN.into(), &endpoint, false, "")
        .map(|()| format!("the managed identity endpoint ({endpoint})"))
}

/// Whether the metadata service at `endpoint` is there to ask (one connect, remembered for the
/// process).
fn metadata(
    store: &'static str,
    chain: String,
    endpoint: &str,
    disabled: bool,
    disabled_why: &str,
) -> Result<(), NoCredentials> {
    let fail = |why: String| NoCredentials {
        store,
        chain: chain.clone(),
        why,
    };
    if disabled {
        return Err(fail(format!("none is configured and {disabled_why}")));
    }
    match reachable(endpoint) {
        Ok(()) => Ok(()),
        Err(e) => Err(fail(format!(
            "none is configured, and the metadata service at {endpoint} is not there ({e}): set \
             one of them (an S3-compatible server such as MinIO takes AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY)"
        ))),
    }
}

/// One TCP connect to `endpoint`'s host and port within [`PROBE_WITHIN`]; the answer is kept for
/// the process (every store of a `serve` asks the same).
fn reachable(endpoint: &str) -> Result<(), String> {
    type Probed = Vec<(String, Result<(), String>)>;
    static SEEN: OnceLock<Mutex<Probed>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some((_, r)) = seen
        .lock()
        .expect("probe cache")
        .iter()
        .find(|(e, _)| e == endpoint)
    {
        return r.clone();
    }
    let r = connect(endpoint);
    seen.lock()
        .expect("probe cache")
        .push((endpoint.to_string(), r.clone()));
    r
}

fn connect(endpoint: &str) -> Result<(), String> {
    let url = url::Url::parse(endpoint).map_err(|e| format!("not a URL: {e}"))?;
    let host = url.host_str().ok_or("no host")?;
    let port = url.port_or_known_default().ok_or("no port")?;
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host} does not resolve: {e}"))?;
    let mut last = format!("{host} has no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, PROBE_WITHIN) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                last = format!("no connection within {} s", PROBE_WITHIN.as_secs());
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

fn is_true(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No shared config files.
    fn none() -> crate::upload::profile::Applied {
        crate::upload::profile::Applied {
            keys: None,
            tried: "the AWS shared config files' profile `default` (…): no such profile".into(),
        }
    }

    /// A local port with nothing listening.
    fn closed_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    #[test]
    fn s3_static_keys_are_picked_by_name_never_by_value() {
        let b = AmazonS3Builder::new()
            .with_access_key_id("AKIDEXAMPLE")
            .with_secret_access_key("s3cr3t-value");
        let picked = s3(&b, &none()).unwrap();
        assert_eq!(picked, "static keys (AWS_ACCESS_KEY_ID)");
        assert!(!picked.contains("AKIDEXAMPLE") && !picked.contains("s3cr3t"));
    }

    #[test]
    fn s3_without_credentials_fails_fast_naming_the_chain() {
        let endpoint = format!("http://127.0.0.1:{}", closed_port());
        let b = AmazonS3Builder::new().with_config(AmazonS3ConfigKey::MetadataEndpoint, &endpoint);
        let start = std::time::Instant::now();
        let e = s3(&b, &none()).unwrap_err().to_string();
        assert!(
            start.elapsed() < PROBE_WITHIN + Duration::from_millis(500),
            "{e}"
        );
        assert!(
            e.starts_with("no credentials for S3: tried static keys"),
            "{e}"
        );
        assert!(e.contains("AWS_WEB_IDENTITY_TOKEN_FILE"), "{e}");
        assert!(
            e.contains(&format!("metadata service at {endpoint} is not there")),
            "{e}"
        );
    }

    #[test]
    fn s3_metadata_is_used_where_it_answers() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", l.local_addr().unwrap());
        let b = AmazonS3Builder::new().with_config(AmazonS3ConfigKey::MetadataEndpoint, &endpoint);
        assert_eq!(
            s3(&b, &none()).unwrap(),
            format!("the EC2 instance metadata service ({endpoint})")
        );
    }

    #[test]
    fn azure_without_credentials_fails_fast_naming_the_chain() {
        let endpoint = format!("http://127.0.0.1:{}/token", closed_port());
        let b = MicrosoftAzureBuilder::new()
            .with_account("acct")
            .with_config(AzureConfigKey::MsiEndpoint, &endpoint);
        let e = azure(&b).unwrap_err().to_string();
        assert!(
            e.starts_with("no credentials for Azure Blob: tried the emulator"),
            "{e}"
        );
        assert!(e.contains("AZURE_STORAGE_ACCOUNT_KEY"), "{e}");
        let b = MicrosoftAzureBuilder::new().with_config(AzureConfigKey::UseEmulator, "true");
        assert!(azure(&b).unwrap().contains("emulator"));
    }
}
