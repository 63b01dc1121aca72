//! End-to-end test of observe mode (`volmgr agent --observe`): a
//! kubelet-like ROOT is set up for real (the managing agent stages and
//! publishes through the in-repo CSI driver, mounts emptyDirs), the
//! managing agent stops, and each finding (a)-(g) is planted the way it
//! happens on a node. The observing agent must report each exactly once
//! with its evidence (a stuck volume's finding with its pod's events from
//! the API server), refuse a write under ROOT (Landlock), and leave ROOT
//! and the mount table byte-identical.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use csi_driver::{wait_for, Driver};
use support::{free_port, isolated, metrics, tree, volmgr_bin, Env};
use volmgr_kube::testing::FakeApiServer;

const DRIVER: &str = "loop.csi.volmgr.dev";

/// A PersistentVolume of the test driver and its bound claim.
fn pv_yaml(pv: &str, handle: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {pv}}}\nspec:\n  capacity: {{storage: 64Mi}}\n  accessModes: [ReadWriteMany]\n  claimRef: {{namespace: test, name: claim-{pv}}}\n  csi: {{driver: {DRIVER}, volumeHandle: {handle}, fsType: ext4, volumeAttributes: {{size: 64Mi}}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-{pv}, namespace: test}}\nspec: {{volumeName: {pv}, accessModes: [ReadWriteMany]}}\n"
    )
}

/// A block PersistentVolume of the test driver and its bound claim.
fn block_pv_yaml(pv: &str, handle: &str) -> String {
    pv_yaml(pv, handle)
        .replace("  claimRef:", "  volumeMode: Block\n  claimRef:")
        .replace("spec: {volumeName", "spec: {volumeMode: Block, volumeName")
}

/// Pod `mapped` with the block claim of pv-5 as a device.
const MAPPED_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: mapped, namespace: test, uid: uid-mapped}\nspec:\n  containers: [{name: c, image: i, volumeDevices: [{name: dev, devicePath: /dev/xvda}]}]\n  volumes: [{name: dev, persistentVolumeClaim: {claimName: claim-pv-5}}]\n";

/// A pod with the claim of `pv` (volume `data`) and an emptyDir (`scratch`).
fn pod_yaml(name: &str, uid: &str, pv: Option<&str>, memory: bool) -> String {
    let medium = if memory { "{medium: Memory}" } else { "{}" };
    let scratch = format!("emptyDir: {medium}");
    let claim = pv.map(|pv| format!("persistentVolumeClaim: {{claimName: claim-{pv}}}"));
    let mut vols = vec![("scratch", scratch.as_str())];
    if let Some(c) = &claim {
        vols.push(("data", c.as_str()));
    }
    support::pod_yaml(name, uid, &vols)
}

/// `plugins/kubernetes.io/csi/volumeDevices`: the CSI block layout.
fn volume_devices(env: &Env) -> PathBuf {
    env.root.join("plugins/kubernetes.io/csi/volumeDevices")
}

fn stage_path(env: &Env, handle: &str) -> PathBuf {
    env.root
        .join("plugins/kubernetes.io/csi")
        .join(DRIVER)
        .join(volmgr::plugins::csi::handle_hash(handle))
        .join("globalmount")
}

/// `/proc/self/mountinfo` as bytes.
fn mount_table() -> Vec<u8> {
    std::fs::read("/proc/self/mountinfo").unwrap()
}

/// A loop device attached to a file that is then deleted, detached on drop.
struct DeletedLoop(String);

