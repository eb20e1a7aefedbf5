//! Shared helpers of the integration tests: run the real binary, start real servers, read files back
//! with readers nobody here wrote.
#![allow(dead_code)]

pub mod bigquery;
pub mod emulator;
pub mod hold;
pub mod http;
pub mod kafka;
pub mod messages;
pub mod process;
pub mod proxy;
pub mod pubsub;
pub mod readers;
pub mod record;
pub mod s3;
pub mod servers;
pub mod stall;

pub use messages::*;
pub use process::*;
pub use readers::*;
pub use s3::S3Api;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The number in environment variable `name`, else `default` (benchmark settings).
/// This process's own peak RSS (MiB, VmHWM): a child's `wait4` peak is at least what this
/// process had when it spawned the child, so a measurement is only the child's when above it.
pub fn own_peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A program of the test venv (`scripts/setup-test-env` makes it; `scripts/test` runs that first).
pub fn venv_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("SUBSINK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv"));
    let p = dir.join("bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup-test-env (scripts/test does) to install the test servers and readers",
        p.display()
    );
    p
}

/// Run the test venv's Python with `args`, `env` added; its stdout (it must exit 0).
pub fn venv_python<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
    env: &[(&str, String)],
) -> String {
    let mut c = Command::new(venv_bin("python"));
    // A script may start the binary (a terminal session of it).
    without_subsink_env(&mut c);
    let out = c
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Run a Python `script` of the test venv with `arg`, `env` added; its stdout parsed as JSON.
pub fn python_json(script: &str, arg: &str, env: &[(&str, String)]) -> serde_json::Value {
    serde_json::from_str(&venv_python(["-c", script, arg], env)).unwrap()
}

/// The subsink binary the tests run: `$SUBSINK_BIN` when set (a copy of one branch's build,
/// where several worktrees share one target folder and each build overwrites
/// `target/debug/subsink`), else the one cargo built for this test run.
/// Under CI (`CI` set) `SUBSINK_BIN` is refused: CI tests the binary it built (scripts/test
/// refuses it too, before anything runs).
pub fn subsink_bin() -> std::path::PathBuf {
    let swapped = std::env::var_os("SUBSINK_BIN");
    assert!(
        swapped.is_none() || std::env::var_os("CI").is_none(),
        "SUBSINK_BIN is set under CI: CI tests the binary cargo built for this run"
    );
    swapped
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_BIN_EXE_subsink")))
}

/// Every flag of the binary is also read from a `SUBSINK_<FLAG>` variable (`src/cli/env.rs`): so
/// that a variable set where the tests run (a developer's shell, a CI runner) never changes what
/// a test's worker does, `c` inherits none of the `SUBSINK_*` variables but `SUBSINK_FSYNC`, the
/// swap the binary itself reads (docs/testing.md); a test sets what it needs on the command.
pub fn without_subsink_env(c: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str() {
            if k.starts_with("SUBSINK_") && k != "SUBSINK_FSYNC" {
                c.env_remove(k);
            }
        }
    }
}

/// The subsink binary built for this test run ([`subsink_bin`]). A process spawned from it is
/// killed when the thread that spawned it ends ([`process::die_with_thread`]): a test that
/// panics does not leave its worker running.
pub fn subsink() -> Command {
    let mut c = Command::new(subsink_bin());
    without_subsink_env(&mut c);
    c.env("SUBSINK_LOG", "warn");
    process::die_with_thread(&mut c);
    c
}

/// The subscription of the storage tests' gcloud-style flags.
pub const SUB: &str = "projects/proj/subscriptions/sub";

/// `subsink run` with gcloud-style flags for [`SUB`] (extended limits, so tests can use small
/// numbers) writing `format` objects for bucket `bucket`; the caller adds the rest.
pub fn storage_run_cmd(bucket: &str, format: &str) -> Command {
    let mut c = subsink();
    c.args([
        "run",
        "--limits",
        "extended",
        "--subscription-name",
        SUB,
        "--topic",
        "projects/proj/topics/top",
        "--cloud-storage-bucket",
        bucket,
        "--cloud-storage-output-format",
        format,
    ]);
    c
}

/// `subsink run` of the table subscription `config` from the NDJSON file `input` into the local
/// Delta table `table`, its columns from `schema` (it must exit 0). Its output.
pub fn table_run(config: &Path, input: &Path, table: &Path, schema: &Path) -> Output {
    run_ok(
        subsink()
            .args(["run", "--subscription"])
            .arg(config)
            .arg("--source")
            .arg(input)
            .arg("--table-url")
            .arg(format!("file://{}", table.display()))
            .arg("--table-schema")
            .arg(schema),
    )
}

