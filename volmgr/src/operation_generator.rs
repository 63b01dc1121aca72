//! The kubelet's `OperationGenerator`: the bodies of the operations the
//! reconciler starts. Each calls its plugin, then records the outcome in the
//! actual state of world and tells event listeners; the executor around it
//! handles concurrency, backoff and metrics.

use std::path::PathBuf;
use std::sync::Arc;

use crate::cache::actual_state_of_world::{MountedPod, VolumeMountState};
use crate::plugins::{MountRequest, UnmountRequest, VolumeError, VolumePlugin};
use crate::volume::{PodUid, UniqueVolumeName};
use crate::world::{VolumeEvent, VolumeEventKind, World};

/// `MountVolume`: set the volume up for the pod. Success records it mounted;
/// an uncertain failure records it uncertain (so it is set up again, or torn
/// down if no longer wanted); a certain failure changes nothing.
pub async fn mount_volume(
    world: Arc<World>,
    plugin: Arc<dyn VolumePlugin>,
    plugin_name: Arc<str>,
    req: MountRequest,
) -> Result<(), VolumeError> {
    let (volume, pod, spec) = (
        req.volume_name.clone(),
        req.pod_uid.clone(),
        Arc::clone(&req.spec),
    );
    let res = plugin.set_up(req).await;
    {
        let mut asw = world.asw_mut();
        let known_path = || asw.pod_mount(&volume, &pod).map(|m| m.path.clone());
        let outcome = match &res {
            Ok(path) => Some((path.clone(), VolumeMountState::Mounted)),
            Err(e) if e.is_uncertain() => Some((
                known_path().unwrap_or_default(),
                VolumeMountState::Uncertain,
            )),
            Err(_) => None,
        };
        if let Some((path, state)) = outcome {
            asw.mark_volume_as_attached(&volume, plugin_name);
            asw.mark_volume_as_mounted(
                &volume,
                &pod,
                MountedPod {
                    outer_volume_spec_name: spec.name.clone(),
                    spec: Arc::clone(&spec),
                    path,
                    state,
                },
            );
        }
    }
    let (kind, path) = match &res {
        Ok(p) => (VolumeEventKind::Mounted, Some(p.clone())),
        Err(_) => (VolumeEventKind::Failed, None),
    };
    report(
        &world,
        kind,
        &pod,
        &spec.name,
        &volume,
        path,
        res.as_ref().err(),
    );
    res.map(|_| ())
}

/// `UnmountVolume`: tear the pod's volume down. Success removes it from the
/// actual state and, if it was the pod's last volume, queues the pod's
/// directory for clean-up.
pub async fn unmount_volume(
    world: Arc<World>,
    plugin: Arc<dyn VolumePlugin>,
    volume: UniqueVolumeName,
    pod: PodUid,
    mounted: MountedPod,
) -> Result<(), VolumeError> {
    let outer = mounted.outer_volume_spec_name.clone();
    let path = mounted.path.clone();
    let res = plugin
        .tear_down(UnmountRequest {
            pod_uid: pod.clone(),
            volume_name: volume.clone(),
            spec: mounted.spec,
            path: mounted.path,
        })
        .await;
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
        kind,
        &pod,
        &outer,
        &volume,
        Some(path),
        res.as_ref().err(),
    );
    if orphan {
        world.mark_pod_dirty(pod);
    }
    res
}

/// Logs an outcome and delivers it to event listeners.
fn report(
    world: &World,
    kind: VolumeEventKind,
    pod: &PodUid,
    outer: &str,
    volume: &UniqueVolumeName,
    path: Option<PathBuf>,
    error: Option<&VolumeError>,
) {
    match error {
        None => tracing::info!(pod = %pod, volume = outer, "volume {}", kind.as_str()),
        Some(e) => {
            tracing::warn!(pod = %pod, volume = outer, error = %e, "operation failed; will retry with backoff")
        }
    }
    world.emit(VolumeEvent {
        kind,
        pod_uid: pod.clone(),
        volume: outer.to_string(),
        volume_name: volume.clone(),
        path,
        error: error.map(ToString::to_string),
    });
}
