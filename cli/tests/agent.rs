//! End-to-end tests of `volmgr agent` with real mounts, each in a private
//! mount namespace of its own (see `support::isolated`).

mod support;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use support::{isolated, isolated_with, pod_yaml, Env};
use volmgr::sys::Mounter;

const MEM: &str = "emptyDir: {medium: Memory}";

fn mem_sized(size: &str) -> String {
    format!("emptyDir: {{medium: Memory, sizeLimit: {size}}}")
}

#[test]
fn add_update_remove_pods() {
    isolated("add_update_remove_pods", || {
        let env = Env::new();
        env.write_manifest(
            "a.yaml",
            &pod_yaml("a", "uid-a", &[("m", MEM), ("d", "emptyDir: {}")]),
        );
        env.write_manifest("b.yaml", &pod_yaml("b", "uid-b", &[("m", MEM)]));
        let agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-a", 30.0), 0);
        assert_eq!(env.wait_pod("uid-b", 30.0), 0);
        let am = env.empty_dir("uid-a", "m");
        assert_eq!(env.mount_count(&am), 1);
        assert_eq!(
            env.mounts()
                .iter()
                .find(|m| m.mount_point == am)
                .unwrap()
                .fstype,
            "tmpfs"
        );
        assert!(env.empty_dir("uid-a", "d").is_dir());
        assert_eq!(
            env.mount_count(&env.empty_dir("uid-a", "d")),
            0,
            "disk emptyDir is a plain directory"
        );
        std::fs::write(am.join("data"), b"keep").unwrap();

        // Update: a volume added and one removed.
        env.write_manifest("a.yaml", &pod_yaml("a", "uid-a", &[("m", MEM), ("n", MEM)]));
        env.wait_for("new volume n mounted", || {
            env.mount_count(&env.empty_dir("uid-a", "n")) == 1
        });
        env.wait_for("removed volume d deleted", || {
            !env.empty_dir("uid-a", "d").exists()
        });
        assert_eq!(
            std::fs::read(am.join("data")).unwrap(),
            b"keep",
            "untouched volume keeps its data"
        );

        // Remove pod b: its tmpfs is unmounted and its directory removed.
        env.remove_manifest("b.yaml");
        env.wait_for("pod b torn down", || !env.root.join("pods/uid-b").exists());
        assert_eq!(env.mount_count(&env.empty_dir("uid-b", "m")), 0);
        assert_eq!(env.mount_count(&am), 1);
        assert!(env.status().pods.iter().all(|p| p.uid != "uid-b"));
        assert!(agent.term(), "agent exits 0 on SIGTERM");
        // SIGTERM leaves mounts in place.
        assert_eq!(env.mount_count(&am), 1);
    });
}

