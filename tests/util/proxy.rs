//! Recording proxies (tests/py/pubsub_proxy.py, tests/py/s3_proxy.py, tests/py/nats_proxy.py):
//! independent witnesses of what a worker does on the wire — every delivery, ack and nack it
//! exchanges with Pub/Sub, every ack it sends to NATS, and the moment each object becomes visible
//! in S3 — and a store that fails or hangs on demand.
//!
//! Each proxy runs in a process group of its own, killed on drop (also when a test panics).

use std::collections::{HashMap, HashSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::{free_port, root, venv_bin, wait_for_port, S3Api, S3Server};

/// A Python helper server on `127.0.0.1:port`.
struct PyServer {
    child: Child,
    port: u16,
}

impl PyServer {
    fn start(script: &str, args: &[String]) -> PyServer {
        let port = free_port();
        let mut child = Command::new(venv_bin("python"))
            .arg(root().join("tests/py").join(script))
            .arg(port.to_string())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {script}: {e}"));
        wait_for_port(port, script, &mut child);
        PyServer { child, port }
    }
}

impl Drop for PyServer {
    fn drop(&mut self) {
        unsafe {
            libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every JSON line of a proxy log.
fn read_log(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with('}'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// A gRPC proxy in front of a Pub/Sub emulator that logs deliveries, acks, nacks and publishes.
pub struct PubsubProxy {
    server: PyServer,
    log: PathBuf,
}

/// What the worker did to Pub/Sub, as the proxy saw it.
#[derive(Debug, Default)]
pub struct PubsubCalls {
    /// Every delivery: `(ack_id, message_id, delivery_attempt)`, in order.
    pub deliveries: Vec<(String, String, i64)>,
    /// Monotonic seconds of each delivery, beside `deliveries`.
    pub delivered_at: Vec<f64>,
    /// Every ack: `(monotonic seconds, message ids, objects visible then when the proxy watches
    /// a bucket)`, in order.
    pub acks: Vec<(f64, Vec<String>, Option<HashSet<String>>)>,
    /// Every ModifyAckDeadline: `(monotonic seconds, message ids, seconds)`, in order.
    pub modacks: Vec<(f64, Vec<String>, i64)>,
    /// Publishes: `(monotonic seconds, topic, messages)`.
    pub publishes: Vec<(f64, String, u64)>,
    /// With flow control ([`PubsubProxy::with_flow_control`]): monotonic seconds of each time a
    /// stream filled and was held back.
    pub withheld: Vec<f64>,
}

impl PubsubCalls {
    /// Message ids acked, with how many times.
    pub fn acked(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for (_, ids, _) in &self.acks {
            for id in ids {
                *out.entry(id.clone()).or_default() += 1;
            }
        }
        out
    }

    /// Message ids nacked (deadline set to 0), with how many times.
    pub fn nacked(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for (_, ids, secs) in &self.modacks {
            if *secs == 0 {
                for id in ids {
                    *out.entry(id.clone()).or_default() += 1;
                }
            }
        }
        out
    }

    /// Message ids delivered at monotonic times in `from..to`.
    pub fn deliveries_between(&self, from: f64, to: f64) -> Vec<&str> {
        self.deliveries
            .iter()
            .zip(&self.delivered_at)
            .filter(|(_, t)| (from..to).contains(*t))
            .map(|((_, id, _), _)| id.as_str())
            .collect()
    }

    /// Deliveries per message id.
    pub fn delivered(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for (_, id, _) in &self.deliveries {
            *out.entry(id.clone()).or_default() += 1;
        }
        out
    }
}

impl PubsubProxy {
    /// A proxy to the emulator at `upstream` (`127.0.0.1:PORT`), logging into `log`. With
    /// `bucket`, each ack records the objects visible in that local folder at that moment.
    pub fn start(upstream: &str, log: &Path, bucket: Option<&Path>) -> PubsubProxy {
        let mut args = vec![upstream.to_string(), log.display().to_string()];
        if let Some(b) = bucket {
            std::fs::create_dir_all(b).unwrap();
            args.push(b.display().to_string());
        }
        PubsubProxy {
            server: PyServer::start("pubsub_proxy.py", &args),
            log: log.to_path_buf(),
        }
    }

    /// A proxy to the emulator at `upstream` that also enforces flow control as Pub/Sub does
    /// (the emulator ignores it): each stream gets no more messages while what it has
    /// outstanding reaches the `max_outstanding_messages` / `max_outstanding_bytes` of its first
    /// request (`pubsub_proxy.py --flow-control`).
    pub fn with_flow_control(upstream: &str, log: &Path) -> PubsubProxy {
        let args = [
            upstream.to_string(),
            log.display().to_string(),
            "--flow-control".to_string(),
        ];
        PubsubProxy {
            server: PyServer::start("pubsub_proxy.py", &args),
            log: log.to_path_buf(),
        }
    }

    /// What `PUBSUB_EMULATOR_HOST` takes to go through the proxy.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.server.port)
    }

    /// Answer the next calls of gRPC `method` (`ListSubscriptions`, `StreamingPull`, `Publish`,
    /// …) with the status `codes` (`UNAVAILABLE`, `PERMISSION_DENIED`, …), one call each, without
    /// passing them on; the calls after those pass again (tests/py/pubsub_proxy.py).
    pub fn fail_next(&self, method: &str, codes: &[&str]) {
        let path = PathBuf::from(format!("{}.faults", self.log.display()));
        let mut plan: serde_json::Map<String, Value> = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        plan.insert(method.to_string(), serde_json::json!(codes));
        let tmp = path.with_extension("faults.tmp");
        std::fs::write(&tmp, Value::Object(plan).to_string()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }

    /// The faults answered so far: `(method, status code)`, in order.
    pub fn faults(&self) -> Vec<(String, String)> {
        read_log(&PathBuf::from(format!("{}.faults.log", self.log.display())))
            .iter()
            .map(|e| {
                (
                    e["method"].as_str().unwrap().to_string(),
                    e["code"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// The calls logged so far, ack ids resolved to message ids (every ack id the worker uses
    /// came in a delivery logged before it).
    pub fn calls(&self) -> PubsubCalls {
        let mut out = PubsubCalls::default();
        let mut by_ack: HashMap<String, String> = HashMap::new();
        let resolve = |by_ack: &HashMap<String, String>, ids: &Value| -> Vec<String> {
            strings(ids)
                .into_iter()
                .map(|a| {
                    by_ack
                        .get(&a)
                        .unwrap_or_else(|| panic!("ack id {a} was never delivered"))
                        .clone()
                })
                .collect()
        };
        for e in read_log(&self.log) {
            let t = e["t"].as_f64().unwrap();
            match e["ev"].as_str().unwrap() {
                "deliver" => {
                    let ack = e["ack_id"].as_str().unwrap().to_string();
                    let id = e["message_id"].as_str().unwrap().to_string();
                    by_ack.insert(ack.clone(), id.clone());
                    out.deliveries
                        .push((ack, id, e["attempt"].as_i64().unwrap_or(0)));
                    out.delivered_at.push(t);
                }
                "ack" => {
                    let visible = e
                        .get("visible")
                        .map(|v| strings(v).into_iter().collect::<HashSet<_>>());
                    out.acks.push((t, resolve(&by_ack, &e["ack_ids"]), visible));
                }
                "modack" => out.modacks.push((
                    t,
                    resolve(&by_ack, &e["ack_ids"]),
                    e["seconds"].as_i64().unwrap(),
                )),
                "publish" => out.publishes.push((
                    t,
                    e["topic"].as_str().unwrap().to_string(),
                    e["count"].as_u64().unwrap(),
                )),
                "withhold" => out.withheld.push(t),
                other => panic!("unknown proxy event {other}"),
            }
        }
        out
    }
}

/// An HTTP proxy in front of moto that logs object writes and fails or hangs them on demand.
pub struct S3Proxy {
    server: PyServer,
    control: PathBuf,
    log: PathBuf,
}

/// One write the S3 proxy passed on or refused.
#[derive(Debug, Clone)]
pub struct S3Write {
    /// Monotonic seconds when the server answered (or the proxy refused).
    pub t: f64,
    /// `bucket/key`.
    pub key: String,
    /// `put`, `create`, `part`, `complete`, `abort`.
    pub kind: String,
    /// HTTP status, or `None` for a write the proxy holds (forever, or while the rule is "hold").
    pub status: Option<u64>,
}

impl S3Proxy {
    /// A proxy in front of `s3`; its control file and log live in `dir`. It passes everything
    /// until [`S3Proxy::set`] says otherwise.
    pub fn start(s3: &S3Server, dir: &Path) -> S3Proxy {
        let control = dir.join("s3-proxy-control.json");
        let log = dir.join("s3-proxy.log");
        std::fs::write(&control, r#"{"mode": "pass"}"#).unwrap();
        let server = PyServer::start(
            "s3_proxy.py",
            &[
                s3.port.to_string(),
                control.display().to_string(),
                log.display().to_string(),
            ],
        );
        S3Proxy {
            server,
            control,
            log,
        }
    }

    /// Change the rule (see tests/py/s3_proxy.py): `{"mode": "deny"}`, `{"mode": "hang"}`,
    /// `{"mode": "error"}` (500s), `{"mode": "pass"}`, `{"deny_object": N}`; with `"key": S`
    /// only for keys containing S. Written atomically; applies to the next request.
    pub fn set(&self, rule: Value) {
        let tmp = self.control.with_extension("tmp");
        std::fs::write(&tmp, rule.to_string()).unwrap();
        std::fs::rename(&tmp, &self.control).unwrap();
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.server.port)
    }

    /// The S3 environment of the server behind it, pointed at the proxy.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        S3Api {
            endpoint: self.endpoint(),
        }
        .env()
    }

    /// Every write logged so far, in order.
    pub fn writes(&self) -> Vec<S3Write> {
        read_log(&self.log)
            .into_iter()
            .map(|e| S3Write {
                t: e["t"].as_f64().unwrap(),
                key: e["key"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches('/')
                    .to_string(),
                kind: e["kind"].as_str().unwrap().to_string(),
                status: e["status"].as_u64(),
            })
            .collect()
    }

    /// Objects that became visible, `(monotonic seconds, bucket/key)`, in the order they did.
    pub fn visible(&self) -> Vec<(f64, String)> {
        self.writes()
            .into_iter()
            .filter(|w| (w.kind == "put" || w.kind == "complete") && w.status == Some(200))
            .map(|w| (w.t, w.key))
            .collect()
    }
}

/// A TCP proxy in front of nats-server that logs every JetStream ack the worker sends
/// (tests/py/nats_proxy.py).
pub struct NatsProxy {
    server: PyServer,
    log: PathBuf,
}

/// The acks a worker sent to NATS, as the proxy saw them.
#[derive(Debug, Default)]
pub struct NatsCalls {
    /// Every `+ACK` read: `(monotonic seconds, stream sequences, objects visible then when the
    /// proxy watches a bucket)`, in order.
    pub acks: Vec<(f64, Vec<u64>, Option<HashSet<String>>)>,
    /// Every other ack (`-NAK`, `+WPI`, `+TERM`): `(monotonic seconds, kind, stream sequences)`.
    pub others: Vec<(f64, String, Vec<u64>)>,
}

impl NatsCalls {
    /// Stream sequences acked (`+ACK`), with how many times.
    pub fn acked(&self) -> HashMap<u64, usize> {
        let mut out = HashMap::new();
        for (_, seqs, _) in &self.acks {
            for s in seqs {
                *out.entry(*s).or_default() += 1;
            }
        }
        out
    }

    /// Stream sequences sent with ack `kind` (`-NAK`, `+WPI`, `+TERM`), with how many times.
    pub fn of_kind(&self, kind: &str) -> HashMap<u64, usize> {
        let mut out = HashMap::new();
        for (_, k, seqs) in &self.others {
            if k == kind {
                for s in seqs {
                    *out.entry(*s).or_default() += 1;
                }
            }
        }
        out
    }
}

impl NatsProxy {
    /// A proxy to the nats-server on 127.0.0.1:`upstream`, logging into `log`. With `bucket`,
    /// each read holding acks records the objects visible in that local folder at that moment.
    pub fn start(upstream: u16, log: &Path, bucket: Option<&Path>) -> NatsProxy {
        let mut args = vec![upstream.to_string(), log.display().to_string()];
        if let Some(b) = bucket {
            std::fs::create_dir_all(b).unwrap();
            args.push(b.display().to_string());
        }
        NatsProxy {
            server: PyServer::start("nats_proxy.py", &args),
            log: log.to_path_buf(),
        }
    }

    /// The URL a worker connects to, to go through the proxy.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.server.port)
    }

    /// The acks logged so far.
    pub fn calls(&self) -> NatsCalls {
        let mut out = NatsCalls::default();
        for e in read_log(&self.log) {
            let t = e["t"].as_f64().unwrap();
            let seqs: Vec<u64> = e["seqs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_u64().unwrap())
                .collect();
            let kind = e["kind"].as_str().unwrap().to_string();
            if kind == "+ACK" {
                let visible = e
                    .get("visible")
                    .map(|v| strings(v).into_iter().collect::<HashSet<_>>());
                out.acks.push((t, seqs, visible));
            } else {
                out.others.push((t, kind, seqs));
            }
        }
        out
    }
}
