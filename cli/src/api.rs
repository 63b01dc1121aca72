//! The agent's local API: newline-delimited JSON over a Unix socket at
//! `ROOT/volmgr.sock` (mode 0600), used by `volmgr status` and `volmgr wait`.
//!
//! Requests: `{"method":"status"}`, `{"method":"metrics"}`,
//! `{"method":"wait","pod":UID,"timeout_ms":N}`,
//! `{"method":"wait_unmount","pod":UID,"timeout_ms":N}`,
//! `{"method":"wait_all","pods":N|null,"timeout_ms":N}`,
//! `{"method":"timeline","pod":"NS/NAME"|UID}` (`volmgr doctor --pod`).
//! Responses: `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`.
//!
//! Clients are bounded (see [`crate::limits`]): connections, request line
//! length, read and write deadlines, large responses in flight.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use crate::limits::{
    serve_bounded, Admission, ClientLimits, Peer, BUSY, MAX_REQUEST_LINE, READ_DEADLINE,
    WRITE_DEADLINE,
};

use volmgr::volume::PodUid;
use volmgr::volumemanager::VolumeManager;

/// The socket's file name under ROOT.
pub const SOCKET_NAME: &str = "volmgr.sock";

/// The answer to a connection over the client bounds.
const BUSY_LINE: &str = "{\"ok\":false,\"error\":\"too many clients, retry\"}\n";

/// Longest wait a client may ask for.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// API errors.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Could not connect, send or receive.
    #[error("{path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The agent answered something unexpected.
    #[error("bad response from the agent: {0}")]
    Protocol(String),
    /// The agent reported an error.
    #[error("{0}")]
    Remote(String),
    /// The agent has too many clients: it answered so, or closed the
    /// connection before answering (reset, broken pipe, end of file).
    #[error("{path}: the agent {how}; retry")]
    Busy {
        /// The socket.
        path: PathBuf,
        /// What the agent did.
        how: &'static str,
    },
    /// The socket, its directory or the process serving it belongs to
    /// another user, who could have put it there: not asked.
    #[error("{path}: not trusted: {why}")]
    Untrusted {
        /// The socket.
        path: PathBuf,
        /// Whose it is.
        why: String,
    },
    /// The agent did not answer in time.
    #[error("{path}: the agent did not answer within {after:?}")]
    Timeout {
        /// The socket.
        path: PathBuf,
        /// How long the client waited.
        after: Duration,
    },
}

/// A request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum Request {
    /// The status document.
    Status,
    /// Prometheus text.
    Metrics,
    /// Wait until the pod's volumes are all mounted.
    Wait {
        /// Pod UID.
        pod: String,
        /// Timeout.
        timeout_ms: u64,
    },
    /// Wait until the node has converged (every desired volume mounted,
    /// nothing else mounted), with exactly `pods` pods desired if given.
    WaitAll {
        /// Expected number of desired pods.
        pods: Option<usize>,
        /// Timeout.
        timeout_ms: u64,
    },
    /// Wait until nothing of the pod is mounted.
    WaitUnmount {
        /// Pod UID.
        pod: String,
        /// Timeout.
        timeout_ms: u64,
    },
    /// A pod's volumes' syscall timelines and stuck calls.
    Timeline {
        /// `namespace/name` or UID.
        pod: String,
    },
}

/// One request line (JSON, with or without its newline), as the server
/// reads it: `{"method": ...}` with the method's fields.
pub fn parse_request(line: &[u8]) -> Result<Request, serde_json::Error> {
    serde_json::from_slice::<Request>(line)
}

#[derive(Debug, Serialize, Deserialize)]
struct Response {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The socket path for `root`.
pub fn socket_path(root: &Path) -> PathBuf {
    root.join(SOCKET_NAME)
}

/// Binds the socket (replacing a stale one) with mode 0600, reachable by
/// no one else at any instant, whatever the umask.
///
/// `bind` creates the socket file with mode `0777 & !umask`, and a later
/// `chmod` leaves a window; changing the umask is process-wide (other
/// threads run). Instead the socket is bound inside a fresh directory of
/// mode 0700 (umask can only clear bits), made 0600 there, then renamed
/// into place (a rename keeps the inode the socket is bound to) and the
/// directory removed.
pub fn bind(root: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let path = socket_path(root);
    remove_if_present(&path, false)?;
    let private = root.join(format!(".{SOCKET_NAME}.{}", std::process::id()));
    remove_if_present(&private, true)?;
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let meta = std::fs::symlink_metadata(&private)?;
    if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a private directory of this user",
            private.display()
        )));
    }
    let tmp = private.join(SOCKET_NAME);
    let bound = (|| {
        let l = std::os::unix::net::UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, &path)?;
        l.set_nonblocking(true)?;
        UnixListener::from_std(l)
    })();
    let _ = std::fs::remove_file(&tmp);
    std::fs::remove_dir(&private)?;
    bound
}

