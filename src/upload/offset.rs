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

/// The objects of `listing` named after `offset` (errors pass).
fn after(
    listing: BoxStream<'static, object_store::Result<ObjectMeta>>,
    offset: &Path,
) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
    let offset = offset.clone();
    listing
        .filter(move |m| {
            let keep = match m {
                Ok(m) => m.location > offset,
                Err(_) => true,
            };
            futures::future::ready(keep)
        })
        .boxed()
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
        after(self.inner.list_with_offset(prefix, offset), offset)
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

    #[tokio::test]
    async fn only_objects_after_the_offset_are_listed() {
        let store = InMemory::new();
        for v in 0..5 {
            store
                .put(&Path::from(format!("_delta_log/{v:020}.json")), "x".into())
                .await
                .unwrap();
        }
        let prefix = Path::from("_delta_log");
        // What a server that ignores the offset answers: everything under the prefix.
        let names = |offset: &str| {
            let stream = after(store.list(Some(&prefix)), &Path::from(offset));
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
        let last_two = [
            "_delta_log/00000000000000000003.json",
            "_delta_log/00000000000000000004.json",
        ];
        assert_eq!(
            names("_delta_log/00000000000000000002.json").await,
            last_two
        );
        // An offset between names, and one past them all.
        assert_eq!(names("_delta_log/00000000000000000003").await, last_two);
        assert!(names("_delta_log/99").await.is_empty());
        // Through the wrapper, on a store that keeps to offsets itself: the same answer.
        let wrapped = OffsetListing::new(Arc::new(store));
        let got: Vec<ObjectMeta> = wrapped
            .list_with_offset(
                Some(&prefix),
                &Path::from("_delta_log/00000000000000000002.json"),
            )
            .try_collect()
            .await
            .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(wrapped.list(Some(&prefix)).count().await, 5);
    }
}
