//! Who holds a mount, so that `umount` answers `EBUSY`: processes whose
//! cwd, root, open files or memory mappings are under it, other mount
//! namespaces that still have it, and the holders of its block device
//! (`/sys/dev/block/MAJ:MIN/holders`: multipathd's dm device).
//!
//! One bounded scan of a proc root covers every mount asked about: at most
//! [`Limits::processes`] processes, [`Limits::fds_per_process`] descriptors
//! of one and [`Limits::fds`] in all, [`Limits::namespaces`] mount
//! namespaces, [`Limits::maps_bytes`] of a process's `maps`, for at most
//! [`Limits::time_ms`] (checked between processes and inside the loops over
//! one's descriptors and mappings); what is past a bound is counted in
//! [`Scan`], not looked at. Links are only read (`readlink`), never opened:
//! a process's files are not touched. `maps` and `cmdline` take the
//! process's memory lock, which a thread faulting on a dead NFS or FUSE
//! mount holds (or waits behind) for good: they are not read of a process
//! with a thread in uninterruptible sleep (`D`, from `stat`, at most
//! [`TASKS_CHECKED`] threads looked at), which is then named by its
//! `comm` only. Names and paths from `/proc` are quoted in the text. The
//! scan takes its proc and sys roots as paths, so that it can be shown a
//! made-up tree.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::sys::mountinfo::{parse_line, MountInfo};

/// A mount whose holders are looked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Its mount point, in the scanning process's mount namespace.
    pub path: PathBuf,
    /// Its device number, major.
    pub major: u32,
    /// Its device number, minor.
    pub minor: u32,
    /// The directory of its file system it shows (`/` but for binds).
    pub root: PathBuf,
    /// Whether no other mount of this namespace shows the same file system
    /// directory: then a mount of it in another namespace is a copy of this
    /// one wherever it is; otherwise only one at the same path (or a path
    /// ending with it, `/host/var/lib/kubelet/...`) is.
    pub unique: bool,
}

/// The bounds of one scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Processes examined.
    pub processes: usize,
    /// Descriptors read of one process.
    pub fds_per_process: usize,
    /// Descriptors read in all.
    pub fds: usize,
    /// Other mount namespaces whose mount table is read.
    pub namespaces: usize,
    /// Bytes read of one process's `maps` (and of one mount table).
    pub maps_bytes: usize,
    /// Time spent, milliseconds.
    pub time_ms: u64,
}

/// The bounds observe mode scans with.
pub const LIMITS: Limits = Limits {
    processes: 8192,
    fds_per_process: 4096,
    fds: 262_144,
    namespaces: 256,
    maps_bytes: 1 << 20,
    time_ms: 2000,
};

/// Holders named per target, at most; the rest are counted.
pub const HOLDERS_LISTED: usize = 16;
/// A process's uses of one target named, at most.
const USES_LISTED: usize = 4;
/// Bytes of a command line shown.
const CMDLINE_BYTES: usize = 256;
/// Threads of one process whose state is read, at most.
pub const TASKS_CHECKED: usize = 1024;

/// What one scan found, and what it did not look at.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scan {
    /// For each target (in the order asked), its holders, one line each.
    pub holders: Vec<Vec<String>>,
    /// Processes examined.
    pub processes: usize,
    /// Processes not examined (over the bound, or out of time).
    pub processes_skipped: usize,
    /// Processes whose links could not be read (permission).
    pub unreadable: usize,
    /// Descriptors read.
    pub fds: usize,
    /// Descriptors not read (over a bound, or out of time); at least this
    /// many when [`Scan::fds_uncounted`].
    pub fds_skipped: usize,
    /// A process's descriptors past a bound were not counted to their end.
    #[serde(default)]
    pub fds_uncounted: bool,
    /// Processes whose `maps` was not read: a thread in `D` state.
    #[serde(default)]
    pub maps_unread: usize,
    /// For each target, how many holders were found (the listed ones of
    /// [`Scan::holders`] and those past [`HOLDERS_LISTED`]).
    #[serde(default)]
    pub holder_counts: Vec<usize>,
    /// Other mount namespaces whose mount table was read.
    pub namespaces: usize,
    /// Other mount namespaces not read (over the bound, or out of time).
    pub namespaces_skipped: usize,
    /// The scan stopped at [`Limits::time_ms`].
    pub timed_out: bool,
    /// The scan did not return (a `/proc` file blocked it): why, said by
    /// the holder scan helper, which answers in its place.
    #[serde(default)]
    pub helper_stuck: Option<String>,
}

