//! Observe mode's read of the node's CSINode, for the CSI registration
//! triage's last step ([`volmgr::observer::CsiNodeLookup`]): one GET of
//! `csinodes/<node>` when a triage pass asks (never a list, a watch or a
//! write). The Node authorizer lets a node read its own CSINode (the
//! kubelet does); observe mode's ClusterRole grants `get` on csinodes.
//!
//! The GET runs as a task of the agent's runtime and the triage's thread
//! waits for its answer on a channel, with the timeout on its own side:
//! no timer of the runtime is touched from outside it, so a read while
//! the runtime shuts down fails (the task is dropped unpolled, the
//! channel closes) instead of panicking.

use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::CSINode;
use kube::{Api, Client};
use tokio::runtime::Handle;
use volmgr::observer::{CsiNodeError, CsiNodeLookup};

/// Reads `node`'s CSINode with `client`, on the runtime `handle`.
pub struct CsiNodeRead {
    client: Client,
    node: String,
    handle: Handle,
}

/// Why the node's CSINode was not read.
#[derive(Debug, thiserror::Error)]
pub enum CsiNodeReadError {
    /// The API server answered with an error, or could not be reached.
    #[error("GET CSINode {node}: {source}")]
    Api {
        /// The node.
        node: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// No answer within the timeout (the GET is cancelled).
    #[error("GET CSINode {node}: no answer within {timeout:?}")]
    Timeout {
        /// The node.
        node: String,
        /// How long the read waited.
        timeout: Duration,
    },
    /// The agent's runtime is shut down or shutting down: the GET was
    /// dropped before it answered.
    #[error("GET CSINode {node}: the agent's runtime is shutting down")]
    RuntimeGone {
        /// The node.
        node: String,
    },
}

impl CsiNodeRead {
    /// A reader of `node`'s CSINode; call from within the runtime the
    /// client runs on (its handle is kept).
    pub fn new(client: Client, node: &str) -> Self {
        Self {
            client,
            node: node.to_string(),
            handle: Handle::current(),
        }
    }

    /// The driver names the node's CSINode lists (`None`: there is no
    /// CSINode), waiting at most `timeout`; never panics, even while the
    /// runtime shuts down. Call from a thread that is not the runtime's
    /// (it blocks).
    pub fn read(&self, timeout: Duration) -> Result<Option<Vec<String>>, CsiNodeReadError> {
        let api: Api<CSINode> = Api::all(self.client.clone());
        let node = self.node.clone();
        let (tx, rx) = mpsc::sync_channel(1);
        let task = self.handle.spawn(async move {
            let _ = tx.send(api.get_opt(&node).await);
        });
        let node = self.node.clone();
        match rx.recv_timeout(timeout) {
            Ok(Ok(c)) => Ok(c.map(|c| c.spec.drivers.into_iter().map(|d| d.name).collect())),
            Ok(Err(source)) => Err(CsiNodeReadError::Api { node, source }),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                task.abort();
                Err(CsiNodeReadError::Timeout { node, timeout })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(CsiNodeReadError::RuntimeGone { node })
            }
        }
    }
}

impl CsiNodeLookup for CsiNodeRead {
    fn node(&self) -> &str {
        &self.node
    }

    fn drivers(&self, timeout: Duration) -> Result<Option<Vec<String>>, CsiNodeError> {
        self.read(timeout).map_err(CsiNodeError::read)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::convert::Infallible;

    /// A client whose API server never answers.
    fn silent_client() -> Client {
        let svc = tower::service_fn(|_req: http::Request<kube::client::Body>| {
            std::future::pending::<Result<http::Response<String>, Infallible>>()
        });
        Client::new(svc, "default")
    }

    /// Before, the read ran `tokio::time::timeout` through
    /// `Handle::block_on` on the agent's runtime: once that runtime was
    /// shut down, tokio's timer panicked in the triage's thread.
    #[test]
    fn a_read_after_the_runtime_shut_down_fails_without_panicking() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let read = rt.block_on(async { CsiNodeRead::new(silent_client(), "node-a") });
        rt.shutdown_background();
        let e = read.read(Duration::from_secs(30)).unwrap_err();
        assert!(matches!(e, CsiNodeReadError::RuntimeGone { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "GET CSINode node-a: the agent's runtime is shutting down"
        );
    }

    #[test]
    fn a_read_without_answer_times_out_with_the_same_text() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let read = rt.block_on(async { CsiNodeRead::new(silent_client(), "node-a") });
        let got = read.drivers(Duration::from_millis(50)).unwrap_err();
        assert_eq!(got.to_string(), "GET CSINode node-a: no answer within 50ms");
    }

    #[test]
    fn the_drivers_of_the_csinode_are_read() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let fake = crate::testing::FakeApiServer::in_memory();
        let read = rt.block_on(async { CsiNodeRead::new(fake.client(), "node-a") });
        assert_eq!(read.read(Duration::from_secs(30)).unwrap(), None);
        fake.apply(serde_json::json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": {"name": "node-a"},
            "spec": {"drivers": [{"name": "d.example.com", "nodeID": "n1"}]}
        }));
        let got = read.read(Duration::from_secs(30)).unwrap();
        assert_eq!(got, Some(vec!["d.example.com".to_string()]));
    }
}
