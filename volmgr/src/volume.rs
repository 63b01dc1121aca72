//! Names and specs of volumes, in the kubelet's vocabulary.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// A validated pod UID: safe to use as one path component.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(Arc<str>);

/// Why a pod UID or volume name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The pod UID is empty, too long, or holds characters outside `[A-Za-z0-9._-]`
    /// (in particular `/`, `..` or NUL).
    #[error(
        "invalid pod UID {0:?}: must be 1-128 characters of [A-Za-z0-9._-], not \".\" or \"..\""
    )]
    PodUid(String),
    /// A volume name that is not an RFC 1123 DNS label.
    #[error("invalid volume name {0:?}: must be a DNS label (at most 63 characters of [a-z0-9-], starting and ending with an alphanumeric)")]
    VolumeName(String),
}

impl PodUid {
    /// Validates `uid`.
    pub fn new(uid: &str) -> Result<Self, NameError> {
        check_pod_uid(uid)?;
        Ok(Self(uid.into()))
    }

    /// The UID derived for a pod that has none: a name-based UUID (SHA-256 of
    /// namespace and name, version 8 layout), stable across restarts.
    pub fn derive(namespace: &str, name: &str) -> Self {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(b"volmgr-pod\0");
        h.update(namespace.as_bytes());
        h.update(b"\0");
        h.update(name.as_bytes());
        let d = h.finalize();
        let mut b = [0u8; 16];
        b.copy_from_slice(&d[..16]);
        b[6] = (b[6] & 0x0f) | 0x80;
        b[8] = (b[8] & 0x3f) | 0x80;
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        let s = format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        );
        Self(s.into())
    }

    /// The UID as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Lets maps keyed by `PodUid` be queried with a `&str` (no allocation).
impl std::borrow::Borrow<str> for PodUid {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// For an in-tree volume type this manager cannot mount (the kubelet
/// mounts it with a node tool, a kernel client or a vendor binary), what to
/// use instead: its CSI driver. `None` for other kinds.
pub fn in_tree_alternative(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "iscsi" => "iSCSI has no in-tree support here (no iscsiadm logins); use an iSCSI CSI driver (iscsi.csi.k8s.io from kubernetes-csi/csi-driver-iscsi, or the storage vendor's)",
        "fc" => "Fibre Channel has no in-tree support here (no SCSI host rescans); use the storage vendor's Fibre Channel CSI driver",
        "rbd" => "Ceph RBD has no in-tree support (removed from the kubelet in 1.31); use Ceph CSI (rbd.csi.ceph.com)",
        "cephfs" => "CephFS has no in-tree support (removed from the kubelet in 1.31); use Ceph CSI (cephfs.csi.ceph.com)",
        "glusterfs" => "GlusterFS has no in-tree support (removed from the kubelet in 1.26); use a GlusterFS CSI driver",
        "flexVolume" => "FlexVolume drivers are not run; use the CSI driver of the storage",
        "flocker" | "quobyte" | "storageos" | "scaleIO" | "photonPersistentDisk" => {
            "this in-tree type was removed from Kubernetes; use its CSI driver"
        }
        _ => return None,
    })
}

/// Checks a pod UID without allocating: 1-128 characters of `[A-Za-z0-9._-]`,
/// not `.` or `..` (so never `/`, `..` as a component, or NUL).
pub fn check_pod_uid(uid: &str) -> Result<(), NameError> {
    let ok = !uid.is_empty()
        && uid.len() <= 128
        && uid != "."
        && uid != ".."
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(NameError::PodUid(uid.to_string()))
    }
}

/// Checks a volume name: an RFC 1123 DNS label, as the API server requires.
pub fn check_volume_name(name: &str) -> Result<(), NameError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err(NameError::VolumeName(name.to_string()))
    }
}

/// One `volumeMount` with a `subPath` (or an expanded `subPathExpr`): the
/// container, the mount's index in its `volumeMounts`, and the path inside
/// the volume that the container sees there. The bind mount for it is
/// `ROOT/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubPath {
    /// The container's name (a DNS label, so a path component).
    pub container: String,
    /// The index of the `volumeMount` in the container's `volumeMounts`.
    pub index: usize,
    /// The path inside the volume (relative, without `..`).
    pub path: String,
}