impl DeletedLoop {
    fn new(dir: &Path) -> Self {
        let img = dir.join("deleted.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&img)
            .output()
            .unwrap();
        assert!(out.status.success(), "losetup: {out:?}");
        std::fs::remove_file(&img).unwrap();
        Self(String::from_utf8(out.stdout).unwrap().trim().to_string())
    }
}

impl Drop for DeletedLoop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// A pod with configMap, secret, downwardAPI and projected volumes (the
/// secret and projected ones are tmpfs mounts), with its ConfigMap and
/// Secret.
fn config_pod_yaml() -> String {
    let objects = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm, namespace: test}\ndata: {a: \"1\"}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: sec, namespace: test}\ndata: {k: aGk=}\n---\n";
    let pod = support::pod_yaml(
        "config",
        "uid-config",
        &[
            ("cm", "configMap: {name: cm}"),
            ("sec", "secret: {secretName: sec}"),
            (
                "dapi",
                "downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}",
            ),
            (
                "proj",
                "projected: {sources: [{configMap: {name: cm}}, {downwardAPI: {items: [{path: ns, fieldRef: {fieldPath: metadata.namespace}}]}}]}",
            ),
        ],
    );
    format!("{objects}{pod}")
}

/// What observe mode may not read (deploy/rbac.yaml): payload volumes are
/// observed by name only.
const NOT_READ: [&str; 5] = [
    "configmaps",
    "secrets",
    "nodes",
    "clustertrustbundles",
    "serviceaccounts",
];

/// The objects of the manifests directory on the fake API server, the
/// pods bound to `node-1` and running, with the Node; ConfigMaps and
/// Secrets are not served, and none of [`NOT_READ`] may be read.
fn serve_manifests(env: &Env, api: &FakeApiServer) {
    for r in NOT_READ {
        api.refuse_reads_of(r);
    }
    api.apply(serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
        "status": {"allocatable": {"cpu": "2", "memory": "1Gi"}, "capacity": {"cpu": "2", "memory": "1Gi"}}}));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&env.manifests)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for doc in text.split("\n---\n") {
            let mut v: serde_json::Value = serde_norway::from_str(doc).unwrap();
            if v["kind"] == "ConfigMap" || v["kind"] == "Secret" {
                continue;
            }
            if v["kind"] == "Pod" {
                v["spec"]["nodeName"] = "node-1".into();
                v["status"] = serde_json::json!({"phase": "Running"});
            }
            api.apply(v);
        }
    }
}

/// Events of pods on the fake API server: two of pod `stuck` (one as the
/// kubelet writes it, core/v1; one through events.k8s.io/v1, as the
/// scheduler does) and one of pod `keep`. Returns what the stuck volume's
/// finding must carry: the stuck pod's, newest first.
fn record_pod_events(api: &FakeApiServer) -> serde_json::Value {
    use serde_json::json;
    let pod = |name: &str, uid: &str| json!({"apiVersion": "v1", "kind": "Pod", "namespace": "test", "name": name, "uid": uid});
    api.apply(json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "stuck.1", "namespace": "test"},
        "involvedObject": pod("stuck", "uid-stuck"), "type": "Warning", "reason": "FailedMount",
        "message": "MountVolume.SetUp failed for volume \"scratch\" : not yet", "count": 4,
        "firstTimestamp": "2026-01-02T03:00:30Z", "lastTimestamp": "2026-01-02T03:04:05Z",
        "source": {"component": "kubelet", "host": "node-1"}}));
    api.apply(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "stuck.2", "namespace": "test"},
        "regarding": pod("stuck", "uid-stuck"), "type": "Normal", "reason": "Scheduled",
        "note": "Successfully assigned test/stuck to node-1", "action": "Binding",
        "eventTime": "2026-01-02T03:00:00.000000Z", "reportingController": "default-scheduler",
        "reportingInstance": "default-scheduler-x"}));
    api.apply(json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "keep.1", "namespace": "test"},
        "involvedObject": pod("keep", "uid-keep"), "type": "Warning", "reason": "BackOff",
        "message": "not the stuck pod's", "count": 1, "lastTimestamp": "2026-01-02T03:05:00Z",
        "source": {"component": "kubelet"}}));
    json!([
        {"type": "Warning", "reason": "FailedMount",
         "message": "MountVolume.SetUp failed for volume \"scratch\" : not yet", "count": 4,
         "last_time": "2026-01-02T03:04:05Z", "source": "kubelet", "host": "node-1"},
        {"type": "Normal", "reason": "Scheduled",
         "message": "Successfully assigned test/stuck to node-1", "count": 1,
         "last_time": "2026-01-02T03:00:00Z", "source": "default-scheduler",
         "host": "default-scheduler-x"},
    ])
}

