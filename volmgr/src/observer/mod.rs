//! Observe mode (`volmgr agent --observe`): next to an unmodified kubelet,
//! rebuild the kubelet's actual state with the manager's own
//! reconstruction, read-only ([`VolumeManager::observe_actual_state`]),
//! compare it with the desired state the same populator builds from the
//! pod sources, and report what needs a person as [`Finding`]s, each with
//! its evidence. Nothing here mounts, unmounts or writes: the reconciler
//! never runs in observe mode.
//!
//! The kinds (see [`FindingKind`]): (a) orphaned pod directories, (b)
//! volumes still mounted for deleted pods, (c) device mounts no pod uses,
//! (d) volumes needed longer than `stuck_after` and not mounted, (e) mounts
//! the kubelet recorded that are not in the mount table, (f) a target
//! mounted more than once, (g) loop devices whose backing file is deleted;
//! and the volume doctor's, a file each: (h) network or FUSE mounts that no
//! longer answer ([`mount_unreachable`]), (i) a deleted pod's volume
//! something holds (`teardown_blocked`), (j) ownership and relabel walks
//! ([`ownership_walk`]), (k) a CSI driver a stuck volume needs that is not
//! registered or does not answer (`csi_driver_not_ready`), (l) the
//! kubelet's events against the node's mounts (`kubelet_disagrees`).

mod blocked_tasks;
mod csi_driver_not_ready;
mod desired_pods;
pub mod holder_helper;
pub mod holders;
mod kubelet_disagrees;
mod kubelet_layout;
mod loops;
pub mod mount_unreachable;
pub mod ownership_walk;
mod teardown_blocked;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::cache::actual_state_of_world::{ActualStateOfWorld, DeviceMountState, VolumeMountState};
use crate::cache::desired_state_of_world::DesiredStateOfWorld;
use crate::cache::out_of_band::rfc3339;
use crate::status::{Finding, FindingKind, ObservedVolume, RecentSyscall};
use crate::sys::mount_table::MountTable;
use crate::sys::mountinfo::MountInfo;
use crate::sys::root_dir::{RelPath, RootDir};
use crate::volume::PodUid;
use crate::volumemanager::VolumeManager;

use desired_pods::DesiredPods;

pub use csi_driver_not_ready::{CsiNodeError, CsiNodeLookup, Step as CsiTriageStep};
pub use kubelet_disagrees::attach::{
    AttachmentLog, AttachmentSeen, NoAttachments, NodeAttached, MAX_ERROR as ATTACH_MAX_ERROR,
};
pub use kubelet_disagrees::{NoPodEvents, PodEventLog};
pub use loops::{loop_devices, LoopDevice};
pub use mount_unreachable::{MountProber, ProbeSettings};

/// The recent syscalls on a path: the hook through which the eBPF tracer
/// adds what it saw to a finding (a stuck volume's last calls).
pub trait SyscallHistory: Send + Sync {
    /// The last mount-family syscalls seen on `path` (or below it), oldest
    /// first.
    fn recent_for_path(&self, path: &Path) -> Vec<RecentSyscall>;
}

/// No tracer history: findings carry no syscalls.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSyscallHistory;

impl SyscallHistory for NoSyscallHistory {
    fn recent_for_path(&self, _path: &Path) -> Vec<RecentSyscall> {
        Vec::new()
    }
}

