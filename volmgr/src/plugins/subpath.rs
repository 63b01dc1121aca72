//! `subPath` bind mounts, as the kubelet's
//! `pkg/volume/util/subpath/subpath_linux.go` makes them
//! (`doSafeMakeDir`, `doSafeOpen`, `prepareSubpathTarget`, `doBindSubPath`,
//! `doCleanSubPaths`), for every plugin: after a volume's set-up, each
//! container's `volumeMount` with a subPath gets
//! `ROOT/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`, a bind
//! mount of that path inside the volume, which the container runtime then
//! binds into the container.
//!
//! The path inside the volume belongs to the pod, which may race us
//! (CVE-2017-1002101: a symlink to `/`; CVE-2021-25741: a component swapped
//! for a symlink while the path is checked). So it is never resolved by
//! name: it is opened from a descriptor of the volume's root with
//! `openat2(RESOLVE_BENEATH)` (or the fallback walk that resolves symlinks
//! itself, [`beneath::open_in_volume`]), so symlinks are followed only while
//! they stay inside the volume (the kubelet's `EvalSymlinks` then
//! `PathWithinBase`: a configMap key, `k -> ..data/k`, works; `/`, `/etc`
//! or `../..` never does), missing directories created one at a
//! time relative to their parent's descriptor, and the resulting `O_PATH`
//! descriptor is what is bind-mounted (through `/proc/self/fd/N`). Before
//! the mount the descriptor's path is checked to be below the volume's root,
//! and after it the mount is checked to show the very inode that was opened.
//! Mounts nested inside the volume are crossed, as the kubelet's
//! `doSafeOpen` does; a symlink or `..` never leads out of the volume.
//!
//! Clean-up (before the volume's tear-down) walks the volume's directory of
//! `volume-subpaths` on disk, so it also finds the bind mounts a previous
//! run left (after `kill -9`): each is unmounted and removed, then the
//! directories. Removal never crosses a mount.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};

use super::VolumeError;
use crate::sys::beneath::{self, Last};
use crate::sys::root_dir::{PathError, RelPath, RootDir};
use crate::sys::{Mounter, SyscallError, Target};
use crate::volume::{PodUid, SubPath};

/// The directory of a pod's subPath bind mounts (the kubelet's
/// `volumeSubpathsDirName`).
pub const SUBPATHS_DIR: &str = "volume-subpaths";

/// How many mounts stacked on one subPath entry clean-up removes at most.
const MAX_STACKED: usize = 8;

/// How deep a subPath may go (components), so a hostile spec cannot hold
/// a descriptor per component without bound.
const MAX_COMPONENTS: usize = 256;

/// Why a subPath could not be set up (the kubelet's messages).
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    /// An absolute subPath.
    #[error("error SubPath {0:?} must not be an absolute path")]
    Absolute(String),
    /// `..` in a subPath.
    #[error("unable to provision SubPath {0:?}: must not contain '..'")]
    Backsteps(String),
    /// A path too deep.
    #[error("unable to provision SubPath {0:?}: more than {MAX_COMPONENTS} components")]
    TooDeep(String),
    /// A missing directory could not be made safely.
    #[error("failed to create subPath directory for volumeMount {volume:?} of container {container:?}: {reason}")]
    MakeDir {
        /// The volume's name in the pod.
        volume: String,
        /// The container.
        container: String,
        /// What went wrong (a symlink on the way, ...).
        reason: String,
    },
    /// The path could not be opened, checked or bind-mounted.
    #[error(
        "failed to prepare subPath for volumeMount {volume:?} of container {container:?}: {reason}"
    )]
    Prepare {
        /// The volume's name in the pod.
        volume: String,
        /// The container.
        container: String,
        /// What went wrong.
        reason: String,
    },
}

/// Where the bind mount for `sub` of `pod`'s volume `volume` is, relative to
/// ROOT.
pub fn sub_path_rel(pod: &PodUid, volume: &str, sub: &SubPath) -> Result<RelPath, PathError> {
    let index = sub.index.to_string();
    RelPath::new([
        "pods",
        pod.as_str(),
        SUBPATHS_DIR,
        volume,
        &sub.container,
        &index,
    ])
}

