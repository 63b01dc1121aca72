//! Manager mode against a REAL control plane: etcd and kube-apiserver
//! built from their Go modules (`volmgr_kube::testing::real`), with
//! `--authorization-mode=Node,RBAC`, `NodeRestriction` and an audit log.
//! The agent runs as the node itself (`system:node:<name>` in
//! `system:nodes`, a client certificate as the kubelet's), so the Node
//! authorizer bounds it exactly as it bounds the kubelet: every read it
//! makes must be one the authorizer allows (0 forbidden requests in the
//! audit log), and a read it refuses backs off and holds nothing else
//! back. Each test runs in a private mount namespace with the real test
//! CSI driver; the server is its own, stopped when the test ends.

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use csi_driver::Driver;
use support::pod_yaml::PodYaml;
use support::{isolated, Agent, Env};
use volmgr_kube::testing::real::{Audited, RealApiServer};

const DRIVER: &str = "test.csi.volmgr.io";
const NODE: &str = "n1";

/// The node, the objects pod `app` reads, the claim `data` bound to the
/// CSI volume `pv-data`, and the claim `logs` bound to the hostPath volume
/// `pv-logs` (`ENV/host-logs`, created by the kubelet's hostPath rules). The CSI driver's CSIDriver requires attaching,
/// so its volumes wait for a VolumeAttachment, made here as the
/// attach/detach controller would (attached).
fn cluster(server: &RealApiServer, env: &Env) {
    server.namespace("default");
    for node in [NODE, "n2"] {
        server.apply(&format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{node}\"}}}}"
        ));
    }
    server.apply(
        "apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: test.csi.volmgr.io}
spec: {attachRequired: true, podInfoOnMount: false}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: default}
data: {mode: fast}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: default}
stringData: {password: hunter2}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-data}
spec:
  capacity: {storage: 320Mi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  csi:
    driver: test.csi.volmgr.io
    volumeHandle: vol-1
    fsType: xfs
    volumeAttributes: {size: 320Mi}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  volumeName: pv-data
  storageClassName: ''
  resources: {requests: {storage: 320Mi}}
",
    );
    server.bind("default", "data", "pv-data");
    let logs = env.dir.path().join("host-logs");
    server.apply(&format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-logs}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  hostPath: {{path: {}, type: DirectoryOrCreate}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: logs, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  volumeName: pv-logs
  storageClassName: ''
  resources: {{requests: {{storage: 1Gi}}}}
",
        logs.display()
    ));
    server.bind("default", "logs", "pv-logs");
    let va = volmgr::populator::convert::csi_driver::attachment_name("vol-1", DRIVER, NODE);
    server.apply(&format!(
        "apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {{name: {va}}}
spec: {{attacher: {DRIVER}, nodeName: {NODE}, source: {{persistentVolumeName: pv-data}}}}
"
    ));
    server.kubectl_ok(
        &[
            "patch",
            "volumeattachment",
            &va,
            "--subresource=status",
            "--type=merge",
            "-p",
            "{\"status\":{\"attached\":true}}",
        ],
        None,
    );
}

/// Pod `name` on the node with every kind of volume manager mode mounts:
/// emptyDir (disk and Memory), configMap, secret, downwardAPI, projected
/// (service account token, the root CA, a configMap), a claim of a CSI
/// volume and one of a hostPath volume.
fn pod_with_every_kind(name: &str) -> String {
    PodYaml::new(name, NODE)
        .with_payload_volumes()
        .claim("data", "data")
        .claim("logs", "logs")
        .build()
}

/// Pod `name` with only an emptyDir.
fn pod_with_empty_dir(name: &str) -> String {
    PodYaml::new(name, NODE)
        .volume("scratch", "/s", "emptyDir: {}")
        .build()
}

