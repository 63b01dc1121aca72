//! The manifests in `deploy/`: the two manifest sets `kubectl apply -k`
//! gives — observe mode (`deploy/`, the default) and manager mode (the
//! overlay `deploy/manager/`) — built here as kustomize would build them
//! (resources, then strategic merge patches). Every document parses as
//! its k8s-openapi type and survives a round trip unchanged (so no field is
//! misspelled or unknown: serde drops those); every flag the DaemonSet
//! passes is one `volmgr agent` has; the rights are exactly what each mode
//! needs, and observe mode's are read-only (RBAC, host paths, no
//! privileged container, a fixed capability set).

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, ServiceAccount, VolumeMount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every YAML document of `file`, as JSON.
fn yaml_documents(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut docs = Vec::new();
    for d in serde_norway::Deserializer::from_str(&text) {
        let v = Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if !v.is_null() {
            docs.push(v);
        }
    }
    docs
}

/// Builds the kustomization in `dir` as `kubectl apply -k` does for the
/// subset used in deploy/: `resources` (files, or directories holding a
/// kustomization) in order, then each of `patches` (a strategic merge
/// patch file) applied to the resource of the same kind and name. Any
/// other kustomize feature fails the test, so what is checked here is what
/// a cluster gets. Every file read is added to `used`.
fn kustomize(dir: &Path, used: &mut BTreeSet<PathBuf>) -> Vec<Value> {
    let file = dir.join("kustomization.yaml");
    used.insert(file.canonicalize().unwrap());
    let k = yaml_documents(&file).remove(0);
    let k = k.as_object().unwrap();
    assert_eq!(k["apiVersion"], "kustomize.config.k8s.io/v1beta1");
    assert_eq!(k["kind"], "Kustomization");
    for key in k.keys() {
        assert!(
            ["apiVersion", "kind", "resources", "patches"].contains(&key.as_str()),
            "{}: {key} is not resolved by this test",
            file.display()
        );
    }
    let mut out = Vec::new();
    for r in k["resources"].as_array().unwrap() {
        let path = dir.join(r.as_str().unwrap());
        if path.is_dir() {
            out.extend(kustomize(&path, used));
        } else {
            used.insert(path.canonicalize().unwrap());
            out.extend(yaml_documents(&path));
        }
    }
    for p in k
        .get("patches")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let p = p.as_object().unwrap();
        assert_eq!(p.len(), 1, "only `path:` patches");
        let path = dir.join(p["path"].as_str().unwrap());
        used.insert(path.canonicalize().unwrap());
        for patch in yaml_documents(&path) {
            let target = out
                .iter_mut()
                .find(|v| {
                    v["kind"] == patch["kind"]
                        && v["metadata"]["name"] == patch["metadata"]["name"]
                        && v["metadata"]["namespace"] == patch["metadata"]["namespace"]
                })
                .unwrap_or_else(|| panic!("{}: no target for the patch", path.display()));
            strategic_merge(target, &patch, "");
        }
    }
    out
}

/// The list merge keys of the Kubernetes types the patches touch
/// (`patchMergeKey` in the API); other lists are replaced.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers" | "initContainers" | "volumes" | "env" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "ports" => Some("containerPort"),
        _ => None,
    }
}

/// A strategic merge patch: maps merge, `null` deletes a key, lists with a
/// merge key merge item by item, other lists and scalars are replaced.
fn strategic_merge(base: &mut Value, patch: &Value, field: &str) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => merge_maps(b, p),
        (Value::Array(b), Value::Array(p)) => match merge_key(field) {
            Some(key) => {
                for item in p {
                    assert!(item.get(key).is_some(), "{field}: an item without {key}");
                    match b.iter_mut().find(|x| x[key] == item[key]) {
                        Some(x) => strategic_merge(x, item, ""),
                        None => b.push(item.clone()),
                    }
                }
            }
            None => *b = p.clone(),
        },
        (b, p) => *b = p.clone(),
    }
}

fn merge_maps(b: &mut Map<String, Value>, p: &Map<String, Value>) {
    for (k, v) in p {
        assert!(
            !k.starts_with('$'),
            "patch directive {k}: not resolved here"
        );
        if v.is_null() {
            b.remove(k);
        } else if let Some(bv) = b.get_mut(k) {
            strategic_merge(bv, v, k);
        } else {
            b.insert(k.clone(), v.clone());
        }
    }
}

