//! The status document and the Prometheus text of a manager.

use super::VolumeManager;
use crate::cache::actual_state_of_world::{ActualStateOfWorld, DeviceMountState, VolumeMountState};
use crate::cache::desired_state_of_world::{DesiredStateOfWorld, PodVolumeEntry};
use crate::operationexecutor::{OperationKind, OperationRecord};
use std::collections::HashMap;

use crate::plugins::subpath;
use crate::status::{
    CsiDriverStatus, DeviceStatus, ObserveStatus, ObservedVolume, PodStatus, SourceError, Status,
    SubPathStatus, VolumeStatus,
};
use crate::util::sync::MutexExt;
use crate::volume::{PodUid, UniqueVolumeName};

impl VolumeManager {
    /// The status document.
    pub fn status(&self) -> Status {
        let observe = self.observe_status();
        let mut pods = self.pod_statuses();
        if let Some(o) = &observe {
            observed_volumes(&mut pods, o);
        }
        let errors = self.source_statuses(&mut pods);
        pods.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
        let (tracer, tracer_reason) = self.tracer.name_and_reason();
        let (tracer_stats, syscalls) = self.tracer.stats();
        Status {
            // The manager never starts in observe mode: its own sync
            // would never come; observe mode's is its scans'.
            synced: observe
                .as_ref()
                .map_or_else(|| self.world.synced(), |o| o.synced),
            tracer,
            tracer_reason,
            pods,
            errors,
            operations: self.metrics.summaries(),
            csi_drivers: self.csi_driver_statuses(),
            syscalls,
            tracer_stats,
            out_of_band: self.out_of_band.recent(),
            root_propagation: self.root_propagation.clone(),
            path_resolution: match crate::sys::beneath::openat2_in_use() {
                Some(true) => "openat2".into(),
                Some(false) => "openat walk".into(),
                None => String::new(),
            },
            devices: self.device_statuses(),
            stuck_syscalls: self.tracer.stuck().stuck(),
            stuck_tools: self.tracer.stuck().stuck_tools(),
            observe,
        }
    }

    /// Every volume's device mount that is (or may be) there, by volume
    /// name, with its operation's attempts and last error.
    pub(super) fn device_statuses(&self) -> Vec<DeviceStatus> {
        let dsw = self.world.dsw();
        let asw = self.world.asw();
        let mut out: Vec<DeviceStatus> = asw
            .volumes()
            .filter(|(_, v)| v.device_mount_state != DeviceMountState::NotMounted)
            .map(|(name, v)| {
                let rec = self.executor.record(name, None);
                let state = match v.device_mount_state {
                    _ if !dsw.volume_exists(name) => "unmounting",
                    DeviceMountState::Uncertain => "uncertain",
                    _ => "mounted",
                };
                DeviceStatus {
                    volume: name.to_string(),
                    plugin: v.plugin_name.to_string(),
                    state: state.into(),
                    path: v
                        .device_mount_path
                        .as_ref()
                        .map(|p| p.display().to_string()),
                    pods: u32::try_from(v.pods.len()).unwrap_or(u32::MAX),
                    operation: rec.as_ref().map(|r| r.kind.metric_name().to_string()),
                    attempts: rec.as_ref().map_or(0, |r| r.attempts),
                    error: rec.and_then(|r| r.last_error),
                }
            })
            .collect();
        out.sort_by(|a, b| a.volume.cmp(&b.volume));
        out
    }

    /// `volmgr_volume_devices{plugin_name,state}`: the devices of
    /// [`Self::device_statuses`] counted by plugin and state.
    fn device_metrics(&self) -> String {
        use crate::util::prometheus::{Exposition, MetricType};
        let mut counts = std::collections::BTreeMap::<(String, String), u64>::new();
        for d in self.device_statuses() {
            *counts.entry((d.plugin, d.state)).or_default() += 1;
        }
        let mut w = Exposition::new();
        let name = "volmgr_volume_devices";
        w.family(
            name,
            "Volumes' device mounts (CSI staging, block global maps) on the node, in use or not yet unmounted.",
            MetricType::Gauge,
        );
        for ((plugin, state), n) in counts {
            w.sample(name, &[("plugin_name", &plugin), ("state", &state)], n);
        }
        w.finish()
    }

