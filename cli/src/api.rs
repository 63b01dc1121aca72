//! The agent's local API: newline-delimited JSON over a Unix socket at
//! `ROOT/volmgr.sock` (mode 0600), used by `volmgr status` and `volmgr wait`.
//!
//! Requests: `{"method":"status"}`, `{"method":"metrics"}`,
//! `{"method":"wait","pod":UID,"timeout_ms":N}`,
//! `{"method":"wait_unmount","pod":UID,"timeout_ms":N}`,
//! `{"method":"wait_all","pods":N|null,"timeout_ms":N}`.
//! Responses: `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use volmgr::volume::PodUid;
use volmgr::volumemanager::VolumeManager;

/// The socket's file name under ROOT.
pub const SOCKET_NAME: &str = "volmgr.sock";

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

/// Binds the socket (replacing a stale one) with mode 0600.
pub fn bind(root: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let path = socket_path(root);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let l = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Serves requests until `shutdown`.
pub async fn serve(
    listener: UnixListener,
    vm: Arc<VolumeManager>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = volmgr::util::shutdown::requested(&mut shutdown) => return,
            conn = listener.accept() => match conn {
                Ok((stream, _)) => {
                    let vm = Arc::clone(&vm);
                    tokio::spawn(async move {
                        if let Err(e) = handle(stream, vm).await {
                            tracing::debug!(error = %e, "api connection");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "api accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

async fn handle(stream: UnixStream, vm: Arc<VolumeManager>) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r.take(1 << 20)).lines();
    while let Some(line) = lines.next_line().await? {
        let resp = match serde_json::from_str::<Request>(&line) {
            Err(e) => err(format!("invalid request: {e}")),
            Ok(req) => answer(req, &vm).await,
        };
        let mut out = serde_json::to_vec(&resp).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
        out.push(b'\n');
        w.write_all(&out).await?;
    }
    Ok(())
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

/// Sends one request to the agent on `root` and returns its result.
pub async fn call(root: &Path, req: &Request) -> Result<serde_json::Value, ApiError> {
    let path = socket_path(root);
    let io = |source| ApiError::Io {
        path: path.clone(),
        source,
    };
    let stream = UnixStream::connect(&path).await.map_err(io)?;
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_vec(req).map_err(|e| ApiError::Protocol(e.to_string()))?;
    line.push(b'\n');
    w.write_all(&line).await.map_err(io)?;
    let mut lines = BufReader::new(r).lines();
    let resp = lines
        .next_line()
        .await
        .map_err(io)?
        .ok_or_else(|| ApiError::Protocol("connection closed".into()))?;
    let resp: Response =
        serde_json::from_str(&resp).map_err(|e| ApiError::Protocol(e.to_string()))?;
    if resp.ok {
        Ok(resp.result.unwrap_or(serde_json::Value::Null))
    } else {
        Err(ApiError::Remote(resp.error.unwrap_or_default()))
    }
}
