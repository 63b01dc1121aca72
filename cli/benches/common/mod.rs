//! Shared by the benchmark programs (`#[path]`-included by each).

// Each program uses part of this module.
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::process::Command;

const CHILD_ENV: &str = "VOLMGR_BENCH_IN_PRIVATE_NS";

/// Makes sure the rest of the program runs in a private mount namespace of
/// its own, so the host's mount table is never touched: the first call
/// re-executes the program with the same arguments after
/// `unshare(CLONE_NEWNS)` and a recursively private `/`, waits for it and
/// exits with its status; in that child it returns `true`. Without root it
/// prints why it skips and returns `false`.
pub fn in_private_mount_namespace() -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        return true;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: the benchmark mounts, so it needs root (a private mount namespace)");
        return false;
    }
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(std::env::args().skip(1)).env(CHILD_ENV, "1");
    // SAFETY: only async-signal-safe syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            volmgr::sys::namespace::enter_private_mount_namespace()?;
            Ok(())
        });
    }
    let st = cmd.status().unwrap();
    std::process::exit(st.code().unwrap_or(1));
}

/// The program's `--name value` arguments, each of `names` at most once
/// (cargo's own `--bench` flag is ignored). Panics on anything else.
pub fn flags(names: &[&str]) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" => {}
            n if names.contains(&n) => {
                let v = it.next().unwrap_or_else(|| panic!("{n} needs a value"));
                out.insert(n.to_string(), v);
            }
            other => panic!("unknown argument {other} (known: {})", names.join(", ")),
        }
    }
    out
}

/// `flags[name]` parsed, or `default`.
pub fn flag<T: std::str::FromStr>(
    flags: &std::collections::HashMap<String, String>,
    name: &str,
    default: T,
) -> T
where
    T::Err: std::fmt::Debug,
{
    flags.get(name).map_or(default, |v| v.parse().unwrap())
}

/// The median of `v` (not empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Mounts a tmpfs on `dir` (made first).
pub fn mount_tmpfs(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .expect("mount tmpfs");
}

/// `nproc=N kernel=K`, for the first line of a benchmark's output.
pub fn machine() -> String {
    format!(
        "nproc={} kernel={}",
        std::thread::available_parallelism().map_or(1, |c| c.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    )
}
