use super::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};

fn pod(json: serde_json::Value) -> Pod {
    serde_json::from_value(json).unwrap()
}

fn with_volumes(uid: Option<&str>, volumes: serde_json::Value) -> Pod {
    let names: Vec<_> = volumes
            .as_array()
            .unwrap()
            .iter()
            .map(|v| serde_json::json!({"name": v["name"], "mountPath": format!("/m/{}", v["name"].as_str().unwrap_or("x"))}))
            .collect();
    let mut p = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": names}], "volumes": volumes}
    });
    if let Some(u) = uid {
        p["metadata"]["uid"] = u.into();
    }
    pod(p)
}

#[test]
fn converts_empty_dir_and_host_path() {
    let p = with_volumes(
        Some("u-1"),
        serde_json::json!([
            {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            {"name": "disk", "emptyDir": {}},
            {"name": "hp", "hostPath": {"path": "/var/log", "type": "Directory"}},
            {"name": "cm", "configMap": {"name": "x"}},
        ]),
    );
    let d = DesiredPod::from_pod(&p).unwrap();
    assert_eq!(d.uid.as_str(), "u-1");
    assert_eq!(d.volumes.len(), 4);
    assert_eq!(
        d.volumes[0].source,
        Ok(VolumeSource::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: Some(64 << 20)
        })
    );
    assert!(
        matches!(d.volumes[3].source, Ok(VolumeSource::Other { ref kind, .. }) if kind == "configMap")
    );
}

#[test]
fn derives_a_stable_uid() {
    let a = DesiredPod::from_pod(&with_volumes(None, serde_json::json!([]))).unwrap();
    let b = DesiredPod::from_pod(&with_volumes(None, serde_json::json!([]))).unwrap();
    assert_eq!(a.uid, b.uid);
    assert_eq!(a.uid.as_str().len(), 36);
    assert_ne!(a.uid, PodUid::derive("ns", "q"));
    assert_ne!(PodUid::derive("a", "bc"), PodUid::derive("ab", "c"));
}

