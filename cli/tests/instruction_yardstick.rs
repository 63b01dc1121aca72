//! A yardstick that noise cannot move, next to the system calls of
//! `syscall_yardstick.rs`: the user-space instructions the agent runs
//! (callgrind's `Ir`) to start (exec to `synced`, no pods) and per volume
//! for a storm of `emptyDir{medium: Memory}` pods mounted and then torn
//! down. The same figures in two runs agree to well under 1 %; wall-clock
//! ratios on a shared 2-CPU machine move by 10-25 %. The committed figures
//! live in BENCHMARKS.md ("Yardsticks: instructions per volume"); this
//! test fails when a figure grows by more than 10 % over the committed one.
//!
//! The agent runs under `valgrind --tool=callgrind`; `callgrind_control
//! -d` dumps (and zeroes) its counts at the end of each phase. Per volume
//! is the slope between two storms of one agent, [`SMALL`] then [`LARGE`]
//! pods, so what a phase costs once (the first storm's lazy set-ups, the
//! wake-ups that start a phase) cancels out. Start-up is the first dump
//! less the `volmgr status` queries the test made to see `synced` (each
//! costs the agent the same, measured after start-up). Start-up is
//! printed, not checked: it grows with the machine's mount table, which
//! the agent reads twice at start (about 13,000 instructions a line each
//! time in a debug build), so it differs between machines.
//!
//! Valgrind 3.19 (Debian bookworm's) fails `openat2` with `ENOSYS`, so
//! the agent walks paths with `openat` one level at a time, as on a kernel
//! before 5.6 (its status says `path_resolution: openat walk`); the
//! figures are of that path.
//!
//! A debug build (as `cargo test` builds it), the tracer off, nothing
//! periodic (resync, rescan and stats every hour). Needs root (a private
//! mount namespace, tmpfs mounts) and valgrind (scripts/bootstrap.sh
//! installs it).
//!
//! ```sh
//! cargo test -p volmgr-cli --test instruction_yardstick -- --nocapture
//! ```

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
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::{isolated, volmgr_bin, Agent, Env, YARDSTICK};
use yardstick::{check, manifest, mounted_below, wait_until};

/// Pods in the first storm.
const SMALL: usize = 100;
/// Pods in the second storm.
const LARGE: usize = 300;
/// `volmgr status` queries made to price one.
const QUERIES: u64 = 10;
/// Functions of volmgr shown in a failure's message.
const TOP: usize = 10;

