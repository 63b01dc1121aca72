//! The status document (`volmgr status --json`): its schema is a user
//! interface (DESIGN.md): fields may be added, never renamed.

use serde::{Deserialize, Serialize};

use crate::metrics::LatencySummary;

/// The whole status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// Reconstruction done, sources populated, one full reconcile since.
    pub synced: bool,
    /// Which tracer keeps the actual state current: `ebpf`, `mountinfo` or `off`.
    pub tracer: String,
    /// Why that tracer (e.g. why eBPF was not used).
    #[serde(default)]
    pub tracer_reason: String,
    /// Pods, sorted by namespace, name and UID.
    pub pods: Vec<PodStatus>,
    /// Inputs that did not even yield a pod.
    pub errors: Vec<SourceError>,
    /// Operation latencies (p50/p99 from hdrhistogram).
    #[serde(default)]
    pub operations: Vec<LatencySummary>,
    /// Registered CSI drivers (`--csi-driver` and plugin registration), by name.
    #[serde(default)]
    pub csi_drivers: Vec<CsiDriverStatus>,
}

/// One registered CSI driver.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CsiDriverStatus {
    /// The driver name.
    pub name: String,
    /// Its CSI socket.
    pub endpoint: String,
    /// The CSI versions it announced at registration (empty for `--csi-driver`).
    pub versions: Vec<String>,
}

/// One pod.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PodStatus {
    /// UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Set when the pod was rejected as a whole.
    pub error: Option<String>,
    /// Its volumes.
    pub volumes: Vec<VolumeStatus>,
}

/// One volume of a pod.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeStatus {
    /// The volume's name in the pod.
    pub name: String,
    /// The plugin (empty if none supports it).
    pub plugin: String,
    /// `pending`, `mounted`, `uncertain`, `unmounting` or `error`.
    pub state: String,
    /// Where it is set up, once known.
    pub path: Option<String>,
    /// Attempts of the current (or last) operation.
    pub attempts: u32,
    /// The last error.
    pub error: Option<String>,
}

/// An input that did not yield a pod.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SourceError {
    /// The source (a manifest file path, `api`, ...).
    pub source: String,
    /// What was wrong.
    pub error: String,
}
