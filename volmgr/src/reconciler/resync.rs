//! The periodic resync: the safety net under the tracer. It checks every
//! volume recorded as mounted — against the mount table when it must read
//! it, or against cheaper signals when they show nothing changed — marks
//! those lost behind the manager's back uncertain (so they are set up again),
//! and asks for a full reconcile pass. Device mounts it can watch (a CSI
//! `globalmount` the driver mounted) are checked too: one that is gone makes
//! the device uncertain, and its pods' mounts with it, so it is staged
//! again, then published again.

use std::sync::Arc;

use super::{LostVolume, Reconciler};
use crate::cache::actual_state_of_world::{DeviceMountState, MountedPod, VolumeMountState};
use crate::cache::world::VolumeEvent;
use crate::plugins::VolumeError;
use crate::sys::mount_table::{MountTable, MountTableView};
use crate::sys::{MountTableWatch, Mounter};
use crate::util::sync::MutexExt;
use crate::volume::UniqueVolumeName;

/// A resync reads the mount table at least this often, even when a cheaper
/// check would do: what those checks cannot see (a mount stacked over a
/// volume or moved away, a directory above a mount renamed, which moves the
/// mount's path without a mount event) is then still found, ten periods
/// later at most.
const READ_TABLE_EVERY: u32 = 10;

/// What lets a resync skip reading the mount table: at 10,000 volumes,
/// having the kernel format `/proc/self/mountinfo` and parsing it is most of
/// a resync's cost (50-70 ms), and what it would tell is usually known.
#[derive(Default)]
pub(super) struct ResyncState {
    /// The watch on the mount table, opened by the first resync.
    watch: Option<Box<dyn MountTableWatch>>,
    /// The actual state's mounted generation at the last resync that
    /// checked every volume recorded as mounted.
    checked: Option<u64>,
    /// Resyncs since the last one that read the table (or since start-up,
    /// whose reconstruction read it).
    since_read: u32,
}

/// How a resync checks the volumes recorded as mounted.
enum ResyncCheck {
    /// Neither the mount table nor the set of mounted volumes changed since
    /// the last check: only the checks that read no table run.
    Unchanged,
    /// The table changed: if every volume set up by a mount has its
    /// mount's id still listed (`listmount(2)`, 2 ms), nothing was
    /// unmounted; otherwise the table is read.
    MountIds,
    /// Read the table and check everything against it.
    ReadTable,
}

impl ResyncState {
    /// Which check this resync makes. Call it before reading the table, so
    /// that a change made meanwhile is seen next time.
    fn next_check(&mut self, mounter: &dyn Mounter, generation: u64) -> ResyncCheck {
        if self.watch.is_none() {
            match mounter.watch_mount_table() {
                Ok(w) => self.watch = Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, "resync: cannot watch the mount table");
                }
            }
        }
        // Always asked, so that the watch's flag is cleared.
        let table_changed = self.watch.as_mut().is_none_or(|w| w.changed());
        // Reconstruction read the table at start-up: the first resync
        // counts from there.
        if self.since_read + 1 >= READ_TABLE_EVERY {
            ResyncCheck::ReadTable
        } else if !table_changed && self.checked == Some(generation) {
            ResyncCheck::Unchanged
        } else {
            ResyncCheck::MountIds
        }
    }

    /// Records a completed check at `generation`.
    fn checked(&mut self, generation: u64, read_table: bool) {
        self.checked = Some(generation);
        self.since_read = if read_table { 0 } else { self.since_read + 1 };
    }
}

impl Reconciler {
    /// The periodic safety net: re-reads the mount table, marks volumes that
    /// were torn down behind the manager's back as unmounted, and makes a
    /// full pass (which mounts them again).
    pub async fn resync(self: &Arc<Self>) {
        // Reading the table and checking every volume makes syscalls: do it
        // on a blocking thread, not on the runtime.
        let this = Arc::clone(self);
        let lost = self.pool.run(move || this.check_mounted()).await;
        match lost {
            Ok((lost, devices)) => {
                self.forget_lost_devices(devices);
                self.forget_lost(lost);
            }
            Err(e) => tracing::warn!(error = %e, "resync: cannot check the mounted volumes"),
        }
        self.world.mark_all_dirty();
    }

    /// The resync's check of every volume recorded as mounted (see
    /// [`ResyncCheck`]), and of every device mount it watches. Blocking.
    fn check_mounted(&self) -> Result<(Vec<LostVolume>, Vec<UniqueVolumeName>), VolumeError> {
        let started = std::time::Instant::now();
        // Only a cache of what the last resyncs saw: usable after a panic.
        let mut state = self.resync_state.locked();
        let generation = self.world.asw().mounted_generation();
        match state.next_check(&*self.mounter, generation) {
            ResyncCheck::Unchanged => {
                let lost = self.find_lost(MountTableView::NotRead);
                state.checked(generation, false);
                tracing::debug!(elapsed = ?started.elapsed(), lost = lost.len(), "resync: mount table unchanged");
                return Ok((lost, Vec::new()));
            }
            ResyncCheck::MountIds if self.mount_ids_all_listed() => {
                let lost = self.find_lost(MountTableView::NotRead);
                state.checked(generation, false);
                tracing::debug!(elapsed = ?started.elapsed(), lost = lost.len(), "resync: every mount id listed");
                return Ok((lost, Vec::new()));
            }
            ResyncCheck::MountIds | ResyncCheck::ReadTable => {}
        }
        state.checked = None;
        let table = MountTable::new(self.mounter.mount_table()?);
        let lost = self.find_lost(MountTableView::Read(&table));
        let devices = self.find_lost_devices(&table);
        state.checked(generation, true);
        drop(table);
        // The parsed table (megabytes at 10,000 mounts) is freed by now:
        // hand its pages back instead of keeping them resident.
        crate::sys::memory::release_free_heap();
        tracing::debug!(elapsed = ?started.elapsed(), lost = lost.len(), "resync: mount table read");
        Ok((lost, devices))
    }

