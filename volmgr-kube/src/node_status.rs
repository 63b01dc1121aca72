//! The volume manager's share of the Node's status, as the kubelet keeps
//! it (`setters.VolumesInUse`, `MarkVolumesAsReportedInUse`,
//! `VerifyControllerAttachedVolume`):
//!
//! - with `--report-volumes-in-use`, `status.volumesInUse` of this node
//!   lists the unique names of the attachable volumes in use
//!   ([`VolumeManager::volumes_in_use`]: CSI volumes from a
//!   PersistentVolume, from the moment they are wanted until they are
//!   unmounted), then told to the manager
//!   (`mark_volumes_as_reported_in_use`): the attach/detach controller does
//!   not detach a volume the node lists, and the manager sets up an
//!   attachable volume only once it is listed. It is written only once the
//!   manager's states have synced (the kubelet's `VolumesInUse` setter
//!   waits for `ReconcilerStatesHasBeenSynced`): before, the volumes an
//!   earlier run left mounted may not be known yet, and a list without them
//!   would let the controller detach them under a running pod; the Node
//!   keeps the earlier run's list meanwhile. Then it is patched at once
//!   (a stale list goes) and again whenever the set changes;
//! - the Node's `status.volumesAttached` is read (from the patch's answer,
//!   at every period, and every `attach_poll` while a volume in use is not
//!   listed) and handed to the manager (`mark_volumes_attached`), which
//!   with `Config::wait_for_volumes_attached` sets up an attachable volume
//!   only once the controller attached it.
//!
//! The patch is a JSON merge patch (`application/merge-patch+json`) of the
//! `status` subresource: `volumesInUse` has no patch strategy, so a merge
//! patch and the kubelet's strategic merge patch both replace the whole
//! list; the merge patch needs no schema and, with `null`, removes it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use volmgr::util::backoff::Backoff;
use volmgr::volume::UniqueVolumeName;
use volmgr::volumemanager::VolumeManager;

/// What the reporter needs of the volume manager (the seam the tests fake).
pub trait NodeVolumes: Send + Sync {
    /// The kubelet's `ReconcilerStatesHasBeenSynced`.
    fn reconciler_states_synced(&self) -> bool;
    /// The kubelet's `GetVolumesInUse`: attachable volumes in use, sorted.
    fn volumes_in_use(&self) -> Vec<UniqueVolumeName>;
    /// The kubelet's `MarkVolumesAsReportedInUse`.
    fn mark_volumes_as_reported_in_use(&self, names: Vec<UniqueVolumeName>);
    /// The Node's `status.volumesAttached` names, as just read.
    fn mark_volumes_attached(&self, names: Vec<UniqueVolumeName>);
}

impl NodeVolumes for VolumeManager {
    fn reconciler_states_synced(&self) -> bool {
        VolumeManager::reconciler_states_synced(self)
    }
    fn volumes_in_use(&self) -> Vec<UniqueVolumeName> {
        VolumeManager::volumes_in_use(self)
    }
    fn mark_volumes_as_reported_in_use(&self, names: Vec<UniqueVolumeName>) {
        VolumeManager::mark_volumes_as_reported_in_use(self, names)
    }
    fn mark_volumes_attached(&self, names: Vec<UniqueVolumeName>) {
        VolumeManager::mark_volumes_attached(self, names)
    }
}

/// Settings of the reporter.
#[derive(Debug, Clone, Copy)]
pub struct NodeStatusConfig {
    /// Own `status.volumesInUse` (`--report-volumes-in-use`).
    pub report_volumes_in_use: bool,
    /// Read `status.volumesAttached` for the manager.
    pub read_volumes_attached: bool,
    /// Read the Node at least this often (the kubelet's
    /// `nodeStatusUpdateFrequency`).
    pub period: Duration,
    /// Read it this often while a volume in use is not attached yet.
    pub attach_poll: Duration,
}

