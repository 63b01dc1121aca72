//! The boundary plumbing: panics never cross into C, pointers are checked.

use std::ffi::{c_char, CStr};

use crate::error::{fail, volmgr_status, VOLMGR_ERR_INTERNAL, VOLMGR_ERR_INVALID_ARGUMENT};

/// Runs `f`, turning a panic into `VOLMGR_ERR_INTERNAL`.
pub(crate) fn guard(f: impl FnOnce() -> volmgr_status) -> volmgr_status {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(s) => s,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fail(
                VOLMGR_ERR_INTERNAL,
                format!("internal error (panic): {what}"),
            )
        }
    }
}

/// Like [`guard`] for calls that return a value instead of a status.
pub(crate) fn guard_value<T>(default: T, f: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(default)
}

/// Reads a NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for the call.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, volmgr_status> {
    if p.is_null() {
        return Err(fail(VOLMGR_ERR_INVALID_ARGUMENT, format!("{what} is NULL")));
    }
    // SAFETY: the caller guarantees a valid NUL-terminated string.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|e| {
        fail(
            VOLMGR_ERR_INVALID_ARGUMENT,
            format!("{what} is not valid UTF-8: {e}"),
        )
    })
}

/// Checks an out-pointer.
pub(crate) fn out_arg<T>(p: *mut T, what: &str) -> Result<*mut T, volmgr_status> {
    if p.is_null() {
        Err(fail(VOLMGR_ERR_INVALID_ARGUMENT, format!("{what} is NULL")))
    } else {
        Ok(p)
    }
}

/// Decodes a JSON argument; malformed JSON is `VOLMGR_ERR_INVALID_ARGUMENT`
/// with serde's message after `what`.
pub(crate) fn json_arg<T: serde::de::DeserializeOwned>(
    text: &str,
    what: &str,
) -> Result<T, volmgr_status> {
    serde_json::from_str(text)
        .map_err(|e| fail(VOLMGR_ERR_INVALID_ARGUMENT, format!("{what}: {e}")))
}

/// Hands a Rust string to C (freed with `volmgr_string_free`).
pub(crate) fn to_c_string(s: String) -> *mut c_char {
    let s = s.replace('\0', "\\0");
    std::ffi::CString::new(s).map_or(std::ptr::null_mut(), |c| c.into_raw())
}

/// Unwraps a `Result<_, status>` inside a guarded body.
macro_rules! try_ffi {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(status) => return status,
        }
    };
}
pub(crate) use try_ffi;
