//! The VolumeAttachments of the node's volumes and the Node's
//! `status.volumesAttached`, for the attach side of observe mode's finding
//! (l), `kubelet_disagrees` ([`volmgr::observer::AttachmentLog`]).
//!
//! Only what the scan asks for is read ([`Attachments::want`]: the
//! VolumeAttachments of volumes the kubelet recently said are unattached,
//! at most [`MAX_WANTED`]), each by one `get` of its name (never a list:
//! VolumeAttachments cannot be selected by node), and, while any is
//! wanted, the node's own Node by one `get` (its `status.volumesAttached`,
//! at most [`MAX_LISTED`] names kept). A new name is read soon after it is
//! asked for, all of them again every [`PERIOD`]; each request within
//! [`TIMEOUT`], one at a time, in a task of its own: a scan never waits
//! for the API server. A failed read keeps what was read before; failures
//! are logged once until a read works again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::{Api, Client};
use tokio::sync::{watch, Notify};
use volmgr::observer::{AttachmentLog, AttachmentSeen, NodeAttached};
use volmgr::util::sync::MutexExt;

/// VolumeAttachments read, at most.
pub const MAX_WANTED: usize = 64;

/// Names of the Node's `status.volumesAttached` kept, at most.
pub const MAX_LISTED: usize = 512;

/// How often what is wanted is read again.
pub const PERIOD: Duration = Duration::from_secs(10);

/// Time one read may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Why a VolumeAttachment or the Node could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AttachmentsError {
    /// The API server did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The API server answered with an error.
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// What the scan and the reading task share.
#[derive(Debug, Default)]
struct Shared {
    /// The VolumeAttachments asked for last.
    wanted: BTreeSet<String>,
    /// What was read of them (absent ones are not kept).
    read: BTreeMap<String, AttachmentSeen>,
    /// Those of them read and found absent.
    absent: BTreeSet<String>,
    /// Asked for and not read yet.
    unread: BTreeSet<String>,
    /// The Node as last read.
    node: Option<NodeAttached>,
    /// A read failed and nothing was read since (logged once).
    failing: bool,
}

/// The VolumeAttachments and the Node, read in the background (see the
/// module).
pub struct Attachments {
    node: String,
    shared: Arc<Mutex<Shared>>,
    wake: Arc<Notify>,
}

impl Attachments {
    /// Starts the reading task for node `node` on `client`; it ends with
    /// `stop`.
    pub fn start(client: Client, node: &str, stop: watch::Receiver<bool>) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let wake = Arc::new(Notify::new());
        let reader = Reader {
            client,
            node: node.to_string(),
            shared: Arc::clone(&shared),
        };
        tokio::spawn(reader.run(Arc::clone(&wake), stop));
        Self {
            node: node.to_string(),
            shared,
            wake,
        }
    }
}

impl AttachmentLog for Attachments {
    fn node(&self) -> String {
        self.node.clone()
    }

    fn want(&self, names: Vec<String>) {
        let names: BTreeSet<String> = names.into_iter().take(MAX_WANTED).collect();
        let mut s = self.shared.locked();
        if s.wanted == names {
            return;
        }
        s.read.retain(|n, _| names.contains(n));
        s.absent.retain(|n| names.contains(n));
        s.unread = names
            .iter()
            .filter(|n| !s.read.contains_key(*n))
            .cloned()
            .collect();
        if names.is_empty() {
            s.node = None;
        }
        s.wanted = names;
        drop(s);
        self.wake.notify_one();
    }

    fn attachment(&self, name: &str) -> Option<AttachmentSeen> {
        self.shared.locked().read.get(name).cloned()
    }

    fn absent(&self, name: &str) -> bool {
        self.shared.locked().absent.contains(name)
    }

    fn node_attached(&self) -> Option<NodeAttached> {
        self.shared.locked().node.clone()
    }
}

/// The reading task.
struct Reader {
    client: Client,
    node: String,
    shared: Arc<Mutex<Shared>>,
}

impl Reader {
    /// Reads the new names when asked, all every [`PERIOD`]; ends with
    /// `stop`.
    async fn run(self, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
        loop {
            let all = tokio::select! {
                () = volmgr::util::shutdown::requested(&mut stop) => return,
                () = wake.notified() => false,
                () = tokio::time::sleep(PERIOD) => true,
            };
            self.round(all).await;
        }
    }