impl Default for NodeStatusConfig {
    fn default() -> Self {
        Self {
            report_volumes_in_use: true,
            read_volumes_attached: true,
            period: Duration::from_secs(10),
            attach_poll: Duration::from_secs(1),
        }
    }
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Patching the Node's status failed.
    #[error("patching the status of Node {node}: {source}")]
    Patch {
        /// The node.
        node: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// Reading the Node failed.
    #[error("reading Node {node}: {source}")]
    Get {
        /// The node.
        node: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
}

/// The reporter's memory between steps.
#[derive(Debug, Default)]
pub struct Reporter {
    /// What `volumesInUse` was last patched to (`None`: not yet).
    reported: Option<Vec<UniqueVolumeName>>,
    /// `volumesAttached` at the last read.
    attached: BTreeSet<UniqueVolumeName>,
    /// When the Node was last read.
    last_read: Option<Instant>,
}

impl Reporter {
    /// One round: once the states have synced, patches `volumesInUse` if
    /// the set changed; reads the Node if due. Returns whether a volume in
    /// use waits for attachment (the caller polls sooner).
    pub async fn step(
        &mut self,
        nodes: &Api<Node>,
        node: &str,
        vm: &dyn NodeVolumes,
        config: &NodeStatusConfig,
    ) -> Result<bool, Error> {
        let synced = vm.reconciler_states_synced();
        let in_use = vm.volumes_in_use();
        if config.report_volumes_in_use && synced && self.reported.as_ref() != Some(&in_use) {
            let list = match in_use.is_empty() {
                true => serde_json::Value::Null,
                false => in_use.iter().map(|v| v.as_str()).collect(),
            };
            let patch = serde_json::json!({ "status": { "volumesInUse": list } });
            let n = nodes
                .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|source| Error::Patch {
                    node: node.to_string(),
                    source,
                })?;
            tracing::debug!(
                node,
                volumes = in_use.len(),
                "Node status.volumesInUse updated"
            );
            vm.mark_volumes_as_reported_in_use(in_use.clone());
            self.reported = Some(in_use.clone());
            self.read(vm, &n);
        }
        let waiting =
            |attached: &BTreeSet<UniqueVolumeName>| in_use.iter().any(|v| !attached.contains(v));
        if config.read_volumes_attached {
            let since = self.last_read.map(|t| t.elapsed());
            let due = match since {
                None => true,
                Some(s) => {
                    s >= config.period || (waiting(&self.attached) && s >= config.attach_poll)
                }
            };
            if due {
                let n = nodes.get(node).await.map_err(|source| Error::Get {
                    node: node.to_string(),
                    source,
                })?;
                self.read(vm, &n);
            }
        }
        Ok(config.read_volumes_attached && waiting(&self.attached))
    }

    /// Takes `volumesAttached` from a Node just read.
    fn read(&mut self, vm: &dyn NodeVolumes, n: &Node) {
        self.last_read = Some(Instant::now());
        let attached: BTreeSet<UniqueVolumeName> = n
            .status
            .as_ref()
            .and_then(|s| s.volumes_attached.as_ref())
            .map(|a| {
                a.iter()
                    .map(|v| UniqueVolumeName::new(v.name.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        if attached != self.attached {
            vm.mark_volumes_attached(attached.iter().cloned().collect());
            self.attached = attached;
        }
    }
}

/// Keeps node `node`'s volume status until `shutdown`: after every change
/// of the manager's state, every `period`, and every `attach_poll` while a
/// volume waits for attachment; failures back off (up to `period`). The
/// entry point the agent spawns.
pub async fn run(
    client: Client,
    node: String,
    vm: Arc<VolumeManager>,
    config: NodeStatusConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut changes = vm.subscribe();
    let mut reporter = Reporter::default();
    let mut failures: u32 = 0;
    loop {
        changes.borrow_and_update();
        let delay = match reporter.step(&nodes, &node, vm.as_ref(), &config).await {
            Ok(waiting) => {
                failures = 0;
                if waiting {
                    config.attach_poll
                } else {
                    config.period
                }
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!(error = %e, "node status: will retry");
                Backoff::new(Duration::from_millis(400), 2, config.period).delay(failures)
            }
        };
        tokio::select! {
            () = volmgr::util::shutdown::requested(&mut shutdown) => return,
            r = changes.changed(), if failures == 0 => if r.is_err() { return },
            () = tokio::time::sleep(delay) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::testing::FakeApiServer;
    use serde_json::json;
    use std::sync::Mutex;

    const STATUS: &str = "/api/v1/nodes/n1/status";

    #[derive(Default)]
    struct Fake {
        /// The manager's states have not synced yet.
        not_synced: std::sync::atomic::AtomicBool,
        in_use: Mutex<Vec<UniqueVolumeName>>,
        reported: Mutex<Vec<Vec<UniqueVolumeName>>>,
        attached: Mutex<Vec<Vec<UniqueVolumeName>>>,
    }

    impl NodeVolumes for Fake {
        fn reconciler_states_synced(&self) -> bool {
            !self.not_synced.load(std::sync::atomic::Ordering::SeqCst)
        }
        fn volumes_in_use(&self) -> Vec<UniqueVolumeName> {
            self.in_use.lock().unwrap().clone()
        }
        fn mark_volumes_as_reported_in_use(&self, names: Vec<UniqueVolumeName>) {
            self.reported.lock().unwrap().push(names);
        }
        fn mark_volumes_attached(&self, names: Vec<UniqueVolumeName>) {
            self.attached.lock().unwrap().push(names);
        }
    }

    fn names(v: &[&str]) -> Vec<UniqueVolumeName> {
        v.iter().map(|s| UniqueVolumeName::new(*s)).collect()
    }

    /// The list is patched at start (stale entries go), then only when the
    /// set changes, as a merge patch of the status subresource; each patch
    /// is then told to the manager; an empty set removes the field.
    #[tokio::test]
    async fn volumes_in_use_patched_only_when_the_set_changes() {
        let api = FakeApiServer::in_memory();
        api.put_at(
            "/api/v1/nodes/n1",
            json!({"metadata": {"name": "n1"}, "status": {"volumesInUse": ["stale"]}}),
        );
        let nodes: Api<Node> = Api::all(api.client());
        let vm = Fake::default();
        *vm.in_use.lock().unwrap() = names(&["kubernetes.io/csi/d^a"]);
        let config = NodeStatusConfig {
            read_volumes_attached: false,
            ..NodeStatusConfig::default()
        };
        let mut r = Reporter::default();
        r.step(&nodes, "n1", &vm, &config).await.unwrap();
        r.step(&nodes, "n1", &vm, &config).await.unwrap();
        let reqs = api.take_requests();
        assert_eq!(reqs.len(), 1, "{reqs:?}");
        assert_eq!(
            (reqs[0].method.as_str(), reqs[0].path.as_str()),
            ("PATCH", STATUS)
        );
        assert_eq!(reqs[0].content_type, "application/merge-patch+json");
        assert_eq!(reqs[0].query, "", "no dry run, no field manager");
        assert_eq!(
            reqs[0].body,
            json!({"status": {"volumesInUse": ["kubernetes.io/csi/d^a"]}})
        );
        let node = api.get_at("/api/v1/nodes/n1").unwrap();
        assert_eq!(
            node["status"]["volumesInUse"],
            json!(["kubernetes.io/csi/d^a"])
        );
        assert_eq!(
            *vm.reported.lock().unwrap(),
            vec![names(&["kubernetes.io/csi/d^a"])]
        );

        *vm.in_use.lock().unwrap() = vec![];
        r.step(&nodes, "n1", &vm, &config).await.unwrap();
        let reqs = api.take_requests();
        assert_eq!(reqs[0].body, json!({"status": {"volumesInUse": null}}));
        assert!(api.get_at("/api/v1/nodes/n1").unwrap()["status"]
            .get("volumesInUse")
            .is_none());

        // A failed patch is not taken as reported: the next step tries again.
        *vm.in_use.lock().unwrap() = names(&["x"]);
        api.fail_next(http::Method::PATCH, 500);
        assert!(r.step(&nodes, "n1", &vm, &config).await.is_err());
        assert_eq!(vm.reported.lock().unwrap().len(), 2);
        r.step(&nodes, "n1", &vm, &config).await.unwrap();
        assert_eq!(vm.reported.lock().unwrap().last().unwrap(), &names(&["x"]));
    }

    /// Until the manager's states have synced, the Node's list is left as
    /// the earlier run wrote it (with a volume still mounted that the
    /// manager does not know yet): no write; then one, at once.
    #[tokio::test]
    async fn volumes_in_use_waits_for_the_states_to_sync() {
        let api = FakeApiServer::in_memory();
        let earlier = json!({"metadata": {"name": "n1"},
                             "status": {"volumesInUse": ["kubernetes.io/csi/d^a"]}});
        api.put_at("/api/v1/nodes/n1", earlier.clone());
        let nodes: Api<Node> = Api::all(api.client());
        let vm = Fake::default();
        vm.not_synced
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let config = NodeStatusConfig {
            read_volumes_attached: false,
            ..NodeStatusConfig::default()
        };
        let mut r = Reporter::default();
        r.step(&nodes, "n1", &vm, &config).await.unwrap();
        assert!(api.take_requests().is_empty(), "no write before the sync");
        assert_eq!(
            api.get_at("/api/v1/nodes/n1").unwrap()["status"],
            earlier["status"]
        );
        assert!(vm.reported.lock().unwrap().is_empty());

        vm.not_synced
            .store(false, std::sync::atomic::Ordering::SeqCst);
        *vm.in_use.lock().unwrap() = names(&["kubernetes.io/csi/d^a"]);
        r.step(&nodes, "n1", &vm, &config).await.unwrap();
        let reqs = api.take_requests();
        assert_eq!(reqs.len(), 1, "{reqs:?}");
        assert_eq!(
            reqs[0].body,
            json!({"status": {"volumesInUse": ["kubernetes.io/csi/d^a"]}})
        );
    }

    /// `volumesAttached` reaches the manager when it changes; a volume in
    /// use that is not attached makes the caller poll.
    #[tokio::test]
    async fn volumes_attached_reach_the_manager() {
        let api = FakeApiServer::in_memory();
        api.put_at("/api/v1/nodes/n1", json!({"metadata": {"name": "n1"}}));
        let nodes: Api<Node> = Api::all(api.client());
        let vm = Fake::default();
        *vm.in_use.lock().unwrap() = names(&["v1"]);
        let config = NodeStatusConfig {
            report_volumes_in_use: false,
            attach_poll: Duration::ZERO,
            ..NodeStatusConfig::default()
        };
        let mut r = Reporter::default();
        assert!(
            r.step(&nodes, "n1", &vm, &config).await.unwrap(),
            "v1 waits"
        );
        assert!(vm.attached.lock().unwrap().is_empty(), "nothing changed");
        api.put_at(
            "/api/v1/nodes/n1",
            json!({"metadata": {"name": "n1"},
                   "status": {"volumesAttached": [{"name": "v1", "devicePath": ""}]}}),
        );
        assert!(!r.step(&nodes, "n1", &vm, &config).await.unwrap());
        assert_eq!(*vm.attached.lock().unwrap(), vec![names(&["v1"])]);
        let reqs = api.take_requests();
        assert!(reqs.iter().all(|q| q.method == "GET"), "{reqs:?}");
        // Not waiting and the period not over: no read.
        r.step(&nodes, "n1", &vm, &config).await.unwrap();
        assert!(api.take_requests().is_empty());
    }
}
