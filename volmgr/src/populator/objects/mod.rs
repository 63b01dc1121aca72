//! The non-pod objects a source knows (PersistentVolumeClaims,
//! PersistentVolumes, Secrets, ConfigMaps, CSIDrivers, VolumeAttachments,
//! ServiceAccounts, ClusterTrustBundles, this Node), served to pod resolution through
//! [`ObjectLookup`], and the bookkeeping of which pod read which object so a
//! change re-resolves exactly the pods that depend on it.

pub mod lookup;
pub mod resolver;

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

use crate::populator::objects::lookup::ObjectLookup;
use crate::volume::PodUid;

/// The kinds of objects pods' volumes refer to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// `v1.PersistentVolume` (cluster-scoped).
    PersistentVolume,
    /// `v1.PersistentVolumeClaim`.
    PersistentVolumeClaim,
    /// `v1.Secret`.
    Secret,
    /// `v1.ConfigMap`.
    ConfigMap,
    /// `storage.k8s.io/v1.CSIDriver` (cluster-scoped).
    CsiDriver,
    /// `storage.k8s.io/v1.VolumeAttachment` (cluster-scoped).
    VolumeAttachment,
    /// `v1.Node` (cluster-scoped): this node, for local PVs' node affinity.
    Node,
    /// `v1.ServiceAccount`: the account a pod's tokens are requested for
    /// (its UID: a replaced account gets fresh tokens at once).
    ServiceAccount,
    /// `certificates.k8s.io.ClusterTrustBundle` (cluster-scoped; `v1`,
    /// `v1beta1` and `v1alpha1` read alike): projected trust anchors.
    ClusterTrustBundle,
}

impl ObjectKind {
    /// Whether objects of the kind live outside namespaces.
    pub fn cluster_scoped(self) -> bool {
        matches!(
            self,
            Self::PersistentVolume
                | Self::CsiDriver
                | Self::VolumeAttachment
                | Self::Node
                | Self::ClusterTrustBundle
        )
    }

    /// Whether a source follows the kind whole (one list and watch of
    /// every object of it) rather than object by object: ClusterTrustBundles,
    /// public objects a node may list, selected by signer and labels.
    pub fn followed_whole(self) -> bool {
        self == Self::ClusterTrustBundle
    }

    /// The kind's name, as in an object's `kind` field.
    pub fn name(self) -> &'static str {
        match self {
            Self::PersistentVolume => "PersistentVolume",
            Self::PersistentVolumeClaim => "PersistentVolumeClaim",
            Self::Secret => "Secret",
            Self::ConfigMap => "ConfigMap",
            Self::CsiDriver => "CSIDriver",
            Self::VolumeAttachment => "VolumeAttachment",
            Self::Node => "Node",
            Self::ServiceAccount => "ServiceAccount",
            Self::ClusterTrustBundle => "ClusterTrustBundle",
        }
    }
}

/// Names one object (or, for [`ObjectRef::any_persistent_volume`], every PV).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    /// The kind.
    pub kind: ObjectKind,
    /// The namespace (empty for cluster-scoped kinds).
    pub namespace: String,
    /// The name (empty: any object of the kind).
    pub name: String,
}

impl ObjectRef {
    /// A namespaced object.
    pub fn new(kind: ObjectKind, namespace: &str, name: &str) -> Self {
        let namespace = if kind.cluster_scoped() {
            String::new()
        } else {
            namespace.to_string()
        };
        Self {
            kind,
            namespace,
            name: name.to_string(),
        }
    }

    /// Any PersistentVolume: what a claim without `spec.volumeName` depends
    /// on (the PV whose claimRef names it may appear anywhere).
    pub fn any_persistent_volume() -> Self {
        Self::any(ObjectKind::PersistentVolume)
    }

    /// Any object of `kind` (a change to one reaches the pods that read
    /// this): what a selection by other means than the name reads, e.g.
    /// ClusterTrustBundles by signer and labels.
    pub fn any(kind: ObjectKind) -> Self {
        Self::new(kind, "", "")
    }

