//! Status codes, the thread-local last error, and the one mapping from
//! each library error to its status ([`ErrorStatus`]).
//!
//! | library error | status |
//! |---|---|
//! | `volumemanager::Error::InvalidConfig` (a setting out of range) | `INVALID_ARGUMENT` |
//! | `volumemanager::Error::Root` (ROOT cannot be opened or used) | `IO` |
//! | `volumemanager::Error::Reconstruction` | `IO` |
//! | `volumemanager::Error::Plugin` (a plugin name taken) | `BUSY` |
//! | `volumemanager::Error::AlreadyStarted` / `NotStarted` | `BUSY` |
//! | `volumemanager::Error::ReconstructionTask` | `INTERNAL` |
//! | `BuildError::Tracer` (the tracer asked for cannot run) | `UNSUPPORTED` |
//! | `WaitError::Timeout` / `Stopped` | `TIMEOUT` / `BUSY` |
//! | `WaitError::PodErrors` | `POD_VOLUME_ERRORS` |
//! | `WaitError::AttachLimitExceeded` | `ATTACH_LIMIT_EXCEEDED` |
//! | `ResizeError::PodNotFound` / `VolumeNotFound` | `NOT_FOUND` |
//! | `ResizeError::NotMounted` | `BUSY` |
//! | `ResizeError::Volume(BelowUsage)` | `INVALID_ARGUMENT` |
//! | `ResizeError::NotSupported` / `Volume(InvalidSpec)` | `UNSUPPORTED` |
//! | other `ResizeError` | `INTERNAL` |
//! | `PrepareSubPathsError::PodNotFound` / `NotMounted` / `Volume` | `NOT_FOUND` / `BUSY` / `INTERNAL` |
//! | `ObjectDecodeError::UnsupportedKind` / other | `UNSUPPORTED` / `INVALID_ARGUMENT` |
//! | `NameError` (a pod UID) | `INVALID_ARGUMENT` |
//! | `PluginLookupError` | `BUSY` |

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use volmgr_core::plugins::{PluginLookupError, VolumeError};
use volmgr_core::populator::objects::ObjectDecodeError;
use volmgr_core::volume::NameError;
use volmgr_core::volumemanager::{BuildError, Error, PrepareSubPathsError, ResizeError, WaitError};

/// Result of every call. Values are stable: retired values are never reused,
/// and new ones may be added (treat an unknown value as an error). Each
/// library error has exactly one status (ffi/src/error.rs).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum volmgr_status {
    /// Success.
    VOLMGR_OK = 0,
    /// A NULL pointer, invalid UTF-8, malformed JSON, a rejected pod or
    /// object, a setting out of range (`volmgr_new`: an unknown key, a zero
    /// `volume_stats_period_ms` or `csi.timeout_ms`, a relative CSI socket),
    /// or a size below what the volume holds.
    VOLMGR_ERR_INVALID_ARGUMENT = 1,
    /// No such pod, volume or object.
    VOLMGR_ERR_NOT_FOUND = 2,
    /// A wait timed out.
    VOLMGR_ERR_TIMEOUT = 3,
    /// The call conflicts with the handle's state: start twice, stop before
    /// start, a blocking call from a volmgr thread, a plugin name taken, a
    /// volume not mounted, volumes in use asked before the states synced, a
    /// wait ended by the manager stopping.
    VOLMGR_ERR_BUSY = 4,
    /// Not available in this build or configuration: a tracer that cannot
    /// run, an object kind volmgr does not follow, a volume that cannot be
    /// resized.
    VOLMGR_ERR_UNSUPPORTED = 5,
    /// Anything else, including a caught panic.
    VOLMGR_ERR_INTERNAL = 6,
    /// The system refused: the root directory cannot be opened or used
    /// (missing, not a directory, behind a symlink), or reading the mount
    /// table or the pods' directories at start failed.
    VOLMGR_ERR_IO = 7,
    /// `volmgr_wait_for_attach_and_mount` ended early: volumes of the pod
    /// could not be processed (a claim not found or not bound, a kind no
    /// plugin handles: the kubelet's pod errors). The message is the
    /// kubelet's `unmounted volumes=[…], unattached volumes=[…], failed to
    /// process volumes=[…]: <errors>`.
    VOLMGR_ERR_POD_VOLUME_ERRORS = 8,
    /// `volmgr_wait_for_attach_and_mount` timed out with a volume of the pod
    /// refused for the node's attach limit of its CSI driver (its
    /// VolumeAttachment failed with `ResourceExhausted`, or the driver's
    /// `max_volumes_per_node` is reached): the pod is to be rejected (the
    /// kubelet's `VolumeAttachLimitExceededError`, whose text the message
    /// is).
    VOLMGR_ERR_ATTACH_LIMIT_EXCEEDED = 9,
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

