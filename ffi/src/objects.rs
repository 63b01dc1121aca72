//! The objects pods' volumes refer to: upsert and delete.

use std::ffi::c_char;

use volmgr_core::populator::objects::{KubeObject, ObjectDecodeError, ObjectKind, ObjectRef};
use volmgr_core::util::sync::MutexExt;

use crate::boundary::{guard, str_arg, try_ffi};
use crate::error::*;
use crate::handle::{handle, volmgr};

/// Adds or replaces an object pods' volumes refer to (`object_json`: a
/// Kubernetes PersistentVolume, PersistentVolumeClaim, Secret, ConfigMap,
/// CSIDriver, VolumeAttachment, ServiceAccount (its UID is part of the
/// pod's token requests: a replaced account gets fresh tokens at once),
/// ClusterTrustBundle (`certificates.k8s.io` `v1`, `v1beta1` or
/// `v1alpha1`: projected `clusterTrustBundle` sources), or
/// this node's Node (named by the config's `node_name`: local PVs' node
/// affinity is then checked against its labels), with its `kind`), as a
/// kubelet fork's
/// informers see it: pods that read it are converted again (a claim now
/// bound mounts its volume; an attached VolumeAttachment lets its volume be
/// staged with its metadata; a volume whose object changed keeps mounting
/// what it resolves to). Another kind is
/// `VOLMGR_ERR_UNSUPPORTED`; an invalid object `VOLMGR_ERR_INVALID_ARGUMENT`
/// (a Secret's error never quotes it).
///
/// # Safety
/// `vm` is NULL or a live handle; `object_json` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn volmgr_object_upsert(
    vm: *mut volmgr,
    object_json: *const c_char,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let text = try_ffi!(unsafe { str_arg(object_json, "object_json") });
        // A syntax error's message may quote the text (a Secret): only
        // its position is given.
        let value: serde_json::Value = try_ffi!(serde_json::from_str(text).map_err(|e| {
            fail(
                VOLMGR_ERR_INVALID_ARGUMENT,
                format!(
                    "object_json: not JSON (line {}, column {})",
                    e.line(),
                    e.column()
                ),
            )
        }));
        let obj = try_ffi!(KubeObject::from_json(value).map_err(|e| fail_err(&e)));
        h.resolver.locked().upsert_object(obj);
        VOLMGR_OK
    })
}

/// Removes an object (`namespace` `""` for cluster-scoped kinds). Pods that
/// read it keep their volumes as last resolved (the kubelet never drops a
/// running pod's volume because its claim went away). `VOLMGR_ERR_NOT_FOUND`
/// if it was not known.
///
/// # Safety
/// `vm` is NULL or a live handle; the strings are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn volmgr_object_delete(
    vm: *mut volmgr,
    kind: *const c_char,
    namespace: *const c_char,
    name: *const c_char,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let (kind, namespace, name) = try_ffi!(unsafe {
            str_arg(kind, "kind")
                .and_then(|k| Ok((k, str_arg(namespace, "namespace")?, str_arg(name, "name")?)))
        });
        let Some(k) = ObjectKind::from_name(kind) else {
            return fail_err(&ObjectDecodeError::UnsupportedKind(kind.into()));
        };
        if name.is_empty() {
            return fail(VOLMGR_ERR_INVALID_ARGUMENT, "name is empty");
        }
        // As in the objects themselves: a namespaced object without one is
        // in "default".
        let namespace = if namespace.is_empty() {
            "default"
        } else {
            namespace
        };
        if h.resolver
            .locked()
            .delete_object(&ObjectRef::new(k, namespace, name))
        {
            VOLMGR_OK
        } else {
            fail(
                VOLMGR_ERR_NOT_FOUND,
                format!("{kind} {namespace}/{name} is not known"),
            )
        }
    })
}
