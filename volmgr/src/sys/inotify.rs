//! A non-blocking inotify instance registered with the tokio reactor, as
//! the manifests source and the CSI plugin watcher use it.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::unix::AsyncFd;

/// An inotify instance that tokio can poll.
pub struct InotifyFd(pub Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Why [`watch`] failed.
#[derive(Debug)]
pub enum WatchError {
    /// `inotify_init1` or `inotify_add_watch` failed.
    Inotify(Errno),
    /// Registering with the runtime failed.
    Register(std::io::Error),
}

/// A non-blocking, close-on-exec inotify instance watching `dir` for
/// `mask`, registered with the current runtime, and the watch's descriptor.
pub fn watch(
    dir: &Path,
    mask: AddWatchFlags,
) -> Result<(AsyncFd<InotifyFd>, WatchDescriptor), WatchError> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(WatchError::Inotify)?;
    let wd = inotify.add_watch(dir, mask).map_err(WatchError::Inotify)?;
    // SAFETY: the descriptor is owned by the `Inotify` moved into the
    // `AsyncFd`, stays open for the `AsyncFd`'s whole life, and `as_raw_fd`
    // always returns that same descriptor.
    let fd = unsafe { AsyncFd::register(InotifyFd(inotify)) }
        .map_err(|e| WatchError::Register(std::io::Error::from(e)))?;
    Ok((fd, wd))
}
