//! The container runtime, as far as volumes care: before a deleted pod's
//! volumes are torn down, its containers must have stopped. The kubelet
//! waits for its pod workers (`ShouldPodRuntimeBeRemoved` in
//! `findAndRemoveDeletedPods`); a volume manager beside the kubelet asks
//! the runtime itself over the CRI (`ListContainers` and `ListPodSandbox`
//! filtered by the kubelet's `io.kubernetes.pod.uid` label).
//!
//! A leaf: it uses nothing of volmgr but `util`.

mod client;
mod pod_runtime;
pub mod proto;

pub use client::{CriError, RuntimeClient, RuntimeEndpoint};
pub use pod_runtime::PodRuntimeState;
