//! A yardstick that noise cannot move: the file and mount system calls the
//! agent makes per volume, for a storm of N `emptyDir{medium: Memory}` pods
//! mounted and then torn down, counted by `strace -c` attached to the
//! running agent. Wall-clock ratios on a shared 2-CPU machine move by 10-25
//! % between rounds; these counts do not. The committed figures live in
//! BENCHMARKS.md ("Yardsticks: system calls per volume"); this test fails
//! when a figure grows by more than 10 % over the committed one, so a cost
//! added per volume is seen in review, not months later.
//!
//! Counted: the calls that work on files and mounts (`openat`, `mkdirat`,
//! `mount`, `umount2`, `statx`, `getdents64`, `unlinkat`, `close`, ...).
//! Not counted: the runtime's coordination (`futex`, `epoll_*`, eventfd
//! `read`/`write`, timers, memory mapping), which depends on scheduling.
//! The raw loop of BENCHMARKS.md ("Core") makes 5 such calls per volume to
//! mount (4 `mkdir`, 1 `mount`) and 5 to tear down (1 `umount2`, 4
//! `rmdir`).
//!
//! Needs root (a private mount namespace, tmpfs mounts) and `strace`
//! (scripts/bootstrap.sh installs it).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::zombie_processes
)]

mod support;
#[path = "support/yardstick.rs"]
mod yardstick;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::fcntl::OFlag;
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};
use support::{isolated, Env, YARDSTICK};
use volmgr::sys::beneath::{self, Last};
use yardstick::{check, manifest, mounted_below, wait_until};

/// Pods in the storm.
const N: usize = 500;

/// Whether `name` is a call that works on files or mounts.
fn counted(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "close",
        "close_range",
        "rmdir",
        "getdents64",
        "lseek",
        "fsync",
        "ftruncate",
        "fallocate",
        "fsopen",
        "fsmount",
        "fsconfig",
        "fspick",
        "move_mount",
        "open_tree",
        "mount_setattr",
        "statfs",
        "fstatfs",
        "inotify_add_watch",
        "inotify_rm_watch",
        "utimensat",
        "access",
        "faccessat",
        "faccessat2",
    ];
    const PREFIXES: &[&str] = &[
        "open",
        "mkdir",
        "mount",
        "umount",
        "stat",
        "newfstatat",
        "fstat",
        "lstat",
        "unlink",
        "rename",
        "chmod",
        "fchmod",
        "chown",
        "fchown",
        "lchown",
        "readlink",
        "symlink",
        "link",
        "setxattr",
        "lsetxattr",
        "fsetxattr",
        "getxattr",
        "lgetxattr",
        "fgetxattr",
    ];
    EXACT.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// `strace -c` attached to every thread of `pid`, until [`stop`].
fn attach(pid: u32, out: &Path) -> Child {
    let child = Command::new("strace")
        .args(["-f", "-qq", "-c", "-U", "name,calls", "-o"])
        .arg(out)
        .arg("-p")
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("strace (scripts/bootstrap.sh installs it)");
    // Attached once every thread of the agent has a tracer.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let all = tasks.flatten().all(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            status
                .lines()
                .any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0"))
        });
        if all {
            return child;
        }
        assert!(Instant::now() < deadline, "strace did not attach");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Detaches `strace` and reads its counts by call.
fn stop(mut strace: Child, out: &Path) -> BTreeMap<String, u64> {
    let pid = nix::unistd::Pid::from_raw(strace.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    strace.wait().unwrap();
    read_counts(out)
}

/// The counts by call in `strace -c`'s output file `out`.
fn read_counts(out: &Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(out).unwrap();
    let mut calls = BTreeMap::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        if let (Some(name), Some(n), None) = (w.next(), w.next(), w.next()) {
            if let Ok(n) = n.parse::<u64>() {
                if name != "total" {
                    calls.insert(name.to_string(), n);
                }
            }
        }
    }
    assert!(!calls.is_empty(), "no counts in strace's output:\n{text}");
    calls
}

