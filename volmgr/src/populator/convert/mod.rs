//! Converting a `v1.Pod` into the volumes it needs: the pod itself
//! ([`pod`]), its claims (PVC → PV → CSI, local PVs), CSIDriver behaviours,
//! SELinux mount labels, projected payloads, trust bundles, subPaths and
//! node allocatable. Objects are read through [`ObjectStore`](crate::populator::objects::ObjectStore).

pub(crate) mod allocatable;
pub(crate) mod claim;
pub mod csi_driver;
pub(crate) mod host_path;
pub(crate) mod local_pv;
pub mod migration;
pub mod payload;
pub mod pod;
pub(crate) mod selinux;
pub(crate) mod sub_paths;
pub(crate) mod trust_bundle;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::populator::objects::ObjectStore;
use crate::volume::CsiSecrets;

/// How much of a pod's volumes the conversion resolves from other objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PayloadResolution {
    /// Everything a mount needs: configMap, secret, downwardAPI and
    /// projected volumes into their files and tokens (reading ConfigMaps,
    /// Secrets, ClusterTrustBundles, ServiceAccounts and the Node), and
    /// CSI volumes' Secrets.
    #[default]
    Full,
    /// Only what decides each volume's unique name, plugin and path (observe
    /// mode, which sets nothing up): a payload volume is its kind, with no
    /// files and no tokens, and no ConfigMap, Secret, ClusterTrustBundle or
    /// ServiceAccount is read (nor a CSI volume's Secrets). Claims, volumes
    /// and CSIDrivers are still read: they decide CSI volumes' names.
    NamesOnly,
}

/// A pod's service account (`spec.serviceAccountName`, `default` when
/// unset, as admission sets it).
pub fn pod_service_account(pod: &k8s_openapi::api::core::v1::Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// The UID of ServiceAccount `namespace/name` if `objects` know it (empty
/// otherwise): part of every token request made for it.
pub fn service_account_uid(objects: Option<&ObjectStore>, namespace: &str, name: &str) -> String {
    objects
        .and_then(|o| o.get::<k8s_openapi::api::core::v1::ServiceAccount>(namespace, name))
        .and_then(|sa| sa.metadata.uid.clone())
        .unwrap_or_default()
}

/// Why one volume of a pod cannot be used (the pod's other volumes go on).
/// The message is what status shows; it never quotes a Secret's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeSpecError {
    /// The volume's spec (or an object it names) is invalid: it stays an
    /// error until the pod or that object changes.
    #[error("{0}")]
    Invalid(String),
    /// An object the volume needs is missing, unbound or going away: the
    /// volume waits for it (the source resolves the pod again when it
    /// changes).
    #[error("{0}")]
    Missing(String),
    /// A kind of volume or object this manager does not handle.
    #[error("{0}")]
    Unsupported(String),
    /// The volume's VolumeAttachment reports an attach error (the
    /// attach/detach controller's `status.attachError`): the volume waits
    /// as for a missing object, and the pod gets the kubelet's
    /// `FailedAttachVolume` event rather than `FailedMount`.
    #[error("{0}")]
    AttachFailed(String),
}

/// A [`VolumeSpecError::Invalid`].
pub(crate) fn invalid(msg: impl Into<String>) -> VolumeSpecError {
    VolumeSpecError::Invalid(msg.into())
}

/// How the containers use a volume.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    /// In some container's `volumeMounts`.
    pub(crate) mounted: bool,
    /// In some container's `volumeDevices`.
    pub(crate) device: bool,
}

/// Reads Secret `namespace/name` as the kubelet's `getCredentialsFromSecret`
/// does: every `data` value as a string (plus `stringData`, which an API
/// server would have merged into `data`). Errors never include values.
pub(crate) fn fetch_secret(
    objects: &ObjectStore,
    namespace: &str,
    name: &str,
    what: &str,
) -> Result<Arc<CsiSecrets>, VolumeSpecError> {
    let secret = objects
        .get::<k8s_openapi::api::core::v1::Secret>(namespace, name)
        .ok_or_else(|| {
            VolumeSpecError::Missing(format!("{what}: Secret {namespace}/{name} not found"))
        })?;
    let mut out = BTreeMap::new();
    for (k, v) in secret.data.iter().flatten() {
        let s = String::from_utf8(v.0.clone()).map_err(|_| {
            invalid(format!(
                "{what}: Secret {namespace}/{name} key {k:?} is not valid UTF-8"
            ))
        })?;
        out.insert(k.clone(), s);
    }
    for (k, v) in secret.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone());
    }
    Ok(Arc::new(CsiSecrets(out)))
}
