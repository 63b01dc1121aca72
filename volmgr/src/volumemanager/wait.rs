//! Waiting for a pod's volumes (the kubelet's `WaitForAttachAndMount` and
//! `WaitForUnmount`) and for the whole node to converge.

use std::time::Duration;

use super::{VolumeManager, WaitError};
use crate::cache::actual_state_of_world::{ActualStateOfWorld, DeviceMountState, VolumeMountState};
use crate::cache::desired_state_of_world::{DesiredStateOfWorld, Unresolved};
use crate::volume::{PodUid, UniqueVolumeName};

/// Shortest pause between two convergence checks of a waiter.
const MIN_WAIT_PACE: Duration = Duration::from_micros(200);
/// Longest pause between two convergence checks of a waiter.
const MAX_WAIT_PACE: Duration = Duration::from_millis(10);

/// The kubelet's lists of a pod's volumes in `WaitForAttachAndMount`'s
/// error, each sorted, shown as the kubelet shows them:
/// `unmounted volumes=[a b], unattached volumes=[], failed to process
/// volumes=[b]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodVolumeLists {
    /// The pod's volumes not mounted (uncertain ones included).
    pub unmounted: Vec<String>,
    /// Its attachable volumes not attached to the node yet.
    pub unattached: Vec<String>,
    /// Its volumes that could not be processed (not in the desired state).
    pub not_processed: Vec<String>,
}

/// What [`VolumeManager::volume_lists`] finds of a pod.
#[derive(Debug, Default)]
struct VolumeLists {
    lists: PodVolumeLists,
    pod_errors: Vec<String>,
    limit_errors: Vec<String>,
}

/// The kubelet's `seLinuxMountMismatchError` of `uid`'s use of the volume
/// `name`, when the volume is mounted with another SELinux label than the
/// pod needs (see [`ActualStateOfWorld::selinux_mount_mismatch`]).
pub(super) fn selinux_mount_mismatch(
    dsw: &DesiredStateOfWorld,
    asw: &ActualStateOfWorld,
    name: &UniqueVolumeName,
    uid: &PodUid,
) -> Option<String> {
    let p = dsw.volume(name)?.pods.get(uid)?;
    asw.selinux_mount_mismatch(name, p.selinux_label.as_deref())
        .map(|e| e.to_string())
}

impl PodVolumeLists {
    fn sort(&mut self) {
        self.unmounted.sort();
        self.unattached.sort();
        self.not_processed.sort();
    }
}

impl std::fmt::Display for PodVolumeLists {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unmounted volumes=[{}], unattached volumes=[{}], failed to process volumes=[{}]",
            self.unmounted.join(" "),
            self.unattached.join(" "),
            self.not_processed.join(" ")
        )
    }
}

impl VolumeManager {
    /// The kubelet's `WaitForAttachAndMount`: returns once every volume of the
    /// pod is mounted. Volumes of the pod that could not be processed (the
    /// kubelet's pod errors) end it at once with [`WaitError::PodErrors`];
    /// when the timeout passes with a volume refused for its CSI driver's
    /// node limit, the pod is rejected with
    /// [`WaitError::AttachLimitExceeded`]; otherwise it is
    /// [`WaitError::Timeout`].
    pub async fn wait_for_attach_and_mount(
        &self,
        uid: &PodUid,
        timeout: Duration,
    ) -> Result<(), WaitError> {
        let check = |this: &Self| match this.pending_volumes(uid) {
            None => Ok(None),
            Some(missing) => this.pod_errors(uid).map_or(Ok(Some(missing)), Err),
        };
        let timed_out = |this: &Self, missing| {
            this.limit_exceeded(uid).unwrap_or(WaitError::Timeout {
                pod: uid.to_string(),
                pending: missing,
            })
        };
        self.wait_until(timeout, false, check, timed_out).await
    }

