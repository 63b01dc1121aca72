//! The Kubernetes objects resolving a pod's volumes reads
//! ([`ObjectLookup`]), shared by the pod conversion and the claim
//! resolution (`populator/convert/`).

use std::sync::Arc;

use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

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
