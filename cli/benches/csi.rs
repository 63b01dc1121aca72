//! Benchmark of the CSI issue: N PersistentVolumes of the test driver
//! (`volmgr-csi-driver`: sparse image, loop device, mkfs.ext4, mount, bind
//! mount), one pod each, staged and published by `volmgr agent`; the time to
//! converge next to the driver's own handling time in the same run, read
//! from the driver's call journal (`calls.jsonl`).
//!
//! The driver's time is reported two ways: the sum of its call durations
//! divided by the parallelism the run achieved (= the wall-clock time during
//! which at least one call was in flight, the union of the call intervals),
//! and the plain sum. volmgr's overhead is convergence / driver wall time - 1:
//! everything the agent adds (process start, reading the manifests,
//! reconciling, gRPC, bookkeeping, the gaps between calls).
//!
//! Runs in a private mount namespace it creates itself (re-executing
//! itself); needs root and the driver built in the same profile:
//!
//! ```text
//! cargo build --release -p volmgr-csi-driver
//! cargo bench -p volmgr-cli --bench csi -- [--n 200] [--rounds 3]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

const DRIVER: &str = "loop.csi.volmgr.dev";

fn main() {
    if !common::in_private_mount_namespace() {
        return;
    }
    let f = common::flags(&["--n", "--rounds"]);
    let (n, rounds) = (
        common::flag(&f, "--n", 200usize),
        common::flag(&f, "--rounds", 3usize),
    );
    let driver = PathBuf::from(volmgr())
        .parent()
        .unwrap()
        .join("volmgr-csi-driver");
    assert!(
        driver.exists(),
        "{} is missing: run `cargo build --release -p volmgr-csi-driver` first",
        driver.display()
    );
    println!(
        "machine: nproc={} kernel={}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    println!();
    println!("| round | N | volmgr converged (s) | driver wall time (s) = sum / parallelism | driver sum (s) | parallelism | first call after start (ms) | last answer to converged (ms) | overhead |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut overheads = Vec::new();
    for round in 0..rounds {
        let r = run(&driver, n);
        let overhead = r.converged / r.union - 1.0;
        overheads.push(overhead);
        println!(
            "| {round} | {n} | {:.3} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} | {:+.1} % |",
            r.converged,
            r.union,
            r.sum,
            r.sum / r.union,
            r.first_call * 1e3,
            r.tail * 1e3,
            overhead * 100.0
        );
    }
    overheads.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!();
    println!(
        "median overhead over {rounds} rounds: {:+.1} % (volmgr converged / driver wall time - 1)",
        overheads[overheads.len() / 2] * 100.0
    );
}

fn volmgr() -> &'static str {
    env!("CARGO_BIN_EXE_volmgr")
}

struct RunResult {
    converged: f64,
    union: f64,
    sum: f64,
    first_call: f64,
    tail: f64,
}

fn manifests(dir: &Path, n: usize) {
    for i in 0..n {
        let text = format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: pv-{i}}}\nspec:\n  capacity: {{storage: 16Mi}}\n  accessModes: [ReadWriteOnce]\n  claimRef: {{namespace: bench, name: claim-{i}}}\n  csi: {{driver: {DRIVER}, volumeHandle: vol-{i}, fsType: ext4, volumeAttributes: {{size: 16Mi}}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-{i}, namespace: bench}}\nspec: {{volumeName: pv-{i}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: pod-{i}, namespace: bench, uid: 00000000-0000-4000-8000-{i:012}}}\nspec:\n  containers: [{{name: app, image: busybox, volumeMounts: [{{name: data, mountPath: /data}}]}}]\n  volumes: [{{name: data, persistentVolumeClaim: {{claimName: claim-{i}}}}}]\n"
        );
        std::fs::write(dir.join(format!("pod-{i}.yaml")), text).unwrap();
    }
}

fn wait_all(root: &Path, pods: usize) {
    let st = Command::new(volmgr())
        .args([
            "wait",
            "--all",
            "--timeout",
            "900",
            "--pods",
            &pods.to_string(),
            "--root",
        ])
        .arg(root)
        .status()
        .unwrap();
    assert!(st.success(), "volmgr wait --all failed");
}

/// Calls in the journal: (start, end) in seconds since the epoch, method, code.
fn journal(state: &Path) -> Vec<(f64, f64, String, String)> {
    std::fs::read_to_string(state.join("calls.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|c| {
            let s = c["start_unix_ns"].as_f64().unwrap() / 1e9;
            let d = c["duration_ns"].as_f64().unwrap() / 1e9;
            (
                s,
                s + d,
                c["method"].as_str().unwrap_or("").to_string(),
                c["code"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn run(driver_bin: &Path, n: usize) -> RunResult {
    let base = tempfile::Builder::new()
        .prefix("volmgr-bench-csi")
        .tempdir()
        .unwrap();
    let root = base.path().join("root");
    let mdir = base.path().join("manifests");
    let state = base.path().join("driver");
    for d in [&root, &mdir, &state] {
        std::fs::create_dir_all(d).unwrap();
    }
    let root = root.canonicalize().unwrap();
    manifests(&mdir, n);
    let socket = base.path().join("csi.sock");
    let mut driver = Command::new(driver_bin)
        .arg("--endpoint")
        .arg(&socket)
        .arg("--state-dir")
        .arg(&state)
        .args(["--name", DRIVER])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let t0 = Instant::now();
    let e0 = epoch_now();
    let mut agent = Command::new(volmgr())
        .arg("agent")
        .arg("--root")
        .arg(&root)
        .arg("--manifests")
        .arg(&mdir)
        .arg("--csi-driver")
        .arg(format!("{DRIVER}={}", socket.display()))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_all(&root, n);
    let converged = t0.elapsed().as_secs_f64();
    let e1 = e0 + converged;
    // The journal line of the last call is written as it answers.
    let mut calls = journal(&state);
    while calls
        .iter()
        .filter(|c| c.2 == "NodePublishVolume" && c.3 == "OK")
        .count()
        < n
    {
        std::thread::sleep(Duration::from_millis(5));
        calls = journal(&state);
    }
    let staged = calls
        .iter()
        .filter(|c| c.2 == "NodeStageVolume" && c.3 == "OK")
        .count();
    assert_eq!(staged, n, "every volume staged once");
    let sum: f64 = calls.iter().map(|c| c.1 - c.0).sum();
    let mut iv: Vec<(f64, f64)> = calls.iter().map(|c| (c.0, c.1)).collect();
    iv.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mut union = 0.0;
    let mut cur: Option<(f64, f64)> = None;
    for (s, e) in iv.iter().copied() {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                union += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        union += ce - cs;
    }
    let first_call = iv.first().map_or(0.0, |c| c.0 - e0);
    let last_end = iv.iter().map(|c| c.1).fold(0.0, f64::max);
    // Clean up: tear everything down through the agent (unpublish, unstage,
    // loop devices detached by the driver), then stop both.
    for i in 0..n {
        std::fs::remove_file(mdir.join(format!("pod-{i}.yaml"))).unwrap();
    }
    wait_all(&root, 0);
    while journal(&state)
        .iter()
        .filter(|c| c.2 == "NodeUnstageVolume" && c.3 == "OK")
        .count()
        < n
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    for child in [&mut agent, &mut driver] {
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = child.wait();
    }
    RunResult {
        converged,
        union,
        sum,
        first_call,
        tail: e1 - last_end,
    }
}
