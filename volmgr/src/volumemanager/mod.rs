//! The kubelet's `VolumeManager` interface over the whole machinery: the one
//! object the agent, the C ABI and tests drive. It owns both worlds, the
//! plugins, the executor and the reconciler, and answers the kubelet's
//! questions (`WaitForAttachAndMount`, `GetMountedVolumesForPod`, ...).

mod builder;
pub mod csi_wiring;
mod pod_timeline;
mod status;
mod sub_paths;
mod volume_stats_collector;
pub mod wait;

pub use builder::{
    BuildError, Built, CsiSetup, VolumeManagerBuilder, Watchers, DEFAULT_CSI_TIMEOUT,
};
pub use pod_timeline::NoSuchPod;
pub use sub_paths::PrepareSubPathsError;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cache::actual_state_of_world::{MountedVolume, VolumeMountState};
use crate::cache::operations::OperationsView;
use crate::cache::out_of_band::OutOfBandLog;
use crate::cache::world::{EventListener, World};
use crate::metrics::Metrics;
use crate::operationexecutor::{Backoff, OperationExecutor};
use crate::plugins::config_volumes::{PayloadPlugin, PayloadShared, PayloadState, PayloadStates};
use crate::plugins::empty_dir::EmptyDirPlugin;
use crate::plugins::host_path::HostPathPlugin;
use crate::plugins::image::ImagePlugin;
use crate::plugins::local::LocalVolumePlugin;
use crate::plugins::token::{TokenRefresh, TokenSource};
use crate::plugins::{BlockingPool, PluginLookupError, VolumePlugin, VolumePluginMgr};
use crate::populator::convert::pod::{DesiredPod, PodRejected};
use crate::populator::{PodSink, Populator};
use crate::reconciler::reconstruct::{reconstruct, ReconstructionReport};
use crate::reconciler::Reconciler;
use crate::sys::root_dir::{PathError, RootDir};
use crate::sys::{MountTableReader, Mounter};
use crate::tracer::{TracerContext, TracerStatus};
use crate::util::sync::MutexExt;
use crate::volume::{PayloadKind, PodUid, UniqueVolumeName};

/// The status source under which start-up reconstruction problems show.
pub const RECONSTRUCTION_SOURCE: &str = "reconstruction";

/// Settings of a manager.
#[derive(Debug, Clone)]
pub struct Config {
    /// The root directory (kubelet: `/var/lib/kubelet`).
    pub root_dir: PathBuf,
    /// This node's name.
    pub node_name: String,
    /// Period of the safety-net resync (mount table re-read, full pass).
    pub resync_period: Duration,
    /// Retry backoff of failed operations.
    pub backoff: Backoff,
    /// Most blocking syscall jobs at once.
    pub max_blocking_ops: usize,
    /// Set up an attachable volume (CSI) only once the node status has
    /// reported it in use ([`VolumeManager::mark_volumes_as_reported_in_use`]),
    /// as the kubelet's reconciler does: until then the volume stays pending
    /// and status says why. Off by default (the standalone agent has no
    /// node status); a kubelet fork that reports `volumesInUse` turns it on.
    pub wait_for_reported_in_use: bool,
    /// Set up an attachable volume only once the Node's
    /// `status.volumesAttached` lists it
    /// ([`VolumeManager::mark_volumes_attached`]), as the kubelet's
    /// `VerifyControllerAttachedVolume` does when the attach/detach
    /// controller attaches. Off by default (needs a reader of the Node).
    pub wait_for_volumes_attached: bool,
    /// Make ROOT's mount recursively shared when the manager is built (the
    /// kubelet's `setupDataDirs` → `MakeRShared`), so mounts made below
    /// ROOT reach the container runtime's mount namespace. Default: true
    /// (the agent); the C ABI sets it from its config, off unless asked,
    /// since a kubelet fork's kubelet does it itself.
    pub make_root_shared: bool,
    /// Period of the volume stats collection (`kubelet_volume_stats_*`,
    /// status `stats`); must be positive.
    pub volume_stats_period: Duration,
    /// How often volumes of CSI drivers whose CSIDriver has
    /// `requiresRepublish` are published again (the kubelet's pod sync
    /// period, 1 minute by default).
    pub csi_republish_period: Duration,
    /// Whether the host has SELinux: `None` finds out
    /// ([`crate::sys::selinux::enabled`], as go-selinux's `GetEnabled`).
    /// Only then are volumes mounted with their SELinux label and checked
    /// for conflicting labels ([`crate::cache::selinux`]).
    pub selinux_enabled: Option<bool>,
    /// The kubelet's `SELinuxMount` feature gate (GA, on by default in
    /// 1.37): every PersistentVolume of a driver with `seLinuxMount` is
    /// mounted with its pods' SELinux label, not only ReadWriteOncePod ones.
    pub selinux_mount: bool,
}

