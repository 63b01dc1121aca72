//! NFS volumes (the kubelet's in-tree `kubernetes.io/nfs`): `server:path`
//! mounted with file system type `nfs` onto
//! `pods/<uid>/volumes/kubernetes.io~nfs/<name>` (`<name>`: the pod's volume,
//! or the PersistentVolume's name), with the PersistentVolume's
//! `mountOptions`, and `ro` when the volume, the PV or the pod's claim says
//! read-only (the kubelet's `nfsMounter.SetUpAt`).
//!
//! The source stays [`VolumeSource::Other`] of kind `nfs` (the API JSON):
//! the C ABI's host plugins may claim NFS themselves, so this plugin is
//! registered by the agent only ([`VolumeManagerBuilder`]).
//!
//! The unmount of a volume whose server is gone must not stall the
//! reconciler: it runs on a thread of its own; when it has not finished
//! after [`UNMOUNT_TIMEOUT`], the mount is detached lazily
//! (`umount2(MNT_FORCE | MNT_DETACH)`, on another thread nobody waits on)
//! and the volume is left uncertain, to be torn down again.
//!
//! [`VolumeManagerBuilder`]: crate::volumemanager::builder::VolumeManagerBuilder

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{
    mount_id_at, BlockingPool, MountRequest, ReconstructedVolume, UnmountRequest, VolumeError,
    VolumePlugin,
};
use crate::sys::mount_table::{MountTable, MountTableView};
use crate::sys::root_dir::{RelPath, RootDir};
use crate::sys::{Mounter, MsFlags};
use crate::volume::{PodUid, UniqueVolumeName, VolumeSource, VolumeSpec};

/// The plugin's name (the kubelet's).
pub const PLUGIN_NAME: &str = "kubernetes.io/nfs";

/// The directory name under `pods/<uid>/volumes/`.
const DIR_NAME: &str = "kubernetes.io~nfs";

/// How long a tear-down waits for the unmount before detaching lazily.
pub const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(30);

/// An NFS volume as the plugin mounts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsSource {
    /// The directory under `pods/<uid>/volumes/kubernetes.io~nfs/`.
    pub name: String,
    /// `nfs.server`.
    pub server: String,
    /// `nfs.path`.
    pub path: String,
    /// Read-only (`nfs.readOnly`, the claim's `readOnly`).
    pub read_only: bool,
    /// The PersistentVolume's `mountOptions`.
    pub mount_options: Vec<String>,
}

impl NfsSource {
    /// From the API JSON of a [`VolumeSource::Other`] of kind `nfs`: a pod
    /// volume (`{"name", "nfs": {...}}`), or what the claim conversion
    /// makes of an NFS PersistentVolume (the same, named after the PV, with
    /// `mountOptions` and `readOnly`).
    pub fn from_spec(spec: &VolumeSpec) -> Result<Self, VolumeError> {
        let VolumeSource::Other { kind, spec: json } = &spec.source else {
            return Err(VolumeError::InvalidSpec("not an nfs volume".into()));
        };
        if kind != "nfs" {
            return Err(VolumeError::InvalidSpec("not an nfs volume".into()));
        }
        let nfs = &json["nfs"];
        let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
        let src = Self {
            name: text(&json["name"]),
            server: text(&nfs["server"]),
            path: text(&nfs["path"]),
            read_only: nfs["readOnly"].as_bool().unwrap_or(false)
                || json["readOnly"].as_bool().unwrap_or(false),
            mount_options: json["mountOptions"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|o| o.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default(),
        };
        if src.server.is_empty() || src.path.is_empty() || src.name.is_empty() {
            return Err(VolumeError::InvalidSpec(
                "nfs: server, path and the volume's name are required".into(),
            ));
        }
        Ok(src)
    }

    /// The mount source, `server:path`.
    pub fn mount_source(&self) -> String {
        format!("{}:{}", self.server, self.path)
    }

    /// The mount options: the PV's (empty ones dropped) and `ro` when
    /// read-only, without duplicates, sorted (the kubelet's
    /// `util.JoinMountOptions`, a set listed in order).
    pub fn options(&self) -> Vec<String> {
        let user = self.mount_options.iter().filter(|o| !o.is_empty()).cloned();
        let set: std::collections::BTreeSet<String> =
            user.chain(self.read_only.then(|| "ro".into())).collect();
        set.into_iter().collect()
    }
}

/// The NFS volume plugin.
pub struct NfsPlugin {
    root: Arc<RootDir>,
    mounter: Arc<dyn Mounter>,
    pool: Arc<BlockingPool>,
    unmount_timeout: Duration,
}

impl NfsPlugin {
    /// A new plugin, unmounts given [`UNMOUNT_TIMEOUT`].
    pub fn new(root: Arc<RootDir>, mounter: Arc<dyn Mounter>, pool: Arc<BlockingPool>) -> Self {
        Self {
            root,
            mounter,
            pool,
            unmount_timeout: UNMOUNT_TIMEOUT,
        }
    }

