//! End-to-end tests of the Node status the agent keeps with
//! `--report-volumes-in-use`: the real agent, through kube-rs, against the
//! in-process fake API server (`volmgr_kube::testing::FakeApiServer`, which records
//! every request with its body), with the real test CSI driver, in a
//! private mount namespace.

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

use std::path::Path;

use csi_driver::{wait_or_dump, Driver};
use serde_json::{json, Value};
use support::{isolated, Agent, Env};
use volmgr::plugins::csi::PUBLISHED_FILE;
use volmgr_kube::testing::{FakeApiServer, Recorded};

const NODE: &str = "node-1";
const DRIVER: &str = "loop.csi.volmgr.dev";
const STATUS: &str = "/api/v1/nodes/node-1/status";

/// A PersistentVolume of the test driver (handle `h-<pv>`) and its bound
/// claim `claim-<pv>` in namespace `test`.
fn pv_and_claim(api: &FakeApiServer, pv: &str) {
    api.apply(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"],
                 "claimRef": {"namespace": "test", "name": format!("claim-{pv}")},
                 "csi": {"driver": DRIVER, "volumeHandle": format!("h-{pv}"), "fsType": "ext4",
                         "volumeAttributes": {"size": "64Mi"}}}}));
    api.apply(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": format!("claim-{pv}"), "namespace": "test"},
        "spec": {"volumeName": pv, "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Bound"}}));
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

/// The `status.volumesInUse` of every Node status patch in `reqs`, in
/// order (`None`: the patch removed the field).
fn in_use_writes(reqs: &[Recorded]) -> Vec<Option<Vec<String>>> {
    reqs.iter()
        .filter(|r| r.method == "PATCH" && r.path == STATUS)
        .map(|r| {
            r.body["status"]["volumesInUse"]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        })
        .collect()
}

/// The Node's `status.volumesInUse` as stored.
fn node_in_use(api: &FakeApiServer) -> Vec<String> {
    let node = api.get("Node", "", NODE).unwrap();
    node["status"]["volumesInUse"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
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
            let env = Env::new();
            let api = FakeApiServer::start();
            let kubeconfig = api.write_kubeconfig(env.dir.path());
            let mut driver = Driver::new(&env, DRIVER);
            driver.start();
            api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
            pv_and_claim(&api, "pv-a");
            let uid = "e1000000-0000-0000-0000-00000000000e";
            api.apply(pod("a", uid, "pv-a"));
            let a = volume_name("pv-a");

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
                    && node_in_use(&api) == [a.clone()]
            });
            std::fs::write(env.csi_publish_path(uid, "pv-a").join("data"), "kept").unwrap();
            agent.kill9();

            let before = api.requests().len();
            let agent = start_agent(&env, &kubeconfig, &driver);
            let writes = || in_use_writes(&api.requests()[before..]);
            wait_or_dump(
                &env,
                &agent,
                &driver,
                "a first write after the restart",
                || !writes().is_empty() && env.status().synced,
            );
            // Another volume comes, then goes: two more writes.
            pv_and_claim(&api, "pv-b");
            let uid_b = "e2000000-0000-0000-0000-00000000000e";
            api.apply(pod("b", uid_b, "pv-b"));
            let b = volume_name("pv-b");
            wait_or_dump(&env, &agent, &driver, "pv-b mounted and reported", || {
                env.mount_count(&env.csi_publish_path(uid_b, "pv-b")) == 1
                    && node_in_use(&api) == [a.clone(), b.clone()]
            });
            api.delete("Pod", "test", "b", false);
            wait_or_dump(
                &env,
                &agent,
                &driver,
                "pv-b unmounted, not reported",
                || !env.root.join("pods").join(uid_b).exists() && node_in_use(&api) == [a.clone()],
            );

            let all = writes();
            assert!(
                all.iter()
                    .all(|w| w.as_ref().is_some_and(|l| l.contains(&a))),
                "a write after the restart left out the mounted {a}: {all:?}"
            );
            assert_eq!(env.mount_count(&env.csi_publish_path(uid, "pv-a")), 1);
            assert_eq!(
                std::fs::read_to_string(env.csi_publish_path(uid, "pv-a").join("data")).unwrap(),
                "kept"
            );
            driver.expect("NodePublishVolume", "h-pv-a", "OK", 1);
            assert!(agent.term());
        },
    );
}
