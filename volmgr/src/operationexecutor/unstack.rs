//! The one implementation of unstacking: unmounting, from the top, the mounts
//! stacked on a path beyond those that belong there. Start-up reconstruction
//! uses it for the repeats a crash left on pod volume paths; the
//! `RemoveForeignMounts` operation for what someone else mounted over a
//! volume. Only mounts *on* the path are touched: mounts below it (inside the
//! volume) are the pod's business.

use std::path::Path;

use crate::plugins::VolumeError;
use crate::sys::mount_table::MountTable;
use crate::sys::root_dir::{RelPath, RootDir};
use crate::sys::Mounter;

/// What [`unstack`] did.
#[derive(Debug)]
pub struct Unstacked {
    /// Mounts unmounted.
    pub removed: usize,
    /// Why it stopped early, if it did.
    pub result: Result<(), VolumeError>,
}

/// Unmounts the top mount on `path` (under `root`) while `excess` says more
/// is stacked there than belongs, keeping `table` true as it goes (each
/// unmount removes the top entry). Stops at the first error, or when nothing
/// is left on `path`.
pub fn unstack(
    root: &RootDir,
    mounter: &dyn Mounter,
    path: &Path,
    table: &mut MountTable,
    excess: impl Fn(&MountTable) -> bool,
) -> Unstacked {
    let mut removed = 0;
    let result = unstack_counting(root, mounter, path, table, excess, &mut removed);
    Unstacked { removed, result }
}

fn unstack_counting(
    root: &RootDir,
    mounter: &dyn Mounter,
    path: &Path,
    table: &mut MountTable,
    excess: impl Fn(&MountTable) -> bool,
    removed: &mut usize,
) -> Result<(), VolumeError> {
    if !excess(table) {
        return Ok(());
    }
    let rel = path
        .strip_prefix(root.path())
        .map_err(|_| VolumeError::Internal(format!("{} is not under ROOT", path.display())))?;
    let rel = RelPath::new(rel.iter())?;
    let (parent, name) = rel
        .split_last()
        .ok_or_else(|| VolumeError::Internal("empty volume path".into()))?;
    while excess(table) && table.count(path) > 0 {
        let parent_dir = root.open_dir(&parent)?;
        mounter.unmount(&parent_dir, name)?;
        table.remove_top(path);
        *removed += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::fake::{Call, FakeMounter};
    use crate::sys::{MountTableReader, MsFlags};

    #[test]
    fn unmounts_from_the_top_while_more_than_what_belongs_is_stacked() {
        let dir = tempfile::tempdir().unwrap();
        let root = RootDir::open(dir.path()).unwrap();
        let fake = FakeMounter::default();
        let rel = RelPath::new(["pods", "p", "volumes", "v"]).unwrap();
        let target = root.mkdir_all(&rel, 0o750).unwrap();
        for source in ["own", "first", "second"] {
            fake.mount(source, &target, "tmpfs", MsFlags::empty(), None)
                .unwrap();
        }
        let path = root.abs(&rel);
        let mut table = MountTable::new(fake.mount_table().unwrap());
        let u = unstack(&root, &fake, &path, &mut table, |t| t.count(&path) > 1);
        u.result.unwrap();
        assert_eq!(u.removed, 2);
        // The snapshot was kept true, and matches the fake's table.
        assert_eq!(table.count(&path), 1);
        let fresh = MountTable::new(fake.mount_table().unwrap());
        assert_eq!(fresh.count(&path), 1);
        let unmounts = fake
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::Unmount(_)))
            .count();
        assert_eq!(unmounts, 2);
        // Nothing in excess: nothing unmounted.
        let u = unstack(&root, &fake, &path, &mut table, |t| t.count(&path) > 1);
        assert_eq!(u.removed, 0);
        u.result.unwrap();
    }
}