    /// Whether this names every object of its kind.
    pub fn is_any(&self) -> bool {
        self.name.is_empty()
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.kind.name();
        if self.namespace.is_empty() {
            write!(f, "{kind} {}", self.name)
        } else {
            write!(f, "{kind} {}/{}", self.namespace, self.name)
        }
    }
}

impl ObjectKind {
    /// The kind named `kind` (as in an object's `kind` field), if followed.
    pub fn from_name(kind: &str) -> Option<Self> {
        match kind {
            "PersistentVolume" => Some(Self::PersistentVolume),
            "PersistentVolumeClaim" => Some(Self::PersistentVolumeClaim),
            "Secret" => Some(Self::Secret),
            "ConfigMap" => Some(Self::ConfigMap),
            "CSIDriver" => Some(Self::CsiDriver),
            "VolumeAttachment" => Some(Self::VolumeAttachment),
            "Node" => Some(Self::Node),
            "ServiceAccount" => Some(Self::ServiceAccount),
            "ClusterTrustBundle" => Some(Self::ClusterTrustBundle),
            _ => None,
        }
    }
}

/// Why a JSON document is not an object pods' volumes can refer to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectDecodeError {
    /// A kind that is not followed (or no `kind`).
    #[error(
        "kind {0:?} is not followed (PersistentVolume, PersistentVolumeClaim, Secret, ConfigMap, CSIDriver, VolumeAttachment, Node, ServiceAccount and ClusterTrustBundle are)"
    )]
    UnsupportedKind(String),
    /// Not a valid object of its kind. For a Secret, the message never
    /// quotes the document (it could quote a value).
    #[error("not a valid v1.{kind}: {message}")]
    Invalid {
        /// The kind.
        kind: String,
        /// Why.
        message: String,
    },
    /// `metadata.name` is missing or empty.
    #[error("{0}: metadata.name is required")]
    NoName(String),
}

/// One object read from a source. `Debug` never prints Secret data.
#[derive(Clone, PartialEq)]
pub enum KubeObject {
    /// A PersistentVolume.
    PersistentVolume(Arc<PersistentVolume>),
    /// A PersistentVolumeClaim.
    PersistentVolumeClaim(Arc<PersistentVolumeClaim>),
    /// A Secret.
    Secret(Arc<Secret>),
    /// A ConfigMap.
    ConfigMap(Arc<ConfigMap>),
    /// A CSIDriver.
    CsiDriver(Arc<CSIDriver>),
    /// A VolumeAttachment.
    VolumeAttachment(Arc<VolumeAttachment>),
    /// A Node.
    Node(Arc<Node>),
    /// A ServiceAccount.
    ServiceAccount(Arc<ServiceAccount>),
    /// A ClusterTrustBundle.
    ClusterTrustBundle(Arc<ClusterTrustBundle>),
}

impl fmt::Debug for KubeObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KubeObject({})", self.reference())
    }
}

impl KubeObject {
    /// Decodes a JSON document by its `kind`.
    pub fn from_json(v: serde_json::Value) -> Result<Self, ObjectDecodeError> {
        let kind = v
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or("")
            .to_string();
        let invalid = |message: String| ObjectDecodeError::Invalid {
            kind: kind.clone(),
            message,
        };
        let obj = match ObjectKind::from_name(&kind) {
            Some(ObjectKind::PersistentVolume) => Self::PersistentVolume(Arc::new(
                serde_json::from_value(v).map_err(|e| invalid(e.to_string()))?,
            )),
            Some(ObjectKind::PersistentVolumeClaim) => Self::PersistentVolumeClaim(Arc::new(
                serde_json::from_value(v).map_err(|e| invalid(e.to_string()))?,
            )),
            Some(ObjectKind::Secret) => {
                Self::Secret(Arc::new(serde_json::from_value(v).map_err(|e| {
                    invalid(format!(
                        "details withheld, they could quote a secret value (line {}, column {})",
                        e.line(),
                        e.column()
                    ))
                })?))
            }
            Some(ObjectKind::ConfigMap) => Self::ConfigMap(Arc::new(
                serde_json::from_value(v).map_err(|e| invalid(e.to_string()))?,
            )),
            Some(ObjectKind::CsiDriver) => Self::CsiDriver(Arc::new(
                serde_json::from_value(v).map_err(|e| invalid(e.to_string()))?,
            )),
            Some(ObjectKind::VolumeAttachment) => Self::VolumeAttachment(Arc::new(
                serde_json::from_value(v).map_err(|e| invalid(e.to_string()))?,
            )),
            Some(ObjectKind::Node) => Self::Node(Arc::new(
                serde_json::from_value(v).map_err(|e| invalid(e.to_string()))?,
            )),
            Some(ObjectKind::ServiceAccount) => Self::ServiceAccount(Arc::new(
                serde_json::from_value(v).map_err(|e| invalid(e.to_string()))?,
            )),
            Some(ObjectKind::ClusterTrustBundle) => Self::ClusterTrustBundle(Arc::new(
                serde_json::from_value(as_v1_trust_bundle(v))
                    .map_err(|e| invalid(e.to_string()))?,
            )),
            None => return Err(ObjectDecodeError::UnsupportedKind(kind)),
        };
        let r = obj.reference();
        if r.name.is_empty() {
            return Err(ObjectDecodeError::NoName(kind));
        }
        Ok(obj)
    }

