//! Every kernel call that changes or reads the mount table goes through the
//! [`Mounter`] trait (the kubelet's `mount-utils` `Interface`; its read-only
//! part, [`MountTableReader`], is all an observer such as the tracer gets), so
//! the logic above it can be tested with the recording [`fake::FakeMounter`] while the real
//! [`linux::LinuxMounter`] is tested in a private mount namespace.

pub mod beneath;
pub mod capabilities;
pub mod dir_walk;
pub mod dirents;
pub mod inotify;
pub mod linux;
pub mod memory;
pub mod mount_id;
pub mod mount_table;
pub mod mountinfo;
pub mod namespace;
pub mod root_dir;
pub mod seccomp;
pub mod selinux;

#[cfg(test)]
pub mod fake;
#[cfg(test)]
pub mod test_child;

use std::ffi::OsStr;
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

pub use nix::mount::MsFlags;

/// A failed system call: which call, on which path, and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("{call} {path}: {source}")]
pub struct SyscallError {
    /// The call that failed (`mount`, `umount2`, `openat2`, ...).
    pub call: &'static str,
    /// The path it was applied to.
    pub path: PathBuf,
    /// The error the kernel returned.
    #[source]
    pub source: std::io::Error,
}

impl SyscallError {
    /// Builds an error from a `nix` errno.
    pub fn new(call: &'static str, path: impl Into<PathBuf>, errno: nix::errno::Errno) -> Self {
        Self {
            call,
            path: path.into(),
            source: std::io::Error::from(errno),
        }
    }

    /// Builds an error from an `std::io::Error`.
    pub fn io(call: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self {
            call,
            path: path.into(),
            source,
        }
    }

    /// The raw errno, when the error came from the kernel.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// A directory that was opened safely (beneath the manager's root, no symlinks)
/// and is the target of a mount or unmount. Mounting through the descriptor
/// instead of the path means nobody can swap a path component for a symlink
/// between the check and the mount.
pub struct Target {
    fd: OwnedFd,
    path: PathBuf,
}

impl Target {
    /// Wraps an `O_PATH` descriptor and the absolute path it was opened at.
    pub fn new(fd: OwnedFd, path: PathBuf) -> Self {
        Self { fd, path }
    }

    /// The absolute path (for logs, the mount table and the fake).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `/proc/self/fd/N` magic link that names the descriptor for `mount(2)`.
    pub fn proc_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

impl AsFd for Target {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Target").field(&self.path).finish()
    }
}

/// What [`Mounter::remove_unmounted_dir`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnmountedDir {
    /// Removed (or already gone).
    Removed,
    /// Still the root of a mount: another one was stacked there.
    StillMounted,
    /// Kept: it has entries, or is not a directory.
    NotEmpty,
}

/// `unlinkat(parent, name, AT_REMOVEDIR)` as [`Mounter::remove_unmounted_dir`]
/// answers it.
pub(crate) fn rmdir_unmounted(parent: &Target, name: &OsStr) -> Result<UnmountedDir, SyscallError> {
    use nix::errno::Errno;
    match nix::unistd::unlinkat(parent.as_fd(), name, nix::unistd::UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(UnmountedDir::Removed),
        Err(Errno::EBUSY) => Ok(UnmountedDir::StillMounted),
        Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOTDIR) => Ok(UnmountedDir::NotEmpty),
        Err(e) => Err(SyscallError::new("unlinkat", parent.path().join(name), e)),
    }
}

/// Reads the kernel's mount table, and nothing more: what an observer (the
/// tracer) may do. Every [`Mounter`] is one.
pub trait MountTableReader: Send + Sync + 'static {
    /// The whole mount table of this process's mount namespace.
    fn mount_table(&self) -> Result<Vec<mountinfo::MountInfo>, mountinfo::MountInfoError>;
}

