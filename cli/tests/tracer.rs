//! Out-of-band changes to managed volumes, end to end: the real agent runs
//! with each tracer in a private mount namespace with a resync period of an
//! hour (so the resync cannot be what repairs), another process (util-linux
//! `umount`/`mount`) changes a managed volume, and the agent must repair it
//! and show the change in its status.

// Test code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::process::Command;

use support::{isolated, pod_yaml, Env};
use volmgr::status::{OutOfBandEvent, Status};

const MEM: &str = "emptyDir: {medium: Memory}";
const DISK: &str = "emptyDir: {}";

/// Why the eBPF tracer cannot run here, if it cannot (checked in the parent,
/// so the reason is printed where the test runner shows it).
fn ebpf_unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root".into());
    }
    let ns = match volmgr::ebpf::own_mount_namespace() {
        Ok(ns) => ns,
        Err(e) => return Some(format!("mount namespace: {e}")),
    };
    match volmgr::ebpf::EbpfTracer::load(volmgr::ebpf::TraceFilter { mnt_ns: Some(ns) }) {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

fn run(cmd: &str, args: &[&str], path: &Path) {
    let st = Command::new(cmd)
        .args(args)
        .arg(path)
        .status()
        .unwrap_or_else(|e| panic!("run {cmd}: {e}"));
    assert!(st.success(), "{cmd} {args:?} {} failed", path.display());
}

fn volume<'a>(s: &'a Status, uid: &str, vol: &str) -> &'a volmgr::status::VolumeStatus {
    s.pods
        .iter()
        .find(|p| p.uid == uid)
        .and_then(|p| p.volumes.iter().find(|v| v.name == vol))
        .unwrap_or_else(|| panic!("no volume {vol} of pod {uid} in status"))
}

fn events<'a>(s: &'a Status, kind: &str, vol: &str) -> Vec<&'a OutOfBandEvent> {
    s.out_of_band
        .iter()
        .filter(|e| e.kind == kind && e.volume == vol)
        .collect()
}

