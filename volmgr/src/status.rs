//! The status document (`volmgr status --json`): its schema is a user
//! interface (docs/USAGE.md, "Status"): fields may be added, never renamed.

use serde::{Deserialize, Serialize};

use crate::metrics::LatencySummary;

/// The whole status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// Reconstruction done, sources populated, one full reconcile since; in
    /// observe mode: the last scan judged the node's pods as the sources
    /// delivered them ([`ObserveStatus::synced`]).
    pub synced: bool,
    /// Which tracer keeps the actual state current: `ebpf`, `mountinfo` or `off`.
    pub tracer: String,
    /// Why that tracer (e.g. why eBPF was not used).
    #[serde(default)]
    pub tracer_reason: String,
    /// Pods, sorted by namespace, name and UID.
    pub pods: Vec<PodStatus>,
    /// Inputs that did not even yield a pod.
    pub errors: Vec<SourceError>,
    /// Operation latencies (p50/p99 from hdrhistogram).
    #[serde(default)]
    pub operations: Vec<LatencySummary>,
    /// Latency of the mount-table syscalls the eBPF tracer saw, per
    /// (syscall, fstype, result); empty with any other tracer.
    #[serde(default)]
    pub syscalls: Vec<SyscallLatency>,
    /// Counters of the active tracer.
    #[serde(default)]
    pub tracer_stats: TracerStats,
    /// The most recent out-of-band changes to managed volumes (oldest first,
    /// at most 64): what happened, who did it when the tracer knows, and how
    /// long the repair took.
    #[serde(default)]
    pub out_of_band: Vec<OutOfBandEvent>,
    /// Registered CSI drivers (`--csi-driver` and plugin registration), by name.
    #[serde(default)]
    pub csi_drivers: Vec<CsiDriverStatus>,
    /// ROOT's mount propagation: `rshared` (made so at start), `shared`
    /// (its mount already was), `off` (not asked), or `not shared: <why>`.
    #[serde(default)]
    pub root_propagation: String,
    /// How paths under ROOT are opened: `openat2` (RESOLVE_BENEATH), or
    /// `openat walk` where the kernel lacks `openat2` (before 5.6, or a
    /// seccomp profile); empty before the first open.
    #[serde(default)]
    pub path_resolution: String,
    /// Volumes' devices on the node (CSI staging, a block volume's global
    /// map), by volume name: those in use by pods, and those no pod uses
    /// any more that are not unmounted yet (a failing NodeUnstageVolume).
    #[serde(default)]
    pub devices: Vec<DeviceStatus>,
    /// Traced calls (mount family, `statfs`) blocked longer than
    /// `--stuck-syscall-after` right now, oldest first (eBPF tracer only).
    #[serde(default)]
    pub stuck_syscalls: Vec<StuckSyscall>,
    /// File system tools (`mkfs*`, `fsck*`, `e2fsck`, `resize2fs`,
    /// `xfs_growfs`, `xfs_repair`) running longer than `--stuck-tool-after`
    /// right now, oldest first (eBPF tracer only).
    #[serde(default)]
    pub stuck_tools: Vec<StuckToolRun>,
    /// Observe mode (`volmgr agent --observe`): its sandbox and findings;
    /// absent when the agent manages volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe: Option<ObserveStatus>,
}

/// The observing agent: how it is confined, and what it found.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObserveStatus {
    /// `enforced (ABI vN)` or `unavailable: <why>`.
    pub landlock: String,
    /// The capabilities kept (the rest were dropped), or why not dropped.
    pub capabilities: String,
    /// Scans done so far.
    pub scans: u64,
    /// When the last scan ended (RFC 3339), empty before the first.
    #[serde(default)]
    pub last_scan: String,
    /// Why the last scan failed, if it did.
    #[serde(default)]
    pub scan_error: Option<String>,
    /// The result of the test-only write probe under ROOT (failpoint
    /// `observe-write-probe`): the error the kernel answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_probe: Option<String>,
    /// What needs a person, by kind, pod and path: at most
    /// `observer::MAX_FINDINGS_PER_KIND` of each kind.
    pub findings: Vec<Finding>,
    /// How many more findings of each kind (`orphaned_pod_dir`, ...) the
    /// last scan found over that bound: counted, not listed.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub findings_not_listed: std::collections::BTreeMap<String, usize>,
    /// Whether the last scan judged the whole node: the pod sources had
    /// delivered the node's pods (and the objects they read) once before
    /// it. Status's `synced` in observe mode.
    #[serde(default)]
    pub synced: bool,
    /// What the last scan saw of each volume of the pods on the node (the
    /// kubelet's state, not a manager's): shown as the pods' volumes.
    #[serde(default)]
    pub volumes: Vec<ObservedVolume>,
}

