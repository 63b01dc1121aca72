//! csi-translation-lib's topology translation (`in_tree_volume.go`
//! `translateTopologyFromInTreeToCSI`, `vsphere_volume.go`
//! `translateTopologyFromInTreevSphereToCSI`): the in-tree PV's zone in
//! `nodeAffinity` (or, when its affinity has none, in its zone label) moved
//! to the CSI driver's topology key, the beta region key to the GA one.
//!
//! As in Go, the zone and region keys used are those of the PV itself:
//! GA (`topology.kubernetes.io/…`) when its affinity (else its labels)
//! has the GA zone, beta (`failure-domain.beta.kubernetes.io/…`) when it
//! has the beta one; nothing found means GA.

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, VolumeNodeAffinity,
};

/// The GA zone label (`v1.LabelTopologyZone`).
pub(crate) const ZONE_GA: &str = "topology.kubernetes.io/zone";
/// The GA region label (`v1.LabelTopologyRegion`).
pub(crate) const REGION_GA: &str = "topology.kubernetes.io/region";
/// The beta zone label (`v1.LabelFailureDomainBetaZone`).
pub(crate) const ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
/// The beta region label (`v1.LabelFailureDomainBetaRegion`).
pub(crate) const REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
/// What separates the zones of a multi-zone (regional) zone label.
const MULTI_ZONE_DELIMITER: &str = "__";
/// The vSphere CSI driver's zone and region keys.
pub(crate) const VSPHERE_ZONE: &str = "topology.csi.vmware.com/zone";
/// See [`VSPHERE_ZONE`].
pub(crate) const VSPHERE_REGION: &str = "topology.csi.vmware.com/region";

/// How a plugin's PV topology is translated.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Topology {
    /// `translateTopologyFromInTreeToCSI` with this CSI zone key.
    Zone(&'static str),
    /// `translateTopologyFromInTreevSphereToCSI`.
    VSphere,
    /// Not translated (Azure Disk, Azure File, Portworx: their PVs keep
    /// their `nodeAffinity` as it is).
    Kept,
}

/// The translated PV's `spec.nodeAffinity`.
pub(crate) fn translate(pv: &PersistentVolume, how: Topology) -> Option<VolumeNodeAffinity> {
    let mut affinity = pv.spec.as_ref()?.node_affinity.clone();
    let labels = pv.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    let (zone, region) = topology_labels(affinity.as_ref(), |k| label(k).is_some());
    match how {
        Topology::Kept => {}
        Topology::Zone(key) => {
            if !values(affinity.as_ref(), zone).is_empty() {
                replace(&mut affinity, zone, key);
            } else if let Some(l) = label(zone) {
                add(&mut affinity, key, l.split(MULTI_ZONE_DELIMITER));
            }
            if region == REGION_BETA && !values(affinity.as_ref(), region).is_empty() {
                replace(&mut affinity, region, REGION_GA);
            }
        }
        Topology::VSphere => {
            for (from, to) in [(zone, VSPHERE_ZONE), (region, VSPHERE_REGION)] {
                if !values(affinity.as_ref(), from).is_empty() {
                    replace(&mut affinity, from, to);
                } else if let Some(l) = label(from).filter(|l| !l.is_empty()) {
                    add(&mut affinity, to, [l]);
                }
            }
        }
    }
    affinity
}

/// `getTopologyLabel`: the (zone, region) keys the PV uses.
fn topology_labels(
    affinity: Option<&VolumeNodeAffinity>,
    has_label: impl Fn(&str) -> bool,
) -> (&'static str, &'static str) {
    if key_exists(affinity, ZONE_GA) {
        (ZONE_GA, REGION_GA)
    } else if key_exists(affinity, ZONE_BETA) {
        (ZONE_BETA, REGION_BETA)
    } else if has_label(ZONE_GA) {
        (ZONE_GA, REGION_GA)
    } else if has_label(ZONE_BETA) {
        (ZONE_BETA, REGION_BETA)
    } else {
        (ZONE_GA, REGION_GA)
    }
}

/// The required terms' expressions, all of them.
fn expressions(
    affinity: Option<&VolumeNodeAffinity>,
) -> impl Iterator<Item = &NodeSelectorRequirement> {
    affinity
        .and_then(|a| a.required.as_ref())
        .into_iter()
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
}

/// `TopologyKeyExist`.
fn key_exists(affinity: Option<&VolumeNodeAffinity>, key: &str) -> bool {
    expressions(affinity).any(|r| r.key == key)
}

/// `getTopologyValues`: every value of `key`'s expressions, sorted, once.
fn values(affinity: Option<&VolumeNodeAffinity>, key: &str) -> Vec<String> {
    let set: std::collections::BTreeSet<&String> = expressions(affinity)
        .filter(|r| r.key == key)
        .flat_map(|r| r.values.iter().flatten())
        .collect();
    set.into_iter().cloned().collect()
}

/// `replaceTopology`: key `old` renamed `new` in every term.
fn replace(affinity: &mut Option<VolumeNodeAffinity>, old: &str, new: &str) {
    let terms = affinity
        .as_mut()
        .and_then(|a| a.required.as_mut())
        .map(|r| r.node_selector_terms.iter_mut());
    for term in terms.into_iter().flatten() {
        for r in term.match_expressions.iter_mut().flatten() {
            if r.key == old {
                r.key = new.to_string();
            }
        }
    }
}

/// `addTopology`: `key In zones` (trimmed, without empties, sorted, once)
/// appended to every term (to a new one if there is none); nothing when no
/// zone is left (Go's error, which its callers ignore).
fn add<'a>(
    affinity: &mut Option<VolumeNodeAffinity>,
    key: &str,
    zones: impl IntoIterator<Item = &'a str>,
) {
    let zones: std::collections::BTreeSet<String> = zones
        .into_iter()
        .map(str::trim)
        .filter(|z| !z.is_empty())
        .map(String::from)
        .collect();
    if zones.is_empty() {
        return;
    }
    let required = affinity
        .get_or_insert_with(VolumeNodeAffinity::default)
        .required
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    let requirement = NodeSelectorRequirement {
        key: key.to_string(),
        operator: "In".to_string(),
        values: Some(zones.into_iter().collect()),
    };
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(requirement.clone());
    }
}
