//! The kubelet's waits: attach and mount, unmount, all pods unmount.

use std::ffi::c_char;
use std::time::Duration;

use volmgr_core::volume::PodUid;
use volmgr_core::volumemanager::WaitError;

use crate::boundary::{guard, json_arg, str_arg, try_ffi};
use crate::error::*;
use crate::handle::{block_on, handle, pod_handle, uid_arg, volmgr};

fn wait_status(r: Result<(), WaitError>) -> volmgr_status {
    match r {
        Ok(()) => VOLMGR_OK,
        Err(e) => fail_err(&e),
    }
}

/// The kubelet's `WaitForAttachAndMount`: returns `VOLMGR_OK` once every
/// volume of the pod is mounted, `VOLMGR_ERR_TIMEOUT` (with what is missing)
/// after `timeout_ms`, `VOLMGR_ERR_NOT_FOUND` for a pod never upserted.
/// Volumes of the pod that could not be processed end it at once with
/// `VOLMGR_ERR_POD_VOLUME_ERRORS`; a timeout with a volume refused for the
/// node's attach limit is `VOLMGR_ERR_ATTACH_LIMIT_EXCEEDED`. Both errors
/// have the kubelet's text (`volmgr_last_error`).
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
        let (h, uid) = try_ffi!(unsafe { pod_handle(vm, pod_uid) });
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
        let (h, uid) = try_ffi!(unsafe { pod_handle(vm, pod_uid) });
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::*;
    use std::ffi::{CStr, CString};

    /// A started handle over a fresh ROOT (with CSI, no driver).
    fn started(root: &std::path::Path) -> *mut volmgr {
        let config = CString::new(format!(
            r#"{{"root_dir": "{}", "tracer": "off", "make_root_shared": false,
                "node_name": "node-1", "csi": {{}}}}"#,
            root.display()
        ))
        .unwrap();
        let mut vm: *mut volmgr = std::ptr::null_mut();
        // SAFETY: valid arguments.
        unsafe {
            assert_eq!(volmgr_new(config.as_ptr(), &mut vm), VOLMGR_OK);
            assert_eq!(volmgr_start(vm), VOLMGR_OK);
        }
        vm
    }

    fn upsert(vm: *mut volmgr, json: serde_json::Value) {
        let text = CString::new(json.to_string()).unwrap();
        let kind = json["kind"].as_str().unwrap();
        // SAFETY: a live handle and a NUL-terminated string.
        let st = unsafe {
            if kind == "Pod" {
                volmgr_pod_upsert(vm, text.as_ptr())
            } else {
                volmgr_object_upsert(vm, text.as_ptr())
            }
        };
        assert_eq!(st, VOLMGR_OK, "{kind}: {}", last_error());
    }

    fn last_error() -> String {
        let msg = volmgr_last_error();
        assert!(!msg.is_null());
        // SAFETY: a NUL-terminated string owned by volmgr.
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    }

    /// Pod `uid` (on node-1) using claim `claim` as `data`.
    fn pod(uid: &str, claim: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i",
                "volumeMounts": [{"name": "data", "mountPath": "/d"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}})
    }

    fn wait(vm: *mut volmgr, uid: &str, timeout_ms: u64) -> (volmgr_status, String) {
        let uid = CString::new(uid).unwrap();
        // SAFETY: a live handle and a NUL-terminated string.
        let st = unsafe { volmgr_wait_for_attach_and_mount(vm, uid.as_ptr(), timeout_ms) };
        (
            st,
            if st == VOLMGR_OK {
                String::new()
            } else {
                last_error()
            },
        )
    }

    /// The kubelet's pod errors end `WaitForAttachAndMount` at once, with
    /// its text and a status of their own. Before, a claim not found kept
    /// the wait for its whole timeout (2 min here), then `VOLMGR_ERR_TIMEOUT`
    /// with volmgr's own text.
    #[test]
    fn pod_volume_errors_end_the_wait_at_once_with_the_kubelets_text() {
        let root = tempfile::tempdir().unwrap();
        let vm = started(root.path());
        upsert(vm, pod("uid-e", "missing"));
        let (st, msg) = wait(vm, "uid-e", 120_000);
        assert_eq!(st, VOLMGR_ERR_POD_VOLUME_ERRORS, "{msg}");
        assert_eq!(
            msg,
            "unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: \
             PersistentVolumeClaim ns/missing not found"
        );
        // SAFETY: the handle is live and freed once.
        unsafe { volmgr_free(vm) };
    }

    /// A second pod whose SELinux label differs from the one a volume is
    /// used with (a CSIDriver with `seLinuxMount`, `"selinux_enabled":
    /// true`) is the kubelet's pod error: the wait ends at once with
    /// `conflicting SELinux labels of volume ...`. Before, nothing compared
    /// the two pods' labels.
    #[test]
    fn a_conflicting_selinux_label_ends_the_wait_with_the_kubelets_error() {
        let root = tempfile::tempdir().unwrap();
        let config = CString::new(format!(
            r#"{{"root_dir": "{}", "tracer": "off", "node_name": "node-1",
                "selinux_enabled": true, "csi": {{}}}}"#,
            root.path().display()
        ))
        .unwrap();
        let mut vm: *mut volmgr = std::ptr::null_mut();
        // SAFETY: valid arguments.
        unsafe {
            assert_eq!(volmgr_new(config.as_ptr(), &mut vm), VOLMGR_OK);
            assert_eq!(volmgr_start(vm), VOLMGR_OK);
        }
        upsert(
            vm,
            serde_json::json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": "d.example"}, "spec": {"attachRequired": false, "seLinuxMount": true}}),
        );
        upsert(
            vm,
            serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "claimRef": {"namespace": "ns", "name": "claim"},
                     "csi": {"driver": "d.example", "volumeHandle": "h1"}}}),
        );
        upsert(
            vm,
            serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "claim", "namespace": "ns"},
            "spec": {"volumeName": "pv-1", "accessModes": ["ReadWriteOnce"]}}),
        );
        for (uid, level) in [("uid-a", "s0:c1,c2"), ("uid-b", "s0:c3,c4")] {
            let mut p = pod(uid, "claim");
            p["spec"]["securityContext"] = serde_json::json!({"seLinuxOptions": {"level": level}});
            upsert(vm, p);
        }
        let (st, msg) = wait(vm, "uid-b", 120_000);
        assert_eq!(st, VOLMGR_ERR_POD_VOLUME_ERRORS, "{msg}");
        assert_eq!(
            msg,
            "unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: \
             conflicting SELinux labels of volume pv-1: \
             \"system_u:object_r:container_file_t:s0:c1,c2\" and \"system_u:object_r:container_file_t:s0:c3,c4\""
        );
        // SAFETY: the handle is live and freed once.
        unsafe { volmgr_free(vm) };
    }

    /// A volume whose VolumeAttachment failed with `ResourceExhausted` (the
    /// node's attach limit of its driver) rejects the pod when the wait
    /// times out: the kubelet's `VolumeAttachLimitExceededError` text and
    /// status. Before, it was `VOLMGR_ERR_TIMEOUT` like any other timeout.
    #[test]
    fn attach_limit_rejects_the_pod_at_the_end_of_the_wait() {
        let root = tempfile::tempdir().unwrap();
        let vm = started(root.path());
        upsert(
            vm,
            serde_json::json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": "d.example"}, "spec": {"attachRequired": true}}),
        );
        upsert(
            vm,
            serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "claimRef": {"namespace": "ns", "name": "claim"},
                     "csi": {"driver": "d.example", "volumeHandle": "h1"}},
            "status": {"phase": "Bound"}}),
        );
        upsert(
            vm,
            serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "claim", "namespace": "ns"},
            "spec": {"volumeName": "pv-1", "accessModes": ["ReadWriteOnce"]},
            "status": {"phase": "Bound"}}),
        );
        let va = volmgr_core::populator::convert::csi_driver::attachment_name(
            "h1",
            "d.example",
            "node-1",
        );
        upsert(
            vm,
            serde_json::json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": va},
            "spec": {"attacher": "d.example", "nodeName": "node-1", "source": {"persistentVolumeName": "pv-1"}},
            "status": {"attached": false, "attachError": {"message": "too many", "errorCode": 8}}}),
        );
        upsert(vm, pod("uid-l", "claim"));
        let (st, msg) = wait(vm, "uid-l", 1_000);
        assert_eq!(st, VOLMGR_ERR_ATTACH_LIMIT_EXCEEDED, "{msg}");
        let want = "Node has reached its volume attachment limit, rejecting pod. \
                    unmounted volumes=[data], unattached volumes=[data], failed to process volumes=[]: ";
        assert!(msg.starts_with(want), "{msg}");
        assert!(msg.contains("(ResourceExhausted): too many"), "{msg}");
        // SAFETY: the handle is live and freed once.
        unsafe { volmgr_free(vm) };
    }
}
