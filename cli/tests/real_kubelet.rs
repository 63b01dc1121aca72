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
//! kubelet, one that never became a tmpfs); a healthy node with every
//! volume kind stays clean (`VOLMGR_HEALTHY_SECS`, 600 in CI), with the
//! kubelet's root and the mount table unchanged by observing; status
//! speaks of the kubelet's state (not a never-started manager's); and
//! planted problems (a force-deleted pod, an unbound claim, a missing
//! configMap, a tmpfs unmounted behind the kubelet, a stuck CSI driver)
//! are each reported, with the kubelet's own events.

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
#[path = "support/kubelet_node.rs"]
mod kubelet_node;
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kubelet_node::*;
use support::pod_yaml::PodYaml;
use support::{isolated, tree};
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
            // Loop devices are the host's, not this node's: in CI this test
            // runs beside the CSI tests, whose drivers' loop devices may be
            // found backed by a deleted image for a moment.
            let ours: Vec<_> = report["findings"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|f| f["kind"] != "loop_backing_deleted")
                .collect();
            let stuck = report["stuck_syscalls"].as_array().map_or(0, Vec::len);
            assert!(
                code == 0 || (ours.is_empty() && stuck == 0),
                "doctor on a healthy node: {report:#}"
            );
            checks += 1;
            std::thread::sleep(Duration::from_secs(1));
        }
        assert!(checks > 0);
        // Every volume of app in status, as the kubelet has it: mounted.
        let status = node.status();
        let pod = status["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["uid"] == uid.as_str())
            .unwrap_or_else(|| panic!("app in status: {status:#}"))
            .clone();
        assert_eq!(pod["volumes"].as_array().unwrap().len(), 8, "{pod:#}");
        assert!(
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|v| v["state"] == "mounted"),
            "{pod:#}"
        );
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
    PodYaml::new(name, NODE)
        .spec(extra)
        .volume("scratch", "/scratch", "emptyDir: {}")
        .volume("cache", "/cache", "emptyDir: {medium: Memory}")
        .build()
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

