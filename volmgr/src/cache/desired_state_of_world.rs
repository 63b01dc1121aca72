//! The kubelet's `DesiredStateOfWorld`: which volumes each pod on the node
//! needs. Written by the populator, except the volumes' *reported in use*
//! flags, which the facade sets (the kubelet's `MarkVolumesReportedInUse`).

use std::collections::HashMap;
use std::sync::Arc;

use super::pod_map::PodMap;
use crate::util::fast_map::{FastMap, FastSet};
use crate::volume::{PodUid, SubPath, SubPathRelease, UniqueVolumeName, VolumeSpec};

/// A pod that needs a volume, with what the mount needs to know.
#[derive(Debug, Clone, PartialEq)]
pub struct PodToMount {
    /// The volume's names in the pod spec (the kubelet's
    /// `outerVolumeSpecNames`): one, or more when several volumes of the
    /// pod name the same claim (one volume, set up once, for each name).
    pub outer_volume_spec_names: Vec<String>,
    /// The pod's spec of the volume.
    pub spec: Arc<VolumeSpec>,
    /// `fsGroup`.
    pub fs_group: Option<i64>,
    /// `fsGroupChangePolicy`.
    pub fs_group_change_policy: crate::volume::FsGroupChangePolicy,
    /// The SELinux label the volume is mounted with (`context=`; the
    /// kubelet's `effectiveSELinuxMountFileLabel`), set when the pod is
    /// added ([`super::selinux`]); what the populator gives is replaced.
    pub selinux_label: Option<Arc<str>>,
    /// What the pod says about the volume's SELinux label.
    pub selinux: super::selinux::VolumeSeLinux,
    /// The containers' subPath uses of the volume, bind-mounted after its
    /// set-up for the containers `sub_path_release` names, for the others
    /// when asked (at container start).
    pub sub_paths: Vec<SubPath>,
    /// Whose subPaths the reconciler prepares on its own.
    pub sub_path_release: SubPathRelease,
}

impl PodToMount {
    /// The first of its names in the pod spec (the one its spec is named
    /// after, and its subPath directories).
    pub fn outer_volume_spec_name(&self) -> &str {
        self.outer_volume_spec_names
            .first()
            .map_or("", String::as_str)
    }
}

/// Why an attachable volume waits, when the manager sets such volumes up
/// only once reported in use (the kubelet's `VerifyControllerAttachedVolume`
/// error).
pub const NOT_REPORTED_IN_USE: &str =
    "Volume has not been added to the list of VolumesInUse in the node's volume status";

/// Why an attachable volume waits, when the manager sets such volumes up
/// only once the Node's `status.volumesAttached` lists them (the kubelet's
/// `VerifyControllerAttachedVolume` error).
pub const NOT_ATTACHED: &str = "Volume not attached according to node status";

/// A volume some pods need.
#[derive(Debug, Clone)]
pub struct VolumeToMount {
    /// The plugin that handles it.
    pub plugin_name: Arc<str>,
    /// The pods that need it.
    pub pods: PodMap<PodToMount>,
    /// Listed as in use in the node's status at the last report (the
    /// kubelet's `reportedInUse`): false for a volume added since.
    pub reported_in_use: bool,
    /// Listed in the Node's `status.volumesAttached` at the last read (the
    /// attach/detach controller attached it to this node).
    pub attached: bool,
    /// The kubelet's `originalSELinuxLabel`: the label of the pod that
    /// added the volume, which any other pod must match.
    pub original_selinux_label: Option<Arc<str>>,
    /// The kubelet's `effectiveSELinuxMountFileLabel`: the label it is
    /// mounted with.
    pub effective_selinux_label: Option<Arc<str>>,
}

/// One volume of a desired pod, as status reports it.
#[derive(Debug, Clone)]
pub struct PodVolumeEntry {
    /// The volume's name in the pod.
    pub outer_name: String,
    /// What became of it.
    pub resolution: VolumeResolution,
}

