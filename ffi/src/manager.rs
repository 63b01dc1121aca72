//! The `volmgr` handle: the kubelet's `VolumeManager` interface.

use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use volmgr_core::cache::actual_state_of_world::VolumeMountState;
use volmgr_core::cache::world::{ClaimResize, VolumeEvent, VolumeEventKind};
use volmgr_core::operationexecutor::Backoff;
use volmgr_core::pluginmanager::registry::DriverRegistry;
use volmgr_core::plugins::VolumeError;
use volmgr_core::populator::objects::{KubeObject, ObjectDecodeError, ObjectKind, ObjectRef};
use volmgr_core::populator::{PodResolver, SubPathTiming};
use volmgr_core::sys::linux::LinuxMounter;
use volmgr_core::tracer::{self, TracerMode};
use volmgr_core::volume::{check_pod_uid, PodUid, UniqueVolumeName};
use volmgr_core::volumemanager::{csi_wiring, Config, ResizeError, VolumeManager, WaitError};

use crate::boundary::{guard, guard_value, out_arg, str_arg, to_c_string, try_ffi};
use crate::error::*;
use volmgr_core::util::sync::MutexExt;

/// An opaque volume manager. Created by `volmgr_new`, destroyed by
/// `volmgr_free`; every other call may come from any thread at once.
pub struct volmgr {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) vm: Arc<VolumeManager>,
    events: Arc<Mutex<Option<EventCallback>>>,
    wait_for_sources: bool,
    /// Last volume list served per (pod, with uncertain), with the world
    /// generation it was built at: kubelets ask for the same pods' volumes
    /// again and again, and between changes the answer is the same.
    volume_lists:
        Mutex<volmgr_core::util::fast_map::FastMap<(String, bool), (u64, std::ffi::CString)>>,
    /// Stops the tracer's and the plugin watcher's tasks.
    tracer_stop: tokio::sync::watch::Sender<bool>,
    /// The pods and the objects they read (`volmgr_object_upsert`), so a
    /// claim resolves to its volume and a pod waiting for an object is
    /// converted again when it arrives.
    pub(crate) resolver: Mutex<PodResolver>,
}

/// The name of volmgr's runtime threads: the tracer tells volmgr's own
/// mount calls from the rest of the host process's by it.
const THREAD_NAME: &str = "volmgr-rt";

/// Called for each volume event (`event_json` is only valid during the
/// call). Runs on a volmgr runtime thread; it must not block and must not
/// call back into the same handle's `volmgr_free`. volmgr's blocking calls
/// made from it (start, stop, the waits) fail with `VOLMGR_ERR_BUSY`.
pub type volmgr_event_callback =
    Option<unsafe extern "C" fn(userdata: *mut c_void, event_json: *const c_char)>;

#[derive(Clone, Copy)]
struct EventCallback {
    f: unsafe extern "C" fn(*mut c_void, *const c_char),
    userdata: *mut c_void,
}

// SAFETY: the caller of volmgr_set_event_callback promises that the callback
// and its userdata may be used from volmgr's threads (documented there).
unsafe impl Send for EventCallback {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewConfig {
    root_dir: String,
    #[serde(default)]
    node_name: String,
    #[serde(default = "default_tracer")]
    tracer: String,
    #[serde(default)]
    resync_period_ms: Option<u64>,
    #[serde(default)]
    backoff_initial_ms: Option<u64>,
    #[serde(default)]
    backoff_max_ms: Option<u64>,
    /// The kubelet's safe default: nothing is torn down before the pod
    /// sources are ready (`volmgr_sources_ready`).
    #[serde(default = "default_true")]
    wait_for_sources_ready: bool,
    #[serde(default)]
    wait_for_reported_in_use: bool,
    #[serde(default)]
    make_root_shared: bool,
    #[serde(default)]
    csi: Option<CsiConfig>,
}

/// The `"csi"` key of `volmgr_new`'s JSON.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CsiConfig {
    /// Follow `ROOT/plugins_registry` for drivers that register through the
    /// kubelet's plugin registration API (node-driver-registrar).
    #[serde(default = "default_true")]
    watch_plugins_registry: bool,
    /// Drivers by name → CSI socket path, used without registration.
    #[serde(default)]
    drivers: std::collections::BTreeMap<String, std::path::PathBuf>,
    /// Deadline of each CSI call (the kubelet's is 2 minutes).
    #[serde(default = "default_csi_timeout_ms")]
    timeout_ms: u64,
    /// How often `requiresRepublish` drivers' volumes are published again
    /// (the kubelet's sync period, 1 minute, when absent or 0).
    #[serde(default)]
    republish_period_ms: u64,
}

