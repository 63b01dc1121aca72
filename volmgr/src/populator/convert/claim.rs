//! `persistentVolumeClaim` (and generic ephemeral) volumes: the claim in the
//! pod's namespace → its bound PersistentVolume → `spec.csi`, with the
//! kubelet's checks on each step (`desired_state_of_world_populator.go`
//! `getPVCExtractPV`, `getPVSpec`, `checkVolumeModeMismatch`).

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, SecretReference,
};

use super::{fetch_secret, invalid, Usage, VolumeSpecError};
use crate::populator::objects::ObjectStore;
use crate::quantity;
use crate::volume::{
    CsiAccessMode, CsiSecrets, CsiVolumeMode, CsiVolumeSource, PodUid, VolumeSource,
};

type Result<T, E = VolumeSpecError> = std::result::Result<T, E>;

/// A claim as the pod names it.
struct ClaimRef<'a> {
    namespace: &'a str,
    name: &'a str,
}

/// `pod.spec.volumes[].persistentVolumeClaim` → the claim (in the pod's
/// namespace) → its bound PersistentVolume → `spec.csi` (or `spec.local`,
/// or `spec.hostPath`). For a generic
/// ephemeral volume `owner` is the pod, which must control the claim (the
/// kubelet's `VolumeIsForPod`).
pub(super) fn persistent_volume_claim(
    src: &PersistentVolumeClaimVolumeSource,
    usage: Usage,
    namespace: &str,
    owner: Option<&PodUid>,
    objects: &ObjectStore,
    payloads: super::PayloadResolution,
) -> Result<VolumeSource> {
    let claim = ClaimRef {
        namespace,
        name: src.claim_name.as_str(),
    };
    if claim.name.is_empty() {
        return Err(invalid("persistentVolumeClaim.claimName is required"));
    }
    let pvc = usable_claim(&claim, owner, objects)?;
    let pv = bound_volume(&claim, &pvc, objects)?;
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv
        .spec
        .as_ref()
        .ok_or_else(|| invalid(format!("PersistentVolume {pv_name} has no spec")))?;
    check_claim_ref(&claim, &pvc, &pv_name, spec)?;
    if let Some(local) = &spec.local {
        let (read_only, mode) = (
            src.read_only.unwrap_or(false),
            volume_mode(&pv_name, spec, usage)?,
        );
        return super::local_pv::local_source(&pv_name, spec, local, read_only, mode, objects)
            .map(VolumeSource::Local);
    }
    if spec.host_path.is_some() || spec.nfs.is_some() {
        check_node_affinity(&pv_name, spec, objects, false)?;
    }
    if let Some(hp) = &spec.host_path {
        return host_path_pv(&pv_name, spec, hp, usage);
    }
    if let Some(nfs) = &spec.nfs {
        return nfs_source(&pv_name, spec, nfs, src.read_only.unwrap_or(false), usage);
    }
    let (spec, migrated_from) = migrate(&pv, &pv_name, spec)?;
    let spec = spec.as_ref();
    check_node_affinity(&pv_name, spec, objects, migrated_from.is_some())?;
    let csi = csi_spec(&pv, &pv_name, spec)?;
    let volume_mode = volume_mode(&pv_name, spec, usage)?;
    let secret =
        |r: &Option<SecretReference>, field: &str| -> Result<Option<std::sync::Arc<CsiSecrets>>> {
            match payloads {
                super::PayloadResolution::Full => secret_of(objects, &pv_name, r, field),
                // A Secret's content never changes the volume's name.
                super::PayloadResolution::NamesOnly => Ok(None),
            }
        };
    Ok(VolumeSource::Csi(Box::new(CsiVolumeSource {
        driver: csi.driver.clone(),
        volume_handle: csi.volume_handle.clone(),
        ephemeral: false,
        read_only: src.read_only.unwrap_or(false) || csi.read_only.unwrap_or(false),
        fs_type: csi.fs_type.clone().filter(|f| !f.is_empty()),
        volume_mode,
        access_mode: access_mode(&pv_name, spec)?,
        volume_attributes: csi.volume_attributes.clone().unwrap_or_default(),
        mount_options: spec.mount_options.clone().unwrap_or_default(),
        capacity_bytes: capacity(&pv_name, spec)?,
        claim_capacity_bytes: claim_capacity(&pvc),
        node_stage_secrets: secret(&csi.node_stage_secret_ref, "nodeStageSecretRef")?,
        node_publish_secrets: secret(&csi.node_publish_secret_ref, "nodePublishSecretRef")?,
        node_expand_secrets: secret(&csi.node_expand_secret_ref, "nodeExpandSecretRef")?,
        supplemental_gid: supplemental_gid(&pv),
        driver_info: Default::default(),
        migrated_from,
        pv_name: Some(pv_name),
        claim_name: Some(claim.name.to_string()),
    })))
}

