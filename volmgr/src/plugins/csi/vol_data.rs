//! The kubelet's `vol_data.json` and volmgr's staged record: what is kept
//! on disk next to a stage or publish directory, and read back at start-up.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::plugins::VolumeError;
use crate::sys::root_dir::{RelPath, RootDir};
use crate::volume::{CsiVolumeMode, CsiVolumeSource};

/// `vol_data.json` keys (the kubelet's `volDataKey`), plus volmgr's own.
pub(super) mod key {
    pub const SPEC_VOL_ID: &str = "specVolID";
    pub const VOLUME_HANDLE: &str = "volumeHandle";
    pub const DRIVER_NAME: &str = "driverName";
    pub const NODE_NAME: &str = "nodeName";
    pub const LIFECYCLE_MODE: &str = "volumeLifecycleMode";
    pub const SELINUX_MOUNT_CONTEXT: &str = "seLinuxMountContext";
    pub const OUTER_NAME: &str = "volmgr.outerVolumeName";
    pub const VOLUME_MODE: &str = "volmgr.volumeMode";
    pub const READ_ONLY: &str = "volmgr.readOnly";
}

/// The staged record's contents.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StagedRecord {
    /// The size the volume was staged (or last expanded) with.
    pub(super) capacity_bytes: Option<u64>,
}

/// Reads the `vol_data.json` at `rel`.
pub(super) fn read_vol_data(
    root: &RootDir,
    rel: &RelPath,
) -> Result<BTreeMap<String, String>, VolumeError> {
    let bytes = root.read_file(rel)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| VolumeError::InvalidSpec(format!("{}: {e}", root.abs(rel).display())))
}

/// The source of a volume found on disk at start-up: the driver and handle
/// `vol_data.json` recorded, everything else at the defaults a reconstructed
/// volume gets (a PV's name and read-only flag are the callers' to set).
pub(super) fn reconstructed_source(
    driver: String,
    volume_handle: String,
    volume_mode: CsiVolumeMode,
) -> CsiVolumeSource {
    CsiVolumeSource {
        volume_mode,
        ..CsiVolumeSource::new(driver, volume_handle)
    }
}

/// Records in `data` the SELinux label `src` is mounted with (`context=`;
/// only on a host with SELinux, `selinux`), as the kubelet's `MountDevice`
/// and `SetUpAt` do: the key only with a label.
pub(super) fn insert_selinux_label(
    data: &mut BTreeMap<&str, String>,
    src: &CsiVolumeSource,
    selinux: bool,
) {
    if let Some(l) = src
        .driver_info
        .selinux_mount_label
        .as_ref()
        .filter(|_| selinux)
    {
        data.insert(key::SELINUX_MOUNT_CONTEXT, l.clone());
    }
}

/// Gives `src`, found on disk, the SELinux label its `vol_data.json`
/// recorded (the kubelet's `ConstructVolumeSpec` reads it the same way),
/// if any: a pod that needs another label then waits for the volume to be
/// mounted again with it. An older record without the key gives none.
pub(super) fn recorded_selinux_label(src: &mut CsiVolumeSource, data: &BTreeMap<String, String>) {
    let Some(l) = data
        .get(key::SELINUX_MOUNT_CONTEXT)
        .filter(|l| !l.is_empty())
    else {
        return;
    };
    Arc::make_mut(&mut src.driver_info).selinux_mount_label = Some(l.clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The label a volume is mounted with goes into `vol_data.json` under
    /// the kubelet's key (only with a label, only on a host with SELinux)
    /// and comes back from it at start-up; a record without it (an older
    /// volmgr's, a volume without a label) gives none. Before, the label
    /// was not recorded: a restarted manager could not compare it.
    #[test]
    fn the_selinux_label_is_recorded_and_read_back() {
        let label = "system_u:object_r:container_file_t:s0:c1,c2";
        let mut src = CsiVolumeSource::new("d", "h");
        let mut data = BTreeMap::new();
        insert_selinux_label(&mut data, &src, true);
        assert!(data.is_empty(), "no label, no key");
        Arc::make_mut(&mut src.driver_info).selinux_mount_label = Some(label.into());
        insert_selinux_label(&mut data, &src, false);
        assert!(data.is_empty(), "a host without SELinux mounts without it");
        insert_selinux_label(&mut data, &src, true);
        assert_eq!(
            data.get("seLinuxMountContext").map(String::as_str),
            Some(label)
        );
        let on_disk: BTreeMap<String, String> = data
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let mut found = reconstructed_source("d".into(), "h".into(), CsiVolumeMode::Filesystem);
        recorded_selinux_label(&mut found, &on_disk);
        assert_eq!(
            found.driver_info.selinux_mount_label.as_deref(),
            Some(label)
        );
        let mut old = reconstructed_source("d".into(), "h".into(), CsiVolumeMode::Filesystem);
        recorded_selinux_label(&mut old, &BTreeMap::new());
        assert_eq!(old.driver_info.selinux_mount_label, None);
    }
}