    /// Every desired pod, then the pods gone from the desired state that
    /// still have mounts (names unknown only for pods found at start-up).
    fn pod_statuses(&self) -> Vec<PodStatus> {
        // A snapshot, so the populator's lock is never held with a world's lock.
        let departing = self.populator.departing_names();
        let dsw = self.world.dsw();
        let asw = self.world.asw();
        let mut pods = Vec::new();
        for (uid, entry) in dsw.pods() {
            let volumes = entry
                .volumes
                .iter()
                .map(|v| {
                    let mut st = self.volume_status(uid, v, &dsw, &asw);
                    // Kept as it was: why it no longer resolves comes first.
                    st.error = v.resolution.kept_error().map(str::to_string).or(st.error);
                    st.unresolved = v.resolution.unresolved().map(|u| u.name().to_string());
                    st
                })
                .collect();
            // Volumes kept as they were since they no longer resolve, and
            // volumes mounted with another SELinux label (the kubelet's pod
            // errors).
            let errors: Vec<String> = entry
                .volumes
                .iter()
                .filter_map(|v| {
                    let e = v.resolution.kept_error().map(str::to_string).or_else(|| {
                        let name = v.resolution.name()?;
                        super::wait::selinux_mount_mismatch(&dsw, &asw, name, uid)
                    })?;
                    Some(format!("volume {}: {e}", v.outer_name))
                })
                .collect();
            pods.push(PodStatus {
                uid: uid.to_string(),
                namespace: entry.namespace.to_string(),
                name: entry.name.to_string(),
                error: (!errors.is_empty()).then(|| errors.join("; ")),
                volumes,
            });
        }
        for uid in asw.pods() {
            if dsw.pod(uid).is_some() {
                continue;
            }
            let (namespace, name) = departing
                .get(uid)
                .map(|(ns, n)| (ns.to_string(), n.to_string()))
                .unwrap_or_default();
            pods.push(PodStatus {
                uid: uid.to_string(),
                namespace,
                name,
                error: None,
                volumes: self.departing_volume_statuses(uid, &asw),
            });
        }
        pods
    }

    /// The volumes of a pod gone from the desired state: all unmounting.
    fn departing_volume_statuses(
        &self,
        uid: &PodUid,
        asw: &ActualStateOfWorld,
    ) -> Vec<VolumeStatus> {
        asw.all_mounts_of_pod(uid)
            .into_iter()
            .map(|m| {
                let rec = self.executor.record(&m.volume_name, Some(uid));
                let oob = self.out_of_band.volume(&m.volume_name, uid);
                VolumeStatus {
                    path: Some(m.path.display().to_string()),
                    attempts: rec.as_ref().map_or(0, |r| r.attempts),
                    error: rec.and_then(|r| r.last_error),
                    out_of_band_changes: oob.as_ref().map_or(0, |o| o.0),
                    last_out_of_band: oob.map(|o| o.1),
                    stats: self.stats.status_of(&m.volume_name, uid),
                    ..VolumeStatus::new(m.outer_volume_spec_name, m.plugin_name, "unmounting")
                }
            })
            .collect()
    }

    /// The sources' problems: inputs that yielded no pod go to `errors`
    /// (returned), pods rejected as a whole are added to `pods`.
    fn source_statuses(&self, pods: &mut Vec<PodStatus>) -> Vec<SourceError> {
        let mut errors = Vec::new();
        for (source, st) in self.populator.source_problems() {
            for e in &st.errors {
                errors.push(SourceError {
                    source: source.clone(),
                    error: e.clone(),
                });
            }
            for r in &st.rejected {
                pods.push(PodStatus {
                    uid: r.uid.clone().unwrap_or_default(),
                    namespace: r.namespace.clone(),
                    name: r.name.clone(),
                    error: Some(format!("{}: {}", source, r.reason)),
                    volumes: Vec::new(),
                });
            }
        }
        errors
    }