/// Which containers' subPaths the reconciler prepares on its own once
/// their volume is set up. The kubelet prepares a container's subPaths when
/// that container starts (`makeMounts`), after the init containers before
/// it ran; the others wait for `VolumeManager::prepare_sub_paths` (the C
/// ABI's `volmgr_prepare_sub_paths`, called at container start).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SubPathRelease {
    /// Every container's, right after the volume's set-up (a pod without
    /// status to go by: the manifests directory).
    #[default]
    All,
    /// Only these containers' (the API source: those whose init containers
    /// before them have finished; the C ABI: none).
    Containers(Arc<[String]>),
}

impl SubPathRelease {
    /// No container's: all wait to be asked for.
    pub fn none() -> Self {
        Self::Containers(Arc::from(Vec::new()))
    }

    /// Whether `container`'s subPaths are prepared without being asked.
    pub fn releases(&self, container: &str) -> bool {
        match self {
            Self::All => true,
            Self::Containers(c) => c.iter().any(|n| n == container),
        }
    }
}

/// The kubelet's `UniqueVolumeName`: the key of a volume in both worlds.
/// For volumes that are not attachable it includes the pod
/// (`kubernetes.io/empty-dir/<podUID>-<volume>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UniqueVolumeName(Arc<str>);

impl UniqueVolumeName {
    /// Wraps a name.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(name.into())
    }

    /// The name of a per-pod volume of `plugin`.
    pub fn per_pod(plugin: &str, pod: &PodUid, volume: &str) -> Self {
        Self(format!("{plugin}/{pod}-{volume}").into())
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UniqueVolumeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `emptyDir.medium`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageMedium {
    /// The node's default storage (a directory under ROOT).
    Default,
    /// `Memory`: a tmpfs.
    Memory,
}

/// `hostPath.type`, with Kubernetes' semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathType {
    /// `""`: no check.
    Unset,
    /// Create an empty directory (0755) if nothing exists.
    DirectoryOrCreate,
    /// A directory must exist.
    Directory,
    /// Create an empty file (0644) if nothing exists.
    FileOrCreate,
    /// A regular file must exist.
    File,
    /// A UNIX socket must exist.
    Socket,
    /// A character device must exist.
    CharDevice,
    /// A block device must exist.
    BlockDevice,
}

impl HostPathType {
    /// Parses the API string.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "" => Self::Unset,
            "DirectoryOrCreate" => Self::DirectoryOrCreate,
            "Directory" => Self::Directory,
            "FileOrCreate" => Self::FileOrCreate,
            "File" => Self::File,
            "Socket" => Self::Socket,
            "CharDevice" => Self::CharDevice,
            "BlockDevice" => Self::BlockDevice,
            _ => return None,
        })
    }

    /// The API string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unset => "",
            Self::DirectoryOrCreate => "DirectoryOrCreate",
            Self::Directory => "Directory",
            Self::FileOrCreate => "FileOrCreate",
            Self::File => "File",
            Self::Socket => "Socket",
            Self::CharDevice => "CharDevice",
            Self::BlockDevice => "BlockDevice",
        }
    }
}

/// The source of a volume, as far as the manager understands it.
#[derive(Debug, Clone, PartialEq)]
pub enum VolumeSource {
    /// `emptyDir`.
    EmptyDir {
        /// Where it lives.
        medium: StorageMedium,
        /// `sizeLimit` in bytes (the tmpfs size for `Memory`).
        size_limit: Option<u64>,
    },
    /// `hostPath`.
    HostPath {
        /// The absolute path on the node.
        path: PathBuf,
        /// The check to make (and what to create).
        kind: HostPathType,
    },
    /// `csi` (inline ephemeral) or a `persistentVolumeClaim` bound to a CSI
    /// PersistentVolume, resolved to what the CSI driver needs. Boxed: it
    /// is five times the size of the other sources, and every volume's
    /// spec would carry that size (kept per volume in the desired state).
    Csi(Box<CsiVolumeSource>),
    /// `image` (KEP-4639): an OCI image or artifact the container runtime
    /// pulls and mounts itself; the volume manager has nothing to do.
    Image {
        /// `image.reference`.
        reference: String,
        /// `image.pullPolicy`, if given.
        pull_policy: Option<String>,
    },
    /// A `persistentVolumeClaim` bound to a local PersistentVolume
    /// (`spec.local`).
    Local(LocalVolumeSource),
    /// `configMap`, `secret`, `downwardAPI` or `projected`: files computed
    /// from objects and the pod, written by the atomic writer.
    Payload(Arc<PayloadVolumeSource>),
    /// Any other source (`nfs`, `iscsi`, ...), kept as the API JSON so a
    /// plugin registered at run time (e.g. through the C ABI) can claim it.
    Other {
        /// The source's field name (`configMap`).
        kind: String,
        /// The whole `v1.Volume` as JSON.
        spec: Arc<serde_json::Value>,
    },
}

