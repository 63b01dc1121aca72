//! What a reconcile pass decided to start, one operation each.

use std::sync::Arc;

use crate::cache::actual_state_of_world::{ForeignMounts, MountedPod};
use crate::operationexecutor::OperationKind;
use crate::plugins::MountRequest;
use crate::volume::{PodUid, SubPath, UniqueVolumeName, VolumeSpec};

pub(super) enum Action {
    RemoveForeignMounts {
        volume: UniqueVolumeName,
        pod: PodUid,
        plugin: Arc<str>,
        mounted: MountedPod,
        found: ForeignMounts,
    },
    Unmount {
        volume: UniqueVolumeName,
        pod: PodUid,
        plugin: Arc<str>,
        mounted: MountedPod,
    },
    Mount {
        volume: UniqueVolumeName,
        pod: PodUid,
        plugin: Arc<str>,
        req: MountRequest,
        sub_paths: Vec<SubPath>,
    },
    PrepareSubPaths {
        volume: UniqueVolumeName,
        pod: PodUid,
        plugin: Arc<str>,
        mounted: MountedPod,
        sub_paths: Vec<SubPath>,
    },
    MountDevice {
        volume: UniqueVolumeName,
        plugin: Arc<str>,
        spec: Arc<VolumeSpec>,
        /// The fsGroup of the pod whose spec is used.
        fs_group: Option<i64>,
    },
    UnmountDevice {
        volume: UniqueVolumeName,
        plugin: Arc<str>,
        spec: Option<Arc<VolumeSpec>>,
    },
    Expand {
        volume: UniqueVolumeName,
        plugin: Arc<str>,
        spec: Arc<VolumeSpec>,
        new_size: u64,
    },
}

impl Action {
    /// What the executor keys it by: the volume, the pod (none for the
    /// volume's device), its plugin and the operation.
    pub(super) fn key(&self) -> (&UniqueVolumeName, Option<&PodUid>, &Arc<str>, OperationKind) {
        match self {
            Self::RemoveForeignMounts {
                volume,
                pod,
                plugin,
                ..
            } => (
                volume,
                Some(pod),
                plugin,
                OperationKind::RemoveForeignMounts,
            ),
            Self::Mount {
                volume,
                pod,
                plugin,
                ..
            } => (volume, Some(pod), plugin, OperationKind::MountVolume),
            Self::PrepareSubPaths {
                volume,
                pod,
                plugin,
                ..
            } => (volume, Some(pod), plugin, OperationKind::PrepareSubPaths),
            Self::Unmount {
                volume,
                pod,
                plugin,
                ..
            } => (volume, Some(pod), plugin, OperationKind::UnmountVolume),
            Self::MountDevice { volume, plugin, .. } => {
                (volume, None, plugin, OperationKind::MountDevice)
            }
            Self::UnmountDevice { volume, plugin, .. } => {
                (volume, None, plugin, OperationKind::UnmountDevice)
            }
            Self::Expand { volume, plugin, .. } => {
                (volume, None, plugin, OperationKind::ExpandVolume)
            }
        }
    }

    /// The spec that names the operation in metrics.
    pub(super) fn spec(&self) -> Option<&VolumeSpec> {
        match self {
            Self::RemoveForeignMounts { mounted, .. }
            | Self::Unmount { mounted, .. }
            | Self::PrepareSubPaths { mounted, .. } => Some(&mounted.spec),
            Self::Mount { req, .. } => Some(&req.spec),
            Self::MountDevice { spec, .. } | Self::Expand { spec, .. } => Some(spec),
            Self::UnmountDevice { spec, .. } => spec.as_deref(),
        }
    }
}
