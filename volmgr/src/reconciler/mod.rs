//! The kubelet's reconciler: compares the desired and actual states and starts
//! operations until they agree. A pass over the volumes that changed runs the
//! kubelet's phases in order:
//!
//! 1. remove foreign mounts (volmgr's own): a pod's volume the tracer found
//!    with something else mounted over it gets a `RemoveForeignMounts`
//!    operation, which unmounts the extra mounts from the top;
//! 2. `unmount_volumes`: tear down what pods no longer want;
//! 3. `mount_or_attach_volumes`: set up what is desired (for plugins with a
//!    device phase, such as CSI: mount the device once per volume first, then
//!    set it up for each pod), and grow volumes whose desired size grew; an
//!    attachable volume waits until reported in use when so configured
//!    ([`Reconciler::awaits_in_use_report`]);
//! 4. `unmount_detach_devices`: unmount the devices of volumes no pod uses
//!    any more and forget them;
//! 5. `clean_orphaned_pods`: remove the directories of pods that are gone.
//!
//! Every mount and unmount the manager makes is started here, through the
//! [`OperationExecutor`]. The reconciler is woken by changes (a desired-state
//! edit, an operation finishing, a backoff expiring, and the tracer, which
//! only observes: it marks volumes lost — uncertain — or carrying foreign
//! mounts in the actual state, then marks them dirty); it looks only at the
//! volumes that changed. A slow periodic [`resync`] re-reads the mount table
//! as a safety net and makes a full pass.

#[cfg(test)]
mod kubelet_scenarios;
mod orphan_volumes;
pub mod reconstruct;
pub mod resync;

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::cache::actual_state_of_world::{
    ActualStateOfWorld, DeviceMountState, ForeignMounts, MountedPod, VolumeMountState,
};
pub use crate::cache::desired_state_of_world::{NOT_ATTACHED, NOT_REPORTED_IN_USE};

/// What an attachable volume waits for before it is set up (the kubelet's
/// `VerifyControllerAttachedVolume`); nothing by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttachWait {
    /// Until the node status lists it in `volumesInUse`
    /// (`MarkVolumesAsReportedInUse`).
    pub reported_in_use: bool,
    /// Until the Node's `status.volumesAttached` lists it
    /// (`mark_volumes_attached`).
    pub volumes_attached: bool,
}
use crate::cache::desired_state_of_world::{DesiredStateOfWorld, PodToMount, VolumeToMount};
use crate::cache::out_of_band::OutOfBandLog;
use crate::cache::world::{Dirty, World};
use crate::metrics::PluginLabel;
use crate::operationexecutor::generator::{self, ForeignMountRemoval, SubPathMounts};
use crate::operationexecutor::{NotStarted, OperationExecutor, OperationKind};
use crate::plugins::subpath;
use crate::plugins::{BlockingPool, MountRequest, VolumeError, VolumePlugin, VolumePluginMgr};
use crate::sys::root_dir::{RelPath, RootDir};
use crate::sys::Mounter;
use crate::util::fast_map::FastSet;
use crate::util::sync::MutexExt;
use crate::volume::{PodUid, SubPath, UniqueVolumeName, VolumeSpec};
use resync::ResyncState;

/// Prefix of the operation keys of pod-directory clean-ups
/// (`volmgr/pod-dir/<uid>`): one key per pod, so each has its own backoff.
const POD_DIR_PREFIX: &str = "volmgr/pod-dir/";

fn pod_dir_key(uid: &PodUid) -> UniqueVolumeName {
    UniqueVolumeName::new(format!("{POD_DIR_PREFIX}{uid}"))
}

/// An operation prepared by the executor, ready to run.
type BoxedOperation = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A pod's volume recorded as mounted that no longer is: the volume, the
/// pod, the volume's name in the pod and its path.
pub type LostVolume = (UniqueVolumeName, PodUid, String, PathBuf);

fn boxed(op: impl Future<Output = ()> + Send + 'static) -> BoxedOperation {
    Box::pin(op)
}

/// Inline operations of one batch run between two yields to the runtime,
/// so a batch of thousands keeps its worker for a millisecond or two at a
/// time, not for the whole storm.
const BATCH_YIELD_EVERY: usize = 64;

/// The reconciler.
pub struct Reconciler {
    world: Arc<World>,
    executor: Arc<OperationExecutor>,
    plugins: Arc<VolumePluginMgr>,
    root: Arc<RootDir>,
    mounter: Arc<dyn Mounter>,
    pool: Arc<BlockingPool>,
    /// Where foreign-mount removals report their outcome.
    out_of_band: Arc<OutOfBandLog>,
    resync_period: Duration,
    /// Orphan candidates seen before the sources were populated.
    deferred_pod_dirs: Mutex<HashSet<PodUid>>,
    /// What the previous resyncs learnt.
    resync_state: Mutex<ResyncState>,
    /// What an attachable volume waits for (see [`Reconciler::attach_wait`]).
    attach_wait: AttachWait,
}

enum Action {
    RemoveForeignMounts {
        volume: UniqueVolumeName,
        pod: PodUid,
        plugin: Arc<str>,
        mounted: MountedPod,
        found: ForeignMounts,
    },
    Unmount {
        volume: UniqueVolumeName,
        pod: PodUid,
        plugin: Arc<str>,
        mounted: MountedPod,
    },
    Mount {
        volume: UniqueVolumeName,
        pod: PodUid,
        plugin: Arc<str>,
        req: MountRequest,
        sub_paths: Vec<SubPath>,
    },
    PrepareSubPaths {
        volume: UniqueVolumeName,
        pod: PodUid,
        plugin: Arc<str>,
        mounted: MountedPod,
        sub_paths: Vec<SubPath>,
    },
    MountDevice {
        volume: UniqueVolumeName,
        plugin: Arc<str>,
        spec: Arc<VolumeSpec>,
        /// The fsGroup of the pod whose spec is used.
        fs_group: Option<i64>,
    },
    UnmountDevice {
        volume: UniqueVolumeName,
        plugin: Arc<str>,
        spec: Option<Arc<VolumeSpec>>,
    },
    Expand {
        volume: UniqueVolumeName,
        plugin: Arc<str>,
        spec: Arc<VolumeSpec>,
        new_size: u64,
    },
}

