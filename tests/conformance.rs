//! One conformance suite, run against every backend subsink writes to: a local folder (`file`),
//! `memory`, moto (an S3 fake), SeaweedFS (an S3 server that stores on disk) and Azurite (Azure
//! Blob's emulator). GCS has no server here that speaks the XML API object_store uses (see docs/destinations.md, Google Cloud Storage).
//!
//! Servers start once per test binary (shared, a bucket per test), so the suite stays fast.

mod util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{Attribute, ObjectStore, ObjectStoreExt};
use subsink::upload::{Destination, ObjectUpload, UploadSettings};
use util::servers::*;
use util::*;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    File,
    Memory,
    Moto,
    Seaweed,
    Azurite,
}

const ALL: [Kind; 5] = [
    Kind::File,
    Kind::Memory,
    Kind::Moto,
    Kind::Seaweed,
    Kind::Azurite,
];
/// Backends a separate process can write to and a later process read back.
const PERSISTENT: [Kind; 4] = [Kind::File, Kind::Moto, Kind::Seaweed, Kind::Azurite];

fn shared_moto() -> &'static S3Api {
    static M: std::sync::OnceLock<S3Api> = std::sync::OnceLock::new();
    M.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let s = S3Server::start();
            tx.send(S3Api {
                endpoint: s.endpoint(),
            })
            .unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().unwrap()
    })
}

/// A fresh bucket (or folder, or container) on one backend.
struct Bucket {
    kind: Kind,
    name: String,
    url: String,
    dir: Option<tempfile::TempDir>,
}

impl Bucket {
    fn new(kind: Kind) -> Bucket {
        let name = unique_bucket("conf");
        let (url, dir) = match kind {
            Kind::File => {
                let d = tempfile::tempdir().unwrap();
                (format!("file://{}", d.path().display()), Some(d))
            }
            Kind::Memory => ("memory://".to_string(), None),
            Kind::Moto => {
                shared_moto().create_bucket(&name);
                (format!("s3://{name}"), None)
            }
            Kind::Seaweed => {
                shared_seaweedfs().api().create_bucket(&name);
                (format!("s3://{name}"), None)
            }
            Kind::Azurite => {
                shared_azurite().create_container(&name);
                (format!("az://{name}"), None)
            }
        };
        Bucket {
            kind,
            name,
            url,
            dir,
        }
    }

    /// A bucket name that does not exist on the backend.
    fn missing(kind: Kind) -> Bucket {
        let name = unique_bucket("missing");
        let url = match kind {
            Kind::Azurite => format!("az://{name}"),
            _ => format!("s3://{name}"),
        };
        Bucket {
            kind,
            name,
            url,
            dir: None,
        }
    }

    fn options(&self) -> Vec<(&'static str, String)> {
        match self.kind {
            Kind::Moto => shared_moto().options(),
            Kind::Seaweed => shared_seaweedfs().api().options(),
            Kind::Azurite => shared_azurite().options(),
            _ => Vec::new(),
        }
    }

    /// Environment for the subsink binary.
    fn env(&self) -> Vec<(&'static str, String)> {
        match self.kind {
            Kind::Moto => shared_moto().env(),
            Kind::Seaweed => shared_seaweedfs().api().env(),
            Kind::Azurite => shared_azurite().env(),
            _ => Vec::new(),
        }
    }

    fn dest(&self) -> Destination {
        let opts = self.options();
        let opts: Vec<(&str, &str)> = opts.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Destination::from_url_with(&self.url, &opts).unwrap()
    }

    /// Every file or object in the bucket — staging files and other debris included, as a reader
    /// of the folder or bucket would see them — with its size.
    fn everything(&self) -> Vec<(String, u64)> {
        match self.kind {
            Kind::File => {
                let dir = self.dir.as_ref().unwrap().path();
                files_below(dir)
                    .into_iter()
                    .map(|f| {
                        let len = std::fs::metadata(dir.join(&f)).unwrap().len();
                        (f, len)
                    })
                    .collect()
            }
            Kind::Memory => panic!("a memory store is gone with its process"),
            Kind::Moto => shared_moto().list(&self.name),
            Kind::Seaweed => shared_seaweedfs().api().list(&self.name),
            Kind::Azurite => shared_azurite().list(&self.name),
        }
    }

    /// Unfinished uploads left in the bucket (S3 multipart uploads, Azure uncommitted blobs, local
    /// staging files).
    fn unfinished(&self) -> usize {
        match self.kind {
            Kind::File => {
                let staging = self
                    .dir
                    .as_ref()
                    .unwrap()
                    .path()
                    .join(subsink::upload::local::STAGING_DIR);
                files_below(&staging).len()
            }
            Kind::Memory => 0,
            Kind::Moto => shared_moto().open_multipart_uploads(&self.name),
            Kind::Seaweed => shared_seaweedfs().api().open_multipart_uploads(&self.name),
            Kind::Azurite => shared_azurite().uncommitted(&self.name),
        }
    }

