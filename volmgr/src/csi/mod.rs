//! CSI: drive CSI node plugins over gRPC like the kubelet.

pub mod client;
pub mod errors;
pub mod metrics;
pub mod plugin_watcher;
pub mod proto;
pub mod registry;

use std::sync::Arc;
use std::time::Duration;

use crate::volume_manager::VolumeManager;

/// Registers the `kubernetes.io/csi` plugin on `vm`, calling the drivers of
/// `registry` with `timeout` per call: adds `csi_operations_seconds` to the
/// metrics and retries operations waiting for a driver whenever the registry
/// changes. Call from within the tokio runtime, before `start`.
pub fn install(
    vm: &Arc<VolumeManager>,
    registry: Arc<registry::DriverRegistry>,
    timeout: Duration,
) -> Result<Arc<client::CsiClients>, crate::volume_manager::Error> {
    let mut changes = registry.subscribe();
    let clients = client::CsiClients::new(registry, timeout);
    vm.register_plugin(Arc::new(crate::plugins::csi::CsiPlugin::new(
        Arc::clone(vm.root()),
        Arc::clone(&clients),
        vm.config().node_name.clone(),
        Arc::clone(vm.mounter()),
    )))?;
    let metrics = Arc::clone(clients.metrics());
    vm.add_metrics_source(Arc::new(move || metrics.render()));
    let weak = Arc::downgrade(vm);
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let Some(vm) = weak.upgrade() else { break };
            vm.retry_waiting();
        }
    });
    Ok(clients)
}