impl Action {
    /// What the executor keys it by: the volume, the pod (none for the
    /// volume's device), its plugin and the operation.
    fn key(&self) -> (&UniqueVolumeName, Option<&PodUid>, &Arc<str>, OperationKind) {
        match self {
            Self::RemoveForeignMounts {
                volume,
                pod,
                plugin,
                ..
            } => (
                volume,
                Some(pod),
                plugin,
                OperationKind::RemoveForeignMounts,
            ),
            Self::Mount {
                volume,
                pod,
                plugin,
                ..
            } => (volume, Some(pod), plugin, OperationKind::MountVolume),
            Self::PrepareSubPaths {
                volume,
                pod,
                plugin,
                ..
            } => (volume, Some(pod), plugin, OperationKind::PrepareSubPaths),
            Self::Unmount {
                volume,
                pod,
                plugin,
                ..
            } => (volume, Some(pod), plugin, OperationKind::UnmountVolume),
            Self::MountDevice { volume, plugin, .. } => {
                (volume, None, plugin, OperationKind::MountDevice)
            }
            Self::UnmountDevice { volume, plugin, .. } => {
                (volume, None, plugin, OperationKind::UnmountDevice)
            }
            Self::Expand { volume, plugin, .. } => {
                (volume, None, plugin, OperationKind::ExpandVolume)
            }
        }
    }

    /// The spec that names the operation in metrics.
    fn spec(&self) -> Option<&VolumeSpec> {
        match self {
            Self::RemoveForeignMounts { mounted, .. }
            | Self::Unmount { mounted, .. }
            | Self::PrepareSubPaths { mounted, .. } => Some(&mounted.spec),
            Self::Mount { req, .. } => Some(&req.spec),
            Self::MountDevice { spec, .. } | Self::Expand { spec, .. } => Some(spec),
            Self::UnmountDevice { spec, .. } => spec.as_deref(),
        }
    }
}

/// What one reconcile pass decided, phase by phase.
#[derive(Default)]
struct Pass {
    /// Operations to start, in phase order.
    actions: Vec<Action>,
    /// Volumes no pod uses any more: forgotten if still unused.
    detach: Vec<UniqueVolumeName>,
    /// Volumes neither world has: their operation records go.
    forget: Vec<UniqueVolumeName>,
    /// Pods whose directory may be removable.
    pod_dirs: FastSet<PodUid>,
}

/// The volumes a pass looks at: the dirty ones, or every volume of either
/// world.
fn scope_of(
    dirty: Dirty,
    dsw: &DesiredStateOfWorld,
    asw: &ActualStateOfWorld,
) -> Vec<UniqueVolumeName> {
    if dirty.all {
        let mut all: FastSet<UniqueVolumeName> = dsw.volumes().map(|(n, _)| n.clone()).collect();
        all.extend(asw.volumes().map(|(n, _)| n.clone()));
        all.into_iter().collect()
    } else {
        dirty.volumes.into_iter().collect()
    }
}

