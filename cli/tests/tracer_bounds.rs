//! The eBPF tracer against unprivileged attackers (uid 65534, some in a
//! user and mount namespace of their own), with the real agent in a private
//! mount namespace (issue 40, §1 and §2):
//!
//! - `mount(2)` with thousands of distinct file system types (escape
//!   sequences among them) on a pod's volume path, under the comm
//!   `kubelet`: the agent's memory and status stay bounded, nothing raw is
//!   printed, and the calls are not in the pod's timeline;
//! - 2,100 failing calls on invented pod paths do not evict a pod's real
//!   timeline;
//! - threads parked in `statfs` on a hung FUSE mount the attacker made at
//!   a pod's volume path in its own namespaces: a root call whose in-flight
//!   slot one of them holds is still traced, the stuck list and its log
//!   stay bounded, and the pod has no stuck call (`doctor --pod` exits 0).
//!
//! Needs root, BPF and (for the FUSE attack) `/dev/fuse` and user
//! namespaces; skips with the reason otherwise (CI is root).

// Test code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::HashSet;
use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::{isolated, pod_yaml, volmgr_bin, Env};
use volmgr::tracer::timeline::PodTimeline;

const NOBODY: libc::uid_t = 65534;
/// Set for the re-executed test binary that plays the FUSE attacker.
const ATTACKER_ENV: &str = "VOLMGR_TEST_FUSE_ATTACKER";
/// Threads the FUSE attacker parks in `statfs` (`VOLMGR_TEST_PARKED`
/// overrides it for a measurement: the attack parks 16,384).
fn parked() -> usize {
    std::env::var("VOLMGR_TEST_PARKED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}
/// The agent's memory bound under each attack (issue 40).
const MAX_RSS_KIB: u64 = 256 * 1024;

fn ebpf_unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root".into());
    }
    match volmgr::ebpf::EbpfTracer::load(volmgr::ebpf::TraceFilter { mnt_ns: None }) {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
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

fn doctor(env: &Env, pod: &str) -> (PodTimeline, i32) {
    let out = Command::new(volmgr_bin())
        .args(["doctor", "--json", "--pod", pod, "--root"])
        .arg(&env.root)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 1,
        "doctor failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (serde_json::from_slice(&out.stdout).unwrap(), code)
}

/// The agent's peak resident set (`VmHWM`), KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Forks a child that runs `probe` as uid/gid 65534 with the comm
/// `kubelet`, and waits for it. `probe` makes raw system calls only.
fn as_nobody_kubelet(probe: impl FnOnce()) {
    // SAFETY: the child only makes async-signal-safe calls, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: plain system calls in the child.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
                || libc::prctl(libc::PR_SET_NAME, c"kubelet".as_ptr()) != 0
            {
                libc::_exit(100);
            }
            probe();
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(libc::WEXITSTATUS(status), 0, "the attacker ran");
}

/// Root mounts a tmpfs on `dir` and unmounts it (util-linux, another
/// process than the agent), and waits until both calls are in pod
/// `test/web`'s timeline of volume `data`: every event before them has
/// been handled too.
fn root_calls_reach_the_timeline(env: &Env, dir: &Path, label: &str) -> PodTimeline {
    for (cmd, args) in [("mount", vec!["-t", "tmpfs", label]), ("umount", vec![])] {
        let st = Command::new(cmd).args(&args).arg(dir).status().unwrap();
        assert!(st.success(), "{cmd} {args:?}");
    }
    let mut t = PodTimeline::default();
    env.wait_for("root's calls in the pod's timeline", || {
        t = doctor(env, "test/web").0;
        t.volumes.iter().any(|v| {
            v.key.volume == "data"
                && v.entries
                    .iter()
                    .any(|e| e.call == "mount" && e.source.as_deref() == Some(label))
        })
    });
    t
}

fn assert_no_attacker_entries(t: &PodTimeline) {
    for v in &t.volumes {
        for e in &v.entries {
            assert_ne!(e.comm, "kubelet", "an unprivileged call in {v:#?}");
        }
    }
}

#[test]
fn distinct_fstypes_from_nobody_do_not_grow_the_agent() {
    let name = "distinct_fstypes_from_nobody_do_not_grow_the_agent";
    if let Some(why) = ebpf_unavailable() {
        eprintln!("SKIP {name}: {why}");
        return;
    }
    isolated(name, || {
        let env = Env::new();
        let agent = start_ebpf_agent(&env, &[]);
        let data = env.root.join("pods/uid-web/volumes/example.com~test/data");
        std::fs::create_dir_all(&data).unwrap();
        root_calls_reach_the_timeline(&env, &data, "before");
        // The real emptyDir volume's path, as `kubelet`, 4,000 types.
        let victim = env
            .root
            .join("pods/uid-web/volumes/kubernetes.io~empty-dir/d");
        let target = CString::new(victim.as_os_str().as_encoded_bytes()).unwrap();
        let types: Vec<CString> = (0..4000)
            .map(|i| CString::new(format!("\x1b]0;fs{i}\x07\x1b[2J")).unwrap())
            .collect();
        let cpu = CpuMeter::start(agent.child.id());
        as_nobody_kubelet(|| {
            for t in &types {
                // SAFETY: prepared C strings; the call fails with EPERM.
                unsafe {
                    libc::mount(
                        c"x".as_ptr(),
                        target.as_ptr(),
                        t.as_ptr(),
                        0,
                        std::ptr::null(),
                    )
                };
            }
        });
        let t = root_calls_reach_the_timeline(&env, &data, "after");
        let rss = peak_rss_kib(agent.child.id());
        eprintln!(
            "peak RSS after 4,000 fstypes: {rss} KiB; agent CPU from the attack's start to its last event handled: {}",
            cpu.report()
        );
        assert!(rss <= MAX_RSS_KIB, "peak RSS {rss} KiB");
        let status = env.status();
        assert!(
            status.syscalls.len() <= 2 * 9 * (volmgr::ebpf::fstypes::KNOWN.len() + 2),
            "{} syscall rows",
            status.syscalls.len()
        );
        let text = Command::new(volmgr_bin())
            .args(["status", "--root"])
            .arg(&env.root)
            .output()
            .unwrap();
        assert!(text.status.success());
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(!text.contains('\x1b'), "raw escapes in status:\n{text}");
        let m = env.metrics_text();
        assert!(!m.contains('\x1b'), "raw escapes in the metrics");
        let failures: u64 = m
            .lines()
            .find_map(|l| {
                l.strip_prefix(
                    "volmgr_mount_syscall_unprivileged_failures_total{syscall=\"mount\"} ",
                )
            })
            .unwrap()
            .parse()
            .unwrap();
        assert!(failures >= 4000, "{failures}");
        assert_no_attacker_entries(&t);
        drop(agent);
    });
}

#[test]
fn invented_pod_paths_do_not_evict_or_forge_a_pods_timeline() {
    let name = "invented_pod_paths_do_not_evict_or_forge_a_pods_timeline";
    if let Some(why) = ebpf_unavailable() {
        eprintln!("SKIP {name}: {why}");
        return;
    }
    isolated(name, || {
        let env = Env::new();
        let agent = start_ebpf_agent(&env, &[]);
        let data = env.root.join("pods/uid-web/volumes/example.com~test/data");
        std::fs::create_dir_all(&data).unwrap();
        root_calls_reach_the_timeline(&env, &data, "real");
        let victim = CString::new(data.as_os_str().as_encoded_bytes()).unwrap();
        let invented: Vec<CString> = (0..2100)
            .map(|i| {
                let p = env
                    .root
                    .join(format!("pods/fake-{i}/volumes/example.com~x/v"));
                CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
            })
            .collect();
        as_nobody_kubelet(|| {
            for p in invented.iter().chain(std::iter::once(&victim)) {
                // SAFETY: prepared C strings; the calls fail (EPERM, ENOENT).
                unsafe {
                    libc::mount(
                        c"x".as_ptr(),
                        p.as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        std::ptr::null(),
                    );
                    libc::umount2(p.as_ptr(), 0);
                }
            }
        });
        let t = root_calls_reach_the_timeline(&env, &data, "later");
        assert_no_attacker_entries(&t);
        let v = t.volumes.iter().find(|v| v.key.volume == "data").unwrap();
        assert!(
            v.entries
                .iter()
                .any(|e| e.source.as_deref() == Some("real")),
            "the first calls were not evicted: {v:#?}"
        );
        drop(agent);
    });
}

/// The FUSE attacker, re-executed as uid 65534 by the test below with the
/// FUSE device node and the target in [`ATTACKER_ENV`] (`NODE PATH`):
/// enters a user and mount namespace of its own, mounts a FUSE file system
/// that never answers at PATH, parks [`parked`] threads in `statfs` on it
/// and prints their thread ids. Does nothing when not re-executed.
#[test]
fn fuse_attacker() {
    let Ok(spec) = std::env::var(ATTACKER_ENV) else {
        return;
    };
    // In its own user and mount namespace already (see `enter_own_userns`).
    let (node, target) = spec.split_once(' ').unwrap();
    // Opened here: FUSE takes only a descriptor opened in the mounter's
    // user namespace.
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(node)
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
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..parked() {
        let (tx, target) = (tx.clone(), target.to_string());
        std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                tx.send(nix::unistd::gettid().as_raw()).unwrap();
                // Never answered: blocks until the process is killed.
                let _ = nix::sys::statfs::statfs(target.as_str());
            })
            .unwrap();
    }
    let tids: Vec<String> = (0..parked())
        .map(|_| rx.recv().unwrap().to_string())
        .collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "parked {}", tids.join(" ")).unwrap();
    out.flush().unwrap();
    drop(out);
    loop {
        std::thread::park();
    }
}