    /// Download every object into a local folder, for readers nobody here wrote.
    fn download_all(&self, into: &Path) -> Vec<PathBuf> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dest = self.dest();
        rt.block_on(async {
            let mut out = Vec::new();
            let mut list = dest.store.list(None);
            let mut metas = Vec::new();
            while let Some(m) = list.next().await {
                metas.push(m.unwrap());
            }
            metas.sort_by(|a, b| a.location.cmp(&b.location));
            for (i, m) in metas.iter().enumerate() {
                let bytes = dest
                    .store
                    .get(&m.location)
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
                let p = into.join(format!("{i:05}.obj"));
                std::fs::write(&p, &bytes).unwrap();
                out.push(p);
            }
            out
        })
    }
}

fn settings(threshold: usize) -> UploadSettings {
    UploadSettings {
        multipart_threshold: threshold,
        part_size: 5 << 20,
        ..UploadSettings::default()
    }
}

async fn read_object(dest: &Destination, name: &str) -> (Vec<u8>, Option<String>) {
    let got = dest.store.get(&ObjPath::from(name)).await.unwrap();
    let ct = got
        .attributes
        .get(&Attribute::ContentType)
        .map(|v| v.to_string());
    (got.bytes().await.unwrap().to_vec(), ct)
}

#[test]
fn single_put_keeps_its_bytes_and_content_type_on_every_backend() {
    let rt = rt();
    for kind in ALL {
        let b = Bucket::new(kind);
        let dest = b.dest();
        rt.block_on(async {
            let mut sink =
                ObjectUpload::new(&dest, "logs/one.txt", "text/plain", settings(16 << 20)).unwrap();
            sink.buf.extend_from_slice(b"hello\nworld\n");
            assert_eq!(sink.finish().await.unwrap(), 12, "{kind:?}");
            let (bytes, ct) = read_object(&dest, "logs/one.txt").await;
            assert_eq!(bytes, b"hello\nworld\n", "{kind:?}");
            // A local folder has no object metadata; every other store keeps the content type.
            let want = (kind != Kind::File).then(|| "text/plain".to_string());
            assert_eq!(ct, want, "{kind:?}");
        });
        if kind != Kind::Memory {
            assert_eq!(
                b.everything(),
                [("logs/one.txt".to_string(), 12)],
                "{kind:?}"
            );
            assert_eq!(b.unfinished(), 0, "{kind:?}");
        }
    }
}

#[test]
fn streaming_multipart_object_above_the_threshold_is_whole_on_every_backend() {
    let rt = rt();
    // 12 MiB + a bit in 64 KiB writes: a 5 MiB threshold streams it as three parts.
    let chunk: Vec<u8> = (0..65_536u32).map(|i| (i * 7 % 251) as u8).collect();
    let chunks = 12 * 16 + 3;
    for kind in ALL {
        let b = Bucket::new(kind);
        let dest = b.dest();
        rt.block_on(async {
            let mut sink = ObjectUpload::new(
                &dest,
                "big/object.avro",
                "application/octet-stream",
                settings(5 << 20),
            )
            .unwrap();
            for _ in 0..chunks {
                sink.buf.extend_from_slice(&chunk);
                sink.maybe_stream().await.unwrap();
            }
            let total = sink.finish().await.unwrap();
            assert_eq!(total, (chunks * chunk.len()) as u64, "{kind:?}");
            let (bytes, ct) = read_object(&dest, "big/object.avro").await;
            assert_eq!(bytes.len(), chunks * chunk.len(), "{kind:?}");
            assert!(
                bytes.chunks(chunk.len()).all(|c| c == chunk.as_slice()),
                "{kind:?}: content differs"
            );
            if kind != Kind::File {
                assert_eq!(ct.as_deref(), Some("application/octet-stream"), "{kind:?}");
            }
        });
        if kind != Kind::Memory {
            assert_eq!(b.everything().len(), 1, "{kind:?}: {:?}", b.everything());
            assert_eq!(b.unfinished(), 0, "{kind:?}");
        }
    }
}

/// A store whose multipart uploads fail at their second part (the first goes through to the real
/// backend, so there is a real unfinished upload to clean up).
#[derive(Debug)]
struct FailingParts(Arc<dyn ObjectStore>);

impl std::fmt::Display for FailingParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FailingParts({})", self.0)
    }
}

#[derive(Debug)]
struct FailingUpload {
    inner: Box<dyn object_store::MultipartUpload>,
    parts: usize,
}

