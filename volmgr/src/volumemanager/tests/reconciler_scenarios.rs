//! Scenarios of the kubelet's `reconciler_test.go` and
//! `desired_state_of_world_populator_test.go`, replayed against the whole
//! manager (desired state, reconciler, executor, actual state) with a
//! scripted plugin that has a device phase, like CSI staging. Each test
//! names the kubelet test it replays; `docs/KUBELET-SCENARIOS.md` maps them
//! all.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::cache::actual_state_of_world::{DeviceMountState, VolumeMountState};
use crate::operationexecutor::Backoff;
use crate::plugins::{
    DeviceMountRequest, DeviceMountableVolumePlugin, DeviceUnmountRequest, MountRequest,
    UnmountRequest, VolumeError, VolumePlugin,
};
use crate::populator::convert::pod::{DesiredPod, PodVolume};
use crate::sys::fake::FakeMounter;
use crate::sys::mount_table::MountTableView;
use crate::volume::{PodUid, UniqueVolumeName, VolumeSource, VolumeSpec};
use crate::volumemanager::{Config, VolumeManager};

/// How one call of the plugin ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    /// The kubelet's timeout (`UncertainProgressError`): may have happened.
    Uncertain,
    /// A certain failure: nothing happened.
    Fail,
}

/// The outcomes of the next calls, then `rest` for every later one.
struct Script {
    next: VecDeque<Outcome>,
    rest: Outcome,
}

impl Script {
    fn ok() -> Self {
        Self::then(&[], Outcome::Ok)
    }
    fn then(first: &[Outcome], rest: Outcome) -> Self {
        Self {
            next: first.iter().copied().collect(),
            rest,
        }
    }
    fn take(&mut self) -> Outcome {
        self.next.pop_front().unwrap_or(self.rest)
    }
}

fn result<T>(o: Outcome, ok: T) -> Result<T, VolumeError> {
    match o {
        Outcome::Ok => Ok(ok),
        Outcome::Uncertain => Err(VolumeError::Uncertain("timed out".into())),
        Outcome::Fail => Err(VolumeError::Plugin {
            plugin: "fake/scripted".into(),
            message: "failed".into(),
        }),
    }
}

/// Claims `nfs` volumes, one volume for every pod (like a PV), with a
/// device phase; logs every call and ends stage and publish calls as
/// scripted. With `gate_unstage`, the next unstage signals `unstaging` and
/// waits for `resume` before it unmounts.
struct ScriptedPlugin {
    calls: StdMutex<Vec<String>>,
    stage: StdMutex<Script>,
    publish: StdMutex<Script>,
    /// Only this pod's set-ups follow `publish` (the others succeed).
    publish_pod: StdMutex<Option<String>>,
    gate_unstage: AtomicBool,
    /// The next reconcile pass finds the mounted volume needing a set-up
    /// again (the kubelet's `RequiresRemount`).
    remount: AtomicBool,
    unstaging: Notify,
    resume: Notify,
    /// What a restart finds on disk (as CSI's `vol_data.json` tells it):
    /// the volume staged with this spec, published for these pods.
    on_disk: StdMutex<Option<(VolumeSpec, Vec<String>)>>,
}

/// ` context="<label>"` of a spec mounted with an SELinux label (the mount
/// flag CSI gives the driver), or nothing.
fn context_flag(label: Option<&str>) -> String {
    label.map_or_else(String::new, |l| format!(" context={l:?}"))
}

