//! Turning a Kubernetes `v1.Pod` into what the desired state needs: identity,
//! security context and the volumes its containers use, each validated.
//!
//! CSI volumes are resolved here too, like the kubelet's desired state of
//! world populator: an inline `csi` volume gets the kubelet's generated volume
//! handle, and a `persistentVolumeClaim` is followed to its bound
//! PersistentVolume's `spec.csi`. The PVC, PV and Secret objects come from an
//! [`ObjectStore`] (the manifests directory, or an API server cache); a
//! missing or unbound object is an error of that one volume, which goes away
//! when the source re-resolves the pod after the object appears.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, Volume};

pub use super::VolumeSpecError;
use super::{fetch_secret, invalid, PayloadResolution, Usage};
pub use crate::populator::objects::ObjectStore;
use crate::quantity;
use crate::volume::{
    check_volume_name, CsiAccessMode, CsiVolumeMode, CsiVolumeSource, PodUid, StorageMedium,
    SubPath, SubPathRelease, VolumeSource,
};

/// A pod rejected as a whole (it never gets any volume).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {namespace}/{name}: {reason}")]
pub struct PodRejected {
    /// `metadata.namespace` (or `default`).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid` as given, even if invalid.
    pub uid: Option<String>,
    /// Why.
    pub reason: String,
}

/// One volume of a desired pod: its outer name and either a source the manager
/// understands or the reason it cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub struct PodVolume {
    /// `spec.volumes[].name`.
    pub name: String,
    /// The parsed source, or a per-volume error.
    pub source: Result<VolumeSource, VolumeSpecError>,
    /// The containers' `volumeMounts` of it with a `subPath` (or an
    /// expanded `subPathExpr`), in container and index order.
    pub sub_paths: Vec<SubPath>,
    /// What the pod says about its SELinux label (see `cache::selinux`).
    pub selinux: crate::cache::selinux::VolumeSeLinux,
}

