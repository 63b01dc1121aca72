//! Why a path under the root could not be used.

use std::path::PathBuf;

use crate::sys::SyscallError;

/// Why a path under the root could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// A component was empty, `.`, `..`, absolute, or held `/` or NUL.
    #[error("invalid path component {component:?} in {path}")]
    InvalidComponent {
        /// The whole relative path.
        path: PathBuf,
        /// The offending component.
        component: String,
    },
    /// Resolution met a symlink or tried to leave the root.
    #[error("refusing to follow a symlink or leave the root at {path}")]
    Escape {
        /// The absolute path.
        path: PathBuf,
    },
    /// A directory on the way to `path` is a mount point volmgr did not
    /// make (something mounted under ROOT, on a pod's or a plugin's
    /// directory): nothing is looked up, created or deleted through it.
    #[error("{mount} is a foreign mount point on the way to {path}; refusing to cross it")]
    ForeignMount {
        /// The mount point found (`path` itself when it could not be told).
        mount: PathBuf,
        /// The path that was to be used.
        path: PathBuf,
    },
    /// A directory to delete still has a mount inside it.
    #[error("{path} is or contains a mount point; refusing to delete across it")]
    MountInside {
        /// The mount point found.
        path: PathBuf,
    },
    /// Some other failed system call.
    #[error(transparent)]
    Syscall(#[from] SyscallError),
}

impl PathError {
    /// Whether the error means "does not exist".
    pub fn is_not_found(&self) -> bool {
        matches!(self, PathError::Syscall(e) if e.errno() == Some(libc::ENOENT))
    }
}
