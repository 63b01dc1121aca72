//! An indexed snapshot of the mount table, for reconstruction, resync and
//! the tracer's checks.

use std::path::{Path, PathBuf};

use super::mountinfo::MountInfo;
use crate::util::fast_map::FastMap;

/// The mount table as a check of set-up volumes sees it.
#[derive(Debug, Clone, Copy)]
pub enum MountTableView<'a> {
    /// Not read: cheaper signals (the table unchanged since the last check,
    /// or every volume's mount id still listed) show that every volume
    /// recorded as set up is still mounted.
    NotRead,
    /// Read for this check.
    Read(&'a MountTable),
}

impl MountTableView<'_> {
    /// Whether `check` holds on the table; `true` when it was not read (see
    /// [`Self::NotRead`]). A check that reads nothing but the table must go
    /// through here.
    pub fn holds(&self, check: impl FnOnce(&MountTable) -> bool) -> bool {
        match self {
            Self::NotRead => true,
            Self::Read(table) => check(table),
        }
    }
}

/// The mount table, indexed by mount point.
#[derive(Debug, Default, Clone)]
pub struct MountTable {
    entries: Vec<MountInfo>,
    /// ahash: a resync indexes every mount (10,000 paths at a time).
    by_point: FastMap<PathBuf, Vec<usize>>,
}

impl MountTable {
    /// Indexes `entries` (in mountinfo order, so the last mount on a point is on top).
    pub fn new(entries: Vec<MountInfo>) -> Self {
        let mut by_point: FastMap<PathBuf, Vec<usize>> =
            FastMap::with_capacity_and_hasher(entries.len(), Default::default());
        for (i, m) in entries.iter().enumerate() {
            by_point.entry(m.mount_point.clone()).or_default().push(i);
        }
        Self { entries, by_point }
    }

    /// Whether something is mounted on `path`.
    pub fn is_mount_point(&self, path: &Path) -> bool {
        self.by_point.contains_key(path)
    }

    /// How many mounts are stacked on `path`.
    pub fn count(&self, path: &Path) -> usize {
        self.by_point.get(path).map_or(0, Vec::len)
    }

    /// The top-most mount on `path`.
    pub fn top(&self, path: &Path) -> Option<&MountInfo> {
        self.by_point
            .get(path)
            .and_then(|v| v.last())
            .and_then(|&i| self.entries.get(i))
    }

    /// Every mount whose mount point is below `dir` (not `dir` itself).
    pub fn below<'a>(&'a self, dir: &'a Path) -> impl Iterator<Item = &'a MountInfo> + 'a {
        self.entries
            .iter()
            .filter(move |m| m.mount_point != dir && m.mount_point.starts_with(dir))
    }

    /// Forgets the top-most mount on `path` (just unmounted), so the
    /// snapshot stays true without reading the table again.
    pub fn remove_top(&mut self, path: &Path) -> Option<MountInfo> {
        let i = *self.by_point.get(path)?.last()?;
        let mut entries = std::mem::take(&mut self.entries);
        let removed = entries.remove(i);
        *self = Self::new(entries);
        Some(removed)
    }

    /// All entries.
    pub fn entries(&self) -> &[MountInfo] {
        &self.entries
    }
}
