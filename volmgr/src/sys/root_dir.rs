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
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::sys::beneath::{self, Last};
use crate::sys::dir_walk::{DirWalk, Step};
use crate::sys::{dirents, mount_id, SyscallError, Target};
use crate::util::sync::MutexExt;

/// Why a path under the root could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// A component was empty, `.`, `..`, absolute, or held `/` or NUL.
    #[error("invalid path component {component:?} in {path}")]
    InvalidComponent {
        /// The whole relative path.
        path: PathBuf,
        /// The offending component.
        component: String,
    },
    /// Resolution met a symlink or tried to leave the root.
    #[error("refusing to follow a symlink or leave the root at {path}")]
    Escape {
        /// The absolute path.
        path: PathBuf,
    },
    /// A directory on the way to `path` is a mount point volmgr did not
    /// make (something mounted under ROOT, on a pod's or a plugin's
    /// directory): nothing is looked up, created or deleted through it.
    #[error("{mount} is a foreign mount point on the way to {path}; refusing to cross it")]
    ForeignMount {
        /// The mount point found (`path` itself when it could not be told).
        mount: PathBuf,
        /// The path that was to be used.
        path: PathBuf,
    },
    /// A directory to delete still has a mount inside it.
    #[error("{path} is or contains a mount point; refusing to delete across it")]
    MountInside {
        /// The mount point found.
        path: PathBuf,
    },
    /// Some other failed system call.
    #[error(transparent)]
    Syscall(#[from] SyscallError),
}

impl PathError {
    /// Whether the error means "does not exist".
    pub fn is_not_found(&self) -> bool {
        matches!(self, PathError::Syscall(e) if e.errno() == Some(libc::ENOENT))
    }
}

/// A path relative to the root, made only of checked, normal components.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(PathBuf);

impl RelPath {
    /// Builds a relative path from components, each checked with [`check_component`].
    pub fn new<I, S>(components: I) -> Result<Self, PathError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut p = PathBuf::new();
        for c in components {
            let c = c.as_ref();
            if !check_component(c) {
                return Err(PathError::InvalidComponent {
                    path: p.join(c),
                    component: c.to_string_lossy().into_owned(),
                });
            }
            p.push(c);
        }
        Ok(Self(p))
    }

    /// Appends one checked component.
    pub fn join(&self, component: impl AsRef<OsStr>) -> Result<Self, PathError> {
        let c = component.as_ref();
        if !check_component(c) {
            return Err(PathError::InvalidComponent {
                path: self.0.join(c),
                component: c.to_string_lossy().into_owned(),
            });
        }
        Ok(Self(self.0.join(c)))
    }

    /// The parent and last component, if any.
    pub fn split_last(&self) -> Option<(RelPath, &OsStr)> {
        let name = self.0.file_name()?;
        let parent = self.0.parent().map(Path::to_path_buf).unwrap_or_default();
        Some((RelPath(parent), name))
    }

    /// The path as a `Path`.
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