/// What became of one volume of a pod: desired, kept as it was after it
/// stopped resolving, or failed. One place for the three states the
/// kubelet keeps in `podsToMount` and `AddErrorToPod`.
#[derive(Debug, Clone)]
pub enum VolumeResolution {
    /// Desired under `name`, set up by `plugin`.
    Desired {
        /// Its unique name.
        name: UniqueVolumeName,
        /// The plugin handling it.
        plugin: Arc<str>,
    },
    /// Resolved before and no longer: kept desired as it was (the kubelet's
    /// `AddErrorToPod` on a pod processed again), with why.
    Kept {
        /// Its unique name, as before.
        name: UniqueVolumeName,
        /// The plugin handling it.
        plugin: Arc<str>,
        /// Why it no longer resolves.
        error: String,
        /// How that error ends `WaitForAttachAndMount`.
        why: Unresolved,
    },
    /// Not desired: why, and how that ends `WaitForAttachAndMount`.
    Failed {
        /// The plugin, when one was found (a volume refused for its
        /// SELinux label).
        plugin: Option<Arc<str>>,
        /// Why it cannot be mounted.
        error: String,
        /// How the error ends the wait.
        why: Unresolved,
    },
}

impl VolumeResolution {
    /// Its unique name, when it is desired (or kept).
    pub fn name(&self) -> Option<&UniqueVolumeName> {
        match self {
            Self::Desired { name, .. } | Self::Kept { name, .. } => Some(name),
            Self::Failed { .. } => None,
        }
    }

    /// Its plugin, when one was found.
    pub fn plugin(&self) -> Option<&Arc<str>> {
        match self {
            Self::Desired { plugin, .. } | Self::Kept { plugin, .. } => Some(plugin),
            Self::Failed { plugin, .. } => plugin.as_ref(),
        }
    }

    /// Why it does not resolve (kept or failed).
    pub fn error(&self) -> Option<&str> {
        match self {
            Self::Desired { .. } => None,
            Self::Kept { error, .. } | Self::Failed { error, .. } => Some(error),
        }
    }

    /// Its unique name, or why it has none (a failed volume).
    pub fn as_result(&self) -> Result<&UniqueVolumeName, &str> {
        match self {
            Self::Desired { name, .. } | Self::Kept { name, .. } => Ok(name),
            Self::Failed { error, .. } => Err(error),
        }
    }

    /// Why a volume kept as it was no longer resolves.
    pub fn kept_error(&self) -> Option<&str> {
        match self {
            Self::Kept { error, .. } => Some(error),
            _ => None,
        }
    }

    /// How its error ends `WaitForAttachAndMount`; `None` when it resolves.
    pub fn unresolved(&self) -> Option<Unresolved> {
        match self {
            Self::Desired { .. } => None,
            Self::Kept { why, .. } | Self::Failed { why, .. } => Some(*why),
        }
    }
}

/// What a volume that does not resolve means to `WaitForAttachAndMount`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    /// The kubelet's pod error (`AddErrorToPod`: a claim not found or not
    /// bound, a kind no plugin handles, an invalid spec): the wait ends at
    /// once.
    PodError,
    /// Something it needs is not there yet (a Secret, a ConfigMap, its
    /// VolumeAttachment): the wait goes on, as the kubelet's does while
    /// the volume's set-up or attach fails.
    Waiting,
    /// Its VolumeAttachment failed with `ResourceExhausted` (the node's
    /// attach limit of the driver): when the wait times out, the pod is
    /// rejected (the kubelet's `VolumeAttachLimitExceededError`).
    AttachLimit,
}

impl Unresolved {
    /// Its name in status (`pod_error`, `waiting`, `attach_limit`).
    pub fn name(self) -> &'static str {
        match self {
            Self::PodError => "pod_error",
            Self::Waiting => "waiting",
            Self::AttachLimit => "attach_limit",
        }
    }
}