/// What the manager needs from the kernel's mount table. One implementation
/// does real syscalls; the fake records calls and can inject failures.
pub trait Mounter: MountTableReader {
    /// `mount(2)` of `source` with `fstype` on `target`.
    fn mount(
        &self,
        source: &str,
        target: &Target,
        fstype: &str,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SyscallError>;

    /// Unmounts the top mount on `parent/name` (`umount2`, not lazy, never
    /// following a symlink). The mount is named through its parent's
    /// descriptor: a descriptor of the mount itself would keep it busy.
    fn unmount(&self, parent: &Target, name: &OsStr) -> Result<(), SyscallError>;

    /// Removes `parent/name` after an [`unmount`](Self::unmount) when it is
    /// an empty directory that no mount covers any more
    /// (`unlinkat(AT_REMOVEDIR)`, never following a symlink). The kernel
    /// refuses a mount point (`EBUSY`), so this one call both removes the
    /// directory and tells whether another mount was stacked under the one
    /// just unmounted: no `statx` to look first.
    fn remove_unmounted_dir(
        &self,
        parent: &Target,
        name: &OsStr,
    ) -> Result<UnmountedDir, SyscallError>;

    /// Detaches the top mount on `parent/name` at once, without waiting for
    /// its file system (`umount2(MNT_FORCE | MNT_DETACH)`): for a network
    /// file system whose server is gone. Default: [`unmount`](Self::unmount).
    fn unmount_detach(&self, parent: &Target, name: &OsStr) -> Result<(), SyscallError> {
        self.unmount(parent, name)
    }

    /// Whether `target` is the root of a mount (exact, via `statx`).
    fn is_mount_point(&self, target: &Target) -> Result<bool, SyscallError>;

    /// Whether `parent/name` is the root of a mount, without opening it
    /// (`statx` relative to the parent, not following a symlink). A missing
    /// entry is not a mount point.
    fn is_mount_point_at(&self, parent: &Target, name: &OsStr) -> Result<bool, SyscallError>;

    /// The file system type of the mount `target` is on (`tmpfs`, `ext4`, ...),
    /// when the implementation can tell cheaply.
    fn fs_magic(&self, target: &Target) -> Result<i64, SyscallError>;

    /// Size and use of the file system `target` is on (`fstatfs`).
    fn fs_usage(&self, target: &Target) -> Result<FsUsage, SyscallError>;

    /// A watch on that mount table, telling whether it changed.
    fn watch_mount_table(&self) -> Result<Box<dyn MountTableWatch>, SyscallError>;

    /// The unique id of the mount whose root `target` is (`statx` with
    /// `STATX_MNT_ID_UNIQUE`, Linux 6.8+; such ids are never reused).
    /// `None` when `target` is not the root of a mount, or the kernel has
    /// no unique ids.
    fn mount_id(&self, target: &Target) -> Result<Option<u64>, SyscallError>;

    /// [`mount_id`](Self::mount_id) of what is mounted on directory `name`
    /// of `parent` (the lookup of `name` ends on the top mount there; a
    /// symlink is not followed): one `statx`, where opening the mount's
    /// root from ROOT costs a walk and two descriptors.
    fn mount_id_in(&self, parent: &Target, name: &OsStr) -> Result<Option<u64>, SyscallError>;

    /// A bind mount of `source` (opened safely, possibly outside ROOT) on
    /// `target` (`mount(2)` with `MS_BIND`, not recursive, as the kubelet's
    /// `mount -o bind`).
    fn bind_mount(&self, source: &Target, target: &Target) -> Result<(), SyscallError>;

    /// Makes the mount holding `root` recursively shared, so mounts made
    /// below it propagate to mount namespaces cloned from this one (the
    /// container runtime's): the kubelet's `setupDataDirs` →
    /// `MakeRShared`. Nothing is done when that mount is shared already;
    /// a `root` that is not a mount point is first bind-mounted onto
    /// itself. The caller must open `root` again afterwards when it
    /// [`RootPropagation::rebound`].
    fn make_rshared(&self, root: &Path) -> Result<RootPropagation, PropagationError>;

    /// The unique ids of every mount in this namespace (`listmount(2)`,
    /// Linux 6.8+): about 2 ms for 10,000 mounts, where reading
    /// `/proc/self/mountinfo` takes 30-40. `None` when the kernel cannot
    /// list them.
    fn mount_ids(&self) -> Result<Option<crate::util::fast_map::FastSet<u64>>, SyscallError>;
}

/// Size and use of a file system, in bytes (from `statfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsUsage {
    /// Its size.
    pub size_bytes: u64,
    /// What is in use (size minus free blocks).
    pub used_bytes: u64,
}

/// What [`Mounter::make_rshared`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootPropagation {
    /// The mount holding ROOT was already shared: left alone.
    AlreadyShared,
    /// ROOT was a mount point, now recursively shared.
    MadeShared,
    /// ROOT was bound onto itself, then made recursively shared.
    BoundAndMadeShared,
}

impl RootPropagation {
    /// Whether ROOT is a new mount now (descriptors opened before name the
    /// directory beneath it).
    pub fn rebound(self) -> bool {
        self == Self::BoundAndMadeShared
    }
}

/// Why ROOT could not be made shared.
#[derive(Debug, thiserror::Error)]
pub enum PropagationError {
    /// A system call failed.
    #[error(transparent)]
    Syscall(#[from] SyscallError),
    /// The mount table could not be read.
    #[error("reading the mount table: {0}")]
    MountTable(#[from] mountinfo::MountInfoError),
    /// ROOT is not a mount point but has mounts below it, which binding it
    /// onto itself would hide (volmgr would lose them).
    #[error("{root} is not a mount point and has {count} mounts below it, which binding it onto itself would hide; unmount them (or restart the node) to get mount propagation")]
    MountsBelow {
        /// ROOT.
        root: PathBuf,
        /// How many mounts.
        count: usize,
    },
}

/// Tells whether the mount table of this process's mount namespace may have
/// changed: a mount, unmount, move or remount, by anyone, including mounts
/// propagated from another namespace.
pub trait MountTableWatch: Send {
    /// Whether the table changed since the previous call (the first call:
    /// since the watch was opened). When unsure it answers `true`.
    fn changed(&mut self) -> bool;
}

/// `TMPFS_MAGIC` from `linux/magic.h`, as returned by `statfs`.
pub const TMPFS_MAGIC: i64 = 0x0102_1994;
