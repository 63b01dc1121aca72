//! The call journal: one JSON line per call appended to
//! `STATE_DIR/calls.jsonl`:
//! `{"method","volume_id","start_unix_ns","duration_ns","code"}`.
//! `code` is the gRPC code name ("OK", "UNAVAILABLE", ...), "EXIT" for a
//! call during which the process was made to exit, or "CANCELLED" for a call
//! whose caller went away before the answer (work already started on the
//! blocking thread still finishes). `duration_ns` is the
//! driver's own handling time, injected delays and hangs included.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Serialize;

#[derive(Serialize)]
struct Line<'a> {
    method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    volume_id: Option<&'a str>,
    start_unix_ns: u128,
    duration_ns: u128,
    code: &'a str,
}

/// Appends to calls.jsonl.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
}

impl Journal {
    /// The journal in `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join("calls.jsonl"),
        }
    }

    /// Appends one line (a single write, so concurrent calls do not
    /// interleave). Failures are logged, never fail the call.
    pub fn record(
        &self,
        method: &str,
        volume_id: Option<&str>,
        start: SystemTime,
        duration: Duration,
        code: &str,
    ) {
        let line = Line {
            method,
            volume_id,
            start_unix_ns: start
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
            duration_ns: duration.as_nanos(),
            code,
        };
        let res = serde_json::to_vec(&line)
            .map_err(std::io::Error::from)
            .and_then(|mut b| {
                b.push(b'\n');
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o644)
                    .open(&self.path)?
                    .write_all(&b)
            });
        if let Err(e) = res {
            tracing::warn!(path = %self.path.display(), "cannot append to the call journal: {e}");
        }
    }
}
