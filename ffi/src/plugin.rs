//! Host plugins: volume plugins implemented by the C ABI caller through a
//! vtable (how a Go kubelet keeps an in-tree plugin working behind volmgr).
//! The reconciler drives them exactly like its own plugins: one operation per
//! volume and pod, backoff on failure, uncertain states, reconstruction.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use volmgr_core::plugins::{
    escape_plugin_name, BlockingPool, MountRequest, ReconstructedVolume, UnmountRequest,
    VolumeError, VolumePlugin,
};
use volmgr_core::sys::mount_table::{MountTable, MountTableView};
use volmgr_core::sys::root_dir::{check_component, RelPath, RootDir};
use volmgr_core::volume::{PodUid, VolumeSource, VolumeSpec};

use crate::boundary::{guard, str_arg, try_ffi};
use crate::error::*;
use crate::handle::volmgr;

/// Size of the error buffer handed to `set_up` and `tear_down`.
pub const VOLMGR_PLUGIN_ERROR_LEN: usize = 1024;

/// A volume plugin implemented by the caller. Every callback gets the
/// `userdata` given to `volmgr_register_plugin` first, and runs on a volmgr
/// thread (`can_support` on the thread that upserts the pod; `set_up` and
/// `tear_down` on volmgr's blocking threads, possibly several at once for
/// different volumes, never twice at once for the same volume of a pod).
#[repr(C)]
pub struct volmgr_plugin {
    /// Plugin name, e.g. `example.com/nfs` (copied at registration; must be
    /// unique; `/` becomes `~` in directory names).
    pub name: *const c_char,
    /// Whether the plugin handles this volume: `spec_json` is the pod's
    /// `v1.Volume` as JSON. Only volume types volmgr does not handle itself
    /// are offered.
    pub can_support:
        Option<unsafe extern "C" fn(userdata: *mut c_void, spec_json: *const c_char) -> bool>,
    /// Sets the volume up in `target_dir` (created by volmgr beforehand, under
    /// `ROOT/pods/<uid>/volumes/<name>/<volume>`). Must be idempotent: it is
    /// called again after a restart or an uncertain failure. On failure, write
    /// a message into `err` (`err_len` bytes, NUL-terminated) and return a
    /// status; `VOLMGR_ERR_TIMEOUT` means "may have happened" (uncertain).
    pub set_up: Option<
        unsafe extern "C" fn(
            userdata: *mut c_void,
            spec_json: *const c_char,
            target_dir: *const c_char,
            err: *mut c_char,
            err_len: usize,
        ) -> volmgr_status,
    >,
    /// Tears the volume down in `target_dir`; volmgr removes the directory
    /// afterwards (it refuses to delete across a mount left behind).
    /// Idempotent; same error convention as `set_up`.
    pub tear_down: Option<
        unsafe extern "C" fn(
            userdata: *mut c_void,
            target_dir: *const c_char,
            err: *mut c_char,
            err_len: usize,
        ) -> volmgr_status,
    >,
}

#[derive(Clone, Copy)]
struct Callbacks {
    can_support: unsafe extern "C" fn(*mut c_void, *const c_char) -> bool,
    set_up: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        *const c_char,
        *mut c_char,
        usize,
    ) -> volmgr_status,
    tear_down:
        unsafe extern "C" fn(*mut c_void, *const c_char, *mut c_char, usize) -> volmgr_status,
    userdata: *mut c_void,
}

// SAFETY: volmgr_register_plugin's contract: the callbacks and userdata may
// be used from any volmgr thread, concurrently.
unsafe impl Send for Callbacks {}
// SAFETY: as above.
unsafe impl Sync for Callbacks {}

struct HostPlugin {
    name: String,
    dir: String,
    cb: Callbacks,
    root: Arc<RootDir>,
    pool: Arc<BlockingPool>,
}

impl HostPlugin {
    fn volume_dir(&self, pod: &PodUid, volume: &str) -> Result<RelPath, VolumeError> {
        Ok(RelPath::new([
            "pods",
            pod.as_str(),
            "volumes",
            self.dir.as_str(),
            volume,
        ])?)
    }
}

fn cstring(s: &str) -> Result<CString, VolumeError> {
    CString::new(s).map_err(|_| VolumeError::InvalidSpec("string contains NUL".into()))
}

fn outcome(plugin: &str, status: volmgr_status, err: &[u8]) -> Result<(), VolumeError> {
    if status == VOLMGR_OK {
        return Ok(());
    }
    let msg = CStr::from_bytes_until_nul(err)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    let msg = if msg.is_empty() {
        format!("failed with status {}", status as u32)
    } else {
        msg
    };
    if status == VOLMGR_ERR_TIMEOUT {
        Err(VolumeError::Uncertain(format!("plugin {plugin}: {msg}")))
    } else {
        Err(VolumeError::Plugin {
            plugin: plugin.to_string(),
            message: msg,
        })
    }
}

#[async_trait::async_trait]
impl VolumePlugin for HostPlugin {
    fn name(&self) -> &str {
        &self.name
    }

    fn can_support(&self, source: &VolumeSource) -> bool {
        let VolumeSource::Other { spec, .. } = source else {
            return false;
        };
        let Ok(json) = CString::new(spec.to_string()) else {
            return false;
        };
        // SAFETY: the registration contract; the string lives for the call.
        unsafe { (self.cb.can_support)(self.cb.userdata, json.as_ptr()) }
    }