    /// The registered CSI drivers, once a registry is set.
    fn csi_driver_statuses(&self) -> Vec<CsiDriverStatus> {
        self.csi_drivers
            .get()
            .map(|r| {
                r.driver_infos()
                    .into_iter()
                    .map(|d| CsiDriverStatus {
                        node_id: d.node.as_ref().map(|n| n.node_id.clone()),
                        max_volumes_per_node: d
                            .node
                            .as_ref()
                            .map(|n| n.max_volumes_per_node)
                            .filter(|m| *m > 0),
                        name: d.name,
                        endpoint: d.endpoint.display().to_string(),
                        versions: d.versions,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn volume_status(
        &self,
        uid: &PodUid,
        v: &PodVolumeEntry,
        dsw: &DesiredStateOfWorld,
        asw: &ActualStateOfWorld,
    ) -> VolumeStatus {
        let plugin = v.resolution.plugin().map_or("", |p| &**p).to_string();
        let name = match v
            .resolution
            .name()
            .ok_or_else(|| v.resolution.error().unwrap_or_default())
        {
            Err(e) => {
                return VolumeStatus {
                    error: Some(e.to_string()),
                    ..VolumeStatus::new(v.outer_name.clone(), plugin, "error")
                }
            }
            Ok(n) => n,
        };
        let mount = asw.pod_mount(name, uid);
        let rec = self.blocking_record(name, uid, mount.is_none());
        let in_dsw = dsw.pod_exists_in_volume(name, uid);
        let state = volume_state(in_dsw, mount.map(|m| m.state), rec.as_ref());
        let attempts = rec.as_ref().map_or(0, |r| {
            if matches!(
                r.kind,
                OperationKind::MountVolume
                    | OperationKind::MountDevice
                    | OperationKind::PrepareSubPaths
            ) || !in_dsw
            {
                r.attempts
            } else {
                0
            }
        });
        let oob = self.out_of_band.volume(name, uid);
        VolumeStatus {
            name: v.outer_name.clone(),
            plugin,
            state: state.into(),
            path: mount.map(|m| m.path.display().to_string()),
            attempts,
            error: super::wait::selinux_mount_mismatch(dsw, asw, name, uid)
                .or_else(|| rec.and_then(|r| r.last_error))
                .or_else(|| self.volume_wait_error(name, dsw, asw)),
            out_of_band_changes: oob.as_ref().map_or(0, |o| o.0),
            last_out_of_band: oob.map(|o| o.1),
            stats: mount.and_then(|_| self.stats.status_of(name, uid)),
            content: self.payload.states.content_status(name),
            sub_paths: match mount.map(|m| m.state) {
                Some(VolumeMountState::Mounted) => self.sub_path_statuses(dsw, asw, name, uid),
                _ => Vec::new(),
            },
            read_only: dsw
                .volume(name)
                .and_then(|dv| dv.pods.get(uid))
                .is_some_and(|p| p.spec.read_only()),
            selinux_relabel: mount.is_some_and(|m| m.selinux_relabel),
            since: None,
            unresolved: None,
        }
    }

    /// What a volume without an error of its own shows: a failed expansion
    /// of the mounted volume, or, for an attachable volume, why it waits to
    /// be reported in use or attached.
    fn volume_wait_error(
        &self,
        name: &UniqueVolumeName,
        dsw: &DesiredStateOfWorld,
        asw: &ActualStateOfWorld,
    ) -> Option<String> {
        self.executor
            .record(name, None)
            .filter(|d| d.kind == OperationKind::ExpandVolume)
            .and_then(|d| d.last_error)
            .or_else(|| {
                dsw.volume(name)
                    .and_then(|dv| self.reconciler.attach_wait(name, dv, asw))
                    .map(str::to_string)
            })
    }

    /// The subPath bind mounts of `uid`'s `volume` that are prepared (the
    /// containers' uses the desired state lists, once bound).
    fn sub_path_statuses(
        &self,
        dsw: &DesiredStateOfWorld,
        asw: &ActualStateOfWorld,
        volume: &UniqueVolumeName,
        uid: &PodUid,
    ) -> Vec<SubPathStatus> {
        let Some(p) = dsw.volume(volume).and_then(|v| v.pods.get(uid)) else {
            return Vec::new();
        };
        p.sub_paths
            .iter()
            .filter(|s| asw.sub_path_prepared(volume, uid, &s.container, s.index))
            .filter_map(|s| {
                let rel = subpath::sub_path_rel(uid, &p.spec.name, s).ok()?;
                Some(SubPathStatus {
                    container: s.container.clone(),
                    index: s.index,
                    sub_path: s.path.clone(),
                    path: self.root.abs(&rel).display().to_string(),
                })
            })
            .collect()
    }

    /// Per desired volume of `uid`, its names in the pod (the desired
    /// state's `outerVolumeSpecNames`: more than one when several volumes
    /// of the pod name the same claim), for the C ABI's volume lists.
    pub fn outer_names_of_pod(&self, uid: &PodUid) -> HashMap<UniqueVolumeName, Vec<String>> {
        let dsw = self.world.dsw();
        let Some(entry) = dsw.pod(uid) else {
            return HashMap::new();
        };
        entry
            .volumes
            .iter()
            .filter_map(|v| v.resolution.name())
            .filter_map(|name| {
                let p = dsw.volume(name)?.pods.get(uid)?;
                Some((name.clone(), p.outer_volume_spec_names.clone()))
            })
            .collect()
    }

    /// Per volume (by its name in the pod), the subPath bind mounts of
    /// `uid`'s mounted volumes (for the C ABI's volume lists).
    pub fn sub_paths_of_pod(&self, uid: &PodUid) -> HashMap<String, Vec<SubPathStatus>> {
        let dsw = self.world.dsw();
        let Some(entry) = dsw.pod(uid) else {
            return HashMap::new();
        };
        let asw = self.world.asw();
        entry
            .volumes
            .iter()
            .filter_map(|v| {
                let name = v.resolution.name()?;
                let subs = self.sub_path_statuses(&dsw, &asw, name, uid);
                (!subs.is_empty()).then(|| (v.outer_name.clone(), subs))
            })
            .collect()
    }

    /// Prometheus text.
    pub fn metrics_text(&self) -> String {
        let desired = self.world.dsw().count_by_plugin();
        // Observe mode: the kubelet's volumes as seen, not the never-started
        // manager's (none).
        let actual = match self.observe_status() {
            Some(o) => self.observed_counts(&o),
            None => self.world.asw().count_by_plugin(),
        };
        let mut plugins: Vec<String> = self
            .plugins
            .all()
            .iter()
            .map(|(n, _)| n.to_string())
            .collect();
        plugins.sort();
        let counts: Vec<(String, usize, usize)> = plugins
            .into_iter()
            .map(|p| {
                let d = desired.get(p.as_str()).copied().unwrap_or(0);
                let a = actual.get(p.as_str()).copied().unwrap_or(0);
                (p, d, a)
            })
            .collect();
        let mut extra: String = self.extra_metrics.locked().iter().map(|f| f()).collect();
        extra.push_str(&self.device_metrics());
        extra.push_str(&self.metrics.kubelet.prometheus_text());
        let selinux = std::sync::Arc::clone(self.world.dsw().selinux_metrics());
        extra.push_str(&selinux.prometheus_text());
        self.metrics.render(&counts, &extra)
    }

    /// Observe mode: the volumes its last scan saw mounted, by plugin.
    fn observed_counts(&self, o: &ObserveStatus) -> HashMap<std::sync::Arc<str>, usize> {
        let dsw = self.world.dsw();
        let mut out: HashMap<std::sync::Arc<str>, usize> = HashMap::new();
        for v in o.volumes.iter().filter(|v| v.state == "mounted") {
            let plugin = PodUid::new(&v.pod_uid).ok().and_then(|uid| {
                dsw.pod(&uid)?
                    .volumes
                    .iter()
                    .find(|e| e.outer_name == v.volume)?
                    .resolution
                    .plugin()
                    .cloned()
            });
            if let Some(p) = plugin {
                *out.entry(p).or_default() += 1;
            }
        }
        out
    }

    /// The record of the operation that holds a pod's volume back: its own,
    /// or, while it is not set up yet, the volume's device operation (CSI
    /// staging) when that one failed and the volume's own did not.
    fn blocking_record(
        &self,
        name: &UniqueVolumeName,
        uid: &PodUid,
        not_set_up: bool,
    ) -> Option<OperationRecord> {
        let rec = self.executor.record(name, Some(uid));
        if !not_set_up {
            return rec;
        }
        let dev = self
            .executor
            .record(name, None)
            .filter(|d| d.kind == OperationKind::MountDevice && d.attempts > 0);
        match dev {
            Some(dev) if rec.as_ref().is_none_or(|r| r.last_error.is_none()) => Some(dev),
            _ => rec,
        }
    }
}

/// Observe mode: the pods' volumes as its last scan saw them (the
/// kubelet's state: `mounted`, `not_mounted`, `stuck`; `unknown` before a
/// scan saw the volume), not the never-started manager's `pending` with
/// no attempts.
fn observed_volumes(pods: &mut [PodStatus], o: &ObserveStatus) {
    let seen: HashMap<(&str, &str), &ObservedVolume> = o
        .volumes
        .iter()
        .map(|v| ((v.pod_uid.as_str(), v.volume.as_str()), v))
        .collect();
    for p in pods.iter_mut() {
        for v in &mut p.volumes {
            v.attempts = 0;
            match seen.get(&(p.uid.as_str(), v.name.as_str())) {
                Some(s) => {
                    v.state = s.state.clone();
                    v.path = s.path.clone();
                    v.since = s.since.clone();
                    v.error = s.error.clone().or(v.error.take());
                }
                None if v.state == "error" => {}
                None => v.state = "unknown".into(),
            }
        }
    }
}

/// The `state` shown for a volume of a pod.
fn volume_state(
    in_dsw: bool,
    mounted: Option<VolumeMountState>,
    rec: Option<&OperationRecord>,
) -> &'static str {
    // Waiting for a driver to register is pending, not an error.
    let failed = rec.is_some_and(|r| r.last_error.is_some() && !r.running && !r.waiting);
    let uncertain_err = rec.is_some_and(|r| r.uncertain);
    match (in_dsw, mounted) {
        (true, Some(VolumeMountState::Mounted)) => "mounted",
        (true, Some(VolumeMountState::Uncertain)) if failed && !uncertain_err => "error",
        (true, Some(VolumeMountState::Uncertain)) => "uncertain",
        // The device operation (CSI staging) may or may not have happened.
        (true, None) if failed && uncertain_err => "uncertain",
        (true, None) if failed => "error",
        (true, None) => "pending",
        (false, Some(_)) => "unmounting",
        (false, None) => "pending",
    }
}
