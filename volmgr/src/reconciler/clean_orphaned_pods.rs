//! Phase 5 (the kubelet's `cleanupOrphanedPodDirs`): the directories of
//! pods that are gone, removed by a `CleanupPodDir` operation each.

use std::sync::Arc;

use super::{boxed, pod_dir_key, BoxedOperation, Reconciler};
use crate::operationexecutor::generator;
use crate::operationexecutor::OperationKind;
use crate::util::fast_map::FastSet;
use crate::util::sync::MutexExt;
use crate::volume::PodUid;

impl Reconciler {
    /// Phase 5 (the kubelet's `cleanupOrphanedPodDirs`): removes
    /// `ROOT/pods/<uid>` of pods that are neither desired nor have anything
    /// mounted. The removal
    /// never crosses a mount, so a volume unknown to the manager is left intact.
    pub(super) fn clean_orphaned_pods(
        self: &Arc<Self>,
        mut candidates: FastSet<PodUid>,
        populated: bool,
        batch: &mut Vec<BoxedOperation>,
    ) {
        {
            let mut deferred = self.deferred_pod_dirs.locked();
            if !populated {
                deferred.extend(candidates);
                return;
            }
            candidates.extend(deferred.drain());
        }
        if candidates.is_empty() {
            return;
        }
        let eligible: Vec<PodUid> = {
            let dsw = self.world.dsw();
            let asw = self.world.asw();
            candidates
                .into_iter()
                .filter(|u| dsw.pod(u).is_none() && !dsw.is_held(u) && !asw.pod_has_mounts(u))
                .collect()
        };
        for uid in eligible {
            let (root, mounter) = (Arc::clone(&self.root), Arc::clone(&self.mounter));
            // Inline: what is left of a pod whose volumes are all torn down
            // is a few directories (and small files of its containers).
            let op = generator::cleanup_pod_dir(root, mounter, uid.clone());
            if let Ok(op) = self.executor.prepare(
                &pod_dir_key(&uid),
                None,
                OperationKind::CleanupPodDir,
                "volmgr".into(),
                op,
            ) {
                batch.push(boxed(op));
            }
        }
    }
}
