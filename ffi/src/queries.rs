//! What the kubelet asks: the pod's volumes, volumes in use, attached,
//! synced, metrics, status; and freeing the strings returned.

use std::ffi::c_char;

use volmgr_core::cache::actual_state_of_world::VolumeMountState;
use volmgr_core::util::sync::MutexExt;
use volmgr_core::volume::{check_pod_uid, PodUid, UniqueVolumeName};
use volmgr_core::volumemanager::VolumeManager;

use crate::boundary::{guard, guard_value, json_arg, out_arg, str_arg, to_c_string, try_ffi};
use crate::error::*;
use crate::handle::{handle, pod_handle, volmgr};

/// The kubelet's `HasPossiblyMountedVolumesForPod`: `*out` is whether any
/// volume of the pod is mounted or uncertain (false for an unknown pod).
///
/// # Safety
/// `vm` live or NULL; `pod_uid` a string or NULL; `out` writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_has_possibly_mounted_volumes_for_pod(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    out: *mut bool,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let (h, uid) = try_ffi!(unsafe { pod_handle(vm, pod_uid) });
        let out = try_ffi!(out_arg(out, "out"));
        // SAFETY: checked non-NULL.
        unsafe { *out = h.vm.has_possibly_mounted_volumes_for_pod(&uid) };
        VOLMGR_OK
    })
}

/// One entry of the volume lists, serialized straight from the actual state:
/// what the kubelet's `container.VolumeMap` needs. Fields are only ever added.
#[derive(serde::Serialize)]
struct VolumeJson<'a> {
    outer_volume_spec_name: &'a str,
    volume_name: &'a str,
    plugin: &'a str,
    path: std::borrow::Cow<'a, str>,
    state: &'static str,
    /// The kubelet's `VolumeSpec.ReadOnly` (a read-only CSI volume).
    read_only: bool,
    /// Whether the runtime may relabel it for SELinux (the kubelet's
    /// mounters' `GetAttributes().SELinuxRelabel`).
    selinux_relabel: bool,
    /// For a raw block volume (`volumeDevices`): the device file to hand to
    /// the runtime (the kubelet's `BlockVolumeMapper` path); else null.
    block_device_path: Option<std::borrow::Cow<'a, str>>,
    /// The containers' subPath bind mounts of the volume:
    /// `[{"container", "index", "sub_path", "path"}]` (`path` is what the
    /// runtime binds into the container).
    sub_paths: &'a [volmgr_core::status::SubPathStatus],
}

/// The pod's volumes as a JSON array, sorted by name, built under the actual
/// state's read lock without copying it; `uncertain` includes uncertain ones.
fn volumes_json(
    vm: &VolumeManager,
    uid: &str,
    uncertain: bool,
) -> Result<std::ffi::CString, volmgr_status> {
    // Before the actual state's lock: the desired state's is taken first.
    let pod = volmgr_core::volume::PodUid::new(uid);
    let subs = pod
        .as_ref()
        .map(|u| vm.sub_paths_of_pod(u))
        .unwrap_or_default();
    // A volume the pod names twice (two volumes of one claim): a row per name.
    let names = pod
        .as_ref()
        .map(|u| vm.outer_names_of_pod(u))
        .unwrap_or_default();
    vm.with_actual_state(|asw| {
        let mut rows: Vec<VolumeJson<'_>> = asw
            .mounts_of_pod(uid)
            .filter(|(_, _, m)| uncertain || m.state == VolumeMountState::Mounted)
            .flat_map(|(name, plugin, m)| {
                let own = std::iter::once(m.outer_volume_spec_name());
                let more = names
                    .get(name)
                    .into_iter()
                    .flatten()
                    .map(String::as_str)
                    .filter(|n| *n != m.outer_volume_spec_name());
                own.chain(more).map(move |outer| (outer, name, plugin, m))
            })
            .map(|(outer, name, plugin, m)| VolumeJson {
                outer_volume_spec_name: outer,
                volume_name: name.as_str(),
                plugin,
                path: m.path.to_string_lossy(),
                state: match m.state {
                    VolumeMountState::Mounted => "mounted",
                    VolumeMountState::Uncertain => "uncertain",
                },
                read_only: m.spec.read_only(),
                selinux_relabel: m.selinux_relabel,
                block_device_path: m.spec.is_block().then(|| m.path.to_string_lossy()),
                sub_paths: subs.get(outer).map_or(&[], Vec::as_slice),
            })
            .collect();
        rows.sort_unstable_by(|a, b| a.outer_volume_spec_name.cmp(b.outer_volume_spec_name));
        let mut buf = Vec::with_capacity(64 + rows.len() * 192);
        serde_json::to_writer(&mut buf, &rows)
            .map_err(|e| fail(VOLMGR_ERR_INTERNAL, e.to_string()))?;
        // JSON escapes every control character, so there is no NUL inside.
        std::ffi::CString::new(buf).map_err(|e| fail(VOLMGR_ERR_INTERNAL, e.to_string()))
    })
}

