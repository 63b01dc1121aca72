//! `ownership_walk`: a process changing the owner, mode or SELinux label
//! of every file of a pod's volume, one by one: the kubelet applying the
//! pod's `fsGroup` (`SetVolumeOwnership`) or a runtime relabelling the
//! volume, which holds the pod in `ContainerCreating` for as long as the
//! volume has files (kubernetes/kubernetes#69699).
//!
//! The eBPF tracer counts, per process and volume directory, the calls of
//! the `chown`, `chmod` and `security.selinux` `setxattr` families
//! ([`crate::ebpf::Walk`]); a scan reports the walks still moving that
//! lasted [`MIN_DURATION`] or reached [`MIN_FILES`], with the files done
//! of the volume's inode count, the rate since the last scan and the time
//! left. Without the eBPF tracer nothing is reported.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::cache::out_of_band::rfc3339;
use crate::ebpf::wire::WALK_GAP_NS;
use crate::ebpf::Walk;
use crate::status::{Finding, FindingKind};
use crate::sys::mountinfo::escape;
use crate::tracer::context::TracerStatus;
use crate::volume::PodUid;

use super::mount_unreachable::probed_fstype;
use super::{finding, DesiredPods, Observer, Snapshot};

/// A walk is reported once it lasted this long...
pub const MIN_DURATION: Duration = Duration::from_secs(10);
/// ... or changed this many files.
pub const MIN_FILES: u64 = 1_000;

/// Where the observer reads the walks counted now.
pub trait WalkCounters: Send + Sync {
    /// The walks (`true`: a caller with uid 0), `None` when nothing
    /// counts them (no eBPF tracer).
    fn walks(&self) -> Option<Vec<(bool, Walk)>>;
}

impl WalkCounters for TracerStatus {
    fn walks(&self) -> Option<Vec<(bool, Walk)>> {
        TracerStatus::walks(self)
    }
}

/// The walks' state between scans (for their rate).
#[derive(Default)]
pub(super) struct Detector {
    source: Option<Arc<dyn WalkCounters>>,
    /// The observer's mount namespace (the host's): the only one whose
    /// callers other than uid 0 count; 0 when unknown (none of them do).
    own_mnt_ns: u64,
    /// `(pid, volume directory)` → (its first call, files done, when) at
    /// the last scan.
    last: HashMap<(u32, PathBuf), (u64, u64, Instant)>,
}

impl Observer {
    /// Reports the ownership walks `counters` counts (`ownership_walk`).
    pub fn with_walk_counters(mut self, counters: Arc<dyn WalkCounters>) -> Self {
        self.walks.source = Some(counters);
        self.walks.own_mnt_ns = crate::ebpf::own_mount_namespace().unwrap_or(0);
        self
    }
}

/// `CLOCK_MONOTONIC` in ns (`bpf_ktime_get_ns()`'s clock).
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the caller's timespec only.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) } != 0 {
        return 0;
    }
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// Files a walk changed: its most frequent call (one per file).
fn files(w: &Walk) -> u64 {
    w.chowns.max(w.chmods).max(w.relabels)
}

impl Detector {
    /// The walks in progress on the volumes of the node's pods.
    pub(super) fn evaluate(
        &mut self,
        snap: &Snapshot,
        pods: &DesiredPods,
        now: Instant,
        out: &mut Vec<Finding>,
    ) {
        let Some(walks) = self.source.as_ref().and_then(|s| s.walks()) else {
            self.last.clear();
            return;
        };
        let now_ns = monotonic_ns();
        let mut seen = HashMap::new();
        for (root, w) in walks {
            // Not uid 0: only in the host's mount namespace, where the
            // path it names is the volume's.
            let host = root || (self.own_mnt_ns != 0 && w.mnt_ns == self.own_mnt_ns);
            let moving = now_ns.saturating_sub(w.last_ns) < WALK_GAP_NS;
            if !host || !moving || w.dir.as_os_str().is_empty() {
                continue;
            }
            if !Path::new(&format!("/proc/{}", w.pid)).exists() {
                continue;
            }
            let Some((uid, name)) = pod_volume(snap, pods, &w.dir) else {
                continue;
            };
            let done = files(&w);
            let key = (w.pid, w.dir.clone());
            let rate = match self.last.get(&key) {
                Some(&(first, n, t)) if first == w.first_ns && now > t && done >= n => {
                    (done - n) as f64 / now.duration_since(t).as_secs_f64()
                }
                // First seen: over the walk so far.
                _ => done as f64 / (now_ns.saturating_sub(w.first_ns) as f64 / 1e9).max(1e-3),
            };
            seen.insert(key, (w.first_ns, done, now));
            let lasted = Duration::from_nanos(now_ns.saturating_sub(w.first_ns));
            if lasted >= MIN_DURATION || done >= MIN_FILES {
                out.push(walk_finding(snap, pods, &w, (uid, name), rate, lasted));
            }
        }
        self.last = seen;
    }
}

