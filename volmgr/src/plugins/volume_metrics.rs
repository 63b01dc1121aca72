//! Volume usage and health (the kubelet's `volume.Metrics`): what a volume
//! holds and, where the plugin can tell, whether it is healthy. The
//! kubelet's `MetricsStatFS` ([`statfs`]) serves emptyDir and hostPath;
//! CSI asks the driver (`NodeGetVolumeStats`, see
//! [`CsiPlugin::volume_stats`](super::csi::CsiPlugin::volume_stats)).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::pluginmanager::csi_client::CsiCallError;
use crate::sys::root_dir::PathError;

/// Usage of one volume (the kubelet's `volume.Metrics`), in bytes and inodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeStats {
    /// Size of the file system (`Capacity`).
    pub capacity_bytes: u64,
    /// Bytes available to unprivileged users (`Available`).
    pub available_bytes: u64,
    /// Bytes in use (`Used`).
    pub used_bytes: u64,
    /// Inodes of the file system (`Inodes`).
    pub inodes: u64,
    /// Free inodes (`InodesFree`).
    pub inodes_free: u64,
    /// Inodes in use (`InodesUsed`).
    pub inodes_used: u64,
    /// The volume's health, when the plugin reports one (CSI drivers with
    /// the `VOLUME_CONDITION` capability).
    pub condition: Option<VolumeCondition>,
}

/// A volume's health as its driver reports it (CSI `VolumeCondition`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeCondition {
    /// Whether the volume is abnormal.
    pub abnormal: bool,
    /// The driver's message.
    pub message: String,
}

/// Why a volume's stats could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// `statfs` on the volume's path failed.
    #[error("statfs {path}: {source}")]
    Statfs {
        /// The volume's path.
        path: PathBuf,
        /// The error.
        #[source]
        source: nix::Error,
    },
    /// The CSI call failed.
    #[error(transparent)]
    Csi(#[from] CsiCallError),
    /// A path of the volume could not be built.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The volume's spec cannot be asked about (not UTF-8, wrong plugin).
    #[error("{0}")]
    Invalid(String),
    /// No answer within the collection's per-call timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The task running the call failed.
    #[error("stats task failed: {0}")]
    Task(String),
    /// A previous `statfs` of the path has not returned yet (a hung file
    /// system): not asked again meanwhile.
    #[error("a previous statfs of {0} has not returned")]
    Busy(PathBuf),
    /// Not asked: whoever serves the volume (a CSI driver) did not answer
    /// for another volume earlier in the same collection.
    #[error("not asked: {0} did not answer earlier in this collection")]
    Skipped(String),
}

impl StatsError {
    /// Whether whoever serves the volume did not answer at all (a timeout,
    /// a driver that is gone): its other volumes need not be asked in the
    /// same collection.
    pub fn is_unresponsive(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Csi(CsiCallError::NotRegistered(_)) => true,
            Self::Csi(CsiCallError::Rpc {
                code, transport, ..
            }) => {
                *transport
                    || matches!(
                        code,
                        tonic::Code::DeadlineExceeded | tonic::Code::Unavailable
                    )
            }
            _ => false,
        }
    }
}

/// The kubelet's `MetricsStatFS`: usage of the file system holding `path`.
/// Blocking: call it off the async workers.
// statvfs's field types are u64 here but narrower on 32-bit targets.
#[allow(clippy::useless_conversion)]
pub fn statfs(path: &Path) -> Result<VolumeStats, StatsError> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|source| StatsError::Statfs {
        path: path.to_path_buf(),
        source,
    })?;
    let block = u64::from(st.fragment_size());
    let blocks = u64::from(st.blocks());
    let files = u64::from(st.files());
    let files_free = u64::from(st.files_free());
    Ok(VolumeStats {
        capacity_bytes: blocks.saturating_mul(block),
        available_bytes: u64::from(st.blocks_available()).saturating_mul(block),
        used_bytes: blocks
            .saturating_sub(u64::from(st.blocks_free()))
            .saturating_mul(block),
        inodes: files,
        inodes_free: files_free,
        inodes_used: files.saturating_sub(files_free),
        condition: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statfs_of_a_directory_is_plausible() {
        let t = tempfile::tempdir().unwrap();
        let s = statfs(t.path()).unwrap();
        assert!(s.capacity_bytes > 0, "{s:?}");
        assert!(
            s.used_bytes + s.available_bytes <= s.capacity_bytes,
            "{s:?}"
        );
        assert!(s.inodes_used + s.inodes_free <= s.inodes || s.inodes == 0);
        assert!(s.condition.is_none());
        let e = statfs(&t.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("missing") && !e.is_unresponsive());
        assert!(StatsError::Timeout(Duration::from_secs(1)).is_unresponsive());
    }
}
