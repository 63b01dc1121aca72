//! End-to-end tests of the Kubernetes API as the agent's source of pods:
//! the real agent, through kube-rs, each test in a private mount namespace.
//!
//! Where they run:
//! - against a REAL kube-apiserver and etcd (`support/real_cluster.rs`:
//!   Node,RBAC authorization, NodeRestriction, an audit log), the agent as
//!   the node itself (`system:node:node-a`), every test that needs nothing
//!   but what a real server does: pods and the objects they read, claims
//!   bound late, deleted Secrets, missing ConfigMaps (the FailedMount
//!   event), CSIDrivers, ClusterTrustBundles, local PVs' node affinity, the
//!   Node's allocatable, static pods alongside, subPaths waiting for init
//!   containers. Each ends with 0 requests of the node refused in the audit
//!   log (and no Secret or ConfigMap listed or watched but by name).
//! - against the in-process fake (`volmgr_kube::testing::FakeApiServer`)
//!   the hostile modes a real server cannot be made to play: an outage
//!   (503 to everything, watches cut) and a compaction (`410 Gone`) at a
//!   chosen moment (`api_outage_and_relist_after_410`,
//!   `api_restart_after_kill9_remounts_nothing`); credentials that may not
//!   read ServiceAccounts, as older clusters' Node authorizer, and a
//!   ServiceAccount replaced under the same name whose tokens tell which
//!   account they were minted for
//!   (`api_service_account_replaced_gets_a_fresh_token`).

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/real_cluster.rs"]
mod real_cluster;
mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use real_cluster::RealCluster;
use serde_json::{json, Value};
use support::{isolated, Agent, Env};
use volmgr_kube::testing::FakeApiServer;

const NODE: &str = "node-a";

/// A pod bound to `node` with the given volumes, each mounted by its one
/// container.
fn pod(name: &str, uid: &str, node: &str, volumes: Value) -> Value {
    let mounts: Vec<Value> = volumes
        .as_array()
        .unwrap()
        .iter()
        .map(|v| json!({"name": v["name"], "mountPath": format!("/m/{}", v["name"].as_str().unwrap())}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "test", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i", "volumeMounts": mounts}],
                 "volumes": volumes},
        "status": {"phase": "Running"}
    })
}

fn memory_pod(name: &str, uid: &str, node: &str) -> Value {
    pod(
        name,
        uid,
        node,
        json!([{"name": "scratch", "emptyDir": {"medium": "Memory"}}]),
    )
}

/// What the tests do with the agent and its ROOT, on either server.
trait Node {
    fn env(&self) -> &Env;
    fn kubeconfig(&self) -> &Path;

    /// The agent on the API alone (no `--manifests`).
    fn start_agent(&self) -> Agent {
        self.env().start_agent_without_manifests(&[
            "--kubeconfig",
            self.kubeconfig().to_str().unwrap(),
            "--node-name",
            NODE,
        ])
    }

    fn scratch(&self, uid: &str) -> PathBuf {
        self.env().empty_dir(uid, "scratch")
    }

    fn state(&self, uid: &str, vol: &str) -> Option<String> {
        self.env().volume_state(uid, vol).map(|s| s.0)
    }

    fn wait_mounted(&self, uid: &str, vol: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.env().volume_state(uid, vol);
            if s.as_ref().is_some_and(|s| s.0 == "mounted") {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "gave up waiting for {uid}/{vol} mounted; last state {s:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_gone(&self, uid: &str) {
        let dir = self.env().root.join("pods").join(uid);
        self.env()
            .wait_for(&format!("pod {uid} torn down"), || !dir.exists());
    }
}

/// The agent on the fake API server.
struct Cluster {
    env: Env,
    api: FakeApiServer,
    kubeconfig: PathBuf,
}

impl Node for Cluster {
    fn env(&self) -> &Env {
        &self.env
    }
    fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
}

/// The agent on the real API server, as `system:node:node-a`; namespace
/// `test`.
struct Real {
    env: Env,
    k: RealCluster,
}

impl Node for Real {
    fn env(&self) -> &Env {
        &self.env
    }
    fn kubeconfig(&self) -> &Path {
        &self.k.kubeconfig
    }
}

impl Real {
    /// `None` (the test skips) where the real binaries cannot be had
    /// outside CI.
    fn new() -> Option<Self> {
        let k = RealCluster::start(NODE, &["test"])?;
        Some(Self { env: Env::new(), k })
    }

