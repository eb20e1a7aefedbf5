//! Checkpoints of the file source: the input position up to which everything is durable, so a rerun
//! after a crash resumes there with no loss and no second object for messages already written.
//!
//! Protocol (each step is an atomic rewrite of the checkpoint file: temp file, fsync, rename):
//! 1. Before an object is made visible, its name and the span of input it holds are recorded as
//!    *pending*.
//! 2. Once it is durable, the entry moves to *committed*, and the *watermark* (`offset`) advances to
//!    the start of the oldest message not yet durable (or to the read position).
//! 3. On resume, every pending object is looked up in the store: present ⇒ committed, absent ⇒
//!    dropped (its messages are read again). Reading restarts at the watermark, and a message is
//!    skipped when a committed span of its group covers its offset (a file holds every message of
//!    its group between its first and last one, so spans are exact).
//!
//! An absent pending object is not forgotten: it moves to *replay*. A put the crashed process had
//! already sent can still complete on the server after the process died — after the resumed run
//! looked, even — so the span must be written again under the **same name**, holding exactly the
//! same messages, with put-if-absent ([`crate::upload::ObjectUpload::create_only`]): then whichever
//! copy lands first is the object and the other is refused, never a second object. The writer asks
//! [`Checkpoint::replay_for`] when it opens a file; a replay entry stays (and is looked up again on
//! every resume) until its object is committed or the watermark passes its span.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {path}: not a subsink checkpoint: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("checkpoint {path} belongs to input {recorded:?}, not {given:?}")]
    OtherInput {
        path: PathBuf,
        recorded: String,
        given: String,
    },
}

/// The input span one object holds: byte offsets of the starts of its first and last messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub first: u64,
    pub last: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectSpan {
    pub object: String,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Checkpoint {
    /// The input file, as given on the command line.
    pub source: String,
    /// Watermark: every message starting before this byte offset is durable (or was skipped as
    /// bad input and logged).
    pub offset: u64,
    /// 1-based line number at `offset`.
    pub line: u64,
    /// Objects finalized past the watermark.
    #[serde(default)]
    pub committed: Vec<ObjectSpan>,
    /// Objects being made visible.
    #[serde(default)]
    pub pending: Vec<ObjectSpan>,
    /// Objects a crashed run left pending and not (yet) visible: written again under the same name
    /// with exactly the same span (see the module docs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replay: Vec<ObjectSpan>,
    /// Messages that failed alone (the table writer: not a valid row) and are not done: the
    /// watermark stays before the first of them, and no committed span covers them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FailureRecord>,
}

/// A message that failed alone, and how many deliveries it has had (one per run, or more when
/// the run redelivers it before dead-lettering).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    pub offset: u64,
    pub line: u64,
    pub message_id: String,
    pub attempts: u32,
    pub error: String,
}

impl Checkpoint {
    pub fn new(source: &str) -> Checkpoint {
        Checkpoint {
            source: source.to_string(),
            offset: 0,
            line: 1,
            committed: Vec::new(),
            pending: Vec::new(),
            replay: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Objects of previous runs whose fate is unknown (pending or to replay): look each up in the
    /// store and hand the names found to [`Checkpoint::resolve`].
    pub fn unresolved(&self) -> Vec<String> {
        self.pending
            .iter()
            .chain(&self.replay)
            .map(|p| p.object.clone())
            .collect()
    }

    /// Resume: objects of previous runs found durable (`present`) are committed; the others are to
    /// be written again, under their names, with their spans (`replay`).
    pub fn resolve(&mut self, present: &std::collections::HashSet<String>) {
        let mut previous = std::mem::take(&mut self.pending);
        previous.append(&mut self.replay);
        for p in previous {
            if present.contains(&p.object) {
                if !self.committed.contains(&p) {
                    self.committed.push(p);
                }
            } else if !self.replay.contains(&p) {
                self.replay.push(p);
            }
        }
    }

    /// The object to write again for a file whose first message is the one of `group` at
    /// `offset`: the writer must name the file `object` and finalize it right after the message at
    /// `span.last` (so it holds exactly the span), and write it with put-if-absent.
    pub fn replay_for(&self, group: Option<&str>, offset: u64) -> Option<&ObjectSpan> {
        self.replay
            .iter()
            .find(|r| r.span.group.as_deref() == group && r.span.first == offset)
    }

    /// The object `name` is durable: it is no longer to be replayed.
    pub fn replayed(&mut self, name: &str) {
        self.replay.retain(|r| r.object != name);
    }

    /// Load `path`, or a fresh checkpoint when it does not exist. Temporary files that a crashed
    /// run left beside it (`.<name>.<pid>.tmp`, see [`Checkpoint::save`]) are removed.
    pub fn load_or_new(path: &Path, source: &str) -> Result<Checkpoint, CheckpointError> {
        remove_stale_temp_files(path);
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint::new(source))
            }
            Err(source) => {
                return Err(CheckpointError::Io {
                    path: path.into(),
                    source,
                })
            }
        };
        let cp: Checkpoint = serde_json::from_str(&text).map_err(|e| CheckpointError::Corrupt {
            path: path.into(),
            reason: e.to_string(),
        })?;
        if cp.source != source {
            return Err(CheckpointError::OtherInput {
                path: path.into(),
                recorded: cp.source,
                given: source.to_string(),
            });
        }
        Ok(cp)
    }

    /// Atomically replace the checkpoint file (temp file + fsync + rename + fsync of the folder).
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let io = |source| CheckpointError::Io {
            path: path.into(),
            source,
        };
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let mut tmp = tempfile_in(dir, path).map_err(io)?;
        let text = serde_json::to_vec_pretty(self).expect("serializable");
        tmp.1.write_all(&text).map_err(io)?;
        tmp.1.sync_all().map_err(io)?;
        drop(tmp.1);
        std::fs::rename(&tmp.0, path).map_err(io)?;
        // The rename is durable only once the folder is: a power cut must not bring back the
        // previous checkpoint after objects it does not list were settled on the strength of
        // this one.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
        Ok(())
    }

    /// Was the message of `group` starting at `offset` already written to a committed object?
    pub fn covers(&self, group: Option<&str>, offset: u64) -> bool {
        if self.failed.iter().any(|f| f.offset == offset) {
            return false;
        }
        self.committed.iter().any(|c| {
            c.span.group.as_deref() == group && c.span.first <= offset && offset <= c.span.last
        })
    }

    /// Deliveries so far of the message at `offset` that failed alone (0 if none).
    pub fn attempts(&self, offset: u64) -> u32 {
        self.failed
            .iter()
            .find(|f| f.offset == offset)
            .map_or(0, |f| f.attempts)
    }

    /// Record another failed delivery of a message (or its first).
    pub fn record_failure(
        &mut self,
        offset: u64,
        line: u64,
        message_id: &str,
        attempts: u32,
        error: &str,
    ) {
        self.failed.retain(|f| f.offset != offset);
        self.failed.push(FailureRecord {
            offset,
            line,
            message_id: message_id.to_string(),
            attempts,
            error: error.to_string(),
        });
        self.failed.sort_by_key(|f| f.offset);
    }

    /// The message at `offset` is done (written, or dead-lettered).
    pub fn clear_failure(&mut self, offset: u64) {
        self.failed.retain(|f| f.offset != offset);
    }

    /// Forget committed and replay spans that lie wholly before the watermark.
    pub fn prune(&mut self) {
        let w = self.offset;
        self.committed.retain(|c| c.span.last >= w);
        self.replay.retain(|c| c.span.last >= w);
    }
}

