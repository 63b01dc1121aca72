//! NodeStageVolume and NodeUnstageVolume (the kubelet's `csi_attacher.go`):
//! the per-volume half of a CSI mount, and the stage directories found at
//! start-up.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::errors::{classify, CsiOp};
use super::layout::{global_map_path, handle_hash, stage_layout, CSI_DIR, VOLUME_DEVICES};
use super::vol_data::{
    insert_selinux_label, key, read_vol_data, reconstructed_source, recorded_selinux_label,
    StagedRecord,
};
use super::{
    capability, context, fs_group, path_string, secrets, source, spec_vol_id, CsiPlugin,
    PLUGIN_NAME, STAGED_FILE, VOL_DATA_FILE,
};
use crate::pluginmanager::csi_client::NodeCapabilities;
use crate::pluginmanager::csi_proto::csi;
use crate::plugins::{
    DeviceMountRequest, DeviceMountableVolumePlugin, DeviceUnmountRequest, ReconstructedDevice,
    VolumeError,
};
use crate::sys::mount_table::MountTable;
use crate::sys::root_dir::RelPath;
use crate::volume::{CsiVolumeMode, CsiVolumeSource, UniqueVolumeName, VolumeSource, VolumeSpec};

#[async_trait::async_trait]
impl DeviceMountableVolumePlugin for CsiPlugin {
    /// Inline (ephemeral) volumes are published without staging, as the
    /// kubelet does.
    fn can_device_mount(&self, spec: &VolumeSpec) -> bool {
        source(spec).is_ok_and(|s| !s.ephemeral)
    }

    fn device_mount_path(&self, spec: &VolumeSpec) -> Result<PathBuf, VolumeError> {
        let src = source(spec)?;
        Ok(self.abs(&stage_layout(spec, src)?.target))
    }

    /// NodeStageVolume (the kubelet's `csiAttacher.MountDevice`): writes
    /// `vol_data.json`, calls the driver when it stages, then records the
    /// completed stage. The volume's use of the node starts here (also for
    /// drivers that do not stage: this comes before its first
    /// NodePublishVolume), within the driver's volume limit: its place is
    /// taken before the call and given back if the call certainly failed.
    async fn mount_device(&self, req: DeviceMountRequest) -> Result<PathBuf, VolumeError> {
        let src = source(&req.spec)?;
        let caps = self.capabilities(&src.driver).await?;
        let slot = self.reserve_slot(&src.driver, &req.volume_name)?;
        let res = self.stage(&req, src, caps).await;
        slot.settle(&res);
        res
    }

    /// NodeUnstageVolume (the kubelet's `csiAttacher.UnmountDevice`): drops
    /// the staged record first, so a crash mid-call leaves it uncertain.
    /// Done, the volume is no longer in use on the node.
    async fn unmount_device(&self, req: DeviceUnmountRequest) -> Result<(), VolumeError> {
        let src = source(&req.spec)?;
        self.unstage(&req, src).await?;
        self.limits.release(&src.driver, &req.volume_name);
        Ok(())
    }

    /// The id of the driver's mount at the staging path, if it mounted one
    /// there (filesystem volumes of drivers that stage, usually).
    fn device_mount_id(&self, spec: &VolumeSpec) -> Option<u64> {
        let src = source(spec).ok()?;
        let target = stage_layout(spec, src).ok()?.target;
        crate::plugins::mount_id_at(&self.root, self.mounter.as_ref(), &target)
    }

    /// Every stage directory with a `vol_data.json`; complete when the
    /// staged record is there and the mount table shows the stage (see
    /// [`staged_in_table`]). Their volumes, staged or maybe, are in use on
    /// the node.
    fn reconstruct_devices(
        &self,
        table: &MountTable,
        problems: &mut Vec<String>,
    ) -> Result<Vec<ReconstructedDevice>, VolumeError> {
        let mut out = Vec::new();
        for dir in self.stage_data_dirs()? {
            if let Some(device) = self.reconstruct_device(&dir, table, problems)? {
                out.push(device);
            }
        }
        Ok(out)
    }
}

