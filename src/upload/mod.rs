//! Object writes through `object_store`: a single put below a threshold, a streaming multipart
//! upload above it, abort on failure. Only whole objects ever become visible: a single put is
//! atomic, and a multipart upload becomes visible only when it completes (object_store's contract;
//! the local store stages a file and renames it).

use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions,
    PutPayload, WriteMultipart,
};

/// Errors of the destination. `retryable` says whether trying again later can help.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("bucket URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
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
        let bad = |reason: String| UploadError::BadUrl {
            url: url.to_string(),
            reason,
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
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
                let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| bad(e.to_string()))?;
                (Arc::new(local), false)
            }
            "memory" => (Arc::new(object_store::memory::InMemory::new()), true),
            "s3" | "s3a" => {
                let s3 = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(url)
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                (prefixed(Arc::new(s3))?, true)
            }
            "gs" => {
                let gcs = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(url)
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                (prefixed(Arc::new(gcs))?, true)
            }
            "az" | "azure" | "abfs" | "abfss" => {
                let az = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(url)
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
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

    fn attributes(&self, content_type: &'static str) -> Attributes {
        let mut a = Attributes::new();
        if self.supports_attributes {
            a.insert(Attribute::ContentType, content_type.into());
        }
        a
    }
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
    /// Attempts for a single put before giving up (object_store's cloud clients retry each request
    /// on their own as well).
    pub attempts: u32,
    /// First backoff between attempts; doubles each time.
    pub backoff: Duration,
}

impl Default for UploadSettings {
    fn default() -> Self {
        UploadSettings {
            multipart_threshold: 16 << 20,
            part_size: 8 << 20,
            max_parts_in_flight: 2,
            attempts: 4,
            backoff: Duration::from_millis(200),
        }
    }
}

/// One object being written. Bytes gather in `buf`; past the threshold they stream to a multipart
/// upload, so memory per open file stays about `multipart_threshold + part_size * parts in flight`
/// however large the object grows.
pub struct ObjectSink {
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
}

impl ObjectSink {
    pub fn new(
        dest: &Destination,
        name: &str,
        content_type: &'static str,
        settings: UploadSettings,
    ) -> Result<ObjectSink, UploadError> {
        let path = Path::parse(name).map_err(|e| UploadError::BadName {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        Ok(ObjectSink {
            dest: dest.clone(),
            // The name as stored, which the summary, logs and checkpoint report: object_store
            // drops a leading `/` (an empty prefix and a format starting with `/`).
            name: path.as_ref().to_string(),
            path,
            content_type,
            settings,
            buf: Vec::with_capacity(64 << 10),
            multipart: None,
            streamed: 0,
        })
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
        let res = mp.wait_for_capacity(max).await;
        res.map_err(|e| self.store_err(e))
    }

    /// Make the object visible: a single put (retried with backoff) or completing the multipart
    /// upload. On failure a multipart upload is aborted, so nothing partial remains.
    pub async fn finish(mut self) -> Result<u64, UploadError> {
        let total = self.len();
        match self.multipart.take() {
            Some(mut mp) => {
                mp.put(bytes::Bytes::from(std::mem::take(&mut self.buf)));
                match mp.finish().await {
                    Ok(_) => Ok(total),
                    Err(e) => Err(self.store_err(e)),
                }
            }
            None => {
                let payload = PutPayload::from(bytes::Bytes::from(std::mem::take(&mut self.buf)));
                let mut backoff = self.settings.backoff;
                let mut attempt = 1;
                loop {
                    let opts = PutOptions {
                        attributes: self.dest.attributes(self.content_type),
                        ..Default::default()
                    };
                    match self
                        .dest
                        .store
                        .put_opts(&self.path, payload.clone(), opts)
                        .await
                    {
                        Ok(_) => return Ok(total),
                        Err(e) if attempt >= self.settings.attempts => {
                            return Err(self.store_err(e))
                        }
                        Err(e) => {
                            tracing::warn!(object = %self.name, attempt, error = %e, "put failed; retrying in {backoff:?}");
                            tokio::time::sleep(backoff).await;
                            backoff = backoff.saturating_mul(2);
                            attempt += 1;
                        }
                    }
                }
            }
        }
    }

    /// Give up on the object: abort a multipart upload so no part stays behind.
    pub async fn abort(mut self) {
        if let Some(mp) = self.multipart.take() {
            if let Err(e) = mp.abort().await {
                tracing::warn!(object = %self.name, error = %e, "multipart abort failed");
            }
        }
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
            attempts: 2,
            backoff: Duration::from_millis(1),
        }
    }

    async fn write(dest: &Destination, name: &str, chunks: usize) -> u64 {
        let mut sink = ObjectSink::new(dest, name, "text/plain", small()).unwrap();
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
        let mut sink = ObjectSink::new(&dest, "x/partial", "text/plain", small()).unwrap();
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
            ObjectSink::new(&dest, "a//b", "text/plain", UploadSettings::default()),
            Err(UploadError::BadName { .. })
        ));
    }
}
