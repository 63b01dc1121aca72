//! The kubelet's `ActualStateOfWorld`: which volumes are attached and mounted,
//! per volume and per pod, including *uncertain* mounts (an operation that may
//! or may not have happened), and the foreign mounts found stacked on pods'
//! volume paths that the reconciler must remove. Written by operation results,
//! resync and reconstruction; the tracer only marks volumes lost (uncertain)
//! or as carrying foreign mounts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::pod_map::PodMap;
use crate::util::fast_map::FastMap;
use crate::volume::{PodUid, UniqueVolumeName, VolumeSpec};

/// The state of one pod's mount of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeMountState {
    /// Set up and verified.
    Mounted,
    /// May or may not be set up: set-up must run again before it is trusted,
    /// and tear-down must run if it is no longer wanted.
    Uncertain,
}

/// The state of a volume's device mount (staging), for plugins that have one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceMountState {
    /// Not mounted.
    NotMounted,
    /// Mounted at the global path.
    Mounted,
    /// May or may not be mounted.
    Uncertain,
}

/// A pod's mount of a volume.
#[derive(Debug, Clone)]
pub struct MountedPod {
    /// The spec it was mounted with (its `name` is the volume's name in the
    /// pod: [`MountedPod::outer_volume_spec_name`]).
    pub spec: Arc<VolumeSpec>,
    /// Where it is.
    pub path: PathBuf,
    /// Mounted or uncertain.
    pub state: VolumeMountState,
    /// The unique id of the mount at `path`, for volumes set up by a mount,
    /// when known (see [`VolumePlugin::mount_id`](crate::plugins::VolumePlugin::mount_id)).
    pub mount_id: Option<u64>,
    /// Whether the container runtime may relabel it for SELinux, as its
    /// plugin said once it was set up (see
    /// [`VolumePlugin::selinux_relabel`](crate::plugins::VolumePlugin::selinux_relabel)).
    pub selinux_relabel: bool,
}

impl MountedPod {
    /// The volume's name in the pod (the kubelet's `OuterVolumeSpecName`):
    /// the name of the spec it was mounted with, not stored twice (one
    /// string less per mounted volume).
    pub fn outer_volume_spec_name(&self) -> &str {
        &self.spec.name
    }
}

/// Mounts found on a pod's volume path that its plugin did not make (the
/// tracer's finding), waiting for the reconciler to remove them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignMounts {
    /// The out-of-band log's sequence number of the finding, for reporting
    /// the outcome of their removal.
    pub log_seq: u64,
}

/// A volume known to the node.
#[derive(Debug, Clone)]
pub struct AttachedVolume {
    /// The plugin handling it.
    pub plugin_name: Arc<str>,
    /// Staging state.
    pub device_mount_state: DeviceMountState,
    /// Where the device is (or may be) mounted.
    pub device_mount_path: Option<PathBuf>,
    /// The unique id of the mount at `device_mount_path`, when the plugin
    /// (its driver) mounted something there: the resync and the tracer then
    /// watch it, and a device whose mount is gone becomes uncertain (see
    /// [`DeviceMountableVolumePlugin::device_mount_id`](crate::plugins::DeviceMountableVolumePlugin::device_mount_id)).
    pub device_mount_id: Option<u64>,
    /// The spec the device was mounted with (kept after the last pod's
    /// tear-down, for unmounting the device).
    pub device_spec: Option<Arc<VolumeSpec>>,
    /// The size the volume was mounted or last expanded to (the kubelet's
    /// `persistentVolumeSize`), when known.
    pub size_bytes: Option<u64>,
    /// A size NodeExpand found it cannot grow the mounted volume to (the
    /// kubelet's in-use expansion error and infeasible expansion): not
    /// tried again while the volume is known; another size is.
    pub expansion_infeasible: Option<u64>,
    /// The kubelet's `seLinuxMountContext`: the SELinux label (`context=`)
    /// the volume is mounted with, compared with each pod's
    /// ([`ActualStateOfWorld::selinux_mount_mismatch`]). `None`: not known
    /// (nothing is compared); `Some("")`: mounted without one. Set by the
    /// device's mount when it has a label (the kubelet's
    /// `MarkDeviceAsMounted`), else by the first pod's mount (its
    /// `AddPodToVolume`); gone with the volume.
    pub selinux_mount_context: Option<Arc<str>>,
    /// The pods it is mounted for.
    pub pods: PodMap<MountedPod>,
    /// The pods whose mount of it carries foreign mounts to remove.
    pub foreign_mounts: PodMap<ForeignMounts>,
    /// Per pod, the subPath bind mounts prepared for its containers
    /// (`(container, index)` of the `volumeMount`).
    pub sub_paths: PodMap<Vec<(String, usize)>>,
}

