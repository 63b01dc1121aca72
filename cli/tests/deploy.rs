//! The manifests in `deploy/`, as a cluster gets them: every kustomization
//! under `deploy/` is rendered by the real `kubectl kustomize` (the
//! binaries of `scripts/kube-binaries.sh`, through
//! `volmgr_kube::testing::real`), so a layout kustomize refuses (an overlay
//! inside its own base, a missing file) fails here as it fails on a
//! cluster. Then, on what it renders:
//!
//! - every document parses as its k8s-openapi type and survives a round
//!   trip unchanged (serde drops unknown or misspelled fields);
//! - every flag the DaemonSet passes is one `volmgr agent --help` lists;
//! - observe mode (`deploy/observe/`, the default) is read-only: RBAC
//!   verbs, read-only host paths, not privileged, a fixed capability set;
//! - manager mode (`deploy/manager/`) grants nothing of its own (no RBAC
//!   object, no ServiceAccount token): it runs with the node's kubelet
//!   kubeconfig, mounted read-only, as `system:node:<name>`;
//! - a real kube-apiserver (Node,RBAC authorization, NodeRestriction)
//!   accepts every rendered set in a server-side dry run with strict field
//!   validation, and bounds a node's credentials as the docs say.
//!
//! Without the binaries (no Go outside CI) the tests say SKIP and pass;
//! under CI they fail instead.

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, ServiceAccount, VolumeMount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use volmgr_kube::testing::real::{kube_binaries, RealApiServer};

/// The overlays `kubectl apply -k` is documented with (README.md,
/// docs/USAGE.md), relative to deploy/; "" is deploy/ itself (observe
/// mode, the same as deploy/observe/).
const OBSERVE: &str = "observe";
const MANAGER: &str = "manager";
const OVERLAYS: &[&str] = &["", OBSERVE, MANAGER];

/// The kubelet's kubeconfig on the node (kubeadm's path), which manager
/// mode mounts read-only and passes as `--kubeconfig`.
const KUBELET_KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";
/// The kubelet's root, and below it the kubelet's client certificate
/// (`kubelet-client-current.pem`, named by its kubeconfig).
const KUBELET_ROOT: &str = "/var/lib/kubelet";
const KUBELET_PKI: &str = "/var/lib/kubelet/pki";

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .canonicalize()
        .unwrap()
}

/// The real `kubectl`, once per test process (the script builds the
/// binaries on first use: one build, not one per test); `None` (SKIP)
/// where they cannot be had outside CI.
fn kubectl() -> Option<PathBuf> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| kube_binaries().map(|d| d.join("kubectl")))
        .clone()
}

/// Every directory under deploy/ that holds a kustomization.yaml,
/// relative to deploy/ ("" for deploy/ itself), sorted.
fn kustomization_dirs() -> Vec<String> {
    let root = deploy_dir();
    let mut dirs = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        if dir.join("kustomization.yaml").exists() {
            let rel = dir.strip_prefix(&root).unwrap();
            dirs.push(rel.to_str().unwrap().to_string());
        }
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    dirs.sort();
    dirs
}

/// `kubectl kustomize deploy/<sub>` with the real kubectl: the YAML it
/// prints (what `kubectl apply -k` sends), or its error.
fn kustomize(kubectl: &Path, sub: &str) -> Result<String, String> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(deploy_dir().join(sub))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn rendered(kubectl: &Path, sub: &str) -> String {
    kustomize(kubectl, sub).unwrap_or_else(|e| panic!("kubectl kustomize deploy/{sub} fails: {e}"))
}