#[async_trait::async_trait]
impl object_store::MultipartUpload for FailingUpload {
    fn put_part(&mut self, data: object_store::PutPayload) -> object_store::UploadPart {
        self.parts += 1;
        if self.parts >= 2 {
            return Box::pin(async {
                Err(object_store::Error::Generic {
                    store: "FailingParts",
                    source: "injected part failure".into(),
                })
            });
        }
        self.inner.put_part(data)
    }
    async fn complete(&mut self) -> object_store::Result<object_store::PutResult> {
        self.inner.complete().await
    }
    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

#[async_trait::async_trait]
impl ObjectStore for FailingParts {
    async fn put_opts(
        &self,
        l: &ObjPath,
        p: object_store::PutPayload,
        o: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.0.put_opts(l, p, o).await
    }
    async fn put_multipart_opts(
        &self,
        l: &ObjPath,
        o: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        Ok(Box::new(FailingUpload {
            inner: self.0.put_multipart_opts(l, o).await?,
            parts: 0,
        }))
    }
    async fn get_opts(
        &self,
        l: &ObjPath,
        o: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.0.get_opts(l, o).await
    }
    fn delete_stream(
        &self,
        l: futures::stream::BoxStream<'static, object_store::Result<ObjPath>>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<ObjPath>> {
        self.0.delete_stream(l)
    }
    fn list(
        &self,
        p: Option<&ObjPath>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.0.list(p)
    }
    async fn list_with_delimiter(
        &self,
        p: Option<&ObjPath>,
    ) -> object_store::Result<object_store::ListResult> {
        self.0.list_with_delimiter(p).await
    }
    async fn copy_opts(
        &self,
        f: &ObjPath,
        t: &ObjPath,
        o: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(f, t, o).await
    }
}

#[test]
fn failed_or_aborted_multipart_upload_leaves_no_object_and_no_unfinished_upload() {
    let rt = rt();
    let chunk = vec![b'x'; 1 << 20];
    for kind in ALL {
        let b = Bucket::new(kind);
        let real = b.dest();
        let failing = Destination {
            store: Arc::new(FailingParts(real.store.clone())),
            ..real.clone()
        };
        rt.block_on(async {
            // A part fails: the upload is aborted, the object never appears.
            let mut sink =
                ObjectUpload::new(&failing, "f/failed", "text/plain", settings(5 << 20)).unwrap();
            let mut failed = false;
            for _ in 0..16 {
                sink.buf.extend_from_slice(&chunk);
                if sink.maybe_stream().await.is_err() {
                    failed = true;
                    break;
                }
            }
            let finished = sink.finish().await;
            assert!(
                failed || finished.is_err(),
                "{kind:?}: the failure went unnoticed"
            );
            assert!(
                finished.is_err(),
                "{kind:?}: a failed upload reported success"
            );
            // Aborted on purpose half-way.
            let mut sink =
                ObjectUpload::new(&real, "f/aborted", "text/plain", settings(5 << 20)).unwrap();
            for _ in 0..11 {
                sink.buf.extend_from_slice(&chunk);
                sink.maybe_stream().await.unwrap();
            }
            sink.abort().await;
            for name in ["f/failed", "f/aborted"] {
                assert!(
                    !subsink::upload::exists(&real, name).await.unwrap(),
                    "{kind:?}: {name} exists"
                );
            }
            let listed: Vec<_> = real.store.list(None).collect().await;
            assert!(listed.is_empty(), "{kind:?}: {listed:?}");
        });
        if kind != Kind::Memory {
            assert!(b.everything().is_empty(), "{kind:?}: {:?}", b.everything());
            assert_eq!(b.unfinished(), 0, "{kind:?}: unfinished uploads left");
        }
    }
}

fn table_schema() -> arrow_schema::Schema {
    arrow_schema::Schema::new(vec![arrow_schema::Field::new(
        "id",
        arrow_schema::DataType::Int64,
        false,
    )])
}

/// On Azurite too: it ignores List Blobs' `startFrom`, so deltalake's reads of the log after a
/// version met versions before it (`InvalidVersion` at the second writer's first conflict) until
/// subsink's stores filtered listings themselves (`upload::offset`).
#[test]
fn two_table_writers_commit_every_row_once_at_distinct_versions_on_every_backend() {
    two_table_writers_on(&[
        Kind::File,
        Kind::Memory,
        Kind::Moto,
        Kind::Seaweed,
        Kind::Azurite,
    ]);
}

fn two_table_writers_on(kinds: &[Kind]) {
    use subsink::sink::delta::{DataFile, DeltaTable};
    let rt = rt();
    for &kind in kinds {
        let b = Bucket::new(kind);
        let dest = b.dest();
        rt.block_on(async {
            let schema = table_schema();
            let mut a = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
            let mut c = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
            assert_eq!((a.version(), c.version()), (0, 0), "{kind:?}");
            let file = |t: &DeltaTable, ids: Vec<i64>| {
                let batch = arrow_array::RecordBatch::try_new(
                    t.schema().clone(),
                    vec![Arc::new(arrow_array::Int64Array::from(ids))],
                )
                .unwrap();
                DataFile::new(subsink::table::write_parquet(t.schema(), &[batch], None).unwrap())
            };
            let mut jobs_a = Vec::new();
            let mut jobs_c = Vec::new();
            for i in 0..5i64 {
                jobs_a.push(file(&a, vec![i * 2]));
                jobs_c.push(file(&c, vec![i * 2 + 1]));
            }
            let wa = async {
                let mut v = Vec::new();
                for f in jobs_a {
                    v.push(a.commit(vec![f]).await.unwrap());
                }
                v
            };
            let wc = async {
                let mut v = Vec::new();
                for f in jobs_c {
                    v.push(c.commit(vec![f]).await.unwrap());
                }
                v
            };
            let (va, vc) = futures::join!(wa, wc);
            let mut all: Vec<i64> = va.iter().chain(&vc).copied().collect();
            all.sort();
            assert_eq!(all, (1..=10).collect::<Vec<_>>(), "{kind:?}: {va:?} {vc:?}");
            // Every row once: ten data files, each with one row, ids 0..10.
            let mut reader = DeltaTable::open_or_create(&dest, &schema).await.unwrap();
            assert_eq!(reader.version(), 10, "{kind:?}");
            let mut files: Vec<String> = dest
                .store
                .list(None)
                .filter_map(|m| async move {
                    let p = m.unwrap().location.to_string();
                    p.ends_with(".parquet").then_some(p)
                })
                .collect()
                .await;
            files.sort();
            assert_eq!(files.len(), 10, "{kind:?}: {files:?}");
            for f in &files {
                assert!(
                    reader.contains_file(f).await.unwrap(),
                    "{kind:?}: {f} not in the table"
                );
            }
            let mut ids = Vec::new();
            for f in &files {
                let bytes = dest
                    .store
                    .get(&ObjPath::from(f.as_str()))
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
                let r =
                    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
                        .unwrap()
                        .build()
                        .unwrap();
                for batch in r {
                    let batch = batch.unwrap();
                    let col = batch
                        .column(0)
                        .as_any()
                        .downcast_ref::<arrow_array::Int64Array>()
                        .unwrap();
                    ids.extend(col.values().iter().copied());
                }
            }
            ids.sort();
            assert_eq!(ids, (0..10).collect::<Vec<i64>>(), "{kind:?}");
        });
    }
}

#[test]
fn a_store_without_atomic_put_if_absent_is_refused_for_tables() {
    let b = Bucket::new(Kind::Moto);
    let mut opts = b.options();
    opts.push(("aws_conditional_put", "disabled".into()));
    let opts: Vec<(&str, &str)> = opts.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let dest = Destination::from_url_with(&b.url, &opts).unwrap();
    let err = rt()
        .block_on(subsink::sink::delta::DeltaTable::open_or_create(
            &dest,
            &table_schema(),
        ))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot be used for tables"), "{err}");
    assert!(err.contains("put-if-absent"), "{err}");
    // Nothing of the probe, nor of a table, stays behind.
    assert!(b.everything().is_empty(), "{:?}", b.everything());
}

// ---- the real binary -------------------------------------------------------------------------

fn storage_run(b: &Bucket, src: &Path, cp: &Path, max_messages: usize) -> std::process::Command {
    let mut c = storage_run_cmd("bkt", "avro");
    c.args([
        "--cloud-storage-write-metadata",
        "--cloud-storage-max-messages",
        &max_messages.to_string(),
        "--bucket-url",
        &b.url,
        "--source",
    ])
    .arg(src)
    .arg("--checkpoint")
    .arg(cp)
    .envs(b.env());
    c
}

/// Message ids of every record in the bucket's objects, read with fastavro, sorted; and how many
/// objects there are.
fn ids_in(b: &Bucket, scratch: &Path) -> (Vec<String>, usize) {
    let dir = scratch.join(format!("dl-{}", b.name));
    std::fs::create_dir_all(&dir).unwrap();
    let files = b.download_all(&dir);
    let mut ids = message_ids(&avro_records(&files));
    ids.sort();
    let _ = std::fs::remove_dir_all(&dir);
    (ids, files.len())
}

/// Duplicates as `id → count` (only ids seen more than once).
fn duplicates(ids: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for i in ids {
        *m.entry(i.clone()).or_insert(0) += 1;
    }
    m.retain(|_, n| *n > 1);
    m
}

#[test]
fn kill_9_during_uploads_then_resume_writes_every_message_exactly_once_on_every_backend() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    // 48,000 messages of ~1 KiB in objects of 400: 120 objects of ~0.5 MB, so kills land while
    // several puts are in flight, and six runs that each write a while before their kill still
    // leave input for the next (with 24,000, a faster parser once finished the input in round 3,
    // before its kill).
    let n = 48_000;
    let ids = write_numbered_messages(&src, n, 1000);
    let size = std::fs::metadata(&src).unwrap().len();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for kind in PERSISTENT {
        let b = Bucket::new(kind);
        let cp = work.path().join(format!("cp-{}.json", b.name));
        let mut last = 0u64;
        for round in 0..6 {
            let child = storage_run(&b, &src, &cp, 400)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            // Wait until this run has made progress of its own (the watermark moved), then kill it
            // a random moment later: every kill lands in a run that is writing.
            let timing = KillTiming {
                limit: Duration::from_secs(120),
                every: Duration::from_millis(5),
                jitter_ms: 120,
            };
            let label = format!("{kind:?} round {round}");
            let now = kill_after_progress(child, &cp, last, &mut seed, timing, &label);
            assert!(now > last, "{kind:?} round {round}: no progress");
            assert!(
                now < size,
                "{kind:?} round {round}: the whole input was done before the kill"
            );
            last = now;
        }
        let out = run_ok(&mut storage_run(&b, &src, &cp, 400));
        let s = summary(&out);
        assert!(
            s["messages_written"].as_u64().unwrap() < n as u64,
            "{kind:?}"
        );
        let (got, objects) = ids_in(&b, work.path());
        let dups = duplicates(&got);
        assert!(
            dups.is_empty(),
            "{kind:?}: {} messages written twice, e.g. {:?}",
            dups.len(),
            dups.iter().take(3).collect::<Vec<_>>()
        );
        assert_eq!(got, ids, "{kind:?}: messages lost");
        // Only whole objects: no staging file, no unfinished upload, nothing but the objects.
        let everything = b.everything();
        assert_eq!(everything.len(), objects, "{kind:?}: {everything:?}");
        assert!(
            everything
                .iter()
                .all(|(f, _)| !f.contains('#') && !f.starts_with('.')),
            "{kind:?}: debris {everything:?}"
        );
        assert_eq!(b.unfinished(), 0, "{kind:?}: unfinished uploads left");
        let leftovers: Vec<String> = std::fs::read_dir(work.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{kind:?}: {leftovers:?}");
        // A further run finds nothing to do.
        let s = summary(&run_ok(&mut storage_run(&b, &src, &cp, 400)));
        assert_eq!(s["messages_written"], 0, "{kind:?}");
    }
}

/// The defect behind "whole objects written twice after kill -9": a put the crashed process had
/// already sent completes on the server after the resumed run looked for the object and found
/// nothing. Replayed deterministically: a finished run's last object is taken away, the
/// checkpoint is put back to the moment it was pending, the resumed run runs, and then the
/// object "lands late" (put back as the dead process's request would have put it). Every message
/// must still be in exactly one object.
#[test]
fn a_put_that_lands_after_the_resume_looked_is_not_a_second_object_on_every_backend() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    let ids = write_numbered_messages(&src, 1000, 100);
    // Byte offsets of each line's start.
    let text = std::fs::read(&src).unwrap();
    let mut starts = vec![0u64];
    for (i, &c) in text.iter().enumerate() {
        if c == b'\n' && i + 1 < text.len() {
            starts.push(i as u64 + 1);
        }
    }
    for kind in PERSISTENT {
        let b = Bucket::new(kind);
        let cp = work.path().join(format!("cp-{}.json", b.name));
        let out = summary(&run_ok(&mut storage_run(&b, &src, &cp, 250)));
        let mut objects: Vec<String> = out["objects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap().to_string())
            .collect();
        objects.sort();
        assert_eq!(objects.len(), 4, "{kind:?}");
        // Names sort by time: the last holds messages 750..1000.
        let last = objects.last().unwrap().clone();
        let dest = b.dest();
        let rt = rt();
        let bytes = rt.block_on(async {
            let p = ObjPath::from(last.as_str());
            let bytes = dest.store.get(&p).await.unwrap().bytes().await.unwrap();
            dest.store.delete(&p).await.unwrap();
            bytes
        });
        let state = serde_json::json!({
            "source": src.display().to_string(),
            "offset": starts[750],
            "line": 751,
            "committed": [],
            "pending": [{"object": last, "span": {"first": starts[750], "last": starts[999]}}],
        });
        std::fs::write(&cp, serde_json::to_vec(&state).unwrap()).unwrap();
        run_ok(&mut storage_run(&b, &src, &cp, 250));
        // The dead process's put completes now.
        rt.block_on(async {
            dest.store
                .put(&ObjPath::from(last.as_str()), bytes.into())
                .await
                .unwrap();
        });
        let (got, _) = ids_in(&b, work.path());
        let dups = duplicates(&got);
        assert!(
            dups.is_empty(),
            "{kind:?}: {} messages in two objects (the late put and the rewrite)",
            dups.len()
        );
        assert_eq!(got, ids, "{kind:?}");
    }
}

#[test]
fn a_missing_bucket_exits_1_naming_the_message_ids_and_settles_none() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    write_numbered_messages(&src, 50, 10);
    for kind in [Kind::Moto, Kind::Seaweed, Kind::Azurite] {
        let b = Bucket::missing(kind);
        let cp = work.path().join(format!("cp-{}.json", b.name));
        let out = storage_run(&b, &src, &cp, 20).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{kind:?}: {err}");
        assert!(err.contains("ids 100000..100019"), "{kind:?}: {err}");
        assert!(err.contains("not done"), "{kind:?}: {err}");
        let s = summary(&out);
        assert_eq!(s["messages_written"], 0, "{kind:?}");
        assert_eq!(s["failed_objects"].as_array().unwrap().len(), 3, "{kind:?}");
        assert_eq!(
            checkpoint_offset(&cp),
            Some(0),
            "{kind:?}: settled past unwritten messages"
        );
    }
}

