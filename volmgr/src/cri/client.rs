//! A client of a CRI runtime on its Unix socket (the kubelet's
//! `--container-runtime-endpoint`).

use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use super::proto::runtime_service_client::RuntimeServiceClient;
use super::proto::{ContainerState, ListContainersRequest, ListPodSandboxRequest, PodSandboxState};

/// How long one call to the runtime may take: the runtime answers list
/// calls from memory; a runtime that takes longer is reported as not
/// answering (and asked again later).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest answer read from the runtime (tonic's default; a node's
/// containers fit many times over).
const MAX_ANSWER: usize = 4 << 20;

/// Where the runtime listens: `unix:///run/containerd/containerd.sock` or a
/// plain absolute path, as the kubelet's flag takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeEndpoint {
    socket: PathBuf,
}

impl RuntimeEndpoint {
    /// containerd's socket, the kubelet's default since 1.27.
    pub const DEFAULT: &'static str = "unix:///run/containerd/containerd.sock";

    /// Parses `unix:///path` or `/path`.
    pub fn parse(s: &str) -> Result<Self, CriError> {
        let path = s.strip_prefix("unix://").unwrap_or(s);
        if !path.starts_with('/') || path.contains('\0') {
            return Err(CriError::Endpoint(s.to_string()));
        }
        Ok(Self {
            socket: PathBuf::from(path),
        })
    }

    /// The socket's path.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }
}

impl std::fmt::Display for RuntimeEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.socket.display())
    }
}

/// Why the runtime could not say.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// Not `unix:///path` nor an absolute path.
    #[error("container runtime endpoint {0:?}: expected unix:///PATH or an absolute path")]
    Endpoint(String),
    /// The call failed (the runtime is not listening, refused, or failed).
    #[error("container runtime {endpoint}: {call}: {status}")]
    Call {
        /// The runtime's endpoint.
        endpoint: String,
        /// The CRI call.
        call: &'static str,
        /// What gRPC said (the connection error, the runtime's status).
        status: tonic::Status,
    },
}

/// A CRI `RuntimeService` client on a Unix socket, connecting lazily (a
/// runtime that restarts is simply dialled again).
#[derive(Debug, Clone)]
pub struct RuntimeClient {
    endpoint: RuntimeEndpoint,
    client: RuntimeServiceClient<Channel>,
}

impl RuntimeClient {
    /// A client of the runtime at `endpoint` (nothing is dialled yet).
    /// Called within a Tokio runtime (the channel's task is spawned there).
    pub fn new(endpoint: RuntimeEndpoint) -> Self {
        let channel = dial(endpoint.socket.clone());
        let client = RuntimeServiceClient::new(channel)
            .max_decoding_message_size(MAX_ANSWER)
            .max_encoding_message_size(MAX_ANSWER);
        Self { endpoint, client }
    }

    /// The runtime's endpoint.
    pub fn endpoint(&self) -> &RuntimeEndpoint {
        &self.endpoint
    }

    /// The generated client, for the calls volmgr does not wrap (tests
    /// create and stop containers with it).
    pub fn raw(&self) -> RuntimeServiceClient<Channel> {
        self.client.clone()
    }

    /// What still runs of the pod with UID `uid`: its containers not yet
    /// exited and its sandboxes still ready.
    pub async fn pod_runtime(&self, uid: &str) -> Result<super::PodRuntimeState, CriError> {
        let labels = pod_label(uid);
        let mut client = self.client.clone();
        let containers = client
            .list_containers(request(ListContainersRequest {
                filter: Some(super::proto::ContainerFilter {
                    label_selector: labels.clone(),
                    ..Default::default()
                }),
            }))
            .await
            .map_err(|status| self.failed("ListContainers", status))?
            .into_inner()
            .containers;
        let sandboxes = client
            .list_pod_sandbox(request(ListPodSandboxRequest {
                filter: Some(super::proto::PodSandboxFilter {
                    label_selector: labels,
                    ..Default::default()
                }),
            }))
            .await
            .map_err(|status| self.failed("ListPodSandbox", status))?
            .into_inner()
            .items;
        // The label filter again: a runtime that ignores it lists every pod.
        let ours = |l: &std::collections::HashMap<String, String>| {
            l.get(POD_UID_LABEL).map(String::as_str) == Some(uid)
        };
        Ok(super::PodRuntimeState {
            containers: containers
                .iter()
                .filter(|c| ours(&c.labels) && c.state != ContainerState::ContainerExited as i32)
                .count(),
            sandboxes: sandboxes
                .iter()
                .filter(|s| ours(&s.labels) && s.state == PodSandboxState::SandboxReady as i32)
                .count(),
        })
    }

    fn failed(&self, call: &'static str, status: tonic::Status) -> CriError {
        CriError::Call {
            endpoint: self.endpoint.to_string(),
            call,
            status,
        }
    }
}

/// The label the kubelet puts on every sandbox and container it creates.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

fn pod_label(uid: &str) -> std::collections::HashMap<String, String> {
    std::collections::HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())])
}

/// A request with the call's deadline in `grpc-timeout`.
fn request<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(CALL_TIMEOUT);
    r
}

/// A lazily connecting channel to the Unix socket `path` (the URI is a
/// placeholder tonic requires; the connector ignores it).
fn dial(path: PathBuf) -> Channel {
    Endpoint::from_static("http://[::1]:50051")
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_as_the_kubelet_takes_them() {
        let e = RuntimeEndpoint::parse(RuntimeEndpoint::DEFAULT).unwrap();
        assert_eq!(
            e.socket(),
            std::path::Path::new("/run/containerd/containerd.sock")
        );
        assert_eq!(e.to_string(), RuntimeEndpoint::DEFAULT);
        assert_eq!(
            RuntimeEndpoint::parse("/run/crio/crio.sock")
                .unwrap()
                .socket(),
            std::path::Path::new("/run/crio/crio.sock")
        );
        for bad in ["", "tcp://1.2.3.4:5", "unix://relative", "run/x.sock"] {
            assert!(RuntimeEndpoint::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_runtime_not_listening_is_an_error_not_an_answer() {
        let dir = tempfile::tempdir().unwrap();
        let e = RuntimeEndpoint::parse(dir.path().join("none.sock").to_str().unwrap()).unwrap();
        let err = RuntimeClient::new(e).pod_runtime("u1").await.unwrap_err();
        assert!(err.to_string().contains("ListContainers"), "{err}");
    }
}
