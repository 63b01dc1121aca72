//! `configMap`, `secret`, `downwardAPI` and `projected` volumes (the
//! kubelet's `kubernetes.io/configmap`, `kubernetes.io/secret`,
//! `kubernetes.io/downward-api` and `kubernetes.io/projected` plugins): one
//! plugin type, four registrations. The payload is resolved by the populator
//! ([`PayloadVolumeSource`]); set-up makes the volume directory (a tmpfs for
//! secret and projected volumes, so secret bytes never touch a disk; a
//! directory on ROOT's disk for configMap and downwardAPI), asks the
//! [`TokenSource`](super::token::TokenSource) for projected
//! `serviceAccountToken` files, and hands the files to the
//! [atomic writer](super::atomic_writer).
//!
//! Updates go through the reconciler's remount path (the kubelet's
//! `RequiresRemount`): when the desired payload differs from the mounted one,
//! or a token is due for a refresh, set-up runs again on the mounted volume
//! and the writer swaps the new payload in (nothing is rewritten when the
//! bytes did not change).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::sys::mount_table::{MountTable, MountTableView};
use crate::sys::root_dir::{PathError, RelPath, RootDir};
use crate::sys::Mounter;
use crate::util::sync::MutexExt;
use crate::volume::{
    PayloadFile, PayloadKind, PayloadVolumeSource, PodUid, UniqueVolumeName, VolumeSource,
    VolumeSpec,
};

use super::atomic_writer::{self, Ownership, WriteOutcome, WriterError};
use super::empty_dir::{mount_tmpfs_once, tear_down_dir};
use super::token::{refresh_after, TokenError, TokenRefresh, TokenRequest};
use super::{
    escape_plugin_name, BlockingPool, MountRequest, ReconstructedVolume, UnmountRequest,
    VolumeError, VolumePlugin,
};

/// The plugin name of each payload kind.
pub fn plugin_name(kind: PayloadKind) -> &'static str {
    match kind {
        PayloadKind::ConfigMap => "kubernetes.io/configmap",
        PayloadKind::Secret => "kubernetes.io/secret",
        PayloadKind::DownwardApi => "kubernetes.io/downward-api",
        PayloadKind::Projected => "kubernetes.io/projected",
    }
}

/// What a payload volume holds now: its content generation (the payload's
/// digest), how many times it was (re)written, and when last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadState {
    /// The digest of the payload written ([`PayloadVolumeSource::digest`]).
    pub generation: String,
    /// How many set-ups wrote a new payload directory.
    pub writes: u64,
    /// When the last one did.
    pub last_update: SystemTime,
}

/// The state of every payload volume set up, shared by the four plugins
/// (status and metrics read it).
#[derive(Debug, Default)]
pub struct PayloadStates(Mutex<BTreeMap<UniqueVolumeName, PayloadState>>);

impl PayloadStates {
    /// A copy of every volume's state.
    pub fn snapshot(&self) -> BTreeMap<UniqueVolumeName, PayloadState> {
        self.0.locked().clone()
    }

    fn record(&self, volume: &UniqueVolumeName, generation: String, written: bool) {
        let mut m = self.0.locked();
        let now = SystemTime::now();
        let e = m.entry(volume.clone()).or_insert_with(|| PayloadState {
            generation: generation.clone(),
            writes: 0,
            last_update: now,
        });
        e.generation = generation;
        if written {
            e.writes += 1;
            e.last_update = now;
        }
    }

    /// `volume`'s content, for status.
    pub fn content_status(
        &self,
        volume: &UniqueVolumeName,
    ) -> Option<crate::status::ContentStatus> {
        let m = self.0.locked();
        let s = m.get(volume)?;
        Some(crate::status::ContentStatus {
            generation: s.generation.clone(),
            writes: s.writes,
            last_update: crate::cache::out_of_band::rfc3339(s.last_update),
        })
    }

    fn forget(&self, volume: &UniqueVolumeName) {
        self.0.locked().remove(volume);
    }

