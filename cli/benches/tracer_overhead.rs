//! Cost of tracing mount syscalls: loops of tmpfs mount+umount pairs and of
//! bind mount+umount pairs, with no tracer, with volmgr's eBPF tracer
//! (`volmgr profile`, consuming every event), with libbpf-tools' `mountsnoop`
//! and with a bpftrace in-kernel histogram one-liner; interleaved rounds in
//! one run. Reports the median cost per pair, what each tracer adds, and the
//! events each one delivered or lost.
//!
//! Run as root through `scripts/bench-tracer.sh` (installs mountsnoop and
//! bpftrace if missing); it creates its own private mount namespace and
//! mounts tracefs there if the host has none, leaving the host alone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(missing_docs)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tracer {
    None,
    Volmgr,
    Mountsnoop,
    Bpftrace,
}

impl Tracer {
    fn name(self) -> &'static str {
        match self {
            Tracer::None => "no tracer",
            Tracer::Volmgr => "volmgr (eBPF, events consumed)",
            Tracer::Mountsnoop => "libbpf-tools mountsnoop",
            Tracer::Bpftrace => "bpftrace hist() one-liner",
        }
    }
}

const BPFTRACE: &str = "tracepoint:syscalls:sys_enter_mount,tracepoint:syscalls:sys_enter_umount { @s[tid] = nsecs; } \
tracepoint:syscalls:sys_exit_mount,tracepoint:syscalls:sys_exit_umount /@s[tid]/ { @us = hist((nsecs - @s[tid]) / 1000); delete(@s[tid]); }";

/// Run count and run time (ns) of every loaded BPF program, by id.
fn programs() -> HashMap<u32, (u64, u64)> {
    aya::programs::loaded_programs()
        .flatten()
        .map(|p| (p.id(), (p.run_count(), p.run_time().as_nanos() as u64)))
        .collect()
}

struct Running {
    tracer: Tracer,
    /// The tracer's programs (loaded after it started) and their counters
    /// once it was attached.
    progs: HashMap<u32, (u64, u64)>,
    child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
}

/// Spawns a tracer and waits until it says it is attached.
fn start(tracer: Tracer, volmgr: &Path) -> Option<Running> {
    let (mut cmd, ready_on_stderr, ready) = match tracer {
        Tracer::None => return None,
        Tracer::Volmgr => {
            let mut c = Command::new(volmgr);
            c.args(["profile", "--duration", "1h", "--json"]);
            (c, true, "profiling")
        }
        Tracer::Mountsnoop => {
            let mut c = Command::new("stdbuf");
            c.args(["-oL", "mountsnoop"]);
            (c, false, "COMM")
        }
        Tracer::Bpftrace => {
            let mut c = Command::new("stdbuf");
            c.args(["-oL", "bpftrace", "-e", BPFTRACE]);
            (c, false, "Attaching")
        }
    };
    let before = programs();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", tracer.name()));
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    {
        let r: &mut dyn BufRead = if ready_on_stderr { &mut err } else { &mut out };
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap() == 0 {
                panic!("{} exited before attaching", tracer.name());
            }
            if line.contains(ready) {
                break;
            }
            first.push_str(&line);
        }
    }
    // bpftrace says "Attaching" just before attaching: let it finish.
    if tracer == Tracer::Bpftrace {
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let progs = programs()
        .into_iter()
        .filter(|(id, _)| !before.contains_key(id))
        .collect();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = first;
        err.read_to_string(&mut s).unwrap();
        s
    });
    Some(Running {
        tracer,
        progs,
        child,
        out,
        err,
    })
}

/// What a tracer delivered and cost.
#[derive(Debug, Default, Clone, Copy)]
struct Outcome {
    /// Events delivered for our paths (`None` if it cannot say).
    seen: Option<u64>,
    /// Losses the tracer reports itself.
    lost: Option<u64>,
    /// Its BPF programs' runs and run time while the loops ran.
    runs: u64,
    run_ns: u64,
}

