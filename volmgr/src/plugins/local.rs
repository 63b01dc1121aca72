//! Local PersistentVolumes (the kubelet's `kubernetes.io/local-volume`): a
//! directory on the node (`spec.local.path`, outside ROOT by design) is
//! bind-mounted onto `pods/<uid>/volumes/kubernetes.io~local-volume/<pv>`,
//! read-only when the pod's claim says so; a Block-mode PV is a symlink
//! `pods/<uid>/volumeDevices/kubernetes.io~local-volume/<pv>` to the device.
//!
//! The local path is opened with `openat2(RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` and bound through its descriptor; nothing is ever
//! created, changed or deleted there (no fsGroup ownership change either).
//! `spec.local.fsType` only matters for block devices in Filesystem mode,
//! which the kubelet formats and mounts globally: that case is refused here
//! with a per-volume error.
//!
//! Reconstruction: a bind mount found on a pod's volume directory is adopted
//! (never bound a second time); a directory without one is *uncertain* (set
//! up again if still wanted, removed otherwise); a block symlink is adopted.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    mount_id_at, BlockingPool, MountRequest, ReconstructedVolume, UnmountRequest, VolumeError,
    VolumePlugin,
};
use crate::sys::mount_table::{MountTable, MountTableView};
use crate::sys::root_dir::{RelPath, RootDir};
use crate::sys::{linux::open_host_path, Mounter, MsFlags, SyscallError, Target};
use crate::volume::{
    CsiVolumeMode, LocalVolumeSource, PodUid, UniqueVolumeName, VolumeSource, VolumeSpec,
};

/// The plugin's name (the kubelet's).
pub const PLUGIN_NAME: &str = "kubernetes.io/local-volume";

/// The directory name under `pods/<uid>/volumes/` and `volumeDevices/`.
const DIR_NAME: &str = "kubernetes.io~local-volume";

/// The local volume plugin.
pub struct LocalVolumePlugin {
    root: Arc<RootDir>,
    mounter: Arc<dyn Mounter>,
    pool: Arc<BlockingPool>,
}

impl LocalVolumePlugin {
    /// A new plugin.
    pub fn new(root: Arc<RootDir>, mounter: Arc<dyn Mounter>, pool: Arc<BlockingPool>) -> Self {
        Self {
            root,
            mounter,
            pool,
        }
    }
}

fn local(spec: &VolumeSpec) -> Result<&LocalVolumeSource, VolumeError> {
    match &spec.source {
        VolumeSource::Local(l) => Ok(l),
        _ => Err(VolumeError::InvalidSpec("not a local volume".into())),
    }
}

/// `pods/<uid>/volumes/kubernetes.io~local-volume/<pv>`.
fn volume_dir(pod: &PodUid, pv: &str) -> Result<RelPath, VolumeError> {
    Ok(RelPath::new([
        "pods",
        pod.as_str(),
        "volumes",
        DIR_NAME,
        pv,
    ])?)
}

/// `pods/<uid>/volumeDevices/kubernetes.io~local-volume/<pv>`.
fn device_link(pod: &PodUid, pv: &str) -> Result<RelPath, VolumeError> {
    Ok(RelPath::new([
        "pods",
        pod.as_str(),
        "volumeDevices",
        DIR_NAME,
        pv,
    ])?)
}

/// Opens the local path (no symlinks anywhere on it) and says what it is.
fn open_local(src: &LocalVolumeSource) -> Result<(Target, nix::sys::stat::SFlag), VolumeError> {
    let path = &src.path;
    if !path.is_absolute() {
        return Err(VolumeError::InvalidSpec(format!(
            "local volume {}: no local path known (reconstructed spec)",
            src.pv_name
        )));
    }
    let source = open_host_path(path).map_err(|e| match e.errno() {
        Some(libc::ELOOP) => VolumeError::InvalidSpec(format!(
            "local volume {}: {} must not go through a symlink",
            src.pv_name,
            path.display()
        )),
        _ => VolumeError::Syscall(e),
    })?;
    let st = nix::sys::stat::fstat(&source).map_err(|e| SyscallError::new("fstat", path, e))?;
    let kind = nix::sys::stat::SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT);
    Ok((source, kind))
}

