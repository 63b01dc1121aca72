//! The kubelet's `OperationExecutor` and `NestedPendingOperations`: operations
//! run concurrently on the tokio runtime, never two at once on the same volume
//! and pod (an operation without a pod, like unmounting a device, excludes
//! every other operation on its volume), and a failed operation is retried only
//! after an exponential backoff. As in the kubelet, every failure is retried:
//! no error is final. Attempts and the last error are kept for status.

pub mod generator;
pub mod unstack;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cache::operations::{OperationStamp, OperationsView};
use crate::cache::pod_map::PodMap;
use crate::cache::world::World;
use crate::metrics::{Metrics, OperationLabels, PluginLabel};
use crate::plugins::VolumeError;
use crate::util::fast_map::FastMap;
use crate::util::sync::MutexExt;
use crate::volume::{PodUid, UniqueVolumeName};

/// The operations' backoff policy (the kubelet's `exponentialbackoff`
/// defaults: [`Backoff::default`]).
pub use crate::util::backoff::Backoff;

/// The kind of an operation; the name is the kubelet's `operation_name` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationKind {
    /// Set a volume up for a pod.
    MountVolume,
    /// Tear a pod's volume down.
    UnmountVolume,
    /// Remove an orphaned pod's directory.
    CleanupPodDir,
    /// Mount a volume's device at its global path (CSI: NodeStageVolume),
    /// once per volume, before any pod's set-up.
    MountDevice,
    /// Unmount a volume's device (CSI: NodeUnstageVolume), after the last
    /// pod's tear-down.
    UnmountDevice,
    /// Grow a mounted volume's file system on the node (CSI: NodeExpandVolume).
    ExpandVolume,
    /// Unmount what someone else mounted on a volume's path (found by the
    /// tracer, started by the reconciler).
    RemoveForeignMounts,
    /// Bind-mount the subPaths of containers that may start now, on a
    /// volume already set up (the kubelet's `makeMounts` at container
    /// start).
    PrepareSubPaths,
}

impl OperationKind {
    /// The kubelet's metric name.
    pub fn metric_name(self) -> &'static str {
        match self {
            Self::MountVolume => "volume_mount",
            Self::UnmountVolume => "volume_unmount",
            Self::CleanupPodDir => "cleanup_pod_dir",
            Self::MountDevice => "mount_device",
            Self::UnmountDevice => "unmount_device",
            Self::ExpandVolume => "volume_fs_resize",
            Self::RemoveForeignMounts => "remove_foreign_mounts",
            Self::PrepareSubPaths => "prepare_sub_paths",
        }
    }
}

/// What status shows of the last operation on a (volume, pod).
#[derive(Debug, Clone)]
pub struct OperationRecord {
    /// Which operation.
    pub kind: OperationKind,
    /// Attempts of this operation so far (reset when another kind starts).
    pub attempts: u32,
    /// Consecutive failures (reset on success).
    pub failures: u32,
    /// The last error, cleared on success.
    pub last_error: Option<String>,
    /// Whether the last error left the outcome uncertain.
    pub uncertain: bool,
    /// Whether the last error waits for something to appear (a CSI driver).
    pub waiting: bool,
    /// Whether the last error was the node's volume limit of the volume's
    /// CSI driver (`VolumeError::VolumeLimit`): the kubelet's
    /// `VolumeAttachLimitExceededError` when a wait for the pod ends.
    pub limit_exceeded: bool,
    /// When the first attempt of this operation started, until its first
    /// success (`overall_volume_mount` of `volume_operation_total_seconds`).
    pub first_attempt: Option<Instant>,
    /// Running now.
    pub running: bool,
    /// Not to be retried before this.
    pub retry_at: Option<Instant>,
}

/// Why an operation was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStarted {
    /// Another operation on the same volume (and pod) is running.
    AlreadyRunning,
    /// Backing off after a failure until then.
    BackingOff(Instant),
}