impl VolumeSource {
    /// The API field name of the source (`emptyDir`, `hostPath`, ...).
    pub fn kind(&self) -> &str {
        match self {
            Self::EmptyDir { .. } => "emptyDir",
            Self::HostPath { .. } => "hostPath",
            Self::Csi(c) if c.ephemeral => "csi",
            Self::Csi(_) | Self::Local(_) => "persistentVolumeClaim",
            Self::Image { .. } => "image",
            Self::Payload(p) => p.kind.as_str(),
            Self::Other { kind, .. } => kind,
        }
    }
}

/// Which of the four payload volume types a [`PayloadVolumeSource`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadKind {
    /// `configMap` (on the pod's directory).
    ConfigMap,
    /// `secret` (on a tmpfs).
    Secret,
    /// `downwardAPI` (on the pod's directory).
    DownwardApi,
    /// `projected` (on a tmpfs).
    Projected,
}

impl PayloadKind {
    /// The API field name (`configMap`, `secret`, `downwardAPI`, `projected`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConfigMap => "configMap",
            Self::Secret => "secret",
            Self::DownwardApi => "downwardAPI",
            Self::Projected => "projected",
        }
    }

    /// Whether the volume lives on a tmpfs (the kubelet's memory-backed
    /// wrapper: secret and projected), so its bytes never touch a disk.
    pub fn on_tmpfs(self) -> bool {
        matches!(self, Self::Secret | Self::Projected)
    }
}

/// One file of a payload volume.
#[derive(Clone, PartialEq, Eq)]
pub struct PayloadFile {
    /// The contents.
    pub data: Arc<[u8]>,
    /// The file mode (permission bits; `defaultMode` or the item's `mode`).
    pub mode: u32,
    /// The file's owner, when not the writer (the kubelet's
    /// `FileProjection.FsUser`: service account tokens of a pod whose
    /// containers all run as one user).
    pub fs_user: Option<u32>,
}

/// A projected `serviceAccountToken` source: not resolvable from objects,
/// the token is requested from the [`TokenSource`] at set-up (the kubelet's
/// TokenRequest bound to the pod).
///
/// [`TokenSource`]: crate::plugins::token::TokenSource
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenProjection {
    /// Where the token is written (relative, checked).
    pub path: String,
    /// `audience` (empty: the API server's).
    pub audience: String,
    /// `expirationSeconds` (default 3600).
    pub expiration_seconds: i64,
    /// The pod's namespace.
    pub namespace: String,
    /// `spec.serviceAccountName` (default `default`).
    pub service_account: String,
    /// The ServiceAccount's UID when the source knows the object (empty
    /// otherwise): a new UID (the account was replaced) changes the volume,
    /// so its tokens are requested again at once.
    pub service_account_uid: String,
    /// The pod's name (the token's bound object).
    pub pod_name: String,
    /// The pod's UID (the token's bound object).
    pub pod_uid: String,
    /// The file mode: `defaultMode`, or 0600 when the pod has an `fsUser`
    /// or an `fsGroup` (the kubelet's `projected.go`; the `fsGroup` then
    /// adds group read).
    pub mode: u32,
    /// The file's owner: the kubelet's `FsUser`, the `runAsUser` every
    /// container of the pod runs as (`volume/util.FsUserFrom`), if any.
    pub fs_user: Option<u32>,
}

/// A `configMap`, `secret`, `downwardAPI` or `projected` volume, resolved:
/// every file with its bytes and mode, plus the token requests a projected
/// volume makes at set-up. `Debug` prints paths, never bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct PayloadVolumeSource {
    /// Which volume type.
    pub kind: PayloadKind,
    /// Relative path (checked: no `..`, not absolute) → file.
    pub files: std::collections::BTreeMap<String, PayloadFile>,
    /// Service account tokens to request and write (projected only).
    pub tokens: Vec<TokenProjection>,
}

