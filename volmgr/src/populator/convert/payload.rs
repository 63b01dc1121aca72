//! Resolving `configMap`, `secret`, `downwardAPI` and `projected` volumes
//! into their files, with the kubelet's semantics (`configmap.MakePayload`,
//! `secret.MakePayload`, `downwardapi.CollectData`, `projected.collectData`):
//! `items` (key → path, per-item `mode`), `defaultMode` (0644 when unset),
//! `optional` (a missing object or key is an error naming it, unless
//! optional: then it is left out and the volume is mounted without it),
//! `binaryData` and Secret `data` as bytes, downwardAPI `fieldRef`
//! (metadata.name, namespace, uid, labels, annotations, in the kubelet's
//! `key="value"` format) and `resourceFieldRef` (container limits and
//! requests of CPU, memory, ephemeral storage and hugepages divided by
//! `divisor`, rounded up; an unset CPU, memory or ephemeral-storage limit
//! is the node's allocatable, see [`super::allocatable`]). Paths are
//! checked by the atomic writer's rules.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, ResourceFieldSelector, Secret,
    ServiceAccountTokenProjection, VolumeProjection,
};

use super::{
    invalid, pod_service_account, service_account_uid, PayloadResolution, VolumeSpecError,
};
use crate::plugins::atomic_writer::{self, validate_path};
use crate::populator::objects::ObjectStore;
use crate::quantity;
use crate::volume::{PayloadFile, PayloadKind, PayloadVolumeSource, TokenProjection, VolumeSource};

/// The API's default `defaultMode` (0644).
const DEFAULT_MODE: i32 = 0o644;
/// The API's default token `expirationSeconds`.
const DEFAULT_TOKEN_EXPIRATION: i64 = 3600;

/// What resolving needs of the pod.
pub(crate) struct PayloadContext<'a> {
    /// The whole pod (downwardAPI, token binding).
    pub(crate) pod: &'a Pod,
    /// Its namespace (defaulted).
    pub(crate) namespace: &'a str,
    /// Its UID.
    pub(crate) uid: &'a str,
    /// The objects, when the source has them.
    pub(crate) objects: Option<&'a ObjectStore>,
    /// Files and tokens, or the kind only.
    pub(crate) payloads: PayloadResolution,
}

type Files = BTreeMap<String, PayloadFile>;

fn mode_of(mode: Option<i32>, default: Option<i32>) -> Result<u32, VolumeSpecError> {
    let m = mode.or(default).unwrap_or(DEFAULT_MODE);
    if !(0..=0o777).contains(&m) {
        return Err(invalid(format!("mode {m:#o} is out of range (0 to 0777)")));
    }
    Ok(m as u32)
}

/// Adds one file; an invalid path is an error naming `whose` it is (the
/// object and key, the item).
fn insert(
    files: &mut Files,
    path: &str,
    data: Arc<[u8]>,
    mode: u32,
    whose: impl FnOnce() -> String,
) -> Result<(), VolumeSpecError> {
    validate_path(path).map_err(|e| invalid(format!("{}: {e}", whose())))?;
    let file = PayloadFile {
        data,
        mode,
        fs_user: None,
    };
    files.insert(path.to_string(), file);
    Ok(())
}

/// A payload within the atomic writer's bounds; over them, an error naming
/// `what` (the object, or the volume).
fn check_size(what: &str, files: usize, bytes: usize) -> Result<(), VolumeSpecError> {
    atomic_writer::check_size(files, bytes).map_err(|e| invalid(format!("{what}: {e}")))
}

fn objects<'a>(ctx: &PayloadContext<'a>, what: &str) -> Result<&'a ObjectStore, VolumeSpecError> {
    ctx.objects.ok_or_else(|| {
        VolumeSpecError::Unsupported(format!(
            "{what} cannot be read (this source has no objects)"
        ))
    })
}

/// The kubelet's `MakePayload` for a configMap or Secret: every key (no
/// `items`), or the listed keys at their paths.
fn project_keys(
    data: &BTreeMap<String, Arc<[u8]>>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
    what: &str,
    files: &mut Files,
) -> Result<(), VolumeSpecError> {
    let items = items.unwrap_or_default();
    if items.is_empty() {
        let bytes = data.iter().map(|(k, v)| k.len() + v.len()).sum();
        check_size(what, data.len(), bytes)?;
        let mode = mode_of(None, default_mode)?;
        for (k, v) in data {
            insert(files, k, Arc::clone(v), mode, || {
                format!("{what} key {k:?}")
            })?;
        }
        return Ok(());
    }
    for it in items {
        let Some(v) = data.get(&it.key) else {
            if optional {
                continue;
            }
            return Err(VolumeSpecError::Missing(format!(
                "{what} has no key {:?}",
                it.key
            )));
        };
        insert(
            files,
            &it.path,
            Arc::clone(v),
            mode_of(it.mode, default_mode)?,
            || format!("{what} key {:?}", it.key),
        )?;
    }
    Ok(())
}

fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Arc<[u8]>> {
    let mut out: BTreeMap<String, Arc<[u8]>> = BTreeMap::new();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.insert(k.clone(), Arc::from(&v.0[..]));
    }
    for (k, v) in cm.data.iter().flatten() {
        out.insert(k.clone(), Arc::from(v.as_bytes()));
    }
    out
}

fn secret_data(s: &Secret) -> BTreeMap<String, Arc<[u8]>> {
    let mut out: BTreeMap<String, Arc<[u8]>> = BTreeMap::new();
    for (k, v) in s.data.iter().flatten() {
        out.insert(k.clone(), Arc::from(&v.0[..]));
    }
    // `stringData` is merged into `data` by an API server; the manifests
    // directory may hold it unmerged.
    for (k, v) in s.string_data.iter().flatten() {
        out.insert(k.clone(), Arc::from(v.as_bytes()));
    }
    out
}

/// Which object a configMap or secret volume (or projection) reads.
#[derive(Clone, Copy)]
enum KeySource {
    ConfigMap,
    Secret,
}

/// One configMap or Secret (volume or projection) into `files`. Messages
/// never quote values.
fn add_object_keys(
    ctx: &PayloadContext<'_>,
    source: KeySource,
    name: &str,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
    files: &mut Files,
) -> Result<(), VolumeSpecError> {
    let (kind, field) = match source {
        KeySource::ConfigMap => ("ConfigMap", "configMap.name"),
        KeySource::Secret => ("Secret", "secret.secretName"),
    };
    if name.is_empty() {
        return Err(invalid(format!("{field} is required")));
    }
    let what = format!("{kind} {}/{name}", ctx.namespace);
    let lookup = objects(ctx, &what)?;
    let data = match source {
        KeySource::ConfigMap => lookup
            .get::<k8s_openapi::api::core::v1::ConfigMap>(ctx.namespace, name)
            .map(|o| config_map_data(&o)),
        KeySource::Secret => lookup
            .get::<k8s_openapi::api::core::v1::Secret>(ctx.namespace, name)
            .map(|o| secret_data(&o)),
    };
    match data {
        Some(d) => project_keys(&d, items, default_mode, optional, &what, files),
        None if optional => Ok(()),
        None => Err(VolumeSpecError::Missing(format!("{what} not found"))),
    }
}

/// Go's `%q` of a string (what the kubelet's `FormatMap` prints).
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The kubelet's `fieldpath.FormatMap`: `key="value"` lines, keys sorted.
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The kubelet's `ExtractFieldPathAsString` for the fields a downwardAPI
/// volume may use.
fn field_value(ctx: &PayloadContext<'_>, path: &str) -> Result<String, VolumeSpecError> {
    let meta = &ctx.pod.metadata;
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let subscript = |prefix: &str| -> Option<String> {
        let rest = path.strip_prefix(prefix)?.strip_prefix("['")?;
        rest.strip_suffix("']").map(str::to_string)
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => ctx.namespace.to_string(),
        "metadata.uid" => ctx.uid.to_string(),
        "metadata.labels" => format_map(labels),
        "metadata.annotations" => format_map(annotations),
        _ => {
            if let Some(k) = subscript("metadata.labels") {
                labels.get(&k).cloned().unwrap_or_default()
            } else if let Some(k) = subscript("metadata.annotations") {
                annotations.get(&k).cloned().unwrap_or_default()
            } else {
                return Err(invalid(format!(
                    "downwardAPI fieldRef {path:?} is not supported (metadata.name, metadata.namespace, metadata.uid, metadata.labels, metadata.annotations and their ['key'] forms are)"
                )));
            }
        }
    })
}

/// A quantity parser of [`quantity`].
type QuantityParser = fn(&str) -> Result<u64, quantity::QuantityError>;

