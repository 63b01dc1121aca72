//! The `volmgr` handle and its life: `volmgr_new` (the configuration),
//! start, sources ready, stop, free.

use std::ffi::c_char;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use volmgr_core::operationexecutor::Backoff;
use volmgr_core::populator::{PodResolver, SubPathTiming};
use volmgr_core::tracer::TracerMode;
use volmgr_core::volume::PodUid;
use volmgr_core::volumemanager::{Config, CsiSetup, VolumeManager, VolumeManagerBuilder};

use crate::boundary::{guard, json_arg, out_arg, str_arg, try_ffi};
use crate::callback::{forward_events, EventCallback};
use crate::error::*;

/// An opaque volume manager. Created by `volmgr_new`, destroyed by
/// `volmgr_free`; every other call may come from any thread at once.
pub struct volmgr {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) vm: Arc<VolumeManager>,
    pub(crate) events: Arc<Mutex<Option<EventCallback>>>,
    wait_for_sources: bool,
    /// Last volume list served per (pod, with uncertain), with the world
    /// generation it was built at: kubelets ask for the same pods' volumes
    /// again and again, and between changes the answer is the same.
    pub(crate) volume_lists:
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
    wait_for_volumes_attached: bool,
    /// Off unless asked: the kubelet fork's kubelet does it itself.
    #[serde(default)]
    make_root_shared: bool,
    #[serde(default)]
    volume_stats_period_ms: Option<u64>,
    /// Whether the host has SELinux (absent: asked, as the kubelet does).
    #[serde(default)]
    selinux_enabled: Option<bool>,
    /// The kubelet's `SELinuxMount` feature gate (on, as in 1.37).
    #[serde(default = "default_true")]
    selinux_mount: bool,
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
    #[serde(default)]
    timeout_ms: Option<u64>,
    /// How often `requiresRepublish` drivers' volumes are published again
    /// (the kubelet's sync period, 1 minute, when absent or 0).
    #[serde(default)]
    republish_period_ms: u64,
}

fn default_true() -> bool {
    true
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
    config.backoff = Backoff::new(
        cfg.backoff_initial_ms
            .map_or(d.initial, Duration::from_millis),
        d.factor,
        cfg.backoff_max_ms.map_or(d.max, Duration::from_millis),
    );
    config.wait_for_reported_in_use = cfg.wait_for_reported_in_use;
    config.wait_for_volumes_attached = cfg.wait_for_volumes_attached;
    config.selinux_enabled = cfg.selinux_enabled;
    config.selinux_mount = cfg.selinux_mount;
    // The one default that differs from the agent's (see volmgr_new).
    config.make_root_shared = cfg.make_root_shared;
    if let Some(ms) = cfg.volume_stats_period_ms {
        // 0 is refused by the library as out of range.
        config.volume_stats_period = Duration::from_millis(ms);
    }
    if let Some(ms) = cfg.csi.as_ref().map(|c| c.republish_period_ms) {
        if ms > 0 {
            config.csi_republish_period = Duration::from_millis(ms);
        }
    }
    config
}

/// The CSI plugin's set-up from the `"csi"` key.
fn csi_setup(csi: &CsiConfig) -> CsiSetup {
    let d = CsiSetup::default();
    CsiSetup {
        timeout: csi.timeout_ms.map_or(d.timeout, Duration::from_millis),
        drivers: csi.drivers.clone().into_iter().collect(),
        watch_plugins_registry: csi.watch_plugins_registry,
    }
}

/// Builds the manager on a runtime of its own, with the tracer and (per
/// the `"csi"` key) the CSI plugin and its watcher started.
fn build(
    cfg: &NewConfig,
    mode: TracerMode,
) -> Result<(tokio::runtime::Runtime, Arc<VolumeManager>, StopSender), volmgr_status> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(THREAD_NAME)
        .enable_all()
        .build()
        .map_err(|e| fail(VOLMGR_ERR_INTERNAL, format!("runtime: {e}")))?;
    let mut builder = VolumeManagerBuilder::new(build_config(cfg))
        .tracer(mode)
        .in_host(THREAD_NAME);
    if let Some(csi) = &cfg.csi {
        builder = builder.csi(csi_setup(csi));
    }
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let vm = {
        let _enter = rt.enter();
        let built = builder.build().map_err(|e| fail_err(&e))?;
        // The tasks end with `stop` or the handle's runtime.
        drop(built.start_watchers(stop_rx).map_err(|e| fail_err(&e))?);
        built.vm
    };
    Ok((rt, vm, stop))
}

/// Stops the tracer's and the plugin watcher's tasks.
type StopSender = tokio::sync::watch::Sender<bool>;

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

/// A pod UID argument.
pub(crate) fn uid_arg(s: &str) -> Result<PodUid, volmgr_status> {
    PodUid::new(s).map_err(|e| fail_err(&e))
}