/// A library error's status: every error the C ABI hands on gets its
/// status here, and nowhere else.
pub(crate) trait ErrorStatus: std::fmt::Display {
    /// The status the error is reported with.
    fn status(&self) -> volmgr_status;
}

/// Records `e` as this thread's last error and returns its status.
pub(crate) fn fail_err(e: &impl ErrorStatus) -> volmgr_status {
    fail(e.status(), e.to_string())
}

impl ErrorStatus for Error {
    fn status(&self) -> volmgr_status {
        match self {
            Error::InvalidConfig(_) => VOLMGR_ERR_INVALID_ARGUMENT,
            Error::Root(_) | Error::Reconstruction(_) => VOLMGR_ERR_IO,
            Error::Plugin(_) | Error::AlreadyStarted | Error::NotStarted => VOLMGR_ERR_BUSY,
            Error::ReconstructionTask(_) => VOLMGR_ERR_INTERNAL,
        }
    }
}

impl ErrorStatus for BuildError {
    fn status(&self) -> volmgr_status {
        match self {
            BuildError::Manager(e) => e.status(),
            BuildError::Tracer { .. } => VOLMGR_ERR_UNSUPPORTED,
        }
    }
}

impl ErrorStatus for WaitError {
    fn status(&self) -> volmgr_status {
        match self {
            WaitError::Timeout { .. } => VOLMGR_ERR_TIMEOUT,
            WaitError::Stopped => VOLMGR_ERR_BUSY,
            WaitError::PodErrors { .. } => VOLMGR_ERR_POD_VOLUME_ERRORS,
            WaitError::AttachLimitExceeded { .. } => VOLMGR_ERR_ATTACH_LIMIT_EXCEEDED,
        }
    }
}

impl ErrorStatus for ResizeError {
    fn status(&self) -> volmgr_status {
        match self {
            ResizeError::PodNotFound(_) | ResizeError::VolumeNotFound { .. } => {
                VOLMGR_ERR_NOT_FOUND
            }
            ResizeError::NotMounted { .. } => VOLMGR_ERR_BUSY,
            ResizeError::Volume(VolumeError::BelowUsage { .. }) => VOLMGR_ERR_INVALID_ARGUMENT,
            ResizeError::NotSupported(_) | ResizeError::Volume(VolumeError::InvalidSpec(_)) => {
                VOLMGR_ERR_UNSUPPORTED
            }
            _ => VOLMGR_ERR_INTERNAL,
        }
    }
}

impl ErrorStatus for PrepareSubPathsError {
    fn status(&self) -> volmgr_status {
        match self {
            PrepareSubPathsError::PodNotFound(_) => VOLMGR_ERR_NOT_FOUND,
            PrepareSubPathsError::NotMounted { .. } => VOLMGR_ERR_BUSY,
            PrepareSubPathsError::Volume(_) => VOLMGR_ERR_INTERNAL,
        }
    }
}

impl ErrorStatus for ObjectDecodeError {
    fn status(&self) -> volmgr_status {
        match self {
            ObjectDecodeError::UnsupportedKind(_) => VOLMGR_ERR_UNSUPPORTED,
            _ => VOLMGR_ERR_INVALID_ARGUMENT,
        }
    }
}

impl ErrorStatus for NameError {
    fn status(&self) -> volmgr_status {
        VOLMGR_ERR_INVALID_ARGUMENT
    }
}

impl ErrorStatus for PluginLookupError {
    fn status(&self) -> volmgr_status {
        VOLMGR_ERR_BUSY
    }
}

/// The message of the last failed call on the calling thread, or NULL if
/// none failed yet. The string is owned by volmgr and stays valid until the
/// next failing call on this thread; do not free it.
#[no_mangle]
pub extern "C" fn volmgr_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
}
