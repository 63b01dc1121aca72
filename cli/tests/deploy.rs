//! The manifests in `deploy/`: every document parses as its k8s-openapi
//! type and survives a round trip unchanged (so no field is misspelled or
//! unknown: serde drops those), and the DaemonSet and RBAC have the
//! properties the node agent needs — and no more rights than it needs.

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every YAML document of every file in deploy/, as JSON, with its file.
fn documents() -> Vec<(String, Value)> {
    let mut files: Vec<_> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for f in files {
        assert_eq!(
            f.extension().and_then(|e| e.to_str()),
            Some("yaml"),
            "only YAML manifests in deploy/: {}",
            f.display()
        );
        let text = std::fs::read_to_string(&f).unwrap();
        for d in serde_norway::Deserializer::from_str(&text) {
            let v = Value::deserialize(d).unwrap();
            if !v.is_null() {
                docs.push((f.file_name().unwrap().to_string_lossy().into_owned(), v));
            }
        }
    }
    docs
}

/// Parses `v` as `T` and checks that serializing it gives `v` back.
fn typed<T: DeserializeOwned + Serialize>(file: &str, v: &Value) -> T {
    let t: T = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not parse: {e}", v["kind"]));
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(
        &back, v,
        "{file}: {} changes in a round trip (unknown or misspelled field?)",
        v["kind"]
    );
    t
}

struct Manifests {
    daemonset: DaemonSet,
    account: ServiceAccount,
    role: ClusterRole,
    binding: ClusterRoleBinding,
}

fn manifests() -> Manifests {
    let (mut ds, mut sa, mut role, mut binding) = (None, None, None, None);
    for (file, v) in documents() {
        match v["kind"].as_str().unwrap_or_default() {
            "Namespace" => {
                typed::<Namespace>(&file, &v);
            }
            "DaemonSet" => ds = Some(typed::<DaemonSet>(&file, &v)),
            "ServiceAccount" => sa = Some(typed::<ServiceAccount>(&file, &v)),
            "ClusterRole" => role = Some(typed::<ClusterRole>(&file, &v)),
            "ClusterRoleBinding" => binding = Some(typed::<ClusterRoleBinding>(&file, &v)),
            k => panic!("{file}: unexpected kind {k:?}"),
        }
    }
    Manifests {
        daemonset: ds.expect("a DaemonSet"),
        account: sa.expect("a ServiceAccount"),
        role: role.expect("a ClusterRole"),
        binding: binding.expect("a ClusterRoleBinding"),
    }
}

#[test]
fn the_daemonset_runs_the_agent_as_a_node_agent() {
    let m = manifests();
    let ds = &m.daemonset;
    let pod = ds.spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.host_pid, Some(true));
    assert_eq!(
        pod.service_account_name.as_deref(),
        m.account.metadata.name.as_deref()
    );
    assert_eq!(ds.metadata.namespace, m.account.metadata.namespace);
    // Tolerates every taint: one toleration with operator Exists, no key.
    let tolerations = pod.tolerations.as_ref().unwrap();
    assert!(tolerations
        .iter()
        .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()));

    let c = &pod.containers[0];
    assert_eq!(c.security_context.as_ref().unwrap().privileged, Some(true));
    let args = c.args.as_ref().unwrap();
    assert_eq!(args[0], "agent");
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .map(str::to_string)
    };
    assert!(
        flag("kubeconfig").is_none() && !args.iter().any(|a| a == "--kubeconfig"),
        "no --kubeconfig: in-cluster config"
    );
    assert_eq!(flag("node-name").as_deref(), Some("$(NODE_NAME)"));
    let env = c.env.as_ref().unwrap();
    let node_name = env.iter().find(|e| e.name == "NODE_NAME").unwrap();
    let field = node_name
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "spec.nodeName");

    // The root directory, Bidirectional, from the same host path; /dev.
    let root = flag("root").unwrap();
    let mounts = c.volume_mounts.as_ref().unwrap();
    let root_mount = mounts.iter().find(|v| v.mount_path == root).unwrap();
    assert_eq!(
        root_mount.mount_propagation.as_deref(),
        Some("Bidirectional")
    );
    let volumes = pod.volumes.as_ref().unwrap();
    let host_path = |name: &str| {
        volumes
            .iter()
            .find(|v| v.name == name)
            .and_then(|v| v.host_path.as_ref())
            .map(|h| h.path.clone())
    };
    assert_eq!(host_path(&root_mount.name).as_deref(), Some(root.as_str()));
    let dev = mounts.iter().find(|v| v.mount_path == "/dev").unwrap();
    assert_eq!(host_path(&dev.name).as_deref(), Some("/dev"));
    // Every mount has its volume.
    for vm in mounts {
        assert!(volumes.iter().any(|v| v.name == vm.name), "{}", vm.name);
    }
}

/// The ClusterRole grants exactly what the agent's features need, and the
/// binding gives it to the DaemonSet's ServiceAccount.
#[test]
fn rbac_is_the_least_the_agent_needs() {
    let m = manifests();
    let mut granted = BTreeSet::new();
    for r in m.role.rules.as_ref().unwrap() {
        assert!(r.resource_names.is_none() && r.non_resource_urls.is_none());
        for g in r.api_groups.as_ref().unwrap() {
            for res in r.resources.as_ref().unwrap() {
                for v in &r.verbs {
                    assert_ne!(v, "*", "no wildcard verbs");
                    assert_ne!(res, "*", "no wildcard resources");
                    granted.insert(format!("{g}/{res}:{v}"));
                }
            }
        }
    }
    let read = ["get", "list", "watch"];
    let mut want = BTreeSet::new();
    let mut add = |group: &str, resources: &[&str], verbs: &[&str]| {
        for r in resources {
            for v in verbs {
                want.insert(format!("{group}/{r}:{v}"));
            }
        }
    };
    add("", &["pods"], &read);
    add(
        "",
        &[
            "persistentvolumeclaims",
            "persistentvolumes",
            "secrets",
            "configmaps",
            "serviceaccounts",
        ],
        &read,
    );
    add("", &["serviceaccounts/token"], &["create"]);
    add("", &["nodes"], &["get", "list", "watch", "patch"]);
    add("", &["nodes/status"], &["patch"]);
    // status.capacity after node expansion (the kubelet's MarkFSResizeFinished).
    add("", &["persistentvolumeclaims/status"], &["patch"]);
    add("events.k8s.io", &["events"], &["create", "patch"]);
    add(
        "storage.k8s.io",
        &["csinodes"],
        &["get", "create", "update", "patch"],
    );
    add(
        "storage.k8s.io",
        &["csidrivers", "volumeattachments"],
        &read,
    );
    // Projected clusterTrustBundle sources: one list and watch of the kind.
    add("certificates.k8s.io", &["clustertrustbundles"], &read);
    assert_eq!(granted, want);

    let b = &m.binding;
    assert_eq!(b.role_ref.kind, "ClusterRole");
    assert_eq!(Some(&b.role_ref.name), m.role.metadata.name.as_ref());
    let s = &b.subjects.as_ref().unwrap()[0];
    assert_eq!(s.kind, "ServiceAccount");
    assert_eq!(Some(&s.name), m.account.metadata.name.as_ref());
    assert_eq!(s.namespace, m.account.metadata.namespace);
}
