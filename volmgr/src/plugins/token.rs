//! Service account tokens for projected `serviceAccountToken` sources: the
//! [`TokenSource`] seam (the kubelet's TokenRequest through its token
//! manager), the file-backed source of the manifests mode
//! ([`FileTokenSource`], `volmgr agent --token-file DIR`), and the refresh
//! schedule ([`TokenRefresh`]: at 80% of a token's lifetime or after 24 h,
//! whichever comes first, through the reconciler's remount path).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

use crate::util::sync::{MutexExt, RwLockExt};
use crate::volume::UniqueVolumeName;

/// A TokenRequest (`serviceaccounts/<name>/token`) bound to a pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenRequest {
    /// The pod's namespace.
    pub namespace: String,
    /// The service account.
    pub service_account: String,
    /// `audience` (empty: the API server's default audiences).
    pub audience: String,
    /// `expirationSeconds` asked for.
    pub expiration_seconds: i64,
    /// The bound pod's name (`boundObjectRef.name`).
    pub pod_name: String,
    /// The bound pod's UID (`boundObjectRef.uid`).
    pub pod_uid: String,
    /// The service account's UID as last read (empty: unknown). Not sent:
    /// it keys cached tokens, so an account deleted and created again
    /// (the API server refuses tokens bound to the old one) gets new ones.
    pub service_account_uid: String,
}

/// A token and when it expires. `Debug` never prints the token.
#[derive(Clone)]
pub struct Token {
    /// The token (a JWT from the API server).
    pub token: String,
    /// `status.expirationTimestamp`.
    pub expiration: SystemTime,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("token", &"<redacted>")
            .field("expiration", &self.expiration)
            .finish()
    }
}

/// Why a token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// No token source is configured (manifests mode without `--token-file`).
    #[error("serviceAccountToken {0}: no token source is configured (start the agent with --token-file DIR, or use the API source)")]
    NoSource(String),
    /// The source has no token for this service account.
    #[error(
        "serviceAccountToken: no token for service account {namespace}/{service_account}: {why}"
    )]
    NotFound {
        /// The namespace.
        namespace: String,
        /// The service account.
        service_account: String,
        /// Why (the file that is missing, the API's answer).
        why: String,
    },
    /// The source failed (an API error, an unreadable file).
    #[error("serviceAccountToken: {0}")]
    Failed(String),
}

/// Where projected volumes get service account tokens: the kubelet's
/// TokenRequest. The API source implements it with
/// `POST /api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token`
/// (`spec.audiences = [audience]` when not empty, `spec.expirationSeconds`,
/// `spec.boundObjectRef = {kind: Pod, apiVersion: v1, name: pod_name, uid:
/// pod_uid}`) and returns `status.token` and `status.expirationTimestamp`.
/// Called at each set-up of a projected volume with a token source (first
/// mount, payload change, refresh); it may cache. Must not block the caller
/// for long: the reconciler waits on it.
#[async_trait::async_trait]
pub trait TokenSource: Send + Sync + 'static {
    /// A token for `req`.
    async fn request(&self, req: &TokenRequest) -> Result<Token, TokenError>;
}

/// The largest token file [`FileTokenSource`] reads.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// Tokens from files, for the manifests mode: `DIR/<namespace>/<service
/// account>` holds the token (surrounding white space trimmed). The token
/// is taken to be valid for the `expirationSeconds` asked for, from the
/// time it is read; replacing the file gives the next refresh a new token
/// (the old one stays in the volume until then).
#[derive(Debug, Clone)]
pub struct FileTokenSource {
    dir: PathBuf,
}

impl FileTokenSource {
    /// Tokens from `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    fn read(&self, req: &TokenRequest) -> Result<Token, TokenError> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let not_found = |why: String| TokenError::NotFound {
            namespace: req.namespace.clone(),
            service_account: req.service_account.clone(),
            why,
        };
        let ok = |c: &str| crate::sys::root_dir::check_component(std::ffi::OsStr::new(c));
        if !ok(&req.namespace) || !ok(&req.service_account) {
            return Err(not_found(
                "invalid namespace or service account name".into(),
            ));
        }
        let path = self.dir.join(&req.namespace).join(&req.service_account);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| not_found(format!("{}: {e}", path.display())))?;
        let mut buf = Vec::new();
        file.take(MAX_TOKEN_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(|e| TokenError::Failed(format!("{}: {e}", path.display())))?;
        if buf.len() as u64 > MAX_TOKEN_BYTES {
            return Err(TokenError::Failed(format!(
                "{}: larger than {MAX_TOKEN_BYTES} bytes",
                path.display()
            )));
        }
        let token = String::from_utf8(buf)
            .map_err(|_| TokenError::Failed(format!("{}: not UTF-8", path.display())))?
            .trim()
            .to_string();
        if token.is_empty() {
            return Err(not_found(format!("{} is empty", path.display())));
        }
        let secs = u64::try_from(req.expiration_seconds.max(1)).unwrap_or(1);
        Ok(Token {
            token,
            expiration: SystemTime::now() + Duration::from_secs(secs),
        })
    }
}