    /// `volmgr_payload_volume_writes_total{volume}` (payload directories
    /// written) and `volmgr_payload_volume_last_update_timestamp_seconds{volume}`,
    /// in the Prometheus text format.
    pub fn prometheus_text(&self) -> String {
        use std::fmt::Write;
        let m = self.0.locked();
        if m.is_empty() {
            return String::new();
        }
        let mut out = String::from(
            "# HELP volmgr_payload_volume_writes_total Payload directories written (content generations) of configMap, secret, downwardAPI and projected volumes.\n# TYPE volmgr_payload_volume_writes_total counter\n",
        );
        for (v, s) in m.iter() {
            let _ = writeln!(
                out,
                "volmgr_payload_volume_writes_total{{volume=\"{v}\",generation=\"{}\"}} {}",
                s.generation, s.writes
            );
        }
        out.push_str("# HELP volmgr_payload_volume_last_update_timestamp_seconds When the volume's payload was last written.\n# TYPE volmgr_payload_volume_last_update_timestamp_seconds gauge\n");
        for (v, s) in m.iter() {
            let t = s
                .last_update
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            let _ = writeln!(
                out,
                "volmgr_payload_volume_last_update_timestamp_seconds{{volume=\"{v}\"}} {t:.3}"
            );
        }
        out
    }
}

/// What the four payload plugins share.
#[derive(Clone)]
pub struct PayloadShared {
    /// The manager's root.
    pub root: Arc<RootDir>,
    /// Mounts the tmpfs of secret and projected volumes.
    pub mounter: Arc<dyn Mounter>,
    /// Runs the writes (they fsync).
    pub pool: Arc<BlockingPool>,
    /// The token source and refresh schedule.
    pub tokens: Arc<TokenRefresh>,
    /// Generation and update time of each volume.
    pub states: Arc<PayloadStates>,
}

/// The plugin of one payload kind.
pub struct PayloadPlugin {
    kind: PayloadKind,
    shared: PayloadShared,
}

impl PayloadPlugin {
    /// The plugin for `kind`.
    pub fn new(kind: PayloadKind, shared: PayloadShared) -> Self {
        Self { kind, shared }
    }

    /// `pods/<uid>/volumes/kubernetes.io~<kind>/<volume>`.
    fn volume_dir(&self, pod: &PodUid, volume: &str) -> Result<RelPath, PathError> {
        RelPath::new([
            "pods",
            pod.as_str(),
            "volumes",
            &escape_plugin_name(plugin_name(self.kind)),
            volume,
        ])
    }

    /// The payload with the token files added.
    async fn files_with_tokens(
        &self,
        p: &PayloadVolumeSource,
        volume: &str,
    ) -> Result<(BTreeMap<String, PayloadFile>, Option<std::time::Duration>), VolumeError> {
        let mut files = p.files.clone();
        let mut refresh: Option<std::time::Duration> = None;
        for t in &p.tokens {
            let source = self.shared.tokens.source().ok_or_else(|| {
                token_error(TokenError::NoSource(format!("in volume {volume:?}")))
            })?;
            let req = TokenRequest {
                namespace: t.namespace.clone(),
                service_account: t.service_account.clone(),
                audience: t.audience.clone(),
                expiration_seconds: t.expiration_seconds,
                pod_name: t.pod_name.clone(),
                pod_uid: t.pod_uid.clone(),
                service_account_uid: t.service_account_uid.clone(),
            };
            let token = source.request(&req).await.map_err(token_error)?;
            let after = refresh_after(token.expiration, SystemTime::now());
            refresh = Some(refresh.map_or(after, |r| r.min(after)));
            files.insert(
                t.path.clone(),
                PayloadFile {
                    data: token.token.into_bytes().into(),
                    mode: t.mode,
                    fs_user: t.fs_user,
                },
            );
        }
        Ok((files, refresh))
    }
}

fn token_error(e: TokenError) -> VolumeError {
    match e {
        TokenError::NoSource(_) => VolumeError::InvalidSpec(e.to_string()),
        _ => VolumeError::Waiting(e.to_string()),
    }
}