/// A desired pod.
#[derive(Debug, Clone)]
pub struct PodEntry {
    /// `namespace/name`.
    pub namespace: Arc<str>,
    /// The pod name.
    pub name: Arc<str>,
    /// Its volumes.
    pub volumes: Vec<PodVolumeEntry>,
    /// `fsGroup` and `supplementalGroups`, for `GetExtraSupplementalGroupsForPod`.
    pub supplemental_groups: Vec<i64>,
    /// The pod ended (its source says so): none of its volumes is needed,
    /// and it is still the kubelet's until it is deleted (observe mode).
    pub terminated: bool,
}

/// What a populator hands over for one pod: its entry plus, for each volume
/// that resolved, what to mount.
#[derive(Debug, Clone)]
pub struct PodUpdate {
    /// The pod's UID.
    pub uid: PodUid,
    /// The entry for status.
    pub entry: PodEntry,
    /// `(volume, plugin, pod's view)` for each mountable volume.
    pub mounts: Vec<(UniqueVolumeName, Arc<str>, PodToMount)>,
}

/// The desired state of world.
#[derive(Debug, Default)]
pub struct DesiredStateOfWorld {
    volumes: FastMap<UniqueVolumeName, VolumeToMount>,
    pods: FastMap<PodUid, PodEntry>,
    /// The Node's `status.volumesAttached` at the last read.
    attached: FastSet<UniqueVolumeName>,
    /// Pods a source knows but has not converted yet (an object they read
    /// could not be read): what is mounted for them stays.
    held: FastSet<PodUid>,
    /// The host's SELinux and the SELinux feature gates.
    selinux: super::selinux::SeLinuxSettings,
    /// The kubelet's `volume_manager_selinux_*` metrics.
    selinux_metrics: Arc<super::selinux::SeLinuxMetrics>,
    /// Per pod, the volumes refused for their SELinux label (the kubelet's
    /// populator tries them again on its next pass; here, when a volume
    /// leaves the desired state), each with the pod's error.
    selinux_refused: FastMap<PodUid, Vec<(Mount, String)>>,
}

/// A volume of a pod to add: its name, plugin and the pod's view.
pub type Mount = (UniqueVolumeName, Arc<str>, PodToMount);

impl DesiredStateOfWorld {
    /// Adds or replaces a pod (the kubelet's `AddPodToVolume` for each of
    /// its volumes). A volume refused for its SELinux label
    /// ([`super::selinux`]) is an error of the pod's entry, tried again when
    /// a volume leaves. Returns the volumes whose desired state changed.
    pub fn set_pod(&mut self, mut update: PodUpdate) -> Vec<UniqueVolumeName> {
        let mut refused = Vec::new();
        let mut admitted = Vec::with_capacity(update.mounts.len());
        for mut m in merge_outer_names(std::mem::take(&mut update.mounts)) {
            match self.selinux_admit(&update.uid, &mut m) {
                Ok(()) => admitted.push(m),
                Err(e) => {
                    let e = e.to_string();
                    for outer in &m.2.outer_volume_spec_names {
                        set_entry_error(&mut update.entry, outer, &e);
                    }
                    refused.push((m, e));
                }
            }
        }
        let mut changed = self.remove_pod_volumes_except(&update.uid, &admitted);
        for m in admitted {
            changed.extend(self.add_pod_to_volume(&update.uid, m));
        }
        self.set_refused(&update.uid, refused);
        self.pods.insert(update.uid, update.entry);
        self.readmit_refused(&mut changed);
        changed
    }

    /// Adds `pod`'s use `m` of a volume (admitted); returns the volume if
    /// its desired state changed.
    fn add_pod_to_volume(&mut self, uid: &PodUid, m: Mount) -> Option<UniqueVolumeName> {
        let (name, plugin, pod) = m;
        let v = self
            .volumes
            .entry(name.clone())
            .or_insert_with(|| VolumeToMount {
                plugin_name: plugin,
                pods: PodMap::default(),
                reported_in_use: false,
                attached: self.attached.contains(&name),
                original_selinux_label: None,
                effective_selinux_label: None,
            });
        if v.pods.is_empty() {
            v.effective_selinux_label = pod.selinux_label.clone();
            v.original_selinux_label = selinux_original(&self.selinux, &pod);
        }
        if v.pods.get(uid) == Some(&pod) {
            return None;
        }
        v.pods.insert(uid.clone(), pod);
        Some(name)
    }