fn stop(r: Running, dir: &Path) -> Outcome {
    let now = programs();
    let (mut runs, mut run_ns) = (0, 0);
    for (id, (c0, t0)) in &r.progs {
        if let Some((c1, t1)) = now.get(id) {
            runs += c1 - c0;
            run_ns += t1 - t0;
        }
    }
    let (seen, lost) = counts(r, dir);
    Outcome {
        seen,
        lost,
        runs,
        run_ns,
    }
}

/// Events the tracer delivered for our paths (`None` if it cannot say),
/// and the losses it reports itself.
fn counts(r: Running, dir: &Path) -> (Option<u64>, Option<u64>) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(r.child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let mut child = r.child;
    child.wait().unwrap();
    let out = r.out.join().unwrap();
    let err = r.err.join().unwrap();
    match r.tracer {
        Tracer::None => (None, None),
        Tracer::Volmgr => {
            let v: serde_json::Value = serde_json::from_str(&out)
                .unwrap_or_else(|e| panic!("volmgr profile output: {e}: {out} {err}"));
            (v["events"].as_u64(), v["events_lost"].as_u64())
        }
        Tracer::Mountsnoop => {
            let d = dir.to_str().unwrap();
            let n = out.lines().filter(|l| l.contains(d)).count() as u64;
            (Some(n), None)
        }
        Tracer::Bpftrace => {
            // Sum of the histogram's counts: lines like "[2, 4)  123 |@@@ |".
            let n = out
                .lines()
                .filter(|l| l.starts_with('['))
                .filter_map(|l| {
                    l.split_whitespace()
                        .find_map(|w| w.parse::<u64>().ok().filter(|_| !w.contains(',')))
                })
                .sum();
            (Some(n), None)
        }
    }
}

/// CPU time of the calling thread (user + system), ns: what the traced
/// thread itself pays, including the eBPF programs run in its syscalls,
/// without the time other processes on this shared machine took the CPU.
fn thread_cpu_ns() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

