//! Targeted checks of the mount table (`tracer/check.rs`) through the whole
//! manager: a check only records what it finds (lost volumes, foreign
//! mounts) and the reconciler acts on it. The tracer's own layer does not
//! see the manager.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::cache::out_of_band::DetectedBy;
use crate::operationexecutor::OperationKind;
use crate::sys::fake::FakeMounter;
use crate::sys::mount_table::MountTable;
use crate::sys::root_dir::RelPath;
use crate::sys::{MountTableReader, Mounter};
use crate::tracer::check::{monotonic_ns, CheckOutcome, CheckRequest, Checker, Origin, Scope};
use crate::volume::{PodUid, UniqueVolumeName};
use crate::volumemanager::{Config, VolumeManager};

const T: Duration = Duration::from_secs(20);

struct Setup {
    _dir: tempfile::TempDir,
    fake: Arc<FakeMounter>,
    vm: Arc<VolumeManager>,
    checker: Arc<Checker>,
    uid: PodUid,
    volume: UniqueVolumeName,
    path: PathBuf,
}

/// A manager on the fake mounter with one pod whose tmpfs emptyDir is
/// mounted.
async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeMounter::default());
    let vm = VolumeManager::new(Config::new(dir.path()), fake.clone()).unwrap();
    vm.start().await.unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
        "spec": {"containers": [{"name": "c", "volumeMounts": [{"name": "m", "mountPath": "/m"}]}],
                 "volumes": [{"name": "m", "emptyDir": {"medium": "Memory"}}]}
    }))
    .unwrap();
    let uid = vm.upsert_pod(&pod).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&uid, T).await.unwrap();
    let m = vm.mounted_volumes_for_pod(&uid).remove(0);
    let checker = Checker::new(&vm.tracer_context(), Arc::default());
    Setup {
        _dir: dir,
        fake,
        vm,
        checker,
        uid,
        volume: m.volume_name,
        path: m.path,
    }
}

fn request(path: &Path) -> CheckRequest {
    CheckRequest {
        scope: Scope::Below(path.to_path_buf()),
        origin: Origin {
            by: DetectedBy::Ebpf,
            cause: Some("umount2(\"x\") by umount[7]".into()),
            boot_ns: Some(monotonic_ns()),
        },
        deferrals: 0,
    }
}

async fn check(s: &Setup) -> CheckOutcome {
    let (c, path) = (Arc::clone(&s.checker), s.path.clone());
    tokio::task::spawn_blocking(move || c.check(vec![request(&path)]))
        .await
        .unwrap()
        .unwrap()
}

fn mount_foreign(s: &Setup, fstype: &str) {
    let rel = RelPath::new(s.path.strip_prefix(s.vm.root().path()).unwrap().iter()).unwrap();
    let target = s.vm.root().open_dir(&rel).unwrap();
    s.fake
        .mount(
            "foreign",
            &target,
            fstype,
            crate::sys::MsFlags::empty(),
            None,
        )
        .unwrap();
}