#[async_trait::async_trait]
impl TokenSource for FileTokenSource {
    async fn request(&self, req: &TokenRequest) -> Result<Token, TokenError> {
        self.read(req)
    }
}

/// When a token must be replaced: at 80% of its lifetime (from now, when
/// it was obtained) or after 24 h, whichever comes first.
pub fn refresh_after(expiration: SystemTime, now: SystemTime) -> Duration {
    let life = expiration.duration_since(now).unwrap_or_default();
    (life * 4 / 5).min(Duration::from_secs(24 * 3600))
}

/// Called with a volume whose tokens are due for a refresh: wakes the
/// reconciler for it (set by the volume manager).
pub type RemountWaker = Arc<dyn Fn(UniqueVolumeName) + Send + Sync>;

/// The token source in use and the refresh schedule of the volumes that
/// hold tokens. Shared by the projected plugin and the volume manager.
#[derive(Default)]
pub struct TokenRefresh {
    source: RwLock<Option<Arc<dyn TokenSource>>>,
    /// When each volume's tokens are due, and the timer that wakes then.
    due: Mutex<HashMap<UniqueVolumeName, (Instant, tokio::task::AbortHandle)>>,
    waker: OnceLock<RemountWaker>,
}

impl TokenRefresh {
    /// Sets (or replaces) the token source.
    pub fn set_source(&self, source: Arc<dyn TokenSource>) {
        *self.source.write_locked() = Some(source);
    }

    /// The token source, if one is set.
    pub fn source(&self) -> Option<Arc<dyn TokenSource>> {
        self.source.read_locked().clone()
    }

    /// Sets what wakes the reconciler when a refresh is due (once).
    pub fn set_waker(&self, waker: RemountWaker) {
        let _ = self.waker.set(waker);
    }

    /// Records that `volume`'s tokens must be replaced after `after`, and
    /// arms a timer that wakes the reconciler then (event driven: no
    /// polling). Must run inside the Tokio runtime.
    /// A volume rescheduled (or forgotten) cancels its earlier timer.
    pub fn schedule(self: &Arc<Self>, volume: &UniqueVolumeName, after: Duration) {
        let at = Instant::now() + after;
        let (me, v) = (Arc::clone(self), volume.clone());
        let timer = tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            if let Some(w) = me.waker.get() {
                w(v);
            }
        });
        let old = self
            .due
            .locked()
            .insert(volume.clone(), (at, timer.abort_handle()));
        if let Some((_, t)) = old {
            t.abort();
        }
    }

    /// Whether `volume`'s tokens are due for a refresh.
    pub fn is_due(&self, volume: &UniqueVolumeName) -> bool {
        self.due
            .locked()
            .get(volume)
            .is_some_and(|(at, _)| *at <= Instant::now())
    }

    /// Forgets `volume` (torn down, or it holds no token any more).
    pub fn forget(&self, volume: &UniqueVolumeName) {
        if let Some((_, t)) = self.due.locked().remove(volume) {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ns: &str, sa: &str) -> TokenRequest {
        TokenRequest {
            namespace: ns.into(),
            service_account: sa.into(),
            audience: String::new(),
            expiration_seconds: 600,
            pod_name: "p".into(),
            pod_uid: "u".into(),
            service_account_uid: String::new(),
        }
    }

    #[tokio::test]
    async fn file_source_reads_by_namespace_and_service_account() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("ns")).unwrap();
        std::fs::write(d.path().join("ns/sa"), "tok-1\n").unwrap();
        let s = FileTokenSource::new(d.path());
        let t = s.request(&req("ns", "sa")).await.unwrap();
        assert_eq!(t.token, "tok-1");
        assert!(!format!("{t:?}").contains("tok-1"));
        let e = s
            .request(&req("ns", "other"))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("ns/other"), "{e}");
        let e = s.request(&req("..", "sa")).await.unwrap_err().to_string();
        assert!(e.contains("invalid"), "{e}");
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("ns/link")).unwrap();
        assert!(s.request(&req("ns", "link")).await.is_err());
    }

    #[test]
    fn refresh_at_eighty_percent_or_a_day() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let after = refresh_after(now + Duration::from_secs(100), now);
        assert_eq!(after, Duration::from_secs(80));
        let after = refresh_after(now + Duration::from_secs(7 * 24 * 3600), now);
        assert_eq!(after, Duration::from_secs(24 * 3600));
        assert_eq!(
            refresh_after(now, now + Duration::from_secs(5)),
            Duration::ZERO
        );
    }
}