/// One syscall of an strace log, as far as the durability check needs it.
#[derive(Debug)]
enum Sys {
    /// fsync or fdatasync of a file or folder, completed.
    Sync(String),
    /// rename or link `from` → `to`, completed.
    Publish { to: String },
    /// A write into a checkpoint's temporary file, at its start: the JSON text written.
    CheckpointWrite(String),
}

/// Parse `strace -f` output (unfinished/resumed pairs joined) into the events that matter.
fn parse_strace(log: &str, checkpoint_name: &str) -> Vec<Sys> {
    let mut fds: BTreeMap<i64, String> = BTreeMap::new();
    let mut unfinished: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::new();
    let quoted = |s: &str| -> Vec<String> {
        // The "…" arguments of a syscall, escapes kept as they are.
        let mut v = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'"' {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    if b[j] == b'\\' {
                        j += 1;
                    }
                    j += 1;
                }
                v.push(s[i + 1..j.min(s.len())].to_string());
                i = j + 1;
            } else {
                i += 1;
            }
        }
        v
    };
    for raw in log.lines() {
        let (tid, rest) = match raw.split_once(' ') {
            Some((t, r)) if t.chars().all(|c| c.is_ascii_digit()) => (t.to_string(), r.trim()),
            _ => (String::new(), raw.trim()),
        };
        let line = if let Some(head) = rest.strip_suffix(" <unfinished ...>") {
            // A write is recorded at its start; so is a close, since the kernel frees the fd
            // at once and another thread's open may get that number before this close returns
            // (recorded at its return, the close would unmap the other thread's file: a fsync
            // of it then went unseen). The rest when they complete.
            if head.starts_with("write(") {
                handle_write(head, &fds, checkpoint_name, &quoted, &mut out);
            }
            if let Some(fd) = head
                .strip_prefix("close(")
                .and_then(|r| r.split(')').next())
                .and_then(|f| f.trim().parse::<i64>().ok())
            {
                fds.remove(&fd);
            }
            unfinished.insert(tid, head.to_string());
            continue;
        } else if rest.starts_with("<... ") {
            let Some(head) = unfinished.remove(&tid) else {
                continue;
            };
            let tail = rest.split_once("resumed>").map_or("", |(_, t)| t);
            if head.starts_with("write(") || head.starts_with("close(") {
                continue;
            }
            format!("{head}{tail}")
        } else {
            rest.to_string()
        };
        let ret: Option<i64> = line
            .rsplit_once(" = ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .and_then(|r| r.parse().ok());
        let name = line.split('(').next().unwrap_or("");
        let first_int = || -> Option<i64> {
            line.split_once('(')?
                .1
                .split([',', ')'])
                .next()?
                .trim()
                .parse()
                .ok()
        };
        match name {
            "openat" | "open" => {
                if let (Some(fd), Some(p)) = (ret, quoted(&line).first()) {
                    if fd >= 0 {
                        fds.insert(fd, p.clone());
                    }
                }
            }
            "close" => {
                if let Some(fd) = first_int() {
                    fds.remove(&fd);
                }
            }
            "fsync" | "fdatasync" if ret == Some(0) => {
                if let Some(p) = first_int().and_then(|fd| fds.get(&fd)) {
                    out.push(Sys::Sync(p.clone()));
                }
            }
            "rename" | "renameat" | "renameat2" | "link" | "linkat" if ret == Some(0) => {
                if let Some(to) = quoted(&line).get(1) {
                    out.push(Sys::Publish { to: to.clone() });
                }
            }
            "write" => handle_write(&line, &fds, checkpoint_name, &quoted, &mut out),
            _ => {}
        }
    }
    out
}

