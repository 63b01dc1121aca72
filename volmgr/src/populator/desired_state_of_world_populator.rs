//! The populator proper: converted pods in, desired-state edits out.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

use super::convert::pod::{DesiredPod, PodRejected};
use super::convert::VolumeSpecError;
use super::PodSink;
use crate::cache::desired_state_of_world::{
    DesiredStateOfWorld, PodEntry, PodToMount, PodUpdate, PodVolumeEntry, Unresolved,
    VolumeResolution,
};
use crate::cache::world::{VolumeEvent, VolumeEventKind, VolumeOperation, WakeHold, World};
use crate::operationexecutor::OperationExecutor;
use crate::plugins::VolumePluginMgr;
use crate::util::fast_map::FastMap;
use crate::util::sync::MutexExt;
use crate::volume::{PodUid, UniqueVolumeName, VolumeSpec};

/// Deleted pods remembered for status before the list is first pruned.
const DEPARTING_PRUNE_MIN: usize = 1024;

/// A pod's namespace and name.
type PodNames = (Arc<str>, Arc<str>);

/// What one source reported as unusable.
#[derive(Debug, Default, Clone)]
pub struct SourceProblems {
    /// Inputs that yielded no pod.
    pub errors: Vec<String>,
    /// Pods rejected as a whole.
    pub rejected: Vec<PodRejected>,
}

/// Turns converted pods into desired-state edits: each volume resolved to
/// its plugin and unique name, pods that finished giving their volumes up.
pub struct Populator {
    world: Arc<World>,
    plugins: Arc<VolumePluginMgr>,
    executor: Arc<OperationExecutor>,
    sources: Mutex<BTreeMap<String, SourceProblems>>,
    /// Namespace and name of deleted pods still being torn down.
    departing: Mutex<FastMap<PodUid, PodNames>>,
    /// Size of `departing` at which it is next pruned (doubles with what
    /// pruning could not remove, so deleting many pods stays linear).
    departing_prune_at: AtomicUsize,
}

impl Populator {
    /// A populator writing `world`'s desired state, resolving volumes with
    /// `plugins`; `executor` is told when a CSI driver registers (operations
    /// waiting for it run again at once).
    pub fn new(
        world: Arc<World>,
        plugins: Arc<VolumePluginMgr>,
        executor: Arc<OperationExecutor>,
    ) -> Self {
        Self {
            world,
            plugins,
            executor,
            sources: Mutex::default(),
            departing: Mutex::default(),
            departing_prune_at: AtomicUsize::new(DEPARTING_PRUNE_MIN),
        }
    }

    /// Converts and adds or updates a pod that needs no other object (the C
    /// ABI's entry). A pod rejected as a whole changes nothing.
    pub fn upsert_pod(&self, pod: &Pod) -> Result<PodUid, PodRejected> {
        let desired = DesiredPod::from_pod(pod)?;
        let uid = desired.uid.clone();
        self.set_pod(desired);
        Ok(uid)
    }

    /// Retries at once every operation that waits for something to appear
    /// (called when a CSI driver registers).
    pub fn retry_waiting(&self) {
        let volumes = self.executor.retry_waiting();
        if !volumes.is_empty() {
            self.world.mark_dirty(volumes);
        }
    }

    /// A snapshot of every source's problems (for status).
    pub fn source_problems(&self) -> BTreeMap<String, SourceProblems> {
        self.sources.locked().clone()
    }

    /// Namespace and name of a deleted pod whose volumes are still torn
    /// down (for status).
    pub fn departing_names(&self) -> FastMap<PodUid, PodNames> {
        self.departing.locked().clone()
    }