impl PayloadVolumeSource {
    /// A content digest (hex SHA-256 of paths, modes, bytes and token
    /// requests): the volume's content generation.
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for (p, f) in &self.files {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p.as_bytes());
            h.update(f.mode.to_le_bytes());
            h.update((f.data.len() as u64).to_le_bytes());
            h.update(&f.data);
        }
        for t in &self.tokens {
            h.update(format!("{t:?}").as_bytes());
        }
        h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl fmt::Debug for PayloadVolumeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PayloadVolumeSource")
            .field("kind", &self.kind)
            .field("files", &self.files.keys().collect::<Vec<_>>())
            .field("tokens", &self.tokens)
            .finish()
    }
}

/// `volumeMode` of a PersistentVolume (inline CSI volumes are always `Filesystem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CsiVolumeMode {
    /// Mounted as a filesystem (the default).
    Filesystem,
    /// Published as a raw block device file.
    Block,
}

/// CSI access mode (`VolumeCapability.AccessMode.Mode`), derived from the PV's
/// first `accessModes` entry: ReadWriteOnce → SingleNodeWriter,
/// ReadOnlyMany → MultiNodeReaderOnly, ReadWriteMany → MultiNodeMultiWriter,
/// ReadWriteOncePod → SingleNodeSingleWriter. What a driver is sent also
/// depends on its `SINGLE_NODE_MULTI_WRITER` capability (the CSI plugin's
/// `access_mode`, as the kubelet's access mode mapper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CsiAccessMode {
    /// `SINGLE_NODE_WRITER` (1).
    SingleNodeWriter,
    /// `SINGLE_NODE_READER_ONLY` (2).
    SingleNodeReaderOnly,
    /// `MULTI_NODE_READER_ONLY` (3).
    MultiNodeReaderOnly,
    /// `MULTI_NODE_SINGLE_WRITER` (4).
    MultiNodeSingleWriter,
    /// `MULTI_NODE_MULTI_WRITER` (5).
    MultiNodeMultiWriter,
    /// ReadWriteOncePod: `SINGLE_NODE_SINGLE_WRITER` (6) for a driver with
    /// the SINGLE_NODE_MULTI_WRITER capability, else `SINGLE_NODE_WRITER`.
    SingleNodeSingleWriter,
}

/// Secret data resolved from a Secret object (`data` base64-decoded, plus
/// `stringData`). `Debug` and `Display` print only the keys, never the values.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct CsiSecrets(pub std::collections::BTreeMap<String, String>);

impl fmt::Debug for CsiSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, "<redacted>")))
            .finish()
    }
}

impl fmt::Display for CsiSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("secrets {")?;
        for (i, k) in self.0.keys().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}: <redacted>")?;
        }
        f.write_str("}")
    }
}

