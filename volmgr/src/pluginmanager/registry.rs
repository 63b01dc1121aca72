//! The CSI driver registry (the kubelet's `csiDrivers` store): which drivers
//! are known on this node and the Unix socket each one listens on. Drivers
//! come from `--csi-driver NAME=SOCKET` or from the plugin watcher's
//! registration handshake; whoever dials a driver subscribes to changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::util::sync::MutexExt;
use tokio::sync::watch;

/// One registered driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    /// The driver name (`GetPluginInfo` name).
    pub name: String,
    /// The driver's CSI socket.
    pub endpoint: PathBuf,
    /// The CSI versions it announced at registration (empty for `--csi-driver`).
    pub versions: Vec<String>,
    /// Its `NodeGetInfo` answer at registration (`None` for `--csi-driver`).
    pub node: Option<NodeInfo>,
}

/// A driver's `NodeGetInfo` answer, as the kubelet's node-info manager
/// keeps it (CSINode, the Node's annotation and labels, the volume limit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The driver's ID of this node (`node_id`, never empty).
    pub node_id: String,
    /// Most volumes of this driver on the node; 0: no limit.
    pub max_volumes_per_node: i64,
    /// The node's topology segments (`accessible_topology`), key → value.
    pub accessible_topology: BTreeMap<String, String>,
}

/// The set of registered CSI drivers, shared by the plugin watcher, the agent
/// flag and the CSI volume plugin.
#[derive(Debug)]
pub struct DriverRegistry {
    drivers: Mutex<Drivers>,
    generation: watch::Sender<u64>,
}

/// The registered drivers, and those given on the command line (which come
/// back when a registration that replaced them goes away).
#[derive(Debug, Default)]
struct Drivers {
    active: BTreeMap<String, DriverInfo>,
    fixed: BTreeMap<String, PathBuf>,
}

impl Drivers {
    /// Removes `name`, falling back to its command-line endpoint if any.
    fn remove(&mut self, name: &str) -> bool {
        let Some(old) = self.active.remove(name) else {
            return false;
        };
        if let Some(endpoint) = self.fixed.get(name) {
            self.active.insert(
                name.to_string(),
                DriverInfo {
                    name: name.to_string(),
                    endpoint: endpoint.clone(),
                    versions: Vec::new(),
                    node: None,
                },
            );
            return old.endpoint != *endpoint;
        }
        true
    }
}

impl DriverRegistry {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            drivers: Mutex::new(Drivers::default()),
            generation: watch::Sender::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Drivers> {
        // A panic while holding the lock cannot leave the map inconsistent
        // (every change is a single insert or remove).
        self.drivers.locked()
    }