    /// Removes a pod. Returns the volumes it used.
    pub fn delete_pod(&mut self, uid: &PodUid) -> Vec<UniqueVolumeName> {
        let mut changed = self.remove_pod_volumes_except(uid, &[]);
        self.pods.remove(uid);
        self.selinux_refused.remove(uid);
        self.readmit_refused(&mut changed);
        changed
    }

    fn remove_pod_volumes_except(
        &mut self,
        uid: &PodUid,
        keep: &[(UniqueVolumeName, Arc<str>, PodToMount)],
    ) -> Vec<UniqueVolumeName> {
        let Some(old) = self.pods.get(uid) else {
            return Vec::new();
        };
        let mut removed = Vec::new();
        for name in old.volumes.iter().filter_map(|v| v.resolution.name()) {
            if keep.iter().any(|(k, _, _)| k == name) {
                continue;
            }
            if let Some(v) = self.volumes.get_mut(name) {
                v.pods.remove(uid);
                if v.pods.is_empty() {
                    self.volumes.remove(name);
                }
                removed.push(name.clone());
            }
        }
        removed
    }

    /// The kubelet's `MarkVolumesReportedInUse`: each desired volume is
    /// reported in use exactly when `reported` lists it (names not desired
    /// are ignored). Returns the volumes that became reported.
    pub fn mark_volumes_reported_in_use(
        &mut self,
        reported: &FastSet<UniqueVolumeName>,
    ) -> Vec<UniqueVolumeName> {
        self.set_flag(reported, |v| &mut v.reported_in_use)
    }

    /// The Node's `status.volumesAttached` as last read: every desired
    /// volume (and any desired later) is attached exactly when listed.
    /// Returns the desired volumes that became attached.
    pub fn mark_volumes_attached(
        &mut self,
        attached: FastSet<UniqueVolumeName>,
    ) -> Vec<UniqueVolumeName> {
        let newly = self.set_flag(&attached, |v| &mut v.attached);
        self.attached = attached;
        newly
    }

    /// Sets `flag` of every desired volume to whether `listed` has it;
    /// returns the volumes whose flag turned true.
    fn set_flag(
        &mut self,
        listed: &FastSet<UniqueVolumeName>,
        flag: fn(&mut VolumeToMount) -> &mut bool,
    ) -> Vec<UniqueVolumeName> {
        let mut newly = Vec::new();
        for (name, v) in self.volumes.iter_mut() {
            let now = listed.contains(name);
            let f = flag(v);
            if now && !*f {
                newly.push(name.clone());
            }
            *f = now;
        }
        newly
    }

    /// Whether `pod` needs `volume` (the kubelet's `PodExistsInVolume`).
    pub fn pod_exists_in_volume(&self, volume: &UniqueVolumeName, pod: &PodUid) -> bool {
        self.volumes
            .get(volume)
            .is_some_and(|v| v.pods.contains_key(pod))
    }

    /// Marks pod `uid` held (known, not converted yet) or not.
    pub fn set_held(&mut self, uid: &PodUid, held: bool) {
        if held {
            self.held.insert(uid.clone());
        } else {
            self.held.remove(uid);
        }
    }

    /// Whether pod `uid` is held: its source knows it but could not convert
    /// it yet, so nothing mounted for it may be torn down.
    pub fn is_held(&self, uid: &PodUid) -> bool {
        self.held.contains(uid)
    }

    /// Whether any pod needs `volume`.
    pub fn volume_exists(&self, volume: &UniqueVolumeName) -> bool {
        self.volumes.contains_key(volume)
    }