impl Scan {
    /// Whether everything was looked at: no holder missed.
    pub fn complete(&self) -> bool {
        self.processes_skipped == 0
            && self.unreadable == 0
            && self.fds_skipped == 0
            && self.maps_unread == 0
            && self.namespaces_skipped == 0
            && !self.timed_out
            && self.helper_stuck.is_none()
    }

    /// One line: what was examined and what was not.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "holder scan: {} processes, {} descriptors, {} other mount namespaces examined",
            self.processes, self.fds, self.namespaces
        );
        let at_least = if self.fds_uncounted { "≥" } else { "" };
        let skipped = [
            (self.processes_skipped, "", "processes"),
            (self.unreadable, "", "processes unreadable"),
            (self.fds_skipped, at_least, "descriptors"),
            (self.maps_unread, "", "processes' mappings (in D state)"),
            (self.namespaces_skipped, "", "mount namespaces"),
        ];
        for (n, least, what) in skipped.into_iter().filter(|(n, _, _)| *n > 0) {
            s.push_str(&format!("; not examined: {least}{n} {what}"));
        }
        if self.timed_out {
            s.push_str("; stopped at the time limit");
        }
        if let Some(why) = &self.helper_stuck {
            s.push_str(&format!("; helper stuck: {why}"));
        }
        s
    }
}

/// Where the scan looks, and the state it keeps while it does.
struct Walk<'a> {
    proc_root: &'a Path,
    targets: &'a [Target],
    /// Mount point → index in `targets`.
    by_path: HashMap<&'a Path, usize>,
    limits: &'a Limits,
    deadline: Instant,
    scan: Scan,
    /// Another namespace's link → the first process seen in it.
    namespaces: BTreeMap<String, u32>,
    skipped_namespaces: HashSet<String>,
}

/// Scans `proc_root` (and `sys_root` for block devices' holders) for the
/// holders of `targets`, within `limits`.
pub fn scan(proc_root: &Path, sys_root: &Path, targets: &[Target], limits: &Limits) -> Scan {
    let mut w = Walk {
        proc_root,
        targets,
        by_path: targets
            .iter()
            .enumerate()
            .map(|(i, t)| (t.path.as_path(), i))
            .collect(),
        limits,
        deadline: Instant::now() + Duration::from_millis(limits.time_ms),
        scan: Scan {
            holders: vec![Vec::new(); targets.len()],
            ..Scan::default()
        },
        namespaces: BTreeMap::new(),
        skipped_namespaces: HashSet::new(),
    };
    let own_pid = std::fs::read_link(proc_root.join("self"))
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok());
    let own_ns = link(&proc_root.join("self/ns/mnt"));
    for pid in pids(proc_root, limits.processes, &mut w.scan) {
        if Instant::now() >= w.deadline {
            w.scan.timed_out = true;
            w.scan.processes_skipped += 1;
            continue;
        }
        if Some(pid) == own_pid {
            // The scanner itself: examined, never a holder.
            w.scan.processes += 1;
        } else {
            w.process(pid, own_ns.as_deref());
        }
    }
    w.other_namespaces();
    for (i, t) in targets.iter().enumerate() {
        w.scan.holders[i].extend(device_holders(sys_root, t));
    }
    w.scan.namespaces_skipped += w.skipped_namespaces.len();
    w.scan.holder_counts = w.scan.holders.iter().map(Vec::len).collect();
    for h in &mut w.scan.holders {
        if h.len() > HOLDERS_LISTED {
            let more = h.len() - HOLDERS_LISTED;
            h.truncate(HOLDERS_LISTED);
            h.push(format!("... and {more} more holders"));
        }
    }
    w.scan
}

/// The first `max` process ids listed in `proc_root`; the rest counted as
/// skipped.
fn pids(proc_root: &Path, max: usize, scan: &mut Scan) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.filter_map(Result::ok) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if out.len() < max {
            out.push(pid);
        } else {
            scan.processes_skipped += 1;
        }
    }
    out
}

