//! The SELinux part of the kubelet's `DesiredStateOfWorld`
//! (`pkg/kubelet/volumemanager/cache/desired_state_of_world.go`:
//! `getSELinuxLabel`, the SELinux part of `AddPodToVolume`,
//! `handleSELinuxMetricError`, `getVolumeAccessMode`; and
//! `pkg/volume/util/selinux.go`: `GetMountSELinuxLabel`,
//! `VolumeSupportsSELinuxMount`), with the kubelet's
//! `volume_manager_selinux_*` metrics
//! (`desired_state_of_wold_selinux_metrics.go`).
//!
//! A pod's use of a volume brings the file labels of the containers that
//! mount it ([`VolumeSeLinux`], computed from the pod by
//! `populator::convert::selinux`). Here they become the label the volume is
//! mounted with (`-o context="..."`), with the kubelet's rules:
//!
//! - nothing at all on a host without SELinux;
//! - containers of one pod that need different labels: the kubelet's
//!   `multiple SELinux labels found: ...` error, where the volume supports
//!   SELinux mounts (a PersistentVolume: any with the `SELinuxMount` feature
//!   gate, on by default since 1.37, only a ReadWriteOncePod one without),
//!   a warning elsewhere;
//! - `seLinuxChangePolicy: Recursive`, or a plugin that cannot mount with a
//!   context (CSI: a CSIDriver without `seLinuxMount: true`), give no label;
//! - the label is used only where the volume supports SELinux mounts;
//! - a second pod that needs a different label on a volume in use (by
//!   another pod): `conflicting SELinux labels of volume ...`, an error
//!   where the volume supports SELinux mounts, a warning elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use crate::util::prometheus::{Exposition, MetricType};
use crate::util::sync::MutexExt;
use crate::volume::{VolumeSource, VolumeSpec};

/// The kubelet's SELinux feature gates as volmgr follows them, and the host.
///
/// `SELinuxMountReadWriteOncePod` and `SELinuxChangePolicy` are GA and
/// locked on in 1.37: they are always on here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeLinuxSettings {
    /// The host has SELinux (the translator's `SELinuxEnabled`, go-selinux's
    /// `GetEnabled`); without it no volume gets a label.
    pub enabled: bool,
    /// The `SELinuxMount` feature gate (GA and on by default in 1.37, not
    /// locked): every PersistentVolume may be mounted with its label, not
    /// only a ReadWriteOncePod one.
    pub selinux_mount: bool,
}

impl Default for SeLinuxSettings {
    /// No SELinux; `SELinuxMount` on (its 1.37 default).
    fn default() -> Self {
        Self {
            enabled: false,
            selinux_mount: true,
        }
    }
}

/// Why `--feature-gates` was refused (the kubelet's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeatureGateError {
    /// Not `NAME=true|false`.
    #[error("missing bool value for {0}")]
    Malformed(String),
    /// A value other than true or false.
    #[error("invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax")]
    Value {
        /// The gate.
        name: String,
        /// The value given.
        value: String,
    },
    /// A gate volmgr does not follow.
    #[error("unrecognized feature gate: {0}")]
    Unknown(String),
    /// A gate locked on in 1.37 set to false.
    #[error("cannot set feature gate {0} to false, feature is locked to true")]
    Locked(String),
}

impl SeLinuxSettings {
    /// Applies the kubelet's `--feature-gates` (`NAME=BOOL`, comma
    /// separated) that volmgr follows: `SELinuxMount`; and
    /// `SELinuxMountReadWriteOncePod` and `SELinuxChangePolicy`, locked on.
    pub fn apply_feature_gates(&mut self, gates: &str) -> Result<(), FeatureGateError> {
        for gate in gates.split(',').map(str::trim).filter(|g| !g.is_empty()) {
            let (name, value) = gate
                .split_once('=')
                .ok_or_else(|| FeatureGateError::Malformed(gate.to_string()))?;
            let on = match value.trim() {
                "true" | "True" | "TRUE" | "1" | "t" | "T" => true,
                "false" | "False" | "FALSE" | "0" | "f" | "F" => false,
                v => {
                    return Err(FeatureGateError::Value {
                        name: name.to_string(),
                        value: v.to_string(),
                    })
                }
            };
            match name.trim() {
                "SELinuxMount" => self.selinux_mount = on,
                "SELinuxMountReadWriteOncePod" | "SELinuxChangePolicy" if on => {}
                n @ ("SELinuxMountReadWriteOncePod" | "SELinuxChangePolicy") => {
                    return Err(FeatureGateError::Locked(n.to_string()))
                }
                n => return Err(FeatureGateError::Unknown(n.to_string())),
            }
        }
        Ok(())
    }
}

