//! End-to-end tests of the Node status the agent keeps with
//! `--report-volumes-in-use`: the real agent, through kube-rs, against a
//! REAL kube-apiserver (`support/real_cluster.rs`: Node,RBAC
//! authorization, NodeRestriction, an audit log) as the node itself
//! (`system:node:node-1`, whose own Node status NodeRestriction lets it
//! patch), with the real test CSI driver, in a private mount namespace.
//! The test runs there (it needs no misbehaving server, so not the fake):
//! every state the Node's status went through is read from a watch of the
//! Node (`kubectl get --watch`: one event per change the server stored),
//! the node's writes from the audit log.

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

#[path = "support/real_cluster.rs"]
mod real_cluster;

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};

use csi_driver::{wait_or_dump, Driver};
use real_cluster::RealCluster;
use serde_json::{json, Value};
use support::{isolated, Agent, Env};
use volmgr::plugins::csi::PUBLISHED_FILE;

const NODE: &str = "node-1";
const DRIVER: &str = "loop.csi.volmgr.dev";
/// A PersistentVolume of the test driver (handle `h-<pv>`) and its bound
/// claim `claim-<pv>` in namespace `test`.
fn pv_and_claim(k: &RealCluster, pv: &str) {
    k.apply(&json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "",
                 "csi": {"driver": DRIVER, "volumeHandle": format!("h-{pv}"), "fsType": "ext4",
                         "volumeAttributes": {"size": "64Mi"}}}}));
    k.apply(&json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": format!("claim-{pv}"), "namespace": "test"},
        "spec": {"volumeName": pv, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "resources": {"requests": {"storage": "64Mi"}}}}));
    k.server.bind("test", &format!("claim-{pv}"), pv);
}

/// A running pod bound to this node, mounting the claim of `pv` as `v`.
fn pod(name: &str, uid: &str, pv: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "test", "uid": uid},
        "spec": {"nodeName": NODE,
                 "containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": format!("claim-{pv}")}}]},
        "status": {"phase": "Running"}})
}

/// The unique name of `pv`'s volume (the kubelet's for CSI).
fn volume_name(pv: &str) -> String {
    format!("kubernetes.io/csi/{DRIVER}^h-{pv}")
}

fn start_agent(env: &Env, kubeconfig: &Path, driver: &Driver) -> Agent {
    let flag = driver.flag();
    env.start_agent_without_manifests(&[
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--node-name",
        NODE,
        "--csi-driver",
        &flag,
        "--report-volumes-in-use",
    ])
}