    fn bump(&self) {
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Registers (or re-registers, replacing the endpoint) driver `name`.
    /// From `--csi-driver NAME=SOCKET` or a plugin-registration handshake.
    pub fn register(&self, name: &str, endpoint: PathBuf, versions: Vec<String>) {
        self.register_driver(DriverInfo {
            name: name.to_string(),
            endpoint,
            versions,
            node: None,
        });
    }

    /// Registers (or re-registers) a driver with everything known of it:
    /// the plugin watcher's registration, with the `NodeGetInfo` answer.
    pub fn register_driver(&self, info: DriverInfo) {
        tracing::info!(driver = %info.name, endpoint = %info.endpoint.display(), versions = ?info.versions, node = ?info.node, "CSI driver registered");
        self.lock().active.insert(info.name.clone(), info);
        self.bump();
    }

    /// Driver `name`'s `NodeGetInfo` answer, if registered through the
    /// plugin watcher.
    pub fn node_info(&self, name: &str) -> Option<NodeInfo> {
        self.lock().active.get(name).and_then(|i| i.node.clone())
    }

    /// Driver `name`'s node volume limit: its `NodeGetInfo`
    /// `max_volumes_per_node` when above 0. `None` (no limit) for a driver
    /// without that answer (`--csi-driver`) or with 0.
    pub fn max_volumes_per_node(&self, name: &str) -> Option<u64> {
        self.lock()
            .active
            .get(name)
            .and_then(|i| i.node.as_ref())
            .and_then(|n| u64::try_from(n.max_volumes_per_node).ok())
            .filter(|&n| n > 0)
    }

    /// Registers driver `name` at `endpoint` from the command line
    /// (`--csi-driver NAME=SOCKET`): a plugin registration of the same
    /// driver replaces it while it lasts, and when that goes away this
    /// endpoint is used again.
    pub fn register_fixed(&self, name: &str, endpoint: PathBuf) {
        self.lock().fixed.insert(name.to_string(), endpoint.clone());
        self.register(name, endpoint, Vec::new());
    }

    /// Forgets driver `name` (back to its `--csi-driver` endpoint, if any).
    pub fn unregister(&self, name: &str) {
        if self.lock().remove(name) {
            tracing::info!(driver = name, "CSI driver unregistered");
            self.bump();
        }
    }

    /// Forgets driver `name` only if it is still registered at `endpoint`
    /// (like the kubelet's `DeRegisterPlugin`: the removal of an old socket
    /// must not undo a newer registration at another path). Returns whether
    /// it was removed.
    pub fn unregister_endpoint(&self, name: &str, endpoint: &Path) -> bool {
        let removed = {
            let mut d = self.lock();
            if d.active.get(name).is_some_and(|i| i.endpoint == endpoint) {
                d.remove(name)
            } else {
                false
            }
        };
        if removed {
            tracing::info!(driver = name, endpoint = %endpoint.display(), "CSI driver unregistered");
            self.bump();
        }
        removed
    }

    /// The socket of driver `name`, if registered.
    pub fn endpoint(&self, name: &str) -> Option<PathBuf> {
        self.lock().active.get(name).map(|i| i.endpoint.clone())
    }

    /// A receiver of the registry's generation, bumped on every register and
    /// unregister (the CSI plugin re-dials and retries waiting volumes).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Every registered driver and its socket, sorted by name.
    pub fn drivers(&self) -> Vec<(String, PathBuf)> {
        self.lock()
            .active
            .values()
            .map(|i| (i.name.clone(), i.endpoint.clone()))
            .collect()
    }

    /// Every registered driver with its announced versions, sorted by name.
    pub fn driver_infos(&self) -> Vec<DriverInfo> {
        self.lock().active.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_unregister_and_subscribe() {
        let r = DriverRegistry::new();
        let mut rx = r.subscribe();
        assert_eq!(*rx.borrow_and_update(), 0);
        r.register("b.csi", "/s/b.sock".into(), vec!["1.0.0".into()]);
        r.register("a.csi", "/s/a.sock".into(), vec![]);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 2);
        assert_eq!(r.endpoint("a.csi"), Some(PathBuf::from("/s/a.sock")));
        assert_eq!(
            r.drivers(),
            vec![
                ("a.csi".to_string(), PathBuf::from("/s/a.sock")),
                ("b.csi".to_string(), PathBuf::from("/s/b.sock"))
            ]
        );
        // Re-registration at a new path replaces the endpoint; removing the
        // old path does not undo it.
        r.register("b.csi", "/s/b2.sock".into(), vec!["1.0.0".into()]);
        assert!(!r.unregister_endpoint("b.csi", Path::new("/s/b.sock")));
        assert_eq!(r.endpoint("b.csi"), Some(PathBuf::from("/s/b2.sock")));
        assert!(r.unregister_endpoint("b.csi", Path::new("/s/b2.sock")));
        assert_eq!(r.endpoint("b.csi"), None);
        let g = *rx.borrow_and_update();
        r.unregister("nope");
        assert!(!rx.has_changed().unwrap());
        r.unregister("a.csi");
        assert!(rx.has_changed().unwrap());
        assert!(*rx.borrow_and_update() > g);
        assert!(r.drivers().is_empty());
    }

    #[test]
    fn command_line_drivers_come_back() {
        let r = DriverRegistry::new();
        r.register_fixed("d", "/flag.sock".into());
        r.register("d", "/reg.sock".into(), vec!["1.0.0".into()]);
        assert_eq!(r.endpoint("d"), Some(PathBuf::from("/reg.sock")));
        let mut rx = r.subscribe();
        rx.borrow_and_update();
        assert!(r.unregister_endpoint("d", Path::new("/reg.sock")));
        assert!(rx.has_changed().unwrap(), "the endpoint changed");
        assert_eq!(r.endpoint("d"), Some(PathBuf::from("/flag.sock")));
        assert_eq!(r.driver_infos()[0].versions, Vec::<String>::new());
        // Unregistering the command-line endpoint itself changes nothing.
        rx.borrow_and_update();
        r.unregister("d");
        assert_eq!(r.endpoint("d"), Some(PathBuf::from("/flag.sock")));
        assert!(!rx.has_changed().unwrap());
    }
}
