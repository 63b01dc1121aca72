//! The objects `volmgr_object_upsert` takes (`KubeObject::from_json`), then
//! a pod resolved against them (PVC → PV → CSI, CSIDriver, Secret,
//! ConfigMap), from one input: a JSON array, the last element the pod.
#![no_main]

use volmgr::populator::objects::{KubeObject, ObjectStore};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(serde_json::Value::Array(mut docs)) = serde_json::from_slice(data) else {
        return;
    };
    let pod = docs.pop();
    let mut store = ObjectStore::default();
    store.set_node_name("n");
    for d in docs {
        if let Ok(o) = KubeObject::from_json(d) {
            store.insert(o);
        }
    }
    let Some(Ok(pod)) = pod.map(serde_json::from_value::<k8s_openapi::api::core::v1::Pod>) else {
        return;
    };
    let _ = store.recording(|s| volmgr::populator::convert::pod::DesiredPod::from_pod_with(&pod, Some(s)));
});
