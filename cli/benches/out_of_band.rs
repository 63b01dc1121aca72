//! Benchmark: time from an out-of-band unmount of a managed volume to the
//! volume being mounted again by the agent, with the eBPF tracer and with the
//! mountinfo poller, side by side in one run.
//!
//! Two agents run in one private mount namespace (created by re-executing
//! this program), each on its own ROOT with one pod holding one
//! `emptyDir{medium: Memory}`, with `--resync-period 1h` so the resync never
//! repairs. Per trial, alternating which agent goes first, this process
//! (another process than the agent) unmounts the agent's volume with
//! `umount2(2)` and the clock runs from just before that call until the path
//! is a mount point again, seen by `poll(POLLPRI)` on this process's
//! `/proc/self/mountinfo` (woken by every change, no busy loop) and
//! `statx(STATX_ATTR_MOUNT_ROOT)`. Between trials the program waits (untimed)
//! until the agent reports the volume mounted, so no trial starts while the
//! agent is still finishing the previous repair.
//!
//! ```text
//! cargo bench -p volmgr-cli --bench out_of_band -- [--trials 1000]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "common/mod.rs"]
mod common;

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn volmgr() -> &'static str {
    env!("CARGO_BIN_EXE_volmgr")
}

struct Agent {
    name: &'static str,
    root: PathBuf,
    volume: PathBuf,
    child: Child,
    log: PathBuf,
    samples: Vec<Duration>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_agent(base: &Path, tracer: &'static str) -> Result<Agent, String> {
    let dir = base.join(tracer);
    let (root, manifests) = (dir.join("root"), dir.join("manifests"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&manifests).unwrap();
    let root = root.canonicalize().unwrap();
    std::fs::write(
        manifests.join("p.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: bench, uid: uid-p}\nspec:\n  containers: [{name: c, image: i, volumeMounts: [{name: m, mountPath: /m}]}]\n  volumes: [{name: m, emptyDir: {medium: Memory}}]\n",
    )
    .unwrap();
    let log = dir.join("agent.log");
    let child = Command::new(volmgr())
        .arg("agent")
        .arg("--root")
        .arg(&root)
        .arg("--manifests")
        .arg(&manifests)
        .args(["--tracer", tracer, "--resync-period", "1h"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let volume = root.join("pods/uid-p/volumes/kubernetes.io~empty-dir/m");
    let mut agent = Agent {
        name: tracer,
        root,
        volume,
        child,
        log,
        samples: Vec::new(),
    };
    if !wait_mounted(&mut agent) {
        return Err(std::fs::read_to_string(&agent.log).unwrap_or_default());
    }
    Ok(agent)
}

/// Waits (untimed) until the agent reports the pod's volume mounted;
/// `false` if the agent died.
fn wait_mounted(agent: &mut Agent) -> bool {
    loop {
        if !matches!(agent.child.try_wait(), Ok(None)) {
            return false;
        }
        let st = Command::new(volmgr())
            .args(["wait", "--pod", "uid-p", "--timeout", "30", "--root"])
            .arg(&agent.root)
            .stderr(Stdio::null())
            .status()
            .unwrap();
        if st.success() {
            return true;
        }
    }
}

fn is_mount_root(path: &CString) -> bool {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid NUL-terminated path and a writable statx buffer.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS,
            stx.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "statx");
    // SAFETY: statx succeeded.
    let stx = unsafe { stx.assume_init() };
    stx.stx_attributes & (libc::STATX_ATTR_MOUNT_ROOT as u64) != 0
}

/// One trial: unmount, then wait for the remount.
fn trial(agent: &mut Agent, mountinfo: &std::fs::File) -> Duration {
    let path = CString::new(agent.volume.as_os_str().as_bytes()).unwrap();
    let mut pfd = libc::pollfd {
        fd: mountinfo.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    // Consume any pending change notification first.
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, 0) };
    assert!(is_mount_root(&path), "volume mounted before the trial");
    let t0 = Instant::now();
    nix::mount::umount2(agent.volume.as_path(), nix::mount::MntFlags::empty()).unwrap();
    loop {
        pfd.revents = 0;
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert!(rc > 0, "no mount-table change within 10 s ({})", agent.name);
        if is_mount_root(&path) {
            return t0.elapsed();
        }
    }
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    if !common::in_private_mount_namespace() {
        return;
    }
    let trials = common::flag(&common::flags(&["--trials"]), "--trials", 1000usize);
    let base = tempfile::Builder::new()
        .prefix("volmgr-bench-oob")
        .tempdir()
        .unwrap();
    println!(
        "machine: nproc={} kernel={}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    let mut agents = Vec::new();
    for tracer in ["ebpf", "mountinfo"] {
        match start_agent(base.path(), tracer) {
            Ok(a) => agents.push(a),
            Err(log) => println!("{tracer}: the agent did not start; its log:\n{log}"),
        }
    }
    assert!(!agents.is_empty(), "no agent started");
    let mountinfo = std::fs::File::open("/proc/self/mountinfo").unwrap();
    for i in 0..trials {
        let n = agents.len();
        for k in 0..n {
            // Alternate which agent goes first.
            let a = &mut agents[(i + k) % n];
            let d = trial(a, &mountinfo);
            a.samples.push(d);
            assert!(wait_mounted(a), "{} agent died", a.name);
        }
    }
    println!("trials per tracer: {trials}");
    println!("| tracer | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) |");
    println!("|---|---|---|---|---|");
    let mut p50s = Vec::new();
    for a in &mut agents {
        a.samples.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let s = &a.samples;
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} |",
            a.name,
            ms(quantile(s, 0.5)),
            ms(quantile(s, 0.9)),
            ms(quantile(s, 0.99)),
            ms(*s.last().unwrap())
        );
        p50s.push((a.name, quantile(s, 0.5), quantile(s, 0.99)));
    }
    if let [(n1, a50, a99), (n2, b50, b99)] = p50s[..] {
        println!(
            "ratio {n2}/{n1}: p50 {:.2}x, p99 {:.2}x",
            b50.as_secs_f64() / a50.as_secs_f64(),
            b99.as_secs_f64() / a99.as_secs_f64()
        );
    }
    for a in &agents {
        let out = Command::new(volmgr())
            .args(["status", "--json", "--root"])
            .arg(&a.root)
            .output()
            .unwrap();
        let s: volmgr::status::Status = serde_json::from_slice(&out.stdout).unwrap();
        let repaired = s
            .out_of_band
            .iter()
            .filter(|e| e.outcome == "repaired")
            .count();
        let detected: Vec<u64> = s
            .out_of_band
            .iter()
            .filter_map(|e| e.detected_after_us)
            .collect();
        println!(
            "{}: status tracer={} out-of-band events={} checks={} (last {} changes kept: {} repaired; confirmation delays after the syscall, µs: {:?})",
            a.name,
            s.tracer,
            s.tracer_stats.out_of_band_events,
            s.tracer_stats.checks,
            s.out_of_band.len(),
            repaired,
            detected.iter().rev().take(8).collect::<Vec<_>>()
        );
    }
}