fn default_true() -> bool {
    true
}

fn default_csi_timeout_ms() -> u64 {
    120_000
}

fn default_tracer() -> String {
    "auto".into()
}

/// The manager's settings from `volmgr_new`'s JSON.
fn build_config(cfg: &NewConfig) -> Config {
    let mut config = Config::new(&cfg.root_dir);
    config.node_name = cfg.node_name.clone();
    if let Some(ms) = cfg.resync_period_ms {
        config.resync_period = Duration::from_millis(ms.max(1));
    }
    let d = Backoff::default();
    config.backoff = Backoff {
        initial: cfg
            .backoff_initial_ms
            .map_or(d.initial, Duration::from_millis),
        factor: d.factor,
        max: cfg.backoff_max_ms.map_or(d.max, Duration::from_millis),
    };
    config.wait_for_reported_in_use = cfg.wait_for_reported_in_use;
    // A kubelet makes its root directory rshared itself (`setupDataDirs`):
    // the library does it only when asked.
    config.make_root_shared = cfg.make_root_shared;
    if let Some(ms) = cfg.csi.as_ref().map(|c| c.republish_period_ms) {
        if ms > 0 {
            config.csi_republish_period = Duration::from_millis(ms);
        }
    }
    config
}

/// Borrows the handle.
///
/// # Safety
/// `vm` is NULL or a live handle from `volmgr_new`.
pub(crate) unsafe fn handle<'a>(vm: *const volmgr) -> Result<&'a volmgr, volmgr_status> {
    if vm.is_null() {
        return Err(fail(VOLMGR_ERR_INVALID_ARGUMENT, "volmgr handle is NULL"));
    }
    // SAFETY: non-NULL and live per the caller's contract.
    Ok(unsafe { &*vm })
}

/// Runs `f` to completion on the handle's runtime, unless the caller is
/// itself on one of volmgr's runtime threads (an event callback, a host
/// plugin's function): blocking there would panic ("Cannot start a runtime
/// from within a runtime") or deadlock, so the call is refused with
/// `VOLMGR_ERR_BUSY` and a message saying why.
pub(crate) fn block_on<F: std::future::Future>(
    h: &volmgr,
    f: F,
) -> Result<F::Output, volmgr_status> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(fail(
            VOLMGR_ERR_BUSY,
            "blocking call made on a volmgr thread (from an event callback or a host plugin): \
             make it from another thread",
        ));
    }
    Ok(h.rt.block_on(f))
}

fn uid_arg(s: &str) -> Result<PodUid, volmgr_status> {
    PodUid::new(s).map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, e.to_string()))
}

