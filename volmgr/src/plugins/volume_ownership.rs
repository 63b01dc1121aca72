//! The kubelet's `SetVolumeOwnership` (`pkg/volume/volume_linux.go`): give
//! every file of a volume the pod's `fsGroup`, make it group-readable (and
//! -writable unless read-only), and make directories setgid so new files
//! inherit the group. With `fsGroupChangePolicy: OnRootMismatch` the walk is
//! skipped when the volume's root already has the group and the bits (the
//! kubelet's `skipPermissionChange`).
//!
//! Unlike the kubelet's `filepath.Walk`, the walk never follows a symlink
//! (`fchownat`/`fchmodat2` with `AT_SYMLINK_NOFOLLOW`, or before Linux 6.6
//! `chmod` through an `O_PATH | O_NOFOLLOW` descriptor, so swapping a file
//! for a symlink mid-walk changes nothing outside the volume), never
//! crosses into another mount, keeps a bounded number of directories open
//! however deep the tree ([`DirWalk`]), and leaves entries that already
//! match alone (a second walk costs one `fstatat` per entry).

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::Gid;

use crate::plugins::VolumeError;
use crate::sys::beneath::{self, Last};
use crate::sys::dir_walk::{DirWalk, Step};
use crate::sys::{dirents, SyscallError};

pub use crate::volume::FsGroupChangePolicy;

/// What [`set_volume_ownership`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OwnershipChange {
    /// The walk was skipped (`OnRootMismatch` and the root matched).
    pub skipped: bool,
    /// Entries looked at (the root included).
    pub visited: u64,
    /// Entries whose group or mode was changed.
    pub changed: u64,
}

/// `rw` for the group (and owner), the kubelet's `rwMask`.
const RW_MASK: u32 = 0o660;
/// `r` only, for read-only volumes: the kubelet's `roMask`.
const RO_MASK: u32 = 0o440;
/// `x` for directories: the kubelet's `execMask`.
const EXEC_MASK: u32 = 0o110;
/// setgid.
const SETGID: u32 = 0o2000;

/// The bits an entry of kind `dir` must have.
fn required_bits(dir: bool, read_only: bool) -> u32 {
    let base = if read_only { RO_MASK } else { RW_MASK };
    if dir {
        base | EXEC_MASK | SETGID
    } else {
        base
    }
}

/// Gives the volume whose root is the open directory `root` (at `abs`, for
/// errors) group `gid` as described in the module doc.
pub fn set_volume_ownership(
    root: BorrowedFd<'_>,
    abs: &Path,
    gid: u32,
    read_only: bool,
    policy: FsGroupChangePolicy,
) -> Result<OwnershipChange, VolumeError> {
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let top: OwnedFd = nix::fcntl::openat(root, ".", dir_flags, Mode::empty())
        .map_err(|e| SyscallError::new("openat", abs, e))?;
    let st = nix::sys::stat::fstat(&top).map_err(|e| SyscallError::new("fstat", abs, e))?;
    let mut out = OwnershipChange::default();
    if policy == FsGroupChangePolicy::OnRootMismatch && matches(&st, gid, read_only) {
        out.skipped = true;
        return Ok(out);
    }
    change(top.as_fd(), &st, gid, read_only, &mut out)
        .map_err(|e| SyscallError::new("chown", abs, e))?;
    let mut walk = DirWalk::new(abs, top)?;
    while let Some(step) = walk.next_step()? {
        match step {
            Step::Entry(e) => {
                let sub = visit(walk.dir()?, &e, gid, read_only, &mut out)
                    .map_err(|err| SyscallError::new("chown", walk.path(Some(&e.name)), err))?;
                if let Some(fd) = sub {
                    walk.enter(e.name, fd)?;
                }
            }
            Step::DirDone => walk.leave()?,
        }
    }
    Ok(out)
}

/// Whether an entry already has the group and the bits.
fn matches(st: &FileStat, gid: u32, read_only: bool) -> bool {
    let dir = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR;
    let need = required_bits(dir, read_only);
    st.st_gid == gid && st.st_mode & need == need
}

