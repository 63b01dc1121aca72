//! The fallback tracer: the kernel signals every change of a mount namespace's
//! table to pollers of `/proc/self/mountinfo` with `POLLPRI` (proc(5)). A
//! dedicated thread waits in `poll(2)` for that signal (and for a stop
//! signal on a socket pair), re-reads the table, diffs it with the previous
//! one by mount id and mount point, and asks for a targeted check of the
//! managed paths that changed. It cannot tell who made a change or how long
//! the syscall took; the check tells the manager's own changes apart by its
//! operations in flight.
//!
//! A diff of two reads cannot see a mount and its unmount made between them
//! (the C ABI test hit it about one run in four: the manager mounted, the
//! test unmounted at once, and the poller's next read equalled its last), so
//! a change with an empty diff at or above ROOT checks every managed volume.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use tokio::sync::watch;

use crate::sys::mountinfo;

use super::check::{CheckSender, Origin, Scope};
use super::TracerCounters;
use crate::cache::out_of_band::DetectedBy;

/// Why the poller could not start.
#[derive(Debug, thiserror::Error)]
pub enum PollerError {
    /// Opening `/proc/self/mountinfo` or setting up the thread failed.
    #[error("watching /proc/self/mountinfo: {0}")]
    Open(#[source] std::io::Error),
    /// The first read failed.
    #[error(transparent)]
    Read(#[from] mountinfo::MountInfoError),
}

/// One mount, as far as the diff is concerned.
type MountKey = (u32, PathBuf);

/// The poller, ready to run.
pub struct MountinfoPoller {
    file: File,
    stop_rx: UnixStream,
    /// Taken by the stopping task: writing to it, or dropping it (the task
    /// cancelled with its runtime), ends the thread.
    stop_tx: Option<UnixStream>,
    root: PathBuf,
    last: HashSet<MountKey>,
}

impl MountinfoPoller {
    /// Opens `/proc/self/mountinfo` (a change after this is reported) and
    /// reads the table once as the base of the diff.
    pub fn open(root: &Path) -> Result<Self, PollerError> {
        let file = File::open(mountinfo::SELF_MOUNTINFO).map_err(PollerError::Open)?;
        let (stop_rx, stop_tx) = UnixStream::pair().map_err(PollerError::Open)?;
        let last = read_keys(root)?;
        Ok(Self {
            file,
            stop_rx,
            stop_tx: Some(stop_tx),
            root: root.to_path_buf(),
            last,
        })
    }

    /// Starts the watching thread; the returned task ends it when
    /// `shutdown` turns true. Changes of managed paths are sent to `checks`.
    pub fn spawn(
        mut self,
        checks: CheckSender,
        counters: Arc<TracerCounters>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<tokio::task::JoinHandle<()>, PollerError> {
        let mut stop_tx = self.stop_tx.take().ok_or_else(|| {
            PollerError::Open(std::io::Error::other("the poller was already started"))
        })?;
        let thread = std::thread::Builder::new()
            .name("volmgr-mountinfo".into())
            .spawn(move || self.watch(&checks, &counters))
            .map_err(PollerError::Open)?;
        Ok(tokio::spawn(async move {
            crate::util::shutdown::requested(&mut shutdown).await;
            let _ = stop_tx.write_all(b"x");
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }))
    }

    fn watch(&mut self, checks: &CheckSender, counters: &TracerCounters) {
        loop {
            let (changed, stop) = {
                let mut fds = [
                    PollFd::new(self.file.as_fd(), PollFlags::POLLPRI),
                    PollFd::new(self.stop_rx.as_fd(), PollFlags::POLLIN),
                ];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => {
                        let got =
                            |f: &PollFd, flags| f.revents().is_some_and(|r| r.intersects(flags));
                        (
                            got(&fds[0], PollFlags::POLLPRI | PollFlags::POLLERR),
                            got(&fds[1], PollFlags::POLLIN | PollFlags::POLLHUP),
                        )
                    }
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        tracing::error!(error = %e, "mountinfo poller stopped; only the resync remains");
                        return;
                    }
                }
            };
            if stop {
                return;
            }
            if changed {
                let started = std::time::Instant::now();
                self.changed(checks, counters);
                // Reading a table of tens of thousands of mounts takes
                // milliseconds: during a burst of changes (the manager's own
                // mount storm) pause after a long read (see `duty_pause`).
                // Changes meanwhile stay signalled and are read together next.
                std::thread::sleep(super::duty_pause(started.elapsed()));
            }
        }
    }

    fn changed(&mut self, checks: &CheckSender, counters: &TracerCounters) {
        let now = match read_keys(&self.root) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "mountinfo poller: cannot read the mount table; checking everything");
                if counters.observing {
                    return;
                }
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
        if counters.observing {
            // Observe mode manages nothing: the kubelet's mounts (and the
            // bind of its root onto itself) are its own, not out of band.
            return;
        }
        let mut scopes = scopes(&self.root, changed);
        if scopes.is_empty() {
            // Something changed, but nothing at or above ROOT differs from
            // the last read. That is not proof that nothing there changed: a
            // mount and its unmount between two reads cancel out (seen: the
            // manager mounts a volume, someone unmounts it before this
            // thread got to read, and the diff is empty while the actual
            // state still says mounted). So check everything.
            scopes.push(Scope::All);
        }
        for scope in scopes {
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

/// The mounts that matter — at or below `root`, or above it — read from
/// `/proc/self/mountinfo` taking only each line's mount id and mount point
/// (a full parse allocates a handful of strings per mount, and this runs on
/// every change).
fn read_keys(root: &Path) -> Result<HashSet<MountKey>, mountinfo::MountInfoError> {
    let path = Path::new(mountinfo::SELF_MOUNTINFO);
    let bytes = std::fs::read(path).map_err(|source| mountinfo::MountInfoError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(keys(root, &mountinfo::escape_invalid_utf8(bytes)))
}

fn keys(root: &Path, text: &str) -> HashSet<MountKey> {
    use std::os::unix::ffi::OsStrExt;
    let root_bytes = root.as_os_str().as_bytes();
    let mut out = HashSet::new();
    for line in text.lines() {
        let mut fields = line.split(' ');
        let (Some(id), Some(point)) = (fields.next(), fields.nth(3)) else {
            continue;
        };
        // Cheap filter first: an escaped path that matters shares ROOT's
        // first bytes or is a prefix of them (escapes only lengthen it).
        let b = point.as_bytes();
        if !(b.starts_with(root_bytes) || root_bytes.starts_with(b) || b.contains(&b'\\')) {
            continue;
        }
        let Ok(id) = id.parse::<u32>() else { continue };
        // The full parser decodes the escapes the same way.
        let point = match mountinfo::parse_line(line) {
            Ok(m) => m.mount_point,
            Err(_) => continue,
        };
        if point.starts_with(root) || root.starts_with(&point) {
            out.insert((id, point));
        }
    }
    out
}

/// The checks that changed mount points call for: one per changed point at
/// or below `root`; everything when `root` itself or one of its ancestors
/// changed.
pub fn scopes(root: &Path, changed: impl IntoIterator<Item = PathBuf>) -> Vec<Scope> {
    let mut out: Vec<Scope> = Vec::new();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    for p in changed {
        let scope = if p.starts_with(root) && p != root {
            Scope::Below(p)
        } else if root.starts_with(&p) {
            Scope::All
        } else {
            continue;
        };
        match scope {
            Scope::All => return vec![Scope::All],
            Scope::Below(p) => {
                if seen.insert(p.clone()) {
                    out.push(Scope::Below(p));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_mounts_at_below_or_above_root() {
        let text = "1 0 0:1 / / rw - ext4 /dev/x rw\n\
                    2 1 0:2 / /var/lib/kubelet/pods/u/v rw - tmpfs tmpfs rw\n\
                    3 1 0:3 / /mnt rw - tmpfs tmpfs rw\n\
                    4 1 0:4 / /var/lib/kubelet/a\\040b rw - tmpfs tmpfs rw\n\
                    5 1 0:5 / /var/lib/kubelet2 rw - tmpfs tmpfs rw\n";
        let k = keys(Path::new("/var/lib/kubelet"), text);
        let mut ids: Vec<u32> = k.iter().map(|(i, _)| *i).collect();
        ids.sort();
        assert_eq!(ids, [1, 2, 4]);
        assert!(k.contains(&(4, PathBuf::from("/var/lib/kubelet/a b"))));
    }

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
