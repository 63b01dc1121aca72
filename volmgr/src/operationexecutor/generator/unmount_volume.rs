//! `UnmountVolume`: a pod's volume torn down (the kubelet's
//! `GenerateUnmountVolumeFunc`).

use std::sync::Arc;

use super::report;
use super::sub_paths::SubPathMounts;
use crate::cache::actual_state_of_world::{MountedPod, VolumeMountState};
use crate::cache::world::{VolumeEvent, VolumeEventKind, VolumeOperation, World};
use crate::plugins::{subpath, UnmountRequest, VolumeError, VolumePlugin};
use crate::volume::{PodUid, UniqueVolumeName};

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
pub(super) fn mark_mount_uncertain(
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
