//! `kubernetes.io/csi`: volumes served by a CSI node plugin over gRPC, with
//! the kubelet's two phases and on-disk layout.
//!
//! Filesystem volumes (`ROOT` is the kubelet's `/var/lib/kubelet`):
//!
//! ```text
//! ROOT/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount   NodeStageVolume target
//! ROOT/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/vol_data.json
//! ROOT/pods/<uid>/volumes/kubernetes.io~csi/<pv-or-volume>/mount              NodePublishVolume target
//! ROOT/pods/<uid>/volumes/kubernetes.io~csi/<pv-or-volume>/vol_data.json
//! ```
//!
//! Block volumes (`volumeMode: Block`), as the kubelet's `csi_block.go`:
//!
//! ```text
//! ROOT/plugins/kubernetes.io/csi/volumeDevices/staging/<pv>                   NodeStageVolume target
//! ROOT/plugins/kubernetes.io/csi/volumeDevices/<pv>/data/vol_data.json
//! ROOT/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>             NodePublishVolume target (device file)
//! ROOT/plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<uid>                 bind mount of the published device
//! ROOT/pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>                        symlink to the published device
//! ```
//!
//! (The pod's symlink is named after the PV, as the kubelet's
//! `GetPodDeviceMapPath`; see [`block`] for the order of the steps.)
//!
//! Besides the kubelet's files, volmgr records a *completed* call next to
//! its `vol_data.json`: `volmgr-staged.json` (with the staged size) once
//! NodeStageVolume succeeded and `volmgr-published` (block:
//! `volmgr-published-<podUID>` in the PV's `data/`, holding the pod's name
//! of the volume) once NodePublishVolume did. Each is removed before the call that undoes it. At start-up a
//! volume is trusted only with its record *and* the mount table's word (an
//! existing mount is not proof that the call succeeded; a record is not
//! proof that its mount survived, a reboot keeps the files): a stage whose
//! staging mount is there (block: a mount at or below the staging path, or
//! the device published for a pod), a publish whose target is mounted from
//! the staging mount's device. A confirmed stage is never staged again nor
//! unstaged while a pod uses it; an unconfirmed one is uncertain, and so
//! are the publishes made from it: staged again, then published again.

pub mod errors;
pub mod limits;

pub(in crate::plugins) mod block;
mod csi_metrics;
mod fs_group;
mod layout;
mod stage;
mod vol_data;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use crate::pluginmanager::csi_client::{CsiClients, NodeCapabilities};
use crate::pluginmanager::csi_proto::csi;
use crate::plugins::{
    escape_plugin_name, DeviceMountableVolumePlugin, MountRequest, NodeExpandRequest,
    NodeExpandableVolumePlugin, ReconstructedVolume, UnmountRequest, VolumeError, VolumePlugin,
};
use crate::sys::mount_table::{MountTable, MountTableView};
use crate::sys::root_dir::{RelPath, RootDir};
use crate::sys::Mounter;
use crate::volume::{
    CsiAccessMode, CsiSecrets, CsiVolumeMode, CsiVolumeSource, PodUid, UniqueVolumeName,
    VolumeSource, VolumeSpec,
};
use block::{link_block_device, remove_link_to};
use errors::{classify, CsiOp};
pub use layout::{device_mount_paths, handle_hash, DeviceMountPaths};
use layout::{publish_layout, stage_layout, PublishLayout};
use limits::{Slot, VolumeLimits};
use vol_data::{key, read_vol_data, reconstructed_source, StagedRecord};

/// The plugin's name.
pub const PLUGIN_NAME: &str = "kubernetes.io/csi";

/// The file the kubelet keeps next to each stage and publish directory.
pub const VOL_DATA_FILE: &str = "vol_data.json";
/// volmgr's record of a completed NodeStageVolume.
pub const STAGED_FILE: &str = "volmgr-staged.json";
/// volmgr's record of a completed NodePublishVolume.
pub const PUBLISHED_FILE: &str = "volmgr-published";

/// The CSI volume plugin.
pub struct CsiPlugin {
    root: Arc<RootDir>,
    clients: Arc<CsiClients>,
    node_name: String,
    /// Only to learn the id of the mount a driver made (the drivers mount).
    mounter: Arc<dyn Mounter>,
    /// Where service account tokens for CSIDriver `tokenRequests` come
    /// from (the projected volumes' source); its schedule also times the
    /// republishing of `requiresRepublish` drivers' volumes.
    tokens: Option<Arc<crate::plugins::token::TokenRefresh>>,
    /// How often a `requiresRepublish` driver's volume is published again.
    republish_period: std::time::Duration,
    /// Whether the host has SELinux: only then are volumes mounted with
    /// their SELinux label (`context=`), as the kubelet does.
    selinux: bool,
    /// The volumes of each driver in use on the node, against the drivers'
    /// `max_volumes_per_node` (see [`limits`]).
    limits: Arc<VolumeLimits>,
}

