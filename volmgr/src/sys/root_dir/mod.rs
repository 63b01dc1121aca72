//! Safe file-system access beneath the manager's root directory.
//!
//! Everything the manager creates, opens or deletes under `ROOT` goes through
//! [`RootDir`]: paths are made of validated components, and every lookup is
//! relative to an open descriptor (see [`beneath`]): no symlink is followed,
//! nothing outside the starting directory is reached.
//!
//! # The mount rule
//!
//! Every `open`, `mkdir` and `unlink` under ROOT is made relative to a
//! descriptor that is on ROOT's own mount, and every lookup stays on the
//! mount it starts from (`RESOLVE_NO_XDEV`), so a mount someone placed under
//! ROOT is never crossed, at any depth, including the parent directories
//! looked up on the way:
//!
//! - a lookup that meets a mount point fails with
//!   [`PathError::ForeignMount`], which names it;
//! - the one exception is the last component of a volume's mount target
//!   ([`RootDir::open_mount_target`], [`RootDir::mkdir_mount_target`]),
//!   which may be the root of the volume's own mount (an emptyDir's tmpfs,
//!   a CSI target): the directories before it may not. A walk below such a
//!   descriptor stays on that mount in turn;
//! - a new directory is created one level at a time, each `mkdirat`
//!   relative to the directory just opened, so a component swapped for a
//!   symlink or a mount meanwhile makes the call fail instead of creating
//!   anything elsewhere;
//! - deletion never follows a symlink and stops at any mount, whether it
//!   is met on the way down (`RESOLVE_NO_XDEV`: [`PathError::MountInside`])
//!   or is the directory to remove (`EBUSY`).
//!
//! Held descriptors (ROOT's, the cached `pods`) stay on ROOT's mount even
//! if something is mounted over their path later: work through them then
//! lands in the covered directory, never in the mount.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::sys::beneath::{self, Last};
use crate::sys::{dirents, mount_id, SyscallError, Target};

mod at;
mod error;
mod files;
mod mkdir;
mod rel_path;
mod remove;
#[cfg(test)]
mod tests;

pub use at::EmptyDirRemoval;
pub use error::PathError;
pub use rel_path::{check_component, RelPath};

/// The manager's root directory, held open.
#[derive(Debug)]
pub struct RootDir {
    path: PathBuf,
    fd: OwnedFd,
    /// First-level directories (`pods`, `plugins`) held open, so creating a
    /// new pod's directories does not walk to them every time. A cached
    /// directory that was deleted meanwhile is noticed (`ENOENT` from
    /// `mkdirat`) and reopened. ROOT and these directories belong to the
    /// manager: renaming them away while it runs is not supported.
    top_dirs: Mutex<Vec<(OsString, Arc<OwnedFd>)>>,
}

const DIR_PATH: OFlag = OFlag::O_PATH.union(OFlag::O_DIRECTORY);

/// The largest state file [`RootDir::read_file`] reads.
pub const MAX_STATE_FILE_BYTES: u64 = 1 << 20;

/// A directory [`RootDir::mkdir_mount_target_in`] made or opened.
#[derive(Debug)]
pub struct MadeDir {
    /// The directory.
    pub target: Target,
    /// Its parent, still open from the walk, when this call created the
    /// directory (so the walk went through the parent); `None` otherwise.
    pub parent: Option<Target>,
    /// Whether this call created the directory (then nothing can be
    /// mounted on it yet).
    pub created: bool,
}

impl RootDir {
    /// Creates (if needed) and opens the root. The root itself may be reached
    /// through symlinks chosen by the operator; it is canonicalized once here.
    pub fn open(path: &Path) -> Result<Self, PathError> {
        std::fs::create_dir_all(path).map_err(|e| SyscallError::io("mkdir", path, e))?;
        let path = path
            .canonicalize()
            .map_err(|e| SyscallError::io("realpath", path, e))?;
        let fd = nix::fcntl::open(&path, DIR_PATH | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| SyscallError::new("open", &path, e))?;
        Ok(Self {
            path,
            fd,
            top_dirs: Mutex::new(Vec::new()),
        })
    }

    /// The absolute, canonical path of the root.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The absolute path of `rel`.
    pub fn abs(&self, rel: &RelPath) -> PathBuf {
        self.path.join(rel.as_path())
    }

