//! `volmgr_prepare_sub_paths`: a container's subPaths, prepared when the
//! caller starts the container (the kubelet's `makeMounts`).

use std::ffi::c_char;

use volmgr_core::volume::PodUid;

use crate::boundary::{guard, out_arg, str_arg, to_c_string, try_ffi};
use crate::error::*;
use crate::handle::{block_on, handle, volmgr};

/// One bind mount in `volmgr_prepare_sub_paths`' answer.
#[derive(serde::Serialize)]
struct PreparedJson<'a> {
    volume: &'a str,
    container: &'a str,
    index: usize,
    sub_path: &'a str,
    path: &'a str,
}

/// The kubelet's `makeMounts` subPath step, to call when starting container
/// `container` of pod `pod_uid`, after its volumes are mounted
/// (`volmgr_wait_for_attach_and_mount`) and after the init containers
/// before it ran: each of its `volumeMounts` with a `subPath` (or
/// `subPathExpr`) is bind-mounted at
/// `ROOT/pods/<uid>/volume-subpaths/<volume>/<container>/<index>` from the
/// path inside the volume as it is now (a missing path is made a
/// directory, as the kubelet does; a file an init container wrote is bound
/// as that file). Volume set-up prepares no subPath for pods upserted
/// through this ABI. Calling it again (a restarted container) keeps the
/// binds already there. `*out_json` gets a JSON array of `{"volume",
/// "container", "index", "sub_path", "path"}` (`path`: what the runtime
/// binds into the container; `[]` for a container without subPaths), owned
/// by the caller (`volmgr_string_free`); the volume lists' `sub_paths` show
/// the prepared ones from then on. `VOLMGR_ERR_NOT_FOUND` for an unknown
/// pod, `VOLMGR_ERR_BUSY` when a volume it mounts is not mounted,
/// `VOLMGR_ERR_INTERNAL` when a subPath cannot be bound (a symlink leading
/// out of the volume, ...: the kubelet's `CreateContainerConfigError`).
/// Blocks while the binds are made, on a volmgr thread.
///
/// # Safety
/// `vm` live or NULL; `pod_uid` and `container` strings or NULL; `out_json`
/// writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn volmgr_prepare_sub_paths(
    vm: *mut volmgr,
    pod_uid: *const c_char,
    container: *const c_char,
    out_json: *mut *mut c_char,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        // SAFETY: per this function's contract.
        let uid = try_ffi!(unsafe { str_arg(pod_uid, "pod_uid") });
        // SAFETY: per this function's contract.
        let container = try_ffi!(unsafe { str_arg(container, "container") });
        let out = try_ffi!(out_arg(out_json, "out_json"));
        let uid = try_ffi!(PodUid::new(uid).map_err(|e| fail_err(&e)));
        let prepared = match try_ffi!(block_on(h, h.vm.prepare_sub_paths(&uid, container))) {
            Ok(p) => p,
            Err(e) => return fail_err(&e),
        };
        let rows: Vec<PreparedJson<'_>> = prepared
            .iter()
            .map(|(volume, s)| PreparedJson {
                volume,
                container: &s.container,
                index: s.index,
                sub_path: &s.sub_path,
                path: &s.path,
            })
            .collect();
        let text = try_ffi!(
            serde_json::to_string(&rows).map_err(|e| fail(VOLMGR_ERR_INTERNAL, e.to_string()))
        );
        // SAFETY: checked non-NULL.
        unsafe { *out = to_c_string(text) };
        VOLMGR_OK
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::*;
    use std::ffi::{CStr, CString};

    const CHILD_ENV: &str = "VOLMGR_FFI_TEST_CHILD";

    /// Runs `body` in this test binary re-executed in a private mount
    /// namespace (it mounts); skips when not root.
    fn in_private_mounts(name: &str, body: impl FnOnce()) {
        if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
            body();
            return;
        }
        let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
        if uid != 0 {
            println!("SKIP {name}: needs root for a private mount namespace");
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--"])
            .arg(exe)
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, name)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "child failed: {}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn json_of(p: *mut c_char) -> serde_json::Value {
        // SAFETY: a string volmgr returned, freed right after.
        let v = serde_json::from_str(&unsafe { CStr::from_ptr(p) }.to_string_lossy()).unwrap();
        // SAFETY: as above.
        unsafe { volmgr_string_free(p) };
        v
    }

    fn binds_below(dir: &std::path::Path) -> usize {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        table
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| std::path::Path::new(p).starts_with(dir))
            .count()
    }

    /// The common pattern: an init container renders `app.conf` into an
    /// emptyDir and the app mounts `subPath: app.conf`. Set-up prepares no
    /// subPath (nothing is made where the file will be); once the "init
    /// container" wrote it, `volmgr_prepare_sub_paths` binds that file,
    /// lists it, keeps it when called again and across a restart, and the
    /// pod's deletion cleans it.
    fn init_container_file() {
        let root = tempfile::tempdir().unwrap();
        let config = CString::new(format!(
            r#"{{"root_dir": "{}", "tracer": "off", "make_root_shared": false}}"#,
            root.path().display()
        ))
        .unwrap();
        let pod = CString::new(
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","uid":"uid-sp"},
               "spec":{"initContainers":[{"name":"render","image":"i","volumeMounts":[{"name":"conf","mountPath":"/out"}]}],
                       "containers":[{"name":"app","image":"i","volumeMounts":[
                          {"name":"conf","mountPath":"/etc/app.conf","subPath":"app.conf"},
                          {"name":"conf","mountPath":"/d","subPath":"dir/x"}]}],
                       "volumes":[{"name":"conf","emptyDir":{}}]}}"#,
        )
        .unwrap();
        let vol = root
            .path()
            .join("pods/uid-sp/volumes/kubernetes.io~empty-dir/conf");
        let subs = root.path().join("pods/uid-sp/volume-subpaths");
        let mut vm: *mut volmgr = std::ptr::null_mut();
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: valid arguments throughout; the handle is freed at the end.
        unsafe {
            assert_eq!(volmgr_new(config.as_ptr(), &mut vm), VOLMGR_OK);
            assert_eq!(volmgr_start(vm), VOLMGR_OK);
            // This test is the pod source: every pod is delivered, then the
            // sources are ready (the kubelet's readyToUnmount: before the pod
            // is back, a ready source would have its volume torn down).
            assert_eq!(volmgr_pod_upsert(vm, pod.as_ptr()), VOLMGR_OK);
            assert_eq!(volmgr_sources_ready(vm), VOLMGR_OK);
            assert_eq!(
                volmgr_wait_for_attach_and_mount(vm, c"uid-sp".as_ptr(), 30_000),
                VOLMGR_OK
            );
            assert_eq!(binds_below(&subs), 0, "set-up prepared a subPath");
            assert!(!vol.join("app.conf").exists(), "set-up made app.conf");
            assert_eq!(
                volmgr_get_mounted_volumes_for_pod(vm, c"uid-sp".as_ptr(), &mut out),
                VOLMGR_OK
            );
            assert_eq!(json_of(out)[0]["sub_paths"], serde_json::json!([]));

            // The init container runs.
            std::fs::write(vol.join("app.conf"), b"rendered").unwrap();
            assert_eq!(
                volmgr_prepare_sub_paths(vm, c"uid-sp".as_ptr(), c"app".as_ptr(), &mut out),
                VOLMGR_OK
            );
            let prepared = json_of(out);
            let path = |i: usize| std::path::PathBuf::from(prepared[i]["path"].as_str().unwrap());
            assert_eq!(prepared.as_array().unwrap().len(), 2, "{prepared}");
            assert_eq!(prepared[0]["volume"], "conf");
            assert_eq!(path(0), subs.join("conf/app/0"));
            assert!(path(0).is_file(), "a file bind");
            assert_eq!(std::fs::read(path(0)).unwrap(), b"rendered");
            assert!(
                path(1).is_dir() && vol.join("dir/x").is_dir(),
                "made a directory"
            );
            assert_eq!(binds_below(&subs), 2);
            assert_eq!(
                volmgr_prepare_sub_paths(vm, c"uid-sp".as_ptr(), c"app".as_ptr(), &mut out),
                VOLMGR_OK
            );
            assert_eq!(json_of(out), prepared, "again: the same binds");
            assert_eq!(binds_below(&subs), 2, "nothing stacked");
            assert_eq!(
                volmgr_prepare_sub_paths(vm, c"uid-sp".as_ptr(), c"render".as_ptr(), &mut out),
                VOLMGR_OK
            );
            assert_eq!(json_of(out), serde_json::json!([]));
            assert_eq!(
                volmgr_prepare_sub_paths(vm, c"nope".as_ptr(), c"app".as_ptr(), &mut out),
                VOLMGR_ERR_NOT_FOUND
            );
            assert_eq!(
                volmgr_get_mounted_volumes_for_pod(vm, c"uid-sp".as_ptr(), &mut out),
                VOLMGR_OK
            );
            let listed = json_of(out);
            assert_eq!(
                listed[0]["sub_paths"].as_array().unwrap().len(),
                2,
                "{listed}"
            );

            // A restart (the mounts stay): reconstruction finds the binds,
            // and the list shows them without the container starting again.
            volmgr_free(vm);
            assert_eq!(volmgr_new(config.as_ptr(), &mut vm), VOLMGR_OK);
            assert_eq!(volmgr_start(vm), VOLMGR_OK);
            // This test is the pod source: every pod is delivered, then the
            // sources are ready (the kubelet's readyToUnmount: before the pod
            // is back, a ready source would have its volume torn down).
            assert_eq!(volmgr_pod_upsert(vm, pod.as_ptr()), VOLMGR_OK);
            assert_eq!(volmgr_sources_ready(vm), VOLMGR_OK);
            assert_eq!(
                volmgr_wait_for_attach_and_mount(vm, c"uid-sp".as_ptr(), 30_000),
                VOLMGR_OK
            );
            assert_eq!(
                volmgr_get_mounted_volumes_for_pod(vm, c"uid-sp".as_ptr(), &mut out),
                VOLMGR_OK
            );
            assert_eq!(json_of(out), listed, "after a restart");
            assert_eq!(binds_below(&subs), 2);

            assert_eq!(volmgr_pod_delete(vm, c"uid-sp".as_ptr()), VOLMGR_OK);
            assert_eq!(
                volmgr_wait_for_unmount(vm, c"uid-sp".as_ptr(), 30_000),
                VOLMGR_OK
            );
            assert_eq!(binds_below(&subs), 0);
            assert!(!subs.exists(), "volume-subpaths cleaned");
            volmgr_free(vm);
        }
    }

    #[test]
    fn an_init_containers_file_is_bound_at_container_start() {
        in_private_mounts(
            "sub_paths::tests::an_init_containers_file_is_bound_at_container_start",
            init_container_file,
        );
    }
}