/// Parses `v` as `T` and checks that serializing it gives `v` back.
fn typed<T: DeserializeOwned + Serialize>(set: &str, v: &Value) -> T {
    let t: T = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{set}: {} does not parse: {e}", v["kind"]));
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(
        &back, v,
        "{set}: {} changes in a round trip (unknown or misspelled field?)",
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

impl Manifests {
    fn pod(&self) -> &PodSpec {
        self.daemonset.spec.template.spec.as_ref().unwrap()
    }

    fn agent(&self) -> &Container {
        let pod = self.pod();
        assert_eq!(pod.containers.len(), 1, "one container, the agent");
        &pod.containers[0]
    }

    fn args(&self) -> &[String] {
        self.agent().args.as_deref().unwrap()
    }

    /// The value of `--name=VALUE` in the agent's arguments.
    fn flag(&self, name: &str) -> Option<String> {
        self.args()
            .iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .map(str::to_string)
    }

    fn has_switch(&self, name: &str) -> bool {
        self.args().iter().any(|a| *a == format!("--{name}"))
    }

    /// The host path behind a volume mount, if it is a hostPath.
    fn host_path(&self, mount: &VolumeMount) -> Option<String> {
        self.pod()
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == mount.name)
            .unwrap_or_else(|| panic!("no volume {}", mount.name))
            .host_path
            .as_ref()
            .map(|h| h.path.clone())
    }

    fn mount_at(&self, path: &str) -> &VolumeMount {
        let mounts = self.agent().volume_mounts.as_ref().unwrap();
        mounts.iter().find(|m| m.mount_path == path).unwrap()
    }

    /// Every (group/resource, verb) the ClusterRole grants.
    fn granted(&self) -> BTreeSet<String> {
        let mut granted = BTreeSet::new();
        for r in self.role.rules.as_ref().unwrap() {
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
        granted
    }
}

/// The manifest set `kubectl apply -k deploy/<sub>` gives. Every YAML file
/// under deploy/ must be part of one set or the other.
fn manifests(sub: &str) -> Manifests {
    let (mut ds, mut sa, mut role, mut binding) = (None, None, None, None);
    let mut used = BTreeSet::new();
    let set = if sub.is_empty() { "deploy/" } else { sub };
    for v in kustomize(&deploy_dir().join(sub), &mut used) {
        match v["kind"].as_str().unwrap_or_default() {
            "Namespace" => {
                typed::<Namespace>(set, &v);
            }
            "DaemonSet" => ds = Some(typed::<DaemonSet>(set, &v)),
            "ServiceAccount" => sa = Some(typed::<ServiceAccount>(set, &v)),
            "ClusterRole" => role = Some(typed::<ClusterRole>(set, &v)),
            "ClusterRoleBinding" => binding = Some(typed::<ClusterRoleBinding>(set, &v)),
            k => panic!("{set}: unexpected kind {k:?}"),
        }
    }
    let m = Manifests {
        daemonset: ds.expect("a DaemonSet"),
        account: sa.expect("a ServiceAccount"),
        role: role.expect("a ClusterRole"),
        binding: binding.expect("a ClusterRoleBinding"),
    };
    node_agent_basics(set, &m);
    m
}

/// Every file under deploy/ is a YAML file that one of the two sets uses.
#[test]
fn every_file_in_deploy_belongs_to_a_manifest_set() {
    let mut used = BTreeSet::new();
    kustomize(&deploy_dir(), &mut used);
    kustomize(&deploy_dir().join("manager"), &mut used);
    let mut stack = vec![deploy_dir()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            assert_eq!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml"),
                "only YAML manifests in deploy/: {}",
                p.display()
            );
            assert!(
                used.contains(&p.canonicalize().unwrap()),
                "{} is in no kustomization",
                p.display()
            );
        }
    }
}

