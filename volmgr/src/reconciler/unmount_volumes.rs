//! Phase 2 (the kubelet's `unmountVolumes`): tear down what pods no longer
//! want.

use std::sync::Arc;

use super::action::Action;
use super::{Pass, Reconciler};
use crate::cache::actual_state_of_world::ActualStateOfWorld;
use crate::cache::desired_state_of_world::DesiredStateOfWorld;
use crate::volume::UniqueVolumeName;

impl Reconciler {
    /// Phase 2 (the kubelet's `unmountVolumes`): tear down pods' volumes
    /// that are no longer desired.
    pub(super) fn unmount_volumes(
        dsw: &DesiredStateOfWorld,
        asw: &ActualStateOfWorld,
        scope: &[UniqueVolumeName],
        pass: &mut Pass,
    ) {
        for v in scope {
            let Some(av) = asw.volume(v) else { continue };
            for (pod, m) in &av.pods {
                if !dsw.pod_exists_in_volume(v, pod) && !dsw.is_held(pod) {
                    pass.actions.push(Action::Unmount {
                        volume: v.clone(),
                        pod: pod.clone(),
                        plugin: Arc::clone(&av.plugin_name),
                        mounted: m.clone(),
                    });
                }
            }
        }
    }
}
