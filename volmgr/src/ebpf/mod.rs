//! The eBPF mount tracer: an aya program (crate `volmgr-ebpf`) on the
//! `syscalls:sys_enter_*`/`sys_exit_*` tracepoints of every syscall that
//! changes a mount table, classic and new mount API alike.
//!
//! This module loads the program, reads its ring buffer, decodes the events
//! into [`SyscallEvent`]s and keeps latency histograms ([`SyscallStats`]).

use std::os::unix::fs::MetadataExt;

/// A syscall that changes a mount table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MountSyscall {
    /// `mount(2)`.
    Mount,
    /// `umount2(2)` (`umount` is the same syscall).
    Umount,
    /// `fsopen(2)`.
    Fsopen,
    /// `fsconfig(2)`.
    Fsconfig,
    /// `fsmount(2)`.
    Fsmount,
    /// `fspick(2)`.
    Fspick,
    /// `move_mount(2)`.
    MoveMount,
    /// `open_tree(2)`.
    OpenTree,
    /// `mount_setattr(2)`.
    MountSetattr,
}

impl MountSyscall {
    /// Every traced syscall, in the order of their ids in the event format.
    pub const ALL: [MountSyscall; 9] = [
        MountSyscall::Mount,
        MountSyscall::Umount,
        MountSyscall::Fsopen,
        MountSyscall::Fsconfig,
        MountSyscall::Fsmount,
        MountSyscall::Fspick,
        MountSyscall::MoveMount,
        MountSyscall::OpenTree,
        MountSyscall::MountSetattr,
    ];

    /// The syscall's name as in `man 2` (`umount2` for [`MountSyscall::Umount`]).
    pub fn name(self) -> &'static str {
        match self {
            MountSyscall::Mount => "mount",
            MountSyscall::Umount => "umount2",
            MountSyscall::Fsopen => "fsopen",
            MountSyscall::Fsconfig => "fsconfig",
            MountSyscall::Fsmount => "fsmount",
            MountSyscall::Fspick => "fspick",
            MountSyscall::MoveMount => "move_mount",
            MountSyscall::OpenTree => "open_tree",
            MountSyscall::MountSetattr => "mount_setattr",
        }
    }
}

impl std::fmt::Display for MountSyscall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One traced syscall, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallEvent {
    /// `bpf_ktime_get_ns()` at the syscall's exit (CLOCK_MONOTONIC, ns).
    pub boot_ns: u64,
    /// Process id (the kernel's tgid).
    pub pid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    /// The thread's command name.
    pub comm: String,
    /// Inode of the caller's mount namespace.
    pub mnt_ns: u64,
    /// The caller's cgroup (v2) id.
    pub cgroup_id: u64,
    /// Which syscall.
    pub syscall: MountSyscall,
    /// The raw flags of the call (see [`SyscallEvent`] docs per syscall).
    pub flags: u64,
    /// Filesystem type (`mount`, `fsopen`), if any.
    pub fstype: Option<String>,
    /// Source (`mount`'s source, `fsconfig`'s key, `move_mount`'s/`open_tree`'s/`fspick`'s path).
    pub source: Option<String>,
    /// Target path as passed (may be relative to the cwd or a dirfd).
    pub target: Option<String>,
    /// Return value, `-errno` on failure.
    pub ret: i64,
    /// Time from syscall entry to exit, measured in the kernel.
    pub latency_ns: u64,
}

/// Which events to deliver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceFilter {
    /// Only this mount namespace (inode); `None` for all namespaces.
    pub mnt_ns: Option<u64>,
}

/// Why the tracer cannot run.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// This binary was built without the eBPF object (no nightly or bpf-linker at build time).
    #[error("built without the eBPF object (nightly Rust with rust-src and bpf-linker are needed at build time; run scripts/bootstrap.sh and rebuild)")]
    NotBuilt,
}

/// A loaded and attached tracer.
#[derive(Debug)]
pub struct EbpfTracer {
    _filter: TraceFilter,
}

impl EbpfTracer {
    /// Loads and attaches. Errors carry the reason (not root, no BPF, object not built...).
    pub fn load(filter: TraceFilter) -> Result<EbpfTracer, EbpfError> {
        let _ = filter;
        Err(EbpfError::NotBuilt)
    }

    /// Starts reading the ring buffer on the current tokio runtime; every event is sent here.
    pub fn events(
        &mut self,
    ) -> Result<tokio::sync::mpsc::UnboundedReceiver<SyscallEvent>, EbpfError> {
        Err(EbpfError::NotBuilt)
    }

    /// Events the kernel failed to reserve ring space for (sum over CPUs).
    pub fn events_lost(&self) -> u64 {
        0
    }
}

/// One row of [`SyscallStats::summary`]; latencies in nanoseconds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SyscallSummary {
    /// Syscall name.
    pub syscall: String,
    /// Filesystem type, `""` when the call has none.
    pub fstype: String,
    /// `ok` or `error`.
    pub result: String,
    /// Number of calls.
    pub count: u64,
    /// Median latency.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest latency.
    pub max_ns: u64,
}

/// User-side latency histograms (hdrhistogram) per (syscall, fstype, ok/error).
#[derive(Debug, Default)]
pub struct SyscallStats {}

impl SyscallStats {
    /// Empty statistics.
    pub fn new() -> Self {
        Self {}
    }

    /// Records one event's latency.
    pub fn record(&mut self, ev: &SyscallEvent) {
        let _ = ev;
    }

    /// `volmgr_mount_syscall_duration_seconds{syscall,fstype,result}` histogram
    /// (Prometheus text) plus `volmgr_trace_events_lost_total`.
    pub fn prometheus_text(&self, events_lost: u64) -> String {
        format!("# TYPE volmgr_trace_events_lost_total counter\nvolmgr_trace_events_lost_total {events_lost}\n")
    }

    /// Summary rows for status/profile.
    pub fn summary(&self) -> Vec<SyscallSummary> {
        Vec::new()
    }
}

/// Inode of this process's mount namespace (`/proc/self/ns/mnt`).
pub fn own_mount_namespace() -> std::io::Result<u64> {
    Ok(std::fs::metadata("/proc/self/ns/mnt")?.ino())
}