    /// The desired-state entry and the volumes to mount of `pod`.
    fn resolve(&self, pod: DesiredPod) -> PodUpdate {
        let mut entry = PodEntry {
            namespace: pod.namespace.as_str().into(),
            name: pod.name.as_str().into(),
            volumes: Vec::with_capacity(pod.volumes.len()),
            supplemental_groups: pod
                .fs_group
                .into_iter()
                .chain(pod.supplemental_groups.iter().copied())
                .collect(),
            terminated: pod.terminated,
        };
        let mut mounts = Vec::with_capacity(pod.volumes.len());
        for v in pod.volumes {
            let operation = match &v.source {
                Err(VolumeSpecError::AttachFailed(_)) => VolumeOperation::Attach,
                _ => VolumeOperation::SetUp,
            };
            let resolved = v
                .source
                .map_err(|e| (unresolved_kind(&e), e.to_string()))
                .and_then(|source| {
                    let plugin = self
                        .plugins
                        .find_by_source(&source)
                        .map_err(|e| (Unresolved::PodError, e.to_string()))?;
                    Ok((plugin, source))
                });
            let ((plugin_name, plugin), source) = match resolved {
                Ok(r) => r,
                Err((kind, e)) => {
                    self.report_unresolved(&pod.uid, &v.name, &e, operation);
                    entry.volumes.push(PodVolumeEntry {
                        outer_name: v.name,
                        resolution: VolumeResolution::Failed {
                            plugin: None,
                            error: e,
                            why: kind,
                        },
                    });
                    continue;
                }
            };
            let spec = Arc::new(VolumeSpec {
                name: v.name.clone(),
                source,
            });
            let name = plugin.unique_volume_name(&pod.uid, &spec);
            entry.volumes.push(PodVolumeEntry {
                outer_name: v.name.clone(),
                resolution: VolumeResolution::Desired {
                    name: name.clone(),
                    plugin: Arc::clone(&plugin_name),
                },
            });
            if !pod.terminated {
                let to_mount = PodToMount {
                    outer_volume_spec_names: vec![v.name],
                    spec,
                    fs_group: pod.fs_group,
                    fs_group_change_policy: pod.fs_group_change_policy,
                    selinux_label: None,
                    selinux: v.selinux,
                    sub_paths: v.sub_paths,
                    sub_path_release: pod.sub_path_release.clone(),
                };
                mounts.push((name, plugin_name, to_mount));
            }
        }
        PodUpdate {
            uid: pod.uid,
            entry,
            mounts,
        }
    }

    /// The kubelet's FailedMount (FailedAttachVolume) for a volume it
    /// cannot even start to set up, or to update (a missing object, an
    /// unsupported source).
    fn report_unresolved(&self, uid: &PodUid, volume: &str, e: &str, operation: VolumeOperation) {
        tracing::warn!(pod = %uid, volume = %volume, error = %e, "volume cannot be mounted");
        self.world.emit(VolumeEvent {
            kind: VolumeEventKind::Failed,
            pod_uid: uid.clone(),
            volume: volume.to_string(),
            volume_name: UniqueVolumeName::new(format!("unresolved/{volume}")),
            path: None,
            error: Some(e.to_string()),
            operation,
            block: false,
        });
    }

    /// Keeps a deleted pod's namespace and name for status while its volumes
    /// are torn down; entries of pods with nothing mounted any more go.
    fn remember_departing(&self, uid: &PodUid, names: PodNames) {
        let mut departing = self.departing.locked();
        let prune_at = self.departing_prune_at.load(Ordering::Relaxed);
        if departing.len() >= prune_at {
            // Never hold this lock while taking a world's lock.
            let uids: Vec<PodUid> = departing.keys().cloned().collect();
            drop(departing);
            let done: Vec<PodUid> = {
                let asw = self.world.asw();
                uids.into_iter()
                    .filter(|u| !asw.pod_has_mounts(u))
                    .collect()
            };
            departing = self.departing.locked();
            for u in &done {
                departing.remove(u);
            }
            self.departing_prune_at.store(
                (departing.len() * 2).max(DEPARTING_PRUNE_MIN),
                Ordering::Relaxed,
            );
        }
        departing.insert(uid.clone(), names);
    }
}

/// What `e` means to `WaitForAttachAndMount`: the kubelet's pod errors are
/// those of its populator (`createVolumeSpec`: a claim or its
/// PersistentVolume, no plugin, an invalid spec); a missing Secret,
/// ConfigMap or VolumeAttachment fails the kubelet's set-up or attach
/// instead, which the wait waits through. An attach error with
/// `ResourceExhausted` (its text from `convert::csi_driver`) is the node's
/// attach limit.
fn unresolved_kind(e: &VolumeSpecError) -> Unresolved {
    match e {
        VolumeSpecError::Invalid(_) | VolumeSpecError::Unsupported(_) => Unresolved::PodError,
        VolumeSpecError::Missing(m) if m.starts_with("PersistentVolume") => Unresolved::PodError,
        VolumeSpecError::Missing(_) => Unresolved::Waiting,
        VolumeSpecError::AttachFailed(m) if m.contains("(ResourceExhausted)") => {
            Unresolved::AttachLimit
        }
        VolumeSpecError::AttachFailed(_) => Unresolved::Waiting,
    }
}