/// One loop of `n` pairs; (wall, thread CPU) nanoseconds per pair.
fn pairs(n: usize, bind: bool, src: &Path, target: &Path) -> (f64, f64) {
    let c = thread_cpu_ns();
    let t = Instant::now();
    for _ in 0..n {
        if bind {
            mount(
                Some(src),
                target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .unwrap();
        } else {
            mount(
                Some("tmpfs"),
                target,
                Some("tmpfs"),
                MsFlags::empty(),
                None::<&str>,
            )
            .unwrap();
        }
        umount2(target, MntFlags::empty()).unwrap();
    }
    let wall = t.elapsed().as_nanos() as f64 / n as f64;
    (wall, (thread_cpu_ns() - c) / n as f64)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let mut n = 20_000usize;
    let mut rounds = 5usize;
    let mut tracers = vec![
        Tracer::None,
        Tracer::Volmgr,
        Tracer::Mountsnoop,
        Tracer::Bpftrace,
    ];
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--n" => n = it.next().unwrap().parse().unwrap(),
            "--rounds" => rounds = it.next().unwrap().parse().unwrap(),
            "--volmgr-only" => tracers = vec![Tracer::None, Tracer::Volmgr],
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP tracer_overhead: needs root");
        return;
    }
    volmgr::sys::namespace::enter_private_mount_namespace().expect("private mount namespace");
    if !Path::new("/sys/kernel/tracing/events").is_dir() {
        // Only in this private namespace: mountsnoop and bpftrace need it.
        mount(
            Some("tracefs"),
            "/sys/kernel/tracing",
            Some("tracefs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount tracefs");
    }
    // BPF run-time statistics for the whole run, to measure each tracer's
    // programs exactly (they add two clock reads per program run, to every
    // tracer alike).
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("BPF_ENABLE_STATS");
    let volmgr = PathBuf::from(env!("CARGO_BIN_EXE_volmgr"));
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().canonicalize().unwrap();
    let (src, target) = (dir.join("src"), dir.join("t"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&target).unwrap();
    // Warm up.
    pairs(1000, false, &src, &target);
    pairs(1000, true, &src, &target);

    let k = tracers.len();
    // [tracer][tmpfs wall, tmpfs cpu, bind wall, bind cpu] per round
    let mut cost: Vec<[Vec<f64>; 4]> = vec![Default::default(); k];
    let mut seen: Vec<Vec<Option<u64>>> = vec![Vec::new(); k];
    let mut lost: Vec<Vec<Option<u64>>> = vec![Vec::new(); k];
    // BPF program time per traced syscall (enter + exit runs), ns.
    let mut prog: Vec<Vec<f64>> = vec![Vec::new(); k];
    for round in 0..rounds {
        for j in 0..k {
            // Rotate the order every round.
            let i = (j + round) % k;
            let t = tracers[i];
            let running = start(t, &volmgr);
            let a = pairs(n, false, &src, &target);
            let b = pairs(n, true, &src, &target);
            let o = running.map_or(Outcome::default(), |r| stop(r, &dir));
            let (s, l) = (o.seen, o.lost);
            prog[i].push(if o.runs > 0 {
                2.0 * o.run_ns as f64 / o.runs as f64
            } else {
                0.0
            });
            eprintln!(
                "round {round} {:<32} tmpfs {:6.2} us/pair (cpu {:6.2})  bind {:6.2} us/pair (cpu {:6.2})  events {:?} lost {:?} bpf {:.0} ns/syscall",
                t.name(),
                a.0 / 1e3,
                a.1 / 1e3,
                b.0 / 1e3,
                b.1 / 1e3,
                s,
                l,
                prog[i].last().copied().unwrap_or(0.0)
            );
            for (v, x) in cost[i].iter_mut().zip([a.0, a.1, b.0, b.1]) {
                v.push(x);
            }
            seen[i].push(s);
            lost[i].push(l);
        }
    }
    let med: Vec<[f64; 4]> = cost
        .iter()
        .map(|c| {
            [
                median(&mut c[0].clone()),
                median(&mut c[1].clone()),
                median(&mut c[2].clone()),
                median(&mut c[3].clone()),
            ]
        })
        .collect();
    println!(
        "\n{n} tmpfs pairs + {n} bind pairs per round, {rounds} rounds interleaved; expected events per round: {}",
        4 * n
    );
    println!("Per pair (mount + umount), median over rounds; \"cpu\" is the looping thread's own CPU time (user + system, so it includes the eBPF programs run in its syscalls but not the time other processes held the CPU); \"+\" is what the tracer adds over no tracer.\n");
    println!("| tracer | tmpfs wall | tmpfs cpu | + cpu | bind wall | bind cpu | + cpu | BPF programs per syscall | events delivered per round (min..max) | lost (tracer's own count) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for i in 0..k {
        let m = med[i];
        let s: Vec<u64> = seen[i].iter().flatten().copied().collect();
        let l: Vec<u64> = lost[i].iter().flatten().copied().collect();
        let range = |v: &[u64]| match (v.iter().min(), v.iter().max()) {
            (Some(a), Some(b)) => format!("{a}..{b}"),
            _ => "-".into(),
        };
        let short_rounds = s.iter().filter(|&&x| x < 4 * n as u64).count();
        println!(
            "| {} | {:.2} µs | {:.2} µs | {:+.2} µs | {:.2} µs | {:.2} µs | {:+.2} µs | {} | {}{} | {} |",
            tracers[i].name(),
            m[0] / 1e3,
            m[1] / 1e3,
            (m[1] - med[0][1]) / 1e3,
            m[2] / 1e3,
            m[3] / 1e3,
            (m[3] - med[0][3]) / 1e3,
            if i == 0 {
                "-".to_string()
            } else {
                format!("{:.0} ns", median(&mut prog[i].clone()))
            },
            range(&s),
            if s.is_empty() || short_rounds == 0 {
                String::new()
            } else {
                format!(" ({short_rounds} of {} rounds short)", s.len())
            },
            if l.is_empty() {
                "-".into()
            } else {
                format!("{} total", l.iter().sum::<u64>())
            }
        );
    }
}