/// Checks a subPath as the kubelet's `makeMounts` does (not absolute, no
/// `..` component) and returns its normal components.
pub fn check_sub_path(path: &str) -> Result<Vec<&OsStr>, SubPathError> {
    if Path::new(path).is_absolute() {
        return Err(SubPathError::Absolute(path.to_string()));
    }
    // As `ValidatePathNoBacksteps`: any `..` element, even one that
    // `Clean` would fold away.
    if path.split('/').any(|p| p == "..") {
        return Err(SubPathError::Backsteps(path.to_string()));
    }
    let names: Vec<&OsStr> = Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    if names.len() > MAX_COMPONENTS {
        return Err(SubPathError::TooDeep(path.to_string()));
    }
    Ok(names)
}

/// Sets up the bind mounts of `subs` for `pod`'s volume `volume`, set up at
/// `volume_path`; returns their absolute paths, in `subs` order. One already
/// mounted is left as it is (a retry, a restart).
pub fn set_up_sub_paths(
    root: &RootDir,
    mounter: &dyn Mounter,
    pod: &PodUid,
    volume: &str,
    volume_path: &Path,
    subs: &[SubPath],
) -> Result<Vec<PathBuf>, VolumeError> {
    let mut out = Vec::with_capacity(subs.len());
    if subs.is_empty() {
        return Ok(out);
    }
    let base = open_volume_root(volume_path)?;
    for sub in subs {
        out.push(bind_sub_path(root, mounter, pod, volume, &base, sub)?);
    }
    Ok(out)
}

/// The volume's root, `O_PATH`. Its own path is the plugin's (a hostPath
/// may be anywhere, through symlinks the admin made), so it is followed.
fn open_volume_root(volume_path: &Path) -> Result<Target, VolumeError> {
    let fd = nix::fcntl::open(
        volume_path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| SyscallError::new("open", volume_path, e))?;
    Ok(Target::new(fd, volume_path.to_path_buf()))
}

/// One subPath: opened (made) safely, checked, bind-mounted on its entry.
fn bind_sub_path(
    root: &RootDir,
    mounter: &dyn Mounter,
    pod: &PodUid,
    volume: &str,
    base: &Target,
    sub: &SubPath,
) -> Result<PathBuf, VolumeError> {
    let prepare = |reason: String| SubPathError::Prepare {
        volume: volume.to_string(),
        container: sub.container.clone(),
        reason,
    };
    let names = check_sub_path(&sub.path)?;
    let source = safe_open_or_make(base.as_fd(), &names).map_err(|e| match e {
        MakeError::Make(reason) => SubPathError::MakeDir {
            volume: volume.to_string(),
            container: sub.container.clone(),
            reason,
        },
        MakeError::Open(reason) => prepare(reason),
    })?;
    let source_path = check_beneath(base, &source).map_err(|e| prepare(e.to_string()))?;
    let source = Target::new(source, source_path);
    let rel = sub_path_rel(pod, volume, sub)?;
    let (parent_rel, name) = rel
        .split_last()
        .ok_or_else(|| VolumeError::Internal("empty subPath entry".into()))?;
    let parent = root.mkdir_all(&parent_rel, 0o750)?;
    if mounter.is_mount_point_at(&parent, name)? {
        // The kubelet's "already mounted": a retry or a restart.
        return Ok(root.abs(&rel));
    }
    let st = fstat(source.as_fd()).map_err(|e| SyscallError::new("fstat", source.path(), e))?;
    make_entry(&parent, name, is_dir(&st))?;
    let target = root.open_path(&rel)?;
    mounter.bind_mount(&source, &target)?;
    verify_bind(mounter, &parent, name, &st).map_err(|e| prepare(e.to_string()))?;
    Ok(root.abs(&rel))
}

/// Why [`safe_open_or_make`] failed.
enum MakeError {
    /// Making a missing directory failed.
    Make(String),
    /// Opening failed (a symlink on the way, ...).
    Open(String),
}

