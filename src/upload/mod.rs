//! Object writes through `object_store`: a single put below a threshold, a streaming multipart
//! upload above it, abort on failure. Only whole objects ever become visible: a single put is
//! atomic, and a multipart upload becomes visible only when it completes (object_store's contract;
//! the local store stages a file and renames it).
//!
//! On `file://` a write returns only once the object's data and its directory entry are on disk
//! ([`local::DurableLocal`]), so what the caller settles afterwards survives a power cut.
//!
//! Outages: every request is retried by object_store's client ([`client_retry`]), and a put that
//! still fails with a transient error is tried again with capped exponential backoff until
//! [`UploadSettings::retry_for`] has passed since its first failure. Errors that waiting cannot
//! mend (a missing bucket, denied access, a bad name) fail at once.

pub mod credentials;
pub mod local;
pub mod offset;
pub mod profile;

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ObjectStore, ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions,
    PutPayload, RetryConfig, WriteMultipart,
};

/// Errors of the destination. `retryable` says whether trying again later can help.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("bucket URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// No credential source of the store's chain is there (found at startup).
    #[error("{url}: {source}")]
    NoCredentials {
        url: String,
        #[source]
        source: credentials::NoCredentials,
    },
    /// The AWS shared config files name a profile subsink cannot use (found at startup).
    #[error("{url}: {source}")]
    AwsProfile {
        url: String,
        #[source]
        source: profile::ProfileError,
    },
    #[error("object name {name:?} is not a valid object path: {reason}")]
    BadName { name: String, reason: String },
    #[error("object {name:?} not written: {reason}")]
    Abandoned { name: String, reason: String },
    /// The table writer: a data file written or committed to the table log failed.
    #[error("data file {name:?} not committed: {reason}")]
    Commit { name: String, reason: String },
    #[error("object {name:?}: {source}")]
    Store {
        name: String,
        #[source]
        source: object_store::Error,
    },
}

/// A destination: the store a subscription's bucket maps to.
/// Why a plain path is not a destination, with the `file://` URL to write instead (a relative
/// path made absolute: the URL names the same folder from anywhere).
fn plain_path(path: &str) -> String {
    let url = std::path::absolute(path)
        .ok()
        .and_then(|p| url::Url::from_file_path(p).ok());
    match url {
        Some(u) => {
            format!("a plain path, not a URL: a local folder is written as a file:// URL, here {u}")
        }
        None => {
            "a plain path, not a URL: a local folder is written as file:///ABSOLUTE/PATH".into()
        }
    }
}

#[derive(Debug, Clone)]
pub struct Destination {
    pub store: Arc<dyn ObjectStore>,
    /// The URL it was built from, for messages.
    pub url: String,
    /// Whether the store accepts object attributes (Content-Type); the local store does not.
    pub supports_attributes: bool,
}

impl Destination {
    /// Build a store from a URL: `file:///dir`, `s3://bucket[/prefix]`, `gs://bucket`,
    /// `az://container`, `memory://`. Cloud stores take endpoints and credentials from their standard
    /// environment variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_ALLOW_HTTP`, …), so MinIO
    /// and other S3-compatible servers work.
    pub fn from_url(url: &str) -> Result<Destination, UploadError> {
        Self::from_url_with(url, &[])
    }

    /// [`Destination::from_url`] with object_store configuration keys set over the environment's
    /// (`aws_endpoint`, `azure_storage_use_emulator`, …: the keys of object_store's
    /// `AmazonS3ConfigKey`, `AzureConfigKey` and `GoogleConfigKey`).
    pub fn from_url_with(url: &str, options: &[(&str, &str)]) -> Result<Destination, UploadError> {
        Self::build(url, options, UploadSettings::default().retry_for)
    }

