//! Tracers keep the actual state of world true between resyncs: when someone
//! else unmounts a managed volume, or mounts something on its path, the
//! manager learns it at once and checks the kernel's mount table
//! ([`check`]). A tracer only observes: it records what it found in the
//! actual state (a lost volume becomes uncertain; foreign mounts on a
//! volume's path are marked for removal), logs it in the out-of-band log and
//! marks the volume dirty, which wakes the reconciler at once. The
//! reconciler makes every repair, through the operation executor, as for
//! any other operation.
//!
//! A tracer is started with a [`TracerContext`] (the shared state, a reader
//! of the mount table, a read-only view of the operations in flight) and
//! reports itself in a [`TracerStatus`] the volume manager shows.
//!
//! `--tracer auto|ebpf|mountinfo|off` picks one:
//!
//! - `ebpf` ([`ebpf_events`]): the aya program sees every mount-table syscall
//!   with its caller, path and latency; only calls by other processes on
//!   managed paths lead to a check, and every call lands in the latency
//!   histograms (`volmgr_mount_syscall_duration_seconds`, status). It also
//!   keeps the per-volume timelines of every process's calls
//!   ([`timeline`]), with the file system tools run on their devices
//!   ([`devices`]), and reports calls stuck in the kernel ([`stuck`]).
//! - `mountinfo` ([`mountinfo_poller`]): `poll(POLLPRI)` on
//!   `/proc/self/mountinfo` and a diff; needs no privilege beyond reading
//!   proc, but cannot tell who changed what, nor how long it took.
//! - `off`: only the periodic resync finds out-of-band changes.
//! - `auto` (default): `ebpf` if it loads, `mountinfo` otherwise, with the
//!   reason logged and shown in `volmgr status`. The program loads in the
//!   background at low priority; a check of everything when a tracer starts
//!   covers the changes made before it watched.
//!
//! What was found is kept in the [`out_of_band`] log for status.

pub mod check;
pub mod context;
pub mod devices;
pub mod ebpf_events;
pub mod mountinfo_poller;
pub mod stuck;
pub mod timeline;

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::ebpf::{self, EbpfError, EbpfTracer, SyscallStats, TraceFilter};
use crate::status::{SyscallLatency, TracerStats};

use crate::util::sync::MutexExt;
use check::{CheckCounters, Checker};
pub use context::{MetricsSource, StatsSource, TracerContext, TracerStatus};
use mountinfo_poller::{MountinfoPoller, PollerError};

/// The `--tracer` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TracerMode {
    /// eBPF if it loads, else the mountinfo poller.
    #[default]
    Auto,
    /// eBPF or fail.
    Ebpf,
    /// The mountinfo poller.
    Mountinfo,
    /// No tracer: the periodic resync only.
    Off,
}

impl TracerMode {
    /// The name used on the command line and in the C ABI.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Ebpf => "ebpf",
            Self::Mountinfo => "mountinfo",
            Self::Off => "off",
        }
    }
}

impl fmt::Display for TracerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TracerMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "ebpf" => Ok(Self::Ebpf),
            "mountinfo" => Ok(Self::Mountinfo),
            "off" => Ok(Self::Off),
            _ => Err(format!(
                "unknown tracer {s:?} (expected auto, ebpf, mountinfo or off)"
            )),
        }
    }
}

