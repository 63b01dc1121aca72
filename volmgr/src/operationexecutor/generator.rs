//! The kubelet's `OperationGenerator`: the bodies of the operations the
//! reconciler starts (including the removal of foreign mounts the tracer
//! found, which volmgr adds). Each calls its plugin, then records the outcome in the
//! actual state of world and tells event listeners; the executor around it
//! handles concurrency, backoff and metrics.

use std::path::PathBuf;
use std::sync::Arc;

use super::unstack::unstack;
use crate::cache::actual_state_of_world::{
    DeviceMountState, ForeignMounts, MountedPod, VolumeMountState,
};
use crate::cache::out_of_band::OutOfBandLog;
use crate::cache::world::{ClaimResize, VolumeEvent, VolumeEventKind, VolumeOperation, World};
use crate::plugins::foreign::is_foreign;
use crate::plugins::subpath;
use crate::plugins::{
    DeviceMountRequest, DeviceUnmountRequest, MountRequest, NodeExpandRequest,
    NodeExpandableVolumePlugin, UnmountRequest, VolumeError, VolumePlugin,
};
use crate::sys::mount_table::{MountTable, MountTableView};
use crate::sys::root_dir::RootDir;
use crate::sys::Mounter;
use crate::volume::{PodUid, SubPath, UniqueVolumeName};
use crate::volume::{VolumeSource, VolumeSpec};

/// The subPath bind mounts of a pod's volume
/// ([`subpath`](crate::plugins::subpath)): made after its set-up for the
/// containers that may start, later for the others, removed before its
/// tear-down.
pub struct SubPathMounts {
    /// ROOT.
    pub root: Arc<RootDir>,
    /// The mounter.
    pub mounter: Arc<dyn Mounter>,
    /// The containers' uses to bind (empty for a tear-down: what is on
    /// disk goes).
    pub subs: Vec<SubPath>,
}

impl SubPathMounts {
    /// `(container, index)` of each use.
    fn keys(&self) -> Vec<(String, usize)> {
        self.subs
            .iter()
            .map(|s| (s.container.clone(), s.index))
            .collect()
    }
}

/// Records `keys` prepared on `pod`'s mount of `volume`.
fn mark_prepared(world: &World, volume: &UniqueVolumeName, pod: &PodUid, keys: &[(String, usize)]) {
    if keys.is_empty() {
        return;
    }
    let subs = keys.iter().map(|(c, i)| (c.as_str(), *i));
    world.asw_mut().mark_sub_paths_prepared(volume, pod, subs);
}

/// `MountVolume`: set the volume up for the pod, then the subPaths of the
/// containers that may start (`subs`).
/// Success records it mounted; an uncertain failure records it uncertain
/// (so it is set up again, or torn down if no longer wanted) unless it was
/// mounted (set up again in place: it stays mounted), and so does a
/// failure of the subPaths (the volume is set up: its path is recorded); a
/// certain failure of the set-up changes nothing.
pub async fn mount_volume(
    world: Arc<World>,
    plugin: Arc<dyn VolumePlugin>,
    plugin_name: Arc<str>,
    req: MountRequest,
    subs: SubPathMounts,
) -> Result<(), VolumeError> {
    let (volume, pod, spec) = (
        req.volume_name.clone(),
        req.pod_uid.clone(),
        Arc::clone(&req.spec),
    );
    if plugin
        .device_mountable()
        .is_some_and(|d| d.can_device_mount(&spec))
        && world.asw().device_mount_state(&volume) != DeviceMountState::Mounted
    {
        // The device was unmounted (or became uncertain) since the reconciler
        // looked: nothing to do now, the next pass mounts the device first.
        return Ok(());
    }
    let keys = subs.keys();
    let mut known_mount_id = None;
    let (res, set_up) = match plugin.set_up_and_mount_id(req).await {
        Ok((path, id)) => {
            known_mount_id = id;
            let r = match expand_during_mount(&world, &plugin, &volume, &pod, &spec, &path).await {
                Ok(()) if subs.subs.is_empty() => Ok(path.clone()),
                Ok(()) => bind_sub_paths(subs, pod.clone(), spec.name.clone(), path.clone())
                    .await
                    .map(|_| path.clone()),
                Err(e) => Err(e),
            };
            (r, Some(path))
        }
        Err(e) => (Err(e), None),
    };
    // Before the lock: a syscall or two.
    let (mount_id, selinux_relabel) = match &res {
        Ok(p) => (
            known_mount_id.or_else(|| plugin.mount_id(&pod, &spec)),
            plugin.selinux_relabel(&spec, p),
        ),
        Err(_) => (None, spec.supports_selinux_relabel()),
    };
    record_mount(
        &world,
        &res,
        set_up,
        plugin_name,
        &volume,
        &pod,
        &spec,
        (mount_id, selinux_relabel),
    );
    if res.is_ok() {
        mark_prepared(&world, &volume, &pod, &keys);
    }
    let (kind, path) = match &res {
        Ok(p) => (VolumeEventKind::Mounted, Some(p.clone())),
        Err(_) => (VolumeEventKind::Failed, None),
    };
    report(
        &world,
        VolumeEvent {
            kind,
            pod_uid: pod,
            volume: spec.name.clone(),
            volume_name: volume,
            path,
            error: res.as_ref().err().map(ToString::to_string),
            operation: VolumeOperation::SetUp,
            block: spec.is_block(),
        },
    );
    res.map(|_| ())
}

