//! A node of a REAL cluster for the real-kubelet tests: etcd and
//! kube-apiserver (`volmgr_kube::testing::real`), a kubelet (the stock one
//! built from the `k8s.io/kubernetes` module, or a fork) with the fake
//! container runtime (`volmgr_kube::testing::kubelet`, sandboxed in the
//! test's private mount namespace), observe mode's user and RBAC, the
//! objects pods read, and the pods every test uses.

#![allow(dead_code)]
// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::pod_yaml::PodYaml;
use crate::support::{volmgr_bin, Agent, Env};
use volmgr_kube::testing::real::{tail, RealApiServer};
use volmgr_kube::testing::RealKubelet;

pub const NODE: &str = "n1";
/// Observe mode's user (bound to `deploy/observe`'s ClusterRole).
pub const OBSERVER: &str = "volmgr-observer";

/// A node: the API server, the kubelet, the observing agent once started.
/// Fields drop in order: the agent, then the kubelet (its mounts
/// detached), then the server, then the directories.
pub struct Node {
    pub observer: Option<Agent>,
    pub kubelet: RealKubelet,
    pub server: RealApiServer,
    pub state: PathBuf,
    pub env: Env,
}

/// The API server with namespace `default`, observe mode's RBAC bound to
/// [`OBSERVER`], the objects the pods read ([`objects`]) and the claim
/// `logs` bound; and the test's directories. `None` where the binaries
/// cannot be had (outside CI).
pub fn cluster() -> Option<(RealApiServer, Env)> {
    let server = RealApiServer::start()?;
    let env = Env::new();
    server.namespace("default");
    server.apply(include_str!("../../../deploy/observe/rbac.yaml"));
    server.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: volmgr-observer}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: volmgr-agent}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {OBSERVER}}}]
"
    ));
    server.apply(&objects(&env));
    server.bind("default", "logs", "pv-logs");
    Some((server, env))
}

impl Node {
    /// The server with namespace `default`, observe mode's RBAC and the
    /// objects the pods read, and the kubelet, Ready. `None` where the
    /// binaries cannot be had (outside CI).
    pub fn start() -> Option<Self> {
        Self::start_with(None, &[])
    }

    /// As [`Self::start`] with the kubelet binary `kubelet` (a fork) and
    /// `env` added to its environment, where `kubelet` is given.
    pub fn start_with(kubelet: Option<&Path>, env_vars: &[(&str, &str)]) -> Option<Self> {
        let (server, env) = cluster()?;
        let stock = server.bin().join("kubelet");
        let bin = kubelet.unwrap_or(&stock);
        let kubelet =
            RealKubelet::start_binary(&server, NODE, &env.root, env.dir.path(), bin, env_vars);
        kubelet.wait_ready(&server);
        let state = env.dir.path().join("state");
        Some(Self {
            observer: None,
            kubelet,
            server,
            state,
            env,
        })
    }

    /// Starts observe mode (scans every 200 ms) with `--stuck-after`.
    pub fn observe(&mut self, stuck_after: &str) {
        let kubeconfig = self.server.write_kubeconfig("observer", OBSERVER, &[]);
        self.observer = Some(self.env.start_agent_without_manifests(&[
            "--observe",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--node-name",
            NODE,
            "--state-dir",
            self.state.to_str().unwrap(),
            "--stuck-after",
            stuck_after,
            "--scan-period",
            "200ms",
        ]));
    }

    /// `volmgr doctor --json`: (exit code, report).
    pub fn doctor(&self) -> (i32, serde_json::Value) {
        let out = Command::new(volmgr_bin())
            .args(["doctor", "--json", "--state-dir"])
            .arg(&self.state)
            .output()
            .unwrap();
        let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        (out.status.code().unwrap_or(-1), v)
    }

