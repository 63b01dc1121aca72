//! A projected `clusterTrustBundle` source, as the kubelet's
//! `clustertrustbundle` manager fills it: by `name`, the bundle's
//! `spec.trustBundle` as it is; by `signerName` (and `labelSelector`), the
//! certificates of every bundle of that signer whose labels match,
//! deduplicated and written as one PEM file. A missing bundle, or a
//! selection that matches no certificate, is an error unless `optional`
//! (then the file is empty).
//!
//! One difference: the kubelet orders the merged certificates by a hash
//! salted at each start; volmgr orders them by their encoding, so the file
//! changes only when the set of certificates does.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ClusterTrustBundleProjection;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::VolumeSpecError;
use crate::populator::objects::ObjectStore;

const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const END: &str = "-----END CERTIFICATE-----";

/// The file's bytes for projection `p`, read through `objects`.
pub(crate) fn trust_anchors(
    objects: &ObjectStore,
    p: &ClusterTrustBundleProjection,
) -> Result<Vec<u8>, VolumeSpecError> {
    let optional = p.optional == Some(true);
    match (p.name.as_deref(), p.signer_name.as_deref()) {
        (Some(name), None) if p.label_selector.is_none() => {
            match objects.get::<k8s_openapi::api::certificates::v1::ClusterTrustBundle>("", name) {
                Some(b) => Ok(b.spec.trust_bundle.clone().into_bytes()),
                None if optional => Ok(Vec::new()),
                None => Err(VolumeSpecError::Missing(format!(
                    "ClusterTrustBundle {name} not found"
                ))),
            }
        }
        (None, Some(signer)) => {
            let mut certificates = BTreeSet::new();
            for b in objects.cluster_trust_bundles_of_signer(signer) {
                let labels = b.metadata.labels.clone().unwrap_or_default();
                if selects(p.label_selector.as_ref(), &labels)? {
                    certificates.extend(pem_certificates(&b.spec.trust_bundle));
                }
            }
            if certificates.is_empty() && !optional {
                return Err(VolumeSpecError::Missing(format!(
                    "the ClusterTrustBundles of signer {signer} selected by the labelSelector hold no certificate"
                )));
            }
            Ok(encode(&certificates))
        }
        _ => Err(VolumeSpecError::Invalid(format!(
            "clusterTrustBundle {:?}: exactly one of name and signerName is required (labelSelector only with signerName)",
            p.path
        ))),
    }
}