impl ScriptedPlugin {
    fn new(stage: Script, publish: Script) -> Self {
        Self {
            calls: StdMutex::default(),
            stage: StdMutex::new(stage),
            publish: StdMutex::new(publish),
            publish_pod: StdMutex::default(),
            gate_unstage: AtomicBool::new(false),
            remount: AtomicBool::new(false),
            unstaging: Notify::new(),
            resume: Notify::new(),
            on_disk: StdMutex::default(),
        }
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    fn count(&self, call: &str) -> usize {
        self.calls().iter().filter(|c| *c == call).count()
    }
    fn log(&self, c: String) {
        self.calls.lock().unwrap().push(c);
    }
}

#[async_trait::async_trait]
impl VolumePlugin for ScriptedPlugin {
    fn name(&self) -> &str {
        "fake/scripted"
    }
    fn can_support(&self, s: &VolumeSource) -> bool {
        match s {
            VolumeSource::Other { kind, .. } => kind == "nfs",
            VolumeSource::Csi(c) => c.driver == "scripted",
            _ => false,
        }
    }
    /// Named after the `nfs` volume's JSON `name` (a pod's two volumes of
    /// one `nfs()` are one volume, as two of one claim), else the spec's.
    fn unique_volume_name(&self, _pod: &PodUid, spec: &VolumeSpec) -> UniqueVolumeName {
        let name = match &spec.source {
            VolumeSource::Other { spec: json, .. } => json["name"].as_str(),
            _ => None,
        };
        UniqueVolumeName::new(format!("fake/scripted/{}", name.unwrap_or(&spec.name)))
    }
    async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        let flag = context_flag(crate::cache::selinux::mount_label(&req.spec));
        self.log(format!("publish {}{flag}", req.pod_uid));
        let scripted = self.publish_pod.lock().unwrap().clone();
        let o = match scripted {
            Some(p) if p != req.pod_uid.as_str() => Outcome::Ok,
            _ => self.publish.lock().unwrap().take(),
        };
        result(o, PathBuf::from(format!("/fake/{}", req.pod_uid)))
    }
    async fn tear_down(&self, req: UnmountRequest) -> Result<(), VolumeError> {
        self.log(format!("unpublish {}", req.pod_uid));
        Ok(())
    }
    fn verify(&self, _: &VolumeSpec, _: &Path, _: MountTableView<'_>) -> bool {
        true
    }
    fn requires_remount(&self, _: &UniqueVolumeName, _: &VolumeSpec, _: &VolumeSpec) -> bool {
        self.remount.swap(false, Ordering::SeqCst)
    }
    fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin> {
        Some(self)
    }
    fn volumes_dir_name(&self) -> Option<String> {
        Some("fake~scripted".into())
    }
    fn reconstruct(
        &self,
        pod: &PodUid,
        _: &str,
        _: &crate::sys::mount_table::MountTable,
    ) -> Result<Option<crate::plugins::ReconstructedVolume>, VolumeError> {
        let disk = self.on_disk.lock().unwrap().clone();
        Ok(disk
            .filter(|(_, pods)| pods.iter().any(|p| p == pod.as_str()))
            .map(|(spec, _)| crate::plugins::ReconstructedVolume {
                spec,
                path: PathBuf::from(format!("/fake/{pod}")),
                complete: true,
            }))
    }
}

#[async_trait::async_trait]
impl DeviceMountableVolumePlugin for ScriptedPlugin {
    fn can_device_mount(&self, _: &VolumeSpec) -> bool {
        true
    }
    fn device_mount_path(&self, _: &VolumeSpec) -> Result<PathBuf, VolumeError> {
        Ok("/fake/global".into())
    }
    async fn mount_device(&self, req: DeviceMountRequest) -> Result<PathBuf, VolumeError> {
        let flag = context_flag(crate::cache::selinux::mount_label(&req.spec));
        self.log(format!("stage{flag}"));
        let o = self.stage.lock().unwrap().take();
        result(o, PathBuf::from("/fake/global"))
    }
    async fn unmount_device(&self, _: DeviceUnmountRequest) -> Result<(), VolumeError> {
        if self.gate_unstage.swap(false, Ordering::SeqCst) {
            self.log("unstage begins".into());
            self.unstaging.notify_one();
            self.resume.notified().await;
        }
        self.log("unstage".into());
        Ok(())
    }
    fn reconstruct_devices(
        &self,
        _: &crate::sys::mount_table::MountTable,
        _: &mut Vec<String>,
    ) -> Result<Vec<crate::plugins::ReconstructedDevice>, VolumeError> {
        let disk = self.on_disk.lock().unwrap().clone();
        Ok(disk
            .map(|(spec, _)| crate::plugins::ReconstructedDevice {
                volume_name: volume(),
                spec,
                device_mount_path: "/fake/global".into(),
                complete: true,
                size_bytes: None,
            })
            .into_iter()
            .collect())
    }
}

const T: Duration = Duration::from_secs(20);

fn volume() -> UniqueVolumeName {
    UniqueVolumeName::new("fake/scripted/shared")
}

fn nfs() -> VolumeSource {
    VolumeSource::Other {
        kind: "nfs".into(),
        spec: Arc::new(serde_json::json!({"name": "shared", "nfs": {"server": "s", "path": "/"}})),
    }
}