impl volmgr {
    /// The pod's volume list, from the cache while nothing changed.
    fn volume_list(&self, uid: &str, uncertain: bool) -> Result<std::ffi::CString, volmgr_status> {
        // Read the generation first: a list built after it is at least as new.
        let generation = self.vm.state_generation();
        let mut cache = self.volume_lists.locked();
        // Forget everything when the pods asked about outnumber any node's.
        if cache.len() > 4096 {
            cache.clear();
        }
        if let Some((g, json)) = cache.get(&(uid.to_string(), uncertain)) {
            if *g == generation {
                return Ok(json.clone());
            }
        }
        drop(cache);
        let json = volumes_json(&self.vm, uid, uncertain)?;
        self.volume_lists
            .locked()
            .insert((uid.to_string(), uncertain), (generation, json.clone()));
        Ok(json)
    }
}

/// Shared body of the volume-list queries.
///
/// # Safety
/// As for the public functions that call it.
unsafe fn volumes_query(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    out_json: *mut *mut c_char,
    uncertain: bool,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per the caller's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per the caller's contract.
        let uid = try_ffi!(unsafe { str_arg(pod_uid, "pod_uid") });
        let out = try_ffi!(out_arg(out_json, "out_json"));
        try_ffi!(check_pod_uid(uid).map_err(|e| fail_err(&e)));
        let json = try_ffi!(h.volume_list(uid, uncertain));
        // SAFETY: checked non-NULL.
        unsafe { *out = json.into_raw() };
        VOLMGR_OK
    })
}

/// Shared body of the JSON-returning pod queries.
///
/// # Safety
/// As for the public functions that call it.
unsafe fn pod_query(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    out_json: *mut *mut c_char,
    f: impl FnOnce(&VolumeManager, &PodUid) -> String,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per the caller's contract.
        let (h, uid) = try_ffi!(unsafe { pod_handle(vm, pod_uid) });
        let out = try_ffi!(out_arg(out_json, "out_json"));
        let s = f(&h.vm, &uid);
        // SAFETY: checked non-NULL.
        unsafe { *out = to_c_string(s) };
        VOLMGR_OK
    })
}

/// The kubelet's `GetMountedVolumesForPod`: a JSON array of
/// `{"outer_volume_spec_name", "volume_name", "plugin", "path", "state",
/// "read_only", "selinux_relabel", "block_device_path", "sub_paths"}` for the volumes
/// certainly mounted (empty for an unknown pod). `read_only` is the volume's
/// own flag (a read-only CSI volume), `selinux_relabel` whether the runtime
/// may relabel it for SELinux (the kubelet's `GetAttributes().SELinuxRelabel`:
/// true for emptyDir, configMap, secret, downwardAPI, projected, local and
/// image volumes, false for hostPath; for CSI, true when the host has
/// SELinux, the volume was not mounted with its label and its mount says
/// `seclabel`), and
/// `block_device_path` the device file of a raw block volume
/// (`volumeDevices`), null otherwise. `sub_paths` lists the containers'
/// subPath bind mounts of a mounted volume, `[{"container", "index",
/// "sub_path", "path"}]`, `path` being what the runtime binds
/// (`ROOT/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`). `*out_json` is
/// owned by the caller (`volmgr_string_free`).
///
/// # Safety
/// `vm` live or NULL; `pod_uid` a string or NULL; `out_json` writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_get_mounted_volumes_for_pod(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    out_json: *mut *mut c_char,
) -> volmgr_status {
    // SAFETY: forwarded contract.
    unsafe { volumes_query(vm, pod_uid, out_json, false) }
}