    fn apply(&self, obj: Value) {
        self.k.apply(&obj);
    }

    /// Creates `pod`; its UID (the server's).
    fn pod(&self, pod: Value) -> String {
        self.k.create_pod(&pod)
    }
}

impl Cluster {
    fn new() -> Self {
        let env = Env::new();
        let api = FakeApiServer::start();
        let kubeconfig = api.write_kubeconfig(env.dir.path());
        Self {
            env,
            api,
            kubeconfig,
        }
    }

    /// No request was refused by the node authorizer, and every list or
    /// watch of secrets or configmaps named its object.
    fn assert_node_authorizer_content(&self) {
        for r in self.api.requests() {
            assert_ne!(r.status, 403, "refused: {r:?}");
            if r.method == "GET"
                && (r.path.ends_with("/secrets") || r.path.ends_with("/configmaps"))
            {
                assert!(r.query.contains("metadata.name"), "{r:?}");
            }
        }
    }
}

/// A pod bound to this node is mounted, another node's is ignored; a
/// configMap volume follows its object; a claim bound late is mounted once
/// bound; a pod that succeeded is torn down; and the real server refused
/// the node nothing.
#[test]
fn api_pods_are_mounted_and_follow_their_objects() {
    isolated("api_pods_are_mounted_and_follow_their_objects", || {
        let Some(c) = Real::new() else { return };
        c.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": "test"}, "data": {"mode": "one"}}));
        let uid = c.pod(pod(
            "mine",
            "",
            NODE,
            json!([{"name": "scratch", "emptyDir": {"medium": "Memory"}},
                   {"name": "conf", "configMap": {"name": "settings"}}]),
        ));
        let uid = uid.as_str();
        let theirs = c.pod(memory_pod("theirs", "", "node-b"));
        let _agent = c.start_agent();
        c.wait_mounted(uid, "scratch");
        c.wait_mounted(uid, "conf");
        assert_eq!(c.env.mount_count(&c.scratch(uid)), 1);
        let conf = c
            .env
            .root
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~configmap/conf/mode");
        assert_eq!(std::fs::read_to_string(&conf).unwrap(), "one");
        let read_only = |vol: &str| {
            let s = c.env.status();
            let p = s.pods.iter().find(|p| p.uid == uid).unwrap();
            p.volumes.iter().find(|v| v.name == vol).unwrap().read_only
        };
        assert!(read_only("conf"), "a configMap volume is read-only");
        assert!(!read_only("scratch"));
        assert!(
            !c.env.root.join("pods").join(&theirs).exists(),
            "another node's pod was set up"
        );

        // The configMap changes: the file follows.
        c.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": "test"}, "data": {"mode": "two"}}));
        c.env.wait_for("configMap update in the volume", || {
            std::fs::read_to_string(&conf).ok().as_deref() == Some("two")
        });

        // A claim bound after the pod arrives.
        c.apply(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "test"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "resources": {"requests": {"storage": "1Gi"}}}}));
        let claimer = c.pod(pod(
            "claimer",
            "",
            NODE,
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]),
        ));
        let claimer = claimer.as_str();
        c.env.wait_for("the unbound claim reported", || {
            c.env
                .volume_state(claimer, "data")
                .is_some_and(|(state, _, _)| state != "mounted")
        });
        std::thread::sleep(Duration::from_millis(300));
        assert_ne!(c.state(claimer, "data").as_deref(), Some("mounted"));
        let host = c.env.dir.path().join("host-data");
        std::fs::create_dir_all(&host).unwrap();
        c.apply(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-data"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": "", "hostPath": {"path": host.to_str().unwrap()}}}));
        c.k.server.bind("test", "data", "pv-data");
        c.wait_mounted(claimer, "data");

        // The first pod's phase becomes Succeeded: its volumes go.
        c.k.set_status("pod", "test", "mine", &json!({"phase": "Succeeded"}));
        c.wait_gone(uid);
        assert_eq!(c.env.mount_count(&c.scratch(uid)), 0);
        c.k.assert_node_refused_nothing();
        c.env.assert_outside_untouched();
    });
}

