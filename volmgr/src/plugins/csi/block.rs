//! Block volumes (`volumeMode: Block`), as the kubelet's `csi_block.go` and
//! `volumepathhandler` lay them out. For each pod using a PV:
//!
//! - the pod's view of the published device is a symlink named after the
//!   PV (`GetPodDeviceMapPath`), `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>`;
//! - the global map path's entry of the pod, `volumeDevices/<pv>/dev/<uid>`,
//!   is a bind mount of the published device file onto a regular file
//!   (`MapBlockVolume`): it keeps the device busy while the pod uses it.
//!
//! Set-up: symlink, NodePublishVolume, bind mount, record. Tear-down: record
//! removed, bind mount removed (before NodeUnpublishVolume, as the kubelet
//! unmaps before it unpublishes), NodeUnpublishVolume, symlink removed last:
//! at start-up the pod's symlinks are how its block volumes are found again,
//! so a crash at any point leaves one to find. A symlink named after the
//! pod's volume (what an older volmgr made) is found and removed too.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, Mode};

use super::layout::{global_map_path, PublishLayout, CSI_DIR, VOLUME_DEVICES};
use super::vol_data::{key, read_vol_data, reconstructed_source};
use super::{CsiPlugin, PLUGIN_NAME, PUBLISHED_FILE, VOL_DATA_FILE};
use crate::plugins::{escape_plugin_name, ReconstructedVolume, VolumeError};
use crate::sys::mount_table::MountTable;
use crate::sys::root_dir::{RelPath, RootDir};
use crate::sys::{MsFlags, SyscallError, Target};
use crate::volume::{CsiVolumeMode, CsiVolumeSource, PodUid, VolumeSource, VolumeSpec};

/// How many mounts stacked on a global map entry tear-down removes at most.
const MAX_STACKED: usize = 8;

impl CsiPlugin {
    /// The block volumes of `pod`: each symlink in
    /// `pods/<uid>/volumeDevices/kubernetes.io~csi/` that points at this
    /// pod's publish target of a PV, with the PV's `vol_data.json`; complete
    /// when the target and the pod's global map entry are mounted and the
    /// publish was recorded. A pod without block volumes has no such
    /// directory: nothing to find, and nothing to warn about.
    pub(super) fn block_volumes_of(
        &self,
        pod: &PodUid,
        table: &MountTable,
    ) -> Result<Vec<ReconstructedVolume>, VolumeError> {
        let escaped = escape_plugin_name(PLUGIN_NAME);
        let dir = RelPath::new(["pods", pod.as_str(), "volumeDevices", &escaped])?;
        let names = self.root.read_dir(&dir)?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let Some(fd) = self.root.open_dir_if_there(&dir)? else {
            return Ok(Vec::new());
        };
        let mut links = Vec::new();
        for name in names {
            let target = PathBuf::from(
                nix::fcntl::readlinkat(&fd, name.as_os_str())
                    .map_err(|e| SyscallError::new("readlinkat", self.abs(&dir), e))?,
            );
            if let Some(pv) = self.published_pv(&target, pod)? {
                links.push((pv, name, target));
            }
        }
        // Per PV, the link named after it first: one an older volmgr left
        // beside it (named after the pod's volume) is the same volume.
        links.sort_by(|a, b| (&a.0, a.1 != *a.0).cmp(&(&b.0, b.1 != *b.0)));
        links.dedup_by(|a, b| a.0 == b.0);
        let mut out = Vec::new();
        for (pv, name, target) in links {
            let link = dir.join(&name)?;
            if let Some(v) = self.block_volume(pod, &pv, &name, &link, &target, table)? {
                out.push(v);
            }
        }
        Ok(out)
    }