    /// The reference naming this object (namespace defaulted to `default`).
    pub fn reference(&self) -> ObjectRef {
        let (kind, meta) = match self {
            Self::PersistentVolume(o) => (ObjectKind::PersistentVolume, &o.metadata),
            Self::PersistentVolumeClaim(o) => (ObjectKind::PersistentVolumeClaim, &o.metadata),
            Self::Secret(o) => (ObjectKind::Secret, &o.metadata),
            Self::ConfigMap(o) => (ObjectKind::ConfigMap, &o.metadata),
            Self::CsiDriver(o) => (ObjectKind::CsiDriver, &o.metadata),
            Self::VolumeAttachment(o) => (ObjectKind::VolumeAttachment, &o.metadata),
            Self::Node(o) => (ObjectKind::Node, &o.metadata),
            Self::ServiceAccount(o) => (ObjectKind::ServiceAccount, &o.metadata),
            Self::ClusterTrustBundle(o) => (ObjectKind::ClusterTrustBundle, &o.metadata),
        };
        let ns = meta
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or("default");
        ObjectRef::new(kind, ns, meta.name.as_deref().unwrap_or(""))
    }
}

/// A ClusterTrustBundle of `certificates.k8s.io/v1beta1` or `v1alpha1`
/// read as `v1`: the three have the same fields (clusters before 1.37 serve
/// only the beta or alpha version).
pub fn as_v1_trust_bundle(mut v: serde_json::Value) -> serde_json::Value {
    const OLDER: [&str; 2] = [
        "certificates.k8s.io/v1beta1",
        "certificates.k8s.io/v1alpha1",
    ];
    if let Some(o) = v.as_object_mut() {
        if o.get("apiVersion")
            .and_then(|a| a.as_str())
            .is_some_and(|a| OLDER.contains(&a))
        {
            o.insert("apiVersion".into(), "certificates.k8s.io/v1".into());
        }
    }
    v
}

/// What pods' volumes read of a Node: its name and labels (local PVs'
/// node affinity) and `status.allocatable` (downwardAPI limits,
/// memory-backed emptyDir sizes). Its heartbeats, conditions, images and
/// `volumesInUse` are left out, so updates of those convert no pod again.
fn node_read(n: &Node) -> Node {
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    Node {
        metadata: ObjectMeta {
            name: n.metadata.name.clone(),
            labels: n.metadata.labels.clone(),
            ..Default::default()
        },
        spec: None,
        status: n.status.as_ref().map(|s| NodeStatus {
            allocatable: s.allocatable.clone(),
            ..Default::default()
        }),
    }
}

/// The objects of a source, by reference.
#[derive(Debug, Default)]
pub struct ObjectStore {
    objects: HashMap<ObjectRef, KubeObject>,
    /// This node's name, when the source follows its Node object.
    node_name: Option<String>,
}

