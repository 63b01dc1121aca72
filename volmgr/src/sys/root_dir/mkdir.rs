//! Directories made under the root one level at a time, each `mkdirat`
//! relative to the directory just opened (the mount rule of [`super`]).

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::stat::{mkdirat, Mode};

use super::{MadeDir, PathError, RelPath, RootDir, DIR_PATH};
use crate::sys::beneath::Last;
use crate::sys::Target;
use crate::util::sync::MutexExt;

impl RootDir {
    /// Creates every missing directory of `rel` with `mode` (subject to
    /// umask), every one on ROOT's own mount, and returns the last one
    /// opened as a [`Target`].
    pub fn mkdir_all(&self, rel: &RelPath, mode: u32) -> Result<Target, PathError> {
        self.mkdir(rel, mode, Last::OnSameMount).map(|d| d.target)
    }

    /// Like [`mkdir_all`](Self::mkdir_all), but the last directory may
    /// already be the root of a mount (a volume set up before: an
    /// emptyDir's tmpfs, a CSI staging target). Tells whether it was
    /// created by this call (so it cannot be a mount point yet).
    pub fn mkdir_mount_target(
        &self,
        rel: &RelPath,
        mode: u32,
    ) -> Result<(Target, bool), PathError> {
        self.mkdir(rel, mode, Last::MayBeMountRoot)
            .map(|d| (d.target, d.created))
    }

    /// Like [`mkdir_mount_target`](Self::mkdir_mount_target), and keeps the
    /// parent open when the walk had it (a directory this call created):
    /// what is mounted on the directory later can then be looked at through
    /// the parent ([`Mounter::mount_id_in`](crate::sys::Mounter::mount_id_in))
    /// without walking the path again.
    pub fn mkdir_mount_target_in(&self, rel: &RelPath, mode: u32) -> Result<MadeDir, PathError> {
        self.mkdir(rel, mode, Last::MayBeMountRoot)
    }

    /// An existing `rel` is opened in one call; otherwise the missing
    /// directories are created one at a time, each `mkdirat` relative to
    /// the directory just opened (on ROOT's mount, no symlink): a component
    /// swapped for a symlink or a mount meanwhile makes it fail, and
    /// nothing is ever created elsewhere.
    pub(super) fn mkdir(&self, rel: &RelPath, mode: u32, last: Last) -> Result<MadeDir, PathError> {
        let mode = Mode::from_bits_truncate(mode);
        if let Some(done) = self.mkdir_new_under_top(rel, mode, last)? {
            return Ok(done);
        }
        match self.open_rel(rel, DIR_PATH, last) {
            Ok(fd) => {
                return Ok(MadeDir {
                    target: Target::new(fd, self.abs(rel)),
                    parent: None,
                    created: false,
                })
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        self.mkdir_walk(None, rel, 0, mode, last)
    }

    /// The fast path of [`mkdir`](Self::mkdir) for the common case, a new
    /// pod: the first component (`pods`) is a cached open directory, and
    /// creating the second one (`<uid>`) succeeds, so every level below is
    /// new too (no attempt to open `rel` first). `None` when the case does
    /// not apply (the second component exists, the path is too short, the
    /// cached directory is gone): the caller takes the general path.
    pub(super) fn mkdir_new_under_top(
        &self,
        rel: &RelPath,
        mode: Mode,
        last: Last,
    ) -> Result<Option<MadeDir>, PathError> {
        let mut comps = rel.as_path().iter();
        let (Some(top), Some(second)) = (comps.next(), comps.next()) else {
            return Ok(None);
        };
        let Some(parent) = self.top_dir(top) else {
            return Ok(None);
        };
        match mkdirat(parent.as_fd(), second, mode) {
            Ok(()) => {}
            Err(Errno::EEXIST) => return Ok(None),
            Err(Errno::ENOENT) => {
                // The cached directory was deleted: forget it.
                self.forget_top_dir(top);
                return Ok(None);
            }
            Err(e) => return Err(self.map_err("mkdirat", rel, e)),
        }
        let fd = self.open_component(parent.as_fd(), second, Last::OnSameMount, rel)?;
        self.mkdir_walk(Some(fd), rel, 2, mode, last).map(Some)
    }

    /// Creates the components of `rel` from index `skip` on, starting in
    /// `start` (ROOT when `None`), which holds the components before.
    pub(super) fn mkdir_walk(
        &self,
        start: Option<OwnedFd>,
        rel: &RelPath,
        skip: usize,
        mode: Mode,
        last: Last,
    ) -> Result<MadeDir, PathError> {
        let n = rel.as_path().iter().count();
        let mut cur = start;
        let mut prev = None;
        let mut created = skip > 0;
        for (i, name) in rel.as_path().iter().enumerate().skip(skip) {
            let parent = cur.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
            created = match mkdirat(parent, name, mode) {
                Ok(()) => true,
                Err(Errno::EEXIST) => false,
                Err(e) => return Err(self.map_err("mkdirat", rel, e)),
            };
            // Only an existing last directory may be a mount's root.
            let how = if i + 1 == n && !created {
                last
            } else {
                Last::OnSameMount
            };
            let next = self.open_component(parent, name, how, rel)?;
            prev = cur.replace(next);
        }
        let fd = cur.ok_or_else(|| PathError::InvalidComponent {
            path: PathBuf::new(),
            component: String::new(),
        })?;
        let path = self.abs(rel);
        // The parent only when this call created the directory (a parent
        // opened before the walk started is ROOT or a cached directory).
        let parent = match (prev, path.parent()) {
            (Some(p), Some(dir)) if created => Some(Target::new(p, dir.to_path_buf())),
            _ => None,
        };
        Ok(MadeDir {
            target: Target::new(fd, path),
            parent,
            created,
        })
    }

    /// The cached descriptor of the first-level directory `name` (on ROOT's
    /// mount), opened (and created) on first use; `None` if it cannot be.
    pub(super) fn top_dir(&self, name: &OsStr) -> Option<Arc<OwnedFd>> {
        let mut cache = self.top_dirs.locked();
        if let Some((_, fd)) = cache.iter().find(|(n, _)| n == name) {
            return Some(Arc::clone(fd));
        }
        match mkdirat(self.fd.as_fd(), name, Mode::from_bits_truncate(0o750)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(_) => return None,
        }
        let rel = RelPath::new([name]).ok()?;
        let fd = self
            .open_component(self.fd.as_fd(), name, Last::OnSameMount, &rel)
            .ok()?;
        let fd = Arc::new(fd);
        cache.push((name.to_os_string(), Arc::clone(&fd)));
        Some(fd)
    }

    pub(super) fn forget_top_dir(&self, name: &OsStr) {
        self.top_dirs.locked().retain(|(n, _)| n != name);
    }
}
