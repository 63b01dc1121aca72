//! `CleanupPodDir` (the kubelet's `cleanupOrphanedPodDirs` for one pod):
//! what is left of a pod whose volumes are all torn down removed — the
//! subPath binds no one found again at start-up, the volume directories
//! (only when empty and unmounted: [`super::orphan_volumes`]), then
//! `ROOT/pods/<uid>`. The removal never crosses a mount, so a volume
//! unknown to the manager is left intact.

use std::sync::Arc;

use super::orphan_volumes::remove_orphaned_pod_volume_dirs;
use crate::plugins::{subpath, VolumeError};
use crate::sys::root_dir::{RelPath, RootDir};
use crate::sys::Mounter;
use crate::volume::PodUid;

/// Removes the directory of `pod`, which has no volume desired or mounted.
pub async fn cleanup_pod_dir(
    root: Arc<RootDir>,
    mounter: Arc<dyn Mounter>,
    pod: PodUid,
) -> Result<(), VolumeError> {
    subpath::clean_pod_sub_paths(&root, mounter.as_ref(), &pod)?;
    remove_orphaned_pod_volume_dirs(&root, &pod)?;
    let rel = RelPath::new(["pods", pod.as_str()])?;
    root.remove_all_emptied(&rel)?;
    tracing::debug!(%pod, "removed orphaned pod directory");
    Ok(())
}
