//! Volume stats and health end to end: the real agent collects
//! NodeGetVolumeStats from the real test driver (`volmgr-csi-driver`) every
//! `--volume-stats-period` and serves the kubelet's `kubelet_volume_stats_*`
//! gauges on `/metrics`, each test in a private mount namespace of its own.
//! The driver's volume condition comes from `STATE/conditions.json`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

use std::time::{Duration, Instant};

use csi_driver::{wait_for, Driver};
use support::{free_port, isolated, metrics, Agent, Env};

const DRIVER: &str = "loop.csi.volmgr.dev";

/// PersistentVolume `pv` of the test driver and its bound claim `claim-<pv>`.
fn pv_yaml(pv: &str, handle: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {pv}}}\nspec:\n  capacity: {{storage: 64Mi}}\n  accessModes: [ReadWriteMany]\n  claimRef: {{namespace: test, name: claim-{pv}}}\n  csi: {{driver: {DRIVER}, volumeHandle: {handle}, fsType: ext4, volumeAttributes: {{size: 64Mi}}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-{pv}, namespace: test}}\nspec: {{volumeName: {pv}, accessModes: [ReadWriteMany]}}\n"
    )
}

fn start(env: &Env, driver: &Driver, addr: &str, period: &str) -> Agent {
    let flag = driver.flag();
    env.start_agent(&[
        "--csi-driver",
        &flag,
        "--node-name",
        "node-1",
        "--metrics-addr",
        addr,
        "--volume-stats-period",
        period,
    ])
}

/// The value of series `name{labels}` in `text`, if present.
fn value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{labels} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
}

/// Replaces the driver's conditions.json atomically.
fn set_conditions(driver: &Driver, json: serde_json::Value) {
    let tmp = driver.state().join(".conditions.tmp");
    std::fs::write(&tmp, json.to_string()).unwrap();
    std::fs::rename(&tmp, driver.state().join("conditions.json")).unwrap();
}

const LABELS: &str = "{namespace=\"test\",persistentvolumeclaim=\"claim-pv-s\"}";
const HEALTH: &str = "kubelet_volume_stats_health_status_abnormal";

#[test]
fn pvc_stats_and_health_reach_metrics_and_status() {
    isolated("pvc_stats_and_health_reach_metrics_and_status", || {
        let env = Env::new();
        let mut driver = Driver::new(&env, DRIVER);
        driver.start();
        env.write_manifest("pv.yaml", &pv_yaml("pv-s", "vol-s"));
        let pod = support::pod_yaml(
            "p",
            "uid-p",
            &[
                ("data", "persistentVolumeClaim: {claimName: claim-pv-s}"),
                ("scratch", "emptyDir: {}"),
            ],
        );
        env.write_manifest("p.yaml", &pod);
        let addr = free_port();
        let agent = start(&env, &driver, &addr, "1s");
        assert_eq!(env.wait_pod("uid-p", 60.0), 0, "{}", agent.log());

        // The six gauges and the health gauge, with the claim's labels.
        wait_for("volume stats in /metrics", || {
            value(&metrics(&addr), HEALTH, LABELS).is_some()
        });
        let text = metrics(&addr);
        let get =
            |name: &str| value(&text, name, LABELS).unwrap_or_else(|| panic!("{name}\n{text}"));
        let capacity = get("kubelet_volume_stats_capacity_bytes");
        let (available, used) = (
            get("kubelet_volume_stats_available_bytes"),
            get("kubelet_volume_stats_used_bytes"),
        );
        assert!(capacity > 16e6 && capacity <= 64.0 * 1048576.0, "{text}");
        assert!(
            used > 0.0 && available > 0.0 && used + available <= capacity,
            "{text}"
        );
        let inodes = get("kubelet_volume_stats_inodes");
        let (free, in_use) = (
            get("kubelet_volume_stats_inodes_free"),
            get("kubelet_volume_stats_inodes_used"),
        );
        assert!(
            inodes > 0.0 && in_use > 0.0 && free + in_use <= inodes,
            "{text}"
        );
        assert_eq!(get(HEALTH), 0.0);
        assert!(text.contains("# HELP kubelet_volume_stats_capacity_bytes Capacity in bytes of the volume\n# TYPE kubelet_volume_stats_capacity_bytes gauge\n"), "{text}");
        assert!(text.contains("# HELP kubelet_volume_stats_health_status_abnormal Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy\n"), "{text}");
        // The emptyDir has no claim: no series (the kubelet's rule).
        assert_eq!(
            text.matches("kubelet_volume_stats_capacity_bytes{").count(),
            1,
            "{text}"
        );

        // Status: both volumes have stats (statfs for the emptyDir).
        env.wait_for("stats of both volumes in status", || {
            let st = env.status();
            let p = st.pods.iter().find(|p| p.uid == "uid-p").cloned();
            p.is_some_and(|p| p.volumes.iter().all(|v| v.stats.is_some()))
        });

        // The driver reports the volume abnormal: after the next period.
        set_conditions(
            &driver,
            serde_json::json!({"vol-s": {"abnormal": true, "message": "disk on fire"}}),
        );
        wait_for("health_status_abnormal 1", || {
            value(&metrics(&addr), HEALTH, LABELS) == Some(1.0)
        });
        let st = env.status();
        let p = st.pods.iter().find(|p| p.uid == "uid-p").unwrap();
        let data = p.volumes.iter().find(|v| v.name == "data").unwrap();
        let s = data.stats.as_ref().unwrap();
        assert!(
            s.abnormal && s.message.as_deref() == Some("disk on fire"),
            "{s:?}"
        );
        assert!(s.capacity_bytes > 0 && !s.stale && s.collected_at.is_some());

        // A failing driver: the last values stay, marked stale.
        driver.faults(serde_json::json!([{"method": "NodeGetVolumeStats", "code": "UNAVAILABLE"}]));
        env.wait_for("stale stats", || {
            let st = env.status();
            let p = st.pods.iter().find(|p| p.uid == "uid-p").cloned();
            p.and_then(|p| p.volumes.into_iter().find(|v| v.name == "data"))
                .and_then(|v| v.stats)
                .is_some_and(|s| s.stale && s.capacity_bytes > 0)
        });
        assert_eq!(value(&metrics(&addr), HEALTH, LABELS), Some(1.0));
        driver.faults(serde_json::json!([]));

        // The pod goes: its series go.
        env.remove_manifest("p.yaml");
        wait_for("series gone", || {
            !metrics(&addr).contains("kubelet_volume_stats_")
        });
        driver.expect("NodeUnstageVolume", "vol-s", "OK", 1);
        wait_for("every mount under ROOT gone", || env.mounts().is_empty());
        wait_for("loop devices detached", || driver.loop_devices().is_empty());
        assert!(driver.count("NodeGetVolumeStats", "vol-s", "OK") >= 2);
        assert!(agent.term());
    });
}

