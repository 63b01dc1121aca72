//! Observe mode's read of the node's CSINode, for the CSI registration
//! triage's last step ([`volmgr::observer::CsiNodeLookup`]): one GET of
//! `csinodes/<node>` when a triage pass asks (never a list, a watch or a
//! write). The Node authorizer lets a node read its own CSINode (the
//! kubelet does); observe mode's ClusterRole grants `get` on csinodes.

use std::time::Duration;

use k8s_openapi::api::storage::v1::CSINode;
use kube::{Api, Client};
use tokio::runtime::Handle;
use volmgr::observer::CsiNodeLookup;

/// Reads `node`'s CSINode with `client`, on the runtime `handle`.
pub struct CsiNodeRead {
    client: Client,
    node: String,
    handle: Handle,
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
}

impl CsiNodeLookup for CsiNodeRead {
    fn node(&self) -> &str {
        &self.node
    }

    fn drivers(&self, timeout: Duration) -> Result<Option<Vec<String>>, String> {
        let api: Api<CSINode> = Api::all(self.client.clone());
        let node = self.node.clone();
        let got = self
            .handle
            .block_on(async move { tokio::time::timeout(timeout, api.get_opt(&node)).await });
        match got {
            Ok(Ok(c)) => Ok(c.map(|c| c.spec.drivers.into_iter().map(|d| d.name).collect())),
            Ok(Err(e)) => Err(format!("GET CSINode {}: {e}", self.node)),
            Err(_) => Err(format!(
                "GET CSINode {}: no answer within {timeout:?}",
                self.node
            )),
        }
    }
}