/// What a pod's use of a volume says about SELinux, from the pod: the
/// inputs of the kubelet's `getSELinuxLabel`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeSeLinux {
    /// The distinct file labels of the containers that mount the volume
    /// with `seLinuxOptions` that have a level (their own, or else the
    /// pod's). Containers without options add none.
    pub file_labels: BTreeSet<Arc<str>>,
    /// Containers that mount it with options without a level: go-selinux
    /// gives each a random level (see `populator::convert::selinux`).
    pub random_levels: usize,
    /// `spec.securityContext.seLinuxChangePolicy: Recursive`.
    pub recursive: bool,
    /// The PersistentVolume's `accessModes`; `None` for an inline volume.
    pub pv_access_modes: Option<Vec<String>>,
}

impl VolumeSeLinux {
    /// The kubelet's `getVolumeAccessMode`: the "highest" access mode of
    /// the PersistentVolume (`RWX`, `ROX`, `RWO`, `RWOP`), `inline` for an
    /// inline volume.
    pub fn access_mode(&self) -> &'static str {
        let Some(modes) = &self.pv_access_modes else {
            return "inline";
        };
        let has = |m: &str| modes.iter().any(|x| x == m);
        [
            ("ReadWriteMany", "RWX"),
            ("ReadOnlyMany", "ROX"),
            ("ReadWriteOnce", "RWO"),
            ("ReadWriteOncePod", "RWOP"),
        ]
        .into_iter()
        .find(|(m, _)| has(m))
        .map_or("", |(_, short)| short)
    }

    /// The kubelet's `VolumeSupportsSELinuxMount`: a PersistentVolume, any
    /// with `SELinuxMount`, else one whose only access mode is
    /// ReadWriteOncePod.
    pub fn supports_selinux_mount(&self, settings: &SeLinuxSettings) -> bool {
        match &self.pv_access_modes {
            None => false,
            Some(_) if settings.selinux_mount => true,
            Some(modes) => modes.len() == 1 && modes[0] == "ReadWriteOncePod",
        }
    }
}

/// The labels of one pod's use of a volume, as the kubelet's
/// `AddPodToVolume` computes them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeLabel {
    /// The kubelet's `originalSELinuxLabel`: the label the volume would be
    /// mounted with if every access mode supported it; what two pods of
    /// one volume are compared by.
    pub original: Option<Arc<str>>,
    /// The kubelet's `effectiveSELinuxMountFileLabel`: the label it is
    /// mounted with (`context=`).
    pub effective: Option<Arc<str>>,
    /// The plugin can mount with a context (after `getSELinuxLabel`: no
    /// when the pod's containers disagree).
    pub plugin_supports: bool,
}

/// The kubelet's `SupportsSELinuxContextMount` of the plugin of `spec`:
/// only CSI, for a driver whose CSIDriver has `seLinuxMount: true` (the
/// kubelet's iSCSI and FC plugins also can; volmgr has neither).
pub fn plugin_supports_selinux_mount(spec: &VolumeSpec) -> bool {
    matches!(&spec.source, VolumeSource::Csi(c) if c.driver_info.selinux_mount)
}

/// The kubelet's `getVolumePluginNameWithDriver`: `plugin`, and for CSI
/// the driver after a `/` (`kubernetes.io/csi/ebs.csi.aws.com`).
pub fn plugin_name_with_driver(plugin: &str, spec: &VolumeSpec) -> String {
    match &spec.source {
        VolumeSource::Csi(c) => format!("{plugin}/{}", c.driver),
        _ => plugin.to_string(),
    }
}

/// The kubelet's `volumeSpec.Name()`: the PersistentVolume's name, or the
/// volume's name in the pod.
pub fn spec_name(spec: &VolumeSpec) -> &str {
    match &spec.source {
        VolumeSource::Csi(c) => c.pv_name.as_deref().unwrap_or(&spec.name),
        _ => &spec.name,
    }
}

/// The SELinux label `spec` is mounted with (`context=`): the CSI part's
/// [`set_mount_label`]; `None` for any other plugin.
pub fn mount_label(spec: &VolumeSpec) -> Option<&str> {
    match &spec.source {
        VolumeSource::Csi(c) => c.driver_info.selinux_mount_label.as_deref(),
        _ => None,
    }
}

/// Sets the label a CSI volume is staged and published with (the
/// kubelet's `MounterArgs.SELinuxLabel`): `label`, or none.
pub fn set_mount_label(spec: &mut Arc<VolumeSpec>, label: Option<&Arc<str>>) {
    let want = label.map(|l| l.to_string());
    if let VolumeSource::Csi(c) = &spec.source {
        if c.driver_info.selinux_mount_label == want {
            return;
        }
    }
    if let VolumeSource::Csi(c) = &mut Arc::make_mut(spec).source {
        Arc::make_mut(&mut c.driver_info).selinux_mount_label = want;
    }
}