/// In a child between fork and exec, as uid 65534: a user and mount
/// namespace of its own, where it is root (`0 65534 1`). Raw system calls
/// on constant strings only.
fn enter_own_userns() -> std::io::Result<()> {
    // SAFETY: plain system calls on NUL-terminated constants.
    unsafe {
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        for (file, text) in [
            (c"/proc/self/setgroups", &b"deny"[..]),
            (c"/proc/self/uid_map", &b"0 65534 1"[..]),
            (c"/proc/self/gid_map", &b"0 65534 1"[..]),
        ] {
            let f = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if f < 0 || libc::write(f, text.as_ptr().cast(), text.len()) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(f);
        }
    }
    Ok(())
}

/// Makes every directory from `/` down to `dir` searchable by others.
fn searchable(dir: &Path) {
    for a in dir.ancestors() {
        let Ok(m) = std::fs::metadata(a) else {
            continue;
        };
        let mut p = m.permissions();
        p.set_mode(p.mode() | 0o711);
        let _ = std::fs::set_permissions(a, p);
    }
}

/// Mounts and unmounts a tmpfs on `dir` from a thread whose id is equal to
/// one of `tids` modulo the in-flight slots (so that its slot is held);
/// returns that thread's id.
fn from_a_thread_whose_slot_is_held(tids: &HashSet<u32>, dir: &Path) -> u32 {
    let slots = volmgr::ebpf::wire::IN_FLIGHT_SLOTS;
    let held: HashSet<u32> = tids.iter().map(|t| t % slots).collect();
    for _ in 0..1_000_000 {
        let (held, dir) = (held.clone(), dir.to_path_buf());
        let h = std::thread::spawn(move || {
            let tid = nix::unistd::gettid().as_raw() as u32;
            if !held.contains(&(tid % slots)) {
                return None;
            }
            nix::mount::mount(
                Some("collide"),
                &dir,
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .unwrap();
            nix::mount::umount2(&dir, nix::mount::MntFlags::empty()).unwrap();
            Some(tid)
        });
        if let Some(tid) = h.join().unwrap() {
            return tid;
        }
    }
    panic!("no thread id shared a slot with the parked threads");
}

/// A child killed (and reaped) when dropped, also when the test fails: its
/// parked threads hold the harness's output open.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn metric(m: &str, name: &str) -> u64 {
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} in\n{m}"))
        .parse()
        .unwrap()
}