/// Pod `uid` with volume `shared`, an `nfs` volume of the scripted plugin.
fn desired(uid: &str) -> DesiredPod {
    DesiredPod {
        uid: PodUid::new(uid).unwrap(),
        namespace: "ns".into(),
        name: uid.into(),
        fs_group: None,
        fs_group_change_policy: Default::default(),
        supplemental_groups: vec![],
        selinux_label: None,
        volumes: vec![PodVolume {
            name: "shared".into(),
            source: Ok(nfs()),
            sub_paths: vec![],
            selinux: Default::default(),
        }],
        terminated: false,
        sub_path_release: crate::volume::SubPathRelease::All,
    }
}

/// Pod `uid` with volume `shared`, a CSI volume of a driver that requires
/// republishing: a mounted one may be set up again in place.
fn desired_republished(uid: &str) -> DesiredPod {
    let mut src = crate::volume::CsiVolumeSource::new("scripted", "h");
    src.driver_info = Arc::new(crate::volume::CsiDriverInfo {
        requires_republish: true,
        ..Default::default()
    });
    let mut d = desired(uid);
    d.volumes[0].source = Ok(VolumeSource::Csi(Box::new(src)));
    d
}

/// A started manager with `plugin`, its sources populated, retrying after
/// 10 ms up to 50 ms.
async fn manager(plugin: &Arc<ScriptedPlugin>) -> (tempfile::TempDir, Arc<VolumeManager>) {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(t.path());
    cfg.backoff = Backoff::new(Duration::from_millis(10), 2, Duration::from_millis(50));
    let vm = VolumeManager::new(cfg, Arc::new(FakeMounter::default())).unwrap();
    vm.register_plugin(plugin.clone()).unwrap();
    vm.start().await.unwrap();
    vm.set_populated();
    (t, vm)
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

/// Waits until the volume is forgotten (its device unmounted, or never
/// mounted), the manager idle.
async fn until_forgotten(vm: &VolumeManager) {
    until(vm, |vm| vm.world().asw().volume(&volume()).is_none()).await;
    vm.wait_converged(Some(0), T).await.unwrap();
}

fn pod_state(vm: &VolumeManager, uid: &PodUid) -> Option<VolumeMountState> {
    vm.world().asw().pod_mount(&volume(), uid).map(|m| m.state)
}

/// The volume's attempts and last error in status.
fn attempts(vm: &VolumeManager) -> (u32, bool) {
    let st = vm.status();
    st.pods
        .first()
        .and_then(|p| p.volumes.first())
        .map_or((0, false), |v| (v.attempts, v.error.is_some()))
}

/// `Test_Run_Positive_DoNothing`: with nothing desired, a reconcile pass
/// and a resync call no plugin at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_desired_calls_nothing() {
    let plugin = Arc::new(ScriptedPlugin::new(Script::ok(), Script::ok()));
    let (_t, vm) = manager(&plugin).await;
    vm.wait_converged(Some(0), T).await.unwrap();
    vm.reconciler().resync().await;
    vm.wait_converged(Some(0), T).await.unwrap();
    assert!(plugin.calls().is_empty(), "{:?}", plugin.calls());
}

/// `Test_UncertainVolumeMountState`, "timed out operations should result in
/// volume marked as uncertain": a set-up that timed out leaves the pod's
/// volume uncertain (not mounted, not forgotten), and when the pod goes it
/// is torn down once, then the device unmounted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_set_up_is_uncertain_and_torn_down_when_the_pod_goes() {
    use Outcome::Uncertain;
    let plugin = Arc::new(ScriptedPlugin::new(
        Script::ok(),
        Script::then(&[], Uncertain),
    ));
    let (_t, vm) = manager(&plugin).await;
    let a = PodUid::new("a").unwrap();
    vm.set_desired_pod(desired("a"));
    until(&vm, |vm| {
        pod_state(vm, &a) == Some(VolumeMountState::Uncertain)
    })
    .await;
    assert!(vm.mounted_volumes_for_pod(&a).is_empty());
    assert_eq!(vm.possibly_mounted_volumes_for_pod(&a).len(), 1);
    vm.delete_pod(&a);
    until_forgotten(&vm).await;
    assert_eq!(plugin.count("unpublish a"), 1, "{:?}", plugin.calls());
    assert_eq!(plugin.count("unstage"), 1, "{:?}", plugin.calls());
    assert_eq!(plugin.calls().last().map(String::as_str), Some("unstage"));
}

