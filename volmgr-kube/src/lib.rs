//! The Kubernetes API server side of the node agent (kube-rs): the client
//! (`--kubeconfig` or in-cluster), the node's pods and the objects they read, the node's CSINode object and CSI
//! annotations, events on pods (and, for observe mode's stuck volumes, the
//! pods' recent events read back), the Node's `status.volumesInUse`, claims'
//! status after node expansion, and service account tokens by TokenRequest.

pub mod attachments;
pub mod backoff;
pub mod claim_status;
pub mod client;
pub mod csinode;
pub mod csinode_read;
pub mod ending_pods;
pub mod events;
pub mod node_status;
mod object_get;
mod object_update;
pub mod pod_events;
pub mod pods;
pub mod problems;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod token;
pub mod transport;
mod trust_bundles;
