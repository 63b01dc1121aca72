//! Per-volume timelines: every traced mount-family syscall of any process
//! (the kubelet, CSI driver containers, mount helpers, the agent itself)
//! attributed, by the path it touches, to the pod and volume that path
//! belongs to under ROOT, and kept in a bounded ring per volume.
//!
//! Attribution is lexical, by the kubelet's layout under ROOT
//! ([`attribute`]): a pod's volume directory
//! (`pods/<uid>/volumes/<plugin>/<name>`), its block device map
//! (`pods/<uid>/volumeDevices/<plugin>/<name>`), its subPath bind mounts
//! (`pods/<uid>/volume-subpaths/<volume>/...`), a CSI volume's staging
//! directory (`plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`),
//! a CSI block volume's staging, publish and global map paths
//! (`plugins/kubernetes.io/csi/volumeDevices/...`) and an in-tree plugin's
//! global mounts (`plugins/<vendor>/<plugin>/...`). File system tools
//! (`mkfs`, `fsck`, `resize2fs`, ...) name a device, not a path:
//! `super::devices` places them through the device's mount on a volume
//! path ([`TimelineStore::record_exec`]). A path given relative
//! to a directory descriptor or the caller's cwd cannot be placed without
//! racing the caller and is left out. A call in another mount namespace is
//! attributed by the path it passed, which is the same path when that
//! namespace sees ROOT where the agent does (a CSI driver container with
//! the kubelet's directory mounted at the same place, as every driver's
//! manifest does).
//!
//! The store is bounded: at most `max_volumes` timelines of at most
//! `per_volume` calls each; the least recently touched timeline makes room
//! for a new one, and the oldest call of a full timeline for a new call.
//! Both are counted. Each caller (uid) has a share: a caller other than
//! root holds at most a quarter of the timelines (making one more evicts
//! its own least recently touched), and root's calls (the kubelet's, the
//! CSI drivers') evict other callers' timelines before root's own. Calls
//! that failed for an unprivileged caller never get here (see
//! `super::ebpf_events::attributable`): they are counted apart.

use std::collections::{HashMap, VecDeque};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::ebpf::{SyscallEvent, ToolExec};
use crate::status::{StuckSyscall, StuckToolRun};
use crate::util::sync::MutexExt;

/// Which of a volume's paths a call touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathRole {
    /// The pod's volume directory (the publish target).
    Target,
    /// The volume's node-wide staging path (CSI `globalmount`, a block
    /// volume's staging path, an in-tree plugin's global mount).
    Staging,
    /// A block volume's device map (the pod's `volumeDevices` entry, the
    /// CSI publish path or the global map path).
    BlockMap,
    /// A subPath bind mount of a container.
    SubPath,
}

impl PathRole {
    /// `target`, `staging`, `block_map`, `sub_path`.
    pub fn as_str(self) -> &'static str {
        match self {
            PathRole::Target => "target",
            PathRole::Staging => "staging",
            PathRole::BlockMap => "block_map",
            PathRole::SubPath => "sub_path",
        }
    }
}

/// What a timeline belongs to: a pod's volume, or (no pod) a volume's
/// node-wide paths.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VolumeKey {
    /// The pod's UID; `None` for staging and global paths.
    pub pod_uid: Option<String>,
    /// The directory the volume's name is in, relative to ROOT's layout:
    /// the escaped plugin name for a pod's volume (`kubernetes.io~csi`),
    /// `volume-subpaths` for subPaths, or the plugin's directory for
    /// node-wide paths (`plugins/kubernetes.io/csi/<driver>`).
    pub plugin: String,
    /// The volume's directory name (spec name, pod volume name, handle hash).
    pub volume: String,
}

/// Where a path belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    /// The timeline.
    pub key: VolumeKey,
    /// The CSI driver or plugin, as far as the path tells (`kubernetes.io/csi`
    /// for a pod's CSI volume: its `vol_data.json` names the driver).
    pub driver: String,
    /// Which path.
    pub role: PathRole,
}