/// With `VOLMGR_TEST_MEASURE_SECS` set (run directly), prints the agent's
/// CPU use over that many seconds while the threads stay parked.
#[test]
fn threads_parked_in_statfs_do_not_blind_the_tracer_nor_blame_a_pod() {
    let name = "threads_parked_in_statfs_do_not_blind_the_tracer_nor_blame_a_pod";
    if let Some(why) = ebpf_unavailable() {
        eprintln!("SKIP {name}: {why}");
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP {name}: no /dev/fuse");
        return;
    }
    isolated(name, || {
        let env = Env::new();
        let agent = start_ebpf_agent(&env, &["--stuck-syscall-after", "1s"]);
        let data = env.root.join("pods/uid-web/volumes/example.com~test/data");
        std::fs::create_dir_all(&data).unwrap();
        let victim: PathBuf = env
            .root
            .join("pods/uid-web/volumes/kubernetes.io~empty-dir/d");
        searchable(&victim);
        // The FUSE device, open to everyone as a node's /dev/fuse is
        // (this host's is 0600): a node of its own in the test's directory.
        let node = env.dir.path().join("fuse");
        nix::sys::stat::mknod(
            &node,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(10, 229),
        )
        .unwrap();
        std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o666)).unwrap();
        searchable(&node);
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "fuse_attacker",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            ATTACKER_ENV,
            format!("{} {}", node.display(), victim.display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(NOBODY) != 0
                    || libc::setuid(NOBODY) != 0
                    // Dumpable again (a change of uid clears it), so that
                    // its /proc/self files are its own to write.
                    || libc::prctl(libc::PR_SET_DUMPABLE, 1) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                enter_own_userns()
            });
        }
        let mut attacker = Killed(cmd.spawn().unwrap());
        // After the harness's own output (`test fuse_attacker ... `).
        let line = BufReader::new(attacker.0.stdout.take().unwrap())
            .lines()
            .map(Result::unwrap)
            .find_map(|l| Some(l.split_once("parked ")?.1.to_string()))
            .expect("the attacker parked its threads");
        let tids: HashSet<u32> = line
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(tids.len(), parked());
        env.wait_for("the parked calls stuck", || {
            metric(&env.metrics_text(), "volmgr_mount_syscalls_stuck") >= parked() as u64
        });

        // Blinding: a root call whose open slot a parked thread holds.
        let tid = from_a_thread_whose_slot_is_held(&tids, &data);
        let mut t = PodTimeline::default();
        env.wait_for("the colliding root call traced", || {
            t = doctor(&env, "test/web").0;
            t.volumes
                .iter()
                .flat_map(|v| &v.entries)
                .any(|e| e.tid == tid && e.call == "umount2")
        });

        // Bounded list and log; nothing against the pod.
        let status = env.status();
        assert!(
            status.stuck_syscalls.len() <= volmgr::tracer::stuck::MAX_STUCK_LISTED,
            "{} listed",
            status.stuck_syscalls.len()
        );
        assert!(
            status.stuck_syscalls.iter().all(|s| s.pod_uid.is_none()),
            "an unprivileged call in its own namespace placed on a pod"
        );
        let m = env.metrics_text();
        assert!(
            metric(&m, "volmgr_mount_syscalls_stuck_not_listed") > 0,
            "{m}"
        );
        let (t, code) = doctor(&env, "test/web");
        assert_eq!(code, 0, "the pod has no stuck call: {t:#?}");
        // The attacker's calls logged, each thread once at most: other
        // tests running beside this one park calls of their own (root's,
        // which go first), which may push one of these out of the listed
        // 64 and back in (logged again).
        let logged: HashSet<u32> = agent
            .log()
            .lines()
            .filter(|l| l.contains("syscall stuck in the kernel"))
            .filter_map(|l| {
                let t = l.split_once("tid=")?.1;
                t.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
            })
            .filter(|t| tids.contains(t))
            .collect();
        assert!(
            logged.len() <= volmgr::tracer::stuck::MAX_STUCK_LISTED,
            "{} of the attacker's stuck calls logged",
            logged.len()
        );
        let rss = peak_rss_kib(agent.child.id());
        eprintln!("peak RSS with {} parked statfs: {rss} KiB", parked());
        if let Some(secs) = std::env::var("VOLMGR_TEST_MEASURE_SECS")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        {
            let cpu = CpuMeter::start(agent.child.id());
            std::thread::sleep(std::time::Duration::from_secs(secs));
            eprintln!(
                "agent CPU with {} parked statfs: {}; peak RSS {} KiB",
                parked(),
                cpu.report(),
                peak_rss_kib(agent.child.id())
            );
        }
        assert!(rss <= MAX_RSS_KIB, "peak RSS {rss} KiB");

        drop(attacker);
        drop(agent);
    });
}