/// A CSI volume, inline or from a PersistentVolume, with everything the CSI
/// plugin needs to stage, publish and expand it.
#[derive(Debug, Clone, PartialEq)]
pub struct CsiVolumeSource {
    /// The CSI driver name.
    pub driver: String,
    /// PV: `spec.csi.volumeHandle`. Inline ephemeral: the kubelet's generated
    /// handle (`"csi-"` + hex SHA-256 of pod UID + volume name).
    pub volume_handle: String,
    /// Inline (`pod.spec.volumes[].csi`) rather than a PV.
    pub ephemeral: bool,
    /// The PersistentVolume's name (None for inline volumes).
    pub pv_name: Option<String>,
    /// The PersistentVolumeClaim the pod named (`persistentVolumeClaim.claimName`,
    /// or a generic ephemeral volume's `<pod>-<volume>`), in the pod's
    /// namespace; None for inline volumes and specs read back from disk.
    /// Labels the volume's `kubelet_volume_stats_*` metrics.
    pub claim_name: Option<String>,
    /// Mount read-only (pod `readOnly`, inline `readOnly`, or PV `spec.csi.readOnly`).
    pub read_only: bool,
    /// `fsType`, if given.
    pub fs_type: Option<String>,
    /// Filesystem or raw block.
    pub volume_mode: CsiVolumeMode,
    /// The access mode passed in the volume capability.
    pub access_mode: CsiAccessMode,
    /// `volumeAttributes` (the volume context).
    pub volume_attributes: std::collections::BTreeMap<String, String>,
    /// PV `spec.mountOptions`.
    pub mount_options: Vec<String>,
    /// PV `spec.capacity.storage` in bytes: the size wanted (the kubelet's
    /// `DesiredPersistentVolumeSize`; beyond the size the file system has →
    /// NodeExpandVolume).
    pub capacity_bytes: Option<u64>,
    /// The claim's `status.capacity.storage` in bytes: the size its file
    /// system is known to have (the kubelet compares it with the PV's
    /// capacity to expand during mount, and starts its record of the
    /// mounted size from it). None for inline volumes and claims without a
    /// status (manifests usually have none).
    pub claim_capacity_bytes: Option<u64>,
    /// From `spec.csi.nodeStageSecretRef`.
    pub node_stage_secrets: Option<Arc<CsiSecrets>>,
    /// From `spec.csi.nodePublishSecretRef` (inline: `nodePublishSecretRef`).
    pub node_publish_secrets: Option<Arc<CsiSecrets>>,
    /// From `spec.csi.nodeExpandSecretRef`.
    pub node_expand_secrets: Option<Arc<CsiSecrets>>,
    /// The PersistentVolume's `pv.beta.kubernetes.io/gid` annotation parsed
    /// as an integer (None without it, for an invalid value, and for inline
    /// volumes): a group the pod's containers get (the kubelet's
    /// `VolumeGIDValue`, see `GetExtraSupplementalGroupsForPod`).
    pub supplemental_gid: Option<i64>,
    /// What the driver's CSIDriver object (and the volume's
    /// VolumeAttachment) adds; the default without a CSIDriver object.
    pub driver_info: Arc<CsiDriverInfo>,
    /// The in-tree plugin (`kubernetes.io/aws-ebs`) whose volume this was
    /// translated from by CSI migration; `None` for a CSI volume. Its
    /// operations are labelled `migrated="true"`, as the kubelet's.
    pub migrated_from: Option<&'static str>,
}

impl CsiVolumeSource {
    /// A persistent filesystem volume `volume_handle` of `driver`, published
    /// ReadWriteOnce, with nothing else set (callers set the rest with
    /// struct update syntax).
    pub fn new(driver: impl Into<String>, volume_handle: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            volume_handle: volume_handle.into(),
            ephemeral: false,
            pv_name: None,
            claim_name: None,
            read_only: false,
            fs_type: None,
            volume_mode: CsiVolumeMode::Filesystem,
            access_mode: CsiAccessMode::SingleNodeWriter,
            volume_attributes: Default::default(),
            mount_options: Vec::new(),
            capacity_bytes: None,
            claim_capacity_bytes: None,
            node_stage_secrets: None,
            node_publish_secrets: None,
            node_expand_secrets: None,
            supplemental_gid: None,
            driver_info: Default::default(),
            migrated_from: None,
        }
    }

    /// The kubelet's `csiPlugin.CanAttach`: a volume from a
    /// PersistentVolume is attachable unless its driver's CSIDriver says
    /// `attachRequired: false` (no CSIDriver: attachable); an inline
    /// (ephemeral) volume never is.
    pub fn can_attach(&self) -> bool {
        !self.ephemeral && !self.driver_info.skip_attach
    }
}

/// What a CSI driver's `CSIDriver` object says about one volume (the
/// kubelet's `pkg/volume/csi` reads it at mount time), and the
/// VolumeAttachment's `status.attachmentMetadata` for drivers that attach.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CsiDriverInfo {
    /// `spec.fsGroupPolicy`.
    pub fs_group_policy: CsiFsGroupPolicy,
    /// With `spec.podInfoOnMount`: the `csi.storage.k8s.io/pod.*`,
    /// `serviceAccount.name` and `ephemeral` keys added to
    /// NodePublishVolume's volume context (never to NodeStageVolume's).
    pub pod_info: std::collections::BTreeMap<String, String>,
    /// The VolumeAttachment's `status.attachmentMetadata`: the
    /// `publish_context` of NodeStageVolume and NodePublishVolume.
    pub publish_context: std::collections::BTreeMap<String, String>,
    /// `spec.tokenRequests`: service account tokens for the driver, passed
    /// in NodePublishVolume's volume context
    /// (`csi.storage.k8s.io/serviceAccount.tokens`), with the pod they are
    /// bound to.
    pub token_requests: Vec<CsiTokenRequest>,
    /// The pod the tokens are bound to (set with `token_requests`).
    pub token_pod: Option<CsiTokenPod>,
    /// `spec.requiresRepublish`: NodePublishVolume is called again
    /// periodically on the mounted volume (new tokens, rotated secrets).
    pub requires_republish: bool,
    /// `spec.seLinuxMount: true`: the driver can mount a volume with an
    /// SELinux context (the kubelet's `SupportsSELinuxContextMount`).
    pub selinux_mount: bool,
    /// The SELinux file label to mount the volume with (`context="..."` in
    /// NodeStage's and NodePublish's mount flags; the kubelet's
    /// `MounterArgs.SELinuxLabel`): set by the desired state's admission
    /// (`cache::selinux`), only on hosts with SELinux, for a driver with
    /// `seLinuxMount`, a PersistentVolume that supports SELinux mounts and
    /// a pod whose containers give it one label.
    pub selinux_mount_label: Option<String>,
    /// `spec.attachRequired: false` (the kubelet's `skipAttach`): the
    /// driver's volumes are not attachable, so they are not in the node's
    /// `volumesInUse` and never wait to be reported there.
    pub skip_attach: bool,
}