/// `status.volumesInUse` of a Node (empty without).
fn in_use_of(node: &Value) -> Vec<String> {
    node["status"]["volumesInUse"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The Node's `status.volumesInUse` as stored.
fn node_in_use(k: &RealCluster) -> Vec<String> {
    in_use_of(&k.get("node", "", NODE))
}

/// `(resourceVersion, status.volumesInUse)` of each state of the Node.
type Seen = Arc<Mutex<Vec<(u64, Vec<String>)>>>;

/// Every `status.volumesInUse` the Node was stored with, in order, from a
/// watch of it (`kubectl get --watch`): the watch stops when dropped.
struct NodeWatch {
    child: Child,
    seen: Seen,
}

impl NodeWatch {
    fn start(k: &RealCluster) -> Self {
        let mut child = k
            .server
            .kubectl()
            .args(["get", "node", NODE, "--watch", "-o", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let seen: Seen = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&seen);
        std::thread::spawn(move || {
            for v in serde_json::Deserializer::from_reader(out).into_iter::<Value>() {
                let Ok(node) = v else { return };
                let rv = node["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(0);
                into.lock().unwrap().push((rv, in_use_of(&node)));
            }
        });
        Self { child, seen }
    }

    /// What the Node's `volumesInUse` was after each change, from
    /// resourceVersion `after` on.
    fn since(&self, after: u64) -> Vec<Vec<String>> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(rv, _)| *rv > after)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many patches of its Node's status the node made (audit log).
fn status_writes(k: &RealCluster) -> usize {
    k.node_requests()
        .iter()
        .filter(|a| a.resource == "nodes/status" && a.verb == "patch" && a.code == 200)
        .count()
}

/// A CSI volume mounted and reported in use, then the agent killed with
/// SIGKILL and started again: the restarted agent writes
/// `status.volumesInUse` only once its states have synced (the kubelet's
/// `VolumesInUse` setter waits for `ReconcilerStatesHasBeenSynced`), and
/// every write keeps the still-mounted volume, through another volume
/// coming and going; nothing is published again.
#[test]
fn volumes_in_use_keeps_a_mounted_volume_across_a_kill9() {
    isolated(
        "volumes_in_use_keeps_a_mounted_volume_across_a_kill9",
        || {
            let Some(k) = RealCluster::start(NODE, &["test"]) else {
                return;
            };
            let env = Env::new();
            let kubeconfig = k.kubeconfig.clone();
            let mut driver = Driver::new(&env, DRIVER);
            driver.start();
            pv_and_claim(&k, "pv-a");
            let uid = k.create_pod(&pod("a", "", "pv-a"));
            let uid = uid.as_str();
            let a = volume_name("pv-a");
            let watch = NodeWatch::start(&k);

            let agent = start_agent(&env, &kubeconfig, &driver);
            // Mounted, and the publish recorded as done: a kill between
            // NodePublishVolume's answer and the record leaves an uncertain
            // volume, rightly published again after the restart.
            let record = env
                .csi_publish_path(uid, "pv-a")
                .with_file_name(PUBLISHED_FILE);
            wait_or_dump(&env, &agent, &driver, "pv-a mounted and reported", || {
                env.mount_count(&env.csi_publish_path(uid, "pv-a")) == 1
                    && record.exists()
                    && node_in_use(&k) == [a.clone()]
            });
            std::fs::write(env.csi_publish_path(uid, "pv-a").join("data"), "kept").unwrap();
            agent.kill9();

            let before = status_writes(&k);
            let version: u64 = k.get("node", "", NODE)["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            let agent = start_agent(&env, &kubeconfig, &driver);
            wait_or_dump(
                &env,
                &agent,
                &driver,
                "a first write after the restart",
                || status_writes(&k) > before && env.status().synced,
            );
            // Another volume comes, then goes: two more writes.
            pv_and_claim(&k, "pv-b");
            let uid_b = k.create_pod(&pod("b", "", "pv-b"));
            let uid_b = uid_b.as_str();
            let b = volume_name("pv-b");
            wait_or_dump(&env, &agent, &driver, "pv-b mounted and reported", || {
                env.mount_count(&env.csi_publish_path(uid_b, "pv-b")) == 1
                    && node_in_use(&k) == [a.clone(), b.clone()]
            });
            k.delete("pod", "test", "b");
            wait_or_dump(
                &env,
                &agent,
                &driver,
                "pv-b unmounted, not reported",
                || !env.root.join("pods").join(uid_b).exists() && node_in_use(&k) == [a.clone()],
            );

            // Every state the Node was stored in since the restart kept the
            // mounted volume (the watch sees each change).
            let all = watch.since(version);
            assert!(
                all.iter().any(|w| w.contains(&b)),
                "the watch saw no change: {all:?}"
            );
            assert!(
                all.iter().all(|w| w.contains(&a)),
                "a write after the restart left out the mounted {a}: {all:?}"
            );
            assert_eq!(env.mount_count(&env.csi_publish_path(uid, "pv-a")), 1);
            assert_eq!(
                std::fs::read_to_string(env.csi_publish_path(uid, "pv-a").join("data")).unwrap(),
                "kept"
            );
            driver.expect("NodePublishVolume", "h-pv-a", "OK", 1);
            k.assert_node_refused_nothing();
            assert!(agent.term());
        },
    );
}
