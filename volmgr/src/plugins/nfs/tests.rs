//! The NFS plugin on the `Mounter` seam (this kernel has no NFS client:
//! `nfs` is not in `/proc/filesystems`, so no real mount is tested).

use super::*;
use crate::sys::fake::{Call, FakeMounter};

struct Setup {
    _t: tempfile::TempDir,
    root: PathBuf,
    mounter: Arc<FakeMounter>,
    plugin: NfsPlugin,
}

fn setup() -> Setup {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().canonicalize().unwrap().join("root");
    let root_dir = Arc::new(RootDir::open(&root).unwrap());
    let mounter = Arc::new(FakeMounter::default());
    let plugin = NfsPlugin::new(
        root_dir,
        Arc::clone(&mounter) as Arc<dyn Mounter>,
        Arc::new(BlockingPool::new(2)),
    );
    Setup {
        _t: t,
        root,
        mounter,
        plugin,
    }
}

fn pod() -> PodUid {
    PodUid::new("pod1").unwrap()
}

/// What the claim conversion makes of an NFS PersistentVolume.
fn pv_spec(read_only: bool) -> Arc<VolumeSpec> {
    Arc::new(VolumeSpec {
        name: "data".into(),
        source: VolumeSource::Other {
            kind: "nfs".into(),
            spec: Arc::new(serde_json::json!({
                "name": "pv-nfs",
                "nfs": {"server": "10.0.0.5", "path": "/exports/a"},
                "readOnly": read_only,
                "mountOptions": ["nfsvers=4.1", "hard"],
            })),
        },
    })
}

fn mount_req(p: &NfsPlugin, spec: Arc<VolumeSpec>) -> MountRequest {
    MountRequest {
        volume_name: p.unique_volume_name(&pod(), &spec),
        pod_uid: pod(),
        spec,
        fs_group: None,
        fs_group_change_policy: Default::default(),
        selinux_label: None,
    }
}

/// The kubelet's `mount -t nfs -o <sorted mountOptions + ro> server:/path
/// ROOT/pods/<uid>/volumes/kubernetes.io~nfs/<pv>`, as one mount(2).
#[tokio::test]
async fn mounts_server_path_with_the_pvs_options_and_ro() {
    let s = setup();
    let path = s
        .plugin
        .set_up(mount_req(&s.plugin, pv_spec(true)))
        .await
        .unwrap();
    assert_eq!(
        path,
        s.root.join("pods/pod1/volumes/kubernetes.io~nfs/pv-nfs")
    );
    let mounts: Vec<_> = s
        .mounter
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::Mount { .. }))
        .collect();
    assert_eq!(
        mounts,
        vec![Call::Mount {
            source: "10.0.0.5:/exports/a".into(),
            target: path.clone(),
            fstype: "nfs".into(),
            data: Some("hard,nfsvers=4.1,ro".into()),
        }]
    );
    // Set up again: already mounted, not mounted twice.
    s.plugin
        .set_up(mount_req(&s.plugin, pv_spec(true)))
        .await
        .unwrap();
    assert_eq!(s.mounter.mounted(), vec![path]);
}

/// Writable: no `ro`; an inline volume is named after the pod's volume.
#[tokio::test]
async fn an_inline_volume_is_named_after_the_pods_volume() {
    let s = setup();
    let spec = Arc::new(VolumeSpec {
        name: "shared".into(),
        source: VolumeSource::Other {
            kind: "nfs".into(),
            spec: Arc::new(
                serde_json::json!({"name": "shared", "nfs": {"server": "nfs.example", "path": "/x"}}),
            ),
        },
    });
    let path = s.plugin.set_up(mount_req(&s.plugin, spec)).await.unwrap();
    assert!(path.ends_with("pods/pod1/volumes/kubernetes.io~nfs/shared"));
    assert!(s.mounter.calls().iter().any(|c| matches!(c,
        Call::Mount { source, fstype, data, .. } if source == "nfs.example:/x" && fstype == "nfs" && data.is_none())));
}