/// Removes a stale file (or, with `dir`, directory tree) at `path`.
fn remove_if_present(path: &Path, dir: bool) -> std::io::Result<()> {
    let r = match std::fs::symlink_metadata(path) {
        Ok(m) if dir && m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Serves requests until `shutdown`, within `limits`.
pub async fn serve(
    listener: UnixListener,
    vm: Arc<VolumeManager>,
    limits: ClientLimits,
    shutdown: watch::Receiver<bool>,
) {
    let accept = || async {
        let (stream, _) = listener.accept().await?;
        let peer = stream
            .peer_cred()
            .map_or(Peer::Unknown, |c| Peer::Uid(c.uid()));
        Ok((stream, peer))
    };
    let busy = (BUSY_LINE.as_bytes(), |stream: &UnixStream| {
        let _ = stream.try_write(BUSY_LINE.as_bytes());
    });
    let serve = |stream, admission| {
        let (vm, limits) = (Arc::clone(&vm), limits.clone());
        async move {
            if let Err(e) = handle(stream, vm, limits, admission).await {
                tracing::debug!(error = %e, "api connection");
            }
        }
    };
    serve_bounded(&limits, "api", accept, busy, serve, shutdown).await;
}

/// One connection: request lines in, one response line out per request.
async fn handle(
    stream: UnixStream,
    vm: Arc<VolumeManager>,
    limits: ClientLimits,
    admission: Admission,
) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    loop {
        line.clear();
        let limit = u64::try_from(MAX_REQUEST_LINE).unwrap_or(u64::MAX) + 1;
        let mut limited = (&mut r).take(limit);
        let read = limited.read_until(b'\n', &mut line);
        admission.idle();
        tokio::select! {
            r = tokio::time::timeout(READ_DEADLINE, read) => match r {
                Err(_) => return Err(std::io::Error::from(std::io::ErrorKind::TimedOut)),
                Ok(r) => {
                    if r? == 0 {
                        return Ok(());
                    }
                }
            },
            () = admission.evicted() => return Ok(()),
        }
        if !admission.busy() {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            // Longer than the limit (or cut by end of file): answered, then closed.
            let resp = err(format!("request line longer than {MAX_REQUEST_LINE} bytes"));
            let _ = write_response(&mut w, &resp).await;
            return Ok(());
        }
        let req = parse_request(&line);
        // Large responses wait for a slot: a few are built at once.
        let _slot = match &req {
            Ok(Request::Status | Request::Metrics | Request::Timeline { .. }) => {
                match limits.response_slot().await {
                    Some(s) => Some(s),
                    None => return Err(std::io::Error::from(std::io::ErrorKind::TimedOut)),
                }
            }
            _ => None,
        };
        let resp = match req {
            Err(e) => err(format!("invalid request: {e}")),
            Ok(req) => match answer_unless_gone(req, &vm, &mut r).await {
                Some(resp) => resp,
                None => return Ok(()),
            },
        };
        write_response(&mut w, &resp).await?;
    }
}

/// The answer to `req`, or `None` when the client hangs up first (a wait
/// of a client that is gone no longer holds its place).
async fn answer_unless_gone(
    req: Request,
    vm: &VolumeManager,
    r: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
) -> Option<Response> {
    let answer = answer(req, vm);
    tokio::pin!(answer);
    tokio::select! {
        resp = &mut answer => Some(resp),
        // End of file or an error: gone. A next request already sent:
        // answer this one first.
        gone = r.fill_buf() => match gone {
            Ok(b) if !b.is_empty() => Some(answer.await),
            _ => None,
        },
    }
}

/// Writes one response line within [`WRITE_DEADLINE`].
async fn write_response(
    w: &mut tokio::net::unix::OwnedWriteHalf,
    resp: &Response,
) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(resp).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    out.push(b'\n');
    match tokio::time::timeout(WRITE_DEADLINE, w.write_all(&out)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut)),
    }
}

fn err(e: String) -> Response {
    Response {
        ok: false,
        result: None,
        error: Some(e),
    }
}

fn ok(v: serde_json::Value) -> Response {
    Response {
        ok: true,
        result: Some(v),
        error: None,
    }
}

