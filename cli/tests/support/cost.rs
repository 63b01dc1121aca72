//! What a process costs, read from `/proc` (for the `#[ignore]`d cost
//! measurements of the doctor's scans, `#[path]`-included by each): CPU
//! over a window, RSS, peak RSS, threads.

#![allow(dead_code)]
// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

/// CPU time (user + system, clock ticks) of process `pid` and of its
/// children it waited for (`cutime`, `cstime`): the holder helper forks a
/// worker per scan, whose CPU its own counts do not hold.
pub fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11..15].iter().map(|t| t.parse::<u64>().unwrap()).sum()
}

/// The value of the line of `/proc/PID/status` starting with `key`
/// (`36740 kB`).
pub fn status_field(pid: u32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap()
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The agent and its children (observe mode: the holder scan helper),
/// each with a name, by pid.
pub fn agent_and_children(agent: u32) -> Vec<(String, u32)> {
    let children =
        std::fs::read_to_string(format!("/proc/{agent}/task/{agent}/children")).unwrap_or_default();
    let mut out = vec![("agent".to_string(), agent)];
    for c in children.split_whitespace() {
        out.push((format!("child {c}"), c.parse().unwrap()));
    }
    out
}

/// CPU over `secs` seconds, RSS, peak RSS and threads of each of `pids`,
/// one line each.
pub fn usage(pids: &[(String, u32)], secs: u64) -> String {
    let c0: Vec<u64> = pids.iter().map(|(_, p)| cpu_ticks(*p)).collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let dt = t0.elapsed().as_secs_f64();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as f64;
    let mut out = String::new();
    for ((what, pid), c0) in pids.iter().zip(c0) {
        let dc = (cpu_ticks(*pid) - c0) as f64 / ticks;
        out += &format!(
            "{what} (pid {pid}): over {dt:.0}s cpu {dc:.2}s ({:.2}%), VmRSS {}, VmHWM {}, threads {}\n",
            100.0 * dc / dt,
            status_field(*pid, "VmRSS"),
            status_field(*pid, "VmHWM"),
            status_field(*pid, "Threads")
        );
    }
    out
}

/// The durations of the agent's last `n` observe scans, from its log
/// (`observe scan findings=N took_ms=M`, at debug level), one line.
pub fn scan_times(log: &str, n: usize) -> String {
    let took: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("observe scan findings="))
        .filter_map(|l| l.split("took_ms=").nth(1))
        .map(|t| t.split_whitespace().next().unwrap_or(t))
        .collect();
    let last = &took[took.len().saturating_sub(n)..];
    format!(
        "last {} observe scans took (ms): {}\n",
        last.len(),
        last.join(" ")
    )
}