#[derive(Default)]
struct VolumeOps {
    device: Option<OperationRecord>,
    pods: PodMap<OperationRecord>,
}

impl VolumeOps {
    fn any_running(&self) -> bool {
        self.device.as_ref().is_some_and(|r| r.running) || self.pods.values().any(|r| r.running)
    }
}

/// A prepared operation's claim on its record: released by `finish` when it
/// completes, or by [`OperationExecutor::abandon`] when it is dropped first.
struct Pending {
    executor: Arc<OperationExecutor>,
    volume: UniqueVolumeName,
    pod: Option<PodUid>,
    done: bool,
}

impl Pending {
    fn finish(
        mut self,
        kind: OperationKind,
        plugin: PluginLabel,
        started: Instant,
        result: Result<(), VolumeError>,
    ) {
        self.executor.finish(
            &self.volume,
            self.pod.as_ref(),
            kind,
            plugin,
            started,
            result,
        );
        self.done = true;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            self.executor.abandon(&self.volume, self.pod.as_ref());
        }
    }
}

/// Runs and tracks operations.
pub struct OperationExecutor {
    ops: Mutex<FastMap<UniqueVolumeName, VolumeOps>>,
    backoff: Backoff,
    metrics: Arc<Metrics>,
    world: Arc<World>,
}