fn uid_of(server: &RealApiServer, pod: &str) -> String {
    server.kubectl_ok(
        &[
            "get",
            "pod",
            pod,
            "-n",
            "default",
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        None,
    )
}

/// The test driver, registered through `ROOT/plugins_registry`.
fn driver(env: &Env) -> Driver {
    let mut d = Driver::new(env, DRIVER);
    d.register_in(env.root.join("plugins_registry"));
    d.spawn();
    d
}

/// The agent in manager mode as `system:node:<identity>`, for node `NODE`.
fn agent_as(env: &Env, server: &RealApiServer, identity: &str) -> Agent {
    let kubeconfig = server.node_kubeconfig(identity);
    env.start_agent_without_manifests(&[
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--node-name",
        NODE,
        "--tracer",
        "off",
        "--report-volumes-in-use",
    ])
}

/// Waits up to `secs` for `cond`, dumping the agent's log on a time-out.
fn wait(
    agent: &Agent,
    server: &RealApiServer,
    secs: u64,
    what: &str,
    mut cond: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        if Instant::now() > deadline {
            panic!(
                "gave up waiting for: {what}\n--- agent log tail\n{}\n--- forbidden\n{:?}",
                volmgr_kube::testing::real::tail(&agent.log(), 60),
                server.forbidden(&format!("system:node:{NODE}"))
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether every volume of pod `uid` is mounted (at least `n` of them:
/// the ServiceAccount admission plugin adds `kube-api-access-*` to a pod
/// that does not mount its token itself).
fn all_mounted(env: &Env, uid: &str, n: usize) -> bool {
    let s = env.status();
    s.pods.iter().any(|p| {
        p.uid == uid && p.volumes.len() >= n && p.volumes.iter().all(|v| v.state == "mounted")
    })
}

/// The `FailedMount` events (events.k8s.io/v1) regarding pod `pod` of
/// namespace `default`, read as the admin.
fn failed_mount_events(server: &RealApiServer, pod: &str) -> Vec<serde_json::Value> {
    let out = server.kubectl_ok(
        &["get", "events.events.k8s.io", "-n", "default", "-o", "json"],
        None,
    );
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "FailedMount" && e["regarding"]["name"] == pod)
        .cloned()
        .collect()
}

/// The notes of [`failed_mount_events`].
fn failed_mount_notes(server: &RealApiServer, pod: &str) -> Vec<String> {
    failed_mount_events(server, pod)
        .iter()
        .filter_map(|e| e["note"].as_str().map(String::from))
        .collect()
}

/// Requests by `user`, counted by `verb resource`.
fn by_verb_and_resource(audit: &[Audited], user: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for a in audit.iter().filter(|a| a.user == user) {
        *counts
            .entry(format!("{} {} {}", a.code, a.verb, a.resource))
            .or_insert(0) += 1;
    }
    counts
}

/// Under the node's own identity every kind of volume mounts, and the
/// Node authorizer refuses nothing the agent asks: the audit log has no
/// 403 for `system:node:n1`. (On fae9a6f claims and volumes were listed
/// and watched, which the authorizer refuses: the pod never mounted.)
#[test]
fn node_identity_mounts_every_volume_kind_with_no_forbidden_request() {
    isolated(
        "node_identity_mounts_every_volume_kind_with_no_forbidden_request",
        || {
            let Some(server) = RealApiServer::start() else {
                return;
            };
            let env = Env::new();
            cluster(&server, &env);
            let _driver = driver(&env);
            let agent = agent_as(&env, &server, NODE);
            server.apply(&pod_with_every_kind("app"));
            let uid = uid_of(&server, "app");
            wait(&agent, &server, 120, "every volume of app mounted", || {
                all_mounted(&env, &uid, 8)
            });
            let s = env.status();
            assert!(s.errors.is_empty(), "no source problem: {:?}", s.errors);
            // The token came from the real server's TokenRequest, signed
            // with its service account key.
            let token_dir = env
                .root
                .join("pods")
                .join(&uid)
                .join("volumes/kubernetes.io~projected/token");
            let token = std::fs::read_to_string(token_dir.join("token")).unwrap();
            assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
            assert!(token_dir.join("ca.crt").exists());
            // The hostPath PersistentVolume's directory, made as its type says.
            assert!(env.dir.path().join("host-logs").is_dir());
            let user = format!("system:node:{NODE}");
            let counts = by_verb_and_resource(&server.audit(), &user);
            eprintln!("requests of {user} for one pod start: {counts:#?}");
            assert_eq!(server.forbidden(&user), vec![], "{counts:#?}");

            // A configMap update rewrites the volumes that read it (the
            // projected one holds the token too) without a new
            // TokenRequest: tokens are cached as the kubelet's token
            // manager caches them (on fae9a6f: two more per update).
            let tokens = |server: &RealApiServer| {
                server
                    .audit()
                    .iter()
                    .filter(|a| a.user == user && a.resource == "serviceaccounts/token")
                    .count()
            };
            let before = tokens(&server);
            server.apply(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kube-root-ca.crt, namespace: default}\ndata: {ca.crt: rotated}\n",
            );
            let ca = token_dir.join("ca.crt");
            wait(&agent, &server, 120, "the projected CA rewritten", || {
                std::fs::read_to_string(&ca).is_ok_and(|c| c == "rotated")
            });
            assert_eq!(tokens(&server), before, "no TokenRequest for an update");

            // While the pod is bound to the node, nothing is refused.
            assert_eq!(server.forbidden(&user), vec![]);
            // Deleted: every volume torn down, the claim's device unstaged.
            server.kubectl_ok(
                &["delete", "pod", "app", "--grace-period=0", "--force"],
                None,
            );
            wait(&agent, &server, 120, "app's volumes torn down", || {
                !env.status().pods.iter().any(|p| p.uid == uid)
            });
            // The one refusal the deletion may race: a scheduled re-read
            // (`get`, as the kubelet re-reads a pod's claim at each sync) of
            // the deleted pod's own claims, volumes and service account, sent after
            // the API server removed the pod and before the agent heard of
            // it (seen once in CI under load). Nothing else: no list or
            // watch, no other object.
            let racing = |a: &volmgr_kube::testing::real::Audited| {
                a.verb == "get"
                    && matches!(
                        (a.resource.as_str(), a.name.as_str()),
                        ("persistentvolumeclaims", "data" | "logs")
                            | ("persistentvolumes", "pv-data" | "pv-logs")
                            | ("serviceaccounts", "default")
                    )
            };
            let refused = server.forbidden(&user);
            assert!(
                refused.iter().all(racing),
                "refused after the deletion: {refused:#?}"
            );
        },
    );
}

/// The rights of the node's agent, but claims: user `restricted` may not
/// read PersistentVolumeClaims; its kubeconfig.
fn restricted_user(server: &RealApiServer) -> std::path::PathBuf {
    server.apply(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: all-but-claims}
rules:
- {apiGroups: [''], resources: [pods, nodes, configmaps, secrets], verbs: [get, list, watch]}
- {apiGroups: [''], resources: [persistentvolumes, serviceaccounts], verbs: [get]}
- {apiGroups: [''], resources: [serviceaccounts/token], verbs: [create]}
- {apiGroups: [''], resources: [nodes, nodes/status], verbs: [patch]}
- {apiGroups: [storage.k8s.io], resources: [csidrivers], verbs: [get, list, watch]}
- {apiGroups: [storage.k8s.io], resources: [volumeattachments], verbs: [get]}
- {apiGroups: [storage.k8s.io], resources: [csinodes], verbs: [get, create, update, patch]}
- {apiGroups: [events.k8s.io], resources: [events], verbs: [create, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: all-but-claims}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: all-but-claims}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: restricted}]
",
    );
    server.write_kubeconfig("restricted", "restricted", &[])
}