/// The kubelet's `processPodVolumes` on a pod it processed before: a volume
/// that no longer resolves (its claim, PV, configMap or secret deleted or
/// unreadable) stays in the desired state and the error goes on the pod, so
/// what is mounted is not torn down under a running pod. Each volume of
/// `update` that failed to resolve but that the pod has in `dsw` keeps its
/// desired entry, with the error. A volume never resolved stays unresolved.
///
/// This is the one place that keeps such a volume, whatever was processed
/// again: the pod itself (changed) or an object it reads (changed, deleted).
/// A `terminated` pod keeps only the entry (status shows the volume being
/// torn down, with the error), not its mount.
fn keep_unresolved(dsw: &DesiredStateOfWorld, update: &mut PodUpdate, terminated: bool) {
    let Some(old) = dsw.pod(&update.uid) else {
        return;
    };
    for v in &mut update.entry.volumes {
        let VolumeResolution::Failed { error: e, why, .. } = &v.resolution else {
            continue;
        };
        let (e, why) = (e.clone(), *why);
        let Some((name, plugin)) = old
            .volumes
            .iter()
            .find(|p| p.outer_name == v.outer_name)
            .and_then(|p| Some((p.resolution.name()?, p.resolution.plugin()?)))
        else {
            continue;
        };
        let mut plugin = Arc::clone(plugin);
        if !terminated {
            let Some(dv) = dsw.volume(name) else {
                continue;
            };
            let Some(to_mount) = dv.pods.get(&update.uid) else {
                continue;
            };
            plugin = Arc::clone(&dv.plugin_name);
            if !update.mounts.iter().any(|(n, _, _)| n == name) {
                let p = Arc::clone(&plugin);
                update.mounts.push((name.clone(), p, to_mount.clone()));
            }
        }
        tracing::warn!(pod = %update.uid, volume = %v.outer_name, error = %e, "volume kept as it was: it no longer resolves");
        v.resolution = VolumeResolution::Kept {
            name: name.clone(),
            plugin,
            error: e,
            why,
        };
    }
}

impl PodSink for Populator {
    fn set_pod(&self, pod: DesiredPod) {
        let terminated = pod.terminated;
        let mut update = self.resolve(pod);
        let mut dsw = self.world.dsw_mut();
        keep_unresolved(&dsw, &mut update, terminated);
        let uid = update.uid.clone();
        let changed = dsw.set_pod(update);
        let refused = dsw.selinux_refused(&uid);
        drop(dsw);
        for (volume, e) in refused {
            self.report_unresolved(&uid, &volume, &e, VolumeOperation::SetUp);
        }
        if changed.is_empty() {
            self.world.bump();
        } else {
            self.world.mark_dirty(changed);
        }
    }

    fn delete_pod(&self, uid: &PodUid) -> bool {
        let mut dsw = self.world.dsw_mut();
        let names = dsw
            .pod(uid)
            .map(|p| (Arc::clone(&p.namespace), Arc::clone(&p.name)));
        let known = names.is_some();
        let changed = dsw.delete_pod(uid);
        drop(dsw);
        if let Some(names) = names {
            self.remember_departing(uid, names);
        }
        self.world.mark_dirty(changed);
        self.world.mark_pod_dirty(uid.clone());
        known
    }

    fn set_held(&self, uid: &PodUid, held: bool) {
        let mut dsw = self.world.dsw_mut();
        if dsw.is_held(uid) == held {
            return;
        }
        dsw.set_held(uid, held);
        drop(dsw);
        // Released: what was kept for it is reconsidered.
        self.world.mark_pod_dirty(uid.clone());
        self.world.mark_all_dirty();
    }

    fn set_source_problems(&self, source: &str, errors: Vec<String>, rejected: Vec<PodRejected>) {
        let mut s = self.sources.locked();
        if errors.is_empty() && rejected.is_empty() {
            s.remove(source);
        } else {
            s.insert(source.to_string(), SourceProblems { errors, rejected });
        }
        drop(s);
        self.world.bump();
    }

    fn set_populated(&self) {
        self.world.set_populated();
    }

    fn hold_wakes(&self) -> WakeHold {
        self.world.hold_wakes()
    }
}
