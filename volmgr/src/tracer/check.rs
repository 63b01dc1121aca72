//! Targeted checks of the kernel's mount table. A tracer never changes the
//! actual state from what it was told: it asks for a check of the paths a
//! change may have touched, and this module compares the actual state with
//! `/proc/self/mountinfo` (the source of truth) for the managed volumes under
//! those paths only. A check only observes: it records its findings in the
//! actual state and the out-of-band log, and marks the volumes dirty, which
//! wakes the reconciler at once. It never mounts, unmounts or starts an
//! operation.
//!
//! Two findings are recorded:
//!
//! - **Lost**: a volume recorded as mounted that the mount table no longer
//!   shows (someone ran `umount` on it). It is marked *uncertain* — as the
//!   resync marks what it finds lost — so the reconciler sets it up again if
//!   still desired, and tears it down (idempotently) if not. A watched
//!   device mount (a CSI `globalmount` the driver mounted) that is gone is
//!   lost too: the device becomes uncertain, and the pods' mounts made from
//!   it with it, so the reconciler stages it again, then publishes again.
//! - **Foreign mount**: more mounts on a volume's path than its plugin puts
//!   there (something mounted over a tmpfs emptyDir, or on a disk emptyDir's
//!   directory), or as many but not the volume (its tmpfs unmounted and
//!   something else mounted in its place). The pod's containers would see
//!   that file system instead of their volume, and a tear-down would have to
//!   cross it. The kubelet never looks. The check logs the finding and marks
//!   the pod's mount in the actual state ([`ForeignMounts`], holding the log
//!   entry's number); the reconciler then starts the `RemoveForeignMounts`
//!   operation, which unmounts the extra mounts from the top down to what the
//!   plugin set up (the same unstacking start-up reconstruction does),
//!   reports the outcome to the log, and marks the volume uncertain if what
//!   is left is not the volume. Mounts *below* a volume's path (inside the
//!   volume) are the pod's business and are left alone.
//!
//! Races with the manager's own operations: a volume with an operation in
//! flight is not judged (its own mounts and unmounts are in progress); it is
//! checked again shortly after. A finding is recorded only if, under the
//! actual state's write lock, the volume is still mounted at the same path
//! and no operation on it started or finished since the snapshot taken
//! before the mount table was read (its [`OperationStamp`] is unchanged) —
//! so the table read is newer than anything the manager itself did to that
//! volume.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::TracerContext;
use crate::cache::actual_state_of_world::{
    DeviceMountState, ForeignMounts, MountedPod, VolumeMountState,
};
use crate::cache::operations::{OperationStamp, OperationsView};
use crate::cache::out_of_band::{DetectedBy, Detection, OutOfBandLog};
use crate::cache::world::{VolumeEvent, World};
use crate::plugins::foreign::is_foreign;
use crate::plugins::{VolumeError, VolumePluginMgr};
use crate::sys::mount_table::{MountTable, MountTableView};
use crate::sys::MountTableReader;
use crate::volume::{PodUid, UniqueVolumeName};

pub use crate::plugins::foreign::expected_mounts;

/// Which managed paths a change may have touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Unknown (a relative or unresolvable path): check every managed volume.
    All,
    /// Volumes at or below this absolute path.
    Below(PathBuf),
}

/// Where a check request came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The tracer.
    pub by: DetectedBy,
    /// The syscall and process behind it, when known.
    pub cause: Option<String>,
    /// `CLOCK_MONOTONIC` time of the syscall's return, when known.
    pub boot_ns: Option<u64>,
}

/// One request for a check.
#[derive(Debug, Clone)]
pub struct CheckRequest {
    /// The paths.
    pub scope: Scope,
    /// Why.
    pub origin: Origin,
    /// How often it was put off because the manager was busy with the volume.
    pub deferrals: u32,
}

/// Sends check requests to the checker task.
#[derive(Debug, Clone)]
pub struct CheckSender(mpsc::UnboundedSender<CheckRequest>);

impl CheckSender {
    /// Asks for a check (coalesced with others waiting).
    pub fn check(&self, scope: Scope, origin: Origin) {
        let _ = self.0.send(CheckRequest {
            scope,
            origin,
            deferrals: 0,
        });
    }

    /// Asks for one check of everything when tracer `by` starts watching:
    /// what changed before it did is found so; `cause` says when it was.
    pub fn check_everything_at_start(&self, by: DetectedBy, cause: &str) {
        let origin = Origin {
            by,
            cause: Some(cause.to_string()),
            boot_ns: None,
        };
        self.check(Scope::All, origin);
    }
}