/// Changes entry `e` of `dir`; returns a directory to enter (a readable
/// descriptor), unless it is another mount's root.
fn visit(
    dir: BorrowedFd<'_>,
    e: &dirents::DirEntry,
    gid: u32,
    read_only: bool,
    out: &mut OwnershipChange,
) -> Result<Option<OwnedFd>, Errno> {
    if e.kind == dirents::EntryKind::Dir {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
        match beneath::open(dir, Path::new(&e.name), flags, Last::OnSameMount) {
            Ok(fd) => {
                let st = nix::sys::stat::fstat(&fd)?;
                change(fd.as_fd(), &st, gid, read_only, out)?;
                return Ok(Some(fd));
            }
            // Gone, or a mount someone placed inside: not ours to change.
            Err(Errno::ENOENT | Errno::EXDEV) => return Ok(None),
            // Swapped for something else since it was listed: handle it as
            // whatever it is now, below.
            Err(Errno::ENOTDIR | Errno::ELOOP) => {}
            Err(err) => return Err(err),
        }
    }
    let st = match nix::sys::stat::fstatat(dir, e.name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(None),
        Err(err) => return Err(err),
    };
    out.visited += 1;
    if matches(&st, gid, read_only) {
        return Ok(None);
    }
    let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
    // Never through a symlink: the group of a symlink itself, and the mode
    // only of what is not one (a file swapped for a symlink since the stat
    // makes `fchmodat2` refuse, and the O_PATH fallback names the entry).
    nix::unistd::fchownat(
        dir,
        e.name.as_os_str(),
        None,
        Some(Gid::from_raw(gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )?;
    if kind != SFlag::S_IFLNK {
        let mode = (st.st_mode & 0o7777) | required_bits(kind == SFlag::S_IFDIR, read_only);
        chmod_no_follow(dir, &e.name, mode)?;
    }
    out.changed += 1;
    Ok(None)
}

/// `fchmodat2(2)` (Linux 6.6), the one `chmod` that can refuse symlinks.
const SYS_FCHMODAT2: libc::c_long = 452;

/// Whether `fchmodat2` answered `ENOSYS` once (an older kernel).
static NO_FCHMODAT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `chmod` of `dir/name` that never follows a symlink: `fchmodat2` with
/// `AT_SYMLINK_NOFOLLOW`, or before 6.6 through an `O_PATH | O_NOFOLLOW`
/// descriptor's `/proc/self/fd` link (which names the entry, not a path).
/// A symlink found in its place is left alone.
fn chmod_no_follow(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> Result<(), Errno> {
    use std::sync::atomic::Ordering;
    if !NO_FCHMODAT2.load(Ordering::Relaxed) {
        let c = std::ffi::CString::new(name.as_encoded_bytes()).map_err(|_| Errno::EINVAL)?;
        // SAFETY: a valid descriptor, a NUL-terminated name, plain integers.
        let rc = unsafe {
            libc::syscall(
                SYS_FCHMODAT2,
                dir.as_raw_fd(),
                c.as_ptr(),
                mode,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        match (rc, Errno::last()) {
            (0, _) => return Ok(()),
            // A symlink now: not ours to change.
            (_, Errno::EOPNOTSUPP) => return Ok(()),
            (_, Errno::ENOSYS | Errno::EPERM) => NO_FCHMODAT2.store(true, Ordering::Relaxed),
            (_, e) => return Err(e),
        }
    }
    let fd = open_path(dir, name)?;
    let st = nix::sys::stat::fstat(&fd)?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK {
        return Ok(());
    }
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        link.as_str(),
        Mode::from_bits_truncate(mode),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
}

/// `O_PATH | O_NOFOLLOW`: names the entry itself (a symlink too) without
/// opening it (no side effect on devices or FIFOs).
fn open_path(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    nix::fcntl::openat(dir, name, flags, Mode::empty())
}

/// Group and mode of an open directory.
fn change(
    fd: BorrowedFd<'_>,
    st: &FileStat,
    gid: u32,
    read_only: bool,
    out: &mut OwnershipChange,
) -> Result<(), Errno> {
    out.visited += 1;
    if matches(st, gid, read_only) {
        return Ok(());
    }
    nix::unistd::fchown(fd, None, Some(Gid::from_raw(gid)))?;
    let mode = (st.st_mode & 0o7777) | required_bits(true, read_only);
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode))?;
    out.changed += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    const GID: u32 = 4321;

    fn run(dir: &Path, policy: FsGroupChangePolicy) -> OwnershipChange {
        let fd = std::fs::File::open(dir).unwrap();
        set_volume_ownership(fd.as_fd(), dir, GID, false, policy).unwrap()
    }

    fn root_only() -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        eprintln!("SKIP: changing a file's group to any GID needs root");
        false
    }

    /// Files, directories, a FIFO and a symlink to a file outside: every
    /// entry gets the group and the bits (directories setgid), the FIFO is
    /// not opened (the walk would block), and the symlink's target is left
    /// alone. A second walk changes nothing; `OnRootMismatch` then skips.
    #[test]
    fn gives_every_entry_the_group_but_never_follows_a_symlink() {
        if !root_only() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let vol = t.path().join("vol");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(vol.join("a/b/c")).unwrap();
        std::fs::write(vol.join("a/b/c/f"), b"x").unwrap();
        std::fs::write(vol.join("top"), b"x").unwrap();
        std::fs::set_permissions(vol.join("top"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&outside, b"secret").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&outside, vol.join("a/link")).unwrap();
        nix::unistd::mkfifo(&vol.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();

        let first = run(&vol, FsGroupChangePolicy::Always);
        assert!(!first.skipped);
        assert_eq!(first.visited, 8, "{first:?}");
        for p in ["", "a", "a/b", "a/b/c"] {
            let m = std::fs::metadata(vol.join(p)).unwrap();
            assert_eq!(m.gid(), GID, "{p}");
            assert_eq!(m.mode() & 0o2770, 0o2770, "{p}: {:o}", m.mode());
        }
        for p in ["a/b/c/f", "top", "fifo"] {
            let m = std::fs::symlink_metadata(vol.join(p)).unwrap();
            assert_eq!(m.gid(), GID, "{p}");
            assert_eq!(m.mode() & 0o660, 0o660, "{p}: {:o}", m.mode());
            assert_eq!(m.mode() & 0o2000, 0, "{p}: files are not setgid");
        }
        assert_eq!(
            std::fs::symlink_metadata(vol.join("a/link")).unwrap().gid(),
            GID
        );
        let o = std::fs::metadata(&outside).unwrap();
        assert_ne!(o.gid(), GID, "the symlink's target was changed");
        assert_eq!(o.mode() & 0o777, 0o600);

        let again = run(&vol, FsGroupChangePolicy::Always);
        assert_eq!((again.visited, again.changed), (8, 0), "{again:?}");
        let skipped = run(&vol, FsGroupChangePolicy::OnRootMismatch);
        assert!(skipped.skipped);
        // A root that lost its setgid bit: OnRootMismatch walks again.
        std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o770)).unwrap();
        let walked = run(&vol, FsGroupChangePolicy::OnRootMismatch);
        assert!(!walked.skipped);
        assert_eq!(walked.changed, 1);
    }

    /// Read-only volumes get `r` for the group, not `w`.
    #[test]
    fn read_only_volumes_get_read_bits_only() {
        if !root_only() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), b"x").unwrap();
        std::fs::set_permissions(t.path().join("f"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        let fd = std::fs::File::open(t.path()).unwrap();
        set_volume_ownership(fd.as_fd(), t.path(), GID, true, FsGroupChangePolicy::Always).unwrap();
        let m = std::fs::metadata(t.path().join("f")).unwrap();
        assert_eq!(m.mode() & 0o777, 0o640);
    }

    /// CVE-2021-25741's shape against the walk: another thread keeps
    /// swapping a file of the volume for a symlink to a file outside while
    /// walks run. The outside file never gets the group nor new bits.
    #[test]
    fn a_file_swapped_for_a_symlink_mid_walk_changes_nothing_outside() {
        if !root_only() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let vol = t.path().join("vol");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(vol.join("d")).unwrap();
        for i in 0..50 {
            std::fs::write(vol.join(format!("d/f{i}")), b"x").unwrap();
        }
        std::fs::write(&outside, b"secret").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (stop, vol, outside) = (stop.clone(), vol.clone(), outside.clone());
            std::thread::spawn(move || {
                let (file, tmp) = (vol.join("d/f7"), vol.join("d/tmp-link"));
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::fs::remove_file(&tmp);
                    let _ = std::os::unix::fs::symlink(&outside, &tmp);
                    let _ = std::fs::rename(&tmp, &file);
                    let _ = std::fs::write(vol.join("d/new"), b"x");
                    let _ = std::fs::rename(vol.join("d/new"), &file);
                }
            })
        };
        for _ in 0..300 {
            let fd = std::fs::File::open(&vol).unwrap();
            // Errors (an entry gone mid-walk) are fine; changes outside are not.
            let _ = set_volume_ownership(fd.as_fd(), &vol, GID, false, FsGroupChangePolicy::Always);
            std::fs::set_permissions(vol.join("d"), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        let o = std::fs::metadata(&outside).unwrap();
        assert_ne!(o.gid(), GID, "the walk changed a file outside the volume");
        assert_eq!(o.mode() & 0o777, 0o600);
    }

    /// The same where `fchmodat2` and `openat2` fail with ENOSYS (before
    /// Linux 6.6 and 5.6): the O_PATH fallback keeps the same rules.
    mod older_kernel {
        use crate::sys::test_child::{run_in_child, Child};

        macro_rules! again {
            ($($name:ident),* $(,)?) => {$(
                #[test]
                fn $name() {
                    let name = concat!(module_path!(), "::", stringify!($name));
                    run_in_child(name, Child::NoOpenat2, super::$name);
                }
            )*};
        }

        again!(
            gives_every_entry_the_group_but_never_follows_a_symlink,
            a_file_swapped_for_a_symlink_mid_walk_changes_nothing_outside,
        );
    }
}
