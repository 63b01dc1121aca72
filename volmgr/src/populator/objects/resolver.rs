//! Resolving pods against the objects they read, for every source of pods
//! (the manifests directory, the Kubernetes API, the C ABI): which pod read
//! which PersistentVolumeClaim, PersistentVolume or Secret, converting a
//! pod again when one of those changes, and keeping a volume's last good
//! resolution when its object goes away (the kubelet never drops a volume
//! of a running pod because its claim vanished). Writes to the [`PodSink`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::populator::convert::pod::{DesiredPod, PodRejected};
use crate::populator::objects::{Dependents, KubeObject, ObjectKind, ObjectRef, ObjectStore};
use crate::populator::{PodSink, SubPathTiming};
use crate::volume::{PodUid, VolumeSource};

/// A pod as written and the objects its conversion read.
pub type Resolvable = (Arc<Pod>, BTreeSet<ObjectRef>);

/// The objects a source knows and the pods that read them.
pub struct PodResolver {
    sink: Arc<dyn PodSink>,
    store: ObjectStore,
    /// The pods that read other objects, as written (to re-resolve them).
    resolvable: HashMap<PodUid, Arc<Pod>>,
    /// Which of those pods read which objects.
    dependents: Dependents,
    /// The last successful resolution of each volume of those pods: a
    /// volume whose object goes away keeps it.
    last_good: HashMap<PodUid, HashMap<String, VolumeSource>>,
    /// Pods currently running on a last good resolution (shown in status).
    stale: HashMap<PodUid, String>,
    /// For a source that reads objects one by one (the API server): the
    /// objects it has confirmed, found or absent. A pod that read an
    /// object not confirmed yet is held back (not handed to the sink) until
    /// it is, so a volume is never set up on a resolution made before its
    /// objects were read (no CSIDriver yet looks like "no CSIDriver").
    /// `None`: the store is the whole truth (the manifests directory, the
    /// C ABI).
    confirmed: Option<HashSet<ObjectRef>>,
    /// Pods held back for unconfirmed objects, by the status key their
    /// wait shows under.
    held: HashMap<PodUid, String>,
    /// When the pods' subPaths are prepared.
    sub_path_timing: SubPathTiming,
}

impl PodResolver {
    /// A resolver writing to `sink`.
    pub fn new(sink: Arc<dyn PodSink>) -> Self {
        Self {
            sink,
            store: ObjectStore::default(),
            resolvable: HashMap::new(),
            dependents: Dependents::default(),
            last_good: HashMap::new(),
            stale: HashMap::new(),
            confirmed: None,
            held: HashMap::new(),
            sub_path_timing: SubPathTiming::AtSetUp,
        }
    }

    /// A resolver for a source that confirms objects one by one
    /// ([`confirm_object`](Self::confirm_object)): pods wait for every
    /// object they read to be confirmed.
    pub fn with_confirmation(sink: Arc<dyn PodSink>) -> Self {
        Self {
            confirmed: Some(HashSet::new()),
            ..Self::new(sink)
        }
    }

    /// What the source found for `r`: the object, or none. Pods held for
    /// it, or that read it, are converted again.
    pub fn confirm_object(&mut self, r: &ObjectRef, obj: Option<KubeObject>) {
        let newly = self.confirmed.as_mut().is_some_and(|c| c.insert(r.clone()));
        let changed = match obj {
            Some(o) => self.store.insert(o),
            None => self.store.remove(r),
        };
        if newly || changed {
            self.reresolve(&BTreeSet::from([r.clone()]), &BTreeSet::new());
        }
    }

    /// What the source listed of `kind`, a kind it follows whole
    /// ([`ObjectKind::followed_whole`]): every object of it (those not
    /// listed are gone). Pods held for the kind, or that read a changed
    /// object of it, are converted again.
    pub fn confirm_kind(&mut self, kind: ObjectKind, objects: Vec<KubeObject>) {
        let any = ObjectRef::any(kind);
        let newly = self
            .confirmed
            .as_mut()
            .is_some_and(|c| c.insert(any.clone()));
        let listed: BTreeSet<ObjectRef> = objects.iter().map(KubeObject::reference).collect();
        let mut changed = BTreeSet::new();
        for r in self.store.references_of(kind) {
            if !listed.contains(&r) && self.store.remove(&r) {
                changed.insert(r);
            }
        }
        for o in objects {
            let r = o.reference();
            if self.store.insert(o) {
                changed.insert(r);
            }
        }
        if newly {
            // Every pod that waited on one of the kind, found or not.
            changed.extend(
                self.dependents
                    .objects()
                    .into_iter()
                    .filter(|r| r.kind == kind),
            );
            changed.insert(any);
        }
        self.reresolve(&changed, &BTreeSet::new());
    }

