//! Stuck syscalls: traced calls (the mount family, and `statfs`, which is
//! what hangs first on a network or FUSE file system whose server stopped
//! answering) that have been blocked in the kernel longer than
//! `--stuck-syscall-after`, reported while they are still blocked.
//!
//! The eBPF programs keep every call between entry and exit in a per-thread
//! map; [`run`] reads that map a few times per threshold, and for each call
//! older than the threshold takes the path argument the entry program
//! copied (its first 255 bytes: the agent never reads another process's
//! memory, which observe mode's Landlock domain refuses anyway), and reads
//! from `/proc` the caller's thread name, the file system type of the
//! mount under that path (the caller's `mountinfo`, which never waits for
//! a file system) and the task's kernel stack
//! (`/proc/<pid>/task/<tid>/stack`: only outside observe mode's
//! confinement, which neither keeps `CAP_SYS_ADMIN` nor may inspect
//! processes outside its Landlock domain). Each stuck call is logged once; the
//! list is in status and doctor, and the age of the oldest call in flight is
//! a gauge.
//!
//! Any process can park threads in `statfs` on a FUSE file system of its
//! own, so the list is bounded: at most [`MAX_STUCK_LISTED`] calls are
//! described (read from `/proc`), listed and logged, those that can matter
//! first (callers with uid 0 in the initial user namespace, or in the
//! agent's own mount namespace), then the oldest; the rest are only
//! counted. A call is placed on a pod's volume only when it can matter: an
//! unprivileged caller in a mount namespace of its own may have mounted
//! anything at a volume's path there.
//!
//! File system tools (`mkfs*`, `fsck*`, `e2fsck`, `resize2fs`,
//! `xfs_growfs`, `xfs_repair`) are followed the same way from the
//! program's table of tools running: one running longer than
//! `--stuck-tool-after` (an `e2fsck` that hangs holds its volume's
//! NodeStageVolume) is reported while it runs, with its command line, the
//! volume its device or path argument belongs to, its state and kernel
//! stack. The kernel program keeps the tools of callers that can matter
//! in a table of their own, so that no number of unprivileged tools evicts
//! them; here too they are described first, at most
//! [`MAX_STUCK_TOOLS_LISTED`], the rest counted. A tool's device is placed
//! on a volume through the mount table, parsed once per change of it
//! ([`MountCache`]), not once per tool.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::devices::device_key;
use super::timeline::{attribute, monotonic_now_ns, wall_time_of, Attribution};
use crate::ebpf::{EbpfTracer, InFlightCall, ToolExec};
use crate::status::{StuckSyscall, StuckToolRun};
use crate::util::prometheus::{Exposition, MetricType};
use crate::util::sync::MutexExt;

/// `--stuck-syscall-after`'s default.
pub const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(10);

/// `--stuck-tool-after`'s default: the kubelet gives a CSI NodeStageVolume
/// two minutes (its `csiTimeout`), so a tool still running then has made
/// the stage time out at least once. `mkfs` and `fsck` of large volumes
/// legitimately take long: raise it for those.
pub const DEFAULT_STUCK_TOOL_AFTER: Duration = Duration::from_secs(120);

/// Stuck calls described, listed in status and logged at most; the rest
/// are counted (`volmgr_mount_syscalls_stuck` counts them all).
pub const MAX_STUCK_LISTED: usize = 64;

/// Stuck tool runs described, listed in status and logged at most; the
/// rest are counted (`volmgr_fs_tools_stuck` counts them all).
pub const MAX_STUCK_TOOLS_LISTED: usize = 64;

/// The volume mounts of the agent's mount table (device, by
/// [`device_key`], and the volume path it is mounted on), read again only
/// when the kernel signals a change of the table (`POLLPRI` on
/// `/proc/self/mountinfo`, proc(5)).
#[derive(Default)]
struct MountCache {
    /// Open while the cache is valid; its `POLLPRI` says the table changed.
    watch: Option<std::fs::File>,
    volumes: Vec<(String, Attribution)>,
    /// Times the table was read (for the tests).
    reads: u64,
}

