//! `file://` destinations: object_store's `LocalFileSystem`, with writes that survive a power cut
//! and leave no debris where readers of the folder look.
//!
//! object_store's local store writes an object to `<name>#N` beside it and renames it into place,
//! without fsync. Two problems follow for an archive:
//! * a power cut after the rename can lose the data or the directory entry of an object whose
//!   messages were already settled (checkpoint advanced, acked);
//! * `kill -9` mid-write leaves `<name>#N` in the bucket folder, which Spark, DuckDB globs or
//!   `aws s3 sync` then read as a corrupt object.
//!
//! [`DurableLocal`] keeps every read, list and delete of the inner store but writes itself: bytes go
//! to `<root>/.subsink-staging/<pid>.<n>` (a hidden folder at the bucket root, on the same file
//! system, so the final step is a rename), the file is fsynced, renamed (or hard-linked for
//! put-if-absent) into place, and the target folder is fsynced, together with any folder the write
//! created. Only then does the put return, so the caller settles messages of durable objects only.
//! Staging files carry the writer's pid: at startup the files of processes that no longer run are
//! removed (a crashed run's leftovers), never those of a writer still at work.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::FutureExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};

/// The staging folder at the root of a local bucket.
pub const STAGING_DIR: &str = ".subsink-staging";

static NEXT: AtomicU64 = AtomicU64::new(1);

/// A local folder as an object store whose writes are durable when they return.
#[derive(Debug)]
pub struct DurableLocal {
    inner: LocalFileSystem,
    root: PathBuf,
    /// `SUBSINK_FSYNC=off` skips every fsync (see [`fsync_enabled`]).
    fsync: bool,
}

/// Whether local writes are fsynced: yes unless the environment says `SUBSINK_FSYNC=off`. Without
/// fsync an object is still renamed into place whole, and a crash of subsink alone loses nothing;
/// but a power cut or kernel crash can lose objects (or leave them empty) whose messages were
/// already settled — checkpoint advanced or acked — so they are never written again.
pub fn fsync_enabled() -> bool {
    !matches!(
        std::env::var("SUBSINK_FSYNC").as_deref(),
        Ok("off" | "0" | "false")
    )
}

impl fmt::Display for DurableLocal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DurableLocal({})", self.root.display())
    }
}

impl DurableLocal {
    /// The store rooted at the folder `root` (which must exist). Removes staging files that
    /// crashed writers left (see the module docs).
    pub fn new(root: &FsPath) -> object_store::Result<DurableLocal> {
        let inner = LocalFileSystem::new_with_prefix(root)?;
        let root = std::fs::canonicalize(root).map_err(|e| generic(root, e))?;
        let store = DurableLocal {
            inner,
            root,
            fsync: fsync_enabled(),
        };
        let removed = store.sweep_staging();
        if removed > 0 {
            tracing::info!(
                folder = %store.staging().display(),
                removed,
                "removed staging files of writers that crashed"
            );
        }
        Ok(store)
    }

    fn staging(&self) -> PathBuf {
        self.root.join(STAGING_DIR)
    }

    /// Remove `<pid>.<n>` staging files whose process no longer runs; returns how many. Without
    /// `/proc` liveness cannot be told, and nothing is removed.
    pub fn sweep_staging(&self) -> usize {
        if !FsPath::new("/proc/self").exists() {
            return 0;
        }
        let Ok(entries) = std::fs::read_dir(self.staging()) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.split('.').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if pid != std::process::id()
                && !FsPath::new(&format!("/proc/{pid}")).exists()
                && std::fs::remove_file(e.path()).is_ok()
            {
                removed += 1;
            }
        }
        let _ = std::fs::remove_dir(self.staging());
        removed
    }

    /// A new staging file (creating the staging folder when needed).
    fn stage(&self) -> std::io::Result<(File, PathBuf)> {
        let dir = self.staging();
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("{}.{n}", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => return Ok((f, path)),
                Err(e) if e.kind() == ErrorKind::NotFound => std::fs::create_dir_all(&dir)?,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// A local I/O error that waiting cannot mend: a file where a folder of the object's name must
/// be (`File exists`, `Not a directory`), a folder where the object must be, permission denied, a
/// read-only file system, a name the file system refuses. The object fails at once; a full disk or
/// an I/O error is tried again, as a cloud store's outage is.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct PermanentIoError {
    path: String,
    #[source]
    source: std::io::Error,
}

/// Is an error of this kind one that waiting cannot mend ([`PermanentIoError`])?
fn permanent(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::AlreadyExists
            | ErrorKind::NotADirectory
            | ErrorKind::IsADirectory
            | ErrorKind::PermissionDenied
            | ErrorKind::ReadOnlyFilesystem
            | ErrorKind::InvalidFilename
            | ErrorKind::InvalidInput
    )
}