impl OperationExecutor {
    /// A new executor reporting completions to `world`.
    pub fn new(backoff: Backoff, metrics: Arc<Metrics>, world: Arc<World>) -> Arc<Self> {
        Arc::new(Self {
            ops: Mutex::default(),
            backoff,
            metrics,
            world,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FastMap<UniqueVolumeName, VolumeOps>> {
        self.ops.locked()
    }

    /// Starts `op` for `(volume, pod)` unless it conflicts or backs off.
    /// `op` returns the path or nothing; its outcome updates the record, the
    /// metrics, and wakes the reconciler for `volume`.
    pub fn start<F>(
        self: &Arc<Self>,
        volume: &UniqueVolumeName,
        pod: Option<&PodUid>,
        kind: OperationKind,
        plugin: PluginLabel,
        op: F,
    ) -> Result<(), NotStarted>
    where
        F: Future<Output = Result<(), VolumeError>> + Send + 'static,
    {
        let run = self.prepare(volume, pod, kind, plugin, op)?;
        tokio::spawn(run);
        Ok(())
    }

    /// Like [`start`](Self::start), but returns the operation instead of
    /// spawning it: it is recorded as running now, and the caller runs the
    /// returned future (the reconciler runs batches of cheap operations back
    /// to back in one task). Dropped before it completes, it is recorded as
    /// not running any more and its volume is looked at again.
    pub fn prepare<F>(
        self: &Arc<Self>,
        volume: &UniqueVolumeName,
        pod: Option<&PodUid>,
        kind: OperationKind,
        plugin: PluginLabel,
        op: F,
    ) -> Result<impl Future<Output = ()> + Send + 'static, NotStarted>
    where
        F: Future<Output = Result<(), VolumeError>> + Send + 'static,
    {
        let now = Instant::now();
        {
            let mut ops = self.lock();
            let vol = ops.entry(volume.clone()).or_default();
            let conflict = match pod {
                Some(p) => {
                    vol.device.as_ref().is_some_and(|r| r.running)
                        || vol.pods.get(p).is_some_and(|r| r.running)
                }
                None => vol.any_running(),
            };
            if conflict {
                return Err(NotStarted::AlreadyRunning);
            }
            let rec = match pod {
                Some(p) => vol.pods.get_or_insert_with(p, || new_record(kind)),
                None => vol.device.get_or_insert_with(|| new_record(kind)),
            };
            if rec.kind == kind {
                if let Some(at) = rec.retry_at.filter(|at| *at > now) {
                    return Err(NotStarted::BackingOff(at));
                }
            } else {
                *rec = new_record(kind);
            }
            rec.running = true;
            rec.attempts = rec.attempts.saturating_add(1);
        }
        let pending = Pending {
            executor: Arc::clone(self),
            volume: volume.clone(),
            pod: pod.cloned(),
            done: false,
        };
        Ok(async move {
            let started = Instant::now();
            let result = op.await;
            pending.finish(kind, plugin, started, result);
        })
    }

    /// An operation that will not run after all: no longer running, and its
    /// volume is looked at again.
    fn abandon(&self, volume: &UniqueVolumeName, pod: Option<&PodUid>) {
        {
            let mut ops = self.lock();
            if let Some(vol) = ops.get_mut(volume) {
                let rec = match pod {
                    Some(p) => vol.pods.get_mut(p),
                    None => vol.device.as_mut(),
                };
                if let Some(rec) = rec {
                    rec.running = false;
                }
            }
        }
        self.world.mark_dirty([volume.clone()]);
    }

    /// The kubelet's `volume_operation_total_seconds` of a pod's volume
    /// set up for the first time (`overall_volume_mount`).
    fn record_overall(&self, kind: OperationKind, plugin: &PluginLabel, overall: Option<Duration>) {
        if let Some(d) = overall.filter(|_| kind == OperationKind::MountVolume) {
            let name = "overall_volume_mount";
            self.metrics
                .kubelet
                .record_total(Arc::clone(&plugin.name), name, d);
        }
    }

    fn finish(
        self: &Arc<Self>,
        volume: &UniqueVolumeName,
        pod: Option<&PodUid>,
        kind: OperationKind,
        plugin: PluginLabel,
        started: Instant,
        result: Result<(), VolumeError>,
    ) {
        let elapsed = started.elapsed();
        let mut retry = None;
        let mut overall = None;
        {
            let mut ops = self.lock();
            let vol = ops.entry(volume.clone()).or_default();
            let rec = match pod {
                Some(p) => vol.pods.get_or_insert_with(p, || new_record(kind)),
                None => vol.device.get_or_insert_with(|| new_record(kind)),
            };
            rec.running = false;
            match &result {
                Ok(()) => {
                    overall = rec.first_attempt.take().map(|t| t.elapsed());
                    rec.failures = 0;
                    rec.last_error = None;
                    rec.uncertain = false;
                    rec.waiting = false;
                    rec.limit_exceeded = false;
                    rec.retry_at = None;
                }
                Err(e) => {
                    rec.failures = rec.failures.saturating_add(1);
                    rec.last_error = Some(e.to_string());
                    rec.uncertain = e.is_uncertain();
                    rec.waiting = e.is_waiting();
                    rec.limit_exceeded = matches!(e, VolumeError::VolumeLimit(_));
                    let delay = self.backoff.delay(rec.failures);
                    rec.retry_at = Some(Instant::now() + delay);
                    retry = Some(delay);
                }
            }
        }
        if result.is_ok() && kind == OperationKind::CleanupPodDir {
            // Nothing left to report about a removed directory.
            self.forget_volume(volume);
        }
        self.record_overall(kind, &plugin, overall);
        self.metrics.record_operation(
            OperationLabels {
                operation_name: kind.metric_name(),
                volume_plugin: plugin,
                status: if result.is_ok() {
                    "success"
                } else {
                    "fail-unknown"
                },
            },
            elapsed,
        );
        // Any operation may leave its volume needing more (the pod may have
        // gone while it mounted, another operation may have been refused
        // meanwhile): look at the volume again. A clean-up has nothing more
        // to reconcile (a failed one is retried when its backoff expires).
        if kind == OperationKind::CleanupPodDir {
            self.world.bump();
        } else {
            self.world.mark_dirty([volume.clone()]);
        }
        if let Some(delay) = retry {
            let world = Arc::clone(&self.world);
            let volume = volume.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                world.mark_dirty([volume]);
            });
        }
    }

    /// The record of `(volume, pod)`, if any.
    pub fn record(
        &self,
        volume: &UniqueVolumeName,
        pod: Option<&PodUid>,
    ) -> Option<OperationRecord> {
        let ops = self.lock();
        let vol = ops.get(volume)?;
        match pod {
            Some(p) => vol.pods.get(p).cloned(),
            None => vol.device.clone(),
        }
    }

    /// Whether any operation on `volume` is running.
    pub fn is_running(&self, volume: &UniqueVolumeName) -> bool {
        self.lock().get(volume).is_some_and(VolumeOps::any_running)
    }

    /// Ends the backoff of every operation that waits for something to
    /// appear (a CSI driver registered) and returns their volumes, to be
    /// looked at again.
    pub fn retry_waiting(&self) -> Vec<UniqueVolumeName> {
        let mut ops = self.lock();
        let mut out = Vec::new();
        for (v, vol) in ops.iter_mut() {
            let mut any = false;
            for rec in vol.device.iter_mut().chain(vol.pods.values_mut()) {
                if rec.waiting && !rec.running {
                    rec.retry_at = None;
                    any = true;
                }
            }
            if any {
                out.push(v.clone());
            }
        }
        out
    }

    /// Drops the records of a volume neither world has any more; records of
    /// running operations stay.
    pub fn forget_volume(&self, volume: &UniqueVolumeName) {
        let mut ops = self.lock();
        let Some(vol) = ops.get_mut(volume) else {
            return;
        };
        vol.pods.retain(|_, r| r.running);
        if vol.device.as_ref().is_some_and(|r| !r.running) {
            vol.device = None;
        }
        if vol.device.is_none() && vol.pods.is_empty() {
            ops.remove(volume);
        }
    }
}

impl OperationsView for OperationExecutor {
    fn stamp(&self, volume: &UniqueVolumeName, pod: Option<&PodUid>) -> Option<OperationStamp> {
        self.record(volume, pod).map(|r| OperationStamp {
            kind: r.kind.metric_name(),
            attempts: r.attempts,
            failures: r.failures,
            running: r.running,
        })
    }
}

fn new_record(kind: OperationKind) -> OperationRecord {
    OperationRecord {
        kind,
        attempts: 0,
        failures: 0,
        last_error: None,
        uncertain: false,
        waiting: false,
        limit_exceeded: false,
        first_attempt: Some(Instant::now()),
        running: false,
        retry_at: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_prepared_operation_runs_once_and_one_dropped_unrun_frees_its_record() {
        let world = Arc::new(World::default());
        let ex = OperationExecutor::new(Backoff::default(), Arc::default(), world.clone());
        let v = UniqueVolumeName::new("v");
        let pod = PodUid::new("p").unwrap();
        let kind = OperationKind::UnmountVolume;
        let op = ex
            .prepare(&v, Some(&pod), kind, "test".into(), async { Ok(()) })
            .unwrap();
        // Running from the moment it is prepared.
        assert!(ex.is_running(&v));
        assert_eq!(
            ex.prepare(&v, Some(&pod), kind, "test".into(), async { Ok(()) })
                .err(),
            Some(NotStarted::AlreadyRunning)
        );
        op.await;
        assert!(!ex.is_running(&v));
        assert_eq!(ex.record(&v, Some(&pod)).unwrap().attempts, 1);
        // Dropped before it ran: not running, and the volume is dirty again.
        world.take_dirty().await;
        let op = ex
            .prepare(&v, Some(&pod), kind, "test".into(), async { Ok(()) })
            .unwrap();
        drop(op);
        assert!(!ex.is_running(&v));
        assert!(world.take_dirty().await.volumes.contains(&v));
        ex.start(&v, Some(&pod), kind, "test".into(), async { Ok(()) })
            .unwrap();
    }

    #[tokio::test]
    async fn no_two_operations_on_one_volume_and_backoff_after_failure() {
        let world = Arc::new(World::default());
        let ex = OperationExecutor::new(
            Backoff {
                initial: Duration::from_secs(60),
                ..Backoff::default()
            },
            Arc::default(),
            world.clone(),
        );
        let v = UniqueVolumeName::new("v");
        let pod = PodUid::new("p").unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        ex.start(
            &v,
            Some(&pod),
            OperationKind::MountVolume,
            "x".into(),
            async move {
                let _ = rx.await;
                Err(VolumeError::InvalidSpec("boom".into()))
            },
        )
        .unwrap();
        // Same pod, and a device operation: both conflict.
        assert_eq!(
            ex.start(
                &v,
                Some(&pod),
                OperationKind::MountVolume,
                "x".into(),
                async { Ok(()) }
            ),
            Err(NotStarted::AlreadyRunning)
        );
        assert_eq!(
            ex.start(&v, None, OperationKind::MountVolume, "x".into(), async {
                Ok(())
            }),
            Err(NotStarted::AlreadyRunning)
        );
        // Another pod on the same volume does not.
        let other = PodUid::new("q").unwrap();
        ex.start(
            &v,
            Some(&other),
            OperationKind::MountVolume,
            "x".into(),
            async { Ok(()) },
        )
        .unwrap();
        tx.send(()).unwrap();
        let mut rx = world.subscribe();
        while ex.record(&v, Some(&pod)).unwrap().running {
            rx.changed().await.unwrap();
        }
        let rec = ex.record(&v, Some(&pod)).unwrap();
        assert_eq!(rec.attempts, 1);
        assert_eq!(rec.last_error.as_deref(), Some("boom"));
        assert!(matches!(
            ex.start(
                &v,
                Some(&pod),
                OperationKind::MountVolume,
                "x".into(),
                async { Ok(()) }
            ),
            Err(NotStarted::BackingOff(_))
        ));
        // A different operation is not held back by the mount's backoff.
        ex.start(
            &v,
            Some(&pod),
            OperationKind::UnmountVolume,
            "x".into(),
            async { Ok(()) },
        )
        .unwrap();
    }

    /// No error stops the retries (the kubelet's `isFinalError` only
    /// decides uncertain or not): each operation runs again once its backoff
    /// expires, a waiting one also at once when what it waits for appears.
    #[tokio::test]
    async fn every_error_is_retried_after_its_backoff_waiting_ones_also_on_a_wake_up() {
        let world = Arc::new(World::default());
        let ex = OperationExecutor::new(
            Backoff {
                initial: Duration::from_millis(50),
                ..Backoff::default()
            },
            Arc::default(),
            world.clone(),
        );
        let (v, w) = (UniqueVolumeName::new("v"), UniqueVolumeName::new("w"));
        let mut rx = world.subscribe();
        let run = |vol: &UniqueVolumeName, e: VolumeError| {
            ex.start(
                vol,
                None,
                OperationKind::MountDevice,
                "x".into(),
                async move { Err(e) },
            )
        };
        let certain = || VolumeError::Plugin {
            plugin: "kubernetes.io/csi".into(),
            message: "rpc error: code = InvalidArgument".into(),
        };
        run(&v, certain()).unwrap();
        run(&w, VolumeError::Waiting("waiting for CSI driver d".into())).unwrap();
        while ex.is_running(&v) || ex.is_running(&w) {
            rx.changed().await.unwrap();
        }
        assert!(matches!(run(&v, certain()), Err(NotStarted::BackingOff(_))));
        // The driver registers: the waiting operation may run at once.
        assert_eq!(ex.retry_waiting(), vec![w.clone()]);
        run(&w, VolumeError::Waiting("again".into())).unwrap();
        // The backoff expires: the volume is marked dirty again (the
        // reconciler's cue) and the failed operation runs again.
        loop {
            if world.take_dirty().await.volumes.contains(&v) && run(&v, certain()).is_ok() {
                break;
            }
        }
        while ex.is_running(&v) {
            rx.changed().await.unwrap();
        }
        let rec = ex.record(&v, None).unwrap();
        assert_eq!((rec.attempts, rec.failures), (2, 2));
        assert!(rec.last_error.unwrap().contains("InvalidArgument"));
    }
}