fn writer_error(e: WriterError) -> VolumeError {
    match e {
        WriterError::InvalidPath { .. } | WriterError::TooLarge { .. } => {
            VolumeError::InvalidSpec(e.to_string())
        }
        WriterError::Syscall(e) => VolumeError::Syscall(e),
        WriterError::Path(e) => VolumeError::Path(e),
    }
}

/// Makes the volume directory (mounting its tmpfs when `tmpfs`) and writes
/// `files` into it. Returns the path and whether a new payload was written.
fn set_up_sync(
    root: &RootDir,
    mounter: &dyn Mounter,
    rel: &RelPath,
    tmpfs: bool,
    files: &BTreeMap<String, PayloadFile>,
    owner: Ownership,
) -> Result<(PathBuf, bool), VolumeError> {
    let mut mounted_now = false;
    if tmpfs {
        mounted_now = mount_tmpfs_once(root, mounter, rel, Some("mode=0755"))?.mounted;
    } else {
        root.mkdir_all(rel, 0o755)?;
    }
    let write = || -> Result<(PathBuf, bool), VolumeError> {
        let top = match tmpfs {
            true => root.open_mount_target(rel)?,
            false => root.open_dir(rel)?,
        };
        let out = atomic_writer::write(root, &top, files, owner).map_err(writer_error)?;
        let mode = owner_dir_mode(owner);
        set_mode(&top, mode, owner)?;
        Ok((
            top.path().to_path_buf(),
            matches!(out, WriteOutcome::Written { .. }),
        ))
    };
    match write() {
        Err(e) if mounted_now => Err(VolumeError::Uncertain(e.to_string())),
        r => r,
    }
}

fn owner_dir_mode(owner: Ownership) -> u32 {
    match owner.fs_group {
        Some(_) => 0o2755,
        None => 0o755,
    }
}

/// The volume root's group and mode.
fn set_mode(top: &crate::sys::Target, mode: u32, owner: Ownership) -> Result<(), VolumeError> {
    use std::os::fd::AsFd;
    let fd = nix::fcntl::openat(
        top.as_fd(),
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| crate::sys::SyscallError::new("open", top.path(), e))?;
    if let Some(gid) = owner.fs_group {
        nix::unistd::fchown(&fd, None, Some(nix::unistd::Gid::from_raw(gid)))
            .map_err(|e| crate::sys::SyscallError::new("fchown", top.path(), e))?;
    }
    nix::sys::stat::fchmod(&fd, nix::sys::stat::Mode::from_bits_truncate(mode))
        .map_err(|e| crate::sys::SyscallError::new("fchmod", top.path(), e))?;
    Ok(())
}

#[async_trait::async_trait]
impl VolumePlugin for PayloadPlugin {
    fn name(&self) -> &str {
        plugin_name(self.kind)
    }

    fn can_support(&self, source: &VolumeSource) -> bool {
        matches!(source, VolumeSource::Payload(p) if p.kind == self.kind)
    }