/// Why a pod may not use a volume with the label it asks for (the
/// kubelet's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeLinuxConflict {
    /// The pod's containers need different labels on the volume.
    #[error("multiple SELinux labels found: {}", .0.join(","))]
    MultipleLabels(Vec<String>),
    /// Another pod uses the volume with another label.
    #[error("conflicting SELinux labels of volume {volume}: {existing:?} and {new:?}")]
    ConflictingLabels {
        /// The volume (`spec_name`).
        volume: String,
        /// The label it is used with.
        existing: String,
        /// The label this pod asks for.
        new: String,
    },
}

/// The kubelet's `getSELinuxLabel` (with `GetMountSELinuxLabel` and the
/// access-mode rule of `AddPodToVolume`) for one pod's use of a volume:
/// its labels, or the kubelet's error when the pod's containers need
/// different labels on a volume that supports SELinux mounts. Counts the
/// kubelet's metrics in `metrics`, if given.
pub fn volume_label(
    settings: &SeLinuxSettings,
    facts: &VolumeSeLinux,
    plugin_supports: bool,
    metrics: Option<&SeLinuxMetrics>,
) -> Result<VolumeLabel, SeLinuxConflict> {
    if !settings.enabled {
        return Ok(VolumeLabel::default());
    }
    let supported = facts.supports_selinux_mount(settings);
    if facts.file_labels.len() + facts.random_levels > 1 {
        let mut shown: Vec<String> = facts.file_labels.iter().map(|l| l.to_string()).collect();
        shown.extend((0..facts.random_levels).map(|_| RANDOM_LEVEL_LABEL.to_string()));
        let err = SeLinuxConflict::MultipleLabels(shown);
        let access = facts.access_mode();
        if let Some(m) = metrics {
            m.count(PodContextMismatch, supported, "", access);
        }
        if supported {
            return Err(err);
        }
        tracing::debug!(error = %err, "SELinux labels of a volume that does not support SELinux mounts: a warning");
        return Ok(VolumeLabel::default());
    }
    let label = facts
        .file_labels
        .first()
        .cloned()
        .filter(|_| plugin_supports && !facts.recursive);
    Ok(VolumeLabel {
        effective: label.clone().filter(|_| supported),
        original: label,
        plugin_supports,
    })
}

/// Shown for a container whose options have no level in the kubelet's
/// `multiple SELinux labels found` error (go-selinux would pick a random
/// one for it).
const RANDOM_LEVEL_LABEL: &str = "system_u:object_r:container_file_t:<random level>";

/// The kubelet's check of a pod added to a volume other pods use
/// (`AddPodToVolume`): a plugin that mounts with a context needs the same
/// label for every pod. `existing` is the volume's original label, `name`
/// the volume's (`spec_name`). An error where the volume supports SELinux
/// mounts, a warning (counted, `Ok`) elsewhere.
pub fn check_volume_conflict(
    settings: &SeLinuxSettings,
    facts: &VolumeSeLinux,
    name: &str,
    existing: Option<&Arc<str>>,
    label: &VolumeLabel,
    volume_plugin: &str,
    metrics: &SeLinuxMetrics,
) -> Result<(), SeLinuxConflict> {
    if !label.plugin_supports || existing == label.original.as_ref() {
        return Ok(());
    }
    let show = |l: Option<&Arc<str>>| l.map_or("", |l| &**l).to_string();
    let err = SeLinuxConflict::ConflictingLabels {
        volume: name.to_string(),
        existing: show(existing),
        new: show(label.original.as_ref()),
    };
    let supported = facts.supports_selinux_mount(settings);
    metrics.count(
        VolumeContextMismatch,
        supported,
        volume_plugin,
        facts.access_mode(),
    );
    if supported {
        return Err(err);
    }
    tracing::debug!(error = %err, "SELinux labels of a volume that does not support SELinux mounts: a warning");
    Ok(())
}

/// The kubelet's `volume_manager_selinux_*` metrics (gauges, as the
/// kubelet declares them, that only grow). The container ones
/// (`volume_manager_selinux_container_*`) count labels the translator
/// cannot build: go-selinux fails only on an unknown option, which the
/// kubelet never passes, and volmgr's translator cannot fail, so they
/// never show.
#[derive(Debug, Default)]
pub struct SeLinuxMetrics {
    /// `(metric, volume_plugin, access_mode)` → count.
    counts: Mutex<BTreeMap<(&'static str, String, &'static str), u64>>,
}