/// Did the local store fail with an error that waiting cannot mend ([`PermanentIoError`])?
pub fn is_permanent(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { source, .. } if source.is::<PermanentIoError>())
}

fn generic(path: &FsPath, e: std::io::Error) -> object_store::Error {
    let source: Box<dyn std::error::Error + Send + Sync> = if permanent(e.kind()) {
        Box::new(PermanentIoError {
            path: path.display().to_string(),
            source: e,
        })
    } else {
        format!("{}: {e}", path.display()).into()
    };
    object_store::Error::Generic {
        store: "DurableLocal",
        source,
    }
}

fn fsync_dir(dir: &FsPath, fsync: bool) -> std::io::Result<()> {
    if !fsync {
        return Ok(());
    }
    File::open(dir)?.sync_all()
}

/// Create `dir` and its missing ancestors so that the new entries are durable: each created folder
/// is fsynced through its parent.
fn create_dirs_durably(dir: &FsPath, fsync: bool) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut d = dir;
    while !d.exists() {
        missing.push(d.to_path_buf());
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    std::fs::create_dir_all(dir)?;
    for m in missing.iter().rev() {
        if let Some(parent) = m.parent() {
            fsync_dir(parent, fsync)?;
        }
    }
    Ok(())
}

/// Make the fsynced staging file `staged` the object at `dest`: rename (overwrite) or hard link
/// (create only, atomic), then fsync the folder that holds the new entry.
fn publish(
    staged: &FsPath,
    dest: &FsPath,
    mode: &PutMode,
    fsync: bool,
) -> object_store::Result<()> {
    let parent = dest.parent().expect("an object path has a parent");
    create_dirs_durably(parent, fsync).map_err(|e| generic(parent, e))?;
    match mode {
        PutMode::Create => {
            let linked = std::fs::hard_link(staged, dest);
            let _ = std::fs::remove_file(staged);
            match linked {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    return Err(object_store::Error::AlreadyExists {
                        path: dest.display().to_string(),
                        source: Box::new(e),
                    })
                }
                Err(e) => return Err(generic(dest, e)),
            }
        }
        _ => std::fs::rename(staged, dest).map_err(|e| generic(dest, e))?,
    }
    fsync_dir(parent, fsync).map_err(|e| generic(parent, e))?;
    // Leave no empty staging folder behind (this fails, harmlessly, while other writes stage).
    if let Some(dir) = staged.parent() {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(())
}

fn etag(file: &File) -> Option<String> {
    let m = file.metadata().ok()?;
    let mtime = m
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_micros();
    Some(format!(
        "{:x}-{mtime:x}-{:x}",
        std::os::unix::fs::MetadataExt::ino(&m),
        m.len()
    ))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> object_store::Result<T> + Send + 'static,
) -> object_store::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| object_store::Error::Generic {
            store: "DurableLocal",
            source: Box::new(e),
        })?
}

