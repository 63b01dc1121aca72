//! Turning a Kubernetes `v1.Pod` into what the desired state needs: identity,
//! security context and the volumes its containers use, each validated.
//!
//! CSI volumes are resolved here too, like the kubelet's desired state of
//! world populator: an inline `csi` volume gets the kubelet's generated volume
//! handle, and a `persistentVolumeClaim` is followed to its bound
//! PersistentVolume's `spec.csi`. The PVC, PV and Secret objects come from an
//! [`ObjectLookup`] (the manifests directory, or an API server cache); a
//! missing or unbound object is an error of that one volume, which goes away
//! when the source re-resolves the pod after the object appears.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Volume};

use super::resolve::{fetch_secret, invalid, Usage};
pub use super::resolve::{ObjectLookup, VolumeSpecError};
use crate::quantity;
use crate::volume::{
    check_volume_name, CsiAccessMode, CsiVolumeMode, CsiVolumeSource, HostPathType, PodUid,
    StorageMedium, SubPath, SubPathRelease, VolumeSource,
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
    /// Why the volume no longer resolves, when it keeps its last good
    /// resolution (an object it needs was deleted while it is mounted).
    pub stale: Option<String>,
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
    /// conversion; a source may narrow it ([`SubPathTiming`](super::SubPathTiming)).
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
    pub fn from_pod_with(
        pod: &Pod,
        objects: Option<&dyn ObjectLookup>,
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
        let ctx = ResolveContext {
            pod,
            uid: &uid,
            namespace: &namespace,
            name: &name,
            objects,
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
        let terminated = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        );
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
                Some(Err(e)) => (Err(invalid(e)), Vec::new()),
                // The runtime mounts an image volume, subPaths included.
                Some(Ok(_)) if v.image.is_some() => (parse_source(v, usage, ctx), Vec::new()),
                Some(Ok(list)) => (parse_source(v, usage, ctx), list),
                None => (parse_source(v, usage, ctx), Vec::new()),
            };
            Some(PodVolume {
                name: v.name.clone(),
                source,
                sub_paths,
                stale: None,
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
    objects: Option<&'a dyn ObjectLookup>,
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
            volume: &v.name,
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
    if let Some(pvc) = &v.persistent_volume_claim {
        if let Some(objects) = ctx.objects {
            return super::claim::persistent_volume_claim(pvc, usage, ctx.namespace, None, objects);
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
            );
        }
    }
    let payload_ctx = super::payload::PayloadContext {
        pod: ctx.pod,
        namespace: ctx.namespace,
        uid: ctx.uid.as_str(),
        objects: ctx.objects,
    };
    if let Some(res) = super::payload::payload_source(v, &payload_ctx) {
        return res;
    }
    if let Some(ed) = &v.empty_dir {
        return empty_dir_source(ed).map(|s| size_memory_medium(s, ctx));
    }
    if let Some(hp) = &v.host_path {
        return host_path_source(hp);
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

/// `hostPath`: an absolute, clean path and a known type.
fn host_path_source(
    hp: &k8s_openapi::api::core::v1::HostPathVolumeSource,
) -> Result<VolumeSource, VolumeSpecError> {
    let path = PathBuf::from(&hp.path);
    if !path.is_absolute() {
        return Err(invalid(format!(
            "hostPath path {:?} must be absolute",
            hp.path
        )));
    }
    if hp.path.contains('\0') {
        return Err(invalid("hostPath path must not contain NUL"));
    }
    if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(invalid(format!(
            "hostPath path {:?} must not contain '..'",
            hp.path
        )));
    }
    let t = hp.type_.as_deref().unwrap_or("");
    let kind =
        HostPathType::parse(t).ok_or_else(|| invalid(format!("unknown hostPath type {t:?}")))?;
    Ok(VolumeSource::HostPath { path, kind })
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
            || super::payload::reads_objects(v)
            // Its ServiceAccount (the UID its tokens are bound to).
            || v.projected.as_ref().is_some_and(|p| {
                p.sources.iter().flatten().any(|s| s.service_account_token.is_some())
            })
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn with_volumes(uid: Option<&str>, volumes: serde_json::Value) -> Pod {
        let names: Vec<_> = volumes
            .as_array()
            .unwrap()
            .iter()
            .map(|v| serde_json::json!({"name": v["name"], "mountPath": format!("/m/{}", v["name"].as_str().unwrap_or("x"))}))
            .collect();
        let mut p = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": names}], "volumes": volumes}
        });
        if let Some(u) = uid {
            p["metadata"]["uid"] = u.into();
        }
        pod(p)
    }

    #[test]
    fn converts_empty_dir_and_host_path() {
        let p = with_volumes(
            Some("u-1"),
            serde_json::json!([
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                {"name": "disk", "emptyDir": {}},
                {"name": "hp", "hostPath": {"path": "/var/log", "type": "Directory"}},
                {"name": "cm", "configMap": {"name": "x"}},
            ]),
        );
        let d = DesiredPod::from_pod(&p).unwrap();
        assert_eq!(d.uid.as_str(), "u-1");
        assert_eq!(d.volumes.len(), 4);
        assert_eq!(
            d.volumes[0].source,
            Ok(VolumeSource::EmptyDir {
                medium: StorageMedium::Memory,
                size_limit: Some(64 << 20)
            })
        );
        assert!(
            matches!(d.volumes[3].source, Ok(VolumeSource::Other { ref kind, .. }) if kind == "configMap")
        );
    }

    #[test]
    fn derives_a_stable_uid() {
        let a = DesiredPod::from_pod(&with_volumes(None, serde_json::json!([]))).unwrap();
        let b = DesiredPod::from_pod(&with_volumes(None, serde_json::json!([]))).unwrap();
        assert_eq!(a.uid, b.uid);
        assert_eq!(a.uid.as_str().len(), 36);
        assert_ne!(a.uid, PodUid::derive("ns", "q"));
        assert_ne!(PodUid::derive("a", "bc"), PodUid::derive("ab", "c"));
    }

    #[test]
    fn rejects_bad_uids_and_duplicates() {
        for bad in ["../x", "a/b", "..", "a\0b"] {
            let e =
                DesiredPod::from_pod(&with_volumes(Some(bad), serde_json::json!([]))).unwrap_err();
            assert!(e.reason.contains("invalid pod UID"), "{e}");
        }
        let e = DesiredPod::from_pod(&with_volumes(
            Some("u"),
            serde_json::json!([{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]),
        ))
        .unwrap_err();
        assert!(e.reason.contains("duplicate volume name"));
    }

    #[test]
    fn volume_level_errors() {
        let d = DesiredPod::from_pod(&with_volumes(
            Some("u"),
            serde_json::json!([
                {"name": "../x", "emptyDir": {}},
                {"name": "rel", "hostPath": {"path": "var/log"}},
                {"name": "dots", "hostPath": {"path": "/var/../etc"}},
                {"name": "typ", "hostPath": {"path": "/x", "type": "Bogus"}},
                {"name": "size", "emptyDir": {"sizeLimit": "lots"}},
                {"name": "med", "emptyDir": {"medium": "Tape"}},
            ]),
        ))
        .unwrap();
        for v in &d.volumes {
            assert!(v.source.is_err(), "{}", v.name);
        }
    }

    #[test]
    fn unused_volumes_are_ignored_and_terminated_pods_flagged() {
        let mut p = with_volumes(
            Some("u"),
            serde_json::json!([{"name": "a", "emptyDir": {}}]),
        );
        p.spec.as_mut().unwrap().volumes.as_mut().unwrap().push(
            serde_json::from_value(serde_json::json!({"name": "unused", "emptyDir": {}})).unwrap(),
        );
        p.status = Some(serde_json::from_value(serde_json::json!({"phase": "Succeeded"})).unwrap());
        let d = DesiredPod::from_pod(&p).unwrap();
        assert_eq!(d.volumes.len(), 1);
        assert!(d.terminated);
    }

    /// sha256("uid-1" + "vol"), computed independently.
    const HANDLE_UID1_VOL: &str =
        "csi-67efd08187334bc4caecc2244debc613d2dae49b3b82338caf725c10f4e8a821";

    /// An in-memory [`ObjectLookup`] for the resolution tests.
    #[derive(Default)]
    struct Objects {
        pvcs: Vec<PersistentVolumeClaim>,
        pvs: Vec<PersistentVolume>,
        secrets: Vec<Secret>,
        node: Option<k8s_openapi::api::core::v1::Node>,
    }

    fn is(
        m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        ns: &str,
        n: &str,
    ) -> bool {
        m.namespace.as_deref().unwrap_or("default") == ns && m.name.as_deref() == Some(n)
    }

    impl ObjectLookup for Objects {
        fn persistent_volume_claim(&self, ns: &str, n: &str) -> Option<Arc<PersistentVolumeClaim>> {
            self.pvcs
                .iter()
                .find(|p| is(&p.metadata, ns, n))
                .cloned()
                .map(Arc::new)
        }
        fn persistent_volume(&self, n: &str) -> Option<Arc<PersistentVolume>> {
            self.pvs
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(n))
                .cloned()
                .map(Arc::new)
        }
        fn persistent_volume_for_claim(&self, ns: &str, n: &str) -> Option<Arc<PersistentVolume>> {
            self.pvs
                .iter()
                .find(|p| {
                    p.spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .is_some_and(|r| {
                            r.namespace.as_deref() == Some(ns) && r.name.as_deref() == Some(n)
                        })
                })
                .cloned()
                .map(Arc::new)
        }
        fn secret(&self, ns: &str, n: &str) -> Option<Arc<Secret>> {
            self.secrets
                .iter()
                .find(|s| is(&s.metadata, ns, n))
                .cloned()
                .map(Arc::new)
        }
        fn node(&self) -> Option<Arc<k8s_openapi::api::core::v1::Node>> {
            self.node.clone().map(Arc::new)
        }
    }

    #[test]
    fn image_volumes_need_a_reference() {
        let p = with_volumes(
            Some("u-1"),
            serde_json::json!([
                {"name": "img", "image": {"reference": "quay.io/x/y:v1", "pullPolicy": "Always"}},
                {"name": "bad", "image": {}},
            ]),
        );
        let d = DesiredPod::from_pod(&p).unwrap();
        assert_eq!(
            d.volumes[0].source,
            Ok(VolumeSource::Image {
                reference: "quay.io/x/y:v1".into(),
                pull_policy: Some("Always".into())
            })
        );
        let e = d.volumes[1].source.clone().unwrap_err().to_string();
        assert!(e.contains("image.reference is required"), "{e}");
    }

    #[test]
    fn local_persistent_volumes_resolve_to_a_local_source() {
        let local = |path: &str| serde_json::json!({"csi": null, "local": {"path": path, "fsType": "ext4"}});
        let mut o = Objects::default();
        o.pvcs.push(pvc("claim", Some("pv-local")));
        o.pvs
            .push(pv("pv-local", Some("claim"), local("/mnt/disks/a")));
        let mut p = pvc_pod("claim", false);
        let r = resolve(&p, &o);
        assert_eq!(
            r,
            Ok(VolumeSource::Local(crate::volume::LocalVolumeSource {
                pv_name: "pv-local".into(),
                path: "/mnt/disks/a".into(),
                read_only: false,
                volume_mode: CsiVolumeMode::Filesystem,
            }))
        );
        // The pod's readOnly makes it read-only.
        p.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0]
            .persistent_volume_claim
            .as_mut()
            .unwrap()
            .read_only = Some(true);
        assert!(matches!(resolve(&p, &o), Ok(VolumeSource::Local(l)) if l.read_only));
        // Block mode, used as a device.
        o.pvs[0] = pv(
            "pv-local",
            Some("claim"),
            serde_json::json!({"csi": null, "local": {"path": "/dev/sdb"}, "volumeMode": "Block"}),
        );
        let r = resolve(&pvc_pod("claim", true), &o);
        assert!(matches!(r, Ok(VolumeSource::Local(l)) if l.volume_mode == CsiVolumeMode::Block));
        // Unclean paths are refused.
        o.pvs[0] = pv("pv-local", Some("claim"), local("/mnt/../etc"));
        let e = resolve(&pvc_pod("claim", false), &o).unwrap_err();
        assert!(e.contains("spec.local.path") && e.contains(".."), "{e}");
        // Node affinity, when the node is known.
        let mut with_affinity = local("/mnt/disks/a");
        with_affinity["nodeAffinity"] = serde_json::json!({"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}});
        o.pvs[0] = pv("pv-local", Some("claim"), with_affinity);
        assert!(
            resolve(&pvc_pod("claim", false), &o).is_ok(),
            "no node known: not checked"
        );
        o.node = Some(
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n2", "labels": {"kubernetes.io/hostname": "n2"}}}))
                .unwrap(),
        );
        let e = resolve(&pvc_pod("claim", false), &o).unwrap_err();
        assert!(
            e.contains("node affinity does not match node \"n2\""),
            "{e}"
        );
    }

    fn pvc(name: &str, volume_name: Option<&str>) -> PersistentVolumeClaim {
        let mut v = serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": "pvc-uid"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        });
        if let Some(n) = volume_name {
            v["spec"]["volumeName"] = n.into();
        }
        serde_json::from_value(v).unwrap()
    }

    fn pv(name: &str, claim: Option<&str>, extra: serde_json::Value) -> PersistentVolume {
        let mut v = serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "64Mi"},
                "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                "csi": {"driver": "test.csi.volmgr.io", "volumeHandle": "vol-1"},
            }
        });
        if let Some(c) = claim {
            v["spec"]["claimRef"] = serde_json::json!({"namespace": "ns", "name": c});
        }
        merge(&mut v["spec"], extra);
        serde_json::from_value(v).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn secret(name: &str, data: serde_json::Value) -> Secret {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "ns"}, "data": data
        }))
        .unwrap()
    }

    fn pvc_pod(claim: &str, device: bool) -> Pod {
        let use_ = if device {
            serde_json::json!({"volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]})
        } else {
            serde_json::json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]})
        };
        let mut c = serde_json::json!({"name": "c", "image": "i"});
        merge(&mut c, use_);
        pod(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
            "spec": {"containers": [c], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}
        }))
    }

    fn resolve(p: &Pod, o: &Objects) -> Result<VolumeSource, String> {
        let d = DesiredPod::from_pod_with(p, Some(o)).unwrap();
        assert_eq!(d.volumes.len(), 1);
        d.volumes[0].source.clone().map_err(|e| e.to_string())
    }

    fn csi_of(r: Result<VolumeSource, String>) -> CsiVolumeSource {
        match r {
            Ok(VolumeSource::Csi(c)) => *c,
            other => panic!("not a CSI source: {other:?}"),
        }
    }

    #[test]
    fn inline_csi_volume() {
        let p = with_volumes(
            Some("uid-1"),
            serde_json::json!([{"name": "vol", "csi": {
                "driver": "test.csi.volmgr.io", "readOnly": true, "fsType": "ext4",
                "volumeAttributes": {"size": "64Mi"}}}]),
        );
        let c = csi_of(
            DesiredPod::from_pod(&p).unwrap().volumes[0]
                .source
                .clone()
                .map_err(|e| e.to_string()),
        );
        assert_eq!(c.volume_handle, HANDLE_UID1_VOL);
        assert!(c.ephemeral && c.read_only);
        assert_eq!(c.pv_name, None);
        assert_eq!(c.fs_type.as_deref(), Some("ext4"));
        assert_eq!(c.volume_mode, CsiVolumeMode::Filesystem);
        assert_eq!(c.access_mode, CsiAccessMode::SingleNodeWriter);
        assert_eq!(c.volume_attributes["size"], "64Mi");
        assert!(c.node_publish_secrets.is_none());

        // A publish secret from the pod's namespace.
        let p = with_volumes(
            Some("uid-1"),
            serde_json::json!([{"name": "vol", "csi": {
                "driver": "d", "nodePublishSecretRef": {"name": "creds"}}}]),
        );
        let e = DesiredPod::from_pod(&p).unwrap().volumes[0]
            .source
            .clone()
            .unwrap_err()
            .to_string();
        assert!(e.contains("Secret ns/creds cannot be read"), "{e}");
        let mut o = Objects::default();
        let e = resolve(&p, &o).unwrap_err();
        assert!(e.contains("Secret ns/creds not found"), "{e}");
        o.secrets.push(secret(
            "creds",
            serde_json::json!({"password": "aHVudGVyMg=="}),
        ));
        let c = csi_of(resolve(&p, &o));
        let s = c.node_publish_secrets.unwrap();
        assert_eq!(s.0["password"], "hunter2");
    }

    #[test]
    fn inline_csi_errors() {
        let d = DesiredPod::from_pod(&with_volumes(
            Some("u"),
            serde_json::json!([
                {"name": "nodriver", "csi": {"driver": ""}},
                {"name": "noref", "csi": {"driver": "d", "nodePublishSecretRef": {"name": ""}}},
            ]),
        ))
        .unwrap();
        assert!(d.volumes[0]
            .source
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("csi.driver is required"));
        assert!(d.volumes[1]
            .source
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("name is required"));
        let p = pod(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "i",
                "volumeDevices": [{"name": "v", "devicePath": "/dev/x"}]}],
                "volumes": [{"name": "v", "csi": {"driver": "d"}}]}
        }));
        let e = DesiredPod::from_pod(&p).unwrap().volumes[0]
            .source
            .clone()
            .unwrap_err()
            .to_string();
        assert!(e.contains("volumeDevices"), "{e}");
    }

    #[test]
    fn pvc_to_csi_persistent_volume() {
        let mut o = Objects::default();
        o.pvcs.push(pvc("claim", Some("pv-1")));
        o.pvs.push(pv(
            "pv-1",
            Some("claim"),
            serde_json::json!({
                "mountOptions": ["noatime"],
                "csi": {
                    "fsType": "ext4", "readOnly": false,
                    "volumeAttributes": {"size": "64Mi"},
                    "nodeStageSecretRef": {"name": "stage", "namespace": "ns"},
                    "nodePublishSecretRef": {"name": "publish", "namespace": "ns"},
                    "nodeExpandSecretRef": {"name": "expand", "namespace": "ns"},
                }
            }),
        ));
        for n in ["stage", "publish", "expand"] {
            o.secrets
                .push(secret(n, serde_json::json!({"key": "dmFsdWU="})));
        }
        let c = csi_of(resolve(&pvc_pod("claim", false), &o));
        assert_eq!(c.driver, "test.csi.volmgr.io");
        assert_eq!(c.volume_handle, "vol-1");
        assert!(!c.ephemeral && !c.read_only);
        assert_eq!(c.pv_name.as_deref(), Some("pv-1"));
        assert_eq!(c.fs_type.as_deref(), Some("ext4"));
        assert_eq!(c.volume_mode, CsiVolumeMode::Filesystem);
        // The first access mode, like the kubelet.
        assert_eq!(c.access_mode, CsiAccessMode::MultiNodeMultiWriter);
        assert_eq!(c.mount_options, vec!["noatime".to_string()]);
        assert_eq!(c.capacity_bytes, Some(64 << 20));
        assert_eq!(c.claim_capacity_bytes, None, "a claim without a status");
        assert_eq!(c.volume_attributes["size"], "64Mi");
        for s in [
            &c.node_stage_secrets,
            &c.node_publish_secrets,
            &c.node_expand_secrets,
        ] {
            assert_eq!(s.as_ref().unwrap().0["key"], "value");
        }
        // The claim's status.capacity: the size its file system has.
        let mut claim = pvc("claim", Some("pv-1"));
        claim.status = Some(
            serde_json::from_value(serde_json::json!({"capacity": {"storage": "32Mi"}})).unwrap(),
        );
        o.pvcs = vec![claim];
        let c = csi_of(resolve(&pvc_pod("claim", false), &o));
        assert_eq!(c.claim_capacity_bytes, Some(32 << 20));
        // Debug of the whole pod never shows a secret value.
        let d = DesiredPod::from_pod_with(&pvc_pod("claim", false), Some(&o)).unwrap();
        assert!(!format!("{d:?}").contains("value\""), "{d:?}");

        // The pod's readOnly makes the volume read-only.
        let mut p = pvc_pod("claim", false);
        p.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0]
            .persistent_volume_claim
            .as_mut()
            .unwrap()
            .read_only = Some(true);
        assert!(csi_of(resolve(&p, &o)).read_only);

        // Without objects, a PVC is left to host plugins.
        let d = DesiredPod::from_pod(&pvc_pod("claim", false)).unwrap();
        assert!(
            matches!(&d.volumes[0].source, Ok(VolumeSource::Other { kind, .. }) if kind == "persistentVolumeClaim")
        );
    }

    #[test]
    fn pvc_bound_through_claim_ref_and_block_mode() {
        let mut o = Objects::default();
        o.pvcs.push(pvc("claim", None));
        o.pvs.push(pv(
            "pv-b",
            Some("claim"),
            serde_json::json!({"volumeMode": "Block", "accessModes": ["ReadWriteOncePod"]}),
        ));
        let c = csi_of(resolve(&pvc_pod("claim", true), &o));
        assert_eq!(c.pv_name.as_deref(), Some("pv-b"));
        assert_eq!(c.volume_mode, CsiVolumeMode::Block);
        assert_eq!(c.access_mode, CsiAccessMode::SingleNodeSingleWriter);
        let e = resolve(&pvc_pod("claim", false), &o).unwrap_err();
        assert!(
            e.contains("volumeMode Block, but the volume is in volumeMounts"),
            "{e}"
        );
    }

    #[test]
    fn the_pv_gid_annotation_is_carried_when_it_parses() {
        let with_gid = |gid: Option<&str>| {
            let mut o = Objects::default();
            o.pvcs.push(pvc("claim", Some("pv-g")));
            let mut v = pv("pv-g", Some("claim"), serde_json::json!({}));
            if let Some(g) = gid {
                v.metadata.annotations = Some(
                    [(
                        super::super::claim::VOLUME_GID_ANNOTATION.to_string(),
                        g.to_string(),
                    )]
                    .into_iter()
                    .collect(),
                );
            }
            o.pvs.push(v);
            csi_of(resolve(&pvc_pod("claim", false), &o)).supplemental_gid
        };
        assert_eq!(with_gid(Some("1234")), Some(1234));
        assert_eq!(with_gid(Some("not-a-number")), None);
        assert_eq!(with_gid(None), None);
    }

    #[test]
    fn pvc_resolution_errors() {
        let p = pvc_pod("claim", false);
        let check = |o: &Objects, want: &str| {
            let e = resolve(&p, o).unwrap_err();
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        };
        let mut o = Objects::default();
        check(&o, "PersistentVolumeClaim ns/claim not found");
        o.pvcs.push(pvc("claim", None));
        check(&o, "PersistentVolumeClaim ns/claim is not bound");
        o.pvcs[0] = pvc("claim", Some("pv-1"));
        check(
            &o,
            "PersistentVolume pv-1 (bound to PersistentVolumeClaim ns/claim) not found",
        );
        o.pvs.push(pv("pv-1", Some("other"), serde_json::json!({})));
        check(
            &o,
            "PersistentVolume pv-1 is bound to claim ns/other, not to ns/claim",
        );
        o.pvs[0] = pv("pv-1", Some("claim"), serde_json::json!({}));
        o.pvs[0]
            .spec
            .as_mut()
            .unwrap()
            .claim_ref
            .as_mut()
            .unwrap()
            .uid = Some("someone-else".into());
        check(&o, "is bound to claim ns/claim, not to ns/claim");
        o.pvs[0] = pv(
            "pv-1",
            None,
            serde_json::json!({"csi": null, "hostPath": {"path": "/x"}}),
        );
        check(
            &o,
            "PersistentVolume pv-1 is not a CSI volume (source hostPath)",
        );
        for (extra, want) in [
            (
                serde_json::json!({"csi": {"driver": ""}}),
                "spec.csi.driver is required",
            ),
            (
                serde_json::json!({"csi": {"volumeHandle": ""}}),
                "spec.csi.volumeHandle is required",
            ),
            (
                serde_json::json!({"volumeMode": "Tape"}),
                "unknown volumeMode \"Tape\"",
            ),
            (
                serde_json::json!({"volumeMode": "Block"}),
                "volumeMode Block, but the volume is in volumeMounts",
            ),
            (
                serde_json::json!({"accessModes": ["ReadSometimes"]}),
                "unknown access mode",
            ),
            (
                serde_json::json!({"capacity": {"storage": "lots"}}),
                "capacity.storage",
            ),
            (
                serde_json::json!({"csi": {"nodeStageSecretRef": {"name": "s"}}}),
                "nodeStageSecretRef: name and namespace are required",
            ),
            (
                serde_json::json!({"csi": {"nodeExpandSecretRef": {"name": "s", "namespace": "ns"}}}),
                "spec.csi.nodeExpandSecretRef: Secret ns/s not found",
            ),
        ] {
            o.pvs[0] = pv("pv-1", None, extra);
            check(&o, want);
        }
        o.pvs[0] = pv(
            "pv-1",
            None,
            serde_json::json!({"csi": {"nodePublishSecretRef": {"name": "s", "namespace": "ns"}}}),
        );
        o.secrets
            .push(secret("s", serde_json::json!({"k": "/w=="})));
        check(&o, "key \"k\" is not valid UTF-8");
        o.pvs[0] = pv(
            "pv-1",
            None,
            serde_json::json!({"volumeMode": "Filesystem"}),
        );
        let e = resolve(&pvc_pod("claim", true), &o).unwrap_err();
        assert!(
            e.contains("volumeMode Filesystem, but the volume is in volumeDevices"),
            "{e}"
        );
        let mut lost = pvc("claim", Some("pv-1"));
        lost.status = Some(serde_json::from_value(serde_json::json!({"phase": "Lost"})).unwrap());
        o.pvcs[0] = lost;
        check(&o, "phase Lost");
        let mut deleted = pvc("claim", Some("pv-1"));
        deleted.metadata.deletion_timestamp =
            Some(serde_json::from_value(serde_json::json!("2024-01-01T00:00:00Z")).unwrap());
        o.pvcs[0] = deleted;
        check(&o, "is being deleted");
        let p2 = pvc_pod("", false);
        let e = resolve(&p2, &o).unwrap_err();
        assert!(e.contains("claimName is required"), "{e}");
    }

    #[test]
    fn generic_ephemeral_volume_uses_the_pods_own_claim() {
        let p = pod(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
            "spec": {
                "containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "scratch", "mountPath": "/s"}]}],
                "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}]
            }
        }));
        assert!(needs_objects(&p));
        let mut o = Objects::default();
        let e = resolve(&p, &o).unwrap_err();
        assert!(
            e.contains("PersistentVolumeClaim ns/p-scratch not found"),
            "{e}"
        );
        let owned = |uid: &str| {
            let mut c = pvc("p-scratch", Some("pv-e"));
            c.metadata.owner_references = Some(vec![serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Pod", "name": "p", "uid": uid, "controller": true
            }))
            .unwrap()]);
            c
        };
        o.pvcs.push(owned("someone-else"));
        o.pvs
            .push(pv("pv-e", Some("p-scratch"), serde_json::json!({})));
        let e = resolve(&p, &o).unwrap_err();
        assert!(e.contains("was not created for this pod"), "{e}");
        o.pvcs[0] = owned("uid-1");
        let c = csi_of(resolve(&p, &o));
        assert_eq!(c.pv_name.as_deref(), Some("pv-e"));
        assert!(!c.ephemeral, "a PV-backed volume, shared by handle");
        // Without objects it stays for host plugins.
        let d = DesiredPod::from_pod(&p).unwrap();
        assert!(
            matches!(&d.volumes[0].source, Ok(VolumeSource::Other { kind, .. }) if kind == "ephemeral")
        );
    }

    #[test]
    fn needs_objects_only_for_pvcs_csi_and_secret_refs() {
        assert!(needs_objects(&pvc_pod("c", false)));
        assert!(!needs_objects(&with_volumes(
            Some("u"),
            serde_json::json!([{"name": "a", "emptyDir": {}}])
        )));
        // An inline CSI volume reads its driver's CSIDriver object.
        assert!(needs_objects(&with_volumes(
            Some("u"),
            serde_json::json!([{"name": "b", "csi": {"driver": "d"}}])
        )));
        assert!(needs_objects(&with_volumes(
            Some("u"),
            serde_json::json!([{"name": "b", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s"}}}])
        )));
    }

    #[test]
    fn a_zero_size_limit_is_no_limit() {
        for zero in ["0", "0Mi", "0.0"] {
            let ed = k8s_openapi::api::core::v1::EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                    zero.into(),
                )),
                ..Default::default()
            };
            assert_eq!(
                empty_dir_source(&ed).unwrap(),
                VolumeSource::EmptyDir {
                    medium: StorageMedium::Memory,
                    size_limit: None
                },
                "{zero}"
            );
        }
    }
}
