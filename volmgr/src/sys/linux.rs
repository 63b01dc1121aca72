//! The real [`Mounter`]: `mount(2)`, `umount2(2)`, `statx(2)` and `fstatfs(2)` on
//! descriptors opened beneath the manager's root.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use nix::fcntl::OFlag;
use nix::mount::MntFlags;

use std::path::Path;

use super::mount_id;
use super::mountinfo::{self, MountInfo, MountInfoError};
use super::{
    MountTableReader, MountTableWatch, Mounter, MsFlags, PropagationError, RootPropagation,
    SyscallError, Target,
};
use crate::util::fast_map::FastSet;

/// Mounts for real, in the mount namespace of the calling process.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxMounter;

impl MountTableReader for LinuxMounter {
    fn mount_table(&self) -> Result<Vec<MountInfo>, MountInfoError> {
        mountinfo::read_self()
    }
}

impl Mounter for LinuxMounter {
    fn mount(
        &self,
        source: &str,
        target: &Target,
        fstype: &str,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SyscallError> {
        nix::mount::mount(Some(source), &target.proc_path(), Some(fstype), flags, data)
            .map_err(|e| SyscallError::new("mount", target.path(), e))
    }

    fn unmount(&self, parent: &Target, name: &OsStr) -> Result<(), SyscallError> {
        nix::mount::umount2(&parent.proc_path().join(name), MntFlags::UMOUNT_NOFOLLOW)
            .map_err(|e| SyscallError::new("umount2", parent.path().join(name), e))
    }

    fn remove_unmounted_dir(
        &self,
        parent: &Target,
        name: &OsStr,
    ) -> Result<super::UnmountedDir, SyscallError> {
        super::rmdir_unmounted(parent, name)
    }

    fn unmount_detach(&self, parent: &Target, name: &OsStr) -> Result<(), SyscallError> {
        let flags = MntFlags::UMOUNT_NOFOLLOW | MntFlags::MNT_FORCE | MntFlags::MNT_DETACH;
        nix::mount::umount2(&parent.proc_path().join(name), flags)
            .map_err(|e| SyscallError::new("umount2", parent.path().join(name), e))
    }

    fn is_mount_point(&self, target: &Target) -> Result<bool, SyscallError> {
        let stx = statx_empty_path(target)?;
        if stx.stx_attributes_mask & (libc::STATX_ATTR_MOUNT_ROOT as u64) != 0 {
            return Ok(stx.stx_attributes & (libc::STATX_ATTR_MOUNT_ROOT as u64) != 0);
        }
        // Kernels before 5.8 do not report the attribute: on another mount
        // than `..` (by mount id, which tells a bind mount of the same file
        // system; by device number where no id can be had).
        let up = nix::fcntl::openat(target, "..", PATH_DIR, nix::sys::stat::Mode::empty())
            .map_err(|e| SyscallError::new("openat", target.path().join(".."), e))?;
        differ_in_mount(target.as_fd(), up.as_fd(), target.path())
    }

    fn is_mount_point_at(&self, parent: &Target, name: &OsStr) -> Result<bool, SyscallError> {
        let path = || parent.path().join(name);
        let c_name = CString::new(name.as_bytes())
            .map_err(|_| SyscallError::new("statx", path(), nix::errno::Errno::EINVAL))?;
        let stx = match statx_at(
            parent,
            &c_name,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS,
        ) {
            Ok(stx) => stx,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
            Err(e) => return Err(SyscallError::io("statx", path(), e)),
        };
        if stx.stx_attributes_mask & (libc::STATX_ATTR_MOUNT_ROOT as u64) != 0 {
            return Ok(stx.stx_attributes & (libc::STATX_ATTR_MOUNT_ROOT as u64) != 0);
        }
        // Kernels before 5.8: on another mount than the parent (never
        // following a symlink: one is on its directory's mount).
        let flags = PATH_DIR.difference(OFlag::O_DIRECTORY) | OFlag::O_NOFOLLOW;
        let fd = match nix::fcntl::openat(parent, name, flags, nix::sys::stat::Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(SyscallError::new("openat", path(), e)),
        };
        differ_in_mount(fd.as_fd(), parent.as_fd(), &path())
    }

    fn fs_magic(&self, target: &Target) -> Result<i64, SyscallError> {
        // An O_PATH descriptor works with fstatfs.
        let st = nix::sys::statfs::fstatfs(target)
            .map_err(|e| SyscallError::new("fstatfs", target.path(), e))?;
        Ok(st.filesystem_type().0 as i64)
    }

    fn fs_usage(&self, target: &Target) -> Result<super::FsUsage, SyscallError> {
        let st = nix::sys::statfs::fstatfs(target)
            .map_err(|e| SyscallError::new("fstatfs", target.path(), e))?;
        let block = st.block_size() as u64;
        Ok(super::FsUsage {
            size_bytes: st.blocks().saturating_mul(block),
            used_bytes: st
                .blocks()
                .saturating_sub(st.blocks_free())
                .saturating_mul(block),
        })
    }

    fn watch_mount_table(&self) -> Result<Box<dyn MountTableWatch>, SyscallError> {
        Ok(Box::new(ProcMountinfoWatch::open()?))
    }

    fn mount_id(&self, target: &Target) -> Result<Option<u64>, SyscallError> {
        let stx = statx_empty_path_mask(target, STATX_MNT_ID_UNIQUE)?;
        Ok(unique_mount_id(&stx))
    }

    fn mount_id_in(&self, parent: &Target, name: &OsStr) -> Result<Option<u64>, SyscallError> {
        let path = || parent.path().join(name);
        let c_name = CString::new(name.as_bytes())
            .map_err(|_| SyscallError::new("statx", path(), nix::errno::Errno::EINVAL))?;
        let stx = statx_at(
            parent,
            &c_name,
            libc::AT_SYMLINK_NOFOLLOW,
            STATX_MNT_ID_UNIQUE,
        )
        .map_err(|e| SyscallError::io("statx", path(), e))?;
        Ok(unique_mount_id(&stx))
    }

    fn bind_mount(&self, source: &Target, target: &Target) -> Result<(), SyscallError> {
        nix::mount::mount(
            Some(&source.proc_path()),
            &target.proc_path(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| SyscallError::new("mount", target.path(), e))
    }

    fn make_rshared(&self, root: &Path) -> Result<RootPropagation, PropagationError> {
        let table = mountinfo::read_self()?;
        // The mount holding ROOT: the longest mount point above it (the
        // last one listed, i.e. the top, among mounts stacked there).
        let holding = table
            .iter()
            .filter(|m| root.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.components().count());
        if holding.is_some_and(|m| m.optional_fields.iter().any(|f| f.starts_with("shared:"))) {
            return Ok(RootPropagation::AlreadyShared);
        }
        let rebound = holding.is_none_or(|m| m.mount_point != root);
        if rebound {
            let below = table
                .iter()
                .filter(|m| m.mount_point.starts_with(root) && m.mount_point != root)
                .count();
            if below > 0 {
                return Err(PropagationError::MountsBelow {
                    root: root.to_path_buf(),
                    count: below,
                });
            }
            let dir = open_dir(root)?;
            self.bind_mount(&dir, &dir)?;
        }
        // Opened (again) now, so the walk ends on the mount at ROOT.
        let top = open_dir(root)?;
        nix::mount::mount(
            None::<&str>,
            &top.proc_path(),
            None::<&str>,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| SyscallError::new("mount", root, e))?;
        Ok(if rebound {
            RootPropagation::BoundAndMadeShared
        } else {
            RootPropagation::MadeShared
        })
    }

    fn mount_ids(&self) -> Result<Option<FastSet<u64>>, SyscallError> {
        let Some(nr) = SYS_LISTMOUNT else {
            return Ok(None);
        };
        let mut ids = FastSet::default();
        let mut buf = vec![0u64; 4096];
        let mut last = 0;
        loop {
            let req = MntIdReq {
                size: MNT_ID_REQ_SIZE_VER0,
                spare: 0,
                mnt_id: LSMT_ROOT,
                param: last,
            };
            // SAFETY: `req` is a complete `struct mnt_id_req` of the size it
            // declares, `buf` has `buf.len()` writable u64s, and the kernel
            // writes at most that many.
            let n = unsafe {
                libc::syscall(
                    nr,
                    std::ptr::from_ref(&req),
                    buf.as_mut_ptr(),
                    buf.len(),
                    0u32,
                )
            };
            let Ok(n) = usize::try_from(n) else {
                let e = std::io::Error::last_os_error();
                return match e.raw_os_error() {
                    // Before 6.8, or filtered out (seccomp).
                    Some(libc::ENOSYS | libc::EPERM | libc::EINVAL) => Ok(None),
                    _ => Err(SyscallError::io("listmount", "/", e)),
                };
            };
            let got = buf.get(..n).unwrap_or_default();
            ids.extend(got.iter().copied());
            match got.last() {
                // A full buffer: continue after its last id.
                Some(&id) if n == buf.len() => last = id,
                _ => return Ok(Some(ids)),
            }
        }
    }
}

const PATH_DIR: OFlag = OFlag::O_PATH
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_CLOEXEC);

/// Whether `a` and `b` are on different mounts ([`mount_id`]).
fn differ_in_mount(
    a: BorrowedFd<'_>,
    b: BorrowedFd<'_>,
    path: &std::path::Path,
) -> Result<bool, SyscallError> {
    let err = |e| SyscallError::new("statx", path, e);
    let key = mount_id::of_fd(a).map_err(err)?;
    Ok(mount_id::of_fd_like(b, key).map_err(err)? != key)
}

/// Opens the directory `path` as a [`Target`] (`O_PATH`).
fn open_dir(path: &Path) -> Result<Target, SyscallError> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| SyscallError::new("open", path, e))?;
    Ok(Target::new(fd, path.to_path_buf()))
}

