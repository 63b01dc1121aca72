//! Pod → desired volumes (`DesiredPod::from_pod`, what every source and
//! `volmgr_pod_upsert` run on a decoded pod) on any JSON pod.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(pod) = serde_json::from_slice::<k8s_openapi::api::core::v1::Pod>(data) {
        let _ = volmgr::populator::convert::pod::DesiredPod::from_pod(&pod);
        let _ = volmgr::populator::convert::pod::needs_objects(&pod);
    }
});
