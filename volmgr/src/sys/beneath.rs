//! The one place paths under ROOT are resolved: relative to an open
//! directory, never following a symlink, never leaving that directory, and
//! never crossing a mount point (except, when asked, into a mount on the
//! last component). [`RootDir`](super::root_dir::RootDir) builds on it.
//!
//! Errors keep `openat2(2)`'s meaning, whatever does the work: `ELOOP` for
//! a symlink met on the way, `EXDEV` for a mount point (or an escape),
//! `ENOENT`, `ENOTDIR`.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};

/// Whether the last component may be the root of a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Last {
    /// No: every component, the last included, is on the mount of the
    /// directory the walk starts from.
    OnSameMount,
    /// Yes: the last component may be a mount point, and the descriptor is
    /// then of the mounted directory (a volume's mount: an emptyDir's
    /// tmpfs, a CSI target). The components before it never are.
    MayBeMountRoot,
}

fn resolve(last: Last) -> ResolveFlag {
    let beneath = ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS;
    match last {
        Last::OnSameMount => beneath | ResolveFlag::RESOLVE_NO_XDEV,
        Last::MayBeMountRoot => beneath,
    }
}

/// Opens `path` (relative, made of normal components) under `dir` with
/// `flags` (plus `O_CLOEXEC`). With [`Last::MayBeMountRoot`], `path` must
/// be a single component.
pub fn open(dir: BorrowedFd<'_>, path: &Path, flags: OFlag, last: Last) -> Result<OwnedFd, Errno> {
    debug_assert!(last == Last::OnSameMount || path.components().count() == 1);
    openat2(
        dir,
        path,
        OpenHow::new()
            // RESOLVE_NO_SYMLINKS covers the last component too (ELOOP);
            // O_NOFOLLOW would instead open a final symlink itself.
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(resolve(last)),
    )
}