    /// [`Destination::from_url`] whose cloud clients retry each request for at most `retry_for`
    /// (and at most a minute; [`ObjectUpload::finish`] retries whole puts for the rest of
    /// [`UploadSettings::retry_for`]).
    pub fn from_url_retrying(url: &str, retry_for: Duration) -> Result<Destination, UploadError> {
        Self::build(url, &[], retry_for)
    }

    fn build(
        url: &str,
        options: &[(&str, &str)],
        retry_for: Duration,
    ) -> Result<Destination, UploadError> {
        let retry = client_retry(retry_for);
        let bad = |reason: String| UploadError::BadUrl {
            url: url.to_string(),
            reason,
        };
        let parsed = match url::Url::parse(url) {
            Ok(u) => u,
            Err(url::ParseError::RelativeUrlWithoutBase) => return Err(bad(plain_path(url))),
            Err(e) => return Err(bad(e.to_string())),
        };
        let prefixed = |store: Arc<dyn ObjectStore>| -> Result<Arc<dyn ObjectStore>, UploadError> {
            let prefix = parsed.path().trim_matches('/');
            if prefix.is_empty() {
                Ok(store)
            } else {
                let p = Path::parse(prefix).map_err(|e| bad(e.to_string()))?;
                Ok(Arc::new(object_store::prefix::PrefixStore::new(store, p)))
            }
        };
        let (store, supports_attributes): (Arc<dyn ObjectStore>, bool) = match parsed.scheme() {
            "file" => {
                let dir = parsed
                    .to_file_path()
                    .map_err(|_| bad("not an absolute local path".into()))?;
                std::fs::create_dir_all(&dir)
                    .map_err(|e| bad(format!("cannot create {}: {e}", dir.display())))?;
                let local = local::DurableLocal::new(&dir).map_err(|e| bad(e.to_string()))?;
                (Arc::new(local), false)
            }
            "memory" => (Arc::new(object_store::memory::InMemory::new()), true),
            "s3" | "s3a" => {
                let mut b = object_store::aws::AmazonS3Builder::from_env();
                for (k, v) in options {
                    b = b.with_config(k.parse().map_err(|e| bad(format!("{e}")))?, *v);
                }
                let (b, shared) =
                    profile::apply(b, &profile::SharedFiles::from_env()).map_err(|source| {
                        UploadError::AwsProfile {
                            url: url.to_string(),
                            source,
                        }
                    })?;
                let picked =
                    credentials::s3(&b, &shared).map_err(|source| UploadError::NoCredentials {
                        url: url.to_string(),
                        source,
                    })?;
                tracing::info!(store = %url, credentials = %picked, "S3 credentials");
                let s3 = b
                    .with_retry(retry.clone())
                    .with_url(url)
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                (prefixed(Arc::new(s3))?, true)
            }
            "gs" => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env();
                for (k, v) in options {
                    b = b.with_config(k.parse().map_err(|e| bad(format!("{e}")))?, *v);
                }
                // subsink's own Google credential chain (crate::gauth), shared with Pub/Sub and
                // BigQuery, instead of object_store's: a service-account key is exchanged at its
                // `token_uri`, and every token endpoint can be a local one.
                let auth = crate::gauth::GoogleAuth::shared().map_err(|e| bad(e.to_string()))?;
                let gcs = b
                    .with_credentials(Arc::new(crate::gauth::GcsCredentials(auth)))
                    .with_retry(retry.clone())
                    .with_url(url)
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                (prefixed(Arc::new(gcs))?, true)
            }
            "az" | "azure" | "abfs" | "abfss" => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env();
                for (k, v) in options {
                    b = b.with_config(k.parse().map_err(|e| bad(format!("{e}")))?, *v);
                }
                let picked =
                    credentials::azure(&b).map_err(|source| UploadError::NoCredentials {
                        url: url.to_string(),
                        source,
                    })?;
                tracing::info!(store = %url, credentials = %picked, "Azure Blob credentials");
                let az = b
                    .with_retry(retry.clone())
                    .with_url(url)
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                // Azurite ignores List Blobs' `startFrom` (offset.rs).
                let az = offset::OffsetListing::new(Arc::new(az));
                (prefixed(Arc::new(az))?, true)
            }
            other => return Err(bad(format!("unsupported scheme {other:?}"))),
        };
        Ok(Destination {
            store,
            url: url.to_string(),
            supports_attributes,
        })
    }

    /// Azure Blob (block-list uploads cannot be aborted; see [`ObjectUpload::abort`]).
    pub fn is_azure(&self) -> bool {
        ["az:", "azure:", "abfs:", "abfss:"]
            .iter()
            .any(|s| self.url.starts_with(s))
    }

    fn attributes(&self, content_type: &'static str) -> Attributes {
        let mut a = Attributes::new();
        if self.supports_attributes {
            a.insert(Attribute::ContentType, content_type.into());
        }
        a
    }
}