    /// The same with another unmount timeout (tests).
    pub fn with_unmount_timeout(mut self, timeout: Duration) -> Self {
        self.unmount_timeout = timeout;
        self
    }
}

/// `pods/<uid>/volumes/kubernetes.io~nfs/<name>`.
fn volume_dir(pod: &PodUid, name: &str) -> Result<RelPath, VolumeError> {
    Ok(RelPath::new([
        "pods",
        pod.as_str(),
        "volumes",
        DIR_NAME,
        name,
    ])?)
}

/// The volume's directory name: the API JSON's `name` (the PV's for a
/// claim), else the spec's name. Needs no server (a volume reconstructed
/// without its mount has none).
fn dir_name(spec: &VolumeSpec) -> String {
    match &spec.source {
        VolumeSource::Other { spec: json, .. } => json["name"].as_str().map(String::from),
        _ => None,
    }
    .filter(|n| !n.is_empty())
    .unwrap_or_else(|| spec.name.clone())
}

/// Mounts the share (once) on the pod's volume directory.
fn set_up(
    root: &RootDir,
    mounter: &dyn Mounter,
    pod: &PodUid,
    src: &NfsSource,
) -> Result<PathBuf, VolumeError> {
    let rel = volume_dir(pod, &src.name)?;
    let (target, _) = root.mkdir_mount_target(&rel, 0o750)?;
    if mounter.is_mount_point(&target)? {
        return Ok(root.abs(&rel));
    }
    let flags = match src.read_only {
        true => MsFlags::MS_RDONLY,
        false => MsFlags::empty(),
    };
    let options = src.options().join(",");
    let data = (!options.is_empty()).then_some(options.as_str());
    match mounter.mount(&src.mount_source(), &target, "nfs", flags, data) {
        Ok(()) => Ok(root.abs(&rel)),
        Err(e) if e.errno() == Some(libc::ENODEV) => Err(VolumeError::InvalidSpec(format!(
            "mounting NFS volume {} ({}): this kernel has no NFS client (no nfs in /proc/filesystems: load the nfs module, or use an NFS CSI driver such as nfs.csi.k8s.io): {e}",
            src.name,
            src.mount_source()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Unmounts the share (if mounted), lazily when `detach`, and removes the
/// directory, which must then be empty.
fn tear_down(
    root: &RootDir,
    mounter: &dyn Mounter,
    pod: &PodUid,
    name: &str,
    detach: bool,
) -> Result<(), VolumeError> {
    let rel = volume_dir(pod, name)?;
    let Some((parent, leaf)) = root.open_parent_if_there(&rel)? else {
        return Ok(());
    };
    if detach {
        // No stat of the mount (it would wait for the server).
        mounter.unmount_detach(&parent, leaf)?;
    } else if mounter.is_mount_point_at(&parent, leaf)? {
        mounter.unmount(&parent, leaf)?;
    }
    if !root.remove_empty_dir(&rel)? {
        return Err(VolumeError::InvalidSpec(format!(
            "{} is still mounted or not empty: left in place",
            root.abs(&rel).display()
        )));
    }
    Ok(())
}

#[async_trait::async_trait]
impl VolumePlugin for NfsPlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn can_support(&self, source: &VolumeSource) -> bool {
        matches!(source, VolumeSource::Other { kind, .. } if kind == "nfs")
    }

    /// Per pod, named after the directory (the PV's name for a claim), so
    /// a volume found on disk at start-up gets the desired one's name.
    fn unique_volume_name(&self, pod: &PodUid, spec: &VolumeSpec) -> UniqueVolumeName {
        UniqueVolumeName::per_pod(PLUGIN_NAME, pod, &dir_name(spec))
    }

    async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        let (src, pod) = (NfsSource::from_spec(&req.spec)?, req.pod_uid);
        self.pool
            .run_with(&self.root, &self.mounter, move |root, mounter| {
                set_up(root, mounter, &pod, &src)
            })
            .await
    }

    async fn tear_down(&self, req: UnmountRequest) -> Result<(), VolumeError> {
        let name = dir_name(&req.spec);
        let (root, mounter, pod) = (
            Arc::clone(&self.root),
            Arc::clone(&self.mounter),
            req.pod_uid,
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (r, m, p, n) = (
            Arc::clone(&root),
            Arc::clone(&mounter),
            pod.clone(),
            name.clone(),
        );
        // Its own thread: an unmount waiting for a dead server holds it,
        // not the blocking pool nor the reconciler.
        std::thread::Builder::new()
            .name("nfs-umount".into())
            .spawn(move || {
                let _ = tx.send(tear_down(&r, m.as_ref(), &p, &n, false));
            })
            .map_err(|e| VolumeError::Internal(format!("spawning the unmount thread: {e}")))?;
        match tokio::time::timeout(self.unmount_timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(VolumeError::Internal("the unmount thread ended".into())),
            Err(_) => {
                let why = format!(
                    "unmounting NFS volume {name} did not finish within {:?} (server unreachable?): detached lazily (umount2 MNT_FORCE|MNT_DETACH); torn down again",
                    self.unmount_timeout
                );
                let _ = std::thread::Builder::new()
                    .name("nfs-detach".into())
                    .spawn(move || tear_down(&root, mounter.as_ref(), &pod, &name, true));
                Err(VolumeError::Uncertain(why))
            }
        }
    }

    fn verify(&self, _spec: &VolumeSpec, path: &Path, table: MountTableView<'_>) -> bool {
        table.holds(|t| t.is_mount_point(path))
    }

    fn mount_id(&self, pod: &PodUid, spec: &VolumeSpec) -> Option<u64> {
        let rel = volume_dir(pod, &dir_name(spec)).ok()?;
        mount_id_at(&self.root, self.mounter.as_ref(), &rel)
    }

    fn volumes_dir_name(&self) -> Option<String> {
        Some(DIR_NAME.to_string())
    }

    /// An `nfs`/`nfs4` mount on the directory is adopted (its source gives
    /// the server and path); a bare directory is uncertain.
    fn reconstruct(
        &self,
        pod: &PodUid,
        volume: &str,
        table: &MountTable,
    ) -> Result<Option<ReconstructedVolume>, VolumeError> {
        let path = self.root.abs(&volume_dir(pod, volume)?);
        let top = table
            .top(&path)
            .filter(|m| m.fstype == "nfs" || m.fstype == "nfs4");
        let (server, share) = top
            .and_then(|m| m.source.rsplit_once(':'))
            .map_or((String::new(), String::new()), |(s, p)| {
                (s.to_string(), p.to_string())
            });
        let json = serde_json::json!({
            "name": volume,
            "nfs": {"server": server, "path": share, "readOnly": top.is_some_and(|m| m.read_only())},
        });
        let source = VolumeSource::Other {
            kind: "nfs".into(),
            spec: Arc::new(json),
        };
        Ok(Some(ReconstructedVolume::named(
            volume,
            source,
            path,
            top.is_some(),
        )))
    }
}

#[cfg(test)]
#[path = "nfs/tests.rs"]
mod tests;