/// Issue 28 item 5 through the API: an optional Secret deleted while a
/// pod uses it leaves the volume (the kubelet writes the payload without
/// it); a non-optional one keeps its files and the error shows on the
/// pod's volume.
#[test]
fn api_deleted_optional_secret_leaves_the_volume() {
    isolated("api_deleted_optional_secret_leaves_the_volume", || {
        let Some(c) = Real::new() else { return };
        c.apply(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "test"}, "data": {"password": "b3B0LXNlY3JldA=="}}));
        c.apply(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s2", "namespace": "test"}, "data": {"password": "cmVxLXNlY3JldA=="}}));
        let uid = c.pod(pod(
            "del",
            "",
            NODE,
            json!([{"name": "opt", "secret": {"secretName": "s", "optional": true}},
                   {"name": "req", "secret": {"secretName": "s2"}}]),
        ));
        let uid = uid.as_str();
        let _agent = c.start_agent();
        c.wait_mounted(uid, "opt");
        c.wait_mounted(uid, "req");
        let vol = |name: &str| {
            c.env
                .root
                .join("pods")
                .join(uid)
                .join("volumes/kubernetes.io~secret")
                .join(name)
        };
        let read = |p: PathBuf| std::fs::read_to_string(p).ok();
        assert_eq!(
            read(vol("opt").join("password")).as_deref(),
            Some("opt-secret")
        );

        c.k.delete("secret", "test", "s");
        c.env.wait_for("optional secret gone", || {
            std::fs::read_dir(vol("opt")).unwrap().count() == 2
        });
        let left: Vec<String> = std::fs::read_dir(vol("opt"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "..data")
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(
            std::fs::read_dir(vol("opt").join(&left[0]))
                .unwrap()
                .count(),
            0
        );
        assert_eq!(c.state(uid, "opt").as_deref(), Some("mounted"));

        c.k.delete("secret", "test", "s2");
        c.env.wait_for("error on the volume", || {
            c.env
                .volume_state(uid, "req")
                .and_then(|(_, _, e)| e)
                .is_some_and(|e| e.contains("Secret test/s2 not found"))
        });
        assert_eq!(
            read(vol("req").join("password")).as_deref(),
            Some("req-secret")
        );
        assert_eq!(c.state(uid, "req").as_deref(), Some("mounted"));
        c.k.assert_node_refused_nothing();
    });
}

/// While the API server is down (503, watches cut) nothing is torn down;
/// a pod created meanwhile is mounted after recovery. A compaction (410 on
/// the next watch) while a pod is deleted without the watch seeing it: the
/// relist tears that pod down and mounts nothing twice.
#[test]
fn api_outage_and_relist_after_410() {
    isolated("api_outage_and_relist_after_410", || {
        let c = Cluster::new();
        let a = "d4444444-0000-0000-0000-000000000004";
        let b = "e5555555-0000-0000-0000-000000000005";
        let k = "f6666666-0000-0000-0000-000000000006";
        c.api.apply(memory_pod("a", a, NODE));
        c.api.apply(memory_pod("keep", k, NODE));
        let _agent = c.start_agent();
        c.wait_mounted(a, "scratch");
        c.wait_mounted(k, "scratch");

        c.api.set_unavailable(true);
        c.api.apply(memory_pod("b", b, NODE));
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(
            c.env.mount_count(&c.scratch(a)),
            1,
            "torn down during an outage"
        );
        c.api.set_unavailable(false);
        c.wait_mounted(b, "scratch");
        assert!(
            c.api.requests().iter().any(|r| r.status == 503),
            "the outage was not seen"
        );

        // Deleted while the watch misses it, then the history compacted.
        c.api.delete("Pod", "test", "a", true);
        c.api.expire_watches();
        c.wait_gone(a);
        for uid in [b, k] {
            assert_eq!(c.env.mount_count(&c.scratch(uid)), 1, "{uid}");
            assert_eq!(c.state(uid, "scratch").as_deref(), Some("mounted"));
        }
        c.assert_node_authorizer_content();
    });
}