/// The kubelet's `ExtractResourceValueByContainerNameAndNodeAllocatable`:
/// the container's limit or request of `cpu`, `memory`,
/// `ephemeral-storage` or `hugepages-<size>`, divided by `divisor` (default
/// 1), rounded up; an unset or zero CPU, memory or ephemeral-storage limit
/// is the node's allocatable (see [`super::allocatable`]).
fn resource_value(
    ctx: &PayloadContext<'_>,
    r: &ResourceFieldSelector,
) -> Result<String, VolumeSpecError> {
    let container_name = r.container_name.as_deref().unwrap_or("");
    let spec = ctx.pod.spec.as_ref();
    let container = spec
        .into_iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == container_name)
        .ok_or_else(|| {
            invalid(format!(
                "resourceFieldRef: container {container_name:?} not found"
            ))
        })?;
    let unsupported = || {
        invalid(format!(
            "resourceFieldRef: unsupported resource {:?} (limits. or requests. of cpu, memory, ephemeral-storage or hugepages-<size>)",
            r.resource
        ))
    };
    let (kind, res) = r.resource.split_once('.').ok_or_else(unsupported)?;
    let resources = container.resources.as_ref();
    let list = match kind {
        "limits" => resources.and_then(|x| x.limits.as_ref()),
        "requests" => resources.and_then(|x| x.requests.as_ref()),
        _ => return Err(unsupported()),
    };
    // (parser, the divisor's default: one core, one byte)
    let (parse, unit): (QuantityParser, u64) = match res {
        "cpu" => (quantity::parse_milli, 1000),
        "memory" | "ephemeral-storage" => (quantity::parse_bytes, 1),
        h if h.starts_with("hugepages-") => (quantity::parse_bytes, 1),
        _ => return Err(unsupported()),
    };
    let bad = |e: quantity::QuantityError| invalid(format!("resourceFieldRef {}: {e}", r.resource));
    let given = list
        .and_then(|l| l.get(res))
        .map(|q| parse(&q.0))
        .transpose()
        .map_err(bad)?
        .unwrap_or(0);
    let value =
        if given == 0 && kind == "limits" && super::allocatable::DEFAULTED_LIMITS.contains(&res) {
            super::allocatable::node_allocatable(ctx.objects, res).unwrap_or(0)
        } else {
            given
        };
    let divisor = r
        .divisor
        .as_ref()
        .map(|q| q.0.as_str())
        .filter(|d| !d.is_empty())
        .map(parse)
        .transpose()
        .map_err(bad)?
        .filter(|&d| d > 0)
        .unwrap_or(unit);
    Ok(value.div_ceil(divisor).to_string())
}

/// downwardAPI items (volume or projection) into `files`.
fn add_downward_api(
    ctx: &PayloadContext<'_>,
    items: Option<&[DownwardAPIVolumeFile]>,
    default_mode: Option<i32>,
    files: &mut Files,
) -> Result<(), VolumeSpecError> {
    for it in items.unwrap_or_default() {
        let value = match (&it.field_ref, &it.resource_field_ref) {
            (Some(f), None) => field_value(ctx, &f.field_path)?,
            (None, Some(r)) => resource_value(ctx, r)?,
            _ => {
                return Err(invalid(format!(
                "downwardAPI item {:?}: exactly one of fieldRef and resourceFieldRef is required",
                it.path
            )))
            }
        };
        insert(
            files,
            &it.path,
            Arc::from(value.as_bytes()),
            mode_of(it.mode, default_mode)?,
            || "downwardAPI item".to_string(),
        )?;
    }
    Ok(())
}

/// The kubelet's `util.FsUserFrom`: the `runAsUser` every container
/// (init, regular and ephemeral) runs as, each container's own
/// `securityContext.runAsUser` over the pod's; none when one container has
/// none or two differ.
fn fs_user_from(pod: &Pod) -> Result<Option<u32>, VolumeSpecError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(None);
    };
    let pod_user = spec.security_context.as_ref().and_then(|c| c.run_as_user);
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| c.security_context.as_ref())
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| c.security_context.as_ref()),
        );
    let mut fs_user = None;
    for sc in containers {
        match sc.and_then(|c| c.run_as_user).or(pod_user) {
            Some(u) if fs_user.is_none_or(|f| f == u) => fs_user = Some(u),
            _ => return Ok(None),
        }
    }
    fs_user
        .map(|u| u32::try_from(u).map_err(|_| invalid(format!("runAsUser {u} is out of range"))))
        .transpose()
}

/// A projected `serviceAccountToken`: requested at set-up. Its file is
/// `defaultMode`, or 0600 owned by the pod's `fsUser` when the pod has one
/// or an `fsGroup` (the kubelet's `projected.go`; the `fsGroup` walk then
/// gives the group read, 0640).
fn token_projection(
    ctx: &PayloadContext<'_>,
    t: &ServiceAccountTokenProjection,
    default_mode: Option<i32>,
) -> Result<TokenProjection, VolumeSpecError> {
    validate_path(&t.path).map_err(|e| invalid(format!("serviceAccountToken: {e}")))?;
    let expiration_seconds = t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_EXPIRATION);
    if expiration_seconds <= 0 {
        return Err(invalid(
            "serviceAccountToken.expirationSeconds must be positive",
        ));
    }
    let service_account = pod_service_account(ctx.pod);
    let fs_user = fs_user_from(ctx.pod)?;
    let fs_group = ctx
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|c| c.fs_group);
    let mode = match (fs_user, fs_group) {
        (None, None) => mode_of(None, default_mode)?,
        _ => 0o600,
    };
    Ok(TokenProjection {
        path: t.path.clone(),
        audience: t.audience.clone().unwrap_or_default(),
        expiration_seconds,
        namespace: ctx.namespace.to_string(),
        service_account_uid: service_account_uid(ctx.objects, ctx.namespace, &service_account),
        service_account,
        pod_name: ctx.pod.metadata.name.clone().unwrap_or_default(),
        pod_uid: ctx.uid.to_string(),
        mode,
        fs_user,
    })
}