impl MountCache {
    /// The volume device `key` (see [`device_key`]) is mounted on.
    fn volume_of(&mut self, key: &str, root: &Path) -> Option<Attribution> {
        if self.changed() {
            self.reload(root);
        }
        self.volumes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, a)| a.clone())
    }

    /// Whether the table may have changed since the last read (or was
    /// never read).
    fn changed(&mut self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let Some(file) = &self.watch else {
            return true;
        };
        let mut fds = [PollFd::new(file.as_fd(), PollFlags::POLLPRI)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => false,
            // The event is cleared by this poll; read again.
            _ => true,
        }
    }

    fn reload(&mut self, root: &Path) {
        // Opened before the read: a change after the read is signalled.
        self.watch = std::fs::File::open("/proc/self/mountinfo").ok();
        self.reads += 1;
        self.volumes = crate::sys::mountinfo::read_self()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.source.starts_with("/dev/"))
            .filter_map(|m| {
                let a = attribute(m.mount_point.to_str()?, root)?;
                Some((device_key(&m.source), a))
            })
            .collect();
    }
}

#[derive(Default)]
struct Inner {
    stuck: Vec<StuckSyscall>,
    /// Calls stuck now, listed or not.
    stuck_total: usize,
    oldest_ns: u64,
    in_flight: usize,
    /// (start, tid) of the stuck calls already logged.
    reported: HashSet<(u64, u32)>,
    tools: Vec<StuckToolRun>,
    /// Tool runs stuck now, listed or not.
    tools_stuck_total: usize,
    tools_running: usize,
    oldest_tool_ns: u64,
    /// (start, pid) of the stuck tool runs already logged.
    reported_tools: HashSet<(u64, u32)>,
    /// Whether unprivileged users' stuck tools were listed at the last
    /// update (they are logged in one line when they appear).
    others_logged: bool,
}

/// The calls and tool runs stuck now (see the module).
pub struct StuckView {
    threshold_ns: AtomicU64,
    tool_threshold_ns: AtomicU64,
    inner: Mutex<Inner>,
    mounts: Mutex<MountCache>,
}

impl Default for StuckView {
    fn default() -> Self {
        Self {
            threshold_ns: AtomicU64::new(DEFAULT_STUCK_AFTER.as_nanos() as u64),
            tool_threshold_ns: AtomicU64::new(DEFAULT_STUCK_TOOL_AFTER.as_nanos() as u64),
            inner: Mutex::new(Inner::default()),
            mounts: Mutex::new(MountCache::default()),
        }
    }
}

fn positive_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

impl StuckView {
    /// Sets `--stuck-syscall-after`.
    pub fn set_threshold(&self, d: Duration) {
        self.threshold_ns.store(positive_ns(d), Ordering::Relaxed);
    }

    /// `--stuck-syscall-after`.
    pub fn threshold(&self) -> Duration {
        Duration::from_nanos(self.threshold_ns.load(Ordering::Relaxed))
    }

    /// Sets `--stuck-tool-after`.
    pub fn set_tool_threshold(&self, d: Duration) {
        self.tool_threshold_ns
            .store(positive_ns(d), Ordering::Relaxed);
    }

    /// `--stuck-tool-after`.
    pub fn tool_threshold(&self) -> Duration {
        Duration::from_nanos(self.tool_threshold_ns.load(Ordering::Relaxed))
    }

    /// Takes the file system tools running at `now_ns`
    /// (`CLOCK_MONOTONIC`): those past `--stuck-tool-after` that are
    /// `alive` (still that program) become the stuck tool list (each
    /// logged the first time), at most [`MAX_STUCK_TOOLS_LISTED`] of them,
    /// those whose callers can matter ([`tool_can_matter`]) first.
    pub fn update_tools(
        &self,
        runs: &[ToolExec],
        now_ns: u64,
        root: &Path,
        alive: &dyn Fn(&ToolExec) -> bool,
    ) {
        let threshold = self.tool_threshold_ns.load(Ordering::Relaxed);
        let (mut old, oldest_ns) = overdue(runs, now_ns, threshold, |r| (r.start_ns, r.pid));
        // Stable: oldest first within each group.
        old.sort_by_key(|r| !tool_can_matter(r));
        // Only those listed are checked (read from /proc): the rest is counted.
        let stuck_total = old.len();
        let mut old: Vec<&ToolExec> = old
            .into_iter()
            .filter(|r| alive(r))
            .take(MAX_STUCK_TOOLS_LISTED)
            .collect();
        old.sort_by_key(|r| (r.start_ns, r.pid));
        let stuck: Vec<StuckToolRun> = {
            let mut mounts = self.mounts.locked();
            old.iter()
                .map(|r| describe_tool(r, now_ns, root, tool_can_matter(r), &mut mounts))
                .collect()
        };
        let keys: Vec<(u64, u32)> = old.iter().map(|r| (r.start_ns, r.pid)).collect();
        let others = old.iter().filter(|r| !tool_can_matter(r)).count();
        let mut inner = self.inner.locked();
        let new = first_seen(&mut inner.reported_tools, &keys);
        for ((s, r), new) in stuck.iter().zip(&old).zip(new) {
            // Others' runs come and go as the kernel's table evicts them:
            // one line for all of them (below), not one each.
            if new && tool_can_matter(r) {
                log_stuck_tool(s);
            }
        }
        if others > 0 && !inner.others_logged {
            tracing::warn!(
                listed = others,
                "file system tools of unprivileged users running longer than --stuck-tool-after (listed in status, not logged each)"
            );
        }
        inner.others_logged = others > 0;
        inner.tools = stuck;
        inner.tools_stuck_total = stuck_total;
        inner.oldest_tool_ns = oldest_ns;
        inner.tools_running = runs.len();
    }