impl Reconciler {
    /// A reconciler over `world`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        world: Arc<World>,
        executor: Arc<OperationExecutor>,
        plugins: Arc<VolumePluginMgr>,
        root: Arc<RootDir>,
        mounter: Arc<dyn Mounter>,
        pool: Arc<BlockingPool>,
        out_of_band: Arc<OutOfBandLog>,
        resync_period: Duration,
        attach_wait: AttachWait,
    ) -> Arc<Self> {
        Arc::new(Self {
            world,
            executor,
            plugins,
            root,
            mounter,
            pool,
            out_of_band,
            resync_period,
            deferred_pod_dirs: Mutex::default(),
            resync_state: Mutex::default(),
            attach_wait,
        })
    }

    /// The kubelet's `VerifyControllerAttachedVolume` gate: an attachable
    /// volume (see [`VolumePlugin::can_attach`]) not attached yet (not
    /// in the actual state) is not set up, with [`AttachWait`]
    /// `reported_in_use`, until the node status has listed it in use
    /// (`MarkVolumesAsReportedInUse`), and with `volumes_attached`, until
    /// the Node's `status.volumesAttached` lists it. Returns why it waits
    /// ([`NOT_REPORTED_IN_USE`], [`NOT_ATTACHED`]), if it does. Marking it
    /// wakes the reconciler for it.
    pub fn attach_wait(
        &self,
        v: &UniqueVolumeName,
        dv: &VolumeToMount,
        asw: &ActualStateOfWorld,
    ) -> Option<&'static str> {
        let w = self.attach_wait;
        if !(w.reported_in_use || w.volumes_attached)
            || asw.volume(v).is_some()
            || !dv.pods.values().next().is_some_and(|p| {
                self.plugins
                    .find_by_name(&dv.plugin_name)
                    .is_some_and(|plugin| plugin.can_attach(&p.spec))
            })
        {
            return None;
        }
        if w.reported_in_use && !dv.reported_in_use {
            return Some(NOT_REPORTED_IN_USE);
        }
        (w.volumes_attached && !dv.attached).then_some(NOT_ATTACHED)
    }

    /// Runs until `shutdown` turns true. Reconstruction must have run first.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut resync = tokio::time::interval(self.resync_period);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resync.tick().await;
        self.world.mark_all_dirty();
        loop {
            tokio::select! {
                biased;
                () = crate::util::shutdown::requested(&mut shutdown) => break,
                dirty = self.world.take_dirty() => self.reconcile(dirty),
                _ = resync.tick() => self.resync().await,
            }
        }
        tracing::debug!("reconciler stopped");
    }

    /// One pass over the volumes in `dirty`.
    pub fn reconcile(self: &Arc<Self>, mut dirty: Dirty) {
        let populated = self.world.populated();
        let full = dirty.all;
        let mut pass = Pass {
            pod_dirs: std::mem::take(&mut dirty.pods),
            ..Pass::default()
        };
        {
            // Read locks only: operations finishing meanwhile wait for the
            // analysis, never for the operations this pass starts.
            let dsw = self.world.dsw();
            let asw = self.world.asw();
            let scope = scope_of(dirty, &dsw, &asw);
            Self::remove_foreign_mounts(&asw, &scope, &mut pass);
            // Before the sources have delivered every pod, an unknown pod
            // may just not be read yet: nothing is torn down.
            if populated {
                Self::unmount_volumes(&dsw, &asw, &scope, &mut pass);
            }
            self.mount_or_attach_volumes(&dsw, &asw, &scope, &mut pass);
            if populated {
                Self::unmount_detach_devices(&dsw, &asw, &scope, &mut pass);
            }
        }
        self.detach_and_forget(pass.detach, pass.forget);
        let mut tear_downs = Vec::new();
        for a in pass.actions {
            self.start(a, &mut tear_downs);
        }
        self.clean_orphaned_pods(pass.pod_dirs, populated, &mut tear_downs);
        run_batch(tear_downs, &self.world);
        if full && populated && self.world.reconstructed() {
            self.world.set_synced();
        }
    }

    /// Phase 1: pods' volumes the tracer found with foreign mounts stacked
    /// on them get those removed (first, so no other operation on the mount
    /// runs meanwhile: the executor refuses it, and it is retried when the
    /// removal finishes).
    fn remove_foreign_mounts(
        asw: &ActualStateOfWorld,
        scope: &[UniqueVolumeName],
        pass: &mut Pass,
    ) {
        for v in scope {
            let Some(av) = asw.volume(v) else { continue };
            for (pod, found) in av.foreign_mounts.iter() {
                let Some(m) = av.pods.get(pod) else { continue };
                pass.actions.push(Action::RemoveForeignMounts {
                    volume: v.clone(),
                    pod: pod.clone(),
                    plugin: Arc::clone(&av.plugin_name),
                    mounted: m.clone(),
                    found: *found,
                });
            }
        }
    }

    /// Phase 2 (the kubelet's `unmountVolumes`): tear down pods' volumes
    /// that are no longer desired.
    fn unmount_volumes(
        dsw: &DesiredStateOfWorld,
        asw: &ActualStateOfWorld,
        scope: &[UniqueVolumeName],
        pass: &mut Pass,
    ) {
        for v in scope {
            let Some(av) = asw.volume(v) else { continue };
            for (pod, m) in &av.pods {
                if !dsw.pod_exists_in_volume(v, pod) && !dsw.is_held(pod) {
                    pass.actions.push(Action::Unmount {
                        volume: v.clone(),
                        pod: pod.clone(),
                        plugin: Arc::clone(&av.plugin_name),
                        mounted: m.clone(),
                    });
                }
            }
        }
    }

    /// Phase 3 (the kubelet's `mountOrAttachVolumes`): set up what is
    /// desired and not (certainly) set up, after the device where the
    /// plugin has a device phase; grow mounted volumes whose desired size
    /// is beyond the size recorded (the kubelet's `volumeNeedsExpansion`).
    fn mount_or_attach_volumes(
        &self,
        dsw: &DesiredStateOfWorld,
        asw: &ActualStateOfWorld,
        scope: &[UniqueVolumeName],
        pass: &mut Pass,
    ) {
        for v in scope {
            if let Some(uid) = v.as_str().strip_prefix(POD_DIR_PREFIX) {
                // A clean-up finished or its backoff expired.
                pass.pod_dirs.extend(PodUid::new(uid).ok());
                continue;
            }
            let Some(dv) = dsw.volume(v) else { continue };
            if self.attach_wait(v, dv, asw).is_some() {
                continue;
            }
            if self.mount_device_or_expand(v, dv, asw, pass) {
                continue;
            }
            for (pod, p) in &dv.pods {
                pass.actions
                    .extend(self.pod_action(v, &dv.plugin_name, pod, p, asw));
            }
        }
    }

    /// What `pod`'s use `p` of `v` needs: a set-up (with the released
    /// subPaths: those already bound are kept, those lost with the volume
    /// bound again), or, set up, the subPaths released since and not
    /// prepared yet (a container may start now).
    fn pod_action(
        &self,
        v: &UniqueVolumeName,
        plugin: &Arc<str>,
        pod: &PodUid,
        p: &PodToMount,
        asw: &ActualStateOfWorld,
    ) -> Option<Action> {
        let mounted = asw.pod_mount(v, pod);
        let needs = match mounted {
            Some(m) => {
                m.state != VolumeMountState::Mounted
                    || m.spec.source.kind() != p.spec.source.kind()
                    || self.requires_remount(v, plugin, &m.spec, &p.spec)
            }
            None => true,
        };
        let sub_paths: Vec<SubPath> = p
            .sub_paths
            .iter()
            .filter(|s| {
                p.sub_path_release.releases(&s.container)
                    && (needs || !asw.sub_path_prepared(v, pod, &s.container, s.index))
            })
            .cloned()
            .collect();
        match mounted {
            _ if needs => Some(Action::Mount {
                volume: v.clone(),
                pod: pod.clone(),
                plugin: Arc::clone(plugin),
                req: MountRequest {
                    pod_uid: pod.clone(),
                    volume_name: v.clone(),
                    spec: Arc::clone(&p.spec),
                    fs_group: p.fs_group,
                    fs_group_change_policy: p.fs_group_change_policy,
                    selinux_label: p.selinux_label.clone(),
                },
                sub_paths,
            }),
            Some(m) if !sub_paths.is_empty() => Some(Action::PrepareSubPaths {
                volume: v.clone(),
                pod: pod.clone(),
                plugin: Arc::clone(plugin),
                mounted: m.clone(),
                sub_paths,
            }),
            _ => None,
        }
    }

    /// The kubelet's `RequiresRemount` check for a mounted volume: only
    /// payload volumes (configMap, secret, downwardAPI, projected) and
    /// volumes of `requiresRepublish` CSI drivers are ever set up again in
    /// place, so the plugin is asked only for them.
    fn requires_remount(
        &self,
        v: &UniqueVolumeName,
        plugin: &str,
        mounted: &Arc<VolumeSpec>,
        desired: &Arc<VolumeSpec>,
    ) -> bool {
        use crate::volume::VolumeSource;
        let in_place = match &desired.source {
            VolumeSource::Payload(_) => true,
            VolumeSource::Csi(c) => c.driver_info.requires_republish,
            _ => false,
        };
        if !in_place {
            return false;
        }
        self.plugins
            .find_by_name(plugin)
            .is_some_and(|p| p.requires_remount(v, mounted, desired))
    }

    /// The volume-wide part of phase 3: mounts the device first, once, for
    /// plugins with a device phase (returns `true`: no pod is set up before
    /// it is mounted), and grows a mounted volume whose desired size is
    /// beyond the recorded one.
    fn mount_device_or_expand(
        &self,
        v: &UniqueVolumeName,
        dv: &VolumeToMount,
        asw: &ActualStateOfWorld,
        pass: &mut Pass,
    ) -> bool {
        let Some(first) = dv.pods.values().next() else {
            return false;
        };
        let Some(plugin) = self.plugins.find_by_name(&dv.plugin_name) else {
            return false;
        };
        let device_mountable = plugin
            .device_mountable()
            .is_some_and(|d| d.can_device_mount(&first.spec));
        if device_mountable && asw.device_mount_state(v) != DeviceMountState::Mounted {
            pass.actions.push(Action::MountDevice {
                volume: v.clone(),
                plugin: Arc::clone(&dv.plugin_name),
                spec: Arc::clone(&first.spec),
                fs_group: first.fs_group,
            });
            return true;
        }
        let (Some(ex), Some(av)) = (plugin.node_expandable(), asw.volume(v)) else {
            return false;
        };
        // The recorded size, or the claim's (the kubelet's
        // `InitializeClaimSize`, for a volume found without a record).
        let have = av.size_bytes.or_else(|| ex.claim_size(&first.spec));
        if let (Some(want), Some(have)) = (ex.requested_size(&first.spec), have) {
            let mounted = av
                .pods
                .values()
                .any(|m| m.state == VolumeMountState::Mounted);
            // A size the driver said it cannot reach is not asked again; not a
            // read-only volume (the kubelet's populator records no desired size
            // for one).
            if want > have
                && mounted
                && av.expansion_infeasible != Some(want)
                && !first.spec.read_only()
            {
                pass.actions.push(Action::Expand {
                    volume: v.clone(),
                    plugin: Arc::clone(&dv.plugin_name),
                    spec: Arc::clone(&first.spec),
                    new_size: want,
                });
            }
        }
        false
    }

    /// Phase 4 (the kubelet's `unmountDetachDevices`): unmount the devices
    /// of volumes no pod uses (only after the last pod's tear-down), then
    /// forget them (nothing to detach for these plugins), and the operation
    /// records of volumes neither world has.
    fn unmount_detach_devices(
        dsw: &DesiredStateOfWorld,
        asw: &ActualStateOfWorld,
        scope: &[UniqueVolumeName],
        pass: &mut Pass,
    ) {
        for v in scope {
            if dsw.volume_exists(v) || v.as_str().starts_with(POD_DIR_PREFIX) {
                continue;
            }
            match asw.volume(v) {
                Some(av)
                    if av.pods.is_empty()
                        && av.device_mount_state != DeviceMountState::NotMounted =>
                {
                    pass.actions.push(Action::UnmountDevice {
                        volume: v.clone(),
                        plugin: Arc::clone(&av.plugin_name),
                        spec: av.device_spec.clone(),
                    });
                }
                Some(av) if av.pods.is_empty() => pass.detach.push(v.clone()),
                Some(_) => {}
                None => pass.forget.push(v.clone()),
            }
        }
    }

    /// Forgets the volumes phase 4 found unused (if still unused: an
    /// operation may have finished since) and the operation records of those
    /// neither world has.
    fn detach_and_forget(&self, detach: Vec<UniqueVolumeName>, mut forget: Vec<UniqueVolumeName>) {
        if !detach.is_empty() {
            let mut asw = self.world.asw_mut();
            let before = forget.len();
            for v in &detach {
                if asw.mark_volume_as_detached(v) {
                    forget.push(v.clone());
                }
            }
            drop(asw);
            // A change of the actual state: waiters and cached answers
            // (`GetVolumesInUse`, `VolumeIsAttached`) see it.
            if forget.len() > before {
                self.world.bump();
            }
        }
        for v in forget {
            self.executor.forget_volume(&v);
        }
    }

    /// Starts `action`: spawned as its own task, or, for the tear-down of a
    /// volume whose plugin runs it inline, added to `tear_downs` (see
    /// [`run_batch`]).
    fn start(self: &Arc<Self>, action: Action, tear_downs: &mut Vec<BoxedOperation>) {
        let (volume, pod, plugin_name, _) = action.key();
        let (volume, pod, plugin_name) = (volume.clone(), pod.cloned(), Arc::clone(plugin_name));
        let Some(plugin) = self.plugins.find_by_name(&plugin_name) else {
            tracing::warn!(%volume, plugin = %plugin_name, "volume plugin is not registered");
            return;
        };
        // The metrics label: the plugin name, or a finer one (CSI driver).
        let label = action
            .spec()
            .and_then(|s| plugin.metric_label(s))
            .unwrap_or_else(|| Arc::clone(&plugin_name).into());
        let batched = matches!(
            &action,
            Action::Unmount { mounted, .. } if plugin.runs_inline(&mounted.spec)
        );
        let prepared = self.prepare_action(action, plugin, plugin_name, label);
        match prepared {
            Ok(op) if batched => tear_downs.push(op),
            Ok(op) => {
                tokio::spawn(op);
            }
            Err(why) => tracing::debug!(%volume, pod = ?pod, ?why, "operation not started"),
        }
    }

    /// Hands `action`'s operation body (from the generator) to the executor.
    fn prepare_action(
        &self,
        action: Action,
        plugin: Arc<dyn VolumePlugin>,
        plugin_name: Arc<str>,
        label: PluginLabel,
    ) -> Result<BoxedOperation, NotStarted> {
        let (volume, pod, _, kind) = action.key();
        let (volume, pod) = (volume.clone(), pod.cloned());
        let (pod, world) = (pod.as_ref(), Arc::clone(&self.world));
        match action {
            Action::RemoveForeignMounts {
                pod: upod,
                mounted,
                found,
                ..
            } => {
                let op = ForeignMountRemoval {
                    world,
                    log: Arc::clone(&self.out_of_band),
                    root: Arc::clone(&self.root),
                    mounter: Arc::clone(&self.mounter),
                    plugin,
                    volume: volume.clone(),
                    pod: upod,
                    mounted,
                    found,
                };
                let body = generator::remove_foreign_mounts(op);
                self.prepare(&volume, pod, kind, label, body)
            }
            Action::Mount { req, sub_paths, .. } => {
                let subs = self.sub_path_mounts(sub_paths);
                let body = generator::mount_volume(world, plugin, plugin_name, req, subs);
                self.prepare(&volume, pod, kind, label, body)
            }
            Action::PrepareSubPaths {
                pod: upod,
                mounted,
                sub_paths,
                ..
            } => {
                let subs = self.sub_path_mounts(sub_paths);
                let body = generator::prepare_sub_paths(world, volume.clone(), upod, mounted, subs);
                self.prepare(&volume, pod, kind, label, body)
            }
            Action::Unmount {
                mounted, pod: upod, ..
            } => {
                let subs = self.sub_path_mounts(Vec::new());
                let body =
                    generator::unmount_volume(world, plugin, volume.clone(), upod, mounted, subs);
                self.prepare(&volume, pod, kind, label, body)
            }
            Action::MountDevice { spec, fs_group, .. } => {
                let body = generator::mount_device(
                    world,
                    plugin,
                    plugin_name,
                    volume.clone(),
                    spec,
                    fs_group,
                );
                self.prepare(&volume, None, kind, label, body)
            }
            Action::UnmountDevice { .. } => {
                let body = generator::unmount_device(world, plugin, volume.clone());
                self.prepare(&volume, None, kind, label, body)
            }
            Action::Expand { spec, new_size, .. } => {
                let body = generator::expand_volume(world, plugin, volume.clone(), spec, new_size);
                self.prepare(&volume, None, kind, label, body)
            }
        }
    }

    /// What a mount or unmount needs for `subs`, the subPath bind mounts.
    fn sub_path_mounts(&self, subs: Vec<SubPath>) -> SubPathMounts {
        SubPathMounts {
            root: Arc::clone(&self.root),
            mounter: Arc::clone(&self.mounter),
            subs,
        }
    }

    /// [`OperationExecutor::prepare`], boxed.
    fn prepare<F>(
        &self,
        volume: &UniqueVolumeName,
        pod: Option<&PodUid>,
        kind: OperationKind,
        label: PluginLabel,
        op: F,
    ) -> Result<BoxedOperation, NotStarted>
    where
        F: Future<Output = Result<(), VolumeError>> + Send + 'static,
    {
        self.executor
            .prepare(volume, pod, kind, label, op)
            .map(boxed)
    }

    /// Phase 5 (the kubelet's `cleanupOrphanedPodDirs`): removes
    /// `ROOT/pods/<uid>` of pods that are neither desired nor have anything
    /// mounted. The removal
    /// never crosses a mount, so a volume unknown to the manager is left intact.
    fn clean_orphaned_pods(
        self: &Arc<Self>,
        mut candidates: FastSet<PodUid>,
        populated: bool,
        batch: &mut Vec<BoxedOperation>,
    ) {
        {
            let mut deferred = self.deferred_pod_dirs.locked();
            if !populated {
                deferred.extend(candidates);
                return;
            }
            candidates.extend(deferred.drain());
        }
        if candidates.is_empty() {
            return;
        }
        let eligible: Vec<PodUid> = {
            let dsw = self.world.dsw();
            let asw = self.world.asw();
            candidates
                .into_iter()
                .filter(|u| dsw.pod(u).is_none() && !dsw.is_held(u) && !asw.pod_has_mounts(u))
                .collect()
        };
        for uid in eligible {
            let (root, mounter) = (Arc::clone(&self.root), Arc::clone(&self.mounter));
            let u = uid.clone();
            // Inline: what is left of a pod whose volumes are all torn down
            // is a few directories (and small files of its containers), and
            // the subPath binds of volumes no one found again at start-up.
            let op = async move {
                subpath::clean_pod_sub_paths(&root, mounter.as_ref(), &u)?;
                orphan_volumes::remove_orphaned_pod_volume_dirs(&root, &u)?;
                let rel = RelPath::new(["pods", u.as_str()])?;
                root.remove_all(&rel)?;
                tracing::debug!(pod = %u, "removed orphaned pod directory");
                Ok(())
            };
            if let Ok(op) = self.executor.prepare(
                &pod_dir_key(&uid),
                None,
                OperationKind::CleanupPodDir,
                "volmgr".into(),
                op,
            ) {
                batch.push(boxed(op));
            }
        }
    }
}