impl ObjectStore {
    /// Inserts or replaces an object. Returns whether anything changed.
    /// Of a Node only what pods' volumes read is kept (see [`node_read`]),
    /// so its frequent status updates change nothing here.
    pub fn insert(&mut self, obj: KubeObject) -> bool {
        let obj = match obj {
            KubeObject::Node(n) => KubeObject::Node(Arc::new(node_read(&n))),
            o => o,
        };
        let r = obj.reference();
        if self.objects.get(&r) == Some(&obj) {
            return false;
        }
        self.objects.insert(r, obj);
        true
    }

    /// Removes an object (for a reference to any object of a kind, every
    /// object of the kind). Returns whether something was there.
    pub fn remove(&mut self, r: &ObjectRef) -> bool {
        if r.is_any() {
            let before = self.objects.len();
            self.objects.retain(|k, _| k.kind != r.kind);
            return self.objects.len() != before;
        }
        self.objects.remove(r).is_some()
    }

    /// The references of every known object of `kind`.
    pub fn references_of(&self, kind: ObjectKind) -> Vec<ObjectRef> {
        self.objects
            .keys()
            .filter(|r| r.kind == kind)
            .cloned()
            .collect()
    }

    /// Whether the object is known.
    pub fn contains(&self, r: &ObjectRef) -> bool {
        self.objects.contains_key(r)
    }

    /// How many objects are known.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether no object is known.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Names this node: its Node object (once known) gives local PVs'
    /// node affinity the node's labels.
    pub fn set_node_name(&mut self, name: &str) {
        self.node_name = Some(name.to_string()).filter(|n| !n.is_empty());
    }
}

impl ObjectLookup for ObjectStore {
    fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<PersistentVolumeClaim>> {
        match self.objects.get(&ObjectRef::new(
            ObjectKind::PersistentVolumeClaim,
            namespace,
            name,
        ))? {
            KubeObject::PersistentVolumeClaim(o) => Some(Arc::clone(o)),
            _ => None,
        }
    }

    fn persistent_volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        match self
            .objects
            .get(&ObjectRef::new(ObjectKind::PersistentVolume, "", name))?
        {
            KubeObject::PersistentVolume(o) => Some(Arc::clone(o)),
            _ => None,
        }
    }

    fn persistent_volume_for_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<PersistentVolume>> {
        // The first by name, so the answer does not depend on hash order.
        let mut found: Option<&Arc<PersistentVolume>> = None;
        for o in self.objects.values() {
            let KubeObject::PersistentVolume(pv) = o else {
                continue;
            };
            let bound = pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .is_some_and(|r| {
                    r.namespace.as_deref() == Some(namespace) && r.name.as_deref() == Some(name)
                });
            if bound && found.is_none_or(|f| pv.metadata.name < f.metadata.name) {
                found = Some(pv);
            }
        }
        found.cloned()
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        match self
            .objects
            .get(&ObjectRef::new(ObjectKind::Secret, namespace, name))?
        {
            KubeObject::Secret(o) => Some(Arc::clone(o)),
            _ => None,
        }
    }

    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<ConfigMap>> {
        match self
            .objects
            .get(&ObjectRef::new(ObjectKind::ConfigMap, namespace, name))?
        {
            KubeObject::ConfigMap(o) => Some(Arc::clone(o)),
            _ => None,
        }
    }

    fn csi_driver(&self, name: &str) -> Option<Arc<CSIDriver>> {
        match self
            .objects
            .get(&ObjectRef::new(ObjectKind::CsiDriver, "", name))?
        {
            KubeObject::CsiDriver(o) => Some(Arc::clone(o)),
            _ => None,
        }
    }

    fn volume_attachment(&self, name: &str) -> Option<Arc<VolumeAttachment>> {
        match self
            .objects
            .get(&ObjectRef::new(ObjectKind::VolumeAttachment, "", name))?
        {
            KubeObject::VolumeAttachment(o) => Some(Arc::clone(o)),
            _ => None,
        }
    }

    fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    fn node(&self) -> Option<Arc<Node>> {
        let r = ObjectRef::new(ObjectKind::Node, "", self.node_name.as_deref()?);
        match self.objects.get(&r)? {
            KubeObject::Node(o) => Some(Arc::clone(o)),
            _ => None,
        }
    }

    fn service_account(&self, namespace: &str, name: &str) -> Option<Arc<ServiceAccount>> {
        let r = ObjectRef::new(ObjectKind::ServiceAccount, namespace, name);
        match self.objects.get(&r)? {
            KubeObject::ServiceAccount(o) => Some(Arc::clone(o)),
            _ => None,
        }
    }

    fn cluster_trust_bundle(&self, name: &str) -> Option<Arc<ClusterTrustBundle>> {
        let r = ObjectRef::new(ObjectKind::ClusterTrustBundle, "", name);
        match self.objects.get(&r)? {
            KubeObject::ClusterTrustBundle(o) => Some(Arc::clone(o)),
            _ => None,
        }
    }

    fn cluster_trust_bundles_of_signer(&self, signer: &str) -> Vec<Arc<ClusterTrustBundle>> {
        let mut out: Vec<Arc<ClusterTrustBundle>> = self
            .objects
            .values()
            .filter_map(|o| match o {
                KubeObject::ClusterTrustBundle(b)
                    if b.spec.signer_name.as_deref() == Some(signer) =>
                {
                    Some(Arc::clone(b))
                }
                _ => None,
            })
            .collect();
        out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        out
    }
}

