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

#[path = "support/kubelet_node.rs"]
mod kubelet_node;
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kubelet_node::*;
use support::isolated;
use volmgr_kube::testing::real::tail;

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
