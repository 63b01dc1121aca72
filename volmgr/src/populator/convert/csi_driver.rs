//! What a CSI driver's `CSIDriver` object changes for one of its volumes,
//! as the kubelet's `pkg/volume/csi` applies it at mount time:
//!
//! - `volumeLifecycleModes`: an inline (`pod.spec.volumes[].csi`) volume of
//!   a driver whose CSIDriver does not list `Ephemeral` is refused;
//! - `podInfoOnMount`: NodePublishVolume's volume context gets
//!   `csi.storage.k8s.io/pod.name`, `pod.namespace`, `pod.uid`,
//!   `serviceAccount.name` and `ephemeral` (`getPodInfoAttrs`);
//! - `tokenRequests`: service account tokens for the driver, bound to the
//!   pod, in NodePublishVolume's `csi.storage.k8s.io/serviceAccount.tokens`
//!   (requested by the CSI plugin at publish time);
//! - `requiresRepublish`: NodePublishVolume again every
//!   `Config::csi_republish_period` on the mounted volume;
//! - `fsGroupPolicy`: who applies the pod's fsGroup (see
//!   `plugins/csi/fs_group.rs`);
//! - `attachRequired` (true unless the object says false): a volume from a
//!   PersistentVolume waits for its VolumeAttachment
//!   (`csi-<sha256(handle + driver + node)>`, the kubelet's
//!   `getAttachmentName`) to be attached to the pod's node, and its
//!   `status.attachmentMetadata` is the `publish_context` of NodeStage and
//!   NodePublish (the kubelet's `waitForVolumeAttachment`).
//!
//! Without a CSIDriver object nothing changes: the kubelet then treats a
//! driver as attachable and persistent-only, but volmgr runs drivers that
//! have none (the manifests directory, a kubelet fork through the C ABI),
//! so it keeps its behaviour of never waiting for an attachment and
//! accepting inline volumes there (docs/USAGE.md, "CSIDriver objects").

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIDriver;

use super::{pod_service_account, service_account_uid, VolumeSpecError};
use crate::populator::objects::ObjectStore;
use crate::volume::{
    CsiDriverInfo, CsiFsGroupPolicy, CsiTokenPod, CsiTokenRequest, CsiVolumeSource,
};

/// A token request's lifetime when the CSIDriver gives none (the API
/// server's default for a TokenRequest).
const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// The pod a volume is resolved for.
pub(super) struct PodFacts<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// Its UID as used (given or derived).
    pub uid: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
}

/// Applies the driver's CSIDriver object (if `objects` knows one) to `src`.
pub(super) fn apply(
    src: &mut CsiVolumeSource,
    pod: &PodFacts<'_>,
    objects: Option<&ObjectStore>,
) -> Result<(), VolumeSpecError> {
    let Some(objects) = objects else {
        return Ok(());
    };
    let Some(driver) = objects.get::<CSIDriver>("", &src.driver) else {
        return Ok(());
    };
    let spec = &driver.spec;
    if src.ephemeral && !lists_mode(&driver, "Ephemeral") {
        return Err(VolumeSpecError::Invalid(format!(
            "CSIDriver {} does not support inline (Ephemeral) volumes (volumeLifecycleModes: {})",
            src.driver,
            spec.volume_lifecycle_modes
                .as_ref()
                .map_or_else(|| "Persistent".to_string(), |m| m.join(", "))
        )));
    }
    let mut info = CsiDriverInfo {
        fs_group_policy: fs_group_policy(&driver)?,
        ..CsiDriverInfo::default()
    };
    if spec.pod_info_on_mount == Some(true) {
        info.pod_info = pod_info(pod, src.ephemeral);
    }
    info.requires_republish = spec.requires_republish == Some(true);
    if let Some(requests) = spec.token_requests.as_ref().filter(|r| !r.is_empty()) {
        info.token_requests = requests
            .iter()
            .map(|r| CsiTokenRequest {
                audience: r.audience.clone(),
                expiration_seconds: r.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
            })
            .collect();
        let service_account = pod_service_account(pod.pod);
        info.token_pod = Some(CsiTokenPod {
            namespace: pod.namespace.to_string(),
            service_account_uid: service_account_uid(
                Some(objects),
                pod.namespace,
                &service_account,
            ),
            service_account,
            pod_name: pod.name.to_string(),
            pod_uid: pod.uid.to_string(),
        });
    }
    // The label itself is the desired state's (`cache::selinux`).
    info.selinux_mount = spec.se_linux_mount == Some(true);
    info.skip_attach = spec.attach_required == Some(false);
    if !src.ephemeral && !info.skip_attach {
        info.publish_context = attachment_metadata(src, pod, objects)?;
    }
    src.driver_info = std::sync::Arc::new(info);
    Ok(())
}