/// The pod and the volume (its name in the pod) whose directory is `dir`
/// (`ROOT/pods/<uid>/volumes/<plugin>/<name>`), for a pod on the node.
fn pod_volume(snap: &Snapshot, pods: &DesiredPods, dir: &Path) -> Option<(PodUid, String)> {
    let rel = dir.strip_prefix(snap.root.join("pods")).ok()?;
    let parts: Vec<&str> = rel.iter().map(|c| c.to_str()).collect::<Option<_>>()?;
    let [uid, "volumes", _plugin, name] = parts.as_slice() else {
        return None;
    };
    let uid = PodUid::new(uid).ok()?;
    let on_node = pods.pod(&uid).is_some() || snap.pod_dirs.contains(&uid);
    if !on_node {
        return None;
    }
    let by_mount = |v: &&crate::cache::desired_state_of_world::PodVolumeEntry| {
        let n = v.resolution.name();
        n.and_then(|n| snap.asw.pod_mount(n, &uid))
            .is_some_and(|m| m.path.starts_with(dir))
    };
    let outer = pods.pod(&uid).and_then(|p| {
        let vs = &p.volumes;
        vs.iter()
            .find(|v| v.outer_name == *name)
            .or_else(|| vs.iter().find(by_mount))
            .map(|v| v.outer_name.clone())
    });
    let name = outer.unwrap_or_else(|| name.to_string());
    Some((uid, name))
}

