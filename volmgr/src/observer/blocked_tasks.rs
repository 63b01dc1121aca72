//! Tasks blocked in the kernel, from a bounded scan of `/proc`: those in
//! uninterruptible sleep (`D`), and those asleep in a FUSE request (which
//! waits interruptibly first). Read for each: its state and command
//! (`stat`), `wchan`, `syscall` (number and arguments, no memory of the
//! task read), working directory (`cwd`, a link read without touching the
//! file system) and kernel stack when the kernel shows it. Nothing here
//! reads a task's memory or command line (both take its memory lock,
//! which a task blocked in a page fault of a hung mount may hold).

use std::path::{Path, PathBuf};

/// The most tasks (threads) looked at per scan.
pub(super) const MAX_TASKS: usize = 32_768;
/// The most blocked tasks kept per scan.
const MAX_BLOCKED: usize = 256;
/// Kernel stack frames kept per task.
const STACK_FRAMES: usize = 6;

/// A task blocked in the kernel.
#[derive(Debug, Clone, Default)]
pub(super) struct BlockedTask {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub state: char,
    pub wchan: String,
    /// `/proc/<pid>/task/<tid>/syscall`'s number and first argument.
    pub syscall: String,
    pub cwd: Option<PathBuf>,
    /// Innermost first, function names only.
    pub stack: Vec<String>,
}

impl BlockedTask {
    /// Whether nothing says what it waits on: its `wchan`, working
    /// directory and stack are not readable (the confined agent may not
    /// read other processes' `/proc` links: Landlock denies ptrace access
    /// outside its domain).
    pub fn opaque(&self) -> bool {
        (self.wchan.is_empty() || self.wchan == "0") && self.cwd.is_none() && self.stack.is_empty()
    }

    /// Whether it waits in code of the file system `family` (its `wchan`
    /// or a frame of its stack).
    pub fn waits_in(&self, family: &str) -> bool {
        let markers = markers(family);
        std::iter::once(&self.wchan)
            .chain(self.stack.iter())
            .any(|f| markers.iter().any(|m| f.contains(m)))
    }
}

/// The kernel symbols of a file system family's waits.
fn markers(family: &str) -> &'static [&'static str] {
    match family {
        "fuse" => &["fuse", "request_wait_answer"],
        "nfs" => &["nfs", "rpc_"],
        "cifs" => &["cifs", "smb2", "wait_for_response"],
        "ceph" => &["ceph"],
        "9p" => &["p9_", "v9fs"],
        _ => &[],
    }
}

/// The family whose code a task blocked on a mount of `fstype` waits in.
pub(super) fn family(fstype: &str) -> Option<&'static str> {
    match fstype {
        "fuse" | "fuseblk" | "glusterfs" => Some("fuse"),
        t if t.starts_with("fuse.") => Some("fuse"),
        "nfs" | "nfs4" => Some("nfs"),
        "cifs" | "smb3" | "smbfs" => Some("cifs"),
        "ceph" => Some("ceph"),
        "9p" => Some("9p"),
        _ => None,
    }
}

/// What a scan found.
#[derive(Debug, Default)]
pub(super) struct Scan {
    pub tasks: Vec<BlockedTask>,
    /// [`MAX_TASKS`] were looked at before the end of `/proc`.
    pub truncated: bool,
}

/// The blocked tasks under `proc` (the process `own` left out: its probe
/// threads are parked there on purpose), at most [`MAX_TASKS`] looked at.
pub(super) fn scan(proc: &Path, own: u32) -> Scan {
    let mut out = Scan::default();
    let Ok(rd) = std::fs::read_dir(proc) else {
        return out;
    };
    let mut seen = 0usize;
    for pid in rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        if pid == own {
            continue;
        }
        let dir = proc.join(pid.to_string()).join("task");
        let Ok(tasks) = std::fs::read_dir(&dir) else {
            continue;
        };
        for tid in tasks.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
            seen += 1;
            if seen > MAX_TASKS {
                out.truncated = true;
                return out;
            }
            if let Some(t) = blocked(proc, pid, tid) {
                if out.tasks.len() < MAX_BLOCKED {
                    out.tasks.push(t);
                }
            }
        }
    }
    out
}