/// kill -9 of the agent, then a restart while the API server is down:
/// nothing is torn down (the desired state is not populated without a
/// list); once it is back, nothing is remounted.
#[test]
fn api_restart_after_kill9_remounts_nothing() {
    isolated("api_restart_after_kill9_remounts_nothing", || {
        let c = Cluster::new();
        let uid = "a7777777-0000-0000-0000-000000000007";
        c.api.apply(memory_pod("p", uid, NODE));
        let agent = c.start_agent();
        c.wait_mounted(uid, "scratch");
        let marker = c.scratch(uid).join("data");
        std::fs::write(&marker, "kept").unwrap();
        agent.kill9();

        c.api.set_unavailable(true);
        let agent = c.start_agent();
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(
            c.env.mount_count(&c.scratch(uid)),
            1,
            "torn down without a list"
        );
        c.api.set_unavailable(false);
        c.env.wait_synced();
        c.wait_mounted(uid, "scratch");
        assert_eq!(c.env.mount_count(&c.scratch(uid)), 1, "mounted twice");
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "kept");

        // The pod is deleted for good (a DELETED event): torn down.
        c.api.delete("Pod", "test", "p", false);
        c.wait_gone(uid);
        assert!(agent.term());
    });
}

/// A pod whose configMap does not exist: the volume fails, a `FailedMount`
/// event (events.k8s.io/v1) names the missing object on the pod; once the
/// configMap is created, the volume is mounted with its data.
#[test]
fn api_missing_config_map_is_a_failed_mount_then_mounted() {
    isolated(
        "api_missing_config_map_is_a_failed_mount_then_mounted",
        || {
            let Some(c) = Real::new() else { return };
            let uid = c.pod(pod(
                "waits",
                "",
                NODE,
                json!([{"name": "conf", "configMap": {"name": "later"}}]),
            ));
            let uid = uid.as_str();
            let _agent = c.start_agent();
            let found = || {
                c.k.events("test").iter().any(|e| {
                    e["reason"] == "FailedMount"
                        && e["regarding"]["uid"] == uid
                        && e["note"].as_str().is_some_and(|n| n.contains("later"))
                })
            };
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !found() {
                if std::time::Instant::now() > deadline {
                    panic!(
                        "no FailedMount event: stored {:?}, volume {:?}",
                        c.k.events("test"),
                        c.env.volume_state(uid, "conf")
                    );
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            assert_ne!(c.state(uid, "conf").as_deref(), Some("mounted"));
            c.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "later", "namespace": "test"}, "data": {"k": "v"}}));
            c.wait_mounted(uid, "conf");
            let file = c
                .env
                .root
                .join("pods")
                .join(uid)
                .join("volumes/kubernetes.io~configmap/conf/k");
            assert_eq!(std::fs::read_to_string(file).unwrap(), "v");
            c.k.assert_node_refused_nothing();
        },
    );
}

/// A pod's CSI driver's CSIDriver object is watched by name (cluster
/// scoped) and its changes re-resolve the pod: a driver that does not list
/// `Ephemeral` gets no inline volume until its object says it may (the
/// real server keeps `volumeLifecycleModes` immutable: the object is
/// deleted and created again).
#[test]
fn api_csidriver_is_followed_by_name() {
    isolated("api_csidriver_is_followed_by_name", || {
        let Some(c) = Real::new() else { return };
        let csidriver = |modes: Value| {
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                   "metadata": {"name": "inline.example.com"},
                   "spec": {"attachRequired": false, "volumeLifecycleModes": modes}})
        };
        c.apply(csidriver(json!(["Persistent"])));
        let uid = c.pod(pod(
            "inline",
            "",
            NODE,
            json!([{"name": "x", "csi": {"driver": "inline.example.com"}}]),
        ));
        let uid = uid.as_str();
        let _agent = c.start_agent();
        let error = || c.env.volume_state(uid, "x").and_then(|s| s.2);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !error().is_some_and(|e| e.contains("does not support inline")) {
            assert!(
                std::time::Instant::now() < deadline,
                "inline volume not refused: {:?}",
                error(),
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        c.k.delete("csidriver", "", "inline.example.com");
        c.apply(csidriver(json!(["Persistent", "Ephemeral"])));
        c.env
            .wait_for("inline volume accepted, waiting for its driver", || {
                error().is_some_and(|e| {
                    e.contains("inline.example.com") && !e.contains("does not support")
                })
            });
        let reqs = c.k.node_requests();
        assert!(
            reqs.iter().any(|a| a.resource == "csidrivers"
                && matches!(a.verb.as_str(), "list" | "watch")
                && a.uri.contains("metadata.name%3Dinline.example.com")),
            "{:#?}",
            reqs.iter()
                .filter(|a| a.resource == "csidrivers")
                .collect::<Vec<_>>()
        );
        c.k.assert_node_refused_nothing();
    });
}