#[async_trait]
impl ObjectStore for DurableLocal {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if matches!(opts.mode, PutMode::Update(_)) || !opts.attributes.is_empty() {
            // The inner store refuses these with its own NotImplemented error.
            return self.inner.put_opts(location, payload, opts).await;
        }
        let dest = self.inner.path_to_filesystem(location)?;
        let (mut file, staged) = self.stage().map_err(|e| generic(&self.staging(), e))?;
        let fsync = self.fsync;
        blocking(move || {
            let written = payload
                .iter()
                .try_for_each(|chunk| file.write_all(chunk))
                .and_then(|()| if fsync { file.sync_all() } else { Ok(()) });
            if let Err(e) = written {
                let _ = std::fs::remove_file(&staged);
                return Err(generic(&dest, e));
            }
            let e_tag = etag(&file);
            drop(file);
            if let Err(e) = publish(&staged, &dest, &opts.mode, fsync) {
                let _ = std::fs::remove_file(&staged);
                return Err(e);
            }
            Ok(PutResult {
                e_tag,
                version: None,
            })
        })
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        if !opts.attributes.is_empty() {
            return self.inner.put_multipart_opts(location, opts).await;
        }
        let dest = self.inner.path_to_filesystem(location)?;
        let (file, staged) = self.stage().map_err(|e| generic(&self.staging(), e))?;
        Ok(Box::new(LocalUpload {
            file: Arc::new(Mutex::new(Some(file))),
            staged,
            dest,
            offset: 0,
            done: false,
            fsync: self.fsync,
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
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
}

/// A multipart upload into one staging file: parts are written at their offsets (in any order,
/// as object_store's `WriteMultipart` sends them), the file is fsynced and renamed on completion.
#[derive(Debug)]
struct LocalUpload {
    file: Arc<Mutex<Option<File>>>,
    staged: PathBuf,
    dest: PathBuf,
    offset: u64,
    done: bool,
    fsync: bool,
}

#[async_trait]
impl MultipartUpload for LocalUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let offset = self.offset;
        self.offset += data.content_length() as u64;
        let file = self.file.clone();
        let dest = self.dest.clone();
        blocking(move || {
            let guard = file.lock().expect("not poisoned");
            let Some(f) = guard.as_ref() else {
                return Err(object_store::Error::Generic {
                    store: "DurableLocal",
                    source: "upload already completed or aborted".into(),
                });
            };
            let mut at = offset;
            for chunk in data.iter() {
                f.write_all_at(chunk, at).map_err(|e| generic(&dest, e))?;
                at += chunk.len() as u64;
            }
            Ok(())
        })
        .boxed()
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.done = true;
        let file = self.file.clone();
        let (staged, dest, fsync) = (self.staged.clone(), self.dest.clone(), self.fsync);
        blocking(move || {
            // Taking the file waits for parts still being written (they hold the lock).
            let f = file.lock().expect("not poisoned").take();
            let Some(f) = f else {
                return Err(generic(&dest, ErrorKind::NotFound.into()));
            };
            if let Err(e) = if fsync { f.sync_all() } else { Ok(()) } {
                let _ = std::fs::remove_file(&staged);
                return Err(generic(&dest, e));
            }
            let e_tag = etag(&f);
            drop(f);
            if let Err(e) = publish(&staged, &dest, &PutMode::Overwrite, fsync) {
                let _ = std::fs::remove_file(&staged);
                return Err(e);
            }
            Ok(PutResult {
                e_tag,
                version: None,
            })
        })
        .await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.done = true;
        self.file.lock().expect("not poisoned").take();
        let staged = self.staged.clone();
        blocking(move || {
            let removed = match std::fs::remove_file(&staged) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
                Err(e) => Err(generic(&staged, e)),
            };
            if let Some(dir) = staged.parent() {
                let _ = std::fs::remove_dir(dir);
            }
            removed
        })
        .await
    }
}