/// Every YAML document of `text`, as JSON.
fn yaml_documents(what: &str, text: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    for d in serde_norway::Deserializer::from_str(text) {
        let v = Value::deserialize(d).unwrap_or_else(|e| panic!("{what}: {e}"));
        if !v.is_null() {
            docs.push(v);
        }
    }
    docs
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

/// One rendered manifest set, typed.
struct Manifests {
    set: String,
    namespace: Namespace,
    daemonset: DaemonSet,
    accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    bindings: Vec<RoleBinding>,
}

impl Manifests {
    fn pod(&self) -> &PodSpec {
        self.daemonset.spec.template.spec.as_ref().unwrap()
    }

    fn agent(&self) -> &Container {
        let pod = self.pod();
        assert_eq!(
            pod.containers.len(),
            1,
            "{}: one container, the agent",
            self.set
        );
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

    fn mounts(&self) -> &[VolumeMount] {
        self.agent().volume_mounts.as_deref().unwrap()
    }

    /// The pod volume behind a volume mount.
    fn volume(&self, mount: &VolumeMount) -> &k8s_openapi::api::core::v1::Volume {
        self.pod()
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == mount.name)
            .unwrap_or_else(|| panic!("{}: no volume {}", self.set, mount.name))
    }

    /// The host path behind a volume mount, if it is a hostPath.
    fn host_path(&self, mount: &VolumeMount) -> Option<String> {
        self.volume(mount)
            .host_path
            .as_ref()
            .map(|h| h.path.clone())
    }

    fn mount_at(&self, path: &str) -> &VolumeMount {
        self.mounts()
            .iter()
            .find(|m| m.mount_path == path)
            .unwrap_or_else(|| panic!("{}: nothing mounted at {path}", self.set))
    }

    /// Every (group/resource, verb) the ClusterRoles grant.
    fn granted(&self) -> BTreeSet<String> {
        let mut granted = BTreeSet::new();
        for role in &self.cluster_roles {
            for r in role.rules.as_ref().unwrap() {
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
        }
        granted
    }
}

/// The manifest set `kubectl apply -k deploy/<sub>` sends, rendered by
/// the real kubectl and typed; `None` (SKIP) without the binaries.
fn manifests(sub: &str) -> Option<Manifests> {
    let kubectl = kubectl()?;
    let set = format!("deploy/{sub}");
    let (mut ns, mut ds) = (None, None);
    let mut m = Manifests {
        set: set.clone(),
        namespace: Namespace::default(),
        daemonset: DaemonSet::default(),
        accounts: Vec::new(),
        cluster_roles: Vec::new(),
        cluster_bindings: Vec::new(),
        roles: Vec::new(),
        bindings: Vec::new(),
    };
    for v in yaml_documents(&set, &rendered(&kubectl, sub)) {
        match v["kind"].as_str().unwrap_or_default() {
            "Namespace" => {
                assert!(ns.is_none(), "{set}: one Namespace");
                ns = Some(typed::<Namespace>(&set, &v));
            }
            "DaemonSet" => {
                assert!(ds.is_none(), "{set}: one DaemonSet");
                ds = Some(typed::<DaemonSet>(&set, &v));
            }
            "ServiceAccount" => m.accounts.push(typed(&set, &v)),
            "ClusterRole" => m.cluster_roles.push(typed(&set, &v)),
            "ClusterRoleBinding" => m.cluster_bindings.push(typed(&set, &v)),
            "Role" => m.roles.push(typed(&set, &v)),
            "RoleBinding" => m.bindings.push(typed(&set, &v)),
            k => panic!("{set}: unexpected kind {k:?}"),
        }
    }
    m.namespace = ns.unwrap_or_else(|| panic!("{set}: a Namespace"));
    m.daemonset = ds.unwrap_or_else(|| panic!("{set}: a DaemonSet"));
    node_agent_basics(&m);
    flags_exist(&m);
    Some(m)
}

/// Every kustomization under deploy/ renders with the real kubectl
/// (kustomize refuses an overlay inside its own base: "cycle detected"),
/// the set of them is the documented one plus the shared base, and every
/// file under deploy/ is a resource or patch of the kustomization in its
/// own directory (nothing lying around that no `apply -k` sends).
#[test]
fn every_kustomization_renders_with_the_real_kubectl() {
    let Some(kubectl) = kubectl() else { return };
    let dirs = kustomization_dirs();
    let mut failures = Vec::new();
    for d in &dirs {
        if let Err(e) = kustomize(&kubectl, d) {
            failures.push(format!("kubectl kustomize deploy/{d}: {}", e.trim()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let mut want: Vec<String> = OVERLAYS.iter().map(|s| s.to_string()).collect();
    want.push("base".to_string());
    want.sort();
    assert_eq!(dirs, want, "the kustomizations under deploy/");

    // deploy/ is observe mode, exactly.
    assert_eq!(rendered(&kubectl, ""), rendered(&kubectl, OBSERVE));

    let root = deploy_dir();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let k = dir.join("kustomization.yaml");
        let mut named = BTreeSet::new();
        if k.exists() {
            let text = std::fs::read_to_string(&k).unwrap();
            let k = yaml_documents(&k.display().to_string(), &text).remove(0);
            for r in k["resources"].as_array().into_iter().flatten() {
                named.insert(dir.join(r.as_str().unwrap()));
            }
            for p in k["patches"].as_array().into_iter().flatten() {
                if let Some(path) = p["path"].as_str() {
                    named.insert(dir.join(path));
                }
            }
        }
        for e in std::fs::read_dir(&dir).unwrap() {
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
                p.file_name().unwrap() == "kustomization.yaml" || named.contains(&p),
                "{} is in no kustomization",
                p.display()
            );
        }
    }
}

/// What both modes share: a node agent on every node, the node's name
/// from the downward API, the kubelet's root at the same path inside, the
/// image this version builds, every mount backed by a volume.
fn node_agent_basics(m: &Manifests) {
    let set = &m.set;
    let pod = m.pod();
    assert_eq!(pod.host_pid, Some(true), "{set}");
    assert_eq!(
        m.daemonset.metadata.namespace, m.namespace.metadata.name,
        "{set}: the DaemonSet is in the set's Namespace"
    );
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
    assert_eq!(root, KUBELET_ROOT, "{set}");
    assert_eq!(
        m.host_path(m.mount_at(&root)).as_deref(),
        Some(root.as_str())
    );
    // Every mount has its volume, every volume is mounted.
    for v in pod.volumes.as_ref().unwrap() {
        assert!(
            m.mounts().iter().any(|vm| vm.name == v.name),
            "{set}: {} unused",
            v.name
        );
    }
    for vm in m.mounts() {
        m.volume(vm);
    }
    // Nothing of the host's /etc/kubernetes but the kubelet's kubeconfig
    // (a control-plane node keeps admin.conf and the cluster CA's key
    // there), and no host path that holds it.
    for v in pod.volumes.as_ref().unwrap() {
        if let Some(h) = &v.host_path {
            let p = Path::new(&h.path);
            assert!(
                !Path::new("/etc/kubernetes").starts_with(p),
                "{set}: hostPath {} holds /etc/kubernetes",
                h.path
            );
            if p.starts_with("/etc/kubernetes") {
                assert_eq!(h.path, KUBELET_KUBECONFIG, "{set}");
                assert_eq!(h.type_.as_deref(), Some("File"), "{set}");
            }
        }
    }
}

/// Every flag the DaemonSet passes exists in `volmgr agent --help`.
fn flags_exist(m: &Manifests) {
    let set = &m.set;
    let out = Command::new(env!("CARGO_BIN_EXE_volmgr"))
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

/// Observe mode (`kubectl apply -k deploy/observe/`): reads, never
/// changes; its own ServiceAccount with read-only RBAC, in-cluster config.
#[test]
fn observe_mode_reads_only() {
    let Some(m) = manifests(OBSERVE) else { return };
    assert!(m.has_switch("observe"));
    assert!(!m.has_switch("report-volumes-in-use") && m.flag("manifests").is_none());
    assert!(m.flag("stuck-after").is_some() && m.flag("stuck-syscall-after").is_some());
    assert!(m.flag("stuck-tool-after").is_some());
    assert!(
        m.flag("kubeconfig").is_none() && !m.has_switch("kubeconfig"),
        "observe mode: no --kubeconfig, the in-cluster config of its ServiceAccount"
    );
    // The state directory is not under the (read-only) root.
    let state = m.flag("state-dir").unwrap();
    assert!(!Path::new(&state).starts_with(m.flag("root").unwrap()));

    // Its identity: its own ServiceAccount, bound to its own ClusterRole,
    // nothing else.
    let pod = m.pod();
    assert_eq!(m.accounts.len(), 1);
    let account = &m.accounts[0];
    assert_eq!(
        pod.service_account_name.as_deref(),
        account.metadata.name.as_deref()
    );
    assert_ne!(pod.automount_service_account_token, Some(false));
    assert_eq!(account.metadata.namespace, m.daemonset.metadata.namespace);
    assert_eq!(m.cluster_roles.len(), 1);
    assert_eq!(m.cluster_bindings.len(), 1);
    assert!(m.roles.is_empty() && m.bindings.is_empty());
    let b = &m.cluster_bindings[0];
    assert_eq!(b.role_ref.kind, "ClusterRole");
    assert_eq!(
        Some(&b.role_ref.name),
        m.cluster_roles[0].metadata.name.as_ref()
    );
    let subjects = b.subjects.as_ref().unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), account.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, account.metadata.namespace);

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
            // The node's CSINode, for the CSI registration triage.
            ("storage.k8s.io", &["csinodes"], &["get"]),
            // The node's Node, for kubelet_disagrees' attach side (its
            // status.volumesAttached).
            ("", &["nodes"], &["get"]),
            ("events.k8s.io", &["events"], &["create", "patch"]),
            // A stuck pod's recent events, read back for finding (d).
            ("", &["events"], &["get", "list"]),
        ])
    );
    // Payload volumes are observed by name only: no right to read what
    // they hold (a read-only observer that could read every Secret would
    // not be installed).
    for g in &granted {
        let resource = g.split_once(':').unwrap().0.rsplit('/').next().unwrap();
        assert!(
            ![
                "configmaps",
                "secrets",
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
    let root = m.mount_at(KUBELET_ROOT);
    assert_eq!(root.read_only, Some(true));
    assert_eq!(root.mount_propagation.as_deref(), Some("HostToContainer"));
    // Every host path read-only and never Bidirectional; the only
    // writable volume is the agent's own state (an emptyDir).
    for vm in m.mounts() {
        assert_ne!(vm.mount_propagation.as_deref(), Some("Bidirectional"));
        if m.host_path(vm).is_some() {
            assert_eq!(
                vm.read_only,
                Some(true),
                "hostPath {} read-only",
                vm.mount_path
            );
        } else {
            assert!(
                m.volume(vm).empty_dir.is_some(),
                "{}: hostPath or emptyDir",
                vm.name
            );
        }
    }
    assert!(m.mounts().iter().all(|vm| vm.mount_path != "/dev"));
    assert_ne!(pod.host_network, Some(true));

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
/// node's volume manager on the kubelet's root, with the node's own
/// credentials (the kubelet's kubeconfig and client certificate, read
/// from the host), so the Node authorizer and NodeRestriction bound it as
/// they bound the kubelet. It brings no RBAC and no ServiceAccount token:
/// nothing cluster-wide to steal from a compromised node.
#[test]
fn manager_mode_runs_with_the_nodes_credentials() {
    let Some(m) = manifests(MANAGER) else { return };
    assert!(!m.has_switch("observe") && m.has_switch("report-volumes-in-use"));
    assert!(m.flag("manifests").is_some());

    // No grants of its own, no account of its own, no token.
    assert!(
        m.cluster_roles.is_empty()
            && m.cluster_bindings.is_empty()
            && m.roles.is_empty()
            && m.bindings.is_empty(),
        "manager mode grants nothing: it has the node's rights"
    );
    assert!(m.accounts.is_empty(), "no ServiceAccount of its own");
    let pod = m.pod();
    assert!(pod.service_account_name.is_none() && pod.service_account.is_none());
    assert_eq!(
        pod.automount_service_account_token,
        Some(false),
        "no ServiceAccount token in the pod"
    );

    // The kubelet's kubeconfig, from the host, read-only, at its own path
    // (the client certificate it names is a host path too).
    assert_eq!(
        m.flag("kubeconfig").as_deref(),
        Some(KUBELET_KUBECONFIG),
        "--kubeconfig={KUBELET_KUBECONFIG}"
    );
    let kc = m.mount_at(KUBELET_KUBECONFIG);
    assert_eq!(kc.read_only, Some(true), "the kubeconfig read-only");
    assert!(kc.sub_path.is_none() && kc.sub_path_expr.is_none());
    let kv = m.volume(kc).host_path.as_ref().unwrap();
    assert_eq!(kv.path, KUBELET_KUBECONFIG);
    assert_eq!(kv.type_.as_deref(), Some("File"));
    // The client certificate directory is the host's, under the kubelet
    // root mounted at its own path; nothing is mounted below that root
    // (a mount made there would propagate back to the host through the
    // Bidirectional root, once per container start).
    let root = m.mount_at(KUBELET_ROOT);
    assert!(Path::new(KUBELET_PKI).starts_with(&root.mount_path));
    assert_eq!(m.host_path(root).as_deref(), Some(KUBELET_ROOT));
    for vm in m.mounts() {
        assert!(
            vm.mount_path == KUBELET_ROOT || !Path::new(&vm.mount_path).starts_with(KUBELET_ROOT),
            "{} is mounted below the Bidirectional kubelet root",
            vm.mount_path
        );
    }
    // The kubelet's network: its kubeconfig names the API server as the
    // host reaches it (often a local proxy on 127.0.0.1), with the host's
    // resolver.
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("Default"));

    // The node's volume manager: the root read-write and Bidirectional,
    // block devices, privileged.
    assert_ne!(root.read_only, Some(true));
    assert_eq!(root.mount_propagation.as_deref(), Some("Bidirectional"));
    assert_eq!(m.host_path(m.mount_at("/dev")).as_deref(), Some("/dev"));
    let sc = m.agent().security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(true));
}

/// `kubectl ARGS` with `stdin`: (success, stdout + stderr).
fn run(mut cmd: Command, stdin: &str) -> (bool, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `kubectl apply --server-side --dry-run=server --validate=strict` of
/// `manifest` as the cluster admin.
fn dry_run(server: &RealApiServer, manifest: &str) -> (bool, String) {
    let mut cmd = server.kubectl();
    cmd.args([
        "apply",
        "--server-side",
        "--dry-run=server",
        "--validate=strict",
        "--field-manager=volmgr-deploy-test",
        "-f",
        "-",
    ]);
    run(cmd, manifest)
}

/// Every overlay, as rendered, passes a server-side dry run with strict
/// field validation against a real kube-apiserver (admission included);
/// the same server refuses a misspelled field, so strictness is real.
/// Then the identity manager mode runs as: a node's credentials get what
/// the Node authorizer gives a kubelet, and none of what the old
/// ClusterRole gave (every Secret, any ServiceAccount's token, every Node).
#[test]
fn every_overlay_passes_a_server_side_dry_run() {
    let Some(kubectl) = kubectl() else { return };
    // As clusters run it (kubeadm, kind and managed clusters alike): the
    // API server's default refuses every privileged container, manager
    // mode's included ("disallowed by cluster policy").
    let server = RealApiServer::start_with(kubectl.parent().unwrap(), &["--allow-privileged=true"]);
    // The namespaced objects of a dry run need their namespace to exist
    // (the rendered Namespace is itself only dry-run).
    let ns = manifests(OBSERVE).unwrap().namespace.metadata.name.unwrap();
    server.namespace(&ns);

    for sub in OVERLAYS {
        let text = rendered(&kubectl, sub);
        let (ok, out) = dry_run(&server, &text);
        assert!(ok, "deploy/{sub}: the server-side dry run fails:\n{out}");
        let docs = yaml_documents(sub, &text).len();
        assert_eq!(
            out.lines()
                .filter(|l| l.contains("(server dry run)"))
                .count(),
            docs,
            "deploy/{sub}: every object dry-run:\n{out}"
        );
    }
    // Nothing was created: a dry run.
    let (ok, out) = run(
        {
            let mut c = server.kubectl();
            c.args(["get", "daemonsets,serviceaccounts", "-n", &ns, "-o", "name"]);
            c
        },
        "",
    );
    assert!(ok, "{out}");
    assert!(!out.contains("volmgr-agent"), "{out}");

    // Strict validation refuses an unknown field (the dry run above would
    // have refused a misspelled one).
    let mut bad: Value = yaml_documents(MANAGER, &rendered(&kubectl, MANAGER))
        .into_iter()
        .find(|v| v["kind"] == "DaemonSet")
        .unwrap();
    bad["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = Value::Array(Vec::new());
    let (ok, out) = dry_run(&server, &bad.to_string());
    assert!(
        !ok && out.contains("volumeMount"),
        "strict validation: {out}"
    );

    // Manager mode's identity: system:node:<name> in system:nodes, as the
    // kubelet (its kubeconfig and client certificate).
    let node = server.node_kubeconfig("n1");
    let can = |args: &[&str]| -> bool {
        let out = Command::new(&kubectl)
            .arg(format!("--kubeconfig={}", node.display()))
            .args(["auth", "can-i"])
            .args(args)
            .output()
            .unwrap();
        // "yes", or "no" with the authorizer's reason after it.
        let stdout = String::from_utf8_lossy(&out.stdout);
        let answer = stdout.split_whitespace().next().unwrap_or_default();
        assert!(
            answer == "yes" || answer == "no",
            "can-i {args:?}: {answer} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        answer == "yes"
    };
    // What the kubelet may (not subdivided by the Node authorizer, or its
    // own objects): its Node and its status, events, CSINodes, CSIDrivers.
    assert!(can(&["get", "nodes/n1"]));
    assert!(can(&["patch", "nodes/n1", "--subresource=status"]));
    assert!(can(&["create", "events.events.k8s.io", "-n", &ns]));
    assert!(can(&["create", "csinodes.storage.k8s.io"]));
    assert!(can(&["list", "csidrivers.storage.k8s.io"]));
    // What the old ClusterRole gave every node and a node may not: any
    // Secret or ConfigMap, any ServiceAccount's token, other Nodes, claims
    // cluster-wide.
    assert!(!can(&["list", "secrets", "-A"]));
    assert!(!can(&["get", "secrets/anything", "-n", "kube-system"]));
    assert!(!can(&["list", "configmaps", "-A"]));
    for sa_ns in ["kube-system", ns.as_str()] {
        assert!(!can(&[
            "create",
            "serviceaccounts/default",
            "--subresource=token",
            "-n",
            sa_ns
        ]));
    }
    assert!(!can(&["list", "nodes"]));
    assert!(!can(&["get", "nodes/n2"]));
    assert!(!can(&["patch", "csinodes.storage.k8s.io/n2"]));
    assert!(!can(&["list", "persistentvolumeclaims", "-A"]));
}