/// Why a volume's inode count was not read.
#[derive(Debug, thiserror::Error)]
pub enum InodeCountError {
    /// Neither the volume directory nor its `mount` is a mount point.
    #[error("no file system mounted at the volume directory")]
    NotMounted,
    /// A network or FUSE mount (`statvfs` may hang): not asked.
    #[error("not asked of a {fstype} mount")]
    Probed {
        /// The mount's file system type.
        fstype: String,
    },
    /// `statvfs` failed.
    #[error("statvfs: {0}")]
    Statvfs(#[source] nix::errno::Errno),
}

/// The volume's used inodes (`f_files - f_ffree`) when a local file
/// system is mounted at `dir` (or at `dir/mount`, the CSI layout); never
/// asked of a network or FUSE mount (it may hang), nor of the file system
/// `dir` is only a directory of (its count is not the volume's).
fn inode_count(snap: &Snapshot, dir: &Path) -> Result<u64, InodeCountError> {
    let mount = dir.join("mount");
    let at = [dir, mount.as_path()]
        .into_iter()
        .find(|p| snap.table.is_mount_point(p))
        .ok_or(InodeCountError::NotMounted)?;
    let fstype = snap
        .table
        .top(at)
        .map(|m| m.fstype.clone())
        .unwrap_or_default();
    if probed_fstype(&fstype) {
        return Err(InodeCountError::Probed { fstype });
    }
    let st = nix::sys::statvfs::statvfs(at).map_err(InodeCountError::Statvfs)?;
    // `fsfilcnt_t` is not 64 bits on every target.
    #[allow(clippy::useless_conversion)]
    let used = u64::from(st.files()).saturating_sub(u64::from(st.files_free()));
    Ok(used)
}

/// The finding of walk `w` on pod `uid`'s volume `name`.
fn walk_finding(
    snap: &Snapshot,
    pods: &DesiredPods,
    w: &Walk,
    (uid, name): (PodUid, String),
    rate: f64,
    lasted: Duration,
) -> Finding {
    let done = files(w);
    let total = inode_count(snap, &w.dir);
    let comm = w.comm.escape_debug().to_string();
    let left = match &total {
        Ok(t) if rate > 0.0 => format!(
            ", about {}s left",
            (t.saturating_sub(done) as f64 / rate).ceil() as u64
        ),
        _ => String::new(),
    };
    let of = match &total {
        Ok(t) => format!(" of {t}"),
        Err(_) => String::new(),
    };
    let mut f = finding(
        FindingKind::OwnershipWalk,
        escape(&w.dir),
        format!(
            "pid {} ({comm}) is changing the owner or label of every file of volume {name:?}: {done}{of} files in {}s, {rate:.0} files/s{left}",
            w.pid,
            lasted.as_secs()
        ),
    );
    f.evidence = vec![
        format!("process: pid {} ({comm}), uid {}", w.pid, w.uid),
        format!(
            "calls: {} chown, {} chmod, {} security.selinux setxattr",
            w.chowns, w.chmods, w.relabels
        ),
        match &total {
            Ok(t) => format!("files: {done} of {t} (the volume's inodes in use, statvfs)"),
            Err(why) => format!("files: {done} (the volume's inode count not read: {why})"),
        },
        format!("rate: {rate:.0} files/s{left}"),
        "avoided by the pod's securityContext.fsGroupChangePolicy: OnRootMismatch (no walk when the volume's root already matches) and, for SELinux, a mount context (seLinuxOptions with SELinuxMount) instead of a relabel of every file".into(),
    ];
    f.since = SystemTime::now().checked_sub(lasted).map(rfc3339);
    if let Some(p) = pods.pod(&uid) {
        f.pod = Some(format!("{}/{}", p.namespace, p.name));
    }
    f.pod_uid = Some(uid.as_str().to_string());
    f.volume = Some(name);
    f
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cache::desired_state_of_world::{
        DesiredStateOfWorld, PodEntry, PodUpdate, PodVolumeEntry,
    };
    use crate::sys::mount_table::MountTable;
    use crate::sys::root_dir::RootDir;

    struct Fake(Vec<(bool, Walk)>);

    impl WalkCounters for Fake {
        fn walks(&self) -> Option<Vec<(bool, Walk)>> {
            Some(self.0.clone())
        }
    }

    const OWN_NS: u64 = 4026531840;

    fn snap(root: &Path) -> Snapshot {
        Snapshot {
            root: root.to_path_buf(),
            dir: Arc::new(RootDir::open(root).unwrap()),
            table: MountTable::new(Vec::new()),
            asw: Default::default(),
            pod_dirs: Vec::new(),
            loops: Vec::new(),
        }
    }

    fn dsw() -> DesiredStateOfWorld {
        let mut d = DesiredStateOfWorld::default();
        let volume = PodVolumeEntry {
            outer_name: "data".into(),
            resolution: crate::cache::desired_state_of_world::VolumeResolution::Failed {
                plugin: None,
                error: "not resolved in this test".into(),
                why: crate::cache::desired_state_of_world::Unresolved::PodError,
            },
        };
        d.set_pod(PodUpdate {
            uid: PodUid::new("uid-1").unwrap(),
            entry: PodEntry {
                namespace: "ns".into(),
                name: "web".into(),
                volumes: vec![volume],
                supplemental_groups: Vec::new(),
                terminated: false,
            },
            mounts: Vec::new(),
        });
        d
    }

    /// A walk of `files` chowns by this process, its last call now, that
    /// began `ago` before.
    fn walk(dir: PathBuf, files: u64, ago: Duration) -> Walk {
        let now = monotonic_ns();
        Walk {
            pid: std::process::id(),
            uid: 0,
            mnt_ns: OWN_NS,
            comm: "kubelet\n".into(),
            dir,
            first_ns: now - ago.as_nanos() as u64,
            last_ns: now,
            chowns: files,
            chmods: 0,
            relabels: 0,
        }
    }

    fn findings(root: &Path, walks: Vec<(bool, Walk)>) -> Vec<Finding> {
        let mut d = Detector {
            source: Some(Arc::new(Fake(walks))),
            own_mnt_ns: OWN_NS,
            last: HashMap::new(),
        };
        let mut out = Vec::new();
        d.evaluate(
            &snap(root),
            &DesiredPods::of(&dsw()),
            Instant::now(),
            &mut out,
        );
        out
    }

    #[test]
    fn a_long_or_big_walk_of_a_pods_volume_is_reported() {
        let t = tempfile::tempdir().unwrap();
        let vol = t
            .path()
            .join("pods/uid-1/volumes/kubernetes.io~empty-dir/data");
        let secs = Duration::from_secs;
        let f = findings(t.path(), vec![(true, walk(vol.clone(), 2000, secs(1)))]);
        assert_eq!(f.len(), 1, "{f:#?}");
        let f = &f[0];
        assert_eq!(f.kind, FindingKind::OwnershipWalk);
        assert_eq!(f.pod.as_deref(), Some("ns/web"));
        assert_eq!(f.pod_uid.as_deref(), Some("uid-1"));
        assert_eq!(f.volume.as_deref(), Some("data"));
        let evidence = f.evidence.join("\n");
        assert!(evidence.contains("(kubelet\\n), uid 0"), "{evidence}");
        assert!(
            evidence
                .contains("files: 2000 (the volume's inode count not read: no file system mounted"),
            "{evidence}"
        );
        // Long enough, with few files; and another caller in the host's
        // mount namespace.
        let mut other = walk(vol.clone(), 10, secs(11));
        other.uid = 1000;
        assert_eq!(findings(t.path(), vec![(false, other.clone())]).len(), 1);
        // Not reported: small and short; stopped; another caller in another
        // mount namespace; a pod not on the node; a process gone.
        let mut stopped = walk(vol.clone(), 5000, secs(60));
        stopped.last_ns -= WALK_GAP_NS;
        other.mnt_ns = OWN_NS + 1;
        let elsewhere = t
            .path()
            .join("pods/uid-2/volumes/kubernetes.io~empty-dir/data");
        let mut gone = walk(vol.clone(), 5000, secs(60));
        gone.pid = i32::MAX as u32;
        let none = vec![
            (true, walk(vol.clone(), 999, secs(9))),
            (true, stopped),
            (false, other),
            (true, walk(elsewhere, 5000, secs(60))),
            (true, gone),
            (true, walk(PathBuf::new(), 5000, secs(60))),
        ];
        assert_eq!(findings(t.path(), none), Vec::new());
    }
}