impl Drop for LocalUpload {
    fn drop(&mut self) {
        if !self.done {
            // Dropped unfinished (the writer gave up): no staging file stays behind.
            let _ = std::fs::remove_file(&self.staged);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;

    #[tokio::test]
    async fn a_file_where_a_folder_must_be_fails_at_once_and_a_full_disk_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        let store = DurableLocal::new(dir.path()).unwrap();
        std::fs::write(dir.path().join("events"), b"not a folder").unwrap();
        // The folder `events` cannot be made: a file has its name (EEXIST).
        let e = store
            .put(&Path::from("events/a.avro"), PutPayload::from_static(b"x"))
            .await
            .unwrap_err();
        assert!(is_permanent(&e), "{e}");
        assert!(!crate::upload::is_transient(&e), "{e}");
        assert!(e.to_string().contains("File exists"), "{e}");
        assert!(e.to_string().contains("events"), "{e}");
        // A folder below that file (ENOTDIR).
        let e = store
            .put(
                &Path::from("events/day/a.avro"),
                PutPayload::from_static(b"x"),
            )
            .await
            .unwrap_err();
        assert!(is_permanent(&e), "{e}");
        // A folder where the object must be (EISDIR).
        std::fs::create_dir(dir.path().join("taken")).unwrap();
        let e = store
            .put(&Path::from("taken"), PutPayload::from_static(b"x"))
            .await
            .unwrap_err();
        assert!(is_permanent(&e), "{e}");
        assert_eq!(
            std::fs::read(dir.path().join("events")).unwrap(),
            b"not a folder"
        );
        // What waiting can mend stays transient.
        for kind in [
            ErrorKind::StorageFull,
            ErrorKind::Other,
            ErrorKind::Interrupted,
        ] {
            let e = generic(dir.path(), kind.into());
            assert!(
                !is_permanent(&e) && crate::upload::is_transient(&e),
                "{kind:?}"
            );
        }
        for kind in [ErrorKind::PermissionDenied, ErrorKind::ReadOnlyFilesystem] {
            let e = generic(dir.path(), kind.into());
            assert!(
                is_permanent(&e) && !crate::upload::is_transient(&e),
                "{kind:?}"
            );
        }
    }

    #[tokio::test]
    async fn put_create_multipart_and_no_staging_left() {
        let dir = tempfile::tempdir().unwrap();
        let store = DurableLocal::new(dir.path()).unwrap();
        let p = Path::from("a/b/c.txt");
        store
            .put(&p, PutPayload::from_static(b"one"))
            .await
            .unwrap();
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let again = store
            .put_opts(&p, PutPayload::from_static(b"two"), create.clone())
            .await;
        assert!(
            matches!(again, Err(object_store::Error::AlreadyExists { .. })),
            "{again:?}"
        );
        let new = Path::from("a/d.txt");
        store
            .put_opts(&new, PutPayload::from_static(b"new"), create)
            .await
            .unwrap();
        let mut up = store.put_multipart(&Path::from("m/big")).await.unwrap();
        let (a, b) = (
            up.put_part(PutPayload::from_static(b"hello ")),
            up.put_part(PutPayload::from_static(b"world")),
        );
        // Parts may finish in any order.
        b.await.unwrap();
        a.await.unwrap();
        up.complete().await.unwrap();
        let read = |p: &'static str| {
            let s = &store;
            async move { s.get(&Path::from(p)).await.unwrap().bytes().await.unwrap() }
        };
        assert_eq!(read("a/b/c.txt").await.as_ref(), b"one");
        assert_eq!(read("a/d.txt").await.as_ref(), b"new");
        assert_eq!(read("m/big").await.as_ref(), b"hello world");
        let mut aborted = store.put_multipart(&Path::from("m/gone")).await.unwrap();
        aborted
            .put_part(PutPayload::from_static(b"x"))
            .await
            .unwrap();
        aborted.abort().await.unwrap();
        let mut listed: Vec<String> = store
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        listed.sort();
        assert_eq!(listed, ["a/b/c.txt", "a/d.txt", "m/big"]);
        assert!(
            !dir.path().join(STAGING_DIR).exists()
                || std::fs::read_dir(dir.path().join(STAGING_DIR))
                    .unwrap()
                    .next()
                    .is_none()
        );
    }

    #[test]
    fn staging_files_of_dead_writers_are_swept_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join(STAGING_DIR);
        std::fs::create_dir_all(&staging).unwrap();
        // A pid above the kernel's pid_max cannot run; our own pid does.
        std::fs::write(staging.join("99999999.1"), b"partial").unwrap();
        let live = staging.join(format!("{}.777777", std::process::id()));
        std::fs::write(&live, b"in progress").unwrap();
        let store = DurableLocal::new(dir.path()).unwrap();
        assert!(!staging.join("99999999.1").exists());
        assert!(live.exists());
        std::fs::remove_file(&live).unwrap();
        assert_eq!(store.sweep_staging(), 0);
    }
}