#[test]
fn rejects_bad_uids_and_duplicates() {
    for bad in ["../x", "a/b", "..", "a\0b"] {
        let e = DesiredPod::from_pod(&with_volumes(Some(bad), serde_json::json!([]))).unwrap_err();
        assert!(e.reason.contains("invalid pod UID"), "{e}");
    }
    let e = DesiredPod::from_pod(&with_volumes(
        Some("u"),
        serde_json::json!([{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]),
    ))
    .unwrap_err();
    assert!(e.reason.contains("duplicate volume name"));
}

#[test]
fn volume_level_errors() {
    let d = DesiredPod::from_pod(&with_volumes(
        Some("u"),
        serde_json::json!([
            {"name": "../x", "emptyDir": {}},
            {"name": "rel", "hostPath": {"path": "var/log"}},
            {"name": "dots", "hostPath": {"path": "/var/../etc"}},
            {"name": "typ", "hostPath": {"path": "/x", "type": "Bogus"}},
            {"name": "size", "emptyDir": {"sizeLimit": "lots"}},
            {"name": "med", "emptyDir": {"medium": "Tape"}},
        ]),
    ))
    .unwrap();
    for v in &d.volumes {
        assert!(v.source.is_err(), "{}", v.name);
    }
}

#[test]
fn unused_volumes_are_ignored_and_terminated_pods_flagged() {
    let mut p = with_volumes(
        Some("u"),
        serde_json::json!([{"name": "a", "emptyDir": {}}]),
    );
    p.spec.as_mut().unwrap().volumes.as_mut().unwrap().push(
        serde_json::from_value(serde_json::json!({"name": "unused", "emptyDir": {}})).unwrap(),
    );
    p.status = Some(serde_json::from_value(serde_json::json!({"phase": "Succeeded"})).unwrap());
    let d = DesiredPod::from_pod(&p).unwrap();
    assert_eq!(d.volumes.len(), 1);
    assert!(d.terminated);
}

/// sha256("uid-1" + "vol"), computed independently.
const HANDLE_UID1_VOL: &str =
    "csi-67efd08187334bc4caecc2244debc613d2dae49b3b82338caf725c10f4e8a821";

/// The objects of the resolution tests, as an [`ObjectStore`].
#[derive(Default)]
struct Objects {
    pvcs: Vec<PersistentVolumeClaim>,
    pvs: Vec<PersistentVolume>,
    secrets: Vec<Secret>,
    node: Option<k8s_openapi::api::core::v1::Node>,
}

impl Objects {
    fn store(&self) -> ObjectStore {
        use crate::populator::objects::KubeObject;
        let mut s = ObjectStore::default();
        for o in &self.pvcs {
            s.insert(KubeObject::PersistentVolumeClaim(Arc::new(o.clone())));
        }
        for o in &self.pvs {
            s.insert(KubeObject::PersistentVolume(Arc::new(o.clone())));
        }
        for o in &self.secrets {
            s.insert(KubeObject::Secret(Arc::new(o.clone())));
        }
        if let Some(n) = &self.node {
            s.set_node_name(n.metadata.name.as_deref().unwrap_or("node"));
            s.insert(KubeObject::Node(Arc::new(n.clone())));
        }
        s
    }
}

#[test]
fn image_volumes_need_a_reference() {
    let p = with_volumes(
        Some("u-1"),
        serde_json::json!([
            {"name": "img", "image": {"reference": "quay.io/x/y:v1", "pullPolicy": "Always"}},
            {"name": "bad", "image": {}},
        ]),
    );
    let d = DesiredPod::from_pod(&p).unwrap();
    assert_eq!(
        d.volumes[0].source,
        Ok(VolumeSource::Image {
            reference: "quay.io/x/y:v1".into(),
            pull_policy: Some("Always".into())
        })
    );
    let e = d.volumes[1].source.clone().unwrap_err().to_string();
    assert!(e.contains("image.reference is required"), "{e}");
}

#[test]
fn local_persistent_volumes_resolve_to_a_local_source() {
    let local =
        |path: &str| serde_json::json!({"csi": null, "local": {"path": path, "fsType": "ext4"}});
    let mut o = Objects::default();
    o.pvcs.push(pvc("claim", Some("pv-local")));
    o.pvs
        .push(pv("pv-local", Some("claim"), local("/mnt/disks/a")));
    let mut p = pvc_pod("claim", false);
    let r = resolve(&p, &o);
    assert_eq!(
        r,
        Ok(VolumeSource::Local(crate::volume::LocalVolumeSource {
            pv_name: "pv-local".into(),
            path: "/mnt/disks/a".into(),
            read_only: false,
            volume_mode: CsiVolumeMode::Filesystem,
        }))
    );
    // The pod's readOnly makes it read-only.
    p.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0]
        .persistent_volume_claim
        .as_mut()
        .unwrap()
        .read_only = Some(true);
    assert!(matches!(resolve(&p, &o), Ok(VolumeSource::Local(l)) if l.read_only));
    // Block mode, used as a device.
    o.pvs[0] = pv(
        "pv-local",
        Some("claim"),
        serde_json::json!({"csi": null, "local": {"path": "/dev/sdb"}, "volumeMode": "Block"}),
    );
    let r = resolve(&pvc_pod("claim", true), &o);
    assert!(matches!(r, Ok(VolumeSource::Local(l)) if l.volume_mode == CsiVolumeMode::Block));
    // Unclean paths are refused.
    o.pvs[0] = pv("pv-local", Some("claim"), local("/mnt/../etc"));
    let e = resolve(&pvc_pod("claim", false), &o).unwrap_err();
    assert!(e.contains("spec.local.path") && e.contains(".."), "{e}");
    // Node affinity, when the node is known.
    let mut with_affinity = local("/mnt/disks/a");
    with_affinity["nodeAffinity"] = serde_json::json!({"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}});
    o.pvs[0] = pv("pv-local", Some("claim"), with_affinity);
    assert!(
        resolve(&pvc_pod("claim", false), &o).is_ok(),
        "no node known: not checked"
    );
    o.node = Some(
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n2", "labels": {"kubernetes.io/hostname": "n2"}}}))
                .unwrap(),
        );
    let e = resolve(&pvc_pod("claim", false), &o).unwrap_err();
    assert!(
        e.contains("node affinity does not match node \"n2\""),
        "{e}"
    );
}

fn pvc(name: &str, volume_name: Option<&str>) -> PersistentVolumeClaim {
    let mut v = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": "pvc-uid"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    });
    if let Some(n) = volume_name {
        v["spec"]["volumeName"] = n.into();
    }
    serde_json::from_value(v).unwrap()
}

fn pv(name: &str, claim: Option<&str>, extra: serde_json::Value) -> PersistentVolume {
    let mut v = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "64Mi"},
            "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
            "csi": {"driver": "test.csi.volmgr.io", "volumeHandle": "vol-1"},
        }
    });
    if let Some(c) = claim {
        v["spec"]["claimRef"] = serde_json::json!({"namespace": "ns", "name": c});
    }
    merge(&mut v["spec"], extra);
    serde_json::from_value(v).unwrap()
}

fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn secret(name: &str, data: serde_json::Value) -> Secret {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "ns"}, "data": data
    }))
    .unwrap()
}

fn pvc_pod(claim: &str, device: bool) -> Pod {
    let use_ = if device {
        serde_json::json!({"volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]})
    } else {
        serde_json::json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]})
    };
    let mut c = serde_json::json!({"name": "c", "image": "i"});
    merge(&mut c, use_);
    pod(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
        "spec": {"containers": [c], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}
    }))
}

fn resolve(p: &Pod, o: &Objects) -> Result<VolumeSource, String> {
    let d = DesiredPod::from_pod_with(p, Some(&o.store())).unwrap();
    assert_eq!(d.volumes.len(), 1);
    d.volumes[0].source.clone().map_err(|e| e.to_string())
}

fn csi_of(r: Result<VolumeSource, String>) -> CsiVolumeSource {
    match r {
        Ok(VolumeSource::Csi(c)) => *c,
        other => panic!("not a CSI source: {other:?}"),
    }
}

#[test]
fn inline_csi_volume() {
    let p = with_volumes(
        Some("uid-1"),
        serde_json::json!([{"name": "vol", "csi": {
                "driver": "test.csi.volmgr.io", "readOnly": true, "fsType": "ext4",
                "volumeAttributes": {"size": "64Mi"}}}]),
    );
    let c = csi_of(
        DesiredPod::from_pod(&p).unwrap().volumes[0]
            .source
            .clone()
            .map_err(|e| e.to_string()),
    );
    assert_eq!(c.volume_handle, HANDLE_UID1_VOL);
    assert!(c.ephemeral && c.read_only);
    assert_eq!(c.pv_name, None);
    assert_eq!(c.fs_type.as_deref(), Some("ext4"));
    assert_eq!(c.volume_mode, CsiVolumeMode::Filesystem);
    assert_eq!(c.access_mode, CsiAccessMode::SingleNodeWriter);
    assert_eq!(c.volume_attributes["size"], "64Mi");
    assert!(c.node_publish_secrets.is_none());

    // A publish secret from the pod's namespace.
    let p = with_volumes(
        Some("uid-1"),
        serde_json::json!([{"name": "vol", "csi": {
                "driver": "d", "nodePublishSecretRef": {"name": "creds"}}}]),
    );
    let e = DesiredPod::from_pod(&p).unwrap().volumes[0]
        .source
        .clone()
        .unwrap_err()
        .to_string();
    assert!(e.contains("Secret ns/creds cannot be read"), "{e}");
    let mut o = Objects::default();
    let e = resolve(&p, &o).unwrap_err();
    assert!(e.contains("Secret ns/creds not found"), "{e}");
    o.secrets.push(secret(
        "creds",
        serde_json::json!({"password": "aHVudGVyMg=="}),
    ));
    let c = csi_of(resolve(&p, &o));
    let s = c.node_publish_secrets.unwrap();
    assert_eq!(s.0["password"], "hunter2");
}

#[test]
fn inline_csi_errors() {
    let d = DesiredPod::from_pod(&with_volumes(
        Some("u"),
        serde_json::json!([
            {"name": "nodriver", "csi": {"driver": ""}},
            {"name": "noref", "csi": {"driver": "d", "nodePublishSecretRef": {"name": ""}}},
        ]),
    ))
    .unwrap();
    assert!(d.volumes[0]
        .source
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("csi.driver is required"));
    assert!(d.volumes[1]
        .source
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("name is required"));
    let p = pod(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "uid": "u"},
        "spec": {"containers": [{"name": "c", "image": "i",
            "volumeDevices": [{"name": "v", "devicePath": "/dev/x"}]}],
            "volumes": [{"name": "v", "csi": {"driver": "d"}}]}
    }));
    let e = DesiredPod::from_pod(&p).unwrap().volumes[0]
        .source
        .clone()
        .unwrap_err()
        .to_string();
    assert!(e.contains("volumeDevices"), "{e}");
}

