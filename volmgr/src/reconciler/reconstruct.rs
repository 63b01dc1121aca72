//! Start-up reconstruction (the kubelet's `reconstruct.go`): before the first
//! reconcile, rebuild the actual state from the mount table and the pod volume
//! directories, so that a restart neither remounts what is mounted nor leaks
//! what a crash left half-done.
//!
//! - Every record read from disk (staged, published, payload, subPath, block
//!   map) is a claim: a reboot keeps the files, not the mounts. A volume
//!   directory whose set-up completed *and* whose mounts the table shows
//!   (the plugin's check, and every subPath bind on disk) is recorded as
//!   mounted (adopted without a remount); otherwise it is *uncertain*, so
//!   the reconciler sets it up again if the pod is still desired and tears
//!   it down otherwise.
//! - Mounts stacked on one volume path (a crash between a mount and its
//!   bookkeeping, repeated) are unmounted down to one, by the same
//!   [`unstack`] that removes foreign mounts the tracer finds.
//! - Device mounts (CSI staging) are rebuilt from the plugins' global
//!   directories: a completed one the table confirms is recorded as mounted
//!   (never mounted again, and unmounted only after the last pod using it —
//!   counted from the pod volume directories — is torn down); any other,
//!   or a volume with pod mounts but no device record, is *uncertain*, and
//!   the pods' mounts of it with it (the actual state sees to that), so the
//!   kubelet's order follows: the device mounted again (NodeStageVolume),
//!   then each pod's mount set up again (NodePublishVolume).
//! - The SELinux label a volume was mounted with (`context=`) is recovered
//!   from its record (CSI: `vol_data.json`'s `seLinuxMountContext`, as the
//!   kubelet's `ConstructVolumeSpec` reads it): a pod that needs another
//!   label waits until the device is unmounted and mounted again with it.
//!   A record without one (an older volmgr's) compares with nothing.
//! - Every pod directory found is queued for the orphan check, which removes
//!   it once the sources are populated if its pod is not desired and nothing
//!   is mounted in it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use crate::cache::actual_state_of_world::{DeviceMountState, MountedPod, VolumeMountState};
use crate::cache::world::World;
use crate::operationexecutor::unstack::unstack;
use crate::plugins::{VolumeError, VolumePluginMgr};
use crate::sys::mount_table::MountTable;
use crate::sys::root_dir::{RelPath, RootDir};
use crate::sys::Mounter;
use crate::volume::PodUid;

/// What reconstruction found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReconstructionReport {
    /// Pod directories seen.
    pub pods: usize,
    /// Volumes recorded as mounted.
    pub mounted: usize,
    /// Volumes recorded as uncertain.
    pub uncertain: usize,
    /// Extra stacked mounts removed.
    pub unstacked: usize,
    /// Device mounts (CSI stagings) found, complete or not.
    pub devices: usize,
    /// Problems that did not stop reconstruction.
    pub errors: Vec<String>,
    /// Pod volumes whose reconstruction was tried (the kubelet's
    /// `reconstruct_volume_operations_total`).
    pub volumes_tried: u64,
    /// Of those, the ones that could not be read (its
    /// `reconstruct_volume_operations_errors_total`).
    pub volumes_failed: u64,
}

/// Rebuilds the actual state into `world`.
pub fn reconstruct(
    root: &RootDir,
    plugins: &VolumePluginMgr,
    mounter: &dyn Mounter,
    world: &World,
) -> Result<ReconstructionReport, VolumeError> {
    let mut report = ReconstructionReport::default();
    let mut table = MountTable::new(mounter.mount_table()?);
    report.unstacked = unstack_crash_leftovers(root, mounter, &mut table, &mut report.errors);
    if report.unstacked > 0 {
        table = MountTable::new(mounter.mount_table()?);
    }
    scan(root, plugins, &table, world, &mut report)?;
    Ok(report)
}

/// The read-only half of [`reconstruct`] (observe mode): the same scan of
/// the pod volume directories, the plugins' global directories and the
/// mount table into `world`, without removing stacked mounts (they are
/// recorded as found). Nothing under ROOT is changed.
pub fn reconstruct_read_only(
    root: &RootDir,
    plugins: &VolumePluginMgr,
    table: &MountTable,
    world: &World,
) -> Result<ReconstructionReport, VolumeError> {
    let mut report = ReconstructionReport::default();
    scan(root, plugins, table, world, &mut report)?;
    Ok(report)
}

