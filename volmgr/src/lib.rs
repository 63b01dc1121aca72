//! volmgr: a node-level Kubernetes volume manager.
//!
//! The model follows the kubelet's volumemanager (see `DESIGN.md`): sources
//! feed a [`populator`] that edits the [`cache::desired_state_of_world`]; the
//! [`reconciler`] compares it with the [`cache::actual_state_of_world`] and
//! starts operations on the [`operation_executor`], which calls [`plugins`];
//! [`reconstruct`] rebuilds the actual state at start-up. The
//! [`volume_manager::VolumeManager`] ties it together for the agent and the C ABI.

pub mod agent;
pub mod api;
pub mod cache;
pub mod csi;
pub mod ebpf;
pub mod failpoint;
pub mod metrics;
pub mod operation_executor;
pub mod operation_generator;
pub mod plugins;
pub mod pod;
pub mod populator;
pub mod quantity;
pub mod reconciler;
pub mod reconstruct;
pub mod root_dir;
pub mod status;
pub mod sys;
pub mod tracer;
pub mod volume;
pub mod volume_manager;
pub mod world;
