//! The kubelet's CSI node-info manager (`pkg/volume/csi/nodeinfomanager`):
//! for every driver registered through the plugin watcher (with its
//! `NodeGetInfo` answer, see `volmgr::pluginmanager::plugin_watcher`), the node's
//! `CSINode` object lists the driver (name, `nodeID`, `topologyKeys`,
//! `allocatable.count`), the Node carries the driver's node ID in the
//! `csi.volume.kubernetes.io/nodeid` annotation (a JSON map driver →
//! node ID) and its topology segments as labels. When the driver
//! unregisters, its CSINode entry and annotation entry go; its topology
//! labels stay, as in the kubelet (another driver may share a key).
//!
//! Unlike the kubelet, an API server that is down or refuses does not fail
//! the registration (the driver works on this node without it): the
//! objects are brought up to date with backoff until they are.
//! Level-triggered: every change of the driver registry re-checks all of
//! them; entries of other drivers (a kubelet's) are left alone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use tokio::sync::watch;
use volmgr::pluginmanager::registry::{DriverRegistry, NodeInfo};
use volmgr::util::backoff::Backoff;

/// The Node annotation with every driver's node ID (a JSON map).
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// The CSINode annotation listing the in-tree plugins migrated to CSI on
/// this node (`v1.MigratedPluginsAnnotationKey`): the attach/detach
/// controller (and the scheduler's volume binding) use CSI for a migrated
/// plugin's volumes on the node only if it is listed.
pub const MIGRATED_PLUGINS_ANNOTATION: &str = "storage.alpha.kubernetes.io/migrated-plugins";

/// The annotation's value as the kubelet computes it (`setMigrationAnnotation`
/// over its `migratedPlugins`): every in-tree plugin whose migration is on,
/// sorted, comma-separated. In Kubernetes 1.37 all seven migrations are
/// unconditional (Portworx's too), and volmgr migrates those seven, so the
/// value does not depend on which CSI drivers are registered.
pub fn migrated_plugins() -> String {
    let mut names: Vec<&str> = volmgr::populator::convert::migration::MIGRATED_PLUGINS
        .iter()
        .map(|(plugin, _)| *plugin)
        .collect();
    names.sort_unstable();
    names.dedup();
    names.join(",")
}

/// The kubelet's `setMigrationAnnotation`: `meta`'s annotation set to
/// `value` (removed if empty) unless it already names the same set of
/// plugins (in any order); other annotations kept. Whether it changed.
pub fn set_migration_annotation(meta: &mut ObjectMeta, value: &str) -> bool {
    let set = |s: &str| -> std::collections::BTreeSet<String> {
        match s.is_empty() {
            true => Default::default(),
            false => s.split(',').map(String::from).collect(),
        }
    };
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    let old = annotations
        .get(MIGRATED_PLUGINS_ANNOTATION)
        .map(String::as_str)
        .unwrap_or("");
    if set(old) == set(value) {
        if annotations.is_empty() {
            meta.annotations = None;
        }
        return false;
    }
    match value.is_empty() {
        true => annotations.remove(MIGRATED_PLUGINS_ANNOTATION),
        false => annotations.insert(MIGRATED_PLUGINS_ANNOTATION.to_string(), value.to_string()),
    };
    true
}

/// How often an update that lost a race (409 Conflict) is tried again at once.
const CONFLICT_RETRIES: usize = 5;

/// The wait after a failed sync: 1 s doubling to 32 s.
const RETRY: Backoff = Backoff::new(Duration::from_secs(1), 2, Duration::from_secs(32));

/// Why the node's objects could not be updated for a driver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a call.
    #[error("{what} {name}: {source}")]
    Api {
        /// The object kind (`Node`, `CSINode`).
        what: &'static str,
        /// Its name.
        name: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The Node's annotation is not a JSON map of strings.
    #[error("Node {node}: annotation {NODE_ID_ANNOTATION} is not a JSON map of strings: {source}")]
    BadAnnotation {
        /// The node.
        node: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A topology label already has another value (the kubelet refuses too).
    #[error("Node {node}: topology label {key}={new} of CSI driver {driver} conflicts with the existing value {old:?}")]
    TopologyConflict {
        /// The node.
        node: String,
        /// The driver.
        driver: String,
        /// The label key.
        key: String,
        /// The node's value.
        old: String,
        /// The driver's value.
        new: String,
    },
    /// The object kept changing under us.
    #[error("{what} {name}: still conflicting after {CONFLICT_RETRIES} attempts")]
    Conflicts {
        /// The object kind.
        what: &'static str,
        /// Its name.
        name: String,
    },
}

/// The result of this module's calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn api_error<'a>(what: &'static str, name: &'a str) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |source| Error::Api {
        what,
        name: name.to_string(),
        source,
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_conflict())
}

