//! The pod resolver (`populator/resolver.rs`) feeding the whole manager:
//! what a volume is desired as when its object stops resolving. The
//! resolver's own layer does not see the manager.

use std::sync::Arc;

use crate::populator::objects::{ObjectKind, ObjectRef};
use crate::populator::resolver::tests::{config_map, config_map_pod};
use crate::populator::PodResolver;
use crate::sys::fake::FakeMounter;
use crate::volume::{PodUid, VolumeSource};
use crate::volumemanager::{Config, VolumeManager};

/// What pod `uid`'s volume is desired as (its source, or why it is
/// not), and the pod's error in status.
fn desired_and_error(
    vm: &VolumeManager,
    uid: &PodUid,
) -> (Result<VolumeSource, String>, Option<String>) {
    let dsw = vm.world().dsw();
    let entry = dsw.pod(uid).expect("pod is desired");
    let source = entry.volumes[0]
        .resolution
        .as_result()
        .map_err(str::to_string)
        .map(|name| {
            let dv = dsw.volume(name).expect("volume is desired");
            dv.pods.get(uid).expect("pod in volume").spec.source.clone()
        });
    drop(dsw);
    let st = vm.status();
    let pod = st.pods.into_iter().find(|p| p.uid == uid.as_str());
    (source, pod.and_then(|p| p.error))
}

/// A volume whose object stops resolving keeps its desired state (what
/// it last resolved to) whatever is processed again: its object
/// deleted with the pod unchanged, then the pod changed while the object
/// is still gone; the error shows on the pod. The object back: the
/// error goes and the volume follows it. A pod whose object never
/// resolved keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_whose_object_stops_resolving_keeps_its_desired_state() {
    let root = tempfile::tempdir().unwrap();
    let vm =
        VolumeManager::new(Config::new(root.path()), Arc::new(FakeMounter::default())).unwrap();
    let mut r = PodResolver::new(vm.pod_sink());
    r.upsert_object(config_map("one"));
    let uid = r.upsert_pod(config_map_pod("a", "cm", "1")).unwrap();
    let (resolved, error) = desired_and_error(&vm, &uid);
    let resolved = resolved.expect("resolved");
    assert_eq!(error, None);

    // The object changed (deleted), the pod did not.
    assert!(r.delete_object(&ObjectRef::new(ObjectKind::ConfigMap, "ns", "cm")));
    let (kept, error) = desired_and_error(&vm, &uid);
    assert_eq!(kept.as_ref(), Ok(&resolved), "kept after its object went");
    let error = error.expect("the problem shows on the pod");
    assert!(error.contains("ConfigMap ns/cm not found"), "{error}");

    // The pod changed while its object is gone.
    r.upsert_pod(config_map_pod("a", "cm", "2")).unwrap();
    let (kept, error) = desired_and_error(&vm, &uid);
    assert_eq!(kept.as_ref(), Ok(&resolved), "kept after the pod changed");
    assert!(error.is_some_and(|e| e.contains("ConfigMap ns/cm not found")));

    // Back with another value: the error goes, the volume follows.
    r.upsert_object(config_map("two"));
    let (updated, error) = desired_and_error(&vm, &uid);
    assert_eq!(error, None);
    assert_ne!(updated.expect("resolved again"), resolved);

    // Never resolved: nothing to keep.
    let b = r.upsert_pod(config_map_pod("b", "missing", "1")).unwrap();
    let (never, _) = desired_and_error(&vm, &b);
    let never = never.unwrap_err();
    assert!(never.contains("ConfigMap ns/missing not found"), "{never}");

    // Terminated while its object is gone: the volume leaves the
    // desired state (torn down); the pod's entry still names it, with
    // the error.
    assert!(r.delete_object(&ObjectRef::new(ObjectKind::ConfigMap, "ns", "cm")));
    let mut done = (*config_map_pod("a", "cm", "2")).clone();
    done.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    r.upsert_pod(Arc::new(done)).unwrap();
    let dsw = vm.world().dsw();
    let v = &dsw.pod(&uid).expect("pod is desired").volumes[0];
    let name = v
        .resolution
        .name()
        .cloned()
        .expect("its volume still named");
    assert!(v
        .resolution
        .kept_error()
        .is_some_and(|e| e.contains("not found")));
    assert!(!dsw.pod_exists_in_volume(&name, &uid), "not kept mounted");
}