/// A pod's projected token comes from TokenRequest for its ServiceAccount,
/// which is read by `get` again within a minute: when the account is
/// deleted and created again (a new UID; the API server refuses tokens
/// bound to the old one), the token is requested again and rewritten at
/// the next read. Credentials that may
/// not read ServiceAccounts (older clusters' node authorizer) still get the
/// pod mounted, its token requested as the kubelet does.
#[test]
fn api_service_account_replaced_gets_a_fresh_token() {
    isolated("api_service_account_replaced_gets_a_fresh_token", || {
        let account = |uid: &str| {
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "builder", "namespace": "test", "uid": uid}})
        };
        let uid = "ad000000-0000-0000-0000-00000000000d";
        let mut p = pod(
            "tokens",
            uid,
            NODE,
            json!([{"name": "api", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]}}]),
        );
        p["spec"]["serviceAccountName"] = json!("builder");
        let token_of = |c: &Cluster| {
            let f = c
                .env
                .root
                .join("pods")
                .join(uid)
                .join("volumes/kubernetes.io~projected/api/token");
            std::fs::read_to_string(f).ok()
        };

        let c = Cluster::new();
        c.api.apply(account("sa-1"));
        c.api.apply(p.clone());
        let agent = c.start_agent();
        c.wait_mounted(uid, "api");
        let first = token_of(&c).unwrap();
        assert!(first.starts_with("tok-builder-sa-1-"), "{first}");
        c.api.delete("ServiceAccount", "test", "builder", false);
        c.api.apply(account("sa-2"));
        // Read by `get` (the Node authorizer allows nothing else), again
        // at most a minute after the last read of an unchanged account.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(150);
        while !token_of(&c).is_some_and(|t| t.starts_with("tok-builder-sa-2-")) {
            assert!(
                std::time::Instant::now() < deadline,
                "no token of the new account"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(c
            .api
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/serviceaccounts/builder")));
        c.assert_node_authorizer_content();
        drop(agent);

        let c = Cluster::new();
        c.api.refuse_reads_of("serviceaccounts");
        c.api.apply(account("sa-1"));
        c.api.apply(p);
        let _agent = c.start_agent();
        c.wait_mounted(uid, "api");
        let token = token_of(&c).unwrap();
        assert!(token.starts_with("tok-builder-sa-1-"), "{token}");
        assert_eq!(c.api.tokens_issued(), 1, "one token, one request");
    });
}