/// Observe mode: one volume of a pod on the node as the last scan saw it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObservedVolume {
    /// The pod's UID.
    pub pod_uid: String,
    /// The volume's name in the pod.
    pub volume: String,
    /// `mounted` (set up by the kubelet), `not_mounted` (not set up yet,
    /// for less than `--stuck-after`, or a pod that ended), or `stuck` (a
    /// `volume_stuck` or `recorded_not_mounted` finding).
    pub state: String,
    /// Where the kubelet set it up, when it did.
    #[serde(default)]
    pub path: Option<String>,
    /// Since when it is seen not mounted (RFC 3339).
    #[serde(default)]
    pub since: Option<String>,
    /// A stuck volume's finding, in one line.
    #[serde(default)]
    pub error: Option<String>,
}

/// One problem found on the node, with what a person needs to act on it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Finding {
    /// Its kind (see [`FindingKind`]).
    pub kind: FindingKind,
    /// The pod's UID, when it concerns one.
    #[serde(default)]
    pub pod_uid: Option<String>,
    /// `namespace/name` of the pod, when it is on the node.
    #[serde(default)]
    pub pod: Option<String>,
    /// The volume: its unique name or its name in the pod.
    #[serde(default)]
    pub volume: Option<String>,
    /// The path concerned (directory, mount point, device).
    pub path: String,
    /// One line saying what is wrong.
    pub summary: String,
    /// The facts behind it (mount table lines, files found, errors).
    pub evidence: Vec<String>,
    /// Since when it is seen (RFC 3339), for findings that need time.
    #[serde(default)]
    pub since: Option<String>,
    /// The last mount-family syscalls seen on its paths (from the tracer,
    /// when one records them).
    #[serde(default)]
    pub recent_syscalls: Vec<RecentSyscall>,
    /// The pod's recent events, newest first ([`FindingKind::VolumeStuck`],
    /// when the API server gives them).
    #[serde(default)]
    pub events: Vec<RecentEvent>,
}

/// An event recorded on a finding's pod, as the API server keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecentEvent {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Its reason (`FailedMount`, `FailedAttachVolume`, ...).
    pub reason: String,
    /// Its message.
    pub message: String,
    /// How many times it was seen.
    pub count: u32,
    /// When it was last seen (RFC 3339).
    pub last_time: String,
    /// Who reported it (`kubelet`, `attachdetach-controller`, ...).
    #[serde(default)]
    pub source: String,
    /// The node it came from (`reportingInstance`, else `source.host`;
    /// empty when the event names none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
}

/// A syscall seen on a path (the tracer's record).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecentSyscall {
    /// When it started (RFC 3339).
    pub time: String,
    /// The process (`comm[pid]`).
    pub process: String,
    /// The call (`mount`, `umount2`, `fsmount`, ...).
    pub call: String,
    /// How long it took, in microseconds (still blocked: so far).
    pub duration_us: u64,
    /// Its result: `ok` or the errno name.
    pub result: String,
}

