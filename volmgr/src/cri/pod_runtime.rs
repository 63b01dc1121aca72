//! What still runs of one pod, as the runtime lists it.

/// A pod's containers and sandboxes still running, per the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodRuntimeState {
    /// Containers not exited (created, running, or in an unknown state:
    /// any of them may still use the pod's volumes).
    pub containers: usize,
    /// Sandboxes still ready.
    pub sandboxes: usize,
}

impl PodRuntimeState {
    /// Whether the pod's runtime is gone (the kubelet's
    /// `ShouldPodRuntimeBeRemoved`): nothing of it runs, so its volumes may
    /// be torn down.
    pub fn removed(&self) -> bool {
        self.containers == 0 && self.sandboxes == 0
    }
}

impl std::fmt::Display for PodRuntimeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} container(s) not exited, {} sandbox(es) ready",
            self.containers, self.sandboxes
        )
    }
}
