//! Never unpublish under a running container: the agent (manager mode, as
//! the node, on a REAL kube-apiserver) tears a pod's volumes down only once
//! the container runtime lists none of its containers running and none of
//! its sandboxes ready, as the kubelet waits for its pod workers
//! (`findAndRemoveDeletedPods` with `ShouldPodRuntimeBeRemoved`).
//!
//! The runtime is a real CRI server: `fake-cri` (the kubelet's fake runtime,
//! `k8s.io/cri-client`, built by `scripts/kube-binaries.sh`), driven by the
//! test over the CRI as a kubelet would drive it: a sandbox and a container
//! labelled with the pod's UID. The volume is a CSI volume on the real test
//! driver (staged and published): its journal shows NodeUnpublishVolume
//! and NodeUnstageVolume, and when.
//!
//! Before this (on `3e291d3`), `kubectl delete pod --force --grace-period=0`
//! unpublished and unstaged the volume at once, while the pod's container
//! still ran.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
#[path = "support/real_cluster.rs"]
mod real_cluster;
mod support;

use std::collections::HashMap;
use std::process::Child;

use csi_driver::{wait_for, Driver};
use real_cluster::RealCluster;
use serde_json::{json, Value};
use support::{isolated, Agent, Env};
use volmgr::cri::proto as cri;
use volmgr::cri::{RuntimeClient, RuntimeEndpoint};

const DRIVER: &str = "loop.csi.volmgr.dev";
const NODE: &str = "node-1";
const HANDLE: &str = "vol-r";

/// The volume (ext4 on the driver's loop device) and its claim.
fn volume_and_claim(k: &RealCluster) {
    k.apply(&json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-r"},
        "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "",
                 "csi": {"driver": DRIVER, "volumeHandle": HANDLE, "fsType": "ext4",
                         "volumeAttributes": {"size": "64Mi"}}}
    }));
    k.apply(&json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "test"},
        "spec": {"volumeName": "pv-r", "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "resources": {"requests": {"storage": "64Mi"}}}
    }));
    k.server.bind("test", "data", "pv-r");
}

/// A running pod mounting the claim.
fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "test"},
        "spec": {"nodeName": NODE,
                 "containers": [{"name": "c", "image": "i",
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
        "status": {"phase": "Running"}
    })
}

/// The node: server, driver, runtime, agent.
struct Node {
    agent: Option<Agent>,
    cri: Option<Child>,
    runtime: RuntimeClient,
    rt: tokio::runtime::Runtime,
    driver: Driver,
    k: RealCluster,
    env: Env,
}

impl Node {
    fn start() -> Option<Self> {
        let k = RealCluster::start(NODE, &["test"])?;
        volume_and_claim(&k);
        let env = Env::new();
        let mut driver = Driver::new(&env, DRIVER);
        driver.start();
        let dir = env.dir.path().join("runtime");
        let cri = volmgr_kube::testing::kubelet::fake_cri(&k.server, &dir);
        let endpoint = format!("unix://{}", dir.join("cri.sock").display());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let runtime = {
            let _in = rt.enter();
            RuntimeClient::new(RuntimeEndpoint::parse(&endpoint).unwrap())
        };
        let agent = env.start_agent_without_manifests(&[
            "--kubeconfig",
            k.kubeconfig.to_str().unwrap(),
            "--node-name",
            NODE,
            "--csi-driver",
            &driver.flag(),
            "--container-runtime-endpoint",
            &endpoint,
        ]);
        Some(Self {
            agent: Some(agent),
            cri: Some(cri),
            runtime,
            rt,
            driver,
            k,
            env,
        })
    }

