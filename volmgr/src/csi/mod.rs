//! CSI: drive CSI node plugins over gRPC like the kubelet.

pub mod proto;
pub mod registry;