/// The agent under callgrind, its counts dumped to `out` (`out.1`, `out.2`,
/// ... at each [`dump`]).
fn start(env: &Env, out: &Path) -> Agent {
    let log = env.dir.path().join("agent.log");
    let child = Command::new("valgrind")
        .args(["--tool=callgrind", "--quiet"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(volmgr_bin())
        .arg("agent")
        .arg("--root")
        .arg(&env.root)
        .arg("--manifests")
        .arg(&env.manifests)
        .args(["--container-runtime-endpoint", "none", "--tracer", "off"])
        .args(["--resync-period", "1h", "--rescan-period", "1h"])
        .args(["--volume-stats-period", "1h"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap())
        .spawn()
        .expect("valgrind (scripts/bootstrap.sh installs it)");
    Agent { child, log }
}

/// Dumps and zeroes the agent's counts; returns the instructions since
/// the last dump and the dump's file.
fn dump(agent: &Agent, out: &Path, n: usize) -> (u64, PathBuf) {
    // Bounded: vgdb, which it drives, must not hang the suite.
    let st = Command::new("timeout")
        .args(["120", "callgrind_control", "-d"])
        .arg(agent.child.id().to_string())
        .stdout(Stdio::null())
        .status()
        .expect("callgrind_control");
    assert!(
        st.success(),
        "callgrind_control -d failed:\n{}",
        agent.log()
    );
    let file = PathBuf::from(format!("{}.{n}", out.display()));
    let text = std::fs::read_to_string(&file).unwrap();
    let ir = text
        .lines()
        .find_map(|l| l.strip_prefix("summary:").or(l.strip_prefix("totals:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no summary in {}", file.display()));
    (ir, file)
}

/// Waits until the agent says it is synced; returns how many `volmgr
/// status` queries that took.
fn wait_synced(env: &Env) -> u64 {
    let mut queries = 0;
    wait_until("status synced", 300, || {
        queries += 1;
        env.status().synced
    });
    queries
}

/// Lines of this namespace's mount table (the agent's, which copies the
/// host's).
fn mount_lines() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .count()
}

/// The agent stopped (`SIGSTOP`) until dropped (`SIGCONT`): the storm's
/// manifests all wait for it, so how many one scan takes up does not
/// depend on timing (a scan's own cost, shared by its pods, moved the
/// mount figure by 3 % between runs).
struct Paused(nix::unistd::Pid);

fn pause(agent: &Agent) -> Paused {
    let pid = nix::unistd::Pid::from_raw(agent.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    Paused(pid)
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// What one storm of `n` pods cost: (mount, teardown) instructions, and
/// the dumps' files.
struct Storm {
    mount: u64,
    teardown: u64,
    files: (PathBuf, PathBuf),
}

/// A storm of `n` pods, mounted then torn down; dumps `next` and `next + 1`.
fn storm(env: &Env, agent: &Agent, out: &Path, n: usize, next: usize) -> Storm {
    let paused = pause(agent);
    for i in 0..n {
        env.write_manifest(&format!("p{i}.json"), &manifest(i));
    }
    drop(paused);
    wait_until("every volume mounted", 300, || {
        mounted_below(&env.root) == n
    });
    let (mount, mount_file) = dump(agent, out, next);
    let paused = pause(agent);
    for i in 0..n {
        env.remove_manifest(&format!("p{i}.json"));
    }
    drop(paused);
    let pods = env.root.join("pods");
    wait_until("every pod directory removed", 300, || {
        mounted_below(&env.root) == 0 && std::fs::read_dir(&pods).map_or(true, |d| d.count() == 0)
    });
    let (teardown, teardown_file) = dump(agent, out, next + 1);
    Storm {
        mount,
        teardown,
        files: (mount_file, teardown_file),
    }
}

/// volmgr's functions in a dump by inclusive instructions
/// (callgrind_annotate), by name.
fn inclusive(file: &Path) -> BTreeMap<String, f64> {
    let out = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100", "--auto=no"])
        .arg(file)
        .output();
    let Ok(out) = out else {
        return BTreeMap::new();
    };
    let mut by_name = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((ir, rest)) = l.trim_start().split_once(' ') else {
            continue;
        };
        let Ok(ir) = ir.replace(',', "").parse::<f64>() else {
            continue;
        };
        let f = rest.split(" [").next().unwrap_or(rest);
        let f = f.rsplit_once(".rs:").map_or(f, |(_, f)| f);
        if f.starts_with("volmgr::") && !f.contains("{{closure}}") {
            let e = by_name.entry(f.to_string()).or_insert(0.0);
            *e = f64::max(*e, ir);
        }
    }
    by_name
}

/// volmgr's functions by inclusive instructions per volume, `large`'s
/// dump over `small`'s: the top [`TOP`], for the message.
fn top_functions(large: &Path, small: &Path) -> String {
    let small = inclusive(small);
    let per = (LARGE - SMALL) as f64 * 1e3;
    let mut top: Vec<(String, f64)> = inclusive(large)
        .into_iter()
        .map(|(f, ir)| {
            let d = (ir - small.get(&f).copied().unwrap_or(0.0)) / per;
            (f, d)
        })
        .collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: Vec<String> = top
        .iter()
        .take(TOP)
        .map(|(f, k)| format!("{f} {k:.1}k"))
        .collect();
    top.join(", ")
}

/// Whether valgrind's callgrind and its tools are here.
fn callgrind_missing() -> bool {
    ["valgrind", "callgrind_control", "callgrind_annotate"]
        .iter()
        .any(|t| {
            Command::new(t)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_err()
        })
}

#[test]
fn user_space_instructions_per_volume_stay_within_the_committed_figures() {
    isolated(
        "user_space_instructions_per_volume_stay_within_the_committed_figures",
        || {
            if callgrind_missing() {
                eprintln!("SKIP: no valgrind (scripts/bootstrap.sh installs it)");
                return;
            }
            let env = Env::new();
            let out = env.dir.path().join("callgrind.out");
            let agent = start(&env, &out);
            let queries = wait_synced(&env);
            let (started, _) = dump(&agent, &out, 1);
            for _ in 0..QUERIES {
                env.status();
            }
            let (priced, _) = dump(&agent, &out, 2);
            let query = priced / QUERIES;
            let start_up = started.saturating_sub(queries * query) as f64 / 1e3;
            let small = storm(&env, &agent, &out, SMALL, 3);
            let large = storm(&env, &agent, &out, LARGE, 5);
            // After the last dump: a query costs the agent.
            let resolution = env.status().path_resolution;
            drop(agent);
            let per = (LARGE - SMALL) as f64 * 1e3;
            let mount = large.mount.saturating_sub(small.mount) as f64 / per;
            let teardown = large.teardown.saturating_sub(small.teardown) as f64 / per;
            let mount_top = top_functions(&large.files.0, &small.files.0);
            let teardown_top = top_functions(&large.files.1, &small.files.1);
            eprintln!(
                "{YARDSTICK}user-space instructions (thousands), debug build, path resolution {resolution:?}: start-up {start_up:.1} ({queries} status queries of {:.1} taken off, {} lines of mountinfo); per volume, storms of {SMALL} and {LARGE} pods: mount {mount:.1} ({mount_top}); teardown {teardown:.1} ({teardown_top})",
                query as f64 / 1e3,
                mount_lines()
            );
            check(
                "instructions_per_volume_mount",
                mount,
                "thousand instructions",
                &mount_top,
            );
            check(
                "instructions_per_volume_teardown",
                teardown,
                "thousand instructions",
                &teardown_top,
            );
        },
    );
}