impl Config {
    /// The SELinux settings of the desired state: the host's SELinux
    /// (found out unless set) and the `SELinuxMount` feature gate.
    pub fn selinux_settings(&self) -> crate::cache::selinux::SeLinuxSettings {
        crate::cache::selinux::SeLinuxSettings {
            enabled: self
                .selinux_enabled
                .unwrap_or_else(crate::sys::selinux::enabled),
            selinux_mount: self.selinux_mount,
        }
    }

    /// Defaults for `root_dir`.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        Self {
            root_dir: root_dir.into(),
            node_name: String::new(),
            resync_period: Duration::from_secs(60),
            backoff: Backoff::default(),
            max_blocking_ops: 16,
            wait_for_reported_in_use: false,
            wait_for_volumes_attached: false,
            make_root_shared: true,
            volume_stats_period: Duration::from_secs(60),
            csi_republish_period: crate::plugins::csi::DEFAULT_REPUBLISH_PERIOD,
            selinux_enabled: None,
            selinux_mount: true,
        }
    }
}

/// Why the manager could not be built or started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The root directory is unusable.
    #[error("root directory: {0}")]
    Root(#[from] PathError),
    /// Registering a plugin failed.
    #[error(transparent)]
    Plugin(#[from] PluginLookupError),
    /// Reconstruction failed as a whole.
    #[error("reconstruction: {0}")]
    Reconstruction(#[source] crate::plugins::VolumeError),
    /// The reconstruction task itself failed.
    #[error("reconstruction task: {0}")]
    ReconstructionTask(#[source] tokio::task::JoinError),
    /// `start` was called twice.
    #[error("the volume manager is already started")]
    AlreadyStarted,
    /// Called on a manager that is not started.
    #[error("the volume manager is not started")]
    NotStarted,
    /// A setting is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
}

/// Why a wait ended without success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The timeout passed. Lists `volume (state: error)` for what is missing.
    #[error("timed out waiting for volumes of pod {pod}: {pending}")]
    Timeout {
        /// The pod.
        pod: String,
        /// What was still missing.
        pending: String,
    },
    /// The manager stopped.
    #[error("the volume manager stopped")]
    Stopped,
    /// Volumes of the pod could not be processed (a claim not bound, an
    /// object missing: the kubelet's pod errors): `WaitForAttachAndMount`
    /// ends at once, with the kubelet's text.
    #[error("{volumes}: {errors}")]
    PodErrors {
        /// The pod.
        pod: String,
        /// The kubelet's lists of the pod's volumes.
        volumes: wait::PodVolumeLists,
        /// The errors, joined with `; `.
        errors: String,
    },
    /// A volume of the pod was refused for its CSI driver's node volume
    /// limit when the wait's timeout passed (the kubelet's
    /// `VolumeAttachLimitExceededError`: the pod is rejected).
    #[error("Node has reached its volume attachment limit, rejecting pod. {volumes}: {error}")]
    AttachLimitExceeded {
        /// The pod.
        pod: String,
        /// The kubelet's lists of the pod's volumes.
        volumes: wait::PodVolumeLists,
        /// The refusal.
        error: String,
    },
}

/// A volume to resize: its plugin, the spec it was set up with, its path.
type ResizeTarget = (
    Arc<dyn VolumePlugin>,
    Arc<crate::volume::VolumeSpec>,
    PathBuf,
);

/// Why `resize_ephemeral_volume` failed.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    /// The pod is not in the desired state.
    #[error("pod {0} is not known")]
    PodNotFound(String),
    /// The pod has no volume of that name (or does not use it).
    #[error("volume {volume} not found in pod {pod}")]
    VolumeNotFound {
        /// The pod.
        pod: String,
        /// The volume's name in the pod.
        volume: String,
    },
    /// The volume's plugin cannot resize it in place (only emptyDir can).
    #[error("volume {0} does not support direct resizing")]
    NotSupported(String),
    /// The volume is not (certainly) set up.
    #[error("volume {volume} of pod {pod} is not mounted")]
    NotMounted {
        /// The pod.
        pod: String,
        /// The volume's name in the pod.
        volume: String,
    },
    /// The plugin refused or failed (a size below what the volume holds is
    /// [`VolumeError::BelowUsage`](crate::plugins::VolumeError::BelowUsage)).
    #[error(transparent)]
    Volume(#[from] crate::plugins::VolumeError),
}

/// The volume manager.
pub struct VolumeManager {
    config: Config,
    world: Arc<World>,
    plugins: Arc<VolumePluginMgr>,
    executor: Arc<OperationExecutor>,
    root: Arc<RootDir>,
    mounter: Arc<dyn Mounter>,
    pool: Arc<BlockingPool>,
    metrics: Arc<Metrics>,
    reconciler: Arc<Reconciler>,
    populator: Arc<Populator>,
    /// Which tracer is active, and what it adds to status and metrics.
    tracer: Arc<TracerStatus>,
    shutdown: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
    extra_metrics: Mutex<Vec<Arc<dyn Fn() -> String + Send + Sync>>>,
    /// The CSI drivers shown in status, once set.
    csi_drivers: std::sync::OnceLock<Arc<crate::pluginmanager::registry::DriverRegistry>>,
    /// Out-of-band changes to managed volumes.
    out_of_band: Arc<OutOfBandLog>,
    /// ROOT's mount propagation, for status (see [`share_root`]).
    root_propagation: String,
    /// The volume stats cache and how it is collected.
    stats: Arc<volume_stats_collector::StatsCollector>,
    /// What the stats collection asks (CSI is added by `csi_wiring::install`).
    stats_provider: Arc<volume_stats_collector::PluginStats>,
    /// The stats collection task, while started.
    stats_task: Mutex<Option<JoinHandle<()>>>,
    /// What the configMap, secret, downwardAPI and projected plugins share.
    payload: PayloadShared,
    /// Observe mode's section of status, once set.
    observe: Mutex<Option<crate::status::ObserveStatus>>,
}

/// The plugins every manager has: emptyDir, hostPath, image, local,
/// configMap, secret, downwardAPI and projected volumes (CSI and host plugins are registered by their wiring).
fn built_in_plugins(
    root: &Arc<RootDir>,
    mounter: &Arc<dyn Mounter>,
    pool: &Arc<BlockingPool>,
    payload: &PayloadShared,
) -> Result<Arc<VolumePluginMgr>, Error> {
    let plugins = Arc::new(VolumePluginMgr::default());
    for kind in [
        PayloadKind::ConfigMap,
        PayloadKind::Secret,
        PayloadKind::DownwardApi,
        PayloadKind::Projected,
    ] {
        plugins.register(Arc::new(PayloadPlugin::new(kind, payload.clone())))?;
    }
    plugins.register(Arc::new(EmptyDirPlugin::new(
        Arc::clone(root),
        Arc::clone(mounter),
        Arc::clone(pool),
    )))?;
    plugins.register(Arc::new(HostPathPlugin::new(Arc::clone(pool))))?;
    plugins.register(Arc::new(ImagePlugin))?;
    plugins.register(Arc::new(LocalVolumePlugin::new(
        Arc::clone(root),
        Arc::clone(mounter),
        Arc::clone(pool),
    )))?;
    Ok(plugins)
}

/// What the payload plugins share; a token due for a refresh wakes the
/// reconciler for its volume.
fn payload_shared(
    root: &Arc<RootDir>,
    mounter: &Arc<dyn Mounter>,
    pool: &Arc<BlockingPool>,
    world: &Arc<World>,
) -> PayloadShared {
    let payload = PayloadShared {
        root: Arc::clone(root),
        mounter: Arc::clone(mounter),
        pool: Arc::clone(pool),
        tokens: Arc::new(TokenRefresh::default()),
        states: Arc::new(PayloadStates::default()),
    };
    let world = Arc::clone(world);
    payload
        .tokens
        .set_waker(Arc::new(move |v| world.mark_dirty([v])));
    payload
}

/// Makes ROOT recursively shared when `config` asks, and says how it went
/// (status `root_propagation`): `rshared` (done now), `shared` (its mount
/// already was), `off` (not asked), or `not shared: <why>` (the manager
/// still runs). Done before anything opens a path under ROOT: when ROOT is
/// bound onto itself, it is opened again so every path is beneath the new
/// mount.
fn share_root(
    config: &Config,
    root: RootDir,
    mounter: &dyn Mounter,
) -> Result<(RootDir, String), Error> {
    use crate::sys::RootPropagation;
    if !config.make_root_shared {
        return Ok((root, "off".into()));
    }
    match mounter.make_rshared(root.path()) {
        Ok(done) => {
            tracing::info!(root = %root.path().display(), outcome = ?done, "root mount propagation");
            let state = match done {
                RootPropagation::AlreadyShared => "shared",
                _ => "rshared",
            };
            let root = if done.rebound() {
                RootDir::open(&config.root_dir)?
            } else {
                root
            };
            Ok((root, state.into()))
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not make the root directory rshared");
            Ok((root, format!("not shared: {e}")))
        }
    }
}

/// The manager's two worlds, the desired state with `config`'s SELinux
/// settings.
fn new_world(config: &Config) -> Arc<World> {
    let world = World::default();
    world
        .dsw_mut()
        .set_selinux_settings(config.selinux_settings());
    Arc::new(world)
}

impl VolumeManager {
    /// Builds a manager on `config.root_dir` using `mounter`, with the
    /// built-in plugins (emptyDir, hostPath, image, local) registered, and
    /// makes ROOT rshared (`Config::make_root_shared`). Nothing else runs
    /// until [`start`](Self::start).
    pub fn new(config: Config, mounter: Arc<dyn Mounter>) -> Result<Arc<Self>, Error> {
        if config.volume_stats_period.is_zero() {
            return Err(Error::InvalidConfig(
                "the volume stats period must be positive".into(),
            ));
        }
        let root = RootDir::open(&config.root_dir)?;
        let (root, root_propagation) = share_root(&config, root, mounter.as_ref())?;
        let root = Arc::new(root);
        let world = new_world(&config);
        let metrics = Arc::new(Metrics::default());
        let pool = Arc::new(BlockingPool::new(config.max_blocking_ops));
        let payload = payload_shared(&root, &mounter, &pool, &world);
        let plugins = built_in_plugins(&root, &mounter, &pool, &payload)?;
        let payload_metrics = Arc::clone(&payload.states);
        let executor =
            OperationExecutor::new(config.backoff, Arc::clone(&metrics), Arc::clone(&world));
        let out_of_band = Arc::new(OutOfBandLog::default());
        let reconciler = Reconciler::new(
            Arc::clone(&world),
            Arc::clone(&executor),
            Arc::clone(&plugins),
            Arc::clone(&root),
            Arc::clone(&mounter),
            Arc::clone(&pool),
            Arc::clone(&out_of_band),
            config.resync_period,
            crate::reconciler::AttachWait {
                reported_in_use: config.wait_for_reported_in_use,
                volumes_attached: config.wait_for_volumes_attached,
            },
        );
        let populator = Arc::new(Populator::new(
            Arc::clone(&world),
            Arc::clone(&plugins),
            Arc::clone(&executor),
        ));
        let log = Arc::clone(&out_of_band);
        world.add_listener(Arc::new(move |ev| log.on_volume_event(ev)));
        let metrics_log = Arc::clone(&out_of_band);
        let tracer = Arc::new(TracerStatus::default());
        let tracer_metrics = Arc::clone(&tracer);
        let stats_provider = Arc::new(volume_stats_collector::PluginStats::default());
        let stats = volume_stats_collector::plugin_collector(&stats_provider, &metrics);
        let (stats_metrics, stats_world) = (Arc::clone(&stats), Arc::clone(&world));
        Ok(Arc::new(Self {
            config,
            world,
            plugins,
            executor,
            root,
            mounter,
            pool,
            metrics,
            reconciler,
            populator,
            tracer,
            shutdown: watch::Sender::new(false),
            task: Mutex::default(),
            csi_drivers: std::sync::OnceLock::new(),
            extra_metrics: Mutex::new(vec![
                Arc::new(move || metrics_log.prometheus_text()),
                Arc::new(move || tracer_metrics.prometheus_text()),
                Arc::new(move || payload_metrics.prometheus_text()),
                Arc::new(move || {
                    stats_metrics
                        .prometheus_text(|v, p| volume_stats_collector::is_live(&stats_world, v, p))
                }),
            ]),
            out_of_band,
            root_propagation,
            stats,
            stats_provider,
            stats_task: Mutex::default(),
            payload,
            observe: Mutex::default(),
        }))
    }

    /// Sets where projected `serviceAccountToken` sources get their tokens
    /// (the API source's TokenRequest, or `--token-file`). Without one, such
    /// a volume fails to set up with a message saying so.
    pub fn set_token_source(&self, source: Arc<dyn TokenSource>) {
        self.payload.tokens.set_source(source);
    }

    /// The content generation and last update of every configMap, secret,
    /// downwardAPI and projected volume set up.
    pub fn payload_states(&self) -> std::collections::BTreeMap<UniqueVolumeName, PayloadState> {
        self.payload.states.snapshot()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The root directory.
    pub fn root(&self) -> &Arc<RootDir> {
        &self.root
    }

    /// Whether a pod is in the desired state.
    pub fn pod_is_known(&self, uid: &PodUid) -> bool {
        self.world.dsw().pod(uid).is_some()
    }

    /// A number that grows whenever either state of world changes: what
    /// was built from the states at one generation is current until it
    /// moves (the C ABI caches answers by it).
    pub fn state_generation(&self) -> u64 {
        self.world.generation()
    }

    /// A receiver of the manager's generation, bumped whenever the desired
    /// or actual state changes (what a node status reporter follows).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.world.subscribe()
    }

    /// The shared state (tests).
    #[cfg(test)]
    pub(crate) fn world(&self) -> &Arc<World> {
        &self.world
    }

    /// The reconciler (tests).
    #[cfg(test)]
    pub(crate) fn reconciler(&self) -> &Arc<Reconciler> {
        &self.reconciler
    }

    /// The operation executor (tests).
    #[cfg(test)]
    pub(crate) fn executor(&self) -> &Arc<OperationExecutor> {
        &self.executor
    }

    /// The record of out-of-band changes (tests).
    #[cfg(test)]
    pub(crate) fn out_of_band(&self) -> &Arc<OutOfBandLog> {
        &self.out_of_band
    }

    /// What a tracer works with: the shared state, a reader of the mount
    /// table, a read-only view of the operations, and where it reports
    /// itself for status (see [`crate::tracer`]).
    pub fn tracer_context(&self) -> TracerContext {
        TracerContext {
            world: Arc::clone(&self.world),
            root: Arc::clone(&self.root),
            plugins: Arc::clone(&self.plugins),
            mount_table: Arc::clone(&self.mounter) as Arc<dyn MountTableReader>,
            out_of_band: Arc::clone(&self.out_of_band),
            operations: Arc::clone(&self.executor) as Arc<dyn OperationsView>,
            resync_period: self.config.resync_period,
            status: Arc::clone(&self.tracer),
        }
    }

    /// The pool that runs blocking syscalls, for plugins registered from
    /// outside (the C ABI's host plugins) to share its bound.
    pub fn pool(&self) -> &Arc<BlockingPool> {
        &self.pool
    }

    /// Registers another plugin (before pods that need it arrive).
    pub fn register_plugin(&self, plugin: Arc<dyn VolumePlugin>) -> Result<(), Error> {
        Ok(self.plugins.register(plugin)?)
    }

    /// Subscribes to volume events.
    pub fn add_event_listener(&self, l: EventListener) {
        self.world.add_listener(l);
    }

    /// Subscribes to claims whose file system was grown on the node beyond
    /// their `status.capacity` (to patch the claim's status, as the
    /// kubelet does after NodeExpandVolume).
    pub fn add_claim_resize_listener(&self, l: crate::cache::world::ClaimResizeListener) {
        self.world.add_claim_resize_listener(l);
    }

    /// Adds a producer of extra Prometheus text (e.g. the tracer's counters).
    pub fn add_metrics_source(&self, f: Arc<dyn Fn() -> String + Send + Sync>) {
        self.extra_metrics.locked().push(f);
    }

    /// Runs reconstruction and starts the reconciler on the current tokio runtime.
    pub async fn start(self: &Arc<Self>) -> Result<ReconstructionReport, Error> {
        if self.task.locked().is_some() {
            return Err(Error::AlreadyStarted);
        }
        let this = Arc::clone(self);
        let report = tokio::task::spawn_blocking(move || {
            reconstruct(
                &this.root,
                &this.plugins,
                this.mounter.as_ref(),
                &this.world,
            )
        })
        .await
        .map_err(Error::ReconstructionTask)?
        .map_err(Error::Reconstruction)?;
        self.metrics
            .kubelet
            .add_reconstructed(report.volumes_tried, report.volumes_failed);
        for e in &report.errors {
            tracing::warn!(error = %e, "reconstruction");
        }
        // Shown in status too (source `reconstruction`), e.g. a state file
        // that is not a regular file.
        self.set_source_problems(RECONSTRUCTION_SOURCE, report.errors.clone(), vec![]);
        tracing::info!(
            pods = report.pods,
            mounted = report.mounted,
            uncertain = report.uncertain,
            unstacked = report.unstacked,
            devices = report.devices,
            "reconstructed actual state"
        );
        let _ = self.shutdown.send(false);
        let handle = tokio::spawn(Arc::clone(&self.reconciler).run(self.shutdown.subscribe()));
        *self.task.locked() = Some(handle);
        let stats = tokio::spawn(volume_stats_collector::run(
            Arc::clone(&self.stats),
            Arc::clone(&self.world),
            self.config.volume_stats_period,
            self.shutdown.subscribe(),
        ));
        *self.stats_task.locked() = Some(stats);
        Ok(report)
    }

    /// Stops the reconciler; mounts stay in place (as the kubelet leaves them).
    /// Operations already running finish on their own.
    pub async fn stop(&self) -> Result<(), Error> {
        let handle = self.task.locked().take().ok_or(Error::NotStarted)?;
        let _ = self.shutdown.send(true);
        let _ = handle.await;
        let stats = self.stats_task.locked().take();
        if let Some(stats) = stats {
            let _ = stats.await;
        }
        self.world.bump();
        Ok(())
    }

    /// Whether the reconciler runs.
    pub fn is_running(&self) -> bool {
        self.task.locked().is_some()
    }

    /// Adds or updates a pod (populator). A pod rejected as a whole is
    /// returned as an error and changes nothing.
    pub fn upsert_pod(&self, pod: &Pod) -> Result<PodUid, PodRejected> {
        self.populator.upsert_pod(pod)
    }

    /// Adds or updates an already converted pod.
    pub fn set_desired_pod(&self, pod: DesiredPod) {
        self.populator.set_pod(pod);
    }

    /// Retries at once every operation that waits for something to appear
    /// (called when a CSI driver registers).
    pub fn retry_waiting(&self) {
        self.populator.retry_waiting();
    }

    /// Removes a pod (populator). Returns whether it was known.
    pub fn delete_pod(&self, uid: &PodUid) -> bool {
        self.populator.delete_pod(uid)
    }

    /// Marks the desired state as populated: every source has delivered its
    /// pods once, so volumes of unknown pods may now be torn down.
    pub fn set_populated(&self) {
        self.populator.set_populated();
    }

    /// Replaces what a source (e.g. one manifest file) reported as unusable.
    pub fn set_source_problems(
        &self,
        source: &str,
        errors: Vec<String>,
        rejected: Vec<PodRejected>,
    ) {
        self.populator.set_source_problems(source, errors, rejected);
    }

    /// Where a source of pods (the manifests directory) writes.
    pub fn pod_sink(&self) -> Arc<dyn PodSink> {
        Arc::clone(&self.populator) as Arc<dyn PodSink>
    }

    /// Shows the drivers of `registry` in status (`csi_drivers`). The first
    /// registry set stays.
    pub fn set_csi_driver_registry(
        &self,
        registry: Arc<crate::pluginmanager::registry::DriverRegistry>,
    ) {
        let _ = self.csi_drivers.set(registry);
    }

    /// The kubelet's `GetMountedVolumesForPod`: volumes certainly mounted.
    pub fn mounted_volumes_for_pod(&self, uid: &PodUid) -> Vec<MountedVolume> {
        let mut v: Vec<_> = self
            .possibly_mounted_volumes_for_pod(uid)
            .into_iter()
            .filter(|m| m.state == VolumeMountState::Mounted)
            .collect();
        v.sort_by(|a, b| a.outer_volume_spec_name.cmp(&b.outer_volume_spec_name));
        v
    }

    /// The kubelet's `GetPossiblyMountedVolumesForPod`: mounted or uncertain.
    /// A volume the pod names twice (two volumes naming the same claim) is
    /// listed under each of its names (the desired state's
    /// `outerVolumeSpecNames`), with the one mount.
    pub fn possibly_mounted_volumes_for_pod(&self, uid: &PodUid) -> Vec<MountedVolume> {
        // The desired state's lock before the actual state's.
        let dsw = self.world.dsw();
        let mut v = self.world.asw().all_mounts_of_pod(uid);
        let mut more = Vec::new();
        for m in &v {
            let Some(p) = dsw.volume(&m.volume_name).and_then(|d| d.pods.get(uid)) else {
                continue;
            };
            more.extend(
                p.outer_volume_spec_names
                    .iter()
                    .filter(|n| **n != m.outer_volume_spec_name)
                    .map(|n| MountedVolume {
                        outer_volume_spec_name: n.clone(),
                        ..m.clone()
                    }),
            );
        }
        drop(dsw);
        v.extend(more);
        v.sort_by(|a, b| a.outer_volume_spec_name.cmp(&b.outer_volume_spec_name));
        v
    }

    /// Runs `f` on the actual state under its read lock (keep `f` short:
    /// operations wait for it).
    pub fn with_actual_state<R>(
        &self,
        f: impl FnOnce(&crate::cache::actual_state_of_world::ActualStateOfWorld) -> R,
    ) -> R {
        f(&self.world.asw())
    }

    /// Reads the desired state (observe mode's view of what pods need).
    pub fn with_desired_state<R>(
        &self,
        f: impl FnOnce(&crate::cache::desired_state_of_world::DesiredStateOfWorld) -> R,
    ) -> R {
        f(&self.world.dsw())
    }

    /// Whether every source of pods delivered its pods once.
    pub fn sources_populated(&self) -> bool {
        self.world.populated()
    }

    /// Observe mode: the actual state rebuilt from ROOT and `table` by the
    /// same reconstruction the manager starts with, read-only (no stacked
    /// mount removed), into a world of its own; the manager's state is not
    /// touched, and the reconciler never runs.
    pub fn observe_actual_state(
        &self,
        table: &crate::sys::mount_table::MountTable,
    ) -> Result<(World, ReconstructionReport), Error> {
        let world = World::default();
        let report = crate::reconciler::reconstruct::reconstruct_read_only(
            &self.root,
            &self.plugins,
            table,
            &world,
        )
        .map_err(Error::Reconstruction)?;
        Ok((world, report))
    }

    /// Sets observe mode's section of status.
    pub fn set_observe_status(&self, status: crate::status::ObserveStatus) {
        // The tracer (started after this) counts none of the kubelet's
        // mounts as out-of-band changes.
        self.tracer.set_observing();
        *self.observe.locked() = Some(status);
    }

    /// Observe mode's section of status, once set.
    pub fn observe_status(&self) -> Option<crate::status::ObserveStatus> {
        self.observe.locked().clone()
    }

    /// The kubelet's `HasPossiblyMountedVolumesForPod`: whether any volume
    /// of the pod is mounted or uncertain (a plugin may be mounting it).
    pub fn has_possibly_mounted_volumes_for_pod(&self, uid: &PodUid) -> bool {
        self.world.asw().pod_has_mounts(uid)
    }

    /// The kubelet's `GetExtraSupplementalGroupsForPod`: the GIDs in the
    /// `pv.beta.kubernetes.io/gid` annotations of the PersistentVolumes
    /// mounted for the pod (invalid values ignored) that the pod does not
    /// already ask for: not among its `supplementalGroups` (the kubelet's
    /// `getExtraSupplementalGID`) nor its `fsGroup` (which the runtime adds
    /// anyway). Sorted, without duplicates; empty for an unknown pod.
    pub fn extra_supplemental_groups_for_pod(&self, uid: &PodUid) -> Vec<i64> {
        let own: Vec<i64> = self
            .world
            .dsw()
            .pod(uid)
            .map(|p| p.supplemental_groups.clone())
            .unwrap_or_default();
        let mut g: Vec<i64> = self.with_actual_state(|asw| {
            asw.mounts_of_pod(uid.as_str())
                .filter(|(_, _, m)| m.state == VolumeMountState::Mounted)
                .filter_map(|(_, _, m)| m.spec.supplemental_gid())
                .filter(|gid| !own.contains(gid))
                .collect()
        });
        g.sort_unstable();
        g.dedup();
        g
    }

    /// The kubelet's `GetVolumesInUse`: the attachable volumes (see
    /// [`VolumePlugin::can_attach`]: CSI volumes from a PersistentVolume
    /// whose CSIDriver does not say `attachRequired: false`; inline CSI
    /// volumes, emptyDir, hostPath and the like are not) that are desired
    /// or still in the actual state (mounted or uncertain), so a volume is
    /// in use from the moment it is wanted until it is safely unmounted.
    /// A desired volume's spec decides; a volume only in the actual state
    /// is judged by the spec it was mounted (or reconstructed) with.
    /// Sorted. Meaningful once [`Self::reconciler_states_synced`]: before,
    /// the volumes found at start-up may not be known yet.
    pub fn volumes_in_use(&self) -> Vec<UniqueVolumeName> {
        let can_attach = |plugin: &str, spec: Option<&Arc<crate::volume::VolumeSpec>>| {
            spec.is_some_and(|s| {
                self.plugins
                    .find_by_name(plugin)
                    .is_some_and(|p| p.can_attach(s))
            })
        };
        let dsw = self.world.dsw();
        let asw = self.world.asw();
        let mut set: HashSet<UniqueVolumeName> = dsw
            .volumes()
            .filter(|(_, v)| can_attach(&v.plugin_name, v.pods.values().next().map(|p| &p.spec)))
            .map(|(n, _)| n.clone())
            .collect();
        set.extend(
            asw.volumes()
                .filter(|(n, v)| {
                    let spec = v.pods.values().next().map(|m| &m.spec);
                    dsw.volume(n).is_none()
                        && can_attach(&v.plugin_name, spec.or(v.device_spec.as_ref()))
                })
                .map(|(n, _)| n.clone()),
        );
        let mut v: Vec<_> = set.into_iter().collect();
        v.sort();
        v
    }

    /// The kubelet's `MarkVolumesAsReportedInUse`: `names` are the volumes
    /// the node status lists in use now; every desired volume is marked
    /// reported exactly when listed (kept in the desired state). With
    /// [`Config::wait_for_reported_in_use`], newly reported volumes are set
    /// up at once.
    pub fn mark_volumes_as_reported_in_use(&self, names: Vec<UniqueVolumeName>) {
        let names: crate::util::fast_map::FastSet<UniqueVolumeName> = names.into_iter().collect();
        let newly = self.world.dsw_mut().mark_volumes_reported_in_use(&names);
        // Wakes the reconciler for them, and bumps the generation (status).
        self.world.mark_dirty(newly);
    }

    /// The Node's `status.volumesAttached` (its `name`s) as just read:
    /// with [`Config::wait_for_volumes_attached`], attachable volumes it
    /// lists are set up (newly listed ones at once).
    pub fn mark_volumes_attached(&self, names: Vec<UniqueVolumeName>) {
        let names: crate::util::fast_map::FastSet<UniqueVolumeName> = names.into_iter().collect();
        let newly = self.world.dsw_mut().mark_volumes_attached(names);
        self.world.mark_dirty(newly);
    }

    /// Whether a desired volume was reported in use at the last report.
    pub fn volume_is_reported_in_use(&self, name: &UniqueVolumeName) -> bool {
        self.world
            .dsw()
            .volume(name)
            .is_some_and(|v| v.reported_in_use)
    }

    /// The kubelet's `ResizeEphemeralVolume`: resizes the pod's volume
    /// `volume` (its name in the pod) to `new_size` bytes at once, in place.
    /// Only a `medium: Memory` emptyDir can be resized (its tmpfs is
    /// remounted with the new `size=`, files kept); a size below what it
    /// holds is refused. The desired spec keeps its `sizeLimit`: a volume
    /// set up again (after an out-of-band unmount) gets the spec's size
    /// until the pod is upserted with the new one.
    pub async fn resize_ephemeral_volume(
        &self,
        uid: &PodUid,
        volume: &str,
        new_size: u64,
    ) -> Result<(), ResizeError> {
        let (plugin, spec, path) = self.resizable_volume(uid, volume)?;
        let Some(r) = plugin.ephemeral_resizable() else {
            return Err(ResizeError::NotSupported(volume.to_string()));
        };
        r.resize_ephemeral_volume(uid, &spec, &path, new_size)
            .await?;
        tracing::info!(pod = %uid, volume, new_size, "resized ephemeral volume");
        Ok(())
    }

    /// The plugin, mounted spec and path of a pod's volume to resize.
    fn resizable_volume(&self, uid: &PodUid, volume: &str) -> Result<ResizeTarget, ResizeError> {
        let not_found = || ResizeError::VolumeNotFound {
            pod: uid.to_string(),
            volume: volume.to_string(),
        };
        let dsw = self.world.dsw();
        let pod = dsw
            .pod(uid)
            .ok_or_else(|| ResizeError::PodNotFound(uid.to_string()))?;
        let entry = pod
            .volumes
            .iter()
            .find(|v| v.outer_name == volume)
            .ok_or_else(not_found)?;
        let (Some(name), Some(plugin)) = (entry.resolution.name(), entry.resolution.plugin())
        else {
            return Err(ResizeError::NotSupported(volume.to_string()));
        };
        let plugin = self
            .plugins
            .find_by_name(plugin)
            .ok_or_else(|| ResizeError::NotSupported(volume.to_string()))?;
        let asw = self.world.asw();
        let m = asw
            .pod_mount(name, uid)
            .filter(|m| m.state == VolumeMountState::Mounted)
            .ok_or_else(|| ResizeError::NotMounted {
                pod: uid.to_string(),
                volume: volume.to_string(),
            })?;
        Ok((plugin, Arc::clone(&m.spec), m.path.clone()))
    }

    /// The namespace and name of desired pod `uid` (what an event on the
    /// pod refers to), if the pod is still desired.
    pub fn pod_name(&self, uid: &PodUid) -> Option<(Arc<str>, Arc<str>)> {
        self.world
            .dsw()
            .pod(uid)
            .map(|p| (Arc::clone(&p.namespace), Arc::clone(&p.name)))
    }

    /// The kubelet's `VolumeIsAttached`.
    pub fn volume_is_attached(&self, name: &UniqueVolumeName) -> bool {
        self.world.asw().volume(name).is_some()
    }

    /// The kubelet's `ReconcilerStatesHasBeenSynced`.
    pub fn reconciler_states_synced(&self) -> bool {
        self.world.synced()
    }
}

#[cfg(test)]
mod tests;