fn payload(kind: PayloadKind, files: Files, tokens: Vec<TokenProjection>) -> VolumeSource {
    VolumeSource::Payload(Arc::new(PayloadVolumeSource {
        kind,
        files,
        tokens,
    }))
}

/// One projected source into `files` (or `tokens`).
fn add_projection(
    ctx: &PayloadContext<'_>,
    p: &VolumeProjection,
    default_mode: Option<i32>,
    files: &mut Files,
    tokens: &mut Vec<TokenProjection>,
) -> Result<(), VolumeSpecError> {
    if let Some(cm) = &p.config_map {
        let optional = cm.optional.unwrap_or(false);
        add_object_keys(
            ctx,
            KeySource::ConfigMap,
            &cm.name,
            cm.items.as_deref(),
            default_mode,
            optional,
            files,
        )?;
    } else if let Some(s) = &p.secret {
        let optional = s.optional.unwrap_or(false);
        add_object_keys(
            ctx,
            KeySource::Secret,
            &s.name,
            s.items.as_deref(),
            default_mode,
            optional,
            files,
        )?;
    } else if let Some(d) = &p.downward_api {
        add_downward_api(ctx, d.items.as_deref(), default_mode, files)?;
    } else if let Some(t) = &p.service_account_token {
        tokens.push(token_projection(ctx, t, default_mode)?);
    } else if let Some(b) = &p.cluster_trust_bundle {
        let objects = objects(ctx, &format!("clusterTrustBundle {:?}", b.path))?;
        let data = super::trust_bundle::trust_anchors(objects, b)?;
        insert(
            files,
            &b.path,
            Arc::from(data),
            mode_of(None, default_mode)?,
            || "clusterTrustBundle".to_string(),
        )?;
    } else if p.pod_certificate.is_some() {
        return Err(VolumeSpecError::Unsupported(
            "projected podCertificate sources are not supported yet".into(),
        ));
    }
    Ok(())
}

/// Resolves a `configMap`, `secret`, `downwardAPI` or `projected` volume;
/// `None` for any other volume, and for one that reads objects when the
/// source has none (kept whole for a host plugin, as before).
pub(crate) fn payload_source(
    v: &k8s_openapi::api::core::v1::Volume,
    ctx: &PayloadContext<'_>,
) -> Option<Result<VolumeSource, VolumeSpecError>> {
    if ctx.payloads == PayloadResolution::NamesOnly {
        // The kind decides the plugin, and so the unique name and path; the
        // files are the payload plugin's to write, never looked at here.
        return payload_kind(v).map(|kind| Ok(payload(kind, Files::new(), Vec::new())));
    }
    if ctx.objects.is_none() && reads_objects(v) {
        return None;
    }
    let mut files = Files::new();
    let res = if let Some(cm) = &v.config_map {
        let optional = cm.optional.unwrap_or(false);
        add_object_keys(
            ctx,
            KeySource::ConfigMap,
            &cm.name,
            cm.items.as_deref(),
            cm.default_mode,
            optional,
            &mut files,
        )
        .map(|()| payload(PayloadKind::ConfigMap, files, Vec::new()))
    } else if let Some(s) = &v.secret {
        let name = s.secret_name.as_deref().unwrap_or("");
        let optional = s.optional.unwrap_or(false);
        add_object_keys(
            ctx,
            KeySource::Secret,
            name,
            s.items.as_deref(),
            s.default_mode,
            optional,
            &mut files,
        )
        .map(|()| payload(PayloadKind::Secret, files, Vec::new()))
    } else if let Some(d) = &v.downward_api {
        add_downward_api(ctx, d.items.as_deref(), d.default_mode, &mut files)
            .map(|()| payload(PayloadKind::DownwardApi, files, Vec::new()))
    } else if let Some(p) = &v.projected {
        let mut tokens = Vec::new();
        p.sources
            .iter()
            .flatten()
            .try_for_each(|s| add_projection(ctx, s, p.default_mode, &mut files, &mut tokens))
            .map(|()| payload(PayloadKind::Projected, files, tokens))
    } else {
        return None;
    };
    Some(res.and_then(|source| {
        if let VolumeSource::Payload(p) = &source {
            let bytes = atomic_writer::payload_bytes(&p.files);
            let what = format!("volume {:?}", v.name);
            check_size(&what, p.files.len() + p.tokens.len(), bytes)?;
        }
        Ok(source)
    }))
}

