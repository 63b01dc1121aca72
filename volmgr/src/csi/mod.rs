//! CSI: drive CSI node plugins over gRPC like the kubelet.

pub mod client;
pub mod errors;
pub mod metrics;
pub mod proto;
pub mod registry;
