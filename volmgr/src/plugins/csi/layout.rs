//! Where the kubelet keeps a CSI volume's files: the stage directory (per
//! volume) and the publish directory (per pod), for filesystem and block
//! volumes (see the layout in [the module](super)).

use sha2::Digest;

use super::{spec_vol_id, PLUGIN_NAME, PUBLISHED_FILE};
use crate::plugins::escape_plugin_name;
use crate::sys::root_dir::{PathError, RelPath};
use crate::volume::{CsiVolumeMode, CsiVolumeSource, PodUid, VolumeSpec};

/// Where the kubelet keeps the CSI plugin's files, under the root.
pub(super) const CSI_DIR: [&str; 3] = ["plugins", "kubernetes.io", "csi"];
/// The block volumes' directory under [`CSI_DIR`].
pub(super) const VOLUME_DEVICES: &str = "volumeDevices";

/// Hex SHA-256 of the volume handle (the kubelet's staging directory name).
pub fn handle_hash(handle: &str) -> String {
    sha2::Sha256::digest(handle.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Where a volume's stage files live, and its staging target.
pub(super) struct StageLayout {
    /// Directory holding `vol_data.json` and the staged record.
    pub(super) data_dir: RelPath,
    /// `staging_target_path`.
    pub(super) target: RelPath,
}

/// The stage layout of `spec` (filesystem: per volume handle; block: per PV).
pub(super) fn stage_layout(
    spec: &VolumeSpec,
    src: &CsiVolumeSource,
) -> Result<StageLayout, PathError> {
    let csi_dir = RelPath::new(CSI_DIR)?;
    match src.volume_mode {
        CsiVolumeMode::Filesystem => {
            let data_dir = csi_dir
                .join(&src.driver)?
                .join(handle_hash(&src.volume_handle))?;
            let target = data_dir.join("globalmount")?;
            Ok(StageLayout { data_dir, target })
        }
        CsiVolumeMode::Block => {
            let id = spec_vol_id(spec, src);
            let devices = csi_dir.join(VOLUME_DEVICES)?;
            Ok(StageLayout {
                data_dir: devices.join(id)?.join("data")?,
                target: devices.join("staging")?.join(id)?,
            })
        }
    }
}

/// Where a pod's publish files live, and its publish target.
pub(super) struct PublishLayout {
    /// Directory holding `vol_data.json` and the published record.
    pub(super) data_dir: RelPath,
    /// `target_path`.
    pub(super) target: RelPath,
    /// Block: the pod's view, a symlink to the target named after the PV
    /// (the kubelet's `GetPodDeviceMapPath`: the spec name).
    pub(super) pod_link: Option<RelPath>,
    /// Block: where an older volmgr put the pod's view (named after the
    /// pod's volume), when that is another name: removed if it points at
    /// the target.
    pub(super) legacy_link: Option<RelPath>,
    /// Block: the pod's entry in the global map path
    /// (`volumeDevices/<pv>/dev/<uid>`), a bind mount of the published
    /// device file that keeps the device busy while the pod uses it.
    pub(super) global_map: Option<RelPath>,
    /// volmgr's record of the completed publish.
    pub(super) marker: RelPath,
}

/// The kubelet's global map path of block volume `id` (`GetGlobalMapPath`):
/// `plugins/kubernetes.io/csi/volumeDevices/<pv>/dev`, one bind mount of
/// the device per pod in it.
pub(super) fn global_map_path(id: &str) -> Result<RelPath, PathError> {
    RelPath::new(CSI_DIR)?
        .join(VOLUME_DEVICES)?
        .join(id)?
        .join("dev")
}

/// The publish layout of `spec` for `pod`.
pub(super) fn publish_layout(
    pod: &PodUid,
    spec: &VolumeSpec,
    src: &CsiVolumeSource,
) -> Result<PublishLayout, PathError> {
    let id = spec_vol_id(spec, src);
    let escaped = escape_plugin_name(PLUGIN_NAME);
    match src.volume_mode {
        CsiVolumeMode::Filesystem => {
            let data_dir = RelPath::new(["pods", pod.as_str(), "volumes", &escaped, id])?;
            let target = data_dir.join("mount")?;
            Ok(PublishLayout {
                marker: data_dir.join(PUBLISHED_FILE)?,
                data_dir,
                target,
                pod_link: None,
                legacy_link: None,
                global_map: None,
            })
        }
        CsiVolumeMode::Block => {
            let devices = RelPath::new(CSI_DIR)?.join(VOLUME_DEVICES)?;
            let publish_dir = devices.join("publish")?.join(id)?;
            let pod_dir = RelPath::new(["pods", pod.as_str(), "volumeDevices", &escaped])?;
            Ok(PublishLayout {
                // Beside the PV's vol_data.json, one per pod.
                marker: devices
                    .join(id)?
                    .join("data")?
                    .join(format!("{PUBLISHED_FILE}-{pod}"))?,
                target: publish_dir.join(pod.as_str())?,
                data_dir: publish_dir,
                pod_link: Some(pod_dir.join(id)?),
                legacy_link: if spec.name == id {
                    None
                } else {
                    Some(pod_dir.join(&spec.name)?)
                },
                global_map: Some(global_map_path(id)?.join(pod.as_str())?),
            })
        }
    }
}

/// Where a staged CSI volume shows in the mount table (absolute, under
/// the kubelet's root): what tells a person the device is still in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMountPaths {
    /// The staging target: a filesystem volume's `globalmount` (mounted
    /// there); a block volume's `volumeDevices/staging/<pv>` (where a
    /// driver that maps the device at stage binds it).
    pub staging: std::path::PathBuf,
    /// The stage's `vol_data.json`.
    pub vol_data: std::path::PathBuf,
    /// A block volume's global map path (`GetGlobalMapPath`:
    /// `volumeDevices/<pv>/dev`, one bind mount of the device per pod).
    pub global_map: Option<std::path::PathBuf>,
    /// A block volume's publish directory (`volumeDevices/publish/<pv>`,
    /// the driver's publish per pod).
    pub publish: Option<std::path::PathBuf>,
}

/// The [`DeviceMountPaths`] of the staged `spec` under `root`; `None` when
/// `spec` is not a CSI volume (or names no valid path).
pub fn device_mount_paths(root: &std::path::Path, spec: &VolumeSpec) -> Option<DeviceMountPaths> {
    let crate::volume::VolumeSource::Csi(src) = &spec.source else {
        return None;
    };
    let stage = stage_layout(spec, src).ok()?;
    let abs = |r: &RelPath| root.join(r.as_path());
    let (global_map, publish) = match src.volume_mode {
        CsiVolumeMode::Filesystem => (None, None),
        CsiVolumeMode::Block => {
            let id = spec_vol_id(spec, src);
            let publish = RelPath::new(CSI_DIR)
                .and_then(|d| d.join(VOLUME_DEVICES)?.join("publish")?.join(id))
                .ok()?;
            (Some(abs(&global_map_path(id).ok()?)), Some(abs(&publish)))
        }
    };
    Some(DeviceMountPaths {
        staging: abs(&stage.target),
        vol_data: abs(&stage.data_dir.join(super::VOL_DATA_FILE).ok()?),
        global_map,
        publish,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::csi::source;
    use crate::volume::{CsiAccessMode, VolumeSource};
    use std::collections::BTreeMap;

    fn spec(mode: CsiVolumeMode, ephemeral: bool) -> VolumeSpec {
        VolumeSpec {
            name: "data".into(),
            source: VolumeSource::Csi(Box::new(CsiVolumeSource {
                driver: "hostpath.csi.k8s.io".into(),
                volume_handle: "vol-1".into(),
                ephemeral,
                pv_name: (!ephemeral).then(|| "pv-1".to_string()),
                claim_name: None,
                read_only: false,
                fs_type: Some("ext4".into()),
                volume_mode: mode,
                access_mode: CsiAccessMode::SingleNodeWriter,
                volume_attributes: BTreeMap::new(),
                mount_options: vec![],
                capacity_bytes: Some(1 << 26),
                claim_capacity_bytes: None,
                node_stage_secrets: None,
                node_publish_secrets: None,
                node_expand_secrets: None,
                supplemental_gid: None,
                driver_info: Default::default(),
                migrated_from: None,
            })),
        }
    }

    #[test]
    fn kubelet_layout() {
        let s = spec(CsiVolumeMode::Filesystem, false);
        let src = source(&s).unwrap();
        let st = stage_layout(&s, src).unwrap();
        assert_eq!(
            st.target.as_path(),
            std::path::Path::new(&format!(
                "plugins/kubernetes.io/csi/hostpath.csi.k8s.io/{}/globalmount",
                handle_hash("vol-1")
            ))
        );
        assert_eq!(handle_hash("vol-1").len(), 64);
        let pod = PodUid::new("u1").unwrap();
        let p = publish_layout(&pod, &s, src).unwrap();
        assert_eq!(
            p.target.as_path(),
            std::path::Path::new("pods/u1/volumes/kubernetes.io~csi/pv-1/mount")
        );
        let b = spec(CsiVolumeMode::Block, false);
        let src = source(&b).unwrap();
        let st = stage_layout(&b, src).unwrap();
        assert_eq!(
            st.target.as_path(),
            std::path::Path::new("plugins/kubernetes.io/csi/volumeDevices/staging/pv-1")
        );
        let p = publish_layout(&pod, &b, src).unwrap();
        assert_eq!(
            p.target.as_path(),
            std::path::Path::new("plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/u1")
        );
        // GetPodDeviceMapPath: named after the PV, not the pod's volume.
        assert_eq!(
            p.pod_link.unwrap().as_path(),
            std::path::Path::new("pods/u1/volumeDevices/kubernetes.io~csi/pv-1")
        );
        assert_eq!(
            p.legacy_link.unwrap().as_path(),
            std::path::Path::new("pods/u1/volumeDevices/kubernetes.io~csi/data")
        );
        // GetGlobalMapPath + the pod's UID: the bind mount of the device.
        assert_eq!(
            p.global_map.unwrap().as_path(),
            std::path::Path::new("plugins/kubernetes.io/csi/volumeDevices/pv-1/dev/u1")
        );
        // Where observe mode looks for a staged block volume's mounts.
        let d = device_mount_paths(std::path::Path::new("/r"), &b).unwrap();
        let devices = std::path::Path::new("/r/plugins/kubernetes.io/csi/volumeDevices");
        assert_eq!(d.staging, devices.join("staging/pv-1"));
        assert_eq!(d.vol_data, devices.join("pv-1/data/vol_data.json"));
        assert_eq!(d.global_map, Some(devices.join("pv-1/dev")));
        assert_eq!(d.publish, Some(devices.join("publish/pv-1")));
        let d = device_mount_paths(std::path::Path::new("/r"), &s).unwrap();
        assert_eq!(d.staging.file_name().unwrap(), "globalmount");
        assert_eq!(d.vol_data, d.staging.with_file_name("vol_data.json"));
        assert_eq!((d.global_map, d.publish), (None, None));
    }

    #[test]
    fn a_driver_name_cannot_escape_root() {
        let mut s = spec(CsiVolumeMode::Filesystem, false);
        if let VolumeSource::Csi(c) = &mut s.source {
            c.driver = "..".into();
        }
        assert!(stage_layout(&s, source(&s).unwrap()).is_err());
    }
}