impl CsiPlugin {
    /// Writes `vol_data.json`, calls NodeStageVolume when the driver
    /// stages (its capabilities `caps`), then records the completed stage.
    async fn stage(
        &self,
        req: &DeviceMountRequest,
        src: &CsiVolumeSource,
        caps: NodeCapabilities,
    ) -> Result<PathBuf, VolumeError> {
        let layout = stage_layout(&req.spec, src)?;
        let staged = layout.data_dir.join(STAGED_FILE)?;
        let mut data = BTreeMap::new();
        data.insert(key::DRIVER_NAME, src.driver.clone());
        data.insert(key::VOLUME_HANDLE, src.volume_handle.clone());
        data.insert(key::SPEC_VOL_ID, spec_vol_id(&req.spec, src).to_string());
        if src.volume_mode == CsiVolumeMode::Block {
            data.insert(key::VOLUME_MODE, "Block".into());
        }
        insert_selinux_label(&mut data, src, self.selinux);
        let stages = caps.stage_unstage;
        self.write_vol_data(&layout.data_dir.join(VOL_DATA_FILE)?, &data)?;
        // Staged before (NodeStage is idempotent): it may be mounted.
        self.root.mkdir_mount_target(&layout.target, 0o750)?;
        let target = self.abs(&layout.target);
        if stages {
            let call = csi::NodeStageVolumeRequest {
                volume_id: src.volume_handle.clone(),
                publish_context: super::publish_context(src),
                staging_target_path: path_string(target.clone())?,
                volume_capability: Some(capability(
                    src,
                    caps,
                    fs_group::mount_group(req.fs_group, src, caps),
                    self.selinux,
                )),
                secrets: secrets(&src.node_stage_secrets),
                volume_context: context(src),
            };
            if let Err(e) = self.clients.node_stage_volume(&src.driver, call).await {
                classify(CsiOp::Stage, e)?;
            }
        }
        // The size the file system is known to have: the claim's status
        // (a pending expansion is then still found after a restart), or,
        // without one, the PV's capacity.
        let record = serde_json::to_vec(&StagedRecord {
            capacity_bytes: src.claim_capacity_bytes.or(src.capacity_bytes),
        })
        .map_err(VolumeError::Encode)?;
        self.root
            .write_file(&staged, &record)
            .map_err(|e| VolumeError::Uncertain(e.to_string()))?;
        Ok(target)
    }

    /// Drops the staged record, calls NodeUnstageVolume when the driver
    /// stages, then removes the stage directory.
    async fn unstage(
        &self,
        req: &DeviceUnmountRequest,
        src: &CsiVolumeSource,
    ) -> Result<(), VolumeError> {
        let layout = stage_layout(&req.spec, src)?;
        let stages = self.stages(&src.driver).await?;
        if let Some(t) = &self.tokens {
            // No republishing of a volume no pod uses.
            t.forget(&req.volume_name);
        }
        self.remove_file(&layout.data_dir.join(STAGED_FILE)?)?;
        if stages {
            let call = csi::NodeUnstageVolumeRequest {
                volume_id: src.volume_handle.clone(),
                staging_target_path: path_string(self.abs(&layout.target))?,
            };
            if let Err(e) = self.clients.node_unstage_volume(&src.driver, call).await {
                classify(CsiOp::Unstage, e)?;
            }
        }
        // Never crosses a mount the driver left behind: that fails instead.
        self.root.remove_all(&layout.target)?;
        self.root.remove_all(&layout.data_dir)?;
        if src.volume_mode == CsiVolumeMode::Block {
            if let Some((pv_dir, _)) = layout.data_dir.split_last() {
                // The global map path (its per-pod entries went with the pods).
                self.root.remove_empty_dir(&pv_dir.join("dev")?)?;
                self.root.remove_empty_dir(&pv_dir)?;
            }
        }
        Ok(())
    }

    /// Whether the mount table shows the stage of `spec` at `target`: a
    /// filesystem volume's staging path is a mount point; a block volume
    /// has a mount at or below its staging path (where drivers that map
    /// the device at stage bind it), or the device is published for a pod
    /// (a mount below its publish directory or its global map path: the
    /// binds of the published device). What a
    /// driver does at stage is its own business: a stage the table cannot
    /// show is uncertain, and NodeStageVolume (idempotent) runs again, as
    /// the kubelet runs it for every volume it reconstructs.
    fn staged_in_table(
        &self,
        spec: &VolumeSpec,
        src: &CsiVolumeSource,
        target: &std::path::Path,
        table: &MountTable,
    ) -> Result<bool, VolumeError> {
        if table.is_mount_point(target) {
            return Ok(true);
        }
        if src.volume_mode != CsiVolumeMode::Block {
            return Ok(false);
        }
        let id = spec_vol_id(spec, src);
        let global = self.abs(&global_map_path(id)?);
        let published = self.abs(
            &RelPath::new(CSI_DIR)?
                .join(VOLUME_DEVICES)?
                .join("publish")?
                .join(id)?,
        );
        Ok([target, global.as_path(), published.as_path()]
            .iter()
            .any(|dir| table.below(dir).next().is_some()))
    }