fn handle_write(
    line: &str,
    fds: &BTreeMap<i64, String>,
    checkpoint_name: &str,
    quoted: &dyn Fn(&str) -> Vec<String>,
    out: &mut Vec<Sys>,
) {
    let fd: Option<i64> = line
        .strip_prefix("write(")
        .and_then(|r| r.split(',').next())
        .and_then(|f| f.trim().parse().ok());
    let Some(path) = fd.and_then(|fd| fds.get(&fd)) else {
        return;
    };
    let file = path.rsplit('/').next().unwrap_or("");
    if file.starts_with(&format!(".{checkpoint_name}.")) && file.ends_with(".tmp") {
        if let Some(text) = quoted(line).first() {
            out.push(Sys::CheckpointWrite(
                text.replace("\\\"", "\"").replace("\\n", "\n"),
            ));
        }
    }
}

/// On `file://`, every object's data and its folder entry are fsynced before any checkpoint that
/// settles its messages is written: traced on the real binary with strace.
#[test]
fn local_objects_are_fsynced_before_the_checkpoint_passes_them() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    write_numbered_messages(&src, 3000, 200);
    let bucket = work.path().join("bucket");
    let cp = work.path().join("cp.json");
    let trace = work.path().join("trace.txt");
    let b = Bucket {
        kind: Kind::File,
        name: "bucket".into(),
        url: format!("file://{}", bucket.display()),
        dir: None,
    };
    let run = storage_run(&b, &src, &cp, 300);
    let mut c = std::process::Command::new("strace");
    without_subsink_env(&mut c);
    c.args(["-f", "-s", "1000000", "-o"])
        .arg(&trace)
        .args([
            "-e",
            "trace=open,openat,close,fsync,fdatasync,rename,renameat,renameat2,link,linkat,write",
        ])
        .arg(run.get_program())
        .args(run.get_args());
    for (k, v) in run.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    let s = summary(&run_ok(&mut c));
    assert_eq!(s["messages_written"], 3000);
    let objects = summary_objects(&s);
    assert_eq!(objects.len(), 10);
    let events = parse_strace(&std::fs::read_to_string(&trace).unwrap(), "cp.json");
    let bucket = std::fs::canonicalize(&bucket).unwrap();
    for o in &objects {
        let target = bucket.join(o).display().to_string();
        let published = events
            .iter()
            .position(|e| matches!(e, Sys::Publish { to } if *to == target))
            .unwrap_or_else(|| panic!("{o}: never renamed into place"));
        // Its staging file was fsynced before it was renamed into place.
        let staged_sync = events[..published].iter().rposition(
            |e| matches!(e, Sys::Sync(p) if p.contains(subsink::upload::local::STAGING_DIR)),
        );
        assert!(
            staged_sync.is_some(),
            "{o}: data not fsynced before the rename"
        );
        // Its folder was fsynced after the rename.
        let dir = bucket.join(o).parent().unwrap().display().to_string();
        let dir_sync = events[published..]
            .iter()
            .position(|e| matches!(e, Sys::Sync(p) if *p == dir))
            .map(|i| i + published)
            .unwrap_or_else(|| panic!("{o}: folder {dir} never fsynced after the rename"));
        // The checkpoint that first settles it — the first written after it was listed as pending
        // that no longer lists it as pending — comes after both.
        let quoted_name = format!("\"{o}\"");
        let pending_in = |t: &str| {
            t.split_once("\"pending\"")
                .is_some_and(|(_, p)| p.contains(&quoted_name))
        };
        let listed = events
            .iter()
            .position(|e| matches!(e, Sys::CheckpointWrite(t) if pending_in(t)))
            .unwrap_or_else(|| panic!("{o}: never recorded as pending"));
        assert!(listed < published, "{o}: visible before its pending record");
        let settled = events[listed..]
            .iter()
            .position(|e| matches!(e, Sys::CheckpointWrite(t) if !pending_in(t)))
            .map(|i| i + listed)
            .unwrap_or_else(|| panic!("{o}: no checkpoint settles it"));
        assert!(
            settled > dir_sync,
            "{o}: checkpoint write #{settled} settles it before its folder fsync #{dir_sync}"
        );
    }
    // The checkpoint itself: temp file fsynced, renamed, folder fsynced.
    let cp_target = std::fs::canonicalize(&cp).unwrap().display().to_string();
    let renames: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, Sys::Publish { to } if *to == cp_target || to.ends_with("/cp.json")))
        .map(|(i, _)| i)
        .collect();
    assert!(!renames.is_empty());
    let cp_dir = std::fs::canonicalize(work.path())
        .unwrap()
        .display()
        .to_string();
    let is_tmp = |p: &str| p.contains("/.cp.json.") && p.ends_with(".tmp");
    for (k, &r) in renames.iter().enumerate() {
        let written = events[..r]
            .iter()
            .rposition(|e| matches!(e, Sys::CheckpointWrite(_)))
            .expect("a checkpoint write before its rename");
        assert!(
            events[written..r]
                .iter()
                .any(|e| matches!(e, Sys::Sync(p) if is_tmp(p))),
            "checkpoint rename #{k} without an fsync of its temp file after the write"
        );
        let next = renames.get(k + 1).copied().unwrap_or(events.len());
        assert!(
            events[r..next]
                .iter()
                .any(|e| matches!(e, Sys::Sync(p) if *p == cp_dir)),
            "checkpoint rename #{k}: its folder {cp_dir} is not fsynced before the next one"
        );
    }
}