/// An NFS PersistentVolume, for the NFS plugin (kept as the API JSON, as
/// an inline `nfs` volume is): the PV's server, path and `readOnly`, its
/// `mountOptions`, the claim's `readOnly`, named after the PV (the
/// kubelet's directory `kubernetes.io~nfs/<pv>`).
fn nfs_source(
    pv_name: &str,
    spec: &PersistentVolumeSpec,
    nfs: &k8s_openapi::api::core::v1::NFSVolumeSource,
    claim_read_only: bool,
    usage: Usage,
) -> Result<VolumeSource> {
    if volume_mode(pv_name, spec, usage)? == CsiVolumeMode::Block {
        return Err(VolumeSpecError::Unsupported(format!(
            "PersistentVolume {pv_name}: an NFS volume has no block mode"
        )));
    }
    let json = serde_json::json!({
        "name": pv_name,
        "nfs": nfs,
        "readOnly": claim_read_only,
        "mountOptions": spec.mount_options.clone().unwrap_or_default(),
    });
    Ok(VolumeSource::Other {
        kind: "nfs".into(),
        spec: std::sync::Arc::new(json),
    })
}

/// A hostPath PersistentVolume: the kubelet's hostPath plugin serves them
/// too (local-path-provisioner, kind and minikube make them), with the same
/// path and type checks as an inline hostPath; no block mode.
fn host_path_pv(
    pv_name: &str,
    spec: &PersistentVolumeSpec,
    hp: &k8s_openapi::api::core::v1::HostPathVolumeSource,
    usage: Usage,
) -> Result<VolumeSource, VolumeSpecError> {
    if volume_mode(pv_name, spec, usage)? == CsiVolumeMode::Block {
        return Err(VolumeSpecError::Unsupported(format!(
            "PersistentVolume {pv_name}: a hostPath volume has no block mode"
        )));
    }
    super::host_path::host_path_source(hp)
}

/// CSI migration (the kubelet's `TranslateInTreePVToCSI`): the spec of an
/// in-tree cloud PersistentVolume with its CSI source, access modes and
/// node affinity (topology) in place, and the in-tree plugin it came from;
/// any other spec unchanged.
fn migrate<'a>(
    pv: &PersistentVolume,
    pv_name: &str,
    spec: &'a PersistentVolumeSpec,
) -> Result<(
    std::borrow::Cow<'a, PersistentVolumeSpec>,
    Option<&'static str>,
)> {
    let migrated = super::migration::translate_pv(pv)
        .transpose()
        .map_err(|e| invalid(format!("PersistentVolume {pv_name}: CSI migration: {e}")))?;
    let Some(m) = migrated else {
        return Ok((std::borrow::Cow::Borrowed(spec), None));
    };
    let translated = PersistentVolumeSpec {
        csi: Some(m.csi),
        access_modes: m.access_modes,
        node_affinity: m.node_affinity,
        ..spec.clone()
    };
    Ok((std::borrow::Cow::Owned(translated), Some(m.in_tree_plugin)))
}