/// The kinds of [`Finding`] (status, `volmgr doctor`, `volmgr_findings{kind}`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// (a) A pod directory (and its volume directories) of a pod no longer
    /// on the node, nothing mounted in it.
    OrphanedPodDir,
    /// (b) A volume still mounted for a pod no longer on the node.
    MountedForDeletedPod,
    /// (c) A device mount (CSI staging, block global map) no pod uses.
    UnusedDeviceMount,
    /// (d) A volume a pod has needed for longer than `--stuck-after` and
    /// that is not mounted.
    VolumeStuck,
    /// (e) A mount the kubelet recorded (`vol_data.json`, state files)
    /// that is not in the mount table.
    RecordedNotMounted,
    /// (f) The same target mounted more than once.
    MountedMoreThanOnce,
    /// (g) A loop device whose backing file is deleted.
    LoopBackingDeleted,
    /// (h) A network or FUSE mount under the kubelet's root that no longer
    /// answers (a time-limited `statx` does not return, or returns
    /// `ENOTCONN`).
    MountUnreachable,
    /// (i) A deleted pod's volume still mounted after `--stuck-after`
    /// because something holds it (processes, other mount namespaces,
    /// device holders).
    TeardownBlocked,
    /// (j) A process walking a volume to change its owner, mode or SELinux
    /// label (`fsGroup`, relabel) while its pod waits.
    OwnershipWalk,
    /// (k) A CSI driver a pod on the node needs that is not registered or
    /// does not answer (registration socket, `GetInfo`, `Probe`, CSINode).
    CsiDriverNotReady,
    /// (l) The kubelet says one thing of a volume (its events, its
    /// records) and the node shows another.
    KubeletDisagrees,
}

impl FindingKind {
    /// Every kind, in report order.
    pub const ALL: [FindingKind; 12] = [
        Self::OrphanedPodDir,
        Self::MountedForDeletedPod,
        Self::UnusedDeviceMount,
        Self::VolumeStuck,
        Self::RecordedNotMounted,
        Self::MountedMoreThanOnce,
        Self::LoopBackingDeleted,
        Self::MountUnreachable,
        Self::TeardownBlocked,
        Self::OwnershipWalk,
        Self::CsiDriverNotReady,
        Self::KubeletDisagrees,
    ];

    /// The name in JSON and in the `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OrphanedPodDir => "orphaned_pod_dir",
            Self::MountedForDeletedPod => "mounted_for_deleted_pod",
            Self::UnusedDeviceMount => "unused_device_mount",
            Self::VolumeStuck => "volume_stuck",
            Self::RecordedNotMounted => "recorded_not_mounted",
            Self::MountedMoreThanOnce => "mounted_more_than_once",
            Self::LoopBackingDeleted => "loop_backing_deleted",
            Self::MountUnreachable => "mount_unreachable",
            Self::TeardownBlocked => "teardown_blocked",
            Self::OwnershipWalk => "ownership_walk",
            Self::CsiDriverNotReady => "csi_driver_not_ready",
            Self::KubeletDisagrees => "kubelet_disagrees",
        }
    }

    /// The reason of the event recorded on the pod.
    pub fn event_reason(self) -> &'static str {
        match self {
            Self::OrphanedPodDir => "VolumeOrphaned",
            Self::MountedForDeletedPod => "VolumeOrphanedMounted",
            Self::UnusedDeviceMount => "VolumeDeviceLeaked",
            Self::VolumeStuck => "VolumeStuck",
            Self::RecordedNotMounted => "VolumeNotMounted",
            Self::MountedMoreThanOnce => "VolumeMountedTwice",
            Self::LoopBackingDeleted => "LoopDeviceDeleted",
            Self::MountUnreachable => "VolumeMountUnreachable",
            Self::TeardownBlocked => "VolumeTeardownBlocked",
            Self::OwnershipWalk => "VolumeOwnershipWalk",
            Self::CsiDriverNotReady => "CSIDriverNotReady",
            Self::KubeletDisagrees => "KubeletDisagrees",
        }
    }

    /// What a person should do about it.
    pub fn action(self) -> &'static str {
        match self {
            Self::OrphanedPodDir => "nothing is mounted in it: check the evidence, then remove the directory (the kubelet's orphan cleanup stopped on it)",
            Self::MountedForDeletedPod => "unmount the path (umount, or NodeUnpublishVolume through the driver), then the kubelet removes the pod directory",
            Self::UnusedDeviceMount => "no pod uses it: NodeUnstageVolume through the driver (or umount the path), then the volume can detach",
            Self::VolumeStuck => "look at the pod's events, the driver's logs and the syscalls shown; the kubelet retries on its own once the cause is gone",
            Self::RecordedNotMounted => "the mount went away behind the kubelet: restart the pod (or the kubelet, which reconstructs and mounts again)",
            Self::MountedMoreThanOnce => "unmount the extra mounts on the path down to one (umount once per extra)",
            Self::LoopBackingDeleted => "the file behind the loop device was deleted while in use: unmount what uses the device, then detach it (losetup -d)",
            Self::MountUnreachable => "the server or FUSE daemon behind the mount does not answer: bring it back (or restart the CSI node plugin), or unmount it lazily (umount -l) and delete the pods using it",
            Self::TeardownBlocked => "something still holds the volume: end the processes named (or leave their cwd), unmount it in the other mount namespaces named, or release the device's holders; the kubelet then unmounts on its own",
            Self::OwnershipWalk => "the kubelet is changing every file's owner or label: wait for the time left, or set fsGroupChangePolicy: OnRootMismatch (and an SELinux mount context) so it is not done at every mount",
            Self::CsiDriverNotReady => "the driver's node plugin is not registered or does not answer (the evidence names the first check that fails): check its DaemonSet pod on this node (node-driver-registrar and the driver containers) and their logs",
            Self::KubeletDisagrees => "the kubelet's view and the node differ: restart the kubelet so it reconstructs its state from the node, or fix the side the evidence shows wrong",
        }
    }
}