    /// The kubelet's lists of `uid`'s volumes, its pod errors (volumes that
    /// could not be processed: [`Unresolved::PodError`]) and the errors of
    /// its volumes refused for the node's attach limit.
    fn volume_lists(&self, uid: &PodUid) -> VolumeLists {
        let dsw = self.world.dsw();
        let asw = self.world.asw();
        let mut out = VolumeLists::default();
        let Some(pod) = dsw.pod(uid) else {
            return out;
        };
        for v in &pod.volumes {
            match (v.resolution.unresolved(), v.resolution.error()) {
                (Some(Unresolved::PodError), Some(e)) => out.pod_errors.push(e.to_string()),
                (Some(Unresolved::AttachLimit), Some(e)) => out.limit_errors.push(e.to_string()),
                _ => {}
            }
            let name = match v.resolution.name() {
                Some(name) => name,
                None => {
                    out.lists.unmounted.push(v.outer_name.clone());
                    if v.resolution.unresolved() == Some(Unresolved::AttachLimit) {
                        // Desired to the kubelet, not attached.
                        out.lists.unattached.push(v.outer_name.clone());
                    } else {
                        out.lists.not_processed.push(v.outer_name.clone());
                    }
                    continue;
                }
            };
            if asw
                .pod_mount(name, uid)
                .is_none_or(|m| m.state != VolumeMountState::Mounted)
            {
                out.lists.unmounted.push(v.outer_name.clone());
                // The kubelet's `AddErrorToPod` of a volume mounted with
                // another SELinux label.
                out.pod_errors
                    .extend(selinux_mount_mismatch(&dsw, &asw, name, uid));
            }
            let attachable = dsw.volume(name).is_some_and(|dv| {
                dv.pods.get(uid).is_some_and(|p| {
                    self.plugins
                        .find_by_name(&dv.plugin_name)
                        .is_some_and(|plugin| plugin.can_attach(&p.spec))
                })
            });
            if attachable && asw.volume(name).is_none() {
                out.lists.unattached.push(v.outer_name.clone());
            }
            if let Some(r) = [Some(uid), None]
                .into_iter()
                .find_map(|p| self.executor.record(name, p).filter(|r| r.limit_exceeded))
            {
                out.limit_errors.extend(r.last_error);
            }
        }
        out.lists.sort();
        out
    }

    /// [`WaitError::PodErrors`] when volumes of `uid` could not be processed.
    fn pod_errors(&self, uid: &PodUid) -> Option<WaitError> {
        let all = self.volume_lists(uid);
        (!all.pod_errors.is_empty()).then(|| WaitError::PodErrors {
            pod: uid.to_string(),
            volumes: all.lists,
            errors: all.pod_errors.join("; "),
        })
    }

    /// [`WaitError::AttachLimitExceeded`] when a volume of `uid` not
    /// mounted was refused for the node's attach limit of its driver (its
    /// VolumeAttachment failed with `ResourceExhausted`, or the node's
    /// `max_volumes_per_node` of the driver refused its stage or publish).
    fn limit_exceeded(&self, uid: &PodUid) -> Option<WaitError> {
        let all = self.volume_lists(uid);
        (!all.limit_errors.is_empty()).then(|| WaitError::AttachLimitExceeded {
            pod: uid.to_string(),
            volumes: all.lists,
            error: all.limit_errors.join("; "),
        })
    }

    /// The kubelet's `WaitForUnmount`: returns once nothing of the pod is mounted.
    pub async fn wait_for_unmount(&self, uid: &PodUid, timeout: Duration) -> Result<(), WaitError> {
        self.wait(uid.as_str(), timeout, |this| {
            this.still_mounted(std::slice::from_ref(uid), false)
        })
        .await
    }

    /// The kubelet's `WaitForAllPodsUnmount`: returns once nothing of any of
    /// `uids` is mounted (or uncertain), all within one `timeout`; on
    /// timeout the error lists `pod/volume` for what is left.
    pub async fn wait_for_all_pods_unmount(
        &self,
        uids: &[PodUid],
        timeout: Duration,
    ) -> Result<(), WaitError> {
        let label: Vec<&str> = uids.iter().map(PodUid::as_str).collect();
        self.wait(&label.join(","), timeout, |this| {
            this.still_mounted(uids, true)
        })
        .await
    }

    /// `None` when nothing of `uids` is mounted; otherwise what is, as
    /// `volume (still mounted)` (`pod/volume` with `with_pod`).
    fn still_mounted(&self, uids: &[PodUid], with_pod: bool) -> Option<String> {
        let asw = self.world.asw();
        let left: Vec<String> = uids
            .iter()
            .flat_map(|uid| {
                asw.all_mounts_of_pod(uid).into_iter().map(move |m| {
                    if with_pod {
                        format!("{uid}/{} (still mounted)", m.outer_volume_spec_name)
                    } else {
                        format!("{} (still mounted)", m.outer_volume_spec_name)
                    }
                })
            })
            .collect();
        if left.is_empty() {
            None
        } else {
            Some(left.join(", "))
        }
    }

    /// Waits until the node has converged: states synced, (if given) exactly
    /// `pods` pods desired, every desired volume mounted and nothing else
    /// mounted (no pod's volume, no device of a volume no pod wants). The check stops at the first difference and runs after each
    /// change of the state, paced so that it costs at most about a tenth of
    /// the time it waits (a check of 10,000 volumes near the end takes a few
    /// hundred microseconds): between 0.2 ms and 10 ms apart.
    pub async fn wait_converged(
        &self,
        pods: Option<usize>,
        timeout: Duration,
    ) -> Result<(), WaitError> {
        let timed_out = |_: &Self, missing| WaitError::Timeout {
            pod: "*".into(),
            pending: missing,
        };
        let check = |this: &Self| Ok(this.not_converged(pods));
        self.wait_until(timeout, true, check, timed_out).await
    }

