//! The `memory://` test source (`src/source/memory/`, a folder and one registry line) through the
//! binary: `subsink run --source memory://N` into a local-folder bucket writes every message once,
//! in Text objects of at most `maxMessages` messages; its flags are checked as every source's are.

mod util;

use util::*;

#[test]
fn memory_source_messages_are_written_once_into_a_local_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = subsink()
        .args(["run", "--source", "memory://2500"])
        .arg("--subscription")
        .arg(root.join("examples/storage-text.json"))
        .arg("--bucket-url")
        .arg(format!("file://{}", bucket.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = summary(&out);
    assert_eq!(summary["messages_read"], 2500, "{summary}");
    assert_eq!(summary["messages_written"], 2500, "{summary}");
    assert_eq!(summary["source"], "memory://2500", "{summary}");

    // maxMessages 1000: objects of 1000, 1000 and 500 messages.
    let objects = files_below(&bucket);
    let mut sizes: Vec<usize> = objects
        .iter()
        .map(|o| {
            std::fs::read_to_string(bucket.join(o))
                .unwrap()
                .lines()
                .count()
        })
        .collect();
    sizes.sort();
    assert_eq!(sizes, [500, 1000, 1000], "{objects:?}");
    let mut lines: Vec<String> = objects
        .iter()
        .flat_map(|o| {
            let text = std::fs::read_to_string(bucket.join(o)).unwrap();
            text.lines().map(str::to_string).collect::<Vec<_>>()
        })
        .collect();
    lines.sort();
    let mut want: Vec<String> = (0..2500).map(|i| format!("message {i}")).collect();
    want.sort();
    assert_eq!(lines, want);
}

#[test]
fn memory_source_flags_are_checked_before_anything_starts() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (source, more, want) in [
        (
            "memory://many",
            &[][..],
            "give the number of messages to make",
        ),
        (
            "memory://5",
            &["--checkpoint", "cp"][..],
            "makes its messages anew",
        ),
        (
            "memory://5",
            &["--kafka-topic", "t"][..],
            "need --source kafka://",
        ),
    ] {
        let out = subsink()
            .args(["run", "--source", source])
            .args(more)
            .arg("--subscription")
            .arg(root.join("examples/storage-text.json"))
            .args(["--bucket-url", "file:///nonexistent-subsink-test"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{source} {more:?}: {stderr}");
        assert!(stderr.contains(want), "{source} {more:?}: {stderr}");
    }
}