    /// The directories that may hold a stage's `vol_data.json`: one per
    /// volume handle under each driver's directory, and each block PV's
    /// `data/`.
    fn stage_data_dirs(&self) -> Result<Vec<RelPath>, VolumeError> {
        let csi_dir = RelPath::new(CSI_DIR)?;
        let drivers = match self.root.read_dir(&csi_dir) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut data_dirs = Vec::new();
        for d in drivers {
            if d == VOLUME_DEVICES {
                let devices = csi_dir.join(VOLUME_DEVICES)?;
                for pv in self.root.read_dir(&devices)? {
                    if pv == "staging" || pv == "publish" {
                        continue;
                    }
                    data_dirs.push(devices.join(&pv)?.join("data")?);
                }
                continue;
            }
            let dir = csi_dir.join(&d)?;
            for h in self.root.read_dir(&dir)? {
                data_dirs.push(dir.join(&h)?);
            }
        }
        Ok(data_dirs)
    }

    /// The stage recorded in `dir`; `None` (with a problem reported when
    /// it cannot be read) when its `vol_data.json` does not name a driver
    /// and handle. An unreadable staged record (not a regular file, too
    /// large) leaves the stage uncertain, reported too; so does a staged
    /// record the mount `table` does not confirm.
    fn reconstruct_device(
        &self,
        dir: &RelPath,
        table: &MountTable,
        problems: &mut Vec<String>,
    ) -> Result<Option<ReconstructedDevice>, VolumeError> {
        let data = match read_vol_data(&self.root, &dir.join(VOL_DATA_FILE)?) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(dir = %self.abs(dir).display(), error = %e, "ignoring a CSI stage directory");
                problems.push(format!(
                    "CSI stage directory {} ignored: {e}",
                    self.abs(dir).display()
                ));
                return Ok(None);
            }
        };
        let (Some(driver), Some(handle)) =
            (data.get(key::DRIVER_NAME), data.get(key::VOLUME_HANDLE))
        else {
            return Ok(None);
        };
        let staged = match self.root.read_file(&dir.join(STAGED_FILE)?) {
            Ok(b) => serde_json::from_slice::<StagedRecord>(&b).ok(),
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                problems.push(format!("CSI stage of {driver}^{handle} is uncertain: {e}"));
                None
            }
        };
        let spec = staged_spec(&data, driver, handle);
        let src = source(&spec)?;
        let target = self.abs(&stage_layout(&spec, src)?.target);
        let confirmed = staged.is_some() && self.staged_in_table(&spec, src, &target, table)?;
        if staged.is_some() && !confirmed {
            tracing::info!(%driver, %handle, path = %target.display(),
                "staged before, but the mount table does not show it (a reboot?): staging again");
        }
        let volume_name = UniqueVolumeName::new(format!("{PLUGIN_NAME}/{driver}^{handle}"));
        self.limits.adopt(driver, &volume_name);
        Ok(Some(ReconstructedDevice {
            volume_name,
            device_mount_path: target,
            complete: confirmed,
            size_bytes: staged.and_then(|s| s.capacity_bytes),
            spec,
        }))
    }
}

