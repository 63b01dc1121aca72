//! End-to-end tests of the CSI plugin: the real `volmgr` agent driving the
//! real test driver (`volmgr-csi-driver`: loop devices, ext4, bind mounts)
//! over gRPC, each test in a private mount namespace of its own.
//!
//! The driver journals every call in `STATE/calls.jsonl`; the tests count
//! calls there (one stage, two publishes, ...) and inject faults through
//! `STATE/faults.json`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_driver::{wait_for, wait_or_dump, Driver};
use support::{free_port, isolated, metrics, Agent, Env};
use volmgr::sys::linux::LinuxMounter;
use volmgr::sys::Mounter;

const DRIVER: &str = "loop.csi.volmgr.dev";

/// The test driver, started (`--csi-driver` style: no registration).
fn start_driver(env: &Env) -> Driver {
    let mut d = Driver::new(env, DRIVER);
    d.start();
    d
}

/// A PersistentVolume of the test driver and its bound claim.
fn pv_yaml(pv: &str, handle: &str, capacity: &str, block: bool, extra_attrs: &str) -> String {
    let mode = if block { "Block" } else { "Filesystem" };
    format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {pv}}}\nspec:\n  capacity: {{storage: {capacity}}}\n  accessModes: [ReadWriteMany]\n  volumeMode: {mode}\n  claimRef: {{namespace: test, name: claim-{pv}}}\n  csi: {{driver: {DRIVER}, volumeHandle: {handle}, fsType: ext4, volumeAttributes: {{size: 64Mi{extra_attrs}}}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-{pv}, namespace: test}}\nspec: {{volumeName: {pv}, accessModes: [ReadWriteMany], volumeMode: {mode}}}\n"
    )
}

/// A pod mounting the claims of `pvs` (volume `v-<pv>`).
fn pod_yaml(name: &str, uid: &str, pvs: &[&str]) -> String {
    let vols: Vec<(String, String)> = pvs
        .iter()
        .map(|pv| {
            (
                format!("v-{pv}"),
                format!("persistentVolumeClaim: {{claimName: claim-{pv}}}"),
            )
        })
        .collect();
    let refs: Vec<(&str, &str)> = vols.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    support::pod_yaml(name, uid, &refs)
}

/// `ROOT/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`.
fn stage_path(env: &Env, handle: &str) -> PathBuf {
    let h = volmgr::plugins::csi::handle_hash(handle);
    env.root
        .join("plugins/kubernetes.io/csi")
        .join(DRIVER)
        .join(h)
        .join("globalmount")
}

fn start_agent(env: &Env, driver: &Driver, extra: &[&str]) -> Agent {
    let flag = driver.flag();
    let mut args = vec!["--csi-driver", flag.as_str(), "--node-name", "node-1"];
    args.extend_from_slice(extra);
    env.start_agent(&args)
}

/// Nothing left: no mount under ROOT, no loop device of the driver.
fn assert_nothing_leaked(env: &Env, driver: &Driver) {
    wait_for("every mount under ROOT gone", || env.mounts().is_empty());
    // The driver detaches after unmounting, within the same unstage call:
    // wait for that call too (a leak still fails, after the timeout).
    wait_for("the driver's loop devices detached", || {
        driver.loop_devices().is_empty()
    });
    env.assert_outside_untouched();
}