/// The agent, started with `tracer`, repairs a volume unmounted by `umount`
/// and removes foreign mounts from volume paths; status shows both.
fn out_of_band_cycle(tracer: &str) {
    let env = Env::new();
    env.write_manifest(
        "p.yaml",
        &pod_yaml("p", "uid-p", &[("m", MEM), ("d", DISK), ("keep", MEM)]),
    );
    let mut agent = env.start_agent(&["--tracer", tracer, "--resync-period", "1h"]);
    assert_eq!(env.wait_pod("uid-p", 60.0), 0, "log:\n{}", agent.log());
    let s = env.status();
    assert_eq!(s.tracer, tracer, "reason: {}", s.tracer_reason);
    let (m, d, keep) = (
        env.empty_dir("uid-p", "m"),
        env.empty_dir("uid-p", "d"),
        env.empty_dir("uid-p", "keep"),
    );
    assert_eq!(env.mount_count(&m), 1);
    std::fs::write(keep.join("data"), b"precious").unwrap();

    // 1. Out-of-band unmount: mounted back, without waiting for the resync.
    // (A mount id may be reused, so the proof that this is a new mount is
    // the unmount's success plus the status below.)
    run("umount", &[], &m);
    env.wait_for("the unmounted volume is mounted again", || {
        env.mounts()
            .iter()
            .any(|x| x.mount_point == m && x.fstype == "tmpfs")
    });
    env.wait_for("status shows the loss as repaired", || {
        let s = env.status();
        volume(&s, "uid-p", "m").state == "mounted"
            && events(&s, "lost", "m")
                .iter()
                .any(|e| e.outcome == "repaired")
    });
    let s = env.status();
    let v = volume(&s, "uid-p", "m");
    assert_eq!(v.out_of_band_changes, 1);
    assert!(v.last_out_of_band.is_some());
    assert_eq!(volume(&s, "uid-p", "keep").out_of_band_changes, 0);
    let lost = events(&s, "lost", "m");
    assert_eq!(lost.len(), 1, "{:?}", s.out_of_band);
    let e = lost[0];
    assert_eq!(e.detected_by, tracer);
    assert_eq!(e.pod_uid, "uid-p");
    assert_eq!(Path::new(&e.path), m);
    assert!(e.repaired_after_ms.is_some());
    if tracer == "ebpf" {
        let cause = e.cause.as_deref().unwrap_or("");
        assert!(
            cause.starts_with("umount2(") && cause.contains("umount["),
            "cause: {cause}"
        );
        assert!(e.detected_after_us.is_some());
        // Every syscall lands in the latency summary, the agent's own too.
        let row = |call: &str, fstype: &str| {
            s.syscalls.iter().any(|c| {
                c.syscall == call && c.fstype == fstype && c.result == "ok" && c.count >= 1
            })
        };
        assert!(row("mount", "tmpfs"), "{:?}", s.syscalls);
        assert!(row("umount2", ""), "{:?}", s.syscalls);
        // And in the Prometheus text.
        let metrics = env.metrics_text();
        assert!(
            metrics.contains("volmgr_mount_syscall_duration_seconds_bucket{syscall=\"umount2\""),
            "{metrics}"
        );
        assert!(
            metrics.contains("volmgr_trace_events_lost_total"),
            "{metrics}"
        );
    }
    let metrics = env.metrics_text();
    let counter =
        format!("volmgr_out_of_band_changes_total{{kind=\"lost\",detected_by=\"{tracer}\"}} 1\n");
    assert!(metrics.contains(&counter), "{metrics}");
    assert!(s.tracer_stats.checks >= 1);
    assert!(s.tracer_stats.out_of_band_events >= 1);

    // 2. Foreign mounts: over a tmpfs volume, and on a disk volume's
    // directory. Both are removed; the volume underneath keeps its data.
    run("mount", &["-t", "tmpfs", "foreign"], &keep);
    run("mount", &["-t", "tmpfs", "foreign"], &d);
    env.wait_for("foreign mounts removed", || {
        env.mount_count(&keep) == 1 && env.mount_count(&d) == 0
    });
    assert_eq!(
        std::fs::read(keep.join("data")).unwrap(),
        b"precious",
        "the volume under the foreign mount is the pod's own"
    );
    env.wait_for("status shows the foreign mounts removed", || {
        let s = env.status();
        ["keep", "d"].iter().all(|v| {
            events(&s, "foreign_mount", v)
                .iter()
                .any(|e| e.outcome == "repaired" && e.detected_by == tracer)
        })
    });
    let s = env.status();
    assert_eq!(volume(&s, "uid-p", "keep").out_of_band_changes, 1);
    assert_eq!(volume(&s, "uid-p", "d").out_of_band_changes, 1);
    assert!(s
        .pods
        .iter()
        .flat_map(|p| &p.volumes)
        .all(|v| v.state == "mounted"));

    // The text status prints the transitions.
    let out = Command::new(support::volmgr_bin())
        .args(["status", "--root"])
        .arg(&env.root)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("tracer: {tracer}")), "{text}");
    assert!(text.contains("out-of-band changes"), "{text}");
    assert!(text.contains("lost pod uid-p volume m"), "{text}");
    assert!(
        text.contains("foreign_mount pod uid-p volume keep"),
        "{text}"
    );
    assert!(agent.is_alive());
    assert!(agent.term(), "agent exits 0 on SIGTERM");
}

#[test]
fn mountinfo_tracer_repairs_out_of_band_changes() {
    isolated("mountinfo_tracer_repairs_out_of_band_changes", || {
        out_of_band_cycle("mountinfo");
    });
}

#[test]
fn ebpf_tracer_repairs_out_of_band_changes() {
    if let Some(why) = ebpf_unavailable() {
        eprintln!("SKIP ebpf_tracer_repairs_out_of_band_changes: eBPF tracer not loadable: {why}");
        return;
    }
    isolated("ebpf_tracer_repairs_out_of_band_changes", || {
        out_of_band_cycle("ebpf");
    });
}

