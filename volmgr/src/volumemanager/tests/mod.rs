use super::*;

// Tests of lower layers through the whole manager (those layers do not see
// the manager): the reconciler, the tracer's mount-table checks, the pod
// resolver and the manifests source.
mod manifests;
mod reconciler;
mod reconciler_scenarios;
mod resolver;
mod tracer_check;

use crate::cache::actual_state_of_world::MountedPod;
use crate::sys::fake::{Call, FakeMounter};

fn pod(uid: &str, vols: &[(&str, serde_json::Value)]) -> Pod {
    let mounts: Vec<_> = vols
        .iter()
        .map(|(n, _)| serde_json::json!({"name": n, "mountPath": format!("/{n}")}))
        .collect();
    let volumes: Vec<_> = vols
        .iter()
        .map(|(n, src)| {
            let mut v = src.clone();
            v["name"] = serde_json::Value::from(*n);
            v
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "c", "volumeMounts": mounts}], "volumes": volumes}
    }))
    .unwrap()
}

fn mem() -> serde_json::Value {
    serde_json::json!({"emptyDir": {"medium": "Memory"}})
}

async fn manager() -> (tempfile::TempDir, Arc<FakeMounter>, Arc<VolumeManager>) {
    let t = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeMounter::default());
    let mut cfg = Config::new(t.path());
    cfg.backoff = Backoff::new(Duration::from_millis(20), 2, Duration::from_millis(100));
    let vm = VolumeManager::new(cfg, fake.clone()).unwrap();
    vm.start().await.unwrap();
    (t, fake, vm)
}

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_unmounts_and_cleans_up_through_the_seam() {
    let (t, fake, vm) = manager().await;
    let uid = vm.upsert_pod(&pod("a", &[("m", mem())])).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    let mounted = vm.mounted_volumes_for_pod(&uid);
    assert_eq!(mounted.len(), 1);
    assert_eq!(fake.mounted(), vec![mounted[0].path.clone()]);
    // An unchanged upsert starts nothing.
    vm.upsert_pod(&pod("a", &[("m", mem())])).unwrap();
    vm.wait_converged(Some(1), T).await.unwrap();
    assert_eq!(fake.calls().len(), 1);
    assert!(vm.reconciler_states_synced());
    assert!(vm.delete_pod(&uid));
    vm.wait_for_unmount(&uid, T).await.unwrap();
    assert!(fake.mounted().is_empty());
    assert!(matches!(fake.calls().last(), Some(Call::Unmount(_))));
    let pod_dir = t.path().canonicalize().unwrap().join("pods/a");
    for _ in 0..200 {
        if !pod_dir.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!pod_dir.exists(), "orphaned pod directory removed");
    vm.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_is_made_rshared_unless_turned_off_and_status_says_so() {
    let (t, fake, vm) = manager().await;
    assert_eq!(fake.rshared(), vec![t.path().canonicalize().unwrap()]);
    assert_eq!(vm.status().root_propagation, "rshared");
    assert!(fake.calls().is_empty(), "no mount call recorded for it");
    let fake = Arc::new(FakeMounter::default());
    let mut cfg = Config::new(t.path());
    cfg.make_root_shared = false;
    let vm = VolumeManager::new(cfg, fake.clone()).unwrap();
    assert!(fake.rshared().is_empty());
    assert_eq!(vm.status().root_propagation, "off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_volumes_are_mounted_with_nothing_to_do() {
    let (_t, fake, vm) = manager().await;
    let img = serde_json::json!({"image": {"reference": "quay.io/x/y:v1"}});
    let uid = vm
        .upsert_pod(&pod("i", &[("img", img), ("m", mem())]))
        .unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    let mounted = vm.mounted_volumes_for_pod(&uid);
    assert_eq!(mounted.len(), 2);
    assert_eq!(mounted[0].outer_volume_spec_name, "img");
    assert_eq!(mounted[0].path, PathBuf::new());
    let st = vm.status();
    let states: Vec<_> = st.pods[0]
        .volumes
        .iter()
        .map(|v| v.state.as_str())
        .collect();
    assert_eq!(states, vec!["mounted", "mounted"]);
    assert_eq!(fake.mounted().len(), 1, "only the tmpfs is a mount");
    vm.delete_pod(&uid);
    vm.wait_for_unmount(&uid, T).await.unwrap();
    assert!(vm.possibly_mounted_volumes_for_pod(&uid).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_back_off_and_recover() {
    let (_t, fake, vm) = manager().await;
    fake.fail_mounts(3, nix::errno::Errno::ENOMEM);
    let uid = vm.upsert_pod(&pod("b", &[("m", mem())])).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    let mounts = fake
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Mount { .. }))
        .count();
    assert_eq!(mounts, 4, "three failures, then success");
    let st = vm.status();
    let v = &st.pods[0].volumes[0];
    assert_eq!(
        (v.state.as_str(), v.attempts, v.error.as_deref()),
        ("mounted", 4, None)
    );
    let ops = vm.metrics_text();
    assert!(ops.contains("status=\"fail-unknown\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_teardown_shows_in_status_with_the_pod_name() {
    let (_t, fake, vm) = manager().await;
    let uid = vm.upsert_pod(&pod("f", &[("m", mem())])).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    fake.fail_unmounts(2, nix::errno::Errno::EBUSY);
    vm.delete_pod(&uid);
    let mut rx = vm.world().subscribe();
    let stuck = loop {
        let st = vm.status();
        let p = st.pods.iter().find(|p| p.uid == "f").cloned();
        if let Some(p) = p.filter(|p| p.volumes.first().is_some_and(|v| v.error.is_some())) {
            break p;
        }
        rx.changed().await.unwrap();
    };
    assert_eq!((stuck.namespace.as_str(), stuck.name.as_str()), ("ns", "f"));
    assert_eq!(stuck.volumes[0].state, "unmounting");
    assert!(stuck.volumes[0]
        .error
        .as_deref()
        .unwrap()
        .contains("umount2"));
    // The backoff expires, the third attempt succeeds.
    vm.wait_for_unmount(&uid, T).await.unwrap();
    assert!(vm.status().pods.iter().all(|p| p.uid != "f"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_repairs_an_out_of_band_unmount() {
    let (_t, fake, vm) = manager().await;
    let uid = vm.upsert_pod(&pod("c", &[("m", mem())])).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    let path = vm.mounted_volumes_for_pod(&uid)[0].path.clone();
    fake.remove_out_of_band(&path);
    vm.reconciler().resync().await;
    vm.wait_converged(Some(1), T).await.unwrap();
    assert_eq!(fake.mounted(), vec![path]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_reads_the_mount_table_only_when_it_must() {
    let (_t, fake, vm) = manager().await;
    let disk = serde_json::json!({"emptyDir": {}});
    let uid = vm
        .upsert_pod(&pod("c", &[("m", mem()), ("d", disk)]))
        .unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    let path_of = |name: &str| {
        let vols = vm.mounted_volumes_for_pod(&uid);
        let v = vols.iter().find(|v| v.outer_volume_spec_name == name);
        v.unwrap().path.clone()
    };
    let (mem_path, disk_path) = (path_of("m"), path_of("d"));
    let counts = || (fake.table_reads(), fake.id_lists());
    // The first resync finds the tmpfs's mount id listed, so it does
    // not read the table; the next one, with nothing changed, does
    // not even list the ids.
    let (reads, lists) = counts();
    vm.reconciler().resync().await;
    assert_eq!(counts(), (reads, lists + 1));
    let lists = lists + 1;
    vm.reconciler().resync().await;
    assert_eq!(counts(), (reads, lists));
    // Checks that look at something else still run: the on-disk
    // emptyDir's directory is gone, and is made again.
    std::fs::remove_dir(&disk_path).unwrap();
    vm.reconciler().resync().await;
    assert_eq!(counts(), (reads, lists));
    vm.wait_converged(Some(1), T).await.unwrap();
    assert!(disk_path.is_dir());
    // A new volume changes the table: its mount's id is listed, so the
    // table is not read.
    let uid2 = vm.upsert_pod(&pod("c2", &[("m", mem())])).unwrap();
    vm.wait_for_attach_and_mount(&uid2, T).await.unwrap();
    vm.reconciler().resync().await;
    assert_eq!(counts(), (reads, lists + 1));
    // A volume recorded as mounted with no known mount id (here: by
    // hand) is checked against a fresh read.
    {
        let volume = vm.mounted_volumes_for_pod(&uid2)[0].volume_name.clone();
        let mut asw = vm.world().asw_mut();
        let m = asw.pod_mount(&volume, &uid2).cloned().unwrap();
        let unknown = MountedPod {
            mount_id: None,
            ..m
        };
        asw.mark_volume_as_mounted(&volume, &uid2, unknown);
    }
    vm.reconciler().resync().await;
    assert_eq!(counts(), (reads + 1, lists + 2));
    // An unmount behind the manager's back: the id is no longer listed,
    // the table is read, and the tmpfs mounted again.
    fake.remove_out_of_band(&mem_path);
    vm.reconciler().resync().await;
    assert_eq!(counts(), (reads + 2, lists + 3));
    vm.wait_converged(Some(2), T).await.unwrap();
    assert_eq!(fake.mounted().len(), 2);
    assert!(fake.mounted().contains(&mem_path));
    // However cheap the other checks, every tenth resync reads it.
    let (reads, _) = counts();
    for _ in 0..20 {
        vm.reconciler().resync().await;
    }
    assert_eq!(counts().0, reads + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_volumes_wait_for_populated_sources() {
    let t = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeMounter::default());
    // A first manager mounts a volume, then "crashes" (is dropped).
    {
        let vm = VolumeManager::new(Config::new(t.path()), fake.clone()).unwrap();
        vm.start().await.unwrap();
        let uid = vm.upsert_pod(&pod("d", &[("m", mem())])).unwrap();
        vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
        vm.stop().await.unwrap();
    }
    // The next one reconstructs it and leaves it alone until the sources
    // say they are complete; then, as nobody wants it, tears it down.
    let vm = VolumeManager::new(Config::new(t.path()), fake.clone()).unwrap();
    let report = vm.start().await.unwrap();
    assert_eq!((report.pods, report.uncertain), (1, 1));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        fake.mounted().len(),
        1,
        "not torn down before the sources are populated"
    );
    vm.set_populated();
    vm.wait_converged(Some(0), T).await.unwrap();
    assert!(fake.mounted().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_dir_stats_show_in_status_but_not_in_the_claim_metrics() {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(t.path());
    cfg.volume_stats_period = Duration::ZERO;
    let fake = Arc::new(FakeMounter::default());
    assert!(matches!(
        VolumeManager::new(cfg.clone(), fake.clone()),
        Err(Error::InvalidConfig(_))
    ));
    cfg.volume_stats_period = Duration::from_millis(20);
    let vm = VolumeManager::new(cfg, fake).unwrap();
    vm.start().await.unwrap();
    let disk = serde_json::json!({"emptyDir": {}});
    let uid = vm.upsert_pod(&pod("s", &[("d", disk)])).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    let stats = loop {
        if let Some(s) = vm.status().pods[0].volumes[0].stats.clone() {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(stats.capacity_bytes > 0 && !stats.stale, "{stats:?}");
    assert!(stats.used_bytes + stats.available_bytes <= stats.capacity_bytes);
    assert!(stats.collected_at.is_some() && !stats.abnormal);
    assert!(!vm.metrics_text().contains("kubelet_volume_stats"));
    vm.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_mirror_the_kubelet_interface() {
    let (_t, _fake, vm) = manager().await;
    let mut p = pod(
        "e",
        &[
            ("m", mem()),
            ("cm", serde_json::json!({"configMap": {"name": "x"}})),
        ],
    );
    p.spec.as_mut().unwrap().security_context = Some(
        serde_json::from_value(serde_json::json!({"fsGroup": 7, "supplementalGroups": [9, 7]}))
            .unwrap(),
    );
    let uid = vm.upsert_pod(&p).unwrap();
    vm.set_populated();
    // A kind no plugin handles is the kubelet's pod error: the wait ends
    // at once (not after its timeout), with the kubelet's text.
    let err = vm
        .wait_for_attach_and_mount(&uid, T * 30)
        .await
        .unwrap_err();
    assert!(matches!(err, WaitError::PodErrors { .. }), "{err:?}");
    // `m` may be mounted by then or not.
    let text = err.to_string();
    assert!(
        text.starts_with("unmounted volumes=[cm")
            && text.contains(
                "], unattached volumes=[], failed to process volumes=[cm]: \
                 no volume plugin supports configMap"
            ),
        "{err}"
    );
    for _ in 0..2000 {
        if vm.mounted_volumes_for_pod(&uid).len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // No PersistentVolume, no extra group; nothing attachable in use.
    assert!(vm.extra_supplemental_groups_for_pod(&uid).is_empty());
    assert!(vm.volumes_in_use().is_empty());
    let m = vm.possibly_mounted_volumes_for_pod(&uid)[0]
        .volume_name
        .clone();
    assert!(vm.volume_is_attached(&m));
    assert!(vm.has_possibly_mounted_volumes_for_pod(&uid));
    assert_eq!(vm.possibly_mounted_volumes_for_pod(&uid).len(), 1);
}

/// An attachable plugin standing in for CSI (a CSI source, no driver):
/// set-up only records the path.
struct FakeAttachable;

#[async_trait::async_trait]
impl VolumePlugin for FakeAttachable {
    fn name(&self) -> &str {
        "test/attachable"
    }
    fn can_support(&self, s: &crate::volume::VolumeSource) -> bool {
        matches!(s, crate::volume::VolumeSource::Csi(_))
    }
    async fn set_up(
        &self,
        req: crate::plugins::MountRequest,
    ) -> Result<PathBuf, crate::plugins::VolumeError> {
        Ok(PathBuf::from(format!(
            "/fake/{}/{}",
            req.pod_uid, req.spec.name
        )))
    }
    async fn tear_down(
        &self,
        _: crate::plugins::UnmountRequest,
    ) -> Result<(), crate::plugins::VolumeError> {
        Ok(())
    }
    fn verify(
        &self,
        _: &crate::volume::VolumeSpec,
        _: &std::path::Path,
        _: crate::sys::mount_table::MountTableView<'_>,
    ) -> bool {
        true
    }
    fn can_attach(&self, spec: &crate::volume::VolumeSpec) -> bool {
        matches!(&spec.source, crate::volume::VolumeSource::Csi(c) if c.can_attach())
    }
}

fn csi(gid: Option<i64>) -> crate::volume::VolumeSource {
    use crate::volume::CsiVolumeSource;
    crate::volume::VolumeSource::Csi(Box::new(CsiVolumeSource {
        pv_name: Some("pv".into()),
        supplemental_gid: gid,
        ..CsiVolumeSource::new("d", format!("h-{gid:?}"))
    }))
}

/// A desired pod with `fsGroup` 7, `supplementalGroups` [9] and `vols`.
fn desired(uid: &str, vols: Vec<(&str, crate::volume::VolumeSource)>) -> DesiredPod {
    DesiredPod {
        uid: PodUid::new(uid).unwrap(),
        namespace: "ns".into(),
        name: uid.into(),
        fs_group: Some(7),
        fs_group_change_policy: Default::default(),
        supplemental_groups: vec![9],
        selinux_label: None,
        volumes: vols
            .into_iter()
            .map(|(n, s)| crate::populator::convert::pod::PodVolume {
                name: n.into(),
                source: Ok(s),
                sub_paths: vec![],
                selinux: Default::default(),
            })
            .collect(),
        terminated: false,
        sub_path_release: Default::default(),
    }
}

fn memory_source() -> crate::volume::VolumeSource {
    crate::volume::VolumeSource::EmptyDir {
        medium: crate::volume::StorageMedium::Memory,
        size_limit: Some(1 << 20),
    }
}

async fn manager_with(
    wait_for_reported_in_use: bool,
) -> (tempfile::TempDir, Arc<FakeMounter>, Arc<VolumeManager>) {
    manager_with_config(|c| c.wait_for_reported_in_use = wait_for_reported_in_use).await
}

async fn manager_with_config(
    f: impl FnOnce(&mut Config),
) -> (tempfile::TempDir, Arc<FakeMounter>, Arc<VolumeManager>) {
    let t = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeMounter::default());
    let mut cfg = Config::new(t.path());
    f(&mut cfg);
    let vm = VolumeManager::new(cfg, fake.clone()).unwrap();
    vm.register_plugin(Arc::new(FakeAttachable)).unwrap();
    vm.start().await.unwrap();
    vm.set_populated();
    (t, fake, vm)
}

/// Waits (bounded by T, only to catch a hang) until `f` holds.
async fn until(vm: &VolumeManager, f: impl Fn(&VolumeManager) -> bool) {
    let mut rx = vm.world().subscribe();
    tokio::time::timeout(T, async {
        while !f(vm) {
            rx.changed().await.unwrap();
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_groups_come_from_mounted_pv_gid_annotations() {
    let (_t, _fake, vm) = manager_with(false).await;
    let uid = PodUid::new("g").unwrap();
    assert!(vm.extra_supplemental_groups_for_pod(&uid).is_empty());
    vm.set_desired_pod(desired(
        "g",
        vec![
            ("a", csi(Some(1234))),
            ("b", csi(Some(9))), // already a supplemental group
            ("c", csi(Some(7))), // the fsGroup
            ("d", csi(Some(55))),
            ("e", csi(None)), // no (or an invalid) annotation
            ("m", memory_source()),
        ],
    ));
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    assert_eq!(vm.extra_supplemental_groups_for_pod(&uid), vec![55, 1234]);
    // Only the attachable (CSI) volumes are in use, not the emptyDir.
    let in_use = vm.volumes_in_use();
    assert_eq!(in_use.len(), 5, "{in_use:?}");
    assert!(in_use
        .iter()
        .all(|n| n.as_str().starts_with("test/attachable/")));
    vm.delete_pod(&uid);
    vm.wait_for_unmount(&uid, T).await.unwrap();
    assert!(vm.extra_supplemental_groups_for_pod(&uid).is_empty());
    until(&vm, |vm| vm.volumes_in_use().is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attachable_volume_waits_until_reported_in_use() {
    let (_t, fake, vm) = manager_with(true).await;
    let uid = PodUid::new("r").unwrap();
    vm.set_desired_pod(desired(
        "r",
        vec![("c", csi(Some(1))), ("m", memory_source())],
    ));
    // The emptyDir is not attachable: it is set up at once.
    until(&vm, |vm| vm.mounted_volumes_for_pod(&uid).len() == 1).await;
    assert_eq!(fake.mounted().len(), 1);
    let status = vm.status();
    let c = status.pods[0]
        .volumes
        .iter()
        .find(|v| v.name == "c")
        .unwrap();
    assert_eq!(
        c.error.as_deref(),
        Some(crate::reconciler::NOT_REPORTED_IN_USE)
    );
    let err = vm
        .wait_for_attach_and_mount(&uid, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("c (pending: Volume has not been added"),
        "{err}"
    );
    // Reported in use: mounted at once (the reconciler is woken).
    let in_use = vm.volumes_in_use();
    assert_eq!(in_use.len(), 1);
    assert!(!vm.volume_is_reported_in_use(&in_use[0]));
    vm.mark_volumes_as_reported_in_use(in_use.clone());
    assert!(vm.volume_is_reported_in_use(&in_use[0]));
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    // Once attached, a report that leaves it out does not unmount it.
    vm.mark_volumes_as_reported_in_use(vec![]);
    vm.wait_converged(Some(1), T).await.unwrap();
    assert_eq!(vm.mounted_volumes_for_pod(&uid).len(), 2);
}

/// With both gates (a node agent that reports `volumesInUse` and reads
/// `volumesAttached`): reported in use is not enough, the Node's
/// `status.volumesAttached` must list the volume; then it is mounted at
/// once, and stays mounted when a later read leaves it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attachable_volume_waits_for_volumes_attached() {
    let (_t, fake, vm) = manager_with_config(|c| {
        c.wait_for_reported_in_use = true;
        c.wait_for_volumes_attached = true;
    })
    .await;
    let uid = PodUid::new("a").unwrap();
    vm.set_desired_pod(desired(
        "a",
        vec![("c", csi(Some(1))), ("m", memory_source())],
    ));
    until(&vm, |vm| vm.mounted_volumes_for_pod(&uid).len() == 1).await;
    let in_use = vm.volumes_in_use();
    vm.mark_volumes_as_reported_in_use(in_use.clone());
    let error_of_c = |vm: &VolumeManager| {
        vm.status().pods[0]
            .volumes
            .iter()
            .find(|v| v.name == "c")
            .and_then(|v| v.error.clone())
    };
    until(&vm, |vm| {
        error_of_c(vm).as_deref() == Some(crate::reconciler::NOT_ATTACHED)
    })
    .await;
    assert_eq!(fake.mounted().len(), 1, "only the emptyDir");
    // Another volume attached changes nothing for it.
    vm.mark_volumes_attached(vec![UniqueVolumeName::new("test/attachable/other")]);
    assert_eq!(
        error_of_c(&vm).as_deref(),
        Some(crate::reconciler::NOT_ATTACHED)
    );
    vm.mark_volumes_attached(in_use.clone());
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    assert_eq!(error_of_c(&vm), None);
    vm.mark_volumes_attached(vec![]);
    vm.wait_converged(Some(1), T).await.unwrap();
    assert_eq!(vm.mounted_volumes_for_pod(&uid).len(), 2);
}

/// The kubelet's `CanAttach`: an inline CSI volume, and one whose
/// CSIDriver says `attachRequired: false`, are not attachable: not in
/// use, and set up without waiting to be reported in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_and_attach_free_csi_volumes_are_not_in_use() {
    use crate::volume::{CsiDriverInfo, CsiVolumeSource, VolumeSource};
    let (_t, _fake, vm) = manager_with(true).await;
    let uid = PodUid::new("i").unwrap();
    let inline = VolumeSource::Csi(Box::new(CsiVolumeSource {
        ephemeral: true,
        ..CsiVolumeSource::new("d", "inline")
    }));
    let attach_free = VolumeSource::Csi(Box::new(CsiVolumeSource {
        pv_name: Some("pv-free".into()),
        driver_info: Arc::new(CsiDriverInfo {
            skip_attach: true,
            ..CsiDriverInfo::default()
        }),
        ..CsiVolumeSource::new("d", "free")
    }));
    vm.set_desired_pod(desired(
        "i",
        vec![("inline", inline), ("free", attach_free), ("c", csi(None))],
    ));
    until(&vm, |vm| vm.mounted_volumes_for_pod(&uid).len() == 2).await;
    assert_eq!(
        vm.volumes_in_use(),
        vec![UniqueVolumeName::new("test/attachable/i-c")]
    );
    vm.mark_volumes_as_reported_in_use(vm.volumes_in_use());
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    // Deleted: in use until unmounted, then not.
    vm.delete_pod(&uid);
    vm.wait_for_unmount(&uid, T).await.unwrap();
    until(&vm, |vm| vm.volumes_in_use().is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_attachable_volumes_mount_at_once() {
    let (_t, _fake, vm) = manager_with(false).await;
    let uid = PodUid::new("n").unwrap();
    vm.set_desired_pod(desired("n", vec![("c", csi(None))]));
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_all_pods_to_unmount_in_one_timeout() {
    let (_t, _fake, vm) = manager_with(false).await;
    let uids: Vec<PodUid> = ["w1", "w2", "w3"]
        .iter()
        .map(|u| {
            vm.set_desired_pod(desired(u, vec![("m", memory_source())]));
            PodUid::new(u).unwrap()
        })
        .collect();
    for u in &uids {
        vm.wait_for_attach_and_mount(u, T).await.unwrap();
        assert!(vm.has_possibly_mounted_volumes_for_pod(u));
    }
    vm.delete_pod(&uids[0]);
    vm.delete_pod(&uids[1]);
    vm.wait_for_all_pods_unmount(&uids[..2], T).await.unwrap();
    assert!(!vm.has_possibly_mounted_volumes_for_pod(&uids[0]));
    // w3 stays: the error names what is left.
    let err = vm
        .wait_for_all_pods_unmount(&uids, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        WaitError::Timeout {
            pod: "w1,w2,w3".into(),
            pending: "w3/m (still mounted)".into()
        }
    );
    vm.wait_for_all_pods_unmount(&[], T).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resizes_a_memory_empty_dir_in_place() {
    let (_t, fake, vm) = manager_with(false).await;
    let disk = crate::volume::VolumeSource::EmptyDir {
        medium: crate::volume::StorageMedium::Default,
        size_limit: None,
    };
    let uid = PodUid::new("z").unwrap();
    vm.set_desired_pod(desired(
        "z",
        vec![("m", memory_source()), ("d", disk), ("c", csi(None))],
    ));
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    vm.resize_ephemeral_volume(&uid, "m", 8 << 20)
        .await
        .unwrap();
    assert!(matches!(
        fake.calls().last(),
        Some(Call::Remount { data: Some(d), .. }) if d == "size=8388608"
    ));
    fake.set_usage(crate::sys::FsUsage {
        size_bytes: 8 << 20,
        used_bytes: 3 << 20,
    });
    let err = vm
        .resize_ephemeral_volume(&uid, "m", 2 << 20)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ResizeError::Volume(crate::plugins::VolumeError::BelowUsage { .. })
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("3145728 bytes are in use"),
        "{err}"
    );
    let err = vm
        .resize_ephemeral_volume(&uid, "d", 1 << 20)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("only a medium: Memory"), "{err}");
    let err = vm
        .resize_ephemeral_volume(&uid, "c", 1 << 20)
        .await
        .unwrap_err();
    assert!(matches!(err, ResizeError::NotSupported(_)), "{err}");
    let err = vm
        .resize_ephemeral_volume(&uid, "x", 1 << 20)
        .await
        .unwrap_err();
    assert!(matches!(err, ResizeError::VolumeNotFound { .. }), "{err}");
    let nobody = PodUid::new("nobody").unwrap();
    let err = vm
        .resize_ephemeral_volume(&nobody, "m", 1)
        .await
        .unwrap_err();
    assert!(matches!(err, ResizeError::PodNotFound(_)), "{err}");
}

/// The kubelet's metrics volmgr lacked, read from the exposition after the
/// event: a volume directory reconstructed at start-up
/// (`reconstruct_volume_operations_total`), a mount's end-to-end time
/// (`volume_operation_total_seconds{operation_name="overall_volume_mount"}`)
/// and a stats collection (`kubelet_volume_metric_collection_duration_seconds`).
/// Before, none of the three families was exposed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposes_the_kubelets_reconstruct_total_and_collection_metrics() {
    let t = tempfile::tempdir().unwrap();
    let left = t.path().join("pods/old/volumes/kubernetes.io~empty-dir/v");
    std::fs::create_dir_all(&left).unwrap();
    let fake = Arc::new(FakeMounter::default());
    let mut cfg = Config::new(t.path());
    cfg.volume_stats_period = Duration::from_millis(20);
    let vm = VolumeManager::new(cfg, fake).unwrap();
    vm.start().await.unwrap();
    let uid = vm
        .upsert_pod(&pod("a", &[("d", serde_json::json!({"emptyDir": {}}))]))
        .unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    let has = |text: &str, prefix: &str| text.lines().any(|l| l.starts_with(prefix));
    let mut text = vm.metrics_text();
    for _ in 0..2000 {
        if has(
            &text,
            "kubelet_volume_metric_collection_duration_seconds_count{metric_source=\"statfs\"}",
        ) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        text = vm.metrics_text();
    }
    for line in [
        "reconstruct_volume_operations_total 1",
        "reconstruct_volume_operations_errors_total 0",
        "volume_operation_total_seconds_count{plugin_name=\"kubernetes.io/empty-dir\",operation_name=\"overall_volume_mount\"} 1",
        "kubelet_volume_metric_collection_duration_seconds_bucket{metric_source=\"statfs\",le=\"+Inf\"}",
    ] {
        assert!(has(&text, line), "{line} missing in:\n{text}");
    }
    vm.stop().await.unwrap();
}

/// An orphaned pod's volume directories of a plugin volmgr does not know
/// (`kubernetes.io~foo`) are removed as the kubelet's
/// `removeOrphanedPodVolumeDirs` does: only an empty one; one with a file,
/// and a symlink (never followed), are kept, and the pod directory with
/// them. Before, the whole pod directory was removed, the file in the
/// unknown plugin's volume directory with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_unknown_plugin_volume_dirs_are_removed_only_when_empty() {
    let t = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"x").unwrap();
    let foo = t.path().join("pods/gone/volumes/kubernetes.io~foo");
    std::fs::create_dir_all(foo.join("empty")).unwrap();
    std::fs::create_dir_all(foo.join("full")).unwrap();
    std::fs::write(foo.join("full/data"), b"data").unwrap();
    std::os::unix::fs::symlink(outside.path(), foo.join("link")).unwrap();
    let bar = t.path().join("pods/gone2/volumes/kubernetes.io~bar/empty");
    std::fs::create_dir_all(&bar).unwrap();
    let (_fake, vm) = {
        let fake = Arc::new(FakeMounter::default());
        let mut cfg = Config::new(t.path());
        cfg.backoff = Backoff::new(Duration::from_millis(20), 2, Duration::from_millis(100));
        let vm = VolumeManager::new(cfg, fake.clone()).unwrap();
        vm.start().await.unwrap();
        (fake, vm)
    };
    vm.set_populated();
    // A pod whose only leftover is an empty unknown volume directory goes.
    for _ in 0..2000 {
        if !t.path().join("pods/gone2").exists() && !foo.join("empty").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!t.path().join("pods/gone2").exists());
    assert!(
        !foo.join("empty").exists(),
        "an empty volume directory is removed"
    );
    assert_eq!(std::fs::read(foo.join("full/data")).unwrap(), b"data");
    assert!(foo.join("link").symlink_metadata().unwrap().is_symlink());
    assert!(outside.path().join("keep").exists());
    vm.stop().await.unwrap();
}