#[test]
fn pvc_to_csi_persistent_volume() {
    let mut o = Objects::default();
    o.pvcs.push(pvc("claim", Some("pv-1")));
    o.pvs.push(pv(
        "pv-1",
        Some("claim"),
        serde_json::json!({
            "mountOptions": ["noatime"],
            "csi": {
                "fsType": "ext4", "readOnly": false,
                "volumeAttributes": {"size": "64Mi"},
                "nodeStageSecretRef": {"name": "stage", "namespace": "ns"},
                "nodePublishSecretRef": {"name": "publish", "namespace": "ns"},
                "nodeExpandSecretRef": {"name": "expand", "namespace": "ns"},
            }
        }),
    ));
    for n in ["stage", "publish", "expand"] {
        o.secrets
            .push(secret(n, serde_json::json!({"key": "dmFsdWU="})));
    }
    let c = csi_of(resolve(&pvc_pod("claim", false), &o));
    assert_eq!(c.driver, "test.csi.volmgr.io");
    assert_eq!(c.volume_handle, "vol-1");
    assert!(!c.ephemeral && !c.read_only);
    assert_eq!(c.pv_name.as_deref(), Some("pv-1"));
    assert_eq!(c.fs_type.as_deref(), Some("ext4"));
    assert_eq!(c.volume_mode, CsiVolumeMode::Filesystem);
    // The first access mode, like the kubelet.
    assert_eq!(c.access_mode, CsiAccessMode::MultiNodeMultiWriter);
    assert_eq!(c.mount_options, vec!["noatime".to_string()]);
    assert_eq!(c.capacity_bytes, Some(64 << 20));
    assert_eq!(c.claim_capacity_bytes, None, "a claim without a status");
    assert_eq!(c.volume_attributes["size"], "64Mi");
    for s in [
        &c.node_stage_secrets,
        &c.node_publish_secrets,
        &c.node_expand_secrets,
    ] {
        assert_eq!(s.as_ref().unwrap().0["key"], "value");
    }
    // The claim's status.capacity: the size its file system has.
    let mut claim = pvc("claim", Some("pv-1"));
    claim.status =
        Some(serde_json::from_value(serde_json::json!({"capacity": {"storage": "32Mi"}})).unwrap());
    o.pvcs = vec![claim];
    let c = csi_of(resolve(&pvc_pod("claim", false), &o));
    assert_eq!(c.claim_capacity_bytes, Some(32 << 20));
    // Debug of the whole pod never shows a secret value.
    let d = DesiredPod::from_pod_with(&pvc_pod("claim", false), Some(&o.store())).unwrap();
    assert!(!format!("{d:?}").contains("value\""), "{d:?}");

    // The pod's readOnly makes the volume read-only.
    let mut p = pvc_pod("claim", false);
    p.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0]
        .persistent_volume_claim
        .as_mut()
        .unwrap()
        .read_only = Some(true);
    assert!(csi_of(resolve(&p, &o)).read_only);

    // Without objects, a PVC is left to host plugins.
    let d = DesiredPod::from_pod(&pvc_pod("claim", false)).unwrap();
    assert!(
        matches!(&d.volumes[0].source, Ok(VolumeSource::Other { kind, .. }) if kind == "persistentVolumeClaim")
    );
}

#[test]
fn pvc_bound_through_claim_ref_and_block_mode() {
    let mut o = Objects::default();
    o.pvcs.push(pvc("claim", None));
    o.pvs.push(pv(
        "pv-b",
        Some("claim"),
        serde_json::json!({"volumeMode": "Block", "accessModes": ["ReadWriteOncePod"]}),
    ));
    let c = csi_of(resolve(&pvc_pod("claim", true), &o));
    assert_eq!(c.pv_name.as_deref(), Some("pv-b"));
    assert_eq!(c.volume_mode, CsiVolumeMode::Block);
    assert_eq!(c.access_mode, CsiAccessMode::SingleNodeSingleWriter);
    let e = resolve(&pvc_pod("claim", false), &o).unwrap_err();
    assert!(
        e.contains("volumeMode Block, but the volume is in volumeMounts"),
        "{e}"
    );
}

