//! End-to-end test of `teardown_blocked` (issue 41, item 2): a deleted
//! pod's volume that cannot be unmounted because a process has its cwd in
//! it. The observing agent (confined by Landlock, its holder scan in the
//! helper it forks before) must name the process by pid and command in
//! `volmgr doctor`, go back to `mounted_for_deleted_pod` once the process
//! is gone, and report nothing once the volume is unmounted.
//!
//! Before: the same volume was only `mounted_for_deleted_pod`, with the
//! mount line as its evidence and no word of what held it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use support::{doctor, isolated, volmgr_bin, Env};

/// The findings at `path` in `doctor --json`.
fn findings_at(state: &Path, path: &Path) -> Vec<serde_json::Value> {
    let (_, out) = doctor(state, true);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
    v["findings"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .filter(|f| f["path"] == path.to_str().unwrap())
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (generously) until `cond` holds, showing `what` and the agent's
/// log if it never does.
fn wait_until(what: &str, log: impl Fn() -> String, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "gave up waiting for: {what}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A process the test started, killed (by its pid) and reaped on drop,
/// even when the test fails.
struct Holder(std::process::Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Which tracer the observing agent runs (`ebpf`, `mountinfo`, `off`).
fn tracer(state: &Path) -> String {
    let out = Command::new(volmgr_bin())
        .args(["status", "--json", "--root"])
        .arg(state)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["tracer"].as_str().unwrap_or("").to_string()
}

#[test]
fn a_process_in_a_deleted_pods_volume_is_named_until_it_goes() {
    isolated(
        "a_process_in_a_deleted_pods_volume_is_named_until_it_goes",
        || {
            let env = Env::new();
            // A pod gone from the node (no manifest) whose memory-backed
            // emptyDir is still mounted, a process's cwd in it.
            let vol = env.empty_dir("uid-gone", "scratch");
            std::fs::create_dir_all(vol.join("work")).unwrap();
            mount(
                Some("tmpfs"),
                &vol,
                Some("tmpfs"),
                MsFlags::empty(),
                None::<&str>,
            )
            .unwrap();
            std::fs::create_dir_all(vol.join("work")).unwrap();
            let mut holder = Holder(
                Command::new("sleep")
                    .arg("1000")
                    .current_dir(vol.join("work"))
                    .spawn()
                    .unwrap(),
            );
            let pid = holder.0.id();
            let state = env.dir.path().join("state");
            let agent = env.start_agent(&[
                "--observe",
                "--state-dir",
                state.to_str().unwrap(),
                "--stuck-after",
                "1s",
                "--scan-period",
                "200ms",
            ]);
            let log = || agent.log();
            let kind_at = |state: &Path| {
                findings_at(state, &vol)
                    .first()
                    .map(|f| f["kind"].as_str().unwrap_or("").to_string())
            };
            wait_until("teardown_blocked naming the holder", log, || {
                findings_at(&state, &vol).iter().any(|f| {
                    f["kind"] == "teardown_blocked"
                        && f["evidence"]
                            .to_string()
                            .contains(&format!("pid {pid} (sleep, \\\"sleep 1000\\\"): cwd"))
                })
            });
            // The kubelet's unmount, as it fails on the node: EBUSY.
            assert_eq!(umount2(&vol, MntFlags::empty()), Err(Errno::EBUSY));
            let ebpf = tracer(&state) == "ebpf";
            if ebpf {
                wait_until("the EBUSY umount in the finding", log, || {
                    findings_at(&state, &vol).iter().any(|f| {
                        f["recent_syscalls"].to_string().contains("EBUSY")
                            && f["evidence"].to_string().contains("answered EBUSY")
                    })
                });
            } else {
                eprintln!("no eBPF tracer: the EBUSY call is not in the timeline");
            }
            let found = findings_at(&state, &vol);
            assert_eq!(found.len(), 1, "{found:#?}");
            let f = &found[0];
            assert_eq!(f["pod_uid"], "uid-gone", "{f:#}");
            assert!(
                f["summary"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("pid {pid}")),
                "{f:#}"
            );
            assert!(f["evidence"].to_string().contains("holder scan: "), "{f:#}");
            let (code, text) = doctor(&state, false);
            assert_eq!(code, 1, "{text}");
            let block = &text[text.find("- teardown_blocked:").expect(&text)..];
            let block = &block[..block.find("    do:").unwrap()];
            assert!(
                block.contains(&format!("held by pid {pid} (sleep")),
                "{text}"
            );
            assert!(block.contains(vol.join("work").to_str().unwrap()), "{text}");

            // The holder gone: no longer named; only still mounted (with
            // the tracer's EBUSY and a scan that could not read every
            // process, still blocked with its holder not found), then
            // unmountable.
            holder.0.kill().unwrap();
            holder.0.wait().unwrap();
            let named = format!("pid {pid} ");
            wait_until("the holder no longer named", log, || {
                let f = findings_at(&state, &vol);
                f.len() == 1 && !f[0].to_string().contains(&named)
            });
            let f = findings_at(&state, &vol).remove(0);
            let incomplete = f["evidence"].to_string().contains("not examined");
            if ebpf && incomplete {
                assert!(
                    f["kind"] == "teardown_blocked"
                        && f["summary"].to_string().contains("the holder not found"),
                    "{f:#}"
                );
            } else {
                assert_eq!(
                    kind_at(&state).as_deref(),
                    Some("mounted_for_deleted_pod"),
                    "{f:#}"
                );
            }
            umount2(&vol, MntFlags::empty()).unwrap();
            wait_until("nothing at the volume", log, || {
                findings_at(&state, &vol).is_empty()
            });
            let (_, text) = doctor(&state, false);
            assert!(!text.contains("teardown_blocked:"), "{text}");
            drop(agent);
        },
    );
}