const CSI_ESCAPED: &str = "kubernetes.io~csi";
const CSI_DIR: &str = "plugins/kubernetes.io/csi";
const CSI_DEVICES_DIR: &str = "plugins/kubernetes.io/csi/volumeDevices";

/// The pod and volume `path` belongs to, by the kubelet's layout under
/// `root`; `None` for a path outside it, relative, through `/proc`, with
/// `..`, or not a volume's.
pub fn attribute(path: &str, root: &Path) -> Option<Attribution> {
    let p = Path::new(path);
    if !p.is_absolute()
        || p.starts_with("/proc")
        || p.components().any(|c| matches!(c, Component::ParentDir))
    {
        return None;
    }
    // Lexical clean-up only (`//`, `/./`).
    let p: PathBuf = p.components().collect();
    let rel = p.strip_prefix(root).ok()?;
    let c: Vec<&str> = rel.iter().filter_map(|s| s.to_str()).collect();
    match c.as_slice() {
        ["pods", uid, kind, rest @ ..] => pod_path(uid, kind, rest),
        ["plugins", "kubernetes.io", "csi", rest @ ..] => csi_path(rest),
        ["plugins", vendor, plugin, first, rest @ ..] => {
            let volume = match rest.first() {
                Some(second) => format!("{first}/{second}"),
                None => (*first).to_string(),
            };
            Some(Attribution {
                key: node_key(format!("plugins/{vendor}/{plugin}"), volume),
                driver: format!("{vendor}/{plugin}"),
                role: PathRole::Staging,
            })
        }
        _ => None,
    }
}

fn node_key(plugin: String, volume: String) -> VolumeKey {
    VolumeKey {
        pod_uid: None,
        plugin,
        volume,
    }
}

fn pod_key(uid: &str, plugin: &str, volume: &str) -> VolumeKey {
    VolumeKey {
        pod_uid: Some(uid.to_string()),
        plugin: plugin.to_string(),
        volume: volume.to_string(),
    }
}

/// `pods/<uid>/<kind>/...`.
fn pod_path(uid: &str, kind: &str, rest: &[&str]) -> Option<Attribution> {
    match (kind, rest) {
        ("volumes", [plugin, name, ..]) => Some(Attribution {
            key: pod_key(uid, plugin, name),
            driver: plugin.replace('~', "/"),
            role: PathRole::Target,
        }),
        ("volumeDevices", [plugin, name, ..]) => Some(Attribution {
            key: pod_key(uid, plugin, name),
            driver: plugin.replace('~', "/"),
            role: PathRole::BlockMap,
        }),
        ("volume-subpaths", [volume, ..]) => Some(Attribution {
            key: pod_key(uid, "volume-subpaths", volume),
            driver: String::new(),
            role: PathRole::SubPath,
        }),
        _ => None,
    }
}

/// `plugins/kubernetes.io/csi/...`.
fn csi_path(rest: &[&str]) -> Option<Attribution> {
    let csi = "kubernetes.io/csi".to_string();
    match rest {
        // Block: staging/<pv>, publish/<pv>/<uid>, <pv>/dev[/<uid>], <pv>/data.
        ["volumeDevices", "staging", pv, ..] => Some(Attribution {
            key: node_key(CSI_DEVICES_DIR.into(), (*pv).into()),
            driver: csi,
            role: PathRole::Staging,
        }),
        ["volumeDevices", "publish", pv, uid, ..] => Some(Attribution {
            key: pod_key(uid, CSI_ESCAPED, pv),
            driver: csi,
            role: PathRole::BlockMap,
        }),
        ["volumeDevices", pv, "dev", uid, ..] => Some(Attribution {
            key: pod_key(uid, CSI_ESCAPED, pv),
            driver: csi,
            role: PathRole::BlockMap,
        }),
        ["volumeDevices", pv, ..] if *pv != "publish" => Some(Attribution {
            key: node_key(CSI_DEVICES_DIR.into(), (*pv).into()),
            driver: csi,
            role: PathRole::BlockMap,
        }),
        // Before Kubernetes 1.24 (and for a driver without a name in the
        // spec): pv/<pv>/globalmount.
        ["pv", pv, ..] => Some(Attribution {
            key: node_key(format!("{CSI_DIR}/pv"), (*pv).into()),
            driver: csi,
            role: PathRole::Staging,
        }),
        [driver, hash, ..] if *driver != "volumeDevices" => Some(Attribution {
            key: node_key(format!("{CSI_DIR}/{driver}"), (*hash).into()),
            driver: (*driver).into(),
            role: PathRole::Staging,
        }),
        _ => None,
    }
}