    /// Forgets object `r` and its confirmation (no pod reads it any more).
    pub fn unconfirm_object(&mut self, r: &ObjectRef) {
        if let Some(c) = self.confirmed.as_mut() {
            c.remove(r);
        }
        self.store.remove(r);
    }

    /// Whether some of `deps` are not confirmed yet (always false without
    /// confirmation).
    fn waits_for(&self, deps: &BTreeSet<ObjectRef>) -> bool {
        deps.iter().any(|d| !self.is_confirmed(d))
    }

    /// Whether the source confirmed `d`: itself, or for a kind followed
    /// whole the kind's list. A wildcard of another kind (any PV) is never
    /// waited for: no source lists those.
    fn is_confirmed(&self, d: &ObjectRef) -> bool {
        let Some(c) = &self.confirmed else {
            return true;
        };
        if d.kind.followed_whole() {
            return c.contains(&ObjectRef::any(d.kind));
        }
        d.is_any() || c.contains(d)
    }

    /// Holds `pod` back until `deps` are confirmed; status says what it
    /// waits for (an object whose watch keeps failing shows there).
    fn hold(&mut self, pod: &DesiredPod, raw: Arc<Pod>, deps: BTreeSet<ObjectRef>) {
        let waiting: Vec<String> = deps
            .iter()
            .filter(|d| !self.is_confirmed(d))
            .map(|d| match d.is_any() {
                true => format!("the {}s", d.kind.name()),
                false => d.to_string(),
            })
            .collect();
        let key = format!("pod {}/{} ({}) objects", pod.namespace, pod.name, pod.uid);
        let msg = format!(
            "waiting for {} to be read from the API server",
            waiting.join(", ")
        );
        self.sink.set_source_problems(&key, vec![msg], vec![]);
        self.held.insert(pod.uid.clone(), key);
        self.dependents.set(&pod.uid, deps);
        self.resolvable.insert(pod.uid.clone(), raw);
    }

    /// Whether some pod is held back for objects not confirmed yet (it is
    /// not in the desired state: a source whose pods are held is not ready).
    pub fn holds_pods(&self) -> bool {
        !self.held.is_empty()
    }

    /// `uid` is no longer held back.
    fn release(&mut self, uid: &PodUid) {
        if let Some(key) = self.held.remove(uid) {
            self.sink.set_source_problems(&key, vec![], vec![]);
        }
    }

    /// Names this node, so local PVs' node affinity is checked against its
    /// Node object (followed like the other objects) once known.
    pub fn set_node_name(&mut self, name: &str) {
        self.store.set_node_name(name);
    }

    /// When the pods' subPaths are prepared from now on (right after set-up
    /// unless set).
    pub fn set_sub_path_timing(&mut self, timing: SubPathTiming) {
        self.sub_path_timing = timing;
    }

    /// The objects known.
    pub fn objects(&self) -> &ObjectStore {
        &self.store
    }

    /// Stores `obj` without converting anyone again (a source applying a
    /// batch calls [`reresolve`](Self::reresolve) once after); whether it
    /// changed.
    pub fn store_object(&mut self, obj: KubeObject) -> bool {
        self.store.insert(obj)
    }

    /// Removes object `r` without converting anyone again; whether it was
    /// known.
    pub fn remove_object(&mut self, r: &ObjectRef) -> bool {
        self.store.remove(r)
    }

    /// Adds or replaces `obj` and converts again the pods that read it;
    /// whether it changed.
    pub fn upsert_object(&mut self, obj: KubeObject) -> bool {
        let r = obj.reference();
        if !self.store.insert(obj) {
            return false;
        }
        self.reresolve(&BTreeSet::from([r]), &BTreeSet::new());
        true
    }

    /// Removes object `r` and converts again the pods that read it (their
    /// volumes keep their last good resolution); whether it was known.
    pub fn delete_object(&mut self, r: &ObjectRef) -> bool {
        if !self.store.remove(r) {
            return false;
        }
        self.reresolve(&BTreeSet::from([r.clone()]), &BTreeSet::new());
        true
    }