    /// The PV whose publish target for `pod` `target` is, if it is one.
    fn published_pv(&self, target: &Path, pod: &PodUid) -> Result<Option<String>, VolumeError> {
        let publish_base = self.abs(
            &RelPath::new(CSI_DIR)?
                .join(VOLUME_DEVICES)?
                .join("publish")?,
        );
        // Only a link to this pod's own publish target counts.
        let parts: Vec<&OsStr> = match target.strip_prefix(&publish_base) {
            Ok(rest) => rest.iter().collect(),
            Err(_) => return Ok(None),
        };
        let [pv, uid] = parts.as_slice() else {
            return Ok(None);
        };
        if *uid != pod.as_str() {
            return Ok(None);
        }
        Ok(pv.to_str().map(str::to_string))
    }

    /// The block volume `pv` of `pod`, found through the symlink `link`
    /// (called `name`) to `target`; `None` if its `vol_data.json` does not
    /// name a driver and a handle.
    fn block_volume(
        &self,
        pod: &PodUid,
        pv: &str,
        name: &OsStr,
        link: &RelPath,
        target: &Path,
        table: &MountTable,
    ) -> Result<Option<ReconstructedVolume>, VolumeError> {
        let data_dir = RelPath::new(CSI_DIR)?
            .join(VOLUME_DEVICES)?
            .join(pv)?
            .join("data")?;
        let data = read_vol_data(&self.root, &data_dir.join(VOL_DATA_FILE)?)?;
        let (Some(driver), Some(handle)) =
            (data.get(key::DRIVER_NAME), data.get(key::VOLUME_HANDLE))
        else {
            return Ok(None);
        };
        let marker = data_dir.join(format!("{PUBLISHED_FILE}-{pod}"))?;
        // The record holds the pod's name of the volume; without it, the
        // link's name (the PV's, or the volume's for an older volmgr).
        let record = match self.root.read_file(&marker) {
            Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e.into()),
        };
        let global = self.abs(&global_map_path(pv)?.join(pod.as_str())?);
        let complete =
            record.is_some() && table.is_mount_point(target) && table.is_mount_point(&global);
        let outer = record
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| name.to_string_lossy().into_owned());
        let spec = VolumeSpec {
            name: outer,
            source: VolumeSource::Csi(Box::new(CsiVolumeSource {
                pv_name: Some(pv.to_string()),
                ..reconstructed_source(driver.clone(), handle.clone(), CsiVolumeMode::Block)
            })),
        };
        self.adopt(pod, &spec);
        Ok(Some(ReconstructedVolume {
            spec,
            path: self.abs(link),
            complete,
        }))
    }

    /// After NodePublishVolume: the pod's global map entry (a bind mount of
    /// the published device), then an older volmgr's link is removed. A
    /// failure leaves the volume uncertain (the publish happened).
    pub(super) fn map_block_device(&self, layout: &PublishLayout) -> Result<(), VolumeError> {
        let uncertain = |e: VolumeError| VolumeError::Uncertain(e.to_string());
        if let Some(entry) = &layout.global_map {
            self.map_global(entry, &layout.target).map_err(uncertain)?;
        }
        if let Some(old) = &layout.legacy_link {
            remove_link_to(&self.root, old, &self.abs(&layout.target)).map_err(uncertain)?;
        }
        Ok(())
    }

    /// Bind-mounts the published device file `target` onto the global map
    /// entry `entry`, a regular file made for it (the kubelet's
    /// `mapBindMountDevice`). Already mounted with that device: nothing to
    /// do (a restart never mounts it twice); with another device (a stale
    /// one): replaced.
    fn map_global(&self, entry: &RelPath, target: &RelPath) -> Result<(), VolumeError> {
        let (dir_rel, name) = split_named(entry, "global map")?;
        let dir = self.root.mkdir_all(&dir_rel, 0o750)?;
        let source = self.root.open_path(target)?;
        if self.mounter.is_mount_point_at(&dir, name)? {
            let device = |st: &FileStat| (st.st_mode & libc::S_IFMT, st.st_rdev);
            let mapped = stat_at(&dir, name)?;
            let published = nix::sys::stat::fstat(&source)
                .map_err(|e| SyscallError::new("fstat", source.path(), e))?;
            if device(&mapped) == device(&published) {
                return Ok(());
            }
            tracing::warn!(path = %self.abs(entry).display(), "replacing a stale block device bind mount");
            self.mounter.unmount(&dir, name)?;
        }
        let file = nix::fcntl::openat(
            &dir,
            name,
            OFlag::O_CREAT
                | OFlag::O_WRONLY
                | OFlag::O_NOFOLLOW
                | OFlag::O_NONBLOCK
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o750),
        )
        .map_err(|e| SyscallError::new("openat", self.abs(entry), e))?;
        drop(file);
        let onto = self.root.open_path(entry)?;
        let from = source.proc_path();
        let from = from
            .to_str()
            .ok_or_else(|| VolumeError::Internal("descriptor path is not UTF-8".into()))?;
        self.mounter
            .mount(from, &onto, "", MsFlags::MS_BIND, None)?;
        Ok(())
    }

    /// Before NodeUnpublishVolume: unmounts the pod's global map entry
    /// (every mount stacked there) and removes its file (the kubelet's
    /// `unmapBindMountDevice`). Nothing there is fine.
    pub(super) fn unmap_global(&self, entry: &RelPath) -> Result<(), VolumeError> {
        let (dir_rel, name) = split_named(entry, "global map")?;
        let Some(dir) = self.root.open_dir_if_there(&dir_rel)? else {
            return Ok(());
        };
        for _ in 0..MAX_STACKED {
            if !self.mounter.is_mount_point_at(&dir, name)? {
                break;
            }
            self.mounter.unmount(&dir, name)?;
        }
        // Never crosses a mount still there: that fails instead.
        self.root.remove_all_at(&dir, name)?;
        Ok(())
    }
}