/// File system tools run by uid 65534 (this many) in the test below.
const FAKE_TOOLS: usize = 2500;
/// Mounts added to the agent's mount table in the test below.
const EXTRA_MOUNTS: usize = 3000;

/// Processes killed (their group) and reaped when dropped.
struct Group(Vec<std::process::Child>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(first) = self.0.first() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(first.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// `n` processes named `mkfs.attack` (a link to `tail`, following
/// `/dev/null` for ever) run as uid 65534, in one process group.
fn fake_tools(env: &Env, n: usize) -> Group {
    let link = env.dir.path().join("mkfs.attack");
    let tail = ["/usr/bin/tail", "/bin/tail"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap();
    std::os::unix::fs::symlink(tail, &link).unwrap();
    searchable(&link);
    let mut g = Group(Vec::new());
    for _ in 0..n {
        let pgid = g.0.first().map_or(0, |c| c.id() as i32);
        let child = Command::new(&link)
            .args(["-f", "/dev/null"])
            .uid(NOBODY)
            .gid(NOBODY)
            .process_group(pgid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        g.0.push(child);
    }
    g
}

/// Adds [`EXTRA_MOUNTS`] bind mounts (of an empty directory) to this
/// mount namespace, the agent's; their mount points.
fn many_mounts(env: &Env) -> Vec<PathBuf> {
    let src = env.outside.join("empty");
    std::fs::create_dir_all(&src).unwrap();
    (0..EXTRA_MOUNTS)
        .map(|i| {
            let p = env.outside.join(format!("m{i}"));
            std::fs::create_dir(&p).unwrap();
            nix::mount::mount(
                Some(&src),
                &p,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .unwrap();
            p
        })
        .collect()
}

/// The agent's CPU use from [`CpuMeter::start`] on (printed by the
/// tests run directly; no assertion on it).
struct CpuMeter {
    pid: u32,
    ticks: u64,
    at: std::time::Instant,
}

impl CpuMeter {
    fn start(pid: u32) -> CpuMeter {
        CpuMeter {
            pid,
            ticks: cpu_ticks(pid),
            at: std::time::Instant::now(),
        }
    }

    /// "X % of a core over Y s".
    fn report(&self) -> String {
        let used = cpu_ticks(self.pid) - self.ticks;
        let secs = self.at.elapsed().as_secs_f64();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        format!(
            "{:.1} % of a core over {secs:.1} s",
            used as f64 / hz / secs * 100.0
        )
    }
}

/// The agent's CPU time (user + system), clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = s.rsplit_once(')').unwrap();
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state is field 3, utime 14, stime 15.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// 2,500 processes named `mkfs.*` run by uid 65534, with a 3,000-line
/// mount table: root's hung `fsck.hung` on the pod's volume is still
/// reported (with its volume), the stuck list stays bounded with the root
/// run in it, and no attacker run is placed on a pod. Before: the kernel
/// program's one 1,024-entry LRU table of tools running let the
/// attackers evict root's run (never reported again), status listed
/// every attacker, and the mount table was parsed again per attacker's
/// `/dev/` argument every second (98 % of a core). With
/// `VOLMGR_TEST_MEASURE_SECS` set, prints the agent's CPU use over that
/// many seconds under the attack.
#[test]
fn tools_named_mkfs_by_nobody_do_not_evict_roots_stuck_tool() {
    let name = "tools_named_mkfs_by_nobody_do_not_evict_roots_stuck_tool";
    if let Some(why) = ebpf_unavailable() {
        eprintln!("SKIP {name}: {why}");
        return;
    }
    isolated(name, || {
        let env = Env::new();
        let agent = start_ebpf_agent(&env, &["--stuck-tool-after", "1s"]);
        let mounts = many_mounts(&env);
        let volume = env
            .root
            .join("pods/uid-web/volumes/kubernetes.io~empty-dir/d");
        let tool = env.dir.path().join("fsck.hung");
        std::fs::write(&tool, "#!/bin/sh\nsleep 3600 &\nwait\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root_tool = Group(vec![Command::new(&tool)
            .arg(&volume)
            .process_group(0)
            .spawn()
            .unwrap()]);
        let pid = root_tool.0[0].id();
        env.wait_for("root's tool reported as stuck", || {
            env.status().stuck_tools.iter().any(|t| t.pid == pid)
        });
        let attackers = fake_tools(&env, FAKE_TOOLS);
        // Every attacker has run (evictions are done); once they are
        // listed, the list has been made with them all.
        env.wait_for("the attackers' runs listed as stuck", || {
            let s = env.status();
            s.stuck_tools
                .iter()
                .filter(|t| t.comm == "mkfs.attack")
                .count()
                >= 32
        });
        if let Some(secs) = std::env::var("VOLMGR_TEST_MEASURE_SECS")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        {
            let before = cpu_ticks(agent.child.id());
            std::thread::sleep(std::time::Duration::from_secs(secs));
            let used = cpu_ticks(agent.child.id()) - before;
            // SAFETY: sysconf has no preconditions.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            eprintln!(
                "agent CPU under {FAKE_TOOLS} fake tools, {EXTRA_MOUNTS} mounts: {:.1} % of a core over {secs} s",
                used as f64 / hz / secs as f64 * 100.0
            );
        }
        let status = env.status();
        let listed = status.stuck_tools.len();
        let root_run: Vec<_> = status.stuck_tools.iter().filter(|t| t.pid == pid).collect();
        assert_eq!(root_run.len(), 1, "root's tool evicted ({listed} listed)");
        assert_eq!(root_run[0].pod_uid.as_deref(), Some("uid-web"));
        assert_eq!(root_run[0].volume.as_deref(), Some("d"));
        assert!(
            listed <= volmgr::tracer::stuck::MAX_STUCK_TOOLS_LISTED,
            "{listed} listed"
        );
        assert!(
            status
                .stuck_tools
                .iter()
                .all(|t| t.pid == pid || t.pod_uid.is_none()),
            "an attacker's run placed on a pod"
        );
        env.wait_for("the attackers' runs counted, not listed", || {
            metric(&env.metrics_text(), "volmgr_fs_tools_stuck_not_listed") > 0
        });
        let (t, code) = doctor(&env, "test/web");
        assert_eq!(code, 1, "root's stuck tool is the pod's: {t:#?}");
        assert!(t.stuck_tools.iter().any(|x| x.pid == pid), "{t:#?}");
        let logged = agent
            .log()
            .lines()
            .filter(|l| l.contains("file system tool running longer than --stuck-tool-after"))
            .count();
        // Root's run, once; the attackers' in one line for them all.
        assert_eq!(logged, 1, "stuck tools logged one by one");
        let rss = peak_rss_kib(agent.child.id());
        eprintln!("peak RSS with {FAKE_TOOLS} fake tools: {rss} KiB");
        assert!(rss <= MAX_RSS_KIB, "peak RSS {rss} KiB");
        drop(attackers);
        drop(root_tool);
        for p in mounts {
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        }
        drop(agent);
    });
}

/// `volmgr status --json` of the agent whose state directory is `state`.
fn status_at(state: &Path) -> serde_json::Value {
    let out = Command::new(volmgr_bin())
        .args(["status", "--json", "--root"])
        .arg(state)
        .output()
        .unwrap();
    if !out.status.success() {
        return serde_json::Value::Null;
    }
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A FUSE file system that never answers, mounted by root on `dir` in
/// this mount namespace; unmounted (its connection aborted first, which
/// ends every call blocked on it) when dropped.
struct HungFuse {
    dir: PathBuf,
    dev: Option<std::fs::File>,
}

impl HungFuse {
    fn mount(dir: &Path) -> HungFuse {
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .unwrap();
        let data = format!("fd={},rootmode=40000,user_id=0,group_id=0", dev.as_raw_fd());
        nix::mount::mount(
            Some("hung"),
            dir,
            Some("fuse.hung"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .unwrap();
        HungFuse {
            dir: dir.to_path_buf(),
            dev: Some(dev),
        }
    }
}

impl Drop for HungFuse {
    fn drop(&mut self) {
        drop(self.dev.take());
        let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Observe mode (confined: Landlock, no `CAP_SYS_ADMIN`) names the path,
/// pod and volume of a root `statfs` stuck on a hung FUSE mount at a
/// pod's volume path. Before, the path was read from the caller's memory
/// (`/proc/<pid>/mem`), which the agent's Landlock domain may not open:
/// status listed the call with an empty path and no pod (`statfs() … on
/// ?`). Now the eBPF program copies the path argument at entry.
#[test]
fn observe_mode_names_the_path_and_pod_of_a_stuck_call() {
    let name = "observe_mode_names_the_path_and_pod_of_a_stuck_call";
    if let Some(why) = ebpf_unavailable() {
        eprintln!("SKIP {name}: {why}");
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP {name}: no /dev/fuse");
        return;
    }
    isolated(name, || {
        let env = Env::new();
        env.write_manifest(
            "p.yaml",
            &pod_yaml("web", "uid-web", &[("d", "emptyDir: {}")]),
        );
        let volume = env.empty_dir("uid-web", "d");
        std::fs::create_dir_all(&volume).unwrap();
        // Confined, observe mode cannot mount tracefs for itself (as
        // manager mode does where a node has none mounted): mount it here,
        // in the test's private mount namespace, as a node has it.
        let tracing = Path::new("/sys/kernel/tracing");
        if !tracing.join("events").exists() {
            nix::mount::mount(
                Some("tracefs"),
                tracing,
                Some("tracefs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .unwrap();
        }
        let state = env.outside.join("state");
        let state_arg = state.to_str().unwrap().to_string();
        let agent = env.start_agent(&[
            "--observe",
            "--state-dir",
            &state_arg,
            "--tracer",
            "ebpf",
            "--stuck-syscall-after",
            "1s",
        ]);
        env.wait_for("the observing agent's eBPF tracer", || {
            status_at(&state)["tracer"] == "ebpf"
        });
        let fuse = HungFuse::mount(&volume);
        let (tx, rx) = std::sync::mpsc::channel();
        let target = volume.clone();
        let parked = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw() as u64).unwrap();
            // Blocks until the connection is aborted (`fuse` dropped).
            let _ = nix::sys::statfs::statfs(&target);
        });
        let tid = rx.recv().unwrap();
        let mut call = serde_json::Value::Null;
        env.wait_for("the parked statfs in the stuck calls", || {
            let s = status_at(&state);
            let found = s["stuck_syscalls"]
                .as_array()
                .and_then(|a| a.iter().find(|c| c["tid"] == tid).cloned());
            found.map(|c| call = c).is_some()
        });
        assert_eq!(call["call"], "statfs", "{call:#}");
        assert_eq!(
            call["path"],
            volume.to_str().unwrap(),
            "{call:#}\n{}",
            agent.log()
        );
        assert_eq!(call["pod_uid"], "uid-web", "{call:#}");
        assert_eq!(call["volume"], "d", "{call:#}");
        assert_eq!(call["fstype"], "fuse.hung", "{call:#}");
        drop(fuse);
        parked.join().unwrap();
        env.wait_for("the stuck call gone once it returned", || {
            status_at(&state)["stuck_syscalls"]
                .as_array()
                .is_some_and(|a| a.iter().all(|c| c["tid"] != tid))
        });
        drop(agent);
    });
}
