//! CSI, the node side of the wire: gRPC clients of the drivers' Identity and
//! Node services, the registry of drivers, and the plugin watcher that
//! registers them from `ROOT/plugins_registry`. A leaf: it knows nothing of
//! volumes, pods or the manager; the kubelet-side plugin that uses it is
//! [`crate::plugins::csi`] (the lowercase `crate::plugins` link is by name only).

pub mod csi_call_metrics;
pub mod csi_client;
pub mod csi_proto;
pub mod plugin_watcher;
pub mod registration;
pub mod registry;