/// `state` of volume `vol` of pod `uid` in status (empty when absent).
fn volume_state(status: &serde_json::Value, uid: &str, vol: &str) -> String {
    status["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["uid"] == uid)
        .flat_map(|p| p["volumes"].as_array().cloned().unwrap_or_default())
        .find(|v| v["name"] == vol)
        .and_then(|v| v["state"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Observe-mode status speaks of the kubelet's state. Observe mode is
/// started before the kubelet (which binds its root onto itself and makes
/// it shared, then mounts a pod's volumes): every volume the kubelet set
/// up is `mounted` ("mounted by the kubelet", no attempts), a volume it
/// cannot set up is `stuck` with since when; `synced` is true once a scan
/// judged the pods as the API server has them; none of the kubelet's
/// mounts, nor the bind of its root, counts as an out-of-band change; the
/// log says neither `tracer="off"` while the tracer loads nor "tearing its
/// volumes down" when a pod leaves (observe mode tears nothing down);
/// `volume_manager_total_volumes{state="actual_state_of_world"}` counts the
/// kubelet's mounted volumes. (Before: every volume `pending attempts=0`,
/// `synced: false` for ever, the actual state's volumes 0,
/// an out-of-band change counted for each of the kubelet's mount-table
/// changes, `tracer="off"` logged while eBPF loaded, and "pod removed:
/// tearing its volumes down" logged by the observer.)
#[test]
fn observe_mode_status_speaks_of_the_kubelets_state() {
    isolated("observe_mode_status_speaks_of_the_kubelets_state", || {
        let Some(node) = Node::start_observed("3s") else {
            return;
        };
        node.wait(60, "observe mode scanned", || node.scans() >= 3);
        // The kubelet bound its root onto itself while observed.
        assert!(
            node.kubelet.log().contains("with shared mount propagation"),
            "{}",
            tail(&node.kubelet.log(), 40)
        );
        let app = pod_with_every_kind("app", &node.env, "");
        let uid = node.run_pod("app", &app, "Running");
        node.server.apply(&pod_with_missing_claim("control"));
        let control = node.uid("control");
        node.wait(120, "the control pod's volume stuck in status", || {
            volume_state(&node.status(), &control, "data") == "stuck"
        });
        node.scanned_again(3);
        let status = node.status();
        let text = node.status_text();
        assert_eq!(status["synced"], true, "{text}");
        for v in [
            "scratch", "cache", "settings", "creds", "info", "token", "host", "logs",
        ] {
            assert_eq!(volume_state(&status, &uid, v), "mounted", "{v}: {text}");
        }
        let volume_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("  ")).collect();
        assert!(
            volume_lines
                .iter()
                .all(|l| !l.contains("pending") && !l.contains("attempts=")),
            "{text}"
        );
        let mounted = volume_lines
            .iter()
            .filter(|l| l.contains("mounted by the kubelet"));
        // app's eight, and control's service account token.
        assert_eq!(mounted.count(), 9, "{text}");
        assert!(text.contains("stuck since "), "{text}");
        assert!(text.starts_with("synced: true"), "{text}");
        assert_eq!(
            status["tracer_stats"]["out_of_band_events"], 0,
            "{status:#}"
        );
        assert_eq!(status["out_of_band"], serde_json::json!([]), "{status:#}");
        assert!(!text.contains("out-of-band"), "{text}");
        // The kubelet's metric of its actual state, from what observe mode
        // sees (app's two emptyDirs).
        let metrics = node.metrics();
        assert!(
            metrics.contains("volume_manager_total_volumes{plugin_name=\"kubernetes.io/empty-dir\",state=\"actual_state_of_world\"} 2"),
            "{metrics}"
        );
        // Nothing reported at or above the kubelet's root (its bind).
        let (_, report) = node.doctor();
        assert!(
            report["findings"]
                .as_array()
                .unwrap()
                .iter()
                .all(|f| f["pod"] == "default/control"),
            "{report:#}"
        );
        // A pod leaves the node: the kubelet tears it down.
        node.kubectl(&["delete", "pod", "app"]);
        node.wait(120, "the observer saw app leave", || {
            node.observer_log().contains("pod removed from the node")
        });
        node.scanned_again(3);
        let log = node.observer_log();
        assert!(!log.contains("tearing its volumes down"), "{log}");
        assert!(!log.contains("tracer=\"off\""), "{log}");
        assert_eq!(node.status()["tracer_stats"]["out_of_band_events"], 0);
    });
}

/// The in-repo CSI driver, registered with the stock kubelet through
/// `ROOT/plugins_registry`, every NodePublishVolume failing.
const STUCK_DRIVER: &str = "stuck.csi.volmgr.test";
/// The driver's answer to NodePublishVolume (in the kubelet's event).
const STUCK_MESSAGE: &str = "injected: the backend is unreachable";

/// Pod `name` with one volume `data` of `source` (a YAML flow mapping).
fn pod_with_volume(name: &str, source: &str) -> String {
    PodYaml::new(name, NODE)
        .volume("data", "/data", source)
        .build()
}

/// The planted problems' objects: a claim no volume binds, the CSIDriver
/// of the stuck driver (inline ephemeral volumes), and one pod each
/// (`unbound`, `nocm`: a configMap that does not exist, `stuckcsi`).
fn stuck_pods() -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: waiting, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: nothing-provisions-this
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {STUCK_DRIVER}}}
spec: {{attachRequired: false, podInfoOnMount: false, volumeLifecycleModes: [Ephemeral]}}
---
{}---
{}---
{}",
        pod_with_volume("unbound", "persistentVolumeClaim: {claimName: waiting}"),
        pod_with_volume("nocm", "configMap: {name: absent}"),
        pod_with_volume("stuckcsi", &format!("csi: {{driver: {STUCK_DRIVER}}}")),
    )
}

