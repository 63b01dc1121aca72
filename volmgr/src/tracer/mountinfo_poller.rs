//! The fallback tracer: the kernel signals every change of a mount namespace's
//! table to pollers of `/proc/self/mountinfo` with `POLLPRI` (proc(5)). This
//! watcher waits for that signal on the runtime (an `AsyncFd` registered for
//! priority readiness, so no thread is held), re-reads the table, diffs it
//! with the previous one by mount id and mount point, and asks for a targeted
//! check of the managed paths that changed. It cannot tell who made a change
//! or how long the syscall took; the check tells the manager's own changes
//! apart by its operations in flight.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::watch;

use crate::sys::mountinfo::{self, MountInfo};

use super::check::{CheckSender, Origin, Scope};
use super::out_of_band::DetectedBy;
use super::TracerCounters;

/// Why the poller could not start.
#[derive(Debug, thiserror::Error)]
pub enum PollerError {
    /// Opening or registering `/proc/self/mountinfo` failed.
    #[error("watching /proc/self/mountinfo: {0}")]
    Open(#[source] std::io::Error),
    /// The first read failed.
    #[error(transparent)]
    Read(#[from] mountinfo::MountInfoError),
}

/// One mount, as far as the diff is concerned.
type MountKey = (u32, PathBuf);

/// A running poller.
pub struct MountinfoPoller {
    fd: AsyncFd<File>,
    root: PathBuf,
    last: HashSet<MountKey>,
}

impl MountinfoPoller {
    /// Opens `/proc/self/mountinfo` and registers it for `POLLPRI` on the
    /// current runtime; reads the table once as the base of the diff.
    pub fn open(root: &Path) -> Result<Self, PollerError> {
        let file = File::open("/proc/self/mountinfo").map_err(PollerError::Open)?;
        // SAFETY: the `File` owns its descriptor and moves into the
        // `AsyncFd`, which keeps it open, unchanged, for its whole life.
        let fd = unsafe { AsyncFd::register_with_interest(file, Interest::PRIORITY) }
            .map_err(|e| PollerError::Open(e.into_parts().1))?;
        let last = keys(&mountinfo::read_self()?);
        Ok(Self {
            fd,
            root: root.to_path_buf(),
            last,
        })
    }

    /// Watches until `shutdown`, sending checks for managed paths that changed.
    pub async fn run(
        mut self,
        checks: CheckSender,
        counters: Arc<TracerCounters>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                biased;
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() { return; }
                }
                r = self.fd.ready(Interest::PRIORITY) => match r {
                    Ok(mut guard) => {
                        // Cleared before the read: a change after this point
                        // signals again.
                        guard.clear_ready();
                        self.changed(&checks, &counters);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "mountinfo poller stopped; only the resync remains");
                        return;
                    }
                },
            }
        }
    }

    fn changed(&mut self, checks: &CheckSender, counters: &TracerCounters) {
        let now = match mountinfo::read_self() {
            Ok(t) => keys(&t),
            Err(e) => {
                tracing::warn!(error = %e, "mountinfo poller: cannot read the mount table; checking everything");
                counters.out_of_band_events.fetch_add(1, Ordering::Relaxed);
                checks.check(Scope::All, origin());
                return;
            }
        };
        let changed: Vec<PathBuf> = now
            .symmetric_difference(&self.last)
            .map(|(_, p)| p.clone())
            .collect();
        self.last = now;
        counters
            .events
            .fetch_add(changed.len() as u64, Ordering::Relaxed);
        for scope in scopes(&self.root, changed) {
            counters.out_of_band_events.fetch_add(1, Ordering::Relaxed);
            checks.check(scope, origin());
        }
    }
}

fn origin() -> Origin {
    Origin {
        by: DetectedBy::Mountinfo,
        cause: None,
        boot_ns: None,
    }
}

fn keys(table: &[MountInfo]) -> HashSet<MountKey> {
    table
        .iter()
        .map(|m| (m.mount_id, m.mount_point.clone()))
        .collect()
}

/// The checks that changed mount points call for: one per changed point at
/// or below `root`; everything when `root` itself or one of its ancestors
/// changed.
pub fn scopes(root: &Path, changed: impl IntoIterator<Item = PathBuf>) -> Vec<Scope> {
    let mut out: Vec<Scope> = Vec::new();
    for p in changed {
        let scope = if p.starts_with(root) && p != root {
            Scope::Below(p)
        } else if root.starts_with(&p) {
            Scope::All
        } else {
            continue;
        };
        if scope == Scope::All {
            return vec![Scope::All];
        }
        if !out.contains(&scope) {
            out.push(scope);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_at_or_above_root_matter() {
        let root = Path::new("/var/lib/kubelet");
        let v = PathBuf::from("/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/m");
        assert_eq!(
            scopes(root, [PathBuf::from("/mnt/x"), v.clone(), v.clone()]),
            vec![Scope::Below(v.clone())]
        );
        assert_eq!(
            scopes(root, [v, PathBuf::from("/var/lib")]),
            vec![Scope::All]
        );
        assert_eq!(scopes(root, [PathBuf::from(root)]), vec![Scope::All]);
        assert!(scopes(root, [PathBuf::from("/var/lib/kubelet2")]).is_empty());
    }
}
