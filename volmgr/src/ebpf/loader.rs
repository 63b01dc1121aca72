//! Loading and attaching the embedded eBPF object, and reading its maps.

use std::os::fd::AsRawFd;
use std::time::Duration;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::TracePoint;
use aya::{Ebpf, EbpfLoader};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;

use super::btf::{Btf, ExecOffsets, MntNsOffsets};
use super::decode::{decode_exec, exec_from_wire, extra_args, Decoder, ExtraArgs};
use super::slots::SlotTable;
use super::wire::{self, ExecEvent, Hist, WalkCount, WalkKey};
use super::{EbpfError, MountSyscall, SyscallEvent, ToolExec, TraceFilter};

/// The object built by `build.rs` (empty when built without it).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/volmgr-ebpf"));

// SAFETY: `Hist` is `repr(C)` plain data (u64 arrays), valid for any bytes.
unsafe impl aya::Pod for Hist {}
// SAFETY: `ExecEvent` is `repr(C)` plain data (integers and byte arrays,
// no padding the kernel leaves unset: the program writes every field),
// valid for any bytes.
unsafe impl aya::Pod for ExecEvent {}
// SAFETY: `WalkKey` and `WalkCount` are `repr(C)` plain data (integers
// and byte arrays; the program writes every field, `_pad` too), valid for
// any bytes.
unsafe impl aya::Pod for WalkKey {}
// SAFETY: as above.
unsafe impl aya::Pod for WalkCount {}

/// The tracepoints, as `syscalls:sys_{enter,exit}_<name>`.
const TRACEPOINTS: [&str; 10] = [
    "mount",
    "umount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "statfs",
];

/// The `sched:*` tracepoints of the file system tool programs (same names).
const SCHED_TRACEPOINTS: [&str; 2] = ["sched_process_exec", "sched_process_exit"];

/// The ownership, mode and label programs (`volmgr-ebpf`'s `walks!`), on
/// `syscalls:<name>`; attached where the kernel has the tracepoint
/// (`fchmodat2` is Linux 6.6).
const WALK_TRACEPOINTS: [&str; 11] = [
    "sys_enter_chown",
    "sys_enter_lchown",
    "sys_enter_fchown",
    "sys_enter_fchownat",
    "sys_enter_chmod",
    "sys_enter_fchmod",
    "sys_enter_fchmodat",
    "sys_enter_fchmodat2",
    "sys_enter_setxattr",
    "sys_enter_lsetxattr",
    "sys_enter_fsetxattr",
];

/// Whether this binary carries the eBPF object.
pub fn object_built() -> bool {
    !OBJECT.is_empty()
}

/// How often the tracer's programs ran and for how long.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProgramRunStats {
    /// Program runs (an enter and an exit per traced syscall).
    pub runs: u64,
    /// Total run time, ns.
    pub run_time_ns: u64,
}

/// Turns on the kernel's BPF run-time statistics (`BPF_ENABLE_STATS`) until
/// the returned descriptor is closed. They add two clock reads to every BPF
/// program run on the machine while on.
pub fn enable_run_time_stats() -> Result<std::os::fd::OwnedFd, EbpfError> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| EbpfError::Io(std::io::Error::other(e.to_string())))
}

/// In-kernel latency histogram of one (syscall, ok/error), summed over CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelHistogram {
    /// The syscall.
    pub syscall: MountSyscall,
    /// Whether these calls failed.
    pub error: bool,
    /// Counts per bucket; see [`super::wire::hist_bucket_bounds_ns`].
    pub buckets: Vec<u64>,
    /// Sum of latencies, ns.
    pub sum_ns: u64,
}

impl KernelHistogram {
    /// Number of calls.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// A traced call that has entered and not yet returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightCall {
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The syscall's name (`mount`, `umount2`, ..., `statfs`).
    pub call: &'static str,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at entry.
    pub start_ns: u64,
    /// Inode of the caller's mount namespace.
    pub mnt_ns: u64,
    /// The call's path argument as the kernel program copied it at entry
    /// (its first [`wire::IN_FLIGHT_PATH_MAX`]` - 1` bytes; empty when the
    /// call has none or it could not be read), lossily UTF-8.
    pub path: String,
    /// The caller's real uid in the initial user namespace.
    pub uid: u32,
}

