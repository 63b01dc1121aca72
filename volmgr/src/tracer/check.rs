//! Targeted checks of the kernel's mount table. A tracer never changes the
//! actual state from what it was told: it asks for a check of the paths a
//! change may have touched, and this module compares the actual state with
//! `/proc/self/mountinfo` (the source of truth) for the managed volumes under
//! those paths only.
//!
//! Two findings lead to action:
//!
//! - **Lost**: a volume recorded as mounted that the mount table no longer
//!   shows (someone ran `umount` on it). It is marked *uncertain* — the
//!   pattern of [`Reconciler::forget_lost`](crate::reconciler::Reconciler::forget_lost):
//!   set up again if still desired, torn down (idempotently) if not — and
//!   the reconciler is woken at once.
//! - **Foreign mount**: more mounts on a volume's path than its plugin puts
//!   there (something mounted over a tmpfs emptyDir, or on a disk emptyDir's
//!   directory), or as many but not the volume (its tmpfs unmounted and
//!   something else mounted in its place). The pod's containers would see that file system instead of
//!   their volume, and a tear-down would have to cross it. The kubelet never
//!   looks; volmgr does what its start-up reconstruction does with stacked
//!   mounts: it unmounts the extra mounts from the top down to what the
//!   plugin set up (an operation on that volume, so never concurrent with
//!   the manager's own operations on it), then checks the volume once more.
//!   Mounts *below* a volume's path (inside the volume) are the pod's
//!   business and are left alone.
//!
//! Races with the manager's own operations: a volume with an operation in
//! flight is not judged (its own mounts and unmounts are in progress); it is
//! checked again shortly after. A volume is marked lost only if, under the
//! actual state's write lock, it is still mounted at the same path and no
//! operation on it started or finished since the snapshot taken before the
//! mount table was read — so the table read is newer than anything the
//! manager itself did to that volume.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::cache::actual_state_of_world::{MountedPod, VolumeMountState};
use crate::cache::world::{VolumeEvent, VolumeEventKind, World};
use crate::operationexecutor::{OperationExecutor, OperationKind, OperationRecord};
use crate::plugins::{VolumeError, VolumePlugin};
use crate::sys::mount_table::{MountTable, MountTableView};
use crate::sys::root_dir::{RelPath, RootDir};
use crate::sys::Mounter;
use crate::volume::{PodUid, StorageMedium, UniqueVolumeName, VolumeSource, VolumeSpec};
use crate::volumemanager::VolumeManager;

use crate::cache::out_of_band::{DetectedBy, Detection, OutOfBandLog};

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
    /// Volumes whose foreign mounts are being removed.
    pub foreign: usize,
    /// Requests put off because an operation on the volume is in flight.
    pub deferred: Vec<CheckRequest>,
    /// How long the check took.
    pub took: Duration,
}

/// The checker: owns the manager's pieces a check needs.
pub struct Checker {
    world: Arc<World>,
    executor: Arc<OperationExecutor>,
    vm: Arc<VolumeManager>,
    root: Arc<RootDir>,
    mounter: Arc<dyn Mounter>,
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
    record: Option<Fingerprint>,
}

/// What identifies the last operation on a (volume, pod): any operation
/// starting or finishing changes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    kind: OperationKind,
    attempts: u32,
    failures: u32,
    running: bool,
}

impl From<&OperationRecord> for Fingerprint {
    fn from(r: &OperationRecord) -> Self {
        Self {
            kind: r.kind,
            attempts: r.attempts,
            failures: r.failures,
            running: r.running,
        }
    }
}

