//! File system tools in the per-volume timelines: `mkfs`, `fsck`,
//! `resize2fs`, `xfs_growfs`, ... exec'd by a CSI driver (or anyone) name a
//! device (`/dev/loop0`, `/dev/sdb`), not a volume path, so the path
//! attribution of [`super::timeline`] cannot place them. This places them
//! through a device → volume map:
//!
//! - learned from the mount family: a successful `mount` of a `/dev/...`
//!   source on a volume path (the CSI staging `globalmount`, a block
//!   volume's map path) maps that device to that volume until the path is
//!   unmounted;
//! - looked up in the mount table when a tool runs on a device mounted
//!   before the tracer started (`fsck`/`resize2fs` of a staged volume);
//! - for a tool that runs *before* its device's first mount (`mkfs` in
//!   NodeStageVolume), its run is kept for a while ([`PENDING_FOR`]) and
//!   placed when a mount of that device on a volume path appears (a
//!   `mount` with the device as source, or a `mount` (not a bind) or
//!   `move_mount` onto a volume path whose mount-table entry has the device
//!   as source: the new mount API names the source in `fsconfig`).
//!
//! A tool whose argument is itself a volume path (`xfs_growfs` takes the
//! mount point) is placed by that path. Devices are compared by their
//! canonical path (`/dev/disk/by-id/...` links resolve to `/dev/sdX`).
//!
//! Bounded: at most [`MAX_DEVICES`] devices (the least recently used one
//! makes room) and [`MAX_PENDING`] runs waiting (the oldest makes room).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};

use crate::ebpf::{MountSyscall, SyscallEvent, ToolExec};

use super::timeline::{attribute, Attribution};

/// `MS_BIND` from `linux/mount.h`.
const MS_BIND: u64 = 0x1000;

/// Devices remembered at most.
pub const MAX_DEVICES: usize = 4096;
/// Tool runs waiting for their device's mount, at most.
pub const MAX_PENDING: usize = 64;
/// How long a tool run waits for its device's mount (ns of
/// `CLOCK_MONOTONIC` from its exit).
pub const PENDING_FOR: u64 = 120_000_000_000;

/// A tool run placed on a volume: the run, where, and its device argument.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    /// The run.
    pub exec: ToolExec,
    /// The volume.
    pub attribution: Attribution,
    /// The tool's device (or path) argument, as passed.
    pub device: String,
}

struct Learned {
    attribution: Attribution,
    /// The mount point the device was mounted on (forgotten at its umount).
    target: PathBuf,
    touched: u64,
}

/// The device → volume map and the tool runs waiting for a mount.
#[derive(Default)]
pub struct DeviceVolumes {
    by_device: HashMap<String, Learned>,
    pending: VecDeque<(String, ToolExec)>,
    clock: u64,
}

/// `path` resolved (symlinks such as `/dev/disk/by-id/...`), or as given.
pub fn device_key(path: &str) -> String {
    std::fs::canonicalize(path)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| path.to_string())
}

impl DeviceVolumes {
    /// Devices known and runs waiting now.
    pub fn counts(&self) -> (usize, usize) {
        (self.by_device.len(), self.pending.len())
    }

    /// Learns from a mount-family call; the waiting runs it places.
    /// `mounts` lists (source, mount point) of the mount table; it is read
    /// only when runs are waiting and the call mounted on a volume path.
    pub fn on_syscall(
        &mut self,
        ev: &SyscallEvent,
        root: &Path,
        mounts: impl FnOnce() -> Vec<(String, PathBuf)>,
    ) -> Vec<Placed> {
        if ev.ret < 0 {
            return Vec::new();
        }
        let Some(target) = ev.target.as_deref() else {
            return Vec::new();
        };
        match ev.syscall {
            MountSyscall::Umount => {
                let t = clean(target);
                self.by_device.retain(|_, l| l.target != t);
                Vec::new()
            }
            MountSyscall::Mount | MountSyscall::MoveMount => {
                let Some(a) = attribute(target, root) else {
                    return Vec::new();
                };
                let t = clean(target);
                let from_call = ev
                    .source
                    .as_deref()
                    .filter(|s| ev.syscall == MountSyscall::Mount && s.starts_with("/dev/"))
                    .map(device_key);
                // A bind's table entry names the device it came from: not
                // that device's own mount.
                let bind = ev.syscall == MountSyscall::Mount && ev.flags & MS_BIND != 0;
                let devices: Vec<String> = match from_call {
                    Some(d) => vec![d],
                    None if !self.pending.is_empty() && !bind => mounts()
                        .into_iter()
                        .filter(|(s, p)| *p == t && s.starts_with("/dev/"))
                        .map(|(s, _)| device_key(&s))
                        .collect(),
                    None => Vec::new(),
                };
                let mut placed = Vec::new();
                for d in devices {
                    self.learn(d.clone(), a.clone(), t.clone());
                    placed.extend(self.take_pending(&d, &a, ev.boot_ns));
                }
                placed
            }
            _ => Vec::new(),
        }
    }