fn describe(names: &[&OsStr], e: Errno) -> String {
    let path = names
        .iter()
        .map(|n| n.to_string_lossy())
        .collect::<Vec<_>>()
        .join("/");
    match e {
        Errno::ELOOP => format!(
            "{path}: a symlink is on the way (too many, or where a missing directory is to be made)"
        ),
        Errno::EXDEV => {
            format!("{path}: a symlink (absolute, or through `..`) leads out of the volume")
        }
        e => format!("{path}: {}", e.desc()),
    }
}

/// `names` below `base`, `O_PATH`, through symlinks only while they stay
/// below `base` ([`beneath::open_in_volume`]); missing directories are made
/// on the way (`doSafeMakeDir`): below the longest prefix that exists
/// (`findExistingPrefix`, which may go through symlinks that stay below
/// `base`, e.g. `link -> dir` for subPath `link/new`), each relative to
/// its parent's descriptor, never through a symlink, with the mode of
/// `base`. A dangling symlink on the way is refused, as the kubelet's
/// `mkdirat` of its name fails.
fn safe_open_or_make(base: BorrowedFd<'_>, names: &[&OsStr]) -> Result<OwnedFd, MakeError> {
    let path: PathBuf = names.iter().collect();
    let path = if names.is_empty() {
        PathBuf::from(".")
    } else {
        path
    };
    match beneath::open_in_volume(base, &path, OFlag::O_PATH) {
        Ok(fd) => return Ok(fd),
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(MakeError::Open(describe(names, e))),
    }
    let mode = fstat(base)
        .map(|st| Mode::from_bits_truncate(st.st_mode & 0o7777))
        .map_err(|e| MakeError::Make(describe(&[], e)))?;
    let (existing, mut cur) = existing_prefix(base, names)?;
    for (i, name) in names.iter().enumerate().skip(existing) {
        let parent = cur.as_ref().map_or(base, |f| f.as_fd());
        let last = i + 1 == names.len();
        let flags = if last {
            OFlag::O_PATH
        } else {
            OFlag::O_PATH | OFlag::O_DIRECTORY
        };
        let fd = match beneath::open(parent, Path::new(name), flags, Last::MayCrossMounts) {
            Err(Errno::ENOENT) => make_dir(parent, name, mode)
                .map_err(|e| MakeError::Make(describe(&names[..=i], e)))?,
            r => r.map_err(|e| MakeError::Open(describe(&names[..=i], e)))?,
        };
        cur = Some(fd);
    }
    cur.ok_or_else(|| MakeError::Open("empty subPath".into()))
}

/// The kubelet's `findExistingPrefix`: how many of `names` exist below
/// `base`, and the last of them opened `O_PATH` (`None`: none does, start
/// from `base`). Each prefix is resolved from `base` with
/// [`beneath::open_in_volume`], so a symlink on the way is followed only
/// while it stays below `base`; one leading out is refused here.
fn existing_prefix(
    base: BorrowedFd<'_>,
    names: &[&OsStr],
) -> Result<(usize, Option<OwnedFd>), MakeError> {
    let mut found = (0, None);
    for i in 1..=names.len() {
        let prefix: PathBuf = names[..i].iter().collect();
        match beneath::open_in_volume(base, &prefix, OFlag::O_PATH) {
            Ok(fd) => found = (i, Some(fd)),
            Err(Errno::ENOENT) => break,
            Err(e) => return Err(MakeError::Open(describe(&names[..i], e))),
        }
    }
    Ok(found)
}

/// `mkdirat(parent, name)` (someone else making it meanwhile is fine), its
/// mode set whatever the umask, and the new directory opened `O_PATH`
/// without following a symlink swapped in meanwhile.
fn make_dir(parent: BorrowedFd<'_>, name: &OsStr, mode: Mode) -> Result<OwnedFd, Errno> {
    match nix::sys::stat::mkdirat(parent, name, mode) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(e),
    }
    let dir = beneath::open(
        parent,
        Path::new(name),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Last::MayCrossMounts,
    )?;
    nix::sys::stat::fchmod(dir.as_fd(), mode)?;
    beneath::open(
        dir.as_fd(),
        Path::new("."),
        OFlag::O_PATH | OFlag::O_DIRECTORY,
        Last::MayCrossMounts,
    )
}

