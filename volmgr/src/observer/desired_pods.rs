//! What the slow half of a scan needs of the desired state, copied out
//! under its read lock: the desired pods (names and volumes) and the CSI
//! driver of each of their CSI volumes. The /proc scans, the holder
//! helper's wait, the mount probes and the CSI triage run on this copy
//! after the lock is released: the populator and the reconciler (the
//! desired state's writers) never wait for them.

use std::collections::HashMap;

use crate::cache::desired_state_of_world::{DesiredStateOfWorld, PodEntry};
use crate::volume::{PodUid, VolumeSource};

/// The desired pods as one scan saw them (small owned data: the pod
/// entries share their names and specs' strings with the desired state).
#[derive(Debug, Default, Clone)]
pub(super) struct DesiredPods {
    /// Each desired pod's entry.
    pods: HashMap<PodUid, PodEntry>,
    /// `(pod, volume name in the pod)` → the CSI driver of the pod's first
    /// volume of that name (inline, PersistentVolume or migrated in-tree),
    /// `None` when it is not a CSI volume.
    csi_drivers: HashMap<(PodUid, String), Option<String>>,
}

impl DesiredPods {
    /// Copies what the findings need of `dsw` (call under its lock, keep
    /// it short).
    pub(super) fn of(dsw: &DesiredStateOfWorld) -> Self {
        let mut out = Self::default();
        for (uid, pod) in dsw.pods() {
            for v in &pod.volumes {
                let key = (uid.clone(), v.outer_name.clone());
                if out.csi_drivers.contains_key(&key) {
                    continue;
                }
                let spec = v
                    .resolution
                    .name()
                    .and_then(|name| dsw.volume(name))
                    .and_then(|dv| dv.pods.get(uid));
                let driver = match spec.map(|p| &p.spec.source) {
                    Some(VolumeSource::Csi(c)) => Some(c.driver.clone()),
                    _ => None,
                };
                out.csi_drivers.insert(key, driver);
            }
            out.pods.insert(uid.clone(), pod.clone());
        }
        out
    }

    /// Desired pod `uid`'s entry.
    pub(super) fn pod(&self, uid: &PodUid) -> Option<&PodEntry> {
        self.pods.get(uid)
    }

    /// The CSI driver of pod `uid`'s volume `outer_name` (its name in the
    /// pod), when it is a CSI volume.
    pub(super) fn csi_driver(&self, uid: &PodUid, outer_name: &str) -> Option<&str> {
        self.csi_drivers
            .get(&(uid.clone(), outer_name.to_string()))?
            .as_deref()
    }
}
