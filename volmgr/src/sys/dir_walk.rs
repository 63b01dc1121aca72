//! A depth-first walk of a directory tree that pod contents cannot turn
//! against the manager: iterative (no recursion to overflow), with at most
//! [`MAX_OPEN_DIRS`] directories open however deep the tree (deeper ones
//! are closed and reopened through a checked `..` on the way back up), and
//! paths built only for error messages (memory in proportion to the depth,
//! not its square). Used to delete trees and to change their ownership.
//!
//! The caller decides what to do with each entry and which subdirectories
//! to enter; it opens them itself (never following symlinks, never
//! crossing mounts) and hands the descriptor to [`DirWalk::enter`].

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::sys::{dirents, SyscallError};

/// How many directories a walk keeps open at once.
pub const MAX_OPEN_DIRS: usize = 64;

/// A directory being walked.
struct Frame {
    /// Its name in the directory below it on the stack.
    name: OsString,
    /// The open directory; `None` while closed to bound descriptors (only
    /// frames below the top are ever closed).
    fd: Option<OwnedFd>,
    /// Its device and inode, to check a reopened directory is the same one:
    /// read from the descriptor when it is closed (most walks are shallow
    /// and never close one, so never pay the `fstat`).
    id: Option<(u64, u64)>,
    /// Listed entries not yet handed out.
    pending: Vec<dirents::DirEntry>,
    /// The last listing reached the end of the directory.
    listed_all: bool,
}

/// What [`DirWalk::next_step`] found.
#[derive(Debug)]
pub enum Step {
    /// An entry of the current (top) directory.
    Entry(dirents::DirEntry),
    /// Every entry of the current directory was handed out.
    DirDone,
}

/// The directories being walked, the tree's root first.
pub struct DirWalk {
    /// The tree root's absolute path (for errors).
    abs: PathBuf,
    stack: Vec<Frame>,
    /// Frames `..closed` have no descriptor.
    closed: usize,
}

impl DirWalk {
    /// A walk of the open directory `fd`, whose path is `abs`.
    pub fn new(abs: &Path, fd: OwnedFd) -> Result<Self, SyscallError> {
        let mut w = Self {
            abs: abs.to_path_buf(),
            stack: Vec::new(),
            closed: 0,
        };
        w.push(OsString::new(), fd)?;
        Ok(w)
    }

    /// The absolute path of the current directory, and of `child` under it.
    /// Costs the depth: build it only for errors.
    pub fn path(&self, child: Option<&OsStr>) -> PathBuf {
        self.path_at(self.stack.len().saturating_sub(1), child)
    }

    fn path_at(&self, depth: usize, child: Option<&OsStr>) -> PathBuf {
        let mut p = self.abs.clone();
        for f in self.stack.iter().take(depth + 1).skip(1) {
            p.push(&f.name);
        }
        if let Some(c) = child {
            p.push(c);
        }
        p
    }