/// The spec of a staged volume, from its `vol_data.json` (`data`, which
/// names `driver` and `handle`): named after the PV.
fn staged_spec(data: &BTreeMap<String, String>, driver: &str, handle: &str) -> VolumeSpec {
    let block = data.get(key::VOLUME_MODE).map(String::as_str) == Some("Block");
    let spec_vol_id = data
        .get(key::SPEC_VOL_ID)
        .cloned()
        .unwrap_or_else(|| handle_hash(handle));
    let volume_mode = if block {
        CsiVolumeMode::Block
    } else {
        CsiVolumeMode::Filesystem
    };
    let mut src = CsiVolumeSource {
        pv_name: Some(spec_vol_id.clone()),
        ..reconstructed_source(driver.to_string(), handle.to_string(), volume_mode)
    };
    recorded_selinux_label(&mut src, data);
    VolumeSpec {
        name: spec_vol_id,
        source: VolumeSource::Csi(Box::new(src)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::VolumePlugin;
    use crate::sys::mountinfo::parse_line;
    use crate::volume::PodUid;
    use std::path::Path;
    use std::sync::Arc;

    fn plugin(root: &Path) -> CsiPlugin {
        let registry = crate::pluginmanager::registry::DriverRegistry::new();
        CsiPlugin::new(
            Arc::new(crate::sys::root_dir::RootDir::open(root).unwrap()),
            crate::pluginmanager::csi_client::CsiClients::new(
                registry,
                std::time::Duration::from_secs(1),
            ),
            "node".into(),
            Arc::new(crate::sys::fake::FakeMounter::default()),
        )
    }

    /// A mount of device `dev` (`major:minor`) at `at`.
    fn mount(id: u32, dev: &str, at: &Path) -> crate::sys::mountinfo::MountInfo {
        parse_line(&format!(
            "{id} 1 {dev} / {} rw - ext4 /dev/loop0 rw",
            at.display()
        ))
        .unwrap()
    }

    /// A stage's `vol_data.json` with the kubelet's `seLinuxMountContext`
    /// gives the reconstructed spec the label it was staged with (the
    /// actual state's device context at start-up); one without, none.
    #[test]
    fn a_stage_found_on_disk_keeps_its_selinux_label() {
        let label = "system_u:object_r:container_file_t:s0:c1,c2";
        let mut data = BTreeMap::new();
        data.insert("specVolID".to_string(), "pv-1".to_string());
        let label_of = |data: &BTreeMap<String, String>| {
            let spec = staged_spec(data, "d", "h");
            crate::cache::selinux::mount_label(&spec).map(str::to_string)
        };
        assert_eq!(label_of(&data), None);
        data.insert("seLinuxMountContext".to_string(), label.to_string());
        assert_eq!(label_of(&data).as_deref(), Some(label));
    }

    /// The staged and published records are claims: complete only when the
    /// mount table shows the staging mount, and the publish mounted from
    /// the same device.
    #[test]
    fn records_are_complete_only_when_the_mount_table_agrees() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let p = plugin(&root);
        let stage = root
            .join("plugins/kubernetes.io/csi/d")
            .join(handle_hash("vol-1"));
        std::fs::create_dir_all(stage.join("globalmount")).unwrap();
        std::fs::write(
            stage.join(VOL_DATA_FILE),
            r#"{"driverName":"d","volumeHandle":"vol-1","specVolID":"pv-1"}"#,
        )
        .unwrap();
        std::fs::write(stage.join(STAGED_FILE), "{}").unwrap();
        let publish = root.join("pods/u1/volumes/kubernetes.io~csi/pv-1");
        std::fs::create_dir_all(publish.join("mount")).unwrap();
        std::fs::write(
            publish.join(VOL_DATA_FILE),
            r#"{"driverName":"d","volumeHandle":"vol-1","specVolID":"pv-1"}"#,
        )
        .unwrap();
        std::fs::write(publish.join(crate::plugins::csi::PUBLISHED_FILE), "").unwrap();
        let pod = PodUid::new("u1").unwrap();
        let check = |table: Vec<crate::sys::mountinfo::MountInfo>| {
            let table = MountTable::new(table);
            let mut problems = Vec::new();
            let devices = p.reconstruct_devices(&table, &mut problems).unwrap();
            assert_eq!(devices.len(), 1, "{problems:?}");
            let volume = p.reconstruct(&pod, "pv-1", &table).unwrap().unwrap();
            (devices[0].complete, volume.complete)
        };
        // After a reboot: nothing mounted, both records are claims only.
        assert_eq!(check(vec![]), (false, false));
        // The staging mount gone, the publish still there (unmounted behind
        // the manager's back): the stage is uncertain.
        let published = mount(10, "7:1", &publish.join("mount"));
        assert_eq!(check(vec![published.clone()]), (false, true));
        // Both there, the publish made from the staging mount's device.
        let staged = mount(11, "7:1", &stage.join("globalmount"));
        assert_eq!(check(vec![staged.clone(), published]), (true, true));
        // The publish is of another device (the node's disk, bound from an
        // empty staging directory): not the volume.
        let elsewhere = mount(12, "8:1", &publish.join("mount"));
        assert_eq!(check(vec![staged, elsewhere]), (true, false));
    }
}