    /// Whether no pod is followed (none reads an object).
    pub fn follows_no_pod(&self) -> bool {
        self.resolvable.is_empty()
    }

    /// The objects the known pods read (found or not): what a source that
    /// follows objects one by one must follow.
    pub fn referenced_objects(&self) -> BTreeSet<ObjectRef> {
        self.dependents.objects()
    }

    /// Converts `raw` (resolving its claims against the known objects) and
    /// hands it to the sink: a pod of a source that has no notion of files
    /// (the Kubernetes API, the C ABI).
    pub fn upsert_pod(&mut self, raw: Arc<Pod>) -> Result<PodUid, PodRejected> {
        let (pod, resolvable) = if crate::populator::convert::pod::needs_objects(&raw)
            || crate::populator::convert::pod::reads_node(&raw)
        {
            let (pod, deps) = self.resolve(&raw)?;
            if self.waits_for(&deps) {
                self.hold(&pod, raw, deps);
                return Ok(pod.uid);
            }
            self.release(&pod.uid);
            (pod, Some((raw, deps)))
        } else {
            let mut pod = DesiredPod::from_pod(&raw)?;
            pod.sub_path_release = self.sub_path_timing.release(&raw);
            (pod, None)
        };
        let uid = pod.uid.clone();
        let pod = self.admit(pod, resolvable);
        self.sink.set_pod(pod);
        Ok(uid)
    }

    /// Removes pod `uid` (its volumes are torn down); whether the sink knew it.
    pub fn delete_pod(&mut self, uid: &PodUid) -> bool {
        self.forget_pod(uid);
        self.sink.delete_pod(uid)
    }

    /// Records a converted pod before it goes to the sink: with what it was
    /// converted from and read, it is followed (and its volumes may keep
    /// their last good resolution if the same pod was seen before);
    /// without, it reads nothing and anything recorded of it is forgotten.
    pub fn admit(&mut self, pod: DesiredPod, resolvable: Option<Resolvable>) -> DesiredPod {
        match resolvable {
            Some((raw, deps)) => {
                let same = self.resolvable.get(&pod.uid) == Some(&raw);
                self.dependents.set(&pod.uid, deps);
                self.resolvable.insert(pod.uid.clone(), raw);
                self.settle(pod, same)
            }
            None => {
                self.forget_pod(&pod.uid);
                pod
            }
        }
    }

    /// Converts a pod that reads other objects, recording which.
    pub fn resolve(&self, raw: &Pod) -> Result<(DesiredPod, BTreeSet<ObjectRef>), PodRejected> {
        let (pod, deps) = self
            .store
            .recording(|store| DesiredPod::from_pod_with(raw, Some(store)));
        let mut pod = pod?;
        pod.sub_path_release = self.sub_path_timing.release(raw);
        Ok((pod, deps))
    }

    /// Stops tracking the objects `uid` read.
    pub fn forget_pod(&mut self, uid: &PodUid) {
        self.release(uid);
        self.resolvable.remove(uid);
        self.dependents.remove(uid);
        self.last_good.remove(uid);
        if let Some(key) = self.stale.remove(uid) {
            self.sink.set_source_problems(&key, vec![], vec![]);
        }
    }

    /// Records the volumes that resolved; with `keep_last`, a volume that no
    /// longer resolves keeps its last good resolution (and the problem shows
    /// in status under the pod).
    fn settle(&mut self, mut pod: DesiredPod, keep_last: bool) -> DesiredPod {
        let prev = self.last_good.remove(&pod.uid).unwrap_or_default();
        let mut problems = Vec::new();
        for v in &mut pod.volumes {
            if let (Err(e), true) = (&v.source, keep_last) {
                if let Some(old) = prev.get(&v.name) {
                    tracing::warn!(pod = %pod.uid, volume = %v.name, error = %e, "volume no longer resolves; keeping its last resolution");
                    problems.push(format!(
                        "volume {:?}: {e}; the volume stays as last resolved",
                        v.name
                    ));
                    v.stale = Some(e.to_string());
                    v.source = Ok(old.clone());
                }
            }
        }
        let good = pod
            .volumes
            .iter()
            .filter_map(|v| v.source.as_ref().ok().map(|s| (v.name.clone(), s.clone())))
            .collect();
        self.last_good.insert(pod.uid.clone(), good);
        let key = format!("pod {}/{} ({})", pod.namespace, pod.name, pod.uid);
        if problems.is_empty() {
            if let Some(k) = self.stale.remove(&pod.uid) {
                self.sink.set_source_problems(&k, vec![], vec![]);
            }
        } else {
            self.sink.set_source_problems(&key, problems, vec![]);
            self.stale.insert(pod.uid.clone(), key);
        }
        pod
    }