impl AttachedVolume {
    /// Sets the device's state; unless it is mounted, its pods' mounts
    /// become uncertain and its mount id is forgotten.
    fn set_device_state(&mut self, state: DeviceMountState) {
        self.device_mount_state = state;
        if state == DeviceMountState::Mounted {
            return;
        }
        self.device_mount_id = None;
        for m in self.pods.values_mut() {
            m.state = VolumeMountState::Uncertain;
        }
    }
}

/// The kubelet's `seLinuxMountMismatchError`: a pod needs a volume with
/// another SELinux label than the one it is mounted with (for another pod
/// that is gone, or going).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("waiting for unmount of volume {:?}, because it is already mounted to a different pod with a different SELinux label", .volume_name.as_str())]
pub struct SeLinuxMountMismatch {
    /// The volume.
    pub volume_name: UniqueVolumeName,
}

/// The context of a volume mounted without an SELinux label.
static NO_LABEL: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();

/// A row of [`ActualStateOfWorld::mounted_volumes_for_pod`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    /// The volume's unique name.
    pub volume_name: UniqueVolumeName,
    /// Its name in the pod.
    pub outer_volume_spec_name: String,
    /// The plugin.
    pub plugin_name: String,
    /// The path the container runtime should use.
    pub path: PathBuf,
    /// Mounted or uncertain.
    pub state: VolumeMountState,
}

/// The actual state of world.
#[derive(Debug, Default)]
pub struct ActualStateOfWorld {
    volumes: FastMap<UniqueVolumeName, AttachedVolume>,
    /// Index: the volumes each pod has mounted.
    by_pod: FastMap<PodUid, Vec<UniqueVolumeName>>,
    /// Moves on whenever a pod's mount is recorded as mounted (new, or
    /// with a new path, spec or mount id): see [`Self::mounted_generation`].
    mounted_generation: u64,
}

impl ActualStateOfWorld {
    /// Records a volume as attached (a no-op for volumes already known).
    pub fn mark_volume_as_attached(&mut self, volume: &UniqueVolumeName, plugin: Arc<str>) {
        self.volumes
            .entry(volume.clone())
            .or_insert_with(|| AttachedVolume {
                plugin_name: plugin,
                device_mount_state: DeviceMountState::NotMounted,
                device_mount_path: None,
                device_mount_id: None,
                device_spec: None,
                size_bytes: None,
                expansion_infeasible: None,
                selinux_mount_context: None,
                pods: PodMap::default(),
                foreign_mounts: PodMap::default(),
                sub_paths: PodMap::default(),
            });
    }

    /// Records a pod's mount of a volume (the volume must be attached).
    /// Returns whether anything changed.
    pub fn mark_volume_as_mounted(
        &mut self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        mounted: MountedPod,
    ) -> bool {
        let Some(v) = self.volumes.get_mut(volume) else {
            return false;
        };
        let changed = v.pods.get(pod).is_none_or(|m| {
            m.state != mounted.state
                || m.path != mounted.path
                || m.spec != mounted.spec
                || m.mount_id != mounted.mount_id
        });
        if changed && mounted.state == VolumeMountState::Mounted {
            self.mounted_generation += 1;
        }
        v.pods.insert(pod.clone(), mounted);
        let vols = self.by_pod.entry(pod.clone()).or_default();
        if !vols.contains(volume) {
            vols.push(volume.clone());
        }
        changed
    }

