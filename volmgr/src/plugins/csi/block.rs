//! Block volumes (`volumeMode: Block`), as the kubelet's `csi_block.go`:
//! the pod's view of a published device is a symlink, and at start-up the
//! pod's symlinks are how its block volumes are found again.

use std::path::PathBuf;

use super::layout::{CSI_DIR, VOLUME_DEVICES};
use super::vol_data::{key, read_vol_data, reconstructed_source};
use super::{CsiPlugin, PLUGIN_NAME, PUBLISHED_FILE, VOL_DATA_FILE};
use crate::plugins::{escape_plugin_name, ReconstructedVolume, VolumeError};
use crate::sys::mount_table::MountTable;
use crate::sys::root_dir::{RelPath, RootDir};
use crate::volume::{CsiVolumeMode, CsiVolumeSource, PodUid, VolumeSource, VolumeSpec};

impl CsiPlugin {
    /// The block volumes of `pod`: each symlink in
    /// `pods/<uid>/volumeDevices/kubernetes.io~csi/` that points at this
    /// pod's publish target of a PV, with the PV's `vol_data.json`; complete
    /// when the target is mounted.
    pub(super) fn block_volumes_of(
        &self,
        pod: &PodUid,
        table: &MountTable,
    ) -> Result<Vec<ReconstructedVolume>, VolumeError> {
        let escaped = escape_plugin_name(PLUGIN_NAME);
        let dir = RelPath::new(["pods", pod.as_str(), "volumeDevices", &escaped])?;
        let names = match self.root.read_dir(&dir) {
            Ok(n) => n,
            Err(e) if e.is_not_found() => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let fd = self.root.open_dir(&dir)?;
        let publish_base = self.abs(
            &RelPath::new(CSI_DIR)?
                .join(VOLUME_DEVICES)?
                .join("publish")?,
        );
        let mut out = Vec::new();
        for name in names {
            let target = PathBuf::from(
                nix::fcntl::readlinkat(&fd, name.as_os_str())
                    .map_err(|e| crate::sys::SyscallError::new("readlinkat", self.abs(&dir), e))?,
            );
            // Only a link to this pod's own publish target counts.
            let parts: Vec<_> = match target.strip_prefix(&publish_base) {
                Ok(rest) => rest.iter().collect(),
                Err(_) => continue,
            };
            let [pv, uid] = parts.as_slice() else {
                continue;
            };
            if *uid != pod.as_str() {
                continue;
            }
            let data_dir = RelPath::new(CSI_DIR)?
                .join(VOLUME_DEVICES)?
                .join(pv)?
                .join("data")?;
            let data = read_vol_data(&self.root, &data_dir.join(VOL_DATA_FILE)?)?;
            let (Some(driver), Some(handle)) =
                (data.get(key::DRIVER_NAME), data.get(key::VOLUME_HANDLE))
            else {
                continue;
            };
            let Some(outer) = name.to_str() else { continue };
            let marker = data_dir.join(format!("{PUBLISHED_FILE}-{pod}"))?;
            let complete = self.root.exists(&marker)? && table.is_mount_point(&target);
            out.push(ReconstructedVolume {
                spec: VolumeSpec {
                    name: outer.to_string(),
                    source: VolumeSource::Csi(CsiVolumeSource {
                        pv_name: Some(pv.to_string_lossy().into_owned()),
                        ..reconstructed_source(driver.clone(), handle.clone(), CsiVolumeMode::Block)
                    }),
                },
                path: self.abs(&dir.join(outer)?),
                complete,
            });
        }
        Ok(out)
    }
}

/// Creates the pod's view of a published block device: a symlink at `link`
/// to `target` (replacing a stale one).
pub(super) fn link_block_device(
    root: &RootDir,
    link: &RelPath,
    target: &std::path::Path,
) -> Result<(), VolumeError> {
    let (parent, name) = link
        .split_last()
        .ok_or_else(|| VolumeError::Internal("empty link path".into()))?;
    let dir = root.mkdir_all(&parent, 0o750)?;
    match nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(crate::sys::SyscallError::new("unlinkat", root.abs(link), e).into()),
    }
    nix::unistd::symlinkat(target, &dir, name)
        .map_err(|e| crate::sys::SyscallError::new("symlinkat", root.abs(link), e))?;
    Ok(())
}
