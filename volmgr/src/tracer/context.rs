//! What a tracer is given ([`TracerContext`]) and what it reports
//! ([`TracerStatus`]). The context holds only what an observer needs: the
//! shared state it records findings in, a reader of the mount table, and a
//! read-only view of the operations in flight. Nothing in it can mount,
//! unmount or start an operation.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cache::operations::OperationsView;
use crate::cache::out_of_band::OutOfBandLog;
use crate::cache::world::World;
use crate::plugins::VolumePluginMgr;
use crate::status::{SyscallLatency, TracerStats};
use crate::sys::root_dir::RootDir;
use crate::sys::MountTableReader;
use crate::util::sync::MutexExt;

use super::stuck::StuckView;
use super::timeline::TimelineStore;

/// What the active tracer adds to status: its counters and syscall latencies.
pub type StatsSource = Arc<dyn Fn() -> (TracerStats, Vec<SyscallLatency>) + Send + Sync>;

/// A producer of Prometheus text (the eBPF tracer's latency histograms).
pub type MetricsSource = Arc<dyn Fn() -> String + Send + Sync>;

/// A reader of the eBPF tracer's ownership walk counters
/// ([`crate::ebpf::EbpfTracer::walks`]).
pub type WalkSource = Arc<dyn Fn() -> Vec<(bool, crate::ebpf::Walk)> + Send + Sync>;

/// Everything a tracer works with (built by the volume manager).
#[derive(Clone)]
pub struct TracerContext {
    /// The shared state: findings are recorded in its actual state, and the
    /// volumes concerned marked dirty for the reconciler.
    pub world: Arc<World>,
    /// The manager's root directory: only volumes below it are managed.
    pub root: Arc<RootDir>,
    /// The plugins, which tell whether a volume is still in place.
    pub plugins: Arc<VolumePluginMgr>,
    /// Reads the mount table (the source of truth of a check).
    pub mount_table: Arc<dyn MountTableReader>,
    /// The record of out-of-band changes.
    pub out_of_band: Arc<OutOfBandLog>,
    /// The operations on volumes, read-only: a volume with one in flight is
    /// not judged.
    pub operations: Arc<dyn OperationsView>,
    /// The resync's period (what finds changes when no tracer runs).
    pub resync_period: Duration,
    /// Where the tracer reports itself for status and metrics.
    pub status: Arc<TracerStatus>,
}

impl TracerContext {
    /// The root directory's path.
    pub fn root_path(&self) -> &Path {
        self.root.path()
    }
}

struct StatusInner {
    name: String,
    reason: String,
    stats: Option<StatsSource>,
    metrics: Option<MetricsSource>,
    walks: Option<WalkSource>,
}

/// Which tracer is active and why, and what it adds to status and metrics.
/// The volume manager owns one and reads it when it builds status.
pub struct TracerStatus {
    inner: Mutex<StatusInner>,
    /// Observe mode: the tracer watches the kubelet's mounts, none of them
    /// managed (see [`Self::set_observing`]).
    observing: std::sync::atomic::AtomicBool,
    timelines: Arc<TimelineStore>,
    stuck: Arc<StuckView>,
}

impl Default for TracerStatus {
    fn default() -> Self {
        Self {
            inner: Mutex::new(StatusInner {
                name: "off".into(),
                reason: "no tracer configured".into(),
                stats: None,
                metrics: None,
                walks: None,
            }),
            observing: std::sync::atomic::AtomicBool::new(false),
            timelines: Arc::new(TimelineStore::default()),
            stuck: Arc::new(StuckView::default()),
        }
    }
}

impl TracerStatus {
    /// The per-volume timelines (filled by the eBPF tracer).
    pub fn timelines(&self) -> &Arc<TimelineStore> {
        &self.timelines
    }

    /// The calls stuck now (kept by the eBPF tracer); set its threshold
    /// (`--stuck-syscall-after`) before the tracer starts.
    pub fn stuck(&self) -> &Arc<StuckView> {
        &self.stuck
    }

    /// Observe mode (before the tracer starts): the mounts under ROOT are
    /// the kubelet's, none managed: none counts as an out-of-band change,
    /// none calls for a check.
    pub fn set_observing(&self) {
        self.observing
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether [`Self::set_observing`] was called.
    pub fn observing(&self) -> bool {
        self.observing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records which tracer is active and why.
    pub fn set(&self, name: &str, reason: &str) {
        let mut inner = self.inner.locked();
        inner.name = name.into();
        inner.reason = reason.into();
    }

    /// The active tracer's name and why it was chosen.
    pub fn name_and_reason(&self) -> (String, String) {
        let inner = self.inner.locked();
        (inner.name.clone(), inner.reason.clone())
    }

    /// Sets what the active tracer adds to status.
    pub fn set_stats_source(&self, f: StatsSource) {
        self.inner.locked().stats = Some(f);
    }

    /// The active tracer's counters and syscall latencies (empty without a
    /// source).
    pub fn stats(&self) -> (TracerStats, Vec<SyscallLatency>) {
        // Not called under the lock: the source takes locks of its own.
        let source = self.inner.locked().stats.clone();
        source.map(|f| f()).unwrap_or_default()
    }

    /// Sets what the active tracer adds to the Prometheus metrics.
    pub fn set_metrics_source(&self, f: MetricsSource) {
        self.inner.locked().metrics = Some(f);
    }

    /// Sets the reader of the ownership walk counters (the eBPF tracer).
    pub fn set_walk_source(&self, f: WalkSource) {
        self.inner.locked().walks = Some(f);
    }

    /// The ownership walks counted now (`true`: a caller with uid 0), or
    /// `None` without the eBPF tracer.
    pub fn walks(&self) -> Option<Vec<(bool, crate::ebpf::Walk)>> {
        let source = self.inner.locked().walks.clone();
        source.map(|f| f())
    }

    /// The active tracer's Prometheus text (empty without a source).
    pub fn prometheus_text(&self) -> String {
        let source = self.inner.locked().metrics.clone();
        source.map(|f| f()).unwrap_or_default()
    }
}
