//! Stuck syscalls: traced calls (the mount family, and `statfs`, which is
//! what hangs first on a network or FUSE file system whose server stopped
//! answering) that have been blocked in the kernel longer than
//! `--stuck-syscall-after`, reported while they are still blocked.
//!
//! The eBPF programs keep every call between entry and exit in a per-thread
//! map; [`run`] reads that map a few times per threshold, and for each call
//! older than the threshold reads, from `/proc`, the caller's thread name,
//! the path argument (from the caller's memory, `/proc/<pid>/mem`: the call
//! is blocked, so its argument is still there), the file system type of
//! the mount under that path (the caller's `mountinfo`, which never waits
//! for a file system) and the task's kernel stack
//! (`/proc/<pid>/task/<tid>/stack`). Each stuck call is logged once; the
//! list is in status and doctor, and the age of the oldest call in flight is
//! a gauge.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::timeline::{attribute, monotonic_now_ns, wall_time_of};
use crate::ebpf::{EbpfTracer, InFlightCall};
use crate::status::StuckSyscall;
use crate::util::prometheus::{Exposition, MetricType};
use crate::util::sync::MutexExt;

/// `--stuck-syscall-after`'s default.
pub const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(10);

/// Longest path argument read.
const PATH_MAX: usize = 4096;

#[derive(Default)]
struct Inner {
    stuck: Vec<StuckSyscall>,
    oldest_ns: u64,
    in_flight: usize,
    /// (tid, start) of the stuck calls already logged.
    reported: HashSet<(u32, u64)>,
}

/// The calls stuck now (see the module).
pub struct StuckView {
    threshold_ns: AtomicU64,
    inner: Mutex<Inner>,
}

impl Default for StuckView {
    fn default() -> Self {
        Self {
            threshold_ns: AtomicU64::new(DEFAULT_STUCK_AFTER.as_nanos() as u64),
            inner: Mutex::new(Inner::default()),
        }
    }
}

impl StuckView {
    /// Sets `--stuck-syscall-after`.
    pub fn set_threshold(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.threshold_ns.store(ns, Ordering::Relaxed);
    }

    /// `--stuck-syscall-after`.
    pub fn threshold(&self) -> Duration {
        Duration::from_nanos(self.threshold_ns.load(Ordering::Relaxed))
    }

    /// Takes the calls in flight at `now_ns` (`CLOCK_MONOTONIC`): those past
    /// the threshold become the stuck list (each logged the first time).
    pub fn update(&self, calls: &[InFlightCall], now_ns: u64, root: &Path) {
        let threshold = self.threshold_ns.load(Ordering::Relaxed);
        let oldest_ns = calls
            .iter()
            .map(|c| now_ns.saturating_sub(c.start_ns))
            .max()
            .unwrap_or(0);
        let mut old: Vec<&InFlightCall> = calls
            .iter()
            .filter(|c| now_ns.saturating_sub(c.start_ns) >= threshold)
            .collect();
        old.sort_by_key(|c| (c.start_ns, c.tid));
        let stuck: Vec<StuckSyscall> = old.iter().map(|c| describe(c, now_ns, root)).collect();
        let mut inner = self.inner.locked();
        let keys: HashSet<(u32, u64)> = old.iter().map(|c| (c.tid, c.start_ns)).collect();
        for (c, s) in old.iter().zip(&stuck) {
            if inner.reported.insert((c.tid, c.start_ns)) {
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
        inner.reported.retain(|k| keys.contains(k));
        inner.stuck = stuck;
        inner.oldest_ns = oldest_ns;
        inner.in_flight = calls.len();
    }

    /// The calls stuck at the last update, oldest first.
    pub fn stuck(&self) -> Vec<StuckSyscall> {
        self.inner.locked().stuck.clone()
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

    /// How long the oldest traced call in flight has been, at the last update.
    pub fn oldest_in_flight(&self) -> Duration {
        Duration::from_nanos(self.inner.locked().oldest_ns)
    }

    /// `volmgr_mount_syscall_oldest_in_flight_seconds` and
    /// `volmgr_mount_syscalls_stuck` (Prometheus text).
    pub fn prometheus_text(&self) -> String {
        let (oldest, stuck, in_flight) = {
            let i = self.inner.locked();
            (i.oldest_ns, i.stuck.len(), i.in_flight)
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
        w.finish()
    }
}

/// A stuck call, with what `/proc` tells about it.
fn describe(c: &InFlightCall, now_ns: u64, root: &Path) -> StuckSyscall {
    let task = PathBuf::from(format!("/proc/{}/task/{}", c.pid, c.tid));
    let comm = std::fs::read_to_string(task.join("comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default();
    let path = read_user_string(c.pid, c.path_ptr).unwrap_or_default();
    let fstype = if path.starts_with('/') {
        fstype_under(c.pid, Path::new(&path))
    } else {
        String::new()
    };
    let kernel_stack = std::fs::read_to_string(task.join("stack"))
        .map(|s| {
            s.lines()
                .map(|l| match l.split_once("] ") {
                    Some((_, f)) => f.to_string(),
                    None => l.to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    let a = attribute(&path, root);
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

/// The NUL-terminated string at `ptr` in process `pid`'s memory.
fn read_user_string(pid: u32, ptr: u64) -> Option<String> {
    if ptr == 0 {
        return None;
    }
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut out = Vec::new();
    let mut at = ptr;
    while out.len() < PATH_MAX {
        // Page by page: the string may end right before an unmapped page.
        let chunk = (4096 - (at % 4096)) as usize;
        let mut buf = vec![0u8; chunk.min(PATH_MAX - out.len())];
        let n = mem.read_at(&mut buf, at).ok()?;
        if n == 0 {
            break;
        }
        if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..end]);
            return Some(String::from_utf8_lossy(&out).into_owned());
        }
        out.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    Some(String::from_utf8_lossy(&out).into_owned())
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

/// Reads the calls in flight a few times per threshold (at most once a
/// second, at least every 100 ms) until `shutdown`.
pub async fn run(
    tracer: Arc<EbpfTracer>,
    view: Arc<StuckView>,
    root: PathBuf,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let period =
            (view.threshold() / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
        tokio::select! {
            biased;
            () = crate::util::shutdown::requested(&mut shutdown) => return,
            () = tokio::time::sleep(period) => {}
        }
        let calls = tracer.in_flight();
        let view = Arc::clone(&view);
        let root = root.clone();
        // Reads /proc: off the runtime's threads.
        let _ = tokio::task::spawn_blocking(move || {
            view.update(&calls, monotonic_now_ns(), &root);
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
        // This thread, with a path in its own memory.
        let path = std::ffi::CString::new("/r/pods/u1/volumes/kubernetes.io~nfs/data").unwrap();
        let me = std::process::id();
        let tid = nix::unistd::gettid().as_raw() as u32;
        let call = |start_ns: u64, tid: u32| InFlightCall {
            pid: me,
            tid,
            call: "statfs",
            start_ns,
            mnt_ns: 1,
            path_ptr: path.as_ptr() as u64,
        };
        let now = 100_000_000_000;
        view.update(&[call(now - 1_000_000_000, tid)], now, Path::new("/r"));
        assert!(view.stuck().is_empty());
        assert_eq!(view.oldest_in_flight(), Duration::from_secs(1));
        view.update(
            &[
                call(now - 1_000_000_000, tid),
                call(now - 12_000_000_000, tid),
            ],
            now,
            Path::new("/r"),
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
        view.update(&[], now, Path::new("/r"));
        assert!(view.stuck().is_empty());
        assert!(view.inner.locked().reported.is_empty());
    }
}
