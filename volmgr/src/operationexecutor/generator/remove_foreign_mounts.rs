//! `RemoveForeignMounts` (volmgr's own): mounts the tracer found stacked
//! on a pod's volume, unmounted from the top.

use std::sync::Arc;

use crate::cache::actual_state_of_world::{ForeignMounts, MountedPod, VolumeMountState};
use crate::cache::out_of_band::OutOfBandLog;
use crate::cache::world::{VolumeEvent, World};
use crate::operationexecutor::unstack::unstack;
use crate::plugins::foreign::is_foreign;
use crate::plugins::{VolumeError, VolumePlugin};
use crate::sys::mount_table::{MountTable, MountTableView};
use crate::sys::root_dir::RootDir;
use crate::sys::Mounter;
use crate::volume::{PodUid, UniqueVolumeName};

/// What [`remove_foreign_mounts`] works on.
pub struct ForeignMountRemoval {
    /// The shared state.
    pub world: Arc<World>,
    /// Where the finding was logged; gets the outcome.
    pub log: Arc<OutOfBandLog>,
    /// The manager's root directory.
    pub root: Arc<RootDir>,
    /// Unmounts.
    pub mounter: Arc<dyn Mounter>,
    /// The volume's plugin (what belongs on the path).
    pub plugin: Arc<dyn VolumePlugin>,
    /// The volume.
    pub volume: UniqueVolumeName,
    /// The pod.
    pub pod: PodUid,
    /// The pod's mount of the volume, as recorded when the reconciler looked.
    pub mounted: MountedPod,
    /// The finding (the actual state's mark).
    pub found: ForeignMounts,
}

/// How often the removal reads the table again and unstacks what it finds
/// before it gives up (and backs off): someone keeps mounting there.
const FOREIGN_ROUNDS: usize = 8;

/// `RemoveForeignMounts`: unmount, from the top, what was mounted over a
/// pod's volume beyond its plugin's own mounts (the tracer found and marked
/// it). The outcome goes to the out-of-band log; success clears the mark
/// (a failure keeps it, so the reconciler tries again after the backoff). If
/// what is left on the path is not the volume, it is marked uncertain, so it
/// is set up again.
pub async fn remove_foreign_mounts(op: ForeignMountRemoval) -> Result<(), VolumeError> {
    let (world, log) = (Arc::clone(&op.world), Arc::clone(&op.log));
    let (volume, pod, found) = (op.volume.clone(), op.pod.clone(), op.found);
    let res = tokio::task::spawn_blocking(move || unstack_foreign(&op))
        .await
        .map_err(VolumeError::from)
        .and_then(|r| r);
    if res.is_ok() {
        world.asw_mut().clear_foreign_mounts(&volume, &pod, found);
    }
    log.foreign_mount_handled(
        found.log_seq,
        res.as_ref()
            .map(|_| ())
            .map_err(|e| e as &dyn std::fmt::Display),
    );
    res
}

/// The blocking part of [`remove_foreign_mounts`].
fn unstack_foreign(op: &ForeignMountRemoval) -> Result<(), VolumeError> {
    let (path, spec) = (&op.mounted.path, &op.mounted.spec);
    let still_ours = op
        .world
        .asw()
        .pod_mount(&op.volume, &op.pod)
        .is_some_and(|m| m.state == VolumeMountState::Mounted && m.path == *path);
    if !still_ours {
        return Ok(());
    }
    let read =
        || -> Result<MountTable, VolumeError> { Ok(MountTable::new(op.mounter.mount_table()?)) };
    let foreign = |t: &MountTable| is_foreign(op.plugin.as_ref(), spec, path, t);
    let mut table = read()?;
    let mut removed = 0;
    for round in 0.. {
        if !foreign(&table) {
            break;
        }
        if round == FOREIGN_ROUNDS {
            return Err(VolumeError::Internal(format!(
                "{} still has foreign mounts after {removed} unmounts",
                path.display()
            )));
        }
        let u = unstack(&op.root, op.mounter.as_ref(), path, &mut table, foreign);
        removed += u.removed;
        u.result?;
        // Read again: someone may have mounted there meanwhile.
        table = read()?;
    }
    tracing::info!(pod = %op.pod, volume = %op.mounted.outer_volume_spec_name(), removed,
        "removed foreign mounts from a volume's path");
    if !op.plugin.verify(spec, path, MountTableView::Read(&table)) {
        // What is left is not the volume (e.g. it was unmounted too): set it
        // up again.
        op.world.asw_mut().mark_volume_as_mounted(
            &op.volume,
            &op.pod,
            MountedPod {
                state: VolumeMountState::Uncertain,
                ..op.mounted.clone()
            },
        );
        op.world.emit(VolumeEvent::lost(
            op.pod.clone(),
            op.mounted.outer_volume_spec_name().to_owned(),
            op.volume.clone(),
            path.clone(),
        ));
    }
    Ok(())
}
