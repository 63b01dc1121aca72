//! End-to-end tests of node expansion as the kubelet finishes it: the real
//! agent on a REAL kube-apiserver (`support/real_cluster.rs`: Node,RBAC
//! authorization, NodeRestriction, an audit log), as the node itself
//! (`system:node:node-1`), driving the real test CSI driver
//! (`volmgr-csi-driver`: a loop device, a real file system grown by
//! NodeExpandVolume), each test in a private mount namespace. Both tests
//! run there (none needs a server misbehaving: the fake API server is not
//! used here); NodeRestriction checks the claim's status patch as it checks
//! the kubelet's (only `status.capacity`, conditions and the resize status
//! may change), and the audit log shows it and no refusal.
//!
//! The claim (of a StorageClass that allows expansion: the server's
//! PersistentVolumeClaimResize admission refuses growing others) is
//! expanded as the external-resizer leaves it when the node must finish (`MarkForFSResize`): the PV's capacity grown, the claim's
//! `status.capacity` still the old size, `allocatedResourceStatuses.storage:
//! NodeResizePending`, a `FileSystemResizePending` condition. The agent must
//! grow the file system (visible in `statvfs`) and patch the claim's status
//! as the kubelet does (`status.capacity` new, the resize status and
//! condition gone).
//!
//! The file system is xfs in both tests: NodeExpandVolume runs on a
//! mounted file system (the kubelet calls it after the set-up, even for a
//! claim expanded while no pod used it), and growing a mounted ext4 needs
//! CAP_SYS_RESOURCE, which the dev/CI containers lack (`CapBnd` without bit
//! 24: the driver answers FAILED_PRECONDITION); `xfs_growfs` needs only
//! CAP_SYS_ADMIN, and xfs at least 300 MiB.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
#[path = "support/real_cluster.rs"]
mod real_cluster;
mod support;

use std::path::{Path, PathBuf};

use csi_driver::{wait_for, Driver};
use real_cluster::RealCluster;
use serde_json::{json, Value};
use support::{isolated, Agent, Env};

const DRIVER: &str = "loop.csi.volmgr.dev";
const NODE: &str = "node-1";
const HANDLE: &str = "vol-x";
const SMALL: u64 = 320 << 20;

/// The StorageClass of the claim: it allows expansion.
fn storage_class() -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "expandable"}, "provisioner": DRIVER,
        "allowVolumeExpansion": true})
}

/// The PersistentVolume (xfs, `capacity`), bound to `test/claim-x` by
/// [`Cluster::new`] (its `claimRef` is the binding's).
fn pv(capacity: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-x"},
        "spec": {
            "capacity": {"storage": capacity},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "expandable",
            "csi": {"driver": DRIVER, "volumeHandle": HANDLE, "fsType": "xfs",
                    "volumeAttributes": {"size": "320Mi"}}
        }
    })
}

/// The claim, bound, with `status.capacity` 320Mi; `expanded`: as the
/// external-resizer leaves it when the node must grow the file system.
fn claim(expanded: bool) -> Value {
    let mut c = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim-x", "namespace": "test"},
        "spec": {"volumeName": "pv-x", "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "expandable",
                 "resources": {"requests": {"storage": "320Mi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "320Mi"},
                   "conditions": [{"type": "ModifyingVolume", "status": "True"}]}
    });
    if expanded {
        c["spec"]["resources"]["requests"]["storage"] = json!("640Mi");
        let s = &mut c["status"];
        s["allocatedResources"] = json!({"storage": "640Mi"});
        s["allocatedResourceStatuses"] = json!({"storage": "NodeResizePending"});
        s["conditions"].as_array_mut().unwrap().push(json!({
            "type": "FileSystemResizePending", "status": "True",
            "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node."
        }));
    }
    c
}

/// A running pod on the node mounting the claim as volume `data`.
fn pod(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "test", "uid": uid},
        "spec": {"nodeName": NODE,
                 "containers": [{"name": "c", "image": "i",
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "claim-x"}}]},
        "status": {"phase": "Running"}
    })
}

