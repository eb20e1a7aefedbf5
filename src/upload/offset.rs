//! Listings from an offset that hold the offset whatever the server does with it.
//!
//! `list_with_offset` promises the objects after the offset only. object_store's Azure client asks
//! the server for that (the `startFrom` parameter of List Blobs) and leaves out only an object
//! named exactly like the offset. A server that ignores `startFrom` — Azurite does, seen with
//! Azurite 3 — lists from the first object, and the objects before the offset come through. Delta
//! Lake reads its log this way (the versions after the one a writer knows): with a second writer
//! on the table it then met versions it did not ask for and could not commit (`InvalidVersion`).
//! [`OffsetListing`] drops whatever is not after the offset, which costs nothing where the server
//! honours it.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

/// `inner`, with `list_with_offset` filtered to the objects after the offset.
#[derive(Debug)]
pub struct OffsetListing {
    inner: Arc<dyn ObjectStore>,
}

impl OffsetListing {
    pub fn new(inner: Arc<dyn ObjectStore>) -> OffsetListing {
        OffsetListing { inner }
    }
}

impl fmt::Display for OffsetListing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

#[async_trait]
impl ObjectStore for OffsetListing {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let offset = offset.clone();
        self.inner
            .list_with_offset(prefix, &offset)
            .filter(move |m| {
                let keep = match m {
                    Ok(m) => m.location > offset,
                    Err(_) => true,
                };
                futures::future::ready(keep)
            })
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt as _;

    /// A server that ignores the offset: lists everything.
    #[derive(Debug)]
    struct IgnoresOffset(InMemory);

    impl fmt::Display for IgnoresOffset {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("IgnoresOffset")
        }
    }

    #[async_trait]
    impl ObjectStore for IgnoresOffset {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            self.0.put_opts(location, payload, opts).await
        }
        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.0.put_multipart_opts(location, opts).await
        }
        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            self.0.get_opts(location, options).await
        }
        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            self.0.delete_stream(locations)
        }
        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.0.list(prefix)
        }
        fn list_with_offset(
            &self,
            prefix: Option<&Path>,
            _offset: &Path,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.0.list(prefix)
        }
        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.0.list_with_delimiter(prefix).await
        }
        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.0.copy_opts(from, to, options).await
        }
    }

    #[tokio::test]
    async fn only_objects_after_the_offset_are_listed() {
        let raw = IgnoresOffset(InMemory::new());
        for v in 0..5 {
            raw.put(&Path::from(format!("_delta_log/{v:020}.json")), "x".into())
                .await
                .unwrap();
        }
        let store = OffsetListing::new(Arc::new(raw));
        let prefix = Path::from("_delta_log");
        let names = |offset: &str| {
            let offset = Path::from(offset);
            let stream = store.list_with_offset(Some(&prefix), &offset);
            async move {
                let mut got: Vec<String> = stream
                    .map_ok(|m| m.location.to_string())
                    .try_collect()
                    .await
                    .unwrap();
                got.sort();
                got
            }
        };
        assert_eq!(
            names("_delta_log/00000000000000000002.json").await,
            [
                "_delta_log/00000000000000000003.json",
                "_delta_log/00000000000000000004.json"
            ]
        );
        // An offset between names, and one past them all.
        assert_eq!(
            names("_delta_log/00000000000000000003").await,
            [
                "_delta_log/00000000000000000003.json",
                "_delta_log/00000000000000000004.json"
            ]
        );
        assert!(names("_delta_log/99").await.is_empty());
        // Everything else passes through.
        assert_eq!(store.list(Some(&prefix)).count().await, 5);
    }
}