async fn answer(req: Request, vm: &VolumeManager) -> Response {
    match req {
        Request::Status => match serde_json::to_value(vm.status()) {
            Ok(v) => ok(v),
            Err(e) => err(e.to_string()),
        },
        Request::Metrics => ok(serde_json::Value::String(vm.metrics_text())),
        Request::Wait { pod, timeout_ms } => wait(vm, &pod, timeout_ms, false).await,
        Request::WaitUnmount { pod, timeout_ms } => wait(vm, &pod, timeout_ms, true).await,
        Request::Timeline { pod } => match vm
            .pod_timeline(&pod)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::to_value(t).map_err(|e| e.to_string()))
        {
            Ok(v) => ok(v),
            Err(e) => err(e),
        },
        Request::WaitAll { pods, timeout_ms } => {
            let t = Duration::from_millis(timeout_ms).min(MAX_WAIT);
            match vm.wait_converged(pods, t).await {
                Ok(()) => ok(serde_json::Value::Null),
                Err(e) => err(e.to_string()),
            }
        }
    }
}

async fn wait(vm: &VolumeManager, pod: &str, timeout_ms: u64, unmount: bool) -> Response {
    let uid = match PodUid::new(pod) {
        Ok(u) => u,
        Err(e) => return err(e.to_string()),
    };
    let t = Duration::from_millis(timeout_ms).min(MAX_WAIT);
    let r = if unmount {
        vm.wait_for_unmount(&uid, t).await
    } else {
        vm.wait_for_attach_and_mount(&uid, t).await
    };
    match r {
        Ok(()) => ok(serde_json::Value::Null),
        Err(e) => err(e.to_string()),
    }
}

/// Sends one request to the agent on `root` and returns its result, or
/// [`ApiError::Timeout`] when the whole exchange takes longer than
/// `timeout` (an agent that accepts but never answers).
pub async fn call(
    root: &Path,
    req: &Request,
    timeout: Duration,
) -> Result<serde_json::Value, ApiError> {
    match tokio::time::timeout(timeout, call_once(root, req)).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::Timeout {
            path: socket_path(root),
            after: timeout,
        }),
    }
}

async fn call_once(root: &Path, req: &Request) -> Result<serde_json::Value, ApiError> {
    let path = socket_path(root);
    let io = |source| ApiError::Io {
        path: path.clone(),
        source,
    };
    let untrusted = |why| ApiError::Untrusted {
        path: path.clone(),
        why,
    };
    check_socket_file(&path).map_err(untrusted)?;
    let stream = UnixStream::connect(&path).await.map_err(io)?;
    let peer = stream.peer_cred().map_err(io)?.uid();
    if !trusted_uid(peer) {
        return Err(untrusted(format!("served by uid {peer}")));
    }
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_vec(req).map_err(|e| ApiError::Protocol(e.to_string()))?;
    line.push(b'\n');
    // An agent with too many clients answers and closes, maybe before it
    // reads: the answer is still there to read after a broken pipe.
    let sent = w.write_all(&line).await;
    let dropped = |e: &std::io::Error| {
        use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
        matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted)
    };
    let busy = |how| ApiError::Busy {
        path: path.clone(),
        how,
    };
    let closed = "closed the connection before answering (too many clients?)";
    let mut lines = BufReader::new(r).lines();
    let resp = match lines.next_line().await {
        Ok(Some(resp)) => resp,
        Err(e) if !dropped(&e) => return Err(io(e)),
        Ok(None) | Err(_) => match sent {
            Err(e) if !dropped(&e) => return Err(io(e)),
            _ => return Err(busy(closed)),
        },
    };
    let resp: Response =
        serde_json::from_str(&resp).map_err(|e| ApiError::Protocol(e.to_string()))?;
    match resp {
        Response {
            ok: true, result, ..
        } => Ok(result.unwrap_or(serde_json::Value::Null)),
        Response { error: Some(e), .. } if e == BUSY => Err(busy("has too many clients")),
        Response { error, .. } => Err(ApiError::Remote(error.unwrap_or_default())),
    }
}

/// Whether a file or process of `uid` may be trusted: root's, or the
/// caller's own.
fn trusted_uid(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Checks, before connecting, that no other user could have put the socket
/// at `path` (an agent's state directory pre-created by another user, or
/// open to them): the socket is root's or the caller's, and so is its
/// directory, which no one else may write to (unless sticky, where others
/// cannot move what is not theirs). A missing socket passes (connecting
/// then says so). The peer's credentials are checked after connecting.
fn check_socket_file(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let dir = path.parent().unwrap_or(Path::new("/"));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let d = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !trusted_uid(d.uid()) {
        return Err(format!(
            "its directory {} is owned by uid {}",
            dir.display(),
            d.uid()
        ));
    }
    let mode = d.mode() & 0o7777;
    if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(format!(
            "its directory {} is writable by others (mode {mode:o})",
            dir.display()
        ));
    }
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    if !m.file_type().is_socket() {
        return Err("not a socket".into());
    }
    if !trusted_uid(m.uid()) {
        return Err(format!("owned by uid {}", m.uid()));
    }
    Ok(())
}
