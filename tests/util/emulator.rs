//! Google's Pub/Sub emulator (a JVM), one per test on its own port, killed on drop.
//!
//! The launcher script `exec`s java, but to be sure nothing outlives the test the emulator runs in
//! a process group of its own and the whole group is killed. (Not `PR_SET_PDEATHSIG`: that fires
//! when the *thread* that spawned it exits, and tests start and restart emulators from threads —
//! tokio's blocking pool among them — that end long before the test does.)

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Google's apt package puts the emulator's launcher; `SUBSINK_PUBSUB_EMULATOR` names
/// another (scripts/setup-test-env checks the same place).
pub const EMULATOR_BIN: &str =
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";

/// The emulator's launcher: `SUBSINK_PUBSUB_EMULATOR`, else [`EMULATOR_BIN`].
pub fn emulator_bin() -> PathBuf {
    std::env::var_os("SUBSINK_PUBSUB_EMULATOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(EMULATOR_BIN))
}

/// A running emulator on `127.0.0.1:port`. In-memory: a restart loses every topic and
/// subscription.
pub struct Emulator {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Emulator {
    /// Start an emulator on a free port and wait until it accepts connections.
    pub fn start() -> Emulator {
        Self::start_on(super::free_port())
    }

    /// Start an emulator on `port`.
    pub fn start_on(port: u16) -> Emulator {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("emulator.log");
        let mut e = Emulator {
            child: None,
            port,
            dir,
            log,
        };
        e.spawn();
        e
    }

    /// `127.0.0.1:PORT`, what `PUBSUB_EMULATOR_HOST` takes.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kill the emulator (the whole process group) and wait for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The child is the leader of its own group (process_group(0)), so its pid is the
            // group id; the JVM is in that group even if the launcher forked instead of exec'ing.
            unsafe {
                libc::killpg(child.id() as libc::pid_t, libc::SIGKILL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kill the emulator and start a fresh one on the same port (empty: no topics, no
    /// subscriptions).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("emulator log");
        let mut cmd = Command::new(emulator_bin());
        cmd.arg("--host=127.0.0.1")
            .arg(format!("--port={}", self.port))
            .current_dir(self.dir.path())
            // Several JVMs run at once on a small machine: keep each small (the Pub/Sub bench
            // holds 400 MB of messages and asks for more with SUBSINK_EMULATOR_JAVA_OPTS).
            .env(
                "JAVA_OPTS",
                std::env::var("SUBSINK_EMULATOR_JAVA_OPTS").unwrap_or_else(|_| {
                    "-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1".to_string()
                }),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0);
        let mut child = cmd.spawn().expect("start the Pub/Sub emulator");
        let start = Instant::now();
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "the Pub/Sub emulator exited early ({status}):\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if start.elapsed() > Duration::from_secs(60) {
                unsafe {
                    libc::killpg(child.id() as libc::pid_t, libc::SIGKILL);
                }
                let _ = child.wait();
                panic!(
                    "the Pub/Sub emulator did not listen on 127.0.0.1:{} within 60 s:\n{}",
                    self.port,
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
    }

    /// What the emulator printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.kill();
    }
}
