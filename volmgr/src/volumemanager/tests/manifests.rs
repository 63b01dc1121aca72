//! The manifests-directory source (`populator/manifests/`) feeding the
//! whole manager: rescans of a temporary directory, checked in the desired
//! state and status. Parsing alone is tested in the source's own layer,
//! which does not see the manager.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::stat::Mode;

use crate::populator::convert::pod::{DesiredPod, PodRejected};
use crate::populator::manifests::tests::{deep, POD};
use crate::populator::manifests::{ManifestsSource, FIRST_BATCH};
use crate::populator::PodSink;
use crate::sys::fake::FakeMounter;
use crate::volume::PodUid;
use crate::volumemanager::{Config, VolumeManager};

/// A stand-in CSI plugin (this test is about sources, not mounting): one
/// volume per handle, like the real one.
struct CsiStandIn;

#[async_trait::async_trait]
impl crate::plugins::VolumePlugin for CsiStandIn {
    fn name(&self) -> &str {
        "test/csi"
    }
    fn can_support(&self, source: &crate::volume::VolumeSource) -> bool {
        matches!(source, crate::volume::VolumeSource::Csi(_))
    }
    fn unique_volume_name(
        &self,
        pod: &PodUid,
        spec: &crate::volume::VolumeSpec,
    ) -> crate::volume::UniqueVolumeName {
        match &spec.source {
            crate::volume::VolumeSource::Csi(c) if !c.ephemeral => {
                crate::volume::UniqueVolumeName::new(format!("test/csi/{}", c.volume_handle))
            }
            _ => crate::volume::UniqueVolumeName::per_pod("test/csi", pod, &spec.name),
        }
    }
    async fn set_up(
        &self,
        _req: crate::plugins::MountRequest,
    ) -> Result<PathBuf, crate::plugins::VolumeError> {
        Err(crate::plugins::VolumeError::InvalidSpec(
            "not mounted in this test".into(),
        ))
    }
    async fn tear_down(
        &self,
        _req: crate::plugins::UnmountRequest,
    ) -> Result<(), crate::plugins::VolumeError> {
        Ok(())
    }
    fn verify(
        &self,
        _spec: &crate::volume::VolumeSpec,
        _path: &Path,
        _table: crate::sys::mount_table::MountTableView<'_>,
    ) -> bool {
        false
    }
}

/// Writes a file atomically (a new inode, so the change is always seen).
fn put(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// The volume of pod `uid`: its error, or its CSI source.
fn volume_of(vm: &VolumeManager, uid: &str) -> Result<crate::volume::CsiVolumeSource, String> {
    let dsw = vm.world().dsw();
    let uid = PodUid::new(uid).unwrap();
    let entry = dsw.pod(&uid).expect("pod is desired");
    let name = entry.volumes[0]
        .resolution
        .as_result()
        .map_err(str::to_string)?
        .clone();
    let v = dsw.volume(&name).expect("volume is desired");
    let p = v.pods.get(&uid).expect("pod in volume");
    match &p.spec.source {
        crate::volume::VolumeSource::Csi(c) => Ok((**c).clone()),
        other => panic!("not CSI: {other:?}"),
    }
}

const PVC_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns, uid: uid-p}
spec:
  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v}]}]
  volumes: [{name: v, persistentVolumeClaim: {claimName: claim}}]
"#;

fn pv_yaml(size: &str, secret: bool) -> String {
    let secret = if secret {
        ", nodeStageSecretRef: {name: creds, namespace: ns}"
    } else {
        ""
    };
    format!("apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: pv-1}}\nspec:\n  capacity: {{storage: {size}}}\n  claimRef: {{namespace: ns, name: claim}}\n  csi: {{driver: test.csi, volumeHandle: vol-1{secret}}}\n")
}

/// A manager on a temporary ROOT (recording fake mounter) and a manifests
/// source on a temporary directory (no periodic rescan); the directories
/// live as long as the returned guards.
fn source_on_temp_dirs() -> (
    tempfile::TempDir,
    tempfile::TempDir,
    Arc<VolumeManager>,
    ManifestsSource,
) {
    let root = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let vm =
        VolumeManager::new(Config::new(root.path()), Arc::new(FakeMounter::default())).unwrap();
    let src = ManifestsSource::new(
        dir.path().to_path_buf(),
        vm.pod_sink(),
        Duration::from_secs(3600),
    );
    (root, dir, vm, src)
}