    fn not_converged(&self, pods: Option<usize>) -> Option<String> {
        if !self.world.synced() {
            return Some("states not synced yet".into());
        }
        let dsw = self.world.dsw();
        if let Some(n) = pods {
            let have = dsw.pods().count();
            if have != n {
                return Some(format!("{have} pods desired, waiting for {n}"));
            }
        }
        // Return at the first difference: while converging that is found
        // almost at once, so polling this stays cheap.
        let asw = self.world.asw();
        for (name, v) in dsw.volumes() {
            for uid in v.pods.keys() {
                if asw
                    .pod_mount(name, uid)
                    .is_none_or(|m| m.state != VolumeMountState::Mounted)
                {
                    return Some(format!("pod {uid} volume {name}: not mounted yet"));
                }
            }
        }
        for (name, v) in asw.volumes() {
            for uid in v.pods.keys() {
                if !dsw.pod_exists_in_volume(name, uid) {
                    return Some(format!("pod {uid} volume {name}: still mounted"));
                }
            }
        }
        // A device no pod wants any more that is not unmounted yet (its
        // NodeUnstageVolume keeps failing) is something left on the node.
        if let Some((name, _)) = asw.volumes().find(|(name, v)| {
            v.device_mount_state != DeviceMountState::NotMounted && !dsw.volume_exists(name)
        }) {
            return Some(format!("volume {name}: device still mounted"));
        }
        for (uid, pod) in dsw.pods() {
            if let Some(v) = pod.volumes.iter().find(|v| v.resolution.name().is_none()) {
                return Some(format!(
                    "pod {uid} volume {}: cannot be mounted",
                    v.outer_name
                ));
            }
        }
        None
    }

    /// Waits for `pending` to find nothing left, checked after each change
    /// of the state; [`WaitError::Timeout`] for `pods` after `timeout`.
    async fn wait<F>(&self, pods: &str, timeout: Duration, pending: F) -> Result<(), WaitError>
    where
        F: Fn(&Self) -> Option<String>,
    {
        let timed_out = |_: &Self, missing| WaitError::Timeout {
            pod: pods.to_string(),
            pending: missing,
        };
        self.wait_until(timeout, false, |this| Ok(pending(this)), timed_out)
            .await
    }

    /// The loop of every wait: `check` after each change of the state until
    /// it finds nothing left (`Ok(None)`) or an error that ends the wait;
    /// after `timeout`, `timed_out` with what was left. `paced`: the checks
    /// are spaced so that they cost at most about a tenth of the time waited
    /// (between [`MIN_WAIT_PACE`] and [`MAX_WAIT_PACE`] apart).
    async fn wait_until<C, T>(
        &self,
        timeout: Duration,
        paced: bool,
        check: C,
        timed_out: T,
    ) -> Result<(), WaitError>
    where
        C: Fn(&Self) -> Result<Option<String>, WaitError>,
        T: FnOnce(&Self, String) -> WaitError,
    {
        let mut rx = self.world.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            let checked = std::time::Instant::now();
            let Some(missing) = check(self)? else {
                return Ok(());
            };
            let pace = (checked.elapsed() * 10).clamp(MIN_WAIT_PACE, MAX_WAIT_PACE);
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(WaitError::Stopped),
                Err(_) => return Err(timed_out(self, missing)),
            }
            if paced {
                tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + pace)).await;
            }
        }
    }

    /// `None` when every volume of the pod is mounted; otherwise what is missing.
    fn pending_volumes(&self, uid: &PodUid) -> Option<String> {
        let dsw = self.world.dsw();
        let Some(pod) = dsw.pod(uid) else {
            return Some("pod is not known (yet)".into());
        };
        let asw = self.world.asw();
        let missing: Vec<String> = pod
            .volumes
            .iter()
            .filter_map(|v| match v.resolution.name() {
                None => Some(format!(
                    "{} (error: {})",
                    v.outer_name,
                    v.resolution.error().unwrap_or_default()
                )),
                Some(name) => match asw.pod_mount(name, uid) {
                    Some(m) if m.state == VolumeMountState::Mounted => None,
                    _ => {
                        let err = selinux_mount_mismatch(&dsw, &asw, name, uid)
                            .or_else(|| {
                                self.executor
                                    .record(name, Some(uid))
                                    .and_then(|r| r.last_error)
                            })
                            .or_else(|| self.device_error(name));
                        Some(match err {
                            Some(e) => format!("{} (error: {e})", v.outer_name),
                            None => match dsw
                                .volume(name)
                                .and_then(|dv| self.reconciler.attach_wait(name, dv, &asw))
                            {
                                Some(why) => format!("{} (pending: {why})", v.outer_name),
                                None => format!("{} (pending)", v.outer_name),
                            },
                        })
                    }
                },
            })
            .collect();
        if missing.is_empty() {
            None
        } else {
            Some(missing.join(", "))
        }
    }

    /// The last error of a volume's device operation, if any.
    fn device_error(&self, name: &UniqueVolumeName) -> Option<String> {
        self.executor.record(name, None).and_then(|r| r.last_error)
    }
}
