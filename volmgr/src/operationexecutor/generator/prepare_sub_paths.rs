//! `PrepareSubPaths`: the subPaths of containers that may start now, on a
//! volume already set up.

use std::sync::Arc;

use super::sub_paths::{bind_sub_paths, mark_prepared, SubPathMounts};
use crate::cache::actual_state_of_world::MountedPod;
use crate::cache::world::World;
use crate::plugins::VolumeError;
use crate::volume::{PodUid, UniqueVolumeName};

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