/// Run `cmd`; it must exit 0. Its output.
pub fn run_ok(cmd: &mut Command) -> Output {
    exited_ok(cmd.output().expect("spawn subsink"))
}

/// The output of a finished subsink run, which must have exited 0.
pub fn exited_ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "subsink failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `subsink run` writing the NDJSON file `src` as `format` objects under `prefix` to
/// `s3://archive` on `s3`, with multipart threshold `threshold` and 5 MiB parts; `extra` added.
pub fn s3_archive_cmd(
    s3: &S3Api,
    format: &str,
    prefix: &str,
    threshold: &str,
    src: &Path,
    extra: &[&str],
) -> Command {
    let mut c = storage_run_cmd("archive", format);
    c.args(extra)
        .args([
            "--cloud-storage-file-prefix",
            prefix,
            "--bucket-url",
            "s3://archive",
            "--multipart-threshold",
            threshold,
            "--part-size",
            "5MiB",
            "--source",
        ])
        .arg(src)
        .envs(s3.env());
    c
}

/// The run summary the binary prints on stdout.
pub fn summary(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("summary {line:?}: {e}"))
}

/// The object names a run summary lists.
pub fn summary_objects(s: &serde_json::Value) -> Vec<String> {
    s["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap().to_string())
        .collect()
}

/// A multi-threaded runtime of two workers.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Every file below `dir`, as paths relative to it, sorted.
pub fn files_below(dir: &Path) -> Vec<String> {
    // A running writer creates and removes folders (`.subsink-staging/`) meanwhile: the entry's
    // own type is used (a stat of a folder removed since would say "not a folder", and it was
    // listed as a file), and a folder gone before it is read holds nothing.
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        let entries = match std::fs::read_dir(d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && d != base => return,
            Err(e) => panic!("{}: {e}", d.display()),
        };
        for e in entries {
            let Ok(e) = e else { continue };
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out.sort();
    out
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Ports kept from everyone else while their server is down. Each is bound on 127.0.0.1 without
/// listening: a connection to it is refused, as with no server, but no outgoing connection can take
/// it as its local port. Without this, a 60 s outage leaves a server's ports to the machine's
/// ephemeral range, and one taken makes the restarted server fail to bind it (`weed mini` then
/// exits). Best effort: a port someone took before the hold is skipped. Dropping releases them.
pub struct PortHold(#[allow(dead_code)] Vec<socket2::Socket>);

impl PortHold {
    pub fn new(ports: &[u16]) -> PortHold {
        use socket2::{Domain, Socket, Type};
        let hold = |port: u16| -> Option<Socket> {
            let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
            // The stopped server's sockets may take a moment to go (and leave TIME_WAIT behind).
            let start = Instant::now();
            loop {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
                s.set_reuse_address(true).ok()?;
                if s.bind(&addr.into()).is_ok() {
                    return Some(s);
                }
                if start.elapsed() > Duration::from_secs(5) {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        PortHold(ports.iter().filter_map(|&p| hold(p)).collect())
    }
}

/// Wait up to 30 s for `child` (`what`) to listen on 127.0.0.1:`port`.
pub(crate) fn wait_for_port(port: u16, what: &str, child: &mut Child) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited early: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on 127.0.0.1:{port} within 30 s");
}

/// A real S3-compatible server (moto) on 127.0.0.1, killed on drop (its whole process group,
/// also when a test panics; see [`servers::guard`]). Derefs to its [`S3Api`].
pub struct S3Server {
    child: servers::Guarded,
    api: S3Api,
    pub port: u16,
}

impl S3Server {
    /// Start moto on a free port and wait until it listens.
    pub fn start() -> S3Server {
        let port = free_port();
        let mut child = servers::Guarded::spawn(
            Command::new(venv_bin("moto_server"))
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            "moto_server",
        );
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = child.try_wait() {
                panic!("moto_server exited early: {status}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "moto_server did not listen on 127.0.0.1:{port} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        S3Server {
            child,
            api: S3Api::on_port(port),
            port,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.api.endpoint.clone()
    }

    /// The S3 helper of this server.
    pub fn api(&self) -> S3Api {
        self.api.clone()
    }
}

impl std::ops::Deref for S3Server {
    type Target = S3Api;
    fn deref(&self) -> &S3Api {
        &self.api
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.child.kill();
    }
}
