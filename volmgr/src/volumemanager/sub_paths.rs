//! The kubelet's `makeMounts` subPath step, at a container's start: the
//! caller that starts containers (a kubelet fork, through the C ABI) asks
//! for a container's subPaths just before it starts it, so an init
//! container that ran before may have written the file a later container
//! mounts by subPath. The agent's sources release containers themselves
//! (see [`SubPathTiming`](crate::populator::SubPathTiming)).

use std::sync::Arc;

use super::VolumeManager;
use crate::cache::actual_state_of_world::VolumeMountState;
use crate::plugins::{subpath, VolumeError};
use crate::status::SubPathStatus;
use crate::volume::{PodUid, SubPath, UniqueVolumeName};

/// Why a container's subPaths could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareSubPathsError {
    /// The pod is not desired.
    #[error("pod {0} is not known")]
    PodNotFound(String),
    /// A volume the container mounts by subPath is not (certainly) set up:
    /// the kubelet starts no container before its volumes are mounted.
    #[error("volume {volume:?} of pod {pod} is not mounted")]
    NotMounted {
        /// The pod.
        pod: String,
        /// The volume's name in the pod.
        volume: String,
    },
    /// A subPath could not be bound (the kubelet's
    /// `CreateContainerConfigError`).
    #[error(transparent)]
    Volume(#[from] VolumeError),
}

/// One volume's uses of the container: the volume, its name in the pod,
/// where it is set up, and the uses.
type Work = (UniqueVolumeName, String, std::path::PathBuf, Vec<SubPath>);

impl VolumeManager {
    /// Prepares `container`'s subPath bind mounts of pod `uid`'s volumes
    /// (the kubelet's `makeMounts` → `PrepareSafeSubpath`): each path is
    /// opened (missing directories made) and bound as the volume holds it
    /// now; one already bound is kept. Returns, per volume name in the pod,
    /// the bind mounts (what the runtime binds into the container), in
    /// volume then `volumeMount` order; none for a container without
    /// subPaths. Runs the syscalls on the manager's blocking threads.
    pub async fn prepare_sub_paths(
        &self,
        uid: &PodUid,
        container: &str,
    ) -> Result<Vec<(String, SubPathStatus)>, PrepareSubPathsError> {
        let mut out = Vec::new();
        for (volume, outer, path, subs) in self.sub_path_work(uid, container)? {
            let (root, mounter) = (Arc::clone(&self.root), Arc::clone(&self.mounter));
            let (pod, name) = (uid.clone(), outer.clone());
            let (subs, paths) = tokio::task::spawn_blocking(move || {
                subpath::set_up_sub_paths(&root, mounter.as_ref(), &pod, &name, &path, &subs)
                    .map(|p| (subs, p))
            })
            .await
            .map_err(VolumeError::from)??;
            self.world.asw_mut().mark_sub_paths_prepared(
                &volume,
                uid,
                subs.iter().map(|s| (s.container.as_str(), s.index)),
            );
            for (s, p) in subs.into_iter().zip(paths) {
                out.push((
                    outer.clone(),
                    SubPathStatus {
                        container: s.container,
                        index: s.index,
                        sub_path: s.path,
                        path: p.display().to_string(),
                    },
                ));
            }
        }
        // The volume lists show them.
        self.world.bump();
        tracing::debug!(pod = %uid, container, prepared = out.len(), "subPaths prepared");
        Ok(out)
    }

    /// The volumes of `uid` that `container` mounts by subPath, each
    /// mounted, with its uses.
    fn sub_path_work(
        &self,
        uid: &PodUid,
        container: &str,
    ) -> Result<Vec<Work>, PrepareSubPathsError> {
        let dsw = self.world.dsw();
        let pod = dsw
            .pod(uid)
            .ok_or_else(|| PrepareSubPathsError::PodNotFound(uid.to_string()))?;
        let asw = self.world.asw();
        let mut work = Vec::new();
        for v in &pod.volumes {
            let Some(name) = v.resolution.name() else {
                continue;
            };
            let Some(p) = dsw.volume(name).and_then(|dv| dv.pods.get(uid)) else {
                continue;
            };
            let subs: Vec<SubPath> = p
                .sub_paths
                .iter()
                .filter(|s| s.container == container)
                .cloned()
                .collect();
            if subs.is_empty() {
                continue;
            }
            let m = asw
                .pod_mount(name, uid)
                .filter(|m| m.state == VolumeMountState::Mounted)
                .ok_or_else(|| PrepareSubPathsError::NotMounted {
                    pod: uid.to_string(),
                    volume: v.outer_name.clone(),
                })?;
            work.push((name.clone(), v.outer_name.clone(), m.path.clone(), subs));
        }
        Ok(work)
    }
}