    /// A count that moves on whenever a pod's mount is recorded as mounted.
    /// While it stands still, the set of mounts recorded as mounted only
    /// shrinks: a resync that checked them all needs to check none again
    /// until something else changes.
    pub fn mounted_generation(&self) -> u64 {
        self.mounted_generation
    }

    /// Removes a pod's mount of a volume (and any foreign mounts found on
    /// it). Returns whether it was recorded.
    pub fn mark_volume_as_unmounted(&mut self, volume: &UniqueVolumeName, pod: &PodUid) -> bool {
        let removed = self.volumes.get_mut(volume).is_some_and(|v| {
            v.foreign_mounts.remove(pod);
            v.sub_paths.remove(pod);
            v.pods.remove(pod).is_some()
        });
        if let Some(set) = self.by_pod.get_mut(pod) {
            set.retain(|v| v != volume);
            if set.is_empty() {
                self.by_pod.remove(pod);
            }
        }
        removed
    }

    /// Records foreign mounts found on `pod`'s mount of `volume`, for the
    /// reconciler to remove. Returns whether that mount is recorded (the mark
    /// is kept only then).
    pub fn mark_foreign_mounts(
        &mut self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        found: ForeignMounts,
    ) -> bool {
        match self.volumes.get_mut(volume) {
            Some(v) if v.pods.contains_key(pod) => {
                v.foreign_mounts.insert(pod.clone(), found);
                true
            }
            _ => false,
        }
    }

    /// The foreign mounts waiting for removal on `pod`'s mount of `volume`.
    pub fn foreign_mounts(&self, volume: &UniqueVolumeName, pod: &PodUid) -> Option<ForeignMounts> {
        self.volumes
            .get(volume)
            .and_then(|v| v.foreign_mounts.get(pod).copied())
    }

    /// Clears the foreign-mounts mark of `pod`'s mount of `volume` once they
    /// are handled, unless a newer finding replaced `handled`.
    pub fn clear_foreign_mounts(
        &mut self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        handled: ForeignMounts,
    ) {
        if let Some(v) = self.volumes.get_mut(volume) {
            if v.foreign_mounts.get(pod) == Some(&handled) {
                v.foreign_mounts.remove(pod);
            }
        }
    }

    /// Records subPath bind mounts prepared on `pod`'s mount of `volume`
    /// (kept only while that mount is recorded). Returns whether any is new.
    pub fn mark_sub_paths_prepared<'a>(
        &mut self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        subs: impl IntoIterator<Item = (&'a str, usize)>,
    ) -> bool {
        let Some(v) = self.volumes.get_mut(volume) else {
            return false;
        };
        if !v.pods.contains_key(pod) {
            return false;
        }
        let list = v.sub_paths.get_or_insert_with(pod, Vec::new);
        let mut added = false;
        for (c, i) in subs {
            if !list.iter().any(|(pc, pi)| pc == c && *pi == i) {
                list.push((c.to_string(), i));
                added = true;
            }
        }
        added
    }

    /// Forgets the subPath bind mounts of `pod`'s mount of `volume` (they
    /// were cleaned before its tear-down).
    pub fn forget_sub_paths(&mut self, volume: &UniqueVolumeName, pod: &PodUid) {
        if let Some(v) = self.volumes.get_mut(volume) {
            v.sub_paths.remove(pod);
        }
    }

    /// Whether the subPath of `container`'s `volumeMount` `index` is
    /// prepared on `pod`'s mount of `volume`.
    pub fn sub_path_prepared(
        &self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        container: &str,
        index: usize,
    ) -> bool {
        self.volumes
            .get(volume)
            .and_then(|v| v.sub_paths.get(pod))
            .is_some_and(|l| l.iter().any(|(c, i)| c == container && *i == index))
    }

