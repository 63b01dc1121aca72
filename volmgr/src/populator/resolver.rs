//! Resolving pods against the objects they read, for every source of pods
//! (the manifests directory, the Kubernetes API, the C ABI): which pod read
//! which PersistentVolumeClaim, PersistentVolume or Secret, and converting
//! a pod again when one of those changes. Writes to the [`PodSink`]; a
//! volume whose object went away is kept there (the populator's
//! `keep_unresolved`: the kubelet never drops a volume of a running pod
//! because its claim vanished).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::populator::convert::pod::{DesiredPod, PodRejected};
use crate::populator::convert::PayloadResolution;
use crate::populator::objects::{Dependents, KubeObject, ObjectKind, ObjectRef, ObjectStore};
use crate::populator::{PodSink, SubPathTiming};
use crate::volume::PodUid;

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
    /// How payload volumes (and CSI volumes' Secrets) are resolved.
    payloads: PayloadResolution,
}

impl PodResolver {
    /// A resolver writing to `sink`.
    pub fn new(sink: Arc<dyn PodSink>) -> Self {
        Self {
            sink,
            store: ObjectStore::default(),
            resolvable: HashMap::new(),
            dependents: Dependents::default(),
            confirmed: None,
            held: HashMap::new(),
            sub_path_timing: SubPathTiming::AtSetUp,
            payloads: PayloadResolution::Full,
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
        if self.held.insert(pod.uid.clone(), key).is_none() {
            self.sink.set_held(&pod.uid, true);
        }
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
            self.sink.set_held(uid, false);
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

    /// How pods' payload volumes are resolved from now on (in full unless
    /// set): [`PayloadResolution::NamesOnly`] reads none of the objects they
    /// name, so no pod waits for or follows them.
    pub fn set_payload_resolution(&mut self, payloads: PayloadResolution) {
        self.payloads = payloads;
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

    /// Removes object `r` and converts again the pods that read it (the
    /// sink keeps their volumes that resolved before); whether it was known.
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
            (pod, Some((raw, deps)))
        } else {
            let mut pod = DesiredPod::from_pod_resolving(&raw, None, self.payloads)?;
            pod.sub_path_release = self.sub_path_timing.release(&raw);
            (pod, None)
        };
        let uid = pod.uid.clone();
        self.admit(&uid, resolvable);
        self.sink.set_pod(pod);
        // Released only once in the desired state: in between, what is
        // mounted for it must look neither held nor unwanted.
        self.release(&uid);
        Ok(uid)
    }

    /// Removes pod `uid` (its volumes are torn down); whether the sink knew it.
    pub fn delete_pod(&mut self, uid: &PodUid) -> bool {
        self.forget_pod(uid);
        self.sink.delete_pod(uid)
    }

    /// Removes pod `uid` from the desired state (nothing of it is read or
    /// set up any more) but keeps it held, so that nothing mounted for it
    /// is torn down until [`Self::release_kept`]: a pod gone from the API
    /// whose containers may still run. Held before it leaves the desired
    /// state, so the reconciler never sees it unheld and gone.
    pub fn delete_pod_keeping_mounts(&mut self, uid: &PodUid) -> bool {
        self.forget_pod(uid);
        self.sink.set_held(uid, true);
        self.sink.delete_pod(uid)
    }

    /// Stops reading the objects of pod `uid`, whose deletion began
    /// (`deletionTimestamp`): what it has in the desired state stays as it
    /// is until the pod goes, as the kubelet sets up nothing more for a
    /// terminating pod (its desired-state populator skips pods whose
    /// containers should be terminating, and `syncTerminatingPod` does not
    /// wait for volumes). Its claims, volumes and service account are then
    /// not read again (once the pod is gone the Node authorizer refuses
    /// them). A pod still held for objects it waits for is not frozen
    /// half-read: whether its objects come or the pod goes, it is settled.
    /// Whether the pod stopped reading (it read something and was not held).
    pub fn stop_reading(&mut self, uid: &PodUid) -> bool {
        if self.held.contains_key(uid) || !self.resolvable.contains_key(uid) {
            return false;
        }
        self.resolvable.remove(uid);
        self.dependents.remove(uid);
        true
    }

    /// Lets what is mounted for pod `uid`, deleted by
    /// [`Self::delete_pod_keeping_mounts`], be torn down (unless the pod
    /// came back and waits for its objects).
    pub fn release_kept(&self, uid: &PodUid) {
        if !self.held.contains_key(uid) {
            self.sink.set_held(uid, false);
        }
    }

    /// Records converted pod `uid` before it goes to the sink: with what it
    /// was converted from and read, it is followed; without, it reads
    /// nothing and anything recorded of it is forgotten.
    pub fn admit(&mut self, uid: &PodUid, resolvable: Option<Resolvable>) {
        match resolvable {
            Some((raw, deps)) => {
                self.dependents.set(uid, deps);
                self.resolvable.insert(uid.clone(), raw);
            }
            None => self.forget_pod(uid),
        }
    }

    /// Converts a pod that reads other objects, recording which.
    pub fn resolve(&self, raw: &Pod) -> Result<(DesiredPod, BTreeSet<ObjectRef>), PodRejected> {
        let (pod, deps) = self
            .store
            .recording(|store| DesiredPod::from_pod_resolving(raw, Some(store), self.payloads));
        let mut pod = pod?;
        pod.sub_path_release = self.sub_path_timing.release(raw);
        Ok((pod, deps))
    }

    /// Stops tracking the objects `uid` read.
    pub fn forget_pod(&mut self, uid: &PodUid) {
        self.release(uid);
        self.resolvable.remove(uid);
        self.dependents.remove(uid);
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
                    self.sink.set_pod(pod);
                }
                // Rejection depends on the pod alone, which did not change.
                Err(r) => tracing::warn!(pod = %uid, error = %r, "pod rejected on re-resolution"),
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cache::world::{WakeHold, World};
    use crate::volume::VolumeSource;
    use std::sync::Mutex;

    /// Records each pod handed over: (uid, whether a volume failed).
    #[derive(Default)]
    struct Recording(
        Mutex<Vec<(String, bool)>>,
        Arc<World>,
        Mutex<HashMap<String, Vec<String>>>,
        Mutex<Option<DesiredPod>>,
    );

    impl PodSink for Recording {
        fn set_pod(&self, pod: DesiredPod) {
            let failed = pod.volumes.iter().any(|v| v.source.is_err());
            self.0.lock().unwrap().push((pod.uid.to_string(), failed));
            *self.3.lock().unwrap() = Some(pod);
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
        fn set_held(&self, _: &PodUid, _: bool) {}
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

    /// A terminating pod (`deletionTimestamp`) stops reading: its objects
    /// are no longer followed and a change of them converts nothing again,
    /// while the pod stays desired as it was (before, its claims kept being
    /// read until the pod was gone, and the Node authorizer then refused
    /// the reads that raced the deletion).
    #[test]
    fn a_terminating_pod_stops_reading_and_stays_desired() {
        let sink = Arc::new(Recording::default());
        let mut r = PodResolver::with_confirmation(Arc::clone(&sink) as Arc<dyn PodSink>);
        let cm = ObjectRef::new(ObjectKind::ConfigMap, "ns", "cm");
        r.confirm_object(&cm, Some(config_map("1")));
        let uid = r
            .upsert_pod(config_map_pod(
                "00000000-0000-0000-0000-0000000000cc",
                "cm",
                "a",
            ))
            .unwrap();
        assert_eq!(sink.0.lock().unwrap().len(), 1, "handed over once");
        assert!(r.referenced_objects().contains(&cm));

        assert!(r.stop_reading(&uid), "it read an object");
        assert!(
            !r.referenced_objects().contains(&cm),
            "its object is no longer followed"
        );
        r.confirm_object(&cm, Some(config_map("2")));
        assert_eq!(
            sink.0.lock().unwrap().len(),
            1,
            "not converted again for a change of its object"
        );
        assert!(!r.stop_reading(&uid), "already stopped");
    }

    /// ConfigMap ns/cm with `k` = `value`.
    pub(crate) fn config_map(value: &str) -> KubeObject {
        KubeObject::from_json(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": "ns"}, "data": {"k": value}}))
        .unwrap()
    }

    /// Pod `uid` whose volume `v` is ConfigMap `cm`, labelled `label`.
    pub(crate) fn config_map_pod(uid: &str, cm: &str, label: &str) -> Arc<Pod> {
        Arc::new(serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid, "labels": {"l": label}},
            "spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                     "volumes": [{"name": "v", "configMap": {"name": cm}}]}}))
        .unwrap())
    }

    /// Each volume's name, plugin and unique name (what the observer
    /// matches with the kubelet's directories), or its error.
    fn volume_names(pod: &DesiredPod) -> Vec<(String, String, String)> {
        pod.volumes
            .iter()
            .map(|v| {
                let plugin = match &v.source {
                    Ok(VolumeSource::Payload(p)) => {
                        crate::plugins::config_volumes::plugin_name(p.kind).to_string()
                    }
                    other => format!("{other:?}"),
                };
                let unique = crate::volume::UniqueVolumeName::per_pod(&plugin, &pod.uid, &v.name);
                (v.name.clone(), plugin, unique.to_string())
            })
            .collect()
    }

    /// Observe mode: configMap, secret and projected (kube-api-access:
    /// token, kube-root-ca.crt, downwardAPI) volumes convert, with none of
    /// their objects readable, to the volumes full resolution gives with
    /// them present (same names and plugins, no files); the pod is handed
    /// over at once and no object is to be followed.
    #[test]
    fn names_only_payloads_read_no_object_and_keep_their_names() {
        let mount = |n: &str| serde_json::json!({"name": n, "mountPath": format!("/{n}")});
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "00000000-0000-0000-0000-0000000000bb"},
            "spec": {"serviceAccountName": "sa",
                "containers": [{"name": "c", "image": "i",
                    "volumeMounts": [mount("cm"), mount("sec"), mount("kube-api-access-x"), mount("dapi")]}],
                "volumes": [
                    {"name": "cm", "configMap": {"name": "cm"}},
                    {"name": "sec", "secret": {"secretName": "s"}},
                    {"name": "kube-api-access-x", "projected": {"defaultMode": 420, "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}},
                    {"name": "dapi", "downwardAPI": {"items": [
                        {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}}]}}]}}))
        .unwrap();
        let mut store = ObjectStore::default();
        for o in [
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": "ns"}, "data": {"a": "1"}}),
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "kube-root-ca.crt", "namespace": "ns"}, "data": {"ca.crt": "CA"}}),
            serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s", "namespace": "ns"}, "data": {"k": "aHVudGVyMg=="}}),
        ] {
            store.insert(KubeObject::from_json(o).unwrap());
        }
        let full = DesiredPod::from_pod_with(&pod, Some(&store)).unwrap();
        assert!(full.volumes.iter().all(|v| v.source.is_ok()), "{full:?}");

        let sink = Arc::new(Recording::default());
        let mut r = PodResolver::with_confirmation(Arc::clone(&sink) as Arc<dyn PodSink>);
        r.set_payload_resolution(PayloadResolution::NamesOnly);
        r.upsert_pod(Arc::new(pod)).unwrap();
        let names_only = sink.3.lock().unwrap().clone().expect("not held back");
        assert!(sink.2.lock().unwrap().is_empty(), "no wait shows");
        assert!(r.referenced_objects().is_empty(), "nothing to follow");
        assert!(r.objects().is_empty());
        assert_eq!(volume_names(&names_only), volume_names(&full));
        assert_eq!(names_only.volumes.len(), 4);
        for v in &names_only.volumes {
            match &v.source {
                Ok(VolumeSource::Payload(p)) => {
                    assert!(p.files.is_empty() && p.tokens.is_empty(), "{p:?}")
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