/// Why a scan failed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// The mount table could not be read.
    #[error("reading the mount table: {0}")]
    MountTable(#[from] crate::sys::mountinfo::MountInfoError),
    /// The read-only reconstruction failed.
    #[error(transparent)]
    Manager(#[from] crate::volumemanager::Error),
}

/// What one scan read: the mount table, the actual state rebuilt from it
/// and ROOT, the pod directories, and the loop devices.
pub struct Snapshot {
    /// ROOT.
    pub root: PathBuf,
    /// ROOT's door: directories are listed through it, never through a
    /// symlink nor across a mount.
    pub dir: Arc<RootDir>,
    /// The mount table.
    pub table: MountTable,
    /// The actual state, rebuilt read-only.
    pub asw: ActualStateOfWorld,
    /// The UIDs of the directories under `ROOT/pods`.
    pub pod_dirs: Vec<PodUid>,
    /// The loop devices.
    pub loops: Vec<LoopDevice>,
}

/// Reads a [`Snapshot`] of the node (reads only).
pub fn snapshot(vm: &VolumeManager) -> Result<Snapshot, ObserveError> {
    let table = MountTable::new(crate::sys::mountinfo::read_self()?);
    let (world, _report) = vm.observe_actual_state(&table)?;
    let dir = Arc::clone(vm.root());
    let root = dir.path().to_path_buf();
    let pod_dirs = RelPath::new(["pods"])
        .and_then(|pods| dir.read_dir(&pods))
        .map(|names| {
            let mut uids: Vec<PodUid> = names
                .iter()
                .filter_map(|n| PodUid::new(n.to_str()?).ok())
                .collect();
            // The same pods first in every scan (the findings are capped).
            uids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            uids
        })
        .unwrap_or_default();
    let asw = std::mem::take(&mut *world.asw_mut());
    Ok(Snapshot {
        root,
        dir,
        table,
        asw,
        pod_dirs,
        loops: loop_devices(Path::new(loops::SYS_BLOCK)),
    })
}

/// The findings engine: remembers since when each needed volume is seen
/// not mounted (for [`FindingKind::VolumeStuck`] and
/// [`FindingKind::RecordedNotMounted`]).
pub struct Observer {
    stuck_after: Duration,
    history: Arc<dyn SyscallHistory>,
    /// `(pod, volume name in the pod)` → first seen not mounted.
    first_seen: HashMap<(PodUid, String), (Instant, SystemTime)>,
    /// `(kind, path)` of what pods gone from the node left → first seen:
    /// the kubelet tears down after the pod is gone (a graceful deletion
    /// ends with its housekeeping), so (a), (b) and (c) wait `stuck_after`.
    left_behind: HashMap<(FindingKind, String), (Instant, SystemTime)>,
    /// The last scan's view of every desired pod's volumes.
    volumes: Vec<ObservedVolume>,
    /// The last scan's findings over [`MAX_FINDINGS_PER_KIND`], by kind:
    /// counted, not kept.
    not_listed: BTreeMap<FindingKind, usize>,
    /// (l) the kubelet's events against the mount table.
    kubelet: kubelet_disagrees::Detector,
    /// (h)'s probes of the network and FUSE mounts, when set.
    mount_probes: Option<Arc<MountProber>>,
    /// The CSI registration triage of stuck CSI volumes' drivers.
    csi: csi_driver_not_ready::CsiTriage,
    /// The ownership walks' rates (`ownership_walk`).
    walks: ownership_walk::Detector,
}

/// Findings kept (with their evidence), put in status, logged and sent as
/// events at most per kind and scan; the rest are only counted
/// ([`Observer::not_listed`]). A million orphaned pod directories must
/// not cost gigabytes of memory nor a million warnings.
pub const MAX_FINDINGS_PER_KIND: usize = 256;

impl Observer {
    /// An observer reporting needed volumes after `stuck_after`.
    pub fn new(stuck_after: Duration, history: Arc<dyn SyscallHistory>) -> Self {
        Self {
            stuck_after,
            history,
            first_seen: HashMap::new(),
            left_behind: HashMap::new(),
            volumes: Vec::new(),
            not_listed: BTreeMap::new(),
            kubelet: kubelet_disagrees::Detector::default(),
            mount_probes: None,
            csi: Default::default(),
            walks: Default::default(),
        }
    }

    /// One scan of the node: the findings, sorted by kind and path. The
    /// desired state's read lock is held only to judge the snapshot
    /// against it and copy out what the rest needs ([`DesiredPods`]); the
    /// holder scan, the /proc scans, the mount probes, the CSI triage and
    /// the tracer's history run after it is released.
    pub fn scan(&mut self, vm: &VolumeManager) -> Result<Vec<Finding>, ObserveError> {
        let snap = snapshot(vm)?;
        let populated = vm.sources_populated();
        let now = Instant::now();
        let (found, pods) = vm.with_desired_state(|dsw| {
            let found = self.evaluate_desired(&snap, dsw, populated, now);
            (found, DesiredPods::of(dsw))
        });
        Ok(self.evaluate_rest(&snap, &pods, populated, now, found))
    }

    /// The findings of `snap` against the desired state. Pods not on the
    /// node are judged only once the sources are `populated`. (A scan
    /// holds `dsw`'s lock for the first half only: see [`Self::scan`].)
    pub fn evaluate(
        &mut self,
        snap: &Snapshot,
        dsw: &DesiredStateOfWorld,
        populated: bool,
        now: Instant,
    ) -> Vec<Finding> {
        let found = self.evaluate_desired(snap, dsw, populated, now);
        self.evaluate_rest(snap, &DesiredPods::of(dsw), populated, now, found)
    }

    /// The first half of [`Self::evaluate`], under the desired state's
    /// lock: what is judged against it, from the snapshot and ROOT only
    /// (no /proc scan, helper, probe nor socket).
    fn evaluate_desired(
        &mut self,
        snap: &Snapshot,
        dsw: &DesiredStateOfWorld,
        populated: bool,
        now: Instant,
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        self.not_listed.clear();
        if populated {
            let mut left = Vec::new();
            deleted_pods(snap, dsw, &mut left, &mut self.not_listed);
            unused_devices(snap, dsw, &mut left);
            self.after_teardown_time(left, now, &mut out);
        }
        self.needed_volumes(snap, dsw, now, &mut out);
        stacked_mounts(snap, dsw, &mut out);
        deleted_loop_backing(snap, &mut out);
        self.kubelet.evaluate(snap, dsw, &mut out);
        out
    }

    /// The second half of [`Self::evaluate`], on the copy `pods` of the
    /// desired pods, without the lock: the held mounts' holders (only
    /// (b) findings are reclassified: the first half's other findings are
    /// left as they are), the probes, the walks and the CSI triage; then
    /// the syscalls, the order and the caps.
    fn evaluate_rest(
        &mut self,
        snap: &Snapshot,
        pods: &DesiredPods,
        populated: bool,
        now: Instant,
        mut out: Vec<Finding>,
    ) -> Vec<Finding> {
        if populated {
            teardown_blocked::reclassify(&mut out, &snap.table, self.history.as_ref());
        }
        let probes = self.mount_probes.as_deref();
        mount_unreachable::evaluate(probes, snap, pods, &mut out, &mut self.not_listed);
        self.walks.evaluate(snap, pods, now, &mut out);
        self.csi.add_findings(snap, pods, now, &mut out);
        for f in &mut out {
            if f.recent_syscalls.is_empty() {
                f.recent_syscalls = self.history.recent_for_path(Path::new(&f.path));
            }
        }
        out.sort_by(|a, b| (a.kind, &a.path).cmp(&(b.kind, &b.path)));
        cap_per_kind(&mut out, &mut self.not_listed);
        out
    }

    /// The last scan's findings over [`MAX_FINDINGS_PER_KIND`], by kind.
    pub fn not_listed(&self) -> &BTreeMap<FindingKind, usize> {
        &self.not_listed
    }

    /// (a), (b) and (c) once seen for `stuck_after`: the kubelet's time to
    /// tear down what a pod gone from the node left.
    fn after_teardown_time(&mut self, left: Vec<Finding>, now: Instant, out: &mut Vec<Finding>) {
        let mut seen = HashSet::new();
        for mut f in left {
            let key = (f.kind, f.path.clone());
            let (first, since) = *self
                .left_behind
                .entry(key.clone())
                .or_insert((now, SystemTime::now()));
            seen.insert(key);
            if now.saturating_duration_since(first) >= self.stuck_after {
                f.since = Some(rfc3339(since));
                out.push(f);
            }
        }
        self.left_behind.retain(|k, _| seen.contains(k));
    }

    /// (d) and (e): each desired pod's volumes that are not mounted, once
    /// seen so for `stuck_after`. A pod that ended (still the kubelet's
    /// until it is deleted) needs none. Every volume's state goes to
    /// [`Self::volumes`].
    fn needed_volumes(
        &mut self,
        snap: &Snapshot,
        dsw: &DesiredStateOfWorld,
        now: Instant,
        out: &mut Vec<Finding>,
    ) {
        let mut seen = HashSet::new();
        self.volumes.clear();
        for (uid, pod) in dsw.pods() {
            for v in &pod.volumes {
                let mut observed = ObservedVolume {
                    pod_uid: uid.as_str().to_string(),
                    volume: v.outer_name.clone(),
                    state: "mounted".into(),
                    path: mounted_path(snap, uid, v),
                    since: None,
                    error: None,
                };
                let missing = needed_state(snap, dsw, uid, v);
                let Some((kind, evidence, path)) = missing.filter(|_| !pod.terminated) else {
                    if observed.path.is_none() && pod.terminated {
                        observed.state = "not_mounted".into();
                    }
                    self.volumes.push(observed);
                    continue;
                };
                let key = (uid.clone(), v.outer_name.clone());
                let (first, since) = *self
                    .first_seen
                    .entry(key.clone())
                    .or_insert((now, SystemTime::now()));
                seen.insert(key);
                observed.path = None;
                observed.since = Some(rfc3339(since));
                if now.saturating_duration_since(first) < self.stuck_after {
                    observed.state = "not_mounted".into();
                    self.volumes.push(observed);
                    continue;
                }
                let mut f = finding(kind, path, format_needed(kind, &v.outer_name, now - first));
                f.pod_uid = Some(uid.as_str().to_string());
                f.pod = Some(format!("{}/{}", pod.namespace, pod.name));
                f.volume = Some(v.outer_name.clone());
                f.evidence = evidence;
                f.since = Some(rfc3339(since));
                observed.state = "stuck".into();
                observed.error = Some(format!("{}: {}", kind.as_str(), f.summary));
                self.volumes.push(observed);
                out.push(f);
            }
        }
        self.first_seen.retain(|k, _| seen.contains(k));
    }

    /// What the last scan saw of each volume of the pods on the node.
    pub fn volumes(&self) -> &[ObservedVolume] {
        &self.volumes
    }
}

/// Where the kubelet has pod `uid`'s volume `v` mounted (its path in the
/// rebuilt actual state, when that is in the mount table or needs no
/// mount).
fn mounted_path(
    snap: &Snapshot,
    uid: &PodUid,
    v: &crate::cache::desired_state_of_world::PodVolumeEntry,
) -> Option<String> {
    let name = v.resolution.name()?;
    let m = snap.asw.pod_mount(name, uid)?;
    let there = m.state == VolumeMountState::Mounted
        || snap.table.is_mount_point(&m.path)
        || !has_mount_record(&m.path);
    there.then(|| m.path.display().to_string())
}

/// The one-line summary of a needed volume not mounted.
fn format_needed(kind: FindingKind, volume: &str, for_: Duration) -> String {
    match kind {
        FindingKind::RecordedNotMounted => format!(
            "volume {volume:?} is recorded as set up but is not mounted (for {}s)",
            for_.as_secs()
        ),
        _ => format!(
            "volume {volume:?} is needed and not mounted for {}s",
            for_.as_secs()
        ),
    }
}

/// Whether a desired pod's volume is missing: `(kind, evidence, path)`,
/// or `None` when it is mounted.
fn needed_state(
    snap: &Snapshot,
    dsw: &DesiredStateOfWorld,
    uid: &PodUid,
    v: &crate::cache::desired_state_of_world::PodVolumeEntry,
) -> Option<(FindingKind, Vec<String>, String)> {
    let pod_dir = snap.root.join("pods").join(uid.as_str());
    let Some(name) = v.resolution.name() else {
        let why = v.resolution.error().unwrap_or_default();
        let ev = vec![format!("the volume cannot be resolved: {why}")];
        return Some((FindingKind::VolumeStuck, ev, pod_dir.display().to_string()));
    };
    let spec = dsw
        .volume(name)
        .and_then(|dv| dv.pods.get(uid))
        .map(|p| Arc::clone(&p.spec));
    if let Some(outside) = spec.as_deref().and_then(kubelet_layout::outside_pod_dir) {
        // Nothing of it in the pod's directory: the kubelet fails it only
        // on its own check.
        let ev = vec![format!("volume {name}: {}", outside?)];
        return Some((FindingKind::VolumeStuck, ev, pod_dir.display().to_string()));
    }
    let mount = snap.asw.pod_mount(name, uid);
    if let (Some(m), Some(spec)) = (mount, spec.as_deref()) {
        if kubelet_layout::on_tmpfs(spec) && !kubelet_layout::tmpfs_at(&snap.table, &m.path) {
            return Some(tmpfs_missing(snap, uid, v, name, &m.path));
        }
    }
    match mount {
        Some(m) if m.state == VolumeMountState::Mounted => None,
        // Not trusted until set up again (reconstruction's uncertain),
        // but mounted, or a directory volume with no mount record.
        Some(m) if snap.table.is_mount_point(&m.path) || !has_mount_record(&m.path) => None,
        Some(m) => {
            let mut ev = vec![format!(
                "volume {name} ({})",
                v.resolution.plugin().map_or("?", |p| &**p)
            )];
            ev.push(format!(
                "{} is recorded ({} beside it) but the mount table shows nothing there",
                m.path.display(),
                crate::plugins::csi::VOL_DATA_FILE
            ));
            ev.extend(listing_at(snap, &m.path));
            Some((
                FindingKind::RecordedNotMounted,
                ev,
                m.path.display().to_string(),
            ))
        }
        None => {
            let mut ev = vec![format!(
                "volume {name} ({}): nothing set up in the pod's directory",
                v.resolution.plugin().map_or("?", |p| &**p)
            )];
            ev.extend(listing_at(snap, &pod_dir.join("volumes")));
            Some((FindingKind::VolumeStuck, ev, pod_dir.display().to_string()))
        }
    }
}

/// A volume the kubelet puts on a tmpfs whose directory is there without
/// one: set up and unmounted since (the kubelet marked it ready, and does
/// not mount it again: the container writes to the node's disk), or never
/// mounted (stuck).
fn tmpfs_missing(
    snap: &Snapshot,
    uid: &PodUid,
    v: &crate::cache::desired_state_of_world::PodVolumeEntry,
    name: &crate::volume::UniqueVolumeName,
    path: &Path,
) -> (FindingKind, Vec<String>, String) {
    let mut ev = vec![format!(
        "volume {name} ({}): {} is not a tmpfs mount",
        v.resolution.plugin().map_or("?", |p| &**p),
        path.display()
    )];
    let kind = match kubelet_layout::ready_mark(&snap.dir, uid, &v.outer_name) {
        Some(ready) => {
            ev.push(format!("the kubelet set it up ({ready} exists)"));
            FindingKind::RecordedNotMounted
        }
        None => FindingKind::VolumeStuck,
    };
    ev.extend(listing_at(snap, path));
    (kind, ev, path.display().to_string())
}

/// Whether the kubelet recorded a mount at `path`: a `vol_data.json`
/// beside it (CSI's publish record).
fn has_mount_record(path: &Path) -> bool {
    path.parent()
        .is_some_and(|d| d.join(crate::plugins::csi::VOL_DATA_FILE).is_file())
}

/// A finding with its kind, path and summary, the rest empty.
fn finding(kind: FindingKind, path: String, summary: String) -> Finding {
    Finding {
        kind,
        pod_uid: None,
        pod: None,
        volume: None,
        path,
        summary,
        evidence: Vec::new(),
        since: None,
        recent_syscalls: Vec::new(),
        events: Vec::new(),
    }
}

/// A mount table line as evidence; a bind mount of part of a file system
/// shows what it binds as `findmnt` does (`udev[/loop3]`: a device node).
fn mount_line(m: &MountInfo) -> String {
    let bound = if m.root == Path::new("/") {
        String::new()
    } else {
        format!("[{}]", m.root.display())
    };
    format!(
        "mounted: id {} {}{bound} on {} type {} ({})",
        m.mount_id,
        m.source,
        m.mount_point.display(),
        m.fstype,
        m.mount_options
    )
}

/// [`dir_listing`] of `path`, an absolute path under ROOT.
fn listing_at(snap: &Snapshot, path: &Path) -> Vec<String> {
    let rel = path
        .strip_prefix(&snap.root)
        .ok()
        .and_then(|r| RelPath::new(r.components().map(|c| c.as_os_str())).ok());
    match rel {
        Some(rel) => dir_listing(&snap.dir, &rel),
        None => vec![format!("{}: not under ROOT, not listed", path.display())],
    }
}

/// What is left in directory `rel` under ROOT, two levels deep (names
/// only), as evidence. Listed through ROOT's descriptor: a symlink (to
/// `/proc/self`, to `/etc`) is shown, never followed, and no mount is
/// crossed.
fn dir_listing(root: &RootDir, rel: &RelPath) -> Vec<String> {
    let abs = root.abs(rel);
    match root.exists(rel) {
        Ok(true) => {}
        Ok(false) => return vec![format!("{}: missing", abs.display())],
        Err(e) => return vec![format!("{}: not listed: {e}", abs.display())],
    }
    let mut names = match root.read_dir(rel) {
        Ok(names) => names,
        Err(e) => return vec![format!("{}: not listed: {e}", abs.display())],
    };
    names.sort();
    let mut out = Vec::new();
    for name in names.iter().take(LISTED) {
        let inner = rel.join(name).and_then(|r| root.read_dir(&r));
        let p = abs.join(name);
        out.push(match inner {
            Ok(mut v) => {
                v.sort();
                let mut shown: Vec<_> =
                    v.iter().take(LISTED).map(|n| n.to_string_lossy()).collect();
                if v.len() > LISTED {
                    shown.push(format!("... and {} more", v.len() - LISTED).into());
                }
                format!("left: {} [{}]", p.display(), shown.join(", "))
            }
            Err(e) => format!("left: {} (not listed: {e})", p.display()),
        });
    }
    if names.len() > LISTED {
        out.push(format!(
            "... and {} more in {}",
            names.len() - LISTED,
            abs.display()
        ));
    }
    out
}

/// How many entries of a directory, and of each directory in it, a
/// finding's evidence names.
const LISTED: usize = 32;

/// Keeps the first [`MAX_FINDINGS_PER_KIND`] of each kind of `out`;
/// counts the rest in `not_listed`.
fn cap_per_kind(out: &mut Vec<Finding>, not_listed: &mut BTreeMap<FindingKind, usize>) {
    let mut kept: BTreeMap<FindingKind, usize> = BTreeMap::new();
    out.retain(|f| {
        let n = kept.entry(f.kind).or_default();
        *n += 1;
        if *n > MAX_FINDINGS_PER_KIND {
            *not_listed.entry(f.kind).or_default() += 1;
        }
        *n <= MAX_FINDINGS_PER_KIND
    });
}

/// (a) and (b): pod directories of pods not on the node, with or without
/// mounts left in them; past [`MAX_FINDINGS_PER_KIND`] of a kind (in the
/// order of the UIDs) only counted in `not_listed`, without their evidence
/// nor the wait for the kubelet's teardown.
fn deleted_pods(
    snap: &Snapshot,
    dsw: &DesiredStateOfWorld,
    out: &mut Vec<Finding>,
    not_listed: &mut BTreeMap<FindingKind, usize>,
) {
    let mut kept = [0usize; 2];
    for uid in &snap.pod_dirs {
        if dsw.pod(uid).is_some() {
            continue;
        }
        let dir = snap.root.join("pods").join(uid.as_str());
        let mut mounts: BTreeMap<&Path, Vec<&MountInfo>> = BTreeMap::new();
        for m in snap.table.below(&dir) {
            mounts.entry(&m.mount_point).or_default().push(m);
        }
        let (kind, i) = match mounts.is_empty() {
            true => (FindingKind::OrphanedPodDir, 0),
            false => (FindingKind::MountedForDeletedPod, 1),
        };
        if kept[i] >= MAX_FINDINGS_PER_KIND {
            *not_listed.entry(kind).or_default() += mounts.len().max(1);
            continue;
        }
        kept[i] += mounts.len().max(1);
        if mounts.is_empty() {
            let mut f = finding(
                FindingKind::OrphanedPodDir,
                dir.display().to_string(),
                format!(
                    "orphaned pod {uid}: its directory is still on disk, nothing mounted in it"
                ),
            );
            f.pod_uid = Some(uid.as_str().to_string());
            for sub in ["volumes", "volume-subpaths", "volumeDevices"] {
                match RelPath::new(["pods", uid.as_str(), sub]) {
                    Ok(rel) => f.evidence.extend(dir_listing(&snap.dir, &rel)),
                    Err(e) => f.evidence.push(e.to_string()),
                }
            }
            out.push(f);
            continue;
        }
        for (path, ms) in mounts {
            let volume = volume_at(&snap.asw, uid, path);
            let mut f = finding(
                FindingKind::MountedForDeletedPod,
                path.display().to_string(),
                format!("pod {uid} is no longer on the node, its volume is still mounted"),
            );
            f.pod_uid = Some(uid.as_str().to_string());
            f.volume = volume;
            f.evidence = ms.into_iter().map(mount_line).collect();
            out.push(f);
        }
    }
}

/// The unique name of the volume `pod` has at `path`, if reconstruction
/// found one.
fn volume_at(asw: &ActualStateOfWorld, pod: &PodUid, path: &Path) -> Option<String> {
    asw.mounts_of_pod(pod.as_str())
        .find(|(_, _, m)| path.starts_with(&m.path))
        .map(|(name, _, _)| name.as_str().to_string())
}

/// (c): device mounts (CSI staging, block global map) mounted with no
/// pod's mount of their volume and no desired pod.
fn unused_devices(snap: &Snapshot, dsw: &DesiredStateOfWorld, out: &mut Vec<Finding>) {
    for (name, v) in snap.asw.volumes() {
        if v.device_mount_state == DeviceMountState::NotMounted
            || !v.pods.is_empty()
            || dsw.volume_exists(name)
        {
            continue;
        }
        let Some(path) = &v.device_mount_path else {
            continue;
        };
        let places = v
            .device_spec
            .as_deref()
            .and_then(|spec| crate::plugins::csi::device_mount_paths(&snap.root, spec));
        let (path, lines, vol_data) = match &places {
            Some(p) => {
                let (at, lines) = device_mount_lines(&snap.table, p);
                (at, lines, p.vol_data.clone())
            }
            None => {
                let lines = lines_at(&snap.table, path);
                let data = path.with_file_name(crate::plugins::csi::VOL_DATA_FILE);
                (path.clone(), lines, data)
            }
        };
        if lines.is_empty() {
            continue;
        }
        let mut f = finding(
            FindingKind::UnusedDeviceMount,
            path.display().to_string(),
            format!("{name}: device mount with no pod mount and no pod that needs it"),
        );
        f.volume = Some(name.as_str().to_string());
        f.evidence = lines;
        f.evidence.push(format!("plugin {}", v.plugin_name));
        if let Ok(text) = std::fs::read_to_string(&vol_data) {
            f.evidence
                .push(format!("{}: {}", vol_data.display(), text.trim()));
        }
        out.push(f);
    }
}

/// The mount table lines of the mounts on `path`.
fn lines_at(table: &MountTable, path: &Path) -> Vec<String> {
    table
        .entries()
        .iter()
        .filter(|m| m.mount_point == path)
        .map(mount_line)
        .collect()
}

/// Where a staged CSI volume's device is mounted, and the lines: its
/// staging target (a block volume: at or below it), and a block volume's
/// global map entries and publish targets. The finding's path is the
/// staging target, or a block volume's global map path when the device is
/// mapped there (the kubelet's device path of a block volume).
fn device_mount_lines(
    table: &MountTable,
    p: &crate::plugins::csi::DeviceMountPaths,
) -> (PathBuf, Vec<String>) {
    let mut lines = lines_at(table, &p.staging);
    let mut at = p.staging.clone();
    if p.global_map.is_none() {
        return (at, lines);
    }
    lines.extend(table.below(&p.staging).map(mount_line));
    if let Some(global) = &p.global_map {
        let mapped: Vec<String> = table.below(global).map(mount_line).collect();
        if !mapped.is_empty() {
            at = global.clone();
        }
        lines.extend(mapped);
    }
    if let Some(publish) = &p.publish {
        lines.extend(table.below(publish).map(mount_line));
    }
    (at, lines)
}

/// (f): mount points under ROOT with more than one mount.
fn stacked_mounts(snap: &Snapshot, dsw: &DesiredStateOfWorld, out: &mut Vec<Finding>) {
    let pods = snap.root.join("pods");
    let stacked: BTreeSet<&Path> = snap
        .table
        .below(&snap.root)
        .filter(|m| snap.table.count(&m.mount_point) > 1)
        .map(|m| m.mount_point.as_path())
        .collect();
    for path in stacked {
        let lines: Vec<String> = snap
            .table
            .entries()
            .iter()
            .filter(|m| m.mount_point == path)
            .map(mount_line)
            .collect();
        let mut f = finding(
            FindingKind::MountedMoreThanOnce,
            path.display().to_string(),
            format!("{} mounts on one target", lines.len()),
        );
        let uid = path
            .strip_prefix(&pods)
            .ok()
            .and_then(|r| r.iter().next())
            .and_then(|c| PodUid::new(c.to_str()?).ok());
        if let Some(uid) = uid {
            f.volume = volume_at(&snap.asw, &uid, path);
            if let Some(p) = dsw.pod(&uid) {
                f.pod = Some(format!("{}/{}", p.namespace, p.name));
            }
            f.pod_uid = Some(uid.as_str().to_string());
        }
        f.evidence = lines;
        out.push(f);
    }
}

/// (g): loop devices whose backing file is deleted, with what mounts them.
fn deleted_loop_backing(snap: &Snapshot, out: &mut Vec<Finding>) {
    for l in snap.loops.iter().filter(|l| l.deleted) {
        let mut f = finding(
            FindingKind::LoopBackingDeleted,
            format!("/dev/{}", l.name),
            format!("loop device {} is backed by a deleted file", l.name),
        );
        f.evidence.push(format!("backing_file: {}", l.backing_file));
        f.evidence.extend(
            snap.table
                .entries()
                .iter()
                .filter(|m| (m.major, m.minor) == (l.major, l.minor))
                .map(mount_line),
        );
        out.push(f);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A tracer history whose first call parks until released: a slow
    /// step of a scan (a holder scan, a /proc scan, a probe) stands in.
    struct Parked {
        parked: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
        release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl SyscallHistory for Parked {
        fn recent_for_path(&self, _path: &Path) -> Vec<RecentSyscall> {
            if let Some(tx) = self.parked.lock().unwrap().take() {
                tx.send(()).unwrap();
                let _ = self
                    .release
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(120));
            }
            Vec::new()
        }
    }

    fn pod(uid: &str) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c"}]}
        }))
        .unwrap()
    }

    /// Before, `scan` ran all of `evaluate` under the desired state's read
    /// lock: while a slow step (here the tracer's history of an orphaned
    /// pod directory's finding) waited, the populator's write waited for
    /// it. Now the write goes through while the step is parked.
    #[test]
    fn the_desired_state_is_written_while_a_slow_step_of_a_scan_waits() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("pods/gone")).unwrap();
        let fake = Arc::new(crate::sys::fake::FakeMounter::default());
        let vm = VolumeManager::new(crate::volumemanager::Config::new(t.path()), fake).unwrap();
        vm.set_populated();
        let (parked_tx, parked_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        let history = Arc::new(Parked {
            parked: std::sync::Mutex::new(Some(parked_tx)),
            release: std::sync::Mutex::new(release_rx),
        });
        let mut observer = Observer::new(Duration::ZERO, history);
        let scanning = Arc::clone(&vm);
        let scan = std::thread::spawn(move || observer.scan(&scanning).unwrap());
        parked_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        let (wrote_tx, wrote_rx) = std::sync::mpsc::channel();
        let writing = Arc::clone(&vm);
        let writer = std::thread::spawn(move || {
            writing.upsert_pod(&pod("new")).unwrap();
            let _ = wrote_tx.send(());
        });
        let wrote = wrote_rx.recv_timeout(Duration::from_secs(30));
        release_tx.send(()).unwrap();
        let findings = scan.join().unwrap();
        writer.join().unwrap();
        assert!(
            wrote.is_ok(),
            "the populator's write waited for the scan's slow step"
        );
        assert!(
            findings
                .iter()
                .any(|f| f.kind == FindingKind::OrphanedPodDir),
            "{findings:?}"
        );
    }

    #[test]
    fn orphan_evidence_lists_without_following_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let pod = t.path().join("pods/uid-1");
        std::fs::create_dir_all(pod.join("volumes/kubernetes.io~empty-dir/scratch")).unwrap();
        std::os::unix::fs::symlink("/etc", pod.join("volumes/kubernetes.io~etc")).unwrap();
        std::os::unix::fs::symlink("/proc/self", pod.join("volume-subpaths")).unwrap();
        let root = RootDir::open(t.path()).unwrap();
        let rel = |sub| RelPath::new(["pods", "uid-1", sub]).unwrap();
        let volumes = dir_listing(&root, &rel("volumes")).join("\n");
        assert!(
            volumes.contains("kubernetes.io~empty-dir [scratch]"),
            "{volumes}"
        );
        assert!(
            volumes.contains("kubernetes.io~etc (not listed"),
            "{volumes}"
        );
        assert!(!volumes.contains("passwd"), "{volumes}");
        let subpaths = dir_listing(&root, &rel("volume-subpaths")).join("\n");
        assert!(
            subpaths.contains("volume-subpaths: not listed"),
            "{subpaths}"
        );
        assert!(!subpaths.contains("left:"), "{subpaths}");
        let devices = dir_listing(&root, &rel("volumeDevices")).join("\n");
        assert!(devices.ends_with("volumeDevices: missing"), "{devices}");
    }
}