/// `Test_UncertainVolumeMountState`, "failed operation should result in
/// not-mounted volume": a set-up that failed for certain leaves nothing to
/// tear down (no tear-down call when the pod goes), but the device it was
/// set up from is unmounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_set_up_is_not_mounted_and_never_torn_down() {
    let plugin = Arc::new(ScriptedPlugin::new(
        Script::ok(),
        Script::then(&[], Outcome::Fail),
    ));
    let (_t, vm) = manager(&plugin).await;
    let a = PodUid::new("a").unwrap();
    vm.set_desired_pod(desired("a"));
    until(&vm, |vm| attempts(vm).0 >= 2).await;
    assert_eq!(pod_state(&vm, &a), None, "not in the actual state");
    assert_eq!(
        vm.world().asw().device_mount_state(&volume()),
        DeviceMountState::Mounted
    );
    vm.delete_pod(&a);
    until_forgotten(&vm).await;
    assert_eq!(plugin.count("unpublish a"), 0, "{:?}", plugin.calls());
    assert_eq!(plugin.count("unstage"), 1, "{:?}", plugin.calls());
}

/// `Test_UncertainVolumeMountState`, "timeout followed by failed operation":
/// the kubelet then forgets the volume (no tear-down). volmgr keeps it
/// uncertain, as it does for a device (`generator::mount_device`): a
/// certain failure of a later call does not undo what the timed-out call
/// may have mounted, so the pod's volume is torn down once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_a_timeout_keeps_the_volume_uncertain() {
    use Outcome::{Fail, Uncertain};
    let plugin = Arc::new(ScriptedPlugin::new(
        Script::ok(),
        Script::then(&[Uncertain], Fail),
    ));
    let (_t, vm) = manager(&plugin).await;
    let a = PodUid::new("a").unwrap();
    vm.set_desired_pod(desired("a"));
    until(&vm, |vm| attempts(vm).0 >= 3).await;
    assert_eq!(pod_state(&vm, &a), Some(VolumeMountState::Uncertain));
    vm.delete_pod(&a);
    until_forgotten(&vm).await;
    assert_eq!(plugin.count("unpublish a"), 1, "{:?}", plugin.calls());
    assert_eq!(plugin.count("unstage"), 1);
}

/// `Test_UncertainDeviceGlobalMounts`, "timed out operations should result
/// in device marked as uncertain": nothing is set up over an uncertain
/// device, and when the pod goes the device is unmounted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_device_mount_is_uncertain_and_unmounted_when_the_pod_goes() {
    let plugin = Arc::new(ScriptedPlugin::new(
        Script::then(&[], Outcome::Uncertain),
        Script::ok(),
    ));
    let (_t, vm) = manager(&plugin).await;
    let a = PodUid::new("a").unwrap();
    vm.set_desired_pod(desired("a"));
    until(&vm, |_| plugin.count("stage") >= 2).await;
    assert_eq!(
        vm.world().asw().device_mount_state(&volume()),
        DeviceMountState::Uncertain
    );
    vm.delete_pod(&a);
    until_forgotten(&vm).await;
    let calls = plugin.calls();
    assert!(!calls.iter().any(|c| c.contains("publish")), "{calls:?}");
    assert_eq!(plugin.count("unstage"), 1, "{calls:?}");
}

/// `Test_UncertainDeviceGlobalMounts`, "failed operation should result in
/// not-mounted device" (0 unmounts), and "timeout followed by failed
/// operation": the kubelet forgets that device too (0 unmounts); volmgr
/// keeps it uncertain and unmounts it once (`generator::mount_device`:
/// an unmount that finds nothing is harmless, a leaked staging is not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_device_mount_is_never_unmounted_unless_it_timed_out_first() {
    use Outcome::{Fail, Uncertain};
    for (first, unstages) in [(vec![], 0), (vec![Uncertain], 1)] {
        let plugin = Arc::new(ScriptedPlugin::new(
            Script::then(&first, Fail),
            Script::ok(),
        ));
        let (_t, vm) = manager(&plugin).await;
        let a = PodUid::new("a").unwrap();
        vm.set_desired_pod(desired("a"));
        until(&vm, |_| plugin.count("stage") >= 3).await;
        vm.delete_pod(&a);
        until_forgotten(&vm).await;
        let calls = plugin.calls();
        assert!(!calls.iter().any(|c| c.contains("publish")), "{calls:?}");
        assert_eq!(plugin.count("unstage"), unstages, "{first:?}: {calls:?}");
        vm.stop().await.unwrap();
    }
}

