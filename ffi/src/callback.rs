//! The caller's event callback and what calls it: volume events and claim
//! resizes, as JSON, from the manager's listeners (set through
//! [`crate::events::volmgr_set_event_callback`]).

use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex};

use volmgr_core::cache::world::{ClaimResize, VolumeEvent, VolumeEventKind};
use volmgr_core::util::sync::MutexExt;
use volmgr_core::volumemanager::VolumeManager;

/// A callback and its userdata, as the caller set them.
#[derive(Clone, Copy)]
pub(crate) struct EventCallback {
    /// The function.
    pub(crate) f: unsafe extern "C" fn(*mut c_void, *const c_char),
    /// Passed back unchanged.
    pub(crate) userdata: *mut c_void,
}

// SAFETY: the caller of volmgr_set_event_callback promises that the callback
// and its userdata may be used from volmgr's threads (documented there).
unsafe impl Send for EventCallback {}

/// Hands volume events and claim resizes to the event callback, if set.
pub(crate) fn forward_events(vm: &Arc<VolumeManager>, events: &Arc<Mutex<Option<EventCallback>>>) {
    // The JSON is built only when a callback is set: building it for every
    // event was a fifth of the C ABI's instructions per volume (BENCHMARKS,
    // "Yardsticks: user-space instructions").
    let call = |sink: &Mutex<Option<EventCallback>>, json: &dyn Fn() -> String| {
        let cb = *sink.locked();
        if let Some(cb) = cb {
            if let Ok(c) = std::ffi::CString::new(json()) {
                // SAFETY: the callback's contract (volmgr_set_event_callback).
                unsafe { (cb.f)(cb.userdata, c.as_ptr()) };
            }
        }
    };
    let sink = Arc::clone(events);
    vm.add_event_listener(Arc::new(move |ev: &VolumeEvent| {
        // The ABI's kinds stay those it documents.
        if ev.kind != VolumeEventKind::Expanded {
            call(&sink, &|| event_json(ev));
        }
    }));
    let sink = Arc::clone(events);
    vm.add_claim_resize_listener(Arc::new(move |r: &ClaimResize| {
        call(&sink, &|| claim_resized_json(r));
    }));
}

/// A [`ClaimResize`] for the event callback: the caller patches the claim's
/// status as the kubelet does (volmgr has no API client).
fn claim_resized_json(r: &ClaimResize) -> String {
    serde_json::json!({
        "kind": "claim_resized",
        "namespace": r.namespace,
        "claim": r.claim,
        "persistent_volume": r.persistent_volume,
        "volume_name": r.volume_name.as_str(),
        "size_bytes": r.size_bytes,
    })
    .to_string()
}

fn event_json(ev: &VolumeEvent) -> String {
    serde_json::json!({
        "kind": ev.kind.as_str(),
        "pod_uid": ev.pod_uid.as_str(),
        "volume": ev.volume,
        "volume_name": ev.volume_name.as_str(),
        "path": ev.path.as_ref().map(|p| p.display().to_string()),
        "error": ev.error,
    })
    .to_string()
}