/// Creates a manager from `config_json` (only `root_dir` is required):
/// `{"root_dir": "/var/lib/kubelet", "node_name": "", "tracer": "auto"|"ebpf"|"mountinfo"|"off",
///   "resync_period_ms": 60000, "backoff_initial_ms": 500, "backoff_max_ms": 122000,
///   "wait_for_sources_ready": true, "wait_for_reported_in_use": false,
///   "make_root_shared": false,
///   "csi": {"watch_plugins_registry": true, "drivers": {"NAME": "SOCKET_PATH"},
///           "timeout_ms": 120000, "republish_period_ms": 60000}}`
/// (the values shown are the defaults).
///
/// The restart rule: by default nothing is torn down until
/// `volmgr_sources_ready` is called, as the kubelet's reconciler unmounts
/// nothing before `sourcesReady.AllReady()`. A restarted kubelet fork calls
/// `volmgr_start` (the volumes found mounted are rebuilt), upserts its pods
/// as its pod sources deliver them, then calls `volmgr_sources_ready`: the
/// volumes of running pods are adopted with their mounts, and only those of
/// pods gone meanwhile are torn down. A consumer that has no pod source of
/// its own (it upserts every pod before `volmgr_start`) opts out with
/// `"wait_for_sources_ready": false`: `volmgr_start` then counts as sources
/// ready, and every volume found of a pod not upserted yet is torn down.
///
/// The other settings, each with its default and what the kubelet does
/// when nothing is said:
/// - `wait_for_reported_in_use` (false): an attachable volume (CSI) is set
///   up only once `volmgr_mark_volumes_as_reported_in_use` has listed it
///   (a volume must be in the node status' `volumesInUse` first); until
///   then it is pending, and the waits and status say why. The kubelet
///   always waits (`VerifyControllerAttachedVolume`); volmgr does not by
///   default because only a consumer that writes the node status can
///   release the wait: a kubelet fork that keeps the kubelet's node status
///   setter (`GetVolumesInUse`, then `MarkVolumesAsReportedInUse`) sets it.
/// - `make_root_shared` (false): ROOT is made recursively shared (bound
///   onto itself first if it is not a mount point), as the agent does. The
///   kubelet does it itself (`setupDataDirs`), so a fork leaves it off.
/// - `tracer` ("auto"): what finds volumes changed behind the manager's
///   back between resyncs (see `volmgr agent --tracer`): `ebpf` that cannot
///   be loaded, or `mountinfo` that cannot watch the mount table, is
///   `VOLMGR_ERR_UNSUPPORTED` with the reason; `auto` falls back from eBPF
///   to mountinfo. The kubelet has no tracer and does not notice a volume
///   unmounted behind its back (`off` is its behaviour); a tracer only sets
///   up again what is still desired. Mount calls made by the host process
///   itself outside volmgr's threads count as out-of-band changes.
/// - `resync_period_ms` (60000): the safety-net resync, as the agent's
///   `--resync-period`; the kubelet has none.
/// - `backoff_initial_ms` (500), `backoff_max_ms` (122000): the kubelet's
///   exponential backoff of a failing operation (500 ms doubling up to
///   2 min 2 s).
/// - `csi` (absent: no CSI plugin): with it, the kubelet's CSI plugin is
///   installed as `volmgr agent` installs it: drivers named in `drivers` are
///   called on their socket at once, and with `watch_plugins_registry`
///   (true, as the kubelet's plugin watcher always runs) drivers that
///   register through `ROOT/plugins_registry` (node-driver-registrar) are
///   added and removed as they come and go. `timeout_ms` (120000) bounds
///   each CSI call: the kubelet's `csiTimeout`, 2 minutes.
///   `republish_period_ms` (60000, also for 0): how often volumes of
///   `requiresRepublish` drivers are published again, the kubelet's sync
///   period (`--sync-frequency`, 1 minute).
///
/// On success `*out` owns the handle (free with `volmgr_free`).
///
/// # Safety
/// `config_json` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn volmgr_new(
    config_json: *const c_char,
    out: *mut *mut volmgr,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let text = try_ffi!(unsafe { str_arg(config_json, "config_json") });
        let out = try_ffi!(out_arg(out, "out"));
        let cfg: NewConfig = try_ffi!(serde_json::from_str(text)
            .map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, format!("config_json: {e}"))));
        let mode: TracerMode = try_ffi!(cfg
            .tracer
            .parse()
            .map_err(|e: String| fail(VOLMGR_ERR_INVALID_ARGUMENT, e)));
        let config = build_config(&cfg);
        let rt = try_ffi!(tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(THREAD_NAME)
            .enable_all()
            .build()
            .map_err(|e| fail(VOLMGR_ERR_INTERNAL, format!("runtime: {e}"))));
        let vm = try_ffi!({
            let _enter = rt.enter();
            VolumeManager::new(config, Arc::new(LinuxMounter))
                .map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, e.to_string()))
        });
        let (tracer_stop, stop_rx) = tokio::sync::watch::channel(false);
        try_ffi!({
            let _enter = rt.enter();
            tracer::start_in_host(mode, vm.tracer_context(), stop_rx.clone(), THREAD_NAME)
                .map_err(|e| fail(VOLMGR_ERR_UNSUPPORTED, format!("tracer {mode}: {e}")))
        });
        if let Some(csi) = &cfg.csi {
            let _enter = rt.enter();
            try_ffi!(install_csi(&vm, csi, stop_rx));
        }
        let events: Arc<Mutex<Option<EventCallback>>> = Arc::default();
        forward_events(&vm, &events);
        let mut resolver = PodResolver::new(vm.pod_sink());
        // A Node object the caller upserts gives local PVs' node affinity
        // this node's labels.
        resolver.set_node_name(&cfg.node_name);
        // The caller starts the containers: each one's subPaths are
        // prepared when it asks (`volmgr_prepare_sub_paths`).
        resolver.set_sub_path_timing(SubPathTiming::OnRequest);
        let resolver = Mutex::new(resolver);
        let h = Box::new(volmgr {
            rt,
            vm,
            resolver,
            events,
            wait_for_sources: cfg.wait_for_sources_ready,
            volume_lists: Mutex::default(),
            tracer_stop,
        });
        // SAFETY: `out` was checked non-NULL.
        unsafe { *out = Box::into_raw(h) };
        VOLMGR_OK
    })
}