/// The payload kind of volume `v`, if it is a payload volume.
fn payload_kind(v: &k8s_openapi::api::core::v1::Volume) -> Option<PayloadKind> {
    if v.config_map.is_some() {
        Some(PayloadKind::ConfigMap)
    } else if v.secret.is_some() {
        Some(PayloadKind::Secret)
    } else if v.downward_api.is_some() {
        Some(PayloadKind::DownwardApi)
    } else if v.projected.is_some() {
        Some(PayloadKind::Projected)
    } else {
        None
    }
}

/// Whether volume `v` may read this node's Node object: a downwardAPI
/// `resourceFieldRef` of a limit (directly or projected), whose unset value
/// is the node's allocatable.
pub(crate) fn reads_node(v: &k8s_openapi::api::core::v1::Volume) -> bool {
    let limits = |items: Option<&Vec<DownwardAPIVolumeFile>>| {
        items.into_iter().flatten().any(|i| {
            i.resource_field_ref
                .as_ref()
                .is_some_and(|r| r.resource.starts_with("limits."))
        })
    };
    limits(v.downward_api.as_ref().and_then(|d| d.items.as_ref()))
        || v.projected.as_ref().is_some_and(|p| {
            p.sources
                .iter()
                .flatten()
                .any(|s| limits(s.downward_api.as_ref().and_then(|d| d.items.as_ref())))
        })
}