/// Retries of each request inside object_store's cloud clients: connection failures, timeouts of
/// idempotent requests and 5xx answers, backing off from 100 ms to 8 s, for up to a minute (or
/// `retry_for`, if shorter). A put that still fails is retried by [`ObjectUpload::finish`] as a whole;
/// a part of a multipart upload has only these retries.
pub fn client_retry(retry_for: Duration) -> RetryConfig {
    RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(8),
            base: 2.0,
        },
        max_retries: 12,
        retry_timeout: retry_for.min(Duration::from_secs(60)),
    }
}

/// Can trying the same request again later succeed? Transport failures and server errors can;
/// a missing bucket, denied credentials, an invalid name or an unsupported operation cannot.
pub fn is_transient(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::Generic { .. } | object_store::Error::JoinError { .. }
    ) && !local::is_permanent(e)
}

/// How objects are written.
#[derive(Debug, Clone, Copy)]
pub struct UploadSettings {
    /// Above this many buffered bytes an object is streamed as a multipart upload.
    pub multipart_threshold: usize,
    /// Size of each multipart part (S3 needs ≥ 5 MiB for all but the last).
    pub part_size: usize,
    /// Parts in flight at once per object: with `part_size` this bounds memory per open file.
    pub max_parts_in_flight: usize,
    /// How long a put that keeps failing with a transient error is tried again, from its first
    /// failure (object_store's cloud clients retry each request on their own as well).
    pub retry_for: Duration,
    /// First backoff between attempts; doubles each time, up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for UploadSettings {
    fn default() -> Self {
        UploadSettings {
            multipart_threshold: 16 << 20,
            part_size: 8 << 20,
            max_parts_in_flight: 2,
            retry_for: Duration::from_secs(300),
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// One object being written. Bytes gather in `buf`; past the threshold they stream to a multipart
/// upload, so memory per open file stays about `multipart_threshold + part_size * parts in flight`
/// however large the object grows.
pub struct ObjectUpload {
    dest: Destination,
    path: Path,
    name: String,
    content_type: &'static str,
    settings: UploadSettings,
    /// Bytes not yet handed to the store.
    pub buf: Vec<u8>,
    multipart: Option<WriteMultipart>,
    /// Bytes handed to the multipart upload so far.
    streamed: u64,
    /// Put-if-absent: see [`ObjectUpload::create_only`].
    create_only: bool,
    /// Put-if-absent where an existing object counts as written only if it holds these very
    /// bytes: see [`ObjectUpload::create_exact`].
    exact: bool,
    /// A part of the multipart upload failed (and the upload was aborted): the object is lost.
    failed: Option<String>,
}

impl ObjectUpload {
    pub fn new(
        dest: &Destination,
        name: &str,
        content_type: &'static str,
        settings: UploadSettings,
    ) -> Result<ObjectUpload, UploadError> {
        let path = Path::parse(name).map_err(|e| UploadError::BadName {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        Ok(ObjectUpload {
            dest: dest.clone(),
            // The name as stored, which the summary, logs and checkpoint report: object_store
            // drops a leading `/` (an empty prefix and a format starting with `/`).
            name: path.as_ref().to_string(),
            path,
            content_type,
            settings,
            // Small: many files may be open at once; it grows as the object does.
            buf: Vec::with_capacity(16 << 10),
            multipart: None,
            streamed: 0,
            create_only: false,
            exact: false,
            failed: None,
        })
    }

    /// Write the object only if no object of its name exists (atomic put-if-absent on a single
    /// put). For a name that stands for one exact span of input (an object a crashed run left
    /// pending, written again under its recorded name): when the object exists, a previous
    /// attempt — possibly of a process that has died since — already made it durable with the
    /// same messages, and `finish` reports success without writing a second copy. A multipart
    /// upload is checked just before completing instead (object_store has no conditional
    /// multipart completion); it is aborted when the object exists.
    pub fn create_only(mut self) -> ObjectUpload {
        self.create_only = true;
        self
    }

    /// Put-if-absent for a name derived from the object's first message (`--exactly-once` with
    /// a positioned source): an existing object of the name counts as written only if it holds the same bytes
    /// (an earlier attempt of this upload whose answer was lost); other bytes under the name are
    /// another writer's, and this upload fails. Single put only: the caller never streams it
    /// (object_store has no conditional multipart completion).
    pub fn create_exact(mut self) -> ObjectUpload {
        self.create_only = true;
        self.exact = true;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes written so far (streamed + buffered).
    pub fn len(&self) -> u64 {
        self.streamed + self.buf.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn store_err(&self, source: object_store::Error) -> UploadError {
        UploadError::Store {
            name: self.name.clone(),
            source,
        }
    }

    /// Has the buffer passed the threshold, so that [`ObjectUpload::maybe_stream`] would stream it?
    /// Bytes this object holds in memory: its buffer as allocated and, once it streams, the parts
    /// that may be in flight (at most `max_parts_in_flight` after each hand-over, and the
    /// remainder of the last buffer, shorter than a part). The memory budget counts them.
    pub fn held(&self) -> u64 {
        let parts = if self.multipart.is_some() {
            self.settings.part_size * (self.settings.max_parts_in_flight + 1)
        } else {
            0
        };
        (self.buf.capacity() + parts) as u64
    }

    pub fn wants_stream(&self) -> bool {
        self.buf.len() >= self.settings.multipart_threshold
    }

    /// Stream the buffer to a multipart upload once it passes the threshold. Waits while too many
    /// parts are in flight, which is what bounds memory.
    pub async fn maybe_stream(&mut self) -> Result<(), UploadError> {
        if self.buf.len() < self.settings.multipart_threshold {
            return Ok(());
        }
        if self.multipart.is_none() {
            let opts = PutMultipartOptions {
                attributes: self.dest.attributes(self.content_type),
                ..Default::default()
            };
            let upload = self
                .dest
                .store
                .put_multipart_opts(&self.path, opts)
                .await
                .map_err(|e| self.store_err(e))?;
            self.multipart = Some(WriteMultipart::new_with_chunk_size(
                upload,
                self.settings.part_size,
            ));
        }
        let max = self.settings.max_parts_in_flight;
        let mp = self.multipart.as_mut().expect("just set");
        // Hand the buffer over whole (no copy); parts are cut from it without copying either.
        let full = std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(self.settings.multipart_threshold + (1 << 20)),
        );
        self.streamed += full.len() as u64;
        mp.put(bytes::Bytes::from(full));
        if let Err(e) = mp.wait_for_capacity(max).await {
            // A part failed after object_store's retries: abort, so no unfinished upload (and its
            // stored parts) stays behind; the object is lost and `finish` says so.
            self.abort_multipart().await;
            self.failed = Some(e.to_string());
            return Err(self.store_err(e));
        }
        Ok(())
    }

    async fn abort_multipart(&mut self) {
        if let Some(mp) = self.multipart.take() {
            if let Err(e) = mp.abort().await {
                tracing::warn!(object = %self.name, error = %e, "multipart abort failed");
            }
            if self.dest.is_azure() {
                discard_uncommitted_blocks(self.dest.store.clone(), self.path.clone()).await;
                // A block whose request was already on the wire when the upload was given up
                // can still be staged after that: look once more a moment later.
                tokio::time::sleep(Duration::from_secs(2)).await;
                discard_uncommitted_blocks(self.dest.store.clone(), self.path.clone()).await;
            }
        }
    }

    /// Make the object visible: a single put (retried with capped backoff while the error is
    /// transient, for up to `retry_for`) or completing the multipart upload. On failure a multipart
    /// upload is aborted, so nothing partial remains.
    pub async fn finish(mut self) -> Result<u64, UploadError> {
        let total = self.len();
        if let Some(reason) = self.failed.take() {
            return Err(UploadError::Abandoned {
                name: self.name.clone(),
                reason: format!("a part of its multipart upload failed: {reason}"),
            });
        }
        match self.multipart.as_mut() {
            Some(mp) => {
                mp.put(bytes::Bytes::from(std::mem::take(&mut self.buf)));
                if let Err(e) = mp.wait_for_capacity(0).await {
                    self.abort_multipart().await;
                    return Err(self.store_err(e));
                }
                let durable_already = match self.create_only {
                    true => exists(&self.dest, &self.name).await,
                    false => Ok(false),
                };
                match durable_already {
                    Ok(false) => {}
                    Ok(true) => {
                        tracing::info!(object = %self.name, "object is durable already (an earlier attempt wrote it)");
                        self.abort_multipart().await;
                        return Ok(total);
                    }
                    Err(e) => {
                        self.abort_multipart().await;
                        return Err(e);
                    }
                }
                let mp = self.multipart.take().expect("checked");
                match mp.finish().await {
                    Ok(_) => Ok(total),
                    // object_store's WriteMultipart aborts the upload itself when a part or the
                    // completion fails.
                    Err(e) => Err(self.store_err(e)),
                }
            }
            None => {
                let payload = PutPayload::from(bytes::Bytes::from(std::mem::take(&mut self.buf)));
                let mut backoff = self.settings.backoff;
                let mut first_failure: Option<Instant> = None;
                let mut attempt = 1u32;
                loop {
                    let opts = PutOptions {
                        attributes: self.dest.attributes(self.content_type),
                        mode: if self.create_only {
                            PutMode::Create
                        } else {
                            PutMode::Overwrite
                        },
                        ..Default::default()
                    };
                    match self
                        .dest
                        .store
                        .put_opts(&self.path, payload.clone(), opts)
                        .await
                    {
                        Ok(_) => return Ok(total),
                        Err(object_store::Error::AlreadyExists { .. }) if self.exact => {
                            let (store, path) = (self.dest.store.clone(), self.path.clone());
                            let name = self.name.clone();
                            return same_as_existing(store, path, name, payload, total).await;
                        }
                        Err(object_store::Error::AlreadyExists { .. }) if self.create_only => {
                            tracing::info!(object = %self.name, "object is durable already (an earlier attempt wrote it)");
                            return Ok(total);
                        }
                        Err(e) => {
                            let since = *first_failure.get_or_insert_with(Instant::now);
                            if !is_transient(&e) || since.elapsed() >= self.settings.retry_for {
                                return Err(self.store_err(e));
                            }
                            tracing::warn!(object = %self.name, attempt, error = %e, "put failed; retrying in {backoff:?}");
                            crate::telemetry::retried(crate::telemetry::RetryKind::Upload);
                            tokio::time::sleep(backoff).await;
                            backoff = backoff.saturating_mul(2).min(self.settings.max_backoff);
                            attempt += 1;
                        }
                    }
                }
            }
        }
    }

    /// Give up on the object: abort a multipart upload so no part stays behind.
    pub async fn abort(mut self) {
        self.abort_multipart().await;
    }
}

impl Drop for ObjectUpload {
    fn drop(&mut self) {
        // Dropped with a multipart upload open (the run stopped on an error): abort it in the
        // background, so no unfinished upload stays in the bucket.
        if let Some(mp) = self.multipart.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = mp.abort().await;
                });
            }
        }
    }
}

/// Azure has no abort for a block-list upload (object_store's abort does nothing): the blocks
/// stay as an uncommitted blob for a week. Putting a blob of that name clears them; putting it
/// only if absent (an empty one) and deleting it at once leaves nothing, and never touches an
/// object someone else committed under the name.
async fn discard_uncommitted_blocks(store: Arc<dyn ObjectStore>, path: Path) {
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store.put_opts(&path, PutPayload::new(), opts).await {
        Ok(_) => {
            if let Err(e) = store.delete(&path).await {
                tracing::warn!(object = %path, error = %e, "removing the placeholder of an aborted upload failed");
            }
        }
        // Azurite counts a blob of uncommitted blocks as existing: delete it unless a committed
        // object of that name is there (HEAD sees committed blobs only).
        Err(object_store::Error::AlreadyExists { .. }) => {
            if let Err(object_store::Error::NotFound { .. }) = store.head(&path).await {
                let _ = store.delete(&path).await;
            }
        }
        Err(e) => {
            tracing::warn!(object = %path, error = %e, "discarding the blocks of an aborted upload failed")
        }
    }
}

/// Does the store do atomic put-if-absent? Table commits rely on it (two writers that take the
/// same log version must not both succeed). Writes a probe object twice with `PutMode::Create`
/// — the second must be refused as existing — then deletes it. `Err` carries the reason: the
/// store refuses conditional puts (`NotImplemented`, e.g. S3 with `AWS_CONDITIONAL_PUT=disabled`),
/// ignores them (the second put succeeded), or could not be written at all.
pub async fn check_put_if_absent(dest: &Destination) -> Result<(), String> {
    let mut ids = crate::ids::Ids::new(None);
    // At the top level, not in a folder of its own: deleting it from a local folder then leaves
    // nothing behind (an emptied folder would stay).
    let path = Path::from(format!("_subsink_put_if_absent_probe_{}", ids.uuid()));
    let create = || PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    let payload = || PutPayload::from_static(b"probe");
    let verdict = match dest.store.put_opts(&path, payload(), create()).await {
        Err(e) => Err(format!("a conditional put (put-if-absent) failed: {e}")),
        Ok(_) => match dest.store.put_opts(&path, payload(), create()).await {
            Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(object_store::Error::Precondition { .. }) => Ok(()),
            Ok(_) => Err(
                "it overwrote an existing object on a put-if-absent (the condition is ignored)"
                    .to_string(),
            ),
            Err(e) => Err(format!("a put-if-absent on an existing object failed: {e}")),
        },
    };
    let _ = dest.store.delete(&path).await;
    verdict
}

/// [`ObjectUpload::create_exact`]'s object exists: written already if it holds `payload`.
async fn same_as_existing(
    store: Arc<dyn ObjectStore>,
    path: Path,
    name: String,
    payload: PutPayload,
    total: u64,
) -> Result<u64, UploadError> {
    use object_store::ObjectStoreExt;
    let existing = match store.get(&path).await {
        Ok(r) => r.bytes().await,
        Err(e) => Err(e),
    };
    let existing = existing.map_err(|source| UploadError::Store {
        name: name.clone(),
        source,
    })?;
    let ours: Vec<u8> = payload.iter().flat_map(|b| b.iter().copied()).collect();
    if existing[..] == ours[..] {
        tracing::info!(object = %name, "object is durable already (an earlier attempt of this upload wrote it)");
        Ok(total)
    } else {
        Err(UploadError::Abandoned {
            name,
            reason: "an object of this name exists with other contents (another writer of the same records)".into(),
        })
    }
}

/// Does an object exist? (Used when resuming from a checkpoint.)
pub async fn exists(dest: &Destination, name: &str) -> Result<bool, UploadError> {
    let path = Path::parse(name).map_err(|e| UploadError::BadName {
        name: name.to_string(),
        reason: e.to_string(),
    })?;
    match dest.store.head(&path).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(source) => Err(UploadError::Store {
            name: name.to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    fn small() -> UploadSettings {
        UploadSettings {
            multipart_threshold: 1000,
            part_size: 1000,
            max_parts_in_flight: 2,
            retry_for: Duration::from_millis(5),
            backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
        }
    }

    async fn write(dest: &Destination, name: &str, chunks: usize) -> u64 {
        let mut sink = ObjectUpload::new(dest, name, "text/plain", small()).unwrap();
        for i in 0..chunks {
            sink.buf
                .extend(std::iter::repeat_n(b'a' + (i % 26) as u8, 700));
            sink.maybe_stream().await.unwrap();
        }
        sink.finish().await.unwrap()
    }

    async fn read(dest: &Destination, name: &str) -> Vec<u8> {
        let p = Path::parse(name).unwrap();
        dest.store
            .get(&p)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec()
    }

    fn expected(chunks: usize) -> Vec<u8> {
        (0..chunks)
            .flat_map(|i| std::iter::repeat_n(b'a' + (i % 26) as u8, 700))
            .collect()
    }

    #[tokio::test]
    async fn the_put_if_absent_probe_leaves_nothing_in_a_local_folder() {
        let dir = tempfile::tempdir().unwrap();
        let dest = Destination::from_url(&format!("file://{}", dir.path().display())).unwrap();
        check_put_if_absent(&dest).await.unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != ".subsink-staging")
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test]
    async fn single_put_and_multipart_give_the_same_object_on_memory_and_local() {
        let dir = tempfile::tempdir().unwrap();
        for url in [
            "memory://".to_string(),
            format!("file://{}", dir.path().display()),
        ] {
            let dest = Destination::from_url(&url).unwrap();
            assert_eq!(write(&dest, "a/small", 1).await, 700);
            assert_eq!(read(&dest, "a/small").await, expected(1));
            assert_eq!(write(&dest, "a/large", 40).await, 28_000);
            assert_eq!(read(&dest, "a/large").await, expected(40), "{url}");
            assert!(exists(&dest, "a/large").await.unwrap());
            assert!(!exists(&dest, "a/none").await.unwrap());
        }
    }

    #[tokio::test]
    async fn aborted_multipart_leaves_no_object() {
        let dir = tempfile::tempdir().unwrap();
        let dest = Destination::from_url(&format!("file://{}", dir.path().display())).unwrap();
        let mut sink = ObjectUpload::new(&dest, "x/partial", "text/plain", small()).unwrap();
        for _ in 0..10 {
            sink.buf.extend([b'z'; 700]);
            sink.maybe_stream().await.unwrap();
        }
        sink.abort().await;
        assert!(!exists(&dest, "x/partial").await.unwrap());
        let listed: Vec<_> = {
            use futures::TryStreamExt;
            dest.store.list(None).try_collect().await.unwrap()
        };
        assert!(listed.is_empty(), "{listed:?}");
    }

    #[test]
    fn bad_urls_and_names_are_reported() {
        assert!(matches!(
            Destination::from_url("ftp://x"),
            Err(UploadError::BadUrl { .. })
        ));
        let dest = Destination::from_url("memory://").unwrap();
        assert!(matches!(
            ObjectUpload::new(&dest, "a//b", "text/plain", UploadSettings::default()),
            Err(UploadError::BadName { .. })
        ));
    }
}