    /// The kubelet's `VolumeExists(volumeName, seLinuxMountContext)`: whether
    /// any pod needs `volume` mounted with the SELinux label `context` (the
    /// actual state's, `None` when not known: no label). A volume mounted
    /// with another label is as good as not needed: its device is unmounted
    /// once no pod uses it, to be mounted again with the new one.
    pub fn volume_exists_with_selinux_context(
        &self,
        volume: &UniqueVolumeName,
        context: Option<&str>,
    ) -> bool {
        self.volumes.get(volume).is_some_and(|v| {
            v.effective_selinux_label.as_deref().unwrap_or("") == context.unwrap_or("")
        })
    }

    /// One volume.
    pub fn volume(&self, volume: &UniqueVolumeName) -> Option<&VolumeToMount> {
        self.volumes.get(volume)
    }

    /// Every volume.
    pub fn volumes(&self) -> impl Iterator<Item = (&UniqueVolumeName, &VolumeToMount)> {
        self.volumes.iter()
    }

    /// Every pod.
    pub fn pods(&self) -> impl Iterator<Item = (&PodUid, &PodEntry)> {
        self.pods.iter()
    }

    /// One pod.
    pub fn pod(&self, uid: &PodUid) -> Option<&PodEntry> {
        self.pods.get(uid)
    }

    /// The SELinux part of the kubelet's `AddPodToVolume` for pod `uid`'s
    /// use `m` of a volume: its label (set on the pod's view and its spec),
    /// or the kubelet's error (containers that disagree, or another pod of
    /// the volume with another label), counted in the metrics.
    fn selinux_admit(
        &self,
        uid: &PodUid,
        m: &mut Mount,
    ) -> Result<(), super::selinux::SeLinuxConflict> {
        use super::selinux as sel;
        let (name, plugin, pod) = m;
        let supports = sel::plugin_supports_selinux_mount(&pod.spec);
        let metrics = Some(&*self.selinux_metrics);
        let label = sel::volume_label(&self.selinux, &pod.selinux, supports, metrics)?;
        let volume_plugin = sel::plugin_name_with_driver(plugin, &pod.spec);
        match self.volumes.get(name) {
            Some(v) if !v.pods.contains_key(uid) => sel::check_volume_conflict(
                &self.selinux,
                &pod.selinux,
                sel::spec_name(&pod.spec),
                v.original_selinux_label.as_ref(),
                &label,
                &volume_plugin,
                &self.selinux_metrics,
            )?,
            Some(_) => {}
            None if label.original.is_some() => self
                .selinux_metrics
                .count_admitted(&volume_plugin, pod.selinux.access_mode()),
            None => {}
        }
        let effective = match self.volumes.get(name) {
            // The volume's label, as the kubelet mounts it for every pod.
            Some(v) if !v.pods.is_empty() => v.effective_selinux_label.clone(),
            _ => label.effective,
        };
        sel::set_mount_label(&mut pod.spec, effective.as_ref());
        pod.selinux_label = effective;
        Ok(())
    }

    /// Keeps `refused` as pod `uid`'s volumes refused for their label.
    fn set_refused(&mut self, uid: &PodUid, refused: Vec<(Mount, String)>) {
        if refused.is_empty() {
            self.selinux_refused.remove(uid);
        } else {
            self.selinux_refused.insert(uid.clone(), refused);
        }
    }