/// `Test_Run_Positive_VolumeMountControllerAttachEnabledRace`: the pod is
/// deleted, and added back while its volume's device is being unmounted.
/// Nothing is set up over the device while it is unmounted; once the
/// unmount finishes, the device is mounted again and the pod's volume set
/// up again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_added_back_while_its_device_is_unmounted_is_mounted_again() {
    let plugin = Arc::new(ScriptedPlugin::new(Script::ok(), Script::ok()));
    let (_t, vm) = manager(&plugin).await;
    let a = PodUid::new("a").unwrap();
    vm.set_desired_pod(desired("a"));
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    plugin.gate_unstage.store(true, Ordering::SeqCst);
    vm.delete_pod(&a);
    tokio::time::timeout(T, plugin.unstaging.notified())
        .await
        .unwrap();
    vm.set_desired_pod(desired("a"));
    // The reconciler looks at the volume again meanwhile: a set-up now
    // would find the executor busy with the unmount.
    vm.wait_converged(None, Duration::from_millis(200))
        .await
        .ok();
    plugin.resume.notify_one();
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    let want = [
        "stage",
        "publish a",
        "unpublish a",
        "unstage begins",
        "unstage",
        "stage",
        "publish a",
    ];
    assert_eq!(plugin.calls(), want.map(String::from).to_vec());
    assert_eq!(
        vm.world().asw().device_mount_state(&volume()),
        DeviceMountState::Mounted
    );
    assert_eq!(vm.mounted_volumes_for_pod(&a).len(), 1);
}

/// `TestFindAndRemoveDeletedPodsWithUncertain`: a deleted pod whose volume
/// is uncertain (its set-up timed out) leaves the desired state and its
/// volume is torn down, while another pod keeps the device mounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_with_an_uncertain_volume_is_removed_and_torn_down() {
    let plugin = Arc::new(ScriptedPlugin::new(
        Script::ok(),
        Script::then(&[], Outcome::Uncertain),
    ));
    *plugin.publish_pod.lock().unwrap() = Some("a".into());
    let (_t, vm) = manager(&plugin).await;
    let (a, b) = (PodUid::new("a").unwrap(), PodUid::new("b").unwrap());
    vm.set_desired_pod(desired("a"));
    until(&vm, |vm| {
        pod_state(vm, &a) == Some(VolumeMountState::Uncertain)
    })
    .await;
    vm.set_desired_pod(desired("b"));
    vm.wait_for_attach_and_mount(&b, T).await.unwrap();
    vm.delete_pod(&a);
    assert!(!vm.pod_is_known(&a));
    vm.wait_for_unmount(&a, T).await.unwrap();
    assert!(!vm.has_possibly_mounted_volumes_for_pod(&a));
    assert_eq!(plugin.count("unpublish a"), 1, "{:?}", plugin.calls());
    assert_eq!(plugin.count("unstage"), 0, "b still uses the device");
    assert_eq!(vm.mounted_volumes_for_pod(&b).len(), 1);
}

/// `Test_UncertainVolumeMountState`, "success followed by failed operation
/// should result in mounted volume": a mounted volume set up again in place
/// (a republish) that fails for certain stays mounted, and is torn down
/// once when the pod goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_set_up_again_leaves_a_mounted_volume_mounted() {
    let plugin = Arc::new(ScriptedPlugin::new(
        Script::ok(),
        Script::then(&[Outcome::Ok], Outcome::Fail),
    ));
    let (_t, vm) = manager(&plugin).await;
    let a = PodUid::new("a").unwrap();
    vm.set_desired_pod(desired_republished("a"));
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    plugin.remount.store(true, Ordering::SeqCst);
    vm.reconciler().resync().await;
    until(&vm, |_| plugin.count("publish a") >= 2).await;
    vm.wait_converged(Some(1), T).await.unwrap();
    assert_eq!(pod_state(&vm, &a), Some(VolumeMountState::Mounted));
    assert_eq!(vm.mounted_volumes_for_pod(&a).len(), 1);
    vm.delete_pod(&a);
    until_forgotten(&vm).await;
    assert_eq!(plugin.count("unpublish a"), 1, "{:?}", plugin.calls());
}