/// A read the server refuses backs off (capped exponential, not once a
/// second), shows in status, and holds nothing else back: after a restart
/// under credentials that may not read pod `app`'s claim, `app` is held
/// with its volumes kept mounted, while pod `gone`, deleted while the agent
/// was down, is torn down at once and the agent reports synced; `app` gets
/// the kubelet's `Warning` `FailedMount` event saying why (its
/// `WaitForAttachAndMount` error, with the server's refusal). Deleting
/// the held pod releases it at once. (On fae9a6f: `synced: false` forever,
/// `gone`'s volumes never torn down, the refused read retried about once a
/// second, and no event.)
#[test]
fn a_refused_read_backs_off_and_holds_nothing_hostage() {
    isolated("a_refused_read_backs_off_and_holds_nothing_hostage", || {
        let Some(server) = RealApiServer::start() else {
            return;
        };
        let env = Env::new();
        cluster(&server, &env);
        let restricted = restricted_user(&server);
        let _driver = driver(&env);
        let agent = agent_as(&env, &server, NODE);
        server.apply(&pod_with_every_kind("app"));
        server.apply(&pod_with_empty_dir("gone"));
        let app = uid_of(&server, "app");
        let gone = uid_of(&server, "gone");
        wait(&agent, &server, 120, "both pods mounted", || {
            all_mounted(&env, &app, 8) && all_mounted(&env, &gone, 1)
        });
        agent.kill9();
        let scratch = env.empty_dir(&gone, "scratch");
        assert!(scratch.exists());
        server.kubectl_ok(
            &["delete", "pod", "gone", "--grace-period=0", "--force"],
            None,
        );

        // Back as a user that may read everything but claims.
        let started = Instant::now();
        let agent = env.start_agent_without_manifests(&[
            "--kubeconfig",
            restricted.to_str().unwrap(),
            "--node-name",
            NODE,
            "--tracer",
            "off",
        ]);
        wait(
            &agent,
            &server,
            60,
            "synced, gone's volume torn down",
            || {
                let s = env.status();
                s.synced && !s.pods.iter().any(|p| p.uid == gone)
            },
        );
        assert!(!scratch.exists(), "gone's emptyDir removed");
        // app is held, with what was mounted for it kept.
        let data = env.csi_publish_path(&app, "pv-data");
        wait(&agent, &server, 60, "the refusal in status", || {
            env.status()
                .errors
                .iter()
                .any(|e| e.source == "api" && e.error.contains("403"))
        });
        assert!(
            env.mounts().iter().any(|m| m.mount_point == data),
            "app's claim stays mounted while app is held"
        );
        assert!(env.empty_dir(&app, "scratch").exists());
        // As the kubelet says it: a Warning FailedMount on app, with its
        // WaitForAttachAndMount error and the server's own words.
        let refused = |claim: &str| {
            format!(
                "error processing PVC default/{claim}: failed to fetch PVC from API server: \
                 persistentvolumeclaims \"{claim}\" is forbidden: User \"restricted\" cannot \
                 get resource \"persistentvolumeclaims\" in API group \"\" in the namespace \
                 \"default\""
            )
        };
        let expected = format!(
            "Unable to attach or mount volumes: unmounted volumes=[data logs], unattached \
             volumes=[], failed to process volumes=[data logs]: {}; {}",
            refused("data"),
            refused("logs")
        );
        let mut notes = Vec::new();
        wait(&agent, &server, 30, "a FailedMount event on app", || {
            notes = failed_mount_notes(&server, "app");
            notes.contains(&expected)
        });
        let event = failed_mount_events(&server, "app");
        assert_eq!(event[0]["type"], "Warning", "{event:?}");
        assert_eq!(event[0]["regarding"]["uid"], app.as_str(), "{event:?}");

        // Over 40 s the refused claim is asked for a handful of times, not
        // forty (client-go's reflector: 0.8 s doubling to 30 s, jittered).
        std::thread::sleep(Duration::from_secs(40).saturating_sub(started.elapsed()));
        let gets = server
            .forbidden("restricted")
            .into_iter()
            .filter(|a| a.resource == "persistentvolumeclaims" && a.name == "data")
            .count();
        assert!(
            (1..=8).contains(&gets),
            "refused claim asked {gets} times in 40 s"
        );
        let warnings = agent
            .log()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("PersistentVolumeClaim default/data"))
            .count();
        assert!(warnings <= 1, "logged once, not per retry: {warnings}");

        // Deleting the held pod releases it at once.
        server.kubectl_ok(
            &["delete", "pod", "app", "--grace-period=0", "--force"],
            None,
        );
        wait(&agent, &server, 60, "app torn down", || {
            !env.mounts().iter().any(|m| m.mount_point == data)
        });
        // The node itself was refused nothing.
        assert_eq!(server.forbidden(&format!("system:node:{NODE}")), vec![]);
    });
}