impl Checker {
    /// A checker for `vm`.
    pub fn new(vm: &Arc<VolumeManager>, counters: Arc<CheckCounters>) -> Arc<Self> {
        Arc::new(Self {
            world: Arc::clone(vm.world()),
            executor: Arc::clone(vm.executor()),
            vm: Arc::clone(vm),
            root: Arc::clone(vm.root()),
            mounter: Arc::clone(vm.mounter()),
            log: Arc::clone(vm.out_of_band()),
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
        // Checks run on one thread of their own rather than the blocking
        // pool: each reads and parses the whole mount table, and spread over
        // many pool threads those allocations can stay in as many malloc
        // arenas; one thread also keeps checks in order.
        type Job = (
            Vec<CheckRequest>,
            tokio::sync::oneshot::Sender<Result<CheckOutcome, VolumeError>>,
        );
        let (jobs, job_rx) = std::sync::mpsc::channel::<Job>();
        let this = Arc::clone(&self);
        // A check starts operations (foreign-mount removal) on the runtime.
        let runtime = tokio::runtime::Handle::current();
        let worker = std::thread::Builder::new()
            .name("volmgr-check".into())
            .spawn(move || {
                let _runtime = runtime.enter();
                while let Ok((batch, reply)) = job_rx.recv() {
                    let _ = reply.send(this.check(batch));
                }
            });
        if let Err(e) = &worker {
            tracing::warn!(error = %e, "tracer: no check thread; using the blocking pool");
        }
        let jobs = worker.is_ok().then_some(jobs);
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
            let started = std::time::Instant::now();
            let outcome = match &jobs {
                Some(jobs) => {
                    let (reply, answer) = tokio::sync::oneshot::channel();
                    let _ = jobs.send((batch, reply));
                    answer.await.map_err(|e| e.to_string())
                }
                None => {
                    let this = Arc::clone(&self);
                    tokio::task::spawn_blocking(move || this.check(batch))
                        .await
                        .map_err(|e| e.to_string())
                }
            }
            .map(|r| {
                r.map(|mut o| {
                    o.took = started.elapsed();
                    o
                })
            });
            let outcome = match outcome {
                Ok(Ok(o)) => o,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "tracer: cannot check the mount table");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "tracer: the check task failed");
                    continue;
                }
            };
            if !outcome.deferred.is_empty() {
                // The manager is working on these volumes: look again soon
                // (2 ms, doubling per deferral, at most 1 s apart), all at once.
                let most = outcome
                    .deferred
                    .iter()
                    .map(|r| r.deferrals)
                    .min()
                    .unwrap_or(0);
                let delay = Duration::from_millis(2)
                    .saturating_mul(1 << most.saturating_add(1).min(9))
                    .min(Duration::from_secs(1));
                let tx = tx.clone();
                let again = outcome.deferred;
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    for mut r in again {
                        r.deferrals = r.deferrals.saturating_add(1);
                        let _ = tx.send(r);
                    }
                });
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

    /// One check of the managed volumes the requests cover, against a fresh
    /// read of the mount table. Runs on a blocking thread.
    pub fn check(&self, batch: Vec<CheckRequest>) -> Result<CheckOutcome, VolumeError> {
        let mut out = CheckOutcome::default();
        let root = self.root.path();
        // 1. Snapshot of the candidates (actual state, then operations: the
        // executor's lock is never taken under the actual state's here).
        // The request covering a path: one for everything, or the nearest
        // requested ancestor (a lookup per path component, not per request:
        // a burst brings thousands).
        let all = batch.iter().find(|r| r.scope == Scope::All);
        let below: HashMap<&Path, &CheckRequest> = batch
            .iter()
            .filter_map(|r| match &r.scope {
                Scope::Below(p) => Some((p.as_path(), r)),
                Scope::All => None,
            })
            .collect();
        let covering = |path: &Path| -> Option<&CheckRequest> {
            all.or_else(|| path.ancestors().find_map(|a| below.get(a).copied()))
        };
        let mut candidates: Vec<Candidate> = Vec::new();
        {
            let asw = self.world.asw();
            for (v, av) in asw.volumes() {
                for (pod, m) in &av.pods {
                    if !m.path.starts_with(root) {
                        continue;
                    }
                    let Some(req) = covering(&m.path) else {
                        continue;
                    };
                    candidates.push(Candidate {
                        volume: v.clone(),
                        pod: pod.clone(),
                        plugin_name: Arc::clone(&av.plugin_name),
                        mounted: m.clone(),
                        origin: req.origin.clone(),
                        record: None,
                    });
                }
            }
        }
        let mut deferred: HashMap<PathBuf, CheckRequest> = HashMap::new();
        candidates.retain_mut(|c| {
            let rec = self.executor.record(&c.volume, Some(&c.pod));
            c.record = rec.as_ref().map(Fingerprint::from);
            if rec.is_some_and(|r| r.running) {
                let req = covering(&c.mounted.path).cloned();
                if let Some(mut req) = req {
                    req.scope = Scope::Below(c.mounted.path.clone());
                    deferred.entry(c.mounted.path.clone()).or_insert(req);
                }
                return false;
            }
            // Uncertain: the reconciler sets it up again anyway.
            c.mounted.state == VolumeMountState::Mounted
        });
        out.deferred = deferred.into_values().collect();
        if candidates.is_empty() {
            return Ok(out);
        }
        // 2. The source of truth, read after the snapshot.
        self.counters.checks.fetch_add(1, Ordering::Relaxed);
        // Only mounts under ROOT can be managed volumes' (the index stays
        // small however many mounts the node has elsewhere).
        let table = MountTable::new(
            self.mounter
                .mount_table()
                .map_err(|e| VolumeError::Internal(e.to_string()))?
                .into_iter()
                .filter(|m| m.mount_point.starts_with(root))
                .collect(),
        );
        let mut lost = Vec::new();
        for c in candidates {
            let Some(plugin) = self.vm.plugins().find_by_name(&c.plugin_name) else {
                continue;
            };
            let path = &c.mounted.path;
            if is_foreign(plugin.as_ref(), &c.mounted.spec, path, &table) {
                let retry = CheckRequest {
                    scope: Scope::Below(path.clone()),
                    origin: c.origin.clone(),
                    deferrals: 0,
                };
                if self.remove_foreign_mounts(c, plugin) {
                    out.foreign += 1;
                } else {
                    out.deferred.push(retry);
                }
            } else if !plugin.verify(&c.mounted.spec, path, MountTableView::Read(&table)) {
                lost.push(c);
            }
        }
        // 3. Commit the losses the manager did not cause.
        let mut confirmed = Vec::new();
        {
            let mut asw = self.world.asw_mut();
            for c in lost {
                let same = asw.pod_mount(&c.volume, &c.pod).is_some_and(|m| {
                    m.state == VolumeMountState::Mounted && m.path == c.mounted.path
                });
                let now = self
                    .executor
                    .record(&c.volume, Some(&c.pod))
                    .as_ref()
                    .map(Fingerprint::from);
                if !same || now != c.record {
                    // The manager changed it meanwhile: its own doing.
                    continue;
                }
                asw.mark_volume_as_mounted(
                    &c.volume,
                    &c.pod,
                    MountedPod {
                        state: VolumeMountState::Uncertain,
                        ..c.mounted.clone()
                    },
                );
                self.log
                    .expect_loss(&c.volume, &c.pod, detection(&c.origin));
                confirmed.push(c);
            }
        }
        out.lost = confirmed.len();
        for c in confirmed {
            tracing::warn!(pod = %c.pod, volume = %c.mounted.outer_volume_spec_name,
                path = %c.mounted.path.display(), detected_by = c.origin.by.as_str(),
                cause = c.origin.cause.as_deref().unwrap_or("-"),
                "volume was unmounted behind the manager's back; setting it up again");
            self.world.emit(VolumeEvent {
                kind: VolumeEventKind::LostOutOfBand,
                pod_uid: c.pod,
                volume: c.mounted.outer_volume_spec_name,
                volume_name: c.volume.clone(),
                path: Some(c.mounted.path),
                error: None,
            });
            self.world.mark_dirty([c.volume]);
        }
        Ok(out)
    }

    /// Starts the operation that unmounts what was mounted over a volume;
    /// `false` if another operation on it runs or it backs off.
    fn remove_foreign_mounts(&self, c: Candidate, plugin: Arc<dyn VolumePlugin>) -> bool {
        let world = Arc::clone(&self.world);
        let root = Arc::clone(&self.root);
        let mounter = Arc::clone(&self.mounter);
        let log = Arc::clone(&self.log);
        let (volume, pod, plugin_name) =
            (c.volume.clone(), c.pod.clone(), Arc::clone(&c.plugin_name));
        let (outer, path, origin) = (
            c.mounted.outer_volume_spec_name.clone(),
            c.mounted.path.clone(),
            c.origin.clone(),
        );
        // Logged first (an open entry of the volume is reused), so the
        // operation can report its outcome however fast it ends.
        let seq = self
            .log
            .foreign_mount(&volume, &pod, &outer, &path, detection(&origin));
        let op = async move {
            let r = tokio::task::spawn_blocking(move || {
                unstack_volume(&world, &root, mounter.as_ref(), plugin.as_ref(), &c)
            })
            .await
            .map_err(|e| VolumeError::Internal(e.to_string()))
            .and_then(|r| r);
            log.foreign_mount_handled(seq, r.as_ref().map(|_| ()).map_err(|e| e.to_string()));
            r
        };
        match self.executor.start(
            &volume,
            Some(&pod),
            OperationKind::RemoveForeignMounts,
            plugin_name,
            op,
        ) {
            Ok(()) => {
                tracing::warn!(%pod, volume = %outer, path = %path.display(),
                    detected_by = origin.by.as_str(),
                    cause = origin.cause.as_deref().unwrap_or("-"),
                    "something else was mounted on a volume's path; unmounting it");
                true
            }
            Err(why) => {
                tracing::debug!(%volume, %pod, ?why, "removing foreign mounts put off");
                false
            }
        }
    }
}

