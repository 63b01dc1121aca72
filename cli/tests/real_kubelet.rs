//! Observe mode next to a REAL, stock kubelet: `kubelet` built from the
//! `k8s.io/kubernetes` module with a fake container runtime
//! (`volmgr_kube::testing::kubelet`), registered with a real API server
//! (`volmgr_kube::testing::real`) as node `n1`, mounting pods' volumes
//! itself. The observing agent runs beside it as a user with observe
//! mode's read-only ClusterRole (`deploy/observe/rbac.yaml`). Each test
//! runs in a private mount namespace (the kubelet is sandboxed there: see
//! the harness) with its own server and kubelet.
//!
//! What is checked: no false alarm (a hostPath PersistentVolume, a pod that
//! ended but is still in the API, a graceful deletion while the kubelet
//! tears down) and no miss (a Memory emptyDir unmounted behind the
//! kubelet, one that never became a tmpfs); and a healthy node with every
//! volume kind stays clean, with the kubelet's root and the mount table
//! unchanged by observing.

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{isolated, volmgr_bin, Agent, Env};
use volmgr_kube::testing::real::{tail, RealApiServer};
use volmgr_kube::testing::RealKubelet;

const NODE: &str = "n1";
/// Observe mode's user (bound to `deploy/observe`'s ClusterRole).
const OBSERVER: &str = "volmgr-observer";

/// A node: the API server, the kubelet, the observing agent once started.
/// Fields drop in order: the agent, then the kubelet (its mounts
/// detached), then the server, then the directories.
struct Node {
    observer: Option<Agent>,
    kubelet: RealKubelet,
    server: RealApiServer,
    state: PathBuf,
    env: Env,
}

impl Node {
    /// The server with namespace `default`, observe mode's RBAC and the
    /// objects the pods read, and the kubelet, Ready. `None` where the
    /// binaries cannot be had (outside CI).
    fn start() -> Option<Self> {
        let server = RealApiServer::start()?;
        let env = Env::new();
        server.namespace("default");
        server.apply(include_str!("../../deploy/observe/rbac.yaml"));
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
        let kubelet = RealKubelet::start(&server, NODE, &env.root, env.dir.path());
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
    fn observe(&mut self, stuck_after: &str) {
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
    fn doctor(&self) -> (i32, serde_json::Value) {
        let out = Command::new(volmgr_bin())
            .args(["doctor", "--json", "--state-dir"])
            .arg(&self.state)
            .output()
            .unwrap();
        let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        (out.status.code().unwrap_or(-1), v)
    }

    /// `volmgr status --json --root STATE` of the observing agent.
    fn status(&self) -> serde_json::Value {
        let out = Command::new(volmgr_bin())
            .args(["status", "--json", "--root"])
            .arg(&self.state)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// Scans observe mode has done (0 before it answers).
    fn scans(&self) -> u64 {
        self.status()["observe"]["scans"].as_u64().unwrap_or(0)
    }

    /// Waits until observe mode has scanned `n` more times than now: what
    /// the node looks like now has been judged.
    fn scanned_again(&self, n: u64) {
        let from = self.scans();
        self.wait(120, "observe mode scanned again", || {
            self.scans() >= from + n
        });
    }

    /// Waits up to `secs` for `cond`, with the logs on a time-out.
    fn wait(&self, secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
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

    fn kubectl(&self, args: &[&str]) -> String {
        self.server.kubectl_ok(args, None)
    }

    /// `.status.phase` of pod `name` (empty once it is gone).
    fn phase(&self, name: &str) -> String {
        let out = self
            .server
            .kubectl()
            .args(["get", "pod", name, "-o", "jsonpath={.status.phase}"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn uid(&self, name: &str) -> String {
        self.kubectl(&["get", "pod", name, "-o", "jsonpath={.metadata.uid}"])
    }

    /// Creates pod `yaml` and waits for phase `phase`; its UID.
    fn run_pod(&self, name: &str, yaml: &str, phase: &str) -> String {
        self.server.apply(yaml);
        self.wait(120, &format!("pod {name} {phase}"), || {
            self.phase(name) == phase
        });
        self.uid(name)
    }

    /// The pod's directory under the kubelet's root.
    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.env.root.join("pods").join(uid)
    }

    /// Mount points at or below `dir`.
    fn mounts_below(&self, dir: &Path) -> Vec<PathBuf> {
        volmgr::sys::mountinfo::read_self()
            .unwrap()
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| p.starts_with(dir))
            .collect()
    }

    /// Reasons of the events recorded on pod `name`.
    fn event_reasons(&self, name: &str) -> Vec<String> {
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
fn findings_at(report: &serde_json::Value, path: &Path) -> Vec<serde_json::Value> {
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
fn objects(env: &Env) -> String {
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
fn pod_with_every_kind(name: &str, env: &Env, extra: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {{app: {name}}}}}
spec:
  nodeName: {NODE}
  {extra}
  containers:
  - name: c
    image: busybox
    volumeMounts:
    - {{name: scratch, mountPath: /scratch}}
    - {{name: cache, mountPath: /cache}}
    - {{name: settings, mountPath: /settings}}
    - {{name: creds, mountPath: /creds}}
    - {{name: info, mountPath: /info}}
    - {{name: token, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}}
    - {{name: host, mountPath: /host}}
    - {{name: logs, mountPath: /logs}}
  volumes:
  - {{name: scratch, emptyDir: {{}}}}
  - {{name: cache, emptyDir: {{medium: Memory, sizeLimit: 16Mi}}}}
  - {{name: settings, configMap: {{name: settings}}}}
  - {{name: creds, secret: {{secretName: creds}}}}
  - name: info
    downwardAPI:
      items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]
  - name: token
    projected:
      sources:
      - serviceAccountToken: {{path: token, expirationSeconds: 3607}}
      - configMap: {{name: kube-root-ca.crt, items: [{{key: ca.crt, path: ca.crt}}]}}
  - {{name: host, hostPath: {{path: {}, type: DirectoryOrCreate}}}}
  - {{name: logs, persistentVolumeClaim: {{claimName: logs}}}}
",
        env.dir.path().join("host-inline").display()
    )
}

/// Pod `name` with the hostPath PersistentVolume's claim only.
fn pod_with_host_path_claim(name: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {NODE}
  containers: [{{name: c, image: busybox, volumeMounts: [{{name: logs, mountPath: /logs}}]}}]
  volumes: [{{name: logs, persistentVolumeClaim: {{claimName: logs}}}}]
"
    )
}

/// Pod `name` with a claim that does not exist: the kubelet cannot mount
/// it either (a real stuck volume, the tests' control).
fn pod_with_missing_claim(name: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {NODE}
  containers: [{{name: c, image: busybox, volumeMounts: [{{name: data, mountPath: /data}}]}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: nowhere}}}}]
"
    )
}