/// Projected `clusterTrustBundle` sources, by name and by signer and
/// labels, from one cluster-wide watch of the bundles: the files hold the
/// selected certificates (real ones: the server parses them) and follow a
/// bundle added later.
#[test]
fn api_cluster_trust_bundles_by_name_and_signer() {
    isolated("api_cluster_trust_bundles_by_name_and_signer", || {
        let Some(c) = Real::new() else { return };
        // Real CA certificates: the server refuses others in a bundle.
        let cert = |cn: &str| volmgr_kube::testing::real::Ca::new(cn).pem();
        let (plain, one, dev, two) = (cert("plain"), cert("one"), cert("dev"), cert("two"));
        let bundle = |name: &str, signer: Option<&str>, env: &str, pem: &str| {
            json!({"apiVersion": "certificates.k8s.io/v1", "kind": "ClusterTrustBundle",
                   "metadata": {"name": name, "labels": {"env": env}},
                   "spec": {"signerName": signer, "trustBundle": pem}})
        };
        c.apply(bundle("plain", None, "any", &plain));
        c.apply(bundle(
            "example.com:ca:one",
            Some("example.com/ca"),
            "prod",
            &one,
        ));
        c.apply(bundle(
            "example.com:ca:dev",
            Some("example.com/ca"),
            "dev",
            &dev,
        ));
        let uid = c.pod(pod(
            "bundles",
            "",
            NODE,
            json!([{"name": "trust", "projected": {"sources": [
                {"clusterTrustBundle": {"name": "plain", "path": "plain.pem"}},
                {"clusterTrustBundle": {"signerName": "example.com/ca", "path": "ca.pem",
                    "labelSelector": {"matchLabels": {"env": "prod"}}}}]}}]),
        ));
        let uid = uid.as_str();
        let agent = c.start_agent();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while c.state(uid, "trust").as_deref() != Some("mounted") {
            if std::time::Instant::now() > deadline {
                panic!(
                    "trust not mounted: {:?}\n{:#?}\n{}",
                    c.env.volume_state(uid, "trust"),
                    c.k.node_requests()
                        .iter()
                        .filter(|a| a.resource == "clustertrustbundles")
                        .collect::<Vec<_>>(),
                    volmgr_kube::testing::real::tail(&agent.log(), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let dir = c
            .env
            .root
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~projected/trust");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        // The certificates a file holds, whatever their order.
        let certs = |pem: &str| {
            let mut v: Vec<String> = pem
                .split("-----END CERTIFICATE-----")
                .map(|b| b.split_whitespace().collect::<String>())
                .filter(|b| !b.is_empty())
                .collect();
            v.sort();
            v
        };
        let of = |pems: &[&str]| {
            let mut v: Vec<String> = pems.iter().flat_map(|p| certs(p)).collect();
            v.sort();
            v
        };
        assert_eq!(certs(&read("plain.pem")), of(&[&plain]));
        assert_eq!(certs(&read("ca.pem")), of(&[&one]));
        c.apply(bundle(
            "example.com:ca:two",
            Some("example.com/ca"),
            "prod",
            &two,
        ));
        c.env
            .wait_for("the new bundle's certificate in the file", || {
                certs(&read("ca.pem")) == of(&[&one, &two])
            });
        assert!(c
            .k
            .node_requests()
            .iter()
            .any(|a| a.resource == "clustertrustbundles" && a.verb == "list"));
        c.k.assert_node_refused_nothing();
    });
}

/// Local PersistentVolumes' node affinity is checked against this node's
/// Node object, watched by name: a PV for another node is refused, one
/// whose terms match the node's labels is mounted.
#[test]
fn api_local_pv_node_affinity_uses_the_node_object() {
    isolated("api_local_pv_node_affinity_uses_the_node_object", || {
        let Some(c) = Real::new() else { return };
        c.apply(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "zone": "a"}}}));
        let mut uids = Vec::new();
        for zone in ["a", "b"] {
            let host = c.env.dir.path().join(format!("local-{zone}"));
            std::fs::create_dir_all(&host).unwrap();
            c.apply(json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": format!("local-{zone}")},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "storageClassName": "",
                         "local": {"path": host.to_str().unwrap()},
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions":
                             [{"key": "zone", "operator": "In", "values": [zone]}]}]}}}}));
            c.apply(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": format!("claim-{zone}"), "namespace": "test"},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": format!("local-{zone}"),
                         "storageClassName": "",
                         "resources": {"requests": {"storage": "1Gi"}}}}));
            c.k.server
                .bind("test", &format!("claim-{zone}"), &format!("local-{zone}"));
            uids.push(c.pod(pod(
                &format!("local-{zone}"),
                "",
                NODE,
                json!([{"name": "data", "persistentVolumeClaim": {"claimName": format!("claim-{zone}")}}]),
            )));
        }
        let _agent = c.start_agent();
        c.wait_mounted(&uids[0], "data");
        c.env.wait_for("the other zone's PV refused", || {
            c.env
                .volume_state(&uids[1], "data")
                .and_then(|s| s.2)
                .is_some_and(|e| e.contains("node affinity does not match"))
        });
        let reqs = c.k.node_requests();
        assert!(
            reqs.iter().any(|a| a.resource == "nodes"
                && matches!(a.verb.as_str(), "list" | "watch")
                && a.uri.contains("metadata.name%3Dnode-a")),
            "{:#?}",
            reqs.iter()
                .filter(|a| a.resource == "nodes")
                .collect::<Vec<_>>()
        );
        c.k.assert_node_refused_nothing();
    });
}

