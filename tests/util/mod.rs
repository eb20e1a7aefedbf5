//! Shared helpers of the integration tests: run the real binary, start real servers, read files back
//! with readers nobody here wrote.
#![allow(dead_code)]

pub mod emulator;
pub mod proxy;
pub mod servers;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

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

/// Run a Python `script` of the test venv with `arg`, `env` added; its stdout parsed as JSON.
pub fn python_json(script: &str, arg: &str, env: &[(&str, String)]) -> serde_json::Value {
    let out = Command::new(venv_bin("python"))
        .arg("-c")
        .arg(script)
        .arg(arg)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The subsink binary built for this test run.
pub fn subsink() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_subsink"));
    c.env("SUBSINK_LOG", "warn");
    c
}

pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawn subsink");
    assert!(
        out.status.success(),
        "subsink failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The run summary the binary prints on stdout.
pub fn summary(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("summary {line:?}: {e}"))
}

/// Every file below `dir`, as paths relative to it, sorted.
pub fn files_below(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
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

/// Read Avro files with fastavro; one JSON object per file (see tests/py/avro_dump.py).
pub fn fastavro_dump(files: &[PathBuf]) -> Vec<serde_json::Value> {
    let out = Command::new(venv_bin("python"))
        .arg(root().join("tests/py/avro_dump.py"))
        .args(files)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "fastavro failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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
/// also when a test panics; see [`servers::guard`]).
pub struct S3Server {
    child: servers::Guarded,
    pub port: u16,
}

impl S3Server {
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
        S3Server { child, port }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Environment for object_store's `AmazonS3Builder::from_env` and for boto3.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ENDPOINT", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "testtesttest".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
            ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false".into()),
        ]
    }

    /// Run a snippet of Python with boto3 against this server; returns stdout.
    pub fn python(&self, code: &str) -> String {
        let mut c = Command::new(venv_bin("python"));
        c.arg("-c").arg(code);
        for (k, v) in self.env() {
            c.env(k, v);
        }
        let out = c.output().expect("python");
        assert!(
            out.status.success(),
            "python failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn create_bucket(&self, bucket: &str) {
        self.python(&format!(
            "import boto3; boto3.client('s3').create_bucket(Bucket='{bucket}')"
        ));
    }

    /// `(key, size)` of every object in a bucket, sorted by key.
    pub fn list(&self, bucket: &str) -> Vec<(String, u64)> {
        let out = self.python(&format!(
            "import boto3, json\n\
             s3 = boto3.client('s3')\n\
             keys = []\n\
             for page in s3.get_paginator('list_objects_v2').paginate(Bucket='{bucket}'):\n    keys += [[o['Key'], o['Size']] for o in page.get('Contents', [])]\n\
             print(json.dumps(sorted(keys)))"
        ));
        serde_json::from_str(out.trim()).unwrap()
    }

    /// Download an object to `dest`; returns its Content-Type.
    pub fn download(&self, bucket: &str, key: &str, dest: &Path) -> String {
        self.python(&format!(
            "import boto3\n\
             s3 = boto3.client('s3')\n\
             r = s3.get_object(Bucket='{bucket}', Key={key:?})\n\
             open({dest:?}, 'wb').write(r['Body'].read())\n\
             print(r.get('ContentType', ''))",
            dest = dest.display().to_string()
        ))
        .trim()
        .to_string()
    }

    /// Download every object of a bucket into `dir` (one file per object, numbered in key
    /// order); returns `(key, local path, Content-Type)`, sorted by key.
    pub fn download_all(&self, bucket: &str, dir: &Path) -> Vec<(String, PathBuf, String)> {
        std::fs::create_dir_all(dir).unwrap();
        let out = self.python(&format!(
            "import boto3, json, os\n\
             s3 = boto3.client('s3')\n\
             keys = []\n\
             for page in s3.get_paginator('list_objects_v2').paginate(Bucket='{bucket}'):\n    keys += [o['Key'] for o in page.get('Contents', [])]\n\
             out = []\n\
             for i, k in enumerate(sorted(keys)):\n    r = s3.get_object(Bucket='{bucket}', Key=k)\n    p = os.path.join({dir:?}, '%06d' % i)\n    open(p, 'wb').write(r['Body'].read())\n    out.append([k, p, r.get('ContentType', '')])\n\
             print(json.dumps(out))",
            dir = dir.display().to_string()
        ));
        let v: Vec<(String, String, String)> = serde_json::from_str(out.trim()).unwrap();
        v.into_iter()
            .map(|(k, p, c)| (k, PathBuf::from(p), c))
            .collect()
    }

    /// Multipart uploads still open in a bucket (none may remain after an abort).
    pub fn open_multipart_uploads(&self, bucket: &str) -> usize {
        self.python(&format!(
            "import boto3; print(len(boto3.client('s3').list_multipart_uploads(Bucket='{bucket}').get('Uploads', [])))"
        ))
        .trim()
        .parse()
        .unwrap()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.child.kill();
    }
}

/// `n` messages as NDJSON in `path`: data `data_len` bytes of one letter, attribute `i`, ids
/// `100000 + i`, publish times 1 µs apart. Returns the ids in order.
pub fn write_numbered_messages(path: &Path, n: usize, data_len: usize) -> Vec<String> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut ids = Vec::new();
    for i in 0..n {
        let m = subsink::message::Message {
            data: vec![b'a' + (i % 26) as u8; data_len].into(),
            attributes: [("i".to_string(), i.to_string())].into(),
            message_id: format!("{}", 100_000 + i),
            publish_time_micros: 1_700_000_000_000_000 + i as i64,
            ordering_key: String::new(),
        };
        writeln!(f, "{}", m.to_json_line()).unwrap();
        ids.push(m.message_id);
    }
    ids
}
