//! The device phase through the plugin trait seam: a fake plugin with a
//! device phase (like CSI staging) and the recording fake mounter.

use std::path::Path;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::cache::actual_state_of_world::DeviceMountState;
use crate::operationexecutor::Backoff;
use crate::plugins::{
    DeviceMountRequest, DeviceMountableVolumePlugin, DeviceUnmountRequest, MountRequest,
    UnmountRequest, VolumeError, VolumePlugin,
};
use crate::sys::fake::FakeMounter;
use crate::sys::mount_table::MountTableView;
use crate::volume::{PodUid, UniqueVolumeName, VolumeSource, VolumeSpec};
use crate::volumemanager::{Config, VolumeManager};
use std::path::PathBuf;
use std::sync::Arc;

/// Claims `nfs` volumes, one volume for every pod (like a PV), and logs
/// its calls; `uncertain_stages` makes that many stages uncertain, the
/// `fail_*` queues fail the next calls with their errors, and
/// `failing_unstages` fails that many unstages.
#[derive(Default)]
struct FakeDevicePlugin {
    calls: StdMutex<Vec<String>>,
    uncertain_stages: StdMutex<u32>,
    fail_publish: StdMutex<Vec<VolumeError>>,
    fail_unpublish: StdMutex<Vec<VolumeError>>,
    failing_unstages: StdMutex<u32>,
    /// The size every spec asks for (none: not expandable).
    size: StdMutex<Option<u64>>,
    fail_expand: StdMutex<Vec<VolumeError>>,
}

impl FakeDevicePlugin {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    fn log(&self, c: String) {
        self.calls.lock().unwrap().push(c);
    }
}

#[async_trait::async_trait]
impl VolumePlugin for FakeDevicePlugin {
    fn name(&self) -> &str {
        "fake/device"
    }
    fn can_support(&self, s: &VolumeSource) -> bool {
        matches!(s, VolumeSource::Other { kind, .. } if kind == "nfs")
    }
    fn unique_volume_name(&self, _pod: &PodUid, spec: &VolumeSpec) -> UniqueVolumeName {
        UniqueVolumeName::new(format!("fake/device/{}", spec.name))
    }
    async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        self.log(format!("publish {}", req.pod_uid));
        if let Some(e) = self.fail_publish.lock().unwrap().pop() {
            return Err(e);
        }
        Ok(PathBuf::from(format!("/fake/{}", req.pod_uid)))
    }
    async fn tear_down(&self, req: UnmountRequest) -> Result<(), VolumeError> {
        self.log(format!("unpublish {}", req.pod_uid));
        if let Some(e) = self.fail_unpublish.lock().unwrap().pop() {
            return Err(e);
        }
        Ok(())
    }
    fn verify(&self, _: &VolumeSpec, _: &Path, _: MountTableView<'_>) -> bool {
        true
    }
    fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin> {
        Some(self)
    }
    fn node_expandable(&self) -> Option<&dyn crate::plugins::NodeExpandableVolumePlugin> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl crate::plugins::NodeExpandableVolumePlugin for FakeDevicePlugin {
    fn requested_size(&self, _: &VolumeSpec) -> Option<u64> {
        *self.size.lock().unwrap()
    }
    async fn node_expand(&self, req: crate::plugins::NodeExpandRequest) -> Result<(), VolumeError> {
        self.log(format!("expand {}", req.new_size));
        match self.fail_expand.lock().unwrap().pop() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl DeviceMountableVolumePlugin for FakeDevicePlugin {
    fn can_device_mount(&self, _: &VolumeSpec) -> bool {
        true
    }
    fn device_mount_path(&self, _: &VolumeSpec) -> Result<PathBuf, VolumeError> {
        Ok("/fake/global".into())
    }
    async fn mount_device(&self, _: DeviceMountRequest) -> Result<PathBuf, VolumeError> {
        self.log("stage".into());
        let mut n = self.uncertain_stages.lock().unwrap();
        if *n > 0 {
            *n -= 1;
            return Err(VolumeError::Uncertain("timed out".into()));
        }
        Ok("/fake/global".into())
    }
    async fn unmount_device(&self, _: DeviceUnmountRequest) -> Result<(), VolumeError> {
        self.log("unstage".into());
        let mut n = self.failing_unstages.lock().unwrap();
        if *n > 0 {
            *n -= 1;
            return Err(VolumeError::Plugin {
                plugin: "kubernetes.io/csi".into(),
                message: "rpc error: code = InvalidArgument: unstage refused".into(),
            });
        }
        Ok(())
    }
}

fn pod(uid: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {
            "containers": [{"name": "c", "volumeMounts": [{"name": "shared", "mountPath": "/s"}]}],
            "volumes": [{"name": "shared", "nfs": {"server": "s", "path": "/"}}]
        }
    }))
    .unwrap()
}