/// Counted calls per volume, and the top ones (for the message).
fn per_volume(calls: &BTreeMap<String, u64>) -> (f64, String) {
    let mut top: Vec<(&String, &u64)> = calls
        .iter()
        .filter(|(c, n)| counted(c) && **n > 0)
        .collect();
    let total: u64 = top.iter().map(|(_, n)| **n).sum();
    top.sort_by(|a, b| b.1.cmp(a.1));
    let shown: Vec<String> = top
        .iter()
        .take(12)
        .map(|(c, n)| format!("{c} {:.2}", **n as f64 / N as f64))
        .collect();
    (total as f64 / N as f64, shown.join(", "))
}

/// Set in the environment of the test binary run again under `strace` to
/// play [the loop under volmgr's rule](rule_loop): `<phase>:<dir>`.
const RULE_LOOP_ENV: &str = "VOLMGR_YARDSTICK_RULE_LOOP";

/// The path of volume `i` below `pods`, as the kubelet lays it out.
fn volume_path(i: usize) -> [String; 4] {
    [
        format!("uid-{i:05}"),
        "volumes".into(),
        "kubernetes.io~empty-dir".into(),
        "cache".into(),
    ]
}

/// Opens `name` below `dir` as volmgr's rule wants it (`openat2` beneath,
/// no symlink, no mount crossed).
fn open_beneath(dir: BorrowedFd<'_>, name: &str) -> OwnedFd {
    beneath::open(
        dir,
        Path::new(name),
        OFlag::O_PATH | OFlag::O_DIRECTORY,
        Last::OnSameMount,
    )
    .unwrap()
}