    /// Whether `pod` has any volume mounted (or uncertain).
    pub fn pod_has_mounts(&self, pod: &PodUid) -> bool {
        self.by_pod.contains_key(pod)
    }

    /// Every pod that has a volume mounted (or uncertain).
    pub fn pods(&self) -> impl Iterator<Item = &PodUid> {
        self.by_pod.keys()
    }

    /// Forgets a volume no pod has mounted and whose device is not (or not
    /// possibly) mounted (the kubelet's `MarkVolumeAsDetached`).
    pub fn mark_volume_as_detached(&mut self, volume: &UniqueVolumeName) -> bool {
        match self.volumes.get(volume) {
            Some(v)
                if v.pods.is_empty() && v.device_mount_state == DeviceMountState::NotMounted =>
            {
                self.volumes.remove(volume).is_some()
            }
            _ => false,
        }
    }

    /// Records the staging state of a volume. A device no longer certainly
    /// mounted takes its pods' mounts with it (see [`Self::mark_device`]).
    pub fn set_device_mount_state(&mut self, volume: &UniqueVolumeName, state: DeviceMountState) {
        if let Some(v) = self.volumes.get_mut(volume) {
            v.set_device_state(state);
        }
    }

    /// Records a volume's device as mounted (or uncertain) at `path` with
    /// `spec` (the kubelet's `MarkDeviceAsMounted` / `MarkDeviceAsUncertain`).
    /// The volume must be attached.
    ///
    /// A pod's mount of a volume with a device phase is made from the
    /// device's mount (a CSI publish is often a bind of the staging path):
    /// it is mounted only while the device is. A device that is not (or not
    /// certainly) mounted makes every pod's mount of it *uncertain*, so the
    /// reconciler mounts the device again and then sets each pod's mount up
    /// again, in the kubelet's order (NodeStage, then NodePublish).
    pub fn mark_device(
        &mut self,
        volume: &UniqueVolumeName,
        state: DeviceMountState,
        spec: Arc<VolumeSpec>,
        path: Option<PathBuf>,
    ) {
        if let Some(v) = self.volumes.get_mut(volume) {
            v.set_device_state(state);
            // The kubelet's `SetDeviceMountState`: a label replaces the
            // one known; a device without one changes nothing.
            if let Some(l) = super::selinux::mount_label(&spec).filter(|l| !l.is_empty()) {
                v.selinux_mount_context = Some(Arc::from(l));
            }
            v.device_spec = Some(spec);
            if path.is_some() {
                v.device_mount_path = path;
            }
        }
    }

    /// Records that a pod's mount of `volume` was made with the SELinux
    /// label `label` (`None`: without one), if the volume's is not known
    /// yet (the kubelet's `AddPodToVolume`: the first mount sets the
    /// volume's `seLinuxMountContext`).
    pub fn add_pod_selinux_mount_context(
        &mut self,
        volume: &UniqueVolumeName,
        label: Option<&str>,
    ) {
        if let Some(v) = self.volumes.get_mut(volume) {
            if v.selinux_mount_context.is_none() {
                v.selinux_mount_context = Some(match label {
                    Some(l) if !l.is_empty() => Arc::from(l),
                    // One shared "no label" for every volume, not an
                    // allocation each.
                    _ => Arc::clone(NO_LABEL.get_or_init(|| Arc::from(""))),
                });
            }
        }
    }

    /// The kubelet's SELinux check of `PodExistsInVolume`: the error when
    /// `volume` is mounted with a known SELinux label other than `label`,
    /// the one a pod needs (`None`: none). Such a pod is not set up: the
    /// volume's device is unmounted once no pod uses it and mounted again
    /// with the new label.
    pub fn selinux_mount_mismatch(
        &self,
        volume: &UniqueVolumeName,
        label: Option<&str>,
    ) -> Option<SeLinuxMountMismatch> {
        let have = self.volumes.get(volume)?.selinux_mount_context.as_deref()?;
        (have != label.unwrap_or("")).then(|| SeLinuxMountMismatch {
            volume_name: volume.clone(),
        })
    }

