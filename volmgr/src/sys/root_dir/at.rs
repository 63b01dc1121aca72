//! Work relative to a directory the caller holds open: listing it and
//! removing its empty subdirectories without walking from ROOT again (a
//! tear-down that removes a pod's directories level by level opens each
//! level once).

use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::{PathError, RootDir};
use crate::sys::beneath::{self, Last};
use crate::sys::{dirents, SyscallError, Target};

/// What [`RootDir::remove_empty_dir_at`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmptyDirRemoval {
    /// Removed, or already gone.
    Removed,
    /// Kept: it has entries or is a mount point.
    Kept,
}

impl RootDir {
    /// Opens directory `name` under `parent` (a directory on ROOT's mount)
    /// for listing and for removing entries relative to it: on the parent's
    /// mount, never through a symlink. `None` when it does not exist.
    pub fn open_subdir(&self, parent: &Target, name: &OsStr) -> Result<Option<Target>, PathError> {
        let path = parent.path().join(name);
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        match beneath::open(parent.as_fd(), Path::new(name), flags, Last::OnSameMount) {
            Ok(fd) => Ok(Some(Target::new(fd, path))),
            Err(Errno::ENOENT) => Ok(None),
            Err(Errno::ELOOP) => Err(PathError::Escape { path }),
            Err(Errno::EXDEV) => Err(PathError::MountInside { path }),
            Err(e) => Err(SyscallError::new(beneath::call_name(), path, e).into()),
        }
    }

    /// The names in `dir` (from [`open_subdir`](Self::open_subdir): read
    /// once, from its start), without `.` and `..`.
    pub fn list(&self, dir: &Target) -> Result<Vec<OsString>, PathError> {
        let entries = dirents::read_all(dir.as_fd())
            .map_err(|e| SyscallError::new("getdents64", dir.path(), e))?;
        Ok(entries.into_iter().map(|e| e.name).collect())
    }

    /// Removes `parent/name` if it is an empty directory that no mount
    /// covers: one `unlinkat(AT_REMOVEDIR)`, which never follows a symlink,
    /// removes no file and refuses a mount point. Something that is not a
    /// directory is an error.
    pub fn remove_empty_dir_at(
        &self,
        parent: &Target,
        name: &OsStr,
    ) -> Result<EmptyDirRemoval, PathError> {
        match unlinkat(parent.as_fd(), name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(EmptyDirRemoval::Removed),
            Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::EBUSY) => Ok(EmptyDirRemoval::Kept),
            Err(e) => Err(SyscallError::new("unlinkat", parent.path().join(name), e).into()),
        }
    }
}
