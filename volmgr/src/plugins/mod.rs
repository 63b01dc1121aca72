//! Volume plugins (the kubelet's `VolumePlugin`, `Mounter` and `Unmounter` in
//! one trait) and the [`VolumePluginMgr`] that picks one for a volume.

pub mod atomic_writer;
pub mod config_volumes;
pub mod csi;
pub mod empty_dir;
pub mod foreign;
pub mod host_path;
pub mod image;
pub mod local;
pub mod nfs;
pub mod subpath;
pub mod token;
pub mod volume_metrics;
pub mod volume_ownership;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::sys::mount_table::{MountTable, MountTableView};
use crate::sys::root_dir::PathError;
use crate::sys::SyscallError;
use crate::util::sync::RwLockExt;
use crate::volume::{PodUid, UniqueVolumeName, VolumeSource, VolumeSpec};

/// Why a plugin operation failed.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The volume spec cannot work (e.g. a hostPath type check failed).
    #[error("{0}")]
    InvalidSpec(String),
    /// A path under ROOT could not be used.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A system call failed.
    #[error(transparent)]
    Syscall(#[from] SyscallError),
    /// A container's subPath could not be set up.
    #[error(transparent)]
    SubPath(#[from] subpath::SubPathError),
    /// A plugin implemented outside Rust (C ABI) reported an error.
    #[error("plugin {plugin}: {message}")]
    Plugin {
        /// The plugin's name.
        plugin: String,
        /// Its message.
        message: String,
    },
    /// The operation may or may not have taken effect (a timeout, a crash of
    /// the plugin mid-call): the volume is *uncertain* and must be retried.
    #[error("outcome uncertain: {0}")]
    Uncertain(String),
    /// The operation task itself failed (a panic in a plugin).
    #[error("internal error: {0}")]
    Internal(String),
    /// Something the operation needs is not there yet (a CSI driver that has
    /// not registered): retried with backoff, and at once when it appears.
    #[error("{0}")]
    Waiting(String),
    /// Set-up found the device not mounted (CSI: publish answered
    /// `FAILED_PRECONDITION`): the device is mounted again first.
    #[error("device not mounted: {0}")]
    NeedsDeviceMount(String),
    /// Growing the volume to the size asked for cannot work on this node
    /// (CSI NodeExpandVolume answered `FAILED_PRECONDITION`,
    /// `INVALID_ARGUMENT`, `OUT_OF_RANGE` or `NOT_FOUND`: the kubelet's
    /// in-use expansion error and `InfeasibleError`): the volume stays
    /// mounted and is not grown to that size again; a new size is tried.
    /// Every other failure of every operation is retried with backoff.
    #[error("{0}")]
    ExpansionInfeasible(String),
    /// The mount table could not be read or parsed.
    #[error("reading the mount table: {0}")]
    MountTable(#[from] crate::sys::mountinfo::MountInfoError),
    /// The task running an operation's blocking work failed (panicked or
    /// was cancelled).
    #[error("operation task failed: {0}")]
    TaskFailed(#[from] tokio::task::JoinError),
    /// A CSI volume not yet in use on the node was refused: its driver's
    /// `max_volumes_per_node` volumes are in use (retried with backoff).
    #[error(transparent)]
    VolumeLimit(#[from] csi::limits::VolumeLimitError),
    /// A record the manager keeps beside a volume could not be encoded.
    #[error("encoding a volume record: {0}")]
    Encode(#[source] serde_json::Error),
    /// A resize would make the volume smaller than what it holds.
    #[error("cannot resize {} to {requested} bytes: {used} bytes are in use", path.display())]
    BelowUsage {
        /// The volume's path.
        path: PathBuf,
        /// The size asked for, in bytes.
        requested: u64,
        /// What the volume holds now, in bytes.
        used: u64,
    },
}

impl VolumeError {
    /// Whether the operation may have taken effect despite the error.
    pub fn is_uncertain(&self) -> bool {
        matches!(self, VolumeError::Uncertain(_))
    }

    /// Whether the operation waits for something to appear.
    pub fn is_waiting(&self) -> bool {
        matches!(self, VolumeError::Waiting(_))
    }

    /// Whether an expansion cannot reach the size asked for (see
    /// [`VolumeError::ExpansionInfeasible`]).
    pub fn is_expansion_infeasible(&self) -> bool {
        matches!(self, VolumeError::ExpansionInfeasible(_))
    }
}

/// What `set_up` needs (the kubelet's `MounterArgs` plus the spec).
#[derive(Debug, Clone)]
pub struct MountRequest {
    /// The pod.
    pub pod_uid: PodUid,
    /// The volume's unique name.
    pub volume_name: UniqueVolumeName,
    /// The volume.
    pub spec: Arc<VolumeSpec>,
    /// `fsGroup` to give the volume's root.
    pub fs_group: Option<i64>,
    /// `fsGroupChangePolicy`: whether a matching root skips the walk.
    pub fs_group_change_policy: crate::volume::FsGroupChangePolicy,
    /// SELinux label the pod runs with.
    pub selinux_label: Option<Arc<str>>,
}

/// What `tear_down` needs.
#[derive(Debug, Clone)]
pub struct UnmountRequest {
    /// The pod.
    pub pod_uid: PodUid,
    /// The volume's unique name.
    pub volume_name: UniqueVolumeName,
    /// The volume (possibly reconstructed, so possibly partial).
    pub spec: Arc<VolumeSpec>,
    /// Where it was set up.
    pub path: PathBuf,
}

/// A volume found on disk at start-up.
#[derive(Debug, Clone)]
pub struct ReconstructedVolume {
    /// The spec, as far as the disk tells.
    pub spec: VolumeSpec,
    /// Where it is.
    pub path: PathBuf,
    /// Whether set-up had completed *and* the mount table confirms it
    /// (the volume's mount, with the expected source, is there): otherwise
    /// the mount is uncertain and set up again. A record on disk is only a
    /// claim: a reboot keeps the files, not the mounts.
    pub complete: bool,
}

impl ReconstructedVolume {
    /// A volume found at `path` under its name in the pod, with the source
    /// the disk tells; `complete` as for [`ReconstructedVolume::complete`].
    pub fn named(volume: &str, source: VolumeSource, path: PathBuf, complete: bool) -> Self {
        Self {
            spec: VolumeSpec {
                name: volume.to_string(),
                source,
            },
            path,
            complete,
        }
    }
}

/// What `mount_device` needs (the kubelet's `MountDevice` arguments).
#[derive(Debug, Clone)]
pub struct DeviceMountRequest {
    /// The volume's unique name.
    pub volume_name: UniqueVolumeName,
    /// The volume (the spec of one of the pods that want it).
    pub spec: Arc<VolumeSpec>,
    /// That pod's `fsGroup` (the kubelet's `DeviceMounterArgs.FsGroup`):
    /// CSI drivers with `VOLUME_MOUNT_GROUP` get it at NodeStageVolume.
    pub fs_group: Option<i64>,
}

/// What `unmount_device` needs.
#[derive(Debug, Clone)]
pub struct DeviceUnmountRequest {
    /// The volume's unique name.
    pub volume_name: UniqueVolumeName,
    /// The spec it was mounted with (possibly reconstructed, so partial).
    pub spec: Arc<VolumeSpec>,
    /// Where it is mounted, when known.
    pub device_mount_path: Option<PathBuf>,
}

/// What `node_expand` needs.
#[derive(Debug, Clone)]
pub struct NodeExpandRequest {
    /// The volume's unique name.
    pub volume_name: UniqueVolumeName,
    /// The desired spec (with the new size).
    pub spec: Arc<VolumeSpec>,
    /// The size wanted, in bytes.
    pub new_size: u64,
    /// A path the volume is published at (one pod's).
    pub volume_path: PathBuf,
    /// Its device mount path, when it has one.
    pub device_mount_path: Option<PathBuf>,
}

/// A device mount found at start-up.
#[derive(Debug, Clone)]
pub struct ReconstructedDevice {
    /// The volume's unique name.
    pub volume_name: UniqueVolumeName,
    /// The spec, as far as the disk tells.
    pub spec: VolumeSpec,
    /// Where it is mounted.
    pub device_mount_path: PathBuf,
    /// Whether the device mount completed *and* the mount table confirms
    /// it (otherwise it is uncertain: its record is only a claim, a reboot
    /// keeps the files but not the mounts).
    pub complete: bool,
    /// The size it was mounted or last expanded to, when recorded.
    pub size_bytes: Option<u64>,
}

/// The kubelet's `DeviceMountableVolumePlugin`: volumes with a device phase
/// (CSI staging) that runs once per volume on the node, before any pod's
/// set-up, and is undone only after the last pod's tear-down.
#[async_trait::async_trait]
pub trait DeviceMountableVolumePlugin: Send + Sync {
    /// Whether this volume has a device phase (inline CSI volumes have none).
    fn can_device_mount(&self, spec: &VolumeSpec) -> bool;

    /// The global path of the volume's device mount.
    fn device_mount_path(&self, spec: &VolumeSpec) -> Result<PathBuf, VolumeError>;

    /// Mounts the device at its global path. Idempotent; returns the path.
    async fn mount_device(&self, req: DeviceMountRequest) -> Result<PathBuf, VolumeError>;

    /// Undoes `mount_device`. Idempotent: a device already gone is success.
    async fn unmount_device(&self, req: DeviceUnmountRequest) -> Result<(), VolumeError>;

    /// The unique id of the mount at the volume's device mount path, when
    /// something is mounted there (see
    /// [`Mounter::mount_id`](crate::sys::Mounter::mount_id)), asked once
    /// the device is mounted. With one, the resync and the tracer watch the
    /// device mount: when it is gone the device becomes uncertain (and its
    /// pods' mounts with it), so it is mounted again, then the pods' mounts
    /// set up again. Default: none (nothing to watch).
    fn device_mount_id(&self, _spec: &VolumeSpec) -> Option<u64> {
        None
    }

    /// At start-up: every device mount found on disk. Records that cannot
    /// be read are reported in `problems` (one line each, naming the
    /// record) and do not stop the others.
    fn reconstruct_devices(
        &self,
        _table: &MountTable,
        _problems: &mut Vec<String>,
    ) -> Result<Vec<ReconstructedDevice>, VolumeError> {
        Ok(Vec::new())
    }
}

/// The kubelet's `NodeExpandableVolumePlugin`: grows a volume's file system
/// on the node when its desired size grows.
#[async_trait::async_trait]
pub trait NodeExpandableVolumePlugin: Send + Sync {
    /// The size the spec asks for, if it says (a PV's capacity).
    fn requested_size(&self, spec: &VolumeSpec) -> Option<u64>;

    /// The size the volume's claim says its file system has (the claim's
    /// `status.capacity`), if known: below [`requested_size`] the volume is
    /// expanded while it is set up for a pod (the kubelet's
    /// `expandVolumeDuringMount`), and the record of the size a mounted
    /// volume has starts from it (`InitializeClaimSize`).
    ///
    /// [`requested_size`]: NodeExpandableVolumePlugin::requested_size
    fn claim_size(&self, _spec: &VolumeSpec) -> Option<u64> {
        None
    }

    /// Expands the volume to `req.new_size`.
    async fn node_expand(&self, req: NodeExpandRequest) -> Result<(), VolumeError>;
}

/// The kubelet's `ResizableEphemeralVolumePlugin`: resizes a pod's
/// ephemeral volume in place, at once, when the kubelet asks
/// (`ResizeEphemeralVolume`), rather than through the reconciler.
#[async_trait::async_trait]
pub trait ResizableEphemeralVolumePlugin: Send + Sync {
    /// Resizes the volume `spec` of `pod`, set up at `path`, to `new_size`
    /// bytes. Refuses ([`VolumeError::BelowUsage`]) a size below what the
    /// volume holds; a volume the plugin cannot resize is
    /// [`VolumeError::InvalidSpec`].
    async fn resize_ephemeral_volume(
        &self,
        pod: &PodUid,
        spec: &VolumeSpec,
        path: &Path,
        new_size: u64,
    ) -> Result<(), VolumeError>;
}

/// A volume plugin. Operations are async so plugins that talk to a driver
/// (CSI) do not hold a thread; plugins that make syscalls run them on the
/// [`BlockingPool`].
#[async_trait::async_trait]
pub trait VolumePlugin: Send + Sync + 'static {
    /// The plugin name, e.g. `kubernetes.io/empty-dir`.
    fn name(&self) -> &str;

    /// Whether this plugin handles `source`.
    fn can_support(&self, source: &VolumeSource) -> bool;

    /// The volume's key in both worlds. Default: one volume per pod.
    fn unique_volume_name(&self, pod: &PodUid, spec: &VolumeSpec) -> UniqueVolumeName {
        UniqueVolumeName::per_pod(self.name(), pod, &spec.name)
    }

    /// Makes the volume available to the pod and returns its path.
    /// Must be idempotent: called again on a volume already set up (after a
    /// restart, or when its state is uncertain), it completes without redoing.
    async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError>;

    /// [`set_up`](Self::set_up), and the unique id of the mount it made when
    /// setting up learned it on the way (see [`mount_id`](Self::mount_id),
    /// asked otherwise). Default: `None`.
    async fn set_up_and_mount_id(
        &self,
        req: MountRequest,
    ) -> Result<(PathBuf, Option<u64>), VolumeError> {
        self.set_up(req).await.map(|path| (path, None))
    }

    /// Undoes `set_up`. Idempotent: a volume already gone is success.
    async fn tear_down(&self, req: UnmountRequest) -> Result<(), VolumeError>;

    /// Whether this volume's set-up and tear-down are a few local syscalls
    /// (tens of microseconds) that run on the calling thread without
    /// awaiting anything. The reconciler then runs the tear-downs of one
    /// pass back to back in one task, as a plain loop would, instead of a
    /// task each: on a storm of thousands, the per-task hand-offs and
    /// wake-ups cost more than the work. Default: no.
    fn runs_inline(&self, _spec: &VolumeSpec) -> bool {
        false
    }

    /// The kubelet's `RequiresRemount`: whether a volume set up with
    /// `mounted` must be set up again (on the mounted volume, the pod
    /// keeps running) now that the desired spec is `desired` (configMap,
    /// secret, downwardAPI and projected volumes: a new payload, or a token
    /// due for a refresh). Default: no.
    fn requires_remount(
        &self,
        _volume: &UniqueVolumeName,
        _mounted: &VolumeSpec,
        _desired: &VolumeSpec,
    ) -> bool {
        false
    }

    /// At resync: whether a volume recorded as set up at `path` still is,
    /// judged cheaply. What it reads of the mount table goes through
    /// [`MountTableView::holds`], so a resync that did not read the table
    /// does not re-check it.
    fn verify(&self, spec: &VolumeSpec, path: &Path, table: MountTableView<'_>) -> bool;

    /// Whether `verify` reads the mount table for this volume. Default: yes,
    /// the safe answer: a resync trusts such a volume without reading the
    /// table only when its [`mount_id`](Self::mount_id) is still listed.
    fn verify_reads_mount_table(&self, _spec: &VolumeSpec) -> bool {
        true
    }

    /// The unique id of the mount this plugin made at the volume's path for
    /// `pod` (see [`Mounter::mount_id`](crate::sys::Mounter::mount_id)),
    /// asked once the volume is set up. A resync that finds every such id
    /// still listed by the kernel need not read the mount table. Default:
    /// unknown (a resync after a change of the table then reads it).
    fn mount_id(&self, _pod: &PodUid, _spec: &VolumeSpec) -> Option<u64> {
        None
    }

    /// The kubelet's `GetAttributes().SELinuxRelabel` of the volume `spec`
    /// set up at `path` (asked once it is): whether the container runtime
    /// may relabel it for SELinux. Default: what the spec tells
    /// ([`VolumeSpec::supports_selinux_relabel`]).
    fn selinux_relabel(&self, spec: &VolumeSpec, _path: &Path) -> bool {
        spec.supports_selinux_relabel()
    }

    /// The directory under `pods/<uid>/volumes/` this plugin owns, for
    /// reconstruction (`kubernetes.io~empty-dir`), if it keeps state there.
    fn volumes_dir_name(&self) -> Option<String> {
        None
    }

    /// The `volume_plugin` label of this volume's operation metrics, when it
    /// is not the plugin name (CSI: `kubernetes.io/csi:<driver>`).
    fn metric_label(&self, _spec: &VolumeSpec) -> Option<crate::metrics::PluginLabel> {
        None
    }

    /// The device phase, for plugins that have one.
    fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin> {
        None
    }

    /// Node expansion, for plugins that support it.
    fn node_expandable(&self) -> Option<&dyn NodeExpandableVolumePlugin> {
        None
    }

    /// Direct resizing of ephemeral volumes, for plugins that support it.
    fn ephemeral_resizable(&self) -> Option<&dyn ResizableEphemeralVolumePlugin> {
        None
    }

    /// Whether the volume of `spec` is attachable (the kubelet's
    /// `AttachableVolumePlugin.CanAttach`, behind `PluginIsAttachable`):
    /// such volumes are listed by `GetVolumesInUse` and, when the manager
    /// is configured to, are set up only once reported in use in the node
    /// status. Default: no (emptyDir, hostPath, configMap, ... are not
    /// attachable).
    fn can_attach(&self, _spec: &VolumeSpec) -> bool {
        false
    }

    /// At start-up: rebuilds the raw block volumes this plugin set up for a
    /// pod (`pods/<uid>/volumeDevices/`).
    fn reconstruct_block_volumes(
        &self,
        _pod: &PodUid,
        _table: &MountTable,
    ) -> Result<Vec<ReconstructedVolume>, VolumeError> {
        Ok(Vec::new())
    }

    /// At start-up: rebuilds a volume found in this plugin's directory of a pod.
    fn reconstruct(
        &self,
        _pod: &PodUid,
        _volume: &str,
        _table: &MountTable,
    ) -> Result<Option<ReconstructedVolume>, VolumeError> {
        Ok(None)
    }
}

/// The kubelet's escaping of a plugin name for directory names
/// (`kubernetes.io/empty-dir` → `kubernetes.io~empty-dir`).
pub fn escape_plugin_name(name: &str) -> String {
    name.replace('/', "~")
}

/// The unique id of the mount at `rel` (for [`VolumePlugin::mount_id`]):
/// `rel` is opened beneath ROOT, and the walk ends on what is mounted
/// there. `None` when nothing is, or the kernel cannot tell.
pub(crate) fn mount_id_at(
    root: &crate::sys::root_dir::RootDir,
    mounter: &dyn crate::sys::Mounter,
    rel: &crate::sys::root_dir::RelPath,
) -> Option<u64> {
    let top = root.open_mount_target(rel).ok()?;
    mounter.mount_id(&top).ok().flatten()
}

/// A registered plugin with its name, shared by every volume that records it.
pub type NamedPlugin = (Arc<str>, Arc<dyn VolumePlugin>);

/// The registered plugins.
#[derive(Default)]
pub struct VolumePluginMgr {
    /// Each plugin with its name, shared by every volume that records it.
    plugins: RwLock<Vec<NamedPlugin>>,
}

/// `": <what to use instead>"` for an in-tree kind with a known
/// alternative ([`crate::volume::in_tree_alternative`]), else empty.
fn alternative_suffix(kind: &str) -> String {
    crate::volume::in_tree_alternative(kind)
        .map(|a| format!(": {a}"))
        .unwrap_or_default()
}

/// No plugin (or more than one) handles a volume.
#[derive(Debug, thiserror::Error)]
pub enum PluginLookupError {
    /// Nobody handles it.
    #[error("no volume plugin supports {kind} volumes on this node{}", alternative_suffix(.kind))]
    NotFound {
        /// The source kind (`configMap`).
        kind: String,
    },
    /// Several plugins claim it.
    #[error("more than one volume plugin supports this {kind} volume: {names}")]
    Ambiguous {
        /// The source kind.
        kind: String,
        /// The plugins.
        names: String,
    },
    /// A plugin of that name is already registered.
    #[error("a volume plugin named {0:?} is already registered")]
    Duplicate(String),
}

impl VolumePluginMgr {
    /// Registers a plugin; names must be unique.
    pub fn register(&self, plugin: Arc<dyn VolumePlugin>) -> Result<(), PluginLookupError> {
        let mut plugins = self.plugins.write_locked();
        if plugins.iter().any(|(n, _)| **n == *plugin.name()) {
            return Err(PluginLookupError::Duplicate(plugin.name().to_string()));
        }
        plugins.push((plugin.name().into(), plugin));
        Ok(())
    }

    /// The one plugin that supports `source` (the kubelet's `FindPluginBySpec`).
    /// Returns the plugin's shared name with it.
    pub fn find_by_source(&self, source: &VolumeSource) -> Result<NamedPlugin, PluginLookupError> {
        let plugins = self.plugins.read_locked();
        let mut found = plugins.iter().filter(|(_, p)| p.can_support(source));
        let first = found.next().cloned();
        let rest: Vec<_> = found.map(|(n, _)| n.to_string()).collect();
        match first {
            None => Err(PluginLookupError::NotFound {
                kind: source.kind().to_string(),
            }),
            Some(p) if rest.is_empty() => Ok(p),
            Some((n, _)) => Err(PluginLookupError::Ambiguous {
                kind: source.kind().to_string(),
                names: std::iter::once(n.to_string())
                    .chain(rest)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The plugin named `name`.
    pub fn find_by_name(&self, name: &str) -> Option<Arc<dyn VolumePlugin>> {
        let plugins = self.plugins.read_locked();
        plugins
            .iter()
            .find(|(n, _)| **n == *name)
            .map(|(_, p)| Arc::clone(p))
    }

    /// All plugins, with their shared names.
    pub fn all(&self) -> Vec<NamedPlugin> {
        self.plugins.read_locked().clone()
    }
}

/// Runs blocking syscall work off the async workers, at most `limit` at once
/// (mount-table changes serialize in the kernel anyway; more threads only contend).
#[derive(Debug)]
pub struct BlockingPool {
    permits: tokio::sync::Semaphore,
}

impl BlockingPool {
    /// A pool running at most `limit` jobs at once.
    pub fn new(limit: usize) -> Self {
        Self {
            permits: tokio::sync::Semaphore::new(limit.max(1)),
        }
    }

    /// Runs `f` on a blocking thread.
    pub async fn run<F, R>(&self, f: F) -> Result<R, VolumeError>
    where
        F: FnOnce() -> Result<R, VolumeError> + Send + 'static,
        R: Send + 'static,
    {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| VolumeError::Internal("blocking pool closed".into()))?;
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| VolumeError::Internal(format!("plugin task failed: {e}")))?
    }

    /// Runs `f` on a blocking thread with ROOT and the mounter: a plugin's
    /// set-up or tear-down of a volume directory.
    pub async fn run_with<F, R>(
        &self,
        root: &Arc<crate::sys::root_dir::RootDir>,
        mounter: &Arc<dyn crate::sys::Mounter>,
        f: F,
    ) -> Result<R, VolumeError>
    where
        F: FnOnce(
                &crate::sys::root_dir::RootDir,
                &dyn crate::sys::Mounter,
            ) -> Result<R, VolumeError>
            + Send
            + 'static,
        R: Send + 'static,
    {
        let (root, mounter) = (Arc::clone(root), Arc::clone(mounter));
        self.run(move || f(&root, mounter.as_ref())).await
    }
}