/// The Node object's allocatable stands in for what a pod does not say,
/// as in the kubelet: a downwardAPI limit the container leaves unset is
/// the node's allocatable (and follows it when it changes); a
/// memory-backed emptyDir without `sizeLimit` is sized to the node's
/// allocatable memory, or to the pod's memory limit when lower. Status
/// says the runtime may relabel both volumes for SELinux, not a hostPath.
#[test]
fn api_node_allocatable_sizes_memory_and_fills_the_downward_api() {
    isolated(
        "api_node_allocatable_sizes_memory_and_fills_the_downward_api",
        || {
            let Some(c) = Real::new() else { return };
            let node = |memory: &str| {
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                    "status": {"allocatable": {"cpu": "1500m", "memory": memory},
                               "capacity": {"cpu": "2", "memory": "1Gi"}}})
            };
            c.apply(node("96Mi"));
            let host = c.env.dir.path().join("host");
            std::fs::create_dir_all(&host).unwrap();
            let free = c.pod(pod(
                "free",
                "",
                NODE,
                json!([
                    {"name": "scratch", "emptyDir": {"medium": "Memory"}},
                    {"name": "info", "downwardAPI": {"items": [
                        {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"}},
                        {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}}]}},
                    {"name": "h", "hostPath": {"path": host.to_str().unwrap()}}
                ]),
            ));
            let free = free.as_str();
            let mut with_limit = pod(
                "limited",
                "",
                NODE,
                json!([{"name": "scratch", "emptyDir": {"medium": "Memory"}}]),
            );
            with_limit["spec"]["containers"][0]["resources"] =
                json!({"limits": {"memory": "32Mi"}});
            let limited = c.pod(with_limit);
            let limited = limited.as_str();
            let _agent = c.start_agent();
            for (uid, vol) in [
                (free, "scratch"),
                (free, "info"),
                (free, "h"),
                (limited, "scratch"),
            ] {
                c.wait_mounted(uid, vol);
            }
            let size = |uid: &str| {
                let dir = c.scratch(uid);
                c.env
                    .mounts()
                    .into_iter()
                    .find(|m| m.mount_point == dir)
                    .and_then(|m| m.super_option("size").map(str::to_string))
            };
            assert_eq!(
                size(free).as_deref(),
                Some("98304k"),
                "the node's allocatable"
            );
            assert_eq!(size(limited).as_deref(), Some("32768k"), "the pod's limit");
            let info = c
                .env
                .root
                .join("pods")
                .join(free)
                .join("volumes/kubernetes.io~downward-api/info");
            let read = |f: &str| std::fs::read_to_string(info.join(f)).ok();
            assert_eq!(read("cpu").as_deref(), Some("1500"));
            assert_eq!(read("mem").as_deref(), Some("96"));
            let status = c.env.status();
            let relabel = |uid: &str, vol: &str| {
                let p = status.pods.iter().find(|p| p.uid == uid).unwrap();
                p.volumes
                    .iter()
                    .find(|v| v.name == vol)
                    .unwrap()
                    .selinux_relabel
            };
            assert!(
                relabel(free, "scratch") && relabel(free, "info") && relabel(limited, "scratch")
            );
            assert!(!relabel(free, "h"), "hostPath: no");
            // The Node's allocatable changes: the file follows.
            c.apply(node("80Mi"));
            c.env
                .wait_for("the downward API file follows the Node", || {
                    read("mem").as_deref() == Some("80")
                });
            c.k.assert_node_refused_nothing();
        },
    );
}

/// Pods from the API and from the manifests directory side by side (the
/// kubelet's static pods): both are mounted, and removing the manifest
/// tears down only its pod.
#[test]
fn api_and_manifests_together() {
    isolated("api_and_manifests_together", || {
        let Some(c) = Real::new() else { return };
        let from_api = c.pod(memory_pod("api", "", NODE));
        let from_api = from_api.as_str();
        let static_pod = "b9999999-0000-0000-0000-000000000009";
        c.env.write_manifest(
            "static.yaml",
            &support::pod_yaml(
                "static",
                static_pod,
                &[("scratch", "emptyDir: {medium: Memory}")],
            ),
        );
        let _agent = c.env.start_agent(&[
            "--kubeconfig",
            c.k.kubeconfig.to_str().unwrap(),
            "--node-name",
            NODE,
        ]);
        c.wait_mounted(from_api, "scratch");
        c.wait_mounted(static_pod, "scratch");
        c.env.remove_manifest("static.yaml");
        c.wait_gone(static_pod);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(c.state(from_api, "scratch").as_deref(), Some("mounted"));
        c.k.assert_node_refused_nothing();
    });
}