#[test]
fn the_pv_gid_annotation_is_carried_when_it_parses() {
    let with_gid = |gid: Option<&str>| {
        let mut o = Objects::default();
        o.pvcs.push(pvc("claim", Some("pv-g")));
        let mut v = pv("pv-g", Some("claim"), serde_json::json!({}));
        if let Some(g) = gid {
            v.metadata.annotations = Some(
                [(
                    super::super::claim::VOLUME_GID_ANNOTATION.to_string(),
                    g.to_string(),
                )]
                .into_iter()
                .collect(),
            );
        }
        o.pvs.push(v);
        csi_of(resolve(&pvc_pod("claim", false), &o)).supplemental_gid
    };
    assert_eq!(with_gid(Some("1234")), Some(1234));
    assert_eq!(with_gid(Some("not-a-number")), None);
    assert_eq!(with_gid(None), None);
}

#[test]
fn pvc_resolution_errors() {
    let p = pvc_pod("claim", false);
    let check = |o: &Objects, want: &str| {
        let e = resolve(&p, o).unwrap_err();
        assert!(e.contains(want), "{e:?} should contain {want:?}");
    };
    let mut o = Objects::default();
    check(&o, "PersistentVolumeClaim ns/claim not found");
    o.pvcs.push(pvc("claim", None));
    check(&o, "PersistentVolumeClaim ns/claim is not bound");
    o.pvcs[0] = pvc("claim", Some("pv-1"));
    check(
        &o,
        "PersistentVolume pv-1 (bound to PersistentVolumeClaim ns/claim) not found",
    );
    o.pvs.push(pv("pv-1", Some("other"), serde_json::json!({})));
    check(
        &o,
        "PersistentVolume pv-1 is bound to claim ns/other, not to ns/claim",
    );
    o.pvs[0] = pv("pv-1", Some("claim"), serde_json::json!({}));
    o.pvs[0]
        .spec
        .as_mut()
        .unwrap()
        .claim_ref
        .as_mut()
        .unwrap()
        .uid = Some("someone-else".into());
    check(&o, "is bound to claim ns/claim, not to ns/claim");
    // iSCSI and FC: named, with the CSI driver to use instead (before:
    // only "is not a CSI volume (source iscsi)").
    o.pvs[0] = pv(
        "pv-1",
        None,
        serde_json::json!({"csi": null, "iscsi": {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.2001-04.com.example:a", "lun": 0}}),
    );
    check(
        &o,
        "PersistentVolume pv-1 is not a CSI volume (source iscsi)",
    );
    check(&o, "use an iSCSI CSI driver (iscsi.csi.k8s.io");
    o.pvs[0] = pv(
        "pv-1",
        None,
        serde_json::json!({"csi": null, "fc": {"targetWWNs": ["500a0982991b8dc5"], "lun": 2}}),
    );
    check(&o, "PersistentVolume pv-1 is not a CSI volume (source fc)");
    check(&o, "Fibre Channel CSI driver");
    for (extra, want) in [
        (
            serde_json::json!({"csi": {"driver": ""}}),
            "spec.csi.driver is required",
        ),
        (
            serde_json::json!({"csi": {"volumeHandle": ""}}),
            "spec.csi.volumeHandle is required",
        ),
        (
            serde_json::json!({"volumeMode": "Tape"}),
            "unknown volumeMode \"Tape\"",
        ),
        (
            serde_json::json!({"volumeMode": "Block"}),
            "volumeMode Block, but the volume is in volumeMounts",
        ),
        (
            serde_json::json!({"accessModes": ["ReadSometimes"]}),
            "unknown access mode",
        ),
        (
            serde_json::json!({"capacity": {"storage": "lots"}}),
            "capacity.storage",
        ),
        (
            serde_json::json!({"csi": {"nodeStageSecretRef": {"name": "s"}}}),
            "nodeStageSecretRef: name and namespace are required",
        ),
        (
            serde_json::json!({"csi": {"nodeExpandSecretRef": {"name": "s", "namespace": "ns"}}}),
            "spec.csi.nodeExpandSecretRef: Secret ns/s not found",
        ),
    ] {
        o.pvs[0] = pv("pv-1", None, extra);
        check(&o, want);
    }
    o.pvs[0] = pv(
        "pv-1",
        None,
        serde_json::json!({"csi": {"nodePublishSecretRef": {"name": "s", "namespace": "ns"}}}),
    );
    o.secrets
        .push(secret("s", serde_json::json!({"k": "/w=="})));
    check(&o, "key \"k\" is not valid UTF-8");
    o.pvs[0] = pv(
        "pv-1",
        None,
        serde_json::json!({"volumeMode": "Filesystem"}),
    );
    let e = resolve(&pvc_pod("claim", true), &o).unwrap_err();
    assert!(
        e.contains("volumeMode Filesystem, but the volume is in volumeDevices"),
        "{e}"
    );
    let mut lost = pvc("claim", Some("pv-1"));
    lost.status = Some(serde_json::from_value(serde_json::json!({"phase": "Lost"})).unwrap());
    o.pvcs[0] = lost;
    check(&o, "phase Lost");
    let mut deleted = pvc("claim", Some("pv-1"));
    deleted.metadata.deletion_timestamp =
        Some(serde_json::from_value(serde_json::json!("2024-01-01T00:00:00Z")).unwrap());
    o.pvcs[0] = deleted;
    check(&o, "is being deleted");
    let p2 = pvc_pod("", false);
    let e = resolve(&p2, &o).unwrap_err();
    assert!(e.contains("claimName is required"), "{e}");
}

#[test]
fn generic_ephemeral_volume_uses_the_pods_own_claim() {
    let p = pod(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
        "spec": {
            "containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "scratch", "mountPath": "/s"}]}],
            "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}]
        }
    }));
    assert!(needs_objects(&p));
    let mut o = Objects::default();
    let e = resolve(&p, &o).unwrap_err();
    assert!(
        e.contains("PersistentVolumeClaim ns/p-scratch not found"),
        "{e}"
    );
    let owned = |uid: &str| {
        let mut c = pvc("p-scratch", Some("pv-e"));
        c.metadata.owner_references = Some(vec![serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "name": "p", "uid": uid, "controller": true
        }))
        .unwrap()]);
        c
    };
    o.pvcs.push(owned("someone-else"));
    o.pvs
        .push(pv("pv-e", Some("p-scratch"), serde_json::json!({})));
    let e = resolve(&p, &o).unwrap_err();
    assert!(e.contains("was not created for this pod"), "{e}");
    o.pvcs[0] = owned("uid-1");
    let c = csi_of(resolve(&p, &o));
    assert_eq!(c.pv_name.as_deref(), Some("pv-e"));
    assert!(!c.ephemeral, "a PV-backed volume, shared by handle");
    // Without objects it stays for host plugins.
    let d = DesiredPod::from_pod(&p).unwrap();
    assert!(
        matches!(&d.volumes[0].source, Ok(VolumeSource::Other { kind, .. }) if kind == "ephemeral")
    );
}