/// The name of wire syscall id `id`, in flight ([`wire::SYS_STATFS`] included).
fn in_flight_name(id: u32) -> &'static str {
    match MountSyscall::from_wire(id) {
        Some(s) => s.name(),
        None if id == wire::SYS_STATFS => "statfs",
        None => "unknown",
    }
}

/// One process's ownership, mode or SELinux label changes in one volume
/// directory, as the kernel program counts them (`WALKS`, `WALKS_OTHER`):
/// a burst of calls without a pause of [`wire::WALK_GAP_NS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk {
    /// Process id (tgid).
    pub pid: u32,
    /// The caller's real uid in the initial user namespace.
    pub uid: u32,
    /// Inode of the caller's mount namespace.
    pub mnt_ns: u64,
    /// The command name of its first call's thread (lossily UTF-8).
    pub comm: String,
    /// The volume directory (`…/volumes/<plugin>/<name>`) as the calls
    /// named it; empty for calls on descriptors and other paths.
    pub dir: std::path::PathBuf,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) of the first call.
    pub first_ns: u64,
    /// That of the last call.
    pub last_ns: u64,
    /// `chown` family calls.
    pub chowns: u64,
    /// `chmod` family calls.
    pub chmods: u64,
    /// `security.selinux` label changes.
    pub relabels: u64,
}

impl Walk {
    fn from_wire(c: &WalkCount) -> Walk {
        use std::os::unix::ffi::OsStrExt;
        let cut = |b: &[u8]| b.iter().position(|&x| x == 0).unwrap_or(b.len());
        let dir = std::ffi::OsStr::from_bytes(&c.dir[..cut(&c.dir)]);
        Walk {
            pid: c.pid,
            uid: c.uid,
            mnt_ns: c.mnt_ns,
            comm: String::from_utf8_lossy(&c.comm[..cut(&c.comm)]).into_owned(),
            dir: dir.into(),
            first_ns: c.first_ns,
            last_ns: c.last_ns,
            chowns: c.calls[wire::WALK_CHOWN],
            chmods: c.calls[wire::WALK_CHMOD],
            relabels: c.calls[wire::WALK_RELABEL],
        }
    }
}

/// A loaded and attached tracer.
pub struct EbpfTracer {
    // Owns the programs and their links: dropping it detaches everything.
    _ebpf: Ebpf,
    ring: Option<RingBuf<MapData>>,
    /// The ring registered with the runtime, for [`EbpfTracer::next_events`].
    ring_fd: Option<AsyncFd<RingBuf<MapData>>>,
    /// The file system tool runs' ring, until [`EbpfTracer::tool_execs`].
    exec_ring: Option<RingBuf<MapData>>,
    decoder: Decoder,
    /// The last read got events or a wake-up: read again after the
    /// wake-up interval even without one (see `wait_and_drain`).
    poll_soon: bool,
    lost: PerCpuArray<MapData, u64>,
    hist: PerCpuArray<MapData, Hist>,
    starts: SlotTable,
    /// The file system tools running now (`EXECS`, by tgid): those of
    /// callers that can matter.
    execs: BpfHashMap<MapData, u32, ExecEvent>,
    /// Those of every other caller (`EXECS_OTHER`).
    execs_other: BpfHashMap<MapData, u32, ExecEvent>,
    /// Ownership walks of callers with uid 0 (`WALKS`), then of the others
    /// (`WALKS_OTHER`).
    walks: [BpfHashMap<MapData, WalkKey, WalkCount>; 2],
    filter: TraceFilter,
}

impl std::fmt::Debug for EbpfTracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EbpfTracer")
            .field("filter", &self.filter)
            .finish_non_exhaustive()
    }
}