struct Cluster {
    env: Env,
    k: RealCluster,
    driver: Driver,
}

impl Cluster {
    /// The server with the StorageClass, the volume and its claim bound
    /// (`status.capacity` 320Mi), and the driver; `None` (the test skips)
    /// where the real binaries cannot be had outside CI.
    fn new() -> Option<Self> {
        let k = RealCluster::start(NODE, &["test"])?;
        k.apply(&storage_class());
        k.apply(&pv("320Mi"));
        k.apply(&claim(false));
        k.server.bind("test", "claim-x", "pv-x");
        // The binding wrote its own capacity: the claim's as it was.
        k.set_status(
            "pvc",
            "test",
            "claim-x",
            &json!({"capacity": {"storage": "320Mi"}}),
        );
        let env = Env::new();
        let mut driver = Driver::new(&env, DRIVER);
        driver.start();
        Some(Self { env, k, driver })
    }

    /// Applies `obj` as the admin (its status through the subresource).
    fn apply(&self, obj: Value) {
        self.k.apply(&obj);
    }

    /// Creates `pod`; its UID.
    fn create_pod(&self, pod: Value) -> String {
        self.k.create_pod(&pod)
    }

    fn start_agent(&self) -> Agent {
        let flag = self.driver.flag();
        self.env.start_agent_without_manifests(&[
            "--kubeconfig",
            self.k.kubeconfig.to_str().unwrap(),
            "--node-name",
            NODE,
            "--csi-driver",
            flag.as_str(),
        ])
    }

    /// `ROOT/pods/<uid>/volumes/kubernetes.io~csi/pv-x/mount`.
    fn publish_path(&self, uid: &str) -> PathBuf {
        self.env
            .root
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~csi/pv-x/mount")
    }

    fn mounted(&self, uid: &str, agent: &Agent) {
        assert_eq!(self.env.wait_pod(uid, 90.0), 0, "{}", agent.log());
    }

    /// The claim's status once the agent patched it, checked as the
    /// kubelet's `MarkNodeExpansionFinishedWithRecovery` leaves it.
    fn assert_claim_finished(&self) {
        let status = || self.k.get("pvc", "test", "claim-x")["status"].clone();
        wait_for("the claim's status.capacity patched", || {
            status()["capacity"]["storage"] == json!("640Mi")
        });
        let s = status();
        assert!(
            s["allocatedResourceStatuses"].get("storage").is_none(),
            "{s}"
        );
        // (The server stores the unset times as null.)
        let conditions: Vec<(&Value, &Value)> = s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| (&c["type"], &c["status"]))
            .collect();
        assert_eq!(
            conditions,
            [(&json!("ModifyingVolume"), &json!("True"))],
            "FileSystemResizePending removed, the others kept: {s}"
        );
        assert_eq!(s["allocatedResources"]["storage"], json!("640Mi"));
        // One write of the claim by the node: a patch of its status,
        // which NodeRestriction let through.
        let writes: Vec<_> = self
            .k
            .node_requests()
            .into_iter()
            .filter(|a| {
                a.resource.starts_with("persistentvolumeclaims")
                    && !matches!(a.verb.as_str(), "get" | "list" | "watch")
            })
            .collect();
        assert_eq!(writes.len(), 1, "{writes:#?}");
        let w = &writes[0];
        assert_eq!(
            (w.verb.as_str(), w.resource.as_str(), w.code),
            ("patch", "persistentvolumeclaims/status", 200),
            "{w:?}"
        );
        assert_eq!(
            w.uri.trim_end_matches('?'),
            "/api/v1/namespaces/test/persistentvolumeclaims/claim-x/status"
        );
        self.k.assert_node_refused_nothing();
    }

    /// The pod gone: unpublished, unstaged, nothing left.
    fn remove_pod(&self, name: &str, uid: &str, unstages: usize) {
        self.k.delete("pod", "test", name);
        wait_for("unstaged", || {
            self.driver.count("NodeUnstageVolume", HANDLE, "OK") == unstages
        });
        self.env.wait_for("pod directory removed", || {
            !self.env.root.join("pods").join(uid).exists()
        });
    }

    fn assert_nothing_leaked(&self) {
        wait_for("every mount under ROOT gone", || {
            self.env.mounts().is_empty()
        });
        wait_for("the driver's loop devices detached", || {
            self.driver.loop_devices().is_empty()
        });
        self.env.assert_outside_untouched();
    }
}