/// CPU time (user + system, seconds) of the processes whose command line
/// mentions `needle`.
fn cpu_seconds(needle: &str) -> f64 {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as f64;
    let mut total = 0.0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmd).contains(needle) {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let f: Vec<&str> = rest.split(' ').collect();
        // Fields 14 and 15 (utime, stime); `rest` starts at field 3.
        let t: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
        total += t / ticks;
    }
    total
}

/// The cost of collections at `VOLMGR_STATS_BENCH_PODS` pods publishing one
/// claim: CPU of the agent and of the driver per collection. Runs only with
/// the variable set: `VOLMGR_STATS_BENCH_PODS=200 cargo test -p volmgr-cli
/// --test csi_stats bench -- --nocapture`.
#[test]
fn bench_stats_collection_cpu() {
    let Some(n) = std::env::var("VOLMGR_STATS_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    else {
        eprintln!("SKIP bench_stats_collection_cpu: VOLMGR_STATS_BENCH_PODS is not set");
        return;
    };
    let _ = std::fs::remove_file(bench_report());
    isolated("bench_stats_collection_cpu", || {
        let env = Env::new();
        let mut driver = Driver::new(&env, DRIVER);
        driver.start();
        env.write_manifest("pv.yaml", &pv_yaml("pv-s", "vol-s"));
        for i in 0..n {
            let pod = support::pod_yaml(
                &format!("p{i}"),
                &format!("uid-{i}"),
                &[("data", "persistentVolumeClaim: {claimName: claim-pv-s}")],
            );
            env.write_manifest(&format!("p{i}.yaml"), &pod);
        }
        let addr = free_port();
        let agent = start(&env, &driver, &addr, "2s");
        for i in 0..n {
            assert_eq!(
                env.wait_pod(&format!("uid-{i}"), 300.0),
                0,
                "{}",
                agent.log()
            );
        }
        let ok = || driver.count("NodeGetVolumeStats", "vol-s", "OK");
        // Settle: one whole collection after the last mount.
        let c0 = ok();
        wait_for("a whole collection", || ok() >= c0 + 2 * n);
        let root = env.root.display().to_string();
        let state = driver.state().display().to_string();
        let (a0, d0, t0, k0) = (
            cpu_seconds(&root),
            cpu_seconds(&state),
            Instant::now(),
            ok(),
        );
        std::thread::sleep(Duration::from_secs(20));
        let (a1, d1, k1) = (cpu_seconds(&root), cpu_seconds(&state), ok());
        let collections = (k1 - k0) as f64 / n as f64;
        let line = format!(
            "BENCH {n} volumes: {collections:.1} collections in {:.1}s; per collection: agent {:.1} ms CPU, driver {:.1} ms CPU",
            t0.elapsed().as_secs_f64(),
            (a1 - a0) * 1e3 / collections,
            (d1 - d0) * 1e3 / collections,
        );
        // The isolated child's output is shown only on failure.
        std::fs::write(bench_report(), line).unwrap();
        for i in 0..n {
            env.remove_manifest(&format!("p{i}.yaml"));
        }
        driver.expect("NodeUnstageVolume", "vol-s", "OK", 1);
        wait_for("every mount under ROOT gone", || env.mounts().is_empty());
        drop(agent);
    });
    if let Ok(line) = std::fs::read_to_string(bench_report()) {
        println!("{line}");
    }
}

/// Where the isolated benchmark leaves its result line.
fn bench_report() -> std::path::PathBuf {
    // Under the temporary directory: the isolated child may write nowhere
    // else on the host.
    std::env::temp_dir().join("volmgr-csi-stats-bench.txt")
}