/// No credential value ever appears in logs, errors or the summary: runs that succeed, fail on a
/// missing bucket, fail to connect, and are refused for bad credentials, with verbose logs, on S3,
/// Azure and GCS, and every byte they print is searched for the keys.
#[test]
fn credentials_never_appear_in_logs_errors_or_the_summary() {
    const AWS_KEY_ID: &str = "AKIASUBSINKFAKEKEY42";
    const AWS_SECRET: &str = "subsinkFakeSecret/Value+42xyzQ";
    const AWS_TOKEN: &str = "subsinkFakeSessionToken0123456789";
    // Valid base64, as Azure account keys are.
    const AZURE_KEY: &str = "c3Vic2lua0Zha2VBenVyZUtleVZhbHVlMDEyMzQ1Njc4OQ==";
    const GCS_PRIVATE: &str = "subsinkFakePrivateKeyMaterial987654321";
    let secrets = [AWS_KEY_ID, AWS_SECRET, AWS_TOKEN, AZURE_KEY, GCS_PRIVATE];
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("in.ndjson");
    write_numbered_messages(&src, 30, 10);
    let sa = work.path().join("sa.json");
    std::fs::write(
        &sa,
        serde_json::json!({
            "type": "service_account",
            "project_id": "p",
            "private_key_id": "k",
            "private_key": format!("-----BEGIN PRIVATE KEY-----\n{GCS_PRIVATE}\n-----END PRIVATE KEY-----\n"),
            "client_email": "x@p.iam.gserviceaccount.com",
            "token_uri": "http://127.0.0.1:9/token",
        })
        .to_string(),
    )
    .unwrap();
    let moto = Bucket::new(Kind::Moto);
    let dead_port = free_port();
    let aws = |endpoint: String| -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", endpoint.clone()),
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", AWS_KEY_ID.into()),
            ("AWS_SECRET_ACCESS_KEY", AWS_SECRET.into()),
            ("AWS_SESSION_TOKEN", AWS_TOKEN.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false".into()),
        ]
    };
    let moto_endpoint = shared_moto().endpoint.clone();
    let azurite = shared_azurite();
    type Case = (&'static str, String, Vec<(&'static str, String)>, bool);
    let cases: Vec<Case> = vec![
        ("s3 ok", moto.url.clone(), aws(moto_endpoint.clone()), true),
        (
            "s3 missing bucket",
            "s3://no-such-bucket-here".into(),
            aws(moto_endpoint),
            false,
        ),
        (
            "s3 unreachable",
            "s3://b".into(),
            aws(format!("http://127.0.0.1:{dead_port}")),
            false,
        ),
        (
            "azure bad key",
            format!("az://{}", moto.name),
            vec![
                ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
                (
                    "AZURITE_BLOB_STORAGE_URL",
                    format!("http://127.0.0.1:{}", azurite.port),
                ),
                ("AZURE_STORAGE_ACCOUNT_KEY", AZURE_KEY.into()),
            ],
            false,
        ),
        (
            "gcs bad service account",
            "gs://some-bucket".into(),
            vec![("GOOGLE_SERVICE_ACCOUNT", sa.display().to_string())],
            false,
        ),
    ];
    for (what, url, env, ok) in cases {
        let b = Bucket {
            kind: Kind::File,
            name: what.into(),
            url,
            dir: None,
        };
        let cp = work
            .path()
            .join(format!("cp-{}.json", what.replace(' ', "-")));
        let mut c = storage_run(&b, &src, &cp, 10);
        c.env("SUBSINK_LOG", "debug")
            .args(["--upload-retry-for", "2s"]);
        for (k, v) in &env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.success(), ok, "{what}: {text}");
        for s in secrets {
            assert!(
                !text.contains(s),
                "{what}: output holds a credential:\n{text}"
            );
        }
        if !ok {
            assert!(
                text.contains("not done") || text.contains("error"),
                "{what}: {text}"
            );
        }
    }
}
