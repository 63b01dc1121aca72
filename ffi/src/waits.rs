//! The kubelet's waits: attach and mount, unmount, all pods unmount.

use std::ffi::c_char;
use std::time::Duration;

use volmgr_core::volume::PodUid;
use volmgr_core::volumemanager::WaitError;

use crate::boundary::{guard, json_arg, str_arg, try_ffi};
use crate::error::*;
use crate::handle::{block_on, handle, uid_arg, volmgr};

fn wait_status(r: Result<(), WaitError>) -> volmgr_status {
    match r {
        Ok(()) => VOLMGR_OK,
        Err(e) => fail_err(&e),
    }
}

/// The kubelet's `WaitForAttachAndMount`: returns `VOLMGR_OK` once every
/// volume of the pod is mounted, `VOLMGR_ERR_TIMEOUT` (with what is missing)
/// after `timeout_ms`, `VOLMGR_ERR_NOT_FOUND` for a pod never upserted.
///
/// # Safety
/// `vm` is NULL or a live handle; `pod_uid` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn volmgr_wait_for_attach_and_mount(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    timeout_ms: u64,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let uid = try_ffi!(uid_arg(try_ffi!(unsafe { str_arg(pod_uid, "pod_uid") })));
        if !h.vm.pod_is_known(&uid) {
            return fail(VOLMGR_ERR_NOT_FOUND, format!("pod {uid} is not known"));
        }
        wait_status(try_ffi!(block_on(
            h,
            h.vm.wait_for_attach_and_mount(&uid, Duration::from_millis(timeout_ms))
        )))
    })
}

/// The kubelet's `WaitForUnmount`: returns once nothing of the pod is mounted.
///
/// # Safety
/// `vm` is NULL or a live handle; `pod_uid` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn volmgr_wait_for_unmount(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    timeout_ms: u64,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let uid = try_ffi!(uid_arg(try_ffi!(unsafe { str_arg(pod_uid, "pod_uid") })));
        wait_status(try_ffi!(block_on(
            h,
            h.vm.wait_for_unmount(&uid, Duration::from_millis(timeout_ms))
        )))
    })
}

/// The kubelet's `WaitForAllPodsUnmount`: returns `VOLMGR_OK` once nothing of
/// any pod in `uids_json` (a JSON array of pod UIDs) is mounted or
/// uncertain, or `VOLMGR_ERR_TIMEOUT` listing `pod/volume` for what is left
/// after `timeout_ms` (one timeout for all). An empty array is `VOLMGR_OK`.
///
/// # Safety
/// `vm` is NULL or a live handle; `uids_json` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn volmgr_wait_for_all_pods_unmount(
    vm: *mut volmgr,
    uids_json: *const c_char,
    timeout_ms: u64,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let text = try_ffi!(unsafe { str_arg(uids_json, "uids_json") });
        let raw: Vec<String> = try_ffi!(json_arg(text, "uids_json"));
        let uids: Vec<PodUid> = try_ffi!(raw.iter().map(|u| uid_arg(u)).collect());
        let timeout = Duration::from_millis(timeout_ms);
        wait_status(h.rt.block_on(h.vm.wait_for_all_pods_unmount(&uids, timeout)))
    })
}
