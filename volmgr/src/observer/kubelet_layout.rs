//! What the stock kubelet sets up for a volume, where reconstruction alone
//! cannot tell: volumes it sets up outside the pod's directory (`hostPath`,
//! bound by the container runtime; `image`, mounted by the runtime), the
//! volumes it puts on a tmpfs of their own (an `emptyDir` of medium
//! `Memory`, `secret`, `projected`), and its mark that a volume was set up
//! (the `ready` file of the emptyDir plugin's metadata directory,
//! `pods/<uid>/plugins/kubernetes.io~empty-dir/<name>/ready`, or
//! `wrapped_<name>` for the volumes it wraps in one). Reads only.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use crate::sys::mount_table::MountTable;
use crate::sys::root_dir::{RelPath, RootDir};
use crate::volume::{HostPathType, PodUid, StorageMedium, VolumeSource, VolumeSpec};

/// What the kubelet does with a volume it sets up outside the pod's
/// directory: `None` for a volume it sets up inside it; `Some(None)` when
/// it has nothing to fail on; `Some(Some(why))` when it fails the volume
/// (a `hostPath` whose type check fails).
pub(super) fn outside_pod_dir(spec: &VolumeSpec) -> Option<Option<String>> {
    match &spec.source {
        VolumeSource::HostPath { path, kind } => Some(host_path_problem(path, *kind)),
        VolumeSource::Image { .. } => Some(None),
        _ => None,
    }
}

/// Why the kubelet's type check of a `hostPath` volume fails, judged
/// without creating anything (what the `...OrCreate` types would create is
/// fine when its parent directory exists); `None` when it passes or cannot
/// be judged.
pub(super) fn host_path_problem(path: &Path, kind: HostPathType) -> Option<String> {
    let md = match std::fs::metadata(path) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match kind {
                HostPathType::Unset | HostPathType::DirectoryOrCreate => None,
                HostPathType::FileOrCreate if path.parent().is_some_and(Path::is_dir) => None,
                _ => Some(format!(
                    "hostPath type check fails: {} does not exist (type {})",
                    path.display(),
                    kind.as_str()
                )),
            };
        }
        Err(_) => return None,
    };
    let ft = md.file_type();
    let ok = match kind {
        HostPathType::Unset => true,
        HostPathType::DirectoryOrCreate | HostPathType::Directory => ft.is_dir(),
        HostPathType::FileOrCreate | HostPathType::File => ft.is_file(),
        HostPathType::Socket => ft.is_socket(),
        HostPathType::CharDevice => ft.is_char_device(),
        HostPathType::BlockDevice => ft.is_block_device(),
    };
    (!ok).then(|| {
        format!(
            "hostPath type check fails: {} is not of type {}",
            path.display(),
            kind.as_str()
        )
    })
}

/// Whether the kubelet sets the volume up on a tmpfs of its own: an
/// emptyDir of medium `Memory`, a secret or a projected volume.
pub(super) fn on_tmpfs(spec: &VolumeSpec) -> bool {
    match &spec.source {
        VolumeSource::EmptyDir { medium, .. } => *medium == StorageMedium::Memory,
        VolumeSource::Payload(p) => p.kind.on_tmpfs(),
        _ => false,
    }
}

/// Whether a tmpfs is mounted on `path` (the topmost mount there).
pub(super) fn tmpfs_at(table: &MountTable, path: &Path) -> bool {
    table.top(path).is_some_and(|m| m.fstype == "tmpfs")
}

/// The kubelet's mark that it set pod `uid`'s volume `name` up: the
/// `ready` file of the emptyDir plugin's metadata directory, for the
/// volume itself or for the emptyDir it wraps it in.
pub(super) fn ready_mark(root: &RootDir, uid: &PodUid, name: &str) -> Option<String> {
    let plugin = "kubernetes.io~empty-dir";
    [name.to_string(), format!("wrapped_{name}")]
        .into_iter()
        .find_map(|dir| {
            let rel = RelPath::new([
                "pods",
                uid.as_str(),
                "plugins",
                plugin,
                dir.as_str(),
                "ready",
            ])
            .ok()?;
            root.exists(&rel)
                .ok()
                .filter(|e| *e)
                .map(|_| root.abs(&rel).display().to_string())
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn host_path_type_checks_create_nothing() {
        let t = tempfile::tempdir().unwrap();
        let missing = t.path().join("missing");
        assert_eq!(
            host_path_problem(&missing, HostPathType::DirectoryOrCreate),
            None
        );
        assert_eq!(
            host_path_problem(&missing, HostPathType::FileOrCreate),
            None
        );
        assert_eq!(host_path_problem(&missing, HostPathType::Unset), None);
        assert!(!missing.exists(), "nothing created");
        let why = host_path_problem(&missing, HostPathType::Directory).unwrap();
        assert!(why.contains("does not exist"), "{why}");
        assert!(host_path_problem(&missing.join("f"), HostPathType::FileOrCreate).is_some());
        assert_eq!(host_path_problem(t.path(), HostPathType::Directory), None);
        assert!(host_path_problem(t.path(), HostPathType::File).is_some());
    }
}
