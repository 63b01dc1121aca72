//! The state shared by the populator, the reconciler, operations and readers:
//! both worlds (each behind its own lock, held only for short, non-blocking
//! sections), the set of volumes the reconciler must look at next, and a
//! change counter that waiters watch.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::{watch, Notify};

use crate::cache::actual_state_of_world::ActualStateOfWorld;
use crate::cache::desired_state_of_world::DesiredStateOfWorld;
use crate::util::fast_map::FastSet;
use crate::util::sync::{MutexExt, RwLockExt};
use crate::volume::{PodUid, UniqueVolumeName};

/// What happened to a volume, for event subscribers (logs, the C ABI callback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeEventKind {
    /// Set up for the pod.
    Mounted,
    /// Torn down for the pod.
    Unmounted,
    /// An operation failed (it will be retried with backoff).
    Failed,
    /// Found unmounted behind the manager's back.
    LostOutOfBand,
    /// Its file system was grown in use (`MountVolume.NodeExpandVolume`).
    Expanded,
}

impl VolumeEventKind {
    /// A stable lowercase name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Mounted => "mounted",
            Self::Unmounted => "unmounted",
            Self::Failed => "failed",
            Self::LostOutOfBand => "lost",
            Self::Expanded => "expanded",
        }
    }
}

/// Which operation an event comes from, by the kubelet's names (what its
/// events on the pod say: `MountVolume.SetUp failed for volume ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeOperation {
    /// Setting the volume up for the pod (`MountVolume.SetUp`; for a block
    /// volume `MapVolume.MapPodDevice`).
    SetUp,
    /// Mounting (staging) the volume's device once for all its pods
    /// (`MountVolume.MountDevice`; for a block volume
    /// `MapVolume.SetUpDevice`), told to every pod that wants it.
    MountDevice,
    /// Tearing the pod's volume down (`UnmountVolume.TearDown`).
    TearDown,
    /// Growing the file system of a volume in use
    /// (`MountVolume.NodeExpandVolume`), told to every pod that has it.
    NodeExpand,
    /// Noticing the volume was unmounted behind the manager's back.
    OutOfBand,
    /// Attaching the volume to the node (`AttachVolume.Attach`), done by
    /// the attach/detach controller: its failure, as the volume's
    /// VolumeAttachment reports it, is told to the pods that wait for it.
    Attach,
}

impl VolumeOperation {
    /// The kubelet's name of the operation (`MountVolume.SetUp`), for a
    /// file system volume or (`block`) a raw block one.
    pub fn kubelet_name(&self, block: bool) -> &'static str {
        match (self, block) {
            (Self::SetUp, false) => "MountVolume.SetUp",
            (Self::SetUp, true) => "MapVolume.MapPodDevice",
            (Self::MountDevice, false) => "MountVolume.MountDevice",
            (Self::MountDevice, true) => "MapVolume.SetUpDevice",
            (Self::TearDown, false) => "UnmountVolume.TearDown",
            (Self::TearDown, true) => "UnmapVolume.UnmapPodDevice",
            (Self::NodeExpand, _) => "MountVolume.NodeExpandVolume",
            (Self::OutOfBand, _) => "OutOfBand",
            (Self::Attach, _) => "AttachVolume.Attach",
        }
    }
}

/// One volume event.
#[derive(Debug, Clone)]
pub struct VolumeEvent {
    /// What happened.
    pub kind: VolumeEventKind,
    /// The pod.
    pub pod_uid: PodUid,
    /// The volume's name in the pod.
    pub volume: String,
    /// The volume's unique name.
    pub volume_name: UniqueVolumeName,
    /// The path, if known.
    pub path: Option<std::path::PathBuf>,
    /// The error, for failures.
    pub error: Option<String>,
    /// The operation it comes from.
    pub operation: VolumeOperation,
    /// A raw block volume (`volumeDevices`), not a file system (set for
    /// the events of operations; false for out-of-band findings).
    pub block: bool,
}

impl VolumeEvent {
    /// The volume `volume_name` (`volume` in the pod) was found unmounted
    /// from `path` behind the manager's back.
    pub fn lost(
        pod_uid: PodUid,
        volume: String,
        volume_name: UniqueVolumeName,
        path: std::path::PathBuf,
    ) -> Self {
        Self {
            kind: VolumeEventKind::LostOutOfBand,
            pod_uid,
            volume,
            volume_name,
            path: Some(path),
            error: None,
            operation: VolumeOperation::OutOfBand,
            block: false,
        }
    }
}

/// A subscriber to volume events. Called on a volmgr runtime thread; must not block.
pub type EventListener = Arc<dyn Fn(&VolumeEvent) + Send + Sync>;