    /// Places a tool run: by its argument's path, the device map, or the
    /// mount table (`mounts`, read only for a device not in the map);
    /// `None` when it waits for its device's mount (or names no device).
    pub fn on_exec(
        &mut self,
        x: ToolExec,
        root: &Path,
        mounts: impl FnOnce() -> Vec<(String, PathBuf)>,
    ) -> Option<Placed> {
        let device = x.device()?.to_string();
        if let Some(a) = attribute(&device, root) {
            return Some(Placed {
                exec: x,
                attribution: a,
                device,
            });
        }
        let key = device_key(&device);
        if !self.by_device.contains_key(&key) {
            if let Some((a, p)) = mounted_volume(&key, root, mounts()) {
                self.learn(key.clone(), a, p);
            }
        }
        self.clock += 1;
        if let Some(l) = self.by_device.get_mut(&key) {
            l.touched = self.clock;
            return Some(Placed {
                attribution: l.attribution.clone(),
                exec: x,
                device,
            });
        }
        self.pending
            .retain(|(_, p)| x.end_ns.saturating_sub(p.end_ns) <= PENDING_FOR);
        if self.pending.len() >= MAX_PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back((key, x));
        None
    }

    fn learn(&mut self, device: String, attribution: Attribution, target: PathBuf) {
        self.clock += 1;
        if !self.by_device.contains_key(&device) && self.by_device.len() >= MAX_DEVICES {
            let oldest = self
                .by_device
                .iter()
                .min_by_key(|(_, l)| l.touched)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.by_device.remove(&k);
            }
        }
        self.by_device.insert(
            device,
            Learned {
                attribution,
                target,
                touched: self.clock,
            },
        );
    }

    /// The waiting runs on `device` that ended at most [`PENDING_FOR`]
    /// before `now_ns`, placed on `a`.
    fn take_pending(&mut self, device: &str, a: &Attribution, now_ns: u64) -> Vec<Placed> {
        let mut placed = Vec::new();
        let mut keep = VecDeque::new();
        for (d, x) in self.pending.drain(..) {
            if d != device {
                keep.push_back((d, x));
            } else if now_ns.saturating_sub(x.end_ns) <= PENDING_FOR {
                let device = x.device().unwrap_or_default().to_string();
                placed.push(Placed {
                    exec: x,
                    attribution: a.clone(),
                    device,
                });
            }
        }
        self.pending = keep;
        placed
    }
}

/// The volume path device `key` ([`device_key`]) is mounted on in
/// `mounts` (source, mount point), and its attribution.
pub fn mounted_volume(
    key: &str,
    root: &Path,
    mounts: Vec<(String, PathBuf)>,
) -> Option<(Attribution, PathBuf)> {
    mounts.into_iter().find_map(|(s, p)| {
        let a = attribute(p.to_str()?, root)?;
        (s.starts_with("/dev/") && device_key(&s) == key).then_some((a, p))
    })
}

/// Lexical clean-up (`//`, `/./`), as the attribution does.
fn clean(path: &str) -> PathBuf {
    Path::new(path).components().collect()
}

