//! volmgr: a node-level Kubernetes volume manager.
//!
//! The model and the names follow the kubelet's volumemanager; the layers
//! only point down (`docs/ARCHITECTURE.md`, checked by `volmgr/tests/code_shape.rs`):
//!
//! ```text
//! observer           observe mode: read-only reconstruction vs desired state → findings
//! volumemanager      the kubelet's VolumeManager methods: a thin facade
//! populator          sources (manifests directory) + pod → desired volumes (PVC→PV→CSI)
//! reconciler         reconcile phases, resync, start-up reconstruction
//! operationexecutor  one operation per volume at a time, backoff, the operation bodies
//! tracer             eBPF / mountinfo observers: write the actual state, never mount
//! plugins            emptyDir, hostPath, CSI (kubelet side)
//! csi                gRPC clients, driver registry, plugin watcher (a leaf)
//! cri                the container runtime's view of a pod (a leaf)
//! cache              desired and actual states of world, out-of-band log
//! sys                every syscall behind a seam; root_dir, the only door to ROOT
//! base               volume names and specs, quantities, metrics, status schema, ebpf loader, util
//! ```

pub mod cache;
pub mod cri;
pub mod ebpf;
pub mod failpoint;
pub mod metrics;
pub mod observer;
pub mod operationexecutor;
pub mod pluginmanager;
pub mod plugins;
pub mod populator;
pub mod quantity;
pub mod reconciler;
pub mod status;
pub mod sys;
pub mod tracer;
pub mod util;
pub mod volume;
pub mod volumemanager;