/// One call on a volume's path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineEntry {
    /// When the call started (RFC 3339, UTC).
    pub time: String,
    /// `CLOCK_MONOTONIC` at the call's start, ns (orders calls exactly).
    pub start_ns: u64,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The thread's command name.
    pub comm: String,
    /// The syscall (`mount`, `umount2`, `move_mount`, ...), or `exec` for
    /// a file system tool's run (`mkfs.ext4`, `fsck`, `resize2fs`, ...:
    /// from exec to exit).
    pub call: String,
    /// Which of the volume's paths.
    pub role: PathRole,
    /// The path as passed (for `exec`: the tool's device argument).
    pub path: String,
    /// The call's other path or source (`mount`'s source), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// File system type, if the call has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fstype: Option<String>,
    /// Entry to exit, ns.
    pub duration_ns: u64,
    /// `ok`, or the errno's name (`EBUSY`); for `exec`: `ok` (exit status
    /// 0), `exit N` or `signal N`.
    pub result: String,
    /// For `exec`: the command line (`mkfs.ext4 -q -F /dev/loop0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

/// A volume's timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeTimeline {
    /// Which volume.
    #[serde(flatten)]
    pub key: VolumeKey,
    /// The CSI driver (from `vol_data.json` or the path) or the plugin.
    pub driver: String,
    /// The calls, oldest first.
    pub entries: Vec<TimelineEntry>,
    /// Older calls that made room for these.
    pub dropped: u64,
}

/// What `volmgr doctor --pod` shows: a pod's volumes' timelines and its
/// calls stuck now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodTimeline {
    /// `namespace/name` (empty when the pod is known by UID only).
    pub pod: String,
    /// The pod's UID.
    pub uid: String,
    /// Timelines of its volumes, then of their staging paths.
    pub volumes: Vec<VolumeTimeline>,
    /// Calls on its volumes' paths blocked longer than the threshold now.
    pub stuck: Vec<StuckSyscall>,
    /// File system tools on its volumes running longer than
    /// `--stuck-tool-after` now.
    #[serde(default)]
    pub stuck_tools: Vec<StuckToolRun>,
    /// Why the timelines are empty, when they cannot be recorded (the
    /// active tracer is not eBPF).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

struct Ring {
    driver: String,
    /// The CSI volume handle from `vol_data.json` (pod CSI volumes), for
    /// finding its staging timeline.
    handle: Option<String>,
    entries: VecDeque<TimelineEntry>,
    dropped: u64,
    touched: u64,
    /// The uid of the caller whose call made it (its share, see the module).
    uid: u32,
}

struct Inner {
    rings: HashMap<VolumeKey, Ring>,
    clock: u64,
    evicted: u64,
}

/// The bounded store of per-volume timelines.
pub struct TimelineStore {
    max_volumes: usize,
    per_volume: usize,
    inner: Mutex<Inner>,
}

impl Default for TimelineStore {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_VOLUMES, DEFAULT_PER_VOLUME)
    }
}

/// Timelines kept at most (a node's 110 pods with several volumes each,
/// and their staging paths).
pub const DEFAULT_MAX_VOLUMES: usize = 2048;
/// Calls kept per timeline.
pub const DEFAULT_PER_VOLUME: usize = 32;