    /// The tool runs stuck at the last update, oldest first (at most
    /// [`MAX_STUCK_TOOLS_LISTED`]).
    pub fn stuck_tools(&self) -> Vec<StuckToolRun> {
        self.inner.locked().tools.clone()
    }

    /// How many tool runs were stuck at the last update, listed or not.
    pub fn stuck_tools_total(&self) -> usize {
        self.inner.locked().tools_stuck_total
    }

    /// Takes the calls in flight at `now_ns` (`CLOCK_MONOTONIC`): those past
    /// the threshold become the stuck list (each logged the first time), at
    /// most [`MAX_STUCK_LISTED`] of them, those that can matter (see
    /// [`can_matter`]; `own_mnt_ns`: the agent's mount namespace) first.
    pub fn update(&self, calls: &[InFlightCall], now_ns: u64, root: &Path, own_mnt_ns: u64) {
        let threshold = self.threshold_ns.load(Ordering::Relaxed);
        let (mut old, oldest_ns) = overdue(calls, now_ns, threshold, |c| (c.start_ns, c.tid));
        let stuck_total = old.len();
        // Stable: oldest first within each group.
        old.sort_by_key(|c| !can_matter(c, own_mnt_ns));
        old.truncate(MAX_STUCK_LISTED);
        old.sort_by_key(|c| (c.start_ns, c.tid));
        let stuck: Vec<StuckSyscall> = old
            .iter()
            .map(|c| describe(c, now_ns, root, can_matter(c, own_mnt_ns)))
            .collect();
        let keys: Vec<(u64, u32)> = old.iter().map(|c| (c.start_ns, c.tid)).collect();
        let mut inner = self.inner.locked();
        for (s, new) in stuck.iter().zip(first_seen(&mut inner.reported, &keys)) {
            if new {
                tracing::warn!(
                    pid = s.pid,
                    tid = s.tid,
                    comm = %s.comm,
                    call = s.call,
                    path = %s.path,
                    fstype = %s.fstype,
                    elapsed_seconds = s.elapsed_seconds,
                    pod_uid = s.pod_uid.as_deref().unwrap_or(""),
                    volume = s.volume.as_deref().unwrap_or(""),
                    kernel_stack = %s.kernel_stack.join(" <- "),
                    "syscall stuck in the kernel"
                );
            }
        }
        inner.stuck = stuck;
        inner.stuck_total = stuck_total;
        inner.oldest_ns = oldest_ns;
        inner.in_flight = calls.len();
    }

    /// The calls stuck at the last update, oldest first (at most
    /// [`MAX_STUCK_LISTED`]).
    pub fn stuck(&self) -> Vec<StuckSyscall> {
        self.inner.locked().stuck.clone()
    }

    /// How many calls were stuck at the last update, listed or not.
    pub fn stuck_total(&self) -> usize {
        self.inner.locked().stuck_total
    }

    /// Those on pod `uid`'s volume paths.
    pub fn for_pod(&self, uid: &str) -> Vec<StuckSyscall> {
        let inner = self.inner.locked();
        inner
            .stuck
            .iter()
            .filter(|s| s.pod_uid.as_deref() == Some(uid))
            .cloned()
            .collect()
    }