/// Keeps the objects of node `node` up to date with the drivers of
/// `registry` until `shutdown`: the entry point the agent spawns.
pub async fn run(
    client: Client,
    node: String,
    registry: Arc<DriverRegistry>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut changes = registry.subscribe();
    let mut installed: BTreeMap<String, NodeInfo> = BTreeMap::new();
    let mut failures: u32 = 0;
    loop {
        changes.borrow_and_update();
        let want: BTreeMap<String, NodeInfo> = registry
            .driver_infos()
            .into_iter()
            .filter_map(|d| d.node.map(|n| (d.name, n)))
            .collect();
        let retry = if sync(&client, &node, &want, &mut installed).await {
            failures = 0;
            None
        } else {
            failures = failures.saturating_add(1);
            Some(RETRY.delay(failures))
        };
        tokio::select! {
            () = volmgr::util::shutdown::requested(&mut shutdown) => return,
            r = changes.changed() => if r.is_err() { return },
            () = sleep(retry) => {}
        }
    }
}

async fn sleep(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Installs what `want` has and `installed` has not (or differently), and
/// uninstalls what `installed` has and `want` has not. Whether all went well.
pub async fn sync(
    client: &Client,
    node: &str,
    want: &BTreeMap<String, NodeInfo>,
    installed: &mut BTreeMap<String, NodeInfo>,
) -> bool {
    let mut ok = true;
    for (driver, info) in want {
        if installed.get(driver) == Some(info) {
            continue;
        }
        match install(client, node, driver, info).await {
            Ok(()) => {
                tracing::info!(node, driver, node_id = %info.node_id, "CSINode and Node updated for the CSI driver");
                installed.insert(driver.clone(), info.clone());
            }
            Err(e) => {
                tracing::warn!(node, driver, error = %e, "updating CSINode/Node for the CSI driver failed; will retry");
                ok = false;
            }
        }
    }
    let gone: Vec<String> = installed
        .keys()
        .filter(|d| !want.contains_key(*d))
        .cloned()
        .collect();
    for driver in gone {
        match uninstall(client, node, &driver).await {
            Ok(()) => {
                tracing::info!(node, driver, "CSI driver removed from CSINode and Node");
                installed.remove(&driver);
            }
            Err(e) => {
                tracing::warn!(node, driver, error = %e, "removing the CSI driver from CSINode/Node failed; will retry");
                ok = false;
            }
        }
    }
    ok
}

/// The kubelet's `InstallCSIDriver`: the Node's annotation and labels, then
/// the CSINode entry (created with the CSINode, owned by the Node).
pub async fn install(client: &Client, node: &str, driver: &str, info: &NodeInfo) -> Result<()> {
    let uid = update_node(client, node, |ids, labels| {
        let mut changed = ids
            .insert(driver.to_string(), info.node_id.clone())
            .as_ref()
            != Some(&info.node_id);
        for (k, v) in &info.accessible_topology {
            match labels.get(k) {
                Some(old) if old == v => {}
                Some(old) => {
                    return Err(Error::TopologyConflict {
                        node: node.to_string(),
                        driver: driver.to_string(),
                        key: k.clone(),
                        old: old.clone(),
                        new: v.clone(),
                    })
                }
                None => {
                    labels.insert(k.clone(), v.clone());
                    changed = true;
                }
            }
        }
        Ok(changed)
    })
    .await?;
    let entry = CSINodeDriver {
        name: driver.to_string(),
        node_id: info.node_id.clone(),
        topology_keys: Some(info.accessible_topology.keys().cloned().collect()),
        allocatable: (info.max_volumes_per_node > 0).then(|| VolumeNodeResources {
            count: i32::try_from(info.max_volumes_per_node).ok(),
        }),
    };
    update_csinode(client, node, uid, driver, Some(entry)).await
}

/// The kubelet's `UninstallCSIDriver`: the driver's CSINode entry and its
/// entry of the Node's annotation (topology labels stay).
pub async fn uninstall(client: &Client, node: &str, driver: &str) -> Result<()> {
    update_csinode(client, node, None, driver, None).await?;
    update_node(client, node, |ids, _| Ok(ids.remove(driver).is_some())).await?;
    Ok(())
}

/// Reads the Node, lets `change` edit its node-ID map and labels (returning
/// whether it changed anything), and merge-patches what changed with the
/// read resourceVersion as precondition, again on a conflict. Returns the
/// Node's UID.
async fn update_node<F>(client: &Client, node: &str, change: F) -> Result<Option<String>>
where
    F: Fn(&mut BTreeMap<String, String>, &mut BTreeMap<String, String>) -> Result<bool>,
{
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..CONFLICT_RETRIES {
        let n = nodes.get(node).await.map_err(api_error("Node", node))?;
        let meta = &n.metadata;
        let mut ids: BTreeMap<String, String> = match meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODE_ID_ANNOTATION))
        {
            Some(text) => serde_json::from_str(text).map_err(|source| Error::BadAnnotation {
                node: node.to_string(),
                source,
            })?,
            None => BTreeMap::new(),
        };
        let mut labels = meta.labels.clone().unwrap_or_default();
        let old_labels = labels.clone();
        if !change(&mut ids, &mut labels)? {
            return Ok(meta.uid.clone());
        }
        let ids_value = match ids.is_empty() {
            true => serde_json::Value::Null,
            false => serde_json::Value::String(serde_json::to_string(&ids).unwrap_or_default()),
        };
        let new_labels: BTreeMap<&String, &String> = labels
            .iter()
            .filter(|(k, v)| old_labels.get(*k) != Some(*v))
            .collect();
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": meta.resource_version,
                "annotations": { NODE_ID_ANNOTATION: ids_value },
                "labels": new_labels,
            }
        });
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(n) => return Ok(n.metadata.uid),
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(api_error("Node", node)(e)),
        }
    }
    Err(Error::Conflicts {
        what: "Node",
        name: node.to_string(),
    })
}