/// Why an opened subPath is not bound (the reason of
/// [`SubPathError::Prepare`]).
#[derive(Debug, thiserror::Error)]
enum BindRefused {
    /// What the kernel has for a descriptor could not be read.
    #[error("reading the opened path: {0}")]
    ReadLink(std::io::Error),
    /// The opened path left the volume.
    #[error("{} is not below the volume's root {}", path.display(), base.display())]
    NotBeneath {
        /// The opened path.
        path: PathBuf,
        /// The volume's root.
        base: PathBuf,
    },
    /// The mount made could not be looked at.
    #[error("fstatat of the mount: {0}")]
    Stat(Errno),
    /// The mount shows another file than the one opened.
    #[error("the mount shows another file than the one opened (undone: {undone})")]
    OtherFile {
        /// `yes`, or why unmounting it again failed.
        undone: String,
    },
}

/// The path the kernel has for `fd`, which must be `base`'s or below it
/// (what `/proc/self/fd/N` names is what the bind mount will show).
fn check_beneath(base: &Target, fd: &OwnedFd) -> Result<PathBuf, BindRefused> {
    let read = |f: BorrowedFd<'_>| {
        use std::os::fd::AsRawFd;
        std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
            .map_err(BindRefused::ReadLink)
    };
    let (base, path) = (read(base.as_fd())?, read(fd.as_fd())?);
    if path.starts_with(&base) && !path.as_os_str().as_bytes().ends_with(b" (deleted)") {
        Ok(path)
    } else {
        Err(BindRefused::NotBeneath { path, base })
    }
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

/// The mount point of a subPath (`prepareSubpathTarget`): a directory for
/// a directory, an empty file for anything else. One already there of the
/// right kind is used.
fn make_entry(parent: &Target, name: &OsStr, dir: bool) -> Result<(), VolumeError> {
    let path = || parent.path().join(name);
    if dir {
        return match nix::sys::stat::mkdirat(parent, name, Mode::from_bits_truncate(0o750)) {
            Ok(()) | Err(Errno::EEXIST) => Ok(()),
            Err(e) => Err(SyscallError::new("mkdirat", path(), e).into()),
        };
    }
    nix::fcntl::openat(
        parent,
        name,
        OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o640),
    )
    .map(drop)
    .map_err(|e| SyscallError::new("openat", path(), e).into())
}

/// After the bind: the entry is a mount showing the opened inode; otherwise
/// it is unmounted again.
fn verify_bind(
    mounter: &dyn Mounter,
    parent: &Target,
    name: &OsStr,
    opened: &FileStat,
) -> Result<(), BindRefused> {
    let now = nix::sys::stat::fstatat(parent, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(BindRefused::Stat)?;
    if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino) {
        return Ok(());
    }
    let undo = mounter.unmount(parent, name).err();
    Err(BindRefused::OtherFile {
        undone: undo.map_or("yes".into(), |e| e.to_string()),
    })
}

/// Whether `pod`'s volume `volume` may have subPath entries to clean:
/// `volume-subpaths/<volume>` exists, or could not be looked up (then
/// [`clean_sub_paths`] tells why). One lookup, on the calling thread, so a
/// tear-down of a volume without subPaths (the common case) hands nothing
/// to a blocking thread.
pub fn may_have_sub_paths(root: &RootDir, pod: &PodUid, volume: &str) -> bool {
    let Ok(dir) = RelPath::new(["pods", pod.as_str(), SUBPATHS_DIR, volume]) else {
        return true;
    };
    !matches!(root.exists(&dir), Ok(false))
}

/// Unmounts and removes every subPath entry of `pod`'s volume `volume`
/// (`doCleanSubPaths`), then its directories; `volume-subpaths` goes too
/// once empty. Nothing there is fine.
pub fn clean_sub_paths(
    root: &RootDir,
    mounter: &dyn Mounter,
    pod: &PodUid,
    volume: &str,
) -> Result<(), VolumeError> {
    let pod_dir = RelPath::new(["pods", pod.as_str(), SUBPATHS_DIR])?;
    let dir = pod_dir.join(volume)?;
    let Some(vdir) = root.open_dir_if_there(&dir)? else {
        return Ok(());
    };
    for container in root.read_dir(&dir)? {
        let cdir_rel = dir.join(&container)?;
        match root.open_dir(&cdir_rel) {
            Ok(cdir) => {
                for entry in root.read_dir(&cdir_rel)? {
                    unmount_entry(root, mounter, &cdir, &entry)?;
                }
            }
            // Not a directory: nothing of ours is mounted there.
            Err(PathError::Syscall(e)) if e.errno() == Some(libc::ENOTDIR) => {}
            Err(e) => return Err(e.into()),
        }
        root.remove_all_at(&vdir, &container)?;
    }
    drop(vdir);
    root.remove_empty_dir(&dir)?;
    root.remove_empty_dir(&pod_dir)?;
    Ok(())
}