/// A rescan, bounded so that a regression fails instead of hanging: a
/// reader stuck in `open()` on the FIFO is released by opening it for
/// writing, then the test fails.
async fn rescan_or_fail(src: &mut ManifestsSource, fifo: &Path) {
    if tokio::time::timeout(Duration::from_secs(20), src.rescan())
        .await
        .is_err()
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _writer = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo);
        std::thread::sleep(Duration::from_millis(100));
        panic!("the rescan blocked on a FIFO");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_named_like_a_manifest_neither_blocks_nor_yields_pods() {
    // Opening a FIFO for reading blocks until a writer comes: the reader
    // opens non-blocking and then sees it is not a regular file.
    let (_root, dir, vm, mut src) = source_on_temp_dirs();
    let fifo = dir.path().join("fifo.yaml");
    nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
    put(
            dir.path(),
            "pod.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns, uid: uid-f}\nspec:\n  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v}]}]\n  volumes: [{name: v, emptyDir: {}}]\n",
        );
    rescan_or_fail(&mut src, &fifo).await;
    let uids: Vec<String> = vm
        .world()
        .dsw()
        .pods()
        .map(|(u, _)| u.as_str().to_string())
        .collect();
    assert_eq!(uids, vec!["uid-f".to_string()]);
    // A second pass (the FIFO now has no known key either) too.
    rescan_or_fail(&mut src, &fifo).await;
}

/// The manager's sink, recording each pod it is given and whether one
/// of its volumes was an error then.
struct Recording(Arc<dyn PodSink>, std::sync::Mutex<Vec<(String, bool)>>);

impl PodSink for Recording {
    fn set_pod(&self, pod: DesiredPod) {
        let failed = pod.volumes.iter().any(|v| v.source.is_err());
        self.1.lock().unwrap().push((pod.uid.to_string(), failed));
        self.0.set_pod(pod)
    }
    fn delete_pod(&self, uid: &PodUid) -> bool {
        self.0.delete_pod(uid)
    }
    fn set_source_problems(&self, source: &str, e: Vec<String>, r: Vec<PodRejected>) {
        self.0.set_source_problems(source, e, r)
    }
    fn set_populated(&self) {
        self.0.set_populated()
    }
    fn set_held(&self, uid: &PodUid, held: bool) {
        self.0.set_held(uid, held)
    }
    fn hold_wakes(&self) -> crate::cache::world::WakeHold {
        self.0.hold_wakes()
    }
}

