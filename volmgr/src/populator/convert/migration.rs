//! CSI migration: in-tree cloud volume sources (`awsElasticBlockStore`,
//! `gcePersistentDisk`, `azureDisk`, `azureFile`, `cinder`,
//! `vsphereVolume`, `portworxVolume`), in a PersistentVolume or inline in a
//! pod, translated to the CSI source their driver serves, as the kubelet
//! does with `k8s.io/csi-translation-lib` (`TranslateInTreePVToCSI`,
//! `TranslateInTreeInlineVolumeToCSI`). The result is staged and published
//! exactly as a CSI PersistentVolume: its unique name, staging path and
//! VolumeAttachment name follow from the translated driver and handle.
//!
//! A PersistentVolume's topology is translated too (`topology.rs`): its
//! zone in `nodeAffinity` (or its zone label, a regional GCE disk's zones
//! `__`-separated) becomes the driver's CSI topology key
//! (`topology.ebs.csi.aws.com/zone`, `topology.gke.io/zone`,
//! `topology.cinder.csi.openstack.org/zone`, vSphere's
//! `topology.csi.vmware.com/zone` and `/region`), the beta region key the
//! GA one; Azure Disk, Azure File and Portworx PVs keep their affinity, as
//! csi-translation-lib leaves it. The kubelet checks the translated affinity
//! against the node's labels before mounting (`checkNodeAffinity`), and so
//! does `claim.rs`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, SecretReference, Volume, VolumeNodeAffinity,
};

use topology::Topology;

/// An in-tree source translated to CSI.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Migrated {
    /// The in-tree plugin it came from (`kubernetes.io/aws-ebs`).
    pub(crate) in_tree_plugin: &'static str,
    /// What `spec.csi` of the translated PersistentVolume holds.
    pub(crate) csi: CSIPersistentVolumeSource,
    /// The translated PersistentVolume's `spec.accessModes` (`None`: as the
    /// PersistentVolume has them).
    pub(crate) access_modes: Option<Vec<String>>,
    /// The translated PersistentVolume's `spec.nodeAffinity` (`None` for
    /// an inline volume, which has none).
    pub(crate) node_affinity: Option<VolumeNodeAffinity>,
}

/// Why an in-tree source cannot be translated (csi-translation-lib's
/// errors, with its texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TranslateError {
    /// An AWS volume ID neither `vol-…` nor `aws://[zone]/vol-…`.
    #[error(
        "failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume ({0})"
    )]
    AwsVolumeId(String),
    /// A GCE zone not `{locale}-{region}-{zone}`.
    #[error("failed to get region from zones: zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {0}")]
    GceZone(String),
    /// Zones of several regions, or none.
    #[error(
        "failed to get region from zones: multiple or no regions gotten from zones, got: {0:?}"
    )]
    GceRegions(std::collections::BTreeSet<String>),
    /// An Azure Disk that is not managed.
    #[error("kind({0}) is not supported in csi migration")]
    AzureDiskKind(String),
    /// An Azure File PersistentVolume without a secret namespace.
    #[error("could not find a secret namespace in PersistentVolumeSource or ClaimRef")]
    AzureFileSecretNamespace,
}

/// The in-tree plugins the kubelet migrates: (plugin, CSI driver). All
/// seven are migrated unconditionally in Kubernetes 1.37 (the kubelet's
/// `migratedPlugins` in `pkg/volume/csi/csi_plugin.go`).
pub const MIGRATED_PLUGINS: [(&str, &str); 7] = [
    ("kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
    ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
    ("kubernetes.io/azure-disk", "disk.csi.azure.com"),
    ("kubernetes.io/azure-file", "file.csi.azure.com"),
    ("kubernetes.io/cinder", "cinder.csi.openstack.org"),
    ("kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com"),
    ("kubernetes.io/portworx-volume", "pxd.portworx.com"),
];

fn csi(driver: &str, handle: String) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: driver.to_string(),
        volume_handle: handle,
        volume_attributes: Some(BTreeMap::new()),
        ..Default::default()
    }
}

/// `readOnly` as the Go struct has it: false is absent.
fn ro(read_only: Option<bool>) -> Option<bool> {
    read_only.filter(|r| *r)
}

fn modes(m: &[&str]) -> Option<Vec<String>> {
    Some(m.iter().map(|s| s.to_string()).collect())
}