/// One of a CSIDriver's `spec.tokenRequests`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiTokenRequest {
    /// `audience` (empty: the API server's default audiences).
    pub audience: String,
    /// `expirationSeconds` (the API server's default, one hour, if unset).
    pub expiration_seconds: i64,
}

/// The pod a CSI volume's service account tokens are bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiTokenPod {
    /// The pod's namespace.
    pub namespace: String,
    /// `spec.serviceAccountName` (`default` if unset).
    pub service_account: String,
    /// The ServiceAccount's UID when known (empty otherwise); a new one
    /// makes a `requiresRepublish` driver's volume published again at once.
    pub service_account_uid: String,
    /// The pod's name.
    pub pod_name: String,
    /// The pod's UID.
    pub pod_uid: String,
}

/// `CSIDriver.spec.fsGroupPolicy`: who applies the pod's fsGroup when the
/// driver cannot (no `VOLUME_MOUNT_GROUP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CsiFsGroupPolicy {
    /// The kubelet walks the volume if it has a file system type and is
    /// ReadWriteOnce (or inline); the default, also without a CSIDriver.
    #[default]
    ReadWriteOnceWithFsType,
    /// Always (unless read-only).
    File,
    /// Never.
    None,
}

/// A local PersistentVolume (`spec.local`): a directory (or a block device)
/// on the node, bind-mounted into the pod's volume directory.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalVolumeSource {
    /// The PersistentVolume's name (the volume's directory name).
    pub pv_name: String,
    /// `spec.local.path`: absolute and clean, outside ROOT. Empty when
    /// reconstructed (the mount table does not tell it).
    pub path: PathBuf,
    /// Bind-mount read-only (the pod's `readOnly` on the claim).
    pub read_only: bool,
    /// Filesystem (bind mount) or Block (symlink to the device).
    pub volume_mode: CsiVolumeMode,
}

/// A volume of a pod: its name in the pod (the "outer volume spec name") and source.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeSpec {
    /// `pod.spec.volumes[].name`.
    pub name: String,
    /// What to mount.
    pub source: VolumeSource,
}

impl VolumeSpec {
    /// The kubelet's `VolumeSpec.ReadOnly`: set for a read-only CSI or local
    /// volume (claim, PV or inline `readOnly`) and for payload volumes (configMap,
    /// secret, downwardAPI, projected); false for every other source (the
    /// containers' `volumeMounts[].readOnly` is per mount, not per volume).
    pub fn read_only(&self) -> bool {
        match &self.source {
            VolumeSource::Csi(c) => c.read_only,
            VolumeSource::Local(l) => l.read_only,
            // The kubelet's configMap, secret, downwardAPI and projected
            // mounters are read-only to the pod.
            VolumeSource::Payload(_) => true,
            _ => false,
        }
    }

    /// Whether the container runtime may relabel the volume for SELinux,
    /// as far as the spec tells (the kubelet's mounters' `GetAttributes`,
    /// `SELinuxRelabel`): yes for emptyDir, configMap, secret, downwardAPI,
    /// projected, local and image volumes; no for hostPath and volumes of
    /// host plugins. A CSI volume's answer depends on its mount, known only
    /// once it is published (`needSELinuxRelabel`, see
    /// `VolumePlugin::selinux_relabel`): no here.
    pub fn supports_selinux_relabel(&self) -> bool {
        match &self.source {
            VolumeSource::EmptyDir { .. }
            | VolumeSource::Payload(_)
            | VolumeSource::Local(_)
            | VolumeSource::Image { .. } => true,
            VolumeSource::HostPath { .. } | VolumeSource::Csi(_) | VolumeSource::Other { .. } => {
                false
            }
        }
    }