/// The kubelet's `checkNodeAffinity` before `MountVolume` and `MapVolume`
/// of any PersistentVolume (a local one is checked as it is resolved): its
/// node affinity (as CSI migration translated it, for a `migrated` one)
/// must match the node's labels, when the Node is known. Missing, not
/// invalid: the label may come (a CSI driver's topology label is set when
/// it registers), and the Node is followed; the kubelet retries the mount
/// too. The text does not start with "PersistentVolume": that would make
/// it a pod error.
fn check_node_affinity(
    pv_name: &str,
    spec: &PersistentVolumeSpec,
    objects: &ObjectStore,
    migrated: bool,
) -> Result<(), VolumeSpecError> {
    let Some(node) = objects.node() else {
        return Ok(());
    };
    let affinity = spec.node_affinity.as_ref();
    if super::local_pv::affinity_matches(affinity, &node) {
        return Ok(());
    }
    Err(VolumeSpecError::Missing(format!(
        "MountVolume.NodeAffinity check failed for volume {pv_name:?}: its node affinity{} ({}) does not match node {:?} ({}): no matching NodeSelectorTerms",
        if migrated { " as CSI migration translated it" } else { "" },
        describe_affinity(affinity),
        node.metadata.name.as_deref().unwrap_or(""),
        describe_node_labels(affinity, &node),
    )))
}

/// `key In ["v"], …` per term, terms joined by ` or ` (escaped).
fn describe_affinity(affinity: Option<&k8s_openapi::api::core::v1::VolumeNodeAffinity>) -> String {
    let terms = affinity
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    let term = |t: &k8s_openapi::api::core::v1::NodeSelectorTerm| {
        let reqs = t.match_expressions.iter().chain(t.match_fields.iter());
        let reqs: Vec<String> = reqs
            .flatten()
            .map(|r| {
                let values = r.values.as_deref().unwrap_or_default();
                format!(
                    "{} {} {values:?}",
                    r.key.escape_debug(),
                    r.operator.escape_debug()
                )
            })
            .collect();
        reqs.join(", ")
    };
    terms.iter().map(term).collect::<Vec<_>>().join(" or ")
}

/// The node's labels of the keys the affinity names: `key="value"` or
/// `key unset` (escaped).
fn describe_node_labels(
    affinity: Option<&k8s_openapi::api::core::v1::VolumeNodeAffinity>,
    node: &k8s_openapi::api::core::v1::Node,
) -> String {
    let keys: std::collections::BTreeSet<&str> = affinity
        .and_then(|a| a.required.as_ref())
        .into_iter()
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
        .map(|r| r.key.as_str())
        .collect();
    let labels = node.metadata.labels.as_ref();
    let show = |k: &str| match labels.and_then(|l| l.get(k)) {
        Some(v) => format!("{}={v:?}", k.escape_debug()),
        None => format!("{} unset", k.escape_debug()),
    };
    let shown: Vec<String> = keys.into_iter().map(show).collect();
    format!("labels {}", shown.join(", "))
}

/// The PersistentVolume's `pv.beta.kubernetes.io/gid` annotation as an
/// integer; absent or invalid is `None` (the kubelet's
/// `getExtraSupplementalGID` ignores a value that does not parse).
fn supplemental_gid(pv: &PersistentVolume) -> Option<i64> {
    pv.metadata
        .annotations
        .as_ref()?
        .get(VOLUME_GID_ANNOTATION)?
        .parse()
        .ok()
}

/// The annotation of a PersistentVolume naming a group that pods using it
/// get as a supplemental group (the kubelet's `VolumeGidAnnotationKey`).
pub const VOLUME_GID_ANNOTATION: &str = "pv.beta.kubernetes.io/gid";

/// The claim, if it exists, belongs to `owner` (when given), and is neither
/// being deleted nor lost.
fn usable_claim(
    claim: &ClaimRef<'_>,
    owner: Option<&PodUid>,
    objects: &ObjectStore,
) -> Result<std::sync::Arc<PersistentVolumeClaim>> {
    let (namespace, name) = (claim.namespace, claim.name);
    let pvc = objects
        .get::<PersistentVolumeClaim>(namespace, name)
        .ok_or_else(|| {
            VolumeSpecError::Missing(format!(
                "PersistentVolumeClaim {namespace}/{name} not found"
            ))
        })?;
    if let Some(pod) = owner {
        let controlled = pvc
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.controller == Some(true) && r.kind == "Pod" && r.uid == pod.as_str());
        if !controlled {
            return Err(invalid(format!(
                "PersistentVolumeClaim {namespace}/{name} was not created for this pod (the pod is not its controlling owner)"
            )));
        }
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(VolumeSpecError::Missing(format!(
            "PersistentVolumeClaim {namespace}/{name} is being deleted"
        )));
    }
    if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
        return Err(VolumeSpecError::Missing(format!(
            "PersistentVolumeClaim {namespace}/{name} has lost its PersistentVolume (phase Lost)"
        )));
    }
    Ok(pvc)
}

