//! Benchmark of the core issue: N pods, each with one `emptyDir{medium: Memory}`,
//! mounted and torn down by `volmgr agent`, next to the physical limit measured
//! in the same run (a plain libc loop: one `mkdir(2)` per level of each
//! volume's path then `mount(2)` of its tmpfs with the agent's data, then
//! `umount2(2)` and one `rmdir(2)` per level, on the same paths under an
//! rshared ROOT like the agent's). Also the agent's idle CPU and RSS with
//! everything mounted.
//!
//! Runs in a private mount namespace it creates itself (re-executing itself),
//! so the host's mount table is never touched. Needs root. Each run (raw or
//! volmgr) gets a fresh tmpfs as its base directory, so both pay the same
//! directory-creation costs and no run inherits another's file-system state
//! (ext4's inode allocator slows down after mass deletions, which made
//! back-to-back rounds on disk differ by 2x).
//!
//! ```text
//! cargo bench -p volmgr-cli --bench mounts -- [--n 1000,10000] [--rounds 3] [--idle-secs 10]
//!     [--tracers off,auto] [--settle-ms 1000] [--baseline PATH]... [--raw-private]
//! ```
//!
//! `--raw-private` also times the raw loop under a private ROOT (no
//! rshared bind) in each round and prints its ratio to the rshared one:
//! what mount propagation costs the kernel.
//!
//! The manifests are removed `--settle-ms` after everything is mounted (or
//! after the idle measurement), so the teardown starts on a settled agent.
//!
//! `--baseline PATH` (repeatable) runs another agent binary (another build
//! of volmgr) beside this one in every round, so builds are compared in one
//! run.
//!
//! Each round runs the raw loop, then the agent once per `--tracers` entry
//! (its `--tracer` flag) and `--sources` entry, so the tracers' cost on a
//! mount storm is measured side by side with the core.
//!
//! `--sources` (default `startup-json`): how the N pods reach the agent.
//! `startup-*`: the manifests are in the directory when the agent starts,
//! and the clock runs from its spawn. `live-*`: the agent runs with an
//! empty directory and has synced; the manifests, already written in a
//! staging directory on the same file system, are renamed into it one by
//! one, and the clock runs from the first rename. `*-json`: one-line JSON;
//! `*-yaml`: block-style YAML as people write it. A `-4.18` suffix runs
//! that agent under the seccomp filter the tests use to emulate a 4.18
//! kernel (`openat2`, `listmount`, the new mount API: `ENOSYS`), so every
//! path under ROOT is resolved by the one-component-at-a-time walk instead
//! of `openat2`, side by side with the same source on this kernel.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Args {
    ns: Vec<usize>,
    rounds: usize,
    idle_secs: u64,
    tracers: Vec<String>,
    /// Other agent binaries to compare with, run in every round.
    baselines: Vec<String>,
    /// Pause between "all mounted" and removing the manifests.
    settle_ms: u64,
    /// How the pods reach the agent.
    sources: Vec<Source>,
    /// Also time the raw loop under a private ROOT (no rshared bind).
    raw_private: bool,
}

/// How the N pods reach the agent (`--sources`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Source {
    /// Renamed into the directory of a running agent (else present at start).
    live: bool,
    /// Block-style YAML (else one-line JSON).
    yaml: bool,
    /// Under the seccomp filter of a 4.18 kernel.
    older_kernel: bool,
}

impl Source {
    fn parse(s: &str) -> Self {
        let (base, older_kernel) = match s.strip_suffix("-4.18") {
            Some(b) => (b, true),
            None => (s, false),
        };
        let (live, yaml) = match base {
            "startup-json" => (false, false),
            "startup-yaml" => (false, true),
            "live-json" => (true, false),
            "live-yaml" => (true, true),
            other => panic!(
                "unknown source {other} (startup-json, startup-yaml, live-json, live-yaml, each with an optional -4.18)"
            ),
        };
        Self {
            live,
            yaml,
            older_kernel,
        }
    }

    fn label(self) -> String {
        let base = match (self.live, self.yaml) {
            (false, false) => "startup-json",
            (false, true) => "startup-yaml",
            (true, false) => "live-json",
            (true, true) => "live-yaml",
        };
        format!("{base}{}", if self.older_kernel { "-4.18" } else { "" })
    }

    fn file(self, i: usize) -> String {
        format!("pod-{i}.{}", if self.yaml { "yaml" } else { "json" })
    }
}