/// Task `tid` of `pid` when it is blocked: `D`, or `S` in a FUSE request.
fn blocked(proc: &Path, pid: u32, tid: u32) -> Option<BlockedTask> {
    let dir = proc
        .join(pid.to_string())
        .join("task")
        .join(tid.to_string());
    // Bytes, not text: any process may name itself with bytes that are not
    // UTF-8 (`prctl(PR_SET_NAME)`); shown lossy, quoted where printed.
    let stat = std::fs::read(dir.join("stat")).ok()?;
    let stat = String::from_utf8_lossy(&stat);
    // `tid (comm) S ...`: the command may hold spaces and parentheses.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let state = stat.get(close + 1..)?.trim_start().chars().next()?;
    if state != 'D' && state != 'S' {
        return None;
    }
    let wchan = std::fs::read_to_string(dir.join("wchan")).unwrap_or_default();
    let mut t = BlockedTask {
        pid,
        tid,
        comm,
        state,
        wchan: wchan.trim().to_string(),
        ..BlockedTask::default()
    };
    if state == 'S' && !t.waits_in("fuse") {
        return None;
    }
    t.syscall = std::fs::read_to_string(dir.join("syscall"))
        .map(|s| syscall_text(&s))
        .unwrap_or_else(|_| "?".into());
    t.cwd = std::fs::read_link(dir.join("cwd")).ok();
    t.stack = std::fs::read_to_string(dir.join("stack"))
        .map(|s| stack_frames(&s))
        .unwrap_or_default();
    Some(t)
}

/// `/proc/.../syscall` (`NR arg1 ... sp pc`, or `running`) as its name
/// when known, else its number.
fn syscall_text(s: &str) -> String {
    let mut it = s.split_whitespace();
    let Some(nr) = it.next() else {
        return "?".into();
    };
    let name = match nr.parse::<i64>() {
        Ok(n) => syscall_name(n).map(str::to_string),
        Err(_) => None,
    };
    name.unwrap_or_else(|| nr.to_string())
}

/// The names of the calls a task blocked on a mount is usually in.
fn syscall_name(nr: i64) -> Option<&'static str> {
    let names: &[(i64, &str)] = &[
        (libc::SYS_statx, "statx"),
        (libc::SYS_statfs, "statfs"),
        (libc::SYS_fstatfs, "fstatfs"),
        (libc::SYS_newfstatat, "newfstatat"),
        (libc::SYS_openat, "openat"),
        (libc::SYS_read, "read"),
        (libc::SYS_write, "write"),
        (libc::SYS_getdents64, "getdents64"),
        (libc::SYS_umount2, "umount2"),
        (libc::SYS_mount, "mount"),
        (libc::SYS_fsync, "fsync"),
        (libc::SYS_close, "close"),
    ];
    names.iter().find(|(n, _)| *n == nr).map(|(_, s)| *s)
}

/// The first frames of a kernel stack (`[<0>] fuse_get_req+0x1/0x2`) as
/// function names.
fn stack_frames(s: &str) -> Vec<String> {
    s.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|f| f.split('+').next().unwrap_or(f).to_string())
        .take(STACK_FRAMES)
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn frames_and_calls_are_named() {
        let s = "[<0>] fuse_get_req+0x1a/0x2b0\n[<0>] fuse_simple_request+0x3c/0x300\n";
        assert_eq!(stack_frames(s), ["fuse_get_req", "fuse_simple_request"]);
        let call = format!(
            "{} 0xffffff9c 0x7ffd 0x0 0x0 0x0 0x0 0x7ff 0x7ff",
            libc::SYS_statx
        );
        assert_eq!(syscall_text(&call), "statx");
        assert_eq!(syscall_text("running"), "running");
        let t = BlockedTask {
            wchan: "fuse_get_req".into(),
            ..BlockedTask::default()
        };
        assert!(t.waits_in("fuse"));
        assert!(!t.waits_in("nfs"));
        assert_eq!(family("fuse.sshfs"), Some("fuse"));
        assert_eq!(family("ext4"), None);
    }

    /// A task whose name is not UTF-8 (`prctl(PR_SET_NAME)` takes any
    /// bytes) is still found, its name lossy: its `stat` was read as text
    /// before, which failed, and the task was left out.
    #[test]
    fn a_task_named_with_bytes_that_are_not_utf8_is_found() {
        let t = tempfile::tempdir().unwrap();
        let task = t.path().join("42/task/43");
        std::fs::create_dir_all(&task).unwrap();
        std::fs::write(task.join("stat"), b"43 (a\xff) b) D 1 1 1\n").unwrap();
        std::fs::write(task.join("wchan"), "rpc_wait_bit_killable\n").unwrap();
        let s = scan(t.path(), 1);
        assert_eq!(s.tasks.len(), 1, "{s:?}");
        let found = &s.tasks[0];
        assert_eq!((found.pid, found.tid, found.state), (42, 43, 'D'));
        assert_eq!(found.comm, "a\u{fffd}) b");
        assert!(found.waits_in("nfs"));
    }
}