/// Whether `labels` match the projection's selector: none matches nothing,
/// an empty one everything (the API's rule for this field).
fn selects(
    selector: Option<&LabelSelector>,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<bool, VolumeSpecError> {
    let Some(sel) = selector else {
        return Ok(false);
    };
    for (k, v) in sel.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return Ok(false);
        }
    }
    for e in sel.match_expressions.iter().flatten() {
        let value = labels.get(&e.key);
        let listed = |v: &String| e.values.iter().flatten().any(|x| x == v);
        let ok = match e.operator.as_str() {
            "In" => value.is_some_and(listed),
            "NotIn" => !value.is_some_and(listed),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(VolumeSpecError::Invalid(format!(
                    "clusterTrustBundle labelSelector: unknown operator {other:?}"
                )))
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The base64 bodies (whitespace removed) of the `CERTIFICATE` blocks of a
/// PEM bundle; anything else (other blocks, text between blocks, a block
/// that is not base64) is skipped, as Go's `pem.Decode` loop does.
fn pem_certificates(bundle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = bundle;
    while let Some(start) = rest.find(BEGIN) {
        let after = &rest[start + BEGIN.len()..];
        let Some(end) = after.find(END) else {
            break;
        };
        let body: String = after[..end]
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        let base64 = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=');
        if !body.is_empty() && body.chars().all(base64) {
            out.push(body);
        }
        rest = &after[end + END.len()..];
    }
    out
}

/// The certificates as PEM, 64 characters a line.
fn encode(certificates: &BTreeSet<String>) -> Vec<u8> {
    let mut out = String::new();
    for body in certificates {
        out.push_str(BEGIN);
        out.push('\n');
        let bytes = body.as_bytes();
        for line in bytes.chunks(64) {
            // The body is ASCII (checked when it was read).
            out.push_str(std::str::from_utf8(line).unwrap_or_default());
            out.push('\n');
        }
        out.push_str(END);
        out.push('\n');
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::populator::objects::{KubeObject, ObjectStore};
    use serde_json::json;

    fn pem(body: &str) -> String {
        format!("{BEGIN}\n{body}\n{END}\n")
    }

    fn bundle(
        name: &str,
        signer: Option<&str>,
        labels: serde_json::Value,
        certs: &[&str],
    ) -> KubeObject {
        let text: String = certs.iter().map(|c| pem(c)).collect();
        KubeObject::from_json(json!({
            "apiVersion": "certificates.k8s.io/v1beta1", "kind": "ClusterTrustBundle",
            "metadata": {"name": name, "labels": labels},
            "spec": {"signerName": signer, "trustBundle": text}
        }))
        .unwrap()
    }

    fn projection(v: serde_json::Value) -> ClusterTrustBundleProjection {
        serde_json::from_value(v).unwrap()
    }

    fn store() -> ObjectStore {
        let mut s = ObjectStore::default();
        s.insert(bundle("plain", None, json!({}), &["QUFB"]));
        s.insert(bundle(
            "example.com:ca:one",
            Some("example.com/ca"),
            json!({"env": "prod"}),
            &["QkJC", "Q0ND"],
        ));
        // The same certificate, wrapped differently, and a new one.
        s.insert(bundle(
            "example.com:ca:two",
            Some("example.com/ca"),
            json!({"env": "dev"}),
            &["Q0\nND", "RERE"],
        ));
        s
    }

    #[test]
    fn by_name_is_the_bundle_as_it_is() {
        let s = store();
        let got =
            trust_anchors(&s, &projection(json!({"name": "plain", "path": "ca.pem"}))).unwrap();
        assert_eq!(String::from_utf8(got).unwrap(), pem("QUFB"));
        let e =
            trust_anchors(&s, &projection(json!({"name": "gone", "path": "ca.pem"}))).unwrap_err();
        assert!(
            matches!(&e, VolumeSpecError::Missing(m) if m.contains("gone")),
            "{e}"
        );
        let empty = trust_anchors(
            &s,
            &projection(json!({"name": "gone", "path": "p", "optional": true})),
        );
        assert_eq!(empty.unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn by_signer_merges_deduplicates_and_selects_by_labels() {
        let s = store();
        let all =
            projection(json!({"signerName": "example.com/ca", "labelSelector": {}, "path": "p"}));
        let got = String::from_utf8(trust_anchors(&s, &all).unwrap()).unwrap();
        // Sorted by their encoding, whatever the bundles' order.
        assert_eq!(
            got,
            format!("{}{}{}", pem("Q0ND"), pem("QkJC"), pem("RERE"))
        );
        let prod = projection(json!({"signerName": "example.com/ca", "path": "p",
            "labelSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]}}));
        let got = String::from_utf8(trust_anchors(&s, &prod).unwrap()).unwrap();
        assert_eq!(got, format!("{}{}", pem("Q0ND"), pem("QkJC")));
        // No selector matches nothing: an error unless optional.
        let none = projection(json!({"signerName": "example.com/ca", "path": "p"}));
        assert!(matches!(
            trust_anchors(&s, &none),
            Err(VolumeSpecError::Missing(_))
        ));
        let none =
            projection(json!({"signerName": "example.com/ca", "path": "p", "optional": true}));
        assert_eq!(trust_anchors(&s, &none).unwrap(), Vec::<u8>::new());
        let both =
            projection(json!({"name": "plain", "signerName": "example.com/ca", "path": "p"}));
        assert!(matches!(
            trust_anchors(&s, &both),
            Err(VolumeSpecError::Invalid(_))
        ));
    }

    #[test]
    fn pem_reading_skips_what_is_not_a_certificate() {
        let text = format!(
            "junk\n-----BEGIN PRIVATE KEY-----\nS0VZ\n-----END PRIVATE KEY-----\n{}{BEGIN}\nno*t base64\n{END}\n{BEGIN}\nunterminated",
            pem("QUFB")
        );
        assert_eq!(pem_certificates(&text), vec!["QUFB".to_string()]);
        let long = "A".repeat(130);
        let out = String::from_utf8(encode(&BTreeSet::from([long]))).unwrap();
        let lines: Vec<usize> = out.lines().map(str::len).collect();
        assert_eq!(lines, vec![BEGIN.len(), 64, 64, 2, END.len()]);
    }
}