fn size(p: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(p).unwrap();
    s.blocks() as u64 * s.fragment_size() as u64
}

/// The kubelet's `expandVolumeDuringMount`: a claim expanded while no pod
/// used it is grown when the next pod mounts it (NodeExpandVolume after
/// the publish, before the pod is told the volume is mounted: `volmgr
/// wait` returns only then), and its status patched.
#[test]
fn claim_expanded_while_unused_grows_at_the_next_mount() {
    isolated(
        "claim_expanded_while_unused_grows_at_the_next_mount",
        || {
            let Some(c) = Cluster::new() else { return };
            let uid1 = c.create_pod(pod("p1", ""));
            let uid1 = uid1.as_str();
            let agent = c.start_agent();
            c.mounted(uid1, &agent);
            let path = c.publish_path(uid1);
            assert!(size(&path) <= SMALL, "{}", size(&path));
            std::fs::write(path.join("keep"), b"data").unwrap();
            c.remove_pod("p1", uid1, 1);

            // Expanded with no pod using it: nothing to do on the node yet.
            // (The claim first, as the resizer's order leaves it: the PV's new
            // capacity is what the node acts on.)
            c.apply(claim(true));
            c.apply(pv("640Mi"));
            let uid2 = c.create_pod(pod("p2", ""));
            let uid2 = uid2.as_str();
            c.mounted(uid2, &agent);
            let path = c.publish_path(uid2);
            // Grown before the pod was told it is mounted.
            assert!(size(&path) > 500 << 20, "{}", size(&path));
            assert_eq!(std::fs::read(path.join("keep")).unwrap(), b"data");
            c.driver.expect("NodeExpandVolume", HANDLE, "OK", 1);
            c.assert_claim_finished();
            c.remove_pod("p2", uid2, 2);
            c.driver.expect("NodeExpandVolume", HANDLE, "OK", 1);
            c.assert_nothing_leaked();
            drop(agent);
        },
    );
}

/// Online: a mounted volume whose PV grows is expanded in place, and the
/// claim's status patched.
#[test]
fn mounted_claim_grows_online_and_its_status_is_patched() {
    isolated(
        "mounted_claim_grows_online_and_its_status_is_patched",
        || {
            let Some(c) = Cluster::new() else { return };
            let uid1 = c.create_pod(pod("p1", ""));
            let uid1 = uid1.as_str();
            let agent = c.start_agent();
            c.mounted(uid1, &agent);
            let path = c.publish_path(uid1);
            assert!(size(&path) <= SMALL, "{}", size(&path));
            std::fs::write(path.join("keep"), b"data").unwrap();

            // The claim first: the PV's growth starts the expansion.
            c.apply(claim(true));
            c.apply(pv("640Mi"));
            wait_for("file system grown", || size(&path) > 500 << 20);
            c.driver.expect("NodeExpandVolume", HANDLE, "OK", 1);
            c.assert_claim_finished();
            // Grown in place: nothing staged or published again.
            c.driver.expect("NodeStageVolume", HANDLE, "OK", 1);
            c.driver.expect("NodePublishVolume", HANDLE, "OK", 1);
            assert_eq!(std::fs::read(path.join("keep")).unwrap(), b"data");
            c.remove_pod("p1", uid1, 1);
            c.assert_nothing_leaked();
            drop(agent);
        },
    );
}