/// `volmgr doctor --json` against `state`: (exit code, report).
fn doctor(state: &Path) -> (i32, serde_json::Value) {
    let out = Command::new(volmgr_bin())
        .args(["doctor", "--json", "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

/// Sets up the node with the managing agent, then stops it (mounts stay).
fn set_up_node(env: &Env, driver: &Driver) {
    for (pv, handle) in [
        ("pv-1", "vol-1"),
        ("pv-2", "vol-2"),
        ("pv-3", "vol-3"),
        ("pv-4", "vol-4"),
    ] {
        env.write_manifest(&format!("{pv}.yaml"), &pv_yaml(pv, handle));
    }
    env.write_manifest("pv-5.yaml", &block_pv_yaml("pv-5", "vol-5"));
    env.write_manifest("mapped.yaml", MAPPED_POD);
    env.write_manifest(
        "keep.yaml",
        &pod_yaml("keep", "uid-keep", Some("pv-1"), true),
    );
    env.write_manifest(
        "gone.yaml",
        &pod_yaml("gone", "uid-gone", Some("pv-2"), false),
    );
    env.write_manifest(
        "drained.yaml",
        &pod_yaml("drained", "uid-drained", Some("pv-3"), false),
    );
    env.write_manifest(
        "lost.yaml",
        &pod_yaml("lost", "uid-lost", Some("pv-4"), false),
    );
    env.write_manifest(
        "orphan.yaml",
        &pod_yaml("orphan", "uid-orphan", None, false),
    );
    env.write_manifest("config.yaml", &config_pod_yaml());
    let flag = driver.flag();
    let agent = env.start_agent(&["--csi-driver", &flag, "--node-name", "node-1"]);
    for uid in [
        "uid-keep",
        "uid-gone",
        "uid-drained",
        "uid-lost",
        "uid-orphan",
        "uid-mapped",
        "uid-config",
    ] {
        assert_eq!(env.wait_pod(uid, 90.0), 0, "{}", agent.log());
    }
    assert!(agent.term());
}

/// Plants (a)-(g) the way they happen next to a kubelet. Returns the
/// expected `(kind, path)` of each finding.
fn plant(env: &Env) -> Vec<(&'static str, PathBuf)> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    // (a) and (b): pods deleted while the kubelet was down, one with its
    // volume still mounted.
    env.remove_manifest("orphan.yaml");
    env.remove_manifest("gone.yaml");
    // (c): unpublished and its pod directory removed, never unstaged.
    umount2(
        &env.csi_publish_path("uid-drained", "pv-3"),
        MntFlags::empty(),
    )
    .unwrap();
    std::fs::remove_dir_all(env.root.join("pods/uid-drained")).unwrap();
    env.remove_manifest("drained.yaml");
    // (c), block: the device (the driver's loop device) still bound on the
    // pod's entry of the global map path (volumeDevices/pv-5/dev/<uid>),
    // its publish gone (unmounted and removed as NodeUnpublishVolume does)
    // and the pod's directory (its link) removed, never unstaged.
    let devices = volume_devices(env);
    let published = devices.join("publish/pv-5/uid-mapped");
    umount2(&published, MntFlags::empty()).unwrap();
    std::fs::remove_file(&published).unwrap();
    std::fs::remove_dir_all(env.root.join("pods/uid-mapped")).unwrap();
    env.remove_manifest("mapped.yaml");
    // (d): a new pod whose emptyDir nobody sets up.
    env.write_manifest("stuck.yaml", &pod_yaml("stuck", "uid-stuck", None, false));
    // (e): the publish mount went away behind the kubelet's back.
    umount2(&env.csi_publish_path("uid-lost", "pv-4"), MntFlags::empty()).unwrap();
    // (f): a pod's tmpfs emptyDir mounted twice (a bind of itself on it).
    let twice = env.empty_dir("uid-keep", "scratch");
    mount(
        Some(&twice),
        &twice,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    vec![
        ("orphaned_pod_dir", env.root.join("pods/uid-orphan")),
        (
            "mounted_for_deleted_pod",
            env.csi_publish_path("uid-gone", "pv-2"),
        ),
        ("unused_device_mount", stage_path(env, "vol-3")),
        ("unused_device_mount", devices.join("pv-5/dev")),
        ("volume_stuck", env.root.join("pods/uid-stuck")),
        (
            "recorded_not_mounted",
            env.csi_publish_path("uid-lost", "pv-4"),
        ),
        ("mounted_more_than_once", twice),
    ]
}

#[test]
fn observe_mode_reports_each_finding_and_changes_nothing() {
    isolated(
        "observe_mode_reports_each_finding_and_changes_nothing",
        || {
            let env = Env::new();
            let mut driver = Driver::new(&env, DRIVER);
            driver.start();
            set_up_node(&env, &driver);
            let mut expected = plant(&env);
            let lo = DeletedLoop::new(env.dir.path());
            expected.push(("loop_backing_deleted", PathBuf::from(&lo.0)));

            let (tree_before, table_before) = (tree(&env.root), mount_table());
            let calls_before = driver.calls().len();
            let state = env.dir.path().join("state");
            let addr = free_port();
            let flag = driver.flag();
            // The desired state from the API server this time.
            std::env::set_var("VOLMGR_FAILPOINTS", "observe-write-probe");
            let api = FakeApiServer::start();
            serve_manifests(&env, &api);
            let stuck_events = record_pod_events(&api);
            let kubeconfig = api.write_kubeconfig(env.dir.path());
            let observer = env.start_agent_without_manifests(&[
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--observe",
                "--state-dir",
                state.to_str().unwrap(),
                "--csi-driver",
                &flag,
                "--node-name",
                "node-1",
                "--stuck-after",
                "1s",
                "--scan-period",
                "200ms",
                "--metrics-addr",
                &addr,
            ]);
            let found = |report: &serde_json::Value, kind: &str, path: &Path| {
                report["findings"]
                    .as_array()
                    .map(|fs| {
                        fs.iter()
                            .filter(|f| f["kind"] == kind && f["path"] == path.to_str().unwrap())
                            .count()
                    })
                    .unwrap_or(0)
            };
            let stuck_path = env.root.join("pods/uid-stuck");
            let events_of_stuck = |r: &serde_json::Value| {
                r["findings"].as_array().and_then(|fs| {
                    fs.iter()
                        .find(|f| {
                            f["kind"] == "volume_stuck" && f["path"] == stuck_path.to_str().unwrap()
                        })
                        .map(|f| f["events"].clone())
                })
            };
            wait_for(
                "every planted finding reported, the pod's events read",
                || {
                    let (_, r) = doctor(&state);
                    expected.iter().all(|(k, p)| found(&r, k, p) == 1)
                        && events_of_stuck(&r).and_then(|e| e.as_array().map(Vec::len)) != Some(0)
                },
            );
            let (code, report) = doctor(&state);
            assert_eq!(code, 1, "doctor exits 1 when something needs a person");
            let findings = report["findings"].as_array().unwrap();
            // Each exactly once, and nothing else (other tests' loop devices
            // aside).
            let ours: Vec<_> = findings
                .iter()
                .filter(|f| f["kind"] != "loop_backing_deleted" || f["path"] == lo.0.as_str())
                .collect();
            assert_eq!(ours.len(), expected.len(), "{report:#}");
            // The pod with payload volumes, whose ConfigMap and Secret the
            // observer may not read, is observed by name: no finding, and
            // none of those objects (nor the Node) asked for.
            assert!(
                !report["findings"].to_string().contains("uid-config"),
                "{report:#}"
            );
            let asked: Vec<String> = api
                .requests()
                .into_iter()
                .map(|r| r.path)
                .filter(|p| NOT_READ.iter().any(|r| p.contains(&format!("/{r}"))))
                .collect();
            assert!(asked.is_empty(), "{asked:?}");
            for f in &ours {
                assert!(!f["summary"].as_str().unwrap().is_empty(), "{f:#}");
                assert!(
                    !f["evidence"].as_array().unwrap().is_empty(),
                    "no evidence: {f:#}"
                );
            }
            let by_kind = |k: &str| ours.iter().find(|f| f["kind"] == k).unwrap().to_string();
            // The stuck pod's events, newest first: not the other pod's,
            // not observe mode's own VolumeStuck event.
            assert_eq!(
                events_of_stuck(&report).unwrap(),
                stuck_events,
                "{report:#}"
            );
            // The block volume's device left mapped: its global map entry,
            // a bind of the driver's loop device, with its vol_data.json.
            let block = ours
                .iter()
                .find(|f| f["path"] == volume_devices(&env).join("pv-5/dev").to_str().unwrap())
                .unwrap();
            assert_eq!(block["kind"], "unused_device_mount", "{block:#}");
            let evidence: Vec<&str> = block["evidence"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap())
                .collect();
            let entry = volume_devices(&env).join("pv-5/dev/uid-mapped");
            assert!(
                evidence
                    .iter()
                    .any(|l| l.contains("loop") && l.contains(entry.to_str().unwrap())),
                "{block:#}"
            );
            assert!(
                evidence.iter().any(|l| l.contains("vol_data.json")
                    && l.contains("vol-5")
                    && l.contains("Block")),
                "{block:#}"
            );
            assert!(
                by_kind("mounted_for_deleted_pod").contains("ext4"),
                "{report:#}"
            );
            assert!(
                by_kind("unused_device_mount").contains("vol-3"),
                "{report:#}"
            );
            assert!(by_kind("volume_stuck").contains("test/stuck"), "{report:#}");
            assert!(
                by_kind("recorded_not_mounted").contains("test/lost"),
                "{report:#}"
            );
            assert!(
                by_kind("mounted_more_than_once").contains("id "),
                "{report:#}"
            );
            assert!(
                by_kind("loop_backing_deleted").contains("(deleted)"),
                "{report:#}"
            );
            assert!(
                by_kind("orphaned_pod_dir").contains("scratch"),
                "{report:#}"
            );

            // The kernel refused the write probe; Landlock is enforced.
            assert!(
                report["landlock"].as_str().unwrap().starts_with("enforced"),
                "{report:#}"
            );
            let probe = report["write_probe"].as_str().unwrap();
            assert!(probe.contains("Permission denied"), "{probe}");
            assert!(!env.root.join(".volmgr-observe-probe").exists());
            // Status shows the section; metrics count by kind.
            let text = Command::new(volmgr_bin())
                .args(["status", "--root"])
                .arg(&state)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&text.stdout).to_string();
            assert!(text.contains("observe mode: landlock enforced"), "{text}");
            assert!(text.contains("- volume_stuck:"), "{text}");
            // doctor's text: the events under the stuck volume's finding.
            let text = Command::new(volmgr_bin())
                .args(["doctor", "--state-dir"])
                .arg(&state)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&text.stdout).to_string();
            let stuck = &text[text.find("- volume_stuck:").unwrap()..];
            let stuck = &stuck[..stuck.find("    do:").unwrap()];
            assert!(
                stuck.contains("event 2026-01-02T03:04:05Z Warning FailedMount (x4, kubelet): MountVolume.SetUp failed"),
                "{text}"
            );
            assert!(
                stuck.contains("Normal Scheduled (x1, default-scheduler)"),
                "{text}"
            );
            assert!(!stuck.contains("BackOff"), "{text}");
            let m = metrics(&addr);
            assert!(
                m.contains("volmgr_findings{kind=\"unused_device_mount\"} 2"),
                "{m}"
            );
            // Events on the pods still on the node; nothing else written to
            // the API server (no token, no CSINode, no Node or claim status).
            let reasons = || -> Vec<String> {
                api.requests()
                    .iter()
                    .filter(|r| r.method == "POST" && r.path.contains("/events"))
                    .map(|r| r.body["reason"].as_str().unwrap_or("").to_string())
                    .collect()
            };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let want = ["VolumeStuck", "VolumeNotMounted", "VolumeMountedTwice"];
            while !want.iter().all(|w| reasons().iter().any(|r| r == w)) {
                let writes: Vec<String> = api
                    .requests()
                    .iter()
                    .filter(|r| r.method != "GET")
                    .map(|r| format!("{} {} {} {}", r.method, r.path, r.status, r.body))
                    .collect();
                assert!(
                    std::time::Instant::now() < deadline,
                    "no events: {writes:#?}\n{}",
                    observer.log()
                );
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            for r in api.requests() {
                assert!(
                    r.method == "GET" || r.path.contains("/events"),
                    "observe mode wrote to the API server: {} {}",
                    r.method,
                    r.path
                );
            }
            assert!(observer.term());

            // Nothing changed: the tree and the mount table.
            assert_eq!(mount_table(), table_before, "the mount table changed");
            let tree_after = tree(&env.root);
            assert_eq!(tree_after, tree_before, "ROOT changed");
            // No CSI call that changes state while observing.
            for c in &driver.calls()[calls_before..] {
                let m = c["method"].as_str().unwrap_or("");
                assert!(
                    ["NodeGetCapabilities", "NodeGetInfo", "NodeGetVolumeStats"]
                        .iter()
                        .any(|ok| m.ends_with(ok)),
                    "observe mode called {m}"
                );
            }
            drop(lo);
        },
    );
}
