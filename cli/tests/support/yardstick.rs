//! What the yardsticks that noise cannot move share (`#[path]`-included
//! by `syscall_yardstick.rs` and `instruction_yardstick.rs`): the storm's
//! manifest, the count of volumes mounted, and the committed figures of
//! BENCHMARKS.md with the check against them.

#![allow(dead_code)]
// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::{Duration, Instant};

/// How much a figure may grow over the committed one.
pub const TOLERANCE: f64 = 1.10;

/// The storm's pod `i`: one `emptyDir{medium: Memory}` used by a
/// container, as one line of JSON.
pub fn manifest(i: usize) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p{i}","namespace":"bench","uid":"uid-{i:05}"}},"spec":{{"containers":[{{"name":"c","image":"i","volumeMounts":[{{"name":"cache","mountPath":"/cache"}}]}}],"volumes":[{{"name":"cache","emptyDir":{{"medium":"Memory","sizeLimit":"16Mi"}}}}]}}}}"#
    )
}

/// The number of mounts below `root` (not `root` itself).
pub fn mounted_below(root: &Path) -> usize {
    let root = root.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|p| p.starts_with(&root) && p != root)
        })
        .count()
}

/// Waits (polling, up to `secs`) until `cond` holds.
pub fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The committed figure of yardstick `key` in BENCHMARKS.md: the second
/// cell of the table row whose first cell is `` `key` ``.
pub fn committed(key: &str) -> f64 {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../BENCHMARKS.md");
    let text = std::fs::read_to_string(path).unwrap();
    let cell = format!("| `{key}` |");
    let line = text
        .lines()
        .find(|l| l.starts_with(&cell))
        .unwrap_or_else(|| panic!("BENCHMARKS.md has no row {cell}"));
    line[cell.len()..]
        .split('|')
        .next()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("BENCHMARKS.md row {cell}: no figure"))
}

/// Fails when `got` (in `unit`) is over the committed figure of `key` by
/// more than [`TOLERANCE`]; `top` (where it goes) is in the message.
pub fn check(key: &str, got: f64, unit: &str, top: &str) {
    let want = committed(key);
    assert!(
        got <= want * TOLERANCE,
        "{key}: {got:.2} {unit}, over the committed {want} by more than 10 % ({top}): cut it, or commit the new figure in BENCHMARKS.md with why"
    );
}
