//! Observe mode's state directory (`--state-dir`: the status socket and the
//! lock), checked before anything is created in or for it.
//!
//! - It must be neither ROOT, nor inside ROOT, nor contain ROOT (`ROOT/..`,
//!   a symlink to a parent of ROOT, `/`): the agent's Landlock rule allows
//!   writes beneath it, so a state directory containing ROOT would let the
//!   agent write under ROOT. Symlinks are resolved on the part that exists,
//!   and the check runs before any directory is made.
//! - It must be the agent's own: owned by its user and writable by no one
//!   else, or another user could move the status socket away and serve one
//!   of their own. A directory of another user, or a shared one (sticky and
//!   writable by others, as `/tmp`), is refused; one of the agent's user
//!   that others may write to (a Kubernetes `emptyDir` is 0777) is made
//!   0700 first.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// Why a state directory is refused.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// It is ROOT, or inside ROOT.
    #[error("--state-dir {state} is ROOT or inside ROOT {root}: it must be outside ROOT in observe mode")]
    InsideRoot {
        /// The state directory (symlinks resolved).
        state: PathBuf,
        /// ROOT (symlinks resolved).
        root: PathBuf,
    },
    /// It contains ROOT.
    #[error("--state-dir {state} contains ROOT {root}: the agent may write beneath its state directory, so it must be outside ROOT in observe mode")]
    ContainsRoot {
        /// The state directory (symlinks resolved).
        state: PathBuf,
        /// ROOT (symlinks resolved).
        root: PathBuf,
    },
    /// The part that does not exist yet climbs with `..`.
    #[error("--state-dir {0}: `..` after a directory that does not exist")]
    DotDot(PathBuf),
    /// Owned by another user.
    #[error("--state-dir {path} is owned by uid {owner}, not by this agent's uid {me}: another user could replace its status socket")]
    NotOwned {
        /// The state directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The agent's effective uid.
        me: u32,
    },
    /// A shared directory (sticky, writable by others).
    #[error("--state-dir {path} is a shared directory (mode {mode:o}): give the agent a directory of its own")]
    Shared {
        /// The state directory.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// Not a directory.
    #[error("--state-dir {0} is not a directory")]
    NotADirectory(PathBuf),
    /// A system call failed.
    #[error("--state-dir {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StateDirError {
    let what = what.into();
    move |source| StateDirError::Io { what, source }
}

/// Checks `state_dir` against ROOT (`root`, symlinks resolved), creates it
/// (mode 0700) if missing, and makes sure it is the agent's own; returns
/// it with symlinks resolved. Nothing is created when it is refused.
pub fn prepare(root: &Path, state_dir: &Path) -> Result<PathBuf, StateDirError> {
    let planned = resolve_planned(state_dir)?;
    check_against_root(&planned, root)?;
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&planned)
            .map_err(io_err(format!("creating {}", planned.display())))?;
    }
    // Again on what was made: a symlink may have changed meanwhile.
    let state = planned
        .canonicalize()
        .map_err(io_err(planned.display().to_string()))?;
    check_against_root(&state, root)?;
    make_private(&state)?;
    Ok(state)
}

/// `path` absolute, with symlinks resolved on its longest existing prefix
/// and the rest appended as it is (no `..` there).
fn resolve_planned(path: &Path) -> Result<PathBuf, StateDirError> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(io_err("the current directory"))?
            .join(path)
    };
    let mut rest: Vec<OsString> = Vec::new();
    let mut prefix = abs.as_path();
    loop {
        match prefix.canonicalize() {
            Ok(mut base) => {
                for c in rest.iter().rev() {
                    base.push(c);
                }
                return Ok(base);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(prefix.display().to_string())(e)),
        }
        match prefix.components().next_back() {
            Some(Component::Normal(c)) => rest.push(c.to_os_string()),
            Some(Component::CurDir) => {}
            _ => return Err(StateDirError::DotDot(abs.clone())),
        }
        prefix = match prefix.parent() {
            Some(p) => p,
            None => return Err(StateDirError::DotDot(abs.clone())),
        };
    }
}

/// Refuses `state` when it is ROOT, inside ROOT, or contains ROOT (both
/// with symlinks resolved).
fn check_against_root(state: &Path, root: &Path) -> Result<(), StateDirError> {
    let paths = || (state.to_path_buf(), root.to_path_buf());
    if state.starts_with(root) {
        let (state, root) = paths();
        return Err(StateDirError::InsideRoot { state, root });
    }
    if root.starts_with(state) {
        let (state, root) = paths();
        return Err(StateDirError::ContainsRoot { state, root });
    }
    Ok(())
}

/// Refuses a state directory of another user or a shared one; one of the
/// agent's user that others may write to is made 0700.
fn make_private(state: &Path) -> Result<(), StateDirError> {
    let c = std::ffi::CString::new(state.as_os_str().as_encoded_bytes())
        .map_err(|_| StateDirError::NotADirectory(state.to_path_buf()))?;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ENOTDIR) | Some(libc::ELOOP) => {
                StateDirError::NotADirectory(state.to_path_buf())
            }
            _ => io_err(state.display().to_string())(e),
        });
    }
    // SAFETY: a descriptor just opened and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st =
        nix::sys::stat::fstat(&fd).map_err(|e| io_err(state.display().to_string())(e.into()))?;
    let me = nix::unistd::geteuid().as_raw();
    let path = state.to_path_buf();
    if st.st_uid != me {
        let owner = st.st_uid;
        return Err(StateDirError::NotOwned { path, owner, me });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 == 0 {
        return Ok(());
    }
    if mode & libc::S_ISVTX != 0 {
        return Err(StateDirError::Shared { path, mode });
    }
    // SAFETY: fchmod on a descriptor we own.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o700) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(io_err(format!("making {} private", state.display()))(e));
    }
    tracing::warn!(path = %state.display(), mode = format!("{mode:o}"), "--state-dir was writable by others: made 0700");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_part_that_does_not_exist_is_appended_without_dot_dot() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        let p = resolve_planned(&t.path().join("a/./b")).unwrap();
        assert_eq!(p, base.join("a/b"));
        assert!(!base.join("a").exists());
        let p = resolve_planned(&t.path().join("..")).unwrap();
        assert_eq!(p, base.parent().unwrap());
        assert!(matches!(
            resolve_planned(&t.path().join("new/../..")),
            Err(StateDirError::DotDot(_))
        ));
    }

    #[test]
    fn root_inside_or_around_the_state_directory_is_refused() {
        let root = Path::new("/var/lib/kubelet");
        for inside in ["/var/lib/kubelet", "/var/lib/kubelet/state"] {
            assert!(matches!(
                check_against_root(Path::new(inside), root),
                Err(StateDirError::InsideRoot { .. })
            ));
        }
        for around in ["/", "/var", "/var/lib"] {
            assert!(matches!(
                check_against_root(Path::new(around), root),
                Err(StateDirError::ContainsRoot { .. })
            ));
        }
        for fine in ["/run/volmgr", "/var/lib/kubelet-state"] {
            check_against_root(Path::new(fine), root).unwrap();
        }
    }
}