async fn manager() -> (tempfile::TempDir, Arc<FakeDevicePlugin>, Arc<VolumeManager>) {
    manager_with(Backoff::new(
        Duration::from_millis(10),
        2,
        Duration::from_millis(50),
    ))
    .await
}

async fn manager_with(
    backoff: Backoff,
) -> (tempfile::TempDir, Arc<FakeDevicePlugin>, Arc<VolumeManager>) {
    let t = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(t.path());
    cfg.backoff = backoff;
    let vm = VolumeManager::new(cfg, Arc::new(FakeMounter::default())).unwrap();
    let plugin = Arc::new(FakeDevicePlugin::default());
    vm.register_plugin(plugin.clone()).unwrap();
    vm.start().await.unwrap();
    (t, plugin, vm)
}

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_one_device_mount_unmounted_after_the_last_pod() {
    let (_t, plugin, vm) = manager().await;
    let a = vm.upsert_pod(&pod("a")).unwrap();
    let b = vm.upsert_pod(&pod("b")).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    vm.wait_for_attach_and_mount(&b, T).await.unwrap();
    let calls = plugin.calls();
    assert_eq!(
        calls.iter().filter(|c| *c == "stage").count(),
        1,
        "{calls:?}"
    );
    assert_eq!(calls[0], "stage", "staged before any publish: {calls:?}");
    assert_eq!(calls.iter().filter(|c| c.starts_with("publish")).count(), 2);
    let v = UniqueVolumeName::new("fake/device/shared");
    assert_eq!(
        vm.world().asw().device_mount_state(&v),
        DeviceMountState::Mounted
    );

    // One pod goes: its publish is undone, the device stays.
    vm.delete_pod(&a);
    vm.wait_for_unmount(&a, T).await.unwrap();
    vm.wait_converged(Some(1), T).await.unwrap();
    let calls = plugin.calls();
    assert!(calls.contains(&"unpublish a".to_string()));
    assert!(!calls.contains(&"unstage".to_string()), "{calls:?}");

    // The last one goes: unpublish, then unstage, then the volume is forgotten.
    vm.delete_pod(&b);
    vm.wait_converged(Some(0), T).await.unwrap();
    let mut rx = vm.world().subscribe();
    while vm.world().asw().volume(&v).is_some() {
        rx.changed().await.unwrap();
    }
    let calls = plugin.calls();
    assert_eq!(
        calls.last().map(String::as_str),
        Some("unstage"),
        "{calls:?}"
    );
    assert_eq!(calls.iter().filter(|c| *c == "unstage").count(), 1);
    let text = vm.metrics_text();
    assert!(
        text.contains(
            "operation_name=\"mount_device\",volume_plugin=\"fake/device\",status=\"success\""
        ),
        "{text}"
    );
    assert!(text.contains("operation_name=\"unmount_device\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_device_mount_is_mounted_again_before_any_set_up() {
    let (_t, plugin, vm) = manager().await;
    *plugin.uncertain_stages.lock().unwrap() = 2;
    let a = vm.upsert_pod(&pod("a")).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    assert_eq!(plugin.calls(), vec!["stage", "stage", "stage", "publish a"]);
    // Unwanted while uncertain: still unmounted (not assumed gone).
    *plugin.uncertain_stages.lock().unwrap() = 1;
    vm.delete_pod(&a);
    vm.wait_converged(Some(0), T).await.unwrap();
    let v = UniqueVolumeName::new("fake/device/shared");
    let mut rx = vm.world().subscribe();
    while vm.world().asw().volume(&v).is_some() {
        rx.changed().await.unwrap();
    }
    assert_eq!(plugin.calls().last().map(String::as_str), Some("unstage"));
}

/// A CSI call of `method` that failed with `code`, as the plugin
/// classifies it for `op` (`Ok` when it means nothing is left to do).
fn csi_error(
    op: crate::plugins::csi::errors::CsiOp,
    method: &'static str,
    code: tonic::Code,
) -> Result<(), VolumeError> {
    crate::plugins::csi::errors::classify(
        op,
        crate::pluginmanager::csi_client::CsiCallError::Rpc {
            driver: "d".into(),
            method,
            code,
            message: "injected".into(),
            transport: false,
        },
    )
}

/// Every gRPC code, failing one publish and then one unpublish (as the
/// CSI plugin classifies it): the pod is set up, and torn down once
/// deleted, within a few backoff steps; none stops the retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grpc_code_failing_publish_and_unpublish_once_is_retried() {
    use crate::plugins::csi::errors::CsiOp;
    let (_t, plugin, vm) = manager().await;
    vm.set_populated();
    let codes = crate::plugins::csi::errors::ALL_CODES;
    let count = |c: &str| plugin.calls().iter().filter(|x| *x == c).count();
    for (i, code) in codes.into_iter().enumerate() {
        let uid = format!("p{i}");
        let publish = csi_error(CsiOp::Publish, "/csi.v1.Node/NodePublishVolume", code);
        plugin
            .fail_publish
            .lock()
            .unwrap()
            .push(publish.unwrap_err());
        let p = vm.upsert_pod(&pod(&uid)).unwrap();
        vm.wait_for_attach_and_mount(&p, T)
            .await
            .unwrap_or_else(|e| panic!("{code:?}: {e}: {:?}", plugin.calls()));
        assert_eq!(count(&format!("publish {uid}")), 2, "{code:?}");
        let unpublish = csi_error(CsiOp::Unpublish, "/csi.v1.Node/NodeUnpublishVolume", code);
        let failed = unpublish.is_err();
        if let Err(e) = unpublish {
            plugin.fail_unpublish.lock().unwrap().push(e);
        }
        vm.delete_pod(&p);
        vm.wait_for_unmount(&p, T)
            .await
            .unwrap_or_else(|e| panic!("{code:?}: {e}: {:?}", plugin.calls()));
        let want = if failed { 2 } else { 1 };
        assert_eq!(count(&format!("unpublish {uid}")), want, "{code:?}");
    }
    vm.wait_converged(Some(0), T).await.unwrap();
}

/// A device whose unmount (CSI NodeUnstageVolume) fails stays in
/// status with its error and keeps the node from converging; it is
/// retried until it is unmounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_whose_unmount_fails_shows_and_is_retried_until_unmounted() {
    let (_t, plugin, vm) = manager().await;
    let a = vm.upsert_pod(&pod("a")).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    let devices = vm.status().devices;
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!((devices[0].state.as_str(), devices[0].pods), ("mounted", 1));
    *plugin.failing_unstages.lock().unwrap() = u32::MAX;
    vm.delete_pod(&a);
    vm.wait_for_unmount(&a, T).await.unwrap();
    let mut rx = vm.world().subscribe();
    let failed = loop {
        let d = vm.status().devices;
        if d.first()
            .is_some_and(|d| d.attempts >= 2 && d.error.is_some())
        {
            break d;
        }
        rx.changed().await.unwrap();
    };
    assert_eq!(failed.len(), 1);
    let d = &failed[0];
    assert_eq!(
        (d.state.as_str(), d.pods, d.operation.as_deref()),
        ("unmounting", 0, Some("unmount_device"))
    );
    assert!(d.error.as_deref().unwrap().contains("unstage refused"));
    assert!(vm.status().pods.is_empty());
    let e = vm
        .wait_converged(Some(0), Duration::from_millis(1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("device still mounted"), "{e}");
    let text = vm.metrics_text();
    assert!(
        text.contains("volmgr_volume_devices{plugin_name=\"fake/device\",state=\"unmounting\"} 1"),
        "{text}"
    );
    // The driver recovers: unmounted at the next retry, and converged.
    *plugin.failing_unstages.lock().unwrap() = 0;
    vm.wait_converged(Some(0), T).await.unwrap();
    assert!(vm.status().devices.is_empty());
    assert!(!vm.metrics_text().contains("volmgr_volume_devices{"));
}

/// A device whose unmount fails once is unmounted at the retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_whose_unmount_fails_once_is_unmounted() {
    let (_t, plugin, vm) = manager().await;
    let a = vm.upsert_pod(&pod("a")).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    *plugin.failing_unstages.lock().unwrap() = 1;
    vm.delete_pod(&a);
    vm.wait_converged(Some(0), T).await.unwrap();
    let v = UniqueVolumeName::new("fake/device/shared");
    assert!(vm.world().asw().volume(&v).is_none());
    let unstages = plugin.calls().iter().filter(|c| *c == "unstage").count();
    assert_eq!(unstages, 2);
}

