//! Stopping, killing and waiting on the processes the tests run.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{checkpoint_offset, summary};

/// The stderr of the children [`spawn_draining`] started, by pid: what was read so far, and the
/// thread that reads it.
static DRAINED: Mutex<BTreeMap<u32, Drain>> = Mutex::new(BTreeMap::new());

struct Drain {
    text: Arc<Mutex<Vec<u8>>>,
    reader: JoinHandle<()>,
}

/// Start `cmd` with its stderr read on a thread as it comes: a worker that logs a lot while the
/// test polls it (or reads its stdout first) never blocks on a full pipe. [`stderr_so_far`] and
/// [`wait_for_stderr`] read it while the child runs; [`output`] (and [`terminate`],
/// [`sigterm_ok`], [`kill_9`]) give all of it back once it has exited. The child dies with the
/// thread that spawns it ([`die_with_thread`]; a second time for a command from
/// [`super::subsink`], harmless), so also a worker of a command built without that helper.
pub fn spawn_draining(cmd: &mut Command) -> Child {
    let mut child = die_with_thread(cmd).stderr(Stdio::piped()).spawn().unwrap();
    let mut err = child.stderr.take().expect("stderr is piped");
    let text = Arc::new(Mutex::new(Vec::new()));
    let into = text.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n @ 1..) = err.read(&mut buf) {
            into.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    DRAINED
        .lock()
        .unwrap()
        .insert(child.id(), Drain { text, reader });
    child
}

/// The stderr a child started by [`spawn_draining`] has written so far.
pub fn stderr_so_far(child: &Child) -> String {
    let drained = DRAINED.lock().unwrap();
    let drain = drained
        .get(&child.id())
        .expect("a child started by spawn_draining");
    let text = drain.text.lock().unwrap();
    String::from_utf8_lossy(&text).into_owned()
}

/// Wait until the stderr of `child` (started by [`spawn_draining`]) holds `needle`, polling
/// every 20 ms; panics when the child exits first or `limit` passes. How long it took.
pub fn wait_for_stderr(child: &mut Child, needle: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    while !stderr_so_far(child).contains(needle) {
        if let Some(status) = child.try_wait().unwrap() {
            // What it wrote before it exited may still be on its way through the pipe.
            std::thread::sleep(Duration::from_millis(200));
            let err = stderr_so_far(child);
            assert!(
                err.contains(needle),
                "the worker exited ({status}) without logging {needle:?}: {err}"
            );
            break;
        }
        assert!(
            start.elapsed() < limit,
            "no {needle:?} in the worker's log within {limit:?}: {}",
            stderr_so_far(child)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// Have the kernel SIGKILL `cmd`'s process when the thread that spawns it ends
/// (`PR_SET_PDEATHSIG`). A test runs on a thread of its own, so a worker it started dies with
/// the test — also when the test panics and never reaches its own stop or kill — and with the
/// test binary. The thread that spawns must live as long as the child is meant to.
pub fn die_with_thread(cmd: &mut Command) -> &mut Command {
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() == 1 {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    cmd
}

/// Wait for the child and collect its output, with the stderr its draining thread read when it
/// was started by [`spawn_draining`].
pub fn output(child: Child) -> Output {
    let pid = child.id();
    let mut out = child.wait_with_output().unwrap();
    let drain = DRAINED.lock().unwrap().remove(&pid);
    if let Some(drain) = drain {
        drain.reader.join().unwrap();
        out.stderr = std::mem::take(&mut *drain.text.lock().unwrap());
    }
    out
}

/// Send `signal` to a child.
pub fn signal(child: &Child, signal: i32) {
    unsafe { libc::kill(child.id() as i32, signal) };
}

/// SIGTERM the worker; it must exit 0 within `limit`. Returns (summary, stderr).
pub fn terminate(mut child: Child, limit: Duration) -> (Value, String) {
    signal(&child, libc::SIGTERM);
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = output(child);
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(status.success(), "worker exited {status}: {err}");
            return (summary(&out), err);
        }
        assert!(
            start.elapsed() < limit,
            "worker still running {limit:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM the worker and wait for it; it must exit 0. Returns its output and stderr.
pub fn sigterm_ok(child: Child) -> (Output, String) {
    signal(&child, libc::SIGTERM);
    let out = output(child);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    (out, err)
}

/// SIGKILL the child and reap it; its stderr.
pub fn kill_9(mut child: Child) -> String {
    signal(&child, libc::SIGKILL);
    let _ = child.wait();
    let out = output(child);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The next number of a xorshift64 sequence (the tests' reproducible randomness).
pub fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Call `attempt` every `every` until it gives a value; past `limit` panic with its last error.
pub fn poll<T>(
    limit: Duration,
    every: Duration,
    mut attempt: impl FnMut() -> Result<T, String>,
) -> T {
    let start = Instant::now();
    loop {
        match attempt() {
            Ok(v) => return v,
            Err(e) => assert!(start.elapsed() < limit, "{e}"),
        }
        std::thread::sleep(every);
    }
}

/// How [`kill_after_progress`] times its kill.
pub struct KillTiming {
    /// How long the run may take to move its watermark.
    pub limit: Duration,
    /// How often the checkpoint is read.
    pub every: Duration,
    /// The kill lands up to this many milliseconds (random) after the progress.
    pub jitter_ms: u64,
}

/// `rounds` crashes in a row: each spawns a run (`spawn`), kills it with [`kill_after_progress`]
/// (2 ms polls, up to 40 ms after its progress, 60 s for it) and asserts the watermark moved and is
/// still inside the input of `size` bytes, so every round is a crash mid-input. The last watermark.
pub fn kill_rounds(
    rounds: usize,
    cp: &Path,
    size: u64,
    seed: &mut u64,
    mut spawn: impl FnMut() -> Child,
) -> u64 {
    let mut last = 0;
    for round in 0..rounds {
        let timing = KillTiming {
            limit: Duration::from_secs(60),
            every: Duration::from_millis(2),
            jitter_ms: 40,
        };
        let now = kill_after_progress(spawn(), cp, last, seed, timing, &format!("round {round}"));
        assert!(
            now > last && now < size,
            "round {round}: watermark {now} (was {last}, input {size})"
        );
        eprintln!("kill round {round}: watermark {last} -> {now} of {size} bytes");
        last = now;
    }
    last
}

/// Wait until the run's checkpoint `cp` passes `last`, then a random moment later SIGKILL it (it
/// must still be running: every round is a crash). Returns the watermark after the kill.
pub fn kill_after_progress(
    mut child: Child,
    cp: &Path,
    last: u64,
    seed: &mut u64,
    timing: KillTiming,
    label: &str,
) -> u64 {
    let start = Instant::now();
    while checkpoint_offset(cp).is_none_or(|o| o <= last) {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{label}: the run ended ({status}) before the kill");
        }
        assert!(
            start.elapsed() < timing.limit,
            "{label}: no progress in {} s",
            timing.limit.as_secs()
        );
        std::thread::sleep(timing.every);
    }
    std::thread::sleep(Duration::from_millis(xorshift(seed) % timing.jitter_ms));
    assert!(
        child.try_wait().unwrap().is_none(),
        "{label}: the run finished before the kill (watermark was {last}, now {:?}): not a \
         crash test; give the test more input",
        checkpoint_offset(cp)
    );
    let _ = child.kill();
    let _ = output(child);
    checkpoint_offset(cp).unwrap()
}