/// The part of a pod the volume manager cares about.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredPod {
    /// The UID (`metadata.uid`, or derived from namespace and name).
    pub uid: PodUid,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.securityContext.fsGroup`.
    pub fs_group: Option<i64>,
    /// `spec.securityContext.fsGroupChangePolicy`.
    pub fs_group_change_policy: crate::volume::FsGroupChangePolicy,
    /// `spec.securityContext.supplementalGroups`.
    pub supplemental_groups: Vec<i64>,
    /// `spec.securityContext.seLinuxOptions` as a `user:role:type:level` label.
    pub selinux_label: Option<String>,
    /// The volumes used by at least one container, in spec order.
    pub volumes: Vec<PodVolume>,
    /// The pod has terminated (`status.phase` Succeeded or Failed): its volumes
    /// are no longer needed.
    pub terminated: bool,
    /// Whose subPaths are prepared without being asked: everyone's after
    /// conversion; a source may narrow it ([`SubPathTiming`](crate::populator::SubPathTiming)).
    pub sub_path_release: SubPathRelease,
}

impl DesiredPod {
    /// Converts and validates a pod without access to other objects:
    /// `persistentVolumeClaim` volumes are kept as [`VolumeSource::Other`]
    /// (a host plugin may claim them) and an inline `csi` volume with a
    /// `nodePublishSecretRef` is a volume error. Use
    /// [`DesiredPod::from_pod_with`] to resolve them.
    pub fn from_pod(pod: &Pod) -> Result<Self, PodRejected> {
        Self::from_pod_with(pod, None)
    }

    /// Converts and validates a pod, resolving PVCs, PVs and Secrets through
    /// `objects` (when given).
    pub fn from_pod_with(pod: &Pod, objects: Option<&ObjectStore>) -> Result<Self, PodRejected> {
        Self::from_pod_resolving(pod, objects, PayloadResolution::Full)
    }

    /// Converts and validates a pod like [`DesiredPod::from_pod_with`],
    /// resolving payload volumes (and CSI volumes' Secrets) as `payloads`
    /// says: [`PayloadResolution::NamesOnly`] reads no ConfigMap, Secret,
    /// ClusterTrustBundle or ServiceAccount.
    pub fn from_pod_resolving(
        pod: &Pod,
        objects: Option<&ObjectStore>,
        payloads: PayloadResolution,
    ) -> Result<Self, PodRejected> {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_string());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let raw_uid = pod.metadata.uid.clone().filter(|u| !u.is_empty());
        let reject = |reason: String| PodRejected {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: raw_uid.clone(),
            reason,
        };
        if name.is_empty() {
            return Err(reject("metadata.name is required".into()));
        }
        let uid = match &raw_uid {
            Some(u) => PodUid::new(u).map_err(|e| reject(e.to_string()))?,
            None => PodUid::derive(&namespace, &name),
        };
        let spec = pod.spec.as_ref();
        let mut seen = HashSet::new();
        for v in spec.and_then(|s| s.volumes.as_ref()).into_iter().flatten() {
            if !seen.insert(v.name.as_str()) {
                return Err(reject(format!("duplicate volume name {:?}", v.name)));
            }
        }
        super::selinux::check_options(pod).map_err(|e| reject(e.to_string()))?;
        let ctx = ResolveContext {
            pod,
            uid: &uid,
            namespace: &namespace,
            name: &name,
            objects,
            payloads,
        };
        let volumes = pod_volumes(pod, &ctx);
        let sc = spec.and_then(|s| s.security_context.as_ref());
        let selinux_label = sc.and_then(|c| c.se_linux_options.as_ref()).map(|o| {
            [&o.user, &o.role, &o.type_, &o.level]
                .iter()
                .map(|p| p.as_deref().unwrap_or(""))
                .collect::<Vec<_>>()
                .join(":")
        });
        let terminated = is_terminated(pod);
        Ok(Self {
            uid,
            namespace,
            name,
            fs_group: sc.and_then(|c| c.fs_group),
            fs_group_change_policy: crate::volume::FsGroupChangePolicy::from_api(
                sc.and_then(|c| c.fs_group_change_policy.as_deref()),
            ),
            supplemental_groups: sc
                .and_then(|c| c.supplemental_groups.clone())
                .unwrap_or_default(),
            selinux_label,
            volumes,
            terminated,
            sub_path_release: SubPathRelease::All,
        })
    }
}

/// The pod's volumes used by a container, each with its source (or why it
/// cannot be used) and its subPath uses.
fn pod_volumes(pod: &Pod, ctx: &ResolveContext<'_>) -> Vec<PodVolume> {
    let used = used_volume_names(pod);
    let mut sub_paths = super::sub_paths::sub_paths_of(pod, ctx.uid);
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let usage = used.usage(&v.name)?;
            let (source, sub_paths) = match sub_paths.remove(&v.name) {
                Some(Err(e)) => (Err(invalid(e.to_string())), Vec::new()),
                // The runtime mounts an image volume, subPaths included.
                Some(Ok(_)) if v.image.is_some() => (parse_source(v, usage, ctx), Vec::new()),
                Some(Ok(list)) => (parse_source(v, usage, ctx), list),
                None => (parse_source(v, usage, ctx), Vec::new()),
            };
            Some(PodVolume {
                name: v.name.clone(),
                selinux: super::selinux::volume_selinux(pod, v, ctx.namespace, ctx.objects),
                source,
                sub_paths,
            })
        })
        .collect()
}

/// The volumes referenced by containers, and how.
#[derive(Debug, Default)]
struct UsedVolumes<'a>(std::collections::HashMap<&'a str, Usage>);

impl UsedVolumes<'_> {
    fn usage(&self, name: &str) -> Option<Usage> {
        self.0.get(name).copied()
    }
}

/// Like the kubelet, only volumes referenced by a container (`volumeMounts` or
/// `volumeDevices` of containers, init containers and ephemeral containers) are
/// mounted.
fn used_volume_names(pod: &Pod) -> UsedVolumes<'_> {
    let Some(spec) = pod.spec.as_ref() else {
        return UsedVolumes::default();
    };
    let lists = spec
        .containers
        .iter()
        .map(|c| (c.volume_mounts.as_ref(), c.volume_devices.as_ref()))
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .map(|c| (c.volume_mounts.as_ref(), c.volume_devices.as_ref())),
        )
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| (c.volume_mounts.as_ref(), c.volume_devices.as_ref())),
        );
    let mut used = UsedVolumes::default();
    for (mounts, devices) in lists {
        for m in mounts.into_iter().flatten() {
            used.0.entry(m.name.as_str()).or_default().mounted = true;
        }
        for d in devices.into_iter().flatten() {
            used.0.entry(d.name.as_str()).or_default().device = true;
        }
    }
    used
}

/// What resolving a pod's volumes needs to know about the pod.
struct ResolveContext<'a> {
    pod: &'a Pod,
    uid: &'a PodUid,
    namespace: &'a str,
    name: &'a str,
    objects: Option<&'a ObjectStore>,
    payloads: PayloadResolution,
}

/// Parses one volume's source, or says why it cannot be used; a CSI
/// volume with what its driver's CSIDriver object adds.
fn parse_source(
    v: &Volume,
    usage: Usage,
    ctx: &ResolveContext<'_>,
) -> Result<VolumeSource, VolumeSpecError> {
    let mut source = parse_plain_source(v, usage, ctx)?;
    if let VolumeSource::Csi(csi) = &mut source {
        let facts = super::csi_driver::PodFacts {
            pod: ctx.pod,
            uid: ctx.uid.as_str(),
            namespace: ctx.namespace,
            name: ctx.name,
        };
        super::csi_driver::apply(csi, &facts, ctx.objects)?;
    }
    Ok(source)
}

/// Parses one volume's source as the pod gives it.
fn parse_plain_source(
    v: &Volume,
    usage: Usage,
    ctx: &ResolveContext<'_>,
) -> Result<VolumeSource, VolumeSpecError> {
    check_volume_name(&v.name).map_err(|e| invalid(e.to_string()))?;
    if let Some(csi) = &v.csi {
        return inline_csi(v, csi, usage, ctx).map(|c| VolumeSource::Csi(Box::new(c)));
    }
    if let Some(migrated) = super::migration::translate_inline(v, ctx.namespace) {
        return migrated_inline(v, migrated, usage, ctx).map(|c| VolumeSource::Csi(Box::new(c)));
    }
    if let Some(pvc) = &v.persistent_volume_claim {
        if let Some(objects) = ctx.objects {
            return super::claim::persistent_volume_claim(
                pvc,
                usage,
                ctx.namespace,
                None,
                objects,
                ctx.payloads,
            );
        }
    }
    // A generic ephemeral volume: the claim `<pod>-<volume>` that the
    // ephemeral volume controller created for (and owned by) this pod.
    if v.ephemeral.is_some() {
        if let Some(objects) = ctx.objects {
            let src = k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                claim_name: format!("{}-{}", ctx.name, v.name),
                read_only: None,
            };
            return super::claim::persistent_volume_claim(
                &src,
                usage,
                ctx.namespace,
                Some(ctx.uid),
                objects,
                ctx.payloads,
            );
        }
    }
    let payload_ctx = super::payload::PayloadContext {
        pod: ctx.pod,
        namespace: ctx.namespace,
        uid: ctx.uid.as_str(),
        objects: ctx.objects,
        payloads: ctx.payloads,
    };
    if let Some(res) = super::payload::payload_source(v, &payload_ctx) {
        return res;
    }
    if let Some(ed) = &v.empty_dir {
        return empty_dir_source(ed).map(|s| size_memory_medium(s, ctx));
    }
    if let Some(hp) = &v.host_path {
        return super::host_path::host_path_source(hp);
    }
    if let Some(image) = &v.image {
        return image_source(image, usage);
    }
    other_source(v)
}

/// `emptyDir`: the medium ("" or "Memory") and the size limit.
fn empty_dir_source(
    ed: &k8s_openapi::api::core::v1::EmptyDirVolumeSource,
) -> Result<VolumeSource, VolumeSpecError> {
    let medium = match ed.medium.as_deref().unwrap_or("") {
        "" => StorageMedium::Default,
        "Memory" => StorageMedium::Memory,
        m => {
            return Err(invalid(format!(
                "emptyDir medium {m:?} is not supported (use \"\" or \"Memory\")"
            )))
        }
    };
    let size_limit = ed
        .size_limit
        .as_ref()
        .map(|q| {
            quantity::parse_bytes(&q.0).map_err(|e| invalid(format!("emptyDir sizeLimit: {e}")))
        })
        .transpose()?
        // As the kubelet: a zero limit is no limit (it adds `size=` only
        // for a positive limit; tmpfs takes `size=0` as unlimited).
        .filter(|&bytes| bytes > 0);
    Ok(VolumeSource::EmptyDir { medium, size_limit })
}

/// A memory-backed emptyDir's tmpfs size: the kubelet's
/// `calculateEmptyDirMemorySize` of the node's allocatable memory, the
/// pod's memory limit and the volume's `sizeLimit`
/// (see [`super::allocatable`]).
fn size_memory_medium(source: VolumeSource, ctx: &ResolveContext<'_>) -> VolumeSource {
    match source {
        VolumeSource::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit,
        } => VolumeSource::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: super::allocatable::empty_dir_memory_size(
                super::allocatable::node_allocatable(ctx.objects, "memory"),
                super::allocatable::pod_memory_limit(ctx.pod),
                size_limit,
            ),
        },
        other => other,
    }
}

/// `image` (KEP-4639): the container runtime mounts it; only a filesystem
/// volume (`volumeMounts`) makes sense.
fn image_source(
    image: &k8s_openapi::api::core::v1::ImageVolumeSource,
    usage: Usage,
) -> Result<VolumeSource, VolumeSpecError> {
    let reference = image.reference.clone().unwrap_or_default();
    if reference.is_empty() {
        return Err(invalid("image.reference is required"));
    }
    if usage.device {
        return Err(invalid(
            "image volumes cannot be in volumeDevices (they are read-only file systems)",
        ));
    }
    Ok(VolumeSource::Image {
        reference,
        pull_policy: image.pull_policy.clone().filter(|p| !p.is_empty()),
    })
}

/// Any other volume: kept whole for a host plugin (C ABI) that may claim it.
fn other_source(v: &Volume) -> Result<VolumeSource, VolumeSpecError> {
    let spec =
        serde_json::to_value(v).map_err(|e| invalid(format!("volume is not serializable: {e}")))?;
    let kind = spec
        .as_object()
        .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        .unwrap_or_else(|| "unknown".to_string());
    Ok(VolumeSource::Other {
        kind,
        spec: Arc::new(spec),
    })
}

/// The kubelet's handle for an inline CSI volume (`makeVolumeHandle`):
/// `"csi-"` + hex SHA-256 of the pod UID followed by the volume name.
pub fn inline_volume_handle(pod_uid: &PodUid, volume: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(pod_uid.as_str().as_bytes());
    h.update(volume.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// Whether `f` holds for one of the volumes `pod`'s containers use.
fn any_used_volume(pod: &Pod, f: impl Fn(&Volume) -> bool) -> bool {
    let used = used_volume_names(pod);
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .filter(|v| used.usage(&v.name).is_some())
        .any(f)
}

/// Whether converting `pod` may read this node's Node object (a used
/// memory-backed `emptyDir`, or a downwardAPI limit: the node's
/// allocatable), so a source that has the Node (the API server, the C ABI)
/// must convert it with its objects and again when the Node changes.
pub fn reads_node(pod: &Pod) -> bool {
    any_used_volume(pod, |v| {
        v.empty_dir
            .as_ref()
            .is_some_and(|e| e.medium.as_deref() == Some("Memory"))
            || super::payload::reads_node(v)
    })
}

/// Whether converting `pod` reads other objects (a used `persistentVolumeClaim`
/// or generic `ephemeral` volume, a `configMap` or `secret` volume or
/// projection, or an inline `csi` volume with a `nodePublishSecretRef`), so a
/// source must re-resolve it when those objects change.
pub fn needs_objects(pod: &Pod) -> bool {
    any_used_volume(pod, |v| {
        v.persistent_volume_claim.is_some()
            || v.ephemeral.is_some()
            // Its driver's CSIDriver object.
            || v.csi.is_some()
            // A migrated in-tree volume: its driver's CSIDriver, its
            // VolumeAttachment, an Azure File secret.
            || super::migration::is_migratable_inline(v)
            || super::payload::reads_objects(v)
            // Its ServiceAccount (the UID its tokens are bound to).
            || v.projected.as_ref().is_some_and(|p| {
                p.sources.iter().flatten().any(|s| s.service_account_token.is_some())
            })
    })
}

/// An inline in-tree cloud volume (`awsElasticBlockStore`, ...) migrated
/// to CSI as the kubelet does (`TranslateInTreeInlineVolumeToCSI`): a
/// persistent, attachable CSI volume of the translated handle, published
/// with the translated access mode; the Azure File secret is read from the
/// pod's namespace as the node stage secret.
fn migrated_inline(
    v: &Volume,
    migrated: Result<super::migration::Migrated, super::migration::TranslateError>,
    usage: Usage,
    ctx: &ResolveContext<'_>,
) -> Result<CsiVolumeSource, VolumeSpecError> {
    let m = migrated.map_err(|e| invalid(format!("volume {:?}: CSI migration: {e}", v.name)))?;
    if usage.device {
        return Err(invalid(format!(
            "volume {:?} is in volumeDevices; an inline {} volume is a filesystem volume",
            v.name, m.in_tree_plugin
        )));
    }
    let access_mode = match m
        .access_modes
        .as_deref()
        .and_then(|a| a.first())
        .map(String::as_str)
    {
        Some("ReadOnlyMany") => CsiAccessMode::MultiNodeReaderOnly,
        Some("ReadWriteMany") => CsiAccessMode::MultiNodeMultiWriter,
        _ => CsiAccessMode::SingleNodeWriter,
    };
    let node_stage_secrets = match (&m.csi.node_stage_secret_ref, ctx.objects) {
        (Some(_), _) if ctx.payloads == PayloadResolution::NamesOnly => None,
        (Some(r), Some(objects)) => {
            let (ns, name) = (
                r.namespace.as_deref().unwrap_or(""),
                r.name.as_deref().unwrap_or(""),
            );
            Some(fetch_secret(objects, ns, name, "azureFile.secretName")?)
        }
        (Some(r), None) => {
            return Err(VolumeSpecError::Unsupported(format!(
            "azureFile.secretName: Secret {:?} cannot be read (this source has no Secret objects)",
            r.name.as_deref().unwrap_or("")
        )))
        }
        (None, _) => None,
    };
    let csi = m.csi;
    Ok(CsiVolumeSource {
        read_only: csi.read_only.unwrap_or(false),
        fs_type: csi.fs_type.filter(|f| !f.is_empty()),
        access_mode,
        volume_attributes: csi.volume_attributes.unwrap_or_default(),
        node_stage_secrets,
        migrated_from: Some(m.in_tree_plugin),
        ..CsiVolumeSource::new(csi.driver, csi.volume_handle)
    })
}

/// `pod.spec.volumes[].csi`: a CSI ephemeral inline volume.
fn inline_csi(
    v: &Volume,
    csi: &k8s_openapi::api::core::v1::CSIVolumeSource,
    usage: Usage,
    ctx: &ResolveContext<'_>,
) -> Result<CsiVolumeSource, VolumeSpecError> {
    if csi.driver.is_empty() {
        return Err(invalid("csi.driver is required"));
    }
    if usage.device {
        return Err(invalid(format!(
            "inline CSI volume {:?} is in volumeDevices; inline CSI volumes are filesystem volumes",
            v.name
        )));
    }
    let node_publish_secrets = match &csi.node_publish_secret_ref {
        None => None,
        // A Secret's content never changes the volume's name.
        Some(_) if ctx.payloads == PayloadResolution::NamesOnly => None,
        Some(r) => {
            let what = "csi.nodePublishSecretRef";
            if r.name.is_empty() {
                return Err(invalid(format!("{what}.name is required")));
            }
            let objects = ctx.objects.ok_or_else(|| {
                VolumeSpecError::Unsupported(format!(
                    "{what}: Secret {}/{} cannot be read (this source has no Secret objects)",
                    ctx.namespace, r.name
                ))
            })?;
            Some(fetch_secret(objects, ctx.namespace, &r.name, what)?)
        }
    };
    Ok(CsiVolumeSource {
        driver: csi.driver.clone(),
        volume_handle: inline_volume_handle(ctx.uid, &v.name),
        ephemeral: true,
        pv_name: None,
        claim_name: None,
        read_only: csi.read_only.unwrap_or(false),
        fs_type: csi.fs_type.clone().filter(|f| !f.is_empty()),
        volume_mode: CsiVolumeMode::Filesystem,
        // The kubelet publishes inline volumes as ReadWriteOnce.
        access_mode: CsiAccessMode::SingleNodeWriter,
        volume_attributes: csi.volume_attributes.clone().unwrap_or_default(),
        mount_options: Vec::new(),
        capacity_bytes: None,
        claim_capacity_bytes: None,
        node_stage_secrets: None,
        node_publish_secrets,
        node_expand_secrets: None,
        supplemental_gid: None,
        driver_info: Default::default(),
        migrated_from: None,
    })
}

/// The kubelet's terminated pod (the one rule, for every source of pods:
/// none of its volumes is needed any more): phase `Succeeded` or `Failed`, or its
/// deletion requested and no container running (every container status
/// terminated or waiting; none reported counts as none running).
pub fn is_terminated(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return true;
    }
    if pod.metadata.deletion_timestamp.is_none() {
        return false;
    }
    let statuses = status.into_iter().flat_map(|s| {
        let lists: [&Option<Vec<ContainerStatus>>; 3] = [
            &s.init_container_statuses,
            &s.container_statuses,
            &s.ephemeral_container_statuses,
        ];
        lists.into_iter().flatten().flatten()
    });
    for c in statuses {
        let state = c.state.as_ref();
        let stopped = state.is_some_and(|s| s.terminated.is_some() || s.waiting.is_some());
        if !stopped {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests;
