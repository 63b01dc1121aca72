//! `ExpandVolume`: a volume's file system grown on the node (the kubelet's
//! `GenerateExpandInUseVolumeFunc`, and the expansion during a mount).

use std::sync::Arc;

use super::report_to_pods;
use crate::cache::actual_state_of_world::VolumeMountState;
use crate::cache::world::{ClaimResize, VolumeEventKind, VolumeOperation, World};
use crate::plugins::{NodeExpandRequest, NodeExpandableVolumePlugin, VolumeError, VolumePlugin};
use crate::volume::{PodUid, UniqueVolumeName, VolumeSource, VolumeSpec};

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
pub(super) async fn expand_during_mount(
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
pub(super) fn tell_claim_resized(
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