impl CsiPlugin {
    /// A plugin calling drivers through `clients`, keeping its files under `root`.
    pub fn new(
        root: Arc<RootDir>,
        clients: Arc<CsiClients>,
        node_name: String,
        mounter: Arc<dyn Mounter>,
    ) -> Self {
        Self {
            root,
            clients,
            node_name,
            mounter,
            tokens: None,
            republish_period: DEFAULT_REPUBLISH_PERIOD,
            limits: VolumeLimits::new(),
            selinux: crate::sys::selinux::enabled(),
        }
    }

    /// Overrides whether the host has SELinux (found by
    /// [`crate::sys::selinux::enabled`] by default).
    pub fn with_selinux(mut self, enabled: bool) -> Self {
        self.selinux = enabled;
        self
    }

    /// Takes `volume`'s place among `driver`'s volumes in use on the node,
    /// before the call that starts its use; refused when the driver's
    /// `max_volumes_per_node` are in use and it is not one of them.
    fn reserve_slot(&self, driver: &str, volume: &UniqueVolumeName) -> Result<Slot, VolumeError> {
        let limit = self.clients.registry().max_volumes_per_node(driver);
        let slot = self
            .limits
            .reserve(driver, volume, limit)
            .inspect_err(|e| {
                tracing::warn!(%volume, error = %e, "CSI volume refused: node volume limit");
            })?;
        Ok(slot)
    }

    /// Counts the volume `spec` of `pod`, found at start-up, as in use.
    fn adopt(&self, pod: &PodUid, spec: &VolumeSpec) {
        if let Ok(src) = source(spec) {
            self.limits
                .adopt(&src.driver, &self.unique_volume_name(pod, spec));
        }
    }

    /// How many volumes of `driver` are in use on the node (staged,
    /// published, or being set up).
    pub fn volumes_in_use(&self, driver: &str) -> usize {
        self.limits.in_use(driver)
    }

    /// Gets the tokens of CSIDriver `tokenRequests` from `tokens`' source,
    /// and republishes `requiresRepublish` drivers' volumes every
    /// `republish_period` through its schedule (which wakes the reconciler).
    pub fn with_tokens(
        mut self,
        tokens: Arc<crate::plugins::token::TokenRefresh>,
        republish_period: std::time::Duration,
    ) -> Self {
        self.tokens = Some(tokens);
        self.republish_period = republish_period;
        self
    }

    /// After a publish: a `requiresRepublish` volume is due again in one
    /// period.
    fn schedule_republish(&self, volume: &UniqueVolumeName, src: &CsiVolumeSource) {
        if let (true, Some(t)) = (src.driver_info.requires_republish, &self.tokens) {
            t.schedule(volume, self.republish_period);
        }
    }

    /// The kubelet's `podServiceAccountTokenAttrs`: for a driver whose
    /// CSIDriver has `tokenRequests`, a token per audience bound to the pod,
    /// as `{"<audience>": {"token": ..., "expirationTimestamp": ...}}` for
    /// the `csi.storage.k8s.io/serviceAccount.tokens` volume context key.
    async fn service_account_tokens(
        &self,
        src: &CsiVolumeSource,
    ) -> Result<Option<String>, VolumeError> {
        let info = &src.driver_info;
        let Some(pod) = info
            .token_pod
            .as_ref()
            .filter(|_| !info.token_requests.is_empty())
        else {
            return Ok(None);
        };
        let failed = |message: String| VolumeError::Plugin {
            plugin: PLUGIN_NAME.into(),
            message,
        };
        let source = self.tokens.as_ref().and_then(|t| t.source()).ok_or_else(|| {
            failed(format!(
                "CSIDriver {} asks for service account tokens (tokenRequests): no token source is configured (--token-file DIR, or the API source)",
                src.driver
            ))
        })?;
        let mut out = serde_json::Map::new();
        for r in &info.token_requests {
            let req = crate::plugins::token::TokenRequest {
                namespace: pod.namespace.clone(),
                service_account: pod.service_account.clone(),
                audience: r.audience.clone(),
                expiration_seconds: r.expiration_seconds,
                pod_name: pod.pod_name.clone(),
                pod_uid: pod.pod_uid.clone(),
                service_account_uid: pod.service_account_uid.clone(),
            };
            let t = source
                .request(&req)
                .await
                .map_err(|e| failed(format!("tokenRequests (audience {:?}): {e}", r.audience)))?;
            out.insert(
                r.audience.clone(),
                serde_json::json!({
                    "token": t.token,
                    "expirationTimestamp": crate::cache::out_of_band::rfc3339(t.expiration),
                }),
            );
        }
        Ok(Some(serde_json::Value::Object(out).to_string()))
    }

    /// The clients (for the agent's metrics).
    pub fn clients(&self) -> &Arc<CsiClients> {
        &self.clients
    }

    /// The absolute path of `rel`.
    fn abs(&self, rel: &RelPath) -> PathBuf {
        self.root.abs(rel)
    }