/// The subPath bind mounts of `volume` of `pod`, set up at `path`.
async fn bind_sub_paths(
    subs: SubPathMounts,
    pod: PodUid,
    volume: String,
    path: PathBuf,
) -> Result<Vec<PathBuf>, VolumeError> {
    tokio::task::spawn_blocking(move || {
        subpath::set_up_sub_paths(
            &subs.root,
            subs.mounter.as_ref(),
            &pod,
            &volume,
            &path,
            &subs.subs,
        )
    })
    .await
    .map_err(VolumeError::from)
    .and_then(|r| r)
}

/// `PrepareSubPaths`: bind-mounts the subPaths of containers that may start
/// since `pod`'s volume was set up (`mounted`), as the kubelet's
/// `makeMounts` does when they start (an init container may have written
/// the file one mounts). The volume stays mounted; a failure is retried
/// with backoff and shows as the volume's error.
pub async fn prepare_sub_paths(
    world: Arc<World>,
    volume: UniqueVolumeName,
    pod: PodUid,
    mounted: MountedPod,
    subs: SubPathMounts,
) -> Result<(), VolumeError> {
    let keys = subs.keys();
    let outer = mounted.outer_volume_spec_name().to_owned();
    match bind_sub_paths(subs, pod.clone(), outer, mounted.path).await {
        Ok(_) => {
            mark_prepared(&world, &volume, &pod, &keys);
            Ok(())
        }
        Err(e) => {
            tracing::warn!(%pod, %volume, error = %e, "subPaths not prepared");
            Err(e)
        }
    }
}

/// Records the outcome of a set-up (see [`mount_volume`]); `set_up` is the
/// path when the plugin's set-up itself succeeded, `found` the mount id and
/// SELinux relabel answer the plugin gave.
#[allow(clippy::too_many_arguments)]
fn record_mount(
    world: &World,
    res: &Result<PathBuf, VolumeError>,
    set_up: Option<PathBuf>,
    plugin_name: Arc<str>,
    volume: &UniqueVolumeName,
    pod: &PodUid,
    spec: &Arc<VolumeSpec>,
    found: (Option<u64>, bool),
) {
    let (mount_id, selinux_relabel) = found;
    let mut asw = world.asw_mut();
    if let Err(VolumeError::NeedsDeviceMount(_)) = res {
        // Stage again before the next set-up.
        if asw.device_mount_state(volume) == DeviceMountState::Mounted {
            asw.set_device_mount_state(volume, DeviceMountState::Uncertain);
        }
    }
    let known = asw
        .pod_mount(volume, pod)
        .map(|m| (m.path.clone(), m.state));
    let outcome = match (res, set_up) {
        (Ok(path), _) => Some((path.clone(), VolumeMountState::Mounted)),
        // A mounted volume set up again in place (a republish, a payload
        // update) that timed out stays mounted, as in the kubelet's
        // `markVolumeErrorState`: only a volume not mounted becomes uncertain.
        (Err(e), _) if e.is_uncertain() => match known {
            Some((_, VolumeMountState::Mounted)) => None,
            k => Some((
                k.map(|k| k.0).unwrap_or_default(),
                VolumeMountState::Uncertain,
            )),
        },
        // Set up, but not expanded or not its subPaths (the kubelet's
        // `MarkVolumeMountAsUncertain` after a failed expansion).
        (Err(_), Some(path)) => Some((path, VolumeMountState::Uncertain)),
        (Err(_), None) => None,
    };
    if let Some((path, state)) = outcome {
        asw.mark_volume_as_attached(volume, plugin_name);
        asw.mark_volume_as_mounted(
            volume,
            pod,
            MountedPod {
                spec: Arc::clone(spec),
                path,
                state,
                mount_id,
                selinux_relabel,
            },
        );
    }
}