/// ENODEV (no NFS in the kernel): the error says so and what to do.
#[tokio::test]
async fn enodev_names_the_kernels_missing_nfs_support() {
    let s = setup();
    s.mounter.fail_mounts(1, nix::errno::Errno::ENODEV);
    let e = s
        .plugin
        .set_up(mount_req(&s.plugin, pv_spec(false)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("this kernel has no NFS client"), "{e}");
    assert!(e.contains("nfs.csi.k8s.io"), "{e}");
}

/// After a restart an `nfs4` mount on the volume's directory is adopted
/// (complete, with the server and path of its source); a bare directory
/// is uncertain.
#[test]
fn reconstruct_adopts_an_nfs4_mount() {
    let s = setup();
    let dir = s.root.join("pods/pod1/volumes/kubernetes.io~nfs/pv-nfs");
    let line = format!(
        "812 29 0:77 / {} rw,relatime shared:400 - nfs4 10.0.0.5:/exports/a rw,vers=4.1,addr=10.0.0.5",
        dir.display()
    );
    let table = MountTable::new(vec![crate::sys::mountinfo::parse_line(&line).unwrap()]);
    let r = s
        .plugin
        .reconstruct(&pod(), "pv-nfs", &table)
        .unwrap()
        .unwrap();
    assert!(r.complete);
    assert_eq!(r.path, dir);
    let src = NfsSource::from_spec(&r.spec).unwrap();
    assert_eq!(
        (src.server.as_str(), src.path.as_str()),
        ("10.0.0.5", "/exports/a")
    );
    // Its unique name is the desired volume's (named after the PV).
    assert_eq!(
        s.plugin.unique_volume_name(&pod(), &r.spec),
        s.plugin.unique_volume_name(&pod(), &pv_spec(false))
    );
    let empty = MountTable::new(Vec::new());
    assert!(
        !s.plugin
            .reconstruct(&pod(), "pv-nfs", &empty)
            .unwrap()
            .unwrap()
            .complete
    );
}

/// The server is gone: the unmount blocks. The tear-down returns
/// uncertain after the timeout (the reconciler is not held), the mount is
/// detached lazily on another thread and the directory removed; the next
/// tear-down finds nothing left.
#[tokio::test]
async fn an_unmount_that_hangs_is_detached_and_left_uncertain() {
    let s = setup();
    let plugin = NfsPlugin {
        unmount_timeout: Duration::from_millis(200),
        ..s.plugin
    };
    let path = plugin
        .set_up(mount_req(&plugin, pv_spec(false)))
        .await
        .unwrap();
    s.mounter.hang_unmounts(true);
    let req = UnmountRequest {
        volume_name: plugin.unique_volume_name(&pod(), &pv_spec(false)),
        pod_uid: pod(),
        spec: pv_spec(false),
        path: path.clone(),
    };
    let e = plugin.tear_down(req.clone()).await.unwrap_err();
    assert!(matches!(e, VolumeError::Uncertain(_)), "{e}");
    assert!(e.to_string().contains("detached lazily"), "{e}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while path.exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!path.exists(), "detached and removed");
    assert!(s.mounter.mounted().is_empty());
    s.mounter.hang_unmounts(false);
    plugin.tear_down(req).await.unwrap();
}

/// An inline iSCSI or FC volume no plugin claims: the error names the type
/// and its CSI driver (before: only "no volume plugin supports iscsi
/// volumes on this node").
#[test]
fn unsupported_in_tree_types_name_their_csi_alternative() {
    let e =
        |kind: &str| super::super::PluginLookupError::NotFound { kind: kind.into() }.to_string();
    assert!(
        e("iscsi").starts_with("no volume plugin supports iscsi volumes on this node: "),
        "{}",
        e("iscsi")
    );
    assert!(e("iscsi").contains("iscsi.csi.k8s.io"), "{}", e("iscsi"));
    assert!(e("fc").contains("Fibre Channel CSI driver"), "{}", e("fc"));
    assert!(e("rbd").contains("rbd.csi.ceph.com"));
    assert_eq!(
        e("configMap"),
        "no volume plugin supports configMap volumes on this node"
    );
}