/// Filesystem mode: binds the local directory onto the pod's volume
/// directory (once), then remounts it read-only when asked.
fn set_up_dir(
    root: &RootDir,
    mounter: &dyn Mounter,
    pod: &PodUid,
    src: &LocalVolumeSource,
) -> Result<PathBuf, VolumeError> {
    use nix::sys::stat::SFlag;
    let (source, kind) = open_local(src)?;
    match kind {
        SFlag::S_IFDIR => {}
        SFlag::S_IFBLK => {
            return Err(VolumeError::InvalidSpec(format!(
                "local volume {}: {} is a block device; formatting and mounting a block device in volumeMode Filesystem is not supported (use volumeMode Block, or a directory)",
                src.pv_name,
                src.path.display()
            )))
        }
        _ => {
            return Err(VolumeError::InvalidSpec(format!(
                "local volume {}: {} is not a directory",
                src.pv_name,
                src.path.display()
            )))
        }
    }
    let rel = volume_dir(pod, &src.pv_name)?;
    // The last directory may already carry the bind mount (set up before).
    let (target, _) = root.mkdir_mount_target(&rel, 0o750)?;
    if !mounter.is_mount_point(&target)? {
        mounter.bind_mount(&source, &target)?;
    }
    if src.read_only {
        // Opened again: the walk now ends on the bind mount.
        let top = root.open_mount_target(&rel)?;
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        if let Err(e) = mounter.mount("", &top, "", flags, None) {
            // Never leave the volume writable.
            let _ = unmount_dir(root, mounter, pod, &src.pv_name);
            return Err(e.into());
        }
    }
    Ok(root.abs(&rel))
}

/// Block mode: the device, linked from the pod's `volumeDevices`.
fn set_up_block(
    root: &RootDir,
    pod: &PodUid,
    src: &LocalVolumeSource,
) -> Result<PathBuf, VolumeError> {
    let (_, kind) = open_local(src)?;
    if kind != nix::sys::stat::SFlag::S_IFBLK {
        return Err(VolumeError::InvalidSpec(format!(
            "local volume {}: {} is not a block device (volumeMode Block)",
            src.pv_name,
            src.path.display()
        )));
    }
    let link = device_link(pod, &src.pv_name)?;
    super::csi::block::link_block_device(root, &link, &src.path)?;
    Ok(root.abs(&link))
}

/// Unmounts the bind mount on the pod's volume directory (if there) and
/// removes the directory, which must then be empty: nothing inside the
/// local directory is ever deleted.
fn unmount_dir(
    root: &RootDir,
    mounter: &dyn Mounter,
    pod: &PodUid,
    pv: &str,
) -> Result<(), VolumeError> {
    let rel = volume_dir(pod, pv)?;
    let Some((parent, name)) = root.open_parent_if_there(&rel)? else {
        return Ok(());
    };
    if mounter.is_mount_point_at(&parent, name)? {
        mounter.unmount(&parent, name)?;
    }
    if !root.remove_empty_dir(&rel)? {
        return Err(VolumeError::InvalidSpec(format!(
            "{} is still mounted or not empty: left in place",
            root.abs(&rel).display()
        )));
    }
    Ok(())
}

/// Removes the pod's block symlink, if there.
fn unlink_device(root: &RootDir, pod: &PodUid, pv: &str) -> Result<(), VolumeError> {
    let link = device_link(pod, pv)?;
    let Some((parent, name)) = root.open_parent_if_there(&link)? else {
        return Ok(());
    };
    match nix::fcntl::readlinkat(&parent, name) {
        Ok(_) => {}
        // Gone, or not a symlink: not ours.
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::EINVAL) => return Ok(()),
        Err(e) => return Err(SyscallError::new("readlinkat", root.abs(&link), e).into()),
    }
    match nix::unistd::unlinkat(&parent, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(SyscallError::new("unlinkat", root.abs(&link), e).into()),
    }
}