/// Cleans the subPath entries of every volume of `pod` (for a pod that is
/// neither desired nor has a volume the actual state knows: e.g. the binds
/// of a hostPath volume, which reconstruction cannot find, after `kill -9`).
pub fn clean_pod_sub_paths(
    root: &RootDir,
    mounter: &dyn Mounter,
    pod: &PodUid,
) -> Result<(), VolumeError> {
    let dir = RelPath::new(["pods", pod.as_str(), SUBPATHS_DIR])?;
    for volume in root.read_dir(&dir)? {
        let Some(volume) = volume.to_str() else {
            // Not a name volmgr makes: left for remove_all to refuse or take.
            continue;
        };
        clean_sub_paths(root, mounter, pod, volume)?;
    }
    Ok(())
}

/// Unmounts everything stacked on `cdir/entry`, then removes it.
fn unmount_entry(
    root: &RootDir,
    mounter: &dyn Mounter,
    cdir: &Target,
    entry: &OsString,
) -> Result<(), VolumeError> {
    for _ in 0..MAX_STACKED {
        if !mounter.is_mount_point_at(cdir, entry)? {
            break;
        }
        mounter.unmount(cdir, entry)?;
        tracing::debug!(path = %cdir.path().join(entry).display(), "subPath unmounted");
    }
    // Never crosses a mount still there: that fails instead.
    root.remove_all_at(cdir, entry)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::linux::LinuxMounter;
    use crate::sys::test_child::{bind, run_in_child, tree, unmount, Child};
    use std::os::unix::fs::{symlink, MetadataExt};

    /// A ROOT with one pod volume (a directory), and a directory outside.
    struct Fixture {
        t: tempfile::TempDir,
        root: RootDir,
        pod: PodUid,
    }

    impl Fixture {
        fn new() -> Self {
            let t = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(t.path().join("outside/etc")).unwrap();
            std::fs::write(t.path().join("outside/etc/secret"), b"s").unwrap();
            let vol = t
                .path()
                .join("root/pods/u1/volumes/kubernetes.io~empty-dir/v");
            std::fs::create_dir_all(&vol).unwrap();
            let root = RootDir::open(&t.path().join("root")).unwrap();
            Self {
                t,
                root,
                pod: PodUid::new("u1").unwrap(),
            }
        }
        fn vol(&self) -> PathBuf {
            self.root
                .path()
                .join("pods/u1/volumes/kubernetes.io~empty-dir/v")
        }
        fn outside(&self) -> PathBuf {
            self.t.path().join("outside")
        }
        fn set_up(&self, subs: &[SubPath]) -> Result<Vec<PathBuf>, VolumeError> {
            set_up_sub_paths(&self.root, &LinuxMounter, &self.pod, "v", &self.vol(), subs)
        }
        fn clean(&self) {
            clean_sub_paths(&self.root, &LinuxMounter, &self.pod, "v").unwrap();
        }
        /// The mounts below `volume-subpaths`, with the inode each shows.
        fn binds(&self) -> Vec<(PathBuf, (u64, u64))> {
            let dir = self.root.path().join("pods/u1").join(SUBPATHS_DIR);
            crate::sys::mountinfo::read_self()
                .unwrap()
                .into_iter()
                .filter(|m| m.mount_point.starts_with(&dir))
                .map(|m| {
                    let st = std::fs::metadata(&m.mount_point).unwrap();
                    (m.mount_point, (st.dev(), st.ino()))
                })
                .collect()
        }
    }

    /// Whatever a failing test left mounted below the temporary directory
    /// is detached before the directory is deleted: deletion must never
    /// reach through a bind (of `/`, in a broken build) to other files.
    impl Drop for Fixture {
        fn drop(&mut self) {
            let Ok(table) = crate::sys::mountinfo::read_self() else {
                return;
            };
            for m in table.iter().rev() {
                if m.mount_point.starts_with(self.t.path()) {
                    let _ = nix::mount::umount2(&m.mount_point, nix::mount::MntFlags::MNT_DETACH);
                }
            }
        }
    }

    fn sub(container: &str, index: usize, path: &str) -> SubPath {
        SubPath {
            container: container.into(),
            index,
            path: path.into(),
        }
    }

    fn ino(p: &Path) -> (u64, u64) {
        let st = std::fs::symlink_metadata(p).unwrap();
        (st.dev(), st.ino())
    }

    /// A directory, a file, a missing path (made with the root's mode) and
    /// the root itself are bound; again is a no-op; clean-up unmounts and
    /// removes everything, so the pod directory can go.
    fn binds_and_cleans() {
        let f = Fixture::new();
        let vol = f.vol();
        std::fs::create_dir_all(vol.join("a/b")).unwrap();
        std::fs::write(vol.join("file"), b"data").unwrap();
        std::fs::set_permissions(&vol, std::os::unix::fs::PermissionsExt::from_mode(0o2775))
            .unwrap();
        let subs = [
            sub("c", 0, "a/b"),
            sub("c", 2, "file"),
            sub("c", 3, "new/x/y"),
            sub("d", 0, "./a//"),
        ];
        let paths = f.set_up(&subs).unwrap();
        let base = f.root.path().join("pods/u1/volume-subpaths/v");
        assert_eq!(
            paths,
            ["c/0", "c/2", "c/3", "d/0"].map(|p| base.join(p)).to_vec()
        );
        let want = [
            vol.join("a/b"),
            vol.join("file"),
            vol.join("new/x/y"),
            vol.join("a"),
        ];
        let binds = f.binds();
        assert_eq!(binds.len(), 4, "{binds:?}");
        for (p, w) in paths.iter().zip(&want) {
            assert_eq!(ino(p), ino(w), "{}", p.display());
        }
        assert_eq!(std::fs::read(base.join("c/2")).unwrap(), b"data");
        std::fs::write(base.join("c/3/through"), b"x").unwrap();
        assert!(vol.join("new/x/y/through").exists());
        let mode = std::fs::metadata(vol.join("new/x")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o2775, "made with the volume root's mode");

        // Again (a retry, a restart): nothing stacked.
        assert_eq!(f.set_up(&subs).unwrap(), paths);
        assert_eq!(f.binds().len(), 4);

        // Clean-up from what is on disk (as after kill -9: a new RootDir).
        let again = RootDir::open(f.root.path()).unwrap();
        clean_sub_paths(&again, &LinuxMounter, &f.pod, "v").unwrap();
        assert!(f.binds().is_empty());
        assert!(!f.root.path().join("pods/u1/volume-subpaths").exists());
        assert!(vol.join("new/x/y/through").exists(), "the volume is intact");
        again
            .remove_all(&RelPath::new(["pods", "u1"]).unwrap())
            .unwrap();
        // Nothing there: fine.
        f.clean();
    }

    #[test]
    fn sub_paths_are_bound_and_cleaned() {
        let name = crate::test_name!("sub_paths_are_bound_and_cleaned");
        run_in_child(name, Child::PrivateMounts, binds_and_cleans);
    }

    /// CVE-2017-1002101: symlinks the pod made in its volume, to `/`, to
    /// `/etc`, to a directory outside, relative ones climbing out, on the
    /// last component or on the way (where a missing directory would be
    /// made through it): all refused with the kubelet's message, nothing
    /// bound, nothing outside changed.
    fn symlinks_refused() {
        let f = Fixture::new();
        let vol = f.vol();
        symlink("/", vol.join("root")).unwrap();
        symlink("/etc", vol.join("etc")).unwrap();
        symlink(f.outside().join("etc"), vol.join("out")).unwrap();
        std::fs::create_dir(vol.join("d")).unwrap();
        symlink("../../../../../../../..", vol.join("d/up")).unwrap();
        symlink("../d", vol.join("d/inside")).unwrap();
        let before = tree(&f.outside());
        for path in [
            "root",
            "root/etc",
            "etc",
            "etc/passwd",
            "out",
            "out/secret",
            "out/new/dir",
            "d/up",
            "d/up/etc",
            "d/up/new",
        ] {
            let err = f.set_up(&[sub("c", 0, path)]).unwrap_err().to_string();
            assert!(
                err.contains("subPath") && err.contains("symlink"),
                "{path}: {err}"
            );
            assert!(err.contains("container \"c\""), "{path}: {err}");
            assert!(f.binds().is_empty(), "{path}: bound {:?}", f.binds());
        }
        assert_eq!(tree(&f.outside()), before);
        // A symlink that stays inside the volume is followed (a configMap
        // key is one), and what is bound is its target.
        let bound = f.set_up(&[sub("c", 0, "d/inside")]).unwrap();
        assert_eq!(f.binds().len(), 1, "{bound:?}");
        f.clean();
    }

    #[test]
    fn cve_2017_1002101_symlinks_in_the_volume_are_refused() {
        let name = crate::test_name!("cve_2017_1002101_symlinks_in_the_volume_are_refused");
        run_in_child(name, Child::PrivateMounts, symlinks_refused);
    }

    /// CVE-2021-25741: another thread swaps the volume's `x` (a directory
    /// holding `y`) with a symlink to a directory outside holding its own
    /// `y` (`RENAME_EXCHANGE`, in a tight loop) while subPath `x/y` is set
    /// up `iterations` times: every bind shows the volume's `y`, never the
    /// outside one; refusals are fine.
    fn swaps_never_bind_outside(iterations: usize) {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
        let f = Fixture::new();
        let vol = f.vol();
        std::fs::create_dir_all(vol.join("x/y")).unwrap();
        std::fs::create_dir_all(f.outside().join("y")).unwrap();
        symlink(f.outside(), vol.join("swap")).unwrap();
        let inside = ino(&vol.join("x/y"));
        let outside = ino(&f.outside().join("y"));
        let (stop, swaps) = (AtomicBool::new(false), AtomicUsize::new(0));
        let (mut bound, mut refused) = (0, 0);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(SeqCst) {
                    nix::fcntl::renameat2(
                        nix::fcntl::AT_FDCWD,
                        &vol.join("x"),
                        nix::fcntl::AT_FDCWD,
                        &vol.join("swap"),
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                    swaps.fetch_add(1, SeqCst);
                }
            });
            // Stops the attacker also when an assertion below fails (the
            // scope would otherwise wait for it forever).
            struct StopOnDrop<'a>(&'a AtomicBool);
            impl Drop for StopOnDrop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, SeqCst);
                }
            }
            let _stop = StopOnDrop(&stop);
            for _ in 0..iterations {
                match f.set_up(&[sub("c", 0, "x/y")]) {
                    Ok(_) => bound += 1,
                    Err(_) => refused += 1,
                }
                for (p, shown) in f.binds() {
                    assert_ne!(
                        shown,
                        outside,
                        "{} shows the outside directory",
                        p.display()
                    );
                    assert_eq!(shown, inside, "{} shows something else", p.display());
                }
                f.clean();
            }
        });
        println!(
            "CVE-2021-25741 replay: {iterations} set-ups, {bound} bound (all to the volume), {refused} refused, {} swaps",
            swaps.load(SeqCst)
        );
        assert!(bound > 0 && refused > 0, "the race was not exercised");
        assert!(tree(&f.outside())
            .iter()
            .all(|(p, _)| p.starts_with("etc") || p == Path::new("y")));
    }

    #[test]
    fn cve_2021_25741_symlink_swaps_never_bind_outside() {
        let name = crate::test_name!("cve_2021_25741_symlink_swaps_never_bind_outside");
        run_in_child(name, Child::PrivateMounts, || {
            swaps_never_bind_outside(3000)
        });
    }

    /// A mount nested inside the volume is crossed, as the kubelet's
    /// `doSafeOpen` does (the bind shows what is mounted there); a symlink
    /// beyond it is still refused. `..` and absolute paths never get as far
    /// as opening anything.
    fn nested_mounts_and_bad_paths() {
        let f = Fixture::new();
        let vol = f.vol();
        let other = f.t.path().join("other");
        std::fs::create_dir_all(other.join("sub")).unwrap();
        symlink("/", other.join("root")).unwrap();
        std::fs::create_dir(vol.join("mnt")).unwrap();
        bind(&other, &vol.join("mnt"));
        let paths = f.set_up(&[sub("c", 0, "mnt/sub")]).unwrap();
        assert_eq!(ino(&paths[0]), ino(&other.join("sub")));
        let err = f.set_up(&[sub("c", 1, "mnt/root")]).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        f.clean();
        unmount(&vol.join("mnt"));
        for (path, want) in [
            ("/etc", "must not be an absolute path"),
            ("..", "must not contain '..'"),
            ("a/../../etc", "must not contain '..'"),
        ] {
            let err = f.set_up(&[sub("c", 0, path)]).unwrap_err().to_string();
            assert!(err.contains(want), "{path}: {err}");
        }
        assert!(f.binds().is_empty());
        assert!(!vol.join("a").exists(), "nothing made");
    }

    #[test]
    fn nested_mounts_are_crossed_and_bad_paths_refused() {
        let name = crate::test_name!("nested_mounts_are_crossed_and_bad_paths_refused");
        run_in_child(name, Child::PrivateMounts, nested_mounts_and_bad_paths);
    }

    /// A subPath through a symlink that stays inside the volume, to a
    /// directory there, with the rest not made yet: the rest is made where
    /// the symlink leads, inside the volume (the kubelet's
    /// `findExistingPrefix` follows it). Through a dangling symlink, one
    /// leading out (absolute, or climbing with `..`), even to a directory
    /// that does not exist: refused, nothing made anywhere.
    fn made_through_inside_symlinks() {
        let f = Fixture::new();
        let vol = f.vol();
        std::fs::create_dir_all(vol.join("data/logs")).unwrap();
        std::fs::create_dir(vol.join("d")).unwrap();
        symlink("data", vol.join("link")).unwrap();
        symlink("../data/logs", vol.join("d/logs")).unwrap();
        symlink("missing", vol.join("dangling")).unwrap();
        symlink(f.outside(), vol.join("out")).unwrap();
        symlink("../../../../../../../..", vol.join("up")).unwrap();
        symlink("../../../../../../../../nothere", vol.join("up-missing")).unwrap();
        let paths = f
            .set_up(&[sub("c", 0, "link/new/deeper"), sub("c", 1, "d/logs/app")])
            .unwrap();
        assert_eq!(ino(&paths[0]), ino(&vol.join("data/new/deeper")));
        assert_eq!(ino(&paths[1]), ino(&vol.join("data/logs/app")));
        assert!(vol.join("link").is_symlink() && vol.join("d/logs").is_symlink());
        f.clean();
        let before = tree(&f.outside());
        for path in [
            "dangling",
            "dangling/x",
            "out/new",
            "out/etc/new",
            "up/new",
            "up-missing/new",
            "up-missing",
        ] {
            let err = f.set_up(&[sub("c", 0, path)]).unwrap_err().to_string();
            assert!(
                err.contains("subPath") && err.contains("symlink"),
                "{path}: {err}"
            );
            assert!(f.binds().is_empty(), "{path}: bound {:?}", f.binds());
        }
        assert_eq!(tree(&f.outside()), before, "nothing made outside");
        assert!(
            !vol.join("missing").exists(),
            "nothing made for the dangling link"
        );
        f.clean();
    }

    #[test]
    fn sub_paths_are_made_through_symlinks_that_stay_inside() {
        let name = crate::test_name!("sub_paths_are_made_through_symlinks_that_stay_inside");
        run_in_child(name, Child::PrivateMounts, made_through_inside_symlinks);
    }

    /// The same where `openat2` fails with `ENOSYS`: the fallback walk.
    mod without_openat2 {
        crate::again_without_openat2!(
            binds_and_cleans,
            symlinks_refused,
            made_through_inside_symlinks,
            swaps_never_bind_outside(1000),
            nested_mounts_and_bad_paths,
        );
    }
}
