//! Phase 3 (the kubelet's `mountOrAttachVolumes`): set up what is desired,
//! the device first for plugins with a device phase, and grow volumes whose
//! desired size grew.

use std::sync::Arc;

use super::action::Action;
use super::{Pass, Reconciler, POD_DIR_PREFIX};
use crate::cache::actual_state_of_world::{ActualStateOfWorld, DeviceMountState, VolumeMountState};
use crate::cache::desired_state_of_world::{DesiredStateOfWorld, PodToMount, VolumeToMount};
use crate::plugins::MountRequest;
use crate::volume::{PodUid, SubPath, UniqueVolumeName, VolumeSpec};

impl Reconciler {
    /// Phase 3 (the kubelet's `mountOrAttachVolumes`): set up what is
    /// desired and not (certainly) set up, after the device where the
    /// plugin has a device phase; grow mounted volumes whose desired size
    /// is beyond the size recorded (the kubelet's `volumeNeedsExpansion`).
    pub(super) fn mount_or_attach_volumes(
        &self,
        dsw: &DesiredStateOfWorld,
        asw: &ActualStateOfWorld,
        scope: &[UniqueVolumeName],
        pass: &mut Pass,
    ) {
        for v in scope {
            if let Some(uid) = v.as_str().strip_prefix(POD_DIR_PREFIX) {
                // A clean-up finished or its backoff expired.
                pass.pod_dirs.extend(PodUid::new(uid).ok());
                continue;
            }
            let Some(dv) = dsw.volume(v) else { continue };
            if Self::selinux_mount_mismatch(v, dv, asw) {
                continue;
            }
            if self.attach_wait(v, dv, asw).is_some() {
                continue;
            }
            if self.mount_device_or_expand(v, dv, asw, pass) {
                continue;
            }
            for (pod, p) in &dv.pods {
                pass.actions
                    .extend(self.pod_action(v, &dv.plugin_name, pod, p, asw));
            }
        }
    }

    /// The kubelet's SELinux check of `PodExistsInVolume` in
    /// `mountOrAttachVolumes`: a volume mounted with another label than
    /// its pods need is left alone (each such pod shows the kubelet's
    /// `waiting for unmount of volume ...` error in status and
    /// `WaitForAttachAndMount`); phase 4 unmounts its device once no pod
    /// uses it, and the next pass mounts it with the new label.
    fn selinux_mount_mismatch(
        v: &UniqueVolumeName,
        dv: &VolumeToMount,
        asw: &ActualStateOfWorld,
    ) -> bool {
        let Some(have) = asw
            .volume(v)
            .and_then(|a| a.selinux_mount_context.as_deref())
        else {
            return false;
        };
        dv.pods
            .values()
            .any(|p| p.selinux_label.as_deref().unwrap_or("") != have)
    }

    /// What `pod`'s use `p` of `v` needs: a set-up (with the released
    /// subPaths: those already bound are kept, those lost with the volume
    /// bound again), or, set up, the subPaths released since and not
    /// prepared yet (a container may start now).
    pub(super) fn pod_action(
        &self,
        v: &UniqueVolumeName,
        plugin: &Arc<str>,
        pod: &PodUid,
        p: &PodToMount,
        asw: &ActualStateOfWorld,
    ) -> Option<Action> {
        let mounted = asw.pod_mount(v, pod);
        let needs = match mounted {
            Some(m) => {
                m.state != VolumeMountState::Mounted
                    || m.spec.source.kind() != p.spec.source.kind()
                    || self.requires_remount(v, plugin, &m.spec, &p.spec)
            }
            None => true,
        };
        let sub_paths: Vec<SubPath> = p
            .sub_paths
            .iter()
            .filter(|s| {
                p.sub_path_release.releases(&s.container)
                    && (needs || !asw.sub_path_prepared(v, pod, &s.container, s.index))
            })
            .cloned()
            .collect();
        match mounted {
            _ if needs => Some(Action::Mount {
                volume: v.clone(),
                pod: pod.clone(),
                plugin: Arc::clone(plugin),
                req: MountRequest {
                    pod_uid: pod.clone(),
                    volume_name: v.clone(),
                    spec: Arc::clone(&p.spec),
                    fs_group: p.fs_group,
                    fs_group_change_policy: p.fs_group_change_policy,
                    selinux_label: p.selinux_label.clone(),
                },
                sub_paths,
            }),
            Some(m) if !sub_paths.is_empty() => Some(Action::PrepareSubPaths {
                volume: v.clone(),
                pod: pod.clone(),
                plugin: Arc::clone(plugin),
                mounted: m.clone(),
                sub_paths,
            }),
            _ => None,
        }
    }

    /// The kubelet's `RequiresRemount` check for a mounted volume: only
    /// payload volumes (configMap, secret, downwardAPI, projected) and
    /// volumes of `requiresRepublish` CSI drivers are ever set up again in
    /// place, so the plugin is asked only for them.
    pub(super) fn requires_remount(
        &self,
        v: &UniqueVolumeName,
        plugin: &str,
        mounted: &Arc<VolumeSpec>,
        desired: &Arc<VolumeSpec>,
    ) -> bool {
        use crate::volume::VolumeSource;
        let in_place = match &desired.source {
            VolumeSource::Payload(_) => true,
            VolumeSource::Csi(c) => c.driver_info.requires_republish,
            _ => false,
        };
        if !in_place {
            return false;
        }
        self.plugins
            .find_by_name(plugin)
            .is_some_and(|p| p.requires_remount(v, mounted, desired))
    }

    /// The volume-wide part of phase 3: mounts the device first, once, for
    /// plugins with a device phase (returns `true`: no pod is set up before
    /// it is mounted), and grows a mounted volume whose desired size is
    /// beyond the recorded one.
    pub(super) fn mount_device_or_expand(
        &self,
        v: &UniqueVolumeName,
        dv: &VolumeToMount,
        asw: &ActualStateOfWorld,
        pass: &mut Pass,
    ) -> bool {
        let Some(first) = dv.pods.values().next() else {
            return false;
        };
        let Some(plugin) = self.plugins.find_by_name(&dv.plugin_name) else {
            return false;
        };
        let device_mountable = plugin
            .device_mountable()
            .is_some_and(|d| d.can_device_mount(&first.spec));
        if device_mountable && asw.device_mount_state(v) != DeviceMountState::Mounted {
            pass.actions.push(Action::MountDevice {
                volume: v.clone(),
                plugin: Arc::clone(&dv.plugin_name),
                spec: Arc::clone(&first.spec),
                fs_group: first.fs_group,
            });
            return true;
        }
        let (Some(ex), Some(av)) = (plugin.node_expandable(), asw.volume(v)) else {
            return false;
        };
        // The recorded size, or the claim's (the kubelet's
        // `InitializeClaimSize`, for a volume found without a record).
        let have = av.size_bytes.or_else(|| ex.claim_size(&first.spec));
        if let (Some(want), Some(have)) = (ex.requested_size(&first.spec), have) {
            let mounted = av
                .pods
                .values()
                .any(|m| m.state == VolumeMountState::Mounted);
            // A size the driver said it cannot reach is not asked again; not a
            // read-only volume (the kubelet's populator records no desired size
            // for one).
            if want > have
                && mounted
                && av.expansion_infeasible != Some(want)
                && !first.spec.read_only()
            {
                pass.actions.push(Action::Expand {
                    volume: v.clone(),
                    plugin: Arc::clone(&dv.plugin_name),
                    spec: Arc::clone(&first.spec),
                    new_size: want,
                });
            }
        }
        false
    }
}