/// Runs the inline tear-downs (and pod-directory clean-ups) of one
/// reconcile pass back to back in one task, as a plain loop would: each is a
/// few syscalls, and a task each would cost more in hand-offs than the work
/// itself. The reconciler hears of the finished operations once per stretch
/// of [`BATCH_YIELD_EVERY`], not once per operation. Set-ups keep a task
/// each: they gain from running on every CPU, and batching them measured
/// slower (10,000 mounts 1.70x the raw loop instead of 1.44x).
fn run_batch(batch: Vec<BoxedOperation>, world: &Arc<World>) {
    if batch.is_empty() {
        return;
    }
    let world = Arc::clone(world);
    tokio::spawn(async move {
        let mut hold = Some(world.hold_wakes());
        for (i, op) in batch.into_iter().enumerate() {
            if i > 0 && i % BATCH_YIELD_EVERY == 0 {
                drop(hold.take());
                tokio::task::yield_now().await;
                hold = Some(world.hold_wakes());
            }
            op.await;
        }
    });
}

#[cfg(test)]
mod tests {
    //! The device phase through the plugin trait seam: a fake plugin with a
    //! device phase (like CSI staging) and the recording fake mounter.

    use std::path::Path;
    use std::sync::Mutex as StdMutex;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;

    use crate::cache::actual_state_of_world::DeviceMountState;
    use crate::operationexecutor::Backoff;
    use crate::plugins::{
        DeviceMountRequest, DeviceMountableVolumePlugin, DeviceUnmountRequest, MountRequest,
        UnmountRequest, VolumeError, VolumePlugin,
    };
    use crate::sys::fake::FakeMounter;
    use crate::sys::mount_table::MountTableView;
    use crate::volume::{PodUid, UniqueVolumeName, VolumeSource, VolumeSpec};
    use crate::volumemanager::{Config, VolumeManager};
    use std::path::PathBuf;
    use std::sync::Arc;