/// Whether the CSIDriver lists lifecycle mode `mode` (default: Persistent).
fn lists_mode(driver: &CSIDriver, mode: &str) -> bool {
    match &driver.spec.volume_lifecycle_modes {
        Some(modes) if !modes.is_empty() => modes.iter().any(|m| m == mode),
        _ => mode == "Persistent",
    }
}

fn fs_group_policy(driver: &CSIDriver) -> Result<CsiFsGroupPolicy, VolumeSpecError> {
    match driver.spec.fs_group_policy.as_deref() {
        None | Some("ReadWriteOnceWithFSType") => Ok(CsiFsGroupPolicy::ReadWriteOnceWithFsType),
        Some("File") => Ok(CsiFsGroupPolicy::File),
        Some("None") => Ok(CsiFsGroupPolicy::None),
        Some(other) => Err(VolumeSpecError::Invalid(format!(
            "CSIDriver {}: unknown fsGroupPolicy {other:?}",
            driver.metadata.name.as_deref().unwrap_or("")
        ))),
    }
}

/// The kubelet's `getPodInfoAttrs`.
fn pod_info(pod: &PodFacts<'_>, ephemeral: bool) -> std::collections::BTreeMap<String, String> {
    let account = pod
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();
    [
        ("csi.storage.k8s.io/pod.name", pod.name.to_string()),
        (
            "csi.storage.k8s.io/pod.namespace",
            pod.namespace.to_string(),
        ),
        ("csi.storage.k8s.io/pod.uid", pod.uid.to_string()),
        ("csi.storage.k8s.io/serviceAccount.name", account),
        ("csi.storage.k8s.io/ephemeral", ephemeral.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The kubelet's `getAttachmentName`: `csi-` and the hex SHA-256 of the
/// volume handle, the driver name and the node name, concatenated.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(volume_handle.as_bytes());
    h.update(driver.as_bytes());
    h.update(node.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// The attachment metadata of the volume's VolumeAttachment to the pod's
/// node, once attached; until then the volume waits (a "missing" error
/// that clears when the VolumeAttachment changes).
fn attachment_metadata(
    src: &CsiVolumeSource,
    pod: &PodFacts<'_>,
    objects: &ObjectStore,
) -> Result<std::collections::BTreeMap<String, String>, VolumeSpecError> {
    let node = pod
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            VolumeSpecError::Invalid(format!(
                "CSIDriver {} requires attachment: the pod needs spec.nodeName to name its VolumeAttachment",
                src.driver
            ))
        })?;
    let name = attachment_name(&src.volume_handle, &src.driver, node);
    let waiting = |why: &str| {
        VolumeSpecError::Missing(format!(
            "waiting for VolumeAttachment {name} (driver {}, volume {}, node {node}) {why}",
            src.driver, src.volume_handle
        ))
    };
    let va = objects
        .get::<k8s_openapi::api::storage::v1::VolumeAttachment>("", &name)
        .ok_or_else(|| waiting("to be created"))?;
    if va.spec.node_name != node {
        return Err(waiting("for this node"));
    }
    let status = va.status.as_ref();
    if let Some(e) = status
        .and_then(|s| s.attach_error.as_ref())
        .filter(|e| e.message.is_some() || e.error_code.is_some())
    {
        return Err(VolumeSpecError::AttachFailed(format!(
            "VolumeAttachment {name} (driver {}, volume {}, node {node}) failed to attach: {}",
            src.driver,
            src.volume_handle,
            attach_error_text(e)
        )));
    }
    match status {
        Some(s) if s.attached => Ok(s.attachment_metadata.clone().unwrap_or_default()),
        _ => Err(waiting("to be attached")),
    }
}

/// gRPC's `RESOURCE_EXHAUSTED`, as the external attacher puts a
/// ControllerPublishVolume failure's code in `attachError.errorCode`.
const RESOURCE_EXHAUSTED: i32 = 8;

/// A VolumeAttachment's `attachError` as told to the pod: with
/// `errorCode` `RESOURCE_EXHAUSTED` (the kubelet's
/// `VerifyExhaustedResource`), the node's attach limit of the driver was
/// exceeded, so the volume cannot attach here until another one detaches.
fn attach_error_text(e: &k8s_openapi::api::storage::v1::VolumeError) -> String {
    let message = e.message.as_deref().unwrap_or("no message");
    match e.error_code {
        Some(RESOURCE_EXHAUSTED) => {
            format!("the node's attach limit for the driver was exceeded (ResourceExhausted): {message}")
        }
        _ => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::populator::objects::{KubeObject, ObjectStore};
    use serde_json::json;

    fn source(ephemeral: bool) -> CsiVolumeSource {
        CsiVolumeSource {
            ephemeral,
            pv_name: (!ephemeral).then(|| "pv".into()),
            ..CsiVolumeSource::new("d.example.com", "vol-1")
        }
    }

    fn pod() -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"nodeName": "n1", "serviceAccountName": "sa", "containers": []}}),
        )
        .unwrap()
    }

    fn store(objects: Vec<serde_json::Value>) -> ObjectStore {
        let mut s = ObjectStore::default();
        for o in objects {
            s.insert(KubeObject::from_json(o).unwrap());
        }
        s
    }

    fn driver(spec: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
               "metadata": {"name": "d.example.com"}, "spec": spec})
    }

    fn run(src: &mut CsiVolumeSource, objects: &ObjectStore) -> Result<(), VolumeSpecError> {
        let p = pod();
        let facts = PodFacts {
            pod: &p,
            uid: "u1",
            namespace: "ns",
            name: "p",
        };
        apply(src, &facts, Some(objects))
    }

    #[test]
    fn attachment_name_is_the_kubelets() {
        // sha256("vol-1" + "d.example.com" + "n1")
        use sha2::Digest;
        let want = sha2::Sha256::digest(b"vol-1d.example.comn1");
        let hex: String = want.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            attachment_name("vol-1", "d.example.com", "n1"),
            format!("csi-{hex}")
        );
        assert_eq!(attachment_name("vol-1", "d.example.com", "n1").len(), 68);
    }

    #[test]
    fn without_a_csidriver_nothing_changes() {
        let mut s = source(true);
        run(&mut s, &store(vec![])).unwrap();
        assert_eq!(*s.driver_info, CsiDriverInfo::default());
    }

    #[test]
    fn pod_info_fs_group_policy_and_lifecycle_modes() {
        let objects = store(vec![driver(
            json!({"podInfoOnMount": true, "attachRequired": false,
            "fsGroupPolicy": "File", "volumeLifecycleModes": ["Persistent", "Ephemeral"],
            "tokenRequests": [{"audience": "vault"}, {"audience": "", "expirationSeconds": 600}]}),
        )]);
        let mut s = source(true);
        run(&mut s, &objects).unwrap();
        let want = vec![
            CsiTokenRequest {
                audience: "vault".into(),
                expiration_seconds: 3600,
            },
            CsiTokenRequest {
                audience: "".into(),
                expiration_seconds: 600,
            },
        ];
        assert_eq!(s.driver_info.token_requests, want);
        let bound = s.driver_info.token_pod.clone().unwrap();
        assert_eq!(
            (bound.service_account.as_str(), bound.pod_uid.as_str()),
            ("sa", "u1")
        );
        assert_eq!(s.driver_info.fs_group_policy, CsiFsGroupPolicy::File);
        let info = &s.driver_info.pod_info;
        assert_eq!(info["csi.storage.k8s.io/pod.name"], "p");
        assert_eq!(info["csi.storage.k8s.io/pod.namespace"], "ns");
        assert_eq!(info["csi.storage.k8s.io/pod.uid"], "u1");
        assert_eq!(info["csi.storage.k8s.io/serviceAccount.name"], "sa");
        assert_eq!(info["csi.storage.k8s.io/ephemeral"], "true");

        // attachRequired: false: not attachable (the kubelet's skipAttach).
        assert!(s.driver_info.skip_attach && !s.can_attach());
        let mut pv = source(false);
        assert!(pv.can_attach(), "no CSIDriver: attachable");
        run(&mut pv, &objects).unwrap();
        assert!(pv.driver_info.skip_attach && !pv.can_attach());

        let persistent_only = store(vec![driver(json!({"attachRequired": false}))]);
        let e = run(&mut source(true), &persistent_only).unwrap_err();
        assert!(e.to_string().contains("does not support inline"), "{e}");
        let bad = store(vec![driver(
            json!({"attachRequired": false, "fsGroupPolicy": "Sometimes"}),
        )]);
        assert!(run(&mut source(false), &bad).is_err());
    }

    #[test]
    fn attachable_volumes_wait_for_their_volume_attachment() {
        let name = attachment_name("vol-1", "d.example.com", "n1");
        let va = |attached: bool| {
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                "metadata": {"name": name},
                "spec": {"attacher": "d.example.com", "nodeName": "n1", "source": {"persistentVolumeName": "pv"}},
                "status": {"attached": attached, "attachmentMetadata": {"devicePath": "/dev/xvdf"}}})
        };
        let mut objects = store(vec![driver(json!({}))]);
        let e = run(&mut source(false), &objects).unwrap_err();
        assert!(matches!(e, VolumeSpecError::Missing(_)), "{e}");
        assert!(e.to_string().contains(&name), "{e}");
        objects.insert(KubeObject::from_json(va(false)).unwrap());
        assert!(run(&mut source(false), &objects).is_err());
        // The controller's attach error: the volume still waits, as an
        // attach failure (the pod's event is FailedAttachVolume).
        let mut failed = va(false);
        failed["status"]["attachError"] =
            json!({"message": "volume is in use by another instance"});
        objects.insert(KubeObject::from_json(failed).unwrap());
        let e = run(&mut source(false), &objects).unwrap_err();
        assert!(matches!(e, VolumeSpecError::AttachFailed(_)), "{e}");
        assert!(e.to_string().contains("in use by another instance"), "{e}");
        assert!(!e.to_string().contains("attach limit"), "{e}");
        // ResourceExhausted: the node's attach limit was exceeded.
        let mut exhausted = va(false);
        exhausted["status"]["attachError"] =
            json!({"message": "max volumes attached", "errorCode": 8});
        objects.insert(KubeObject::from_json(exhausted).unwrap());
        let e = run(&mut source(false), &objects).unwrap_err();
        assert!(matches!(e, VolumeSpecError::AttachFailed(_)), "{e}");
        assert!(
            e.to_string().ends_with("failed to attach: the node's attach limit for the driver was exceeded (ResourceExhausted): max volumes attached"),
            "{e}"
        );
        objects.insert(KubeObject::from_json(va(true)).unwrap());
        let mut s = source(false);
        run(&mut s, &objects).unwrap();
        assert_eq!(s.driver_info.publish_context["devicePath"], "/dev/xvdf");
        assert!(s.can_attach(), "attachRequired unset: attachable");
        // Inline volumes are never attached.
        let mut inline = source(true);
        let eph = store(vec![driver(json!({"volumeLifecycleModes": ["Ephemeral"]}))]);
        run(&mut inline, &eph).unwrap();
        assert!(inline.driver_info.publish_context.is_empty());
    }
}
