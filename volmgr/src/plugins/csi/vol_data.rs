//! The kubelet's `vol_data.json` and volmgr's staged record: what is kept
//! on disk next to a stage or publish directory, and read back at start-up.

use std::collections::BTreeMap;

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
