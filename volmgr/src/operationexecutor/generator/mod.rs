//! The kubelet's `OperationGenerator`: the bodies of the operations the
//! reconciler starts (including the removal of foreign mounts the tracer
//! found, which volmgr adds). Each calls its plugin, then records the outcome in the
//! actual state of world and tells event listeners; the executor around it
//! handles concurrency, backoff and metrics.
//!
//! One operation per file; what several share (events to listeners) here.

mod cleanup_pod_dir;
mod expand_volume;
mod mount_device;
mod mount_volume;
mod orphan_volumes;
mod prepare_sub_paths;
mod remove_foreign_mounts;
mod sub_paths;
mod unmount_device;
mod unmount_volume;

pub use cleanup_pod_dir::cleanup_pod_dir;
pub use expand_volume::expand_volume;
pub use mount_device::mount_device;
pub use mount_volume::mount_volume;
pub use prepare_sub_paths::prepare_sub_paths;
pub use remove_foreign_mounts::{remove_foreign_mounts, ForeignMountRemoval};
pub use sub_paths::SubPathMounts;
pub use unmount_device::unmount_device;
pub use unmount_volume::unmount_volume;

use crate::cache::world::{VolumeEvent, VolumeEventKind, VolumeOperation, World};
use crate::plugins::VolumeError;
use crate::volume::{PodUid, UniqueVolumeName};

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
