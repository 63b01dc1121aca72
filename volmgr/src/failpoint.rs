//! Crash points for the restart tests: `VOLMGR_FAILPOINTS=name[,name...]`
//! makes the process abort (as abruptly as `kill -9`) when it reaches a named
//! point, e.g. between a mount and the bookkeeping that follows it. Unset, a
//! check is one load of an empty list.

use std::sync::OnceLock;

static POINTS: OnceLock<Vec<String>> = OnceLock::new();

/// Aborts the process if the failpoint `name` is armed.
pub fn hit(name: &str) {
    let points = POINTS.get_or_init(|| {
        std::env::var("VOLMGR_FAILPOINTS")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default()
    });
    if points.iter().any(|p| p == name) {
        eprintln!("volmgr: failpoint {name} reached, aborting");
        std::process::abort();
    }
}
