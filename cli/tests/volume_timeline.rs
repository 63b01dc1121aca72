//! Per-volume timelines and stuck syscalls, end to end, with the real
//! agent and its eBPF tracer in a private mount namespace:
//!
//! - another process (util-linux `mount`/`umount`, not the agent) mounts
//!   and unmounts under a pod's volume path; `volmgr doctor --pod` shows
//!   both calls in order with the process, its pid, the duration and the
//!   result, `--svg` draws them, and the latency histogram has the volume's
//!   driver;
//! - a `statfs` on a FUSE mount whose daemon (written here, on raw
//!   `/dev/fuse`) answered INIT and then stopped answering is reported as
//!   stuck while it is blocked (status, doctor, metrics, the log once),
//!   and is released at the end by closing the daemon's descriptor (which
//!   aborts the connection).
//! - the test CSI driver stages a volume: the `mkfs.ext4` it runs on the
//!   loop device (a device, not a volume path) is in the staging
//!   timeline, with its command line, exit status and duration, before
//!   the mount of that device; an `e2fsck` of the staged device run by
//!   another process is placed there too, with its exit status.
//!
//! Needs root and BPF; skips with the reason otherwise (CI is root).

// Test code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

use support::{isolated, pod_yaml, volmgr_bin, Env};
use volmgr::tracer::timeline::PodTimeline;