/// Opens an absolute path on the node outside ROOT (a local
/// PersistentVolume's directory or device) as a [`Target`]: `O_PATH`, no
/// component, the last included, may be a symlink (nor `..`); mounts on the
/// way are fine. `openat2(RESOLVE_NO_SYMLINKS)` below `/`, or where the
/// kernel lacks it the checked component walk of
/// [`beneath`](crate::sys::beneath). Nothing is created.
pub fn open_host_path(path: &Path) -> Result<Target, SyscallError> {
    let root = nix::fcntl::open(
        "/",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| SyscallError::new("open", "/", e))?;
    let rel = path
        .strip_prefix("/")
        .map_err(|_| SyscallError::new("open", path, nix::errno::Errno::EINVAL))?;
    if rel.as_os_str().is_empty() {
        // `/` itself (a local PV of the whole root file system): no
        // component to resolve, and `openat2` refuses an empty path.
        return Ok(Target::new(root, path.to_path_buf()));
    }
    let fd = crate::sys::beneath::open(
        root.as_fd(),
        rel,
        OFlag::O_PATH,
        crate::sys::beneath::Last::MayCrossMounts,
    )
    .map_err(|e| SyscallError::new(crate::sys::beneath::call_name(), path, e))?;
    Ok(Target::new(fd, path.to_path_buf()))
}