    /// Opens `rel` with `flags`: every component on ROOT's mount, but the
    /// last one with [`Last::MayBeMountRoot`].
    fn open_rel(&self, rel: &RelPath, flags: OFlag, last: Last) -> Result<OwnedFd, PathError> {
        if last == Last::MayBeMountRoot {
            if let Some((parent_rel, name)) = rel.split_last() {
                let parent = match parent_rel.as_path().as_os_str().is_empty() {
                    true => None,
                    false => Some(self.open_rel(&parent_rel, DIR_PATH, Last::OnSameMount)?),
                };
                let dir = parent.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
                return beneath::open(dir, Path::new(name), flags, last)
                    .map_err(|e| self.map_err(beneath::call_name(), rel, e));
            }
        }
        let target = if rel.as_path().as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel.as_path()
        };
        beneath::open(self.fd.as_fd(), target, flags, Last::OnSameMount)
            .map_err(|e| self.map_err(beneath::call_name(), rel, e))
    }

    /// Opens directory `name` (one component) under `parent`, a directory
    /// on ROOT's mount; `rel` is the whole path (for errors).
    fn open_component(
        &self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        last: Last,
        rel: &RelPath,
    ) -> Result<OwnedFd, PathError> {
        beneath::open(parent, Path::new(name), DIR_PATH, last)
            .map_err(|e| self.map_err(beneath::call_name(), rel, e))
    }

    fn map_err(&self, call: &'static str, rel: &RelPath, e: Errno) -> PathError {
        match e {
            Errno::ELOOP => PathError::Escape {
                path: self.abs(rel),
            },
            Errno::EXDEV => PathError::ForeignMount {
                mount: self
                    .first_foreign_mount(rel)
                    .unwrap_or_else(|| self.abs(rel)),
                path: self.abs(rel),
            },
            e => PathError::Syscall(SyscallError::new(call, self.abs(rel), e)),
        }
    }

    /// The first directory on the way to `rel` that is not on ROOT's mount
    /// (for the error that refuses to cross it).
    fn first_foreign_mount(&self, rel: &RelPath) -> Option<PathBuf> {
        let root = mount_id::of_fd(self.fd.as_fd()).ok()?;
        let mut prefix = PathBuf::new();
        for c in rel.as_path() {
            prefix.push(c);
            let name = CString::new(prefix.as_os_str().as_bytes()).ok()?;
            let key = mount_id::at(self.fd.as_fd(), &name).ok()?;
            let want = mount_id::of_fd_like(self.fd.as_fd(), key).unwrap_or(root);
            if key != want {
                return Some(self.path.join(&prefix));
            }
        }
        None
    }

    /// Opens an existing directory, every component of `rel` (the last
    /// included) on ROOT's own mount: the parent of a mount point, a
    /// directory to list or to delete from.
    pub fn open_dir(&self, rel: &RelPath) -> Result<Target, PathError> {
        let fd = self.open_rel(rel, DIR_PATH, Last::OnSameMount)?;
        Ok(Target::new(fd, self.abs(rel)))
    }

    /// [`RootDir::open_dir`], `None` when the directory is not there: what
    /// a tear-down that finds nothing left to do opens.
    pub fn open_dir_if_there(&self, rel: &RelPath) -> Result<Option<Target>, PathError> {
        match self.open_dir(rel) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The parent directory of `rel` (opened as [`RootDir::open_dir`]) and
    /// `rel`'s last name; `None` when `rel` is empty or its parent is not
    /// there.
    pub fn open_parent_if_there<'a>(
        &self,
        rel: &'a RelPath,
    ) -> Result<Option<(Target, &'a OsStr)>, PathError> {
        let Some((parent, name)) = rel.split_last() else {
            return Ok(None);
        };
        Ok(self.open_dir_if_there(&parent)?.map(|d| (d, name)))
    }

    /// Opens an existing entry of any type (`O_PATH`, never following a
    /// symlink, even as the last component), which may be the root of a
    /// mount (a device file a driver published, the directories on the way
    /// may not be): a file to bind-mount from or onto, named for `mount(2)`
    /// through [`Target::proc_path`].
    pub fn open_path(&self, rel: &RelPath) -> Result<Target, PathError> {
        let fd = self.open_rel(rel, OFlag::O_PATH, Last::MayBeMountRoot)?;
        Ok(Target::new(fd, self.abs(rel)))
    }

    /// Opens an existing directory that may be the root of a volume's mount
    /// (the directories on the way may not): to mount on it again, read its
    /// mount id or set its ownership.
    pub fn open_mount_target(&self, rel: &RelPath) -> Result<Target, PathError> {
        let fd = self.open_rel(rel, DIR_PATH, Last::MayBeMountRoot)?;
        Ok(Target::new(fd, self.abs(rel)))
    }

    /// Whether `rel` exists (without following symlinks).
    pub fn exists(&self, rel: &RelPath) -> Result<bool, PathError> {
        match self.open_rel(rel, OFlag::O_PATH, Last::OnSameMount) {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The names in directory `rel`, without `.` and `..`; empty if it does not exist.
    pub fn read_dir(&self, rel: &RelPath) -> Result<Vec<OsString>, PathError> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        let fd = match self.open_rel(rel, flags, Last::OnSameMount) {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        list_dir(fd, &self.abs(rel))
    }
}

fn list_dir(fd: OwnedFd, abs: &Path) -> Result<Vec<OsString>, PathError> {
    let entries =
        dirents::read_all(fd.as_fd()).map_err(|e| SyscallError::new("getdents64", abs, e))?;
    Ok(entries.into_iter().map(|e| e.name).collect())
}
