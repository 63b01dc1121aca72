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
    openat2_retrying(
        dir,
        path,
        OpenHow::new()
            // RESOLVE_NO_SYMLINKS covers the last component too (ELOOP);
            // O_NOFOLLOW would instead open a final symlink itself.
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(resolve(last)),
    )
}

/// How many times [`openat2_retrying`] tries again after `EAGAIN`.
const EAGAIN_RETRIES: usize = 256;

/// `openat2`, tried again on `EAGAIN`: with `RESOLVE_BENEATH` the kernel
/// answers it when any rename or mount on the system (another pod's set-up,
/// a test in another namespace) raced the resolution of a `..` component,
/// and openat2(2) says to retry.
fn openat2_retrying(dir: BorrowedFd<'_>, path: &Path, how: OpenHow) -> Result<OwnedFd, Errno> {
    let mut tries = 0;
    loop {
        match openat2(dir, path, how) {
            Err(Errno::EAGAIN) if tries < EAGAIN_RETRIES => {
                tries += 1;
                std::thread::yield_now();
            }
            r => return r,
        }
    }
}

/// How many symlinks [`open_in_volume`]'s walk follows (the kernel's
/// limit for one path).
const MAX_SYMLINKS: usize = 40;

/// Opens `path` below `dir` the way a subPath inside a volume is resolved
/// (the kubelet's `EvalSymlinks`, then `PathWithinBase`): symlinks are
/// followed as long as they stay below `dir` (a configMap volume's
/// `key -> ..data/key -> ..<timestamp>/key`); an absolute symlink, or one
/// whose `..` climbs above `dir`, is `EXDEV`; magic links are refused;
/// mounts nested below `dir` are crossed. One `openat2(RESOLVE_BENEATH)`,
/// or, where it is missing, a walk that reads each symlink relative to the
/// directory descriptor it lies in and keeps its own stack of directories,
/// so no symlink, however swapped meanwhile, takes it above `dir`.
pub fn open_in_volume(dir: BorrowedFd<'_>, path: &Path, flags: OFlag) -> Result<OwnedFd, Errno> {
    if OPENAT2.load(Ordering::Relaxed) != NO {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        match openat2_retrying(dir, path, how) {
            Err(Errno::ENOSYS) => OPENAT2.store(NO, Ordering::Relaxed),
            r => return r,
        }
    }
    walk_following(dir, path, flags)
}

/// The fallback of [`open_in_volume`].
fn walk_following(dir: BorrowedFd<'_>, path: &Path, flags: OFlag) -> Result<OwnedFd, Errno> {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStrExt;
    if path.is_absolute() {
        return Err(Errno::EXDEV);
    }
    let parts = |p: &Path| -> VecDeque<OsString> {
        p.as_os_str()
            .as_bytes()
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .map(|c| OsStr::from_bytes(c).to_os_string())
            .collect()
    };
    let mut pending = parts(path);
    // The directories opened below `dir`, the last one current.
    let mut stack: Vec<OwnedFd> = Vec::new();
    // Whether the top of the stack was opened with `flags` as the last step.
    let mut final_open = false;
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        final_open = false;
        if name.as_bytes() == b".." {
            stack.pop().ok_or(Errno::EXDEV)?;
            continue;
        }
        let parent = stack.last().map_or(dir, |f| f.as_fd());
        let is_last = pending.is_empty();
        let step = if is_last {
            flags
        } else {
            OFlag::O_PATH | OFlag::O_DIRECTORY
        };
        match open_one(parent, &name, step) {
            Ok(fd) => {
                stack.push(fd);
                final_open = is_last;
            }
            Err(Errno::ELOOP) => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Errno::ELOOP);
                }
                let target = nix::fcntl::readlinkat(parent, name.as_os_str())?;
                if Path::new(&target).is_absolute() {
                    return Err(Errno::EXDEV);
                }
                let mut spliced = parts(Path::new(&target));
                spliced.extend(pending.drain(..));
                pending = spliced;
            }
            Err(e) => return Err(e),
        }
    }
    match (stack.pop(), final_open) {
        (Some(fd), true) => Ok(fd),
        // Ended on a directory reached by `..` or a symlink: opened again
        // with the caller's flags.
        (Some(fd), false) => openat(fd.as_fd(), ".", flags | OFlag::O_CLOEXEC, Mode::empty()),
        (None, _) => openat(dir, ".", flags | OFlag::O_CLOEXEC, Mode::empty()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    /// A configMap-like volume: `k -> ..data/k`, `..data -> ..v1`, with
    /// symlinks that leave it, one that loops, and one through `..` that
    /// stays inside.
    fn volume() -> (tempfile::TempDir, std::path::PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let vol = t.path().join("vol");
        std::fs::create_dir_all(vol.join("..v1/sub")).unwrap();
        std::fs::write(vol.join("..v1/k"), "value").unwrap();
        std::fs::write(t.path().join("secret"), "outside").unwrap();
        symlink("..v1", vol.join("..data")).unwrap();
        symlink("..data/k", vol.join("k")).unwrap();
        symlink("..data/sub/../k", vol.join("dotdot")).unwrap();
        symlink("../secret", vol.join("up")).unwrap();
        symlink(t.path().join("secret"), vol.join("abs")).unwrap();
        symlink("..v1/sub/../../up", vol.join("via")).unwrap();
        symlink("loop2", vol.join("loop1")).unwrap();
        symlink("loop1", vol.join("loop2")).unwrap();
        (t, vol)
    }

    fn read(fd: OwnedFd) -> String {
        let mut s = String::new();
        std::fs::File::from(fd).read_to_string(&mut s).unwrap();
        s
    }

    /// Both ways (openat2 and the walk) give the same answers.
    #[test]
    fn symlinks_are_followed_only_inside_the_volume() {
        let (_t, vol) = volume();
        let dir = std::fs::File::open(&vol).unwrap();
        type Opener = fn(BorrowedFd<'_>, &Path, OFlag) -> Result<OwnedFd, Errno>;
        let ways: [(&str, Opener); 2] = [("openat2", open_in_volume), ("walk", walk_following)];
        for (way, open) in ways {
            let at = |p: &str| open(dir.as_fd(), Path::new(p), OFlag::O_RDONLY);
            assert_eq!(read(at("k").unwrap()), "value", "{way}");
            assert_eq!(read(at("dotdot").unwrap()), "value", "{way}");
            assert_eq!(read(at("..data/sub/../k").unwrap()), "value", "{way}");
            for out in ["up", "abs", "via", "../secret", "..data/../../secret"] {
                assert_eq!(at(out).unwrap_err(), Errno::EXDEV, "{way} {out}");
            }
            assert_eq!(at("loop1").unwrap_err(), Errno::ELOOP, "{way}");
            assert_eq!(at("missing").unwrap_err(), Errno::ENOENT, "{way}");
        }
    }
}