/// Messages of the kubelet's `FailedMount` events in a finding.
fn kubelet_failed_mounts(f: &serde_json::Value) -> Vec<String> {
    f["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["reason"] == "FailedMount" && e["source"].as_str().unwrap_or("").contains("kubelet")
        })
        .map(|e| e["message"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Waits until pod `name`'s volume is reported `volume_stuck` with a
/// kubelet `FailedMount` event whose message contains one of `texts`.
fn wait_stuck_with_event(node: &Node, name: &str, texts: &[&str]) {
    let dir = node.pod_dir(&node.uid(name));
    node.wait(
        240,
        &format!("{name} stuck with the kubelet's event"),
        || {
            findings_at(&node.doctor().1, &dir).iter().any(|f| {
                f["kind"] == "volume_stuck"
                    && kubelet_failed_mounts(f)
                        .iter()
                        .any(|m| texts.iter().any(|t| m.contains(t)))
            })
        },
    );
}

/// The problems planted on a node whose kubelet ran them: the pods that
/// cannot start (their FailedMount events recorded by the kubelet), then,
/// the kubelet stopped, a Running pod force-deleted (its mounts left) and
/// another's secret tmpfs unmounted. Returns (the deleted pod's directory,
/// the unmounted secret's path).
fn plant_problems(node: &mut Node, driver: &mut csi_driver::Driver) -> (PathBuf, PathBuf) {
    driver.register_in(node.env.root.join("plugins_registry"));
    driver.faults(serde_json::json!([
        {"method": "NodePublishVolume", "code": "INTERNAL", "message": STUCK_MESSAGE}
    ]));
    driver.start();
    let victim = node.run_pod("victim", &pod_with_empty_dirs("victim", ""), "Running");
    let holder = node.run_pod(
        "holder",
        &pod_with_volume("holder", "secret: {secretName: creds}"),
        "Running",
    );
    node.server.apply(&stuck_pods());
    for name in ["unbound", "nocm", "stuckcsi"] {
        node.wait(240, &format!("the kubelet's FailedMount on {name}"), || {
            node.event_reasons(name).iter().any(|r| r == "FailedMount")
        });
    }
    node.kubelet.kill();
    node.kubectl(&["delete", "pod", "victim", "--force", "--grace-period=0"]);
    let secret = node
        .pod_dir(&holder)
        .join("volumes/kubernetes.io~secret/data");
    nix::mount::umount2(&secret, nix::mount::MntFlags::empty()).unwrap();
    let dir = node.pod_dir(&victim);
    assert!(
        !node.mounts_below(&dir).is_empty(),
        "the kubelet left victim's mounts"
    );
    (dir, secret)
}

/// Planted problems next to the stock kubelet, each reported, with the
/// kubelet's own events where it has some, and observing changes nothing:
/// (a) a pod force-deleted while the kubelet is down (its mounts left) is
/// `mounted_for_deleted_pod`; (b) a pod whose claim is unbound, (c) one
/// whose configMap does not exist and (e) one whose CSI driver (the
/// in-repo driver, registered with the kubelet through
/// `ROOT/plugins_registry`, NodePublishVolume failing) is stuck are
/// `volume_stuck` with the kubelet's `FailedMount` text; (d) a Running
/// pod's secret tmpfs unmounted while the kubelet is down is
/// `recorded_not_mounted`. The tree under the kubelet's root and the mount
/// table are the same before the observer started and after it stopped.
/// (On fae9a6f: (d) was missed; the rest already reported. Today the stock
/// kubelet never registers the in-repo driver, see below: the stuck driver
/// is one whose registration fails, and its pod is reported with the
/// kubelet's "driver name ... not found" event.)
#[test]
fn planted_problems_are_reported_with_the_kubelets_events() {
    isolated(
        "planted_problems_are_reported_with_the_kubelets_events",
        || {
            let Some(mut node) = Node::start() else {
                return;
            };
            let mut driver = csi_driver::Driver::new(&node.env, STUCK_DRIVER);
            let (victim_dir, secret) = plant_problems(&mut node, &mut driver);
            let (tree_before, table_before) = (
                tree(&node.env.root),
                std::fs::read("/proc/self/mountinfo").unwrap(),
            );
            node.observe("1s");
            node.wait(120, "the force-deleted pod's mounts reported", || {
                findings_at(&node.doctor().1, &victim_dir)
                    .iter()
                    .any(|f| f["kind"] == "mounted_for_deleted_pod")
            });
            node.wait(120, "the unmounted secret reported", || {
                findings_at(&node.doctor().1, &secret)
                    .iter()
                    .any(|f| f["kind"] == "recorded_not_mounted" && f["pod"] == "default/holder")
            });
            wait_stuck_with_event(&node, "unbound", &["PVC default/waiting"]);
            wait_stuck_with_event(&node, "nocm", &["configmap \"absent\" not found"]);
            // The stock kubelet fails to register the in-repo driver (its
            // GetInfo: "RegisterPlugin error -- ... stream terminated by
            // RST_STREAM with error code: PROTOCOL_ERROR", the driver's
            // HTTP/2 server refusing the Go client's request), so its event
            // is the unregistered driver's; the injected NodePublishVolume
            // failure's once the driver registers.
            wait_stuck_with_event(
                &node,
                "stuckcsi",
                &[
                    &format!("driver name {STUCK_DRIVER} not found"),
                    STUCK_MESSAGE,
                ],
            );
            let (code, report) = node.doctor();
            assert_eq!(code, 1, "{report:#}");
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
        },
    );
}