/// Why the eBPF tracer cannot run here, if it cannot.
fn ebpf_unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root".into());
    }
    match volmgr::ebpf::EbpfTracer::load(volmgr::ebpf::TraceFilter { mnt_ns: None }) {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// `volmgr doctor --pod POD --json` (and `--svg` when given): the
/// timelines and the exit code.
fn doctor(env: &Env, pod: &str, svg: Option<&Path>) -> (PodTimeline, i32) {
    let mut cmd = Command::new(volmgr_bin());
    cmd.args(["doctor", "--json", "--pod", pod, "--root"])
        .arg(&env.root);
    if let Some(f) = svg {
        cmd.arg("--svg").arg(f);
    }
    let out = cmd.output().unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 1,
        "doctor failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (serde_json::from_slice(&out.stdout).unwrap(), code)
}

fn start_ebpf_agent(env: &Env, extra: &[&str]) -> support::Agent {
    env.write_manifest(
        "p.yaml",
        &pod_yaml("web", "uid-web", &[("d", "emptyDir: {}")]),
    );
    let mut args = vec!["--tracer", "ebpf", "--resync-period", "1h"];
    args.extend_from_slice(extra);
    let agent = env.start_agent(&args);
    assert_eq!(env.wait_pod("uid-web", 60.0), 0, "log:\n{}", agent.log());
    assert_eq!(env.status().tracer, "ebpf");
    agent
}

#[test]
fn doctor_shows_another_process_mounting_under_a_pod_volume() {
    if let Some(why) = ebpf_unavailable() {
        eprintln!("SKIP doctor_shows_another_process_mounting_under_a_pod_volume: {why}");
        return;
    }
    isolated(
        "doctor_shows_another_process_mounting_under_a_pod_volume",
        || {
            let env = Env::new();
            let agent = start_ebpf_agent(&env, &[]);
            // A volume of a plugin the agent does not manage: only the tracer
            // looks at it.
            let dir = env.root.join("pods/uid-web/volumes/example.com~test/data");
            std::fs::create_dir_all(&dir).unwrap();
            let run = |cmd: &str, args: &[&str]| {
                let st = Command::new(cmd).args(args).arg(&dir).status().unwrap();
                assert!(st.success(), "{cmd} {args:?}");
            };
            run("mount", &["-t", "tmpfs", "timeline-test"]);
            run("umount", &[]);
            let mut t = PodTimeline::default();
            env.wait_for("both calls in the pod's timeline", || {
                t = doctor(&env, "test/web", None).0;
                t.volumes
                    .iter()
                    .any(|v| v.key.volume == "data" && v.entries.len() >= 2)
            });
            assert_eq!(t.pod, "test/web");
            assert_eq!(t.uid, "uid-web");
            let v = t.volumes.iter().find(|v| v.key.volume == "data").unwrap();
            assert_eq!(v.key.plugin, "example.com~test");
            assert_eq!(v.driver, "example.com/test");
            let calls: Vec<(&str, &str, &str)> = v
                .entries
                .iter()
                .map(|e| (e.comm.as_str(), e.call.as_str(), e.result.as_str()))
                .collect();
            assert_eq!(
                calls,
                vec![("mount", "mount", "ok"), ("umount", "umount2", "ok")],
                "{v:#?}"
            );
            let agent_pid = agent.child.id();
            for e in &v.entries {
                assert_ne!(e.pid, agent_pid, "another process's call: {e:?}");
                assert!(e.duration_ns > 0, "{e:?}");
                assert_eq!(Path::new(&e.path), dir);
            }
            assert!(v.entries[0].start_ns < v.entries[1].start_ns, "in order");
            assert_eq!(v.entries[0].fstype.as_deref(), Some("tmpfs"));

            // Text and SVG.
            let out = Command::new(volmgr_bin())
                .args(["doctor", "--pod", "test/web", "--root"])
                .arg(&env.root)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{text}");
            assert!(
                text.contains("volume example.com~test/data (driver example.com/test): 2 calls"),
                "{text}"
            );
            assert!(text.contains("mount target"), "{text}");
            let svg = env.dir.path().join("t.svg");
            doctor(&env, "test/web", Some(&svg));
            let drawn = std::fs::read_to_string(&svg).unwrap();
            assert_eq!(drawn.matches("<rect ").count(), 2, "{drawn}");

            let m = env.metrics_text();
            assert!(
            m.contains("volmgr_mount_syscall_duration_seconds_count{syscall=\"mount\",fstype=\"tmpfs\",result=\"ok\",driver=\"example.com/test\"} 1\n"),
            "{m}"
        );
            let (unknown, _) = (doctor_error(&env, "test/nope"), ());
            assert!(unknown.contains("no pod test/nope"), "{unknown}");
            drop(agent);
        },
    );
}

fn doctor_error(env: &Env, pod: &str) -> String {
    let out = Command::new(volmgr_bin())
        .args(["doctor", "--pod", pod, "--root"])
        .arg(&env.root)
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A FUSE file system on `target` served by a thread that answers INIT and
/// then stops answering; the returned descriptor is the connection (closing
/// it aborts the connection: every waiting request fails with ENOTCONN).
fn hung_fuse(target: &Path) -> OwnedFd {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .unwrap();
    let fd = dev.as_raw_fd();
    let data = format!("fd={fd},rootmode=40000,user_id=0,group_id=0");
    nix::mount::mount(
        Some("hung"),
        target,
        Some("fuse.hung"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .unwrap();
    let mut reader = dev.try_clone().unwrap();
    let mut writer = dev.try_clone().unwrap();
    let init = std::thread::spawn(move || {
        // struct fuse_in_header { u32 len, opcode; u64 unique, nodeid; u32 uid, gid, pid, padding }
        let mut buf = vec![0u8; 1 << 17];
        let n = reader.read(&mut buf).unwrap();
        assert!(n >= 40, "short FUSE request");
        let opcode = u32::from_ne_bytes(buf[4..8].try_into().unwrap());
        assert_eq!(opcode, 26, "FUSE_INIT first");
        let unique = u64::from_ne_bytes(buf[8..16].try_into().unwrap());
        // struct fuse_out_header { u32 len; i32 error; u64 unique } and
        // struct fuse_init_out (64 bytes): major 7, minor 31, max_write 4096.
        let mut out = Vec::with_capacity(80);
        out.extend_from_slice(&80u32.to_ne_bytes());
        out.extend_from_slice(&0i32.to_ne_bytes());
        out.extend_from_slice(&unique.to_ne_bytes());
        let mut init_out = [0u8; 64];
        init_out[0..4].copy_from_slice(&7u32.to_ne_bytes());
        init_out[4..8].copy_from_slice(&31u32.to_ne_bytes());
        init_out[20..24].copy_from_slice(&4096u32.to_ne_bytes()); // max_write
        init_out[24..28].copy_from_slice(&1u32.to_ne_bytes()); // time_gran
        out.extend_from_slice(&init_out);
        writer.write_all(&out).unwrap();
        // Then: no more answers.
    });
    init.join().unwrap();
    OwnedFd::from(dev)
}

#[test]
fn a_statfs_blocked_on_a_hung_fuse_mount_is_reported_while_stuck() {
    if let Some(why) = ebpf_unavailable() {
        eprintln!("SKIP a_statfs_blocked_on_a_hung_fuse_mount_is_reported_while_stuck: {why}");
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        eprintln!(
            "SKIP a_statfs_blocked_on_a_hung_fuse_mount_is_reported_while_stuck: no /dev/fuse"
        );
        return;
    }
    isolated(
        "a_statfs_blocked_on_a_hung_fuse_mount_is_reported_while_stuck",
        || {
            let env = Env::new();
            let agent = start_ebpf_agent(&env, &["--stuck-syscall-after", "1s"]);
            let target = env.root.join("pods/uid-web/volumes/example.com~fuse/data");
            std::fs::create_dir_all(&target).unwrap();
            let conn = hung_fuse(&target);
            // `stat -f` is statfs(2): it waits for an answer that never comes.
            let mut child = Command::new("stat")
                .arg("-f")
                .arg(&target)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let path = target.to_str().unwrap().to_string();
            let mut stuck = None;
            env.wait_for("the blocked statfs reported as stuck", || {
                stuck = env
                    .status()
                    .stuck_syscalls
                    .into_iter()
                    .find(|s| s.call == "statfs" && s.path == path);
                stuck.is_some()
            });
            let s = stuck.unwrap();
            assert_eq!(s.pid, child.id());
            assert_eq!(s.comm, "stat");
            assert_eq!(s.fstype, "fuse.hung");
            assert!(s.elapsed_seconds >= 1.0, "{s:?}");
            assert_eq!(s.pod_uid.as_deref(), Some("uid-web"));
            assert_eq!(s.volume.as_deref(), Some("data"));
            assert!(!s.kernel_stack.is_empty(), "{s:?}");
            assert!(
                s.kernel_stack.iter().any(|f| f.contains("fuse")),
                "the task waits in FUSE: {:?}",
                s.kernel_stack
            );
            let (t, code) = doctor(&env, "test/web", None);
            assert_eq!(code, 1, "doctor exits 1 on a stuck call");
            assert!(t.stuck.iter().any(|x| x.tid == s.tid), "{t:?}");
            let m = env.metrics_text();
            // At least ours: the tracer sees every process, and a test
            // running beside this one may have a slow call of its own.
            let stuck_now: u64 = m
                .lines()
                .find_map(|l| l.strip_prefix("volmgr_mount_syscalls_stuck "))
                .unwrap()
                .parse()
                .unwrap();
            assert!(stuck_now >= 1, "{m}");
            let oldest: f64 = m
                .lines()
                .find_map(|l| l.strip_prefix("volmgr_mount_syscall_oldest_in_flight_seconds "))
                .unwrap()
                .parse()
                .unwrap();
            assert!(oldest >= 1.0, "{m}");
            let status_text = Command::new(volmgr_bin())
                .args(["status", "--root"])
                .arg(&env.root)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&status_text.stdout);
            assert!(text.contains(&format!("statfs({path}) by stat[")), "{text}");

            // Released: the connection aborted, the call returns.
            drop(conn);
            let st = child.wait().unwrap();
            assert!(!st.success(), "statfs on an aborted connection fails");
            env.wait_for("the call no longer stuck", || {
                !env.status().stuck_syscalls.iter().any(|s| s.path == path)
            });
            // Once for this call (another process's call may be logged too).
            let logged = agent
                .log()
                .lines()
                .filter(|l| l.contains("syscall stuck in the kernel") && l.contains(&path))
                .count();
            assert_eq!(logged, 1, "logged once:\n{}", agent.log());
            nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH).unwrap();
            drop(agent);
        },
    );
}

#[test]
fn a_file_system_tool_that_hangs_is_reported_while_it_runs() {
    let name = "a_file_system_tool_that_hangs_is_reported_while_it_runs";
    if let Some(why) = ebpf_unavailable() {
        eprintln!("SKIP {name}: {why}");
        return;
    }
    isolated(name, || {
        let env = Env::new();
        let agent = start_ebpf_agent(&env, &["--stuck-tool-after", "1s"]);
        // A tool by its command name (the script's file name), working on
        // the pod's volume, that waits for a child that never ends.
        let tool = env.dir.path().join("fsck.hung");
        std::fs::write(&tool, "#!/bin/sh\nsleep 3600 &\nwait\n").unwrap();
        std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let volume = env
            .root
            .join("pods/uid-web/volumes/kubernetes.io~empty-dir/d");
        // Its own process group: the tool and its child end together.
        let mut child =
            std::os::unix::process::CommandExt::process_group(&mut Command::new(&tool), 0)
                .arg(&volume)
                .spawn()
                .unwrap();
        let pid = child.id();
        let mut stuck = None;
        env.wait_for("the tool reported as stuck", || {
            stuck = env.status().stuck_tools.into_iter().find(|t| t.pid == pid);
            stuck.is_some()
        });
        let t = stuck.unwrap();
        let volume = volume.to_str().unwrap();
        assert_eq!(t.comm, "fsck.hung");
        assert_eq!(
            t.command_line,
            format!("/bin/sh {} {volume}", tool.display()),
            "{t:?}"
        );
        assert_eq!(t.device.as_deref(), Some(volume));
        assert_eq!(t.pod_uid.as_deref(), Some("uid-web"));
        assert_eq!(t.volume.as_deref(), Some("d"));
        assert_eq!(t.state, "S", "waiting for its child: {t:?}");
        assert!(t.elapsed_seconds >= 1.0, "{t:?}");
        assert!(!t.kernel_stack.is_empty(), "{t:?}");

        let out = Command::new(volmgr_bin())
            .args(["doctor", "--json", "--root"])
            .arg(&env.root)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "doctor exits 1 on a stuck tool");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            report["stuck_tools"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["pid"] == pid),
            "{report}"
        );
        let (pt, code) = doctor(&env, "test/web", None);
        assert_eq!(code, 1, "doctor --pod exits 1 on a stuck tool");
        assert!(pt.stuck_tools.iter().any(|x| x.pid == pid), "{pt:?}");
        let m = env.metrics_text();
        let gauge = |name: &str| -> f64 {
            m.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("{name} in {m}"))
                .parse()
                .unwrap()
        };
        assert!(gauge("volmgr_fs_tools_stuck") >= 1.0, "{m}");
        assert!(gauge("volmgr_fs_tools_running") >= 1.0, "{m}");
        assert!(gauge("volmgr_fs_tool_oldest_running_seconds") >= 1.0, "{m}");
        let text = Command::new(volmgr_bin())
            .args(["status", "--root"])
            .arg(&env.root)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("file system tools stuck now:"), "{text}");
        assert!(
            text.contains(&format!("fsck.hung[{pid}] state S")),
            "{text}"
        );

        // Ended: the tool and its child.
        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        child.wait().unwrap();
        env.wait_for("the tool no longer stuck", || {
            !env.status().stuck_tools.iter().any(|t| t.pid == pid)
        });
        let logged = agent
            .log()
            .lines()
            .filter(|l| {
                l.contains("file system tool running longer than --stuck-tool-after")
                    && l.contains("fsck.hung")
            })
            .count();
        assert_eq!(logged, 1, "logged once:\n{}", agent.log());
        drop(agent);
    });
}