/// Which pair of the kubelet's error and warning metrics an event counts in.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A pod whose containers need different labels on one volume.
    PodContextMismatch,
    /// A pod whose label differs from the other pods' of a volume.
    VolumeContextMismatch,
}
use Kind::{PodContextMismatch, VolumeContextMismatch};

/// The kubelet's names, help texts and whether the metric has the
/// `volume_plugin` label.
const FAMILIES: [(&str, &str, bool); 7] = [
    ("volume_manager_selinux_container_errors_total", "Number of errors when kubelet cannot compute SELinux context for a container. Kubelet can't start such a Pod then and it will retry, therefore value of this metric may not represent the actual nr. of containers.", false),
    ("volume_manager_selinux_container_warnings_total", "Number of errors when kubelet cannot compute SELinux context for a container that are ignored. They will become real errors when SELinuxMountReadWriteOncePod feature is expanded to all volume access modes.", false),
    ("volume_manager_selinux_pod_context_mismatch_errors_total", "Number of errors when a Pod defines different SELinux contexts for its containers that use the same volume. Kubelet can't start such a Pod then and it will retry, therefore value of this metric may not represent the actual nr. of Pods.", false),
    ("volume_manager_selinux_pod_context_mismatch_warnings_total", "Number of errors when a Pod defines different SELinux contexts for its containers that use the same volume. They are not errors yet, but they will become real errors when SELinuxMountReadWriteOncePod feature is expanded to all volume access modes.", false),
    ("volume_manager_selinux_volume_context_mismatch_errors_total", "Number of errors when a Pod uses a volume that is already mounted with a different SELinux context than the Pod needs. Kubelet can't start such a Pod then and it will retry, therefore value of this metric may not represent the actual nr. of Pods.", true),
    ("volume_manager_selinux_volume_context_mismatch_warnings_total", "Number of errors when a Pod uses a volume that is already mounted with a different SELinux context than the Pod needs. They are not errors yet, but they will become real errors when SELinuxMountReadWriteOncePod feature is expanded to all volume access modes.", true),
    ("volume_manager_selinux_volumes_admitted_total", "Number of volumes whose SELinux context was fine and will be mounted with mount -o context option.", true),
];

impl SeLinuxMetrics {
    /// Counts an error (`error`) or a warning of `kind`.
    fn count(&self, kind: Kind, error: bool, plugin: &str, access: &'static str) {
        let i = match (kind, error) {
            (PodContextMismatch, true) => 2,
            (PodContextMismatch, false) => 3,
            (VolumeContextMismatch, true) => 4,
            (VolumeContextMismatch, false) => 5,
        };
        self.add(i, plugin, access);
    }

    /// Counts a volume admitted with a label
    /// (`volume_manager_selinux_volumes_admitted_total`).
    pub fn count_admitted(&self, plugin: &str, access: &'static str) {
        self.add(6, plugin, access);
    }

    fn add(&self, family: usize, plugin: &str, access: &'static str) {
        let (name, _, with_plugin) = FAMILIES[family];
        let plugin = if with_plugin { plugin } else { "" };
        *self
            .counts
            .locked()
            .entry((name, plugin.to_string(), access))
            .or_default() += 1;
    }

    /// The count of metric `name` with labels `volume_plugin` (empty for
    /// the metrics without it) and `access_mode`.
    pub fn get(&self, name: &str, plugin: &str, access: &str) -> u64 {
        self.counts
            .locked()
            .iter()
            .find(|((n, p, a), _)| *n == name && p == plugin && *a == access)
            .map_or(0, |(_, c)| *c)
    }

