//! `MountVolume`: a volume set up for a pod (the kubelet's
//! `GenerateMountVolumeFunc`).

use std::path::PathBuf;
use std::sync::Arc;

use super::expand_volume::expand_during_mount;
use super::report;
use super::sub_paths::{bind_sub_paths, mark_prepared, SubPathMounts};
use crate::cache::actual_state_of_world::{DeviceMountState, MountedPod, VolumeMountState};
use crate::cache::world::{VolumeEvent, VolumeEventKind, VolumeOperation, World};
use crate::plugins::{MountRequest, VolumeError, VolumePlugin};
use crate::volume::{PodUid, UniqueVolumeName, VolumeSpec};

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

/// Records the outcome of a set-up (see [`mount_volume`]); `set_up` is the
/// path when the plugin's set-up itself succeeded, `found` the mount id and
/// SELinux relabel answer the plugin gave.
#[allow(clippy::too_many_arguments)]
pub(super) fn record_mount(
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
        asw.add_pod_selinux_mount_context(volume, crate::cache::selinux::mount_label(spec));
    }
}