/// The PersistentVolume the claim is bound to: `spec.volumeName`, or the PV
/// whose `claimRef` names the claim.
fn bound_volume(
    claim: &ClaimRef<'_>,
    pvc: &PersistentVolumeClaim,
    objects: &ObjectStore,
) -> Result<std::sync::Arc<PersistentVolume>> {
    let (namespace, name) = (claim.namespace, claim.name);
    let volume_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty());
    match volume_name {
        Some(pv_name) => objects.get::<PersistentVolume>("", pv_name).ok_or_else(|| {
            VolumeSpecError::Missing(format!(
                "PersistentVolume {pv_name} (bound to PersistentVolumeClaim {namespace}/{name}) not found"
            ))
        }),
        None => objects.persistent_volume_for_claim(namespace, name).ok_or_else(|| {
            VolumeSpecError::Missing(format!(
                "PersistentVolumeClaim {namespace}/{name} is not bound (no spec.volumeName, and no PersistentVolume has a claimRef to it)"
            ))
        }),
    }
}

/// The PV must be bound to this very claim (the kubelet's claimRef check).
fn check_claim_ref(
    claim: &ClaimRef<'_>,
    pvc: &PersistentVolumeClaim,
    pv_name: &str,
    spec: &PersistentVolumeSpec,
) -> Result<()> {
    let Some(r) = &spec.claim_ref else {
        return Ok(());
    };
    let (rns, rname) = (
        r.namespace.as_deref().unwrap_or(""),
        r.name.as_deref().unwrap_or(""),
    );
    let uid_mismatch = match (&r.uid, &pvc.metadata.uid) {
        (Some(a), Some(b)) => !a.is_empty() && !b.is_empty() && a != b,
        _ => false,
    };
    if rns != claim.namespace || rname != claim.name || uid_mismatch {
        return Err(VolumeSpecError::Missing(format!(
            "PersistentVolume {pv_name} is bound to claim {rns}/{rname}, not to {}/{}",
            claim.namespace, claim.name
        )));
    }
    Ok(())
}

/// The PV's `spec.csi`, with its required fields.
fn csi_spec<'a>(
    pv: &PersistentVolume,
    pv_name: &str,
    spec: &'a PersistentVolumeSpec,
) -> Result<&'a CSIPersistentVolumeSource> {
    let csi = spec.csi.as_ref().ok_or_else(|| {
        let kind = pv_source_kind(pv);
        let hint = crate::volume::in_tree_alternative(&kind)
            .map(|a| format!(": {a}"))
            .unwrap_or_default();
        VolumeSpecError::Unsupported(format!(
            "PersistentVolume {pv_name} is not a CSI volume (source {kind}); only CSI, local, hostPath and CSI-migrated (awsElasticBlockStore, gcePersistentDisk, azureDisk, azureFile, cinder, vsphereVolume, portworxVolume) PersistentVolumes are supported{hint}"
        ))
    })?;
    if csi.driver.is_empty() {
        return Err(invalid(format!(
            "PersistentVolume {pv_name}: spec.csi.driver is required"
        )));
    }
    if csi.volume_handle.is_empty() {
        return Err(invalid(format!(
            "PersistentVolume {pv_name}: spec.csi.volumeHandle is required"
        )));
    }
    Ok(csi)
}

