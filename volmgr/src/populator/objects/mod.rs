//! The non-pod objects a source knows (PersistentVolumeClaims,
//! PersistentVolumes, Secrets, ConfigMaps, CSIDrivers, VolumeAttachments,
//! ServiceAccounts, ClusterTrustBundles, this Node): their [`kinds`] (one
//! line each), the one decoder ([`decode`]), the [`ObjectStore`] pod
//! resolution reads by kind (recording what it read), the bookkeeping of
//! which pod read which object ([`Dependents`]) so a change re-resolves
//! exactly the pods that depend on it (the populator's
//! [`resolver`](crate::populator::resolver) does that).

mod dependents;
pub mod kinds;
mod store;

pub use dependents::Dependents;
pub use kinds::{
    as_v1_trust_bundle, decode, Kind, KindVisitor, KubeObject, ObjectDecodeError, ObjectKind,
    ObjectRef,
};
pub use store::ObjectStore;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::PodUid;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
    use std::collections::BTreeSet;
    use std::sync::Arc;

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
        assert!(s.get::<Secret>("default", "s").is_some());
        assert!(s.get::<Secret>("other", "s").is_none());
        assert!(s.get::<PersistentVolume>("", "a").is_some());
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
        let ((), deps) = s.recording(|rec| {
            assert!(rec.get::<PersistentVolumeClaim>("ns", "c").is_none());
            assert!(rec.persistent_volume_for_claim("ns", "c").is_some());
            assert!(rec.get::<Secret>("ns", "missing").is_none());
        });
        assert!(s.get::<Secret>("ns", "other").is_none(), "not recording");
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
        assert!(d.objects().is_empty());
    }
}
