//! Turning a Kubernetes `v1.Pod` into what the desired state needs: identity,
//! security context and the volumes its containers use, each validated.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::quantity;
use crate::volume::{check_volume_name, HostPathType, PodUid, StorageMedium, VolumeSource};

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
    pub source: Result<VolumeSource, String>,
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
    /// `spec.securityContext.supplementalGroups`.
    pub supplemental_groups: Vec<i64>,
    /// `spec.securityContext.seLinuxOptions` as a `user:role:type:level` label.
    pub selinux_label: Option<String>,
    /// The volumes used by at least one container, in spec order.
    pub volumes: Vec<PodVolume>,
    /// The pod has terminated (`status.phase` Succeeded or Failed): its volumes
    /// are no longer needed.
    pub terminated: bool,
}

impl DesiredPod {
    /// Converts and validates a pod.
    pub fn from_pod(pod: &Pod) -> Result<Self, PodRejected> {
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
        let used = used_volume_names(pod);
        let volumes = spec
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
            .filter(|v| used.contains(v.name.as_str()))
            .map(|v| PodVolume {
                name: v.name.clone(),
                source: parse_source(v),
            })
            .collect();
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
            supplemental_groups: sc
                .and_then(|c| c.supplemental_groups.clone())
                .unwrap_or_default(),
            selinux_label,
            volumes,
            terminated,
        })
    }
}

/// Like the kubelet, only volumes referenced by a container (`volumeMounts` or
/// `volumeDevices` of containers, init containers and ephemeral containers) are
/// mounted.
fn used_volume_names(pod: &Pod) -> HashSet<&str> {
    let Some(spec) = pod.spec.as_ref() else {
        return HashSet::new();
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
    let mut used = HashSet::new();
    for (mounts, devices) in lists {
        used.extend(mounts.into_iter().flatten().map(|m| m.name.as_str()));
        used.extend(devices.into_iter().flatten().map(|d| d.name.as_str()));
    }
    used
}

/// Parses one volume's source, or says why it cannot be used.
fn parse_source(v: &Volume) -> Result<VolumeSource, String> {
    check_volume_name(&v.name).map_err(|e| e.to_string())?;
    if let Some(ed) = &v.empty_dir {
        let medium = match ed.medium.as_deref().unwrap_or("") {
            "" => StorageMedium::Default,
            "Memory" => StorageMedium::Memory,
            m => {
                return Err(format!(
                    "emptyDir medium {m:?} is not supported (use \"\" or \"Memory\")"
                ))
            }
        };
        let size_limit = ed
            .size_limit
            .as_ref()
            .map(|q| quantity::parse_bytes(&q.0).map_err(|e| format!("emptyDir sizeLimit: {e}")))
            .transpose()?;
        return Ok(VolumeSource::EmptyDir { medium, size_limit });
    }
    if let Some(hp) = &v.host_path {
        let path = PathBuf::from(&hp.path);
        if !path.is_absolute() {
            return Err(format!("hostPath path {:?} must be absolute", hp.path));
        }
        if hp.path.contains('\0') {
            return Err("hostPath path must not contain NUL".into());
        }
        if path
            .components()
            .any(|c| c == std::path::Component::ParentDir)
        {
            return Err(format!("hostPath path {:?} must not contain '..'", hp.path));
        }
        let t = hp.type_.as_deref().unwrap_or("");
        let kind = HostPathType::parse(t).ok_or_else(|| format!("unknown hostPath type {t:?}"))?;
        return Ok(VolumeSource::HostPath { path, kind });
    }
    let spec = serde_json::to_value(v).map_err(|e| format!("volume is not serializable: {e}"))?;
    let kind = spec
        .as_object()
        .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        .unwrap_or_else(|| "unknown".to_string());
    Ok(VolumeSource::Other {
        kind,
        spec: Arc::new(spec),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