/// The PV's volume mode, checked against how the containers use the volume
/// (the kubelet's `checkVolumeModeMismatch`: Filesystem in volumeMounts,
/// Block in volumeDevices).
fn volume_mode(pv_name: &str, spec: &PersistentVolumeSpec, usage: Usage) -> Result<CsiVolumeMode> {
    let mode = match spec.volume_mode.as_deref().unwrap_or("Filesystem") {
        "Filesystem" | "" => CsiVolumeMode::Filesystem,
        "Block" => CsiVolumeMode::Block,
        m => {
            return Err(invalid(format!(
                "PersistentVolume {pv_name}: unknown volumeMode {m:?}"
            )))
        }
    };
    match mode {
        CsiVolumeMode::Filesystem if usage.device => Err(invalid(format!(
            "PersistentVolume {pv_name} has volumeMode Filesystem, but the volume is in volumeDevices"
        ))),
        CsiVolumeMode::Block if usage.mounted => Err(invalid(format!(
            "PersistentVolume {pv_name} has volumeMode Block, but the volume is in volumeMounts"
        ))),
        _ => Ok(mode),
    }
}

/// Like the kubelet: the first access mode, ReadWriteOnce by default.
fn access_mode(pv_name: &str, spec: &PersistentVolumeSpec) -> Result<CsiAccessMode> {
    let first = spec
        .access_modes
        .as_ref()
        .and_then(|m| m.first())
        .map(String::as_str)
        .unwrap_or("ReadWriteOnce");
    match first {
        "ReadWriteOnce" => Ok(CsiAccessMode::SingleNodeWriter),
        "ReadOnlyMany" => Ok(CsiAccessMode::MultiNodeReaderOnly),
        "ReadWriteMany" => Ok(CsiAccessMode::MultiNodeMultiWriter),
        "ReadWriteOncePod" => Ok(CsiAccessMode::SingleNodeSingleWriter),
        m => Err(invalid(format!(
            "PersistentVolume {pv_name}: unknown access mode {m:?}"
        ))),
    }
}

/// `spec.capacity.storage` in bytes, if set.
fn capacity(pv_name: &str, spec: &PersistentVolumeSpec) -> Result<Option<u64>> {
    spec.capacity
        .as_ref()
        .and_then(|c| c.get("storage"))
        .map(|q| {
            quantity::parse_bytes(&q.0)
                .map_err(|e| invalid(format!("PersistentVolume {pv_name}: capacity.storage: {e}")))
        })
        .transpose()
}

/// The claim's `status.capacity.storage` in bytes, if set (and valid: a
/// status the API server wrote always is; a hand-written one that does not
/// parse counts as absent).
fn claim_capacity(pvc: &PersistentVolumeClaim) -> Option<u64> {
    let q = pvc.status.as_ref()?.capacity.as_ref()?.get("storage")?;
    quantity::parse_bytes(&q.0).ok()
}

/// The Secret a `spec.csi.*SecretRef` names, if any.
fn secret_of(
    objects: &ObjectStore,
    pv_name: &str,
    r: &Option<SecretReference>,
    field: &str,
) -> Result<Option<std::sync::Arc<CsiSecrets>>> {
    let Some(r) = r else { return Ok(None) };
    let what = format!("PersistentVolume {pv_name} spec.csi.{field}");
    let name = r.name.as_deref().unwrap_or("");
    let ns = r.namespace.as_deref().unwrap_or("");
    if name.is_empty() || ns.is_empty() {
        return Err(invalid(format!("{what}: name and namespace are required")));
    }
    fetch_secret(objects, ns, name, &what).map(Some)
}

/// The volume source field of a PV that is not CSI (for the error message).
fn pv_source_kind(pv: &PersistentVolume) -> String {
    const NOT_SOURCES: &[&str] = &[
        "accessModes",
        "capacity",
        "claimRef",
        "mountOptions",
        "nodeAffinity",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "volumeAttributesClassName",
        "volumeMode",
    ];
    serde_json::to_value(&pv.spec)
        .ok()
        .and_then(|v| {
            v.as_object().and_then(|o| {
                o.keys()
                    .find(|k| !NOT_SOURCES.contains(&k.as_str()))
                    .cloned()
            })
        })
        .unwrap_or_else(|| "none".to_string())
}
