//! The replay progress bar: a file replayed on a terminal shows how far it is (% of the file,
//! bytes, messages, messages/s, ETA) on stderr. Nothing is drawn when stderr is not a terminal
//! (a pipe, a log file, a container), so logs and scripts never see it.
//!
//! The file source owns the bar and updates it once per parsed block (hundreds of messages), so it
//! costs an atomic add and a rate-limited redraw per block, not per message. Log lines written
//! through [`super::logs::StderrWriter`] hide the bar while they are written ([`suspend`]).

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// The bar being drawn, if any: log lines hide it while they are written.
static ACTIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Run `f` (a write to stderr) with the active progress bar, if any, hidden.
pub fn suspend<R>(f: impl FnOnce() -> R) -> R {
    let bar = ACTIVE.lock().ok().and_then(|g| g.clone());
    match bar {
        Some(bar) => bar.suspend(f),
        None => f(),
    }
}

const TEMPLATE: &str = "{spinner} [{elapsed_precise}] [{bar:30}] {percent:>3}% \
                        {bytes}/{total_bytes} {msgs} msgs {msg_rate} msg/s ETA {eta}";

const ARCHIVE_TEMPLATE: &str = "{spinner} [{elapsed_precise}] [{bar:30}] {percent:>3}% {msg} \
                                {bytes}/{total_bytes} {msgs} msgs {msg_rate} msg/s ETA {eta}";

/// A progress bar over one input file.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    messages: Arc<AtomicU64>,
}

impl Progress {
    /// A bar for replaying `path` from byte `start_offset`, when stderr is a terminal and `path`
    /// is a regular file (its size is the 100 %); `None` otherwise.
    pub fn for_file(path: &Path, start_offset: u64) -> Option<Progress> {
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return None;
        }
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_file() {
            return None; // a FIFO or a device has no size to measure against
        }
        let p = Progress::new(meta.len(), start_offset, ProgressDrawTarget::stderr());
        p.bar.enable_steady_tick(Duration::from_millis(200));
        *ACTIVE.lock().expect("progress lock") = Some(p.bar.clone());
        Some(p)
    }

    /// A bar for reading an archive: `total_bytes` of `objects` objects listed (the archive
    /// source, docs/replay.md), when stderr is a terminal; `None` otherwise.
    pub fn for_archive(total_bytes: u64, objects: u64) -> Option<Progress> {
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return None;
        }
        let p = Progress::with_template(
            total_bytes,
            0,
            ProgressDrawTarget::stderr(),
            ARCHIVE_TEMPLATE,
        );
        p.bar.set_message(format!("0/{objects} objects"));
        p.bar.enable_steady_tick(Duration::from_millis(200));
        *ACTIVE.lock().expect("progress lock") = Some(p.bar.clone());
        Some(p)
    }

    /// Archive: `done` objects read, `bytes` of them.
    pub fn object_done(&self, done: u64, bytes: u64) {
        let total = self
            .bar
            .message()
            .split_once('/')
            .map(|(_, t)| t.to_string())
            .unwrap_or_default();
        self.bar.set_message(format!("{done}/{total}"));
        self.bar.set_position(bytes);
    }

    fn new(len: u64, start_offset: u64, target: ProgressDrawTarget) -> Progress {
        Progress::with_template(len, start_offset, target, TEMPLATE)
    }

    fn with_template(
        len: u64,
        start_offset: u64,
        target: ProgressDrawTarget,
        template: &str,
    ) -> Progress {
        let messages = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&messages);
        let rate = Arc::clone(&messages);
        let style = ProgressStyle::with_template(template)
            .expect("valid template")
            .with_key(
                "msgs",
                move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{}", count.load(Ordering::Relaxed));
                },
            )
            .with_key(
                "msg_rate",
                move |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                    let secs = s.elapsed().as_secs_f64();
                    let n = rate.load(Ordering::Relaxed) as f64;
                    let per = if secs > 0.0 { n / secs } else { 0.0 };
                    let _ = write!(w, "{}", human(per));
                },
            )
            .progress_chars("=> ");
        let bar = ProgressBar::with_draw_target(Some(len), target).with_style(style);
        bar.set_position(start_offset.min(len));
        Progress { bar, messages }
    }

    /// `messages` more messages were read, and the input is consumed up to byte `offset`.
    pub fn advance(&self, messages: u64, offset: u64) {
        self.messages.fetch_add(messages, Ordering::Relaxed);
        self.bar.set_position(offset);
    }

    /// The end of the input: draw the final state and leave it on screen.
    pub fn finish(&self) {
        end(&self.bar, ProgressBar::finish);
    }
}

impl Drop for Progress {
    /// Stopped early (a bad line under `fail`, a shutdown): leave the bar where it stopped.
    fn drop(&mut self) {
        end(&self.bar, ProgressBar::abandon);
    }
}

/// Leave `bar` on screen (`how`: finished or abandoned) and end its line, so what stderr gets
/// next (a log line) starts on a line of its own. Under the lock log lines take to hide the bar.
fn end(bar: &ProgressBar, how: fn(&ProgressBar)) {
    let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    if !bar.is_finished() {
        let drawn = !bar.is_hidden();
        how(bar);
        if drawn {
            let _ = writeln!(std::io::stderr());
        }
    }
    if active.as_ref().is_some_and(|b| b.is_finished()) {
        *active = None;
    }
}

/// `1234567.0` → `1.23M`, `45210.0` → `45.2k`, `12.5` → `12`.
fn human(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_like_a_person_would() {
        assert_eq!(human(1_234_567.0), "1.23M");
        assert_eq!(human(45_210.0), "45.2k");
        assert_eq!(human(12.5), "12");
    }

    #[test]
    fn counts_messages_and_offset() {
        let p = Progress::new(1000, 100, ProgressDrawTarget::hidden());
        assert_eq!(p.bar.position(), 100);
        p.advance(3, 400);
        p.advance(2, 1000);
        assert_eq!(p.messages.load(Ordering::Relaxed), 5);
        assert_eq!(p.bar.position(), 1000);
        p.finish();
        assert!(p.bar.is_finished());
    }
}