    fn write_vol_data(
        &self,
        rel: &RelPath,
        data: &BTreeMap<&str, String>,
    ) -> Result<(), VolumeError> {
        let json = serde_json::to_vec(data)
            .map_err(|e| VolumeError::Internal(format!("encoding vol_data.json: {e}")))?;
        self.root.write_file(rel, &json)?;
        Ok(())
    }

    /// The `vol_data.json` of a filesystem volume's publish directory.
    fn write_publish_vol_data(
        &self,
        spec: &VolumeSpec,
        src: &CsiVolumeSource,
        layout: &PublishLayout,
    ) -> Result<(), VolumeError> {
        let mut data = BTreeMap::new();
        data.insert(key::SPEC_VOL_ID, spec_vol_id(spec, src).to_string());
        data.insert(key::VOLUME_HANDLE, src.volume_handle.clone());
        data.insert(key::DRIVER_NAME, src.driver.clone());
        data.insert(key::NODE_NAME, self.node_name.clone());
        let lifecycle = if src.ephemeral {
            "Ephemeral"
        } else {
            "Persistent"
        };
        data.insert(key::LIFECYCLE_MODE, lifecycle.to_string());
        data.insert(key::OUTER_NAME, spec.name.clone());
        data.insert(key::READ_ONLY, src.read_only.to_string());
        vol_data::insert_selinux_label(&mut data, src, self.selinux);
        self.write_vol_data(&layout.data_dir.join(VOL_DATA_FILE)?, &data)
    }

    /// Whether the mount table confirms the publish of `spec` at `mount`:
    /// something is mounted there and, when the volume's staging path is a
    /// mount point, it is a mount of the same device (a driver that binds
    /// the staging path gives the pod the node's disk when the stage is
    /// gone: such a publish is not the volume).
    fn published_in_table(
        &self,
        spec: &VolumeSpec,
        mount: &std::path::Path,
        table: &MountTable,
    ) -> bool {
        let Some(published) = table.top(mount) else {
            return false;
        };
        let staged = source(spec)
            .ok()
            .filter(|src| !src.ephemeral)
            .and_then(|src| stage_layout(spec, src).ok())
            .and_then(|l| table.top(&self.abs(&l.target)));
        staged.is_none_or(|s| (s.major, s.minor) == (published.major, published.minor))
    }

    /// A block volume's publish target and global map entry for the pod
    /// whose view of it is `link` (`ROOT/pods/<uid>/volumeDevices/...`).
    fn block_mounts(
        &self,
        spec: &VolumeSpec,
        link: &std::path::Path,
    ) -> Option<(PathBuf, PathBuf)> {
        let rest = link.strip_prefix(self.root.path().join("pods")).ok()?;
        let uid = PodUid::new(rest.iter().next()?.to_str()?).ok()?;
        let layout = publish_layout(&uid, spec, source(spec).ok()?).ok()?;
        Some((self.abs(&layout.target), self.abs(&layout.global_map?)))
    }

    fn remove_file(&self, rel: &RelPath) -> Result<(), VolumeError> {
        match self.root.remove_all(rel) {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The driver's node capabilities (asked once per connection).
    async fn capabilities(&self, driver: &str) -> Result<NodeCapabilities, VolumeError> {
        match self.clients.node_capabilities(driver).await {
            Ok(c) => Ok(c),
            Err(e) => classify(CsiOp::Query, e).map(|()| NodeCapabilities::default()),
        }
    }

    /// Whether the driver stages volumes (asked once per connection).
    async fn stages(&self, driver: &str) -> Result<bool, VolumeError> {
        Ok(self.capabilities(driver).await?.stage_unstage)
    }
}

/// The kubelet's `needSELinuxRelabel` of a published CSI volume at `path`:
/// no when the host has no SELinux (`selinux`), for a raw block volume, and
/// for one mounted with its SELinux label (`context=`, so it is labelled
/// already); otherwise `GetSELinuxSupport`: whether the mount holding
/// `path` in the mount `table` says `seclabel`. A table that cannot be read
/// is a no (the kubelet makes the mount uncertain), with a warning.
fn need_selinux_relabel(
    selinux: bool,
    src: &CsiVolumeSource,
    path: &std::path::Path,
    table: impl FnOnce() -> Result<
        Vec<crate::sys::mountinfo::MountInfo>,
        crate::sys::mountinfo::MountInfoError,
    >,
) -> bool {
    if !selinux
        || src.volume_mode == CsiVolumeMode::Block
        || src.driver_info.selinux_mount_label.is_some()
    {
        return false;
    }
    match table() {
        Ok(t) => crate::sys::selinux::mount_supports_labels(true, &t, path),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "SELinux support of a CSI volume's mount unknown: the mount table could not be read");
            false
        }
    }
}

/// The CSI source of `spec`.
fn source(spec: &VolumeSpec) -> Result<&CsiVolumeSource, VolumeError> {
    match &spec.source {
        VolumeSource::Csi(c) => Ok(c),
        _ => Err(VolumeError::InvalidSpec("not a CSI volume".into())),
    }
}

/// The kubelet's `specVolID`: the PV name, or the pod's volume name inline.
fn spec_vol_id<'a>(spec: &'a VolumeSpec, src: &'a CsiVolumeSource) -> &'a str {
    src.pv_name.as_deref().unwrap_or(&spec.name)
}