    /// Tries again the refused volumes whose volume has just left the
    /// desired state (one of `changed` no pod uses any more: the last pod
    /// that used it with another label is gone); the volumes admitted join
    /// `changed` and their pods' entries lose the error.
    fn readmit_refused(&mut self, changed: &mut Vec<UniqueVolumeName>) {
        let gone: Vec<UniqueVolumeName> = changed
            .iter()
            .filter(|v| !self.volumes.contains_key(*v))
            .cloned()
            .collect();
        if gone.is_empty() || self.selinux_refused.is_empty() {
            return;
        }
        let uids: Vec<PodUid> = self
            .selinux_refused
            .iter()
            .filter(|(_, list)| list.iter().any(|(m, _)| gone.contains(&m.0)))
            .map(|(u, _)| u.clone())
            .collect();
        for uid in uids {
            let Some(list) = self.selinux_refused.remove(&uid) else {
                continue;
            };
            let mut still = Vec::new();
            for (mut m, e) in list {
                if !gone.contains(&m.0) || self.volumes.contains_key(&m.0) {
                    still.push((m, e));
                    continue;
                }
                match self.selinux_admit(&uid, &mut m) {
                    Ok(()) => {
                        if let Some(entry) = self.pods.get_mut(&uid) {
                            for outer in &m.2.outer_volume_spec_names {
                                set_entry_resolved(entry, outer, &m.0);
                            }
                        }
                        changed.extend(self.add_pod_to_volume(&uid, m));
                    }
                    Err(e) => still.push((m, e.to_string())),
                }
            }
            self.set_refused(&uid, still);
        }
    }

    /// Sets the host's SELinux and the SELinux feature gates, for the pods
    /// added from now on.
    pub fn set_selinux_settings(&mut self, settings: super::selinux::SeLinuxSettings) {
        self.selinux = settings;
    }

    /// The kubelet's `volume_manager_selinux_*` metrics.
    pub fn selinux_metrics(&self) -> &Arc<super::selinux::SeLinuxMetrics> {
        &self.selinux_metrics
    }

    /// The volumes of pod `uid` refused for their SELinux label: their
    /// names in the pod and the errors.
    pub fn selinux_refused(&self, uid: &PodUid) -> Vec<(String, String)> {
        self.selinux_refused
            .get(uid)
            .into_iter()
            .flatten()
            .flat_map(|(m, e)| {
                m.2.outer_volume_spec_names
                    .iter()
                    .map(move |outer| (outer.clone(), e.clone()))
            })
            .collect()
    }

    /// Number of (volume, pod) pairs, per plugin.
    pub fn count_by_plugin(&self) -> HashMap<Arc<str>, usize> {
        let mut out = HashMap::new();
        for v in self.volumes.values() {
            *out.entry(Arc::clone(&v.plugin_name)).or_default() += v.pods.len();
        }
        out
    }
}

/// The kubelet's `AddPodToVolume` of a volume the pod already has under
/// another name (two volumes of the pod naming the same claim): one use of
/// the volume with every name (`outerVolumeSpecNames`), and the subPaths
/// and SELinux facts of the containers that mount any of them.
fn merge_outer_names(mounts: Vec<Mount>) -> Vec<Mount> {
    let mut out: Vec<Mount> = Vec::with_capacity(mounts.len());
    let mut at: FastMap<UniqueVolumeName, usize> = FastMap::default();
    for m in mounts {
        let Some(&i) = at.get(&m.0) else {
            at.insert(m.0.clone(), out.len());
            out.push(m);
            continue;
        };
        let (p, q) = (m.2, &mut out[i].2);
        for outer in p.outer_volume_spec_names {
            if !q.outer_volume_spec_names.contains(&outer) {
                q.outer_volume_spec_names.push(outer);
            }
        }
        for s in p.sub_paths {
            if !q.sub_paths.contains(&s) {
                q.sub_paths.push(s);
            }
        }
        q.selinux.file_labels.extend(p.selinux.file_labels);
        q.selinux.random_levels += p.selinux.random_levels;
        q.selinux.recursive |= p.selinux.recursive;
    }
    out
}

/// The kubelet's `originalSELinuxLabel` of a volume added by `pod`.
fn selinux_original(
    settings: &super::selinux::SeLinuxSettings,
    pod: &PodToMount,
) -> Option<Arc<str>> {
    use super::selinux as sel;
    let supports = sel::plugin_supports_selinux_mount(&pod.spec);
    sel::volume_label(settings, &pod.selinux, supports, None)
        .ok()
        .and_then(|l| l.original)
}

