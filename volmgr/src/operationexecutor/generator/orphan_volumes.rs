//! The kubelet's `removeOrphanedPodVolumeDirs` (`cleanupOrphanedPodDirs`),
//! run before an orphaned pod's directory is removed: the volume
//! directories left under `pods/<uid>/volumes` — of plugins volmgr does not
//! know too (`kubernetes.io~foo/x`), which no tear-down of volmgr's ever
//! empties — are removed only when empty and not mounted (`rmdir`, which
//! neither follows a symlink nor removes a mount point or a file). A volume
//! directory that is mounted, not empty, a symlink or a file is kept, and
//! the pod directory with it: the clean-up fails naming it (shown in status
//! and retried with backoff), as the kubelet logs its `orphaned pod "<uid>"
//! found, but failed to rmdir() volume at path ...` and keeps the pod's
//! directory.

use std::ffi::OsStr;

use crate::plugins::VolumeError;
use crate::sys::root_dir::{EmptyDirRemoval, RelPath, RootDir};
use crate::sys::Target;
use crate::volume::PodUid;

/// Removes `pods/<uid>/volumes`, its plugin directories and their volume
/// directories, each only when empty and not mounted. Fails, naming what is
/// kept, when anything is left.
///
/// Each level is opened once and its entries removed relative to it: after
/// a usual tear-down (every volume directory already gone) that is an open
/// and a listing of `volumes`, one `rmdir` per plugin directory, and one
/// for `volumes`.
pub(crate) fn remove_orphaned_pod_volume_dirs(
    root: &RootDir,
    uid: &PodUid,
) -> Result<(), VolumeError> {
    let pod_rel = RelPath::new(["pods", uid.as_str()])?;
    let Some(pod_dir) = root.open_dir_if_there(&pod_rel)? else {
        return Ok(());
    };
    let volumes_name = OsStr::new("volumes");
    let Some(volumes) = root.open_subdir(&pod_dir, volumes_name)? else {
        return Ok(());
    };
    let mut kept: Vec<String> = Vec::new();
    for plugin in root.list(&volumes)? {
        // Usually already empty: one call, no open or listing.
        if rmdir(root, &volumes, &plugin, &mut Vec::new()) {
            continue;
        }
        match root.open_subdir(&volumes, &plugin) {
            Ok(Some(plugin_dir)) => {
                for vol in root.list(&plugin_dir)? {
                    rmdir(root, &plugin_dir, &vol, &mut kept);
                }
                rmdir(root, &volumes, &plugin, &mut kept);
            }
            Ok(None) => {}
            Err(e) => kept.push(format!("{:?}: {e}", volumes.path().join(&plugin))),
        }
    }
    drop(volumes);
    if kept.is_empty() {
        rmdir(root, &pod_dir, volumes_name, &mut kept);
    }
    if kept.is_empty() {
        return Ok(());
    }
    Err(VolumeError::Plugin {
        plugin: "volmgr".into(),
        message: format!(
            "orphaned pod \"{uid}\" found, but failed to rmdir() volume at path {}",
            kept.join(", ")
        ),
    })
}

/// `rmdir` of `parent/name`: whether it is gone; what cannot be removed
/// goes to `kept`.
fn rmdir(root: &RootDir, parent: &Target, name: &OsStr, kept: &mut Vec<String>) -> bool {
    let path = || parent.path().join(name);
    match root.remove_empty_dir_at(parent, name) {
        Ok(EmptyDirRemoval::Removed) => {
            tracing::info!(path = %path().display(), "cleaned up orphaned volume directory");
            true
        }
        Ok(EmptyDirRemoval::Kept) => {
            kept.push(format!("{:?}: not empty or mounted", path()));
            false
        }
        Err(e) => {
            kept.push(format!("{:?}: {e}", path()));
            false
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sys::test_child::{bind, run_in_child, unmount, Child};

    /// In a private mount namespace: a mounted volume directory of an
    /// unknown plugin (empty-looking: a bind of an empty directory) is kept
    /// and named, and so is the mount's source content; an empty unmounted
    /// sibling is removed; the `volumes` directory stays.
    #[test]
    fn a_mounted_unknown_volume_directory_is_kept_and_reported() {
        let name = crate::test_name!("a_mounted_unknown_volume_directory_is_kept_and_reported");
        run_in_child(name, Child::PrivateMounts, || {
            let t = tempfile::tempdir().unwrap();
            let src = t.path().join("src");
            std::fs::create_dir(&src).unwrap();
            let foo = t.path().join("root/pods/u1/volumes/kubernetes.io~foo");
            std::fs::create_dir_all(foo.join("mounted")).unwrap();
            std::fs::create_dir_all(foo.join("empty")).unwrap();
            bind(&src, &foo.join("mounted"));
            let root = RootDir::open(&t.path().join("root")).unwrap();
            let uid = PodUid::new("u1").unwrap();
            let e = remove_orphaned_pod_volume_dirs(&root, &uid).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("orphaned pod \"u1\" found, but failed to rmdir() volume at path")
                    && text.contains("kubernetes.io~foo/mounted\": not empty or mounted"),
                "{text}"
            );
            assert!(!foo.join("empty").exists());
            assert!(foo.join("mounted").exists());
            unmount(&foo.join("mounted"));
            // Unmounted and empty: it goes, and everything up to `volumes`.
            remove_orphaned_pod_volume_dirs(&root, &uid).unwrap();
            assert!(!t.path().join("root/pods/u1/volumes").exists());
            assert!(src.exists());
        });
    }
}
