//! The kubelet's `VolumeManager` interface over the whole machinery: the one
//! object the agent, the C ABI and tests drive. It owns both worlds, the
//! plugins, the executor and the reconciler, and answers the kubelet's
//! questions (`WaitForAttachAndMount`, `GetMountedVolumesForPod`, ...).

mod builder;
pub mod csi;
mod stats;
mod status;
mod sub_paths;
mod wait;

pub use builder::{
    BuildError, Built, CsiSetup, VolumeManagerBuilder, Watchers, DEFAULT_CSI_TIMEOUT,
};
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
use crate::plugins::empty_dir::EmptyDirPlugin;
use crate::plugins::host_path::HostPathPlugin;
use crate::plugins::image::ImagePlugin;
use crate::plugins::local::LocalVolumePlugin;
use crate::plugins::payload::{PayloadPlugin, PayloadShared, PayloadState, PayloadStates};
use crate::plugins::token::{TokenRefresh, TokenSource};
use crate::plugins::{BlockingPool, PluginLookupError, VolumePlugin, VolumePluginMgr};
use crate::populator::pod::{DesiredPod, PodRejected};
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
}

impl Config {
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
    csi_drivers: std::sync::OnceLock<Arc<crate::csi::registry::DriverRegistry>>,
    /// Out-of-band changes to managed volumes.
    out_of_band: Arc<OutOfBandLog>,
    /// ROOT's mount propagation, for status (see [`share_root`]).
    root_propagation: String,
    /// The volume stats cache and how it is collected.
    stats: Arc<stats::StatsCollector>,
    /// What the stats collection asks (CSI is added by `csi::install`).
    stats_provider: Arc<stats::PluginStats>,
    /// The stats collection task, while started.
    stats_task: Mutex<Option<JoinHandle<()>>>,
    /// What the configMap, secret, downwardAPI and projected plugins share.
    payload: PayloadShared,
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
        let world = Arc::new(World::default());
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
        let stats_provider = Arc::new(stats::PluginStats::default());
        let stats = Arc::new(stats::StatsCollector::new(
            Arc::clone(&stats_provider) as Arc<dyn stats::StatsProvider>
        ));
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
                    stats_metrics.prometheus_text(|v, p| stats::is_live(&stats_world, v, p))
                }),
            ]),
            out_of_band,
            root_propagation,
            stats,
            stats_provider,
            stats_task: Mutex::default(),
            payload,
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
        let stats = tokio::spawn(stats::run(
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
    pub fn set_csi_driver_registry(&self, registry: Arc<crate::csi::registry::DriverRegistry>) {
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
    pub fn possibly_mounted_volumes_for_pod(&self, uid: &PodUid) -> Vec<MountedVolume> {
        let mut v = self.world.asw().all_mounts_of_pod(uid);
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
        let names: crate::volume::FastSet<UniqueVolumeName> = names.into_iter().collect();
        let newly = self.world.dsw_mut().mark_volumes_reported_in_use(&names);
        // Wakes the reconciler for them, and bumps the generation (status).
        self.world.mark_dirty(newly);
    }

    /// The Node's `status.volumesAttached` (its `name`s) as just read:
    /// with [`Config::wait_for_volumes_attached`], attachable volumes it
    /// lists are set up (newly listed ones at once).
    pub fn mark_volumes_attached(&self, names: Vec<UniqueVolumeName>) {
        let names: crate::volume::FastSet<UniqueVolumeName> = names.into_iter().collect();
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
        let (Ok(name), Some(plugin)) = (&entry.volume, &entry.plugin_name) else {
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
mod tests {
    use super::*;

    use crate::cache::actual_state_of_world::MountedPod;
    use crate::sys::fake::{Call, FakeMounter};

    fn pod(uid: &str, vols: &[(&str, serde_json::Value)]) -> Pod {
        let mounts: Vec<_> = vols
            .iter()
            .map(|(n, _)| serde_json::json!({"name": n, "mountPath": format!("/{n}")}))
            .collect();
        let volumes: Vec<_> = vols
            .iter()
            .map(|(n, src)| {
                let mut v = src.clone();
                v["name"] = serde_json::Value::from(*n);
                v
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c", "volumeMounts": mounts}], "volumes": volumes}
        }))
        .unwrap()
    }

    fn mem() -> serde_json::Value {
        serde_json::json!({"emptyDir": {"medium": "Memory"}})
    }

    async fn manager() -> (tempfile::TempDir, Arc<FakeMounter>, Arc<VolumeManager>) {
        let t = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeMounter::default());
        let mut cfg = Config::new(t.path());
        cfg.backoff = Backoff {
            initial: Duration::from_millis(20),
            factor: 2,
            max: Duration::from_millis(100),
        };
        let vm = VolumeManager::new(cfg, fake.clone()).unwrap();
        vm.start().await.unwrap();
        (t, fake, vm)
    }

    const T: Duration = Duration::from_secs(20);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mounts_unmounts_and_cleans_up_through_the_seam() {
        let (t, fake, vm) = manager().await;
        let uid = vm.upsert_pod(&pod("a", &[("m", mem())])).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        let mounted = vm.mounted_volumes_for_pod(&uid);
        assert_eq!(mounted.len(), 1);
        assert_eq!(fake.mounted(), vec![mounted[0].path.clone()]);
        // An unchanged upsert starts nothing.
        vm.upsert_pod(&pod("a", &[("m", mem())])).unwrap();
        vm.wait_converged(Some(1), T).await.unwrap();
        assert_eq!(fake.calls().len(), 1);
        assert!(vm.reconciler_states_synced());
        assert!(vm.delete_pod(&uid));
        vm.wait_for_unmount(&uid, T).await.unwrap();
        assert!(fake.mounted().is_empty());
        assert!(matches!(fake.calls().last(), Some(Call::Unmount(_))));
        let pod_dir = t.path().canonicalize().unwrap().join("pods/a");
        for _ in 0..200 {
            if !pod_dir.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!pod_dir.exists(), "orphaned pod directory removed");
        vm.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn root_is_made_rshared_unless_turned_off_and_status_says_so() {
        let (t, fake, vm) = manager().await;
        assert_eq!(fake.rshared(), vec![t.path().canonicalize().unwrap()]);
        assert_eq!(vm.status().root_propagation, "rshared");
        assert!(fake.calls().is_empty(), "no mount call recorded for it");
        let fake = Arc::new(FakeMounter::default());
        let mut cfg = Config::new(t.path());
        cfg.make_root_shared = false;
        let vm = VolumeManager::new(cfg, fake.clone()).unwrap();
        assert!(fake.rshared().is_empty());
        assert_eq!(vm.status().root_propagation, "off");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn image_volumes_are_mounted_with_nothing_to_do() {
        let (_t, fake, vm) = manager().await;
        let img = serde_json::json!({"image": {"reference": "quay.io/x/y:v1"}});
        let uid = vm
            .upsert_pod(&pod("i", &[("img", img), ("m", mem())]))
            .unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        let mounted = vm.mounted_volumes_for_pod(&uid);
        assert_eq!(mounted.len(), 2);
        assert_eq!(mounted[0].outer_volume_spec_name, "img");
        assert_eq!(mounted[0].path, PathBuf::new());
        let st = vm.status();
        let states: Vec<_> = st.pods[0]
            .volumes
            .iter()
            .map(|v| v.state.as_str())
            .collect();
        assert_eq!(states, vec!["mounted", "mounted"]);
        assert_eq!(fake.mounted().len(), 1, "only the tmpfs is a mount");
        vm.delete_pod(&uid);
        vm.wait_for_unmount(&uid, T).await.unwrap();
        assert!(vm.possibly_mounted_volumes_for_pod(&uid).is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failures_back_off_and_recover() {
        let (_t, fake, vm) = manager().await;
        fake.fail_mounts(3, nix::errno::Errno::ENOMEM);
        let uid = vm.upsert_pod(&pod("b", &[("m", mem())])).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        let mounts = fake
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::Mount { .. }))
            .count();
        assert_eq!(mounts, 4, "three failures, then success");
        let st = vm.status();
        let v = &st.pods[0].volumes[0];
        assert_eq!(
            (v.state.as_str(), v.attempts, v.error.as_deref()),
            ("mounted", 4, None)
        );
        let ops = vm.metrics_text();
        assert!(ops.contains("status=\"fail-unknown\""));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stuck_teardown_shows_in_status_with_the_pod_name() {
        let (_t, fake, vm) = manager().await;
        let uid = vm.upsert_pod(&pod("f", &[("m", mem())])).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        fake.fail_unmounts(2, nix::errno::Errno::EBUSY);
        vm.delete_pod(&uid);
        let mut rx = vm.world().subscribe();
        let stuck = loop {
            let st = vm.status();
            let p = st.pods.iter().find(|p| p.uid == "f").cloned();
            if let Some(p) = p.filter(|p| p.volumes.first().is_some_and(|v| v.error.is_some())) {
                break p;
            }
            rx.changed().await.unwrap();
        };
        assert_eq!((stuck.namespace.as_str(), stuck.name.as_str()), ("ns", "f"));
        assert_eq!(stuck.volumes[0].state, "unmounting");
        assert!(stuck.volumes[0]
            .error
            .as_deref()
            .unwrap()
            .contains("umount2"));
        // The backoff expires, the third attempt succeeds.
        vm.wait_for_unmount(&uid, T).await.unwrap();
        assert!(vm.status().pods.iter().all(|p| p.uid != "f"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn resync_repairs_an_out_of_band_unmount() {
        let (_t, fake, vm) = manager().await;
        let uid = vm.upsert_pod(&pod("c", &[("m", mem())])).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        let path = vm.mounted_volumes_for_pod(&uid)[0].path.clone();
        fake.remove_out_of_band(&path);
        vm.reconciler().resync().await;
        vm.wait_converged(Some(1), T).await.unwrap();
        assert_eq!(fake.mounted(), vec![path]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resync_reads_the_mount_table_only_when_it_must() {
        let (_t, fake, vm) = manager().await;
        let disk = serde_json::json!({"emptyDir": {}});
        let uid = vm
            .upsert_pod(&pod("c", &[("m", mem()), ("d", disk)]))
            .unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        let path_of = |name: &str| {
            let vols = vm.mounted_volumes_for_pod(&uid);
            let v = vols.iter().find(|v| v.outer_volume_spec_name == name);
            v.unwrap().path.clone()
        };
        let (mem_path, disk_path) = (path_of("m"), path_of("d"));
        let counts = || (fake.table_reads(), fake.id_lists());
        // The first resync finds the tmpfs's mount id listed, so it does
        // not read the table; the next one, with nothing changed, does
        // not even list the ids.
        let (reads, lists) = counts();
        vm.reconciler().resync().await;
        assert_eq!(counts(), (reads, lists + 1));
        let lists = lists + 1;
        vm.reconciler().resync().await;
        assert_eq!(counts(), (reads, lists));
        // Checks that look at something else still run: the on-disk
        // emptyDir's directory is gone, and is made again.
        std::fs::remove_dir(&disk_path).unwrap();
        vm.reconciler().resync().await;
        assert_eq!(counts(), (reads, lists));
        vm.wait_converged(Some(1), T).await.unwrap();
        assert!(disk_path.is_dir());
        // A new volume changes the table: its mount's id is listed, so the
        // table is not read.
        let uid2 = vm.upsert_pod(&pod("c2", &[("m", mem())])).unwrap();
        vm.wait_for_attach_and_mount(&uid2, T).await.unwrap();
        vm.reconciler().resync().await;
        assert_eq!(counts(), (reads, lists + 1));
        // A volume recorded as mounted with no known mount id (here: by
        // hand) is checked against a fresh read.
        {
            let volume = vm.mounted_volumes_for_pod(&uid2)[0].volume_name.clone();
            let mut asw = vm.world().asw_mut();
            let m = asw.pod_mount(&volume, &uid2).cloned().unwrap();
            let unknown = MountedPod {
                mount_id: None,
                ..m
            };
            asw.mark_volume_as_mounted(&volume, &uid2, unknown);
        }
        vm.reconciler().resync().await;
        assert_eq!(counts(), (reads + 1, lists + 2));
        // An unmount behind the manager's back: the id is no longer listed,
        // the table is read, and the tmpfs mounted again.
        fake.remove_out_of_band(&mem_path);
        vm.reconciler().resync().await;
        assert_eq!(counts(), (reads + 2, lists + 3));
        vm.wait_converged(Some(2), T).await.unwrap();
        assert_eq!(fake.mounted().len(), 2);
        assert!(fake.mounted().contains(&mem_path));
        // However cheap the other checks, every tenth resync reads it.
        let (reads, _) = counts();
        for _ in 0..20 {
            vm.reconciler().resync().await;
        }
        assert_eq!(counts().0, reads + 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unknown_volumes_wait_for_populated_sources() {
        let t = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeMounter::default());
        // A first manager mounts a volume, then "crashes" (is dropped).
        {
            let vm = VolumeManager::new(Config::new(t.path()), fake.clone()).unwrap();
            vm.start().await.unwrap();
            let uid = vm.upsert_pod(&pod("d", &[("m", mem())])).unwrap();
            vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
            vm.stop().await.unwrap();
        }
        // The next one reconstructs it and leaves it alone until the sources
        // say they are complete; then, as nobody wants it, tears it down.
        let vm = VolumeManager::new(Config::new(t.path()), fake.clone()).unwrap();
        let report = vm.start().await.unwrap();
        assert_eq!((report.pods, report.uncertain), (1, 1));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            fake.mounted().len(),
            1,
            "not torn down before the sources are populated"
        );
        vm.set_populated();
        vm.wait_converged(Some(0), T).await.unwrap();
        assert!(fake.mounted().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn empty_dir_stats_show_in_status_but_not_in_the_claim_metrics() {
        let t = tempfile::tempdir().unwrap();
        let mut cfg = Config::new(t.path());
        cfg.volume_stats_period = Duration::ZERO;
        let fake = Arc::new(FakeMounter::default());
        assert!(matches!(
            VolumeManager::new(cfg.clone(), fake.clone()),
            Err(Error::InvalidConfig(_))
        ));
        cfg.volume_stats_period = Duration::from_millis(20);
        let vm = VolumeManager::new(cfg, fake).unwrap();
        vm.start().await.unwrap();
        let disk = serde_json::json!({"emptyDir": {}});
        let uid = vm.upsert_pod(&pod("s", &[("d", disk)])).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        let stats = loop {
            if let Some(s) = vm.status().pods[0].volumes[0].stats.clone() {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(stats.capacity_bytes > 0 && !stats.stale, "{stats:?}");
        assert!(stats.used_bytes + stats.available_bytes <= stats.capacity_bytes);
        assert!(stats.collected_at.is_some() && !stats.abnormal);
        assert!(!vm.metrics_text().contains("kubelet_volume_stats"));
        vm.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queries_mirror_the_kubelet_interface() {
        let (_t, _fake, vm) = manager().await;
        let mut p = pod(
            "e",
            &[
                ("m", mem()),
                ("cm", serde_json::json!({"configMap": {"name": "x"}})),
            ],
        );
        p.spec.as_mut().unwrap().security_context = Some(
            serde_json::from_value(serde_json::json!({"fsGroup": 7, "supplementalGroups": [9, 7]}))
                .unwrap(),
        );
        let uid = vm.upsert_pod(&p).unwrap();
        vm.set_populated();
        let err = vm
            .wait_for_attach_and_mount(&uid, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("cm (error: no volume plugin supports configMap"),
            "{err}"
        );
        // No PersistentVolume, no extra group; nothing attachable in use.
        assert!(vm.extra_supplemental_groups_for_pod(&uid).is_empty());
        assert!(vm.volumes_in_use().is_empty());
        let m = vm.possibly_mounted_volumes_for_pod(&uid)[0]
            .volume_name
            .clone();
        assert!(vm.volume_is_attached(&m));
        assert!(vm.has_possibly_mounted_volumes_for_pod(&uid));
        assert_eq!(vm.possibly_mounted_volumes_for_pod(&uid).len(), 1);
    }

    /// An attachable plugin standing in for CSI (a CSI source, no driver):
    /// set-up only records the path.
    struct FakeAttachable;

    #[async_trait::async_trait]
    impl VolumePlugin for FakeAttachable {
        fn name(&self) -> &str {
            "test/attachable"
        }
        fn can_support(&self, s: &crate::volume::VolumeSource) -> bool {
            matches!(s, crate::volume::VolumeSource::Csi(_))
        }
        async fn set_up(
            &self,
            req: crate::plugins::MountRequest,
        ) -> Result<PathBuf, crate::plugins::VolumeError> {
            Ok(PathBuf::from(format!(
                "/fake/{}/{}",
                req.pod_uid, req.spec.name
            )))
        }
        async fn tear_down(
            &self,
            _: crate::plugins::UnmountRequest,
        ) -> Result<(), crate::plugins::VolumeError> {
            Ok(())
        }
        fn verify(
            &self,
            _: &crate::volume::VolumeSpec,
            _: &std::path::Path,
            _: crate::sys::mount_table::MountTableView<'_>,
        ) -> bool {
            true
        }
        fn can_attach(&self, spec: &crate::volume::VolumeSpec) -> bool {
            matches!(&spec.source, crate::volume::VolumeSource::Csi(c) if c.can_attach())
        }
    }

    fn csi(gid: Option<i64>) -> crate::volume::VolumeSource {
        use crate::volume::CsiVolumeSource;
        crate::volume::VolumeSource::Csi(CsiVolumeSource {
            pv_name: Some("pv".into()),
            supplemental_gid: gid,
            ..CsiVolumeSource::new("d", format!("h-{gid:?}"))
        })
    }

    /// A desired pod with `fsGroup` 7, `supplementalGroups` [9] and `vols`.
    fn desired(uid: &str, vols: Vec<(&str, crate::volume::VolumeSource)>) -> DesiredPod {
        DesiredPod {
            uid: PodUid::new(uid).unwrap(),
            namespace: "ns".into(),
            name: uid.into(),
            fs_group: Some(7),
            fs_group_change_policy: Default::default(),
            supplemental_groups: vec![9],
            selinux_label: None,
            volumes: vols
                .into_iter()
                .map(|(n, s)| crate::populator::pod::PodVolume {
                    name: n.into(),
                    source: Ok(s),
                    sub_paths: vec![],
                    stale: None,
                })
                .collect(),
            terminated: false,
            sub_path_release: Default::default(),
        }
    }

    fn memory_source() -> crate::volume::VolumeSource {
        crate::volume::VolumeSource::EmptyDir {
            medium: crate::volume::StorageMedium::Memory,
            size_limit: Some(1 << 20),
        }
    }

    async fn manager_with(
        wait_for_reported_in_use: bool,
    ) -> (tempfile::TempDir, Arc<FakeMounter>, Arc<VolumeManager>) {
        manager_with_config(|c| c.wait_for_reported_in_use = wait_for_reported_in_use).await
    }

    async fn manager_with_config(
        f: impl FnOnce(&mut Config),
    ) -> (tempfile::TempDir, Arc<FakeMounter>, Arc<VolumeManager>) {
        let t = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeMounter::default());
        let mut cfg = Config::new(t.path());
        f(&mut cfg);
        let vm = VolumeManager::new(cfg, fake.clone()).unwrap();
        vm.register_plugin(Arc::new(FakeAttachable)).unwrap();
        vm.start().await.unwrap();
        vm.set_populated();
        (t, fake, vm)
    }

    /// Waits (bounded by T, only to catch a hang) until `f` holds.
    async fn until(vm: &VolumeManager, f: impl Fn(&VolumeManager) -> bool) {
        let mut rx = vm.world().subscribe();
        tokio::time::timeout(T, async {
            while !f(vm) {
                rx.changed().await.unwrap();
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn extra_groups_come_from_mounted_pv_gid_annotations() {
        let (_t, _fake, vm) = manager_with(false).await;
        let uid = PodUid::new("g").unwrap();
        assert!(vm.extra_supplemental_groups_for_pod(&uid).is_empty());
        vm.set_desired_pod(desired(
            "g",
            vec![
                ("a", csi(Some(1234))),
                ("b", csi(Some(9))), // already a supplemental group
                ("c", csi(Some(7))), // the fsGroup
                ("d", csi(Some(55))),
                ("e", csi(None)), // no (or an invalid) annotation
                ("m", memory_source()),
            ],
        ));
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        assert_eq!(vm.extra_supplemental_groups_for_pod(&uid), vec![55, 1234]);
        // Only the attachable (CSI) volumes are in use, not the emptyDir.
        let in_use = vm.volumes_in_use();
        assert_eq!(in_use.len(), 5, "{in_use:?}");
        assert!(in_use
            .iter()
            .all(|n| n.as_str().starts_with("test/attachable/")));
        vm.delete_pod(&uid);
        vm.wait_for_unmount(&uid, T).await.unwrap();
        assert!(vm.extra_supplemental_groups_for_pod(&uid).is_empty());
        until(&vm, |vm| vm.volumes_in_use().is_empty()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_attachable_volume_waits_until_reported_in_use() {
        let (_t, fake, vm) = manager_with(true).await;
        let uid = PodUid::new("r").unwrap();
        vm.set_desired_pod(desired(
            "r",
            vec![("c", csi(Some(1))), ("m", memory_source())],
        ));
        // The emptyDir is not attachable: it is set up at once.
        until(&vm, |vm| vm.mounted_volumes_for_pod(&uid).len() == 1).await;
        assert_eq!(fake.mounted().len(), 1);
        let status = vm.status();
        let c = status.pods[0]
            .volumes
            .iter()
            .find(|v| v.name == "c")
            .unwrap();
        assert_eq!(
            c.error.as_deref(),
            Some(crate::reconciler::NOT_REPORTED_IN_USE)
        );
        let err = vm
            .wait_for_attach_and_mount(&uid, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("c (pending: Volume has not been added"),
            "{err}"
        );
        // Reported in use: mounted at once (the reconciler is woken).
        let in_use = vm.volumes_in_use();
        assert_eq!(in_use.len(), 1);
        assert!(!vm.volume_is_reported_in_use(&in_use[0]));
        vm.mark_volumes_as_reported_in_use(in_use.clone());
        assert!(vm.volume_is_reported_in_use(&in_use[0]));
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        // Once attached, a report that leaves it out does not unmount it.
        vm.mark_volumes_as_reported_in_use(vec![]);
        vm.wait_converged(Some(1), T).await.unwrap();
        assert_eq!(vm.mounted_volumes_for_pod(&uid).len(), 2);
    }

    /// With both gates (a node agent that reports `volumesInUse` and reads
    /// `volumesAttached`): reported in use is not enough, the Node's
    /// `status.volumesAttached` must list the volume; then it is mounted at
    /// once, and stays mounted when a later read leaves it out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_attachable_volume_waits_for_volumes_attached() {
        let (_t, fake, vm) = manager_with_config(|c| {
            c.wait_for_reported_in_use = true;
            c.wait_for_volumes_attached = true;
        })
        .await;
        let uid = PodUid::new("a").unwrap();
        vm.set_desired_pod(desired(
            "a",
            vec![("c", csi(Some(1))), ("m", memory_source())],
        ));
        until(&vm, |vm| vm.mounted_volumes_for_pod(&uid).len() == 1).await;
        let in_use = vm.volumes_in_use();
        vm.mark_volumes_as_reported_in_use(in_use.clone());
        let error_of_c = |vm: &VolumeManager| {
            vm.status().pods[0]
                .volumes
                .iter()
                .find(|v| v.name == "c")
                .and_then(|v| v.error.clone())
        };
        until(&vm, |vm| {
            error_of_c(vm).as_deref() == Some(crate::reconciler::NOT_ATTACHED)
        })
        .await;
        assert_eq!(fake.mounted().len(), 1, "only the emptyDir");
        // Another volume attached changes nothing for it.
        vm.mark_volumes_attached(vec![UniqueVolumeName::new("test/attachable/other")]);
        assert_eq!(
            error_of_c(&vm).as_deref(),
            Some(crate::reconciler::NOT_ATTACHED)
        );
        vm.mark_volumes_attached(in_use.clone());
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        assert_eq!(error_of_c(&vm), None);
        vm.mark_volumes_attached(vec![]);
        vm.wait_converged(Some(1), T).await.unwrap();
        assert_eq!(vm.mounted_volumes_for_pod(&uid).len(), 2);
    }

    /// The kubelet's `CanAttach`: an inline CSI volume, and one whose
    /// CSIDriver says `attachRequired: false`, are not attachable: not in
    /// use, and set up without waiting to be reported in use.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inline_and_attach_free_csi_volumes_are_not_in_use() {
        use crate::volume::{CsiDriverInfo, CsiVolumeSource, VolumeSource};
        let (_t, _fake, vm) = manager_with(true).await;
        let uid = PodUid::new("i").unwrap();
        let inline = VolumeSource::Csi(CsiVolumeSource {
            ephemeral: true,
            ..CsiVolumeSource::new("d", "inline")
        });
        let attach_free = VolumeSource::Csi(CsiVolumeSource {
            pv_name: Some("pv-free".into()),
            driver_info: Arc::new(CsiDriverInfo {
                skip_attach: true,
                ..CsiDriverInfo::default()
            }),
            ..CsiVolumeSource::new("d", "free")
        });
        vm.set_desired_pod(desired(
            "i",
            vec![("inline", inline), ("free", attach_free), ("c", csi(None))],
        ));
        until(&vm, |vm| vm.mounted_volumes_for_pod(&uid).len() == 2).await;
        assert_eq!(
            vm.volumes_in_use(),
            vec![UniqueVolumeName::new("test/attachable/i-c")]
        );
        vm.mark_volumes_as_reported_in_use(vm.volumes_in_use());
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        // Deleted: in use until unmounted, then not.
        vm.delete_pod(&uid);
        vm.wait_for_unmount(&uid, T).await.unwrap();
        until(&vm, |vm| vm.volumes_in_use().is_empty()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_the_flag_attachable_volumes_mount_at_once() {
        let (_t, _fake, vm) = manager_with(false).await;
        let uid = PodUid::new("n").unwrap();
        vm.set_desired_pod(desired("n", vec![("c", csi(None))]));
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waits_for_all_pods_to_unmount_in_one_timeout() {
        let (_t, _fake, vm) = manager_with(false).await;
        let uids: Vec<PodUid> = ["w1", "w2", "w3"]
            .iter()
            .map(|u| {
                vm.set_desired_pod(desired(u, vec![("m", memory_source())]));
                PodUid::new(u).unwrap()
            })
            .collect();
        for u in &uids {
            vm.wait_for_attach_and_mount(u, T).await.unwrap();
            assert!(vm.has_possibly_mounted_volumes_for_pod(u));
        }
        vm.delete_pod(&uids[0]);
        vm.delete_pod(&uids[1]);
        vm.wait_for_all_pods_unmount(&uids[..2], T).await.unwrap();
        assert!(!vm.has_possibly_mounted_volumes_for_pod(&uids[0]));
        // w3 stays: the error names what is left.
        let err = vm
            .wait_for_all_pods_unmount(&uids, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            WaitError::Timeout {
                pod: "w1,w2,w3".into(),
                pending: "w3/m (still mounted)".into()
            }
        );
        vm.wait_for_all_pods_unmount(&[], T).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn resizes_a_memory_empty_dir_in_place() {
        let (_t, fake, vm) = manager_with(false).await;
        let disk = crate::volume::VolumeSource::EmptyDir {
            medium: crate::volume::StorageMedium::Default,
            size_limit: None,
        };
        let uid = PodUid::new("z").unwrap();
        vm.set_desired_pod(desired(
            "z",
            vec![("m", memory_source()), ("d", disk), ("c", csi(None))],
        ));
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        vm.resize_ephemeral_volume(&uid, "m", 8 << 20)
            .await
            .unwrap();
        assert!(matches!(
            fake.calls().last(),
            Some(Call::Remount { data: Some(d), .. }) if d == "size=8388608"
        ));
        fake.set_usage(crate::sys::FsUsage {
            size_bytes: 8 << 20,
            used_bytes: 3 << 20,
        });
        let err = vm
            .resize_ephemeral_volume(&uid, "m", 2 << 20)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ResizeError::Volume(crate::plugins::VolumeError::BelowUsage { .. })
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("3145728 bytes are in use"),
            "{err}"
        );
        let err = vm
            .resize_ephemeral_volume(&uid, "d", 1 << 20)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("only a medium: Memory"), "{err}");
        let err = vm
            .resize_ephemeral_volume(&uid, "c", 1 << 20)
            .await
            .unwrap_err();
        assert!(matches!(err, ResizeError::NotSupported(_)), "{err}");
        let err = vm
            .resize_ephemeral_volume(&uid, "x", 1 << 20)
            .await
            .unwrap_err();
        assert!(matches!(err, ResizeError::VolumeNotFound { .. }), "{err}");
        let nobody = PodUid::new("nobody").unwrap();
        let err = vm
            .resize_ephemeral_volume(&nobody, "m", 1)
            .await
            .unwrap_err();
        assert!(matches!(err, ResizeError::PodNotFound(_)), "{err}");
    }
}