/// `UnmountVolume`: tear the pod's volume down, its subPath bind mounts
/// first (those on disk: also those a previous run left). Success removes it from the
/// actual state and, if it was the pod's last volume, queues the pod's
/// directory for clean-up. A failed tear-down leaves it uncertain (the
/// kubelet's `MarkVolumeMountAsUncertain`: set up again if the pod wants it
/// again), and it is retried with backoff like every failure.
pub async fn unmount_volume(
    world: Arc<World>,
    plugin: Arc<dyn VolumePlugin>,
    volume: UniqueVolumeName,
    pod: PodUid,
    mounted: MountedPod,
    subs: SubPathMounts,
) -> Result<(), VolumeError> {
    let outer = mounted.outer_volume_spec_name().to_owned();
    let path = mounted.path.clone();
    let block = mounted.spec.is_block();
    let (p, o) = (pod.clone(), outer.clone());
    // Most volumes have no subPath: one lookup here instead of a round trip
    // to a blocking thread (which serialised the inline tear-downs).
    let cleaned = if subpath::may_have_sub_paths(&subs.root, &pod, &outer) {
        tokio::task::spawn_blocking(move || {
            subpath::clean_sub_paths(&subs.root, subs.mounter.as_ref(), &p, &o)
        })
        .await
        .map_err(VolumeError::from)
        .and_then(|r| r)
    } else {
        Ok(())
    };
    let res = match cleaned {
        Ok(()) => {
            world.asw_mut().forget_sub_paths(&volume, &pod);
            let res = plugin
                .tear_down(UnmountRequest {
                    pod_uid: pod.clone(),
                    volume_name: volume.clone(),
                    spec: Arc::clone(&mounted.spec),
                    path: mounted.path.clone(),
                })
                .await;
            if res.is_err() {
                mark_mount_uncertain(&world, &volume, &pod, mounted);
            }
            res
        }
        Err(e) => Err(e),
    };
    let mut orphan = false;
    if res.is_ok() {
        let mut asw = world.asw_mut();
        asw.mark_volume_as_unmounted(&volume, &pod);
        orphan = !asw.pod_has_mounts(&pod);
    }
    let kind = if res.is_ok() {
        VolumeEventKind::Unmounted
    } else {
        VolumeEventKind::Failed
    };
    report(
        &world,
        VolumeEvent {
            kind,
            pod_uid: pod.clone(),
            volume: outer,
            volume_name: volume,
            path: Some(path),
            error: res.as_ref().err().map(ToString::to_string),
            operation: VolumeOperation::TearDown,
            block,
        },
    );
    if orphan {
        world.mark_pod_dirty(pod);
    }
    res
}

/// Records `pod`'s mount of `volume` as uncertain after a failed tear-down,
/// if it is still recorded as it was.
fn mark_mount_uncertain(
    world: &World,
    volume: &UniqueVolumeName,
    pod: &PodUid,
    mounted: MountedPod,
) {
    let mut asw = world.asw_mut();
    if asw
        .pod_mount(volume, pod)
        .is_some_and(|m| m.path == mounted.path && m.state == VolumeMountState::Mounted)
    {
        asw.mark_volume_as_mounted(
            volume,
            pod,
            MountedPod {
                state: VolumeMountState::Uncertain,
                ..mounted
            },
        );
    }
}

