//! Pods: upsert, delete, and resizing a pod's ephemeral volume.

use std::ffi::c_char;
use std::sync::Arc;

use volmgr_core::util::sync::MutexExt;

use crate::boundary::{guard, json_arg, str_arg, try_ffi};
use crate::error::*;
use crate::handle::{handle, pod_handle, volmgr};

/// Adds or updates a pod (`pod_json`: a Kubernetes v1.Pod). A pod rejected as
/// a whole (no name, invalid UID, duplicate volume names) is
/// `VOLMGR_ERR_INVALID_ARGUMENT`; a volume that cannot be mounted is reported
/// by the waits and volume queries instead.
///
/// # Safety
/// `vm` is NULL or a live handle; `pod_json` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn volmgr_pod_upsert(
    vm: *mut volmgr,
    pod_json: *const c_char,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let text = try_ffi!(unsafe { str_arg(pod_json, "pod_json") });
        let pod: k8s_openapi::api::core::v1::Pod = try_ffi!(json_arg(text, "pod_json"));
        match h.resolver.locked().upsert_pod(Arc::new(pod)) {
            Ok(_) => VOLMGR_OK,
            Err(r) => fail(VOLMGR_ERR_INVALID_ARGUMENT, r.to_string()),
        }
    })
}

/// Removes a pod; its volumes are torn down. `VOLMGR_ERR_NOT_FOUND` if unknown.
///
/// # Safety
/// `vm` is NULL or a live handle; `pod_uid` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn volmgr_pod_delete(
    vm: *mut volmgr,
    pod_uid: *const c_char,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let (h, uid) = try_ffi!(unsafe { pod_handle(vm, pod_uid) });
        if h.resolver.locked().delete_pod(&uid) {
            VOLMGR_OK
        } else {
            fail(VOLMGR_ERR_NOT_FOUND, format!("pod {uid} is not known"))
        }
    })
}

/// The kubelet's `ResizeEphemeralVolume`: resizes the pod's volume `volume`
/// (its name in the pod spec) to `new_size_bytes` at once, in place. Only a
/// `medium: Memory` emptyDir can be resized: its tmpfs is remounted with the
/// new `size=` and keeps its files. `VOLMGR_ERR_NOT_FOUND` for an unknown pod
/// or volume, `VOLMGR_ERR_UNSUPPORTED` for another kind of volume,
/// `VOLMGR_ERR_BUSY` if it is not mounted, `VOLMGR_ERR_INVALID_ARGUMENT` for
/// a size below what the volume holds (nothing changes). The remount runs
/// on a volmgr thread; the call blocks until it is done.
///
/// # Safety
/// `vm` live or NULL; `pod_uid` and `volume` strings or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_resize_ephemeral_volume(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    volume: *const c_char,
    new_size_bytes: u64,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let (h, uid) = try_ffi!(unsafe { pod_handle(vm, pod_uid) });
        // SAFETY: per this function's contract.
        let volume = try_ffi!(unsafe { str_arg(volume, "volume") }).to_string();
        let vm = Arc::clone(&h.vm);
        // On a volmgr thread: the tracer counts mounts made by the host's
        // own threads as out-of-band changes.
        let task = h.rt.spawn(async move {
            vm.resize_ephemeral_volume(&uid, &volume, new_size_bytes)
                .await
        });
        match h.rt.block_on(task) {
            Ok(Ok(())) => VOLMGR_OK,
            Ok(Err(e)) => fail_err(&e),
            Err(e) => fail(VOLMGR_ERR_INTERNAL, format!("resize task: {e}")),
        }
    })
}