/// Sets (`Some`) or removes (`None`) driver `driver`'s entry in the node's
/// CSINode, creating the CSINode (owned by the Node `uid`) when setting.
async fn update_csinode(
    client: &Client,
    node: &str,
    uid: Option<String>,
    driver: &str,
    entry: Option<CSINodeDriver>,
) -> Result<()> {
    let api: Api<CSINode> = Api::all(client.clone());
    for _ in 0..CONFLICT_RETRIES {
        let res = match api
            .get_opt(node)
            .await
            .map_err(api_error("CSINode", node))?
        {
            None if entry.is_none() => return Ok(()),
            None => {
                let obj = new_csinode(node, uid.clone(), entry.iter().cloned().collect());
                api.create(&PostParams::default(), &obj).await.map(|_| ())
            }
            Some(mut obj) => {
                // As the kubelet's `installDriverToCSINode` (its uninstall
                // leaves the annotation alone).
                let annotated = entry.is_some()
                    && set_migration_annotation(&mut obj.metadata, &migrated_plugins());
                let drivers = &mut obj.spec.drivers;
                let old = drivers.clone();
                drivers.retain(|d| d.name != driver);
                drivers.extend(entry.iter().cloned());
                drivers.sort_by(|a, b| a.name.cmp(&b.name));
                if *drivers == old && !annotated {
                    return Ok(());
                }
                api.replace(node, &PostParams::default(), &obj)
                    .await
                    .map(|_| ())
            }
        };
        match res {
            Ok(()) => return Ok(()),
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => continue,
            Err(e) => return Err(api_error("CSINode", node)(e)),
        }
    }
    Err(Error::Conflicts {
        what: "CSINode",
        name: node.to_string(),
    })
}