/// `MountDevice`: mount the volume's device at its global path (CSI
/// staging), once for all pods. Success records the device mounted; an
/// uncertain failure records it uncertain (so it is mounted again, or
/// unmounted once nobody wants it); a certain failure after an uncertain one
/// keeps it uncertain (unlike the kubelet, which forgets it: an unmount that
/// finds nothing is harmless, a leaked staging is not).
pub async fn mount_device(
    world: Arc<World>,
    plugin: Arc<dyn VolumePlugin>,
    plugin_name: Arc<str>,
    volume: UniqueVolumeName,
    spec: Arc<VolumeSpec>,
    fs_group: Option<i64>,
) -> Result<(), VolumeError> {
    let dm = plugin
        .device_mountable()
        .ok_or_else(|| VolumeError::Internal(format!("{plugin_name} has no device phase")))?;
    let path = dm.device_mount_path(&spec).ok();
    let res = dm
        .mount_device(DeviceMountRequest {
            volume_name: volume.clone(),
            spec: Arc::clone(&spec),
            fs_group,
        })
        .await;
    // The size the file system has: the claim's status says it (the
    // kubelet's `InitializeClaimSize`); without one, the PV's capacity.
    let size = plugin
        .node_expandable()
        .and_then(|e| e.claim_size(&spec).or_else(|| e.requested_size(&spec)));
    // Before the lock: a syscall or two.
    let mount_id = match &res {
        Ok(_) => dm.device_mount_id(&spec),
        Err(_) => None,
    };
    {
        let mut asw = world.asw_mut();
        match &res {
            Ok(p) => {
                asw.mark_volume_as_attached(&volume, plugin_name);
                asw.mark_device(
                    &volume,
                    DeviceMountState::Mounted,
                    Arc::clone(&spec),
                    Some(p.clone()),
                );
                asw.set_device_mount_id(&volume, mount_id);
                asw.set_volume_size(&volume, size);
            }
            Err(e) if e.is_uncertain() => {
                asw.mark_volume_as_attached(&volume, plugin_name);
                asw.mark_device(
                    &volume,
                    DeviceMountState::Uncertain,
                    Arc::clone(&spec),
                    path,
                );
            }
            Err(_) => {}
        }
    }
    match &res {
        Ok(p) => tracing::info!(%volume, path = %p.display(), "device mounted"),
        Err(e) => {
            tracing::warn!(%volume, error = %e, "mounting the device failed; will retry with backoff");
            let pods = world.dsw().volume(&volume).map_or_else(Vec::new, |v| {
                v.pods
                    .iter()
                    .map(|(uid, p)| {
                        (
                            uid.clone(),
                            p.outer_volume_spec_name.clone(),
                            p.spec.is_block(),
                        )
                    })
                    .collect()
            });
            report_to_pods(&world, &volume, VolumeOperation::MountDevice, pods, Err(e));
        }
    }
    res.map(|_| ())
}