    async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        let spec = match &req.spec.source {
            VolumeSource::Other { spec, .. } => spec.to_string(),
            _ => return Err(VolumeError::InvalidSpec("not a host plugin volume".into())),
        };
        let rel = self.volume_dir(&req.pod_uid, &req.spec.name)?;
        let (root, cb, name) = (Arc::clone(&self.root), self.cb, self.name.clone());
        self.pool
            .run(move || {
                // Capture the callbacks as a whole (they are Send), not field by field.
                let cb = cb;
                let (target, _) = root.mkdir_mount_target(&rel, 0o750)?;
                let path = target.path().to_path_buf();
                let (spec, dir) = (cstring(&spec)?, cstring(&path.to_string_lossy())?);
                let mut err = vec![0u8; VOLMGR_PLUGIN_ERROR_LEN];
                // SAFETY: the registration contract; buffers live for the call.
                let status = unsafe {
                    (cb.set_up)(
                        cb.userdata,
                        spec.as_ptr(),
                        dir.as_ptr(),
                        err.as_mut_ptr().cast(),
                        err.len(),
                    )
                };
                outcome(&name, status, &err).map(|()| path)
            })
            .await
    }

    async fn tear_down(&self, req: UnmountRequest) -> Result<(), VolumeError> {
        let rel = self.volume_dir(&req.pod_uid, &req.spec.name)?;
        let (root, cb, name) = (Arc::clone(&self.root), self.cb, self.name.clone());
        self.pool
            .run(move || {
                // Capture the callbacks as a whole (they are Send), not field by field.
                let cb = cb;
                let path = root.abs(&rel);
                if root.exists(&rel)? {
                    let dir = cstring(&path.to_string_lossy())?;
                    let mut err = vec![0u8; VOLMGR_PLUGIN_ERROR_LEN];
                    // SAFETY: the registration contract; buffers live for the call.
                    let status = unsafe {
                        (cb.tear_down)(
                            cb.userdata,
                            dir.as_ptr(),
                            err.as_mut_ptr().cast(),
                            err.len(),
                        )
                    };
                    outcome(&name, status, &err)?;
                }
                root.remove_all(&rel)?;
                Ok(())
            })
            .await
    }

    fn verify_reads_mount_table(&self, _spec: &VolumeSpec) -> bool {
        false
    }

    fn verify(&self, _spec: &VolumeSpec, path: &Path, _table: MountTableView<'_>) -> bool {
        path.is_dir()
    }

    fn volumes_dir_name(&self) -> Option<String> {
        Some(self.dir.clone())
    }

    fn reconstruct(
        &self,
        pod: &PodUid,
        volume: &str,
        _table: &MountTable,
    ) -> Result<Option<ReconstructedVolume>, VolumeError> {
        let rel = self.volume_dir(pod, volume)?;
        let source = VolumeSource::Other {
            kind: self.name.clone(),
            spec: Arc::new(serde_json::json!({ "name": volume })),
        };
        let path = self.root.abs(&rel);
        Ok(Some(ReconstructedVolume::named(
            volume, source, path, false,
        )))
    }
}

/// Registers a host plugin (before pods that need it are upserted). The
/// vtable is copied; `userdata` is passed to every callback and must stay
/// valid, and the callbacks callable from any thread, until `volmgr_free`.
/// `VOLMGR_ERR_BUSY` if the name is taken.
///
/// # Safety
/// `vm` is NULL or a live handle; `vtable` is NULL or points to a valid
/// `volmgr_plugin` whose `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn volmgr_register_plugin(
    vm: *mut volmgr,
    vtable: *const volmgr_plugin,
    userdata: *mut c_void,
) -> volmgr_status {
    guard(|| {
        if vm.is_null() || vtable.is_null() {
            return fail(
                VOLMGR_ERR_INVALID_ARGUMENT,
                "volmgr handle or vtable is NULL",
            );
        }
        // SAFETY: non-NULL and valid per the contract.
        let (h, vt) = unsafe { (&*vm, &*vtable) };
        // SAFETY: per the contract.
        let name = try_ffi!(unsafe { str_arg(vt.name, "vtable->name") }).to_string();
        let dir = escape_plugin_name(&name);
        if !check_component(dir.as_ref()) || name.contains('~') {
            return fail(
                VOLMGR_ERR_INVALID_ARGUMENT,
                format!("invalid plugin name {name:?}"),
            );
        }
        let (Some(can_support), Some(set_up), Some(tear_down)) =
            (vt.can_support, vt.set_up, vt.tear_down)
        else {
            return fail(
                VOLMGR_ERR_INVALID_ARGUMENT,
                "every vtable callback is required",
            );
        };
        let plugin = HostPlugin {
            name,
            dir,
            cb: Callbacks {
                can_support,
                set_up,
                tear_down,
                userdata,
            },
            root: Arc::clone(h.vm.root()),
            pool: Arc::clone(h.vm.pool()),
        };
        match h.vm.register_plugin(Arc::new(plugin)) {
            Ok(()) => VOLMGR_OK,
            Err(e) => fail_err(&e),
        }
    })
}