#[test]
fn needs_objects_only_for_pvcs_csi_and_secret_refs() {
    assert!(needs_objects(&pvc_pod("c", false)));
    assert!(!needs_objects(&with_volumes(
        Some("u"),
        serde_json::json!([{"name": "a", "emptyDir": {}}])
    )));
    // An inline CSI volume reads its driver's CSIDriver object.
    assert!(needs_objects(&with_volumes(
        Some("u"),
        serde_json::json!([{"name": "b", "csi": {"driver": "d"}}])
    )));
    assert!(needs_objects(&with_volumes(
        Some("u"),
        serde_json::json!([{"name": "b", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s"}}}])
    )));
}

#[test]
fn a_zero_size_limit_is_no_limit() {
    for zero in ["0", "0Mi", "0.0"] {
        let ed = k8s_openapi::api::core::v1::EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                zero.into(),
            )),
            ..Default::default()
        };
        assert_eq!(
            empty_dir_source(&ed).unwrap(),
            VolumeSource::EmptyDir {
                medium: StorageMedium::Memory,
                size_limit: None
            },
            "{zero}"
        );
    }
}

/// One rule for every source (the API, manifests, the C ABI): the
/// `terminated` of a converted pod is the kubelet's.
#[test]
fn terminated_as_the_kubelet_decides() {
    let running = serde_json::json!({"state": {"running": {}}, "name": "c", "image": "i", "ready": true, "restartCount": 0, "imageID": "", "containerID": ""});
    let exited = serde_json::json!({"state": {"terminated": {"exitCode": 0}}, "name": "c", "image": "i", "ready": false, "restartCount": 0, "imageID": "", "containerID": ""});
    let waiting = serde_json::json!({"state": {"waiting": {}}, "name": "w", "image": "i", "ready": false, "restartCount": 0, "imageID": "", "containerID": ""});
    let p = |phase: &str, deleting: bool, statuses: Vec<serde_json::Value>| {
        let mut meta = serde_json::json!({"name": "p", "uid": "u"});
        if deleting {
            meta["deletionTimestamp"] = serde_json::json!("2026-11-24T00:00:00Z");
        }
        pod(
            serde_json::json!({"metadata": meta, "status": {"phase": phase, "containerStatuses": statuses}}),
        )
    };
    assert!(!is_terminated(&p("Running", false, vec![running.clone()])));
    assert!(is_terminated(&p("Succeeded", false, vec![])));
    assert!(is_terminated(&p("Failed", false, vec![running.clone()])));
    assert!(
        !is_terminated(&p("Running", true, vec![running.clone(), exited.clone()])),
        "a container still runs: its volumes stay"
    );
    assert!(is_terminated(&p("Running", true, vec![exited, waiting])));
    assert!(is_terminated(&p("Pending", true, vec![])));
    assert!(!is_terminated(&p("Pending", false, vec![])));
}