    /// Reads the VolumeAttachments wanted (`all`) or the unread ones, then
    /// the Node, when any is wanted.
    async fn round(&self, all: bool) {
        let names: Vec<String> = {
            let mut s = self.shared.locked();
            let unread = std::mem::take(&mut s.unread);
            if all { s.wanted.clone() } else { unread }
                .into_iter()
                .collect()
        };
        if names.is_empty() {
            return;
        }
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        for name in names {
            let read = timed(api.get_opt(&name)).await;
            let now = SystemTime::now();
            let mut s = self.shared.locked();
            match read {
                Ok(va) if s.wanted.contains(&name) => {
                    let before = s.read.remove(&name);
                    match va.map(|va| seen(&va, before.as_ref(), now)) {
                        Some(seen) => {
                            s.absent.remove(&name);
                            s.read.insert(name, seen);
                        }
                        None => {
                            s.absent.insert(name);
                        }
                    }
                    s.works();
                }
                Ok(_) => s.works(),
                Err(e) => s.fails(&format!("GET VolumeAttachment {name}"), &e),
            }
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let read = timed(nodes.get_opt(&self.node)).await;
        let now = SystemTime::now();
        let mut s = self.shared.locked();
        match read {
            Ok(node) => {
                let before = s.node.take();
                s.node = Some(node_attached(node.as_ref(), before.as_ref(), now));
                s.works();
            }
            Err(e) => s.fails(&format!("GET Node {}", self.node), &e),
        }
    }
}

impl Shared {
    /// A read worked.
    fn works(&mut self) {
        if std::mem::take(&mut self.failing) {
            tracing::info!("reading VolumeAttachments and the Node works again");
        }
    }

    /// A read failed: logged once until one works.
    fn fails(&mut self, what: &str, e: &AttachmentsError) {
        if !std::mem::replace(&mut self.failing, true) {
            tracing::warn!(read = %what, error = %e,
                "reading a VolumeAttachment or the Node failed (kubelet_disagrees keeps what was read before; logged once)");
        }
    }
}

/// `fut` within [`TIMEOUT`].
async fn timed<T>(
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, AttachmentsError> {
    match tokio::time::timeout(TIMEOUT, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(AttachmentsError::Timeout(TIMEOUT)),
    }
}

/// `va` as kept, since when attached carried over from `before`.
pub fn seen(
    va: &VolumeAttachment,
    before: Option<&AttachmentSeen>,
    now: SystemTime,
) -> AttachmentSeen {
    let status = va.status.as_ref();
    let attached = status.is_some_and(|s| s.attached);
    let message = |e: Option<&k8s_openapi::api::storage::v1::VolumeError>| {
        e.map(|e| cut(e.message.as_deref().unwrap_or("no message")))
    };
    let attached_since = attached.then(|| {
        before
            .and_then(|b| b.attached_since.filter(|_| b.attached))
            .unwrap_or(now)
    });
    AttachmentSeen {
        name: va.metadata.name.clone().unwrap_or_default(),
        node_name: va.spec.node_name.clone(),
        attached,
        attach_error: message(status.and_then(|s| s.attach_error.as_ref())),
        detach_error: message(status.and_then(|s| s.detach_error.as_ref())),
        attached_since,
    }
}

/// The Node's `status.volumesAttached` (none when there is no Node), each
/// name's since carried over from `before`.
pub fn node_attached(
    node: Option<&Node>,
    before: Option<&NodeAttached>,
    now: SystemTime,
) -> NodeAttached {
    let listed = node
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.volumes_attached.as_ref())
        .into_iter()
        .flatten()
        .take(MAX_LISTED)
        .map(|v| {
            let since = before
                .and_then(|b| b.listed.iter().find(|(n, _)| *n == v.name))
                .map_or(now, |(_, t)| *t);
            (cut(&v.name), since)
        })
        .collect();
    NodeAttached {
        listed,
        read_at: now,
    }
}

/// `s` cut to at most [`volmgr::observer::ATTACH_MAX_ERROR`] bytes.
fn cut(s: &str) -> String {
    volmgr::util::escape::shortened(s, volmgr::observer::ATTACH_MAX_ERROR)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn va(status: serde_json::Value) -> VolumeAttachment {
        serde_json::from_value(json!({"metadata": {"name": "csi-1"},
            "spec": {"attacher": "d", "nodeName": "n1", "source": {"persistentVolumeName": "pv"}},
            "status": status}))
        .unwrap()
    }

    /// Since when attached is kept across reads and reset by a detach; the
    /// errors' messages are bounded.
    #[test]
    fn attached_since_is_carried_over() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let t1 = t0 + Duration::from_secs(10);
        let a = seen(&va(json!({"attached": true})), None, t0);
        assert_eq!((a.attached, a.attached_since), (true, Some(t0)));
        let b = seen(&va(json!({"attached": true})), Some(&a), t1);
        assert_eq!(b.attached_since, Some(t0));
        let long = "e".repeat(5000);
        let c = seen(
            &va(json!({"attached": false, "attachError": {"message": long}})),
            Some(&b),
            t1,
        );
        assert_eq!(c.attached_since, None);
        assert!(c.attach_error.unwrap().len() < 1100);
        assert_eq!(c.node_name, "n1");
    }

