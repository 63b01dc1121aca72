//! Which mount a file is on, asked of an open descriptor (or of a name
//! relative to one): how [`RootDir`](super::root_dir::RootDir) checks that
//! a path stayed on the mount it started on, and names a foreign mount it
//! refused to cross.
//!
//! The best answer the kernel gives is used, degrading on old kernels:
//! `statx(STATX_MNT_ID)` (Linux 5.8), else the `mnt_id:` line of
//! `/proc/self/fdinfo/<fd>` (3.15; descriptors only), else the device
//! number alone, which cannot tell a bind mount from the file system it
//! shows (documented as the weak last resort).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

/// What identifies the mount a file is on. Two keys of the same kind are
/// equal when the files are on the same mount (for [`MountKey::Dev`]: on
/// the same file system, possibly another bind mount of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKey {
    /// A mount id (`stx_mnt_id`, or fdinfo's `mnt_id`: the same number).
    Id(u64),
    /// Only the device number was available.
    Dev(u64),
}

/// The mount `fd` is on.
pub fn of_fd(fd: BorrowedFd<'_>) -> Result<MountKey, Errno> {
    let stx = statx(fd, c"", libc::AT_EMPTY_PATH)?;
    if stx.stx_mask & libc::STATX_MNT_ID != 0 {
        return Ok(MountKey::Id(stx.stx_mnt_id));
    }
    if let Some(id) = fdinfo_mnt_id(fd) {
        return Ok(MountKey::Id(id));
    }
    Ok(dev_key(&stx))
}

/// The mount `dir/name` is on (not following a final symlink, not
/// triggering an automount). Without `STATX_MNT_ID` it falls back to the
/// device number (fdinfo needs a descriptor): compare it with
/// [`of_fd_like`] of the other side.
pub fn at(dir: BorrowedFd<'_>, name: &CStr) -> Result<MountKey, Errno> {
    let stx = statx(dir, name, libc::AT_SYMLINK_NOFOLLOW)?;
    if stx.stx_mask & libc::STATX_MNT_ID != 0 {
        return Ok(MountKey::Id(stx.stx_mnt_id));
    }
    Ok(dev_key(&stx))
}

/// The mount `fd` is on, as the same kind of key as `like` (so a key from
/// [`at`] can be compared with a descriptor's).
pub fn of_fd_like(fd: BorrowedFd<'_>, like: MountKey) -> Result<MountKey, Errno> {
    match like {
        MountKey::Id(_) => of_fd(fd),
        MountKey::Dev(_) => statx(fd, c"", libc::AT_EMPTY_PATH).map(|s| dev_key(&s)),
    }
}

fn dev_key(stx: &libc::statx) -> MountKey {
    MountKey::Dev(libc::makedev(stx.stx_dev_major, stx.stx_dev_minor))
}

/// `statx(dir, name, flags | AT_NO_AUTOMOUNT, STATX_BASIC_STATS | STATX_MNT_ID)`.
fn statx(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> Result<libc::statx, Errno> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `name` is NUL-terminated, `stx` is writable memory of the
    // right size, and `dir` is an open descriptor for the call's duration.
    let rc = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::AT_NO_AUTOMOUNT,
            libc::STATX_BASIC_STATS | libc::STATX_MNT_ID,
            stx.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(Errno::last());
    }
    // SAFETY: statx returned 0, so the kernel filled the structure.
    Ok(unsafe { stx.assume_init() })
}

/// The `mnt_id:` of `/proc/self/fdinfo/<fd>` (Linux 3.15), if readable.
fn fdinfo_mnt_id(fd: BorrowedFd<'_>) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    parse_fdinfo_mnt_id(&text)
}

fn parse_fdinfo_mnt_id(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn fdinfo_and_statx_agree() {
        let d = tempfile::tempdir().unwrap();
        let f = std::fs::File::open(d.path()).unwrap();
        let by_statx = of_fd(f.as_fd()).unwrap();
        assert_eq!(fdinfo_mnt_id(f.as_fd()).map(MountKey::Id), Some(by_statx));
        assert_eq!(at(f.as_fd(), c".").unwrap(), by_statx);
        assert_eq!(
            parse_fdinfo_mnt_id("pos:\t0\nflags:\t02\nmnt_id:\t31\nino:\t5\n"),
            Some(31)
        );
        assert_eq!(parse_fdinfo_mnt_id("pos:\t0\n"), None);
    }
}