/// The volume capability of a request to a driver with `caps`:
/// `mount_group` is `volume_mount_group` (the pod's fsGroup for drivers
/// with `VOLUME_MOUNT_GROUP`, empty otherwise), and with `selinux` (the
/// host has SELinux) a volume with an SELinux mount label gets it as
/// `context="..."` in its mount flags, as the kubelet's
/// `AddSELinuxMountOption`.
fn capability(
    src: &CsiVolumeSource,
    caps: NodeCapabilities,
    mount_group: String,
    selinux: bool,
) -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType};
    let access_type = match src.volume_mode {
        CsiVolumeMode::Block => AccessType::Block(csi::volume_capability::BlockVolume {}),
        CsiVolumeMode::Filesystem => {
            let mut mount_flags = src.mount_options.clone();
            if let Some(label) = src
                .driver_info
                .selinux_mount_label
                .as_ref()
                .filter(|_| selinux)
            {
                mount_flags.push(format!("context={label:?}"));
            }
            AccessType::Mount(csi::volume_capability::MountVolume {
                fs_type: src.fs_type.clone().unwrap_or_default(),
                mount_flags,
                volume_mount_group: mount_group,
            })
        }
    };
    csi::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: access_mode(src.access_mode, caps.single_node_multi_writer) as i32,
        }),
        access_type: Some(access_type),
    }
}

/// The CSI access mode of a PV access mode, as the kubelet's
/// `getNodeAccessModeMapper` picks it: ReadWriteOnce and ReadWriteOncePod
/// (`SingleNodeWriter` and `SingleNodeSingleWriter` here) become
/// `SINGLE_NODE_MULTI_WRITER` and `SINGLE_NODE_SINGLE_WRITER` only for a
/// driver with the `SINGLE_NODE_MULTI_WRITER` capability; for any other,
/// both are `SINGLE_NODE_WRITER` (which such a driver understands).
fn access_mode(
    mode: CsiAccessMode,
    single_node_multi_writer: bool,
) -> csi::volume_capability::access_mode::Mode {
    use csi::volume_capability::access_mode::Mode;
    match (mode, single_node_multi_writer) {
        (CsiAccessMode::SingleNodeWriter, true) => Mode::SingleNodeMultiWriter,
        (CsiAccessMode::SingleNodeSingleWriter, true) => Mode::SingleNodeSingleWriter,
        (CsiAccessMode::SingleNodeWriter | CsiAccessMode::SingleNodeSingleWriter, false) => {
            Mode::SingleNodeWriter
        }
        (CsiAccessMode::SingleNodeReaderOnly, _) => Mode::SingleNodeReaderOnly,
        (CsiAccessMode::MultiNodeReaderOnly, _) => Mode::MultiNodeReaderOnly,
        (CsiAccessMode::MultiNodeSingleWriter, _) => Mode::MultiNodeSingleWriter,
        (CsiAccessMode::MultiNodeMultiWriter, _) => Mode::MultiNodeMultiWriter,
    }
}

