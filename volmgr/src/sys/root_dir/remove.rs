//! Deletion under the root: never follows a symlink, stops at any mount
//! (the mount rule of [`super`]).

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::{EmptyDirRemoval, PathError, RelPath, RootDir, DIR_PATH};
use crate::sys::beneath::{self, Last};
use crate::sys::dir_walk::{DirWalk, Step};
use crate::sys::{dirents, SyscallError, Target};

impl RootDir {
    /// Deletes `rel` and everything below it, never following symlinks and
    /// never crossing into another mount (that fails with
    /// [`PathError::MountInside`] and deletes nothing inside the mount; a
    /// mount on the way to `rel` fails with [`PathError::ForeignMount`]).
    /// A missing `rel` is not an error.
    pub fn remove_all(&self, rel: &RelPath) -> Result<(), PathError> {
        self.remove_all_expecting(rel, false)
    }

    /// Like [`remove_all`](Self::remove_all), for a directory the caller
    /// has just emptied of what it knows of (a pod's directory once its
    /// volumes are gone): one `rmdir` first, and the walk only when entries
    /// are left.
    pub fn remove_all_emptied(&self, rel: &RelPath) -> Result<(), PathError> {
        self.remove_all_expecting(rel, true)
    }

    fn remove_all_expecting(&self, rel: &RelPath, likely_empty: bool) -> Result<(), PathError> {
        let Some((parent_rel, name)) = rel.split_last() else {
            return Err(PathError::InvalidComponent {
                path: PathBuf::new(),
                component: String::new(),
            });
        };
        // A pod directory's parent (`pods`) is held open.
        let mut comps = parent_rel.as_path().iter();
        let top = match (comps.next(), comps.next()) {
            (Some(top), None) => self.top_dir(top),
            _ => None,
        };
        if let Some(parent) = top {
            return remove_tree(
                parent.as_fd(),
                name.to_os_string(),
                &self.abs(rel),
                likely_empty,
            );
        }
        let parent = match self.open_rel(&parent_rel, DIR_PATH, Last::OnSameMount) {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        remove_tree(
            parent.as_fd(),
            name.to_os_string(),
            &self.abs(rel),
            likely_empty,
        )
    }

    /// Deletes `parent/name` like [`remove_all`](Self::remove_all), through
    /// a descriptor of its parent the caller already holds (from
    /// [`open_dir`](Self::open_dir) or [`mkdir_all`](Self::mkdir_all): on
    /// ROOT's mount). The walk stays on the parent's mount.
    pub fn remove_all_at(&self, parent: &Target, name: &OsStr) -> Result<(), PathError> {
        remove_tree(
            parent.as_fd(),
            name.to_os_string(),
            &parent.path().join(name),
            true,
        )
    }

    /// Removes an empty directory `rel`; a missing one is fine, a non-empty
    /// one is left and reported as `false`.
    pub fn remove_empty_dir(&self, rel: &RelPath) -> Result<bool, PathError> {
        let Some((parent_rel, name)) = rel.split_last() else {
            return Ok(false);
        };
        let Some(parent) = self.open_dir_if_there(&parent_rel)? else {
            return Ok(true);
        };
        Ok(self.remove_empty_dir_at(&parent, name)? == EmptyDirRemoval::Removed)
    }
}

/// How many times a directory is listed again because entries appeared
/// while it was being emptied, before giving up.
const MAX_RELISTS: usize = 1000;

/// Opens directory `name` under `parent` for listing, refusing symlinks and
/// mount crossings. `None` when it is gone; `Err(ENOTDIR)` when it is not a
/// directory.
fn open_subdir(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    abs: &dyn Fn() -> PathBuf,
) -> Result<Option<OwnedFd>, Result<Errno, PathError>> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
    match beneath::open(parent, Path::new(name), flags, Last::OnSameMount) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        // A symlink (O_NOFOLLOW/RESOLVE_NO_SYMLINKS) or a plain file.
        Err(e @ (Errno::ENOTDIR | Errno::ELOOP)) => Err(Ok(e)),
        Err(Errno::EXDEV) => Err(Err(PathError::MountInside { path: abs() })),
        Err(e) => Err(Err(SyscallError::new(beneath::call_name(), abs(), e).into())),
    }
}

/// Unlinks the non-directory `name` under `parent` (never following it).
fn unlink_file(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    abs: &dyn Fn() -> PathBuf,
) -> Result<(), PathError> {
    match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(SyscallError::new("unlinkat", abs(), e).into()),
    }
}

/// What a first `rmdir` of a directory entry found.
enum Rmdir {
    /// Removed (it was an empty directory), or already gone.
    Gone,
    /// Not a directory (a file or a symlink, never followed).
    NotADir,
    /// It has entries (or the attempt failed in a way the full walk will
    /// report with its path).
    NotEmpty,
}