    /// The current directory's descriptor.
    pub fn dir(&self) -> Result<BorrowedFd<'_>, SyscallError> {
        match self.stack.last().and_then(|f| f.fd.as_ref()) {
            Some(fd) => Ok(fd.as_fd()),
            None => Err(SyscallError::new("openat", self.path(None), Errno::EBADF)),
        }
    }

    /// The next entry of the current directory (listing more as needed), or
    /// [`Step::DirDone`]; `None` once the walk left the root.
    pub fn next_step(&mut self) -> Result<Option<Step>, SyscallError> {
        loop {
            let Some(top) = self.stack.last_mut() else {
                return Ok(None);
            };
            if let Some(e) = top.pending.pop() {
                return Ok(Some(Step::Entry(e)));
            }
            if top.listed_all {
                return Ok(Some(Step::DirDone));
            }
            let batch = match top.fd.as_ref() {
                Some(fd) => dirents::read_batch(fd.as_fd()),
                None => Err(Errno::EBADF),
            };
            let more = batch.map_err(|e| SyscallError::new("getdents64", self.path(None), e))?;
            if let Some(top) = self.stack.last_mut() {
                top.listed_all = more.at_end || more.entries.is_empty();
                top.pending = more.entries;
            }
        }
    }

    /// Lists the current directory again from its start (entries appeared
    /// while it was being emptied).
    pub fn relist(&mut self) -> Result<(), SyscallError> {
        let path = || self.path(None);
        let fd = self.dir()?;
        nix::unistd::lseek(fd, 0, nix::unistd::Whence::SeekSet)
            .map_err(|e| SyscallError::new("lseek", path(), e))?;
        if let Some(top) = self.stack.last_mut() {
            top.pending.clear();
            top.listed_all = false;
        }
        Ok(())
    }

    /// Enters subdirectory `name` of the current directory, opened by the
    /// caller as `fd`: it becomes the current directory.
    pub fn enter(&mut self, name: OsString, fd: OwnedFd) -> Result<(), SyscallError> {
        self.push(name, fd)
    }

    fn push(&mut self, name: OsString, fd: OwnedFd) -> Result<(), SyscallError> {
        let first = dirents::read_batch(fd.as_fd())
            .map_err(|e| SyscallError::new("getdents64", self.path(Some(&name)), e))?;
        self.stack.push(Frame {
            name,
            fd: Some(fd),
            id: None,
            pending: first.entries,
            listed_all: first.at_end,
        });
        if self.stack.len() - self.closed > MAX_OPEN_DIRS {
            self.close_frame(self.closed)?;
            self.closed += 1;
        }
        Ok(())
    }

    /// Closes frame `i`'s descriptor, keeping its identity for the check
    /// when it is reopened through `..`.
    fn close_frame(&mut self, i: usize) -> Result<(), SyscallError> {
        let path = self.path_at(i, None);
        let Some(f) = self.stack.get_mut(i) else {
            return Ok(());
        };
        if let Some(fd) = f.fd.take() {
            if f.id.is_none() {
                let st =
                    nix::sys::stat::fstat(&fd).map_err(|e| SyscallError::new("fstat", path, e))?;
                f.id = Some((st.st_dev, st.st_ino));
            }
        }
        Ok(())
    }

    /// The current directory's name in its parent and the parent's
    /// descriptor (reopened through `..` if it was closed, and checked to
    /// be the same directory as when it was entered); `None` at the root.
    pub fn parent(&mut self) -> Result<Option<(&OsStr, BorrowedFd<'_>)>, SyscallError> {
        let n = self.stack.len();
        if n < 2 {
            return Ok(None);
        }
        self.open_parent()?;
        let (Some(below), Some(top)) = (self.stack.get(n - 2), self.stack.last()) else {
            return Ok(None);
        };
        match below.fd.as_ref() {
            Some(fd) => Ok(Some((top.name.as_os_str(), fd.as_fd()))),
            None => Err(SyscallError::new(
                "openat",
                self.path_at(n - 2, None),
                Errno::EBADF,
            )),
        }
    }

    /// Leaves the current directory: its parent becomes current (reopened
    /// through `..` first if it was closed).
    pub fn leave(&mut self) -> Result<(), SyscallError> {
        if self.stack.len() >= 2 {
            self.open_parent()?;
        }
        self.stack.pop();
        Ok(())
    }

    /// Makes sure the frame below the top has its descriptor: opens `..` of
    /// the current directory if it was closed, unless someone moved a
    /// directory meanwhile (then `ESTALE`, and nothing is done through it).
    fn open_parent(&mut self) -> Result<(), SyscallError> {
        let n = self.stack.len();
        if n < 2 || n - 2 >= self.closed {
            return Ok(());
        }
        let below = || self.path_at(n - 2, None);
        let top = self.dir()?;
        let Some(want) = self.stack.get(n - 2).and_then(|f| f.id) else {
            return Err(SyscallError::new("openat", below(), Errno::EBADF));
        };
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::openat(top, "..", flags, Mode::empty())
            .map_err(|e| SyscallError::new("openat", below(), e))?;
        let st = nix::sys::stat::fstat(&fd).map_err(|e| SyscallError::new("fstat", below(), e))?;
        if (st.st_dev, st.st_ino) != want {
            return Err(SyscallError::new("openat", below(), Errno::ESTALE));
        }
        if let Some(f) = self.stack.get_mut(n - 2) {
            f.fd = Some(fd);
        }
        self.closed = n - 2;
        Ok(())
    }
}