impl EbpfTracer {
    /// Loads and attaches. Errors carry the reason (not root, no BPF, object not built...).
    pub fn load(filter: TraceFilter) -> Result<EbpfTracer, EbpfError> {
        if !object_built() {
            return Err(EbpfError::NotBuilt);
        }
        let offsets = {
            let btf = Btf::from_sys_fs()?;
            (MntNsOffsets::from_btf(&btf)?, ExecOffsets::from_btf(&btf)?)
        };
        // Attaching a tracepoint reads its id from tracefs. When tracefs is
        // not mounted here, it is mounted in a private mount namespace of a
        // short-lived thread, so the caller's mount table is left alone.
        let handle = std::thread::Builder::new()
            .name("volmgr-ebpf-load".into())
            .spawn(move || load_in_thread(filter, offsets))
            .map_err(EbpfError::Io)?;
        let mut ebpf = handle
            .join()
            .map_err(|_| EbpfError::Tracefs("the loading thread panicked".into()))??;
        let ring = RingBuf::try_from(take_map(&mut ebpf, "EVENTS")?)
            .map_err(|e| EbpfError::Map("EVENTS", e))?;
        let lost = PerCpuArray::try_from(take_map(&mut ebpf, "LOST")?)
            .map_err(|e| EbpfError::Map("LOST", e))?;
        let hist = PerCpuArray::try_from(take_map(&mut ebpf, "HIST")?)
            .map_err(|e| EbpfError::Map("HIST", e))?;
        let starts = SlotTable::new(
            take_map(&mut ebpf, "STARTS")?,
            take_map(&mut ebpf, "PATHS")?,
        )?;
        let exec_ring = RingBuf::try_from(take_map(&mut ebpf, "EXEC_EVENTS")?)
            .map_err(|e| EbpfError::Map("EXEC_EVENTS", e))?;
        let execs = BpfHashMap::try_from(take_map(&mut ebpf, "EXECS")?)
            .map_err(|e| EbpfError::Map("EXECS", e))?;
        let execs_other = BpfHashMap::try_from(take_map(&mut ebpf, "EXECS_OTHER")?)
            .map_err(|e| EbpfError::Map("EXECS_OTHER", e))?;
        let walks = [
            walk_map(&mut ebpf, "WALKS")?,
            walk_map(&mut ebpf, "WALKS_OTHER")?,
        ];
        Ok(EbpfTracer {
            _ebpf: ebpf,
            ring: Some(ring),
            ring_fd: None,
            exec_ring: Some(exec_ring),
            decoder: Decoder::default(),
            poll_soon: false,
            lost,
            hist,
            starts,
            execs,
            execs_other,
            walks,
            filter,
        })
    }

    /// The filter this tracer was loaded with.
    pub fn filter(&self) -> TraceFilter {
        self.filter
    }

    /// Starts reading the ring buffer on the current tokio runtime; every event is sent here.
    pub fn events(&mut self) -> Result<mpsc::UnboundedReceiver<SyscallEvent>, EbpfError> {
        let fd = self.ring_fd()?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(read_ring(fd, move |ev, _| tx.send(ev).is_ok()));
        Ok(rx)
    }

    /// Like [`EbpfTracer::events`], with each call's descriptor and extra
    /// arguments (for `volmgr trace`).
    pub fn detailed_events(
        &mut self,
    ) -> Result<mpsc::UnboundedReceiver<(SyscallEvent, ExtraArgs)>, EbpfError> {
        let fd = self.ring_fd()?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(read_ring(fd, move |ev, x| tx.send((ev, x)).is_ok()));
        Ok(rx)
    }