/// A claim whose file system was grown on the node beyond what its
/// `status.capacity` says: what the kubelet's `MarkFSResizeFinished` /
/// `MarkNodeExpansionFinishedWithRecovery` patch into the claim's status
/// (`status.capacity` to the new size, `allocatedResourceStatuses.storage`
/// and the resize conditions such as `FileSystemResizePending` removed).
/// volmgr has no API client of its own: whoever has one (the agent in API
/// mode, a C ABI caller) patches the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimResize {
    /// The claim's namespace (its pod's).
    pub namespace: String,
    /// The claim's name.
    pub claim: String,
    /// Its PersistentVolume.
    pub persistent_volume: Option<String>,
    /// The volume's unique name.
    pub volume_name: UniqueVolumeName,
    /// The size the file system now has, in bytes (the PV's capacity).
    pub size_bytes: u64,
}

/// A subscriber to [`ClaimResize`]s. Called on a volmgr runtime thread;
/// must not block.
pub type ClaimResizeListener = Arc<dyn Fn(&ClaimResize) + Send + Sync>;

/// Which volumes the next reconcile pass must look at.
#[derive(Debug, Default)]
pub struct Dirty {
    /// Look at everything.
    pub all: bool,
    /// Look at these.
    pub volumes: FastSet<UniqueVolumeName>,
    /// Pods whose directory may be removable.
    pub pods: FastSet<PodUid>,
}

impl Dirty {
    fn is_empty(&self) -> bool {
        !self.all && self.volumes.is_empty() && self.pods.is_empty()
    }
}

/// The shared state.
pub struct World {
    dsw: RwLock<DesiredStateOfWorld>,
    asw: RwLock<ActualStateOfWorld>,
    dirty: Mutex<Dirty>,
    wake: Notify,
    /// Open [`hold_wakes`](World::hold_wakes) sections.
    wake_holds: AtomicUsize,
    /// A wake-up was held back by a hold.
    wake_deferred: AtomicBool,
    generation: watch::Sender<u64>,
    populated: AtomicBool,
    reconstructed: AtomicBool,
    synced: AtomicBool,
    listeners: RwLock<Vec<EventListener>>,
    claim_listeners: RwLock<Vec<ClaimResizeListener>>,
}

impl Default for World {
    fn default() -> Self {
        Self {
            dsw: RwLock::default(),
            asw: RwLock::default(),
            dirty: Mutex::default(),
            wake: Notify::new(),
            wake_holds: AtomicUsize::new(0),
            wake_deferred: AtomicBool::new(false),
            generation: watch::Sender::new(0),
            populated: AtomicBool::new(false),
            reconstructed: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            listeners: RwLock::default(),
            claim_listeners: RwLock::default(),
        }
    }
}