/// Waits until the reconciler has removed the foreign mounts the check
/// marked.
async fn wait_foreign_handled(s: &Setup) {
    let marked = || {
        s.vm.world()
            .asw()
            .foreign_mounts(&s.volume, &s.uid)
            .is_some()
    };
    let deadline = std::time::Instant::now() + T;
    while marked() || s.vm.executor().is_running(&s.volume) {
        assert!(
            std::time::Instant::now() < deadline,
            "foreign mounts not removed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounted_volume_is_left_alone() {
    let s = setup().await;
    let o = check(&s).await;
    assert_eq!((o.lost, o.foreign, o.deferred.len()), (0, 0, 0));
    assert!(s.vm.out_of_band().recent().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_volume_is_confirmed_recorded_and_set_up_again() {
    let s = setup().await;
    s.fake.remove_out_of_band(&s.path);
    let o = check(&s).await;
    assert_eq!(o.lost, 1);
    s.vm.wait_for_attach_and_mount(&s.uid, T).await.unwrap();
    assert_eq!(s.fake.mounted(), vec![s.path.clone()]);
    let log = s.vm.out_of_band().recent();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].kind, "lost");
    assert_eq!(log[0].detected_by, "ebpf");
    assert_eq!(log[0].cause.as_deref(), Some("umount2(\"x\") by umount[7]"));
    assert!(log[0].detected_after_us.is_some());
    assert_eq!(s.vm.out_of_band().volume(&s.volume, &s.uid).unwrap().0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_with_an_operation_in_flight_is_checked_later() {
    let s = setup().await;
    let (release, wait) = tokio::sync::oneshot::channel::<()>();
    s.vm.executor()
        .start(
            &s.volume,
            Some(&s.uid),
            OperationKind::MountVolume,
            "test".into(),
            async move {
                let _ = wait.await;
                Ok(())
            },
        )
        .unwrap();
    // The manager's own operation may be unmounting it right now.
    s.fake.remove_out_of_band(&s.path);
    let o = check(&s).await;
    assert_eq!((o.lost, o.foreign), (0, 0));
    assert_eq!(o.deferred.len(), 1);
    assert_eq!(o.deferred[0].scope, Scope::Below(s.path.clone()));
    let _ = release.send(());
    while s.vm.executor().is_running(&s.volume) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Once it is done, the same check finds the loss.
    assert_eq!(check(&s).await.lost, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_mounts_are_removed_down_to_the_volume() {
    let s = setup().await;
    mount_foreign(&s, "ext4");
    mount_foreign(&s, "tmpfs");
    assert_eq!(check(&s).await.foreign, 1);
    wait_foreign_handled(&s).await;
    assert_eq!(s.fake.mounted().len(), 1);
    let log = s.vm.out_of_band().recent();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].kind, "foreign_mount");
    assert_eq!(log[0].outcome, "repaired");
    // The pod's own tmpfs (the first mount) stayed: no set-up again.
    assert_eq!(check(&s).await.foreign, 0);
    assert_eq!(
        s.fake
            .calls()
            .iter()
            .filter(
                |c| matches!(c, crate::sys::fake::Call::Mount { source, .. } if source == "tmpfs")
            )
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_only_records_foreign_mounts_for_the_reconciler() {
    let s = setup().await;
    // No reconciler: whatever happens is the check's doing.
    s.vm.stop().await.unwrap();
    mount_foreign(&s, "ext4");
    let unmounts = || {
        s.fake
            .calls()
            .iter()
            .filter(|c| matches!(c, crate::sys::fake::Call::Unmount(_)))
            .count()
    };
    let before = unmounts();
    assert_eq!(check(&s).await.foreign, 1);
    assert_eq!(unmounts(), before);
    assert_eq!(s.fake.mounted().len(), 2);
    assert!(!s.vm.executor().is_running(&s.volume));
    assert!(s
        .vm
        .world()
        .asw()
        .foreign_mounts(&s.volume, &s.uid)
        .is_some());
    let log = s.vm.out_of_band().recent();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].kind, "foreign_mount");
    assert!(log[0].repaired_after_ms.is_none());
    // Found again before it is handled: the same change.
    assert_eq!(check(&s).await.foreign, 1);
    assert_eq!(s.vm.out_of_band().recent().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_replaced_by_another_mount_is_set_up_again() {
    let s = setup().await;
    s.fake.remove_out_of_band(&s.path);
    mount_foreign(&s, "ext4");
    assert_eq!(check(&s).await.foreign, 1);
    // The check only marked it; the reconciler removes the mount.
    wait_foreign_handled(&s).await;
    s.vm.wait_for_attach_and_mount(&s.uid, T).await.unwrap();
    let table = MountTable::new(s.fake.mount_table().unwrap());
    assert_eq!(table.count(&s.path), 1);
    assert_eq!(table.top(&s.path).unwrap().fstype, "tmpfs");
    let kinds: Vec<String> =
        s.vm.out_of_band()
            .recent()
            .into_iter()
            .map(|e| e.kind)
            .collect();
    assert_eq!(kinds, ["foreign_mount", "lost"]);
}