fn local_spec(pv: &str, path: PathBuf, read_only: bool, mode: CsiVolumeMode) -> VolumeSpec {
    VolumeSpec {
        name: pv.to_string(),
        source: VolumeSource::Local(LocalVolumeSource {
            pv_name: pv.to_string(),
            path,
            read_only,
            volume_mode: mode,
        }),
    }
}

#[async_trait::async_trait]
impl VolumePlugin for LocalVolumePlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn can_support(&self, source: &VolumeSource) -> bool {
        matches!(source, VolumeSource::Local(_))
    }

    /// Per pod, named after the PV (the directory's name), so a volume
    /// found on disk at start-up gets the same name as the desired one.
    fn unique_volume_name(&self, pod: &PodUid, spec: &VolumeSpec) -> UniqueVolumeName {
        match &spec.source {
            VolumeSource::Local(l) => UniqueVolumeName::per_pod(PLUGIN_NAME, pod, &l.pv_name),
            _ => UniqueVolumeName::per_pod(PLUGIN_NAME, pod, &spec.name),
        }
    }

    async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        let (src, pod) = (local(&req.spec)?.clone(), req.pod_uid);
        self.pool
            .run_with(&self.root, &self.mounter, move |root, mounter| {
                match src.volume_mode {
                    CsiVolumeMode::Filesystem => set_up_dir(root, mounter, &pod, &src),
                    CsiVolumeMode::Block => set_up_block(root, &pod, &src),
                }
            })
            .await
    }

    /// Undoes both modes (a reconstructed spec may not tell which).
    async fn tear_down(&self, req: UnmountRequest) -> Result<(), VolumeError> {
        let (pv, pod) = (local(&req.spec)?.pv_name.clone(), req.pod_uid);
        self.pool
            .run_with(&self.root, &self.mounter, move |root, mounter| {
                unmount_dir(root, mounter, &pod, &pv)?;
                unlink_device(root, &pod, &pv)
            })
            .await
    }

    fn verify_reads_mount_table(&self, spec: &VolumeSpec) -> bool {
        !matches!(&spec.source, VolumeSource::Local(l) if l.volume_mode == CsiVolumeMode::Block)
    }

    fn verify(&self, spec: &VolumeSpec, path: &Path, table: MountTableView<'_>) -> bool {
        match &spec.source {
            VolumeSource::Local(l) if l.volume_mode == CsiVolumeMode::Block => path
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink()),
            _ => table.holds(|t| t.is_mount_point(path)),
        }
    }

    fn mount_id(&self, pod: &PodUid, spec: &VolumeSpec) -> Option<u64> {
        let l = local(spec).ok()?;
        if l.volume_mode == CsiVolumeMode::Block {
            return None;
        }
        let rel = volume_dir(pod, &l.pv_name).ok()?;
        mount_id_at(&self.root, self.mounter.as_ref(), &rel)
    }

    fn volumes_dir_name(&self) -> Option<String> {
        Some(DIR_NAME.to_string())
    }

    /// A bind mount on the directory is adopted; a bare directory is
    /// uncertain. The local path is not known from the mount table (its
    /// root is relative to the source's file system): the desired spec
    /// brings it back if the volume must be set up again.
    fn reconstruct(
        &self,
        pod: &PodUid,
        volume: &str,
        table: &MountTable,
    ) -> Result<Option<ReconstructedVolume>, VolumeError> {
        let path = self.root.abs(&volume_dir(pod, volume)?);
        let top = table.top(&path);
        let read_only = top.is_some_and(|m| m.read_only());
        Ok(Some(ReconstructedVolume {
            spec: local_spec(volume, PathBuf::new(), read_only, CsiVolumeMode::Filesystem),
            path,
            complete: top.is_some(),
        }))
    }

    /// Every symlink in the pod's `volumeDevices/kubernetes.io~local-volume/`.
    fn reconstruct_block_volumes(
        &self,
        pod: &PodUid,
        _table: &MountTable,
    ) -> Result<Vec<ReconstructedVolume>, VolumeError> {
        let dir_rel = RelPath::new(["pods", pod.as_str(), "volumeDevices", DIR_NAME])?;
        let dir = match self.root.open_dir(&dir_rel) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut found = Vec::new();
        for name in self.root.read_dir(&dir_rel)? {
            let Ok(to) = nix::fcntl::readlinkat(&dir, name.as_os_str()) else {
                continue;
            };
            let Some(pv) = name.to_str() else { continue };
            let target = PathBuf::from(OsStr::from_bytes(to.as_bytes()));
            found.push(ReconstructedVolume {
                spec: local_spec(pv, target, false, CsiVolumeMode::Block),
                path: self.root.abs(&dir_rel.join(pv)?),
                complete: true,
            });
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::fake::{Call, FakeMounter};
    use crate::sys::MountTableReader;

    struct Setup {
        t: tempfile::TempDir,
        root: PathBuf,
        local: PathBuf,
        plugin: LocalVolumePlugin,
    }

    fn setup(mounter: Arc<dyn Mounter>) -> Setup {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        let (root, local) = (base.join("root"), base.join("disk1"));
        std::fs::create_dir_all(&local).unwrap();
        std::fs::write(local.join("data.txt"), "local data").unwrap();
        let root_dir = Arc::new(RootDir::open(&root).unwrap());
        let plugin = LocalVolumePlugin::new(root_dir, mounter, Arc::new(BlockingPool::new(2)));
        Setup {
            t,
            root,
            local,
            plugin,
        }
    }

    fn spec(path: &Path, read_only: bool, mode: CsiVolumeMode) -> Arc<VolumeSpec> {
        let mut s = local_spec("pv-1", path.to_path_buf(), read_only, mode);
        s.name = "data".into();
        Arc::new(s)
    }

    fn pod() -> PodUid {
        PodUid::new("pod1").unwrap()
    }

    fn mount_req(p: &LocalVolumePlugin, spec: Arc<VolumeSpec>) -> MountRequest {
        MountRequest {
            volume_name: p.unique_volume_name(&pod(), &spec),
            pod_uid: pod(),
            spec,
            fs_group: None,
            fs_group_change_policy: Default::default(),
            selinux_label: None,
        }
    }

    fn unmount_req(p: &LocalVolumePlugin, spec: Arc<VolumeSpec>, path: PathBuf) -> UnmountRequest {
        UnmountRequest {
            volume_name: p.unique_volume_name(&pod(), &spec),
            pod_uid: pod(),
            spec,
            path,
        }
    }

    #[tokio::test]
    async fn binds_once_remounts_read_only_and_tears_down() {
        let fake = Arc::new(FakeMounter::default());
        let s = setup(fake.clone());
        let p = &s.plugin;
        let sp = spec(&s.local, true, CsiVolumeMode::Filesystem);
        assert_eq!(
            p.unique_volume_name(&pod(), &sp).as_str(),
            "kubernetes.io/local-volume/pod1-pv-1"
        );
        let path = p.set_up(mount_req(p, sp.clone())).await.unwrap();
        let expect = s
            .root
            .join("pods/pod1/volumes/kubernetes.io~local-volume/pv-1");
        assert_eq!(path, expect);
        p.set_up(mount_req(p, sp.clone())).await.unwrap();
        let calls = fake.calls();
        let bind = Call::Mount {
            source: s.local.to_string_lossy().into_owned(),
            target: expect.clone(),
            fstype: "bind".into(),
            data: None,
        };
        let ro = Call::Remount {
            target: expect.clone(),
            read_only: true,
            data: None,
        };
        assert_eq!(
            calls,
            vec![bind, ro.clone(), ro],
            "one bind, read-only each time"
        );
        assert_eq!(fake.mounted(), vec![expect.clone()]);
        // Found again at start-up: adopted, read-only as the table says.
        let table = MountTable::new(fake.mount_table().unwrap());
        let rec = p.reconstruct(&pod(), "pv-1", &table).unwrap().unwrap();
        assert!(rec.complete);
        assert_eq!(rec.path, expect);
        assert_eq!(
            p.unique_volume_name(&pod(), &rec.spec),
            p.unique_volume_name(&pod(), &sp)
        );
        p.tear_down(unmount_req(p, Arc::new(rec.spec), path))
            .await
            .unwrap();
        assert!(fake.mounted().is_empty());
        assert!(!expect.exists(), "the pod's volume directory is removed");
        let kept = std::fs::read_to_string(s.local.join("data.txt")).unwrap();
        assert_eq!(kept, "local data", "the local directory is untouched");
        // Already gone: still success.
        p.tear_down(unmount_req(p, sp, expect)).await.unwrap();
    }

    #[tokio::test]
    async fn refuses_symlinks_files_and_block_devices_in_filesystem_mode() {
        let fake = Arc::new(FakeMounter::default());
        let s = setup(fake.clone());
        let p = &s.plugin;
        let base = s.t.path().canonicalize().unwrap();
        let link = base.join("link");
        std::os::unix::fs::symlink(&s.local, &link).unwrap();
        let err = p
            .set_up(mount_req(p, spec(&link, false, CsiVolumeMode::Filesystem)))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        let file = s.local.join("data.txt");
        let err = p
            .set_up(mount_req(p, spec(&file, false, CsiVolumeMode::Filesystem)))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
        let missing = base.join("missing");
        assert!(p
            .set_up(mount_req(
                p,
                spec(&missing, false, CsiVolumeMode::Filesystem)
            ))
            .await
            .is_err());
        let dev = base.join("blk");
        if make_block_device(&dev) {
            let err = p
                .set_up(mount_req(p, spec(&dev, false, CsiVolumeMode::Filesystem)))
                .await
                .unwrap_err();
            assert!(
                matches!(err, VolumeError::InvalidSpec(_))
                    && err.to_string().contains("block device"),
                "{err}"
            );
        }
        assert!(
            fake.calls().is_empty(),
            "nothing mounted: {:?}",
            fake.calls()
        );
    }

    /// A block device node (loop0's numbers; it need not exist), or false
    /// when this process may not make one.
    fn make_block_device(path: &Path) -> bool {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        mknod(
            path,
            SFlag::S_IFBLK,
            Mode::from_bits_truncate(0o600),
            makedev(7, 0),
        )
        .is_ok()
    }

    #[tokio::test]
    async fn block_mode_links_the_device_and_is_found_again() {
        let fake = Arc::new(FakeMounter::default());
        let s = setup(fake.clone());
        let p = &s.plugin;
        let dev = s.t.path().canonicalize().unwrap().join("blk");
        if !make_block_device(&dev) {
            eprintln!("SKIP: cannot mknod a block device");
            return;
        }
        let sp = spec(&dev, false, CsiVolumeMode::Block);
        let path = p.set_up(mount_req(p, sp.clone())).await.unwrap();
        let link = s
            .root
            .join("pods/pod1/volumeDevices/kubernetes.io~local-volume/pv-1");
        assert_eq!(path, link);
        assert_eq!(std::fs::read_link(&link).unwrap(), dev);
        assert!(p.verify(&sp, &link, MountTableView::NotRead));
        let dir_spec = spec(&s.local, false, CsiVolumeMode::Block);
        let err = p.set_up(mount_req(p, dir_spec)).await.unwrap_err();
        assert!(err.to_string().contains("not a block device"), "{err}");
        let table = MountTable::new(Vec::new());
        let found = p.reconstruct_block_volumes(&pod(), &table).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].spec.source, sp.source);
        assert_eq!(found[0].path, link);
        p.tear_down(unmount_req(p, sp, link.clone())).await.unwrap();
        assert!(link.symlink_metadata().is_err());
        assert!(dev.symlink_metadata().is_ok(), "the device node stays");
        assert!(fake.calls().is_empty());
    }

    #[test]
    fn a_directory_without_its_mount_is_uncertain() {
        let s = setup(Arc::new(FakeMounter::default()));
        let dir = s
            .root
            .join("pods/pod1/volumes/kubernetes.io~local-volume/pv-1");
        std::fs::create_dir_all(&dir).unwrap();
        let table = MountTable::new(Vec::new());
        let rec = s
            .plugin
            .reconstruct(&pod(), "pv-1", &table)
            .unwrap()
            .unwrap();
        assert!(!rec.complete);
    }

    const CHILD_ENV: &str = "VOLMGR_LOCAL_TEST_IN_PRIVATE_NS";

    /// Runs `body` in a re-executed test binary inside a private mount
    /// namespace (no harness thread ever changes namespace), or skips
    /// without root.
    fn isolated(name: &str, body: impl FnOnce()) {
        use std::os::unix::process::CommandExt;
        if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
            body();
            return;
        }
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP {name}: needs root for a private mount namespace");
            return;
        }
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, name);
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                crate::sys::namespace::enter_private_mount_namespace()?;
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        let (o, e) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success() && o.contains("1 passed"),
            "{name}:\n{o}\n{e}"
        );
    }

    fn mounts_at(path: &Path) -> Vec<crate::sys::mountinfo::MountInfo> {
        crate::sys::mountinfo::read_self()
            .unwrap()
            .into_iter()
            .filter(|m| m.mount_point == path)
            .collect()
    }

    #[test]
    fn real_bind_mounts_in_a_private_namespace() {
        isolated(
            "plugins::local::tests::real_bind_mounts_in_a_private_namespace",
            || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(real_bind_mounts());
            },
        );
    }

    async fn real_bind_mounts() {
        let s = setup(Arc::new(crate::sys::linux::LinuxMounter));
        let p = &s.plugin;
        let sp = spec(&s.local, false, CsiVolumeMode::Filesystem);
        let path = p.set_up(mount_req(p, sp.clone())).await.unwrap();
        let seen = std::fs::read_to_string(path.join("data.txt")).unwrap();
        assert_eq!(seen, "local data");
        std::fs::write(path.join("from-pod"), "x").unwrap();
        assert!(s.local.join("from-pod").exists());
        p.set_up(mount_req(p, sp.clone())).await.unwrap();
        assert_eq!(mounts_at(&path).len(), 1, "set up twice, bound once");
        let table = MountTable::new(crate::sys::mountinfo::read_self().unwrap());
        let rec = p.reconstruct(&pod(), "pv-1", &table).unwrap().unwrap();
        assert!(rec.complete && !local(&rec.spec).unwrap().read_only);
        p.tear_down(unmount_req(p, sp, path.clone())).await.unwrap();
        assert!(mounts_at(&path).is_empty());
        assert!(!path.exists());
        assert!(s.local.join("data.txt").exists() && s.local.join("from-pod").exists());
        // Read-only: writes fail, the table says ro.
        let ro = spec(&s.local, true, CsiVolumeMode::Filesystem);
        let path = p.set_up(mount_req(p, ro.clone())).await.unwrap();
        let err = std::fs::write(path.join("nope"), "x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        let m = mounts_at(&path);
        assert_eq!(m.len(), 1);
        assert!(m[0].read_only(), "{:?}", m[0]);
        p.tear_down(unmount_req(p, ro, path.clone())).await.unwrap();
        assert!(mounts_at(&path).is_empty());
        assert!(s.local.join("data.txt").exists());
    }
}
