//! What counts as a foreign mount on a volume's path: a mount the volume's
//! plugin did not make. Shared by the tracer's check (which finds them) and
//! the operation that removes them.

use std::path::Path;

use super::VolumePlugin;
use crate::sys::mount_table::{MountTable, MountTableView};
use crate::volume::{CsiVolumeMode, StorageMedium, VolumeSource, VolumeSpec};

/// How many mounts the plugin itself puts on a volume's path: none for a
/// disk-backed emptyDir (a plain directory), an image volume (no path) or a
/// block-mode local volume (a symlink), one otherwise.
pub fn expected_mounts(spec: &VolumeSpec) -> usize {
    match &spec.source {
        VolumeSource::EmptyDir {
            medium: StorageMedium::Default,
            ..
        }
        | VolumeSource::Image { .. } => 0,
        VolumeSource::Local(l) if l.volume_mode == CsiVolumeMode::Block => 0,
        _ => 1,
    }
}

/// Whether a volume's path carries mounts its plugin did not make: more than
/// the plugin's own, or as many but not the volume (its tmpfs was unmounted
/// and something else mounted in its place).
pub fn is_foreign(
    plugin: &dyn VolumePlugin,
    spec: &VolumeSpec,
    path: &Path,
    table: &MountTable,
) -> bool {
    let (count, expected) = (table.count(path), expected_mounts(spec));
    count > expected || (count > 0 && !plugin.verify(spec, path, MountTableView::Read(table)))
}
