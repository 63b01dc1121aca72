//! The event callback as C sees it: its type and
//! `volmgr_set_event_callback` (what calls it: [`crate::callback`]).

use std::ffi::{c_char, c_void};

use volmgr_core::util::sync::MutexExt;

use crate::boundary::{guard, try_ffi};
use crate::callback::EventCallback;
use crate::error::*;
use crate::handle::{handle, volmgr};

/// Called for each volume event (`event_json` is only valid during the
/// call). Runs on a volmgr runtime thread; it must not block and must not
/// call back into the same handle's `volmgr_free`. volmgr's blocking calls
/// made from it (start, stop, the waits) fail with `VOLMGR_ERR_BUSY`.
pub type volmgr_event_callback =
    Option<unsafe extern "C" fn(userdata: *mut c_void, event_json: *const c_char)>;

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
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::*;
    use std::ffi::{c_char, c_void};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;
    use volmgr_core::util::sync::MutexExt;

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
            r#"{{"root_dir": "{}", "tracer": "off", "make_root_shared": false}}"#,
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
