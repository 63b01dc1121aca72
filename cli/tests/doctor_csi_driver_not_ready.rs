//! End-to-end test of `csi_driver_not_ready` (issue 41, item 4): the CSI
//! registration triage of a pod waiting for a CSI volume. The in-repo test
//! driver serves the plugin registration API in `ROOT/plugins_registry`
//! as node-driver-registrar does; the observing agent (its pods and the
//! node's CSINode from the fake API server) must name, in `volmgr doctor`,
//! the first step that fails, each broken in turn: the CSINode without the
//! driver, an endpoint that does not answer `Probe`, a registration socket
//! that does not answer `GetInfo`, no registration socket at all; a healthy
//! driver gives no such finding (the stuck volume's finding says it is
//! registered). Read-only: the driver is never told anything
//! (`NotifyRegistrationStatus`), and the API server only sees GETs of the
//! node's CSINode.
//!
//! Before: the stuck volume's finding said "nothing set up in the pod's
//! directory", with no word of the driver; no `csi_driver_not_ready`
//! finding existed.
//!
//! The triage's cost at 110 pods and 5 drivers is measured by the ignored
//! `triage_cost` (BENCHMARKS.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/cost.rs"]
mod cost;
#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use csi_driver::{wait_for, Driver};
use serde_json::{json, Value};
use support::{doctor, doctor_findings, isolated, Env};
use volmgr_kube::testing::FakeApiServer;

const DRIVER: &str = "loop.csi.volmgr.dev";
const KIND: &str = "csi_driver_not_ready";

/// Waits (generously) until `cond` holds, showing `what`, the last report
/// and the agent's log if it never does.
fn wait_until(what: &str, state: &Path, log: impl Fn() -> String, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "gave up waiting for: {what}\n--- doctor\n{}\n--- agent log\n{}",
            doctor(state, false).1,
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The node's CSINode listing `drivers`.
fn csinode(drivers: &[&str]) -> Value {
    let drivers: Vec<Value> = drivers
        .iter()
        .map(|d| json!({"name": d, "nodeID": "node-1", "topologyKeys": null}))
        .collect();
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": "node-1"}, "spec": {"drivers": drivers}})
}

/// The Node, the node's CSINode listing the driver, a claim of the test
/// driver and a running pod on node-1 that needs it (nobody mounts it:
/// the pod waits, its volume stuck after `--stuck-after`).
fn serve(api: &FakeApiServer) {
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}}));
    api.apply(csinode(&[DRIVER]));
    api.apply(json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-1"},
        "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"],
            "claimRef": {"namespace": "test", "name": "claim-1"},
            "csi": {"driver": DRIVER, "volumeHandle": "vol-1", "fsType": "ext4"}}}));
    api.apply(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "claim-1", "namespace": "test"},
        "spec": {"volumeName": "pv-1", "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Bound"}}));
    api.apply(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "waits", "namespace": "test", "uid": "uid-waits"},
        "spec": {"nodeName": "node-1",
            "containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "claim-1"}}]},
        "status": {"phase": "Pending"}}));
}

/// The one `csi_driver_not_ready` finding once its summary has `words`:
/// on the waiting pod's volume, with every step in its evidence.
fn wait_finding(state: &Path, log: &dyn Fn() -> String, words: &str) -> Value {
    wait_until(
        &format!("a {KIND} finding with {words:?}"),
        state,
        log,
        || {
            doctor_findings(state, KIND)
                .iter()
                .any(|f| f["summary"].as_str().unwrap().contains(words))
        },
    );
    let fs = doctor_findings(state, KIND);
    assert_eq!(fs.len(), 1, "{fs:#?}");
    let f = fs.into_iter().next().unwrap();
    assert_eq!(f["pod"], "test/waits", "{f:#}");
    assert_eq!(f["pod_uid"], "uid-waits", "{f:#}");
    assert_eq!(f["volume"], "data", "{f:#}");
    let ev = f["evidence"].to_string();
    for step in ["1 registration socket:", "2 GetInfo:", "3 ", "4 CSINode"] {
        assert!(ev.contains(step), "step {step:?} missing: {f:#}");
    }
    f
}

/// Waits until no `csi_driver_not_ready` finding is left and the stuck
/// volume's finding says the driver is registered (a fresh triage).
fn wait_healthy(state: &Path, log: &dyn Fn() -> String) {
    wait_until("the driver triaged healthy", state, log, || {
        let stuck = doctor_findings(state, "volume_stuck");
        doctor_findings(state, KIND).is_empty()
            && stuck.len() == 1
            && stuck[0]["evidence"]
                .to_string()
                .contains(&format!("CSI driver \\\"{DRIVER}\\\": registered"))
    });
}

