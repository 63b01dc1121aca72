//! Start-up reconstruction (the kubelet's `reconstruct.go`): before the first
//! reconcile, rebuild the actual state from the mount table and the pod volume
//! directories, so that a restart neither remounts what is mounted nor leaks
//! what a crash left half-done.
//!
//! - A volume directory whose set-up completed is recorded as mounted (adopted
//!   without a remount); one whose set-up did not complete is *uncertain*, so
//!   the reconciler finishes it if the pod is still desired and tears it down
//!   otherwise.
//! - Mounts stacked on one volume path (a crash between a mount and its
//!   bookkeeping, repeated) are unmounted down to one, by the same
//!   [`unstack`] that removes foreign mounts the tracer finds.
//! - Device mounts (CSI staging) are rebuilt from the plugins' global
//!   directories: a completed one is recorded as mounted (never mounted
//!   again, and unmounted only after the last pod using it — counted from
//!   the pod volume directories — is torn down); an incomplete one, or a
//!   volume with pod mounts but no device record, is *uncertain*.
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
}

/// Rebuilds the actual state into `world`.
pub fn reconstruct(
    root: &RootDir,
    plugins: &VolumePluginMgr,
    mounter: &dyn Mounter,
    world: &World,
) -> Result<ReconstructionReport, VolumeError> {
    let mut report = ReconstructionReport::default();
    let pods_rel = RelPath::new(["pods"])?;
    let mut table = MountTable::new(mounter.mount_table()?);
    report.unstacked = unstack_crash_leftovers(root, mounter, &mut table, &mut report.errors);
    if report.unstacked > 0 {
        table = MountTable::new(mounter.mount_table()?);
    }
    let all_plugins = plugins.all();
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
                match plugin.reconstruct(&uid, vol, &table) {
                    Ok(Some(rec)) => {
                        record(world, plugin_name, plugin.as_ref(), &uid, rec, &mut report)
                    }
                    Ok(None) => {}
                    Err(e) => report.errors.push(format!("pod {uid} volume {vol}: {e}")),
                }
            }
        }
        for (plugin_name, plugin) in &all_plugins {
            match plugin.reconstruct_block_volumes(&uid, &table) {
                Ok(found) => {
                    for rec in found {
                        record(world, plugin_name, plugin.as_ref(), &uid, rec, &mut report);
                    }
                }
                Err(e) => report.errors.push(format!("pod {uid} block volumes: {e}")),
            }
        }
        world.mark_pod_dirty(uid);
    }
    reconstruct_devices(plugins, &table, world, &mut report);
    world.set_reconstructed();
    Ok(report)
}

/// Records a pod's volume found on disk: mounted if its set-up completed,
/// uncertain otherwise.
fn record(
    world: &World,
    plugin_name: &Arc<str>,
    plugin: &dyn crate::plugins::VolumePlugin,
    uid: &PodUid,
    rec: crate::plugins::ReconstructedVolume,
    report: &mut ReconstructionReport,
) {
    let state = if rec.complete {
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
    let mut asw = world.asw_mut();
    asw.mark_volume_as_attached(&volume_name, Arc::clone(plugin_name));
    asw.mark_volume_as_mounted(
        &volume_name,
        uid,
        MountedPod {
            outer_volume_spec_name: spec.name.clone(),
            spec,
            path: rec.path,
            state,
            mount_id,
            selinux_relabel,
        },
    );
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
        let mut asw = world.asw_mut();
        for d in found {
            report.devices += 1;
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