/// Tries `unlinkat(AT_REMOVEDIR)` on `parent/name` before opening it: most
/// directories a tear-down deletes are empty by then (a volume's mount
/// point, a plugin's directory), and one call replaces an open, a listing,
/// a close and the same call. A mount point is refused (EBUSY), as the walk
/// refuses to enter one.
fn try_rmdir(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    abs: &dyn Fn() -> PathBuf,
) -> Result<Rmdir, PathError> {
    match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(Rmdir::Gone),
        Err(Errno::ENOTDIR) => Ok(Rmdir::NotADir),
        Err(Errno::EBUSY) => Err(PathError::MountInside { path: abs() }),
        Err(_) => Ok(Rmdir::NotEmpty),
    }
}

/// Iterative post-order deletion of `parent/name` through a [`DirWalk`]
/// (bounded stack, descriptors and memory however deep the tree).
/// Directories are read with `getdents64`, whose entry types spare a `stat`
/// per entry; each directory is opened with `RESOLVE_NO_XDEV`, so the walk
/// never enters another mount. Subdirectories are first simply removed (see
/// [`try_rmdir`]), and so is `name` itself when the caller expects it empty
/// (`likely_empty`).
fn remove_tree(
    parent: BorrowedFd<'_>,
    name: OsString,
    abs: &Path,
    likely_empty: bool,
) -> Result<(), PathError> {
    let abs_fn = || abs.to_path_buf();
    if likely_empty {
        match try_rmdir(parent, &name, &abs_fn)? {
            Rmdir::Gone => return Ok(()),
            Rmdir::NotADir => return unlink_file(parent, &name, &abs_fn),
            Rmdir::NotEmpty => {}
        }
    }
    let fd = match open_subdir(parent, &name, &abs_fn) {
        Ok(Some(fd)) => fd,
        Ok(None) => return Ok(()),
        Err(Ok(_not_a_dir)) => return unlink_file(parent, &name, &abs_fn),
        Err(Err(e)) => return Err(e),
    };
    let mut walk = DirWalk::new(abs, fd)?;
    let mut relists = 0;
    while let Some(step) = walk.next_step()? {
        match step {
            Step::Entry(child) => {
                if let Some((name, fd)) = remove_entry(&walk, child)? {
                    walk.enter(name, fd)?;
                }
            }
            Step::DirDone => {
                // Every listed entry is gone; entries may have appeared
                // meanwhile (rmdir then says ENOTEMPTY): list again, a
                // bounded number of times.
                if rmdir_emptied(&mut walk, parent, &name)? {
                    walk.leave()?;
                } else if relists < MAX_RELISTS {
                    relists += 1;
                    walk.relist()?;
                } else {
                    return Err(
                        SyscallError::new("unlinkat", walk.path(None), Errno::ENOTEMPTY).into(),
                    );
                }
            }
        }
    }
    Ok(())
}

/// Removes the listed entry `child` of the walk's current directory: a file
/// is unlinked, an empty directory removed; a directory with entries is
/// opened and returned, to be emptied first.
fn remove_entry(
    walk: &DirWalk,
    child: dirents::DirEntry,
) -> Result<Option<(OsString, OwnedFd)>, PathError> {
    let fd = walk.dir()?;
    // Paths only matter for errors: built only then.
    let child_abs = || walk.path(Some(&child.name));
    if child.kind != dirents::EntryKind::Dir && child.kind != dirents::EntryKind::Unknown {
        unlink_file(fd, &child.name, &child_abs)?;
        return Ok(None);
    }
    match try_rmdir(fd, &child.name, &child_abs)? {
        Rmdir::Gone => return Ok(None),
        Rmdir::NotADir => {
            unlink_file(fd, &child.name, &child_abs)?;
            return Ok(None);
        }
        Rmdir::NotEmpty => {}
    }
    match open_subdir(fd, &child.name, &child_abs) {
        Ok(Some(child_fd)) => Ok(Some((child.name, child_fd))),
        Ok(None) => Ok(None),
        Err(Ok(_not_a_dir)) => unlink_file(fd, &child.name, &child_abs).map(|()| None),
        Err(Err(e)) => Err(e),
    }
}

/// Removes the emptied current directory of the walk (through its parent
/// on the walk, or `parent`/`root_name` for the tree's root): `Ok(true)`
/// when it is gone, `Ok(false)` when entries appeared meanwhile.
fn rmdir_emptied(
    walk: &mut DirWalk,
    parent: BorrowedFd<'_>,
    root_name: &OsStr,
) -> Result<bool, PathError> {
    let result = match walk.parent()? {
        Some((name, dir)) => unlinkat(dir, name, UnlinkatFlags::RemoveDir),
        None => unlinkat(parent, root_name, UnlinkatFlags::RemoveDir),
    };
    match result {
        Ok(()) | Err(Errno::ENOENT) => Ok(true),
        Err(Errno::ENOTEMPTY | Errno::EEXIST) => Ok(false),
        Err(Errno::EBUSY) => Err(PathError::MountInside {
            path: walk.path(None),
        }),
        Err(e) => Err(SyscallError::new("unlinkat", walk.path(None), e).into()),
    }
}