/// Whether a volume's path carries mounts its plugin did not make: more than
/// the plugin's own, or as many but not the volume (its tmpfs was unmounted
/// and something else mounted in its place).
fn is_foreign(
    plugin: &dyn VolumePlugin,
    spec: &VolumeSpec,
    path: &Path,
    table: &MountTable,
) -> bool {
    let (count, expected) = (table.count(path), expected_mounts(spec));
    count > expected || (count > 0 && !plugin.verify(spec, path, MountTableView::Read(table)))
}

/// How many mounts the plugin itself puts on a volume's path: none for a
/// disk-backed emptyDir (a plain directory), one otherwise.
pub fn expected_mounts(spec: &VolumeSpec) -> usize {
    match spec.source {
        VolumeSource::EmptyDir {
            medium: StorageMedium::Default,
            ..
        } => 0,
        _ => 1,
    }
}

/// The body of the foreign-mount removal: runs while no other operation on
/// the volume can. Unmounts from the top while more than the plugin's own
/// mounts are stacked, then marks the volume uncertain (set up again) if
/// what is left is not the volume.
fn unstack_volume(
    world: &World,
    root: &RootDir,
    mounter: &dyn Mounter,
    plugin: &dyn VolumePlugin,
    c: &Candidate,
) -> Result<(), VolumeError> {
    let still_ours = world
        .asw()
        .pod_mount(&c.volume, &c.pod)
        .is_some_and(|m| m.state == VolumeMountState::Mounted && m.path == c.mounted.path);
    if !still_ours {
        return Ok(());
    }
    let path = &c.mounted.path;
    let rel = path
        .strip_prefix(root.path())
        .map_err(|_| VolumeError::Internal(format!("{} is not under ROOT", path.display())))?;
    let rel = RelPath::new(rel.iter())?;
    let (parent, name) = rel
        .split_last()
        .ok_or_else(|| VolumeError::Internal("empty volume path".into()))?;
    let read = || -> Result<MountTable, VolumeError> {
        Ok(MountTable::new(
            mounter
                .mount_table()
                .map_err(|e| VolumeError::Internal(e.to_string()))?,
        ))
    };
    let mut table = read()?;
    let mut removed = 0;
    while is_foreign(plugin, &c.mounted.spec, path, &table) {
        if removed >= 64 {
            return Err(VolumeError::Internal(format!(
                "{} still has foreign mounts after 64 unmounts",
                path.display()
            )));
        }
        let parent_dir = root.open_dir(&parent)?;
        mounter.unmount(&parent_dir, name)?;
        removed += 1;
        table = read()?;
    }
    tracing::info!(pod = %c.pod, volume = %c.mounted.outer_volume_spec_name, removed,
        "removed foreign mounts from a volume's path");
    if !plugin.verify(&c.mounted.spec, path, MountTableView::Read(&table)) {
        // What is left is not the volume (e.g. it was unmounted too): set it
        // up again.
        {
            let mut asw = world.asw_mut();
            asw.mark_volume_as_mounted(
                &c.volume,
                &c.pod,
                MountedPod {
                    state: VolumeMountState::Uncertain,
                    ..c.mounted.clone()
                },
            );
        }
        world.emit(VolumeEvent {
            kind: VolumeEventKind::LostOutOfBand,
            pod_uid: c.pod.clone(),
            volume: c.mounted.outer_volume_spec_name.clone(),
            volume_name: c.volume.clone(),
            path: Some(path.clone()),
            error: None,
        });
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::fake::FakeMounter;
    use crate::volumemanager::Config;

    const T: Duration = Duration::from_secs(20);

    struct Setup {
        _dir: tempfile::TempDir,
        fake: Arc<FakeMounter>,
        vm: Arc<VolumeManager>,
        checker: Arc<Checker>,
        uid: PodUid,
        volume: UniqueVolumeName,
        path: PathBuf,
    }

    /// A manager on the fake mounter with one pod whose tmpfs emptyDir is
    /// mounted.
    async fn setup() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeMounter::default());
        let vm = VolumeManager::new(Config::new(dir.path()), fake.clone()).unwrap();
        vm.start().await.unwrap();
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
            "spec": {"containers": [{"name": "c", "volumeMounts": [{"name": "m", "mountPath": "/m"}]}],
                     "volumes": [{"name": "m", "emptyDir": {"medium": "Memory"}}]}
        }))
        .unwrap();
        let uid = vm.upsert_pod(&pod).unwrap();
        vm.set_populated();
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        let m = vm.mounted_volumes_for_pod(&uid).remove(0);
        let checker = Checker::new(&vm, Arc::default());
        Setup {
            _dir: dir,
            fake,
            vm,
            checker,
            uid,
            volume: m.volume_name,
            path: m.path,
        }
    }

    fn request(path: &Path) -> CheckRequest {
        CheckRequest {
            scope: Scope::Below(path.to_path_buf()),
            origin: Origin {
                by: DetectedBy::Ebpf,
                cause: Some("umount2(\"x\") by umount[7]".into()),
                boot_ns: Some(monotonic_ns()),
            },
            deferrals: 0,
        }
    }

    async fn check(s: &Setup) -> CheckOutcome {
        let (c, path) = (Arc::clone(&s.checker), s.path.clone());
        tokio::task::spawn_blocking(move || c.check(vec![request(&path)]))
            .await
            .unwrap()
            .unwrap()
    }

    fn mount_foreign(s: &Setup, fstype: &str) {
        let rel = RelPath::new(s.path.strip_prefix(s.vm.root().path()).unwrap().iter()).unwrap();
        let target = s.vm.root().open_dir(&rel).unwrap();
        s.fake
            .mount(
                "foreign",
                &target,
                fstype,
                crate::sys::MsFlags::empty(),
                None,
            )
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mounted_volume_is_left_alone() {
        let s = setup().await;
        let o = check(&s).await;
        assert_eq!((o.lost, o.foreign, o.deferred.len()), (0, 0, 0));
        assert!(s.vm.out_of_band().recent().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_volume_is_confirmed_recorded_and_set_up_again() {
        let s = setup().await;
        s.fake.remove_out_of_band(&s.path);
        let o = check(&s).await;
        assert_eq!(o.lost, 1);
        s.vm.wait_for_attach_and_mount(&s.uid, T).await.unwrap();
        assert_eq!(s.fake.mounted(), vec![s.path.clone()]);
        let log = s.vm.out_of_band().recent();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].kind, "lost");
        assert_eq!(log[0].detected_by, "ebpf");
        assert_eq!(log[0].cause.as_deref(), Some("umount2(\"x\") by umount[7]"));
        assert!(log[0].detected_after_us.is_some());
        assert_eq!(s.vm.out_of_band().volume(&s.volume, &s.uid).unwrap().0, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_volume_with_an_operation_in_flight_is_checked_later() {
        let s = setup().await;
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        s.vm.executor()
            .start(
                &s.volume,
                Some(&s.uid),
                OperationKind::MountVolume,
                "test".into(),
                async move {
                    let _ = wait.await;
                    Ok(())
                },
            )
            .unwrap();
        // The manager's own operation may be unmounting it right now.
        s.fake.remove_out_of_band(&s.path);
        let o = check(&s).await;
        assert_eq!((o.lost, o.foreign), (0, 0));
        assert_eq!(o.deferred.len(), 1);
        assert_eq!(o.deferred[0].scope, Scope::Below(s.path.clone()));
        let _ = release.send(());
        while s.vm.executor().is_running(&s.volume) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Once it is done, the same check finds the loss.
        assert_eq!(check(&s).await.lost, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn foreign_mounts_are_removed_down_to_the_volume() {
        let s = setup().await;
        mount_foreign(&s, "ext4");
        mount_foreign(&s, "tmpfs");
        assert_eq!(check(&s).await.foreign, 1);
        while s.fake.mounted().len() != 1 || s.vm.executor().is_running(&s.volume) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let log = s.vm.out_of_band().recent();
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0].kind, "foreign_mount");
        assert_eq!(log[0].outcome, "repaired");
        // The pod's own tmpfs (the first mount) stayed: no set-up again.
        assert_eq!(check(&s).await.foreign, 0);
        assert_eq!(
            s.fake
                .calls()
                .iter()
                .filter(|c| matches!(c, crate::sys::fake::Call::Mount { source, .. } if source == "tmpfs"))
                .count(),
            1
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_volume_replaced_by_another_mount_is_set_up_again() {
        let s = setup().await;
        s.fake.remove_out_of_band(&s.path);
        mount_foreign(&s, "ext4");
        assert_eq!(check(&s).await.foreign, 1);
        s.vm.wait_for_attach_and_mount(&s.uid, T).await.unwrap();
        while s.vm.executor().is_running(&s.volume) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        s.vm.wait_for_attach_and_mount(&s.uid, T).await.unwrap();
        let table = MountTable::new(s.fake.mount_table().unwrap());
        assert_eq!(table.count(&s.path), 1);
        assert_eq!(table.top(&s.path).unwrap().fstype, "tmpfs");
        let kinds: Vec<String> =
            s.vm.out_of_band()
                .recent()
                .into_iter()
                .map(|e| e.kind)
                .collect();
        assert_eq!(kinds, ["foreign_mount", "lost"]);
    }
}
