//! Phase 4 (the kubelet's `unmountDetachDevices`): unmount the devices of
//! volumes no pod uses any more (or that are mounted with an SELinux label
//! no pod wants now) and forget them.

use std::sync::Arc;

use super::action::Action;
use super::{Pass, Reconciler, POD_DIR_PREFIX};
use crate::cache::actual_state_of_world::{ActualStateOfWorld, DeviceMountState};
use crate::cache::desired_state_of_world::DesiredStateOfWorld;
use crate::volume::UniqueVolumeName;

impl Reconciler {
    /// Phase 4 (the kubelet's `unmountDetachDevices`): unmount the devices
    /// of volumes no pod uses (only after the last pod's tear-down), then
    /// forget them (nothing to detach for these plugins), and the operation
    /// records of volumes neither world has.
    pub(super) fn unmount_detach_devices(
        dsw: &DesiredStateOfWorld,
        asw: &ActualStateOfWorld,
        scope: &[UniqueVolumeName],
        pass: &mut Pass,
    ) {
        for v in scope {
            if v.as_str().starts_with(POD_DIR_PREFIX) {
                continue;
            }
            // The kubelet's `VolumeExists(name, seLinuxMountContext)`: a
            // device mounted with another label than the one now desired
            // is unmounted once no pod uses it.
            let context = asw
                .volume(v)
                .and_then(|av| av.selinux_mount_context.as_deref());
            if dsw.volume_exists_with_selinux_context(v, context) {
                continue;
            }
            match asw.volume(v) {
                Some(av)
                    if av.pods.is_empty()
                        && av.device_mount_state != DeviceMountState::NotMounted =>
                {
                    pass.actions.push(Action::UnmountDevice {
                        volume: v.clone(),
                        plugin: Arc::clone(&av.plugin_name),
                        spec: av.device_spec.clone(),
                    });
                }
                Some(av) if av.pods.is_empty() => pass.detach.push(v.clone()),
                Some(_) => {}
                None => pass.forget.push(v.clone()),
            }
        }
    }

    /// Forgets the volumes phase 4 found unused (if still unused: an
    /// operation may have finished since) and the operation records of those
    /// neither world has.
    pub(super) fn detach_and_forget(
        &self,
        detach: Vec<UniqueVolumeName>,
        mut forget: Vec<UniqueVolumeName>,
    ) {
        if !detach.is_empty() {
            let mut asw = self.world.asw_mut();
            let before = forget.len();
            for v in &detach {
                if asw.mark_volume_as_detached(v) {
                    forget.push(v.clone());
                }
            }
            drop(asw);
            // A change of the actual state: waiters and cached answers
            // (`GetVolumesInUse`, `VolumeIsAttached`) see it.
            if forget.len() > before {
                // A volume forgotten for its old SELinux label is wanted
                // with the new one: the next pass mounts it.
                let dsw = self.world.dsw();
                let wanted: Vec<_> = forget[before..]
                    .iter()
                    .filter(|v| dsw.volume_exists(v))
                    .cloned()
                    .collect();
                drop(dsw);
                if !wanted.is_empty() {
                    self.world.mark_dirty(wanted);
                }
                self.world.bump();
            }
        }
        for v in forget {
            self.executor.forget_volume(&v);
        }
    }
}