/// An expansion the driver says cannot work (the kubelet's in-use
/// expansion error and infeasible errors) is not asked again for that
/// size, even with no backoff at all, and does not hold pods back; a
/// larger size is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infeasible_expansion_is_not_asked_again_for_that_size() {
    let (_t, plugin, vm) = manager_with(Backoff::new(Duration::ZERO, 2, Duration::ZERO)).await;
    let v = UniqueVolumeName::new("fake/device/shared");
    *plugin.size.lock().unwrap() = Some(100);
    let a = vm.upsert_pod(&pod("a")).unwrap();
    vm.set_populated();
    vm.wait_for_attach_and_mount(&a, T).await.unwrap();
    let infeasible = || {
        crate::plugins::csi::errors::classify(
            crate::plugins::csi::errors::CsiOp::Expand,
            crate::pluginmanager::csi_client::CsiCallError::Rpc {
                driver: "d".into(),
                method: "/csi.v1.Node/NodeExpandVolume",
                code: tonic::Code::OutOfRange,
                message: "too big".into(),
                transport: false,
            },
        )
        .unwrap_err()
    };
    plugin.fail_expand.lock().unwrap().push(infeasible());
    *plugin.size.lock().unwrap() = Some(200);
    vm.world().mark_dirty([v.clone()]);
    let mut rx = vm.world().subscribe();
    // The failure is recorded (shown on the pod's volume)...
    let shown = async {
        while !vm.status().pods[0].volumes[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("too big"))
        {
            rx.changed().await.unwrap();
        }
    };
    tokio::time::timeout(T, shown)
        .await
        .unwrap_or_else(|_| panic!("never shown: {:?}", plugin.calls()));
    // ...then a pass over the volume (it sets up pod b) does not ask
    // for 200 again, though nothing backs off.
    let b = vm.upsert_pod(&pod("b")).unwrap();
    vm.wait_for_attach_and_mount(&b, T).await.unwrap();
    let count = |c: &str| plugin.calls().iter().filter(|x| *x == c).count();
    assert_eq!(count("expand 200"), 1, "{:?}", plugin.calls());
    // A larger size is asked, and grows it.
    *plugin.size.lock().unwrap() = Some(300);
    vm.world().mark_dirty([v.clone()]);
    while vm.world().asw().volume(&v).and_then(|av| av.size_bytes) != Some(300) {
        rx.changed().await.unwrap();
    }
    assert_eq!(count("expand 300"), 1);
}