fn attrs(pairs: &[(&str, String)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

/// A PersistentVolume of a migrated in-tree plugin, translated; `None` for
/// any other PersistentVolume.
pub(crate) fn translate_pv(pv: &PersistentVolume) -> Option<Result<Migrated, TranslateError>> {
    let spec = pv.spec.as_ref()?;
    let [ebs, gce, azd, azf, cinder, vsphere, px] = MIGRATED_PLUGINS.map(|(p, _)| p);
    let migrated = |plugin, r: Result<CSIPersistentVolumeSource, TranslateError>, modes| {
        r.map(|csi| Migrated {
            in_tree_plugin: plugin,
            node_affinity: topology::translate(pv, topology_of(plugin)),
            csi,
            access_modes: modes,
        })
    };
    let own_modes = spec.access_modes.clone();
    Some(if let Some(s) = &spec.aws_elastic_block_store {
        migrated(
            ebs,
            ebs_csi(&s.volume_id, &s.fs_type, s.partition, s.read_only),
            own_modes,
        )
    } else if let Some(s) = &spec.gce_persistent_disk {
        let handle = gce_pv_handle(pv, &s.pd_name);
        let r = handle.map(|h| gce_csi(h, &s.fs_type, s.partition, s.read_only));
        migrated(
            gce,
            r,
            backward_compatible_access_modes(own_modes.as_deref()),
        )
    } else if let Some(s) = &spec.azure_disk {
        migrated(azd, azure_disk_csi(s), own_modes)
    } else if let Some(s) = &spec.azure_file {
        migrated(azf, azure_file_pv_csi(pv, s), own_modes)
    } else if let Some(s) = &spec.cinder {
        let mut c = csi("cinder.csi.openstack.org", s.volume_id.clone());
        c.read_only = ro(s.read_only);
        c.fs_type = s.fs_type.clone();
        migrated(cinder, Ok(c), own_modes)
    } else if let Some(s) = &spec.vsphere_volume {
        let c = vsphere_csi(&s.volume_path, &s.fs_type, &s.storage_policy_name);
        migrated(vsphere, Ok(c), own_modes)
    } else if let Some(s) = &spec.portworx_volume {
        migrated(
            px,
            Ok(portworx_pv_csi(pv, &s.volume_id, &s.fs_type)),
            own_modes,
        )
    } else {
        return None;
    })
}

/// An inline pod volume of a migrated in-tree plugin, translated (the
/// kubelet migrates these too); `None` for any other volume.
pub(crate) fn translate_inline(
    v: &Volume,
    pod_namespace: &str,
) -> Option<Result<Migrated, TranslateError>> {
    let [ebs, gce, azd, azf, cinder, vsphere, px] = MIGRATED_PLUGINS.map(|(p, _)| p);
    let rwo = || modes(&["ReadWriteOnce"]);
    let ro_or_rwo = |ro: Option<bool>| match ro.unwrap_or(false) {
        true => modes(&["ReadOnlyMany"]),
        false => rwo(),
    };
    let (plugin, r, access_modes) = if let Some(s) = &v.aws_elastic_block_store {
        let r = ebs_csi(&s.volume_id, &s.fs_type, s.partition, s.read_only);
        (ebs, r, rwo())
    } else if let Some(s) = &v.gce_persistent_disk {
        let handle = format!("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/{}", s.pd_name);
        let r = Ok(gce_csi(handle, &s.fs_type, s.partition, s.read_only));
        (gce, r, ro_or_rwo(s.read_only))
    } else if let Some(s) = &v.azure_disk {
        (azd, azure_disk_csi(s), rwo())
    } else if let Some(s) = &v.azure_file {
        let ns = if pod_namespace.is_empty() {
            "default"
        } else {
            pod_namespace
        };
        let account = storage_account(&s.secret_name);
        let handle = format!("#{account}#{}#{}#{ns}", s.share_name, v.name);
        (
            azf,
            Ok(azure_file_csi(
                handle,
                &s.secret_name,
                ns,
                s.read_only,
                &s.share_name,
            )),
            modes(&["ReadWriteMany"]),
        )
    } else if let Some(s) = &v.cinder {
        let mut c = csi("cinder.csi.openstack.org", s.volume_id.clone());
        c.read_only = ro(s.read_only);
        c.fs_type = s.fs_type.clone();
        (cinder, Ok(c), rwo())
    } else if let Some(s) = &v.vsphere_volume {
        // csi-translation-lib reads the policy from the (nil) in-tree PV
        // here, which would panic; the volume's own policy is meant.
        let c = vsphere_csi(&s.volume_path, &s.fs_type, &s.storage_policy_name);
        (vsphere, Ok(c), rwo())
    } else if let Some(s) = &v.portworx_volume {
        let mut c = csi("pxd.portworx.com", s.volume_id.clone());
        c.fs_type = s.fs_type.clone();
        (px, Ok(c), ro_or_rwo(s.read_only))
    } else {
        return None;
    };
    Some(r.map(|csi| Migrated {
        in_tree_plugin: plugin,
        csi,
        access_modes,
        node_affinity: None,
    }))
}

/// How csi-translation-lib translates the topology of `plugin`'s PVs.
fn topology_of(plugin: &str) -> Topology {
    match plugin {
        "kubernetes.io/aws-ebs" => Topology::Zone("topology.ebs.csi.aws.com/zone"),
        "kubernetes.io/gce-pd" => Topology::Zone("topology.gke.io/zone"),
        "kubernetes.io/cinder" => Topology::Zone("topology.cinder.csi.openstack.org/zone"),
        "kubernetes.io/vsphere-volume" => Topology::VSphere,
        _ => Topology::Kept,
    }
}

/// Whether `v` is an inline volume of a migrated in-tree plugin.
pub(crate) fn is_migratable_inline(v: &Volume) -> bool {
    v.aws_elastic_block_store.is_some()
        || v.gce_persistent_disk.is_some()
        || v.azure_disk.is_some()
        || v.azure_file.is_some()
        || v.cinder.is_some()
        || v.vsphere_volume.is_some()
        || v.portworx_volume.is_some()
}

fn ebs_csi(
    volume_id: &str,
    fs_type: &Option<String>,
    partition: Option<i32>,
    read_only: Option<bool>,
) -> Result<CSIPersistentVolumeSource, TranslateError> {
    let handle = ebs_volume_id(volume_id)?;
    let mut c = csi("ebs.csi.aws.com", handle);
    c.read_only = ro(read_only);
    c.fs_type = fs_type.clone();
    c.volume_attributes = attrs(&[("partition", partition.unwrap_or(0).to_string())]);
    Ok(c)
}

/// `KubernetesVolumeIDToEBSVolumeID`: `aws://[zone]/vol-…` → `vol-…`; any
/// other ID unchanged.
pub(crate) fn ebs_volume_id(id: &str) -> Result<String, TranslateError> {
    let Some(rest) = id.strip_prefix("aws://") else {
        return Ok(id.to_string());
    };
    // After the scheme: the host (a zone, or empty), then the path.
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let vol = path.trim_matches('/');
    if vol.starts_with("vol-") && !vol.contains('/') {
        Ok(vol.to_string())
    } else {
        Err(TranslateError::AwsVolumeId(id.to_string()))
    }
}

fn gce_csi(
    handle: String,
    fs_type: &Option<String>,
    partition: Option<i32>,
    read_only: Option<bool>,
) -> CSIPersistentVolumeSource {
    let partition = match partition.unwrap_or(0) {
        0 => String::new(),
        p => p.to_string(),
    };
    let mut c = csi("pd.csi.storage.gke.io", handle);
    c.read_only = ro(read_only);
    c.fs_type = fs_type.clone();
    c.volume_attributes = attrs(&[("partition", partition)]);
    c
}

/// A GCE PD PersistentVolume's handle: zonal, regional (zones joined by
/// `__` in its zone label) or with an unspecified zone.
fn gce_pv_handle(pv: &PersistentVolume, pd_name: &str) -> Result<String, TranslateError> {
    let labels = pv.metadata.labels.as_ref();
    let label = |k: &str| {
        labels
            .and_then(|l| l.get(k))
            .map(String::as_str)
            .unwrap_or("")
    };
    let mut zones_label = label("failure-domain.beta.kubernetes.io/zone");
    if zones_label.is_empty() {
        zones_label = label("topology.kubernetes.io/zone");
    }
    let zones: Vec<&str> = zones_label.split("__").collect();
    match zones.as_slice() {
        [z] if !z.is_empty() => Ok(format!("projects/UNSPECIFIED/zones/{z}/disks/{pd_name}")),
        [_] => Ok(format!(
            "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/{pd_name}"
        )),
        _ => {
            let region = gce_region(&zones)?;
            Ok(format!(
                "projects/UNSPECIFIED/regions/{region}/disks/{pd_name}"
            ))
        }
    }
}

fn gce_region(zones: &[&str]) -> Result<String, TranslateError> {
    let mut regions = std::collections::BTreeSet::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() != 3 {
            return Err(TranslateError::GceZone(zone.to_string()));
        }
        regions.insert(parts[..2].join("-"));
    }
    match regions.len() {
        1 => Ok(regions.into_iter().next().unwrap_or_default()),
        _ => Err(TranslateError::GceRegions(regions)),
    }
}

/// `backwardCompatibleAccessModes`: GCE PD CSI has no ReadWriteMany; RWX
/// counts as RWO, and RWO wins over ROX.
pub(crate) fn backward_compatible_access_modes(ams: Option<&[String]>) -> Option<Vec<String>> {
    let ams = ams?;
    let has = |m: &str| {
        ams.iter()
            .any(|a| a == m || (m == "ReadWriteOnce" && a == "ReadWriteMany"))
    };
    if !has("ReadWriteOnce") && has("ReadOnlyMany") {
        modes(&["ReadOnlyMany"])
    } else {
        modes(&["ReadWriteOnce"])
    }
}

fn azure_disk_csi(
    s: &k8s_openapi::api::core::v1::AzureDiskVolumeSource,
) -> Result<CSIPersistentVolumeSource, TranslateError> {
    if let Some(kind) = &s.kind {
        if !kind.eq_ignore_ascii_case("Managed") {
            return Err(TranslateError::AzureDiskKind(kind.clone()));
        }
    }
    let mut c = csi("disk.csi.azure.com", s.disk_uri.clone());
    let mut a = BTreeMap::from([("kind".to_string(), "Managed".to_string())]);
    if let Some(m) = s.caching_mode.as_ref().filter(|m| !m.is_empty()) {
        a.insert("cachingmode".into(), m.clone());
    }
    if let Some(fs) = &s.fs_type {
        c.fs_type = Some(fs.clone());
        a.insert("fstype".into(), fs.clone());
    }
    c.read_only = ro(s.read_only);
    c.volume_attributes = Some(a);
    Ok(c)
}

/// The storage account of an in-tree Azure File secret name
/// (`azure-storage-account-<account>-secret`), or the name itself.
fn storage_account(secret_name: &str) -> &str {
    secret_name
        .find("azure-storage-account-")
        .map(|i| &secret_name[i + "azure-storage-account-".len()..])
        .and_then(|rest| rest.rfind("-secret").map(|j| &rest[..j]))
        .filter(|a| !a.is_empty())
        .unwrap_or(secret_name)
}

fn azure_file_csi(
    handle: String,
    secret_name: &str,
    secret_namespace: &str,
    read_only: Option<bool>,
    share_name: &str,
) -> CSIPersistentVolumeSource {
    let mut c = csi("file.csi.azure.com", handle);
    c.read_only = ro(read_only);
    c.volume_attributes = attrs(&[("sharename", share_name.to_string())]);
    // The in-tree secret (account name and key) becomes the node stage
    // secret the CSI driver mounts the share with.
    c.node_stage_secret_ref = Some(SecretReference {
        name: Some(secret_name.to_string()),
        namespace: Some(secret_namespace.to_string()),
    });
    c
}

fn azure_file_pv_csi(
    pv: &PersistentVolume,
    s: &k8s_openapi::api::core::v1::AzureFilePersistentVolumeSource,
) -> Result<CSIPersistentVolumeSource, TranslateError> {
    let account = storage_account(&s.secret_name);
    let annotations = pv.metadata.annotations.as_ref();
    let resource_group = annotations
        .and_then(|a| a.get("kubernetes.io/azure-file-resource-group"))
        .map(String::as_str)
        .unwrap_or("");
    let claim_ns = || pv.spec.as_ref()?.claim_ref.as_ref()?.namespace.clone();
    let namespace = match &s.secret_namespace {
        Some(ns) => ns.clone(),
        None => claim_ns().unwrap_or_default(),
    };
    if namespace.is_empty() {
        return Err(TranslateError::AzureFileSecretNamespace);
    }
    let pv_name = pv.metadata.name.as_deref().unwrap_or("");
    let handle = format!(
        "{resource_group}#{account}#{}#{pv_name}#{namespace}",
        s.share_name
    );
    Ok(azure_file_csi(
        handle,
        &s.secret_name,
        &namespace,
        s.read_only,
        &s.share_name,
    ))
}

fn vsphere_csi(
    path: &str,
    fs_type: &Option<String>,
    policy: &Option<String>,
) -> CSIPersistentVolumeSource {
    let mut c = csi("csi.vsphere.vmware.com", path.to_string());
    c.fs_type = fs_type.clone();
    if let Some(p) = policy.as_ref().filter(|p| !p.is_empty()) {
        c.volume_attributes = attrs(&[("storagepolicyname", p.clone())]);
    }
    c
}

fn portworx_pv_csi(
    pv: &PersistentVolume,
    volume_id: &str,
    fs_type: &Option<String>,
) -> CSIPersistentVolumeSource {
    let annotations = pv.metadata.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k)).cloned();
    let secret = match (
        get("openstorage.io/auth-secret-name"),
        get("openstorage.io/auth-secret-namespace"),
    ) {
        (Some(name), Some(namespace)) => Some(SecretReference {
            name: Some(name),
            namespace: Some(namespace),
        }),
        _ => None,
    };
    let mut c = csi("pxd.portworx.com", volume_id.to_string());
    c.fs_type = fs_type.clone();
    c.controller_publish_secret_ref = secret.clone();
    c.node_stage_secret_ref = secret.clone();
    c.node_publish_secret_ref = secret.clone();
    c.controller_expand_secret_ref = secret.clone();
    c.node_expand_secret_ref = secret;
    c
}

#[path = "migration/topology.rs"]
mod topology;

#[cfg(test)]
#[path = "migration/tests.rs"]
mod tests;
