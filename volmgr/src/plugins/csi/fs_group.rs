//! The pod's `fsGroup` on a CSI volume, as the kubelet's `csiMountMgr`
//! applies it: handed to a driver with the `VOLUME_MOUNT_GROUP` node
//! capability (`volume_mount_group`), otherwise applied by the manager
//! after NodePublishVolume when the driver's fsGroupPolicy allows
//! (`supportsFSGroup`: without a CSIDriver object the policy is
//! `ReadWriteOnceWithFSType` — a file system type, and a ReadWriteOnce or
//! inline volume), honouring the pod's `fsGroupChangePolicy`.

use std::os::fd::AsFd;
use std::path::Path;

use crate::pluginmanager::csi_client::NodeCapabilities;
use crate::plugins::volume_ownership::set_volume_ownership;
use crate::plugins::{MountRequest, VolumeError};
use crate::volume::{CsiAccessMode, CsiFsGroupPolicy, CsiVolumeMode, CsiVolumeSource};

/// `volume_mount_group` for NodeStageVolume and NodePublishVolume: the
/// pod's `fs_group` when the driver applies it itself, else empty.
pub(super) fn mount_group(
    fs_group: Option<i64>,
    src: &CsiVolumeSource,
    caps: NodeCapabilities,
) -> String {
    let policy_none = src.driver_info.fs_group_policy == CsiFsGroupPolicy::None;
    match (fs_group, caps.volume_mount_group, src.volume_mode) {
        (Some(gid), true, CsiVolumeMode::Filesystem) if !policy_none => gid.to_string(),
        _ => String::new(),
    }
}

/// The kubelet's `supportsFSGroup` under the driver's `fsGroupPolicy`:
/// never read-only volumes nor under `None`; always under `File`; under
/// the default `ReadWriteOnceWithFSType`, a file system type given and a
/// ReadWriteOnce(Pod) or inline volume.
fn manager_applies(src: &CsiVolumeSource) -> bool {
    if src.volume_mode != CsiVolumeMode::Filesystem || src.read_only {
        return false;
    }
    match src.driver_info.fs_group_policy {
        CsiFsGroupPolicy::None => false,
        CsiFsGroupPolicy::File => true,
        CsiFsGroupPolicy::ReadWriteOnceWithFsType => {
            let single_writer = matches!(
                src.access_mode,
                CsiAccessMode::SingleNodeWriter | CsiAccessMode::SingleNodeSingleWriter
            );
            src.fs_type.as_deref().is_some_and(|t| !t.is_empty())
                && (single_writer || src.ephemeral)
        }
    }
}

/// After a successful NodePublishVolume at `target`: gives the volume the
/// pod's fsGroup unless the driver did or the policy says not to. The
/// volume is mounted by then, so a failure leaves it uncertain (it is
/// cleaned up or retried), as in the kubelet.
pub(super) async fn apply(
    req: &MountRequest,
    src: &CsiVolumeSource,
    caps: NodeCapabilities,
    target: &Path,
) -> Result<(), VolumeError> {
    let Some(gid) = req.fs_group else {
        return Ok(());
    };
    if caps.volume_mount_group || !manager_applies(src) {
        return Ok(());
    }
    let gid = u32::try_from(gid)
        .map_err(|_| VolumeError::InvalidSpec(format!("fsGroup {gid} is out of range")))?;
    let target = target.to_path_buf();
    let policy = req.fs_group_change_policy;
    let walk = tokio::task::spawn_blocking(move || {
        let dir = std::fs::File::open(&target)
            .map_err(|e| crate::sys::SyscallError::io("open", &target, e))?;
        set_volume_ownership(dir.as_fd(), &target, gid, false, policy)
    })
    .await
    .map_err(|e| VolumeError::Internal(format!("fsGroup walk: {e}")))?;
    match walk {
        Ok(_) => Ok(()),
        Err(e) => Err(VolumeError::Uncertain(format!(
            "applyFSGroup failed for volume {}: {e}",
            src.volume_handle
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(access_mode: CsiAccessMode, fs: Option<&str>, read_only: bool) -> CsiVolumeSource {
        CsiVolumeSource {
            pv_name: Some("pv".into()),
            read_only,
            fs_type: fs.map(String::from),
            access_mode,
            ..CsiVolumeSource::new("d", "h")
        }
    }

    #[test]
    fn the_default_policy_needs_an_fs_type_and_a_single_writer() {
        assert!(manager_applies(&src(
            CsiAccessMode::SingleNodeWriter,
            Some("ext4"),
            false
        )));
        assert!(manager_applies(&src(
            CsiAccessMode::SingleNodeSingleWriter,
            Some("xfs"),
            false
        )));
        assert!(!manager_applies(&src(
            CsiAccessMode::SingleNodeWriter,
            None,
            false
        )));
        assert!(!manager_applies(&src(
            CsiAccessMode::SingleNodeWriter,
            Some("ext4"),
            true
        )));
        assert!(!manager_applies(&src(
            CsiAccessMode::MultiNodeMultiWriter,
            Some("ext4"),
            false
        )));
    }

    /// `fsGroupPolicy: File` walks any writable volume; `None` none, and
    /// never hands the group to a driver with VOLUME_MOUNT_GROUP.
    #[test]
    fn the_csidriver_policy_decides() {
        let with = |policy: CsiFsGroupPolicy, read_only: bool| {
            let mut s = src(CsiAccessMode::MultiNodeMultiWriter, None, read_only);
            std::sync::Arc::make_mut(&mut s.driver_info).fs_group_policy = policy;
            s
        };
        assert!(manager_applies(&with(CsiFsGroupPolicy::File, false)));
        assert!(!manager_applies(&with(CsiFsGroupPolicy::File, true)));
        let mut none = with(CsiFsGroupPolicy::None, false);
        none.fs_type = Some("ext4".into());
        none.access_mode = CsiAccessMode::SingleNodeWriter;
        assert!(!manager_applies(&none));
        let req = MountRequest {
            pod_uid: crate::volume::PodUid::new("00000000-0000-0000-0000-000000000001").unwrap(),
            volume_name: crate::volume::UniqueVolumeName::new("v"),
            spec: std::sync::Arc::new(crate::volume::VolumeSpec {
                name: "v".into(),
                source: crate::volume::VolumeSource::Csi(Box::new(none.clone())),
            }),
            fs_group: Some(1000),
            fs_group_change_policy: Default::default(),
            selinux_label: None,
        };
        let caps = NodeCapabilities {
            volume_mount_group: true,
            ..Default::default()
        };
        assert_eq!(mount_group(req.fs_group, &none, caps), "");
        let file = with(CsiFsGroupPolicy::File, false);
        assert_eq!(mount_group(req.fs_group, &file, caps), "1000");
    }
}
