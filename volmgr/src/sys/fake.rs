//! A recording [`Mounter`] for unit tests: it keeps its own mount table, logs
//! every call, and fails calls on request.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::mountinfo::{MountInfo, MountInfoError};
use super::{
    MountTableReader, MountTableWatch, Mounter, MsFlags, SyscallError, Target, TMPFS_MAGIC,
};
use crate::util::fast_map::FastSet;

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `mount(source, target, fstype, data)`.
    Mount {
        /// Mount source.
        source: String,
        /// Target path.
        target: PathBuf,
        /// File system type.
        fstype: String,
        /// Mount data (options).
        data: Option<String>,
    },
    /// `umount2(target)`.
    Unmount(PathBuf),
    /// A remount (`MS_REMOUNT`) of the mount on `target`.
    Remount {
        /// Target path.
        target: PathBuf,
        /// With `MS_RDONLY`.
        read_only: bool,
        /// New mount options (e.g. a tmpfs's `size=`).
        data: Option<String>,
    },
}

#[derive(Default)]
struct State {
    /// Mount point, file system type, unique mount id.
    mounts: Vec<(PathBuf, String, u64)>,
    calls: Vec<Call>,
    /// Errors to return from the next mount calls, in order.
    mount_failures: VecDeque<nix::errno::Errno>,
    unmount_failures: VecDeque<nix::errno::Errno>,
    /// How many times the whole table was read.
    table_reads: usize,
    /// How many times the mount ids were listed.
    id_lists: usize,
    /// Moves on with every change of `mounts` (the kernel's mount event).
    events: Arc<AtomicU64>,
    /// What `fs_usage` answers.
    usage: super::FsUsage,
    /// Paths given to `make_rshared`.
    rshared: Vec<PathBuf>,
}

impl State {
    fn changed(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }
}

/// The fake's [`MountTableWatch`]: compares event counts.
struct FakeWatch {
    events: Arc<AtomicU64>,
    seen: u64,
}

impl MountTableWatch for FakeWatch {
    fn changed(&mut self) -> bool {
        let now = self.events.load(Ordering::Relaxed);
        std::mem::replace(&mut self.seen, now) != now
    }
}

/// The recording fake.
#[derive(Default)]
pub struct FakeMounter {
    state: Mutex<State>,
    /// While true, `unmount` blocks (an NFS server gone); `unmount_detach`
    /// never does.
    hang: Arc<(Mutex<bool>, std::sync::Condvar)>,
}

impl FakeMounter {
    /// Makes the next `n` mounts fail with `errno`.
    pub fn fail_mounts(&self, n: usize, errno: nix::errno::Errno) {
        let mut s = self.state.lock().unwrap();
        s.mount_failures.extend(std::iter::repeat_n(errno, n));
    }

    /// `unmount`, never blocking.
    fn unmount_now(&self, parent: &Target, name: &std::ffi::OsStr) -> Result<(), SyscallError> {
        let path = parent.path().join(name);
        let mut s = self.state.lock().unwrap();
        s.calls.push(Call::Unmount(path.clone()));
        if let Some(errno) = s.unmount_failures.pop_front() {
            return Err(SyscallError::new("umount2", &path, errno));
        }
        match s.mounts.iter().rposition(|(p, _, _)| *p == path) {
            Some(i) => {
                s.mounts.remove(i);
                s.changed();
                Ok(())
            }
            None => Err(SyscallError::new(
                "umount2",
                &path,
                nix::errno::Errno::EINVAL,
            )),
        }
    }

    /// Makes `unmount` block until called again with `false` (as an
    /// unmount waiting for a dead NFS server does).
    pub fn hang_unmounts(&self, hang: bool) {
        let (lock, cv) = &*self.hang;
        *lock.lock().unwrap() = hang;
        cv.notify_all();
    }

    /// Makes the next `n` unmounts fail with `errno`.
    pub fn fail_unmounts(&self, n: usize, errno: nix::errno::Errno) {
        let mut s = self.state.lock().unwrap();
        s.unmount_failures.extend(std::iter::repeat_n(errno, n));
    }