    /// The stuck tool runs on pod `uid`'s volumes.
    pub fn tools_for_pod(&self, uid: &str) -> Vec<StuckToolRun> {
        let inner = self.inner.locked();
        inner
            .tools
            .iter()
            .filter(|t| t.pod_uid.as_deref() == Some(uid))
            .cloned()
            .collect()
    }

    /// How long the oldest traced call in flight has been, at the last update.
    pub fn oldest_in_flight(&self) -> Duration {
        Duration::from_nanos(self.inner.locked().oldest_ns)
    }

    /// `volmgr_mount_syscall_oldest_in_flight_seconds`,
    /// `volmgr_mount_syscalls_stuck` and the file system tools' gauges
    /// (Prometheus text).
    pub fn prometheus_text(&self) -> String {
        let (oldest, stuck, in_flight, oldest_tool, tools_stuck, tools_running) = {
            let i = self.inner.locked();
            (
                i.oldest_ns,
                i.stuck_total,
                i.in_flight,
                i.oldest_tool_ns,
                i.tools_stuck_total,
                i.tools_running,
            )
        };
        let mut w = Exposition::new();
        let name = "volmgr_mount_syscall_oldest_in_flight_seconds";
        w.family(
            name,
            "How long the oldest traced call (mount family, statfs) still in the kernel has been running.",
            MetricType::Gauge,
        );
        w.sample(name, &[], oldest as f64 / 1e9);
        let name = "volmgr_mount_syscalls_in_flight";
        w.family(name, "Traced calls in the kernel now.", MetricType::Gauge);
        w.sample(name, &[], in_flight);
        let name = "volmgr_mount_syscalls_stuck";
        w.family(
            name,
            "Traced calls blocked longer than --stuck-syscall-after now.",
            MetricType::Gauge,
        );
        w.sample(name, &[], stuck);
        let name = "volmgr_mount_syscalls_stuck_not_listed";
        w.family(
            name,
            "Stuck calls counted but not listed in status nor logged (over the list's bound).",
            MetricType::Gauge,
        );
        w.sample(name, &[], stuck.saturating_sub(MAX_STUCK_LISTED));
        let name = "volmgr_fs_tools_running";
        w.family(
            name,
            "File system tools (mkfs, fsck, e2fsck, resize2fs, xfs_growfs, xfs_repair) running now.",
            MetricType::Gauge,
        );
        w.sample(name, &[], tools_running);
        let name = "volmgr_fs_tool_oldest_running_seconds";
        w.family(
            name,
            "How long the oldest file system tool running now has been running.",
            MetricType::Gauge,
        );
        w.sample(name, &[], oldest_tool as f64 / 1e9);
        let name = "volmgr_fs_tools_stuck";
        w.family(
            name,
            "File system tools running longer than --stuck-tool-after now.",
            MetricType::Gauge,
        );
        w.sample(name, &[], tools_stuck);
        let name = "volmgr_fs_tools_stuck_not_listed";
        w.family(
            name,
            "Stuck file system tools counted but not listed in status nor logged (over the list's bound).",
            MetricType::Gauge,
        );
        w.sample(
            name,
            &[],
            tools_stuck.saturating_sub(MAX_STUCK_TOOLS_LISTED),
        );
        w.finish()
    }
}

/// Of `items`, keyed by (start ns, task id), those started at least
/// `threshold` ns before `now_ns`, oldest first; and the age of the oldest
/// item.
fn overdue<T>(
    items: &[T],
    now_ns: u64,
    threshold: u64,
    key: impl Fn(&T) -> (u64, u32),
) -> (Vec<&T>, u64) {
    let age = |i: &T| now_ns.saturating_sub(key(i).0);
    let oldest = items.iter().map(age).max().unwrap_or(0);
    let mut old: Vec<&T> = items.iter().filter(|i| age(i) >= threshold).collect();
    old.sort_by_key(|i| key(i));
    (old, oldest)
}

/// For each of `keys` (stuck now), whether it is new to `reported`, which
/// then holds exactly `keys` (what is no longer stuck is forgotten).
fn first_seen(reported: &mut HashSet<(u64, u32)>, keys: &[(u64, u32)]) -> Vec<bool> {
    let new = keys.iter().map(|k| reported.insert(*k)).collect();
    let now: HashSet<(u64, u32)> = keys.iter().copied().collect();
    reported.retain(|k| now.contains(k));
    new
}

