//! Service account tokens from the host process: a kubelet fork has the
//! TokenRequest client (its token manager), so projected
//! `serviceAccountToken` sources get their tokens through a callback.

use std::ffi::{c_char, c_void, CString};
use std::time::{Duration, SystemTime};

use volmgr_core::plugins::token::{Token, TokenError, TokenRequest, TokenSource};

use crate::boundary::{guard, try_ffi};
use crate::error::*;
use crate::handle::{handle, volmgr};

/// The largest token a callback may return (bytes, NUL excluded).
pub const VOLMGR_MAX_TOKEN_BYTES: usize = 64 * 1024;

/// Asked for a service account token bound to a pod. `request_json` is
/// `{"namespace", "service_account", "audience", "expiration_seconds",
/// "pod_name", "pod_uid"}` (the TokenRequest to make: `spec.audiences`,
/// `spec.expirationSeconds`, `spec.boundObjectRef`). On success the callback
/// writes the token, NUL-terminated, into `token_buf` (`token_buf_len`
/// bytes, `VOLMGR_MAX_TOKEN_BYTES + 1`), its expiration as Unix seconds into
/// `*expiration_unix`, and returns 0 (`VOLMGR_OK`); any other value is an
/// error on the volume (retried with backoff). (An `int32_t`, not a
/// `volmgr_status`: a value outside the enum stays well defined.) Called on a volmgr blocking
/// thread, never two at once for the same volume; it may block (a request
/// to the API server), but not on volmgr's blocking calls.
pub type volmgr_token_callback = Option<
    unsafe extern "C" fn(
        userdata: *mut c_void,
        request_json: *const c_char,
        token_buf: *mut c_char,
        token_buf_len: usize,
        expiration_unix: *mut i64,
    ) -> i32,
>;

/// The callback and its userdata.
#[derive(Clone, Copy)]
struct Callback {
    f: unsafe extern "C" fn(*mut c_void, *const c_char, *mut c_char, usize, *mut i64) -> i32,
    userdata: *mut c_void,
}

// SAFETY: the caller of volmgr_set_token_callback promises that the callback
// and its userdata may be used from volmgr's threads (documented there).
unsafe impl Send for Callback {}
// SAFETY: as above; the callback is only called, never mutated.
unsafe impl Sync for Callback {}

impl Callback {
    /// Calls the callback for `req` (blocking).
    fn call(&self, req: &TokenRequest) -> Result<Token, TokenError> {
        let json = serde_json::json!({
            "namespace": req.namespace,
            "service_account": req.service_account,
            "audience": req.audience,
            "expiration_seconds": req.expiration_seconds,
            "pod_name": req.pod_name,
            "pod_uid": req.pod_uid,
        })
        .to_string();
        let json = CString::new(json).map_err(|e| TokenError::Failed(e.to_string()))?;
        let mut buf = vec![0u8; VOLMGR_MAX_TOKEN_BYTES + 1];
        let mut expiration: i64 = 0;
        // SAFETY: the callback's contract (volmgr_set_token_callback): a
        // valid function; the buffer has `buf.len()` writable bytes.
        let st = unsafe {
            (self.f)(
                self.userdata,
                json.as_ptr(),
                buf.as_mut_ptr().cast::<c_char>(),
                buf.len(),
                &mut expiration,
            )
        };
        if st != 0 {
            return Err(TokenError::Failed(format!(
                "the host's token callback failed (status {st}) for service account {}/{}",
                req.namespace, req.service_account
            )));
        }
        let len = buf.iter().position(|&b| b == 0).ok_or_else(|| {
            TokenError::Failed("the host's token callback returned no NUL-terminated token".into())
        })?;
        buf.truncate(len);
        let token = String::from_utf8(buf).map_err(|_| {
            TokenError::Failed(
                "the host's token callback returned a token that is not UTF-8".into(),
            )
        })?;
        let expiration = u64::try_from(expiration)
            .ok()
            .filter(|s| *s > 0)
            .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
            .ok_or_else(|| {
                TokenError::Failed("the host's token callback gave no expiration".into())
            })?;
        Ok(Token { token, expiration })
    }
}

#[async_trait::async_trait]
impl TokenSource for Callback {
    async fn request(&self, req: &TokenRequest) -> Result<Token, TokenError> {
        let (cb, req) = (*self, req.clone());
        tokio::task::spawn_blocking(move || cb.call(&req))
            .await
            .map_err(|e| TokenError::Failed(format!("token callback: {e}")))?
    }
}

/// Sets the callback that gives projected `serviceAccountToken` sources
/// their tokens (see `volmgr_token_callback`). Set it before pods with such
/// volumes are upserted; without it, such a volume is an error saying no
/// token source is configured. Setting it again replaces it; it cannot be
/// cleared (NULL is `VOLMGR_ERR_INVALID_ARGUMENT`). `userdata` is passed back
/// unchanged and must stay usable from volmgr's threads until `volmgr_free`.
///
/// # Safety
/// `vm` is NULL or a live handle; `cb` is NULL or a valid function.
#[no_mangle]
pub unsafe extern "C" fn volmgr_set_token_callback(
    vm: *mut volmgr,
    cb: volmgr_token_callback,
    userdata: *mut c_void,
) -> volmgr_status {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { handle(vm) });
        let Some(f) = cb else {
            return fail(VOLMGR_ERR_INVALID_ARGUMENT, "token callback is NULL");
        };
        h.vm.set_token_source(std::sync::Arc::new(Callback { f, userdata }));
        VOLMGR_OK
    })
}
