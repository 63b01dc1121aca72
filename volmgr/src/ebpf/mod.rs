//! The eBPF mount tracer: an aya program (crate `volmgr-ebpf`) on the
//! `syscalls:sys_enter_*`/`sys_exit_*` tracepoints of every syscall that
//! changes a mount table, classic and new mount API alike.
//!
//! This module loads the program, reads its ring buffer, decodes the events
//! into [`SyscallEvent`]s and keeps latency histograms ([`SyscallStats`]).

use std::os::unix::fs::MetadataExt;

pub mod btf;
pub mod decode;
pub mod fstypes;
mod histograms;
mod loader;
pub mod report;
mod slots;
/// The event format shared with the kernel programs (`volmgr-ebpf/src/event.rs`).
#[path = "../../../volmgr-ebpf/src/event.rs"]
#[allow(dead_code)]
pub mod wire;

pub use histograms::{
    kernel_prometheus_text, ProfileRow, SyscallStats, SyscallSummary, MAX_DRIVERS, MAX_HISTOGRAMS,
    SYSCALL_BUCKETS,
};
pub use loader::{
    enable_run_time_stats, object_built, still_running, EbpfTracer, InFlightCall, KernelHistogram,
    ProgramRunStats, Walk,
};

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
    /// The caller's real uid in the initial user namespace (0: the host's
    /// root; root in a user namespace of its own is not 0).
    pub uid: u32,
}

/// A file system tool (`mkfs*`, `fsck*`, `e2fsck`, `resize2fs`,
/// `xfs_growfs`, `xfs_repair`) that ran: from its exec to its exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolExec {
    /// `CLOCK_MONOTONIC` when the exec completed, ns.
    pub start_ns: u64,
    /// `CLOCK_MONOTONIC` when the process exited, ns.
    pub end_ns: u64,
    /// Process id.
    pub pid: u32,
    /// The command name (basename of the executed file, 15 bytes at most).
    pub comm: String,
    /// Inode of the process's mount namespace.
    pub mnt_ns: u64,
    /// The process's cgroup (v2) id.
    pub cgroup_id: u64,
    /// The arguments, `argv[0]` first; only the last ones when
    /// `args_truncated`.
    pub args: Vec<String>,
    /// The argument block was longer than the kernel program keeps (its
    /// first, partial argument was dropped).
    pub args_truncated: bool,
    /// The kernel's exit code: a wait status.
    pub exit_code: i32,
    /// The process's real uid (initial user namespace) at its exec.
    pub uid: u32,
}

impl ToolExec {
    /// From exec to exit, ns.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// `ok` (exit status 0), `exit N` or `signal N`.
    pub fn result(&self) -> String {
        let signal = self.exit_code & 0x7f;
        let status = (self.exit_code >> 8) & 0xff;
        match (signal, status) {
            (0, 0) => "ok".into(),
            (0, n) => format!("exit {n}"),
            (s, _) => format!("signal {s}"),
        }
    }

    /// The device (or path) the tool works on: the last argument that is
    /// an absolute path, else the last one that is not an option.
    pub fn device(&self) -> Option<&str> {
        let skip = usize::from(!self.args_truncated);
        let args = self.args.get(skip..).unwrap_or_default();
        args.iter()
            .rev()
            .find(|a| a.starts_with('/'))
            .or_else(|| args.iter().rev().find(|a| !a.starts_with('-')))
            .map(String::as_str)
    }

    /// The command line as run (`... ` first when truncated).
    pub fn command_line(&self) -> String {
        let line = self.args.join(" ");
        if self.args_truncated {
            format!("... {line}")
        } else {
            line
        }
    }
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
    /// The kernel's BTF could not give the struct offsets the program needs.
    #[error("kernel BTF: {0}")]
    Btf(#[from] btf::BtfError),
    /// tracefs (needed to attach tracepoints) could not be mounted.
    #[error("tracefs: {0}")]
    Tracefs(String),
    /// The kernel refused the object (no CAP_BPF/CAP_SYS_ADMIN, BPF disabled, verifier...).
    #[error("loading the eBPF object (needs root or CAP_BPF+CAP_PERFMON): {0}")]
    Load(#[source] aya::EbpfError),
    /// A program could not be loaded or attached.
    #[error("eBPF program {0}: {1}")]
    Program(String, #[source] aya::programs::ProgramError),
    /// The object lacks a program.
    #[error("eBPF object has no program {0}")]
    MissingProgram(String),
    /// The object lacks a map.
    #[error("eBPF object has no map {0}")]
    MissingMap(&'static str),
    /// A map has an unexpected type.
    #[error("eBPF map {0}: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
    /// [`EbpfTracer::events`] was already called.
    #[error("the event stream was already taken")]
    AlreadyStarted,
    /// An I/O error (thread, epoll registration).
    #[error("{0}")]
    Io(#[source] std::io::Error),
}

/// Inode of this process's mount namespace (`/proc/self/ns/mnt`).
pub fn own_mount_namespace() -> std::io::Result<u64> {
    Ok(std::fs::metadata("/proc/self/ns/mnt")?.ino())
}