/// Logs a stuck tool run (once per run).
fn log_stuck_tool(s: &StuckToolRun) {
    tracing::warn!(
        pid = s.pid,
        comm = %s.comm,
        command_line = %s.command_line,
        state = %s.state,
        elapsed_seconds = s.elapsed_seconds,
        pod_uid = s.pod_uid.as_deref().unwrap_or(""),
        volume = s.volume.as_deref().unwrap_or(""),
        kernel_stack = %s.kernel_stack.join(" <- "),
        "file system tool running longer than --stuck-tool-after"
    );
}

/// Whether a tool run can matter to the node's volumes: run by uid 0 of
/// the initial user namespace (the kubelet, CSI drivers). Others, in the
/// host's mount namespace or not, cannot format nor repair a volume's
/// device: they are listed after these, and never placed on a volume.
pub fn tool_can_matter(r: &ToolExec) -> bool {
    r.uid == 0
}

/// A tool run past the threshold, with what `/proc` tells about it; its
/// volume from its argument (only when it can matter: `placed`): a volume
/// path, or a device mounted on one.
fn describe_tool(
    r: &ToolExec,
    now_ns: u64,
    root: &Path,
    placed: bool,
    mounts: &mut MountCache,
) -> StuckToolRun {
    let proc = PathBuf::from(format!("/proc/{}", r.pid));
    let device = r.device().map(str::to_string);
    let attribution = device.as_deref().filter(|_| placed).and_then(|d| {
        attribute(d, root).or_else(|| {
            d.starts_with("/dev/")
                .then(|| mounts.volume_of(&device_key(d), root))
                .flatten()
        })
    });
    // `/proc/<pid>/stat`: "pid (comm) S ...": the state follows the last ')'.
    let state = std::fs::read_to_string(proc.join("stat"))
        .ok()
        .and_then(|st| {
            let (_, rest) = st.rsplit_once(')')?;
            rest.split_whitespace().next().map(str::to_string)
        })
        .unwrap_or_default();
    StuckToolRun {
        pid: r.pid,
        comm: r.comm.clone(),
        command_line: r.command_line(),
        device,
        state,
        since: crate::cache::out_of_band::rfc3339(wall_time_of(r.start_ns)),
        elapsed_seconds: now_ns.saturating_sub(r.start_ns) as f64 / 1e9,
        pod_uid: attribution.as_ref().and_then(|a| a.key.pod_uid.clone()),
        volume: attribution.map(|a| a.key.volume),
        kernel_stack: kernel_stack(&proc.join("stack")),
    }
}