/// `Test_UncertainVolumeMountState`, "success followed by timeout operation
/// should result in mounted volume": a mounted volume set up again in place
/// (a republish) that times out stays mounted (the kubelet's
/// `markVolumeErrorState` makes only a volume not mounted uncertain), and
/// is torn down once when the pod goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_set_up_again_leaves_a_mounted_volume_mounted() {
    let plugin = Arc::new(ScriptedPlugin::new(
        Script::ok(),
        Script::then(&[Outcome::Ok], Outcome::Uncertain),
    ));
    let (_t, vm) = manager(&plugin).await;
    let a = PodUid::new("a").unwrap();
    vm.set_desired_pod(desired_republished("a"));
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    plugin.remount.store(true, Ordering::SeqCst);
    vm.reconciler().resync().await;
    until(&vm, |_| plugin.count("publish a") >= 2).await;
    vm.wait_converged(Some(1), T).await.unwrap();
    assert_eq!(pod_state(&vm, &a), Some(VolumeMountState::Mounted));
    assert_eq!(vm.mounted_volumes_for_pod(&a).len(), 1);
    vm.delete_pod(&a);
    until_forgotten(&vm).await;
    assert_eq!(plugin.count("unpublish a"), 1, "{:?}", plugin.calls());
}

/// Pod `uid` whose volume `shared` no longer resolves (its claim deleted).
fn desired_unresolved(uid: &str) -> DesiredPod {
    use crate::populator::convert::VolumeSpecError;
    let mut d = desired(uid);
    d.volumes[0].source = Err(VolumeSpecError::Missing(
        "PersistentVolumeClaim ns/claim not found".into(),
    ));
    d
}

/// The pod's error and its volume's state in status.
fn pod_error_and_state(vm: &VolumeManager, uid: &PodUid) -> (Option<String>, String) {
    let st = vm.status();
    let p = st.pods.iter().find(|p| p.uid == uid.as_str()).unwrap();
    (p.error.clone(), p.volumes[0].state.clone())
}

/// `TestFindAndAddNewPods_WithReprocessPodAndVolumeRetrievalError`: a pod
/// processed again whose volume no longer resolves (its claim deleted)
/// keeps the volume in the desired state, mounted, the error on the pod;
/// resolving again clears the error without a new set-up. A new pod whose
/// volume never resolved is not set up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_that_no_longer_resolves_stays_mounted() {
    let plugin = Arc::new(ScriptedPlugin::new(Script::ok(), Script::ok()));
    let (_t, vm) = manager(&plugin).await;
    let a = PodUid::new("a").unwrap();
    vm.set_desired_pod(desired("a"));
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    vm.set_desired_pod(desired_unresolved("a"));
    vm.reconciler().resync().await;
    vm.wait_converged(Some(1), T).await.unwrap();
    assert!(vm.world().dsw().pod_exists_in_volume(&volume(), &a));
    assert_eq!(pod_state(&vm, &a), Some(VolumeMountState::Mounted));
    let (error, state) = pod_error_and_state(&vm, &a);
    assert!(error.unwrap().contains("ns/claim not found"));
    assert_eq!(state, "mounted");
    // Processed again with the same error: still kept.
    vm.set_desired_pod(desired_unresolved("a"));
    vm.wait_converged(Some(1), T).await.unwrap();
    assert_eq!(pod_state(&vm, &a), Some(VolumeMountState::Mounted));
    vm.set_desired_pod(desired("a"));
    vm.wait_converged(Some(1), T).await.unwrap();
    assert_eq!(pod_error_and_state(&vm, &a), (None, "mounted".into()));
    let b = PodUid::new("b").unwrap();
    vm.set_desired_pod(desired_unresolved("b"));
    vm.reconciler().resync().await;
    assert_eq!(pod_state(&vm, &b), None);
    assert_eq!(pod_error_and_state(&vm, &b).1, "error");
    let calls = plugin.calls();
    assert_eq!(
        calls,
        ["stage", "publish a"],
        "nothing torn down or set up again"
    );
    vm.delete_pod(&b);
    vm.delete_pod(&a);
    until_forgotten(&vm).await;
    assert_eq!(plugin.count("unpublish a"), 1, "{:?}", plugin.calls());
    assert_eq!(plugin.count("unstage"), 1, "{:?}", plugin.calls());
}

const LABEL_A: &str = "system_u:object_r:container_file_t:s0:c1,c2";
const LABEL_B: &str = "system_u:object_r:container_file_t:s0:c3,c4";

/// Volume `shared` as a ReadWriteOncePod CSI PersistentVolume of a driver
/// with `seLinuxMount` (mounted with its pods' SELinux label).
fn selinux_source() -> VolumeSource {
    let mut src = crate::volume::CsiVolumeSource::new("scripted", "h");
    src.pv_name = Some("pv".into());
    src.driver_info = Arc::new(crate::volume::CsiDriverInfo {
        selinux_mount: true,
        ..Default::default()
    });
    VolumeSource::Csi(Box::new(src))
}

