//! What resolving a pod's volumes works with: the Kubernetes objects it
//! reads ([`ObjectLookup`], and Secrets as the kubelet reads them), how the
//! containers use a volume ([`Usage`]), and why a volume cannot be used
//! ([`VolumeSpecError`]). Shared by the pod conversion (`pod.rs`) and the
//! claim resolution (`claim.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

use crate::volume::CsiSecrets;

/// The Kubernetes objects a pod's volumes refer to: what the kubelet reads
/// from the API server while populating the desired state. Implemented by
/// the manifests source (objects found in the manifests directory) and by an
/// API server cache.
pub trait ObjectLookup {
    /// PersistentVolumeClaim `namespace/name`.
    fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<PersistentVolumeClaim>>;
    /// PersistentVolume `name`.
    fn persistent_volume(&self, name: &str) -> Option<Arc<PersistentVolume>>;
    /// The PersistentVolume whose `spec.claimRef` names claim
    /// `namespace/name` (for a claim without `spec.volumeName`).
    fn persistent_volume_for_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<PersistentVolume>>;
    /// Secret `namespace/name`.
    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>>;
    /// ConfigMap `namespace/name` (configMap and projected volumes).
    /// Default: none (a source without ConfigMaps).
    fn config_map(&self, _namespace: &str, _name: &str) -> Option<Arc<ConfigMap>> {
        None
    }
    /// CSIDriver `name` (a CSI driver's behaviours). Default: none.
    fn csi_driver(&self, _name: &str) -> Option<Arc<CSIDriver>> {
        None
    }
    /// VolumeAttachment `name` (an attachable CSI volume's attachment to
    /// this node). Default: none.
    fn volume_attachment(&self, _name: &str) -> Option<Arc<VolumeAttachment>> {
        None
    }
    /// This node's name, when the source follows its Node object (the API
    /// source, a C ABI caller that names its node). Default: none.
    fn node_name(&self) -> Option<&str> {
        None
    }
    /// This node, for the node affinity of local PersistentVolumes. `None`
    /// (the default, and the manifests source) when the source does not
    /// know it: the check is then skipped.
    fn node(&self) -> Option<Arc<Node>> {
        None
    }
    /// ServiceAccount `namespace/name`, the account a pod's tokens are
    /// requested for. Only its UID is used: a token request names it, so an
    /// account deleted and created again (whose old bound tokens the API
    /// server rejects) gets the pod fresh tokens at once. `None` (the
    /// default) when unknown: tokens are requested all the same.
    fn service_account(&self, _namespace: &str, _name: &str) -> Option<Arc<ServiceAccount>> {
        None
    }
    /// ClusterTrustBundle `name` (a projected `clusterTrustBundle` source by
    /// name). Default: none.
    fn cluster_trust_bundle(&self, _name: &str) -> Option<Arc<ClusterTrustBundle>> {
        None
    }
    /// Every ClusterTrustBundle of signer `signer`, by name (a projected
    /// `clusterTrustBundle` source by signer and labels). Default: none.
    fn cluster_trust_bundles_of_signer(&self, _signer: &str) -> Vec<Arc<ClusterTrustBundle>> {
        Vec::new()
    }
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
pub fn service_account_uid(
    objects: Option<&dyn ObjectLookup>,
    namespace: &str,
    name: &str,
) -> String {
    objects
        .and_then(|o| o.service_account(namespace, name))
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
    objects: &dyn ObjectLookup,
    namespace: &str,
    name: &str,
    what: &str,
) -> Result<Arc<CsiSecrets>, VolumeSpecError> {
    let secret = objects.secret(namespace, name).ok_or_else(|| {
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
