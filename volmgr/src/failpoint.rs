//! Crash points for the restart tests: `VOLMGR_FAILPOINTS=name[,name...]`
//! makes the process abort (as abruptly as `kill -9`) when it reaches a named
//! point, e.g. between a mount and the bookkeeping that follows it. Unset, a
//! check is one load of an empty list.

use std::sync::OnceLock;

static POINTS: OnceLock<Vec<String>> = OnceLock::new();

/// Whether the failpoint `name` is armed (for points that do something
/// else than abort, e.g. observe mode's write probe).
pub fn armed(name: &str) -> bool {
    let points = POINTS.get_or_init(|| {
        std::env::var("VOLMGR_FAILPOINTS")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default()
    });
    points.iter().any(|p| p == name)
}

/// Aborts the process if the failpoint `name` is armed.
pub fn hit(name: &str) {
    if armed(name) {
        eprintln!("volmgr: failpoint {name} reached, aborting");
        std::process::abort();
    }
}