    /// Starts reading the file system tool runs (`mkfs`, `fsck`,
    /// `resize2fs`, ...) on the current tokio runtime; each finished run is
    /// sent here.
    pub fn tool_execs(&mut self) -> Result<mpsc::UnboundedReceiver<ToolExec>, EbpfError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(EbpfError::Io(std::io::Error::other(
                "the event stream needs a tokio runtime",
            )));
        }
        let ring = self.exec_ring.take().ok_or(EbpfError::AlreadyStarted)?;
        // SAFETY: as in `ring_fd`: the RingBuf owns its descriptor.
        let fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| EbpfError::Io(e.into()))?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(read_exec_ring(fd, tx));
        Ok(rx)
    }

    /// Waits until events are ready and appends them all to `out` (the
    /// alternative to [`EbpfTracer::events`] for a caller that owns its loop).
    pub async fn next_events(
        &mut self,
        out: &mut Vec<(SyscallEvent, ExtraArgs)>,
    ) -> Result<(), EbpfError> {
        if self.ring_fd.is_none() {
            self.ring_fd = Some(self.ring_fd()?);
        }
        let Some(fd) = self.ring_fd.as_mut() else {
            return Err(EbpfError::AlreadyStarted);
        };
        self.poll_soon = wait_and_drain(fd, &mut self.decoder, self.poll_soon, &mut |ev, x| {
            out.push((ev, x));
            true
        })
        .await
        .map_err(EbpfError::Io)?;
        Ok(())
    }

    /// Appends every event already in the ring to `out`, without waiting:
    /// after a syscall has returned, its event is there.
    pub fn drain_now(&mut self, out: &mut Vec<(SyscallEvent, ExtraArgs)>) {
        if let Some(fd) = self.ring_fd.as_mut() {
            drain(fd.get_mut(), &mut self.decoder, out);
        } else if let Some(ring) = self.ring.as_mut() {
            drain(ring, &mut self.decoder, out);
        }
    }

    /// The ring buffer, registered with the current runtime's reactor.
    fn ring_fd(&mut self) -> Result<AsyncFd<RingBuf<MapData>>, EbpfError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(EbpfError::Io(std::io::Error::other(
                "the event stream needs a tokio runtime",
            )));
        }
        let ring = self.ring.take().ok_or(EbpfError::AlreadyStarted)?;
        // SAFETY: the RingBuf owns its map's descriptor (an OwnedFd in
        // MapData) and keeps returning it until it is dropped with the AsyncFd.
        unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| EbpfError::Io(e.into()))
    }

    /// `LOST` counter `key`, summed over CPUs.
    fn lost(&self, key: u32) -> u64 {
        self.lost
            .get(&key, 0)
            .map(|v| v.iter().copied().sum())
            .unwrap_or(0)
    }

    /// Events the kernel failed to reserve ring space for (sum over CPUs).
    pub fn events_lost(&self) -> u64 {
        self.lost(wire::LOST_EVENTS)
    }

    /// File system tool runs the kernel had no room for (sum over CPUs).
    pub fn tool_runs_lost(&self) -> u64 {
        self.lost(wire::LOST_TOOL_RUNS)
    }

    /// Calls not traced because their in-flight slot (thread id modulo
    /// [`wire::IN_FLIGHT_SLOTS`]) was held by a call of another thread.
    pub fn slot_collisions(&self) -> u64 {
        self.lost(wire::LOST_SLOT_BUSY)
    }

    /// The traced calls in flight now (entered, not returned), from the
    /// programs' in-flight slots (mapped into this process: no syscall),
    /// with the path argument the entry program copied (no read of the
    /// caller's memory). A slot that changes while it is read is skipped
    /// (its call just began or ended).
    pub fn in_flight(&self) -> Vec<InFlightCall> {
        self.starts
            .held()
            .into_iter()
            .map(|(s, path)| {
                let key = s.owner;
                InFlightCall {
                    pid: (key >> 32) as u32,
                    tid: key as u32,
                    call: in_flight_name(s.syscall),
                    start_ns: s.ts,
                    mnt_ns: s.mnt_ns,
                    path: String::from_utf8_lossy(&path).into_owned(),
                    uid: s.uid,
                }
            })
            .collect()
    }

    /// The file system tools (`mkfs*`, `fsck*`, ...) running now: exec'd
    /// since the tracer was attached and not exited (`end_ns` 0), read
    /// from the kernel program's two tables (two syscalls per run, at
    /// most [`wire::EXECS_MAX`] runs each): those of callers that can
    /// matter (uid 0), then the others. Whether
    /// a run's process is still that program is for [`still_running`].
    pub fn running_tools(&self) -> Vec<ToolExec> {
        [&self.execs, &self.execs_other]
            .into_iter()
            .flat_map(|m| m.iter().filter_map(Result::ok))
            .filter(|(_, e)| e.end_ns == 0)
            .filter_map(|(_, e)| exec_from_wire(&e))
            .collect()
    }

    /// The ownership walks counted now: those of callers with uid 0 (the
    /// first table, `true`), then the others' (`false`); at most
    /// [`wire::WALKS_MAX`] each (two syscalls per walk).
    pub fn walks(&self) -> Vec<(bool, Walk)> {
        let [root, other] = &self.walks;
        [(true, root), (false, other)]
            .into_iter()
            .flat_map(|(r, m)| m.iter().filter_map(Result::ok).map(move |(_, c)| (r, c)))
            .map(|(r, c)| (r, Walk::from_wire(&c)))
            .collect()
    }

    /// Runs of this tracer's syscall programs and the time they took,
    /// summed over them (the kernel counts only while run-time statistics
    /// are on, see [`enable_run_time_stats`]). The file system tool
    /// programs (on every process exit of the machine) and the ownership
    /// walk ones are left out.
    pub fn program_run_stats(&self) -> ProgramRunStats {
        self.run_stats(|name| {
            !SCHED_TRACEPOINTS.contains(&name) && !WALK_TRACEPOINTS.contains(&name)
        })
    }

    /// As [`Self::program_run_stats`], of the ownership walk programs only
    /// (`chown`, `chmod`, `setxattr` families).
    pub fn walk_program_run_stats(&self) -> ProgramRunStats {
        self.run_stats(|name| WALK_TRACEPOINTS.contains(&name))
    }

    fn run_stats(&self, counted: impl Fn(&str) -> bool) -> ProgramRunStats {
        let mut st = ProgramRunStats::default();
        for (name, prog) in self._ebpf.programs() {
            if !counted(name) {
                continue;
            }
            if let Ok(info) = prog.info() {
                st.runs += info.run_count();
                st.run_time_ns += u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
            }
        }
        st
    }

    /// The in-kernel latency histograms, summed over CPUs; only pairs with
    /// at least one call.
    pub fn kernel_histograms(&self) -> Vec<KernelHistogram> {
        let mut out = Vec::new();
        for (i, syscall) in MountSyscall::ALL.iter().enumerate() {
            for error in [false, true] {
                let key = (i * 2 + usize::from(error)) as u32;
                let Ok(per_cpu) = self.hist.get(&key, 0) else {
                    continue;
                };
                let mut buckets = vec![0u64; wire::HIST_BUCKETS];
                let mut sum_ns = 0u64;
                for h in per_cpu.iter() {
                    for (b, c) in buckets.iter_mut().zip(h.buckets.iter()) {
                        *b += c;
                    }
                    sum_ns = sum_ns.wrapping_add(h.sum_ns);
                }
                let k = KernelHistogram {
                    syscall: *syscall,
                    error,
                    buckets,
                    sum_ns,
                };
                if k.count() > 0 {
                    out.push(k);
                }
            }
        }
        out
    }
}