/// `path`'s parent and last name; an empty path is an internal error (the
/// `what` path is empty).
fn split_named<'a>(path: &'a RelPath, what: &str) -> Result<(RelPath, &'a OsStr), VolumeError> {
    path.split_last()
        .ok_or_else(|| VolumeError::Internal(format!("empty {what} path")))
}

/// `fstatat` of `dir/name`, not following a symlink.
fn stat_at(dir: &Target, name: &OsStr) -> Result<FileStat, VolumeError> {
    nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(|e| SyscallError::new("fstatat", dir.path().join(name), e).into())
}

/// Creates the pod's view of a published block device: a symlink at `link`
/// to `target` (replacing a stale one).
pub(in crate::plugins) fn link_block_device(
    root: &RootDir,
    link: &RelPath,
    target: &Path,
) -> Result<(), VolumeError> {
    let (parent, name) = split_named(link, "link")?;
    let dir = root.mkdir_all(&parent, 0o750)?;
    match nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(SyscallError::new("unlinkat", root.abs(link), e).into()),
    }
    nix::unistd::symlinkat(target, &dir, name)
        .map_err(|e| SyscallError::new("symlinkat", root.abs(link), e))?;
    Ok(())
}

/// Removes the symlink `link` if it points at `target` (another volume's
/// link of the same name stays). Nothing there is fine.
pub(super) fn remove_link_to(
    root: &RootDir,
    link: &RelPath,
    target: &Path,
) -> Result<(), VolumeError> {
    let (parent, name) = split_named(link, "link")?;
    let Some(dir) = root.open_dir_if_there(&parent)? else {
        return Ok(());
    };
    let to = match nix::fcntl::readlinkat(&dir, name) {
        Ok(to) => to,
        // Gone, or not a symlink (EINVAL): not ours.
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::EINVAL) => return Ok(()),
        Err(e) => return Err(SyscallError::new("readlinkat", root.abs(link), e).into()),
    };
    if to.as_bytes() != target.as_os_str().as_bytes() {
        return Ok(());
    }
    match nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(SyscallError::new("unlinkat", root.abs(link), e).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn plugin(root: &Path) -> CsiPlugin {
        let registry = crate::pluginmanager::registry::DriverRegistry::new();
        CsiPlugin::new(
            Arc::new(RootDir::open(root).unwrap()),
            crate::pluginmanager::csi_client::CsiClients::new(
                registry,
                std::time::Duration::from_secs(1),
            ),
            "node".into(),
            Arc::new(crate::sys::fake::FakeMounter::default()),
        )
    }

    /// A pod without block volumes has no `volumeDevices` directory: no
    /// volume, and no error (at start-up, no warning per pod).
    #[test]
    fn a_pod_without_block_volumes_is_no_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = plugin(dir.path());
        std::fs::create_dir_all(dir.path().join("pods/u1/volumes")).unwrap();
        let pod = PodUid::new("u1").unwrap();
        let found = p.block_volumes_of(&pod, &MountTable::new(vec![])).unwrap();
        assert!(found.is_empty());
        // Nor one whose pod directory is gone.
        let gone = PodUid::new("u2").unwrap();
        assert!(p
            .block_volumes_of(&gone, &MountTable::new(vec![]))
            .unwrap()
            .is_empty());
    }

    /// The link named after the PV, and one an older volmgr named after the
    /// pod's volume beside it, are one volume; the record names the pod's
    /// volume; without the bind mount of the global map entry (nor the
    /// publish mount) it is not complete.
    #[test]
    fn links_old_and_new_are_one_volume() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let p = plugin(&root);
        let devices = root.join("plugins/kubernetes.io/csi/volumeDevices");
        std::fs::create_dir_all(devices.join("pv-1/data")).unwrap();
        std::fs::write(
            devices.join("pv-1/data/vol_data.json"),
            r#"{"driverName":"d","volumeHandle":"h","specVolID":"pv-1"}"#,
        )
        .unwrap();
        let target = devices.join("publish/pv-1/u1");
        let links = root.join("pods/u1/volumeDevices/kubernetes.io~csi");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(&target, links.join("data")).unwrap();
        // Another pod's target, or something else: not this pod's volume.
        std::os::unix::fs::symlink(devices.join("publish/pv-1/u2"), links.join("x")).unwrap();
        std::os::unix::fs::symlink("/dev/null", links.join("y")).unwrap();
        let pod = PodUid::new("u1").unwrap();
        let table = MountTable::new(vec![]);

        // An older volmgr's link alone: the volume's name is the link's.
        let found = p.block_volumes_of(&pod, &table).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].spec.name, "data");
        assert_eq!(found[0].path, links.join("data"));
        assert!(!found[0].complete);

        // Both links, and the record: one volume, found by the PV's link.
        std::os::unix::fs::symlink(&target, links.join("pv-1")).unwrap();
        std::fs::write(devices.join("pv-1/data/volmgr-published-u1"), "data").unwrap();
        let found = p.block_volumes_of(&pod, &table).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].spec.name, "data");
        assert_eq!(found[0].path, links.join("pv-1"));
        let VolumeSource::Csi(c) = &found[0].spec.source else {
            panic!("not CSI")
        };
        assert_eq!(c.pv_name.as_deref(), Some("pv-1"));
        assert!(!found[0].complete, "nothing is mounted");

        // remove_link_to leaves a link to something else.
        let rel = RelPath::new(["pods", "u1", "volumeDevices", "kubernetes.io~csi", "x"]).unwrap();
        remove_link_to(&p.root, &rel, &target).unwrap();
        assert!(links.join("x").symlink_metadata().is_ok());
        let rel =
            RelPath::new(["pods", "u1", "volumeDevices", "kubernetes.io~csi", "data"]).unwrap();
        remove_link_to(&p.root, &rel, &target).unwrap();
        assert!(links.join("data").symlink_metadata().is_err());
    }
}