/// A traced call still blocked in the kernel after the threshold.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StuckSyscall {
    /// Process id.
    pub pid: u32,
    /// Thread id (the blocked task).
    pub tid: u32,
    /// The thread's command name.
    pub comm: String,
    /// `mount`, `umount2`, `statfs`, ...
    pub call: String,
    /// The path argument (read from the caller's memory; empty if none or
    /// unreadable).
    pub path: String,
    /// File system type of the mount the path is on, in the caller's
    /// mount namespace (empty if unknown).
    pub fstype: String,
    /// When the call started (RFC 3339).
    pub since: String,
    /// How long it has been blocked, seconds.
    pub elapsed_seconds: f64,
    /// The pod whose volume path it is, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The volume (directory name under the pod's or plugin's directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// The task's kernel stack (`/proc/<pid>/task/<tid>/stack`), innermost
    /// first; empty when the kernel does not show it.
    #[serde(default)]
    pub kernel_stack: Vec<String>,
}

/// A file system tool still running after the threshold: an `e2fsck` or
/// `mkfs` exec'd by a driver that hangs holds its volume's stage or mount.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StuckToolRun {
    /// Process id.
    pub pid: u32,
    /// The command name (`e2fsck`, `mkfs.ext4`, ...).
    pub comm: String,
    /// The command line as exec'd (`... ` first when it was longer than
    /// the kernel program keeps).
    pub command_line: String,
    /// The device or path it works on (its last absolute path argument).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The process's state letter from `/proc/<pid>/stat` (`D`: waiting
    /// in the kernel, uninterruptible; `S`: sleeping; `R`: running).
    pub state: String,
    /// When it was exec'd (RFC 3339).
    pub since: String,
    /// How long it has been running, seconds.
    pub elapsed_seconds: f64,
    /// The pod whose volume path it works on, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The volume (directory name under the pod's or plugin's directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// The main thread's kernel stack (`/proc/<pid>/stack`), innermost
    /// first; empty when the kernel does not show it.
    #[serde(default)]
    pub kernel_stack: Vec<String>,
}

/// A volume's device mount (the kubelet's device mount: CSI
/// NodeStageVolume's staging path or a block volume's global map).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceStatus {
    /// The volume's unique name.
    pub volume: String,
    /// The plugin.
    pub plugin: String,
    /// `mounted`, `uncertain` (may or may not be mounted: mounted again
    /// before a pod uses it), or `unmounting` (no pod wants the volume any
    /// more; it stays until its unmount succeeds).
    pub state: String,
    /// Where it is (or may be) mounted, when known.
    pub path: Option<String>,
    /// How many pods have the volume set up.
    pub pods: u32,
    /// The device's current (or last) operation: `mount_device`,
    /// `unmount_device` or `volume_fs_resize`.
    pub operation: Option<String>,
    /// Attempts of that operation.
    pub attempts: u32,
    /// Its last error.
    pub error: Option<String>,
}