#[test]
fn two_pods_share_one_staged_volume() {
    isolated("two_pods_share_one_staged_volume", || {
        let env = Env::new();
        let driver = start_driver(&env);
        // Secrets go to the driver, never into a log.
        env.write_manifest(
            "pv.yaml",
            &pv_yaml("pv-1", "vol-1", "64Mi", false, "").replace(
                "fsType: ext4,",
                "fsType: ext4, nodeStageSecretRef: {name: creds, namespace: test}, nodePublishSecretRef: {name: creds, namespace: test},",
            ),
        );
        env.write_manifest(
            "secret.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: creds, namespace: test}\nstringData: {password: s3cr3t-Value-42}\n",
        );
        env.write_manifest("a.yaml", &pod_yaml("a", "uid-a", &["pv-1"]));
        env.write_manifest("b.yaml", &pod_yaml("b", "uid-b", &["pv-1"]));
        let addr = free_port();
        let agent = start_agent(
            &env,
            &driver,
            &["--metrics-addr", &addr, "--resync-period", "500ms"],
        );
        assert_eq!(env.wait_pod("uid-a", 60.0), 0, "{}", agent.log());
        assert_eq!(env.wait_pod("uid-b", 60.0), 0, "{}", agent.log());
        let by_ids = || agent.log().matches("resync: every mount id listed").count();
        let by_ids_before = by_ids();

        let st = format!("{:?}", env.status());
        assert!(st.contains("pv-1") && !st.contains("s3cr3t"), "{st}");
        // One stage, two publishes.
        driver.expect("NodeStageVolume", "vol-1", "OK", 1);
        driver.expect("NodePublishVolume", "vol-1", "OK", 2);
        let (pa, pb) = (
            env.csi_publish_path("uid-a", "pv-1"),
            env.csi_publish_path("uid-b", "pv-1"),
        );
        let stage = stage_path(&env, "vol-1");
        for p in [&pa, &pb, &stage] {
            assert_eq!(env.mount_count(p), 1, "{} mounted once", p.display());
        }
        let m = env
            .mounts()
            .into_iter()
            .find(|m| m.mount_point == pa)
            .unwrap();
        assert_eq!(m.fstype, "ext4");
        // vol_data.json beside each publish dir and the staging dir.
        let vd: BTreeMap<String, String> = serde_json::from_slice(
            &std::fs::read(pa.parent().unwrap().join("vol_data.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(vd["volumeHandle"], "vol-1");
        assert_eq!(vd["driverName"], DRIVER);
        assert_eq!(vd["specVolID"], "pv-1");
        assert!(stage.parent().unwrap().join("vol_data.json").is_file());

        // Data written in one pod's mount is visible in the other's.
        std::fs::write(pa.join("hello"), b"from a").unwrap();
        assert_eq!(std::fs::read(pb.join("hello")).unwrap(), b"from a");

        // Pod a goes: unpublished, but the volume stays staged for b.
        env.remove_manifest("a.yaml");
        wait_for("pod a torn down", || !env.root.join("pods/uid-a").exists());
        driver.expect("NodeUnpublishVolume", "vol-1", "OK", 1);
        assert_eq!(driver.count("NodeUnstageVolume", "vol-1", "OK"), 0);
        assert_eq!(env.mount_count(&stage), 1);
        assert_eq!(std::fs::read(pb.join("hello")).unwrap(), b"from a");
        // The unpublish changed the mount table; the resync after it trusts
        // b's publish mount (made by the driver) by its unique mount id,
        // without reading the table (kernels with listmount(2), 6.8+).
        if LinuxMounter.mount_ids().ok().flatten().is_some() {
            wait_for("a resync by mount ids", || by_ids() > by_ids_before);
        }

        // Pod a comes back (a pod restart): the data survived, no re-stage.
        env.write_manifest("a.yaml", &pod_yaml("a", "uid-a", &["pv-1"]));
        assert_eq!(env.wait_pod("uid-a", 60.0), 0);
        assert_eq!(std::fs::read(pa.join("hello")).unwrap(), b"from a");
        driver.expect("NodeStageVolume", "vol-1", "OK", 1);

        // Metrics: the kubelet's names, with the driver in the plugin label.
        let text = metrics(&addr);
        assert!(text.contains("storage_operation_duration_seconds_count{operation_name=\"mount_device\",volume_plugin=\"kubernetes.io/csi:loop.csi.volmgr.dev\",status=\"success\""), "{text}");
        assert!(text.contains("csi_operations_seconds_count{driver_name=\"loop.csi.volmgr.dev\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\"} 1"), "{text}");

        // Both go: unstage only after the last unpublish.
        env.remove_manifest("a.yaml");
        env.remove_manifest("b.yaml");
        wait_for("unstaged", || {
            driver.count("NodeUnstageVolume", "vol-1", "OK") == 1
        });
        let calls = driver.calls();
        let last_unpublish = calls
            .iter()
            .rposition(|c| c["method"] == "NodeUnpublishVolume" && c["code"] == "OK")
            .unwrap();
        let unstage = calls
            .iter()
            .position(|c| c["method"] == "NodeUnstageVolume" && c["code"] == "OK")
            .unwrap();
        assert!(unstage > last_unpublish, "unstage after the last unpublish");
        assert_nothing_leaked(&env, &driver);
        wait_for("staging directory removed", || {
            !stage.parent().unwrap().exists()
        });
        let log = agent.log();
        assert!(log.contains("vol-1") && !log.contains("s3cr3t-Value-42"));
        assert!(agent.term());
    });
}

const BLOCK_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: test, uid: uid-p}\nspec:\n  containers: [{name: c, image: i, volumeDevices: [{name: dev, devicePath: /dev/xvda}]}]\n  volumes: [{name: dev, persistentVolumeClaim: {claimName: claim-pv-b}}]\n";

/// The kubelet's paths of block PV `pv` used by pod `uid`: the publish
/// target (`volumeDevices/publish/<pv>/<uid>`), the pod's symlink named
/// after the PV (`GetPodDeviceMapPath`) and the pod's entry in the global
/// map path (`GetGlobalMapPath` + `/<uid>`), a bind mount of the device.
fn block_paths(env: &Env, uid: &str, pv: &str) -> (PathBuf, PathBuf, PathBuf) {
    let devices = env.root.join("plugins/kubernetes.io/csi/volumeDevices");
    (
        devices.join("publish").join(pv).join(uid),
        env.root
            .join("pods")
            .join(uid)
            .join("volumeDevices/kubernetes.io~csi")
            .join(pv),
        devices.join(pv).join("dev").join(uid),
    )
}

/// The published device is mapped for the pod as the kubelet maps it.
fn assert_block_mapped(env: &Env, uid: &str, pv: &str) {
    use std::os::unix::fs::MetadataExt;
    let (published, link, global) = block_paths(env, uid, pv);
    let published_meta = std::fs::metadata(&published).unwrap();
    assert!(
        published_meta.file_type().is_block_device(),
        "the published target is the device"
    );
    assert_eq!(std::fs::read_link(&link).unwrap(), published);
    let global_meta = std::fs::symlink_metadata(&global).unwrap();
    assert!(
        global_meta.file_type().is_block_device(),
        "the global map entry is a bind mount of the device"
    );
    assert_eq!(global_meta.rdev(), published_meta.rdev());
    assert_eq!(env.mount_count(&global), 1, "mounted once");
}

#[test]
fn block_volume_is_published_as_a_device() {
    isolated("block_volume_is_published_as_a_device", || {
        let env = Env::new();
        let driver = start_driver(&env);
        env.write_manifest("pv.yaml", &pv_yaml("pv-b", "vol-b", "64Mi", true, ""));
        env.write_manifest("p.yaml", BLOCK_POD);
        let agent = start_agent(&env, &driver, &[]);
        assert_eq!(env.wait_pod("uid-p", 60.0), 0, "{}", agent.log());
        let (published, link, global) = block_paths(&env, "uid-p", "pv-b");
        assert_block_mapped(&env, "uid-p", "pv-b");
        let by_volume_name = link.with_file_name("dev");
        assert!(
            by_volume_name.symlink_metadata().is_err(),
            "named after the PV"
        );
        driver.expect("NodeStageVolume", "vol-b", "OK", 1);
        let st = env.status();
        let v = &st.pods.iter().find(|p| p.uid == "uid-p").unwrap().volumes[0];
        assert_eq!(v.state, "mounted");
        assert_eq!(v.path.as_deref(), Some(link.to_str().unwrap()));

        // Restarts: adopted as it is (no second stage, publish or bind
        // mount), and after the pod went away meanwhile, unmapped, then
        // unpublished, then unstaged.
        agent.kill9();
        let agent = start_agent(&env, &driver, &[]);
        env.wait_synced();
        assert_eq!(env.wait_pod("uid-p", 60.0), 0, "{}", agent.log());
        assert_block_mapped(&env, "uid-p", "pv-b");
        let st = env.status();
        let v = &st.pods.iter().find(|p| p.uid == "uid-p").unwrap().volumes[0];
        assert_eq!((v.name.as_str(), v.state.as_str()), ("dev", "mounted"));
        agent.kill9();
        assert_eq!(driver.count("NodeStageVolume", "vol-b", "OK"), 1);
        assert_eq!(driver.count("NodePublishVolume", "vol-b", "OK"), 1);
        env.remove_manifest("p.yaml");
        // NodeUnpublishVolume hangs: by then the bind mount is gone, while
        // the device is still published and the pod's link still there.
        driver.faults(serde_json::json!([{"method": "NodeUnpublishVolume", "hang": true}]));
        let agent = start_agent(&env, &driver, &[]);
        wait_for("the global map entry unmounted and removed", || {
            global.symlink_metadata().is_err()
        });
        assert!(published.exists() && link.symlink_metadata().is_ok());
        driver.faults(serde_json::json!([]));
        driver.expect("NodeUnstageVolume", "vol-b", "OK", 1);
        let calls = driver.calls();
        let pos = |m: &str| {
            calls
                .iter()
                .position(|c| c["method"] == m && c["code"] == "OK")
                .unwrap()
        };
        assert!(pos("NodeUnpublishVolume") < pos("NodeUnstageVolume"));
        assert!(link.symlink_metadata().is_err() && !published.exists());
        wait_for("the PV's block directory removed", || {
            !env.root
                .join("plugins/kubernetes.io/csi/volumeDevices/pv-b")
                .exists()
        });
        assert_nothing_leaked(&env, &driver);
        drop(agent);
    });
}

/// Turns pod `uid-p`'s mapping of pv-b into what an older volmgr left: the
/// link named after the pod's volume, no bind mount in the global map
/// path, an empty publish record.
fn downgrade_block_layout(env: &Env) {
    let (_, link, global) = block_paths(env, "uid-p", "pv-b");
    nix::mount::umount(&global).unwrap();
    std::fs::remove_file(&global).unwrap();
    std::fs::rename(&link, link.with_file_name("dev")).unwrap();
    let record = env
        .root
        .join("plugins/kubernetes.io/csi/volumeDevices/pv-b/data/volmgr-published-uid-p");
    std::fs::write(record, b"").unwrap();
}

/// A block volume an older volmgr mapped (its link named after the pod's
/// volume, no global map bind mount) is adopted after an upgrade: mapped
/// again the kubelet's way, the old link removed; and a running pod's
/// volume in the old layout is torn down completely.
#[test]
fn block_volume_mapped_by_an_older_volmgr() {
    isolated("block_volume_mapped_by_an_older_volmgr", || {
        let env = Env::new();
        let driver = start_driver(&env);
        env.write_manifest("pv.yaml", &pv_yaml("pv-b", "vol-b", "64Mi", true, ""));
        env.write_manifest("p.yaml", BLOCK_POD);
        let agent = start_agent(&env, &driver, &[]);
        assert_eq!(env.wait_pod("uid-p", 60.0), 0, "{}", agent.log());
        let (published, link, global) = block_paths(&env, "uid-p", "pv-b");
        let old_link = link.with_file_name("dev");

        // Upgraded while the pod runs: mapped again, the old link gone.
        agent.kill9();
        downgrade_block_layout(&env);
        let agent = start_agent(&env, &driver, &[]);
        env.wait_for("mapped the kubelet's way", || {
            link.symlink_metadata().is_ok() && env.mount_count(&global) == 1
        });
        assert_eq!(env.wait_pod("uid-p", 60.0), 0, "{}", agent.log());
        assert_block_mapped(&env, "uid-p", "pv-b");
        env.wait_for("the old link removed", || {
            old_link.symlink_metadata().is_err()
        });
        assert_eq!(driver.count("NodeStageVolume", "vol-b", "OK"), 1);

        // Upgraded after the pod went away: torn down, nothing left.
        agent.kill9();
        downgrade_block_layout(&env);
        env.remove_manifest("p.yaml");
        let agent = start_agent(&env, &driver, &[]);
        driver.expect("NodeUnstageVolume", "vol-b", "OK", 1);
        env.wait_for("pod directory removed", || {
            !env.root.join("pods/uid-p").exists()
        });
        assert!(old_link.symlink_metadata().is_err() && link.symlink_metadata().is_err());
        assert!(!published.exists() && global.symlink_metadata().is_err());
        assert_nothing_leaked(&env, &driver);
        drop(agent);
    });
}

#[test]
fn expansion_is_visible_in_statfs() {
    isolated("expansion_is_visible_in_statfs", || {
        let env = Env::new();
        let driver = start_driver(&env);
        // xfs: growing a mounted ext4 needs CAP_SYS_RESOURCE, which the
        // dev/CI machines lack; xfs_growfs needs only CAP_SYS_ADMIN (and xfs
        // at least 300 MiB).
        let pv = |cap: &str| {
            pv_yaml("pv-e", "vol-e", cap, false, "")
                .replace("fsType: ext4", "fsType: xfs")
                .replace("size: 64Mi", "size: 320Mi")
        };
        env.write_manifest("pv.yaml", &pv("320Mi"));
        env.write_manifest("p.yaml", &pod_yaml("p", "uid-p", &["pv-e"]));
        let agent = start_agent(&env, &driver, &[]);
        assert_eq!(env.wait_pod("uid-p", 60.0), 0, "{}", agent.log());
        let path = env.csi_publish_path("uid-p", "pv-e");
        let size = |p: &Path| {
            let s = nix::sys::statvfs::statvfs(p).unwrap();
            s.blocks() as u64 * s.fragment_size() as u64
        };
        let before = size(&path);
        assert!(before <= 320 << 20, "{before}");
        std::fs::write(path.join("keep"), b"data").unwrap();
        env.write_manifest("pv.yaml", &pv("640Mi"));
        wait_for("file system grown", || size(&path) > 500 << 20);
        // (The driver journals a call after answering it.)
        driver.expect("NodeExpandVolume", "vol-e", "OK", 1);
        // Grown in place: nothing was staged or published again.
        driver.expect("NodeStageVolume", "vol-e", "OK", 1);
        driver.expect("NodePublishVolume", "vol-e", "OK", 1);
        assert_eq!(std::fs::read(path.join("keep")).unwrap(), b"data");
        env.remove_manifest("p.yaml");
        wait_for("unstaged", || {
            driver.count("NodeUnstageVolume", "vol-e", "OK") == 1
        });
        assert_nothing_leaked(&env, &driver);
        drop(agent);
    });
}

/// Status of the one volume of `uid`.
fn volume_status(env: &Env, uid: &str) -> Option<(String, u32, Option<String>)> {
    let s = env.status();
    let p = s.pods.iter().find(|p| p.uid == uid)?;
    let v = p.volumes.first()?;
    Some((v.state.clone(), v.attempts, v.error.clone()))
}

#[test]
fn injected_faults_converge_without_leaks() {
    isolated("injected_faults_converge_without_leaks", || {
        let env = Env::new();
        let mut driver = start_driver(&env);
        let add = |v: &str| {
            env.write_manifest(&format!("pv-{v}.yaml"), &pv_yaml(v, v, "64Mi", false, ""));
            env.write_manifest(
                &format!("p-{v}.yaml"),
                &pod_yaml(v, &format!("uid-{v}"), &[v]),
            );
        };
        // One volume per case; each rule targets its volume. (Crashes get
        // phases of their own: a call cut short by a crash is not journalled.)
        let cases = [
            ("f1", "NodeStageVolume", "UNAVAILABLE"),
            ("f2", "NodeStageVolume", "DEADLINE_EXCEEDED"),
            ("f3", "NodePublishVolume", "RESOURCE_EXHAUSTED"),
            ("f4", "NodePublishVolume", "ABORTED"),
            ("f5", "NodePublishVolume", "CANCELLED"),
            ("f6", "NodeStageVolume", "INTERNAL"),
            ("f7", "NodePublishVolume", "FAILED_PRECONDITION"),
        ];
        let rules: Vec<serde_json::Value> = cases
            .iter()
            .map(|(v, m, code)| serde_json::json!({"method": m, "volume_id": v, "count": 2, "code": code}))
            .collect();
        driver.faults(serde_json::Value::Array(rules));
        for (v, _, _) in &cases {
            add(v);
        }
        let agent = start_agent(&env, &driver, &["--csi-timeout", "3s"]);
        let check_mounted = |v: &str| {
            assert_eq!(
                env.wait_pod(&format!("uid-{v}"), 90.0),
                0,
                "{v}: {}",
                agent.log()
            );
            let p = env.csi_publish_path(&format!("uid-{v}"), v);
            assert_eq!(env.mount_count(&p), 1, "{v}: published once");
            assert_eq!(env.mount_count(&stage_path(&env, v)), 1, "{v}: staged once");
        };
        for (v, m, code) in &cases {
            check_mounted(v);
            driver.expect(m, v, code, 2);
        }
        // Publish before stage (FAILED_PRECONDITION) stages again.
        wait_for("f7 staged again", || {
            driver.count("NodeStageVolume", "f7", "OK") >= 2
        });

        // A stage that took effect but whose answer was lost (the driver
        // crashed): uncertain, called again, not assumed done.
        driver.faults(serde_json::json!([
            {"method": "NodeStageVolume", "volume_id": "f8", "count": 1, "exit": "after_work"}
        ]));
        add("f8");
        wait_for("driver crashed on f8", || {
            driver.count("NodeStageVolume", "f8", "EXIT") == 1
        });
        driver.wait_exit();
        driver.start();
        check_mounted("f8");
        driver.expect("NodeStageVolume", "f8", "OK", 1);

        // A driver that does not answer: the per-call deadline ends the call
        // (every call for h1 hangs until faults.json changes next).
        driver.faults(serde_json::json!([
            {"method": "NodeStageVolume", "volume_id": "h1", "hang": true}
        ]));
        add("h1");
        wait_for("h1's stage ended by the deadline", || {
            agent
                .log()
                .contains("DeadlineExceeded: no answer within 3s")
        });
        // (Retries meanwhile find the driver still busy with h1: ABORTED,
        // uncertain too.)
        wait_for("h1 uncertain in status", || {
            volume_status(&env, "uid-h1").is_some_and(|(s, _, e)| {
                s == "uncertain" && e.is_some_and(|e| e.contains("outcome uncertain"))
            })
        });

        // UNIMPLEMENTED, like every error, is retried with backoff (the
        // kubelet's isFinalError only makes it "not mounted", not
        // uncertain): shown in status while it lasts, and mounted once the
        // driver stops refusing, with no change of the spec.
        driver.faults(serde_json::json!([
            {"method": "NodePublishVolume", "volume_id": "u1", "code": "UNIMPLEMENTED"}
        ]));
        check_mounted("h1");
        add("u1");
        wait_for("u1's error in status, retried", || {
            volume_status(&env, "uid-u1").is_some_and(|(s, n, e)| {
                s == "error" && n >= 2 && e.is_some_and(|e| e.contains("Unimplemented"))
            })
        });
        driver.faults(serde_json::json!([]));
        check_mounted("u1");
        assert!(driver.count("NodePublishVolume", "u1", "UNIMPLEMENTED") >= 2);
        driver.expect("NodePublishVolume", "u1", "OK", 1);

        // An unpublish that took effect but whose answer was lost: called again.
        driver.faults(serde_json::json!([
            {"method": "NodeUnpublishVolume", "volume_id": "f3", "count": 1, "exit": "after_work"}
        ]));
        env.remove_manifest("p-f3.yaml");
        wait_for("driver crashed on f3's unpublish", || {
            driver.count("NodeUnpublishVolume", "f3", "EXIT") == 1
        });
        driver.wait_exit();
        driver.start();
        driver.expect("NodeUnpublishVolume", "f3", "OK", 1);
        driver.expect("NodeUnstageVolume", "f3", "OK", 1);
        // Tear-down faults: retried until they succeed, then unstaged.
        driver.faults(serde_json::json!([
            {"method": "NodeUnpublishVolume", "volume_id": "f1", "count": 2, "code": "UNAVAILABLE"},
            {"method": "NodeUnstageVolume", "volume_id": "f2", "count": 2, "code": "DEADLINE_EXCEEDED"}
        ]));
        let rest = ["f1", "f2", "f4", "f5", "f6", "f7", "f8", "h1"];
        for v in rest {
            env.remove_manifest(&format!("p-{v}.yaml"));
        }
        for v in rest {
            driver.expect("NodeUnstageVolume", v, "OK", 1);
        }
        driver.expect("NodeUnpublishVolume", "f1", "UNAVAILABLE", 2);
        driver.expect("NodeUnstageVolume", "f2", "DEADLINE_EXCEEDED", 2);

        env.remove_manifest("p-u1.yaml");
        driver.expect("NodeUnstageVolume", "u1", "OK", 1);
        assert_nothing_leaked(&env, &driver);
        drop(agent);
    });
}

/// No error is final (the kubelet retries every failure with backoff; its
/// `isFinalError` only decides uncertain or not mounted): a driver refusing
/// the first NodePublishVolume, NodeUnpublishVolume and NodeUnstageVolume
/// with INVALID_ARGUMENT still gets the pod mounted, and once the pod is
/// deleted, unpublished and unstaged, each at the retry.
#[test]
fn invalid_argument_once_is_retried_on_publish_unpublish_and_unstage() {
    isolated(
        "invalid_argument_once_is_retried_on_publish_unpublish_and_unstage",
        || {
            let env = Env::new();
            let driver = start_driver(&env);
            let once = |m: &str| serde_json::json!({"method": m, "volume_id": "vol-1", "count": 1, "code": "INVALID_ARGUMENT"});
            driver.faults(serde_json::json!([
                once("NodePublishVolume"),
                once("NodeUnpublishVolume"),
                once("NodeUnstageVolume")
            ]));
            env.write_manifest("pv.yaml", &pv_yaml("pv-1", "vol-1", "64Mi", false, ""));
            env.write_manifest("a.yaml", &pod_yaml("a", "uid-a", &["pv-1"]));
            let agent = start_agent(&env, &driver, &[]);
            assert_eq!(env.wait_pod("uid-a", 60.0), 0, "{}", agent.log());
            driver.expect("NodePublishVolume", "vol-1", "INVALID_ARGUMENT", 1);
            driver.expect("NodePublishVolume", "vol-1", "OK", 1);
            assert_eq!(env.mount_count(&env.csi_publish_path("uid-a", "pv-1")), 1);
            env.remove_manifest("a.yaml");
            for m in ["NodeUnpublishVolume", "NodeUnstageVolume"] {
                driver.expect(m, "vol-1", "INVALID_ARGUMENT", 1);
                driver.expect(m, "vol-1", "OK", 1);
            }
            env.wait_for("pod a's directory removed", || {
                !env.root.join("pods/uid-a").exists()
            });
            assert_nothing_leaked(&env, &driver);
            assert!(agent.term());
        },
    );
}

/// `volmgr wait --all` with `timeout` seconds; returns the exit code.
fn wait_all(env: &Env, timeout: f64) -> i32 {
    std::process::Command::new(support::volmgr_bin())
        .args(["wait", "--all", "--timeout", &timeout.to_string(), "--root"])
        .arg(&env.root)
        .status()
        .unwrap()
        .code()
        .unwrap_or(-1)
}

/// A staged volume whose NodeUnstageVolume keeps failing stays on the node
/// with no pod: status lists its device with the error, `volmgr wait --all`
/// does not report convergence and the metrics count it; once the driver
/// recovers it is unstaged and the node converges.
#[test]
fn a_device_left_staged_is_visible_until_unstaged() {
    isolated("a_device_left_staged_is_visible_until_unstaged", || {
        let env = Env::new();
        let driver = start_driver(&env);
        env.write_manifest("pv.yaml", &pv_yaml("pv-1", "vol-1", "64Mi", false, ""));
        env.write_manifest("a.yaml", &pod_yaml("a", "uid-a", &["pv-1"]));
        let addr = free_port();
        let agent = start_agent(&env, &driver, &["--metrics-addr", &addr]);
        assert_eq!(env.wait_pod("uid-a", 60.0), 0, "{}", agent.log());
        let st = env.status();
        let stage = stage_path(&env, "vol-1");
        assert_eq!(st.devices.len(), 1, "{st:?}");
        let d = &st.devices[0];
        assert_eq!((d.state.as_str(), d.pods), ("mounted", 1), "{d:?}");
        assert_eq!(d.path.as_deref(), Some(stage.to_str().unwrap()));

        driver.faults(serde_json::json!([
            {"method": "NodeUnstageVolume", "volume_id": "vol-1", "code": "INTERNAL", "message": "device busy"}
        ]));
        env.remove_manifest("a.yaml");
        wait_for("the unstage failed twice", || {
            driver.count("NodeUnstageVolume", "vol-1", "INTERNAL") >= 2
        });
        env.wait_for("the device's error in status", || {
            env.status().devices.first().is_some_and(|d| {
                d.error
                    .as_deref()
                    .is_some_and(|e| e.contains("device busy"))
            })
        });
        let st = env.status();
        assert!(st.pods.is_empty(), "{st:?}");
        let d = &st.devices[0];
        assert_eq!(
            (d.state.as_str(), d.pods, d.operation.as_deref()),
            ("unmounting", 0, Some("unmount_device")),
            "{d:?}"
        );
        assert!(d.attempts >= 2, "{d:?}");
        assert_eq!(env.mount_count(&stage), 1, "still staged");
        let text = std::process::Command::new(support::volmgr_bin())
            .args(["status", "--root"])
            .arg(&env.root)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            text.contains("unmounting pods=0") && text.contains("device busy"),
            "{text}"
        );
        assert_ne!(wait_all(&env, 0.5), 0, "converged with a device left");
        let m = metrics(&addr);
        assert!(
            m.contains(
                "volmgr_volume_devices{plugin_name=\"kubernetes.io/csi\",state=\"unmounting\"} 1"
            ),
            "{m}"
        );

        // The driver recovers: unstaged at the next retry, converged.
        driver.faults(serde_json::json!([]));
        assert_eq!(wait_all(&env, 60.0), 0, "{}", agent.log());
        driver.expect("NodeUnstageVolume", "vol-1", "OK", 1);
        assert!(env.status().devices.is_empty());
        assert_nothing_leaked(&env, &driver);
        assert!(agent.term());
    });
}

#[test]
fn agent_restarts_keep_the_staging_reference_count() {
    isolated("agent_restarts_keep_the_staging_reference_count", || {
        let env = Env::new();
        let driver = start_driver(&env);
        env.write_manifest("pv.yaml", &pv_yaml("pv-1", "vol-1", "64Mi", false, ""));
        env.write_manifest("a.yaml", &pod_yaml("a", "uid-a", &["pv-1"]));
        env.write_manifest("b.yaml", &pod_yaml("b", "uid-b", &["pv-1"]));
        let agent = start_agent(&env, &driver, &[]);
        assert_eq!(env.wait_pod("uid-a", 60.0), 0, "{}", agent.log());
        assert_eq!(env.wait_pod("uid-b", 60.0), 0);
        let pb = env.csi_publish_path("uid-b", "pv-1");
        std::fs::write(pb.join("keep"), b"b's data").unwrap();
        driver.expect("NodePublishVolume", "vol-1", "OK", 2);

        // kill -9, pod a removed meanwhile: the restart tears a down but
        // keeps the volume staged for b, and stages nothing again.
        agent.kill9();
        env.remove_manifest("a.yaml");
        let agent = start_agent(&env, &driver, &[]);
        wait_for("pod a torn down", || !env.root.join("pods/uid-a").exists());
        env.wait_synced();
        assert_eq!(env.wait_pod("uid-b", 60.0), 0);
        assert_eq!(driver.count("NodeUnstageVolume", "vol-1", "OK"), 0);
        driver.expect("NodeStageVolume", "vol-1", "OK", 1);
        // (Seen once in many CI runs: a third publish. The agent's log of
        // this run says which pod's volume was set up again.)
        let publishes = driver.count("NodePublishVolume", "vol-1", "OK");
        assert!(
            publishes <= 2,
            "{publishes} publishes of vol-1; agent log after the restart:\n{}",
            agent.log()
        );
        driver.expect("NodePublishVolume", "vol-1", "OK", 2);
        assert_eq!(std::fs::read(pb.join("keep")).unwrap(), b"b's data");
        assert_eq!(env.mount_count(&pb), 1);

        // kill -9 between stage and publish: the publish hangs in the driver.
        driver.faults(serde_json::json!([
            {"method": "NodePublishVolume", "volume_id": "vol-2", "hang": true}
        ]));
        env.write_manifest("pv2.yaml", &pv_yaml("pv-2", "vol-2", "64Mi", false, ""));
        env.write_manifest("c.yaml", &pod_yaml("c", "uid-c", &["pv-2"]));
        // Staged and recorded as such (the agent writes its record after
        // the answer: killed before that, a restart would rightly stage again).
        let staged = stage_path(&env, "vol-2").with_file_name("volmgr-staged.json");
        wait_for("vol-2 staged", || staged.exists());
        driver.expect("NodeStageVolume", "vol-2", "OK", 1);
        agent.kill9();
        driver.faults(serde_json::json!([]));
        let agent = start_agent(&env, &driver, &[]);
        assert_eq!(env.wait_pod("uid-c", 60.0), 0, "{}", agent.log());
        // A completed stage is not staged again.
        driver.expect("NodeStageVolume", "vol-2", "OK", 1);
        assert_eq!(env.mount_count(&env.csi_publish_path("uid-c", "pv-2")), 1);
        assert_eq!(env.mount_count(&stage_path(&env, "vol-2")), 1);

        for m in ["b.yaml", "c.yaml"] {
            env.remove_manifest(m);
        }
        wait_for("both unstaged", || {
            driver.count("NodeUnstageVolume", "vol-1", "OK") == 1
                && driver.count("NodeUnstageVolume", "vol-2", "OK") == 1
        });
        assert_nothing_leaked(&env, &driver);
        drop(agent);
    });
}

#[test]
fn cleanup_waits_for_an_unregistered_driver() {
    isolated("cleanup_waits_for_an_unregistered_driver", || {
        let env = Env::new();
        let mut driver = start_driver(&env);
        env.write_manifest("pv.yaml", &pv_yaml("pv-1", "vol-1", "64Mi", false, ""));
        env.write_manifest("a.yaml", &pod_yaml("a", "uid-a", &["pv-1"]));
        let agent = start_agent(&env, &driver, &[]);
        assert_eq!(env.wait_pod("uid-a", 60.0), 0, "{}", agent.log());
        agent.kill9();
        driver.kill();
        env.remove_manifest("a.yaml");
        // Restarted while the driver is not registered: the tear-down
        // waits for it (pending, not failed for good).
        let agent = env.start_agent(&["--node-name", "node-1"]);
        wait_for("waiting for the driver in status", || {
            env.status().pods.iter().any(|p| {
                p.uid == "uid-a"
                    && p.volumes.iter().any(|v| {
                        v.state == "unmounting"
                            && v.error
                                .as_deref()
                                .is_some_and(|e| e.contains("waiting for CSI driver"))
                    })
            })
        });
        assert_eq!(env.mount_count(&env.csi_publish_path("uid-a", "pv-1")), 1);
        assert_eq!(driver.count("NodeUnpublishVolume", "vol-1", "OK"), 0);
        // A new pod of that driver is pending (not failed) meanwhile.
        env.write_manifest("pv2.yaml", &pv_yaml("pv-2", "vol-2", "64Mi", false, ""));
        env.write_manifest("b.yaml", &pod_yaml("b", "uid-b", &["pv-2"]));
        wait_for("b waiting for the driver", || {
            volume_status(&env, "uid-b").is_some_and(|(s, _, e)| {
                s == "pending" && e.is_some_and(|e| e.contains("waiting for CSI driver"))
            })
        });
        // The driver comes back and registers through the kubelet plugin
        // registration socket: the clean-up completes and b is mounted,
        // without a restart.
        driver.register_in(env.root.join("plugins_registry"));
        driver.start();
        driver.expect("NodeUnstageVolume", "vol-1", "OK", 1);
        assert_eq!(env.wait_pod("uid-b", 60.0), 0, "{}", agent.log());
        env.remove_manifest("b.yaml");
        driver.expect("NodeUnstageVolume", "vol-2", "OK", 1);
        assert_nothing_leaked(&env, &driver);
        assert!(agent.term());
    });
}

#[test]
fn driver_killed_mid_publish_then_restarted() {
    isolated("driver_killed_mid_publish_then_restarted", || {
        let env = Env::new();
        let mut driver = start_driver(&env);
        driver.faults(serde_json::json!([
            {"method": "NodePublishVolume", "volume_id": "vol-1", "count": 1, "exit": "after_work"}
        ]));
        env.write_manifest("pv.yaml", &pv_yaml("pv-1", "vol-1", "64Mi", false, ""));
        env.write_manifest("a.yaml", &pod_yaml("a", "uid-a", &["pv-1"]));
        let agent = start_agent(&env, &driver, &[]);
        wait_for("driver crashed mid-publish", || {
            driver.count("NodePublishVolume", "vol-1", "EXIT") == 1
        });
        driver.wait_exit();
        // The publish happened but its answer was lost: the mount exists,
        // yet the volume is uncertain, not mounted.
        let target = env.csi_publish_path("uid-a", "pv-1");
        assert_eq!(env.mount_count(&target), 1);
        wait_for("uncertain in status", || {
            volume_status(&env, "uid-a").is_some_and(|(s, _, _)| s == "uncertain")
        });
        driver.start();
        assert_eq!(env.wait_pod("uid-a", 60.0), 0, "{}", agent.log());
        driver.expect("NodePublishVolume", "vol-1", "OK", 1);
        assert_eq!(env.mount_count(&target), 1, "published again, not stacked");
        env.remove_manifest("a.yaml");
        driver.expect("NodeUnstageVolume", "vol-1", "OK", 1);
        assert_nothing_leaked(&env, &driver);
        drop(agent);
    });
}

#[test]
fn client_speaks_every_rpc_and_redials_a_moved_driver() {
    isolated("client_speaks_every_rpc_and_redials_a_moved_driver", || {
        use volmgr::pluginmanager::csi_client::CsiClients;
        use volmgr::pluginmanager::csi_proto::csi;
        use volmgr::pluginmanager::registry::DriverRegistry;

        let env = Env::new();
        let mut driver = start_driver(&env);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let registry = DriverRegistry::new();
        let clients = CsiClients::new(registry.clone(), Duration::from_secs(30));
        rt.block_on(async {
            // Not registered: the caller is told to wait for it.
            let e = clients.probe(DRIVER).await.unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("waiting for CSI driver {DRIVER} to register")
            );
            registry.register(DRIVER, driver.socket().to_path_buf(), vec![]);
            let info = clients.get_plugin_info(DRIVER).await.unwrap();
            assert_eq!(info.name, DRIVER);
            assert!(!clients
                .get_plugin_capabilities(DRIVER)
                .await
                .unwrap()
                .capabilities
                .is_empty());
            assert!(clients.probe(DRIVER).await.unwrap());
            assert_eq!(
                clients.node_get_info(DRIVER).await.unwrap().node_id,
                "node-1"
            );
            let caps = clients.node_capabilities(DRIVER).await.unwrap();
            assert!(caps.stage_unstage && caps.expand && caps.volume_stats);

            // Stage, read its stats, unstage: straight through the client.
            let staging = env.root.join("staging");
            std::fs::create_dir_all(&staging).unwrap();
            let cap = csi::VolumeCapability {
                access_mode: Some(csi::volume_capability::AccessMode {
                    mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(csi::volume_capability::AccessType::Mount(
                    csi::volume_capability::MountVolume {
                        fs_type: "ext4".into(),
                        mount_flags: vec![],
                        volume_mount_group: String::new(),
                    },
                )),
            };
            let path = staging.to_str().unwrap().to_string();
            clients
                .node_stage_volume(
                    DRIVER,
                    csi::NodeStageVolumeRequest {
                        volume_id: "c1".into(),
                        staging_target_path: path.clone(),
                        volume_capability: Some(cap),
                        volume_context: [("size".to_string(), "32Mi".to_string())].into(),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            let stats = clients
                .node_get_volume_stats(
                    DRIVER,
                    csi::NodeGetVolumeStatsRequest {
                        volume_id: "c1".into(),
                        volume_path: path.clone(),
                        staging_target_path: String::new(),
                    },
                )
                .await
                .unwrap();
            let bytes = stats
                .usage
                .iter()
                .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
                .unwrap();
            assert!(
                bytes.total > 16 << 20 && bytes.total <= 32 << 20,
                "{bytes:?}"
            );
            clients
                .node_unstage_volume(
                    DRIVER,
                    csi::NodeUnstageVolumeRequest {
                        volume_id: "c1".into(),
                        staging_target_path: path,
                    },
                )
                .await
                .unwrap();
        });
        assert!(driver.loop_devices().is_empty());

        // The driver moves to another socket: the next call dials it there.
        driver.kill();
        driver.move_socket(env.dir.path().join("moved.sock"));
        driver.start();
        registry.register(DRIVER, driver.socket().to_path_buf(), vec![]);
        rt.block_on(async {
            assert!(clients.probe(DRIVER).await.unwrap());
        });
        let text = clients.metrics().render();
        assert!(
            text.contains("method_name=\"/csi.v1.Identity/Probe\",migrated=\"false\"} 2"),
            "{text}"
        );
        assert_eq!(
            clients
                .metrics()
                .count(DRIVER, "/csi.v1.Node/NodeStageVolume", "OK"),
            1
        );
    });
}

/// The pod's fsGroup on CSI volumes, as the kubelet applies it for a
/// driver without `VOLUME_MOUNT_GROUP` and without a CSIDriver object
/// (policy `ReadWriteOnceWithFSType`): a ReadWriteOnce ext4 volume gets the
/// group on every entry (its root setgid) after publish; a ReadWriteMany
/// one is left as the driver made it.
#[test]
fn fs_group_is_applied_to_read_write_once_volumes_only() {
    isolated(
        "fs_group_is_applied_to_read_write_once_volumes_only",
        || {
            use std::os::unix::fs::MetadataExt;
            let env = Env::new();
            let driver = start_driver(&env);
            let rwo = pv_yaml("pv-rwo", "vol-rwo", "64Mi", false, "")
                .replace("ReadWriteMany", "ReadWriteOnce");
            env.write_manifest("rwo.yaml", &rwo);
            env.write_manifest("rwx.yaml", &pv_yaml("pv-rwx", "vol-rwx", "64Mi", false, ""));
            let pod = pod_yaml("p", "uid-fsg", &["pv-rwo", "pv-rwx"])
                .replace("spec:\n", "spec:\n  securityContext: {fsGroup: 3456}\n");
            env.write_manifest("pod.yaml", &pod);
            let agent = start_agent(&env, &driver, &[]);
            assert_eq!(env.wait_pod("uid-fsg", 60.0), 0, "{}", agent.log());
            let rwo = env.csi_publish_path("uid-fsg", "pv-rwo");
            let root = std::fs::metadata(&rwo).unwrap();
            assert_eq!(root.gid(), 3456, "{}", agent.log());
            assert_eq!(root.mode() & 0o2070, 0o2070, "root mode {:o}", root.mode());
            // mkfs.ext4 made lost+found: the walk reached it too.
            assert_eq!(
                std::fs::metadata(rwo.join("lost+found")).unwrap().gid(),
                3456
            );
            let rwx = std::fs::metadata(env.csi_publish_path("uid-fsg", "pv-rwx")).unwrap();
            assert_ne!(rwx.gid(), 3456, "a ReadWriteMany volume was changed");
            env.remove_manifest("pod.yaml");
            env.wait_for("pod torn down", || !env.root.join("pods/uid-fsg").exists());
            assert_nothing_leaked(&env, &driver);
            assert!(agent.term());
        },
    );
}

/// What a reboot leaves under ROOT: every mount gone (unmounted lazily,
/// deepest first, in the test's own mount namespace), the files kept; and
/// no loop device of the driver (it loses them too). The agent and the
/// driver are killed first (`kill -9`).
fn reboot(env: &Env, agent: support::Agent, driver: &mut Driver) {
    agent.kill9();
    driver.kill();
    for _ in 0..16 {
        let mut points: Vec<PathBuf> = env.mounts().into_iter().map(|m| m.mount_point).collect();
        if points.is_empty() {
            break;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        points.dedup();
        for p in points {
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    assert!(env.mounts().is_empty(), "every mount under ROOT gone");
    for dev in driver.loop_devices() {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &format!("/dev/{dev}")])
            .status();
    }
    wait_for("the driver's loop devices gone", || {
        driver.loop_devices().is_empty()
    });
}

/// A pod with filesystem PV `pv-1` at `/data` (and its `sub` directory at
/// `/sub`) and block PV `pv-b` at `/dev/xvda`.
const FS_AND_BLOCK_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: test, uid: uid-p}\nspec:\n  containers: [{name: c, image: i, volumeMounts: [{name: data, mountPath: /data}, {name: data, mountPath: /sub, subPath: sub}], volumeDevices: [{name: dev, devicePath: /dev/xvda}]}]\n  volumes: [{name: data, persistentVolumeClaim: {claimName: claim-pv-1}}, {name: dev, persistentVolumeClaim: {claimName: claim-pv-b}}]\n";

/// The first bytes of the block device the pod sees at `link`.
fn read_block(link: &Path, n: usize) -> Vec<u8> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    let mut f = std::fs::File::open(link).unwrap();
    let got = f.read(&mut buf).unwrap();
    buf.truncate(got);
    buf
}

/// After a reboot (files kept, every mount and loop device gone) the staged
/// and published records are only claims: the agent stages again before it
/// publishes again, as the kubelet does. With a driver that publishes from
/// the staging path without checking (EBS-style), trusting the staged
/// record would give the pod the node's empty `globalmount` (block: the
/// empty device file at the staging path) and its data would not be there.
/// Then an out-of-band unmount of the staging mount, seen by the tracer and
/// by the resync: staged again, published again.
#[test]
fn a_reboot_stages_again_before_publishing() {
    isolated("a_reboot_stages_again_before_publishing", || {
        let env = Env::new();
        let mut driver = Driver::new(&env, DRIVER);
        driver.with_args(&["--publish-without-stage-check"]);
        driver.start();
        env.write_manifest("pv1.yaml", &pv_yaml("pv-1", "vol-1", "64Mi", false, ""));
        env.write_manifest("pvb.yaml", &pv_yaml("pv-b", "vol-b", "64Mi", true, ""));
        env.write_manifest("p.yaml", FS_AND_BLOCK_POD);
        let agent = start_agent(&env, &driver, &[]);
        assert_eq!(env.wait_pod("uid-p", 60.0), 0, "{}", agent.log());
        let data = env.csi_publish_path("uid-p", "pv-1");
        std::fs::write(data.join("keep"), b"written before the reboot").unwrap();
        let (_, link, _) = block_paths(&env, "uid-p", "pv-b");
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().write(true).open(&link).unwrap();
            f.write_all(b"block data").unwrap();
            f.sync_all().unwrap();
        }

        reboot(&env, agent, &mut driver);
        driver.start();
        let agent = start_agent(&env, &driver, &["--tracer", "mountinfo"]);
        assert_eq!(env.wait_pod("uid-p", 60.0), 0, "{}", agent.log());
        // The pod's data is in its volume (the node's empty directory or
        // file would not have it).
        assert_eq!(
            std::fs::read(data.join("keep")).unwrap_or_default(),
            b"written before the reboot",
            "{}",
            agent.log()
        );
        assert_eq!(read_block(&link, 10), b"block data");
        driver.expect("NodeStageVolume", "vol-1", "OK", 2);
        driver.expect("NodeStageVolume", "vol-b", "OK", 2);
        let calls = driver.calls();
        let last = |m: &str, v: &str| {
            calls
                .iter()
                .rposition(|c| c["method"] == m && c["volume_id"] == v && c["code"] == "OK")
                .unwrap()
        };
        for v in ["vol-1", "vol-b"] {
            assert!(
                last("NodeStageVolume", v) < last("NodePublishVolume", v),
                "{v}: staged before it was published again: {calls:?}"
            );
        }
        assert_block_mapped(&env, "uid-p", "pv-b");

        // A subPath bind lost while the agent was down: the volume's mounts
        // are there, yet it is set up again (subPaths included), without a
        // second stage.
        let sub = env.root.join("pods/uid-p/volume-subpaths/data/c/1");
        assert_eq!(env.mount_count(&sub), 1);
        agent.kill9();
        nix::mount::umount2(&sub, nix::mount::MntFlags::MNT_DETACH).unwrap();
        let agent = start_agent(&env, &driver, &["--tracer", "mountinfo"]);
        wait_or_dump(&env, &agent, &driver, "the subPath bound again", || {
            env.mount_count(&sub) == 1
        });
        assert_eq!(driver.count("NodeStageVolume", "vol-1", "OK"), 2);

        // The staging mount unmounted behind the agent's back: the tracer
        // sees it; staged again, and the pod's volume still has its data.
        let stage = stage_path(&env, "vol-1");
        nix::mount::umount2(&stage, nix::mount::MntFlags::MNT_DETACH).unwrap();
        driver.expect("NodeStageVolume", "vol-1", "OK", 3);
        wait_for("staged again", || env.mount_count(&stage) == 1);
        // Both unmounted: staged again, then published again.
        agent.kill9();
        let agent = start_agent(&env, &driver, &["--tracer", "off", "--resync-period", "1s"]);
        env.wait_synced();
        for p in [&data, &stage] {
            nix::mount::umount2(p.as_path(), nix::mount::MntFlags::MNT_DETACH).unwrap();
        }
        driver.expect("NodeStageVolume", "vol-1", "OK", 4);
        wait_for("published again", || env.mount_count(&data) == 1);
        assert_eq!(
            std::fs::read(data.join("keep")).unwrap(),
            b"written before the reboot",
            "{}",
            agent.log()
        );

        env.remove_manifest("p.yaml");
        driver.expect("NodeUnstageVolume", "vol-1", "OK", 1);
        driver.expect("NodeUnstageVolume", "vol-b", "OK", 1);
        assert_nothing_leaked(&env, &driver);
        drop(agent);
    });
}
