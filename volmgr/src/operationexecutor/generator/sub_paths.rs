//! The subPath bind mounts of a pod's volume, made after its set-up and
//! removed before its tear-down, for the operations that do either.

use std::path::PathBuf;
use std::sync::Arc;

use crate::cache::world::World;
use crate::plugins::{subpath, VolumeError};
use crate::sys::root_dir::RootDir;
use crate::sys::Mounter;
use crate::volume::{PodUid, SubPath, UniqueVolumeName};

/// The subPath bind mounts of a pod's volume
/// ([`subpath`](crate::plugins::subpath)): made after its set-up for the
/// containers that may start, later for the others, removed before its
/// tear-down.
pub struct SubPathMounts {
    /// ROOT.
    pub root: Arc<RootDir>,
    /// The mounter.
    pub mounter: Arc<dyn Mounter>,
    /// The containers' uses to bind (empty for a tear-down: what is on
    /// disk goes).
    pub subs: Vec<SubPath>,
}

impl SubPathMounts {
    /// `(container, index)` of each use.
    pub(super) fn keys(&self) -> Vec<(String, usize)> {
        self.subs
            .iter()
            .map(|s| (s.container.clone(), s.index))
            .collect()
    }
}

/// Records `keys` prepared on `pod`'s mount of `volume`.
pub(super) fn mark_prepared(
    world: &World,
    volume: &UniqueVolumeName,
    pod: &PodUid,
    keys: &[(String, usize)],
) {
    if keys.is_empty() {
        return;
    }
    let subs = keys.iter().map(|(c, i)| (c.as_str(), *i));
    world.asw_mut().mark_sub_paths_prepared(volume, pod, subs);
}

/// The subPath bind mounts of `volume` of `pod`, set up at `path`.
pub(super) async fn bind_sub_paths(
    subs: SubPathMounts,
    pod: PodUid,
    volume: String,
    path: PathBuf,
) -> Result<Vec<PathBuf>, VolumeError> {
    tokio::task::spawn_blocking(move || {
        subpath::set_up_sub_paths(
            &subs.root,
            subs.mounter.as_ref(),
            &pod,
            &volume,
            &path,
            &subs.subs,
        )
    })
    .await
    .map_err(VolumeError::from)
    .and_then(|r| r)
}