/// A link's target as text (lossy), `None` if it cannot be read.
fn link(p: &Path) -> Option<String> {
    std::fs::read_link(p)
        .ok()
        .map(|t| t.to_string_lossy().into_owned())
}

impl Walk<'_> {
    /// One process: in this namespace, its links and mappings; in another,
    /// its namespace remembered.
    fn process(&mut self, pid: u32, own_ns: Option<&str>) {
        let dir = self.proc_root.join(pid.to_string());
        let ns = match std::fs::read_link(dir.join("ns/mnt")) {
            Ok(ns) => ns.to_string_lossy().into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                self.scan.processes += 1;
                self.scan.unreadable += 1;
                return;
            }
            // Gone since it was listed.
            Err(_) => return,
        };
        self.scan.processes += 1;
        if Some(ns.as_str()) != own_ns {
            if !self.namespaces.contains_key(&ns) {
                if self.namespaces.len() < self.limits.namespaces {
                    self.namespaces.insert(ns, pid);
                } else {
                    self.skipped_namespaces.insert(ns);
                }
            }
            return;
        }
        let mut uses: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for what in ["cwd", "root"] {
            if let Some(p) = link(&dir.join(what)) {
                self.record(&p, what, &mut uses);
            }
        }
        self.fds(&dir, &mut uses);
        // `maps` and `cmdline` wait for the memory lock a thread stuck in a
        // page fault of a hung mount holds: not read of such a process.
        let blocked = in_d_state(&dir);
        if blocked {
            self.scan.maps_unread += 1;
        } else {
            self.maps(&dir, &mut uses);
        }
        if uses.is_empty() {
            return;
        }
        let who = process_name(&dir, pid, blocked);
        for (i, mut u) in uses {
            if u.len() > USES_LISTED {
                let more = u.len() - USES_LISTED;
                u.truncate(USES_LISTED);
                u.push(format!("and {more} more"));
            }
            self.scan.holders[i].push(format!("held by {who}: {}", u.join(", ")));
        }
    }

    /// The target `path` is at or below, if any.
    fn target_of(&self, path: &str) -> Option<usize> {
        let path = Path::new(path);
        path.ancestors().find_map(|a| self.by_path.get(a).copied())
    }

    /// Notes `what` (`cwd`, `fd 3`) at `path` if it is under a target.
    fn record(&self, path: &str, what: &str, uses: &mut BTreeMap<usize, Vec<String>>) {
        if let Some(i) = self.target_of(path) {
            uses.entry(i).or_default().push(format!("{what} {path:?}"));
        }
    }

    /// The process's descriptors, within the bounds.
    fn fds(&mut self, dir: &Path, uses: &mut BTreeMap<usize, Vec<String>>) {
        let Ok(rd) = std::fs::read_dir(dir.join("fd")) else {
            return;
        };
        for (read, e) in rd.filter_map(Result::ok).enumerate() {
            if Instant::now() >= self.deadline {
                self.scan.timed_out = true;
                self.scan.fds_skipped += 1;
                self.scan.fds_uncounted = true;
                return;
            }
            if read >= self.limits.fds_per_process || self.scan.fds >= self.limits.fds {
                // The rest is not listed to its end (a million descriptors
                // would be): at least one more.
                self.scan.fds_skipped += 1;
                self.scan.fds_uncounted = true;
                return;
            }
            self.scan.fds += 1;
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(p) = link(&e.path()) {
                self.record(&p, &format!("fd {name}"), uses);
            }
        }
    }

    /// The files the process maps (`maps`, at most
    /// [`Limits::maps_bytes`]), once per target.
    fn maps(&mut self, dir: &Path, uses: &mut BTreeMap<usize, Vec<String>>) {
        let text = read_bounded(&dir.join("maps"), self.limits.maps_bytes);
        let mut seen = HashSet::new();
        for line in text.lines() {
            if Instant::now() >= self.deadline {
                self.scan.timed_out = true;
                return;
            }
            let Some(path) = maps_path(line) else {
                continue;
            };
            if let Some(i) = self.target_of(path) {
                if seen.insert(i) {
                    uses.entry(i).or_default().push(format!("maps {path:?}"));
                }
            }
        }
    }

    /// Reads the mount table of each other namespace remembered, through
    /// its first process, for copies of the targets.
    fn other_namespaces(&mut self) {
        let namespaces = std::mem::take(&mut self.namespaces);
        for (ns, pid) in namespaces {
            if Instant::now() >= self.deadline {
                self.scan.timed_out = true;
                self.scan.namespaces_skipped += 1;
                continue;
            }
            self.scan.namespaces += 1;
            let dir = self.proc_root.join(pid.to_string());
            let text = read_bounded(&dir.join("mountinfo"), self.limits.maps_bytes);
            let mut who = None;
            for m in text.lines().filter_map(|l| parse_line(l).ok()) {
                for (i, t) in self.targets.iter().enumerate() {
                    if is_copy(t, &m) {
                        let who =
                            who.get_or_insert_with(|| process_name(&dir, pid, in_d_state(&dir)));
                        self.scan.holders[i].push(format!(
                            "mount namespace {ns} (of {who}) still has it: id {} on {:?} type {:?}",
                            m.mount_id, m.mount_point, m.fstype
                        ));
                    }
                }
            }
        }
    }
}