/// An [`ObjectLookup`] that remembers every object asked for (found or not):
/// the dependencies of the pod being resolved.
pub struct RecordingLookup<'a> {
    store: &'a dyn ObjectLookup,
    seen: RefCell<BTreeSet<ObjectRef>>,
}

impl<'a> RecordingLookup<'a> {
    /// Wraps `store`.
    pub fn new(store: &'a dyn ObjectLookup) -> Self {
        Self {
            store,
            seen: RefCell::new(BTreeSet::new()),
        }
    }

    /// The objects asked for.
    pub fn into_dependencies(self) -> BTreeSet<ObjectRef> {
        self.seen.into_inner()
    }

    fn record(&self, r: ObjectRef) {
        self.seen.borrow_mut().insert(r);
    }
}

impl ObjectLookup for RecordingLookup<'_> {
    fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<PersistentVolumeClaim>> {
        self.record(ObjectRef::new(
            ObjectKind::PersistentVolumeClaim,
            namespace,
            name,
        ));
        self.store.persistent_volume_claim(namespace, name)
    }

    fn persistent_volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.record(ObjectRef::new(ObjectKind::PersistentVolume, "", name));
        self.store.persistent_volume(name)
    }

    fn persistent_volume_for_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<PersistentVolume>> {
        self.record(ObjectRef::any_persistent_volume());
        let pv = self.store.persistent_volume_for_claim(namespace, name);
        if let Some(n) = pv.as_ref().and_then(|p| p.metadata.name.as_deref()) {
            self.record(ObjectRef::new(ObjectKind::PersistentVolume, "", n));
        }
        pv
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        self.record(ObjectRef::new(ObjectKind::Secret, namespace, name));
        self.store.secret(namespace, name)
    }

    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<ConfigMap>> {
        self.record(ObjectRef::new(ObjectKind::ConfigMap, namespace, name));
        self.store.config_map(namespace, name)
    }

    fn csi_driver(&self, name: &str) -> Option<Arc<CSIDriver>> {
        self.record(ObjectRef::new(ObjectKind::CsiDriver, "", name));
        self.store.csi_driver(name)
    }

    fn volume_attachment(&self, name: &str) -> Option<Arc<VolumeAttachment>> {
        self.record(ObjectRef::new(ObjectKind::VolumeAttachment, "", name));
        self.store.volume_attachment(name)
    }

    fn node_name(&self) -> Option<&str> {
        self.store.node_name()
    }

    fn node(&self) -> Option<Arc<Node>> {
        if let Some(name) = self.store.node_name() {
            self.record(ObjectRef::new(ObjectKind::Node, "", name));
        }
        self.store.node()
    }

    fn service_account(&self, namespace: &str, name: &str) -> Option<Arc<ServiceAccount>> {
        self.record(ObjectRef::new(ObjectKind::ServiceAccount, namespace, name));
        self.store.service_account(namespace, name)
    }

    fn cluster_trust_bundle(&self, name: &str) -> Option<Arc<ClusterTrustBundle>> {
        self.record(ObjectRef::new(ObjectKind::ClusterTrustBundle, "", name));
        self.store.cluster_trust_bundle(name)
    }

    fn cluster_trust_bundles_of_signer(&self, signer: &str) -> Vec<Arc<ClusterTrustBundle>> {
        self.record(ObjectRef::any(ObjectKind::ClusterTrustBundle));
        self.store.cluster_trust_bundles_of_signer(signer)
    }
}