    /// Whether the volume is a raw block device (`volumeDevices`), whose
    /// path is a device file rather than a directory.
    pub fn is_block(&self) -> bool {
        matches!(&self.source, VolumeSource::Csi(c) if c.volume_mode == CsiVolumeMode::Block)
    }

    /// The PersistentVolume's GID annotation, if any (see
    /// [`CsiVolumeSource::supplemental_gid`]).
    pub fn supplemental_gid(&self) -> Option<i64> {
        match &self.source {
            VolumeSource::Csi(c) => c.supplemental_gid,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kubelet's `GetAttributes().SELinuxRelabel` per volume type.
    #[test]
    fn selinux_relabel_follows_the_kubelets_mounters() {
        let spec = |source| VolumeSpec {
            name: "v".into(),
            source,
        };
        let payload = |kind| {
            VolumeSource::Payload(Arc::new(PayloadVolumeSource {
                kind,
                files: Default::default(),
                tokens: Vec::new(),
            }))
        };
        let yes = [
            VolumeSource::EmptyDir {
                medium: StorageMedium::Memory,
                size_limit: None,
            },
            payload(PayloadKind::ConfigMap),
            payload(PayloadKind::Secret),
            payload(PayloadKind::DownwardApi),
            payload(PayloadKind::Projected),
            VolumeSource::Local(LocalVolumeSource {
                pv_name: "pv".into(),
                path: "/mnt/disk".into(),
                read_only: false,
                volume_mode: CsiVolumeMode::Filesystem,
            }),
            VolumeSource::Image {
                reference: "r".into(),
                pull_policy: None,
            },
        ];
        for s in yes {
            assert!(spec(s.clone()).supports_selinux_relabel(), "{s:?}");
        }
        let no = [
            VolumeSource::HostPath {
                path: "/x".into(),
                kind: HostPathType::Unset,
            },
            VolumeSource::Csi(Box::new(CsiVolumeSource::new("d", "h"))),
            VolumeSource::Other {
                kind: "nfs".into(),
                spec: Arc::new(serde_json::Value::Null),
            },
        ];
        for s in no {
            assert!(!spec(s.clone()).supports_selinux_relabel(), "{s:?}");
        }
    }

    #[test]
    fn secrets_never_print_values() {
        let s = CsiSecrets(
            [("password".to_string(), "hunter2".to_string())]
                .into_iter()
                .collect(),
        );
        let (d, f) = (format!("{s:?}"), format!("{s}"));
        assert!(d.contains("password") && f.contains("password"), "{d} {f}");
        assert!(!d.contains("hunter2") && !f.contains("hunter2"), "{d} {f}");
        let src = CsiVolumeSource {
            node_stage_secrets: Some(Arc::new(s)),
            ..CsiVolumeSource::new("d", "h")
        };
        assert!(!format!("{:?}", VolumeSource::Csi(Box::new(src))).contains("hunter2"));
    }

    /// Every volume's spec is kept once in the desired state (and shared
    /// with the actual state): a CSI source, five times the size of the
    /// others, is boxed so the rest do not pay for it (a 280-byte spec made
    /// 0.3 KiB of the agent's 3.2 KiB per emptyDir volume).
    #[test]
    fn a_volume_spec_stays_small() {
        assert!(
            std::mem::size_of::<VolumeSpec>() <= 96,
            "VolumeSpec is {} bytes",
            std::mem::size_of::<VolumeSpec>()
        );
    }
}

/// The pod's `spec.securityContext.fsGroupChangePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsGroupChangePolicy {
    /// `Always` (the default): walk the whole volume.
    #[default]
    Always,
    /// `OnRootMismatch`: walk only if the root's group or bits differ.
    OnRootMismatch,
}

impl FsGroupChangePolicy {
    /// From the API's value (`None` or anything unknown is `Always`, as the
    /// kubelet treats it).
    pub fn from_api(v: Option<&str>) -> Self {
        match v {
            Some("OnRootMismatch") => Self::OnRootMismatch,
            _ => Self::Always,
        }
    }
}