    /// Sets what `fs_usage` answers for every path.
    pub fn set_usage(&self, usage: super::FsUsage) {
        self.state.lock().unwrap().usage = usage;
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    /// Paths mounted now (a path mounted twice appears twice).
    pub fn mounted(&self) -> Vec<PathBuf> {
        let s = self.state.lock().unwrap();
        s.mounts.iter().map(|(p, _, _)| p.clone()).collect()
    }

    /// The paths `make_rshared` was called on (kept apart from
    /// [`calls`](Self::calls)).
    pub fn rshared(&self) -> Vec<PathBuf> {
        self.state.lock().unwrap().rshared.clone()
    }

    /// How many times the whole mount table was read.
    pub fn table_reads(&self) -> usize {
        self.state.lock().unwrap().table_reads
    }

    /// How many times the mount ids were listed.
    pub fn id_lists(&self) -> usize {
        self.state.lock().unwrap().id_lists
    }

    /// Removes a mount behind the manager's back (an out-of-band unmount).
    pub fn remove_out_of_band(&self, path: &Path) {
        let mut s = self.state.lock().unwrap();
        s.mounts.retain(|(p, _, _)| p != path);
        s.changed();
    }
}

impl MountTableReader for FakeMounter {
    fn mount_table(&self) -> Result<Vec<MountInfo>, MountInfoError> {
        let mut s = self.state.lock().unwrap();
        s.table_reads += 1;
        Ok(s.mounts
            .iter()
            .enumerate()
            .map(|(i, (p, fstype, _))| MountInfo {
                mount_id: 100 + i as u32,
                parent_id: 1,
                major: 0,
                minor: 100 + i as u32,
                root: PathBuf::from("/"),
                mount_point: p.clone(),
                mount_options: "rw".into(),
                optional_fields: vec![],
                fstype: fstype.clone(),
                source: fstype.clone(),
                super_options: "rw".into(),
            })
            .collect())
    }
}

impl Mounter for FakeMounter {
    fn mount(
        &self,
        source: &str,
        target: &Target,
        fstype: &str,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SyscallError> {
        let mut s = self.state.lock().unwrap();
        if flags.contains(MsFlags::MS_REMOUNT) {
            // A remount changes options of a mount that must be there.
            s.calls.push(Call::Remount {
                target: target.path().to_path_buf(),
                read_only: flags.contains(MsFlags::MS_RDONLY),
                data: data.map(str::to_string),
            });
            let mounted = s.mounts.iter().any(|(p, _, _)| p == target.path());
            return match s.mount_failures.pop_front() {
                Some(errno) => Err(SyscallError::new("mount", target.path(), errno)),
                None if !mounted => Err(SyscallError::new(
                    "mount",
                    target.path(),
                    nix::errno::Errno::EINVAL,
                )),
                None => {
                    s.changed();
                    Ok(())
                }
            };
        }
        s.calls.push(Call::Mount {
            source: source.to_string(),
            target: target.path().to_path_buf(),
            fstype: fstype.to_string(),
            data: data.map(str::to_string),
        });
        if let Some(errno) = s.mount_failures.pop_front() {
            return Err(SyscallError::new("mount", target.path(), errno));
        }
        s.changed();
        // The event count is never reused: a unique mount id.
        let id = s.events.load(Ordering::Relaxed);
        s.mounts
            .push((target.path().to_path_buf(), fstype.to_string(), id));
        Ok(())
    }

    fn unmount_detach(&self, parent: &Target, name: &std::ffi::OsStr) -> Result<(), SyscallError> {
        self.unmount_now(parent, name)
    }

    fn unmount(&self, parent: &Target, name: &std::ffi::OsStr) -> Result<(), SyscallError> {
        let (lock, cv) = &*self.hang;
        let mut hang = lock.lock().unwrap();
        while *hang {
            hang = cv.wait(hang).unwrap();
        }
        drop(hang);
        self.unmount_now(parent, name)
    }

    /// A directory with a recorded mount is refused, as the kernel refuses
    /// a mount point; otherwise the real `rmdir`.
    fn remove_unmounted_dir(
        &self,
        parent: &Target,
        name: &std::ffi::OsStr,
    ) -> Result<super::UnmountedDir, SyscallError> {
        if self.is_mount_point_at(parent, name)? {
            return Ok(super::UnmountedDir::StillMounted);
        }
        super::rmdir_unmounted(parent, name)
    }

    fn bind_mount(&self, source: &Target, target: &Target) -> Result<(), SyscallError> {
        let source = source.path().to_string_lossy().into_owned();
        self.mount(&source, target, "bind", MsFlags::MS_BIND, None)
    }

    fn make_rshared(&self, root: &Path) -> Result<super::RootPropagation, super::PropagationError> {
        self.state.lock().unwrap().rshared.push(root.to_path_buf());
        Ok(super::RootPropagation::MadeShared)
    }

    fn is_mount_point(&self, target: &Target) -> Result<bool, SyscallError> {
        let s = self.state.lock().unwrap();
        Ok(s.mounts.iter().any(|(p, _, _)| p == target.path()))
    }

    fn is_mount_point_at(
        &self,
        parent: &Target,
        name: &std::ffi::OsStr,
    ) -> Result<bool, SyscallError> {
        let path = parent.path().join(name);
        let s = self.state.lock().unwrap();
        Ok(s.mounts.iter().any(|(p, _, _)| *p == path))
    }

    fn fs_magic(&self, target: &Target) -> Result<i64, SyscallError> {
        let s = self.state.lock().unwrap();
        Ok(
            match s.mounts.iter().rev().find(|(p, _, _)| p == target.path()) {
                Some((_, fstype, _)) if fstype == "tmpfs" => TMPFS_MAGIC,
                _ => 0xEF53,
            },
        )
    }

    fn fs_usage(&self, _target: &Target) -> Result<super::FsUsage, SyscallError> {
        Ok(self.state.lock().unwrap().usage)
    }

    fn mount_id(&self, target: &Target) -> Result<Option<u64>, SyscallError> {
        let s = self.state.lock().unwrap();
        let top = s.mounts.iter().rev().find(|(p, _, _)| p == target.path());
        Ok(top.map(|(_, _, id)| *id))
    }

    fn mount_id_in(
        &self,
        parent: &Target,
        name: &std::ffi::OsStr,
    ) -> Result<Option<u64>, SyscallError> {
        let path = parent.path().join(name);
        let s = self.state.lock().unwrap();
        let top = s.mounts.iter().rev().find(|(p, _, _)| *p == path);
        Ok(top.map(|(_, _, id)| *id))
    }

    fn mount_ids(&self) -> Result<Option<FastSet<u64>>, SyscallError> {
        let mut s = self.state.lock().unwrap();
        s.id_lists += 1;
        Ok(Some(s.mounts.iter().map(|(_, _, id)| *id).collect()))
    }

    fn watch_mount_table(&self) -> Result<Box<dyn MountTableWatch>, SyscallError> {
        let events = Arc::clone(&self.state.lock().unwrap().events);
        let seen = events.load(Ordering::Relaxed);
        Ok(Box::new(FakeWatch { events, seen }))
    }
}