/// Which pods depend on which objects (both directions).
#[derive(Debug, Default)]
pub struct Dependents {
    by_object: HashMap<ObjectRef, BTreeSet<PodUid>>,
    by_pod: HashMap<PodUid, BTreeSet<ObjectRef>>,
}

impl Dependents {
    /// Replaces the dependencies of `pod`.
    pub fn set(&mut self, pod: &PodUid, deps: BTreeSet<ObjectRef>) {
        self.remove(pod);
        if deps.is_empty() {
            return;
        }
        for d in &deps {
            self.by_object
                .entry(d.clone())
                .or_default()
                .insert(pod.clone());
        }
        self.by_pod.insert(pod.clone(), deps);
    }

    /// Forgets `pod`.
    pub fn remove(&mut self, pod: &PodUid) {
        let Some(old) = self.by_pod.remove(pod) else {
            return;
        };
        for d in old {
            if let Some(set) = self.by_object.get_mut(&d) {
                set.remove(pod);
                if set.is_empty() {
                    self.by_object.remove(&d);
                }
            }
        }
    }

    /// Every object some pod read (an empty name: any object of the kind).
    pub fn objects(&self) -> BTreeSet<ObjectRef> {
        self.by_object.keys().cloned().collect()
    }

    /// The pods that depend on any of `changed` (a changed object also
    /// reaches the pods that depend on any object of its kind).
    pub fn pods_affected_by<'a>(
        &self,
        changed: impl IntoIterator<Item = &'a ObjectRef>,
    ) -> BTreeSet<PodUid> {
        let mut out = BTreeSet::new();
        let mut kinds = BTreeSet::new();
        for r in changed {
            kinds.insert(r.kind);
            if let Some(p) = self.by_object.get(r) {
                out.extend(p.iter().cloned());
            }
        }
        for kind in kinds {
            if let Some(p) = self.by_object.get(&ObjectRef::any(kind)) {
                out.extend(p.iter().cloned());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Node's heartbeat or condition change is no change to the store;
    /// a new label or allocatable is.
    #[test]
    fn a_node_changes_only_with_what_volumes_read() {
        let node = |labels: serde_json::Value, mem: &str, beat: &str| {
            KubeObject::from_json(serde_json::json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n1", "resourceVersion": beat, "labels": labels},
                "status": {"allocatable": {"memory": mem},
                           "conditions": [{"type": "Ready", "status": "True",
                                           "lastHeartbeatTime": format!("2026-01-01T00:00:0{beat}Z")}],
                           "volumesInUse": [beat]}}))
            .unwrap()
        };
        let mut s = ObjectStore::default();
        s.set_node_name("n1");
        let zone = serde_json::json!({"zone": "a"});
        assert!(s.insert(node(zone.clone(), "1Gi", "1")));
        assert!(!s.insert(node(zone.clone(), "1Gi", "2")), "a heartbeat");
        assert!(s.insert(node(zone.clone(), "2Gi", "3")), "allocatable");
        assert!(
            s.insert(node(serde_json::json!({"zone": "b"}), "2Gi", "4")),
            "labels"
        );
        let kept = s.node().unwrap();
        assert_eq!(kept.metadata.labels.as_ref().unwrap()["zone"], "b");
        let st = kept.status.as_ref().unwrap();
        assert_eq!(st.allocatable.as_ref().unwrap()["memory"].0, "2Gi");
        assert!(st.conditions.is_none() && st.volumes_in_use.is_none());
    }

    fn pv(name: &str, claim: Option<(&str, &str)>) -> KubeObject {
        let mut v = serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name}, "spec": {}});
        if let Some((ns, n)) = claim {
            v["spec"]["claimRef"] = serde_json::json!({"namespace": ns, "name": n});
        }
        KubeObject::PersistentVolume(Arc::new(serde_json::from_value(v).unwrap()))
    }

    fn secret(ns: Option<&str>, name: &str, value: &str) -> KubeObject {
        let mut v = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name}, "stringData": {"k": value}});
        if let Some(ns) = ns {
            v["metadata"]["namespace"] = ns.into();
        }
        KubeObject::Secret(Arc::new(serde_json::from_value(v).unwrap()))
    }

    #[test]
    fn store_lookups_and_changes() {
        let mut s = ObjectStore::default();
        assert!(s.insert(pv("b", Some(("ns", "c")))));
        assert!(s.insert(pv("a", Some(("ns", "c")))));
        assert!(
            !s.insert(pv("a", Some(("ns", "c")))),
            "same object: no change"
        );
        assert!(s.insert(secret(None, "s", "v1")));
        assert!(s.insert(secret(None, "s", "v2")), "new value: a change");
        assert_eq!(s.len(), 3);
        assert!(s.secret("default", "s").is_some());
        assert!(s.secret("other", "s").is_none());
        assert!(s.persistent_volume("a").is_some());
        // Lowest name wins when two PVs claim the same PVC.
        let p = s.persistent_volume_for_claim("ns", "c").unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("a"));
        assert!(s.persistent_volume_for_claim("ns", "d").is_none());
        assert!(s.remove(&ObjectRef::new(ObjectKind::PersistentVolume, "", "a")));
        assert!(!s.remove(&ObjectRef::new(ObjectKind::PersistentVolume, "", "a")));
        let obj = secret(Some("x"), "s", "hunter2");
        assert!(!format!("{obj:?}").contains("hunter2"));
        assert_eq!(obj.reference().to_string(), "Secret x/s");
    }

    #[test]
    fn recording_and_dependents() {
        let mut s = ObjectStore::default();
        s.insert(pv("pv", Some(("ns", "c"))));
        let rec = RecordingLookup::new(&s);
        assert!(rec.persistent_volume_claim("ns", "c").is_none());
        assert!(rec.persistent_volume_for_claim("ns", "c").is_some());
        assert!(rec.secret("ns", "missing").is_none());
        let deps = rec.into_dependencies();
        let pvc = ObjectRef::new(ObjectKind::PersistentVolumeClaim, "ns", "c");
        let pv_ref = ObjectRef::new(ObjectKind::PersistentVolume, "ignored", "pv");
        let sec = ObjectRef::new(ObjectKind::Secret, "ns", "missing");
        assert!(deps.contains(&pvc) && deps.contains(&pv_ref) && deps.contains(&sec));
        assert!(deps.contains(&ObjectRef::any_persistent_volume()));

        let mut d = Dependents::default();
        let (p1, p2) = (PodUid::new("p1").unwrap(), PodUid::new("p2").unwrap());
        d.set(&p1, deps);
        d.set(&p2, [sec.clone()].into_iter().collect());
        assert_eq!(d.pods_affected_by([&pvc]).len(), 1);
        assert_eq!(d.pods_affected_by([&sec]).len(), 2);
        // Any PV reaches p1 through its any-PV dependency.
        let other_pv = ObjectRef::new(ObjectKind::PersistentVolume, "", "other");
        assert_eq!(
            d.pods_affected_by([&other_pv])
                .into_iter()
                .collect::<Vec<_>>(),
            vec![p1.clone()]
        );
        d.remove(&p1);
        assert!(d.pods_affected_by([&pvc]).is_empty());
        d.set(&p2, BTreeSet::new());
        assert!(d.pods_affected_by([&sec]).is_empty());
        assert!(d.by_object.is_empty() && d.by_pod.is_empty());
    }
}