/// Counts checks (for status).
#[derive(Debug, Default)]
pub struct CheckCounters {
    /// Mount-table reads made for checks.
    pub checks: AtomicU64,
}

/// What a check decided.
#[derive(Debug, Default)]
pub struct CheckOutcome {
    /// Volumes marked lost.
    pub lost: usize,
    /// Volumes marked for the removal of foreign mounts.
    pub foreign: usize,
    /// Requests put off because an operation on the volume is in flight.
    pub deferred: Vec<CheckRequest>,
    /// How long the check took.
    pub took: Duration,
}

/// The checker: holds what a check reads and where it records findings.
pub struct Checker {
    world: Arc<World>,
    operations: Arc<dyn OperationsView>,
    plugins: Arc<VolumePluginMgr>,
    root: PathBuf,
    mount_table: Arc<dyn MountTableReader>,
    log: Arc<OutOfBandLog>,
    counters: Arc<CheckCounters>,
}

/// A managed volume under a requested path, as the actual state had it.
struct Candidate {
    volume: UniqueVolumeName,
    pod: PodUid,
    plugin_name: Arc<str>,
    mounted: MountedPod,
    origin: Origin,
    stamp: Option<OperationStamp>,
}

/// A watched device mount (CSI staging) under a requested path, as the
/// actual state had it.
struct DeviceCandidate {
    volume: UniqueVolumeName,
    path: PathBuf,
    origin: Origin,
    stamp: Option<OperationStamp>,
}

/// What a check found about a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finding {
    /// No longer mounted.
    Lost,
    /// Something else mounted on its path.
    Foreign,
}

/// A batch of requests by path: which request covers a managed path.
struct Coverage<'a> {
    all: Option<&'a CheckRequest>,
    below: HashMap<&'a Path, &'a CheckRequest>,
}

impl<'a> Coverage<'a> {
    fn new(batch: &'a [CheckRequest]) -> Self {
        Self {
            all: batch.iter().find(|r| r.scope == Scope::All),
            below: batch
                .iter()
                .filter_map(|r| match &r.scope {
                    Scope::Below(p) => Some((p.as_path(), r)),
                    Scope::All => None,
                })
                .collect(),
        }
    }

    /// The request covering `path`: one for everything, or the nearest
    /// requested ancestor (a lookup per path component, not per request: a
    /// burst brings thousands).
    fn covering(&self, path: &Path) -> Option<&'a CheckRequest> {
        self.all
            .or_else(|| path.ancestors().find_map(|a| self.below.get(a).copied()))
    }
}

/// A batch of requests for the check thread, and where its answer goes.
type Job = (
    Vec<CheckRequest>,
    oneshot::Sender<Result<CheckOutcome, VolumeError>>,
);

impl Checker {
    /// A checker working with `ctx`.
    pub fn new(ctx: &TracerContext, counters: Arc<CheckCounters>) -> Arc<Self> {
        Arc::new(Self {
            world: Arc::clone(&ctx.world),
            operations: Arc::clone(&ctx.operations),
            plugins: Arc::clone(&ctx.plugins),
            root: ctx.root_path().to_path_buf(),
            mount_table: Arc::clone(&ctx.mount_table),
            log: Arc::clone(&ctx.out_of_band),
            counters,
        })
    }

    /// Starts the task that serves check requests until `shutdown`.
    pub fn spawn(
        self: &Arc<Self>,
        shutdown: watch::Receiver<bool>,
    ) -> (CheckSender, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(Arc::clone(self).serve(rx, tx.clone(), shutdown));
        (CheckSender(tx), task)
    }

    async fn serve(
        self: Arc<Self>,
        mut rx: mpsc::UnboundedReceiver<CheckRequest>,
        tx: mpsc::UnboundedSender<CheckRequest>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let jobs = self.start_thread();
        loop {
            let first = tokio::select! {
                biased;
                () = crate::util::shutdown::requested(&mut shutdown) => return,
                r = rx.recv() => match r { Some(r) => r, None => return },
            };
            // Everything queued meanwhile is answered by the same table read.
            let mut batch = vec![first];
            while let Ok(r) = rx.try_recv() {
                batch.push(r);
            }
            let Some(outcome) = self.run_check(jobs.as_ref(), batch).await else {
                continue;
            };
            if !outcome.deferred.is_empty() {
                check_again_soon(&tx, outcome.deferred);
            }
            // A check reads the whole mount table: with tens of thousands of
            // mounts and a burst of changes (the manager's own mount storm
            // seen by the mountinfo poller) back-to-back checks would take a
            // core. After a check that took over a millisecond, pause four
            // times as long, so checks use at most a fifth of a core;
            // requests meanwhile are answered together by the next one.
            tokio::time::sleep(super::duty_pause(outcome.took)).await;
        }
    }