    async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        let VolumeSource::Payload(p) = &req.spec.source else {
            return Err(VolumeError::InvalidSpec(format!(
                "not a {} volume",
                self.kind.as_str()
            )));
        };
        let fs_group = req
            .fs_group
            .map(|g| {
                u32::try_from(g)
                    .map_err(|_| VolumeError::InvalidSpec(format!("fsGroup {g} is out of range")))
            })
            .transpose()?;
        let (files, refresh) = self.files_with_tokens(p, &req.spec.name).await?;
        let rel = self.volume_dir(&req.pod_uid, &req.spec.name)?;
        let tmpfs = self.kind.on_tmpfs();
        let owner = Ownership { fs_group };
        let s = &self.shared;
        let (path, written) = s
            .pool
            .run_with(&s.root, &s.mounter, move |root, mounter| {
                set_up_sync(root, mounter, &rel, tmpfs, &files, owner)
            })
            .await?;
        match refresh {
            Some(after) => self.shared.tokens.schedule(&req.volume_name, after),
            None => self.shared.tokens.forget(&req.volume_name),
        }
        self.shared
            .states
            .record(&req.volume_name, p.digest(), written);
        Ok(path)
    }

    async fn tear_down(&self, req: UnmountRequest) -> Result<(), VolumeError> {
        let rel = self.volume_dir(&req.pod_uid, &req.spec.name)?;
        let s = &self.shared;
        s.pool
            .run_with(&s.root, &s.mounter, move |root, mounter| {
                tear_down_dir(root, mounter, &rel, None)
            })
            .await?;
        self.shared.tokens.forget(&req.volume_name);
        self.shared.states.forget(&req.volume_name);
        Ok(())
    }

    fn requires_remount(
        &self,
        volume: &UniqueVolumeName,
        mounted: &VolumeSpec,
        desired: &VolumeSpec,
    ) -> bool {
        mounted.source != desired.source || self.shared.tokens.is_due(volume)
    }

    fn verify(&self, _spec: &VolumeSpec, path: &Path, table: MountTableView<'_>) -> bool {
        match self.kind.on_tmpfs() {
            true => table.holds(|t| t.top(path).is_some_and(|m| m.fstype == "tmpfs")),
            false => path.is_dir(),
        }
    }

    fn verify_reads_mount_table(&self, _spec: &VolumeSpec) -> bool {
        self.kind.on_tmpfs()
    }

    fn mount_id(&self, pod: &PodUid, spec: &VolumeSpec) -> Option<u64> {
        if !self.kind.on_tmpfs() {
            return None;
        }
        let rel = self.volume_dir(pod, &spec.name).ok()?;
        super::mount_id_at(&self.shared.root, self.shared.mounter.as_ref(), &rel)
    }

    fn volumes_dir_name(&self) -> Option<String> {
        Some(escape_plugin_name(plugin_name(self.kind)))
    }

    fn reconstruct(
        &self,
        pod: &PodUid,
        volume: &str,
        _table: &MountTable,
    ) -> Result<Option<ReconstructedVolume>, VolumeError> {
        let rel = self.volume_dir(pod, volume)?;
        let source = VolumeSource::Payload(Arc::new(PayloadVolumeSource {
            kind: self.kind,
            files: BTreeMap::new(),
            tokens: Vec::new(),
        }));
        // The payload is not known from the disk: set up once more (the
        // writer rewrites nothing if it is the same), or torn down if no
        // longer wanted.
        let path = self.shared.root.abs(&rel);
        Ok(Some(ReconstructedVolume::named(
            volume, source, path, false,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::token::{Token, TokenSource};
    use crate::sys::fake::FakeMounter;
    use crate::volume::{PayloadFile, TokenProjection};
    use std::time::Duration;

    struct FixedTokens(Duration);

    #[async_trait::async_trait]
    impl TokenSource for FixedTokens {
        async fn request(&self, req: &TokenRequest) -> Result<Token, TokenError> {
            Ok(Token {
                token: format!("tok-{}-{}", req.namespace, req.service_account),
                expiration: SystemTime::now() + self.0,
            })
        }
    }

    fn setup(kind: PayloadKind) -> (tempfile::TempDir, PayloadShared, PayloadPlugin) {
        let t = tempfile::tempdir().unwrap();
        let shared = PayloadShared {
            root: Arc::new(RootDir::open(t.path()).unwrap()),
            mounter: Arc::new(FakeMounter::default()),
            pool: Arc::new(BlockingPool::new(2)),
            tokens: Arc::new(TokenRefresh::default()),
            states: Arc::new(PayloadStates::default()),
        };
        let p = PayloadPlugin::new(kind, shared.clone());
        (t, shared, p)
    }

    fn spec(kind: PayloadKind, value: &str, token: bool) -> Arc<VolumeSpec> {
        let files = [(
            "k".to_string(),
            PayloadFile {
                data: Arc::from(value.as_bytes()),
                mode: 0o644,
                fs_user: None,
            },
        )]
        .into();
        let tokens = match token {
            false => Vec::new(),
            true => vec![TokenProjection {
                path: "token".into(),
                audience: String::new(),
                expiration_seconds: 3600,
                namespace: "ns".into(),
                service_account: "sa".into(),
                service_account_uid: String::new(),
                pod_name: "p".into(),
                pod_uid: "pod1".into(),
                mode: 0o600,
                fs_user: None,
            }],
        };
        Arc::new(VolumeSpec {
            name: "v".into(),
            source: VolumeSource::Payload(Arc::new(PayloadVolumeSource {
                kind,
                files,
                tokens,
            })),
        })
    }

    fn req(kind: PayloadKind, spec: Arc<VolumeSpec>) -> MountRequest {
        let pod = PodUid::new("pod1").unwrap();
        MountRequest {
            volume_name: UniqueVolumeName::per_pod(plugin_name(kind), &pod, "v"),
            pod_uid: pod,
            spec,
            fs_group: None,
            fs_group_change_policy: Default::default(),
            selinux_label: None,
        }
    }

    #[tokio::test]
    async fn config_map_set_up_update_and_tear_down() {
        let (t, shared, p) = setup(PayloadKind::ConfigMap);
        let kind = PayloadKind::ConfigMap;
        let r = req(kind, spec(kind, "1", false));
        let path = p.set_up(r.clone()).await.unwrap();
        assert_eq!(
            path,
            t.path().join("pods/pod1/volumes/kubernetes.io~configmap/v")
        );
        assert_eq!(std::fs::read_to_string(path.join("k")).unwrap(), "1");
        // The same payload again: nothing written.
        p.set_up(r.clone()).await.unwrap();
        let st = shared.states.content_status(&r.volume_name).unwrap();
        assert_eq!(st.writes, 1);
        let (a, b) = (spec(kind, "1", false), spec(kind, "2", false));
        assert!(!p.requires_remount(&r.volume_name, &a, &a));
        assert!(p.requires_remount(&r.volume_name, &a, &b));
        p.set_up(req(kind, b)).await.unwrap();
        assert_eq!(std::fs::read_to_string(path.join("k")).unwrap(), "2");
        let st2 = shared.states.content_status(&r.volume_name).unwrap();
        assert_eq!(st2.writes, 2);
        assert_ne!(st.generation, st2.generation);
        let text = shared.states.prometheus_text();
        assert!(
            text.contains(
                "volmgr_payload_volume_writes_total{volume=\"kubernetes.io/configmap/pod1-v\""
            ),
            "{text}"
        );
        p.tear_down(UnmountRequest {
            pod_uid: r.pod_uid.clone(),
            volume_name: r.volume_name.clone(),
            spec: r.spec.clone(),
            path: path.clone(),
        })
        .await
        .unwrap();
        assert!(!path.exists());
        assert!(shared.states.content_status(&r.volume_name).is_none());
    }

    #[tokio::test]
    async fn tokens_need_a_source_and_are_refreshed() {
        let kind = PayloadKind::Projected;
        let (_t, shared, p) = setup(kind);
        let r = req(kind, spec(kind, "1", true));
        let e = p.set_up(r.clone()).await.unwrap_err().to_string();
        assert!(e.contains("--token-file"), "{e}");
        // A token that lives an hour: written, not due.
        shared
            .tokens
            .set_source(Arc::new(FixedTokens(Duration::from_secs(3600))));
        let path = p.set_up(r.clone()).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(path.join("token")).unwrap(),
            "tok-ns-sa"
        );
        assert!(!p.requires_remount(&r.volume_name, &r.spec, &r.spec));
        // An expired one: due at once, and the waker is called for it.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        shared.tokens.set_waker(Arc::new(move |v| {
            let _ = tx.send(v);
        }));
        shared
            .tokens
            .set_source(Arc::new(FixedTokens(Duration::ZERO)));
        p.set_up(r.clone()).await.unwrap();
        assert_eq!(rx.recv().await.unwrap(), r.volume_name);
        assert!(p.requires_remount(&r.volume_name, &r.spec, &r.spec));
    }
}