/// Records every pod volume, device mount and subPath found on disk and in
/// `table` into `world`'s actual state (reads only).
fn scan(
    root: &RootDir,
    plugins: &VolumePluginMgr,
    table: &MountTable,
    world: &World,
    report: &mut ReconstructionReport,
) -> Result<(), VolumeError> {
    let pods_rel = RelPath::new(["pods"])?;
    let all_plugins = plugins.all();
    let found = Found { root, table, world };
    let plugin_dirs: Vec<_> = plugins
        .all()
        .into_iter()
        .filter_map(|(n, p)| p.volumes_dir_name().map(|d| (d, n, p)))
        .collect();
    for name in root.read_dir(&pods_rel)? {
        let Some(uid) = name.to_str().and_then(|n| PodUid::new(n).ok()) else {
            report
                .errors
                .push(format!("ignoring {:?} under pods/: not a pod UID", name));
            continue;
        };
        report.pods += 1;
        for (dir, plugin_name, plugin) in &plugin_dirs {
            let rel = RelPath::new(["pods", uid.as_str(), "volumes", dir.as_str()])?;
            let vols = match root.read_dir(&rel) {
                Ok(v) => v,
                Err(e) => {
                    report.errors.push(format!("pod {uid}: {e}"));
                    continue;
                }
            };
            for vol in vols {
                let Some(vol) = vol.to_str() else { continue };
                report.volumes_tried += 1;
                match plugin.reconstruct(&uid, vol, table) {
                    Ok(Some(rec)) => {
                        record(&found, plugin_name, plugin.as_ref(), &uid, rec, report)
                    }
                    Ok(None) => {}
                    Err(e) => {
                        report.volumes_failed += 1;
                        report.errors.push(format!("pod {uid} volume {vol}: {e}"))
                    }
                }
            }
        }
        for (plugin_name, plugin) in &all_plugins {
            match plugin.reconstruct_block_volumes(&uid, table) {
                Ok(recs) => {
                    for rec in recs {
                        report.volumes_tried += 1;
                        record(&found, plugin_name, plugin.as_ref(), &uid, rec, report);
                    }
                }
                Err(e) => {
                    report.volumes_failed += 1;
                    report.volumes_tried += 1;
                    report.errors.push(format!("pod {uid} block volumes: {e}"))
                }
            }
        }
        world.mark_pod_dirty(uid);
    }
    reconstruct_devices(plugins, table, world, report);
    reconstruct_sub_paths(&root.abs(&pods_rel), table, world);
    world.set_reconstructed();
    Ok(())
}

/// Records a pod's volume found on disk: mounted if its set-up completed
/// and the mount table confirms it (its subPath binds on disk included),
/// uncertain otherwise.
fn record(
    ctx: &Found<'_>,
    plugin_name: &Arc<str>,
    plugin: &dyn crate::plugins::VolumePlugin,
    uid: &PodUid,
    rec: crate::plugins::ReconstructedVolume,
    report: &mut ReconstructionReport,
) {
    let world = ctx.world;
    let complete = rec.complete && sub_paths_mounted(ctx.root, ctx.table, uid, &rec.spec.name);
    let state = if complete {
        report.mounted += 1;
        VolumeMountState::Mounted
    } else {
        report.uncertain += 1;
        VolumeMountState::Uncertain
    };
    let spec = Arc::new(rec.spec);
    let volume_name = plugin.unique_volume_name(uid, &spec);
    let (mount_id, selinux_relabel) = match state {
        VolumeMountState::Mounted => (
            plugin.mount_id(uid, &spec),
            plugin.selinux_relabel(&spec, &rec.path),
        ),
        VolumeMountState::Uncertain => (None, spec.supports_selinux_relabel()),
    };
    // The SELinux label it was mounted with, when its record tells (CSI's
    // `vol_data.json`): a pod that needs another waits for it to go.
    let label = crate::cache::selinux::mount_label(&spec).map(Arc::<str>::from);
    let mut asw = world.asw_mut();
    asw.mark_volume_as_attached(&volume_name, Arc::clone(plugin_name));
    asw.mark_volume_as_mounted(
        &volume_name,
        uid,
        MountedPod {
            spec,
            path: rec.path,
            state,
            mount_id,
            selinux_relabel,
        },
    );
    if let Some(l) = label {
        asw.add_pod_selinux_mount_context(&volume_name, Some(&l));
    }
}

/// Records the subPath bind mounts found in the mount table
/// (`pods/<uid>/volume-subpaths/<volume>/<container>/<index>`) as prepared
/// on the volumes just recorded: the containers that use them run, and a
/// restart must list them as before. One pass over the table.
fn reconstruct_sub_paths(pods_dir: &std::path::Path, table: &MountTable, world: &World) {
    let mut asw = world.asw_mut();
    for m in table.entries() {
        let Ok(rel) = m.mount_point.strip_prefix(pods_dir) else {
            continue;
        };
        let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
        let [uid, crate::plugins::subpath::SUBPATHS_DIR, outer, container, index] = parts[..]
        else {
            continue;
        };
        let (Ok(index), Ok(uid)) = (index.parse::<usize>(), PodUid::new(uid)) else {
            continue;
        };
        let volume = asw
            .mounts_of_pod(uid.as_str())
            .find(|(_, _, mp)| mp.outer_volume_spec_name() == outer)
            .map(|(name, _, _)| name.clone());
        if let Some(volume) = volume {
            asw.mark_sub_paths_prepared(&volume, &uid, [(container, index)]);
        }
    }
}

