//! Paths under the root, made of validated components.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::PathError;

/// A path relative to the root, made only of checked, normal components.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(PathBuf);

impl RelPath {
    /// Builds a relative path from components, each checked with [`check_component`].
    pub fn new<I, S>(components: I) -> Result<Self, PathError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut p = PathBuf::new();
        for c in components {
            let c = c.as_ref();
            if !check_component(c) {
                return Err(PathError::InvalidComponent {
                    path: p.join(c),
                    component: c.to_string_lossy().into_owned(),
                });
            }
            p.push(c);
        }
        Ok(Self(p))
    }

    /// Appends one checked component.
    pub fn join(&self, component: impl AsRef<OsStr>) -> Result<Self, PathError> {
        let c = component.as_ref();
        if !check_component(c) {
            return Err(PathError::InvalidComponent {
                path: self.0.join(c),
                component: c.to_string_lossy().into_owned(),
            });
        }
        Ok(Self(self.0.join(c)))
    }

    /// The parent and last component, if any.
    pub fn split_last(&self) -> Option<(RelPath, &OsStr)> {
        let name = self.0.file_name()?;
        let parent = self.0.parent().map(Path::to_path_buf).unwrap_or_default();
        Some((RelPath(parent), name))
    }

    /// The path as a `Path`.
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

/// Whether `c` is usable as one path component: not empty, `.` or `..`, no `/`
/// and no NUL.
pub fn check_component(c: &OsStr) -> bool {
    let b = c.as_bytes();
    !b.is_empty() && b != b"." && b != b".." && !b.contains(&b'/') && !b.contains(&0)
}