/// A task's kernel stack file, innermost first, without the addresses.
fn kernel_stack(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .map(|s| {
            s.lines()
                .map(|l| match l.split_once("] ") {
                    Some((_, f)) => f.to_string(),
                    None => l.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a call in flight can matter to the node's volumes: made by uid
/// 0 of the initial user namespace (the kubelet, CSI drivers, their mount
/// helpers), or in the agent's own mount namespace, where a path under
/// ROOT is the host's mount of it. Others are listed after these, and
/// never placed on a pod's volume.
pub fn can_matter(c: &InFlightCall, own_mnt_ns: u64) -> bool {
    c.uid == 0 || c.mnt_ns == own_mnt_ns
}

/// A stuck call, with what `/proc` tells about it; placed on a volume only
/// when it can matter (`placed`).
fn describe(c: &InFlightCall, now_ns: u64, root: &Path, placed: bool) -> StuckSyscall {
    let task = PathBuf::from(format!("/proc/{}/task/{}", c.pid, c.tid));
    let comm = std::fs::read_to_string(task.join("comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default();
    let path = c.path.clone();
    let fstype = if path.starts_with('/') {
        fstype_under(c.pid, Path::new(&path))
    } else {
        String::new()
    };
    let kernel_stack = kernel_stack(&task.join("stack"));
    let a = attribute(&path, root).filter(|_| placed);
    StuckSyscall {
        pid: c.pid,
        tid: c.tid,
        comm,
        call: c.call.into(),
        path,
        fstype,
        since: crate::cache::out_of_band::rfc3339(wall_time_of(c.start_ns)),
        elapsed_seconds: now_ns.saturating_sub(c.start_ns) as f64 / 1e9,
        pod_uid: a.as_ref().and_then(|a| a.key.pod_uid.clone()),
        volume: a.map(|a| a.key.volume),
        kernel_stack,
    }
}

/// The file system type of the mount `path` is on, in process `pid`'s
/// mount namespace (the longest mount point above it).
fn fstype_under(pid: u32, path: &Path) -> String {
    let Ok(mounts) = crate::sys::mountinfo::read(Path::new(&format!("/proc/{pid}/mountinfo")))
    else {
        return String::new();
    };
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())
        .map(|m| m.fstype.clone())
        .unwrap_or_default()
}

/// Reads the calls in flight and the tools running a few times per
/// threshold (the smaller one; at most once a second, at least every
/// 100 ms) until `shutdown`.
pub async fn run(
    tracer: Arc<EbpfTracer>,
    view: Arc<StuckView>,
    root: PathBuf,
    own_mnt_ns: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let period = (view.threshold().min(view.tool_threshold()) / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(1));
        tokio::select! {
            biased;
            () = crate::util::shutdown::requested(&mut shutdown) => return,
            () = tokio::time::sleep(period) => {}
        }
        let calls = tracer.in_flight();
        let (view, tracer, root) = (Arc::clone(&view), Arc::clone(&tracer), root.clone());
        // Reads the tools' map and /proc: off the runtime's threads.
        let _ = tokio::task::spawn_blocking(move || {
            view.update(&calls, monotonic_now_ns(), &root, own_mnt_ns);
            let tools = tracer.running_tools();
            let alive = crate::ebpf::still_running;
            view.update_tools(&tools, monotonic_now_ns(), &root, &alive);
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_past_the_threshold_are_stuck_and_the_oldest_is_measured() {
        let view = StuckView::default();
        view.set_threshold(Duration::from_secs(10));
        // This thread (its /proc entries are read).
        let path = "/r/pods/u1/volumes/kubernetes.io~nfs/data";
        let me = std::process::id();
        let tid = nix::unistd::gettid().as_raw() as u32;
        let call = |start_ns: u64, tid: u32| InFlightCall {
            pid: me,
            tid,
            call: "statfs",
            start_ns,
            mnt_ns: 1,
            path: path.to_string(),
            uid: 0,
        };
        let now = 100_000_000_000;
        view.update(&[call(now - 1_000_000_000, tid)], now, Path::new("/r"), 1);
        assert!(view.stuck().is_empty());
        assert_eq!(view.oldest_in_flight(), Duration::from_secs(1));
        view.update(
            &[
                call(now - 1_000_000_000, tid),
                call(now - 12_000_000_000, tid),
            ],
            now,
            Path::new("/r"),
            1,
        );
        let s = view.stuck();
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].path, "/r/pods/u1/volumes/kubernetes.io~nfs/data");
        assert_eq!(s[0].call, "statfs");
        assert_eq!(s[0].pod_uid.as_deref(), Some("u1"));
        assert_eq!(s[0].volume.as_deref(), Some("data"));
        assert!((s[0].elapsed_seconds - 12.0).abs() < 1e-9);
        assert!(!s[0].comm.is_empty());
        assert_eq!(view.for_pod("u1").len(), 1);
        assert!(view.for_pod("u2").is_empty());
        let text = view.prometheus_text();
        assert!(
            text.contains("volmgr_mount_syscall_oldest_in_flight_seconds 12\n"),
            "{text}"
        );
        assert!(text.contains("volmgr_mount_syscalls_stuck 1\n"), "{text}");
        assert!(
            text.contains("volmgr_mount_syscalls_in_flight 2\n"),
            "{text}"
        );
        view.update(&[], now, Path::new("/r"), 1);
        assert!(view.stuck().is_empty());
        assert!(view.inner.locked().reported.is_empty());
    }

    /// 16,384 unprivileged calls stuck in a mount namespace of their own,
    /// on a pod's volume path, and one of the host's root: the list holds
    /// the root's call and at most `MAX_STUCK_LISTED`, the rest is counted,
    /// and no unprivileged call is placed on the pod.
    #[test]
    fn the_stuck_list_is_bounded_and_prefers_calls_that_can_matter() {
        let view = StuckView::default();
        view.set_threshold(Duration::from_secs(10));
        let path = "/r/pods/u1/volumes/kubernetes.io~nfs/data";
        let me = std::process::id();
        let now = 100_000_000_000;
        let call = |start_ns: u64, tid: u32, uid: u32, mnt_ns: u64| InFlightCall {
            pid: me,
            tid,
            call: "statfs",
            start_ns,
            mnt_ns,
            path: path.to_string(),
            uid,
        };
        let mut calls: Vec<InFlightCall> = (0..16_384u32)
            .map(|i| call(now - 60_000_000_000 + u64::from(i), 100_000 + i, 65534, 2))
            .collect();
        let tid = nix::unistd::gettid().as_raw() as u32;
        // The youngest of all.
        calls.push(call(now - 11_000_000_000, tid, 0, 3));
        view.update(&calls, now, Path::new("/r"), 1);
        let s = view.stuck();
        assert_eq!(s.len(), MAX_STUCK_LISTED);
        assert_eq!(view.stuck_total(), 16_385);
        let root_call: Vec<_> = s.iter().filter(|c| c.tid == tid).collect();
        assert_eq!(root_call.len(), 1, "the root's call is listed");
        assert_eq!(root_call[0].pod_uid.as_deref(), Some("u1"));
        let placed = s.iter().filter(|c| c.pod_uid.is_some()).count();
        assert_eq!(placed, 1, "only the root's call is on the pod: {s:?}");
        assert_eq!(view.for_pod("u1").len(), 1);
        assert!(view.inner.locked().reported.len() <= MAX_STUCK_LISTED);
        let text = view.prometheus_text();
        assert!(
            text.contains("volmgr_mount_syscalls_stuck 16385\n"),
            "{text}"
        );
        assert!(
            text.contains("volmgr_mount_syscalls_stuck_not_listed 16321\n"),
            "{text}"
        );
    }

    #[test]
    fn tools_past_their_threshold_are_stuck_with_their_volume() {
        let view = StuckView::default();
        assert_eq!(view.tool_threshold(), DEFAULT_STUCK_TOOL_AFTER);
        view.set_tool_threshold(Duration::from_secs(60));
        // This process stands for the tool: its /proc entries are read.
        let run = |start_ns: u64, arg: &str| ToolExec {
            start_ns,
            end_ns: 0,
            pid: std::process::id(),
            comm: "e2fsck".into(),
            mnt_ns: 1,
            cgroup_id: 1,
            args: vec!["e2fsck".into(), "-p".into(), arg.into()],
            args_truncated: false,
            exit_code: 0,
            uid: 0,
        };
        let now = 1_000_000_000_000;
        let dir = "/r/pods/u1/volumes/kubernetes.io~local-volume/data";
        view.update_tools(
            &[run(now - 59_000_000_000, dir)],
            now,
            Path::new("/r"),
            &|_| true,
        );
        assert!(view.stuck_tools().is_empty());
        view.update_tools(
            &[
                run(now - 59_000_000_000, dir),
                run(now - 61_000_000_000, dir),
            ],
            now,
            Path::new("/r"),
            &|_| true,
        );
        let t = view.stuck_tools();
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!(t[0].comm, "e2fsck");
        assert_eq!(t[0].command_line, format!("e2fsck -p {dir}"));
        assert_eq!(t[0].device.as_deref(), Some(dir));
        assert_eq!(t[0].pod_uid.as_deref(), Some("u1"));
        assert_eq!(t[0].volume.as_deref(), Some("data"));
        assert_eq!(view.tools_for_pod("u1"), t);
        assert!(view.tools_for_pod("u2").is_empty());
        assert!((t[0].elapsed_seconds - 61.0).abs() < 1e-9);
        // This test runs: its state is R (or S between time slices).
        assert!(["R", "S"].contains(&t[0].state.as_str()), "{t:?}");
        let text = view.prometheus_text();
        assert!(text.contains("volmgr_fs_tools_running 2\n"), "{text}");
        assert!(text.contains("volmgr_fs_tools_stuck 1\n"), "{text}");
        assert!(
            text.contains("volmgr_fs_tool_oldest_running_seconds 61\n"),
            "{text}"
        );
        // A device no volume path has mounted: shown, not placed.
        view.update_tools(
            &[run(now - 61_000_000_000, "/dev/nonexistent-volmgr")],
            now,
            Path::new("/r"),
            &|_| true,
        );
        let t = view.stuck_tools();
        assert_eq!(t[0].device.as_deref(), Some("/dev/nonexistent-volmgr"));
        assert_eq!(t[0].pod_uid, None);
        view.update_tools(&[], now, Path::new("/r"), &|_| true);
        assert!(view.stuck_tools().is_empty());
        assert!(view.inner.locked().reported_tools.is_empty());
    }
}
