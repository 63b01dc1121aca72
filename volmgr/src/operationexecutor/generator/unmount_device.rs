//! `UnmountDevice`: a device no pod uses any more unstaged (the kubelet's
//! `GenerateUnmountDeviceFunc`).

use std::sync::Arc;

use crate::cache::actual_state_of_world::DeviceMountState;
use crate::cache::world::World;
use crate::plugins::{DeviceUnmountRequest, VolumeError, VolumePlugin};
use crate::volume::UniqueVolumeName;

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