    /// `volmgr status --json --root STATE` of the observing agent.
    pub fn status(&self) -> serde_json::Value {
        let out = Command::new(volmgr_bin())
            .args(["status", "--json", "--root"])
            .arg(&self.state)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// Scans observe mode has done (0 before it answers).
    pub fn scans(&self) -> u64 {
        self.status()["observe"]["scans"].as_u64().unwrap_or(0)
    }

    /// Waits until observe mode has scanned `n` more times than now: what
    /// the node looks like now has been judged.
    pub fn scanned_again(&self, n: u64) {
        let from = self.scans();
        self.wait(120, "observe mode scanned again", || {
            self.scans() >= from + n
        });
    }

    /// Waits up to `secs` for `cond`, with the logs on a time-out.
    pub fn wait(&self, secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !cond() {
            if Instant::now() > deadline {
                panic!(
                    "gave up waiting for: {what}\n--- kubelet log tail\n{}\n--- observer log tail\n{}\n--- doctor\n{:#}",
                    tail(&self.kubelet.log(), 60),
                    self.observer.as_ref().map(|a| tail(&a.log(), 60)).unwrap_or_default(),
                    self.doctor().1
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        self.server.kubectl_ok(args, None)
    }

    /// `.status.phase` of pod `name` (empty once it is gone).
    pub fn phase(&self, name: &str) -> String {
        let out = self
            .server
            .kubectl()
            .args(["get", "pod", name, "-o", "jsonpath={.status.phase}"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn uid(&self, name: &str) -> String {
        self.kubectl(&["get", "pod", name, "-o", "jsonpath={.metadata.uid}"])
    }

    /// Creates pod `yaml` and waits for phase `phase`; its UID.
    pub fn run_pod(&self, name: &str, yaml: &str, phase: &str) -> String {
        self.server.apply(yaml);
        self.wait(120, &format!("pod {name} {phase}"), || {
            self.phase(name) == phase
        });
        self.uid(name)
    }

    /// The pod's directory under the kubelet's root.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.env.root.join("pods").join(uid)
    }

    /// Mount points at or below `dir`.
    pub fn mounts_below(&self, dir: &Path) -> Vec<PathBuf> {
        volmgr::sys::mountinfo::read_self()
            .unwrap()
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| p.starts_with(dir))
            .collect()
    }

    /// Reasons of the events recorded on pod `name`.
    pub fn event_reasons(&self, name: &str) -> Vec<String> {
        self.kubectl(&[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name}"),
            "-o",
            "jsonpath={range .items[*]}{.reason}{\"\\n\"}{end}",
        ])
        .lines()
        .map(str::to_string)
        .collect()
    }
}

/// The findings of a doctor report whose path is at or below `path`.
pub fn findings_at(report: &serde_json::Value, path: &Path) -> Vec<serde_json::Value> {
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| {
            f["path"]
                .as_str()
                .is_some_and(|p| Path::new(p).starts_with(path))
        })
        .cloned()
        .collect()
}

/// The objects pods read: a ConfigMap, a Secret, the hostPath
/// PersistentVolume `pv-logs` (`ENV/host-logs`, created by the kubelet's
/// `DirectoryOrCreate`) and its claim `logs` (bound by the caller).
pub fn objects(env: &Env) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata: {{name: settings, namespace: default}}
data: {{mode: fast}}
---
apiVersion: v1
kind: Secret
metadata: {{name: creds, namespace: default}}
stringData: {{password: hunter2}}
---
apiVersion: v1
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
        env.dir.path().join("host-logs").display()
    )
}

/// Pod `name` on the node with `extra` in its spec and every volume kind
/// the stock kubelet mounts without a driver: emptyDir (disk and Memory),
/// configMap, secret, downwardAPI, projected (service account token, the
/// root CA), inline hostPath and a hostPath PersistentVolume's claim.
pub fn pod_with_every_kind(name: &str, env: &Env, extra: &str) -> String {
    every_kind(name, env, extra).build()
}

/// [`pod_with_every_kind`], to add to.
pub fn every_kind(name: &str, env: &Env, extra: &str) -> PodYaml {
    let host = env.dir.path().join("host-inline");
    PodYaml::new(name, NODE)
        .spec(extra)
        .with_payload_volumes()
        .volume(
            "host",
            "/host",
            &format!(
                "hostPath: {{path: {}, type: DirectoryOrCreate}}",
                host.display()
            ),
        )
        .claim("logs", "logs")
}

/// Pod `name` with the hostPath PersistentVolume's claim only.
pub fn pod_with_host_path_claim(name: &str) -> String {
    PodYaml::new(name, NODE).claim("logs", "logs").build()
}

/// Pod `name` with a claim that does not exist: the kubelet cannot mount
/// it either (a real stuck volume, the tests' control).
pub fn pod_with_missing_claim(name: &str) -> String {
    PodYaml::new(name, NODE).claim("data", "nowhere").build()
}

impl Node {
    /// As [`Self::start`], with observe mode (`--stuck-after stuck_after`)
    /// started BEFORE the kubelet: it sees the kubelet's start (the bind of
    /// its root onto itself, made shared) and every mount after. Where
    /// tracefs can be mounted in the test's namespace, the observer (which
    /// cannot mount it, confined) gets the eBPF tracer.
    pub fn start_observed(stuck_after: &str) -> Option<Self> {
        let (server, env) = cluster()?;
        mount_tracefs();
        std::fs::create_dir_all(&env.root).unwrap();
        let state = env.dir.path().join("state");
        let kubeconfig = server.write_kubeconfig("observer", OBSERVER, &[]);
        let observer = env.start_agent_without_manifests(&[
            "--observe",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--node-name",
            NODE,
            "--state-dir",
            state.to_str().unwrap(),
            "--stuck-after",
            stuck_after,
            "--scan-period",
            "200ms",
        ]);
        // The kubelet starts once the observer's tracer watches (eBPF
        // loaded, or the poller after it could not).
        let tracer = || {
            let out = Command::new(volmgr_bin())
                .args(["status", "--json", "--root"])
                .arg(&state)
                .output()
                .unwrap();
            let s: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
            s["tracer"].as_str().unwrap_or("").to_string()
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while tracer().is_empty() || tracer() == "loading" {
            assert!(Instant::now() < deadline, "{}", tail(&observer.log(), 40));
            std::thread::sleep(Duration::from_millis(100));
        }
        let stock = server.bin().join("kubelet");
        let kubelet =
            RealKubelet::start_binary(&server, NODE, &env.root, env.dir.path(), &stock, &[]);
        kubelet.wait_ready(&server);
        Some(Self {
            observer: Some(observer),
            kubelet,
            server,
            state,
            env,
        })
    }

    /// `volmgr status --root STATE` (text) of the observing agent.
    pub fn status_text(&self) -> String {
        let out = Command::new(volmgr_bin())
            .args(["status", "--root"])
            .arg(&self.state)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The observing agent's Prometheus text (its status socket's
    /// `metrics`).
    pub fn metrics(&self) -> String {
        let v = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(volmgr_cli::api::call(
                &self.state,
                &volmgr_cli::api::Request::Metrics,
                Duration::from_secs(30),
            ))
            .unwrap();
        v.as_str().unwrap().to_string()
    }

    /// The observing agent's log so far.
    pub fn observer_log(&self) -> String {
        self.observer.as_ref().map(|a| a.log()).unwrap_or_default()
    }
}

/// Mounts tracefs on `/sys/kernel/tracing` in the test's private mount
/// namespace, as on a node (best effort: without it observe mode runs the
/// mountinfo poller).
pub fn mount_tracefs() {
    let t = Path::new("/sys/kernel/tracing");
    if t.join("events").is_dir() {
        return;
    }
    let _ = nix::mount::mount(
        Some("tracefs"),
        t,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    );
}