/// Whether `m`, a mount of another namespace, is a copy of `t`.
fn is_copy(t: &Target, m: &MountInfo) -> bool {
    if (m.major, m.minor) != (t.major, t.minor) || m.root != t.root {
        return false;
    }
    t.unique
        || t.path
            .strip_prefix("/")
            .is_ok_and(|rel| m.mount_point.ends_with(rel))
}

/// The path of a `maps` line (its sixth field), if it names a file.
fn maps_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start().split_once(' ')?.1;
    }
    let path = rest.trim_start();
    path.starts_with('/').then_some(path)
}

/// At most `max` bytes of `path`, lossy; empty if it cannot be read.
fn read_bounded(path: &Path, max: usize) -> String {
    let mut buf = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(max as u64).read_to_end(&mut buf);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Whether a thread of the process at `dir` is in uninterruptible sleep
/// (`D` in its `stat`; at most [`TASKS_CHECKED`] threads read, the
/// process's own `stat` when it has no readable `task` directory).
fn in_d_state(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir.join("task")) else {
        return stat_state(&dir.join("stat")) == Some('D');
    };
    rd.filter_map(Result::ok)
        .take(TASKS_CHECKED)
        .any(|e| stat_state(&e.path().join("stat")) == Some('D'))
}

/// The state letter of a `stat` file (`pid (comm) S ...`; the command may
/// hold spaces, parentheses and bytes that are not UTF-8).
fn stat_state(path: &Path) -> Option<char> {
    let raw = read_bounded(path, 4096);
    let close = raw.rfind(')')?;
    raw.get(close + 1..)?.trim_start().chars().next()
}

/// The process's `comm`, from `comm` (no memory lock taken), lossy.
fn comm(dir: &Path) -> String {
    read_bounded(&dir.join("comm"), 64)
        .trim_end_matches('\n')
        .to_string()
}

/// `pid 1234 ("comm", "command line")`, both quoted, the command line
/// bounded, its NULs as spaces; `pid 1234 ("comm", maps not read: in D
/// state)` for a process `blocked` (its command line is not read either).
fn process_name(dir: &Path, pid: u32, blocked: bool) -> String {
    let comm = comm(dir);
    if blocked {
        return format!("pid {pid} ({comm:?}, maps not read: in D state)");
    }
    let raw = read_bounded(&dir.join("cmdline"), CMDLINE_BYTES + 1);
    let mut cmdline: String = raw.trim_end_matches('\0').replace('\0', " ");
    if cmdline.len() > CMDLINE_BYTES {
        cmdline.truncate(cmdline.floor_char_boundary(CMDLINE_BYTES));
        cmdline.push_str("...");
    }
    format!("pid {pid} ({comm:?}, {cmdline:?})")
}

