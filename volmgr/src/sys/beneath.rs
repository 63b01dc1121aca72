//! The one place paths under ROOT are resolved: relative to an open
//! directory, never following a symlink, never leaving that directory, and
//! never crossing a mount point (except, when asked, into a mount on the
//! last component). [`RootDir`](super::root_dir::RootDir) builds on it.
//!
//! `openat2(2)` (Linux 5.6) does it in one call. Where it fails with
//! `ENOSYS` (older kernels such as RHEL 8's 4.18, valgrind, some seccomp
//! profiles) that is noticed once and remembered, and every open is then a
//! walk, one component at a time from the starting directory, as the
//! kubelet's subpath code does (`doSafeOpen`): `openat(O_NOFOLLOW)` of a
//! single normal component relative to the previous descriptor (`O_PATH`
//! for the directories on the way), refusing symlinks and `..`, and
//! checking after each step, by mount id ([`mount_id`](super::mount_id)),
//! that the walk is still on the starting directory's mount. The mount
//! rule is thus the same both ways.
//!
//! Errors keep `openat2(2)`'s meaning, whatever does the work: `ELOOP` for
//! a symlink met on the way, `EXDEV` for a mount point (or an escape),
//! `ENOENT`, `ENOTDIR`.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path};
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};

use super::mount_id::{self, MountKey};

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
    /// Any component may be a mount point (a mount nested inside a
    /// volume, which the kubelet's `doSafeOpen` crosses for a subPath):
    /// still never a symlink nor `..`, so never out of the tree below the
    /// starting directory.
    MayCrossMounts,
}

fn resolve(last: Last) -> ResolveFlag {
    let beneath = ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS;
    match last {
        Last::OnSameMount => beneath | ResolveFlag::RESOLVE_NO_XDEV,
        Last::MayBeMountRoot | Last::MayCrossMounts => beneath,
    }
}

/// Whether `openat2` works: not known yet, yes, no (`ENOSYS`).
static OPENAT2: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

/// Whether `openat2` is used: `None` before the first open, `Some(false)`
/// once it answered `ENOSYS` (every open is then a walk).
pub fn openat2_in_use() -> Option<bool> {
    match OPENAT2.load(Ordering::Relaxed) {
        YES => Some(true),
        NO => Some(false),
        _ => None,
    }
}

/// The call that resolves paths, for errors: `openat2`, or `openat` once
/// the fallback walk is in use.
pub fn call_name() -> &'static str {
    match openat2_in_use() {
        Some(false) => "openat",
        _ => "openat2",
    }
}

/// Opens `path` (relative, made of normal components, or `.`) under `dir`
/// with `flags` (plus `O_CLOEXEC`). With [`Last::MayBeMountRoot`], `path`
/// must be a single component.
pub fn open(dir: BorrowedFd<'_>, path: &Path, flags: OFlag, last: Last) -> Result<OwnedFd, Errno> {
    debug_assert!(last != Last::MayBeMountRoot || path.components().count() == 1);
    let known = OPENAT2.load(Ordering::Relaxed);
    if known != NO {
        match open_openat2(dir, path, flags, last) {
            Err(Errno::ENOSYS) => {
                OPENAT2.store(NO, Ordering::Relaxed);
                tracing::info!(
                    "openat2 is not available (ENOSYS): resolving paths one component at a time"
                );
            }
            r => {
                if known == UNKNOWN {
                    OPENAT2.store(YES, Ordering::Relaxed);
                }
                return r;
            }
        }
    }
    walk(dir, path, flags, last)
}

fn open_openat2(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: OFlag,
    last: Last,
) -> Result<OwnedFd, Errno> {
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

/// The fallback of [`open`]: one component at a time (see the module doc).
fn walk(dir: BorrowedFd<'_>, path: &Path, flags: OFlag, last: Last) -> Result<OwnedFd, Errno> {
    let names = normal_components(path)?;
    if names.is_empty() {
        // `.`: the directory itself, on its own mount by definition.
        return openat(dir, ".", flags | OFlag::O_CLOEXEC, Mode::empty());
    }
    let want = mount_id::of_fd(dir)?;
    let mut cur: Option<OwnedFd> = None;
    for (i, name) in names.iter().enumerate() {
        let parent = cur.as_ref().map_or(dir, |f| f.as_fd());
        let is_last = i + 1 == names.len();
        let step = if is_last {
            flags
        } else {
            OFlag::O_PATH | OFlag::O_DIRECTORY
        };
        let fd = open_one(parent, name, step)?;
        let may_cross = match last {
            Last::OnSameMount => false,
            Last::MayBeMountRoot => is_last,
            Last::MayCrossMounts => true,
        };
        if !may_cross {
            check_mount(fd.as_fd(), want)?;
        }
        cur = Some(fd);
    }
    cur.ok_or(Errno::ENOENT)
}

/// The components of `path`, each a normal name; `..`, `/` or a prefix
/// would leave the starting directory (`EXDEV`, as `RESOLVE_BENEATH`).
fn normal_components(path: &Path) -> Result<Vec<&OsStr>, Errno> {
    let mut names = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => names.push(n),
            Component::CurDir => {}
            _ => return Err(Errno::EXDEV),
        }
    }
    Ok(names)
}

/// `openat(parent, name, flags | O_NOFOLLOW | O_CLOEXEC)` of one
/// component, refusing a symlink with `ELOOP` whatever the flags (with
/// `O_PATH` the kernel would open the link itself, or say `ENOTDIR`).
fn open_one(parent: BorrowedFd<'_>, name: &OsStr, flags: OFlag) -> Result<OwnedFd, Errno> {
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match openat(parent, name, flags, Mode::empty()) {
        Ok(fd) if flags.contains(OFlag::O_PATH) && is_symlink(fd.as_fd(), "")? => Err(Errno::ELOOP),
        Ok(fd) => Ok(fd),
        Err(Errno::ENOTDIR) if is_symlink(parent, name)? => Err(Errno::ELOOP),
        Err(e) => Err(e),
    }
}

fn is_symlink<P: ?Sized + nix::NixPath>(dir: BorrowedFd<'_>, name: &P) -> Result<bool, Errno> {
    let flags = AtFlags::AT_SYMLINK_NOFOLLOW
        | if name.is_empty() {
            AtFlags::AT_EMPTY_PATH
        } else {
            AtFlags::empty()
        };
    match fstatat(dir, name, flags) {
        Ok(st) => Ok(SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK),
        // Gone meanwhile: the caller reports its own error.
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `EXDEV` unless `fd` is on the mount `want` names.
fn check_mount(fd: BorrowedFd<'_>, want: MountKey) -> Result<(), Errno> {
    if mount_id::of_fd_like(fd, want)? == want {
        Ok(())
    } else {
        Err(Errno::EXDEV)
    }
}