/// What both modes share: a node agent on every node, in-cluster config,
/// the node's name from the downward API, the kubelet's root at the same
/// path inside, the image this version builds, the RBAC binding.
fn node_agent_basics(set: &str, m: &Manifests) {
    let pod = m.pod();
    assert_eq!(pod.host_pid, Some(true), "{set}");
    assert_eq!(
        pod.service_account_name.as_deref(),
        m.account.metadata.name.as_deref()
    );
    assert_eq!(m.daemonset.metadata.namespace, m.account.metadata.namespace);
    // Tolerates every taint: one toleration with operator Exists, no key.
    let tolerations = pod.tolerations.as_ref().unwrap();
    assert!(tolerations
        .iter()
        .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()));

    let c = m.agent();
    assert_eq!(
        c.image.as_deref(),
        Some(format!("volmgr:{}", env!("CARGO_PKG_VERSION")).as_str()),
        "{set}: the image scripts/image.sh builds"
    );
    assert_eq!(m.args()[0], "agent");
    assert!(
        m.flag("kubeconfig").is_none() && !m.has_switch("kubeconfig"),
        "{set}: no --kubeconfig: in-cluster config"
    );
    assert_eq!(m.flag("node-name").as_deref(), Some("$(NODE_NAME)"));
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

    // ROOT is the kubelet's root, mounted at the same path (the paths in
    // the mount table and in vol_data.json are the host's).
    let root = m.flag("root").unwrap();
    assert_eq!(root, "/var/lib/kubelet", "{set}");
    assert_eq!(
        m.host_path(m.mount_at(&root)).as_deref(),
        Some(root.as_str())
    );
    // Every mount has its volume, every volume is mounted.
    let mounts = c.volume_mounts.as_ref().unwrap();
    for v in pod.volumes.as_ref().unwrap() {
        assert!(
            mounts.iter().any(|vm| vm.name == v.name),
            "{set}: {} unused",
            v.name
        );
    }
    for vm in mounts {
        m.host_path(vm);
    }

    let b = &m.binding;
    assert_eq!(b.role_ref.kind, "ClusterRole");
    assert_eq!(Some(&b.role_ref.name), m.role.metadata.name.as_ref());
    let s = &b.subjects.as_ref().unwrap()[0];
    assert_eq!(s.kind, "ServiceAccount");
    assert_eq!(Some(&s.name), m.account.metadata.name.as_ref());
    assert_eq!(s.namespace, m.account.metadata.namespace);
}

