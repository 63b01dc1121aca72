//! A non-blocking inotify instance registered with the tokio reactor, as
//! the manifests source and the CSI plugin watcher use it, and the one loop
//! that reads and decodes its events.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
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

/// The events [`next_batch`] read in one go.
#[derive(Debug, Default)]
pub struct Batch {
    /// The decoded events, in the order the kernel queued them.
    pub events: Vec<InotifyEvent>,
    /// A read failed (other than `EAGAIN`) and ended the batch early.
    pub error: Option<Errno>,
}

impl Batch {
    /// Whether events may have been lost (the kernel's queue overflowed, or
    /// a read failed): the watcher should look at everything again.
    pub fn lost_events(&self) -> bool {
        self.error.is_some()
            || self
                .events
                .iter()
                .any(|e| e.mask.intersects(AddWatchFlags::IN_Q_OVERFLOW))
    }
}

/// Waits until `fd` is readable, then reads and decodes every queued event
/// (until the instance would block, or a read fails). Cancel-safe: nothing
/// is read before the wait ends, and nothing awaits after it. An error is
/// the runtime's (the reactor is gone).
pub async fn next_batch(fd: &AsyncFd<InotifyFd>) -> std::io::Result<Batch> {
    let mut guard = fd.readable().await?;
    let mut batch = Batch::default();
    loop {
        match guard.get_inner().0.read_events() {
            Ok(events) => batch.events.extend(events),
            Err(Errno::EAGAIN) => {
                guard.clear_ready();
                break;
            }
            Err(e) => {
                guard.clear_ready();
                batch.error = Some(e);
                break;
            }
        }
    }
    Ok(batch)
}
