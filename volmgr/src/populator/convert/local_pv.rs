//! Local PersistentVolumes (`spec.local`): the path checked (absolute,
//! clean), and the PV's node affinity checked against this node, as the
//! kubelet's local plugin and `checkVolumeNodeAffinity` do.
//!
//! The node's labels come from [`ObjectStore::node`]. The manifests source
//! has no Node object, so there the affinity check is skipped: a PV found in
//! the manifests directory is taken to be meant for this node.

use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{
    LocalVolumeSource as ApiLocal, Node, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolumeSpec, VolumeNodeAffinity,
};

use super::{invalid, VolumeSpecError};
use crate::populator::objects::ObjectStore;
use crate::volume::{CsiVolumeMode, LocalVolumeSource};

/// What a local PV resolves to, given the claim's `readOnly` and the PV's
/// (already checked) volume mode.
pub(super) fn local_source(
    pv_name: &str,
    spec: &PersistentVolumeSpec,
    local: &ApiLocal,
    read_only: bool,
    volume_mode: CsiVolumeMode,
    objects: &ObjectStore,
) -> Result<LocalVolumeSource, VolumeSpecError> {
    let path = clean_absolute(&local.path).map_err(|why| {
        invalid(format!(
            "PersistentVolume {pv_name}: spec.local.path {:?} {why}",
            local.path
        ))
    })?;
    if let Some(node) = objects.node() {
        check_node_affinity(pv_name, spec, &node)?;
    }
    Ok(LocalVolumeSource {
        pv_name: pv_name.to_string(),
        path,
        read_only,
        volume_mode,
    })
}

/// `path` if it is absolute and clean: no `.` or `..` component, no empty
/// component (`//`), no trailing `/`, no NUL.
fn clean_absolute(path: &str) -> Result<PathBuf, &'static str> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err("must be absolute");
    }
    if path.contains('\0') {
        return Err("must not contain NUL");
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err("must not contain '..'");
    }
    let clean: PathBuf = p.components().collect();
    if clean.as_os_str() != p.as_os_str() {
        return Err("must be clean (no '.', '//' or trailing '/')");
    }
    Ok(clean)
}

/// The PV's `nodeAffinity.required` must match the node (the kubelet refuses
/// to mount a local volume meant for another node).
fn check_node_affinity(
    pv_name: &str,
    spec: &PersistentVolumeSpec,
    node: &Node,
) -> Result<(), VolumeSpecError> {
    if affinity_matches(spec.node_affinity.as_ref(), node) {
        return Ok(());
    }
    Err(invalid(format!(
        "PersistentVolume {pv_name}: its node affinity does not match node {:?} (no matching nodeSelectorTerms)",
        node.metadata.name.as_deref().unwrap_or("")
    )))
}

/// Whether a PV's `nodeAffinity.required` matches the node (storage
/// helpers' `CheckNodeAffinity`): some term matches; no affinity matches.
pub(super) fn affinity_matches(affinity: Option<&VolumeNodeAffinity>, node: &Node) -> bool {
    let Some(required) = affinity.and_then(|a| a.required.as_ref()) else {
        return true;
    };
    required
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, node))
}

/// A term matches when all its requirements do; an empty term matches
/// nothing (as in Kubernetes).
fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = node.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    let name = node.metadata.name.as_deref();
    exprs.iter().all(|r| requirement_matches(r, label(&r.key)))
        && fields.iter().all(|r| {
            // `metadata.name` is the only field Kubernetes allows here.
            r.key == "metadata.name" && requirement_matches(r, name)
        })
}

/// One requirement against the node's value for its key.
fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.parse::<i64>().ok();
    let compare = |f: fn(i64, i64) -> bool| match (value.and_then(int), values) {
        (Some(v), [bound]) => int(bound).is_some_and(|b| f(v, b)),
        _ => false,
    };
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compare(|v, b| v > b),
        "Lt" => compare(|v, b| v < b),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_be_absolute_and_clean() {
        assert_eq!(
            clean_absolute("/mnt/disks/a"),
            Ok(PathBuf::from("/mnt/disks/a"))
        );
        assert_eq!(clean_absolute("/"), Ok(PathBuf::from("/")));
        for bad in [
            "mnt/a",
            "/mnt/../etc",
            "/mnt/./a",
            "/mnt//a",
            "/mnt/a/",
            "/a\0b",
            "",
        ] {
            assert!(clean_absolute(bad).is_err(), "{bad:?}");
        }
    }

    fn node() -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1", "disks": "3"}}
        }))
        .unwrap()
    }

    fn pv(affinity: serde_json::Value) -> PersistentVolumeSpec {
        serde_json::from_value(serde_json::json!({
            "local": {"path": "/mnt/a"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": affinity}}
        }))
        .unwrap()
    }

    #[test]
    fn node_affinity_follows_kubernetes_semantics() {
        let ok = |terms: serde_json::Value| check_node_affinity("pv", &pv(terms), &node()).is_ok();
        let expr = |key: &str, op: &str, values: &[&str]| serde_json::json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]});
        assert!(ok(serde_json::json!([expr(
            "kubernetes.io/hostname",
            "In",
            &["n1"]
        )])));
        assert!(!ok(serde_json::json!([expr(
            "kubernetes.io/hostname",
            "In",
            &["n2"]
        )])));
        // Terms are ORed.
        assert!(ok(serde_json::json!([
            expr("kubernetes.io/hostname", "In", &["n2"]),
            expr("disks", "Exists", &[])
        ])));
        assert!(ok(serde_json::json!([expr("zone", "NotIn", &["a"])])));
        assert!(ok(serde_json::json!([expr("zone", "DoesNotExist", &[])])));
        assert!(ok(serde_json::json!([expr("disks", "Gt", &["2"])])));
        assert!(!ok(serde_json::json!([expr("disks", "Lt", &["2"])])));
        assert!(
            !ok(serde_json::json!([{}])),
            "an empty term matches nothing"
        );
        let field = serde_json::json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]);
        assert!(ok(field));
        let err = check_node_affinity(
            "pv",
            &pv(serde_json::json!([expr(
                "kubernetes.io/hostname",
                "In",
                &["n2"]
            )])),
            &node(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("does not match node \"n1\""),
            "{err}"
        );
        // No affinity: nothing to check.
        let none: PersistentVolumeSpec =
            serde_json::from_value(serde_json::json!({"local": {"path": "/mnt/a"}})).unwrap();
        assert!(check_node_affinity("pv", &none, &node()).is_ok());
    }
}