/// Without `--manifests` and without an API server, the agent says what
/// it needs.
#[test]
fn agent_without_a_source_of_pods_says_so() {
    let env = Env::new();
    let out = std::process::Command::new(support::volmgr_bin())
        .args(["agent", "--root"])
        .arg(&env.root)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no source of pods"), "{err}");
}

/// How many `volume_mount` operations ran, of any outcome.
fn set_ups(env: &Env) -> u64 {
    env.status()
        .operations
        .iter()
        .filter(|o| o.operation == "volume_mount")
        .map(|o| o.count)
        .sum()
}

/// The subPaths of `vol` of pod `uid` listed in status: `container/index`,
/// sorted.
fn listed_sub_paths(env: &Env, uid: &str, vol: &str) -> Vec<String> {
    let s = env.status();
    let mut out: Vec<String> = s
        .pods
        .iter()
        .filter(|p| p.uid == uid)
        .flat_map(|p| &p.volumes)
        .filter(|v| v.name == vol)
        .flat_map(|v| &v.sub_paths)
        .map(|s| format!("{}/{}", s.container, s.index))
        .collect();
    out.sort();
    out
}

/// The init-container pattern: `render` (an init container, with a subPath
/// of its own) writes `out/app.conf` into an emptyDir, and `app` mounts
/// `subPath: out/app.conf`. While the pod's status shows `render` not
/// terminated, only its subPath is bound and nothing is made where the file
/// goes; once `render` terminated with exit code 0, `app`'s subPath is
/// bound to the file, without the volume being set up again.
#[test]
fn api_sub_paths_wait_for_the_init_containers() {
    isolated("api_sub_paths_wait_for_the_init_containers", || {
        let Some(c) = Real::new() else { return };
        let pod = |init_state: Value| {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "rendered", "namespace": "test"},
                "spec": {"nodeName": NODE,
                    "initContainers": [{"name": "render", "image": "i",
                        "volumeMounts": [{"name": "conf", "mountPath": "/out", "subPath": "out"}]}],
                    "containers": [{"name": "app", "image": "i",
                        "volumeMounts": [{"name": "conf", "mountPath": "/etc/app.conf",
                                          "subPath": "out/app.conf"}]}],
                    "volumes": [{"name": "conf", "emptyDir": {}}]},
                "status": {"phase": "Pending", "initContainerStatuses": [
                    {"name": "render", "image": "i", "imageID": "", "ready": false,
                     "restartCount": 0, "state": init_state}]}
            })
        };
        let uid = c.pod(pod(
            json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
        ));
        let uid = uid.as_str();
        let agent = c.start_agent();
        c.wait_mounted(uid, "conf");
        c.env.wait_for("the init container's subPath bound", || {
            listed_sub_paths(&c.env, uid, "conf") == ["render/0"]
        });
        let vol = c.env.empty_dir(uid, "conf");
        let subs = c
            .env
            .root
            .join("pods")
            .join(uid)
            .join("volume-subpaths/conf");
        assert!(vol.join("out").is_dir());
        assert!(
            !vol.join("out/app.conf").exists(),
            "made where the file goes"
        );
        assert_eq!(c.env.mount_count(&subs.join("app/0")), 0);
        let before = set_ups(&c.env);

        // The init container writes the file, then terminates with 0.
        std::fs::write(subs.join("render/0/app.conf"), "rendered").unwrap();
        let done = pod(json!({"terminated": {"exitCode": 0, "reason": "Completed"}}));
        c.k.set_status("pod", "test", "rendered", &done["status"]);
        c.env.wait_for("the app's subPath bound", || {
            listed_sub_paths(&c.env, uid, "conf") == ["app/0", "render/0"]
        });
        let bind = subs.join("app/0");
        assert_eq!(c.env.mount_count(&bind), 1);
        assert!(bind.is_file(), "a file bind");
        assert_eq!(std::fs::read_to_string(&bind).unwrap(), "rendered");
        assert_eq!(set_ups(&c.env), before, "the volume was set up again");

        c.k.delete("pod", "test", "rendered");
        c.wait_gone(uid);
        assert!(c.env.mounts().is_empty(), "{:?}", c.env.mounts());
        c.k.assert_node_refused_nothing();
        assert!(agent.term());
    });
}