    /// Converts again the pods that read one of `changed` (except those in
    /// `fresh`, just converted against the current objects).
    pub fn reresolve(&mut self, changed: &BTreeSet<ObjectRef>, fresh: &BTreeSet<PodUid>) {
        if changed.is_empty() {
            return;
        }
        for uid in self.dependents.pods_affected_by(changed) {
            if fresh.contains(&uid) {
                continue;
            }
            let Some(raw) = self.resolvable.get(&uid).cloned() else {
                continue;
            };
            match self.resolve(&raw) {
                Ok((pod, deps)) if self.waits_for(&deps) => self.hold(&pod, raw, deps),
                Ok((pod, deps)) => {
                    self.release(&uid);
                    tracing::info!(pod = %uid, "pod re-resolved after an object it uses changed");
                    self.dependents.set(&uid, deps);
                    let pod = self.settle(pod, true);
                    self.sink.set_pod(pod);
                }
                // Rejection depends on the pod alone, which did not change.
                Err(r) => tracing::warn!(pod = %uid, error = %r, "pod rejected on re-resolution"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::world::{WakeHold, World};
    use std::sync::Mutex;

    /// Records each pod handed over: (uid, whether a volume failed).
    #[derive(Default)]
    struct Recording(
        Mutex<Vec<(String, bool)>>,
        Arc<World>,
        Mutex<HashMap<String, Vec<String>>>,
    );

    impl PodSink for Recording {
        fn set_pod(&self, pod: DesiredPod) {
            let failed = pod.volumes.iter().any(|v| v.source.is_err());
            self.0.lock().unwrap().push((pod.uid.to_string(), failed));
        }
        fn delete_pod(&self, _: &PodUid) -> bool {
            true
        }
        fn set_source_problems(&self, key: &str, errors: Vec<String>, _: Vec<PodRejected>) {
            let mut p = self.2.lock().unwrap();
            if errors.is_empty() {
                p.remove(key);
            } else {
                p.insert(key.to_string(), errors);
            }
        }
        fn set_populated(&self) {}
        fn hold_wakes(&self) -> WakeHold {
            self.1.hold_wakes()
        }
    }

    /// With confirmation, a pod is held until every object it reads was
    /// confirmed, found or absent, then converted against what was found.
    #[test]
    fn pods_wait_for_their_objects_to_be_confirmed() {
        let sink = Arc::new(Recording::default());
        let mut r = PodResolver::with_confirmation(Arc::clone(&sink) as Arc<dyn PodSink>);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "00000000-0000-0000-0000-0000000000aa"},
            "spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                     "volumes": [{"name": "v", "configMap": {"name": "cm"}}]}}))
        .unwrap();
        r.upsert_pod(Arc::new(pod)).unwrap();
        assert!(
            sink.0.lock().unwrap().is_empty(),
            "handed over before its object was read"
        );
        let problems = format!("{:?}", sink.2.lock().unwrap());
        assert!(
            problems.contains("waiting for ConfigMap ns/cm to be read"),
            "{problems}"
        );
        let cm = ObjectRef::new(ObjectKind::ConfigMap, "ns", "cm");
        assert!(
            r.referenced_objects().contains(&cm),
            "its object is to be followed"
        );
        r.confirm_object(&cm, None);
        assert_eq!(
            sink.0.lock().unwrap().last().map(|p| p.1),
            Some(true),
            "absent: an error"
        );
        assert!(sink.2.lock().unwrap().is_empty(), "the wait still shows");
        let obj =
            KubeObject::from_json(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": "ns"}, "data": {"k": "v"}}))
            .unwrap();
        r.confirm_object(&cm, Some(obj));
        assert_eq!(sink.0.lock().unwrap().last().map(|p| p.1), Some(false));
    }
}