fn new_csinode(node: &str, uid: Option<String>, drivers: Vec<CSINodeDriver>) -> CSINode {
    let owner = uid.map(|uid| OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_string(),
        uid,
        ..OwnerReference::default()
    });
    let mut metadata = ObjectMeta {
        name: Some(node.to_string()),
        owner_references: owner.map(|o| vec![o]),
        ..ObjectMeta::default()
    };
    // The kubelet's `CreateCSINode` annotates the new object.
    set_migration_annotation(&mut metadata, &migrated_plugins());
    CSINode {
        metadata,
        spec: CSINodeSpec { drivers },
        ..CSINode::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::testing::FakeApiServer;
    use serde_json::json;

    const NODE: &str = "/api/v1/nodes/n1";
    const CSINODE: &str = "/apis/storage.k8s.io/v1/csinodes/n1";

    fn info(id: &str, max: i64, topo: &[(&str, &str)]) -> NodeInfo {
        NodeInfo {
            node_id: id.into(),
            max_volumes_per_node: max,
            accessible_topology: topo
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn fake() -> FakeApiServer {
        let api = FakeApiServer::in_memory();
        api.put_at(
            NODE,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "node-uid",
                "labels": {"kubernetes.io/hostname": "n1"},
                "annotations": {NODE_ID_ANNOTATION: "{\"kubelet.csi\":\"k1\"}"}}}),
        );
        api
    }

    fn ids(api: &FakeApiServer) -> serde_json::Value {
        let n = api.get_at(NODE).unwrap();
        match n["metadata"]["annotations"][NODE_ID_ANNOTATION].as_str() {
            Some(t) => serde_json::from_str(t).unwrap(),
            None => json!(null),
        }
    }

    /// Install writes the annotation (keeping the kubelet's driver), the
    /// topology labels and a CSINode owned by the Node; requests are a GET
    /// and a merge PATCH of the Node with its resourceVersion, then the
    /// CSINode GET (404) and POST. Uninstall takes the entries away again,
    /// the labels stay.
    #[tokio::test]
    async fn install_and_uninstall_like_the_kubelet() {
        let api = fake();
        let client = api.client();
        let i = info("node-a", 4, &[("topology.x.io/zone", "z1")]);
        install(&client, "n1", "x.csi", &i).await.unwrap();
        let reqs = api.take_requests();
        let calls: Vec<_> = reqs
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect();
        assert_eq!(
            calls,
            [
                format!("GET {NODE}"),
                format!("PATCH {NODE}"),
                format!("GET {CSINODE}"),
                "POST /apis/storage.k8s.io/v1/csinodes".to_string(),
            ]
        );
        assert_eq!(reqs[1].content_type, "application/merge-patch+json");
        assert_eq!(reqs[1].body["metadata"]["resourceVersion"], "1");
        assert_eq!(
            reqs[1].body["metadata"]["labels"],
            json!({"topology.x.io/zone": "z1"}),
            "only the new label is sent"
        );
        assert_eq!(ids(&api), json!({"kubelet.csi": "k1", "x.csi": "node-a"}));
        let n = api.get_at(NODE).unwrap();
        assert_eq!(n["metadata"]["labels"]["topology.x.io/zone"], "z1");
        assert_eq!(n["metadata"]["labels"]["kubernetes.io/hostname"], "n1");
        let c = api.get_at(CSINODE).unwrap();
        assert_eq!(
            c["spec"]["drivers"],
            json!([{"name": "x.csi", "nodeID": "node-a", "topologyKeys": ["topology.x.io/zone"],
                    "allocatable": {"count": 4}}])
        );
        assert_eq!(
            c["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "node-uid"}])
        );

        // Installing the same again changes nothing (reads only).
        install(&client, "n1", "x.csi", &i).await.unwrap();
        assert!(api.take_requests().iter().all(|r| r.method == "GET"));

        // A second driver joins the CSINode (PUT with its resourceVersion).
        install(&client, "n1", "y.csi", &info("node-b", 0, &[]))
            .await
            .unwrap();
        let c = api.get_at(CSINODE).unwrap();
        let names: Vec<_> = c["spec"]["drivers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["x.csi", "y.csi"]);
        assert!(c["spec"]["drivers"][1].get("allocatable").is_none());

        uninstall(&client, "n1", "x.csi").await.unwrap();
        uninstall(&client, "n1", "y.csi").await.unwrap();
        assert_eq!(ids(&api), json!({"kubelet.csi": "k1"}));
        assert_eq!(api.get_at(CSINODE).unwrap()["spec"]["drivers"], json!([]));
        let n = api.get_at(NODE).unwrap();
        assert_eq!(n["metadata"]["labels"]["topology.x.io/zone"], "z1");
    }

    /// The annotation's value as the kubelet's `setMigrationAnnotation`
    /// computes it over its `migratedPlugins` (all seven, in 1.37):
    /// sorted, comma-separated; the same set in another order is left as
    /// it is; other annotations are kept; an empty value removes it.
    #[test]
    fn migrated_plugins_as_the_kubelet_computes_them() {
        let all = "kubernetes.io/aws-ebs,kubernetes.io/azure-disk,kubernetes.io/azure-file,\
                   kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume,\
                   kubernetes.io/vsphere-volume";
        assert_eq!(migrated_plugins(), all);
        let mut meta = ObjectMeta::default();
        assert!(set_migration_annotation(&mut meta, all));
        assert!(!set_migration_annotation(&mut meta, all));
        let ann = |m: &ObjectMeta| m.annotations.clone().unwrap_or_default();
        assert_eq!(ann(&meta)[MIGRATED_PLUGINS_ANNOTATION], all);
        let reversed: Vec<&str> = all.split(',').rev().collect();
        let mut other = ObjectMeta {
            annotations: Some(BTreeMap::from([
                ("x".to_string(), "y".to_string()),
                (MIGRATED_PLUGINS_ANNOTATION.to_string(), reversed.join(",")),
            ])),
            ..ObjectMeta::default()
        };
        assert!(!set_migration_annotation(&mut other, all), "same set");
        assert!(set_migration_annotation(&mut other, "kubernetes.io/gce-pd"));
        assert_eq!(ann(&other)["x"], "y");
        assert!(set_migration_annotation(&mut other, ""));
        assert_eq!(
            ann(&other),
            BTreeMap::from([("x".to_string(), "y".to_string())])
        );
        let mut none = ObjectMeta::default();
        assert!(!set_migration_annotation(&mut none, ""));
        assert_eq!(none.annotations, None);
    }

    /// The CSINode carries the migrated-plugins annotation from its
    /// creation; one made without it (another writer's, with its own
    /// annotation) gets it on the next install, its other annotation kept;
    /// an uninstall leaves it, as the kubelet's does. Before, no annotation
    /// was written: the attach/detach controller took the node as not
    /// migrated.
    #[tokio::test]
    async fn csinode_carries_the_migrated_plugins_annotation() {
        let api = fake();
        let client = api.client();
        install(&client, "n1", "x.csi", &info("a", 0, &[]))
            .await
            .unwrap();
        let c = api.get_at(CSINODE).unwrap();
        assert_eq!(
            c["metadata"]["annotations"][MIGRATED_PLUGINS_ANNOTATION],
            migrated_plugins()
        );
        let mut c = c;
        c["metadata"]["annotations"] = json!({"other": "kept"});
        api.put_at(CSINODE, c);
        install(&client, "n1", "x.csi", &info("a", 0, &[]))
            .await
            .unwrap();
        let c = api.get_at(CSINODE).unwrap();
        assert_eq!(
            c["metadata"]["annotations"],
            json!({"other": "kept", MIGRATED_PLUGINS_ANNOTATION: migrated_plugins()})
        );
        uninstall(&client, "n1", "x.csi").await.unwrap();
        let c = api.get_at(CSINODE).unwrap();
        assert_eq!(c["spec"]["drivers"], json!([]));
        assert_eq!(
            c["metadata"]["annotations"][MIGRATED_PLUGINS_ANNOTATION],
            migrated_plugins()
        );
    }

    /// The last node ID removed takes the annotation away; a conflicting
    /// topology label is refused; a conflict on the PATCH is read again.
    #[tokio::test]
    async fn conflicts_and_the_last_driver() {
        let api = FakeApiServer::in_memory();
        api.put_at(
            NODE,
            json!({"metadata": {"name": "n1", "labels": {"topology.x.io/zone": "z9"}}}),
        );
        let client = api.client();
        let e = install(
            &client,
            "n1",
            "x.csi",
            &info("a", 0, &[("topology.x.io/zone", "z1")]),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, Error::TopologyConflict { .. }), "{e}");
        api.fail_next(http::Method::PATCH, 409);
        install(&client, "n1", "x.csi", &info("a", 0, &[]))
            .await
            .unwrap();
        let patches = api
            .take_requests()
            .into_iter()
            .filter(|r| r.method == "PATCH")
            .count();
        assert_eq!(patches, 2, "the conflict was retried");
        assert_eq!(ids(&api), json!({"x.csi": "a"}));
        uninstall(&client, "n1", "x.csi").await.unwrap();
        let n = api.get_at(NODE).unwrap();
        assert!(n["metadata"]["annotations"]
            .get(NODE_ID_ANNOTATION)
            .is_none());
    }

    /// `sync` follows the registry: a failure is reported (and retried by
    /// the caller), an unregistered driver is uninstalled.
    #[tokio::test]
    async fn sync_follows_the_registry() {
        let api = fake();
        let client = api.client();
        let mut installed = BTreeMap::new();
        let mut want = BTreeMap::new();
        want.insert("x.csi".to_string(), info("a", 0, &[]));
        api.fail_next(http::Method::GET, 503);
        assert!(!sync(&client, "n1", &want, &mut installed).await);
        assert!(installed.is_empty());
        assert!(sync(&client, "n1", &want, &mut installed).await);
        assert_eq!(ids(&api)["x.csi"], "a");
        want.clear();
        assert!(sync(&client, "n1", &want, &mut installed).await);
        assert!(installed.is_empty());
        assert_eq!(ids(&api), json!({"kubelet.csi": "k1"}));
    }
}