    /// Records the unique id of the mount at a volume's device mount path
    /// (`None`: nothing the manager can watch there).
    pub fn set_device_mount_id(&mut self, volume: &UniqueVolumeName, id: Option<u64>) {
        if let Some(v) = self.volumes.get_mut(volume) {
            v.device_mount_id = id;
        }
    }

    /// Records a volume's device as unmounted (the kubelet's `MarkDeviceAsUnmounted`).
    pub fn mark_device_as_unmounted(&mut self, volume: &UniqueVolumeName) {
        if let Some(v) = self.volumes.get_mut(volume) {
            v.set_device_state(DeviceMountState::NotMounted);
        }
    }

    /// The device mount state of a volume (`NotMounted` for unknown volumes).
    pub fn device_mount_state(&self, volume: &UniqueVolumeName) -> DeviceMountState {
        self.volumes
            .get(volume)
            .map_or(DeviceMountState::NotMounted, |v| v.device_mount_state)
    }

    /// Records the size a volume was mounted or expanded to.
    pub fn set_volume_size(&mut self, volume: &UniqueVolumeName, size: Option<u64>) {
        if let Some(v) = self.volumes.get_mut(volume) {
            v.size_bytes = size;
        }
    }

    /// Records that growing a volume to `size` bytes cannot work (see
    /// [`AttachedVolume::expansion_infeasible`]).
    pub fn mark_expansion_infeasible(&mut self, volume: &UniqueVolumeName, size: u64) {
        if let Some(v) = self.volumes.get_mut(volume) {
            v.expansion_infeasible = Some(size);
        }
    }

    /// One volume.
    pub fn volume(&self, volume: &UniqueVolumeName) -> Option<&AttachedVolume> {
        self.volumes.get(volume)
    }

    /// Every volume.
    pub fn volumes(&self) -> impl Iterator<Item = (&UniqueVolumeName, &AttachedVolume)> {
        self.volumes.iter()
    }

    /// The mount of `volume` for `pod`, if any.
    pub fn pod_mount(&self, volume: &UniqueVolumeName, pod: &PodUid) -> Option<&MountedPod> {
        self.volumes.get(volume).and_then(|v| v.pods.get(pod))
    }

