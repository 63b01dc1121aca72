//! Wiring of CSI into a manager: the kubelet-side plugin on top of the
//! driver clients, their metrics, its volume stats, and retries when a
//! driver registers.

use std::sync::Arc;
use std::time::Duration;

use super::{Error, VolumeManager};
use crate::csi::client::CsiClients;
use crate::csi::registry::DriverRegistry;
use crate::plugins::csi::CsiPlugin;

/// Registers the `kubernetes.io/csi` plugin on `vm`, calling the drivers of
/// `registry` with `timeout` per call: adds `csi_operations_seconds` to the
/// metrics and retries operations waiting for a driver whenever the registry
/// changes. Call from within the tokio runtime, before `start`.
pub fn install(
    vm: &Arc<VolumeManager>,
    registry: Arc<DriverRegistry>,
    timeout: Duration,
) -> Result<Arc<CsiClients>, Error> {
    let mut changes = registry.subscribe();
    let clients = CsiClients::new(Arc::clone(&registry), timeout);
    let plugin = Arc::new(CsiPlugin::new(
        Arc::clone(&vm.root),
        Arc::clone(&clients),
        vm.config.node_name.clone(),
        Arc::clone(&vm.mounter),
    ));
    vm.register_plugin(Arc::clone(&plugin) as Arc<dyn crate::plugins::VolumePlugin>)?;
    // Volume stats: NodeGetVolumeStats, each call within the CSI timeout
    // or 10 s, whichever is smaller.
    vm.stats_provider.set_csi(plugin);
    vm.stats.set_timeout(timeout);
    vm.set_csi_driver_registry(registry);
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