impl World {
    /// Reads the desired state.
    pub fn dsw(&self) -> RwLockReadGuard<'_, DesiredStateOfWorld> {
        self.dsw.read_locked()
    }

    /// Writes the desired state (populator only).
    pub fn dsw_mut(&self) -> RwLockWriteGuard<'_, DesiredStateOfWorld> {
        self.dsw.write_locked()
    }

    /// Reads the actual state.
    pub fn asw(&self) -> RwLockReadGuard<'_, ActualStateOfWorld> {
        self.asw.read_locked()
    }

    /// Writes the actual state (operations, resync, reconstruction).
    pub fn asw_mut(&self) -> RwLockWriteGuard<'_, ActualStateOfWorld> {
        self.asw.write_locked()
    }

    /// Queues volumes for the reconciler and wakes it.
    pub fn mark_dirty(&self, volumes: impl IntoIterator<Item = UniqueVolumeName>) {
        let mut d = self.dirty.locked();
        d.volumes.extend(volumes);
        drop(d);
        self.wake_reconciler();
        self.bump();
    }

    /// Queues a pod whose directory may now be removable.
    pub fn mark_pod_dirty(&self, pod: PodUid) {
        let mut d = self.dirty.locked();
        d.pods.insert(pod);
        drop(d);
        self.wake_reconciler();
    }

    /// Asks for a full pass.
    pub fn mark_all_dirty(&self) {
        self.dirty.locked().all = true;
        self.wake_reconciler();
        self.bump();
    }

    fn wake_reconciler(&self) {
        if self.wake_holds.load(Ordering::SeqCst) == 0 {
            self.wake.notify_one();
            return;
        }
        self.wake_deferred.store(true, Ordering::SeqCst);
        // The last hold may have ended in between, without seeing the flag.
        if self.wake_holds.load(Ordering::SeqCst) == 0
            && self.wake_deferred.swap(false, Ordering::SeqCst)
        {
            self.wake.notify_one();
        }
    }

    /// Holds back the reconciler's wake-ups (the dirty marks themselves are
    /// kept) until the returned guard is dropped: a batch of inline
    /// operations then wakes it once per stretch, not once per operation,
    /// and the other CPUs stay idle meanwhile (an idle CPU is what makes
    /// `umount2`'s RCU grace period cheap). The end of any hold delivers
    /// what was held back, so overlapping holds delay a wake-up by one
    /// stretch at most.
    pub fn hold_wakes(self: &Arc<Self>) -> WakeHold {
        self.wake_holds.fetch_add(1, Ordering::SeqCst);
        WakeHold(Arc::clone(self))
    }

    /// Waits until something is dirty and takes it.
    pub async fn take_dirty(&self) -> Dirty {
        loop {
            let notified = self.wake.notified();
            {
                let mut d = self.dirty.locked();
                if !d.is_empty() {
                    return std::mem::take(&mut *d);
                }
            }
            notified.await;
        }
    }

    /// Signals waiters that the state changed. Every change of either world
    /// is followed by a bump, so a reader that saw generation G before
    /// reading may reuse what it read while the generation is still G.
    pub fn bump(&self) {
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// The current change generation (see [`bump`](Self::bump)).
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The populator has delivered every pod of its sources at least once.
    pub fn populated(&self) -> bool {
        self.populated.load(Ordering::Acquire)
    }

    /// Marks the desired state as populated.
    pub fn set_populated(&self) {
        if !self.populated.swap(true, Ordering::AcqRel) {
            self.mark_all_dirty();
        }
    }

    /// Reconstruction has run.
    pub fn reconstructed(&self) -> bool {
        self.reconstructed.load(Ordering::Acquire)
    }

    /// Marks reconstruction as done.
    pub fn set_reconstructed(&self) {
        self.reconstructed.store(true, Ordering::Release);
    }

    /// Reconstruction done, sources populated, and one full pass made since
    /// (the kubelet's `ReconcilerStatesHasBeenSynced`).
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Marks the states synced.
    pub fn set_synced(&self) {
        if !self.synced.swap(true, Ordering::AcqRel) {
            self.bump();
        }
    }

    /// Adds an event listener.
    pub fn add_listener(&self, l: EventListener) {
        self.listeners.write_locked().push(l);
    }

    /// Delivers an event to every listener.
    pub fn emit(&self, ev: VolumeEvent) {
        let listeners = self.listeners.read_locked();
        for l in listeners.iter() {
            l(&ev);
        }
    }

    /// Adds a listener of claims grown on the node.
    pub fn add_claim_resize_listener(&self, l: ClaimResizeListener) {
        self.claim_listeners.write_locked().push(l);
    }

    /// Tells every claim resize listener.
    pub fn claim_resized(&self, ev: &ClaimResize) {
        let listeners = self.claim_listeners.read_locked();
        for l in listeners.iter() {
            l(ev);
        }
    }
}

/// A [`World::hold_wakes`] section; dropping it ends the hold.
pub struct WakeHold(Arc<World>);

impl Drop for WakeHold {
    fn drop(&mut self) {
        let w = &self.0;
        w.wake_holds.fetch_sub(1, Ordering::SeqCst);
        if w.wake_deferred.swap(false, Ordering::SeqCst) {
            w.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(n: &str) -> UniqueVolumeName {
        UniqueVolumeName::new(n.to_string())
    }

    #[tokio::test]
    async fn held_wakes_are_delivered_when_a_hold_ends() {
        let world = Arc::new(World::default());
        let waiter = {
            let w = Arc::clone(&world);
            tokio::spawn(async move { w.take_dirty().await })
        };
        // Let the waiter park on the notification.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let first = world.hold_wakes();
        let second = world.hold_wakes();
        world.mark_dirty([vol("a")]);
        world.mark_pod_dirty(PodUid::new("p").unwrap());
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished(), "woken while held");
        // Any hold's end delivers (overlapping holds never starve it).
        drop(first);
        let dirty = waiter.await.unwrap();
        assert!(dirty.volumes.contains(&vol("a")));
        assert_eq!(dirty.pods.len(), 1);
        drop(second);
    }

    #[tokio::test]
    async fn marks_without_a_hold_wake_at_once_and_a_hold_keeps_the_marks() {
        let world = Arc::new(World::default());
        world.mark_dirty([vol("a")]);
        assert!(world.take_dirty().await.volumes.contains(&vol("a")));
        {
            let _hold = world.hold_wakes();
            world.mark_dirty([vol("b")]);
        }
        // The mark itself is never held back: a pass already running, or
        // the next one, sees it.
        assert!(world.take_dirty().await.volumes.contains(&vol("b")));
    }
}