    /// Starts pod `name`'s sandbox and one container in the runtime, as
    /// the kubelet would (labelled with the pod's UID): (sandbox, container).
    fn run_in_runtime(&self, name: &str, uid: &str) -> (String, String) {
        let labels = HashMap::from([("io.kubernetes.pod.uid".to_string(), uid.to_string())]);
        let sandbox_config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: "test".into(),
                attempt: 0,
            }),
            // fake-cri refuses containers without an absolute log path.
            log_directory: self
                .env
                .dir
                .path()
                .join("runtime/logs")
                .display()
                .to_string(),
            labels: labels.clone(),
            ..Default::default()
        };
        let mut c = self.runtime.raw();
        self.rt.block_on(async {
            let sandbox = c
                .run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(sandbox_config.clone()),
                    runtime_handler: String::new(),
                })
                .await
                .unwrap()
                .into_inner()
                .pod_sandbox_id;
            let container = c
                .create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: sandbox.clone(),
                    config: Some(cri::ContainerConfig {
                        metadata: Some(cri::ContainerMetadata {
                            name: "c".into(),
                            attempt: 0,
                        }),
                        image: Some(cri::ImageSpec {
                            image: "i".into(),
                            ..Default::default()
                        }),
                        labels,
                        log_path: "c/0.log".into(),
                        ..Default::default()
                    }),
                    sandbox_config: Some(sandbox_config),
                })
                .await
                .unwrap()
                .into_inner()
                .container_id;
            c.start_container(cri::StartContainerRequest {
                container_id: container.clone(),
            })
            .await
            .unwrap();
            (sandbox, container)
        })
    }

    fn stop_container(&self, id: &str) {
        let mut c = self.runtime.raw();
        self.rt
            .block_on(c.stop_container(cri::StopContainerRequest {
                container_id: id.into(),
                timeout: 0,
            }))
            .unwrap();
    }

    fn stop_sandbox(&self, id: &str) {
        let mut c = self.runtime.raw();
        self.rt
            .block_on(c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .unwrap();
    }

    /// What status says about `test/<name>` (the source's note), if anything.
    fn note(&self, name: &str) -> String {
        let key = format!("test/{name}");
        self.env
            .status()
            .errors
            .iter()
            .filter(|e| e.source == key)
            .map(|e| e.error.clone())
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// No NodeUnpublishVolume nor NodeUnstageVolume yet, and the pod's
    /// volume still mounted.
    fn assert_still_mounted(&self, uid: &str) {
        assert_eq!(self.driver.calls_of("NodeUnpublishVolume").len(), 0);
        assert_eq!(self.driver.calls_of("NodeUnstageVolume").len(), 0);
        let target = self.env.csi_publish_path(uid, "pv-r");
        assert_eq!(self.env.mount_count(&target), 1, "{}", target.display());
    }

    fn agent_log(&self) -> String {
        self.agent.as_ref().map(Agent::log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(a) = self.agent.take() {
            a.term();
        }
        if let Some(mut c) = self.cri.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `kubectl delete pod --force --grace-period=0` while the pod's container
/// runs: the API object is gone at once, the volume stays published and
/// staged (status says why) while the runtime lists the container, and
/// while it lists the sandbox ready; once both stopped, NodeUnpublishVolume
/// then NodeUnstageVolume, and nothing is left.
#[test]
fn force_deleted_pod_keeps_its_volume_until_its_containers_stop() {
    isolated(
        "force_deleted_pod_keeps_its_volume_until_its_containers_stop",
        || {
            let Some(n) = Node::start() else { return };
            let uid = n.k.create_pod(&pod("app"));
            assert_eq!(n.env.wait_pod(&uid, 90.0), 0, "{}", n.agent_log());
            let (sandbox, container) = n.run_in_runtime("app", &uid);
            n.k.delete("pod", "test", "app");
            wait_for("status: waiting for the container", || {
                n.note("app").contains("1 container(s) not exited")
            });
            n.assert_still_mounted(&uid);
            n.stop_container(&container);
            wait_for("status: waiting for the sandbox", || {
                n.note("app")
                    .contains("0 container(s) not exited, 1 sandbox(es) ready")
            });
            n.assert_still_mounted(&uid);
            n.stop_sandbox(&sandbox);
            wait_for("unstaged", || {
                n.driver.count("NodeUnstageVolume", HANDLE, "OK") == 1
            });
            // Unpublished first, then unstaged; the note gone.
            let order: Vec<String> = n
                .driver
                .calls()
                .iter()
                .filter_map(|c| c["method"].as_str().map(str::to_string))
                .filter(|m| m.starts_with("NodeUn"))
                .collect();
            assert_eq!(order, ["NodeUnpublishVolume", "NodeUnstageVolume"]);
            n.env.wait_for("pod directory removed", || {
                !n.env.root.join("pods").join(&uid).exists()
            });
            assert_eq!(n.note("app"), "");
            n.k.assert_node_refused_nothing();
        },
    );
}

/// The runtime does not answer (its socket gone): the deleted pod's volume
/// stays and status says the runtime cannot be asked; the runtime back
/// (restarted: it lists nothing of the pod any more) → torn down.
#[test]
fn runtime_not_answering_keeps_the_volume_and_says_so() {
    isolated("runtime_not_answering_keeps_the_volume_and_says_so", || {
        let Some(mut n) = Node::start() else { return };
        let uid = n.k.create_pod(&pod("app"));
        assert_eq!(n.env.wait_pod(&uid, 90.0), 0, "{}", n.agent_log());
        n.run_in_runtime("app", &uid);
        let mut cri = n.cri.take().unwrap();
        cri.kill().unwrap();
        cri.wait().unwrap();
        n.k.delete("pod", "test", "app");
        wait_for("status: the runtime cannot be asked", || {
            let note = n.note("app");
            note.contains("says its containers stopped") && note.contains("ListContainers")
        });
        n.assert_still_mounted(&uid);
        let dir = n.env.dir.path().join("runtime");
        let _ = std::fs::remove_file(dir.join("cri.sock"));
        n.cri = Some(volmgr_kube::testing::kubelet::fake_cri(&n.k.server, &dir));
        wait_for("unstaged once the runtime answers", || {
            n.driver.count("NodeUnstageVolume", HANDLE, "OK") == 1
        });
        assert_eq!(n.note("app"), "");
    });
}