    /// The Prometheus text: only the series counted so far (the kubelet's
    /// vectors show no series before their first count).
    pub fn prometheus_text(&self) -> String {
        let counts = self.counts.locked();
        let mut w = Exposition::new();
        for (name, help, with_plugin) in FAMILIES {
            let series: Vec<_> = counts.iter().filter(|((n, _, _), _)| *n == name).collect();
            if series.is_empty() {
                continue;
            }
            w.family(name, help, MetricType::Gauge);
            for ((_, plugin, access), n) in series {
                if with_plugin {
                    w.sample(
                        name,
                        &[("volume_plugin", plugin), ("access_mode", access)],
                        n,
                    );
                } else {
                    w.sample(name, &[("access_mode", access)], n);
                }
            }
        }
        w.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::desired_state_of_world::{
        DesiredStateOfWorld, PodEntry, PodToMount, PodUpdate, PodVolumeEntry, VolumeResolution,
    };
    use crate::volume::{CsiDriverInfo, CsiVolumeSource, PodUid, SubPathRelease, UniqueVolumeName};

    /// `completeSELinuxLabel` of the kubelet's tests.
    const COMPLETE: &str = "system_u:object_r:container_file_t:s0:c1,c2";
    /// The label of their `conflictingSELinuxOpts`.
    const CONFLICTING: &str = "system_u:object_r:container_file_t:s0:c98,c99";
    /// The unique name of the tests' volume.
    const VOLUME: &str = "kubernetes.io/csi/d^h";

    /// A pod's change policy in the kubelet's tables.
    #[derive(Clone, Copy)]
    enum Policy {
        Default,
        Recursive,
        MountOption,
    }
    use Policy::{Default as Dflt, MountOption as Mo, Recursive as Rec};

    fn dsw(selinux_mount: bool) -> DesiredStateOfWorld {
        let mut d = DesiredStateOfWorld::default();
        d.set_selinux_settings(SeLinuxSettings {
            enabled: true,
            selinux_mount,
        });
        d
    }

    /// Pod `uid` using PersistentVolume `pv` (access mode `mode`) of a
    /// driver that can mount with a context (`supports`), its containers
    /// needing `labels`.
    fn update(uid: &str, mode: &str, supports: bool, labels: &[&str], policy: Policy) -> PodUpdate {
        let uid = PodUid::new(uid).unwrap();
        let mut src = CsiVolumeSource::new("d", "h");
        src.pv_name = Some("pv".into());
        src.driver_info = Arc::new(CsiDriverInfo {
            selinux_mount: supports,
            ..CsiDriverInfo::default()
        });
        let selinux = VolumeSeLinux {
            file_labels: labels.iter().map(|l| Arc::from(*l)).collect(),
            random_levels: 0,
            recursive: matches!(policy, Rec),
            pv_access_modes: Some(vec![mode.to_string()]),
        };
        let name = UniqueVolumeName::new(VOLUME);
        let plugin: Arc<str> = "kubernetes.io/csi".into();
        let entry = PodEntry {
            namespace: "ns".into(),
            name: uid.as_str().into(),
            volumes: vec![PodVolumeEntry {
                outer_name: "volume-name".into(),
                resolution: VolumeResolution::Desired {
                    name: name.clone(),
                    plugin: Arc::clone(&plugin),
                },
            }],
            supplemental_groups: vec![],
            terminated: false,
        };
        let pod = PodToMount {
            outer_volume_spec_names: vec!["volume-name".into()],
            spec: Arc::new(VolumeSpec {
                name: "volume-name".into(),
                source: VolumeSource::Csi(Box::new(src)),
            }),
            fs_group: None,
            fs_group_change_policy: Default::default(),
            selinux_label: None,
            selinux,
            sub_paths: vec![],
            sub_path_release: SubPathRelease::All,
        };
        PodUpdate {
            uid,
            entry,
            mounts: vec![(name, plugin, pod)],
        }
    }

    /// The label the volume is mounted with (the kubelet's
    /// `VolumeExists(name, label)`), and what its CSI calls get.
    fn mounted_label(d: &DesiredStateOfWorld) -> String {
        let v = d.volume(&UniqueVolumeName::new(VOLUME)).unwrap();
        let label = v
            .effective_selinux_label
            .as_deref()
            .unwrap_or("")
            .to_string();
        for p in v.pods.values() {
            assert_eq!(p.selinux_label.as_deref().unwrap_or(""), label);
            let VolumeSource::Csi(c) = &p.spec.source else {
                unreachable!()
            };
            assert_eq!(
                c.driver_info.selinux_mount_label.as_deref().unwrap_or(""),
                label
            );
        }
        label
    }

    /// The pod's error on its volume, if it has one.
    fn pod_error(d: &DesiredStateOfWorld, uid: &str) -> Option<String> {
        let p = d.pod(&PodUid::new(uid).unwrap()).unwrap();
        p.volumes[0]
            .resolution
            .as_result()
            .err()
            .map(str::to_string)
    }

    /// `Test_AddPodToVolume_SELinuxSinglePod`
    /// (`pkg/kubelet/volumemanager/cache/desired_state_of_world_test.go`,
    /// v1.37): `(name, SELinuxMount, plugin supports, access mode, pod
    /// labels, policy, expected label)`. Its `RWOP` and
    /// `RWOP+ChangePolicy` rows are `SELinuxMount` off (the other two gates
    /// are locked on in 1.37), `+Mount` on; "incomplete SELinuxOptions"
    /// translates to the complete label (see `convert::selinux`'s tests).
    #[test]
    fn single_pod_table_of_the_kubelet() {
        let c = &[COMPLETE][..];
        type Row<'a> = (&'a str, bool, bool, &'a str, &'a [&'a str], Policy, &'a str);
        let rows: [Row<'_>; 15] = [
            (
                "RWOP: ReadWriteOncePod with plugin that supports SELinux mount",
                false,
                true,
                "ReadWriteOncePod",
                c,
                Dflt,
                COMPLETE,
            ),
            (
                "RWOP: ReadWriteOncePod incomplete SELinuxOptions",
                false,
                true,
                "ReadWriteOncePod",
                c,
                Dflt,
                COMPLETE,
            ),
            (
                "RWOP: ReadWriteOncePod no SELinuxOptions",
                false,
                true,
                "ReadWriteOncePod",
                &[],
                Dflt,
                "",
            ),
            (
                "RWOP: ReadWriteOncePod with plugin that does not support SELinux mount",
                false,
                false,
                "ReadWriteOncePod",
                c,
                Dflt,
                "",
            ),
            (
                "RWOP: ReadWriteMany with plugin that supports SELinux mount",
                false,
                true,
                "ReadWriteMany",
                c,
                Dflt,
                "",
            ),
            (
                "RWOP+ChangePolicy: ReadWriteMany with the default policy",
                false,
                true,
                "ReadWriteMany",
                c,
                Dflt,
                "",
            ),
            (
                "RWOP+ChangePolicy: ReadWriteMany with Recursive policy",
                false,
                true,
                "ReadWriteMany",
                c,
                Rec,
                "",
            ),
            (
                "RWOP+ChangePolicy: ReadWriteMany with MountOption policy",
                false,
                true,
                "ReadWriteMany",
                c,
                Mo,
                "",
            ),
            (
                "RWOP+ChangePolicy: ReadWriteOncePod with Recursive policy",
                false,
                true,
                "ReadWriteOncePod",
                c,
                Rec,
                "",
            ),
            (
                "RWOP+ChangePolicy: ReadWriteOncePod with MountOption policy",
                false,
                true,
                "ReadWriteOncePod",
                c,
                Mo,
                COMPLETE,
            ),
            (
                "RWOP+ChangePolicy+Mount: ReadWriteMany with the default policy",
                true,
                true,
                "ReadWriteMany",
                c,
                Dflt,
                COMPLETE,
            ),
            (
                "RWOP+ChangePolicy+Mount: ReadWriteMany with Recursive policy",
                true,
                true,
                "ReadWriteMany",
                c,
                Rec,
                "",
            ),
            (
                "RWOP+ChangePolicy+Mount: ReadWriteMany with MountOption policy",
                true,
                true,
                "ReadWriteMany",
                c,
                Mo,
                COMPLETE,
            ),
            (
                "RWOP+ChangePolicy+Mount: ReadWriteOncePod with Recursive policy",
                true,
                true,
                "ReadWriteOncePod",
                c,
                Rec,
                "",
            ),
            (
                "RWOP+ChangePolicy+Mount: ReadWriteOncePod with MountOption policy",
                true,
                true,
                "ReadWriteOncePod",
                c,
                Mo,
                COMPLETE,
            ),
        ];
        for (name, gate, supports, mode, labels, policy, want) in rows {
            let mut d = dsw(gate);
            d.set_pod(update("pod1uid", mode, supports, labels, policy));
            assert_eq!(pod_error(&d, "pod1uid"), None, "{name}");
            assert_eq!(mounted_label(&d), want, "{name}");
        }
    }

    /// `Test_AddPodToVolume_SELinux_MultiplePods` (same file): `(name,
    /// SELinuxMount, access mode, first and second pod's label and policy,
    /// second refused, expected label)`.
    #[test]
    fn multiple_pods_table_of_the_kubelet() {
        type Row<'a> = (
            &'a str,
            bool,
            &'a str,
            &'a str,
            &'a str,
            Policy,
            Policy,
            bool,
            &'a str,
        );
        let (s, x) = (COMPLETE, CONFLICTING);
        let rows: [Row<'_>; 20] = [
            ("RWOP: ReadWriteOncePod with the same SELinux options", false, "ReadWriteOncePod", s, s, Dflt, Dflt, false, COMPLETE),
            ("RWOP: ReadWriteOncePod with conflicting SELinux options", false, "ReadWriteOncePod", s, x, Dflt, Dflt, true, COMPLETE),
            ("RWOP: ReadWriteMany with the same SELinux options", false, "ReadWriteMany", s, s, Dflt, Dflt, false, ""),
            ("RWOP+ChangePolicy: ReadWriteOncePod with the same SELinux options", false, "ReadWriteOncePod", s, s, Dflt, Dflt, false, COMPLETE),
            ("RWOP+ChangePolicy: ReadWriteOncePod with the same SELinux options and same Recursive policy", false, "ReadWriteOncePod", s, s, Rec, Rec, false, ""),
            ("RWOP+ChangePolicy: ReadWriteOncePod with the same SELinux options and conflicting policies", false, "ReadWriteOncePod", s, s, Rec, Dflt, true, ""),
            ("RWOP+ChangePolicy: ReadWriteMany with the same SELinux options with Recursive policy", false, "ReadWriteMany", s, s, Rec, Rec, false, ""),
            ("RWOP+ChangePolicy: ReadWriteMany with the same SELinux options with MountOption policy", false, "ReadWriteMany", s, s, Mo, Mo, false, ""),
            ("RWOP+ChangePolicy: ReadWriteMany with the same SELinux options with conflicting policies", false, "ReadWriteMany", s, s, Mo, Rec, false, ""),
            ("RWOP+ChangePolicy: ReadWriteMany with conflicting SELinux options and Recursive policy", false, "ReadWriteMany", s, x, Rec, Rec, false, ""),
            ("RWOP+ChangePolicy: ReadWriteMany with conflicting SELinux options and MountOption policy", false, "ReadWriteMany", s, x, Mo, Mo, false, ""),
            ("RWOP+ChangePolicy+Mount: ReadWriteOncePod with the same SELinux options", true, "ReadWriteOncePod", s, s, Dflt, Dflt, false, COMPLETE),
            ("RWOP+ChangePolicy+Mount: ReadWriteOncePod with the same SELinux options and same Recursive policy", true, "ReadWriteOncePod", s, s, Rec, Rec, false, ""),
            ("RWOP+ChangePolicy+Mount: ReadWriteOncePod with the same SELinux options and conflicting policies", true, "ReadWriteOncePod", s, s, Rec, Dflt, true, ""),
            ("RWOP+ChangePolicy+Mount: ReadWriteMany with the same SELinux options with Recursive policy", true, "ReadWriteMany", s, s, Rec, Rec, false, ""),
            ("RWOP+ChangePolicy+Mount: ReadWriteMany with the same SELinux options with MountOption policy", true, "ReadWriteMany", s, s, Mo, Mo, false, COMPLETE),
            ("RWOP+ChangePolicy+Mount: ReadWriteMany with the same SELinux options with default and MountOption policy", true, "ReadWriteMany", s, s, Dflt, Mo, false, COMPLETE),
            ("RWOP+ChangePolicy+Mount: ReadWriteMany with the same SELinux options with conflicting policies", true, "ReadWriteMany", s, s, Mo, Rec, true, COMPLETE),
            ("RWOP+ChangePolicy+Mount: ReadWriteMany with conflicting SELinux options and Recursive policy", true, "ReadWriteMany", s, x, Rec, Rec, false, ""),
            ("RWOP+ChangePolicy+Mount: ReadWriteMany with conflicting SELinux options and MountOption policy", true, "ReadWriteMany", s, x, Mo, Mo, true, COMPLETE),
        ];
        for (name, gate, mode, first, second, p1, p2, refused, want) in rows {
            let mut d = dsw(gate);
            d.set_pod(update("pod1uid", mode, true, &[first], p1));
            d.set_pod(update("pod2uid", mode, true, &[second], p2));
            assert_eq!(pod_error(&d, "pod1uid"), None, "{name}");
            let e = pod_error(&d, "pod2uid");
            assert_eq!(e.is_some(), refused, "{name}: {e:?}");
            if let Some(e) = e {
                assert!(
                    e.starts_with("conflicting SELinux labels of volume pv: "),
                    "{e}"
                );
            }
            assert_eq!(mounted_label(&d), want, "{name}");
            let pods = d.volume(&UniqueVolumeName::new(VOLUME)).unwrap().pods.len();
            assert_eq!(pods, if refused { 1 } else { 2 }, "{name}");
        }
    }