/// One registered CSI driver.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CsiDriverStatus {
    /// The driver name.
    pub name: String,
    /// Its CSI socket.
    pub endpoint: String,
    /// The CSI versions it announced at registration (empty for `--csi-driver`).
    pub versions: Vec<String>,
    /// Its `NodeGetInfo` node ID (absent for `--csi-driver`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// Its `NodeGetInfo` limit of volumes on this node (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_volumes_per_node: Option<i64>,
}

/// Latency of one (syscall, fstype, result), from the eBPF tracer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SyscallLatency {
    /// `mount`, `umount2`, `fsopen`, ...
    pub syscall: String,
    /// File system type, empty when the call has none.
    pub fstype: String,
    /// `ok` or `error`.
    pub result: String,
    /// Calls seen.
    pub count: u64,
    /// Median latency, seconds.
    pub p50_seconds: f64,
    /// 90th percentile, seconds.
    pub p90_seconds: f64,
    /// 99th percentile, seconds.
    pub p99_seconds: f64,
    /// 99.9th percentile, seconds.
    pub p999_seconds: f64,
    /// Slowest call, seconds.
    pub max_seconds: f64,
}

/// Counters of the active tracer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TracerStats {
    /// Mount-table changes the tracer reported (eBPF: syscalls of this mount
    /// namespace; mountinfo: changed mount points).
    pub events: u64,
    /// Of these, changes made by other processes that touched (or may have
    /// touched) a managed path, each followed by a check of the mount table.
    pub out_of_band_events: u64,
    /// Targeted checks of the mount table made.
    pub checks: u64,
    /// Events the kernel could not hand over (ring buffer full).
    pub events_lost: u64,
}

/// One out-of-band change to a managed volume.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutOfBandEvent {
    /// When it was found (RFC 3339, UTC).
    pub time: String,
    /// `lost` (the volume was unmounted behind the manager's back) or
    /// `foreign_mount` (something was mounted on the volume's path).
    pub kind: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// The volume's name in the pod.
    pub volume: String,
    /// The volume's path.
    pub path: String,
    /// What found it: `ebpf`, `mountinfo` or `resync`.
    pub detected_by: String,
    /// The syscall and process behind it, when the eBPF tracer saw it
    /// (e.g. `umount2("/var/lib/...") by umount[4242]`).
    pub cause: Option<String>,
    /// From the syscall's return (eBPF) to the check that confirmed it, in
    /// microseconds, when known.
    pub detected_after_us: Option<u64>,
    /// `repairing`, `repaired` or `failed: <error>`.
    pub outcome: String,
    /// From detection to the volume being set up again, in milliseconds.
    pub repaired_after_ms: Option<f64>,
}

/// One pod.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PodStatus {
    /// UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Set when the pod was rejected as a whole, or when volumes it had
    /// resolved no longer resolve (they keep their desired state).
    pub error: Option<String>,
    /// Its volumes.
    pub volumes: Vec<VolumeStatus>,
}