/// Installs the CSI plugin per the `"csi"` config: fixed drivers, and the
/// plugin registry watcher if asked. Runs within the handle's runtime.
fn install_csi(
    vm: &Arc<VolumeManager>,
    csi: &CsiConfig,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), volmgr_status> {
    if csi.timeout_ms == 0 {
        return Err(fail(
            VOLMGR_ERR_INVALID_ARGUMENT,
            "csi.timeout_ms must be positive",
        ));
    }
    let registry = DriverRegistry::new();
    csi_wiring::install(
        vm,
        Arc::clone(&registry),
        Duration::from_millis(csi.timeout_ms),
    )
    .map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, format!("csi: {e}")))?;
    for (name, socket) in &csi.drivers {
        if name.is_empty() || !socket.is_absolute() {
            return Err(fail(
                VOLMGR_ERR_INVALID_ARGUMENT,
                format!("csi.drivers: {name:?} needs a name and an absolute socket path"),
            ));
        }
        registry.register_fixed(name, socket.clone());
    }
    if csi.watch_plugins_registry {
        // The task ends with the handle's runtime (or `stop`).
        drop(
            csi_wiring::watch_plugins_registry(vm, &registry, stop)
                .map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, format!("csi: {e}")))?,
        );
    }
    Ok(())
}

/// Hands volume events and claim resizes to the event callback, if set.
fn forward_events(vm: &Arc<VolumeManager>, events: &Arc<Mutex<Option<EventCallback>>>) {
    let call = |sink: &Mutex<Option<EventCallback>>, json: String| {
        let cb = *sink.locked();
        if let Some(cb) = cb {
            if let Ok(c) = std::ffi::CString::new(json) {
                // SAFETY: the callback's contract (volmgr_set_event_callback).
                unsafe { (cb.f)(cb.userdata, c.as_ptr()) };
            }
        }
    };
    let sink = Arc::clone(events);
    vm.add_event_listener(Arc::new(move |ev: &VolumeEvent| {
        // The ABI's kinds stay those it documents.
        if ev.kind != VolumeEventKind::Expanded {
            call(&sink, event_json(ev));
        }
    }));
    let sink = Arc::clone(events);
    vm.add_claim_resize_listener(Arc::new(move |r: &ClaimResize| {
        call(&sink, claim_resized_json(r));
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

/// Rebuilds the actual state from the mount table and starts the reconciler
/// on volmgr's own threads. `VOLMGR_ERR_BUSY` if already started.
///
/// # Safety
/// `vm` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn volmgr_start(vm: *mut volmgr) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        if h.vm.is_running() {
            return fail(VOLMGR_ERR_BUSY, "already started");
        }
        match try_ffi!(block_on(h, h.vm.start())) {
            Ok(_) => {
                if !h.wait_for_sources {
                    h.vm.set_populated();
                }
                VOLMGR_OK
            }
            Err(e) => fail(VOLMGR_ERR_INTERNAL, e.to_string()),
        }
    })
}

