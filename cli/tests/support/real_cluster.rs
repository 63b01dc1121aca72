//! A real control plane for the API end-to-end tests that need no hostile
//! server: etcd and kube-apiserver (`volmgr_kube::testing::real`, Node and
//! RBAC authorization, NodeRestriction, an audit log), the agent as the
//! node itself (`system:node:<node>`, as the kubelet's credentials), and
//! objects written as the cluster admin. The server has no controllers:
//! pods are created with `spec.nodeName`, the UIDs are the server's, a
//! pod's status is written through its `status` subresource, claims are
//! bound by [`RealApiServer::bind`]. The ServiceAccount admission plugin
//! adds a `kube-api-access-*` volume to every pod that does not mount its
//! token itself.

#![allow(dead_code)]
// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use serde_json::Value;
use volmgr_kube::testing::real::{Audited, RealApiServer};

/// The server, the node's kubeconfig, the node's name.
pub struct RealCluster {
    /// etcd and kube-apiserver.
    pub server: RealApiServer,
    /// The node's own credentials (`system:node:<node>`).
    pub kubeconfig: PathBuf,
    /// The node's name.
    pub node: String,
}

impl RealCluster {
    /// Starts the server with namespaces `namespaces` (their `default`
    /// ServiceAccount and `kube-root-ca.crt`) and Node `node`; `None` where
    /// the real binaries cannot be had outside CI.
    pub fn start(node: &str, namespaces: &[&str]) -> Option<Self> {
        let server = RealApiServer::start()?;
        for ns in namespaces {
            server.namespace(ns);
        }
        let c = Self {
            kubeconfig: server.node_kubeconfig(node),
            server,
            node: node.to_string(),
        };
        c.apply(&serde_json::json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node}}));
        Some(c)
    }

    /// Server-side apply of `obj` as the admin, without its `status` and
    /// `metadata.uid` (the server's own); a Node's or a PersistentVolume's
    /// or a claim's `status` is then written through its subresource.
    pub fn apply(&self, obj: &Value) {
        let mut spec = obj.clone();
        let status = spec.as_object_mut().unwrap().remove("status");
        if let Some(m) = spec["metadata"].as_object_mut() {
            m.remove("uid");
        }
        self.server.apply(&spec.to_string());
        if let Some(status) = status {
            let kind = obj["kind"].as_str().unwrap();
            let ns = obj["metadata"]["namespace"].as_str().unwrap_or("");
            let name = obj["metadata"]["name"].as_str().unwrap();
            self.set_status(kind, ns, name, &status);
        }
    }

    /// Creates pod `pod` (as [`Self::apply`], its status written after);
    /// its UID.
    pub fn create_pod(&self, pod: &Value) -> String {
        self.apply(pod);
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        self.uid_of("pod", ns, pod["metadata"]["name"].as_str().unwrap())
    }

    /// Merges `status` into the object's `status` subresource.
    pub fn set_status(&self, kind: &str, ns: &str, name: &str, status: &Value) {
        let patch = serde_json::json!({ "status": status }).to_string();
        let mut args = vec![
            "patch",
            kind,
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ];
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        self.server.kubectl_ok(&args, None);
    }

    /// The UID of `kind` `ns/name`.
    pub fn uid_of(&self, kind: &str, ns: &str, name: &str) -> String {
        let mut args = vec!["get", kind, name, "-o", "jsonpath={.metadata.uid}"];
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        self.server.kubectl_ok(&args, None)
    }

    /// The object `kind` `ns/name` as stored.
    pub fn get(&self, kind: &str, ns: &str, name: &str) -> Value {
        let mut args = vec!["get", kind, name, "-o", "json"];
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        serde_json::from_str(&self.server.kubectl_ok(&args, None)).unwrap()
    }

    /// Deletes `kind` `ns/name` at once (a pod: no grace period, as after
    /// its kubelet confirmed the containers gone).
    pub fn delete(&self, kind: &str, ns: &str, name: &str) {
        let mut args = vec!["delete", kind, name, "--wait=false"];
        if kind == "pod" {
            args.extend(["--grace-period=0", "--force"]);
        }
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        self.server.kubectl_ok(&args, None);
    }

    /// The events.k8s.io/v1 Events of namespace `ns`.
    pub fn events(&self, ns: &str) -> Vec<Value> {
        let out = self.server.kubectl_ok(
            &["get", "events.events.k8s.io", "-n", ns, "-o", "json"],
            None,
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// The node's user name (`system:node:<node>`).
    pub fn node_user(&self) -> String {
        format!("system:node:{}", self.node)
    }

    /// The node's requests in the audit log.
    pub fn node_requests(&self) -> Vec<Audited> {
        let user = self.node_user();
        self.server
            .audit()
            .into_iter()
            .filter(|a| a.user == user)
            .collect()
    }

    /// The audit log's lines (time, user, verb, URI, code) of requests on
    /// the objects `of` name, and of pods (when they came): how a refusal
    /// was timed.
    fn audit_lines(&self, of: &[&Audited]) -> String {
        let text = std::fs::read_to_string(self.server.dir().join("audit.log")).unwrap_or_default();
        let mut out = String::new();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let name = v["objectRef"]["name"].as_str().unwrap_or_default();
            let resource = v["objectRef"]["resource"].as_str().unwrap_or_default();
            if v["stage"] != "ResponseComplete"
                || !(resource == "pods" || of.iter().any(|a| a.name == name))
            {
                continue;
            }
            out.push_str(&format!(
                "{} {} {} {} {}\n",
                v["stageTimestamp"].as_str().unwrap_or_default(),
                v["user"]["username"].as_str().unwrap_or_default(),
                v["verb"].as_str().unwrap_or_default(),
                v["requestURI"].as_str().unwrap_or_default(),
                v["responseStatus"]["code"]
            ));
        }
        out
    }

    /// The server refused the node nothing (no 403 in the audit log), and
    /// the node never listed or watched a kind the Node authorizer only
    /// lets it get, nor a Secret or ConfigMap but by name.
    pub fn assert_node_refused_nothing(&self) {
        let reqs = self.node_requests();
        assert!(!reqs.is_empty(), "the node made no request");
        let refused: Vec<&Audited> = reqs.iter().filter(|a| a.code == 403).collect();
        assert!(
            refused.is_empty(),
            "refused: {refused:#?}\n--- the audit log of what was refused\n{}",
            self.audit_lines(&refused)
        );
        for a in &reqs {
            if matches!(a.verb.as_str(), "list" | "watch")
                && matches!(a.resource.as_str(), "secrets" | "configmaps")
            {
                assert!(a.uri.contains("metadata.name"), "{a:?}");
            }
        }
    }
}
