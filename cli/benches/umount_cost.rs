//! What one `umount2` of a tmpfs costs depending on what the other CPUs do,
//! which decides how volmgr schedules its tear-downs (see BENCHMARKS.md):
//! every non-lazy unmount waits for an expedited RCU grace period, which on
//! some hosts completes at once while the other CPUs idle and needs an
//! interrupt and a reply from each busy one (on others it costs about the
//! same either way: BENCHMARKS.md has both).
//!
//! In a private mount namespace it creates itself, per round, N tmpfs are
//! mounted and then unmounted one after the other by one thread while the
//! other CPUs are (a) idle, (b) each running a thread that spins in user
//! space, (c) each running a thread that wakes every 200 µs; and (d) by two
//! threads at once, each unmounting half. Needs root.
//!
//! ```text
//! cargo bench -p volmgr-cli --bench umount_cost -- [--n 1000] [--rounds 5]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

fn tmpfs(p: &Path) {
    std::fs::create_dir_all(p).unwrap();
    mount(
        Some("tmpfs"),
        p,
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
}

fn mount_all(base: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let p = base.join(i.to_string());
            tmpfs(&p);
            p
        })
        .collect()
}

fn unmount_all(paths: &[PathBuf]) {
    for p in paths {
        umount2(p, MntFlags::empty()).unwrap();
    }
}

/// µs per unmount, with `others` threads doing `load` meanwhile.
fn run(base: &Path, n: usize, others: usize, load: fn(&AtomicBool)) -> f64 {
    let paths = mount_all(base, n);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..others)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || load(&stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    let t = Instant::now();
    unmount_all(&paths);
    let per = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    per
}

fn spin(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        std::hint::spin_loop();
    }
}

fn tick(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn idle(_: &AtomicBool) {}

/// µs of wall time per unmount with two threads unmounting halves at once.
fn two_threads(base: &Path, n: usize) -> f64 {
    let paths = mount_all(base, n);
    let (a, b) = paths.split_at(n / 2);
    let (a, b) = (a.to_vec(), b.to_vec());
    let t = Instant::now();
    let h = std::thread::spawn(move || unmount_all(&a));
    unmount_all(&b);
    h.join().unwrap();
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn main() {
    if !common::in_private_mount_namespace() {
        return;
    }
    let f = common::flags(&["--n", "--rounds"]);
    let (n, rounds) = (
        common::flag(&f, "--n", 1000usize),
        common::flag(&f, "--rounds", 5usize),
    );
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let base = tempfile::Builder::new()
        .prefix("volmgr-umount")
        .tempdir()
        .unwrap();
    let area = base.path().join("area");
    tmpfs(&area);
    println!(
        "machine: nproc={cpus} kernel={}; N={n} tmpfs per case, {rounds} rounds",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    type Case = Box<dyn Fn(&Path) -> f64>;
    let others = cpus.saturating_sub(1);
    let cases: Vec<(&str, Case)> = vec![
        (
            "one thread, other CPUs idle",
            Box::new(move |b| run(b, n, 0, idle)),
        ),
        (
            "one thread, other CPUs spinning in user space",
            Box::new(move |b| run(b, n, others, spin)),
        ),
        (
            "one thread, other CPUs waking every 200 µs",
            Box::new(move |b| run(b, n, others, tick)),
        ),
        (
            "two threads at once (wall time per unmount)",
            Box::new(move |b| two_threads(b, n)),
        ),
    ];
    let mut results = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        for (i, (_, case)) in cases.iter().enumerate() {
            let dir = area.join(format!("r{round}-{i}"));
            std::fs::create_dir(&dir).unwrap();
            let v = case(&dir);
            eprintln!("round {round} case {i}: {v:.1} µs");
            results[i].push(v);
        }
    }
    println!();
    println!("| case | µs per `umount2` (median) | min | max |");
    println!("|---|---|---|---|");
    for ((name, _), mut r) in cases.iter().zip(results) {
        r.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} |",
            r[r.len() / 2],
            r[0],
            r[r.len() - 1]
        );
    }
    umount2(&area, MntFlags::MNT_DETACH).unwrap();
}