/// The node's CSINode, as the admin reads it.
fn csinode(server: &RealApiServer) -> serde_json::Value {
    let out = server.kubectl_ok(&["get", "csinode", NODE, "-o", "json"], None);
    serde_json::from_str(&out).unwrap()
}

/// CSI migration's CSINode annotation, written as the kubelet's
/// `setMigrationAnnotation` writes it, under the Node authorizer and
/// `NodeRestriction`: once a driver registers, the node's CSINode (made
/// beforehand by someone else, with an annotation of its own) lists every
/// in-tree plugin migrated on the node, sorted, its other annotation kept;
/// when the driver goes its entry goes and the annotation stays (the
/// kubelet's uninstall leaves it). Nothing is refused. Before, the
/// annotation was never written, and the attach/detach controller took the
/// node as not migrated.
#[test]
fn csinode_gets_the_migrated_plugins_annotation_with_no_forbidden_request() {
    isolated(
        "csinode_gets_the_migrated_plugins_annotation_with_no_forbidden_request",
        || {
            let Some(server) = RealApiServer::start() else {
                return;
            };
            let env = Env::new();
            cluster(&server, &env);
            server.apply(&format!(
                "apiVersion: storage.k8s.io/v1\nkind: CSINode\nmetadata: {{name: {NODE}, annotations: {{other: kept}}}}\nspec: {{drivers: []}}\n"
            ));
            let mut driver = driver(&env);
            let agent = agent_as(&env, &server, NODE);
            let key = "storage.alpha.kubernetes.io/migrated-plugins";
            wait(
                &agent,
                &server,
                60,
                "the driver and the annotation on the CSINode",
                || {
                    let c = csinode(&server);
                    c["spec"]["drivers"][0]["name"] == DRIVER
                        && c["metadata"]["annotations"][key].is_string()
                },
            );
            let c = csinode(&server);
            assert_eq!(
                c["metadata"]["annotations"][key],
                "kubernetes.io/aws-ebs,kubernetes.io/azure-disk,kubernetes.io/azure-file,\
                 kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume,\
                 kubernetes.io/vsphere-volume",
                "{c:#}"
            );
            assert_eq!(c["metadata"]["annotations"]["other"], "kept", "{c:#}");
            // The driver goes (SIGTERM: it removes its sockets).
            driver.stop();
            wait(&agent, &server, 60, "the driver's entry gone", || {
                csinode(&server)["spec"]["drivers"]
                    .as_array()
                    .is_none_or(|d| d.is_empty())
            });
            let c = csinode(&server);
            assert!(c["metadata"]["annotations"][key].is_string(), "{c:#}");
            let user = format!("system:node:{NODE}");
            let counts = by_verb_and_resource(&server.audit(), &user);
            assert_eq!(server.forbidden(&user), vec![], "{counts:#?}");
            assert!(
                counts.get("200 update csinodes").is_some_and(|n| *n >= 2),
                "{counts:#?}"
            );
        },
    );
}
