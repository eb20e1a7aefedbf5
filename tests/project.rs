//! The project's own settings, checked: what CI runs and what a user's `cargo build --release`
//! makes (issue 43, points 1 and 6).
//!
//! - `scripts/test --self-check` passes: every step of the suite, failing alone, fails the script
//!   with its own exit status, and CI refuses the variables that swap what the tests run.
//! - The release profile carries no debug info (with `debug = 1` a release binary was 847 MB, 139
//!   MB stripped); profiling has a profile of its own that inherits release and keeps it.
//! - README's first section states how long a release build from scratch takes.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `key = value` lines of one `[section]` of a TOML file (no nested tables needed here).
fn section(toml: &str, name: &str) -> Option<Vec<(String, String)>> {
    let header = format!("[{name}]");
    let mut lines = toml.lines().map(str::trim);
    lines.find(|l| *l == header)?;
    Some(
        lines
            .take_while(|l| !l.starts_with('['))
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect(),
    )
}

fn value<'a>(section: &'a [(String, String)], key: &str) -> Option<&'a str> {
    section
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn the_release_profile_has_no_debug_info_and_profiling_has_its_own() {
    let toml = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let release = section(&toml, "profile.release").expect("Cargo.toml has [profile.release]");
    let debug = value(&release, "debug");
    assert!(
        matches!(debug, None | Some("false") | Some("0") | Some("\"none\"")),
        "[profile.release] debug = {debug:?}: a user's release build must carry no debug info"
    );
    // Benches measure what users run: no profile of their own that changes the settings.
    assert!(
        section(&toml, "profile.bench").is_none(),
        "[profile.bench] would make `cargo bench` differ from the release build users make"
    );
    let profiling =
        section(&toml, "profile.profiling").expect("Cargo.toml has [profile.profiling]");
    assert_eq!(value(&profiling, "inherits"), Some("\"release\""));
    let debug = value(&profiling, "debug");
    assert!(
        matches!(
            debug,
            Some("1") | Some("\"line-tables-only\"") | Some("\"limited\"")
        ),
        "[profile.profiling] keeps line tables for profilers, got debug = {debug:?}"
    );
}

#[test]
fn the_readme_states_the_release_build_time_in_its_first_section() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    // The first section: from the title to the second `## ` heading (the first is "Two commands").
    let first: String = readme
        .split("\n## ")
        .take(2)
        .collect::<Vec<_>>()
        .join("\n## ");
    let text = first.split_whitespace().collect::<Vec<_>>().join(" ");
    let at = text
        .find("from scratch")
        .unwrap_or_else(|| panic!("README's first section says nothing of a build from scratch"));
    // A number of minutes within the sentences after it ("… 20–30 min on 2 cores").
    let after: String = text[at..].chars().take(300).collect();
    let minutes = after
        .find(" min")
        .unwrap_or_else(|| panic!("no minutes in {after:?}"));
    assert!(
        after[..minutes].ends_with(|c: char| c.is_ascii_digit()),
        "no number of minutes after \"from scratch\": {after:?}"
    );
}

#[test]
fn a_failing_step_fails_the_test_script() {
    let start = Instant::now();
    let out = Command::new(root().join("scripts/test"))
        .arg("--self-check")
        .env_remove("CI")
        .output()
        .unwrap();
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/test --self-check failed ({:?}):\n{stderr}",
        out.status
    );
    assert!(stderr.contains("--self-check: ok"), "{stderr}");
    // Under a second on an idle machine; the bound leaves room for the test binaries beside it.
    assert!(took < Duration::from_secs(10), "self-check took {took:?}");
}