/// Tells the manager that every pod source has delivered its pods (the
/// kubelet's `sourcesReady.AllReady()`), so volumes of pods not upserted
/// may now be torn down. Until then (with the default
/// `"wait_for_sources_ready": true`) nothing is torn down; call it once the
/// pods running on the node have been upserted. May be called before or
/// after `volmgr_start`; later calls do nothing.
///
/// # Safety
/// `vm` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn volmgr_sources_ready(vm: *mut volmgr) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        h.vm.set_populated();
        VOLMGR_OK
    })
}

/// Stops the reconciler; mounts stay in place. `VOLMGR_ERR_BUSY` if not started.
///
/// # Safety
/// `vm` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn volmgr_stop(vm: *mut volmgr) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        match try_ffi!(block_on(h, h.vm.stop())) {
            Ok(()) => VOLMGR_OK,
            Err(e) => fail(VOLMGR_ERR_BUSY, e.to_string()),
        }
    })
}

/// Destroys the handle (stopping it first if needed; mounts stay). NULL is a
/// no-op. No other call on this handle may run concurrently or follow.
///
/// It waits at most 5 s for volmgr's threads: it may return while a host
/// plugin's `set_up` or `tear_down` (see `volmgr_register_plugin`) is
/// still running on one of them, which then finishes on its own; the
/// plugin's functions and `userdata` must stay valid until they return.
/// Called from a volmgr thread (an event callback), it cannot wait at all:
/// the handle is released without stopping first, and nothing is waited
/// for.
///
/// # Safety
/// `vm` is NULL or a live handle not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn volmgr_free(vm: *mut volmgr) {
    if vm.is_null() {
        return;
    }
    let _ = guard(|| {
        // SAFETY: `vm` came from Box::into_raw in volmgr_new and is not used again.
        let h = unsafe { Box::from_raw(vm) };
        let on_volmgr_thread = tokio::runtime::Handle::try_current().is_ok();
        if h.vm.is_running() && !on_volmgr_thread {
            let _ = h.rt.block_on(h.vm.stop());
        }
        let _ = h.tracer_stop.send(true);
        let h = *h;
        if on_volmgr_thread {
            h.rt.shutdown_background();
        } else {
            h.rt.shutdown_timeout(Duration::from_secs(5));
        }
        VOLMGR_OK
    });
}

/// Sets (or with NULL clears) the event callback. It is called on a volmgr
/// thread with a JSON object `{"kind": "mounted"|"unmounted"|"failed"|"lost",
/// "pod_uid", "volume", "volume_name", "path", "error"}`; `userdata` is passed
/// back unchanged and must be usable from that thread.
///
/// After NodeExpandVolume grew a claim's file system beyond the claim's
/// `status.capacity` (the claim as last upserted), it is called with
/// `{"kind": "claim_resized", "namespace", "claim", "persistent_volume",
/// "volume_name", "size_bytes"}`: the caller patches the claim's status as
/// the kubelet does (`status.capacity.storage` to the size,
/// `allocatedResourceStatuses.storage` and the `FileSystemResizePending`
/// condition removed), then upserts the patched claim. A call missed is
/// made again at the volume's next mount (the claim still says less).
///
/// The callback must not block on volmgr: the blocking calls
/// (`volmgr_start`, `volmgr_stop`, `volmgr_wait_for_attach_and_mount`,
/// `volmgr_wait_for_unmount`) made from it return `VOLMGR_ERR_BUSY` at once
/// (hand the work to another thread instead).
///
/// # Safety
/// `vm` is NULL or a live handle; `cb` is NULL or a valid function.
#[no_mangle]
pub unsafe extern "C" fn volmgr_set_event_callback(
    vm: *mut volmgr,
    cb: volmgr_event_callback,
    userdata: *mut c_void,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        *h.events.locked() = cb.map(|f| EventCallback { f, userdata });
        VOLMGR_OK
    })
}

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
        let pod: k8s_openapi::api::core::v1::Pod = try_ffi!(serde_json::from_str(text)
            .map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, format!("pod_json: {e}"))));
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
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let uid = try_ffi!(uid_arg(try_ffi!(unsafe { str_arg(pod_uid, "pod_uid") })));
        if h.resolver.locked().delete_pod(&uid) {
            VOLMGR_OK
        } else {
            fail(VOLMGR_ERR_NOT_FOUND, format!("pod {uid} is not known"))
        }
    })
}

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
        let obj = try_ffi!(KubeObject::from_json(value).map_err(|e| match e {
            ObjectDecodeError::UnsupportedKind(_) => fail(VOLMGR_ERR_UNSUPPORTED, e.to_string()),
            _ => fail(VOLMGR_ERR_INVALID_ARGUMENT, e.to_string()),
        }));
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
            return fail(
                VOLMGR_ERR_UNSUPPORTED,
                ObjectDecodeError::UnsupportedKind(kind.into()).to_string(),
            );
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

