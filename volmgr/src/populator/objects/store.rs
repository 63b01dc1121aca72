//! The objects a source knows, by reference, read by kind like
//! kube-runtime's `Store<K>`: [`ObjectStore::get`] one object,
//! [`ObjectStore::list`] every object of a kind. While
//! [`ObjectStore::recording`], every read is remembered (found or not):
//! what the pod being resolved depends on.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};

use super::kinds::{Kind, KubeObject, ObjectKind, ObjectRef};

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
    /// While [`recording`](Self::recording): every object asked for, found
    /// or not (the dependencies of the pod being resolved).
    reads: RefCell<Option<BTreeSet<ObjectRef>>>,
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

impl ObjectStore {
    /// Runs `f` on the store and returns what it gave and every object it
    /// read (found or not).
    pub fn recording<T>(&self, f: impl FnOnce(&Self) -> T) -> (T, BTreeSet<ObjectRef>) {
        let outer = self.reads.replace(Some(BTreeSet::new()));
        let out = f(self);
        let reads = self.reads.replace(outer).unwrap_or_default();
        (out, reads)
    }

    fn record(&self, r: ObjectRef) {
        if let Some(reads) = self.reads.borrow_mut().as_mut() {
            reads.insert(r);
        }
    }

    /// Object `namespace/name` of kind `K` (the namespace is ignored for a
    /// cluster-scoped kind).
    pub fn get<K: Kind>(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let r = ObjectRef::of::<K>(namespace, name);
        let found = self.objects.get(&r).and_then(K::of).cloned();
        self.record(r);
        found
    }

    /// Every object of kind `K`, by name (a change to any of them reaches
    /// the reader).
    pub fn list<K: Kind>(&self) -> Vec<Arc<K>> {
        self.record(ObjectRef::any(K::OBJECT_KIND));
        let mut out: Vec<Arc<K>> = self.objects.values().filter_map(K::of).cloned().collect();
        out.sort_by(|a, b| a.metadata().name.cmp(&b.metadata().name));
        out
    }

    /// This node's name, when the source follows its Node object (the API
    /// source, a C ABI caller that names its node).
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// This node, for the node affinity of local PersistentVolumes and its
    /// allocatable. `None` when the source does not know it (the manifests
    /// source): the checks are then skipped.
    pub fn node(&self) -> Option<Arc<Node>> {
        self.get::<Node>("", self.node_name.as_deref()?)
    }

    /// The PersistentVolume whose `spec.claimRef` names claim
    /// `namespace/name` (for a claim without `spec.volumeName`): the first
    /// by name, so the answer does not depend on hash order. Reads every PV.
    pub fn persistent_volume_for_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<PersistentVolume>> {
        let pv = self.list::<PersistentVolume>().into_iter().find(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .is_some_and(|r| {
                    r.namespace.as_deref() == Some(namespace) && r.name.as_deref() == Some(name)
                })
        })?;
        if let Some(n) = pv.metadata.name.as_deref() {
            self.record(ObjectRef::of::<PersistentVolume>("", n));
        }
        Some(pv)
    }

    /// Every ClusterTrustBundle of signer `signer`, by name (a projected
    /// `clusterTrustBundle` source by signer and labels).
    pub fn cluster_trust_bundles_of_signer(&self, signer: &str) -> Vec<Arc<ClusterTrustBundle>> {
        let mut all = self.list::<ClusterTrustBundle>();
        all.retain(|b| b.spec.signer_name.as_deref() == Some(signer));
        all
    }
}