/// Borrows the handle and reads the pod UID argument: what every call about
/// one pod starts with (the handle checked first).
///
/// # Safety
/// `vm` is NULL or a live handle from `volmgr_new`; `pod_uid` is NULL or a
/// NUL-terminated string.
pub(crate) unsafe fn pod_handle<'a>(
    vm: *const volmgr,
    pod_uid: *const c_char,
) -> Result<(&'a volmgr, PodUid), volmgr_status> {
    // SAFETY: per the caller's contract.
    let h = unsafe { handle(vm) }?;
    // SAFETY: per the caller's contract.
    let uid = uid_arg(unsafe { crate::boundary::str_arg(pod_uid, "pod_uid") }?)?;
    Ok((h, uid))
}

/// Creates a manager from `config_json` (only `root_dir` is required):
/// `{"root_dir": "/var/lib/kubelet", "node_name": "", "tracer": "auto"|"ebpf"|"mountinfo"|"off",
///   "resync_period_ms": 60000, "backoff_initial_ms": 500, "backoff_max_ms": 122000,
///   "wait_for_sources_ready": true, "wait_for_reported_in_use": false,
///   "wait_for_volumes_attached": false, "make_root_shared": false,
///   "volume_stats_period_ms": 60000, "selinux_enabled": null, "selinux_mount": true,
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
/// - `wait_for_volumes_attached` (false): an attachable volume is set up
///   only once `volmgr_mark_volumes_attached` has listed it (the Node's
///   `status.volumesAttached`: the attach/detach controller attached it),
///   as the kubelet's `VerifyControllerAttachedVolume` waits; for a
///   consumer that reads the Node, as the agent with an API server.
/// - `make_root_shared` (false): ROOT is made recursively shared (bound
///   onto itself first if it is not a mount point) when the handle is
///   built, as the agent does. The kubelet does it itself
///   (`setupDataDirs`), so a fork leaves it off: the one default that
///   differs from the agent's, because the bind outlives the handle (a
///   host that removes ROOT after `volmgr_free` finds it busy) and the
///   host, not a library it links, owns its mount table. A failure is
///   reported in status and the manager runs on.
/// - `selinux_enabled` (null: asked, `selinuxfs` at `/sys/fs/selinux`, as
///   the kubelet's go-selinux decides): whether the host has SELinux; only
///   then are volumes of CSIDrivers with `seLinuxMount` mounted with their
///   pod's label (`context=`) and conflicting labels refused as pod errors
///   (`VOLMGR_ERR_POD_VOLUME_ERRORS` from the wait), as the kubelet's
///   desired state of world does.
/// - `selinux_mount` (true): the kubelet's `SELinuxMount` feature gate (on
///   by default in Kubernetes 1.37): every PersistentVolume may be mounted
///   with its label, not only a ReadWriteOncePod one.
/// - `volume_stats_period_ms` (60000): how often the volumes' usage is
///   collected (`kubelet_volume_stats_*` metrics, status `stats`), as the
///   agent's `--volume-stats-period` and the kubelet's
///   `--volume-stats-agg-period` (1 minute); 0 is
///   `VOLMGR_ERR_INVALID_ARGUMENT`.
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
/// Errors: malformed JSON, an unknown key or a setting out of range is
/// `VOLMGR_ERR_INVALID_ARGUMENT`; a `root_dir` that cannot be opened
/// (missing, not a directory) is `VOLMGR_ERR_IO`; a tracer that cannot run
/// `VOLMGR_ERR_UNSUPPORTED`.
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
        let cfg: NewConfig = try_ffi!(json_arg(text, "config_json"));
        let mode: TracerMode = try_ffi!(cfg
            .tracer
            .parse()
            .map_err(|e: String| fail(VOLMGR_ERR_INVALID_ARGUMENT, e)));
        let (rt, vm, tracer_stop) = try_ffi!(build(&cfg, mode));
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
            Err(e) => fail_err(&e),
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
            Err(e) => fail_err(&e),
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::*;
    use std::ffi::{CStr, CString};

    /// `volmgr_new` with `extra` JSON members after `root_dir`; ROOT stays
    /// as it is (these tests run in the host's mount namespace).
    fn new_with(root: &std::path::Path, extra: &str) -> (volmgr_status, *mut volmgr) {
        let config = CString::new(format!(
            r#"{{"root_dir": "{}", "tracer": "off", "make_root_shared": false{extra}}}"#,
            root.display()
        ))
        .unwrap();
        let mut vm: *mut volmgr = std::ptr::null_mut();
        // SAFETY: valid arguments.
        let st = unsafe { volmgr_new(config.as_ptr(), &mut vm) };
        (st, vm)
    }

    fn last_error() -> String {
        // SAFETY: a NUL-terminated string owned by volmgr.
        unsafe { CStr::from_ptr(volmgr_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    /// The settings the agent has reach the manager through the C config;
    /// absent, they keep the library's defaults.
    #[test]
    fn agent_settings_reach_the_manager() {
        let root = tempfile::tempdir().unwrap();
        let (st, vm) = new_with(
            root.path(),
            r#", "wait_for_volumes_attached": true, "volume_stats_period_ms": 2500"#,
        );
        assert_eq!(st, VOLMGR_OK, "{}", last_error());
        // SAFETY: a live handle, freed right after.
        let config = unsafe { &(*vm).vm }.config().clone();
        // SAFETY: as above.
        unsafe { volmgr_free(vm) };
        assert!(config.wait_for_volumes_attached);
        assert_eq!(config.volume_stats_period.as_millis(), 2500);

        let (st, vm) = new_with(root.path(), "");
        assert_eq!(st, VOLMGR_OK, "{}", last_error());
        // SAFETY: a live handle, freed right after.
        let config = unsafe { &(*vm).vm }.config().clone();
        // SAFETY: as above.
        unsafe { volmgr_free(vm) };
        let defaults = volmgr_core::volumemanager::Config::new(root.path());
        assert!(!config.wait_for_volumes_attached);
        assert_eq!(config.volume_stats_period, defaults.volume_stats_period);
    }

    /// `make_root_shared` is off unless asked (the fork's kubelet does it).
    #[test]
    fn make_root_shared_is_off_unless_asked() {
        let root = tempfile::tempdir().unwrap();
        let config = CString::new(format!(
            r#"{{"root_dir": "{}", "make_root_shared": true}}"#,
            root.path().display()
        ))
        .unwrap();
        let parsed: super::NewConfig = serde_json::from_str(config.to_str().unwrap()).unwrap();
        assert!(super::build_config(&parsed).make_root_shared);
        let parsed: super::NewConfig =
            serde_json::from_str(&format!(r#"{{"root_dir": "{}"}}"#, root.path().display()))
                .unwrap();
        assert!(!super::build_config(&parsed).make_root_shared);
        let (st, vm) = new_with(root.path(), "");
        assert_eq!(st, VOLMGR_OK, "{}", last_error());
        // SAFETY: a live handle, freed right after.
        let status = unsafe { &(*vm).vm }.status();
        // SAFETY: as above.
        unsafe { volmgr_free(vm) };
        assert_eq!(status.root_propagation, "off");
    }

    /// Each library error keeps one status: a root directory that cannot
    /// be opened (a file, or below one) was `VOLMGR_ERR_INVALID_ARGUMENT` (every
    /// `VolumeManager::new` error was) and is `VOLMGR_ERR_IO`; a setting
    /// out of range stays `VOLMGR_ERR_INVALID_ARGUMENT`. (A missing ROOT is
    /// created.)
    #[test]
    fn errors_get_their_own_status() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        for root in [file.clone(), file.join("below")] {
            let (st, vm) = new_with(&root, "");
            assert!(vm.is_null());
            assert_eq!(st, VOLMGR_ERR_IO, "{}", last_error());
            assert!(
                last_error().starts_with("root directory:"),
                "{}",
                last_error()
            );
        }

        let (st, vm) = new_with(dir.path(), r#", "volume_stats_period_ms": 0"#);
        assert!(vm.is_null());
        assert_eq!(st, VOLMGR_ERR_INVALID_ARGUMENT, "{}", last_error());
        assert!(last_error().contains("stats period"), "{}", last_error());
        for csi in [
            r#"{"timeout_ms": 0}"#,
            r#"{"drivers": {"d": "relative.sock"}}"#,
        ] {
            let (st, _) = new_with(dir.path(), &format!(r#", "csi": {csi}"#));
            assert_eq!(st, VOLMGR_ERR_INVALID_ARGUMENT, "{csi}: {}", last_error());
        }
        let (st, _) = new_with(dir.path(), r#", "no_such_key": 1"#);
        assert_eq!(st, VOLMGR_ERR_INVALID_ARGUMENT, "{}", last_error());
    }

    /// Start twice and stop before start are the handle's state, whatever
    /// path the library's error took.
    #[test]
    fn lifecycle_errors_are_busy() {
        let root = tempfile::tempdir().unwrap();
        let (st, vm) = new_with(root.path(), r#", "wait_for_sources_ready": false"#);
        assert_eq!(st, VOLMGR_OK, "{}", last_error());
        // SAFETY: a live handle, freed at the end.
        unsafe {
            assert_eq!(volmgr_stop(vm), VOLMGR_ERR_BUSY);
            assert!(last_error().contains("not started"), "{}", last_error());
            assert_eq!(volmgr_start(vm), VOLMGR_OK);
            assert_eq!(volmgr_start(vm), VOLMGR_ERR_BUSY);
            assert_eq!(volmgr_stop(vm), VOLMGR_OK);
            volmgr_free(vm);
        }
    }
}