/// Every file under `dir` (not following symlinks, crossing mounts): its
/// path, type and mode, size, owner, mtime and a hash of its contents (or
/// of its link target).
fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let md = std::fs::symlink_metadata(&d).unwrap();
        let content = if md.is_file() {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::fs::read(&d).unwrap().hash(&mut h);
            format!("{:016x}", h.finish())
        } else if md.file_type().is_symlink() {
            std::fs::read_link(&d).unwrap().display().to_string()
        } else {
            String::new()
        };
        out.insert(
            d.clone(),
            format!(
                "mode={:o} size={} uid={} gid={} mtime={}.{} {}",
                md.mode(),
                md.size(),
                md.uid(),
                md.gid(),
                md.mtime(),
                md.mtime_nsec(),
                content
            ),
        );
        if md.is_dir() {
            for e in std::fs::read_dir(&d).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out
}

/// How long the healthy node is watched: `VOLMGR_HEALTHY_SECS`, default 60.
fn healthy_secs() -> u64 {
    std::env::var("VOLMGR_HEALTHY_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}

/// A healthy node: a pod with every volume kind the kubelet mounts, Running;
/// `volmgr doctor` exits 0 throughout `VOLMGR_HEALTHY_SECS`, and the
/// kubelet's root and the mount table are the same before and after. (On
/// fae9a6f: the inline hostPath and the hostPath PersistentVolume were
/// `volume_stuck`.)
#[test]
fn healthy_node_with_every_volume_kind_stays_clean() {
    isolated("healthy_node_with_every_volume_kind_stays_clean", || {
        let Some(mut node) = Node::start() else {
            return;
        };
        let app = pod_with_every_kind("app", &node.env, "");
        let uid = node.run_pod("app", &app, "Running");
        let (tree_before, table_before) = (
            tree(&node.env.root),
            std::fs::read("/proc/self/mountinfo").unwrap(),
        );
        node.observe("1s");
        node.wait(60, "observe mode scanned", || node.scans() >= 3);
        let until = Instant::now() + Duration::from_secs(healthy_secs());
        let mut checks = 0;
        while Instant::now() < until {
            let (code, report) = node.doctor();
            assert_eq!(code, 0, "doctor on a healthy node: {report:#}");
            checks += 1;
            std::thread::sleep(Duration::from_secs(1));
        }
        assert!(checks > 0);
        // Every volume of app in status (its state is still the
        // never-started manager's, `pending`: not yet the kubelet's).
        let status = node.status();
        let pod = status["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["uid"] == uid.as_str())
            .unwrap_or_else(|| panic!("app in status: {status:#}"))
            .clone();
        assert_eq!(pod["volumes"].as_array().unwrap().len(), 8, "{pod:#}");
        assert!(node.observer.take().unwrap().term());
        assert_eq!(
            std::fs::read("/proc/self/mountinfo").unwrap(),
            table_before,
            "the mount table changed"
        );
        assert_eq!(
            tree(&node.env.root),
            tree_before,
            "the kubelet's root changed"
        );
        assert!(node.pod_dir(&uid).is_dir());
    });
}

/// A pod using a hostPath PersistentVolume is not reported stuck, nor gets
/// a VolumeStuck event: the kubelet mounts nothing for it and fails it
/// only on its type check. (On fae9a6f: `volume_stuck` on every scan.) A
/// pod whose claim does not exist, which the kubelet cannot start either,
/// is reported: the control that observe mode judged both.
#[test]
fn host_path_persistent_volume_is_not_reported_stuck() {
    isolated("host_path_persistent_volume_is_not_reported_stuck", || {
        let Some(mut node) = Node::start() else {
            return;
        };
        let uid = node.run_pod("logs", &pod_with_host_path_claim("logs"), "Running");
        node.observe("1s");
        node.server.apply(&pod_with_missing_claim("control"));
        let control = node.uid("control");
        let control_dir = node.pod_dir(&control);
        node.wait(120, "the control pod reported stuck", || {
            findings_at(&node.doctor().1, &control_dir)
                .iter()
                .any(|f| f["kind"] == "volume_stuck")
        });
        node.scanned_again(3);
        let (_, report) = node.doctor();
        assert_eq!(
            findings_at(&report, &node.pod_dir(&uid)),
            Vec::<serde_json::Value>::new(),
            "{report:#}"
        );
        assert!(
            !node
                .event_reasons("logs")
                .iter()
                .any(|r| r == "VolumeStuck"),
            "{:?}",
            node.event_reasons("logs")
        );
    });
}

/// Pod `name` with a disk and a Memory emptyDir, and `extra` in its spec.
fn pod_with_empty_dirs(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {NODE}
  {extra}
  containers:
  - name: c
    image: busybox
    volumeMounts: [{{name: scratch, mountPath: /scratch}}, {{name: cache, mountPath: /cache}}]
  volumes:
  - {{name: scratch, emptyDir: {{}}}}
  - {{name: cache, emptyDir: {{medium: Memory}}}}
"
    )
}

/// An orphaned pod directory as the kubelet leaves it and does not clean
/// up (a volume directory with a file in it: its rmdir fails), the tests'
/// control of (a); its path.
fn plant_orphan(node: &Node) -> PathBuf {
    let dir = node
        .env
        .root
        .join("pods/0f0f0f0f-0000-4000-8000-000000000001");
    let vol = dir.join("volumes/kubernetes.io~empty-dir/left");
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::write(vol.join("data"), b"x").unwrap();
    dir
}

/// A pod that ended (the kubelet failed it: `activeDeadlineSeconds`) but
/// is still in the API is not an orphan: the kubelet tears its volumes
/// down and keeps its directory until the pod is deleted. (On fae9a6f:
/// `orphaned_pod_dir`, "remove the directory".) A real orphan, planted
/// after the kubelet's teardown, is reported: observe mode judged both.
#[test]
fn ended_pod_still_in_the_api_is_not_orphaned() {
    isolated("ended_pod_still_in_the_api_is_not_orphaned", || {
        let Some(mut node) = Node::start() else {
            return;
        };
        node.observe("1s");
        let pod = pod_with_empty_dirs("job", "activeDeadlineSeconds: 2");
        let uid = node.run_pod("job", &pod, "Failed");
        let dir = node.pod_dir(&uid);
        node.wait(120, "the kubelet tore job's volumes down", || {
            node.mounts_below(&dir).is_empty()
        });
        assert!(dir.is_dir(), "the kubelet keeps the directory");
        let orphan = plant_orphan(&node);
        node.wait(120, "the planted orphan reported", || {
            findings_at(&node.doctor().1, &orphan)
                .iter()
                .any(|f| f["kind"] == "orphaned_pod_dir")
        });
        let (_, report) = node.doctor();
        assert_eq!(
            findings_at(&report, &dir),
            Vec::<serde_json::Value>::new(),
            "{report:#}"
        );
        assert!(dir.is_dir(), "still there: the pod is in the API");
    });
}

/// A graceful deletion: while the kubelet stops the containers, tears the
/// volumes down, deletes the pod and removes its directory, observe mode
/// raises nothing and `doctor` exits 0 throughout. (On fae9a6f:
/// `mounted_for_deleted_pod` as soon as the containers stopped, then
/// `orphaned_pod_dir`, `doctor` exiting 1.)
#[test]
fn graceful_deletion_raises_nothing_while_the_kubelet_tears_down() {
    isolated(
        "graceful_deletion_raises_nothing_while_the_kubelet_tears_down",
        || {
            let Some(mut node) = Node::start() else {
                return;
            };
            let app = pod_with_every_kind("app", &node.env, "");
            let uid = node.run_pod("app", &app, "Running");
            let dir = node.pod_dir(&uid);
            node.observe("20s");
            node.wait(60, "observe mode scanned", || node.scans() >= 3);
            node.kubectl(&["delete", "pod", "app", "--wait=false"]);
            let mut polls = 0;
            while dir.exists() {
                let (code, report) = node.doctor();
                assert_eq!(code, 0, "doctor while the kubelet tears down: {report:#}");
                polls += 1;
                assert!(
                    polls < 1500,
                    "the kubelet never removed {}: {}",
                    dir.display(),
                    tail(&node.kubelet.log(), 60)
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(node.phase("app").is_empty(), "deleted from the API");
            node.scanned_again(3);
            let (code, report) = node.doctor();
            assert_eq!(code, 0, "{report:#}");
        },
    );
}

/// Misses: a Running pod's Memory emptyDir unmounted behind the kubelet
/// (which does not mount it again: the container writes to the node's
/// disk) is reported `recorded_not_mounted`; a Pending pod whose Memory
/// emptyDir directory exists but is not a tmpfs (a kubelet that made the
/// directory and went down) is reported `volume_stuck`. (On fae9a6f:
/// neither.)
#[test]
fn memory_empty_dir_without_its_tmpfs_is_reported() {
    isolated("memory_empty_dir_without_its_tmpfs_is_reported", || {
        let Some(mut node) = Node::start() else {
            return;
        };
        let uid = node.run_pod("app", &pod_with_empty_dirs("app", ""), "Running");
        let cache = node.env.empty_dir(&uid, "cache");
        node.observe("1s");
        node.wait(60, "observe mode scanned", || node.scans() >= 3);
        assert_eq!(node.doctor().0, 0, "{:#}", node.doctor().1);
        nix::mount::umount2(&cache, nix::mount::MntFlags::empty()).unwrap();
        node.wait(120, "the unmounted tmpfs reported", || {
            findings_at(&node.doctor().1, &cache)
                .iter()
                .any(|f| f["kind"] == "recorded_not_mounted" && f["pod"] == "default/app")
        });
        assert!(cache.is_dir() && node.mounts_below(&cache).is_empty());

        // The kubelet down; a new pod whose Memory emptyDir's directory is
        // there, never mounted.
        node.kubelet.kill();
        node.server.apply(&pod_with_empty_dirs("late", ""));
        let late = node.uid("late");
        let late_cache = node.env.empty_dir(&late, "cache");
        std::fs::create_dir_all(&late_cache).unwrap();
        std::fs::create_dir_all(node.env.empty_dir(&late, "scratch")).unwrap();
        node.wait(120, "the pending pod's volume reported stuck", || {
            findings_at(&node.doctor().1, &late_cache)
                .iter()
                .any(|f| f["kind"] == "volume_stuck" && f["pod"] == "default/late")
        });
        assert_eq!(node.phase("late"), "Pending");
    });
}