/// What [`record`] reads besides the volume: ROOT, the mount table, and
/// the world it records into.
struct Found<'a> {
    root: &'a RootDir,
    table: &'a MountTable,
    world: &'a World,
}

/// Whether every subPath bind of `pod`'s volume `volume` found on disk
/// (`pods/<uid>/volume-subpaths/<volume>/<container>/<index>`) is mounted:
/// one that is not (lost to a reboot) makes the volume uncertain, so its
/// set-up, subPaths included, runs again.
fn sub_paths_mounted(root: &RootDir, table: &MountTable, pod: &PodUid, volume: &str) -> bool {
    let Ok(dir) = RelPath::new([
        "pods",
        pod.as_str(),
        crate::plugins::subpath::SUBPATHS_DIR,
        volume,
    ]) else {
        return false;
    };
    let Ok(containers) = root.read_dir(&dir) else {
        return false;
    };
    for c in containers {
        let Ok(cdir) = dir.join(&c) else { return false };
        let Ok(entries) = root.read_dir(&cdir) else {
            return false;
        };
        for e in entries {
            match cdir.join(&e) {
                Ok(rel) if table.is_mount_point(&root.abs(&rel)) => {}
                _ => return false,
            }
        }
    }
    true
}

/// Records the device mounts the plugins find, and marks volumes that have
/// pod mounts and a device phase but no device record as uncertain.
fn reconstruct_devices(
    plugins: &VolumePluginMgr,
    table: &MountTable,
    world: &World,
    report: &mut ReconstructionReport,
) {
    for (plugin_name, plugin) in plugins.all() {
        let Some(dm) = plugin.device_mountable() else {
            continue;
        };
        let found = match dm.reconstruct_devices(table, &mut report.errors) {
            Ok(f) => f,
            Err(e) => {
                report.errors.push(format!("{plugin_name} devices: {e}"));
                Vec::new()
            }
        };
        // The ids of the confirmed device mounts, before the lock (syscalls).
        let found: Vec<_> = found
            .into_iter()
            .map(|d| {
                let id = d.complete.then(|| dm.device_mount_id(&d.spec)).flatten();
                (d, id)
            })
            .collect();
        let mut asw = world.asw_mut();
        for (d, mount_id) in found {
            report.devices += 1;
            // Not confirmed: uncertain, and so are the pods' mounts made
            // from it (the actual state sees to that).
            let state = if d.complete {
                DeviceMountState::Mounted
            } else {
                DeviceMountState::Uncertain
            };
            asw.mark_volume_as_attached(&d.volume_name, Arc::clone(&plugin_name));
            asw.mark_device(
                &d.volume_name,
                state,
                Arc::new(d.spec),
                Some(d.device_mount_path),
            );
            asw.set_device_mount_id(&d.volume_name, mount_id);
            asw.set_volume_size(&d.volume_name, d.size_bytes);
            world.mark_dirty([d.volume_name]);
        }
        // Pod mounts of a device-mountable volume without a device record:
        // the device may be mounted.
        let orphans: Vec<_> = asw
            .volumes()
            .filter(|(_, v)| {
                *v.plugin_name == *plugin_name
                    && v.device_spec.is_none()
                    && v.pods
                        .values()
                        .next()
                        .is_some_and(|m| dm.can_device_mount(&m.spec))
            })
            .filter_map(|(n, v)| {
                let spec = Arc::clone(&v.pods.values().next()?.spec);
                let path = dm.device_mount_path(&spec).ok();
                Some((n.clone(), spec, path))
            })
            .collect();
        for (name, spec, path) in orphans {
            asw.mark_device(&name, DeviceMountState::Uncertain, spec, path);
        }
    }
}

/// Unmounts all but the bottom mount on every stacked mount point under
/// `ROOT/pods` (with the one [`unstack`] implementation). Returns how many
/// were removed.
fn unstack_crash_leftovers(
    root: &RootDir,
    mounter: &dyn Mounter,
    table: &mut MountTable,
    errors: &mut Vec<String>,
) -> usize {
    let pods = root.path().join("pods");
    let stacked: BTreeSet<PathBuf> = table
        .below(&pods)
        .filter(|m| table.count(&m.mount_point) > 1)
        .map(|m| m.mount_point.clone())
        .collect();
    let mut removed = 0;
    for path in stacked {
        let u = unstack(root, mounter, &path, table, |t| t.count(&path) > 1);
        removed += u.removed;
        if let Err(e) = u.result {
            errors.push(format!("unstacking {}: {e}", path.display()));
        }
        tracing::warn!(path = %path.display(), "removed stacked mounts left by a crash");
    }
    removed
}
