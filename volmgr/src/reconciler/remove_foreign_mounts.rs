//! Phase 1 (volmgr's own): a pod's volume the tracer found with something
//! else mounted over it gets a `RemoveForeignMounts` operation.

use std::sync::Arc;

use super::action::Action;
use super::{Pass, Reconciler};
use crate::cache::actual_state_of_world::ActualStateOfWorld;
use crate::volume::UniqueVolumeName;

impl Reconciler {
    /// Phase 1: pods' volumes the tracer found with foreign mounts stacked
    /// on them get those removed (first, so no other operation on the mount
    /// runs meanwhile: the executor refuses it, and it is retried when the
    /// removal finishes).
    pub(super) fn remove_foreign_mounts(
        asw: &ActualStateOfWorld,
        scope: &[UniqueVolumeName],
        pass: &mut Pass,
    ) {
        for v in scope {
            let Some(av) = asw.volume(v) else { continue };
            for (pod, found) in av.foreign_mounts.iter() {
                let Some(m) = av.pods.get(pod) else { continue };
                pass.actions.push(Action::RemoveForeignMounts {
                    volume: v.clone(),
                    pod: pod.clone(),
                    plugin: Arc::clone(&av.plugin_name),
                    mounted: m.clone(),
                    found: *found,
                });
            }
        }
    }
}
