//! Golden files: every case under fixtures/golden/ is run with a pinned clock and seed, and every
//! object it writes is compared byte for byte with fixtures/golden/<case>/expected/.
//! Regenerate with `SUBSINK_REGEN_GOLDEN=1 cargo test --test golden` (see fixtures/README.md).

mod util;

use std::path::Path;

use util::*;

#[test]
fn golden_cases() {
    let regen = std::env::var_os("SUBSINK_REGEN_GOLDEN").is_some();
    let golden = root().join("fixtures/golden");
    let mut cases: Vec<_> = std::fs::read_dir(&golden)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.json").exists())
        .collect();
    cases.sort();
    assert!(cases.len() >= 10, "golden cases missing");
    let mut failures = Vec::new();
    for case in &cases {
        let spec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(case.join("case.json")).unwrap())
                .unwrap();
        let out = tempfile::tempdir().unwrap();
        let mut cmd = subsink();
        cmd.current_dir(root()).arg("run");
        for a in spec["args"].as_array().unwrap() {
            cmd.arg(a.as_str().unwrap());
        }
        cmd.arg("--source")
            .arg(spec["input"].as_str().unwrap())
            .arg("--bucket-url")
            .arg(format!("file://{}", out.path().display()));
        run_ok(&mut cmd);
        let expected = case.join("expected");
        if regen {
            let _ = std::fs::remove_dir_all(&expected);
            copy_tree(out.path(), &expected);
            continue;
        }
        let got = files_below(out.path());
        let want = files_below(&expected);
        if got != want {
            failures.push(format!(
                "{}: objects {got:?}, expected {want:?}",
                case.display()
            ));
            continue;
        }
        for f in &got {
            let a = std::fs::read(out.path().join(f)).unwrap();
            let b = std::fs::read(expected.join(f)).unwrap();
            if a != b {
                failures.push(format!(
                    "{}: {f} differs from the golden file",
                    case.display()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn copy_tree(from: &Path, to: &Path) {
    for f in files_below(from) {
        let dest = to.join(&f);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(from.join(&f), dest).unwrap();
    }
}