fn walk_map(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<BpfHashMap<MapData, WalkKey, WalkCount>, EbpfError> {
    BpfHashMap::try_from(take_map(ebpf, name)?).map_err(|e| EbpfError::Map(name, e))
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, EbpfError> {
    ebpf.take_map(name).ok_or(EbpfError::MissingMap(name))
}

/// Whether tracefs is mounted where aya looks for it, in this thread's view.
fn tracefs_visible() -> bool {
    [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).is_dir())
}

/// Mounts tracefs in a new mount namespace private to the calling thread.
fn private_tracefs() -> Result<(), EbpfError> {
    use nix::mount::{mount, MsFlags};
    use nix::sched::{unshare, CloneFlags};
    let err = |what: &str, e: nix::Error| {
        EbpfError::Tracefs(format!(
            "not mounted at /sys/kernel/tracing, and mounting it in a private mount namespace failed (needs root): {what}: {e}"
        ))
    };
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| err("unshare(CLONE_NEWNS)", e))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| err("making / private", e))?;
    mount(
        Some("tracefs"),
        "/sys/kernel/tracing",
        Some("tracefs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| err("mounting tracefs on /sys/kernel/tracing", e))
}

fn load_in_thread(
    filter: TraceFilter,
    (offsets, exec): (MntNsOffsets, ExecOffsets),
) -> Result<Ebpf, EbpfError> {
    if !tracefs_visible() {
        private_tracefs()?;
    }
    let mnt_ns = filter.mnt_ns.unwrap_or(0);
    let mut ebpf = EbpfLoader::new()
        .override_global("FILTER_MNT_NS", &mnt_ns, true)
        .override_global("OFF_TASK_NSPROXY", &offsets.task_nsproxy, true)
        .override_global("OFF_NSPROXY_MNT_NS", &offsets.nsproxy_mnt_ns, true)
        .override_global("OFF_MNT_NS_INUM", &offsets.mnt_ns_inum, true)
        .override_global("OFF_TASK_MM", &exec.task_mm, true)
        .override_global("OFF_MM_ARG_START", &exec.mm_arg_start, true)
        .override_global("OFF_MM_ARG_END", &exec.mm_arg_end, true)
        .override_global("OFF_TASK_EXIT_CODE", &exec.task_exit_code, true)
        .load(OBJECT)
        .map_err(EbpfError::Load)?;
    // Exits first: a call that enters once its entry program is attached
    // then always meets its exit program, which frees its slot.
    for dir in ["exit", "enter"] {
        for name in TRACEPOINTS {
            attach(&mut ebpf, "syscalls", &format!("sys_{dir}_{name}"))?;
        }
    }
    for name in SCHED_TRACEPOINTS {
        attach(&mut ebpf, "sched", name)?;
    }
    // A kernel without one of them (fchmodat2) only counts fewer walks.
    for name in WALK_TRACEPOINTS {
        if let Err(e) = attach(&mut ebpf, "syscalls", name) {
            tracing::info!(program = name, error = %e, "ownership walk program not attached");
        }
    }
    Ok(ebpf)
}

/// Whether process `x.pid` still runs tool run `x`'s program (its
/// `/proc/<pid>/comm` is the run's): a process gone, or that runs another
/// program now, is not.
pub fn still_running(x: &ToolExec) -> bool {
    std::fs::read_to_string(format!("/proc/{}/comm", x.pid))
        .is_ok_and(|c| c.trim_end_matches('\n') == x.comm)
}

/// Loads program `prog` and attaches it to tracepoint `category:prog`.
fn attach(ebpf: &mut Ebpf, category: &str, prog: &str) -> Result<(), EbpfError> {
    let tp: &mut TracePoint = ebpf
        .program_mut(prog)
        .ok_or_else(|| EbpfError::MissingProgram(prog.to_string()))?
        .try_into()
        .map_err(|e| EbpfError::Program(prog.to_string(), e))?;
    tp.load()
        .map_err(|e| EbpfError::Program(prog.to_string(), e))?;
    tp.attach(category, prog)
        .map_err(|e| EbpfError::Program(prog.to_string(), e))?;
    Ok(())
}

/// Sends every file system tool run read from `fd` until the receiver is
/// gone. Runs are rare and wake the reader each (the kernel's default);
/// the ring is also read once a second in case a wake-up was missed.
async fn read_exec_ring(mut fd: AsyncFd<RingBuf<MapData>>, tx: mpsc::UnboundedSender<ToolExec>) {
    let send_all = |ring: &mut RingBuf<MapData>| {
        while let Some(item) = ring.next() {
            if let Some(x) = decode_exec(&item) {
                if tx.send(x).is_err() {
                    return false;
                }
            }
        }
        true
    };
    loop {
        let open = match tokio::time::timeout(Duration::from_secs(1), fd.readable_mut()).await {
            Ok(Ok(mut guard)) => {
                let open = send_all(guard.get_inner_mut());
                guard.clear_ready();
                open
            }
            Ok(Err(e)) => {
                tracing::error!("eBPF tool-run ring buffer: {e}");
                return;
            }
            Err(_) => send_all(fd.get_mut()),
        };
        if !open || tx.is_closed() {
            return;
        }
    }
}

fn drain(
    ring: &mut RingBuf<MapData>,
    decoder: &mut Decoder,
    out: &mut Vec<(SyscallEvent, ExtraArgs)>,
) {
    while let Some(item) = ring.next() {
        let x = extra_args(&item).unwrap_or_default();
        if let Some(ev) = decoder.decode(&item) {
            out.push((ev, x));
        }
    }
}

/// Waits until the ring is readable (or, when `poll_soon`, at most one
/// wake-up interval: the kernel skips wake-ups within an interval of the
/// last one) and hands every event to `send`. Stops early when `send`
/// returns false. Returns whether the next wait must be short too: it
/// may block without a time limit only after a whole interval passed with
/// no event and no wake-up. An event the programs sent without a wake-up
/// follows a wake-up by less than an interval, so it is always read by
/// such a short wait, even when an earlier read (or [`drain_now`]) took the
/// event whose wake-up is still pending and that wake-up finds nothing.
///
/// [`drain_now`]: EbpfTracer::drain_now
async fn wait_and_drain(
    fd: &mut AsyncFd<RingBuf<MapData>>,
    decoder: &mut Decoder,
    poll_soon: bool,
    send: &mut (impl FnMut(SyscallEvent, ExtraArgs) -> bool + Send),
) -> std::io::Result<bool> {
    let mut n = 0;
    let mut each = |ring: &mut RingBuf<MapData>| {
        while let Some(item) = ring.next() {
            let x = extra_args(&item).unwrap_or_default();
            if let Some(ev) = decoder.decode(&item) {
                n += 1;
                if !send(ev, x) {
                    return false;
                }
            }
        }
        true
    };
    let interval = Duration::from_nanos(wire::WAKE_INTERVAL_NS);
    let ready = if poll_soon {
        tokio::time::timeout(interval, fd.readable_mut()).await.ok()
    } else {
        Some(fd.readable_mut().await)
    };
    let woken = ready.is_some();
    match ready {
        Some(guard) => {
            let mut guard = guard?;
            each(guard.get_inner_mut());
            guard.clear_ready();
        }
        None => {
            each(fd.get_mut());
        }
    }
    Ok(n > 0 || woken)
}

/// Drains the ring buffer whenever it becomes readable (or soon after
/// events, see [`wait_and_drain`]), until `send` returns false (the
/// receiver is gone).
async fn read_ring(
    mut fd: AsyncFd<RingBuf<MapData>>,
    mut send: impl FnMut(SyscallEvent, ExtraArgs) -> bool + Send + 'static,
) {
    let mut decoder = Decoder::default();
    let mut poll_soon = false;
    let open = std::sync::atomic::AtomicBool::new(true);
    let mut send_checked = |ev, x| {
        let ok = send(ev, x);
        open.store(ok, std::sync::atomic::Ordering::Relaxed);
        ok
    };
    loop {
        match wait_and_drain(&mut fd, &mut decoder, poll_soon, &mut send_checked).await {
            Ok(soon) => poll_soon = soon,
            Err(e) => {
                tracing::error!(fd = fd.get_ref().as_raw_fd(), "eBPF ring buffer: {e}");
                return;
            }
        }
        if !open.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
    }
}