/// Makes volume `outer` of `entry` a pod error (`AddErrorToPod`).
fn set_entry_error(entry: &mut PodEntry, outer: &str, error: &str) {
    for v in entry.volumes.iter_mut().filter(|v| v.outer_name == outer) {
        v.resolution = VolumeResolution::Failed {
            plugin: v.resolution.plugin().cloned(),
            error: error.to_string(),
            why: Unresolved::PodError,
        };
    }
}

/// Makes volume `outer` of `entry` resolve to `name` again.
fn set_entry_resolved(entry: &mut PodEntry, outer: &str, name: &UniqueVolumeName) {
    for v in entry.volumes.iter_mut().filter(|v| v.outer_name == outer) {
        if let Some(plugin) = v.resolution.plugin().cloned() {
            v.resolution = VolumeResolution::Desired {
                name: name.clone(),
                plugin,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{StorageMedium, VolumeSource};

    fn update(uid: &str, vols: &[&str]) -> PodUpdate {
        let uid = PodUid::new(uid).unwrap();
        let plugin: Arc<str> = "p".into();
        let mut entry = PodEntry {
            namespace: "ns".into(),
            name: "n".into(),
            volumes: vec![],
            supplemental_groups: vec![],
            terminated: false,
        };
        let mut mounts = vec![];
        for v in vols {
            let name = UniqueVolumeName::per_pod("p", &uid, v);
            entry.volumes.push(PodVolumeEntry {
                outer_name: v.to_string(),
                resolution: VolumeResolution::Desired {
                    name: name.clone(),
                    plugin: plugin.clone(),
                },
            });
            mounts.push((
                name,
                plugin.clone(),
                PodToMount {
                    outer_volume_spec_names: vec![v.to_string()],
                    spec: Arc::new(VolumeSpec {
                        name: v.to_string(),
                        source: VolumeSource::EmptyDir {
                            medium: StorageMedium::Default,
                            size_limit: None,
                        },
                    }),
                    fs_group: None,
                    fs_group_change_policy: Default::default(),
                    selinux_label: None,
                    selinux: Default::default(),
                    sub_paths: vec![],
                    sub_path_release: SubPathRelease::All,
                },
            ));
        }
        PodUpdate { uid, entry, mounts }
    }

    /// The kubelet's `Test_AddPodToVolume_Positive_MultiOuterNames`: two
    /// volumes of one pod naming the same claim are one desired volume
    /// with both outer names (and the subPaths of both); the pod's entry
    /// maps both names to it. Processed again with one of them, the other
    /// name goes. Before, the last name replaced the first.
    #[test]
    fn two_names_of_one_volume_are_one_volume_with_both_names() {
        let mut d = DesiredStateOfWorld::default();
        let pv = UniqueVolumeName::new("kubernetes.io/csi/d^h");
        let one_volume = |names: &[&str]| {
            let mut u = update("a", names);
            for (i, m) in u.mounts.iter_mut().enumerate() {
                m.0 = pv.clone();
                m.2.sub_paths = vec![SubPath {
                    container: format!("c{i}"),
                    index: 0,
                    path: "sub".into(),
                }];
            }
            for v in &mut u.entry.volumes {
                v.resolution = VolumeResolution::Desired {
                    name: pv.clone(),
                    plugin: "p".into(),
                };
            }
            u
        };
        assert_eq!(d.set_pod(one_volume(&["vol1", "vol2"])), vec![pv.clone()]);
        assert_eq!(d.volumes().count(), 1);
        let a = PodUid::new("a").unwrap();
        let p = d.volume(&pv).unwrap().pods.get(&a).unwrap().clone();
        assert_eq!(p.outer_volume_spec_names, ["vol1", "vol2"]);
        assert_eq!(p.outer_volume_spec_name(), "vol1");
        assert_eq!(p.spec.name, "vol1");
        let containers: Vec<&str> = p.sub_paths.iter().map(|s| &*s.container).collect();
        assert_eq!(containers, ["c0", "c1"]);
        let names: Vec<_> = d
            .pod(&a)
            .unwrap()
            .volumes
            .iter()
            .map(|v| (v.outer_name.as_str(), v.resolution.name()))
            .collect();
        assert_eq!(names, [("vol1", Some(&pv)), ("vol2", Some(&pv))]);
        d.set_pod(one_volume(&["vol2"]));
        let p = d.volume(&pv).unwrap().pods.get(&a).unwrap();
        assert_eq!(p.outer_volume_spec_names, ["vol2"]);
    }

    #[test]
    fn set_update_delete() {
        let mut d = DesiredStateOfWorld::default();
        assert_eq!(d.set_pod(update("a", &["x", "y"])).len(), 2);
        // Unchanged: nothing to do.
        assert!(d.set_pod(update("a", &["x", "y"])).is_empty());
        // y removed, z added.
        let changed = d.set_pod(update("a", &["x", "z"]));
        assert_eq!(changed.len(), 2);
        let a = PodUid::new("a").unwrap();
        assert!(d.pod_exists_in_volume(&UniqueVolumeName::per_pod("p", &a, "x"), &a));
        assert!(!d.volume_exists(&UniqueVolumeName::per_pod("p", &a, "y")));
        assert_eq!(d.delete_pod(&a).len(), 2);
        assert_eq!(d.volumes().count(), 0);
        assert_eq!(d.pods().count(), 0);
    }

    #[test]
    fn reported_in_use_follows_the_last_report_and_starts_false() {
        let mut d = DesiredStateOfWorld::default();
        d.set_pod(update("a", &["x", "y"]));
        let a = PodUid::new("a").unwrap();
        let (x, y) = (
            UniqueVolumeName::per_pod("p", &a, "x"),
            UniqueVolumeName::per_pod("p", &a, "y"),
        );
        let unknown = UniqueVolumeName::new("not/desired");
        let report: FastSet<_> = [x.clone(), unknown].into_iter().collect();
        assert_eq!(d.mark_volumes_reported_in_use(&report), vec![x.clone()]);
        assert!(d.volume(&x).unwrap().reported_in_use);
        assert!(!d.volume(&y).unwrap().reported_in_use);
        // The same report again: nothing new.
        assert!(d.mark_volumes_reported_in_use(&report).is_empty());
        // A volume gone and desired again starts unreported.
        d.set_pod(update("a", &["y"]));
        d.set_pod(update("a", &["x", "y"]));
        assert!(!d.volume(&x).unwrap().reported_in_use);
        // A report without it clears it.
        d.mark_volumes_reported_in_use(&report);
        d.mark_volumes_reported_in_use(&FastSet::default());
        assert!(!d.volume(&x).unwrap().reported_in_use);
    }

    #[test]
    fn attached_follows_the_last_read_even_before_a_volume_is_desired() {
        let mut d = DesiredStateOfWorld::default();
        let a = PodUid::new("a").unwrap();
        let (x, y) = (
            UniqueVolumeName::per_pod("p", &a, "x"),
            UniqueVolumeName::per_pod("p", &a, "y"),
        );
        // Read before the pod arrives: nothing desired became attached.
        let attached: FastSet<_> = [x.clone()].into_iter().collect();
        assert!(d.mark_volumes_attached(attached.clone()).is_empty());
        d.set_pod(update("a", &["x", "y"]));
        assert!(d.volume(&x).unwrap().attached);
        assert!(!d.volume(&y).unwrap().attached);
        let both: FastSet<_> = [x.clone(), y.clone()].into_iter().collect();
        assert_eq!(d.mark_volumes_attached(both), vec![y.clone()]);
        d.mark_volumes_attached(FastSet::default());
        assert!(!d.volume(&x).unwrap().attached && !d.volume(&y).unwrap().attached);
    }
}