#[test]
fn status_reports_the_chosen_tracer() {
    isolated("status_reports_the_chosen_tracer", || {
        let env = Env::new();
        let agent = env.start_agent(&["--tracer", "off"]);
        let s = env.status();
        assert_eq!(s.tracer, "off");
        assert!(s.tracer_reason.contains("resync"), "{}", s.tracer_reason);
        assert!(agent.term());
        // auto: the eBPF program loads in the background (status says so),
        // then the final choice shows.
        let agent = env.start_agent(&[]);
        env.wait_for("the eBPF tracer loaded or given up", || {
            !env.status()
                .tracer_reason
                .contains("the eBPF tracer is loading")
        });
        let s = env.status();
        assert!(
            s.tracer == "ebpf" || s.tracer == "mountinfo",
            "auto picks a tracer: {s:?}"
        );
        assert!(s.tracer_reason.starts_with("auto: "), "{}", s.tracer_reason);
        if s.tracer == "mountinfo" {
            assert!(
                s.tracer_reason.contains("eBPF unavailable"),
                "the fallback says why: {}",
                s.tracer_reason
            );
        }
        assert!(agent.term());
        let agent = env.start_agent(&["--tracer", "mountinfo"]);
        assert_eq!(env.status().tracer, "mountinfo");
        assert!(agent.term());
    });
}

#[test]
fn unknown_tracer_is_a_usage_error() {
    let env = Env::new();
    let out = Command::new(support::volmgr_bin())
        .args(["agent", "--tracer", "bogus", "--root"])
        .arg(&env.root)
        .arg("--manifests")
        .arg(&env.manifests)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown tracer \"bogus\""), "{err}");
}

/// Without the privileges eBPF needs (the agent run as `nobody` through
/// util-linux `setpriv`): `--tracer ebpf` is a start-up error that says why,
/// and `auto` falls back to the mountinfo poller and says why in status.
#[test]
fn without_bpf_privileges_ebpf_fails_and_auto_falls_back() {
    isolated(
        "without_bpf_privileges_ebpf_fails_and_auto_falls_back",
        || {
            if Command::new("setpriv").arg("--version").output().is_err() {
                println!("SKIP: util-linux setpriv is not installed");
                return;
            }
            let env = Env::new();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755))
                .unwrap();
            let nobody = nix::unistd::Uid::from_raw(65534);
            let nogroup = nix::unistd::Gid::from_raw(65534);
            for d in [&env.root, &env.manifests] {
                nix::unistd::chown(d.as_path(), Some(nobody), Some(nogroup)).unwrap();
            }
            let agent = |tracer: &str| {
                let mut cmd = Command::new("setpriv");
                cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                    .arg(support::volmgr_bin())
                    .args(["agent", "--tracer", tracer, "--root"])
                    .arg(&env.root)
                    .arg("--manifests")
                    .arg(&env.manifests);
                cmd
            };
            let out = agent("ebpf").output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{err}");
            assert!(
                err.contains("--tracer ebpf: the eBPF tracer cannot be loaded"),
                "{err}"
            );
            // Ended however the test ends: a live agent would keep the
            // test's output pipe open and the harness waiting.
            struct Killed(std::process::Child);
            impl Drop for Killed {
                fn drop(&mut self) {
                    let _ = self.0.kill();
                    let _ = self.0.wait();
                }
            }
            let _child = Killed(
                agent("auto")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            // Asked as nobody too: root's client refuses a socket another
            // user serves (it could say anything).
            let status = || -> Option<volmgr::status::Status> {
                let out = Command::new("setpriv")
                    .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                    .arg(support::volmgr_bin())
                    .args(["status", "--json", "--root"])
                    .arg(&env.root)
                    .output()
                    .unwrap();
                serde_json::from_slice(&out.stdout).ok()
            };
            env.wait_for("the eBPF tracer given up", || {
                status().is_some_and(|s| !s.tracer_reason.contains("the eBPF tracer is loading"))
            });
            let s = status().unwrap();
            assert_eq!(s.tracer, "mountinfo", "{}", s.tracer_reason);
            assert!(
                s.tracer_reason.starts_with("auto: eBPF unavailable ("),
                "{}",
                s.tracer_reason
            );
        },
    );
}