/// Remove `.<name>.<pid>.tmp` files of `path` written by processes other than this one (a run killed
/// between writing its temporary file and renaming it). They never hold the checkpoint: the file
/// at `path` is always whole.
fn remove_stale_temp_files(path: &Path) {
    let Some(base) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!(".{base}.");
    let own = format!(".{base}.{}.tmp", std::process::id());
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let is_temp = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
        if is_temp && name != own {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn tempfile_in(dir: &Path, target: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let base = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "checkpoint".into());
    let tmp = dir.join(format!(".{base}.{}.tmp", std::process::id()));
    let f = std::fs::File::create(&tmp)?;
    Ok((tmp, f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_cover_prune() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cp.json");
        let mut cp = Checkpoint::load_or_new(&p, "in.ndjson").unwrap();
        assert_eq!(cp, Checkpoint::new("in.ndjson"));
        cp.committed.push(ObjectSpan {
            object: "a".into(),
            span: Span {
                group: Some("r1".into()),
                first: 10,
                last: 50,
            },
        });
        cp.offset = 5;
        cp.save(&p).unwrap();
        let back = Checkpoint::load_or_new(&p, "in.ndjson").unwrap();
        assert_eq!(back, cp);
        assert!(back.covers(Some("r1"), 10) && back.covers(Some("r1"), 50));
        assert!(!back.covers(Some("r1"), 51) && !back.covers(None, 20));
        assert!(matches!(
            Checkpoint::load_or_new(&p, "other.ndjson"),
            Err(CheckpointError::OtherInput { .. })
        ));
        cp.offset = 51;
        cp.prune();
        assert!(cp.committed.is_empty());
    }

    #[test]
    fn temp_files_of_crashed_runs_are_removed_on_load() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cp.json");
        Checkpoint::new("in").save(&p).unwrap();
        std::fs::write(dir.path().join(".cp.json.4242.tmp"), b"{").unwrap();
        std::fs::write(dir.path().join(".other.json.4242.tmp"), b"{").unwrap();
        std::fs::write(dir.path().join("cp.json.4242.tmp"), b"{").unwrap();
        Checkpoint::load_or_new(&p, "in").unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [".other.json.4242.tmp", "cp.json", "cp.json.4242.tmp"]
        );
    }

    fn span(object: &str, first: u64, last: u64) -> ObjectSpan {
        ObjectSpan {
            object: object.into(),
            span: Span {
                group: None,
                first,
                last,
            },
        }
    }

    #[test]
    fn absent_pending_objects_are_replayed_under_their_names_until_durable() {
        let mut cp = Checkpoint::new("in");
        cp.pending = vec![span("a", 0, 90), span("b", 100, 190)];
        // "a" landed; "b" did not (yet).
        cp.resolve(&["a".to_string()].into());
        assert_eq!(cp.committed, [span("a", 0, 90)]);
        assert!(cp.pending.is_empty());
        assert_eq!(cp.replay, [span("b", 100, 190)]);
        assert_eq!(cp.replay_for(None, 100), Some(&span("b", 100, 190)));
        assert_eq!(cp.replay_for(None, 0), None);
        assert_eq!(cp.replay_for(Some("k"), 100), None);
        // The next resume looks "b" up again: the crashed put completed late.
        assert_eq!(cp.unresolved(), ["b"]);
        cp.resolve(&["b".to_string()].into());
        assert!(cp.replay.is_empty());
        assert_eq!(cp.committed.len(), 2);
        // Replayed and written: gone; or passed by the watermark: pruned.
        cp.replay = vec![span("c", 200, 290), span("d", 300, 390)];
        cp.replayed("c");
        assert_eq!(cp.replay, [span("d", 300, 390)]);
        cp.offset = 391;
        cp.prune();
        assert!(cp.replay.is_empty());
    }
}