#[test]
fn a_deleted_pod_with_nothing_running_converts_terminated() {
    let p = pod(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "deletionTimestamp": "2026-11-24T00:00:00Z"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "containerStatuses": [{"state": {"terminated": {"exitCode": 0}}, "name": "c", "image": "i", "ready": false, "restartCount": 0, "imageID": "", "containerID": ""}]}
    }));
    assert!(DesiredPod::from_pod(&p).unwrap().terminated);
}

/// An NFS PersistentVolume resolves for the NFS plugin: the API JSON named
/// after the PV, with its `mountOptions` and the claim's `readOnly` (before:
/// "PersistentVolume pv-n is not a CSI volume (source nfs)").
#[test]
fn nfs_pv_resolves_with_its_mount_options() {
    let mut o = Objects::default();
    o.pvcs.push(pvc("claim", Some("pv-n")));
    o.pvs.push(pv(
        "pv-n",
        Some("claim"),
        serde_json::json!({"csi": null, "nfs": {"server": "10.0.0.5", "path": "/exports"}, "mountOptions": ["nfsvers=4.1"]}),
    ));
    let Ok(VolumeSource::Other { kind, spec }) = resolve(&pvc_pod("claim", false), &o) else {
        panic!("not an nfs source");
    };
    assert_eq!(kind, "nfs");
    assert_eq!(spec["name"], "pv-n");
    assert_eq!(spec["nfs"]["server"], "10.0.0.5");
    assert_eq!(spec["mountOptions"][0], "nfsvers=4.1");
    assert_eq!(spec["readOnly"], false);
}

/// CSI migration through a claim: an `awsElasticBlockStore` PV becomes
/// the EBS CSI driver's volume, translated handle, marked migrated
/// (before: "is not a CSI volume (source awsElasticBlockStore)").
#[test]
fn in_tree_pv_is_migrated_to_csi() {
    let mut o = Objects::default();
    o.pvcs.push(pvc("claim", Some("pv-e")));
    o.pvs.push(pv(
        "pv-e",
        Some("claim"),
        serde_json::json!({"csi": null, "awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-123", "fsType": "ext4"}}),
    ));
    let c = csi_of(resolve(&pvc_pod("claim", false), &o));
    assert_eq!(
        (c.driver.as_str(), c.volume_handle.as_str()),
        ("ebs.csi.aws.com", "vol-123")
    );
    assert_eq!(c.fs_type.as_deref(), Some("ext4"));
    assert_eq!(c.migrated_from, Some("kubernetes.io/aws-ebs"));
    assert!(!c.ephemeral && c.can_attach());
    assert_eq!(
        c.volume_attributes.get("partition").map(String::as_str),
        Some("0")
    );
}