/// The second comparator: the raw loop under the rule volmgr keeps for
/// ROOT (docs/ARCHITECTURE.md, `sys/root_dir`): each level made with
/// `mkdirat` relative to the level just opened with `openat2`, the tmpfs
/// mounted through the last level's descriptor; torn down through a
/// descriptor of each level, deepest first. Where the plain raw loop names
/// paths (and would follow a symlink or cross a mount on the way), this one
/// pays a descriptor per level: the floor for any code under the rule.
/// `phase` is `mount`, `teardown` or `none` (what the run itself costs).
fn rule_loop(phase: &str, dir: &Path) {
    let top = nix::fcntl::open(dir, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
    let pods = open_beneath(top.as_fd(), "pods");
    for i in 0..N {
        let names = volume_path(i);
        match phase {
            "mount" => {
                let mut level: Option<OwnedFd> = None;
                for name in &names {
                    let parent = level.as_ref().map_or(pods.as_fd(), |f| f.as_fd());
                    mkdirat(parent, name.as_str(), Mode::from_bits_truncate(0o750)).unwrap();
                    level = Some(open_beneath(parent, name));
                }
                let last = level.unwrap();
                let target = format!("/proc/self/fd/{}", last.as_raw_fd());
                let flags = nix::mount::MsFlags::empty();
                nix::mount::mount(
                    Some("tmpfs"),
                    target.as_str(),
                    Some("tmpfs"),
                    flags,
                    Some("size=16777216"),
                )
                .unwrap();
            }
            "teardown" => {
                let uid = open_beneath(pods.as_fd(), &names[0]);
                let vols = open_beneath(uid.as_fd(), &names[1]);
                let plugin = open_beneath(vols.as_fd(), &names[2]);
                let target = format!("/proc/self/fd/{}/{}", plugin.as_raw_fd(), names[3]);
                nix::mount::umount2(target.as_str(), nix::mount::MntFlags::UMOUNT_NOFOLLOW)
                    .unwrap();
                let rmdir =
                    |d: BorrowedFd<'_>, n: &str| unlinkat(d, n, UnlinkatFlags::RemoveDir).unwrap();
                rmdir(plugin.as_fd(), &names[3]);
                drop(plugin);
                rmdir(vols.as_fd(), &names[2]);
                drop(vols);
                rmdir(uid.as_fd(), &names[1]);
                drop(uid);
                rmdir(pods.as_fd(), &names[0]);
            }
            _ => return,
        }
    }
}

/// Counted calls per volume of [`rule_loop`]'s `phase` in `dir`: the test
/// binary run again under `strace -c`, less a run that does nothing.
fn rule_loop_per_volume(phase: &str, dir: &Path) -> (f64, String) {
    let run = |phase: &str| {
        let out = dir.join(format!("strace-rule-{phase}.txt"));
        let done = Command::new("strace")
            .args(["-f", "-qq", "-c", "-U", "name,calls", "-o"])
            .arg(&out)
            .arg(std::env::current_exe().unwrap())
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(RULE_LOOP_ENV, format!("{phase}:{}", dir.display()))
            .output()
            .unwrap();
        assert!(
            done.status.success(),
            "the loop under the rule failed ({phase}): {}",
            String::from_utf8_lossy(&done.stderr)
        );
        read_counts(&out)
    };
    let mut calls = run(phase);
    for (name, n) in run("none") {
        if let Some(c) = calls.get_mut(&name) {
            *c = c.saturating_sub(n);
        }
    }
    per_volume(&calls)
}

const TEST_NAME: &str = "file_and_mount_syscalls_per_volume_stay_within_the_committed_figures";

#[test]
fn file_and_mount_syscalls_per_volume_stay_within_the_committed_figures() {
    if let Ok(job) = std::env::var(RULE_LOOP_ENV) {
        let (phase, dir) = job.split_once(':').unwrap();
        rule_loop(phase, Path::new(dir));
        return;
    }
    isolated(TEST_NAME, || {
        if Command::new("strace").arg("-V").output().is_err() {
            eprintln!("SKIP: no strace (scripts/bootstrap.sh installs it)");
            return;
        }
        let env = Env::new();
        // Nothing periodic during the windows: no resync, rescan or stats.
        let agent = env.start_agent_env(
            &[
                "--tracer",
                "off",
                "--resync-period",
                "1h",
                "--rescan-period",
                "1h",
                "--volume-stats-period",
                "1h",
            ],
            &[("RUST_LOG", "warn")],
        );
        env.wait_synced();
        let out = env.dir.path().join("strace-mount.txt");
        let strace = attach(agent.child.id(), &out);
        for i in 0..N {
            env.write_manifest(&format!("p{i}.json"), &manifest(i));
        }
        wait_until("every volume mounted", 120, || {
            mounted_below(&env.root) == N
        });
        let (mount, mount_top) = per_volume(&stop(strace, &out));

        let out = env.dir.path().join("strace-teardown.txt");
        let strace = attach(agent.child.id(), &out);
        for i in 0..N {
            env.remove_manifest(&format!("p{i}.json"));
        }
        let pods = env.root.join("pods");
        wait_until("every pod directory removed", 120, || {
            mounted_below(&env.root) == 0
                && std::fs::read_dir(&pods).map_or(true, |d| d.count() == 0)
        });
        let (teardown, teardown_top) = per_volume(&stop(strace, &out));
        drop(agent);

        let rule = env.dir.path().join("rule");
        std::fs::create_dir_all(rule.join("pods")).unwrap();
        let (rule_mount, rule_mount_top) = rule_loop_per_volume("mount", &rule);
        let (rule_teardown, rule_teardown_top) = rule_loop_per_volume("teardown", &rule);

        eprintln!("{YARDSTICK}file and mount syscalls per volume, N = {N}: mount {mount:.2} ({mount_top}); teardown {teardown:.2} ({teardown_top}); raw loop 5 and 5; raw loop under volmgr's rule: mount {rule_mount:.2} ({rule_mount_top}), teardown {rule_teardown:.2} ({rule_teardown_top})");
        let unit = "file and mount syscalls per volume";
        check("syscalls_per_volume_mount", mount, unit, &mount_top);
        check(
            "syscalls_per_volume_teardown",
            teardown,
            unit,
            &teardown_top,
        );
    });
}
