//! `MountDevice`: a volume's device staged once for every pod (the
//! kubelet's `GenerateMountVolumeFunc` device half, CSI's NodeStageVolume).

use std::sync::Arc;

use super::report_to_pods;
use crate::cache::actual_state_of_world::DeviceMountState;
use crate::cache::world::{VolumeOperation, World};
use crate::plugins::{DeviceMountRequest, VolumeError, VolumePlugin};
use crate::volume::{UniqueVolumeName, VolumeSpec};

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
                            p.outer_volume_spec_name().to_string(),
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