    /// Checks run on one thread of their own rather than the blocking pool:
    /// each reads and parses the whole mount table, and spread over many
    /// pool threads those allocations can stay in as many malloc arenas; one
    /// thread also keeps checks in order. `None` if the thread cannot start
    /// (the blocking pool is used then).
    fn start_thread(self: &Arc<Self>) -> Option<std::sync::mpsc::Sender<Job>> {
        let (jobs, job_rx) = std::sync::mpsc::channel::<Job>();
        let this = Arc::clone(self);
        let worker = std::thread::Builder::new()
            .name("volmgr-check".into())
            .spawn(move || {
                while let Ok((batch, reply)) = job_rx.recv() {
                    let _ = reply.send(this.check(batch));
                }
            });
        match worker {
            Ok(_) => Some(jobs),
            Err(e) => {
                tracing::warn!(error = %e, "tracer: no check thread; using the blocking pool");
                None
            }
        }
    }

    /// Runs one check of `batch` off the runtime; `None` (logged) if it
    /// failed.
    async fn run_check(
        self: &Arc<Self>,
        jobs: Option<&std::sync::mpsc::Sender<Job>>,
        batch: Vec<CheckRequest>,
    ) -> Option<CheckOutcome> {
        let started = Instant::now();
        let outcome = match jobs {
            Some(jobs) => {
                let (reply, answer) = oneshot::channel();
                let _ = jobs.send((batch, reply));
                answer.await.map_err(|e| e.to_string())
            }
            None => {
                let this = Arc::clone(self);
                tokio::task::spawn_blocking(move || this.check(batch))
                    .await
                    .map_err(|e| e.to_string())
            }
        };
        match outcome {
            Ok(Ok(mut o)) => {
                o.took = started.elapsed();
                Some(o)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "tracer: cannot check the mount table");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "tracer: the check task failed");
                None
            }
        }
    }

    /// One check of the managed volumes the requests cover, against a fresh
    /// read of the mount table. Runs on a blocking thread.
    pub fn check(&self, batch: Vec<CheckRequest>) -> Result<CheckOutcome, VolumeError> {
        // 1. Snapshot of the candidates (actual state, then operations: the
        // executor's lock is never taken under the actual state's here).
        let (candidates, mut deferred) = self.candidates(&batch);
        let devices = self.device_candidates(&batch, &mut deferred);
        let mut out = CheckOutcome {
            deferred,
            ..CheckOutcome::default()
        };
        if candidates.is_empty() && devices.is_empty() {
            return Ok(out);
        }
        // 2. The source of truth, read after the snapshot.
        let table = self.read_table()?;
        // 3. Record what the manager did not cause: lost devices first (their
        // pods' mounts become uncertain with them), then the pods' mounts.
        let lost_devices = self.record_lost_devices(devices, &table);
        let findings = self.judge(candidates, &table);
        let recorded = self.record(findings, &mut out.deferred);
        let lost_pods = recorded.iter().filter(|(_, f)| *f == Finding::Lost).count();
        out.foreign = recorded.len() - lost_pods;
        out.lost = lost_pods + lost_devices;
        self.announce(recorded);
        Ok(out)
    }

    /// The device mounts the actual state watches (those with a known
    /// mount id) under the requested paths; a request for a device with an
    /// operation in flight is put off (into `deferred`).
    fn device_candidates(
        &self,
        batch: &[CheckRequest],
        deferred: &mut Vec<CheckRequest>,
    ) -> Vec<DeviceCandidate> {
        let coverage = Coverage::new(batch);
        let mut out: Vec<DeviceCandidate> = {
            let asw = self.world.asw();
            asw.volumes()
                .filter(|(_, av)| {
                    av.device_mount_state == DeviceMountState::Mounted
                        && av.device_mount_id.is_some()
                })
                .filter_map(|(v, av)| {
                    let path = av.device_mount_path.clone()?;
                    let req = coverage.covering(&path)?;
                    Some(DeviceCandidate {
                        volume: v.clone(),
                        path,
                        origin: req.origin.clone(),
                        stamp: None,
                    })
                })
                .collect()
        };
        out.retain_mut(|c| {
            c.stamp = self.operations.stamp(&c.volume, None);
            if c.stamp.is_some_and(|s| s.running) {
                deferred.push(CheckRequest {
                    scope: Scope::Below(c.path.clone()),
                    origin: c.origin.clone(),
                    deferrals: 0,
                });
                return false;
            }
            true
        });
        out
    }

    /// Marks the candidates whose device mount `table` no longer shows
    /// uncertain, if the actual state still has them mounted and no
    /// operation on them started or finished since the snapshot (the
    /// actual state makes their pods' mounts uncertain too). Returns how
    /// many.
    fn record_lost_devices(&self, devices: Vec<DeviceCandidate>, table: &MountTable) -> usize {
        let lost: Vec<DeviceCandidate> = devices
            .into_iter()
            .filter(|c| !table.is_mount_point(&c.path))
            .collect();
        if lost.is_empty() {
            return 0;
        }
        let mut recorded = Vec::new();
        {
            let mut asw = self.world.asw_mut();
            for c in lost {
                let same = asw.volume(&c.volume).is_some_and(|av| {
                    av.device_mount_state == DeviceMountState::Mounted
                        && av.device_mount_path.as_deref() == Some(c.path.as_path())
                });
                if !same || self.operations.stamp(&c.volume, None) != c.stamp {
                    continue;
                }
                asw.set_device_mount_state(&c.volume, DeviceMountState::Uncertain);
                recorded.push(c);
            }
        }
        let n = recorded.len();
        for c in recorded {
            tracing::warn!(volume = %c.volume, path = %c.path.display(),
                detected_by = c.origin.by.as_str(), cause = c.origin.cause.as_deref().unwrap_or("-"),
                "device mount was unmounted behind the manager's back; mounting it again");
            self.world.mark_dirty([c.volume]);
        }
        n
    }

    /// The volumes recorded as mounted under the requested paths, and the
    /// requests put off for volumes with an operation in flight.
    fn candidates(&self, batch: &[CheckRequest]) -> (Vec<Candidate>, Vec<CheckRequest>) {
        let coverage = Coverage::new(batch);
        let mut candidates: Vec<Candidate> = Vec::new();
        {
            let asw = self.world.asw();
            for (v, av) in asw.volumes() {
                for (pod, m) in &av.pods {
                    if !m.path.starts_with(&self.root) {
                        continue;
                    }
                    let Some(req) = coverage.covering(&m.path) else {
                        continue;
                    };
                    candidates.push(Candidate {
                        volume: v.clone(),
                        pod: pod.clone(),
                        plugin_name: Arc::clone(&av.plugin_name),
                        mounted: m.clone(),
                        origin: req.origin.clone(),
                        stamp: None,
                    });
                }
            }
        }
        let mut deferred: HashMap<PathBuf, CheckRequest> = HashMap::new();
        candidates.retain_mut(|c| {
            c.stamp = self.operations.stamp(&c.volume, Some(&c.pod));
            if c.stamp.is_some_and(|s| s.running) {
                if let Some(mut req) = coverage.covering(&c.mounted.path).cloned() {
                    req.scope = Scope::Below(c.mounted.path.clone());
                    deferred.entry(c.mounted.path.clone()).or_insert(req);
                }
                return false;
            }
            // Uncertain: the reconciler sets it up again anyway.
            c.mounted.state == VolumeMountState::Mounted
        });
        (candidates, deferred.into_values().collect())
    }

    /// The mount table below ROOT (only mounts there can be managed
    /// volumes': the index stays small however many mounts the node has
    /// elsewhere).
    fn read_table(&self) -> Result<MountTable, VolumeError> {
        self.counters.checks.fetch_add(1, Ordering::Relaxed);
        Ok(MountTable::new(
            self.mount_table
                .mount_table()?
                .into_iter()
                .filter(|m| m.mount_point.starts_with(&self.root))
                .collect(),
        ))
    }

    /// What `table` says about each candidate; those in place are dropped.
    fn judge(&self, candidates: Vec<Candidate>, table: &MountTable) -> Vec<(Candidate, Finding)> {
        let mut findings = Vec::new();
        for c in candidates {
            let Some(plugin) = self.plugins.find_by_name(&c.plugin_name) else {
                continue;
            };
            let (spec, path) = (&c.mounted.spec, &c.mounted.path);
            if is_foreign(plugin.as_ref(), spec, path, table) {
                findings.push((c, Finding::Foreign));
            } else if !plugin.verify(spec, path, MountTableView::Read(table)) {
                findings.push((c, Finding::Lost));
            }
        }
        findings
    }

    /// Records the findings the manager did not cause, under the actual
    /// state's write lock: a lost volume becomes uncertain, foreign mounts
    /// are logged and marked for removal. A foreign mount found while an
    /// operation started or finished is checked again (`retry`); a loss then
    /// is the manager's own doing.
    fn record(
        &self,
        findings: Vec<(Candidate, Finding)>,
        retry: &mut Vec<CheckRequest>,
    ) -> Vec<(Candidate, Finding)> {
        let mut recorded = Vec::new();
        let mut asw = self.world.asw_mut();
        for (c, finding) in findings {
            let same = asw
                .pod_mount(&c.volume, &c.pod)
                .is_some_and(|m| m.state == VolumeMountState::Mounted && m.path == c.mounted.path);
            if !same {
                continue;
            }
            if self.operations.stamp(&c.volume, Some(&c.pod)) != c.stamp {
                if finding == Finding::Foreign {
                    retry.push(CheckRequest {
                        scope: Scope::Below(c.mounted.path.clone()),
                        origin: c.origin.clone(),
                        deferrals: 0,
                    });
                }
                continue;
            }
            let how = detection(&c.origin);
            match finding {
                Finding::Lost => {
                    asw.mark_volume_as_mounted(
                        &c.volume,
                        &c.pod,
                        MountedPod {
                            state: VolumeMountState::Uncertain,
                            ..c.mounted.clone()
                        },
                    );
                    self.log.expect_loss(&c.volume, &c.pod, how);
                }
                Finding::Foreign => {
                    let m = &c.mounted;
                    let log_seq = self.log.foreign_mount(
                        &c.volume,
                        &c.pod,
                        m.outer_volume_spec_name(),
                        &m.path,
                        how,
                    );
                    asw.mark_foreign_mounts(&c.volume, &c.pod, ForeignMounts { log_seq });
                }
            }
            recorded.push((c, finding));
        }
        recorded
    }

    /// Logs the recorded findings, tells event listeners of the losses, and
    /// wakes the reconciler for every volume concerned.
    fn announce(&self, recorded: Vec<(Candidate, Finding)>) {
        for (c, finding) in recorded {
            let m = c.mounted;
            let cause = c.origin.cause.as_deref().unwrap_or("-");
            match finding {
                Finding::Lost => {
                    tracing::warn!(pod = %c.pod, volume = %m.outer_volume_spec_name(),
                        path = %m.path.display(), detected_by = c.origin.by.as_str(), cause,
                        "volume was unmounted behind the manager's back; setting it up again");
                    self.world.emit(VolumeEvent::lost(
                        c.pod,
                        m.outer_volume_spec_name().to_owned(),
                        c.volume.clone(),
                        m.path,
                    ));
                }
                Finding::Foreign => {
                    tracing::warn!(pod = %c.pod, volume = %m.outer_volume_spec_name(),
                        path = %m.path.display(), detected_by = c.origin.by.as_str(), cause,
                        "something else was mounted on a volume's path; unmounting it");
                }
            }
            self.world.mark_dirty([c.volume]);
        }
    }
}

/// Sends `deferred` again after a short wait: the manager is working on
/// these volumes (2 ms, doubling per deferral, at most 1 s apart), all at
/// once.
fn check_again_soon(tx: &mpsc::UnboundedSender<CheckRequest>, deferred: Vec<CheckRequest>) {
    let most = deferred.iter().map(|r| r.deferrals).min().unwrap_or(0);
    let delay = Duration::from_millis(2)
        .saturating_mul(1 << most.saturating_add(1).min(9))
        .min(Duration::from_secs(1));
    let tx = tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        for mut r in deferred {
            r.deferrals = r.deferrals.saturating_add(1);
            let _ = tx.send(r);
        }
    });
}

fn detection(o: &Origin) -> Detection {
    Detection {
        by: o.by,
        cause: o.cause.clone(),
        detected_after_us: o
            .boot_ns
            .and_then(|t| monotonic_ns().checked_sub(t))
            .map(|ns| ns / 1000),
    }
}

pub use crate::util::clock::monotonic_ns;
