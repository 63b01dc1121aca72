//! Status codes and the thread-local last error.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

/// Result of every call. Values are stable: retired values are never reused.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum volmgr_status {
    /// Success.
    VOLMGR_OK = 0,
    /// A NULL pointer, invalid UTF-8, malformed JSON or a rejected pod.
    VOLMGR_ERR_INVALID_ARGUMENT = 1,
    /// No such pod or volume.
    VOLMGR_ERR_NOT_FOUND = 2,
    /// A wait timed out.
    VOLMGR_ERR_TIMEOUT = 3,
    /// The call conflicts with the handle's state (e.g. start twice).
    VOLMGR_ERR_BUSY = 4,
    /// Not available in this build or configuration.
    VOLMGR_ERR_UNSUPPORTED = 5,
    /// Anything else, including a caught panic.
    VOLMGR_ERR_INTERNAL = 6,
}

pub use volmgr_status::*;

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Records `msg` as this thread's last error and returns `status`.
pub(crate) fn fail(status: volmgr_status, msg: impl Into<String>) -> volmgr_status {
    let msg = msg.into().replace('\0', "\\0");
    let c = CString::new(msg).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(c));
    status
}

/// The message of the last failed call on the calling thread, or NULL if
/// none failed yet. The string is owned by volmgr and stays valid until the
/// next failing call on this thread; do not free it.
#[no_mangle]
pub extern "C" fn volmgr_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
}