/// `UnmountDevice`: unmount the volume's device (CSI unstaging) once no pod
/// has it mounted, then forget the volume. Runs only when the volume has no
/// pod mount left (checked again here: the executor keeps pod operations of
/// the volume out while this runs). A failure leaves the device uncertain
/// (the kubelet's `MarkDeviceAsUncertain`: mounted again before a new pod
/// uses it), retried with backoff.
pub async fn unmount_device(
    world: Arc<World>,
    plugin: Arc<dyn VolumePlugin>,
    volume: UniqueVolumeName,
) -> Result<(), VolumeError> {
    let (spec, path) = {
        let asw = world.asw();
        let Some(v) = asw.volume(&volume) else {
            return Ok(());
        };
        if !v.pods.is_empty() || v.device_mount_state == DeviceMountState::NotMounted {
            // A pod mounted it meanwhile, or it is already gone.
            return Ok(());
        }
        let Some(spec) = v.device_spec.clone() else {
            return Err(VolumeError::Internal(format!(
                "volume {volume}: device recorded without a spec"
            )));
        };
        (spec, v.device_mount_path.clone())
    };
    let dm = plugin
        .device_mountable()
        .ok_or_else(|| VolumeError::Internal(format!("{} has no device phase", plugin.name())))?;
    let res = dm
        .unmount_device(DeviceUnmountRequest {
            volume_name: volume.clone(),
            spec,
            device_mount_path: path,
        })
        .await;
    match &res {
        Ok(()) => {
            let mut asw = world.asw_mut();
            asw.mark_device_as_unmounted(&volume);
            asw.mark_volume_as_detached(&volume);
            tracing::info!(%volume, "device unmounted");
        }
        Err(e) => {
            let mut asw = world.asw_mut();
            if asw.device_mount_state(&volume) == DeviceMountState::Mounted {
                asw.set_device_mount_state(&volume, DeviceMountState::Uncertain);
            }
            tracing::warn!(%volume, error = %e, "unmounting the device failed; will retry with backoff")
        }
    }
    res
}

/// `ExpandVolume` (the kubelet's `NodeExpand` of an in-use volume): grow the
/// file system to the desired size and record the new size.
pub async fn expand_volume(
    world: Arc<World>,
    plugin: Arc<dyn VolumePlugin>,
    volume: UniqueVolumeName,
    spec: Arc<VolumeSpec>,
    new_size: u64,
) -> Result<(), VolumeError> {
    let (volume_path, device_mount_path, pods) = {
        let asw = world.asw();
        let Some(v) = asw.volume(&volume) else {
            return Ok(());
        };
        let Some(path) = v
            .pods
            .values()
            .find(|m| m.state == VolumeMountState::Mounted)
            .map(|m| m.path.clone())
        else {
            return Ok(());
        };
        let pods = v
            .pods
            .iter()
            .map(|(uid, m)| {
                (
                    uid.clone(),
                    m.outer_volume_spec_name().to_owned(),
                    m.spec.is_block(),
                )
            })
            .collect::<Vec<_>>();
        (path, v.device_mount_path.clone(), pods)
    };
    let ex = plugin
        .node_expandable()
        .ok_or_else(|| VolumeError::Internal(format!("{} cannot expand", plugin.name())))?;
    let res = ex
        .node_expand(NodeExpandRequest {
            volume_name: volume.clone(),
            spec: Arc::clone(&spec),
            new_size,
            volume_path,
            device_mount_path,
        })
        .await;
    match &res {
        Ok(()) => {
            world.asw_mut().set_volume_size(&volume, Some(new_size));
            tracing::info!(%volume, new_size, "volume expanded on the node");
            if let Some((pod, _, _)) = pods.first() {
                tell_claim_resized(&world, ex, &volume, pod, &spec, new_size);
            }
        }
        Err(e) if e.is_expansion_infeasible() => {
            world.asw_mut().mark_expansion_infeasible(&volume, new_size);
            tracing::warn!(%volume, new_size, error = %e,
                "the volume cannot grow to this size on the node; not trying it again");
        }
        Err(e) => tracing::warn!(%volume, error = %e, "expanding the volume failed"),
    }
    let outcome = res.as_ref().map(|()| VolumeEventKind::Expanded);
    report_to_pods(&world, &volume, VolumeOperation::NodeExpand, pods, outcome);
    res
}