/// At start-up a pod whose file sorts before its PVC's and PV's (here
/// beyond the first batch of files) waits for them: it is resolved once,
/// without a passing "not found" error; a pod that needs no object does
/// not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_the_objects_of_the_same_scan() {
    let (_root, dir, vm, _) = source_on_temp_dirs();
    vm.register_plugin(Arc::new(CsiStandIn)).unwrap();
    let sink = Arc::new(Recording(vm.pod_sink(), Default::default()));
    let mut src = ManifestsSource::new(
        dir.path().to_path_buf(),
        Arc::clone(&sink) as Arc<dyn PodSink>,
        Duration::from_secs(3600),
    );
    let d = dir.path();
    put(d, "a-pod.yaml", PVC_POD);
    put(
            d,
            "b-plain.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: e, namespace: ns, uid: uid-e}\nspec:\n  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v}]}]\n  volumes: [{name: v, emptyDir: {}}]\n",
        );
    for i in 0..FIRST_BATCH {
        put(
            d,
            &format!("m-{i:02}.yaml"),
            "apiVersion: v1\nkind: List\nitems: []\n",
        );
    }
    put(d, "z-pv.yaml", &pv_yaml("64Mi", false));
    put(d, "z-pvc.yaml", "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: claim, namespace: ns}\nspec: {volumeName: pv-1}\n");
    src.rescan().await;
    assert_eq!(volume_of(&vm, "uid-p").unwrap().volume_handle, "vol-1");
    let given = sink.1.lock().unwrap().clone();
    assert_eq!(
        given,
        vec![("uid-e".to_string(), false), ("uid-p".to_string(), false)],
        "the pod without objects first; the other once, resolved"
    );
    assert!(vm.status().errors.is_empty(), "{:?}", vm.status().errors);

    // Still owned by its file: a rescan changes nothing, and removing
    // the file removes the pod.
    src.rescan().await;
    assert_eq!(sink.1.lock().unwrap().len(), 2);
    std::fs::remove_file(d.join("a-pod.yaml")).unwrap();
    src.rescan().await;
    assert!(vm
        .world()
        .dsw()
        .pod(&PodUid::new("uid-p").unwrap())
        .is_none());

    // An object that is missing for good: the error once the scan ends.
    put(
        d,
        "a-pod.yaml",
        &PVC_POD.replace("claimName: claim", "claimName: other"),
    );
    src.rescan().await;
    let e = volume_of(&vm, "uid-p").unwrap_err();
    assert!(
        e.contains("PersistentVolumeClaim ns/other not found"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_file_does_not_hold_other_pods_back() {
    let (_root, dir, vm, mut src) = source_on_temp_dirs();
    put(dir.path(), "deep.yaml", &deep(false));
    put(dir.path(), "deep.json", &deep(true));
    put(dir.path(), "pod.yaml", POD);
    // Bounded, so that a regression fails instead of taking minutes.
    tokio::time::timeout(Duration::from_secs(60), src.rescan())
        .await
        .expect("the rescan finishes");
    assert!(vm
        .world()
        .dsw()
        .pod(&PodUid::new("uid-a").unwrap())
        .is_some());
    let st = vm.status();
    for (file, error) in [
        ("deep.yaml", "nested deeper than 64 levels"),
        ("deep.json", "recursion limit exceeded"),
    ] {
        assert!(
            st.errors
                .iter()
                .any(|e| e.source.ends_with(file) && e.error.contains(error)),
            "{file}: {:?}",
            st.errors
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_pod_is_admitted_once_its_owner_file_goes() {
    let (_root, dir, vm, mut src) = source_on_temp_dirs();
    let d = dir.path();
    let name_of = |vm: &VolumeManager| {
        vm.world()
            .dsw()
            .pod(&PodUid::new("uid-a").unwrap())
            .map(|p| p.name.clone())
    };
    put(d, "a.yaml", POD);
    src.rescan().await;
    put(d, "b.yaml", &POD.replace("name: a,", "name: b,"));
    src.rescan().await;
    assert_eq!(name_of(&vm).as_deref(), Some("a"));
    // The owner goes: b.yaml (unchanged on disk) now defines the pod.
    std::fs::remove_file(d.join("a.yaml")).unwrap();
    src.rescan().await;
    assert_eq!(name_of(&vm).as_deref(), Some("b"));
    // Likewise when the owner file stops defining it.
    put(d, "c.yaml", &POD.replace("name: a,", "name: c,"));
    src.rescan().await;
    put(d, "b.yaml", &POD.replace("uid-a", "uid-other"));
    src.rescan().await;
    assert_eq!(name_of(&vm).as_deref(), Some("c"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_re_resolved_when_their_objects_change() {
    let (_root, dir, vm, mut src) = source_on_temp_dirs();
    vm.register_plugin(Arc::new(CsiStandIn)).unwrap();
    let d = dir.path();
    put(d, "pod.yaml", PVC_POD);
    src.rescan().await;
    let e = volume_of(&vm, "uid-p").unwrap_err();
    assert!(
        e.contains("PersistentVolumeClaim ns/claim not found"),
        "{e}"
    );

    // The claim appears, not bound yet; then the PV binds it by claimRef.
    put(d, "pvc.yaml", "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: claim, namespace: ns}\nspec: {}\n");
    src.rescan().await;
    let e = volume_of(&vm, "uid-p").unwrap_err();
    assert!(e.contains("is not bound"), "{e}");
    // The PV needs a stage secret that is missing; then it appears (its
    // value never in status).
    put(d, "pv.yaml", &pv_yaml("64Mi", true));
    src.rescan().await;
    let e = volume_of(&vm, "uid-p").unwrap_err();
    assert!(e.contains("Secret ns/creds not found"), "{e}");
    put(
        d,
        "secret.json",
        r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"creds","namespace":"ns"},"stringData":{"password":"hunter2"}}"#,
    );
    src.rescan().await;
    let c = volume_of(&vm, "uid-p").unwrap();
    assert_eq!(
        (c.volume_handle.as_str(), c.capacity_bytes),
        ("vol-1", Some(64 << 20))
    );
    assert_eq!(c.node_stage_secrets.unwrap().0["password"], "hunter2");
    let json = serde_json::to_string(&vm.status()).unwrap();
    assert!(!json.contains("hunter2"), "{json}");
    changes_and_bad_files_of_objects(&vm, &mut src, d).await;
    objects_that_stop_resolving_keep_the_volume(&vm, &mut src, d).await;
}

/// [`pods_are_re_resolved_when_their_objects_change`], continued: the bound
/// PV resized, written half, and defined twice.
async fn changes_and_bad_files_of_objects(vm: &VolumeManager, src: &mut ManifestsSource, d: &Path) {
    // A resize raises the desired capacity.
    put(d, "pv.yaml", &pv_yaml("128Mi", true));
    src.rescan().await;
    assert_eq!(
        volume_of(vm, "uid-p").unwrap().capacity_bytes,
        Some(128 << 20)
    );

    // A half-written PV file keeps the last good PV and reports the error.
    put(
        d,
        "pv.yaml",
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: [\n",
    );
    src.rescan().await;
    assert_eq!(
        volume_of(vm, "uid-p").unwrap().capacity_bytes,
        Some(128 << 20)
    );
    let st = vm.status();
    assert!(
        st.errors
            .iter()
            .any(|e| e.source.ends_with("pv.yaml") && e.error.contains("invalid YAML")),
        "{:?}",
        st.errors
    );
    put(d, "pv.yaml", &pv_yaml("128Mi", true));
    src.rescan().await;

    // The same object in two files: the second is refused.
    put(d, "dup.yaml", &pv_yaml("1Gi", true));
    src.rescan().await;
    assert_eq!(
        volume_of(vm, "uid-p").unwrap().capacity_bytes,
        Some(128 << 20)
    );
    assert!(vm
        .status()
        .errors
        .iter()
        .any(|e| e.source.ends_with("dup.yaml")
            && e.error
                .contains("PersistentVolume pv-1 is already defined in")));
    std::fs::remove_file(d.join("dup.yaml")).unwrap();
}

/// [`pods_are_re_resolved_when_their_objects_change`], continued: the PV
/// gone, the pod changed to a claim that does not exist, then to no claim.
async fn objects_that_stop_resolving_keep_the_volume(
    vm: &VolumeManager,
    src: &mut ManifestsSource,
    d: &Path,
) {
    // The PV goes away with its file (an object changed, the pod not): the
    // pod's volume keeps its desired state (like the kubelet), and the
    // problem shows on the pod and its volume in status.
    std::fs::remove_file(d.join("pv.yaml")).unwrap();
    src.rescan().await;
    assert_eq!(
        volume_of(vm, "uid-p").unwrap().capacity_bytes,
        Some(128 << 20)
    );
    let pod_error = |vm: &VolumeManager| {
        let st = vm.status();
        let p = st.pods.into_iter().find(|p| p.uid == "uid-p")?;
        p.error
            .map(|e| (e, p.volumes[0].state.clone(), p.volumes[0].error.clone()))
    };
    let (e, state, volume_error) = pod_error(vm).expect("kept volume reported");
    assert!(
        e.contains("volume v: ") && e.contains("is not bound"),
        "{e}"
    );
    assert_ne!(state, "error", "still desired, not torn down");
    assert!(volume_error.is_some_and(|v| v.contains("is not bound")));
    put(d, "pv.yaml", &pv_yaml("128Mi", true));
    src.rescan().await;
    assert_eq!(pod_error(vm), None);

    // A changed pod is resolved afresh: a volume that no longer
    // resolves (a claim that does not exist) keeps its desired state,
    // the error on the pod (the kubelet's populator for a pod it
    // processed before: nothing torn down under a running pod).
    put(
        d,
        "pod.yaml",
        &PVC_POD.replace("claimName: claim", "claimName: other"),
    );
    src.rescan().await;
    assert_eq!(
        volume_of(vm, "uid-p").unwrap().capacity_bytes,
        Some(128 << 20)
    );
    let e = vm.status().pods[0].error.clone().unwrap();
    assert!(
        e.contains("PersistentVolumeClaim ns/other not found"),
        "{e}"
    );

    // A pod that no longer uses a PVC stops being re-resolved.
    put(
        d,
        "pod.yaml",
        &PVC_POD.replace("persistentVolumeClaim: {claimName: claim}", "emptyDir: {}"),
    );
    src.rescan().await;
    assert!(src.follows_no_pod());
    put(d, "pv.yaml", &pv_yaml("64Mi", false));
    src.rescan().await;
    std::fs::remove_file(d.join("pod.yaml")).unwrap();
    src.rescan().await;
    assert!(vm
        .world()
        .dsw()
        .pod(&PodUid::new("uid-p").unwrap())
        .is_none());
    assert!(src.follows_no_pod());
}