    /// A round reads each wanted VolumeAttachment by name, then the Node;
    /// one that does not exist is said absent. When the API server then
    /// answers 503, what was read before is kept, and the failure is
    /// logged once until a read works again.
    #[tokio::test]
    async fn a_round_reads_what_is_wanted_and_a_503_keeps_it() {
        use crate::testing::FakeApiServer;
        let fake = FakeApiServer::in_memory();
        fake.apply(
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": "csi-1"},
            "spec": {"attacher": "d", "nodeName": "n1", "source": {"persistentVolumeName": "pv"}},
            "status": {"attached": true}}),
        );
        fake.apply(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
            "status": {"volumesAttached": [{"name": "kubernetes.io/csi/d^h", "devicePath": ""}]}}),
        );
        let shared = Arc::new(Mutex::new(Shared::default()));
        let reader = Reader {
            client: fake.client(),
            node: "n1".into(),
            shared: Arc::clone(&shared),
        };
        let log = Attachments {
            node: "n1".into(),
            shared,
            wake: Arc::new(Notify::new()),
        };
        log.want(vec!["csi-1".into(), "csi-gone".into()]);
        reader.round(false).await;
        assert!(log.attachment("csi-1").unwrap().attached);
        assert!(log.absent("csi-gone"));
        let listed = log.node_attached().unwrap().listed;
        assert_eq!(listed[0].0, "kubernetes.io/csi/d^h");
        let paths: Vec<String> = fake.take_requests().into_iter().map(|r| r.path).collect();
        assert_eq!(
            paths,
            [
                "/apis/storage.k8s.io/v1/volumeattachments/csi-1",
                "/apis/storage.k8s.io/v1/volumeattachments/csi-gone",
                "/api/v1/nodes/n1",
            ]
        );

        fake.set_unavailable(true);
        reader.round(true).await;
        assert!(reader.shared.locked().failing);
        assert!(log.attachment("csi-1").unwrap().attached, "kept");
        assert!(log.absent("csi-gone"), "kept");
        assert_eq!(log.node_attached().unwrap().listed.len(), 1, "kept");
        fake.set_unavailable(false);
        reader.round(true).await;
        assert!(!reader.shared.locked().failing);
    }

    #[test]
    fn node_listing_since_is_carried_over() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let t1 = t0 + Duration::from_secs(10);
        let node = |names: &[&str]| -> Node {
            let list: Vec<_> = names
                .iter()
                .map(|n| json!({"name": n, "devicePath": ""}))
                .collect();
            serde_json::from_value(
                json!({"metadata": {"name": "n1"}, "status": {"volumesAttached": list}}),
            )
            .unwrap()
        };
        let a = node_attached(Some(&node(&["x"])), None, t0);
        let b = node_attached(Some(&node(&["x", "y"])), Some(&a), t1);
        assert_eq!(b.listed, [("x".to_string(), t0), ("y".to_string(), t1)]);
        assert!(node_attached(None, Some(&b), t1).listed.is_empty());
    }
}