/// One volume of a pod.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeStatus {
    /// The volume's name in the pod.
    pub name: String,
    /// The plugin (empty if none supports it).
    pub plugin: String,
    /// `pending`, `mounted`, `uncertain`, `unmounting` or `error`; in
    /// observe mode the kubelet's as observed ([`ObservedVolume::state`]:
    /// `mounted`, `not_mounted`, `stuck`), or `unknown` before a scan saw it.
    pub state: String,
    /// Where it is set up, once known.
    pub path: Option<String>,
    /// Attempts of the current (or last) operation.
    pub attempts: u32,
    /// The last error.
    pub error: Option<String>,
    /// For a volume that does not resolve (or no longer does), what its
    /// error means to `WaitForAttachAndMount`: `pod_error` (the kubelet's
    /// pod error: the wait ends at once, "failed to process"), `waiting`
    /// (something it needs is not there yet: a Secret, a ConfigMap, its
    /// VolumeAttachment; the wait goes on) or `attach_limit` (the node's
    /// attach limit: the pod is rejected when the wait times out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unresolved: Option<String>,
    /// How many times this volume was found changed behind the manager's
    /// back (unmounted, or something mounted over it).
    #[serde(default)]
    pub out_of_band_changes: u32,
    /// When that last happened (RFC 3339, UTC).
    #[serde(default)]
    pub last_out_of_band: Option<String>,
    /// Usage and health from the last collection (`--volume-stats-period`),
    /// for mounted volumes whose plugin reports them.
    #[serde(default)]
    pub stats: Option<VolumeStatsStatus>,
    /// For configMap, secret, downwardAPI and projected volumes set up: the
    /// content generation and when it was last written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<ContentStatus>,
    /// The containers' subPath bind mounts of the volume (once it is
    /// mounted), which the container runtime binds.
    #[serde(default)]
    pub sub_paths: Vec<SubPathStatus>,
    /// Set up read-only (the pod's `readOnly`, a read-only CSI or local PV,
    /// configMap/secret/downwardAPI/projected volumes).
    #[serde(default)]
    pub read_only: bool,
    /// Whether the container runtime may relabel it for SELinux (the
    /// kubelet's `GetAttributes().SELinuxRelabel`), once it is set up.
    #[serde(default)]
    pub selinux_relabel: bool,
    /// Observe mode: since when the kubelet has not set it up (RFC 3339),
    /// for a volume `not_mounted` or `stuck`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

impl VolumeStatus {
    /// A volume known by its name in the pod, its plugin and its state
    /// only: no path, attempts, error, statistics or subPaths yet.
    pub fn new(name: String, plugin: String, state: &str) -> Self {
        Self {
            name,
            plugin,
            state: state.to_string(),
            path: None,
            attempts: 0,
            error: None,
            unresolved: None,
            out_of_band_changes: 0,
            last_out_of_band: None,
            stats: None,
            content: None,
            sub_paths: Vec::new(),
            read_only: false,
            selinux_relabel: false,
            since: None,
        }
    }
}

/// The content of a configMap, secret, downwardAPI or projected volume.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContentStatus {
    /// The payload's content digest (changes with every new payload).
    pub generation: String,
    /// How many payloads were written (the first set-up included).
    pub writes: u64,
    /// When the last one was (RFC 3339, UTC).
    pub last_update: String,
}

/// A container's subPath bind mount of a volume.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SubPathStatus {
    /// The container.
    pub container: String,
    /// The index of the `volumeMount` in the container's `volumeMounts`.
    pub index: usize,
    /// The path inside the volume.
    pub sub_path: String,
    /// The bind mount, `ROOT/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`.
    pub path: String,
}

/// A volume's usage and health, as last collected (the kubelet's volume
/// stats: statfs for emptyDir and hostPath, NodeGetVolumeStats for CSI).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeStatsStatus {
    /// Size of the file system, bytes.
    pub capacity_bytes: u64,
    /// Bytes available.
    pub available_bytes: u64,
    /// Bytes used.
    pub used_bytes: u64,
    /// Inodes of the file system.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
    /// Inodes used.
    pub inodes_used: u64,
    /// The driver reports the volume abnormal (CSI `VOLUME_CONDITION`).
    pub abnormal: bool,
    /// The driver's condition message, when it reports one.
    pub message: Option<String>,
    /// When the values were read (RFC 3339, UTC); none yet if every
    /// collection failed.
    pub collected_at: Option<String>,
    /// The last collection failed: the values are older than the period.
    pub stale: bool,
    /// Why the last collection failed.
    pub error: Option<String>,
}

/// An input that did not yield a pod.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SourceError {
    /// The source (a manifest file path, `api`, ...).
    pub source: String,
    /// What was wrong.
    pub error: String,
}