#[test]
fn each_broken_step_of_a_drivers_registration_is_named() {
    isolated(
        "each_broken_step_of_a_drivers_registration_is_named",
        || {
            let env = Env::new();
            let registry = env.root.join("plugins_registry");
            let mut driver = Driver::new(&env, DRIVER);
            driver.register_in(registry.clone());
            driver.start();
            let reg_socket = driver.registration_socket();
            wait_for("the registration socket", || reg_socket.exists());
            let api = FakeApiServer::start();
            serve(&api);
            let kubeconfig = api.write_kubeconfig(env.dir.path());
            let state = env.dir.path().join("state");
            let agent = env.start_agent_without_manifests(&[
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--observe",
                "--state-dir",
                state.to_str().unwrap(),
                "--node-name",
                "node-1",
                "--stuck-after",
                "1s",
                "--scan-period",
                "200ms",
            ]);
            let log = || agent.log();

            // Healthy: the stuck volume's finding says the driver is
            // registered and answers; no finding of the driver.
            wait_healthy(&state, &log);

            // 4: the node's CSINode does not list the driver.
            api.apply(csinode(&[]));
            let f = wait_finding(&state, &log, "CSINode node-1 does not list it");
            let ev = f["evidence"].to_string();
            assert!(ev.contains("1 registration socket: ok"), "{f:#}");
            assert!(ev.contains("2 GetInfo: ok: name"), "{f:#}");
            assert!(ev.contains("Probe ready, GetPluginInfo"), "{f:#}");
            assert!(ev.contains("4 CSINode node-1: FAILED: lists []"), "{f:#}");
            assert_eq!(f["path"], driver.socket().to_str().unwrap(), "{f:#}");
            let (code, text) = doctor(&state, false);
            assert_eq!(code, 1, "{text}");
            assert!(text.contains(&format!("- {KIND}:")), "{text}");
            assert!(text.contains("CSINode node-1 does not list it"), "{text}");
            assert!(text.contains("node-driver-registrar"), "the action: {text}");
            api.apply(csinode(&[DRIVER]));
            wait_healthy(&state, &log);

            // 3: the endpoint does not answer Probe (within the deadline).
            driver.faults(json!([{"method": "Probe", "hang": true}]));
            let f = wait_finding(&state, &log, "does not answer Probe");
            let ev = f["evidence"].to_string();
            assert!(ev.contains("2 GetInfo: ok"), "{f:#}");
            assert!(ev.contains("FAILED: Probe: no answer within 2s"), "{f:#}");
            assert!(ev.contains("4 CSINode: not checked"), "{f:#}");
            driver.faults(json!([]));
            wait_healthy(&state, &log);

            // 2: a registration socket that never answers (bound, listening,
            // never accepted): the driver's registrar hung.
            driver.stop();
            let hung = std::os::unix::net::UnixListener::bind(&reg_socket).unwrap();
            let f = wait_finding(&state, &log, "does not answer GetInfo");
            assert_eq!(f["path"], reg_socket.to_str().unwrap(), "{f:#}");
            assert!(
                f["evidence"].to_string().contains("2 GetInfo: FAILED"),
                "{f:#}"
            );

            // 1: no registration socket at all.
            drop(hung);
            std::fs::remove_file(&reg_socket).unwrap();
            let f = wait_finding(&state, &log, "no registration socket of it");
            assert_eq!(f["path"], registry.to_str().unwrap(), "{f:#}");
            assert!(
                f["evidence"]
                    .to_string()
                    .contains("1 registration socket: FAILED: none of the 0 sockets"),
                "{f:#}"
            );

            // Back: the driver registers again, the finding clears.
            driver.start();
            wait_healthy(&state, &log);

            // Read-only: the driver was never told anything, and of CSINodes
            // the API server saw only GETs of the node's own.
            assert!(driver.calls_of("NotifyRegistrationStatus").is_empty());
            assert!(driver.registration().is_none());
            let csinodes: Vec<String> = api
                .requests()
                .into_iter()
                .filter(|r| r.path.contains("csinodes"))
                .map(|r| format!("{} {}", r.method, r.path))
                .collect();
            assert!(!csinodes.is_empty());
            assert!(
                csinodes
                    .iter()
                    .all(|r| r == "GET /apis/storage.k8s.io/v1/csinodes/node-1"),
                "{csinodes:?}"
            );
            assert!(agent.term());
        },
    );
}