/// Pod `uid` with volume `shared` ([`selinux_source`]), its container
/// labelled `label`.
fn desired_labelled(uid: &str, label: &str) -> DesiredPod {
    let mut d = desired(uid);
    d.volumes[0].source = Ok(selinux_source());
    d.volumes[0].selinux = crate::cache::selinux::VolumeSeLinux {
        file_labels: [Arc::from(label)].into(),
        pv_access_modes: Some(vec!["ReadWriteOncePod".into()]),
        ..Default::default()
    };
    d
}

/// A started manager over `root` with `plugin`, on a host with SELinux
/// (`--selinux-enabled=true`); its sources not populated yet.
async fn selinux_manager(plugin: &Arc<ScriptedPlugin>, root: &Path) -> Arc<VolumeManager> {
    let mut cfg = Config::new(root);
    cfg.backoff = Backoff::new(Duration::from_millis(10), 2, Duration::from_millis(50));
    cfg.selinux_enabled = Some(true);
    let vm = VolumeManager::new(cfg, Arc::new(FakeMounter::default())).unwrap();
    vm.register_plugin(plugin.clone()).unwrap();
    vm.start().await.unwrap();
    vm
}

/// The kubelet's `seLinuxMountMismatchError` text for the volume.
fn mismatch_error() -> String {
    format!("waiting for unmount of volume \"{}\", because it is already mounted to a different pod with a different SELinux label", volume())
}

/// What status and `WaitForAttachAndMount` say of pod `uid` waiting for
/// the volume mounted with another label: the volume's error, the pod's
/// error, the wait's pod error.
async fn mismatch_seen(vm: &VolumeManager, uid: &PodUid) -> (String, String, String) {
    let st = vm.status();
    let p = st.pods.iter().find(|p| p.uid == uid.as_str()).unwrap();
    let wait = vm.wait_for_attach_and_mount(uid, T).await.unwrap_err();
    (
        p.volumes[0].error.clone().unwrap_or_default(),
        p.error.clone().unwrap_or_default(),
        wait.to_string(),
    )
}

/// `Test_AddPodToVolume_Positive_SELinux`, `Test_MarkDeviceAsMounted_Positive_SELinux`
/// and the kubelet's `mountOrAttachVolumes` / `unmountDetachDevices` with
/// SELinux: pod b needs the volume with another label than pod a, which
/// has it staged and published. While a is desired, b is refused (the
/// desired state's `conflicting SELinux labels`); once a is deleted, b
/// waits with the kubelet's `waiting for unmount of volume ...` error
/// (status and `WaitForAttachAndMount`) until the device is unstaged, then
/// it is staged again with b's label and b published. Before, b was
/// published with its label on the staging a's label made, and the device
/// never staged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_another_selinux_label_waits_for_the_device_to_be_staged_again() {
    let plugin = Arc::new(ScriptedPlugin::new(Script::ok(), Script::ok()));
    let t = tempfile::tempdir().unwrap();
    let vm = selinux_manager(&plugin, t.path()).await;
    vm.set_populated();
    let (a, b) = (PodUid::new("a").unwrap(), PodUid::new("b").unwrap());
    vm.set_desired_pod(desired_labelled("a", LABEL_A));
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    vm.set_desired_pod(desired_labelled("b", LABEL_B));
    let refused = vm.wait_for_attach_and_mount(&b, T).await.unwrap_err();
    assert!(
        refused.to_string().contains("conflicting SELinux labels"),
        "{refused}"
    );
    plugin.gate_unstage.store(true, Ordering::SeqCst);
    vm.delete_pod(&a);
    tokio::time::timeout(T, plugin.unstaging.notified())
        .await
        .unwrap();
    let want = mismatch_error();
    let (volume_error, pod_error, wait) = mismatch_seen(&vm, &b).await;
    assert_eq!(volume_error, want);
    assert_eq!(pod_error, format!("volume shared: {want}"));
    assert!(wait.contains(&want), "{wait}");
    assert_eq!(pod_state(&vm, &b), None);
    plugin.resume.notify_one();
    // The kubelet's pod worker tries again until the wait succeeds.
    until(&vm, |vm| {
        pod_state(vm, &b) == Some(VolumeMountState::Mounted)
    })
    .await;
    vm.wait_for_attach_and_mount(&b, T).await.unwrap();
    let (ctx_a, ctx_b) = (context_flag(Some(LABEL_A)), context_flag(Some(LABEL_B)));
    let want = [
        format!("stage{ctx_a}"),
        format!("publish a{ctx_a}"),
        "unpublish a".into(),
        "unstage begins".into(),
        "unstage".into(),
        format!("stage{ctx_b}"),
        format!("publish b{ctx_b}"),
    ];
    assert_eq!(plugin.calls(), want);
    let asw = vm.world().asw();
    let context = asw.volume(&volume()).unwrap().selinux_mount_context.clone();
    assert_eq!(context.as_deref(), Some(LABEL_B));
}

