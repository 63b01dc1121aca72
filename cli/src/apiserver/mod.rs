//! The Kubernetes API server side of the node agent (kube-rs): the node's
//! CSINode object and CSI annotations, events on pods, and the Node's
//! `status.volumesInUse`.

pub mod csinode;
pub mod events;
#[cfg(test)]
mod fake;
pub mod node_status;