    /// The second pod's error is the kubelet's text and counts in
    /// `volume_manager_selinux_volume_context_mismatch_errors_total`;
    /// once the first pod leaves, the second pod's volume is admitted with
    /// its own label (before, volmgr had no such check: both pods were
    /// published, the second with a label the staged mount did not have).
    #[test]
    fn a_refused_pod_gets_the_volume_once_the_other_leaves() {
        let mut d = dsw(true);
        d.set_pod(update("a", "ReadWriteOnce", true, &[COMPLETE], Dflt));
        d.set_pod(update("b", "ReadWriteOnce", true, &[CONFLICTING], Dflt));
        assert_eq!(
            pod_error(&d, "b").as_deref(),
            Some(
                format!(
                    "conflicting SELinux labels of volume pv: {COMPLETE:?} and {CONFLICTING:?}"
                )
                .as_str()
            )
        );
        let b = PodUid::new("b").unwrap();
        assert_eq!(d.selinux_refused(&b).len(), 1);
        let m = d.selinux_metrics();
        let errors = "volume_manager_selinux_volume_context_mismatch_errors_total";
        assert_eq!(m.get(errors, "kubernetes.io/csi/d", "RWO"), 1);
        let admitted = "volume_manager_selinux_volumes_admitted_total";
        assert_eq!(m.get(admitted, "kubernetes.io/csi/d", "RWO"), 1);
        let text = m.prometheus_text();
        for line in [
            "# TYPE volume_manager_selinux_volume_context_mismatch_errors_total gauge",
            "volume_manager_selinux_volume_context_mismatch_errors_total{volume_plugin=\"kubernetes.io/csi/d\",access_mode=\"RWO\"} 1",
            "volume_manager_selinux_volumes_admitted_total{volume_plugin=\"kubernetes.io/csi/d\",access_mode=\"RWO\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in:\n{text}");
        }
        let changed = d.delete_pod(&PodUid::new("a").unwrap());
        assert!(changed.contains(&UniqueVolumeName::new(VOLUME)));
        assert_eq!(pod_error(&d, "b"), None);
        assert!(d.selinux_refused(&b).is_empty());
        assert_eq!(mounted_label(&d), CONFLICTING);
        assert!(d.pod_exists_in_volume(&UniqueVolumeName::new(VOLUME), &b));
    }

    /// Containers of one pod that need different labels: the kubelet's
    /// `multiple SELinux labels found` error where the volume supports
    /// SELinux mounts, a warning (no label) on an inline volume; a host
    /// without SELinux checks nothing.
    #[test]
    fn containers_that_disagree_and_hosts_without_selinux() {
        let mut d = dsw(true);
        d.set_pod(update(
            "a",
            "ReadWriteOnce",
            true,
            &[COMPLETE, CONFLICTING],
            Dflt,
        ));
        assert_eq!(
            pod_error(&d, "a").as_deref(),
            Some(format!("multiple SELinux labels found: {COMPLETE},{CONFLICTING}").as_str())
        );
        let m = d.selinux_metrics();
        let errors = "volume_manager_selinux_pod_context_mismatch_errors_total";
        assert_eq!(m.get(errors, "", "RWO"), 1);
        let mut inline = update("b", "ReadWriteOnce", true, &[COMPLETE, CONFLICTING], Dflt);
        inline.mounts[0].2.selinux.pv_access_modes = None;
        let mut d = dsw(true);
        d.set_pod(inline.clone());
        assert_eq!(pod_error(&d, "b"), None);
        assert_eq!(mounted_label(&d), "");
        let warnings = "volume_manager_selinux_pod_context_mismatch_warnings_total";
        assert_eq!(d.selinux_metrics().get(warnings, "", "inline"), 1);
        let mut d = DesiredStateOfWorld::default();
        d.set_pod(update(
            "a",
            "ReadWriteOnce",
            true,
            &[COMPLETE, CONFLICTING],
            Dflt,
        ));
        d.set_pod(update("b", "ReadWriteOnce", true, &[CONFLICTING], Dflt));
        assert_eq!((pod_error(&d, "a"), pod_error(&d, "b")), (None, None));
        assert_eq!(mounted_label(&d), "");
        assert_eq!(d.selinux_metrics().prometheus_text(), "");
    }

    /// The kubelet's `getVolumeAccessMode` order and
    /// `VolumeSupportsSELinuxMount`.
    #[test]
    fn access_mode_and_support() {
        let f = |modes: Option<&[&str]>| VolumeSeLinux {
            pv_access_modes: modes.map(|m| m.iter().map(|s| s.to_string()).collect()),
            ..VolumeSeLinux::default()
        };
        let (on, off) = (
            SeLinuxSettings {
                enabled: true,
                selinux_mount: true,
            },
            SeLinuxSettings {
                enabled: true,
                selinux_mount: false,
            },
        );
        assert_eq!(f(None).access_mode(), "inline");
        assert_eq!(
            f(Some(&["ReadWriteOncePod", "ReadWriteMany"])).access_mode(),
            "RWX"
        );
        assert_eq!(
            f(Some(&["ReadWriteOnce", "ReadOnlyMany"])).access_mode(),
            "ROX"
        );
        assert_eq!(f(Some(&["ReadWriteOncePod"])).access_mode(), "RWOP");
        assert!(!f(None).supports_selinux_mount(&on));
        assert!(f(Some(&["ReadWriteMany"])).supports_selinux_mount(&on));
        assert!(!f(Some(&["ReadWriteMany"])).supports_selinux_mount(&off));
        assert!(f(Some(&["ReadWriteOncePod"])).supports_selinux_mount(&off));
        assert!(!f(Some(&["ReadWriteOncePod", "ReadWriteOnce"])).supports_selinux_mount(&off));
    }
}