    /// Claims `nfs` volumes, one volume for every pod (like a PV), and logs
    /// its calls; `uncertain_stages` makes that many stages uncertain, the
    /// `fail_*` queues fail the next calls with their errors, and
    /// `failing_unstages` fails that many unstages.
    #[derive(Default)]
    struct FakeDevicePlugin {
        calls: StdMutex<Vec<String>>,
        uncertain_stages: StdMutex<u32>,
        fail_publish: StdMutex<Vec<VolumeError>>,
        fail_unpublish: StdMutex<Vec<VolumeError>>,
        failing_unstages: StdMutex<u32>,
        /// The size every spec asks for (none: not expandable).
        size: StdMutex<Option<u64>>,
        fail_expand: StdMutex<Vec<VolumeError>>,
    }

    impl FakeDevicePlugin {
        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
        fn log(&self, c: String) {
            self.calls.lock().unwrap().push(c);
        }
    }

    #[async_trait::async_trait]
    impl VolumePlugin for FakeDevicePlugin {
        fn name(&self) -> &str {
            "fake/device"
        }
        fn can_support(&self, s: &VolumeSource) -> bool {
            matches!(s, VolumeSource::Other { kind, .. } if kind == "nfs")
        }
        fn unique_volume_name(&self, _pod: &PodUid, spec: &VolumeSpec) -> UniqueVolumeName {
            UniqueVolumeName::new(format!("fake/device/{}", spec.name))
        }
        async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
            self.log(format!("publish {}", req.pod_uid));
            if let Some(e) = self.fail_publish.lock().unwrap().pop() {
                return Err(e);
            }
            Ok(PathBuf::from(format!("/fake/{}", req.pod_uid)))
        }
        async fn tear_down(&self, req: UnmountRequest) -> Result<(), VolumeError> {
            self.log(format!("unpublish {}", req.pod_uid));
            if let Some(e) = self.fail_unpublish.lock().unwrap().pop() {
                return Err(e);
            }
            Ok(())
        }
        fn verify(&self, _: &VolumeSpec, _: &Path, _: MountTableView<'_>) -> bool {
            true
        }
        fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin> {
            Some(self)
        }
        fn node_expandable(&self) -> Option<&dyn crate::plugins::NodeExpandableVolumePlugin> {
            Some(self)
        }
    }

    #[async_trait::async_trait]
    impl crate::plugins::NodeExpandableVolumePlugin for FakeDevicePlugin {
        fn requested_size(&self, _: &VolumeSpec) -> Option<u64> {
            *self.size.lock().unwrap()
        }
        async fn node_expand(
            &self,
            req: crate::plugins::NodeExpandRequest,
        ) -> Result<(), VolumeError> {
            self.log(format!("expand {}", req.new_size));
            match self.fail_expand.lock().unwrap().pop() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
    }

    #[async_trait::async_trait]
    impl DeviceMountableVolumePlugin for FakeDevicePlugin {
        fn can_device_mount(&self, _: &VolumeSpec) -> bool {
            true
        }
        fn device_mount_path(&self, _: &VolumeSpec) -> Result<PathBuf, VolumeError> {
            Ok("/fake/global".into())
        }
        async fn mount_device(&self, _: DeviceMountRequest) -> Result<PathBuf, VolumeError> {
            self.log("stage".into());
            let mut n = self.uncertain_stages.lock().unwrap();
            if *n > 0 {
                *n -= 1;
                return Err(VolumeError::Uncertain("timed out".into()));
            }
            Ok("/fake/global".into())
        }
        async fn unmount_device(&self, _: DeviceUnmountRequest) -> Result<(), VolumeError> {
            self.log("unstage".into());
            let mut n = self.failing_unstages.lock().unwrap();
            if *n > 0 {
                *n -= 1;
                return Err(VolumeError::Plugin {
                    plugin: "kubernetes.io/csi".into(),
                    message: "rpc error: code = InvalidArgument: unstage refused".into(),
                });
            }
            Ok(())
        }
    }

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {
                "containers": [{"name": "c", "volumeMounts": [{"name": "shared", "mountPath": "/s"}]}],
                "volumes": [{"name": "shared", "nfs": {"server": "s", "path": "/"}}]
            }
        }))
        .unwrap()
    }

    async fn manager() -> (tempfile::TempDir, Arc<FakeDevicePlugin>, Arc<VolumeManager>) {
        manager_with(Backoff::new(
            Duration::from_millis(10),
            2,
            Duration::from_millis(50),
        ))
        .await
    }

    async fn manager_with(
        backoff: Backoff,
    ) -> (tempfile::TempDir, Arc<FakeDevicePlugin>, Arc<VolumeManager>) {
        let t = tempfile::tempdir().unwrap();
        let mut cfg = Config::new(t.path());
        cfg.backoff = backoff;
        let vm = VolumeManager::new(cfg, Arc::new(FakeMounter::default())).unwrap();
        let plugin = Arc::new(FakeDevicePlugin::default());
        vm.register_plugin(plugin.clone()).unwrap();
        vm.start().await.unwrap();
        (t, plugin, vm)
    }

    const T: Duration = Duration::from_secs(20);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_pods_one_device_mount_unmounted_after_the_last_pod() {
        let (_t, plugin, vm) = manager().await;
        let a = vm.upsert_pod(&pod("a")).unwrap();
        let b = vm.upsert_pod(&pod("b")).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&a, T).await.unwrap();
        vm.wait_for_attach_and_mount(&b, T).await.unwrap();
        let calls = plugin.calls();
        assert_eq!(
            calls.iter().filter(|c| *c == "stage").count(),
            1,
            "{calls:?}"
        );
        assert_eq!(calls[0], "stage", "staged before any publish: {calls:?}");
        assert_eq!(calls.iter().filter(|c| c.starts_with("publish")).count(), 2);
        let v = UniqueVolumeName::new("fake/device/shared");
        assert_eq!(
            vm.world().asw().device_mount_state(&v),
            DeviceMountState::Mounted
        );

        // One pod goes: its publish is undone, the device stays.
        vm.delete_pod(&a);
        vm.wait_for_unmount(&a, T).await.unwrap();
        vm.wait_converged(Some(1), T).await.unwrap();
        let calls = plugin.calls();
        assert!(calls.contains(&"unpublish a".to_string()));
        assert!(!calls.contains(&"unstage".to_string()), "{calls:?}");

        // The last one goes: unpublish, then unstage, then the volume is forgotten.
        vm.delete_pod(&b);
        vm.wait_converged(Some(0), T).await.unwrap();
        let mut rx = vm.world().subscribe();
        while vm.world().asw().volume(&v).is_some() {
            rx.changed().await.unwrap();
        }
        let calls = plugin.calls();
        assert_eq!(
            calls.last().map(String::as_str),
            Some("unstage"),
            "{calls:?}"
        );
        assert_eq!(calls.iter().filter(|c| *c == "unstage").count(), 1);
        let text = vm.metrics_text();
        assert!(
            text.contains(
                "operation_name=\"mount_device\",volume_plugin=\"fake/device\",status=\"success\""
            ),
            "{text}"
        );
        assert!(text.contains("operation_name=\"unmount_device\""));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_uncertain_device_mount_is_mounted_again_before_any_set_up() {
        let (_t, plugin, vm) = manager().await;
        *plugin.uncertain_stages.lock().unwrap() = 2;
        let a = vm.upsert_pod(&pod("a")).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&a, T).await.unwrap();
        assert_eq!(plugin.calls(), vec!["stage", "stage", "stage", "publish a"]);
        // Unwanted while uncertain: still unmounted (not assumed gone).
        *plugin.uncertain_stages.lock().unwrap() = 1;
        vm.delete_pod(&a);
        vm.wait_converged(Some(0), T).await.unwrap();
        let v = UniqueVolumeName::new("fake/device/shared");
        let mut rx = vm.world().subscribe();
        while vm.world().asw().volume(&v).is_some() {
            rx.changed().await.unwrap();
        }
        assert_eq!(plugin.calls().last().map(String::as_str), Some("unstage"));
    }

    /// A CSI call of `method` that failed with `code`, as the plugin
    /// classifies it for `op` (`Ok` when it means nothing is left to do).
    fn csi_error(
        op: crate::plugins::csi::errors::CsiOp,
        method: &'static str,
        code: tonic::Code,
    ) -> Result<(), VolumeError> {
        crate::plugins::csi::errors::classify(
            op,
            crate::pluginmanager::csi_client::CsiCallError::Rpc {
                driver: "d".into(),
                method,
                code,
                message: "injected".into(),
                transport: false,
            },
        )
    }

    /// Every gRPC code, failing one publish and then one unpublish (as the
    /// CSI plugin classifies it): the pod is set up, and torn down once
    /// deleted, within a few backoff steps; none stops the retries.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_grpc_code_failing_publish_and_unpublish_once_is_retried() {
        use crate::plugins::csi::errors::CsiOp;
        let (_t, plugin, vm) = manager().await;
        vm.set_populated();
        let codes = crate::plugins::csi::errors::ALL_CODES;
        let count = |c: &str| plugin.calls().iter().filter(|x| *x == c).count();
        for (i, code) in codes.into_iter().enumerate() {
            let uid = format!("p{i}");
            let publish = csi_error(CsiOp::Publish, "/csi.v1.Node/NodePublishVolume", code);
            plugin
                .fail_publish
                .lock()
                .unwrap()
                .push(publish.unwrap_err());
            let p = vm.upsert_pod(&pod(&uid)).unwrap();
            vm.wait_for_attach_and_mount(&p, T)
                .await
                .unwrap_or_else(|e| panic!("{code:?}: {e}: {:?}", plugin.calls()));
            assert_eq!(count(&format!("publish {uid}")), 2, "{code:?}");
            let unpublish = csi_error(CsiOp::Unpublish, "/csi.v1.Node/NodeUnpublishVolume", code);
            let failed = unpublish.is_err();
            if let Err(e) = unpublish {
                plugin.fail_unpublish.lock().unwrap().push(e);
            }
            vm.delete_pod(&p);
            vm.wait_for_unmount(&p, T)
                .await
                .unwrap_or_else(|e| panic!("{code:?}: {e}: {:?}", plugin.calls()));
            let want = if failed { 2 } else { 1 };
            assert_eq!(count(&format!("unpublish {uid}")), want, "{code:?}");
        }
        vm.wait_converged(Some(0), T).await.unwrap();
    }

    /// A device whose unmount (CSI NodeUnstageVolume) fails stays in
    /// status with its error and keeps the node from converging; it is
    /// retried until it is unmounted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_device_whose_unmount_fails_shows_and_is_retried_until_unmounted() {
        let (_t, plugin, vm) = manager().await;
        let a = vm.upsert_pod(&pod("a")).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&a, T).await.unwrap();
        let devices = vm.status().devices;
        assert_eq!(devices.len(), 1, "{devices:?}");
        assert_eq!((devices[0].state.as_str(), devices[0].pods), ("mounted", 1));
        *plugin.failing_unstages.lock().unwrap() = u32::MAX;
        vm.delete_pod(&a);
        vm.wait_for_unmount(&a, T).await.unwrap();
        let mut rx = vm.world().subscribe();
        let failed = loop {
            let d = vm.status().devices;
            if d.first()
                .is_some_and(|d| d.attempts >= 2 && d.error.is_some())
            {
                break d;
            }
            rx.changed().await.unwrap();
        };
        assert_eq!(failed.len(), 1);
        let d = &failed[0];
        assert_eq!(
            (d.state.as_str(), d.pods, d.operation.as_deref()),
            ("unmounting", 0, Some("unmount_device"))
        );
        assert!(d.error.as_deref().unwrap().contains("unstage refused"));
        assert!(vm.status().pods.is_empty());
        let e = vm
            .wait_converged(Some(0), Duration::from_millis(1))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("device still mounted"), "{e}");
        let text = vm.metrics_text();
        assert!(
            text.contains(
                "volmgr_volume_devices{plugin_name=\"fake/device\",state=\"unmounting\"} 1"
            ),
            "{text}"
        );
        // The driver recovers: unmounted at the next retry, and converged.
        *plugin.failing_unstages.lock().unwrap() = 0;
        vm.wait_converged(Some(0), T).await.unwrap();
        assert!(vm.status().devices.is_empty());
        assert!(!vm.metrics_text().contains("volmgr_volume_devices{"));
    }

    /// A device whose unmount fails once is unmounted at the retry.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_device_whose_unmount_fails_once_is_unmounted() {
        let (_t, plugin, vm) = manager().await;
        let a = vm.upsert_pod(&pod("a")).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&a, T).await.unwrap();
        *plugin.failing_unstages.lock().unwrap() = 1;
        vm.delete_pod(&a);
        vm.wait_converged(Some(0), T).await.unwrap();
        let v = UniqueVolumeName::new("fake/device/shared");
        assert!(vm.world().asw().volume(&v).is_none());
        let unstages = plugin.calls().iter().filter(|c| *c == "unstage").count();
        assert_eq!(unstages, 2);
    }

    /// An expansion the driver says cannot work (the kubelet's in-use
    /// expansion error and infeasible errors) is not asked again for that
    /// size, even with no backoff at all, and does not hold pods back; a
    /// larger size is asked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_infeasible_expansion_is_not_asked_again_for_that_size() {
        let (_t, plugin, vm) = manager_with(Backoff::new(Duration::ZERO, 2, Duration::ZERO)).await;
        let v = UniqueVolumeName::new("fake/device/shared");
        *plugin.size.lock().unwrap() = Some(100);
        let a = vm.upsert_pod(&pod("a")).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&a, T).await.unwrap();
        let infeasible = || {
            crate::plugins::csi::errors::classify(
                crate::plugins::csi::errors::CsiOp::Expand,
                crate::pluginmanager::csi_client::CsiCallError::Rpc {
                    driver: "d".into(),
                    method: "/csi.v1.Node/NodeExpandVolume",
                    code: tonic::Code::OutOfRange,
                    message: "too big".into(),
                    transport: false,
                },
            )
            .unwrap_err()
        };
        plugin.fail_expand.lock().unwrap().push(infeasible());
        *plugin.size.lock().unwrap() = Some(200);
        vm.world().mark_dirty([v.clone()]);
        let mut rx = vm.world().subscribe();
        // The failure is recorded (shown on the pod's volume)...
        let shown = async {
            while !vm.status().pods[0].volumes[0]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("too big"))
            {
                rx.changed().await.unwrap();
            }
        };
        tokio::time::timeout(T, shown)
            .await
            .unwrap_or_else(|_| panic!("never shown: {:?}", plugin.calls()));
        // ...then a pass over the volume (it sets up pod b) does not ask
        // for 200 again, though nothing backs off.
        let b = vm.upsert_pod(&pod("b")).unwrap();
        vm.wait_for_attach_and_mount(&b, T).await.unwrap();
        let count = |c: &str| plugin.calls().iter().filter(|x| *x == c).count();
        assert_eq!(count("expand 200"), 1, "{:?}", plugin.calls());
        // A larger size is asked, and grows it.
        *plugin.size.lock().unwrap() = Some(300);
        vm.world().mark_dirty([v.clone()]);
        while vm.world().asw().volume(&v).and_then(|av| av.size_bytes) != Some(300) {
            rx.changed().await.unwrap();
        }
        assert_eq!(count("expand 300"), 1);
    }
}
