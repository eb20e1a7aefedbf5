//! Kafka for the tests: one broker per test binary on 127.0.0.1 with memory storage — nisshi
//! 0.7.0-pre.2 (Tansu's successor, an Apache-Kafka-compatible broker in Rust; `cargo install
//! nisshi` by scripts/setup-test-env) —, topics made with `nisshi topic create`, and
//! tests/py/kafka_tool.py (confluent-kafka, librdkafka's Python client) to produce, read back and
//! ask committed offsets. A Tansu binary takes the same commands (`SUBSINK_KAFKA_BROKER`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The broker binary: `$SUBSINK_KAFKA_BROKER` (a nisshi or a Tansu binary), else `nisshi` on
/// PATH, else `~/.cargo/bin/nisshi`.
pub fn broker_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SUBSINK_KAFKA_BROKER") {
        return PathBuf::from(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("nisshi"))
            .find(|p| p.exists())
    });
    let p = on_path.unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cargo/bin/nisshi")
    });
    assert!(
        p.exists(),
        "nisshi is missing: run scripts/setup-test-env (it installs nisshi 0.7.0-pre.2 with cargo install)"
    );
    p
}

/// The broker binary's name and version as it prints them (`nisshi 0.7.0-pre.2`, `tansu 0.6.0`).
pub fn broker_version() -> String {
    let out = Command::new(broker_bin())
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success(), "{} --version", broker_bin().display());
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The test binary's broker: `(HOST:PORT, pid)`. (Named after Tansu, which nisshi was called
/// before: tests/archive.rs and benches/kafka_drain.rs use it too.)
pub struct Tansu {
    pub brokers: String,
    pub pid: u32,
}

/// The broker of this test binary, started once on a thread that lives as long as the process; it
/// gets SIGKILL when that thread's process ends (`PR_SET_PDEATHSIG`).
pub fn tansu() -> &'static Tansu {
    static T: OnceLock<Tansu> = OnceLock::new();
    T.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let port = super::free_port();
            let url = format!("tcp://127.0.0.1:{port}");
            let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("kafka-{port}.log"));
            let mut cmd = Command::new(broker_bin());
            cmd.args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://kafka/"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let mut child = cmd.spawn().expect("start the Kafka broker");
            let start = Instant::now();
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "the Kafka broker exited early (its log: {})",
                    log.display()
                );
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the Kafka broker is not listening"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            tx.send(Tansu {
                brokers: format!("127.0.0.1:{port}"),
                pid: child.id(),
            })
            .unwrap();
            let _ = child.wait();
        });
        rx.recv().unwrap()
    })
}

impl Tansu {
    /// `kafka://HOST:PORT`, for `--source`.
    pub fn url(&self) -> String {
        format!("kafka://{}", self.brokers)
    }

    /// Make `topic` with `partitions` partitions.
    pub fn create_topic(&self, topic: &str, partitions: u32) {
        let out = Command::new(broker_bin())
            .args(["topic", "create", topic, "--broker"])
            .arg(format!("tcp://{}", self.brokers))
            .args(["--partitions", &partitions.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} topic create {topic}: {}",
            broker_bin().display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stop (SIGSTOP) or continue (SIGCONT) the broker.
    pub fn freeze(&self, on: bool) {
        let sig = if on { libc::SIGSTOP } else { libc::SIGCONT };
        unsafe { libc::kill(self.pid as i32, sig) };
    }

    fn tool(&self, args: &[&str], stdin: Option<&str>) -> String {
        let script = super::root().join("tests/py/kafka_tool.py");
        let mut c = Command::new(super::venv_bin("python"));
        c.arg(script)
            .arg(args[0])
            .arg(&self.brokers)
            .args(&args[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::piped());
        let mut child = c.spawn().unwrap();
        {
            use std::io::Write;
            let mut si = child.stdin.take().unwrap();
            if let Some(s) = stdin {
                si.write_all(s.as_bytes()).unwrap();
            }
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kafka_tool {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Produce `records` (kafka_tool's JSON form: `value`, `key` base64 or null, `headers`
    /// `[[k, b64|null]]`, `partition`, `timestamp` ms).
    pub fn produce(&self, topic: &str, records: &[Value]) {
        let lines: String = records.iter().map(|r| format!("{r}\n")).collect();
        self.tool(&["produce", topic], Some(&lines));
    }

    /// Records `from..from+n` (header `i`, key `k{i}`, `size` bytes, partition `i % partitions`);
    /// `per_batch`: records per produced batch (`None`: librdkafka's batching).
    pub fn produce_numbered(
        &self,
        topic: &str,
        from: usize,
        n: usize,
        size: usize,
        partitions: u32,
        per_batch: Option<usize>,
    ) {
        let mut args = vec![
            "numbered".to_string(),
            topic.to_string(),
            from.to_string(),
            n.to_string(),
            size.to_string(),
            partitions.to_string(),
        ];
        if let Some(b) = per_batch {
            args.push(b.to_string());
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.tool(&refs, None);
    }

    /// The first `n` records of `topic` (waits up to 60 s for them), as kafka_tool prints them.
    pub fn read(&self, topic: &str, n: usize) -> Vec<Value> {
        serde_json::from_str(&self.tool(&["read", topic, &n.to_string()], None)).unwrap()
    }

    /// Every record of `topic`'s partitions `0..partitions` from offset 0, read until 3 s bring
    /// none: for a topic whose record count is not known (duplicates) and no longer grows.
    pub fn read_all(&self, topic: &str, partitions: u32) -> Vec<Value> {
        serde_json::from_str(&self.tool(&["all", topic, &partitions.to_string()], None)).unwrap()
    }

    /// The committed offsets of `group` on `topic`'s partitions `0..partitions` (negative: none).
    pub fn committed(&self, group: &str, topic: &str, partitions: u32) -> BTreeMap<u32, i64> {
        let v: BTreeMap<String, i64> = serde_json::from_str(
            &self.tool(&["committed", group, topic, &partitions.to_string()], None),
        )
        .unwrap();
        v.into_iter()
            .map(|(k, v)| (k.parse().unwrap(), v))
            .collect()
    }

    /// Set `group`'s committed offsets on `topic` to `offsets` (partition → offset), from outside
    /// the group, or — where the broker still lists a killed member (nisshi) — as a member that
    /// joins, commits and leaves (no live member may be in it): what a crash that lost a worker's
    /// commits leaves.
    pub fn commit(&self, group: &str, topic: &str, offsets: &BTreeMap<u32, i64>) {
        let json: BTreeMap<String, i64> =
            offsets.iter().map(|(p, o)| (p.to_string(), *o)).collect();
        let json = serde_json::to_string(&json).unwrap();
        self.tool(&["commit", group, topic, &json], None);
    }
}