fn parse_args() -> Args {
    let mut a = Args {
        ns: vec![1000, 10_000],
        rounds: 3,
        idle_secs: 10,
        tracers: vec!["off".into(), "auto".into()],
        baselines: Vec::new(),
        settle_ms: 1000,
        sources: vec![Source::parse("startup-json")],
        raw_private: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--n" => {
                a.ns = it
                    .next()
                    .unwrap()
                    .split(',')
                    .map(|s| s.parse().unwrap())
                    .collect()
            }
            "--rounds" => a.rounds = it.next().unwrap().parse().unwrap(),
            "--idle-secs" => a.idle_secs = it.next().unwrap().parse().unwrap(),
            "--tracers" => a.tracers = it.next().unwrap().split(',').map(String::from).collect(),
            "--settle-ms" => a.settle_ms = it.next().unwrap().parse().unwrap(),
            "--baseline" => a.baselines.push(it.next().unwrap()),
            "--sources" => a.sources = it.next().unwrap().split(',').map(Source::parse).collect(),
            "--raw-private" => a.raw_private = true,
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn main() {
    if !common::in_private_mount_namespace() {
        return;
    }
    let args = parse_args();
    let base = tempfile::Builder::new()
        .prefix("volmgr-bench")
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
    // The empty agent of each tracer: a tracer's fixed memory (the eBPF ring
    // buffer and maps, the loader's leftovers) is not a cost per volume.
    let mut empty_rss = std::collections::HashMap::new();
    for t in &args.tracers {
        let rss = agent_baseline_rss(base.path(), t);
        println!("agent RSS with no pods, tracer {t}: {rss} KiB");
        empty_rss.insert(t.clone(), rss);
    }
    println!();
    println!("| N | tracer | raw mount (s) | volmgr mount (s) | ratio | raw teardown (s) | volmgr teardown (s) | ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    // (label, agent binary, tracer, source) of each agent run in a round.
    let mut variants: Vec<(String, String, String, Source)> = Vec::new();
    for src in &args.sources {
        let suffix = if args.sources.len() > 1 {
            format!(", {}", src.label())
        } else {
            String::new()
        };
        for t in &args.tracers {
            variants.push((
                format!("{t}{suffix}"),
                volmgr().to_string(),
                t.clone(),
                *src,
            ));
        }
        for b in &args.baselines {
            for t in &args.tracers {
                variants.push((format!("{t}{suffix} ({b})"), b.clone(), t.clone(), *src));
            }
        }
    }
    for &n in &args.ns {
        // Per variant: (raw mount, agent mount, raw teardown, agent teardown) per round.
        let mut rows: Vec<Vec<(f64, f64, f64, f64)>> = vec![Vec::new(); variants.len()];
        let mut idle = Vec::new();
        // (mount, teardown) of the raw loop under a private ROOT, per round.
        let mut private = Vec::new();
        for round in 0..args.rounds {
            let (rm, ru) = raw_loop(base.path(), n, round, true);
            if args.raw_private {
                let (pm, pu) = raw_loop(base.path(), n, round, false);
                eprintln!(
                    "n={n} round={round} raw loop, private ROOT: mount {pm:.3}s teardown {pu:.3}s"
                );
                private.push((pm / rm, pu / ru));
            }
            for (t, (label, bin, tracer, src)) in variants.iter().enumerate() {
                let measure_idle =
                    round == 0 && n == *args.ns.iter().max().unwrap() && *src == args.sources[0];
                let r = agent_run(
                    base.path(),
                    (n, round),
                    (bin, tracer, *src),
                    measure_idle.then_some(args.idle_secs),
                    Duration::from_millis(args.settle_ms),
                );
                if let Some(i) = r.idle {
                    idle.push((label.clone(), tracer.clone(), i));
                }
                eprintln!(
                    "n={n} round={round} tracer={label}: raw mount {rm:.3}s agent mount {:.3}s | raw teardown {ru:.3}s agent teardown {:.3}s",
                    r.mount, r.teardown
                );
                rows[t].push((rm, r.mount, ru, r.teardown));
            }
        }
        for ((tracer, _, _, _), rows) in variants.iter().zip(&rows) {
            let col = |f: fn(&(f64, f64, f64, f64)) -> f64| median(rows.iter().map(f).collect());
            println!(
                "| {n} | {tracer} | {:.3} | {:.3} | {:.2}x | {:.3} | {:.3} | {:.2}x |",
                col(|r| r.0),
                col(|r| r.1),
                col(|r| r.1 / r.0),
                col(|r| r.2),
                col(|r| r.3),
                col(|r| r.3 / r.2),
            );
        }
        if !private.is_empty() {
            println!();
            println!(
                "raw loop under a private ROOT (no rshared bind) / under the rshared one: mount {:.2}x, teardown {:.2}x",
                median(private.iter().map(|p| p.0).collect()),
                median(private.iter().map(|p| p.1).collect()),
            );
        }
        for (label, tracer, i) in idle {
            let empty = empty_rss.get(&tracer).copied().unwrap_or(0);
            let rss = i.rss_kib;
            println!();
            println!(
                "idle with N={n} mounted, tracer {label}: CPU {:.3}% of one core over the first {}s, {:.3}% over the next {}s; RSS {} KiB = {:.2} KiB per volume ({:.2} KiB per volume above the empty agent with the same tracer, {} KiB)",
                i.first * 100.0,
                args.idle_secs,
                i.steady * 100.0,
                args.idle_secs,
                rss,
                rss as f64 / n as f64,
                rss.saturating_sub(empty) as f64 / n as f64,
                empty
            );
        }
        println!();
    }
    println!(
        "(medians of {} interleaved rounds; ratio = volmgr / raw, per round)",
        args.rounds
    );
}

fn uid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

/// The directories of a volume's path below `ROOT/pods`, one a level, each
/// created by its own `mkdir(2)` and removed by its own `rmdir(2)` in the
/// raw loop (the agent creates and removes the same ones).
const LEVELS: [&str; 4] = [
    "", // pods/<uid>
    "/volumes",
    "/kubernetes.io~empty-dir",
    "/cache",
];

/// The agent's `mount(2)` data for the benchmark's pods: their `sizeLimit`
/// (16Mi), below the node's memory, in bytes.
const TMPFS_DATA: &std::ffi::CStr = c"size=16777216";

/// The physical limit, as tight as the kernel allows: for each volume one
/// `mkdir(2)` per level of its path then `mount(2)` of a tmpfs with the
/// agent's data; then `umount2(2)` (with the agent's `UMOUNT_NOFOLLOW`)
/// and one `rmdir(2)` per level, deepest first. Plain libc calls on
/// absolute paths built in one reused buffer, from one thread, on a fresh
/// tmpfs whose ROOT is made rshared like the agent's (a bind onto itself,
/// before the clock), so both pay the same propagation costs.
fn raw_loop(base: &Path, n: usize, round: usize, rshared: bool) -> (f64, f64) {
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    let area = fresh_tmpfs(&base.join(format!("raw-{round}")));
    let root = area.join("root");
    std::fs::create_dir(&root).unwrap();
    if rshared {
        make_rshared(&root);
    }
    let mut prefix = root.as_os_str().as_bytes().to_vec();
    prefix.extend_from_slice(b"/pods");
    let mut buf: Vec<u8> = Vec::with_capacity(prefix.len() + 128);
    // The end of each level in `buf`, for the rmdirs back up.
    let mut ends = [0usize; LEVELS.len()];
    // `buf` as the NUL-terminated path of its first `len` bytes.
    let c_path = |buf: &mut Vec<u8>, len: usize| {
        buf.truncate(len);
        buf.push(0);
        buf.as_ptr().cast::<libc::c_char>()
    };
    let volume = |buf: &mut Vec<u8>, ends: &mut [usize; LEVELS.len()], i: usize| {
        buf.clear();
        buf.extend_from_slice(&prefix);
        write!(buf, "/00000000-0000-4000-8000-{i:012}").unwrap();
        for (end, level) in ends.iter_mut().zip(LEVELS) {
            buf.extend_from_slice(level.as_bytes());
            *end = buf.len();
        }
    };
    let check = |rc: libc::c_int, call: &str| {
        assert_eq!(rc, 0, "{call}: {}", std::io::Error::last_os_error());
    };
    let t = Instant::now();
    let mut pods = prefix.clone();
    // SAFETY (every libc call below): the paths are NUL-terminated buffers
    // that live across the call; the other arguments are constants.
    check(
        unsafe { libc::mkdir(c_path(&mut pods, prefix.len()), 0o750) },
        "mkdir pods",
    );
    for i in 0..n {
        // Each level appended, then made.
        buf.clear();
        buf.extend_from_slice(&prefix);
        write!(buf, "/00000000-0000-4000-8000-{i:012}").unwrap();
        for level in LEVELS {
            buf.extend_from_slice(level.as_bytes());
            buf.push(0);
            check(unsafe { libc::mkdir(buf.as_ptr().cast(), 0o750) }, "mkdir");
            buf.pop();
        }
        buf.push(0);
        check(
            unsafe {
                libc::mount(
                    c"tmpfs".as_ptr(),
                    buf.as_ptr().cast(),
                    c"tmpfs".as_ptr(),
                    0,
                    TMPFS_DATA.as_ptr().cast(),
                )
            },
            "mount",
        );
    }
    let mount = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..n {
        volume(&mut buf, &mut ends, i);
        let p = c_path(&mut buf, ends[LEVELS.len() - 1]);
        check(
            unsafe { libc::umount2(p, libc::UMOUNT_NOFOLLOW) },
            "umount2",
        );
        for &end in ends.iter().rev() {
            let p = c_path(&mut buf, end);
            check(unsafe { libc::rmdir(p) }, "rmdir");
        }
    }
    let teardown = t.elapsed().as_secs_f64();
    drop_tmpfs(&area);
    (mount, teardown)
}

/// Binds `dir` onto itself and makes it rshared, as the agent does with
/// its ROOT at start-up (`LinuxMounter::make_rshared`).
fn make_rshared(dir: &Path) {
    use nix::mount::{mount, MsFlags};
    mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .unwrap();
}

/// Mounts a new tmpfs on `dir` (created if needed).
fn fresh_tmpfs(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    dir.to_path_buf()
}

fn drop_tmpfs(dir: &Path) {
    // Detached with whatever is left below it: the agent binds its ROOT onto
    // itself to make it rshared, and that bind outlives the agent.
    nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH).unwrap();
    std::fs::remove_dir(dir).unwrap();
}

fn manifest(i: usize, yaml: bool) -> String {
    if yaml {
        return format!(
            "apiVersion: v1
kind: Pod
metadata:
  name: pod-{i}
  namespace: bench
  uid: {uid}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - name: cache
      mountPath: /cache
  volumes:
  - name: cache
    emptyDir:
      medium: Memory
      sizeLimit: 16Mi
",
            uid = uid(i)
        );
    }
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i}"), "namespace": "bench", "uid": uid(i)},
        "spec": {
            "containers": [{"name": "app", "image": "busybox", "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
            "volumes": [{"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]
        }
    })
    .to_string()
}

struct AgentResult {
    mount: f64,
    teardown: f64,
    idle: Option<Idle>,
}

/// The agent's idle cost with everything mounted.
struct Idle {
    /// CPU share of one core over the first window after all mounted: its
    /// resync is the first since the mount storm (the table changed).
    first: f64,
    /// Over the next window: a steady idle agent, whose resync finds the
    /// mount table unchanged.
    steady: f64,
    /// RSS at the end, KiB.
    rss_kib: u64,
}

fn volmgr() -> &'static str {
    env!("CARGO_BIN_EXE_volmgr")
}

/// Starts an agent whose resync and manifests rescan both run every
/// `safety_nets` (the idle window's length).
fn spawn_agent(
    bin: &str,
    root: &Path,
    manifests: &Path,
    tracer: &str,
    safety_nets: Duration,
    older_kernel: bool,
) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let period = format!("{}ms", safety_nets.as_millis());
    let mut cmd = Command::new(bin);
    if older_kernel {
        // SAFETY: only the seccomp(2) call between fork and exec.
        unsafe {
            cmd.pre_exec(|| Ok(volmgr::sys::seccomp::emulate_older_kernel()?));
        }
    }
    cmd.arg("agent")
        .arg("--root")
        .arg(root)
        .arg("--manifests")
        .arg(manifests)
        // Both safety nets fire inside each 10 s idle window, so each idle
        // figure includes one resync and one manifests rescan.
        .args(["--resync-period", &period, "--rescan-period", &period])
        .args(["--tracer", tracer])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn wait_all(bin: &str, root: &Path, pods: usize) {
    let st = Command::new(bin)
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

fn stop(mut child: std::process::Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    child.wait().unwrap();
}

fn agent_run(
    base: &Path,
    (n, round): (usize, usize),
    (bin, tracer, src): (&str, &str, Source),
    idle_secs: Option<u64>,
    settle: Duration,
) -> AgentResult {
    let area = fresh_tmpfs(&base.join(format!("agent-{round}")));
    let root = area.join("root");
    let manifests = area.join("manifests");
    let staging = area.join("staging");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::create_dir_all(&staging).unwrap();
    let written = if src.live { &staging } else { &manifests };
    for i in 0..n {
        std::fs::write(written.join(src.file(i)), manifest(i, src.yaml)).unwrap();
    }
    let spawned = Instant::now();
    let child = spawn_agent(
        bin,
        &root,
        &manifests,
        tracer,
        Duration::from_secs(idle_secs.unwrap_or(10)),
        src.older_kernel,
    );
    let t = if src.live {
        wait_all(bin, &root, 0);
        let t = Instant::now();
        for i in 0..n {
            std::fs::rename(staging.join(src.file(i)), manifests.join(src.file(i))).unwrap();
        }
        t
    } else {
        spawned
    };
    wait_all(bin, &root, n);
    let mount = t.elapsed().as_secs_f64();
    assert_eq!(count_mounts(&root), n);
    let idle = idle_secs.map(|secs| {
        let pid = child.id();
        let window = || {
            let c0 = cpu_ns(pid);
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs(secs));
            (cpu_ns(pid) - c0) as f64 / t0.elapsed().as_nanos() as f64
        };
        std::thread::sleep(Duration::from_secs(1));
        let first = window();
        let steady = window();
        Idle {
            first,
            steady,
            rss_kib: rss_kib(pid),
        }
    });
    // Pods are deleted on a settled agent, as on a node, not in the
    // milliseconds after the storm that mounted them (see BENCHMARKS.md).
    std::thread::sleep(settle);
    let t = Instant::now();
    for i in 0..n {
        std::fs::remove_file(manifests.join(src.file(i))).unwrap();
    }
    let t_unlinked = t.elapsed().as_secs_f64();
    wait_all(bin, &root, 0);
    let t_waited = t.elapsed().as_secs_f64();
    while std::fs::read_dir(root.join("pods"))
        .unwrap()
        .next()
        .is_some()
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let teardown = t.elapsed().as_secs_f64();
    eprintln!(
        "  teardown: manifests removed at {t_unlinked:.4}s, `wait` returned at {t_waited:.4}s, pod directories gone at {teardown:.4}s"
    );
    assert_eq!(count_mounts(&root), 0);
    stop(child);
    drop_tmpfs(&area);
    AgentResult {
        mount,
        teardown,
        idle,
    }
}

/// RSS of an agent with no pods and the given tracer, once settled (`auto`
/// loads its eBPF program about 50 ms after start-up settles).
fn agent_baseline_rss(base: &Path, tracer: &str) -> u64 {
    let area = fresh_tmpfs(&base.join("agent-empty"));
    let root = area.join("root");
    let manifests = area.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let child = spawn_agent(
        volmgr(),
        &root,
        &manifests,
        tracer,
        Duration::from_secs(10),
        false,
    );
    wait_all(volmgr(), &root, 0);
    std::thread::sleep(Duration::from_millis(2000));
    let rss = rss_kib(child.id());
    stop(child);
    drop_tmpfs(&area);
    rss
}

/// Mounts below `root` (not ROOT itself, which an agent binds onto itself
/// to make it rshared).
fn count_mounts(root: &Path) -> usize {
    let root = root.canonicalize().unwrap();
    volmgr::sys::mountinfo::read_self()
        .unwrap()
        .iter()
        .filter(|m| m.mount_point.starts_with(&root) && m.mount_point != root)
        .count()
}

/// CPU time (user + system) of the whole process `pid`, including threads
/// that have exited, in ns (from /proc/PID/stat, in clock ticks).
/// CPU time of the whole process `pid` (every thread, those that exited
/// included), to the nanosecond: its CPU-time clock (`clock_getcpuclockid`).
/// `/proc/PID/stat` counts in clock ticks (10 ms), too coarse for the
/// 100 ms that 1 % of a 10 s window is.
fn cpu_ns(pid: u32) -> u64 {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: writes one clockid_t into `clock`.
    let r = unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) };
    assert_eq!(r, 0, "clock_getcpuclockid({pid})");
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec into `ts`.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(cpu clock of {pid})");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}