/// The kubelet's `GetPossiblyMountedVolumesForPod`: like
/// `volmgr_get_mounted_volumes_for_pod`, plus volumes whose state is uncertain.
///
/// # Safety
/// As for `volmgr_get_mounted_volumes_for_pod`.
#[no_mangle]
pub unsafe extern "C" fn volmgr_get_possibly_mounted_volumes_for_pod(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    out_json: *mut *mut c_char,
) -> volmgr_status {
    // SAFETY: forwarded contract.
    unsafe { volumes_query(vm, pod_uid, out_json, true) }
}

/// The kubelet's `GetExtraSupplementalGroupsForPod`: a JSON array of GIDs
/// from the `pv.beta.kubernetes.io/gid` annotations of the pod's mounted
/// PersistentVolumes that the pod does not already list in its
/// `supplementalGroups` or `fsGroup` (invalid values ignored; sorted).
///
/// # Safety
/// As for `volmgr_get_mounted_volumes_for_pod`.
#[no_mangle]
pub unsafe extern "C" fn volmgr_get_extra_supplemental_groups_for_pod(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    out_json: *mut *mut c_char,
) -> volmgr_status {
    // SAFETY: forwarded contract.
    unsafe {
        pod_query(vm, pod_uid, out_json, |vm, uid| {
            serde_json::Value::from(vm.extra_supplemental_groups_for_pod(uid)).to_string()
        })
    }
}

/// The kubelet's `GetVolumesInUse`: a JSON array of the unique names of the
/// attachable volumes (the kubelet's `CanAttach`: a CSI volume from a
/// PersistentVolume, unless its driver's CSIDriver says
/// `attachRequired: false`; inline CSI volumes, emptyDir, hostPath and host
/// plugins' volumes are not) that are desired, or mounted or uncertain in
/// the actual state (listed until unmounted). Sorted.
///
/// Only once the states have synced (`volmgr_reconciler_states_synced`):
/// before, the volumes mounted by an earlier process may not be known yet,
/// and a list written into the node status then would tell the
/// attach/detach controller it may detach them; so the call fails with
/// `VOLMGR_ERR_BUSY` and the node status keeps its list (the kubelet's
/// `VolumesInUse` setter waits the same way).
///
/// # Safety
/// `vm` live or NULL; `out_json` writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_get_volumes_in_use(
    vm: *mut volmgr,
    out_json: *mut *mut c_char,
) -> volmgr_status {
    // SAFETY: forwarded contract.
    unsafe {
        string_query(vm, out_json, "out_json", |vm| {
            if !vm.reconciler_states_synced() {
                return Err(fail(
                    VOLMGR_ERR_BUSY,
                    "the states have not synced yet (volmgr_reconciler_states_synced): \
                     keep the node status' volumesInUse as it is",
                ));
            }
            let names: Vec<String> = vm.volumes_in_use().iter().map(|n| n.to_string()).collect();
            Ok(serde_json::Value::from(names).to_string())
        })
    }
}

/// The kubelet's `MarkVolumesAsReportedInUse`: `names_json` is a JSON array
/// of the unique volume names the node status now lists in `volumesInUse`;
/// each desired volume is reported exactly when listed. With
/// `"wait_for_reported_in_use": true` this lets the attachable volumes
/// listed be set up (the reconciler is woken for them).
///
/// # Safety
/// `vm` live or NULL; `names_json` a string or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_mark_volumes_as_reported_in_use(
    vm: *mut volmgr,
    names_json: *const c_char,
) -> volmgr_status {
    // SAFETY: forwarded contract.
    unsafe {
        volume_names_call(
            vm,
            names_json,
            VolumeManager::mark_volumes_as_reported_in_use,
        )
    }
}

/// The Node's `status.volumesAttached` as just read: `names_json` is a
/// JSON array of the unique volume names it lists (their `name`s). With
/// `"wait_for_volumes_attached": true` the attachable volumes listed are set
/// up (newly listed ones at once), as the kubelet's
/// `VerifyControllerAttachedVolume` lets them; without it the call only
/// records the list.
///
/// # Safety
/// `vm` live or NULL; `names_json` a string or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_mark_volumes_attached(
    vm: *mut volmgr,
    names_json: *const c_char,
) -> volmgr_status {
    // SAFETY: forwarded contract.
    unsafe { volume_names_call(vm, names_json, VolumeManager::mark_volumes_attached) }
}

