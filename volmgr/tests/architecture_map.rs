//! `docs/ARCHITECTURE.md` is the map of today's code: every file it names
//! exists, and every source file of the library, the API source, the
//! binary and the C ABI is named in it. It named files that had moved
//! (`plugins/csi/stats.rs`, `volumemanager/csi.rs`) and omitted dozens.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The crates' source folders the map must cover, from the repository root.
const SOURCE_DIRS: [&str; 4] = ["volmgr/src", "volmgr-kube/src", "cli/src", "ffi/src"];

/// File name endings of the names the test checks in the document.
const CHECKED: [&str; 6] = [".rs", ".h", ".sh", ".proto", ".c", ".toml"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every file under `dir`, as paths relative to the repository root (no
/// build output, no hidden folders).
fn files_under(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(root.join(dir)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        let rel = dir.join(&name);
        match e.file_type() {
            Ok(t) if t.is_dir() => files_under(root, &rel, out),
            Ok(t) if t.is_file() => out.push(rel.to_string_lossy().into_owned()),
            _ => {}
        }
    }
}

/// The backquoted names in `doc` that end like a source file.
fn named(doc: &str) -> BTreeSet<String> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| !w.contains(char::is_whitespace))
        .filter(|w| CHECKED.iter().any(|ext| w.ends_with(ext)))
        .map(str::to_string)
        .collect()
}

fn architecture() -> String {
    fs::read_to_string(repo().join("docs/ARCHITECTURE.md")).unwrap()
}

#[test]
fn every_file_the_map_names_exists() {
    let root = repo();
    let mut files = Vec::new();
    files_under(&root, Path::new(""), &mut files);
    let base: BTreeSet<&str> = files
        .iter()
        .filter_map(|f| Path::new(f).file_name()?.to_str())
        .collect();
    let missing: Vec<String> = named(&architecture())
        .into_iter()
        .filter(|n| match n.contains('/') {
            true => !files
                .iter()
                .any(|f| f == n || f.ends_with(&format!("/{n}"))),
            false => !base.contains(n.as_str()),
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md names files that do not exist: {missing:?}"
    );
}

/// A test-only file (a `tests.rs` beside its module or a `tests/` folder,
/// the ports of the kubelet's test tables that docs/KUBELET-SCENARIOS.md
/// maps).
fn test_only(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "tests")
        || matches!(
            path.file_name().and_then(|n| n.to_str()),
            Some("tests.rs" | "kubelet_scenarios.rs")
        )
}

#[test]
fn every_source_file_is_on_the_map() {
    let root = repo();
    let doc = architecture();
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        files_under(&root, Path::new(dir), &mut files);
    }
    let unnamed: Vec<&String> = files
        .iter()
        .filter(|f| f.ends_with(".rs") && !test_only(Path::new(f)))
        .filter(|f| {
            let p = Path::new(f.as_str());
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let parent = p
                .parent()
                .and_then(|d| d.file_name())
                .and_then(|n| n.to_str())
                .unwrap_or("");
            let on_map = match name {
                // A folder's root file: the folder named is enough.
                "mod.rs" | "lib.rs" => doc.contains(&format!("{parent}/")),
                _ => {
                    doc.contains(&format!("`{name}`")) || doc.contains(&format!("{parent}/{name}"))
                }
            };
            !on_map
        })
        .collect();
    assert!(
        unnamed.is_empty(),
        "source files docs/ARCHITECTURE.md does not name (add each where its layer is described): {unnamed:#?}"
    );
}

#[test]
fn the_check_sees_a_planted_name() {
    let doc = "`volmgr/src/no_such_file.rs` and `sync.rs`, not `a b.rs`";
    let n = named(doc);
    assert!(n.contains("volmgr/src/no_such_file.rs") && n.contains("sync.rs"));
    assert_eq!(n.len(), 2, "{n:?}");
}