    /// The volumes mounted (or uncertain) for a pod. `volumes` narrows the
    /// search to the pod's own volumes; without it every volume is scanned.
    pub fn mounted_volumes_for_pod<'a>(
        &self,
        pod: &PodUid,
        volumes: impl IntoIterator<Item = &'a UniqueVolumeName>,
    ) -> Vec<MountedVolume> {
        volumes
            .into_iter()
            .filter_map(|name| {
                let v = self.volumes.get(name)?;
                let m = v.pods.get(pod)?;
                Some(MountedVolume {
                    volume_name: name.clone(),
                    outer_volume_spec_name: m.outer_volume_spec_name().to_owned(),
                    plugin_name: v.plugin_name.to_string(),
                    path: m.path.clone(),
                    state: m.state,
                })
            })
            .collect()
    }

    /// Every mount (or uncertain mount) of the pod whose UID is `uid`, as
    /// borrowed `(volume name, plugin name, mount)` — for readers that
    /// serialize straight from the state without copying it.
    pub fn mounts_of_pod<'a>(
        &'a self,
        uid: &'a str,
    ) -> impl Iterator<Item = (&'a UniqueVolumeName, &'a str, &'a MountedPod)> + 'a {
        self.by_pod
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(move |name| {
                let v = self.volumes.get(name)?;
                let m = v.pods.get_str(uid)?;
                Some((name, &*v.plugin_name, m))
            })
    }

    /// Every mount of a pod, desired or not.
    pub fn all_mounts_of_pod(&self, pod: &PodUid) -> Vec<MountedVolume> {
        match self.by_pod.get(pod) {
            Some(names) => self.mounted_volumes_for_pod(pod, names.iter()),
            None => Vec::new(),
        }
    }

    /// Number of (volume, pod) mounts, per plugin.
    pub fn count_by_plugin(&self) -> HashMap<Arc<str>, usize> {
        let mut out = HashMap::new();
        for v in self.volumes.values() {
            *out.entry(Arc::clone(&v.plugin_name)).or_default() += v.pods.len();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{StorageMedium, VolumeSource};

    #[test]
    fn mount_unmount_detach() {
        let mut a = ActualStateOfWorld::default();
        let pod = PodUid::new("p").unwrap();
        let v = UniqueVolumeName::new("x");
        let spec = Arc::new(VolumeSpec {
            name: "x".into(),
            source: VolumeSource::EmptyDir {
                medium: StorageMedium::Default,
                size_limit: None,
            },
        });
        let m = MountedPod {
            spec,
            path: "/a".into(),
            state: VolumeMountState::Uncertain,
            mount_id: None,
            selinux_relabel: false,
        };
        assert!(!a.mark_volume_as_mounted(&v, &pod, m.clone()));
        a.mark_volume_as_attached(&v, "plug".into());
        assert!(a.mark_volume_as_mounted(&v, &pod, m.clone()));
        assert!(!a.mark_volume_as_mounted(&v, &pod, m.clone()));
        let mounted = MountedPod {
            state: VolumeMountState::Mounted,
            ..m
        };
        assert!(a.mark_volume_as_mounted(&v, &pod, mounted));
        assert_eq!(a.all_mounts_of_pod(&pod).len(), 1);
        assert!(!a.mark_volume_as_detached(&v));
        assert!(a.mark_volume_as_unmounted(&v, &pod));
        assert!(a.mark_volume_as_detached(&v));
        assert!(a.volume(&v).is_none());
    }

    /// A pod's mount is made from the device's: a device that is no longer
    /// certainly mounted (found so at start-up, lost, failed) makes its
    /// pods' mounts uncertain, so they are set up again after it.
    #[test]
    fn a_device_not_certainly_mounted_makes_its_pods_uncertain() {
        let mut a = ActualStateOfWorld::default();
        let v = UniqueVolumeName::new("x");
        let spec = Arc::new(VolumeSpec {
            name: "x".into(),
            source: VolumeSource::EmptyDir {
                medium: StorageMedium::Default,
                size_limit: None,
            },
        });
        a.mark_volume_as_attached(&v, "plug".into());
        a.mark_device(
            &v,
            DeviceMountState::Mounted,
            spec.clone(),
            Some("/g".into()),
        );
        a.set_device_mount_id(&v, Some(7));
        let (p, q) = (PodUid::new("p").unwrap(), PodUid::new("q").unwrap());
        for pod in [&p, &q] {
            let m = MountedPod {
                spec: spec.clone(),
                path: "/a".into(),
                state: VolumeMountState::Mounted,
                mount_id: None,
                selinux_relabel: false,
            };
            a.mark_volume_as_mounted(&v, pod, m);
        }
        a.set_device_mount_state(&v, DeviceMountState::Uncertain);
        for pod in [&p, &q] {
            assert_eq!(
                a.pod_mount(&v, pod).unwrap().state,
                VolumeMountState::Uncertain
            );
        }
        assert_eq!(a.volume(&v).unwrap().device_mount_id, None);
    }

    /// The kubelet's `Test_MarkVolumeAsAttached_Positive_ExistingVolume`
    /// (`cache/actual_state_of_world_test.go`): marking a known volume
    /// attached again keeps it as it is (one volume, its device and pods).
    #[test]
    fn attaching_a_known_volume_again_keeps_it() {
        let mut a = ActualStateOfWorld::default();
        let v = UniqueVolumeName::new("x");
        let spec = Arc::new(VolumeSpec {
            name: "x".into(),
            source: VolumeSource::EmptyDir {
                medium: StorageMedium::Default,
                size_limit: None,
            },
        });
        a.mark_volume_as_attached(&v, "plug".into());
        a.mark_device(
            &v,
            DeviceMountState::Mounted,
            spec.clone(),
            Some("/g".into()),
        );
        let pod = PodUid::new("p").unwrap();
        let m = MountedPod {
            spec,
            path: "/a".into(),
            state: VolumeMountState::Mounted,
            mount_id: None,
            selinux_relabel: false,
        };
        assert!(a.mark_volume_as_mounted(&v, &pod, m));
        a.mark_volume_as_attached(&v, "plug".into());
        assert_eq!(a.volumes().count(), 1);
        assert_eq!(a.device_mount_state(&v), DeviceMountState::Mounted);
        assert_eq!(a.all_mounts_of_pod(&pod).len(), 1);
    }

    /// The kubelet's `seLinuxMountContext` rules: the first pod's mount
    /// sets it (no label: `""`), a device mounted with a label replaces it,
    /// later pods do not; a pod that needs another label gets the
    /// kubelet's `seLinuxMountMismatchError`; unknown compares with nothing.
    #[test]
    fn the_selinux_mount_context_follows_the_kubelets_rules() {
        let mut a = ActualStateOfWorld::default();
        let v = UniqueVolumeName::new("kubernetes.io/csi/d^h");
        a.mark_volume_as_attached(&v, "plug".into());
        assert_eq!(a.selinux_mount_mismatch(&v, Some("x")), None, "unknown");
        a.add_pod_selinux_mount_context(&v, None);
        a.add_pod_selinux_mount_context(&v, Some("x"));
        assert_eq!(a.selinux_mount_mismatch(&v, None), None);
        let e = a.selinux_mount_mismatch(&v, Some("x")).unwrap();
        assert_eq!(
            e.to_string(),
            "waiting for unmount of volume \"kubernetes.io/csi/d^h\", because it is already mounted to a different pod with a different SELinux label"
        );
        let mut src = crate::volume::CsiVolumeSource::new("d", "h");
        Arc::make_mut(&mut src.driver_info).selinux_mount_label = Some("x".into());
        let spec = Arc::new(VolumeSpec {
            name: "pv".into(),
            source: VolumeSource::Csi(Box::new(src)),
        });
        a.mark_device(&v, DeviceMountState::Mounted, spec, None);
        assert_eq!(a.selinux_mount_mismatch(&v, Some("x")), None);
        assert!(a.selinux_mount_mismatch(&v, None).is_some());
        a.mark_device_as_unmounted(&v);
        assert!(a.mark_volume_as_detached(&v));
        a.mark_volume_as_attached(&v, "plug".into());
        assert_eq!(a.selinux_mount_mismatch(&v, None), None, "gone with it");
    }

    #[test]
    fn a_mounted_device_keeps_the_volume_until_unmounted() {
        let mut a = ActualStateOfWorld::default();
        let v = UniqueVolumeName::new("x");
        let spec = Arc::new(VolumeSpec {
            name: "x".into(),
            source: VolumeSource::EmptyDir {
                medium: StorageMedium::Default,
                size_limit: None,
            },
        });
        a.mark_volume_as_attached(&v, "plug".into());
        a.mark_device(&v, DeviceMountState::Uncertain, spec, Some("/g".into()));
        assert_eq!(a.device_mount_state(&v), DeviceMountState::Uncertain);
        assert!(!a.mark_volume_as_detached(&v), "device possibly mounted");
        a.mark_device_as_unmounted(&v);
        assert_eq!(
            a.volume(&v).unwrap().device_mount_path.as_deref(),
            Some(std::path::Path::new("/g"))
        );
        assert!(a.mark_volume_as_detached(&v));
    }
}