/// `STATX_MNT_ID_UNIQUE` (linux/stat.h, 6.8): `stx_mnt_id` is then the
/// 64-bit mount id that is never reused, the one `listmount(2)` returns.
const STATX_MNT_ID_UNIQUE: u32 = 0x4000;

/// `listmount(2)`'s number, the same on the architectures listed (it was
/// added after their tables were unified). Elsewhere: not used.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
const SYS_LISTMOUNT: Option<libc::c_long> = Some(458);
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
const SYS_LISTMOUNT: Option<libc::c_long> = None;

/// `LSMT_ROOT`: list the mounts below the caller's root.
const LSMT_ROOT: u64 = u64::MAX;

/// `MNT_ID_REQ_SIZE_VER0`.
const MNT_ID_REQ_SIZE_VER0: u32 = 24;

/// `struct mnt_id_req` (linux/mount.h), version 0.
#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

/// A [`MountTableWatch`] on an open `/proc/self/mountinfo`: the kernel flags
/// the open file with `POLLPRI` when the namespace's mount event counter moves
/// on, and clears the flag for that file when it is polled (proc(5)). One
/// `poll(2)` with a zero timeout answers, whatever the size of the table.
#[derive(Debug)]
pub struct ProcMountinfoWatch {
    file: std::fs::File,
}