/// The same after a restart: a volume staged and published for pod a with
/// its label, found on disk with it (as CSI's `vol_data.json` records it)
/// by a restarted manager to which only pod b, with another label, is
/// desired: b waits with the kubelet's error while a's volume is torn
/// down, the device is staged again with b's label, b published. Before, a
/// restarted manager knew no label: b was published on a's staging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_selinux_label_a_device_was_staged_with() {
    let t = tempfile::tempdir().unwrap();
    let mut spec = Arc::new(VolumeSpec {
        name: "shared".into(),
        source: selinux_source(),
    });
    crate::cache::selinux::set_mount_label(&mut spec, Some(&Arc::from(LABEL_A)));
    let plugin = Arc::new(ScriptedPlugin::new(Script::ok(), Script::ok()));
    *plugin.on_disk.lock().unwrap() = Some(((*spec).clone(), vec!["a".into()]));
    std::fs::create_dir_all(t.path().join("pods/a/volumes/fake~scripted/shared")).unwrap();
    plugin.gate_unstage.store(true, Ordering::SeqCst);
    let vm = selinux_manager(&plugin, t.path()).await;
    {
        let asw = vm.world().asw();
        let context = asw.volume(&volume()).unwrap().selinux_mount_context.clone();
        assert_eq!(context.as_deref(), Some(LABEL_A), "recovered at start-up");
    }
    let b = PodUid::new("b").unwrap();
    vm.set_desired_pod(desired_labelled("b", LABEL_B));
    vm.set_populated();
    tokio::time::timeout(T, plugin.unstaging.notified())
        .await
        .unwrap();
    let (volume_error, _, wait) = mismatch_seen(&vm, &b).await;
    assert_eq!(volume_error, mismatch_error());
    assert!(wait.contains(&mismatch_error()), "{wait}");
    plugin.resume.notify_one();
    // The kubelet's pod worker tries again until the wait succeeds.
    until(&vm, |vm| {
        pod_state(vm, &b) == Some(VolumeMountState::Mounted)
    })
    .await;
    vm.wait_for_attach_and_mount(&b, T).await.unwrap();
    let ctx_b = context_flag(Some(LABEL_B));
    let want = [
        "unpublish a".to_string(),
        "unstage begins".into(),
        "unstage".into(),
        format!("stage{ctx_b}"),
        format!("publish b{ctx_b}"),
    ];
    assert_eq!(plugin.calls(), want);
}

/// The kubelet's `Test_AddPodToVolume_Positive_MultiOuterNames` through the
/// whole manager: a pod's two volumes naming the same volume are set up
/// once (one stage, one publish), and the pod's mounted volumes list both
/// names with the one path (the kubelet's `GetMountedVolumesForPod`, what
/// the container runtime binds per volume name); status lists both.
/// Before, the desired state kept the last name only: one name was listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_volumes_naming_one_volume_are_set_up_once_under_both_names() {
    let plugin = Arc::new(ScriptedPlugin::new(Script::ok(), Script::ok()));
    let (_t, vm) = manager(&plugin).await;
    let a = PodUid::new("a").unwrap();
    let mut d = desired("a");
    let mut other = d.volumes[0].clone();
    other.name = "other".into();
    d.volumes.push(other);
    vm.set_desired_pod(d);
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    assert_eq!(plugin.calls(), ["stage", "publish a"]);
    let mounted = vm.mounted_volumes_for_pod(&a);
    let names: Vec<&str> = mounted.iter().map(|m| &*m.outer_volume_spec_name).collect();
    assert_eq!(names, ["other", "shared"]);
    assert_eq!(mounted[0].path, mounted[1].path);
    assert!(mounted.iter().all(|m| m.volume_name == volume()));
    let st = vm.status();
    let vols: Vec<(&str, &str)> = st.pods[0]
        .volumes
        .iter()
        .map(|v| (&*v.name, &*v.state))
        .collect();
    assert_eq!(vols, [("shared", "mounted"), ("other", "mounted")]);
    vm.delete_pod(&a);
    until_forgotten(&vm).await;
    assert_eq!(plugin.count("unpublish a"), 1, "{:?}", plugin.calls());
}