/// Every flag the DaemonSet passes exists in `volmgr agent --help`.
fn flags_exist(set: &str, m: &Manifests) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_volmgr"))
        .args(["agent", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let known = |name: &str| {
        help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .any(|w| w == format!("--{name}"))
    };
    for a in &m.args()[1..] {
        let name = a.strip_prefix("--").unwrap_or_else(|| panic!("{set}: {a}"));
        let name = name.split('=').next().unwrap();
        assert!(known(name), "{set}: volmgr agent has no --{name}");
    }
}

fn want(rules: &[(&str, &[&str], &[&str])]) -> BTreeSet<String> {
    let mut want = BTreeSet::new();
    for (group, resources, verbs) in rules {
        for r in *resources {
            for v in *verbs {
                want.insert(format!("{group}/{r}:{v}"));
            }
        }
    }
    want
}

const READ: &[&str] = &["get", "list", "watch"];

/// Observe mode (`kubectl apply -k deploy/`): reads, never changes.
#[test]
fn observe_mode_is_the_default_and_reads_only() {
    let m = manifests("");
    flags_exist("deploy/", &m);
    assert!(m.has_switch("observe"));
    assert!(!m.has_switch("report-volumes-in-use") && m.flag("manifests").is_none());
    assert!(m.flag("stuck-after").is_some() && m.flag("stuck-syscall-after").is_some());
    assert!(m.flag("stuck-tool-after").is_some());
    // The state directory is not under the (read-only) root.
    let state = m.flag("state-dir").unwrap();
    assert!(!Path::new(&state).starts_with(m.flag("root").unwrap()));

    // RBAC: reads of the pods and of what decides their volumes' names (and
    // of a stuck pod's events); events recorded.
    let granted = m.granted();
    assert_eq!(
        granted,
        want(&[
            (
                "",
                &["pods", "persistentvolumeclaims", "persistentvolumes"],
                READ
            ),
            ("storage.k8s.io", &["csidrivers", "volumeattachments"], READ),
            ("events.k8s.io", &["events"], &["create", "patch"]),
            // A stuck pod's recent events, read back for finding (d).
            ("", &["events"], &["get", "list"]),
        ])
    );
    // Payload volumes are observed by name only: no right to read what
    // they hold (a read-only observer that could read every Secret would
    // not be installed), nor the Node.
    for g in &granted {
        let resource = g.split_once(':').unwrap().0.rsplit('/').next().unwrap();
        assert!(
            ![
                "configmaps",
                "secrets",
                "nodes",
                "clustertrustbundles",
                "serviceaccounts"
            ]
            .contains(&resource),
            "observe mode may not read {g}"
        );
    }
    for g in &granted {
        let (resource, verb) = g.split_once(':').unwrap();
        assert!(
            READ.contains(&verb) || resource == "events.k8s.io/events",
            "observe mode may not {verb} {resource}"
        );
    }

    // The kubelet's root read-only, seeing the kubelet's later mounts.
    let root = m.mount_at("/var/lib/kubelet");
    assert_eq!(root.read_only, Some(true));
    assert_eq!(root.mount_propagation.as_deref(), Some("HostToContainer"));
    // Every host path read-only and never Bidirectional; the only
    // writable volume is the agent's own state (an emptyDir).
    let mounts = m.agent().volume_mounts.as_ref().unwrap();
    for vm in mounts {
        assert_ne!(vm.mount_propagation.as_deref(), Some("Bidirectional"));
        if m.host_path(vm).is_some() {
            assert_eq!(
                vm.read_only,
                Some(true),
                "hostPath {} read-only",
                vm.mount_path
            );
        } else {
            let v = m
                .pod()
                .volumes
                .as_ref()
                .unwrap()
                .iter()
                .find(|v| v.name == vm.name);
            assert!(
                v.unwrap().empty_dir.is_some(),
                "{}: hostPath or emptyDir",
                vm.name
            );
        }
    }
    assert!(mounts.iter().all(|vm| vm.mount_path != "/dev"));

    // Not privileged: the tracer's and /proc readers' capabilities only.
    let sc = m.agent().security_context.as_ref().unwrap();
    assert_ne!(sc.privileged, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    assert_eq!(
        added,
        BTreeSet::from(["BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH"]),
        "see docs/USAGE.md, Running on a cluster, before changing the set"
    );
}

/// Manager mode (`kubectl apply -k deploy/manager/`): the agent is the
/// node's volume manager on the kubelet's root.
#[test]
fn manager_mode_overlay_owns_the_kubelets_root() {
    let m = manifests("manager");
    flags_exist("manager", &m);
    assert!(!m.has_switch("observe") && m.has_switch("report-volumes-in-use"));
    let root = m.mount_at("/var/lib/kubelet");
    assert_ne!(root.read_only, Some(true));
    assert_eq!(root.mount_propagation.as_deref(), Some("Bidirectional"));
    assert_eq!(m.host_path(m.mount_at("/dev")).as_deref(), Some("/dev"));
    let sc = m.agent().security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(true));
    assert!(sc.allow_privilege_escalation.is_none() && sc.capabilities.is_none());

    // The ClusterRole grants exactly what the manager's features need.
    let granted = m.granted();
    assert_eq!(
        granted,
        want(&[
            ("", &["pods"], READ),
            (
                "",
                &[
                    "persistentvolumeclaims",
                    "persistentvolumes",
                    "secrets",
                    "configmaps",
                    "serviceaccounts",
                ],
                READ,
            ),
            ("", &["serviceaccounts/token"], &["create"]),
            ("", &["nodes"], &["get", "list", "watch", "patch"]),
            ("", &["nodes/status"], &["patch"]),
            // status.capacity after node expansion (the kubelet's MarkFSResizeFinished).
            ("", &["persistentvolumeclaims/status"], &["patch"]),
            ("events.k8s.io", &["events"], &["create", "patch"]),
            (
                "storage.k8s.io",
                &["csinodes"],
                &["get", "create", "update", "patch"]
            ),
            ("storage.k8s.io", &["csidrivers", "volumeattachments"], READ),
            // Projected clusterTrustBundle sources: one list and watch of the kind.
            ("certificates.k8s.io", &["clustertrustbundles"], READ),
        ])
    );
}

/// The patch resolution itself: null deletes, keyed lists merge, other
/// lists are replaced.
#[test]
fn strategic_merge_follows_the_api_rules() {
    let mut base = serde_json::json!({
        "containers": [{"name": "a", "args": ["x", "y"], "securityContext": {"privileged": false, "capabilities": {"add": ["BPF"]}},
                        "volumeMounts": [{"name": "r", "mountPath": "/r", "readOnly": true}]}],
        "tolerations": [{"operator": "Exists"}]
    });
    let patch = serde_json::json!({
        "containers": [{"name": "a", "args": ["z"], "securityContext": {"privileged": true, "capabilities": null},
                        "volumeMounts": [{"mountPath": "/r", "readOnly": false}, {"name": "d", "mountPath": "/dev"}]}],
        "tolerations": [{"key": "k"}]
    });
    strategic_merge(&mut base, &patch, "");
    assert_eq!(
        base,
        serde_json::json!({
            "containers": [{"name": "a", "args": ["z"], "securityContext": {"privileged": true},
                            "volumeMounts": [{"name": "r", "mountPath": "/r", "readOnly": false}, {"name": "d", "mountPath": "/dev"}]}],
            "tolerations": [{"key": "k"}]
        })
    );
}