/// The kubelet's `expandVolumeDuringMount`, after a set-up at `path`: a
/// volume whose claim's `status.capacity` is below its PV's capacity (the
/// claim was expanded while no pod used it) is grown (NodeExpandVolume)
/// before the pod may use it. Not a read-only volume (a
/// `FileSystemResizeFailed` event says so). The driver refusing for good
/// (`FAILED_PRECONDITION`: not while published) does not fail the set-up;
/// any other failure does (the volume is recorded uncertain, the mount
/// retried). Success records the new size, is told to the pod
/// (`FileSystemResizeSuccessful`) and to claim resize listeners (who patch
/// the claim's status).
async fn expand_during_mount(
    world: &Arc<World>,
    plugin: &Arc<dyn VolumePlugin>,
    volume: &UniqueVolumeName,
    pod: &PodUid,
    spec: &Arc<VolumeSpec>,
    path: &std::path::Path,
) -> Result<(), VolumeError> {
    let Some(ex) = plugin.node_expandable() else {
        return Ok(());
    };
    let (Some(claim), Some(want)) = (ex.claim_size(spec), ex.requested_size(spec)) else {
        return Ok(());
    };
    if claim >= want {
        return Ok(());
    }
    let this_pod = || vec![(pod.clone(), spec.name.clone(), spec.is_block())];
    let op = VolumeOperation::NodeExpand;
    if spec.read_only() {
        let e = VolumeError::InvalidSpec("requested read-only file system".into());
        tracing::warn!(%volume, %pod, "not expanding a read-only volume");
        report_to_pods(world, volume, op, this_pod(), Err(&e));
        return Ok(());
    }
    let device_mount_path = world
        .asw()
        .volume(volume)
        .and_then(|v| v.device_mount_path.clone());
    let res = ex
        .node_expand(NodeExpandRequest {
            volume_name: volume.clone(),
            spec: Arc::clone(spec),
            new_size: want,
            volume_path: path.to_path_buf(),
            device_mount_path,
        })
        .await;
    match res {
        Ok(()) => {
            world.asw_mut().set_volume_size(volume, Some(want));
            tracing::info!(%volume, %pod, new_size = want, "volume expanded during mount");
            report_to_pods(world, volume, op, this_pod(), Ok(VolumeEventKind::Expanded));
            tell_claim_resized(world, ex, volume, pod, spec, want);
            Ok(())
        }
        Err(e) if e.is_expansion_infeasible() => {
            world.asw_mut().mark_expansion_infeasible(volume, want);
            tracing::warn!(%volume, %pod, error = %e, "expanding during mount failed for good; mounting anyway");
            report_to_pods(world, volume, op, this_pod(), Err(&e));
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Tells claim resize listeners that the claim of `spec` (in the namespace
/// of `pod`) now has `size` bytes, when its `status.capacity` says less (the
/// kubelet patches the claim only then).
fn tell_claim_resized(
    world: &World,
    ex: &dyn NodeExpandableVolumePlugin,
    volume: &UniqueVolumeName,
    pod: &PodUid,
    spec: &VolumeSpec,
    size: u64,
) {
    if ex.claim_size(spec).is_none_or(|c| c >= size) {
        return;
    }
    let VolumeSource::Csi(c) = &spec.source else {
        return;
    };
    let Some(claim) = c.claim_name.clone() else {
        return;
    };
    let Some(namespace) = world.dsw().pod(pod).map(|p| p.namespace.to_string()) else {
        return;
    };
    world.claim_resized(&ClaimResize {
        namespace,
        claim,
        persistent_volume: c.pv_name.clone(),
        volume_name: volume.clone(),
        size_bytes: size,
    });
}

/// What [`remove_foreign_mounts`] works on.
pub struct ForeignMountRemoval {
    /// The shared state.
    pub world: Arc<World>,
    /// Where the finding was logged; gets the outcome.
    pub log: Arc<OutOfBandLog>,
    /// The manager's root directory.
    pub root: Arc<RootDir>,
    /// Unmounts.
    pub mounter: Arc<dyn Mounter>,
    /// The volume's plugin (what belongs on the path).
    pub plugin: Arc<dyn VolumePlugin>,
    /// The volume.
    pub volume: UniqueVolumeName,
    /// The pod.
    pub pod: PodUid,
    /// The pod's mount of the volume, as recorded when the reconciler looked.
    pub mounted: MountedPod,
    /// The finding (the actual state's mark).
    pub found: ForeignMounts,
}

/// How often the removal reads the table again and unstacks what it finds
/// before it gives up (and backs off): someone keeps mounting there.
const FOREIGN_ROUNDS: usize = 8;

/// `RemoveForeignMounts`: unmount, from the top, what was mounted over a
/// pod's volume beyond its plugin's own mounts (the tracer found and marked
/// it). The outcome goes to the out-of-band log; success clears the mark
/// (a failure keeps it, so the reconciler tries again after the backoff). If
/// what is left on the path is not the volume, it is marked uncertain, so it
/// is set up again.
pub async fn remove_foreign_mounts(op: ForeignMountRemoval) -> Result<(), VolumeError> {
    let (world, log) = (Arc::clone(&op.world), Arc::clone(&op.log));
    let (volume, pod, found) = (op.volume.clone(), op.pod.clone(), op.found);
    let res = tokio::task::spawn_blocking(move || unstack_foreign(&op))
        .await
        .map_err(VolumeError::from)
        .and_then(|r| r);
    if res.is_ok() {
        world.asw_mut().clear_foreign_mounts(&volume, &pod, found);
    }
    log.foreign_mount_handled(
        found.log_seq,
        res.as_ref().map(|_| ()).map_err(ToString::to_string),
    );
    res
}

/// The blocking part of [`remove_foreign_mounts`].
fn unstack_foreign(op: &ForeignMountRemoval) -> Result<(), VolumeError> {
    let (path, spec) = (&op.mounted.path, &op.mounted.spec);
    let still_ours = op
        .world
        .asw()
        .pod_mount(&op.volume, &op.pod)
        .is_some_and(|m| m.state == VolumeMountState::Mounted && m.path == *path);
    if !still_ours {
        return Ok(());
    }
    let read =
        || -> Result<MountTable, VolumeError> { Ok(MountTable::new(op.mounter.mount_table()?)) };
    let foreign = |t: &MountTable| is_foreign(op.plugin.as_ref(), spec, path, t);
    let mut table = read()?;
    let mut removed = 0;
    for round in 0.. {
        if !foreign(&table) {
            break;
        }
        if round == FOREIGN_ROUNDS {
            return Err(VolumeError::Internal(format!(
                "{} still has foreign mounts after {removed} unmounts",
                path.display()
            )));
        }
        let u = unstack(&op.root, op.mounter.as_ref(), path, &mut table, foreign);
        removed += u.removed;
        u.result?;
        // Read again: someone may have mounted there meanwhile.
        table = read()?;
    }
    tracing::info!(pod = %op.pod, volume = %op.mounted.outer_volume_spec_name(), removed,
        "removed foreign mounts from a volume's path");
    if !op.plugin.verify(spec, path, MountTableView::Read(&table)) {
        // What is left is not the volume (e.g. it was unmounted too): set it
        // up again.
        op.world.asw_mut().mark_volume_as_mounted(
            &op.volume,
            &op.pod,
            MountedPod {
                state: VolumeMountState::Uncertain,
                ..op.mounted.clone()
            },
        );
        op.world.emit(VolumeEvent::lost(
            op.pod.clone(),
            op.mounted.outer_volume_spec_name().to_owned(),
            op.volume.clone(),
            path.clone(),
        ));
    }
    Ok(())
}

/// Logs an outcome and delivers it to event listeners.
fn report(world: &World, ev: VolumeEvent) {
    match &ev.error {
        None => {
            tracing::info!(pod = %ev.pod_uid, volume = ev.volume, "volume {}", ev.kind.as_str())
        }
        Some(e) => {
            tracing::warn!(pod = %ev.pod_uid, volume = ev.volume, error = %e, "operation failed; will retry with backoff")
        }
    }
    world.emit(ev);
}

/// The outcome of a volume-wide operation (`MountDevice`, `NodeExpand`),
/// told to each of `pods` (uid, the volume's name in the pod, block).
fn report_to_pods(
    world: &World,
    volume: &UniqueVolumeName,
    operation: VolumeOperation,
    pods: Vec<(PodUid, String, bool)>,
    res: Result<VolumeEventKind, &VolumeError>,
) {
    for (pod_uid, outer, block) in pods {
        world.emit(VolumeEvent {
            kind: *res.as_ref().unwrap_or(&VolumeEventKind::Failed),
            pod_uid,
            volume: outer,
            volume_name: volume.clone(),
            path: None,
            error: res.as_ref().err().map(ToString::to_string),
            operation,
            block,
        });
    }
}