/// Whether `c` is usable as one path component: not empty, `.` or `..`, no `/`
/// and no NUL.
pub fn check_component(c: &OsStr) -> bool {
    let b = c.as_bytes();
    !b.is_empty() && b != b"." && b != b".." && !b.contains(&b'/') && !b.contains(&0)
}

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

    /// Creates every missing directory of `rel` with `mode` (subject to
    /// umask), every one on ROOT's own mount, and returns the last one
    /// opened as a [`Target`].
    pub fn mkdir_all(&self, rel: &RelPath, mode: u32) -> Result<Target, PathError> {
        self.mkdir(rel, mode, Last::OnSameMount).map(|d| d.target)
    }

    /// Like [`mkdir_all`](Self::mkdir_all), but the last directory may
    /// already be the root of a mount (a volume set up before: an
    /// emptyDir's tmpfs, a CSI staging target). Tells whether it was
    /// created by this call (so it cannot be a mount point yet).
    pub fn mkdir_mount_target(
        &self,
        rel: &RelPath,
        mode: u32,
    ) -> Result<(Target, bool), PathError> {
        self.mkdir(rel, mode, Last::MayBeMountRoot)
            .map(|d| (d.target, d.created))
    }

    /// Like [`mkdir_mount_target`](Self::mkdir_mount_target), and keeps the
    /// parent open when the walk had it (a directory this call created):
    /// what is mounted on the directory later can then be looked at through
    /// the parent ([`Mounter::mount_id_in`](crate::sys::Mounter::mount_id_in))
    /// without walking the path again.
    pub fn mkdir_mount_target_in(&self, rel: &RelPath, mode: u32) -> Result<MadeDir, PathError> {
        self.mkdir(rel, mode, Last::MayBeMountRoot)
    }

    /// An existing `rel` is opened in one call; otherwise the missing
    /// directories are created one at a time, each `mkdirat` relative to
    /// the directory just opened (on ROOT's mount, no symlink): a component
    /// swapped for a symlink or a mount meanwhile makes it fail, and
    /// nothing is ever created elsewhere.
    fn mkdir(&self, rel: &RelPath, mode: u32, last: Last) -> Result<MadeDir, PathError> {
        let mode = Mode::from_bits_truncate(mode);
        if let Some(done) = self.mkdir_new_under_top(rel, mode, last)? {
            return Ok(done);
        }
        match self.open_rel(rel, DIR_PATH, last) {
            Ok(fd) => {
                return Ok(MadeDir {
                    target: Target::new(fd, self.abs(rel)),
                    parent: None,
                    created: false,
                })
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        self.mkdir_walk(None, rel, 0, mode, last)
    }

    /// The fast path of [`mkdir`](Self::mkdir) for the common case, a new
    /// pod: the first component (`pods`) is a cached open directory, and
    /// creating the second one (`<uid>`) succeeds, so every level below is
    /// new too (no attempt to open `rel` first). `None` when the case does
    /// not apply (the second component exists, the path is too short, the
    /// cached directory is gone): the caller takes the general path.
    fn mkdir_new_under_top(
        &self,
        rel: &RelPath,
        mode: Mode,
        last: Last,
    ) -> Result<Option<MadeDir>, PathError> {
        let mut comps = rel.as_path().iter();
        let (Some(top), Some(second)) = (comps.next(), comps.next()) else {
            return Ok(None);
        };
        let Some(parent) = self.top_dir(top) else {
            return Ok(None);
        };
        match mkdirat(parent.as_fd(), second, mode) {
            Ok(()) => {}
            Err(Errno::EEXIST) => return Ok(None),
            Err(Errno::ENOENT) => {
                // The cached directory was deleted: forget it.
                self.forget_top_dir(top);
                return Ok(None);
            }
            Err(e) => return Err(self.map_err("mkdirat", rel, e)),
        }
        let fd = self.open_component(parent.as_fd(), second, Last::OnSameMount, rel)?;
        self.mkdir_walk(Some(fd), rel, 2, mode, last).map(Some)
    }

    /// Creates the components of `rel` from index `skip` on, starting in
    /// `start` (ROOT when `None`), which holds the components before.
    fn mkdir_walk(
        &self,
        start: Option<OwnedFd>,
        rel: &RelPath,
        skip: usize,
        mode: Mode,
        last: Last,
    ) -> Result<MadeDir, PathError> {
        let n = rel.as_path().iter().count();
        let mut cur = start;
        let mut prev = None;
        let mut created = skip > 0;
        for (i, name) in rel.as_path().iter().enumerate().skip(skip) {
            let parent = cur.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
            created = match mkdirat(parent, name, mode) {
                Ok(()) => true,
                Err(Errno::EEXIST) => false,
                Err(e) => return Err(self.map_err("mkdirat", rel, e)),
            };
            // Only an existing last directory may be a mount's root.
            let how = if i + 1 == n && !created {
                last
            } else {
                Last::OnSameMount
            };
            let next = self.open_component(parent, name, how, rel)?;
            prev = cur.replace(next);
        }
        let fd = cur.ok_or_else(|| PathError::InvalidComponent {
            path: PathBuf::new(),
            component: String::new(),
        })?;
        let path = self.abs(rel);
        // The parent only when this call created the directory (a parent
        // opened before the walk started is ROOT or a cached directory).
        let parent = match (prev, path.parent()) {
            (Some(p), Some(dir)) if created => Some(Target::new(p, dir.to_path_buf())),
            _ => None,
        };
        Ok(MadeDir {
            target: Target::new(fd, path),
            parent,
            created,
        })
    }

    /// The cached descriptor of the first-level directory `name` (on ROOT's
    /// mount), opened (and created) on first use; `None` if it cannot be.
    fn top_dir(&self, name: &OsStr) -> Option<Arc<OwnedFd>> {
        let mut cache = self.top_dirs.locked();
        if let Some((_, fd)) = cache.iter().find(|(n, _)| n == name) {
            return Some(Arc::clone(fd));
        }
        match mkdirat(self.fd.as_fd(), name, Mode::from_bits_truncate(0o750)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(_) => return None,
        }
        let rel = RelPath::new([name]).ok()?;
        let fd = self
            .open_component(self.fd.as_fd(), name, Last::OnSameMount, &rel)
            .ok()?;
        let fd = Arc::new(fd);
        cache.push((name.to_os_string(), Arc::clone(&fd)));
        Some(fd)
    }

    fn forget_top_dir(&self, name: &OsStr) {
        self.top_dirs.locked().retain(|(n, _)| n != name);
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

    /// Writes `contents` to file `rel` atomically and durably: a temporary
    /// file, its data synced (`fdatasync`), renamed over `rel`, then the
    /// directory synced. After a power loss `rel` holds the old contents or
    /// the new, never an empty or partial file (which ext4 and XFS may leave
    /// for a new file renamed without a sync). A write or sync that fails (a
    /// full disk, an I/O error) removes its temporary file: `rel` is as it
    /// was, and nothing is left behind; a failed sync of the directory is
    /// reported too (the new file is in place, its rename maybe not on disk).
    pub fn write_file(&self, rel: &RelPath, contents: &[u8]) -> Result<(), PathError> {
        use std::io::Write;
        let (dir_rel, name) = rel
            .split_last()
            .ok_or_else(|| PathError::InvalidComponent {
                path: rel.as_path().to_path_buf(),
                component: String::new(),
            })?;
        let dir = self.mkdir_all(&dir_rel, 0o750)?;
        let mut tmp = name.to_os_string();
        tmp.push(".tmp");
        let fd = nix::fcntl::openat(
            dir.as_fd(),
            tmp.as_os_str(),
            OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_TRUNC
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o640),
        )
        .map_err(|e| self.map_err("openat", rel, e))?;
        let mut file = std::fs::File::from(fd);
        let written = file
            .write_all(contents)
            .map_err(|e| SyscallError::io("write", self.abs(rel), e))
            .and_then(|()| {
                file.sync_data()
                    .map_err(|e| SyscallError::io("fdatasync", self.abs(rel), e))
            })
            .map_err(PathError::from);
        drop(file);
        let renamed = written.and_then(|()| {
            nix::fcntl::renameat(dir.as_fd(), tmp.as_os_str(), dir.as_fd(), name)
                .map_err(|e| self.map_err("renameat", rel, e))
        });
        if renamed.is_err() {
            let _ = nix::unistd::unlinkat(
                &dir,
                tmp.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        renamed?;
        // `dir` is an `O_PATH` descriptor: the directory opened for reading
        // to sync it.
        let dir_abs = || self.abs(&dir_rel);
        let readable = nix::fcntl::openat(
            dir.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| SyscallError::new("openat", dir_abs(), e))?;
        nix::unistd::fsync(&readable).map_err(|e| SyscallError::new("fsync", dir_abs(), e))?;
        Ok(())
    }

    /// Reads a small state file `rel` (at most [`MAX_STATE_FILE_BYTES`]).
    ///
    /// Opened non-blocking (a FIFO put in its place must not block the
    /// reader; symlinks are refused by the resolution), and refused unless
    /// it is a regular file no larger than the limit (a sparse file of
    /// gigabytes is not read whole).
    pub fn read_file(&self, rel: &RelPath) -> Result<Vec<u8>, PathError> {
        use std::io::Read;
        let fd = self.open_rel(
            rel,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
            Last::OnSameMount,
        )?;
        let refuse = |why: String| {
            SyscallError::io(
                "read",
                self.abs(rel),
                std::io::Error::new(std::io::ErrorKind::InvalidData, why),
            )
        };
        let st = nix::sys::stat::fstat(&fd).map_err(|e| self.map_err("fstat", rel, e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(refuse("not a regular file".into()).into());
        }
        if u64::try_from(st.st_size).unwrap_or(u64::MAX) > MAX_STATE_FILE_BYTES {
            return Err(refuse(format!("larger than {MAX_STATE_FILE_BYTES} bytes")).into());
        }
        let mut out = Vec::new();
        std::fs::File::from(fd)
            .take(MAX_STATE_FILE_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| SyscallError::io("read", self.abs(rel), e))?;
        if out.len() as u64 > MAX_STATE_FILE_BYTES {
            return Err(refuse(format!("grew past {MAX_STATE_FILE_BYTES} bytes")).into());
        }
        Ok(out)
    }

    /// Deletes `rel` and everything below it, never following symlinks and
    /// never crossing into another mount (that fails with
    /// [`PathError::MountInside`] and deletes nothing inside the mount; a
    /// mount on the way to `rel` fails with [`PathError::ForeignMount`]).
    /// A missing `rel` is not an error.
    pub fn remove_all(&self, rel: &RelPath) -> Result<(), PathError> {
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
            return remove_tree(parent.as_fd(), name.to_os_string(), &self.abs(rel), false);
        }
        let parent = match self.open_rel(&parent_rel, DIR_PATH, Last::OnSameMount) {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        remove_tree(parent.as_fd(), name.to_os_string(), &self.abs(rel), false)
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
        let parent = match self.open_rel(&parent_rel, DIR_PATH, Last::OnSameMount) {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => return Ok(true),
            Err(e) => return Err(e),
        };
        match unlinkat(parent.as_fd(), name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(true),
            Err(Errno::ENOTEMPTY) | Err(Errno::EEXIST) | Err(Errno::EBUSY) => Ok(false),
            Err(e) => Err(self.map_err("unlinkat", rel, e)),
        }
    }
}

fn list_dir(fd: OwnedFd, abs: &Path) -> Result<Vec<OsString>, PathError> {
    let entries =
        dirents::read_all(fd.as_fd()).map_err(|e| SyscallError::new("getdents64", abs, e))?;
    Ok(entries.into_iter().map(|e| e.name).collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, RootDir) {
        let t = tempfile::tempdir().unwrap();
        let r = RootDir::open(t.path()).unwrap();
        (t, r)
    }

    #[test]
    fn rejects_bad_components() {
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert!(RelPath::new(["pods", bad]).is_err(), "{bad:?}");
        }
        assert!(RelPath::new(["pods", "uid", "..a", "a.."]).is_ok());
    }

    #[test]
    fn mkdir_all_creates_and_reopens() {
        let (_t, r) = root();
        let rel = RelPath::new(["pods", "u1", "volumes", "x"]).unwrap();
        let t = r.mkdir_all(&rel, 0o750).unwrap();
        assert_eq!(t.path(), r.path().join("pods/u1/volumes/x"));
        assert!(r.path().join("pods/u1/volumes/x").is_dir());
        r.mkdir_all(&rel, 0o750).unwrap();
        assert!(r.exists(&rel).unwrap());
    }

    #[test]
    fn refuses_symlinks_anywhere_on_the_path() {
        let (_t, r) = root();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(r.path().join("pods")).unwrap();
        std::os::unix::fs::symlink(outside.path(), r.path().join("pods/evil")).unwrap();
        let rel = RelPath::new(["pods", "evil", "volumes"]).unwrap();
        assert!(matches!(
            r.mkdir_all(&rel, 0o750),
            Err(PathError::Escape { .. })
        ));
        assert!(matches!(
            r.open_dir(&RelPath::new(["pods", "evil"]).unwrap()),
            Err(PathError::Escape { .. })
        ));
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
        // Removing the symlink removes the link, not the target's contents.
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        r.remove_all(&RelPath::new(["pods", "evil"]).unwrap())
            .unwrap();
        assert!(outside.path().join("keep").exists());
        assert!(!r.path().join("pods/evil").exists());
    }

    #[test]
    fn remove_all_deletes_deep_trees_without_following_links() {
        let (_t, r) = root();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        let mut deep = r.path().join("pods/u/volumes");
        for i in 0..300 {
            deep.push(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("f"), b"data").unwrap();
        std::os::unix::fs::symlink(outside.path(), deep.join("link")).unwrap();
        r.remove_all(&RelPath::new(["pods", "u"]).unwrap()).unwrap();
        assert!(!r.path().join("pods/u").exists());
        assert!(outside.path().join("keep").exists());
        r.remove_all(&RelPath::new(["pods", "u"]).unwrap()).unwrap();
    }

    /// Makes a chain of `depth` directories `d/d/d/...` under `dir` (longer
    /// than PATH_MAX: made relative to descriptors), with a file at the end.
    fn deep_chain(dir: &Path, depth: usize) {
        let mut fd: OwnedFd = std::fs::File::open(dir).unwrap().into();
        for _ in 0..depth {
            mkdirat(&fd, "d", Mode::from_bits_truncate(0o755)).unwrap();
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
            fd = nix::fcntl::openat(&fd, "d", flags, Mode::empty()).unwrap();
        }
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_CLOEXEC;
        drop(nix::fcntl::openat(&fd, "f", flags, Mode::from_bits_truncate(0o644)).unwrap());
    }

    /// A pod can build a directory chain far deeper than the open-file
    /// limit: tear-down still removes it, with a bounded number of
    /// descriptors and memory in proportion to the depth.
    #[test]
    fn remove_all_deletes_chains_deeper_than_the_descriptor_limit() {
        crate::sys::test_child::run_in_child(
            crate::test_name!("remove_all_deletes_chains_deeper_than_the_descriptor_limit"),
            crate::sys::test_child::Child::PrivateMounts,
            || {
                // Far below the depth, as on a node with a low limit.
                let limit = libc::rlimit {
                    rlim_cur: 256,
                    rlim_max: 256,
                };
                // SAFETY: a plain struct for setrlimit.
                assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
                let (_t, r) = root();
                let vol = r.path().join("pods/u/volumes/v");
                std::fs::create_dir_all(&vol).unwrap();
                // The adversarial run's 5,000 levels made every tear-down
                // fail with EMFILE.
                deep_chain(&vol, 5_000);
                r.remove_all(&RelPath::new(["pods", "u"]).unwrap()).unwrap();
                assert!(!r.path().join("pods/u").exists());
            },
        );
    }

    #[test]
    fn remove_all_empties_directories_bigger_than_one_listing() {
        let (_t, r) = root();
        let big = r.path().join("pods/u/volumes/big");
        std::fs::create_dir_all(&big).unwrap();
        for i in 0..2000 {
            std::fs::write(big.join(format!("file-{i:05}-{}", "x".repeat(30))), b"").unwrap();
        }
        for i in 0..50 {
            std::fs::create_dir(big.join(format!("dir-{i}"))).unwrap();
        }
        r.remove_all(&RelPath::new(["pods", "u"]).unwrap()).unwrap();
        assert!(!r.path().join("pods/u").exists());
        // A plain file as the thing to remove.
        std::fs::write(r.path().join("pods/file"), b"x").unwrap();
        r.remove_all(&RelPath::new(["pods", "file"]).unwrap())
            .unwrap();
        assert!(!r.path().join("pods/file").exists());
    }

    #[test]
    fn remove_all_at_deletes_through_a_held_parent_without_following_links() {
        let (_t, r) = root();
        let parent_rel = RelPath::new(["pods", "u", "volumes"]).unwrap();
        let parent = r.mkdir_all(&parent_rel, 0o750).unwrap();
        let dir = r.path().join("pods/u/volumes");
        // An empty directory (removed by the first rmdir).
        std::fs::create_dir(dir.join("empty")).unwrap();
        r.remove_all_at(&parent, OsStr::new("empty")).unwrap();
        assert!(!dir.join("empty").exists());
        // A tree.
        std::fs::create_dir_all(dir.join("tree/a/b")).unwrap();
        std::fs::write(dir.join("tree/a/f"), b"x").unwrap();
        r.remove_all_at(&parent, OsStr::new("tree")).unwrap();
        assert!(!dir.join("tree").exists());
        // A symlink to a directory outside ROOT: the link goes, not the target.
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(outside.path().join("empty")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("empty"), dir.join("link")).unwrap();
        r.remove_all_at(&parent, OsStr::new("link")).unwrap();
        assert!(!dir.join("link").exists());
        assert!(outside.path().join("empty").is_dir());
        // A file, and something already gone.
        std::fs::write(dir.join("file"), b"x").unwrap();
        r.remove_all_at(&parent, OsStr::new("file")).unwrap();
        assert!(!dir.join("file").exists());
        r.remove_all_at(&parent, OsStr::new("file")).unwrap();
    }

    #[test]
    fn cached_pods_dir_survives_deletion_and_recreation() {
        let (_t, r) = root();
        let rel = RelPath::new(["pods", "u1", "volumes", "x"]).unwrap();
        let (_, created) = r.mkdir_mount_target(&rel, 0o750).unwrap();
        assert!(created);
        // Someone deletes ROOT/pods under the manager: the next pod still
        // lands in ROOT/pods, not in the deleted directory.
        std::fs::remove_dir_all(r.path().join("pods")).unwrap();
        let rel2 = RelPath::new(["pods", "u2", "volumes", "x"]).unwrap();
        let (t, created) = r.mkdir_mount_target(&rel2, 0o750).unwrap();
        assert!(created);
        assert_eq!(t.path(), r.path().join("pods/u2/volumes/x"));
        assert!(r.path().join("pods/u2/volumes/x").is_dir());
        // An existing pod directory takes the general path.
        let (_, created) = r.mkdir_mount_target(&rel2, 0o750).unwrap();
        assert!(!created);
        let rel3 = RelPath::new(["pods", "u2", "volumes", "y"]).unwrap();
        let (_, created) = r.mkdir_mount_target(&rel3, 0o750).unwrap();
        assert!(created);
    }

    /// `pods/u/volumes/kubernetes.io~empty-dir/w`, a disk-backed emptyDir.
    const VOL: [&str; 5] = ["pods", "u", "volumes", "kubernetes.io~empty-dir", "w"];

    fn rel(c: &[&str]) -> RelPath {
        RelPath::new(c).unwrap()
    }

    /// The attack of an adversarial run, replayed for a mount on each
    /// component of a volume's path: a "host" directory outside ROOT,
    /// bind-mounted there, is never modified, and every error names the
    /// mount. Returns what went wrong.
    fn foreign_mount_on_component(depth: usize) -> Vec<String> {
        use super::super::test_child::{bind, tree, unmount};
        let t = tempfile::tempdir().unwrap();
        let r = RootDir::open(&t.path().join("root")).unwrap();
        let host = t.path().join("host");
        let vol = r.path().join(VOL.join("/"));
        std::fs::create_dir_all(vol.join("e")).unwrap();
        std::fs::write(vol.join("mine"), b"x").unwrap();
        // The host directory holds what the rest of the path names.
        let inner = host.join(VOL[depth..].join("/"));
        std::fs::create_dir_all(inner.join("e")).unwrap();
        for f in ["f1", "f2", "f3"] {
            std::fs::write(inner.join(f), f).unwrap();
        }
        let mount_point = r.path().join(VOL[..depth].join("/"));
        bind(&host, &mount_point);
        let before = tree(&host);
        let mut problems = Vec::new();
        let mut refused = |what: &str, res: Result<(), PathError>| match res {
            Ok(()) => problems.push(format!("depth {depth}: {what} crossed the mount")),
            Err(e) if !e.to_string().contains(&*mount_point.to_string_lossy()) => problems.push(
                format!("depth {depth}: {what}: error without the mount: {e}"),
            ),
            Err(_) => {}
        };
        let parent = rel(&VOL[..4]);
        let strict_parent = depth <= 4;
        match r.open_dir(&parent) {
            Ok(p) if strict_parent => {
                refused("open_dir(parent)", Ok(()));
                refused("remove_all_at", r.remove_all_at(&p, OsStr::new("w")));
            }
            Ok(p) => refused("remove_all_at", r.remove_all_at(&p, OsStr::new("w"))),
            Err(e) => refused("open_dir(parent)", Err(e)),
        }
        refused("remove_all(volume)", r.remove_all(&rel(&VOL)));
        refused("remove_all(pod)", r.remove_all(&rel(&VOL[..2])));
        let sub = rel(&VOL).join("sub").unwrap();
        refused("mkdir_all(sub)", r.mkdir_all(&sub, 0o750).map(drop));
        let new = rel(&VOL).join("new").unwrap();
        refused("write_file", r.write_file(&new, b"x"));
        refused("read_dir", r.read_dir(&rel(&VOL)).map(drop));
        let f1 = rel(&VOL).join("f1").unwrap();
        refused("exists", r.exists(&f1).map(drop));
        let e = rel(&VOL).join("e").unwrap();
        refused("remove_empty_dir", r.remove_empty_dir(&e).map(drop));
        let sibling = parent.join("w2").unwrap();
        if strict_parent {
            refused("mkdir_all(sibling)", r.mkdir_all(&sibling, 0o750).map(drop));
        }
        if tree(&host) != before {
            problems.push(format!(
                "depth {depth}: the host directory changed: {before:?} -> {:?}",
                tree(&host)
            ));
        }
        // (Before the fix, held descriptors of the host directory kept
        // the mount busy.)
        let root_path = r.path().to_path_buf();
        drop(r);
        unmount(&mount_point);
        // What was under the mount is ROOT's own, and still there.
        assert!(vol.join("mine").exists(), "depth {depth}");
        let r = RootDir::open(&root_path).unwrap();
        r.remove_all(&rel(&VOL[..2])).unwrap();
        problems
    }

    fn foreign_mounts_on_a_volume_path() {
        let problems: Vec<String> = (1..=5).flat_map(foreign_mount_on_component).collect();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn foreign_mounts_on_a_volume_path_are_never_crossed() {
        use super::super::test_child::{run_in_child, Child};
        let name = crate::test_name!("foreign_mounts_on_a_volume_path_are_never_crossed");
        run_in_child(name, Child::PrivateMounts, foreign_mounts_on_a_volume_path);
    }

    /// Creates pod directories while another thread swaps a component of
    /// each (`pods/<uid>/volumes`) for a symlink to a directory outside ROOT
    /// (atomically, `RENAME_EXCHANGE`): nothing is ever created outside.
    fn mkdir_races_with_symlink_swaps(iterations: usize) {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
        let (_t, r) = root();
        let outside = tempfile::tempdir().unwrap();
        let atk = r.path().join("atk");
        std::fs::create_dir(&atk).unwrap();
        // The iteration the attacker is to race (usize::MAX: none yet), and
        // the one it is ready for.
        let target = AtomicUsize::new(usize::MAX);
        let ready = AtomicUsize::new(usize::MAX);
        let (stop, hits) = (AtomicBool::new(false), AtomicUsize::new(0));
        let failed = AtomicUsize::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut done = usize::MAX;
                while !stop.load(SeqCst) {
                    let n = target.load(SeqCst);
                    if n == usize::MAX || n == done {
                        std::thread::yield_now();
                        continue;
                    }
                    let link = atk.join(format!("l{n}"));
                    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
                    let victim = r.path().join(format!("pods/u{n}/volumes"));
                    ready.store(n, SeqCst);
                    while target.load(SeqCst) == n && !stop.load(SeqCst) {
                        let swapped = nix::fcntl::renameat2(
                            nix::fcntl::AT_FDCWD,
                            &link,
                            nix::fcntl::AT_FDCWD,
                            &victim,
                            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                        );
                        if swapped.is_ok() {
                            hits.fetch_add(1, SeqCst);
                            break;
                        }
                    }
                    done = n;
                }
            });
            for n in 0..iterations {
                target.store(n, SeqCst);
                while ready.load(SeqCst) != n {
                    std::thread::yield_now();
                }
                let rel = RelPath::new([
                    "pods",
                    &format!("u{n}"),
                    "volumes",
                    "kubernetes.io~empty-dir",
                    "w",
                ])
                .unwrap();
                if r.mkdir_mount_target(&rel, 0o750).is_err() {
                    failed.fetch_add(1, SeqCst);
                }
                let _ = r.mkdir_all(&rel.join("x").unwrap(), 0o750);
            }
            stop.store(true, SeqCst);
        });
        println!(
            "symlink swaps: {} of {iterations} pod directories swapped, {} creations refused",
            hits.load(SeqCst),
            failed.load(SeqCst)
        );
        assert!(
            super::super::test_child::tree(outside.path()).is_empty(),
            "created outside ROOT: {:?}",
            super::super::test_child::tree(outside.path())
        );
    }

    #[test]
    fn mkdir_races_with_symlink_swaps_never_create_outside() {
        mkdir_races_with_symlink_swaps(5000);
    }

    /// The real-filesystem tests and the attacks once more, where `openat2`
    /// fails with `ENOSYS` (kernels before 5.6, valgrind): the fallback walk
    /// keeps the same rules.
    mod without_openat2 {
        crate::again_without_openat2!(
            mkdir_all_creates_and_reopens,
            refuses_symlinks_anywhere_on_the_path,
            remove_all_deletes_deep_trees_without_following_links,
            remove_all_empties_directories_bigger_than_one_listing,
            remove_all_at_deletes_through_a_held_parent_without_following_links,
            cached_pods_dir_survives_deletion_and_recreation,
            write_and_read_files,
            mkdir_races_with_symlink_swaps(2000),
            foreign_mounts_on_a_volume_path,
        );
    }

    #[test]
    fn write_and_read_files() {
        let (_t, r) = root();
        let rel = RelPath::new(["pods", "u", "plugins", "p", "ready"]).unwrap();
        r.write_file(&rel, b"hello").unwrap();
        assert_eq!(r.read_file(&rel).unwrap(), b"hello");
        let names = r
            .read_dir(&RelPath::new(["pods", "u", "plugins", "p"]).unwrap())
            .unwrap();
        assert_eq!(names, vec![OsString::from("ready")]);
        assert!(r
            .read_dir(&RelPath::new(["nope"]).unwrap())
            .unwrap()
            .is_empty());
    }

    /// A write syncs the file and then its directory: with `fsync` failing
    /// (a seccomp filter), the directory's sync after the rename is the
    /// error; with `fdatasync` failing, the file's own sync before the
    /// rename is, and the file keeps its old contents with nothing left.
    #[test]
    fn a_write_is_synced_and_a_failed_sync_is_reported() {
        use super::super::test_child::{run_in_child, Child};
        let name = crate::test_name!("a_write_is_synced_and_a_failed_sync_is_reported");
        run_in_child(name, Child::PrivateMounts, || {
            let (_t, r) = root();
            let rel = RelPath::new(["pods", "u", "vol_data.json"]).unwrap();
            let dir = RelPath::new(["pods", "u"]).unwrap();
            r.write_file(&rel, b"old").unwrap();
            // From here on `fsync` fails on this thread (a seccomp filter):
            // the directory's sync, after the rename, is reported.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let nr = |n: libc::c_long| n as u32;
            crate::sys::seccomp::fail_with_enosys(&[nr(libc::SYS_fsync)]).unwrap();
            let err = r.write_file(&rel, b"new").unwrap_err();
            assert!(err.to_string().contains("fsync"), "{err}");
            assert_eq!(r.read_file(&rel).unwrap(), b"new");
            // And `fdatasync` too: the file's own sync fails before the
            // rename, which leaves the file as it was and nothing else.
            crate::sys::seccomp::fail_with_enosys(&[nr(libc::SYS_fdatasync)]).unwrap();
            let err = r.write_file(&rel, b"newer").unwrap_err();
            assert!(err.to_string().contains("fdatasync"), "{err}");
            assert_eq!(r.read_file(&rel).unwrap(), b"new");
            assert_eq!(
                r.read_dir(&dir).unwrap(),
                vec![OsString::from("vol_data.json")]
            );
        });
    }

    /// On a full file system (a 1 MiB tmpfs, filled), a write fails with
    /// `ENOSPC`, the file keeps its old contents and no temporary file is
    /// left; with space back, the same write succeeds.
    #[test]
    fn a_write_on_a_full_disk_keeps_the_old_file_and_leaves_nothing() {
        use super::super::test_child::{run_in_child, Child};
        let name =
            crate::test_name!("a_write_on_a_full_disk_keeps_the_old_file_and_leaves_nothing");
        run_in_child(name, Child::PrivateMounts, || {
            use std::io::Write;
            let t = tempfile::tempdir().unwrap();
            nix::mount::mount(
                Some("tmpfs"),
                t.path(),
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                Some("size=1m"),
            )
            .unwrap();
            let r = RootDir::open(t.path()).unwrap();
            let rel = RelPath::new(["pods", "u", "vol_data.json"]).unwrap();
            r.write_file(&rel, b"old").unwrap();
            let filler = t.path().join("filler");
            let mut f = std::fs::File::create(&filler).unwrap();
            while f.write_all(&[7u8; 4096]).is_ok() {}
            drop(f);
            let err = r.write_file(&rel, &[b'n'; 64 * 1024]).unwrap_err();
            assert!(err.to_string().contains("No space left on device"), "{err}");
            assert_eq!(r.read_file(&rel).unwrap(), b"old");
            let dir = RelPath::new(["pods", "u"]).unwrap();
            assert_eq!(
                r.read_dir(&dir).unwrap(),
                vec![OsString::from("vol_data.json")]
            );
            std::fs::remove_file(&filler).unwrap();
            r.write_file(&rel, &[b'n'; 64 * 1024]).unwrap();
            assert_eq!(r.read_file(&rel).unwrap().len(), 64 * 1024);
            drop(r);
            nix::mount::umount(t.path()).unwrap();
        });
    }
}