/// The five drivers the 110 pods of [`triage_cost`] need: two registered
/// and answering, one whose endpoint never answers `Probe`, one whose
/// registration socket never answers `GetInfo`, one not registered.
const DRIVERS: [&str; 5] = [
    "a.csi.volmgr.dev",
    "b.csi.volmgr.dev",
    "probe-hangs.csi.volmgr.dev",
    "registrar-hangs.csi.volmgr.dev",
    "absent.csi.volmgr.dev",
];

/// The Node, its CSINode listing all of [`DRIVERS`], and 110 pending pods
/// on it, pod `i` needing a claim of driver `i % 5`.
fn serve_110_pods(api: &FakeApiServer) {
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}}));
    api.apply(csinode(&DRIVERS));
    for i in 0..110 {
        let driver = DRIVERS[i % DRIVERS.len()];
        api.apply(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": format!("pv-{i}")},
            "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"],
                "claimRef": {"namespace": "test", "name": format!("claim-{i}")},
                "csi": {"driver": driver, "volumeHandle": format!("vol-{i}"), "fsType": "ext4"}}}));
        api.apply(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": format!("claim-{i}"), "namespace": "test"},
            "spec": {"volumeName": format!("pv-{i}"), "accessModes": ["ReadWriteOnce"]},
            "status": {"phase": "Bound"}}));
        api.apply(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("waits-{i}"), "namespace": "test", "uid": format!("uid-{i:03}")},
            "spec": {"nodeName": "node-1",
                "containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("claim-{i}")}}]},
            "status": {"phase": "Pending"}}));
    }
}

/// The cost of the CSI registration triage at 110 pods (issue 41): 110
/// pending pods on the node needing 5 drivers ([`DRIVERS`]), all waiting
/// past `--stuck-after`: 44 on the two healthy drivers, 66 on the three
/// failing ones, two of which never answer (each call cut at
/// `CALL_TIMEOUT`, 2 s). The observing agent (`--tracer mountinfo`, the
/// default `--scan-period` 10s) triages the 5 drivers once per `REFRESH`
/// (10 s). Prints, for BENCHMARKS.md, its CPU over 60 s, RSS and threads.
/// Run by hand: `cargo test -p volmgr-cli --test
/// doctor_csi_driver_not_ready -- --ignored --nocapture triage_cost`.
///
/// Measured on 2026-11-29 (2 shared cores, load average 6, Linux 6.18,
/// debug build): over 60 s the agent used 0.94 s of CPU (1.57 %), VmRSS
/// 52.5 MB, 8 threads; scans 3-145 ms; the three failing drivers each
/// named by their first failing step.
#[test]
#[ignore = "cost measurement, run by hand: prints the figures for BENCHMARKS.md"]
fn triage_cost() {
    isolated("triage_cost", || {
        let env = Env::new();
        let registry = env.root.join("plugins_registry");
        let envs: Vec<Env> = DRIVERS[..3].iter().map(|_| Env::new()).collect();
        let drivers: Vec<Driver> = envs
            .iter()
            .zip(DRIVERS)
            .map(|(e, name)| {
                let mut d = Driver::new(e, name);
                d.register_in(registry.clone());
                d.start();
                d
            })
            .collect();
        drivers[2].faults(json!([{"method": "Probe", "hang": true}]));
        let hung = registry.join(format!("{}-reg.sock", DRIVERS[3]));
        let _hung = std::os::unix::net::UnixListener::bind(&hung).unwrap();
        let api = FakeApiServer::start();
        serve_110_pods(&api);
        let kubeconfig = api.write_kubeconfig(env.dir.path());
        let state = env.dir.path().join("state");
        let agent = env.start_agent_without_manifests(&[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--observe",
            "--state-dir",
            state.to_str().unwrap(),
            "--node-name",
            "node-1",
            "--tracer",
            "mountinfo",
            "--stuck-after",
            "1s",
        ]);
        let log = || agent.log();
        wait_until("110 stuck, 66 csi_driver_not_ready", &state, log, || {
            doctor_findings(&state, "volume_stuck").len() == 110
                && doctor_findings(&state, KIND).len() == 66
        });
        let mut report = String::from("110 pods stuck, 5 drivers (2 healthy), 66 findings\n");
        report += &cost::usage(&cost::agent_and_children(agent.child.id()), 60);
        report += &cost::scan_times(&agent.log(), 8);
        let mut summaries: Vec<String> = doctor_findings(&state, KIND)
            .iter()
            .map(|f| f["summary"].as_str().unwrap().to_string())
            .collect();
        summaries.dedup();
        report += &format!("findings: {summaries:#?}\n");
        let out = std::env::temp_dir().join("volmgr-csi-triage-cost.txt");
        std::fs::write(&out, &report).unwrap();
        println!("{report}(in {})", out.display());
        drop(drivers);
        drop(agent);
    });
}