    /// Whether every volume recorded as mounted whose check reads the mount
    /// table has a known mount id, still listed by the kernel: then none of
    /// them was unmounted (ids are never reused).
    fn mount_ids_all_listed(&self) -> bool {
        let ids = match self.mounter.mount_ids() {
            Ok(Some(ids)) => ids,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(error = %e, "resync: cannot list the mount ids");
                return false;
            }
        };
        let asw = self.world.asw();
        for (_, av) in asw.volumes() {
            // A watched device mount (its id is known) whose id is gone.
            if av.device_mount_state == DeviceMountState::Mounted
                && av.device_mount_id.is_some_and(|id| !ids.contains(&id))
            {
                return false;
            }
            let Some(p) = self.plugins.find_by_name(&av.plugin_name) else {
                continue;
            };
            for (_, m) in &av.pods {
                if m.state == VolumeMountState::Mounted
                    && p.verify_reads_mount_table(&m.spec)
                    && !m.mount_id.is_some_and(|id| ids.contains(&id))
                {
                    return false;
                }
            }
        }
        true
    }

    /// Volumes recorded as mounted that no longer are.
    pub fn find_lost(&self, table: MountTableView<'_>) -> Vec<LostVolume> {
        let asw = self.world.asw();
        let mut lost = Vec::new();
        for (v, av) in asw.volumes() {
            let Some(p) = self.plugins.find_by_name(&av.plugin_name) else {
                continue;
            };
            for (pod, m) in &av.pods {
                if m.state == VolumeMountState::Mounted && !p.verify(&m.spec, &m.path, table) {
                    lost.push((
                        v.clone(),
                        pod.clone(),
                        m.outer_volume_spec_name().to_owned(),
                        m.path.clone(),
                    ));
                }
            }
        }
        lost
    }

    /// Devices recorded as mounted whose watched mount (see
    /// [`AttachedVolume::device_mount_id`](crate::cache::actual_state_of_world::AttachedVolume::device_mount_id))
    /// `table` no longer shows: someone unmounted a CSI `globalmount`.
    pub fn find_lost_devices(&self, table: &MountTable) -> Vec<UniqueVolumeName> {
        self.world
            .asw()
            .volumes()
            .filter(|(_, av)| {
                av.device_mount_state == DeviceMountState::Mounted
                    && av.device_mount_id.is_some()
                    && av
                        .device_mount_path
                        .as_ref()
                        .is_some_and(|p| !table.is_mount_point(p))
            })
            .map(|(v, _)| v.clone())
            .collect()
    }

    /// Marks lost devices uncertain, and with them their pods' mounts: the
    /// device is mounted again, then the pods' mounts set up again (a
    /// publish made from the staging path would otherwise be made from an
    /// empty directory).
    pub fn forget_lost_devices(&self, lost: Vec<UniqueVolumeName>) {
        if lost.is_empty() {
            return;
        }
        let mut asw = self.world.asw_mut();
        for v in &lost {
            if asw.device_mount_state(v) == DeviceMountState::Mounted {
                tracing::warn!(volume = %v,
                    "device mount was unmounted behind the manager's back; mounting it again");
                asw.set_device_mount_state(v, DeviceMountState::Uncertain);
            }
        }
        drop(asw);
        self.world.mark_dirty(lost);
    }

    /// Marks lost volumes as unmounted (so they are mounted again if desired).
    pub fn forget_lost(&self, lost: Vec<LostVolume>) {
        if lost.is_empty() {
            return;
        }
        let mut asw = self.world.asw_mut();
        for (v, pod, outer, path) in &lost {
            tracing::warn!(pod = %pod, volume = %outer, path = %path.display(),
                "volume was unmounted behind the manager's back; setting it up again");
            // Uncertain, not gone: set-up runs again if desired; tear-down
            // (idempotent) runs if not.
            if let Some(m) = asw.pod_mount(v, pod).cloned() {
                asw.mark_volume_as_mounted(
                    v,
                    pod,
                    MountedPod {
                        state: VolumeMountState::Uncertain,
                        ..m
                    },
                );
            }
        }
        drop(asw);
        for (v, pod, outer, path) in lost {
            self.world
                .emit(VolumeEvent::lost(pod, outer, v.clone(), path));
            self.world.mark_dirty([v]);
        }
    }
}