/// Shared body of the calls that hand the manager a list the node status
/// holds: `names_json`, a JSON array of unique volume names, parsed and
/// passed to `f`.
///
/// # Safety
/// As for the public functions that call it.
unsafe fn volume_names_call(
    vm: *mut volmgr,
    names_json: *const c_char,
    f: impl FnOnce(&VolumeManager, Vec<UniqueVolumeName>),
) -> volmgr_status {
    guard(|| {
        // SAFETY: per the caller's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per the caller's contract.
        let text = try_ffi!(unsafe { str_arg(names_json, "names_json") });
        let names: Vec<String> = try_ffi!(json_arg(text, "names_json"));
        f(
            &h.vm,
            names.into_iter().map(UniqueVolumeName::new).collect(),
        );
        VOLMGR_OK
    })
}

/// The kubelet's `VolumeIsAttached`.
///
/// # Safety
/// `vm` live or NULL; `volume_name` a string or NULL; `out` writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_volume_is_attached(
    vm: *mut volmgr,
    volume_name: *const c_char,
    out: *mut bool,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let name = try_ffi!(unsafe { str_arg(volume_name, "volume_name") });
        let out = try_ffi!(out_arg(out, "out"));
        // SAFETY: checked non-NULL.
        unsafe { *out = h.vm.volume_is_attached(&UniqueVolumeName::new(name)) };
        VOLMGR_OK
    })
}

/// The kubelet's `ReconcilerStatesHasBeenSynced`; false for NULL.
///
/// # Safety
/// `vm` live or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_reconciler_states_synced(vm: *mut volmgr) -> bool {
    guard_value(false, || {
        // SAFETY: per this function's contract.
        unsafe { handle(vm) }.is_ok_and(|h| h.vm.reconciler_states_synced())
    })
}

/// Prometheus text exposition of the manager's metrics (`*out` owned by the caller).
///
/// # Safety
/// `vm` live or NULL; `out` writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_metrics_text(
    vm: *mut volmgr,
    out: *mut *mut c_char,
) -> volmgr_status {
    // SAFETY: forwarded contract.
    unsafe { string_query(vm, out, "out", |vm| Ok(vm.metrics_text())) }
}

/// The status document as JSON (`*out` owned by the caller): the schema of
/// `volmgr status --json` — pods and volume states, which tracer runs and
/// why, out-of-band changes found, syscall latencies (eBPF tracer).
///
/// # Safety
/// `vm` live or NULL; `out` writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_status_json(
    vm: *mut volmgr,
    out: *mut *mut c_char,
) -> volmgr_status {
    // SAFETY: forwarded contract.
    unsafe {
        string_query(vm, out, "out", |vm| {
            serde_json::to_string(&vm.status())
                .map_err(|e| fail(VOLMGR_ERR_INTERNAL, format!("status: {e}")))
        })
    }
}

/// Shared body of the queries that answer with a string: `f`'s answer goes
/// to `*out` (`what` names that argument), owned by the caller.
///
/// # Safety
/// `vm` live or NULL; `out` writable or NULL.
unsafe fn string_query(
    vm: *mut volmgr,
    out: *mut *mut c_char,
    what: &str,
    f: impl FnOnce(&VolumeManager) -> Result<String, volmgr_status>,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per the caller's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        let out = try_ffi!(out_arg(out, what));
        let text = try_ffi!(f(&h.vm));
        // SAFETY: checked non-NULL.
        unsafe { *out = to_c_string(text) };
        VOLMGR_OK
    })
}

/// Frees a string returned by volmgr. NULL is a no-op.
///
/// # Safety
/// `s` is NULL or a string returned by volmgr and not freed yet.
#[no_mangle]
pub unsafe extern "C" fn volmgr_string_free(s: *mut c_char) {
    if s.is_null() {
        return;
    }
    let _ = guard(|| {
        // SAFETY: `s` came from CString::into_raw in this library.
        drop(unsafe { std::ffi::CString::from_raw(s) });
        VOLMGR_OK
    });
}