/// (source, mount point) of every entry of this process's mount table
/// (empty when it cannot be read).
pub fn own_mounts() -> Vec<(String, PathBuf)> {
    crate::sys::mountinfo::read_self()
        .map(|m| m.into_iter().map(|m| (m.source, m.mount_point)).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracer::timeline::PathRole;

    const STAGING: &str = "/r/plugins/kubernetes.io/csi/d.example/abc/globalmount";

    fn exec(args: &[&str], end_ns: u64) -> ToolExec {
        ToolExec {
            start_ns: end_ns.saturating_sub(100),
            end_ns,
            pid: 5,
            comm: args[0].into(),
            mnt_ns: 1,
            cgroup_id: 1,
            args: args.iter().map(|s| s.to_string()).collect(),
            args_truncated: false,
            exit_code: 0,
            uid: 0,
        }
    }

    fn call(syscall: MountSyscall, source: Option<&str>, target: &str, at: u64) -> SyscallEvent {
        SyscallEvent {
            boot_ns: at,
            pid: 6,
            tid: 6,
            comm: "driver".into(),
            mnt_ns: 1,
            cgroup_id: 1,
            syscall,
            flags: 0,
            fstype: Some("ext4".into()),
            source: source.map(Into::into),
            target: Some(target.into()),
            ret: 0,
            latency_ns: 10,
            uid: 0,
        }
    }

    fn none() -> Vec<(String, PathBuf)> {
        Vec::new()
    }

    #[test]
    fn mkfs_before_the_mount_is_placed_when_the_device_is_mounted() {
        let root = Path::new("/r");
        let mut d = DeviceVolumes::default();
        let mkfs = exec(&["mkfs.ext4", "-q", "-F", "/dev/fake-loop0"], 1_000);
        assert!(d.on_exec(mkfs.clone(), root, none).is_none(), "waits");
        assert_eq!(d.counts(), (0, 1));
        // Another device's mount places nothing.
        let other = call(
            MountSyscall::Mount,
            Some("/dev/fake-loop1"),
            "/r/pods/u/volumes/p/v",
            2_000,
        );
        assert!(d.on_syscall(&other, root, none).is_empty());
        let mount = call(MountSyscall::Mount, Some("/dev/fake-loop0"), STAGING, 3_000);
        let placed = d.on_syscall(&mount, root, || panic!("not needed"));
        assert_eq!(placed.len(), 1);
        assert_eq!(placed[0].exec, mkfs);
        assert_eq!(placed[0].device, "/dev/fake-loop0");
        assert_eq!(placed[0].attribution.key.volume, "abc");
        assert_eq!(placed[0].attribution.role, PathRole::Staging);
        assert_eq!(d.counts(), (2, 0));

        // Known now: a later fsck is placed at once.
        let fsck = exec(&["fsck.ext4", "-n", "/dev/fake-loop0"], 4_000);
        let p = d.on_exec(fsck, root, || panic!("known")).unwrap();
        assert_eq!(p.attribution.key.volume, "abc");
        // Unmounted: forgotten (the loop device may serve another volume next).
        let umount = call(MountSyscall::Umount, None, STAGING, 5_000);
        assert!(d.on_syscall(&umount, root, none).is_empty());
        assert_eq!(d.counts(), (1, 0));
        assert!(d
            .on_exec(exec(&["mkfs.xfs", "/dev/fake-loop0"], 6_000), root, none)
            .is_none());
    }

    #[test]
    fn runs_are_placed_by_path_or_mount_table_and_waiting_is_bounded() {
        let root = Path::new("/r");
        let mut d = DeviceVolumes::default();
        // xfs_growfs names the mount point.
        let p = d
            .on_exec(exec(&["xfs_growfs", STAGING], 10), root, none)
            .unwrap();
        assert_eq!(p.attribution.key.volume, "abc");
        // Mounted before the tracer started: found in the mount table.
        let table = || vec![("/dev/fake-sdb".to_string(), PathBuf::from(STAGING))];
        let p = d
            .on_exec(exec(&["resize2fs", "/dev/fake-sdb"], 20), root, table)
            .unwrap();
        assert_eq!(p.attribution.key.volume, "abc");
        assert_eq!(d.counts(), (1, 0));
        // No device argument: nothing.
        assert!(d.on_exec(exec(&["fsck", "-A"], 30), root, none).is_none());
        assert_eq!(d.counts(), (1, 0));
        // A mount through the new API (no source in the call): the table.
        assert!(d
            .on_exec(exec(&["mkfs.ext4", "/dev/fake-sdc"], 40), root, none)
            .is_none());
        let mut bind = call(
            MountSyscall::Mount,
            Some(STAGING),
            "/r/pods/u/volumes/p/v",
            45,
        );
        bind.flags = MS_BIND;
        let placed = d.on_syscall(&bind, root, || panic!("a bind is not the device's mount"));
        assert!(placed.is_empty());
        let mv = call(
            MountSyscall::MoveMount,
            Some(""),
            "/r/pods/u/volumes/p/v",
            50,
        );
        let table = || {
            vec![(
                "/dev/fake-sdc".to_string(),
                PathBuf::from("/r/pods/u/volumes/p/v"),
            )]
        };
        let placed = d.on_syscall(&mv, root, table);
        assert_eq!(placed.len(), 1);
        assert_eq!(placed[0].attribution.key.pod_uid.as_deref(), Some("u"));
        // Bounded: old runs expire, at most MAX_PENDING wait.
        for i in 0..(MAX_PENDING as u64 + 10) {
            let dev = format!("/dev/fake-x{i}");
            assert!(d
                .on_exec(exec(&["mkfs", &dev], 1_000 + i), root, none)
                .is_none());
        }
        assert_eq!(d.counts().1, MAX_PENDING);
        let late = exec(&["mkfs", "/dev/fake-y"], 1_000 + PENDING_FOR + 100_000);
        assert!(d.on_exec(late, root, none).is_none());
        assert_eq!(d.counts().1, 1, "the expired ones are gone");
        let mount = call(
            MountSyscall::Mount,
            Some("/dev/fake-y"),
            STAGING,
            3 * PENDING_FOR,
        );
        assert!(
            d.on_syscall(&mount, root, none).is_empty(),
            "too long after the run"
        );
    }
}