fn wait_status(r: Result<(), WaitError>) -> volmgr_status {
    match r {
        Ok(()) => VOLMGR_OK,
        Err(e @ WaitError::Timeout { .. }) => fail(VOLMGR_ERR_TIMEOUT, e.to_string()),
        Err(e) => fail(VOLMGR_ERR_BUSY, e.to_string()),
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
        let raw: Vec<String> = try_ffi!(serde_json::from_str(text)
            .map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, format!("uids_json: {e}"))));
        let uids: Vec<PodUid> = try_ffi!(raw.iter().map(|u| uid_arg(u)).collect());
        let timeout = Duration::from_millis(timeout_ms);
        wait_status(h.rt.block_on(h.vm.wait_for_all_pods_unmount(&uids, timeout)))
    })
}

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
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let uid = try_ffi!(uid_arg(try_ffi!(unsafe { str_arg(pod_uid, "pod_uid") })));
        let out = try_ffi!(out_arg(out, "out"));
        // SAFETY: checked non-NULL.
        unsafe { *out = h.vm.has_possibly_mounted_volumes_for_pod(&uid) };
        VOLMGR_OK
    })
}

fn resize_status(r: Result<(), ResizeError>) -> volmgr_status {
    match r {
        Ok(()) => VOLMGR_OK,
        Err(e @ (ResizeError::PodNotFound(_) | ResizeError::VolumeNotFound { .. })) => {
            fail(VOLMGR_ERR_NOT_FOUND, e.to_string())
        }
        Err(e @ ResizeError::NotMounted { .. }) => fail(VOLMGR_ERR_BUSY, e.to_string()),
        Err(e @ ResizeError::Volume(VolumeError::BelowUsage { .. })) => {
            fail(VOLMGR_ERR_INVALID_ARGUMENT, e.to_string())
        }
        Err(
            e @ (ResizeError::NotSupported(_) | ResizeError::Volume(VolumeError::InvalidSpec(_))),
        ) => fail(VOLMGR_ERR_UNSUPPORTED, e.to_string()),
        Err(e) => fail(VOLMGR_ERR_INTERNAL, e.to_string()),
    }
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
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let uid = try_ffi!(uid_arg(try_ffi!(unsafe { str_arg(pod_uid, "pod_uid") })));
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
            Ok(r) => resize_status(r),
            Err(e) => fail(VOLMGR_ERR_INTERNAL, format!("resize task: {e}")),
        }
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
    let subs = volmgr_core::volume::PodUid::new(uid)
        .map(|u| vm.sub_paths_of_pod(&u))
        .unwrap_or_default();
    vm.with_actual_state(|asw| {
        let mut rows: Vec<VolumeJson<'_>> = asw
            .mounts_of_pod(uid)
            .filter(|(_, _, m)| uncertain || m.state == VolumeMountState::Mounted)
            .map(|(name, plugin, m)| VolumeJson {
                outer_volume_spec_name: &m.outer_volume_spec_name,
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
                sub_paths: subs
                    .get(&m.outer_volume_spec_name)
                    .map_or(&[], Vec::as_slice),
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
        try_ffi!(check_pod_uid(uid).map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, e.to_string())));
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
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per the caller's contract.
        let uid = try_ffi!(uid_arg(try_ffi!(unsafe { str_arg(pod_uid, "pod_uid") })));
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
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        let out = try_ffi!(out_arg(out_json, "out_json"));
        if !h.vm.reconciler_states_synced() {
            return fail(
                VOLMGR_ERR_BUSY,
                "the states have not synced yet (volmgr_reconciler_states_synced): \
                 keep the node status' volumesInUse as it is",
            );
        }
        let names: Vec<String> =
            h.vm.volumes_in_use()
                .iter()
                .map(|n| n.to_string())
                .collect();
        // SAFETY: checked non-NULL.
        unsafe { *out = to_c_string(serde_json::Value::from(names).to_string()) };
        VOLMGR_OK
    })
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
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let text = try_ffi!(unsafe { str_arg(names_json, "names_json") });
        let names: Vec<String> = try_ffi!(serde_json::from_str(text)
            .map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, format!("names_json: {e}"))));
        h.vm.mark_volumes_as_reported_in_use(
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
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        let out = try_ffi!(out_arg(out, "out"));
        // SAFETY: checked non-NULL.
        unsafe { *out = to_c_string(h.vm.metrics_text()) };
        VOLMGR_OK
    })
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
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        let out = try_ffi!(out_arg(out, "out"));
        let text = try_ffi!(serde_json::to_string(&h.vm.status())
            .map_err(|e| fail(VOLMGR_ERR_INTERNAL, format!("status: {e}"))));
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    static SEEN: AtomicU32 = AtomicU32::new(u32::MAX);
    static MESSAGE: Mutex<String> = Mutex::new(String::new());

    /// Calls a blocking function of the handle (`userdata`) from the event
    /// callback, recording its status and message.
    unsafe extern "C" fn wait_from_callback(userdata: *mut c_void, _event: *const c_char) {
        let vm = userdata.cast::<volmgr>();
        // SAFETY: the handle outlives the callback (cleared before free).
        let st = unsafe { volmgr_wait_for_attach_and_mount(vm, c"uid-cb".as_ptr(), 1000) };
        SEEN.store(st as u32, Ordering::SeqCst);
        let msg = volmgr_last_error();
        if !msg.is_null() {
            // SAFETY: a NUL-terminated string owned by volmgr.
            let s = unsafe { std::ffi::CStr::from_ptr(msg) };
            *MESSAGE.locked() = s.to_string_lossy().into_owned();
        }
    }

    #[test]
    fn blocking_calls_from_the_event_callback_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let config = std::ffi::CString::new(format!(
            r#"{{"root_dir": "{}", "tracer": "off"}}"#,
            root.path().display()
        ))
        .unwrap();
        let mut vm: *mut volmgr = std::ptr::null_mut();
        // SAFETY: valid arguments; the handle is freed at the end.
        unsafe {
            assert_eq!(volmgr_new(config.as_ptr(), &mut vm), VOLMGR_OK);
            assert_eq!(
                volmgr_set_event_callback(vm, Some(wait_from_callback), vm.cast()),
                VOLMGR_OK
            );
            assert_eq!(volmgr_start(vm), VOLMGR_OK);
            let pod = std::ffi::CString::new(
                r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","uid":"uid-cb"},
                   "spec":{"containers":[{"name":"c","image":"i","volumeMounts":[{"name":"v","mountPath":"/v"}]}],
                           "volumes":[{"name":"v","emptyDir":{}}]}}"#,
            )
            .unwrap();
            assert_eq!(volmgr_pod_upsert(vm, pod.as_ptr()), VOLMGR_OK);
            assert_eq!(
                volmgr_wait_for_attach_and_mount(vm, c"uid-cb".as_ptr(), 30_000),
                VOLMGR_OK
            );
            for _ in 0..3000 {
                if SEEN.load(Ordering::SeqCst) != u32::MAX {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(
                volmgr_set_event_callback(vm, None, std::ptr::null_mut()),
                VOLMGR_OK
            );
            volmgr_free(vm);
        }
        assert_eq!(SEEN.load(Ordering::SeqCst), VOLMGR_ERR_BUSY as u32);
        let msg = MESSAGE.locked().clone();
        assert!(
            msg.contains("blocking call made on a volmgr thread"),
            "{msg}"
        );
    }
}
