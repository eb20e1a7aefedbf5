//! Real object-store servers for the tests: SeaweedFS (an S3 server that stores on disk) and
//! Azurite (Azure Blob's emulator), beside moto ([`super::S3Server`]).
//!
//! Every server runs in a process group of its own and is started with `PR_SET_PDEATHSIG`
//! (SIGKILL): dropping the handle — also while a failing test unwinds — kills the whole group, and
//! if the test binary itself dies (a panic with `panic = abort`, a signal) the kernel kills the
//! server. Shared servers ([`shared_seaweedfs`], [`shared_azurite`]) start once per test binary,
//! from a thread that lives as long as the binary (the death signal follows the thread that
//! spawned the child), and every test uses a bucket of its own.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use super::s3::S3Api;
use super::{free_port, venv_bin, venv_python, PortHold};

/// Put `cmd` in a new process group and have the kernel SIGKILL it when its parent thread dies.
pub fn guard(cmd: &mut Command) -> &mut Command {
    cmd.process_group(0);
    super::process::die_with_thread(cmd)
}

/// A child (leader of its own process group) whose whole group is killed on drop.
pub struct Guarded {
    child: Option<Child>,
}

impl Guarded {
    pub fn spawn(cmd: &mut Command, what: &str) -> Guarded {
        let child = guard(cmd)
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        Guarded { child: Some(child) }
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL the whole group and reap the leader.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe {
                libc::killpg(c.id() as libc::pid_t, libc::SIGKILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Folders for the servers' data under cargo's per-target temp folder, one per test process;
/// those of test processes that no longer run are removed first.
fn data_dir(kind: &str) -> PathBuf {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("servers");
    if let Ok(entries) = std::fs::read_dir(&base) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.rsplit('-').next().and_then(|p| p.parse::<u32>().ok()) {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
    let n = NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = base.join(format!("{kind}{n}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

static NEXT_DIR: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A minimal HTTP/1.1 request on 127.0.0.1:port; the status code (0 when the server did not answer).
pub fn http_status(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    if s.write_all(req.as_bytes())
        .and_then(|()| s.write_all(body))
        .is_err()
    {
        return 0;
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// SeaweedFS (`weed mini`): master, volume, filer and S3 gateway in one process, every port of its
/// own, data on disk in `dir` (so a restart keeps the objects).
pub struct SeaweedFs {
    proc: Option<Guarded>,
    dir: PathBuf,
    ports: Vec<u16>,
    pub s3_port: u16,
    /// Keep the data folder on drop (the shared server's lives as long as the binary).
    log: PathBuf,
    /// While stopped: its ports, kept for the restart.
    held: Option<PortHold>,
    /// Its `-s3.config` file, when it checks signatures ([`SeaweedFs::with_identities`]).
    s3_config: Option<PathBuf>,
}

impl SeaweedFs {
    pub fn start() -> SeaweedFs {
        Self::start_with(None)
    }

    /// A server that refuses anonymous requests: it checks each request's signature against the
    /// key pairs of `identities` (`(access key, secret key)`, each allowed everything).
    pub fn with_identities(identities: &[(&str, &str)]) -> SeaweedFs {
        let dir = data_dir("seaweedfs-auth");
        let ids: Vec<serde_json::Value> = identities
            .iter()
            .enumerate()
            .map(|(i, (ak, sk))| {
                serde_json::json!({"name": format!("user{i}"),
                    "credentials": [{"accessKey": ak, "secretKey": sk}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]})
            })
            .collect();
        let config = dir.join("s3.json");
        std::fs::write(
            &config,
            serde_json::json!({ "identities": ids }).to_string(),
        )
        .unwrap();
        Self::start_with(Some(config))
    }

    fn start_with(s3_config: Option<PathBuf>) -> SeaweedFs {
        let dir = data_dir("seaweedfs");
        let mut s = SeaweedFs {
            proc: None,
            log: dir.join("weed.log"),
            dir,
            s3_port: 0,
            ports: Vec::new(),
            held: None,
            s3_config,
        };
        // A port handed out free may be taken before the server binds it (another process's
        // outgoing connection gets it as its local port: seen with the Kafka tests beside these):
        // then new ports, up to three times.
        for attempt in 1..=3 {
            s.ports = (0..13).map(|_| free_port()).collect();
            s.s3_port = s.ports[6];
            match s.try_spawn() {
                Ok(()) => return s,
                Err(e) if attempt < 3 && e.contains("address already in use") => {}
                Err(e) => panic!("{e}"),
            }
        }
        unreachable!("the last attempt panics")
    }

    fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        self.held = None;
        let p = &self.ports;
        let data = self.dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(venv_bin("weed"));
        cmd.arg("mini")
            .arg(format!("-dir={}", data.display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
                "-admin.ui=false",
                "-webdav=false",
            ])
            .arg(format!("-master.port={}", p[0]))
            .arg(format!("-master.port.grpc={}", p[1]))
            .arg(format!("-volume.port={}", p[2]))
            .arg(format!("-volume.port.grpc={}", p[3]))
            .arg(format!("-filer.port={}", p[4]))
            .arg(format!("-filer.port.grpc={}", p[5]))
            .arg(format!("-s3.port={}", p[6]))
            .arg(format!("-s3.port.grpc={}", p[7]))
            .arg(format!("-admin.port={}", p[8]))
            .arg(format!("-admin.port.grpc={}", p[9]))
            .arg(format!("-s3.port.iceberg={}", p[10]))
            .arg(format!("-s3.port.lance={}", p[11]))
            .arg(format!("-metricsPort={}", p[12]))
            .args(
                self.s3_config
                    .iter()
                    .map(|c| format!("-s3.config={}", c.display())),
            )
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let mut g = Guarded::spawn(&mut cmd, "weed mini");
        // The S3 port opens before the gateway can store anything: poll for a bucket create that
        // succeeds, not for the port.
        let start = Instant::now();
        loop {
            if let Some(status) = g.try_wait() {
                return Err(format!(
                    "weed mini exited early ({status}):\n{}",
                    self.log()
                ));
            }
            let code = http_status(self.s3_port, "PUT", "/subsink-ready-probe", &[], b"");
            // A server that checks signatures refuses the anonymous probe once it is up.
            if code == 200 || code == 409 || (code == 403 && self.s3_config.is_some()) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "SeaweedFS not ready within 60 s (last status {code}):\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        self.proc = Some(g);
        Ok(())
    }

    /// Stop the server (SIGKILL: a crash, not a clean shutdown); the data stays in its folder.
    /// Its ports stay reserved ([`PortHold`]) until [`SeaweedFs::restart`].
    pub fn stop(&mut self) {
        if let Some(mut g) = self.proc.take() {
            g.kill();
            self.held = Some(PortHold::new(&self.ports));
        }
    }

    /// Start again on the same ports and data (after [`SeaweedFs::stop`]).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// The S3 helper of this server.
    pub fn api(&self) -> S3Api {
        S3Api::on_port(self.s3_port)
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        if let Some(mut g) = self.proc.take() {
            g.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Azurite's blob service, in memory, on its own port.
pub struct Azurite {
    proc: Option<Guarded>,
    pub port: u16,
    dir: PathBuf,
}

/// Azurite's built-in account and key (public, documented by Microsoft).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

pub fn tools_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("SUBSINK_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::root().join(".tools"));
    let p = dir.join("node_modules/.bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup-test-env (scripts/test does) to install Azurite",
        p.display()
    );
    p
}

impl Azurite {
    pub fn start() -> Azurite {
        let port = free_port();
        let dir = data_dir("azurite");
        let log = std::fs::File::create(dir.join("azurite.log")).unwrap();
        let mut cmd = Command::new(tools_bin("azurite-blob"));
        cmd.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .args([
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--loose",
                "--disableTelemetry",
            ])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let mut g = Guarded::spawn(&mut cmd, "azurite-blob");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = g.try_wait() {
                panic!(
                    "azurite exited early ({status}): {}",
                    std::fs::read_to_string(dir.join("azurite.log")).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "Azurite not listening"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Azurite {
            proc: Some(g),
            port,
            dir,
        }
    }

    /// Environment for object_store (`AZURE_STORAGE_USE_EMULATOR`) and the Python client.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
            (
                "AZURITE_BLOB_STORAGE_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
        ]
    }

    /// object_store options for an in-process `Destination::from_url_with`: the account's endpoint
    /// given directly (the emulator switch reads its URL from the process environment only).
    pub fn options(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "azure_storage_endpoint",
                format!("http://127.0.0.1:{}/{AZURITE_ACCOUNT}", self.port),
            ),
            ("azure_storage_account_name", AZURITE_ACCOUNT.into()),
            ("azure_storage_account_key", AZURITE_KEY.into()),
            ("azure_allow_http", "true".into()),
        ]
    }

    fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{}/{AZURITE_ACCOUNT};",
            self.port
        )
    }

    /// Run Python with `svc`, a client of this Azurite, and `json` in scope; returns stdout.
    pub fn python(&self, code: &str) -> String {
        let code = format!(
            "from azure.storage.blob import BlobServiceClient\nimport json\nsvc = BlobServiceClient.from_connection_string({:?})\n{code}",
            self.connection_string()
        );
        venv_python(["-c", code.as_str()], &[])
    }

    pub fn create_container(&self, name: &str) {
        self.python(&format!("svc.create_container({name:?})"));
    }

    /// `(name, size)` of every committed blob, sorted.
    pub fn list(&self, container: &str) -> Vec<(String, u64)> {
        let out = self.python(&format!(
            "c = svc.get_container_client({container:?})\nprint(json.dumps(sorted([[b.name, b.size] for b in c.list_blobs()])))"
        ));
        serde_json::from_str(out.trim()).unwrap()
    }

    /// Blobs that exist only as uncommitted blocks (an unfinished block-list upload).
    pub fn uncommitted(&self, container: &str) -> usize {
        let all: usize = self
            .python(&format!(
                "c = svc.get_container_client({container:?})\nprint(len(list(c.list_blobs(include=['uncommittedblobs']))))"
            ))
            .trim()
            .parse()
            .unwrap();
        all - self.list(container).len()
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        if let Some(mut g) = self.proc.take() {
            g.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Handles to the shared servers: plain data (ports); the servers themselves live in the thread
/// that started them.
#[derive(Debug, Clone)]
pub struct SharedSeaweed {
    pub s3_port: u16,
}

impl SharedSeaweed {
    /// The S3 helper of the shared server.
    pub fn api(&self) -> S3Api {
        S3Api::on_port(self.s3_port)
    }
}

pub fn in_keeper_thread<T: Send + 'static, H: Send + 'static>(
    start: impl FnOnce() -> T + Send + 'static,
    handle: impl FnOnce(&T) -> H + Send + 'static,
) -> H {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("test-server-keeper".into())
        .spawn(move || {
            let server = start();
            tx.send(handle(&server)).unwrap();
            // Live as long as the test binary: the server's death signal is tied to this thread.
            loop {
                std::thread::park();
            }
        })
        .unwrap();
    rx.recv().expect("shared server failed to start")
}

/// One SeaweedFS for the whole test binary.
pub fn shared_seaweedfs() -> &'static SharedSeaweed {
    static S: OnceLock<SharedSeaweed> = OnceLock::new();
    S.get_or_init(|| in_keeper_thread(SeaweedFs::start, |s| SharedSeaweed { s3_port: s.s3_port }))
}

/// One Azurite for the whole test binary; `Azurite` methods work on the returned handle.
pub fn shared_azurite() -> &'static Azurite {
    static A: OnceLock<Azurite> = OnceLock::new();
    A.get_or_init(|| {
        in_keeper_thread(Azurite::start, |a| Azurite {
            proc: None,
            port: a.port,
            dir: PathBuf::new(),
        })
    })
}

/// A bucket or container name unique in this test process.
pub fn unique_bucket(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}