/// A migrated PV's translated topology is checked against the node's
/// labels, as the kubelet's `checkNodeAffinity` checks the translated PV
/// before `MountVolume`: the EBS zone label becomes
/// `topology.ebs.csi.aws.com/zone`, which the node gets when the EBS driver
/// registers. Before, the affinity was dropped and the volume mounted on a
/// node of another zone (or lacking the driver's label).
#[test]
fn migrated_pv_topology_is_checked_against_the_node() {
    let mut o = Objects::default();
    o.pvcs.push(pvc("claim", Some("pv-e")));
    let mut e = pv(
        "pv-e",
        Some("claim"),
        serde_json::json!({"csi": null, "awsElasticBlockStore": {"volumeID": "vol-123"}}),
    );
    e.metadata.labels = Some(
        [(
            "failure-domain.beta.kubernetes.io/zone".to_string(),
            "us-east-1a".to_string(),
        )]
        .into(),
    );
    o.pvs.push(e);
    let node = |zone: &str| {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n1",
            "labels": {"topology.ebs.csi.aws.com/zone": zone}}}))
        .unwrap()
    };
    o.node = Some(node("us-east-1b"));
    let e = resolve(&pvc_pod("claim", false), &o).unwrap_err();
    // Waited through as the kubelet's failing mount (a message starting
    // "PersistentVolume" would be a pod error: `unresolved_kind`).
    assert!(
        e.starts_with("MountVolume.NodeAffinity check failed for volume \"pv-e\": ")
            && e.contains("topology.ebs.csi.aws.com/zone In [\"us-east-1a\"]")
            && e.contains("node \"n1\" (labels topology.ebs.csi.aws.com/zone=\"us-east-1b\")"),
        "{e}"
    );
    o.node = Some(node("us-east-1a"));
    let c = csi_of(resolve(&pvc_pod("claim", false), &o));
    assert_eq!(c.driver, "ebs.csi.aws.com");
}

/// Any PersistentVolume's node affinity is checked against the node, as
/// the kubelet's `checkNodeAffinity` before every `MountVolume` and
/// `MapVolume` (a CSI PV's topology, a hostPath PV of
/// local-path-provisioner bound to one node): not matching, the volume
/// waits with the kubelet's error; matching, it resolves. Before, only
/// local and migrated PVs were checked.
#[test]
fn every_pvs_node_affinity_is_checked_against_the_node() {
    let affinity = serde_json::json!({"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}});
    let node = |name: &str| {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name,
            "labels": {"kubernetes.io/hostname": name}}}))
        .unwrap()
    };
    for extra in [
        serde_json::json!({}),
        serde_json::json!({"csi": null, "hostPath": {"path": "/var/local-path/pv"}}),
    ] {
        let mut o = Objects::default();
        o.pvcs.push(pvc("claim", Some("pv-a")));
        let mut spec = affinity.clone();
        merge(&mut spec, extra.clone());
        o.pvs.push(pv("pv-a", Some("claim"), spec));
        o.node = Some(node("n2"));
        let e = resolve(&pvc_pod("claim", false), &o).unwrap_err();
        assert!(
            e.starts_with("MountVolume.NodeAffinity check failed for volume \"pv-a\": its node affinity (kubernetes.io/hostname In [\"n1\"])")
                && e.contains("node \"n2\" (labels kubernetes.io/hostname=\"n2\")"),
            "{extra}: {e}"
        );
        o.node = Some(node("n1"));
        assert!(resolve(&pvc_pod("claim", false), &o).is_ok(), "{extra}");
    }
}

/// An inline in-tree volume is migrated too (the kubelet's
/// `TranslateInTreeInlineVolumeToCSI`): persistent (attachable), with the
/// translated access mode.
#[test]
fn inline_in_tree_volume_is_migrated_to_csi() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {
            "containers": [{"name": "c", "volumeMounts": [{"name": "pd", "mountPath": "/d"}]}],
            "volumes": [{"name": "pd", "gcePersistentDisk": {"pdName": "disk-1", "readOnly": true}}]
        }
    }))
    .unwrap();
    let d = DesiredPod::from_pod_with(&pod, Some(&ObjectStore::default())).unwrap();
    let Ok(VolumeSource::Csi(c)) = &d.volumes[0].source else {
        panic!("{:?}", d.volumes[0].source);
    };
    assert_eq!(c.driver, "pd.csi.storage.gke.io");
    assert_eq!(
        c.volume_handle,
        "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1"
    );
    assert!(c.read_only && !c.ephemeral);
    assert_eq!(
        c.access_mode,
        crate::volume::CsiAccessMode::MultiNodeReaderOnly
    );
    assert_eq!(c.migrated_from, Some("kubernetes.io/gce-pd"));
}