/// Why the chosen tracer could not start.
#[derive(Debug, thiserror::Error)]
pub enum TracerError {
    /// `--tracer ebpf` and the program cannot be loaded.
    #[error(
        "the eBPF tracer cannot be loaded: {0} (use --tracer auto or mountinfo to run without it)"
    )]
    Ebpf(#[source] EbpfError),
    /// The mount namespace of this process cannot be read.
    #[error("reading this process's mount namespace: {0}")]
    Namespace(#[source] std::io::Error),
    /// The mountinfo poller could not start.
    #[error(transparent)]
    Mountinfo(#[from] PollerError),
}

/// How long to pause after a mount-table read that took `took`: nothing
/// after a quick one (a small table: out-of-band changes are handled at
/// once), four times as long after one over a millisecond (a table of
/// thousands of mounts during a burst of changes), so reading uses at most a
/// fifth of a core.
pub fn duty_pause(took: std::time::Duration) -> std::time::Duration {
    if took > std::time::Duration::from_millis(1) {
        took.saturating_mul(4)
    } else {
        std::time::Duration::ZERO
    }
}

/// Counters shared by the tracers (for status).
#[derive(Debug, Default)]
pub struct TracerCounters {
    /// Changes reported.
    pub events: AtomicU64,
    /// Changes that touched (or may have touched) a managed path and were
    /// not the manager's own as far as the tracer can tell.
    pub out_of_band_events: AtomicU64,
    /// Observe mode: nothing under ROOT is managed, so no change is out of
    /// band (they are the kubelet's: its volumes' mounts, the bind of its
    /// root onto itself) and none calls for a check of managed volumes.
    pub observing: bool,
}

impl TracerCounters {
    /// Counters for a tracer started with `ctx`.
    fn for_context(ctx: &TracerContext) -> Self {
        Self {
            observing: ctx.status.observing(),
            ..Self::default()
        }
    }
}

/// The running tracer.
pub struct ActiveTracer {
    /// `ebpf`, `mountinfo` or `off`.
    pub name: &'static str,
    /// Why this one.
    pub reason: String,
    tasks: Vec<JoinHandle<()>>,
}

impl ActiveTracer {
    /// Waits for the tracer's tasks after `shutdown` was signalled.
    pub async fn join(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Starts the tracer `mode` asks for on the current runtime (before the
/// manager starts, so nothing between reconstruction and the first event is
/// missed), records it in `ctx.status` and logs the choice. Runs until
/// `shutdown` turns true. Every mount call of this process is the manager's
/// own (the agent).
pub fn start(
    mode: TracerMode,
    ctx: TracerContext,
    shutdown: watch::Receiver<bool>,
) -> Result<ActiveTracer, TracerError> {
    start_inner(mode, ctx, shutdown, None)
}

/// [`start`] for a manager linked into a host process (the C ABI): only
/// mount calls from threads named `thread_name` (the manager's runtime, which
/// also runs host plugins) are the manager's own; the host's other threads
/// are "another process" (eBPF tracer).
pub fn start_in_host(
    mode: TracerMode,
    ctx: TracerContext,
    shutdown: watch::Receiver<bool>,
    thread_name: &str,
) -> Result<ActiveTracer, TracerError> {
    start_inner(mode, ctx, shutdown, Some(thread_name))
}

fn start_inner(
    mode: TracerMode,
    ctx: TracerContext,
    shutdown: watch::Receiver<bool>,
    thread_name: Option<&str>,
) -> Result<ActiveTracer, TracerError> {
    let active = match mode {
        TracerMode::Off => ActiveTracer {
            name: "off",
            reason: format!(
                "--tracer off: out-of-band changes are found by the resync (every {:?})",
                ctx.resync_period
            ),
            tasks: Vec::new(),
        },
        TracerMode::Mountinfo => start_mountinfo(
            &ctx,
            shutdown,
            "--tracer mountinfo: poll(POLLPRI) on /proc/self/mountinfo".into(),
        )?,
        TracerMode::Ebpf => {
            let loaded = load_ebpf(thread_name)?;
            attach_ebpf(&ctx, loaded, shutdown, "")?
        }
        TracerMode::Auto => return Ok(start_auto(ctx, shutdown, thread_name)),
    };
    tracing::info!(tracer = active.name, reason = %active.reason, "tracer selected");
    ctx.status.set(active.name, &active.reason);
    Ok(active)
}

/// `auto`: loading the eBPF program takes a while (about 0.2 s of CPU in a
/// release build: BTF parsing and verification), so it loads in the
/// background at the lowest priority, once the manager's start-up work has
/// settled ([`wait_for_quiet`]); when it is attached, one check of
/// everything covers what changed meanwhile (the periodic resync covers the
/// same window if it never loads). If it cannot load, the mountinfo poller
/// takes over (after a check of everything too), and status says why. No
/// poller runs during the load: on a node starting with thousands of
/// volumes it would re-read a growing mount table for each of the manager's
/// own mounts.
fn start_auto(
    ctx: TracerContext,
    shutdown: watch::Receiver<bool>,
    thread_name: Option<&str>,
) -> ActiveTracer {
    // Not "off": a tracer is coming (status says `loading` until then).
    let name = "loading";
    let reason = "auto: the eBPF tracer is loading".to_string();
    ctx.status.set(name, &reason);
    tracing::info!(
        "loading the eBPF tracer in the background (the mountinfo poller if it cannot load)"
    );
    let thread_name = thread_name.map(str::to_string);
    let mut stop = shutdown.clone();
    let task = tokio::spawn(async move {
        tokio::select! {
            () = wait_for_quiet(&ctx.world, LOAD_QUIET, LOAD_MAX_DELAY) => {}
            () = crate::util::shutdown::requested(&mut stop) => return,
        }
        let loaded = load_in_background(thread_name).await;
        let mut tasks = Vec::new();
        match loaded.and_then(|l| attach_ebpf(&ctx, l, shutdown.clone(), "auto: ")) {
            Ok(t) => {
                tracing::info!(tracer = t.name, reason = %t.reason, "tracer selected");
                ctx.status.set(t.name, &t.reason);
                tasks = t.tasks;
            }
            Err(e) => {
                let why = match &e {
                    TracerError::Ebpf(e) => e.to_string(),
                    e => e.to_string(),
                };
                let fallback = start_mountinfo(
                    &ctx,
                    shutdown.clone(),
                    format!(
                        "auto: eBPF unavailable ({why}); poll(POLLPRI) on /proc/self/mountinfo"
                    ),
                );
                let (name, reason) = match fallback {
                    Ok(p) => {
                        tasks = p.tasks;
                        (p.name, p.reason)
                    }
                    Err(pe) => (
                        "off",
                        format!(
                            "auto: eBPF unavailable ({why}); mountinfo poller unavailable ({pe})"
                        ),
                    ),
                };
                tracing::warn!(tracer = name, reason = %reason, "eBPF tracer unavailable; falling back");
                ctx.status.set(name, &reason);
            }
        }
        crate::util::shutdown::requested(&mut stop).await;
        for t in tasks {
            let _ = t.await;
        }
    });
    ActiveTracer {
        name,
        reason,
        tasks: vec![task],
    }
}

fn start_mountinfo(
    ctx: &TracerContext,
    shutdown: watch::Receiver<bool>,
    reason: String,
) -> Result<ActiveTracer, TracerError> {
    let poller = MountinfoPoller::open(ctx.root_path())?;
    let counters = Arc::new(TracerCounters::for_context(ctx));
    let check_counters = Arc::new(CheckCounters::default());
    let (checks, check_task) =
        Checker::new(ctx, Arc::clone(&check_counters)).spawn(shutdown.clone());
    // The poller sees changes from now on; one check of everything covers
    // what happened before it started (e.g. while `auto` tried eBPF).
    checks.check_everything_at_start(
        crate::cache::out_of_band::DetectedBy::Mountinfo,
        "check when the mountinfo poller started",
    );
    let poll_task = poller.spawn(checks, Arc::clone(&counters), shutdown)?;
    ctx.status.set_stats_source(Arc::new(move || {
        (stats_of(&counters, &check_counters, 0), Vec::new())
    }));
    Ok(ActiveTracer {
        name: "mountinfo",
        reason,
        tasks: vec![check_task, poll_task],
    })
}

/// A loaded, attached eBPF program, not yet read.
struct LoadedEbpf {
    tracer: EbpfTracer,
    mnt_ns: u64,
    thread_name: Option<String>,
}

/// How long the states must stay unchanged before `auto` loads eBPF.
const LOAD_QUIET: Duration = Duration::from_millis(50);

/// The longest `auto` puts the load off on a node that never settles.
const LOAD_MAX_DELAY: Duration = Duration::from_secs(5);

/// Returns once neither world has changed for `quiet` (sampled, so a storm
/// of changes costs one wake-up per `quiet`), or after `max`. The eBPF load
/// keeps a CPU busy for about 0.2 s even at the lowest priority, and a busy
/// CPU is exactly what makes every `umount2` of a storm slow (each waits for
/// an RCU grace period, which must then interrupt that CPU: 7 µs with the
/// other CPU idle, 50-65 µs with it busy, `cargo bench --bench umount_cost`).
async fn wait_for_quiet(world: &Arc<crate::cache::world::World>, quiet: Duration, max: Duration) {
    let deadline = tokio::time::Instant::now() + max;
    let mut last = world.generation();
    loop {
        tokio::time::sleep(quiet).await;
        let now = world.generation();
        if now == last || tokio::time::Instant::now() >= deadline {
            return;
        }
        last = now;
    }
}

/// `auto`'s load: on a thread of its own at the lowest CPU priority, so
/// the BTF parsing and verification (about 0.2 s of CPU) never slows the
/// mounts of a node starting up; the memory the parsing used goes back to
/// the system afterwards (it would otherwise stay in that thread's malloc
/// arena, tens of MiB).
async fn load_in_background(thread_name: Option<String>) -> Result<LoadedEbpf, TracerError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("volmgr-bpf-load".into())
        .spawn(move || {
            // SAFETY: setpriority on this thread (Linux applies PRIO_PROCESS
            // with a thread id to that thread only); failure only means
            // the load competes at normal priority.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
            }
            let loaded = load_ebpf(thread_name.as_deref());
            // BTF parsing left tens of MB in this thread's arena.
            crate::sys::memory::release_free_heap();
            let _ = tx.send(loaded);
        });
    let failed = |e: String| {
        Err(TracerError::Namespace(std::io::Error::other(format!(
            "the loading thread failed: {e}"
        ))))
    };
    match spawned {
        Ok(_) => rx.await.unwrap_or_else(|e| failed(e.to_string())),
        Err(e) => failed(e.to_string()),
    }
}

fn load_ebpf(thread_name: Option<&str>) -> Result<LoadedEbpf, TracerError> {
    let mnt_ns = ebpf::own_mount_namespace().map_err(TracerError::Namespace)?;
    // Every namespace: CSI driver containers mount in their own; only
    // calls in this one lead to checks (see `ebpf_events::scopes`).
    let tracer = EbpfTracer::load(TraceFilter { mnt_ns: None }).map_err(TracerError::Ebpf)?;
    Ok(LoadedEbpf {
        tracer,
        mnt_ns,
        thread_name: thread_name.map(str::to_string),
    })
}

/// Attaches the loaded program: a checker, the task reading its events,
/// and its latencies in status and metrics.
fn attach_ebpf(
    ctx: &TracerContext,
    loaded: LoadedEbpf,
    shutdown: watch::Receiver<bool>,
    reason_prefix: &str,
) -> Result<ActiveTracer, TracerError> {
    let LoadedEbpf {
        mut tracer,
        mnt_ns,
        thread_name,
    } = loaded;
    let events = tracer.events().map_err(TracerError::Ebpf)?;
    let execs = tracer.tool_execs().map_err(TracerError::Ebpf)?;
    let tracer = Arc::new(tracer);
    let counters = Arc::new(TracerCounters::for_context(ctx));
    let check_counters = Arc::new(CheckCounters::default());
    let stats = Arc::new(Mutex::new(SyscallStats::new()));
    let (checks, check_task) =
        Checker::new(ctx, Arc::clone(&check_counters)).spawn(shutdown.clone());
    let own = ebpf_events::Own {
        pid: std::process::id(),
        // The kernel keeps 15 bytes of a thread's name.
        comm: thread_name.map(|n| n.chars().take(15).collect()),
        mnt_ns,
        root: ctx.root_path().to_path_buf(),
    };
    // Whatever changed before the program was attached (while it loaded)
    // is found by one check of everything now.
    checks.check_everything_at_start(
        crate::cache::out_of_band::DetectedBy::Ebpf,
        "check when the eBPF tracer attached",
    );
    let stuck_task = tokio::spawn(stuck::run(
        Arc::clone(&tracer),
        Arc::clone(ctx.status.stuck()),
        ctx.root_path().to_path_buf(),
        mnt_ns,
        shutdown.clone(),
    ));
    let feed = tokio::spawn(ebpf_events::run(
        events,
        Some(execs),
        own,
        ebpf_events::Sinks {
            stats: Arc::clone(&stats),
            timelines: Arc::clone(ctx.status.timelines()),
            checks,
            counters: Arc::clone(&counters),
        },
        shutdown,
    ));
    ctx.status.set_metrics_source(ebpf_metrics(
        Arc::clone(&stats),
        Arc::clone(&tracer),
        Arc::clone(ctx.status.stuck()),
    ));
    let walks = Arc::clone(&tracer);
    ctx.status.set_walk_source(Arc::new(move || walks.walks()));
    ctx.status
        .set_stats_source(ebpf_stats(stats, tracer, counters, check_counters));
    Ok(ActiveTracer {
        name: "ebpf",
        reason: format!(
            "{reason_prefix}eBPF program attached to the mount syscalls of every process (checks for mount namespace {mnt_ns})"
        ),
        tasks: vec![check_task, feed, stuck_task],
    })
}

/// The eBPF tracer's Prometheus text: the latency histograms of the events
/// read, and the in-kernel ones (exact even if events were lost).
fn ebpf_metrics(
    stats: Arc<Mutex<SyscallStats>>,
    tracer: Arc<EbpfTracer>,
    stuck: Arc<stuck::StuckView>,
) -> MetricsSource {
    Arc::new(move || {
        let mut text = stats.locked().prometheus_text(tracer.events_lost());
        text.push_str(&ebpf::kernel_prometheus_text(&tracer.kernel_histograms()));
        text.push_str(&stuck.prometheus_text());
        text.push_str(&lost_text(
            tracer.tool_runs_lost(),
            tracer.slot_collisions(),
        ));
        text
    })
}

/// `volmgr_trace_tool_runs_lost_total`: file system tool runs (`mkfs`,
/// `fsck`, ...) the kernel had no ring-buffer room for;
/// `volmgr_trace_slot_collisions_total`: calls not traced because their
/// in-flight slot was held by another thread's call.
fn lost_text(tool_runs_lost: u64, slot_collisions: u64) -> String {
    use crate::util::prometheus::{Exposition, MetricType};
    let mut w = Exposition::new();
    for (name, help, value) in [
        (
            "volmgr_trace_tool_runs_lost_total",
            "File system tool runs (mkfs, fsck, resize2fs, ...) the kernel had no ring-buffer room for.",
            tool_runs_lost,
        ),
        (
            "volmgr_trace_slot_collisions_total",
            "Mount-family calls not traced: their in-flight slot (thread id modulo 16384) was held by another thread's call.",
            slot_collisions,
        ),
    ] {
        w.family(name, help, MetricType::Counter);
        w.sample(name, &[], value);
    }
    w.finish()
}

/// The eBPF tracer's status: its counters and a latency row per syscall,
/// file system type and result.
fn ebpf_stats(
    stats: Arc<Mutex<SyscallStats>>,
    tracer: Arc<EbpfTracer>,
    counters: Arc<TracerCounters>,
    check_counters: Arc<CheckCounters>,
) -> StatsSource {
    Arc::new(move || {
        let rows = stats
            .locked()
            .summary()
            .into_iter()
            .map(|r| {
                let s = |ns: u64| ns as f64 / 1e9;
                SyscallLatency {
                    syscall: r.syscall,
                    fstype: r.fstype,
                    result: r.result,
                    count: r.count,
                    p50_seconds: s(r.p50_ns),
                    p90_seconds: s(r.p90_ns),
                    p99_seconds: s(r.p99_ns),
                    p999_seconds: s(r.p999_ns),
                    max_seconds: s(r.max_ns),
                }
            })
            .collect();
        (
            stats_of(&counters, &check_counters, tracer.events_lost()),
            rows,
        )
    })
}

fn stats_of(t: &TracerCounters, c: &CheckCounters, events_lost: u64) -> TracerStats {
    TracerStats {
        events: t.events.load(Ordering::Relaxed),
        out_of_band_events: t.out_of_band_events.load(Ordering::Relaxed),
        checks: c.checks.load(Ordering::Relaxed),
        events_lost,
    }
}