impl ProcMountinfoWatch {
    /// Opens the watch; the first [`changed`](MountTableWatch::changed)
    /// compares with the table as it is now.
    pub fn open() -> Result<Self, SyscallError> {
        let path = mountinfo::SELF_MOUNTINFO;
        let file = std::fs::File::open(path).map_err(|e| SyscallError::io("open", path, e))?;
        Ok(Self { file })
    }
}

impl MountTableWatch for ProcMountinfoWatch {
    fn changed(&mut self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(self.file.as_fd(), PollFlags::POLLPRI)];
        loop {
            match poll(&mut fds, PollTimeout::ZERO) {
                Ok(_) => {
                    return fds[0]
                        .revents()
                        .is_none_or(|r| r.intersects(PollFlags::POLLPRI | PollFlags::POLLERR))
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return true,
            }
        }
    }
}

fn statx_empty_path(target: &Target) -> Result<libc::statx, SyscallError> {
    statx_empty_path_mask(target, libc::STATX_BASIC_STATS)
}

/// The unique mount id `statx` returned, if it was asked of a mount's root
/// and the kernel has unique ids.
fn unique_mount_id(stx: &libc::statx) -> Option<u64> {
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    let is_root = stx.stx_attributes_mask & root != 0 && stx.stx_attributes & root != 0;
    let unique = stx.stx_mask & STATX_MNT_ID_UNIQUE != 0;
    (is_root && unique).then_some(stx.stx_mnt_id)
}

fn statx_empty_path_mask(target: &Target, mask: u32) -> Result<libc::statx, SyscallError> {
    statx_at(
        target,
        &CString::default(),
        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        mask,
    )
    .map_err(|e| SyscallError::io("statx", target.path(), e))
}

/// `statx(dir, name, flags | AT_NO_AUTOMOUNT, STATX_BASIC_STATS)`.
fn statx_at(dir: &Target, name: &CString, flags: i32, mask: u32) -> std::io::Result<libc::statx> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `name` is a valid NUL-terminated string, `stx` points to
    // writable memory of the right size, and the descriptor is owned by `dir`.
    let rc = unsafe {
        libc::statx(
            dir.as_fd().as_raw_fd(),
            name.as_ptr(),
            flags | libc::AT_NO_AUTOMOUNT,
            mask,
            stx.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statx returned 0, so the kernel filled the structure.
    Ok(unsafe { stx.assume_init() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::test_child::{bind, run_in_child, Child};

    /// `/` itself opens (a local PV of the whole root file system), as do
    /// paths below it; a symlink on the way is refused.
    #[test]
    fn host_paths_open_from_the_root_itself() {
        let t = open_host_path(Path::new("/")).unwrap();
        let st = nix::sys::stat::fstat(&t).unwrap();
        let root = nix::sys::stat::stat("/").unwrap();
        assert_eq!((st.st_dev, st.st_ino), (root.st_dev, root.st_ino));
        assert_eq!(t.path(), Path::new("/"));
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("dir")).unwrap();
        std::os::unix::fs::symlink("dir", d.path().join("link")).unwrap();
        assert!(open_host_path(&d.path().join("dir")).is_ok());
        let e = open_host_path(&d.path().join("link")).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ELOOP), "{e}");
    }

    /// The check of kernels before 5.8 (no `STATX_ATTR_MOUNT_ROOT`) tells a
    /// bind mount of the same file system by its mount id.
    #[test]
    fn mount_ids_tell_a_bind_mount_of_the_same_file_system() {
        let name = crate::test_name!("mount_ids_tell_a_bind_mount_of_the_same_file_system");
        run_in_child(name, Child::PrivateMounts, || {
            let t = tempfile::tempdir().unwrap();
            let (src, dst) = (t.path().join("src"), t.path().join("dst"));
            std::fs::create_dir(&src).unwrap();
            std::fs::create_dir(&dst).unwrap();
            let open = |p: &std::path::Path| {
                nix::fcntl::open(p, PATH_DIR, nix::sys::stat::Mode::empty()).unwrap()
            };
            let up = open(t.path());
            assert!(!differ_in_mount(open(&dst).as_fd(), up.as_fd(), &dst).unwrap());
            bind(&src, &dst);
            assert!(differ_in_mount(open(&dst).as_fd(), up.as_fd(), &dst).unwrap());
            let target = Target::new(open(&dst), dst.clone());
            assert!(LinuxMounter.is_mount_point(&target).unwrap());
        });
    }
}
