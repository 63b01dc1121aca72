//! Safe file-system access beneath the manager's root directory.
//!
//! Everything the manager creates, opens or deletes under `ROOT` goes through
//! [`RootDir`]: paths are made of validated components, every open uses
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`
//! relative to a descriptor of the root, and deletion never follows a symlink
//! or crosses into a mounted file system. A symlink planted anywhere under a
//! pod's directory makes the operation fail instead of escaping.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::sys::{dirents, SyscallError, Target};
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

/// The largest state file [`RootDir::read_file`] reads.
pub const MAX_STATE_FILE_BYTES: u64 = 1 << 20;

fn resolve_beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

impl RootDir {
    /// Creates (if needed) and opens the root. The root itself may be reached
    /// through symlinks chosen by the operator; it is canonicalized once here.
    pub fn open(path: &Path) -> Result<Self, PathError> {
        std::fs::create_dir_all(path).map_err(|e| SyscallError::io("mkdir", path, e))?;
        let path = path
            .canonicalize()
            .map_err(|e| SyscallError::io("realpath", path, e))?;
        let fd = nix::fcntl::open(
            &path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
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

    fn open_how(&self, rel: &RelPath, flags: OFlag) -> Result<OwnedFd, PathError> {
        let target = if rel.as_path().as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel.as_path()
        };
        openat2(
            self.fd.as_fd(),
            target,
            OpenHow::new()
                // RESOLVE_NO_SYMLINKS covers the last component too (ELOOP);
                // O_NOFOLLOW would instead open a final symlink itself.
                .flags(flags | OFlag::O_CLOEXEC)
                .resolve(resolve_beneath()),
        )
        .map_err(|e| self.map_err("openat2", rel, e))
    }

    fn map_err(&self, call: &'static str, rel: &RelPath, e: Errno) -> PathError {
        match e {
            Errno::ELOOP | Errno::EXDEV => PathError::Escape {
                path: self.abs(rel),
            },
            e => PathError::Syscall(SyscallError::new(call, self.abs(rel), e)),
        }
    }

    /// Opens an existing directory as a mount [`Target`].
    pub fn open_dir(&self, rel: &RelPath) -> Result<Target, PathError> {
        let fd = self.open_how(rel, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
        Ok(Target::new(fd, self.abs(rel)))
    }

    /// Creates every missing directory of `rel` with `mode` (subject to umask)
    /// and returns the last one opened as a [`Target`].
    pub fn mkdir_all(&self, rel: &RelPath, mode: u32) -> Result<Target, PathError> {
        self.mkdir_all_created(rel, mode).map(|(t, _)| t)
    }

    /// Like [`mkdir_all`](Self::mkdir_all), and tells whether the last
    /// directory was created by this call (so it cannot be a mount point).
    ///
    /// Existing components are opened one at a time with
    /// `RESOLVE_NO_SYMLINKS`. Once a component had to be created, everything
    /// below it is new and lives in a directory only this process has
    /// written (mode 0750, created just now), so the remaining levels are
    /// created relative to the last opened directory in one call each, and
    /// only the final directory is opened (again with `RESOLVE_BENEATH |
    /// RESOLVE_NO_SYMLINKS`, so a race could only make it fail).
    pub fn mkdir_all_created(&self, rel: &RelPath, mode: u32) -> Result<(Target, bool), PathError> {
        if let Some(done) = self.mkdir_new_under_top(rel, mode)? {
            return Ok(done);
        }
        match self.open_dir(rel) {
            Ok(t) => return Ok((t, false)),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        let mode = Mode::from_bits_truncate(mode);
        let mut cur_rel = RelPath(PathBuf::new());
        let mut cur: Option<OwnedFd> = None;
        // Below `cur`: components created by this call, as a relative path.
        let mut fresh = PathBuf::new();
        for c in rel.as_path().components() {
            let Component::Normal(name) = c else {
                return Err(PathError::InvalidComponent {
                    path: rel.as_path().to_path_buf(),
                    component: format!("{c:?}"),
                });
            };
            cur_rel = cur_rel.join(name)?;
            let parent = cur.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
            if !fresh.as_os_str().is_empty() {
                fresh.push(name);
                mkdirat(parent, &fresh, mode).map_err(|e| self.map_err("mkdirat", &cur_rel, e))?;
                continue;
            }
            match mkdirat(parent, name, mode) {
                Ok(()) => fresh.push(name),
                Err(Errno::EEXIST) => {
                    let next = self.open_component(parent, name, &cur_rel)?;
                    cur = Some(next);
                }
                Err(e) => return Err(self.map_err("mkdirat", &cur_rel, e)),
            }
        }
        let created = !fresh.as_os_str().is_empty();
        let fd = match cur {
            _ if created => {
                let parent = cur.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
                self.open_component(parent, &fresh, rel)?
            }
            Some(fd) => fd,
            None => {
                return Err(PathError::InvalidComponent {
                    path: PathBuf::new(),
                    component: String::new(),
                })
            }
        };
        Ok((Target::new(fd, self.abs(rel)), created))
    }

    /// The fast path of [`mkdir_all_created`](Self::mkdir_all_created) for
    /// the common case, a new pod: the first component (`pods`) is a cached
    /// open directory, and creating the second one (`<uid>`) succeeds, so
    /// every level below is new too and is created relative to the cached
    /// descriptor; only the final directory is opened. `None` when the case
    /// does not apply (the second component exists, the path is too short,
    /// the cached directory is gone): the caller takes the general path.
    fn mkdir_new_under_top(
        &self,
        rel: &RelPath,
        mode: u32,
    ) -> Result<Option<(Target, bool)>, PathError> {
        let mut comps = rel.as_path().components();
        let (Some(Component::Normal(top)), Some(Component::Normal(second))) =
            (comps.next(), comps.next())
        else {
            return Ok(None);
        };
        let Some(parent) = self.top_dir(top) else {
            return Ok(None);
        };
        let mode = Mode::from_bits_truncate(mode);
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
        let mut fresh = PathBuf::from(second);
        for c in comps {
            fresh.push(c);
            mkdirat(parent.as_fd(), &fresh, mode).map_err(|e| self.map_err("mkdirat", rel, e))?;
        }
        let fd = self.open_component(parent.as_fd(), &fresh, rel)?;
        Ok(Some((Target::new(fd, self.abs(rel)), true)))
    }

    /// The cached descriptor of the first-level directory `name`, opened
    /// (and created) on first use; `None` if it cannot be.
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
        let fd = Arc::new(self.open_component(self.fd.as_fd(), name, &rel).ok()?);
        cache.push((name.to_os_string(), Arc::clone(&fd)));
        Some(fd)
    }

    fn forget_top_dir(&self, name: &OsStr) {
        self.top_dirs.locked().retain(|(n, _)| n != name);
    }

    /// Opens `name` (one or more components) under `parent` as a directory,
    /// refusing symlinks and escapes.
    fn open_component(
        &self,
        parent: std::os::fd::BorrowedFd<'_>,
        name: &(impl nix::NixPath + ?Sized),
        rel: &RelPath,
    ) -> Result<OwnedFd, PathError> {
        openat2(
            parent,
            name,
            OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                .resolve(resolve_beneath()),
        )
        .map_err(|e| self.map_err("openat2", rel, e))
    }

    /// Whether `rel` exists (without following symlinks).
    pub fn exists(&self, rel: &RelPath) -> Result<bool, PathError> {
        match self.open_how(rel, OFlag::O_PATH) {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The names in directory `rel`, without `.` and `..`; empty if it does not exist.
    pub fn read_dir(&self, rel: &RelPath) -> Result<Vec<OsString>, PathError> {
        let fd = match self.open_how(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        list_dir(fd, &self.abs(rel))
    }

    /// Writes `contents` to file `rel` atomically (temporary file + rename).
    pub fn write_file(&self, rel: &RelPath, contents: &[u8]) -> Result<(), PathError> {
        use std::io::Write;
        let (dir_rel, name) = rel
            .split_last()
            .ok_or_else(|| PathError::InvalidComponent {
                path: rel.as_path().to_path_buf(),
                component: String::new(),
            })?;
        let dir = self.mkdir_all(&dir_rel, 0o750)?;
        let dir_fd = self.open_how(&dir_rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        drop(dir);
        let mut tmp = name.to_os_string();
        tmp.push(".tmp");
        let fd = nix::fcntl::openat(
            dir_fd.as_fd(),
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
        file.write_all(contents)
            .map_err(|e| SyscallError::io("write", self.abs(rel), e))?;
        drop(file);
        nix::fcntl::renameat(dir_fd.as_fd(), tmp.as_os_str(), dir_fd.as_fd(), name)
            .map_err(|e| self.map_err("renameat", rel, e))?;
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
        let fd = self.open_how(rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)?;
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
    /// [`PathError::MountInside`] and deletes nothing inside the mount).
    /// A missing `rel` is not an error.
    pub fn remove_all(&self, rel: &RelPath) -> Result<(), PathError> {
        let Some((parent_rel, name)) = rel.split_last() else {
            return Err(PathError::InvalidComponent {
                path: PathBuf::new(),
                component: String::new(),
            });
        };
        // A pod directory's parent (`pods`) is held open.
        let top = match parent_rel
            .as_path()
            .components()
            .collect::<Vec<_>>()
            .as_slice()
        {
            [Component::Normal(top)] => self.top_dir(top),
            _ => None,
        };
        if let Some(parent) = top {
            return remove_tree(parent.as_fd(), name.to_os_string(), &self.abs(rel), false);
        }
        let parent = match self.open_how(&parent_rel, OFlag::O_PATH | OFlag::O_DIRECTORY) {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        remove_tree(parent.as_fd(), name.to_os_string(), &self.abs(rel), false)
    }

    /// Deletes `parent/name` like [`remove_all`](Self::remove_all), through
    /// a descriptor of its parent the caller already holds (opened beneath
    /// ROOT).
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
        let parent = match self.open_how(&parent_rel, OFlag::O_PATH | OFlag::O_DIRECTORY) {
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
    abs: &Path,
) -> Result<Option<OwnedFd>, Result<Errno, PathError>> {
    match openat2(
        parent,
        name,
        OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(resolve_beneath() | ResolveFlag::RESOLVE_NO_XDEV),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        // A symlink (O_NOFOLLOW/RESOLVE_NO_SYMLINKS) or a plain file.
        Err(e @ (Errno::ENOTDIR | Errno::ELOOP)) => Err(Ok(e)),
        Err(Errno::EXDEV) => Err(Err(PathError::MountInside {
            path: abs.to_path_buf(),
        })),
        Err(e) => Err(Err(SyscallError::new("openat2", abs, e).into())),
    }
}

/// Unlinks the non-directory `name` under `parent` (never following it).
fn unlink_file(parent: BorrowedFd<'_>, name: &OsStr, abs: &Path) -> Result<(), PathError> {
    match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(SyscallError::new("unlinkat", abs, e).into()),
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
fn try_rmdir(parent: BorrowedFd<'_>, name: &OsStr, abs: &Path) -> Result<Rmdir, PathError> {
    match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(Rmdir::Gone),
        Err(Errno::ENOTDIR) => Ok(Rmdir::NotADir),
        Err(Errno::EBUSY) => Err(PathError::MountInside {
            path: abs.to_path_buf(),
        }),
        Err(_) => Ok(Rmdir::NotEmpty),
    }
}

/// A directory [`remove_tree`] is emptying.
struct Frame {
    /// Its name in the directory below it on the stack (or the tree's parent).
    name: OsString,
    /// Its absolute path (for errors).
    abs: PathBuf,
    /// The open directory.
    fd: OwnedFd,
    /// Listed entries not yet removed.
    pending: Vec<dirents::DirEntry>,
    /// The last listing reached the end of the directory.
    listed_all: bool,
    /// How many times it was listed again after an `ENOTEMPTY`.
    relists: usize,
}

impl Frame {
    /// The open directory `fd`, with its first batch of entries listed.
    fn open(name: OsString, abs: PathBuf, fd: OwnedFd) -> Result<Self, PathError> {
        let first = list_batch(&fd, &abs)?;
        Ok(Self {
            name,
            abs,
            fd,
            pending: first.entries,
            listed_all: first.at_end,
            relists: 0,
        })
    }

    /// Lists the next batch of entries.
    fn list_more(&mut self) -> Result<(), PathError> {
        let more = list_batch(&self.fd, &self.abs)?;
        self.listed_all = more.at_end || more.entries.is_empty();
        self.pending = more.entries;
        Ok(())
    }
}

/// The next batch of entries of the open directory `fd` at `abs`.
fn list_batch(fd: &OwnedFd, abs: &Path) -> Result<dirents::Batch, PathError> {
    dirents::read_batch(fd.as_fd())
        .map_err(|e| PathError::from(SyscallError::new("getdents64", abs, e)))
}

/// Iterative post-order deletion of `parent/name`, so a deep tree cannot
/// exhaust the stack. Directories are read with `getdents64`, whose entry
/// types spare a `stat` per entry; each directory is opened once, with
/// `RESOLVE_NO_XDEV`, so the walk never enters another mount. Subdirectories
/// are first simply removed (see [`try_rmdir`]), and so is `name` itself when
/// the caller expects it empty (`likely_empty`).
fn remove_tree(
    parent: BorrowedFd<'_>,
    name: OsString,
    abs: &Path,
    likely_empty: bool,
) -> Result<(), PathError> {
    if likely_empty {
        match try_rmdir(parent, &name, abs)? {
            Rmdir::Gone => return Ok(()),
            Rmdir::NotADir => return unlink_file(parent, &name, abs),
            Rmdir::NotEmpty => {}
        }
    }
    let fd = match open_subdir(parent, &name, abs) {
        Ok(Some(fd)) => fd,
        Ok(None) => return Ok(()),
        Err(Ok(_not_a_dir)) => return unlink_file(parent, &name, abs),
        Err(Err(e)) => return Err(e),
    };
    let mut stack = vec![Frame::open(name, abs.to_path_buf(), fd)?];
    while let Some(top) = stack.last_mut() {
        if let Some(child) = top.pending.pop() {
            if let Some(dir) = remove_entry(top, child)? {
                stack.push(dir);
            }
            continue;
        }
        // Every listed entry is gone. A big directory is read a batch at a
        // time; entries may also have appeared meanwhile (rmdir then says
        // ENOTEMPTY): list again, a bounded number of times.
        if !top.listed_all {
            top.list_more()?;
            continue;
        }
        if rmdir_emptied(&mut stack, parent)? {
            stack.pop();
        }
    }
    Ok(())
}

/// Removes the listed entry `child` of `dir`: a file is unlinked, an empty
/// directory removed; a directory with entries is opened and returned, to
/// be emptied first.
fn remove_entry(dir: &Frame, child: dirents::DirEntry) -> Result<Option<Frame>, PathError> {
    let child_abs = dir.abs.join(&child.name);
    let fd = dir.fd.as_fd();
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
        Ok(Some(child_fd)) => Frame::open(child.name, child_abs, child_fd).map(Some),
        Ok(None) => Ok(None),
        Err(Ok(_not_a_dir)) => unlink_file(fd, &child.name, &child_abs).map(|()| None),
        Err(Err(e)) => Err(e),
    }
}

/// Removes the emptied directory on top of `stack` (its parent is the frame
/// below it, or `parent`): `Ok(true)` when it is gone, `Ok(false)` when
/// entries appeared meanwhile and it is to be listed again.
fn rmdir_emptied(stack: &mut [Frame], parent: BorrowedFd<'_>) -> Result<bool, PathError> {
    let Some((top, below)) = stack.split_last_mut() else {
        return Ok(true);
    };
    let dir_parent = below.last().map_or(parent, |f| f.fd.as_fd());
    match unlinkat(dir_parent, top.name.as_os_str(), UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(true),
        Err(Errno::ENOTEMPTY | Errno::EEXIST) if top.relists < MAX_RELISTS => {
            top.relists += 1;
            top.listed_all = false;
            Ok(false)
        }
        Err(Errno::EBUSY) => Err(PathError::MountInside {
            path: top.abs.clone(),
        }),
        Err(e) => Err(SyscallError::new("unlinkat", &top.abs, e).into()),
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
        let (_, created) = r.mkdir_all_created(&rel, 0o750).unwrap();
        assert!(created);
        // Someone deletes ROOT/pods under the manager: the next pod still
        // lands in ROOT/pods, not in the deleted directory.
        std::fs::remove_dir_all(r.path().join("pods")).unwrap();
        let rel2 = RelPath::new(["pods", "u2", "volumes", "x"]).unwrap();
        let (t, created) = r.mkdir_all_created(&rel2, 0o750).unwrap();
        assert!(created);
        assert_eq!(t.path(), r.path().join("pods/u2/volumes/x"));
        assert!(r.path().join("pods/u2/volumes/x").is_dir());
        // An existing pod directory takes the general path.
        let (_, created) = r.mkdir_all_created(&rel2, 0o750).unwrap();
        assert!(!created);
        let rel3 = RelPath::new(["pods", "u2", "volumes", "y"]).unwrap();
        let (_, created) = r.mkdir_all_created(&rel3, 0o750).unwrap();
        assert!(created);
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
}
