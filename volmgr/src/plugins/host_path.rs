//! `hostPath`: a path on the node, checked (and for the `...OrCreate` types
//! created) with Kubernetes' `type` semantics. As in the kubelet, nothing is
//! mounted: the container runtime binds the host path itself, so the volume's
//! path is the host path.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::sys::mount_table::MountTableView;
use crate::sys::SyscallError;
use crate::volume::{HostPathType, VolumeSource, VolumeSpec};

use super::{BlockingPool, MountRequest, UnmountRequest, VolumeError, VolumePlugin};

/// The plugin's name.
pub const PLUGIN_NAME: &str = "kubernetes.io/host-path";

/// The hostPath plugin.
pub struct HostPathPlugin {
    pool: Arc<BlockingPool>,
}

impl HostPathPlugin {
    /// A new plugin.
    pub fn new(pool: Arc<BlockingPool>) -> Self {
        Self { pool }
    }
}

/// Creates what the `...OrCreate` types ask for, then checks the type.
pub fn check_type(path: &Path, kind: HostPathType) -> Result<(), VolumeError> {
    let fail = |what: &str| {
        Err(VolumeError::InvalidSpec(format!(
            "hostPath type check failed: {} is not {what}",
            path.display()
        )))
    };
    let missing = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(SyscallError::io("stat", path, e).into()),
        Ok(_) => false,
    };
    match kind {
        HostPathType::Unset => return Ok(()),
        HostPathType::DirectoryOrCreate if missing => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(path)
                .map_err(|e| {
                    VolumeError::InvalidSpec(format!(
                        "hostPath type check failed: cannot create directory {}: {e}",
                        path.display()
                    ))
                })?;
        }
        HostPathType::FileOrCreate if missing => {
            // Like Kubernetes, the parent directory is not created.
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(path)
                .map_err(|e| {
                    VolumeError::InvalidSpec(format!(
                        "hostPath type check failed: cannot create file {} (its parent directory is not created): {e}",
                        path.display()
                    ))
                })?;
        }
        _ if missing => {
            return Err(VolumeError::InvalidSpec(format!(
                "hostPath type check failed: {} does not exist (type {})",
                path.display(),
                kind.as_str()
            )))
        }
        _ => {}
    }
    let ft = std::fs::metadata(path)
        .map_err(|e| SyscallError::io("stat", path, e))?
        .file_type();
    match kind {
        HostPathType::Unset => Ok(()),
        HostPathType::DirectoryOrCreate | HostPathType::Directory if !ft.is_dir() => {
            fail("a directory")
        }
        HostPathType::FileOrCreate | HostPathType::File if !ft.is_file() => fail("a file"),
        HostPathType::Socket if !ft.is_socket() => fail("a socket file"),
        HostPathType::CharDevice if !ft.is_char_device() => fail("a character device"),
        HostPathType::BlockDevice if !ft.is_block_device() => fail("a block device"),
        _ => Ok(()),
    }
}

#[async_trait::async_trait]
impl VolumePlugin for HostPathPlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn can_support(&self, source: &VolumeSource) -> bool {
        matches!(source, VolumeSource::HostPath { .. })
    }

    async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        let VolumeSource::HostPath { path, kind } = req.spec.source.clone() else {
            return Err(VolumeError::InvalidSpec("not a hostPath volume".into()));
        };
        self.pool
            .run(move || {
                check_type(&path, kind)?;
                Ok(path)
            })
            .await
    }

    async fn tear_down(&self, _req: UnmountRequest) -> Result<(), VolumeError> {
        Ok(())
    }

    fn verify_reads_mount_table(&self, _spec: &VolumeSpec) -> bool {
        false
    }

    fn verify(&self, spec: &VolumeSpec, path: &Path, _table: MountTableView<'_>) -> bool {
        match &spec.source {
            VolumeSource::HostPath {
                kind: HostPathType::Unset,
                ..
            } => true,
            _ => path.symlink_metadata().is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_semantics() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        let f = t.path().join("f");
        check_type(&d, HostPathType::DirectoryOrCreate).unwrap();
        assert!(d.is_dir());
        check_type(&d, HostPathType::Directory).unwrap();
        assert!(check_type(&d, HostPathType::File).is_err());
        check_type(&f, HostPathType::FileOrCreate).unwrap();
        assert!(f.is_file());
        check_type(&f, HostPathType::File).unwrap();
        assert!(check_type(&f, HostPathType::Directory).is_err());
        assert!(check_type(&f, HostPathType::DirectoryOrCreate).is_err());
        assert!(check_type(&d, HostPathType::FileOrCreate).is_err());
        assert!(check_type(&t.path().join("nope"), HostPathType::Directory).is_err());
        assert!(check_type(&t.path().join("no/parent"), HostPathType::FileOrCreate).is_err());
        check_type(&t.path().join("nope"), HostPathType::Unset).unwrap();
        assert!(check_type(&f, HostPathType::Socket).is_err());
        assert!(check_type(&f, HostPathType::BlockDevice).is_err());
        check_type(Path::new("/dev/null"), HostPathType::CharDevice).unwrap();
        assert!(check_type(Path::new("/dev/null"), HostPathType::BlockDevice).is_err());
        let sock = t.path().join("s");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        check_type(&sock, HostPathType::Socket).unwrap();
    }
}