const DRIVER: &str = "loop.csi.volmgr.dev";

#[test]
fn mkfs_run_by_the_csi_driver_is_in_the_staging_timeline_before_the_mount() {
    let name = "mkfs_run_by_the_csi_driver_is_in_the_staging_timeline_before_the_mount";
    if let Some(why) = ebpf_unavailable() {
        eprintln!("SKIP {name}: {why}");
        return;
    }
    isolated(name, || {
        let env = Env::new();
        let mut driver = csi_driver::Driver::new(&env, DRIVER);
        driver.start();
        let flag = driver.flag();
        // The tracer is attached (the agent runs an emptyDir pod) before
        // the CSI pod exists, so the stage is traced.
        let agent = start_ebpf_agent(&env, &["--csi-driver", &flag, "--node-name", "node-1"]);
        env.write_manifest(
            "pv.yaml",
            &format!("apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: pv-m}}\nspec:\n  capacity: {{storage: 64Mi}}\n  accessModes: [ReadWriteOnce]\n  claimRef: {{namespace: test, name: claim-m}}\n  csi: {{driver: {DRIVER}, volumeHandle: vol-m, fsType: ext4, volumeAttributes: {{size: 64Mi}}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-m, namespace: test}}\nspec: {{volumeName: pv-m, accessModes: [ReadWriteOnce]}}\n"),
        );
        env.write_manifest(
            "c.yaml",
            &pod_yaml(
                "db",
                "uid-db",
                &[("data", "persistentVolumeClaim: {claimName: claim-m}")],
            ),
        );
        assert_eq!(env.wait_pod("uid-db", 60.0), 0, "log:\n{}", agent.log());
        let dev = format!(
            "/dev/{}",
            driver.loop_devices().first().expect("a loop device")
        );
        let staging = |t: &PodTimeline| {
            t.volumes
                .iter()
                .find(|v| v.key.pod_uid.is_none() && v.key.plugin.ends_with(DRIVER))
                .cloned()
        };
        let mut t = PodTimeline::default();
        env.wait_for("the mkfs and the mount in the staging timeline", || {
            t = doctor(&env, "test/db", None).0;
            staging(&t).is_some_and(|v| {
                v.entries.iter().any(|e| e.call == "exec")
                    && v.entries.iter().any(|e| e.call == "mount")
            })
        });
        let v = staging(&t).unwrap();
        let mkfs = v.entries.iter().position(|e| e.call == "exec").unwrap();
        let mount = v
            .entries
            .iter()
            .position(|e| e.call == "mount" && e.source.as_deref() == Some(dev.as_str()))
            .unwrap_or_else(|| panic!("the mount of {dev}: {v:#?}"));
        assert!(mkfs < mount, "mkfs first: {v:#?}");
        let (e, m) = (&v.entries[mkfs], &v.entries[mount]);
        assert_eq!(e.comm, "mkfs.ext4", "{e:?}");
        assert_eq!(e.path, dev, "{e:?}");
        assert_eq!(e.result, "ok", "{e:?}");
        assert!(e.duration_ns > 0, "{e:?}");
        assert!(
            e.start_ns + e.duration_ns <= m.start_ns,
            "done before the mount: {v:#?}"
        );
        let cmd = e.command.as_deref().unwrap_or_default();
        assert!(cmd.contains("mkfs.ext4") && cmd.ends_with(&dev), "{cmd}");
        assert_ne!(e.pid, agent.child.id(), "the driver's child, not the agent");
        assert_ne!(e.pid, m.pid, "another process than the mount's");

        let out = Command::new(volmgr_bin())
            .args(["doctor", "--pod", "test/db", "--root"])
            .arg(&env.root)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("exec staging {dev} (")), "{text}");

        // A check of the staged (mounted) device by another process: the
        // device is known from the stage's mount, the run is placed at once.
        let mut fsck = Command::new("e2fsck")
            .args(["-n", &dev])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let fsck_pid = fsck.id();
        let want = match fsck.wait().unwrap().code() {
            Some(0) => "ok".to_string(),
            Some(n) => format!("exit {n}"),
            None => panic!("e2fsck killed"),
        };
        env.wait_for("the e2fsck in the staging timeline", || {
            t = doctor(&env, "test/db", None).0;
            staging(&t).is_some_and(|v| v.entries.iter().any(|e| e.pid == fsck_pid))
        });
        let v = staging(&t).unwrap();
        let e = v.entries.iter().find(|e| e.pid == fsck_pid).unwrap();
        assert_eq!(
            (e.comm.as_str(), e.call.as_str()),
            ("e2fsck", "exec"),
            "{e:?}"
        );
        assert_eq!(e.path, dev, "{e:?}");
        assert_eq!(e.result, want, "{e:?}");
        assert_eq!(
            e.command.as_deref(),
            Some(format!("e2fsck -n {dev}").as_str())
        );

        let m = env.metrics_text();
        assert!(m.contains("\nvolmgr_trace_tool_runs_lost_total 0\n"), "{m}");
        assert!(
            m.contains("\nvolmgr_trace_slot_collisions_total 0\n"),
            "{m}"
        );

        env.remove_manifest("c.yaml");
        csi_driver::wait_for("the volume unstaged", || {
            driver.count("NodeUnstageVolume", "vol-m", "OK") == 1
        });
        csi_driver::wait_for("the loop device detached", || {
            driver.loop_devices().is_empty()
        });
        drop(agent);
    });
}