/// The holders of `t`'s block device (`SYS/dev/block/MAJ:MIN/holders`),
/// with a dm device's name.
fn device_holders(sys_root: &Path, t: &Target) -> Vec<String> {
    if t.major == 0 {
        return Vec::new();
    }
    let dir = sys_root.join(format!("dev/block/{}:{}/holders", t.major, t.minor));
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .take(HOLDERS_LISTED + 1)
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let dm = read_bounded(&sys_root.join(format!("block/{n}/dm/name")), 128);
            let dm = match dm.trim() {
                "" => String::new(),
                name => format!(" (dm {name:?})"),
            };
            format!(
                "device {}:{} is held by {}{dm} ({})",
                t.major,
                t.minor,
                n.escape_debug(),
                dir.display()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::symlink;

    /// A made-up process `pid` under `proc` in mount namespace `ns`.
    fn process(proc: &Path, pid: u32, ns: &str, cwd: &str, fds: &[&str]) -> PathBuf {
        let dir = proc.join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        std::fs::create_dir_all(dir.join("fd")).unwrap();
        symlink(ns, dir.join("ns/mnt")).unwrap();
        symlink(cwd, dir.join("cwd")).unwrap();
        symlink("/", dir.join("root")).unwrap();
        for (i, f) in fds.iter().enumerate() {
            symlink(f, dir.join(format!("fd/{i}"))).unwrap();
        }
        std::fs::write(dir.join("comm"), format!("proc{pid}\n")).unwrap();
        std::fs::write(dir.join("cmdline"), format!("proc{pid}\0--flag\0")).unwrap();
        std::fs::write(dir.join("maps"), "").unwrap();
        dir
    }

    fn target(path: &str) -> Target {
        Target {
            path: PathBuf::from(path),
            major: 0,
            minor: 55,
            root: PathBuf::from("/"),
            unique: true,
        }
    }

    #[test]
    fn the_proc_scan_stays_within_its_bounds_and_counts_the_rest() {
        let t = tempfile::tempdir().unwrap();
        let proc = t.path().join("proc");
        let vol = "/k/pods/u/volumes/kubernetes.io~empty-dir/v";
        // pid 10 is the scanner itself: never a holder.
        process(&proc, 10, "mnt:[1]", vol, &[]);
        symlink("10", proc.join("self")).unwrap();
        process(&proc, 11, "mnt:[1]", &format!("{vol}/sub"), &[]);
        let fds: Vec<String> = (0..5).map(|i| format!("{vol}/f{i}")).collect();
        let fds: Vec<&str> = fds.iter().map(String::as_str).collect();
        process(&proc, 12, "mnt:[1]", "/", &fds);
        let maps = process(&proc, 13, "mnt:[1]", "/", &[]);
        std::fs::write(
            maps.join("maps"),
            format!("7f00-7f01 r--p 00000000 00:37 12   {vol}/lib.so\n7f01-7f02 r-xp 00000000 00:37 12   {vol}/lib.so\n"),
        )
        .unwrap();
        let other = process(&proc, 14, "mnt:[2]", "/data", &[]);
        std::fs::write(
            other.join("mountinfo"),
            format!(
                "900 1 0:55 / /host{vol} rw - tmpfs tmpfs rw\n901 1 0:56 / /x rw - tmpfs t rw\n"
            ),
        )
        .unwrap();
        for pid in 20..30 {
            process(&proc, pid, "mnt:[1]", "/", &[]);
        }
        let limits = Limits {
            processes: 1000,
            fds_per_process: 3,
            fds: 1000,
            namespaces: 8,
            maps_bytes: 4096,
            time_ms: 60_000,
        };
        let sys = t.path().join("sys");
        let s = scan(&proc, &sys, &[target(vol)], &limits);
        let h = s.holders[0].join("\n");
        assert!(
            h.contains("pid 11 (\"proc11\", \"proc11 --flag\"): cwd \""),
            "{h}"
        );
        assert!(h.contains("pid 12 (\"proc12\""), "{h}");
        assert!(h.contains("fd "), "{h}");
        assert!(
            h.contains(&format!(
                "pid 13 (\"proc13\", \"proc13 --flag\"): maps \"{vol}/lib.so\""
            )),
            "{h}"
        );
        assert!(h.contains("mount namespace mnt:[2] (of pid 14"), "{h}");
        assert!(!h.contains("pid 10 "), "{h}");
        assert_eq!(s.holders[0].len(), 4, "{h}");
        assert_eq!(s.holder_counts, [4]);
        // Stopped at the bound, the rest not listed to its end.
        assert_eq!((s.fds, s.fds_skipped, s.fds_uncounted), (3, 1, true));
        assert!(
            s.summary().contains("not examined: ≥1 descriptors"),
            "{}",
            s.summary()
        );
        assert_eq!(s.processes, 15);
        assert_eq!(s.namespaces, 1);
        assert!(!s.complete());

        // Over the process and namespace bounds: counted, not examined.
        let small = Limits {
            processes: 5,
            namespaces: 0,
            ..limits
        };
        let s = scan(&proc, &sys, &[target(vol)], &small);
        assert_eq!((s.processes, s.processes_skipped), (5, 10), "{s:?}");
        assert!(
            s.summary().contains("not examined: 10 processes"),
            "{}",
            s.summary()
        );
        // No time left: nothing examined, said so.
        let none = Limits {
            time_ms: 0,
            ..limits
        };
        let s = scan(&proc, &sys, &[target(vol)], &none);
        assert!(
            s.timed_out && s.processes == 0 && s.processes_skipped == 15,
            "{s:?}"
        );
    }

    #[test]
    fn a_block_devices_holders_are_named() {
        let t = tempfile::tempdir().unwrap();
        let sys = t.path();
        std::fs::create_dir_all(sys.join("dev/block/8:16/holders/dm-0")).unwrap();
        std::fs::create_dir_all(sys.join("block/dm-0/dm")).unwrap();
        std::fs::write(sys.join("block/dm-0/dm/name"), "mpatha\n").unwrap();
        let t = Target {
            major: 8,
            minor: 16,
            ..target("/k/x")
        };
        let h = device_holders(sys, &t);
        assert_eq!(h.len(), 1);
        assert!(
            h[0].starts_with("device 8:16 is held by dm-0 (dm \"mpatha\")"),
            "{h:?}"
        );
    }

    #[test]
    fn a_copy_elsewhere_counts_only_for_a_mount_nothing_else_here_shows() {
        let m = parse_line("900 1 0:55 / /elsewhere rw - tmpfs tmpfs rw").unwrap();
        let mut t = target("/k/v");
        assert!(is_copy(&t, &m));
        t.unique = false;
        assert!(!is_copy(&t, &m));
        let m = parse_line("900 1 0:55 / /host/k/v rw - tmpfs tmpfs rw").unwrap();
        assert!(is_copy(&t, &m));
        assert_eq!(maps_path("7f-7f r--p 0 00:37 12    /a b/c"), Some("/a b/c"));
        assert_eq!(maps_path("7f-7f r--p 0 00:00 0    [heap]"), None);
    }

    /// A process with a thread in `D` state: its `maps` and `cmdline` are
    /// not read (both wait for the memory lock a thread faulting on a hung
    /// mount holds: the scan, and the helper running it, hung for good
    /// before), it is named by its `comm` only, quoted (a name like
    /// `x[1] (thread 2) state D` forged fields of the line before), and the
    /// scan says a process's mappings were not looked at.
    #[test]
    fn a_process_in_d_state_is_named_by_comm_and_its_maps_not_read() {
        let t = tempfile::tempdir().unwrap();
        let proc = t.path().join("proc");
        let vol = "/k/pods/u/volumes/kubernetes.io~nfs/v";
        process(&proc, 10, "mnt:[1]", "/", &[]);
        symlink("10", proc.join("self")).unwrap();
        let dir = process(&proc, 15, "mnt:[1]", vol, &[]);
        let name = "x[1] (thread 2) state D";
        std::fs::write(dir.join("comm"), format!("{name}\n")).unwrap();
        std::fs::write(dir.join("maps"), format!("7f-7f r--p 0 00:37 12 {vol}/a\n")).unwrap();
        std::fs::create_dir_all(dir.join("task/15")).unwrap();
        std::fs::create_dir_all(dir.join("task/16")).unwrap();
        std::fs::write(dir.join("task/15/stat"), format!("15 ({name}) S 1 1\n")).unwrap();
        std::fs::write(dir.join("task/16/stat"), b"16 (\xff\xfe) ) D 1 1\n").unwrap();
        let s = scan(&proc, t.path(), &[target(vol)], &LIMITS);
        let h = s.holders[0].join("\n");
        assert_eq!(
            h,
            format!("held by pid 15 (\"{name}\", maps not read: in D state): cwd \"{vol}\""),
            "{s:?}"
        );
        assert_eq!(s.maps_unread, 1);
        assert!(!s.complete());
        assert!(
            s.summary().contains("1 processes' mappings (in D state)"),
            "{}",
            s.summary()
        );
    }
}