fn secrets(s: &Option<Arc<CsiSecrets>>) -> HashMap<String, String> {
    s.as_ref()
        .map(|s| s.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

fn context(src: &CsiVolumeSource) -> HashMap<String, String> {
    let mut c: HashMap<String, String> = src
        .volume_attributes
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if src.ephemeral {
        c.insert("csi.storage.k8s.io/ephemeral".into(), "true".into());
    }
    c
}

/// How often a `requiresRepublish` driver's volume is published again by
/// default: the kubelet's pod sync period (`--sync-frequency`, 1 minute).
pub const DEFAULT_REPUBLISH_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// The volume context key of CSIDriver `tokenRequests`' tokens.
pub const SERVICE_ACCOUNT_TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// NodePublishVolume's volume context: the volume's, plus the pod's
/// information when the driver's CSIDriver asks for it (`podInfoOnMount`)
/// and its service account tokens (`tokenRequests`).
fn publish_volume_context(
    src: &CsiVolumeSource,
    tokens: Option<String>,
) -> HashMap<String, String> {
    let mut c = context(src);
    c.extend(
        src.driver_info
            .pod_info
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    if let Some(t) = tokens {
        c.insert(SERVICE_ACCOUNT_TOKENS_KEY.into(), t);
    }
    c
}

/// The `publish_context` of NodeStage and NodePublish: the
/// VolumeAttachment's attachment metadata (empty for drivers that do not
/// attach).
fn publish_context(src: &CsiVolumeSource) -> HashMap<String, String> {
    src.driver_info
        .publish_context
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn path_string(p: PathBuf) -> Result<String, VolumeError> {
    p.into_os_string()
        .into_string()
        .map_err(|p| VolumeError::InvalidSpec(format!("path {p:?} is not UTF-8")))
}

impl CsiPlugin {
    /// NodePublishVolume: the body of [`VolumePlugin::set_up`].
    async fn publish(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        let src = source(&req.spec)?;
        let layout = publish_layout(&req.pod_uid, &req.spec, src)?;
        let caps = self.capabilities(&src.driver).await?;
        let stages = caps.stage_unstage;
        let staging = if stages && !src.ephemeral {
            path_string(self.abs(&stage_layout(&req.spec, src)?.target))?
        } else {
            String::new()
        };
        // The CO makes the target's parent; the driver makes the target.
        let parent = layout
            .target
            .split_last()
            .map(|(p, _)| p)
            .ok_or_else(|| VolumeError::Internal("empty publish path".into()))?;
        self.root.mkdir_all(&parent, 0o750)?;
        if layout.pod_link.is_none() {
            self.write_publish_vol_data(&req.spec, src, &layout)?;
        }
        self.remove_file(&layout.marker)?;
        let target = self.abs(&layout.target);
        if let Some(link) = &layout.pod_link {
            // The pod's view first: at start-up it is how an attempted
            // publish is found (and, without the record, uncertain).
            link_block_device(&self.root, link, &target)?;
        }
        let call = csi::NodePublishVolumeRequest {
            volume_id: src.volume_handle.clone(),
            publish_context: publish_context(src),
            staging_target_path: staging,
            target_path: path_string(target.clone())?,
            volume_capability: Some(capability(
                src,
                caps,
                fs_group::mount_group(req.fs_group, src, caps),
                self.selinux,
            )),
            readonly: src.read_only,
            secrets: secrets(&src.node_publish_secrets),
            volume_context: publish_volume_context(src, self.service_account_tokens(src).await?),
        };
        if let Err(e) = self.clients.node_publish_volume(&src.driver, call).await {
            let classified = match classify(CsiOp::Publish, e) {
                // Inline volumes are never staged: nothing to stage again.
                Err(VolumeError::NeedsDeviceMount(message)) if src.ephemeral => {
                    Err(VolumeError::Plugin {
                        plugin: PLUGIN_NAME.into(),
                        message,
                    })
                }
                r => r,
            };
            if let Err(err) = classified {
                if !matches!(err, VolumeError::Uncertain(_)) {
                    self.remove_mount_dir(&layout);
                }
                return Err(err);
            }
        }
        fs_group::apply(&req, src, caps, &target).await?;
        // Block: the record holds the pod's name of the volume (the link
        // is named after the PV), for reconstruction.
        let record = match &layout.pod_link {
            None => "",
            Some(_) => {
                self.map_block_device(&layout)?;
                req.spec.name.as_str()
            }
        };
        self.root
            .write_file(&layout.marker, record.as_bytes())
            .map_err(|e| VolumeError::Uncertain(e.to_string()))?;
        self.schedule_republish(&req.volume_name, src);
        Ok(match &layout.pod_link {
            None => target,
            Some(link) => self.abs(link),
        })
    }

    /// The kubelet's `removeMountDir` after a NodePublishVolume that
    /// finished with an error (not one whose outcome is unknown): the target
    /// directory (unless it is a mount point or not empty), then
    /// `vol_data.json` and the volume's directory, so that nothing is left
    /// that an orphaned pod's clean-up, which only removes empty
    /// directories, would have to keep. Block volumes keep their layout
    /// (their link is how a publish is found at start-up).
    fn remove_mount_dir(&self, layout: &PublishLayout) {
        if layout.pod_link.is_some() {
            return;
        }
        match self.root.remove_empty_dir(&layout.target) {
            Ok(true) => {}
            // Mounted or not empty: the driver did something; keep it all.
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(error = %e, "removing the publish target after a failed publish");
                return;
            }
        }
        let cleaned = layout
            .data_dir
            .join(VOL_DATA_FILE)
            .map_err(VolumeError::from)
            .and_then(|f| self.remove_file(&f))
            .and_then(|()| {
                self.root
                    .remove_empty_dir(&layout.data_dir)
                    .map_err(VolumeError::from)
            });
        if let Err(e) = cleaned {
            tracing::warn!(error = %e, "removing vol_data.json after a failed publish");
        }
    }

    /// NodeUnpublishVolume.
    async fn unpublish(&self, req: UnmountRequest) -> Result<(), VolumeError> {
        let src = source(&req.spec)?;
        let layout = publish_layout(&req.pod_uid, &req.spec, src)?;
        self.remove_file(&layout.marker)?;
        // The kubelet unmaps the device before it unpublishes it.
        if let Some(entry) = &layout.global_map {
            self.unmap_global(entry)?;
        }
        let call = csi::NodeUnpublishVolumeRequest {
            volume_id: src.volume_handle.clone(),
            target_path: path_string(self.abs(&layout.target))?,
        };
        if let Err(e) = self.clients.node_unpublish_volume(&src.driver, call).await {
            classify(CsiOp::Unpublish, e)?;
        }
        // Never crosses a mount the driver left behind: that fails instead.
        match &layout.pod_link {
            None => self.root.remove_all(&layout.data_dir)?,
            Some(link) => {
                self.root.remove_all(&layout.target)?;
                if let Some(old) = &layout.legacy_link {
                    remove_link_to(&self.root, old, &self.abs(&layout.target))?;
                }
                // Last: until now, it is how a restart finds the volume.
                self.remove_file(link)?;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl VolumePlugin for CsiPlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn can_support(&self, source: &VolumeSource) -> bool {
        matches!(source, VolumeSource::Csi(_))
    }

    /// PV volumes: `kubernetes.io/csi/<driver>^<volumeHandle>`, shared by
    /// every pod using it; inline volumes: one per pod.
    fn unique_volume_name(&self, pod: &PodUid, spec: &VolumeSpec) -> UniqueVolumeName {
        match &spec.source {
            VolumeSource::Csi(c) if !c.ephemeral => {
                UniqueVolumeName::new(format!("{PLUGIN_NAME}/{}^{}", c.driver, c.volume_handle))
            }
            _ => UniqueVolumeName::per_pod(PLUGIN_NAME, pod, &spec.name),
        }
    }

    /// The kubelet's `RequiresRemount` for CSI: a `requiresRepublish`
    /// driver's volume whose period is up, or whose pod's ServiceAccount
    /// was replaced (tokens bound to the old one are refused: publish
    /// fresh ones now).
    fn requires_remount(
        &self,
        volume: &UniqueVolumeName,
        mounted: &VolumeSpec,
        desired: &VolumeSpec,
    ) -> bool {
        let VolumeSource::Csi(c) = &desired.source else {
            return false;
        };
        if !c.driver_info.requires_republish {
            return false;
        }
        let account = |s: &VolumeSource| match s {
            VolumeSource::Csi(c) => c
                .driver_info
                .token_pod
                .as_ref()
                .map(|t| t.service_account_uid.clone()),
            _ => None,
        };
        account(&mounted.source) != account(&desired.source)
            || self.tokens.as_ref().is_some_and(|t| t.is_due(volume))
    }

    fn metric_label(&self, spec: &VolumeSpec) -> Option<crate::metrics::PluginLabel> {
        source(spec).ok().map(|c| crate::metrics::PluginLabel {
            name: format!("{PLUGIN_NAME}:{}", c.driver).into(),
            migrated: c.migrated_from.is_some(),
        })
    }

    fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin> {
        Some(self)
    }

    /// The kubelet's `CanAttach` ([`CsiVolumeSource::can_attach`]): a
    /// volume from a PersistentVolume, unless the driver's CSIDriver says
    /// `attachRequired: false`; never an inline volume.
    fn can_attach(&self, spec: &VolumeSpec) -> bool {
        source(spec).is_ok_and(|s| s.can_attach())
    }

    fn node_expandable(&self) -> Option<&dyn NodeExpandableVolumePlugin> {
        Some(self)
    }

    /// NodePublishVolume (the kubelet's `csiMountMgr.SetUpAt`). An inline
    /// volume has no device phase: its publish starts its use of the node,
    /// within the driver's volume limit.
    async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        let src = source(&req.spec)?;
        if !src.ephemeral {
            return self.publish(req).await;
        }
        let slot = self.reserve_slot(&src.driver, &req.volume_name)?;
        let res = self.publish(req).await;
        slot.settle(&res);
        res
    }

    /// NodeUnpublishVolume (the kubelet's `csiMountMgr.TearDownAt`); an
    /// inline volume is no longer in use on the node.
    async fn tear_down(&self, req: UnmountRequest) -> Result<(), VolumeError> {
        let src = source(&req.spec)?;
        let (driver, ephemeral) = (src.driver.clone(), src.ephemeral);
        let volume = req.volume_name.clone();
        self.unpublish(req).await?;
        if ephemeral {
            self.limits.release(&driver, &volume);
        }
        Ok(())
    }

    fn verify_reads_mount_table(&self, spec: &VolumeSpec) -> bool {
        // Filesystem volumes (and specs that do not parse: the safe answer).
        !matches!(
            source(spec).map(|s| s.volume_mode),
            Ok(CsiVolumeMode::Block)
        )
    }

    /// `csiMountMgr.needSELinuxRelabel`, decided once the volume is
    /// published (see [`need_selinux_relabel`]).
    fn selinux_relabel(&self, spec: &VolumeSpec, path: &std::path::Path) -> bool {
        source(spec).is_ok_and(|src| {
            need_selinux_relabel(self.selinux, src, path, crate::sys::mountinfo::read_self)
        })
    }

    fn mount_id(&self, pod: &PodUid, spec: &VolumeSpec) -> Option<u64> {
        let src = source(spec).ok()?;
        let layout = publish_layout(pod, spec, src).ok()?;
        // Filesystem: the publish target, where the driver mounted. Block:
        // the pod's global map entry, the manager's bind of the device.
        let at = match src.volume_mode {
            CsiVolumeMode::Filesystem => layout.target,
            CsiVolumeMode::Block => layout.global_map?,
        };
        crate::plugins::mount_id_at(&self.root, self.mounter.as_ref(), &at)
    }

    fn verify(&self, spec: &VolumeSpec, path: &std::path::Path, table: MountTableView<'_>) -> bool {
        match source(spec).map(|s| s.volume_mode) {
            Ok(CsiVolumeMode::Filesystem) => table.holds(|t| t.is_mount_point(path)),
            // The pod's view is a symlink: the publish target and the
            // pod's global map entry are what must be mounted.
            Ok(CsiVolumeMode::Block) => match self.block_mounts(spec, path) {
                Some((target, global)) => {
                    table.holds(|t| t.is_mount_point(&target) && t.is_mount_point(&global))
                }
                None => true,
            },
            Err(_) => true,
        }
    }

    fn volumes_dir_name(&self) -> Option<String> {
        Some(escape_plugin_name(PLUGIN_NAME))
    }

    fn reconstruct_block_volumes(
        &self,
        pod: &PodUid,
        table: &MountTable,
    ) -> Result<Vec<ReconstructedVolume>, VolumeError> {
        self.block_volumes_of(pod, table)
    }

    /// A publish directory found at start-up: the spec from its
    /// `vol_data.json`; complete only with the published record and the
    /// mount in the table, from the staged device when that is mounted
    /// (see [`CsiPlugin::published_in_table`]). Its volume is in use on the
    /// node.
    fn reconstruct(
        &self,
        pod: &PodUid,
        volume: &str,
        table: &MountTable,
    ) -> Result<Option<ReconstructedVolume>, VolumeError> {
        let dir = RelPath::new([
            "pods",
            pod.as_str(),
            "volumes",
            &escape_plugin_name(PLUGIN_NAME),
            volume,
        ])?;
        let data = read_vol_data(&self.root, &dir.join(VOL_DATA_FILE)?)?;
        let get = |k: &str| {
            data.get(k)
                .cloned()
                .ok_or_else(|| VolumeError::InvalidSpec(format!("vol_data.json has no {k}")))
        };
        let ephemeral = data.get(key::LIFECYCLE_MODE).map(String::as_str) == Some("Ephemeral");
        let spec_vol_id = get(key::SPEC_VOL_ID)?;
        let outer = data
            .get(key::OUTER_NAME)
            .cloned()
            .unwrap_or_else(|| spec_vol_id.clone());
        let mut src = CsiVolumeSource {
            ephemeral,
            pv_name: (!ephemeral).then_some(spec_vol_id),
            read_only: data.get(key::READ_ONLY).map(String::as_str) == Some("true"),
            ..reconstructed_source(
                get(key::DRIVER_NAME)?,
                get(key::VOLUME_HANDLE)?,
                CsiVolumeMode::Filesystem,
            )
        };
        vol_data::recorded_selinux_label(&mut src, &data);
        let mount = dir.join("mount")?;
        let spec = VolumeSpec {
            name: outer,
            source: VolumeSource::Csi(Box::new(src)),
        };
        let complete = self.root.exists(&dir.join(PUBLISHED_FILE)?)?
            && self.published_in_table(&spec, &self.abs(&mount), table);
        self.adopt(pod, &spec);
        Ok(Some(ReconstructedVolume {
            spec,
            path: self.abs(&mount),
            complete,
        }))
    }
}

#[async_trait::async_trait]
impl NodeExpandableVolumePlugin for CsiPlugin {
    fn requested_size(&self, spec: &VolumeSpec) -> Option<u64> {
        source(spec).ok().and_then(|s| s.capacity_bytes)
    }

    fn claim_size(&self, spec: &VolumeSpec) -> Option<u64> {
        source(spec).ok().and_then(|s| s.claim_capacity_bytes)
    }

    /// NodeExpandVolume, when the driver has EXPAND_VOLUME (otherwise there
    /// is nothing to do on the node); records the new size with the stage.
    async fn node_expand(&self, req: NodeExpandRequest) -> Result<(), VolumeError> {
        let src = source(&req.spec)?;
        let caps = match self.clients.node_capabilities(&src.driver).await {
            Ok(c) => c,
            Err(e) => return classify(CsiOp::Query, e),
        };
        let layout = stage_layout(&req.spec, src)?;
        if caps.expand {
            let required = i64::try_from(req.new_size)
                .map_err(|_| VolumeError::InvalidSpec("size out of range".into()))?;
            let call = csi::NodeExpandVolumeRequest {
                volume_id: src.volume_handle.clone(),
                volume_path: path_string(req.volume_path.clone())?,
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: required,
                    limit_bytes: 0,
                }),
                staging_target_path: if caps.stage_unstage {
                    path_string(self.abs(&layout.target))?
                } else {
                    String::new()
                },
                volume_capability: Some(capability(src, caps, String::new(), self.selinux)),
                secrets: secrets(&src.node_expand_secrets),
            };
            if let Err(e) = self.clients.node_expand_volume(&src.driver, call).await {
                classify(CsiOp::Expand, e)?;
            }
        }
        let staged = layout.data_dir.join(STAGED_FILE)?;
        if self.root.exists(&staged)? {
            let record = serde_json::to_vec(&StagedRecord {
                capacity_bytes: Some(req.new_size),
            })
            .map_err(VolumeError::Encode)?;
            self.root.write_file(&staged, &record)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// `needSELinuxRelabel`: only on an SELinux host, for a filesystem
    /// volume not mounted with its label, whose mount says `seclabel`.
    #[test]
    fn selinux_relabel_is_decided_by_the_mount() {
        use crate::sys::mountinfo::parse;
        let table = |opts: &'static str| {
            move || {
                parse(&format!(
                    "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:9 / /p/mount rw - xfs /dev/sdb {opts}\n"
                ))
            }
        };
        let path = std::path::Path::new("/p/mount");
        let fs = super::CsiVolumeSource::new("d", "h");
        assert!(super::need_selinux_relabel(
            true,
            &fs,
            path,
            table("rw,seclabel")
        ));
        assert!(!super::need_selinux_relabel(true, &fs, path, table("rw")));
        assert!(!super::need_selinux_relabel(
            false,
            &fs,
            path,
            table("rw,seclabel")
        ));
        let labelled = super::CsiVolumeSource {
            driver_info: std::sync::Arc::new(crate::volume::CsiDriverInfo {
                selinux_mount_label: Some("system_u:object_r:container_file_t:s0:c1,c2".into()),
                ..Default::default()
            }),
            ..fs.clone()
        };
        assert!(!super::need_selinux_relabel(
            true,
            &labelled,
            path,
            table("rw,seclabel")
        ));
        let block = super::CsiVolumeSource {
            volume_mode: super::CsiVolumeMode::Block,
            ..fs.clone()
        };
        assert!(!super::need_selinux_relabel(
            true,
            &block,
            path,
            table("rw,seclabel")
        ));
        let unreadable = || parse("not a mountinfo line\n");
        assert!(!super::need_selinux_relabel(true, &fs, path, unreadable));
    }

    use super::*;
    use crate::volume::CsiDriverInfo;
    use csi::volume_capability::access_mode::Mode;
    use csi::volume_capability::AccessType;

    fn caps(single_node_multi_writer: bool) -> NodeCapabilities {
        NodeCapabilities {
            single_node_multi_writer,
            ..NodeCapabilities::default()
        }
    }

    fn mode(src: &CsiVolumeSource, snmw: bool) -> Mode {
        let c = capability(src, caps(snmw), String::new(), false);
        c.access_mode.unwrap().mode()
    }

    fn flags(c: &csi::VolumeCapability) -> Vec<String> {
        match &c.access_type {
            Some(AccessType::Mount(m)) => m.mount_flags.clone(),
            other => panic!("not a mount capability: {other:?}"),
        }
    }

    /// ReadWriteOnce and ReadWriteOncePod are told apart only for a driver
    /// with SINGLE_NODE_MULTI_WRITER; others get SINGLE_NODE_WRITER for
    /// both (a driver without the capability refuses the new modes).
    #[test]
    fn access_modes_follow_the_single_node_multi_writer_capability() {
        let rwo = CsiVolumeSource::new("d", "h");
        let rwop = CsiVolumeSource {
            access_mode: CsiAccessMode::SingleNodeSingleWriter,
            ..CsiVolumeSource::new("d", "h")
        };
        assert_eq!(mode(&rwo, false), Mode::SingleNodeWriter);
        assert_eq!(mode(&rwop, false), Mode::SingleNodeWriter);
        assert_eq!(mode(&rwo, true), Mode::SingleNodeMultiWriter);
        assert_eq!(mode(&rwop, true), Mode::SingleNodeSingleWriter);
        let rwx = CsiVolumeSource {
            access_mode: CsiAccessMode::MultiNodeMultiWriter,
            ..CsiVolumeSource::new("d", "h")
        };
        assert_eq!(mode(&rwx, true), Mode::MultiNodeMultiWriter);
        assert_eq!(mode(&rwx, false), Mode::MultiNodeMultiWriter);
    }

    /// The SELinux label is a quoted `context=` mount flag after the PV's
    /// own options, only on a host with SELinux.
    #[test]
    fn selinux_label_is_a_context_mount_flag_on_selinux_hosts() {
        let src = CsiVolumeSource {
            mount_options: vec!["noatime".into()],
            driver_info: Arc::new(CsiDriverInfo {
                selinux_mount_label: Some("system_u:object_r:container_file_t:s0:c1,c2".into()),
                ..CsiDriverInfo::default()
            }),
            ..CsiVolumeSource::new("d", "h")
        };
        let on = capability(&src, caps(false), String::new(), true);
        assert_eq!(
            flags(&on),
            vec![
                "noatime".to_string(),
                r#"context="system_u:object_r:container_file_t:s0:c1,c2""#.to_string()
            ]
        );
        let off = capability(&src, caps(false), String::new(), false);
        assert_eq!(flags(&off), vec!["noatime".to_string()]);
        let plain = CsiVolumeSource::new("d", "h");
        assert!(flags(&capability(&plain, caps(false), String::new(), true)).is_empty());
    }
}