/// `CLOCK_MONOTONIC` now, ns (the clock of `bpf_ktime_get_ns`).
pub fn monotonic_now_ns() -> u64 {
    crate::util::clock::monotonic_ns()
}

/// The wall-clock time of `CLOCK_MONOTONIC` instant `ns`.
pub fn wall_time_of(ns: u64) -> SystemTime {
    let ago = Duration::from_nanos(monotonic_now_ns().saturating_sub(ns));
    SystemTime::now()
        .checked_sub(ago)
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// `ok` or the errno's name for a syscall's return value.
pub fn result_name(ret: i64) -> String {
    if ret >= 0 {
        return "ok".into();
    }
    let errno = nix::errno::Errno::from_raw(i32::try_from(-ret).unwrap_or(0));
    format!("{errno:?}")
}

impl TimelineStore {
    /// A store of at most `max_volumes` timelines of `per_volume` calls.
    pub fn new(max_volumes: usize, per_volume: usize) -> Self {
        Self {
            max_volumes: max_volumes.max(1),
            per_volume: per_volume.max(1),
            inner: Mutex::new(Inner {
                rings: HashMap::new(),
                clock: 0,
                evicted: 0,
            }),
        }
    }

    /// Records `ev` in the timeline of every volume whose path it touched
    /// (target and source); the driver of the first, for the latency
    /// histogram, or `None` when it touched no volume.
    pub fn record(&self, ev: &SyscallEvent, root: &Path) -> Option<String> {
        let mut found: Vec<(Attribution, &str)> = Vec::new();
        for p in [&ev.target, &ev.source].into_iter().flatten() {
            if let Some(a) = attribute(p, root) {
                if !found.iter().any(|(f, _)| f.key == a.key) {
                    found.push((a, p));
                }
            }
        }
        let mut driver = None;
        let start_ns = ev.boot_ns.saturating_sub(ev.latency_ns);
        let time = crate::cache::out_of_band::rfc3339(wall_time_of(start_ns));
        let mut inner = self.inner.locked();
        for (a, path) in found {
            let entry = TimelineEntry {
                time: time.clone(),
                start_ns,
                pid: ev.pid,
                tid: ev.tid,
                comm: ev.comm.clone(),
                call: ev.syscall.name().into(),
                role: a.role,
                path: path.to_string(),
                source: ev.source.clone().filter(|s| s != path),
                fstype: ev.fstype.clone(),
                duration_ns: ev.latency_ns,
                result: result_name(ev.ret),
                command: None,
            };
            let d = self.push(&mut inner, &a, entry, root, ev.uid);
            driver.get_or_insert(d);
        }
        driver
    }

    /// Records a file system tool's run in the timeline of the volume its
    /// device (or path) `device` belongs to; the timeline's driver.
    pub fn record_exec(&self, x: &ToolExec, a: &Attribution, device: &str, root: &Path) -> String {
        let entry = TimelineEntry {
            time: crate::cache::out_of_band::rfc3339(wall_time_of(x.start_ns)),
            start_ns: x.start_ns,
            pid: x.pid,
            tid: x.pid,
            comm: x.comm.clone(),
            call: "exec".into(),
            role: a.role,
            path: device.to_string(),
            source: None,
            fstype: None,
            duration_ns: x.duration_ns(),
            result: x.result(),
            command: Some(x.command_line()),
        };
        let mut inner = self.inner.locked();
        self.push(&mut inner, a, entry, root, x.uid)
    }

    /// Timelines a caller other than root may hold at most.
    fn share(&self) -> usize {
        (self.max_volumes / 4).max(1)
    }

    /// Makes room for a timeline made by a call of `uid`: past its share,
    /// its own least recently touched timeline goes; in a full store, the
    /// least recently touched of another caller's (root's last).
    fn make_room(&self, inner: &mut Inner, uid: u32) {
        let own = inner.rings.values().filter(|r| r.uid == uid).count();
        let victim = if uid != 0 && own >= self.share() {
            inner
                .rings
                .iter()
                .filter(|(_, r)| r.uid == uid)
                .min_by_key(|(_, r)| r.touched)
        } else if inner.rings.len() >= self.max_volumes {
            inner
                .rings
                .iter()
                .min_by_key(|(_, r)| (r.uid == 0, r.touched))
        } else {
            None
        };
        if let Some(k) = victim.map(|(k, _)| k.clone()) {
            inner.rings.remove(&k);
            inner.evicted += 1;
        }
    }

    /// Adds `entry`, a call of `uid`, to `a`'s timeline (made, making room
    /// if needed: see [`Self::make_room`]); the timeline's driver.
    fn push(
        &self,
        inner: &mut Inner,
        a: &Attribution,
        entry: TimelineEntry,
        root: &Path,
        uid: u32,
    ) -> String {
        inner.clock += 1;
        let clock = inner.clock;
        if !inner.rings.contains_key(&a.key) {
            self.make_room(inner, uid);
        }
        let ring = inner.rings.entry(a.key.clone()).or_insert_with(|| Ring {
            driver: a.driver.clone(),
            handle: None,
            entries: VecDeque::new(),
            dropped: 0,
            touched: 0,
            uid,
        });
        if ring.handle.is_none() && a.key.plugin == CSI_ESCAPED {
            if let Some((driver, handle)) = csi_vol_data(root, &a.key) {
                ring.driver = driver;
                ring.handle = Some(handle);
            }
        }
        ring.touched = clock;
        // In start order: a tool's run is reported at its exit, after
        // calls that started later may have been recorded.
        let at = ring
            .entries
            .iter()
            .rposition(|e| e.start_ns <= entry.start_ns)
            .map_or(0, |i| i + 1);
        ring.entries.insert(at, entry);
        if ring.entries.len() > self.per_volume {
            ring.entries.pop_front();
            ring.dropped += 1;
        }
        ring.driver.clone()
    }

    /// The timeline of one volume.
    pub fn for_volume(&self, key: &VolumeKey) -> Option<VolumeTimeline> {
        let inner = self.inner.locked();
        inner.rings.get(key).map(|r| timeline(key, r))
    }

    /// The timelines of a pod's volumes (by volume), then those of the
    /// staging paths of its CSI volumes.
    pub fn for_pod(&self, uid: &str) -> Vec<VolumeTimeline> {
        let inner = self.inner.locked();
        let mut own: Vec<VolumeTimeline> = inner
            .rings
            .iter()
            .filter(|(k, _)| k.pod_uid.as_deref() == Some(uid))
            .map(|(k, r)| timeline(k, r))
            .collect();
        own.sort_by(|a, b| a.key.cmp(&b.key));
        let mut staging = Vec::new();
        for (k, r) in inner
            .rings
            .iter()
            .filter(|(k, _)| k.pod_uid.as_deref() == Some(uid) && k.plugin == CSI_ESCAPED)
        {
            let mut keys = vec![
                node_key(CSI_DEVICES_DIR.into(), k.volume.clone()),
                node_key(format!("{CSI_DIR}/pv"), k.volume.clone()),
            ];
            if let Some(h) = &r.handle {
                keys.push(node_key(
                    format!("{CSI_DIR}/{}", r.driver),
                    sha256_hex(h.as_bytes()),
                ));
            }
            for sk in keys {
                if let Some(sr) = inner.rings.get(&sk) {
                    if !staging.iter().any(|t: &VolumeTimeline| t.key == sk) {
                        staging.push(timeline(&sk, sr));
                    }
                }
            }
        }
        own.extend(staging);
        own
    }

    /// Number of timelines kept, and of timelines evicted to make room.
    pub fn counts(&self) -> (usize, u64) {
        let inner = self.inner.locked();
        (inner.rings.len(), inner.evicted)
    }
}

fn timeline(key: &VolumeKey, r: &Ring) -> VolumeTimeline {
    VolumeTimeline {
        key: key.clone(),
        driver: r.driver.clone(),
        entries: r.entries.iter().cloned().collect(),
        dropped: r.dropped,
    }
}

/// Hex SHA-256 (the kubelet's name of a CSI volume's staging directory).
fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `driverName` and `volumeHandle` of a pod's CSI volume's `vol_data.json`.
fn csi_vol_data(root: &Path, key: &VolumeKey) -> Option<(String, String)> {
    let uid = key.pod_uid.as_deref()?;
    let file = root
        .join("pods")
        .join(uid)
        .join("volumes")
        .join(CSI_ESCAPED)
        .join(&key.volume)
        .join("vol_data.json");
    let text = std::fs::read(file).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let driver = v.get("driverName")?.as_str()?.to_string();
    let handle = v.get("volumeHandle")?.as_str()?.to_string();
    Some((driver, handle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::MountSyscall;

    type Attr = (Option<String>, String, String, String, PathRole);

    fn attr(p: &str) -> Option<Attr> {
        attribute(p, Path::new("/r"))
            .map(|a| (a.key.pod_uid, a.key.plugin, a.key.volume, a.driver, a.role))
    }

    fn s(x: &str) -> String {
        x.to_string()
    }

    #[test]
    fn paths_are_attributed_to_pod_volume_and_driver() {
        use PathRole::*;
        let csi = s("kubernetes.io/csi");
        let cases = [
            (
                "/r/pods/u1/volumes/kubernetes.io~csi/pv1/mount",
                Some((
                    Some(s("u1")),
                    s("kubernetes.io~csi"),
                    s("pv1"),
                    csi.clone(),
                    Target,
                )),
            ),
            (
                "/r/pods/u1/volumes/kubernetes.io~empty-dir/cache",
                Some((
                    Some(s("u1")),
                    s("kubernetes.io~empty-dir"),
                    s("cache"),
                    s("kubernetes.io/empty-dir"),
                    Target,
                )),
            ),
            (
                "/r//pods/./u1/volumeDevices/kubernetes.io~csi/pv2",
                Some((
                    Some(s("u1")),
                    s("kubernetes.io~csi"),
                    s("pv2"),
                    csi.clone(),
                    BlockMap,
                )),
            ),
            (
                "/r/pods/u1/volume-subpaths/data/app/0",
                Some((
                    Some(s("u1")),
                    s("volume-subpaths"),
                    s("data"),
                    s(""),
                    SubPath,
                )),
            ),
            (
                "/r/plugins/kubernetes.io/csi/hostpath.csi.k8s.io/abc123/globalmount",
                Some((
                    None,
                    s("plugins/kubernetes.io/csi/hostpath.csi.k8s.io"),
                    s("abc123"),
                    s("hostpath.csi.k8s.io"),
                    Staging,
                )),
            ),
            (
                "/r/plugins/kubernetes.io/csi/volumeDevices/staging/pv2",
                Some((
                    None,
                    s("plugins/kubernetes.io/csi/volumeDevices"),
                    s("pv2"),
                    csi.clone(),
                    Staging,
                )),
            ),
            (
                "/r/plugins/kubernetes.io/csi/volumeDevices/publish/pv2/u1",
                Some((
                    Some(s("u1")),
                    s("kubernetes.io~csi"),
                    s("pv2"),
                    csi.clone(),
                    BlockMap,
                )),
            ),
            (
                "/r/plugins/kubernetes.io/csi/volumeDevices/pv2/dev/u1",
                Some((
                    Some(s("u1")),
                    s("kubernetes.io~csi"),
                    s("pv2"),
                    csi.clone(),
                    BlockMap,
                )),
            ),
            (
                "/r/plugins/kubernetes.io/csi/volumeDevices/pv2/dev",
                Some((
                    None,
                    s("plugins/kubernetes.io/csi/volumeDevices"),
                    s("pv2"),
                    csi.clone(),
                    BlockMap,
                )),
            ),
            (
                "/r/plugins/kubernetes.io/csi/pv/pv3/globalmount",
                Some((
                    None,
                    s("plugins/kubernetes.io/csi/pv"),
                    s("pv3"),
                    csi.clone(),
                    Staging,
                )),
            ),
            (
                "/r/plugins/kubernetes.io/iscsi/mounts/portal-iqn-lun-0",
                Some((
                    None,
                    s("plugins/kubernetes.io/iscsi"),
                    s("mounts/portal-iqn-lun-0"),
                    s("kubernetes.io/iscsi"),
                    Staging,
                )),
            ),
        ];
        for (p, want) in cases {
            assert_eq!(attr(p), want, "{p}");
        }
        for p in [
            "/r",
            "/r/pods",
            "/r/pods/u1",
            "/r/pods/u1/volumes",
            "/r/pods/u1/volumes/kubernetes.io~csi",
            "/r/pods/u1/etc-hosts",
            "/r2/pods/u1/volumes/kubernetes.io~csi/pv1",
            "/mnt",
            "pods/u1/volumes/kubernetes.io~csi/pv1",
            "/r/pods/u1/volumes/../../u2/volumes/p/v",
            "/proc/self/fd/3",
            "",
        ] {
            assert_eq!(attr(p), None, "{p}");
        }
    }

    fn ev(target: &str, source: Option<&str>, ret: i64, boot_ns: u64) -> SyscallEvent {
        SyscallEvent {
            boot_ns,
            pid: 42,
            tid: 43,
            comm: "mount".into(),
            mnt_ns: 1,
            cgroup_id: 1,
            syscall: MountSyscall::Mount,
            flags: 0,
            fstype: Some("tmpfs".into()),
            source: source.map(Into::into),
            target: Some(target.into()),
            ret,
            latency_ns: 1_000,
            uid: 0,
        }
    }

    #[test]
    fn timelines_are_bounded_per_volume_and_in_number() {
        let root = Path::new("/r");
        let store = TimelineStore::new(3, 4);
        let vol = |i: usize| format!("/r/pods/u1/volumes/kubernetes.io~empty-dir/v{i}");
        for n in 0..10u64 {
            let d = store.record(&ev(&vol(0), None, 0, 10_000 + n), root);
            assert_eq!(d.as_deref(), Some("kubernetes.io/empty-dir"));
        }
        let key = attribute(&vol(0), root).unwrap().key;
        let t = store.for_volume(&key).unwrap();
        assert_eq!(t.entries.len(), 4);
        assert_eq!(t.dropped, 6);
        let starts: Vec<u64> = t.entries.iter().map(|e| e.start_ns).collect();
        assert_eq!(
            starts,
            vec![9_006, 9_007, 9_008, 9_009],
            "the newest, in order"
        );
        // Three more volumes: the least recently touched (v0) goes.
        for i in 1..=3 {
            store.record(&ev(&vol(i), None, -16, 20_000), root);
        }
        assert_eq!(store.counts(), (3, 1));
        assert!(store.for_volume(&key).is_none());
        let t = store.for_pod("u1");
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].entries[0].result, "EBUSY");
        assert!(store.record(&ev("/mnt/x", None, 0, 1), root).is_none());
    }

    /// A caller other than root (a successful call in the host's mount
    /// namespace, by a uid with CAP_SYS_ADMIN) on 5,000 invented pod
    /// paths: root's timeline stays, the caller holds at most its share.
    /// Before: the store's least recently touched timeline made room, so
    /// 2,048 invented paths evicted every real one.
    #[test]
    fn a_caller_other_than_root_holds_only_its_share_of_timelines() {
        let root = Path::new("/r");
        let store = TimelineStore::default();
        let real = "/r/pods/u1/volumes/kubernetes.io~empty-dir/data";
        store.record(&ev(real, None, 0, 1_000), root);
        for i in 0..5_000u64 {
            let mut e = ev(
                &format!("/r/pods/fake-{i}/volumes/x~y/v"),
                None,
                0,
                2_000 + i,
            );
            e.uid = 65534;
            store.record(&e, root);
        }
        let key = attribute(real, root).unwrap().key;
        assert!(store.for_volume(&key).is_some(), "root's timeline evicted");
        let (volumes, _) = store.counts();
        assert_eq!(volumes, 1 + DEFAULT_MAX_VOLUMES / 4);
        // Root's calls evict the other caller's timelines first.
        for i in 0..DEFAULT_MAX_VOLUMES as u64 - 1 {
            store.record(
                &ev(&format!("/r/pods/p{i}/volumes/x~y/v"), None, 0, 9_000 + i),
                root,
            );
        }
        assert_eq!(store.counts().0, DEFAULT_MAX_VOLUMES);
        assert!(store.for_volume(&key).is_some(), "root's timeline evicted");
        assert!(store.for_pod("fake-4999").is_empty(), "all of them went");
    }

    #[test]
    fn a_tool_run_reported_after_the_mount_is_placed_before_it() {
        let root = Path::new("/r");
        let store = TimelineStore::default();
        let st = "/r/plugins/kubernetes.io/csi/d.example/abc/globalmount";
        store.record(&ev(st, Some("/dev/loop0"), 0, 90_000), root);
        let a = attribute(st, root).unwrap();
        let mkfs = ToolExec {
            start_ns: 10_000,
            end_ns: 60_000,
            pid: 9,
            comm: "mkfs.ext4".into(),
            mnt_ns: 1,
            cgroup_id: 1,
            args: vec!["mkfs.ext4".into(), "/dev/loop0".into()],
            args_truncated: false,
            exit_code: 0,
            uid: 0,
        };
        let d = store.record_exec(&mkfs, &a, "/dev/loop0", root);
        assert_eq!(d, "d.example");
        let t = store.for_volume(&a.key).unwrap();
        let calls: Vec<&str> = t.entries.iter().map(|e| e.call.as_str()).collect();
        assert_eq!(calls, vec!["exec", "mount"]);
        let e = &t.entries[0];
        assert_eq!((e.pid, e.tid, e.comm.as_str()), (9, 9, "mkfs.ext4"));
        assert_eq!(e.path, "/dev/loop0");
        assert_eq!(e.duration_ns, 50_000);
        assert_eq!(e.result, "ok");
        assert_eq!(e.role, PathRole::Staging);
        assert_eq!(e.command.as_deref(), Some("mkfs.ext4 /dev/loop0"));
    }

    #[test]
    fn a_bind_from_staging_lands_in_both_timelines_and_the_pod_sees_its_staging() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let vol_dir = root.join("pods/u1/volumes/kubernetes.io~csi/pv1");
        std::fs::create_dir_all(&vol_dir).unwrap();
        std::fs::write(
            vol_dir.join("vol_data.json"),
            r#"{"driverName":"hostpath.csi.k8s.io","volumeHandle":"h1","specVolID":"pv1"}"#,
        )
        .unwrap();
        let hash = sha256_hex(b"h1");
        let staging = root.join(format!(
            "plugins/kubernetes.io/csi/hostpath.csi.k8s.io/{hash}/globalmount"
        ));
        let target = vol_dir.join("mount");
        let store = TimelineStore::default();
        let st = staging.to_str().unwrap();
        let d = store.record(&ev(st, Some("/dev/loop0"), 0, 5_000), root);
        assert_eq!(d.as_deref(), Some("hostpath.csi.k8s.io"));
        let d = store.record(&ev(target.to_str().unwrap(), Some(st), 0, 9_000), root);
        assert_eq!(
            d.as_deref(),
            Some("hostpath.csi.k8s.io"),
            "from vol_data.json"
        );
        let t = store.for_pod("u1");
        assert_eq!(t.len(), 2, "{t:#?}");
        assert_eq!(t[0].key.volume, "pv1");
        assert_eq!(t[0].entries[0].role, PathRole::Target);
        assert_eq!(t[1].key.volume, hash);
        assert_eq!(t[1].entries.len(), 2, "the stage and the bind from it");
        assert_eq!(t[1].entries[1].role, PathRole::Staging);
    }
}