/// Whether volume `v` reads objects (a configMap or Secret, directly or
/// projected).
pub(crate) fn reads_objects(v: &k8s_openapi::api::core::v1::Volume) -> bool {
    v.config_map.is_some()
        || v.secret.is_some()
        || v.projected.as_ref().is_some_and(|p| {
            p.sources.iter().flatten().any(|s| {
                s.config_map.is_some() || s.secret.is_some() || s.cluster_trust_bundle.is_some()
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::populator::convert::pod::{needs_objects, DesiredPod};
    use crate::populator::objects::{KubeObject, ObjectStore};

    fn store() -> ObjectStore {
        let mut s = ObjectStore::default();
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cm", "namespace": "ns"},
            "data": {"a": "1", "b": "2"},
            "binaryData": {"bin": "AAEC"}
        }))
        .unwrap();
        s.insert(KubeObject::ConfigMap(Arc::new(cm)));
        let root_ca: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kube-root-ca.crt", "namespace": "ns"},
            "data": {"ca.crt": "CA"}
        }))
        .unwrap();
        s.insert(KubeObject::ConfigMap(Arc::new(root_ca)));
        let sec: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "namespace": "ns"},
            "data": {"k": "aHVudGVyMg=="}
        }))
        .unwrap();
        s.insert(KubeObject::Secret(Arc::new(sec)));
        s
    }

    fn resolve(
        volume: serde_json::Value,
        objects: &ObjectStore,
    ) -> Result<PayloadVolumeSource, VolumeSpecError> {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                         "labels": {"b": "x\"y", "a": "1"}, "annotations": {"n": "l1\nl2"}},
            "spec": {"serviceAccountName": "sa", "volumes": [volume],
                     "containers": [{"name": "c", "image": "i",
                                     "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m"}},
                                     "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}
        }))
        .unwrap();
        let reads = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0]
            .config_map
            .is_some();
        assert!(!reads || needs_objects(&pod));
        let d = DesiredPod::from_pod_with(&pod, Some(objects)).unwrap();
        match d.volumes[0].source.clone()? {
            VolumeSource::Payload(p) => Ok((*p).clone()),
            other => panic!("{other:?}"),
        }
    }

    fn files(p: &PayloadVolumeSource) -> Vec<(String, String, u32)> {
        p.files
            .iter()
            .map(|(k, f)| {
                (
                    k.clone(),
                    String::from_utf8_lossy(&f.data).into_owned(),
                    f.mode,
                )
            })
            .collect()
    }

    fn s(a: &str, b: &str, m: u32) -> (String, String, u32) {
        (a.into(), b.into(), m)
    }

    #[test]
    fn config_map_keys_items_modes_and_optional() {
        let o = store();
        let p = resolve(
            serde_json::json!({"name": "v", "configMap": {"name": "cm"}}),
            &o,
        )
        .unwrap();
        assert_eq!(p.kind, PayloadKind::ConfigMap);
        assert_eq!(
            files(&p),
            vec![
                s("a", "1", 0o644),
                s("b", "2", 0o644),
                s("bin", "\0\u{1}\u{2}", 0o644)
            ]
        );
        let p = resolve(
            serde_json::json!({"name": "v", "configMap": {"name": "cm", "defaultMode": 0o400,
                "items": [{"key": "a", "path": "dir/x"}, {"key": "b", "path": "y", "mode": 0o600}]}}),
            &o,
        )
        .unwrap();
        assert_eq!(files(&p), vec![s("dir/x", "1", 0o400), s("y", "2", 0o600)]);
        let items = serde_json::json!([{"key": "nope", "path": "z"}, {"key": "a", "path": "a"}]);
        let e = resolve(
            serde_json::json!({"name": "v", "configMap": {"name": "cm", "items": items}}),
            &o,
        )
        .unwrap_err();
        assert!(
            matches!(&e, VolumeSpecError::Missing(m) if m.contains("ConfigMap ns/cm has no key \"nope\"")),
            "{e}"
        );
        let p = resolve(serde_json::json!({"name": "v", "configMap": {"name": "cm", "items": items, "optional": true}}), &o).unwrap();
        assert_eq!(files(&p), vec![s("a", "1", 0o644)]);
        let e = resolve(
            serde_json::json!({"name": "v", "configMap": {"name": "gone"}}),
            &o,
        )
        .unwrap_err();
        assert_eq!(
            e,
            VolumeSpecError::Missing("ConfigMap ns/gone not found".into())
        );
        let p = resolve(
            serde_json::json!({"name": "v", "configMap": {"name": "gone", "optional": true}}),
            &o,
        )
        .unwrap();
        assert!(p.files.is_empty());
        for bad in ["../x", "/x", "..x"] {
            let v = serde_json::json!({"name": "v", "configMap": {"name": "cm", "items": [{"key": "a", "path": bad}]}});
            assert!(
                matches!(resolve(v, &o), Err(VolumeSpecError::Invalid(_))),
                "{bad}"
            );
        }
        let v =
            serde_json::json!({"name": "v", "configMap": {"name": "cm", "defaultMode": 0o1777}});
        assert!(matches!(resolve(v, &o), Err(VolumeSpecError::Invalid(_))));
    }

    #[test]
    fn secret_bytes_and_errors_without_values() {
        let o = store();
        let p = resolve(
            serde_json::json!({"name": "v", "secret": {"secretName": "s", "defaultMode": 0o440}}),
            &o,
        )
        .unwrap();
        assert_eq!(p.kind, PayloadKind::Secret);
        assert_eq!(files(&p), vec![s("k", "hunter2", 0o440)]);
        assert!(!format!("{p:?}").contains("hunter2"));
        let e = resolve(
            serde_json::json!({"name": "v", "secret": {"secretName": "x"}}),
            &o,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "Secret ns/x not found");
    }

    #[test]
    fn downward_api_fields_and_resources() {
        let o = store();
        let items = serde_json::json!([
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
            {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "ann", "fieldRef": {"fieldPath": "metadata.annotations"}, "mode": 0o400},
            {"path": "one", "fieldRef": {"fieldPath": "metadata.labels['a']"}},
            {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1M"}},
            {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "requests.cpu"}},
            {"path": "mcpu", "resourceFieldRef": {"containerName": "c", "resource": "requests.cpu", "divisor": "1m"}}
        ]);
        let p = resolve(
            serde_json::json!({"name": "v", "downwardAPI": {"items": items}}),
            &o,
        )
        .unwrap();
        assert_eq!(p.kind, PayloadKind::DownwardApi);
        let f: BTreeMap<_, _> = files(&p).into_iter().map(|(k, v, m)| (k, (v, m))).collect();
        assert_eq!(f["name"].0, "p");
        assert_eq!(f["ns"].0, "ns");
        assert_eq!(f["uid"].0, "u-1");
        assert_eq!(f["labels"].0, "a=\"1\"\nb=\"x\\\"y\"");
        assert_eq!(f["ann"], ("n=\"l1\\nl2\"".to_string(), 0o400));
        assert_eq!(f["one"].0, "1");
        // 64Mi / 1M = 67.108864 → 68 (rounded up); 250m → 1 core; 250 millicores.
        assert_eq!(
            (
                f["mem"].0.as_str(),
                f["cpu"].0.as_str(),
                f["mcpu"].0.as_str()
            ),
            ("68", "1", "250")
        );
        // An unset limit, without a Node object, is the host's.
        let items = serde_json::json!([{"path": "c", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"}}]);
        let p = resolve(
            serde_json::json!({"name": "v", "downwardAPI": {"items": items}}),
            &o,
        )
        .unwrap();
        let cpus = std::thread::available_parallelism().unwrap().get() * 1000;
        assert_eq!(files(&p)[0].1, cpus.to_string());
        let items = serde_json::json!([{"path": "x", "fieldRef": {"fieldPath": "spec.nodeName"}}]);
        let e = resolve(
            serde_json::json!({"name": "v", "downwardAPI": {"items": items}}),
            &o,
        )
        .unwrap_err();
        assert!(e.to_string().contains("spec.nodeName"), "{e}");
    }

    /// Issue 28 item 6: a large but valid object (10,000 keys) is a
    /// payload like any other; an error names the object and key, or the
    /// object and the bound.
    #[test]
    fn large_objects_resolve_and_errors_name_the_key() {
        let mut o = store();
        let data: BTreeMap<String, String> = (0..10_000)
            .map(|i| (format!("key-{i:05}"), format!("value {i}")))
            .collect();
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "big", "namespace": "ns"}, "data": data});
        o.insert(KubeObject::from_json(cm).unwrap());
        let p = resolve(
            serde_json::json!({"name": "v", "configMap": {"name": "big"}}),
            &o,
        )
        .unwrap();
        assert_eq!(p.files.len(), 10_000);
        assert_eq!(&*p.files["key-09999"].data, b"value 9999");
        // `..x` is a valid key for the API, not a file name the writer
        // allows (the kubelet refuses it too).
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "dots", "namespace": "ns"}, "data": {"..x": "1"}});
        o.insert(KubeObject::from_json(cm).unwrap());
        let e = resolve(
            serde_json::json!({"name": "v", "configMap": {"name": "dots"}}),
            &o,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "ConfigMap ns/dots key \"..x\": invalid payload path \"..x\": must not start with '..'"
        );
        let over = atomic_writer::MAX_PAYLOAD_FILES + 1;
        let e = check_size("ConfigMap ns/huge", over, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("ConfigMap ns/huge: the payload has {over} files")),
            "{e}"
        );
        assert!(check_size("x", 10, atomic_writer::MAX_PAYLOAD_BYTES + 1).is_err());
    }

    /// Token files follow the kubelet's FsUser rule (`projected.go`,
    /// `util.FsUserFrom`): 0600 owned by the user all containers run as
    /// when there is one, or when the pod has an fsGroup (whose walk adds
    /// group read at set-up); `defaultMode` otherwise.
    #[test]
    fn token_files_are_owned_by_the_user_all_containers_run_as() {
        use serde_json::json;
        let o = store();
        let c = |name: &str, sc: serde_json::Value| {
            json!({"name": name, "image": "i", "securityContext": sc,
                   "volumeMounts": [{"name": "v", "mountPath": "/v"}]})
        };
        let token = |pod_sc: serde_json::Value, spec: serde_json::Value| {
            let mut spec_json = json!({"securityContext": pod_sc,
                "volumes": [{"name": "v", "projected": {"defaultMode": 0o444, "sources": [
                    {"serviceAccountToken": {"path": "token"}}]}}]});
            for (k, v) in spec.as_object().unwrap() {
                spec_json[k] = v.clone();
            }
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
                "spec": spec_json,
            }))
            .unwrap();
            let d = DesiredPod::from_pod_with(&pod, Some(&o)).unwrap();
            match d.volumes[0].source.clone() {
                Ok(VolumeSource::Payload(p)) => Ok((p.tokens[0].mode, p.tokens[0].fs_user)),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e),
            }
        };
        let one = |sc| json!({"containers": [c("c", sc)]});
        let none = json!({});
        assert_eq!(token(json!({}), one(none.clone())), Ok((0o444, None)));
        let pod_user = json!({"runAsUser": 1000});
        assert_eq!(
            token(pod_user.clone(), one(none.clone())),
            Ok((0o600, Some(1000)))
        );
        let with_group = json!({"runAsUser": 1000, "fsGroup": 2000});
        assert_eq!(
            token(with_group.clone(), one(none.clone())),
            Ok((0o600, Some(1000)))
        );
        let own = one(json!({"runAsUser": 1001}));
        assert_eq!(token(with_group.clone(), own), Ok((0o600, Some(1001))));
        assert_eq!(
            token(json!({"fsGroup": 2000}), one(none.clone())),
            Ok((0o600, None))
        );
        // Two users, or a container without one: no FsUser.
        let two = json!({"containers": [c("a", none.clone()), c("b", json!({"runAsUser": 1001}))]});
        assert_eq!(token(pod_user.clone(), two), Ok((0o444, None)));
        let init = json!({"containers": [c("a", json!({"runAsUser": 7}))],
                          "initContainers": [{"name": "i", "image": "i"}]});
        assert_eq!(token(json!({}), init), Ok((0o444, None)));
        let both = json!({"containers": [c("a", json!({"runAsUser": 7}))],
                          "initContainers": [{"name": "i", "image": "i", "securityContext": {"runAsUser": 7}}]});
        assert_eq!(token(json!({}), both), Ok((0o600, Some(7))));
        let e = token(json!({"runAsUser": -1}), one(none)).unwrap_err();
        assert!(e.to_string().contains("runAsUser -1"), "{e}");
    }

    /// Unset (or zero) CPU, memory and ephemeral-storage limits are the
    /// node's allocatable from its Node object when the source has it, the
    /// host's CPUs and memory without (no ephemeral-storage figure: 0);
    /// a given limit is the container's; hugepages are read, never
    /// defaulted.
    #[test]
    fn downward_api_limits_default_to_the_node_allocatable() {
        let items = serde_json::json!([
            {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"}},
            {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}},
            {"path": "eph", "resourceFieldRef": {"containerName": "c", "resource": "limits.ephemeral-storage", "divisor": "1Gi"}},
            {"path": "hp", "resourceFieldRef": {"containerName": "c", "resource": "limits.hugepages-2Mi", "divisor": "1Mi"}},
            {"path": "hpr", "resourceFieldRef": {"containerName": "c", "resource": "requests.hugepages-1Gi"}},
            {"path": "init", "resourceFieldRef": {"containerName": "i", "resource": "limits.memory", "divisor": "1Mi"}}
        ]);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
            "spec": {"volumes": [{"name": "v", "downwardAPI": {"items": items}}],
                     "initContainers": [{"name": "i", "image": "i"}],
                     "containers": [{"name": "c", "image": "i",
                                     "resources": {"limits": {"memory": "0", "hugepages-2Mi": "4Mi"}},
                                     "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}
        }))
        .unwrap();
        assert!(
            crate::populator::convert::pod::reads_node(&pod),
            "a limit may read the Node"
        );
        let values = |objects: &ObjectStore| -> BTreeMap<String, String> {
            let d = DesiredPod::from_pod_with(&pod, Some(objects)).unwrap();
            match d.volumes[0].source.clone().unwrap() {
                VolumeSource::Payload(p) => files(&p).into_iter().map(|(k, v, _)| (k, v)).collect(),
                other => panic!("{other:?}"),
            }
        };
        let mut o = store();
        o.set_node_name("node-a");
        o.insert(KubeObject::Node(Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "node-a"},
                "status": {"allocatable": {"cpu": "3500m", "memory": "7Gi",
                                           "ephemeral-storage": "100Gi", "hugepages-2Mi": "1Gi"}}
            }))
            .unwrap(),
        )));
        let f = values(&o);
        assert_eq!(f["cpu"], "3500");
        assert_eq!(f["mem"], "7168", "a zero limit is the allocatable");
        assert_eq!(f["eph"], "100");
        assert_eq!(f["hp"], "4", "the container's hugepages limit");
        assert_eq!(f["hpr"], "0");
        assert_eq!(f["init"], "7168", "an init container's too");
        // Without a Node object: the host's CPUs and memory.
        let f = values(&store());
        let cpus = std::thread::available_parallelism().unwrap().get() * 1000;
        assert_eq!(f["cpu"], cpus.to_string());
        assert_ne!(f["mem"], "0");
        assert_eq!(f["eph"], "0");
        let bad = serde_json::json!([{"path": "x", "resourceFieldRef": {"containerName": "c", "resource": "limits.nvidia.com/gpu"}}]);
        let e = resolve(
            serde_json::json!({"name": "v", "downwardAPI": {"items": bad}}),
            &o,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unsupported resource"), "{e}");
    }

    /// The volume every API-admitted pod gets.
    #[test]
    fn kube_api_access_projected_volume() {
        let o = store();
        let v = serde_json::json!({"name": "v", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
        ]}});
        let p = resolve(v.clone(), &o).unwrap();
        assert_eq!(p.kind, PayloadKind::Projected);
        assert_eq!(
            files(&p),
            vec![s("ca.crt", "CA", 0o644), s("namespace", "ns", 0o644)]
        );
        let mut token = TokenProjection {
            path: "token".into(),
            audience: String::new(),
            expiration_seconds: 3607,
            namespace: "ns".into(),
            service_account: "sa".into(),
            service_account_uid: String::new(),
            pod_name: "p".into(),
            pod_uid: "u-1".into(),
            mode: 0o644,
            fs_user: None,
        };
        assert_eq!(p.tokens, vec![token.clone()]);
        // Once the ServiceAccount is known, its UID is part of the request:
        // a replaced account (new UID) changes the volume.
        let mut o = o;
        let sa = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "sa", "namespace": "ns", "uid": "sa-uid-1"}});
        o.insert(KubeObject::from_json(sa).unwrap());
        token.service_account_uid = "sa-uid-1".into();
        assert_eq!(resolve(v, &o).unwrap().tokens, vec![token]);
        // A trust bundle selection that matches nothing is missing (the
        // bundles themselves are tested in `trust_bundle`).
        let v = serde_json::json!({"name": "v", "projected": {"sources": [
            {"clusterTrustBundle": {"signerName": "x", "path": "b"}}]}});
        assert!(matches!(resolve(v, &o), Err(VolumeSpecError::Missing(_))));
        let v = serde_json::json!({"name": "v", "projected": {"sources": [
            {"podCertificate": {"signerName": "x", "keyType": "ED25519", "credentialBundlePath": "c"}}]}});
        assert!(matches!(
            resolve(v, &o),
            Err(VolumeSpecError::Unsupported(_))
        ));
    }
}
