//! Parsing a manifest file: its YAML or JSON documents (nesting bounded by
//! [`yaml_depth`](super::yaml_depth)), each a pod, an object pods' volumes
//! read, or a list of those.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::{block_yaml, yaml_depth};
use crate::populator::convert::pod::{DesiredPod, PodRejected};
use crate::populator::objects::{self, KubeObject, ObjectKind};

/// Why a document of a manifest file was not read.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// Not JSON.
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Not YAML.
    #[error("invalid YAML: {0}")]
    Yaml(#[from] serde_norway::Error),
    /// Nested deeper than [`yaml_depth::MAX_DEPTH`]: not parsed at all.
    #[error("invalid YAML: {0}; this document and those after it are not read")]
    TooDeep(yaml_depth::TooDeep),
}

/// What one file yielded.
#[derive(Debug, Default)]
pub struct ParsedFile {
    /// Valid pods.
    pub pods: Vec<DesiredPod>,
    /// Pods whose volumes read other objects (PVCs, Secrets): converted when
    /// applied, against the objects known then.
    pub unresolved: Vec<Arc<Pod>>,
    /// PersistentVolumes, PersistentVolumeClaims and Secrets.
    pub objects: Vec<KubeObject>,
    /// Pods rejected as a whole.
    pub rejected: Vec<PodRejected>,
    /// Problems that yielded no pod (unparsable documents, ...).
    pub errors: Vec<String>,
    /// Whether every document parsed (only then may pods that vanished be removed).
    pub complete: bool,
}

/// Parses the text of a manifest file.
///
/// Nesting is bounded, so that one file cannot stall the others: JSON by
/// serde_json's recursion limit (128 levels; an "invalid JSON ... recursion
/// limit exceeded" error), YAML by [`yaml_depth::check`] before parsing
/// ([`yaml_depth::MAX_DEPTH`] levels; the documents before the one that
/// goes too deep are read, that one and the rest are not).
pub fn parse_manifest(text: &str, json: bool) -> ParsedFile {
    let mut out = ParsedFile {
        complete: true,
        ..ParsedFile::default()
    };
    // Fast path: a JSON file holding exactly one pod parses straight into
    // the typed object, without an intermediate `Value`.
    if json {
        if let Ok(pod) = serde_json::from_str::<Pod>(text) {
            add_pod(pod, &mut out);
            return out;
        }
    }
    let docs = if json {
        json_documents(text)
    } else {
        yaml_documents(text)
    };
    for (i, d) in docs.into_iter().enumerate() {
        let doc = i + 1;
        match d {
            Err(e) => {
                out.errors.push(format!("document {doc}: {e}"));
                out.complete = false;
            }
            Ok(v) => add_object(v, doc, &mut out),
        }
    }
    out
}

/// The documents of a JSON stream, up to the first that does not parse.
fn json_documents(text: &str) -> Vec<Result<serde_json::Value, DocumentError>> {
    let mut docs = Vec::new();
    for d in serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>() {
        match d {
            Ok(v) => docs.push(Ok(v)),
            Err(e) => {
                docs.push(Err(e.into()));
                break;
            }
        }
    }
    docs
}

/// The documents of a YAML stream, up to the first that does not parse or
/// nests deeper than [`yaml_depth::MAX_DEPTH`] (not parsed at all). A file
/// of one document in the common subset of YAML is read by
/// [`block_yaml`] alone, the rest by serde_norway.
fn yaml_documents(text: &str) -> Vec<Result<serde_json::Value, DocumentError>> {
    if let Some(v) = block_yaml::parse(text) {
        return vec![Ok(v)];
    }
    let (text, too_deep) = match yaml_depth::check(text) {
        Ok(()) => (text, None),
        Err(e) => (text.get(..e.document_start).unwrap_or(""), Some(e)),
    };
    let mut docs = Vec::new();
    for d in serde_norway::Deserializer::from_str(text) {
        match <serde_json::Value as serde::Deserialize>::deserialize(d) {
            Ok(serde_json::Value::Null) => {}
            Ok(v) => docs.push(Ok(v)),
            Err(e) => {
                docs.push(Err(e.into()));
                return docs;
            }
        }
    }
    if let Some(e) = too_deep {
        docs.push(Err(DocumentError::TooDeep(e)));
    }
    docs
}

/// One document: a pod, a followed object (decoded by
/// [`objects::decode`](crate::populator::objects::decode)), or a list of those.
fn add_object(v: serde_json::Value, doc: usize, out: &mut ParsedFile) {
    let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    if kind == "Pod" {
        match serde_json::from_value::<Pod>(v) {
            Ok(pod) => add_pod(pod, out),
            Err(e) => refuse(format!("document {doc}: not a valid v1.Pod: {e}"), out),
        }
    } else if let Some(k) = ObjectKind::from_name(kind) {
        match objects::decode(k, v) {
            Ok(o) => out.objects.push(o),
            Err(e) => refuse(format!("document {doc}: {e}"), out),
        }
    } else if kind == "List" || list_item_kind(kind).is_some() {
        let kind = kind.to_string();
        add_list(v, &kind, doc, out);
    } else if kind.is_empty() {
        refuse(format!("document {doc}: missing \"kind\""), out);
    } else {
        tracing::debug!(kind, "skipping non-pod object in manifests");
    }
}

/// The kind of the items of a typed list (`PodList`, `SecretList`, ...).
fn list_item_kind(kind: &str) -> Option<&str> {
    let item = kind.strip_suffix("List")?;
    (item == "Pod" || ObjectKind::from_name(item).is_some()).then_some(item)
}

/// Records a document that yielded nothing: the file is not complete.
fn refuse(error: String, out: &mut ParsedFile) {
    out.errors.push(error);
    out.complete = false;
}

/// The items of a `v1.List` or a typed list. Items of a typed list (as the
/// API server returns them) carry no kind of their own.
fn add_list(v: serde_json::Value, kind: &str, doc: usize, out: &mut ParsedFile) {
    let item_kind = list_item_kind(kind);
    let items = match v {
        serde_json::Value::Object(mut o) => o.remove("items"),
        _ => None,
    };
    let items = match items {
        Some(serde_json::Value::Array(a)) => a,
        _ => Vec::new(),
    };
    for mut item in items {
        if let (Some(k), serde_json::Value::Object(o)) = (item_kind, &mut item) {
            o.entry("kind").or_insert_with(|| k.into());
            let api_version = ObjectKind::from_name(k).map_or("v1", ObjectKind::api_version);
            o.entry("apiVersion").or_insert_with(|| api_version.into());
        }
        add_object(item, doc, out);
    }
}

fn add_pod(pod: Pod, out: &mut ParsedFile) {
    if crate::populator::convert::pod::needs_objects(&pod) {
        out.unresolved.push(Arc::new(pod));
        return;
    }
    match DesiredPod::from_pod(&pod) {
        Ok(p) => out.pods.push(p),
        Err(r) => out.rejected.push(r),
    }
}