#[test]
fn tmpfs_is_sized_by_size_limit() {
    isolated("tmpfs_is_sized_by_size_limit", || {
        let env = Env::new();
        env.write_manifest(
            "p.yaml",
            &pod_yaml(
                "p",
                "uid-p",
                &[("small", &mem_sized("3Mi")), ("big", &mem_sized("1Gi"))],
            ),
        );
        let _agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-p", 30.0), 0);
        let small = env.empty_dir("uid-p", "small");
        let m = env
            .mounts()
            .into_iter()
            .find(|m| m.mount_point == small)
            .unwrap();
        assert_eq!(m.super_option("size"), Some("3072k"));
        let big = env
            .mounts()
            .into_iter()
            .find(|m| m.mount_point == env.empty_dir("uid-p", "big"))
            .unwrap();
        assert_eq!(big.super_option("size"), Some("1048576k"));
        // The limit is real: writing 4 MiB into 3 MiB fails with ENOSPC.
        let mut f = std::fs::File::create(small.join("fill")).unwrap();
        let chunk = vec![0u8; 1 << 20];
        let err = (0..4).try_for_each(|_| f.write_all(&chunk)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    });
}

#[test]
fn host_path_types() {
    isolated("host_path_types", || {
        let env = Env::new();
        let h = env.dir.path().join("host");
        std::fs::create_dir_all(h.join("dir")).unwrap();
        std::fs::write(h.join("file"), b"x").unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(h.join("sock")).unwrap();
        let hp =
            |p: &Path, t: &str| format!("hostPath: {{path: \"{}\", type: \"{t}\"}}", p.display());
        let ok = [
            ("unset", hp(&h.join("nothing-here"), "")),
            ("dir", hp(&h.join("dir"), "Directory")),
            ("dir-create", hp(&h.join("made/deep"), "DirectoryOrCreate")),
            ("file", hp(&h.join("file"), "File")),
            ("file-create", hp(&h.join("made-file"), "FileOrCreate")),
            ("sock", hp(&h.join("sock"), "Socket")),
            ("chr", hp(Path::new("/dev/null"), "CharDevice")),
        ];
        let bad = [
            ("not-dir", hp(&h.join("file"), "Directory")),
            ("not-file", hp(&h.join("dir"), "File")),
            ("missing", hp(&h.join("missing"), "Directory")),
            ("not-sock", hp(&h.join("file"), "Socket")),
            ("not-blk", hp(Path::new("/dev/null"), "BlockDevice")),
            ("no-parent", hp(&h.join("no/parent/file"), "FileOrCreate")),
        ];
        let okv: Vec<(&str, &str)> = ok.iter().map(|(n, s)| (*n, s.as_str())).collect();
        let badv: Vec<(&str, &str)> = bad.iter().map(|(n, s)| (*n, s.as_str())).collect();
        env.write_manifest("ok.yaml", &pod_yaml("ok", "uid-ok", &okv));
        env.write_manifest("bad.yaml", &pod_yaml("bad", "uid-bad", &badv));
        let _agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-ok", 30.0), 0);
        assert!(h.join("made/deep").is_dir());
        assert!(h.join("made-file").is_file());
        assert!(
            !h.join("nothing-here").exists(),
            "type \"\" creates nothing"
        );
        for (name, _) in &bad {
            env.wait_for(name, || {
                env.volume_state("uid-bad", name)
                    .is_some_and(|s| s.0 == "error")
            });
            let (_, attempts, error) = env.volume_state("uid-bad", name).unwrap();
            assert!(attempts >= 1);
            assert!(
                error.unwrap().contains("hostPath type check failed"),
                "{name}"
            );
        }
        assert!(!h.join("no/parent").exists());
        assert_eq!(
            env.wait_pod("uid-bad", 0.3),
            1,
            "wait times out for a pod with failing volumes"
        );
        // Fixing the host makes the retry succeed.
        std::fs::create_dir_all(h.join("missing")).unwrap();
        env.wait_for("missing dir found on retry", || {
            env.volume_state("uid-bad", "missing")
                .is_some_and(|s| s.0 == "mounted")
        });
    });
}

#[test]
fn failing_mount_backs_off_then_recovers() {
    isolated("failing_mount_backs_off_then_recovers", || {
        let env = Env::new();
        // A regular file where the volume directory must go: mkdir fails for real.
        let blocker = env.root.join("pods/uid-f/volumes/kubernetes.io~empty-dir");
        std::fs::create_dir_all(blocker.parent().unwrap()).unwrap();
        std::fs::write(&blocker, b"in the way").unwrap();
        env.write_manifest("f.yaml", &pod_yaml("f", "uid-f", &[("m", MEM)]));
        let _agent = env.start_agent(&["--backoff-initial", "200ms", "--backoff-max", "10s"]);
        env.wait_for("error state", || {
            env.volume_state("uid-f", "m")
                .is_some_and(|s| s.0 == "error")
        });
        std::thread::sleep(Duration::from_millis(1500));
        let (_, attempts, error) = env.volume_state("uid-f", "m").unwrap();
        assert!(error.unwrap().contains("kubernetes.io~empty-dir"));
        // Retries at about 0, 0.2, 0.6, 1.4 s: a few attempts, not a hot loop.
        assert!((2..=6).contains(&attempts), "attempts = {attempts}");
        std::fs::remove_file(&blocker).unwrap();
        env.wait_for("mounted after the cause is gone", || {
            env.mount_count(&env.empty_dir("uid-f", "m")) == 1
        });
        let (state, attempts2, error) = env.volume_state("uid-f", "m").unwrap();
        assert_eq!(state, "mounted");
        assert!(attempts2 > attempts);
        assert_eq!(error, None);
    });
}

#[test]
fn out_of_band_unmount_is_repaired_by_resync() {
    isolated("out_of_band_unmount_is_repaired_by_resync", || {
        let env = Env::new();
        env.write_manifest("p.yaml", &pod_yaml("p", "uid-p", &[("m", MEM)]));
        // No tracer: the resync is the only thing that can notice.
        let agent = env.start_agent(&["--resync-period", "500ms", "--tracer", "off"]);
        assert_eq!(env.wait_pod("uid-p", 30.0), 0);
        let path = env.empty_dir("uid-p", "m");
        // Twice, the second time after resyncs that found the mount table
        // unchanged (and so did not read it): the kernel's change signal
        // is what brings the next read.
        let count = |what: &str| agent.log().matches(what).count();
        for round in 0..2 {
            let unchanged = || count("resync: mount table unchanged");
            let before = unchanged();
            env.wait_for("two idle resyncs", || unchanged() >= before + 2);
            std::fs::write(path.join("marker"), b"old tmpfs").unwrap();
            // Another process unmounts it (util-linux umount).
            let st = std::process::Command::new("umount")
                .arg(&path)
                .status()
                .unwrap();
            assert!(st.success());
            assert_eq!(env.mount_count(&path), 0);
            env.wait_for("volume mounted again", || env.mount_count(&path) == 1);
            assert!(
                !path.join("marker").exists(),
                "round {round}: it is a new, empty tmpfs"
            );
            env.wait_for("status mounted", || {
                env.volume_state("uid-p", "m")
                    .is_some_and(|s| s.0 == "mounted")
            });
        }
        // After the second repair the table changed, but the new tmpfs's
        // unique mount id is known and listed: the resync trusts it
        // without reading the table (kernels with listmount(2), 6.8+).
        if volmgr::sys::linux::LinuxMounter
            .mount_ids()
            .ok()
            .flatten()
            .is_some()
        {
            env.wait_for("a resync by mount ids", || {
                count("resync: every mount id listed") >= 1
            });
        }
    });
}

#[test]
fn restart_adopts_mounts_without_remounting() {
    isolated("restart_adopts_mounts_without_remounting", || {
        let env = Env::new();
        env.write_manifest(
            "p.yaml",
            &pod_yaml("p", "uid-p", &[("m", MEM), ("d", "emptyDir: {}")]),
        );
        env.write_manifest("q.yaml", &pod_yaml("q", "uid-q", &[("m", MEM)]));
        let agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-p", 30.0), 0);
        assert_eq!(env.wait_pod("uid-q", 30.0), 0);
        let p = env.empty_dir("uid-p", "m");
        let id = env
            .mounts()
            .into_iter()
            .find(|m| m.mount_point == p)
            .unwrap()
            .mount_id;
        std::fs::write(p.join("state"), b"survives").unwrap();
        assert!(agent.term());
        // While it is down, pod q goes away.
        env.remove_manifest("q.yaml");
        let _agent = env.start_agent(&[]);
        env.wait_synced();
        assert_eq!(env.wait_pod("uid-p", 30.0), 0);
        let id2 = env
            .mounts()
            .into_iter()
            .find(|m| m.mount_point == p)
            .unwrap()
            .mount_id;
        assert_eq!(id, id2, "adopted, not remounted");
        assert_eq!(env.mount_count(&p), 1);
        assert_eq!(std::fs::read(p.join("state")).unwrap(), b"survives");
        env.wait_for("pod q cleaned up after restart", || {
            !env.root.join("pods/uid-q").exists()
        });
        assert_eq!(env.mount_count(&env.empty_dir("uid-q", "m")), 0);
    });
}

/// Every desired volume mounted exactly once, nothing else mounted or left.
fn assert_converged(env: &Env, pods: &[String]) {
    for uid in pods {
        assert_eq!(env.wait_pod(uid, 60.0), 0, "pod {uid}");
        assert_eq!(
            env.mount_count(&env.empty_dir(uid, "m")),
            1,
            "pod {uid} mounted once"
        );
    }
    // Pods that went away are cleaned up after the desired ones are
    // mounted (orphaned directories once the sources are populated): wait
    // for that, a leak still fails below when the wait gives up.
    let pod_dirs = || {
        std::fs::read_dir(env.root.join("pods"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    env.wait_for("the volumes and directories of removed pods gone", || {
        env.mounts().len() == pods.len() && pod_dirs() == pods.len()
    });
    let mounts = env.mounts();
    assert_eq!(mounts.len(), pods.len(), "no extra mounts: {mounts:?}");
    assert_eq!(pod_dirs(), pods.len(), "no leaked pod directories");
}

#[test]
fn kill9_at_failpoints_then_restart_converges() {
    isolated("kill9_at_failpoints_then_restart_converges", || {
        let env = Env::new();
        let pods: Vec<String> = (0..5).map(|i| format!("uid-{i}")).collect();
        for (i, uid) in pods.iter().enumerate() {
            env.write_manifest(
                &format!("p{i}.yaml"),
                &pod_yaml(&format!("p{i}"), uid, &[("m", MEM)]),
            );
        }
        // Crash right after a mount, before the ready marker (uncertain on restart).
        let a = env.start_agent_env(&[], &[("VOLMGR_FAILPOINTS", "emptydir.after_mount")]);
        assert!(!a.wait_exit().success());
        assert!(!env.mounts().is_empty());
        // Crash at the end of a set-up, before it is recorded.
        let a = env.start_agent_env(&[], &[("VOLMGR_FAILPOINTS", "emptydir.after_setup")]);
        assert!(!a.wait_exit().success());
        let agent = env.start_agent(&[]);
        assert_converged(&env, &pods);
        assert!(agent.term());
        // Crash in the middle of a teardown: after the unmount, before the cleanup.
        env.remove_manifest("p0.yaml");
        env.remove_manifest("p1.yaml");
        let a = env.start_agent_env(&[], &[("VOLMGR_FAILPOINTS", "emptydir.after_unmount")]);
        assert!(!a.wait_exit().success());
        let _agent = env.start_agent(&[]);
        assert_converged(&env, &pods[2..]);
    });
}

#[test]
fn kill9_at_random_moments_then_restart_converges() {
    isolated("kill9_at_random_moments_then_restart_converges", || {
        let env = Env::new();
        let n = 40;
        let all: Vec<String> = (0..n).map(|i| format!("uid-{i}")).collect();
        for (i, uid) in all.iter().enumerate() {
            env.write_manifest(
                &format!("p{i}.yaml"),
                &pod_yaml(&format!("p{i}"), uid, &[("m", MEM)]),
            );
        }
        // Kill during start-up at increasing delays, and during teardown.
        for (round, delay_ms) in [0u64, 2, 5, 10, 20, 40].into_iter().enumerate() {
            let a = env.start_agent(&[]);
            std::thread::sleep(Duration::from_millis(delay_ms));
            a.kill9();
            if round == 3 {
                // Half the pods go away while the agent is (re)starting.
                for i in 0..n / 2 {
                    env.remove_manifest(&format!("p{i}.yaml"));
                }
            }
        }
        let agent = env.start_agent(&[]);
        assert_converged(&env, &all[n / 2..]);
        assert!(agent.term());
    });
}

#[test]
fn bad_input_harms_only_its_own_pod() {
    isolated("bad_input_harms_only_its_own_pod", || {
        let env = Env::new();
        env.write_manifest("good.yaml", &pod_yaml("good", "uid-good", &[("m", MEM)]));
        env.write_manifest(
            "broken.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: [oops\n",
        );
        env.write_manifest(
            "dup.yaml",
            &pod_yaml("dup", "uid-dup", &[("x", MEM), ("x", "emptyDir: {}")]),
        );
        env.write_manifest(
            "uid.yaml",
            &pod_yaml("baduid", "../../outside", &[("m", MEM)]),
        );
        env.write_manifest("nul.json", "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"n\",\"uid\":\"a\\u0000b\"},\"spec\":{\"containers\":[]}}");
        env.write_manifest(
            "vols.yaml",
            &pod_yaml(
                "vols",
                "uid-vols",
                &[
                    ("../escape", MEM),
                    ("rel", "hostPath: {path: var/log}"),
                    ("cm", "configMap: {name: x}"),
                    ("ok", MEM),
                ],
            ),
        );
        // A symlink planted in a pod's directory, pointing outside ROOT.
        std::fs::create_dir_all(env.root.join("pods/uid-link/volumes")).unwrap();
        std::os::unix::fs::symlink(
            &env.outside,
            env.root
                .join("pods/uid-link/volumes/kubernetes.io~empty-dir"),
        )
        .unwrap();
        env.write_manifest("link.yaml", &pod_yaml("link", "uid-link", &[("m", MEM)]));

        let mut agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-good", 30.0), 0);
        env.wait_for("vols/ok mounted", || {
            env.volume_state("uid-vols", "ok")
                .is_some_and(|s| s.0 == "mounted")
        });
        env.wait_for("symlinked pod errors", || {
            env.volume_state("uid-link", "m")
                .is_some_and(|s| s.0 == "error")
        });
        let s = env.status();
        let err_of = |name: &str| {
            s.pods
                .iter()
                .find(|p| p.name == name)
                .and_then(|p| p.error.clone())
                .unwrap_or_default()
        };
        assert!(
            s.errors
                .iter()
                .any(|e| e.source.ends_with("broken.yaml") && e.error.contains("invalid YAML")),
            "{:?}",
            s.errors
        );
        assert!(err_of("dup").contains("duplicate volume name"));
        assert!(err_of("baduid").contains("invalid pod UID"));
        assert!(err_of("n").contains("invalid pod UID"));
        let vols = s.pods.iter().find(|p| p.uid == "uid-vols").unwrap();
        let verr = |n: &str| vols.volumes.iter().find(|v| v.name == n).unwrap().clone();
        assert!(verr("../escape")
            .error
            .unwrap()
            .contains("invalid volume name"));
        assert!(verr("rel").error.unwrap().contains("must be absolute"));
        assert!(verr("cm")
            .error
            .unwrap()
            .contains("ConfigMap test/x not found"));
        assert_eq!(verr("cm").state, "error");
        let link = env.volume_state("uid-link", "m").unwrap();
        assert!(link.2.unwrap().contains("refusing to follow a symlink"));
        env.assert_outside_untouched();
        assert!(!env.dir.path().join("outside/m").exists());
        assert!(agent.is_alive());
        // Only the good volumes are mounted.
        assert_eq!(env.mounts().len(), 2);
        // Fixing the broken file clears its error.
        env.write_manifest(
            "broken.yaml",
            &pod_yaml("fixed", "uid-fixed", &[("m", MEM)]),
        );
        assert_eq!(env.wait_pod("uid-fixed", 30.0), 0);
        // (Start-up reconstruction problems, e.g. the symlinked volumes
        // directory of uid-link, stay listed under their own source.)
        let errors: Vec<_> = env
            .status()
            .errors
            .into_iter()
            .filter(|e| e.source != "reconstruction")
            .collect();
        assert!(errors.is_empty(), "{errors:?}");
    });
}

#[test]
fn metrics_endpoint_uses_kubelet_names() {
    isolated("metrics_endpoint_uses_kubelet_names", || {
        use std::io::Read;
        let env = Env::new();
        env.write_manifest("p.yaml", &pod_yaml("p", "uid-p", &[("m", MEM)]));
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let addr = format!("127.0.0.1:{port}");
        let _agent = env.start_agent(&["--metrics-addr", &addr]);
        assert_eq!(env.wait_pod("uid-p", 30.0), 0);
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK"));
        assert!(body.contains("storage_operation_duration_seconds_count{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\"} 1"), "{body}");
        assert!(body.contains("volume_manager_total_volumes{plugin_name=\"kubernetes.io/empty-dir\",state=\"actual_state_of_world\"} 1"));
        let st = env.status();
        assert!(st
            .operations
            .iter()
            .any(|o| o.operation == "volume_mount" && o.count == 1 && o.p99_seconds > 0.0));
    });
}

#[test]
fn second_agent_on_same_root_is_refused() {
    isolated("second_agent_on_same_root_is_refused", || {
        let env = Env::new();
        let _a = env.start_agent(&[]);
        env.wait_synced();
        let b = env.start_agent(&[]);
        let log_path = b.log.clone();
        let st = b.wait_exit();
        assert!(!st.success());
        let log = std::fs::read_to_string(log_path).unwrap();
        assert!(log.contains("another volmgr agent is running"), "{log}");
        // The first one still answers.
        assert!(env.status().synced);
    });
}

/// A SIGTERM the moment the status socket appears (the agent still
/// starting: metrics bound, the manager starting) stops the agent cleanly,
/// exit 0 and the socket removed. Before, the handlers were installed only
/// once the agent had started: a SIGTERM in between killed it by the
/// default action (seen under load in `observe_hardening.rs`).
#[test]
fn sigterm_while_starting_stops_cleanly() {
    isolated("sigterm_while_starting_stops_cleanly", || {
        let env = Env::new();
        for i in 0..20 {
            env.write_manifest(
                &format!("p{i}.yaml"),
                &pod_yaml(&format!("p{i}"), &format!("uid-p{i}"), &[("m", MEM)]),
            );
        }
        let sock = env.root.join("volmgr.sock");
        for round in 0..3 {
            let mut agent = env.start_agent(&[]);
            while std::fs::symlink_metadata(&sock).is_err() {
                assert!(agent.is_alive(), "round {round}: {}", agent.log());
                std::thread::sleep(Duration::from_micros(200));
            }
            let log = agent.log.clone();
            assert!(
                agent.term(),
                "round {round}: not a clean stop: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            assert!(!sock.exists(), "round {round}: the socket is left behind");
        }
    });
}

/// The adversarial run's attack on a running pod: a host directory
/// bind-mounted over `ROOT/pods/<uid>/volumes/kubernetes.io~empty-dir` of a
/// disk-backed emptyDir, then the pod deleted. The tear-down fails naming
/// the mount (the volume shows the error, the pod's directory is kept), no
/// file of the host directory is touched, and the other pod goes on.
#[test]
fn foreign_mount_under_a_pod_is_never_crossed_on_delete() {
    isolated(
        "foreign_mount_under_a_pod_is_never_crossed_on_delete",
        || foreign_mount_under_a_pod(false),
    );
}

/// The same where `openat2` fails with `ENOSYS` (kernels before 5.6,
/// valgrind): the agent starts, reconstructs and resolves every path with
/// the fallback walk, under the same mount rule.
#[test]
fn foreign_mount_under_a_pod_is_never_crossed_without_openat2() {
    isolated_with(
        "foreign_mount_under_a_pod_is_never_crossed_without_openat2",
        true,
        || foreign_mount_under_a_pod(true),
    );
}

// The body of the two tests above.
#[allow(clippy::unwrap_used)]
fn foreign_mount_under_a_pod(no_openat2: bool) {
    let env = Env::new();
    let disk = "emptyDir: {}";
    env.write_manifest("a.yaml", &pod_yaml("a", "uid-a", &[("d", disk)]));
    env.write_manifest(
        "b.yaml",
        &pod_yaml("b", "uid-b", &[("d", disk), ("m", MEM)]),
    );
    let mut agent = env.start_agent(&[]);
    assert_eq!(env.wait_pod("uid-a", 30.0), 0);
    assert_eq!(env.wait_pod("uid-b", 30.0), 0);
    std::fs::write(env.empty_dir("uid-a", "d").join("pod-data"), b"x").unwrap();
    let host = env.dir.path().join("host");
    std::fs::create_dir_all(host.join("d")).unwrap();
    for f in ["f1", "f2", "f3"] {
        std::fs::write(host.join("d").join(f), f).unwrap();
    }
    let plugin_dir = env.root.join("pods/uid-a/volumes/kubernetes.io~empty-dir");
    nix::mount::mount(
        Some(&host),
        &plugin_dir,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    env.remove_manifest("a.yaml");
    env.remove_manifest("b.yaml");
    env.wait_for("pod b torn down", || !env.root.join("pods/uid-b").exists());
    env.wait_for("pod a's volume in error", || {
        env.volume_state("uid-a", "d")
            .is_some_and(|s| s.2.is_some_and(|e| e.contains("foreign mount")))
    });
    let (_, _, err) = env.volume_state("uid-a", "d").unwrap();
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains(&*plugin_dir.to_string_lossy())),
        "{err:?}"
    );
    for f in ["f1", "f2", "f3"] {
        assert_eq!(std::fs::read(host.join("d").join(f)).unwrap(), f.as_bytes());
    }
    assert!(env.root.join("pods/uid-a").is_dir());
    assert!(agent.is_alive());
    // Once the foreign mount is gone, the pod is cleaned up.
    nix::mount::umount2(&plugin_dir, nix::mount::MntFlags::empty()).unwrap();
    env.wait_for("pod a torn down", || !env.root.join("pods/uid-a").exists());
    assert_eq!(std::fs::read_dir(host.join("d")).unwrap().count(), 3);
    assert!(env.mounts().is_empty());
    assert_eq!(
        agent.log().contains("openat2 is not available"),
        support::runs_as_older_kernel(no_openat2),
        "{}",
        agent.log()
    );
    assert!(agent.term());
    // A restart reconstructs (the start-up that failed with ENOSYS).
    env.write_manifest("c.yaml", &pod_yaml("c", "uid-c", &[("d", disk)]));
    let agent = env.start_agent(&[]);
    assert_eq!(env.wait_pod("uid-c", 30.0), 0);
    assert!(agent.term());
    let again = env.start_agent(&[]);
    env.wait_synced();
    assert_eq!(env.volume_state("uid-c", "d").unwrap().0, "mounted");
    assert!(again.term());
}

/// `volmgr --version` names the program users run, not its crate (it
/// printed `volmgr-cli 0.1.0`).
#[test]
fn version_names_the_program() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_volmgr"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, format!("volmgr {}\n", env!("CARGO_PKG_VERSION")));
}
